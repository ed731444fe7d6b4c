"""Memory and address-space limits in ``synth``, ``plan``, ``report`` and ``fit``: synth refuses a log past the
memory limit before building it and streams what it writes; a plan skips a configuration with no
usable roofline capacity, caps its worker processes by memory, runs each --hardware/--precision
once, says to raise max_model_len when that is what rejects, and names a store folder that does
not exist; a report under an address-space limit (``ulimit -v``) leaves its charts out with one
warning instead of a native abort; fit blames the token budget when its activation dominates;
synth warns when --out's name does not say what --format writes."""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import own_copy

from pipeline.common import system
from pipeline.common.budget import ResourceLimitError, override, progress_to
from pipeline.common.errors import RooftraceError
from pipeline.costmodel.model import tokens_per_s as cost_rate
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.plan import Candidate, CandidateResult, Evaluation, PlanOptions, plan
from pipeline.plan import search as plan_search
from pipeline.plan import stage as plan_stage
from pipeline.replay import limits
from pipeline.synth import SynthConfig, check_memory, estimate_bytes, generate, name_warning, write_logs
from pipeline.synth import writers as synth_writers
from tests.cli_checks import invoke, one_error_line

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "traces" / "sample" / "azure_conv_2023.csv.gz"
LOOSE = "ttft_p99=60s,tpot_p99=1s"


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


# --- H4: synth and the memory limit -------------------------------------------------------------


def test_synth_past_the_memory_limit_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = sys.modules["pipeline.synth.generate"]  # (pipeline.synth.generate is also the function)

    def no_work() -> Any:
        raise AssertionError("synth started building the log")

    monkeypatch.setattr(gen, "load_profile", no_work)
    # the estimate counts the process's size: a test worker that loaded every profile before is
    # past 1 GiB itself (then no smaller --requests fits and none is suggested): a fixed size here
    monkeypatch.setattr(system, "process_rss", lambda: 200 << 20)
    monkeypatch.setenv("ROOFTRACE_MAX_MEMORY", "1G")
    out = tmp_path / "huge.jsonl.gz"
    res = invoke(["synth", "--requests", "10000000", "--out", str(out)])
    assert res.exit_code == 1, res.output
    line = one_error_line(res.stderr)
    assert line.startswith("error: synth: 10,000,000 requests would need about "), line
    assert "more than the limit of 1.0 GiB ($ROOFTRACE_MAX_MEMORY)" in line, line
    assert "--requests" in line and "--max-memory SIZE" in line, line
    assert _files(tmp_path) == []
    # --max-memory overrides the environment, and is named as the limit's origin
    res = invoke(["synth", "--requests", "10000000", "--max-memory", "512MiB", "--out", str(out)])
    assert res.exit_code == 1 and "limit of 512.0 MiB (--max-memory)" in one_error_line(res.stderr)
    # a limit too small for any log says only to raise it
    res = invoke(["synth", "--requests", "10", "--max-memory", "1", "--out", str(out)])
    line = one_error_line(res.stderr)
    assert "limit of 1 byte (--max-memory): raise the limit with --max-memory SIZE" in line, line
    # a bad --max-memory is Click's usage error
    res = invoke(["synth", "--requests", "10", "--max-memory", "junk", "--out", str(out)])
    assert res.exit_code == 2 and "'junk' is not a size" in res.stderr
    assert _files(tmp_path) == []


def test_synth_memory_check_in_the_library() -> None:
    refused = pytest.raises(ResourceLimitError, match=r"^synth: 10,000 requests would need about")
    with override(max_memory=64 * 1024**2), refused:
        generate(SynthConfig(requests=10_000))
    with override(max_memory=None):
        check_memory(10_000_000)  # no limit: nothing refused
    # the estimate grows with the requests, from the process's size now
    assert estimate_bytes(2_000_000) - estimate_bytes(1_000_000) == 1_000_000 * 768
    assert estimate_bytes(0) >= system.process_rss()


def test_synth_past_the_address_space_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``ulimit -v`` an allocation past the limit aborts polars (signal 6): refused first."""
    monkeypatch.setattr(system, "address_space_limit", lambda: system.virtual_size() + 512 * 1024**2)
    res = invoke(["synth", "--requests", "10000000", "--max-memory", "none", "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 1
    line = one_error_line(res.stderr)
    assert "more than this process's address-space limit (ulimit -v, " in line, line
    assert "write at most about " in line and "raise that limit" in line, line
    assert _files(tmp_path) == []


def test_synth_under_the_limit_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOFTRACE_MAX_MEMORY", "none")
    out = tmp_path / "ok.jsonl"
    res = invoke(["synth", "--requests", "50", "--max-memory", "4GiB", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert len(out.read_text().splitlines()) == 50


@pytest.mark.parametrize("fmt", synth_writers.SYNTH_FORMATS)
def test_synth_streamed_pieces_write_the_same_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    """Written a piece at a time (tiny pieces here), compressed or not, the log holds the same text
    as written in one piece."""
    df = generate(SynthConfig(requests=300, seed=5, duration_s=600))
    ext = {"parquet": ".parquet", "azure": ".csv", "vidur": ".csv", "litellm": ".csv", "csv": ".csv"}.get(fmt, ".jsonl")
    whole = tmp_path / f"whole{ext}"
    write_logs(df, fmt, whole)
    monkeypatch.setattr(synth_writers, "PIECE_CHARS", 1000)
    monkeypatch.setattr(synth_writers, "ROWS_PER_PIECE", 7)
    plain = tmp_path / f"plain{ext}"
    write_logs(df, fmt, plain)
    assert plain.read_bytes() == whole.read_bytes()
    if fmt == "parquet":
        return
    gz, zst = tmp_path / f"a{ext}.gz", tmp_path / f"a{ext}.zst"
    write_logs(df, fmt, gz)
    write_logs(df, fmt, zst)
    assert gzip.decompress(gz.read_bytes()) == whole.read_bytes()
    with zstandard.ZstdDecompressor().stream_reader(zst.read_bytes()) as reader:
        assert reader.read() == whole.read_bytes()
    # nothing left behind (the temporary files are renamed into place)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_synth_stream_that_fails_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    df = generate(SynthConfig(requests=50, seed=1, duration_s=600))

    def broken(frame: Any) -> Any:
        yield "first line"
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(synth_writers.LINE_WRITERS, "openai", broken)
    with pytest.raises(OSError):
        write_logs(df, "openai", tmp_path / "x.jsonl.gz")
    assert _files(tmp_path) == []
    with pytest.raises(RooftraceError, match="is a folder"):
        write_logs(df, "openai", tmp_path)  # a folder at the target: one line, nothing written


# --- L11: synth --out names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, name, says",
    [
        ("parquet", "x.jsonl", "--format parquet writes Parquet, not what the name's .jsonl says: name it x.parquet"),
        ("parquet", "x.parquet.gz", "Parquet is written uncompressed"),
        ("vidur", "x.jsonl", "--format vidur writes CSV, not what the name's .jsonl says: name it x.csv"),
        ("openai", "day.csv.zst", "writes JSON lines, not what the name's .csv says: name it day.jsonl.zst"),
        ("openai", "noext", "the name has no log suffix"),
    ],
)
def test_synth_warns_when_the_name_says_another_format(tmp_path: Path, fmt: str, name: str, says: str) -> None:
    warning = name_warning(fmt, Path(name))
    assert warning is not None and says in warning, warning
    out = tmp_path / name
    res = invoke(["synth", "--format", fmt, "--requests", "20", "--out", str(out)])
    assert res.exit_code == 0, res.output  # a warning, not a refusal
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and says in warnings[0], res.stderr
    assert out.exists()


@pytest.mark.parametrize(
    "fmt, name",
    [
        ("parquet", "x.parquet"),
        ("openai", "day.jsonl.gz"),
        ("otel", "t.json"),
        ("azure", "a.csv.zst"),
        ("csv", "c.csv"),
    ],
)
def test_synth_names_that_match_say_nothing(fmt: str, name: str) -> None:
    assert name_warning(fmt, Path(name)) is None


# --- plan fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    s = Store(tmp_path_factory.mktemp("synth-plan-memory") / "store")
    ingest_logs([AZURE], s, date="2023-11-16")
    return s


def _plan_args(store: Store, *extra: str) -> list[str]:
    return [
        "plan",
        "--model",
        "llama-3.1-8b",
        "--store",
        str(store.root),
        "--traffic-model",
        "*",
        "--slo",
        LOOSE,
        "--tp",
        "1",
        "--window-s",
        "20",
        "--warmup-s",
        "5",
        *extra,
    ]


def _opts(**kw: Any) -> PlanOptions:
    args: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "slo": LOOSE,
        "hardware": ("h100-sxm",),
        "tp": (1,),
        "window_s": 20.0,
        "warmup_s": 5.0,
        "traffic_model": "*",
        "jobs": 1,
        "max_replicas": 8,
    }
    args.update(kw)
    return PlanOptions(**args)


# --- M1: zero or non-finite capacity -------------------------------------------------------------


@pytest.mark.parametrize(
    "prefill, decode, bad",
    [
        (0.0, 100.0, "prefill 0 tokens/s"),
        (100.0, float("inf"), "decode inf tokens/s"),
        (float("nan"), 0.0, "prefill nan"),
    ],
)
def test_capacity_problem_names_the_phase(prefill: float, decode: float, bad: str) -> None:
    cap = {"prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode}
    why = plan_search.capacity_problem(cap, "hw/tiny.toml")
    assert why is not None and why.startswith("skipped: a replica has zero or non-finite capacity")
    assert bad in why and "hw/tiny.toml" in why and "memory_bandwidth_bytes_per_s" in why
    assert plan_search.capacity_problem({"prefill_tokens_per_s": 1.0, "decode_tokens_per_s": 2.0}, "x") is None


def test_step_rates_and_seed_never_divide_by_zero() -> None:
    assert cost_rate(8192.0, float("inf")) == 0.0
    assert cost_rate(8192.0, float("nan")) == 0.0
    assert cost_rate(8192.0, 0.0) == float("inf")
    assert cost_rate(10.0, 2.0) == 5.0
    demand = {"fresh_min_tokens_per_s": 1e308, "output_tokens_per_s": 1.0}
    cap = {"prefill_tokens_per_s": 1e-300, "decode_tokens_per_s": 1.0}
    assert plan_search._seed(demand, cap, 64) == 64  # inf replicas: the search's ceiling
    assert plan_search._seed({"fresh_min_tokens_per_s": 0.0, "output_tokens_per_s": 0.0}, cap, 64) == 1
    assert (
        plan_search._seed(
            {"fresh_min_tokens_per_s": 2.5, "output_tokens_per_s": 0.0}, {**cap, "prefill_tokens_per_s": 1.0}, 64
        )
        == 3
    )


def test_plan_skips_a_configuration_with_zero_capacity(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hardware entry whose bandwidth or FLOP/s is vanishingly small prices every step at inf
    seconds: the configuration is skipped with its reason, no replay, no ZeroDivisionError."""
    real = plan_search.capacity_per_replica

    def tiny(fleet: Any, mean_context: float) -> dict[str, Any]:
        cap = real(fleet, mean_context)
        if fleet.config.hardware == "h200":
            cap["prefill_tokens_per_s"] = cost_rate(8192.0, float("inf"))
        return cap

    monkeypatch.setattr(plan_search, "capacity_per_replica", tiny)
    res = plan(own_copy(store, tmp_path), _opts(hardware=("h200", "h100-sxm")))
    rows = {r["config"]: r for r in res.doc["configurations"]}
    bad = rows["h200 tp1 bf16"]
    assert not bad["meets_slo"] and bad["replays"] == 0
    assert bad["note"].startswith("skipped: a replica has zero or non-finite capacity (prefill 0 tokens/s)")
    assert rows["h100-sxm tp1 bf16"]["meets_slo"]


# --- M4: --jobs capped by memory -------------------------------------------------------------------


def test_local_jobs_are_capped_by_the_memory_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system, "process_rss", lambda: 100 * 1024**2)
    each = plan_stage.worker_bytes(79)
    assert each == plan_stage.WORKER_BYTES + 79 * (limits.REQUEST_BYTES + 4 * limits.LOG_ROW_BYTES)
    with override(max_memory=100 * 1024**2 + 3 * each):
        jobs, note = plan_stage.local_jobs(12, 12, 79)
        assert jobs == 3 and note is not None
        assert note.startswith("--jobs 12 capped at 3 worker processes by memory: each needs about ")
        assert "79-request window" in note and "(--max-memory)" in note
        assert plan_stage.local_jobs(2, 12, 79) == (2, None)  # fits: unchanged
        assert plan_stage.local_jobs(12, 1, 79) == (1, None)  # one configuration: in this process
    with override(max_memory=1):
        jobs, note = plan_stage.local_jobs(None, 16, 79)
        assert jobs == 1 and note is not None and "worker process by memory" in note
        assert "--jobs (default:" in note
    with override(max_memory=None):
        assert plan_stage.local_jobs(100_000, 12, 79) == (12, None)


def test_plan_says_when_the_memory_limit_caps_jobs(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = own_copy(store, tmp_path)
    # room for the replays here (this process and about 263 MiB more) but not for two workers
    room = system.process_rss() + 3 * plan_stage.worker_bytes(238) // 2
    monkeypatch.setenv("ROOFTRACE_MAX_MEMORY", str(room))  # one worker: the search runs here
    res = invoke(_plan_args(store, "--hardware", "h100-sxm,a100-80gb-sxm", "--jobs", "8"))
    assert res.exit_code == 0, res.output
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("note: --jobs 8 capped at 1 worker process")]
    assert len(notes) == 1 and "$ROOFTRACE_MAX_MEMORY" in notes[0], res.stderr


# --- L1: duplicates ------------------------------------------------------------------------------


def test_plan_runs_each_hardware_and_precision_once(store: Store, tmp_path: Path) -> None:
    store = own_copy(store, tmp_path)
    opts = _opts(hardware=("h100-sxm", "a100-80gb-sxm", "h100-sxm"), precision=("bf16", "fp8", "bf16"))
    assert opts.hardware == ("h100-sxm", "a100-80gb-sxm") and opts.precision == ("bf16", "fp8")
    assert opts == _opts(hardware=("h100-sxm", "a100-80gb-sxm"), precision=("bf16", "fp8"))  # the same plan id
    res = invoke(_plan_args(store, "--hardware", "h100-sxm,h100-sxm", "--precision", "bf16,bf16", "--jobs", "1"))
    assert res.exit_code == 0, res.output
    rows = [ln for ln in res.stdout.splitlines() if ln.lstrip()[:1].isdigit() and "h100-sxm tp1 bf16" in ln]
    assert len(rows) == 1, res.stdout
    assert "1 configurations" in res.stderr and "1 replays in" in res.stderr, res.stderr


# --- L2: rejections by max_model_len -------------------------------------------------------------


def test_plan_rejecting_long_requests_says_to_raise_max_model_len(store: Store, tmp_path: Path) -> None:
    store = own_copy(store, tmp_path)
    fleet = tmp_path / "short.toml"
    fleet.write_text('name = "short"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n[engine]\nmax_model_len = 1024\n')
    for extra in ((), ("--json",)):
        res = invoke(_plan_args(store, "--fleet", str(fleet), "--hardware", "h100-sxm", "--jobs", "1", *extra))
        assert res.exit_code == 1, res.output
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("no configuration meets the SLO"), res.stderr
        assert "reject requests longer than max_model_len 1,024 at any replica count" in last, last
        assert f"raise [engine] max_model_len in the base fleet ({fleet})" in last, last
        assert "llama-3.1-8b's maximum of 131,072 tokens" in last and "widen --hardware" not in last, last


def _failed(reasons: dict[str, int]) -> CandidateResult:
    ev = Evaluation(
        replicas=1,
        meets=False,
        achieved={},
        p99={},
        worst_ratio=2.0,
        failing="rejected",
        rejected_kv=0,
        preemptions=0,
        utilization=0.0,
        kv_peak_fraction=0.0,
        cache_hit_fraction=0.0,
        wall_s=0.0,
        rejected=sum(reasons.values()),
        rejected_by_reason=reasons,
    )
    return CandidateResult(Candidate("h100-sxm", 1, "bf16"), fits=True, evaluations=[ev])


def test_no_fit_advice() -> None:
    from pipeline.replay.fleet import parse_fleet

    base = parse_fleet({"name": "b", "model": "llama-3.1-8b", "hardware": "h100-sxm"}, "defaults")
    kv_only = plan_stage.no_fit_advice([_failed({"exceeds_kv_capacity": 3})], base, "defaults", "llama-3.1-8b")
    assert kv_only.startswith("widen --hardware/--tp")
    short = replace(base, engine=replace(base.engine, max_model_len=4096))
    advice = plan_stage.no_fit_advice([_failed({"exceeds_max_model_len": 3})], short, "defaults", "llama-3.1-8b")
    assert "max_model_len 4,096" in advice and "a base fleet given with --fleet" in advice, advice
    full = replace(base, engine=replace(base.engine, max_model_len=131_072))
    advice = plan_stage.no_fit_advice([_failed({"exceeds_max_model_len": 3})], full, "f.toml", "llama-3.1-8b")
    assert "no fleet of this model serves them" in advice, advice


# --- L12: a store folder that does not exist ----------------------------------------------------


def test_plan_store_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    res = invoke(["plan", "--model", "llama-3.1-8b", "--store", str(missing), "--tp", "1"])
    assert res.exit_code == 1
    line = one_error_line(res.stderr)
    assert line == (
        f"error: store folder {missing} does not exist: check --store (or $ROOFTRACE_STORE); "
        "`rooftrace ingest --store FOLDER` creates one"
    )
    assert not missing.exists()


# --- L9: fit blames the token budget -------------------------------------------------------------


def test_fit_activation_bound_advises_a_smaller_token_budget() -> None:
    res = invoke(
        [
            "fit",
            "--model",
            "qwen3-0.6b",
            "--hardware",
            "h100-sxm",
            "--max-num-seqs",
            "16777216",
            "--max-num-batched-tokens",
            "16777216",
        ]
    )
    assert res.exit_code == 1, res.output
    assert "a smaller token budget: --max-num-batched-tokens " in res.stdout, res.stdout
    assert "and --max-num-seqs " in res.stdout  # vLLM refuses more sequences than the budget
    assert "tensor/pipeline parallelism" not in res.stdout
    # the suggested budget does fit, and one token more does not
    tip = next(ln for ln in res.stdout.splitlines() if "smaller token budget" in ln)
    budget = tip.split("--max-num-batched-tokens ")[1].split()[0].replace(",", "")
    fit = ["fit", "--model", "qwen3-0.6b", "--hardware", "h100-sxm"]
    ok = invoke([*fit, "--max-num-seqs", budget, "--max-num-batched-tokens", budget])
    assert ok.exit_code == 0, ok.output
    over = str(int(budget) + 1)
    assert invoke([*fit, "--max-num-seqs", over, "--max-num-batched-tokens", over]).exit_code == 1


# --- M5: report under an address-space limit -----------------------------------------------------


def _store_copy(replayed_store: tuple[Any, str], dest: Path) -> Path:
    """The replayed store without its cached Vega bundle (so the report must build it)."""
    store, _run = replayed_store
    shutil.copytree(store.root, dest, ignore=shutil.ignore_patterns(".cache"))
    return dest


def test_charts_blocked_by_an_address_space_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.publish import report

    # the real reading first: the soft limit, or None when there is none
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    assert system.address_space_limit() == (None if soft == resource.RLIM_INFINITY else soft)
    monkeypatch.setattr(system, "address_space_limit", lambda: None)
    assert report.charts_blocked() is None
    monkeypatch.setattr(system, "address_space_limit", lambda: 20_000_000 * 1024)
    why = report.charts_blocked()
    assert why is not None and why.startswith("charts not rendered: this process has an address-space limit")
    assert "ulimit -v" in why
    monkeypatch.setattr(system, "address_space_limit", lambda: 1 << 50)  # 1 PiB: room for V8
    assert report.charts_blocked() is None


def test_report_under_an_address_space_limit_leaves_the_charts_out(
    replayed_store: tuple[Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.publish import report
    from pipeline.publish.nightly import build_index

    root = _store_copy(replayed_store, tmp_path / "store")
    monkeypatch.setattr(system, "address_space_limit", lambda: 20_000_000 * 1024)

    def no_v8(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("vl-convert's JavaScript engine was started")

    monkeypatch.setattr(report.vlc, "javascript_bundle", no_v8)
    monkeypatch.setattr(report.vlc, "vegalite_to_png", no_v8)
    said: list[str] = []
    with progress_to(said.append):
        res = report.build_report(Store(root), out=tmp_path / "r" / "index.html", png_dir=tmp_path / "png")
    assert len(said) == 1 and said[0].startswith("warning: charts not rendered: this process has an address-space"), (
        said
    )
    page = res.path.read_text()
    assert page.count('id="nochart-') == len(res.charts) - page.count('id="nodata-')
    assert 'class="chart"' not in page and "charts not rendered: this process has an address-space limit" in page
    assert "Latency percentiles" in page and "Run config" in page  # the rest is there
    assert res.pngs == [] and res.pngs_skipped == [
        "every chart: the address-space limit (ulimit -v) is too small for vl-convert"
    ]
    assert res.charts_note == said[0].removeprefix("warning: ")
    assert not (root / ".cache").exists() or not list((root / ".cache").glob("*.js"))
    # the index's trend chart says so in its place too (no bundle to build)
    index = build_index(tmp_path / "r", root / ".cache").read_text()
    assert "const NO_CHARTS = " in index and "charts not rendered" in index


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS as Linux applies it")
def test_report_command_with_ulimit_v_does_not_abort(replayed_store: tuple[Any, str], tmp_path: Path) -> None:
    """The real thing: ``ulimit -v 20000000`` used to abort the process in vl-convert (SIGTRAP,
    exit 133, "CagedHeap reservation")."""
    root = _store_copy(replayed_store, tmp_path / "store")
    out = tmp_path / "report.html"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (20_000_000 * 1024, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "report", "--store", str(root), "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning:")]
    charts = [w for w in warnings if "address-space limit (ulimit -v" in w]
    # the other warnings are the run's own (this sample's fleet falls behind: unit costs not valid;
    # synth's assumed latencies are not the replay's: DRIFT)
    own = ("not valid", "DRIFT")
    assert len(charts) == 1 and all(any(o in w for o in own) for w in warnings if w not in charts), proc.stderr
    assert "Traceback" not in proc.stderr and "Fatal" not in proc.stderr
    assert json.loads(proc.stdout)["charts_note"].startswith("charts not rendered")
    assert "charts not rendered" in out.read_text()
