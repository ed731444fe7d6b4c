"""An autoscaled pool: the live replica set over the day, decided by a policy inside the compiled
event loop (docs/pools.md, "An autoscaled day"; docs/engine.md, "Scaling decisions").

A fleet's ``[autoscale]`` table (:func:`parse_autoscale`) names a policy: a ``schedule`` of
``[hour, replicas]`` pairs, or a signal read per decision window from the replay's own step log
(``utilisation``: busy share of the live replicas; ``queue``: waiting requests per live replica;
``kv``: KV blocks in use over the live replicas' blocks). The engine runs ``max_replicas``
replicas; the loop decides which are live when (:func:`replay_autoscaled` hands it the policy,
``simulate_jit(scaling=...)``) and routes every request to one replica live at its arrival. A
replica that is not live takes no request.

Lifecycle of one replica (an :class:`Incarnation`): paid from the decision (``paid_from_s``),
live after the scale-up delay (:func:`scale_up_delay`: weight bytes over the stated load
bandwidth, the engine's start, CUDA graph capture), retired by a scale-down (it takes no new
request and finishes its running ones: it stays paid until its last request ends, the drain).
The replicas live when the day starts are live at time 0 (warm, as a fleet that served the
night before).

A signal policy decides at each window's end from that window's signal, in the loop: every step
that starts before the decision is in the step log, none that starts at or after it, so one
replay is its own fixed point — :func:`decide` over :func:`window_signals` of the run's log and
:func:`timeline` of its decisions gives back the decisions it made (tests/test_autoscale_loop.py).
The functions here state those semantics in Python; the loop (pipeline/engine/_jit_kernels.py)
implements them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.catalog import CATALOG_DIR
from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.costmodel.steps import StepCostFn
from pipeline.engine.model import EngineResult, FleetSpec, Scaling, Workload
from pipeline.engine.steplog import StepLog
from pipeline.replay.slo import percentile

AUTOSCALE_CATALOG = CATALOG_DIR / "autoscale.toml"
SIGNALS = ("utilisation", "queue", "kv", "schedule")
#: Routers an autoscaled pool routes with over its live replicas (in the compiled loop).
AUTOSCALE_ROUTERS = ("round_robin", "least_outstanding")
#: Bounds of the stated numbers (a decision window of a second to a day; a delay under a day).
MAX_WINDOW_S = 86_400.0
MAX_DELAY_PART_S = 86_400.0
MAX_LOAD_GB_S = 10_000.0
DEFAULT_WINDOW_S = 60.0
#: The keys of an [autoscale] table (tomlschema.AutoscaleTable declares the same: a test checks).
AUTOSCALE_KEYS = frozenset(
    {
        "min_replicas", "max_replicas", "signal", "scale_up_at", "scale_down_at", "window_s", "cooldown_s",
        "schedule", "initial_replicas", "load_gb_s", "storage", "engine_start_s", "cuda_graph_s",
    }
)  # fmt: skip

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class AutoscaleSettings:
    """``[autoscale]``: the policy and what a new replica must do before it serves."""

    min_replicas: int
    max_replicas: int
    signal: str
    scale_up_at: float | None = None
    scale_down_at: float | None = None
    window_s: float = DEFAULT_WINDOW_S
    cooldown_s: float = 0.0
    #: ``signal = "schedule"``: (hour after the first arrival, replicas) pairs, hours increasing.
    schedule: tuple[tuple[float, int], ...] = ()
    #: replicas live when the day starts (default ``min_replicas``; a schedule's hour-0 value)
    initial_replicas: int | None = None
    #: the scale-up delay's parts (parse_autoscale fills them from pipeline/catalog/autoscale.toml
    #: when the table leaves them out; 0 here: a settings built in code states its own)
    load_gb_s: float = math.inf
    engine_start_s: float = 0.0
    cuda_graph_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The table as a fleet file would state it (a run records it; parse_autoscale reads it back)."""
        out: dict[str, Any] = {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "signal": self.signal,
            "window_s": self.window_s,
            "cooldown_s": self.cooldown_s,
            "engine_start_s": self.engine_start_s,
            "cuda_graph_s": self.cuda_graph_s,
        }
        if math.isfinite(self.load_gb_s):
            out["load_gb_s"] = self.load_gb_s
        if self.signal == "schedule":
            out["schedule"] = [[h, r] for h, r in self.schedule]
        else:
            out["scale_up_at"] = self.scale_up_at
            out["scale_down_at"] = self.scale_down_at
            if self.initial_replicas is not None:
                out["initial_replicas"] = self.initial_replicas
        return out

    def start_replicas(self) -> int:
        if self.signal == "schedule":
            return schedule_target(self.schedule, 0.0, self.min_replicas)
        return self.initial_replicas if self.initial_replicas is not None else self.min_replicas


def _defaults() -> dict[str, float]:
    data = read_toml(AUTOSCALE_CATALOG, "autoscale catalog")
    storage = data["storage"][data["default_storage"]]
    return {
        "load_gb_s": float(storage["load_gb_s"]),
        "engine_start_s": float(data["engine_start_s"]),
        "cuda_graph_s": float(data["cuda_graph_s"]),
    }


def _storage_kinds() -> dict[str, float]:
    data = read_toml(AUTOSCALE_CATALOG, "autoscale catalog")
    return {k: float(v["load_gb_s"]) for k, v in data["storage"].items() if isinstance(v, dict)}


def _number(
    raw: Mapping[str, Any], key: str, where: str, least: float, most: float, *, open_low: bool = False
) -> float:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    x = float(value)
    low_ok = x > least if open_low else x >= least
    if not (low_ok and x <= most):  # NaN fails both
        bound = f"({least:g}, {most:g}]" if open_low else f"[{least:g}, {most:g}]"
        raise ConfigError(f"{where}: {key} must be a number in {bound}, got {value!r}")
    return x


def _integer(raw: Mapping[str, Any], key: str, where: str, least: int, most: int) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    if not least <= value <= most:
        raise ConfigError(f"{where}: {key} must be in {least}..{most:,}, got {value!r}")
    return int(value)


def parse_autoscale(raw: Any, where: str, max_engines: int = 1_000_000) -> AutoscaleSettings:
    """A fleet's ``[autoscale]`` table, checked (``where`` names the file and table in each
    one-line error): replica bounds, a known signal with its thresholds or schedule, positive
    windows, non-negative delays, finite numbers."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a table, got {raw!r}")
    allowed = AUTOSCALE_KEYS
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    missing = [k for k in ("min_replicas", "max_replicas", "signal") if k not in raw]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {missing}")
    lo = _integer(raw, "min_replicas", where, 1, max_engines)
    hi = _integer(raw, "max_replicas", where, 1, max_engines)
    if lo > hi:
        raise ConfigError(f"{where}: min_replicas ({lo}) is more than max_replicas ({hi})")
    signal = raw["signal"]
    if signal not in SIGNALS:
        raise ConfigError(f"{where}: signal {signal!r} unknown; choose one of {list(SIGNALS)}")
    d = _defaults()
    kw: dict[str, Any] = {"min_replicas": lo, "max_replicas": hi, "signal": signal}
    if "storage" in raw:
        kinds = _storage_kinds()
        if raw["storage"] not in kinds:
            raise ConfigError(f"{where}: storage {raw['storage']!r} unknown; choose one of {sorted(kinds)}")
        if "load_gb_s" in raw:
            raise ConfigError(f"{where}: set storage or load_gb_s, not both")
        d["load_gb_s"] = kinds[raw["storage"]]
    kw["load_gb_s"] = (
        _number(raw, "load_gb_s", where, 0.0, MAX_LOAD_GB_S, open_low=True) if "load_gb_s" in raw else d["load_gb_s"]
    )
    for key in ("engine_start_s", "cuda_graph_s"):
        kw[key] = _number(raw, key, where, 0.0, MAX_DELAY_PART_S) if key in raw else d[key]
    if "window_s" in raw:
        kw["window_s"] = _number(raw, "window_s", where, 1.0, MAX_WINDOW_S)
    if "cooldown_s" in raw:
        kw["cooldown_s"] = _number(raw, "cooldown_s", where, 0.0, MAX_WINDOW_S)
    if "initial_replicas" in raw:
        kw["initial_replicas"] = _integer(raw, "initial_replicas", where, lo, hi)
    if signal == "schedule":
        for key in ("scale_up_at", "scale_down_at", "initial_replicas"):
            if key in raw:
                raise ConfigError(
                    f"{where}: {key} is for a signal, not signal = 'schedule' (its hour-0 pair starts it)"
                )
        kw["schedule"] = _schedule(raw.get("schedule"), where, lo, hi)
    else:
        if "schedule" in raw:
            raise ConfigError(f"{where}: schedule is for signal = 'schedule', not {signal!r}")
        for key in ("scale_up_at", "scale_down_at"):
            if key not in raw:
                raise ConfigError(f"{where}: signal {signal!r} needs {key}")
        most = 1.0 if signal in ("utilisation", "kv") else 1e6
        up = _number(raw, "scale_up_at", where, 0.0, most, open_low=True)
        down = _number(raw, "scale_down_at", where, 0.0, most)
        if down >= up:
            raise ConfigError(f"{where}: scale_down_at ({down:g}) must be below scale_up_at ({up:g})")
        kw["scale_up_at"], kw["scale_down_at"] = up, down
    return AutoscaleSettings(**kw)


def _schedule(raw: Any, where: str, lo: int, hi: int) -> tuple[tuple[float, int], ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: signal = 'schedule' needs schedule = [[hour, replicas], ...], got {raw!r}")
    out: list[tuple[float, int]] = []
    for i, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ConfigError(f"{where}: schedule[{i}] must be [hour, replicas], got {pair!r}")
        hour, n = pair
        if isinstance(hour, bool) or not isinstance(hour, int | float) or not 0.0 <= float(hour) <= 1e6:
            raise ConfigError(f"{where}: schedule[{i}] hour must be a number of hours >= 0, got {hour!r}")
        if isinstance(n, bool) or not isinstance(n, int) or not lo <= n <= hi:
            raise ConfigError(f"{where}: schedule[{i}] replicas must be an integer in {lo}..{hi} (min..max), got {n!r}")
        if out and float(hour) <= out[-1][0]:
            raise ConfigError(f"{where}: schedule hours must increase, got {hour!r} after {out[-1][0]:g}")
        out.append((float(hour), int(n)))
    return tuple(out)


def schedule_target(schedule: Sequence[tuple[float, int]], t_s: float, before: int) -> int:
    """The replicas a schedule asks for at ``t_s`` seconds (``before``: before its first hour)."""
    n = before
    for hour, replicas in schedule:
        if hour * 3600.0 <= t_s:
            n = replicas
    return n


def scale_up_delay(settings: AutoscaleSettings, weight_bytes: float) -> float:
    """Seconds from a scale-up decision to the new replica's first request: its weights read at
    ``load_gb_s`` plus the engine's start plus CUDA graph capture."""
    return weight_bytes / (settings.load_gb_s * 1e9) + settings.engine_start_s + settings.cuda_graph_s


# -- the replica timeline --------------------------------------------------------------------------


@dataclass(frozen=True)
class Incarnation:
    """One replica's provisioned life: paid from ``paid_from_s``, takes requests from
    ``live_from_s`` until ``retire_s`` (inf: the day's end), paid until ``end_s`` (set once the
    replay says when its last request finished: the drain)."""

    replica: int
    paid_from_s: float
    live_from_s: float
    retire_s: float = math.inf
    end_s: float = math.inf

    def live_at(self, t: float) -> bool:
        return self.live_from_s <= t < self.retire_s


def timeline(changes: Sequence[tuple[float, int]], initial: int, delay_s: float, replicas: int) -> list[Incarnation]:
    """The incarnations a sequence of (time, target replicas) changes makes, from ``initial``
    replicas live at time 0. Scale-up: the replica indices below ``replicas`` not provisioned,
    the one retired longest ago first (never used first, lowest index on ties), paid now, live
    after ``delay_s``. Scale-down: the newest first (one still starting is cancelled before a
    serving one retires)."""
    incs: list[Incarnation] = [Incarnation(r, 0.0, 0.0) for r in range(initial)]
    active = list(range(initial))  # positions in incs, oldest first
    retired_at: dict[int, float] = {}
    for t, target in sorted(changes, key=lambda c: c[0]):
        cur = len(active)
        if target > cur:
            busy = {incs[i].replica for i in active}
            free = [r for r in range(replicas) if r not in busy]
            free.sort(key=lambda r: (retired_at.get(r, -math.inf), r))
            for r in free[: target - cur]:
                incs.append(Incarnation(r, t, t + delay_s))
                active.append(len(incs) - 1)
        elif target < cur:
            for _ in range(cur - target):
                i = max(active, key=lambda j: (incs[j].paid_from_s, incs[j].replica))
                active.remove(i)
                old = incs[i]
                incs[i] = Incarnation(old.replica, old.paid_from_s, old.live_from_s, t)
                retired_at[old.replica] = t
    return incs


def live_counts(incs: Sequence[Incarnation], edges: FloatArray) -> FloatArray:
    """Live replica-seconds in each window between consecutive ``edges``, divided by the window:
    the mean number of live replicas."""
    out = np.zeros(edges.shape[0] - 1)
    for inc in incs:
        lo = np.maximum(edges[:-1], inc.live_from_s)
        hi = np.minimum(edges[1:], min(inc.retire_s, edges[-1]))
        out += np.clip(hi - lo, 0.0, None)
    return out / np.diff(edges)


# -- signals ---------------------------------------------------------------------------------------


def _integral(edges: FloatArray, start: FloatArray, end: FloatArray, value: FloatArray) -> FloatArray:
    """Σ value × (time each span [start, end) spends before each edge), at every edge."""

    def before(t: FloatArray, x: FloatArray) -> FloatArray:
        o = np.argsort(x, kind="stable")
        xs, vs = x[o], value[o]
        cv = np.concatenate([[0.0], np.cumsum(vs)])
        cx = np.concatenate([[0.0], np.cumsum(vs * xs)])
        i = np.searchsorted(xs, t, side="right")
        out: FloatArray = t * cv[i] - cx[i]
        return out

    return before(edges, start) - before(edges, end)


def window_signals(
    cols: Mapping[str, npt.NDArray[Any]], incs: Sequence[Incarnation], edges: FloatArray, kv_blocks: int
) -> dict[str, FloatArray]:
    """Per window between ``edges``: the mean live replicas and each signal over them, from the
    step log's spans (each spread evenly over its wall time, as the run's series does)."""
    start = cols["start_s"].astype(np.float64)
    end = cols["end_s"].astype(np.float64)
    one = np.ones_like(start)
    live = live_counts(incs, edges)
    width = np.diff(edges)
    replica_s = np.maximum(live * width, 1e-12)
    busy = np.diff(_integral(edges, start, end, one))
    waiting = np.diff(_integral(edges, start, end, cols["waiting"].astype(np.float64)))
    kv = np.diff(_integral(edges, start, end, cols["kv_blocks_used"].astype(np.float64)))
    return {
        "live": live,
        "utilisation": busy / replica_s,
        "queue": waiting / replica_s,
        "kv": kv / (replica_s * max(kv_blocks, 1)),
    }


def decide(settings: AutoscaleSettings, signal: FloatArray, edges: FloatArray) -> list[tuple[float, int]]:
    """The target changes a signal policy makes, one decision at each window's end from the
    window's signal: above ``scale_up_at`` the target becomes ⌈target × signal / scale_up_at⌉
    (at least one more), below ``scale_down_at`` one fewer; within ``min..max``, and no change
    within ``cooldown_s`` of the last one."""
    target = settings.start_replicas()
    last = -math.inf
    out: list[tuple[float, int]] = []
    up, down = settings.scale_up_at, settings.scale_down_at
    assert up is not None and down is not None
    for k in range(signal.shape[0] - 1):  # the last window ends the day: nothing left to decide
        t = float(edges[k + 1])
        s = float(signal[k])
        if t - last < settings.cooldown_s:
            continue
        want = target
        if s > up:
            want = max(target + 1, math.ceil(target * s / up - 1e-9))
        elif s < down:
            want = target - 1
        want = min(max(want, settings.min_replicas), settings.max_replicas)
        if want != target:
            out.append((t, want))
            target, last = want, t
    return out


# -- the control loop ------------------------------------------------------------------------------


@dataclass
class AutoscaleOutcome:
    """What an autoscaled replay decided and what it provisioned."""

    settings: AutoscaleSettings
    delay_s: float
    incarnations: list[Incarnation]
    changes: list[tuple[float, int]]
    #: per decision window (a signal policy): its start, the mean live replicas and each signal, as
    #: the loop decided on them
    windows: dict[str, list[float]] = field(default_factory=dict)

    def provisioned_s(self, lo: float, hi: float) -> float:
        """Replica-seconds paid within [lo, hi] (each incarnation from its decision to its
        drain's end)."""
        return sum(max(0.0, min(inc.end_s, hi) - max(inc.paid_from_s, lo)) for inc in self.incarnations)

    def to_dict(self) -> dict[str, Any]:
        """The run's record (config.json's ``summary.autoscale``): the policy ran inside the
        compiled event loop, in one pass that is its own fixed point (``passes`` 1, ``converged``)."""
        return {
            "settings": self.settings.to_dict(),
            "scale_up_delay_s": self.delay_s,
            "decided_in": "event_loop",
            "passes": 1,
            "converged": True,
            "changes": [[t, n] for t, n in self.changes],
            "replicas": [
                {
                    "replica": inc.replica,
                    "paid_from_s": inc.paid_from_s,
                    "live_from_s": inc.live_from_s,
                    "retire_s": None if not math.isfinite(inc.retire_s) else inc.retire_s,
                    "end_s": inc.end_s,
                }
                for inc in self.incarnations
            ],
            "windows": self.windows,
        }


def provisioned_from_record(record: Mapping[str, Any], lo: float, hi: float) -> float:
    """:meth:`AutoscaleOutcome.provisioned_s` from a run's recorded ``autoscale`` (config.json)."""
    total = 0.0
    for inc in record.get("replicas", []):
        total += max(0.0, min(float(inc["end_s"]), hi) - max(float(inc["paid_from_s"]), lo))
    return total


def autoscale_record(config: Mapping[str, Any], pool: str | None = None) -> dict[str, Any] | None:
    """A run's recorded autoscaling (config.json's ``summary.autoscale``; a pool's, under
    ``summary.pools``), or None for a static fleet or pool."""
    summary = config.get("summary")
    if pool is not None:
        pools = summary.get("pools") if isinstance(summary, dict) else None
        summary = pools.get(pool) if isinstance(pools, dict) else None
    found = summary.get("autoscale") if isinstance(summary, dict) else None
    return found if isinstance(found, dict) and isinstance(found.get("replicas"), list) else None


def paid_per_replica(record: Mapping[str, Any], lo: float, hi: float, replicas: int) -> FloatArray:
    """Seconds each replica (index below ``replicas``) was paid within [lo, hi], from a recorded
    ``autoscale``."""
    out = np.zeros(replicas)
    for inc in record.get("replicas", []):
        r = int(inc["replica"])
        if 0 <= r < replicas:
            out[r] += max(0.0, min(float(inc["end_s"]), hi) - max(float(inc["paid_from_s"]), lo))
    return out


def with_drains(
    incs: Sequence[Incarnation], res: EngineResult, routes: IntArray, day_end_s: float
) -> list[Incarnation]:
    """Each incarnation's paid end: the day's end while not retired, else the later of its
    retirement and the finish of the last request routed to it while it was live."""
    finish = np.where(np.isfinite(res.finish_s), res.finish_s, res.arrival_s)
    out = []
    for inc in incs:
        if not math.isfinite(inc.retire_s):
            out.append(Incarnation(inc.replica, inc.paid_from_s, inc.live_from_s, inc.retire_s, day_end_s))
            continue
        mine = (routes == inc.replica) & (res.arrival_s >= inc.live_from_s) & (res.arrival_s < inc.retire_s)
        last = float(finish[mine].max()) if mine.any() else inc.retire_s
        out.append(Incarnation(inc.replica, inc.paid_from_s, inc.live_from_s, inc.retire_s, max(inc.retire_s, last)))
    return out


def replay_autoscaled(
    work: Workload,
    spec: FleetSpec,
    settings: AutoscaleSettings,
    weight_bytes: float,
    cost: StepCostFn,
    progress: Callable[[int], None] | None = None,
) -> tuple[EngineResult, IntArray, AutoscaleOutcome, StepLog]:
    """Replay ``work`` on ``spec`` (``max_replicas`` replicas) under ``settings`` in one run of the
    compiled loop, which decides the live replicas as it goes (``simulate_jit(scaling=...)``:
    a schedule's changes at their hours, a signal's at each window's end from the window's
    signal) and routes each arrival to a live replica. Returns the results, each request's
    replica, what was decided and provisioned, and the step log."""
    from pipeline.engine.jit import simulate_jit  # lazy: the engine's module, loaded when a replay runs

    if spec.router not in AUTOSCALE_ROUTERS:
        raise ValueError(f"an autoscaled pool routes with {list(AUTOSCALE_ROUTERS)}, not {spec.router!r}")
    delay = scale_up_delay(settings, weight_bytes)
    arrival = np.asarray(work.arrival_s, np.float64)
    last_arrival = float(arrival.max()) if arrival.size else 0.0
    initial = settings.start_replicas()
    lo, hi = settings.min_replicas, settings.max_replicas
    if settings.signal == "schedule":
        planned = tuple((h * 3600.0, n) for h, n in settings.schedule if h > 0)
        scaling = Scaling("schedule", initial, delay, min_replicas=lo, max_replicas=hi, planned=planned)
    else:
        assert settings.scale_up_at is not None and settings.scale_down_at is not None
        windows = max(1, math.ceil(max(last_arrival, 1e-9) / settings.window_s))
        scaling = Scaling(
            settings.signal, initial, delay, min_replicas=lo, max_replicas=hi, scale_up_at=settings.scale_up_at,
            scale_down_at=settings.scale_down_at, window_s=settings.window_s, windows=windows,
            cooldown_s=settings.cooldown_s,
        )  # fmt: skip
    log = StepLog(capacity=max(1024, 2 * work.n))
    res = simulate_jit(work, spec, cost, log, progress, scaling=scaling)
    changes = scaling.decisions
    incs = timeline(changes, initial, delay, spec.replicas)
    routes = res.replica.astype(np.int64)
    return (*_outcome(settings, delay, incs, changes, res, routes, last_arrival, scaling.signals), log)


def _outcome(
    settings: AutoscaleSettings,
    delay: float,
    incs: list[Incarnation],
    changes: list[tuple[float, int]],
    res: EngineResult,
    routes: IntArray,
    last_arrival: float,
    sig: Mapping[str, FloatArray],
) -> tuple[EngineResult, IntArray, AutoscaleOutcome]:
    done = res.finish_s[np.isfinite(res.finish_s)]
    day_end = max(last_arrival, float(done.max()) if done.size else 0.0)
    incs = with_drains(incs, res, routes, day_end)
    windows: dict[str, list[float]] = {}
    if sig:
        windows = {k: [float(x) for x in v] for k, v in sig.items()}
        windows["start_s"] = [float(i * settings.window_s) for i in range(len(windows["live"]))]
    return res, routes, AutoscaleOutcome(settings, delay, incs, changes, windows)


# -- when and why an autoscaled day missed its TTFT target ------------------------------------------


def clock_text(t_s: float, t0_us: int | None, rate_scale: float = 1.0) -> str:
    """A time on the run's clock (seconds after its time 0, the first arrival) as the log's UTC
    wall clock, ``HH:MM`` (``t0_us``: time 0 in epoch µs; the replay runs the log ``rate_scale``
    times as fast), or without one as ``minute N``."""
    if t0_us is None:
        return f"minute {math.floor(t_s / 60.0):,}"
    at = np.datetime64(int(t0_us), "us") + np.timedelta64(round(t_s * rate_scale * 1e6), "us")
    return str(np.datetime_as_string(at, unit="m"))[-5:]


def minute_percentiles(arrival_s: FloatArray, ttft_s: FloatArray, pct: float) -> FloatArray:
    """The ``pct`` percentile (inverse CDF, :func:`pipeline.replay.slo.percentile`) of the TTFT of
    each minute's arrivals, minute 0 starting at time 0; a request never served (NaN or inf)
    counts as infinite, as the SLO verdict counts it; NaN for a minute with no arrival."""
    if arrival_s.shape[0] == 0:
        return np.zeros(0)
    which = np.floor(np.maximum(arrival_s, 0.0) / 60.0).astype(np.int64)
    served = np.where(np.isfinite(ttft_s), ttft_s, np.inf)
    out = np.full(int(which.max()) + 1, np.nan)
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(out.shape[0] + 1))
    for m, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        if hi > lo:
            x = np.sort(served[order[lo:hi]])
            out[m] = x[max(math.ceil(pct / 100.0 * x.shape[0] - 1e-9) - 1, 0)]
    return out


def _spans(above: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """Runs of consecutive True minutes, as (first, last + 1)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], above.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def delay_parts_text(record: Mapping[str, Any]) -> str:
    """``scale-up delay 1,219 s: weights 16.1 GB at 2 GB/s + engine start 41 s + CUDA graphs 17 s``
    from a recorded ``autoscale`` (its settings and delay; the weights' bytes are the delay's rest)."""
    st = record["settings"]
    delay = float(record["scale_up_delay_s"])
    start, graphs = float(st["engine_start_s"]), float(st["cuda_graph_s"])
    parts = []
    if st.get("load_gb_s") is not None:
        gb_s = float(st["load_gb_s"])
        load_s = max(delay - start - graphs, 0.0)
        parts.append(f"weights {load_s * gb_s:,.1f} GB at {gb_s:g} GB/s ({load_s:,.1f} s)")
    parts += [f"engine start {start:,g} s", f"CUDA graphs {graphs:,g} s"]
    return f"scale-up delay {delay:,.0f} s: " + " + ".join(parts)


def slo_miss(
    record: Mapping[str, Any],
    arrival_s: FloatArray,
    ttft_s: FloatArray,
    limit_s: float,
    pct: float = 99.0,
    t0_us: int | None = None,
    rate_scale: float = 1.0,
) -> dict[str, Any] | None:
    """When and why an autoscaled day's TTFT target (``pct`` percentile ≤ ``limit_s``) was
    missed, from its recorded ``autoscale`` and its requests (None when the day's percentile, a
    request never served counting as infinite, is within the limit): the minutes whose arrivals' TTFT
    percentile is above the limit (:func:`minute_percentiles`), the span of consecutive ones
    named (the one with the most replicas starting, paid but not yet live, at one instant in it;
    else the longest), the most replicas starting at once and live in it, when the first of those
    starting was decided and served, and one line saying so (:func:`slo_miss_line`)."""
    arrival_s, ttft_s = np.asarray(arrival_s, np.float64), np.asarray(ttft_s, np.float64)
    if arrival_s.shape[0] == 0 or percentile(np.where(np.isfinite(ttft_s), ttft_s, np.inf), pct) <= limit_s:
        return None  # the day met the target: a bad minute is not a missed SLO
    per = minute_percentiles(arrival_s, ttft_s, pct)
    above = np.nan_to_num(per, nan=-np.inf) > limit_s
    spans = _spans(above)
    if not spans:
        return None
    lives = list(record.get("replicas", []))

    def starting(lo_s: float, hi_s: float) -> list[Mapping[str, Any]]:
        out = []
        for r in lives:
            ready = min(float(r["live_from_s"]), float(r["retire_s"]) if r["retire_s"] is not None else math.inf)
            if float(r["paid_from_s"]) < hi_s and ready > lo_s and ready > float(r["paid_from_s"]):
                out.append(r)
        return out

    def live_at(t: float) -> int:
        return sum(
            1
            for r in lives
            if float(r["live_from_s"]) <= t < (float(r["retire_s"]) if r["retire_s"] is not None else math.inf)
        )

    def most_at_once(lo_s: float, hi_s: float) -> int:
        """The most replicas starting at one instant of [lo_s, hi_s)."""
        events = []
        for r in starting(lo_s, hi_s):
            ready = min(float(r["live_from_s"]), float(r["retire_s"]) if r["retire_s"] is not None else math.inf)
            events += [(max(float(r["paid_from_s"]), lo_s), 1), (min(ready, hi_s), -1)]
        return max(itertools.accumulate(d for _, d in sorted(events)), default=0)

    first, last = max(spans, key=lambda s: (most_at_once(60.0 * s[0], 60.0 * s[1]), s[1] - s[0], -s[0]))
    lo_s, hi_s = 60.0 * first, 60.0 * last
    coming = starting(lo_s, hi_s)
    head = min(coming, key=lambda r: (float(r["paid_from_s"]), float(r["live_from_s"])), default=None)
    worst = float(np.max(per[first:last]))
    miss: dict[str, Any] = {
        "metric": f"ttft_p{pct:g}",
        "limit_s": limit_s,
        "from_s": lo_s,
        "until_s": hi_s,
        "minutes_above": int(above.sum()),
        "spans": len(spans),
        "worst_s": worst if math.isfinite(worst) else None,
        "starting_replicas": most_at_once(lo_s, hi_s),
        "decided_from_s": float(head["paid_from_s"]) if head is not None else None,
        "serving_from_s": float(head["live_from_s"]) if head is not None else None,
        "live_replicas": max(live_at(60.0 * m) for m in range(first, last)),
        "scale_up_delay_s": float(record["scale_up_delay_s"]),
    }
    miss["line"] = slo_miss_line(record, miss, t0_us, rate_scale)
    return miss


def slo_miss_line(
    record: Mapping[str, Any], miss: Mapping[str, Any], t0_us: int | None = None, rate_scale: float = 1.0
) -> str:
    """:func:`slo_miss`'s sentence: the span on the log's UTC clock (``t0_us``) or in minutes
    after the first arrival, the replicas starting in it and the delay's parts, or the cause when
    none was starting (at max_replicas; the policy had not asked)."""
    st = record["settings"]

    def at(t: float) -> str:
        return clock_text(t, t0_us, rate_scale)

    worst = miss["worst_s"]
    clock = "UTC" if t0_us is not None else "after the first arrival"
    head = (
        f"AUTOSCALE: TTFT {miss['metric'][5:]} above the SLO's {miss['limit_s']:g} s from {at(miss['from_s'])} to "
        f"{at(miss['until_s'])} ({clock}; worst minute {'never served' if worst is None else f'{worst:,.1f} s'})"
    )
    n, live = int(miss["starting_replicas"]), int(miss["live_replicas"])
    if n:
        schedule = st["signal"] == "schedule"
        knob = "an earlier schedule hour" if schedule else f"a lower scale_up_at ({st['scale_up_at']:g})"
        why = (
            f" while {n} replica{'s were' if n != 1 else ' was'} starting ({delay_parts_text(record)}; the first "
            f"decided at {at(miss['decided_from_s'])} served from {at(miss['serving_from_s'])}): a shorter "
            f"scale-up delay (faster weight storage, a quicker engine start) or {knob} would have had them "
            "serving sooner"
        )
    elif live >= int(st["max_replicas"]):
        why = f" with all {live} replicas (max_replicas) live: the policy had no replica left to add"
    elif st["signal"] == "schedule":
        why = f" with {live} of at most {st['max_replicas']} live, none starting: the schedule asks for no more"
    else:
        why = (
            f" with {live} of at most {st['max_replicas']} replicas live and none starting: the policy had not asked "
            f"for more; a lower scale_up_at or a shorter window_s ({st['window_s']:g} s) reacts sooner"
        )
    more = f" ({miss['minutes_above']} minutes above in all, in {miss['spans']} spans)" if miss["spans"] > 1 else ""
    return head + why + more
