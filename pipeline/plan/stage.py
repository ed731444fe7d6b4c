"""The ``plan`` stage: every configuration searched, ranked by $/day, written under
``STORE/plans/<plan_id>/``."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.catalog import HardwareSpec, load_hardware, load_model, weight_format
from pipeline.catalog.names import resolve_model_names
from pipeline.classify.accounting import day_identity
from pipeline.common import system
from pipeline.common.budget import current_limits
from pipeline.common.defaults import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    MAX_MEMORY_ENV,
    plan_default_hardware,
)
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.schemas import atomic_write_bytes, load_schema, write_parquet
from pipeline.common.tables import json_safe
from pipeline.common.units import format_bytes
from pipeline.economics.cost import (
    TokenTotals,
    api_cost_rows,
    check_gpu_price,
    load_prices,
    traffic_period_s,
)
from pipeline.ingest.project import default_fleet_path, find_project
from pipeline.ingest.store import SAFE_ID_RE, Store
from pipeline.plan.executors import run_local, run_ray
from pipeline.plan.modes import (
    MAX_RATIO_SIDE,
    check_link,
    check_modes,
    check_offload_gb,
    check_offload_kind,
    check_offload_store_gb,
    frontier,
    parse_speculative,
    rank_key,
    tier_text,
)
from pipeline.plan.objective import (
    OBJECTIVES,
    STACK_FLAGS,
    StackPricing,
    candidate_stack,
    check_objective,
    check_stack_options,
    energy_doc,
    stack_doc,
    stack_pricing,
)
from pipeline.plan.search import (
    DISAGGREGATED_MODES,
    Candidate,
    CandidateResult,
    Task,
    candidate_ep,
    candidate_fleet,
    skip_reason,
)
from pipeline.plan.window import Window, select_window
from pipeline.replay.autoscale import AutoscaleSettings
from pipeline.replay.fleet import MAX_ENGINES, FleetConfig, load_fleet, parse_fleet, resolve
from pipeline.replay.limits import LOG_ROW_BYTES, REQUEST_BYTES, ROWS_PER_REQUEST
from pipeline.replay.run import ReplayOptions, run_replay, summarize
from pipeline.replay.slo import (
    Slo,
    day_projection,
    load_slo_presets,
    parse_slo,
    traffic_span,
)

#: Largest --tp tried: a bound against an absurd catalog ``gpus_per_node`` (the plan tables
#: store tp in 4 bytes; tensor parallelism spans one node, roofline.Deployment).
MAX_TP = 1024


@dataclass(frozen=True)
class PlanOptions:
    model: str
    slo: str = "chat"
    fleet_path: str | None = None
    #: Default: the catalog's ``default_hardware`` (pipeline/catalog/plan.toml).
    hardware: tuple[str, ...] = field(default_factory=plan_default_hardware)
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
    #: Serving modes searched (pipeline/plan/modes.py); the default is the plan it always was.
    modes: tuple[str, ...] = ("colocated",)
    #: disaggregated: prefill:decode replica ratios tried, and the link kind between the pools
    pd_ratios: tuple[tuple[int, int], ...] = ((1, 3), (1, 2), (1, 1), (2, 1), (3, 1))
    link: str = "rdma"
    #: speculative: (method, k); the acceptance is the catalog's published figure for the pair
    speculative: tuple[str, int] = ("eagle3", 3)
    #: offload: the lower KV tier's GB (per replica for cpu, for the pool for shared), each tried,
    #: and its kind (pipeline/catalog/offload.toml)
    offload_gb: tuple[float, ...] = (256.0,)
    offload_kind: str = "cpu"
    #: offload, three levels: GB of a store shared by the pool below each cpu tier, each tried
    #: beside the cpu tier alone (empty: the cpu tier alone)
    offload_store_gb: tuple[float, ...] = ()
    #: Price the chosen configuration both ways: static (its peak-sized replicas all day) and
    #: autoscaled by the base fleet's [autoscale] policy up to those replicas, over the whole day.
    autoscale: bool = False
    #: What the passing configuration is chosen by (pipeline/plan/objective.py): None ranks by the
    #: GPUs' $/day and writes the plan it always did; usd, energy or gpus add each configuration's
    #: cost stack and energy a day, and choose by the objective.
    objective: str | None = None
    #: The cost stack's options over the base fleet's [cost] (objective.STACK_OPTIONS: rooftrace
    #: cost's), as (key, value) pairs; only with an objective.
    cost_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        # a name given twice is one configuration (as --tp's numbers are): one replay, one row
        object.__setattr__(self, "hardware", tuple(dict.fromkeys(self.hardware)))
        object.__setattr__(self, "precision", tuple(dict.fromkeys(self.precision)))
        # -0 is a price of 0: no "$-0/day" (x + 0.0 turns -0.0 into 0.0 and leaves the rest)
        object.__setattr__(self, "gpu_prices", tuple((hw, usd + 0.0) for hw, usd in self.gpu_prices))
        if self.executor not in ("local", "ray"):
            raise ConfigError(f"--executor must be local or ray, got {self.executor!r}")
        if not 1 <= self.max_replicas <= MAX_ENGINES:
            raise ConfigError(f"--max-replicas must be in 1..{MAX_ENGINES:,}, got {self.max_replicas:,}")
        if not self.hardware or not self.tp:
            raise ConfigError("give at least one --hardware and one --tp")
        if not 0.0 <= self.max_rejected <= 1.0:
            raise ConfigError(f"--max-rejected must be between 0% and 100%, got {self.max_rejected:.4g}")
        # finite: plan.json records them, and JSON has no NaN or Infinity
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ConfigError(f"--window-s must be a finite number of seconds > 0, got {self.window_s!r}")
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ConfigError(f"--warmup-s must be a finite number of seconds >= 0, got {self.warmup_s!r}")
        object.__setattr__(self, "modes", check_modes(self.modes))
        if not self.pd_ratios or any(
            not (isinstance(p, int) and isinstance(d, int) and 1 <= p <= MAX_RATIO_SIDE and 1 <= d <= MAX_RATIO_SIDE)
            for p, d in self.pd_ratios
        ):
            raise ConfigError(f"--pd-ratios: each side a whole number in 1..{MAX_RATIO_SIDE}, got {self.pd_ratios!r}")
        check_link(self.link)
        parse_speculative(f"{self.speculative[0]}:{self.speculative[1]}")
        object.__setattr__(self, "offload_gb", check_offload_gb(self.offload_gb))
        check_offload_kind(self.offload_kind)
        object.__setattr__(self, "offload_store_gb", check_offload_store_gb(self.offload_store_gb, self.offload_kind))
        if self.objective is not None:
            check_objective(self.objective)
        object.__setattr__(self, "cost_options", check_stack_options(self.cost_options))
        if self.cost_options and self.objective is None:
            given = ", ".join(STACK_FLAGS[k] for k, _ in self.cost_options)
            raise ConfigError(
                f"{given}: the cost stack is built for --objective (usd, energy or gpus); give one, "
                "e.g. --objective usd to choose by the full cost"
            )

    @property
    def modes_only_colocated(self) -> bool:
        return self.modes == ("colocated",)

    def record(self, drop: tuple[str, ...] = ()) -> dict[str, Any]:
        """The options as plan.json and the plan id record them: a colocated-only plan leaves the
        modes' options out, so its id and files are those of a plan before --modes existed (and a
        plan without --autoscale leaves it out)."""
        skip = set(drop) | (set(MODE_OPTIONS) if self.modes_only_colocated else set())
        if "offload" not in self.modes:  # (its options: the id and files of a plan before it existed)
            skip |= set(OFFLOAD_OPTIONS)
        if not self.offload_store_gb:  # (no store: the id and files of a plan before three levels)
            skip.add("offload_store_gb")
        if not self.autoscale:  # (--autoscale off: the id and files of a plan before it existed)
            skip.add("autoscale")
        if self.objective is None:  # a plan without --objective: its id and files as before
            skip |= set(OBJECTIVE_OPTIONS)
        return {k: v for k, v in asdict(self).items() if k not in skip}


#: PlanOptions' fields of ``--modes`` and its options.
MODE_OPTIONS = ("modes", "pd_ratios", "link", "speculative", "offload_gb", "offload_kind", "offload_store_gb")
#: PlanOptions' fields of the offload mode (recorded only by a plan whose --modes has offload).
OFFLOAD_OPTIONS = ("offload_gb", "offload_kind", "offload_store_gb")
#: PlanOptions' fields of ``--objective`` and the cost stack's options.
OBJECTIVE_OPTIONS = ("objective", "cost_options")


@dataclass(frozen=True)
class PlanResult:
    plan_id: str
    plan_dir: Path
    doc: dict[str, Any]
    table: pa.Table


def _with_model(base: FleetConfig, name: str) -> FleetConfig:
    """``base`` serving model ``name``: a max_model_len past that model's maximum context becomes
    the maximum (vLLM would refuse it; the base fleet's was set for another model), and a dense
    model runs ep = 1 (expert parallelism has no experts to shard)."""
    cfg = replace(base, model=name)
    spec = load_model(name)
    longest = spec.max_position_embeddings
    if cfg.engine.max_model_len is not None and 0 < longest < cfg.engine.max_model_len:
        cfg = replace(cfg, engine=replace(cfg.engine, max_model_len=longest))
    if cfg.ep > 1 and not spec.is_moe:
        cfg = replace(cfg, ep=1)
    return cfg


def _base_fleet(opts: PlanOptions) -> tuple[FleetConfig, str]:
    # read without load_fleet's profile check: the plan replaces the hardware, and a candidate on a
    # GPU without the measured profile a cost_model = "measured" base asks for is skipped, with
    # its reason (search.skip_reason), not the whole plan
    if opts.fleet_path is not None:
        base = load_fleet(opts.fleet_path, check_profile=False)
        return _with_model(base, opts.model), opts.fleet_path
    path = default_fleet_path()
    if path.exists():
        base = load_fleet(path, check_profile=False)
        return _with_model(base, opts.model), str(path)
    return parse_fleet({"name": "plan", "model": opts.model, "hardware": opts.hardware[0]}, "defaults"), "defaults"


def plan_notes(opts: PlanOptions, base: FleetConfig, origin: str) -> list[str]:
    """What the plan changed or left out of the base fleet, said once for the whole plan (each
    skipped configuration's row carries its own note too)."""
    notes = []
    if base.ep > 1:
        ranks = ", ".join(f"tp {tp}: ep {candidate_ep(base, tp)}" for tp in sorted(set(opts.tp)))
        notes.append(
            f"ep follows tp x dp: the base fleet ({origin}) runs expert parallel (ep = {base.ep}, dp = {base.dp}), "
            f"so each configuration shards the experts over its own tp x dp ranks, as vLLM's "
            f"enable_expert_parallel does ({ranks})"
        )
    if opts.autoscale and "offload" in opts.modes:
        notes.append(
            "--autoscale prices the cheapest configuration without an offload tier: [kv_offload] with [autoscale] "
            "is not modelled yet (the tier's pre-pass replays the day on a fixed fleet)"
        )
    skipped = [hw for hw in dict.fromkeys(opts.hardware) if skip_reason(base, hw, origin) is not None]
    cal = base.stack_calibration
    if cal is not None and skipped:
        notes.append(
            f"skipped {', '.join(skipped)}: the base fleet's calibration ({cal.origin or origin}) was learnt on "
            f"{cal.hardware} ({cal.cost_tier} tier) and applies to that GPU only; plan the others from a base "
            "fleet without calibration_file, or calibrate each GPU's fleet from its own logs"
        )
        return notes
    if base.cost_model == "measured" and skipped:
        notes.append(
            f"skipped {', '.join(skipped)}: the base fleet ({origin}) says cost_model = 'measured' and "
            f"{'these have' if len(skipped) > 1 else 'it has'} no measured profile; give cost_model = 'auto' "
            "to plan them on the size-aware prior (NVIDIA) or the roofline"
        )
    return notes


def candidates(opts: PlanOptions, base: FleetConfig) -> list[Candidate]:
    # unknown names fail here, with the catalog's message
    hardware = tuple(dict.fromkeys(opts.hardware))  # each once, in the order given
    specs = [load_hardware(hw) for hw in hardware]
    _check_tp(opts.tp, specs)
    _check_gpu_prices(opts.gpu_prices, hardware)
    dtypes = tuple(dict.fromkeys(opts.precision)) or (base.weight_dtype,)
    for dt in dtypes:
        weight_format(dt)  # unknown dtypes fail here, before a name is built from them
    if base.speculative is not None and not opts.modes_only_colocated:
        raise ConfigError(
            "--modes: the base fleet sets [speculative], so colocated and disaggregated would not be what they say; "
            "plan from a base fleet without [speculative] (--modes speculative compares speculation on and off)"
        )
    if base.kv_offload is not None and not opts.modes_only_colocated:
        raise ConfigError(
            "--modes: the base fleet sets [kv_offload], so colocated and the other modes would not be what they say; "
            "plan from a base fleet without [kv_offload] (--modes offload compares the tier on and off)"
        )
    out = []
    for hw in hardware:
        for tp in sorted(set(opts.tp)):
            for dt in dtypes:
                for mode in opts.modes:
                    if mode == "disaggregated":
                        out += [Candidate(hw, tp, dt, mode, ratio=r) for r in opts.pd_ratios]
                    elif mode == "disaggregated-speculative":  # the decode pool speculates
                        out += [
                            Candidate(hw, tp, dt, mode, ratio=r, speculative=opts.speculative) for r in opts.pd_ratios
                        ]
                    elif mode == "speculative":
                        out.append(Candidate(hw, tp, dt, mode, speculative=opts.speculative))
                    elif mode == "offload":  # each tier alone, then over each store (three levels)
                        for gb in opts.offload_gb:
                            tier = (opts.offload_kind, gb)
                            out.append(Candidate(hw, tp, dt, mode, offload=tier))
                            for store in opts.offload_store_gb:
                                out.append(Candidate(hw, tp, dt, mode, offload=tier, offload_store=store))
                    else:
                        out.append(Candidate(hw, tp, dt))
    return out


def _check_tp(tps: Sequence[int], specs: Sequence[HardwareSpec]) -> None:
    """Every --tp within one node of some --hardware (tensor parallelism does not cross nodes,
    roofline.Deployment): a larger one could fit no configuration, and would not fit the plan
    tables' 4-byte column either."""
    widest = max(specs, key=lambda h: h.gpus_per_node)
    most = min(widest.gpus_per_node, MAX_TP)
    for tp in tps:
        if not 1 <= tp <= most:
            names = ", ".join(f"{h.name} {h.gpus_per_node}" for h in specs)
            raise ConfigError(
                f"--tp {tp}: must be between 1 and {most}, the GPUs of one node of the widest --hardware "
                f"(GPUs per node: {names})"
            )


def _check_gpu_prices(prices: Sequence[tuple[str, float]], hardware: Sequence[str]) -> None:
    """Each --gpu-price names a --hardware being planned, once: a price nothing uses is a typo."""
    seen: set[str] = set()
    for name, price in prices:
        check_gpu_price(price, f"--gpu-price {name}={price!r}")
        if name not in hardware:
            raise ConfigError(
                f"--gpu-price {name}: no --hardware named {name!r} in this plan; planned: {', '.join(hardware)}"
            )
        if name in seen:
            raise ConfigError(f"--gpu-price {name}: given more than once")
        seen.add(name)


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


def traffic_rows(
    every: pl.DataFrame, model: str, traffic_model: str | None, date: str
) -> tuple[pl.DataFrame, dict[str, int]]:
    """The requests a plan for catalog model ``model`` sizes, and how many of each logged name.

    Without ``traffic_model`` (--traffic-model): every row whose logged name resolves to ``model``
    (its id, Hugging Face id, a provider prefix, an -Instruct or quantized copy, a [models] alias:
    pipeline/catalog/names.py), and the rows logged without a model (``unknown``), which replay
    counts as the fleet's too. With it: the rows logged with exactly that value, or with a name
    resolving to the same catalog model as it; ``*`` is every row."""
    counts = every.group_by("model").len().sort(["len", "model"], descending=[True, False])
    logged = [(str(m), int(n)) for m, n in counts.iter_rows()]
    if traffic_model == "*":
        return every, dict(logged)
    aliases = find_project().models
    names = resolve_model_names((m for m, _ in logged), aliases=aliases)
    if traffic_model is None:
        target: str | None = load_model(model).name
        keep = {m for m, _ in logged if m == "unknown" or names[m].model == target}
    else:
        target = resolve_model_names([traffic_model], aliases=aliases)[traffic_model].model
        keep = {m for m, _ in logged if m == traffic_model or (target is not None and names[m].model == target)}
    req = every.filter(pl.col("model").is_in(sorted(keep)))
    if req.height == 0:
        want = traffic_model or model
        have = [m if names[m].model in (None, m) else f"{m} (= {names[m].model})" for m, _ in logged]
        unsure = [names[m].describe() for m, _ in logged if names[m].how == "ambiguous"]
        raise RooftraceError(
            f"no requests for model {want!r} on {date}; models there: {have} "
            f"(use --traffic-model, or map a logged name to {model} under [models] in rooftrace.toml)"
            + (f"; {'; '.join(unsure)}" if unsure else "")
        )
    return req, {m: n for m, n in logged if m in keep}


def plan(store: Store, opts: PlanOptions, progress: Callable[[str], None] | None = None) -> PlanResult:
    """Search every configuration, rank by $/day, write ``STORE/plans/<plan_id>/``."""
    load_model(opts.model)
    slo = parse_slo(opts.slo)
    base, base_origin = _base_fleet(opts)
    # the search sizes static fleets; an [autoscale] policy prices the chosen one (--autoscale)
    policy, base = base.autoscale, replace(base, autoscale=None)
    if opts.autoscale and policy is None:
        raise ConfigError(
            f"--autoscale prices the chosen configuration with the base fleet's [autoscale] policy: {base_origin} "
            "has none (name one with --fleet; fleets/autoscale.toml is an example)"
        )
    cands = candidates(opts, base)
    if not store.root.is_dir():  # a mistyped --store, not an empty store ("no requests ingested yet")
        raise RooftraceError(
            f"store folder {store.root} does not exist: check --store (or $ROOFTRACE_STORE); "
            "`rooftrace ingest --store FOLDER` creates one"
        )
    store.check_unlocked()  # another run writing the store: said before the search, not after it
    date = store.resolve_date(opts.date)
    every = store.read_requests(date)
    want = opts.traffic_model or opts.model
    req, traffic_names = traffic_rows(every, opts.model, opts.traffic_model, date)
    window = select_window(req, opts.window, opts.window_s, opts.warmup_s)
    window = replace(window, identity=day_identity(store, date, every))
    day = _day_totals(req)
    pricing = None
    if opts.objective is not None:  # a bad [cost] or option: said before the search, not after it
        pricing = stack_pricing(
            base, base_origin if base_origin != "defaults" else None, opts.cost_options, base_origin
        )
    arrivals = req.get_column("arrival").dt.epoch("us").to_numpy().astype(np.float64) / 1e6
    period = traffic_period_s(arrivals)
    overrides = dict(opts.gpu_prices)
    prices = load_prices(list(opts.price_files) or None)
    tasks = [
        Task(
            c,
            base,
            window,
            slo,
            opts.max_replicas,
            day,
            overrides.get(c.hardware),
            opts.max_rejected,
            period,
            base_origin,
            opts.link,
            energy=opts.objective is not None,
        )
        for c in cands
    ]
    notes = plan_notes(opts, base, base_origin)
    if progress:
        w = window.info()
        progress(
            f"plan {opts.model}: {len(tasks)} configurations, window {w['kind']} of {w['measured_requests']:,} "
            f"requests (+{w['replayed_requests'] - w['measured_requests']:,} warm-up), SLO {slo.name}"
        )
        for note in notes:
            progress(f"note: {note}")
        if want != "*" and list(traffic_names) != [want]:  # read past a spelling: said, with the counts
            shown = ", ".join(f"{n:,} logged as {m!r}" for m, n in traffic_names.items())
            progress(f"note: traffic for {want}: {shown}")
    t0 = time.perf_counter()
    if opts.executor == "ray":
        results = run_ray(tasks, opts.ray_address, progress)
    else:
        jobs, capped = local_jobs(opts.jobs, len(tasks), window.requests.height)
        if capped is not None and progress:
            progress(f"note: {capped}")
        results = run_local(tasks, jobs, progress)
    wall = time.perf_counter() - t0

    # (a disaggregated configuration is two pools: --autoscale prices the cheapest one-pool one)
    # (an offload one's [kv_offload] is not modelled with [autoscale]: the cheapest one without a tier)
    chosen_early = _chosen([r for r in results if r.candidate.mode not in (*DISAGGREGATED_MODES, "offload")])
    scaled = None
    if opts.autoscale and policy is not None and chosen_early is not None:
        if progress:
            progress(f"--autoscale: replaying the day on {chosen_early.candidate.label} under its [autoscale] policy")
        scaled = autoscaled_price(chosen_early, base, policy, req, slo, window)
    plan_id = _plan_id(date, opts, slo, base, req)
    if pricing is not None:
        price_candidates(results, pricing, overrides)
    table, search = _tables(plan_id, date, opts, slo, window, results)
    chosen = _chosen(results, opts.objective)
    fronts = None if opts.modes_only_colocated else frontier(results, opts.modes)
    plan_dir = store.plan_dir(plan_id)
    api_rows = _api_rows(plan_id, chosen, prices) if chosen is not None else []
    configurations = _with_overload(table.to_pylist(), results)
    chosen_doc = _chosen_doc(chosen) if chosen is not None else None
    if pricing is not None:  # --objective: each configuration's cost stack and energy a day
        configurations = _with_objective(configurations, results)
        if chosen_doc is not None and chosen is not None:
            chosen_doc |= {
                "cost_stack": chosen.stack or None,
                "energy": chosen.energy or None,
                "stack_usd_per_period": self_hosted_usd(chosen),
            }
    doc = {
        "plan_id": plan_id,
        "date": date,
        "model": opts.model,
        "traffic_model": want,
        "traffic_names": traffic_names,
        "slo": slo.to_dict(),
        "slo_presets": {k: v.to_dict() for k, v in load_slo_presets().items()},
        "window": window.info(),
        "base_fleet": {"origin": base_origin, **base.to_dict()},
        "notes": notes,
        "options": opts.record(("jobs", "ray_address")),
        "day_tokens": day,
        "period_s": period,
        "period": traffic_span(period),
        "day_projection": day_projection(period),
        "configurations": configurations,
        "chosen": chosen_doc,
        "api_equivalent": api_rows,
        **({"autoscale": scaled} if scaled is not None else {}),
    }
    if pricing is not None and opts.objective is not None:
        doc["objective"] = objective_doc(opts.objective, results, pricing)
    if fronts is not None:
        doc["frontier"] = fronts
    with store.lock():
        write_parquet(table, plan_dir / "plan.parquet", "plan")
        write_parquet(search, plan_dir / "search.parquet", "plan_search")
        costs = store.cost_dir(plan_id)
        if chosen is not None:
            write_parquet(_gpu_cost_table(plan_id, chosen), costs / "gpu_cost.parquet", "plan_gpu_cost")
            write_parquet(pa.Table.from_pylist(api_rows), costs / "api_cost.parquet", "plan_api_cost")

        text = json.dumps(json_safe(doc), indent=2, sort_keys=True, default=str, allow_nan=False)
        atomic_write_bytes(plan_dir / "plan.json", text.encode())
    doc["search_wall_s"] = wall
    doc["replays"] = sum(len(r.evaluations) for r in results)
    if chosen is None:
        doc["advice"] = no_fit_advice(results, base, base_origin, opts.model, opts.max_rejected, slo)
    return PlanResult(plan_id, plan_dir, doc, table)


#: Memory of one local worker process of a plan beyond the replays' requests: its own Python
#: interpreter, the pipeline's imports, the jit engine loaded from its disk cache, and the
#: search's replays of a small window. Measured (VmHWM read in each spawned worker after
#: search_candidate, 2 workers): 290-383 MiB on windows of 210-4,464 requests (llama-3.1-8b on
#: h100-sxm / h200 / a100-80gb-sxm, tp 1-8, 1-2 replicas); 373-495 MiB on the whole Azure
#: sample day (19,366 requests), the most after 7 replays up to 64 replicas.
WORKER_BYTES = 448 * 1024**2


def worker_bytes(window_requests: int) -> int:
    """Estimated peak of one local worker searching configurations on a window of
    ``window_requests`` requests: :data:`WORKER_BYTES` plus the replay estimate's own per-request
    bytes (pipeline/replay/limits.py: the request arrays and tables, and the jit engine's step log)."""
    return WORKER_BYTES + window_requests * (REQUEST_BYTES + ROWS_PER_REQUEST * LOG_ROW_BYTES)


def local_jobs(requested: int | None, configurations: int, window_requests: int) -> tuple[int, str | None]:
    """Worker processes for ``configurations`` searched locally: ``requested`` (--jobs), else one
    per CPU, at most one per configuration, and at most as many as the memory limit holds
    (``$ROOFTRACE_MAX_MEMORY``, else half the physical memory: every worker checks its replays
    against the limit alone, so the limit is shared out here). Returns the count and, when the
    memory limit lowered it, a note saying so."""
    cpus = os.cpu_count() or 1
    jobs = min(requested or cpus, max(configurations, 1))
    limits = current_limits()
    if jobs <= 1 or limits.max_memory is None:
        return jobs, None
    each = worker_bytes(window_requests)
    fits = max(1, (limits.max_memory - system.process_rss()) // each)
    if fits >= jobs:
        return jobs, None
    asked = f"--jobs {requested}" if requested else f"--jobs (default: {cpus} CPUs)"
    return int(fits), (
        f"{asked} capped at {fits} worker process{'es' if fits > 1 else ''} by memory: each needs about "
        f"{format_bytes(each)} (its interpreter and the replays of the {window_requests:,}-request window), and "
        f"together they stay within the limit of {format_bytes(limits.max_memory)} ({limits.memory_origin}); "
        f"raise it with ${MAX_MEMORY_ENV} for more"
    )


def rejections_acceptable(results: Sequence[CandidateResult], max_rejected: float, slo: Slo | None) -> bool:
    """Whether a larger ``--max-rejected`` could change the outcome: some configuration failed on
    rejections past ``max_rejected`` that every SLO target's percentile still tolerates (a
    rejected request misses every target, so more than 1 % rejected misses a p99 target whatever
    --max-rejected says). True when ``slo`` is not known."""
    if slo is None:
        return True
    tolerance = min(1.0 - t.percentile / 100.0 for t in slo.targets)
    return any(
        r.replicas is None
        and r.evaluations
        and r.evaluations[0].failing == "rejected"
        and max_rejected < r.evaluations[0].rejected_share <= tolerance
        for r in results
    )


def no_fit_advice(
    results: Sequence[CandidateResult],
    base: FleetConfig,
    origin: str,
    model: str,
    max_rejected: float = 0.0,
    slo: Slo | None = None,
) -> str:
    """What to change when no configuration meets the SLO. Requests longer than max_model_len
    are rejected whatever the hardware, TP or replica count: then the base fleet's
    ``[engine] max_model_len`` (up to the model's maximum), not the search, is what to change.
    ``--max-rejected`` is offered only where a larger one could change the outcome
    (:func:`rejections_acceptable`)."""
    accept = rejections_acceptable(results, max_rejected, slo)
    general = "widen --hardware/--tp, raise --max-replicas" + (
        ", or accept rejections with --max-rejected" if accept else ""
    )
    too_long = [
        r
        for r in results
        if r.replicas is None and r.evaluations and r.evaluations[0].rejected_by_reason.get("exceeds_max_model_len")
    ]
    if not too_long:
        return general
    longest = load_model(model).max_position_embeddings
    current = base.engine.max_model_len or longest
    which = f"{len(too_long)} of {len(results)} configurations reject requests longer than max_model_len"
    if longest > 0 and current < longest:
        where = f"the base fleet ({origin})" if origin != "defaults" else "a base fleet given with --fleet"
        return (
            f"{which} {current:,} at any replica count: raise [engine] max_model_len in {where} up to "
            f"{model}'s maximum of {longest:,} tokens"
            + (", or accept those rejections with --max-rejected" if accept else "")
        )
    return (
        f"{which} ({model}'s maximum context, {current:,} tokens) at any replica count: no fleet of this model "
        "serves them; "
        + ("accept those rejections with --max-rejected, or plan" if accept else "plan")
        + " a model with a longer context"
    )


def _plan_id(date: str, opts: PlanOptions, slo: Slo, base: FleetConfig, req: pl.DataFrame) -> str:
    h = hashlib.sha256()
    keep = opts.record(("jobs", "executor", "ray_address"))
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


def _chosen(results: Sequence[CandidateResult], objective: str | None = None) -> CandidateResult | None:
    ok = [r for r in results if r.replicas is not None]
    if not ok:
        return None
    return min(ok, key=ranking(objective))


def ranking(objective: str | None) -> Callable[[CandidateResult], tuple[Any, ...]]:
    """The sort key of passing configurations: the plan's own (:func:`rank_key`: $/day, the simpler
    mode, p99 TTFT, the label) without an objective; with one, the objective's figure first
    (the stack's $/day, GPU kWh a day with a GPU without a power model last, or GPUs), then that."""
    if objective is None:
        return rank_key

    def key(r: CandidateResult) -> tuple[Any, ...]:
        if objective == "usd":
            first: tuple[Any, ...] = (r.stack.get("usd_per_day", math.inf),)
        elif objective == "energy":
            kwh = r.energy.get("gpu_kwh_per_day")
            first = (kwh is None, kwh if kwh is not None else 0.0)
        else:
            first = ((r.replicas or 0) * r.gpus_per_replica,)
        return (*first, *rank_key(r))

    return key


def _stack_pools(r: CandidateResult) -> list[tuple[str | None, int]]:
    """A passing configuration's pools for its stack: (None, replicas), or a disaggregated fleet's
    prefill and decode pools (N+k spares each)."""
    ev = r.chosen
    pools = ev.pools if ev is not None else {}
    if r.candidate.mode in DISAGGREGATED_MODES and pools.get("prefill_replicas"):
        return [("prefill", int(pools["prefill_replicas"])), ("decode", int(pools["decode_replicas"]))]
    return [(None, r.replicas or 0)]


def price_candidates(results: Sequence[CandidateResult], pricing: StackPricing, overrides: dict[str, float]) -> None:
    """Each passing configuration's energy (facility kWh and electricity at the base fleet's
    [energy]) and cost stack a day (pipeline/plan/objective.py), set on it for the ranking."""
    for r in results:
        if r.replicas is None:
            continue
        r.energy = energy_doc(r.energy, pricing.energy)
        hw, override = r.candidate.hardware, overrides.get(r.candidate.hardware)
        stack = candidate_stack(pricing, hw, _stack_pools(r), r.gpus_per_replica, override, r.energy, r.period_s)
        r.stack = stack_doc(stack, pricing, hw, override)


def objective_columns(r: CandidateResult, objective: str) -> dict[str, Any]:
    """A plan row's --objective columns (optional columns of the ``plan`` schema)."""
    return {
        "objective": objective,
        "stack_usd_per_day": r.stack.get("usd_per_day"),
        "gpu_kwh_per_day": r.energy.get("gpu_kwh_per_day"),
        "facility_kwh_per_day": r.energy.get("facility_kwh_per_day"),
    }


def _with_objective(rows: list[dict[str, Any]], results: Sequence[CandidateResult]) -> list[dict[str, Any]]:
    by_label = {r.candidate.label: r for r in results}
    return [
        {**row, "cost_stack": by_label[row["config"]].stack or None, "energy": by_label[row["config"]].energy or None}
        for row in rows
    ]


def _brief(r: CandidateResult) -> str:
    gpus = (r.replicas or 0) * r.gpus_per_replica
    kwh = r.energy.get("gpu_kwh_per_day")
    energy = f"{kwh:,.1f} kWh/day" if kwh is not None else "no power model"
    return (
        f"{r.replicas}x {r.candidate.label} ({gpus} GPU{'s' if gpus != 1 else ''}, "
        f"${r.stack.get('usd_per_day', 0.0):,.0f}/day, {energy})"
    )


def objective_doc(objective: str, results: Sequence[CandidateResult], pricing: StackPricing) -> dict[str, Any]:
    """plan.json's ``objective``: what chose, the stack's inputs, the winner by each objective
    and, in words, what the chosen configuration gives and costs against the others' winners."""
    ok = [r for r in results if r.replicas is not None]
    best = {name: min(ok, key=ranking(name)).candidate.label for name in OBJECTIVES} if ok else {}
    out: dict[str, Any] = {"name": objective, "pricing": pricing.to_dict(), "best_by": best, "verdict": None}
    if not ok:
        return out
    by_label = {r.candidate.label: r for r in ok}
    won = by_label[best[objective]]
    parts = [f"chosen by {objective}: {_brief(won)}"]
    others: dict[str, list[str]] = {}  # another winner, and the objectives it wins by
    for name in OBJECTIVES:
        if best[name] != won.candidate.label:
            others.setdefault(best[name], []).append(name)
    for label, names in others.items():
        other = by_label[label]
        d_usd = won.stack["usd_per_day"] - other.stack["usd_per_day"]
        k_won, k_other = won.energy.get("gpu_kwh_per_day"), other.energy.get("gpu_kwh_per_day")
        d_kwh = f"{k_won - k_other:+,.1f} kWh/day" if k_won is not None and k_other is not None else "kWh n/a"
        d_gpu = (won.replicas or 0) * won.gpus_per_replica - (other.replicas or 0) * other.gpus_per_replica
        parts.append(
            f"against the best by {' and '.join(names)}, {_brief(other)}: {d_usd:+,.2f} $/day, {d_kwh}, {d_gpu:+d} GPUs"
        )
    out["verdict"] = "; ".join(parts)
    return out


def autoscaled_price(
    r: CandidateResult, base: FleetConfig, policy: AutoscaleSettings, day: pl.DataFrame, slo: Slo, window: Window
) -> dict[str, Any]:
    """The chosen configuration priced both ways over the day: static (its ``r.replicas``, sized on
    the plan's window, all the period of record) and autoscaled (the whole day replayed under
    ``policy`` with ``max_replicas`` = those replicas: the GPU-hours provisioned), with the
    autoscaled day's SLO verdict."""
    peak = int(r.replicas or 1)
    lo = min(policy.min_replicas, peak)
    pol = replace(
        policy,
        min_replicas=lo,
        max_replicas=peak,
        schedule=tuple((h, min(max(n, lo), peak)) for h, n in policy.schedule),
        initial_replicas=None if policy.initial_replicas is None else min(policy.initial_replicas, peak),
    )
    cfg = replace(candidate_fleet(base, r.candidate), replicas=peak, autoscale=pol)
    fleet = resolve(cfg, f"{r.candidate.label} (--autoscale)")
    run = run_replay(day, fleet, ReplayOptions(isolation=window.isolation), identity=window.identity)
    summary = summarize(run, slo)
    auto = summary["autoscale"]
    price = r.usd_per_gpu_hour
    verdict = summary["health"]["verdict"] or {}
    return {
        "config": r.candidate.label,
        "policy": pol.to_dict(),
        "period_s": auto["period_s"],
        "static_replicas": peak,
        "static_gpu_hours": auto["static_gpu_hours"],
        "static_usd": auto["static_gpu_hours"] * price + 0.0,
        "autoscaled_gpu_hours": auto["provisioned_gpu_hours"],
        "autoscaled_usd": auto["provisioned_gpu_hours"] * price + 0.0,
        "usd_per_gpu_hour": price,
        "scale_up_delay_s": auto["scale_up_delay_s"],
        "converged": auto["converged"],
        "passes": auto["passes"],
        "autoscaled_meets_slo": bool(verdict.get("passed", False)),
        "autoscaled_targets": verdict.get("targets", []),
        "autoscaled_ttft_p99_s": summary["ttft_s"].get("p99"),
        # when and why a missed TTFT target was missed (minutes after the window's first arrival)
        "autoscaled_slo_miss": (auto.get("slo_miss") or {}).get("line"),
    }


def _usd_per_day(r: CandidateResult) -> float:
    """The provisioned fleet for 24 hours (what ranks configurations); never -0 (a --gpu-price of
    -0 is a price of 0)."""
    return (r.replicas or 0) * r.gpus_per_replica * r.usd_per_gpu_hour * 24.0 + 0.0


def _usd_per_period(r: CandidateResult) -> float:
    """The provisioned fleet over the period of record (the traffic's span), as `rooftrace cost`
    states a run's cost: self-hosted and API figures of one traffic over one period."""
    return (r.replicas or 0) * r.gpus_per_replica * r.usd_per_gpu_hour * r.period_s / 3600.0 + 0.0


def _class_per_million(r: CandidateResult) -> dict[str, float | None]:
    return {row["token_class"]: row["all_in_usd_per_million_tokens"] for row in r.cost_rows}


def _tables(
    plan_id: str, date: str, opts: PlanOptions, slo: Slo, window: Window, results: Sequence[CandidateResult]
) -> tuple[pa.Table, pa.Table]:
    feasible = [r for r in results if r.replicas is not None]
    ranked = sorted(feasible, key=ranking(opts.objective))
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
                "priced_by": r.priced_by or None,
                **({} if opts.modes_only_colocated else mode_columns(r, "offload" in opts.modes)),
                **({} if opts.objective is None else objective_columns(r, opts.objective)),
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


def overload_doc(r: CandidateResult) -> dict[str, Any]:
    """Whether a configuration's replay kept up, for plan.json (the plan table's schema has no
    column for it): ``overloaded`` of its chosen replay (a ranked row: always false, a replay that
    does not keep up never meets the plan) or, unranked, of its largest replay; the counts whose
    replay was overloaded; and whether its unit costs are valid (pipeline.economics.cost.Period)."""
    ev = r.chosen or (max(r.evaluations, key=lambda e: e.replicas) if r.evaluations else None)
    return {
        "overloaded": ev.overloaded if ev is not None else None,
        "overloaded_replicas": sorted(e.replicas for e in r.evaluations if e.overloaded),
        "unit_costs_valid": bool(ev.period.get("unit_costs_valid", not ev.overloaded)) if ev is not None else None,
        "replay_period": ev.period if ev is not None else None,
    }


def _with_overload(rows: list[dict[str, Any]], results: Sequence[CandidateResult]) -> list[dict[str, Any]]:
    by_label = {r.candidate.label: r for r in results}
    return [{**row, **overload_doc(by_label[row["config"]])} for row in rows]


def mode_columns(r: CandidateResult, offload: bool = False) -> dict[str, Any]:
    """A plan row's serving-mode columns (optional columns of the ``plan`` schema, written only
    by a plan given --modes): the mode, a disaggregated fleet's pools and link and the p99 of each
    part of its TTFT, a speculative one's method and k."""
    ev, c = r.chosen, r.candidate
    split = ev.ttft_split if ev is not None else {}
    pools = ev.pools if ev is not None else {}

    def p99(part: str) -> float | None:
        got = split.get(part) or {}
        return got.get("p99")

    return {
        "mode": c.mode,
        "pd_ratio": f"{c.ratio[0]}:{c.ratio[1]}" if c.ratio is not None else None,
        "prefill_replicas": pools.get("prefill_replicas"),
        "decode_replicas": pools.get("decode_replicas"),
        "link": pools.get("link"),
        "speculative": f"{c.speculative[0]}:{c.speculative[1]}" if c.speculative is not None else None,
        **(offload_columns(r) if offload else {}),
        "ttft_queue_p99_s": p99("queue_s"),
        "ttft_prefill_p99_s": p99("prefill_s"),
        "ttft_transfer_p99_s": p99("transfer_s"),
        "ttft_decode_queue_p99_s": p99("decode_queue_s"),
    }


def offload_columns(r: CandidateResult) -> dict[str, Any]:
    """A plan row's offload columns (a plan whose --modes has offload): the tier and the prompt
    tokens its chosen replay loaded from it (null for other modes, and where nothing passed)."""
    ev = r.chosen
    got = ev.offload if ev is not None else {}
    return {
        "offload": tier_text(r),
        "offload_hit_tokens": got.get("offload_hit_tokens") if got else None,
    }


def _chosen_doc(r: CandidateResult) -> dict[str, Any]:
    ev = r.chosen
    fewer = r.one_fewer
    extra: dict[str, Any] = {}
    if r.candidate.mode != "colocated":
        extra = {"mode": r.candidate.mode, "pools": ev.pools if ev else {}, "ttft_split": ev.ttft_split if ev else {}}
        if r.candidate.mode == "offload":
            extra["offload"] = ev.offload if ev else {}
    return {
        **extra,
        "config": r.candidate.label,
        "hardware": r.candidate.hardware,
        "tp": r.candidate.tp,
        "weight_dtype": r.candidate.weight_dtype,
        "replicas": r.replicas,
        "gpus": (r.replicas or 0) * r.gpus_per_replica,
        "usd_per_day": _usd_per_day(r),
        "usd_per_period": _usd_per_period(r),
        "period_s": r.period_s,
        # the chosen replay's period as `cost` states it (pipeline.economics.cost.Period.to_dict): its
        # unit_costs_note / unit_costs_flag say when its unit costs are not valid
        "replay_period": ev.period if ev else None,
        "achieved": ev.achieved if ev else None,
        # a colocated replay has no pools or TTFT split: left out, so its plan.json is as it was
        "one_fewer": {k: v for k, v in asdict(fewer).items() if v or k not in ("pools", "ttft_split", "offload")}
        if fewer
        else None,
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
    return api_cost_rows(subject, tokens, prices, self_hosted_usd(r), r.period_s)


def self_hosted_usd(r: CandidateResult) -> float:
    """What the self-hosted fleet costs over the period of record, against the API bills: with
    --objective its full cost stack (the rate of its $/day), else the GPUs, as it always was."""
    if r.stack:
        return float(r.stack["usd_per_day"]) * r.period_s / 86400.0 + 0.0
    return _usd_per_period(r)
