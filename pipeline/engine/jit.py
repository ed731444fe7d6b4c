"""The jit engine: the whole fleet's event loop compiled by numba (kernels in _jit_kernels.py).

It implements the semantics of docs/engine.md step by step, in the reference engine's order of
operations, with the scheduler state in arrays instead of Python objects: a step costs a few
hundred nanoseconds plus one row of the roofline kernel, so the replay runs at ~10⁵ requests per
wall-second or more. Every router and arrival mode is supported; replicas run interleaved in time
order (least-outstanding routing reads their state at each arrival).

It is the one production engine: every replay (the replay stage, pods, plan, fit, validate,
calibrate, loadcurve) runs here; :mod:`pipeline.engine.reference` is the per-step oracle the tests
hold it equal to. It needs a cost function the compiled loop can evaluate: a
:class:`pipeline.costmodel.stepcost.TabulatedCost` (the roofline's or a measured profile's tables, dense or
MoE; every fleet's cost is one, ``profile.cost.fleet_step_cost``), whose ``kernel_args`` it passes
to ``stepcost.tab_row``. :func:`unsupported_reason` says why a cost is not one. Any scheduler
state runs: block tables and prefix-cache tables are allocated zeroed (calloc'd, so pages no
request touches cost nothing); a state the machine cannot allocate is one error line
(:class:`EngineStateTooLarge`), and the replay's memory guard (pipeline/replay/limits.py) refuses it
before it starts.

The compiled loop runs without the GIL in a worker thread while the calling thread waits in
short timeouts: it reports progress (requests done) to the ``progress`` callback as it goes, and
a KeyboardInterrupt (Ctrl-C) in the calling thread stops the loop within one event and is
re-raised (docs/limits.md, "Resource limits").
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.common.blockhash import mix64
from pipeline.common.errors import RooftraceError
from pipeline.costmodel.stepcost import MAX_TABLE_TOKENS, TabulatedCost, affine_cost, scalars
from pipeline.costmodel.stepcost import kernel_array as _arg
from pipeline.costmodel.steps import IntArray, StepCostFn
from pipeline.engine.jitcache import await_compile_ahead, compile_needed
from pipeline.engine.model import (
    SCALING_SIGNALS,
    EngineResult,
    FleetSpec,
    Scaling,
    SchedulerConfig,
    Workload,
    apply_frontend,
    dummy_step_s,
    reject_reasons,
    timeline_spec,
)
from pipeline.engine.steplog import SPAN_COLUMNS, RowSink

#: Scheduler state (block tables, block pool, prefix-cache table) least outstanding starts on:
#: as many replicas as fit in it (:func:`fitting_replicas`), then twice as many while its last
#: replica was used (:func:`simulate_jit`). Not a limit: a state past it runs when memory holds it.
MAX_STATE_BYTES = 2 * 1024**3

#: How often the calling thread wakes to report progress (and to take a KeyboardInterrupt).
POLL_S = 0.1
#: How long a cancelled loop is waited for before the interrupt is re-raised regardless.
CANCEL_WAIT_S = 2.0


class Cancelled(Exception):
    """Raised by a ``progress`` callback to stop the loop as a KeyboardInterrupt does (the pods
    of a thread executor, cancelled by the thread that waits on them): it propagates the same."""


#: The step log's replica column.
REPLICA_COL = list(SPAN_COLUMNS).index("replica")

_ROUTER_CODES = {
    "round_robin": 0, "least_outstanding": 1, "session_affinity": 2, "prefix_affinity": 2, "most_free_kv": 3,
}  # fmt: skip


def _tables(cost: StepCostFn, spec: FleetSpec) -> TabulatedCost | None:
    """``cost`` with tables covering every step ``spec`` can run (None: not tabulated)."""
    if not isinstance(cost, TabulatedCost):
        return None
    cfg = spec.scheduler
    # beyond MAX_TABLE_TOKENS the kernel extrapolates (stepcost._tab)
    need = min(max(cfg.max_num_batched_tokens, cfg.max_num_seqs) + 1, MAX_TABLE_TOKENS)
    if cost.max_tokens < need:
        if cost.extend is None:
            return None
        cost = cost.extend(need)
    return cost


def _shape(spec: FleetSpec) -> tuple[int, int]:
    """(blocks per request in the block table, prefix-cache table size) for ``spec``."""
    cfg = spec.scheduler
    max_blocks = min(cfg.num_gpu_blocks, -(-cfg.max_model_len // cfg.block_size)) + 1
    table = 1
    if cfg.enable_prefix_caching:
        # At most num_gpu_blocks distinct hashes are cached: keep the load factor <= 1/2.
        table = 1 << int(2 * cfg.num_gpu_blocks).bit_length()
    return max_blocks, table


def state_bytes(spec: FleetSpec) -> int:
    """Bytes of scheduler state the jit engine allocates for ``spec`` (per-request arrays aside)."""
    cfg = spec.scheduler
    if not cfg.enable_prefix_caching:
        return spec.replicas * 64 * cfg.max_num_seqs  # counts only: no block ids are kept
    max_blocks, table = _shape(spec)
    # int32 block table; per block: 5 int32/bool fields and a uint64 hash, and the free queue's
    # int32 ring (ring_slots); per table slot: a uint64 key and its holder list's two ends packed
    # in a uint64.
    C = cfg.num_gpu_blocks
    per_replica = 4 * cfg.max_num_seqs * max_blocks + 25 * C + 4 * ring_slots(C) + 16 * table
    return spec.replicas * per_replica


def unsupported_reason(spec: FleetSpec, cost: StepCostFn) -> str | None:
    """Why the jit engine cannot run ``spec`` with ``cost`` (None when it can): only a cost the
    compiled loop cannot evaluate (the state's size is memory's to say: :class:`EngineStateTooLarge`)."""
    if not isinstance(cost, TabulatedCost):
        return (
            "the step cost is a plain callable, not a tabulated step cost (pipeline.costmodel.stepcost.TabulatedCost): "
            "build one with profile.cost.fleet_step_cost or stepcost.affine_cost"
        )
    if _tables(cost, spec) is None:
        need = min(max(spec.scheduler.max_num_batched_tokens, spec.scheduler.max_num_seqs) + 1, MAX_TABLE_TOKENS)
        return f"the step cost's tables cover {cost.max_tokens:,} tokens, the fleet's steps {need:,} (no extend)"
    return None


class EngineStateTooLarge(RooftraceError):
    """The compiled loop's scheduler state could not be allocated (one line: what to do)."""


def state_too_large(spec: FleetSpec) -> str:
    """The one line for a scheduler state of ``spec`` that memory cannot hold, and what to do."""
    return (
        f"the replay engine's scheduler state for {spec.replicas:,} replicas ({state_bytes(spec) / 1024**3:,.1f} GiB "
        "of block tables, KV block pool and prefix-cache table) does not fit in memory: replay in pods "
        "(replay --pods N, or FLEET.toml router_pod_size), or use fewer replicas, a smaller max_num_seqs "
        "or num_gpu_blocks_override"
    )


def affinity_replicas(affinity: np.ndarray[Any, np.dtype[np.int64]], replicas: int) -> np.ndarray[Any, Any]:
    """model.affinity_replica over an array of keys (−1 stays −1), in wrapping uint64 numpy."""
    out = (mix64(affinity.astype(np.uint64)) % np.uint64(replicas)).astype(np.int64)
    return np.where(affinity >= 0, out, -1)


def fitting_replicas(spec: FleetSpec, limit: int | None = None) -> int:
    """Most replicas of ``spec`` (whole lockstep groups, at least one group) whose state fits in
    ``limit`` bytes (default: what the compiled loop allocates at most, ``MAX_STATE_BYTES``)."""
    G = max(spec.lockstep, 1)
    limit = MAX_STATE_BYTES if limit is None else limit
    return max(G, limit // max(state_bytes(replace(spec, replicas=G)), 1) * G)


def reachable_prefix(work: Workload, spec: FleetSpec, routed: int | None = None) -> int:
    """Replicas round robin and least outstanding can reach: one per routed request (``routed``,
    default: those not rejected; whole lockstep groups), the lowest-numbered first
    (:func:`busy_fleet`)."""
    G = max(spec.lockstep, 1)
    if routed is None:
        routed = int((reject_reasons(work, spec.scheduler) == 0).sum())
    return min(spec.replicas, max(G, -(-routed // G) * G))


@dataclass(frozen=True)
class BusyFleet:
    """The replicas the compiled loop runs for a workload: only those that can receive a request
    (a replica that never holds one cannot change anyone's result, so it costs nothing).

    spec    the fleet the loop runs (``replicas`` possibly fewer than the fleet's)
    routes  each request's replica in it (None: the router chooses, on a prefix of the fleet)
    back    each replica's index in the whole fleet (None: the same)
    open_top  least outstanding on fewer replicas than requests: the run is the whole fleet's
            only if its last replica received no request (else :func:`simulate_jit` runs again
            on twice as many)"""

    spec: FleetSpec
    routes: IntArray | None
    back: IntArray | None
    open_top: bool = False


def busy_fleet(work: Workload, spec: FleetSpec, routes: IntArray | None = None) -> BusyFleet:
    """The part of ``spec`` the workload can reach (docs/engine.md, "Replicas that hold no request").

    Round robin and least outstanding (ties to the lowest index) only ever pick from a prefix of
    the replicas (an unused replica is idle, so a lower unused one is always chosen first): with
    ``m`` requests routed, the first ``m`` replicas (whole lockstep groups) are the whole fleet.
    With static routes (given, or session/prefix affinity with a key on every request) the
    lockstep groups that receive a request are kept, renumbered in order."""
    R, G = spec.replicas, max(spec.lockstep, 1)
    ok = reject_reasons(work, spec.scheduler) == 0
    if routes is None and spec.router in ("round_robin", "least_outstanding", "most_free_kv"):
        keep = reachable_prefix(work, spec, int(ok.sum()))
        open_top = False
        if spec.router == "least_outstanding" and keep > G:
            # only as many replicas are used as are ever busy at once: start with what fits
            fits = fitting_replicas(spec)
            open_top, keep = fits < keep, min(keep, fits)
        return BusyFleet(replace(spec, replicas=keep) if keep < R else spec, None, None, open_top)
    if routes is None and spec.router in ("session_affinity", "prefix_affinity") and work.affinity is not None:
        reps = affinity_replicas(np.asarray(work.affinity, np.int64), R)
        if (reps[ok] >= 0).all():
            routes = np.where(ok, reps, -1).astype(np.int64)
    if routes is None:
        return BusyFleet(spec, None, None)
    groups = np.unique(routes[ok & (routes >= 0)] // G)
    if groups.size == 0:
        groups = np.zeros(1, np.int64)
    if groups.size * G >= R:
        return BusyFleet(spec, routes, None)
    at = np.maximum(routes, 0)
    compact = np.where(routes >= 0, np.searchsorted(groups, at // G) * G + at % G, -1)  # no array of R
    back = (groups[:, None] * G + np.arange(G, dtype=np.int64)).ravel()
    return BusyFleet(replace(spec, replicas=int(groups.size) * G), compact.astype(np.int64), back)


def simulate_jit(
    work: Workload,
    spec: FleetSpec,
    cost: StepCostFn,
    log: RowSink | None = None,
    progress: Callable[[int], None] | None = None,
    routes: np.ndarray[Any, np.dtype[np.int64]] | None = None,
    scaling: Scaling | None = None,
) -> EngineResult:
    """Replay ``work`` on ``spec`` in the compiled loop: per-request results, spans appended to
    ``log`` (a run of consecutive decode steps of one batch is one row). Raises ValueError when
    :func:`unsupported_reason` says the engine does not apply. ``progress`` gets the arrivals
    taken so far about every ``POLL_S`` seconds while the loop runs, then ``work.n``; a
    KeyboardInterrupt stops the loop (within one event) and propagates. ``routes`` (one replica
    per request, ≥ 0 for every request that is not rejected) replaces the router: a shard of a
    fleet (pipeline/engine/shard.py) replays the routes the whole fleet's router chose.
    ``scaling`` has the loop decide which replicas are live as it goes (an autoscaled pool: the
    open loop, round robin or least outstanding, no lockstep groups); the decisions and the
    windows' signals are filled in.

    Only the replicas the workload can reach are run (:func:`busy_fleet`; with ``scaling``, all
    of them); results and log name replicas of the whole fleet, as if all had been run."""
    if routes is not None and (routes.shape != (work.n,) or (routes >= spec.replicas).any()):
        raise ValueError("routes must name one of the replicas for every request")
    spec = timeline_spec(spec, cost)  # a calibrated cost's timeline terms (stackcal.apply)
    if scaling is not None:
        _check_scaling(spec, scaling, routes)
        busy = BusyFleet(spec, None, None)
    else:
        busy = busy_fleet(work, spec, routes)
    want_log = log is not None or (scaling is not None and scaling.signal != "schedule")
    while True:
        res, rows = _run_busy(work, busy, cost, want_log, progress, scaling)
        top = busy.spec.replicas - 1
        if not busy.open_top or not (res.replica == top).any():
            break
        # least outstanding used every replica it was given: the fleet's next one might have
        # been chosen; run again on twice as many (up to the reachable prefix: busy_fleet)
        reach = reachable_prefix(work, spec)
        bigger = replace(busy.spec, replicas=min(reach, 2 * busy.spec.replicas))
        busy = BusyFleet(bigger, None, None, bigger.replicas < reach)
    if busy.back is not None:
        ran = res.replica >= 0
        res.replica[ran] = busy.back[res.replica[ran]]
        if log is not None:
            rows[:, REPLICA_COL] = busy.back[rows[:, REPLICA_COL].astype(np.int64)]
    if log is not None:
        log.extend_rows(rows)
    apply_frontend(res, work.output_tokens, spec)  # the API server's front end (model.apply_frontend)
    return res


def _check_scaling(spec: FleetSpec, scaling: Scaling, routes: np.ndarray[Any, Any] | None) -> None:
    """ValueError when the loop cannot decide ``scaling``'s live set on ``spec``."""
    if routes is not None:
        raise ValueError("a live replica set decided in the loop routes every request itself: no routes")
    if spec.router not in ("round_robin", "least_outstanding") or spec.mode != "open" or spec.lockstep > 1:
        raise ValueError(
            "a live replica set decided in the loop needs the open loop, round_robin or least_outstanding and no "
            f"lockstep groups (got {spec.mode}, {spec.router}, lockstep {spec.lockstep})"
        )
    if scaling.signal != "schedule" and scaling.signal not in SCALING_SIGNALS:
        raise ValueError(f"scaling signal {scaling.signal!r} unknown")
    if not 1 <= scaling.initial <= spec.replicas or scaling.max_replicas > spec.replicas:
        raise ValueError(f"scaling's replicas ({scaling.initial}, at most {scaling.max_replicas}) exceed the fleet's")


def _scaling_state(scaling: Scaling, R: int) -> tuple[Any, ...]:
    from pipeline.engine import _jit_kernels as k  # lazy: numba, loaded only when a replay runs

    mode = 0 if scaling.signal == "schedule" else 1 + SCALING_SIGNALS.index(scaling.signal)
    plan = np.array(scaling.planned, np.float64).reshape(-1, 2)
    return k.scaling_state(
        R, mode, scaling.windows if mode else 1, scaling.window_s, scaling.scale_up_at, scaling.scale_down_at,
        scaling.cooldown_s, scaling.min_replicas, scaling.max_replicas, scaling.delay_s, plan[:, 0].copy(),
        plan[:, 1].astype(np.int64), scaling.initial,
    )  # fmt: skip


def _scaling_done(scaling: Scaling, sc: tuple[Any, ...]) -> None:
    """``scaling``'s decisions and windows' signals, from the loop's state ``sc``."""
    if scaling.signal == "schedule":
        scaling.decisions = list(scaling.planned)
        return
    made = int(sc[22][4])
    scaling.decisions = [(float(t), int(n)) for t, n in zip(sc[20][:made], sc[21][:made], strict=True)]
    sig = sc[19]
    scaling.signals = {"live": sig[:, 0].copy()}
    scaling.signals.update({name: sig[:, 1 + i].copy() for i, name in enumerate(SCALING_SIGNALS)})


def _run_busy(
    work: Workload,
    busy: BusyFleet,
    cost: StepCostFn,
    want_log: bool,
    progress: Callable[[int], None] | None,
    scaling: Scaling | None = None,
) -> tuple[EngineResult, np.ndarray[Any, np.dtype[np.float64]]]:
    """One run of the compiled loop on ``busy``: results (replicas of ``busy.spec``) and the step
    log's rows (``scaling``: filled in)."""
    spec = busy.spec
    reason = unsupported_reason(spec, cost)
    if reason is not None:
        raise ValueError(f"the replay engine does not apply: {reason}")
    from pipeline.engine import _jit_kernels as k  # lazy: numba, imported only when the engine runs

    kernel_args, res, ctl = _kernel_args(work, busy, cost, want_log)
    sc = _scaling_state(scaling, busy.spec.replicas) if scaling is not None else None

    def run_fleet(*args: Any) -> Any:
        if spec.lockstep <= 1:  # what a compile ahead compiles: wait for it, then load it
            await_compile_ahead()
        return k.run_fleet(*args)

    try:
        rows, nrows = _run_in_thread(run_fleet, (*kernel_args, sc), ctl, progress)
    except MemoryError:
        raise EngineStateTooLarge(state_too_large(spec)) from None
    if scaling is not None and sc is not None:
        _scaling_done(scaling, sc)
    if progress is not None:
        progress(work.n)
    return res, rows[:nrows]


def _kernel_args(
    work: Workload, busy: BusyFleet, cost: StepCostFn, want_log: bool
) -> tuple[tuple[Any, ...], EngineResult, np.ndarray[Any, np.dtype[np.float64]]]:
    """run_fleet's arguments for a run on ``busy``, the results they fill in, and the loop's
    control array (cancel flag, requests done)."""
    from pipeline.engine import _jit_kernels as k  # lazy: numba, loaded only when a replay runs

    spec, routes = busy.spec, busy.routes
    tables = _tables(cost, spec)
    assert tables is not None
    n = work.n
    cfg = spec.scheduler
    res = EngineResult.empty(n)
    res.reject_reason[:] = reject_reasons(work, cfg)
    max_blocks, table = _shape(spec)
    times = np.zeros(n) if spec.mode == "offline" else _arg(work.arrival_s, np.float64)
    aff = work.affinity if work.affinity is not None else np.full(n, -1, np.int64)
    aff_rep = affinity_replicas(np.asarray(aff, np.int64), spec.replicas)
    router = _ROUTER_CODES[spec.router]
    if routes is not None:
        aff_rep, router = _arg(routes, np.int64), _ROUTER_CODES["session_affinity"]
    caching = cfg.enable_prefix_caching and work.has_chains
    tree = work.chain_tree if caching else None
    none_i, none_u = np.zeros(0, np.int64), np.zeros(0, np.uint64)
    depth = tree.max_depth() if tree is not None else 1
    ctl = np.zeros(2)  # [cancel flag, requests done]: see run_fleet
    sd = spec.speculation
    try:
        pool = alloc_pool(
            int(spec.replicas), int(cfg.max_num_seqs), int(cfg.num_gpu_blocks), bool(caching), max_blocks, table
        )
    except MemoryError:
        raise EngineStateTooLarge(state_too_large(spec)) from None
    wl = k.Work(
        times=times,
        prompt=_arg(work.prompt_tokens, np.int64),
        output=_arg(work.output_tokens, np.int64),
        chain_off=_arg(work.offsets(), np.int64),
        chain=_arg(work.chain_hashes, np.uint64),
        aff_rep=aff_rep,
        rejected=res.reject_reason != 0,
        t_rows=_arg(tree.rows, np.int64) if tree is not None else none_i,
        t_key=_arg(tree.key, np.uint64) if tree is not None else none_u,
        t_up=_arg(tree.up, np.int64) if tree is not None else none_i,
        t_fb=_arg(tree.fb, np.int64) if tree is not None else none_i,
        rec_node=np.zeros(depth, np.int64),
        rec_fb=np.zeros(depth, np.int64),
        skip=_arg(work.skipped_tokens(), np.int64),
        draft_pass_s=np.array(sd.draft_pass_s if sd is not None else (), np.float64),
    )
    fleet = k.Fleet(
        replicas=int(spec.replicas),
        router=router,
        closed=spec.mode == "closed",
        capacity=int(cfg.num_gpu_blocks),
        max_seqs=int(cfg.max_num_seqs),
        budget=int(cfg.max_num_batched_tokens),
        block_size=int(cfg.block_size),
        chunked=bool(cfg.enable_chunked_prefill),
        caching=bool(caching),
        want_log=want_log,
        lockstep=int(spec.lockstep),
        # (only a lockstep group has idle ranks: without, no step reads it, and pricing it would
        # compile the tabulated cost's own kernel, stepcost.tab_rows, before the loop)
        dummy_s=dummy_step_s(tables) if spec.lockstep > 1 else 0.0,
        think_s=float(spec.think_s),
        concurrency=min(int(spec.concurrency), n) if spec.mode == "closed" else 0,  # clients beyond n never issue
        ramp_step_s=float(spec.ramp_step_s),  # (from the whole concurrency: the ramp's pace does not depend on n)
        max_blocks=max_blocks,
        async_scheduling=bool(cfg.async_scheduling),
        spec_k=sd.k if sd is not None else 0,
        spec_e=sd.mean_accepted if sd is not None else 1.0,
        draft_ctx_s=sd.draft_ctx_s if sd is not None else 0.0,
    )
    results = k.Results(
        res.arrival_s,
        res.replica,
        res.scheduled_s,
        res.first_token_s,
        res.finish_s,
        res.max_itl_s,
        res.preemptions,
        res.cache_hit_tokens,
        res.prefill_tokens,
    )
    return (wl, fleet, tables.kernel_tables, results, ctl, pool), res, ctl


def _sample(lockstep: int) -> tuple[Workload, FleetSpec, TabulatedCost]:
    """A one-request replay on a fleet of ``lockstep`` replicas in one lockstep group (1: no
    groups), with a stand-in cost: what :func:`compile_engine` runs."""
    one = np.ones(2)
    cost = affine_cost(np.zeros((2, 7)), np.zeros((2, 7)), one, one, np.array([True, False]), one, scalars())
    work = Workload(np.zeros(1), np.array([40]), np.array([3]), np.array([7], np.uint64), np.array([0, 1]))
    cfg = SchedulerConfig(num_gpu_blocks=64, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128,
                          block_size=16, enable_chunked_prefill=True, enable_prefix_caching=True)  # fmt: skip
    return work, FleetSpec(replicas=lockstep, scheduler=cfg, lockstep=lockstep), cost


def _sample_loop_args(lockstep: int) -> tuple[Any, ...]:
    """_replay's arguments for :func:`_sample` (their types are every replay's)."""
    from pipeline.engine import _jit_kernels as k  # lazy: numba, loaded only when a replay runs

    work, spec, cost = _sample(lockstep)
    kernel_args, _, _ = _kernel_args(work, BusyFleet(spec, None, None), cost, False)
    return k.loop_args(*kernel_args)


def compile_engine(lockstep: int = 1, parallel: bool = False) -> None:
    """Compile the engine's loop into numba's disk cache (load it, when cached): a one-request
    replay on a fleet of ``lockstep`` replicas in one lockstep group (1: the loop of fleets
    without groups; more: the loop of fleets with). Every fleet and cost gives the compiled loop
    the same argument types (run_fleet's), so this compiles what every replay runs
    (jitcache.compile_ahead runs it in a background process; tests/compile_engine.py too).

    ``parallel`` (the loop without groups): when the cache lacks it, a second process compiles
    the step-cost kernels and the decode spans meanwhile (:func:`compile_side`; the order is
    _jit_kernels's "compile in two processes"): on two cores the compile takes some 30 % less
    wall time (docs/benchmarks.md)."""
    if parallel and lockstep <= 1 and compile_needed():
        _compile_parallel()
    work, spec, cost = _sample(lockstep)
    simulate_jit(work, spec, cost)


def _compile_parallel() -> None:
    from pipeline.engine import _jit_kernels as k  # lazy: numba; importing drops a stale cache before the side starts

    root = str(Path(__file__).resolve().parents[2])  # where this `pipeline` package is imported from
    code = f"import sys; sys.path.insert(0, {root!r}); from pipeline.engine.jit import compile_side; compile_side()"
    try:
        side = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
    except OSError:  # no process to spare: all of it compiles here
        return
    try:
        args = _sample_loop_args(1)
        k.compile_leaves(args)
        assert side.stdout is not None
        side.stdout.readline()  # the side has cached stepcost.tab_row (nothing read: it failed, _step compiles it)
        k.compile_step(args)
        side.wait()  # _replay loads the side's spans from the cache (or compiles them, if it failed)
    finally:
        if side.poll() is None:
            side.kill()
            side.wait()


def compile_side() -> None:
    """The second process of :func:`compile_engine`'s parallel compile: the step-cost kernel of
    the general step (then says so on stdout), the decode spans' kernels and _span_one, all into
    the disk cache."""
    from pipeline.engine import _jit_kernels as k  # lazy: numba, loaded only when a replay runs

    args = _sample_loop_args(1)
    k.compile_kernels(args)
    sys.stdout.write("kernels\n")
    sys.stdout.flush()
    k.compile_spans(args)


def ring_slots(C: int) -> int:
    """Slots of the free queue's ring for ``C`` blocks: the power of two at least ``2 C`` (a full
    ring then holds at least ``C`` stale entries, so compacting it frees half of it)."""
    return 1 << int(2 * C - 1).bit_length()


def alloc_pool(R: int, S: int, C: int, caching: bool, max_blocks: int, T: int) -> tuple[Any, ...]:
    """The compiled loop's KV pools for ``R`` replicas of ``S`` sequence slots and ``C`` blocks
    (``max_blocks`` a sequence, a prefix-cache table of ``T`` slots): (nfree, fh, fq, fpos,
    ft, ref, table, bhash, hashed, hprev, hnext, ht, mask).

    Allocated by numpy, whose zeroed arrays are calloc'd: pages of a block table or a hash table
    that no request touches are never written and cost no memory (the compiled np.zeros wrote
    every byte: 0.15 s and 0.19 GB of block tables for 45 replicas of the default fleet, most
    of them never used). Only the free list, which starts out full, is written here."""
    # Block ids are tracked only with prefix caching: without hashes blocks are interchangeable
    # and counts say everything (no block table, no free queue).
    Cp = C if caching else 1
    table = np.zeros((R, S, max_blocks if caching else 1), np.int32)
    # KV pool: the free queue in eviction order (head evicted first), a ring of block ids at least
    # twice the blocks long with lazy removal (_jit_kernels._pop_block): every block free, in id
    # order (fq the ring, fpos a block's slot in it, fh and ft the head's and tail's positions).
    ref = np.zeros((R, Cp), np.int32)
    fq = np.zeros((R, ring_slots(Cp)), np.int32)
    fq[:, :Cp] = np.arange(Cp, dtype=np.int32)
    fpos = np.empty((R, Cp), np.int32)
    fpos[:] = np.arange(Cp, dtype=np.int32)
    fh = np.zeros(R, np.int64)
    ft = np.full(R, Cp, np.int64)
    nfree = np.full(R, C, np.int64)
    bhash = np.zeros((R, Cp), np.uint64)
    hashed = np.zeros((R, Cp), np.bool_)
    hprev = np.zeros((R, Cp), np.int32)
    hnext = np.zeros((R, Cp), np.int32)
    # The prefix cache's table: slot i is words 2i (its key) and 2i + 1 (its holder list's ends,
    # packed; 0 when empty), so a probe reads one cache line (_jit_kernels._find).
    ht = np.zeros((R, 2 * T), np.uint64)
    return nfree, fh, fq, fpos, ft, ref, table, bhash, hashed, hprev, hnext, ht, T - 1


def _run_in_thread(
    kernel: Callable[..., Any],
    args: tuple[Any, ...],
    ctl: np.ndarray[Any, np.dtype[np.float64]],
    progress: Callable[[int], None] | None,
) -> Any:
    """``kernel(*args)`` in a worker thread (the kernel is compiled ``nogil``), the calling thread
    waiting in ``POLL_S`` timeouts: it passes ``ctl[1]`` (requests done) to ``progress`` at each
    one, and on KeyboardInterrupt sets ``ctl[0]`` so the loop stops at its next event, waits
    up to ``CANCEL_WAIT_S`` for it and re-raises (the thread is a daemon: it never holds up the
    process's exit). It waits on an Event, not ``Thread.join``: in Python 3.11 a join interrupted
    by KeyboardInterrupt marks a running thread as stopped."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["out"] = kernel(*args)
        except BaseException as exc:  # re-raised in the calling thread
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, name="rooftrace-jit-engine", daemon=True)
    worker.start()
    try:
        while not done.wait(POLL_S):
            if progress is not None:  # every poll, changed or not: a compile says how long it has taken
                progress(int(ctl[1]))
    except (KeyboardInterrupt, Cancelled):
        ctl[0] = 1.0
        done.wait(CANCEL_WAIT_S)
        raise
    if "error" in box:
        raise box["error"]
    return box["out"]
