"""replay's latency summary (pipeline/replay/run.py ``_stats``, pipeline/cli/replay.py): mean, std,
min, percentiles keyed as the named queries key them (p99_9) and max, in seconds in --json and in
ms for people, with TPOT named as AIPerf's ITL."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import polars as pl
import pytest
from cli_checks import cli

from pipeline.cli.replay import LATENCY_STATS, latency_lines
from pipeline.ingest.store import Store


def test_summary_matches_numpy_on_the_replayed_requests(replayed_store: tuple[Store, str]) -> None:
    store, run_id = replayed_store
    run_dir = store.runs_dir / run_id
    summary = json.loads((run_dir / "config.json").read_text())["summary"]
    req = pl.read_parquet(run_dir / "requests.parquet").filter(pl.col("status") == "finished")
    for name in ("ttft_s", "tpot_s", "e2e_s"):
        v = req[name].drop_nulls().to_numpy()
        v = v[np.isfinite(v)]
        st = summary[name]
        assert set(st) == {"mean", "std", "min", "p50", "p90", "p95", "p99", "p99_9", "max"}
        assert st["min"] == v.min() and st["max"] == v.max()
        assert st["std"] == pytest.approx(v.std(ddof=1), rel=1e-12)
        assert st["p99_9"] == np.percentile(v, 99.9, method="inverted_cdf")
        assert st["min"] <= st["p50"] <= st["p99"] <= st["p99_9"] <= st["max"]


def test_replay_json_and_the_human_table(replayed_store: tuple[Store, str]) -> None:
    store, _ = replayed_store
    res = cli("replay", "--fleet", "fleets/default.toml", "--store", str(store.root), "--json")
    assert res.exit_code == 0, (res.stderr, res.exception)
    doc = json.loads(res.stdout)
    assert "p99.9" not in doc["ttft_s"] and doc["ttft_s"]["p99_9"] >= doc["ttft_s"]["p99"]
    human = cli("replay", "--fleet", "fleets/default.toml", "--store", str(store.root))
    lines = human.stdout.splitlines()
    head = lines.index(next(ln for ln in lines if ln.startswith("latency over")))
    assert lines[head + 1].split() == ["mean", "std", "min", "p50", "p90", "p99", "p99.9", "max"]
    assert [ln.split()[0] for ln in lines[head + 2 : head + 5]] == ["TTFT", "TPOT", "E2E"]
    assert "AIPerf and GuideLLM call ITL" in lines[head + 5]


def test_latency_lines_are_in_ms_by_hand() -> None:
    st: dict[str, Any] = dict(zip(LATENCY_STATS, (0.1203, 0.04, 0.02, 0.1, 0.2, 0.4, 0.9, 12.5), strict=True))
    lines = latency_lines({"ttft_s": st, "tpot_s": {k: 0.00971 for k in LATENCY_STATS}, "e2e_s": {}})
    assert lines[1].split() == ["TTFT", "120.3", "ms", "40.0", "ms", "20.0", "ms", "100.0", "ms", "200.0", "ms",
                                "400.0", "ms", "900.0", "ms", "12.50", "s"]  # fmt: skip
    assert lines[2].split()[:3] == ["TPOT", "9.7", "ms"]  # 0.00971 s, as people read it
    assert lines[3].split() == ["E2E", *["n/a"] * 8]
