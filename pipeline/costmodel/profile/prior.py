"""The size-aware roofline prior: what a GPU without a measured profile is priced with.

A GPU's measured tables (tier 1) say how long each operator takes there. A GPU nobody measured
still has a datasheet — peak FLOP/s per dtype and memory bandwidth — and the measured GPUs say
how far real vLLM kernels stay from those roofs as a function of size. The prior is that
function, fitted per operator family over every measured GPU at once:

    t = floor + ((t_c / compute_eff) ** q + (t_m / memory_eff) ** q) ** (1 / q)

where ``t_c`` = FLOPs / peak and ``t_m`` = bytes / bandwidth are the operator's ideal compute and
memory times on the GPU in question (datasheet roofs, no efficiency factor), ``floor`` is the
launch / latency time of the smallest call, and ``q`` blends the two roofs (q → ∞ is the plain
``max`` of the roofline; a finite q makes the time grow smoothly through the ridge point, where
neither roof is reached — tile and wave quantisation, pipeline fill). Four numbers per family,
fitted by least squares on log(predicted / measured) (soft-L1, scale 0.1) with every GPU weighted
equally (:func:`fit_curve`), on these rows of the catalog's measured profiles:

=====================  ==========================================================================
family                 rows (per measured GPU)                       t_c, t_m
=====================  ==========================================================================
``gemm:<dtype>``       GEMMs with n, k ≥ 128 (LLM layer shapes)       2mnk / peak(dtype);
                                                                      (mk + kn)·b + 2mn bytes
``attn_decode``        decode attention, every head shape, KV dtype  4·B·ctx·nq·d / peak(bf16);
                                                                      B·ctx·2·nkv·d·b_kv + 4·B·nq·d
``attn_prefill``       prefill attention (causal, no cached prefix)  2·B·s(s+1)·nq·d / peak(bf16);
                                                                      B·s·(2nq + 2nkv)·d·2
``moe:<dt>:tp<t>ep<e>`` fused MoE, ``balanced`` routing, one       6·T·k·h·i / peak(dtype);
                       curve per expert sharding (:func:`moe_family`) touched experts' weights + I/O
=====================  ==========================================================================

(b = bytes per weight element of the dtype, b_kv per KV element; i = the expert's intermediate
size on one TP shard; touched experts = E_r·(1 − (1 − k/E)^T) of the E_r = E / ep experts on the
rank, uniform routing's expectation.) The fitted values and the leave-one-GPU-out check — every
measured GPU predicted from a prior fitted on the others — are written to
``pipeline/catalog/profiles/prior.toml`` by ``rooftrace calibrate --measurements`` and printed by
``rooftrace validate``; docs/validation.md has the table.

At replay time the prior is evaluated on the deployment's own shapes (its GEMMs, head shape and
expert shape) over a dense size grid and handed to the measured cost model as a synthetic
profile (:func:`prior_profile`), so CUDA-graph padding, eager launch cost, asynchronous host
overlap and the choice of all-reduce apply exactly as on a measured GPU. Collectives are the
measured curves of the profiled GPU on the same NVLink (:func:`collective_donor`), else the
roofline's link; norms and the sampler keep the roofline / fitted rules. A family is used only
where it beats the plain roofline held out by GPU (:func:`family_verdicts`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipeline.catalog import HardwareSpec, load_hardware
from pipeline.common.errors import ConfigError
from pipeline.common.schemas import atomic_write_bytes
from pipeline.common.tomlfile import read_toml
from pipeline.costmodel.profile.interp import FloatArray
from pipeline.costmodel.profile.tables import (
    MOE_DISTRIBUTIONS,
    PROFILES_DIR,
    Profile,
    ProfileMeta,
    list_profiles,
    load_profile,
    load_profile_dir,
)
from pipeline.costmodel.roofline import Op, comm_time

#: An array of sizes, or one size.
Sizes = FloatArray | float | int
#: Where the fitted prior lives in the catalog (beside the measured profiles' folders).
PRIOR_PATH = PROFILES_DIR / "prior.toml"
#: Bytes per element of each table dtype, and the datasheet peak that prices its math.
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8-block": 1.0, "nvfp4": 0.5, "mxfp4": 0.5}
PEAK_KEY = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp8-block": "fp8", "nvfp4": "fp4", "mxfp4": "fp4"}
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
#: GEMMs smaller than this in n or k are not LLM layer shapes (the sweeps start at 32).
MIN_GEMM_DIM = 128
#: The MoE tables' routing the prior is fitted on: balanced, where every expert gets T·k / E
#: tokens and uniform routing's formulas hold. Under the skewed (power-law) tables the measured
#: rank holds the hottest experts, so its time falls far less than 1 / ep with expert
#: parallelism (H100, h = 2,048, 128 experts top-8, 16,384 tokens: 3.10 ms at ep = 1, 1.04 ms at
#: ep = 128), which a uniform formula reads as a collapsing compute efficiency (fitted 0.24 on
#: power-law rows, 0.39 on balanced ones).
MOE_ROUTING = "balanced"
#: A family is fitted only when at least this many GPUs measured it (so that each can be
#: predicted from the others).
MIN_GPUS = 2
#: Each GPU enters a family's fit with the same number of rows: this many, or the largest GPU's
#: count when smaller (evenly spaced rows in table order; a GPU with fewer rows has them
#: repeated, :func:`_sample`). The curves have four parameters, and 30,000-row sweeps would
#: otherwise make every fit — and the leave-one-GPU-out check, one fit per GPU — minutes long.
FIT_ROWS_PER_GPU = 3000
#: Soft-L1 scale of the fit, on log(predicted / measured): as the calibration fits.
LOSS_SCALE = 0.1
#: Bounds of the four parameters.
FLOOR_BOUNDS = (1e-7, 1e-3)
EFF_BOUNDS = (0.01, 1.0)
BLEND_BOUNDS = (1.0, 20.0)
#: A family whose held-out median error (median over GPUs) exceeds this is not used, even where
#: the plain roofline is worse still (:func:`family_verdicts`).
MAX_USED_ERROR = 0.5


@dataclass(frozen=True)
class PriorCurve:
    """One family's fitted curve (module doc)."""

    floor_s: float
    compute_eff: float
    memory_eff: float
    blend: float

    def time(self, t_c: FloatArray, t_m: FloatArray) -> FloatArray:
        q = self.blend
        # scaled to the larger term before the power: no overflow at q up to 20
        a = np.asarray(t_c, np.float64) / self.compute_eff
        b = np.asarray(t_m, np.float64) / self.memory_eff
        hi = np.maximum(np.maximum(a, b), 1e-300)
        body = hi * ((a / hi) ** q + (b / hi) ** q) ** (1.0 / q)
        return np.asarray(self.floor_s + np.where((a > 0) | (b > 0), body, 0.0))

    def as_dict(self) -> dict[str, float]:
        return {
            "floor_s": self.floor_s,
            "compute_eff": self.compute_eff,
            "memory_eff": self.memory_eff,
            "blend": self.blend,
        }


# ---------------------------------------------------------------------------- roofline terms


def _peak(hw: HardwareSpec, dtype: str) -> float | None:
    key = PEAK_KEY.get(dtype, dtype)
    value = hw.peak_flops_per_s.get(key)
    return float(value) if value else None


def gemm_terms(hw: HardwareSpec, dtype: str, m: Sizes, n: Sizes, k: Sizes) -> tuple[FloatArray, FloatArray]:
    """(t_c, t_m) of GEMMs [m, k] × [k, n] in ``dtype`` on ``hw`` (16-bit output)."""
    peak = _peak(hw, dtype)
    if peak is None:
        raise ValueError(f"{hw.name} has no {PEAK_KEY.get(dtype, dtype)} peak")
    m, n, k = (np.asarray(v, np.float64) for v in (m, n, k))
    b = DTYPE_BYTES[dtype]
    t_c = 2.0 * m * n * k / peak
    t_m = ((m * k + k * n) * b + 2.0 * m * n) / hw.memory_bandwidth_bytes_per_s
    return t_c, t_m


def decode_terms(
    hw: HardwareSpec, kv_dtype: str, batch: Sizes, ctx: Sizes, nq: Sizes, nkv: Sizes, d: Sizes
) -> tuple[FloatArray, FloatArray]:
    """(t_c, t_m) of one decode-attention call: ``batch`` queries over ``ctx`` cached tokens."""
    b, c, q, kv, hd = (np.asarray(v, np.float64) for v in (batch, ctx, nq, nkv, d))
    t_c = 4.0 * b * c * q * hd / hw.peak_flops_per_s["bf16"]
    t_m = (b * c * 2.0 * kv * hd * KV_BYTES[kv_dtype] + 4.0 * b * q * hd) / hw.memory_bandwidth_bytes_per_s
    return t_c, t_m


def prefill_terms(
    hw: HardwareSpec, kv_dtype: str, batch: Sizes, isl: Sizes, nq: Sizes, nkv: Sizes, d: Sizes
) -> tuple[FloatArray, FloatArray]:
    """(t_c, t_m) of one causal prefill-attention call of ``batch`` sequences of ``isl`` tokens."""
    b, s, q, kv, hd = (np.asarray(v, np.float64) for v in (batch, isl, nq, nkv, d))
    t_c = 2.0 * b * s * (s + 1.0) * q * hd / hw.peak_flops_per_s["bf16"]
    t_m = b * s * (2.0 * q + 2.0 * kv) * hd * 2.0 / hw.memory_bandwidth_bytes_per_s
    return t_c, t_m


def moe_terms(
    hw: HardwareSpec,
    dtype: str,
    tokens: Sizes,
    h: Sizes,
    inter: Sizes,
    topk: Sizes,
    experts: Sizes,
    moe_tp: Sizes,
    moe_ep: Sizes,
) -> tuple[FloatArray, FloatArray]:
    """(t_c, t_m) of one fused-MoE layer call on one rank (gate+up and down of the experts its
    tokens touch; uniform routing's expected number of distinct experts on the rank)."""
    peak = _peak(hw, dtype)
    if peak is None:
        raise ValueError(f"{hw.name} has no {PEAK_KEY.get(dtype, dtype)} peak")
    t, hh, ii, kk, ee, tp, ep = (np.asarray(v, np.float64) for v in (tokens, h, inter, topk, experts, moe_tp, moe_ep))
    shard = ii / tp
    local = ee / ep
    touched = local * (1.0 - (1.0 - np.minimum(kk / ee, 1.0)) ** t)
    t_c = 6.0 * t * kk / ep * hh * shard / peak
    nbytes = touched * 3.0 * hh * shard * DTYPE_BYTES[dtype] + t * hh * 2.0 * 2.0 + t * kk / ep * shard * 2.0 * 2.0
    return t_c, nbytes / hw.memory_bandwidth_bytes_per_s


# ---------------------------------------------------------------------------- fitting rows


def moe_family(dtype: str, moe_tp: int, moe_ep: int) -> str:
    """The MoE family of one dtype and sharding: one curve per (tp, ep) of the expert layer, as
    the measured time does not follow the ideal 1 / (tp·ep) of the work per rank (the routing,
    permutation and gather of every token are not sharded, and a narrower shard runs its GEMMs
    less efficiently: H100, h = 2,048, 128 experts top-8, 16,384 tokens, balanced routing:
    2.91 ms unsharded, 1.88 ms at ep = 2, 1.36 ms at ep = 4, 1.30 ms at tp = 4)."""
    return f"moe:{dtype}:tp{moe_tp}ep{moe_ep}"


def family_rows(prof: Profile, hw: HardwareSpec) -> dict[str, pl.DataFrame]:
    """The rows of one measured profile the prior is fitted on, as (t_c, t_m, time_s, tokens)
    per family; ``tokens`` splits the decode (1-127) from the prefill regime (128+)."""
    out: dict[str, pl.DataFrame] = {}

    def put(family: str, t_c: FloatArray, t_m: FloatArray, t: FloatArray, tokens: FloatArray) -> None:
        ok = np.isfinite(t) & (t > 0) & ((t_c > 0) | (t_m > 0))
        if ok.any():
            out[family] = pl.DataFrame({"t_c": t_c[ok], "t_m": t_m[ok], "time_s": t[ok], "tokens": tokens[ok]})

    g = prof.frame("gemm")
    if g.height:
        g = g.filter((pl.col("n") >= MIN_GEMM_DIM) & (pl.col("k") >= MIN_GEMM_DIM))
        for (dtype,), sub in g.group_by(["dtype"], maintain_order=True):
            dt = str(dtype)
            if dt not in DTYPE_BYTES or _peak(hw, dt) is None:
                continue
            m = sub["m"].to_numpy().astype(np.float64)
            t_c, t_m = gemm_terms(hw, dt, m, sub["n"].to_numpy(), sub["k"].to_numpy())
            put(f"gemm:{dt}", t_c, t_m, sub["time_s"].to_numpy(), m)
    for fam, size, terms in (("attn_decode", "ctx", decode_terms), ("attn_prefill", "isl", prefill_terms)):
        f = prof.frame(fam)
        parts = []
        for (kv,), sub in f.group_by(["kv_dtype"], maintain_order=True) if f.height else []:
            if str(kv) not in KV_BYTES:
                continue
            batch = sub["batch"].to_numpy().astype(np.float64)
            length = sub[size].to_numpy().astype(np.float64)
            t_c, t_m = terms(
                hw, str(kv), batch, length, sub["nq"].to_numpy(), sub["nkv"].to_numpy(), sub["d"].to_numpy()
            )
            tokens = batch if fam == "attn_decode" else batch * length
            parts.append((t_c, t_m, sub["time_s"].to_numpy(), tokens))
        if parts:
            put(fam, *(np.concatenate([p[i] for p in parts]) for i in range(4)))
    mo = prof.frame("moe")
    if mo.height:
        mo = mo.filter(pl.col("distribution") == MOE_ROUTING)
        for (dtype, mtp, mep), sub in mo.group_by(["dtype", "moe_tp", "moe_ep"], maintain_order=True):
            dt = str(dtype)
            if dt not in DTYPE_BYTES or _peak(hw, dt) is None:
                continue
            tok = sub["tokens"].to_numpy().astype(np.float64)
            t_c, t_m = moe_terms(
                hw, dt, tok, *(sub[c].to_numpy() for c in ("h", "inter", "topk", "experts", "moe_tp", "moe_ep"))
            )
            put(moe_family(dt, int(mtp), int(mep)), t_c, t_m, sub["time_s"].to_numpy(), tok)
    return out


def _profiles(folder: Path | None, gpus: Iterable[str] | None) -> dict[str, Profile]:
    """The measured profiles of ``folder`` (default: the catalog's), by catalog GPU name."""
    if folder is None or folder.resolve() == PROFILES_DIR.resolve():
        names = list(gpus) if gpus is not None else list_profiles()
        return {g: p for g in names if (p := load_profile(g)) is not None}
    names = (
        list(gpus) if gpus is not None else sorted(d.name for d in folder.iterdir() if (d / "profile.toml").exists())
    )
    return {g: load_profile_dir(folder / g) for g in names if (folder / g / "profile.toml").exists()}


def measured_rows(gpus: Iterable[str] | None = None, folder: Path | None = None) -> dict[str, dict[str, pl.DataFrame]]:
    """``{gpu: family_rows}`` of the measured profiles in ``folder`` (the catalog's by default;
    all of them unless ``gpus``); a profile of a GPU the catalog does not know is left out."""
    out: dict[str, dict[str, pl.DataFrame]] = {}
    for gpu, prof in _profiles(folder, gpus).items():
        try:
            hw = load_hardware(gpu)
        except ConfigError:
            continue
        out[gpu] = family_rows(prof, hw)
    return out


def _sample(frame: pl.DataFrame, k: int) -> pl.DataFrame:
    """Exactly ``k`` rows of ``frame``: evenly spaced when it has more, every row repeated in turn
    when it has fewer — so that each GPU enters a fit with the same number of rows and weighs the
    same whatever the loss does with large residuals."""
    if frame.height >= k:
        idx = np.linspace(0, frame.height - 1, k).round().astype(np.int64)
    else:
        idx = np.resize(np.arange(frame.height, dtype=np.int64), k)
    return frame[idx]


def fit_curve(rows: Mapping[str, pl.DataFrame]) -> PriorCurve:
    """Fit one family's curve on ``{gpu: rows}``, every GPU weighted equally (module doc)."""
    from scipy.optimize import least_squares

    present = [f for f in rows.values() if f.height]
    if not present:
        raise ValueError("no rows to fit")
    k = min(FIT_ROWS_PER_GPU, max(f.height for f in present))
    frames = [_sample(f, k) for f in present]
    t_c = np.concatenate([f["t_c"].to_numpy() for f in frames])
    t_m = np.concatenate([f["t_m"].to_numpy() for f in frames])
    t = np.concatenate([f["time_s"].to_numpy() for f in frames])
    w = np.ones(t.size)  # every GPU enters with the same number of rows (_sample)
    lo = np.log([FLOOR_BOUNDS[0], EFF_BOUNDS[0], EFF_BOUNDS[0], BLEND_BOUNDS[0]])
    hi = np.log([FLOOR_BOUNDS[1], EFF_BOUNDS[1], EFF_BOUNDS[1], BLEND_BOUNDS[1]])
    floor0 = float(np.clip(np.quantile(t, 0.01) * 0.5, FLOOR_BOUNDS[0] * 2, FLOOR_BOUNDS[1] / 2))

    def curve(p: FloatArray) -> PriorCurve:
        e = np.exp(p)
        return PriorCurve(float(e[0]), float(e[1]), float(e[2]), float(e[3]))

    def resid(p: FloatArray) -> FloatArray:
        return np.asarray(w * np.log(curve(p).time(t_c, t_m) / t))

    x0 = np.log([floor0, 0.6, 0.7, 3.0])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    res = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=LOSS_SCALE)
    return curve(res.x)


def families(rows: Mapping[str, Mapping[str, pl.DataFrame]]) -> dict[str, list[str]]:
    """``{family: [gpus that measured it]}``, families measured on at least MIN_GPUS GPUs."""
    seen: dict[str, list[str]] = {}
    for gpu, fams in rows.items():
        for fam, frame in fams.items():
            if frame.height:
                seen.setdefault(fam, []).append(gpu)
    return {fam: sorted(g) for fam, g in sorted(seen.items()) if len(g) >= MIN_GPUS}


def fit_prior(rows: Mapping[str, Mapping[str, pl.DataFrame]]) -> dict[str, PriorCurve]:
    """One curve per family on every GPU of ``rows`` that measured it."""
    return {fam: fit_curve({g: rows[g][fam] for g in gpus}) for fam, gpus in families(rows).items()}


# ---------------------------------------------------------------------------- the held-out check


def _stats(pred: FloatArray, meas: FloatArray) -> dict[str, float]:
    rel = pred / meas - 1.0
    err = np.abs(rel)
    return {
        "median_abs_error": float(np.median(err)),
        "p90_abs_error": float(np.quantile(err, 0.9)),
        "bias": float(np.median(rel)),
    }


def roofline_time(hw: HardwareSpec, t_c: FloatArray, t_m: FloatArray) -> FloatArray:
    """The plain roofline (tier 2 without the prior) on the same terms: the catalog's constant
    efficiency factors and kernel floor."""
    return np.asarray(np.maximum(np.maximum(t_c / hw.compute_efficiency, t_m / hw.memory_efficiency), hw.min_kernel_s))


def leave_one_gpu_out(rows: Mapping[str, Mapping[str, pl.DataFrame]]) -> pl.DataFrame:
    """Every measured GPU's rows predicted by a prior fitted on the OTHER GPUs, per family and
    token range, beside the plain roofline's error on the same rows."""
    out: list[dict[str, Any]] = []
    for fam, gpus in families(rows).items():
        for gpu in gpus:
            others = {g: rows[g][fam] for g in gpus if g != gpu}
            curve = fit_curve(others)
            f = rows[gpu][fam]
            hw = load_hardware(gpu)
            t_c, t_m, t, tok = (f[c].to_numpy() for c in ("t_c", "t_m", "time_s", "tokens"))
            pred = curve.time(t_c, t_m)
            base = roofline_time(hw, t_c, t_m)
            for label, mask in (("1-127", tok < 128), ("128+", tok >= 128)):
                if not mask.any():
                    continue
                p = _stats(pred[mask], t[mask])
                r = _stats(base[mask], t[mask])
                out.append(
                    {
                        "gpu": gpu,
                        "family": fam,
                        "tokens": label,
                        "rows": int(mask.sum()),
                        "fitted_on": ", ".join(g for g in gpus if g != gpu),
                        **p,
                        "roofline_median_abs_error": r["median_abs_error"],
                        "roofline_p90_abs_error": r["p90_abs_error"],
                        "roofline_bias": r["bias"],
                    }
                )
    return pl.DataFrame(out)


# ---------------------------------------------------------------------------- the catalog file


@dataclass(frozen=True)
class Prior:
    curves: Mapping[str, PriorCurve]
    fitted: Mapping[str, float]
    fitted_on: Mapping[str, list[str]]
    rows: Mapping[str, int]
    #: families whose curve is used at replay time (:func:`family_verdicts`)
    used: frozenset[str] = frozenset()


def family_verdicts(loo: pl.DataFrame) -> dict[str, tuple[bool, float, float]]:
    """Per family: (used, prior's error, plain roofline's error), each error the median over
    held-out GPUs of their median absolute error (both token ranges). A family's curve prices
    replays only when, held out by whole GPU, it beats the plain roofline on that figure and
    stays within MAX_USED_ERROR: where the measured GPUs run different kernels for one family
    (FP8 fused MoE is a FlashInfer CUTLASS kernel on Hopper and Triton elsewhere; block-scaled FP8
    GEMMs are DeepGEMM on Hopper), one curve over all of them is no prior at all."""
    out: dict[str, tuple[bool, float, float]] = {}
    if loo.height == 0:
        return out
    per_gpu = loo.group_by("family", "gpu").agg(
        pl.col("median_abs_error").mean().alias("p"), pl.col("roofline_median_abs_error").mean().alias("r")
    )
    for fam, sub in per_gpu.group_by("family"):
        p = float(sub["p"].median())  # type: ignore[arg-type]
        r = float(sub["r"].median())  # type: ignore[arg-type]
        out[str(fam[0])] = (p < r and p <= MAX_USED_ERROR, p, r)
    return out


def fitted_scalars(gpus: Iterable[str], folder: Path | None = None) -> dict[str, float]:
    """The measured profiles' other fitted values (eager launch cost, sampler rule, kernel
    floor under CUDA graphs), as their median over GPUs: an unmeasured GPU's best guess."""
    vals: dict[str, list[float]] = {}
    for prof in _profiles(folder, gpus).values():
        for key in (
            "eager_call_overhead_s",
            "graph_kernel_floor_s",
            "sampler_fixed_s",
            "sampler_s_per_logit_byte_per_bw",
        ):
            v = prof.meta.fitted.get(key)
            if isinstance(v, int | float) and math.isfinite(v) and v > 0:
                vals.setdefault(key, []).append(float(v))
    return {k: float(np.median(v)) for k, v in sorted(vals.items())}


def _fmt(x: float) -> str:
    return repr(float(f"{x:.6g}"))


def prior_toml(
    rows: Mapping[str, Mapping[str, pl.DataFrame]],
    curves: Mapping[str, PriorCurve],
    loo: pl.DataFrame,
    folder: Path | None = None,
) -> str:
    """The text of prior.toml: fitted curves, where they came from, the held-out check."""
    fams = families(rows)
    lines = [
        "# Size-aware roofline prior for GPUs without a measured profile, written by",
        "# `rooftrace calibrate --measurements` from the measured profiles beside this file.",
        "# t = floor_s + ((t_c / compute_eff)^blend + (t_m / memory_eff)^blend)^(1 / blend);",
        "# t_c, t_m = the operator's FLOPs / datasheet peak and bytes / datasheet bandwidth",
        "# (pipeline/costmodel/profile/prior.py). docs/validation.md, tier 2.",
        f"gpus = [{', '.join(repr(g).replace(chr(39), chr(34)) for g in sorted(rows))}]",
        "",
        "[fitted]",
    ]
    for key, value in fitted_scalars(rows, folder).items():
        lines.append(f"{key} = {_fmt(value)}")
    verdicts = family_verdicts(loo)
    for fam, curve in curves.items():
        n = sum(rows[g][fam].height for g in fams[fam])
        used, p, r = verdicts.get(fam, (False, float("nan"), float("nan")))
        lines += ["", f'[curves."{fam}"]']
        lines += [f"{k} = {_fmt(v)}" for k, v in curve.as_dict().items()]
        lines.append(f"used = {'true' if used else 'false'}")
        if math.isfinite(p):
            lines.append(f"heldout_median_abs_error = {p:.4f}")
            lines.append(f"roofline_median_abs_error = {r:.4f}")
        lines.append(f"rows = {n}")
        lines.append("fitted_on = [" + ", ".join(f'"{g}"' for g in fams[fam]) + "]")
    for row in loo.iter_rows(named=True):
        lines += ["", f'[leave_one_gpu_out."{row["gpu"]}"."{row["family"]}, {row["tokens"]}"]']
        lines.append(f"rows = {row['rows']}")
        for key in (
            "median_abs_error",
            "p90_abs_error",
            "bias",
            "roofline_median_abs_error",
            "roofline_p90_abs_error",
            "roofline_bias",
        ):
            lines.append(f"{key} = {float(row[key]):.4f}")
    return "\n".join(lines) + "\n"


def write_prior(folder: Path | None = None) -> tuple[Path, pl.DataFrame] | None:
    """Fit the prior on the measured profiles in ``folder`` (default: the catalog's) and write
    ``prior.toml`` beside them atomically; returns its path and the leave-one-GPU-out table,
    or None when fewer than MIN_GPUS profiles share a family (nothing to fit)."""
    rows = measured_rows(folder=folder)
    curves = fit_prior(rows)
    if not curves:
        return None
    loo = leave_one_gpu_out(rows)
    path = (folder or PROFILES_DIR) / "prior.toml"
    atomic_write_bytes(path, prior_toml(rows, curves, loo, folder).encode())
    load_prior.cache_clear()
    return path, loo


@cache
def load_prior(path: Path = PRIOR_PATH) -> Prior | None:
    """The catalog's prior, or None when it has none."""
    if not path.exists():
        return None
    data = read_toml(path, "roofline prior")
    curves: dict[str, PriorCurve] = {}
    fitted_on: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    used: set[str] = set()
    raw = data.get("curves", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [curves] must be a table")
    for fam, c in raw.items():
        if not known_family(str(fam)):
            raise ConfigError(
                f"{path}: [curves] unknown family {str(fam)[:60]!r} "
                "(gemm:<dtype>, attn_decode, attn_prefill, moe:<dtype>:tp<N>ep<N>)"
            )
        if not isinstance(c, dict):
            raise ConfigError(f"{path}: [curves.{fam!r}] must be a table")
        try:
            vals = [c[k] for k in ("floor_s", "compute_eff", "memory_eff", "blend")]
            if any(isinstance(v, bool) or not isinstance(v, int | float) for v in vals):
                raise TypeError("a value is not a number")
            curve = PriorCurve(*(float(v) for v in vals))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"{path}: [curves.{fam!r}] needs numbers floor_s, compute_eff, memory_eff, blend ({exc})"
            ) from None
        ok = (
            FLOOR_BOUNDS[0] <= curve.floor_s <= FLOOR_BOUNDS[1]
            and all(EFF_BOUNDS[0] <= e <= EFF_BOUNDS[1] for e in (curve.compute_eff, curve.memory_eff))
            and BLEND_BOUNDS[0] <= curve.blend <= BLEND_BOUNDS[1]
        )
        if not ok:
            raise ConfigError(f"{path}: [curves.{fam!r}] outside the fit's bounds: {curve}")
        curves[str(fam)] = curve
        n = c.get("rows", 0)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"{path}: [curves.{fam!r}] rows must be a row count, got {str(n)[:40]!r}")
        on = c.get("fitted_on", [])
        if not isinstance(on, list) or not all(isinstance(g, str) for g in on):
            raise ConfigError(f"{path}: [curves.{fam!r}] fitted_on must be a list of GPU names")
        if not isinstance(c.get("used", False), bool):
            raise ConfigError(f"{path}: [curves.{fam!r}] used must be true or false")
        fitted_on[str(fam)] = list(on)
        rows[str(fam)] = n
        if c.get("used", False) is True:
            used.add(str(fam))
    raw_fitted = data.get("fitted", {})
    if not isinstance(raw_fitted, dict):
        raise ConfigError(f"{path}: [fitted] must be a table")
    fitted: dict[str, float] = {}
    for key, v in raw_fitted.items():
        ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and 0 < v < FITTED_MAX
        if not ok:
            raise ConfigError(
                f"{path}: [fitted] {key} must be a positive number below {FITTED_MAX:g}, got {str(v)[:40]!r}"
            )
        fitted[str(key)] = float(v)
    if not used:
        return None  # nothing the replay could use: the plain roofline, as without a file
    return Prior(curves, fitted, fitted_on, rows, frozenset(used))


#: Fitted scalars of prior.toml (seconds, or the sampler's passes over the logits) are below this.
FITTED_MAX = 100.0


def known_family(family: str) -> bool:
    """Whether ``family`` names one of the prior's operator families (module doc)."""
    parts = family.split(":")
    if family in ("attn_decode", "attn_prefill"):
        return True
    if parts[0] == "gemm" and len(parts) == 2:
        return parts[1] in DTYPE_BYTES
    if parts[0] == "moe" and len(parts) == 3:
        import re

        return parts[1] in DTYPE_BYTES and re.fullmatch(r"tp[1-9][0-9]{0,3}ep[1-9][0-9]{0,3}", parts[2]) is not None
    return False


# ---------------------------------------------------------------------------- collectives

#: Two GPUs share collective curves when their links are the same kind and their per-direction
#: bandwidths agree within this share.
LINK_MATCH_REL = 0.1
#: Links whose curves are lent: NVLink, where the check below holds (H100 SXM and H200). Over
#: PCIe the custom all-reduce's peer-to-peer path runs through the host's root complex and
#: switches (vLLM's own P2P test decides whether it may be used at all), so two cards of one
#: PCIe generation need not behave alike, and no profiled pair shares a PCIe link to check it:
#: PCIe GPUs keep the plain roofline's link.
DONOR_LINKS = ("nvlink",)


def collective_donor(hw: HardwareSpec, exclude: Iterable[str] = ()) -> tuple[str, Profile] | None:
    """The profiled GPU whose measured all-reduce curves an unprofiled ``hw`` borrows: same
    vendor, same NVLink generation (DONOR_LINKS) and link bandwidth within LINK_MATCH_REL; the
    closest bandwidth first, then the name. vLLM's custom all-reduce and NCCL
    are bound by the link and its latency, not by the GPU's SMs: H100 SXM's curves predict H200's
    measured rows within 3.0 % (median; p90 9.3 %), where GPUs on other links miss by 40-111 %
    and the plain roofline's link by 26-72 % (docs/validation.md). None when no profiled GPU
    shares the link, and for PCIe links (DONOR_LINKS)."""
    if not hw.peer_to_peer or not hw.link_kind.lower().startswith(DONOR_LINKS):
        return None
    best: tuple[float, str, Profile] | None = None
    for gpu in list_profiles():
        if gpu == hw.name or gpu in exclude:
            continue
        try:
            other = load_hardware(gpu)
        except ConfigError:
            continue
        if not other.peer_to_peer:  # its collectives ran without the custom all-reduce
            continue
        prof = load_profile(gpu)
        if prof is None or prof.frame("allreduce").height == 0:
            continue
        if other.vendor.lower() != hw.vendor.lower() or other.link_kind.lower() != hw.link_kind.lower():
            continue
        gap = abs(other.link_bandwidth_bytes_per_s / hw.link_bandwidth_bytes_per_s - 1.0)
        if gap > LINK_MATCH_REL:
            continue
        if best is None or (gap, gpu) < (best[0], best[1]):
            best = (gap, gpu, prof)
    return (best[1], best[2]) if best is not None else None


def collective_donor_check() -> pl.DataFrame:
    """Each profiled GPU that has a same-link donor among the OTHER profiled GPUs: its measured
    all-reduce rows predicted by the donor's curves (what an unprofiled GPU on that link gets),
    beside the plain roofline's link on the same rows."""
    out: list[dict[str, Any]] = []
    for gpu in list_profiles():
        hw = load_hardware(gpu)
        prof = load_profile(gpu)
        donor = collective_donor(hw, exclude=())
        if prof is None or donor is None or prof.frame("allreduce").height == 0:
            continue
        f = prof.frame("allreduce")
        for (backend, gpus), sub in f.group_by(["backend", "gpus"], maintain_order=True):
            curve = donor[1].allreduce_curve(str(backend), int(gpus))
            if curve is None:
                continue
            nbytes = sub["bytes"].to_numpy().astype(np.float64)
            t = sub["time_s"].to_numpy()
            g = float(gpus)
            # the plain roofline's collective: the same ring-scaled bytes and one call's latency
            # (an all-reduce moves 2(g-1)/g of the tensor through each GPU, an all-gather or a
            # reduce-scatter half that)
            halves = 1.0 if str(backend) in ("nccl_all_gather", "nccl_reduce_scatter") else 2.0
            ring = Op(str(backend), "comm", 1, np.zeros_like(nbytes), halves * (g - 1.0) / g * nbytes)
            roof = comm_time(hw, ring)
            for pred, kind in ((curve(nbytes), "donor"), (roof, "roofline")):
                rel = pred / t - 1.0
                out += [
                    {"gpu": gpu, "donor": donor[0], "backend": str(backend), "gpus": int(gpus), "bytes": float(b),
                     "predictor": kind, "error": float(e)}
                    for b, e in zip(nbytes, rel, strict=True)
                ]  # fmt: skip
    return pl.DataFrame(out)


# ---------------------------------------------------------------------------- same-die donors

#: What each profile family's rows are keyed by, beside its size column(s).
_SHAPE_KEYS = {
    "gemm": ("dtype", "n", "k"),
    "attn_decode": ("kv_dtype", "nq", "nkv", "d"),
    "attn_prefill": ("kv_dtype", "nq", "nkv", "d"),
    "moe": ("dtype", "distribution", "moe_tp", "moe_ep", "h", "inter", "topk", "experts"),
}


#: Measurement sets whose operator tables time each kernel alone (AIConfigurator's vLLM
#: operator sweeps): the only tables a same-die GPU borrows. RTX 4090's per-layer LLMServingSim
#: timings predicted from L40S's AIConfigurator tables (both AD102) miss its GEMMs by 17-39 %
#: (median), worse than the prior alone; the GH100 pair, one harness, 2-11 % for bf16 GEMMs and
#: attention (docs/validation.md, "Same-die donors").
DONOR_SETS = frozenset({"aiconfigurator"})


def kernel_level(prof: Profile) -> bool:
    """Whether ``prof``'s GEMM, attention and MoE tables all come from DONOR_SETS."""
    sets: set[str] = set()
    for fam in ("gemm", "attn_decode", "attn_prefill", "moe"):
        f = prof.frame(fam)
        if f.height and "set" in f.columns:
            sets |= set(f["set"].unique().to_list())
    return bool(sets) and sets <= DONOR_SETS


#: A same-die donor lends only within this factor of the GPU's own datasheet, in memory bandwidth
#: and in the bf16 peak: the checked pair (H100 SXM and H200) differ 1.43× in bandwidth and the
#: catalog's lent pairs at most 1.68× (H100 PCIe: 2.0 against 3.35 TB/s) and 1.31× in peak; a
#: hardware file claiming a die with a datasheet far from every profiled GPU on it (an L4's
#: 300 GB/s labelled GH100) is no die-mate of theirs: it gets the prior's curves.
DONOR_MAX_RATIO = 2.0


def die_donor(hw: HardwareSpec, exclude: Iterable[str] = ()) -> tuple[str, Profile] | None:
    """The profiled GPU on the same die as an unprofiled ``hw`` (``die`` in the hardware entry:
    H100 PCIe and H200 on H100 SXM's GH100, A100 40 GB on A100 80 GB's GA100, GB200 on B200's
    GB100), the closest memory bandwidth first, then the name; None when no profiled GPU of the
    same vendor shares the die. GPUs on one die run the same kernels with the same tile and wave
    choices; what differs (SMs enabled, clocks, memory) is in the datasheet figures that scale
    the donor's tables (:func:`donor_times`)."""
    if not hw.die:
        return None
    best: tuple[float, str, Profile] | None = None
    for gpu in list_profiles():
        if gpu == hw.name or gpu in exclude:
            continue
        try:
            other = load_hardware(gpu)
        except ConfigError:
            continue
        if other.die.lower() != hw.die.lower() or other.vendor.lower() != hw.vendor.lower():
            continue
        ratios = (
            other.memory_bandwidth_bytes_per_s / hw.memory_bandwidth_bytes_per_s,
            other.peak_flops_per_s["bf16"] / hw.peak_flops_per_s["bf16"],
        )
        if any(not (1.0 / DONOR_MAX_RATIO <= r <= DONOR_MAX_RATIO) for r in ratios):
            continue
        prof = load_profile(gpu)
        if prof is None or not kernel_level(prof):
            continue
        gap = abs(math.log(other.memory_bandwidth_bytes_per_s / hw.memory_bandwidth_bytes_per_s))
        if best is None or (gap, gpu) < (best[0], best[1]):
            best = (gap, gpu, prof)
    return (best[1], best[2]) if best is not None else None


def _terms(
    family: str, hw: HardwareSpec, key: tuple[Any, ...], size: FloatArray, other: FloatArray | None
) -> tuple[FloatArray, FloatArray] | None:
    """(t_c, t_m) on ``hw`` of one shape ``key`` (_SHAPE_KEYS) at sizes ``size`` (GEMM m, decode
    batch, prefill batch, MoE tokens) and ``other`` (decode context, prefill length); None where
    ``hw`` has no peak for the dtype."""
    try:
        if family == "gemm":
            dt, n, k = key
            return gemm_terms(hw, str(dt), size, float(n), float(k))
        if family in ("attn_decode", "attn_prefill"):
            kv, nq, nkv, d = key
            if str(kv) not in KV_BYTES or other is None:
                return None
            terms = decode_terms if family == "attn_decode" else prefill_terms
            return terms(hw, str(kv), size, other, float(nq), float(nkv), float(d))
        dt, _, mtp, mep, h, inter, topk, experts = key
        return moe_terms(hw, str(dt), size, float(h), float(inter), float(topk), float(experts), float(mtp), float(mep))
    except (ValueError, KeyError):
        return None


def _bf16_peak(hw: HardwareSpec, dtype: str) -> HardwareSpec:
    """``hw`` with the bf16 peak standing in for ``dtype``'s missing one."""
    from dataclasses import replace

    key = PEAK_KEY.get(dtype, dtype)
    return replace(hw, peak_flops_per_s={**hw.peak_flops_per_s, key: hw.peak_flops_per_s["bf16"]})


def _curve_key(family: str, key: tuple[Any, ...]) -> str:
    if family == "gemm":
        return f"gemm:{key[0]}"
    if family == "moe":
        return moe_family(str(key[0]), int(key[2]), int(key[3]))
    return family


def donor_times(
    family: str,
    shapes: pl.DataFrame,
    donor: Profile,
    donor_hw: HardwareSpec,
    hw: HardwareSpec,
    curves: Mapping[str, PriorCurve],
) -> FloatArray:
    """Times on ``hw`` of the operator rows ``shapes`` (a profile family's columns, without
    ``time_s``) from the same-die ``donor``'s measured tables, each looked up as the donor's own
    replay would (interpolated) and scaled by the family's prior curve on ``hw`` over the same
    curve on the donor's datasheet (the plain roofline's ratio where the family has no curve).
    NaN where the donor's tables do not cover a row (a dtype, head shape or expert shape it did
    not measure) or ``hw`` has no peak for its dtype."""
    out = np.full(shapes.height, np.nan)
    if shapes.height == 0:
        return out
    keys = list(_SHAPE_KEYS[family])
    idx = shapes.with_row_index("_i")
    for key, sub in idx.group_by(keys, maintain_order=True):
        rows = sub["_i"].to_numpy()
        if family == "gemm":
            size, other = sub["m"].to_numpy().astype(np.float64), None
            dt = str(key[0])
            got = donor.gemm_time(dt, float(key[1]), float(key[2]), size) if donor.has_gemm(dt) else None
        elif family in ("attn_decode", "attn_prefill"):
            size = sub["batch"].to_numpy().astype(np.float64)
            other = sub["ctx" if family == "attn_decode" else "isl"].to_numpy().astype(np.float64)
            grid = donor.attention_grid(family, str(key[0]), int(key[1]), int(key[2]), int(key[3]))
            got = grid(size, other) if grid is not None else None
        else:
            size, other = sub["tokens"].to_numpy().astype(np.float64), None
            dt, dist, mtp, mep, h, inter, topk, experts = key
            got = donor.moe_time(
                str(dt), str(dist), int(mtp), int(mep), (int(h), int(inter), int(topk), int(experts)), size
            )
        if got is None:
            continue
        mine = _terms(family, hw, key, size, other)
        theirs = _terms(family, donor_hw, key, size, other)
        if mine is None and theirs is None and family in ("gemm", "moe"):
            # neither GPU has a peak for the format (MXFP4 on Hopper): the die's kernels dequantise
            # to 16 bits and run at that peak on both (docs/catalog.md, "Storage formats")
            mine = _terms(family, _bf16_peak(hw, str(key[0])), key, size, other)
            theirs = _terms(family, _bf16_peak(donor_hw, str(key[0])), key, size, other)
        if mine is None or theirs is None:
            continue
        curve = curves.get(_curve_key(family, key))
        if curve is not None:
            ratio = curve.time(*mine) / curve.time(*theirs)
        else:
            ratio = np.maximum(*mine) / np.maximum(np.maximum(*theirs), 1e-300)
        out[rows] = np.asarray(got, np.float64) * ratio
    return out


def fit_without(
    rows: Mapping[str, Mapping[str, pl.DataFrame]], gpu: str, fits: dict[str, dict[str, PriorCurve]] | None = None
) -> dict[str, PriorCurve]:
    """:func:`fit_prior` on every GPU of ``rows`` but ``gpu`` (remembered in ``fits``: the
    held-out checks of one validate run share them)."""
    if fits is not None and gpu in fits:
        return fits[gpu]
    curves = fit_prior({g: v for g, v in rows.items() if g != gpu})
    if fits is not None:
        fits[gpu] = curves
    return curves


def die_donor_check(
    rows: Mapping[str, Mapping[str, pl.DataFrame]],
    only: str | None = None,
    used: Iterable[str] | None = None,
    fits: dict[str, dict[str, PriorCurve]] | None = None,
) -> pl.DataFrame:
    """Each profiled GPU that has a same-die donor among the OTHER profiled GPUs: its measured
    operator rows (the prior's fitting rows: GEMMs with n, k ≥ 128, attention, balanced-routing
    MoE) predicted from the donor's tables scaled by a prior fitted WITHOUT it, beside that prior
    alone on the same rows (what an unprofiled GPU on that die is priced by, and would be
    without the donor: the prior's curve where its family is ``used``, the plain roofline
    where it is not; every curve when ``used`` is None); ``only``: that GPU alone."""
    used_set = set(used) if used is not None else None
    out: list[dict[str, Any]] = []
    for gpu in sorted(rows):
        prof = load_profile(gpu) if only is None or gpu == only else None
        if prof is None:
            continue
        hw = load_hardware(gpu)
        donor = die_donor(hw)
        if donor is None:
            continue
        donor_hw = load_hardware(donor[0])
        curves = fit_without(rows, gpu, fits)
        for family in _SHAPE_KEYS:
            frame = prof.frame(family)
            if frame.height == 0:
                continue
            if family == "gemm":
                frame = frame.filter((pl.col("n") >= MIN_GEMM_DIM) & (pl.col("k") >= MIN_GEMM_DIM))
            if family == "moe":
                frame = frame.filter(pl.col("distribution") == MOE_ROUTING)
            pred = donor_times(family, frame, donor[1], donor_hw, hw, curves)
            meas = frame["time_s"].to_numpy()
            base = np.full(frame.height, np.nan)
            keys = list(_SHAPE_KEYS[family])
            for key, sub in frame.with_row_index("_i").group_by(keys, maintain_order=True):
                i = sub["_i"].to_numpy()
                fam_key = _curve_key(family, key)
                curve = curves.get(fam_key)
                size_col = {"gemm": "m", "moe": "tokens"}.get(family, "batch")
                other = None if family in ("gemm", "moe") else sub["ctx" if family == "attn_decode" else "isl"]
                size = sub[size_col].to_numpy().astype(np.float64)
                other_v = None if other is None else other.to_numpy().astype(np.float64)
                terms = _terms(family, hw, key, size, other_v)
                if terms is None and family in ("gemm", "moe"):  # no peak for the format: the roofline
                    wide = _terms(family, _bf16_peak(hw, str(key[0])), key, size, other_v)  # runs it in bf16
                    if wide is not None:
                        base[i] = roofline_time(hw, *wide)
                elif terms is not None and used_set is not None and fam_key not in used_set:
                    base[i] = roofline_time(hw, *terms)  # no usable curve: the plain roofline prices it
                elif curve is not None and terms is not None:
                    base[i] = curve.time(*terms)
            if family == "gemm":
                tokens = frame["m"].to_numpy().astype(np.float64)
                fams = frame["dtype"].to_numpy().astype(str)
                fams = np.char.add("gemm:", fams)
            elif family == "attn_decode":
                tokens = frame["batch"].to_numpy().astype(np.float64)
                fams = np.full(frame.height, family)
            elif family == "attn_prefill":
                tokens = (frame["batch"] * frame["isl"]).to_numpy().astype(np.float64)
                fams = np.full(frame.height, family)
            else:
                tokens = frame["tokens"].to_numpy().astype(np.float64)
                fams = np.array([moe_family(str(d), int(t), int(e)) for d, t, e in
                                 zip(frame["dtype"], frame["moe_tp"], frame["moe_ep"], strict=True)])  # fmt: skip
            ok = np.isfinite(pred) & np.isfinite(base) & (meas > 0)
            for fam in sorted(set(fams[ok].tolist())):
                for label, band in (("1-127", tokens < 128), ("128+", tokens >= 128)):
                    mask = ok & band & (fams == fam)
                    if not mask.any():
                        continue
                    d = _stats(pred[mask], meas[mask])
                    p = _stats(base[mask], meas[mask])
                    out.append(
                        {
                            "gpu": gpu,
                            "donor": donor[0],
                            "family": fam,
                            "tokens": label,
                            "rows": int(mask.sum()),
                            **d,
                            "prior_median_abs_error": p["median_abs_error"],
                            "prior_p90_abs_error": p["p90_abs_error"],
                            "prior_bias": p["bias"],
                        }
                    )
    return pl.DataFrame(out)


# ---------------------------------------------------------------------------- a synthetic profile

#: Size grids the prior is evaluated on for a deployment (dense enough that the profile's
#: log-log interpolation between them is exact to well under 1 % on these smooth curves).
_M_GRID = np.unique(np.concatenate([np.arange(1, 513), np.round(np.geomspace(512, 262144, 160))]).astype(np.int64))
_POW2 = 2 ** np.arange(0, 19)  # 1 .. 262,144


def prior_profile(
    hw: HardwareSpec, dep: Any, prior: Prior, gemm_shapes: Iterable[tuple[int, int]], use_donor: bool = True
) -> Profile:
    """A :class:`Profile` for ``hw`` holding the prior evaluated on the deployment's own shapes:
    GEMMs ``gemm_shapes`` (n, k) in every dtype the GPU has a peak for, the model's attention
    head shape in bf16 and fp8 KV, and its expert shape under ``MOE_ROUTING``. Where a profiled
    GPU shares ``hw``'s die (:func:`die_donor`; not with ``use_donor=False``), its measured
    tables scaled to ``hw`` (:func:`donor_times`) come first, in every dtype and routing it
    measured; the prior's curves fill what they do not cover."""
    m = dep.model
    donor = die_donor(hw) if use_donor else None
    donor_hw = load_hardware(donor[0]) if donor is not None else None

    supplied: set[str] = set()  # what the donor's tables priced: "gemm:<dtype>", "attn_decode", ...

    def priced(family: str, frame: pl.DataFrame, curve: PriorCurve | None, terms: Any, label: str) -> pl.DataFrame:
        """``frame``'s shapes with times: the donor's where it has them, else ``curve``'s on
        ``terms()`` (the rows' t_c, t_m), else the row is dropped."""
        t = np.full(frame.height, np.nan)
        if donor is not None and donor_hw is not None:
            t = donor_times(family, frame, donor[1], donor_hw, hw, prior.curves)
            if np.isfinite(t).any():
                supplied.add(label)
        missing = ~np.isfinite(t)
        if curve is not None and missing.any():
            t_c, t_m = terms()
            t[missing] = curve.time(t_c, t_m)[missing]
        keep = np.isfinite(t) & (t > 0)
        return frame.with_columns(pl.Series("time_s", t)).filter(pl.Series(keep))

    def used(family: str) -> PriorCurve | None:
        return prior.curves.get(family) if family in prior.used else None

    frames: dict[str, pl.DataFrame] = {}
    gem = []
    shapes = sorted(set(gemm_shapes))
    dtypes = {fam.split(":", 1)[1] for fam in prior.used if fam.startswith("gemm:")}
    lent = {dt for dt in donor[1].gemm_dtypes() if dt in DTYPE_BYTES} if donor is not None else set()
    for dt in sorted(dtypes | lent):
        if _peak(hw, dt) is None and dt not in lent:  # (a lent format runs as on the donor: donor_times)
            continue
        for n, k in shapes:
            mm = _M_GRID.astype(np.float64)
            f = pl.DataFrame({"dtype": dt, "m": _M_GRID, "n": n, "k": k})
            gem.append(
                priced(
                    "gemm",
                    f,
                    used(f"gemm:{dt}") if _peak(hw, dt) is not None else None,
                    lambda mm=mm, n=n, k=k, dt=dt: gemm_terms(hw, dt, mm, np.full(mm.size, n), np.full(mm.size, k)),
                    f"gemm:{dt}",
                )
            )
    gem = [g for g in gem if g.height]
    if gem:
        frames["gemm"] = pl.concat(gem)
    if not m.is_mla:
        nq = m.num_attention_heads // dep.tp
        nkv = max(1, m.num_kv_heads // dep.tp)
        for fam, size, terms, sizes in (
            ("attn_decode", "ctx", decode_terms, _POW2),
            ("attn_prefill", "isl", prefill_terms, _POW2[:18]),
        ):
            bb, ll = np.meshgrid(_POW2[:13].astype(np.float64), sizes.astype(np.float64), indexing="ij")
            parts = []
            for kv in ("bf16", "fp8"):
                f = pl.DataFrame(
                    {
                        "kv_dtype": kv,
                        "nq": nq,
                        "nkv": nkv,
                        "d": m.head_dim,
                        "batch": bb.ravel().astype(np.int64),
                        size: ll.ravel().astype(np.int64),
                    }
                )
                got = priced(
                    fam,
                    f,
                    used(fam),
                    lambda kv=kv, terms=terms, bb=bb, ll=ll: terms(hw, kv, bb.ravel(), ll.ravel(), nq, nkv, m.head_dim),
                    fam,
                )
                if got.height:
                    parts.append(got)
            if parts:
                frames[fam] = pl.concat(parts)
    if m.is_moe:
        moe_tp, moe_ep = (1, dep.ep) if dep.ep > 1 else (dep.moe_shards, 1)
        tok = np.unique(np.concatenate([np.arange(1, 257), np.round(np.geomspace(256, 1 << 20, 120))])).astype(np.int64)
        shape = (m.hidden_size, m.moe_intermediate_size, m.experts_per_token, m.num_experts)
        moe_dtypes = {fam.split(":")[1] for fam in prior.used if fam.startswith("moe:")}
        lent = {dt for dt in donor[1].moe_dtypes() if dt in DTYPE_BYTES} if donor is not None else set()
        parts = []
        for dt in sorted(moe_dtypes | lent):
            if _peak(hw, dt) is None and dt not in lent:
                continue
            for dist in MOE_DISTRIBUTIONS:
                if dist != MOE_ROUTING and donor is None:
                    continue
                f = pl.DataFrame(
                    {
                        "dtype": dt,
                        "distribution": dist,
                        "moe_tp": moe_tp,
                        "moe_ep": moe_ep,
                        "h": shape[0],
                        "inter": shape[1],
                        "topk": shape[2],
                        "experts": shape[3],
                        "tokens": tok,
                    }
                )
                curve = (
                    used(moe_family(dt, moe_tp, moe_ep)) if dist == MOE_ROUTING and _peak(hw, dt) is not None else None
                )
                got = priced(
                    "moe",
                    f,
                    curve,
                    lambda dt=dt: moe_terms(hw, dt, tok.astype(np.float64), *shape, moe_tp, moe_ep),
                    f"moe:{dt}",
                )
                if got.height:
                    parts.append(got)
        if parts:
            frames["moe"] = pl.concat(parts)
    stack = {"prior": "size-aware roofline prior (pipeline/catalog/profiles/prior.toml), no measurement of this GPU"}
    if donor is not None and supplied:
        stack["scaled_from"] = donor[0]
        stack["die"] = hw.die
        stack["scaled_families"] = ",".join(sorted(supplied))
        if donor_hw is not None:
            stack["bandwidth_ratio"] = f"{hw.memory_bandwidth_bytes_per_s / donor_hw.memory_bandwidth_bytes_per_s:.3g}"
    coll = collective_donor(hw)
    if coll is not None:
        frames["allreduce"] = coll[1].frame("allreduce")
        stack["collectives_from"] = coll[0]
    meta = ProfileMeta(
        gpu=hw.name,
        stack=stack,
        built_from=("prior.toml",),
        rows={fam: f.height for fam, f in frames.items()},
        selection={},
        fitted={**prior.fitted, "attention_tile_tokens": 0.0},
        heldout={},
        licence="",
    )
    return Profile(meta, frames)
