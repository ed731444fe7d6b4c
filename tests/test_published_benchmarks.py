"""The replay against published serving measurements (issue 5, "Against measurements").

Each benchmark is replayed as a synthetic workload of its shape (lengths, concurrency, offline)
through a fleet in fleets/ that records the assumed settings, and compared with the published
figure. Errors are replayed / measured − 1; the bounds asserted are the ones the catalog as
shipped meets (measured values and the reasons for the misses: docs/replay_validation.md).
Sources: ../shared/measurements/{mlperf-inference-v4.1,published-benchmarks}/SOURCE.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path
from published import (
    ARGONNE_CSV,
    ARGONNE_MODELS,
    MLPERF_SYSTEMS,
    NIM_CSV,
    TRTLLM_CSV,
    TRTLLM_FLEETS,
    ArgonneConfig,
    Comparison,
    NimPoint,
    TrtllmPoint,
    argonne_configs,
    argonne_fleet,
    benchmark_fleet,
    benchmark_requests,
    mlperf_summary_parts,
    openorca_lengths,
    read_argonne_table,
    read_mlperf_summary,
    read_nim_table,
    read_trtllm_table,
    replay_mlperf_offline,
    replay_nim_point,
    replay_static_batch,
    replay_trtllm_point,
    saturated_output_tokens_per_s,
)

from pipeline.replay.fleet import ResolvedFleet
from pipeline.replay.run import ReplayOptions, run_replay

PUBLISHED = ("measurements", "published-benchmarks")

#: Bounds met by the catalog as shipped (docs/replay_validation.md has every error).
MLPERF_OFFLINE_BOUND = 0.40  # measured +33 % (H100) and +38 % (H200): the replay is optimistic
MLPERF_ISSUE_TARGET = 0.20  # issue 5's target: met with the fleet's stack calibration (H100-fitted)
NIM_TTFT_BOUND = 0.40  # measured −5 % … +27 % away from the knee
#: At concurrency 100, the KV-capacity knee, TTFT moves with the KV capacity: +34 % with the old
#: memory fit, +55 % since pipeline.costmodel.fit follows vLLM's own accounting (2.4 % fewer blocks:
#: 27,442 instead of 28,114; NIM's TensorRT-LLM engine sizes its cache differently).
NIM_TTFT_KNEE_BOUND = 0.60
NIM_ITL_BOUND = 0.20  # measured +5 % … +16 %
TRTLLM_MEDIAN_BOUND = 0.08  # |error| over the 60 rows: measured median 6.9 %
#: measured max 20.4 % (Llama-3.3-70B, H100 TP2, 128 in / 4096 out; 18.7 % before pipeline.costmodel.fit
#: followed vLLM's accounting, which charges this 2048-seq fleet a 3.4 GiB sampler peak)
TRTLLM_MAX_BOUND = 0.21


def _summary(system: str, scenario: str = "Offline") -> object:
    return read_mlperf_summary(shared_path("measurements", *mlperf_summary_parts(system, scenario)))


def _fleet(name: str, calibrated: bool = True) -> ResolvedFleet:
    return benchmark_fleet(name, calibrated=calibrated)


# -- parsing: the numbers the tests compare against -----------------------------------------


def test_mlperf_summaries_parse_to_the_published_figures() -> None:
    # Hand-copied from the SOURCE.md key-numbers table (an independent transcription).
    h100, h200 = _summary("h100"), _summary("h200")
    assert (h100.samples_per_s, h100.tokens_per_s) == (84.4792, 24524.9)
    assert (h200.samples_per_s, h200.tokens_per_s) == (107.477, 31302.7)
    assert h100.scenario == h200.scenario == "Offline" and h100.result_valid and h200.result_valid
    assert h100.output_tokens_per_sample == pytest.approx(290.3, abs=0.05)
    server = _summary("h100", "Server")
    assert server.tokens_per_s == 21605.79
    assert server.ttft_mean_s == pytest.approx(0.2759, abs=1e-4)
    assert server.tpot_p99_s == pytest.approx(0.1754, abs=1e-4)


def test_published_tables_parse() -> None:
    nim = read_nim_table(shared_path(*PUBLISHED, NIM_CSV))
    assert [p.concurrency for p in nim] == [1, 5, 25, 50, 100, 150, 200, 250]
    assert nim[0].ttft_s == pytest.approx(0.40677) and nim[-1].itl_s == pytest.approx(0.0932)
    trt = read_trtllm_table(shared_path(*PUBLISHED, TRTLLM_CSV))
    assert len(trt) == 60 and {(p.model, p.gpu) for p in trt} == set(TRTLLM_FLEETS)
    assert all(p.precision == "FP8" for p in trt)


def test_openorca_lengths_have_the_dataset_shape() -> None:
    inp, out = openorca_lengths(20_000, 290.3, seed=3)
    assert inp.mean() == pytest.approx(119.1, rel=0.03)  # the tabulated sample's mean
    assert inp.min() >= 48 and inp.max() <= 953
    assert out.mean() == pytest.approx(290.3, rel=0.01) and out.min() >= 1 and out.max() <= 1024
    again = openorca_lengths(20_000, 290.3, seed=3)
    assert np.array_equal(inp, again[0]) and np.array_equal(out, again[1])


# -- MLPerf v4.1 Llama-2-70B Offline ----------------------------------------------------------

_MLPERF: dict[tuple[str, bool], Comparison] = {}


def _mlperf(system: str, calibrated: bool = False) -> Comparison:
    """The replay with the catalog's factors (a prediction) or with the fleet's [calibration]
    (the TensorRT-LLM FP8 stack's compute efficiency, fitted on the H100 result only)."""
    key = (system, calibrated)
    if key not in _MLPERF:
        fleet = _fleet(f"mlperf-llama2-70b-{system}", calibrated)
        _MLPERF[key] = replay_mlperf_offline(fleet, _summary(system))
    return _MLPERF[key]


@pytest.mark.parametrize("system", sorted(MLPERF_SYSTEMS))
def test_mlperf_offline_tokens_per_s(system: str) -> None:
    c = _mlperf(system)
    # One replica, 4 x max_num_seqs OpenOrca-shaped requests, saturated window, x replicas.
    assert abs(c.error) <= MLPERF_OFFLINE_BOUND, f"{c.name}: {c.replayed:.0f} vs {c.measured:.0f} ({c.error:+.1%})"
    # The direction is known (TensorRT-LLM's FP8 GEMMs reach a lower share of the FP8 peak than
    # the BF16-fitted compute efficiency assumes): a sign flip would mean something else changed.
    assert c.error > 0


@pytest.mark.parametrize("system", sorted(MLPERF_SYSTEMS))
def test_mlperf_offline_issue_target(system: str) -> None:
    """Issue 5's target, within 20 %, with the fleet's calibrated compute efficiency for the
    TensorRT-LLM FP8 stack. It was fitted on the H100 result only: H100 is a fit (error ~0 by
    construction), H200 is the held-out check (measured -3.8 %)."""
    c = _mlperf(system, calibrated=True)
    assert abs(c.error) <= MLPERF_ISSUE_TARGET, f"{c.name}: {c.replayed:.0f} vs {c.measured:.0f} ({c.error:+.1%})"
    if system == "h200":
        assert abs(c.error) <= 0.06  # measured -3.8 %


@pytest.mark.slow
def test_mlperf_offline_whole_fleet_matches_one_replica_scaled() -> None:
    # The fast test replays one replica and multiplies by the replica count; the whole 8-replica
    # H200 fleet with the same requests per replica must give the same saturated rate.
    fleet = _fleet("mlperf-llama2-70b-h200", calibrated=False)
    summary = _summary("h200")
    n = 4 * fleet.scheduler.max_num_seqs * fleet.config.replicas
    inp, out = openorca_lengths(n, summary.output_tokens_per_sample, seed=0)
    run = run_replay(benchmark_requests(inp, out), fleet, ReplayOptions(offline=True))
    assert saturated_output_tokens_per_s(run) == pytest.approx(_mlperf("h200", calibrated=False).replayed, rel=0.03)


@pytest.mark.slow
def test_mlperf_gap_is_one_fp8_compute_factor() -> None:
    """Fit the compute efficiency on the H100 result alone, then predict the H200 one (a
    different GPU, TP1 instead of TP2, another batch size): the held-out error is small, so the
    gap is the FP8 matmul rate, not the scheduling or the memory model."""

    def rate(system: str, eff: float) -> float:
        fleet = _fleet(f"mlperf-llama2-70b-{system}", calibrated=False)
        hw = dataclasses.replace(fleet.deployment.hardware, compute_efficiency=eff)
        fleet = dataclasses.replace(fleet, deployment=dataclasses.replace(fleet.deployment, hardware=hw))
        return replay_mlperf_offline(fleet, _summary(system)).replayed

    measured = _summary("h100").tokens_per_s
    lo, hi = 0.3, _fleet("mlperf-llama2-70b-h100", calibrated=False).deployment.hardware.compute_efficiency
    for _ in range(6):  # bisection: the replayed rate grows with the efficiency
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rate("h100", mid) < measured else (lo, mid)
    fitted = 0.5 * (lo + hi)
    held_out = rate("h200", fitted) / _summary("h200").tokens_per_s - 1.0
    assert 0.35 < fitted < 0.55
    assert abs(held_out) <= 0.10, f"fitted {fitted:.3f} on H100; H200 error {held_out:+.1%}"


# -- NIM fixed-concurrency table --------------------------------------------------------------


def _nim_points() -> list[NimPoint]:
    return read_nim_table(shared_path(*PUBLISHED, NIM_CSV))


@pytest.fixture(scope="module")
def nim_replays() -> dict[int, tuple[NimPoint, float, float]]:
    fleet = _fleet("nim-llama33-70b-h100-tp2")
    out = {}
    for p in _nim_points():
        # 6 rounds of C requests, the first (warm-up) round dropped: replay_nim_point
        out[p.concurrency] = (p, *replay_nim_point(fleet, p))
    return out


@pytest.mark.parametrize("concurrency", [1, 5, 25, 50, 100, 150, 200, 250])
def test_nim_closed_loop_ttft_and_itl(nim_replays: dict[int, tuple[NimPoint, float, float]], concurrency: int) -> None:
    p, ttft, itl = nim_replays[concurrency]
    bound = NIM_TTFT_KNEE_BOUND if concurrency == 100 else NIM_TTFT_BOUND
    assert abs(ttft / p.ttft_s - 1) <= bound, f"TTFT {ttft:.3f} s vs {p.ttft_s:.3f} s"
    assert abs(itl / p.itl_s - 1) <= NIM_ITL_BOUND, f"ITL {itl * 1e3:.1f} ms vs {p.itl_s * 1e3:.1f} ms"


def test_nim_saturation_is_where_the_kv_cache_fills(nim_replays: dict[int, tuple[NimPoint, float, float]]) -> None:
    # Measured: ITL flattens at ~93 ms from concurrency 100 and TTFT grows by queueing. The replay
    # must show the same knee: ITL at 150..250 within 5 % of each other, TTFT growing linearly.
    itls = [nim_replays[c][2] for c in (150, 200, 250)]
    assert max(itls) / min(itls) - 1 < 0.05
    ttfts = [nim_replays[c][1] for c in (150, 200, 250)]
    assert ttfts[0] < ttfts[1] < ttfts[2]
    assert (ttfts[2] - ttfts[1]) == pytest.approx(ttfts[1] - ttfts[0], rel=0.15)


# -- TensorRT-LLM throughput table ------------------------------------------------------------


def _trtllm_rate(p: TrtllmPoint) -> float:
    rate, preemptions = replay_trtllm_point(_fleet(TRTLLM_FLEETS[(p.model, p.gpu)]), p)
    assert preemptions == 0
    return rate


def _trtllm_points() -> list[TrtllmPoint]:
    return read_trtllm_table(shared_path(*PUBLISHED, TRTLLM_CSV))


def test_trtllm_table_all_rows() -> None:
    # 60 replays, ~10 s on the 2-core VM: fixed lengths with no preemption make long spans.
    points = _trtllm_points()
    errors = np.array([_trtllm_rate(p) / p.output_tokens_per_s - 1 for p in points])
    worst = points[int(np.argmax(np.abs(errors)))]
    assert np.median(np.abs(errors)) <= TRTLLM_MEDIAN_BOUND
    assert np.abs(errors).max() <= TRTLLM_MAX_BOUND, f"worst: {worst} ({errors.max():+.1%})"


# -- Argonne LLM-Inference-Bench: vLLM 0.5 / 0.6 static batches (checks; nothing fitted) ---------


def _argonne() -> dict[ArgonneConfig, float]:
    return argonne_configs(read_argonne_table(shared_path("measurements", *ARGONNE_CSV))[0])


def test_argonne_table_parses() -> None:
    points, skipped = read_argonne_table(shared_path("measurements", *ARGONNE_CSV))
    assert (len(points), skipped) == (513, 91)
    assert {p.model for p in points} == set(ARGONNE_MODELS)
    assert {(p.gpu, p.tp) for p in points} == {(g, t) for g in ("a100-40gb-sxm", "h100-sxm") for t in (1, 2, 4)}
    # hand-copied from Plots/All_results.csv line 705
    first = points[0]
    assert (first.gpu, first.model, first.tp, first.length, first.batch, first.line) == (
        "a100-40gb-sxm",
        "meta-llama/Llama-2-7b-hf",
        1,
        128,
        1,
        705,
    )
    assert first.latency_s == pytest.approx(1.653030714020133)
    assert len(_argonne()) == 491  # 22 rows repeat a configuration


def test_argonne_h100_measured_tier_is_faster_than_vllm_v0_by_host_time() -> None:
    # The measured tier models today's vLLM (V1, asynchronous scheduling hides the host's step
    # work); the table ran vLLM 0.5 / 0.6, whose host work per step ran in series with the GPU.
    # So every replay must be faster than the run (the GPU work alone), and the gap per step must
    # grow with the TP degree (more workers to drive) and with the batch (per-sequence Python
    # work): benchmarks/argonne_vllm.py prints the whole table (docs/replay_validation.md).
    runs = _argonne()
    gap: dict[tuple[int, int], list[float]] = {}
    for tp in (1, 2, 4):
        fleet = argonne_fleet("h100-sxm", "meta-llama/Meta-Llama-3-8B", tp)
        for length in (128, 512):
            for batch in (1, 64):
                measured = runs[("h100-sxm", "meta-llama/Meta-Llama-3-8B", tp, length, batch)]
                replayed = replay_static_batch(fleet, length, batch)
                assert 0.15 < measured / replayed - 1 < 1.6, (tp, length, batch, measured, replayed)
                gap.setdefault((tp, batch), []).append((measured - replayed) / length)
    per_step = {k: float(np.median(v)) for k, v in gap.items()}
    assert per_step[(1, 1)] < per_step[(2, 1)] < per_step[(4, 1)]
    for tp in (1, 2, 4):
        assert per_step[(tp, 64)] > per_step[(tp, 1)] + 1e-3  # > 1 ms more per step at 64 sequences
    assert 1.0e-3 < per_step[(1, 1)] < 3.0e-3  # ~1.9 ms at TP 1, batch 1


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "median_bound", "max_bound"),
    [
        # the one MoE model of the table, A100 (no measured profile: the roofline tier)
        ("mistralai/Mixtral-8x7B-v0.1", "a100-40gb-sxm", 4, 0.13, 0.25),
        ("meta-llama/Meta-Llama-3-8B", "a100-40gb-sxm", 1, 0.09, 0.17),
        ("meta-llama/Llama-2-70b-hf", "h100-sxm", 4, 0.12, 0.20),
    ],
)
def test_argonne_roofline_tier(model: str, gpu: str, tp: int, median_bound: float, max_bound: float) -> None:
    # The roofline tier charges a flat 1.857 ms per step in series (derived from an earlier
    # vLLM's latency run), close to what vLLM 0.5 / 0.6 spent: measured median |e| 11.5 %, 7.7 %,
    # 10.8 % over these blocks' 20 configurations (benchmarks/argonne_vllm.py); checked here at
    # lengths 128 and 1,024 over every batch size.
    runs = {k: v for k, v in _argonne().items() if k[:3] == (gpu, model, tp) and k[3] in (128, 1024)}
    assert len(runs) >= 5
    fleet = argonne_fleet(gpu, model, tp, "roofline")
    errors = np.array([m / replay_static_batch(fleet, k[3], k[4]) - 1 for k, m in runs.items()])
    assert np.median(np.abs(errors)) <= median_bound, errors
    assert np.abs(errors).max() <= max_bound, errors


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("Nvidia H100 GPU,1,vLLM,meta-llama/Llama-2-7b-hf,128", "Batch Size is not a number"),
        ("Nvidia H100 GPU,1,vLLM,meta-llama/Llama-2-7b-hf,128,1,inf,1", "finite latency"),
        ("Nvidia H100 GPU,3,vLLM,meta-llama/Llama-2-7b-hf,128,1,1.0,1", "Num of Hardware 3"),
    ],
)
def test_argonne_reader_refuses_bad_rows_naming_the_line(tmp_path: Path, row: str, fragment: str) -> None:
    path = tmp_path / "All_results.csv"
    path.write_text(
        "Hardware,Num of Hardware,Framework,Model,Input Output Length,Batch Size,Latency,Throughput\n" + row + "\n"
    )
    from pipeline.common.errors import RooftraceError

    with pytest.raises(RooftraceError, match=f"{path}:2: .*{fragment}"):
        read_argonne_table(path)
