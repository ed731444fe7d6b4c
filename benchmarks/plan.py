"""Capacity-plan speed: a plan over 4 hardware x 3 TP for a synthetic day of requests.

Generates a seeded day (``rooftrace synth`` workload model: chat and agent sessions with growing
prompts, diurnal bursty arrivals) for one model, ingests it into a temporary store, then times
``plan`` (window selection, per-configuration replica search, outputs). Prints the wall time of
each part, the replays run and the plan table.

    python benchmarks/plan.py                                   # the target: 1,000,000 requests
    python benchmarks/plan.py --requests 100000 --window-s 60   # a quicker look

Target (issue 7): <= 5 minutes for the 1,000,000-request day on the 2-core VM.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.plan import PlanOptions, plan
from pipeline.synth import SynthConfig, generate, write_logs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--hardware", default="h100-sxm,h200,mi300x,b200")
    ap.add_argument("--tp", default="2,4,8")
    ap.add_argument("--slo", default="chat")
    ap.add_argument("--window-s", type=float, default=600.0)
    ap.add_argument("--warmup-s", type=float, default=120.0)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--fleet", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        cfg = SynthConfig(requests=args.requests, models=(args.model,), seed=7)
        frame = generate(cfg)
        files = write_logs(frame, "openai", Path(tmp) / "day.jsonl")
        t1 = time.perf_counter()
        store = Store(Path(tmp) / "store")
        ingest_logs(files, store)
        t2 = time.perf_counter()
        opts = PlanOptions(
            model=args.model,
            slo=args.slo,
            fleet_path=args.fleet,
            hardware=tuple(args.hardware.split(",")),
            tp=tuple(int(x) for x in args.tp.split(",")),
            window_s=args.window_s,
            warmup_s=args.warmup_s,
            jobs=args.jobs,
            # The synthetic day starts at midnight of cfg.date; its last sessions spill into the
            # next date, whose partition is only that tail: plan the day itself.
            date=cfg.date,
        )
        result = plan(store, opts, progress=print)
        t3 = time.perf_counter()
    doc = result.doc
    print(f"synth {t1 - t0:.1f} s, ingest {t2 - t1:.1f} s, plan {t3 - t2:.1f} s")
    print(f"window: {doc['window']}")
    print(f"{doc['replays']} replays, search {doc['search_wall_s']:.1f} s wall")
    for r in doc["configurations"]:
        print(
            f"  {r['config']:<22} replicas {r['replicas']!s:>4}  $/day {r['usd_per_day'] or 0:>10,.0f}  "
            f"replays {r['replays']:>2}  {r['binding'] or r['note']}"
        )


if __name__ == "__main__":
    main()
