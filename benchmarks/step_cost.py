"""Throughput of the vectorised roofline cost model (steps costed per second).

    python benchmarks/step_cost.py

The replay engine costs spans of steps in one call; this prints how many steps per second
step_cost handles for dense, MoE, MLA and sliding-window models at a few batch sizes.
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.catalog import load_hardware, load_model
from pipeline.costmodel.roofline import Deployment, step_cost
from pipeline.costmodel.steps import StepBatch


def batch(n: int, rng: np.random.Generator) -> StepBatch:
    chunk = rng.integers(0, 2048, n).astype(float)
    off = rng.integers(0, 8192, n).astype(float)
    dec = rng.integers(0, 256, n).astype(float)
    ctx = dec * rng.integers(1, 8192, n)
    seqs = (chunk > 0).astype(float)
    return StepBatch(chunk, seqs, chunk * off + chunk * (chunk + 1) / 2, off + chunk, dec, ctx.astype(float))


def main() -> None:
    rng = np.random.default_rng(0)
    cases = [
        ("llama-3.1-70b", "h100-sxm", 4, "bf16"),
        ("qwen3-235b-a22b", "h200", 8, "fp8"),
        ("deepseek-v3", "b200", 8, "fp8-block"),
        ("gpt-oss-120b", "h100-sxm", 1, "mxfp4"),
    ]
    for model, hw, tp, wd in cases:
        dep = Deployment(load_model(model), load_hardware(hw), tp=tp, weight_dtype=wd)
        for n in (1, 1_000, 100_000):
            b = batch(n, rng)
            reps = max(3, min(300, 20_000 // n))
            t0 = time.perf_counter()
            for _ in range(reps):
                step_cost(dep, b)
            dt = (time.perf_counter() - t0) / reps
            print(f"{model:16s} tp{tp} N={n:>7,}: {dt * 1e3:8.3f} ms per call, {n / dt:14,.0f} steps/s")


if __name__ == "__main__":
    main()
