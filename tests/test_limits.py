"""Hardening: paths built from data stay inside the store, and a replay's resources are bounded
(docs/limits.md, "Paths" and "Resource limits")."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_checks import invoke as _invoke
from cli_checks import one_error_line as _one_error_line

from pipeline.common.budget import ResourceLimitError, current_limits, override, parse_days, parse_size
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.ingest.store import Store, confined
from pipeline.replay.fleet import parse_fleet
from pipeline.replay.limits import MAX_MEMORY_ENV, estimate_replay

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FLEET = REPO / "fleets" / "default.toml"
HOSTILE = "../../../../x<script>alert(1)</script>"
DATE = "2025-01-15"


def _tree(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def _own(small: dict[str, Any], tmp_path: Path) -> Store:
    """A copy of the module's store for a test that writes into it (a replay, classify, a report's
    chart cache, a link under runs/): the module's store stays as ingested, whatever the order."""
    return Store(shutil.copytree(small["store"].root, tmp_path / "store", symlinks=True))


def _fleet(path: Path, name: str = "default") -> Path:
    """The default fleet under another name (any string: json.dumps is a valid TOML string)."""
    path.write_text(DEFAULT_FLEET.read_text().replace('name = "default"', f"name = {json.dumps(name)}"))
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store holding 2,000 synthetic requests of one date (ten minutes of traffic)."""
    from pipeline.ingest import ingest_logs
    from pipeline.synth import SynthConfig, generate, write_logs

    root = tmp_path_factory.mktemp("limits")
    log = root / "logs" / "day.jsonl"
    write_logs(generate(SynthConfig(requests=2000, seed=5, duration_s=600, tenants=2)), "openai", log)
    store = Store(root / "work" / "deep" / "store")
    ingest_logs([log], store)
    return {"root": root, "store": store, "log": log}


# -- A. paths built from data are confined --------------------------------------------------------


def test_hostile_fleet_name_is_refused_and_nothing_is_written_outside_the_store(
    small: dict[str, Any], tmp_path: Path
) -> None:
    store: Store = small["store"]
    fleet = _fleet(tmp_path / "evil.toml", HOSTILE)
    top = small["root"]
    before = _tree(top)
    res = _invoke(["replay", "--fleet", str(fleet), "--store", str(store.root)])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert str(fleet) in line and "name" in line and "must be" in line
    new = _tree(top) - before
    assert all(store.root in p.parents for p in new), new
    assert not list(top.glob("x*")) and not list(Path("/tmp").glob("x<script>*"))


def test_nightly_with_a_hostile_fleet_name_writes_nothing_outside_store_and_reports(
    small: dict[str, Any], tmp_path: Path
) -> None:
    store = Store(tmp_path / "a" / "b" / "store")
    reports = tmp_path / "a" / "b" / "reports"
    fleet = _fleet(tmp_path / "evil.toml", HOSTILE)
    before = _tree(tmp_path)
    res = _invoke(
        ["nightly", str(small["log"]), "--fleet", str(fleet), "--store", str(store.root), "--reports", str(reports)]
    )
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert str(fleet) in line and "must be" in line  # refused before the first stage runs
    assert _tree(tmp_path) == before  # nothing written at all


def test_fleet_name_rule() -> None:
    base = {"model": "llama-3.1-8b", "hardware": "h100-sxm"}
    for ok in ("default", "a", "fleet-1.2_x", "9" * 64):
        assert parse_fleet({"name": ok, **base}, "f.toml").name == ok
    for bad in ("", ".hidden", "..", "a/b", "a\\b", "<script>", "x y", "é", "a\nb", "9" * 65):
        with pytest.raises(ConfigError) as exc:
            parse_fleet({"name": bad, **base}, "f.toml")
        message = str(exc.value)
        assert message.startswith("f.toml: name ") and "\n" not in message


def test_cost_refuses_run_ids_that_are_paths(small: dict[str, Any], tmp_path: Path) -> None:
    store: Store = _own(small, tmp_path)  # a link is added under runs/: not in the module's store
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    store.runs_dir.mkdir(parents=True, exist_ok=True)
    (store.runs_dir / "linked").symlink_to(outside, target_is_directory=True)
    before = _tree(small["root"]) | _tree(tmp_path)
    for run_id in ("../../etc", "..", "/etc", "../runs/x", "a/b", ".hidden", "linked"):
        res = _invoke(["cost", "--run", run_id, "--store", str(store.root)])
        assert res.exit_code == 1, run_id
        line = _one_error_line(res.stderr)
        assert repr(run_id) in line and ("not a safe name" in line or "resolves outside" in line), line
    assert _tree(small["root"]) | _tree(tmp_path) == before
    (store.runs_dir / "linked").unlink()


def test_confined() -> None:
    root = Path("/srv/store/runs")
    assert confined(root, "2025-01-15-default-0123456789") == root / "2025-01-15-default-0123456789"
    for bad in ("", ".", "..", "../x", "x/..", "/abs", "a b", "x\x00", "<b>", "x" * 201, ".x"):
        with pytest.raises(RooftraceError, match="not a safe name"):
            confined(root, bad, "run id")


def test_markup_in_fleet_fields_stays_escaped_in_the_report(small: dict[str, Any], tmp_path: Path) -> None:
    from pipeline.publish.report import build_report
    from pipeline.replay.run import ReplayOptions, replay

    fleet = _fleet(tmp_path / "f.toml", "escape-test")
    evil = 'description = "<script>alert(1)</script><img src=x onerror=alert(2)>"'
    fleet.write_text(re.sub(r"^description = .*$", evil, fleet.read_text(), count=1, flags=re.M))
    store = _own(small, tmp_path)
    result = replay(store, fleet, ReplayOptions(date=DATE))
    assert result.run_id.startswith(f"{DATE}-escape-test-")
    out = tmp_path / "report.html"
    build_report(store, result.run_id, DATE, out)
    page = out.read_text()
    assert "escape-test" in page
    assert "<script>alert(1)" not in page and "<img src=x" not in page


# -- B. bounded resources -------------------------------------------------------------------------


def test_parse_size_and_days() -> None:
    assert parse_size("64GiB") == parse_size("64G") == parse_size("64 gb") == 64 * 1024**3
    assert parse_size("512MiB") == 512 * 1024**2
    assert parse_size("1.5T") == int(1.5 * 1024**4)
    assert parse_size("1000") == 1000
    assert parse_size("none") is None and parse_days("off") is None
    assert 0 < (parse_size("50%") or 0) < (parse_size("100%") or 0)
    assert parse_days("30") == 30.0
    for bad in ("", "x", "-1G", "0", "12x", "0%", "101%"):
        with pytest.raises(ValueError):
            parse_size(bad)
    for bad in ("0", "-3", "inf", "nan", "x"):
        with pytest.raises(ValueError):
            parse_days(bad)


def test_limits_come_from_options_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_MEMORY_ENV, raising=False)
    assert "physical memory" in current_limits().memory_origin
    monkeypatch.setenv(MAX_MEMORY_ENV, "2GiB")
    assert current_limits().max_memory == 2 * 1024**3
    with override(max_memory=None, max_sim_days=2.0):
        limits = current_limits()
        assert limits.max_memory is None and limits.max_sim_days == 2.0
    monkeypatch.setenv(MAX_MEMORY_ENV, "lots")
    with pytest.raises(ResourceLimitError, match=MAX_MEMORY_ENV):
        current_limits()


def test_absurd_rate_scale_is_refused_up_front(small: dict[str, Any]) -> None:
    root = str(small["store"].root)
    t0 = time.monotonic()
    res = _invoke(["replay", "--rate-scale", "0.00001", "--store", root])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    arrival = small["store"].read_requests(DATE).get_column("arrival").dt.epoch("us")
    days = (arrival.max() - arrival.min()) / 1e6 / 1e-5 / 86400
    assert f"over {days:,.1f} simulated days, more than the limit of 30 days" in line, line
    assert "--max-sim-days" in line
    assert time.monotonic() - t0 < 60
    # lifting the span limit leaves the memory limit, which names the estimate and its drivers
    res = _invoke(
        ["replay", "--rate-scale", "0.00001", "--max-sim-days", "none", "--max-memory", "1GiB", "--store", root]
    )
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert "more than the limit of 1.0 GiB (--max-memory)" in line and "simulated s" in line, line


def test_replay_past_the_limit_is_refused_up_front(small: dict[str, Any]) -> None:
    before = _tree(small["root"])
    res = _invoke(["replay", "--replicas", "10000000", "--max-memory", "64MiB", "--store", str(small["store"].root)])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert "more than the limit of 64.0 MiB" in line and "engine state of" in line, line
    assert re.search(r"about [0-9.,]+ [MG]iB of memory", line)
    assert _tree(small["root"]) == before


def test_a_huge_fleet_costs_what_its_busy_replicas_cost(small: dict[str, Any], tmp_path: Path) -> None:
    """Ten million replicas for 2,000 requests: least outstanding only ever uses the lowest
    replicas, so the replay runs (no refusal) and gives what 2,000 replicas give."""
    own = _own(small, tmp_path)
    store = str(own.root)
    runs = []
    for replicas in ("10000000", "2000"):
        res = _invoke(["replay", "--replicas", replicas, "--store", store, "--json"])
        assert res.exit_code == 0, res.stderr
        runs.append(json.loads(res.stdout))
    huge, small_run = (own.root / "runs" / r["run_id"] / "requests.parquet" for r in runs)
    import pyarrow.parquet as pq

    assert pq.read_table(huge).equals(pq.read_table(small_run))


def test_environment_limit_applies_to_library_replays(small: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.replay.run import ReplayOptions, replay

    monkeypatch.setenv(MAX_MEMORY_ENV, "1MiB")
    with pytest.raises(ResourceLimitError, match=r"\(\$ROOFTRACE_MAX_MEMORY\)"):
        replay(small["store"], DEFAULT_FLEET, ReplayOptions(date=DATE))


_MEASURE = """
import json, sys
from dataclasses import replace
from pathlib import Path
from pipeline.replay.fleet import load_fleet, resolve
from pipeline.replay.limits import estimate_replay
from pipeline.replay.run import REPLAY_COLUMNS, ReplayOptions, replay
from pipeline.ingest.store import Store
store, fleet = Store(Path(sys.argv[1])), sys.argv[2]
opts = ReplayOptions(date=sys.argv[3], replicas=int(sys.argv[4]))
est = estimate_replay(store.read_requests(opts.date, REPLAY_COLUMNS),
                      resolve(load_fleet(fleet).with_replicas(opts.replicas), fleet),
                      opts.mode, opts.rate_scale, opts.concurrency, streamed=True)
replay(store, fleet, opts)
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"estimate": est.bytes, "peak": hwm}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_estimate_bounds_the_peak_memory_of_a_real_replay(small: dict[str, Any], tmp_path: Path) -> None:
    store = _own(small, tmp_path)  # the measured replay writes its run: not into the module's store
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(store.root), str(DEFAULT_FLEET), DATE, "40"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=900,
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["peak"] <= doc["estimate"] <= 6 * doc["peak"], doc


def _interrupt(args: list[str], tmp_path: Path, pattern: str) -> tuple[int, str, float]:
    """Run ``rooftrace ARGS``, wait for a stderr line matching ``pattern`` (the engine is running
    and reporting), send SIGINT, and return (exit code, stderr, seconds from SIGINT to exit)."""
    env = dict(os.environ, ROOFTRACE_PROGRESS_EVERY_S="0.3", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 600  # a first run after an edit of the kernels compiles them
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if not ready:
                assert proc.poll() is None, "".join(seen)
                continue
            line = proc.stderr.readline()
            assert line, "".join(seen)
            seen.append(line)
            if re.search(pattern, line):
                break
        else:
            pytest.fail("no progress line: " + "".join(seen))
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[1]
        return proc.returncode, "".join(seen) + rest, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_jit_replay_reports_progress_and_stops_promptly_on_ctrl_c(tmp_path: Path) -> None:
    # 300,000 requests on the default fleet's 2 replicas: overloaded, the replay runs for minutes
    from pipeline.ingest import ingest_logs

    log = tmp_path / "day.csv"
    log.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
        f"{i * 0.01:.2f},{1000 + i % 3000},{50 + i % 400}\n" for i in range(300_000)
    ))  # fmt: skip
    store = Store(tmp_path / "store")
    ingest_logs([log], store, fmt="vidur", date=DATE)
    args = ["replay", "--max-memory", "none", "--date", DATE]
    code, err, waited = _interrupt([*args, "--store", str(store.root)], tmp_path, r"replay: [1-9][0-9,]* of ")
    assert code == 130, err
    assert "Traceback" not in err and err.rstrip().splitlines()[-1].startswith("interrupted (Ctrl-C)"), err
    assert waited < 5, waited
    assert "requests done" in err


def test_a_replay_past_the_state_limit_stops_promptly_on_ctrl_c(small: dict[str, Any], tmp_path: Path) -> None:
    # prefix caching on 3,000 replicas, 2,000 of them reached by round robin from 2,000 closed-loop
    # clients: block tables past MAX_STATE_BYTES, and a closed loop cannot be cut in pods
    fleet = _fleet(tmp_path / "rr.toml", "rr")
    fleet.write_text(fleet.read_text().replace('router = "least_outstanding"', 'router = "round_robin"'))
    args = ["replay", "--fleet", str(fleet), "--replicas", "3000", "--concurrency", "2000", "--max-memory", "none"]
    args += ["--store", str(_own(small, tmp_path).root)]  # an interrupted writer: not the module's store
    code, err, waited = _interrupt(args, tmp_path, r"replay: [1-9][0-9,]* of 2,000 requests done")
    assert code == 130, err
    assert "Traceback" not in err and err.rstrip().splitlines()[-1].startswith("interrupted (Ctrl-C)"), err
    assert waited < 5, waited


def test_progress_reaches_the_jit_engine(small: dict[str, Any]) -> None:
    from pipeline.replay.fleet import load_fleet, resolve
    from pipeline.replay.run import ReplayOptions, run_replay

    frame = small["store"].read_requests(DATE)
    fleet = resolve(load_fleet(DEFAULT_FLEET), str(DEFAULT_FLEET))
    seen: list[int] = []
    run = run_replay(frame, fleet, ReplayOptions(), progress=seen.append)
    assert seen and seen[-1] == frame.height == run.work.n
    assert seen == sorted(seen)
    est = estimate_replay(frame, fleet, "open", 1.0, None)
    assert est.engine == "jit" and est.progress_total == frame.height


def test_the_first_compile_is_announced(small: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay whose engine must be compiled first (no valid disk cache) says so on stderr
    before it sits busy; one that needs no compile does not."""
    import pipeline.replay.limits as limits

    args = ["replay", "--store", str(_own(small, tmp_path).root), "--json"]
    monkeypatch.setattr(limits, "jit_compile_needed", lambda: False)
    quiet = _invoke(args)
    assert quiet.exit_code == 0 and "compiling the replay engine" not in quiet.stderr
    monkeypatch.setattr(limits, "jit_compile_needed", lambda: True)
    told = _invoke(args)
    assert told.exit_code == 0 and "replay: compiling the replay engine" in told.stderr


@pytest.mark.skipif("NUMBA_CACHE_DIR" in os.environ, reason="the engine's cache is kept outside the package")
def test_no_compile_announced_once_the_engine_is_compiled(small: dict[str, Any], tmp_path: Path) -> None:
    """After a replay has compiled the engine into its disk cache, the next estimate knows no
    compile is ahead (the stamp jit_compile_needed looks for is the one the kernels write)."""
    import pipeline.replay.limits as limits

    assert _invoke(["replay", "--store", str(_own(small, tmp_path).root), "--json"]).exit_code == 0
    assert limits.jit_compile_needed() is False


def test_pods_estimate_the_largest_pod_not_the_fleet(small: dict[str, Any]) -> None:
    """Replayed in pods, one process holds one pod's engine state: 1,000 replicas in 10 pods are
    estimated as 100 replicas' state on the jit engine, where the flat fleet is past the jit
    engine's state limit (the closed loop, which cannot be cut, counts the state it touches; the open loop
    asked for no pods runs in as many as shard.auto_pods says); a hierarchical fleet's routing
    pods count the same way."""
    from pipeline.engine.jit import MAX_STATE_BYTES, state_bytes
    from pipeline.engine.model import FleetSpec
    from pipeline.engine.shard import AUTO_POD_STATE_BYTES, auto_pods, pod_cuts
    from pipeline.replay.fleet import load_fleet, resolve

    frame = small["store"].read_requests(small["store"].dates()[0])
    rr = replace(load_fleet(DEFAULT_FLEET).with_replicas(1000), router="round_robin")
    fleet = resolve(rr, str(DEFAULT_FLEET))
    spec = FleetSpec(replicas=100, scheduler=fleet.scheduler, router=fleet.config.router)
    assert state_bytes(spec) * 10 > MAX_STATE_BYTES >= state_bytes(spec)
    flat = estimate_replay(frame, fleet, "closed", 1.0, 1000)
    pods = estimate_replay(frame, fleet, "open", 1.0, None, 10)
    assert flat.engine == pods.engine == "jit" and pods.pod_replicas == 100
    # the flat closed loop allocates past MAX_STATE_BYTES, but only its busy replicas' state and
    # every replica's free list are touched: that is what is counted
    assert state_bytes(replace(spec, replicas=1000)) > MAX_STATE_BYTES
    assert flat.parts["engine state"] < state_bytes(replace(spec, replicas=1000)) / 10
    auto = estimate_replay(frame, fleet, "open", 1.0, None)
    n_auto = auto_pods(replace(spec, replicas=1000), frame.height, lambda: True)
    per = int(np.diff(pod_cuts(1000, 1, n_auto)).max())
    assert n_auto > 1 and auto.engine == "jit" and auto.pod_replicas == per
    assert state_bytes(replace(spec, replicas=per)) <= AUTO_POD_STATE_BYTES
    assert pods.parts["engine state"] == state_bytes(spec) + 100 * 1024 + 16 * frame.height
    assert "largest pod's 100 replicas" in pods.drivers()
    # the replay stage writes each pod's step log and series as the pod ends: a tenth is held
    from pipeline.replay.limits import LOG_ROW_BYTES, ROWS_PER_REQUEST

    assert pods.parts["step log"] == int(ROWS_PER_REQUEST * frame.height * 0.1 * LOG_ROW_BYTES)
    assert "(a pod's at a time)" in pods.drivers() and "(a pod's at a time)" not in flat.drivers()
    hier = resolve(replace(fleet.config, router_pod_size=250), str(DEFAULT_FLEET))
    est = estimate_replay(frame, hier, "open", 1.0, None)
    assert est.pod_replicas == 250
    assert est.parts["engine state"] == state_bytes(replace(spec, replicas=250)) + 250 * 1024 + 16 * frame.height


def test_engine_cache_stamp_is_written_where_python_made_no_bytecode_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under PYTHONDONTWRITEBYTECODE the package has no __pycache__ when the engine is first
    imported: the stamp must be written with the cache (a cache without one is taken for stale by
    the next process, which deletes it and compiles for minutes again), and a stale cache (no
    stamp for the current step-cost source) is removed."""
    from pipeline.engine import _jit_kernels
    from pipeline.engine.jitcache import kernel_stamp

    fake = tmp_path / "engine" / "_jit_kernels.py"
    fake.parent.mkdir()
    monkeypatch.setattr(_jit_kernels, "__file__", str(fake))
    _jit_kernels._drop_stale_cache()
    stamp = tmp_path / "engine" / "__pycache__" / f"_jit_kernels.stepcost-{kernel_stamp()}.stamp"
    assert stamp.exists()
    compiled = stamp.parent / "_jit_kernels._replay-1.py311.nbi"
    compiled.touch()
    _jit_kernels._drop_stale_cache()  # the stamp is current: the cache stays
    assert compiled.exists()
    stamp.unlink()
    _jit_kernels._drop_stale_cache()  # no stamp: stale, removed, stamped afresh
    assert not compiled.exists() and stamp.exists()


def test_the_estimate_knows_static_routes_as_the_replay_does() -> None:
    """A session-affinity day whose only requests without a session are ones the replay rejects
    routes statically (shard.routes_static ignores rejected requests): the estimate agrees, so
    both cut the same pods; a routed request without a key does not."""
    import polars as pl

    from pipeline.engine.model import FleetSpec, SchedulerConfig
    from pipeline.replay.limits import _routes_static

    cfg = SchedulerConfig(num_gpu_blocks=1000, block_size=16, max_num_seqs=8, max_model_len=1600)
    spec = FleetSpec(replicas=4, scheduler=cfg, router="session_affinity")
    frame = pl.DataFrame(
        {"recorded_input_tokens": [100, 5000, 40], "output_tokens": [10, 10, 0], "session_id": ["a", None, "b"]}
    )
    assert _routes_static(frame, spec)  # the keyless one is longer than max_model_len: rejected
    assert not _routes_static(frame.with_columns(session_id=pl.Series([None, None, "b"])), spec)
    prefix = FleetSpec(replicas=4, scheduler=cfg, router="prefix_affinity")
    assert _routes_static(frame, prefix)  # 40 tokens hold two full blocks of 16
    assert not _routes_static(frame.with_columns(recorded_input_tokens=pl.Series([100, 5000, 10])), prefix)
    assert _routes_static(frame.with_columns(recorded_input_tokens=pl.Series([100, 5000, 16])), prefix)
    assert not _routes_static(frame, FleetSpec(replicas=4, scheduler=cfg, router="least_outstanding"))


def test_classify_refuses_a_block_size_its_memory_cannot_hold(
    small: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``classify --block-size 1`` on a large day grew until it ran out of memory (a numpy
    traceback under a ulimit); it is estimated first (limits.CLASSIFY_BLOCK_BYTES a block) and
    refused in one line past the limit, naming the blocks; the default block size still runs."""
    from pipeline.classify.memory import CLASSIFY_BLOCK_BYTES
    from pipeline.common.budget import OVERHEAD_BYTES
    from pipeline.common.system import process_rss

    store = _own(small, tmp_path)  # the default block size classifies: not in the module's store
    day = store.read_requests(DATE)
    cached = day["recorded_input_tokens"] + day["output_tokens"] * day["session_id"].is_not_null()
    tokens = int(cached.clip(lower_bound=1).sum())  # a session's turns cache their answers too
    limit = process_rss() + OVERHEAD_BYTES + tokens * CLASSIFY_BLOCK_BYTES // 2  # half of what 1-token blocks need
    monkeypatch.setenv(MAX_MEMORY_ENV, str(limit))
    res = _invoke(["classify", "--store", str(store.root), "--date", DATE, "--block-size", "1"])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert f"in blocks of 1 tokens ({tokens:,} blocks)" in line and "use a larger --block-size" in line, line
    assert _invoke(["classify", "--store", str(store.root), "--date", DATE]).exit_code == 0


def test_the_compile_check_looks_where_numba_caches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With $NUMBA_CACHE_DIR set numba caches the engine there, not in the package's
    __pycache__: the "compiling the replay engine" notice must look there too (a
    warm package folder once hid a 3-minute compile)."""
    from numba.core import config

    from pipeline.engine.jitcache import jit_cache_dir, kernel_stamp
    from pipeline.replay.limits import jit_compile_needed

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    cache = jit_cache_dir()
    assert cache.parent == tmp_path and cache.name.startswith("engine_")
    assert jit_compile_needed()  # nothing compiled there yet
    cache.mkdir()
    (cache / f"_jit_kernels.stepcost-{kernel_stamp()}.stamp").touch()
    (cache / "_jit_kernels._replay-100.py311.nbi").touch()
    assert not jit_compile_needed()
    monkeypatch.setattr(config, "CACHE_DIR", "")
    assert jit_cache_dir().name == "__pycache__"
