"""``calibrate --observed``: learn a serving stack's calibration from a day of its own logs.

A self-hosted fleet's logs carry the latencies it delivered (pipeline/calibrate/observed.py). This module
replays the day's requests on the fleet that served them and fits the stack calibration's few
bounded numbers (pipeline/costmodel/stackcal.py: linear, attention and collective scales, a per-step
overhead) so that the replay reproduces the observed TTFT, TPOT and E2E:

- **the whole day, every time**: each candidate calibration is judged on one replay of the
  *whole* day, so the training requests share their steps with every request that shared them in
  production, the later arrivals included. (Replaying the training part alone left its last
  requests in batches emptier than the fleet's, faster than they were served: the fit raised the
  scales to make up, and overshot the rest of the day.)
- **split by time**: the requests arriving up to the ``train_share`` quantile of the day's
  arrivals train — the loss is taken over them only — and the rest is judged, from the same
  whole-day replay at the fitted numbers;
- **loss**: per training request, the log of replayed / observed TTFT, TPOT and E2E under a robust
  (soft L1) loss, so a few requests the replay cannot explain (a client that stalled, a
  network hiccup) do not pull the fit; plus the squared log ratios of each metric's mean, p50,
  p90 and p99 over the training requests, so the fit holds the distribution; minimised by
  Nelder-Mead within the bounds (``scipy.optimize.minimize``);
- **parameters**: every entry of :data:`pipeline.costmodel.stackcal.PARAMETERS` (a new term is a
  new entry there): those whose neutral value is 1 are scales, fitted in log space with a weak
  pull towards 1 (:data:`PRIOR_WEIGHT`) so that a direction the day cannot see stays where the
  tables put it; the others are additive, fitted in units of a twentieth of their range (the
  step overhead: milliseconds); a parameter named in :data:`FITTED_WHEN` only where its test
  holds (the collective scale: tp, ep or dp > 1);
- **refusal**: when the held-out error (the largest |replayed mean / observed mean − 1| of TTFT,
  TPOT and E2E) is still above :data:`REFUSE_ABOVE` after fitting, no file is written: the fleet
  file does not describe the fleet that wrote the logs (replicas, model, router or engine
  settings differ) and a calibration would only hide that.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.calibrate.observed import METRICS, observed_latencies, percentile_pair
from pipeline.classify.accounting import day_identity
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.costmodel.stackcal import DISCRETE, PARAMETERS, StackCalibration, apply
from pipeline.costmodel.stepcost import TabulatedCost
from pipeline.engine.model import add_frontend, concurrent_streams
from pipeline.ingest.store import epoch_us
from pipeline.replay.fleet import load_fleet, resolve
from pipeline.replay.run import REPLAY_COLUMNS, REPORTED, ReplayOptions, build_workload, run_workload
from pipeline.replay.slo import percentile, request_latencies

#: Default share of the day's arrivals (by time) that trains; the rest is judged.
TRAIN_SHARE = 0.6
#: Fewer requests with observed latencies than this in either part: refused.
MIN_OBSERVED = 50
#: Held-out error above which no calibration is written.
REFUSE_ABOVE = 0.25
#: Scale of the robust loss, in log units (about 10 % per request).
ROBUST_SCALE = 0.1
#: At most this many requests of the training part give per-request residuals (every k-th).
MAX_RESIDUAL_REQUESTS = 20_000
#: Replays the optimiser may run.
MAX_EVALUATIONS = 300
#: Seconds between progress lines while fitting.
PROGRESS_EVERY_S = 10.0
#: The penalty residual of a request the replay never finished (rejected or still queued).
UNFINISHED_RESIDUAL = math.log(10.0)


@dataclass(frozen=True)
class ObservedFit:
    """What ``calibrate --observed`` fitted and measured."""

    calibration: StackCalibration
    fitted: tuple[str, ...]
    fixed: tuple[str, ...]
    n_train: int
    n_held_out: int
    cut_s: float
    cut_utc: str
    #: errors per metric (ttft, tpot, e2e) and statistic (mean, p50, p90, p99): replayed /
    #: observed − 1 on the training requests (in sample) and on the later ones (held out), both
    #: from one replay of the whole day at the fitted numbers; and held out, uncalibrated
    in_sample: dict[str, dict[str, float]]
    held_out: dict[str, dict[str, float]]
    held_out_uncalibrated: dict[str, dict[str, float]]
    evaluations: int
    seconds: float
    unfinished_held_out: int = 0
    notes: list[str] = field(default_factory=list)
    #: seconds spent in the replays themselves, and the requests each whole-day replay holds
    replay_seconds: float = 0.0
    replayed_requests: int = 0

    @property
    def held_out_error(self) -> float:
        return max_mean_error(self.held_out)

    @property
    def in_sample_error(self) -> float:
        return max_mean_error(self.in_sample)

    def refusal(self) -> str | None:
        """Why no calibration should be written, or None."""
        err = self.held_out_error
        if err <= REFUSE_ABOVE:
            return None
        judged = [m for m in METRICS if m in self.held_out and math.isfinite(self.held_out[m]["mean"])]
        if not judged:
            return (
                "the fleet cannot explain the logs: after fitting, the replay finished none of the held-out requests "
                f"with observed latencies ({self.unfinished_held_out:,} rejected or unfinished); likely causes: the "
                "fleet's max_model_len or KV cache is smaller than the fleet that served the day, or the fleet file "
                "is not that fleet (model, replicas, tp / dp / ep); no calibration written"
            )
        worst = max(judged, key=lambda m: abs(self.held_out[m]["mean"]))
        return (
            f"the fleet cannot explain the logs: after fitting, the held-out {worst.upper()} mean is still "
            f"{self.held_out[worst]['mean']:+.0%} off (more than {REFUSE_ABOVE:.0%}); likely causes: the fleet file "
            "is not the fleet that served the day (replicas, model or weight format, tp / dp / ep), its router, or "
            "its engine settings (max_num_seqs, max_num_batched_tokens, chunked prefill, prefix caching) differ, or "
            "the logs' latencies are measured elsewhere (a gateway adding queueing); no calibration written"
        )


def max_mean_error(errors: dict[str, dict[str, float]]) -> float:
    vals = [abs(e["mean"]) for e in errors.values() if math.isfinite(e.get("mean", math.nan))]
    return max(vals) if vals else math.inf


def latency_errors(
    pred: dict[str, npt.NDArray[np.float64]], obs: dict[str, npt.NDArray[np.float64]], rows: npt.NDArray[np.bool_]
) -> dict[str, dict[str, float]]:
    """Per metric, replayed / observed − 1 of the mean and of the p50, p90, p99 (the project's
    percentile, pipeline.replay.slo.percentile) over ``rows`` where both are known and the replay
    finished the request."""
    out: dict[str, dict[str, float]] = {}
    for m in METRICS:
        ok = rows & np.isfinite(obs[m]) & np.isfinite(pred[m])
        if not ok.any():
            continue
        p, o = pred[m][ok], obs[m][ok]
        row: dict[str, float] = {"n": int(ok.sum())}
        row["mean"] = float(p.mean() / o.mean() - 1.0) if o.mean() > 0 else math.nan
        for q in (50, 90, 99):
            err = percentile_pair(o, p, q)[2]
            row[f"p{q}"] = math.nan if err is None else float(err)
        out[m] = row
    return out


#: Weight of the squared log ratios of the means and percentiles against the per-request loss.
AGGREGATE_WEIGHT = 0.01
#: Weight of the pull of each log scale towards 0 (scale 1) in the loss.
PRIOR_WEIGHT = 1e-3
#: First step of the simplex on a scale (log space): 15 %; on an additive parameter: one unit
#: (a twentieth of its range: 1 ms of step overhead).
SCALE_STEP = math.log(1.15)
#: Parameters fitted only where the fleet's configuration lets the day see them; the others of
#: :data:`PARAMETERS` are fitted always.
FITTED_WHEN: dict[str, Callable[[Any], bool]] = {
    "comm_scale": lambda fleet: fleet.config.tp > 1 or fleet.config.ep > 1 or fleet.config.dp > 1,  # collectives exist
    # 1 leaves the fleet's own timeline, 0 turns asynchronous scheduling off: the same when it is off
    "async_scheduling": lambda fleet: bool(fleet.scheduler.async_scheduling),
}


def _is_scale(name: str) -> bool:
    """A multiplicative parameter (neutral at 1, positive bounds): fitted in log space."""
    lo, _hi, neutral = PARAMETERS[name]
    return neutral == 1.0 and lo > 0


def _unit(name: str) -> float:
    """An additive parameter's unit in the optimiser's space: a twentieth of its range."""
    lo, hi, _neutral = PARAMETERS[name]
    return (hi - lo) / 20.0


def _soft_l1(r: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The robust loss of residuals ``r`` (log units): quadratic below :data:`ROBUST_SCALE`,
    linear above (scipy's ``soft_l1``)."""
    z = (r / ROBUST_SCALE) ** 2
    return 2.0 * (np.sqrt(1.0 + z) - 1.0) * ROBUST_SCALE**2


def _loss(
    pred: dict[str, npt.NDArray[np.float64]],
    obs: dict[str, npt.NDArray[np.float64]],
    idx: npt.NDArray[np.intp],
    rows: npt.NDArray[np.bool_],
) -> float:
    """The fit's loss: the robust per-request loss of log(replayed / observed) of TTFT, TPOT and
    E2E on the rows ``idx`` (a request the replay never finished counts as 10× off), plus the
    squared log ratios of each metric's mean, p50, p90 and p99 over the requests of ``rows`` (the
    training part) that both know."""
    total, count = 0.0, 0
    agg = 0.0
    for m in METRICS:
        o, p = obs[m][idx], pred[m][idx]
        has = np.isfinite(o) & (o > 0)
        ok = has & np.isfinite(p) & (p > 0)
        r = np.full(int(has.sum()), UNFINISHED_RESIDUAL)
        r[ok[has]] = np.log(p[ok] / o[ok])
        total += float(_soft_l1(r).sum())
        count += r.size
        both = rows & np.isfinite(obs[m]) & (obs[m] > 0) & np.isfinite(pred[m]) & (pred[m] > 0)
        if both.sum() >= 10:
            po, pp = obs[m][both], pred[m][both]
            agg += math.log(pp.mean() / po.mean()) ** 2
            for q in (50, 90, 99):
                agg += math.log(percentile(pp, q) / percentile(po, q)) ** 2
    return (total / max(count, 1)) + AGGREGATE_WEIGHT * agg


def _params_for(fleet: Any) -> tuple[list[str], list[str]]:
    """The parameters fitted on this fleet's day, and those left at their neutral values."""
    fitted = [k for k in PARAMETERS if FITTED_WHEN.get(k, lambda f: True)(fleet)]
    return fitted, [k for k in PARAMETERS if k not in fitted]


def _to_x(name: str, value: float) -> float:
    return math.log(value) if _is_scale(name) else value / _unit(name)


def _from_x(name: str, x: float) -> float:
    return math.exp(x) if _is_scale(name) else x * _unit(name)


def _bounds(names: list[str]) -> tuple[list[float], list[float]]:
    return [_to_x(n, PARAMETERS[n][0]) for n in names], [_to_x(n, PARAMETERS[n][1]) for n in names]


#: The front end's terms: not searched by the simplex but solved for each candidate from its replay
#: (:func:`solve_frontend`; docs/calibration.md, "The timeline").
PROJECTED: tuple[str, ...] = ("frontend_request_s", "frontend_token_s")
#: Residuals beyond this many median absolute deviations leave the front end's second solve.
TRIM_MADS = 4.0


def solve_frontend(
    res: Any, observed_ttft: npt.NDArray[np.float64], rows: npt.NDArray[np.bool_]
) -> tuple[float, float]:
    """The front end's R (seconds per request) and c (seconds per output token per concurrent
    stream) that best explain, over ``rows``, what the observed TTFT adds to the engine's
    replayed one: observed − replayed ≈ R + c·N, N the streams open at the first token
    (pipeline.engine.model.concurrent_streams). Least squares relative to the observed TTFT,
    within the terms' bounds (scipy's ``lsq_linear``), solved twice: the second time without
    the requests more than :data:`TRIM_MADS` median absolute deviations off (a request the
    replay cannot explain must not move the front end). (0, 0) when fewer than 10 requests tell."""
    from scipy.optimize import lsq_linear

    eng = res.first_token_s - res.arrival_s
    n = concurrent_streams(res).astype(np.float64)
    ok = rows & np.isfinite(observed_ttft) & (observed_ttft > 0) & np.isfinite(eng) & (n > 0)
    if int(ok.sum()) < 10:
        return 0.0, 0.0
    w = 1.0 / observed_ttft[ok]
    a = np.column_stack([w, n[ok] * w])
    b = (observed_ttft[ok] - eng[ok]) * w
    lo = [PARAMETERS[k][0] for k in PROJECTED]
    hi = [PARAMETERS[k][1] for k in PROJECTED]
    x = lsq_linear(a, b, bounds=(lo, hi)).x
    r = b - a @ x
    mad = float(np.median(np.abs(r - np.median(r))))
    keep = np.abs(r - np.median(r)) <= TRIM_MADS * max(mad, 1e-12)
    if 10 <= int(keep.sum()) < r.size:
        x = lsq_linear(a[keep], b[keep], bounds=(lo, hi)).x
    return float(x[0]), float(x[1])


class _Replayer:
    """One workload replayed under candidate calibrations of one base cost."""

    def __init__(self, work: Any, fleet: Any, options: Any, base: TabulatedCost) -> None:
        self.work, self.fleet, self.options, self.base = work, fleet, options, base
        self.calls = 0
        self.seconds = 0.0
        #: The front end solved by the latest call with ``project`` (:data:`PROJECTED`' values).
        self.solved: dict[str, float] = {}

    def __call__(
        self, values: dict[str, float], project: tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]] | None = None
    ) -> dict[str, npt.NDArray[np.float64]]:
        """The replayed latencies under ``values``; with ``project`` (observed TTFT, training
        rows) the front end's terms in ``values`` are replaced by those :func:`solve_frontend`
        finds on this replay (kept in :attr:`solved`)."""
        self.calls += 1
        t0 = time.perf_counter()
        if project is not None:
            values = values | {k: PARAMETERS[k][2] for k in PROJECTED}
        run = run_workload(self.work, self.fleet, self.options, cost=apply(self.base, values))
        res = run.result
        if project is not None:
            R, c = solve_frontend(res, project[0], project[1])
            self.solved = dict(zip(PROJECTED, (R, c), strict=True))
            add_frontend(res, self.work.output_tokens, R, c)
        lat = request_latencies(res, self.work)
        done = res.reject_reason == 0
        self.seconds += time.perf_counter() - t0
        return {m: np.where(done & np.isfinite(lat[m]), lat[m], np.nan) for m in METRICS} | {
            "done": done.astype(np.float64)
        }


def fit_requests(
    requests: pl.DataFrame,
    fleet: Any,
    identity: Any = None,
    train_share: float = TRAIN_SHARE,
    source: str = "",
    progress: Callable[[str], None] | None = None,
    *,
    train_alone: bool = False,
) -> ObservedFit:
    """Fit a stack calibration on ``requests`` (canonical requests sorted by arrival, with the
    observed ``ttft_s`` / ``e2e_s``) replayed on the resolved ``fleet`` (see the module doc).

    ``train_alone``: the former method, kept only to show what it got wrong (tests,
    benchmarks/calibrate_observed.py): each candidate replays the training part alone, without
    the later arrivals that shared its batches, and the in-sample errors come from that replay."""
    from scipy.optimize import minimize

    check_train_share(train_share)
    t_start = time.perf_counter()
    if fleet.config.stack_calibration is not None:
        # calibrate from the tables, not on top of an earlier calibration
        fleet = replace(fleet, config=replace(fleet.config, stack_calibration=None))
    obs_all = observed_latencies(requests)
    arrival_us = epoch_us(requests.get_column("arrival"))
    t_rel = (arrival_us - arrival_us.min()) / 1e6
    for m in METRICS:  # a latency of 0 s is no measurement (no request is served in no time)
        obs_all[m] = np.where(obs_all[m] > 0, obs_all[m], np.nan)
    known = np.isfinite(obs_all["ttft"]) | np.isfinite(obs_all["e2e"])
    if int(known.sum()) < 2 * MIN_OBSERVED:
        raise RooftraceError(
            f"only {int(known.sum()):,} of {requests.height:,} requests carry observed latencies above 0 s "
            "(ttft_s or e2e_s); "
            f"calibrate --observed needs at least {2 * MIN_OBSERVED} (docs/ingest.md says which log fields carry them)"
        )
    # the cut: the arrival time below which train_share of the requests with observed latencies fall
    cut = float(np.quantile(t_rel[known], train_share))
    train = t_rel <= cut
    n_train, n_held = int((train & known).sum()), int((~train & known).sum())
    if min(n_train, n_held) < MIN_OBSERVED:
        raise RooftraceError(
            f"the split at {train_share:.0%} of the day leaves {n_train:,} training and {n_held:,} held-out requests "
            f"with observed latencies; each part needs at least {MIN_OBSERVED}"
        )
    options = ReplayOptions()
    base = fleet.cost_model.table
    if progress:
        progress(
            f"building the workload: the day's {requests.height:,} requests, replayed whole for every candidate; "
            f"the {int(train.sum()):,} before the split ({n_train:,} of them with observed latencies) train"
        )
    work_day = build_workload(requests, fleet, options, identity)
    day = _Replayer(work_day, fleet, options, base)
    if train_alone:
        fit_replay = _Replayer(build_workload(requests.filter(pl.Series(train)), fleet, options, identity), fleet,
                               options, base)  # fmt: skip
        obs_fit = {m: v[train] for m, v in obs_all.items()}
        rows_fit = np.ones(int(train.sum()), dtype=bool)
    else:
        fit_replay, obs_fit, rows_fit = day, obs_all, train
    fitted_all, fixed = _params_for(fleet)
    # Discrete parameters (asynchronous scheduling: on or off) are not searched by the simplex:
    # it fits the others at the discrete ones' neutral values, then tries each other value at the
    # best point, and fits again from there when that lowers the loss.
    discrete = [k for k in fitted_all if k in DISCRETE]
    projected = [k for k in fitted_all if k in PROJECTED]
    fitted = [k for k in fitted_all if k not in DISCRETE and k not in projected]
    chosen = {k: PARAMETERS[k][2] for k in discrete}
    # per-request residuals on at most MAX_RESIDUAL_REQUESTS training requests (every k-th)
    idx = np.flatnonzero(rows_fit & (np.isfinite(obs_fit["ttft"]) | np.isfinite(obs_fit["e2e"])))
    if idx.size > MAX_RESIDUAL_REQUESTS:
        idx = idx[:: math.ceil(idx.size / MAX_RESIDUAL_REQUESTS)]

    def values_of(x: npt.NDArray[np.float64]) -> dict[str, float]:
        v = {k: PARAMETERS[k][2] for k in PARAMETERS}
        v.update(chosen)
        v.update({name: _from_x(name, float(xi)) for name, xi in zip(fitted, x, strict=True)})
        return v

    best: list[Any] = [math.inf, None, time.perf_counter(), None]  # loss, values, last progress, x

    project = (obs_fit["ttft"], rows_fit) if projected else None

    def objective(x: npt.NDArray[np.float64]) -> float:
        pred = fit_replay(values_of(x), project)
        loss = _loss(pred, obs_fit, idx, rows_fit) + PRIOR_WEIGHT * sum(
            float(xi) ** 2 for name, xi in zip(fitted, x, strict=True) if _is_scale(name)
        )
        if loss < best[0]:
            best[0], best[1], best[3] = loss, values_of(x) | fit_replay.solved, np.array(x, dtype=np.float64)
        if progress and time.perf_counter() - best[2] >= PROGRESS_EVERY_S:
            best[2] = time.perf_counter()
            shown = ", ".join(f"{k} {best[1][k]:.4g}" for k in fitted + projected)
            progress(f"  {fit_replay.calls} replays (at most {MAX_EVALUATIONS}); best so far: {shown}")
        return loss

    x0 = np.array([_to_x(n, PARAMETERS[n][2]) for n in fitted])
    lo, hi = _bounds(fitted)
    if progress:
        what = "the training part alone" if train_alone else f"the whole day ({work_day.n:,} requests)"
        progress(
            f"fitting {', '.join(fitted_all)} on the {n_train:,} requests before {_fmt_rel(cut)} "
            f"(each step: one replay of {what})"
        )
    # Nelder-Mead, not a gradient method: a replay is piecewise smooth (a request that makes a
    # step or misses it moves by a step's time), so finite differences over small steps see the
    # jumps; a simplex of 15 % / one-unit steps does not. (Restarting it from its best point
    # was tried: on the 3,000-request test day it moved the parameters by about 1 % for twice
    # the replays.)
    steps = [SCALE_STEP if _is_scale(n) else 1.0 for n in fitted]

    def simplex_at(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        verts = [x]
        for i, step in enumerate(steps):
            v = x.copy()
            v[i] = x[i] + step if x[i] + step <= hi[i] else x[i] - step
            verts.append(v)
        return np.vstack(verts)

    def search(start: npt.NDArray[np.float64]) -> Any:
        return minimize(
            objective,
            start,
            method="Nelder-Mead",
            bounds=list(zip(lo, hi, strict=True)),
            options={"initial_simplex": simplex_at(start), "xatol": 2e-3, "fatol": 1e-6, "maxfev": MAX_EVALUATIONS},
        )

    sol = search(x0)
    for name in discrete:
        lo_d, hi_d, _ = PARAMETERS[name]
        kept_loss, kept_x, kept_values = best[0], best[3], dict(chosen)
        chosen[name] = lo_d if chosen[name] == hi_d else hi_d
        if objective(kept_x) < kept_loss:  # the other value is better at the best point: fit again there
            if progress:
                progress(f"  {name} {chosen[name]:g} fits better; fitting the others again")
            sol = search(kept_x)
        else:  # (best is still the kept point: the flipped one did not lower the loss)
            chosen.update(kept_values)
    values = dict(best[1])
    numbers: dict[str, Any] = {k: round(values[k], 6 if _is_scale(k) else 7) for k in PARAMETERS}
    fitted = fitted_all
    cal = StackCalibration(
        source=source or "observed latencies", hardware=fleet.deployment.hardware.name, cost_tier=base.source, **numbers
    )
    fit_calls = fit_replay.calls
    if progress:
        shown = ", ".join(f"{k} {getattr(cal, k):.4g}" for k in fitted)
        progress(f"fitted {shown} after {fit_calls} replays; judging the rest of the day")
    # one replay of the whole day at the fitted numbers: the training requests' errors (in
    # sample) and the later ones' (held out) both come from it
    pred_day = day(cal.values())
    if train_alone:
        in_sample = latency_errors(fit_replay(cal.values()), obs_fit, rows_fit)
    else:
        in_sample = latency_errors(pred_day, obs_all, train)
    pred_raw = day({k: PARAMETERS[k][2] for k in PARAMETERS})
    held = ~train
    held_out = latency_errors(pred_day, obs_all, held)
    uncal = latency_errors(pred_raw, obs_all, held)
    unfinished = int((held & known & (pred_day["done"] == 0)).sum())
    notes = []
    if unfinished:
        notes.append(f"{unfinished:,} held-out requests were rejected or not finished by the calibrated replay")
    if not sol.success:
        notes.append(f"the optimiser stopped before converging ({fit_calls} replays): {sol.message}")
    cut_utc = datetime.fromtimestamp(arrival_us.min() / 1e6 + cut, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return ObservedFit(
        calibration=cal,
        fitted=tuple(fitted),
        fixed=tuple(fixed),
        n_train=n_train,
        n_held_out=n_held,
        cut_s=cut,
        cut_utc=cut_utc,
        in_sample=in_sample,
        held_out=held_out,
        held_out_uncalibrated=uncal,
        evaluations=fit_replay.calls + (day.calls if train_alone else 0),
        seconds=time.perf_counter() - t_start,
        unfinished_held_out=unfinished,
        notes=notes,
        replay_seconds=day.seconds + (fit_replay.seconds if train_alone else 0.0),
        replayed_requests=work_day.n,
    )


def check_train_share(train_share: float) -> None:
    if not (0.1 <= train_share <= 0.9 and math.isfinite(train_share)):
        raise ConfigError(
            f"--train-share must be in 0.1..0.9 (the share of the day's arrivals that trains), got {train_share}"
        )


def _fmt_rel(seconds: float) -> str:
    h, rem = divmod(int(seconds), 3600)
    return f"+{h:d}:{rem // 60:02d}:{rem % 60:02d} into the day"


def fit_store(
    store: Any,
    fleet_path: Path,
    date: str | None = None,
    train_share: float = TRAIN_SHARE,
    progress: Callable[[str], None] | None = None,
) -> ObservedFit:
    """:func:`fit_requests` on one date of the store, on the fleet in ``fleet_path``."""

    check_train_share(train_share)  # before the day is read
    cfg = load_fleet(fleet_path)
    fleet = resolve(cfg, str(fleet_path))
    store.check_unlocked()
    date = store.resolve_date(date)
    cols = [*REPLAY_COLUMNS, REPORTED, "ttft_s", "e2e_s"]
    if cfg.affinity_key() == "session_affinity":
        cols.append("session_id")
    requests = store.read_requests(date, cols)
    identity = None
    if fleet.scheduler.enable_prefix_caching or cfg.affinity_key() == "prefix_affinity":
        identity = day_identity(store, date, requests, progress)
    source = (
        f"observed latencies of {date} ({requests.height:,} requests, store {store.root}) replayed on fleet "
        f"{cfg.name!r} ({fleet_path})"
    )
    return fit_requests(requests, fleet, identity, train_share, source, progress)


def toml_text(v: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    import json

    return json.dumps(v, ensure_ascii=False)


def toml_number(v: float) -> str:
    return repr(float(v)) if math.isfinite(v) else "nan"


def calibration_table(cal: StackCalibration, learnt_from: str) -> list[str]:
    """The first lines of a calibration file: what it was learnt from, how a FLEET.toml includes
    it, and its ``[calibration]`` table (pipeline/costmodel/stackcal.py reads it)."""
    return [
        f"# A serving stack's calibration, learnt from {learnt_from}.",
        '# Include it from a FLEET.toml on the same GPU and cost tier: calibration_file = "<this file>".',
        "",
        "[calibration]",
        f"source = {toml_text(cal.source)}",
        f"hardware = {toml_text(cal.hardware)}",
        f"cost_tier = {toml_text(cal.cost_tier)}",
        *(f"{k} = {toml_number(getattr(cal, k))}" for k in PARAMETERS),
    ]


def calibration_toml(fit: ObservedFit, extra: dict[str, Any] | None = None) -> str:
    """The calibration file's text (pipeline/costmodel/stackcal.py reads its ``[calibration]`` table)."""
    s, num = toml_text, toml_number
    lines = calibration_table(fit.calibration, "a fleet's own logs by `rooftrace calibrate --observed`")
    lines += [
        "",
        "[fit]",
        f"fitted = [{', '.join(s(k) for k in fit.fitted)}]",
        f"fixed = [{', '.join(s(k) for k in fit.fixed)}]",
        f"train_requests = {fit.n_train}",
        f"held_out_requests = {fit.n_held_out}",
        f"split = {s(f'arrivals up to {fit.cut_utc} train; the rest of the day is judged')}",
        f"replays = {fit.evaluations}",
        f"held_out_error = {num(fit.held_out_error)}",
        f"in_sample_error = {num(fit.in_sample_error)}",
    ]
    for key, value in (extra or {}).items():
        lines.append(f"{key} = {s(str(value))}")
    for name, table in (
        ("in_sample", fit.in_sample),
        ("held_out", fit.held_out),
        ("held_out_uncalibrated", fit.held_out_uncalibrated),
    ):
        for m, row in table.items():
            lines += ["", f"[errors.{name}.{m}]"] + [f"{k} = {num(v)}" for k, v in row.items()]
    return "\n".join(lines) + "\n"
