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

import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from autoscale_support import diurnal, ttft_p99  # noqa: E402

from pipeline.engine.jit import simulate_jit  # noqa: E402
from pipeline.replay.autoscale import AutoscaleSettings, replay_autoscaled  # noqa: E402
from pipeline.replay.fleet import load_fleet, resolve  # noqa: E402

RAMP = (1200.0, 2400.0)


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
        res, _, out, _ = replay_autoscaled(work, spec, policy, fleet.memory.weights_bytes_per_gpu, cost)
        wall = time.perf_counter() - t0
        print(
            f"autoscaled kv 1..4, scale-up delay {out.delay_s:.1f} s: {out.provisioned_s(0.0, last) / 3600:.2f} GPU-h, "
            f"TTFT p99 day {ttft_p99(res):.3f} s, ramp {ttft_p99(res, *RAMP):.3f} s; {len(out.changes)} changes, "
            f"decided in the event loop, one pass ({wall:.1f} s wall)"
        )


if __name__ == "__main__":
    main()
