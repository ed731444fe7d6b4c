"""How long ``rooftrace --help`` and every command's ``--help`` take, from a fresh interpreter.

Target (docs/architecture.md): each answers in <= 0.3 s, because the command line imports a stage
only when its command runs. Each help is timed ``--rounds`` times with the installed console
script (``rooftrace``, else ``python -m pipeline``); the median and the worst are printed, with
the bare interpreter's start-up for reference. Check ``uptime`` first: a loaded machine is slower.

    python benchmarks/cli_help.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = [
    [], ["calibrate"], ["catalog"], ["classify"], ["cost"], ["demo"], ["fit"], ["ingest"], ["nightly"],
    ["plan"], ["query"], ["replay"], ["report"], ["sql"], ["synth"], ["validate"],
]  # fmt: skip


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    script = shutil.which("rooftrace")
    base = [script] if script else [sys.executable, "-m", "pipeline"]
    print(f"load average {os.getloadavg()[0]:.2f}; {' '.join(base)}; {args.rounds} rounds each")
    bare = [_time([sys.executable, "-c", "pass"]) for _ in range(args.rounds)]
    print(f"{'python -c pass':<28} median {statistics.median(bare):.3f} s  worst {max(bare):.3f} s")
    worst_median = 0.0
    for cmd in COMMANDS:
        times = [_time([*base, *cmd, "--help"]) for _ in range(args.rounds)]
        med = statistics.median(times)
        worst_median = max(worst_median, med)
        print(f"{'rooftrace ' + ' '.join([*cmd, '--help']):<28} median {med:.3f} s  worst {max(times):.3f} s")
    print(f"slowest median: {worst_median:.3f} s (target <= 0.3 s)")


if __name__ == "__main__":
    main()
