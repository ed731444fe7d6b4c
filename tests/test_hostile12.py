"""Hostile round 12 (the overload rule, multi-node replicas and hardware files, as changed the
same day): each test reproduces one finding."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from pipeline.catalog.entries import MAX_GPUS_PER_NODE, parse_hardware
from pipeline.cost import PERIOD_ARRIVALS, Period, run_overload_sustained
from pipeline.engine.model import EngineResult, Workload
from pipeline.errors import ConfigError
from pipeline.nightly import NightlyResult
from pipeline.replay import _utc, health
from pipeline.runrequests import MemoryColumns

HARDWARE = Path(__file__).resolve().parents[1] / "pipeline" / "catalog" / "hardware"


def _config(over: dict[str, object]) -> dict[str, object]:
    return {"summary": {"health": {"overload": over}}}


def test_an_overload_still_queued_at_the_last_arrival_is_priced_over_the_makespan() -> None:
    # a transient episode (started less than 10 % of the span before the last arrival) that
    # still had 344 waiting at it and drained 221 s later: the GPUs were needed past the
    # arrivals, so the period is the makespan and unit costs are not valid, as when sustained
    queued = {"detected": True, "sustained": False, "backlog_requests": 344, "until_s": 1220.0}
    drained = {"detected": True, "sustained": False, "backlog_requests": 0, "until_s": 500.0}
    assert run_overload_sustained(_config(queued)) is True
    assert run_overload_sustained(_config(drained)) is False
    assert run_overload_sustained(_config({"detected": True})) is True  # a summary from before episodes
    assert run_overload_sustained({}) is True


def test_a_cost_note_never_says_serving_took_less_than_the_arrivals() -> None:
    # the day's last arrivals were rejected: the admitted requests were still queued at their own
    # last arrival, and their makespan (18.7 min) is shorter than the arrival span (24.6 min)
    p = Period(24.6 * 60, PERIOD_ARRIVALS, 24.6 * 60, 18.7 * 60, 18.0 * 60, True)
    note = p.unit_costs_note
    assert note is not None and "took" not in note
    assert "still queued at their last arrival" in note and "last ones were rejected" in note
    longer = Period(30 * 60, "makespan", 24.6 * 60, 30 * 60, 29 * 60, True).unit_costs_note
    assert longer is not None and "of arrivals took 30" in longer


def test_a_closed_loop_is_never_overloaded() -> None:
    # 30 clients on a fleet that serves fewer at once: requests wait, but arrivals follow service
    n = 200
    arrival = np.linspace(0.0, 100.0, n)
    scheduled = arrival + np.linspace(0.0, 60.0, n)  # the queue grows all the way
    res = EngineResult.empty(n)
    res.arrival_s[:] = arrival
    res.scheduled_s[:] = scheduled
    res.first_token_s[:] = scheduled + 0.1
    res.finish_s[:] = scheduled + 1.0
    res.reject_reason[:] = 0
    work = Workload(arrival, np.full(n, 100, np.int64), np.full(n, 10, np.int64))
    cols = MemoryColumns(res, work)
    assert health(cols, None)["overload"]["detected"]  # open loop: overloaded
    closed = health(cols, None, closed=True)
    assert not closed["overload"]["detected"] and closed["healthy"]


def test_overload_times_are_on_the_logs_clock_under_rate_scale() -> None:
    t0 = 1_700_000_000_000_000  # 2023-11-14T22:13:20Z
    assert _utc(t0, 0.0, 900.0) == "2023-11-14T22:28:20Z"
    # --rate-scale 2 replays the log twice as fast: 450 replayed seconds are 900 logged ones
    assert _utc(t0, 0.0, 450.0, 2.0) == "2023-11-14T22:28:20Z"
    assert _utc(t0, 0.0, 1800.0, 0.5) == "2023-11-14T22:28:20Z"


def test_a_huge_gpus_per_node_is_refused_not_searched() -> None:
    with (HARDWARE / "h100-sxm.toml").open("rb") as fh:
        data = tomllib.load(fh)
    data["link"]["gpus_per_node"] = 10**9
    with pytest.raises(ConfigError) as err:
        parse_hardware(data, "hw.toml")
    want = f"hw.toml [link]: gpus_per_node must be at most {MAX_GPUS_PER_NODE:,} (one node), got 1,000,000,000"
    assert str(err.value) == want


def test_the_nightly_line_says_multi_node_and_model_mix() -> None:
    wide = (
        "MULTI-NODE: each replica spans 2 nodes (tp 8 × pp 1 × dp 2 = 16 h100-sxm GPUs, 8 per node), but its "
        "cross-node communication is priced as within one nvlink4 node: latencies are optimistic"
    )
    mix = "MODEL MIX: 10 of 20 requests (50%) were logged for other models (x: 10) and are replayed as y; a fleet"
    res = NightlyResult("2025-01-15", "r", Path("r.html"), Path("i.html"), {"warnings": [wide, mix]})
    line = res.line()
    assert (
        "; MULTI-NODE: each replica spans 2 nodes (tp 8 × pp 1 × dp 2 = 16 h100-sxm GPUs, 8 per node), "
        "priced as one node (latencies optimistic); "
    ) in line
    assert "; MODEL MIX: 10 of 20 requests (50%) were logged for other models (x: 10) and are replayed as y; " in line
