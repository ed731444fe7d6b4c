"""The replay stage: run a day of requests through a fleet and write the run to the store.

``replay(store, fleet_path, options)`` reads the columns of one date's canonical requests that
the engine takes (REPLAY_COLUMNS), cuts their prefix chains from the date's prefix identity
(pipeline.classify.prefix, the classify stage's model) at the fleet's block size when the fleet
caches prefixes, runs the replay engine (pipeline.engine.jit, the one production engine; the
per-step reference, pipeline.engine.reference, is the tests' oracle) with the fleet's step-cost
model — in pods when asked or when one engine's state would be large (pipeline.engine.shard) —
and writes, as the engine produces them (RunSteps for the step log, pipeline.replay.runrequests for
the per-request side; the summary is computed from the written requests table)::

    STORE/runs/<run_id>/config.json       resolved fleet, engine settings, options, summary
    STORE/runs/<run_id>/requests.parquet  schema replay_requests
    STORE/runs/<run_id>/steps.parquet     schema replay_steps (spans of identical steps)
    STORE/runs/<run_id>/series.parquet    schema replay_series (per replica per second)

The run id is a digest of the inputs (the requests' read columns, the prefix identity used, the
resolved fleet, the options), so re-running the same replay rewrites the same files with the
same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.catalog import load_model
from pipeline.catalog.names import resolve_model_names
from pipeline.classify.accounting import classify_totals, day_identity, stored_isolation
from pipeline.classify.prefix import DEFAULT_ISOLATION, ChainTree, PrefixIdentity, build_identity, key64
from pipeline.common.budget import ResourceLimitError
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.schemas import ParquetStream, conform, write_parquet
from pipeline.common.system import keep_ignored_sigint
from pipeline.costmodel.stepcost import TabulatedCost
from pipeline.costmodel.steps import BINDING_NAMES
from pipeline.engine.jit import simulate_jit
from pipeline.engine.model import REJECT_REASONS, EngineResult, FleetSpec, Speculation, Workload
from pipeline.engine.shard import (
    EXECUTORS,
    MAX_PODS,
    auto_pods,
    executor_cores,
    put_back,
    routes_static,
    sharded_results,
)
from pipeline.engine.steplog import SPAN_COLUMNS, RowSink, StepLog
from pipeline.ingest.project import default_fleet_path, find_project
from pipeline.ingest.store import ColumnReader, Store, epoch_us, store_write_error
from pipeline.replay import runrequests
from pipeline.replay.autoscale import AutoscaleOutcome, Incarnation, replay_autoscaled, slo_miss, slo_miss_line
from pipeline.replay.fleet import FleetConfig, ResolvedFleet, resolve
from pipeline.replay.limits import (
    MAX_SIM_SPAN_S,
    enforce,
    engine_progress,
    estimate_replay,
    out_of_memory,
    span_too_long,
)
from pipeline.replay.offload import fleet_offload
from pipeline.replay.pools import (
    SPLIT_COLUMNS,
    Disaggregated,
    Handoff,
    LinkSpec,
    Pool,
    PooledFleet,
    hand_off,
    join_disaggregated,
    load_fleet_file,
    merge_handoffs,
    offsets,
    take_result,
)
from pipeline.replay.runfolder import config_path, write_config
from pipeline.replay.runrequests import Columns, MemoryColumns, RunRequests, StoredColumns, run_writes
from pipeline.replay.slo import (
    MULTI_NODE,
    PERCENTILE_METHOD,
    Overload,
    Slo,
    failure_counts,
    failures_line,
    latest_finish,
    overload_of,
    overload_text,
    parse_slo,
    percentile,
    request_latencies,
    share_text,
    slo_verdict,
    sorted_accepted,
)

_INT63 = np.uint64(0x7FFFFFFFFFFFFFFF)
#: ReplayOptions.cache_hits: the log's reported cache hits where it has them, or none of them.
CACHE_HIT_MODES: tuple[str, ...] = ("reported", "simulated")
#: The requests column of the log's reported cache hits (ingest: cached_tokens and its kin).
REPORTED = "reported_cache_hit_tokens"
#: The longest --ramp-s and --think-s (seconds): a client that waits longer is no benchmark client.
MAX_CLIENT_S = 86_400.0
#: The largest --warmup (a day of requests is far fewer; it must also be below the run's count).
MAX_WARMUP = 10**12


@dataclass(frozen=True)
class ReplayOptions:
    """How requests are sent: open loop at ``rate_scale`` × the trace's rate (default), closed
    loop with ``concurrency`` clients, or ``offline`` (everything at t = 0)."""

    date: str | None = None
    rate_scale: float = 1.0
    replicas: int | None = None
    concurrency: int | None = None
    offline: bool = False
    #: Closed loop only (docs/engine.md, "Closed loop"): the clients start one after another over
    #: ``ramp_s`` seconds, wait ``think_s`` seconds after each answer before sending the next
    #: request, and the first ``warmup`` requests sent are replayed but left out of the summary
    #: (latencies, SLO verdict, goodput). Part of the run id where set (the results change).
    ramp_s: float = 0.0
    think_s: float = 0.0
    warmup: int = 0
    #: Columns whose values keep prefix caches apart (model, adapter, tenant, session_id): the
    #: store-level replay takes the one ``classify`` used for the date, so both stages share one
    #: prefix identity (docs/accounting.md).
    isolation: tuple[str, ...] = DEFAULT_ISOLATION
    #: SLO to judge the run against (``--slo`` syntax; None: the fleet's ``[slo]``, if any).
    #: Not part of the run id: the verdict is computed from the run, not an input to it.
    slo: str | None = None
    #: Replay the fleet in this many pods of replicas (pipeline/engine/shard.py; exact for
    #: round robin and affinity routers), run by ``executor``: local, thread, process or ray
    #: (``thread``: a pod a usable core, and a replay asked for no pods runs in one a core when it
    #: is large: shard.auto_pods; the CLI's default). Not part of the run id: the results are the
    #: same bit for bit.
    pods: int = 1
    executor: str = "local"
    ray_address: str | None = None
    #: Whose cache hits the replay serves (docs/engine.md, "Cache hits the log reports"):
    #: ``reported`` (default) takes the log's reported count where a request has one, as classify
    #: does, and the replica's own prefix cache elsewhere; ``simulated`` ignores the reports and
    #: looks every request up in the replica's prefix cache (what the fleet's own caches would
    #: have served). Part of the run id only where not the default.
    cache_hits: str = "reported"

    def __post_init__(self) -> None:
        if self.cache_hits not in CACHE_HIT_MODES:
            raise ConfigError(f"--cache-hits must be one of {', '.join(CACHE_HIT_MODES)}, got {self.cache_hits!r}")
        if not (self.rate_scale > 0 and math.isfinite(self.rate_scale)):
            raise ConfigError(
                f"--rate-scale must be a finite number > 0 (--offline sends everything at t=0), got {self.rate_scale}"
            )
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.concurrency is not None and self.offline:
            raise ConfigError("--concurrency (closed loop) and --offline exclude each other")
        if self.rate_scale != 1.0 and (self.concurrency is not None or self.offline):
            other = "--offline (every request at t=0)" if self.offline else "--concurrency (closed loop)"
            raise ConfigError(
                f"--rate-scale {self.rate_scale:g} and {other} exclude each other: --rate-scale scales the "
                "trace's arrival times, which only the open loop (the default) follows"
            )
        for flag, value in (("--ramp-s", self.ramp_s), ("--think-s", self.think_s)):
            if not (isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= MAX_CLIENT_S):
                raise ConfigError(
                    f"{flag} must be a number of seconds in [0, {MAX_CLIENT_S:,.0f}] (one day), got {value}"
                )
        if not (isinstance(self.warmup, int) and 0 <= self.warmup <= MAX_WARMUP):
            raise ConfigError(f"--warmup must be a whole number of requests in [0, {MAX_WARMUP:,}], got {self.warmup}")
        object.__setattr__(self, "ramp_s", float(self.ramp_s))  # 1 and 1.0: one run, one id
        object.__setattr__(self, "think_s", float(self.think_s))
        if self.concurrency is None:
            for flag, value in (("--ramp-s", self.ramp_s), ("--think-s", self.think_s), ("--warmup", self.warmup)):
                if value:
                    raise ConfigError(
                        f"{flag} needs --concurrency: it shapes the closed loop's clients, and the open loop "
                        "(the default) and --offline have none"
                    )
        if not 1 <= self.pods <= MAX_PODS:
            raise ConfigError(f"--pods must be in 1..{MAX_PODS}, got {self.pods}")
        if self.executor not in EXECUTORS:
            raise ConfigError(f"--executor {self.executor!r} unknown; choose one of {list(EXECUTORS)}")

    @property
    def mode(self) -> str:
        if self.offline:
            return "offline"
        return "closed" if self.concurrency is not None else "open"


@dataclass(frozen=True)
class ReplayRun:
    """Everything a replay produced, in memory (the stage writes it; tests read it directly)."""

    fleet: ResolvedFleet
    spec: FleetSpec
    work: Workload
    #: None where the per-request results went to a RunRequests as the pods ended (``result``
    #: then says so).
    engine_result: EngineResult | None
    log: StepLog
    wall_s: float
    #: The cost model's tier ("measured" profile or "roofline") and what it says of itself.
    cost_source: str = "roofline"
    cost_describe: dict[str, Any] | None = None
    #: The step log's sums, where it was streamed to a RunSteps instead of kept in ``log``.
    sums: StepSums | None = None
    #: The pods the engine ran in (1: one engine run; shard.auto_pods may choose more than asked).
    pods: int = 1
    #: The first requests sent (the first rows: a closed loop sends the trace in order) that were
    #: replayed as warm-up and are left out of the summary (ReplayOptions.warmup).
    warmup: int = 0
    #: FLEET.toml [kv_offload]: the tier and what its pre-pass loaded (pipeline/replay/offload.py)
    kv_offload: dict[str, Any] | None = None
    #: An autoscaled fleet's live replicas and what they provisioned (None: static).
    autoscale: AutoscaleOutcome | None = None

    @property
    def result(self) -> EngineResult:
        if self.engine_result is None:
            raise RooftraceError("this run's per-request results were written to its requests table, not kept")
        return self.engine_result

    def step_sums(self) -> StepSums:
        if self.sums is not None:
            return self.sums
        sums = StepSums()
        sums.add(self.log.columns())
        return sums


def _engine_chains(
    requests: pl.DataFrame,
    block_size: int,
    isolation: tuple[str, ...] = DEFAULT_ISOLATION,
    identity: PrefixIdentity | None = None,
) -> ChainTree:
    """Prefix chains as the engine takes them: per request, the full blocks it leaves in the KV
    cache (prompt, then a session turn's output), at the engine's block size, kept as a
    :class:`ChainTree` (the engine hashes a request's blocks when it needs them).

    They are cut from ``identity`` (the day's, stored by classify: nothing is rebuilt) when it
    covers ``requests``; otherwise from an identity built here with ``isolation``. The identity
    is block-size free, so any engine block size works with any log block size."""
    rows = identity.rows_of(requests) if identity is not None else None
    if identity is None or rows is None:
        identity = build_identity(requests, identity.isolation if identity is not None else isolation)
        rows = None
    return identity.tree(block_size, rows)


def build_workload(
    requests: pl.DataFrame | list[pl.DataFrame],
    fleet: ResolvedFleet,
    options: ReplayOptions,
    identity: PrefixIdentity | None = None,
    origin_us: int | None = None,
) -> Workload:
    """Engine arrays from canonical requests (sorted by arrival); prefix chains from ``identity``
    (the day's prefix identity, :func:`pipeline.classify.accounting.day_identity`) when given.
    ``requests`` in a one-item list is handed over: it is emptied and each column let go once
    converted, so a long day is not held twice. Time 0 is the first arrival, or ``origin_us``
    (epoch µs, at or before it: a pool's requests on the whole fleet's clock)."""
    frame = requests.pop() if isinstance(requests, list) else requests
    del requests
    if frame.height == 0:
        raise RooftraceError("no requests to replay")
    n = frame.height
    sched = fleet.scheduler
    tree = None
    key = fleet.config.affinity_key()  # the router's, or the pods' balancer's
    if sched.enable_prefix_caching or key == "prefix_affinity":
        tree = _engine_chains(frame, sched.block_size, options.isolation, identity)
    affinity = None
    if key == "session_affinity" and "session_id" in frame.columns:
        affinity = _session_keys(frame.get_column("session_id"))
    elif key == "prefix_affinity" and tree is not None:
        has = tree.blocks > 0
        first = np.zeros(n, np.uint64)
        first[has] = tree.materialise(n_blocks=np.ones(n, np.int64))[0]
        affinity = np.where(has, (first & _INT63).astype(np.int64), -1)
    arrival_us = epoch_us(frame.get_column("arrival"))
    frame = frame.drop("arrival")
    origin = arrival_us.min() if origin_us is None else min(int(origin_us), int(arrival_us.min()))
    arrival_s = np.subtract(arrival_us, origin, dtype=np.int64).astype(np.float64)
    del arrival_us
    arrival_s /= 1e6
    arrival_s /= options.rate_scale
    recorded = np.ascontiguousarray(frame.get_column("recorded_input_tokens").to_numpy(), dtype=np.int64)
    reported = reported_hits(frame, recorded, fleet, options)
    frame = frame.drop("recorded_input_tokens")
    # an engine computes at least one prompt token: a logged 0 is replayed as 1 (and stays 0 in
    # the run's table); vLLM samples at least one token (max_tokens >= 1): a logged 0 output too
    prompt = np.maximum(recorded, 1)
    output = np.maximum(frame.get_column("output_tokens").to_numpy(), 1, dtype=np.int64)
    del frame
    return Workload(
        arrival_s=arrival_s,
        prompt_tokens=prompt,
        output_tokens=output,
        chain_tree=tree if sched.enable_prefix_caching else None,
        affinity=affinity,
        reported_hit_tokens=reported,
        recorded_input_tokens=recorded if bool((recorded < 1).any()) else None,
    )


def reported_hits(
    frame: pl.DataFrame, recorded: npt.NDArray[np.int64], fleet: ResolvedFleet, options: ReplayOptions
) -> npt.NDArray[np.int64] | None:
    """The log's reported cache hits the replay honours (Workload.reported_hit_tokens: −1 where a
    request reports none), or None: no request reports any, ``--cache-hits simulated``, or a
    fleet without prefix caching (nothing is served from a cache it does not have). A count
    outside [0, recorded_input_tokens] is refused, as classify refuses it."""
    if REPORTED not in frame.columns or options.cache_hits != "reported":
        return None
    if not fleet.scheduler.enable_prefix_caching:
        return None
    col = frame.get_column(REPORTED)
    if col.null_count() == col.len():
        return None
    rep = np.ascontiguousarray(col.fill_null(-1).cast(pl.Int64).to_numpy(), dtype=np.int64)
    bad = (rep < -1) | (rep > recorded) | ((rep == -1) & col.is_not_null().to_numpy())
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise RooftraceError(
            f"requests: {int(bad.sum()):,} requests report {REPORTED} outside [0, recorded_input_tokens] "
            f"(e.g. {int(col[i])} of {int(recorded[i])} tokens): the log's split cannot be replayed; "
            "check the log or its ingest mapping"
        )
    return rep


def _session_keys(sessions: pl.Series) -> npt.NDArray[np.int64]:
    """Session-affinity keys: each session id's 63-bit key (prefix.key64), −1 for none; each
    distinct id hashed once."""
    distinct = sessions.drop_nulls().unique(maintain_order=True)
    keys = pl.Series([key64(str(s)) & int(_INT63) for s in distinct.to_list()], dtype=pl.Int64)
    out = sessions.replace_strict(distinct, keys, default=-1, return_dtype=pl.Int64).fill_null(-1)
    return np.ascontiguousarray(out.to_numpy(), dtype=np.int64)


def check_replay_limits(
    requests: pl.DataFrame,
    fleet: ResolvedFleet,
    options: ReplayOptions,
    progress: Callable[[int], None] | None = None,
    streamed: bool = False,
) -> Callable[[int], None] | None:
    """Estimate the replay's memory and time before it starts, and refuse one past the limits
    with a one-line error (pipeline/replay/limits.py; docs/limits.md, "Resource limits"). Returns the
    engine's progress callback: ``progress`` if given, else a stderr reporter for long runs when
    a command installed one (``limits.progress_to``). ``streamed``: the store-level replay."""
    check_warmup(options, requests.height)
    est = estimate_replay(
        requests,
        fleet,
        options.mode,
        options.rate_scale,
        options.concurrency,
        options.pods,
        streamed,
        ramp_s=options.ramp_s,
        think_s=options.think_s,
        executor=options.executor,
    )
    enforce(est)
    return progress if progress is not None else engine_progress(est)


def check_warmup(options: ReplayOptions, n: int) -> None:
    """Refuse a warm-up that would leave no request to measure."""
    if options.warmup and options.warmup >= n:
        raise ConfigError(
            f"--warmup {options.warmup:,} leaves no request to measure: the replay has {n:,} requests "
            f"(use at most {max(n - 1, 0):,})"
        )


def run_replay(
    requests: pl.DataFrame,
    fleet: ResolvedFleet,
    options: ReplayOptions,
    progress: Callable[[int], None] | None = None,
    identity: PrefixIdentity | None = None,
    steps: RunSteps | None = None,
) -> ReplayRun:
    """Replay a frame of canonical requests on a resolved fleet (no store involved); ``identity``
    is the day's prefix identity when the caller has it (else built from ``requests``). With
    ``steps``, the step log goes there as it is produced (a pod at a time when the fleet is
    replayed in pods, whose logs are then never gathered) and the run's ``log`` stays empty."""
    progress = check_replay_limits(requests, fleet, options, progress, streamed=steps is not None)
    try:
        work = build_workload(requests, fleet, options, identity)
        return run_workload(work, fleet, options, progress, steps)
    except MemoryError as exc:
        raise out_of_memory(
            exc, f"replaying {requests.height:,} requests on {fleet.size_text()}", mode=options.mode
        ) from None


def run_workload(
    work: Workload,
    fleet: ResolvedFleet,
    options: ReplayOptions,
    progress: Callable[[int], None] | None = None,
    steps: RunSteps | None = None,
    results: RunRequests | None = None,
    cost: TabulatedCost | None = None,
) -> ReplayRun:
    """:func:`run_replay` on engine arrays. With ``results``, the per-request results go there:
    a pod's as it ends when the fleet is replayed in pods (never gathered: the run's ``result``
    is then not kept), or the whole engine run's at the end. ``cost``: the step cost to replay
    with instead of the fleet's own (``calibrate --observed`` replays one workload under many
    candidate calibrations of one base cost)."""
    spec = fleet.spec(options.mode, options.concurrency or 0, options.ramp_s, options.think_s)
    check_warmup(options, work.n)
    if cost is None:
        cost = fleet.cost_model.table
    if steps is not None:
        steps.cost_source = cost.source
    if fleet.config.autoscale is not None:  # (parse_fleet refuses it with [kv_offload])
        return _run_autoscaled(work, fleet, spec, cost, options, progress, steps, results)
    day = work
    cores = executor_cores(options.executor)
    offload = fleet_offload(work, fleet, spec, cores)  # a lower KV tier: its loads delay their requests
    if offload is not None:
        work = offload.work
    pod_size = fleet.config.router_pod_size
    hierarchical = 0 < pod_size < fleet.config.replicas
    pods = options.pods
    if pods == 1 and not hierarchical:  # too many busy replicas for one engine state, or cores: pods anyway
        pods = auto_pods(spec, work.n, lambda: routes_static(work, spec), streamed=steps is not None, cores=cores)
    sharded = hierarchical or pods > 1
    log = StepLog(capacity=1024 if sharded and steps is not None else max(1024, 2 * work.n))
    pod_log: RowSink = steps if steps is not None else log
    t0 = time.perf_counter()
    result: EngineResult | None = None
    if sharded:  # in pods (hierarchical routing: one shard per routing pod)
        ranks = pod_size * (fleet.ranks // fleet.config.replicas) if hierarchical else 0
        args = (
            work,
            spec,
            cost,
            pod_log,
            1 if hierarchical else pods,
            options.executor,
            progress,
            options.ray_address,
            ranks,
            fleet.config.pod_balancer(),
        )
        # (a replay delayed by its loads is gathered, its arrivals then put back: offload.restore)
        result = EngineResult.empty(work.n) if results is None or offload is not None else None
        pods = 0  # the pods run: those that hold a request
        for rows, sub in sharded_results(*args):
            pods += 1
            if result is not None:
                put_back(result, rows, sub)
            else:
                assert results is not None
                results.add_pod(rows, sub)
    else:
        result = simulate_jit(work, spec, cost, log, progress)
    wall = time.perf_counter() - t0
    if offload is not None:
        assert result is not None
        result, work = offload.restore(result), day
    if steps is not None and log.n:  # one engine run: its whole log, as one part
        steps.add(log.columns())
    if results is not None:  # the requests table, a chunk of rows at a time
        if result is None:
            results.write_spooled()
        else:
            results.write_result(result)
            result = None
    sums = steps.sums if steps is not None else None
    return ReplayRun(
        fleet,
        spec,
        work,
        result,
        log,
        wall,
        cost.source,
        dict(cost.describe),
        sums,
        pods,
        options.warmup,
        offload.summary() if offload is not None else None,
    )


def _run_autoscaled(
    work: Workload,
    fleet: ResolvedFleet,
    spec: FleetSpec,
    cost: TabulatedCost,
    options: ReplayOptions,
    progress: Callable[[int], None] | None,
    steps: RunSteps | None,
    results: RunRequests | None,
) -> ReplayRun:
    """:func:`run_workload` for a fleet with ``[autoscale]``: one run of the compiled loop, which
    decides the live replicas and routes to them (pipeline/replay/autoscale.py)."""
    auto = fleet.config.autoscale
    assert auto is not None
    if options.mode != "open" or options.pods > 1:
        raise RooftraceError(
            f"fleet {fleet.config.name!r} autoscales: replay it with the log's own arrivals (open loop) in one "
            "engine run (no --concurrency, --offline or --pods)"
        )
    weight_bytes = fleet.memory.weights_bytes_per_gpu * fleet.gpus_per_replica

    t0 = time.perf_counter()
    result, _routes, outcome, log = replay_autoscaled(work, spec, auto, weight_bytes, cost, progress)
    wall = time.perf_counter() - t0
    if steps is not None and log.n:
        steps.live = outcome.incarnations
        steps.add(log.columns())
    kept: EngineResult | None = result
    if results is not None:
        results.write_result(result)
        kept = None
    sums = steps.sums if steps is not None else None
    return ReplayRun(
        fleet, spec, work, kept, log, wall, cost.source, dict(cost.describe), sums, 1, options.warmup, autoscale=outcome
    )


# -- tables ----------------------------------------------------------------------------------


def requests_table(requests: pl.DataFrame, run: ReplayRun, t0_us: int) -> pa.Table:
    """The run's ``requests.parquet`` rows (schema replay_requests), built whole in memory."""
    work = run.work
    return runrequests.requests_table(
        requests.get_column("request_id").to_arrow(),
        run.result,
        work.prompt_tokens,
        work.output_tokens,
        t0_us,
        np.arange(work.n) < run.warmup,
        runrequests.cache_split(run.result, work),
    )


def steps_table(run: ReplayRun) -> pa.Table:
    return _steps_table(run.log.columns(), run.fleet, run.cost_source)


def _steps_table(cols: dict[str, npt.NDArray[Any]], fleet: ResolvedFleet, cost_source: str) -> pa.Table:
    fit = fleet.memory
    per_token_gpu = fit.kv_pool_bytes_per_gpu / fit.kv_capacity_tokens if fit.kv_capacity_tokens else 0.0
    block_bytes = fleet.scheduler.block_size * per_token_gpu * fleet.deployment.gpus
    parts = np.stack([cols["compute_s"], cols["memory_s"], cols["comm_s"], cols["overhead_s"]])
    table: dict[str, Any] = {name: cols[name] for name in cols}
    table["kv_bytes_used"] = cols["kv_blocks_used"].astype(np.float64) * block_bytes
    # the two label columns as indices into their few names (no Python string per row)
    table["binding"] = _labels(np.argmax(parts, axis=0), BINDING_NAMES)
    duration = np.asarray(cols["end_s"], np.float64) - np.asarray(cols["start_s"], np.float64)
    measured = np.asarray(cols["measured_s"], np.float64)
    # the prior's synthetic tables fill the measured column too: its steps are "prior" throughout
    table["cost_source"] = _labels(
        measured > 0.5 * duration, (cost_source, "prior" if cost_source == "prior" else "measured")
    )
    return pa.table(table)


def _labels(index: npt.NDArray[Any], names: Sequence[str]) -> pa.Array:
    """A string column whose row i is ``names[index[i]]``."""
    codes = pa.array(np.asarray(index, np.int32))
    return pa.DictionaryArray.from_arrays(codes, pa.array(list(names), pa.string())).cast(pa.string())


@dataclass
class StepSums:
    """What the summary needs of a step log: spans, busy time and the part of it costed from
    measured tables. Sums go replica by replica (each replica's spans in start order, then the
    replicas in index order), so a log handed over in pods sums to the same bits as a whole one."""

    spans: int = 0
    busy_s: float = 0.0
    measured_s: float = 0.0
    #: decode-row entries: a decode or (speculative decoding) a verification of one request
    decode_tokens: int = 0
    last_replica: int = -1

    def add(self, cols: dict[str, npt.NDArray[Any]]) -> None:
        """Add a log's columns (ordered by replica then start; replicas after those added before)."""
        replica = np.asarray(cols["replica"], np.int64)
        if not replica.size:
            return
        if int(replica[0]) <= self.last_replica:
            raise ValueError(f"step log parts out of replica order: {int(replica[0])} after {self.last_replica}")
        start = np.asarray(cols["start_s"], np.float64)
        busy = np.asarray(cols["end_s"], np.float64) - start
        measured = np.asarray(cols["measured_s"], np.float64)
        cuts = [0, *(np.flatnonzero(np.diff(replica)) + 1).tolist(), replica.size]
        for a, b in itertools.pairwise(cuts):
            self.busy_s += float(np.cumsum(busy[a:b])[-1])
            self.measured_s += float(np.cumsum(measured[a:b])[-1])
        self.spans += int(replica.size)
        self.decode_tokens += int(np.asarray(cols["decode_tokens"], np.int64).sum())
        self.last_replica = int(replica[-1])


#: Step-log rows the replay stage turns into table rows at a time (whole replicas).
STEP_CHUNK_ROWS = 1 << 18


def _replica_chunks(replica: npt.NDArray[Any], rows: int) -> list[tuple[int, int]]:
    """Cuts of rows sorted by replica into chunks of whole replicas, each about ``rows`` long
    (longer only where one replica has more)."""
    n = int(replica.shape[0])
    bounds = np.append(np.flatnonzero(np.diff(replica)) + 1, n)  # where each replica's rows end
    cuts = [0]
    while cuts[-1] < n:
        ahead = bounds[np.searchsorted(bounds, cuts[-1], side="right") :]  # replica ends past the cut
        fit = int(np.searchsorted(ahead, cuts[-1] + rows, side="right"))  # how many end within ``rows``
        cuts.append(int(ahead[max(fit, 1) - 1]))
    return list(itertools.pairwise(cuts))


class RunSteps:
    """A run's step log written as the engine hands it over: whole replicas at a time, in replica
    order (one engine run's log at once, or a pod's at a time), to ``steps.parquet`` and
    ``series.parquet`` in ``run_dir`` (schemas.ParquetStream: the bytes do not depend on the pods),
    keeping only its StepSums. ``extend_rows`` is the StepLog method the pod runner calls."""

    def __init__(self, run_dir: Path, fleet: ResolvedFleet, t0_us: int, mode: str | None = None) -> None:
        self.run_dir, self.fleet, self.t0_us = run_dir, fleet, t0_us
        #: The replay's arrival mode (open, closed, offline), for what its errors suggest.
        self.mode = mode
        self.cost_source = "roofline"
        self.sums = StepSums()
        self.steps = ParquetStream(run_dir / "steps.parquet", "replay_steps")
        self.series = ParquetStream(run_dir / "series.parquet", "replay_series")
        #: An autoscaled fleet's replica lives: the series gains ``live_fraction`` (None: static).
        self.live: Sequence[Incarnation] | None = None

    def extend_rows(self, rows: npt.NDArray[np.float64]) -> None:
        """A pod's rows, as the engine wrote them: ordered as StepLog.columns orders them and
        taken a chunk of whole replicas at a time (one column copy of a chunk held at once)."""
        start, replica = list(SPAN_COLUMNS).index("start_s"), list(SPAN_COLUMNS).index("replica")
        order = np.lexsort((rows[:, start], rows[:, replica]))
        for a, b in _replica_chunks(rows[order, replica], STEP_CHUNK_ROWS):
            chunk = rows.take(order[a:b], axis=0)  # whole rows at once: faster than a gather per column
            self._write({name: chunk[:, j].astype(t) for j, (name, t) in enumerate(SPAN_COLUMNS.items())})

    def add(self, cols: dict[str, npt.NDArray[Any]]) -> None:
        """A whole log's columns (StepLog.columns), a chunk of whole replicas at a time."""
        for a, b in _replica_chunks(np.asarray(cols["replica"]), STEP_CHUNK_ROWS):
            self._write({name: col[a:b] for name, col in cols.items()})

    def _write(self, cols: dict[str, npt.NDArray[Any]]) -> None:
        self.sums.add(cols)
        with run_writes(self.run_dir, "step log"):
            try:
                self.steps.write(_steps_table(cols, self.fleet, self.cost_source))
            except MemoryError as exc:
                raise _table_memory(exc, "the steps table", cols, self.mode) from None
            try:
                self.series.write(_series_table(cols, self.fleet, self.t0_us, self.mode, self.live))
            except MemoryError as exc:
                raise _table_memory(exc, "the per-second series", cols, self.mode) from None

    def close(self) -> None:
        with run_writes(self.run_dir, "step log"):
            self.steps.close()
            self.series.close()

    def abort(self) -> None:
        """Drop what was written (the run failed or was interrupted), and the run's folder when
        that leaves it empty."""
        self.steps.abort()
        self.series.abort()
        with contextlib.suppress(OSError):
            self.run_dir.rmdir()


def _table_memory(exc: MemoryError, table: str, cols: dict[str, npt.NDArray[Any]], mode: str | None) -> Exception:
    """The one line for running out of memory while building ``table`` from the step-log rows
    ``cols``: how many replicas and simulated seconds (a row per replica per second) it holds."""
    replicas = int(np.unique(cols["replica"]).shape[0]) if cols["replica"].shape[0] else 0
    last = float(np.max(cols["end_s"])) if cols["end_s"].shape[0] else 0.0
    doing = (
        f"building {table} of the step log ({cols['end_s'].shape[0]:,} rows of {replicas:,} "
        f"replica{'' if replicas == 1 else 's'}, up to {last:,.0f} simulated s: a series row per replica per second)"
    )
    return out_of_memory(exc, doing, "series" if "series" in table else "step log", mode)


def series_frames(
    cols: dict[str, npt.NDArray[Any]], capacity_blocks: int, mode: str | None = None
) -> dict[str, npt.NDArray[Any]]:
    """Per replica per second, each span's quantities spread evenly over its wall time.

    A span covers [start, end]; the cumulative amount of a quantity is piecewise linear over the
    replica's spans and flat in idle gaps, so the amount in second k is F(k+1) − F(k). ``mode``
    (the replay's arrivals) only words the refusal of a span too long to hold."""
    out: dict[str, list[npt.NDArray[Any]]] = {
        k: []
        for k in (
            "replica",
            "second",
            "fresh_prefill_tokens_per_s",
            "decode_tokens_per_s",
            "busy_fraction",
            "running",
            "waiting",
            "kv_blocks_used",
        )
    }
    if cols["end_s"].shape[0]:
        last = float(cols["end_s"].max())
        if not last <= MAX_SIM_SPAN_S:  # NaN too: np.arange over it fails or fills the memory
            raise ResourceLimitError(span_too_long(last, "covers", mode))
    for r in np.unique(cols["replica"]):
        m = cols["replica"] == r
        start, end = cols["start_s"][m], cols["end_s"][m]
        dur = end - start
        xs = np.empty(2 * start.shape[0])
        xs[0::2], xs[1::2] = start, end
        seconds = np.arange(0, int(np.ceil(end.max())) + 1, dtype=np.int64)
        edges = np.append(seconds, seconds[-1] + 1).astype(np.float64)
        quantities = {
            "fresh_prefill_tokens_per_s": cols["prefill_tokens"][m].astype(np.float64),
            "decode_tokens_per_s": cols["decode_tokens"][m].astype(np.float64),
            "busy_fraction": dur,
            "running": cols["running"][m] * dur,
            "waiting": cols["waiting"][m] * dur,
            "kv_blocks_used": cols["kv_blocks_used"][m] * dur,
        }
        out["replica"].append(np.full(seconds.shape[0], r, np.int32))
        out["second"].append(seconds)
        for name, q in quantities.items():
            cum = np.concatenate([[0.0], np.cumsum(q)])
            ys = np.empty(xs.shape[0])
            ys[0::2], ys[1::2] = cum[:-1], cum[1:]
            f = np.interp(edges, xs, ys)
            out[name].append(np.diff(f))
    empty = {"replica": np.int32, "second": np.int64}  # no spans at all (every request rejected)
    frames = {k: np.concatenate(v) if v else np.zeros(0, empty.get(k, np.float64)) for k, v in out.items()}
    frames["kv_use_fraction"] = frames["kv_blocks_used"] / capacity_blocks
    return frames


def series_table(run: ReplayRun, t0_us: int) -> pa.Table:
    return _series_table(run.log.columns(), run.fleet, t0_us)


def _series_table(
    cols: dict[str, npt.NDArray[Any]],
    fleet: ResolvedFleet,
    t0_us: int,
    mode: str | None = None,
    live: Sequence[Incarnation] | None = None,
) -> pa.Table:
    frames: dict[str, Any] = series_frames(cols, fleet.scheduler.num_gpu_blocks, mode)
    frames["time"] = pa.array(t0_us + frames["second"] * 1_000_000, pa.timestamp("us", tz="UTC"))
    if live is not None:
        frames["live_fraction"] = live_fractions(frames["replica"], frames["second"], live)
    return pa.table(frames)


def live_fractions(
    replica: npt.NDArray[Any], second: npt.NDArray[Any], live: Sequence[Incarnation]
) -> npt.NDArray[np.float64]:
    """The share of each (replica, second) row the replica was live (between its scale-up delay's
    end and its retirement)."""
    out = np.zeros(replica.shape[0])
    lo = second.astype(np.float64)
    for inc in live:
        mine = replica == inc.replica
        out[mine] += np.clip(np.minimum(lo[mine] + 1.0, inc.retire_s) - np.maximum(lo[mine], inc.live_from_s), 0.0, 1.0)
    return out


# -- summary ---------------------------------------------------------------------------------

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def percentile_key(p: float) -> str:
    """The key of percentile ``p`` in a summary, as the named queries name their columns: p50,
    p99, p99_9 (an identifier: SQL, pandas and jq read it unquoted)."""
    return f"p{p:g}".replace(".", "_")


def _stats(cols: Columns, name: str, ok: npt.NDArray[np.bool_]) -> dict[str, float | None]:
    """Mean, sample standard deviation (None for one value; as the latency query's ``std``), min,
    max and percentiles (inverse CDF) of column ``name`` over the ``ok`` requests where it is
    defined, as vLLM's benchmark prints them."""
    v = cols.get(name)
    v = v[ok & np.isfinite(v)]  # (the whole column goes here)
    keys = ("mean", "std", "min", *(percentile_key(p) for p in PERCENTILES), "max")
    if v.size == 0:
        return dict.fromkeys(keys)
    shape = [float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else None, float(v.min())]
    q = np.percentile(v, PERCENTILES, method=PERCENTILE_METHOD, overwrite_input=True)
    return dict(zip(keys, [*shape, *map(float, q), float(v.max())], strict=True))


def run_slo(run: ReplayRun, options: ReplayOptions | None = None) -> Slo | None:
    """The SLO a run is judged against: ``--slo`` if given, else the fleet's ``[slo]``."""
    text = options.slo if options is not None and options.slo else run.fleet.config.slo
    return parse_slo(text) if text else None


def health(
    cols: Columns, slo: Slo | None, code: npt.NDArray[np.int8] | None = None, closed: bool = False
) -> dict[str, Any]:
    """What failed: request counts (finished, rejected by reason, preempted), overload, and the
    SLO verdict with goodput; ``warnings`` lists each failure in one line (empty: healthy).
    ``code``: the reject codes, when the caller has read them already. A ``closed`` loop is never
    overloaded: its clients send a request only when one finishes, so arrivals follow service
    and at most ``concurrency`` wait (its latencies say how long)."""
    code = cols.get("reject_code") if code is None else code
    ok = code == 0
    finish = cols.get("finish_s")
    counts = failure_counts(code, finish, cols.get("preemptions"))
    last = latest_finish(finish, ok)
    del finish  # one column at a time (the sorted copies are the accepted requests')
    if closed:
        over = Overload(False)
    else:
        arrived = sorted_accepted(cols.get("arrival_s"), ok)
        over = overload_of(arrived, sorted_accepted(cols.get("scheduled_s"), ok), last)
        del arrived
    verdict = None
    if slo is not None:
        lat = {m: cols.get(f"{m}_s") for m in {t.metric for t in slo.targets}}
        verdict = slo_verdict(lat, code != 0, slo)
    warnings = []
    if counts["rejected"]:
        warnings.append(failures_line(counts))
    if over.detected:
        warnings.append(over.line())
    if verdict is not None and not verdict.passed:
        warnings.append(verdict.line())
    return {
        **counts,
        "latency_covers": f"finished requests ({counts['finished']:,} of {counts['requests']:,})",
        "overload": over.to_dict(),
        "verdict": verdict.to_dict() if verdict else None,
        "healthy": not warnings,
        "warnings": warnings,
    }


def summarize(run: ReplayRun, slo: Slo | None = None) -> dict[str, Any]:
    """The summary of a run whose results are in memory."""
    return summary_of(MemoryColumns(run.result, run.work), run.step_sums(), run, slo)


def summary_of(cols: Columns, sums: StepSums, run: ReplayRun, slo: Slo | None = None) -> dict[str, Any]:
    """A run's summary from its per-request columns (in memory, or read back from its written
    requests table one column at a time: the same numbers), its step log's sums, and ``run``'s
    engine wall time and cost model. A run's warm-up requests (``run.warmup``, its first rows) are
    left out of every figure but the engine's: the summary is the measured requests'."""
    split = cache_split_of(cols)  # every request's, warm-up included: the day classify split
    speculative = speculative_summary(cols, sums, run.spec.speculation, run.fleet)  # (the whole log's)
    scaled = autoscale_summary(run, cols.get("arrival_s")) if run.autoscale is not None else None
    if run.warmup:
        cols = _Measured(cols, run.warmup)
    code = cols.get("reject_code")
    ok = code == 0
    n_ok = int(ok.sum())
    finish, arrival = cols.get("finish_s"), cols.get("arrival_s")
    span = float(np.nanmax(finish) - np.min(arrival)) if ok.any() else 0.0
    del finish, arrival
    out_tok = _sum(cols, "output_tokens", ok)
    prompt = _sum(cols, "recorded_input_tokens", ok)
    hits = _sum(cols, "cache_hit_tokens", ok)
    reasons = {REJECT_REASONS[c]: int((code == c).sum()) for c in range(1, len(REJECT_REASONS))}
    healthy = health(cols, slo, code, closed=run.spec.mode == "closed")
    if run.warmup:
        healthy["latency_covers"] += f", after the first {run.warmup:,} sent, replayed as warm-up"
    if scaled is not None and slo is not None:
        _autoscale_miss(scaled, cols, slo, healthy)
    wide = multi_node_warning(run.fleet)
    if wide is not None:  # not a failure of the run, but its latencies are optimistic
        healthy["warnings"].append(wide)
        healthy["healthy"] = False
    return {
        **({"warmup_requests": run.warmup} if run.warmup else {}),
        "requests": int(cols.n),
        "finished": n_ok,
        "rejected": int(cols.n - n_ok),
        "rejected_by_reason": reasons,
        "health": healthy,
        "makespan_s": span,
        "output_tokens": out_tok,
        "output_tokens_per_s": out_tok / span if span > 0 else None,
        "requests_per_s": float(n_ok) / span if span > 0 else None,
        "preemptions": healthy["preemptions"],
        "cache_hit_tokens": hits,
        # the replay's own prefix caches (each replica's engine KV cache, LRU), over finished requests
        "recorded_input_tokens": prompt,
        "fresh_input_tokens": prompt - hits,
        "cache_split": split,
        **{name: _stats(cols, name, ok) for name in ("ttft_s", "tpot_s", "e2e_s", "queue_s")},
        "engine_wall_s": run.wall_s,
        "engine_requests_per_wall_s": cols.n / run.wall_s if run.wall_s > 0 else None,
        "engine_pods": run.pods,
        "spans": sums.spans,
        "cost_model": _cost_summary(run, sums),
        **({"speculative": speculative} if speculative is not None else {}),
        **({"kv_offload": run.kv_offload} if run.kv_offload is not None else {}),
        **({"autoscale": scaled} if scaled is not None else {}),
    }


def autoscale_summary(run: ReplayRun, arrival: npt.NDArray[Any]) -> dict[str, Any]:
    """An autoscaled run's record: the policy's decisions, each replica's provisioned life, the
    windows' live replicas and signal, and the GPU-hours provisioned over the day's arrivals (from
    time 0, the first arrival, to the last) beside the static fleet's (max_replicas all day)."""
    auto = run.autoscale
    assert auto is not None
    last = float(np.max(arrival)) if arrival.shape[0] else 0.0
    per = run.fleet.gpus_per_replica
    return {
        **auto.to_dict(),
        "period_s": last,
        "provisioned_gpu_hours": auto.provisioned_s(0.0, last) * per / 3600.0,
        "static_gpu_hours": auto.settings.max_replicas * per * last / 3600.0,
    }


def _autoscale_miss(scaled: dict[str, Any], cols: Columns, slo: Slo, healthy: dict[str, Any]) -> None:
    """An autoscaled day whose TTFT target failed: when and why (:func:`slo_miss`, minutes after
    the first arrival until :func:`_day_notes` puts them on the log's clock), recorded as the
    autoscale record's ``slo_miss`` and said in the warnings right after the SLO's line."""
    verdict = healthy.get("verdict") or {}
    failed = {t["target"] for t in verdict.get("targets", []) if not t["met"]}
    target = next((t for t in slo.targets if t.metric == "ttft" and t.name in failed), None)
    if target is None:
        return
    miss = slo_miss(scaled, cols.get("arrival_s"), cols.get("ttft_s"), target.limit_s, target.percentile)
    if miss is None:
        return
    scaled["slo_miss"] = miss
    warnings = healthy["warnings"]
    at = next((i + 1 for i, w in enumerate(warnings) if w.startswith(f"SLO {verdict.get('slo')}:")), len(warnings))
    warnings.insert(at, miss["line"])


def autoscale_lines(auto: dict[str, Any]) -> list[str]:
    """An autoscaled run's lines for people (the replay's summary)."""
    st = auto["settings"]
    live = list(auto["replicas"])
    loop = (
        "a schedule"
        if st["signal"] == "schedule"
        else f"{st['signal']} over {st['window_s']:g} s windows, decided in the event loop (one pass)"
    )
    return [
        f"autoscaled {st['min_replicas']}..{st['max_replicas']} replicas by {loop}: {len(auto['changes'])} "
        f"changes, {len(live)} replica lives, scale-up delay {auto['scale_up_delay_s']:.1f} s",
        f"  GPU-hours over the arrivals: {auto['provisioned_gpu_hours']:,.2f} provisioned vs "
        f"{auto['static_gpu_hours']:,.2f} static at max_replicas",
    ]


def speculative_summary(
    cols: Columns, sums: StepSums, sd: Speculation | None, fleet: ResolvedFleet
) -> dict[str, Any] | None:
    """Speculative decoding in a run's summary (None when off): the settings, the mean accepted
    tokens per step the engines ran with and where that figure comes from, and what the replay did:
    output tokens sampled by decode steps (every finished request's output − 1) per decode-row entry
    (a verification, or a plain decode where no draft token was left to propose). Warm-up
    requests included (the step log has no per-request rows). A preempted request's resumed
    prefill samples a token too, counted here as a decode's: the figure is then a little high."""
    if sd is None:
        return None
    ok = cols.get("reject_code") == 0
    sampled = _sum(cols, "output_tokens", ok) - int(ok.sum())
    accepted = fleet.accepted_tokens
    return {
        "method": sd.method,
        "num_speculative_tokens": sd.k,
        "mean_accepted_tokens": sd.mean_accepted,
        "acceptance_source": accepted[1] if accepted is not None else "",
        "decode_steps": sums.decode_tokens,
        "tokens_per_decode_step": sampled / sums.decode_tokens if sums.decode_tokens else None,
    }


def cache_split_of(cols: Columns) -> dict[str, Any]:
    """The run's fresh / cache-hit split over every request replayed (rejected ones included:
    classify splits the whole day), and by where the hits came from
    (runrequests.CACHE_HIT_SOURCES). One column of the run's length is held at a time."""
    code = cols.get("cache_hit_code").astype(np.int64)
    k = len(runrequests.CACHE_HIT_SOURCES)
    n_by = np.bincount(code, minlength=k)
    hits_by = np.bincount(code, weights=cols.get("cache_hit_tokens"), minlength=k)
    rec_by = np.bincount(code, weights=cols.get("recorded_input_tokens"), minlength=k)
    rec, hit = int(rec_by.sum()), int(hits_by.sum())
    return {
        "requests": int(cols.n),
        "recorded_input_tokens": rec,
        "cache_hit_tokens": hit,
        "fresh_input_tokens": rec - hit,
        "by_source": {
            name: {
                "requests": int(n_by[c]),
                "recorded_input_tokens": int(rec_by[c]),
                "cache_hit_tokens": int(hits_by[c]),
            }
            for c, name in enumerate(runrequests.CACHE_HIT_SOURCES)
        },
    }


#: What a run records of classify's split (its summary.json) next to its own.
_CLASSIFY_SPLIT_KEYS = (
    "requests",
    "recorded_input_tokens",
    "cache_hit_tokens",
    "fresh_input_tokens",
    "cache_hit_source",
)


def cache_split_note(split: dict[str, Any], classified: dict[str, Any] | None, config: dict[str, Any]) -> str | None:
    """One line when the replay's fresh / cache-hit split is not the one classify reports for the
    day (``classified``: classify's summary, None when the day is not classified), saying by how
    much and why; None when they agree to the token. ``config``: the run's record (config.json:
    ``date``, ``options``, ``resolved``). The report's token figures are classify's, so this line
    goes first wherever the run is shown (the report computes it again against the classify of
    the day it is made, which may be newer than the run)."""
    if classified is None:
        return None
    date = str(config.get("date") or "the date")
    options = config.get("options") or {}
    resolved = config.get("resolved") or {}
    sched = resolved.get("scheduler") or {}
    replicas = int((resolved.get("fleet") or {}).get("replicas") or 0)
    n_cls, n_rep = int(classified.get("requests") or 0), int(split["requests"])
    if n_cls != n_rep:
        return (
            f"CACHE SPLIT: classify of {date} counted {n_cls:,} requests, the replay {n_rep:,}: the day's token "
            f"figures predate its latest requests (run `rooftrace classify --date {date}` again)"
        )
    c_hit, r_hit = int(classified.get("cache_hit_tokens") or 0), int(split["cache_hit_tokens"])
    if c_hit == r_hit:
        return None
    total = int(split["recorded_input_tokens"])
    by_cls = classified.get("cache_hit_source") or {}
    reported = int((by_cls.get("reported") or {}).get("cache_hit_tokens") or 0)
    simulated = int((by_cls.get("simulated") or {}).get("cache_hit_tokens") or 0)
    own = split["by_source"]["prefix_cache"]
    if options.get("cache_hits") == "simulated" and reported:
        why = f"--cache-hits simulated ignores the {reported:,} cache-hit tokens the log reports"
    elif not isinstance(resolved.get("pools"), list) and not sched.get("enable_prefix_caching", True):
        why = "the fleet disables prefix caching (engine.enable_prefix_caching = false): every input token is prefilled"
    elif isinstance(resolved.get("pools"), list):  # a fleet of pools: each pool's replicas their own caches
        why = (
            f"on the requests whose hits come from prefix chains, the pools' replicas' own prefix caches "
            f"(each pool's KV blocks, shared with running requests) served {int(own['cache_hit_tokens']):,} "
            f"tokens where classify's cache model ({classified.get('capacity') or 'its capacity'}) counts {simulated:,}"
        )
    else:
        tier = (resolved.get("fleet") or {}).get("kv_offload")
        lower = f" and the fleet's [kv_offload] {tier.get('kind')} tier" if isinstance(tier, dict) else ""
        if isinstance(tier, dict) and isinstance(tier.get("shared"), dict):
            lower += " and the pool's store below it"
        why = (
            f"on the requests whose hits come from prefix chains, the replicas' own prefix caches "
            f"({replicas:,} × {int(sched.get('num_gpu_blocks') or 0):,} KV blocks of {sched.get('block_size')} "
            f"tokens, shared with running requests){lower} served {int(own['cache_hit_tokens']):,} tokens where "
            f"classify's cache model ({classified.get('capacity') or 'its capacity'}) counts {simulated:,}"
        )
    return (
        f"CACHE SPLIT: the replay served {r_hit:,} of {total:,} recorded input tokens from cache "
        f"({share_text(r_hit / total if total else 0.0)}), classify counts {c_hit:,} "
        f"({share_text(c_hit / total if total else 0.0)}) and the report's token figures are classify's: {why}"
    )


class _Measured:
    """A run's columns without its first ``skip`` rows (the warm-up requests): views, no copy."""

    def __init__(self, cols: Columns, skip: int) -> None:
        self.cols, self.skip, self.n = cols, skip, cols.n - skip

    def get(self, name: str) -> npt.NDArray[Any]:
        return self.cols.get(name)[self.skip :]


def _sum(cols: Columns, name: str, ok: npt.NDArray[np.bool_]) -> int:
    """The sum of integer column ``name`` over the ``ok`` requests (no copy of them)."""
    return int(np.sum(cols.get(name), where=ok, dtype=np.int64))


def _cost_summary(run: ReplayRun, sums: StepSums) -> dict[str, Any]:
    """Which tier costed the run: the cost model's own description and the share of busy time
    that came from measured tables."""
    busy = sums.busy_s
    share = min(1.0, sums.measured_s / busy) if busy > 0 else 0.0
    prior = run.cost_source == "prior"  # the prior's synthetic tables fill the measured column
    return {
        "source": run.cost_source,
        "measured_share_of_busy_time": 0.0 if prior else share,
        **({"prior_share_of_busy_time": share} if prior else {}),
        **(run.cost_describe or {}),
    }


# -- the stage -------------------------------------------------------------------------------

#: The request columns the stage reads (and the run id digests): what the engine takes. The
#: log's own prefix chains and isolation keys come in through the date's prefix identity (the
#: one classify stored, or one built from every column when none matches), digested too;
#: session-affinity routing reads ``session_id`` as well.
REPLAY_COLUMNS: tuple[str, ...] = ("request_id", "arrival", "recorded_input_tokens", "output_tokens")


@dataclass(frozen=True)
class ReplayResult:
    run_id: str
    run_dir: Path
    summary: dict[str, Any]


def _id_resolved(fleet: ResolvedFleet) -> dict[str, Any]:
    """What of a resolved fleet a run id digests: all of it, a calibration by its numbers only
    (not its prose: paths of the store that taught it)."""
    resolved = fleet.to_dict()
    cal = (resolved.get("fleet") or {}).get("stack_calibration")
    if isinstance(cal, dict):
        resolved["fleet"]["stack_calibration"] = {k: v for k, v in cal.items() if k != "source"}
    return resolved


def _run_id(
    date: str,
    fleet: ResolvedFleet | tuple[str, Any],
    options: ReplayOptions,
    requests: pl.DataFrame,
    identity: PrefixIdentity | None,
    ids: ColumnReader,
) -> str:
    """The run's id: the date, the fleet (a resolved fleet, or a fleet of pools as its name and
    what of it to digest), what the options replay, and a digest of the replayed columns
    (request ids from ``ids``, read a row group at a time, then the rest of ``requests``) and of
    the prefix identity used."""
    h = hashlib.sha256()
    if isinstance(fleet, ResolvedFleet):
        fleet_name, resolved = fleet.config.name, _id_resolved(fleet)
    else:
        fleet_name, resolved = fleet
    h.update(json.dumps(resolved, sort_keys=True, default=str).encode())
    how = {"slo", "pods", "executor", "ray_address"}  # how it ran, not what: not part of the id
    # the closed loop's client options only where set: a run without them keeps the id it had
    unset = {k for k in ("ramp_s", "think_s", "warmup") if not getattr(options, k)}
    if options.cache_hits == "reported":  # the default: a run from before the option keeps its id
        unset.add("cache_hits")
    what = {k: v for k, v in asdict(options).items() if k not in how | unset}
    h.update(json.dumps(what, sort_keys=True).encode())
    h.update(b"request_id")
    ids.digest(h)
    for name in (c for c in requests.columns if c != "request_id"):  # a column at a time
        h.update(name.encode())
        h.update(np.ascontiguousarray(requests.get_column(name).hash(seed=0).to_numpy()).data)
    if identity is not None:  # the prefix chains the caches see
        for part in (identity.key, identity.parent, identity.shared, identity.cached):
            h.update(np.ascontiguousarray(part).tobytes())
    return f"{date}-{fleet_name}-{h.hexdigest()[:10]}"


@contextlib.contextmanager
def _store_writes(store: Store) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise store_write_error(store, exc) from None


def _utc(t0_us: int, first_s: float, after_s: float, rate_scale: float = 1.0) -> str:
    """A time of the overload rule (``after_s`` seconds after the first accepted arrival, which
    is ``first_s`` on the run's clock) as UTC on the log's own clock, to the second: the replay
    runs the log ``rate_scale`` times as fast, so a replayed second is ``rate_scale`` logged ones."""
    at = np.datetime64(t0_us, "us") + np.timedelta64(round((first_s + after_s) * rate_scale * 1e6), "us")
    return f"{np.datetime_as_string(at, unit='s')}Z"


def multi_node_warning(fleet: ResolvedFleet) -> str | None:
    """One line when a replica's communicating GPUs do not fit one node of its hardware
    (``gpus_per_node``): the engine prices every collective (tensor-parallel all-reduce,
    pipeline sends, an MoE model's expert dispatch and combine over its dp ranks) over the
    hardware's intra-node link, measured NCCL curves of one node included, so a replica across
    nodes gets optimistic latencies. A dense model's dp ranks share nothing: only tp × pp count
    for it; an MoE model's dp ranks exchange tokens at every MoE layer: tp × pp × dp."""
    c, dep = fleet.config, fleet.deployment
    per_node = dep.hardware.gpus_per_node
    moe_dp = dep.model.is_moe and c.dp > 1
    talking = dep.gpus * (c.dp if moe_dp else 1)
    if per_node < 1 or talking <= per_node:
        return None
    what = [
        *(["the MoE expert dispatch/combine over its dp ranks"] if moe_dp else []),
        *(["the pipeline-parallel sends between stages"] if c.pp > 1 else []),
    ]  # (tp alone never spans nodes: the roofline refuses tp > gpus_per_node)
    gpus = fleet.gpus_per_replica
    nodes = -(-gpus // per_node)
    return (
        f"{MULTI_NODE} each replica spans {nodes:,} nodes (tp {c.tp} × pp {c.pp} × dp {c.dp} = {gpus:,} "
        f"{dep.hardware.name} GPUs, {per_node} per node), but its cross-node communication "
        f"({' and '.join(what)}) is priced as within one {dep.hardware.link_kind} node: "
        "latencies are optimistic"
    )


def model_mix_warning(store: Store, date: str, fleet_model: str) -> str | None:
    """One line when the date's requests were logged for models other than the fleet's, all of
    which the replay serves as the fleet's model: a day of two models replayed on one. Rows
    without a model (``unknown``) and rows whose name resolves to the fleet's model (its id, its
    Hugging Face id behind any provider prefix, an -Instruct or quantized copy, a [models] alias:
    pipeline/catalog/names.py) count as the fleet's. None also when the day names one model that
    resolves to no catalog model and never the fleet's (an API model's logs, sized on this fleet)."""

    counts = (
        pl.scan_parquet([str(p) for p in store.request_files(date)])
        .group_by("model")
        .len()
        .sort(["len", "model"], descending=[True, False])
        .collect()
    )
    try:
        spec = load_model(fleet_model)
        fleet_id, hf_id = spec.name, spec.hf_id.lower()
    except RooftraceError:
        fleet_id, hf_id = fleet_model, ""
    rows = [(str(m), int(n)) for m, n in zip(counts.get_column("model"), counts.get_column("len"), strict=True)]
    names = resolve_model_names((m for m, _ in rows), aliases=find_project().models)
    ours = {fleet_model.lower(), fleet_id.lower(), "unknown"} | ({hf_id} if hf_id else set())

    def fleets(m: str) -> bool:
        return m.lower() in ours or names[m].model == fleet_id

    other = [(m, n) for m, n in rows if not fleets(m)]
    if not other:
        return None
    named_ours = any(fleets(m) and m != "unknown" for m, _ in rows)
    if not named_ours and len(other) == 1 and names[other[0][0]].model is None:
        return None
    total, n_other = sum(n for _, n in rows), sum(n for _, n in other)

    def shown_name(m: str) -> str:  # the catalog model a spelled-out name resolves to, said
        model = names[m].model
        return f"{m} = {model}" if model is not None and model != m else m

    shown = ", ".join(f"{shown_name(m)}: {n:,}" for m, n in other[:3]) + (
        f", {len(other) - 3} more" if len(other) > 3 else ""
    )
    return (
        f"MODEL MIX: {n_other:,} of {total:,} requests ({share_text(n_other / total)}) were logged for other "
        f"models ({shown}) and are replayed as {fleet_model}; a fleet per model sizes each "
        "(rooftrace plan --traffic-model)"
    )


def replay(
    store: Store,
    fleet_path: Path | str | None = None,
    options: ReplayOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> ReplayResult:
    """Replay one date of the store on the fleet in ``fleet_path`` and write the run.

    The run id and the recorded options hold the date resolved (the store's latest when
    ``options.date`` is None) and ``replicas`` only where it changes the fleet's: the same
    replay asked either way is the same run, written with the same bytes. Running out of memory
    anywhere is one ResourceLimitError line naming what was being built."""
    keep_ignored_sigint()
    options = options or ReplayOptions()
    path = Path(fleet_path) if fleet_path is not None else default_fleet_path()
    base = load_fleet_file(path)
    if isinstance(base, PooledFleet):
        return replay_pooled(store, path, base, options, progress)
    cfg = base.with_replicas(options.replicas)
    fleet = resolve(cfg, str(path))
    date = _day_to_replay(store, options)
    # what the options replay, not how they were spelled: --date D is the default date's run,
    # --replicas N on a fleet of N replicas the fleet's own
    options = replace(options, date=date, replicas=None if options.replicas == base.replicas else options.replicas)
    return _in_memory_of(options, date, lambda doing: _replay(store, path, cfg, fleet, date, options, progress, doing))


def _day_to_replay(store: Store, options: ReplayOptions) -> str:
    """The date a replay reads, once the store is known free and writable: another run writing it
    is said now (not "no requests yet"), a read-only store before any work, not after the engine."""
    store.check_unlocked()
    date = store.resolve_date(options.date)
    store.check_writable(store.runs_dir)
    return date


def _in_memory_of(options: ReplayOptions, date: str, run: Callable[[list[str]], ReplayResult]) -> ReplayResult:
    """``run(doing)``, where ``doing[0]`` says what it is building: running out of memory anywhere
    is one ResourceLimitError line naming it."""
    doing = [f"reading the requests of {date}"]
    try:
        return run(doing)
    except MemoryError as exc:
        raise out_of_memory(exc, doing[0], mode=options.mode) from None


def _replay(
    store: Store,
    path: Path,
    cfg: FleetConfig,
    fleet: ResolvedFleet,
    date: str,
    options: ReplayOptions,
    progress: Callable[[str], None] | None,
    doing: list[str],
) -> ReplayResult:
    """:func:`replay` once the fleet and date are known; ``doing[0]`` says what it is building
    (for an out-of-memory error)."""
    affinity = ("session_id",) if cfg.affinity_key() == "session_affinity" else ()
    chains = fleet.scheduler.enable_prefix_caching or cfg.affinity_key() == "prefix_affinity"
    # the request ids only where the prefix identity needs them: they are digested for the run
    # id and written to requests.parquet a row group / chunk at a time, read from the store
    read = REPLAY_COLUMNS if chains else tuple(c for c in REPLAY_COLUMNS if c != "request_id")
    honour = options.cache_hits == "reported" and fleet.scheduler.enable_prefix_caching
    requests = store.read_requests(date, (*read, *affinity, *([REPORTED] if honour else [])), positions=True)
    if REPORTED in requests.columns and requests.get_column(REPORTED).null_count() == requests.height:
        requests = requests.drop(REPORTED)  # a log that reports none: the run (and its id) as before
    check_warmup(options, requests.height)  # before the prefix chains are built
    request_id = ColumnReader(store, date, "request_id", requests.get_column("_position").to_numpy())
    requests = requests.drop("_position")
    identity = None
    if chains:
        doing[0] = f"building the prefix chains of {requests.height:,} requests"
        identity = day_identity(store, date, requests, progress)
        options = replace(options, isolation=identity.isolation)
    else:  # no prefix chains needed: the isolation key alone, for the run's record
        options = replace(options, isolation=stored_isolation(store, date))
    what = f"{requests.height:,} requests of {date} on {fleet.size_text()}"
    if progress:
        progress(f"replaying {what}")
    t0_us = int(epoch_us(requests.get_column("arrival")).min()) if requests.height else 0
    run_id = _run_id(date, fleet, options, requests, identity, request_id)
    run_dir = store.run_dir(run_id)
    engine_progress = check_replay_limits(requests, fleet, options, streamed=True)
    hand = [requests]
    del requests  # handed over: let go a column at a time as the engine's arrays are made
    doing[0] = f"building the engine's arrays of {what}"
    work = build_workload(hand, fleet, options, identity)
    del identity  # from here on: the engine's arrays and the ids' positions
    # the step log and the per-request results stream to the run folder (under temporary names)
    # as the engine produces them
    steps = RunSteps(run_dir, fleet, t0_us, options.mode)
    results = RunRequests(run_dir, request_id, work, t0_us, progress, options.warmup)
    # A run is complete once its config.json is written. A new run stopped before that (Ctrl-C,
    # a failed write) takes back the tables it moved into place, so no SQL view reads half a run;
    # a re-run of a complete run rewrites the same bytes, so its folder stays complete meanwhile.
    complete = config_path(run_dir).exists()
    try:
        doing[0] = f"replaying {what} (the engine's state, step log and series)"
        run = run_workload(work, fleet, options, engine_progress, steps, results)
        doing[0] = f"replaying {what} again with the other measured sources (the band across sources)"
        band = source_band_runs(work, fleet, options, progress)
        doing[0] = f"writing the requests table of {what}"
        written = StoredColumns(results.finish())
        # the summary reads the written table: the day's arrays go first (10^8 requests: 4 GB)
        results.release()
        run = replace(run, work=Workload(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)))
        del work
        doing[0] = f"summarizing the run of {what}"
        summary = summary_of(written, steps.sums, run, run_slo(run, options))
        if band is not None:  # only where several measured sources cover the GPU: other runs as they were
            summary["source_band"] = source_band_summary(summary, fleet, band)
        record = {"date": date, "options": asdict(options), "resolved": fleet.to_dict()}
        _day_notes(store, date, summary, cfg.model, record, t0_us, options.rate_scale)
        with store.lock(), _store_writes(store):
            results.commit()
            steps.close()
            write_config(run_dir, _run_record(run_id, date, path, options, fleet.to_dict(), summary))
    except BaseException:
        _drop_tables(run_dir, complete)
        raise
    finally:
        results.abort()  # nothing left to drop once committed
        steps.abort()  # (and an emptied folder goes)
    return ReplayResult(run_id, run_dir, summary)


#: How the band across measured sources is made (the run's summary ``source_band.method``).
BAND_METHOD = (
    "the same requests replayed again, once per other measured source covering this GPU's operators, "
    "with that source's tables first (same fleet, options and arrivals; queueing re-simulated); the band is "
    "the range of each figure over all sources, the chosen one included"
)


def source_band_runs(
    work: Workload, fleet: ResolvedFleet, options: ReplayOptions, progress: Callable[[str], None] | None = None
) -> list[dict[str, Any]] | None:
    """TTFT and TPOT percentiles of ``work`` replayed with each other measured source of the
    fleet's GPU first (pipeline/costmodel/profile/cost.py ``alternative_sources``); None where
    one source covers it (or the fleet is not priced from a measured profile)."""
    from pipeline.costmodel.profile.cost import alternative_sources, fleet_step_cost  # lazy: band only

    others = alternative_sources(fleet)
    if not others:
        return None
    out: list[dict[str, Any]] = []
    for name in others:
        if progress:
            progress(f"band across sources: replaying again with the {name} tables first")
        alt = run_workload(work, fleet, options, cost=fleet_step_cost(fleet, measured_source=name))
        res = alt.result
        lat = request_latencies(res, work)
        ok = (res.reject_reason == 0) & (np.arange(work.n) >= alt.warmup)
        fig: dict[str, Any] = {"source": name}
        for key, arr in (("ttft_s", lat["ttft"]), ("tpot_s", lat["tpot"])):
            v = arr[ok & np.isfinite(arr)]
            q = np.percentile(v, (50.0, 99.0), method=PERCENTILE_METHOD) if v.size else None
            fig[key] = None if q is None else {"p50": float(q[0]), "p99": float(q[1])}
        out.append(fig)
    return out


def source_band_summary(summary: dict[str, Any], fleet: ResolvedFleet, band: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's ``source_band``: each source's TTFT / TPOT p50 and p99 (the chosen one's from
    the run itself) and the range over them."""
    from pipeline.costmodel.profile.cost import fleet_sources  # lazy: band only
    from pipeline.costmodel.profile.tables import profile_for  # lazy: band only

    prof = profile_for(fleet.deployment.hardware)
    chosen = prof.with_sources(*fleet_sources(fleet)).order[0] if prof is not None else "measured"
    own: dict[str, Any] = {"source": chosen}
    for key in ("ttft_s", "tpot_s"):
        st = summary.get(key) or {}
        own[key] = {"p50": st.get("p50"), "p99": st.get("p99")} if st.get("p50") is not None else None
    sources = [own, *band]
    ranges: dict[str, Any] = {}
    for key in ("ttft_s", "tpot_s"):
        ranges[key] = {}
        for p in ("p50", "p99"):
            vals = [s[key][p] for s in sources if s.get(key) and s[key].get(p) is not None]
            ranges[key][p] = [min(vals), max(vals)] if vals else None
    return {"chosen": chosen, "method": BAND_METHOD, "sources": sources, **ranges}


def _day_notes(
    store: Store, date: str, summary: dict[str, Any], model: str, record: dict[str, Any], t0_us: int, scale: float
) -> None:
    """What a run's summary says of its day beyond the engine's figures: classify's split beside
    the replay's and the note when they differ, a log of other models, and the overload's and an
    autoscaled day's missed-SLO span's times on the log's own clock."""
    classified = classify_totals(store, date)
    summary["cache_split"]["classify"] = (
        {k: classified.get(k) for k in _CLASSIFY_SPLIT_KEYS} if classified is not None else None
    )
    summary["cache_split"]["note"] = cache_split_note(summary["cache_split"], classified, record)
    mix = model_mix_warning(store, date, model)
    if mix is not None:
        summary["health"]["warnings"].append(mix)
        summary["health"]["healthy"] = False
    scaled = summary.get("autoscale")
    miss = scaled.get("slo_miss") if isinstance(scaled, dict) else None
    if isinstance(scaled, dict) and isinstance(miss, dict):  # the span on the log's own clock
        line = slo_miss_line(scaled, miss, t0_us, scale)
        summary["health"]["warnings"] = [line if w == miss["line"] else w for w in summary["health"]["warnings"]]
        miss["line"] = line
    over = summary["health"]["overload"]
    if over["detected"]:
        first = over.get("first_arrival_s") or 0.0
        over["from_utc"] = _utc(t0_us, first, over["from_s"], scale)
        if over.get("until_s") is not None:
            over["until_utc"] = _utc(t0_us, first, over["until_s"], scale)
        summary["health"]["warnings"] = [
            overload_text(over) if w.startswith("OVERLOADED") else w for w in summary["health"]["warnings"]
        ]


def _run_record(
    run_id: str, date: str, path: Path, options: ReplayOptions, resolved: dict[str, Any], summary: dict[str, Any]
) -> dict[str, Any]:
    """A run's config.json. The engine's wall time varies from run to run: it is kept out, so a
    re-run writes the same bytes."""
    return {
        "run_id": run_id,
        "date": date,
        "fleet_file": str(path),
        "options": asdict(options) | {"mode": options.mode},
        "resolved": resolved,
        "summary": {k: v for k, v in summary.items() if not k.startswith("engine_")},
    }


def _drop_tables(run_dir: Path, complete: bool) -> None:
    """A new run stopped before its config.json was written takes back the tables it moved into
    place, so no SQL view reads half a run (a re-run of a complete run rewrote the same bytes)."""
    if not complete and not config_path(run_dir).exists():
        for name in ("requests.parquet", "steps.parquet", "series.parquet"):
            (run_dir / name).unlink(missing_ok=True)


# -- a fleet of pools ------------------------------------------------------------------------


#: A pooled run's tables and their schemas.
_POOLED_TABLES = {"requests": "replay_requests", "steps": "replay_steps", "series": "replay_series"}


@dataclass(frozen=True)
class _PoolRun:
    """One pool's part of a pooled replay: the pool, its resolved fleet, the rows of the day it
    served (positions in date order) and its engine run."""

    pool: Pool
    fleet: ResolvedFleet
    rows: npt.NDArray[np.int64]
    run: ReplayRun | None


@dataclass(frozen=True)
class _Prefilled:
    """A prefill pool's part before its decode pool is replayed: its requests, their workload (the
    logged outputs), its engine run (one output token each) and what it hands off."""

    requests: pl.DataFrame
    work: Workload
    run: ReplayRun
    moved: Handoff


def _hand_off(run: ReplayRun, work: Workload, pool: Pool | LinkSpec, decode: ResolvedFleet) -> Handoff:
    """A prefill pool's hand-off to its decode pool: the KV bytes per token of the decode pool's
    model, KV dtype, tp and pipeline stage (its memory fit: what one of its GPUs stores), its
    drafter's KV bytes per token included where it drafts with a model (the prefill pool computed
    them: pipeline.replay.pools.MODEL_DRAFTERS), over the pool's link (or the link given),
    layer-wise over the model's layers where the link says so."""
    link = pool.link if isinstance(pool, Pool) else pool
    assert link is not None
    mem = decode.memory
    return hand_off(
        run.work,
        run.result,
        mem.kv_bytes_per_token + mem.draft_kv_bytes_per_token,
        link.link(),
        output_tokens=work.output_tokens,
        window_bytes_per_token=mem.kv_window_bytes_per_token,
        window=mem.sliding_window,
        layers=decode.deployment.model.num_layers,
    )


def _disaggregated_table(got: _Prefilled, joined: Disaggregated, t0_us: int, decode: str, offset: int) -> pa.Table:
    """A prefill pool's rows: each request's life over both pools (its arrival, queue and cache
    hits at the prefill pool; its tokens from the decode pool) and the TTFT split."""
    work = got.work
    table = runrequests.requests_table(
        got.requests.get_column("request_id").to_arrow(),
        joined.result,
        work.prompt_tokens,
        work.output_tokens,
        t0_us,
        None,
        runrequests.cache_split(got.run.result, got.run.work),
    )
    handed = np.isfinite(joined.kv_bytes)
    placed = joined.decode_replica >= 0
    extra: dict[str, pa.Array] = {
        "decode_pool": pa.array(np.full(work.n, decode, dtype=object), pa.string(), mask=~handed),
        "decode_replica": pa.array(joined.decode_replica + np.int32(offset), pa.int32(), mask=~placed),
        **{c: pa.array(joined.split[c], mask=~np.isfinite(joined.split[c])) for c in SPLIT_COLUMNS},
        "kv_transfer_bytes": pa.array(joined.kv_bytes, mask=~handed),
    }
    for name, col in extra.items():
        table = table.append_column(name, col)
    return table


#: The columns a disaggregated fleet's requests table adds (null on a unified pool's rows).
_DISAGG_COLUMNS = {"decode_pool": pa.string(), "decode_replica": pa.int32(),
                   **dict.fromkeys(SPLIT_COLUMNS, pa.float64()), "kv_transfer_bytes": pa.float64()}  # fmt: skip


def _no_decode(table: pa.Table) -> pa.Table:
    """A unified pool's rows in a disaggregated fleet's table: the disaggregated columns null."""
    for name, kind in _DISAGG_COLUMNS.items():
        table = table.append_column(name, pa.nulls(table.num_rows, kind))
    return table


def _count_disaggregated(counts: dict[str, Any], joined: Disaggregated) -> None:
    """Add a prefill pool's requests to the run's hand-off counts: handed off, and rejected at
    the prefill pool (never reaching a decode pool) or at the decode pool, by reason."""
    counts["requests"] = counts.get("requests", 0) + int(joined.rejected_at.shape[0])
    counts["handed_off"] = counts.get("handed_off", 0) + int(np.isfinite(joined.kv_bytes).sum())
    for code, key in ((1, "rejected_at_prefill"), (2, "rejected_at_decode")):
        where = counts.setdefault(key, {})
        reasons = joined.result.reject_reason[joined.rejected_at == code]
        for r in np.unique(reasons).tolist():
            name = REJECT_REASONS[int(r)]
            where[name] = where.get(name, 0) + int((reasons == r).sum())


def replay_pools(
    requests: pl.DataFrame, pooled: PooledFleet, options: ReplayOptions, identity: PrefixIdentity | None = None
) -> list[ReplayRun]:
    """A fleet of pools replayed in memory (the headroom curve's points): one run per pool that
    took requests by rule, each on its own clock. A prefill pool's run is its requests' whole
    lives: its workload with the logged outputs and the results joined with its decode pool's
    (pipeline.replay.pools.join_disaggregated), so every request is counted once."""
    fleets = [resolve(p.config, p.config.name) for p in pooled.pools]
    which = pooled.assign(requests)
    t0_us = int(epoch_us(requests.get_column("arrival")).min())
    runs: dict[int, ReplayRun] = {}
    pending: dict[int, _Prefilled] = {}
    for k, pool in enumerate(pooled.pools):
        rows = np.flatnonzero(which == k)
        if not pool.takes_requests or not rows.size:
            continue
        if pool.role != "prefill":
            runs[k] = run_replay(requests[rows], fleets[k], options, identity=identity)
            continue
        sub = requests[rows]
        progress = check_replay_limits(sub, fleets[k], options)
        work = build_workload(sub, fleets[k], options, identity, origin_us=t0_us)  # one clock for feeders
        run = run_workload(replace(work, output_tokens=np.ones(work.n, np.int64)), fleets[k], options, progress)
        pending[k] = _Prefilled(sub, work, run, _hand_off(run, work, pool, fleets[pooled.index(str(pool.handoff))]))
    for d, pool in enumerate(pooled.pools):
        feeders = [k for k in pending if pooled.pools[k].handoff == pool.name]
        if not feeders:
            continue
        merged, positions = merge_handoffs([pending[k].moved for k in feeders])
        drun = run_workload(merged, fleets[d], options) if merged.n else None
        for k, pos in zip(feeders, positions, strict=True):
            got = pending[k]
            dres = take_result(drun.result, pos) if drun is not None else EngineResult.empty(0)
            joined = join_disaggregated(got.run.result, got.moved, dres)
            runs[k] = replace(got.run, work=got.work, engine_result=joined.result)
    return [runs[k] for k in sorted(runs)]


@dataclass(frozen=True)
class PrefillDecodeRun:
    """One prefill pool handing every request to one decode pool, replayed in memory
    (:func:`replay_prefill_decode`): each pool's engine run, and the requests' lives joined."""

    prefill: ReplayRun  # one output token per request
    decode: ReplayRun | None  # None when no request reached it
    joined: Disaggregated
    #: The requests' workload with their logged outputs (the joined result's rows).
    work: Workload


def replay_prefill_decode(
    requests: pl.DataFrame,
    prefill: ResolvedFleet,
    decode: ResolvedFleet,
    link: LinkSpec,
    options: ReplayOptions,
    identity: PrefixIdentity | None = None,
) -> PrefillDecodeRun:
    """A 1-prefill-pool, 1-decode-pool fleet replayed in memory as :func:`replay_pools` replays a
    prefill pool and the decode pool it feeds (``plan --modes disaggregated`` sizes one): the
    prefill pool's requests with one output token each, :func:`pipeline.replay.pools.hand_off`
    over ``link``, the decode pool's run of the hand-offs, and the two joined per request
    (:func:`pipeline.replay.pools.join_disaggregated`: the TTFT split included)."""
    progress = check_replay_limits(requests, prefill, options)
    t0_us = int(epoch_us(requests.get_column("arrival")).min())
    work = build_workload(requests, prefill, options, identity, origin_us=t0_us)
    prun = run_workload(replace(work, output_tokens=np.ones(work.n, np.int64)), prefill, options, progress)
    moved = _hand_off(prun, work, link, decode)
    drun = run_workload(moved.work, decode, options) if moved.work.n else None
    dres = drun.result if drun is not None else EngineResult.empty(0)
    return PrefillDecodeRun(prun, drun, join_disaggregated(prun.result, moved, dres), work)


def _with_pool(table: pa.Table, pool: str, offset: int) -> pa.Table:
    """A pool's table on the fleet's numbering: its replicas after the pools' before it, and a
    ``pool`` column."""
    i = table.schema.get_field_index("replica")
    replica = pc.add(table.column(i), pa.scalar(int(offset), table.schema.field(i).type))
    table = table.set_column(i, "replica", replica)
    return table.append_column("pool", pa.array([pool] * table.num_rows, pa.string()))


def pooled_resolved(pooled: PooledFleet, fleets: Sequence[ResolvedFleet]) -> dict[str, Any]:
    """A pooled run's ``resolved`` record: the fleet of pools (``fleet``), and each pool's resolved
    fleet with its name, role, rule and first replica number (``pools``)."""
    first = offsets([f.ranks for f in fleets])
    return {
        "fleet": pooled.to_dict(),
        "pools": [
            {"pool": p.name, "role": p.role, "match": p.match.to_dict(), "first_replica": int(o), **f.to_dict()}
            for p, f, o in zip(pooled.pools, fleets, first, strict=True)
        ],
        "gpus": sum(f.config.replicas * f.gpus_per_replica for f in fleets),
    }


def replay_pooled(
    store: Store,
    path: Path,
    pooled: PooledFleet,
    options: ReplayOptions,
    progress: Callable[[str], None] | None = None,
) -> ReplayResult:
    """:func:`replay` of a fleet of pools: each request goes to the pool whose rule it matches
    (PooledFleet.assign), each pool is replayed as a fleet of its own on the whole fleet's clock,
    and one run is written whose tables carry the ``pool`` and number the replicas pool after
    pool. Refused with one line: ``--replicas`` (a pool sets its own), the closed loop (its
    clients would span pools) and a warm-up (closed loop only)."""
    if options.replicas is not None:
        raise ConfigError(f"--replicas: {path} is a fleet of pools; set replicas in each [[pool]] table")
    if options.mode == "closed":
        raise ConfigError(
            f"{path}: a closed loop (--concurrency) over a fleet of pools is not modelled (its clients would "
            "span pools); replay it open loop or --offline, or replay one pool's fleet closed loop"
        )
    fleets = [resolve(p.config, f"{path} [[pool]] {p.name!r}") for p in pooled.pools]
    date = _day_to_replay(store, options)
    options = replace(options, date=date)
    return _in_memory_of(
        options, date, lambda doing: _replay_pooled(store, path, pooled, fleets, date, options, progress, doing)
    )


def _replay_pooled(
    store: Store,
    path: Path,
    pooled: PooledFleet,
    fleets: list[ResolvedFleet],
    date: str,
    options: ReplayOptions,
    progress: Callable[[str], None] | None,
    doing: list[str],
) -> ReplayResult:
    keys = {f.config.affinity_key() for f in fleets}
    chains = any(f.scheduler.enable_prefix_caching for f in fleets) or "prefix_affinity" in keys
    honour = options.cache_hits == "reported" and any(f.scheduler.enable_prefix_caching for f in fleets)
    extra = [c for c in pooled.columns if c not in REPLAY_COLUMNS]
    read = (
        *REPLAY_COLUMNS,
        *(["session_id"] if "session_affinity" in keys else []),
        *([REPORTED] if honour else []),
        *extra,
    )
    requests = store.read_requests(date, tuple(dict.fromkeys(read)), positions=True)
    if REPORTED in requests.columns and requests.get_column(REPORTED).null_count() == requests.height:
        requests = requests.drop(REPORTED)
    check_warmup(options, requests.height)
    request_id = ColumnReader(store, date, "request_id", requests.get_column("_position").to_numpy())
    requests = requests.drop("_position")
    which = pooled.assign(requests)
    identity = None
    if chains:
        doing[0] = f"building the prefix chains of {requests.height:,} requests"
        identity = day_identity(store, date, requests, progress)
        options = replace(options, isolation=identity.isolation)
    else:
        options = replace(options, isolation=stored_isolation(store, date))
    resolved = pooled_resolved(pooled, fleets)
    run_id = _run_id(date, (pooled.name, resolved), options, requests, identity, request_id)
    run_dir = store.run_dir(run_id)
    t0_us = int(epoch_us(requests.get_column("arrival")).min())
    first = offsets([f.ranks for f in fleets])
    slots: list[_PoolRun | None] = [None] * len(fleets)
    by_pool: dict[int, dict[str, pa.Table]] = {}
    pending: dict[int, _Prefilled] = {}
    for k, (pool, fleet) in enumerate(zip(pooled.pools, fleets, strict=True)):
        if not pool.takes_requests:  # a decode pool: replayed once its prefill pools have handed off
            continue
        rows = np.flatnonzero(which == k).astype(np.int64)
        if rows.size == 0:
            slots[k] = _PoolRun(pool, fleet, rows, None)
            continue
        sub = requests[rows]
        what = f"{rows.size:,} requests of {date} on pool {pool.name} ({fleet.size_text()})"
        if progress:
            progress(f"replaying {what}")
        doing[0] = f"replaying {what}"
        engine_progress = check_replay_limits(sub, fleet, options)
        work = build_workload(sub, fleet, options, identity, origin_us=t0_us)
        if pool.role == "prefill":
            run = run_workload(replace(work, output_tokens=np.ones(work.n, np.int64)), fleet, options, engine_progress)
            pending[k] = _Prefilled(sub, work, run, _hand_off(run, work, pool, fleets[pooled.index(str(pool.handoff))]))
        else:
            run = run_workload(work, fleet, options, engine_progress)
        slots[k] = _PoolRun(pool, fleet, rows, run)
        by_pool[k] = {
            "steps": steps_table(run),
            "series": _series_table(run.log.columns(), fleet, t0_us, options.mode, _pool_live(run, fleets)),
        }
        if pool.role != "prefill":
            by_pool[k]["requests"] = requests_table(sub, run, t0_us)
    disagg: dict[str, Any] = {}
    for d, (pool, fleet) in enumerate(zip(pooled.pools, fleets, strict=True)):
        if pool.takes_requests:
            continue
        feeders = [k for k in pending if pooled.pools[k].handoff == pool.name]
        merged, positions = merge_handoffs([pending[k].moved for k in feeders])
        drun: ReplayRun | None = None
        if merged.n:
            what = f"{merged.n:,} handed-off requests of {date} on decode pool {pool.name} ({fleet.size_text()})"
            if progress:
                progress(f"replaying {what}")
            doing[0] = f"replaying {what}"
            drun = run_workload(merged, fleet, options)
            by_pool[d] = {
                "steps": steps_table(drun),
                "series": _series_table(drun.log.columns(), fleet, t0_us, options.mode, _pool_live(drun, fleets)),
            }
        slots[d] = _PoolRun(pool, fleet, np.zeros(0, np.int64), drun)
        for k, pos in zip(feeders, positions, strict=True):
            got = pending[k]
            dres = take_result(drun.result, pos) if drun is not None else EngineResult.empty(0)
            joined = join_disaggregated(got.run.result, got.moved, dres)
            by_pool[k]["requests"] = _disaggregated_table(got, joined, t0_us, pool.name, int(first[d]))
            _count_disaggregated(disagg, joined)
    parts = [p for p in slots if p is not None]
    ordered = [k for k in range(len(fleets)) if k in by_pool]
    tables: dict[str, list[pa.Table]] = {"requests": [], "steps": [], "series": []}
    for k in ordered:
        for part, table in by_pool[k].items():  # each pool's table in the schema's types (an all-null column typed)
            if part == "requests" and pooled.disaggregated and "decode_pool" not in table.column_names:
                table = _no_decode(table)
            tables[part].append(conform(_with_pool(table, pooled.pools[k].name, int(first[k])), _POOLED_TABLES[part]))
    entry_rows = [slots[k].rows for k in ordered if "requests" in by_pool[k]]  # type: ignore[union-attr]
    order = np.argsort(np.concatenate(entry_rows), kind="stable")
    req = pa.concat_tables(tables["requests"]).take(pa.array(order))
    complete = config_path(run_dir).exists()
    try:
        with _store_writes(store):
            write_parquet(req, run_dir / "requests.parquet", _POOLED_TABLES["requests"])
            for part in ("steps", "series"):
                write_parquet(pa.concat_tables(tables[part]), run_dir / f"{part}.parquet", _POOLED_TABLES[part])
        del tables, req
        doing[0] = f"summarizing the run of {requests.height:,} requests of {date} on {pooled.name}"
        summary = _pooled_summary(StoredColumns(run_dir / "requests.parquet"), parts, options, disagg or None)
        record = {"date": date, "options": asdict(options), "resolved": resolved}
        _day_notes(store, date, summary, pooled.model, record, t0_us, options.rate_scale)
        with store.lock(), _store_writes(store):
            write_config(run_dir, _run_record(run_id, date, path, options, resolved, summary))
    except BaseException:
        _drop_tables(run_dir, complete)
        if not complete and not config_path(run_dir).exists():
            with contextlib.suppress(OSError):
                run_dir.rmdir()
        raise
    return ReplayResult(run_id, run_dir, summary)


def _ttft_split(cols: Columns, counts: dict[str, Any]) -> dict[str, Any]:
    """The TTFT split of a disaggregated run's served requests: each part's mean and p99 (seconds;
    the means add up to the mean TTFT), with the hand-off counts."""
    first = cols.get("first_decode_step_s")
    ok = np.isfinite(first) & (cols.get("reject_code") == 0)
    out: dict[str, Any] = dict(counts)
    split: dict[str, Any] = {}
    for name in ("queue_s", *SPLIT_COLUMNS, "ttft_s"):
        v = cols.get(name)[ok]
        split[name] = {"mean": float(v.mean()) if v.size else None, "p99": percentile(v, 99) if v.size else None}
    out["served"] = int(ok.sum())
    out["ttft_split"] = split
    return out


def _pool_live(run: ReplayRun, fleets: Sequence[ResolvedFleet]) -> list[Incarnation] | None:
    """A pool's replica lives for its series' ``live_fraction``: its own where it autoscales; every
    replica live all day where another pool of the fleet does (one column for the whole table);
    None where no pool autoscales."""
    if run.autoscale is not None:
        return run.autoscale.incarnations
    if any(f.config.autoscale is not None for f in fleets):
        return [Incarnation(r, 0.0, 0.0) for r in range(run.spec.replicas)]
    return None


def _pooled_summary(
    cols: Columns, parts: Sequence[_PoolRun], options: ReplayOptions, disagg: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A pooled run's summary: the whole fleet's figures from its written requests table (as a
    single pool's), and each pool's own under ``pools``; a disaggregated fleet's TTFT split and
    hand-off counts under ``disaggregation``."""
    runs = [p.run for p in parts if p.run is not None]
    sums = StepSums()
    per_pool: dict[str, Any] = {}
    for part in parts:
        entry: dict[str, Any] = {
            "role": part.pool.role,
            "match": part.pool.match.text(),
            "hardware": part.fleet.config.hardware,
            "size": part.fleet.size_text(),
            "gpus": part.fleet.config.replicas * part.fleet.gpus_per_replica,
        }
        if part.pool.handoff is not None and part.pool.link is not None:
            entry["handoff"] = {"to": part.pool.handoff, "link": part.pool.link.text()}
        if part.run is not None:
            pool_sums = part.run.step_sums()
            sums.spans += pool_sums.spans
            sums.busy_s += pool_sums.busy_s
            sums.measured_s += pool_sums.measured_s
            own = summarize(part.run, run_slo(part.run, options))
            entry |= {k: v for k, v in own.items() if not k.startswith("engine_") and k != "cache_split"}
        else:
            entry |= {"requests": 0, "finished": 0, "rejected": 0}
        sd = part.fleet.config.speculative
        if part.pool.role == "prefill":  # it loads its decode pool's drafter and verifies nothing
            entry.pop("speculative", None)
            if sd is not None:
                entry["drafter"] = {"method": sd.method, "of": part.pool.handoff}
        per_pool[part.pool.name] = entry
    first = runs[0]
    whole = replace(
        first,
        wall_s=sum(r.wall_s for r in runs),
        pods=sum(r.pods for r in runs),
        cost_source=first.cost_source if len({r.cost_source for r in runs}) == 1 else "mixed",
        cost_describe={},
    )
    summary = summary_of(cols, sums, whole, run_slo(first, options))
    summary.pop("speculative", None)  # a pool's own (summary.pools.<name>.speculative): pools differ
    for run in runs[1:]:
        wide = multi_node_warning(run.fleet)
        if wide is not None and wide not in summary["health"]["warnings"]:
            summary["health"]["warnings"].append(wide)
            summary["health"]["healthy"] = False
    summary["pools"] = per_pool
    if disagg is not None:
        summary["disaggregation"] = _ttft_split(cols, disagg)
    return summary


def pool_lines(summary: dict[str, Any]) -> list[str]:
    """A pooled run's pools for people, one line each (none for a single pool): what each took,
    on what, and how it served it."""
    out = []
    for name, p in (summary.get("pools") or {}).items():
        ttft = (p.get("ttft_s") or {}).get("p99")
        tpot = (p.get("tpot_s") or {}).get("p99")
        lat = f"; TTFT p99 {ttft * 1e3:,.1f} ms, TPOT p99 {tpot * 1e3:,.1f} ms" if ttft is not None and tpot else ""
        hand = p.get("handoff")
        to = f", hands to {hand['to']} over {hand['link']}" if hand else ""
        rule = "requests its prefill pools hand it" if p.get("role") == "decode" else p.get("match")
        out.append(
            f"pool {name} ({p.get('role')}, {rule}{to}): {p.get('size')}: {p.get('requests', 0):,} requests, "
            f"{p.get('finished', 0):,} finished, {p.get('rejected', 0):,} rejected{lat}{_speculation_text(p)}"
        )
    return out + disaggregation_lines(summary)


def _speculation_text(pool: dict[str, Any]) -> str:
    """A pool's speculative decoding for its line in ``replay`` ('' without): what drafts, k, E and
    the output tokens a decode step gave; a prefill pool's, the drafter it loads for its decode pool."""
    sd, drafter = pool.get("speculative"), pool.get("drafter")
    if sd:
        per_step = sd.get("tokens_per_decode_step")
        return (
            f"; speculative {sd['method']} k = {sd['num_speculative_tokens']}, {sd['mean_accepted_tokens']:.2f} "
            f"accepted tokens per verification, {per_step or 0:.2f} output tokens per decode step"
        )
    if drafter:
        return f"; loads {drafter['of']}'s {drafter['method']} drafter (its KV moves with the prompt's)"
    return ""


def disaggregation_lines(summary: dict[str, Any]) -> list[str]:
    """A disaggregated run's hand-offs and TTFT split for people (none for other runs)."""
    d = summary.get("disaggregation")
    if not d:
        return []

    def rejected(key: str) -> str:
        got = d.get(key) or {}
        return ", ".join(f"{n:,} {r}" for r, n in sorted(got.items())) or "none"

    out = [
        f"disaggregated: {d.get('requests', 0):,} requests reached prefill pools, {d.get('handed_off', 0):,} "
        f"handed off; rejected at prefill: {rejected('rejected_at_prefill')}; at decode: "
        f"{rejected('rejected_at_decode')}"
    ]
    split = d.get("ttft_split") or {}
    if split.get("ttft_s", {}).get("mean") is not None:
        names = {"queue_s": "queue", "prefill_s": "prefill", "transfer_s": "transfer",
                 "decode_queue_s": "decode queue", "first_decode_step_s": "first decode step"}  # fmt: skip

        def ms(key: str, stat: str) -> str:
            return f"{split[key][stat] * 1e3:,.1f}"

        parts = " + ".join(f"{label} {ms(k, 'mean')}" for k, label in names.items())
        p99 = ", ".join(f"{label} {ms(k, 'p99')}" for k, label in names.items())
        out.append(f"TTFT split, mean ms: {parts} = {ms('ttft_s', 'mean')} (p99 ms: {p99}; TTFT {ms('ttft_s', 'p99')})")
    return out
