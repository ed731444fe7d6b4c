"""The published serving benchmarks replayed with the measured tier (checks; nothing fitted).

The benchmark fleets in fleets/ model TensorRT-LLM stacks and pin ``cost_model = "roofline"``;
this script replays the same workloads with each fleet's GPU profile instead (``cost_model =
"auto"``, no ``[calibration]``) and prints the error against every published figure, as
docs/replay_validation.md reports them. Needs the public measurements ($ROOFTRACE_MEASUREMENTS).

    python benchmarks/published_measured.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MEAS = Path(os.environ.get("ROOFTRACE_MEASUREMENTS", "measurements"))
sys.path.insert(0, str(ROOT / "tests"))  # the published tables are test data (tests/published.py)

from published import (  # noqa: E402
    MLPERF_SYSTEMS,
    NIM_CSV,
    PUBLISHED,
    TRTLLM_CSV,
    TRTLLM_FLEETS,
    benchmark_fleet,
    mlperf_summary_parts,
    read_mlperf_summary,
    read_nim_table,
    read_trtllm_table,
    replay_mlperf_offline,
    replay_nim_point,
    replay_trtllm_point,
)


def main() -> None:
    if not MEAS.is_dir():
        sys.exit(f"{MEAS}: the shared measurements are not laid out beside the project")
    for system in MLPERF_SYSTEMS:
        summary = read_mlperf_summary(MEAS.joinpath(*mlperf_summary_parts(system)))
        c = replay_mlperf_offline(benchmark_fleet(f"mlperf-llama2-70b-{system}", measured=True), summary)
        print(
            f"MLPerf Offline {system}: measured {c.measured:,.0f} tokens/s, replayed {c.replayed:,.0f} ({c.error:+.1%})"
        )
    pub = MEAS.joinpath(*PUBLISHED)
    fleet = benchmark_fleet("nim-llama33-70b-h100-tp2", measured=True)
    for p in read_nim_table(pub / NIM_CSV):
        ttft, itl = replay_nim_point(fleet, p)
        print(f"NIM concurrency {p.concurrency:3d}: TTFT {ttft / p.ttft_s - 1:+.1%}, ITL {itl / p.itl_s - 1:+.1%}")
    errors = []
    for p in read_trtllm_table(pub / TRTLLM_CSV):
        rate, _ = replay_trtllm_point(benchmark_fleet(TRTLLM_FLEETS[(p.model, p.gpu)], measured=True), p)
        errors.append(rate / p.output_tokens_per_s - 1)
    e = np.abs(np.array(errors))
    print(
        f"TensorRT-LLM table, {e.size} rows: median |e| {np.median(e):.1%}, p90 {np.quantile(e, 0.9):.1%}, "
        f"max {e.max():.1%}, rows below the measurement {(np.array(errors) < 0).sum()}"
    )


if __name__ == "__main__":
    main()
