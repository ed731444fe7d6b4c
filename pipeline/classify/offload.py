"""KV offload tiers: a lower tier (host DRAM per replica, or a store shared by a pool) that keeps
prefix blocks beyond the GPU's own prefix cache (docs/accounting.md, "KV offload tiers").

Semantics, as vLLM's ``OffloadingConnector`` (its scheduler-side ``OffloadingManager``: ``lookup``
of the longest leading run of offloaded blocks, ``touch`` of a request's blocks, ``prepare_store``
of newly computed ones, an LRU manager) and LMCache's local CPU backend behave:

* **Write-through.** Every full block a request computes is stored to the lower tier too, so a
  block the GPU tier evicts is already there (nothing is copied at eviction).
* **LRU per tier, on one access sequence.** Each request touches all its blocks in both tiers
  (a lower-tier hit is loaded, i.e. promoted into the GPU tier, and stays in the lower one).
  Both tiers therefore hold the most recent blocks of the same LRU stack: the GPU tier the
  ``G`` most recent, the lower tier the ``L`` most recent. A block of stack distance ``d``
  (:mod:`pipeline.classify.prefix`) hits in the GPU tier iff ``d <= G``, in the lower tier only iff
  ``G < d <= L``, and is fresh beyond ``max(G, L)``: one pass of stack distances gives the hits
  of every pair of sizes. A lower tier no larger than the GPU tier adds nothing (inclusion).
* **A lower-tier hit costs a load, not a prefill**: ``bytes / bandwidth + latency`` per request
  (:meth:`OffloadTier.load_s`), the load asynchronous to the engine's steps (the request waits
  for it; the batch does not).

**Three levels** (a cpu tier with a ``shared`` store below it: ``[kv_offload.shared]``): every
tier write-through, each LRU; a request's leading run is served by the GPU tier, then the cpu
tier, then the store, and ends at the first block none of them holds. On one access sequence
(classify's one cache) a block of distance ``d`` hits the GPU tier iff ``d <= G``, the cpu tier
iff ``G < d <= max(G, C)``, the store iff ``max(G, C) < d <= max(G, C, S)``
(:func:`tiers_hits`). The loads of the two tiers are serial (:meth:`OffloadTier.loads_s`): both
reach the GPU over its one PCIe link (docs/accounting.md, "Three levels").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from pipeline.catalog.entries import CATALOG_DIR
from pipeline.classify.prefix import Distances
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.tomlfile import read_toml

I64Array = npt.NDArray[np.int64]
F64Array = npt.NDArray[np.float64]

#: The kinds of lower tier (pipeline/catalog/offload.toml gives each its cited defaults).
OFFLOAD_KINDS: tuple[str, ...] = ("cpu", "shared")
#: Bounds far beyond any real tier that keep every count finite: 1 PB of capacity, 10 TB/s, 1 s.
MAX_OFFLOAD_GB = 1e6
MAX_OFFLOAD_GB_S = 1e4
MAX_OFFLOAD_LATENCY_US = 1e6


def offload_kinds() -> dict[str, dict[str, float]]:
    """Each kind's default figures (pipeline/catalog/offload.toml, with its sources)."""
    data = read_toml(CATALOG_DIR / "offload.toml", "offload catalog")
    return {k: {key: float(v) for key, v in table.items()} for k, table in data["kinds"].items()}


@dataclass(frozen=True)
class OffloadTier:
    """One lower KV tier: ``kind`` cpu (per replica: ``capacity_gb`` of each replica's host DRAM)
    or shared (one store per pool: ``capacity_gb`` in all), the bandwidth a load reaches (GB/s)
    and its fixed latency per request (µs)."""

    kind: str
    capacity_gb: float
    bandwidth_gb_s: float
    latency_us: float
    #: cpu: the host DRAM one replica has, which the tier must fit in (None for shared)
    host_memory_gb: float | None = None
    #: cpu only: a store shared by the pool below the cpu tier (``[kv_offload.shared]``, its kind
    #: ``shared``; None: the cpu tier is the only lower one)
    shared: OffloadTier | None = None

    @property
    def lower_tiers(self) -> tuple[OffloadTier, ...]:
        """The lower tiers, nearest first: this one, then the store below it if any."""
        return (self,) if self.shared is None else (self, self.shared)

    def capacity_blocks(self, kv_bytes_per_token: float, block_size: int, replicas: int = 1) -> int:
        """Blocks of ``block_size`` tokens the tier holds for ``replicas`` replicas (a cpu tier is
        one per replica, a shared one is the pool's)."""
        if kv_bytes_per_token <= 0 or block_size <= 0:
            raise RooftraceError("KV bytes per token and the block size must be positive")
        copies = replicas if self.kind == "cpu" else 1
        return int(self.capacity_gb * 1e9 * copies // (kv_bytes_per_token * block_size))

    def load_s(self, tokens: npt.ArrayLike, kv_bytes_per_token: float) -> F64Array:
        """Seconds a load of ``tokens`` tokens takes (0 where nothing is loaded)."""
        t = np.asarray(tokens, dtype=np.float64)
        secs = t * float(kv_bytes_per_token) / (self.bandwidth_gb_s * 1e9) + self.latency_us * 1e-6
        return cast(F64Array, np.where(t > 0, secs, 0.0))

    def loads_s(self, tokens: npt.ArrayLike, shared_tokens: npt.ArrayLike, kv_bytes_per_token: float) -> F64Array:
        """Seconds a request waits for ``tokens`` from this tier and ``shared_tokens`` from the
        store below it: the two loads one after the other (both cross the GPU's one PCIe link),
        each tier's latency paid only where it loads something. With no store below,
        :meth:`load_s` (``shared_tokens`` must then be 0)."""
        own = self.load_s(tokens, kv_bytes_per_token)
        if self.shared is None:
            if np.any(np.asarray(shared_tokens) > 0):
                raise RooftraceError("tokens from a shared store, but the tier has none below it")
            return own
        return own + self.shared.load_s(shared_tokens, kv_bytes_per_token)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "capacity_gb": self.capacity_gb,
            "bandwidth_gb_s": self.bandwidth_gb_s,
            "latency_us": self.latency_us,
        }
        if self.host_memory_gb is not None:  # (a run's record reads back through the same check)
            out["host_memory_gb"] = self.host_memory_gb
        if self.shared is not None:  # (absent: a one-tier fleet's record, and its run id, unchanged)
            below = self.shared.to_dict()
            del below["kind"]  # ([kv_offload.shared] is of kind shared by its place)
            out["shared"] = below
        return out

    def text(self) -> str:
        where = "per replica" if self.kind == "cpu" else "shared by the pool"
        own = f"{self.kind} {self.capacity_gb:g} GB {where}, {self.bandwidth_gb_s:g} GB/s, {self.latency_us:g} µs"
        return own if self.shared is None else f"{own}, then {self.shared.text()}"


def _number(raw: Mapping[str, Any], key: str, default: float, where: str, lo: float, hi: float, unit: str) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number of {unit}, got {value!r}")
    x = float(value)
    open_low = key == "bandwidth_gb_s"  # a load must move at some speed
    if not (math.isfinite(x) and lo <= x <= hi) or (open_low and x <= lo):
        bounds = f"{'(' if open_low else '['}{lo:g}, {hi:g}]"
        raise ConfigError(f"{where}: {key} must be a number of {unit} in {bounds}, got {value!r}")
    return x


def tier_from_summary(kv: Mapping[str, Any]) -> OffloadTier:
    """The tier a run's ``kv_offload`` record (:meth:`OffloadTier.to_dict`, with its store below
    under ``shared``) describes."""

    def one(d: Mapping[str, Any], kind: str) -> OffloadTier:
        return OffloadTier(kind, float(d["capacity_gb"]), float(d["bandwidth_gb_s"]), float(d["latency_us"]))

    below = kv.get("shared")
    return replace(one(kv, str(kv["kind"])), shared=one(below, "shared") if isinstance(below, Mapping) else None)


def parse_offload(raw: Mapping[str, Any], where: str, gpus_per_replica: int) -> OffloadTier:
    """A ``[kv_offload]`` table (keys and types checked by its schema), its figures in range and
    a cpu tier within the host memory of one replica (``host_memory_gb``, default the catalog's
    DRAM per GPU times the replica's GPUs): every mistake one line naming ``where``."""
    kinds = offload_kinds()
    kind = raw.get("kind")
    if kind not in kinds:
        raise ConfigError(f"{where}: kind {kind!r} unknown; choose one of {sorted(kinds)}")
    if "capacity_gb" not in raw:
        raise ConfigError(f"{where}: capacity_gb is required (GB the tier holds)")
    d = kinds[kind]
    host: float | None = None
    cap = _number(raw, "capacity_gb", 0.0, where, 0.0, MAX_OFFLOAD_GB, "GB")
    bw = _number(raw, "bandwidth_gb_s", d["bandwidth_gb_s"], where, 0.0, MAX_OFFLOAD_GB_S, "GB/s")
    lat = _number(raw, "latency_us", d["latency_us"], where, 0.0, MAX_OFFLOAD_LATENCY_US, "µs")
    if kind == "cpu":
        default_host = d["host_memory_gb_per_gpu"] * max(int(gpus_per_replica), 1)
        host = _number(raw, "host_memory_gb", default_host, where, 0.0, MAX_OFFLOAD_GB, "GB")
        if cap > host:
            said = "host_memory_gb" if "host_memory_gb" in raw else f"{gpus_per_replica} GPU(s) x the DRAM per GPU"
            raise ConfigError(
                f"{where}: capacity_gb {cap:g} is more than the {host:g} GB of host memory one replica has ({said}); "
                "lower capacity_gb or set host_memory_gb to the host's"
            )
    elif "host_memory_gb" in raw:
        raise ConfigError(f"{where}: host_memory_gb is for kind cpu only (a shared store is sized by capacity_gb)")
    below = None
    if "shared" in raw:
        below = _parse_shared(raw["shared"], where, str(kind), kinds["shared"])
    return OffloadTier(str(kind), cap, bw, lat, host, below)


#: The keys of ``[kv_offload.shared]`` (the store below a cpu tier).
SHARED_KEYS = ("capacity_gb", "bandwidth_gb_s", "latency_us")


def _parse_shared(raw: Any, where: str, kind: str, d: Mapping[str, float]) -> OffloadTier:
    """``[kv_offload.shared]``: the store shared by the pool below a cpu tier."""
    sub = f"{where[:-1]}.shared]" if where.endswith("]") else f"{where} shared"
    if kind != "cpu":
        raise ConfigError(
            f"{sub}: a store below the tier is for kind cpu only (GPU, then each replica's host DRAM, then the "
            'pool\'s store); a kind = "shared" tier is the store itself'
        )
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{sub}: expected a table (capacity_gb, bandwidth_gb_s, latency_us), got {raw!r}")
    unknown = sorted(set(raw) - set(SHARED_KEYS))
    if unknown:
        raise ConfigError(f"{sub}: unknown key(s) {unknown}; it takes {list(SHARED_KEYS)}")
    if "capacity_gb" not in raw:
        raise ConfigError(f"{sub}: capacity_gb is required (GB the pool's store holds)")
    cap = _number(raw, "capacity_gb", 0.0, sub, 0.0, MAX_OFFLOAD_GB, "GB")
    bw = _number(raw, "bandwidth_gb_s", d["bandwidth_gb_s"], sub, 0.0, MAX_OFFLOAD_GB_S, "GB/s")
    lat = _number(raw, "latency_us", d["latency_us"], sub, 0.0, MAX_OFFLOAD_LATENCY_US, "µs")
    return OffloadTier("shared", cap, bw, lat)


def tier_hits(dist: Distances, gpu_blocks: int | None, lower_blocks: int) -> tuple[I64Array, I64Array]:
    """Per request, its leading blocks that hit in the GPU tier of ``gpu_blocks`` and those that
    hit only in a write-through lower tier of ``lower_blocks`` (module doc): a block of distance
    ``d`` hits the GPU tier iff ``d <= G`` and the lower tier only iff ``G < d <= L``. An
    unbounded GPU tier (None) leaves the lower tier nothing."""
    if lower_blocks < 0 or (gpu_blocks is not None and gpu_blocks < 0):
        raise RooftraceError("tier capacities must be >= 0 blocks")
    gpu = dist.hit_blocks(gpu_blocks)
    if gpu_blocks is None:
        return gpu, np.zeros_like(gpu)
    both = dist.hit_blocks(max(gpu_blocks, lower_blocks))
    return gpu, cast(I64Array, both - gpu)


def tiers_hits(dist: Distances, gpu_blocks: int, lower_blocks: Sequence[int]) -> list[I64Array]:
    """Per request, its leading blocks each tier serves, GPU tier first, then each write-through
    lower tier in order (sizes ``lower_blocks``), all on the one access sequence of ``dist``: tier
    k serves the blocks of distance in ``(max(G, L_1..L_{k-1}), max(G, L_1..L_k)]`` (module doc).
    With one lower tier, :func:`tier_hits`."""
    if gpu_blocks < 0 or any(b < 0 for b in lower_blocks):
        raise RooftraceError("tier capacities must be >= 0 blocks")
    reach = gpu_blocks
    run = dist.hit_blocks(reach)
    out = [run]
    for blocks in lower_blocks:
        reach = max(reach, int(blocks))
        longer = dist.hit_blocks(reach)
        out.append(cast(I64Array, longer - run))
        run = longer
    return out
