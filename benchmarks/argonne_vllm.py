"""vLLM static batches on A100 and H100 (Argonne's LLM-Inference-Bench) replayed: a check, nothing fitted.

Each run of the table submitted ``batch`` prompts of ``length`` tokens at once to ``vllm.LLM``
(vLLM 0.5 / 0.6, FP16, TP 1 / 2 / 4) and timed until the last of ``length`` output tokens. This
script replays every configuration whose model the catalog describes on one replica (the
settings in tests/published.py, ``argonne_fleet``) with both cost tiers and prints, per GPU,
model and TP: configurations, the tier the fleet used, the median signed error and the median
and p90 absolute error of throughput (replayed / measured − 1: positive = the replay is
faster). Repeated configurations (22 rows) count once, at their median latency. The roofline
tier's errors are split by KV pressure (the batch's KV at full length exceeds the cache: vLLM
preempts and recomputes to finish). Then, for the
measured tier on H100, the time per step the run spent beyond the replay: (measured − replayed)
/ output length, by batch size, and a least-squares line a + b · batch (a diagnostic of the
benchmarked stack's host time; nothing is fitted back into the model). docs/replay_validation.md
reports these figures.

    ROOFTRACE_MEASUREMENTS=path/to/measurements python benchmarks/argonne_vllm.py
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MEAS = Path(os.environ.get("ROOFTRACE_MEASUREMENTS", "measurements"))
sys.path.insert(0, str(ROOT / "tests"))  # the published tables are test data (tests/published.py)

from published import (  # noqa: E402
    ARGONNE_CSV,
    ARGONNE_MODELS,
    argonne_configs,
    argonne_fleet,
    read_argonne_table,
    replay_argonne,
)

from pipeline.costmodel.profile.cost import fleet_step_cost  # noqa: E402

TABLE = MEAS.joinpath(*ARGONNE_CSV)


def main() -> None:
    if not TABLE.is_file():
        sys.exit(f"{TABLE}: the shared measurements are not laid out beside the project (set ROOFTRACE_MEASUREMENTS)")
    points, skipped = read_argonne_table(TABLE)
    configs = argonne_configs(points)  # repeated configurations at their median latency
    print(
        f"{len(points)} vLLM rows on A100 / H100 ({len(configs)} configurations; {skipped} rows of models "
        "without a catalog entry left out)",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    # (tier asked, gpu, model, tp) -> [(length, batch, measured s, replayed s)]
    rows: dict[tuple[str, str, str, int], list[tuple[int, int, float, float]]] = defaultdict(list)
    tier_used: dict[tuple[str, str, str, int], str] = {}
    pressure: set[tuple[str, str, int, int, int]] = set()  # configurations whose KV does not fit at once
    kv_tokens: dict[tuple[str, str, str, int], int] = {}  # the replica's KV cache in tokens
    for tier in ("auto", "roofline"):

        def say(i: int, tier: str = tier) -> None:
            if i % 50 == 0:
                print(f"  {tier}: {i}/{len(configs)} configurations, {time.perf_counter() - t0:.0f} s", file=sys.stderr)

        for (gpu, model, tp, length, batch), replayed in replay_argonne(configs, tier, say).items():
            key = (tier, gpu, model, tp)
            if key not in tier_used:  # the tier the fleet's step cost came from: measured, prior or roofline
                fleet = argonne_fleet(gpu, model, tp, tier)
                tier_used[key] = fleet_step_cost(fleet).source
                kv_tokens[key] = fleet.scheduler.num_gpu_blocks * fleet.scheduler.block_size
            rows[key].append((length, batch, configs[(gpu, model, tp, length, batch)], replayed))
            if batch * 2 * length > kv_tokens[key]:
                pressure.add((gpu, model, tp, length, batch))  # vLLM preempts (recompute) to finish
    print("| GPU | model | TP | configs | tier | median error | median abs | p90 abs | range |")
    print("|---|---|---:|---:|---|---:|---:|---:|---|")
    for key in sorted(rows, key=lambda k: (k[1], ARGONNE_MODELS[k[2]][0], k[3], k[0])):
        tier, gpu, model, tp = key
        if tier == "roofline" and tier_used[("auto", gpu, model, tp)] == "roofline":
            continue  # auto already was the roofline
        e = np.array([m / r - 1.0 for _, _, m, r in rows[key]])
        a = np.abs(e)
        print(
            f"| {gpu} | {ARGONNE_MODELS[model][0]} | {tp} | {e.size} | {tier_used[key]} | {np.median(e):+.1%} | "
            f"{np.median(a):.1%} | {np.quantile(a, 0.9):.1%} | {e.min():+.0%} … {e.max():+.0%} |"
        )
    for tier in ("auto", "roofline"):
        for gpu in ("a100-40gb-sxm", "h100-sxm"):
            e = np.array([m / r - 1 for k, v in rows.items() if k[0] == tier and k[1] == gpu for _, _, m, r in v])
            if e.size:
                print(
                    f"{gpu} {tier} (used: {sorted({tier_used[k] for k in rows if k[0] == tier and k[1] == gpu})}): "
                    f"{e.size} configurations, median {np.median(e):+.1%}, median |e| {np.median(np.abs(e)):.1%}, "
                    f"rows where the replay is slower than vLLM: {(e < 0).sum()}"
                )
    print("\nroofline tier, by KV pressure (the batch's KV at full length exceeds the replica's cache):")
    for gpu in ("a100-40gb-sxm", "h100-sxm"):
        for label, want in (("KV pressure", True), ("fits", False)):
            e = np.array(
                [
                    m / r - 1
                    for k, v in rows.items()
                    if k[0] == "roofline" and k[1] == gpu
                    for n, b, m, r in v
                    if ((gpu, k[2], k[3], n, b) in pressure) == want
                ]
            )
            if e.size:
                print(
                    f"  {gpu} {label}: {e.size} configurations, median {np.median(e):+.1%}, "
                    f"median |e| {np.median(np.abs(e)):.1%}, p90 |e| {np.quantile(np.abs(e), 0.9):.1%}"
                )
    print("\nH100, measured tier: time per step beyond the replay, (measured - replayed) / output tokens")
    print("| TP | batch 1 | 16 | 32 | 64 | a + b · batch (least squares) |")
    print("|---:|---:|---:|---:|---:|---|")
    for tp in (1, 2, 4):
        gap = [
            (b, (m - r) / n)
            for k, v in rows.items()
            if k[:2] == ("auto", "h100-sxm") and k[3] == tp
            for n, b, m, r in v
        ]
        g = np.array(gap)
        coef = np.linalg.lstsq(np.c_[np.ones(len(g)), g[:, 0]], g[:, 1], rcond=None)[0]
        cells = " | ".join(f"{np.median(g[g[:, 0] == b, 1]) * 1e3:.2f} ms" for b in (1, 16, 32, 64))
        print(f"| {tp} | {cells} | {coef[0] * 1e3:.2f} ms + {coef[1] * 1e6:.0f} µs · batch |")
    print(f"\nreplayed {2 * len(configs)} configurations in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
