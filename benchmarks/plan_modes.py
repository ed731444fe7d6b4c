"""The serving-mode frontier of ``plan --modes`` on the generated days of
tests/test_plan_modes.py (Llama-3.1-8B, one H100 SXM per replica, ``--window day``): prints each
day's frontier lines, the figures docs/planning.md "Serving modes" quotes.

    PYTHONPATH=. python3 benchmarks/plan_modes.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the days are the tests' (tests/test_plan_modes.py: write_day)

from test_plan_modes import AFFINITY_FLEET, _opts, _store  # noqa: E402

from pipeline.plan import plan  # noqa: E402
from pipeline.plan.modes import frontier_lines  # noqa: E402

#: (kind, requests or sessions, rate per second, SLO, modes, prefill:decode ratios, other options):
#: the tests' days ("affinity": the agent-session day's base fleet routes by the first prefix block)
CASES: list[tuple[str, int, float, str, tuple[str, ...], tuple[tuple[int, int], ...], dict[str, Any]]] = [
    ("agent", 2000, 10.0, "ttft_p99=3s,tpot_p99=15ms", ("colocated", "disaggregated"), ((1, 1), (2, 1)), {}),
    ("chat", 2000, 20.0, "ttft_p99=2s,tpot_p99=100ms", ("colocated", "disaggregated"), ((1, 1), (1, 2)), {}),
    ("chat", 300, 0.5, "ttft_p99=2s,tpot_p99=5ms", ("colocated", "speculative"), ((1, 1),), {}),
    ("chat", 3000, 100.0, "ttft_p99=2s,tpot_p99=40ms", ("colocated", "speculative"), ((1, 1),), {}),
    (
        "agent", 2000, 10.0, "ttft_p99=3s,tpot_p99=8ms",
        ("colocated", "disaggregated", "speculative", "disaggregated-speculative"), ((1, 1), (2, 1)), {},
    ),
    ("sessions", 300, 0.3, "ttft_p99=2s,tpot_p99=100ms", ("colocated", "offload"), ((1, 1),),
     {"offload_gb": (256.0, 512.0), "affinity": True}),
    ("chat", 2000, 20.0, "ttft_p99=2s,tpot_p99=100ms", ("colocated", "offload"), ((1, 1),), {}),
]  # fmt: skip


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for kind, n, rate, slo, modes, ratios, extra in CASES:
            store, _ = _store(Path(tmp) / f"{kind}-{n}-{rate:g}", kind, n, rate)
            kw = dict(extra)
            if kw.pop("affinity", False):
                fleet = Path(tmp) / "affinity.toml"
                fleet.write_text(AFFINITY_FLEET, encoding="utf-8")
                kw["fleet_path"] = str(fleet)
            doc = plan(store, _opts(slo, modes, pd_ratios=ratios, **kw)).doc
            what = f"{n:,} sessions starting at {rate:g}/s" if kind == "sessions" else f"{n:,} requests at {rate:g}/s"
            print(f"== {kind}: {what}, {slo}")
            for line in frontier_lines(doc["frontier"]):
                print(line)
            for c in doc["configurations"]:
                if (c.get("note") or "").startswith("skipped"):
                    print(f"  ({c['config']}: {c['note']})")


if __name__ == "__main__":
    main()
