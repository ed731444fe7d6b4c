"""Failures first: rejected and preempted requests, overload and the SLO verdict are shown in
every summary (replay, nightly line, headline.json, report cards, plan), never only in JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.engine.model import EngineResult, Workload
from pipeline.ingest.store import Store
from pipeline.plan import PlanOptions, plan
from pipeline.publish.nightly import nightly
from pipeline.replay.slo import (
    MIN_BACKLOG,
    MIN_BACKLOG_SHARE,
    MIN_OVERLOAD_SHARE,
    MIN_SPAN_S,
    day_projection,
    detect_overload,
    failure_counts,
    latest_finish,
    overload_of,
    parse_slo,
    slo_verdict,
    sorted_accepted,
)
from pipeline.synth import SynthConfig, generate, write_logs

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"


# -- the verdict, by hand ------------------------------------------------------------------------


def test_verdict_counts_rejected_requests_as_misses() -> None:
    # 10 requests: TTFT 0.1 .. 1.0 s; request 9 rejected. p80 over all 10 (rejected = +inf):
    # the 8th smallest value = 0.8 s. Goodput at ttft <= 0.5 s: requests 0..4 = 5 of 10.
    ttft = np.arange(1, 11) / 10.0
    rejected = np.zeros(10, bool)
    rejected[9] = True
    slo = parse_slo("ttft_p80=0.75s")
    v = slo_verdict({"ttft": ttft}, rejected, slo)
    assert v.targets[0].value_s == pytest.approx(0.8) and not v.passed
    assert slo_verdict({"ttft": ttft}, rejected, parse_slo("ttft_p80=0.8s")).passed
    assert slo_verdict({"ttft": ttft}, rejected, parse_slo("ttft_p50=0.5s")).goodput == pytest.approx(0.5)
    # p95 needs 95 % of all requests: the rejected one is the 10th of 10 -> never
    v95 = slo_verdict({"ttft": ttft}, rejected, parse_slo("ttft_p95=100s"))
    assert v95.targets[0].value_s == np.inf and not v95.passed
    assert "ttft_p95 over all requests infinite > 100 s (1 of 10 requests" in v95.line()


def test_failure_counts() -> None:
    res = EngineResult.empty(5)
    res.reject_reason[:] = [0, 1, 2, 0, 1]
    res.finish_s[[0, 3]] = 1.0
    res.preemptions[3] = 2
    c = failure_counts(res.reject_reason, res.finish_s, res.preemptions)
    assert (c["finished"], c["rejected"], c["preempted_requests"], c["preemptions"]) == (2, 3, 1, 2)
    assert c["rejected_by_reason"] == {"exceeds_max_model_len": 2, "exceeds_kv_capacity": 1}


def test_overload_detection_by_hand() -> None:
    # 200 requests arrive at 1/s; a server admitting one every 2 s falls behind from the start.
    arrival = np.arange(200, dtype=float)
    served = 2.0 * np.arange(200, dtype=float)
    finish = served + 1.0
    ok = np.ones(200, bool)
    over = detect_overload(arrival, served, finish, ok)
    assert over.detected
    assert over.from_s == 0.0
    # from t=0 to the last arrival (199 s): 199 arrivals after t=0, 99 admissions (t = 2 .. 198)
    assert over.arrival_rate == pytest.approx(199 / 199) and over.service_rate == pytest.approx(99 / 199)
    assert over.excess == pytest.approx(199 / 99 - 1)
    assert over.backlog == 200 - 100  # admitted by t=199: t = 0, 2, ..., 198
    assert over.drain_s == pytest.approx(2 * 199 + 1 - 199)
    # served on arrival: never overloaded; a burst at the end: not overload either (too short)
    assert not detect_overload(arrival, arrival + 0.01, arrival + 1, ok).detected
    late = arrival.copy()
    late[190:] = 189.5  # ten requests at once at the very end, served 1 s apart
    burst = np.where(np.arange(200) < 190, late, 189.5 + np.arange(200) - 189)
    assert not detect_overload(late, burst, burst + 1, ok).detected


def _overload_reference(arrival: np.ndarray, scheduled: np.ndarray, accepted: np.ndarray) -> tuple[float, int]:
    """(onset, backlog) with W evaluated just after every event time up to the last arrival."""
    a = np.sort(arrival[accepted])
    s = np.sort(np.where(np.isnan(scheduled[accepted]), np.inf, scheduled[accepted]))
    times = np.unique(np.concatenate([a, s[s <= a[-1]]]))
    waiting = np.searchsorted(a, times, side="right") - np.searchsorted(s, times, side="right")
    empty = times[waiting <= 0]
    return (float(empty[-1]) if empty.size else float(a[0])), int(waiting[-1])


@settings(deadline=None)  # (chunk 1 evaluates W an admission at a time: tens of ms on a busy machine)
@given(
    n=st.integers(2, 300),
    seed=st.integers(0, 2**32 - 1),
    delay=st.sampled_from([0.0, 0.3, 2.0, 9.0]),
    ties=st.booleans(),
    chunk=st.sampled_from([1, 2, 7, 1 << 20]),
)
def test_overload_onset_and_backlog_equal_the_every_event_definition(n: int, seed: int, delay: float,
                                                                     ties: bool, chunk: int) -> None:  # fmt: skip
    """W is evaluated only just after admissions (it can reach 0 only there): the onset and the
    backlog are those of W evaluated after every arrival and admission, ties, never-admitted
    and rejected requests included."""
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 20, n))
    if ties:
        arrival = np.round(arrival)
    scheduled = arrival + rng.exponential(delay, n) * (rng.random(n) < 0.8)
    if ties:
        scheduled = np.round(scheduled + 0.49)
    scheduled[rng.random(n) < 0.1] = np.nan  # never admitted
    accepted = rng.random(n) < 0.9
    if accepted.sum() < 2:
        return
    over = detect_overload(arrival, scheduled, scheduled + 1.0, accepted)
    # the backlog looked at a chunk of admissions at a time: the same answer for any chunk
    a, s = sorted_accepted(arrival, accepted), sorted_accepted(scheduled, accepted)
    assert overload_of(a, s, latest_finish(scheduled + 1.0, accepted), chunk) == over
    onset, backlog = _overload_reference(arrival, scheduled, accepted)
    first = float(np.min(arrival[accepted]))
    assert over.backlog == backlog or not over.detected
    if over.sustained:
        assert (over.from_s, over.backlog) == (onset - first, backlog)
    else:  # not sustained (no overload, or one that drained: tests/test_health_overload.py): the
        # same backlog/onset would not have made it overload either
        span = float(np.max(arrival[accepted])) - first
        long_enough = span >= MIN_SPAN_S and (float(np.max(arrival[accepted])) - onset) >= MIN_OVERLOAD_SHARE * span
        assert not (long_enough and backlog >= max(MIN_BACKLOG, MIN_BACKLOG_SHARE * accepted.sum()))


# -- every summary shows rejections -------------------------------------------------------------


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("health-logs")
    # one model, the fleets' own: a day of two models replayed on one is a warning of its own
    day = generate(SynthConfig(requests=200, seed=5, duration_s=600, date="2025-03-01", models=("llama-3.1-8b",)))
    write_logs(day, "anthropic", root / "a.jsonl")
    return root


def _short_fleet(tmp: Path, max_len: int) -> Path:
    text = FLEET.read_text()
    assert "max_model_len = 16384" in text
    path = tmp / "short.toml"
    text = text.replace("max_model_len = 16384", f"max_model_len = {max_len}")
    path.write_text(text.replace("[engine]", '[slo]\npreset = "chat"\n\n[engine]'))
    return path


def _long_fleet(tmp: Path) -> Path:
    """The default fleet with Llama-3.1's whole 128k context: no length rejections here."""
    path = tmp / "long.toml"
    path.write_text(FLEET.read_text().replace("max_model_len = 16384", "max_model_len = 131072"))
    return path


def test_length_rejections_reach_the_nightly_line_headline_report_and_plan(logs: Path, tmp_path: Path) -> None:
    fleet = _short_fleet(tmp_path, 8192)
    store = Store(tmp_path / "store")
    res = nightly([logs], fleet, store, reports_dir=tmp_path / "reports")
    h = res.headline
    assert h["rejected"] > 0 and h["rejected_by_reason"] == {"exceeds_max_model_len": h["rejected"]}
    assert h["finished"] + h["rejected"] == h["replayed_requests"] == 200
    line = res.line()
    assert f"{h['rejected']:,} rejected (exceeds_max_model_len {h['rejected']:,})" in line
    assert "SLO chat: FAIL" in line  # rejections miss every target: p99 over all requests fails
    head = json.loads((tmp_path / "reports" / "2025-03-01" / "default" / "headline.json").read_text())
    assert head["rejected"] == h["rejected"] and head["slo_passed"] is False
    assert head["warnings"] and head["warnings"][0].startswith("200 requests:")
    page = res.report.read_text()
    assert "This run has failures" in page
    assert f"rejected {h['rejected']:,} (exceeds_max_model_len {h['rejected']:,})" in page
    assert "p99 TTFT (finished requests)" in page
    # plan refuses to call any configuration SLO-meeting while it rejects requests
    opts = PlanOptions(
        model="llama-3.1-8b",
        slo="chat",
        fleet_path=str(fleet),
        hardware=("h100-sxm",),
        tp=(1,),
        traffic_model="*",
        window="day",
        jobs=1,
    )
    result = plan(store, opts)
    assert result.doc["chosen"] is None
    (row,) = result.doc["configurations"]
    assert not row["meets_slo"] and "exceeds_max_model_len" in row["note"] and "--max-rejected" in row["note"]
    # the CLI says why and exits 1
    cli = CliRunner().invoke(
        main,
        [
            "plan",
            "--model",
            "llama-3.1-8b",
            "--traffic-model",
            "*",
            "--fleet",
            str(fleet),
            "--hardware",
            "h100-sxm",
            "--tp",
            "1",
            "--window",
            "day",
            "--jobs",
            "1",
            "--store",
            str(store.root),
        ],
    )
    assert cli.exit_code == 1 and "no configuration meets the SLO" in cli.output


def test_overloaded_replay_fails_its_verdict_and_warns(logs: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    runner = CliRunner()
    assert runner.invoke(main, ["ingest", str(logs), "--store", str(store.root)]).exit_code == 0
    small = tmp_path / "small.toml"
    small.write_text(
        'name = "small"\nmodel = "llama-3.1-8b"\nhardware = "l40s"\nreplicas = 1\n'
        "[engine]\nmax_num_seqs = 4\nmax_model_len = 16384\n"
    )
    out = runner.invoke(
        main, ["replay", "--fleet", str(small), "--store", str(store.root), "--rate-scale", "20", "--slo", "chat"]
    )
    assert out.exit_code == 0, out.output
    assert "warning: OVERLOADED from 2025-03-01T" in out.output
    assert "warning: SLO chat: FAIL" in out.output
    js = runner.invoke(
        main,
        ["replay", "--fleet", str(small), "--store", str(store.root), "--rate-scale", "20", "--slo", "chat", "--json"],
    )
    doc = json.loads(js.stdout)
    health = doc["health"]
    assert health["overload"]["detected"] and health["overload"]["excess"] > 0.5
    assert health["verdict"]["passed"] is False and not health["healthy"]
    # a healthy replay says so
    long = _long_fleet(tmp_path)
    ok = runner.invoke(main, ["replay", "--fleet", str(long), "--store", str(store.root), "--slo", "chat", "--json"])
    assert json.loads(ok.stdout)["health"]["healthy"] is True
    assert "warning:" not in ok.stderr


# -- one period ---------------------------------------------------------------------------------


def test_plan_and_cost_state_the_same_figures_for_the_same_traffic_and_fleet(logs: Path, tmp_path: Path) -> None:
    from pipeline.economics.cost import run_cost
    from pipeline.replay.run import ReplayOptions, replay

    store = Store(tmp_path / "store")
    runner = CliRunner()
    assert runner.invoke(main, ["ingest", str(logs), "--store", str(store.root)]).exit_code == 0
    fleet = _long_fleet(tmp_path)
    opts = PlanOptions(
        model="llama-3.1-8b",
        slo="chat",
        fleet_path=str(fleet),
        hardware=("h100-sxm",),
        tp=(1,),
        traffic_model="*",
        window="day",
        jobs=1,
    )
    doc = plan(store, opts).doc
    chosen = doc["chosen"]
    assert chosen is not None and chosen["config"] == "h100-sxm tp1 bf16"
    # the same fleet replayed on the same traffic, then `cost`
    run = replay(store, fleet, ReplayOptions(replicas=chosen["replicas"]))
    cost = run_cost(store, run.run_id).to_dict()
    assert cost["period_s"] == pytest.approx(doc["period_s"], rel=1e-9)
    assert cost["period"] == doc["period"] and "of traffic" in cost["period"]
    assert cost["total_usd"] == pytest.approx(chosen["usd_per_period"], rel=1e-9)
    plan_api = {(a["provider"], a["api_model"]): a for a in doc["api_equivalent"]}
    assert plan_api
    for a in cost["api_equivalent"]:
        p = plan_api[(a["provider"], a["api_model"])]
        assert a["api_usd"] == pytest.approx(p["api_usd"], rel=1e-9)
        assert a["self_host_usd"] == pytest.approx(p["self_host_usd"], rel=1e-9)
        assert a["self_host_to_api_ratio"] == pytest.approx(p["self_host_to_api_ratio"], rel=1e-9)
    # a per-day figure is a named projection of the period's
    assert cost["day_projection"] == day_projection(cost["period_s"])
    assert cost["day_projection"].startswith(cost["period"])


def test_plan_says_why_nothing_fits_or_meets_and_exits_1(logs: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    runner = CliRunner()
    assert runner.invoke(main, ["ingest", str(logs), "--store", str(store.root)]).exit_code == 0
    base = ["plan", "--traffic-model", "*", "--tp", "1", "--jobs", "1", "--store", str(store.root)]
    # nothing fits: the reason per configuration, no schema error
    nofit = runner.invoke(main, [*base, "--model", "llama-3.1-405b", "--hardware", "l40s"])
    assert nofit.exit_code == 1, nofit.output
    assert "cannot hold one" in nofit.output and "no configuration meets the SLO" in nofit.output
    assert "Traceback" not in nofit.output and "schema" not in nofit.output
    # an impossible SLO: exit 1, the failing target named
    fleet = _long_fleet(tmp_path)
    hard = runner.invoke(
        main,
        [*base, "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--fleet", str(fleet), "--slo", "ttft_p99=1ms",
         "--max-replicas", "4", "--window", "day"],
    )  # fmt: skip
    assert hard.exit_code == 1, hard.output
    assert "ttft_p99" in hard.output and "no configuration meets the SLO" in hard.output


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 5000)), min_size=1, max_size=40),
    st.integers(1, 64),
    st.integers(1, 300),
    st.integers(2, 9000),
)
def test_reject_reasons_match_the_block_count_definition(
    lengths: list[tuple[int, int]], block_size: int, blocks: int, max_model_len: int
) -> None:
    """A request is refused past max_model_len, else when its KV (prompt + output − 1 tokens)
    needs more blocks than the cache has: counted here block by block, as the definition says."""
    from pipeline.engine.model import REJECT_KV_CAPACITY, REJECT_MAX_MODEL_LEN, SchedulerConfig, reject_reasons

    prompt = np.array([p for p, _ in lengths], np.int64)
    output = np.array([o for _, o in lengths], np.int64)
    cfg = SchedulerConfig(num_gpu_blocks=blocks, max_model_len=max_model_len, block_size=block_size)
    got = reject_reasons(Workload(np.zeros(prompt.shape[0]), prompt, output), cfg)
    for k, (p, o) in enumerate(lengths):
        need = -(-(p + o - 1) // block_size)
        want = REJECT_MAX_MODEL_LEN if p + o > max_model_len else REJECT_KV_CAPACITY if need > blocks else 0
        assert got[k] == want
