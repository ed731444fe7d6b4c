"""The serving-mode frontier of ``plan --modes`` on the four generated days of
tests/test_plan_modes.py (Llama-3.1-8B, one H100 SXM per replica, ``--window day``): prints each
day's frontier lines, the figures docs/planning.md "Serving modes" quotes.

    PYTHONPATH=. python3 benchmarks/plan_modes.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the days are the tests' (tests/test_plan_modes.py: write_day)

from test_plan_modes import _opts, _store  # noqa: E402

from pipeline.plan import plan  # noqa: E402
from pipeline.plan.modes import frontier_lines  # noqa: E402

#: (kind, requests, rate per second, SLO, modes, prefill:decode ratios): the tests' four days
CASES = [
    ("agent", 2000, 10.0, "ttft_p99=3s,tpot_p99=15ms", ("colocated", "disaggregated"), ((1, 1), (2, 1))),
    ("chat", 2000, 20.0, "ttft_p99=2s,tpot_p99=100ms", ("colocated", "disaggregated"), ((1, 1), (1, 2))),
    ("chat", 300, 0.5, "ttft_p99=2s,tpot_p99=5ms", ("colocated", "speculative"), ((1, 1),)),
    ("chat", 3000, 100.0, "ttft_p99=2s,tpot_p99=40ms", ("colocated", "speculative"), ((1, 1),)),
]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for kind, n, rate, slo, modes, ratios in CASES:
            store, _ = _store(Path(tmp) / f"{kind}-{n}", kind, n, rate)
            doc = plan(store, _opts(slo, modes, pd_ratios=ratios)).doc
            print(f"== {kind}: {n:,} requests at {rate:g}/s, {slo}")
            for line in frontier_lines(doc["frontier"]):
                print(line)


if __name__ == "__main__":
    main()
