"""A fleet's lower KV tier in the replay (FLEET.toml ``[kv_offload]``; docs/accounting.md, "KV
offload tiers"), as a pre-pass: the engines and their kernels are untouched.

The pre-pass decides, before the replay, which prompt blocks each request finds only in the
lower tier, with the two-level LRU of :mod:`pipeline.classify.offload` over the requests in
arrival order:

* **Where the router keeps no state** (round robin, the affinity routers with every request
  keyed: :func:`pipeline.engine.shard.static_routes`) each replica (data-parallel rank) has its
  own GPU tier of the engine's ``num_gpu_blocks``, fed by its own requests; a ``cpu`` tier is the
  replica's own (its ``capacity_gb`` split over its dp ranks), a ``shared`` tier one LRU over the
  whole pool's requests (every replica writes through to it). A block hits the lower tier iff
  the replica's GPU tier lost it and the lower tier holds it.
* **Otherwise** (least outstanding, a closed loop) the pool is one LRU: a GPU tier of every
  replica's blocks together and the cpu tiers together (or the shared one). The router spreads a
  prefix over replicas; pooling them overstates the GPU tier's hits and understates the lower
  tier's. The run records which of the two it used (``kv_offload.routing``).

The GPU tier is the replica's whole KV pool (an upper bound: blocks held by running requests
cannot cache), so a block the pre-pass leaves to the GPU tier is looked up in the engine's own
prefix cache as usual. A request with lower-tier blocks instead takes its whole hit (GPU and
lower tier) as a reported hit (``Workload.reported_hit_tokens``: computed at admission, blocks of
its own, then entered in the replica's cache under its chain: the load promotes them) and
arrives ``load_s`` later: the tokens' KV bytes per GPU over the tier's bandwidth per GPU plus its
latency (each GPU of the replica loads its own shard over its own PCIe link or NIC). The engines
take arrivals in (time, row) order whatever order the rows are in, so the replayed workload keeps
the day's rows and shares its arrays (block hashes, lengths, keys: of the day only the delayed
arrivals and the reported hits are new) and its results come back in the day's order; they are
given the day's arrival, so ``queue_s`` and ``ttft_s`` include the load.

**A store below the cpu tier** (``[kv_offload.shared]``: GPU, then each replica's host DRAM,
then the pool's store) is the pool's one LRU over every live request in arrival order, as a
``shared`` tier alone is; the replica's tiers (or the pooled ones) run as above. A request's run
is the longest of its tiers' leading runs (each tier's blocks of a chain are a leading run: a
request touches its blocks tail first); its GPU-tier blocks come from the GPU, the next ones the
cpu tier holds from host DRAM, the rest from the store, and its wait is both loads one after the
other (:meth:`pipeline.classify.offload.OffloadTier.loads_s`).

The tiers are simulated directly (:func:`pipeline.classify.prefix.lru_hit_blocks`: an LRU list
per tier, a replica's chains read in place), not through the stack distances classify uses for
every capacity at once: the same answers, with tables the size of the tiers.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.classify.offload import OffloadTier, tier_from_summary
from pipeline.classify.prefix import lru_hit_blocks
from pipeline.common.errors import ConfigError
from pipeline.engine.model import EngineResult, FleetSpec, Workload, reject_reasons
from pipeline.engine.shard import static_routes
from pipeline.replay.fleet import ResolvedFleet

I64Array = npt.NDArray[np.int64]
F64Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class OffloadPlan:
    """What the pre-pass decided, per request in the day's order, and the workload to replay.

    gpu_hit_tokens      the pre-pass's GPU-tier hits of the requests that load (else 0: the
                        engine's own prefix cache decides)
    offload_hit_tokens  tokens loaded from the lower tier
    load_s              seconds each request waits for its load (0: none)
    work                the workload the engines replay: the day's rows in the day's order,
                        each arriving ``load_s`` later (its other arrays the day's own)
    routing             ``replica`` (each replica's own tiers), ``pooled`` (module doc) or
                        ``none`` (no prefix caching: nothing is cached, nothing loads)
    """

    gpu_hit_tokens: I64Array
    offload_hit_tokens: I64Array
    load_s: F64Array
    work: Workload
    routing: str
    tier: OffloadTier
    #: a store below the cpu tier: the tokens of ``offload_hit_tokens`` that came from it (None:
    #: the tier has no store below it)
    shared_hit_tokens: I64Array | None = None

    def restore(self, res: EngineResult) -> EngineResult:
        """The replayed workload's results (already in the day's order) with each arrival the
        logged one, in place."""
        res.arrival_s[:] = res.arrival_s - self.load_s
        return res

    def summary(self) -> dict[str, Any]:
        loading = self.offload_hit_tokens > 0
        return {
            **self.tier.to_dict(),
            "routing": self.routing,
            "requests_loading": int(loading.sum()),
            "offload_hit_tokens": int(self.offload_hit_tokens.sum()),
            "load_s_total": float(self.load_s.sum()),
            "load_s_max": float(self.load_s.max(initial=0.0)),
            **({} if self.shared_hit_tokens is None else {"by_tier": self.by_tier()}),
        }

    def by_tier(self) -> dict[str, dict[str, int]]:
        """Per lower tier (three levels only): the requests that loaded from it and its tokens."""
        assert self.shared_hit_tokens is not None
        cpu = self.offload_hit_tokens - self.shared_hit_tokens
        return {
            name: {"requests_loading": int((tok > 0).sum()), "hit_tokens": int(tok.sum())}
            for name, tok in (("cpu", cpu), ("shared", self.shared_hit_tokens))
        }


def fleet_offload(work: Workload, fleet: ResolvedFleet, spec: FleetSpec, workers: int = 1) -> OffloadPlan | None:
    """:func:`plan_offload` with ``fleet``'s ``[kv_offload]`` (None without one), in ``workers`` threads."""
    tier = fleet.config.kv_offload
    if tier is None:
        return None
    if spec.mode != "open":
        raise ConfigError(
            f"fleet {fleet.config.name!r} [kv_offload]: a load delays its request's admission, which only the "
            "open loop replays: leave out --concurrency and --offline, or the fleet's [kv_offload]"
        )
    return plan_offload(
        work, spec, tier, fleet.memory.kv_bytes_per_token, fleet.deployment.gpus, fleet.config.dp, workers
    )


def plan_offload(
    work: Workload,
    spec: FleetSpec,
    tier: OffloadTier,
    kv_bytes_per_gpu_token: float,
    gpus_per_rank: int,
    dp: int,
    workers: int = 1,
) -> OffloadPlan | None:
    """The pre-pass (module doc) on ``work`` replayed by ``spec`` (the day itself, unchanged,
    where nothing loads: no prefix caching, no chains, or every block the GPU tier's); the
    replicas' tiers simulated in ``workers`` threads (:func:`tier_runs`)."""
    if spec.mode != "open":
        raise ConfigError("[kv_offload]: a load delays its request's admission, which only the open loop replays")
    sched = spec.scheduler
    n, bs, R = work.n, sched.block_size, spec.replicas
    if not sched.enable_prefix_caching or not work.has_chains:  # nothing is cached, so nothing loads
        none = np.zeros(n, np.int64)
        return OffloadPlan(none, none, np.zeros(n), work, "none", tier, None if tier.shared is None else none)
    explicit = work.explicit()  # (a chain tree's hashes: held for the pre-pass only)
    hashes, offsets = explicit.chain_hashes, explicit.offsets()
    lookups = np.minimum(np.maximum(work.prompt_tokens - 1, 0) // bs, np.diff(offsets)).astype(np.int64)
    lookups[work.skipped_tokens() >= 0] = 0  # the log reports their hits: looked up nowhere
    live = reject_reasons(work, sched) == 0
    G = int(sched.num_gpu_blocks)
    replica_bytes = kv_bytes_per_gpu_token * gpus_per_rank
    lower = tier.capacity_blocks(replica_bytes, bs)
    shared = tier.kind == "shared"
    # a dp rank's own cpu tier (its replica's split over its ranks), and the pool's one store: the
    # tier itself (kind shared) or the one below a cpu tier
    store = lower if shared else None if tier.shared is None else tier.shared.capacity_blocks(replica_bytes, bs)
    routes = static_routes(work, spec)
    # pooled too: R ranks × a rank's share is the fleet's host DRAM (before 2026-12-07 each rank
    # was given its replica's whole tier, dp times the fleet's host DRAM when dp > 1)
    per_rank = None if shared else lower // max(dp, 1)
    rows = np.flatnonzero(live).astype(np.int64)
    gpu, near, total = tier_runs(hashes, offsets, lookups, rows, routes, R, G, per_rank, store, workers)
    routing = "pooled" if routes is None else "replica"
    del explicit, hashes, offsets  # (a materialised chain tree is not kept for the engines)
    low = total - gpu
    load = low > 0
    off_tok = np.where(load, low * bs, 0).astype(np.int64)
    if tier.shared is None:
        shared_tok: I64Array | None = None
        load_s = tier.load_s(off_tok, kv_bytes_per_gpu_token)
    else:  # three levels: the cpu tier's blocks first, the store's after them
        shared_tok = ((total - np.maximum(near, gpu)) * bs).astype(np.int64)
        load_s = tier.loads_s(off_tok - shared_tok, shared_tok, kv_bytes_per_gpu_token)
    if not load.any():  # the GPU tier keeps every block a request finds: the day as it is
        return OffloadPlan(np.zeros(n, np.int64), off_tok, load_s, work, routing, tier, shared_tok)
    reported = work.reported_hit_tokens.copy() if work.reported_hit_tokens is not None else np.full(n, -1, np.int64)
    reported[load] = total[load] * bs
    # the day's rows and arrays: only the arrivals and the reported hits are the replay's own
    replayed = replace(work, arrival_s=work.arrival_s + load_s, reported_hit_tokens=reported)
    gpu_tok = np.where(load, gpu * bs, 0).astype(np.int64)
    return OffloadPlan(gpu_tok, off_tok, load_s, replayed, routing, tier, shared_tok)


def tier_runs(
    hashes: npt.NDArray[np.uint64],
    offsets: I64Array,
    lookups: I64Array,
    rows: I64Array,
    routes: I64Array | None,
    replicas: int,
    gpu_blocks: int,
    cpu_blocks: int | None,
    store_blocks: int | None,
    workers: int = 1,
) -> tuple[I64Array, I64Array, I64Array]:
    """Per request (of the layout; only ``rows``, in arrival order, are simulated, the others
    0), its leading run in the GPU tier, through its replica's cpu tier, and through the pool's
    store: three non-decreasing runs (a tier that is absent, ``None``, adds nothing).

    With ``routes`` (each row's replica, −1: none) each replica has its own GPU tier of
    ``gpu_blocks`` and cpu tier of ``cpu_blocks``, fed by its own rows, and the store is one LRU
    over every row; a request's run through the store is the longer of its replica's run and the
    store's (each tier's blocks of a chain are a leading run). Without, the pool is one cache: a
    GPU tier of ``replicas × gpu_blocks``, a cpu tier of ``replicas × cpu_blocks`` and the store,
    all on one access sequence (inclusion: each reaches ``max`` of the sizes above it).

    With ``routes``, the replicas' simulations (and the store's) are independent: ``workers``
    threads run them (the LRU kernel releases the GIL), each writing only its own rows."""
    n = offsets.shape[0] - 1
    gpu, near, total = (np.zeros(n, np.int64) for _ in range(3))
    if routes is not None:
        mine = rows[routes[rows] >= 0]
        by_replica = mine[np.argsort(routes[mine], kind="stable")]  # each replica's rows, in arrival order
        cuts = np.searchsorted(routes[by_replica], np.arange(replicas + 1))
        caps = [gpu_blocks] if cpu_blocks is None else [gpu_blocks, max(gpu_blocks, cpu_blocks)]
        pool: list[I64Array] = []

        def replica(r: int) -> None:
            own = by_replica[cuts[r] : cuts[r + 1]]
            hits = lru_hit_blocks(hashes, offsets, lookups, caps, own)
            gpu[own], near[own] = hits[0], hits[-1]

        def the_store() -> None:
            pool.extend(lru_hit_blocks(hashes, offsets, lookups, [store_blocks or 0], rows))

        # the store's one simulation first: the longest, it runs beside the replicas'
        jobs = [the_store] if store_blocks is not None and rows.size else []
        jobs += [partial(replica, r) for r in np.flatnonzero(np.diff(cuts)).tolist()]
        if workers > 1 and len(jobs) > 1:
            with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="rooftrace-tier") as ex:
                for job in [ex.submit(j) for j in jobs]:
                    job.result()  # (an error in one is raised here)
        else:
            for j in jobs:
                j()
        total[:] = near
        if pool:
            total[rows] = np.maximum(near[rows], pool[0])
        return gpu, near, total
    caps = [gpu_blocks * replicas]
    if cpu_blocks is not None:
        caps.append(max(caps[-1], cpu_blocks * replicas))
    if store_blocks is not None:
        caps.append(max(caps[-1], store_blocks))
    if rows.size:
        hits = lru_hit_blocks(hashes, offsets, lookups, caps, rows)
        gpu[rows], near[rows], total[rows] = hits[0], hits[1 if cpu_blocks is not None else 0], hits[-1]
    return gpu, near, total


def offload_line(kv: dict[str, Any]) -> str:
    """The replay's line of a run's ``kv_offload`` (:meth:`OffloadPlan.summary`): the tiers, the
    requests that loaded and their tokens (per lower tier with a store below the cpu tier), and
    the seconds they waited."""

    tier = tier_from_summary(kv)
    loaded = f"{int(kv['requests_loading']):,} requests loaded {int(kv['offload_hit_tokens']):,} tokens"
    by_tier = kv.get("by_tier")
    if isinstance(by_tier, dict):
        parts = [
            f"{name} {int(t['hit_tokens']):,} tokens to {int(t['requests_loading']):,}" for name, t in by_tier.items()
        ]
        loaded += f" ({', '.join(parts)})"
    wait = f"waiting {float(kv['load_s_total']):,.3f} s in all, at most {float(kv['load_s_max']) * 1e3:,.2f} ms"
    return f"kv offload ({tier.text()}; routing {kv['routing']}): {loaded}, {wait}"
