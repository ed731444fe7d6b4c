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
    router = "round_robin"          # least_outstanding | session_affinity | prefix_affinity
    router_pod_size = 0             # > 0: a load balancer over pods of this many replicas
    cost_model = "auto"             # measured profile when the GPU has one | measured | roofline

    [engine]
    max_num_seqs = 256
    max_num_batched_tokens = 8192
    enable_chunked_prefill = true
    block_size = 16
    gpu_memory_utilization = 0.9
    enable_prefix_caching = true

Unknown or mistyped keys are errors that name the file and key. The config objects are frozen;
:func:`resolve` turns one into the engine's SchedulerConfig and the cost model.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pipeline.catalog import HardwareSpec, entry_path, load_hardware, load_model, parse_hardware, parse_model
from pipeline.engine.model import ROUTERS, SchedulerConfig
from pipeline.errors import ConfigError
from pipeline.fit import DEFAULT_VLLM_VERSION, MemoryFit, fit, parse_vllm_version
from pipeline.roofline import MAX_DP, Deployment
from pipeline.tomlfile import read_toml

GIB = 1 << 30
#: Most engines (replicas × dp) a fleet may have: the replay numbers them in 4 bytes.
MAX_ENGINES = 2**31 - 1

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
    #: The vLLM release whose memory accounting sizes the KV cache (pipeline.fit; None: its
    #: DEFAULT_VLLM_VERSION).
    vllm_version: str | None = None


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
    description: str = ""
    #: "auto": the GPU's measured profile when the catalog has one, else the roofline;
    #: "measured" (error without a profile) or "roofline" (the catalog's factors only).
    cost_model: str = "auto"
    engine: EngineSettings = field(default_factory=EngineSettings)
    calibration: Calibration | None = None
    #: ``[slo]``: the latency targets the run is judged against, in ``--slo`` syntax
    #: (pipeline.slo.parse_slo), e.g. "chat" or "ttft_p99=2s,tpot_p99=0.1s".
    slo: str | None = None

    def with_replicas(self, replicas: int | None) -> FleetConfig:
        if replicas is None:
            return self
        if replicas < 1:
            raise ConfigError(f"--replicas must be >= 1, got {replicas}")
        if replicas * self.dp > MAX_ENGINES:
            raise ConfigError(f"--replicas {replicas}: {_too_many(replicas, self.dp)}")
        return replace(self, replicas=replicas)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_TOP_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "model": (str,),
    "hardware": (str,),
    "replicas": (int,),
    "tp": (int,),
    "pp": (int,),
    "ep": (int,),
    "dp": (int,),
    "weight_dtype": (str,),
    "kv_dtype": (str,),
    "router": (str,),
    "router_pod_size": (int,),
    "description": (str,),
    "cost_model": (str,),
    "engine": (dict,),
    "calibration": (dict,),
    "slo": (dict, str),
}
_CALIBRATION_TYPES: dict[str, tuple[type, ...]] = {
    "source": (str,),
    "compute_efficiency": (float, int),
    "memory_efficiency": (float, int),
    "link_efficiency": (float, int),
}
_TOP_REQUIRED = {"name", "model", "hardware"}
_ENGINE_TYPES: dict[str, tuple[type, ...]] = {
    "max_num_seqs": (int,),
    "max_num_batched_tokens": (int,),
    "enable_chunked_prefill": (bool,),
    "block_size": (int,),
    "gpu_memory_utilization": (float, int),
    "enable_prefix_caching": (bool,),
    "max_model_len": (int,),
    "num_gpu_blocks_override": (int,),
    "step_overhead_s": (float, int),
    "vllm_version": (str,),
}


def _check(table: dict[str, Any], types: dict[str, tuple[type, ...]], where: str) -> None:
    unknown = sorted(set(table) - set(types))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(types)}")
    for key, value in table.items():
        allowed = types[key]
        # bool is an int in Python: only accept it where a bool is asked for.
        if isinstance(value, bool) and bool not in allowed:
            raise ConfigError(f"{where}: {key} must be {allowed[0].__name__}, got {value!r}")
        if not isinstance(value, allowed):
            raise ConfigError(f"{where}: {key} must be {allowed[0].__name__}, got {value!r}")


def _parse_slo_table(raw: dict[str, Any] | str, where: str) -> str:
    """``[slo]``: ``preset = "chat"`` and/or targets ``ttft_p99 = 2.0`` (seconds), or ``slo =
    "chat,ttft_p99=1s"``, as the text ``--slo`` takes; checked by parsing it."""
    from pipeline.slo import parse_slo

    if isinstance(raw, str):
        try:
            parse_slo(raw)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return raw
    parts: list[str] = []
    for key, value in raw.items():
        if key == "preset":
            if not isinstance(value, str):
                raise ConfigError(f"{where}: preset must be a string, got {value!r}")
            parts.insert(0, value)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: {key} must be a number of seconds, got {value!r}")
        else:
            parts.append(f"{key}={float(value)!r}s")
    if not parts:
        raise ConfigError(f"{where}: give a preset or targets such as ttft_p99 = 2.0")
    text = ",".join(parts)
    try:
        parse_slo(text)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return text


#: A per-step host overhead beyond this is not a serving engine (vLLM's is milliseconds); the bound
#: also keeps a replay's clock finite (``nan``/``inf`` are refused by the same check).
MAX_STEP_OVERHEAD_S = 10.0

#: A fleet's ``name`` names its runs' folders (STORE/runs/<date>-<name>-<digest>/) and reports:
#: letters, digits, '.', '_' and '-', not starting with '.', at most 64 characters.
FLEET_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")


def parse_fleet(data: dict[str, Any], origin: str) -> FleetConfig:
    """Validate a parsed FLEET.toml; errors name ``origin`` and the key."""
    _check(data, _TOP_TYPES, origin)
    missing = sorted(_TOP_REQUIRED - set(data))
    if missing:
        raise ConfigError(f"{origin}: missing key(s) {missing}")
    if not FLEET_NAME_RE.fullmatch(data["name"]):
        raise ConfigError(
            f"{origin}: name {data['name']!r} must be 1-64 letters, digits, '.', '_' or '-', not starting with "
            "'.' (it names the run's folder in the store)"
        )
    engine_raw = dict(data.get("engine", {}))
    _check(engine_raw, _ENGINE_TYPES, f"{origin} [engine]")
    for key in ("gpu_memory_utilization", "step_overhead_s"):
        if key in engine_raw:
            engine_raw[key] = float(engine_raw[key])
    engine = EngineSettings(**engine_raw)
    if not 0.0 < engine.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"{origin} [engine]: gpu_memory_utilization must be in (0, 1]")
    if engine.step_overhead_s is not None and not 0.0 <= engine.step_overhead_s <= MAX_STEP_OVERHEAD_S:
        raise ConfigError(
            f"{origin} [engine]: step_overhead_s must be a number of seconds in [0, {MAX_STEP_OVERHEAD_S:g}], "
            f"got {engine.step_overhead_s!r}"
        )
    if engine.vllm_version is not None:
        try:
            parse_vllm_version(engine.vllm_version)
        except ConfigError as exc:
            raise ConfigError(f"{origin} [engine]: {exc}") from None
    calibration = None
    if "calibration" in data:
        raw = dict(data["calibration"])
        where = f"{origin} [calibration]"
        _check(raw, _CALIBRATION_TYPES, where)
        if not str(raw.get("source", "")).strip():
            raise ConfigError(f"{where}: source is required (what the factors were fitted on)")
        for key in ("compute_efficiency", "memory_efficiency", "link_efficiency"):
            if key in raw:
                raw[key] = float(raw[key])
                if not 0.0 < raw[key] <= 1.0:
                    raise ConfigError(f"{where}: {key} must be in (0, 1]")
        calibration = Calibration(**raw)
    slo = _parse_slo_table(data["slo"], f"{origin} [slo]") if "slo" in data else None
    top = {k: v for k, v in data.items() if k not in ("engine", "calibration", "slo")}
    cfg = FleetConfig(engine=engine, calibration=calibration, slo=slo, **top)
    if cfg.cost_model not in ("auto", "measured", "roofline"):
        raise ConfigError(f"{origin}: cost_model {cfg.cost_model!r} unknown; choose auto, measured or roofline")
    if cfg.router not in ROUTERS:
        raise ConfigError(f"{origin}: router {cfg.router!r} unknown; choose one of {list(ROUTERS)}")
    for key in ("replicas", "tp", "pp", "ep", "dp"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{origin}: {key} must be >= 1")
    if cfg.router_pod_size < 0:
        raise ConfigError(f"{origin}: router_pod_size must be >= 0 replicas (0: one flat router)")
    if cfg.dp > MAX_DP:
        raise ConfigError(f"{origin}: dp = {cfg.dp} is more than {MAX_DP} data-parallel ranks in one replica")
    if cfg.replicas * cfg.dp > MAX_ENGINES:
        raise ConfigError(f"{origin}: {_too_many(cfg.replicas, cfg.dp)}")
    return cfg


def _too_many(replicas: int, dp: int) -> str:
    return (
        f"{replicas:,} replicas × dp {dp} = {replicas * dp:,} engines, more than the {MAX_ENGINES:,} "
        "a replay numbers (4-byte replica ids)"
    )


def load_fleet(path: Path | str) -> FleetConfig:
    return parse_fleet(read_toml(path, "fleet file"), str(path))


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

    def to_dict(self) -> dict[str, Any]:
        # Field by field: MemoryFit keeps a private model spec that does not serialise.
        mem = {
            f.name: getattr(self.memory, f.name)
            for f in fields(self.memory)
            if not f.name.startswith("_") and f.name != "suggestions"
        }
        return {
            "fleet": self.config.to_dict(),
            "scheduler": asdict(self.scheduler),
            "memory": mem,
            "step_overhead_s": self.deployment.overhead_s,
            "gpus_per_replica": self.deployment.gpus * self.config.dp,
            "catalog": dict(self.entries),
        }

    @property
    def ranks(self) -> int:
        """Engines the replay runs: replicas × dp (each a scheduler with its own KV cache)."""
        return self.config.replicas * self.config.dp

    @property
    def lockstep(self) -> int:
        """Ranks that step together: an MoE model's dp ranks (vLLM synchronises them at every
        MoE layer and idle ranks run dummy batches); dense models' ranks are independent."""
        return self.config.dp if self.deployment.model.is_moe else 1


def resolve(cfg: FleetConfig, origin: str = "fleet", entries: Mapping[str, str] | None = None) -> ResolvedFleet:
    """Look up model and hardware, apply vLLM's defaults, size the KV cache (memory.fit).

    ``entries`` ("hardware", "model" -> TOML text, as a run's ``config.json`` records them) are
    used instead of the catalog's files when given."""
    if entries:
        try:
            hw = parse_hardware(tomllib.loads(entries["hardware"]), f"{origin} [catalog.hardware]")
            model = parse_model(tomllib.loads(entries["model"]), f"{origin} [catalog.model]")
        except (KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{origin}: the recorded catalog entries cannot be read ({exc})") from None
        recorded = dict(entries)
    else:
        model = load_model(cfg.model)
        hw = load_hardware(cfg.hardware)
        recorded = {k: _entry_text(k, n) for k, n in (("hardware", cfg.hardware), ("model", cfg.model))}
    if cfg.calibration is not None:
        factors = {k: v for k, v in asdict(cfg.calibration).items() if k != "source" and v is not None}
        hw = replace(hw, **factors)
    eng = cfg.engine
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
    )
    default_tokens, default_seqs = vllm_batch_defaults(hw)
    max_len = eng.max_model_len if eng.max_model_len is not None else model.max_position_embeddings
    chunked = eng.enable_chunked_prefill
    if eng.max_num_batched_tokens is not None:
        tokens = eng.max_num_batched_tokens
    else:
        # vLLM: without chunked prefill the budget defaults to max_model_len (arg_utils.py).
        tokens = default_tokens if chunked else max(max_len, default_tokens)
    # vLLM caps the default max_num_seqs at max_num_batched_tokens (arg_utils.py).
    seqs = eng.max_num_seqs if eng.max_num_seqs is not None else min(default_seqs, tokens)
    mem = fit(
        dep,
        gpu_memory_utilization=eng.gpu_memory_utilization,
        context=max_len,
        block_size=eng.block_size,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        vllm_version=eng.vllm_version or DEFAULT_VLLM_VERSION,
    )
    override = eng.num_gpu_blocks_override
    blocks = override if override is not None else mem.kv_capacity_blocks
    if blocks < 1 or (override is None and not mem.fits):
        # vLLM refuses to start when one max_model_len sequence does not fit the KV cache.
        tips = "; ".join(mem.suggestions) or "use more GPUs per replica or a smaller model"
        raise ConfigError(
            f"{origin}: {cfg.model} on {cfg.tp * cfg.pp}x {cfg.hardware} cannot hold one "
            f"{max_len}-token sequence in its KV cache ({tips})"
        )
    sched = SchedulerConfig(
        num_gpu_blocks=blocks,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        block_size=eng.block_size,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=eng.enable_prefix_caching,
    )
    return ResolvedFleet(cfg, dep, mem, sched, tuple(sorted(recorded.items())))


def _entry_text(kind: str, name: str) -> str:
    try:
        return entry_path(kind, name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):  # it was just parsed; a race or a vanished file
        return ""
