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
take requests in arrival order, so the delayed workload is re-sorted and the results put back
in the day's order, with the day's arrival, so ``queue_s`` and ``ttft_s`` include the load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.classify.offload import OffloadTier
from pipeline.classify.prefix import request_distances
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
    order               the replayed workload's rows: ``work`` re-sorted by delayed arrival
    work                the workload the engines replay
    routing             ``replica`` (each replica's own tiers), ``pooled`` (module doc) or
                        ``none`` (no prefix caching: nothing is cached, nothing loads)
    """

    gpu_hit_tokens: I64Array
    offload_hit_tokens: I64Array
    load_s: F64Array
    order: I64Array
    work: Workload
    routing: str
    tier: OffloadTier

    def restore(self, res: EngineResult) -> EngineResult:
        """The replayed workload's results in the day's order, each arrival the logged one."""
        back = np.empty_like(self.order)
        back[self.order] = np.arange(self.order.shape[0], dtype=np.int64)
        out = EngineResult(**{k: v[back] for k, v in vars(res).items()})
        out.arrival_s[:] = out.arrival_s - self.load_s
        return out

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


def _subset(hashes: npt.NDArray[np.uint64], offsets: I64Array, rows: I64Array) -> tuple[Any, I64Array]:
    """The CSR chains of ``rows`` (in that order)."""
    counts = offsets[rows + 1] - offsets[rows]
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    idx = np.repeat(offsets[rows] - off[:-1], counts) + np.arange(int(off[-1]), dtype=np.int64)
    return hashes[idx], off


def _hits(
    hashes: npt.NDArray[np.uint64], offsets: I64Array, lookups: I64Array, rows: I64Array, capacities: list[int]
) -> list[I64Array]:
    """Leading hit blocks of ``rows`` (arrival order) in LRU caches of each of ``capacities``."""
    h, off = _subset(hashes, offsets, rows)
    dist = request_distances(h, off, lookups[rows])
    return [dist.hit_blocks(c) for c in capacities]


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
        return OffloadPlan(none, none, np.zeros(n), np.arange(n, dtype=np.int64), work, "none", tier)
    explicit = work.explicit()
    hashes, offsets = explicit.chain_hashes, explicit.offsets()
    counts = np.diff(offsets)
    lookups = np.minimum(np.maximum(work.prompt_tokens - 1, 0) // bs, counts).astype(np.int64)
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
        for r in range(R):
            rows = np.flatnonzero((routes == r) & live).astype(np.int64)
            if rows.size:
                g, both = _hits(hashes, offsets, lookups, rows, [G, max(G, per_rank)])
                gpu[rows], total[rows] = g, (g if shared else both)
        if shared:
            rows = np.flatnonzero(live).astype(np.int64)
            (pool,) = _hits(hashes, offsets, lookups, rows, [lower])
            total[rows] = np.maximum(gpu[rows], pool)
        routing = "replica"
    else:
        rows = np.flatnonzero(live).astype(np.int64)
        pooled = lower if shared else lower * R
        if rows.size:
            g, both = _hits(hashes, offsets, lookups, rows, [G * R, max(G * R, pooled)])
            gpu[rows], total[rows] = g, both
        routing = "pooled"
    low = total - gpu
    load = low > 0
    off_tok = np.where(load, low * bs, 0).astype(np.int64)
    load_s = tier.load_s(off_tok, kv_bytes_per_gpu_token)
    arrival = work.arrival_s + load_s
    order = np.argsort(arrival, kind="stable").astype(np.int64)
    if not load.any():  # the GPU tier keeps every block a request finds: the day as it is
        return OffloadPlan(np.zeros(n, np.int64), off_tok, load_s, order, work, routing, tier)
    reported = work.reported_hit_tokens.copy() if work.reported_hit_tokens is not None else np.full(n, -1, np.int64)
    reported[load] = total[load] * bs
    # the chains in the replayed order, made once (the day's block hashes: the largest arrays here)
    chains = _subset(hashes, offsets, order) if work.chain_tree is None else (np.zeros(0, np.uint64), None)
    replayed = Workload(
        arrival_s=arrival[order],
        prompt_tokens=work.prompt_tokens[order],
        output_tokens=work.output_tokens[order],
        chain_tree=work.chain_tree.take(order) if work.chain_tree is not None else None,
        chain_hashes=chains[0],
        chain_offsets=chains[1],
        affinity=work.affinity[order] if work.affinity is not None else None,
        reported_hit_tokens=reported[order],
        recorded_input_tokens=work.recorded_input_tokens[order] if work.recorded_input_tokens is not None else None,
    )
    gpu_tok = np.where(load, gpu * bs, 0).astype(np.int64)
    return OffloadPlan(gpu_tok, off_tok, load_s, order, replayed, routing, tier)
