"""Hardware and model catalog: TOML data files, loaded into frozen, validated dataclasses.

Layout (docs/architecture.md, Layout and House rules)::

    pipeline/catalog/hardware/<name>.toml   one accelerator (per GPU), every value with a source
    pipeline/catalog/models/<name>.toml     one model: a subset of its Hugging Face config.json
    pipeline/catalog/dtypes.toml            weight / KV-cache storage formats (bytes, scales)

Names are file stems, lower-case (``h100-sxm``, ``llama-3.1-8b``). Unknown and missing keys are
errors that name the file and key. Nothing is read at import time.

A model file keeps the Hugging Face ``config.json`` keys verbatim under ``[config]`` so that an
entry can be checked against its published config line by line; :func:`model_from_hf_config`
normalises those keys (which differ between Llama, Mixtral, Qwen3-MoE, DeepSeek-V3 and gpt-oss)
into one :class:`ModelSpec`. ``rooftrace catalog import-hf`` uses the same function.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.schemas import atomic_write_bytes, os_write_reason
from pipeline.common.tomlfile import read_config_bytes, read_toml

CATALOG_DIR = Path(__file__).resolve().parent

#: What a catalog name (an entry's file stem) may be: 1-64 letters, digits, '.', '_' or '-', not
#: starting with '.' (the rule of fleet names, pipeline/replay/fleet.py): one path component, so a name
#: never reaches outside the catalog's folders.
CATALOG_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")
CATALOG_NAME_RULE = "1-64 letters, digits, '.', '_' or '-', not starting with '.'"


def hardware_dir() -> Path:
    return CATALOG_DIR / "hardware"


def models_dir() -> Path:
    return CATALOG_DIR / "models"


# --------------------------------------------------------------------------------------------
# small validation helpers


def _check_keys(table: Mapping[str, Any], schema: str, where: str) -> None:
    """The keys and value types of an entry, as ``schema`` (a model in pipeline/common/tomlschema.py)
    declares them; one line naming ``where``, the table and the key. The checks of values
    (ranges, names, dates) follow in the parsers."""
    from pipeline.common import tomlschema  # lazy: pydantic, loaded only when a file is read

    tomlschema.check(table, getattr(tomlschema, schema), where)


def _num(table: Mapping[str, Any], key: str, where: str, *, positive: bool = True) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    if isinstance(value, int) and abs(value) > 10**300:  # (past a float: math.isfinite raises)
        raise ConfigError(f"{where}: {key} is an integer too large to use ({len(str(abs(value)))} digits)")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ConfigError(f"{where}: {key} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _int(table: Mapping[str, Any], key: str, where: str, *, minimum: int = 1) -> int:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where}: {key} must be >= {minimum}, got {value}")
    return value


#: Most GPUs one node (one NVLink / NVSwitch domain) may hold: NVL72 racks are 72, a hardware
#: file past this is a slip (the fleet checks search tensor-parallel sizes up to it).
MAX_GPUS_PER_NODE = 1024


def _gpus_per_node(link: Mapping[str, Any], where: str) -> int:
    value = _int(link, "gpus_per_node", where)
    if value > MAX_GPUS_PER_NODE:
        raise ConfigError(f"{where}: gpus_per_node must be at most {MAX_GPUS_PER_NODE:,} (one node), got {value:,}")
    return value


def _str(table: Mapping[str, Any], key: str, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# storage formats


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bits: int
    group_size: int
    scale_bytes: float
    compute: str
    source: str

    @property
    def bytes_per_param(self) -> float:
        """Storage bytes per weight, including per-group scales."""
        extra = self.scale_bytes / self.group_size if self.group_size else 0.0
        return self.bits / 8.0 + extra


@dataclass(frozen=True)
class KVFormat:
    name: str
    bytes: float
    source: str


@dataclass(frozen=True)
class Formats:
    weight: Mapping[str, WeightFormat]
    kv: Mapping[str, KVFormat]


@cache
def load_formats() -> Formats:
    path = CATALOG_DIR / "dtypes.toml"
    data = read_toml(path, "catalog entry")
    _check_keys(data, "DtypesFile", str(path))
    weights: dict[str, WeightFormat] = {}
    for name, raw in data["weight"].items():
        where = f"{path} [weight.{name}]"
        weights[name] = WeightFormat(
            name=name,
            bits=_int(raw, "bits", where),
            group_size=_int(raw, "group_size", where, minimum=0),
            scale_bytes=_num(raw, "scale_bytes", where, positive=False),
            compute=_str(raw, "compute", where),
            source=_str(raw, "source", where),
        )
    kvs: dict[str, KVFormat] = {}
    for name, raw in data["kv"].items():
        where = f"{path} [kv.{name}]"
        kvs[name] = KVFormat(name=name, bytes=_num(raw, "bytes", where), source=_str(raw, "source", where))
    return Formats(weight=MappingProxyType(weights), kv=MappingProxyType(kvs))


def weight_format(name: str) -> WeightFormat:
    formats = load_formats().weight
    if name not in formats:
        raise ConfigError(f"unknown weight dtype {name!r}; known: {sorted(formats)}")
    return formats[name]


def kv_format(name: str) -> KVFormat:
    formats = load_formats().kv
    if name not in formats:
        raise ConfigError(f"unknown KV-cache dtype {name!r}; known: {sorted(formats)}")
    return formats[name]


# --------------------------------------------------------------------------------------------
# hardware


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator, per GPU. SI units: bytes, bytes/s, FLOP/s, seconds, USD.

    peak_flops_per_s holds *dense* tensor-core peaks by dtype (not the 2:4-sparse datasheet
    figure). link_* describe the intra-node GPU-GPU link per direction per GPU. The efficiency
    factors scale the peaks to what kernels reach: compute for matmuls and attention, memory for
    weight/KV streaming, elementwise for the SiLU×mul activation kernel's share of HBM bandwidth
    (norm, rotary and residual-add kernels scale it by ``roofline.ELEMENTWISE_KERNEL_SCALE``),
    link for collectives. min_kernel_s is the shortest time any
    kernel takes (launch and ramp-up: a tiny GEMM or norm never finishes faster); calibrated_on
    says which data set them.
    """

    name: str
    display_name: str
    vendor: str
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    link_kind: str
    link_bandwidth_bytes_per_s: float
    link_latency_s: float
    gpus_per_node: int
    compute_efficiency: float
    memory_efficiency: float
    elementwise_efficiency: float
    link_efficiency: float
    min_kernel_s: float
    step_overhead_s: float
    calibrated_on: str
    price_usd_per_gpu_hour: float
    price_date: str
    sources: Mapping[str, str] = field(hash=False)
    path: str = field(default="", compare=False)
    #: Device memory as CUDA reports it (what vLLM's gpu_memory_utilization multiplies), where a
    #: log of this GPU showed it; 0 = unknown (pipeline.costmodel.fit then takes a fraction of memory_bytes).
    cuda_memory_bytes: float = 0.0
    #: The GPU's die (``GH100``, ``GA100``, ...): GPUs on one die run the same kernels, so a
    #: profiled one's measured tables, scaled, price an unprofiled one (pipeline/costmodel/profile/prior.py,
    #: die_donor). "" = not stated (no donor).
    die: str = ""
    #: Whether the GPUs of one node reach each other's memory directly (PCIe or the link's
    #: peer-to-peer). False (GeForce RTX 40-series: NVIDIA disabled P2P on these boards): vLLM
    #: cannot use its custom all-reduce and falls back to NCCL (pipeline/costmodel/profile/cost.py), and no
    #: other GPU lends its measured collectives to it or borrows this one's (profile/prior.py).
    peer_to_peer: bool = True
    #: Memory this GPU model holds beyond the data-centre constants of the memory fit, per GPU
    #: (pipeline/costmodel/fit.py, non_torch_bytes_per_gpu); 0 for the data-centre GPUs those constants
    #: come from.
    extra_reserved_bytes: float = 0.0
    #: Whether ``cost_model = "auto"`` prices this GPU with the size-aware roofline prior when
    #: the catalog has no measured profile of it (pipeline/costmodel/profile/cost.py, step_cost_for). The
    #: prior is fitted on vLLM's CUDA kernels measured on NVIDIA GPUs; a GPU running other
    #: kernels sets false and keeps the plain roofline unless the fleet asks for the prior.
    prior_applies: bool = True
    #: The catalog GPU whose link ``rooftrace calibrate --measurements`` fitted this entry's link
    #: factors for, on an nccl-tests log of the user's box (``[link] fitted_from``): the device is
    #: that GPU (its measured profile prices it) and the box's fitted link prices every tier's
    #: collectives. "" = the link figures are the catalog's.
    link_fitted_from: str = ""

    def peak_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for matmuls in ``dtype``; bf16 when the GPU lacks that format."""
        if dtype in self.peak_flops_per_s:
            return self.peak_flops_per_s[dtype]
        return self.peak_flops_per_s["bf16"]

    def compute_dtype_for(self, dtype: str) -> str:
        return dtype if dtype in self.peak_flops_per_s else "bf16"


#: Every numeric field (or table of them) must have an entry in [sources].
_HW_SOURCED = {
    "memory_bytes",
    "memory_bandwidth_bytes_per_s",
    "peak_flops_per_s",
    "link",
    "efficiency",
    "price",
}
#: Optional keys that, when an entry sets them, need a source too.
_HW_OPTIONAL_SOURCED = ("cuda_memory_bytes", "die", "peer_to_peer", "extra_reserved_bytes", "prior_applies")
#: Smallest efficiency (a share of a peak) a catalog entry or a fleet's [calibration] may set:
#: below it a step would take years and the replay's figures lose meaning.
MIN_EFFICIENCY = 1e-3
#: Plausible ranges of a hardware entry's numbers, far wider than any accelerator made or
#: announced (2026: 24-288 GiB of HBM/GDDR, 3e11-8e12 B/s of it, dense peaks 7e13 bf16 to 1e16
#: fp4, links 3e10-9e11 B/s at 2e-5-5e-5 s). Outside them a value is a typo or a unit slip
#: (GB for bytes): near zero it makes every step take forever (a division by ~0), huge it prints
#: 300-digit capacities.
MEMORY_BYTES_RANGE = (2**30, 16 * 2**40)  # 1 GiB .. 16 TiB, a whole number
MEMORY_BANDWIDTH_RANGE = (1e9, 1e15)  # B/s
PEAK_FLOPS_RANGE = (1e11, 1e18)  # FLOP/s, each dtype
LINK_BANDWIDTH_RANGE = (1e8, 1e14)  # B/s per direction per GPU
LINK_LATENCY_RANGE = (0.0, 1e-2)  # s
#: [efficiency] floors: the shortest kernel is microseconds (a 1 s floor is already absurd) and
#: the per-step engine overhead milliseconds (FLEET.toml's [engine] step_overhead_s is bounded
#: to the same 10 s); past them a replay step never ends (1e300 s overflows the step clock).
MIN_KERNEL_RANGE = (0.0, 1.0)  # s
STEP_OVERHEAD_RANGE = (0.0, 10.0)  # s
#: $/GPU-hour, as --gpu-price and the price files bound it: 0 is "no price", huge a typo.
GPU_PRICE_RANGE = (0.0, 1e6)  # USD, exclusive of 0


def _ranged(table: Mapping[str, Any], key: str, where: str, bounds: tuple[float, float], unit: str) -> float:
    """``table[key]``, a finite number within ``bounds`` (inclusive), else one line naming the range."""
    low, high = bounds
    value = _num(table, key, where, positive=low > 0)
    if not low <= value <= high:
        raise ConfigError(f"{where}: {key} must be in [{low:g}, {high:g}] {unit}, got {value:g}")
    return value


def _memory_bytes(table: Mapping[str, Any], key: str, where: str) -> float:
    """A whole number of bytes in :data:`MEMORY_BYTES_RANGE` (an integer, or a float such as 8e10
    that is one)."""
    value = table[key]
    if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
        raise ConfigError(f"{where}: {key} must be a whole number of bytes, got {value!r}")
    low, high = MEMORY_BYTES_RANGE
    got = _num(table, key, where)
    if not low <= got <= high:
        raise ConfigError(f"{where}: {key} must be in [1 GiB, 16 TiB] ({low:,}..{high:,} bytes), got {got:.4g}")
    return float(int(got))


def _date_text(table: Mapping[str, Any], key: str, where: str) -> str:
    """A date given as a string, or as a native TOML date (``2026-11-30``, unquoted): ISO text."""
    value = table[key]
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, _dt.datetime | _dt.time):
        raise ConfigError(f"{where}: {key} must be a date (YYYY-MM-DD), got the time {value.isoformat()}")
    return _str(table, key, where)


def _price_date(table: Mapping[str, Any], key: str, where: str) -> str:
    """A real calendar date, ``YYYY-MM`` or ``YYYY-MM-DD`` (month 1-12, a day the month has)."""
    date = _date_text(table, key, where)
    match = re.fullmatch(r"(\d{4})-(\d{2})(?:-(\d{2}))?", date)
    if match is None:
        raise ConfigError(f"{where}: {key} must be YYYY-MM or YYYY-MM-DD, got {date[:40]!r}")
    year, month, day = int(match[1]), int(match[2]), int(match[3] or 1)
    try:
        _dt.date(year, month, day)
    except ValueError:
        raise ConfigError(
            f"{where}: {key} must be a real calendar date (YYYY-MM or YYYY-MM-DD), got {date!r}"
        ) from None
    return date


def parse_hardware(data: Mapping[str, Any], origin: str) -> HardwareSpec:
    _check_keys(data, "HardwareEntry", origin)
    peaks = data["peak_flops_per_s"]
    peak = {k: _ranged(peaks, k, f"{origin} [peak_flops_per_s]", PEAK_FLOPS_RANGE, "FLOP/s") for k in sorted(peaks)}
    link, eff, price, sources = data["link"], data["efficiency"], data["price"], data["sources"]
    # [sources] names the optional keys exactly when the entry sets them
    sourced = _HW_SOURCED | {k for k in _HW_OPTIONAL_SOURCED if k in data}
    unsourced, unset = sorted(sourced - set(sources)), sorted(set(sources) - sourced)
    if unsourced:
        raise ConfigError(f"{origin} [sources]: missing key(s) {unsourced} (every number the entry sets has a source)")
    if unset:
        raise ConfigError(f"{origin} [sources]: unknown key(s) {unset}; the entry sets no {' or '.join(unset)}")
    for key in sourced:
        _str(sources, key, f"{origin} [sources]")
    memory_bytes = _memory_bytes(data, "memory_bytes", origin)
    bandwidth = _ranged(data, "memory_bandwidth_bytes_per_s", origin, MEMORY_BANDWIDTH_RANGE, "B/s")
    link_bandwidth = _ranged(link, "bandwidth_bytes_per_s", f"{origin} [link]", LINK_BANDWIDTH_RANGE, "B/s")
    link_latency = _ranged(link, "latency_s", f"{origin} [link]", LINK_LATENCY_RANGE, "s")
    cuda_memory = _num(data, "cuda_memory_bytes", origin) if "cuda_memory_bytes" in data else 0.0
    if cuda_memory > memory_bytes:
        raise ConfigError(
            f"{origin}: cuda_memory_bytes must not exceed memory_bytes ({memory_bytes:.0f}), got {cuda_memory:.4g}"
        )
    die = _str(data, "die", origin) if "die" in data else ""
    if die and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}", die):
        raise ConfigError(f"{origin}: die must be a die name such as GH100 (letters, digits, . _ -), got {die[:40]!r}")
    extra_reserved = 0.0
    if "extra_reserved_bytes" in data:
        extra_reserved = _num(data, "extra_reserved_bytes", origin, positive=False)
    if extra_reserved >= memory_bytes:
        raise ConfigError(
            f"{origin}: extra_reserved_bytes must be in [0, memory_bytes) (0..{memory_bytes:.0f} bytes), "
            f"got {extra_reserved:.4g}"
        )
    for key in ("compute", "memory", "elementwise", "link"):
        value = _num(eff, key, f"{origin} [efficiency]")
        if not MIN_EFFICIENCY <= value <= 1.0:
            raise ConfigError(
                f"{origin} [efficiency]: {key} must be in [{MIN_EFFICIENCY:g}, 1] (a share of the peak), got {value}"
            )
    date = _price_date(price, "date", f"{origin} [price]")
    min_kernel = _ranged(eff, "min_kernel_s", f"{origin} [efficiency]", MIN_KERNEL_RANGE, "s")
    step_overhead = _ranged(eff, "step_overhead_s", f"{origin} [efficiency]", STEP_OVERHEAD_RANGE, "s")
    gpu_price = _num(price, "usd_per_gpu_hour", f"{origin} [price]")
    if gpu_price > GPU_PRICE_RANGE[1]:
        raise ConfigError(f"{origin} [price]: usd_per_gpu_hour must be in (0, 1,000,000] USD, got {gpu_price:g}")
    return HardwareSpec(
        name=_str(data, "name", origin),
        display_name=_str(data, "display_name", origin),
        vendor=_str(data, "vendor", origin),
        memory_bytes=memory_bytes,
        memory_bandwidth_bytes_per_s=bandwidth,
        peak_flops_per_s=MappingProxyType(peak),
        link_kind=_str(link, "kind", f"{origin} [link]"),
        link_bandwidth_bytes_per_s=link_bandwidth,
        link_latency_s=link_latency,
        gpus_per_node=_gpus_per_node(link, f"{origin} [link]"),
        compute_efficiency=float(eff["compute"]),
        memory_efficiency=float(eff["memory"]),
        elementwise_efficiency=float(eff["elementwise"]),
        link_efficiency=float(eff["link"]),
        min_kernel_s=min_kernel,
        step_overhead_s=step_overhead,
        calibrated_on=_str(eff, "calibrated_on", f"{origin} [efficiency]"),
        price_usd_per_gpu_hour=gpu_price,
        price_date=date,
        sources=MappingProxyType({k: str(sources[k]) for k in sorted(sources)}),
        path=origin,
        cuda_memory_bytes=cuda_memory,
        die=die,
        peer_to_peer=bool(data.get("peer_to_peer", True)),
        extra_reserved_bytes=extra_reserved,
        prior_applies=bool(data.get("prior_applies", True)),
        link_fitted_from=_fitted_from(link, f"{origin} [link]"),
    )


def _fitted_from(link: Mapping[str, Any], where: str) -> str:
    """``[link] fitted_from``: a catalog hardware name (the GPU the link was fitted for), or ""."""
    if "fitted_from" not in link:
        return ""
    name = _str(link, "fitted_from", where)
    if not CATALOG_NAME_RE.fullmatch(name):
        raise ConfigError(
            f"{where}: fitted_from must be the hardware name the link was fitted for ({CATALOG_NAME_RULE}), "
            f"got {name[:64]!r}"
        )
    return name


def hardware_to_toml(hw: HardwareSpec) -> str:
    """Serialise a HardwareSpec back to catalog TOML (used by ``calibrate`` to write a new entry)."""

    q = _toml_string

    def num(value: float) -> str:
        # Exact integers (byte counts) stay integers; large rates read better as 3.35e+12.
        if float(value).is_integer() and abs(value) < 1e12:
            return str(int(value))
        return f"{value:.10g}" if "e" in f"{value:.10g}" or "." in f"{value:.10g}" else f"{value:.10g}.0"

    lines = [
        f"name = {q(hw.name)}",
        f"display_name = {q(hw.display_name)}",
        f"vendor = {q(hw.vendor)}",
        f"memory_bytes = {int(hw.memory_bytes)}",  # (a whole number, also past 1e12)
        f"memory_bandwidth_bytes_per_s = {num(hw.memory_bandwidth_bytes_per_s)}",
        *([f"cuda_memory_bytes = {num(hw.cuda_memory_bytes)}"] if hw.cuda_memory_bytes else []),
        *([f"die = {q(hw.die)}"] if hw.die else []),
        # the GPU facts only where they differ from the defaults (as the catalog's own entries)
        *(["peer_to_peer = false"] if not hw.peer_to_peer else []),
        *([f"extra_reserved_bytes = {hw.extra_reserved_bytes!r}"] if hw.extra_reserved_bytes else []),
        *(["prior_applies = false"] if not hw.prior_applies else []),
        "",
        "[peak_flops_per_s]",
        *(f"{k} = {num(v)}" for k, v in hw.peak_flops_per_s.items()),
        "",
        "[link]",
        f"kind = {q(hw.link_kind)}",
        f"bandwidth_bytes_per_s = {num(hw.link_bandwidth_bytes_per_s)}",
        f"latency_s = {num(hw.link_latency_s)}",
        f"gpus_per_node = {hw.gpus_per_node}",
        *([f"fitted_from = {q(hw.link_fitted_from)}"] if hw.link_fitted_from else []),
        "",
        "[efficiency]",
        f"compute = {num(hw.compute_efficiency)}",
        f"memory = {num(hw.memory_efficiency)}",
        f"elementwise = {num(hw.elementwise_efficiency)}",
        f"link = {num(hw.link_efficiency)}",
        f"min_kernel_s = {num(hw.min_kernel_s)}",
        f"step_overhead_s = {num(hw.step_overhead_s)}",
        f"calibrated_on = {q(hw.calibrated_on)}",
        "",
        "[price]",
        f"usd_per_gpu_hour = {num(hw.price_usd_per_gpu_hour)}",
        f"date = {q(hw.price_date)}",
        "",
        "[sources]",
        *(f"{k} = {q(v)}" for k, v in hw.sources.items()),
        "",
    ]
    return "\n".join(lines)


def list_hardware() -> list[str]:
    return sorted(p.stem for p in hardware_dir().glob("*.toml"))


def _exists(path: Path) -> bool:
    """``path.exists()``, False for a name no file can have (too long, or holding NUL)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def entry_path(kind: str, name: str) -> Path:
    """The file :func:`load_hardware` (``kind`` "hardware") or :func:`load_model` ("model") reads
    for ``name``: a path to a TOML file as given, else the catalog's entry."""
    candidate = Path(name)
    if candidate.suffix == ".toml" and _exists(candidate):
        return candidate
    return (hardware_dir() if kind == "hardware" else models_dir()) / f"{name}.toml"


_Spec = TypeVar("_Spec", "HardwareSpec", "ModelSpec")


def _load_entry(kind: str, name: str, load_file: Callable[[Path], _Spec], known: Callable[[], list[str]]) -> _Spec:
    """The entry ``name`` of ``kind`` ("hardware" or "model"): a TOML file given by path, else the
    catalog's ``<name>.toml``, whose declared name must be its file stem."""
    path = entry_path(kind, name)
    folder = hardware_dir() if kind == "hardware" else models_dir()
    if path != folder / f"{name}.toml":
        return load_file(path)  # a path given as the name
    if not CATALOG_NAME_RE.fullmatch(name):  # '../x', 'a/b': never a file outside the catalog
        raise ConfigError(f"no {kind} named {name!r} in {folder} (a name is {CATALOG_NAME_RULE}); known: {known()}")
    if not _exists(path):
        raise ConfigError(f"no {kind} named {name!r} in {path.parent}; known: {known()}")
    spec = load_file(path)
    if spec.name != name:
        raise ConfigError(f"{path}: declares name {spec.name!r}, expected {name!r} (the file stem)")
    return spec


def load_hardware_file(path: Path | str) -> HardwareSpec:
    path = Path(path)
    return parse_hardware(read_toml(path, "catalog entry"), str(path))


@cache
def load_hardware(name: str) -> HardwareSpec:
    """Load ``hardware/<name>.toml``; ``name`` may also be a path to a TOML file."""
    return _load_entry("hardware", name, load_hardware_file, list_hardware)


# --------------------------------------------------------------------------------------------
# interconnect topology (topology.toml): the all-reduce each intra-node path pays

#: The links a FLEET.toml's [topology] may state, with their generations, and the PCIe
#: peer-to-peer paths (docs/collectives.md).
TOPOLOGY_LINKS: dict[str, tuple[int, ...]] = {"nvlink": (3, 4, 5), "pcie": (4, 5)}
PCIE_P2P_PATHS = ("switch", "root_complex", "none")


@dataclass(frozen=True)
class LinkPath:
    """The path a tensor-parallel group's collectives take, as the cost model prices it: a ring
    all-reduce of B bytes over n GPUs takes ``hops · 2(n−1)/n · B / busbw + latency`` seconds
    (:meth:`all_reduce_s`). ``hops`` is 2 where chunks are staged through host memory (PCIe
    without peer-to-peer), else 1. ``name`` says where it came from (a topology.toml path, a
    FLEET.toml [topology] with its own figures, or a link fitted on an nccl-tests log)."""

    name: str
    link: str
    generation: int
    p2p: str
    busbw_bytes_per_s: float
    latency_s: float
    source: str = field(default="", compare=False)

    @property
    def hops(self) -> int:
        return 2 if self.p2p == "none" else 1

    def transfer_s(self, ring_bytes: Any, calls: Any) -> Any:
        """Seconds to move ``ring_bytes`` (already scaled by the ring's 2(n−1)/n) through each GPU's
        link in ``calls`` collective calls."""
        return self.hops * ring_bytes / self.busbw_bytes_per_s + calls * self.latency_s

    def all_reduce_s(self, nbytes: Any, gpus: int) -> Any:
        """One ring all-reduce of ``nbytes`` over ``gpus`` GPUs (0 for one GPU)."""
        if gpus < 2:
            return 0.0 * nbytes
        return self.transfer_s(2.0 * (gpus - 1) / gpus * nbytes, 1.0)

    def describe(self) -> str:
        path = f"NVLink {self.generation}" if self.link == "nvlink" else f"PCIe Gen{self.generation}, P2P {self.p2p}"
        staged = ", staged through host memory (2 copies)" if self.hops == 2 else ""
        return (
            f"{self.name}: {path}, all-reduce bus bandwidth {self.busbw_bytes_per_s / 1e9:.4g} GB/s{staged}, "
            f"{self.latency_s * 1e6:.3g} us per call"
        )


def topology_file() -> Path:
    return CATALOG_DIR / "topology.toml"


@cache
def load_topology() -> Mapping[tuple[str, int, str], LinkPath]:
    """topology.toml's paths by (link, generation, p2p); NVLink paths have p2p "nvlink"."""
    path = topology_file()
    data = read_toml(path, "catalog topology")
    where = str(path)
    paths = data.get("path")
    if set(data) != {"path"} or not isinstance(paths, Mapping) or not paths:
        raise ConfigError(f"{where}: must hold [path.<name>] tables only, got keys {sorted(data)}")
    out: dict[tuple[str, int, str], LinkPath] = {}
    for name, raw in paths.items():
        at = f"{where} [path.{name}]"
        _check_keys(raw, "TopologyPathEntry", at)
        link, gen, p2p = raw["link"], raw["generation"], raw["p2p"]
        if link not in TOPOLOGY_LINKS or gen not in TOPOLOGY_LINKS[link]:
            raise ConfigError(f"{at}: link {link!r} generation {gen!r} is not one of {TOPOLOGY_LINKS}")
        if p2p not in (("nvlink",) if link == "nvlink" else PCIE_P2P_PATHS):
            raise ConfigError(f"{at}: p2p {p2p!r} does not go with link {link!r}")
        out[(link, gen, p2p)] = LinkPath(
            name=f"topology.toml {name}",
            link=link,
            generation=gen,
            p2p=p2p,
            busbw_bytes_per_s=_ranged(raw, "busbw_bytes_per_s", at, LINK_BANDWIDTH_RANGE, "B/s"),
            latency_s=_ranged(raw, "latency_s", at, LINK_LATENCY_RANGE, "s"),
            source=_str(raw, "source", at),
        )
    return MappingProxyType(out)


def fitted_link(hw: HardwareSpec) -> LinkPath | None:
    """The link ``rooftrace calibrate --measurements`` fitted on the box (a hardware entry with
    ``[link] fitted_from``), as a path: busbw = bandwidth × efficiency, its latency; None for a
    catalog link."""
    if not hw.link_fitted_from:
        return None
    kind = hw.link_kind.lower()
    link = "nvlink" if kind.startswith(("nvlink", "nvswitch")) else "pcie" if kind.startswith("pcie") else kind
    gen = re.search(r"(\d+)", kind)
    return LinkPath(
        name=f"link fitted on an nccl-tests log ({hw.name})",
        link=link,
        generation=int(gen.group(1)) if gen else 0,
        # the fit measured the box's whole path, staging and all: one hop at the fitted rate
        p2p="nvlink" if link == "nvlink" else "fitted",
        busbw_bytes_per_s=hw.link_bandwidth_bytes_per_s * hw.link_efficiency,
        latency_s=hw.link_latency_s,
        source=hw.sources.get("link", ""),
    )


# --------------------------------------------------------------------------------------------
# models


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, normalised from its Hugging Face config.json.

    attention: "mha" (kv heads == heads), "gqa" (1 < kv heads < heads), "mqa" (1 kv head) or
    "mla" (DeepSeek multi-head latent attention: the KV cache holds a compressed latent of
    kv_lora_rank + qk_rope_head_dim values per token and layer, shared by all heads).
    MoE layers: num_experts routed experts of moe_intermediate_size, experts_per_token active per
    token, plus num_shared_experts always-active experts; the first first_dense_layers layers
    use a dense MLP of intermediate_size instead. Sliding-window layers (window sliding_window
    tokens) are num_sliding_layers of the num_layers layers.
    """

    name: str
    hf_id: str
    model_type: str
    native_dtype: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    # MLA (0 when absent)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE (0 when dense)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    # sliding window (0 when absent)
    sliding_window: int = 0
    num_sliding_layers: int = 0
    source: str = ""
    config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False, repr=False)

    # ---- derived shape facts ----
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention(self) -> str:
        if self.is_mla:
            return "mla"
        if self.num_kv_heads == self.num_attention_heads:
            return "mha"
        return "mqa" if self.num_kv_heads == 1 else "gqa"

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers

    @property
    def q_head_dim(self) -> int:
        """Query/key head width used in the attention scores."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def o_head_dim(self) -> int:
        """Value/output head width."""
        return self.v_head_dim if self.is_mla else self.head_dim

    # ---- parameter counts (per layer unless noted) ----
    def attention_params(self) -> int:
        """Weights of one attention block (projections; norms excluded)."""
        h, nq = self.hidden_size, self.num_attention_heads
        if self.is_mla:
            q = (
                (h * self.q_lora_rank + self.q_lora_rank * nq * self.q_head_dim)
                if self.q_lora_rank
                else (h * nq * self.q_head_dim)
            )
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * nq * (self.qk_nope_head_dim + self.v_head_dim)
            o = nq * self.v_head_dim * h
            return q + kv_a + kv_b + o
        qkv = h * (nq + 2 * self.num_kv_heads) * self.head_dim
        o = nq * self.head_dim * h
        bias = (nq + 2 * self.num_kv_heads) * self.head_dim + h if self.attention_bias else 0
        return qkv + o + bias

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down (SwiGLU)

    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    def router_params(self) -> int:
        return self.hidden_size * self.num_experts

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        """All weights (routed experts counted once each)."""
        per_layer_norms = 2 * self.hidden_size
        mlp = self.num_dense_layers * self.dense_mlp_params() + self.num_moe_layers * (
            (self.num_experts + self.num_shared_experts) * self.expert_params() + self.router_params()
        )
        return (
            self.num_layers * (self.attention_params() + per_layer_norms)
            + mlp
            + self.embedding_params()
            + self.lm_head_params()
            + self.hidden_size
        )

    def active_params(self) -> int:
        """Weights touched per token (top-k routed experts plus shared ones)."""
        if not self.is_moe:
            return self.total_params()
        inactive = (self.num_experts - self.experts_per_token) * self.expert_params() * self.num_moe_layers
        return self.total_params() - inactive


#: HF config.json keys a catalog model entry may carry under [config].
_HF_KEYS: set[str] = {
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "torch_dtype",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
    "decoder_sparse_step",
    "mlp_only_layers",
    "quantization_config",
    "num_nextn_predict_layers",
    "rope_theta",
}
_HF_REQUIRED = {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"}
#: The largest integer a config.json key may hold: widths, counts and ranks at most 2**24
#: (16,777,216; today's largest models have hidden sizes of about 2**14 and vocabularies of about
#: 2**18), token counts (context, window) at most 2**31 - 1 (what a 32-bit token index holds).
#: Past these a value is a typo or hostile, and the parameter and byte counts derived from it stop
#: meaning anything.
MAX_CONFIG_INT = 2**24
MAX_CONFIG_TOKENS = 2**31 - 1
_TOKEN_KEYS = {"max_position_embeddings", "sliding_window"}


def _native_dtype(cfg: Mapping[str, Any]) -> str:
    quant = cfg.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        if method == "mxfp4":
            return "mxfp4"
        if method == "fp8":
            return "fp8-block" if quant.get("weight_block_size") else "fp8"
        if method in ("awq", "gptq"):
            return "int4"
    dtype = str(cfg.get("torch_dtype", "bfloat16"))
    return {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, "bf16")


def model_from_hf_config(cfg: Mapping[str, Any], name: str, hf_id: str = "", source: str = "") -> ModelSpec:
    """Normalise a Hugging Face ``config.json`` mapping into a :class:`ModelSpec`.

    Handles the key spellings of Llama/Mistral/Qwen3 (dense), Mixtral (num_local_experts),
    Qwen3-MoE (num_experts, decoder_sparse_step, mlp_only_layers), DeepSeek-V3 (n_routed_experts,
    n_shared_experts, first_k_dense_replace, MLA ranks) and gpt-oss (layer_types with
    sliding_attention). Raises ConfigError naming the missing key.
    """
    where = f"model {name!r} config"
    missing = sorted(k for k in _HF_REQUIRED if k not in cfg)
    if missing:
        raise ConfigError(f"{where}: missing key(s) {missing}")

    def get_int(key: str, default: int = 0) -> int:
        value = cfg.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{where}: {key} must be a non-negative integer, got {value!r}")
        top = MAX_CONFIG_TOKENS if key in _TOKEN_KEYS else MAX_CONFIG_INT
        if value > top:
            shown = f"{value:.3e}" if value < 10**300 else "a number too long to show"
            raise ConfigError(f"{where}: {key} must be an integer in 0..{top:,}, got {shown}")
        return value

    def get_bool(key: str, default: bool) -> bool:
        """A JSON/TOML true or false (null: the default). A string "false" is refused, not read
        as true (it silently dropped the lm_head's weights)."""
        value = cfg.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ConfigError(f"{where}: {key} must be true or false, got {shown}")
        return value

    hidden = get_int("hidden_size")
    layers = get_int("num_hidden_layers")
    heads = get_int("num_attention_heads")
    if min(hidden, layers, heads) <= 0:
        raise ConfigError(f"{where}: hidden_size, num_hidden_layers, num_attention_heads must be > 0")
    vocab = get_int("vocab_size")
    if vocab < 1:
        raise ConfigError(f"{where}: vocab_size must be >= 1, got {vocab}")
    # Absent (or null), the context length is unknown (0); given, it must be a length.
    max_positions = get_int("max_position_embeddings")
    if cfg.get("max_position_embeddings") is not None and max_positions < 1:
        raise ConfigError(f"{where}: max_position_embeddings must be >= 1 when given, got {max_positions}")
    tied, attention_bias = get_bool("tie_word_embeddings", False), get_bool("attention_bias", False)
    use_window = get_bool("use_sliding_window", True)
    for key in ("num_key_value_heads", "head_dim", "moe_intermediate_size"):
        if cfg.get(key) == 0 and not isinstance(cfg.get(key), bool):  # given as 0, not left out (null)
            raise ConfigError(f"{where}: {key} must be > 0 when given, got 0 (leave it out for the default)")
    kv_heads = get_int("num_key_value_heads", heads) or heads
    if heads % kv_heads:
        raise ConfigError(f"{where}: num_attention_heads {heads} not divisible by num_key_value_heads {kv_heads}")
    if cfg.get("head_dim") is None and hidden % heads and not get_int("kv_lora_rank"):
        raise ConfigError(
            f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads} and no head_dim is "
            f"given (the head size would be rounded down to {hidden // heads}); set head_dim"
        )
    head_dim = get_int("head_dim", hidden // heads) or hidden // heads

    # MoE: each family spells the expert count differently.
    num_experts = get_int("n_routed_experts") or get_int("num_local_experts") or get_int("num_experts")
    top_k = get_int("num_experts_per_tok") or get_int("experts_per_token")
    moe_inter = get_int("moe_intermediate_size") or (get_int("intermediate_size") if num_experts else 0)
    first_dense = get_int("first_k_dense_replace")
    if top_k and not num_experts:
        raise ConfigError(
            f"{where}: num_experts_per_tok is {top_k} but the expert count (n_routed_experts, num_local_experts, "
            "num_experts) is 0 or missing"
        )
    if num_experts:
        if not top_k or top_k > num_experts:
            raise ConfigError(f"{where}: num_experts_per_tok must be in 1..{num_experts}, got {top_k}")
        if get_int("moe_layer_freq", 1) not in (0, 1) or get_int("decoder_sparse_step", 1) not in (0, 1):
            raise ConfigError(f"{where}: MoE on every k-th layer (k > 1) is not supported")
        if cfg.get("mlp_only_layers"):
            raise ConfigError(f"{where}: mlp_only_layers (dense layers inside a Qwen MoE) is not supported")

    # Sliding window: gpt-oss lists per-layer types; Mistral v0.1 applies one window to all layers;
    # Qwen2/3 carry sliding_window but disable it unless use_sliding_window is true.
    window = get_int("sliding_window")
    layer_types = cfg.get("layer_types")
    if window and layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != layers:
            raise ConfigError(f"{where}: layer_types must list {layers} entries")
        n_sliding = sum(1 for t in layer_types if t == "sliding_attention")
    elif window and not use_window:
        window, n_sliding = 0, 0
    elif window and cfg.get("model_type") in ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe"):
        n_sliding = max(0, layers - get_int("max_window_layers", layers))
    else:
        n_sliding = layers if window else 0
    if window and window >= max_positions > 0:
        window, n_sliding = 0, 0  # a window as long as the context is no window
    if not n_sliding:
        window = 0

    kv_lora = get_int("kv_lora_rank")
    spec = ModelSpec(
        name=name,
        hf_id=hf_id,
        model_type=str(cfg.get("model_type", "")),
        native_dtype=_native_dtype(cfg),
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=heads if kv_lora else kv_heads,
        head_dim=head_dim,
        intermediate_size=get_int("intermediate_size"),
        vocab_size=vocab,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        attention_bias=attention_bias,
        kv_lora_rank=kv_lora,
        q_lora_rank=get_int("q_lora_rank"),
        qk_nope_head_dim=get_int("qk_nope_head_dim"),
        qk_rope_head_dim=get_int("qk_rope_head_dim"),
        v_head_dim=get_int("v_head_dim"),
        num_experts=num_experts,
        experts_per_token=top_k if num_experts else 0,
        moe_intermediate_size=moe_inter if num_experts else 0,
        num_shared_experts=get_int("n_shared_experts") if num_experts else 0,
        first_dense_layers=min(first_dense, layers) if num_experts else 0,
        sliding_window=window,
        num_sliding_layers=n_sliding,
        source=source,
        config=MappingProxyType(dict(cfg)),
    )
    if spec.is_mla and not (spec.qk_rope_head_dim and spec.qk_nope_head_dim and spec.v_head_dim):
        raise ConfigError(f"{where}: MLA needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
    if spec.num_dense_layers and not spec.intermediate_size:
        if cfg.get("intermediate_size") is not None:  # given as 0, not left out
            raise ConfigError(
                f"{where}: intermediate_size must be > 0 for dense MLP layers ({spec.num_dense_layers} of them), got 0"
            )
        raise ConfigError(f"{where}: missing key ['intermediate_size'] for dense MLP layers")
    return spec


def parse_model(data: Mapping[str, Any], origin: str) -> ModelSpec:
    _check_keys(data, "ModelEntry", origin)  # [config]: the config.json keys rooftrace reads
    cfg = data["config"]
    name, hf_id, source = (_str(data, key, origin) for key in ("name", "hf_id", "source"))
    try:
        return model_from_hf_config(cfg, name, hf_id, source)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quote, backslash and control characters escaped."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " " or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    """``key`` bare when TOML allows it (letters, digits, '_', '-'), else quoted."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def model_to_toml(name: str, hf_id: str, source: str, cfg: Mapping[str, Any]) -> str:
    """Write a catalog model entry: the config.json keys rooftrace reads, verbatim."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            if not -(2**63) <= v < 2**63:  # TOML integers are 64-bit
                raise ConfigError("config value past 64 bits cannot be written to TOML")
            return repr(v)
        if isinstance(v, float):
            return repr(v)  # inf and nan are TOML floats too
        if isinstance(v, str):
            return _toml_string(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, Mapping):
            items = (f"{_toml_key(str(k))} = {value(x)}" for k, x in v.items() if x is not None)
            return "{ " + ", ".join(items) + " }"
        raise ConfigError(f"config value {str(v)[:40]!r} cannot be written to TOML")

    lines = [
        f"name = {value(name)}",
        f"hf_id = {value(hf_id)}",
        f"source = {value(source)}",
        "",
        "[config]",
    ]
    for key in sorted(cfg):
        if key in _HF_KEYS and cfg[key] is not None:
            lines.append(f"{key} = {value(cfg[key])}")
    return "\n".join(lines) + "\n"


def list_models() -> list[str]:
    return sorted(p.stem for p in models_dir().glob("*.toml"))


def load_model_file(path: Path | str) -> ModelSpec:
    path = Path(path)
    return parse_model(read_toml(path, "catalog entry"), str(path))


@cache
def load_model(name: str) -> ModelSpec:
    """Load ``models/<name>.toml``; ``name`` may also be a path to a TOML file."""
    return _load_entry("model", name, load_model_file, list_models)


def import_hf_config(config_path: Path | str, name: str | None = None, hf_id: str = "") -> tuple[ModelSpec, str]:
    """Read a Hugging Face config.json; return the normalised spec and the catalog TOML text."""
    import json

    path = Path(config_path)

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # json keeps the last of a repeated key; which one the author meant is unknowable
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                shown = repr(key) if len(key) <= 60 else repr(key[:57] + "...")
                raise ConfigError(f"{path}: invalid JSON: key {shown} appears more than once in one object")
            seen[key] = value
        return seen

    raw = read_config_bytes(path, "config file")  # (a device, a huge file, a pipe: one line)
    try:
        cfg = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid JSON: nested too deeply to read") from None
    except ValueError as exc:  # a number past Python's int() digit limit
        raise ConfigError(f"{path}: invalid JSON: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    # Multimodal wrappers (e.g. Llama 4, Qwen-VL) nest the language model under text_config.
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures")}
    stem = name if name is not None else (hf_id.split("/")[-1] if hf_id else path.parent.name or "model").lower()
    source = f"config.json of {hf_id}" if hf_id else f"imported from {path.name}"
    try:
        spec = model_from_hf_config(cfg, stem, hf_id, source)
        text = model_to_toml(stem, hf_id, source, cfg)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: a config value is nested too deeply to write as TOML") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # non-UTF-8 bytes in --name, --hf-id or the folder's name
        bad = text[max(0, exc.start - 30) : exc.end + 10]
        raise ConfigError(f"{path}: the entry would hold text that is not UTF-8 (near {bad!r})") from None
    if not CATALOG_NAME_RE.fullmatch(stem):
        given = "" if name is not None else " (taken from the Hugging Face id or the folder: pass a name)"
        raise ConfigError(f"{path}: name {stem!r} must be {CATALOG_NAME_RULE}{given}")
    # What the catalog would read back: the same checks, on the text itself (an empty hf_id is
    # only refused when the entry is written, write_model_entry).
    try:
        parse_model({**tomllib.loads(text), **({} if hf_id else {"hf_id": "-"})}, "entry")
    except (ConfigError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: the catalog would refuse the entry: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: the catalog would refuse the entry: nested too deeply to read") from None
    return spec, text


def write_entry(path: Path, text: str) -> Path:
    """Write a catalog entry's ``text`` to ``path`` atomically; a path that cannot be written (a
    parent that is a file, a folder in its place, no permission) is one RooftraceError line."""
    try:
        atomic_write_bytes(path, text.encode("utf-8"))
    except OSError as exc:
        raise RooftraceError(f"cannot write {path}: {os_write_reason(path, exc)}") from None
    return path


def write_model_entry(path: Path, text: str) -> Path:
    """Write model entry ``text`` (from :func:`import_hf_config`) to ``path``, only if the catalog
    would read it back: a hf_id, every check of :func:`parse_model`, and, inside the catalog's
    models folder, a file named after the entry. Nothing is written on an error."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not written: the entry is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not written: the entry is nested too deeply to read") from None
    if not str(data.get("hf_id", "")).strip():
        raise ConfigError(
            f"{path}: not written: the entry needs its Hugging Face repository id (--hf-id org/name); "
            "the catalog refuses an empty hf_id"
        )
    spec = parse_model(data, str(path))
    if not CATALOG_NAME_RE.fullmatch(spec.name):
        raise ConfigError(f"{path}: not written: name {spec.name!r} must be {CATALOG_NAME_RULE}")
    try:
        in_catalog = path.resolve().parent == models_dir().resolve()
    except (OSError, RuntimeError):
        in_catalog = False
    if in_catalog and path.name != f"{spec.name}.toml":
        raise ConfigError(f"{path}: not written: a catalog entry named {spec.name!r} must be {spec.name}.toml")
    return write_entry(path, text)
