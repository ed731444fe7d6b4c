"""Judge a profile's interpolation on rows it was not built from — held out by *shape*.

Every check builds the tables from a training subset and predicts rows whose shape the training
never saw (never random neighbours of fitted points):

===========================  ================================================================
check                        training rows → judged rows
===========================  ================================================================
gemm                         GEMMs whose n and k are both at even positions of the measured
                             n and k lists → GEMMs whose n and k are both at odd positions
                             (interior only), every m: whole n × k shapes never seen
gemm (model shapes)          every AIConfigurator GEMM of the GPU → the GEMMs of whole models
                             measured by LLMServingSim (another set, other shapes)
decode / prefill attention   head shapes with the query-head count at even positions (per KV
                             heads × head size) → the odd ones: whole head shapes never seen
attention (model shapes)     AIConfigurator's tables → LLMServingSim's pure decode and pure
                             prefill batches of whole models
mixed attention              pure-prefill and pure-decode rows → LLMServingSim's mixed batches
                             (one prefill chunk over a cached prefix plus decodes): the
                             composition rules of pipeline/costmodel/profile/attention.py, never fitted
collectives                  every other message size → the sizes in between (4× spacing)
moe                          every other token count of each expert shape → the counts in
                             between
===========================  ================================================================

Errors are ``predicted / measured − 1``; the summary gives the median and p90 of their absolute
values per check and token range (1–127 and 128+ tokens, the decode and prefill regimes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipeline.catalog import load_hardware, load_model
from pipeline.costmodel.profile.attention import decode_time, prefill_time, step_attention
from pipeline.costmodel.profile.cost import gemm_shapes, measured_cost, step_cost_for
from pipeline.costmodel.profile.mixed import composed_attention, ratio_grid
from pipeline.costmodel.profile.prior import Prior, PriorCurve, die_donor, fit_without, fitted_scalars, prior_profile
from pipeline.costmodel.profile.select import (
    _most_rows,
    gemm_rows,
    mixed_ratio_rows,
    moe_rows,
    partial_gemm_dtypes,
    select_rows,
)
from pipeline.costmodel.profile.sources import Measurements, read_measurements
from pipeline.costmodel.profile.tables import Profile, frames_profile, load_profile
from pipeline.costmodel.roofline import Deployment
from pipeline.costmodel.steps import StepBatch

#: The accuracy targets of the measured tier (median and p90 absolute error per held-out table).
TARGET_MEDIAN = 0.05
TARGET_P90 = 0.15


def _rows(
    check: str,
    gpu: str,
    frame: pl.DataFrame,
    tokens: np.ndarray,
    predicted: np.ndarray,
    shape: list[str],
    trained_on: str,
) -> pl.DataFrame:
    meas = frame["time_s"].to_numpy()
    tok = np.asarray(tokens, dtype=np.float64)
    return pl.DataFrame(
        {
            "check": [check] * frame.height,
            "gpu": [gpu] * frame.height,
            "source": frame["source"].to_list(),
            "shape": shape,
            "tokens": tok,
            "token_range": np.where(tok < 128, "1-127", "128+"),
            "measured_s": meas,
            "predicted_s": predicted,
            "error": predicted / meas - 1.0,
            "trained_on": [trained_on] * frame.height,
        }
    )


def _alternate(values: list[float]) -> tuple[set[float], set[float]]:
    """(even positions, interior odd positions) of the sorted distinct values."""
    v = sorted(set(values))
    even = set(v[0::2])
    odd = {x for i, x in enumerate(v) if i % 2 == 1 and i < len(v) - 1}
    return even, odd


def _judge_gemm(meas: Measurements, gpu: str) -> list[pl.DataFrame]:
    out: list[pl.DataFrame] = []
    g = meas.get("gemm")
    if g.height == 0:  # no GEMM table on this GPU (collectives only, or every row left out)
        return out
    # the rows a profile ships (pipeline/costmodel/profile/build.py select_rows): judge what the replay reads

    aic = _most_rows(gemm_rows(g.filter(pl.col("set") == "aiconfigurator")), ["dtype"])
    aic = aic.filter(~pl.col("dtype").is_in(partial_gemm_dtypes(aic)))
    by_dtype: list[tuple[tuple[Any, ...], pl.DataFrame]] = (
        list(aic.sort(["dtype", "n", "k", "m"]).group_by(["dtype"], maintain_order=True)) if aic.height else []
    )
    for (dtype,), sub in by_dtype:
        n_even, n_odd = _alternate(sub["n"].to_list())
        k_even, k_odd = _alternate(sub["k"].to_list())
        train = sub.filter(pl.col("n").is_in(n_even) & pl.col("k").is_in(k_even))
        judged = sub.filter(pl.col("n").is_in(n_odd) & pl.col("k").is_in(k_odd))
        if train.height == 0 or judged.height == 0:
            continue
        prof = frames_profile(gpu, {"gemm": train})
        preds = np.empty(judged.height)
        shapes: list[str] = []
        idx = 0
        for (n, k), part in judged.group_by(["n", "k"], maintain_order=True):
            m = part["m"].to_numpy().astype(np.float64)
            preds[idx : idx + part.height] = prof.gemm_time(str(dtype), n, k, m)
            shapes.extend([f"{dtype} n={n} k={k}"] * part.height)
            idx += part.height
        ordered = pl.concat([p for _, p in judged.group_by(["n", "k"], maintain_order=True)])
        out.append(
            _rows(
                "gemm",
                gpu,
                ordered,
                ordered["m"].to_numpy(),
                preds,
                shapes,
                f"AIConfigurator {dtype} GEMMs with n, k at even grid positions ({train.height} rows)",
            )
        )
        # whole models from the other set
        if dtype == "bf16":
            other = g.filter((pl.col("set") == "llmservingsim") & (pl.col("dtype") == "bf16"))
            if other.height:
                full = frames_profile(gpu, {"gemm": sub})
                preds2 = np.concatenate(
                    [
                        full.gemm_time("bf16", n, k, part["m"].to_numpy().astype(np.float64))
                        for (n, k), part in other.group_by(["n", "k"], maintain_order=True)
                    ]
                )
                ordered2 = pl.concat([p for _, p in other.group_by(["n", "k"], maintain_order=True)])
                out.append(
                    _rows(
                        "gemm (model shapes, other set)",
                        gpu,
                        ordered2,
                        ordered2["m"].to_numpy(),
                        preds2,
                        [f"{k}" for k in ordered2["kernel"].to_list()],
                        f"every AIConfigurator bf16 GEMM of the GPU ({sub.height} rows)",
                    )
                )
    return out


def _attn_predict(prof: Profile, fam: str, part: pl.DataFrame, kv: str, nq: int, nkv: int, d: int) -> np.ndarray | None:
    grid = prof.attention_grid(fam, kv, nq, nkv, d)
    if grid is None:
        return None
    size = "ctx" if fam == "attn_decode" else "isl"
    b = part["batch"].to_numpy().astype(np.float64)
    s = part[size].to_numpy().astype(np.float64)
    if fam == "attn_decode":
        return decode_time(grid, b, b * s)
    return prefill_time(grid, b, b * s, b * s * (s + 1) / 2)


def _judge_attention(meas: Measurements, gpu: str) -> list[pl.DataFrame]:
    out: list[pl.DataFrame] = []
    for fam, label, size in (("attn_decode", "decode attention", "ctx"), ("attn_prefill", "prefill attention", "isl")):
        a = meas.get(fam)
        aic = _most_rows(a.filter(pl.col("set") == "aiconfigurator"), ["kv_dtype"]) if a.height else a
        groups: list[tuple[tuple[Any, ...], pl.DataFrame]] = (
            list(aic.sort(["kv_dtype", "nkv", "d", "nq"]).group_by(["kv_dtype", "nkv", "d"], maintain_order=True))
            if aic.height
            else []
        )
        for (kv, nkv, d), sub in groups:
            q_even, q_odd = _alternate(sub["nq"].to_list())
            train = sub.filter(pl.col("nq").is_in(q_even))
            judged = sub.filter(pl.col("nq").is_in(q_odd))
            if judged.height == 0:
                continue
            prof = frames_profile(gpu, {fam: train})
            parts, preds = [], []
            for (nq,), part in judged.group_by(["nq"], maintain_order=True):
                p = _attn_predict(prof, fam, part, str(kv), int(nq), int(nkv), int(d))
                if p is not None:
                    parts.append(part)
                    preds.append(p)
            if not parts:
                continue
            ordered = pl.concat(parts)
            tokens = ordered["batch"].to_numpy() * (1 if fam == "attn_decode" else ordered[size].to_numpy())
            out.append(
                _rows(
                    label,
                    gpu,
                    ordered,
                    tokens,
                    np.concatenate(preds),
                    [f"{kv} nkv={nkv} d={d} nq={q}" for q in ordered["nq"].to_list()],
                    f"AIConfigurator {kv} head shapes with nq at even positions ({train.height} rows)",
                )
            )
        other = a.filter(pl.col("set") == "llmservingsim") if a.height else a
        if other.height and aic.height:
            prof = frames_profile(gpu, {fam: aic})
            parts, preds = [], []
            for (kv, nq, nkv, d), part in other.group_by(["kv_dtype", "nq", "nkv", "d"], maintain_order=True):
                p = _attn_predict(prof, fam, part, str(kv), int(nq), int(nkv), int(d))
                if p is not None:
                    parts.append(part)
                    preds.append(p)
            if parts:
                ordered = pl.concat(parts)
                tokens = ordered["batch"].to_numpy() * (1 if fam == "attn_decode" else ordered[size].to_numpy())
                out.append(
                    _rows(
                        f"{label} (model shapes, other set)",
                        gpu,
                        ordered,
                        tokens,
                        np.concatenate(preds),
                        [f"nq={q}" for q in ordered["nq"].to_list()],
                        f"every AIConfigurator {fam} row of the GPU ({aic.height} rows)",
                    )
                )
    # steps with a prefill chunk (over a cached prefix and/or beside decodes): the composition
    # rules of pipeline/costmodel/profile/attention.py on the pure rows (AIConfigurator's where the GPU has
    # them). The query tile is fitted on one model's rows (MIXED_TRAIN_MODEL, TP 1) and judged on
    # the other models and TP shards.
    mixed = meas.get("attn_mixed")
    if mixed.height:
        prof, src = _pure_attention_profile(meas, gpu)
        judged = mixed.filter((pl.col("chunk") > 0) & ((pl.col("kv_prefill") > 0) | (pl.col("n_decode") > 0)))
        train = judged.filter((pl.col("model") == MIXED_TRAIN_MODEL) & (pl.col("tp") == 1))
        tile = fit_tile(prof, train) if train.height else DEFAULT_TILE
        held = judged.filter(~((pl.col("model") == MIXED_TRAIN_MODEL) & (pl.col("tp") == 1)))
        in_sample = held.height == 0
        if in_sample:
            held = judged  # only the training model was measured on this GPU: said in the check's name
        mixed_preds, mixed_parts = _mixed_predict(prof, held, tile)
        if mixed_parts is not None:
            parts_df = mixed_parts
            out.append(
                _rows(
                    "mixed attention (composition, in-sample)"
                    if in_sample
                    else "mixed attention (composition, other set)",
                    gpu,
                    parts_df,
                    (parts_df["chunk"] + parts_df["n_decode"]).to_numpy(),
                    mixed_preds,
                    [f"{m} tp{t}" for m, t in zip(parts_df["model"].to_list(), parts_df["tp"].to_list(), strict=True)],
                    f"{src} pure prefill and pure decode rows; query tile {tile:g} fitted on "
                    f"{MIXED_TRAIN_MODEL} TP1's mixed rows",
                )
            )
        out.extend(_judge_mixed_ratio(meas, gpu, prof, src))
    return out


def _judge_mixed_ratio(meas: Measurements, gpu: str, main: Profile, main_src: str) -> list[pl.DataFrame]:
    """The mixed-batch ratio grids (pipeline/costmodel/profile/mixed.py), held out three ways: whole decode
    contexts (every other kv_decode value of a model's grid built from the rest), whole models
    (a model's rows from the other models' grid), and as deployed (the GPU's main pure tables,
    parts summed, times the model's own grid, against the measured mixed batches)."""

    rows = mixed_ratio_rows(meas.get("attn_mixed"), meas.get("attn_decode"), meas.get("attn_prefill"))
    if rows.height == 0:
        return []
    out = []

    def judged(check: str, test: pl.DataFrame, grid: object, trained_on: str, base: np.ndarray | None = None) -> None:
        g = grid  # RatioGrid
        ratio = g(
            test["chunk"].to_numpy(),
            test["kv_prefill"].to_numpy(),
            test["n_decode"].to_numpy(),
            test["kv_decode"].to_numpy(),
        )  # type: ignore[operator]
        b = test["base_s"].to_numpy() if base is None else base
        labels = [f"{m} tp{t}" for m, t in zip(test["model"].to_list(), test["tp"].to_list(), strict=True)]
        out.append(
            _rows(check, gpu, test, (test["chunk"] + test["n_decode"]).to_numpy(), b * ratio, labels, trained_on)
        )

    for (model, tp), part in rows.group_by(["model", "tp"], maintain_order=True):
        ks = sorted(v for v in part["kv_decode"].unique().to_list() if v > 0)
        held = ks[1::2]
        test = part.filter(pl.col("kv_decode").is_in(held) & (pl.col("n_decode") > 0))
        grid = ratio_grid(part.filter(~pl.col("kv_decode").is_in(held) | (pl.col("n_decode") == 0)))
        if test.height and grid is not None:
            judged(
                "mixed attention (ratio grid, held-out contexts)",
                test,
                grid,
                f"{model} tp{tp}'s mixed rows at the other decode contexts ({', '.join(str(k) for k in ks[0::2])})",
            )
        others = rows.filter(~((pl.col("model") == model) & (pl.col("tp") == tp)))
        other_grid = ratio_grid(others) if others.height else None
        if other_grid is not None:
            judged(
                "mixed attention (ratio grid, other models)",
                part,
                other_grid,
                "the other models' and TP shards' mixed rows on this GPU",
            )
        own = ratio_grid(part)
        r0 = part.row(0, named=True)
        gd = main.attention_grid("attn_decode", "bf16", int(r0["nq"]), int(r0["nkv"]), int(r0["d"]))
        gp = main.attention_grid("attn_prefill", "bf16", int(r0["nq"]), int(r0["nkv"]), int(r0["d"]))
        # as deployed: only where the main tables come from another set (else it is in-sample by
        # construction: the set's own pure parts times its own ratio give its own mixed times back)
        if own is not None and gd is not None and gp is not None and main_src != "llmservingsim":
            c = part["chunk"].to_numpy().astype(np.float64)
            o = part["kv_prefill"].to_numpy().astype(np.float64)
            nd = part["n_decode"].to_numpy().astype(np.float64)
            kd = part["kv_decode"].to_numpy().astype(np.float64)
            base = step_attention(gd, gp, np.ones_like(c), c, c * o + c * (c + 1) / 2, nd, nd * kd, 0.0)
            judged(
                "mixed attention (as deployed: main tables x own ratio)",
                part,
                own,
                f"{main_src} pure rows summed, x {model} tp{tp}'s own ratio grid (in-sample ratio; the error "
                "is the two sets' pure-kernel difference)",
                base,
            )
    return out


#: The model whose mixed-batch rows fit the query tile (the others are judged).
MIXED_TRAIN_MODEL = "llama-3.1-8b"
#: Query tile of FlashAttention-2-class kernels when a GPU has no mixed measurements: the value
#: fitted on the RTX PRO 6000's Llama-3.1-8B TP1 rows (profile.toml of rtx-pro-6000).
DEFAULT_TILE = 32.0
TILE_CANDIDATES = (0.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0)


def _pure_attention_profile(meas: Measurements, gpu: str) -> tuple[Profile, str]:
    dec, pre = meas.get("attn_decode"), meas.get("attn_prefill")
    use_aic = dec.height > 0 and dec.filter(pl.col("set") == "aiconfigurator").height > 0
    src = "aiconfigurator" if use_aic else "llmservingsim"
    dec = dec.filter(pl.col("set") == src) if dec.height else dec
    pre = pre.filter(pl.col("set") == src) if pre.height else pre
    if use_aic:
        dec = _most_rows(dec, ["kv_dtype"])
        pre = _most_rows(pre, ["kv_dtype"])
    return frames_profile(gpu, {"attn_decode": dec, "attn_prefill": pre}), src


def _mixed_predict(prof: Profile, rows: pl.DataFrame, tile: float) -> tuple[np.ndarray, pl.DataFrame | None]:
    parts, preds = [], []
    for _, part in rows.group_by(["nq", "nkv", "d"], maintain_order=True):
        pred = composed_attention(prof, part, tile)
        if pred is None:
            continue
        preds.append(pred)
        parts.append(part)
    if not parts:
        return np.zeros(0), None
    return np.concatenate(preds), pl.concat(parts)


def fit_tile(prof: Profile, rows: pl.DataFrame) -> float:
    """The query tile (of TILE_CANDIDATES) with the least median absolute error on ``rows``."""
    best, best_err = DEFAULT_TILE, np.inf
    for tile in TILE_CANDIDATES:
        pred, parts = _mixed_predict(prof, rows, tile)
        if parts is None:
            return DEFAULT_TILE
        err = float(np.median(np.abs(pred / parts["time_s"].to_numpy() - 1.0)))
        if err < best_err:
            best, best_err = tile, err
    return best


def _judge_1d(meas: Measurements, gpu: str) -> list[pl.DataFrame]:
    """Collectives and MoE, predicted through the profile's own lookups (the replay's)."""
    out: list[pl.DataFrame] = []
    ar = meas.get("allreduce")
    if ar.height:
        parts, preds, shapes = [], [], []
        for (backend, gpus), sub in ar.group_by(["backend", "gpus"], maintain_order=True):
            even, odd = _alternate(sub["bytes"].to_list())
            train = sub.filter(pl.col("bytes").is_in(even))
            judged = sub.filter(pl.col("bytes").is_in(odd))
            if judged.height == 0:
                continue
            c = frames_profile(gpu, {"allreduce": train}).allreduce_curve(str(backend), int(gpus))
            if c is None or c.x.size == 0:
                continue
            parts.append(judged)
            preds.append(c(judged["bytes"].to_numpy().astype(np.float64)))
            shapes.extend([f"{backend} x{gpus}"] * judged.height)
        if parts:
            ordered = pl.concat(parts)
            # tokens of a 4096-wide bf16 hidden state, for the token-range split
            out.append(
                _rows(
                    "collectives",
                    gpu,
                    ordered,
                    ordered["bytes"].to_numpy() / 8192.0,
                    np.concatenate(preds),
                    shapes,
                    "every other message size per backend and GPU count",
                )
            )
    moe = meas.get("moe")
    if moe.height:
        moe = moe_rows(moe)  # the rows a profile ships
        parts, preds, shapes = [], [], []
        keys = ["dtype", "distribution", "moe_tp", "moe_ep", "h", "inter", "topk", "experts"]
        for key, sub in moe.group_by(keys, maintain_order=True):
            even, odd = _alternate(sub["tokens"].to_list())
            train = sub.filter(pl.col("tokens").is_in(even))
            judged = sub.filter(pl.col("tokens").is_in(odd))
            if judged.height == 0 or train.height < 2:
                continue
            dtype, dist, mtp, mep, h, inter, topk, experts = key
            got = frames_profile(gpu, {"moe": train}).moe_time(
                str(dtype),
                str(dist),
                int(mtp),
                int(mep),
                (int(h), int(inter), int(topk), int(experts)),
                judged["tokens"].to_numpy().astype(np.float64),
            )
            if got is None:
                continue
            parts.append(judged)
            preds.append(got)
            shapes.extend(["/".join(str(v) for v in key)] * judged.height)
        if parts:
            ordered = pl.concat(parts)
            out.append(
                _rows(
                    "moe",
                    gpu,
                    ordered,
                    ordered["tokens"].to_numpy(),
                    np.concatenate(preds),
                    shapes,
                    "every other token count per expert shape, dtype, routing and sharding",
                )
            )
    return out


def judge(meas: Measurements, gpu: str) -> pl.DataFrame:
    """Every held-out error row of ``gpu`` (columns as :func:`_rows`)."""
    m = meas.for_gpu(gpu)
    frames = [*_judge_gemm(m, gpu), *_judge_attention(m, gpu), *_judge_1d(m, gpu)]
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames)


def summarise(errors: pl.DataFrame) -> pl.DataFrame:
    """Median and p90 absolute error per GPU, check and token range, with the targets' verdict."""
    # a prediction or measurement that is not a finite positive time has no error to summarise
    # (the readers leave such rows out; this keeps NaN out of every summary all the same)
    errors = errors.filter(pl.col("error").is_finite()) if errors.height else errors
    if errors.height == 0:
        return pl.DataFrame()
    out = (
        errors.with_columns(abs=pl.col("error").abs())
        .group_by(["gpu", "check", "token_range"])
        .agg(
            rows=pl.len().cast(pl.Int64),
            median_abs=pl.col("abs").quantile(0.5, interpolation="linear"),
            p90_abs=pl.col("abs").quantile(0.9, interpolation="linear"),
            median_signed=pl.col("error").median(),
            trained_on=pl.col("trained_on").unique().sort().str.join("; "),
        )
        .sort(["gpu", "check", "token_range"])
    )
    return out.with_columns(meets=(pl.col("median_abs") <= TARGET_MEDIAN) & (pl.col("p90_abs") <= TARGET_P90))


def heldout_summary(errors: pl.DataFrame) -> dict[str, Any]:
    """The summary as profile.toml tables (``"check, token range"`` → figures)."""
    out: dict[str, Any] = {}
    s = summarise(errors)
    for row in s.iter_rows(named=True):
        if not all(math.isfinite(float(row[k])) for k in ("median_abs", "p90_abs")):
            continue
        out[f"{row['check']}, {row['token_range']}"] = {
            "rows": int(row["rows"]),
            "median_abs_error": round(float(row["median_abs"]), 4),
            "p90_abs_error": round(float(row["p90_abs"]), 4),
            "trained_on": str(row["trained_on"]),
        }
    return out


def fit_fallbacks(frames: dict[str, pl.DataFrame]) -> dict[str, Any]:
    """Numbers the measured tier needs beyond the tables, read off the tables themselves.

    - ``eager_call_overhead_s``: what one collective call costs when it runs eagerly rather than
      inside a CUDA graph — the median, over small messages (≤ 64 KiB, where the transfer is
      negligible), of vLLM's custom all-reduce eager time minus its CUDA-graph time.
    - ``graph_kernel_floor_s``: the shortest kernel under a CUDA graph (median custom all-reduce
      time for ≤ 4 KiB messages): the launch-and-sync floor of any kernel in a captured step.
    """
    fitted: dict[str, Any] = {}
    ar = frames.get("allreduce")
    if ar is not None and ar.height:
        small = ar.filter(pl.col("bytes") <= 65536)
        g = small.filter(pl.col("backend") == "custom_graph").select("gpus", "bytes", pl.col("time_s").alias("g"))
        e = small.filter(pl.col("backend") == "custom_eager").select("gpus", "bytes", pl.col("time_s").alias("e"))
        both = g.join(e, on=["gpus", "bytes"])
        if both.height:
            fitted["eager_call_overhead_s"] = float(np.median((both["e"] - both["g"]).to_numpy()))
        tiny = ar.filter((pl.col("backend") == "custom_graph") & (pl.col("bytes") <= 4096))
        if tiny.height:
            fitted["graph_kernel_floor_s"] = float(np.median(tiny["time_s"].to_numpy()))
    return fitted


def fit_sampler(meas: Measurements) -> dict[str, Any]:
    """The sampler's cost where a GPU has no measured sampler of the model: ``fixed + k ·
    logits bytes / HBM bandwidth``, least squares over every LLMServingSim sampler row (all
    GPUs and models; logits are fp32, n × vocab). ``k`` is the number of passes over the logits
    the sampling kernels make. Empty when no set has sampler rows."""
    ops = meas.get("model_ops")
    if ops.height == 0:
        return {}
    rows = ops.filter(pl.col("op") == "sampler").sort(["gpu", "model", "tp", "size", "time_s"])
    if rows.height == 0:
        return {}
    xs, ys = [], []
    for (gpu, model, _tp), sub in rows.group_by(["gpu", "model", "tp"], maintain_order=True):
        vocab = load_model(str(model)).vocab_size
        bw = load_hardware(str(gpu)).memory_bandwidth_bytes_per_s
        xs.append(sub["size"].to_numpy() * vocab * 4.0 / bw)
        ys.append(sub["time_s"].to_numpy())
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    a = np.vstack([np.ones_like(x), x]).T
    # relative least squares: each row weighted by 1 / measured
    coef, *_ = np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)
    return {
        "sampler_fixed_s": float(max(coef[0], 0.0)),
        "sampler_s_per_logit_byte_per_bw": float(max(coef[1], 0.0)),
        "sampler_fitted_on": f"{rows.height} LLMServingSim sampler rows (all GPUs and models)",
    }


#: Attention kernels of the FlashAttention-2 class (no split-KV for decodes in a mixed varlen
#: launch): the mixed-step composition with a query tile applies to them.
FA2_KERNELS = ("vllm_flash_attn", "vllm_flash_attn_fa2", "vllm eager (attention.csv)")


def attention_tile(meas: Measurements, gpu: str, frames: dict[str, pl.DataFrame]) -> dict[str, Any]:
    """``attention_tile_tokens``: fitted on the GPU's own mixed batches where it has them (on
    MIXED_TRAIN_MODEL TP 1 only), DEFAULT_TILE for other FlashAttention-2-class kernels, 0 (parts
    summed) for FA3 / FlashInfer kernels, whose mixed batches no set measured."""
    m = meas.for_gpu(gpu)
    mixed = m.get("attn_mixed")
    if mixed.height:
        prof, _ = _pure_attention_profile(m, gpu)
        train = mixed.filter(
            (pl.col("chunk") > 0)
            & ((pl.col("kv_prefill") > 0) | (pl.col("n_decode") > 0))
            & (pl.col("model") == MIXED_TRAIN_MODEL)
            & (pl.col("tp") == 1)
        )
        if train.height:
            return {
                "attention_tile_tokens": fit_tile(prof, train),
                "attention_tile_fitted_on": (
                    f"{train.height} mixed-batch rows of {MIXED_TRAIN_MODEL} TP1 (LLMServingSim)"
                ),
            }
    dec = frames.get("attn_decode")
    kernels = set(dec["kernel"].unique().to_list()) if dec is not None and dec.height else set()
    if kernels & set(FA2_KERNELS):
        return {"attention_tile_tokens": DEFAULT_TILE, "attention_tile_fitted_on": "prior: the RTX PRO 6000 fit"}
    return {"attention_tile_tokens": 0.0, "attention_tile_fitted_on": "none: FA3 / FlashInfer kernels, parts summed"}


def has_profile_sets(path: Path) -> bool:
    """Whether ``path`` holds (or is) an AIConfigurator or LLMServingSim measurement set."""
    names = ("aiconfigurator-vllm-ops", "llmservingsim-profiles")
    return path.is_dir() and (path.name in names or any((path / n).is_dir() for n in names))


def judge_all(
    measurements: Path,
    gpus: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    notes: list[str] | None = None,
) -> tuple[pl.DataFrame, list[str]]:
    """Held-out summary (schema profile_heldout) of every GPU in ``measurements``, and what was
    skipped; ``notes`` gets what the reader said about rows it kept (repeats that disagree)."""
    meas = read_measurements(measurements)
    if notes is not None:
        notes.extend(meas.notes)
    frames = []
    for gpu in meas.gpus:
        if gpus is not None and gpu not in gpus:
            continue
        if progress:
            progress(f"judging the {gpu} tables on held-out shapes")
        errors = judge(meas, gpu)
        vidur = measurements / "vidur-profiling"
        if vidur.is_dir():
            rows, _ = select_rows(meas, gpu)
            extra = judge_vidur(vidur, frames_profile(gpu, rows))
            if extra.height:
                errors = pl.concat([errors, extra]) if errors.height else extra
        if errors.height:
            frames.append(summarise(errors))
    summary = pl.concat(frames) if frames else pl.DataFrame()
    return summary, list(meas.skipped)


#: Vidur profiling folders -> catalog hardware (80 GB SXM parts, as pipeline/calibrate/validate.py maps them).
VIDUR_SKUS = {"a100": "a100-80gb-sxm", "h100": "h100-sxm"}
_VIDUR_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def judge_vidur(root: Path, prof: Profile) -> pl.DataFrame:
    """Vidur's GEMMs of whole Llama models (``compute/<sku>/<org>/<model>/mlp.csv``, fp16, an
    early-2024 PyTorch stack) predicted from the profile's bf16 GEMM table: a set the profile
    never saw. Empty when the folder has no file for the profile's GPU."""
    sku = next((k for k, v in VIDUR_SKUS.items() if v == prof.gpu), None)
    if sku is None or not prof.has_gemm("bf16"):
        return pl.DataFrame()
    files = sorted((root / "compute" / sku).glob("*/*/mlp.csv"))
    parts: list[pl.DataFrame] = []
    for path in files:
        try:
            df = pl.read_csv(path, infer_schema_length=10000)
        except Exception:
            continue
        need = {"n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers"}
        if not need <= set(df.columns):
            continue
        cols = [f"time_stats.{op}.median" for op in _VIDUR_GEMMS]
        if not set(cols) <= set(df.columns):
            continue
        keys = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tensor_parallel_workers", "num_tokens"]
        agg = df.group_by(keys).agg([pl.col(c).median() for c in cols]).sort(keys)
        for row in agg.iter_rows(named=True):
            tp = int(row["num_tensor_parallel_workers"])
            h, nh, nkv = int(row["n_embd"]), int(row["n_head"]), int(row["n_kv_head"])
            d = h // nh
            nq, nk = nh // tp, max(1, nkv // tp)
            inter = int(row["n_expanded_embd"]) // tp
            shapes = {
                "attn_pre_proj": ((nq + 2 * nk) * d, h),
                "attn_post_proj": (h, nq * d),
                "mlp_up_proj": (2 * inter, h),
                "mlp_down_proj": (h, inter),
            }
            m = float(row["num_tokens"])
            for op in _VIDUR_GEMMS:
                n, k = shapes[op]
                meas = float(row[f"time_stats.{op}.median"]) * 1e-3
                pred = float(prof.gemm_time("bf16", n, k, np.array([m]))[0])
                parts.append(
                    pl.DataFrame(
                        {
                            "source": [str(path.relative_to(root.parent))],
                            "model": [path.parent.name],
                            "op": [op],
                            "m": [m],
                            "time_s": [meas],
                            "predicted": [pred],
                        }
                    )
                )
    if not parts:
        return pl.DataFrame()
    frame = pl.concat(parts)
    n_bf16 = prof.frame("gemm").filter(pl.col("dtype") == "bf16").height
    return _rows(
        "gemm (Vidur models, other set)",
        prof.gpu,
        frame,
        frame["m"].to_numpy(),
        frame["predicted"].to_numpy(),
        [f"{a} {b}" for a, b in zip(frame["model"].to_list(), frame["op"].to_list(), strict=True)],
        f"every AIConfigurator bf16 GEMM of the GPU ({n_bf16:,} rows)",
    )


# ---------------------------------------------------------------------------- whole steps, held out


#: Deployments and engine steps of the step-level check: (model, tp) in bf16, and steps as the six
#: StepBatch fields (prefill tokens, prefill sequences, causal pairs, prefill KV tokens, decode
#: sequences, decode context tokens).
STEP_CHECK_MODELS = (
    ("llama-3.1-8b", 1),
    ("qwen3-32b", 1),
    ("qwen3-30b-a3b", 1),
    ("llama-3.1-70b", 4),  # collectives: the donor's curves where the GPU has one, else the link
    ("qwen3-30b-a3b", 2),  # a sharded expert layer (moe_tp = 2)
)


def _step_check_batch() -> tuple[list[str], Any]:
    rows: list[tuple[str, tuple[float, ...]]] = []
    for b in (1, 8, 32, 128, 256):
        rows.append((f"decode {b} x 2,048 ctx", (0, 0, 0, 0, b, b * 2048)))
    for c in (128, 512, 2048, 8192):
        rows.append((f"prefill {c:,}", (c, 1, c * (c + 1) / 2, c, 0, 0)))
    rows.append(
        ("prefill 2,048 at 2,048 + 64 decodes x 4,096", (2048, 1, 2048 * 2048 + 2048 * 2049 / 2, 4096, 64, 64 * 4096))
    )
    a = np.array([r[1] for r in rows], dtype=np.float64)
    return [r[0] for r in rows], StepBatch(*(np.ascontiguousarray(a[:, j]) for j in range(6)))


def heldout_steps(
    rows: Mapping[str, Mapping[str, pl.DataFrame]],
    used: Iterable[str] | None = None,
    only: str | None = None,
    fits: dict[str, dict[str, PriorCurve]] | None = None,
) -> pl.DataFrame:
    """Whole engine steps on each measured GPU, priced four ways: by its measured profile, by a
    prior fitted on the OTHER GPUs' rows (``used``: the families it may use; default all), by
    that prior with a same-die donor's tables scaled in front (``donor_ms``; null where the GPU
    has no donor among the others: :func:`die_donor`), and by the plain roofline — what an
    unmeasured GPU's replay would be off by, step by step."""
    names, batch = _step_check_batch()
    out: list[dict[str, Any]] = []
    for gpu in sorted(rows):
        prof = load_profile(gpu)
        if prof is None or (only is not None and gpu != only):
            continue
        others = {g: v for g, v in rows.items() if g != gpu}
        curves = fit_without(rows, gpu, fits)
        allowed = set(used) if used is not None else set(curves)
        prior = Prior(curves, fitted_scalars(others), {}, {}, frozenset(allowed & set(curves)))
        hw = load_hardware(gpu)
        donor = die_donor(hw)
        for model, tp in STEP_CHECK_MODELS:
            dep = Deployment(load_model(model), hw, tp=tp)
            meas = measured_cost(dep, prof, 8192, 256)(batch).time_s
            pri = measured_cost(
                dep, prior_profile(hw, dep, prior, gemm_shapes(dep), use_donor=False), 8192, 256, tier="prior"
            )(batch).time_s
            don = (
                measured_cost(dep, prior_profile(hw, dep, prior, gemm_shapes(dep)), 8192, 256, tier="prior")(
                    batch
                ).time_s
                if donor is not None
                else np.full(len(names), np.nan)
            )
            roof = step_cost_for(dep, "roofline", 8192, 256)(batch).time_s
            for i, name in enumerate(names):
                out.append(
                    {
                        "gpu": gpu,
                        "model": model,
                        "tp": tp,
                        "step": name,
                        "measured_ms": float(meas[i]) * 1e3,
                        "prior_ms": float(pri[i]) * 1e3,
                        "donor": donor[0] if donor is not None else None,
                        "donor_ms": float(don[i]) * 1e3 if donor is not None else None,
                        "roofline_ms": float(roof[i]) * 1e3,
                    }
                )
    frame = pl.DataFrame(out, infer_schema_length=None)
    if frame.height:
        frame = frame.with_columns(
            (pl.col("prior_ms") / pl.col("measured_ms") - 1).alias("prior_error"),
            (pl.col("roofline_ms") / pl.col("measured_ms") - 1).alias("roofline_error"),
            (pl.col("donor_ms") / pl.col("measured_ms") - 1).alias("donor_error"),
        )
    return frame
