"""The closed loop as benchmark clients run it (docs/engine.md, "Closed loop"): clients started
over a ramp reach the staggered steady state, think time between a client's requests, and
warm-up requests left out of the run's summary. Every figure is computed by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from test_engine import ENGINES, _assert_same, _cfg
from test_engine_support import LinearCost, workload

from pipeline.common.errors import ConfigError
from pipeline.common.schemas import conform, validate, write_parquet
from pipeline.engine.model import FleetSpec
from pipeline.engine.reference import simulate_reference
from pipeline.replay.fleet import parse_fleet, resolve
from pipeline.replay.run import ReplayOptions, check_warmup, requests_table, run_workload, summarize
from pipeline.replay.runrequests import StoredColumns

#: One step costs 1 s, plus 1/8 s per prefill token and 1/4 s per decoding sequence (every figure
#: below is a multiple of 1/4: exact in binary, so the asserts are equalities).
COST_A, COST_B, COST_D = 1.0, 0.125, 0.25
COST = LinearCost(a=COST_A, b=COST_B, c=0.0, d=COST_D, e=0.0)
C = 4  # clients
N = 16  # identical requests: 8 prompt tokens (one prefill costs 8 / 8 = 1 s), 4 output tokens
PROMPT, OUTPUT = 8, 4
#: TTFTs of the 16 requests with the clients started over 4.5 s (see the test's docstring).
RAMPED_TTFT = [2.0, 2.75, 3.75, 5.0] + [2.75] * 12
RAMPED_ARRIVAL = [0.0, 1.5, 3.0, 4.5] + [9.5 + 2.75 * k for k in range(12)]


def _identical() -> object:
    return workload([0.0] * N, [PROMPT] * N, [OUTPUT] * N)


def _spec(**kw: float) -> FleetSpec:
    return FleetSpec(replicas=1, scheduler=_cfg(), mode="closed", concurrency=C, **kw)  # type: ignore[arg-type]


def _every_engine(spec: FleetSpec, w: object = None) -> object:
    """The reference's result, after checking that both production engines equal it."""
    w = w if w is not None else _identical()
    ref = simulate_reference(w, spec, COST)  # type: ignore[arg-type]
    for sim in ENGINES.values():
        _assert_same(sim(w, spec, COST), ref)
    return ref


def test_a_ramp_reaches_the_staggered_steady_state() -> None:
    """C = 4 clients of identical requests (8 prompt tokens, 4 output tokens), client c starting
    at c · 4.5 / (4 − 1) = 1.5·c s. A step costs 1 + 0.125·prefill tokens + 0.25·decodes.

    Ramp: client 0's request 0 prefills alone, step [0, 2] (1 + 1): TTFT 2. Client 1 arrives at
    1.5 and waits for the next step: [2, 4.25] (its prefill + request 0's decode: 1 + 1 + 0.25),
    TTFT 4.25 − 1.5 = 2.75. Client 2 (at 3): [4.25, 6.75] (prefill + 2 decodes), TTFT 3.75.
    Client 3 (at 4.5): [6.75, 9.5] (prefill + 3 decodes), TTFT 5. Request 0 has then sampled its
    4 tokens (steps 1 to 4) and client 0 sends request 4 at 9.5, the start of the next step.

    Steady state: every step holds one request's prefill and the other three's decodes,
    1 + 1 + 3·0.25 = 2.75 s, and each request arrives when its client's previous one finished,
    at a step's start: TTFT = one prefill plus three decodes' interference = 2.75 s, arrivals
    2.75 s apart, e2e 4 steps = 11 s. (Lockstep, below, gives every request 5 s.)"""
    res = _every_engine(_spec(ramp_s=4.5))
    ttft = res.first_token_s - res.arrival_s  # type: ignore[attr-defined]
    np.testing.assert_array_equal(res.arrival_s, RAMPED_ARRIVAL)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(ttft, RAMPED_TTFT)
    e2e = res.finish_s - res.arrival_s  # type: ignore[attr-defined]
    # requests 4 to 12: 4 steps of 2.75 s (request 13 on: the trace runs out, no newcomer's
    # prefill in their last steps)
    np.testing.assert_array_equal(e2e[4:13], [11.0] * 9)
    # the 1 prefill + 3 decodes of the staggered state, against C prefills in lockstep
    assert ttft[-1] == COST_A + PROMPT * COST_B + (C - 1) * COST_D


def test_without_a_ramp_the_clients_stay_in_lockstep() -> None:
    """The same clients all at t = 0 (no ramp), as before: every wave of 4 prefills in one step,
    1 + 4·1 = 5 s (TTFT = C prefills), then 3 decode steps of 4 sequences, 1 + 4·0.25 = 2 s each:
    the wave finishes at 11 s, and its 4 clients send the next wave together, for ever."""
    res = _every_engine(_spec())
    np.testing.assert_array_equal(res.arrival_s, np.repeat([0.0, 11.0, 22.0, 33.0], C))  # type: ignore[attr-defined]
    ttft = res.first_token_s - res.arrival_s  # type: ignore[attr-defined]
    np.testing.assert_array_equal(ttft, [COST_A + C * PROMPT * COST_B] * N)
    np.testing.assert_array_equal(res.finish_s, np.repeat([11.0, 22.0, 33.0, 44.0], C))  # type: ignore[attr-defined]


def test_think_time_delays_the_next_request_by_exactly_t() -> None:
    """One client, think time 0.5 s; a step costs 1 s (a = 1 only), 4 prompt and 2 output tokens:
    a request takes 2 steps. Request 0: [0, 2]; the client sends request 1 at 2.5, which is
    rejected at once (5,000 tokens exceed max_model_len, 4,096): request 2 goes out 0.5 s later, at 3,
    and finishes at 5; request 3 at 5.5, finishes at 7.5."""
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)
    w = workload([0.0] * 4, [4, 5000, 4, 4], [2] * 4)
    spec = FleetSpec(replicas=1, scheduler=_cfg(), mode="closed", concurrency=1, think_s=0.5)
    ref = simulate_reference(w, spec, cost)
    for sim in ENGINES.values():
        _assert_same(sim(w, spec, cost), ref)
    np.testing.assert_array_equal(ref.arrival_s, [0.0, 2.5, 3.0, 5.5])
    np.testing.assert_array_equal(ref.finish_s[[0, 2, 3]], [2.0, 5.0, 7.5])
    assert ref.reject_reason[1] != 0
    # think time on a busy replica too: two clients, the same arithmetic per client
    spec2 = FleetSpec(replicas=1, scheduler=_cfg(), mode="closed", concurrency=2, think_s=0.5)
    w2 = workload([0.0] * 6, [4] * 6, [2] * 6)
    ref2 = simulate_reference(w2, spec2, cost)
    for sim in ENGINES.values():
        _assert_same(sim(w2, spec2, cost), ref2)
    np.testing.assert_array_equal(ref2.arrival_s, [0.0, 0.0, 2.5, 2.5, 5.0, 5.0])
    np.testing.assert_array_equal(ref2.arrival_s[2:] - ref2.finish_s[:4], [0.5] * 4)


def test_requests_go_out_in_the_trace_order_whoever_sends_them() -> None:
    """With a ramp the first client may come back before the last one starts: the request it
    sends is the trace's next, so the arrivals are in request order (2 clients, ramp 3 s, think
    0.25 s, 1 s steps, 2-token outputs: request 0 ends at 2, request 1 goes out at 2.25, before
    client 1's first at 3)."""
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)
    w = workload([0.0] * 6, [4] * 6, [2] * 6)
    spec = FleetSpec(replicas=1, scheduler=_cfg(), mode="closed", concurrency=2, ramp_s=3.0, think_s=0.25)
    ref = simulate_reference(w, spec, cost)
    for sim in ENGINES.values():
        _assert_same(sim(w, spec, cost), ref)
    np.testing.assert_array_equal(ref.arrival_s, [0.0, 2.25, 3.0, 4.5, 5.5, 7.5])
    assert np.all(np.diff(ref.arrival_s) >= 0)


def test_engine_spec_refuses_bad_client_options() -> None:
    for kw in ({"ramp_s": -1.0}, {"think_s": float("nan")}, {"ramp_s": float("inf")}):
        with pytest.raises(ConfigError, match=next(iter(kw))):
            _spec(**kw)
    with pytest.raises(ConfigError, match="closed loop only"):
        FleetSpec(replicas=1, scheduler=_cfg(), think_s=1.0)


# -- the replay stage: options, warm-up, the requests table ----------------------------------


def _fleet() -> object:
    # the schedule above is hand-computed for the synchronous timeline (vLLM's default before 0.14;
    # asynchronous scheduling's one-step lag is checked by hand in tests/test_engine.py)
    cfg = parse_fleet(
        {
            "name": "t",
            "model": "llama-3.1-8b",
            "hardware": "h100-sxm",
            "replicas": 1,
            "engine": {"async_scheduling": False},
        },
        "t",
    )
    return resolve(cfg)


def _work() -> object:
    from pipeline.engine.model import Workload

    return Workload(np.zeros(N), np.full(N, PROMPT, np.int64), np.full(N, OUTPUT, np.int64))


def test_warmup_leaves_the_first_requests_out_of_the_summary(tmp_path: Path) -> None:
    """The ramped run above through the replay stage (the fleet's scheduler has room for all 4):
    every request's TTFT as hand-computed. Without warm-up the summary's mean TTFT is
    (2 + 2.75 + 3.75 + 5 + 12·2.75) / 16 = 46.5 / 16 = 2.90625 s and p99 is 5 s (the nearest
    rank's); with --warmup 4 the 4 ramp requests are left out: 12 requests, every TTFT 2.75 s,
    so mean, p50 and p99 are all 2.75, and the SLO ttft_p99 = 3 s that failed now passes."""
    from pipeline.replay.slo import parse_slo

    fleet = _fleet()
    slo = parse_slo("ttft_p99=3s")
    base = run_workload(_work(), fleet, ReplayOptions(concurrency=C, ramp_s=4.5), cost=COST)  # type: ignore[arg-type]
    warm = run_workload(_work(), fleet, ReplayOptions(concurrency=C, ramp_s=4.5, warmup=4), cost=COST)  # type: ignore[arg-type]
    for run in (base, warm):  # the warm-up changes no result, only what is summarized
        np.testing.assert_array_equal(run.result.first_token_s - run.result.arrival_s, RAMPED_TTFT)
    s0, s1 = summarize(base, slo), summarize(warm, slo)
    assert s0["requests"] == 16 and "warmup_requests" not in s0
    assert s0["ttft_s"]["mean"] == 46.5 / 16 and s0["ttft_s"]["p99"] == 5.0
    assert s0["health"]["verdict"]["passed"] is False
    assert s1["requests"] == 12 and s1["finished"] == 12 and s1["warmup_requests"] == 4
    assert s1["ttft_s"]["mean"] == 2.75 and s1["ttft_s"]["p50"] == 2.75 and s1["ttft_s"]["p99"] == 2.75
    assert s1["health"]["verdict"]["passed"] is True
    assert "4 sent, replayed as warm-up" in s1["health"]["latency_covers"]
    # makespan: from the first measured arrival (9.5) to the last finish (the same as the base's)
    assert s1["makespan_s"] == s0["makespan_s"] - 9.5
    # the requests table says which rows were warm-up, and its summary is the same
    ids = pl.DataFrame({"request_id": [f"r{i}" for i in range(N)]})
    table = conform(requests_table(ids, warm, 0), "replay_requests")
    validate(table, "replay_requests")
    assert table.column("warmup").to_pylist() == [True] * 4 + [False] * 12
    assert requests_table(ids, base, 0).column("warmup").to_pylist() == [False] * N
    path = write_parquet(table, tmp_path / "requests.parquet", "replay_requests")
    from pipeline.replay.run import summary_of

    stored = summary_of(StoredColumns(path), warm.step_sums(), warm, slo)
    assert {k: v for k, v in stored.items() if not k.startswith("engine_")} == {
        k: v for k, v in s1.items() if not k.startswith("engine_")
    }


def test_replay_options_refuse_bad_values_in_one_line() -> None:
    bad: list[tuple[dict[str, object], str]] = [
        ({"concurrency": 2, "ramp_s": -1.0}, "--ramp-s"),
        ({"concurrency": 2, "ramp_s": float("nan")}, "--ramp-s"),
        ({"concurrency": 2, "think_s": float("inf")}, "--think-s"),
        ({"concurrency": 2, "think_s": 1e12}, "--think-s"),
        ({"concurrency": 2, "warmup": -3}, "--warmup"),
        ({"concurrency": 2, "warmup": 10**30}, "--warmup"),
        ({"ramp_s": 5.0}, "--ramp-s needs --concurrency"),
        ({"think_s": 1.0}, "--think-s needs --concurrency"),
        ({"warmup": 10}, "--warmup needs --concurrency"),
        ({"offline": True, "warmup": 10}, "--warmup needs --concurrency"),
    ]
    for kw, says in bad:
        with pytest.raises(ConfigError, match=says) as info:
            ReplayOptions(**kw)  # type: ignore[arg-type]
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="--warmup 16 leaves no request to measure: the replay has 16"):
        check_warmup(ReplayOptions(concurrency=2, warmup=16), 16)
    check_warmup(ReplayOptions(concurrency=2, warmup=15), 16)
    with pytest.raises(ConfigError, match="--warmup 20"):
        run_workload(_work(), _fleet(), ReplayOptions(concurrency=2, warmup=20), cost=COST)  # type: ignore[arg-type]
    assert ReplayOptions(concurrency=2, ramp_s=1) == ReplayOptions(concurrency=2, ramp_s=1.0)
