"""Benchmark runs with a known truth: a synthetic workload replayed by the project's own replay
as a closed-loop client would drive it, written as ``vllm bench serve --save-result
--save-detailed`` writes its file (vllm/benchmarks/serve.py: per-request ``input_lens``,
``output_lens``, ``ttfts``, ``itls``, ``latencies``, ``start_times``, ``errors``, and the run's
``max_concurrency``, ``request_rate``, ``burstiness``, ``model_id``, ``duration``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.replay.fleet import ResolvedFleet
from pipeline.replay.run import ReplayOptions, run_replay


def workload(n: int, seed: int = 7) -> pl.DataFrame:
    """``n`` requests of a random-dataset benchmark: prompts of 200 to 1,200 tokens, outputs of
    20 to 200 (ignore_eos), canonical columns, one second apart (a closed loop keeps only the order)."""
    rng = np.random.default_rng(seed)
    return pl.DataFrame(
        {
            "request_id": [f"{i:08d}" for i in range(n)],
            "arrival": pl.Series(np.arange(n, dtype=np.int64) * 1_000_000).cast(pl.Datetime("us", "UTC")),
            "recorded_input_tokens": rng.integers(200, 1200, n),
            "output_tokens": rng.integers(20, 200, n),
        }
    )


def token_gaps(log: dict[str, npt.NDArray[Any]], replica: int, first: float, finish: float) -> list[float]:
    """The gaps between a request's tokens: the duration of every step of its replica that ends
    after its first token and by its last (each such step sampled one token of it; no preemption)."""
    on = log["replica"] == replica
    start, end, steps = log["start_s"][on], log["end_s"][on], log["steps"][on].astype(np.int64)
    gaps: list[float] = []
    eps = 1e-9
    for s, e, k in zip(start, end, steps, strict=True):
        if e <= first + eps or s >= finish - eps:
            continue
        d = (e - s) / k
        lo = max(1, math.floor((first - s) / d + eps) + 1)
        hi = min(int(k), math.floor((finish - s) / d + eps))
        gaps += [float(d)] * max(0, hi - lo + 1)
    return gaps


def closed_loop_result(requests: pl.DataFrame, fleet: ResolvedFleet, concurrency: int, model: str) -> dict[str, Any]:
    """The vLLM bench serve result of ``requests`` sent by ``concurrency`` clients (request rate
    inf, max_concurrency C), as the replay on ``fleet`` serves them."""
    run = run_replay(requests, fleet, ReplayOptions(concurrency=concurrency, isolation=()))
    res, log = run.result, run.log.columns()
    n = requests.height
    assert bool((res.reject_reason == 0).all()) and int(res.preemptions.sum()) == 0
    itls = [token_gaps(log, int(res.replica[i]), float(res.first_token_s[i]), float(res.finish_s[i])) for i in range(n)]
    start0 = 5000.0  # vLLM's start_times are time.perf_counter() readings: any origin
    return {
        "date": "20250101-000000", "endpoint_type": "openai", "backend": "openai", "label": None,
        "model_id": model, "tokenizer_id": model, "num_prompts": n,
        "request_rate": "inf", "burstiness": 1.0, "max_concurrency": concurrency,
        "duration": float(np.max(res.finish_s)), "completed": n, "failed": 0,
        "input_lens": requests.get_column("recorded_input_tokens").to_list(),
        "output_lens": requests.get_column("output_tokens").to_list(),
        "ttfts": (res.first_token_s - res.arrival_s).tolist(),
        "itls": itls,
        "latencies": (res.finish_s - res.arrival_s).tolist(),
        "start_times": (res.arrival_s + start0).tolist(),
        "errors": [""] * n,
    }  # fmt: skip


def write_sweep(
    folder: Path, requests: pl.DataFrame, fleet: ResolvedFleet, concurrencies: list[int], model: str
) -> list[Path]:
    """One vLLM result file per concurrency, as a sweep script leaves them."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for c in concurrencies:
        p = folder / f"openai-infqps-concurrency{c}-{model.split('/')[-1]}.json"
        p.write_text(json.dumps(closed_loop_result(requests, fleet, c, model)))
        out.append(p)
    return out
