"""A fleet replayed in pods (pipeline/engine/shard.py) equals the single-process replay bit for
bit when the router keeps no shared state; the other routers are refused, not approximated."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import _EXAMPLES, _cases
from test_engine_support import LinearCost, workload

from pipeline.common.errors import ConfigError
from pipeline.engine.jit import simulate_jit
from pipeline.engine.model import EngineResult, FleetSpec, SchedulerConfig, Workload
from pipeline.engine.shard import hierarchical_pods, plan_pods, pod_cuts, simulate_sharded, static_routes
from pipeline.engine.steplog import StepLog
from pipeline.replay.run import StepSums

FIELDS = ("arrival_s", "replica", "scheduled_s", "first_token_s", "finish_s", "max_itl_s", "preemptions",
          "cache_hit_tokens", "prefill_tokens", "reject_reason")  # fmt: skip


def _same(a: EngineResult, b: EngineResult, log_a: StepLog, log_b: StepLog) -> None:
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    ca, cb = log_a.columns(), log_b.columns()
    for name in ca:
        np.testing.assert_array_equal(ca[name], cb[name], err_msg=f"log {name}")


class _PartLog(StepLog):
    """A step log that also sums the rows it is handed pod by pod (as RunSteps does)."""

    def __init__(self) -> None:
        super().__init__()
        self.sums = StepSums()

    def extend_rows(self, rows: np.ndarray) -> None:
        super().extend_rows(rows)
        part = StepLog()
        part.extend_rows(rows)
        self.sums.add(part.columns())


@st.composite
def _static_cases(draw: st.DrawFn) -> tuple[Workload, FleetSpec, object, int]:
    w, spec, cost = draw(_cases())
    n = w.n
    # every request has an affinity key, so the affinity router is static too
    w = replace(w, affinity=np.asarray(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), np.int64))
    spec = replace(
        spec,
        replicas=draw(st.integers(1, 7)),
        router=draw(st.sampled_from(["round_robin", "session_affinity"])),
        mode=draw(st.sampled_from(["open", "offline"])),
    )
    return w, spec, cost, draw(st.integers(2, 8))


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_static_cases())
def test_pods_equal_one_process(case: tuple[Workload, FleetSpec, object, int]) -> None:
    w, spec, cost, pods = case
    log_one, log_pods = StepLog(), _PartLog()
    one = simulate_jit(w, spec, cost, log_one)  # type: ignore[arg-type]
    sharded = simulate_sharded(w, spec, cost, log_pods, pods)  # type: ignore[arg-type]
    _same(one, sharded, log_one, log_pods)
    whole = StepSums()
    whole.add(log_one.columns())
    assert whole == log_pods.sums  # the summary's sums, pod by pod, to the bit
    routes = static_routes(w, spec)
    assert routes is not None
    ok = one.reject_reason == 0
    np.testing.assert_array_equal(routes[ok], one.replica[ok])  # the router's own choices


def _lockstep_fleet() -> tuple[Workload, FleetSpec]:
    rng = np.random.default_rng(3)
    n = 300
    w = workload(
        np.cumsum(rng.exponential(0.02, n)),
        rng.integers(1, 400, n),
        rng.integers(1, 80, n),
        chains=[[int(x) for x in rng.integers(0, 4, 1)] + [10**6 + 10 * i + j for j in range(2)] for i in range(n)],
    )
    cfg = SchedulerConfig(num_gpu_blocks=200, max_model_len=600, max_num_seqs=8, max_num_batched_tokens=256,
                          block_size=16, enable_chunked_prefill=True, enable_prefix_caching=True)  # fmt: skip
    return w, FleetSpec(replicas=8, scheduler=cfg, router="round_robin", lockstep=2)


def test_pods_hold_whole_lockstep_groups() -> None:
    w, spec = _lockstep_fleet()
    assert pod_cuts(8, 2, 3).tolist() == [0, 2, 4, 8]
    assert pod_cuts(8, 2, 100).tolist() == [0, 2, 4, 6, 8]
    assert [p.spec.replicas for p in plan_pods(w, spec, 3)] == [2, 2, 4]
    cost = LinearCost()
    log_one, log_pods = StepLog(), StepLog()
    _same(simulate_jit(w, spec, cost, log_one), simulate_sharded(w, spec, cost, log_pods, 3), log_one, log_pods)


def test_stateful_routing_and_the_closed_loop_are_refused() -> None:
    w, spec = _lockstep_fleet()
    with pytest.raises(ConfigError, match="least_outstanding"):
        plan_pods(w, replace(spec, router="least_outstanding"), 2)
    with pytest.raises(ConfigError, match="closed loop"):
        plan_pods(w, replace(spec, mode="closed", concurrency=4), 2)
    keyless = replace(w, affinity=np.full(w.n, -1, np.int64))
    with pytest.raises(ConfigError, match="no affinity key"):
        plan_pods(keyless, replace(spec, router="session_affinity"), 2)


@pytest.mark.parametrize("executor", ["process", "ray"])
def test_executors_equal_local(executor: str) -> None:
    if executor == "ray":
        ray = pytest.importorskip("ray", reason="ray is the optional extra rooftrace[ray]; not installed here")
        ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    try:
        w, spec = _lockstep_fleet()
        cost = LinearCost()
        log_local, log_other = StepLog(), StepLog()
        local = simulate_sharded(w, spec, cost, log_local, 4)
        other = simulate_sharded(w, spec, cost, log_other, 4, executor=executor)
        _same(local, other, log_local, log_other)
    finally:
        if executor == "ray":
            ray.shutdown()


def _round_robin_store(tmp_path: Path, requests: int, seed: int, replicas: int) -> tuple[Any, Path]:
    """A store holding a synthetic day, and the default fleet as round robin over ``replicas``."""
    from pipeline.ingest import ingest_logs
    from pipeline.ingest.store import Store
    from pipeline.synth import SynthConfig, generate, write_logs

    store = Store(tmp_path / "store")
    write_logs(generate(SynthConfig(requests=requests, seed=seed, duration_s=600)), "openai", tmp_path / "d.jsonl")
    ingest_logs([tmp_path / "d.jsonl"], store)
    default = (Path(__file__).resolve().parents[1] / "fleets" / "default.toml").read_text()
    fleet = tmp_path / "rr.toml"
    fleet.write_text(default.replace('router = "least_outstanding"', 'router = "round_robin"').replace(
        "replicas = 2", f"replicas = {replicas}"))  # fmt: skip
    return store, fleet


@pytest.mark.parametrize("router", ["round_robin", "session_affinity"])
def test_store_replay_in_pods_writes_the_same_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, router: str) -> None:
    """``rooftrace replay --pods 3`` on a round-robin or session-affinity fleet: the same run id
    and the same bytes in every table the run writes (the pods' per-request results spooled and
    read back a chunk of rows at a time, row groups cut across chunks); least outstanding is one
    error line."""
    from click.testing import CliRunner

    from pipeline.cli import main
    from pipeline.common import schemas
    from pipeline.replay import runrequests

    monkeypatch.setattr(runrequests, "CHUNK_ROWS", 70)
    monkeypatch.setattr(schemas, "ROW_GROUP_ROWS", 50)

    store, fleet = _round_robin_store(tmp_path, 400, seed=4, replicas=5)
    fleet.write_text(fleet.read_text().replace('router = "round_robin"', f'router = "{router}"'))
    default = (Path(__file__).resolve().parents[1] / "fleets" / "default.toml").read_text()
    runner = CliRunner()
    base = ["replay", "--store", str(store.root), "--fleet", str(fleet), "--json"]
    one = runner.invoke(main, base)
    assert one.exit_code == 0, one.output
    run_dir = Path(json.loads(one.stdout)["run_dir"])
    files = {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}
    pods = runner.invoke(main, [*base, "--pods", "3"])
    assert pods.exit_code == 0, pods.output
    assert Path(json.loads(pods.stdout)["run_dir"]) == run_dir
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(files)  # no spool left behind
    for name, data in files.items():
        if name == "config.json":  # records how it ran: the pods, and nothing else differs
            before, after = json.loads(data), json.loads((run_dir / name).read_text())
            assert (before["options"]["pods"], after["options"]["pods"]) == (1, 3)
            for doc in (before, after):
                doc["options"].pop("pods")
            assert before == after
        else:
            assert (run_dir / name).read_bytes() == data, name
    fleet.write_text(default)
    bad = runner.invoke(main, [*base[:-1], "--pods", "2"])
    assert bad.exit_code == 1 and "cannot be replayed in pods exactly" in bad.output
    assert "least_outstanding" in bad.output and "Traceback" not in bad.output


def _busy_fleet(router: str, replicas: int = 12, n: int = 1500) -> tuple[Workload, FleetSpec]:
    rng = np.random.default_rng(8)
    w = workload(
        np.cumsum(rng.exponential(0.004, n)),
        rng.integers(20, 600, n),
        rng.integers(5, 120, n),
        affinity=[int(x) for x in rng.integers(0, 90, n)],
    )
    cfg = SchedulerConfig(num_gpu_blocks=300, max_model_len=800, max_num_seqs=16, max_num_batched_tokens=512,
                          block_size=16, enable_chunked_prefill=True, enable_prefix_caching=False)  # fmt: skip
    return w, FleetSpec(replicas=replicas, scheduler=cfg, router=router)


@pytest.mark.parametrize("router", ["least_outstanding", "round_robin", "session_affinity"])
def test_hierarchical_routing(router: str) -> None:
    """A load balancer over pods, the router inside each: one pod as big as the fleet is the flat
    router exactly; smaller pods get the requests round robin (or by key) and replay alone."""
    w, spec = _busy_fleet(router)
    cost = LinearCost()
    flat_log, one_pod_log = StepLog(), StepLog()
    flat = simulate_jit(w, spec, cost, flat_log)
    _same(flat, simulate_sharded(w, spec, cost, one_pod_log, 1, pod_ranks=12), flat_log, one_pod_log)

    pods = hierarchical_pods(w, spec, 4)
    assert [(p.first, p.spec.replicas) for p in pods] == [(0, 4), (4, 4), (8, 4)]
    assert sorted(np.concatenate([p.rows for p in pods]).tolist()) == list(range(w.n))
    log = StepLog()
    res = simulate_sharded(w, spec, cost, log, 1, pod_ranks=4)
    for p in pods:  # each pod is its own fleet behind its own router
        alone = simulate_jit(p.work, p.spec, cost)
        np.testing.assert_array_equal(res.finish_s[p.rows], alone.finish_s)
        assert ((res.replica[p.rows] >= p.first) & (res.replica[p.rows] < p.first + 4)).all()
    sizes = [p.rows.shape[0] for p in pods]
    if router == "session_affinity":
        keys = w.affinity
        assert keys is not None
        for key in np.unique(keys):  # one key, one replica: the balancer and the pod router agree
            assert np.unique(res.replica[keys == key]).shape[0] == 1
    else:
        assert max(sizes) - min(sizes) <= 1  # round robin over pods
    if router == "least_outstanding":  # the pods differ from the flat router: that is the model
        assert not np.array_equal(res.finish_s, flat.finish_s)


def test_router_pod_size_in_fleet_toml(tmp_path: Path) -> None:
    from pipeline.replay.fleet import load_fleet

    default = (Path(__file__).resolve().parents[1] / "fleets" / "default.toml").read_text()
    good = tmp_path / "good.toml"
    lo = 'router = "least_outstanding"'
    good.write_text(default.replace(lo, f"{lo}\nrouter_pod_size = 8"))
    assert load_fleet(good).router_pod_size == 8
    bad = tmp_path / "bad.toml"
    bad.write_text(default.replace(lo, f"{lo}\nrouter_pod_size = -2"))
    with pytest.raises(ConfigError, match="router_pod_size must be >= 0"):
        load_fleet(bad)


def test_nightly_passes_jobs_and_pods_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``rooftrace nightly --jobs 2 --pods 3 --executor process`` reaches ingest and the replay."""
    import pipeline.publish.nightly as nightly_mod
    from pipeline.cli import main

    seen: dict[str, object] = {}

    def fake_ingest(*_a: object, **k: object) -> object:
        seen["jobs"] = k["jobs"]
        raise RuntimeError("stop here")

    monkeypatch.setattr(nightly_mod, "ingest_logs", fake_ingest)
    from click.testing import CliRunner

    fleet = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"
    args = ["nightly", str(tmp_path), "--fleet", str(fleet), "--store", str(tmp_path / "s"), "--jobs", "2"]
    CliRunner().invoke(main, [*args, "--pods", "3", "--executor", "process"])
    assert seen["jobs"] == 2
    from pipeline.replay.run import ReplayOptions

    captured: list[ReplayOptions] = []
    monkeypatch.setattr(nightly_mod, "ingest_logs", lambda *_a, **_k: type("S", (), {"errors": [], "files": []})())
    monkeypatch.setattr(nightly_mod, "classify_tokens", lambda *_a, **_k: None)
    monkeypatch.setattr(nightly_mod.Store, "resolve_date", lambda *_a: "2025-01-01")

    def fake_replay(_store: object, _fleet: object, options: ReplayOptions, progress: object = None) -> object:
        captured.append(options)
        raise RuntimeError("stop here")

    monkeypatch.setattr(nightly_mod, "replay", fake_replay)
    CliRunner().invoke(main, [*args, "--pods", "3", "--executor", "process"])
    assert captured and (captured[0].pods, captured[0].executor) == (3, "process")


def test_unreachable_ray_cluster_is_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray", reason="ray is the optional extra rooftrace[ray]; not installed here")
    from pipeline.common.errors import RooftraceError
    from pipeline.engine.shard import ray_connect

    def refuse(**_: object) -> None:
        raise ConnectionError("Could not find any running Ray instance.\nsecond line")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(RooftraceError) as err:
        ray_connect("auto")
    assert str(err.value) == (
        "--executor ray: cannot start or reach Ray at auto: Could not find any running Ray instance."
    )


def test_a_ray_address_nobody_listens_on_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--ray-address 127.0.0.1:1`` used to retry for minutes inside ray.init (a hostile test
    killed it after 120 s); a port that does not answer is now one error line, before Ray is
    asked (the real ray.init would hang the test, so it fails the test if called)."""
    import socket
    import time

    from pipeline.common.errors import RooftraceError
    from pipeline.engine import shard

    monkeypatch.setattr(shard, "RAY_CONNECT_TIMEOUT_S", 2.0)
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(RooftraceError, match=rf"cannot reach Ray at {address}: Connection refused"):
            shard._check_reachable(address)
    assert time.monotonic() - t0 < 30
    shard._check_reachable("auto")  # left to Ray
    shard._check_reachable(None)


@pytest.mark.parametrize("router", ["round_robin", "session_affinity"])
def test_pods_without_requests_are_never_built(router: str) -> None:
    """A million replicas in a million pods (or routing pods of one replica) for 40 requests: only
    the pods that receive a request are built and replayed (one sort, not one scan per pod), and
    the result is the one-process replay's."""
    w, spec = _busy_fleet(router, replicas=1_000_000, n=40)
    cost = LinearCost()
    pods = plan_pods(w, spec, 1_000_000)
    assert 0 < len(pods) <= 40 and all(p.rows.size for p in pods)
    assert sorted(np.concatenate([p.rows for p in pods]).tolist()) == list(range(w.n))
    flat_log, pod_log = StepLog(), StepLog()
    _same(simulate_jit(w, spec, cost, flat_log), simulate_sharded(w, spec, cost, pod_log, 1_000_000), flat_log, pod_log)
    tiny = hierarchical_pods(w, spec, 1)
    assert 0 < len(tiny) <= 40 and all(p.spec.replicas == 1 for p in tiny)
    res = simulate_sharded(w, spec, cost, None, 1, pod_ranks=1)
    assert all(((res.replica[p.rows] == p.first) | (res.replica[p.rows] < 0)).all() for p in tiny)


def test_a_run_in_pods_streams_its_step_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``replay --pods``: each pod's step log is written to the run's steps and series tables as
    the pod finishes and never gathered (the run's in-memory log stays empty); the tables equal
    those of the run kept whole; a run interrupted mid-way leaves no partial file."""
    from pipeline.common import schemas
    from pipeline.common.schemas import read_parquet
    from pipeline.replay import run as replay_module
    from pipeline.replay.fleet import load_fleet, resolve
    from pipeline.replay.run import ReplayOptions, RunSteps, replay, run_replay, series_table, steps_table

    store, fleet_path = _round_robin_store(tmp_path, 300, seed=9, replicas=6)
    fleet = resolve(load_fleet(fleet_path), str(fleet_path))
    requests = store.read_requests(store.resolve_date(None))
    whole = run_replay(requests, fleet, ReplayOptions())
    monkeypatch.setattr(schemas, "ROW_GROUP_ROWS", 50)  # several row groups, cut across pods
    monkeypatch.setattr(replay_module, "STEP_CHUNK_ROWS", 30)  # and several chunks of replicas per pod
    sink = RunSteps(tmp_path / "run", fleet, 0)
    streamed = run_replay(requests, fleet, ReplayOptions(pods=3), steps=sink)
    sink.close()
    assert streamed.log.n == 0 and sink.sums.spans == whole.log.n > 100
    assert sink.sums == whole.step_sums()
    got = read_parquet(tmp_path / "run" / "steps.parquet", "replay_steps")
    assert got.equals(schemas.conform(steps_table(whole), "replay_steps"))
    got = read_parquet(tmp_path / "run" / "series.parquet", "replay_series")
    assert got.equals(schemas.conform(series_table(whole, 0), "replay_series"))

    calls = {"n": 0}
    extend = RunSteps.extend_rows

    def interrupted(self: RunSteps, rows: np.ndarray) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        extend(self, rows)

    monkeypatch.setattr(RunSteps, "extend_rows", interrupted)
    with pytest.raises(KeyboardInterrupt):
        replay(store, fleet_path, ReplayOptions(pods=3))
    runs = store.root / "runs"
    assert not (runs.exists() and list(runs.iterdir())), list(runs.rglob("*"))  # nothing half-written


@given(sizes=st.lists(st.integers(1, 40), max_size=30), rows=st.integers(1, 60))
def test_replica_chunks_hold_whole_replicas(sizes: list[int], rows: int) -> None:
    from pipeline.replay.run import _replica_chunks

    replica = np.repeat(np.arange(len(sizes)), sizes)
    cuts = _replica_chunks(replica, rows)
    ends = [0, *(b for _, b in cuts)]
    assert [a for a, _ in cuts] == ends[:-1] and ends[-1] == replica.size  # consecutive, cover all
    for a, b in cuts:
        assert a < b and (a == 0 or replica[a] != replica[a - 1])  # starts a replica
        assert b - a <= rows or replica[a] == replica[b - 1]  # too long only for one replica
        # and no chunk stops short when the next replica would still have fit
        if b < replica.size:
            nxt = int(np.searchsorted(replica, replica[b], side="right"))
            assert nxt - a > rows


@pytest.mark.parametrize("when", ["write", "close", "finish", "commit"])
def test_a_full_disk_while_the_step_log_streams_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The step log is written during the replay: a failed write (here ENOSPC) is one ``error:``
    line naming the run's folder, exit code 1, no traceback, and no partial file left."""
    import errno

    from click.testing import CliRunner

    from pipeline.cli import main
    from pipeline.common.schemas import ParquetStream

    store, _ = _round_robin_store(tmp_path, 120, seed=2, replicas=2)
    real = getattr(ParquetStream, when)

    def full(self: ParquetStream, *args: object) -> object:
        real(self, *args)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ParquetStream, when, full)
    res = CliRunner().invoke(main, ["replay", "--store", str(store.root)])
    assert res.exit_code == 1, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "runs" in lines[0], res.stderr
    assert "Traceback" not in res.output + res.stderr
    runs = store.root / "runs"
    leftovers = [p for p in runs.rglob("*")] if runs.exists() else []
    assert not leftovers, leftovers  # nor half a run (tables moved into place, no config.json)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 9).flatmap(
        lambda pods: st.tuples(
            st.just(pods),
            st.lists(st.integers(1, 4), min_size=pods, max_size=pods),
            st.lists(st.integers(-1, 40), max_size=40),
        )
    ),
    st.sampled_from([np.int32, np.int64]),
    st.booleans(),
)
def test_rows_by_pod_is_a_stable_sort_by_pod(case: tuple[int, list[int], list[int]], dtype: Any, by_cut: bool) -> None:
    """The grouping that cuts pods (a counting sort into 4-byte rows, or a sort of the requests
    when pods outnumber them) gives each pod exactly the rows a stable sort by pod gives: by the
    replica range holding a request's route, or by its key as the pod; a rejected request (−1)
    in pod 0; no pod without rows."""
    from pipeline.engine.shard import _rows_by_pod

    pods, sizes, raw = case
    cuts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    top = int(cuts[-1]) if by_cut else pods
    keys = np.array([k if k < 0 else k % top for k in raw], dtype)
    want_pod = [0 if k < 0 else (int(np.searchsorted(cuts, k, "right")) - 1 if by_cut else int(k)) for k in keys]
    got = list(_rows_by_pod(keys, cuts if by_cut else np.zeros(0, np.int64), pods))
    want = [(p, [i for i, q in enumerate(want_pod) if q == p]) for p in sorted(set(want_pod))]
    assert [p for p, _ in got] == [p for p, _ in want]
    for (_, rows), (_, expect) in zip(got, want, strict=True):
        assert rows.dtype == np.int32
        assert rows.tolist() == expect


@pytest.mark.parametrize("router", ["round_robin", "session_affinity"])
def test_routes_of_a_fleet_past_int32_keep_their_replica(router: str) -> None:
    """Routes are 4-byte numbers only when every replica number fits: on a fleet of more than 2³¹
    engines, here 2³³ (the cutting code alone; FLEET.toml refuses such a fleet) round robin's routes and
    the affinity routers' hashed replicas are the int64 ones, never wrapped to negative
    (rejected) or to another replica."""
    from pipeline.engine.jit import affinity_replicas

    w, spec = _busy_fleet(router, replicas=2**33, n=40)
    routes = static_routes(w, spec)
    assert routes is not None and routes.dtype == np.int64
    if router == "round_robin":
        assert routes.tolist() == list(range(40))
    else:
        want = affinity_replicas(np.asarray(w.affinity, np.int64), spec.replicas)
        assert routes.tolist() == want.tolist() and int(routes.max()) >= 2**31
    pods = plan_pods(w, spec, 3)
    got = {int(r): p.first + int(p.routes[j]) for p in pods for j, r in enumerate(p.rows.tolist())}  # type: ignore[index]
    assert got == {i: int(routes[i]) for i in range(40)}


def test_a_fleet_of_more_engines_than_4_bytes_number_is_refused() -> None:
    """replicas × dp past 2³¹ − 1 is one error line (the replay numbers engines in 4 bytes), from
    FLEET.toml, --replicas and plan's --max-replicas alike."""
    from pipeline.replay.fleet import MAX_ENGINES, parse_fleet

    base = {"name": "big", "model": "llama-3.1-8b", "hardware": "h100-sxm"}
    assert parse_fleet({**base, "replicas": MAX_ENGINES}, "f.toml").replicas == MAX_ENGINES
    with pytest.raises(ConfigError, match=r"1,073,741,824 replicas × dp 2 = 2,147,483,648 engines, more than"):
        parse_fleet({**base, "replicas": 2**30, "dp": 2}, "f.toml")
    with pytest.raises(ConfigError, match=r"^--replicas 2147483648: "):
        parse_fleet(base, "f.toml").with_replicas(2**31)
    from pipeline.plan.stage import PlanOptions

    with pytest.raises(ConfigError, match=r"--max-replicas must be in 1\.\.2,147,483,647"):
        PlanOptions(model="llama-3.1-8b", hardware=("h100-sxm",), tp=(1,), max_replicas=2**31)


def _state_fleet(replicas: int, router: str = "round_robin", lockstep: int = 1) -> FleetSpec:
    """A prefix-caching fleet whose engine state is hand-countable (jit.state_bytes)."""
    cfg = SchedulerConfig(num_gpu_blocks=1000, block_size=16, max_num_seqs=8, max_model_len=1600,
                          enable_prefix_caching=True)  # fmt: skip
    return FleetSpec(replicas=replicas, scheduler=cfg, router=router, lockstep=lockstep)


def test_auto_pods_count_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per replica: 4 B × 8 seqs × 101 blocks + 25 B × 1,000 blocks + 4 B × a 2,048-slot free
    queue ring + 16 B × a 2,048-slot table = 3,232 + 25,000 + 8,192 + 32,768 = 69,192 B. A 1 MB
    budget holds 14 replicas (968,688 B), or 3 groups of 4 in lockstep (276,768 B a group); the
    pods are counted over the whole fleet, the state over the replicas the requests reach (one per
    request at most)."""
    from pipeline.engine import jit, shard

    assert jit.state_bytes(_state_fleet(1)) == 69_192
    monkeypatch.setattr(shard, "AUTO_POD_STATE_BYTES", 1_000_000)
    asked: list[int] = []

    def static() -> bool:
        asked.append(1)
        return True

    assert shard.auto_pods(_state_fleet(14), 10_000, static) == 1 and not asked  # 968,688 B fit
    assert shard.auto_pods(_state_fleet(1000), 14, static) == 1  # 14 requests reach 14 replicas
    assert shard.auto_pods(_state_fleet(1000), 15, static) == 72  # ⌈1000 / 14⌉
    assert shard.auto_pods(_state_fleet(1000), 10**6, lambda: False) == 1  # routes not static: never
    assert shard.auto_pods(_state_fleet(1000, lockstep=4), 10**6, static) == 84  # ⌈250 groups / 3⌉
    assert shard.auto_pods(_state_fleet(2**31 - 1), 10**9, static) == shard.MAX_PODS
    monkeypatch.setattr(shard, "AUTO_POD_STATE_BYTES", 10)  # not one replica fits: one a pod
    assert shard.auto_pods(_state_fleet(30), 100, static) == 30
    # affinity reaches a lockstep group per request: 4 requests on groups of 4 reach 16 replicas
    monkeypatch.setattr(shard, "AUTO_POD_STATE_BYTES", 15 * 69_192)
    assert shard.auto_pods(_state_fleet(1000, lockstep=4), 4, static) == 1
    assert shard.auto_pods(_state_fleet(1000, "session_affinity", lockstep=4), 4, static) == 84  # 3 groups a pod
    # a streamed step log: about AUTO_POD_REQUESTS requests a pod, at most one pod a replica
    monkeypatch.setattr(shard, "AUTO_POD_STATE_BYTES", 1 << 40)
    assert shard.auto_pods(_state_fleet(1000), 10**7, static, streamed=True) == 20
    assert shard.auto_pods(_state_fleet(1000), 10**7, static) == 1  # held in memory anyway: no cut
    assert shard.auto_pods(_state_fleet(1000), shard.AUTO_POD_REQUESTS, static, streamed=True) == 1
    assert shard.auto_pods(_state_fleet(6), 10**7, static, streamed=True) == 6
    assert shard.auto_pods(_state_fleet(8, lockstep=4), 10**7, static, streamed=True) == 2
    assert shard.auto_pods(_state_fleet(1000, "least_outstanding"), 10**7, lambda: False, streamed=True) == 1
    # one replica past jit.MAX_STATE_BYTES too: still one a pod (the compiled engine runs any
    # state memory holds; pods keep one pod's at a time), lockstep groups a group a pod
    monkeypatch.setattr(shard, "AUTO_POD_STATE_BYTES", 10)
    monkeypatch.setattr(jit, "MAX_STATE_BYTES", 60_000)
    assert shard.auto_pods(_state_fleet(1000), 10**6, static) == 1000
    assert shard.auto_pods(_state_fleet(1000, lockstep=4), 10**6, static) == 250


@pytest.mark.parametrize("router", ["round_robin", "session_affinity", "least_outstanding"])
def test_a_fleet_too_big_for_one_engine_state_replays_in_pods_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, router: str
) -> None:
    """``rooftrace replay`` with no --pods, on a fleet whose busy replicas would hold more engine
    state than shard.AUTO_POD_STATE_BYTES: round robin and session affinity run in pods (a 1000-
    replica round robin on the bundled-size day used to take the Python engine: 9.4 GB, 41 s) and
    write the same bytes as the one-engine run, config.json included; least outstanding, which
    cannot be cut, runs as before. The estimate says which."""
    from click.testing import CliRunner

    from pipeline.cli import main
    from pipeline.engine import shard

    store, fleet = _round_robin_store(tmp_path, 400, seed=5, replicas=12)
    fleet.write_text(fleet.read_text().replace('router = "round_robin"', f'router = "{router}"'))
    runner = CliRunner()
    base = ["replay", "--store", str(store.root), "--fleet", str(fleet), "--json"]
    one = runner.invoke(main, base)
    assert one.exit_code == 0, one.output
    assert json.loads(one.stdout)["engine_pods"] == 1
    run_dir = Path(json.loads(one.stdout)["run_dir"])
    files = {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}
    per = __import__("pipeline.engine.jit", fromlist=["x"]).state_bytes
    from pipeline.replay.fleet import load_fleet, resolve

    resolved = resolve(load_fleet(fleet), str(fleet))
    one_replica = per(FleetSpec(replicas=1, scheduler=resolved.scheduler))
    monkeypatch.setattr(shard, "AUTO_POD_STATE_BYTES", 3 * one_replica)  # pods of 3 replicas
    again = runner.invoke(main, base)
    assert again.exit_code == 0, again.output
    pods = router != "least_outstanding"
    assert json.loads(again.stdout)["engine_pods"] == (4 if pods else 1)
    assert Path(json.loads(again.stdout)["run_dir"]) == run_dir
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(files)
    for name, data in files.items():
        assert (run_dir / name).read_bytes() == data, name


def test_sessions_hashed_to_pods_with_least_outstanding_inside() -> None:
    """FLEET.toml ``router_pod_balancer = "session_affinity"`` under ``least_outstanding``: the
    balancer keeps every session on one pod (by the salted hash of its key), the pod's own
    least-outstanding router spreads it over the pod's replicas, and each pod replays alone."""
    w, spec = _busy_fleet("least_outstanding")
    cost = LinearCost()
    pods = hierarchical_pods(w, spec, 4, "session_affinity")
    by_key = hierarchical_pods(w, replace(spec, router="session_affinity"), 4)  # the default balancer
    assert [p.rows.tolist() for p in pods] == [p.rows.tolist() for p in by_key]  # the same pods
    res = simulate_sharded(w, spec, cost, None, 1, pod_ranks=4, pod_balancer="session_affinity")
    keys = w.affinity
    assert keys is not None
    for key in np.unique(keys):  # a session's requests all in one pod ...
        assert np.unique(res.replica[keys == key] // 4).shape[0] == 1
    # ... but not on one replica: least outstanding balances inside the pod
    assert any(np.unique(res.replica[keys == key]).shape[0] > 1 for key in np.unique(keys))
    for p in pods:  # each pod is least outstanding over its own replicas, alone
        alone = simulate_jit(p.work, p.spec, cost)
        np.testing.assert_array_equal(res.finish_s[p.rows], alone.finish_s)
    # round robin to pods is the default for least outstanding, and differs
    rr = hierarchical_pods(w, spec, 4)
    assert [p.rows.tolist() for p in rr] == [p.rows.tolist() for p in hierarchical_pods(w, spec, 4, "round_robin")]
    assert [p.rows.tolist() for p in rr] != [p.rows.tolist() for p in pods]


def test_router_pod_balancer_in_fleet_toml(tmp_path: Path) -> None:
    from pipeline.replay.fleet import load_fleet

    default = (Path(__file__).resolve().parents[1] / "fleets" / "default.toml").read_text()
    lo = 'router = "least_outstanding"'

    def fleet(extra: str, router: str = lo) -> Path:
        path = tmp_path / "f.toml"
        path.write_text(default.replace(lo, f"{router}\n{extra}"))
        return path

    cfg = load_fleet(fleet('router_pod_size = 1\nrouter_pod_balancer = "session_affinity"'))  # 2 pods of 1
    assert (cfg.pod_balancer(), cfg.affinity_key()) == ("session_affinity", "session_affinity")
    one_pod = load_fleet(fleet('router_pod_size = 8\nrouter_pod_balancer = "session_affinity"'))
    assert one_pod.affinity_key() is None  # one pod as big as the fleet: no balancer, no key needed
    assert "router_pod_balancer" not in one_pod.to_dict()  # ... and no other run id than without it
    assert "router_pod_balancer" in cfg.to_dict()
    plain = load_fleet(fleet("router_pod_size = 8"))
    assert (plain.pod_balancer(), plain.affinity_key()) == ("round_robin", None)
    assert "router_pod_balancer" not in plain.to_dict()  # unset: the recorded fleet (and run id) as before
    for extra, router, message in (
        ('router_pod_size = 8\nrouter_pod_balancer = "random"', lo, "router_pod_balancer 'random' unknown"),
        ('router_pod_balancer = "session_affinity"', lo, "router_pod_balancer needs router_pod_size > 0"),
        (
            'router_pod_size = 8\nrouter_pod_balancer = "session_affinity"',
            'router = "prefix_affinity"',
            "must hash the same key",
        ),
    ):
        path = fleet(extra, router)
        with pytest.raises(ConfigError) as err:
            load_fleet(path)
        assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
