"""An autoscaled day against the static fleet sized for its peak (docs/economics.md, "An autoscaled day").

A synthetic 90-minute day shaped like a diurnal one (a quiet night at 1 request/s, a 15-minute
morning ramp to 20 requests/s, a plateau, an evening ramp down; 2,000-4,000-token prompts,
300-700-token outputs, seeded) replayed on fleets/autoscale.toml's deployment (Llama-3.1-8B bf16
on H100 SXM): static at 3 and 4 replicas, then autoscaled 1..4 on KV occupancy (scale up above
0.3, down below 0.1, 60 s windows) with the catalog's scale-up delay and with a 20-minute engine
start. Prints GPU-hours and TTFT p99 (inverse CDF; the day, and the arrivals of the ramp
[20, 40) min). tests/test_autoscale.py asserts the same relations on the same day.

    PYTHONPATH=. python3 benchmarks/autoscale_day.py
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.engine.jit import simulate_jit  # noqa: E402
from pipeline.engine.model import EngineResult, Workload  # noqa: E402
from pipeline.replay.autoscale import AutoscaleSettings, replay_autoscaled  # noqa: E402
from pipeline.replay.fleet import load_fleet, resolve  # noqa: E402

RAMP = (1200.0, 2400.0)


def diurnal(seed: int = 7) -> Workload:
    rng = np.random.default_rng(seed)
    night, peak = 1.0, 20.0

    def rate(t: float) -> float:
        if t < 1200:
            return night
        if t < 2100:
            return night + (peak - night) * (t - 1200) / 900
        if t < 3900:
            return peak
        if t < 4500:
            return peak - (peak - night) * (t - 3900) / 600
        return night

    candidates = np.cumsum(rng.exponential(1 / peak, int(5400 * peak * 1.2)))
    candidates = candidates[candidates < 5400]
    keep = rng.random(candidates.shape[0]) < np.array([rate(t) for t in candidates]) / peak
    arrival = candidates[keep]
    n = arrival.shape[0]
    return Workload(
        arrival_s=arrival,
        prompt_tokens=rng.integers(2000, 4000, n).astype(np.int64),
        output_tokens=rng.integers(300, 700, n).astype(np.int64),
    )


def ttft_p99(res: EngineResult, lo: float = 0.0, hi: float = math.inf) -> float:
    m = (res.arrival_s >= lo) & (res.arrival_s < hi)
    ttft = np.where(np.isfinite(res.first_token_s[m]), res.first_token_s[m] - res.arrival_s[m], np.inf)
    return float(np.quantile(ttft, 0.99, method="inverted_cdf"))


def main() -> None:
    base = load_fleet(ROOT / "fleets" / "autoscale.toml")
    assert base.autoscale is not None
    fleet = resolve(replace(base, autoscale=None, replicas=4))
    spec, cost = fleet.spec(), fleet.cost_model.table
    work = diurnal()
    last = float(work.arrival_s.max())
    print(f"day: {work.n:,} requests over {last / 60:.1f} min; {fleet.config.model} on {fleet.config.hardware}")
    for r in (3, 4):
        res = simulate_jit(work, replace(spec, replicas=r), cost)
        print(
            f"static {r} replicas: {r * last / 3600:.2f} GPU-h, TTFT p99 day {ttft_p99(res):.3f} s, "
            f"ramp {ttft_p99(res, *RAMP):.3f} s"
        )
    for start in (base.autoscale.engine_start_s, 1200.0):
        policy = AutoscaleSettings(
            1,
            4,
            "kv",
            0.3,
            0.1,
            window_s=60.0,
            load_gb_s=base.autoscale.load_gb_s,
            engine_start_s=start,
            cuda_graph_s=base.autoscale.cuda_graph_s,
        )
        t0 = time.perf_counter()
        res, _, out, _ = replay_autoscaled(
            work,
            spec,
            policy,
            fleet.memory.weights_bytes_per_gpu,
            lambda routes, log: simulate_jit(work, spec, cost, log, routes=routes),
        )
        wall = time.perf_counter() - t0
        print(
            f"autoscaled kv 1..4, scale-up delay {out.delay_s:.1f} s: {out.provisioned_s(0.0, last) / 3600:.2f} GPU-h, "
            f"TTFT p99 day {ttft_p99(res):.3f} s, ramp {ttft_p99(res, *RAMP):.3f} s; {len(out.changes)} changes, "
            f"{out.passes} passes, converged {out.converged} ({wall:.1f} s wall)"
        )


if __name__ == "__main__":
    main()
