"""FLEET.toml: the serving configuration a replay runs (docs/architecture.md, docs/engine.md).

A fleet is N identical replicas of one model on one hardware type, each tensor/pipeline/expert
parallel over ``tp × pp`` GPUs (times ``dp`` attention data-parallel ranks, each with its own
scheduler; an MoE model's ranks step in lockstep), behind a router, each running a
continuous-batching engine whose settings carry vLLM's names and defaults::

    name = "default"
    model = "llama-3.1-8b"          # catalog name (pipeline/catalog/models)
    hardware = "h100-sxm"           # catalog name (pipeline/catalog/hardware)
    weight_dtype = "bf16"
    kv_dtype = "bf16"
    tp = 1
    replicas = 2
    router = "round_robin"          # least_outstanding | session_affinity | prefix_affinity | most_free_kv
    router_pod_size = 0             # > 0: a load balancer over pods of this many replicas
    router_pod_balancer = "round_robin"  # how it picks a pod: | session_affinity | prefix_affinity
                                    # (unset: the router's key for the affinity routers)
    cost_model = "auto"             # profile, else the size-aware prior | measured | prior | roofline

    [engine]
    max_num_seqs = 256
    max_num_batched_tokens = 8192
    enable_chunked_prefill = true
    block_size = 16
    gpu_memory_utilization = 0.9
    enable_prefix_caching = true

Unknown, missing or mistyped keys are errors that name the file, table and key (the declarations
are ``FleetFile`` and its tables in pipeline/common/tomlschema.py), and so are values out of range,
each checked before the memory fit: ``block_size`` one of vLLM's (1, 8, 16, 32, 64, 128, 256),
``max_num_seqs`` and ``max_num_batched_tokens`` in 1..2**24, ``[calibration]`` factors in
[MIN_EFFICIENCY, 1], ``max_model_len`` and
``num_gpu_blocks_override`` in 1..2**31-1, ``router_pod_size`` in 0..2**31-1, ``vllm_version`` a V1
0.x release from 0.8 (pipeline.costmodel.fit.parse_vllm_version). The config objects are frozen;
:func:`resolve` turns one into the engine's SchedulerConfig and the cost model; its errors start
with the fleet's origin too; :func:`fleet_from_dict` reads back what ``to_dict`` wrote (a run's
config.json). ``cost_model = "measured"`` on a GPU without a measured profile is
refused by :func:`load_fleet`, naming the file (:func:`check_cost_model`), and so is a
``[calibration]`` with ``cost_model = "measured"`` or ``"prior"``, tiers that never use its
roofline factors (:func:`check_calibration_tier`).
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.catalog import (
    CATALOG_DIR,
    MIN_EFFICIENCY,
    PCIE_P2P_PATHS,
    TOPOLOGY_LINKS,
    HardwareSpec,
    LinkPath,
    ModelSpec,
    entry_path,
    fitted_link,
    kv_format,
    load_hardware,
    load_model,
    load_topology,
    parse_hardware,
    parse_model,
    weight_format,
)
from pipeline.catalog.entries import LINK_BANDWIDTH_RANGE, LINK_LATENCY_RANGE, topology_file
from pipeline.classify.offload import OffloadTier, parse_offload
from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.costmodel.fit import (
    DEFAULT_VLLM_VERSION,
    MAX_BATCH,
    VLLM_BLOCK_SIZES,
    DraftMemory,
    MemoryFit,
    fit,
    kv_bytes_per_token,
    parse_vllm_version,
    weights_bytes_per_gpu,
)
from pipeline.costmodel.model import CostModel
from pipeline.costmodel.profile.tables import list_profiles, no_profile_message, profile_for
from pipeline.costmodel.roofline import MAX_DP, Deployment
from pipeline.costmodel.stackcal import StackCalibration, check_applies, load_calibration_file, parse_calibration
from pipeline.costmodel.steps import StepBatch
from pipeline.engine.model import (
    MAX_SPECULATIVE_TOKENS,
    ROUTERS,
    FleetSpec,
    SchedulerConfig,
    Speculation,
    tokens_per_verification,
)
from pipeline.replay.autoscale import AUTOSCALE_ROUTERS, AutoscaleSettings, parse_autoscale
from pipeline.replay.slo import parse_slo, slo_table_text

#: Routers that send a request by a key it carries (a session id, its first prefix block).
AFFINITY_ROUTERS = ("session_affinity", "prefix_affinity")

GIB = 1 << 30
#: Most engines (replicas × dp) a fleet may have: the replay numbers them in 4 bytes.
MAX_ENGINES = 2**31 - 1
#: Most KV blocks of one engine (``num_gpu_blocks_override``): the engine's block tables are int32.
MAX_GPU_BLOCKS = 2**31 - 1
#: Longest ``max_model_len`` a fleet file may give (a 4-byte count, as the engine's block tables);
#: a length whose one sequence the KV cache cannot hold is then refused by :func:`resolve`'s fit.
MAX_MODEL_LEN = 2**31 - 1

#: ``[engine]`` integers other than block_size: (least, most, unit, why the bound).
_ENGINE_RANGES: dict[str, tuple[int, int, str, str]] = {
    "max_num_seqs": (1, MAX_BATCH, "sequences", ""),
    "max_num_batched_tokens": (1, MAX_BATCH, "tokens", ""),
    "max_model_len": (1, MAX_MODEL_LEN, "tokens", ""),
    "num_gpu_blocks_override": (1, MAX_GPU_BLOCKS, "blocks", " (the engine numbers KV blocks in 4 bytes)"),
}

# vLLM's defaults (vllm/engine/arg_utils.py, EngineArgs and get_batch_defaults, OpenAI API server
# context): block_size 16 on CUDA, gpu_memory_utilization 0.9, prefix caching and chunked prefill
# on in the V1 engine; max_num_batched_tokens / max_num_seqs depend on the GPU: 8192 / 1024 on a
# device with >= 70 GiB that is not an A100 ("For GPUs like H100 and MI300x"), else 2048 / 256.
VLLM_BLOCK_SIZE = 16
VLLM_GPU_MEMORY_UTILIZATION = 0.9
VLLM_BIG_GPU_BYTES = 70 * GIB


def vllm_batch_defaults(hw: HardwareSpec) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's API server picks on this hardware."""
    if hw.memory_bytes >= VLLM_BIG_GPU_BYTES and "a100" not in hw.name.lower():
        return 8192, 1024
    return 2048, 256


@dataclass(frozen=True)
class EngineSettings:
    """``[engine]``: vLLM engine arguments (None = vLLM's default for the hardware)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    block_size: int = VLLM_BLOCK_SIZE
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    num_gpu_blocks_override: int | None = None
    step_overhead_s: float | None = None
    #: The vLLM release whose memory accounting sizes the KV cache (pipeline.costmodel.fit; None: its
    #: DEFAULT_VLLM_VERSION), and whose defaults the settings below follow.
    vllm_version: str | None = None
    #: vLLM's --async-scheduling (None: vLLM's default for the release, :func:`async_default`):
    #: a busy engine schedules step k while step k−1 runs, so it sees arrivals one step later.
    async_scheduling: bool | None = None
    #: The API server's front end (pipeline.engine.model.apply_frontend; None: 0, no public
    #: measurement to default from): seconds per request (tokenize, HTTP), and seconds per output
    #: token per concurrent stream (detokenize, one streamed event per token).
    frontend_request_s: float | None = None
    frontend_token_s: float | None = None


#: The first vLLM release that runs the scheduler asynchronously by default: v0.14.0's release notes,
#: "Breaking Changes: Async scheduling is now enabled by default" (vllm-project/vllm#27614), except
#: with pipeline parallelism, with speculative decoding other than EAGLE/MTP (ASYNC_SPEC_METHODS)
#: and on CPU backends (which a fleet does not describe). Before it, --async-scheduling was opt-in
#: (experimental since vllm#19970).
ASYNC_SCHEDULING_SINCE = (0, 14)
#: The speculative methods vLLM keeps asynchronous scheduling on with (the defaults above).
ASYNC_SPEC_METHODS = ("eagle", "eagle3", "mtp")
#: Bounds of the front-end terms: past them a front end is not an API server (they also keep a
#: replay's clock finite; ``nan``/``inf`` are refused by the same check).
MAX_FRONTEND_REQUEST_S = 10.0
MAX_FRONTEND_TOKEN_S = 0.1


def async_default(vllm_version: str, pp: int = 1) -> bool:
    """Whether vLLM ``vllm_version`` schedules asynchronously when --async-scheduling is not given
    (:data:`ASYNC_SCHEDULING_SINCE`; off with pipeline parallelism, as v0.14.0 excluded it)."""
    return parse_vllm_version(vllm_version) >= ASYNC_SCHEDULING_SINCE and pp == 1


#: What drafts (vLLM's speculative_config "method"; "draft_model" is vLLM's default when a draft
#: ``model`` is given).
SPEC_METHODS = ("draft_model", "eagle", "eagle3", "mtp", "ngram")
#: The catalog's published acceptance of common pairs (docs/engine.md, "Speculative decoding").
SPECULATIVE_CATALOG = CATALOG_DIR / "speculative.toml"
#: The context (tokens) at which a draft pass's per-context-token cost is read off its step cost.
DRAFT_SLOPE_TOKENS = 4096


@dataclass(frozen=True)
class SpeculativeSettings:
    """``[speculative]``: speculative decoding as vLLM's ``--speculative-config`` sets it."""

    method: str
    num_speculative_tokens: int
    #: draft_model: the draft's catalog model name
    model: str | None = None
    #: per-token acceptance probability; or the mean tokens a step advances (one of the two, or
    #: neither: the catalog's published figure for the pair, pipeline/catalog/speculative.toml)
    acceptance: float | None = None
    mean_accepted_tokens: float | None = None
    source: str | None = None


def _spec_pairs() -> list[dict[str, Any]]:
    pairs = read_toml(SPECULATIVE_CATALOG).get("pair", [])
    return list(pairs) if isinstance(pairs, list) else []


def published_acceptance(method: str, model: str, k: int) -> tuple[float, str] | None:
    """(mean accepted tokens per step, source) the catalog publishes for ``method`` drafting for
    ``model`` at ``k`` draft tokens (an entry for the model, else one for any target), or None."""
    for want in (model, "*"):
        for pair in _spec_pairs():
            if pair.get("method") != method or pair.get("model") != want:
                continue
            if "acceptance" in pair:
                return tokens_per_verification(float(pair["acceptance"]), k), str(pair["source"])
            ks = list(pair.get("num_speculative_tokens", []))
            if k in ks:
                return float(pair["mean_accepted_tokens"][ks.index(k)]), str(pair["source"])
    return None


def _parse_speculative(raw: dict[str, Any], origin: str) -> SpeculativeSettings:
    where = f"{origin} [speculative]"
    spec = SpeculativeSettings(**raw)
    if spec.method not in SPEC_METHODS:
        raise ConfigError(f"{where}: method {spec.method!r} unknown; choose one of {list(SPEC_METHODS)}")
    k = spec.num_speculative_tokens
    if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ConfigError(f"{where}: num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
    if spec.acceptance is not None and spec.mean_accepted_tokens is not None:
        raise ConfigError(f"{where}: set acceptance or mean_accepted_tokens, not both")
    if spec.acceptance is not None and not 0.0 <= float(spec.acceptance) <= 1.0:
        raise ConfigError(f"{where}: acceptance must be a probability in [0, 1], got {spec.acceptance!r}")
    e = spec.mean_accepted_tokens
    if e is not None and not 1.0 <= float(e) <= k + 1:
        raise ConfigError(
            f"{where}: mean_accepted_tokens must be in [1, num_speculative_tokens + 1 = {k + 1}], got {e!r}"
        )
    if (spec.method == "draft_model") != (spec.model is not None):
        raise ConfigError(
            f"{where}: model (the draft's catalog name) is "
            + ("required by method draft_model" if spec.model is None else f"for draft_model only, not {spec.method}")
        )
    return replace(
        spec,
        acceptance=None if spec.acceptance is None else float(spec.acceptance),
        mean_accepted_tokens=None if e is None else float(e),
    )


@dataclass(frozen=True)
class Calibration:
    """``[calibration]``: efficiency factors of *this serving stack* that override the hardware
    catalog's (which were fitted on vLLM/PyTorch kernels). ``source`` must say what they were
    fitted on, so a calibrated fleet is never mistaken for a prediction on that same data."""

    source: str
    compute_efficiency: float | None = None
    memory_efficiency: float | None = None
    link_efficiency: float | None = None


@dataclass(frozen=True)
class Topology:
    """``[topology]``: the box's GPU link (docs/collectives.md). ``busbw_bytes_per_s`` and
    ``latency_s`` are the fleet's own figures where it gives them (None: topology.toml's path)."""

    link: str
    generation: int
    p2p: str | None = None
    busbw_bytes_per_s: float | None = None
    latency_s: float | None = None

    def path(self, origin: str = "fleet") -> LinkPath:
        """The priced path: topology.toml's for (link, generation, p2p), with the fleet's figures over it."""
        key = (self.link, self.generation, self.p2p or "nvlink")
        base = load_topology().get(key)
        if base is None:  # (parse_topology admits only the table's paths)
            raise ConfigError(f"{origin} [topology]: no path {key} in {topology_file()}")
        pairs = (("busbw_bytes_per_s", self.busbw_bytes_per_s), ("latency_s", self.latency_s))
        own = {k: v for k, v in pairs if v is not None}
        if not own:
            return base
        given = ", ".join(f"{k} = {v:g}" for k, v in own.items())
        return replace(
            base,
            name=f"the fleet's [topology] ({given}) over {base.name}",
            busbw_bytes_per_s=own.get("busbw_bytes_per_s", base.busbw_bytes_per_s),
            latency_s=own.get("latency_s", base.latency_s),
        )


def parse_topology(raw: Mapping[str, Any], where: str) -> Topology:
    """A ``[topology]`` table (types already checked): the link and its generation known to
    topology.toml, ``p2p`` for PCIe only (required there), the figures finite and in the
    catalog's link ranges; one line naming ``where`` and the key otherwise."""
    link, gen = raw["link"], raw["generation"]
    if link not in TOPOLOGY_LINKS:
        raise ConfigError(f"{where}: link {link!r} unknown; choose {' or '.join(TOPOLOGY_LINKS)}")
    if gen not in TOPOLOGY_LINKS[link]:
        allowed = ", ".join(str(g) for g in TOPOLOGY_LINKS[link])
        raise ConfigError(f"{where}: generation {gen!r} is not a {link} generation rooftrace knows ({allowed})")
    p2p = raw.get("p2p")
    if link == "nvlink" and p2p is not None:
        raise ConfigError(
            f"{where}: p2p = {p2p!r} is a PCIe path; NVLink GPUs reach each other over NVLink (leave p2p out)"
        )
    if link == "pcie":
        if p2p is None:
            raise ConfigError(f"{where}: p2p is required for a PCIe link: one of {list(PCIE_P2P_PATHS)}")
        if p2p not in PCIE_P2P_PATHS:
            raise ConfigError(f"{where}: p2p {p2p!r} unknown; choose one of {list(PCIE_P2P_PATHS)}")
    figures: dict[str, float] = {}
    for key, (low, high), unit in (
        ("busbw_bytes_per_s", LINK_BANDWIDTH_RANGE, "B/s"),
        ("latency_s", LINK_LATENCY_RANGE, "s"),
    ):
        if key in raw:
            value = float(raw[key])
            if not low <= value <= high or (key == "busbw_bytes_per_s" and value <= 0):
                raise ConfigError(
                    f"{where}: {key} must be a finite number in [{low:g}, {high:g}] {unit}, got {value!r}"
                )
            figures[key] = value
    return Topology(link=link, generation=gen, p2p=p2p, **figures)


def check_topology(topology: Topology | None, hw: HardwareSpec, where: str) -> None:
    """A stated topology that contradicts the hardware entry: a PCIe path on GPUs joined by
    NVLink, or a peer-to-peer path on GPUs whose entry says they have none."""
    if topology is None:
        return
    if topology.link == "pcie" and hw.link_kind.lower().startswith(("nvlink", "nvswitch")):
        raise ConfigError(
            f"{where}: p2p = {topology.p2p!r} (a PCIe path) for {hw.name}, whose GPUs are joined by "
            f'{hw.link_kind}: state link = "nvlink" or leave [topology] out'
        )
    kind = re.fullmatch(r"(nvlink|pcie)(\d+)\b.*", hw.link_kind.lower())
    if kind is not None and kind.group(1) == topology.link:
        card = int(kind.group(2))
        # NVLink runs at the GPU's own generation; a PCIe card runs at most at its own (a Gen5 card
        # in a Gen4 slot runs Gen4)
        if card < topology.generation or (topology.link == "nvlink" and card != topology.generation):
            raise ConfigError(
                f"{where}: generation = {topology.generation} for {hw.name}, whose GPUs' link is {hw.link_kind}"
            )
    if topology.p2p in ("switch", "root_complex") and not hw.peer_to_peer:
        raise ConfigError(
            f"{where}: p2p = {topology.p2p!r} for {hw.name}, whose entry says its GPUs have no peer-to-peer "
            'access (peer_to_peer = false): use p2p = "none"'
        )


@dataclass(frozen=True)
class FleetConfig:
    name: str
    model: str
    hardware: str
    replicas: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    #: Attention data-parallel ranks per replica (vLLM's data_parallel_size); each rank is
    #: tp × pp GPUs with its own scheduler, KV cache and max_num_seqs.
    dp: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    router: str = "round_robin"
    #: Hierarchical routing (0: one flat router over every replica): replicas are grouped into
    #: pods of this many, a load balancer spreads requests over the pods (round robin, or by
    #: affinity key for the affinity routers) and ``router`` works inside each pod only, as large
    #: deployments route (docs/engine.md, "Hierarchical routing").
    router_pod_size: int = 0
    #: How the load balancer picks a pod: ``round_robin``, or by a salted hash of the request's
    #: session id (``session_affinity``) or first prefix block (``prefix_affinity``); a request
    #: without the key goes round robin. Unset (""): the router's own key for the affinity
    #: routers, else round robin. Hashing to pods with ``least_outstanding`` inside them is
    #: what a gateway that keeps a session's cache on one pod and balances within it does.
    router_pod_balancer: str = ""
    description: str = ""
    #: "auto": the GPU's measured profile when the catalog has one, else the roofline;
    #: "measured" (error without a profile) or "roofline" (the catalog's factors only).
    cost_model: str = "auto"
    #: Which measured set prices an operator several sets cover on this GPU: "" (unset) or "auto"
    #: for the stated precedence (pipeline/catalog/profiles/sources.toml), or a set's name first.
    measured_source: str = ""
    engine: EngineSettings = field(default_factory=EngineSettings)
    #: ``[speculative]``: speculative decoding (None: off)
    speculative: SpeculativeSettings | None = None
    #: ``[kv_offload]``: a lower KV tier beyond the GPU's prefix cache (None: none;
    #: pipeline/classify/offload.py, docs/accounting.md "KV offload tiers")
    kv_offload: OffloadTier | None = None
    calibration: Calibration | None = None
    #: A serving stack's calibration learnt from logs (``calibration_file = "CAL.toml"``, read
    #: when the fleet is loaded; pipeline/costmodel/stackcal.py): scales and a per-step overhead applied on
    #: top of the cost tier. Recorded by value, so a run replays the same without the file.
    stack_calibration: StackCalibration | None = None
    #: ``[slo]``: the latency targets the run is judged against, in ``--slo`` syntax
    #: (pipeline.replay.slo.parse_slo), e.g. "chat" or "ttft_p99=2s,tpot_p99=0.1s".
    slo: str | None = None
    #: ``[topology]``: the box's GPU link, pricing the collectives (None: the hardware entry's link).
    topology: Topology | None = None
    #: ``[energy]``: the electricity inputs of the run's energy figures (usd_per_kwh, pue), as
    #: sorted pairs; None: the defaults (pipeline/economics/energy.py). Recorded with the run.
    energy: tuple[tuple[str, float], ...] | None = None
    #: ``[autoscale]``: the live replicas follow a policy between min and max (None: ``replicas``
    #: all day); ``replicas`` is then ``max_replicas``, the engine's fleet (pipeline/replay/autoscale.py).
    autoscale: AutoscaleSettings | None = None

    def with_replicas(self, replicas: int | None) -> FleetConfig:
        if replicas is None:
            return self
        if replicas < 1:
            raise ConfigError(f"--replicas must be >= 1, got {replicas}")
        if self.autoscale is not None:
            raise ConfigError(
                f"--replicas {replicas}: fleet {self.name!r} autoscales ([autoscale] min_replicas..max_replicas "
                "sets its replicas)"
            )
        if replicas * self.dp > MAX_ENGINES:
            raise ConfigError(f"--replicas {replicas}: {_too_many(replicas, self.dp)}")
        return replace(self, replicas=replicas)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        # unset, or without pods to balance (router_pod_size 0 or past the replicas): kept out, so
        # runs recorded before it read the same and a balancer that changes nothing changes no run id
        if not self.router_pod_balancer or not 0 < self.router_pod_size < self.replicas:
            del out["router_pod_balancer"]
        if not self.measured_source:  # unset: runs recorded before it keep their run ids
            del out["measured_source"]
        if self.autoscale is None:  # unset: runs recorded before it keep their run ids
            del out["autoscale"]
        else:
            out["autoscale"] = self.autoscale.to_dict()
        if self.energy is None:  # unset: runs recorded before it keep their run ids
            del out["energy"]
        else:
            out["energy"] = dict(self.energy)
        if self.stack_calibration is None:  # unset: runs recorded before it keep their run ids
            del out["stack_calibration"]
        else:  # the numbers, not where they were read from
            out["stack_calibration"] = self.stack_calibration.to_dict()
        if self.kv_offload is None:  # none: runs recorded before it keep their run ids
            del out["kv_offload"]
        else:
            out["kv_offload"] = self.kv_offload.to_dict()
        if self.speculative is None:  # off: runs recorded before it keep their run ids
            del out["speculative"]
        else:
            out["speculative"] = {k: v for k, v in out["speculative"].items() if v is not None}
        for key in ("async_scheduling", "frontend_request_s", "frontend_token_s"):
            if out["engine"][key] is None:  # unset: the same (the resolved values are recorded too)
                del out["engine"][key]
        if self.topology is None:  # unset: runs recorded before it keep their run ids
            del out["topology"]
        else:  # the path's numbers, so a recorded run prices the same when topology.toml changes
            path = self.topology.path()
            out["topology"] = {
                **{k: v for k, v in asdict(self.topology).items() if v is not None},
                "busbw_bytes_per_s": path.busbw_bytes_per_s,
                "latency_s": path.latency_s,
            }
        return out

    def pod_balancer(self) -> str:
        """The balancer hierarchical routing uses (``router_pod_balancer`` or its default)."""
        if self.router_pod_balancer:
            return self.router_pod_balancer
        return self.router if self.router in AFFINITY_ROUTERS else "round_robin"

    def affinity_key(self) -> str | None:
        """The affinity key the replay needs on every request (``session_affinity``: the session
        id; ``prefix_affinity``: the first prefix block), for the router or the pods' balancer."""
        if self.router in AFFINITY_ROUTERS:
            return self.router
        if 0 < self.router_pod_size < self.replicas and self.pod_balancer() in AFFINITY_ROUTERS:
            return self.pod_balancer()
        return None


def _check(data: dict[str, Any], origin: str) -> None:
    """The keys and value types of a fleet (FleetFile in pipeline/common/tomlschema.py: its tables
    ``[engine]``, ``[calibration]`` and a run's ``stack_calibration`` too); one line naming
    ``origin``, the table and the key. pydantic is imported here, when a fleet is read."""
    from pipeline.common.tomlschema import FleetFile, check  # lazy: pydantic, loaded only when a file is read

    check(data, FleetFile, origin)


def _parse_slo_table(raw: dict[str, Any] | str, where: str) -> str:
    """``[slo]``: ``preset = "chat"`` and/or targets ``ttft_p99 = 2.0`` (seconds), or ``slo =
    "chat,ttft_p99=1s"``, as the text ``--slo`` takes; checked by parsing it. Errors name the
    file and key, and echo values as the file wrote them (pipeline.replay.slo.slo_table_text)."""
    if isinstance(raw, str):
        parse_slo(raw, where=f"{where.removesuffix(' [slo]')}: slo = {raw!r}")
        return raw
    return slo_table_text(raw, where)


#: A per-step host overhead beyond this is not a serving engine (vLLM's is milliseconds); the bound
#: also keeps a replay's clock finite (``nan``/``inf`` are refused by the same check).
MAX_STEP_OVERHEAD_S = 10.0


#: A fleet's ``name`` names its runs' folders (STORE/runs/<date>-<name>-<digest>/) and reports:
#: letters, digits, '.', '_' and '-', not starting with '.', at most 64 characters.
FLEET_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")


#: Bounds of FLEET.toml ``[energy]``: (low, high, whether low is allowed, unit).
ENERGY_RANGES: dict[str, tuple[float, float, bool, str]] = {
    "usd_per_kwh": (0.0, 10.0, False, "USD per kWh"),
    "pue": (1.0, 5.0, True, "(facility power / IT power)"),
}


def energy_range_error(key: str, value: Any, where: str) -> str | None:
    """The one-line refusal of an ``[energy]`` value out of :data:`ENERGY_RANGES` (None: fine)."""
    lo, hi, closed, unit = ENERGY_RANGES[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (lo <= value <= hi if closed else lo < value <= hi):
        return None
    bounds = f"[{lo:g}, {hi:g}]" if closed else f"({lo:g}, {hi:g}]"
    return f"{where}: {key} must be a number in {bounds} {unit}, got {value!r}"


def _parse_energy(raw: Mapping[str, Any], where: str) -> tuple[tuple[str, float], ...]:
    for key, value in raw.items():
        why = energy_range_error(key, value, where)
        if why:
            raise ConfigError(why)
    return tuple(sorted((k, float(v)) for k, v in raw.items()))


def parse_fleet(
    data: dict[str, Any], origin: str, base_dir: Path | None = None, *, recorded: bool = False
) -> FleetConfig:
    """Validate a parsed FLEET.toml; errors name ``origin`` and the key. ``base_dir``: the folder
    a ``calibration_file`` is relative to (the fleet file's; None: the working directory).
    ``recorded``: the fleet a run's config.json recorded, which holds a calibration by value
    (``stack_calibration``); a fleet file names its calibration file instead."""
    if "stack_calibration" in data and not recorded:  # (said before its keys are checked)
        raise ConfigError(
            f"{origin}: stack_calibration is what a run records; a fleet file names its calibration with "
            'calibration_file = "CAL.toml" (written by rooftrace calibrate --observed)'
        )
    _check(data, origin)
    if not FLEET_NAME_RE.fullmatch(data["name"]):
        raise ConfigError(
            f"{origin}: name {data['name']!r} must be 1-64 letters, digits, '.', '_' or '-', not starting with "
            "'.' (it names the run's folder in the store)"
        )
    engine_raw = dict(data.get("engine", {}))
    for key in ("gpu_memory_utilization", "step_overhead_s", "frontend_request_s", "frontend_token_s"):
        if key in engine_raw:
            engine_raw[key] = float(engine_raw[key])
    if isinstance(engine_raw.get("vllm_version"), str):  # " 0.9" and "0.9" are one release, one run id
        engine_raw["vllm_version"] = engine_raw["vllm_version"].strip()
    engine = EngineSettings(**engine_raw)
    if not 0.0 < engine.gpu_memory_utilization <= 1.0:
        raise ConfigError(
            f"{origin} [engine]: gpu_memory_utilization must be in (0, 1], got {engine.gpu_memory_utilization!r}"
        )
    if engine.block_size not in VLLM_BLOCK_SIZES:
        raise ConfigError(
            f"{origin} [engine]: block_size must be one of vLLM's block sizes {list(VLLM_BLOCK_SIZES)} (tokens), "
            f"got {engine.block_size!r}"
        )
    for key, (least, most, unit, why) in _ENGINE_RANGES.items():
        value = getattr(engine, key)
        if value is not None and not least <= value <= most:
            raise ConfigError(f"{origin} [engine]: {key} must be in {least}..{most:,} {unit}{why}, got {value!r}")
    if engine.step_overhead_s is not None and not 0.0 <= engine.step_overhead_s <= MAX_STEP_OVERHEAD_S:
        raise ConfigError(
            f"{origin} [engine]: step_overhead_s must be a number of seconds in [0, {MAX_STEP_OVERHEAD_S:g}], "
            f"got {engine.step_overhead_s!r}"
        )
    for key, limit in (("frontend_request_s", MAX_FRONTEND_REQUEST_S), ("frontend_token_s", MAX_FRONTEND_TOKEN_S)):
        front: float | None = getattr(engine, key)
        if front is not None and not 0.0 <= front <= limit:
            raise ConfigError(f"{origin} [engine]: {key} must be a number of seconds in [0, {limit:g}], got {front!r}")
    if engine.vllm_version is not None:
        try:
            parse_vllm_version(engine.vllm_version)
        except ConfigError as exc:
            raise ConfigError(f"{origin} [engine]: {exc}") from None
    calibration = None
    if "calibration" in data:
        raw = dict(data["calibration"])
        where = f"{origin} [calibration]"
        if not str(raw.get("source", "")).strip():
            raise ConfigError(f"{where}: source is required (what the factors were fitted on)")
        for key in ("compute_efficiency", "memory_efficiency", "link_efficiency"):
            if key in raw:
                raw[key] = float(raw[key])
                if not MIN_EFFICIENCY <= raw[key] <= 1.0:
                    raise ConfigError(
                        f"{where}: {key} must be in [{MIN_EFFICIENCY:g}, 1] (a share of the hardware's peak), "
                        f"got {raw[key]!r}"
                    )
        calibration = Calibration(**raw)
    slo = _parse_slo_table(data["slo"], f"{origin} [slo]") if "slo" in data else None
    stack = _stack_calibration(data, origin, base_dir)
    if stack is not None and calibration is not None:
        raise ConfigError(
            f"{origin}: [calibration] (roofline factors of another stack) and a calibration learnt from logs "
            "(calibration_file) both set: keep one"
        )
    topology = parse_topology(data["topology"], f"{origin} [topology]") if "topology" in data else None
    energy = _parse_energy(data["energy"], f"{origin} [energy]") if "energy" in data else None
    speculative = _parse_speculative(dict(data["speculative"]), origin) if "speculative" in data else None
    autoscale = None
    if "autoscale" in data:
        autoscale = parse_autoscale(data["autoscale"], f"{origin} [autoscale]", MAX_ENGINES)
        if "replicas" in data and data["replicas"] != autoscale.max_replicas:
            raise ConfigError(
                f"{origin}: replicas ({data['replicas']}) with [autoscale]: leave it out (the engine runs "
                f"max_replicas = {autoscale.max_replicas}) or set it to max_replicas"
            )
        data = {**data, "replicas": autoscale.max_replicas}
    # [cost] prices the fleet (pipeline/economics/stack.py) and changes nothing the replay does
    skip = ("engine", "calibration", "slo", "calibration_file", "stack_calibration", "topology", "cost", "energy",
            "speculative", "kv_offload", "autoscale")  # fmt: skip
    top = {k: v for k, v in data.items() if k not in skip}
    cfg = FleetConfig(
        engine=engine,
        calibration=calibration,
        slo=slo,
        stack_calibration=stack,
        topology=topology,
        energy=energy,
        speculative=speculative,
        autoscale=autoscale,
        **top,
    )
    if autoscale is not None:
        if cfg.router not in AUTOSCALE_ROUTERS:
            raise ConfigError(
                f"{origin} [autoscale]: router {cfg.router!r}: an autoscaled fleet routes over its live replicas "
                f"with {list(AUTOSCALE_ROUTERS)}"
            )
        if cfg.router_pod_size:
            raise ConfigError(f"{origin} [autoscale]: router_pod_size: an autoscaled fleet is one flat router's")
        if cfg.dp > 1:
            raise ConfigError(
                f"{origin} [autoscale]: dp = {cfg.dp}: an autoscaled fleet scales whole replicas of one engine "
                "each (dp = 1); data-parallel ranks are not modelled with it yet"
            )
    if cfg.cost_model not in ("auto", "measured", "prior", "roofline"):
        raise ConfigError(f"{origin}: cost_model {cfg.cost_model!r} unknown; choose auto, measured, prior or roofline")
    if cfg.measured_source:
        from pipeline.costmodel.profile.precedence import known_sources  # lazy: when set only

        if cfg.measured_source not in known_sources():
            raise ConfigError(
                f"{origin}: measured_source {cfg.measured_source!r} unknown; choose one of {known_sources()}"
            )
    if cfg.router not in ROUTERS:
        raise ConfigError(f"{origin}: router {cfg.router!r} unknown; choose one of {list(ROUTERS)}")
    for key in ("replicas", "tp", "pp", "ep", "dp"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{origin}: {key} must be >= 1, got {getattr(cfg, key)!r}")
    if not 0 <= cfg.router_pod_size <= MAX_ENGINES:
        raise ConfigError(
            f"{origin}: router_pod_size must be >= 0 replicas (0: one flat router) and at most {MAX_ENGINES:,}, "
            f"got {cfg.router_pod_size!r}"
        )
    if cfg.router_pod_balancer:
        if cfg.router_pod_balancer not in ("round_robin", *AFFINITY_ROUTERS):
            raise ConfigError(
                f"{origin}: router_pod_balancer {cfg.router_pod_balancer!r} unknown; choose round_robin, "
                "session_affinity or prefix_affinity"
            )
        if cfg.router_pod_size == 0:
            raise ConfigError(f"{origin}: router_pod_balancer needs router_pod_size > 0 (pods for it to balance)")
        other = cfg.router in AFFINITY_ROUTERS and cfg.router_pod_balancer in AFFINITY_ROUTERS
        if other and cfg.router_pod_balancer != cfg.router:
            raise ConfigError(
                f"{origin}: router_pod_balancer {cfg.router_pod_balancer!r} with router {cfg.router!r}: the "
                "balancer and the pods' router must hash the same key (or one of them not hash)"
            )
    for key, check in (("weight_dtype", weight_format), ("kv_dtype", kv_format)):
        try:
            check(getattr(cfg, key))
        except ConfigError as exc:
            raise ConfigError(f"{origin}: {key}: {exc}") from None
    if cfg.dp > MAX_DP:
        raise ConfigError(f"{origin}: dp = {cfg.dp} is more than {MAX_DP} data-parallel ranks in one replica")
    if cfg.replicas * cfg.dp > MAX_ENGINES:
        raise ConfigError(f"{origin}: {_too_many(cfg.replicas, cfg.dp)}")
    if "kv_offload" in data:  # (after tp, pp and dp: a cpu tier must fit the replica's host memory)
        tier = parse_offload(data["kv_offload"], f"{origin} [kv_offload]", cfg.tp * cfg.pp * cfg.dp)
        cfg = replace(cfg, kv_offload=tier)
    if cfg.kv_offload is not None and cfg.autoscale is not None:
        raise ConfigError(
            f"{origin}: [kv_offload] with [autoscale] is not modelled yet (the offload's pre-pass replays the day "
            "on a fixed fleet, before the policy decides the live replicas): keep one"
        )
    return cfg


def _stack_calibration(data: dict[str, Any], origin: str, base_dir: Path | None) -> StackCalibration | None:
    """The fleet's ``calibration_file`` (read now, relative to ``base_dir``) or, in a run's
    recorded fleet, its ``stack_calibration`` values."""
    if "calibration_file" in data and "stack_calibration" in data:
        raise ConfigError(f"{origin}: calibration_file and stack_calibration both set: keep one")
    if "stack_calibration" in data:
        return parse_calibration(dict(data["stack_calibration"]), f"{origin} [stack_calibration]")
    if "calibration_file" not in data:
        return None
    name = data["calibration_file"]
    if not name.strip() or "\x00" in name:
        raise ConfigError(f"{origin}: calibration_file must name a file, got {name!r}")
    path = Path(name).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return load_calibration_file(path, f"{origin}: calibration_file = {name!r}")


def fleet_from_dict(data: Any, origin: str) -> FleetConfig:
    """The fleet :meth:`FleetConfig.to_dict` wrote (as a run's ``config.json`` records it), checked
    as a fleet file is: its unset keys (null, at the top, in ``engine`` and in ``calibration``)
    are read back as unset. Errors name ``origin`` and the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: the recorded fleet must be a table, got {type(data).__name__}")
    raw = {k: v for k, v in data.items() if v is not None}
    for table in ("engine", "calibration", "stack_calibration"):
        if isinstance(raw.get(table), Mapping):
            raw[table] = {k: v for k, v in raw[table].items() if v is not None}
    return parse_fleet(raw, origin, recorded=True)


def _too_many(replicas: int, dp: int) -> str:
    return (
        f"{replicas:,} replicas × dp {dp} = {replicas * dp:,} engines, more than the {MAX_ENGINES:,} "
        "a replay numbers (4-byte replica ids)"
    )


def load_fleet(path: Path | str, *, check_profile: bool = True) -> FleetConfig:
    """Read and validate a FLEET.toml. With ``check_profile`` (the default) a fleet whose
    ``cost_model = "measured"`` names a GPU without a measured profile is refused here, naming the
    file, before any work (:func:`check_cost_model`); ``plan`` reads its base fleet without it,
    as it replaces the hardware and skips the candidates without a profile instead."""
    data = read_toml(path, "fleet file")
    if "pool" in data:
        raise ConfigError(
            f"{path}: a fleet of [[pool]] tables; this command takes a fleet of one pool (`rooftrace replay` "
            "replays a fleet of pools; give this command one pool's fleet file)"
        )
    cfg = parse_fleet(data, str(path), Path(path).parent)
    check_loaded_fleet(cfg, str(path), check_profile)
    return cfg


def check_loaded_fleet(cfg: FleetConfig, origin: str, check_profile: bool = True) -> None:
    """The checks :func:`load_fleet` makes of a fleet read from a file (and of each pool of a
    fleet of pools): its calibration's tier and GPU, and (``check_profile``) its cost model."""
    check_calibration_tier(cfg, origin)
    check_stack_calibration(cfg)
    if check_profile:
        check_cost_model(cfg, origin)


def check_stack_calibration(cfg: FleetConfig, hardware: str | None = None) -> None:
    """Refuse, before any work, a calibration learnt on another GPU (or, where the tier is known
    without building the tables, another cost tier) than the fleet's (``hardware``: the
    candidate GPU a plan puts in its place). The step cost checks the tier again once it is built."""
    cal = cfg.stack_calibration
    if cal is None:
        return

    try:
        hw = load_hardware(hardware or cfg.hardware)
    except ConfigError:
        return  # resolve names that error
    check_applies(cal, hw.name, expected_tier(cfg, hw))


def expected_tier(cfg: FleetConfig, hw: Any) -> str | None:
    """The cost tier that will price ``cfg`` on ``hw`` where it is certain without building the
    tables (a measured profile under auto / measured, the roofline when asked for); None
    otherwise (the prior may fall back to the roofline for a model it cannot price)."""
    if cfg.cost_model == "roofline" or (cfg.cost_model == "auto" and cfg.calibration is not None):
        return "roofline"
    if cfg.cost_model in ("auto", "measured") and profile_for(hw) is not None:
        return "measured"
    return None


def check_calibration_tier(cfg: FleetConfig, origin: str) -> None:
    """A ``[calibration]`` holds roofline efficiency factors (of another serving stack): it prices
    the plain-roofline tier only (docs/validation.md; ``cost_model = "auto"`` switches to that tier
    for it). With ``cost_model = "measured"`` or ``"prior"`` it would be silently ignored, so the
    combination is refused, naming ``origin`` and both keys. Checked on a FLEET.toml only (by
    :func:`load_fleet`): a run's recorded config.json is read back as it was."""
    if cfg.calibration is not None and cfg.cost_model in ("measured", "prior"):
        raise ConfigError(
            f"{origin}: [calibration] prices the roofline tier; cost_model = '{cfg.cost_model}' ignores it: "
            "remove one, or use cost_model = 'roofline' / 'auto'"
        )


def missing_profile(hardware: str) -> tuple[str, list[str]] | None:
    """(the GPU's name, the profiles there are) when the hardware ``hardware`` (a catalog name or
    a TOML path) has no measured profile, else None; None too for hardware the catalog cannot
    load (:func:`resolve` names that error)."""
    try:
        hw = load_hardware(hardware)
    except ConfigError:
        return None
    return None if profile_for(hw) is not None else (hw.name, list_profiles())


def check_cost_model(cfg: FleetConfig, origin: str) -> None:
    """``cost_model = "measured"`` needs the GPU's measured profile (pipeline/catalog/profiles):
    refused, naming ``origin`` and the key, when there is none ("auto" falls back to the roofline)."""
    if cfg.cost_model != "measured":
        return
    missing = missing_profile(cfg.hardware)
    if missing is not None:
        raise ConfigError(f"{origin}: {no_profile_message(missing[0], load_hardware(cfg.hardware))}")


@dataclass(frozen=True)
class ResolvedFleet:
    """A fleet with its catalog entries looked up: what the engine runs."""

    config: FleetConfig
    deployment: Deployment
    memory: MemoryFit
    scheduler: SchedulerConfig
    #: The catalog entries resolved ("hardware", "model" -> their TOML text): a run records them,
    #: so that ``cost`` prices it with the entries it ran on, not with today's catalog.
    entries: tuple[tuple[str, str], ...] = ()

    @functools.cached_property
    def cost_model(self) -> CostModel:
        """The pool's cost model (pipeline.costmodel.model), built on first use and kept: the
        replay, its estimate, plan and ``calibrate --observed`` all price steps with this one."""
        return CostModel.of(self)

    def to_dict(self) -> dict[str, Any]:
        # Field by field: MemoryFit keeps a private model spec that does not serialise.
        mem = {
            f.name: getattr(self.memory, f.name)
            for f in fields(self.memory)
            if not f.name.startswith("_")
            and f.name != "suggestions"
            # (a fleet without a drafter records what it always did: its run id stays)
            and not (f.name.startswith("draft_") and getattr(self.memory, f.name) == 0.0)
        }
        return {
            "fleet": self.config.to_dict(),
            "scheduler": asdict(self.scheduler),
            "memory": mem,
            "step_overhead_s": self.deployment.overhead_s,
            "frontend": {
                "frontend_request_s": self.config.engine.frontend_request_s or 0.0,
                "frontend_token_s": self.config.engine.frontend_token_s or 0.0,
            },
            "gpus_per_replica": self.gpus_per_replica,
            "catalog": dict(self.entries),
        }

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one replica: tp × pp × dp."""
        return self.deployment.gpus * self.config.dp

    def size_text(self) -> str:
        """The fleet's size for people: '1 replica of moe_dp16, 16 h100-sxm GPUs (tp 1 × pp 1 × dp
        16 each)'; the shape is left out for one GPU a replica."""
        c = self.config
        per = self.gpus_per_replica
        gpus = c.replicas * per
        shape = f" (tp {c.tp} × pp {c.pp} × dp {c.dp} each)" if per > 1 else ""
        return (
            f"{c.replicas:,} replica{'' if c.replicas == 1 else 's'} of {c.name}, {gpus:,} {c.hardware} "
            f"GPU{'' if gpus == 1 else 's'}{shape}"
        )

    @property
    def ranks(self) -> int:
        """Engines the replay runs: replicas × dp (each a scheduler with its own KV cache)."""
        return self.config.replicas * self.config.dp

    @property
    def lockstep(self) -> int:
        """Ranks that step together: an MoE model's dp ranks (vLLM synchronises them at every
        MoE layer and idle ranks run dummy batches); dense models' ranks are independent."""
        return self.config.dp if self.deployment.model.is_moe else 1

    def spec(self, mode: str = "open", concurrency: int = 0, ramp_s: float = 0.0, think_s: float = 0.0) -> FleetSpec:
        """What the engine simulates of this fleet (the one builder of a FleetSpec: the replay, the
        memory and time estimate, plan, fit and headroom all take it from here): its engines
        (replicas × dp ranks), scheduler, router and lockstep groups, and how requests arrive
        (``mode`` open, closed or offline; a closed loop's clients, ramp and think time)."""
        return FleetSpec(
            replicas=self.ranks,
            scheduler=self.scheduler,
            router=self.config.router,
            mode=mode,
            concurrency=concurrency,
            lockstep=self.lockstep,
            ramp_s=float(ramp_s),
            think_s=float(think_s),
            frontend_request_s=self.config.engine.frontend_request_s or 0.0,
            frontend_token_s=self.config.engine.frontend_token_s or 0.0,
            speculation=self.speculation,
        )

    @functools.cached_property
    def accepted_tokens(self) -> tuple[float, str] | None:
        """Speculative decoding's mean accepted tokens per step and where the figure comes from
        (the fleet's ``acceptance`` or ``mean_accepted_tokens``, else the catalog's published pair);
        None when speculation is off. Raises ConfigError when nothing gives it."""
        sd = self.config.speculative
        if sd is None:
            return None
        k = sd.num_speculative_tokens
        if sd.mean_accepted_tokens is not None:
            return sd.mean_accepted_tokens, sd.source or "the fleet's mean_accepted_tokens"
        if sd.acceptance is not None:
            return tokens_per_verification(sd.acceptance, k), sd.source or "the fleet's acceptance"
        found = published_acceptance(sd.method, self.config.model, k)
        if found is None:
            raise ConfigError(
                f"[speculative]: no published acceptance for {sd.method} drafting for {self.config.model} at "
                f"num_speculative_tokens = {k} in the catalog (pipeline/catalog/speculative.toml); set acceptance "
                "(per token, 0..1) or mean_accepted_tokens (1..k+1) from your own serving logs"
            )
        return found

    @functools.cached_property
    def speculation(self) -> Speculation | None:
        """What the engines run of ``[speculative]`` (pipeline.engine.model.Speculation): k, the mean
        accepted tokens and the draft's pass cost, tabulated over the batch sizes 0..max_num_seqs from
        the draft's step cost on this GPU (draft_model: the draft model's own cost model; eagle,
        eagle3, mtp: one layer, 1/num_layers of the target's decode step; ngram: free, on the CPU)."""
        sd = self.config.speculative
        if sd is None:
            return None
        accepted = self.accepted_tokens
        assert accepted is not None
        seqs = self.scheduler.max_num_seqs
        pass_s: tuple[float, ...] = ()
        ctx_s = 0.0
        if sd.method != "ngram":
            if sd.method == "draft_model":
                assert sd.model is not None
                cost, share = _draft_fleet(self, sd.model).cost_model.table, 1.0
                pass_s, ctx_s = _draft_pass_table(cost, seqs, share)
            else:  # one decoder layer of the target, sampling through its whole LM head
                cost, share = self.cost_model.table, 1.0 / self.deployment.model.num_layers
                pass_s, ctx_s = _draft_pass_table(cost, seqs, share, whole_lm_head=True)
        return Speculation(
            k=sd.num_speculative_tokens, mean_accepted=accepted[0], draft_pass_s=pass_s, draft_ctx_s=ctx_s,
            method=sd.method,
        )  # fmt: skip


def _draft_memory(cfg: FleetConfig, dep: Deployment) -> DraftMemory | None:
    """What ``[speculative]``'s drafter adds to each GPU of a replica (vLLM loads it beside the
    target and sizes one KV cache for both): a draft model's own weights and KV per token, on the
    target's GPUs, dtypes and tensor parallelism; an EAGLE / EAGLE-3 head or the MTP module as one
    decoder layer of the target (its weights and KV per token over the target's layers: the head's
    input projection and any draft vocabulary are left out); n-gram drafting nothing (on the CPU)."""
    sd = cfg.speculative
    if sd is None or sd.method == "ngram":
        return None
    if sd.method == "draft_model":
        assert sd.model is not None
        try:
            draft = replace(dep, model=load_model(sd.model))
        except ConfigError as exc:
            raise ConfigError(f"[speculative] model: {exc}") from None
        return DraftMemory(
            weights_bytes_per_gpu(draft),
            kv_bytes_per_token(draft.model, dep.kv_dtype, dep.tp),
            f"draft model {sd.model}",
        )
    layers = dep.model.num_layers
    return DraftMemory(
        weights_bytes_per_gpu(dep) / layers,
        kv_bytes_per_token(dep.model, dep.kv_dtype, dep.tp) / layers,
        f"{sd.method} head: one decoder layer of {dep.model.name}",
    )


def _draft_fleet(fleet: ResolvedFleet, model: str) -> ResolvedFleet:
    """The draft model on the target's GPUs (same hardware, dtypes, tp and pp; one rank)."""
    cfg = fleet.config
    eng = replace(cfg.engine, max_model_len=None, num_gpu_blocks_override=None)
    draft = replace(cfg, model=model, speculative=None, engine=eng, replicas=1, dp=1, ep=1, stack_calibration=None)
    try:
        return resolve(draft, "[speculative] model")
    except ConfigError as exc:
        raise ConfigError(f"{exc}") from None


def _draft_pass_table(
    cost: Any, seqs: int, share: float, whole_lm_head: bool = False
) -> tuple[tuple[float, ...], float]:
    """One draft pass's seconds for 0..``seqs`` sequences at one token of context each, and its
    seconds per further context token (read off at DRAFT_SLOPE_TOKENS), both × ``share``. With
    ``whole_lm_head`` the pass samples through a whole LM head of the step cost's model (an EAGLE
    head or an MTP module proposes each token through the target's output head): the logits
    table's seconds (LM head, sampler: stepcost's logits table, indexed by sampled positions) are
    counted in full, the rest of the step × ``share``."""
    b = np.arange(1, seqs + 1, dtype=np.float64)
    zero = np.zeros_like(b)
    t = cost(StepBatch(zero, zero.copy(), zero.copy(), zero.copy(), b, b.copy())).time_s
    one, zero1 = np.ones(2), np.zeros(2)
    ctx = np.array([1.0, 1.0 + DRAFT_SLOPE_TOKENS])
    t1 = cost(StepBatch(zero1, zero1.copy(), zero1.copy(), zero1.copy(), one, ctx)).time_s
    slope = max(0.0, float(t1[1] - t1[0])) / DRAFT_SLOPE_TOKENS
    head = np.zeros_like(t)
    logit = getattr(cost, "logit", None)
    if whole_lm_head and logit is not None and logit.shape[0] > 1:
        # seconds of the logits ops for n sampled positions: the table's compute-, memory-,
        # collective- and floor-bound columns (each op's time is in the one column that bound it)
        n = np.minimum(b.astype(np.int64), logit.shape[0] - 1)
        head = logit[n, :4].sum(axis=1)
    return (0.0, *(float(x) for x in (t - head) * share + head)), slope * share


def resolve(cfg: FleetConfig, origin: str = "fleet", entries: Mapping[str, str] | None = None) -> ResolvedFleet:
    """Look up model and hardware, apply vLLM's defaults, size the KV cache (memory.fit).

    ``entries`` ("hardware", "model" -> TOML text, as a run's ``config.json`` records them) are
    used instead of the catalog's files when given. Every error starts with ``origin`` and names
    the key at fault."""
    try:
        return _resolve(cfg, origin, entries)
    except ConfigError as exc:
        text = str(exc)
        if text.startswith(origin):
            raise
        raise ConfigError(f"{origin}: {text}") from None


def _resolve(cfg: FleetConfig, origin: str, entries: Mapping[str, str] | None) -> ResolvedFleet:
    if entries:
        try:
            hw = parse_hardware(tomllib.loads(entries["hardware"]), f"{origin} [catalog.hardware]")
            model = parse_model(tomllib.loads(entries["model"]), f"{origin} [catalog.model]")
        except (KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{origin}: the recorded catalog entries cannot be read ({exc})") from None
        recorded = dict(entries)
    else:
        try:
            model = load_model(cfg.model)
        except ConfigError as exc:
            raise ConfigError(f"{origin}: model: {exc}") from None
        try:
            hw = load_hardware(cfg.hardware)
        except ConfigError as exc:
            raise ConfigError(f"{origin}: hardware: {exc}") from None
        recorded = {k: _entry_text(k, n) for k, n in (("hardware", cfg.hardware), ("model", cfg.model))}
    if cfg.calibration is not None:
        factors = {k: v for k, v in asdict(cfg.calibration).items() if k != "source" and v is not None}
        hw = replace(hw, **factors)
    link = _link_path(cfg, hw, origin)
    eng = cfg.engine
    try:
        dep = Deployment(
            model=model,
            hardware=hw,
            tp=cfg.tp,
            pp=cfg.pp,
            ep=cfg.ep,
            dp=cfg.dp,
            weight_dtype=cfg.weight_dtype,
            kv_dtype=cfg.kv_dtype,
            step_overhead_s=eng.step_overhead_s,
            link=link,
        )
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}{_tp_hint(cfg.tp, model, hw)}") from None
    default_tokens, default_seqs = vllm_batch_defaults(hw)
    if eng.max_model_len is not None and 0 < model.max_position_embeddings < eng.max_model_len:
        # vLLM refuses a max_model_len past the model's own (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set)
        raise ConfigError(
            f"{origin}: [engine] max_model_len = {eng.max_model_len:,} is longer than {model.name}'s maximum "
            f"context ({model.max_position_embeddings:,} tokens, max_position_embeddings); vLLM refuses it"
        )
    max_len = eng.max_model_len if eng.max_model_len is not None else model.max_position_embeddings
    len_key = f"max_model_len = {max_len:,}" + ("" if eng.max_model_len is not None else f" ({model.name}'s maximum)")
    chunked = eng.enable_chunked_prefill
    if eng.max_num_batched_tokens is not None:
        tokens = eng.max_num_batched_tokens
        if not chunked and tokens < max_len:
            # vLLM's SchedulerConfig refuses it too: without chunking a whole prompt is one step.
            raise ConfigError(
                f"{origin} [engine]: max_num_batched_tokens = {tokens:,} is less than {len_key}; with "
                "enable_chunked_prefill = false it must be >= max_model_len (a whole prompt runs in one step)"
            )
    else:
        # vLLM: without chunked prefill the budget defaults to max_model_len (arg_utils.py).
        tokens = default_tokens if chunked else max(max_len, default_tokens)
        if tokens > MAX_BATCH:
            raise ConfigError(
                f"{origin} [engine]: {len_key} with enable_chunked_prefill = false makes vLLM's default "
                f"max_num_batched_tokens {tokens:,}, more than the {MAX_BATCH:,} allowed; give a shorter "
                "max_model_len or turn chunked prefill on"
            )
    # vLLM caps the default max_num_seqs at max_num_batched_tokens (arg_utils.py).
    seqs = eng.max_num_seqs if eng.max_num_seqs is not None else min(default_seqs, tokens)
    if seqs > tokens:
        given = "" if eng.max_num_batched_tokens is not None else f" (vLLM's default on {hw.name})"
        raise ConfigError(
            f"{origin} [engine]: max_num_seqs = {seqs:,} is more than max_num_batched_tokens = {tokens:,}{given}; "
            "vLLM needs max_num_batched_tokens >= max_num_seqs (a step holds one token of every running sequence)"
        )
    mem = fit(
        dep,
        gpu_memory_utilization=eng.gpu_memory_utilization,
        context=max_len,
        block_size=eng.block_size,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        vllm_version=eng.vllm_version or DEFAULT_VLLM_VERSION,
        fleet_keys=True,  # its suggestions name this file's keys, not rooftrace fit's options
        draft=_draft_memory(cfg, dep),
    )
    override = eng.num_gpu_blocks_override
    blocks = override if override is not None else mem.kv_capacity_blocks
    if blocks < 1 or (override is None and not mem.fits):
        # vLLM refuses to start when one max_model_len sequence does not fit the KV cache.
        raise ConfigError(_no_fit(cfg, origin, dep, mem, default_tokens, default_seqs))
    sched = SchedulerConfig(
        num_gpu_blocks=blocks,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        block_size=eng.block_size,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=eng.enable_prefix_caching,
        async_scheduling=(
            eng.async_scheduling
            if eng.async_scheduling is not None
            else async_default(eng.vllm_version or DEFAULT_VLLM_VERSION, cfg.pp)
            # vLLM turns it off for speculative decoding other than EAGLE and MTP (v0.14.0's notes)
            and (cfg.speculative is None or cfg.speculative.method in ASYNC_SPEC_METHODS)
        ),
    )
    resolved = ResolvedFleet(cfg, dep, mem, sched, tuple(sorted(recorded.items())))
    if cfg.speculative is not None:  # said when the fleet is loaded, not when the replay starts
        _ = resolved.accepted_tokens
        if cfg.speculative.model is not None:
            try:
                load_model(cfg.speculative.model)
            except ConfigError as exc:
                raise ConfigError(f"[speculative] model: {exc}") from None
    return resolved


def _link_path(cfg: FleetConfig, hw: HardwareSpec, origin: str) -> LinkPath | None:
    """The path the fleet's collectives are priced on: the link ``calibrate --measurements``
    fitted on the box (a hardware file with ``[link] fitted_from``), else the fleet's stated
    ``[topology]``, else None (the hardware entry's link, as before either existed)."""
    fitted = fitted_link(hw)
    if fitted is not None and cfg.topology is not None:
        raise ConfigError(
            f"{origin}: [topology] and a hardware file whose link was fitted on an nccl-tests log "
            f"({hw.name}, fitted_from = {hw.link_fitted_from!r}) both state the link: keep one"
        )
    if (fitted is not None or cfg.topology is not None) and cfg.calibration and cfg.calibration.link_efficiency:
        said = "[topology]" if fitted is None else f"the fitted link of {hw.name}"
        raise ConfigError(f"{origin}: [calibration] link_efficiency and {said} both price the collectives: keep one")
    if fitted is not None:
        return fitted
    if cfg.topology is None:
        return None
    check_topology(cfg.topology, hw, f"{origin} [topology]")
    return cfg.topology.path(origin)


def _tp_hint(tp: int, model: ModelSpec, hw: HardwareSpec) -> str:
    """The tensor-parallel sizes ``model`` allows on ``hw``, when ``tp`` is not one of them."""
    allowed = []
    for t in range(1, hw.gpus_per_node + 1):
        try:
            Deployment(model=model, hardware=hw, tp=t)
        except ConfigError:
            continue
        allowed.append(t)
    if tp in allowed or not allowed:
        return ""
    return f" (tp for {model.name} on {hw.name}: one of {allowed})"


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def _no_fit(
    cfg: FleetConfig,
    origin: str,
    dep: Deployment,
    mem: MemoryFit,
    default_tokens: int,
    default_seqs: int,
) -> str:
    """Why one max_model_len sequence does not fit, term by term, naming the key to change: the
    batch settings when vLLM's defaults for the GPU would fit."""
    eng = cfg.engine
    where = f"{cfg.model} on {cfg.tp * cfg.pp}x {cfg.hardware}"
    need = _gib(mem.sequence_kv_bytes(mem.context))
    if eng.max_num_batched_tokens is not None or eng.max_num_seqs is not None:
        tokens = default_tokens if eng.enable_chunked_prefill else max(mem.context, default_tokens)
        seqs = min(default_seqs, tokens)
        try:
            usual: MemoryFit | None = fit(
                dep,
                gpu_memory_utilization=mem.gpu_memory_utilization,
                context=mem.context,
                block_size=mem.block_size,
                max_num_seqs=seqs,
                max_num_batched_tokens=tokens,
                vllm_version=mem.vllm_version,
            )
        except ConfigError:
            usual = None
        if usual is not None and usual.fits:
            keys = " and ".join(
                f"{k} = {getattr(eng, k):,}" for k in ("max_num_batched_tokens", "max_num_seqs") if getattr(eng, k)
            )
            verb = "are" if " and " in keys else "is"
            return (
                f"{origin} [engine]: {keys} {verb} too large for {where}: vLLM's profile run of that batch takes "
                f"{_gib(mem.activation_bytes_per_gpu)} of activation per GPU, leaving "
                f"{_gib(mem.kv_pool_bytes_per_gpu)} of the {_gib(mem.budget_bytes_per_gpu)} budget for the KV cache, "
                f"and one {mem.context}-token sequence needs {need}; vLLM's defaults for {cfg.hardware} "
                f"(max_num_batched_tokens = {tokens:,}, max_num_seqs = {seqs:,}) fit"
            )
    length = "max_model_len" if eng.max_model_len is not None else "max_model_len unset: the model's maximum"
    tips = "; ".join(mem.suggestions) or "use more GPUs per replica or a smaller model"
    return (
        f"{origin}: {where} cannot hold one {mem.context}-token sequence ({length}) in its KV cache: weights "
        f"{_gib(mem.weights_bytes_per_gpu)} + activation {_gib(mem.activation_bytes_per_gpu)} + reserve "
        f"{_gib(mem.reserve_bytes_per_gpu)} of the {_gib(mem.budget_bytes_per_gpu)} budget per GPU "
        f"(gpu_memory_utilization = {mem.gpu_memory_utilization:g}) leave {_gib(mem.kv_pool_bytes_per_gpu)}, "
        f"one sequence needs {need} ({tips})"
    )


def _entry_text(kind: str, name: str) -> str:
    try:
        return entry_path(kind, name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):  # it was just parsed; a race or a vanished file
        return ""


def unused_pod_options(
    cfg: FleetConfig,
    pods: int,
    executor: str,
    ray_address: str | None,
    engine_pods: int,
    closed: bool = False,
) -> list[str]:
    """Why ``--executor`` or ``--ray-address`` did nothing in a replay of ``cfg`` that ran in
    ``engine_pods`` pods (the run's summary): one line each, for stderr; empty when both were used
    or not given. The executor runs pods: a fleet replayed as one engine (a router whose routes
    depend on the run, a closed loop, or no --pods asked and small enough for one engine) uses
    none (``thread``, the default, says nothing: it runs pods where there are some); the Ray
    address is for ``--executor ray`` only."""
    notes = []
    if ray_address is not None and executor != "ray":
        where = {
            "local": "runs the pods one after another here",
            "thread": "runs the pods in threads here",
        }.get(executor, "runs the pods in local processes")
        notes.append(f"--ray-address not used: --executor {executor} {where} (the address is for --executor ray)")
    hierarchical = 0 < cfg.router_pod_size < cfg.replicas
    if executor not in ("local", "thread") and engine_pods <= 1 and not hierarchical:
        if closed:
            why = "the closed loop of --concurrency cannot be cut into pods"
        elif cfg.router not in ("round_robin", *AFFINITY_ROUTERS):
            why = f"router {cfg.router} cannot be cut into pods"
        elif pods <= 1:
            why = "no --pods N asked, and it fits one engine"
        else:
            why = "only one pod held requests"
        notes.append(f"--executor {executor} not used: the fleet replayed as one engine ({why})")
    return notes
