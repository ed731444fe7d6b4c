"""Latency SLOs and the verdict on a replay: targets, goodput, failures, overload.

An SLO is a set of targets ``METRIC_pNN <= seconds`` (METRIC: ttft, tpot, e2e, queue); presets
with their sources are in ``pipeline/catalog/slo.toml``. A target is met when at least NN % of
*all* requests have the metric within the limit: a rejected request misses every target, so
rejections can never make a run look healthier (docs/planning.md, "SLO semantics"). Goodput is
the share of all requests that meet every target at once.

Overload: the fleet serves fewer requests per second than arrive, so requests wait (arrived, not
yet scheduled) without a pause and the backlog grows large — up to the last arrival (sustained:
the queue grows without bound) or for a long episode that drains (a peak hour before a quiet
tail). :func:`detect_overload` says from when, until when and by how much.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from pipeline.catalog import CATALOG_DIR
from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.common.units import DAY_S, PLAIN_UP_TO, format_number, format_seconds, plain_number
from pipeline.engine.model import REJECT_REASONS, EngineResult, Workload

SLO_PATH = CATALOG_DIR / "slo.toml"

_TARGET_RE = re.compile(r"^(ttft|tpot|e2e|queue)_p(\d+(?:\.\d+)?)$")
#: Decimals a target's percentile may have: p99.9999 at most, so that its name (``ttft_p99.9999``)
#: shows it exactly; a finer one would be named like a rounded one (p99.9999999 as p100).
MAX_PERCENTILE_DECIMALS = 4
_VALUE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?\d+)?)\s*(ms|s|min|h|d)?\s*$")
#: Seconds of each unit a --slo value may take (a bare number is seconds).
_UNIT_S = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86_400.0}
METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e", "queue")
#: Longest latency a target may allow: a year. A longer one tells no run from another (every
#: request that finishes meets it) and is a unit mix-up or a value typed to mean "none": ``ttft_p99 = 1e308``
#: was accepted and printed as ``ttft_p99=1e+308s``.
MAX_TARGET_S = 365 * 86_400.0


# --------------------------------------------------------------------------------------------
# SLOs


@dataclass(frozen=True)
class SloTarget:
    metric: str  # ttft | tpot | e2e | queue
    percentile: float
    limit_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.percentile:g}"


@dataclass(frozen=True)
class Slo:
    name: str
    targets: tuple[SloTarget, ...]
    description: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "targets": {t.name: t.limit_s for t in self.targets},
        }


def _target(key: str, value: float, where: str) -> SloTarget:
    m = _TARGET_RE.match(key)
    if not m:
        raise ConfigError(f"{where}: unknown SLO target {key!r}; use METRIC_pNN with METRIC in {list(METRICS)}")
    pct = float(m.group(2))
    if not 0 < pct < 100:
        raise ConfigError(f"{where}: percentile of {key!r} must be in (0, 100)")
    _, _, decimals = m.group(2).partition(".")
    if len(decimals.rstrip("0")) > MAX_PERCENTILE_DECIMALS:
        raise ConfigError(
            f"{where}: percentile of {key!r} has more than {MAX_PERCENTILE_DECIMALS} decimals; "
            f"use at most {MAX_PERCENTILE_DECIMALS}, as in {m.group(1)}_p99.9999"
        )
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{where}: {key} must be a positive number of seconds, got {value!r}")
    if value > MAX_TARGET_S:
        raise ConfigError(
            f"{where}: {key} = {format_seconds(value)} is longer than a year ({MAX_TARGET_S:,.0f} s), which no "
            "latency target needs; give it in seconds (2, 0.1) or with a unit (100ms, 2s, 5min, 1h)"
        )
    return SloTarget(m.group(1), pct, float(value))


def limit_text(value: float) -> str:
    """A target's limit as ``--slo`` writes it, in its largest whole-looking unit from ten
    minutes up (``0.1s``, ``250s``, ``20min``, ``1.5h``, ``7d``); parse_slo reads it back."""
    if value < 600 or not value < PLAIN_UP_TO:  # (past a year is refused; NaN never gets here)
        return f"{value:g}s"
    for unit in ("d", "h", "min"):
        q = value / _UNIT_S[unit]
        if q >= 1 and float(f"{q:.4g}") == q:
            return f"{q:g}{unit}"
    return f"{np.format_float_positional(value, trim='-')}s"


def slo_table_text(raw: dict[str, Any], where: str) -> str:
    """A FLEET.toml ``[slo]`` table (``preset = "chat"`` and/or targets ``ttft_p99 = 2.0``, in
    seconds) as the text ``--slo`` takes, checked. Errors name ``where`` and the key, and echo
    the value as the file wrote it (``ttft_p99 = -1.0``, ``ttft_p99 = inf``), not as --slo text."""
    presets = load_slo_presets()
    parts: list[str] = []
    seen: dict[str, SloTarget] = {}
    for key, value in raw.items():
        if key == "preset":
            if not isinstance(value, str):
                raise ConfigError(f"{where}: preset must be a string, got {value!r}")
            if value not in presets:
                raise ConfigError(f"{where}: preset = {value!r} is not a preset; presets: {sorted(presets)}")
            parts.insert(0, value)
            continue
        if isinstance(value, dict):  # ttft_p99.9 = 1.0 is the table ttft_p99 with a key 9
            inner = next(iter(value), "9")
            raise ConfigError(
                f"{where}: {key} is a table (a dotted key such as {key}.{inner}); quote a target with a decimal "
                f'percentile: "{key}.{inner}" = ...'
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: {key} must be a number of seconds, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{where}: {key} = {value!r} must be a positive number of seconds, such as 2.0 or 0.1")
        if value > MAX_TARGET_S:
            said = f" ({format_seconds(float(value))})" if value < PLAIN_UP_TO else ""
            raise ConfigError(
                f"{where}: {key} = {value!r} seconds{said} is longer than a year ({MAX_TARGET_S:,.0f} s), which no "
                "latency target needs"
            )
        _once(seen, _target(key, float(value), where), key, where)
        parts.append(f"{key}={float(value)!r}s")
    if not parts:
        raise ConfigError(f"{where}: give a preset or targets such as ttft_p99 = 2.0")
    text = ",".join(parts)
    parse_slo(text, presets, where)  # a preset's target given again is an override, as in --slo
    return text


def _once(seen: dict[str, SloTarget], t: SloTarget, key: str, where: str) -> None:
    """Record ``t`` in ``seen``; a target given twice (``ttft_p99`` and ``ttft_p99.0`` are one
    target) is an error rather than one value silently winning."""
    if t.name in seen:
        same = "" if key == t.name else f" (the target {t.name})"
        raise ConfigError(f"{where}: {key}{same} is given more than once; give each target once")
    seen[t.name] = t


def load_slo_presets(path: Path = SLO_PATH) -> dict[str, Slo]:
    """The presets in ``pipeline/catalog/slo.toml`` (every one with its source)."""
    data = read_toml(path, "SLO presets")
    presets = {}
    for name, raw in data.items():
        where = f"{path} [{name}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: must be a table")
        for key in ("description", "source"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise ConfigError(f"{where}: missing key {key!r}")
        targets: dict[str, SloTarget] = {}
        for key, value in raw.items():
            if key in ("description", "source"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{where}: {key} must be a number of seconds, got {value!r}")
            t = _target(key, float(value), where)
            _once(targets, t, key, where)
        if not targets:
            raise ConfigError(f"{where}: no SLO targets")
        presets[name] = Slo(name, tuple(targets.values()), raw["description"], raw["source"])
    return presets


def parse_slo(text: str, presets: dict[str, Slo] | None = None, where: str = "--slo") -> Slo:
    """``chat``, ``ttft_p99=2s,tpot_p99=100ms`` or ``chat,ttft_p99=1s`` (a preset, then overrides).
    Values take ``ms``, ``s``, ``min``, ``h`` or ``d``; a bare number is seconds. Errors start
    with ``where`` (the option, or the file and key the text came from)."""
    presets = presets if presets is not None else load_slo_presets()
    targets: dict[str, SloTarget] = {}
    given: dict[str, SloTarget] = {}  # the targets given as METRIC_pNN=VALUE
    names: list[str] = []
    description, source = "", ""
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise ConfigError(f"{where}: empty; give a preset or targets such as ttft_p99=2s,tpot_p99=100ms")
    for item in items:
        if "=" not in item:
            if item not in presets:
                raise ConfigError(f"{where}: unknown preset {item!r}; presets: {sorted(presets)}")
            preset = presets[item]
            if names:  # a later preset would silently replace what came before it
                raise ConfigError(
                    f"{where}: preset {item!r} after {items[0]!r}: give one preset, first, then any target to "
                    "change (chat,ttft_p99=1s)"
                )
            names.append(item)
            description, source = preset.description, preset.source
            targets.update({t.name: t for t in preset.targets})
            continue
        key, _, raw = item.partition("=")
        m = _VALUE_RE.match(raw.lower())
        if not m:
            raise ConfigError(f"{where}: {key.strip()}={raw!r} is not a duration like 2s, 100ms or 1h")
        value = float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
        t = _target(key.strip(), value, where)
        _once(given, t, key.strip(), where)
        targets[t.name] = t  # a target given replaces a preset's
        names.append(f"{t.name}={limit_text(value)}")
    ordered = tuple(sorted(targets.values(), key=lambda t: (METRICS.index(t.metric), t.percentile)))
    return Slo("+".join(names), ordered, description, source)


def latency_arrays(run: Any) -> dict[str, npt.NDArray[np.float64]]:
    """Per-request ttft, tpot, e2e and queue seconds of a replay run (``run.result``,
    ``run.work``; NaN where not defined: tpot of 1-token outputs, every metric of a rejected
    request)."""
    return request_latencies(run.result, run.work)


def request_latencies(res: EngineResult, work: Workload) -> dict[str, npt.NDArray[np.float64]]:
    """:func:`latency_arrays` from an engine result and its workload: the one definition of the
    per-request latencies (vLLM's): ``ttft`` = first token − arrival (queueing included), ``e2e`` =
    last token − arrival, ``tpot`` = (e2e − ttft) / (output tokens − 1) (NaN for one-token
    outputs), ``queue`` = scheduled − arrival."""
    ttft = res.first_token_s - res.arrival_s
    e2e = res.finish_s - res.arrival_s
    o = work.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(o > 1, (e2e - ttft) / (o - 1), np.nan)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e, "queue": res.scheduled_s - res.arrival_s}


#: The one percentile definition of the project: the inverse CDF, the smallest value with at least
#: p % of the values at or below it, so ``percentile(x, p) <= L`` exactly when at least p % of the
#: requests meet L. numpy calls it ``inverted_cdf``; DuckDB's ``quantile_disc`` is the same (every
#: named query uses it; tests/test_warehouse.py checks the two agree), so a p99 in ``plan``, the
#: replay summary and the report is one number.
PERCENTILE_METHOD: Final = "inverted_cdf"


def percentile(values: npt.NDArray[np.float64], pct: float) -> float:
    """The inverse-CDF percentile (:data:`PERCENTILE_METHOD`) of the values that are not NaN;
    +inf counts (a request that never finished misses every target); 0.0 when none."""
    v = values[~np.isnan(values)]
    if v.size == 0:
        return 0.0
    return float(np.percentile(v, pct, method=PERCENTILE_METHOD))


# --------------------------------------------------------------------------------------------
# the verdict on a replay


@dataclass(frozen=True)
class TargetResult:
    name: str
    limit_s: float
    value_s: float  # the percentile over all requests (rejected ones count as +inf)
    met: bool
    #: The same percentile over the finished requests (NaN: none finished): what they achieved
    #: when rejections make ``value_s`` infinite.
    finished_s: float = math.nan
    #: Requests counted as never served (rejected or unfinished) among those measured.
    unserved: int = 0


@dataclass(frozen=True)
class Verdict:
    """Pass/fail of each SLO target and goodput, over every request of the run."""

    slo: str
    targets: tuple[TargetResult, ...]
    requests: int
    goodput: float  # share of all requests meeting every target (rejected: none)

    @property
    def passed(self) -> bool:
        return all(t.met for t in self.targets)

    def failing(self) -> list[TargetResult]:
        return [t for t in self.targets if not t.met]

    def to_dict(self) -> dict[str, Any]:
        return {
            "slo": self.slo,
            "passed": self.passed,
            "goodput": self.goodput,
            "requests": self.requests,
            "targets": [
                {
                    "target": t.name,
                    "limit_s": t.limit_s,
                    "value_s": _finite(t.value_s),
                    "met": t.met,
                    "finished_value_s": None if math.isnan(t.finished_s) else t.finished_s,
                    "unserved": t.unserved,
                }
                for t in self.targets
            ],
        }

    def line(self) -> str:
        parts = "; ".join(self._part(t) for t in self.targets)
        return f"SLO {self.slo}: {'PASS' if self.passed else 'FAIL'}: {parts}; goodput {self.goodput:.1%}"

    def _part(self, t: TargetResult) -> str:
        """One target; a percentile made infinite by requests never served says so, and what
        the finished requests achieved ('ttft_p99 never > 1 ms' said neither)."""
        if math.isfinite(t.value_s):
            return f"{t.name} {format_seconds(t.value_s)} {'<=' if t.met else '>'} {format_seconds(t.limit_s)}"
        share = t.unserved / self.requests if self.requests else 0.0
        pct = t.name.partition("_p")[2]
        fin = (
            "no request finished"
            if math.isnan(t.finished_s)
            else f"p{pct} of the finished {format_seconds(t.finished_s)}"
        )
        return (
            f"{t.name} over all requests infinite > {format_seconds(t.limit_s)} ({t.unserved:,} of "
            f"{self.requests:,} requests rejected or unfinished, {share:.1%}, count as never served; {fin})"
        )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


#: A per-span figure is not projected to a day from a traffic span shorter than this: a few
#: seconds of traffic times tens of thousands says nothing about a day.
MIN_PROJECTION_S = 3600.0


def traffic_span(period_s: float) -> str:
    """'2.5 s of traffic' / '58 min of traffic' / '2.5 h of traffic' / '3 days of traffic'."""
    x = float(period_s)
    if not (math.isfinite(x) and x >= 0):
        return "no traffic span"
    if x < 60:
        span = f"{plain_number(x)} s"
    elif x < 3600:
        span = f"{plain_number(x / 60)} min"
    elif x < 2 * DAY_S:
        span = f"{plain_number(x / 3600)} h"
    else:
        span = f"{plain_number(x / DAY_S)} days"
    return f"{span} of traffic"


def day_projection(period_s: float) -> str:
    """How a per-span figure relates to a day: '58 min of traffic -> x24.8 per day' from an hour of
    traffic up; below :data:`MIN_PROJECTION_S` it says it is not projected (and from how long)."""
    if not (math.isfinite(period_s) and period_s > 0):
        return "no traffic span; not projected to a day"
    if period_s < MIN_PROJECTION_S:
        return f"{traffic_span(period_s)}; not projected to a day: too short a span to extrapolate from"
    return f"{traffic_span(period_s)} -> x{plain_number(DAY_S / period_s)} per day"


def share_text(x: float) -> str:
    """A share for people: one decimal place, '<0.1%' for a small one that is not zero."""
    if not math.isfinite(x) or x <= 0:
        return "0%"
    return "<0.1%" if x < 0.001 else f"{x * 100:.1f}%"


def slo_verdict(
    lat: dict[str, npt.NDArray[np.float64]],
    rejected: npt.NDArray[np.bool_],
    slo: Slo,
    measured: npt.NDArray[np.bool_] | None = None,
) -> Verdict:
    """Each target's percentile over the ``measured`` requests (all by default), rejected ones
    counting as never served, and goodput: the share meeting every target at once (a metric
    undefined for a request — TPOT of a one-token answer — does not count against it)."""
    n = rejected.shape[0]
    m = np.ones(n, bool) if measured is None else measured
    good = ~rejected[m]
    results = []
    for t in slo.targets:
        v = np.where(rejected, np.inf, lat[t.metric])[m]
        value = percentile(v, t.percentile)
        finished = v[np.isfinite(v)]
        fin = percentile(finished, t.percentile) if finished.size else math.nan
        unserved = int(np.isinf(v).sum())
        results.append(TargetResult(t.name, t.limit_s, value, value <= t.limit_s, fin, unserved))
        good &= ~(v > t.limit_s)  # NaN (undefined) passes
    count = int(m.sum())
    return Verdict(slo.name, tuple(results), count, float(good.sum()) / count if count else 0.0)


@dataclass(frozen=True)
class Overload:
    """Whether the fleet fell behind its arrivals (see the module doc): for good — the backlog
    lasts to the last arrival (:attr:`sustained`) — or for a while: the worst episode of backlog
    that drained (``until_s`` says when)."""

    detected: bool
    #: Seconds after the first arrival: when the backlog last was empty (sustained) or when the
    #: episode's backlog started (transient).
    from_s: float | None = None
    backlog: int = 0  # requests waiting to be scheduled at the last arrival
    #: Requests/s arriving from ``from_s`` to the last arrival (sustained) or to the episode's
    #: peak (transient: while the queue grew; over the whole episode when it arrived at once).
    arrival_rate: float = 0.0
    service_rate: float = 0.0  # requests/s admitted over the same time
    drain_s: float = 0.0  # last finish − last arrival
    from_utc: str | None = None  # ``from_s`` as a UTC time, where the caller knows the clock
    #: Transient: seconds after the first arrival when the episode's backlog drained (None: the
    #: backlog lasts to the last arrival, or no overload).
    until_s: float | None = None
    until_utc: str | None = None  # ``until_s`` as a UTC time, where the caller knows the clock
    peak_backlog: int = 0  # most requests waiting at once in the episode
    peak_s: float | None = None  # seconds after the first arrival when the episode first reached it
    arrival_span_s: float | None = None  # last − first arrival
    #: Overload episodes in the run (lasting at least MIN_OVERLOAD_SHARE of the span with a peak
    #: backlog of at least the threshold); the one described is the sustained one, else the worst.
    episodes: int = 0
    #: The first accepted arrival on the run's clock (``arrival_s``): ``from_s``, ``peak_s`` and
    #: ``until_s`` count from it.
    first_arrival_s: float = 0.0

    @property
    def sustained(self) -> bool:
        """Overloaded up to the last arrival (the queue grows without bound)."""
        return self.detected and self.until_s is None

    @property
    def at_once(self) -> bool:
        """A transient episode whose peak backlog arrived at the instant it started (no rates of
        its growth: they would be infinite)."""
        return self.detected and self.until_s is not None and self.peak_s == self.from_s

    @property
    def excess(self) -> float:
        """How much arrivals exceed service (0.25: 25 % more arrive than are served)."""
        return self.arrival_rate / self.service_rate - 1.0 if self.service_rate > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            "detected": self.detected,
            "sustained": self.sustained,
            "from_s": self.from_s,
            "until_s": self.until_s,
            "backlog_requests": self.backlog,
            "peak_backlog_requests": self.peak_backlog,
            "peak_s": self.peak_s,
            "arrival_rate_per_s": self.arrival_rate,
            "service_rate_per_s": self.service_rate,
            "excess": _finite(self.excess) if self.detected and not self.at_once else None,
            "drain_s": self.drain_s,
            "arrival_span_s": self.arrival_span_s,
            "episodes": self.episodes,
            "first_arrival_s": self.first_arrival_s,
        }

    @staticmethod
    def _at(seconds: float | None, utc: str | None) -> str:
        return f"{utc} (+{format_seconds(seconds)})" if utc else f"+{format_seconds(seconds)}"

    def line(self) -> str:
        if not self.detected:
            return "no overload"
        when = self._at(self.from_s, self.from_utc)
        served = (
            f"{format_number(self.arrival_rate)} req/s arrive, {format_number(self.service_rate)} req/s served "
            f"({'+' if self.excess >= 0 else ''}{format_number(self.excess * 100, 0)}%)"
        )
        if self.until_s is None:
            rates = (
                served
                if self.service_rate > 0
                else f"{format_number(self.arrival_rate)} req/s arrive and none is admitted before the last arrival"
            )
            return (
                f"OVERLOADED from {when}: {rates}; {self.backlog:,} waiting at the last arrival, "
                f"{format_seconds(self.drain_s)} to drain"
            )
        if self.at_once:
            rates = f"a burst arrives at once, {format_number(self.service_rate)} req/s served"
        elif self.service_rate > 0:
            rates = f"{served} while the queue grew"
        else:
            rates = f"{format_number(self.arrival_rate)} req/s arrive and none is admitted while the queue grew"
        return (
            f"OVERLOADED from {when} until {self._at(self.until_s, self.until_utc)}: {rates}; up to "
            f"{self.peak_backlog:,} waiting, {self.drained()}"
        )

    def drained(self) -> str:
        """When a transient episode's backlog drained against the last arrival: 'drained 12 min
        before the last arrival' or '3 waiting at the last arrival, drained 40 s after it'."""
        gap = (self.arrival_span_s or 0.0) - (self.until_s or 0.0)
        if gap >= 0:
            return f"drained {format_seconds(gap)} before the last arrival"
        return f"{self.backlog:,} waiting at the last arrival, drained {format_seconds(-gap)} after it"


#: How a run's warning that its replicas span nodes starts (pipeline.replay.run.multi_node_warning).
MULTI_NODE = "MULTI-NODE:"


#: Overload needs a backlog of at least this many requests (and this share of the accepted
#: requests), built up without a pause for at least MIN_OVERLOAD_SHARE of the trace's span: a
#: burst that the fleet would absorb is not overload.
MIN_BACKLOG = 10
MIN_BACKLOG_SHARE = 0.01
MIN_OVERLOAD_SHARE = 0.1
#: Accepted arrivals spanning less than this are one burst, judged as ``--offline`` (everything at
#: t = 0) is: no overload. ``--rate-scale 1e300`` put 2,000 arrivals within 10⁻²⁹⁷ s and called
#: them "OVERLOADED … nothing is served" while every one was served.
MIN_SPAN_S = 1e-3


def detect_overload(
    arrival_s: npt.NDArray[np.float64],
    scheduled_s: npt.NDArray[np.float64],
    finish_s: npt.NDArray[np.float64],
    accepted: npt.NDArray[np.bool_],
) -> Overload:
    """Waiting requests W(t) = arrived − scheduled (accepted requests); the times W is 0 split the
    run into episodes. Overloaded, for good, when W at the last arrival is at least
    max(MIN_BACKLOG, MIN_BACKLOG_SHARE · accepted) and W has not been zero since a time at least
    MIN_OVERLOAD_SHARE of the span before the last arrival; else, for a while, when an episode
    that drains — from the arrival that starts it to the admission that empties the queue — lasts
    at least MIN_OVERLOAD_SHARE of the span and its peak W is at least that threshold (the worst
    such episode, by peak, is described). Arrivals spanning less than MIN_SPAN_S are one burst:
    never overload."""
    return overload_of(
        sorted_accepted(arrival_s, accepted), sorted_accepted(scheduled_s, accepted), latest_finish(finish_s, accepted)
    )


def sorted_accepted(values: npt.NDArray[np.float64], accepted: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """The accepted requests' times, sorted, a missing one (NaN: never admitted) as +inf: what
    :func:`overload_of` takes for arrivals and for admissions."""
    out = values[accepted]
    out[np.isnan(out)] = np.inf
    out.sort()
    return out


def latest_finish(finish_s: npt.NDArray[np.float64], accepted: npt.NDArray[np.bool_]) -> float | None:
    """The latest finite finish time of the accepted requests (None: none finished)."""
    last = float(np.max(finish_s, where=accepted & np.isfinite(finish_s), initial=-np.inf))
    return None if last == -np.inf else last


#: Admissions (or arrivals) whose backlog :func:`overload_of` evaluates at once (the memory it holds).
OVERLOAD_CHUNK = 1 << 20


def _drained_episodes(
    a: npt.NDArray[np.float64], s: npt.NDArray[np.float64], least: float, chunk: int
) -> list[tuple[int, int, float]]:
    """The episodes of backlog that drain and last at least ``least`` seconds, from the arrival
    that starts one to the admission that empties the queue: (index of its first arrival in ``a``,
    index past its last, the time it drained). W just after admission j is ``arrived(s[j]) −
    (j + 1)``; it is 0 only after the last of admissions tied at a time, and, as every admitted
    request arrived first, it is never below the true W: its zeros are exactly the times W is 0.
    Between two of them as many requests arrive as are admitted. A chunk of admissions at a time."""
    out: list[tuple[int, int, float]] = []
    prev = 0  # arrivals (= admissions) up to the previous zero
    for lo in range(0, s.size, chunk):
        part = s[lo : lo + chunk]
        arrived = np.searchsorted(a, part, side="right")
        zero = np.flatnonzero(arrived <= np.arange(lo + 1, lo + 1 + part.size))
        if not zero.size:
            continue
        ends = arrived[zero]
        starts = np.concatenate(([prev], ends[:-1]))
        prev = int(ends[-1])
        keep = ends > starts
        starts, ends, until = starts[keep], ends[keep], part[zero][keep]
        long = np.isfinite(until) & (until - a[starts] >= least)
        out.extend(zip(starts[long].tolist(), ends[long].tolist(), until[long].tolist(), strict=True))
    return out


def _peak(a: npt.NDArray[np.float64], s: npt.NDArray[np.float64], i0: int, i1: int, chunk: int) -> tuple[int, int]:
    """(most requests waiting, the index of the arrival that first made it so) over arrivals
    ``a[i0:i1]``: W just after arrival i is ``(i + 1) − admitted(a[i])``, exact after the last of
    arrivals tied at a time and below it before, so its maximum is W's. A chunk at a time."""
    best, at = -1, i0
    for lo in range(i0, i1, chunk):
        part = a[lo : min(i1, lo + chunk)]
        w = np.arange(lo + 1, lo + 1 + part.size) - np.searchsorted(s, part, side="right")
        j = int(np.argmax(w))
        if w[j] > best:
            best, at = int(w[j]), lo + j
    return best, at


def overload_of(
    a: npt.NDArray[np.float64], s: npt.NDArray[np.float64], last_finish: float | None, chunk: int = OVERLOAD_CHUNK
) -> Overload:
    """:func:`detect_overload` on the accepted requests' sorted arrivals ``a`` and admissions
    ``s`` (:func:`sorted_accepted`) and their latest finish (:func:`latest_finish`), the
    backlog evaluated ``chunk`` admissions (or arrivals) at a time."""
    if a.size < 2:
        return Overload(False)
    t_first, t_last = float(a[0]), float(a[-1])
    last = t_last if last_finish is None else last_finish
    drain = max(0.0, last - t_last)
    span = t_last - t_first
    if not span >= MIN_SPAN_S:  # one burst, as --offline sends it
        return Overload(False, drain_s=drain)
    threshold = max(MIN_BACKLOG, MIN_BACKLOG_SHARE * a.size)
    least = MIN_OVERLOAD_SHARE * span
    drained = []  # (peak, index of the arrival at the peak, first arrival, past the last, drained at)
    for i0, i1, until in _drained_episodes(a, s, least, chunk):
        peak, at = _peak(a, s, i0, i1, chunk)
        if peak >= threshold:
            drained.append((peak, at, i0, i1, until))
    # Sustained: W just after each admission up to the last arrival (arrivals before admissions
    # at ties): a request is admitted after it arrives, so W >= 0 and it can only reach 0 at an
    # admission. The latest admission that empties it is looked for from the end, a chunk at a time.
    k = int(np.searchsorted(s, t_last, side="right"))
    onset, start = t_first, 0
    for hi in range(k, 0, -chunk):
        upto = s[max(0, hi - chunk) : hi]
        waiting = np.searchsorted(a, upto, side="right") - np.searchsorted(s, upto, side="right")
        empty = np.flatnonzero(waiting <= 0)
        if empty.size:
            onset = float(upto[empty[-1]])
            start = int(np.searchsorted(a, onset, side="right"))
            break
    backlog = int(a.size - k)  # W just after the last arrival
    if (t_last - onset) >= least and backlog >= max(MIN_BACKLOG, MIN_BACKLOG_SHARE * a.size):
        dur = t_last - onset
        arrived = int(np.searchsorted(a, t_last, side="right") - np.searchsorted(a, onset, side="right"))
        served = int(np.searchsorted(s, t_last, side="right") - np.searchsorted(s, onset, side="right"))
        peak, at = _peak(a, s, start, a.size, chunk)
        return Overload(
            True,
            from_s=onset - t_first,
            backlog=backlog,
            arrival_rate=arrived / dur,
            service_rate=served / dur,
            drain_s=drain,
            peak_backlog=peak,
            peak_s=float(a[at]) - t_first,
            arrival_span_s=span,
            episodes=1 + sum(1 for e in drained if e[4] <= t_last),
            first_arrival_s=t_first,
        )
    if not drained:
        return Overload(False, drain_s=drain)
    peak, at, i0, i1, until = max(drained, key=lambda e: e[0])  # the worst; the first of equals
    t0, t_peak = float(a[i0]), float(a[at])
    # while the queue grew: arrivals and admissions from its first arrival to its peak (none was
    # admitted between the previous zero and that arrival); an episode that arrived at once: its
    # admissions over the whole episode
    if t_peak > t0:
        dur = t_peak - t0
        arrival_rate = (at + 1 - i0) / dur
        service_rate = (int(np.searchsorted(s, t_peak, side="right")) - i0) / dur
    else:
        arrival_rate = service_rate = (i1 - i0) / (until - t0)
    return Overload(
        True,
        from_s=t0 - t_first,
        backlog=backlog,
        arrival_rate=arrival_rate,
        service_rate=service_rate,
        drain_s=drain,
        until_s=until - t_first,
        peak_backlog=peak,
        peak_s=t_peak - t_first,
        arrival_span_s=span,
        episodes=len(drained),
        first_arrival_s=t_first,
    )


def failure_counts(
    reject_code: npt.NDArray[np.int8], finish_s: npt.NDArray[np.float64], preemptions: npt.NDArray[np.int32]
) -> dict[str, Any]:
    """Finished / rejected (by reason) / preempted request counts from per-request reject codes
    (EngineResult.reject_reason), finish times and preemption counts."""
    ok = reject_code == 0
    counts = np.bincount(np.asarray(reject_code, np.int64), minlength=len(REJECT_REASONS))
    by_reason = {REJECT_REASONS[c]: int(counts[c]) for c in range(1, len(REJECT_REASONS)) if counts[c]}
    return {
        "requests": int(reject_code.shape[0]),
        "finished": int((ok & np.isfinite(finish_s)).sum()),
        "rejected": int((~ok).sum()),
        "rejected_by_reason": by_reason,
        "preempted_requests": int((preemptions > 0).sum()),
        "preemptions": int(preemptions.sum()),
    }


def failures_line(c: dict[str, Any]) -> str:
    """'12,031 requests: 9,206 finished, 2,825 rejected (exceeds_max_model_len 2,825), 3 preempted'."""
    rej = f"{c['rejected']:,} rejected"
    if c["rejected"]:
        rej += " (" + ", ".join(f"{k} {v:,}" for k, v in c["rejected_by_reason"].items()) + ")"
    return f"{c['requests']:,} requests: {c['finished']:,} finished, {rej}, {c['preempted_requests']:,} preempted"


def overload_text(d: dict[str, Any]) -> str:
    """:meth:`Overload.line` from its ``to_dict()`` (as stored in a run's summary; one written
    before transient overloads were told apart has none of their keys and reads as before)."""
    return overload_from_dict(d).line()


def overload_from_dict(d: dict[str, Any]) -> Overload:
    """The :class:`Overload` of its ``to_dict()`` (``from_utc`` / ``until_utc`` included where
    the caller added them)."""

    def opt(key: str) -> float | None:
        v = d.get(key)
        return None if v is None else float(v)

    return Overload(
        bool(d.get("detected")),
        d.get("from_s"),
        int(d.get("backlog_requests") or 0),
        float(d.get("arrival_rate_per_s") or 0.0),
        float(d.get("service_rate_per_s") or 0.0),
        float(d.get("drain_s") or 0.0),
        d.get("from_utc"),
        until_s=opt("until_s"),
        until_utc=d.get("until_utc"),
        peak_backlog=int(d.get("peak_backlog_requests") or 0),
        peak_s=opt("peak_s"),
        arrival_span_s=opt("arrival_span_s"),
        episodes=int(d.get("episodes") or 0),
        first_arrival_s=float(d.get("first_arrival_s") or 0.0),
    )


def verdict_text(d: dict[str, Any]) -> str:
    """:meth:`Verdict.line` from its ``to_dict()``."""
    targets = tuple(
        TargetResult(
            t["target"],
            float(t["limit_s"]),
            math.inf if t["value_s"] is None else float(t["value_s"]),
            bool(t["met"]),
            math.nan if t.get("finished_value_s") is None else float(t["finished_value_s"]),
            int(t.get("unserved") or 0),
        )
        for t in d["targets"]
    )
    return Verdict(str(d["slo"]), targets, int(d["requests"]), float(d["goodput"])).line()
