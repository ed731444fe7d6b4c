"""Published serving benchmarks as data, and the workloads and metrics to replay them.

Used by ``tests/test_published_benchmarks.py`` and ``docs/replay_validation.md`` so the tests and
the doc read the same parsed numbers. Sources (public; read from a measurements folder given on the command line):

- MLPerf Inference v4.1, closed, NVIDIA, Llama-2-70B: LoadGen ``mlperf_log_summary.txt`` files
  ("key : value" lines; latencies in ns).
- NVIDIA NIM 1.8.0, Llama-3.3-70B-Instruct FP8 on 2x H100 (TP2), 5000 in / 500 out, fixed
  concurrency: TTFT, inter-token latency and throughput per concurrency.
- TensorRT-LLM ``perf-overview.md`` (v1.0 era): offline max-throughput output tokens/s per
  (model, GPU, TP, ISL, OSL), FP8 checkpoints.

The replay side: synthetic request frames shaped like each benchmark (fixed lengths, or the
MLPerf OpenOrca length distribution below) and the throughput a benchmark reports, computed from
a :class:`pipeline.replay.run.ReplayRun`.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.common.errors import RooftraceError
from pipeline.replay.fleet import ResolvedFleet, load_fleet, parse_fleet, resolve
from pipeline.replay.run import ReplayOptions, ReplayRun, run_replay

#: The benchmark fleets (one TOML per published setup) and where each published table lies
#: under the shared measurements folder ($ROOFTRACE_MEASUREMENTS, or ../shared/measurements).
FLEETS = Path(__file__).resolve().parents[1] / "fleets"
MLPERF_RESULTS: tuple[str, ...] = ("mlperf-inference-v4.1", "closed", "NVIDIA", "results")
PUBLISHED: tuple[str, ...] = ("published-benchmarks",)
NIM_CSV = "nim_llama33_70b_h100x2_fp8_tp2_isl5000_osl500.csv"
TRTLLM_CSV = "tensorrt_llm_perf_overview_h100_h200.csv"
ARGONNE_CSV: tuple[str, ...] = ("argonne-llm-inference-bench", "Plots", "All_results.csv")

#: MLPerf v4.1 NVIDIA result folders (closed/NVIDIA/results/<system>/<benchmark>) per GPU.
MLPERF_SYSTEMS: dict[str, str] = {
    "h100": "DGX-H100_H100-SXM-80GBx8_TRT/llama2-70b-99.9",
    "h200": "H200-SXM-141GBx8_TRT/llama2-70b-99",
}
#: The fleets in fleets/ that replay each (model, GPU) block of the TensorRT-LLM table.
TRTLLM_FLEETS: dict[tuple[str, str], str] = {
    ("Llama-3.1-8B", "H100 SXM 80GB"): "trtllm-llama31-8b-h100",
    ("Llama-3.1-8B", "H200 SXM 141GB"): "trtllm-llama31-8b-h200",
    ("Llama-3.3-70B", "H100 SXM 80GB"): "trtllm-llama33-70b-h100-tp2",
    ("Llama-3.3-70B", "H200 SXM 141GB"): "trtllm-llama33-70b-h200",
    ("Llama-3.1-405B", "H100 SXM 80GB"): "trtllm-llama31-405b-h100-tp8",
    ("Llama-3.1-405B", "H200 SXM 141GB"): "trtllm-llama31-405b-h200-tp8",
}

NS = 1e-9


def mlperf_summary_parts(system: str, scenario: str = "Offline") -> tuple[str, ...]:
    """The LoadGen summary of ``system`` (a key of MLPERF_SYSTEMS), relative to the measurements."""
    return (*MLPERF_RESULTS, *MLPERF_SYSTEMS[system].split("/"), scenario, "performance", "run_1",
            "mlperf_log_summary.txt")  # fmt: skip


def benchmark_fleet(name: str, measured: bool = False, calibrated: bool = True) -> ResolvedFleet:
    """A fleet of fleets/ as shipped (the roofline tier these TensorRT-LLM fleets pin, with their
    ``[calibration]`` unless ``calibrated`` is false), or with ``measured``: the GPU's measured
    profile instead (``cost_model = "auto"``, no calibration; nothing fitted on the benchmark)."""
    cfg = load_fleet(FLEETS / f"{name}.toml")
    if measured:
        cfg = replace(cfg, cost_model="auto", calibration=None)
    elif not calibrated:
        cfg = replace(cfg, calibration=None)
    return resolve(cfg)


# -- MLPerf LoadGen summaries ------------------------------------------------------------------


@dataclass(frozen=True)
class MLPerfSummary:
    """One ``mlperf_log_summary.txt``: throughput and (Server only) latency statistics in s."""

    path: str
    scenario: str
    result_valid: bool
    samples_per_s: float
    tokens_per_s: float
    target_qps: float
    ttft_mean_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_mean_s: float | None = None
    tpot_p99_s: float | None = None

    @property
    def output_tokens_per_sample(self) -> float:
        """Mean generated tokens per sample: LoadGen counts the tokens the SUT returned."""
        return self.tokens_per_s / self.samples_per_s


def _kv_lines(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and value.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def read_mlperf_summary(path: Path | str) -> MLPerfSummary:
    """Parse a LoadGen summary; a missing or non-numeric key is an error naming the file."""
    path = Path(path)
    try:
        kv = _kv_lines(path.read_text())
    except OSError as exc:
        raise RooftraceError(f"{path}: cannot read MLPerf summary ({exc.strerror})") from None

    def num(*keys: str) -> float:
        for key in keys:
            if key in kv:
                try:
                    return float(kv[key])
                except ValueError:
                    raise RooftraceError(f"{path}: {key!r} is not a number: {kv[key]!r}") from None
        raise RooftraceError(f"{path}: missing {keys[0]!r}")

    def opt_ns(key: str) -> float | None:
        return num(key) * NS if key in kv else None

    scenario = kv.get("Scenario")
    if scenario is None:
        raise RooftraceError(f"{path}: missing 'Scenario'")
    # Offline reports "Samples per second" / "Tokens per second"; Server the "Completed" ones.
    return MLPerfSummary(
        path=str(path),
        scenario=scenario,
        result_valid=kv.get("Result is") == "VALID",
        samples_per_s=num("Samples per second", "Completed samples per second"),
        tokens_per_s=num("Tokens per second", "Completed tokens per second"),
        target_qps=num("target_qps"),
        ttft_mean_s=opt_ns("Mean First Token latency (ns)"),
        ttft_p99_s=opt_ns("99.00 percentile first token latency (ns)"),
        tpot_mean_s=opt_ns("Mean Time to Output Token (ns)"),
        tpot_p99_s=opt_ns("99.00 percentile time to output token (ns)"),
    )


# -- CSV transcriptions ------------------------------------------------------------------------


@dataclass(frozen=True)
class NimPoint:
    """One row of the NIM fixed-concurrency table (times in s, throughput in output tokens/s)."""

    model: str
    gpu: str
    num_gpus: int
    precision: str
    tp: int
    isl: int
    osl: int
    concurrency: int
    ttft_s: float
    itl_s: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class TrtllmPoint:
    """One row of the TensorRT-LLM offline throughput table (whole TP group)."""

    model: str
    checkpoint: str
    gpu: str
    tp: int
    precision: str
    isl: int
    osl: int
    output_tokens_per_s: float


def _rows(path: Path, required: set[str]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = sorted(required - set(reader.fieldnames or ()))
            if missing:
                raise RooftraceError(f"{path}: missing column(s) {missing}")
            return list(reader)
    except OSError as exc:
        raise RooftraceError(f"{path}: cannot read ({exc.strerror})") from None


def _field(path: Path, line: int, row: dict[str, str], key: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(row[key])
    except (ValueError, TypeError):  # TypeError: a short row (the field is None)
        raise RooftraceError(f"{path}:{line}: {key} is not a number: {row[key]!r}") from None


def read_nim_table(path: Path | str) -> list[NimPoint]:
    path = Path(path)
    keys = {"model", "gpu", "num_gpus", "precision", "tp", "isl", "osl", "concurrency", "ttft_ms", "itl_ms"}
    keys |= {"throughput_tokens_per_s"}
    out = []
    for i, r in enumerate(_rows(path, keys), start=2):
        out.append(
            NimPoint(
                model=r["model"],
                gpu=r["gpu"],
                num_gpus=int(_field(path, i, r, "num_gpus", int)),
                precision=r["precision"],
                tp=int(_field(path, i, r, "tp", int)),
                isl=int(_field(path, i, r, "isl", int)),
                osl=int(_field(path, i, r, "osl", int)),
                concurrency=int(_field(path, i, r, "concurrency", int)),
                ttft_s=_field(path, i, r, "ttft_ms", float) / 1e3,
                itl_s=_field(path, i, r, "itl_ms", float) / 1e3,
                output_tokens_per_s=_field(path, i, r, "throughput_tokens_per_s", float),
            )
        )
    return out


def read_trtllm_table(path: Path | str) -> list[TrtllmPoint]:
    path = Path(path)
    keys = {"model", "quantized_checkpoint", "gpu", "num_gpus_tp", "precision", "isl", "osl"}
    keys |= {"total_output_tokens_per_s"}
    out = []
    for i, r in enumerate(_rows(path, keys), start=2):
        out.append(
            TrtllmPoint(
                model=r["model"],
                checkpoint=r["quantized_checkpoint"],
                gpu=r["gpu"],
                tp=int(_field(path, i, r, "num_gpus_tp", int)),
                precision=r["precision"],
                isl=int(_field(path, i, r, "isl", int)),
                osl=int(_field(path, i, r, "osl", int)),
                output_tokens_per_s=_field(path, i, r, "total_output_tokens_per_s", float),
            )
        )
    return out


# -- MLPerf Llama-2-70B request lengths --------------------------------------------------------

#: Percentiles (%) of the tables below.
OPENORCA_PERCENTILES: tuple[float, ...] = (0, 1, 2.5, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85)
OPENORCA_PERCENTILES += (90, 95, 97.5, 99, 100)
#: Llama-2 tokens per prompt (``tok_input_length``, chat template and system prompt included) of
#: the MLPerf llama2-70b dataset (``open_orca_gpt4_tokenized_llama.sampled_24576.pkl``), at
#: OPENORCA_PERCENTILES. Computed from the first 2,162 rows of the per-sample length table
#: ``mlperf-data/summaries/llama2-70b-99.csv`` of the openshift-psap/performance-dashboard
#: repository (lengths extracted from that official pickle). Mean 119.1, median 115.
OPENORCA_INPUT_TOKENS: tuple[int, ...] = (48, 54, 62, 72, 80, 87, 92, 96, 101, 105, 108, 112, 115, 118, 122, 125, 129)
OPENORCA_INPUT_TOKENS += (133, 138, 143, 153, 174, 220, 275, 953)
#: The same rows' reference (GPT-4) response lengths in Llama-2 tokens (mean 184.5). Only the
#: *shape* is used: Llama-2-70B-chat writes longer answers, and the mean generated length is taken
#: from each MLPerf summary (tokens/s ÷ samples/s ≈ 290), the quantity the benchmark counts.
OPENORCA_REFERENCE_OUTPUT_TOKENS: tuple[int, ...] = (3, 7, 8, 23, 49, 65, 77, 88, 99, 113, 129, 146, 164, 183, 202)
OPENORCA_REFERENCE_OUTPUT_TOKENS += (218, 237, 259, 284, 313, 351, 403, 466, 544, 707)
#: MLPerf llama2-70b caps generation at 1,024 new tokens (max_new_tokens of the reference SUT).
MLPERF_MAX_OUTPUT_TOKENS = 1024

IntArray = npt.NDArray[np.int64]


def _from_quantiles(u: npt.NDArray[np.float64], table: tuple[int, ...]) -> npt.NDArray[np.float64]:
    return np.interp(u * 100.0, np.asarray(OPENORCA_PERCENTILES), np.asarray(table, dtype=np.float64))


def openorca_lengths(n: int, output_mean: float, seed: int = 0) -> tuple[IntArray, IntArray]:
    """``n`` (input, output) token counts shaped like the MLPerf llama2-70b dataset.

    Inputs follow OPENORCA_INPUT_TOKENS; outputs follow the reference response shape rescaled so
    their mean is ``output_mean`` (clipped to [1, 1024]). Inverse-CDF sampling, piecewise linear
    between the tabulated percentiles, seeded: the same call returns the same lengths."""
    if n < 1 or not output_mean > 0:
        raise RooftraceError(f"openorca_lengths: need n >= 1 and output_mean > 0, got {n}, {output_mean}")
    rng = np.random.default_rng(seed)
    inp = np.rint(_from_quantiles(rng.random(n), OPENORCA_INPUT_TOKENS)).astype(np.int64)
    shape = _from_quantiles(rng.random(n), OPENORCA_REFERENCE_OUTPUT_TOKENS)
    out = np.clip(np.rint(shape * (output_mean / shape.mean())), 1, MLPERF_MAX_OUTPUT_TOKENS).astype(np.int64)
    return inp, out


def benchmark_requests(input_tokens: IntArray, output_tokens: IntArray) -> pl.DataFrame:
    """A canonical-requests frame for replay: the columns ``run_replay`` reads, one arrival time
    (closed-loop and offline replays ignore arrival times)."""
    n = int(input_tokens.shape[0])
    if output_tokens.shape[0] != n:
        raise RooftraceError("benchmark_requests: input and output lengths differ in count")
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    return pl.DataFrame(
        {
            "request_id": [f"bench-{i}" for i in range(n)],
            "arrival": pl.Series([t0] * n, dtype=pl.Datetime("us", "UTC")),
            "recorded_input_tokens": input_tokens.astype(np.int64),
            "output_tokens": output_tokens.astype(np.int64),
        }
    )


# -- metrics -----------------------------------------------------------------------------------


def makespan_output_tokens_per_s(run: ReplayRun) -> float:
    """Output tokens of finished requests ÷ (last finish − first arrival): what trtllm-bench and
    GenAI-Perf report as output throughput for a whole run."""
    res = run.result
    ok = res.reject_reason == 0
    if not ok.any():
        raise RooftraceError("no request finished")
    span = float(np.max(res.finish_s[ok]) - np.min(res.arrival_s))
    return float(run.work.output_tokens[ok].sum()) / span


def saturated_output_tokens_per_s(run: ReplayRun) -> float:
    """Tokens sampled per second while every replica still has requests waiting.

    MLPerf Offline runs ~200,000 samples, so its reported rate is the saturated rate (the drain
    at the end is ~1 % of the run). A replay of a few thousand requests has a long drain, so this
    measures the same thing on the saturated window only: from the time the fleet has finished
    as many requests as it runs at once (the first batch has turned over: the mix of ages is
    settled) to the first time any replica's waiting queue empties. Tokens sampled = decode
    tokens of the step spans in the window (spans cut at the edges in proportion to their time)
    plus the first tokens sampled in it. Raises when the workload is too small to saturate."""
    res, cols = run.result, run.log.columns()
    ok = res.reject_reason == 0
    start = np.asarray(cols["start_s"], dtype=np.float64)
    end = np.asarray(cols["end_s"], dtype=np.float64)
    replica = np.asarray(cols["replica"], dtype=np.int64)
    decode_tokens = np.asarray(cols["decode_tokens"], dtype=np.float64)
    waiting = np.asarray(cols["waiting"], dtype=np.int64) > 0
    if not waiting.any():
        raise RooftraceError("the replay never queued a request: the fleet was not saturated")
    ends = [float(end[(replica == r) & waiting].max(initial=0.0)) for r in np.unique(replica)]
    t_hi = min(ends)
    turnover = run.spec.scheduler.max_num_seqs * run.spec.replicas
    finish = np.sort(res.finish_s[ok])
    if finish.shape[0] <= turnover:
        raise RooftraceError(f"only {finish.shape[0]} requests finished; need more than {turnover}")
    t_lo = float(finish[turnover - 1])
    if not t_hi > t_lo:
        raise RooftraceError(
            f"no saturated window: the queue empties at {t_hi:.1f} s, before the first batch turned "
            f"over at {t_lo:.1f} s; replay more requests"
        )
    dur = np.maximum(end - start, 1e-300)
    share = np.clip((np.minimum(end, t_hi) - np.maximum(start, t_lo)) / dur, 0.0, 1.0)
    decode = float((decode_tokens * share).sum())
    first = res.first_token_s[ok]
    firsts = float(((first >= t_lo) & (first < t_hi)).sum())
    return (decode + firsts) / (t_hi - t_lo)


# -- replaying a benchmark -----------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """A replayed figure against the published one: error = replayed / measured − 1."""

    name: str
    measured: float
    replayed: float
    requests: int
    wall_s: float

    @property
    def error(self) -> float:
        return self.replayed / self.measured - 1.0


def replay_mlperf_offline(fleet: ResolvedFleet, summary: MLPerfSummary, waves: int = 4, seed: int = 0) -> Comparison:
    """Replay MLPerf Offline on ONE replica of ``fleet`` and scale by its replica count.

    Offline sends every sample at t = 0 and the round-robin router deals them evenly to
    identical, independent replicas, so the fleet's saturated rate is replicas × one replica's.
    ``waves`` × max_num_seqs requests (OpenOrca-shaped, mean output from the summary) keep the
    replica saturated long enough to measure (saturated_output_tokens_per_s)."""
    # The resolved deployment, memory plan and scheduler are per replica: only the count changes.
    one = replace(fleet, config=fleet.config.with_replicas(1))
    n = waves * one.scheduler.max_num_seqs
    inp, out = openorca_lengths(n, summary.output_tokens_per_sample, seed)
    run = run_replay(benchmark_requests(inp, out), one, ReplayOptions(offline=True))
    rate = saturated_output_tokens_per_s(run) * fleet.config.replicas
    return Comparison(f"{fleet.config.name} offline", summary.tokens_per_s, rate, n, run.wall_s)


def replay_closed_loop(fleet: ResolvedFleet, isl: int, osl: int, concurrency: int, rounds: int = 4) -> ReplayRun:
    """``rounds`` × ``concurrency`` fixed-length requests from ``concurrency`` closed-loop clients
    (GenAI-Perf / AIPerf at fixed concurrency)."""
    n = max(rounds * concurrency, 8)
    frame = benchmark_requests(np.full(n, isl, np.int64), np.full(n, osl, np.int64))
    return run_replay(frame, fleet, ReplayOptions(concurrency=concurrency))


def replay_nim_point(fleet: ResolvedFleet, point: NimPoint, rounds: int = 6) -> tuple[float, float]:
    """Mean TTFT and inter-token latency (s) of one NIM concurrency, replayed closed-loop with
    ``rounds`` x C requests. GenAI-Perf sends warm-up requests first: the first round is dropped
    (all C clients start at t = 0 together, a burst the steady closed loop never sees again). ITL
    is GenAI-Perf's (e2e - TTFT) / (output tokens - 1)."""
    res = replay_closed_loop(fleet, point.isl, point.osl, point.concurrency, rounds=rounds).result
    if (res.reject_reason != 0).any():
        raise RooftraceError(f"{fleet.config.name}: the replay rejected requests at concurrency {point.concurrency}")
    ttft = (res.first_token_s - res.arrival_s)[point.concurrency :]
    itl = ((res.finish_s - res.first_token_s) / (point.osl - 1))[point.concurrency :]
    return float(ttft.mean()), float(itl.mean())


def replay_trtllm_point(fleet: ResolvedFleet, point: TrtllmPoint) -> tuple[float, int]:
    """Output tokens/s of one TensorRT-LLM table row (3 waves, TensorRT-LLM's no-evict admission:
    :func:`no_evict_fleet`) and the preemptions the replay made (0 when the cap holds)."""
    run = replay_offline_fixed(no_evict_fleet(fleet, point.isl, point.osl), point.isl, point.osl, waves=3)
    return makespan_output_tokens_per_s(run), int(run.result.preemptions.sum())


def replay_offline_fixed(fleet: ResolvedFleet, isl: int, osl: int, waves: int = 4) -> ReplayRun:
    """trtllm-bench throughput: fixed ISL/OSL, all requests at t = 0. ``waves`` × the number of
    sequences a replica can run at once (max_num_seqs, or fewer when the KV cache binds)."""
    per_seq_blocks = -(-(isl + osl) // fleet.scheduler.block_size)
    fits = max(1, fleet.scheduler.num_gpu_blocks // per_seq_blocks)
    n = waves * fleet.config.replicas * min(fleet.scheduler.max_num_seqs, fits)
    frame = benchmark_requests(np.full(n, isl, np.int64), np.full(n, osl, np.int64))
    return run_replay(frame, fleet, ReplayOptions(offline=True))


def no_evict_fleet(fleet: ResolvedFleet, isl: int, osl: int) -> ResolvedFleet:
    """``fleet`` with max_num_seqs capped at the sequences whose *whole* KV (isl + osl tokens)
    fits the cache at once: TensorRT-LLM's default capacity scheduler (GUARANTEED_NO_EVICT)
    admits a request only when its blocks up to max_tokens are reserved, so it never preempts;
    for fixed-length benchmarks this cap is the same admission rule. vLLM admits optimistically
    and preempts by recomputation, which on long outputs replays as thrashing."""
    sched = fleet.scheduler
    per_seq_blocks = -(-(isl + osl) // sched.block_size)
    fits = max(1, sched.num_gpu_blocks // per_seq_blocks)
    if fits >= sched.max_num_seqs:
        return fleet
    cfg = fleet.config
    capped = replace(cfg, engine=replace(cfg.engine, max_num_seqs=fits))
    return resolve(capped, cfg.name)


# -- Argonne LLM-Inference-Bench: vLLM static batches on A100 / H100 ------------------------------

#: The HF models of the Argonne table that the catalog describes: (catalog model, the
#: max_model_len vLLM derives from the model's config.json when the catalog entry's differs).
#: Meta-Llama-3-8B / -70B have Llama-3.1's shapes with an 8,192-token context; Qwen2-7B has
#: Qwen2.5-7B's shapes. Not replayed: Qwen2-72B, DeciLM-7B and the GH200-only models (no entry).
ARGONNE_MODELS: dict[str, tuple[str, int | None]] = {
    "meta-llama/Llama-2-7b-hf": ("llama-2-7b", None),
    "meta-llama/Llama-2-70b-hf": ("llama-2-70b", None),
    "meta-llama/Meta-Llama-3-8B": ("llama-3.1-8b", 8192),
    "meta-llama/Meta-Llama-3-70B": ("llama-3.1-70b", 8192),
    "mistralai/Mistral-7B-v0.1": ("mistral-7b", None),
    "mistralai/Mixtral-8x7B-v0.1": ("mixtral-8x7b", None),
    "Qwen/Qwen2-7B": ("qwen2.5-7b", None),
}
#: The table's hardware names -> catalog GPUs. A100: the ALCF Polaris nodes the A100 job scripts
#: ran on (4x A100 SXM4 40 GB per node, NVLink between every pair). H100: the ALCF JLSE testbed;
#: the variant is not stated, the 80 GB SXM5 is assumed (its measured ~595 W at batch 64 is above
#: the PCIe and NVL cards' power limits).
ARGONNE_GPUS: dict[str, str] = {"Nvidia A100 GPU": "a100-40gb-sxm", "Nvidia H100 GPU": "h100-sxm"}


@dataclass(frozen=True)
class ArgonnePoint:
    """One vLLM static-batch run: ``batch`` prompts of ``length`` tokens, each generating
    ``length`` tokens (ignore_eos), timed from the batch's submission to its last token."""

    gpu: str  # catalog name
    tp: int
    model: str  # HF id as in the table
    length: int
    batch: int
    latency_s: float
    line: int


def read_argonne_table(path: Path | str) -> tuple[list[ArgonnePoint], int]:
    """The vLLM rows on NVIDIA A100 / H100 of ``Plots/All_results.csv`` whose model the catalog
    describes, and how many other vLLM A100 / H100 rows were left out (models without an entry)."""
    path = Path(path)
    keys = {"Hardware", "Num of Hardware", "Framework", "Model", "Input Output Length", "Batch Size", "Latency"}
    out, skipped = [], 0
    for i, r in enumerate(_rows(path, keys), start=2):
        if r["Framework"] != "vLLM" or r["Hardware"] not in ARGONNE_GPUS:
            continue
        if r["Model"] not in ARGONNE_MODELS:
            skipped += 1
            continue
        point = ArgonnePoint(
            gpu=ARGONNE_GPUS[r["Hardware"]],
            tp=int(_field(path, i, r, "Num of Hardware", int)),
            model=r["Model"],
            length=int(_field(path, i, r, "Input Output Length", int)),
            batch=int(_field(path, i, r, "Batch Size", int)),
            latency_s=_field(path, i, r, "Latency", float),
            line=i,
        )
        if min(point.tp, point.length, point.batch) < 1 or not 0 < point.latency_s < 1e6:
            raise RooftraceError(f"{path}:{i}: a run needs GPUs, length and batch >= 1 and a finite latency > 0")
        if point.tp not in (1, 2, 4, 8):
            raise RooftraceError(f"{path}:{i}: Num of Hardware {point.tp}: the runs used TP 1, 2, 4 or 8")
        out.append(point)
    return out, skipped


ArgonneConfig = tuple[str, str, int, int, int]  # (gpu, model, tp, length, batch)


def argonne_configs(points: list[ArgonnePoint]) -> dict[ArgonneConfig, float]:
    """Each configuration's measured latency (s): the median of its rows (22 rows repeat one)."""
    by: dict[ArgonneConfig, list[float]] = {}
    for p in points:
        by.setdefault((p.gpu, p.model, p.tp, p.length, p.batch), []).append(p.latency_s)
    return {k: float(np.median(v)) for k, v in by.items()}


def argonne_fleet(gpu: str, model: str, tp: int, cost_model: str = "auto") -> ResolvedFleet:
    """One replica as the benchmark's ``vllm.LLM`` ran it: FP16 (``--dtype float16``), vLLM
    0.5 / 0.6 defaults — chunked prefill and prefix caching off (so the step budget is
    max_model_len), 256 sequences at most, 90 % of GPU memory, 16-token blocks, CUDA graphs."""
    name, max_model_len = ARGONNE_MODELS[model]
    engine: dict[str, object] = {
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "max_num_seqs": 256,
        "gpu_memory_utilization": 0.9,
        "block_size": 16,
    }
    if max_model_len is not None:
        engine["max_model_len"] = max_model_len
    spec = {
        "name": f"argonne-{name}-{gpu}-tp{tp}",
        "model": name,
        "hardware": gpu,
        "weight_dtype": "fp16",
        "kv_dtype": "fp16",
        "tp": tp,
        "replicas": 1,
        "router": "round_robin",
        "cost_model": cost_model,
        "engine": engine,
    }
    return resolve(parse_fleet(spec, spec["name"]), spec["name"])  # type: ignore[arg-type]


def replay_argonne(
    configs: Iterable[ArgonneConfig], cost_model: str, progress: Callable[[int], None] | None = None
) -> dict[ArgonneConfig, float]:
    """Every configuration replayed with ``cost_model`` (:func:`argonne_fleet`, one fleet per GPU,
    model and TP): its replayed latency in s, in sorted order. ``progress`` gets the count done."""
    fleets: dict[tuple[str, str, int], ResolvedFleet] = {}
    out: dict[ArgonneConfig, float] = {}
    for i, (gpu, model, tp, length, batch) in enumerate(sorted(configs)):
        if progress is not None:
            progress(i)
        fleet = fleets.get((gpu, model, tp))
        if fleet is None:
            fleet = fleets[(gpu, model, tp)] = argonne_fleet(gpu, model, tp, cost_model)
        out[(gpu, model, tp, length, batch)] = replay_static_batch(fleet, length, batch)
    return out


def replay_static_batch(fleet: ResolvedFleet, length: int, batch: int) -> float:
    """Seconds from submitting ``batch`` prompts of ``length`` tokens at once (each generating
    ``length`` tokens) to the last token: what vLLM's benchmark_latency.py times."""
    frame = benchmark_requests(np.full(batch, length, np.int64), np.full(batch, length, np.int64))
    res = run_replay(frame, fleet, ReplayOptions(offline=True)).result
    if (res.reject_reason != 0).any():
        raise RooftraceError(f"{fleet.config.name}: the replay rejected requests of a {batch} x {length} batch")
    return float(res.finish_s.max() - res.arrival_s.min())
