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

The tiers are simulated directly (:func:`pipeline.classify.prefix.lru_hit_blocks`: an LRU list
per tier, a replica's chains read in place), not through the stack distances classify uses for
every capacity at once: the same answers, with tables the size of the tiers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.classify.offload import OffloadTier
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
        }


def fleet_offload(work: Workload, fleet: ResolvedFleet, spec: FleetSpec) -> OffloadPlan | None:
    """:func:`plan_offload` with ``fleet``'s ``[kv_offload]`` (None without one)."""
    tier = fleet.config.kv_offload
    if tier is None:
        return None
    if spec.mode != "open":
        raise ConfigError(
            f"fleet {fleet.config.name!r} [kv_offload]: a load delays its request's admission, which only the "
            "open loop replays: leave out --concurrency and --offline, or the fleet's [kv_offload]"
        )
    return plan_offload(work, spec, tier, fleet.memory.kv_bytes_per_token, fleet.deployment.gpus, fleet.config.dp)


def plan_offload(
    work: Workload, spec: FleetSpec, tier: OffloadTier, kv_bytes_per_gpu_token: float, gpus_per_rank: int, dp: int
) -> OffloadPlan | None:
    """The pre-pass (module doc) on ``work`` replayed by ``spec`` (the day itself, unchanged,
    where nothing loads: no prefix caching, no chains, or every block the GPU tier's)."""
    if spec.mode != "open":
        raise ConfigError("[kv_offload]: a load delays its request's admission, which only the open loop replays")
    sched = spec.scheduler
    n, bs, R = work.n, sched.block_size, spec.replicas
    if not sched.enable_prefix_caching or not work.has_chains:  # nothing is cached, so nothing loads
        none = np.zeros(n, np.int64)
        return OffloadPlan(none, none, np.zeros(n), work, "none", tier)
    explicit = work.explicit()  # (a chain tree's hashes: held for the pre-pass only)
    hashes, offsets = explicit.chain_hashes, explicit.offsets()
    lookups = np.minimum(np.maximum(work.prompt_tokens - 1, 0) // bs, np.diff(offsets)).astype(np.int64)
    lookups[work.skipped_tokens() >= 0] = 0  # the log reports their hits: looked up nowhere
    live = reject_reasons(work, sched) == 0
    G = int(sched.num_gpu_blocks)
    lower = tier.capacity_blocks(kv_bytes_per_gpu_token * gpus_per_rank, bs)
    gpu = np.zeros(n, np.int64)
    total = np.zeros(n, np.int64)
    routes = static_routes(work, spec)
    shared = tier.kind == "shared"
    if routes is not None:
        per_rank = lower if shared else lower // max(dp, 1)
        routed = np.flatnonzero(live & (routes >= 0))
        by_replica = routed[np.argsort(routes[routed], kind="stable")]  # each replica's rows, in arrival order
        cuts = np.searchsorted(routes[by_replica], np.arange(R + 1))
        for r in np.flatnonzero(np.diff(cuts)).tolist():
            rows = by_replica[cuts[r] : cuts[r + 1]]
            hits = lru_hit_blocks(hashes, offsets, lookups, [G] if shared else [G, max(G, per_rank)], rows)
            gpu[rows], total[rows] = hits[0], hits[-1]
        if shared:
            rows = np.flatnonzero(live).astype(np.int64)
            (pool,) = lru_hit_blocks(hashes, offsets, lookups, [lower], rows)
            total[rows] = np.maximum(gpu[rows], pool)
        routing = "replica"
    else:
        rows = np.flatnonzero(live).astype(np.int64)
        pooled = lower if shared else lower * R
        if rows.size:
            g, both = lru_hit_blocks(hashes, offsets, lookups, [G * R, max(G * R, pooled)], rows)
            gpu[rows], total[rows] = g, both
        routing = "pooled"
    del explicit, hashes, offsets  # (a materialised chain tree is not kept for the engines)
    low = total - gpu
    load = low > 0
    off_tok = np.where(load, low * bs, 0).astype(np.int64)
    load_s = tier.load_s(off_tok, kv_bytes_per_gpu_token)
    if not load.any():  # the GPU tier keeps every block a request finds: the day as it is
        return OffloadPlan(np.zeros(n, np.int64), off_tok, load_s, work, routing, tier)
    reported = work.reported_hit_tokens.copy() if work.reported_hit_tokens is not None else np.full(n, -1, np.int64)
    reported[load] = total[load] * bs
    # the day's rows and arrays: only the arrivals and the reported hits are the replay's own
    replayed = replace(work, arrival_s=work.arrival_s + load_s, reported_hit_tokens=reported)
    gpu_tok = np.where(load, gpu * bs, 0).astype(np.int64)
    return OffloadPlan(gpu_tok, off_tok, load_s, replayed, routing, tier)
