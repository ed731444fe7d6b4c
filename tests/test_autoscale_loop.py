"""Autoscaling decided inside the compiled event loop (pipeline/engine/_jit_kernels.py, ``Scaling``;
docs/engine.md "Scaling decisions"): one replay is its own fixed point (the decisions it made are
autoscale.decide over autoscale.window_signals of its own step log, recomputed in Python), every
request goes to a replica live at its arrival, the reference engine replaying the loop's routes
gives the same per-request results, and a small case computed by hand."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_engine_support import LinearCost, workload

from pipeline.engine.jit import simulate_jit
from pipeline.engine.model import EngineResult, FleetSpec, Scaling, SchedulerConfig, Workload, affinity_replica
from pipeline.engine.reference import simulate_reference
from pipeline.engine.steplog import StepLog
from pipeline.replay.autoscale import (
    AutoscaleOutcome,
    AutoscaleSettings,
    decide,
    replay_autoscaled,
    timeline,
    window_signals,
)

CFG = SchedulerConfig(num_gpu_blocks=96, max_model_len=512, max_num_seqs=8, max_num_batched_tokens=256, block_size=16)
THRESHOLDS = {"utilisation": (0.3, 0.9, 0.0, 0.25), "queue": (0.2, 3.0, 0.0, 0.15), "kv": (0.05, 0.6, 0.0, 0.04)}


@st.composite
def _days(draw: st.DrawFn) -> tuple[Workload, FleetSpec, AutoscaleSettings]:
    """A random open-loop day on up to 4 replicas (asynchronous scheduling or not) and a random
    signal policy over it."""
    n = draw(st.integers(1, 120))
    span = draw(st.floats(5.0, 400.0))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    arrival = np.sort(rng.uniform(0.0, span, n))
    # a few prompts too long for the engine: rejected, routed nowhere
    prompt = rng.integers(8, 600, n)
    work = Workload(arrival, prompt.astype(np.int64), rng.integers(1, 80, n).astype(np.int64))
    hi = draw(st.integers(1, 4))
    lo = draw(st.integers(1, hi))
    signal = draw(st.sampled_from(sorted(THRESHOLDS)))
    up_lo, up_hi, down_lo, down_hi = THRESHOLDS[signal]
    up = draw(st.floats(up_lo, up_hi))
    down = draw(st.floats(down_lo, min(down_hi, up / 2)))
    policy = AutoscaleSettings(
        lo,
        hi,
        signal,
        up,
        down,
        window_s=draw(st.sampled_from([1.0, 3.0, 10.0, 30.0])),
        cooldown_s=draw(st.sampled_from([0.0, 5.0, 45.0])),
        initial_replicas=draw(st.integers(lo, hi)),
        engine_start_s=draw(st.sampled_from([0.0, 2.0, 25.0])),
    )
    router = draw(st.sampled_from(["round_robin", "least_outstanding"]))
    cfg = replace(CFG, async_scheduling=draw(st.booleans()))
    return work, FleetSpec(replicas=hi, scheduler=cfg, router=router), policy


def _run(day: tuple[Workload, FleetSpec, AutoscaleSettings]) -> tuple[EngineResult, Any, AutoscaleOutcome, StepLog]:
    work, spec, policy = day
    cost = LinearCost(a=0.02, b=4e-4, c=0.0, d=2e-3, e=1e-6)
    return replay_autoscaled(work, spec, policy, 0.0, cost)


def _near_threshold(policy: AutoscaleSettings, signal: np.ndarray) -> bool:
    """Whether a window's signal is within 1e-9 of a threshold the decision compares it with
    (scale_up_at, scale_down_at, or a boundary of ⌈target × signal / scale_up_at⌉), relative to
    the threshold or, for one at 0 (scale_down_at = 0), to the day's largest signal: the
    tolerance the signals are held equal to."""
    up, down = policy.scale_up_at, policy.scale_down_at
    assert up is not None and down is not None
    scale = float(np.abs(signal).max())
    for s in signal:
        for edge in (up, down, *(up * k / m for m in range(1, policy.max_replicas + 1) for k in range(1, 2 * m + 8))):
            if abs(s - edge) <= 1e-9 * max(abs(edge), scale):
                return True
    return False


@settings(max_examples=60, deadline=None)
@given(_days())
def test_the_decisions_the_loop_made_are_the_policy_over_its_own_step_log(
    day: tuple[Workload, FleetSpec, AutoscaleSettings],
) -> None:
    _, spec, policy = day
    res, _, out, log = _run(day)
    K = len(out.windows["live"])
    edges = np.arange(K + 1, dtype=np.float64) * policy.window_s
    assert max(1, math.ceil(max(float(res.arrival_s.max()), 1e-9) / policy.window_s)) == K
    incs = timeline(out.changes, policy.start_replicas(), out.delay_s, spec.replicas)
    again = window_signals(log.columns(), incs, edges, CFG.num_gpu_blocks)
    for name in ("live", "utilisation", "queue", "kv"):  # the signals the loop read are the log's
        # (to 1e-9 of each, or of the day's largest for a window near 0: window_signals integrates by
        # cumulative sums, off by a few ulps of t × value where the loop's window sums are exact)
        scale = float(np.abs(again[name]).max())
        np.testing.assert_allclose(out.windows[name], again[name], rtol=1e-9, atol=1e-9 * scale, err_msg=name)
    # the loop's rule is decide's, on the loop's own signals: exactly
    assert decide(policy, np.asarray(out.windows[policy.signal]), edges) == out.changes
    # and on the signals recomputed from the log, unless one sits on a threshold
    recomputed = decide(policy, again[policy.signal], edges)
    if recomputed != out.changes:
        assert _near_threshold(policy, again[policy.signal])
    assert all(a < b for (a, _), (b, _) in zip(out.changes, out.changes[1:], strict=False))
    assert all(policy.min_replicas <= n <= policy.max_replicas for _, n in out.changes)


def _live_at_arrival(res: EngineResult, routes: np.ndarray, incs: list[Any]) -> None:
    rejected = res.reject_reason != 0
    assert (routes[rejected] == -1).all() and (routes[~rejected] >= 0).all()
    for a, r in zip(res.arrival_s[~rejected], routes[~rejected], strict=True):
        assert any(i.replica == r and i.live_at(float(a)) for i in incs), (a, r)


@settings(max_examples=60, deadline=None)
@given(_days())
def test_no_request_goes_to_a_replica_not_live_at_its_arrival(
    day: tuple[Workload, FleetSpec, AutoscaleSettings],
) -> None:
    res, routes, out, _ = _run(day)
    assert (routes == res.replica).all()
    _live_at_arrival(res, routes, out.incarnations)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(st.tuples(st.floats(0.5, 300.0), st.integers(1, 4)), max_size=8, unique_by=lambda c: c[0]),
    st.floats(0.0, 60.0),
    st.sampled_from(["round_robin", "least_outstanding"]),
    st.integers(0, 2**31),
)
def test_a_schedule_routes_only_to_replicas_live_at_each_arrival(
    R: int, changes: list[tuple[float, int]], delay: float, router: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 150))
    work = Workload(np.sort(rng.uniform(0, 320, n)), rng.integers(8, 600, n), rng.integers(1, 60, n))
    planned = tuple(sorted((t, min(k, R)) for t, k in changes))
    initial = int(rng.integers(1, R + 1))
    scaling = Scaling("schedule", initial, delay, max_replicas=R, planned=planned)
    spec = FleetSpec(replicas=R, scheduler=CFG, router=router)
    res = simulate_jit(work, spec, LinearCost(), scaling=scaling)
    assert scaling.decisions == list(planned)
    _live_at_arrival(res, res.replica, timeline(list(planned), initial, delay, R))


def _keys_for(routes: np.ndarray, R: int) -> np.ndarray:
    """Affinity keys that send each request to its route (−1 for a rejected one)."""
    key_of: dict[int, int] = {}
    k = 0
    while len(key_of) < R:
        key_of.setdefault(affinity_replica(k, R), k)
        k += 1
    return np.array([key_of[int(r)] if r >= 0 else -1 for r in routes], np.int64)


@settings(max_examples=15, deadline=None)
@given(_days())
def test_the_reference_replaying_the_loops_routes_gives_the_same_requests(
    day: tuple[Workload, FleetSpec, AutoscaleSettings],
) -> None:
    work, spec, _ = day
    res, routes, _, _ = _run(day)
    keyed = Workload(work.arrival_s, work.prompt_tokens, work.output_tokens, affinity=_keys_for(routes, spec.replicas))
    keyed_spec = FleetSpec(replicas=spec.replicas, scheduler=spec.scheduler, router="session_affinity")
    ref = simulate_reference(keyed, keyed_spec, LinearCost(a=0.02, b=4e-4, c=0.0, d=2e-3, e=1e-6))
    for name in ("first_token_s", "finish_s", "arrival_s", "scheduled_s", "max_itl_s"):
        np.testing.assert_allclose(getattr(res, name), getattr(ref, name), rtol=1e-9, atol=1e-12, err_msg=name)
    for name in ("replica", "preemptions", "cache_hit_tokens", "prefill_tokens", "reject_reason"):
        np.testing.assert_array_equal(getattr(res, name), getattr(ref, name), err_msg=name)


def test_a_busy_first_window_adds_the_second_replica_at_its_end_and_an_idle_one_retires_it() -> None:
    """Two replicas, one live at first; utilisation over 10 s windows, up above 0.5, down below
    0.1, a 5 s start; every step lasts exactly 1 s (prompts of 16 tokens: one prefill step, then
    one decode step per further token).

    window [0, 10): request 0 busy 0–7 s; request 1 (arrival 9.5, 2 tokens) steps at 9.5–10.5
    and 10.5–11.5: the first starts before 10 s and counts its 0.5 s inside; the second starts
    after the decision and is not read by it. 7.5 s / 10 replica-s = 0.75 > 0.5: ⌈1 × 0.75 /
    0.5⌉ = 2 at t = 10 s; replica 1 is paid from 10 s and live from 15 s.
    window [10, 20): busy 0.5 + 1 + four 1 s requests (12, 14, 16, 17) = 5.5 s over 10 + 5 live
    replica-s = 0.367: no change. Round robin: 12 and 14 go to replica 0 (alone live); at 16 the
    counter is 4 (live 0, 1): replica 0; at 17, 5: replica 1.
    window [20, 30): idle, 0 < 0.1: one fewer at t = 30 s, the newest (replica 1) retires.
    window [30, 40) ends the day (last arrival 35 s): no decision; 1 s busy over 10 s."""
    work = workload([0.0, 9.5, 12.0, 14.0, 16.0, 17.0, 35.0], [16] * 7, [7, 2, 1, 1, 1, 1, 1])
    cfg = SchedulerConfig(num_gpu_blocks=64, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64)
    spec = FleetSpec(replicas=2, scheduler=cfg)
    policy = AutoscaleSettings(1, 2, "utilisation", 0.5, 0.1, window_s=10.0, engine_start_s=5.0)
    res, routes, out, _ = replay_autoscaled(work, spec, policy, 0.0, LinearCost(a=1.0, b=0.0, c=0.0, d=0.0, e=0.0))
    assert out.changes == [(10.0, 2), (30.0, 1)]
    assert routes.tolist() == [0, 0, 0, 0, 0, 1, 0]
    assert res.finish_s.tolist() == [7.0, 11.5, 13.0, 15.0, 17.0, 18.0, 36.0]
    second = [(i.paid_from_s, i.live_from_s, i.retire_s, i.end_s) for i in out.incarnations if i.replica == 1]
    assert second == [(10.0, 15.0, 30.0, 30.0)]
    assert out.windows["utilisation"] == pytest.approx([0.75, 5.5 / 15.0, 0.0, 0.1], rel=1e-12)
    assert out.windows["live"] == pytest.approx([1.0, 1.5, 2.0, 1.0], rel=1e-12)
    assert out.windows["start_s"] == [0.0, 10.0, 20.0, 30.0]
    record = out.to_dict()
    assert (record["decided_in"], record["passes"], record["converged"]) == ("event_loop", 1, True)
