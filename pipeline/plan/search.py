"""One configuration: the minimum replica count whose replay of the window meets every SLO
target (analytic lower bound, galloping, bisection), with its sizing and cost."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.catalog import load_hardware
from pipeline.classify.offload import parse_offload
from pipeline.common.budget import ResourceLimitError
from pipeline.common.errors import ConfigError
from pipeline.common.units import format_seconds
from pipeline.costmodel.profile.tables import no_profile_message
from pipeline.costmodel.steps import BINDING_NAMES
from pipeline.economics.cost import (
    PERIOD_MAKESPAN,
    GpuCost,
    Period,
    TokenTotals,
    attribute_busy_time,
    kv_read_shares,
    run_period,
)
from pipeline.engine.model import REJECT_KV_CAPACITY, REJECT_REASONS, EngineResult, Workload
from pipeline.plan.objective import candidate_energy
from pipeline.plan.window import Window
from pipeline.replay.fleet import (
    FleetConfig,
    ResolvedFleet,
    SpeculativeSettings,
    check_stack_calibration,
    missing_profile,
    resolve,
)
from pipeline.replay.pools import MODEL_DRAFTERS, SPLIT_COLUMNS, LinkSpec, link_of_kind
from pipeline.replay.run import (
    ReplayOptions,
    ReplayRun,
    build_workload,
    multi_node_warning,
    replay_prefill_decode,
    run_replay,
)
from pipeline.replay.slo import (
    METRICS,
    Slo,
    detect_overload,
    latency_arrays,
    percentile,
)

#: A failing target whose value improves by less than this when replicas double has hit a
#: latency floor (e.g. one decode step is slower than the TPOT limit): more replicas cannot help.
FLOOR_IMPROVEMENT = 0.02
#: Sizing labels: KV capacity binds when the fullest replica holds this share of its blocks (vLLM
#: starts preempting at 100 %); compute/bandwidth binds when that phase's peak-minute demand is
#: this share of the fleet's capacity (its cost model's ceilings) (beyond ~80 % utilization an M/M/1-like queue waits
#: 4x the service time, so tails, not averages, decide); otherwise bursts and queueing bind.
KV_BINDS_AT = 0.95
SATURATION = 0.80


def _span_columns(run: ReplayRun) -> dict[str, npt.NDArray[np.float64]]:
    """The engine's span log as float arrays (counts are exact in float64 far beyond any day)."""
    return {k: np.asarray(v, dtype=np.float64) for k, v in run.log.columns().items()}


#: The serving modes ``plan --modes`` searches (docs/planning.md, "Serving modes"): one pool
#: prefilling and decoding; a prefill pool handing to a decode pool (xPyD on one GPU type);
#: one pool with speculative decoding; one pool with a lower KV tier (FLEET.toml [kv_offload]); a
#: prefill pool handing to a decode pool that decodes speculatively.
MODES: tuple[str, ...] = ("colocated", "disaggregated", "speculative", "offload", "disaggregated-speculative")
#: The modes of two pools (a prefill pool and a decode pool, at each --pd-ratios ratio).
DISAGGREGATED_MODES: tuple[str, ...] = ("disaggregated", "disaggregated-speculative")


@dataclass(frozen=True)
class Candidate:
    hardware: str
    tp: int
    weight_dtype: str
    mode: str = "colocated"
    #: disaggregated: the prefill:decode replica ratio the search keeps (e.g. (1, 2))
    ratio: tuple[int, int] | None = None
    #: speculative: (method, k) as FLEET.toml's [speculative] method and num_speculative_tokens
    speculative: tuple[str, int] | None = None
    #: offload: (kind, GB) as FLEET.toml's [kv_offload] kind and capacity_gb (per replica for cpu)
    offload: tuple[str, float] | None = None
    #: offload, three levels: GB of a store shared by the pool below a cpu tier ([kv_offload.shared])
    offload_store: float | None = None

    @property
    def label(self) -> str:
        base = f"{self.hardware} tp{self.tp} {self.weight_dtype}"
        if self.mode == "disaggregated-speculative" and self.ratio is not None and self.speculative is not None:
            return f"{base} pd{self.ratio[0]}:{self.ratio[1]} spec-{self.speculative[0]}:{self.speculative[1]}"
        if self.mode == "disaggregated" and self.ratio is not None:
            return f"{base} pd{self.ratio[0]}:{self.ratio[1]}"
        if self.mode == "speculative" and self.speculative is not None:
            return f"{base} spec-{self.speculative[0]}:{self.speculative[1]}"
        if self.mode == "offload" and self.offload is not None:
            store = f"+store:{self.offload_store:g}GB" if self.offload_store is not None else ""
            return f"{base} offload-{self.offload[0]}:{self.offload[1]:g}GB{store}"
        return base


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
    #: The replay is OVERLOADED (pipeline.replay.slo.detect_overload, as `replay` reports it); such a
    #: replay never meets the plan (``failing`` "overloaded").
    overloaded: bool = False
    #: The period it would be priced over (pipeline.economics.cost.Period.to_dict): the makespan when overloaded.
    period: dict[str, Any] = field(default_factory=dict)
    #: A disaggregated replay's pools (prefill_replicas, decode_replicas, each pool's busy share)
    #: and its TTFT split (p99 and mean of queue, prefill, transfer, decode queue, first decode step).
    pools: dict[str, Any] = field(default_factory=dict)
    ttft_split: dict[str, Any] = field(default_factory=dict)
    #: An offload replay's tier and what its pre-pass loaded (pipeline.replay.offload.OffloadPlan.summary)
    #: with the prompt tokens the measured requests prefilled fresh.
    offload: dict[str, Any] = field(default_factory=dict)


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
    #: Not searched, for a reason of the plan's inputs (``note``: search.skip_reason), not a misfit.
    skipped: bool = False
    #: The cost tier that priced its replays: measured, prior or roofline ("" when none ran).
    priced_by: str = ""
    #: plan --objective only (pipeline/plan/objective.py): the chosen replay's GPU energy a day,
    #: computed in the worker that holds its step log, and the cost stack the plan builds on it.
    energy: dict[str, Any] = field(default_factory=dict)
    stack: dict[str, Any] = field(default_factory=dict)

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
    base_origin: str = "the base fleet"  # where the base fleet came from (its FLEET.toml), for notes
    #: The link kind a disaggregated candidate's prefill pool hands over (pipeline/catalog/links.toml).
    link: str = "rdma"
    #: plan --objective: work out the chosen replay's energy a day (CandidateResult.energy).
    energy: bool = False


def candidate_ep(base: FleetConfig, tp: int) -> int:
    """Expert parallelism of a candidate with ``tp``: vLLM's ``enable_expert_parallel`` shards the
    experts over every tp × dp rank of a replica, so a base fleet with ep > 1 means "expert
    parallel" and the candidate's ep follows its own tp × dp (1 when that is 1); ep = 1 stays 1."""
    return tp * base.dp if base.ep > 1 else 1


def candidate_fleet(base: FleetConfig, c: Candidate) -> FleetConfig:
    # The engine's batch defaults depend on the GPU (fleet.vllm_batch_defaults): unset keys stay
    # unset so each hardware gets vLLM's own defaults.
    cfg = replace(
        base,
        hardware=c.hardware,
        tp=c.tp,
        ep=candidate_ep(base, c.tp),
        weight_dtype=c.weight_dtype,
        name=f"plan-{c.hardware}-tp{c.tp}",
        # a stated [topology] is the base fleet's box; another GPU is priced on its own entry's link
        topology=base.topology if c.hardware == base.hardware else None,
    )
    if c.speculative is not None:  # acceptance: the catalog's published figure for the pair
        method, k = c.speculative
        cfg = replace(cfg, speculative=SpeculativeSettings(method, k), name=f"{cfg.name}-{method}{k}")
    if c.offload is not None:  # the fleet parser's own check: a cpu tier must fit one replica's host memory
        kind, gb = c.offload
        where = f"--offload-gb {gb:g} ({c.hardware} tp{c.tp}) [kv_offload]"
        raw: dict[str, Any] = {"kind": kind, "capacity_gb": gb}
        name = f"{cfg.name}-offload{gb:g}"
        if c.offload_store is not None:  # three levels: the pool's store below the cpu tier
            raw["shared"] = {"capacity_gb": c.offload_store}
            name += f"-store{c.offload_store:g}"
        tier = parse_offload(raw, where, cfg.tp * cfg.pp * cfg.dp)
        cfg = replace(cfg, kv_offload=tier, name=name)
    return cfg


@dataclass(frozen=True)
class Replayed:
    """What the SLO check, the sizing and the cost read of one replay of a configuration: the
    requests' results and workload (a disaggregated replay's joined over both pools), the step
    log's columns (both pools', the decode pool's replicas numbered after the prefill pool's),
    the engines' ranks, a replica's KV blocks, the engines' wall time and the cost tier."""

    result: EngineResult
    work: Workload
    cols: dict[str, npt.NDArray[np.float64]]
    ranks: int
    num_gpu_blocks: int
    wall_s: float
    cost_source: str

    @classmethod
    def of(cls, run: ReplayRun) -> Replayed:
        return cls(
            run.result, run.work, _span_columns(run), run.fleet.ranks,
            run.fleet.scheduler.num_gpu_blocks, run.wall_s, run.cost_source,
        )  # fmt: skip


def skip_reason(base: FleetConfig, hardware: str, origin: str = "the base fleet") -> str | None:
    """Why a candidate on ``hardware`` is not searched: the base fleet asks for the measured cost
    model (``cost_model = "measured"``) and that GPU has no measured profile, or the base fleet's
    calibration (``calibration_file``) was learnt on another GPU or tier. None otherwise."""
    if base.stack_calibration is not None:
        try:
            check_stack_calibration(base, hardware)
        except ConfigError as exc:
            return f"skipped: the base fleet's calibration does not apply: {exc}"
    if base.cost_model != "measured":
        return None
    missing = missing_profile(hardware)
    if missing is None:
        return None

    gpu = missing[0]
    return f"skipped: {gpu} has no measured profile; the base fleet ({origin}) says {no_profile_message(gpu)}"


def evaluate(
    window: Window, fleet: ResolvedFleet, replicas: int, slo: Slo, max_rejected: float = 0.0
) -> tuple[Evaluation, ReplayRun]:
    """Replay the window on ``replicas`` replicas and check the SLO on the measured requests
    (rejected ones miss every target; more than ``max_rejected`` of them fails the SLO)."""
    cfg = fleet.config.with_replicas(replicas)
    fl = replace(fleet, config=cfg)
    run = run_replay(window.requests, fl, ReplayOptions(isolation=window.isolation), identity=window.identity)
    return judge(window, Replayed.of(run), replicas, slo, max_rejected), run


def evaluate_disaggregated(
    window: Window,
    fleet: ResolvedFleet,
    split: tuple[int, int],
    link: LinkSpec,
    slo: Slo,
    max_rejected: float = 0.0,
    prefill: ResolvedFleet | None = None,
) -> tuple[Evaluation, Replayed]:
    """Replay the window on ``split`` = (prefill, decode) replicas of ``fleet``, the prefill pool
    handing every request over ``link`` (pipeline.replay.run.replay_prefill_decode), and check
    the SLO on the requests' joined lives, as :func:`evaluate` does for one pool; the evaluation
    carries each pool's busy share and the TTFT split. ``prefill``: the prefill pool's fleet where
    it differs from the decode pool's (a decode pool's n-gram drafter, which the prefill pool
    does not load)."""
    p, d = split
    pf = prefill if prefill is not None else fleet
    pre = replace(pf, config=replace(pf.config.with_replicas(p), name=f"{fleet.config.name}-prefill"))
    dec = replace(fleet, config=replace(fleet.config.with_replicas(d), name=f"{fleet.config.name}-decode"))
    got = replay_prefill_decode(
        window.requests, pre, dec, link, ReplayOptions(isolation=window.isolation), window.identity
    )
    pcols = _span_columns(got.prefill)
    dcols = _span_columns(got.decode) if got.decode is not None else {k: v[:0] for k, v in pcols.items()}
    dcols = {**dcols, "replica": dcols["replica"] + pre.ranks}
    cols = {k: np.concatenate([pcols[k], dcols[k]]) for k in pcols}
    wall = got.prefill.wall_s + (got.decode.wall_s if got.decode is not None else 0.0)
    rep = Replayed(
        got.joined.result, got.work, cols, pre.ranks + dec.ranks, fleet.scheduler.num_gpu_blocks, wall,
        got.prefill.cost_source,
    )  # fmt: skip
    ev = judge(window, rep, p + d, slo, max_rejected)
    m = window.measured
    # each pool's busy share of the time the fleet ran (the arrivals, or longer when it finished later)
    span = max(ev.period.get("arrival_span_s") or 0.0, ev.period.get("makespan_s") or 0.0)

    def busy(c: dict[str, npt.NDArray[np.float64]], ranks: int) -> float:
        return float((c["end_s"] - c["start_s"]).sum()) / (ranks * span) if span > 0 else 0.0

    split_doc: dict[str, Any] = {}
    for name in ("queue_s", *SPLIT_COLUMNS):
        if name == "queue_s":
            part = got.joined.result.scheduled_s - got.joined.result.arrival_s
        else:
            part = got.joined.split[name]
        part = part[m & np.isfinite(part)]
        split_doc[name] = {
            "p99": percentile(part, 99.0) if part.size else None,
            "mean": float(part.mean()) if part.size else None,
        }
    pools = {
        "prefill_replicas": p,
        "decode_replicas": d,
        "prefill_busy": busy(pcols, pre.ranks),
        "decode_busy": busy(dcols, dec.ranks),
        "link": link.text(),
    }
    return replace(ev, pools=pools, ttft_split=split_doc), rep


def offload_figures(run: ReplayRun, window: Window, ev: Evaluation) -> dict[str, Any]:
    """What an offload replay's tier did (its pre-pass's summary: the tier, the requests that
    loaded, the tokens loaded instead of prefilled, the load seconds) and the prompt tokens its
    measured requests hit (GPU tier and loads) and prefilled fresh, for the frontier's words."""
    served = window.measured & (run.result.reject_reason == 0)  # (as judge's cache_hit_fraction)
    prompt = float(run.work.prompt_tokens[served].sum())
    hit = ev.cache_hit_fraction * prompt
    return {**(run.kv_offload or {}), "prompt_tokens": prompt, "fresh_tokens": prompt - hit}


def judge(window: Window, run: Replayed, replicas: int, slo: Slo, max_rejected: float = 0.0) -> Evaluation:
    """The SLO check of one replay on the window's measured requests (rejected ones miss every
    target; more than ``max_rejected`` of them fails the SLO; a replay that falls behind fails)."""
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
    cols = run.cols
    period = replay_period(run, cols)
    behind = period.overloaded
    if behind and failing is None:
        # a fleet that falls behind does not serve the traffic, whatever a loose SLO says:
        # `replay` calls it OVERLOADED and `cost` prices it over its makespan (docs/planning.md)
        failing = OVERLOADED
    busy = float((cols["end_s"] - cols["start_s"]).sum())
    ok = ~rejected
    span = float(np.nanmax(res.finish_s[ok]) - res.arrival_s.min()) if ok.any() else 0.0
    kv_peak = float(cols["kv_blocks_used"].max() / run.num_gpu_blocks) if cols["steps"].size else 0.0
    rec = float(run.work.prompt_tokens[m & ok].sum())
    return Evaluation(
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
        utilization=busy / (run.ranks * span) if span > 0 else 0.0,
        kv_peak_fraction=kv_peak,
        cache_hit_fraction=float(res.cache_hit_tokens[m & ok].sum()) / rec if rec > 0 else 0.0,
        wall_s=run.wall_s,
        overloaded=behind,
        period=period.to_dict(),
    )


#: ``Evaluation.failing`` of a replay that did not keep up with its arrivals.
OVERLOADED = "overloaded"


def replay_period(run: ReplayRun | Replayed, cols: dict[str, npt.NDArray[np.float64]] | None = None) -> Period:
    """The period `rooftrace cost` would price this replay over (:func:`pipeline.economics.cost.run_period`),
    with the overload `rooftrace replay` reports (:func:`pipeline.replay.slo.detect_overload`)."""
    res = run.result
    if cols is None:
        cols = run.cols if isinstance(run, Replayed) else _span_columns(run)
    ok = res.reject_reason == 0
    over = detect_overload(
        np.asarray(res.arrival_s, dtype=np.float64),
        np.asarray(res.scheduled_s, dtype=np.float64),
        np.asarray(res.finish_s, dtype=np.float64),
        ok,
    )
    return run_period(
        res.arrival_s,
        np.asarray(res.finish_s, dtype=np.float64)[ok],
        cols["replica"] if "replica" in cols else np.zeros(cols["start_s"].size),
        cols["start_s"],
        cols["end_s"],
        over.detected,
        over.sustained or over.backlog > 0,  # still queued at the last arrival
    )


def overload_note(ev: Evaluation) -> str:
    """Why a replay that did not keep up fails, in `cost`'s words (Period.unit_costs_note)."""
    what = "OVERLOADED" if ev.period.get("overloaded") else "falls behind"

    if ev.period.get("period_basis") != PERIOD_MAKESPAN:  # a peak backlog that drained before the last arrival
        return (
            f"{what} at {ev.replicas:,} replica{'s' if ev.replicas != 1 else ''}: the queue grew for a while "
            f"and drained before the last arrival ({format_seconds(ev.period.get('arrival_span_s'))} of arrivals), "
            "requests waiting for it"
        )
    return (
        f"{what} at {ev.replicas:,} replica{'s' if ev.replicas != 1 else ''}: serving "
        f"{format_seconds(ev.period.get('arrival_span_s'))} of arrivals took "
        f"{format_seconds(ev.period.get('makespan_s'))} (makespan), with requests queued for it"
    )


def rejection_note(ev: Evaluation, max_rejected: float, slo: Slo | None = None) -> str:
    """Why a configuration that rejects requests fails, with the count by reason; --max-rejected
    is named as the way out only when a larger one could make the SLO (a rejected request misses
    every target: more rejected than a target's percentile allows misses it at any --max-rejected)."""
    reasons = ", ".join(f"{k} {v:,}" for k, v in ev.rejected_by_reason.items())
    head = f"rejects {ev.rejected:,} measured requests ({ev.rejected_share:.2%}: {reasons}) at any replica count"
    missed = [t for t in slo.targets if ev.rejected_share > 1.0 - t.percentile / 100.0] if slo is not None else []
    if missed:
        t = missed[0]
        return (
            f"{head}: rejected requests miss every target, and more than {1.0 - t.percentile / 100.0:.2%} "
            f"rejected misses {t.name} whatever --max-rejected allows"
        )
    if ev.rejected_share > max_rejected:
        return f"{head}; allowed {max_rejected:.2%} (--max-rejected)"
    return f"{head}: rejected requests miss every target, so {ev.failing_target or 'a target'} cannot be met"


def capacity_problem(cap: dict[str, Any], hardware: str) -> str | None:
    """Why one replica's ceilings (:func:`capacity_per_replica`) cannot size a fleet:
    a prefill or decode rate that is zero, or not finite (a step priced at 0 or at infinitely
    many seconds: the hardware entry's bandwidth or FLOP/s is vanishingly small or huge). None
    when both are positive finite numbers."""
    bad = [
        f"{phase} {cap[key]:.3g} tokens/s"
        for phase, key in (("prefill", "prefill_tokens_per_s"), ("decode", "decode_tokens_per_s"))
        if not (0.0 < cap[key] < math.inf)
    ]
    if not bad:
        return None
    return (
        f"skipped: a replica has zero or non-finite capacity ({', '.join(bad)}): check {hardware}'s "
        "memory_bandwidth_bytes_per_s and peak FLOP/s (its catalog entry or --hardware TOML)"
    )


def _seed(demand: dict[str, float], cap: dict[str, Any], max_replicas: int) -> int:
    """The search's analytic lower bound (demand over one replica's ceilings), at most
    ``max_replicas`` however large the ratio (an overflow to inf is not a count)."""
    need = max(
        demand["fresh_min_tokens_per_s"] / cap["prefill_tokens_per_s"],
        demand["output_tokens_per_s"] / cap["decode_tokens_per_s"],
    )
    if not need <= max_replicas:  # inf and NaN too
        return max_replicas
    return max(1, math.ceil(float(need)))


def ratio_split(total: int, ratio: tuple[int, int]) -> tuple[int, int]:
    """``total`` replicas (at least 2) split into (prefill, decode) as near ``ratio`` as whole
    replicas allow, at least one of each: prefill = total · p / (p + d) rounded half up, within
    [1, total − 1]."""
    p, d = ratio
    pre = min(max(1, math.floor(total * p / (p + d) + 0.5)), total - 1)
    return pre, total - pre


def disaggregated_seed(demand: dict[str, float], cap: dict[str, Any], ratio: tuple[int, int], max_replicas: int) -> int:
    """The disaggregated search's lower bound on the fleet's replicas: the prefill pool needs the
    window's fresh prefill over one replica's prefill ceiling and the decode pool its decode over
    the decode ceiling, each at least one replica, and their sum at least the smallest total
    whose split (:func:`ratio_split`) gives each pool its need; at most ``max_replicas``."""
    need_p = demand["fresh_min_tokens_per_s"] / cap["prefill_tokens_per_s"]
    need_d = demand["output_tokens_per_s"] / cap["decode_tokens_per_s"]
    if not (need_p + need_d <= max_replicas):  # inf and NaN too
        return max(2, max_replicas)
    want_p, want_d = max(1, math.ceil(float(need_p))), max(1, math.ceil(float(need_d)))
    total = max(2, want_p + want_d)
    while total < max_replicas:
        p, d = ratio_split(total, ratio)
        if p >= want_p and d >= want_d:
            break
        total += 1
    return min(total, max(2, max_replicas))


def capacity_per_replica(fleet: ResolvedFleet, mean_context: float) -> dict[str, Any]:
    """One replica's ceilings, priced by the fleet's own cost model (the tier its replays use:
    :meth:`pipeline.costmodel.model.CostModel.capacity`): fresh prefill tokens/s with full
    token-budget steps, and decode tokens/s at the largest batch its KV cache and max_num_seqs
    allow at ``mean_context``."""
    return fleet.cost_model.capacity(fleet.scheduler, mean_context)


def _demand(window: Window, fleet: ResolvedFleet) -> dict[str, float]:
    """Measured-window demand: output tokens/s, and fresh prefill tokens/s if every block seen
    before were still cached (an infinite prefix cache: a lower bound on prefill work)."""
    work = build_workload(window.requests, fleet, ReplayOptions(isolation=window.isolation), window.identity)
    work = work.explicit()
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


def min_replicas(
    check: Callable[[int], Evaluation],
    seed: int,
    max_replicas: int,
    grew: Callable[[int, int], bool] | None = None,
) -> tuple[int | None, str]:
    """Smallest n in [1, max_replicas] with ``check(n).meets``, assuming monotonicity; every
    answer n > 1 has been checked at n − 1 too. Returns (None, why) when no n qualifies.
    ``grew(a, b)``: whether going from a to b grew every part of the fleet (a disaggregated
    fleet's n + 1 replicas split by a ratio adds a replica to one pool at a time), so that a
    target that did not improve from a to b is a latency floor; default: always."""
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
            half = [
                k for k in cache if k <= m // 2 and cache[k].failing == cur.failing and (grew is None or grew(k, m))
            ]
            if cur.failing not in (None, OVERLOADED) and half:
                prev = cache[max(half)]
                gain = 1.0 - cur.worst_ratio / prev.worst_ratio if math.isfinite(prev.worst_ratio) else 1.0
                if gain < FLOOR_IMPROVEMENT:
                    return None, (
                        f"{cur.failing} stays {cur.achieved[cur.failing]:.4g} s at {prev.replicas} and "
                        f"{cur.replicas} replicas (limit x{cur.worst_ratio:.2f}): "
                        "a latency floor more replicas cannot lower"
                    )
            if m >= max_replicas:
                if cur.failing == OVERLOADED:
                    return None, f"{overload_note(cur)}: the fleet does not keep up even at {cur.replicas} replicas"
                return None, f"{cur.failing} misses its limit (x{cur.worst_ratio:.2f}) even at {cur.replicas} replicas"
            lo, step = m, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi, ""


def search_candidate(task: Task) -> CandidateResult:
    """Minimum replicas for one configuration, its sizing and cost. Runs in a worker process.
    A configuration whose replay cannot be run (its simulated span past the replay's limits, or a
    step time that overflows: absurd hardware values) is skipped with the reason, not the plan."""
    out = CandidateResult(candidate=task.candidate, fits=False, period_s=task.period_s)
    try:
        return _search_candidate(task, out)
    except (ResourceLimitError, OverflowError, FloatingPointError) as exc:
        out.replicas, out.sizing, out.cost_rows, out.skipped = None, {}, [], True
        out.evaluations.sort(key=lambda e: e.replicas)
        out.note = unreplayable_note(task.candidate.hardware, exc)
        return out


#: Hardware time constants no real GPU comes near (a kernel, a step's fixed overhead, a
#: collective's latency are micro- to milliseconds): past this, the entry names the key to check.
ABSURD_TIME_S = 1.0


def unreplayable_note(hardware: str, exc: BaseException) -> str:
    """Why a configuration on ``hardware`` was skipped when its replay could not run: the
    hardware entry (its file) and the keys whose values are past :data:`ABSURD_TIME_S`."""
    hw = load_hardware(hardware)
    where = f"{hw.path}" if hw.path else f"the catalog entry {hardware!r}"
    keys = {
        "[efficiency] step_overhead_s": hw.step_overhead_s,
        "[efficiency] min_kernel_s": hw.min_kernel_s,
        "[link] latency_s": hw.link_latency_s,
    }
    bad = [f"{k} = {v:.3g}" for k, v in keys.items() if not (0.0 <= v <= ABSURD_TIME_S)]
    if isinstance(exc, ResourceLimitError):
        why = str(exc).split(":", 1)[0]  # "this replay would cover about N simulated days, more than ..."
        why = why.split(", whatever", 1)[0]
    else:
        why = f"a step time is not a finite number ({type(exc).__name__}: {exc})"
    check = (
        f"check {', '.join(bad)} in {where}"
        if bad
        else f"check the step costs in {where} ([efficiency] step_overhead_s, min_kernel_s, efficiencies)"
    )
    return f"skipped: {hardware}'s replay cannot run: {why}; {check}"


def _search_candidate(task: Task, out: CandidateResult) -> CandidateResult:
    c = task.candidate
    skip = skip_reason(task.base, c.hardware, task.base_origin)
    if skip is not None:
        out.note, out.skipped = skip, True
        return out
    try:
        fleet = resolve(candidate_fleet(task.base, c), c.label)
        prefill = fleet
        if c.speculative is not None:
            fleet.accepted_tokens  # noqa: B018 (a pair without published acceptance: said here, not mid-search)
            if c.ratio is not None and c.speculative[0] not in MODEL_DRAFTERS:
                # the prefill pool loads the decode pool's drafter only when it is a model (as replay_pools does)
                prefill = resolve(replace(candidate_fleet(task.base, c), speculative=None), c.label)
    except ConfigError as exc:
        out.note = str(exc)
        if c.speculative is not None or c.offload is not None:  # not a misfit of the GPU: this mode was not tried
            out.note, out.skipped = f"skipped: {exc}", True
        return out
    out.fits = True
    out.gpus_per_replica = fleet.deployment.gpus * fleet.config.dp
    hw = load_hardware(c.hardware)
    out.usd_per_gpu_hour = task.usd_per_gpu_hour if task.usd_per_gpu_hour is not None else hw.price_usd_per_gpu_hour
    out.price_date = hw.price_date if task.usd_per_gpu_hour is None else "override"
    demand = _demand(task.window, fleet)
    cap = capacity_per_replica(fleet, demand["mean_context"])
    problem = capacity_problem(cap, c.hardware)
    if problem is not None:  # no replay could end (or a step takes no time): nothing to search
        out.note, out.skipped = problem, True
        return out
    out.seed = _seed(demand, cap, task.max_replicas)
    # The one replay the search can still choose: the smallest that meets the SLOs so far (the
    # answer is the smallest n that meets them). Keeping every replay held the window's results and
    # step log once per size tried: 12.6 GiB for one whole-day search of 300,000 requests.
    runs: dict[int, Replayed] = {}

    def keep(n: int, ev: Evaluation, rep: Replayed) -> None:
        if ev.meets and all(n < m for m in runs):
            runs.clear()
            runs[n] = rep

    def check(n: int) -> Evaluation:
        ev, run = evaluate(task.window, fleet, n, task.slo, task.max_rejected)
        if run.kv_offload is not None:
            ev = replace(ev, offload=offload_figures(run, task.window, ev))
        out.evaluations.append(ev)
        out.priced_by = run.cost_source
        keep(n, ev, Replayed.of(run))
        return ev

    if c.mode in DISAGGREGATED_MODES:
        assert c.ratio is not None
        ratio = c.ratio
        try:
            link = link_of_kind(task.link, "--link")
        except ConfigError as exc:
            out.note, out.skipped = f"skipped: {exc}", True
            return out
        if task.max_replicas < 2:
            out.note, out.skipped = "skipped: a disaggregated fleet needs 2 replicas at least (--max-replicas 1)", True
            return out
        out.seed = disaggregated_seed(demand, cap, ratio, task.max_replicas)

        def check_split(n: int) -> Evaluation:
            # the search's n counts from 1; the fleet has n + 1 replicas (one of each pool at least)
            total = n + 1
            ev, rep = evaluate_disaggregated(
                task.window, fleet, ratio_split(total, ratio), link, task.slo, task.max_rejected, prefill
            )
            out.evaluations.append(ev)
            out.priced_by = rep.cost_source
            keep(total, ev, rep)
            return ev

        def grew(a: int, b: int) -> bool:  # both pools larger at b + 1 replicas than at a + 1
            pa, pb = ratio_split(a + 1, ratio), ratio_split(b + 1, ratio)
            return pb[0] > pa[0] and pb[1] > pa[1]

        found, why = min_replicas(check_split, out.seed - 1, task.max_replicas - 1, grew)
        n = found + 1 if found is not None else None
    else:
        n, why = min_replicas(check, out.seed, task.max_replicas)
    out.evaluations.sort(key=lambda e: e.replicas)
    if n is None:
        out.note = rejection_note(out.evaluations[0], task.max_rejected, task.slo) if why == "rejected" else why
        return out
    out.replicas = n

    out.note = multi_node_warning(fleet) or out.note  # a replica across nodes: priced as one (optimistic)
    run = runs[n]
    ev = out.chosen
    assert ev is not None
    if task.window.kind == "day" and ev.period:
        # the replay is the day's traffic: priced over the period `cost` prices a replay of it
        # over (the arrivals, or the makespan of a fleet whose busiest replica fell behind)
        out.period_s = float(ev.period["period_s"])
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
        window_s=out.period_s,
        busy_gpu_s=min(cost.busy_gpu_s * scale, cost.gpus * out.period_s),
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
    if task.energy:  # the step log lives here: its energy a day, scaled as the busy GPU-time is
        busy_scale = day_cost.busy_gpu_s / cost.busy_gpu_s if cost.busy_gpu_s > 0 else 0.0
        out.energy = candidate_energy(run.cols, fleet, n * out.gpus_per_replica, busy_scale, out.period_s)
    return out


def window_cost(
    window: Window, run: Replayed, fleet: ResolvedFleet, replicas: int, usd_per_gpu_hour: float, price_date: str
) -> GpuCost:
    """The fleet's cost over the replayed span and its split over the measured traffic's tokens."""
    res, work = run.result, run.work
    ok = res.reject_reason == 0
    cols = run.cols
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


def sizing(window: Window, run: Replayed, replicas: int, cap: dict[str, Any], ev: Evaluation) -> dict[str, Any]:
    """Each resource against its own peak: the busiest minute's fresh prefill and decode tokens/s
    over the fleet's ceilings (its cost model's), the fullest replica's KV share, the SLO headroom; and which
    binds."""
    cols = run.cols
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
