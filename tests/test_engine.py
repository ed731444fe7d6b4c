"""The replay engine: hand-computed schedules (the compiled engine and the reference alike), the
compiled engine == the reference on generated traces and fleets, and the scheduler invariants."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine_support import LinearCost, workload

from pipeline.common.errors import ConfigError
from pipeline.costmodel.stackcal import TIMELINE_KEY
from pipeline.engine.jit import simulate_jit
from pipeline.engine.model import (
    REJECT_KV_CAPACITY,
    REJECT_MAX_MODEL_LEN,
    EngineResult,
    FleetSpec,
    SchedulerConfig,
    Speculation,
    Workload,
    apply_frontend,
    choose_replica,
    concurrent_streams,
    reject_reasons,
    tokens_per_verification,
)
from pipeline.engine.reference import simulate_reference
from pipeline.engine.steplog import StepLog

Engine = Callable[..., EngineResult]


def _reference(
    work: Workload, spec: FleetSpec, cost: LinearCost, log: StepLog | None = None, progress: object = None
) -> EngineResult:
    """The reference engine called as the production one is (it writes no step log)."""
    return simulate_reference(work, spec, cost)


#: The engines the hand-computed schedules check: the production engine (pipeline/engine/jit.py)
#: and the oracle every other test holds it equal to (pipeline/engine/reference.py).
ENGINES: dict[str, Engine] = {"jit": simulate_jit, "reference": _reference}


def _cfg(**kw: int | bool) -> SchedulerConfig:
    base: dict[str, int | bool] = {
        "num_gpu_blocks": 1000,
        "max_model_len": 4096,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "block_size": 4,
    }
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


def _assert_same(fast: EngineResult, ref: EngineResult) -> None:
    for name in ("first_token_s", "finish_s"):
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=1e-9, atol=0)
    for name in ("arrival_s", "scheduled_s", "max_itl_s"):
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=1e-9, atol=1e-12)
    for name in ("replica", "preemptions", "cache_hit_tokens", "prefill_tokens", "reject_reason"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=name)


# -- hand-computed ------------------------------------------------------------------------------


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_single_request_matches_hand_calculation(sim: Engine) -> None:
    # One request, prompt 10, output 3, budget 256: one prefill step then two decode steps.
    cost = LinearCost(a=0.01, b=0.001, c=0.0, d=0.002, e=0.0001)
    w = workload([1.0], [10], [3])
    spec = FleetSpec(replicas=1, scheduler=_cfg())
    res = sim(w, spec, cost)
    prefill = 0.01 + 0.001 * 10
    dec1 = 0.01 + 0.002 + 0.0001 * 11  # context 10 cached + the new token
    dec2 = 0.01 + 0.002 + 0.0001 * 12
    assert res.scheduled_s[0] == 1.0
    assert res.first_token_s[0] == pytest.approx(1.0 + prefill, rel=1e-12)
    assert res.finish_s[0] == pytest.approx(1.0 + prefill + dec1 + dec2, rel=1e-12)
    assert res.max_itl_s[0] == pytest.approx(dec2, rel=1e-9)
    assert res.prefill_tokens[0] == 10
    _assert_same(res, simulate_reference(w, spec, cost))


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
@pytest.mark.parametrize("asy", [False, True], ids=["sync", "async"])
def test_async_scheduling_admits_one_step_later_on_a_busy_replica(sim: Engine, asy: bool) -> None:
    # Every step takes 0.125 s (exact in binary). A decodes from t = 0 (steps start at 0, .125,
    # .25, .375, .5, ...). B arrives at 0.3, inside the step that starts at .25; C exactly at .25;
    # D at 10, when the replica is idle again. Synchronous: a step sees every arrival up to its
    # start. Asynchronous: the step that starts at .375 was scheduled at .25, so it sees C (at
    # .25) but not B; B gets in one step later; D, on an idle replica, at once.
    cost = LinearCost(a=0.125, b=0.0, c=0.0, d=0.0, e=0.0)
    w = workload([0.0, 0.25, 0.3, 10.0], [4, 4, 4, 4], [20, 3, 3, 3])
    spec = FleetSpec(replicas=1, scheduler=_cfg(async_scheduling=asy))
    res = sim(w, spec, cost)
    sched = [0.0, 0.375, 0.5, 10.0] if asy else [0.0, 0.25, 0.375, 10.0]
    np.testing.assert_array_equal(res.scheduled_s, sched)
    np.testing.assert_array_equal(res.first_token_s, np.array(sched) + 0.125)
    assert res.finish_s[0] == 2.5  # A's 20 steps, never delayed
    _assert_same(res, simulate_reference(w, spec, cost))


def test_frontend_by_hand() -> None:
    # Two requests on replica 0 (A: tokens at 1.0 .. 2.0, 11 outputs; B: first at 1.5, 3 outputs,
    # done at 1.7), one on replica 1. Streams open at A's first token: A alone (1); at B's: A and
    # B (2); C: 1. R = 0.05 s, c = 0.08 s per token per stream: A's TPOT 0.1 stays (0.08 < 0.1),
    # B's TPOT 0.1 becomes 0.16 (2 streams × 0.08), C's single output has no TPOT.
    res = EngineResult.empty(3)
    res.replica[:] = [0, 0, 1]
    res.arrival_s[:] = [0.5, 1.0, 0.0]
    res.first_token_s[:] = [1.0, 1.5, 3.0]
    res.finish_s[:] = [2.0, 1.7, 3.0]
    res.max_itl_s[:] = [0.1, 0.1, np.nan]
    out = np.array([11, 3, 1])
    np.testing.assert_array_equal(concurrent_streams(res), [1, 2, 1])
    spec = FleetSpec(replicas=2, scheduler=_cfg(), frontend_request_s=0.05, frontend_token_s=0.08)
    apply_frontend(res, out, spec)
    np.testing.assert_allclose(res.first_token_s, [1.0 + 0.05 + 0.08, 1.5 + 0.05 + 0.16, 3.0 + 0.05 + 0.08])
    np.testing.assert_allclose(res.finish_s, [2.0 + 0.13, 1.7 + 0.21 + 2 * (0.16 - 0.1), 3.0 + 0.13])
    np.testing.assert_allclose((res.finish_s[1] - res.first_token_s[1]) / 2, 0.16)
    np.testing.assert_allclose(res.max_itl_s[:2], [0.1, 0.16])
    assert np.isnan(res.max_itl_s[2])
    np.testing.assert_array_equal(res.arrival_s, [0.5, 1.0, 0.0])  # the engine's, unchanged
    with pytest.raises(ConfigError, match="frontend_token_s"):
        FleetSpec(replicas=1, scheduler=_cfg(), frontend_token_s=-1.0)


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_chunked_prefill_rides_along_decodes_in_v1_order(sim: Engine) -> None:
    # Budget 8: request A (prompt 4) is decoding when B (prompt 20) arrives; each step A takes
    # one token first (running requests first), B the 7 left: chunks 7, 7, 6.
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)  # every step lasts exactly 1 s
    w = workload([0.0, 0.5], [4, 20], [10, 2])
    spec = FleetSpec(replicas=1, scheduler=_cfg(max_num_batched_tokens=8, max_num_seqs=8))
    log = StepLog()
    res = sim(w, spec, cost, log)
    # Step 0 [0,1): A's prefill → A's first token at 1. B arrives at 0.5, scheduled at 1.
    assert res.first_token_s[0] == 1.0
    assert res.scheduled_s[1] == 1.0
    # B's chunks run in steps [1,2), [2,3), [3,4) → first token at 4, second at 5.
    assert res.first_token_s[1] == 4.0
    assert res.finish_s[1] == 5.0
    # A decodes every step from 1 on: 9 more tokens → finishes at 10.
    assert res.finish_s[0] == 10.0
    if sim is simulate_jit:  # the step log (the reference writes none)
        cols = log.columns()
        assert cols["prefill_tokens"].sum() == 4 + 20
        assert cols["steps"].sum() == 10
    _assert_same(res, simulate_reference(w, spec, cost))


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_max_num_seqs_queues_fcfs(sim: Engine) -> None:
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)
    w = workload([0.0, 0.0, 0.0], [2, 2, 2], [3, 3, 3])
    spec = FleetSpec(replicas=1, scheduler=_cfg(max_num_seqs=2, max_num_batched_tokens=64))
    res = sim(w, spec, cost)
    np.testing.assert_array_equal(res.scheduled_s, [0.0, 0.0, 3.0])
    np.testing.assert_array_equal(res.finish_s, [3.0, 3.0, 6.0])
    np.testing.assert_array_equal(res.first_token_s - res.arrival_s, [1.0, 1.0, 4.0])


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_kv_exhaustion_preempts_the_newest_and_recomputes(sim: Engine) -> None:
    # 4 blocks of 4 tokens = 16 tokens. A (prompt 4, out 8) and B (prompt 4, out 8) each need up
    # to 3 blocks (11 tokens). Both start; when a 5th block is needed, B (newest) is preempted.
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)
    w = workload([0.0, 0.0], [4, 4], [8, 8])
    spec = FleetSpec(replicas=1, scheduler=_cfg(num_gpu_blocks=4, max_num_batched_tokens=64))
    res = sim(w, spec, cost)
    ref = simulate_reference(w, spec, cost)
    _assert_same(res, ref)
    assert res.preemptions[1] >= 1 and res.preemptions[0] == 0
    # A never waits: 1 prefill step + 7 decode steps.
    assert res.finish_s[0] == 8.0
    # B recomputed its prompt and the outputs it had: more than its 4 prompt tokens prefilled.
    assert res.prefill_tokens[1] > 4


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_prefix_cache_hits_skip_prefill_but_never_the_last_token(sim: Engine) -> None:
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)
    chain = [11, 12, 13]  # 3 full blocks of 4 = 12 tokens
    w = workload([0.0, 10.0, 20.0], [12, 12, 14], [2, 2, 2], chains=[chain, chain, chain])
    spec = FleetSpec(replicas=1, scheduler=_cfg())
    res = sim(w, spec, cost)
    # Second request: prompt 12 fully cached, but the last token must be computed, so only the
    # first 2 blocks (8 tokens) hit. Third: prompt 14 → all 3 blocks hit.
    np.testing.assert_array_equal(res.cache_hit_tokens, [0, 8, 12])
    np.testing.assert_array_equal(res.prefill_tokens, [12, 4, 2])
    _assert_same(res, simulate_reference(w, spec, cost))
    off = FleetSpec(replicas=1, scheduler=_cfg(enable_prefix_caching=False))
    np.testing.assert_array_equal(sim(w, off, cost).cache_hit_tokens, [0, 0, 0])


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_reported_cache_hits_skip_their_prefill_but_hold_their_blocks(sim: Engine) -> None:
    # prompt 10, the log reports 6 cached: one step prefills the other 4, attending over all 10
    # (pairs 4·6 + 4·5/2 = 34); decode reads a context of 11. The whole 10 + 1 tokens' KV is
    # the request's own: 3 blocks of 4.
    cost = LinearCost(a=0.01, b=0.001, c=1e-4, d=0.002, e=0.0001)
    w = replace(workload([1.0], [10], [2]), reported_hit_tokens=np.array([6]))
    spec = FleetSpec(replicas=1, scheduler=_cfg())
    log = StepLog()
    res = sim(w, spec, cost, log)
    prefill = 0.01 + 0.001 * 4 + 1e-4 * 34
    assert res.first_token_s[0] == pytest.approx(1.0 + prefill, rel=1e-12)
    assert res.finish_s[0] == pytest.approx(1.0 + prefill + 0.01 + 0.002 + 0.0001 * 11, rel=1e-12)
    assert (res.cache_hit_tokens[0], res.prefill_tokens[0]) == (6, 4)
    if sim is simulate_jit:  # the step log (the reference writes none)
        assert int(log.columns()["kv_blocks_used"].max()) == 3
    _assert_same(res, simulate_reference(w, spec, cost))
    # A whole prompt reported as cached still computes its last token (as vLLM does).
    whole = replace(workload([1.0], [10], [2]), reported_hit_tokens=np.array([10]))
    res = sim(whole, spec, cost)
    assert (res.cache_hit_tokens[0], res.prefill_tokens[0]) == (9, 1)
    _assert_same(res, simulate_reference(whole, spec, cost))
    # A report of 0 is a report: that request does not look its chain up in the replica's cache
    # (the chain would hit 8 tokens, as the unreported third request shows).
    chain = [11, 12, 13]
    w = replace(
        workload([0.0, 10.0, 20.0], [12, 12, 12], [2, 2, 2], chains=[chain, chain, chain]),
        reported_hit_tokens=np.array([-1, 0, -1]),
    )
    res = sim(w, spec, cost)
    np.testing.assert_array_equal(res.cache_hit_tokens, [0, 0, 8])
    _assert_same(res, simulate_reference(w, spec, cost))


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_reported_cache_hits_take_kv_capacity(sim: Engine) -> None:
    # 4 blocks of 4 tokens. Two requests of 12-token prompts, 8 of them reported cached: each
    # needs 3 blocks for its prompt and its KV is never shared, so the second waits for the first
    # to finish even though its own prefill is only 4 tokens.
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)
    w = replace(workload([0.0, 0.0], [12, 12], [1, 1]), reported_hit_tokens=np.array([8, 8]))
    spec = FleetSpec(replicas=1, scheduler=_cfg(num_gpu_blocks=4))
    res = sim(w, spec, cost)
    np.testing.assert_array_equal(res.cache_hit_tokens, [8, 8])
    np.testing.assert_allclose(res.first_token_s, [1.0, 2.0])
    _assert_same(res, simulate_reference(w, spec, cost))


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_lru_eviction_of_finished_blocks(sim: Engine) -> None:
    # 6 blocks of 4. Request 0 leaves blocks h1, h2 cached (freed tail first, so the free queue is
    # [4 never-used, h2, h1]); request 1 (other prefix, 6 blocks) takes all of them, evicting both.
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)
    w = workload([0.0, 10.0, 20.0], [8, 24, 8], [1, 1, 1], chains=[[1, 2], [7, 8, 9, 10, 11, 12], [1, 2]])
    spec = FleetSpec(replicas=1, scheduler=_cfg(num_gpu_blocks=6))
    res = sim(w, spec, cost)
    _assert_same(res, simulate_reference(w, spec, cost))
    assert res.cache_hit_tokens[2] == 0  # evicted
    roomy = FleetSpec(replicas=1, scheduler=_cfg(num_gpu_blocks=8))
    assert sim(w, roomy, cost).cache_hit_tokens[2] == 4  # kept: 1 block (last token rule)


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_rejections_are_reported_with_a_reason(sim: Engine) -> None:
    # KV needed: prompt + output − 1 tokens → 28, 1253 and 30 blocks of 4.
    w = workload([0.0, 0.0, 0.0], [100, 5000, 30], [10, 10, 90])
    spec = FleetSpec(replicas=1, scheduler=_cfg(num_gpu_blocks=30, max_model_len=4096))
    res = sim(w, spec, LinearCost())
    assert res.reject_reason.tolist() == [0, REJECT_MAX_MODEL_LEN, 0]
    assert np.isnan(res.finish_s[1]) and res.replica[1] == -1
    tight = FleetSpec(replicas=1, scheduler=_cfg(num_gpu_blocks=29, max_model_len=4096))
    res = sim(w, tight, LinearCost())
    assert res.reject_reason.tolist() == [0, REJECT_MAX_MODEL_LEN, REJECT_KV_CAPACITY]
    assert np.isfinite(res.finish_s[0])


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        SchedulerConfig(num_gpu_blocks=10, max_model_len=100, max_num_seqs=64, max_num_batched_tokens=32)
    with pytest.raises(ConfigError, match="enable_chunked_prefill"):
        SchedulerConfig(
            num_gpu_blocks=10,
            max_model_len=100,
            max_num_seqs=8,
            max_num_batched_tokens=64,
            enable_chunked_prefill=False,
        )
    with pytest.raises(ConfigError, match="block_size"):
        SchedulerConfig(num_gpu_blocks=10, max_model_len=100, block_size=0)
    with pytest.raises(ConfigError, match="router"):
        FleetSpec(replicas=1, scheduler=_cfg(), router="random")


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_closed_loop_keeps_concurrency_clients_busy(sim: Engine) -> None:
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)
    w = workload([0.0] * 6, [4] * 6, [2] * 6)
    spec = FleetSpec(replicas=1, scheduler=_cfg(), mode="closed", concurrency=2)
    res = sim(w, spec, cost)
    # Two at a time, each taking 2 steps: issued at 0, 0, 2, 2, 4, 4.
    np.testing.assert_array_equal(res.arrival_s, [0, 0, 2, 2, 4, 4])
    np.testing.assert_array_equal(res.finish_s, [2, 2, 4, 4, 6, 6])
    _assert_same(res, simulate_reference(w, spec, cost))


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_closed_loop_ramp_and_think_time_by_hand(sim: Engine) -> None:
    # 1 s steps, 2-token outputs (a prefill step, a decode step), 2 clients: client 1 starts at
    # 3 (ramp 3 s / (2 − 1)); a client sends its next request 0.25 s after its last token.
    # Request 0: [0, 2], client 0 sends request 1 at 2.25: [2.25, 4.25]. Client 1's request 2
    # at 3 waits for the step at 3.25: [3.25, 5.25]. Request 3 (client 0, at 4.5) waits for 5.25:
    # [5.25, 7.25]; request 4 (client 1, at 5.5) for 6.25: [6.25, 8.25]; request 5 (client 0, at
    # 7.5) for 8.25: [8.25, 10.25].
    cost = LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0)
    w = workload([0.0] * 6, [4] * 6, [2] * 6)
    spec = FleetSpec(replicas=1, scheduler=_cfg(), mode="closed", concurrency=2, ramp_s=3.0, think_s=0.25)
    res = sim(w, spec, cost)
    np.testing.assert_array_equal(res.arrival_s, [0, 2.25, 3, 4.5, 5.5, 7.5])
    np.testing.assert_array_equal(res.finish_s, [2, 4.25, 5.25, 7.25, 8.25, 10.25])
    _assert_same(res, simulate_reference(w, spec, cost))


# -- the compiled engine == reference on generated traces and fleets ----------------------------


@st.composite
def _speculation(draw: st.DrawFn, seqs: int) -> Speculation | None:
    """Speculative decoding half the time: k drafts, a mean accepted length in [1, k + 1] (from a
    per-token acceptance, or drawn directly), a draft pass table over 0..seqs and a context term."""
    if not draw(st.booleans()):
        return None
    k = draw(st.integers(1, 6))
    per_token = draw(st.booleans())
    e = tokens_per_verification(draw(st.floats(0.0, 1.0)), k) if per_token else draw(st.floats(1.0, k + 1.0))
    table = tuple(draw(st.lists(st.floats(0.0, 5e-3), min_size=seqs + 1, max_size=seqs + 1)))
    return Speculation(k, e, table, draw(st.sampled_from([0.0, 1e-7, 3e-6])))


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Workload, FleetSpec, LinearCost]:
    n = draw(st.integers(1, 40))
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(seqs, 96))
    chunked = draw(st.booleans())
    max_len = draw(st.integers(8, 400))
    if not chunked:
        budget = max(budget, max_len)
    blocks = draw(st.integers(2, 80))
    cfg = SchedulerConfig(
        num_gpu_blocks=blocks,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        block_size=bs,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.booleans()),
        async_scheduling=draw(st.booleans()),
    )
    gaps = draw(st.lists(st.floats(0.0, 0.5, allow_nan=False), min_size=n, max_size=n))
    arrival = np.cumsum(gaps)
    prompt = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    # Chains from a few shared prefixes so that hits, duplicates and evictions happen.
    roots = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    chains = []
    for i in range(n):
        full = (prompt[i] + draw(st.integers(0, output[i]))) // bs
        shared = draw(st.integers(0, full))
        common = [1000 * roots[i] + j for j in range(shared)]
        chains.append(common + [10**6 + 1000 * i + j for j in range(shared, full)])
    affinity = [r if r % 2 else -1 for r in roots]
    w = workload(arrival, prompt, output, chains=chains, affinity=affinity)
    if draw(st.booleans()):  # the log reports some requests' cache hits (0..the whole prompt; −1 none)
        reported = [draw(st.integers(0, p)) if draw(st.booleans()) else -1 for p in prompt]
        w = replace(w, reported_hit_tokens=np.array(reported, np.int64))
    router = draw(st.sampled_from(["round_robin", "least_outstanding", "session_affinity", "most_free_kv"]))
    mode = draw(st.sampled_from(["open", "open", "closed", "offline"]))
    spec = FleetSpec(
        replicas=draw(st.integers(1, 3)),
        scheduler=cfg,
        router=router,
        mode=mode,
        concurrency=draw(st.integers(1, 6)),
        speculation=draw(_speculation(seqs)),
    )
    cost = LinearCost(
        a=draw(st.floats(1e-3, 0.05)),
        b=draw(st.floats(0.0, 1e-3)),
        c=draw(st.floats(0.0, 1e-6)),
        d=draw(st.floats(0.0, 1e-2)),
        e=draw(st.floats(0.0, 1e-4)),
    )
    return w, spec, cost


# ROOFTRACE_HYPOTHESIS_EXAMPLES raises the example count for a deeper search (e.g. 2000).
_EXAMPLES = int(os.environ.get("ROOFTRACE_HYPOTHESIS_EXAMPLES", "150"))


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_jit_equals_reference(case: tuple[Workload, FleetSpec, LinearCost]) -> None:
    w, spec, cost = case
    ref = simulate_reference(w, spec, cost)
    log = StepLog()
    res = simulate_jit(w, spec, cost, log)
    _assert_same(res, ref)
    check_invariants(w, spec, res, log)


@st.composite
def _closed_cases(draw: st.DrawFn) -> tuple[Workload, FleetSpec, LinearCost]:
    """``_cases`` as a closed loop whose clients start over a ramp and wait between requests
    (docs/engine.md, "Closed loop"), each of the two sometimes 0."""
    w, spec, cost = draw(_cases())
    spec = replace(
        spec,
        mode="closed",
        ramp_s=draw(st.sampled_from([0.0, 0.3, 1.0, 2.5, 1.0 / 3])),
        think_s=draw(st.sampled_from([0.0, 0.01, 0.2, 1.0 / 3, 1.5])),
    )
    return w, spec, cost


@settings(max_examples=max(_EXAMPLES // 2, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_closed_cases())
def test_closed_loop_with_ramp_and_think_time_equals_reference(case: tuple[Workload, FleetSpec, LinearCost]) -> None:
    w, spec, cost = case
    ref = simulate_reference(w, spec, cost)
    # requests go out in the trace's order; each is a client's first (at c · R/(C − 1)) or comes
    # exactly T after a request's end (its finish, or its arrival when rejected)
    arrival = ref.arrival_s
    assert np.all(np.isfinite(arrival)) and np.all(np.diff(arrival) >= 0)
    starts = np.arange(min(spec.concurrency, w.n)) * spec.ramp_step_s
    assert np.isin(starts, arrival).all()
    rejected = ref.reject_reason != 0
    ends = np.concatenate([ref.finish_s[~rejected], arrival[rejected]]) + spec.think_s
    assert np.isin(arrival, np.concatenate([starts, ends])).all()
    log = StepLog()
    res = simulate_jit(w, spec, cost, log)
    _assert_same(res, ref)
    check_invariants(w, spec, res, log)


def check_invariants(w: Workload, spec: FleetSpec, res: EngineResult, log: StepLog) -> None:
    """The invariants every replay must satisfy (also used on the real-trace slices)."""
    cfg = spec.scheduler
    ok = res.reject_reason == 0
    # Every request either finished or was rejected with a reason.
    assert np.all(np.isfinite(res.finish_s[ok]))
    assert np.all(np.isnan(res.finish_s[~ok])) and np.all(res.replica[~ok] == -1)
    assert np.all(res.replica[ok] >= 0) and np.all(res.replica[ok] < spec.replicas)
    # arrival <= scheduled <= first token <= finish.
    assert np.all(res.arrival_s[ok] <= res.scheduled_s[ok])
    assert np.all(res.scheduled_s[ok] < res.first_token_s[ok])
    assert np.all(res.first_token_s[ok] <= res.finish_s[ok])
    one = ok & (w.output_tokens == 1)
    assert np.all(res.first_token_s[one] == res.finish_s[one])
    # Prefill work: exactly prompt minus prefix hits when never preempted. After a preemption the
    # request may re-hit blocks it registered itself, so only "at least one token" holds then.
    fresh = w.prompt_tokens[ok] - res.cache_hit_tokens[ok]
    calm = res.preemptions[ok] == 0
    assert np.all(res.prefill_tokens[ok][calm] == fresh[calm])
    assert np.all(res.prefill_tokens[ok] >= 1)
    cols = log.columns()
    # Output tokens conserved: every decode-step token plus one sampled per prefill completion.
    assert cols["steps"].min(initial=1) >= 1
    assert np.all(cols["kv_blocks_used"] <= cfg.num_gpu_blocks)
    assert np.all(cols["prefill_tokens"] + cols["decode_seqs"] <= cfg.max_num_batched_tokens * cols["steps"])
    assert np.all(cols["running"] <= cfg.max_num_seqs)
    assert np.all(cols["decode_seqs"] <= cfg.max_num_seqs)
    fed = int(cols["prefill_tokens"].sum() + cols["decode_tokens"].sum())
    if spec.speculation is None:
        assert fed == int(res.prefill_tokens[ok].sum() + (w.output_tokens[ok] - 1).sum())
    else:  # a verification is one decode-row entry that may advance several tokens
        assert fed <= int(res.prefill_tokens[ok].sum() + (w.output_tokens[ok] - 1).sum())
    # Steps of one replica never overlap.
    for r in range(spec.replicas):
        mine = cols["replica"] == r
        assert np.all(cols["start_s"][mine][1:] >= cols["end_s"][mine][:-1])


def test_closed_loop_ties_go_to_the_lower_replica_like_the_reference() -> None:
    # Found by hypothesis on a fresh run: two replicas whose steps overlap, closed loop. The next
    # request index goes to whichever replica the reference steps first, (next start, index).
    n = 33
    prompt = np.array([1] * 8 + [47, 1, 1, 48] + [1] * 21)
    out = np.array([1, 1, 4, 1, 1, 1, 1, 3, 2] + [1] * 24)
    hashes = np.array([1008000 + i for i in range(11)] + [1011000 + i for i in range(12)], dtype=np.uint64)
    offsets = np.array([0] * 9 + [11] * 3 + [23] * 22)
    w = Workload(
        arrival_s=np.zeros(n),
        prompt_tokens=prompt,
        output_tokens=out,
        chain_hashes=hashes,
        chain_offsets=offsets,
        affinity=np.full(n, -1),
    )
    cfg = _cfg(num_gpu_blocks=12, max_model_len=49, max_num_seqs=1, max_num_batched_tokens=2)
    spec = FleetSpec(
        replicas=2,
        scheduler=SchedulerConfig(**{**cfg.__dict__, "enable_prefix_caching": False}),
        router="least_outstanding",
        mode="closed",
        concurrency=4,
    )
    cost = LinearCost(a=0.03125, b=0.0001, c=0.0, d=0.0, e=0.0)
    _assert_same(simulate_jit(w, spec, cost), simulate_reference(w, spec, cost))


@st.composite
def _tree_cases(draw: st.DrawFn) -> tuple[Workload, FleetSpec, LinearCost]:
    """``_cases`` with the chains given as a lazy ChainTree cut from a random prefix identity
    (sessions and shared prefixes: each request repeats part of an earlier one)."""
    from pipeline.classify.prefix import PrefixIdentity

    w, spec, cost = draw(_cases())
    n = w.n
    parent = np.full(n, -1, np.int64)
    shared = np.zeros(n, np.int64)
    cached = w.prompt_tokens + np.array([draw(st.integers(0, int(o))) for o in w.output_tokens], np.int64)
    for i in range(1, n):
        if draw(st.booleans()):
            p = draw(st.integers(0, i - 1))
            s = draw(st.integers(0, int(min(w.prompt_tokens[i], cached[p]))))
            parent[i], shared[i] = (p, s) if s else (-1, 0)
    ident = PrefixIdentity(
        request_key=np.arange(n, dtype=np.uint64),
        key=np.array([draw(st.integers(0, 2**64 - 1)) for _ in range(n)], np.uint64),
        parent=parent,
        shared=shared,
        prompt=w.prompt_tokens.astype(np.int64),
        cached=cached,
        source=np.zeros(n, np.int8),
        log_block_size=None,
        isolation=(),
    )
    ident.check()
    tree = ident.tree(spec.scheduler.block_size)
    lazy = Workload(w.arrival_s, w.prompt_tokens, w.output_tokens, chain_tree=tree, affinity=w.affinity)
    return lazy, spec, cost


@settings(max_examples=max(_EXAMPLES // 3, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tree_cases())
def test_lazy_chains_equal_materialised_chains(case: tuple[Workload, FleetSpec, LinearCost]) -> None:
    """The jit engine hashing each request's blocks from its ChainTree when it needs them gives
    what it gives on the materialised hashes (and what the reference gives), step log included."""
    w, spec, cost = case
    explicit = w.explicit()
    assert explicit.chain_tree is None and explicit.chain_hashes.shape[0] == int(w.chain_tree.blocks.sum())  # type: ignore[union-attr]
    lazy_log, full_log = StepLog(), StepLog()
    lazy = simulate_jit(w, spec, cost, lazy_log)
    _assert_same(lazy, simulate_jit(explicit, spec, cost, full_log))
    _assert_same(lazy, simulate_reference(w, spec, cost))
    for name, col in lazy_log.columns().items():
        assert np.array_equal(col, full_log.columns()[name]), name
    check_invariants(w, spec, lazy, lazy_log)


@settings(max_examples=max(_EXAMPLES // 3, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases(), st.integers(0, 60), st.booleans())
def test_replicas_without_requests_cost_nothing_and_change_nothing(
    case: tuple[Workload, FleetSpec, LinearCost], extra: int, keyed: bool
) -> None:
    """The jit engine runs only the replicas a workload can reach (jit.busy_fleet): on a fleet with
    many idle replicas it still equals the reference, which runs every replica."""
    from dataclasses import replace

    from pipeline.engine.jit import busy_fleet

    w, spec, cost = case
    if keyed:  # every request has an affinity key: static routes, idle replicas dropped anywhere
        w = replace(w, affinity=np.arange(w.n, dtype=np.int64) * 7919 % 13)
    spec = replace(spec, replicas=spec.replicas + extra)
    busy = busy_fleet(w, spec)
    keys = w.affinity if w.affinity is not None else np.full(w.n, -1)
    if spec.router in ("round_robin", "least_outstanding", "most_free_kv") or (keys >= 0).all():
        assert busy.spec.replicas <= min(spec.replicas, max(w.n, 1))
    elif (keys[reject_reasons(w, spec.scheduler) == 0] < 0).any():
        assert busy.spec == spec  # a request without a key goes to the least loaded replica
    log = StepLog()
    res = simulate_jit(w, spec, cost, log)
    _assert_same(res, simulate_reference(w, spec, cost))
    check_invariants(w, spec, res, log)


def test_ten_million_replicas_for_fifty_requests() -> None:
    """A fleet of 10⁷ replicas (its block tables alone would be terabytes) replays 50 requests as
    fast as a fleet of 50: least outstanding fills replicas from the lowest index, and affinity
    routes name replicas anywhere in the fleet, mapped back in the results and the step log."""
    from dataclasses import replace

    from pipeline.engine.jit import affinity_replicas, busy_fleet

    n = 50
    rng = np.random.default_rng(3)
    w = workload(np.sort(rng.uniform(0, 2, n)), rng.integers(10, 200, n), rng.integers(1, 40, n))
    cost = LinearCost()
    small = FleetSpec(replicas=n, scheduler=_cfg(num_gpu_blocks=4000, max_model_len=400), router="least_outstanding")
    huge = replace(small, replicas=10_000_000)
    assert busy_fleet(w, huge).spec.replicas == n
    _assert_same(simulate_jit(w, huge, cost), simulate_jit(w, small, cost))
    keyed = replace(w, affinity=rng.integers(0, 2**62, n))
    aff = replace(huge, router="session_affinity", replicas=10**9)  # nothing of the fleet's size is allocated
    log = StepLog()
    res = simulate_jit(keyed, aff, cost, log)
    want = affinity_replicas(keyed.affinity, aff.replicas)  # type: ignore[arg-type]
    assert np.array_equal(res.replica, want) and want.max() > 100_000_000
    assert set(log.columns()["replica"].tolist()) == set(want.tolist())


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_most_free_kv_and_least_outstanding_choose_differently_by_hand(sim: Engine) -> None:
    # Two replicas of 100 blocks of 16 tokens, no prefix caching. A (prompt 640: 40 blocks) and B
    # (prompt 16: 1 block) arrive at t = 0, C and D (16 each) at t = 1, every output 400 (nothing
    # finishes by t = 1). Both routers send A to replica 0 (a tie) and B to replica 1 (no request
    # outstanding there; 100 free blocks against 100 − 40 claimed by A). At t = 1 replica 0 holds A
    # at 640 + ~190 tokens (≥ 52 blocks) and replica 1 holds B (≤ 14 blocks): least outstanding sees
    # 1 and 1 and takes replica 0 (the lower index) for C, most free KV takes replica 1 (≥ 86 free
    # against ≤ 48). D: least outstanding sees 2 and 1 and takes replica 1; most free KV sees one
    # long request on replica 0 and two short ones on replica 1 (C waiting, its block claimed) and
    # still takes replica 1, where least outstanding, from that state (1 against 2), would take 0.
    w = workload([0.0, 0.0, 1.0, 1.0], [640, 16, 16, 16], [400, 400, 400, 400])
    cfg = _cfg(num_gpu_blocks=100, block_size=16, max_model_len=2048, enable_prefix_caching=False)
    lo = sim(w, FleetSpec(replicas=2, scheduler=cfg, router="least_outstanding"), LinearCost())
    kv = sim(w, FleetSpec(replicas=2, scheduler=cfg, router="most_free_kv"), LinearCost())
    assert lo.replica.tolist() == [0, 1, 0, 1]
    assert kv.replica.tolist() == [0, 1, 1, 1]
    assert np.isfinite(kv.finish_s).all() and kv.preemptions.sum() == 0
    # the rule itself (model.choose_replica): the state at D's arrival under most free KV
    assert choose_replica("least_outstanding", -1, [1, 2], 0) == 0
    assert choose_replica("most_free_kv", -1, [1, 2], 0, [48, 86]) == 1
    assert choose_replica("most_free_kv", -1, [3, 0], 0, [60, 60]) == 0  # ties: the lowest index
    assert choose_replica("most_free_kv", -1, [0, 0, 0], 0, [-5, -2, -9]) == 1  # claims may exceed what is free


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_most_free_kv_routes_before_a_step_that_starts_at_the_arrival(sim: Engine, async_scheduling: bool) -> None:
    # Two replicas of 2 blocks of 4 tokens, one sequence each, every step 46.875 ms. At t = 0
    # request 0 goes to replica 0, 1 (6 outputs) to replica 1, 2 to replica 0 (waiting). Replica 1
    # runs request 1 alone: its steps start at 0, 1, 2, 3 and 4 × 46.875 ms, and the one at
    # 187.5 ms (position 4) takes its second block. Four requests arrive at exactly 187.5 ms: they
    # are routed before that step allocates (replica 1 shows 1 free block), also with asynchronous
    # scheduling, where that step was scheduled at the previous one's start and a decode span could
    # already have run it. Scores (free − claimed): 3 → 0 (2 against 1), 4 → 0 (1 against 1, the
    # lower index), 5 → 1 (0 against 1), 6 → 0 (0 against 0).
    w = workload([0.0, 0.0, 0.0, 0.1875, 0.1875, 0.1875, 0.1875], [1] * 7, [1, 6, 1, 1, 1, 1, 1])
    cfg = SchedulerConfig(
        num_gpu_blocks=2, max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8, block_size=4,
        enable_chunked_prefill=False, enable_prefix_caching=False, async_scheduling=async_scheduling,
    )  # fmt: skip
    cost = LinearCost(a=0.046875, b=0.0, c=0.0, d=0.0, e=0.0)
    res = sim(w, FleetSpec(replicas=2, scheduler=cfg, router="most_free_kv"), cost)
    assert res.replica.tolist() == [0, 1, 0, 0, 0, 1, 0]


def test_least_outstanding_grows_the_replicas_it_runs_until_one_stays_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """With fewer replicas' state allowed than requests, least outstanding starts on what fits and
    runs again on twice as many while its last replica was used: the result is still the whole
    fleet's (the reference's). jit.MAX_STATE_BYTES sets where it starts, not where it stops: past
    it the compiled engine grows on (no other engine takes over), up to the replicas the routed
    requests can reach, and stops there even when the last of them was used."""
    from dataclasses import replace

    from pipeline.engine import jit

    rng = np.random.default_rng(11)
    n = 60
    w = workload(np.sort(rng.uniform(0, 3, n)), rng.integers(20, 300, n), rng.integers(5, 60, n))
    cost = LinearCost()
    spec = FleetSpec(replicas=64, scheduler=_cfg(num_gpu_blocks=300, max_model_len=400), router="least_outstanding")
    monkeypatch.setattr(jit, "MAX_STATE_BYTES", jit.state_bytes(replace(spec, replicas=2)))
    busy = jit.busy_fleet(w, spec)
    assert busy.open_top and busy.spec.replicas == 2
    ref = simulate_reference(w, spec, cost)
    assert ref.replica.max() >= 4  # more than two replicas are busy at once: it must grow
    runs: list[int] = []
    real = jit._run_busy

    def counting(work: Workload, b: jit.BusyFleet, *args: object) -> object:
        runs.append(b.spec.replicas)
        return real(work, b, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(jit, "_run_busy", counting)
    _assert_same(simulate_jit(w, spec, cost), ref)  # past MAX_STATE_BYTES from its second run on
    assert runs[0] == 2 and runs == [2 * 2**k for k in range(len(runs))] and len(runs) >= 2
    # every request at once: each takes a replica of its own, all 60 reachable ones are used, and
    # the last run is on those 60 (not 64, and not again)
    burst = replace(w, arrival_s=np.zeros(n))
    runs.clear()
    res = simulate_jit(burst, spec, cost)
    _assert_same(res, simulate_reference(burst, spec, cost))
    assert res.replica.max() == n - 1 and runs == [2, 4, 8, 16, 32, 60]


def test_a_state_memory_cannot_hold_is_one_line_saying_what_to_do() -> None:
    """A scheduler state no machine can allocate (a request without an affinity key makes the
    router read every replica: 10^14 of them) is refused in one line naming its size and the ways
    out, not a numpy traceback; the same fleet with a key on every request runs."""
    from dataclasses import replace

    from pipeline.engine.jit import EngineStateTooLarge

    w = workload([0.0, 0.1], [10, 12], [3, 2], affinity=[5, -1])
    spec = FleetSpec(replicas=10**14, scheduler=_cfg(), router="session_affinity")
    with pytest.raises(EngineStateTooLarge) as err:
        simulate_jit(w, spec, LinearCost())
    line = str(err.value)
    assert "\n" not in line and "100,000,000,000,000 replicas" in line and "GiB" in line
    assert "does not fit in memory" in line and "--pods" in line and "fewer replicas" in line
    keyed = replace(w, affinity=np.array([5, 6], np.int64))
    assert np.isfinite(simulate_jit(keyed, spec, LinearCost()).finish_s).all()


@settings(max_examples=max(_EXAMPLES // 3, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases(), st.floats(0.0, 0.2), st.floats(0.0, 0.05), st.booleans())
def test_frontend_and_calibrated_timeline_equal_in_both_engines(
    case: tuple[Workload, FleetSpec, LinearCost], request_s: float, token_s: float, via_cost: bool
) -> None:
    # The front end is one function both engines call last: the same figures either way, and the
    # engine's own plus the front end's terms. A calibrated cost carries the terms (stackcal.apply)
    # and both engines read them from it.
    w, spec, cost = case
    front = {"frontend_request_s": request_s, "frontend_token_s": token_s}
    asy = spec.scheduler.async_scheduling
    plain = simulate_jit(w, replace(spec, scheduler=replace(spec.scheduler, async_scheduling=not asy)), cost)
    if via_cost:  # a calibration that sets the front end and turns async scheduling over
        terms = {**front, "async_scheduling": not asy}
        cost = replace(cost, describe={**cost.describe, TIMELINE_KEY: terms})
        fronted = spec
    else:
        fronted = replace(spec, scheduler=replace(spec.scheduler, async_scheduling=not asy), **front)
    res = simulate_jit(w, fronted, cost)
    _assert_same(res, simulate_reference(w, fronted, cost))
    apply_frontend(plain, w.output_tokens, replace(spec, **front))
    _assert_same(res, plain)


# -- speculative decoding (model.Speculation; docs/engine.md, "Speculative decoding") -----------


def test_tokens_per_verification_is_the_truncated_geometric_series() -> None:
    # Leviathan et al. (2023) eq. 1: 1 + a + a² + ... + a^k.
    assert tokens_per_verification(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125, rel=1e-15)
    assert tokens_per_verification(0.0, 5) == 1.0
    assert tokens_per_verification(1.0, 4) == 5.0
    assert tokens_per_verification(0.875, 1) == pytest.approx(1.875, rel=1e-15)


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_speculative_decoding_by_hand(sim: Engine) -> None:
    # One request, prompt 10, output 16; k = 3 drafts accepted each with a = 0.5: E = 1.875 tokens a
    # verification. The accumulator reaches 1.875, 3.75, 5.625, 7.5, 9.375, 11.25, 13.125, 15: the 15
    # tokens after the first come in exactly 8 verifications (1, 2, 2, 2, 2, 2, 2, 2 tokens) = 15 / E.
    # Each verification is priced as a prefill chunk of 1 + k' tokens (b per token; c = 0), plus k'
    # draft passes of (pass_s[1] + ctx_s × (computed + 1)); k' = 3, except the last, where only 2
    # tokens remain (k' = min(3, 16 − 14 − 1) = 1).
    cost = LinearCost(a=0.01, b=0.001, c=0.0, d=0.002, e=0.0001)
    sd = Speculation(3, tokens_per_verification(0.5, 3), (0.0, 0.0005, 0.0007), 1e-6)
    assert sd.mean_accepted == 1.875
    w = workload([1.0], [10], [16])
    spec = FleetSpec(replicas=1, scheduler=_cfg(), speculation=sd)
    res = sim(w, spec, cost)
    prefill = 0.01 + 0.001 * 10
    computed = [10, 11, 13, 15, 17, 19, 21, 23]  # before each verification
    drafts = [3, 3, 3, 3, 3, 3, 3, 1]
    steps = [0.01 + 0.001 * (1 + k) + k * (0.0005 + 1e-6 * (c + 1)) for c, k in zip(computed, drafts, strict=True)]
    assert res.first_token_s[0] == pytest.approx(1.0 + prefill, rel=1e-12)
    assert res.finish_s[0] == pytest.approx(1.0 + prefill + sum(steps), rel=1e-12)
    tpot = (res.finish_s[0] - res.first_token_s[0]) / 15
    assert tpot == pytest.approx(sum(steps) / 15, rel=1e-12)  # = mean step / E: 8 steps for 15 tokens
    assert res.max_itl_s[0] == pytest.approx(max(steps), rel=1e-9)
    assert res.prefill_tokens[0] == 10  # verification tokens are decode work
    _assert_same(res, simulate_reference(w, spec, cost))
    # Without speculation the same request takes 15 decode steps.
    plain = sim(w, FleetSpec(replicas=1, scheduler=_cfg()), cost)
    decodes = [0.01 + 0.002 + 0.0001 * (c + 1) for c in range(10, 25)]
    assert plain.finish_s[0] == pytest.approx(1.0 + prefill + sum(decodes), rel=1e-12)


@pytest.mark.parametrize("sim", ENGINES.values(), ids=ENGINES.keys())
def test_speculative_tokens_hold_kv_blocks_and_preempt(sim: Engine) -> None:
    # Block size 4, 8 blocks. A (prompt 12, output 12) and B (prompt 12, output 12) start together.
    # With k = 3 a verification needs blocks for computed + 4 tokens, so the pool runs out sooner
    # than without speculation: B (the newer) is preempted and recomputed. Every token's KV
    # (prompt + output − 1 = 23 tokens: 6 blocks) fits one request alone, so both finish.
    cost = LinearCost(a=0.01, b=0.001, c=0.0, d=0.002, e=0.0)
    w = workload([0.0, 0.0], [12, 12], [12, 12])
    sd = Speculation(3, 3.5, (), 0.0)
    spec = FleetSpec(replicas=1, scheduler=_cfg(num_gpu_blocks=8, block_size=4), speculation=sd)
    res = sim(w, spec, cost)
    assert res.preemptions.tolist() == [0, 1]
    assert np.isfinite(res.finish_s).all()
    _assert_same(res, simulate_reference(w, spec, cost))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_speculation_under_kv_pressure_equals_the_reference(seed: int) -> None:
    # 120 requests on 2 replicas with a small KV pool: verifications' draft slots preempt
    # (checked to happen), prefix hits and reported hits mix in; both engines give the same
    # results request by request.
    rng = np.random.default_rng(seed)
    n = 120
    prompt = rng.integers(1, 200, n)
    output = rng.integers(1, 120, n)
    chains = [[1000 * int(rng.integers(0, 3)) + j for j in range(int(p) // 4)] for p in prompt]
    w = workload(np.cumsum(rng.exponential(0.02, n)), prompt, output, chains=chains)
    sd = Speculation(4, tokens_per_verification(0.7, 4), tuple(rng.uniform(0, 2e-3, 9)), 1e-7)
    cfg = _cfg(num_gpu_blocks=90, max_model_len=400, max_num_seqs=8, max_num_batched_tokens=64, block_size=4)
    spec = FleetSpec(replicas=2, scheduler=cfg, router="least_outstanding", speculation=sd)
    cost = LinearCost()
    log = StepLog()
    res = simulate_jit(w, spec, cost, log)
    assert res.preemptions.sum() > 0
    _assert_same(res, simulate_reference(w, spec, cost))
    check_invariants(w, spec, res, log)


def test_the_step_log_grows_in_place_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled loop reserves LOG_ROWS_PER_REQUEST step-log rows a request and grows the log
    in place when a day needs more; StepLog copies the rows a block at a time. With no rows
    reserved (1,024 to start: the log grows three times) and blocks of 1,000 rows, a chained day
    replays to the same results and the same log, row for row, as with the defaults."""
    from pipeline.engine import _jit_kernels as k
    from pipeline.engine import steplog

    n = 2000
    rng = np.random.default_rng(5)
    chains = [
        [int(s) * 1000 + j for j in range(int(b))]
        for s, b in zip(rng.integers(0, 50, n), rng.integers(1, 6, n), strict=True)
    ]
    w = workload(np.sort(rng.uniform(0, 60, n)), rng.integers(80, 100, n), rng.integers(1, 60, n), chains=chains)
    spec = FleetSpec(replicas=3, scheduler=_cfg(num_gpu_blocks=300, max_model_len=400), router="round_robin")
    cost = LinearCost()
    log = StepLog()
    res = simulate_jit(w, spec, cost, log)
    monkeypatch.setattr(k, "LOG_ROWS_PER_REQUEST", 0)
    monkeypatch.setattr(steplog, "_EXTEND_ROWS", 1000)
    grown = StepLog()
    again = simulate_jit(w, spec, cost, grown)
    for name, want in vars(res).items():
        assert np.array_equal(getattr(again, name), want, equal_nan=True), name
    assert log.n > 4 * 1024 and grown.n == log.n
    assert np.array_equal(grown.rows(), log.rows())
    assert int(res.cache_hit_tokens.sum()) > 0  # (chains hit: the cache's rows are in the log)
