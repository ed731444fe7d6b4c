"""Step telemetry (pipeline/ingest/steptelemetry.py) and the stack calibration fitted on it
(``calibrate --observed --steps``, pipeline/calibrate/step_fit.py; docs/calibration.md).

The synthetic truth: steps of known token mixes (prefill chunks at known offsets, decodes at known
contexts) priced by the H100's tables under a known stack — linear layers 25 % slower, attention
20 % faster, 1.5 ms more per step — with 3 % log-normal noise, written as Dynamo
ForwardPassMetrics lines. The reader sees only the sums the format carries (so the prefill
attention is rebuilt from equal chunks, not the chunks the truth priced); the fit must find the
parameters again and price the held-out (larger) steps within a few per cent."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_checks import cli, one_error

from pipeline.calibrate.step_fit import fit_steps, split_steps, step_batch, step_errors
from pipeline.costmodel.stackcal import apply
from pipeline.costmodel.steps import StepBatch
from pipeline.ingest.steptelemetry import StepTelemetryError, read_steps
from pipeline.replay.fleet import FleetConfig, load_fleet, resolve

#: The stack the synthetic steps come from.
TRUTH = {"linear_scale": 1.25, "attention_scale": 0.8, "comm_scale": 1.0, "step_overhead_s": 0.0015}


def _fpm(i: int, wall: float, npf: int, t: int, k: int, d: int, dctx: int) -> dict[str, Any]:
    """One record in Dynamo's ForwardPassMetrics v1 wire schema (the serde struct
    ``ForwardPassMetrics {version, worker_id, dp_rank, counter_id, wall_time, scheduled_requests,
    queued_requests}``, ScheduledRequestMetrics / QueuedRequestMetrics field names, as mirrored in
    NVIDIA AIConfigurator's Rust copy of the v1 schema, 2026)."""
    return {
        "version": 1,
        "worker_id": "worker-0",
        "dp_rank": 0,
        "counter_id": i,
        "wall_time": wall,
        "scheduled_requests": {
            "num_prefill_requests": npf,
            "sum_prefill_tokens": t,
            "var_prefill_length": 0.0,
            "sum_prefill_kv_tokens": k,
            "num_decode_requests": d,
            "sum_decode_kv_tokens": dctx,
            "var_decode_kv_tokens": 0.0,
        },
        "queued_requests": {
            "num_prefill_requests": 0,
            "sum_prefill_tokens": 0,
            "var_prefill_length": 0.0,
            "num_decode_requests": 0,
            "sum_decode_kv_tokens": 0,
            "var_decode_kv_tokens": 0.0,
        },
    }


def synthetic_steps(fleet: Any, n: int = 1500, seed: int = 0, noise: float = 0.03) -> list[dict[str, Any]]:
    """``n`` steps (40 % decode only, 25 % prefill only, 35 % mixed) priced exactly — each prefill
    chunk at its own offset — under :data:`TRUTH`, times log-normal noise."""
    rng = np.random.default_rng(seed)
    shapes: list[tuple[int, int, int, int, int, float, float]] = []
    for _ in range(n):
        kind = int(rng.choice(3, p=[0.4, 0.25, 0.35]))
        d = dctx = 0
        if kind != 1:
            d = int(rng.integers(1, 257))
            dctx = int(np.maximum(1, rng.lognormal(math.log(1500), 0.8, d)).astype(int).sum())
        npf = t = k = 0
        pairs = kv = 0.0
        if kind != 0:
            npf = int(rng.integers(1, 4))
            c = rng.integers(16, 2049, npf)
            o = np.where(rng.random(npf) < 0.5, 0, rng.integers(0, 6001, npf))
            t, k = int(c.sum()), int(o.sum())
            pairs, kv = float(np.sum(c * o + c * (c + 1) / 2)), float(np.sum(o + c))
        shapes.append((npf, t, k, d, dctx, pairs, kv))
    a = np.array(shapes, dtype=np.float64)
    exact = StepBatch(a[:, 1], a[:, 0], a[:, 5], a[:, 6], a[:, 3], a[:, 4])
    wall = apply(fleet.cost_model.table, TRUTH)(exact).time_s * np.exp(rng.normal(0.0, noise, n))
    return [_fpm(i, float(w), *s[:5]) for i, (w, s) in enumerate(zip(wall, shapes, strict=True))]


def _lines(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def fleet() -> Any:
    return resolve(FleetConfig(name="prod", model="llama-3.1-8b", hardware="h100-sxm", replicas=1))


@pytest.fixture(scope="module")
def truth_file(tmp_path_factory: pytest.TempPathFactory, fleet: Any) -> Path:
    return _lines(tmp_path_factory.mktemp("steps") / "fpm.jsonl", synthetic_steps(fleet))


@pytest.mark.parametrize("hold_out", ["shape", "file"])
def test_the_known_stack_is_recovered_from_step_times(truth_file: Path, fleet: Any, hold_out: str) -> None:
    """Each parameter within 10 % of the truth (measured: within 4 %), the held-out steps priced
    within a few per cent (3 % noise alone gives a mean |e| of 2.4 %), the uncalibrated tables
    clearly worse on the same steps."""
    tel = read_steps(truth_file)
    assert (tel.rows_in, tel.used, len(tel.quarantined)) == (1500, 1500, 0)
    fit = fit_steps(tel, fleet, hold_out=hold_out)
    assert fit.fitted == ("linear_scale", "attention_scale", "step_overhead_s")
    for name in fit.fitted:
        assert getattr(fit.calibration, name) == pytest.approx(TRUTH[name], rel=0.10), name
    assert fit.held_out["mean_abs"] < 0.035
    assert abs(fit.held_out["bias"]) < 0.01
    assert fit.held_out["p90_abs"] < 0.07
    assert fit.held_out_uncalibrated["mean_abs"] > 2 * fit.held_out["mean_abs"]
    assert fit.refusal() is None
    if hold_out == "shape":  # the judged steps are the larger ones
        train, split = split_steps(tel.steps, "shape", 0.6)
        sizes = tel.steps.get_column("batch_size").to_numpy()
        assert fit.n_train == int(train.sum()) == 900 and split == fit.split
        assert sizes[train].max() <= sizes[~train].min()


def test_telemetry_the_fleet_cannot_explain_is_refused(tmp_path: Path, fleet: Any) -> None:
    """Step times unrelated to the steps' work (log-normal around 40 ms, sigma 1): no calibration."""
    recs = synthetic_steps(fleet, n=300, seed=3)
    rng = np.random.default_rng(5)
    for r in recs:
        r["wall_time"] = float(rng.lognormal(math.log(0.04), 1.0))
    fit = fit_steps(read_steps(_lines(tmp_path / "noise.jsonl", recs)), fleet)
    why = fit.refusal()
    assert why is not None and "cannot explain the step telemetry" in why and "no calibration written" in why


def test_step_batch_rebuilds_the_prefill_attention_from_equal_chunks(tmp_path: Path) -> None:
    """T = 1024 fresh tokens over n = 3 prefills that read K = 256: pairs T·K/n + T·(T/n + 1)/2,
    KV read K + T; decodes as given."""
    tel = read_steps(_lines(tmp_path / "one.jsonl", [_fpm(0, 0.025, 3, 1024, 256, 5, 9000)]))
    b = step_batch(tel.steps)
    assert b.prefill_attn_pairs[0] == pytest.approx(1024 * 256 / 3 + 1024 * (1024 / 3 + 1) / 2)
    assert (b.prefill_tokens[0], b.prefill_seqs[0], b.prefill_kv_tokens[0]) == (1024, 3, 1280)
    assert (b.decode_seqs[0], b.decode_ctx_tokens[0]) == (5, 9000)
    e = step_errors(np.array([1.1, 0.8, 1.0]), np.array([1.0, 1.0, 1.0]))
    assert e["mean_abs"] == pytest.approx(0.1) and e["bias"] == pytest.approx(-0.1 / 3)
    assert e["p50_abs"] == pytest.approx(0.1) and e["p90_abs"] == pytest.approx(0.2)


# -- the readers, on hand-written files of each layout ---------------------------------------------


def test_reads_tensorrt_llm_iteration_stats(tmp_path: Path) -> None:
    """A ``get_stats()`` / ``/metrics`` JSON array (IterationStats as TensorRT-LLM's executor
    serialises it: tests/unittest/bindings/test_executor_bindings.py ``test_iteration_stats`` for
    the top-level keys, ``kvCacheStats`` and ``inflightBatchingStats`` as in TensorRT-LLM PR #13199,
    merged 2026-04, which added ``numCtxKvTokens`` / ``numGenKvTokens``). The second record is of a
    release before that PR: the decodes' context comes from the KV blocks in use."""
    stats = [
        {
            "timestamp": "01:23:56",
            "iter": 41,
            "iterLatencyMS": 25.0,
            "newActiveRequestsQueueLatencyMS": 0.0,
            "numActiveRequests": 8,
            "numQueuedRequests": 0,
            "numCompletedRequests": 1,
            "maxNumActiveRequests": 256,
            "gpuMemUsage": 70_000_000_000,
            "cpuMemUsage": 0,
            "pinnedMemUsage": 0,
            "kvCacheStats": {
                "maxNumBlocks": 1000,
                "freeNumBlocks": 400,
                "usedNumBlocks": 600,
                "tokensPerBlock": 64,
                "allocTotalBlocks": 600,
                "allocNewBlocks": 10,
                "reusedBlocks": 4,
                "missedBlocks": 10,
                "cacheHitRate": 0.28,
            },
            "inflightBatchingStats": {
                "numScheduledRequests": 8,
                "numContextRequests": 3,
                "numGenRequests": 5,
                "numPausedRequests": 0,
                "numCtxTokens": 1024,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 1.0,
                "numCtxKvTokens": 256,
                "numGenKvTokens": 9000,
            },
        },
        {
            "iter": 42,
            "iterLatencyMS": 12.5,
            "numActiveRequests": 5,
            "kvCacheStats": {"maxNumBlocks": 1000, "freeNumBlocks": 850, "usedNumBlocks": 150, "tokensPerBlock": 64},
            "inflightBatchingStats": {
                "numScheduledRequests": 5,
                "numContextRequests": 1,
                "numGenRequests": 4,
                "numPausedRequests": 0,
                "numCtxTokens": 600,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 1.0,
            },
        },
    ]
    (tmp_path / "iter.json").write_text(json.dumps(stats, indent=2))
    tel = read_steps(tmp_path / "iter.json")
    assert tel.formats == {"trtllm": 2} and tel.rows_in == 2
    a, b = tel.steps.to_dicts()
    assert a["wall_s"] == pytest.approx(0.025)
    assert (a["prefill_tokens"], a["cached_tokens"], a["prefill_seqs"]) == (1024, 256, 3)
    assert (a["decode_seqs"], a["decode_ctx_tokens"], a["kv_tokens"], a["context_from"]) == (5, 9000, 38400, "reported")
    assert b["wall_s"] == pytest.approx(0.0125)
    # 150 blocks x 64 tokens = 9,600 in use, less the prefill's 600 fresh tokens (no KV read reported)
    assert (b["decode_seqs"], b["decode_ctx_tokens"], b["context_from"]) == (4, 9000, "kv_blocks")
    assert (a["line"], b["line"]) == (1, 2)  # elements of the array, numbered from 1


def test_reads_sglang_scheduler_logs(tmp_path: Path) -> None:
    """SGLang's scheduler log as it prints it (``[time TP0] `` prefix; lines as in
    python/sglang/srt/managers/scheduler.py ``log_prefill_stats`` / ``log_decode_stats``, v0.4.x):
    a decode line's step is the interval's mean, #running-req / gen throughput (× accept len with
    speculative decoding); a prefill line has no time and is quarantined; other lines are no rows."""
    log = (
        "[2025-03-04 10:00:00 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16\n"
        "[2025-03-04 10:00:01 TP0] Prefill batch. #new-seq: 2, #new-token: 3071, #cached-token: 1024, "
        "token usage: 0.01, #running-req: 10, #queue-req: 0\n"
        "[2025-03-04 10:00:02 TP0] Decode batch. #running-req: 12, #token: 9000, token usage: 0.04, "
        "cuda graph: True, gen throughput (token/s): 480.00, #queue-req: 0\n"
        '[2025-03-04 10:00:02] INFO:     127.0.0.1:5000 - "POST /generate HTTP/1.1" 200 OK\n'
        "[2025-03-04 10:00:03 TP0] Decode batch. #running-req: 12, #token: 9480, token usage: 0.04, "
        "accept len: 2.50, cuda graph: True, gen throughput (token/s): 1200.00, #queue-req: 0\n"
    )
    (tmp_path / "server.log").write_text(log)
    tel = read_steps(tmp_path / "server.log")
    assert (tel.rows_in, tel.used, len(tel.quarantined)) == (3, 2, 1)
    assert tel.quarantined[0].line == 2 and "no step time" in tel.quarantined[0].reason
    a, b = tel.steps.to_dicts()
    assert a["wall_s"] == pytest.approx(12 / 480) and b["wall_s"] == pytest.approx(12 * 2.5 / 1200)
    assert (a["decode_seqs"], a["decode_ctx_tokens"], a["time_kind"], a["line"]) == (12, 9000, "interval_mean", 3)


# -- hostile input ---------------------------------------------------------------------------------


def test_bad_records_are_quarantined_with_line_and_field(tmp_path: Path) -> None:
    """Every record is used or quarantined, with its line, its field and why (rows in = used +
    quarantined)."""
    good = _fpm(0, 0.02, 1, 512, 0, 8, 8000)

    def bad(**over: Any) -> str:
        rec = json.loads(json.dumps(good))
        for key, v in over.items():
            if key in rec:
                rec[key] = v
            else:
                rec["scheduled_requests"][key] = v
        return json.dumps(rec)

    text = "\n".join(
        [
            json.dumps(good),
            json.dumps(good)[:57],  # truncated
            '{"version": 1, "counter_id": 2, "wall_time": NaN, "scheduled_requests": {}}',
            bad(wall_time=-0.01),
            bad(wall_time=1e300),
            bad(sum_prefill_tokens=10**30),
            bad(num_decode_requests="many"),
            bad(num_decode_requests=True),
            bad(wall_time=0),
            bad(sum_prefill_tokens=0, num_decode_requests=0, sum_decode_kv_tokens=0, num_prefill_requests=0),
            bad(version=2),
            bad(sum_prefill_tokens=1.5),
            "[1, 2]",
            "",
            json.dumps(good),
        ]
    )
    (tmp_path / "hostile.jsonl").write_text(text + "\n")
    tel = read_steps(tmp_path / "hostile.jsonl")
    assert tel.used == 2 and tel.rows_in == 14 and tel.rows_in == tel.used + len(tel.quarantined)
    got = {q.line: q.text() for q in tel.quarantined}
    path = str(tmp_path / "hostile.jsonl")
    assert got[2].startswith(f"{path}: line 2: not valid JSON") and "truncated" in got[2]
    assert "wall_time: must be finite, got nan" in got[3]
    assert "wall_time: is negative" in got[4]
    assert "wall_time: 1e+300 is out of range" in got[5]
    assert "scheduled_requests.sum_prefill_tokens: 1000000000000000000000000000000 is out of range" in got[6]
    assert 'scheduled_requests.num_decode_requests: must be a number, got "many"' in got[7]
    assert "scheduled_requests.num_decode_requests: must be a number, got true" in got[8]
    assert "wall_time: is 0" in got[9]
    assert "no tokens scheduled" in got[10]
    assert "version: 2; read: 1" in got[11]
    assert "must be a whole number, got 1.5" in got[12]
    assert "not a fpm record" in got[13]
    reasons = {r for r, _n, _q in tel.reasons()}
    assert "wall_time: is negative (N)" in reasons


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "empty file"),
        ("   \n", "empty file"),
        ('[{"iterLatencyMS": 25.0, "inflightBatchingStats": {"numCtxT', "a JSON array that does not parse at line 1"),
        ('{"model": "x", "ttfts": [0.1]}\n', "JSON of no step-telemetry layout"),
        ("hello world\n", "no step-telemetry layout rooftrace reads"),
    ],
)
def test_unreadable_files_are_one_line_naming_the_file(tmp_path: Path, content: str, needle: str) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(content)
    with pytest.raises(StepTelemetryError, match=needle) as exc:
        read_steps(f)
    assert str(exc.value).startswith(str(f)) and "\n" not in str(exc.value)


def test_odd_paths_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "b.log").write_bytes(b"\xff\xfe\x00binary")
    for path, needle in (
        (tmp_path / "missing", "no such file or folder"),
        (tmp_path / "b.log", "not UTF-8 text"),
        ("", "an empty path"),
    ):
        with pytest.raises(StepTelemetryError, match=needle):
            read_steps(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StepTelemetryError, match="no telemetry files"):
        read_steps(tmp_path / "empty")


def test_a_folder_reads_each_file_in_name_order(tmp_path: Path) -> None:
    _lines(tmp_path / "b.jsonl", [_fpm(0, 0.02, 1, 100, 0, 0, 0)])
    (tmp_path / "a.log").write_text(
        "[2025-03-04 10:00:02 TP0] Decode batch. #running-req: 4, #token: 400, token usage: 0.01, "
        "cuda graph: True, gen throughput (token/s): 200.00, #queue-req: 0\n"
    )
    tel = read_steps(tmp_path)
    assert tel.steps.get_column("format").to_list() == ["sglang", "fpm"]
    assert tel.formats == {"sglang": 1, "fpm": 1}


# -- the command -----------------------------------------------------------------------------------


def test_cli_fits_steps_and_a_fleet_includes_the_file(tmp_path: Path, truth_file: Path) -> None:
    fleet_file = tmp_path / "prod.toml"
    fleet_file.write_text('name = "prod"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n')
    out = tmp_path / "cal.toml"
    res = cli("calibrate", "--observed", "--fleet", str(fleet_file), "--steps", str(truth_file), "--out", str(out),
              "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["records"] == 1500 and doc["steps_used"] == 1500 and doc["held_out"]["mean_abs"] < 0.035
    table = tomllib.loads(out.read_text())
    assert table["fit"]["fitted_on"] == "step telemetry" and table["errors"]["held_out"]["step"]["n"] == 600
    including = tmp_path / "calibrated.toml"
    including.write_text('name = "c"\nmodel = "qwen3-8b"\nhardware = "h100-sxm"\ncalibration_file = "cal.toml"\n')
    cal = load_fleet(including).stack_calibration
    assert cal is not None and cal.linear_scale == pytest.approx(TRUTH["linear_scale"], rel=0.1)
    again = tmp_path / "again.toml"
    cli("calibrate", "--observed", "--fleet", str(fleet_file), "--steps", str(truth_file), "--out", str(again))
    assert again.read_bytes() == out.read_bytes()  # a re-run gives the same bytes


def test_cli_argument_and_file_errors_are_one_line(tmp_path: Path) -> None:
    fleet_file = tmp_path / "prod.toml"
    fleet_file.write_text('name = "prod"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n')
    steps = _lines(tmp_path / "s.jsonl", [_fpm(0, 0.02, 1, 100, 0, 0, 0)])
    one_error(cli("calibrate", "--steps", str(steps), "--fleet", str(fleet_file)), "--steps is for --observed")
    one_error(cli("calibrate", "--observed", "--steps", str(steps)), "--steps needs --fleet")
    one_error(
        cli("calibrate", "--observed", "--fleet", str(fleet_file), "--steps", str(steps), "--date", "2025-01-01"),
        "--date is for a day of logs",
    )
    one_error(cli("calibrate", "--observed", "--fleet", str(fleet_file), "--steps", str(tmp_path / "nope")),
              "no such file or folder of step telemetry")  # fmt: skip
    one_error(cli("calibrate", "--observed", "--fleet", str(fleet_file), "--steps", str(steps)),
              "only 1 of the 1 telemetry records are usable steps")  # fmt: skip
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"version": 1, "counter_id": 0, "wall_time": -1, "scheduled_requests": {}}\n')
    one_error(cli("calibrate", "--observed", "--fleet", str(fleet_file), "--steps", str(bad)),
              "none of the 1 telemetry records is usable", "wall_time: is negative")  # fmt: skip
    assert not list(tmp_path.glob("*calibration.toml"))


def test_refused_fit_writes_nothing(tmp_path: Path) -> None:
    fleet = resolve(FleetConfig(name="prod", model="llama-3.1-8b", hardware="h100-sxm"))
    recs = synthetic_steps(fleet, n=200, seed=4)
    rng = np.random.default_rng(6)
    for r in recs:
        r["wall_time"] = float(rng.lognormal(math.log(0.04), 1.0))
    steps = _lines(tmp_path / "noise.jsonl", recs)
    fleet_file = tmp_path / "prod.toml"
    fleet_file.write_text('name = "prod"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n')
    out = tmp_path / "cal.toml"
    one_error(cli("calibrate", "--observed", "--fleet", str(fleet_file), "--steps", str(steps), "--out", str(out)),
              "cannot explain the step telemetry")  # fmt: skip
    assert not out.exists()
