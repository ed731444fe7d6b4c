"""``calibrate --observed --steps``: the stack calibration fitted on step telemetry.

Where ``calibrate --observed`` replays a day of requests and fits the stack calibration to the
latencies the logs observed (pipeline/calibrate/observed_fit.py), this fits the same numbers
(:data:`pipeline.costmodel.stackcal.PARAMETERS`: linear, attention and collective scales, a
per-step overhead) on what the engine itself measured per iteration
(pipeline/ingest/steptelemetry.py): each step's wall time against the fleet's cost model's price
of the step's token mix. No replay is needed: the step's shape is known, so a candidate is judged
by pricing every step once (a vectorised call of the tabulated step cost).

- **the step**: a record's prefill tokens T over n prefill requests that read K KV tokens, and D
  KV tokens over d decodes, priced as one step (:func:`step_batch`). The records give sums, not
  each request's chunk, so the prefill attention's query-key pairs are those of n equal chunks,
  ``T·K/n + T·(T/n + 1)/2`` (exact for one prefill request a step, the common case);
- **split by shape**: the steps sorted by batch size (requests in the step), then by tokens
  scheduled, then by their order in the files: the first ``train_share`` of them train and the
  larger ones are judged (``hold_out="shape"``, the default: does a calibration learnt on small
  batches price the large ones?); or the first ``train_share`` of the rows in file order train
  (``hold_out="file"``);
- **loss**: the robust (soft L1, scale 0.1) loss of log(priced / measured) per training step,
  the weak pull of each log scale towards 1 of observed_fit, minimised by Nelder-Mead within the
  bounds from the same first simplex, then restarted once from its best point (a restart costs
  milliseconds here, not replays);
- **errors**: per step, priced / measured − 1 on the held-out steps (mean |e|, p50, p90 of |e|,
  and the mean e, the bias), on the training steps and, uncalibrated, on the held-out ones;
- **refusal**: when the held-out mean |e| is still above :data:`REFUSE_ABOVE` after fitting, no
  calibration is written (the fleet file's model, GPU or parallelism is not what ran the steps,
  or the telemetry's time is not a step's).

The calibration file is observed_fit's (the same ``[calibration]`` table a FLEET.toml includes
with ``calibration_file``), with ``[fit]`` saying it was fitted on steps and ``[errors.*.step]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.calibrate.observed_fit import (
    PRIOR_WEIGHT,
    SCALE_STEP,
    _bounds,
    _from_x,
    _is_scale,
    _params_for,
    _soft_l1,
    _to_x,
    calibration_table,
    toml_number,
    toml_text,
)
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.costmodel.stackcal import PARAMETERS, TIMELINE, StackCalibration, apply
from pipeline.costmodel.stepcost import TabulatedCost
from pipeline.costmodel.steps import StepBatch
from pipeline.ingest.steptelemetry import StepTelemetry
from pipeline.replay.slo import percentile

#: Default share of the steps that trains.
TRAIN_SHARE = 0.6
#: Fewer steps than this in either part: refused.
MIN_STEPS = 20
#: Held-out mean |priced / measured − 1| above which no calibration is written.
REFUSE_ABOVE = 0.25
#: Evaluations of the loss the optimiser may run (each prices every training step once).
MAX_EVALUATIONS = 4000
#: The ways to hold steps out.
HOLD_OUTS = ("shape", "file")
#: A parameter whose part of the training steps' time is below this share is reported as seen
#: poorly by the data.
POORLY_SEEN = 0.02


@dataclass(frozen=True)
class StepFit:
    """What ``calibrate --observed --steps`` fitted and measured."""

    calibration: StackCalibration
    fitted: tuple[str, ...]
    fixed: tuple[str, ...]
    hold_out: str
    split: str
    n_train: int
    n_held_out: int
    #: per part: ``mean_abs``, ``p50_abs``, ``p90_abs``, ``bias`` (mean e) and ``n``, e = priced /
    #: measured − 1 per step
    in_sample: dict[str, float]
    held_out: dict[str, float]
    held_out_uncalibrated: dict[str, float]
    #: per fitted parameter: the share of the training steps' priced time that it moves (its
    #: elasticity), and how many training steps it moves by 10 % or more
    seen: dict[str, tuple[float, int]]
    evaluations: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def held_out_error(self) -> float:
        return float(self.held_out["mean_abs"])

    def refusal(self) -> str | None:
        err = self.held_out_error
        if math.isfinite(err) and err <= REFUSE_ABOVE:
            return None
        return (
            f"the fleet cannot explain the step telemetry: after fitting, the held-out steps are priced "
            f"{err:.0%} off on average (more than {REFUSE_ABOVE:.0%}); likely causes: the fleet file is not the "
            "fleet that ran the steps (model, weight format, GPU, tp / ep), the engine ran speculative decoding or "
            "another model per step, or the telemetry's time is not one step's (TensorRT-LLM's iterLatencyMS "
            "under the overlap scheduler spans two); no calibration written"
        )


def step_batch(steps: pl.DataFrame) -> StepBatch:
    """The steps of a step table (pipeline/ingest/steptelemetry.py STEP_COLUMNS) as the cost
    model's StepBatch (see the module doc for the prefill attention's pairs)."""

    def col(name: str) -> npt.NDArray[np.float64]:
        return steps.get_column(name).cast(pl.Float64).to_numpy().astype(np.float64)

    t, k, n = col("prefill_tokens"), col("cached_tokens"), col("prefill_seqs")
    n_safe = np.where(n > 0, n, 1.0)
    pairs = np.where(n > 0, t * k / n_safe + t * (t / n_safe + 1.0) / 2.0, 0.0)
    return StepBatch(
        prefill_tokens=t,
        prefill_seqs=n,
        prefill_attn_pairs=pairs,
        prefill_kv_tokens=np.where(n > 0, k + t, 0.0),
        decode_seqs=col("decode_seqs"),
        decode_ctx_tokens=col("decode_ctx_tokens"),
    )


def _take(batch: StepBatch, rows: npt.NDArray[np.bool_]) -> StepBatch:
    return StepBatch(
        batch.prefill_tokens[rows],
        batch.prefill_seqs[rows],
        batch.prefill_attn_pairs[rows],
        batch.prefill_kv_tokens[rows],
        batch.decode_seqs[rows],
        batch.decode_ctx_tokens[rows],
    )


def split_steps(steps: pl.DataFrame, hold_out: str, train_share: float) -> tuple[npt.NDArray[np.bool_], str]:
    """Which steps train (True) and the split in words (see the module doc)."""
    check_split(hold_out, train_share)
    n = steps.height
    n_train = round(n * train_share)
    train = np.zeros(n, dtype=bool)
    if hold_out == "file":
        train[:n_train] = True
        return train, f"the first {n_train:,} steps in file order train; the later {n - n_train:,} are judged"
    tokens = (steps.get_column("prefill_tokens") + steps.get_column("decode_seqs")).to_numpy()
    batch = steps.get_column("batch_size").to_numpy()
    order = np.lexsort((np.arange(n), tokens, batch))
    train[order[:n_train]] = True
    cut_b = int(batch[order[n_train - 1]]) if n_train else 0
    return train, (
        f"the {n_train:,} smallest steps (by requests in the step, then tokens; up to a batch of {cut_b:,}) "
        f"train; the {n - n_train:,} larger ones are judged"
    )


def check_split(hold_out: str, train_share: float) -> None:
    if hold_out not in HOLD_OUTS:
        raise ConfigError(f"--hold-out must be one of {', '.join(HOLD_OUTS)}, got {hold_out!r}")
    if not (math.isfinite(train_share) and 0.1 <= train_share <= 0.9):
        raise ConfigError(f"--train-share must be in 0.1..0.9 (the share of the steps that trains), got {train_share}")


def step_errors(priced: npt.NDArray[np.float64], measured: npt.NDArray[np.float64]) -> dict[str, float]:
    """priced / measured − 1 per step: mean |e|, its p50 and p90 (the project's percentile), the
    mean e (bias) and n."""
    e = priced / measured - 1.0
    a = np.abs(e)
    if e.size == 0:
        return {"n": 0, "mean_abs": math.nan, "p50_abs": math.nan, "p90_abs": math.nan, "bias": math.nan}
    return {
        "n": int(e.size),
        "mean_abs": float(a.mean()),
        "p50_abs": percentile(a, 50),
        "p90_abs": percentile(a, 90),
        "bias": float(e.mean()),
    }


def _priced(base: TabulatedCost, values: dict[str, float], batch: StepBatch) -> npt.NDArray[np.float64]:
    return np.asarray(apply(base, values)(batch).time_s, dtype=np.float64)


def fit_steps(
    telemetry: StepTelemetry,
    fleet: Any,
    hold_out: str = "shape",
    train_share: float = TRAIN_SHARE,
    source: str = "",
    progress: Callable[[str], None] | None = None,
) -> StepFit:
    """Fit a stack calibration on the steps of ``telemetry`` priced by the resolved ``fleet``'s
    cost model (see the module doc)."""
    from scipy.optimize import minimize

    check_split(hold_out, train_share)
    t_start = time.perf_counter()
    if fleet.config.stack_calibration is not None:  # from the tables, not on top of an earlier calibration
        fleet = replace(fleet, config=replace(fleet.config, stack_calibration=None))
    steps = telemetry.steps
    if steps.height < 2 * MIN_STEPS:
        raise RooftraceError(
            f"only {steps.height:,} of the {telemetry.rows_in:,} telemetry records are usable steps "
            f"({len(telemetry.quarantined):,} quarantined); the fit needs at least {2 * MIN_STEPS}"
        )
    train, split = split_steps(steps, hold_out, train_share)
    n_train, n_held = int(train.sum()), int((~train).sum())
    if min(n_train, n_held) < MIN_STEPS:
        raise RooftraceError(
            f"the split leaves {n_train:,} training and {n_held:,} held-out steps; each part needs {MIN_STEPS}"
        )
    base = fleet.cost_model.table
    batch = step_batch(steps)
    wall = steps.get_column("wall_s").to_numpy().astype(np.float64)
    b_train, w_train = _take(batch, train), wall[train]
    fitted, fixed = _params_for(fleet)
    # the step timeline (asynchronous scheduling, the API front end) moves no step's wall time:
    # the per-request fit (calibrate --observed without --steps) is what sees it
    fitted = [k for k in fitted if k not in TIMELINE]
    fixed = [k for k in PARAMETERS if k not in fitted]
    if progress:
        progress(f"fitting {', '.join(fitted)} on {n_train:,} steps ({split})")
    neutral = {k: PARAMETERS[k][2] for k in PARAMETERS}
    calls = [0]

    def values_of(x: npt.NDArray[np.float64]) -> dict[str, float]:
        v = dict(neutral)
        v.update({name: _from_x(name, float(xi)) for name, xi in zip(fitted, x, strict=True)})
        return v

    log_w = np.log(w_train)

    def objective(x: npt.NDArray[np.float64]) -> float:
        calls[0] += 1
        p = _priced(base, values_of(x), b_train)
        r = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)) - log_w, math.log(10.0))
        prior = sum(float(xi) ** 2 for name, xi in zip(fitted, x, strict=True) if _is_scale(name))
        return float(_soft_l1(r).mean()) + PRIOR_WEIGHT * prior

    lo, hi = _bounds(fitted)
    steps_x = [SCALE_STEP if _is_scale(n) else 1.0 for n in fitted]

    def simplex_at(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        verts = [x]
        for i, step in enumerate(steps_x):
            v = x.copy()
            v[i] = x[i] + step if x[i] + step <= hi[i] else x[i] - step
            verts.append(v)
        return np.vstack(verts)

    x = np.array([_to_x(n, PARAMETERS[n][2]) for n in fitted])
    sol: Any = None
    for _ in range(2):  # the second run restarts from the first one's best point
        sol = minimize(
            objective,
            x,
            method="Nelder-Mead",
            bounds=list(zip(lo, hi, strict=True)),
            options={"initial_simplex": simplex_at(x), "xatol": 1e-4, "fatol": 1e-9,
                     "maxfev": MAX_EVALUATIONS // 2},
        )  # fmt: skip
        x = np.asarray(sol.x, dtype=np.float64)
    values = values_of(x)
    numbers: dict[str, Any] = {k: round(values[k], 6 if _is_scale(k) else 7) for k in PARAMETERS}
    cal = StackCalibration(
        source=source or "step telemetry", hardware=fleet.deployment.hardware.name, cost_tier=base.source, **numbers
    )
    at_fit = _priced(base, cal.values(), batch)
    raw = _priced(base, neutral, batch)
    seen = _seen(base, cal.values(), b_train, fitted, at_fit[train])
    notes = []
    for name in fitted:
        share, _n = seen[name]
        if share < POORLY_SEEN:
            notes.append(
                f"{name} moves {share:.1%} of the training steps' time: the telemetry barely sees it, it stays "
                "near where the tables put it"
            )
    if not sol.success:
        notes.append(f"the optimiser stopped before converging ({calls[0]} evaluations): {sol.message}")
    return StepFit(
        calibration=cal,
        fitted=tuple(fitted),
        fixed=tuple(fixed),
        hold_out=hold_out,
        split=split,
        n_train=n_train,
        n_held_out=n_held,
        in_sample=step_errors(at_fit[train], wall[train]),
        held_out=step_errors(at_fit[~train], wall[~train]),
        held_out_uncalibrated=step_errors(raw[~train], wall[~train]),
        seen=seen,
        evaluations=calls[0],
        seconds=time.perf_counter() - t_start,
        notes=notes,
    )


def _seen(
    base: TabulatedCost,
    values: dict[str, float],
    batch: StepBatch,
    fitted: list[str],
    priced: npt.NDArray[np.float64],
) -> dict[str, tuple[float, int]]:
    """Per fitted parameter: the share of the steps' priced time it moves (d log t / d log θ for a
    scale, d t / d θ · θ-range/20 over t for an additive one, summed over the steps and divided by
    their time), and how many steps it moves by 10 % or more."""
    out: dict[str, tuple[float, int]] = {}
    total = float(priced.sum())
    for name in fitted:
        v = dict(values)
        if _is_scale(name):
            v[name] = values[name] * 1.01
            hi = PARAMETERS[name][1]
            if v[name] > hi:
                v[name] = values[name] / 1.01
            moved = np.abs(_priced(base, v, batch) - priced) / 0.01
        else:
            unit = (PARAMETERS[name][1] - PARAMETERS[name][0]) / 20.0
            v[name] = values[name] + unit
            moved = np.abs(_priced(base, v, batch) - priced) * max(values[name], unit) / unit
        share = float(moved.sum()) / total if total > 0 else 0.0
        out[name] = (share, int(np.count_nonzero(moved >= 0.1 * priced)))
    return out


def step_calibration_toml(fit: StepFit, telemetry: StepTelemetry) -> str:
    """The calibration file: observed_fit's ``[calibration]`` table (what a FLEET.toml includes),
    ``[fit]`` (steps, split, what was fitted and how much of the steps each parameter moves) and
    ``[errors.<part>.step]``."""

    s, num = toml_text, toml_number
    lines = calibration_table(
        fit.calibration, "the engine's step telemetry by `rooftrace calibrate --observed --steps`"
    )
    lines += [
        "",
        "[fit]",
        'fitted_on = "step telemetry"',
        f"formats = [{', '.join(s(f) for f in sorted(telemetry.formats))}]",
        f"fitted = [{', '.join(s(k) for k in fit.fitted)}]",
        f"fixed = [{', '.join(s(k) for k in fit.fixed)}]",
        f"records = {telemetry.rows_in}",
        f"steps_used = {telemetry.used}",
        f"quarantined = {len(telemetry.quarantined)}",
        f"hold_out = {s(fit.hold_out)}",
        f"split = {s(fit.split)}",
        f"train_steps = {fit.n_train}",
        f"held_out_steps = {fit.n_held_out}",
        f"evaluations = {fit.evaluations}",
        f"held_out_error = {num(fit.held_out_error)}",
    ]
    for name, (share, n) in fit.seen.items():
        lines.append(f"seen_{name} = {{ time_share = {num(share)}, steps_moved_10pct = {n} }}")
    for name, row in (
        ("in_sample", fit.in_sample),
        ("held_out", fit.held_out),
        ("held_out_uncalibrated", fit.held_out_uncalibrated),
    ):
        lines += ["", f"[errors.{name}.step]"] + [f"{k} = {int(v) if k == 'n' else num(v)}" for k, v in row.items()]
    return "\n".join(lines) + "\n"
