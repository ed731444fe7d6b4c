"""A fleet replayed in pods: the replicas cut into contiguous shards, one engine run per shard.

When the router keeps no shared state — round robin, or session/prefix affinity with a key for
every request — the replica each request goes to is known before the replay (:func:`static_routes`
computes it exactly as the engine's router would), and replicas never read each other's state:
the engine bounds a replica's decode spans by that replica's own next arrival under static
routing. So each pod can be replayed alone, on its own requests, and the fleet's results are the
pods' results put back together — bit for bit the single-process replay's (tested). A pod holds
whole lockstep groups (data-parallel ranks step together).

Least-outstanding routing reads every replica's queue at each arrival, and the closed loop
shares its clients across replicas: neither shards exactly, and :func:`plan_pods` refuses them.

A replay asked for no pods still runs in them when its router shards exactly and the replicas
its requests reach would hold more engine state than AUTO_POD_STATE_BYTES (:func:`auto_pods`):
memory then follows one pod's replicas, not the fleet's, with the same results.

Pods run one after another in this process (``local``: the memory of one pod at a time), in
threads of this process, one a usable core at once (``thread``: the compiled loop releases the
GIL, and each thread cuts its own pod's requests out of the day, so nothing is copied to another
process; the memory of that many pods at a time), in spawned worker processes (``process``), or
as Ray tasks (``ray``, the optional extra). Whatever the executor, pods are handed back in
order, so what a replay writes is the same bytes.

A replay asked for no pods also runs in them when it can use the thread executor on a machine
with more than one usable core and has at least AUTO_THREAD_REQUESTS requests: a pod a core.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.common import system
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.units import format_bytes
from pipeline.costmodel.stepcost import TabulatedCost
from pipeline.costmodel.steps import StepCostFn
from pipeline.engine.jit import (
    CANCEL_WAIT_S,
    POLL_S,
    REPLICA_COL,
    Cancelled,
    _tables,
    affinity_replicas,
    fitting_replicas,
    simulate_jit,
    state_bytes,
    unsupported_reason,
)
from pipeline.engine.model import EngineResult, FleetSpec, Workload, reject_reasons
from pipeline.engine.steplog import SPAN_COLUMNS, RowSink

IntArray = npt.NDArray[np.int64]
#: Request rows (int32 when a day's count fits, else int64) and routes within a pod (int32).
RowArray = npt.NDArray[Any]

#: Where pods run.
EXECUTORS: tuple[str, ...] = ("local", "thread", "process", "ray")

#: Most pods a replay may be cut into.
MAX_PODS = 1_000_000

#: A replay that shards exactly runs in pods of its own accord when the replicas its requests
#: reach would hold more engine state than this (block tables, KV pool, prefix-cache table):
#: 256 MiB is about 45 replicas of Llama-3.1-8B on H100 with prefix caching.
AUTO_POD_STATE_BYTES = 256 << 20
#: ... and when it streams its step log to the store (``rooftrace replay``) and has more requests
#: than this, it runs in enough pods that one holds about this many (when the fleet has as many
#: lockstep groups): a pod's step log is written as the pod ends, one engine's whole day's log
#: would be held (10⁷ requests: about 22 GiB estimated, refused at the default memory limit).
AUTO_POD_REQUESTS = 500_000
#: ... and, given usable cores (the thread executor), when it has at least this many requests it
#: runs in a pod a core (as many as it has lockstep groups): below, a replay takes about a second.
AUTO_THREAD_REQUESTS = 100_000


def static_routes(work: Workload, spec: FleetSpec) -> RowArray | None:
    """The replica of every request that is not rejected (−1 for rejected ones) when the router
    needs no shared state, as the engine's router assigns them; None otherwise."""
    if spec.mode == "closed":
        return None
    n, R = work.n, spec.replicas
    rejected = reject_reasons(work, spec.scheduler) != 0
    if spec.router == "round_robin":
        # the engine takes arrivals in (time, index) order and counts the ones it routes
        times = work.arrival_s
        if spec.mode == "offline" or n < 2 or bool((times[1:] >= times[:-1]).all()):  # in that order already
            routes = np.cumsum(~rejected, dtype=_row_dtype(max(n, R)))
            routes -= 1
            routes %= R
            routes[rejected] = -1
            return routes
        order = np.argsort(times, kind="mergesort")
        taken = order[~rejected[order]]
        routes = np.full(n, -1, _row_dtype(max(n, R)))
        routes[taken] = np.arange(taken.shape[0], dtype=np.int64) % R
        return routes
    if spec.router in ("session_affinity", "prefix_affinity") and work.affinity is not None:
        rep = affinity_replicas(np.asarray(work.affinity, np.int64), R)
        if (rep[~rejected] < 0).any():  # a request without a key goes to the least loaded replica
            return None
        return np.where(rejected, -1, rep).astype(_row_dtype(max(n, R)))
    return None


def routes_static(work: Workload, spec: FleetSpec) -> bool:
    """Whether :func:`static_routes` names every request's replica (without building them)."""
    if spec.mode == "closed":
        return False
    if spec.router == "round_robin":
        return True
    if spec.router in ("session_affinity", "prefix_affinity") and work.affinity is not None:
        routed = reject_reasons(work, spec.scheduler) == 0
        return bool(((work.affinity >= 0) | ~routed).all())  # (no copy of the day's keys)
    return False


def auto_pods(
    spec: FleetSpec, requests: int, static: Callable[[], bool], streamed: bool = False, cores: int = 1
) -> int:
    """Pods to replay ``requests`` requests on ``spec`` in when none were asked for: 1, unless the
    routes are ``static`` (asked only then) and either the replicas the requests can reach would
    hold more than AUTO_POD_STATE_BYTES of engine state, or the step log is ``streamed`` and the
    requests are more than AUTO_POD_REQUESTS, or ``cores`` (those the thread executor may use)
    are more than one and the requests at least AUTO_THREAD_REQUESTS; then enough pods that one
    holds at most that much, and at least one a core (with cores, a multiple of them; at most
    one a lockstep group and MAX_PODS; pods without requests are never built). Round robin
    reaches one replica per request (whole lockstep groups); an affinity router one lockstep
    group per request. A lockstep group past AUTO_POD_STATE_BYTES on its own is a pod of its
    own."""
    G = max(spec.lockstep, 1)
    groups = spec.replicas // G
    per_request = 1 if spec.router == "round_robin" else G
    reach = min(spec.replicas, max(G, -(-requests * per_request // G) * G))
    by_log = -(-requests // AUTO_POD_REQUESTS) if streamed and requests > AUTO_POD_REQUESTS else 1
    by_cores = cores if cores > 1 and requests >= AUTO_THREAD_REQUESTS else 1
    by_state = 1
    if state_bytes(replace(spec, replicas=reach)) > AUTO_POD_STATE_BYTES:
        by_state = -(-groups // (fitting_replicas(spec, AUTO_POD_STATE_BYTES) // G))
    pods = max(by_state, by_log, by_cores)
    if pods == 1 or not static():
        return 1
    if cores > 1:  # a whole number of pods a core: no pod runs alone at the end
        pods = -(-pods // cores) * cores
    return min(MAX_PODS, groups, pods)


def executor_cores(executor: str) -> int:
    """The cores ``executor`` replays pods on at once: the usable cores for ``thread``, else 1
    (what :func:`auto_pods` is given as ``cores``)."""
    return thread_workers(MAX_PODS, executor)


def thread_workers(pods: int, executor: str = "thread") -> int:
    """Pods ``executor`` replays at once: for ``thread``, one a usable core (at most ``pods``);
    otherwise 1 (``local``; ``process`` and ``ray`` run theirs in processes of their own)."""
    return max(1, min(pods, system.usable_cores())) if executor == "thread" else 1


def _row_dtype(n: int) -> type[np.signedinteger[Any]]:
    """Numbers below ``n`` (request rows; replica or pod numbers): 4-byte when they fit (a day's
    arrays cost a request's bytes, not replicas')."""
    return np.int32 if n < 2**31 else np.int64


def pod_cuts(replicas: int, lockstep: int, pods: int) -> IntArray:
    """Where ``pods`` contiguous replica ranges of whole lockstep groups, as equal as they can be,
    start (and, last, where the fleet ends)."""
    groups = replicas // lockstep
    pods = max(1, min(pods, groups))
    return (groups * np.arange(pods + 1, dtype=np.int64) // pods) * lockstep


def _rows_by_pod(keys: RowArray, cuts: IntArray, pods: int) -> Iterator[tuple[int, RowArray]]:
    """(pod, its requests in increasing order) for every one of ``pods`` pods that has a request.
    Request i goes to the pod whose replica range ``cuts`` (pod_cuts) holds ``keys[i]``, its
    route; with no cuts, ``keys[i]`` is its pod. A key < 0 (a rejected request: routed nowhere)
    counts as pod 0, which reports them. Rows are 4-byte numbers (8 when the day has 2³¹ rows
    or more). Pods without requests are never built (they would replay nothing)."""
    from pipeline.engine import _jit_kernels as k  # lazy: numba, imported only when the engine runs

    n = keys.shape[0]
    if not n:
        return
    order = np.empty(n, _row_dtype(n))
    if pods <= n:  # a counting sort: no copy of the day's keys, no sort
        start = k.group_rows(keys, cuts, pods, order)
        for p in np.flatnonzero(np.diff(start)).tolist():
            yield p, order[start[p] : start[p + 1]]
        return
    # more pods than requests (a huge fleet, a small day): sort the requests, never count the pods
    pod = keys if cuts.size == 0 else np.searchsorted(cuts, keys, side="right") - 1
    pod = np.maximum(pod, 0)
    order[:] = np.argsort(pod, kind="stable")
    pod = pod[order]
    firsts = np.flatnonzero(np.diff(pod, prepend=-1))
    ends = np.append(firsts[1:], n)
    for a, b in zip(firsts.tolist(), ends.tolist(), strict=True):
        yield int(pod[a]), order[a:b]


@dataclass(frozen=True)
class Pod:
    """One shard: its replicas ``[first, first + spec.replicas)``, the rows of the fleet's
    requests routed there (in arrival order) and their routes within the pod (None: the pod's
    own router picks, as under hierarchical routing)."""

    first: int
    rows: RowArray
    work: Workload
    spec: FleetSpec
    routes: RowArray | None


@dataclass(frozen=True)
class PodCut:
    """A :class:`Pod` before its requests are cut out of the fleet's workload (``pod``): the
    replay cuts one pod's at a time when pods run one after another."""

    first: int
    rows: RowArray
    spec: FleetSpec
    routes: RowArray | None
    keep_affinity: bool

    def pod(self, work: Workload) -> Pod:
        return Pod(self.first, self.rows, _subset(work, self.rows, self.keep_affinity), self.spec, self.routes)


def _subset(work: Workload, rows: RowArray, keep_affinity: bool) -> Workload:
    """The requests ``rows`` of ``work``, chains included, in that order."""
    affinity = work.affinity[rows] if keep_affinity and work.affinity is not None else None
    reported = work.reported_hit_tokens[rows] if work.reported_hit_tokens is not None else None
    if work.chain_tree is not None:
        return Workload(
            arrival_s=work.arrival_s[rows],
            prompt_tokens=work.prompt_tokens[rows],
            output_tokens=work.output_tokens[rows],
            chain_tree=work.chain_tree.take(rows),
            affinity=affinity,
            reported_hit_tokens=reported,
        )
    from pipeline.engine import _jit_kernels as k  # lazy: numba, imported only when the engine runs

    offsets = work.offsets()
    sub_off = np.zeros(rows.shape[0] + 1, np.int64)
    np.cumsum(offsets[rows + 1] - offsets[rows], out=sub_off[1:])
    chains = work.chain_hashes
    if chains.size:
        chains = np.empty(int(sub_off[-1]), chains.dtype)
        k.gather_chains(work.chain_hashes, offsets, rows, sub_off, chains)
    return Workload(
        arrival_s=work.arrival_s[rows],
        prompt_tokens=work.prompt_tokens[rows],
        output_tokens=work.output_tokens[rows],
        chain_hashes=chains,
        chain_offsets=sub_off if work.chain_offsets is not None else None,
        affinity=affinity,
        reported_hit_tokens=reported,
    )


def plan_pods(work: Workload, spec: FleetSpec, pods: int) -> list[Pod]:
    """Cut the fleet into pods, or say why it cannot be cut exactly."""
    return [cut.pod(work) for cut in _cut_pods(work, spec, pods)]


def _cut_pods(work: Workload, spec: FleetSpec, pods: int) -> list[PodCut]:
    routes = static_routes(work, spec)
    if routes is None:
        why = (
            "the closed loop shares its clients across replicas"
            if spec.mode == "closed"
            else f"router {spec.router!r} reads every replica's state at each arrival"
            + ("" if spec.router in ("least_outstanding", "most_free_kv") else " (some requests have no affinity key)")
        )
        raise ConfigError(f"--pods {pods}: the fleet cannot be replayed in pods exactly: {why}")
    cuts = pod_cuts(spec.replicas, spec.lockstep, pods)
    out = []
    for k, rows in _rows_by_pod(routes, cuts, len(cuts) - 1):
        a, b = int(cuts[k]), int(cuts[k + 1])
        local = routes[rows]
        local = np.where(local >= 0, local - a, 0).astype(_row_dtype(b - a))  # a pod's replicas
        out.append(PodCut(a, rows, replace(spec, replicas=b - a), local, False))
    return out


#: Mixed into affinity keys at the load balancer, so that its choice of pod and the pod
#: router's choice of replica (both hash the key) are independent.
_POD_SALT = np.uint64(0x504F44524F555445)  # ASCII "PODROUTE"


def hierarchical_pods(work: Workload, spec: FleetSpec, pod_ranks: int, balancer: str = "") -> list[Pod]:
    """:func:`_cut_hierarchical`'s pods."""
    return [cut.pod(work) for cut in _cut_hierarchical(work, spec, pod_ranks, balancer)]


def _cut_hierarchical(work: Workload, spec: FleetSpec, pod_ranks: int, balancer: str = "") -> list[PodCut]:
    """Hierarchical routing: pods of ``pod_ranks`` engine replicas (the last one may be smaller),
    a load balancer that sends each request to a pod — round robin over the requests it routes,
    or by a hash of the request's affinity key (``balancer`` an affinity router; unset: for the
    affinity routers; a request without a key: round robin) — and ``spec.router`` inside each
    pod. Pods never share state, so they replay alone."""
    if spec.mode == "closed":
        raise ConfigError("hierarchical routing (router_pod_size) needs open or offline arrivals, not a closed loop")
    R = spec.replicas
    pod_ranks = max(spec.lockstep, pod_ranks - pod_ranks % spec.lockstep)
    n_pods = -(-R // pod_ranks)
    n = work.n
    rejected = reject_reasons(work, spec.scheduler) != 0
    times = np.zeros(n) if spec.mode == "offline" else work.arrival_s
    order = np.argsort(times, kind="mergesort")
    taken = order[~rejected[order]]
    pod = np.full(n, -1, _row_dtype(max(n, n_pods)))
    pod[taken] = np.arange(taken.shape[0], dtype=np.int64) % n_pods
    balancer = balancer or (spec.router if spec.router in ("session_affinity", "prefix_affinity") else "round_robin")
    if balancer in ("session_affinity", "prefix_affinity") and work.affinity is not None:
        keyed = (work.affinity >= 0) & ~rejected
        salted = (work.affinity[keyed].astype(np.uint64) ^ _POD_SALT) & np.uint64(0x7FFFFFFFFFFFFFFF)
        pod[keyed] = affinity_replicas(salted.astype(np.int64), n_pods)
    out = []
    for k, rows in _rows_by_pod(pod, np.zeros(0, np.int64), n_pods):
        a, b = k * pod_ranks, min((k + 1) * pod_ranks, R)
        out.append(PodCut(a, rows, replace(spec, replicas=b - a), None, True))
    return out


def run_pod(
    pod: Pod, cost: TabulatedCost, want_log: bool, progress: Callable[[int], None] | None = None
) -> tuple[EngineResult, npt.NDArray[np.float64]]:
    """Replay one pod (in any process): its results and its step log's rows (``progress``: as
    :func:`simulate_jit`'s, the pod's requests taken)."""
    system.keep_malloc_threshold()  # (a worker process's pods, one after another)
    log = _Capture() if want_log else None
    res = simulate_jit(pod.work, pod.spec, cost, log, progress, routes=pod.routes)
    return res, log.rows if log is not None else np.zeros((0, len(SPAN_COLUMNS)))


class _Capture:
    """The engine's step-log rows as it hands them over (no copy into a StepLog)."""

    def __init__(self) -> None:
        self.rows: npt.NDArray[np.float64] = np.zeros((0, len(SPAN_COLUMNS)))

    def extend_rows(self, rows: npt.NDArray[np.float64]) -> None:
        self.rows = rows


def simulate_sharded(
    work: Workload,
    spec: FleetSpec,
    cost: StepCostFn,
    log: RowSink | None,
    pods: int,
    executor: str = "local",
    progress: Callable[[int], None] | None = None,
    address: str | None = None,
    pod_ranks: int = 0,
    pod_balancer: str = "",
) -> EngineResult:
    """Replay ``work`` on ``spec`` in ``pods`` shards and put the results back together; with
    ``pod_ranks`` > 0, routing is hierarchical (:func:`hierarchical_pods`, the balancer
    ``pod_balancer``) and each routing pod is one shard."""
    res = EngineResult.empty(work.n)
    shards = sharded_results(work, spec, cost, log, pods, executor, progress, address, pod_ranks, pod_balancer)
    for rows, sub in shards:
        put_back(res, rows, sub)
    return res


def put_back(res: EngineResult, rows: RowArray, sub: EngineResult) -> None:
    """A pod's results ``sub`` into the fleet's ``res`` at its request ``rows``."""
    for f in fields(EngineResult):
        getattr(res, f.name)[rows] = getattr(sub, f.name)


def sharded_results(
    work: Workload,
    spec: FleetSpec,
    cost: StepCostFn,
    log: RowSink | None,
    pods: int,
    executor: str = "local",
    progress: Callable[[int], None] | None = None,
    address: str | None = None,
    pod_ranks: int = 0,
    pod_balancer: str = "",
) -> Iterator[tuple[RowArray, EngineResult]]:
    """:func:`simulate_sharded` a pod at a time: each pod's request rows (increasing) and their
    results (replicas numbered in the fleet), as the pod ends; its step log goes to ``log``."""
    if executor not in EXECUTORS:
        raise ConfigError(f"executor {executor!r} unknown; choose one of {list(EXECUTORS)}")
    system.keep_malloc_threshold()  # pods' arrays go back to the system when freed
    shards = _cut_hierarchical(work, spec, pod_ranks, pod_balancer) if pod_ranks > 0 else _cut_pods(work, spec, pods)
    reason = unsupported_reason(spec, cost)
    if reason is not None:
        raise ConfigError(f"the replay engine does not apply: {reason}")
    tables = _tables(cost, spec)
    assert tables is not None
    # data only: the closures (extend, exact) stay here; the tables already cover every step
    data = replace(tables, extend=None, exact=None, describe={})
    done = 0
    threads = executor == "thread" and len(shards) > 1  # (its pods report as they run: _run_threads)
    runs = _run_all(work, shards, data, log is not None, executor, address, progress if threads else None)
    for pod, (sub, rows) in zip(shards, runs, strict=True):
        sub = replace(sub, replica=np.where(sub.replica >= 0, sub.replica + pod.first, -1).astype(np.int32))
        if log is not None and rows.shape[0]:
            if not rows.flags.writeable:  # (Ray hands back read-only arrays; a pod's own are its to change)
                rows = rows.copy()
            rows[:, REPLICA_COL] += pod.first
            log.extend_rows(rows)
        done += int(pod.rows.shape[0])
        if progress is not None and not threads:
            progress(done)
        yield pod.rows, sub


def _run_all(
    work: Workload,
    cuts: list[PodCut],
    cost: TabulatedCost,
    want_log: bool,
    executor: str,
    address: str | None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[EngineResult, npt.NDArray[np.float64]]]:
    if executor == "local" or len(cuts) == 1:
        for cut in cuts:  # one pod's requests cut out at a time
            yield run_pod(cut.pod(work), cost, want_log)
        return
    if executor == "thread":
        yield from _run_threads(work, cuts, cost, want_log, thread_workers(len(cuts)), progress)
        return
    shards = [cut.pod(work) for cut in cuts]
    if executor == "process":
        # spawn, not fork: numba's and polars' thread pools make fork unsafe
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(len(shards), multiprocessing.cpu_count()), mp_context=ctx) as pool:
            yield from pool.map(run_pod, shards, [cost] * len(shards), [want_log] * len(shards))
    else:
        yield from _run_ray(shards, cost, want_log, address)


def _run_threads(
    work: Workload,
    cuts: list[PodCut],
    cost: TabulatedCost,
    want_log: bool,
    workers: int,
    progress: Callable[[int], None] | None,
) -> Iterator[tuple[EngineResult, npt.NDArray[np.float64]]]:
    """The pods ``cuts`` in ``workers`` daemon threads: each takes the next pod not yet started,
    cuts its requests out of ``work`` and runs the compiled loop (which releases the GIL). Results
    come back in the pods' order, each as soon as it and those before it have ended; meanwhile
    ``progress`` gets the requests every pod has taken, every POLL_S. A pod starts only while
    fewer than ``workers`` pods are started and not yet handed back, so memory holds that many
    pods however slowly the caller writes them (the estimate counts as much). A pod's error stops
    the others (at their next poll) and is raised; so is a KeyboardInterrupt, or the caller
    closing the generator, after telling the pods to stop (each waited for up to CANCEL_WAIT_S)."""
    n = len(cuts)
    taken = [0] * n  # requests each pod's loop has taken
    outs: list[tuple[EngineResult, npt.NDArray[np.float64]] | BaseException | None] = [None] * n
    ended = [threading.Event() for _ in range(n)]
    stop = threading.Event()
    lock = threading.Lock()
    queue = iter(range(n))
    slots = threading.Semaphore(workers)  # pods started and not yet handed back

    def seen(i: int) -> Callable[[int], None]:
        def report(k: int) -> None:
            if stop.is_set():
                raise Cancelled
            taken[i] = k

        return report

    def worker() -> None:
        while not stop.is_set():
            if not slots.acquire(timeout=POLL_S):
                continue  # (the caller still holds as many pods as run at once)
            with lock:
                i = next(queue, None)
            if i is None:
                slots.release()
                return
            try:
                outs[i] = run_pod(cuts[i].pod(work), cost, want_log, seen(i))
            except BaseException as exc:  # raised in the thread that waits, in the pods' order
                outs[i] = exc
                stop.set()
            finally:
                ended[i].set()

    threads = [threading.Thread(target=worker, name=f"rooftrace-pod-{k}", daemon=True) for k in range(workers)]
    for t in threads:
        t.start()
    try:
        for i in range(n):
            while not ended[i].wait(POLL_S):
                if stop.is_set() and not any(t.is_alive() for t in threads):
                    break  # (a pod failed before this one started: it never will)
                if progress is not None:
                    progress(sum(taken))
            out = outs[i]
            if out is None or isinstance(out, BaseException):
                raise _first_error(outs, threads)
            outs[i] = None  # (handed over: the caller's to keep or drop)
            if progress is not None:
                progress(sum(taken))
            slots.release()  # the next pod may start while the caller takes this one
            yield out
    except BaseException:
        stop.set()
        for t in threads:
            t.join(CANCEL_WAIT_S)
        raise


def _first_error(outs: list[Any], threads: list[threading.Thread]) -> BaseException:
    """The error that stopped the thread executor's pods: the first pod's that is not the
    others being stopped (:class:`Cancelled`), once every thread has ended."""
    for t in threads:
        t.join(CANCEL_WAIT_S)
    errors = [o for o in outs if isinstance(o, BaseException)]
    real = [e for e in errors if not isinstance(e, Cancelled)]
    return (real or errors or [RooftraceError("a pod of the thread executor ended without a result")])[0]


#: Seconds to wait for a Ray cluster's port to answer before calling it unreachable.
RAY_CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: str | None) -> None:
    """Refuse a Ray address whose port does not answer (``ray.init`` retries an unreachable
    cluster for minutes). None, ``auto``, ``local`` and what is not ``host:port`` (with or
    without ``ray://``) are left to Ray."""
    import socket

    if address is None:
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or type(exc).__name__
        raise RooftraceError(
            f"--executor ray: cannot reach Ray at {address}: {why} (is the cluster up? `ray status` on its head node)"
        ) from None


#: A local Ray instance maps its object store into every worker (and into this process, its
#: driver): by default this share of the memory, at most RAY_OBJECT_STORE_MAX_BYTES, and on
#: Linux at most 95 % of the free space of /dev/shm but never below RAY_SHM_FLOOR_BYTES (Ray's
#: ``DEFAULT_OBJECT_STORE_MEMORY_PROPORTION``, ``DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES``,
#: ``REQUIRE_SHM_SIZE_THRESHOLD``; ``resolve_object_store_memory``).
RAY_OBJECT_STORE_SHARE = 0.3
RAY_OBJECT_STORE_MAX_BYTES = 200 * 10**9
RAY_SHM_FLOOR_BYTES = 10**10
#: A Ray worker's address space beyond the object store (measured: 8.1 GiB mapped by an idle
#: worker of a local Ray 2.60 instance whose object store was 6.9 GiB).
RAY_WORKER_BYTES = 2 << 30
#: Seconds Ray's workers may take to start, register with their raylet and run a first, trivial
#: task. Under an address-space limit they fail to register ("Failed to register worker to
#: Raylet") and the pods' tasks waited for them forever.
RAY_START_TIMEOUT_S = 120.0
#: Seconds to wait for the next pod's result before the worker pool is taken for dead (a pod
#: of 500,000 requests replays in about 10 s; a worker compiling the engine takes minutes).
RAY_POD_TIMEOUT_S = 1800.0


def _starts_local_ray(address: str | None) -> bool:
    """Whether ``ray.init(address)`` starts a Ray instance in this machine (None, ``local``)."""
    return address is None or address.strip().lower() == "local"


def ray_store_cap() -> int:
    """The most a local Ray instance's default object store takes (RAY_OBJECT_STORE_MAX_BYTES,
    and where /dev/shm can be read, 95 % of its free space but at least RAY_SHM_FLOOR_BYTES)."""
    import os

    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return RAY_OBJECT_STORE_MAX_BYTES
    return min(RAY_OBJECT_STORE_MAX_BYTES, max(RAY_SHM_FLOOR_BYTES, int(st.f_bsize * st.f_bavail * 0.95)))


def check_ray_address_space(address: str | None) -> None:
    """Refuse (one line), before a local Ray instance is started, an address-space limit
    (``ulimit -v``, RLIMIT_AS: inherited by Ray's processes) that cannot hold a Ray worker:
    its object store mapped (RAY_OBJECT_STORE_SHARE of the memory) and RAY_WORKER_BYTES, or
    this process's mapped size and the object store. Under such a limit the workers failed to
    register with the raylet and the replay waited forever."""
    if not _starts_local_ray(address):
        return  # a cluster's workers run under the cluster's limits
    space = system.address_space_limit()
    if space is None:
        return
    store = min(int(system.physical_memory() * RAY_OBJECT_STORE_SHARE), ray_store_cap())
    mapped = system.virtual_size()
    need = store + max(RAY_WORKER_BYTES, mapped)
    if need <= space:
        return
    raise RooftraceError(
        f"--executor ray: Ray's workers need more address space than this process's limit (ulimit -v "
        f"{format_bytes(space)}) allows: a local Ray instance maps its object store ({format_bytes(store)}) into "
        f"every worker (about {format_bytes(RAY_WORKER_BYTES)} more each) and into this process "
        f"({format_bytes(mapped)} mapped already), about {format_bytes(need)}; its workers could not register with "
        "the raylet and the replay would wait for them forever: use --executor process (or local), raise the "
        "limit (ulimit -v), or name a running cluster with --ray-address"
    )


def ray_connect(address: str | None) -> Any:
    """The ``ray`` module, connected to the cluster at ``address`` (None: a local instance);
    a missing extra, a cluster that cannot be reached or an address-space limit that a local
    instance's workers cannot start under (:func:`check_ray_address_space`) is one error line."""
    try:
        import ray
    except ImportError:
        raise RooftraceError("--executor ray needs the optional extra: pip install 'rooftrace[ray]'") from None
    if not ray.is_initialized():
        check_ray_address_space(address)
        _check_reachable(address)
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            where = address or "a local instance"
            raise RooftraceError(f"--executor ray: cannot start or reach Ray at {where}: {first}") from None
    return ray


def worker_ready() -> int:
    """The trivial task that shows Ray's workers start and run (its process id)."""
    import os

    return os.getpid()


def _ray_failed(exc: BaseException, what: str) -> BaseException:
    """A Ray error as what the replay raises: the pod's own error (a RooftraceError, a
    MemoryError, Ctrl-C) as itself, anything else (a worker that crashed, a task Ray gave up on)
    as one line naming ``what``."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, RooftraceError | MemoryError | KeyboardInterrupt):
        return cause
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    return RooftraceError(f"--executor ray: {what} failed: {type(exc).__name__}: {first[:300]}")


def _cancel(ray: Any, refs: list[Any]) -> None:
    """Cancel the tasks not done (a dead pool's, or after a failed pod); errors ignored."""
    import contextlib

    for ref in refs:
        with contextlib.suppress(Exception):  # best effort: the error being raised says what went wrong
            ray.cancel(ref, force=True)


def _run_ray(
    shards: list[Pod], cost: TabulatedCost, want_log: bool, address: str | None
) -> Iterator[tuple[EngineResult, npt.NDArray[np.float64]]]:
    """The pods as Ray tasks, their results in pod order. Waiting is bounded: a worker pool that
    does not run a trivial task within RAY_START_TIMEOUT_S, or gives no pod's result for
    RAY_POD_TIMEOUT_S, is one error line, not a wait without end."""
    ray = ray_connect(address)
    timeout_error = ray.exceptions.GetTimeoutError
    probe = ray.remote(worker_ready).remote()
    try:
        ray.get(probe, timeout=RAY_START_TIMEOUT_S)
    except timeout_error:
        _cancel(ray, [probe])
        raise RooftraceError(
            f"--executor ray: no Ray worker ran a task within {RAY_START_TIMEOUT_S:,.0f} s: its workers do not "
            "start (Ray's logs, /tmp/ray/session_latest/logs, say why: e.g. 'Failed to register worker to "
            "Raylet' under a memory or address-space limit); nothing was replayed: use --executor process "
            "(or local)"
        ) from None
    except ray.exceptions.RayError as exc:
        raise _ray_failed(exc, "starting a worker") from None
    remote: Any = ray.remote(run_pod)
    cost_ref = ray.put(cost)
    refs = [remote.remote(pod, cost_ref, want_log) for pod in shards]
    for k, ref in enumerate(refs):  # in pod order
        try:
            out = ray.get(ref, timeout=RAY_POD_TIMEOUT_S)
        except timeout_error:
            _cancel(ray, refs[k:])
            raise RooftraceError(
                f"--executor ray: pod {k + 1:,} of {len(refs):,} gave no result within {RAY_POD_TIMEOUT_S:,.0f} s "
                "(shard.RAY_POD_TIMEOUT_S): the worker pool is taken for dead; see Ray's logs "
                "(/tmp/ray/session_latest/logs), or use --executor process (or local)"
            ) from None
        except ray.exceptions.RayError as exc:
            _cancel(ray, refs[k + 1 :])
            raise _ray_failed(exc, f"pod {k + 1:,} of {len(refs):,}") from None
        yield out
