"""Resource limits every command is held to, and where its progress is said.

Limits: ``--max-memory`` / ``$ROOFTRACE_MAX_MEMORY`` (default half the physical memory, or of
the cgroup's limit when lower; a replay's is at most what the process's address-space limit,
``ulimit -v``, leaves: :func:`replay_limits`) and ``--max-sim-days`` / ``$ROOFTRACE_MAX_SIM_DAYS``
(default 30); ``none`` lifts either (docs/limits.md). A command's options set them for its
duration (:func:`override`); :func:`current_limits` reads them. Each stage checks its own
need against them (the replay's estimate: ``pipeline.replay.limits``; classify's:
``pipeline.classify.memory``; synth's and plan's in their packages).

Progress: the CLI installs a sink for the running command (:func:`progress_to`, stderr);
:func:`notice` says a line on it from anywhere in that process.
"""

from __future__ import annotations

import contextvars
import math
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pipeline.common import system
from pipeline.common.defaults import MAX_MEMORY_ENV, MAX_SIM_DAYS_ENV, PROGRESS_EVERY_ENV
from pipeline.common.errors import RooftraceError
from pipeline.common.units import format_bytes

if TYPE_CHECKING:
    import polars as pl


class Closable(Protocol):
    """A live progress display a command closes when it ends."""

    def close(self) -> None: ...


#: Default memory limit: this share of the physical memory (or of the cgroup limit, if lower).
DEFAULT_MEMORY_SHARE = 0.5


#: Default limit on the simulated span of an open-loop replay's arrivals.
DEFAULT_MAX_SIM_DAYS = 30.0


#: Seconds between progress lines of a long replay (the first comes after as many seconds).
DEFAULT_PROGRESS_EVERY_S = 5.0


GIB = 1024**3


_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)


_NONE = ("none", "off", "unlimited")


#: Imports, compiled code and table-building buffers beyond the process's size before the replay.
OVERHEAD_BYTES = 256 * 1024**2


class ResourceLimitError(RooftraceError):
    """A replay would need more memory, or simulate a longer span, than its limits allow."""


def parse_size(text: str) -> int | None:
    """Bytes in ``64GiB``, ``64G``, ``512 MB``, ``1.5T``, ``1000000`` (K, M, G, T, P are powers of
    1024, with or without ``iB``/``B``), ``80%`` of the physical memory; ``none`` / ``off`` /
    ``unlimited``: no limit (None). ValueError on anything else."""
    t = text.strip().lower()
    if t in _NONE:
        return None
    if t.endswith("%"):
        share = float(t[:-1])
        if not 0 < share <= 100:
            raise ValueError(f"{text!r}: a share of the physical memory must be in (0, 100]%")
        return int(system.physical_memory() * share / 100)
    m = _SIZE_RE.match(t)
    if m is None:
        raise ValueError(f"{text!r} is not a size such as 64GiB, 512MiB or 80%")
    raw = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(raw) or raw >= 2**63:
        raise ValueError(f"{text!r}: the limit must be less than 8 EiB (2**63 bytes); 'none' means no limit")
    value = int(raw)
    if value <= 0:
        raise ValueError(f"{text!r}: the limit must be more than 0 bytes")
    return value


def parse_days(text: str) -> float | None:
    """Days as a positive number; ``none`` / ``off`` / ``unlimited``: no limit (None)."""
    t = text.strip().lower()
    if t in _NONE:
        return None
    try:
        value = float(t)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of days such as 30 or 0.5, or none") from None
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{text!r}: the number of days must be a positive number")
    return value


@dataclass(frozen=True)
class Limits:
    max_memory: int | None
    memory_origin: str
    max_sim_days: float | None
    days_origin: str
    #: The process's address-space limit (``ulimit -v``) when it, not the configured limit, sets
    #: ``max_memory`` (:func:`replay_limits`); None otherwise.
    address_space: int | None = None


def address_space_room() -> tuple[int, int, int] | None:
    """Under an address-space limit (``ulimit -v``: ``RLIMIT_AS``): (the most an estimate that
    counts this process's resident size may reach, the limit, the address space mapped now);
    None without one. What is mapped but not resident (thread stacks, reserved arenas, the
    compiled code) takes room the estimate does not count, so the room is the limit less the
    mapped size, plus the resident size the estimate adds back."""
    space = system.address_space_limit()
    if space is None:
        return None
    mapped = system.virtual_size()
    return max(0, space - mapped + system.process_rss()), space, mapped


def replay_limits(limits: Limits | None = None) -> Limits:
    """The limits a replay is held to: ``limits`` (default :func:`current_limits`) with the
    memory limit the smaller of the configured one (``none`` included) and what the process's
    address-space limit leaves (:func:`address_space_room`): past that, an allocation fails
    with MemoryError whatever the configured limit says."""
    limits = limits or current_limits()
    room = address_space_room()
    if room is None:
        return limits
    bytes_left, space, mapped = room
    if limits.max_memory is not None and limits.max_memory <= bytes_left:
        return limits
    origin = (
        f"what this process's address-space limit leaves: ulimit -v {format_bytes(space)}, "
        f"{format_bytes(mapped)} of it mapped already"
    )
    return replace(limits, max_memory=bytes_left, memory_origin=origin, address_space=space)


_OVERRIDE: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("rooftrace_limits", default=None)


def _limit(
    over: dict[str, Any], key: str, option: str, env: str, parse: Callable[[str], Any], default: tuple[Any, str]
) -> tuple[Any, str]:
    """One limit and where it came from: the command's option, else ``$env``, else the default."""
    if key in over:
        return over[key], option
    if os.environ.get(env):
        try:
            return parse(os.environ[env]), f"${env}"
        except ValueError as exc:
            raise ResourceLimitError(f"${env}: {exc}") from None
    return default


def current_limits() -> Limits:
    """The limits in force: an :func:`override` (the command's options), else the environment
    (``$ROOFTRACE_MAX_MEMORY``, ``$ROOFTRACE_MAX_SIM_DAYS``), else the defaults."""
    over = _OVERRIDE.get() or {}
    phys = system.physical_memory()
    memory, m_origin = _limit(
        over,
        "max_memory",
        "--max-memory",
        MAX_MEMORY_ENV,
        parse_size,
        (
            int(phys * DEFAULT_MEMORY_SHARE),
            f"default: {DEFAULT_MEMORY_SHARE:.0%} of {format_bytes(phys)} physical memory",
        ),
    )
    days, d_origin = _limit(
        over, "max_sim_days", "--max-sim-days", MAX_SIM_DAYS_ENV, parse_days, (DEFAULT_MAX_SIM_DAYS, "default")
    )
    return Limits(memory, m_origin, days, d_origin)


_UNSET: Any = object()


@contextmanager
def override(max_memory: int | None = _UNSET, max_sim_days: float | None = _UNSET) -> Iterator[None]:
    """Limits set by a command's options for the duration (None: no limit; unset: as before)."""
    values = dict(_OVERRIDE.get() or {})
    if max_memory is not _UNSET:
        values["max_memory"] = max_memory
    if max_sim_days is not _UNSET:
        values["max_sim_days"] = max_sim_days
    token = _OVERRIDE.set(values)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def token_sums(col: pl.Series, block_size: int, ceil: bool, chunk: int = 1 << 20) -> tuple[float, int]:
    """Sum of a token column (each value at least 1, as replayed) and its blocks of
    ``block_size`` (whole blocks, or every block begun with ``ceil``), a slice at a time."""
    total, blocks = 0.0, 0
    for a in range(0, col.len(), chunk):
        v = np.maximum(col.slice(a, chunk).to_numpy().astype(np.int64), 1)
        total += float(v.sum())
        blocks += int((-(-v // block_size) if ceil else v // block_size).sum())
    return total, blocks


@dataclass
class Channel:
    """Where the running command's progress goes: ``sink`` (one line at a time, stderr), in
    process ``pid`` only; ``live``: stderr is a terminal, so a replay may draw a live bar on it.
    ``open``: the live bars to close when the command ends."""

    pid: int
    sink: Callable[[str], None]
    live: bool = False
    open: list[Closable] = field(default_factory=list)


SINK: contextvars.ContextVar[Channel | None] = contextvars.ContextVar("rooftrace_progress_sink", default=None)


def notice(message: str) -> None:
    """Say ``message`` on the running command's stderr (the sink :func:`progress_to` installed in
    this process); nothing outside a command or in a worker process."""
    installed = SINK.get()
    if installed is not None and installed.pid == os.getpid():
        installed.sink(message)


@contextmanager
def progress_to(sink: Callable[[str], None], live: bool = False) -> Iterator[None]:
    """Report long replays run in this process (not in worker processes) through ``sink``; with
    ``live`` (stderr is a terminal) as a live progress bar (rich.progress) instead of lines."""
    channel = Channel(os.getpid(), sink, live)
    token = SINK.set(channel)
    try:
        yield
    finally:
        SINK.reset(token)
        for reporter in channel.open:
            reporter.close()


def every_s() -> float:
    try:
        value = float(os.environ.get(PROGRESS_EVERY_ENV, DEFAULT_PROGRESS_EVERY_S))
    except ValueError:
        return DEFAULT_PROGRESS_EVERY_S
    return value if value > 0 else DEFAULT_PROGRESS_EVERY_S
