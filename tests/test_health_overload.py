"""A run's health: a peak-hour overload that drains during a quiet tail is OVERLOADED, a burst
within a femtosecond is one burst, as --offline sends it, a replica wider than one node says
that its cross-node communication is priced as intra-node, a closed loop is never overloaded,
and overload times are on the log's clock under --rate-scale."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import own_copy
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.engine.model import EngineResult, Workload
from pipeline.ingest.store import Store
from pipeline.publish.report import _health_cards, attention, health_headline, overload_phrase
from pipeline.replay.fleet import load_fleet, resolve
from pipeline.replay.run import ReplayOptions, _utc, health, multi_node_warning, replay
from pipeline.replay.runrequests import MemoryColumns
from pipeline.replay.slo import (
    MIN_BACKLOG,
    MIN_BACKLOG_SHARE,
    MIN_OVERLOAD_SHARE,
    MIN_SPAN_S,
    Overload,
    detect_overload,
    latest_finish,
    overload_of,
    overload_text,
    sorted_accepted,
)
from pipeline.synth import SynthConfig, generate, write_logs

# -- a transient overload, by hand --------------------------------------------------------------


def _peak_then_quiet() -> tuple[np.ndarray, np.ndarray]:
    """371 requests. 0..99 s: one a second, admitted 10 ms after it arrives. 100..199.5 s: two a
    second (100 + 0.5 i, i = 0..199), admitted one a second from 100 s (100 + i): the queue grows
    to W = ceil(i / 2) just after arrival i — 0 at 100 s (arrived and admitted at once), so the
    queue starts growing at 100.5 s — 100 at 199.5 s, and drains at the last of them, 299 s.
    300..1000 s: one every 10 s, admitted 10 ms after it arrives."""
    quiet = np.arange(100.0)
    peak = 100.0 + 0.5 * np.arange(200)
    tail = 300.0 + 10.0 * np.arange(71)
    arrival = np.concatenate([quiet, peak, tail])
    scheduled = np.concatenate([quiet + 0.01, 100.0 + np.arange(200.0), tail + 0.01])
    return arrival, scheduled


def test_a_peak_that_drains_before_the_last_arrival_is_overload() -> None:
    arrival, scheduled = _peak_then_quiet()
    ok = np.ones(arrival.size, bool)
    over = detect_overload(arrival, scheduled, scheduled + 1.0, ok)
    assert over.detected and not over.sustained
    assert (over.from_s, over.until_s, over.peak_s) == (100.5, 299.0, 199.5)
    assert over.peak_backlog == 100 and over.episodes == 1
    # while it grew (100.5 .. 199.5 s): 199 arrived (i = 1..199), 99 admitted (101, 102, ..., 199)
    assert over.arrival_rate == pytest.approx(199 / 99) and over.service_rate == pytest.approx(1.0)
    assert over.excess == pytest.approx(199 / 99 - 1)
    # at the last arrival (1000 s) one request waits (admitted 10 ms later); last finish 1001.01 s
    assert over.backlog == 1 and over.drain_s == pytest.approx(1.01)
    assert over.arrival_span_s == 1000.0
    line = over.line()
    assert line == (
        "OVERLOADED from +100 s until +299 s: 2.01 req/s arrive, 1.00 req/s served (+101%) while the queue "
        "grew; up to 100 waiting, drained 11.7 min before the last arrival"
    )
    d = over.to_dict()
    assert d["sustained"] is False and d["until_s"] == 299.0 and d["peak_backlog_requests"] == 100
    # the summary's dict reads back as the same line, with the UTC times a replay adds
    assert overload_text(d) == line == overload_phrase(d)
    utc = overload_text({**d, "from_utc": "2025-02-01T00:01:40Z", "until_utc": "2025-02-01T00:04:59Z"})
    assert utc.startswith("OVERLOADED from 2025-02-01T00:01:40Z (+100 s) until 2025-02-01T00:04:59Z (+299 s): ")
    # the old rule looked only at the last arrival: no overload
    assert not _legacy(sorted_accepted(arrival, ok), sorted_accepted(scheduled, ok), 1001.01).detected


def test_a_short_peak_or_a_small_one_is_not_overload() -> None:
    arrival, scheduled = _peak_then_quiet()
    ok = np.ones(arrival.size, bool)
    # the same peak in a day ten times as long lasts under MIN_OVERLOAD_SHARE of the span
    longer = arrival.copy()
    longer[300:] = 300.0 + 140.0 * np.arange(71)
    later = np.concatenate([scheduled[:300], longer[300:] + 0.01])
    assert not detect_overload(longer, later, later + 1, ok).detected
    # a backlog under MIN_BACKLOG for as long is not either: 9 waiting from 100 s to 299 s
    slow = np.concatenate([np.arange(100.0), 100.0 + 199.0 * np.arange(9) / 8, 300.0 + 10.0 * np.arange(71)])
    held = np.concatenate([slow[:100] + 0.01, np.full(9, 299.0), slow[109:] + 0.01])
    assert not detect_overload(slow, held, held + 1, np.ones(slow.size, bool)).detected


def test_a_burst_that_drains_says_so_without_rates() -> None:
    # 50 arrive at once at 100 s and are admitted one every 3 s; quiet, served traffic around them
    arrival = np.concatenate([np.arange(100.0), np.full(50, 100.0), 300.0 + np.arange(700.0)])
    scheduled = np.concatenate([np.arange(100.0) + 0.01, 100.5 + 3.0 * np.arange(50), 300.01 + np.arange(700.0)])
    over = detect_overload(arrival, scheduled, scheduled + 1.0, np.ones(arrival.size, bool))
    assert over.detected and over.at_once and over.until_s == 100.5 + 3 * 49
    assert over.peak_backlog == 50 and over.service_rate == pytest.approx(50 / (3 * 49 + 0.5))
    assert over.to_dict()["excess"] is None
    assert "a burst arrives at once, 0.34 req/s served; up to 50 waiting, drained" in over.line()


# -- the sustained case: today's rule and numbers --------------------------------------------------


def _legacy(a: np.ndarray, s: np.ndarray, last_finish: float | None) -> Overload:
    """The earlier overload rule (the backlog at the last arrival only), kept as it was."""
    if a.size < 2:
        return Overload(False)
    t_first, t_last = float(a[0]), float(a[-1])
    k = int(np.searchsorted(s, t_last, side="right"))
    waiting = np.searchsorted(a, s[:k], side="right") - np.searchsorted(s, s[:k], side="right")
    empty = np.flatnonzero(waiting <= 0)
    onset = float(s[:k][empty[-1]]) if empty.size else t_first
    backlog = int(a.size - k)
    last = t_last if last_finish is None else last_finish
    span = t_last - t_first
    long_enough = span > 0 and (t_last - onset) >= MIN_OVERLOAD_SHARE * span
    if not (long_enough and backlog >= max(MIN_BACKLOG, MIN_BACKLOG_SHARE * a.size)):
        return Overload(False, drain_s=max(0.0, last - t_last))
    dur = t_last - onset
    arrived = int(np.searchsorted(a, t_last, side="right") - np.searchsorted(a, onset, side="right"))
    served = int(np.searchsorted(s, t_last, side="right") - np.searchsorted(s, onset, side="right"))
    return Overload(True, onset - t_first, backlog, arrived / dur, served / dur, max(0.0, last - t_last))


def _same_as_legacy(new: Overload, old: Overload) -> None:
    if old.detected:
        assert new.sustained
        got = (new.from_s, new.backlog, new.arrival_rate, new.service_rate, new.drain_s)
        assert got == (old.from_s, old.backlog, old.arrival_rate, old.service_rate, old.drain_s)
        assert new.line() == old.line() or old.service_rate == 0  # (0: the burst case, reworded)
    else:  # a drained episode, or nothing
        assert not new.sustained
        assert new.drain_s == old.drain_s


def test_the_sustained_case_is_todays() -> None:
    # tests/test_health.py's hand case: 1 req/s arrive, one admitted every 2 s from t = 0
    arrival = np.arange(200, dtype=float)
    served = 2.0 * np.arange(200, dtype=float)
    over = detect_overload(arrival, served, served + 1.0, np.ones(200, bool))
    assert over.sustained and over.until_s is None and over.episodes == 1
    assert over.line() == (
        "OVERLOADED from +0.00 ms: 1.00 req/s arrive, 0.50 req/s served (+101%); 100 waiting at the last "
        "arrival, 200 s to drain"
    )
    assert over.peak_backlog == 100 and over.peak_s == 199.0  # W grows to the last arrival
    _same_as_legacy(over, _legacy(arrival, served, float(served[-1] + 1.0)))
    # a summary written before drained episodes were told apart reads as it did
    old = {
        "detected": True,
        "from_s": 0.0,
        "from_utc": "2025-03-01T00:00:00Z",
        "backlog_requests": 100,
        "arrival_rate_per_s": 1.0,
        "service_rate_per_s": 0.5,
        "excess": 1.0,
        "drain_s": 200.0,
    }
    assert overload_text(old) == (
        "OVERLOADED from 2025-03-01T00:00:00Z (+0.00 ms): 1.00 req/s arrive, 0.50 req/s served (+100%); "
        "100 waiting at the last arrival, 200 s to drain"
    )
    card = next(c for c in _health_cards({"overload": old}) if c[0] == "Overload")
    note = "from 2025-03-01T00:00:00Z: arrivals exceed service by 100.0%; 100 waiting"
    assert card == ("Overload", "OVERLOADED", note, "bad")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 400), load=st.sampled_from([0.5, 0.9, 1.2, 3.0]))
def test_the_sustained_numbers_match_the_old_rule(seed: int, n: int, load: float) -> None:
    a, s, finish = _queue(np.random.default_rng(seed), n, load)
    ok = np.ones(n, bool)
    new = detect_overload(a, s, finish, ok)
    old = _legacy(sorted_accepted(a, ok), sorted_accepted(s, ok), latest_finish(finish, ok))
    if a[-1] - a[0] < MIN_SPAN_S:  # one burst: the old rule called it overload
        assert not new.detected
        return
    _same_as_legacy(new, old)


# -- the rule against a brute-force reference: W after every event ----------------------------------


def _queue(rng: np.random.Generator, n: int, load: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A FIFO server: arrivals in bursts and lulls, admissions max(arrival, previous + service)."""
    gaps = rng.exponential(1.0, n) * np.where(rng.random(n) < 0.2, 8.0, 0.3)
    arrival = np.cumsum(gaps) - gaps[0]
    service = rng.exponential(load * float(np.mean(gaps)), n)
    scheduled = np.empty(n)
    free = -np.inf
    for i in range(n):
        scheduled[i] = free = max(arrival[i], free + service[i])
    return arrival, scheduled, scheduled + 1.0


def _reference(arrival: np.ndarray, scheduled: np.ndarray, accepted: np.ndarray) -> dict[str, Any] | None:
    """The rule evaluated just after every arrival and admission time (None: no overload)."""
    a = np.sort(arrival[accepted])
    s = np.sort(np.where(np.isnan(scheduled), np.inf, scheduled)[accepted])
    if a.size < 2 or not a[-1] - a[0] >= MIN_SPAN_S:
        return None
    t_first, t_last = float(a[0]), float(a[-1])
    threshold = max(MIN_BACKLOG, MIN_BACKLOG_SHARE * a.size)
    least = MIN_OVERLOAD_SHARE * (t_last - t_first)
    times = np.unique(np.concatenate([a, s[np.isfinite(s)]]))
    w = np.searchsorted(a, times, side="right") - np.searchsorted(s, times, side="right")
    episodes = []  # (start, end, peak, first time at the peak): runs of W > 0 that end
    start = None
    for t, x in zip(times.tolist(), w.tolist(), strict=True):
        if x > 0 and start is None:
            start, peak, at = t, x, t
        elif x > 0 and x > peak:
            peak, at = x, t
        elif x <= 0 and start is not None:
            episodes.append((start, t, peak, at))
            start = None
    over = [e for e in episodes if e[1] - e[0] >= least and e[2] >= threshold]
    upto = times <= t_last
    zeros = times[upto & (w <= 0)]
    onset = float(zeros[-1]) if zeros.size else t_first
    backlog = int(w[times == t_last][0])
    if t_last - onset >= least and backlog >= threshold:
        inside = upto & ((times > onset) if zeros.size else (times >= t_first))
        peak = int(w[inside].max())
        return {
            "sustained": True,
            "from_s": onset - t_first,
            "backlog": backlog,
            "peak": peak,
            "peak_s": float(times[inside][w[inside] == peak][0]) - t_first,
            "episodes": 1 + sum(1 for e in over if e[1] <= t_last),
        }
    if not over:
        return None
    t0, end, peak, at = max(over, key=lambda e: e[2])
    grew = at - t0
    arrived = int(((a >= t0) & (a <= (at if grew else end))).sum())
    admitted = int(((s >= t0) & (s <= (at if grew else end))).sum())
    return {
        "sustained": False,
        "from_s": t0 - t_first,
        "until_s": end - t_first,
        "backlog": backlog,
        "peak": peak,
        "peak_s": at - t_first,
        "episodes": len(over),
        "arrival_rate": arrived / (grew or end - t0),
        "service_rate": admitted / (grew or end - t0),
    }


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 300),
    seed=st.integers(0, 2**32 - 1),
    load=st.sampled_from([0.3, 0.8, 1.1, 2.0]),
    ties=st.booleans(),
    lost=st.booleans(),
    chunk=st.sampled_from([1, 2, 7, 1 << 20]),
)
def test_overload_equals_the_every_event_reference(
    n: int, seed: int, load: float, ties: bool, lost: bool, chunk: int
) -> None:
    rng = np.random.default_rng(seed)
    arrival, scheduled, _ = _queue(rng, n, load)
    if ties:  # many requests arriving and admitted at the same instants
        arrival, scheduled = np.floor(arrival), np.ceil(scheduled)
    if lost:  # some never admitted (+inf), some rejected (not accepted)
        scheduled[rng.random(n) < 0.05] = np.nan
    accepted = rng.random(n) < (0.9 if lost else 1.0)
    finish = scheduled + 1.0
    over = detect_overload(arrival, scheduled, finish, accepted)
    a, s = sorted_accepted(arrival, accepted), sorted_accepted(scheduled, accepted)
    assert overload_of(a, s, latest_finish(finish, accepted), chunk) == over  # any chunk: one answer
    ref = _reference(arrival, scheduled, accepted)
    if ref is None:
        assert not over.detected
        return
    assert over.detected and over.sustained == ref["sustained"]
    got = {k: getattr(over, k) for k in ("from_s", "backlog", "peak_s", "episodes")}
    assert got == {k: ref[k] for k in got}
    assert over.peak_backlog == ref["peak"]
    if not ref["sustained"]:
        assert over.until_s == ref["until_s"]
        assert over.arrival_rate == pytest.approx(ref["arrival_rate"], rel=1e-12)
        assert over.service_rate == pytest.approx(ref["service_rate"], rel=1e-12)
        line = over.line()
        assert " until +" in line and f"up to {ref['peak']:,} waiting" in line and "inf" not in line


# -- a burst within a femtosecond ---------------------------------------------------------------


def test_a_femtosecond_burst_is_one_burst_as_offline() -> None:
    n = 2000
    served = 0.05 + 0.01 * np.arange(n)  # every one admitted, over 20 s
    ok = np.ones(n, bool)
    scaled = np.arange(n) * 1e-300  # --rate-scale 1e300
    assert _legacy(scaled, served, float(served[-1] + 1)).service_rate == 0.0  # was "nothing is served"
    for arrival in (scaled, np.zeros(n), np.linspace(0.0, 0.999 * MIN_SPAN_S, n)):  # …, --offline, < 1 ms
        over = detect_overload(arrival, served, served + 1.0, ok)
        assert not over.detected and over.line() == "no overload"
    # 2 ms of arrivals, none admitted before the last: overloaded, and it says what happened
    arrival = np.linspace(0.0, 2 * MIN_SPAN_S, n)
    over = detect_overload(arrival, served, served + 1.0, ok)
    assert over.sustained and over.service_rate == 0.0
    for text in (over.line(), overload_phrase(over.to_dict())):
        assert "none is admitted before the last arrival" in text and "nothing is served" not in text
    card = next(c for c in _health_cards({"overload": over.to_dict()}) if c[0] == "Overload")
    assert "none is admitted before the last arrival" in card[2]


# -- on a store: the replay, its health, the nightly's attention and the report's cards -------------


FLEET = """name = "{name}"
model = "{model}"
hardware = "h100-sxm"
router = "round_robin"
{shape}
[engine]
max_model_len = {context}
{engine}
"""


def _fleet(tmp: Path, name: str, model: str = "llama-3.1-8b", shape: str = "", engine: str = "") -> Path:
    """A fleet on h100-sxm (one replica unless ``shape`` says), with the model's whole context for
    Llama-3.1 (no length rejections) and 32k for the MoE model."""
    path = tmp / f"{name}.toml"
    context = 131072 if model == "llama-3.1-8b" else 32768
    path.write_text(FLEET.format(name=name, model=model, shape=shape, engine=engine, context=context))
    return path


@pytest.fixture(scope="module")
def peak_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A day of 300 requests: 260 in its first minute, then 40 over the next 19 minutes."""
    root = tmp_path_factory.mktemp("health-overload")
    day = generate(SynthConfig(requests=300, seed=11, duration_s=1200, date="2025-02-01", models=("llama-3.1-8b",)))
    t0 = day.get_column("arrival").min()
    rank = np.arange(day.height, dtype=float)
    offset = np.where(rank < 260, rank * 60.0 / 260, 60.0 + (rank - 259) * 1140.0 / 40)
    day = day.sort("arrival").with_columns(
        arrival=pl.lit(t0) + pl.Series(np.round(offset * 1e6).astype(np.int64)).cast(pl.Duration("us"))
    )
    write_logs(day, "openai", root / "day.jsonl")
    store = Store(root / "store")
    out = CliRunner().invoke(main, ["ingest", str(root / "day.jsonl"), "--store", str(store.root)])
    assert out.exit_code == 0, out.output
    return store


def test_a_replayed_peak_that_drains_is_unhealthy_everywhere(peak_store: Store, tmp_path: Path) -> None:
    peak_store = own_copy(peak_store, tmp_path)
    fleet = _fleet(tmp_path, "q", engine="max_num_seqs = 2")
    summary = replay(peak_store, fleet).summary
    h = summary["health"]
    over = h["overload"]
    assert over["detected"] and not over["sustained"] and over["backlog_requests"] < MIN_BACKLOG
    assert over["peak_backlog_requests"] >= 100 and over["until_s"] < over["arrival_span_s"]
    assert h["healthy"] is False
    (line,) = [w for w in h["warnings"] if w.startswith("OVERLOADED")]
    assert line.startswith("OVERLOADED from 2025-02-01T00:00:") and " until 2025-02-01T00:" in line
    assert f"up to {over['peak_backlog_requests']:,} waiting, drained " in line and "before the last arrival" in line
    assert line == overload_text(over)
    # the nightly's exit code and line, the report's banner and cards read the headline
    head = health_headline(summary)
    assert head["overloaded"] and "overloaded" in attention(head)
    assert overload_phrase(head["overload"]) == line
    card = next(c for c in _health_cards(head) if c[0] == "Overload")
    assert card[1] == "OVERLOADED" and card[3] == "bad" and " until 2025-02-01T00:" in card[2]
    # priced over the arrival span: the backlog drained before the last arrival, so the GPUs were
    # not needed past it, and the unit costs stand (the OVERLOADED warning comes with them)
    from pipeline.economics.cost import PERIOD_ARRIVALS, run_cost, run_period

    cost = run_cost(peak_store)
    assert cost.period is not None and cost.period.basis == PERIOD_ARRIVALS
    assert cost.period.overloaded and not cost.period.sustained and cost.period.unit_costs_valid
    assert cost.period.unit_costs_note is None and line in cost.warnings
    # the same arrays with the overload lasting to the last arrival: the makespan, not valid
    held = run_period(np.array([0.0, 10.0]), np.array([30.0]), np.zeros(1), np.zeros(1), np.array([30.0]), True)
    assert (held.basis, held.seconds, held.unit_costs_valid) == ("makespan", 30.0, False)
    drained = run_period(
        np.array([0.0, 10.0]), np.array([30.0]), np.zeros(1), np.zeros(1), np.array([5.0]), True, sustained=False
    )
    assert (drained.basis, drained.seconds, drained.unit_costs_valid) == (PERIOD_ARRIVALS, 10.0, True)
    # a fleet that keeps up with the peak: no overload, healthy
    big = _fleet(tmp_path, "big", shape="replicas = 8")
    fine = replay(peak_store, big).summary["health"]
    assert not fine["overload"]["detected"] and fine["healthy"] is True


def test_the_same_day_in_a_femtosecond_is_one_burst(peak_store: Store, tmp_path: Path) -> None:
    peak_store = own_copy(peak_store, tmp_path)
    fleet = _fleet(tmp_path, "q", engine="max_num_seqs = 2")
    for opts in (ReplayOptions(rate_scale=1e300), ReplayOptions(offline=True)):
        h = replay(peak_store, fleet, opts).summary["health"]
        assert not h["overload"]["detected"] and h["finished"] == 300 and h["healthy"] is True


# -- a replica wider than one node ------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "shape", "spans"),
    [
        ("qwen3-30b-a3b", "tp = 8\ndp = 2\nep = 16", "2 nodes (tp 8 × pp 1 × dp 2 = 16 h100-sxm GPUs, 8 per node)"),
        ("qwen3-30b-a3b", "dp = 16\nep = 16", "2 nodes (tp 1 × pp 1 × dp 16 = 16 h100-sxm GPUs, 8 per node)"),
        ("llama-3.1-8b", "tp = 8\npp = 2", "2 nodes (tp 8 × pp 2 × dp 1 = 16 h100-sxm GPUs, 8 per node)"),
        ("qwen3-30b-a3b", "tp = 2\ndp = 4\nep = 8", None),  # 8 GPUs: one node
        ("llama-3.1-8b", "dp = 16", None),  # a dense model's dp ranks share nothing
        ("llama-3.1-8b", "tp = 8", None),
    ],
)
def test_a_replica_across_nodes_is_said(tmp_path: Path, model: str, shape: str, spans: str | None) -> None:
    fleet = resolve(load_fleet(_fleet(tmp_path, "wide", model, shape)))
    line = multi_node_warning(fleet)
    if spans is None:
        assert line is None
        return
    assert line is not None and line.startswith(f"MULTI-NODE: each replica spans {spans}, but its cross-node ")
    assert line.endswith("is priced as within one nvlink4 node: latencies are optimistic")
    assert ("MoE expert dispatch" in line) == ("dp" in shape) and ("pipeline-parallel" in line) == ("pp" in shape)


def test_a_multi_node_replay_warns_and_flags_its_priced_by_card(peak_store: Store, tmp_path: Path) -> None:
    peak_store = own_copy(peak_store, tmp_path)
    fleet = _fleet(tmp_path, "moe", "qwen3-30b-a3b", "tp = 8\ndp = 2\nep = 16")
    summary = replay(peak_store, fleet, ReplayOptions(rate_scale=0.1)).summary
    h = summary["health"]
    (wide,) = [w for w in h["warnings"] if w.startswith("MULTI-NODE")]
    assert "each replica spans 2 nodes" in wide and h["healthy"] is False
    head = health_headline(summary)
    assert "replicas span nodes, priced as one (latencies optimistic)" in attention(head)
    first = _health_cards(head)[0]
    assert first[0] == "Priced by" and first[3] == "warn"
    assert "MULTI-NODE: each replica spans 2 nodes, its cross-node communication priced as intra-node" in first[2]
    assert not math.isnan(float(summary["cost_model"].get("measured_share_of_busy_time") or 0.0))


# -- a closed loop, and overload times under --rate-scale -------------------------------------------


def test_a_closed_loop_is_never_overloaded() -> None:
    # 30 clients on a fleet that serves fewer at once: requests wait, but arrivals follow service
    n = 200
    arrival = np.linspace(0.0, 100.0, n)
    scheduled = arrival + np.linspace(0.0, 60.0, n)  # the queue grows all the way
    res = EngineResult.empty(n)
    res.arrival_s[:] = arrival
    res.scheduled_s[:] = scheduled
    res.first_token_s[:] = scheduled + 0.1
    res.finish_s[:] = scheduled + 1.0
    res.reject_reason[:] = 0
    work = Workload(arrival, np.full(n, 100, np.int64), np.full(n, 10, np.int64))
    cols = MemoryColumns(res, work)
    assert health(cols, None)["overload"]["detected"]  # open loop: overloaded
    closed = health(cols, None, closed=True)
    assert not closed["overload"]["detected"] and closed["healthy"]


def test_overload_times_are_on_the_logs_clock_under_rate_scale() -> None:
    t0 = 1_700_000_000_000_000  # 2023-11-14T22:13:20Z
    assert _utc(t0, 0.0, 900.0) == "2023-11-14T22:28:20Z"
    # --rate-scale 2 replays the log twice as fast: 450 replayed seconds are 900 logged ones
    assert _utc(t0, 0.0, 450.0, 2.0) == "2023-11-14T22:28:20Z"
    assert _utc(t0, 0.0, 1800.0, 0.5) == "2023-11-14T22:28:20Z"
