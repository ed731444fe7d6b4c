"""The keys and value types of every TOML file a user writes, declared once (pydantic v2).

One model per table: FLEET.toml (and a run's recorded fleet), a hardware entry, a model entry,
the storage formats (``dtypes.toml``), a price table, an ingest mapping, ``rooftrace.toml`` and a
calibration's ``[calibration]`` table. :func:`check` validates a parsed table against its model
and turns the library's errors into the project's one-line message, naming the file, the table
and the key::

    fleets/x.toml: unknown key(s) ['replica']; allowed: ['calibration', ...]
    fleets/x.toml: missing key(s) ['hardware']
    fleets/x.toml [engine]: block_size must be an integer, got 'big'

Only keys and types are checked here (unknown keys, missing keys, a value of the wrong type; a
bool is never an integer or a number, and an integer is a number). Ranges, names and
cross-key rules stay where they were, after this step, with their cited bounds. The check never
changes the table: the loaders go on reading the dict they were given.

:func:`json_schema` exports the same declarations as JSON Schema for editors (``rooftrace
catalog schema KIND``; the files in ``schemas/editor/``; docs/architecture.md says how to point
an editor at them).

This module imports pydantic at import time; it is imported only when a file is loaded, never by
the command line's ``--help`` (docs/architecture.md).
"""

from __future__ import annotations

import datetime as _dt
import json
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from pipeline.common.errors import ConfigError

# --------------------------------------------------------------------------------------------
# value types and the words the messages use for them


class Expect:
    """Annotated metadata: how a message words what a key must be (``a path (text)``), where the
    word the type gives (``a string``) says less; ``verb`` for "must name ..." rather than
    "must be ..."."""

    def __init__(self, words: str, verb: str = "be") -> None:
        self.words = words
        self.verb = verb

    def __repr__(self) -> str:
        return f"Expect({self.words!r})"


#: A string with something besides white space in it.
NonEmptyStr = Annotated[str, Field(min_length=1, pattern=r"\S"), Expect("a non-empty string")]
#: A date as text (``"2026-03"``, ``"2026-03-01"``) or a native TOML date; a date-time or a time
#: passes this step so the loader can say it is not a day (its message quotes the value).
DateText = Annotated[
    str | _dt.date | SkipJsonSchema[_dt.datetime] | SkipJsonSchema[_dt.time],
    Expect("a date (YYYY-MM-DD)"),
]

_WORDS: dict[Any, str] = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    _dt.date: "a date",
    dict: "a table",
    list: "an array",
}


def _strip(annotation: Any) -> tuple[Any, str | None]:
    """(the type under ``Annotated``, its :class:`Expect` words or None)."""
    words = None
    while get_origin(annotation) is Annotated:
        args = get_args(annotation)
        annotation = args[0]
        for meta in args[1:]:
            if isinstance(meta, Expect) and words is None:
                words = meta.words
    return annotation, words


def _words(annotation: Any, metadata: list[Any] | None = None) -> str:
    """What a value of ``annotation`` is, in the messages' words."""
    for meta in metadata or []:
        if isinstance(meta, Expect):
            return meta.words
    annotation, words = _strip(annotation)
    if words is not None:
        return words
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(_words(a) for a in get_args(annotation)))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a table"
    if origin is list:
        (item,) = get_args(annotation) or (Any,)
        item_words = _words(item)
        return "an array" if item is Any else f"an array of {item_words.removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a table"
    return _WORDS.get(annotation, _WORDS.get(origin, getattr(annotation, "__name__", str(annotation))))


def _verb(annotation: Any, metadata: list[Any]) -> str:
    """ "be", or the verb an :class:`Expect` gives ("must name a catalog model id")."""
    while get_origin(annotation) is Annotated:
        annotation, *more = get_args(annotation)
        metadata = [*metadata, *more]
    return next((m.verb for m in metadata if isinstance(m, Expect)), "be")


class _Table(BaseModel):
    """A TOML table: only its declared keys, each of its declared type, nothing converted."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


def _opt(description: str = "", **extra: Any) -> Any:
    """An optional key (the loader applies its default)."""
    return Field(default=None, description=description or None, json_schema_extra=extra or None)


def _req(description: str = "", **extra: Any) -> Any:
    return Field(description=description or None, json_schema_extra=extra or None)


# --------------------------------------------------------------------------------------------
# FLEET.toml (pipeline/replay/fleet.py)


#: The choices of a fleet's (and a pool's) router, pods' balancer and cost model.
_ROUTERS = ["round_robin", "least_outstanding", "session_affinity", "prefix_affinity", "most_free_kv"]
_POD_BALANCERS = ["", "round_robin", "session_affinity", "prefix_affinity"]
_COST_MODELS = ["auto", "measured", "prior", "roofline"]
#: FLEET.toml measured_source: "auto" (the stated precedence) or a set of
#: pipeline/catalog/profiles/sources.toml (a test keeps the two equal).
_MEASURED_SOURCES = ["auto", "aiconfigurator", "llmservingsim"]


class EngineTable(_Table):
    """``[engine]``: vLLM engine arguments, vLLM's names (unset: vLLM's default for the GPU)."""

    max_num_seqs: int = _opt("most sequences in one step (vLLM --max-num-seqs)")
    max_num_batched_tokens: int = _opt("most tokens in one step (vLLM --max-num-batched-tokens)")
    enable_chunked_prefill: bool = _opt("split long prefills over steps (default true)")
    block_size: int = _opt("tokens per KV block (default 16)", enum=[1, 8, 16, 32, 64, 128, 256])
    gpu_memory_utilization: float = _opt("share of GPU memory vLLM may use, in (0, 1] (default 0.9)")
    enable_prefix_caching: bool = _opt("reuse cached prefix blocks (default true)")
    max_model_len: int = _opt("longest sequence, tokens")
    num_gpu_blocks_override: int = _opt("KV blocks per engine, instead of the memory fit's")
    step_overhead_s: float = _opt("host overhead per step, seconds, in [0, 10]")
    vllm_version: str = _opt("the vLLM release whose memory accounting sizes the KV cache, e.g. '0.10'")
    async_scheduling: bool = _opt("schedule step k while step k-1 runs (vLLM --async-scheduling; default on from 0.14)")
    frontend_request_s: float = _opt("API server seconds per request (tokenize, HTTP), in [0, 10]; default 0")
    frontend_token_s: float = _opt("API server seconds per output token per concurrent stream, in [0, 0.1]; default 0")


#: FLEET.toml [speculative] methods (vLLM's speculative_config "method"; pipeline/replay/fleet.py).
_SPEC_METHODS = ["draft_model", "eagle", "eagle3", "mtp", "ngram"]


class SpeculativeTable(_Table):
    """``[speculative]``: speculative decoding (vLLM --speculative-config)."""

    method: str = _req(
        "what drafts: a draft model, an EAGLE/EAGLE-3 head, MTP modules or n-gram lookup", enum=_SPEC_METHODS
    )
    num_speculative_tokens: int = _req("draft tokens per step, 1..16 (vLLM num_speculative_tokens)")
    model: str = _opt("method draft_model: the draft's catalog model name")
    acceptance: float = _opt("per-token acceptance probability in [0, 1] (default: pipeline/catalog/speculative.toml)")
    mean_accepted_tokens: float = _opt("tokens a step advances on average, in [1, k + 1], instead of acceptance")
    source: str = _opt("where the acceptance figure comes from")


class KvOffloadSharedTable(_Table):
    """``[kv_offload.shared]``: a store shared by the pool below a cpu tier (the third level: GPU,
    then each replica's host DRAM, then the pool's store; docs/accounting.md "Three levels")."""

    capacity_gb: float = _req("GB (1e9 bytes) the pool's store holds, in all")
    bandwidth_gb_s: float = _opt("GB/s a load from the store into a replica's GPUs reaches (default: kind shared's)")
    latency_us: float = _opt("µs per request's load from the store (default: kind shared's)")


class KvOffloadTable(_Table):
    """``[kv_offload]``: a lower KV tier that keeps prefix blocks the GPU's prefix cache evicts
    (vLLM OffloadingConnector / --kv-offloading-size, LMCache, Mooncake Store; pipeline/catalog/offload.toml
    holds each kind's cited defaults)."""

    kind: str = _req(
        "cpu: each replica's host DRAM; shared: one store for the pool over the network", enum=["cpu", "shared"]
    )
    capacity_gb: float = _req("GB (1e9 bytes) the tier holds: per replica for cpu, in all for shared")
    bandwidth_gb_s: float = _opt("GB/s a load into a replica's GPUs reaches (default: the kind's)")
    latency_us: float = _opt("µs per request's load (default: the kind's)")
    host_memory_gb: float = _opt("cpu: host DRAM one replica has (default: 256 GB per GPU, DGX H100)")
    shared: KvOffloadSharedTable = _opt("cpu: a store shared by the pool below the host tier (a third level)")


class FleetCalibrationTable(_Table):
    """``[calibration]``: roofline efficiency factors of this serving stack."""

    source: str = _req("what the factors were fitted on")
    compute_efficiency: float = _opt("share of peak FLOP/s reached, in [0.001, 1]")
    memory_efficiency: float = _opt("share of peak memory bandwidth reached, in [0.001, 1]")
    link_efficiency: float = _opt("share of peak link bandwidth reached, in [0.001, 1]")


class StackCalibrationTable(_Table):
    """A calibration file's ``[calibration]`` (pipeline/costmodel/stackcal.py), or a run's recorded copy."""

    source: str = _req("the logs, dates and fleet it was learnt from")
    hardware: str = _req("the GPU it was fitted on")
    cost_tier: str = _req("the cost tier it was fitted on")
    linear_scale: float = _req("a number in [0.25, 4]; 1 for no change")
    attention_scale: float = _req("a number in [0.25, 4]; 1 for no change")
    comm_scale: float = _req("a number in [0.25, 4]; 1 for no change")
    step_overhead_s: float = _req("seconds added to every step, in [0, 0.02]; 0 for no change")
    async_scheduling: float = _opt("1 to leave the fleet's async scheduling, 0 to turn it off")
    frontend_request_s: float = _opt("API server seconds per request, in [0, 0.2]; 0 for no change")
    frontend_token_s: float = _opt("API server seconds per token per stream, in [0, 0.002]; 0 for no change")


class TopologyTable(_Table):
    """``[topology]``: the box's GPU link, which prices the tensor-parallel collectives
    (pipeline/catalog/topology.toml holds each path's cited defaults; docs/collectives.md)."""

    link: str = _req("the GPUs' link", enum=["nvlink", "pcie"])
    generation: int = _req("NVLink 3, 4 or 5; PCIe 4 or 5")
    p2p: str = _opt(
        "PCIe only: how two GPUs reach each other's memory: through a PCIe switch, through the CPU's "
        "root complex, or none (staged through host memory)",
        enum=["switch", "root_complex", "none"],
    )
    busbw_bytes_per_s: float = _opt("the box's all-reduce bus bandwidth per GPU (nccl-tests busbw), B/s")
    latency_s: float = _opt("seconds per collective call")


#: The purchase models a fleet's GPUs may be bought under (pipeline/catalog/cost.toml [purchase.*]).
_PURCHASES = ["on_demand", "reserved_1y", "reserved_3y", "spot"]


class CostTable(_Table):
    """``[cost]``: the full cost's stated inputs (pipeline/economics/stack.py; docs/economics.md,
    "Cost stack"). Unset: on demand, no spare replicas, no overheads, no margin."""

    purchase: str = _opt("how the GPUs are bought (default on_demand)", enum=_PURCHASES)
    usd_per_gpu_hour: float = _opt("a quoted $/GPU-hour for that purchase model, instead of the catalog's")
    price_date: DateText = _opt("when the quoted usd_per_gpu_hour was read, YYYY-MM-DD")
    spot_interruptions_per_day: float = _opt("spot: interruptions per replica per day (required for spot)")
    spot_restart_s: float = _opt("spot: seconds a replica is lost per interruption (required for spot)")
    redundancy_replicas: int = _opt("k of N+k: spare replicas per pool, paid and idle (default 0)")
    network_percent: float = _opt("network, % of the GPU cost")
    network_usd_per_hour: float = _opt("network, $ per hour")
    storage_percent: float = _opt("storage, % of the GPU cost")
    storage_usd_per_hour: float = _opt("storage, $ per hour")
    operations_percent: float = _opt("operations, % of the GPU cost")
    operations_usd_per_hour: float = _opt("operations, $ per hour")
    margin_percent: float = _opt("margin, % on top of every cost line")
    electricity: bool = _opt(
        "the run's electricity as a line of its own (owned GPUs; a cloud GPU-hour price pays for the power) "
        "(default false)"
    )


class FleetEnergyTable(_Table):
    """``[energy]``: the electricity inputs of a run's energy figures (pipeline/economics/energy.py)."""

    usd_per_kwh: float = _opt("electricity price at the meter, USD per kWh, in (0, 10] (default 0.0811)")
    pue: float = _opt("the facility's power usage effectiveness, in [1, 5] (default 1.56)")


class AutoscaleTable(_Table):
    """``[autoscale]``: the live replicas follow a policy (pipeline/replay/autoscale.py)."""

    min_replicas: int = _req("fewest replicas live, >= 1")
    max_replicas: int = _req("most replicas (the engine's fleet; replicas, if set, must equal it)")
    signal: str = _req(
        "what drives it: busy share, waiting requests per live replica, KV occupancy, or a schedule",
        enum=["utilisation", "queue", "kv", "schedule"],
    )
    scale_up_at: float = _opt("a signal above this at a window's end adds replicas")
    scale_down_at: float = _opt("a signal below this at a window's end retires one replica")
    window_s: float = _opt("decision interval, seconds (default 60)")
    cooldown_s: float = _opt("no decision within this many seconds of the last change (default 0)")
    schedule: list[list[float]] = _opt("signal = 'schedule': [[hour after the first arrival, replicas], ...]")
    initial_replicas: int = _opt("replicas live when the day starts (default min_replicas)")
    storage: str = _opt("where weights are read from: a kind of pipeline/catalog/autoscale.toml")
    load_gb_s: float = _opt("GB/s the replica's weights are read at (default: the storage kind's)")
    engine_start_s: float = _opt("seconds to a ready engine, weights and CUDA graphs aside (default 41)")
    cuda_graph_s: float = _opt("seconds of CUDA graph capture (default 17; 0 with --enforce-eager)")


class FleetFile(_Table):
    """FLEET.toml: N identical replicas of one model on one GPU type behind a router."""

    name: str = _req("names the fleet's runs and reports: 1-64 letters, digits, '.', '_' or '-'")
    model: str = _req("catalog model name (rooftrace catalog list) or a model TOML path")
    hardware: str = _req("catalog hardware name (rooftrace catalog list) or a hardware TOML path")
    replicas: int = _opt("engines behind the router (default 1)")
    tp: int = _opt("tensor-parallel GPUs per replica (default 1)")
    pp: int = _opt("pipeline-parallel stages per replica (default 1)")
    ep: int = _opt("expert-parallel size (default 1)")
    dp: int = _opt("attention data-parallel ranks per replica (default 1)")
    weight_dtype: str = _opt("weight storage format (pipeline/catalog/dtypes.toml), default bf16")
    kv_dtype: str = _opt("KV-cache storage format (pipeline/catalog/dtypes.toml), default bf16")
    router: str = _opt("default round_robin", enum=_ROUTERS)
    router_pod_size: int = _opt("> 0: a load balancer over pods of this many replicas (default 0)")
    router_pod_balancer: str = _opt("how the balancer picks a pod", enum=_POD_BALANCERS)
    description: str = _opt()
    cost_model: str = _opt("default auto", enum=_COST_MODELS)
    measured_source: str = _opt(
        "which measured set prices an operator several cover (default auto: pipeline/catalog/profiles/sources.toml)",
        enum=_MEASURED_SOURCES,
    )
    engine: EngineTable = _opt("vLLM engine arguments")
    speculative: SpeculativeTable = _opt("speculative decoding (vLLM --speculative-config)")
    kv_offload: KvOffloadTable = _opt("a lower KV tier: host DRAM per replica or a shared store")
    calibration: FleetCalibrationTable = _opt("roofline factors of this serving stack")
    calibration_file: str = _opt("a calibration learnt from logs (rooftrace calibrate --observed), relative path")
    topology: TopologyTable = _opt("the GPUs' link: NVLink generation, or PCIe generation and peer-to-peer path")
    #: What a run records in place of calibration_file (refused in a fleet file).
    stack_calibration: SkipJsonSchema[StackCalibrationTable] = _opt()
    slo: Annotated[dict[str, Any] | str, Expect("a table or a string")] = _opt(
        'latency targets: [slo] preset = "chat", ttft_p99 = 2.0, ... or slo = "chat,ttft_p99=1s"'
    )
    cost: CostTable = _opt("the full cost's stated inputs: purchase model, N+k, overheads, margin")
    energy: FleetEnergyTable = _opt("electricity price and PUE of the energy figures")
    autoscale: AutoscaleTable = _opt("the live replicas follow a policy between min and max")


class PoolMatchTable(_Table):
    """``[pool.match]``: which requests a pool takes (every condition given must hold)."""

    tenant: list[str] = _opt("tenant names")
    min_input_tokens: int = _opt("the logged prompt is at least this long (tokens)")
    max_input_tokens: int = _opt("the logged prompt is at most this long (tokens)")


#: The kinds of link a prefill pool hands KV over (pipeline/catalog/links.toml).
_LINK_KINDS = ["nvlink", "infiniband", "rdma", "ethernet", "pcie"]


class PoolHandoffTable(_Table):
    """``[pool.handoff]``: the decode pool a prefill pool hands its requests to."""

    to: str = _req("the decode pool's name (default: the fleet's only decode pool)")


class PoolLinkTable(_Table):
    """``[pool.link]`` / ``[link]``: the path a request's KV takes from a prefill pool to its
    decode pool (pipeline/catalog/links.toml holds each kind's cited defaults)."""

    kind: str = _req("what the KV crosses", enum=_LINK_KINDS)
    bandwidth_gb_s: float = _opt("GB/s per direction per GPU (default: the kind's)")
    latency_us: float = _opt("µs per transfer (default: the kind's)")
    layerwise: bool = _opt("the transfer overlaps the prefill layer by layer (NIXL-style), default false")


class PoolTable(_Table):
    """``[[pool]]``: one homogeneous pool of a fleet of pools (pipeline/replay/pools.py); unset keys take
    the fleet's top-level value."""

    name: str = _req("names the pool in the run's tables: 1-32 letters, digits, '_' or '-'")
    role: str = _opt("what the pool's replicas do (default unified)", enum=["unified", "prefill", "decode"])
    match: PoolMatchTable = _opt("which requests the pool takes (every pool but the last)")
    handoff: PoolHandoffTable = _opt("a prefill pool: the decode pool it hands requests to")
    link: PoolLinkTable = _opt("a prefill pool: the link to its decode pool (default: the fleet's [link])")
    hardware: str = _opt("catalog hardware name or a hardware TOML path")
    replicas: int = _opt("engines behind the pool's router (default 1)")
    tp: int = _opt("tensor-parallel GPUs per replica (default 1)")
    pp: int = _opt("pipeline-parallel stages per replica (default 1)")
    ep: int = _opt("expert-parallel size (default 1)")
    dp: int = _opt("attention data-parallel ranks per replica (default 1)")
    weight_dtype: str = _opt("weight storage format")
    kv_dtype: str = _opt("KV-cache storage format")
    router: str = _opt(
        "how the pool spreads its requests",
        enum=_ROUTERS,
    )
    router_pod_size: int = _opt("> 0: a load balancer over pods of this many replicas")
    router_pod_balancer: str = _opt("how the balancer picks a pod", enum=_POD_BALANCERS)
    cost_model: str = _opt("default auto", enum=_COST_MODELS)
    engine: EngineTable = _opt("vLLM engine arguments, over the fleet's [engine]")
    kv_offload: KvOffloadTable = _opt("this pool's lower KV tier, instead of the fleet's")
    speculative: SpeculativeTable = _opt(
        "a unified or decode pool's speculative decoding, instead of the fleet's [speculative] (a prefill pool "
        "loads its decode pool's drafter)"
    )
    calibration: FleetCalibrationTable = _opt("roofline factors of this pool's serving stack")
    calibration_file: str = _opt("a calibration learnt from logs, relative path")
    topology: TopologyTable = _opt("the GPUs' link of this pool's boxes")
    autoscale: AutoscaleTable = _opt("the pool's live replicas follow a policy between min and max")


class PooledFleetFile(_Table):
    """FLEET.toml with ``[[pool]]`` tables: a fleet of homogeneous pools of one model; its other
    top-level keys are every pool's defaults."""

    name: str = _req("names the fleet's runs and reports: 1-64 letters, digits, '.', '_' or '-'")
    model: str = _req("catalog model name (rooftrace catalog list) or a model TOML path")
    pool: list[PoolTable] = _opt("the pools: every one but the last with a [pool.match] rule")
    link: PoolLinkTable = _opt("the link every prefill pool hands KV to its decode pool over, unless its own")
    hardware: str = _opt("every pool's default hardware")
    replicas: int = _opt("every pool's default replicas")
    tp: int = _opt()
    pp: int = _opt()
    ep: int = _opt()
    dp: int = _opt()
    weight_dtype: str = _opt()
    kv_dtype: str = _opt()
    router: str = _opt(enum=_ROUTERS)
    router_pod_size: int = _opt()
    router_pod_balancer: str = _opt(enum=_POD_BALANCERS)
    description: str = _opt()
    cost_model: str = _opt(enum=_COST_MODELS)
    engine: EngineTable = _opt("every pool's default vLLM engine arguments")
    kv_offload: KvOffloadTable = _opt("every pool's default lower KV tier")
    speculative: SpeculativeTable = _opt(
        "speculative decoding of every unified and decode pool (vLLM --speculative-config)"
    )
    calibration: FleetCalibrationTable = _opt()
    calibration_file: str = _opt()
    topology: TopologyTable = _opt("every pool's default GPU link")
    slo: Annotated[dict[str, Any] | str, Expect("a table or a string")] = _opt("the fleet's latency targets")
    cost: CostTable = _opt("the full cost's stated inputs: purchase model, N+k per pool, overheads, margin")
    energy: FleetEnergyTable = _opt("electricity price and PUE of the energy figures")


# --------------------------------------------------------------------------------------------
# catalog entries (pipeline/catalog/entries.py)


class PeakFlopsTable(_Table):
    """Dense tensor-core peaks by dtype, FLOP/s (bf16 required)."""

    bf16: float = _req()
    fp16: float = _opt()
    fp8: float = _opt()
    int8: float = _opt()
    fp4: float = _opt()
    int4: float = _opt()


class LinkTable(_Table):
    kind: NonEmptyStr = _req("e.g. nvlink4")
    bandwidth_bytes_per_s: float = _req("per direction per GPU")
    latency_s: float = _req()
    gpus_per_node: int = _req()
    fitted_from: NonEmptyStr = _opt(
        "the catalog GPU whose link rooftrace calibrate --measurements fitted on this box's nccl-tests log"
    )


class TopologyPathEntry(_Table):
    """pipeline/catalog/topology.toml ``[path.<name>]``: one intra-node path's all-reduce."""

    link: str = _req(enum=["nvlink", "pcie"])
    generation: int = _req()
    p2p: str = _req(enum=["nvlink", "switch", "root_complex", "none"])
    busbw_bytes_per_s: float = _req("nccl-tests all-reduce bus bandwidth per GPU, B/s")
    latency_s: float = _req("seconds per collective call")
    source: NonEmptyStr = _req()


class EfficiencyTable(_Table):
    compute: float = _req()
    memory: float = _req()
    elementwise: float = _req()
    link: float = _req()
    min_kernel_s: float = _req()
    step_overhead_s: float = _req()
    calibrated_on: NonEmptyStr = _req()


class HardwarePriceTable(_Table):
    usd_per_gpu_hour: float = _req()
    date: DateText = _req("YYYY-MM or YYYY-MM-DD")


class HardwareSourcesTable(_Table):
    """Where every number came from (cuda_memory_bytes, die, peer_to_peer, extra_reserved_bytes and
    prior_applies exactly when the entry sets them)."""

    memory_bytes: NonEmptyStr = _req()
    memory_bandwidth_bytes_per_s: NonEmptyStr = _req()
    peak_flops_per_s: NonEmptyStr = _req()
    link: NonEmptyStr = _req()
    efficiency: NonEmptyStr = _req()
    price: NonEmptyStr = _req()
    cuda_memory_bytes: NonEmptyStr = _opt()
    die: NonEmptyStr = _opt()
    peer_to_peer: NonEmptyStr = _opt()
    extra_reserved_bytes: NonEmptyStr = _opt()
    prior_applies: NonEmptyStr = _opt()


class HardwareEntry(_Table):
    """pipeline/catalog/hardware/<name>.toml: one accelerator, per GPU, SI units."""

    name: NonEmptyStr = _req("the file's stem")
    display_name: NonEmptyStr = _req()
    vendor: NonEmptyStr = _req()
    memory_bytes: float = _req("a whole number of bytes")
    memory_bandwidth_bytes_per_s: float = _req()
    cuda_memory_bytes: float = _opt("device memory as CUDA reports it")
    die: NonEmptyStr = _opt("e.g. GH100")
    peer_to_peer: bool = _opt(
        "whether GPUs of one node reach each other's memory directly (default true); false: vLLM's "
        "custom all-reduce is off and collectives run on NCCL through host memory"
    )
    extra_reserved_bytes: float = _opt(
        "memory per GPU this model holds beyond the data-centre runtime constants of the memory fit (default 0)"
    )
    prior_applies: bool = _opt(
        'whether cost_model = "auto" prices this GPU with the size-aware prior when it has no measured '
        "profile (default true); false: the plain roofline (the prior is fitted on CUDA kernels)"
    )
    peak_flops_per_s: PeakFlopsTable = _req()
    link: LinkTable = _req()
    efficiency: EfficiencyTable = _req()
    price: HardwarePriceTable = _req()
    sources: HardwareSourcesTable = _req()


class HfConfigTable(_Table):
    """``[config]``: the Hugging Face config.json keys rooftrace reads, verbatim."""

    architectures: list[Any] = _opt()
    model_type: str = _opt()
    hidden_size: int = _req()
    intermediate_size: int = _opt()
    num_hidden_layers: int = _req()
    num_attention_heads: int = _req()
    num_key_value_heads: int = _opt()
    head_dim: int = _opt()
    vocab_size: int = _req()
    max_position_embeddings: int = _opt()
    tie_word_embeddings: bool = _opt()
    attention_bias: bool = _opt()
    torch_dtype: str = _opt()
    sliding_window: int = _opt()
    use_sliding_window: bool = _opt()
    max_window_layers: int = _opt()
    layer_types: list[Any] = _opt("per layer: full_attention or sliding_attention")
    kv_lora_rank: int = _opt()
    q_lora_rank: int = _opt()
    qk_nope_head_dim: int = _opt()
    qk_rope_head_dim: int = _opt()
    v_head_dim: int = _opt()
    num_local_experts: int = _opt()
    num_experts: int = _opt()
    n_routed_experts: int = _opt()
    num_experts_per_tok: int = _opt()
    experts_per_token: int = _opt()
    moe_intermediate_size: int = _opt()
    n_shared_experts: int = _opt()
    first_k_dense_replace: int = _opt()
    moe_layer_freq: int = _opt()
    decoder_sparse_step: int = _opt()
    mlp_only_layers: list[Any] = _opt()
    quantization_config: dict[str, Any] = _opt()
    num_nextn_predict_layers: int = _opt()
    rope_theta: float = _opt()


class ModelEntry(_Table):
    """pipeline/catalog/models/<name>.toml: one model, a subset of its config.json."""

    name: NonEmptyStr = _req("the file's stem")
    hf_id: NonEmptyStr = _req("Hugging Face repository id")
    source: NonEmptyStr = _req("where [config] was copied from")
    config: HfConfigTable = _req()


class WeightFormatTable(_Table):
    bits: int = _req()
    group_size: int = _req()
    scale_bytes: float = _req()
    compute: NonEmptyStr = _req()
    source: NonEmptyStr = _req()


class KVFormatTable(_Table):
    bytes: float = _req()
    source: NonEmptyStr = _req()


class DtypesFile(_Table):
    """pipeline/catalog/dtypes.toml: weight and KV-cache storage formats."""

    weight: dict[str, WeightFormatTable] = _req()
    kv: dict[str, KVFormatTable] = _req()


# --------------------------------------------------------------------------------------------
# price tables (pipeline/economics/cost.py)


class PriceModelTable(_Table):
    input: float = _req("USD per million fresh input tokens")
    cached_input: float = _req("USD per million cache-hit input tokens")
    cache_write: float = _req("USD per million tokens written to the cache")
    output: float = _req("USD per million output tokens")
    date: DateText = _req("when the price was checked, YYYY-MM-DD")
    source: NonEmptyStr = _req()
    catalog_model: str = _opt("the catalog model id this price serves (an open model hosted by the provider)")


class PriceFile(_Table):
    """pipeline/catalog/prices/<provider>.toml: one provider's dated list prices."""

    provider: NonEmptyStr = _req()
    unit: str = _req(enum=["usd_per_million_tokens"])
    source: NonEmptyStr = _req()
    models: dict[str, PriceModelTable] = _req("[models.<name>] tables")


class PurchaseTable(_Table):
    fraction_of_on_demand: float = _req("the purchase model's $/GPU-hour over the on-demand one, in (0, 1]")
    date: DateText = _req("when the prices were read, YYYY-MM-DD")
    source: NonEmptyStr = _req()


class CostCatalogFile(_Table):
    """pipeline/catalog/cost.toml: the purchase models' fractions of the on-demand price."""

    purchase: dict[str, PurchaseTable] = _req("[purchase.<model>] tables")


# --------------------------------------------------------------------------------------------
# ingest mapping (pipeline/ingest/mapping.py)

ColumnName = Annotated[str, Field(min_length=1), Expect("a non-empty column name")]


class MappingFieldsTable(_Table):
    """``[fields]``: canonical field = source column (a dotted path into JSON)."""

    request_id: ColumnName = _opt()
    arrival: ColumnName = _req()
    model: ColumnName = _opt()
    tenant: ColumnName = _opt()
    session_id: ColumnName = _opt()
    adapter: ColumnName = _opt()
    status: ColumnName = _opt()
    recorded_input_tokens: ColumnName = _req()
    cache_hit_tokens: ColumnName = _opt()
    cache_write_tokens: ColumnName = _opt()
    output_tokens: ColumnName = _req()
    reasoning_tokens: ColumnName = _opt()
    ttft_s: ColumnName = _opt()
    e2e_s: ColumnName = _opt()
    prefix_block_hashes: ColumnName = _opt()


class MappingFile(_Table):
    """An ingest mapping (``rooftrace ingest --mapping``): generic CSV, JSON Lines or Parquet."""

    format: str = _opt("csv, jsonl or parquet (--format wins)", enum=["csv", "jsonl", "parquet"])
    source_format: str = _opt("label stored in requests.source_format (default: format)")
    time_unit: str = _opt("default auto", enum=["auto", "s", "ms", "us", "ns", "iso", "relative_s", "relative_ms"])
    input_excludes_cache: bool = _opt("true when input counts exclude cache reads/writes")
    block_size: int = _opt("tokens per prefix hash block, when hashes are mapped (default 16)")
    fields: MappingFieldsTable = _req()


# --------------------------------------------------------------------------------------------
# rooftrace.toml (pipeline/ingest/project.py)

PathText = Annotated[str, Expect("a path (text)")]


class ProjectFile(_Table):
    """rooftrace.toml: where a project's commands read and write (paths relative to it)."""

    store: PathText = _opt("default traces/store")
    reports: PathText = _opt("default reports")
    fleet: PathText = _opt("default fleets/default.toml")
    models: Annotated[
        dict[str, Annotated[str, Expect("a catalog model id (text)", verb="name")]],
        Expect('a table of aliases ([models] "name" = "catalog-id")'),
    ] = _opt("model names as the logs spell them = catalog model ids")


#: What ``rooftrace catalog schema KIND`` exports, and the file under schemas/editor/ of each.
EDITOR_SCHEMAS: dict[str, type[_Table]] = {
    "fleet": FleetFile,
    "pooled-fleet": PooledFleetFile,
    "hardware": HardwareEntry,
    "model": ModelEntry,
    "mapping": MappingFile,
    "prices": PriceFile,
    "project": ProjectFile,
}


# --------------------------------------------------------------------------------------------
# the check and its one-line messages


def check(table: Any, schema: type[_Table], where: str) -> None:
    """Refuse ``table`` unless its keys and value types are those ``schema`` declares: one
    :class:`ConfigError` line naming ``where`` (the file), the table and the key."""
    try:
        schema.model_validate(table)
    except ValidationError as exc:
        raise ConfigError(explain(exc, table, schema, where)) from None


def _show(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:
        return "a value nested too deeply to show"
    return text if len(text) <= 80 else text[:77] + "..."


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _step(model: type[BaseModel], loc: tuple[Any, ...], i: int) -> tuple[type[BaseModel], str, int] | None:
    """From the table ``model``, the sub-table ``loc[i]`` leads into, when ``loc`` goes on past
    it: (its model, its TOML name, where ``loc`` continues), else None."""
    field = model.model_fields.get(loc[i]) if isinstance(loc[i], str) else None
    if field is None:
        return None
    annotation, _ = _strip(field.annotation)
    if _is_model(annotation) and i + 1 < len(loc):
        return annotation, loc[i], i + 1
    if get_origin(annotation) is dict and _is_model(get_args(annotation)[1]) and i + 2 < len(loc):
        return get_args(annotation)[1], f"{loc[i]}.{loc[i + 1]}", i + 2
    return None


def _find(
    schema: type[BaseModel], loc: tuple[Any, ...]
) -> tuple[list[str], str, Any, list[Any], tuple[Any, ...]] | None:
    """Walk an error's location through the declarations: (the tables it passes, as TOML names
    them; the key; its declared annotation and metadata; the path of keys into the data)."""
    tables: list[str] = []
    model, i = schema, 0
    while i < len(loc):
        step = _step(model, loc, i)
        if step is None:
            break
        model, name, i = step
        tables.append(name)
    if i >= len(loc) or not isinstance(loc[i], str):
        return None
    path = tuple(loc[: i + 1])
    field = model.model_fields.get(loc[i])
    if field is None:  # an unknown key (extra_forbidden)
        return tables, loc[i], Any, [], path
    annotation, _ = _strip(field.annotation)
    if get_origin(annotation) is dict and i + 1 < len(loc):  # an entry of a table of free keys: "[models] 'x'"
        return tables, f"[{loc[i]}] {loc[i + 1]!r}", get_args(annotation)[1], [], (*path, loc[i + 1])
    return tables, loc[i], field.annotation, field.metadata, path


def _lookup(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


def explain(exc: ValidationError, data: Any, schema: type[BaseModel], where: str) -> str:
    """The one line that says what is wrong: the shallowest table first; in it, unknown keys
    (all of them, with the allowed ones), then missing keys (all of them), then the first value
    of the wrong type in the file's order of keys."""
    found: list[tuple[int, int, int, str, str, str]] = []  # depth, kind, order, table, key, text
    for error in exc.errors(include_url=False):
        loc, kind = tuple(error["loc"]), error["type"]
        if not loc:
            return f"{where}: must be a table, got {_show(data)}"
        hit = _find(schema, loc)
        if hit is None:
            continue
        tables, key, annotation, metadata, path = hit
        table = f"{where} [{'.'.join(tables)}]" if tables else where
        if kind == "extra_forbidden":
            owner = _lookup_model(schema, loc[:-1])
            found.append((len(path), 0, 0, table, key, f"; allowed: {sorted(owner.model_fields)}"))
        elif kind == "missing":
            owner = _lookup_model(schema, loc[:-1])
            about = owner.model_fields[key].description
            found.append((len(path), 1, 0, table, key, f" ({key}: {about})" if about else ""))
        else:
            value = _lookup(data, path)
            try:
                order = list(_lookup(data, path[:-1])).index(path[-1])
            except (ValueError, TypeError):
                order = 0
            words = _words(annotation, metadata)
            if isinstance(value, int) and not isinstance(value, bool) and "number" in words:
                text = f"{key} is an integer too large to use ({len(str(abs(value)))} digits)"
            else:
                text = f"{key} must {_verb(annotation, metadata)} {words}, got {_show(value)}"
            found.append((len(path), 2, order, table, key, text))
    if not found:  # (every location the declarations hold is walked; a plain fallback)
        return f"{where}: {exc.errors(include_url=False)[0]['msg']}"
    found.sort(key=lambda f: f[:3])
    depth, rank, _, table, _, text = found[0]
    same = sorted({f[4] for f in found if f[:2] == (depth, rank) and f[3] == table})
    if rank == 0:
        return f"{table}: unknown key(s) {same}{text}"
    if rank == 1:  # one key missing: what it is, where the declaration says
        return f"{table}: missing key(s) {same}{text if len(same) == 1 else ''}"
    return f"{table}: {text}"


def _lookup_model(schema: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    """The model of the table at ``loc`` (a path of keys, a free key's entry included)."""
    model, i = schema, 0
    while i < len(loc):
        step = _step(model, (*loc, None), i)
        if step is None:
            break
        model, _, i = step
    return model


# --------------------------------------------------------------------------------------------
# JSON Schema for editors


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of one file kind (:data:`EDITOR_SCHEMAS`), for editors (Taplo / Even
    Better TOML): the declarations above, without pydantic's titles and null defaults."""
    model = EDITOR_SCHEMAS[kind]
    schema = _tidy(model.model_json_schema())
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def schema_text(kind: str) -> str:
    """:func:`json_schema` as the text ``rooftrace catalog schema KIND`` prints and
    ``schemas/editor/KIND.json`` holds (a test keeps the files equal to it)."""
    return json.dumps(json_schema(kind), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _tidy(node: Any, in_properties: bool = False) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if not in_properties and (key == "title" or (key == "default" and value is None)):
                continue
            out[key] = _tidy(value, in_properties=key in ("properties", "$defs") and not in_properties)
        return out
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    return node
