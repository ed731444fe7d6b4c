"""Headroom: the load curve (traffic multipliers), its knee and sentence, the time budget, the
named query and the report chart."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.ingest.store import Store
from pipeline.publish.warehouse import run_query
from pipeline.replay.fleet import parse_fleet
from pipeline.replay.loadcurve import headroom_sentence, knee, load_curve


def _row(m: float, passed: bool | None, ratio: float = 0.5, over: bool = False, rejected: int = 0) -> dict[str, Any]:
    return {
        "multiplier": m,
        "status": "ok",
        "slo": "chat" if passed is not None else None,
        "slo_passed": passed,
        "slo_worst_ratio": ratio if passed is not None else None,
        "overloaded": over,
        "rejected": rejected,
    }


def test_knee_and_sentence_by_hand() -> None:
    rows = [_row(0.5, True), _row(1, True), _row(2, True), _row(3, False, 1.8), _row(4, False, 3.0)]
    assert knee(rows) == 2
    assert (
        headroom_sentence(rows)
        == "meets the SLO chat up to 2x today's traffic (fails at 3x: worst target at 1.8x its limit)"
    )
    today_fails = [_row(0.5, True), _row(1, False, 4.2), _row(2, False, 9.0)]
    assert knee(today_fails) == 0.5
    assert (
        headroom_sentence(today_fails) == "fails the SLO chat at today's traffic: worst target at 4.2x its limit at 1x"
    )
    never = [_row(1, True), _row(4, True)]
    assert headroom_sentence(never).startswith("meets the SLO chat up to at least 4x")
    # no SLO: overload or rejections mark the knee
    plain = [_row(1, None), _row(2, None, over=True)]
    assert knee(plain) == 1
    assert headroom_sentence(plain) == (
        "serves its traffic without overload or rejections up to 1x today's traffic (fails at 2x: overloaded)"
    )
    assert knee([_row(0.5, None, rejected=3)]) is None
    assert headroom_sentence([_row(0.5, None, rejected=3), _row(1, None, rejected=5)]) == (
        "fails at today's traffic: 3 requests rejected already at 0.5x"
    )


def test_curve_on_real_traffic_grows_with_load_and_respects_the_budget(replayed_store: tuple[Store, str]) -> None:
    store, _run_id = replayed_store
    requests = store.read_requests(store.resolve_date(None))
    cfg = parse_fleet(
        {"name": "t", "model": "llama-3.1-8b", "hardware": "l40s", "replicas": 1, "engine": {"max_model_len": 131072}},
        "t",
    )
    rows = load_curve(requests, cfg, "chat", (1.0, 4.0, 16.0), budget_s=600.0)
    ms = [r["multiplier"] for r in rows]
    assert {1.0, 4.0, 16.0} <= set(ms) and ms == sorted(ms)  # plus midpoints narrowing the knee
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == len(rows)
    # more traffic on the same fleet never makes the tail faster here
    by_m = {r["multiplier"]: r["ttft_p99_s"] for r in ok}
    assert by_m[1.0] <= by_m[4.0] <= by_m[16.0]
    k = knee(rows)
    if k is not None and k < 16.0:  # the first failing point is right after the knee
        after = [r for r in ok if r["multiplier"] > k]
        assert after[0]["slo_passed"] is False
    assert all(r["requests"] == requests.height and r["rejected"] == 0 for r in ok)
    # a zero budget computes nothing and says so (skipped, never dropped)
    none = load_curve(requests, cfg, "chat", (1.0, 2.0), budget_s=0.0)
    assert [r["status"] for r in none] == ["skipped", "skipped"]
    assert headroom_sentence(none) == "load curve: no point computed within the time budget"


def test_named_query_serves_the_nightly_curve(replayed_store: tuple[Store, str]) -> None:
    store, run_id = replayed_store
    from pipeline.publish.warehouse import build_warehouse

    build_warehouse(store)
    rows = run_query(store, "load_curve", {"run_id": run_id}).to_pylist()
    assert [r["multiplier"] for r in rows][:6] == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    assert all(r["slo"] for r in rows if r["status"] == "ok")
    with pytest.raises(Exception, match="no replay run"):
        run_query(store, "load_curve", {"run_id": "nope"})
