"""A fleet of pools: FLEET.toml's ``[[pool]]`` tables, and the rule that sends each request to one.

A fleet file without ``[[pool]]`` tables is one homogeneous pool (pipeline.replay.fleet.FleetConfig),
read and replayed exactly as before. With them, the file's top-level keys (``name``, ``model``,
``[slo]``, and any fleet key such as ``hardware``, ``tp`` or ``[engine]``) are the defaults each
pool starts from, and every ``[[pool]]`` table is one homogeneous pool — its own hardware,
tp/pp/dp/ep, replicas, router, engine settings, dtypes and calibration — with a ``name``, a
``role`` and a ``[pool.match]`` rule::

    name = "split"
    model = "llama-3.1-8b"

    [[pool]]
    name = "long"
    hardware = "h200-sxm"
    replicas = 2
    [pool.match]
    min_input_tokens = 8192        # prompts of 8,192 tokens or more

    [[pool]]
    name = "rest"                  # the last pool has no match: it takes every other request
    hardware = "h100-sxm"
    replicas = 4

Requests go to the first pool whose rule they match, the last pool taking the rest: a rule is
``tenant`` (a list of tenant names), ``min_input_tokens`` / ``max_input_tokens`` (the logged
prompt length, both bounds inclusive), or several of them (all must hold). Inside a pool its own
``router`` spreads the pool's requests over its replicas. The one role today is ``unified`` (a
pool's replicas prefill and decode the requests it is sent); docs/architecture.md, "Pools", says
how a role is added.

Each pool is resolved and replayed as a fleet of its own (pipeline.replay.run replays them one after
another and writes one run whose tables carry a ``pool`` column); a pool's fleet is named
``<fleet>-<pool>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.engine.model import EngineResult, Workload
from pipeline.replay.fleet import MAX_ENGINES, FleetConfig, check_loaded_fleet, parse_fleet

#: What a pool's replicas do with the requests it is sent. ``unified``: prefill and decode.
ROLES: tuple[str, ...] = ("unified",)
#: The keys of a ``[pool.match]`` rule.
MATCH_KEYS: tuple[str, ...] = ("tenant", "min_input_tokens", "max_input_tokens")
#: Keys of the whole fleet that a pool may not set: one fleet serves one model and is judged
#: against one SLO.
FLEET_ONLY_KEYS: tuple[str, ...] = ("model", "slo", "description")
#: The keys of a ``[[pool]]`` table that are the pool's own, not fleet keys.
POOL_KEYS: tuple[str, ...] = ("name", "role", "match")
#: Most pools one fleet holds (each is replayed as a fleet of its own).
MAX_POOLS = 64
POOL_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,31}")


@dataclass(frozen=True)
class PoolMatch:
    """Which requests a pool takes: every condition set must hold (none set: every request)."""

    tenants: tuple[str, ...] | None = None
    min_input_tokens: int | None = None
    max_input_tokens: int | None = None

    @property
    def catch_all(self) -> bool:
        return self.tenants is None and self.min_input_tokens is None and self.max_input_tokens is None

    @property
    def columns(self) -> tuple[str, ...]:
        """The request columns the rule reads."""
        cols = []
        if self.tenants is not None:
            cols.append("tenant")
        if self.min_input_tokens is not None or self.max_input_tokens is not None:
            cols.append("recorded_input_tokens")
        return tuple(cols)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.tenants is not None:
            out["tenant"] = list(self.tenants)
        if self.min_input_tokens is not None:
            out["min_input_tokens"] = self.min_input_tokens
        if self.max_input_tokens is not None:
            out["max_input_tokens"] = self.max_input_tokens
        return out

    def text(self) -> str:
        """The rule for people: 'tenant in [a, b] and input tokens ≥ 8,192'; 'every other request'."""
        parts = []
        if self.tenants is not None:
            parts.append(f"tenant in [{', '.join(self.tenants)}]")
        lo, hi = self.min_input_tokens, self.max_input_tokens
        if lo is not None and hi is not None:
            parts.append(f"input tokens {lo:,}–{hi:,}")
        elif lo is not None:
            parts.append(f"input tokens ≥ {lo:,}")
        elif hi is not None:
            parts.append(f"input tokens ≤ {hi:,}")
        return " and ".join(parts) if parts else "every other request"

    def mask(self, frame: pl.DataFrame) -> npt.NDArray[np.bool_]:
        """Which rows of ``frame`` (canonical requests holding :attr:`columns`) match."""
        expr = pl.lit(True)
        if self.tenants is not None:
            expr = expr & pl.col("tenant").is_in(list(self.tenants)).fill_null(False)
        if self.min_input_tokens is not None:
            expr = expr & (pl.col("recorded_input_tokens") >= self.min_input_tokens)
        if self.max_input_tokens is not None:
            expr = expr & (pl.col("recorded_input_tokens") <= self.max_input_tokens)
        out = frame.select(expr.alias("m")).get_column("m")
        if out.len() != frame.height:  # a literal over a frame is one row
            return np.full(frame.height, bool(out[0]), np.bool_)
        return np.asarray(out.to_numpy(), np.bool_)


@dataclass(frozen=True)
class Pool:
    """One homogeneous pool of a fleet: a name, a role, the requests it takes, and its fleet."""

    name: str
    role: str
    match: PoolMatch
    config: FleetConfig

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "match": self.match.to_dict(), "fleet": self.config.to_dict()}


@dataclass(frozen=True)
class PooledFleet:
    """A fleet of two or more pools (FLEET.toml with ``[[pool]]`` tables)."""

    name: str
    model: str
    pools: tuple[Pool, ...]
    slo: str | None = None
    description: str = ""
    #: The fleet's own keys as the file wrote them, without its pools (recorded with the run).
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> tuple[str, ...]:
        """The request columns the pools' rules read."""
        return tuple(dict.fromkeys(c for p in self.pools for c in p.match.columns))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "slo": self.slo,
            "description": self.description,
            "pools": [p.to_dict() for p in self.pools],
        }

    def assign(self, frame: pl.DataFrame) -> npt.NDArray[np.int32]:
        """Each request's pool (its index in :attr:`pools`): the first whose rule it matches; the
        last pool, which has no rule, takes the rest."""
        out = np.full(frame.height, len(self.pools) - 1, np.int32)
        free = np.ones(frame.height, np.bool_)
        for i, pool in enumerate(self.pools[:-1]):
            hit = free & pool.match.mask(frame)
            out[hit] = i
            free &= ~hit
        return out


def is_pooled(data: Mapping[str, Any]) -> bool:
    """Whether a parsed fleet file (or a run's recorded fleet) has ``[[pool]]`` tables."""
    return "pool" in data or "pools" in data


def _match(raw: Any, where: str) -> PoolMatch:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: match must be a table ([pool.match]), got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(MATCH_KEYS))
    if unknown:
        raise ConfigError(f"{where} [pool.match]: unknown key(s) {unknown}; a rule has {list(MATCH_KEYS)}")
    tenants = None
    if "tenant" in raw:
        t = raw["tenant"]
        if isinstance(t, str):
            t = [t]
        if not isinstance(t, list) or not t or not all(isinstance(x, str) and x for x in t):
            raise ConfigError(f"{where} [pool.match]: tenant must be a non-empty list of tenant names, got {t!r}")
        tenants = tuple(dict.fromkeys(t))
    bounds: dict[str, int | None] = {}
    for key in ("min_input_tokens", "max_input_tokens"):
        v = raw.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 2**62):
            raise ConfigError(f"{where} [pool.match]: {key} must be a whole number of tokens >= 0, got {v!r}")
        bounds[key] = v
    lo, hi = bounds["min_input_tokens"], bounds["max_input_tokens"]
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(f"{where} [pool.match]: min_input_tokens {lo:,} is above max_input_tokens {hi:,}")
    rule = PoolMatch(tenants, lo, hi)
    if rule.catch_all:
        raise ConfigError(f"{where} [pool.match]: an empty rule; leave match out of the last pool instead")
    return rule


def parse_pooled(data: Mapping[str, Any], origin: str, base_dir: Path | None = None) -> PooledFleet:
    """Validate a fleet file with ``[[pool]]`` tables; every error names ``origin``, the pool and
    the key. (A run records each pool's resolved fleet; pipeline.replay.runfolder.pools_of reads them.)"""
    from pipeline.common.tomlschema import (  # lazy: pydantic, loaded only when a file is read
        PooledFleetFile,
        PoolTable,
        check,
    )

    pools_raw = data.get("pool")
    if pools_raw == []:
        raise ConfigError(f"{origin}: pool = [] holds no pool; write [[pool]] tables, or leave pool out for one pool")
    if not isinstance(pools_raw, list) or not pools_raw:
        raise ConfigError(f"{origin}: pool must be an array of tables ([[pool]] ...), got {type(pools_raw).__name__}")
    if len(pools_raw) > MAX_POOLS:
        raise ConfigError(f"{origin}: {len(pools_raw):,} pools, more than the {MAX_POOLS} a fleet holds")
    top = {k: v for k, v in data.items() if k != "pool"}
    check(top, PooledFleetFile, origin)  # keys and types, one line naming the table and key
    pools: list[Pool] = []
    seen: set[str] = set()
    for i, raw in enumerate(pools_raw):
        where = f"{origin} [[pool]] #{i + 1}"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: must be a table, got {type(raw).__name__}")
        name = raw.get("name")
        if not isinstance(name, str) or not POOL_NAME_RE.fullmatch(name):
            raise ConfigError(
                f"{where}: name must be 1-32 letters, digits, '_' or '-' (it names the pool in the run's tables), "
                f"got {name!r}"
            )
        where = f"{origin} [[pool]] {name!r}"
        if name in seen:
            raise ConfigError(f"{where}: a second pool of that name (pool names must differ)")
        seen.add(name)
        shared = sorted(k for k in FLEET_ONLY_KEYS if k in raw)
        if shared:
            raise ConfigError(f"{where}: {shared} belong to the whole fleet (set them at the top of the file)")
        role = raw.get("role", "unified")
        if role not in ROLES:
            raise ConfigError(f"{where}: role {role!r} unknown; choose one of {list(ROLES)}")
        check(dict(raw), PoolTable, where)
        last = i == len(pools_raw) - 1
        if "match" in raw:
            if last:
                raise ConfigError(
                    f"{where}: the last pool takes every request the pools before it do not: leave out its match"
                )
            rule = _match(raw["match"], where)
        elif not last:
            raise ConfigError(f"{where}: needs a [pool.match] rule (only the last pool takes the rest)")
        else:
            rule = PoolMatch()
        merged = {**top, **{k: v for k, v in raw.items() if k not in POOL_KEYS}, "name": f"{top['name']}-{name}"}
        if isinstance(top.get("engine"), Mapping) and isinstance(raw.get("engine"), Mapping):
            merged["engine"] = {**top["engine"], **raw["engine"]}  # a pool's engine keys on the fleet's
        cfg = parse_fleet(merged, where, base_dir)
        pools.append(Pool(name, role, rule, cfg))
    engines = sum(p.config.replicas * p.config.dp for p in pools)
    if engines > MAX_ENGINES:
        raise ConfigError(
            f"{origin}: the pools hold {engines:,} engines (replicas × dp) in all, more than the {MAX_ENGINES:,} a "
            "replay numbers (4-byte replica ids, numbered pool after pool)"
        )
    first = pools[0].config
    return PooledFleet(
        str(top["name"]), first.model, tuple(pools), first.slo, str(top.get("description", "")), dict(top)
    )


def load_fleet_file(path: Path | str, *, check_profile: bool = True) -> FleetConfig | PooledFleet:
    """Read a FLEET.toml: one pool (FleetConfig, as pipeline.replay.fleet.load_fleet reads it) or a
    fleet of pools, each checked as load_fleet checks a fleet."""
    data = read_toml(path, "fleet file")
    if not is_pooled(data):
        cfg = parse_fleet(data, str(path), Path(path).parent)
        check_loaded_fleet(cfg, str(path), check_profile)
        return cfg
    pooled = parse_pooled(data, str(path), Path(path).parent)
    for pool in pooled.pools:
        check_loaded_fleet(pool.config, f"{path} [[pool]] {pool.name!r}", check_profile)
    return pooled


def pooled_refusal(path: Path | str, command: str) -> ConfigError:
    """The error of a command that takes one homogeneous pool given a fleet of pools."""
    return ConfigError(
        f"{path}: a fleet of [[pool]] tables; `rooftrace {command}` takes a fleet of one pool (replay one "
        "pooled fleet with `rooftrace replay`, or give this command one pool's fleet file)"
    )


def offsets(ranks: Sequence[int]) -> npt.NDArray[np.int64]:
    """The first global replica number of each pool: pools number their replicas one after
    another (pool 0's first, then pool 1's, ...), so a replica number names one engine of the run."""
    return np.concatenate([[0], np.cumsum(np.asarray(ranks, np.int64))[:-1]]).astype(np.int64)


# -- the seam between pools ---------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """The path a request's KV blocks take from one pool to another: bytes per second per
    transfer and a fixed latency per transfer (each transfer is taken to have the link to
    itself: no queueing on it)."""

    bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.bytes_per_s) and self.bytes_per_s > 0):
            raise ConfigError(f"a link's bandwidth must be a finite number of bytes/s > 0, got {self.bytes_per_s!r}")
        if not (np.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"a link's latency must be a finite number of seconds >= 0, got {self.latency_s!r}")

    def seconds(self, nbytes: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return self.latency_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class Handoff:
    """Requests moving from one pool to the next with their KV blocks: which rows of the source
    workload move (``rows``), and the destination pool's workload of them (``work``)."""

    rows: npt.NDArray[np.int64]
    work: Workload
    #: Seconds each spent on the link.
    transfer_s: npt.NDArray[np.float64]


def hand_off(source: Workload, result: EngineResult, kv_bytes_per_token: float, link: Link) -> Handoff:
    """The seam a request's life crosses pools by (a prefill pool handing its requests to a decode
    pool): every request ``result`` finished with output still to produce (more than the first
    token) leaves the source pool when its first token is out, and arrives at the next pool once
    its prompt's KV (``kv_bytes_per_token`` × prompt tokens, as the destination stores it) has
    crossed ``link``. There its prompt counts as computed at admission (``reported_hit_tokens``:
    blocks of its own, against the pool's capacity, as a reported cache hit is; the engine still
    computes the last prompt token, as vLLM does for a prompt served wholly from cache) and it
    decodes the rest of its output. The destination workload is in arrival order; ``rows`` maps it
    back to the source's rows."""
    done = (result.reject_reason == 0) & np.isfinite(result.first_token_s) & (source.output_tokens > 1)
    rows = np.flatnonzero(done).astype(np.int64)
    prompt = source.prompt_tokens[rows]
    transfer = link.seconds(prompt.astype(np.float64) * float(kv_bytes_per_token))
    arrive = result.first_token_s[rows] + transfer
    order = np.argsort(arrive, kind="stable")
    rows, prompt, transfer, arrive = rows[order], prompt[order], transfer[order], arrive[order]
    work = Workload(
        arrival_s=arrive,
        prompt_tokens=prompt,
        output_tokens=source.output_tokens[rows] - 1,
        reported_hit_tokens=prompt.copy(),
    )
    return Handoff(rows, work, transfer)
