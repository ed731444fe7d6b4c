"""Resource limits of a replay: what it will need, estimated before it starts, and the limits it
must stay within (docs/limits.md, "Resource limits").

A replay's memory is driven by a few things known before it runs: the engine's per-replica state
(``pipeline.engine.jit.state_bytes``: what the replicas touch of it), the prefix chains (the
day's prefix identity and the tree cut from it), the step log (a few rows per request), and the per-replica
per-second series (replicas × simulated seconds: a tiny ``--rate-scale`` stretches one day into
months). :func:`estimate_replay` adds them up, with the process's current size, and
:func:`enforce` refuses a run whose estimate is past the memory limit, or whose arrivals span more
simulated days than allowed, with one line naming the estimate and what drives it.

Limits: ``--max-memory`` / ``$ROOFTRACE_MAX_MEMORY`` (default half the physical memory, or of
the cgroup's limit when lower; a replay's is at most what the process's address-space limit,
``ulimit -v``, leaves: :func:`replay_limits`) and ``--max-sim-days`` / ``$ROOFTRACE_MAX_SIM_DAYS`` (default 30);
``none`` lifts either. :func:`engine_progress` builds the progress callback that reports long
runs on stderr (installed by the CLI with :func:`progress_to`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.common import system
from pipeline.common.budget import (
    GIB,
    OVERHEAD_BYTES,
    SINK,
    Channel,
    Limits,
    ResourceLimitError,
    every_s,
    replay_limits,
    token_sums,
)
from pipeline.common.defaults import MAX_MEMORY_ENV, MAX_SIM_DAYS_ENV
from pipeline.common.units import distinct_numbers, format_bytes, format_duration, format_number
from pipeline.engine.jit import MAX_STATE_BYTES, fitting_replicas, state_bytes
from pipeline.engine.jitcache import compile_needed as jit_compile_needed
from pipeline.engine.shard import auto_pods, executor_cores, pod_cuts, thread_workers

if TYPE_CHECKING:
    import polars as pl

    from pipeline.replay.fleet import ResolvedFleet

#: Longest simulated span a replay may cover, whatever its limits (``none`` included): its series
#: has a row per replica per simulated second, and past this (about 32 years) one replica's
#: seconds alone are gigabytes; a span this long comes from an absurd --rate-scale or step cost.
MAX_SIM_SPAN_S = 1e9


# -- the estimate's constants (bytes, seconds), measured on replays of 2k-300k requests ----------
#: Compiling the jit engine when its disk cache is missing or stale (LLVM; measured ~1.2 GB).
COMPILE_BYTES = 3 * GIB // 2
#: Seconds of that compile, said before it starts (never part of the replay's estimate or time
#: left). It runs in two processes on two cores (jit.compile_engine(parallel=True), from the
#: command's start: jitcache.compile_ahead): the one the replay waits for used 12.8 s of CPU and
#: the side process 12.6 s (22.6 s in one process before), on the 2-core VM at load 14 (others'
#: jobs); the first replay of the Azure hour on fleets/default.toml used 34.3 s of CPU in all
#: (benchmarks/cold_start.py, load 13: 86.7 s wall, the others' jobs holding the cores). On idle
#: cores the compile's wall time is about its longer process's CPU time: ~15-20 s.
COMPILE_S = 20.0
#: Per request: workload, engine and result arrays, the output tables (measured ~1.3 KiB).
REQUEST_BYTES = 2048
#: Per request, what the store-level replay in one engine adds once the date's columns are read
#: (they are in the process's size already): engine arrays and the run's whole result, its
#: tables then written a chunk at a time (pipeline/replay/runrequests.py). Measured: one engine run of
#: 2·10^6 requests, about 150 B a request beyond its step log.
STREAMED_REQUEST_BYTES = 192
#: The same in pods, whose results are spooled: the engine's arrays (24 B, less the read columns
#: let go as they are converted), pods' rows and routes (8 B), the spool's index (4 B), and the
#: cutting of the pods (a sort of the routes, about 20 B while it runs); the summary reads the
#: written table once these are let go. Measured (docs/scale.md): 10^8 requests in 200 pods,
#: 2.8 GiB when the estimate is made, peak 6.2 GiB (a pod's step log and the engine state
#: counted apart, 2.6 GiB here).
STREAMED_POD_REQUEST_BYTES = 48
#: Per request of the jit engine's lazy chains (pipeline.classify.prefix.ChainTree): the day's
#: prefix identity read from the store (9 columns) and the tree cut from it while it is built;
#: the tree (5 int64 columns and the CSR offsets) is kept.
TREE_BUILD_BYTES = 160
TREE_KEPT_BYTES = 48
#: Per step-log row: the engine's growing buffer, the StepLog, sorted copies and the table.
LOG_ROW_BYTES = 600
#: Step-log rows per request (measured 2-3).
ROWS_PER_REQUEST = 4
#: Per replica-second of the series table and its intermediates (measured 130-165 B).
SERIES_ROW_BYTES = 200
#: Per replica beyond jit.state_bytes: queues and counters.
REPLICA_BYTES = 1024


# -- sizes and limits ------------------------------------------------------------------------------


# -- the estimate ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayEstimate:
    """What a replay will need, estimated before it runs (memory in bytes by part)."""

    requests: int
    replicas: int
    engine: str  # "jit": the one production engine (pipeline.engine.jit)
    mode: str
    rate_scale: float
    #: Simulated seconds from the first to the last arrival (open loop; 0 otherwise).
    arrival_span_s: float
    #: Simulated seconds the run covers, arrivals and drain (an estimate).
    span_s: float
    #: Replicas expected to run steps (each has a series row per simulated second).
    busy_replicas: int
    kv_blocks: int
    log_rows: int
    #: Memory by part: process (now), overhead, compile, chains (while built), engine state,
    #: requests, step log, series.
    parts: dict[str, int]
    seconds: float
    progress_units: str
    progress_total: int
    #: Bytes of the prefix chains kept through the replay (``parts["chains"]`` is their peak).
    chains_kept: int = 0
    #: Replicas of the largest pod (the engine state one process holds); 0: the whole fleet.
    pod_replicas: int = 0

    @property
    def bytes(self) -> int:
        p = self.parts
        kept = p["engine state"] + p["requests"] + p["step log"] + p["series"] + self.chains_kept
        return p["process"] + p["overhead"] + p["compile"] + max(p["chains"], kept)

    def drivers(self) -> str:
        """The parts, largest first, each with what drives it."""
        pods = 0 < self.pod_replicas < self.replicas
        a_pod = " (a pod's at a time)" if pods else ""

        def replicas(n: int) -> str:
            return f"{n:,} replica{'' if n == 1 else 's'}"

        why = {
            "engine state": (
                f"engine state of the largest pod's {replicas(self.pod_replicas)} ({self.engine} engine)"
                if pods
                else f"engine state of {replicas(self.replicas)} ({self.engine} engine)"
            ),
            "series": (
                f"series of {replicas(self.busy_replicas).replace(' replica', ' busy replica')} × "
                f"{self.span_s:,.0f} simulated s{a_pod}"
            ),
            "chains": (
                f"prefix chains of {self.requests:,} requests (hashed as needed)"
                if self.engine == "jit"
                else f"prefix chains of {self.kv_blocks:,} KV blocks"
            ),
            "step log": f"step log of ~{self.log_rows:,} rows{a_pod}",
            "requests": f"arrays of {self.requests:,} requests",
            "compile": "compiling the jit engine",
            "process": "this process so far",
        }
        parts = sorted(((v, k) for k, v in self.parts.items() if k in why and v > 0), reverse=True)
        return ", ".join(f"{format_bytes(v)} {why[k]}" for v, k in parts)

    def biggest(self) -> str:
        keys = ("engine state", "series", "chains", "step log", "requests")
        return max(keys, key=lambda k: self.parts[k])

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "seconds": self.seconds,
            "engine": self.engine,
            "replicas": self.replicas,
            "span_s": self.span_s,
            "busy_replicas": self.busy_replicas,
            "parts": dict(self.parts),
        }


def _routes_static(requests: pl.DataFrame, spec: Any) -> bool:
    """shard.routes_static on the replay's frame: round robin, or an affinity key (a session id;
    a prompt of at least one full block) on every request the replay does not reject (the
    rejections of model.reject_reasons, from the same token counts)."""
    import polars as pl

    if spec.mode == "closed":
        return False
    if spec.router == "round_robin":
        return True
    if spec.router == "session_affinity" and "session_id" in requests.columns:
        keyless = pl.col("session_id").is_null()
    elif spec.router == "prefix_affinity":
        keyless = pl.col("recorded_input_tokens") < spec.scheduler.block_size
    else:
        return False
    cfg = spec.scheduler
    total = pl.max_horizontal(pl.col("recorded_input_tokens"), 1) + pl.max_horizontal(pl.col("output_tokens"), 1)
    rejected = (total > cfg.max_model_len) | (total > cfg.num_gpu_blocks * cfg.block_size + 1)
    return not bool(requests.select((keyless & ~rejected).any()).item())


def estimate_replay(
    requests: pl.DataFrame,
    fleet: ResolvedFleet,
    mode: str,
    rate_scale: float,
    concurrency: int | None,
    pods: int = 1,
    streamed: bool = False,
    ramp_s: float = 0.0,
    think_s: float = 0.0,
    executor: str = "local",
) -> ReplayEstimate:
    """Estimate the memory and wall time of replaying ``requests`` on ``fleet`` (see the module
    doc), without running it. Replayed in ``pods`` (or in the routing pods of
    ``router_pod_size``), one pod's engine state is held at a time by any one process: the
    largest pod's counts, not the whole fleet's; ``executor`` ``thread`` holds as many pods at a
    time as it runs at once (shard.thread_workers), and takes about that much less wall time.
    ``streamed``: the store-level replay, whose per-request results and tables are written as
    they come (STREAMED_REQUEST_BYTES). A closed loop's ``ramp_s`` and ``think_s`` (each
    client's wait between two requests) lengthen its span."""

    n = int(requests.height)
    sched = fleet.scheduler
    R = int(fleet.ranks)
    router = fleet.config.router
    spec = fleet.spec(mode, concurrency or 0)
    # step times from the fleet's own cost model (built once: the replay then reuses it), so the
    # estimate prices with the tier the replay will
    pod_r = R
    hierarchical = 0 < fleet.config.router_pod_size < fleet.config.replicas
    cores = executor_cores(executor)
    if pods == 1 and not hierarchical:  # as the replay decides (shard.auto_pods)
        pods = auto_pods(spec, n, lambda: _routes_static(requests, spec), streamed=streamed, cores=cores)
    if hierarchical:
        pod_r = fleet.config.router_pod_size * (R // fleet.config.replicas)
    elif pods > 1:
        pod_r = int(np.diff(pod_cuts(R, fleet.lockstep, pods)).max())
    # a replica that receives no request costs nothing (jit.busy_fleet): at most one per request,
    # and least outstanding starts on as many as the jit engine fits (more only when busy at once)
    flat = pod_r == R
    pod_r = min(pod_r, max(1, -(-n // fleet.lockstep)) * fleet.lockstep)
    if router == "least_outstanding" and flat:
        pod_r = min(pod_r, fitting_replicas(spec))
    pod_spec = replace(spec, replicas=pod_r)
    # one engine runs every replay (pipeline.engine.jit); a state past MAX_STATE_BYTES is allocated
    # zeroed, so only what the replicas in use touch becomes resident (see "engine state" below)
    engine = "jit"
    cost = fleet.cost_model

    n_eff = max(n, 1)
    bs = max(int(sched.block_size), 1)
    chains = sched.enable_prefix_caching or fleet.config.affinity_key() == "prefix_affinity"
    # token sums and block counts a slice at a time (a day of 10^8 requests: no copy of a column)
    sum_p, blocks_p = token_sums(requests.get_column("recorded_input_tokens"), bs, ceil=False)
    sum_o, blocks_o = token_sums(requests.get_column("output_tokens"), bs, ceil=True)
    blocks = blocks_p + blocks_o if chains and n else 0
    mean_p = sum_p / n if n else 1.0
    mean_o = sum_o / n if n else 1.0
    ctx = mean_p + mean_o / 2

    def step(d: float, c: float, p: float = 0.0) -> float:
        return cost.step_s(d, c, p)

    budget = float(max(sched.max_num_batched_tokens, 1))
    t1 = step(1, ctx)
    e2e = step(0, 0, min(mean_p, budget)) * math.ceil(mean_p / budget) + mean_o * t1
    kv_seqs = max(1.0, sched.num_gpu_blocks * bs / (mean_p + mean_o))
    full = max(1.0, min(float(sched.max_num_seqs), kv_seqs))

    def work_s(used: int, batch: float) -> float:
        """Seconds ``used`` replicas take for all the work at ``batch`` sequences per step."""
        decode = sum_o / used / batch * step(batch, ctx)
        prefill = sum_p / used / budget * step(0, 0, budget)
        return float(decode + prefill)

    static = router == "round_robin" or router in ("session_affinity", "prefix_affinity")
    arrival_span = 0.0
    if mode == "open" and n:
        from pipeline.ingest.store import epoch_us  # lazy: polars and pyarrow; every command imports this module

        arrival = epoch_us(requests.get_column("arrival"))
        first, last = int(arrival.min()), int(arrival.max())
        arrival_span = (last - first) / 1e6 / rate_scale
        if static:
            busy = min(R, n)
        else:  # least outstanding: about as many replicas as requests in flight at the peak
            t = np.sort((arrival.astype(np.float64) - first) / 1e6 / rate_scale)
            inflight = int((np.searchsorted(t, t + 2 * e2e, side="left") - np.arange(n)).max())
            busy = max(1, min(R, n, inflight))
        span = max(arrival_span, work_s(min(R, n), full)) + e2e
    else:
        clients = min(concurrency or n, n_eff)
        busy = max(1, min(R, n_eff) if static or mode == "offline" else min(R, clients))
        batch = max(1.0, min(full, math.ceil(clients / busy)))
        span = work_s(busy, batch) + e2e
        if mode == "closed":  # the ramp, and each client's waits between its requests
            span += ramp_s + think_s * math.ceil(n_eff / clients)

    rows = ROWS_PER_REQUEST * n
    series_rows = busy * (span + 2)
    # in pods, the replay stage writes each pod's step log and series as the pod ends
    # (replay.RunSteps): one pod's share is held at a time
    ran = -(-R // max(pod_r, 1)) if hierarchical else pods  # (hierarchical: a shard a routing pod)
    at_once = 1 if flat else thread_workers(ran, executor)  # pods held at a time
    held = 1.0 if flat else min(1.0, at_once * pod_r / R)
    state = state_bytes(pod_spec)
    if state > MAX_STATE_BYTES:  # allocated zeroed: pages nobody touches stay virtual. Touched: every
        # replica's free list of its KV blocks (8 bytes a block), a page of each replica's tables, and
        # the blocks of the requests in flight (~70 bytes each across block fields, table and hash slots)
        inflight = min(n_eff, max(1, int(busy * full)))
        per_request = math.ceil((mean_p + mean_o) / bs) * 70
        touched = pod_r * (8 * int(sched.num_gpu_blocks) + 4096) + inflight * per_request
        state = min(state, touched)
    state = (state + pod_r * REPLICA_BYTES) * at_once + 16 * n
    compile_needed = jit_compile_needed()
    parts = {
        "process": system.process_rss(),
        "overhead": OVERHEAD_BYTES,
        "compile": COMPILE_BYTES if compile_needed else 0,
        "chains": n * TREE_BUILD_BYTES if chains else 0,
        "engine state": int(state),
        "requests": n
        * (REQUEST_BYTES if not streamed else STREAMED_REQUEST_BYTES if flat else STREAMED_POD_REQUEST_BYTES),
        "step log": int(rows * held * LOG_ROW_BYTES),
        "series": int(series_rows * held * SERIES_ROW_BYTES),
    }

    # wall time, roughly: per event the loop scans every replica it runs
    post = n * 10e-6 + rows * 1e-6 + series_rows * 0.2e-6 + blocks * 0.1e-6
    # the replay's own time: a compile ahead is said apart (engine_progress), never added here
    seconds = 1.0 + blocks * 0.3e-6 + (rows + n) * (pod_r * 4e-9 + 2e-6) / at_once
    units, total = "requests done", n
    return ReplayEstimate(
        requests=n,
        replicas=R,
        engine=engine,
        mode=mode,
        rate_scale=rate_scale,
        arrival_span_s=arrival_span,
        span_s=float(span),
        busy_replicas=int(busy),
        kv_blocks=blocks,
        pod_replicas=pod_r,
        chains_kept=n * TREE_KEPT_BYTES if chains else 0,
        log_rows=rows,
        parts=parts,
        seconds=float(seconds + post),
        progress_units=units,
        progress_total=total,
    )


_ADVICE = {
    "engine state": "use fewer replicas",
    "series": "use fewer replicas or a larger --rate-scale",
    "chains": "replay fewer requests (another date) or a fleet without prefix caching",
    "step log": "replay fewer requests (another date)",
    "requests": "replay fewer requests (another date)",
}

#: What shortens a replay's simulated span where --rate-scale does not apply.
_SHORTER_STEPS = "a fleet with shorter steps (its [engine] step_overhead_s, [calibration] or hardware)"


def advice(part: str, mode: str | None = None) -> str:
    """What to change when ``part`` of a replay's memory is too large, in options that apply to
    its arrival ``mode``: ``--rate-scale`` only in the open loop (it is refused together with
    ``--concurrency`` or ``--offline``); None: a mode not known."""
    if part != "series" or mode == "open":
        return _ADVICE.get(part, "replay fewer requests (another date) or use fewer replicas")
    if mode == "closed":
        return f"use a larger --concurrency (more requests in each step) or {_SHORTER_STEPS}"
    if mode == "offline":
        return f"replay fewer requests (another date) or use {_SHORTER_STEPS}"
    return f"use fewer replicas, {_SHORTER_STEPS}, or in the open loop a larger --rate-scale"


def _raise_hint(limits: Limits) -> str:
    """How to raise the memory limit that binds: the address-space limit, or --max-memory."""
    if limits.address_space is not None:
        return "or raise the address-space limit (ulimit -v) the replay runs under"
    return f"or raise the limit with --max-memory SIZE (${MAX_MEMORY_ENV})"


def span_too_long(span_s: float, verb: str, mode: str | None = None) -> str:
    """The one line refusing a replay whose simulated span is past :data:`MAX_SIM_SPAN_S`;
    ``--rate-scale`` is suggested only for the open loop (``mode``; None: not known)."""
    scale = {
        "open": " or use a larger --rate-scale",
        "closed": " or use a larger --concurrency",
        "offline": "",
    }.get(mode or "", " (or, in the open loop, use a larger --rate-scale)")
    return (
        f"this replay {verb} {format_number(span_s / 86400, 0)} simulated days, more than the "
        f"{MAX_SIM_SPAN_S / 86400:,.0f} days "
        "(limits.MAX_SIM_SPAN_S) its per-second series can hold, whatever --max-sim-days and --max-memory say: "
        f"check the fleet's step cost ([engine] step_overhead_s, [calibration], the hardware's efficiencies){scale}"
    )


def out_of_memory(
    exc: BaseException, doing: str, part: str | None = None, mode: str | None = None
) -> ResourceLimitError:
    """One line for a MemoryError met while ``doing`` (what was being built): what failed to be
    allocated (numpy says the size and shape), what bounds the memory (``ulimit -v``, else the
    machine) and what to change (:func:`advice` for ``part``, in options of ``mode``)."""
    first = (str(exc).strip().splitlines() or [""])[0] or "an allocation failed"
    space = system.address_space_limit()
    bound = (
        f"this process's address-space limit (ulimit -v {format_bytes(space)}) is reached"
        if space is not None
        else "the machine's memory is exhausted"
    )
    raise_it = "raise the address-space limit (ulimit -v)" if space is not None else "run it on a larger machine"
    return ResourceLimitError(
        f"out of memory while {doing}: {first} ({bound}); {advice(part or '', mode)}, or {raise_it}; "
        f"a lower --max-memory (${MAX_MEMORY_ENV}) makes such a replay refuse before it starts"
    )


def enforce(est: ReplayEstimate, limits: Limits | None = None) -> None:
    """Refuse (ResourceLimitError, one line) a replay past the limits: an open-loop span of more
    simulated days than allowed, a span longer than its series can hold (:data:`MAX_SIM_SPAN_S`,
    whatever the limits), or more estimated memory than allowed: by default the smaller of the
    configured limit and what the address-space limit leaves (:func:`replay_limits`)."""
    limits = limits or replay_limits()
    days = est.arrival_span_s / 86400
    if est.mode == "open" and limits.max_sim_days is not None and days > limits.max_sim_days:
        said, limit = distinct_numbers(days, limits.max_sim_days)
        raise ResourceLimitError(
            f"--rate-scale {est.rate_scale:g} spreads the arrivals over {said} simulated days, "
            f"more than the limit of {limit} days ({limits.days_origin}); the series alone would need "
            f"{format_bytes(est.parts['series'])}: use a larger --rate-scale, or raise the limit with "
            f"--max-sim-days DAYS (${MAX_SIM_DAYS_ENV})"
        )
    if not est.span_s <= MAX_SIM_SPAN_S:  # NaN too; whatever the limits
        raise ResourceLimitError(span_too_long(est.span_s, "would cover about", est.mode))
    if limits.max_memory is not None and est.bytes > limits.max_memory:
        raise ResourceLimitError(
            f"this replay would need about {format_bytes(est.bytes)} of memory, more than the limit of "
            f"{format_bytes(limits.max_memory)} ({limits.memory_origin}): {est.drivers()}; "
            f"{advice(est.biggest(), est.mode)}, {_raise_hint(limits)}"
        )


# -- progress --------------------------------------------------------------------------------------


class _Reporter:
    """Engine progress callback (called with the units done so far, often with 0 while the engine
    compiles). Until the first work is done, when the engine compiles first, the line says so
    instead of a count (``replay: compiling the replay engine (one time), 20 s elapsed``). The time
    left is estimated from the first call that reports work done: a compile before it is not
    counted as replay time (it made '2,136 of 19,366 (11%), 2 min elapsed, ~14 min left' of a run
    0.4 s from its end). On a terminal a rich.progress bar on stderr, refreshed live and cleared at
    the end; else a line on the sink every few seconds (none for short runs)."""

    def __init__(self, est: ReplayEstimate, channel: Channel, clock: Callable[[], float] = time.monotonic) -> None:
        self.est = est
        self.sink = channel.sink
        self.every = every_s()
        self.clock = clock
        self.t0 = clock()
        self.next = self.t0 + self.every
        self.total = max(est.progress_total, 1)
        #: (time, units done) at the first call that reported work done: the ETA's origin.
        self.origin: tuple[float, int] | None = None
        #: Whether the engine compiles before its first results (then said instead of progress).
        self.compiling = bool(est.parts.get("compile"))
        self.bar: Any = None
        if channel.live:
            self.bar = self._live_bar()
            channel.open.append(self)

    def _live_bar(self) -> Any:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("replay"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(self.est.progress_units),
            TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = bar.add_task("replay", total=self.total, left="")
        bar.start()
        return bar

    def left_s(self, done: int, now: float) -> float | None:
        """Seconds left at the rate measured since the first work done; None before there is one."""
        if self.origin is None or done >= self.total:
            return None
        t, d = self.origin
        if done <= d or now <= t:
            return None
        return (now - t) * (self.total - done) / (done - d)

    def __call__(self, done: int) -> None:
        now = self.clock()
        if self.origin is None and done > 0:
            self.origin = (now, done)
        if self.bar is not None:
            left = self.left_s(done, now)
            shown = "" if left is None else f"~{format_duration(left)} left"
            if self.origin is None and self.compiling:
                shown = "compiling the replay engine (one time)"
            self.bar.update(self.task, completed=min(done, self.total), left=shown)
            if done >= self.total:
                self.close()
            return
        if now < self.next:
            return
        self.next = now + self.every
        self.sink(self.line(done, now))

    def line(self, done: int, now: float) -> str:
        """The plain progress line: done of total, elapsed, and the time left once measurable."""
        if self.origin is None and self.compiling:
            # the compile is not replay progress: no count, no share, no time left
            return f"replay: compiling the replay engine (one time), {format_duration(now - self.t0)} elapsed"
        share = min(done / self.total, 1.0)
        left = self.left_s(done, now)
        if self.origin is None:
            tail = ", waiting for the engine's first results"
        elif left is not None and share < 1:
            tail = f", ~{format_duration(left)} left"
        else:
            tail = ""
        return (
            f"replay: {done:,} of {self.total:,} {self.est.progress_units} ({share:.0%}), "
            f"{format_duration(now - self.t0)} elapsed{tail}"
        )

    def close(self) -> None:
        if self.bar is not None:
            bar, self.bar = self.bar, None
            bar.stop()


def engine_progress(est: ReplayEstimate) -> Callable[[int], None] | None:
    """The engine progress callback for a replay run from a command (:func:`progress_to`), after
    a line that says the engine compiles first when it does, and one with the estimate when the
    run looks long; None outside a command."""
    installed = SINK.get()
    if installed is None or installed.pid != os.getpid():
        return None
    sink = installed.sink
    if est.parts.get("compile"):
        sink(
            f"replay: compiling the replay engine (one time, ~{format_duration(COMPILE_S)}; cached for later runs "
            "until an upgrade)"
        )
    if est.seconds >= 3 * every_s():
        after = " once compiled" if est.parts.get("compile") else ""
        sink(
            f"replay: estimated ~{format_duration(est.seconds)}{after} and {format_bytes(est.bytes)} of memory "
            f"({est.requests:,} requests on {est.replicas:,} replicas, {est.engine} engine); Ctrl-C stops it"
        )
    return _Reporter(est, installed)
