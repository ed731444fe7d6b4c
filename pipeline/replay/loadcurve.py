"""Headroom: the load curve of one day's traffic on one fleet.

The same requests are replayed at several traffic multipliers (``rate_scale``: the arrival rate
times m, the same requests closer together in time) and each point records p50/p99 TTFT and TPOT
of the finished requests, rejections, overload and — when the run has an SLO — pass/fail over all
requests and goodput. The *knee* is the largest multiplier up to which every point meets the SLO
(without an SLO: has no overload). :func:`headroom_sentence` says it in one line:
"meets the SLO chat up to 2x today's traffic (fails at 3x: ttft_p99 4.1x its limit)".

Replays run in parallel processes within a wall-time budget: points still queued when it runs
out are recorded as ``skipped``, never silently dropped. Written by the nightly job to
``STORE/runs/<run_id>/load_curve.parquet`` (schema ``load_curve``), queried by the named query
``load_curve`` and drawn in the report.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.classify.prefix import PrefixIdentity
from pipeline.common.defaults import DEFAULT_HEADROOM_BUDGET_S
from pipeline.common.units import format_seconds
from pipeline.replay.fleet import FleetConfig, resolve
from pipeline.replay.pools import PooledFleet
from pipeline.replay.run import ReplayOptions, ReplayRun, replay_pools, run_replay
from pipeline.replay.slo import detect_overload, parse_slo, percentile, request_latencies, slo_verdict

#: Multipliers of today's traffic tried by default: half of it up to four times it.
DEFAULT_MULTIPLIERS: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
#: Wall-time budget of the whole curve (seconds): see pipeline/common/defaults.py.
DEFAULT_BUDGET_S = DEFAULT_HEADROOM_BUDGET_S
#: When every default point is healthy, the multiplier keeps doubling up to this (while the
#: budget lasts) so that the knee is found rather than reported as "at least 4x".
MAX_MULTIPLIER = 64.0
#: The longest single wait for a parallel point (seconds): a budget larger than this (or inf) is
#: waited out in steps of it, since a wait's timeout must fit the platform's time_t.
MAX_WAIT_S = 3600.0


def _runs(
    requests: pl.DataFrame, cfg: FleetConfig | PooledFleet, options: ReplayOptions, identity: PrefixIdentity | None
) -> list[ReplayRun]:
    """The replays of one point: the fleet's, or each pool's of its share of the requests (a
    fleet of pools: pipeline.replay.pools; pools share nothing, so each is replayed on its own; a
    prefill pool's run holds its requests' whole lives, decode pool included)."""
    if not isinstance(cfg, PooledFleet):
        return [run_replay(requests, resolve(cfg, cfg.name), options, identity=identity)]
    return replay_pools(requests, cfg, options, identity)


def curve_point(
    requests: pl.DataFrame,
    cfg: FleetConfig | PooledFleet,
    multiplier: float,
    slo: str | None,
    identity: PrefixIdentity | None = None,
) -> dict[str, Any]:
    """One point: replay ``requests`` on ``cfg`` (a fleet, or a fleet of pools) at ``multiplier``
    times their arrival rate."""
    options = ReplayOptions(rate_scale=multiplier)
    if identity is not None:
        options = replace(options, isolation=identity.isolation)
    runs = _runs(requests, cfg, options, identity)
    oks, lats = [], []
    overloaded = False
    for run in runs:  # each pool on its own clock: overload is judged pool by pool
        res = run.result
        ok_p = res.reject_reason == 0
        oks.append(ok_p)
        lats.append(request_latencies(res, run.work))
        overloaded |= detect_overload(res.arrival_s, res.scheduled_s, res.finish_s, ok_p).detected
    ok = np.concatenate(oks)
    lat = {k: np.concatenate([x[k] for x in lats]) for k in lats[0]}
    row: dict[str, Any] = {
        "multiplier": float(multiplier),
        "status": "ok",
        "requests": int(ok.shape[0]),
        "finished": int(ok.sum()),
        "rejected": int((~ok).sum()),
        "ttft_p50_s": _p(lat["ttft"][ok], 50),
        "ttft_p99_s": _p(lat["ttft"][ok], 99),
        "tpot_p50_s": _p(lat["tpot"][ok], 50),
        "tpot_p99_s": _p(lat["tpot"][ok], 99),
        "slo": None,
        "slo_passed": None,
        "slo_worst_ratio": None,
        "goodput": None,
        "overloaded": overloaded,
        "wall_s": sum(run.wall_s for run in runs),
    }
    if slo:
        spec = parse_slo(slo)
        v = slo_verdict(lat, ~ok, spec)
        row.update(
            slo=spec.name,
            slo_passed=v.passed,
            slo_worst_ratio=max(t.value_s / t.limit_s for t in v.targets),
            goodput=v.goodput,
        )
    return row


def _p(values: np.ndarray[Any, Any], pct: float) -> float | None:
    v = values[np.isfinite(values)]
    return percentile(v, pct) if v.size else None


def _skipped(multiplier: float, n: int, slo: str | None) -> dict[str, Any]:
    return {
        "multiplier": float(multiplier),
        "status": "skipped",
        "requests": n,
        "finished": None,
        "rejected": None,
        "ttft_p50_s": None,
        "ttft_p99_s": None,
        "tpot_p50_s": None,
        "tpot_p99_s": None,
        "slo": slo,
        "slo_passed": None,
        "slo_worst_ratio": None,
        "goodput": None,
        "overloaded": None,
        "wall_s": None,
    }


def load_curve(
    requests: pl.DataFrame,
    cfg: FleetConfig | PooledFleet,
    slo: str | None,
    multipliers: Sequence[float] = DEFAULT_MULTIPLIERS,
    budget_s: float = DEFAULT_BUDGET_S,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
    identity: PrefixIdentity | None = None,
) -> list[dict[str, Any]]:
    """Every point of the curve, in multiplier order (skipped ones marked); ``identity`` is the
    day's prefix identity, as the day's replay used it."""
    ms = sorted({float(m) for m in multipliers})
    if not ms or any(not (math.isfinite(m) and m > 0) for m in ms):
        raise ValueError(f"multipliers must be positive numbers, got {list(multipliers)}")
    if math.isnan(budget_s) or budget_s < 0:
        raise ValueError(f"the time budget must be a number of seconds >= 0 (inf: no limit), got {budget_s}")
    say = progress or (lambda _m: None)
    n = requests.height
    rows: dict[float, dict[str, Any]] = {}
    t0 = time.perf_counter()
    if jobs <= 1:
        for m in ms:
            if time.perf_counter() - t0 > budget_s:
                rows[m] = _skipped(m, n, slo)
                continue
            rows[m] = curve_point(requests, cfg, m, slo, identity)
            say(f"load curve {m:g}x: {_point_line(rows[m])}")
    else:
        # spawn, not fork: polars' and numba's thread pools make fork unsafe (see plan.run_local)
        ctx = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(ms)), mp_context=ctx)
        try:
            pending: dict[Future[dict[str, Any]], float] = {
                pool.submit(curve_point, requests, cfg, m, slo, identity): m for m in ms
            }
            out_of_time = False
            while pending:
                # never an infinite or huge timeout (the lock under wait() takes a time_t): out of
                # time, wait for what has started with no timeout; else at most MAX_WAIT_S at a time
                left = budget_s - (time.perf_counter() - t0)
                timeout = None if out_of_time else min(max(left, 0.0), MAX_WAIT_S)
                done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
                if not done and left <= 0:  # out of time: drop what has not started, wait for what has
                    for fut, m in list(pending.items()):
                        if fut.cancel():
                            rows[m] = _skipped(m, n, slo)
                            del pending[fut]
                    out_of_time = True
                    continue
                for fut in done:
                    m = pending.pop(fut)
                    rows[m] = fut.result()
                    say(f"load curve {m:g}x: {_point_line(rows[m])}")
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    # beyond the default points: double until a point fails, the cap or the budget
    m = ms[-1]
    while knee([rows[x] for x in sorted(rows)]) == m and m * 2 <= MAX_MULTIPLIER:
        if time.perf_counter() - t0 > budget_s:
            break
        m *= 2
        rows[m] = curve_point(requests, cfg, m, slo, identity)
        say(f"load curve {m:g}x: {_point_line(rows[m])}")
    # narrow the knee: up to two midpoints (in half steps) between it and the first failure
    for _ in range(2):
        ordered = [rows[x] for x in sorted(rows)]
        k = knee(ordered)
        bad = next((r["multiplier"] for r in ordered if k is not None and r["multiplier"] > k), None)
        if k is None or bad is None or time.perf_counter() - t0 > budget_s:
            break
        mid = round(math.sqrt(k * bad) * 2) / 2
        if mid <= k or mid >= bad or mid in rows:
            break
        rows[mid] = curve_point(requests, cfg, mid, slo, identity)
        say(f"load curve {mid:g}x: {_point_line(rows[mid])}")
    return [rows[x] for x in sorted(rows)]


def _point_line(r: dict[str, Any]) -> str:
    verdict = "" if r["slo_passed"] is None else (" SLO pass" if r["slo_passed"] else " SLO FAIL")
    return (
        f"p99 TTFT {format_seconds(r['ttft_p99_s'])}, p99 TPOT {format_seconds(r['tpot_p99_s'])}, "
        f"rejected {r['rejected']:,}{' OVERLOADED' if r['overloaded'] else ''}{verdict}"
    )


def knee(rows: Sequence[dict[str, Any]]) -> float | None:
    """The largest multiplier up to which every computed point is healthy (meets the SLO when
    there is one, else: no overload and no rejections); None when the smallest already fails."""
    best = None
    for r in rows:
        if r["status"] != "ok":
            continue
        healthy = r["slo_passed"] if r["slo_passed"] is not None else not (r["overloaded"] or r["rejected"])
        if not healthy:
            break
        best = r["multiplier"]
    return best


def headroom_sentence(rows: Sequence[dict[str, Any]]) -> str:
    """One line for people: how far today's traffic can grow, or by how much today fails."""
    done = [r for r in rows if r["status"] == "ok"]
    if not done:
        return "load curve: no point computed within the time budget"
    slo = next((r["slo"] for r in done if r["slo"]), None)
    meets = f"meets the SLO {slo}" if slo else "serves its traffic without overload or rejections"
    k = knee(done)
    today = next((r for r in done if r["multiplier"] == 1.0), None)
    first_bad = next(
        (
            r
            for r in done
            if (r["slo_passed"] is False) or (r["slo_passed"] is None and (r["overloaded"] or r["rejected"]))
        ),
        None,
    )

    def why(r: dict[str, Any]) -> str:
        if r["slo_passed"] is False and r["slo_worst_ratio"] is not None:
            ratio = r["slo_worst_ratio"]
            if math.isfinite(ratio):
                return f"worst target at {ratio:.2g}x its limit"
        if r["overloaded"]:
            return "overloaded"
        return f"{r['rejected']:,} request{'s' if r['rejected'] != 1 else ''} rejected"

    if today is not None and first_bad is not None and first_bad["multiplier"] <= 1.0:
        fails = f"fails the SLO {slo}" if slo else "fails"
        already = " already" if first_bad["multiplier"] < 1.0 else ""
        return f"{fails} at today's traffic: {why(first_bad)}{already} at {first_bad['multiplier']:g}x"
    skipped = [r["multiplier"] for r in rows if r["status"] != "ok"]
    if first_bad is None:
        top = done[-1]["multiplier"]
        tail = f"; not computed: {', '.join(f'{m:g}x' for m in skipped)}" if skipped else ""
        return f"{meets} up to at least {top:g}x today's traffic (the largest multiplier tried{tail})"
    assert k is not None
    return f"{meets} up to {k:g}x today's traffic (fails at {first_bad['multiplier']:g}x: {why(first_bad)})"


def curve_table(run_id: str, rows: Sequence[dict[str, Any]]) -> pa.Table:
    """The stored curve (the engine's wall time is left out, so that a re-run writes the same bytes)."""
    return pa.Table.from_pylist([{"run_id": run_id, **{k: v for k, v in r.items() if k != "wall_s"}} for r in rows])
