"""A GPU's measured profile: the operator tables a deployment's step costs are interpolated from.

A profile is data in the catalog (``pipeline/catalog/profiles/<gpu>/``): one Parquet file per
operator family holding the measured rows it was built from (columns as in
pipeline/costmodel/profile/sources.py, times in seconds) and ``profile.toml`` saying where they came from,
how they were measured and how well the tables predict rows they were not built on
(``rooftrace calibrate --measurements`` writes both; docs/validation.md explains the tiers).

:class:`Profile` turns the rows into interpolating functions:

- ``gemm_time(dtype, n, k, m)``: GEMM ``[m, k] × [k, n]`` — curves over m per measured (n, k),
  isolated upward spikes dropped (``GEMM_SPIKE_REL``), interpolated across shapes
  (:func:`pipeline.costmodel.profile.interp.curve_family`);
- ``attention_grid(family, kv_dtype, nq, nkv, d)``: a :class:`~pipeline.costmodel.profile.interp.Grid2`
  over (batch, context) for one head shape per GPU, interpolated in the number of query heads
  when that exact shape was not measured (a grouped-query decode among grouped shapes only,
  ``GQA_SEPARATE``);
- ``allreduce_time(backend, gpus, bytes)``: vLLM's custom all-reduce (CUDA graph / eager) or NCCL;
- ``moe_time(...)``: the fused-MoE layer over tokens for one expert shape;
- ``model_op_time(model, tp, op, size)``: one model's own operator, where the GPU was profiled
  with that model (LLMServingSim bundles).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipeline.catalog import CATALOG_DIR, load_hardware
from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.costmodel.profile.interp import Curve, FloatArray, Grid2, bracket, curve_family, grid2_from
from pipeline.costmodel.profile.mixed import ratio_grid

PROFILES_DIR = CATALOG_DIR / "profiles"
#: Attention families whose grouped-query shapes (nq > nkv) never borrow from the
#: one-query-per-KV-head shape (nq = nkv): FlashAttention-2's decode packs the query heads of a
#: KV head into one row block only when there are several (``seqlenq_ngroups_swapped``), so
#: nq = nkv takes another path — up to 6.5× slower at batch 1 and long contexts on A100 and L40S
#: (docs/validation.md) — and interpolating across the two paths misprices every GQA shape between.
GQA_SEPARATE = frozenset({"attn_decode"})
#: File per family in a profile folder.
#: Routing distributions of the fused-MoE tables, preferred first: real routing is skewed.
MOE_DISTRIBUTIONS = ("power_law_1.01", "balanced", "power_law_1.2")
FAMILY_FILES = {
    "gemm": "gemm.parquet",
    "attn_decode": "attn_decode.parquet",
    "attn_prefill": "attn_prefill.parquet",
    "allreduce": "allreduce.parquet",
    "moe": "moe.parquet",
    "model_ops": "model_ops.parquet",
    "attn_mixed": "attn_mixed.parquet",
}
#: Keys of profile.toml.
_META_KEYS = {"gpu", "stack", "built_from", "rows", "selection", "fitted", "heldout", "licence", "implausible"}


@dataclass(frozen=True)
class ProfileMeta:
    gpu: str
    stack: Mapping[str, Any]
    built_from: tuple[str, ...]
    rows: Mapping[str, int]
    selection: Mapping[str, str]
    fitted: Mapping[str, Any]
    heldout: Mapping[str, Any]
    licence: str
    #: Rows the build left out as implausible (pipeline/costmodel/profile/plausible.py): counts and the first few.
    implausible: Mapping[str, Any] = field(default_factory=dict)


#: GEMM rows more than this much above the second-highest of their four nearest m neighbours
#: are dropped as isolated spikes before interpolating (pipeline/costmodel/profile/interp.py
#: ``upward_spikes``; docs/validation.md "Held-out errors"). Other families keep every row
#: (it did not help them on held-out shapes).
GEMM_SPIKE_REL = 0.2


def _group_curves(frame: pl.DataFrame, keys: list[str], x: str, despike: float = 0.0) -> dict[tuple[float, ...], Curve]:
    out: dict[tuple[float, ...], Curve] = {}
    if frame.height == 0:
        return out
    for key, sub in frame.group_by(keys, maintain_order=True):
        c = Curve.of(sub[x].to_numpy(), sub["time_s"].to_numpy(), despike)
        if c.x.size:
            out[tuple(float(v) for v in key)] = c
    return out


@dataclass(frozen=True)
class Profile:
    """Measured operator tables of one GPU (rows as stored; functions built lazily). Where
    several measured sets cover a group (pipeline/costmodel/profile/precedence.py), ``frames``
    holds the chosen set's rows only (``order``: the sets in the order they were chosen) and
    ``all_frames`` every set's."""

    meta: ProfileMeta
    frames: Mapping[str, pl.DataFrame] = field(hash=False, compare=False)
    all_frames: Mapping[str, pl.DataFrame] | None = field(default=None, hash=False, compare=False)
    order: tuple[str, ...] = ()

    @property
    def gpu(self) -> str:
        return self.meta.gpu

    def alternatives(self) -> list[str]:
        """The sets that overlap another on some group of this profile (empty: one source)."""
        from pipeline.costmodel.profile.precedence import alternatives  # lazy: profile use only

        return alternatives(dict(self.all_frames or self.frames))

    def with_sources(self, measured_source: str = "auto", vllm_version: str | None = None) -> Profile:
        """This profile with each overlapping group's rows from the set the fleet's order picks
        (pipeline/costmodel/profile/precedence.py ``source_order``); itself where nothing overlaps
        or the order is the one it was read with."""
        from pipeline.costmodel.profile.precedence import source_order  # lazy: profile use only

        order = source_order(measured_source, vllm_version)
        if self.all_frames is None or order == self.order or not self.alternatives():
            return self
        key = (id(self), order)
        got = _WITH_ORDER.get(key)
        if got is None or got[0] is not self:
            got = (self, _chosen(self.meta, dict(self.all_frames), order))
            _WITH_ORDER[key] = got
        return got[1]

    def source_choice(self, measured_source: str = "auto") -> dict[str, str]:
        """Per overlapping family and group, the set chosen and the others (for the run's record)."""
        from pipeline.costmodel.profile.precedence import describe_choice  # lazy: profile use only

        return describe_choice(dict(self.all_frames or self.frames), self.order, measured_source)

    def frame(self, family: str) -> pl.DataFrame:
        return self.frames.get(family, pl.DataFrame())

    # ---------------------------------------------------------------- GEMM
    @cached_property
    def _gemm(self) -> dict[str, dict[tuple[float, ...], Curve]]:
        f = self.frame("gemm")
        out: dict[str, dict[tuple[float, ...], Curve]] = {}
        if f.height == 0:
            return out
        for (dtype,), sub in f.group_by(["dtype"]):
            out[str(dtype)] = _group_curves(sub, ["n", "k"], "m", GEMM_SPIKE_REL)
        return out

    def gemm_dtypes(self) -> list[str]:
        return sorted(self._gemm)

    def has_gemm(self, dtype: str) -> bool:
        return bool(self._gemm.get(dtype))

    def gemm_time(self, dtype: str, n: float, k: float, m: FloatArray) -> FloatArray:
        return curve_family(self._gemm[dtype], (float(n), float(k)), m)

    # ---------------------------------------------------------------- attention
    @cached_property
    def _attn(self) -> dict[tuple[str, str], dict[tuple[float, ...], Grid2]]:
        out: dict[tuple[str, str], dict[tuple[float, ...], Grid2]] = {}
        for fam, size in (("attn_decode", "ctx"), ("attn_prefill", "isl")):
            f = self.frame(fam)
            if f.height == 0:
                continue
            for (kv,), sub in f.group_by(["kv_dtype"]):
                grids: dict[tuple[float, ...], Grid2] = {}
                for key, g in sub.group_by(["nkv", "d", "nq"]):
                    grid = grid2_from(g["batch"].to_numpy(), g[size].to_numpy(), g["time_s"].to_numpy())
                    if grid is not None:
                        grids[tuple(float(v) for v in key)] = grid
                if grids:
                    out[(fam, str(kv))] = grids
        return out

    def attention_grid(self, family: str, kv_dtype: str, nq: int, nkv: int, d: int) -> Grid2 | None:
        """The (batch, length) grid for this head shape: measured, or interpolated in log nq
        between measured shapes with the same KV heads and head size (proportional above the
        largest measured nq, the smallest one's grid below the smallest); None when no shape
        with this (nkv, d) was measured. A decode with grouped queries (nq > nkv) is
        interpolated among grouped shapes only where any was measured: the one-query-per-KV-head
        shape (nq = nkv) runs another kernel path (GQA_SEPARATE)."""
        grids = self._attn.get((family, kv_dtype))
        if not grids:
            return None
        same = {k: v for k, v in grids.items() if k[0] == nkv and k[1] == d}
        if not same:
            return None
        if family in GQA_SEPARATE and nq > nkv:
            grouped = {k: v for k, v in same.items() if k[2] > k[0]}
            if grouped:
                same = grouped
        key = (float(nkv), float(d), float(nq))
        if key in same:
            return same[key]
        qs = np.array(sorted(k[2] for k in same))

        i0, i1, w, lf = bracket(qs, np.array([float(nq)]))
        lo, hi = same[(float(nkv), float(d), float(qs[i0[0]]))], same[(float(nkv), float(d), float(qs[i1[0]]))]
        # evaluate both on the union of their axes, then mix in log space
        a = np.union1d(lo.a, hi.a)
        b = np.union1d(lo.b, hi.b)
        aa, bb = np.meshgrid(a, b, indexing="ij")
        t_lo = np.log(lo(aa.ravel(), bb.ravel())).reshape(aa.shape)
        t_hi = np.log(hi(aa.ravel(), bb.ravel())).reshape(aa.shape)
        wt = float(w[0])
        return Grid2(a, b, np.exp((1 - wt) * t_lo + wt * t_hi + float(lf[0])))

    @cached_property
    def _mixed(self) -> dict[tuple[float, ...], Any]:
        f = self.frame("attn_mixed")
        out: dict[tuple[float, ...], Any] = {}
        if f.height == 0:
            return out
        for key, sub in f.group_by(["nq", "nkv", "d"]):
            grid = ratio_grid(sub)
            if grid is not None:
                out[tuple(float(v) for v in key)] = grid
        every = ratio_grid(f)
        if every is not None:
            out[()] = every
        return out

    def mixed_ratio(self, nq: int, nkv: int, d: int) -> tuple[Any, str] | None:
        """The mixed-batch attention ratio grid (pipeline/costmodel/profile/mixed.py) for this head shape
        and what it is: the shape's own grid where measured, else the mean over every measured
        shape of this GPU (held out by model: 9-23 % median, docs/validation.md); None when the
        GPU has no mixed-batch measurements."""
        own = self._mixed.get((float(nq), float(nkv), float(d)))
        if own is not None:
            return own, f"measured mixed batches of this head shape (nq={nq} nkv={nkv} d={d})"
        every = self._mixed.get(())
        if every is not None:
            return every, "measured mixed batches of other head shapes on this GPU (mean ratio)"
        return None

    def attention_kv_dtypes(self, family: str) -> list[str]:
        return sorted(kv for fam, kv in self._attn if fam == family)

    # ---------------------------------------------------------------- collectives
    @cached_property
    def _allreduce(self) -> dict[tuple[str, int], Curve]:
        f = self.frame("allreduce")
        out: dict[tuple[str, int], Curve] = {}
        if f.height == 0:
            return out
        for (backend, gpus), sub in f.group_by(["backend", "gpus"]):
            out[(str(backend), int(gpus))] = Curve.of(sub["bytes"].to_numpy(), sub["time_s"].to_numpy())
        return out

    def allreduce_curve(self, backend: str, gpus: int) -> Curve | None:
        return self._allreduce.get((backend, gpus))

    # ---------------------------------------------------------------- MoE
    @cached_property
    def _moe(self) -> dict[tuple[str, str, int, int], dict[tuple[float, ...], Curve]]:
        f = self.frame("moe")
        out: dict[tuple[str, str, int, int], dict[tuple[float, ...], Curve]] = {}
        if f.height == 0:
            return out
        for (dtype, dist, mtp, mep), sub in f.group_by(["dtype", "distribution", "moe_tp", "moe_ep"]):
            out[(str(dtype), str(dist), int(mtp), int(mep))] = _group_curves(
                sub, ["h", "inter", "topk", "experts"], "tokens"
            )
        return out

    def moe_dtypes(self) -> list[str]:
        return sorted({key[0] for key in self._moe})

    def moe_curves(
        self, dtype: str, distribution: str, moe_tp: int, moe_ep: int
    ) -> dict[tuple[float, ...], Curve] | None:
        return self._moe.get((dtype, distribution, moe_tp, moe_ep)) or None

    def moe_time(
        self,
        dtype: str,
        distribution: str,
        moe_tp: int,
        moe_ep: int,
        shape: tuple[int, int, int, int],
        tokens: FloatArray,
    ) -> FloatArray | None:
        """Fused MoE layer time for ``tokens`` tokens; ``shape`` = (hidden, intermediate, top-k,
        experts). Exact expert shape only (MoE kernels' tile choices do not interpolate across
        shapes well enough): None when that shape was not measured."""
        curves = self.moe_curves(dtype, distribution, moe_tp, moe_ep)
        key = tuple(float(v) for v in shape)
        if curves is None or key not in curves:
            return None
        return curves[key](tokens)

    # ---------------------------------------------------------------- model-specific operators
    @cached_property
    def _model_ops(self) -> dict[tuple[str, int, str], Curve]:
        f = self.frame("model_ops")
        out: dict[tuple[str, int, str], Curve] = {}
        if f.height == 0:
            return out
        for (model, tp, op), sub in f.group_by(["model", "tp", "op"]):
            out[(str(model), int(tp), str(op))] = Curve.of(sub["size"].to_numpy(), sub["time_s"].to_numpy())
        return out

    def model_op(self, model: str, tp: int, op: str) -> Curve | None:
        return self._model_ops.get((model, tp, op))

    # ---------------------------------------------------------------- fitted fallbacks
    def fitted(self, key: str, default: float) -> float:
        value = self.meta.fitted.get(key, default)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else default


#: Profiles re-chosen for another source order, by (id of the profile read, order).
_WITH_ORDER: dict[tuple[int, tuple[str, ...]], tuple[Profile, Profile]] = {}


def _chosen(meta: ProfileMeta, frames: dict[str, pl.DataFrame], order: tuple[str, ...] | None = None) -> Profile:
    """A profile of ``frames`` whose overlapping groups keep the rows of the first set of
    ``order`` (default: the stated precedence, pipeline/costmodel/profile/precedence.py)."""
    from pipeline.costmodel.profile.precedence import choose_sets, source_order  # lazy: profile use only

    order = source_order() if order is None else order
    return Profile(meta, choose_sets(frames, order), frames, order)


def frames_profile(gpu: str, frames: dict[str, pl.DataFrame]) -> Profile:
    """A profile of ``gpu`` from rows in memory (no profile.toml): what the build and the
    held-out checks interpolate before anything is written."""
    meta = ProfileMeta(gpu, {}, (), {k: v.height for k, v in frames.items()}, {}, {}, {}, "")
    return _chosen(meta, frames)


def profile_dir(gpu: str) -> Path:
    return PROFILES_DIR / gpu


def list_profiles() -> list[str]:
    if not PROFILES_DIR.is_dir():
        return []
    return sorted(p.name for p in PROFILES_DIR.iterdir() if (p / "profile.toml").exists())


def no_profile_message(gpu: str, hw: Any = None) -> str:
    """What ``cost_model = "measured"`` on a GPU without a measured profile is told (fleets, the
    step cost and plan's skipped candidates say the same); ``hw``: the entry asked for, when it
    bears a profiled GPU's name without being that device."""
    if hw is not None and load_profile(gpu) is not None and not is_catalog_device(hw):
        return (
            f"cost_model = 'measured' but hardware {gpu!r} ({hw.path or 'a hardware file'}) is not the catalog's "
            f"{gpu} (its memory, bandwidth, peaks or link differ): that GPU's measured profile does not describe it; "
            "use cost_model = 'auto' (the size-aware prior on NVIDIA GPUs), 'prior' or 'roofline'"
        )
    return (
        f"cost_model = 'measured' but hardware {gpu} has no measured profile (profiles: "
        f"{', '.join(list_profiles()) or 'none'}); use cost_model = 'auto' (the size-aware prior where an "
        "NVIDIA GPU has no profile, else the roofline), 'prior' or 'roofline'"
    )


def read_meta(path: Path) -> ProfileMeta:
    data = read_toml(path, "profile metadata")
    unknown = sorted(set(data) - _META_KEYS)
    missing = sorted({"gpu", "stack", "built_from", "rows"} - set(data))
    if unknown or missing:
        raise ConfigError(f"{path}: unknown key(s) {unknown} / missing key(s) {missing}")
    tables = {"stack": data["stack"], "rows": data["rows"]}
    for key in ("selection", "fitted", "heldout"):
        tables[key] = data.get(key, {})
    for key, value in tables.items():
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: [{key}] must be a table")
    if not isinstance(data["built_from"], list) or not all(isinstance(s, str) for s in data["built_from"]):
        raise ConfigError(f"{path}: built_from must be a list of file names")
    for fam, n in data["rows"].items():
        if fam not in FAMILY_FILES:
            raise ConfigError(f"{path}: [rows] unknown family {fam!r}; known: {sorted(FAMILY_FILES)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"{path}: [rows] {fam} must be a row count, got {n!r}")
    return ProfileMeta(
        gpu=str(data["gpu"]),
        stack=dict(data["stack"]),
        built_from=tuple(data["built_from"]),
        rows={str(k): int(v) for k, v in data["rows"].items()},
        selection={str(k): str(v) for k, v in data.get("selection", {}).items()},
        fitted=dict(data.get("fitted", {})),
        heldout=dict(data.get("heldout", {})),
        licence=str(data.get("licence", "")),
        implausible=dict(data.get("implausible", {})) if isinstance(data.get("implausible", {}), dict) else {},
    )


#: Columns each family's table must have (pipeline/costmodel/profile/sources.py describes them).
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "gemm": ("dtype", "m", "n", "k", "time_s"),
    "attn_decode": ("kv_dtype", "nq", "nkv", "d", "batch", "ctx", "time_s"),
    "attn_prefill": ("kv_dtype", "nq", "nkv", "d", "batch", "isl", "time_s"),
    "allreduce": ("backend", "gpus", "bytes", "time_s"),
    "moe": ("dtype", "distribution", "moe_tp", "moe_ep", "h", "inter", "topk", "experts", "tokens", "time_s"),
    "model_ops": ("model", "tp", "op", "size", "time_s"),
    "attn_mixed": ("nq", "nkv", "d", "chunk", "kv_prefill", "n_decode", "kv_decode", "time_s", "base_s", "ratio"),
}


def load_profile_dir(folder: Path) -> Profile:
    meta = read_meta(folder / "profile.toml")
    frames: dict[str, pl.DataFrame] = {}
    for fam, fname in FAMILY_FILES.items():
        path = folder / fname
        if path.exists():
            try:
                frames[fam] = pl.read_parquet(path)
            except Exception as exc:
                raise ConfigError(f"{path}: cannot read profile table: {exc}") from None
            missing = sorted(set(REQUIRED_COLUMNS[fam]) - set(frames[fam].columns))
            if missing:
                raise ConfigError(f"{path}: missing column(s) {missing}")
    for fam, n in meta.rows.items():
        got = frames[fam].height if fam in frames else 0
        if got != n:
            raise ConfigError(f"{folder / FAMILY_FILES.get(fam, fam)}: {got} rows, profile.toml says {n}")
    return _chosen(meta, frames)


#: The fields that make two hardware entries the same device (the efficiency factors, prices and
#: sources may differ: a [calibration] or a re-priced copy is still that GPU).
DEVICE_FIELDS = (
    "vendor",
    "memory_bytes",
    "memory_bandwidth_bytes_per_s",
    "peak_flops_per_s",
    "link_kind",
    "link_bandwidth_bytes_per_s",
)


def is_catalog_device(hw: Any) -> bool:
    """Whether ``hw`` (a HardwareSpec) is the catalog's own entry of its name, as a device: a
    hardware file that borrows a profiled GPU's name but not its memory, bandwidth, peaks or link
    is another GPU, and must not be priced with that GPU's measurements."""
    try:
        ref = load_hardware(device_name(hw))
    except ConfigError:
        return False
    return all(getattr(ref, f) == getattr(hw, f) for f in DEVICE_FIELDS)


def device_name(hw: Any) -> str:
    """The catalog GPU ``hw`` is: its own name, or, for an entry whose link ``calibrate
    --measurements`` fitted on the user's box (``[link] fitted_from``), the GPU it was fitted for."""
    return getattr(hw, "link_fitted_from", "") or hw.name


def profile_for(hw: Any) -> Profile | None:
    """The measured profile that prices ``hw`` (a HardwareSpec): its device's profile
    (:func:`device_name`), only when ``hw`` is that catalog device (:func:`is_catalog_device`)."""
    prof = load_profile(device_name(hw))
    return prof if prof is not None and is_catalog_device(hw) else None


@cache
def load_profile(gpu: str) -> Profile | None:
    """The catalog's profile of ``gpu`` (a hardware name), or None when it has none."""
    folder = profile_dir(gpu)
    if not (folder / "profile.toml").exists():
        return None
    return load_profile_dir(folder)
