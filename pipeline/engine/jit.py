"""The jit engine: the whole fleet's event loop compiled by numba (kernels in _jit_kernels.py).

It implements the semantics of docs/engine.md step by step, in the reference engine's order of
operations, with the scheduler state in arrays instead of Python objects: a step costs a few
hundred nanoseconds plus one row of the roofline kernel, so the replay runs at ~10⁵ requests per
wall-second or more. Every router and arrival mode is supported; replicas run interleaved in time
order (least-outstanding routing reads their state at each arrival).

It needs a cost function the compiled loop can evaluate: a :class:`pipeline.stepcost.TabulatedCost`
(the roofline's or a measured profile's tables, dense or MoE), whose ``kernel_args`` it passes to
``stepcost.tab_row``. :func:`unsupported_reason` says why it does not apply otherwise (arbitrary
callables, a block table too large for memory); callers then use
:func:`pipeline.engine.fast.simulate`.

The compiled loop runs without the GIL in a worker thread while the calling thread waits in
short timeouts: it reports progress (requests done) to the ``progress`` callback as it goes, and
a KeyboardInterrupt (Ctrl-C) in the calling thread stops the loop within one event and is
re-raised (docs/limits.md, "Resource limits").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.engine.model import EngineResult, FleetSpec, Workload, dummy_step_s, reject_reasons
from pipeline.engine.steplog import StepLog
from pipeline.stepcost import MAX_TABLE_TOKENS, TabulatedCost
from pipeline.steps import StepCostFn

#: Largest scheduler state (block tables, block pool, prefix-cache table) the jit engine
#: allocates before deferring to the Python engine, whose state grows with use instead.
MAX_STATE_BYTES = 2 * 1024**3

#: How often the calling thread wakes to report progress (and to take a KeyboardInterrupt).
POLL_S = 0.1
#: How long a cancelled loop is waited for before the interrupt is re-raised regardless.
CANCEL_WAIT_S = 2.0

_ROUTER_CODES = {"round_robin": 0, "least_outstanding": 1, "session_affinity": 2, "prefix_affinity": 2}


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
    # int32 block table; per block: 6 int32/bool fields and a uint64 hash; per table slot:
    # a uint64 key, a flag and two int32 list ends.
    per_replica = 4 * cfg.max_num_seqs * max_blocks + 29 * cfg.num_gpu_blocks + 17 * table
    return spec.replicas * per_replica


def unsupported_reason(spec: FleetSpec, cost: StepCostFn) -> str | None:
    """Why the jit engine cannot run ``spec`` with ``cost`` (None when it can)."""
    if _tables(cost, spec) is None:
        return "the cost function is not a tabulated step cost (pipeline.stepcost.TabulatedCost)"
    if state_bytes(spec) > MAX_STATE_BYTES:
        return f"its block tables would take {state_bytes(spec) / 1024**3:.1f} GiB"
    return None


def affinity_replicas(affinity: np.ndarray[Any, np.dtype[np.int64]], replicas: int) -> np.ndarray[Any, Any]:
    """model.affinity_replica over an array of keys (−1 stays −1), in wrapping uint64 numpy."""
    from pipeline.classify.prefix import mix64

    out = (mix64(affinity.astype(np.uint64)) % np.uint64(replicas)).astype(np.int64)
    return np.where(affinity >= 0, out, -1)


def _arg(a: np.ndarray[Any, Any], dtype: Any = None) -> np.ndarray[Any, Any]:
    """An array argument of the compiled loop: C-contiguous and writeable, so that every call has
    the one type signature that is compiled and cached on disk (arrays a Ray worker receives are
    read-only views of its object store, a different numba type: a second compile of minutes)."""
    return np.require(a, dtype, ["C_CONTIGUOUS", "WRITEABLE"])


def simulate_jit(
    work: Workload,
    spec: FleetSpec,
    cost: StepCostFn,
    log: StepLog | None = None,
    progress: Callable[[int], None] | None = None,
    routes: np.ndarray[Any, np.dtype[np.int64]] | None = None,
) -> EngineResult:
    """Replay ``work`` on ``spec`` in the compiled loop: per-request results, spans appended to
    ``log`` (a run of consecutive decode steps of one batch is one row). Raises ValueError when
    :func:`unsupported_reason` says the engine does not apply. ``progress`` gets the arrivals
    taken so far about every ``POLL_S`` seconds while the loop runs, then ``work.n``; a
    KeyboardInterrupt stops the loop (within one event) and propagates. ``routes`` (one replica
    per request, ≥ 0 for every request that is not rejected) replaces the router: a shard of a
    fleet (pipeline/engine/shard.py) replays the routes the whole fleet's router chose."""
    reason = unsupported_reason(spec, cost)
    if reason is not None:
        raise ValueError(f"the jit engine does not apply: {reason}")
    from pipeline.engine import _jit_kernels as k  # imports numba: only when the engine runs

    tables = _tables(cost, spec)
    assert tables is not None
    raw = tables.kernel_args
    # Fixed dtypes, so that every call reuses one compiled (and disk-cached) specialisation.
    args = tuple(_arg(a) if isinstance(a, np.ndarray) else float(a) for a in raw)
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
        if routes.shape != (n,) or (routes >= spec.replicas).any():
            raise ValueError("routes must name one of the replicas for every request")
        aff_rep, router = _arg(routes, np.int64), _ROUTER_CODES["session_affinity"]
    caching = cfg.enable_prefix_caching and work.has_chains
    tree = work.chain_tree if caching else None
    none_i, none_u = np.zeros(0, np.int64), np.zeros(0, np.uint64)
    depth = tree.max_depth() if tree is not None else 1
    ctl = np.zeros(2)  # [cancel flag, requests done]: see run_fleet
    kernel_args = (
        times,
        _arg(work.prompt_tokens, np.int64),
        _arg(work.output_tokens, np.int64),
        _arg(work.offsets(), np.int64),
        _arg(work.chain_hashes, np.uint64),
        aff_rep,
        res.reject_reason != 0,
        _arg(tree.rows, np.int64) if tree is not None else none_i,
        _arg(tree.key, np.uint64) if tree is not None else none_u,
        _arg(tree.up, np.int64) if tree is not None else none_i,
        _arg(tree.fb, np.int64) if tree is not None else none_i,
        np.zeros(depth, np.int64),
        np.zeros(depth, np.int64),
        int(spec.replicas),
        router,
        spec.mode == "closed",
        min(int(spec.concurrency), n) if spec.mode == "closed" else 0,  # clients beyond n never issue
        int(cfg.num_gpu_blocks),
        int(cfg.max_num_seqs),
        int(cfg.max_num_batched_tokens),
        int(cfg.block_size),
        bool(cfg.enable_chunked_prefill),
        bool(caching),
        max_blocks,
        table,
        log is not None,
        int(spec.lockstep),
        dummy_step_s(tables),
        *args,
        res.arrival_s,
        res.replica,
        res.scheduled_s,
        res.first_token_s,
        res.finish_s,
        res.max_itl_s,
        res.preemptions,
        res.cache_hit_tokens,
        res.prefill_tokens,
        ctl,
    )
    rows, nrows = _run_in_thread(k.run_fleet, kernel_args, ctl, progress)
    if progress is not None:
        progress(n)
    if log is not None:
        log.extend_rows(rows[:nrows])
    return res


def _run_in_thread(
    kernel: Callable[..., Any],
    args: tuple[Any, ...],
    ctl: np.ndarray[Any, np.dtype[np.float64]],
    progress: Callable[[int], None] | None,
) -> Any:
    """``kernel(*args)`` in a worker thread (the kernel is compiled ``nogil``), the calling thread
    waiting in ``POLL_S`` timeouts: it passes ``ctl[1]`` (requests done) to ``progress`` when it
    changes, and on KeyboardInterrupt sets ``ctl[0]`` so the loop stops at its next event, waits
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
    reported = -1
    try:
        while not done.wait(POLL_S):
            if progress is not None and int(ctl[1]) != reported:
                reported = int(ctl[1])
                progress(reported)
    except KeyboardInterrupt:
        ctl[0] = 1.0
        done.wait(CANCEL_WAIT_S)
        raise
    if "error" in box:
        raise box["error"]
    return box["out"]
