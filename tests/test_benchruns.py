"""Benchmark client runs as evidence (docs/benchruns.md): the readers of vLLM bench serve, GuideLLM
and AIPerf result files on files written as the tools write them (every value asserted by hand),
hostile files refused in one line naming the file and field, and ``validate --runs`` on runs with
a known truth — a closed-loop sweep made by the replay itself reproduces with no error, one made
on another GPU does not."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from benchrun_truth import closed_loop_result, workload, write_sweep

from pipeline.calibrate.benchruns import (
    load_one_pool,
    options_of,
    stored_table,
    validate_runs,
    weighted_percentile,
)
from pipeline.ingest.benchruns import KNOWN_SHAPES, BenchRunError, arrivals_s, find_runs, read_runs

DATA = Path(__file__).parent / "data" / "benchruns"
ROOT = Path(__file__).resolve().parents[1]
VLLM_C2 = DATA / "vllm" / "openai-infqps-concurrency2-Llama-3.1-8B-Instruct-20250612-101500.json"
ONE_H100 = """name = "one-h100"
model = "llama-3.1-8b"
hardware = "{hw}"
weight_dtype = "bf16"
kv_dtype = "bf16"
tp = 1
replicas = 1

[engine]
max_model_len = 16384
"""


def _one(path: Path) -> Any:
    runs = read_runs(path)
    assert len(runs) == 1
    return runs[0]


# -- the readers, on files as the tools write them ---------------------------------------------------


def test_vllm_closed_loop_run() -> None:
    """--max-concurrency 2, request rate inf: a closed loop of 2. Request 2 failed ("Bad Request",
    latency 0) and is left out; the rest in the order sent (start_times − the first)."""
    run = _one(VLLM_C2)
    assert run.tool == "vllm" and run.model == "meta-llama/Llama-3.1-8B-Instruct"
    m = run.methodology
    assert (m.mode, m.concurrency, m.ramp_s) == ("closed", 2, 0.0)
    assert m.describe() == "closed loop, 2 clients"
    assert run.failed == 1 and run.n == 4
    r = run.requests
    assert r["input_tokens"].to_list() == [100, 200, 50, 300]
    assert r["output_tokens"].to_list() == [3, 4, 2, 5]
    assert r["ttft_s"].to_list() == [0.050, 0.080, 0.030, 0.100]
    assert r["e2e_s"].to_list() == [0.072, 0.115, 0.039, 0.140]
    assert r["sent_s"].to_list() == pytest.approx([0.0, 0.001, 0.074, 0.116])
    assert r["itl_mean_s"].to_list() == pytest.approx([0.011, 0.035 / 3, 0.009, 0.010])
    # every gap of the 4 successful requests: 2 + 3 + 1 + 4
    assert run.itls_s is not None and run.itls_s.size == 10
    assert float(run.itls_s.sum()) == pytest.approx(0.022 + 0.035 + 0.009 + 0.040)
    assert options_of(run).concurrency == 2 and options_of(run).mode == "closed"


def test_vllm_appended_open_loop_runs() -> None:
    """--append-result: one result per line, here two request rates with --burstiness 0.5 (gamma
    intervals) and no cap: open loops replayed at their send times."""
    runs = read_runs(DATA / "vllm" / "appended-rates.json")
    assert [r.name for r in runs] == ["appended-rates.json#1", "appended-rates.json#2"]
    for run, rate, sent in zip(runs, (4.0, 8.0), ([0.0, 0.25, 1.0], [0.0, 0.1, 0.3]), strict=True):
        m = run.methodology
        assert (m.mode, m.rate_per_s, m.process, m.burstiness, m.arrivals) == ("open", rate, "gamma", 0.5, "sent")
        assert run.requests["sent_s"].to_list() == pytest.approx(sent)
        np.testing.assert_allclose(arrivals_s(run), sent)
    assert runs[0].methodology.describe() == "gamma at 4 req/s (burstiness 0.5), times as sent"


def test_old_vllm_file_without_latencies_or_start_times() -> None:
    """benchmark_serving.py before `vllm bench serve` wrote neither latencies nor start_times:
    E2E is TTFT + the gaps (as vLLM's own timeline plot forms it), and the Poisson arrivals at
    2 req/s are generated (4 requests over 4 / 2 = 2 s, vLLM's normalisation)."""
    run = _one(DATA / "vllm" / "old-benchmark-serving.json")
    assert run.requests["e2e_s"].to_list() == pytest.approx([0.09, 0.10, 0.10, 0.10])
    m = run.methodology
    assert (m.mode, m.process, m.arrivals) == ("open", "poisson", "generated")
    t = arrivals_s(run)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    # the cumulative gamma sum is scaled to n / rate = 2 s, then taken from the first arrival
    assert t[-1] < 2.0 and np.array_equal(t, arrivals_s(run))  # a fixed seed: the same times each time


def test_guidellm_sweep_v02() -> None:
    """GuideLLM v0.2 benchmarks.json (args.strategy): a synchronous benchmark (one client) and a
    constant 2 req/s one whose errored request is counted, not replayed."""
    sync, const = read_runs(DATA / "guidellm" / "benchmarks.json")
    assert sync.name == "benchmarks.json#1" and const.name == "benchmarks.json#2"
    assert sync.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert (sync.methodology.mode, sync.methodology.concurrency) == ("closed", 1)
    assert sync.requests["input_tokens"].to_list() == [256, 512, 256]
    assert sync.requests["ttft_s"].to_list() == pytest.approx([0.060, 0.090, 0.060])
    assert sync.requests["e2e_s"].to_list() == pytest.approx([0.110, 0.120, 0.080])
    # inter_token_latency_ms = (last token − first token) / (output − 1): (0.108 − 0.060) / 4
    assert sync.requests["itl_mean_s"][0] == pytest.approx(0.012)
    assert sync.itls_s is None  # GuideLLM keeps no per-token gaps
    m = const.methodology
    assert (m.mode, m.process, m.rate_per_s, m.arrivals) == ("open", "constant", 2.0, "sent")
    assert const.failed == 1 and const.n == 2
    assert const.requests["sent_s"].to_list() == [0.0, 0.5]


def test_guidellm_v04_concurrent_with_rampup() -> None:
    """GuideLLM v0.4 (config.strategy, requests with info.timings): 2 streams with a 1 s rampup
    start their first requests at 0 and 0.5 s (rampup · i / streams); rooftrace's ramp puts client
    c at c · R / (C − 1), so R = 1 · (2 − 1) / 2 = 0.5 s. Requests come back in start order."""
    run = _one(DATA / "guidellm" / "benchmarks-v04.json")
    m = run.methodology
    assert (m.mode, m.concurrency, m.ramp_s) == ("closed", 2, 0.5)
    assert run.model == "Qwen/Qwen3-8B"
    assert run.requests["sent_s"].to_list() == pytest.approx([0.0, 0.08, 0.5])
    assert run.requests["ttft_s"].to_list() == pytest.approx([0.05, 0.09, 0.07])
    assert options_of(run).ramp_s == 0.5


def test_aiperf_export_with_its_aggregate_file() -> None:
    """AIPerf --concurrency 2: the per-request records (times in ms, converted), the failed
    record counted, the load generator read from profile_export_aiperf.json beside it; inputs.json
    and the aggregate file are no runs of their own."""
    runs = find_runs(DATA / "aiperf")
    assert [r.name for r in runs] == ["c2/profile_export.jsonl"]
    run = runs[0]
    assert run.model == "Qwen/Qwen3-0.6B"
    assert (run.methodology.mode, run.methodology.concurrency) == ("closed", 2)
    assert run.failed == 1 and run.n == 3
    assert run.requests["ttft_s"].to_list() == pytest.approx([0.040, 0.045, 0.042])
    assert run.requests["e2e_s"].to_list() == pytest.approx([0.060, 0.075, 0.064])
    assert run.requests["output_tokens"].to_list() == [3, 4, 3]
    assert run.requests["sent_s"].to_list() == pytest.approx([0.0, 0.0005, 0.060])
    assert run.itls_s is not None and run.itls_s.tolist() == pytest.approx([0.01] * 5 + [0.011] * 2)


def test_aiperf_without_its_aggregate_file_is_replayed_as_sent(tmp_path: Path) -> None:
    shutil.copy(DATA / "aiperf" / "c2" / "profile_export.jsonl", tmp_path)
    run = _one(tmp_path / "profile_export.jsonl")
    assert (run.methodology.mode, run.methodology.arrivals) == ("open", "sent")
    assert any("profile_export_aiperf.json" in n for n in run.notes)


def test_the_fixture_folder_reads_whole() -> None:
    names = [r.name for r in find_runs(DATA)]
    assert len(names) == 8 and names == sorted(names)


# -- hostile files: one line naming the file and the field ----------------------------------------


def _vllm_doc(**change: Any) -> dict[str, Any]:
    doc = json.loads(VLLM_C2.read_text())
    doc.update(change)
    return doc


def _refused(tmp_path: Path, text: str, *expect: str, name: str = "run.json") -> str:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(BenchRunError) as err:
        find_runs(p)
    msg = str(err.value)
    assert "\n" not in msg and str(p) in msg, msg
    for e in expect:
        assert e in msg, msg
    return msg


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("", ["empty file", "GuideLLM"]),
        ("   \n", ["empty file"]),
        (VLLM_C2.read_text()[:300], ["not valid JSON", "truncated"]),
        (json.dumps(_vllm_doc(ttfts=[0.05, -0.08, 0.0, 0.03, 0.1])), ["ttfts[1]", "negative"]),
        (json.dumps(_vllm_doc(ttfts=[0.05, 0.08, 0.0, 0.03])), ["ttfts", "4 values", "input_lens has 5"]),
        (json.dumps(_vllm_doc(input_lens=[100, 1e30, 150, 50, 300])), ["input_lens[1]", "out of range"]),
        (json.dumps(_vllm_doc(latencies=[0.072, 1e300, 0.0, 0.039, 0.14])), ["latencies[1]", "out of range"]),
        (json.dumps(_vllm_doc(input_lens=[100, 10**400, 150, 50, 300])), ["input_lens[1]"]),
        (json.dumps(_vllm_doc(ttfts=[0.05, "0.08", 0.0, 0.03, 0.1])), ["ttfts[1]", "must be a number"]),
        (json.dumps(_vllm_doc(ttfts=[0.05, True, 0.0, 0.03, 0.1])), ["ttfts[1]", "must be a number"]),
        (json.dumps(_vllm_doc(output_lens=[3, 4.5, 0, 2, 5])), ["output_lens[1]", "whole number"]),
        (
            json.dumps(_vllm_doc(latencies=[0.072, 0.05, 0.0, 0.039, 0.14])),
            ["latencies[1]", "below the request's TTFT"],
        ),
        (json.dumps(_vllm_doc(itls=[[0.01], "x", [], [0.009], [0.01]])), ["itls[1]", "list of gaps"]),
        (json.dumps(_vllm_doc(input_lens=[])), ["input_lens", "no requests"]),
        (json.dumps(_vllm_doc(errors=["e"] * 5)), ["every one of its 5 requests failed"]),
        (json.dumps(_vllm_doc(max_concurrency=0)), ["max_concurrency", ">= 1"]),
        (json.dumps(_vllm_doc(request_rate="fast")), ["request_rate", "must be a number"]),
        (json.dumps({k: v for k, v in _vllm_doc().items() if k != "ttfts"}), ["ttfts missing"]),
        (json.dumps({"mean_ttft_ms": 5.0, "max_concurrency": 4, "request_rate": "inf"}), ["--save-detailed"]),
        (json.dumps({"hello": "world"}), ["not a benchmark result", "known:", "AIPerf"]),
        (json.dumps([1, 2, 3]), ["not a benchmark result"]),
        ('{"ttfts": [NaN], "input_lens": [1], "output_lens": [1], "latencies": [1.0]}', ["ttfts[0]", "finite"]),
        (json.dumps(_vllm_doc(request_rate=2.0, start_times=None)), ["max_concurrency 2", "start_times"]),
        ("[" * 100_000, ["nested too deeply"]),
        ('{"ttfts": [1], "input_lens": [' + "9" * 5000 + "]}", ["not readable JSON"]),
    ],
)
def test_hostile_vllm_and_unknown_files(tmp_path: Path, text: str, expect: list[str]) -> None:
    _refused(tmp_path, text, *expect)


def _guidellm_doc() -> dict[str, Any]:
    return json.loads((DATA / "guidellm" / "benchmarks.json").read_text())


def test_hostile_guidellm(tmp_path: Path) -> None:
    doc = _guidellm_doc()
    doc["benchmarks"][0]["request_totals"]["successful"] = 50  # sampled: 3 of 50 listed
    _refused(tmp_path, json.dumps(doc), "benchmarks[0].requests", "sampled", "3 of 50")
    doc = _guidellm_doc()
    doc["benchmarks"][1]["args"]["strategy"] = {"type_": "zigzag"}
    _refused(tmp_path, json.dumps(doc), "benchmarks[1].strategy.type_", "'zigzag' unknown")
    doc = _guidellm_doc()
    doc["benchmarks"][0]["requests"]["successful"][1]["time_to_first_token_ms"] = -5
    _refused(tmp_path, json.dumps(doc), "benchmarks[0].requests.successful[1].time_to_first_token_ms", "negative")
    doc = _guidellm_doc()
    del doc["benchmarks"][0]["requests"]["successful"][2]["prompt_tokens"]
    _refused(tmp_path, json.dumps(doc), "successful[2].prompt_tokens", "must be a number")
    _refused(tmp_path, json.dumps({"benchmarks": []}), "benchmarks", "non-empty")


def test_hostile_aiperf(tmp_path: Path) -> None:
    lines = (DATA / "aiperf" / "c2" / "profile_export.jsonl").read_text().splitlines()
    name = "profile_export.jsonl"
    _refused(tmp_path, "\n".join([*lines[:2], lines[2][:40]]) + "\n", "line 3", "not valid JSON", name=name)
    rec = json.loads(lines[1])
    rec["metrics"]["time_to_first_token"]["unit"] = "fortnights"
    _refused(tmp_path, "\n".join([lines[0], json.dumps(rec)]), "line 2.metrics.time_to_first_token.unit", name=name)
    rec = json.loads(lines[1])
    rec["metrics"]["request_latency"]["value"] = -1
    _refused(
        tmp_path, "\n".join([lines[0], json.dumps(rec)]), "line 2.metrics.request_latency.value", "negative", name=name
    )
    _refused(tmp_path, lines[3] + "\n", "no successful profiling request", name=name)


def test_validate_runs_refuses_in_one_line_through_the_cli(tmp_path: Path) -> None:
    """No traceback: exit 1 and one `error:` line naming the file and field."""
    bad = tmp_path / "runs"
    bad.mkdir()
    (bad / "c4.json").write_text(json.dumps(_vllm_doc(ttfts=[0.05, 0.08, 0.0, 0.03])))
    res = subprocess.run(
        [sys.executable, "-m", "pipeline", "validate", "--runs", str(bad), "--store", str(tmp_path / "store")],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "c4.json: ttfts has 4 values" in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not any(s in res.stderr for s in KNOWN_SHAPES)


# -- validate --runs with a known truth ----------------------------------------------------------------


def _fleet(tmp_path: Path, hw: str) -> Path:
    p = tmp_path / f"{hw}.toml"
    p.write_text(ONE_H100.format(hw=hw))
    return p


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A closed-loop sweep at 1, 4 and 16 clients made by replaying 240 requests on one H100
    (the truth), and the same sweep made on one A100 80GB (another GPU); the H100 fleet file."""
    root = tmp_path_factory.mktemp("benchruns")
    h100 = _fleet(root, "h100-sxm")
    requests = workload(240)
    _, fleet = load_one_pool(h100)
    write_sweep(root / "h100", requests, fleet, [1, 4, 16], "meta-llama/Llama-3.1-8B-Instruct")
    _, other = load_one_pool(_fleet(root, "a100-80gb-sxm"))
    write_sweep(root / "a100", requests, other, [1, 4, 16], "meta-llama/Llama-3.1-8B-Instruct")
    return root / "h100", root / "a100", h100


def test_a_sweep_made_by_the_replay_is_reproduced_exactly(sweep: tuple[Path, Path, Path]) -> None:
    """The methodology is reproduced: each run replayed as a closed loop of its own concurrency on
    the fleet that made it gives back every TTFT, TPOT and E2E, and the token gaps, with ~0 error
    (mean, p50, p90, p99 all within 0.1 %); one row per run and metric."""
    h100_runs, _, h100 = sweep
    out = validate_runs(h100_runs, h100)
    t = out.table
    assert t.height == 3 * 4
    assert sorted(set(t["methodology"])) == [
        "closed loop, 1 client",
        "closed loop, 16 clients",
        "closed loop, 4 clients",
    ]
    assert set(t["metric"]) == {"TTFT", "TPOT", "ITL", "E2E"}
    for col in ("mean_error", "p50_error", "p90_error", "p99_error"):
        worst = max(abs(x) for x in t[col].to_list())
        assert worst < 1e-3, (col, t.filter(t[col].abs() >= 1e-3))
    assert t["replayed"].to_list() == [240] * 12
    assert not out.notes  # the runs name the fleet's model (its Hugging Face name)


def test_a_sweep_made_on_another_gpu_shows_a_clear_error(sweep: tuple[Path, Path, Path]) -> None:
    """The same sweep measured on an A100 80GB and replayed on the H100 fleet: the replay is
    faster than the 'server' (H100 memory bandwidth 3.35 TB/s against 2.04), so TPOT and E2E
    come out clearly negative at every concurrency."""
    _, a100_runs, h100 = sweep
    t = validate_runs(a100_runs, h100).table
    tpot = t.filter(t["metric"] == "TPOT")["mean_error"].to_list()
    e2e = t.filter(t["metric"] == "E2E")["mean_error"].to_list()
    assert len(tpot) == 3 and all(e < -0.15 for e in tpot + e2e), (tpot, e2e)


def test_validate_runs_cli_stores_prints_and_the_report_shows(
    sweep: tuple[Path, Path, Path], replayed_store: tuple[Any, str], tmp_path: Path
) -> None:
    """The command prints one line per run and metric, stores the table under STORE/validation
    (the same bytes when run again), and the report of a run in that store shows it."""
    from pipeline.publish.report import BENCH_RUNS_TITLE, build_report

    store, run_id = replayed_store
    runs = tmp_path / "runs"
    shutil.copytree(sweep[0], runs / "sweep")
    shutil.copytree(DATA, runs / "handwritten")
    cmd = [sys.executable, "-m", "pipeline", "validate", "--runs", str(runs), "--fleet", str(sweep[2]),
           "--store", str(store.root)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    assert res.returncode == 0, res.stderr
    body = res.stdout.splitlines()
    assert body[1].split()[:4] == ["run", "tool", "methodology", "reqs"]
    assert len(body) == 2 + 11 * 4  # 3 sweep runs + 8 hand-written ones, 4 metrics each
    path = store.validation_dir / "runs.parquet"
    first = path.read_bytes()
    assert subprocess.run(cmd, capture_output=True, cwd=ROOT, check=False).returncode == 0
    assert path.read_bytes() == first
    table = stored_table(store)
    assert table is not None and table.height == 44
    guidellm = table.filter(table["tool"] == "guidellm")
    assert guidellm.filter(guidellm["metric"] == "ITL")["mean_error"].null_count() == guidellm.height // 4
    page = build_report(store, run_id, out=tmp_path / "index.html").path.read_text()
    assert "Benchmark runs replayed" in page and BENCH_RUNS_TITLE.split(" (")[0] in page
    assert "openai-infqps-concurrency16" in page


def test_json_output(sweep: tuple[Path, Path, Path], tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pipeline", "validate", "--runs", str(sweep[0]), "--fleet", str(sweep[2]),
         "--store", str(tmp_path / "store"), "--json"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["fleet"] == "one-h100" and len(doc["runs"]) == 12
    assert all(math.isfinite(r["mean_error"]) for r in doc["runs"])


def test_weighted_percentile_is_the_inverse_cdf() -> None:
    v = np.array([3.0, 1.0, 2.0])
    w = np.array([1.0, 1.0, 2.0])  # the set 1, 2, 2, 3
    assert [weighted_percentile(v, w, p) for p in (25, 50, 75, 76, 100)] == [1.0, 2.0, 2.0, 3.0, 3.0]


def test_closed_loop_truth_file_is_a_vllm_file(tmp_path: Path) -> None:
    """The truth writer's file carries what vllm bench serve --save-detailed writes."""
    _, fleet = load_one_pool(_fleet(tmp_path, "h100-sxm"))
    doc = closed_loop_result(workload(12), fleet, 3, "m")
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors",
                "max_concurrency", "request_rate", "burstiness", "model_id", "duration"):  # fmt: skip
        assert key in doc
    assert [len(g) for g in doc["itls"]] == [o - 1 for o in doc["output_lens"]]
