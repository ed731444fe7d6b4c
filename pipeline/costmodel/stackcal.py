"""A serving stack's calibration, learnt from a fleet's own logs (``calibrate --observed``).

The cost model prices a step from operator tables (a GPU's measured profile, the size-aware
prior or the roofline; docs/validation.md). What the tables do not know is the stack a fleet
really runs: its kernels' versions, launch gaps, the host's share of a step, its collectives.
A stack calibration is four bounded numbers applied on top of whichever tier prices the fleet,
each to one part of every step (pipeline/costmodel/stepcost.py, the table columns):

================== ============================================================ ==========
parameter          what it multiplies or adds                                   bounds
================== ============================================================ ==========
``linear_scale``   the operators the tokens drive through the linear layers      0.25–4
                   (GEMMs, fused MoE, norms, activations, embedding) and the
                   sampled positions' (LM head, sampler): the token and logits
                   tables' compute, memory and kernel-floor seconds
``attention_scale`` attention: the measured grids' times (or the roofline's      0.25–4
                   attention operators)
``comm_scale``     the tensor-parallel collectives (and expert-parallel           0.25–4
                   dispatch / combine)
``step_overhead_s`` seconds added to every step with tokens, on the GPU's side    0–0.02 s
                   (launch gaps, synchronisation the tables do not hold)
``async_scheduling`` the step timeline: 1 leaves the fleet's own (vLLM's default   0 or 1
                   for its release, or FLEET.toml's), 0 turns asynchronous
                   scheduling off (docs/engine.md, "The step timeline")
``frontend_request_s`` the API server's seconds per request (tokenize, HTTP)     0–0.2 s
``frontend_token_s`` the API server's seconds per output token per concurrent   0–0.002 s
                   stream (docs/engine.md, "The front end")
================== ============================================================ ==========

The last three are the serving stack's timeline, not its step cost: ``apply`` hands them to the
engines on the step cost (``describe["timeline"]``, only those that change something), and both
engines replay with them in place of the fleet's own (pipeline.engine.model.timeline_spec). A
calibration file written before they existed leaves them out: no change.

Scales are relative to the tier and GPU they were fitted on, so a calibration names both and a
fleet on another GPU or tier is refused (:func:`check_applies`). They do not depend on the model:
a calibration learnt on one model's day applies to another model on the same GPUs and stack.

A calibration file (``CAL.toml``) holds the numbers under ``[calibration]`` with ``source`` (logs,
dates, fleet), and what ``calibrate --observed`` measured under ``[fit]`` and ``[errors]``; a
FLEET.toml includes it with a top-level ``calibration_file = "CAL.toml"`` (relative to the fleet
file). The run records the numbers themselves, so it replays the same without the file.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.costmodel.stepcost import TabulatedCost

#: name -> (lower bound, upper bound, default: no change)
PARAMETERS: dict[str, tuple[float, float, float]] = {
    "linear_scale": (0.25, 4.0, 1.0),
    "attention_scale": (0.25, 4.0, 1.0),
    "comm_scale": (0.25, 4.0, 1.0),
    "step_overhead_s": (0.0, 0.02, 0.0),
    "async_scheduling": (0.0, 1.0, 1.0),
    "frontend_request_s": (0.0, 0.2, 0.0),
    "frontend_token_s": (0.0, 0.002, 0.0),
}
#: The step cost's ``describe`` key under which ``apply`` hands the timeline's terms to the engines
#: (pipeline.engine.model.timeline_spec reads it, under its own copy of this name).
TIMELINE_KEY = "timeline"
#: Parameters that take only their bounds (0 or 1): a fit tries each rather than searching between.
DISCRETE: frozenset[str] = frozenset({"async_scheduling"})
#: The step timeline's parameters (handed to the engines with the cost, not priced into its tables).
TIMELINE: tuple[str, ...] = ("async_scheduling", "frontend_request_s", "frontend_token_s")
#: Keys of a calibration's ``[calibration]`` table that are text.
TEXT_KEYS = ("source", "hardware", "cost_tier")


@dataclass(frozen=True)
class StackCalibration:
    """The numbers of a calibration file's ``[calibration]`` table (see the module doc)."""

    source: str
    hardware: str
    cost_tier: str
    linear_scale: float = 1.0
    attention_scale: float = 1.0
    comm_scale: float = 1.0
    step_overhead_s: float = 0.0
    async_scheduling: float = 1.0
    frontend_request_s: float = 0.0
    frontend_token_s: float = 0.0
    #: Where it was read from, for errors (the fleet file and its ``calibration_file`` key); not
    #: part of the calibration (a run records the numbers, not the path).
    origin: str = field(default="", compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["origin"]
        return out

    def values(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in PARAMETERS}

    def text(self) -> str:
        parts = [f"{k} {getattr(self, k):.4g}" for k in PARAMETERS if getattr(self, k) != PARAMETERS[k][2]]
        return ", ".join(parts) or "no change"


def parse_calibration(table: Any, where: str, origin: str = "") -> StackCalibration:
    """A ``[calibration]`` table of a calibration file (or a run's recorded copy); errors name
    ``where`` and the key."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table, got {type(table).__name__}")
    from pipeline.common.tomlschema import (  # lazy: pydantic, loaded only when a file is read
        StackCalibrationTable,
        check,
    )

    check(table, StackCalibrationTable, where)  # keys and types; the bounds below
    out: dict[str, Any] = {}
    for key in TEXT_KEYS:
        value = table.get(key)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: {key} is required (text), got {value!r}")
        if len(value) > 4096:
            raise ConfigError(f"{where}: {key} is longer than 4,096 characters")
        out[key] = value
    for key, (lo, hi, default) in PARAMETERS.items():
        # (every scale is required by the schema: a hand-edited file that lost one must not
        # replay as if it were 1; the timeline's terms came later, and a file without them
        # changes no timeline)
        value = float(table.get(key, default) if key in TIMELINE else table[key])
        if key in DISCRETE and value not in (lo, hi):
            raise ConfigError(f"{where}: {key} must be {lo:g} or {hi:g}, got {value!r}")
        if not (math.isfinite(value) and lo <= value <= hi):
            raise ConfigError(f"{where}: {key} must be in [{lo:g}, {hi:g}], got {value!r}")
        out[key] = value
    return StackCalibration(**out, origin=origin or where)


def load_calibration_file(path: Path, where: str) -> StackCalibration:
    """The ``[calibration]`` table of the calibration file at ``path`` (``where``: who names it,
    for errors: the fleet file and its ``calibration_file`` key)."""
    try:
        data = read_toml(path, "calibration file")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if "calibration" not in data:
        raise ConfigError(f"{where}: {path} has no [calibration] table (write one with rooftrace calibrate --observed)")
    return parse_calibration(data["calibration"], f"{where}: {path} [calibration]", origin=where)


def check_applies(cal: StackCalibration, hardware: str, tier: str | None, where: str = "") -> None:
    """Refuse a calibration fitted on another GPU or cost tier (``tier`` None: not known yet): its
    scales are relative to that GPU's tables. Errors name where the calibration was read from."""
    where = cal.origin or where
    if cal.hardware != hardware:
        raise ConfigError(
            f"{where}: the calibration was fitted on {cal.hardware!r}, this fleet runs {hardware!r}: its scales are "
            "relative to that GPU's tables; calibrate this GPU's fleet from its own logs"
        )
    if tier is not None and cal.cost_tier != tier:
        raise ConfigError(
            f"{where}: the calibration was fitted on the {cal.cost_tier!r} cost tier, this fleet is priced by "
            f"{tier!r}: set cost_model so both use the same tier, or calibrate again"
        )


def apply(cost: TabulatedCost, cal: StackCalibration | dict[str, float]) -> TabulatedCost:
    """``cost`` with a calibration's scales and overhead applied to its tables (see the module
    doc). The engines read the same arrays, so every engine prices the calibrated steps alike.
    The ``measured_s`` column scales with ``linear_scale`` (the share of seconds that came from
    measured tables keeps its meaning within a few per cent). Steps the tables cannot describe
    (sliding-window sums, which the engines never produce) are refused rather than priced
    uncalibrated."""
    v = (
        cal.values()
        if isinstance(cal, StackCalibration)
        else {k: float(cal.get(k, PARAMETERS[k][2])) for k in PARAMETERS}
    )
    if all(v[k] == PARAMETERS[k][2] for k in PARAMETERS):
        return cost
    timeline = {k: v[k] for k in TIMELINE if v[k] != PARAMETERS[k][2]}
    if "async_scheduling" in timeline:
        timeline["async_scheduling"] = bool(timeline["async_scheduling"] >= 0.5)
    if all(v[k] == PARAMETERS[k][2] for k in PARAMETERS if k not in TIMELINE):
        # the timeline only: the same tables, the terms handed to the engines with them
        describe_t = {**cost.describe, TIMELINE_KEY: timeline}
        ext = cost.extend
        return replace(cost, describe=describe_t, extend=None if ext is None else (lambda t: apply(ext(t), v)))
    lin, att, comm, over = v["linear_scale"], v["attention_scale"], v["comm_scale"], v["step_overhead_s"]

    def tables(t: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        out = np.array(t, dtype=np.float64, copy=True)
        out[:, [0, 1, 3, 6]] *= lin  # compute, memory, floor, measured seconds
        out[:, 2] *= comm
        return np.ascontiguousarray(out)

    sc = np.array(cost.scalars, dtype=np.float64, copy=True)
    sc[2] *= att  # attention from the measured grids
    sc[3] += over
    peak = np.ascontiguousarray(np.asarray(cost.affine_peak, dtype=np.float64) / att)
    bw = np.ascontiguousarray(np.asarray(cost.affine_bw, dtype=np.float64) / att)
    base_extend = cost.extend
    describe = {**cost.describe, "stack_calibration": {k: round(x, 6) for k, x in v.items() if k not in TIMELINE}}
    if timeline:
        describe[TIMELINE_KEY] = timeline
    return replace(
        cost,
        tok=tables(cost.tok),
        logit=tables(cost.logit),
        affine_peak=peak,
        affine_bw=bw,
        scalars=sc,
        describe=describe,
        extend=None if base_extend is None else (lambda t: apply(base_extend(t), v)),
        exact=_no_windows,
    )


def _no_windows(batch: Any) -> Any:
    raise ConfigError("a step with sliding-window sums cannot be priced under a stack calibration")
