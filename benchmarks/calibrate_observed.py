"""The worked example of docs/calibration.md, end to end, with its figures.

A "production" day is made by replaying a synthetic Llama-3.1-8B day on one H100 whose stack is
*not* the measured tables' (known parameters: linear layers 25 % slower, attention 20 % faster,
1.5 ms more per step) and adding 5 % noise to each request's TTFT and decode time; the day is
written as OpenAI logged pairs (which carry TTFT and E2E) and then handled with the CLI only:

    rooftrace ingest day.jsonl --store STORE
    rooftrace calibrate --observed --fleet prod.toml --store STORE --out prod-cal.toml
    rooftrace replay --fleet prod-calibrated.toml --store STORE      # calibration_file = "prod-cal.toml"

Run: ``python benchmarks/calibrate_observed.py [--requests 3000] [--keep DIR]``; prints each
command's output and the wall time of the fit.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

KNOWN = {"linear_scale": 1.25, "attention_scale": 0.8, "comm_scale": 1.0, "step_overhead_s": 0.0015}


def make_day(folder: Path, requests: int) -> Path:
    import numpy as np

    from pipeline.costmodel.profile.cost import fleet_step_cost
    from pipeline.costmodel.stackcal import apply
    from pipeline.ingest import ingest_logs
    from pipeline.ingest.store import Store
    from pipeline.replay.fleet import load_fleet, resolve
    from pipeline.replay.run import ReplayOptions, build_workload, run_workload
    from pipeline.replay.slo import request_latencies
    from pipeline.synth import SynthConfig, generate, write_logs

    synth = generate(
        SynthConfig(requests=requests, seed=5, duration_s=3600, tenants=2, models=("llama-3.1-8b",), diurnal=False)
    )
    write_logs(synth, "openai", folder / "raw.jsonl")
    raw = Store(folder / "raw-store")
    ingest_logs([folder / "raw.jsonl"], raw)
    frame = raw.read_requests(None)
    fleet = resolve(load_fleet(folder / "prod.toml"))
    work = build_workload(frame, fleet, ReplayOptions())
    run = run_workload(work, fleet, ReplayOptions(), cost=apply(fleet_step_cost(fleet), KNOWN))
    lat = request_latencies(run.result, work)
    rng = np.random.default_rng(6)
    ttft = lat["ttft"] * np.exp(rng.normal(0.0, 0.05, work.n))
    decode = (lat["e2e"] - lat["ttft"]) * np.exp(rng.normal(0.0, 0.05, work.n))
    served = pl.DataFrame(
        {"request_id": frame["request_id"].str.strip_prefix("chatcmpl-"), "ttft_s": ttft, "e2e_s": ttft + decode}
    )
    day = synth.drop("ttft_s", "e2e_s").join(served, on="request_id")
    write_logs(day, "openai", folder / "day.jsonl")
    shutil.rmtree(folder / "raw-store")
    return folder / "day.jsonl"


def cli(*args: str) -> float:
    exe = Path(sys.executable).with_name("rooftrace")
    cmd = [str(exe) if exe.exists() else "rooftrace", *args]
    print("$ rooftrace " + " ".join(args), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    print(done.stdout.rstrip())
    if done.returncode:
        print(done.stderr.rstrip())
        raise SystemExit(f"exit code {done.returncode}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="rooftrace-cal-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        (folder / "prod.toml").write_text('name = "prod"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n')
        (folder / "prod-calibrated.toml").write_text(
            'name = "prod-cal"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\ncalibration_file = "prod-cal.toml"\n'
        )
        print(f"known stack: {KNOWN}")
        log = make_day(folder, args.requests)
        store = str(folder / "store")
        cli("ingest", str(log), "--store", store)
        fleet = str(folder / "prod.toml")
        out = str(folder / "prod-cal.toml")
        wall = cli("calibrate", "--observed", "--fleet", fleet, "--store", store, "--out", out)
        print(f"(calibrate --observed: {wall:.1f} s wall)")
        print((folder / "prod-cal.toml").read_text())
        cli("replay", "--fleet", str(folder / "prod-calibrated.toml"), "--store", store)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
