"""Helpers for the benchmark scripts: run a step in a fresh Python and report its own peak RSS."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

_EPILOGUE = """
import json as _json, resource as _resource
print(_json.dumps({"rss_kib": _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss, **globals().get("RESULT", {})}))
"""


def run_child(code: str) -> tuple[float, float, dict[str, Any]]:
    """Run ``code`` in a fresh Python (it may leave a dict in ``RESULT``). Returns (wall s, peak
    RSS MiB of that process, RESULT)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code + _EPILOGUE], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"benchmark step failed with exit code {proc.returncode}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    return wall, doc.pop("rss_kib") / 1024.0, doc
