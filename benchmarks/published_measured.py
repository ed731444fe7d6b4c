"""The published serving benchmarks replayed with the measured tier (checks; nothing fitted).

The benchmark fleets in fleets/ model TensorRT-LLM stacks and pin ``cost_model = "roofline"``;
this script replays the same workloads with each fleet's GPU profile instead (``cost_model =
"auto"``, no ``[calibration]``) and prints the error against every published figure, as
docs/replay_validation.md reports them. Needs the public measurements ($ROOFTRACE_MEASUREMENTS).

    python benchmarks/published_measured.py
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MEAS = Path(os.environ.get("ROOFTRACE_MEASUREMENTS", "measurements"))
sys.path.insert(0, str(ROOT / "tests"))  # the published tables are test data (tests/published.py)

from published import (  # noqa: E402
    MLPERF_SYSTEMS,
    TRTLLM_FLEETS,
    makespan_output_tokens_per_s,
    no_evict_fleet,
    read_mlperf_summary,
    read_nim_table,
    read_trtllm_table,
    replay_closed_loop,
    replay_mlperf_offline,
    replay_offline_fixed,
)

from pipeline.replay.fleet import ResolvedFleet, load_fleet, resolve  # noqa: E402


def measured_fleet(name: str) -> ResolvedFleet:
    cfg = load_fleet(ROOT / "fleets" / f"{name}.toml")
    return resolve(dataclasses.replace(cfg, cost_model="auto", calibration=None))


def main() -> None:
    if not MEAS.is_dir():
        sys.exit(f"{MEAS}: the shared measurements are not laid out beside the project")
    for system, folder in MLPERF_SYSTEMS.items():
        path = MEAS / "mlperf-inference-v4.1" / "closed" / "NVIDIA" / "results" / folder
        summary = read_mlperf_summary(path / "Offline" / "performance" / "run_1" / "mlperf_log_summary.txt")
        c = replay_mlperf_offline(measured_fleet(f"mlperf-llama2-70b-{system}"), summary)
        print(
            f"MLPerf Offline {system}: measured {c.measured:,.0f} tokens/s, replayed {c.replayed:,.0f} ({c.error:+.1%})"
        )
    pub = MEAS / "published-benchmarks"
    fleet = measured_fleet("nim-llama33-70b-h100-tp2")
    for p in read_nim_table(pub / "nim_llama33_70b_h100x2_fp8_tp2_isl5000_osl500.csv"):
        res = replay_closed_loop(fleet, p.isl, p.osl, p.concurrency, rounds=6).result
        ttft = (res.first_token_s - res.arrival_s)[p.concurrency :].mean()
        itl = ((res.finish_s - res.first_token_s) / (p.osl - 1))[p.concurrency :].mean()
        print(f"NIM concurrency {p.concurrency:3d}: TTFT {ttft / p.ttft_s - 1:+.1%}, ITL {itl / p.itl_s - 1:+.1%}")
    errors = []
    for p in read_trtllm_table(pub / "tensorrt_llm_perf_overview_h100_h200.csv"):
        f = no_evict_fleet(measured_fleet(TRTLLM_FLEETS[(p.model, p.gpu)]), p.isl, p.osl)
        rate = makespan_output_tokens_per_s(replay_offline_fixed(f, p.isl, p.osl, waves=3))
        errors.append(rate / p.output_tokens_per_s - 1)
    e = np.abs(np.array(errors))
    print(
        f"TensorRT-LLM table, {e.size} rows: median |e| {np.median(e):.1%}, p90 {np.quantile(e, 0.9):.1%}, "
        f"max {e.max():.1%}, rows below the measurement {(np.array(errors) < 0).sum()}"
    )


if __name__ == "__main__":
    main()
