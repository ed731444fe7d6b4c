"""A newcomer's first minute: the first replay and the first ``rooftrace demo`` in a fresh clone.

A fresh clone has no compiled replay engine: numba compiles it on the first replay and caches it
(``$NUMBA_CACHE_DIR``, else ``__pycache__`` beside the sources). This script clones the checkout
it lives in into a temporary folder and, with an empty numba cache each time, runs from that
clone's own sources (``python -m pipeline``, the clone first on ``PYTHONPATH``):

1. ``replay`` of the bundled Azure conversation hour (ingested first, untimed) on
   ``fleets/default.toml``: cold (compile included), then warm (cached);
2. ``demo``: cold, then warm on the same store (its ingest then skips the file it already has).

Each figure is the wall time of the whole command, with the CPU time it used (its process and
children's, ``RUSAGE_CHILDREN``): the compile is CPU-bound, so on a machine loaded by others the
wall time grows and the CPU time much less. The load average is printed before and after.

    python benchmarks/cold_start.py
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Timed(NamedTuple):
    wall: float
    cpu: float

    def __str__(self) -> str:
        return f"{self.wall:.1f} s (CPU {self.cpu:.1f} s)"


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _run(clone: Path, cache: Path, *argv: str) -> Timed:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(clone)}
    env.pop("ROOFTRACE_STORE", None)
    t0, c0 = time.perf_counter(), _cpu()
    done = subprocess.run([sys.executable, "-m", "pipeline", *argv], cwd=clone, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    if done.returncode != 0:
        raise SystemExit(f"`rooftrace {' '.join(argv)}` failed ({done.returncode}): {done.stderr[-2000:]}")
    return Timed(wall, cpu)


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.2f}"


def main() -> None:
    print(f"{_load()}, {os.cpu_count()} cores; cloning {ROOT}")
    with tempfile.TemporaryDirectory(prefix="rooftrace-cold-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        store = Path(tmp) / "store"
        sample = clone / "traces" / "sample" / "azure_conv_2023.csv.gz"
        _run(clone, Path(tmp) / "unused", "ingest", "--store", str(store), str(sample))
        replay = ("replay", "--store", str(store), "--fleet", "fleets/default.toml")
        cache = Path(tmp) / "numba-replay"
        cold = _run(clone, cache, *replay)
        warm = _run(clone, cache, *replay)
        print(f"first replay (19,366 requests, empty numba cache): {cold}; again, cached: {warm} ({_load()})")
        demo = ("demo", "--store", str(Path(tmp) / "demo-store"), "--reports", str(Path(tmp) / "reports"))
        cache = Path(tmp) / "numba-demo"
        cold = _run(clone, cache, *demo)
        warm = _run(clone, cache, *demo)
        print(f"first `rooftrace demo` (empty numba cache): {cold}; again, cached: {warm} ({_load()})")


if __name__ == "__main__":
    main()
