"""The period a replay run is priced over (``cost``, ``replay``'s energy, the report): the traffic's
own span, or the makespan of a fleet that fell behind (:class:`Period`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from pipeline.common.schemas import read_parquet
from pipeline.replay.runfolder import run_overload_sustained, run_overloaded
from pipeline.replay.slo import day_projection, traffic_span


def traffic_period_s(arrival_s: Any) -> float:
    """The period of record of some traffic: first to last arrival (at least one second). Every
    $ figure is stated for it; a per-day figure is a named projection (:func:`pipeline.replay.slo.day_projection`)."""
    a = np.asarray(arrival_s, dtype=np.float64)
    a = a[np.isfinite(a)]
    return max(float(a.max() - a.min()), 1.0) if a.size else 1.0


#: How a run's $ period was chosen (:func:`run_period`).
PERIOD_ARRIVALS = "arrivals"
PERIOD_MAKESPAN = "makespan"


def _duration(seconds: float) -> str:
    """'3.65 min', '46.6 h': :func:`pipeline.replay.slo.traffic_span` without its 'of traffic'."""
    return traffic_span(seconds).removesuffix(" of traffic")


@dataclass(frozen=True)
class Period:
    """The period a replay run is priced over, and why.

    Normally the traffic's own span, first to last arrival (``arrivals``). A fleet that does not
    keep up serves the traffic for longer than it arrives: when the run is overloaded, or one
    engine (rank) was busy for longer than the arrival span, the GPUs were needed from the first
    arrival to the last finish (``makespan``), and that is what is priced: clipping busy time to
    the arrival span would price less GPU time than serving the traffic took. Such a run's
    $ per token and self-host / API ratios are not valid unit costs (:attr:`unit_costs_note`)."""

    seconds: float
    basis: str
    arrival_span_s: float
    makespan_s: float
    busiest_rank_busy_s: float
    overloaded: bool
    #: The overload lasted to the last arrival (pipeline.replay.slo.Overload.sustained). A backlog that
    #: drained before it (a peak the fleet could not keep up with, then caught up) leaves the
    #: period the arrival span and the unit costs valid: the run's OVERLOADED warning says the rest.
    sustained: bool = True

    @property
    def unit_costs_valid(self) -> bool:
        return not (self.overloaded and self.sustained) and self.basis == PERIOD_ARRIVALS

    @property
    def text(self) -> str:
        """What the $ figures cover, for people: '58.4 min of traffic' or '7.23 min makespan
        (first arrival to last finish) for 3.65 min of arrivals'."""
        if self.basis == PERIOD_MAKESPAN:
            return (
                f"{_duration(self.seconds)} makespan (first arrival to last finish) for "
                f"{_duration(self.arrival_span_s)} of arrivals"
            )
        return traffic_span(self.seconds)

    @property
    def day_projection(self) -> str:
        """:func:`pipeline.replay.slo.day_projection` of the period; none from a run that did not keep up."""
        if self.basis == PERIOD_MAKESPAN:
            return f"{self.text}; not projected to a day: the fleet did not keep up with the traffic"
        return day_projection(self.seconds)

    @property
    def unit_costs_note(self) -> str | None:
        """Why the run's $ per token and self-host / API ratios are not valid unit costs (None
        when they are)."""
        if self.unit_costs_valid:
            return None
        what = "OVERLOADED run" if self.overloaded and self.sustained else "the fleet did not keep up"
        priced = " (the GPU time priced)" if self.basis == PERIOD_MAKESPAN else ""
        if self.makespan_s > self.arrival_span_s:
            took = (
                f"serving {_duration(self.arrival_span_s)} of arrivals took {_duration(self.makespan_s)}{priced}, "
                "with requests queued for it"
            )
        else:  # the last arrivals were rejected: the admitted ones still queued past their own last
            took = (
                f"its admitted requests were still queued at their last arrival ({_duration(self.makespan_s)} "
                f"from the first arrival to the last finish, within {_duration(self.arrival_span_s)} of arrivals "
                "whose last ones were rejected)"
            )
        return (
            f"{what}: $ per token and self-host/API ratios are not valid unit costs: {took}; "
            "size the fleet until the run keeps up"
        )

    @property
    def unit_costs_flag(self) -> str | None:
        """The short mark put beside each $ per token and self-host / API ratio that is not valid."""
        if self.unit_costs_valid:
            return None
        return "OVERLOADED: not valid" if self.overloaded and self.sustained else "fleet fell behind: not valid"

    def to_dict(self) -> dict[str, Any]:
        return {
            "period_s": self.seconds,
            "period_basis": self.basis,
            "period_text": self.text,
            "arrival_span_s": self.arrival_span_s,
            "makespan_s": self.makespan_s,
            "busiest_rank_busy_s": self.busiest_rank_busy_s,
            "overloaded": self.overloaded,
            "unit_costs_valid": self.unit_costs_valid,
            "unit_costs_note": self.unit_costs_note,
            "unit_costs_flag": self.unit_costs_flag,
        }


def run_period(
    arrival_s: Any,
    finish_s: Any,
    span_rank: Any,
    span_start_s: Any,
    span_end_s: Any,
    overloaded: bool,
    sustained: bool = True,
) -> Period:
    """The period a replay run is priced over (:class:`Period`): the arrival span
    (:func:`traffic_period_s`), or the makespan (first arrival to the last finish or engine step)
    when the run is ``overloaded`` up to its last arrival (``sustained``; an overload that drained
    before it does not lengthen the period) or its busiest rank (``span_rank``: the steps'
    ``replica``) was busy for longer than the arrival span."""
    arrival = np.asarray(arrival_s, dtype=np.float64)
    arrival = arrival[np.isfinite(arrival)]
    span = traffic_period_s(arrival)
    ends = [np.asarray(finish_s, dtype=np.float64), np.asarray(span_end_s, dtype=np.float64)]
    ends = [e[np.isfinite(e)] for e in ends]
    last = max((float(e.max()) for e in ends if e.size), default=math.nan)
    makespan = last - float(arrival.min()) if arrival.size and math.isfinite(last) else 0.0
    rank = np.asarray(span_rank, dtype=np.int64)
    dur = np.asarray(span_end_s, dtype=np.float64) - np.asarray(span_start_s, dtype=np.float64)
    busiest = 0.0
    if rank.size:
        _, inverse = np.unique(rank, return_inverse=True)
        busiest = float(np.bincount(inverse, weights=np.nan_to_num(dur)).max())
    behind = (overloaded and sustained) or busiest > span
    basis = PERIOD_MAKESPAN if behind and makespan > span else PERIOD_ARRIVALS
    return Period(
        seconds=makespan if basis == PERIOD_MAKESPAN else span,
        basis=basis,
        arrival_span_s=span,
        makespan_s=max(makespan, 0.0),
        busiest_rank_busy_s=busiest,
        overloaded=overloaded,
        sustained=sustained,
    )


def stored_run_period(run_dir: Path, config: Mapping[str, Any]) -> Period:
    """:func:`run_period` of a stored replay run (its requests and steps tables)."""
    req = read_parquet(run_dir / "requests.parquet", "replay_requests", ["arrival_s", "finish_s", "status"])
    steps = read_parquet(run_dir / "steps.parquet", "replay_steps", ["replica", "start_s", "end_s"])
    ok = pc.equal(req.column("status"), "finished").to_numpy(zero_copy_only=False).astype(bool)
    finish = req.column("finish_s").to_numpy(zero_copy_only=False).astype(np.float64)
    return run_period(
        req.column("arrival_s").to_numpy(zero_copy_only=False),
        finish[ok],
        steps.column("replica").to_numpy(zero_copy_only=False),
        steps.column("start_s").to_numpy(zero_copy_only=False),
        steps.column("end_s").to_numpy(zero_copy_only=False),
        run_overloaded(config),
        run_overload_sustained(config),
    )
