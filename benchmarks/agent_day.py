"""A day of long prompts on a small fleet: the scale-out issue's 2,000,000-request day, end to end.

Runs, each as its own ``rooftrace`` process in a temporary project folder (wall time and that
process's peak RSS printed):

    rooftrace synth --format vidur --requests N --models llama-3.1-8b --flat --out day.csv
    rooftrace ingest day.csv --format vidur --date 2025-01-15
    rooftrace classify --date 2025-01-15
    rooftrace replay --fleet fleets/default.toml --date 2025-01-15     (2 replicas)

then the size of the day's prefix chains both ways: laid out as hashes (8 bytes per block, what
the engine used to take) and as the ChainTree the engine takes (pipeline.classify.prefix).

    python benchmarks/agent_day.py [--requests 2000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATE = "2025-01-15"


def _run(args: list[str], cwd: Path) -> None:
    """One rooftrace command in ``cwd``: prints its wall time, its own peak RSS (``wait4``) and the
    first line it printed."""
    t0 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "ROOFTRACE_STORE"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"rooftrace {args[0]} failed with exit code {proc.returncode}")
    first = (stdout.strip().splitlines() or [""])[0]
    print(f"{args[0]:<9} {wall:8.1f} s  peak RSS {usage.ru_maxrss / 1024**2:5.2f} GiB  {first[:110]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2_000_000)
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="rooftrace-agent-day-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{a.requests:,} requests in {work} (load {os.getloadavg()[0]:.2f})")
    try:
        _run(["synth", "--format", "vidur", "--requests", str(a.requests), "--models", "llama-3.1-8b", "--flat",
              "--out", "day.csv"], work)  # fmt: skip
        _run(["ingest", "day.csv", "--format", "vidur", "--date", DATE], work)
        _run(["classify", "--date", DATE], work)
        _run(["replay", "--fleet", str(ROOT / "fleets" / "default.toml"), "--date", DATE], work)

        from pipeline.classify.accounting import load_identity
        from pipeline.ingest.store import Store

        ident = load_identity(Store(work / "traces" / "store"), DATE)
        assert ident is not None
        blocks = int((ident.cached // 16).sum())
        tree = ident.tree(16)
        print(
            f"prefix chains of {ident.n_requests:,} requests at 16-token blocks: laid out {blocks:,} hashes "
            f"= {blocks * 8 / 1024**3:.2f} GiB; as a ChainTree {tree.nbytes / 1024**2:.1f} MiB"
        )
        print(f"(load {os.getloadavg()[0]:.2f} at the end)")
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
