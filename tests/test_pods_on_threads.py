"""Pods on threads (pipeline/engine/shard.py, executor ``thread``): the same results and step log
as one engine, pods handed back in order, progress that only grows, a pod's own error raised
(not the others' stop), a cancelled run that stops its loops; the cut of a pod's chains; how
many pods a replay runs in of its own accord, and what the estimate holds for them."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import _EXAMPLES
from test_engine_support import LinearCost
from test_shard import _lockstep_fleet, _PartLog, _same, _state_fleet, _static_cases

from pipeline.common import system
from pipeline.engine import jit, shard
from pipeline.engine.jit import Cancelled, simulate_jit
from pipeline.engine.model import FleetSpec, Workload
from pipeline.engine.shard import simulate_sharded
from pipeline.engine.steplog import StepLog
from pipeline.replay.run import StepSums


@pytest.fixture
def cores(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set the usable cores the thread executor sees (on a 1-core machine too)."""

    def set_cores(n: int) -> None:
        monkeypatch.setattr(system, "usable_cores", lambda: n)

    return set_cores


@settings(
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(_static_cases(), st.integers(2, 5))
def test_pods_on_threads_equal_one_engine(cores: Any, case: tuple[Workload, FleetSpec, object, int], n: int) -> None:
    """Random static days (round robin, session affinity; open or offline; prefix caching,
    chunked prefill, preemption as _cases draws them) in 2-8 pods on 2-5 threads: every result
    and every step-log row as the one engine's, the log's sums pod by pod to the bit."""
    cores(n)
    w, spec, cost, pods = case
    log_one, log_pods = StepLog(), _PartLog()
    one = simulate_jit(w, spec, cost, log_one)  # type: ignore[arg-type]
    threaded = simulate_sharded(w, spec, cost, log_pods, pods, executor="thread")  # type: ignore[arg-type]
    _same(one, threaded, log_one, log_pods)
    whole = StepSums()
    whole.add(log_one.columns())
    assert whole == log_pods.sums


def test_pods_on_threads_come_back_in_order_with_growing_progress(cores: Any) -> None:
    """Four pods on three threads: handed back in the pods' order (their first replicas rise),
    progress reported while they run never falls and ends at every request, and the results
    and log equal the pods run one after another."""
    cores(3)
    w, spec = _lockstep_fleet()
    cost = LinearCost()
    seen: list[int] = []
    firsts: list[int] = []
    log_t, log_l = StepLog(), StepLog()
    res = jit.EngineResult.empty(w.n)
    for rows, sub in shard.sharded_results(w, spec, cost, log_t, 4, "thread", seen.append):
        ran = sub.replica[sub.replica >= 0]
        firsts.append(int(ran.min()))
        shard.put_back(res, rows, sub)
    local = simulate_sharded(w, spec, cost, log_l, 4)
    _same(local, res, log_l, log_t)
    assert firsts == sorted(firsts) and len(firsts) == 4
    assert seen and seen == sorted(seen) and seen[-1] == w.n


def test_pods_start_no_further_ahead_than_the_caller_takes_them(cores: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Six pods on two threads, a caller that takes its time with each: a pod starts only while
    fewer than two are started and not yet handed back (memory holds two pods, as the estimate
    counts), so after taking pod i at most i + 3 have started; all six come back, in order."""
    cores(2)
    w, spec = _lockstep_fleet()
    real = shard.run_pod
    started: list[int] = []

    def counted(pod: Any, cost: Any, want_log: bool, progress: Any = None) -> Any:
        started.append(pod.first)
        return real(pod, cost, want_log, progress)

    monkeypatch.setattr(shard, "run_pod", counted)
    firsts = []
    for i, (_rows, sub) in enumerate(shard.sharded_results(w, replace(spec, lockstep=1), LinearCost(), StepLog(), 6,
                                                            "thread")):  # fmt: skip
        time.sleep(0.3)  # a slow writer: the pods must wait for it, not pile up
        assert len(started) <= i + 3, (i, started)
        ran = sub.replica[sub.replica >= 0]
        firsts.append(int(ran.min()))
    assert len(started) == 6 and firsts == sorted(firsts)


def test_a_pods_own_error_is_raised_not_the_others_stop(cores: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pod 2 of 4 fails: its error is what the caller sees (pods stopped because of it raise
    Cancelled, which never surfaces), and every pod thread has ended."""
    cores(2)
    w, spec = _lockstep_fleet()
    real = shard.run_pod

    def failing(pod: Any, cost: Any, want_log: bool, progress: Any = None) -> Any:
        if pod.first == 4:
            raise ValueError("pod at replica 4 broke")
        return real(pod, cost, want_log, progress)

    monkeypatch.setattr(shard, "run_pod", failing)
    with pytest.raises(ValueError, match="pod at replica 4 broke"):
        simulate_sharded(w, spec, LinearCost(), StepLog(), 4, executor="thread")
    assert not [t for t in threading.enumerate() if t.name.startswith("rooftrace-pod-")]


def test_closing_the_pods_early_stops_the_running_loops(cores: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller stops after the first pod (an interrupt, a failed write): the pods still
    running are told to stop at their next progress poll, and their threads end."""
    cores(2)
    w, spec = _lockstep_fleet()
    real = shard.run_pod
    stopped: list[int] = []

    def endless(pod: Any, cost: Any, want_log: bool, progress: Any = None) -> Any:
        if pod.first == 0:
            return real(pod, cost, want_log, progress)
        try:
            while True:  # a loop that only its progress callback can stop, as the engine's poll
                progress(0)
                time.sleep(0.005)
        except Cancelled:
            stopped.append(pod.first)
            raise

    monkeypatch.setattr(shard, "run_pod", endless)
    runs = shard.sharded_results(w, spec, LinearCost(), StepLog(), 4, "thread")
    rows, _sub = next(runs)
    assert rows.shape[0] > 0
    runs.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("rooftrace-pod-")]
    assert stopped and 0 not in stopped


def test_a_cancelled_progress_stops_the_compiled_loop() -> None:
    """jit._run_in_thread: a progress callback raising Cancelled sets the loop's cancel flag,
    waits for the loop to stop and re-raises, as a KeyboardInterrupt does."""
    ctl = np.zeros(2)
    ended = threading.Event()

    def kernel() -> str:
        while ctl[0] == 0.0:
            time.sleep(0.001)
        ended.set()
        return "stopped"

    def progress(done: int) -> None:
        raise Cancelled

    with pytest.raises(Cancelled):
        jit._run_in_thread(kernel, (), ctl, progress)
    assert ctl[0] == 1.0 and ended.is_set()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=30), st.data(), st.sampled_from([np.int32, np.int64]))
def test_a_pods_chains_are_the_days_rows_chains(lengths: list[int], data: Any, dtype: Any) -> None:
    """shard._subset's gather: the chosen rows' chains, one after another, as numpy's take of
    each row's slice, and the offsets their lengths' running sum."""
    n = len(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    hashes = np.arange(1, int(offsets[-1]) + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    rows = np.asarray(sorted(data.draw(st.sets(st.integers(0, n - 1)))), dtype=dtype)
    w = Workload(
        arrival_s=np.arange(n, dtype=np.float64),
        prompt_tokens=np.full(n, 200, np.int64),
        output_tokens=np.ones(n, np.int64),
        chain_hashes=hashes,
        chain_offsets=offsets,
    )
    sub = shard._subset(w, rows, False)
    want = [hashes[offsets[r] : offsets[r + 1]] for r in rows.tolist()]
    flat = np.concatenate(want) if want else np.zeros(0, np.uint64)
    np.testing.assert_array_equal(sub.chain_hashes, flat)
    assert sub.offsets().tolist() == np.concatenate([[0], np.cumsum([len(x) for x in want])]).tolist()


def test_auto_pods_a_core_each_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the thread executor's cores: a pod a core from AUTO_THREAD_REQUESTS requests on,
    rounded up to a multiple of the cores when the state asks for more (no pod runs alone at
    the end), never more than the fleet's lockstep groups, never when the routes are not static."""
    monkeypatch.setattr(shard, "AUTO_POD_STATE_BYTES", 1 << 40)  # the state never asks
    many, few = shard.AUTO_THREAD_REQUESTS, shard.AUTO_THREAD_REQUESTS - 1
    assert shard.auto_pods(_state_fleet(16), many, lambda: True, cores=2) == 2
    assert shard.auto_pods(_state_fleet(16), many, lambda: True, cores=1) == 1
    assert shard.auto_pods(_state_fleet(16), few, lambda: True, cores=2) == 1  # small: one engine
    assert shard.auto_pods(_state_fleet(16), many, lambda: False, cores=2) == 1  # least outstanding
    assert shard.auto_pods(_state_fleet(3), many, lambda: True, cores=8) == 3  # a replica a pod at most
    assert shard.auto_pods(_state_fleet(8, lockstep=4), many, lambda: True, cores=4) == 2  # two groups
    # the state asks for 72 pods (test_shard's count by hand): 72 on 2 or 4 cores, 75 on 5
    monkeypatch.setattr(shard, "AUTO_POD_STATE_BYTES", 1_000_000)
    assert shard.auto_pods(_state_fleet(1000), 15, lambda: True) == 72
    assert shard.auto_pods(_state_fleet(1000), 15, lambda: True, cores=4) == 72
    assert shard.auto_pods(_state_fleet(1000), 15, lambda: True, cores=5) == 75
    # a streamed log of 10⁷ requests asks for 20: 21 on 3 cores
    monkeypatch.setattr(shard, "AUTO_POD_STATE_BYTES", 1 << 40)
    assert shard.auto_pods(_state_fleet(1000), 10**7, lambda: True, streamed=True, cores=3) == 21
    assert shard.thread_workers(21, "thread") == min(21, system.usable_cores())
    assert shard.thread_workers(21, "local") == 1 and shard.thread_workers(0, "thread") == 1


def test_usable_cores_is_the_affinity_mask() -> None:
    import os

    want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert system.usable_cores() == max(1, want or 1)


def test_the_estimate_holds_a_pod_a_thread(cores: Any) -> None:
    """estimate_replay of a round-robin day in 4 pods: the thread executor on 2 cores holds two
    pods' engine state and step log at once, one engine's worth in time halved; local one."""
    from test_accounting import requests_frame

    from pipeline.replay.fleet import parse_fleet, resolve
    from pipeline.replay.limits import estimate_replay

    cores(2)
    fleet = resolve(parse_fleet({"name": "f", "model": "llama-3.1-8b", "hardware": "h100-sxm", "replicas": 8,
                                 "router": "round_robin"}, "f"))  # fmt: skip
    day = requests_frame([{"t": i * 0.01, "recorded_input_tokens": 500, "output_tokens": 50} for i in range(2000)])
    local = estimate_replay(day, fleet, "open", 1.0, None, pods=4)
    threads = estimate_replay(day, fleet, "open", 1.0, None, pods=4, executor="thread")
    per_request = 16 * 2000
    assert threads.parts["engine state"] - per_request == 2 * (local.parts["engine state"] - per_request)
    assert threads.parts["step log"] == pytest.approx(2 * local.parts["step log"], rel=1e-9)
    assert threads.seconds < local.seconds
    assert threads.pod_replicas == local.pod_replicas == 2


def test_a_large_static_day_runs_a_pod_a_core(cores: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_workload with the thread executor and no --pods: a static day of at least
    AUTO_THREAD_REQUESTS requests runs in a pod a core, with the one engine's results; the local
    executor keeps one engine."""
    from pipeline.replay.fleet import parse_fleet, resolve
    from pipeline.replay.run import ReplayOptions, run_workload

    cores(2)
    monkeypatch.setattr(shard, "AUTO_THREAD_REQUESTS", 100)
    w, _spec = _lockstep_fleet()
    w = replace(w, chain_hashes=np.zeros(0, np.uint64), chain_offsets=None)
    fleet = resolve(parse_fleet({"name": "f", "model": "llama-3.1-8b", "hardware": "h100-sxm", "replicas": 4,
                                 "router": "round_robin"}, "f"))  # fmt: skip
    one = run_workload(w, fleet, ReplayOptions())
    two = run_workload(w, fleet, ReplayOptions(executor="thread"))
    assert (one.pods, two.pods) == (1, 2)
    for name in ("replica", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(one.result, name), getattr(two.result, name), err_msg=name)


def test_replay_says_its_pods_ran_on_threads(cores: Any, tmp_path: Any) -> None:
    """`rooftrace replay --pods 3` says where the pods ran: on threads by default (as many as the
    usable cores, at most the pods), one after another with --executor local; the same run."""
    from click.testing import CliRunner
    from test_shard import _round_robin_store

    from pipeline.cli import main

    cores(2)
    store, fleet = _round_robin_store(tmp_path, 300, seed=5, replicas=4)
    base = ["replay", "--store", str(store.root), "--fleet", str(fleet), "--pods", "3"]
    threads = CliRunner().invoke(main, base)
    local = CliRunner().invoke(main, [*base, "--executor", "local"])
    assert threads.exit_code == 0 and local.exit_code == 0, threads.output + local.output
    assert "in 3 pods on 2 threads" in threads.stderr
    assert "in 3 pods" in local.stderr and "threads" not in local.stderr
    assert len(list((store.root / "runs").iterdir())) == 1  # the same run id: one run, written twice
