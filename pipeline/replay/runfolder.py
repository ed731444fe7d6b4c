"""A replay run's folder, ``STORE/runs/<run_id>/``: which folders are runs, and its record,
``config.json`` — written once the run's tables are in place (a run is complete from then on),
read back by ``cost``, the warehouse's ``runs`` view, ``report`` and ``query``, and checked the
same way by all of them.

``config.json`` holds ``run_id``, ``date``, ``fleet_file``, ``options``, ``resolved`` (the fleet
as replayed and the catalog entries it was resolved with) and ``summary`` (docs/engine.md).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.schemas import atomic_write_bytes
from pipeline.common.system import not_regular
from pipeline.ingest.store import Store, check_date
from pipeline.replay.fleet import ResolvedFleet, fleet_from_dict, resolve

#: The run's record: its folder is a run once this file is there.
CONFIG = "config.json"
#: The files of a replay run the warehouse's views read (a folder holding any of them is a run's folder).
RUN_FILES = (CONFIG, "requests.parquet", "steps.parquet", "series.parquet", "load_curve.parquet")


def config_path(run_dir: Path) -> Path:
    return run_dir / CONFIG


def write_config(run_dir: Path, doc: Mapping[str, Any]) -> None:
    """Write the run's record (atomically; keys sorted, so a re-run writes the same bytes)."""
    atomic_write_bytes(config_path(run_dir), json.dumps(doc, indent=2, sort_keys=True).encode())


def read_config(path: Path) -> dict[str, Any]:
    """A run's ``config.json`` as a dict; one RooftraceError naming the file (and the line and
    column of a JSON error) when it cannot be read or is not a JSON object."""
    why = not_regular(path)
    if why is not None:
        raise RooftraceError(f"{path}: cannot read the run config: {why}")
    try:
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise RooftraceError(f"{path}: cannot read the run config: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise RooftraceError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise RooftraceError(f"{path}: not valid JSON: {(str(exc).splitlines() or [type(exc).__name__])[0]}") from None
    if not isinstance(doc, dict):
        raise RooftraceError(f"{path}: not a run config: must hold a JSON object, got {type(doc).__name__}")
    return doc


def fleet_of(config: Mapping[str, Any], origin: str) -> tuple[ResolvedFleet, str]:
    """The fleet a run ran, resolved with the catalog entries it recorded (a run made before runs
    recorded them: today's catalog), and which of the two it was."""
    resolved = config.get("resolved")
    if not isinstance(resolved, dict) or "fleet" not in resolved:
        raise ConfigError(f"{origin}: resolved.fleet is missing (not a replay run's config.json)")
    # the reader of FleetConfig.to_dict(): its unset keys (null) are read back as unset
    cfg = fleet_from_dict(resolved["fleet"], origin)
    entries = resolved.get("catalog") or {}
    if isinstance(entries, dict) and all(isinstance(entries.get(k), str) and entries[k] for k in ("hardware", "model")):
        return resolve(cfg, origin, entries), "the run's recorded catalog entries"
    return resolve(cfg, origin), "today's catalog (the run did not record its entries)"


def check_config(config: Mapping[str, Any], origin: str) -> tuple[ResolvedFleet, str]:
    """The checks of a run's ``config.json`` before anything reads the run (the fleet it records
    resolves: replicas >= 1 and not past what a replay numbers, known catalog entries, ...; the
    GPUs per replica it records are the fleet's; each pool's, for a fleet of pools), one
    ConfigError naming ``origin`` else. ``cost`` refuses such a run and the warehouse leaves it
    out, so ``query cost`` never prices a config that ``cost`` refuses. Returns :func:`fleet_of`'s
    (a fleet of pools: its first pool's; :func:`pools_of` gives them all)."""
    first = pools_of(config, origin)[0]
    return first.fleet, first.source


@dataclass(frozen=True)
class RunPool:
    """One pool of a run: its name (None: the run's fleet is one pool), its resolved fleet, where
    its catalog entries came from, and its first replica number in the run's tables."""

    name: str | None
    fleet: ResolvedFleet
    source: str
    first_replica: int = 0
    role: str = "unified"


def _checked(resolved: Mapping[str, Any], origin: str) -> tuple[ResolvedFleet, str]:
    fleet, source = fleet_of({"resolved": resolved}, origin)
    recorded = resolved.get("gpus_per_replica")
    if recorded is not None and (isinstance(recorded, bool) or recorded != fleet.gpus_per_replica):
        raise ConfigError(
            f"{origin}: resolved.gpus_per_replica is {recorded!r}, but its fleet has {fleet.gpus_per_replica} "
            "GPUs a replica (the file was changed after the replay)"
        )
    return fleet, source


def is_pooled_run(config: Mapping[str, Any]) -> bool:
    """Whether a run's ``config.json`` records a fleet of pools (``resolved.pools``)."""
    resolved = config.get("resolved")
    return isinstance(resolved, dict) and "pools" in resolved


def pools_of(config: Mapping[str, Any], origin: str) -> list[RunPool]:
    """The pools a run ran (one, unnamed, for a fleet of one pool), each checked as
    :func:`check_config` checks a run's fleet; a fleet of pools' replica numbers must follow one
    another (pool after pool, as the replay numbers them)."""
    resolved = config.get("resolved")
    if not is_pooled_run(config):
        if not isinstance(resolved, dict):
            raise ConfigError(f"{origin}: resolved.fleet is missing (not a replay run's config.json)")
        fleet, source = _checked(resolved, origin)
        return [RunPool(None, fleet, source)]
    assert isinstance(resolved, dict)
    raw = resolved["pools"]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{origin}: resolved.pools must be a non-empty list of pools")
    out: list[RunPool] = []
    at = 0
    for i, entry in enumerate(raw):
        where = f"{origin} resolved.pools[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("pool"), str):
            raise ConfigError(f"{where}: must be a pool's record with its name (pool)")
        fleet, source = _checked(entry, where)
        first = entry.get("first_replica")
        if first != at:
            raise ConfigError(f"{where}: first_replica is {first!r}, but the pools before it number {at:,} replicas")
        out.append(RunPool(entry["pool"], fleet, source, at, str(entry.get("role") or "unified")))
        at += fleet.ranks
    return out


def read_checked_config(path: Path) -> dict[str, Any]:
    """A run's ``config.json`` read (:func:`read_config`) and checked (:func:`check_config`): a
    run whose config ``cost`` refuses is not one the warehouse answers for (``query cost``
    printed 0 GPUs for replicas = 0)."""
    config = read_config(path)
    check_config(config, str(path))
    return config


def _recorded_overload(config: Mapping[str, Any]) -> dict[str, Any] | None:
    summary = config.get("summary")
    health = summary.get("health") if isinstance(summary, dict) else None
    over = health.get("overload") if isinstance(health, dict) else None
    return over if isinstance(over, dict) else None


def run_overloaded(config: Mapping[str, Any]) -> bool:
    """Whether a run's summary (config.json) says it was overloaded."""
    over = _recorded_overload(config)
    return over is not None and bool(over.get("detected"))


def run_overload_sustained(config: Mapping[str, Any]) -> bool:
    """Whether a run's recorded overload lasted to its last arrival: sustained, or an episode
    still queued there that drained after it (summaries written before drained overloads were
    reported hold only sustained ones)."""
    over = _recorded_overload(config)
    if over is None or over.get("sustained", True) is not False:
        return True
    backlog = over.get("backlog_requests")
    return isinstance(backlog, int | float) and backlog > 0


def latest_run(store: Store, date: str | None = None, exclude: Collection[str] = ()) -> str | None:
    """The most recently written run (of ``date`` when given: a YYYY-MM-DD date, matched whole,
    never as a prefix), by its config file's mtime; never one of ``exclude`` (the runs the
    warehouse left out as damaged, :attr:`pipeline.publish.warehouse.Session.skipped`)."""
    configs = list(store.runs_dir.glob(f"*/{CONFIG}")) if store.runs_dir.is_dir() else []
    configs = [c for c in configs if c.parent.name not in exclude]
    if date is not None:
        check_date(date)
        configs = [c for c in configs if c.parent.name[:11] == f"{date}-"]
    if not configs:
        return None
    return max(configs, key=lambda c: (c.stat().st_mtime_ns, c.parent.name)).parent.name


def run_ids(store: Store) -> list[str]:
    """The replay runs in the store (folders ``runs/<id>/`` with a ``config.json``), sorted."""
    if not store.runs_dir.is_dir():
        return []
    return sorted(c.parent.name for c in store.runs_dir.glob(f"*/{CONFIG}"))


def run_date(store: Store, run_id: str) -> str:
    """The arrival date a run replayed: its config's ``date`` (run ids begin with it too)."""
    try:
        config = read_config(config_path(store.run_dir(run_id)))
    except RooftraceError:
        config = {}
    return str(config.get("date") or run_id[:10])
