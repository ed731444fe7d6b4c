"""Capacity planning: the cheapest fleet that meets the latency SLOs on real traffic.

``plan(store, options)`` takes one date of canonical requests for a model, picks the window to size
for (the busiest ``window_s`` seconds by token volume, after a warm-up, or the whole day), and for
every hardware × TP × weight precision that fits the model finds the **minimum replica count** whose
replay of that window meets every SLO target. Latency falls as replicas are added (more capacity,
same traffic), so the count is searched, not swept: from an analytic lower bound (fresh prefill
and decode demand of the window over one replica's roofline capacity), galloping up (+1, +2, +4, ...)
until the SLO is met, then by bisection, so the answer ``n`` always comes with a replay at ``n − 1`` that
misses. Configurations run in parallel processes (``executor="local"``) or on a Ray cluster
(``executor="ray"``, optional extra).

Outputs, under ``STORE/plans/<plan_id>/`` (the id digests the inputs; a re-run rewrites the same
bytes): ``plan.parquet`` (schema ``plan``: one row per configuration, ranked by $/day, with the
Pareto front of cost vs p99 TTFT), ``search.parquet`` (``plan_search``: every replay the search
ran) and ``plan.json`` (options, SLO, window, the chosen configuration and its sizing). The
chosen configuration's cost split and API-equivalent cost go to ``STORE/costs/<plan_id>/``
(pipeline.cost).

SLO semantics: a target ``ttft_p99 <= L`` is met when at least 99 % of the measured requests have
TTFT <= L. A rejected request (longer than ``max_model_len``, or needing more KV than a replica
has) counts as missing every target, and a configuration that rejects any measured request does
not meet the SLO unless ``max_rejected`` (``--max-rejected 0.1%``) allows that share: rejections
do not depend on the replica count, so such a configuration fails at once with the count by
reason.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.catalog import load_hardware, load_model, weight_format
from pipeline.cost import (
    GpuCost,
    TokenTotals,
    api_cost_rows,
    attribute_busy_time,
    day_projection,
    kv_read_shares,
    load_prices,
    period_label,
    traffic_period_s,
)
from pipeline.defaults import DEFAULT_MAX_REPLICAS, DEFAULT_WARMUP_S, DEFAULT_WINDOW_S
from pipeline.engine.model import REJECT_KV_CAPACITY, REJECT_REASONS
from pipeline.errors import ConfigError, RooftraceError
from pipeline.fleet import FleetConfig, ResolvedFleet, load_fleet, parse_fleet, resolve
from pipeline.project import default_fleet_path
from pipeline.replay import ReplayOptions, ReplayRun, build_workload, run_replay
from pipeline.roofline import decode_batch, prefill_batch
from pipeline.schemas import atomic_write_bytes, load_schema, write_parquet
from pipeline.slo import (  # noqa: F401  (re-exported: the planning API)
    METRICS,
    Slo,
    SloTarget,
    latency_arrays,
    load_slo_presets,
    parse_slo,
    percentile,
)
from pipeline.steps import BINDING_NAMES
from pipeline.store import SAFE_ID_RE, Store, confined

#: A failing target whose value improves by less than this when replicas double has hit a
#: latency floor (e.g. one decode step is slower than the TPOT limit): more replicas cannot help.
FLOOR_IMPROVEMENT = 0.02
#: Sizing labels: KV capacity binds when the fullest replica holds this share of its blocks (vLLM
#: starts preempting at 100 %); compute/bandwidth binds when that phase's peak-minute demand is
#: this share of the fleet's roofline capacity (beyond ~80 % utilization an M/M/1-like queue waits
#: 4x the service time, so tails, not averages, decide); otherwise bursts and queueing bind.
KV_BINDS_AT = 0.95
SATURATION = 0.80

# --------------------------------------------------------------------------------------------
# the window


@dataclass(frozen=True)
class Window:
    """Requests to replay (warm-up included) and which of them are measured."""

    kind: str
    requests: pl.DataFrame
    measured: npt.NDArray[np.bool_]
    start_s: float  # seconds since the day's first arrival
    duration_s: float
    warmup_s: float

    def info(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "start_s": self.start_s,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "replayed_requests": self.requests.height,
            "measured_requests": int(self.measured.sum()),
        }


def select_window(
    requests: pl.DataFrame, kind: str, window_s: float = DEFAULT_WINDOW_S, warmup_s: float = DEFAULT_WARMUP_S
) -> Window:
    """``day``: every request. ``peak``: the ``window_s`` seconds whose arrivals carry the most
    tokens (recorded input + output: the load the fleet must absorb), plus ``warmup_s`` before it."""
    if requests.height == 0:
        raise RooftraceError("no requests to plan for")
    req = requests.sort(["arrival", "request_id"])
    t_us = req.get_column("arrival").dt.epoch("us").to_numpy().astype(np.int64)
    t = (t_us - t_us[0]).astype(np.float64) / 1e6
    if kind == "day":
        span = max(float(t[-1]), 1.0)
        return Window("day", req, np.ones(req.height, bool), 0.0, span, 0.0)
    if kind != "peak":
        raise ConfigError(f"--window must be peak or day, got {kind!r}")
    if not (window_s > 0 and warmup_s >= 0):
        raise ConfigError("window must be > 0 s and warm-up >= 0 s")
    tokens = (
        req.get_column("recorded_input_tokens").cast(pl.Float64).fill_null(0).to_numpy()
        + req.get_column("output_tokens").cast(pl.Float64).fill_null(0).to_numpy()
    )
    cum = np.concatenate([[0.0], np.cumsum(tokens)])
    end = np.searchsorted(t, t + window_s, side="left")
    load = cum[end] - cum[np.arange(t.shape[0])]
    i = int(np.argmax(load))
    start = float(t[i])
    keep = (t >= start - warmup_s) & (t < start + window_s)
    sub = req.filter(pl.Series(keep))
    measured = t[keep] >= start
    return Window("peak", sub, measured, start, window_s, min(warmup_s, start))


# --------------------------------------------------------------------------------------------
# one configuration


def _span_columns(run: ReplayRun) -> dict[str, npt.NDArray[np.float64]]:
    """The engine's span log as float arrays (counts are exact in float64 far beyond any day)."""
    return {k: np.asarray(v, dtype=np.float64) for k, v in run.log.columns().items()}


@dataclass(frozen=True)
class Candidate:
    hardware: str
    tp: int
    weight_dtype: str

    @property
    def label(self) -> str:
        return f"{self.hardware} tp{self.tp} {self.weight_dtype}"


@dataclass(frozen=True)
class Evaluation:
    """One replay of a configuration at ``replicas``."""

    replicas: int
    meets: bool
    achieved: dict[str, float]  # SLO target name -> achieved value (s)
    p99: dict[str, float]  # ttft/tpot/e2e/queue p99 (s)
    worst_ratio: float  # max over targets of achieved / limit
    failing: str | None
    rejected_kv: int
    preemptions: int
    utilization: float  # busy replica-seconds / (replicas × replay span)
    kv_peak_fraction: float
    cache_hit_fraction: float
    wall_s: float
    rejected: int = 0  # measured requests rejected, every reason
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    rejected_share: float = 0.0
    failing_target: str | None = None  # the worst SLO target when ``failing`` is "rejected"


@dataclass
class CandidateResult:
    candidate: Candidate
    fits: bool
    note: str = ""
    replicas: int | None = None
    gpus_per_replica: int = 0
    evaluations: list[Evaluation] = field(default_factory=list)
    seed: int = 0
    sizing: dict[str, Any] = field(default_factory=dict)
    cost_rows: list[dict[str, Any]] = field(default_factory=list)
    usd_per_gpu_hour: float = 0.0
    price_date: str = ""
    day_busy_fraction: float = 0.0
    day_tokens: dict[str, float] = field(default_factory=dict)
    period_s: float = 86_400.0

    @property
    def chosen(self) -> Evaluation | None:
        for e in self.evaluations:
            if e.replicas == self.replicas:
                return e
        return None

    @property
    def one_fewer(self) -> Evaluation | None:
        for e in self.evaluations:
            if self.replicas is not None and e.replicas == self.replicas - 1:
                return e
        return None


@dataclass(frozen=True)
class Task:
    """Everything a worker needs to search one configuration (picklable)."""

    candidate: Candidate
    base: FleetConfig
    window: Window
    slo: Slo
    max_replicas: int
    day_tokens: dict[str, float]  # recorded_input, output, cache_write of the whole day
    usd_per_gpu_hour: float | None
    max_rejected: float = 0.0  # share of measured requests that may be rejected
    period_s: float = 86_400.0  # the day's traffic span: the period every $ figure is for


def candidate_fleet(base: FleetConfig, c: Candidate) -> FleetConfig:
    # The engine's batch defaults depend on the GPU (fleet.vllm_batch_defaults): unset keys stay
    # unset so each hardware gets vLLM's own defaults.
    return replace(base, hardware=c.hardware, tp=c.tp, weight_dtype=c.weight_dtype, name=f"plan-{c.hardware}-tp{c.tp}")


def evaluate(
    window: Window, fleet: ResolvedFleet, replicas: int, slo: Slo, max_rejected: float = 0.0
) -> tuple[Evaluation, ReplayRun]:
    """Replay the window on ``replicas`` replicas and check the SLO on the measured requests
    (rejected ones miss every target; more than ``max_rejected`` of them fails the SLO)."""
    cfg = fleet.config.with_replicas(replicas)
    fl = ResolvedFleet(cfg, fleet.deployment, fleet.memory, fleet.scheduler)
    run = run_replay(window.requests, fl, ReplayOptions())
    res = run.result
    m = window.measured
    rejected = res.reject_reason != 0
    lat = latency_arrays(run)
    for v in lat.values():
        v[rejected] = np.inf
    achieved = {t.name: percentile(lat[t.metric][m], t.percentile) for t in slo.targets}
    ratios = {t.name: achieved[t.name] / t.limit_s for t in slo.targets}
    worst = max(ratios, key=lambda k: ratios[k])
    n_rej = int((rejected & m).sum())
    share = n_rej / max(int(m.sum()), 1)
    by_reason = {
        REJECT_REASONS[c]: int(((res.reject_reason == c) & m).sum())
        for c in range(1, len(REJECT_REASONS))
        if ((res.reject_reason == c) & m).any()
    }
    failing = worst if ratios[worst] > 1.0 else None
    # rejections do not depend on the replica count: too many fail the SLO at any count
    if share > max_rejected or any(share > 1.0 - t.percentile / 100.0 for t in slo.targets):
        failing = "rejected"
    cols = _span_columns(run)
    busy = float((cols["end_s"] - cols["start_s"]).sum())
    ok = ~rejected
    span = float(np.nanmax(res.finish_s[ok]) - res.arrival_s.min()) if ok.any() else 0.0
    kv_peak = float(cols["kv_blocks_used"].max() / fl.scheduler.num_gpu_blocks) if cols["steps"].size else 0.0
    rec = float(run.work.prompt_tokens[m & ok].sum())
    ev = Evaluation(
        replicas=replicas,
        meets=failing is None,
        achieved=achieved,
        p99={k: percentile(lat[k][m], 99.0) for k in METRICS},
        worst_ratio=ratios[worst],
        failing=failing,
        rejected_kv=int((res.reject_reason[m] == REJECT_KV_CAPACITY).sum()),
        rejected=n_rej,
        rejected_by_reason=by_reason,
        rejected_share=share,
        failing_target=worst if ratios[worst] > 1.0 else None,
        preemptions=int(res.preemptions[m & ok].sum()),
        utilization=busy / (fl.ranks * span) if span > 0 else 0.0,
        kv_peak_fraction=kv_peak,
        cache_hit_fraction=float(res.cache_hit_tokens[m & ok].sum()) / rec if rec > 0 else 0.0,
        wall_s=run.wall_s,
    )
    return ev, run


def rejection_note(ev: Evaluation, max_rejected: float) -> str:
    """Why a configuration that rejects requests fails, with the count by reason."""
    reasons = ", ".join(f"{k} {v:,}" for k, v in ev.rejected_by_reason.items())
    head = f"rejects {ev.rejected:,} measured requests ({ev.rejected_share:.2%}: {reasons}) at any replica count"
    if ev.rejected_share > max_rejected:
        return f"{head}; allowed {max_rejected:.2%} (--max-rejected)"
    return f"{head}: rejected requests miss every target, so {ev.failing_target or 'a target'} cannot be met"


def capacity_per_replica(fleet: ResolvedFleet, mean_context: float) -> dict[str, Any]:
    """One replica's roofline ceilings: fresh prefill tokens/s with full token-budget steps, and
    decode tokens/s at the largest batch its KV cache and max_num_seqs allow at ``mean_context``."""
    dep, sched = fleet.deployment, fleet.scheduler
    budget = float(sched.max_num_batched_tokens)
    pre = dep(prefill_batch([budget]))
    kv_tokens = sched.num_gpu_blocks * sched.block_size
    batch = float(max(1, min(sched.max_num_seqs, int(kv_tokens // max(mean_context, 1.0)))))
    dec = dep(decode_batch([batch], [mean_context]))

    def label(code: int) -> str:
        name = BINDING_NAMES[code]
        return "bandwidth" if name == "memory" else name

    return {
        "prefill_tokens_per_s": budget / float(pre.time_s[0]),
        "prefill_binding": label(int(pre.binding[0])),
        "decode_tokens_per_s": batch / float(dec.time_s[0]),
        "decode_batch": batch,
        "decode_binding": label(int(dec.binding[0])),
        "kv_capacity_tokens": kv_tokens,
    }


def _demand(window: Window, fleet: ResolvedFleet) -> dict[str, float]:
    """Measured-window demand: output tokens/s, and fresh prefill tokens/s if every block seen
    before were still cached (an infinite prefix cache: a lower bound on prefill work)."""
    work = build_workload(window.requests, fleet, ReplayOptions())
    bs = fleet.scheduler.block_size
    offs = work.offsets()
    h = work.chain_hashes
    hit_tokens = np.zeros(work.n)
    if h.size:
        # every chain's blocks (prompt and output) enter the cache; a prompt block hits when its
        # hash (which names its whole prefix) appeared in an earlier request's chain
        owner = np.repeat(np.arange(work.n), np.diff(offs))
        pos = np.arange(h.shape[0]) - offs[owner]
        _, first_idx, inverse = np.unique(h, return_index=True, return_inverse=True)
        earlier = owner[first_idx][inverse] < owner
        in_prompt = pos < (work.prompt_tokens // bs)[owner]
        hit_tokens = np.bincount(owner[earlier & in_prompt], minlength=work.n).astype(np.float64) * bs
    # vLLM always recomputes at least the last prompt token
    fresh = np.maximum(work.prompt_tokens - hit_tokens, 1.0)
    m = window.measured
    return {
        "fresh_min_tokens_per_s": float(fresh[m].sum()) / window.duration_s,
        "output_tokens_per_s": float(work.output_tokens[m].sum()) / window.duration_s,
        "mean_context": float((work.prompt_tokens[m] + work.output_tokens[m] / 2.0).mean()),
    }


def min_replicas(check: Callable[[int], Evaluation], seed: int, max_replicas: int) -> tuple[int | None, str]:
    """Smallest n in [1, max_replicas] with ``check(n).meets``, assuming monotonicity; every
    answer n > 1 has been checked at n − 1 too. Returns (None, why) when no n qualifies."""
    cache: dict[int, Evaluation] = {}

    def ok(n: int) -> bool:
        if n not in cache:
            cache[n] = check(n)
        return cache[n].meets

    n = min(max(seed, 1), max_replicas)
    if not ok(n) and cache[n].failing == "rejected":
        return None, "rejected"
    if ok(n):
        hi, lo, step = n, 0, 1
        while hi - step >= 1:
            m = hi - step
            if ok(m):
                hi, step = m, step * 2
            else:
                lo = m
                break
    else:
        # gallop up from the seed (a lower bound, usually close): +1, +2, +4, ... then bisect
        lo, step = n, 1
        while True:
            m = min(lo + step, max_replicas)
            if ok(m):
                hi = m
                break
            cur = cache[m]
            # a target that barely moves when replicas double has hit a latency floor
            half = [k for k in cache if k <= m // 2 and cache[k].failing == cur.failing]
            if cur.failing is not None and half:
                prev = cache[max(half)]
                gain = 1.0 - cur.worst_ratio / prev.worst_ratio if math.isfinite(prev.worst_ratio) else 1.0
                if gain < FLOOR_IMPROVEMENT:
                    return None, (
                        f"{cur.failing} stays {cur.achieved[cur.failing]:.4g} s at {max(half)} and {m} replicas "
                        f"(limit x{cur.worst_ratio:.2f}): a latency floor more replicas cannot lower"
                    )
            if m >= max_replicas:
                return None, f"{cur.failing} misses its limit (x{cur.worst_ratio:.2f}) even at {max_replicas} replicas"
            lo, step = m, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi, ""


def search_candidate(task: Task) -> CandidateResult:
    """Minimum replicas for one configuration, its sizing and cost. Runs in a worker process."""
    c = task.candidate
    out = CandidateResult(candidate=c, fits=False, period_s=task.period_s)
    try:
        fleet = resolve(candidate_fleet(task.base, c), c.label)
    except ConfigError as exc:
        out.note = str(exc)
        return out
    out.fits = True
    out.gpus_per_replica = fleet.deployment.gpus * fleet.config.dp
    hw = load_hardware(c.hardware)
    out.usd_per_gpu_hour = task.usd_per_gpu_hour if task.usd_per_gpu_hour is not None else hw.price_usd_per_gpu_hour
    out.price_date = hw.price_date if task.usd_per_gpu_hour is None else "override"
    demand = _demand(task.window, fleet)
    cap = capacity_per_replica(fleet, demand["mean_context"])
    out.seed = max(
        1,
        math.ceil(demand["fresh_min_tokens_per_s"] / cap["prefill_tokens_per_s"]),
        math.ceil(demand["output_tokens_per_s"] / cap["decode_tokens_per_s"]),
    )
    runs: dict[int, ReplayRun] = {}

    def check(n: int) -> Evaluation:
        ev, run = evaluate(task.window, fleet, n, task.slo, task.max_rejected)
        out.evaluations.append(ev)
        runs[n] = run
        return ev

    n, why = min_replicas(check, out.seed, task.max_replicas)
    out.evaluations.sort(key=lambda e: e.replicas)
    if n is None:
        out.note = rejection_note(out.evaluations[0], task.max_rejected) if why == "rejected" else why
        return out
    out.replicas = n
    run = runs[n]
    ev = out.chosen
    assert ev is not None
    out.sizing = sizing(task.window, run, n, cap, ev)
    cost = window_cost(task.window, run, fleet, n, out.usd_per_gpu_hour, hw.price_date)
    # Scale the window to the day: busy time in proportion to tokens, the provisioned fleet 24 h.
    day = task.day_tokens
    win_tokens = cost.tokens.recorded_input + cost.tokens.output
    scale = (day["recorded_input"] + day["output"]) / win_tokens if win_tokens > 0 else 0.0
    hit_frac = cost.tokens.cache_hit / cost.tokens.recorded_input if cost.tokens.recorded_input > 0 else 0.0
    day_tokens = TokenTotals(
        fresh_input=day["recorded_input"] * (1 - hit_frac),
        cache_hit=day["recorded_input"] * hit_frac,
        output=day["output"],
        cache_write=min(day["cache_write"], day["recorded_input"] * (1 - hit_frac)),
    )
    day_cost = GpuCost(
        hardware=c.hardware,
        gpus=cost.gpus,
        usd_per_gpu_hour=cost.usd_per_gpu_hour,
        price_date=cost.price_date,
        window_s=task.period_s,
        busy_gpu_s=min(cost.busy_gpu_s * scale, cost.gpus * task.period_s),
        class_busy_s=cost.class_busy_s,
        tokens=day_tokens,
    )
    out.cost_rows = day_cost.rows()
    out.day_busy_fraction = day_cost.utilization
    out.day_tokens = {
        "fresh_input": day_tokens.fresh_input,
        "cache_hit": day_tokens.cache_hit,
        "output": day_tokens.output,
        "cache_write": day_tokens.cache_write,
    }
    return out


def window_cost(
    window: Window, run: ReplayRun, fleet: ResolvedFleet, replicas: int, usd_per_gpu_hour: float, price_date: str
) -> GpuCost:
    """The fleet's cost over the replayed span and its split over the measured traffic's tokens."""
    res, work = run.result, run.work
    ok = res.reject_reason == 0
    cols = _span_columns(run)
    span = float(np.nanmax(res.finish_s[ok]) - res.arrival_s.min()) if ok.any() else 0.0
    dep = fleet.deployment

    def linear(batch: Any) -> npt.NDArray[np.float64]:
        return np.asarray(dep(batch).time_s, dtype=np.float64)

    shares = kv_read_shares(work.prompt_tokens[ok], res.cache_hit_tokens[ok], work.output_tokens[ok])
    busy = attribute_busy_time(cols, linear, shares)
    hits = float(res.cache_hit_tokens[ok].sum())
    tokens = TokenTotals(
        fresh_input=float(work.prompt_tokens[ok].sum()) - hits,
        cache_hit=hits,
        output=float(work.output_tokens[ok].sum()),
    )
    gpus = replicas * dep.gpus
    return GpuCost(
        hardware=fleet.config.hardware,
        gpus=gpus,
        usd_per_gpu_hour=usd_per_gpu_hour,
        price_date=price_date,
        window_s=span,
        busy_gpu_s=float((cols["end_s"] - cols["start_s"]).sum()) * dep.gpus,
        class_busy_s=busy,
        tokens=tokens,
    )


def sizing(window: Window, run: ReplayRun, replicas: int, cap: dict[str, Any], ev: Evaluation) -> dict[str, Any]:
    """Each resource against its own peak: the busiest minute's fresh prefill and decode tokens/s
    over the fleet's roofline ceilings, the fullest replica's KV share, the SLO headroom; and which
    binds."""
    cols = _span_columns(run)
    minute = np.floor(cols["start_s"] / 60.0).astype(np.int64)
    if minute.size:
        minute -= minute.min()
        pre = np.bincount(minute, weights=cols["prefill_tokens"].astype(np.float64)) / 60.0
        dec = np.bincount(minute, weights=cols["decode_tokens"].astype(np.float64)) / 60.0
        peak_pre, peak_dec = float(pre.max()), float(dec.max())
    else:
        peak_pre = peak_dec = 0.0
    util_pre = peak_pre / (replicas * cap["prefill_tokens_per_s"])
    util_dec = peak_dec / (replicas * cap["decode_tokens_per_s"])
    # time-weighted resource of the busy steps (the engine's per-step attribution)
    parts = [float(cols[k].sum()) for k in ("compute_s", "memory_s", "comm_s", "overhead_s")] if minute.size else [0.0]
    step_binding = BINDING_NAMES[int(np.argmax(parts))]
    if ev.kv_peak_fraction >= KV_BINDS_AT or ev.preemptions > 0:
        binds = "kv_capacity"
    elif max(util_pre, util_dec) >= SATURATION:
        binds = cap["prefill_binding"] if util_pre >= util_dec else cap["decode_binding"]
    elif ev.utilization >= SATURATION:
        # always stepping but with batches far below the ceiling: the resource each step waits on
        binds = "bandwidth" if step_binding == "memory" else step_binding
    else:
        binds = "queueing"
    return {
        "peak_fresh_prefill_tokens_per_s": peak_pre,
        "peak_decode_tokens_per_s": peak_dec,
        "prefill_capacity_tokens_per_s": replicas * cap["prefill_tokens_per_s"],
        "decode_capacity_tokens_per_s": replicas * cap["decode_tokens_per_s"],
        "prefill_utilization": util_pre,
        "decode_utilization": util_dec,
        "kv_peak_fraction": ev.kv_peak_fraction,
        "slo_headroom": 1.0 - ev.worst_ratio,
        "prefill_binding": cap["prefill_binding"],
        "decode_binding": cap["decode_binding"],
        "decode_batch_ceiling": cap["decode_batch"],
        "step_binding": step_binding,
        "binding": binds,
    }


# --------------------------------------------------------------------------------------------
# executors


def run_local(tasks: Sequence[Task], jobs: int, progress: Callable[[str], None] | None) -> list[CandidateResult]:
    """Configurations in parallel processes (each replay is single-threaded Python + numpy)."""
    if jobs <= 1 or len(tasks) <= 1:
        out = []
        for t in tasks:
            out.append(search_candidate(t))
            if progress:
                progress(_progress_line(out[-1]))
        return out
    results: list[CandidateResult | None] = [None] * len(tasks)
    # spawn, not fork: the parent has started polars' and numba's thread pools, and a forked child
    # can inherit one of their locks held (polars documents fork as unsafe for that reason).
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as pool:
        futures = {pool.submit(search_candidate, t): i for i, t in enumerate(tasks)}
        for fut in as_completed(futures):
            results[futures[fut]] = r = fut.result()
            if progress:
                progress(_progress_line(r))
    return [r for r in results if r is not None]


def run_ray(
    tasks: Sequence[Task], address: str | None, progress: Callable[[str], None] | None
) -> list[CandidateResult]:
    """Configurations as Ray tasks on an existing cluster (``ray.init(address=...)``); ``ray`` is
    the optional extra ``rooftrace[ray]`` and is imported only here."""
    try:
        import ray
    except ImportError:
        raise RooftraceError("--executor ray needs the optional extra: pip install 'rooftrace[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(search_candidate)
    refs = [remote.remote(t) for t in tasks]
    results: list[CandidateResult] = ray.get(refs)
    if progress:
        for r in results:
            progress(_progress_line(r))
    return results


def _progress_line(r: CandidateResult) -> str:
    if not r.fits:
        return f"  {r.candidate.label}: does not fit ({r.note})"
    if r.replicas is None:
        return f"  {r.candidate.label}: SLO not met ({r.note}); {len(r.evaluations)} replays"
    return f"  {r.candidate.label}: {r.replicas} replicas after {len(r.evaluations)} replays"


# --------------------------------------------------------------------------------------------
# the stage


@dataclass(frozen=True)
class PlanOptions:
    model: str
    slo: str = "chat"
    fleet_path: str | None = None
    hardware: tuple[str, ...] = ("h100-sxm", "h200", "a100-80gb-sxm", "mi300x")
    tp: tuple[int, ...] = (1, 2, 4, 8)
    precision: tuple[str, ...] = ()  # weight dtypes; empty: the base fleet's
    date: str | None = None
    window: str = "peak"
    window_s: float = DEFAULT_WINDOW_S
    warmup_s: float = DEFAULT_WARMUP_S
    traffic_model: str | None = None  # the requests' `model` value (default: --model; "*" = all)
    executor: str = "local"
    jobs: int | None = None
    ray_address: str | None = None
    max_replicas: int = DEFAULT_MAX_REPLICAS
    gpu_prices: tuple[tuple[str, float], ...] = ()  # (hardware, usd_per_gpu_hour) overrides
    price_files: tuple[str, ...] = ()
    #: Share of the measured requests a configuration may reject and still meet the SLO.
    max_rejected: float = 0.0

    def __post_init__(self) -> None:
        if self.executor not in ("local", "ray"):
            raise ConfigError(f"--executor must be local or ray, got {self.executor!r}")
        if self.max_replicas < 1:
            raise ConfigError("--max-replicas must be >= 1")
        if not self.hardware or not self.tp:
            raise ConfigError("give at least one --hardware and one --tp")
        if not 0.0 <= self.max_rejected <= 1.0:
            raise ConfigError(f"--max-rejected must be between 0% and 100%, got {self.max_rejected:.4g}")


@dataclass(frozen=True)
class PlanResult:
    plan_id: str
    plan_dir: Path
    doc: dict[str, Any]
    table: pa.Table


def _base_fleet(opts: PlanOptions) -> tuple[FleetConfig, str]:
    if opts.fleet_path is not None:
        base = load_fleet(opts.fleet_path)
        return replace(base, model=opts.model), opts.fleet_path
    path = default_fleet_path()
    if path.exists():
        base = load_fleet(path)
        return replace(base, model=opts.model), str(path)
    return parse_fleet({"name": "plan", "model": opts.model, "hardware": opts.hardware[0]}, "defaults"), "defaults"


def candidates(opts: PlanOptions, base: FleetConfig) -> list[Candidate]:
    for hw in opts.hardware:
        load_hardware(hw)  # unknown names fail here, with the catalog's message
    dtypes = opts.precision or (base.weight_dtype,)
    for dt in dtypes:
        weight_format(dt)  # unknown dtypes fail here, before a name is built from them
    return [Candidate(hw, tp, dt) for hw in opts.hardware for tp in sorted(set(opts.tp)) for dt in dtypes]


def _day_totals(req: pl.DataFrame) -> dict[str, float]:
    writes = req.get_column("cache_write_tokens") if "cache_write_tokens" in req.columns else None
    return {
        "recorded_input": float(req.get_column("recorded_input_tokens").sum()),
        "output": float(req.get_column("output_tokens").sum()),
        "cache_write": float(writes.fill_null(0).sum()) if writes is not None else 0.0,
    }


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """Points (cost, latency) that no other point beats on both (lower is better; ties keep both)."""
    flags = []
    for i, (c, t) in enumerate(points):
        dominated = any((c2 <= c and t2 <= t) and (c2 < c or t2 < t) for j, (c2, t2) in enumerate(points) if j != i)
        flags.append(not dominated)
    return flags


def plan(store: Store, opts: PlanOptions, progress: Callable[[str], None] | None = None) -> PlanResult:
    """Search every configuration, rank by $/day, write ``STORE/plans/<plan_id>/``."""
    load_model(opts.model)
    slo = parse_slo(opts.slo)
    base, base_origin = _base_fleet(opts)
    cands = candidates(opts, base)
    date = store.resolve_date(opts.date)
    every = store.read_requests(date)
    want = opts.traffic_model or opts.model
    req = every if want == "*" else every.filter(pl.col("model") == want)
    if req.height == 0:
        have = sorted(every.get_column("model").unique().to_list())
        raise RooftraceError(f"no requests for model {want!r} on {date}; models there: {have} (use --traffic-model)")
    window = select_window(req, opts.window, opts.window_s, opts.warmup_s)
    day = _day_totals(req)
    arrivals = req.get_column("arrival").dt.epoch("us").to_numpy().astype(np.float64) / 1e6
    period = traffic_period_s(arrivals)
    overrides = dict(opts.gpu_prices)
    prices = load_prices(list(opts.price_files) or None)
    tasks = [
        Task(c, base, window, slo, opts.max_replicas, day, overrides.get(c.hardware), opts.max_rejected, period)
        for c in cands
    ]
    if progress:
        w = window.info()
        progress(
            f"plan {opts.model}: {len(tasks)} configurations, window {w['kind']} of {w['measured_requests']:,} "
            f"requests (+{w['replayed_requests'] - w['measured_requests']:,} warm-up), SLO {slo.name}"
        )
    t0 = time.perf_counter()
    if opts.executor == "ray":
        results = run_ray(tasks, opts.ray_address, progress)
    else:
        jobs = opts.jobs or min(len(tasks), os.cpu_count() or 1)
        results = run_local(tasks, jobs, progress)
    wall = time.perf_counter() - t0

    plan_id = _plan_id(date, opts, slo, base, req)
    table, search = _tables(plan_id, date, opts, slo, window, results)
    chosen = _chosen(results)
    plan_dir = confined(store.root / "plans", plan_id, "plan id")
    api_rows = _api_rows(plan_id, chosen, prices) if chosen is not None else []
    doc = {
        "plan_id": plan_id,
        "date": date,
        "model": opts.model,
        "traffic_model": want,
        "slo": slo.to_dict(),
        "slo_presets": {k: v.to_dict() for k, v in load_slo_presets().items()},
        "window": window.info(),
        "base_fleet": {"origin": base_origin, **base.to_dict()},
        "options": {k: v for k, v in asdict(opts).items() if k not in ("jobs", "ray_address")},
        "day_tokens": day,
        "period_s": period,
        "period": period_label(period),
        "day_projection": day_projection(period),
        "configurations": table.to_pylist(),
        "chosen": _chosen_doc(chosen) if chosen is not None else None,
        "api_equivalent": api_rows,
    }
    with store.lock():
        write_parquet(table, plan_dir / "plan.parquet", "plan")
        write_parquet(search, plan_dir / "search.parquet", "plan_search")
        costs = confined(store.root / "costs", plan_id, "plan id")
        if chosen is not None:
            write_parquet(_gpu_cost_table(plan_id, chosen), costs / "gpu_cost.parquet", "plan_gpu_cost")
            write_parquet(pa.Table.from_pylist(api_rows), costs / "api_cost.parquet", "plan_api_cost")
        atomic_write_bytes(plan_dir / "plan.json", json.dumps(doc, indent=2, sort_keys=True, default=str).encode())
    doc["search_wall_s"] = wall
    doc["replays"] = sum(len(r.evaluations) for r in results)
    return PlanResult(plan_id, plan_dir, doc, table)


def _plan_id(date: str, opts: PlanOptions, slo: Slo, base: FleetConfig, req: pl.DataFrame) -> str:
    h = hashlib.sha256()
    keep = {k: v for k, v in asdict(opts).items() if k not in ("jobs", "executor", "ray_address")}
    h.update(json.dumps(keep, sort_keys=True, default=str).encode())
    h.update(json.dumps(slo.to_dict(), sort_keys=True).encode())
    h.update(json.dumps(base.to_dict(), sort_keys=True, default=str).encode())
    h.update(
        req.select("request_id", "arrival", "recorded_input_tokens", "output_tokens").hash_rows().to_numpy().tobytes()
    )
    # the id names the plan's folders (store.confined): other characters of a model name become '_'
    model = opts.model
    if not (SAFE_ID_RE.fullmatch(model) and len(model) <= 64):
        model = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in model)[:64]
    return f"{date}-{model}-{h.hexdigest()[:10]}"


def _chosen(results: Sequence[CandidateResult]) -> CandidateResult | None:
    ok = [r for r in results if r.replicas is not None]
    if not ok:
        return None
    return min(ok, key=lambda r: (_usd_per_day(r), r.chosen.p99["ttft"] if r.chosen else 0.0, r.candidate.label))


def _usd_per_day(r: CandidateResult) -> float:
    """The provisioned fleet for 24 hours (what ranks configurations)."""
    return (r.replicas or 0) * r.gpus_per_replica * r.usd_per_gpu_hour * 24.0


def _usd_per_period(r: CandidateResult) -> float:
    """The provisioned fleet over the period of record (the traffic's span), as `rooftrace cost`
    states a run's cost: self-hosted and API figures of one traffic over one period."""
    return (r.replicas or 0) * r.gpus_per_replica * r.usd_per_gpu_hour * r.period_s / 3600.0


def _class_per_million(r: CandidateResult) -> dict[str, float | None]:
    return {row["token_class"]: row["all_in_usd_per_million_tokens"] for row in r.cost_rows}


def _tables(
    plan_id: str, date: str, opts: PlanOptions, slo: Slo, window: Window, results: Sequence[CandidateResult]
) -> tuple[pa.Table, pa.Table]:
    feasible = [r for r in results if r.replicas is not None]
    ranked = sorted(
        feasible, key=lambda r: (_usd_per_day(r), r.chosen.p99["ttft"] if r.chosen else 0.0, r.candidate.label)
    )
    rank = {id(r): i + 1 for i, r in enumerate(ranked)}
    front = pareto_front([(_usd_per_day(r), r.chosen.p99["ttft"] if r.chosen else 0.0) for r in ranked])
    on_front = {id(r) for r, f in zip(ranked, front, strict=True) if f}
    order = ranked + sorted((r for r in results if r.replicas is None), key=lambda r: r.candidate.label)
    rows, search = [], []
    for r in order:
        ev, fewer = r.chosen, r.one_fewer
        per_m = _class_per_million(r)
        day_tokens = sum(r.day_tokens.get(k, 0.0) for k in ("fresh_input", "cache_hit", "output"))
        usd_day = _usd_per_day(r) if r.replicas is not None else None
        rows.append(
            {
                "plan_id": plan_id,
                "date": date,
                "model": opts.model,
                "slo": slo.name,
                "window": window.kind,
                "rank": rank.get(id(r)),
                "config": r.candidate.label,
                "hardware": r.candidate.hardware,
                "tp": r.candidate.tp,
                "weight_dtype": r.candidate.weight_dtype,
                "fits": r.fits,
                "meets_slo": r.replicas is not None,
                "note": r.note,
                "gpus_per_replica": r.gpus_per_replica or None,
                "replicas": r.replicas,
                "gpus": (r.replicas * r.gpus_per_replica) if r.replicas is not None else None,
                "ttft_p99_s": ev.p99["ttft"] if ev else None,
                "tpot_p99_s": ev.p99["tpot"] if ev else None,
                "e2e_p99_s": ev.p99["e2e"] if ev else None,
                "queue_p99_s": ev.p99["queue"] if ev else None,
                "slo_worst_ratio": ev.worst_ratio if ev else None,
                "slo_headroom": (1.0 - ev.worst_ratio) if ev else None,
                "one_fewer_meets_slo": (fewer.meets if fewer else None),
                "one_fewer_failing": (fewer.failing if fewer else None),
                "utilization": ev.utilization if ev else None,
                "day_utilization": r.day_busy_fraction if ev else None,
                "prefill_utilization": r.sizing.get("prefill_utilization"),
                "decode_utilization": r.sizing.get("decode_utilization"),
                "kv_peak_fraction": ev.kv_peak_fraction if ev else None,
                "binding": r.sizing.get("binding"),
                "usd_per_gpu_hour": r.usd_per_gpu_hour if r.fits else None,
                "price_date": r.price_date or None,
                "usd_per_day": usd_day,
                "usd_per_million_tokens": (_usd_per_period(r) / day_tokens * 1e6) if usd_day and day_tokens else None,
                "usd_per_million_fresh_input_tokens": per_m.get("fresh_input"),
                "usd_per_million_cache_hit_tokens": per_m.get("cache_hit"),
                "usd_per_million_output_tokens": per_m.get("output"),
                "idle_usd_per_day": next((x["all_in_usd"] for x in r.cost_rows if x["token_class"] == "idle"), None),
                "pareto": id(r) in on_front,
                "replays": len(r.evaluations),
            }
        )
        for e in r.evaluations:
            search.append(
                {
                    "plan_id": plan_id,
                    "config": r.candidate.label,
                    "hardware": r.candidate.hardware,
                    "tp": r.candidate.tp,
                    "weight_dtype": r.candidate.weight_dtype,
                    "replicas": e.replicas,
                    "meets_slo": e.meets,
                    "failing": e.failing,
                    "slo_worst_ratio": e.worst_ratio,
                    "ttft_p99_s": e.p99["ttft"],
                    "tpot_p99_s": e.p99["tpot"],
                    "e2e_p99_s": e.p99["e2e"],
                    "queue_p99_s": e.p99["queue"],
                    "rejected_kv": e.rejected_kv,
                    "rejected": e.rejected,
                    "preemptions": e.preemptions,
                    "utilization": e.utilization,
                    "kv_peak_fraction": e.kv_peak_fraction,
                    "cache_hit_fraction": e.cache_hit_fraction,
                }
            )
    # a plan where nothing fits ran no replay: an empty search table of the declared schema
    search_table = pa.Table.from_pylist(search) if search else load_schema("plan_search").arrow.empty_table()
    return pa.Table.from_pylist(rows), search_table


def _chosen_doc(r: CandidateResult) -> dict[str, Any]:
    ev = r.chosen
    fewer = r.one_fewer
    return {
        "config": r.candidate.label,
        "hardware": r.candidate.hardware,
        "tp": r.candidate.tp,
        "weight_dtype": r.candidate.weight_dtype,
        "replicas": r.replicas,
        "gpus": (r.replicas or 0) * r.gpus_per_replica,
        "usd_per_day": _usd_per_day(r),
        "usd_per_period": _usd_per_period(r),
        "achieved": ev.achieved if ev else None,
        "one_fewer": asdict(fewer) if fewer else None,
        "sizing": r.sizing,
        "cost_per_day": r.cost_rows,
        "day_tokens": r.day_tokens,
    }


def _gpu_cost_table(subject: str, r: CandidateResult) -> pa.Table:
    rows = [
        {
            "subject": subject,
            "hardware": r.candidate.hardware,
            "gpus": (r.replicas or 0) * r.gpus_per_replica,
            "usd_per_gpu_hour": r.usd_per_gpu_hour,
            "price_date": r.price_date,
            "period_s": r.period_s,
            **row,
        }
        for row in r.cost_rows
    ]
    return pa.Table.from_pylist(rows)


def _api_rows(subject: str, r: CandidateResult, prices: Sequence[Any]) -> list[dict[str, Any]]:
    t = r.day_tokens
    tokens = TokenTotals(t["fresh_input"], t["cache_hit"], t["output"], t["cache_write"])
    return api_cost_rows(subject, tokens, prices, _usd_per_period(r), r.period_s)
