"""Helpers for the benchmark scripts: run a step in a child process and report its peak RSS."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from typing import Any


def run_child(code: str) -> tuple[float, float, Any]:
    """Run ``code`` in a fresh Python; it may print one JSON line last. Returns (wall s, peak RSS
    MiB of that child alone, the parsed JSON or None)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"benchmark step failed with exit code {proc.returncode}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the max over all children so far; steps run largest last or the
    # figure is an upper bound (stated by the callers).
    peak = max(peak_kib, before) / 1024.0
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        doc = json.loads(last)
    except json.JSONDecodeError:
        doc = None
    return wall, peak, doc
