"""The report's latency summaries (queries ``latency`` and ``latency_by``): min, max and the sample
standard deviation beside the inverse-CDF percentiles, equal to numpy's over the run's finished
requests, and shown in ms with the sample count in the report's tables."""

from __future__ import annotations

import html as html_lib
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.ingest.store import Store
from pipeline.publish.report import build_report
from pipeline.publish.warehouse import Session
from pipeline.replay.slo import percentile


def _query(store: Store, name: str, run_id: str) -> list[dict[str, object]]:
    session = Session(store)
    try:
        return session.query(name, {"run_id": run_id}).to_pylist()
    finally:
        session.con.close()


def test_latency_min_max_std_match_numpy(replayed_store: tuple[Store, str]) -> None:
    store, run_id = replayed_store
    req = pl.read_parquet(store.run_dir(run_id) / "requests.parquet").filter(pl.col("status") == "finished")
    rows = {r["metric"]: r for r in _query(store, "latency", run_id)}
    for metric in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        v = req[metric].drop_nulls().to_numpy()
        v = v[np.isfinite(v)]
        r = rows[metric]
        assert r["samples"] == len(v) > 100
        assert r["min"] == v.min() and r["max"] == v.max() and r["p99"] == percentile(v, 99)
        assert r["std"] == pytest.approx(float(np.std(v, ddof=1)), rel=1e-9)
        assert r["min"] <= r["p50"] <= r["p99"] <= r["max"]
    itl = rows["itl_s"]
    assert itl["min"] <= itl["p50"] <= itl["max"] and itl["std"] >= 0


def test_latency_by_tenant_has_min_max_std(replayed_store: tuple[Store, str]) -> None:
    store, run_id = replayed_store
    req = pl.read_parquet(store.run_dir(run_id) / "requests.parquet").filter(pl.col("status") == "finished")
    joined = req.join(store.read_requests().select("request_id", "tenant"), on="request_id")
    rows = [r for r in _query(store, "latency_by", run_id) if r["dimension"] == "tenant" and r["metric"] == "e2e_s"]
    assert len(rows) == 3
    for r in rows:
        v = joined.filter(pl.col("tenant") == r["bucket"])["e2e_s"].to_numpy()
        assert (r["min"], r["max"]) == (v.min(), v.max())
        assert r["std"] == pytest.approx(float(np.std(v, ddof=1)), rel=1e-9)


def test_the_report_shows_them_in_ms(replayed_store: tuple[Store, str], tmp_path: Path) -> None:
    store, run_id = replayed_store
    res = build_report(store, run_id, out=tmp_path / "index.html")
    page = html_lib.unescape(res.path.read_text()).replace("\u200b", "")
    section = page[page.index("<h2>Latency percentiles (milliseconds, finished requests)</h2>") :]
    head = re.findall(r"<th>(.*?)</th>", section.split("</tr>")[0])
    assert head == ["metric", "n", "min (ms)", "p50 (ms)", "p90 (ms)", "p95 (ms)", "p99 (ms)", "p99.9 (ms)",
                    "max (ms)", "mean (ms)", "std (ms)"]  # fmt: skip
    ttft = {r["metric"]: r for r in _query(store, "latency", run_id)}["ttft_s"]
    row = re.search(r"<tr><td>ttft</td>(.*?)</tr>", section)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert cells[0] == f"{ttft['samples']:,}"
    shown_max = float(cells[7].replace(",", ""))
    assert shown_max == pytest.approx(float(ttft["max"]) * 1000, rel=5e-3)  # 3 significant digits
    tenants = page[page.index("<h2>Latency by tenant (milliseconds; bucket = tenant)</h2>") :]
    assert re.findall(r"<th>(.*?)</th>", tenants.split("</tr>")[0]) == [
        "metric", "bucket", "n", "min (ms)", "p50 (ms)", "p90 (ms)", "p99 (ms)", "max (ms)", "mean (ms)", "std (ms)"
    ]  # fmt: skip
