"""Does a refactor change what a replay writes? Replays the bundled samples on the bundled
single-pool fleets with this checkout and with an earlier git revision (cloned into a temporary
folder, run from its own sources), then compares run ids and the bytes of every file of each run.

    python benchmarks/same_bytes.py --against 75f9143       # prints one line per run, exit 1 on a difference

The two sides share nothing but the Python packages installed: each has its own store and its own
numba cache (the first replay on each side compiles the engine; expect minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (sample, fleet, extra replay arguments): the runs compared.
CASES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("traces/sample/azure_conv_2023.csv.gz", "fleets/default.toml", ()),
    ("traces/sample/gateway_demo_2025-01-15.jsonl.gz", "fleets/demo.toml", ()),
    ("traces/sample/gateway_demo_2025-01-15.jsonl.gz", "fleets/demo.toml", ("--cache-hits", "simulated")),
)


def _cli(src: Path, cache: Path, *argv: str) -> str:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(src)}
    env.pop("ROOFTRACE_STORE", None)
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], cwd=src, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{src}: `rooftrace {' '.join(argv)}` failed ({done.returncode}): {done.stderr[-1500:]}")
    return done.stdout


def _runs(src: Path, work: Path) -> dict[str, dict[str, str]]:
    """Each case's run: its id and the sha256 of each of its files."""
    out: dict[str, dict[str, str]] = {}
    cache = work / "numba"
    for i, (sample, fleet, extra) in enumerate(CASES):
        store = work / f"store-{i}"
        _cli(src, cache, "ingest", "--store", str(store), str(src / sample))
        _cli(src, cache, "classify", "--store", str(store))
        _cli(src, cache, "replay", "--store", str(store), "--fleet", fleet, *extra)
        (run_dir,) = (store / "runs").iterdir()
        files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.iterdir()) if p.is_file()}
        out[f"{Path(sample).name} on {fleet} {' '.join(extra)}".strip()] = {"run_id": run_dir.name, **files}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the git revision to compare with (e.g. a commit id)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rooftrace-same-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(old)], check=True)
        subprocess.run(["git", "-C", str(old), "checkout", "-q", args.against], check=True)
        before = _runs(old, Path(tmp) / "old-work")
        after = _runs(ROOT, Path(tmp) / "new-work")
    bad = 0
    for case, was in before.items():
        now = after[case]
        diff = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
        bad += bool(diff)
        print(
            f"{'SAME' if not diff else 'DIFFERENT'}  {case}: run {now['run_id']}"
            + (f"; differs: {diff}" if diff else "")
        )
    print(f"{len(before) - bad} of {len(before)} runs byte-identical to {args.against}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
