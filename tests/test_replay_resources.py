"""Replay's resources and wording (replay, limits, Ray, fleet wording, fit): a replay's memory limit under an
address-space limit (``ulimit -v``), a MemoryError as one line, options suggested only where they
apply, a local Ray instance refused under such a limit and its waits bounded, the replay's line
counting GPUs as tp × pp × dp, a run id that does not depend on whether ``--date`` was typed, an
inherited SIG_IGN kept, FLEET.toml errors in the file's own words, and ``fit``'s cap and numbers."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
from cli_checks import cli, one_error
from cli_checks import invoke as _invoke
from cli_checks import one_error_line as _one_error_line
from conftest import own_copy

from pipeline.common import system
from pipeline.common.budget import GIB, Limits, ResourceLimitError, override, replay_limits
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.system import process_rss, virtual_size
from pipeline.engine import shard
from pipeline.ingest.store import Store
from pipeline.replay.fleet import load_fleet, resolve
from pipeline.replay.limits import ReplayEstimate, enforce
from pipeline.replay.run import ReplayOptions, replay

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FLEET = ROOT / "fleets" / "default.toml"
_REAL_GETRLIMIT = resource.getrlimit


def _fake_address_space(monkeypatch: pytest.MonkeyPatch, limit: int | None) -> None:
    """Make the process read ``limit`` as its soft RLIMIT_AS (None: unlimited); nothing is set."""

    def getrlimit(which: int) -> tuple[int, int]:
        if which == resource.RLIMIT_AS:
            value = resource.RLIM_INFINITY if limit is None else limit
            return value, resource.RLIM_INFINITY
        return _REAL_GETRLIMIT(which)

    monkeypatch.setattr(resource, "getrlimit", getrlimit)


def _fleet(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n' + textwrap.dedent(body))
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    from pipeline.ingest import ingest_logs
    from pipeline.synth import SynthConfig, generate, write_logs

    base = tmp_path_factory.mktemp("replay-resources")
    st = Store(base / "store")
    frame = generate(SynthConfig(requests=200, seed=9, models=("llama-3.1-8b",), duration_s=200, diurnal=False))
    ingest_logs(write_logs(frame, "anthropic", base / "day.jsonl"), st)
    return st


def _estimate(**over: Any) -> ReplayEstimate:
    parts = dict.fromkeys(
        ("process", "overhead", "compile", "chains", "engine state", "requests", "step log", "series"), 0
    )
    parts["series"] = 8 * GIB
    base: dict[str, Any] = {
        "requests": 19_366,
        "replicas": 1,
        "engine": "jit",
        "mode": "closed",
        "rate_scale": 1.0,
        "arrival_span_s": 0.0,
        "span_s": 40_942_431.0,
        "busy_replicas": 1,
        "kv_blocks": 0,
        "log_rows": 77_464,
        "parts": parts,
        "seconds": 1.0,
        "progress_units": "requests done",
        "progress_total": 19_366,
    }
    return ReplayEstimate(**(base | over))


# -- 1. the memory limit under ulimit -v; a MemoryError as one line; options that apply ----------


def test_replay_limit_is_what_the_address_space_limit_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ulimit -v`` bounds the replay as --max-memory does: the smaller one wins, ``none`` too."""
    _fake_address_space(monkeypatch, None)
    with override(max_memory=None):
        assert replay_limits().max_memory is None and replay_limits().address_space is None
    space = virtual_size() + 2 * GIB
    _fake_address_space(monkeypatch, space)
    room = 2 * GIB + process_rss()  # the estimate counts the resident size; the mapped size is taken
    for configured in (None, 64 * GIB):
        with override(max_memory=configured):
            got = replay_limits()
        assert got.max_memory is not None and abs(got.max_memory - room) < 256 << 20, (got, room)
        assert got.address_space == space
        assert got.memory_origin.startswith("what this process's address-space limit leaves: ulimit -v")
    with override(max_memory=GIB):  # a configured limit below the room is kept, with its origin
        got = replay_limits()
    assert (got.max_memory, got.memory_origin, got.address_space) == (GIB, "--max-memory", None)


def test_refusal_under_ulimit_says_to_raise_it_and_names_only_options_that_apply() -> None:
    limits = Limits(5 * GIB, "what this process's address-space limit leaves: …", None, "default", 7 * GIB)
    with pytest.raises(ResourceLimitError) as info:
        enforce(_estimate(), limits)
    line = str(info.value)
    assert "\n" not in line
    assert "series of 1 busy replica × 40,942,431 simulated s" in line, line
    assert "use a larger --concurrency" in line and "step_overhead_s" in line, line
    assert "--rate-scale" not in line, line  # refused together with --concurrency
    assert line.endswith("or raise the address-space limit (ulimit -v) the replay runs under"), line
    with pytest.raises(ResourceLimitError) as info:
        enforce(_estimate(mode="offline"), limits)
    assert "--rate-scale" not in str(info.value) and "--concurrency" not in str(info.value)
    configured = Limits(5 * GIB, "--max-memory", None, "default")
    with pytest.raises(ResourceLimitError) as info:
        enforce(_estimate(mode="open", arrival_span_s=10.0), configured)
    line = str(info.value)
    assert "use fewer replicas or a larger --rate-scale" in line and "--max-memory SIZE" in line, line
    # the span refusal too: --rate-scale only in the open loop
    free = Limits(None, "--max-memory", None, "default")
    for mode, wanted, unwanted in (("closed", "--concurrency", "--rate-scale"), ("open", "--rate-scale", "xx")):
        with pytest.raises(ResourceLimitError) as info:
            enforce(_estimate(mode=mode, span_s=2e9, parts=dict.fromkeys(_estimate().parts, 0)), free)
        assert wanted in str(info.value) and unwanted not in str(info.value), str(info.value)


def test_closed_loop_under_ulimit_is_refused_before_it_runs(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst case: step_overhead_s = 10 and one client make a long series; under a small
    address-space limit the replay is refused up front, in one line, instead of dying in numpy."""
    fleet = _fleet(tmp_path, "so10", "[engine]\nstep_overhead_s = 10\n")
    _fake_address_space(monkeypatch, virtual_size() + (64 << 20))
    res = _invoke(["replay", "--store", str(store.root), "--fleet", str(fleet), "--concurrency", "1"])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert "address-space limit leaves: ulimit -v" in line and "raise the address-space limit" in line, line
    assert "--rate-scale" not in line, line
    assert not list((store.root / "runs").glob("*so10*/config.json"))


def test_a_memory_error_in_the_series_is_one_line(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.replay.run as replay_mod

    def no_memory(*_: Any, **__: Any) -> None:
        raise MemoryError("Unable to allocate 312. MiB for an array with shape (40913073,) and data type float64")

    monkeypatch.setattr(replay_mod, "series_frames", no_memory)
    before = {p.name for p in (store.root / "runs").glob("*")} if (store.root / "runs").exists() else set()
    res = _invoke(["replay", "--store", str(store.root), "--fleet", str(DEFAULT_FLEET), "--concurrency", "2"])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert line.startswith("error: out of memory while building the per-second series of the step log ("), line
    assert "Unable to allocate 312. MiB for an array with shape (40913073,)" in line, line
    assert "use a larger --concurrency" in line and "--rate-scale" not in line, line
    after = {p.name for p in (store.root / "runs").glob("*") if (p / "config.json").exists()}
    assert after <= before  # nothing half written is left as a run


def test_a_memory_error_in_a_library_replay_is_one_line(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.replay.run as replay_mod

    def no_memory(*_: Any, **__: Any) -> None:
        raise MemoryError()

    monkeypatch.setattr(replay_mod, "run_workload", no_memory)
    requests = store.read_requests(store.resolve_date(None))
    fleet = resolve(load_fleet(DEFAULT_FLEET), "default.toml")
    with pytest.raises(ResourceLimitError) as info:
        replay_mod.run_replay(requests, fleet, ReplayOptions())
    line = str(info.value)
    assert line.startswith(f"out of memory while replaying {requests.height:,} requests on 2 replicas of default")
    assert "an allocation failed" in line and "\n" not in line, line


# -- 2. Ray under an address-space limit, and bounded waits -----------------------------------------


def test_local_ray_is_refused_under_a_small_address_space_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_address_space(monkeypatch, 8_000_000 * 1024)  # ulimit -v 8000000
    monkeypatch.setattr(system, "physical_memory", lambda: 24 * GIB)
    for address in (None, "local"):
        with pytest.raises(RooftraceError) as info:
            shard.check_ray_address_space(address)
        line = str(info.value)
        assert line.startswith("--executor ray: Ray's workers need more address space than this process's limit")
        assert "ulimit -v 7.6 GiB" in line and "object store (7.2 GiB)" in line, line
        assert "use --executor process" in line and "\n" not in line, line
    shard.check_ray_address_space("10.0.0.1:6379")  # a cluster's workers are not under our limit
    _fake_address_space(monkeypatch, 1 << 40)
    shard.check_ray_address_space(None)
    _fake_address_space(monkeypatch, None)
    shard.check_ray_address_space(None)


def test_ray_connect_checks_the_limit_before_starting_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray", reason="ray is the optional extra rooftrace[ray]; not installed here")
    started: list[Any] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: started.append(kw))
    _fake_address_space(monkeypatch, 2 * GIB)
    with pytest.raises(RooftraceError, match="Ray's workers need more address space"):
        shard.ray_connect(None)
    assert not started


class _Timeout(Exception):
    pass


class _RayError(Exception):
    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class _FakeRay:
    """Just enough of ``ray`` for _run_ray: ``get`` of the ref numbers in ``hang`` times out, of
    those in ``fail`` raises their error; every other ref's result is its number."""

    def __init__(self, hang: set[int], fail: dict[int, BaseException] | None = None) -> None:
        self.exceptions = types.SimpleNamespace(GetTimeoutError=_Timeout, RayError=_RayError)
        self.hang, self.fail = hang, fail or {}
        self.refs = 0
        self.timeouts: list[float | None] = []
        self.cancelled: list[int] = []

    def remote(self, _fn: Any) -> Any:
        fake = self

        class Remote:
            def remote(self, *_: Any) -> int:
                fake.refs += 1
                return fake.refs - 1

        return Remote()

    def put(self, value: Any) -> Any:
        return value

    def get(self, ref: int, timeout: float | None = None) -> Any:
        self.timeouts.append(timeout)
        if ref in self.hang:
            raise _Timeout()
        if ref in self.fail:
            raise self.fail[ref]
        return ref

    def cancel(self, ref: int, force: bool = False) -> None:
        self.cancelled.append(ref)


def _run_fake(monkeypatch: pytest.MonkeyPatch, fake: _FakeRay, pods: int) -> list[Any]:
    monkeypatch.setattr(shard, "ray_connect", lambda _address: fake)
    return list(shard._run_ray([Any] * pods, None, False, None))  # type: ignore[list-item, arg-type]


def test_a_ray_worker_pool_that_never_starts_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay(hang={0})  # ref 0 is the probe
    with pytest.raises(RooftraceError) as info:
        _run_fake(monkeypatch, fake, 2)
    line = str(info.value)
    assert line.startswith("--executor ray: no Ray worker ran a task within 120 s"), line
    assert fake.timeouts == [shard.RAY_START_TIMEOUT_S] and fake.cancelled == [0]


def test_a_pod_that_never_returns_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay(hang={2})  # probe 0, pods 1 and 2
    with pytest.raises(RooftraceError) as info:
        _run_fake(monkeypatch, fake, 2)
    assert str(info.value).startswith("--executor ray: pod 2 of 2 gave no result within 1,800 s")
    assert fake.timeouts == [shard.RAY_START_TIMEOUT_S, shard.RAY_POD_TIMEOUT_S, shard.RAY_POD_TIMEOUT_S]
    assert fake.cancelled == [2]
    assert _run_fake(monkeypatch, _FakeRay(hang=set()), 3) == [1, 2, 3]  # results in pod order


def test_a_pod_error_through_ray_is_itself_or_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    oom = MemoryError("Unable to allocate 1 GiB")
    with pytest.raises(MemoryError, match="Unable to allocate 1 GiB"):
        _run_fake(monkeypatch, _FakeRay(hang=set(), fail={1: _RayError("task failed", oom)}), 2)
    crash = _RayError("The worker died unexpectedly\nTraceback ...")
    with pytest.raises(RooftraceError) as info:
        _run_fake(monkeypatch, _FakeRay(hang=set(), fail={2: crash}), 3)
    assert str(info.value) == "--executor ray: pod 2 of 3 failed: _RayError: The worker died unexpectedly"


# -- 3. GPUs of a dp / pp fleet -------------------------------------------------------------------------


def test_fleet_size_counts_tp_pp_dp(tmp_path: Path) -> None:
    path = _fleet(tmp_path, "dppp", "dp = 2\npp = 2\ntp = 2\nreplicas = 3\n")
    fleet = resolve(load_fleet(path), str(path))
    assert fleet.gpus_per_replica == 8 and fleet.to_dict()["gpus_per_replica"] == 8
    assert fleet.size_text() == "3 replicas of dppp, 24 h100-sxm GPUs (tp 2 × pp 2 × dp 2 each)"
    two = resolve(load_fleet(DEFAULT_FLEET), "default.toml")
    assert two.size_text() == "2 replicas of default, 2 h100-sxm GPUs"


def test_replay_line_says_replicas_and_gpus(store: Store, tmp_path: Path) -> None:
    store = own_copy(store, tmp_path)  # the run goes into a copy: the module's store holds no runs of tests
    fleet = _fleet(tmp_path, "dp16", "dp = 16\nreplicas = 1\n")
    res = _invoke(["replay", "--store", str(store.root), "--fleet", str(fleet)])
    assert res.exit_code == 0, res.stderr
    assert "on 1 replica of dp16, 16 h100-sxm GPUs (tp 1 × pp 1 × dp 16 each)" in res.stderr, res.stderr


# -- 4. the run id depends on the date resolved, not on --date being typed ------------------------


def test_run_id_is_the_same_with_or_without_the_date(store: Store, tmp_path: Path) -> None:
    store = own_copy(store, tmp_path)
    date = store.resolve_date(None)
    implicit = replay(store, DEFAULT_FLEET, ReplayOptions())
    explicit = replay(store, DEFAULT_FLEET, ReplayOptions(date=date))
    same_replicas = replay(store, DEFAULT_FLEET, ReplayOptions(replicas=2))  # default.toml has 2
    assert implicit.run_id == explicit.run_id == same_replicas.run_id
    config = json.loads((explicit.run_dir / "config.json").read_text())
    assert config["options"]["date"] == date and config["options"]["replicas"] is None
    other = replay(store, DEFAULT_FLEET, ReplayOptions(replicas=3))
    assert other.run_id != implicit.run_id
    assert json.loads((other.run_dir / "config.json").read_text())["options"]["replicas"] == 3


# -- 5. an inherited SIG_IGN stays ignored ----------------------------------------------------------

_SIGINT_PROBE = """
import os, signal, sys, threading, time
import polars as pl
from pipeline.common.system import keep_ignored_sigint

def caught():
    mask = [l for l in open("/proc/self/status") if l.startswith("SigCgt")][0].split()[1]
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))

before = caught()
keep_ignored_sigint()
after = caught()
def kill():
    for _ in range(15):
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=kill, daemon=True).start()
t = time.time()
while time.time() - t < 1.5:
    pl.LazyFrame({"a": range(1_000_000)}).group_by((pl.col("a") % 97).alias("k")).agg(pl.col("a").sum()).collect()
print(before, after, "survived")
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
def test_an_inherited_sig_ign_is_kept_over_polars_handler() -> None:
    import signal

    def ignore() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    out = subprocess.run(
        [sys.executable, "-c", _SIGINT_PROBE], preexec_fn=ignore, capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    # polars caught SIGINT over the inherited SIG_IGN; after keep_ignored_sigint nothing does
    assert out.returncode == 0 and out.stdout.split() == ["True", "False", "survived"], out.stdout + out.stderr


def test_keep_ignored_sigint_leaves_a_handled_sigint_alone() -> None:
    import signal

    from pipeline.common.system import keep_ignored_sigint

    before = signal.getsignal(signal.SIGINT)
    keep_ignored_sigint()
    assert signal.getsignal(signal.SIGINT) is before and before is not signal.SIG_IGN


def test_nightly_keeps_an_ignored_sigint_first(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.publish.nightly as nightly_mod

    calls: list[str] = []
    monkeypatch.setattr(nightly_mod, "keep_ignored_sigint", lambda: calls.append("kept"))
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nmodel = "llama-3.1-8b"\n')
    with pytest.raises(ConfigError, match="missing key"):
        nightly_mod.nightly([tmp_path / "none.jsonl"], bad, store)
    assert calls == ["kept"]


# -- 6. a FLEET.toml's errors in its own words --------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "wanted"),
    [
        ("ttft_p99 = -1.0", "[slo]: ttft_p99 = -1.0 must be a positive number of seconds"),
        ("ttft_p99 = inf", "[slo]: ttft_p99 = inf must be a positive number of seconds"),
        ("ttft_p99 = -3", "[slo]: ttft_p99 = -3 must be a positive number of seconds"),
        ("ttft_p99 = 1e308", "[slo]: ttft_p99 = 1e+308 seconds is longer than a year (31,536,000 s)"),
        ("ttft_p99.9 = 1.0", "[slo]: ttft_p99 is a table (a dotted key such as ttft_p99.9); quote a target"),
        ('preset = "nope"', "[slo]: preset = 'nope' is not a preset; presets: ["),
        ("latency_p99 = 1.0", "[slo]: unknown SLO target 'latency_p99'"),
    ],
)
def test_fleet_slo_errors_name_the_key_and_echo_the_value(tmp_path: Path, table: str, wanted: str) -> None:
    path = _fleet(tmp_path, "slo", f"[slo]\n{table}\n")
    with pytest.raises(ConfigError) as info:
        load_fleet(path)
    message = str(info.value)
    assert message.startswith(f"{path} {wanted}"), message
    assert "--slo" not in message and "infs" not in message and "'-1.0s'" not in message, message


def test_fleet_slo_text_is_unchanged_for_valid_tables(tmp_path: Path) -> None:
    """The text recorded (part of the run id) is what it was: a valid table's runs keep their ids."""
    cfg = load_fleet(_fleet(tmp_path, "ok", '[slo]\npreset = "chat"\nttft_p99 = 2\n"tpot_p99.9" = 0.1\n'))
    assert cfg.slo == "chat,ttft_p99=2.0s,tpot_p99.9=0.1s"


def test_a_fleet_that_does_not_fit_suggests_its_own_keys(tmp_path: Path) -> None:
    path = _fleet(tmp_path, "tiny", "[engine]\ngpu_memory_utilization = 0.05\n")
    with pytest.raises(ConfigError) as info:
        resolve(load_fleet(path), str(path))
    message = str(info.value)
    assert "higher [engine] gpu_memory_utilization = 0.95 fits" in message, message
    assert "--gpu-memory-utilization" not in message
    big = tmp_path / "big.toml"
    big.write_text('name = "big"\nmodel = "llama-3.1-70b"\nhardware = "l40s"\ntp = 2\n')
    with pytest.raises(ConfigError) as info:
        resolve(load_fleet(big), str(big))
    message = str(info.value)
    assert "tp = 8 fits" in message and 'weight_dtype = "int4" fits' in message, message
    assert 'hardware = "b200"' in message and "--tp" not in message and "--weights" not in message, message


def test_fit_still_suggests_its_options() -> None:
    from pipeline.catalog import load_hardware, load_model
    from pipeline.costmodel.fit import fit
    from pipeline.costmodel.roofline import Deployment

    f = fit(Deployment(load_model("llama-3.1-8b"), load_hardware("h100-sxm")), gpu_memory_utilization=0.05)
    assert "higher --gpu-memory-utilization 0.95 fits" in f.suggestions, f.suggestions


# -- 7. fit's cap, a zero intermediate_size, durations printed -----------------------------------------


def test_fit_reports_the_max_num_seqs_cap() -> None:
    res = _invoke(["fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--context", "1"])
    assert res.exit_code == 0
    line = next(ln for ln in res.stdout.splitlines() if "fits:" in ln)
    assert line.strip() == (
        "fits: 1,024 concurrent sequences of 1 token (max_num_seqs = 1,024, the engine's cap; the KV cache "
        "would hold 27,795)"
    ), line
    res = _invoke(["fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--context", "1", "--json"])
    doc = json.loads(res.stdout)
    assert (doc["max_concurrent_seqs_at_context"], doc["max_running_seqs_at_context"]) == (27_795, 1_024)
    res = _invoke(["fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm"])
    assert "fits: 3 concurrent sequences of 131,072 tokens" in res.stdout


def test_a_zero_intermediate_size_is_not_called_missing(tmp_path: Path) -> None:
    base = (ROOT / "pipeline" / "catalog" / "models" / "llama-3.1-8b.toml").read_text()
    assert "intermediate_size = 14336" in base
    path = tmp_path / "inter0.toml"
    path.write_text(base.replace("intermediate_size = 14336", "intermediate_size = 0"))
    res = _invoke(["fit", "--model", str(path), "--hardware", "h100-sxm"])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert "intermediate_size must be > 0 for dense MLP layers (32 of them), got 0" in line, line
    assert "missing key" not in line


def test_large_durations_are_said_in_minutes_hours_days() -> None:
    from pipeline.cli.replay import _ms
    from pipeline.replay.slo import format_seconds, limit_text, parse_slo

    assert [format_seconds(x) for x in (0.25, 5.0, 250.0, 600.0, 5400.0, 84_861.1664, 2 * 86_400.0, 1e9, 3e15)] == [
        "250 ms",
        "5.00 s",
        "250 s",
        "10 min",
        "90 min",
        "23.6 h",
        "2 days",
        "11,574 days",
        "3e+15 s",
    ]
    assert _ms(0.0327) == "32.7 ms" and _ms(4.3818) == "4,381.8 ms" and _ms(84_861.1664) == "23.6 h"
    assert _ms(None) == "n/a"
    assert [limit_text(x) for x in (0.1, 2.0, 599.0, 1200.0, 5400.0, 7 * 86_400.0, 1234.0)] == [
        "0.1s",
        "2s",
        "599s",
        "20min",
        "1.5h",
        "7d",
        "1234s",
    ]
    slo = parse_slo("ttft_p99=2h,tpot_p99=100ms,e2e_p50=1.5d")
    assert slo.name == "ttft_p99=2h+tpot_p99=0.1s+e2e_p50=1.5d"
    assert [t.limit_s for t in slo.targets] == [7200.0, 0.1, 129_600.0]
    assert parse_slo("ttft_p99=2s,tpot_p99=0.1s").name == "ttft_p99=2s+tpot_p99=0.1s"  # names as before
    with pytest.raises(ConfigError, match="ttft_p99 = 1e\\+308 s is longer than a year"):
        parse_slo("ttft_p99=1e308s")


_RUN_PROBE = """
import signal
from pipeline.cli.common import run

def caught():
    mask = [l for l in open("/proc/self/status") if l.startswith("SigCgt")][0].split()[1]
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))

def body():
    import polars  # noqa: F401  (a command's own imports come after run() started)
    print(caught())

run(body)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
def test_every_command_keeps_an_inherited_sig_ign() -> None:
    """Not only replay and nightly: any command's body (here one that imports polars) runs with
    SIGINT still ignored when the caller ignored it."""
    import signal

    def ignore() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    out = subprocess.run(
        [sys.executable, "-c", _RUN_PROBE], preexec_fn=ignore, capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0 and out.stdout.split() == ["False"], out.stdout + out.stderr


def test_fit_refuses_more_sequences_than_batched_tokens_as_a_fleet_does(tmp_path: Path) -> None:
    """`fit --max-num-seqs 16777216` said it fits a set-up a fleet file refuses; and a
    vllm_version with spaces around it is the same release and the same recorded fleet."""
    one_error(
        cli("fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--max-num-seqs", "16777216"),
        "--max-num-seqs 16,777,216 is more than --max-num-batched-tokens 8,192",
    )
    fleet = tmp_path / "f.toml"
    head = 'name = "f"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n[engine]\n'
    fleet.write_text(head + 'vllm_version = " 0.11.1 "\n')
    spaced = load_fleet(fleet).to_dict()
    fleet.write_text(head + 'vllm_version = "0.11.1"\n')
    assert spaced == load_fleet(fleet).to_dict()
