"""Which measured rows a GPU's profile is built from (pipeline/costmodel/profile/build.py writes them,
pipeline/costmodel/profile/heldout.py judges tables built from subsets of them): per dtype the kernel vLLM
runs by default (the one with the most rows in the set), AIConfigurator's rows where a GPU has
them, catalog weight formats only, and the mixed-batch rows as ratios to their pure parts."""

from __future__ import annotations

import polars as pl

from pipeline.costmodel.profile.mixed import composed_attention
from pipeline.costmodel.profile.sources import Measurements
from pipeline.costmodel.profile.tables import frames_profile

#: Weight formats with a catalog entry whose GEMMs a profile keeps.
GEMM_DTYPES = ("bf16", "fp8", "fp8-block", "nvfp4")
#: MoE weight formats kept.
MOE_DTYPES = ("bf16", "fp8", "fp8-block", "nvfp4", "mxfp4")
#: Largest GEMM m kept: beyond any engine step (vLLM's token budget is at most a few ×10⁴).
MAX_GEMM_M = 32768
#: A GEMM table must reach this n and k (every catalog model's layers do) to be used.
MIN_GEMM_REACH = 1024


def _most_rows(frame: pl.DataFrame, by: list[str], kernel: str = "kernel") -> pl.DataFrame:
    """Keep, within each group of ``by``, the rows of the kernel with the most rows."""
    if frame.height == 0:
        return frame
    counts = (
        frame.group_by([*by, kernel]).len().sort([*by, "len", kernel], descending=[False] * len(by) + [True, False])
    )
    best = counts.group_by(by, maintain_order=True).first().select([*by, kernel])
    return frame.join(best, on=[*by, kernel], how="semi")


def _prefer_set(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Every set's rows, AIConfigurator's first. Where several sets cover a group (a GPU's bf16
    GEMMs or attention measured by AIConfigurator and by LLMServingSim), all are kept: which one
    prices a fleet is chosen when the profile is read, by the stated precedence of
    pipeline/catalog/profiles/sources.toml and the fleet's ``measured_source``
    (pipeline/costmodel/profile/precedence.py); the others give the run its band across sources."""
    if frame.height == 0:
        return frame
    aic = frame.filter(pl.col("set") == "aiconfigurator")
    other = frame.filter(pl.col("set") != "aiconfigurator")
    return pl.concat([aic, other], how="vertical_relaxed")


def gemm_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """GEMM rows a profile can keep: catalog weight formats, m up to :data:`MAX_GEMM_M`."""
    return frame.filter(pl.col("dtype").is_in(GEMM_DTYPES) & (pl.col("m") <= MAX_GEMM_M))


def partial_gemm_dtypes(frame: pl.DataFrame) -> list[str]:
    """Dtypes whose GEMM table never reaches :data:`MIN_GEMM_REACH` in n or k: a partial
    collection no model's layer falls in, left out of a profile."""
    reach = frame.group_by("dtype").agg(pl.min_horizontal(pl.col("n").max(), pl.col("k").max()).alias("reach"))
    return sorted(reach.filter(pl.col("reach") < MIN_GEMM_REACH)["dtype"].to_list())


def moe_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """Fused-MoE rows a profile keeps: catalog formats, the kernel with the most rows per dtype."""
    return _most_rows(frame.filter(pl.col("dtype").is_in(MOE_DTYPES)), ["dtype"])


def select_rows(meas: Measurements, gpu: str) -> tuple[dict[str, pl.DataFrame], dict[str, str]]:
    """The rows of ``gpu``'s profile per family, and a description of the selection."""
    m = meas.for_gpu(gpu)
    out: dict[str, pl.DataFrame] = {}
    sel: dict[str, str] = {}
    g = m.get("gemm")
    if g.height:
        g = _prefer_set(gemm_rows(g), ["dtype"])
        g = pl.concat(
            [
                _most_rows(g.filter(pl.col("set") == "aiconfigurator"), ["dtype"]),
                g.filter(pl.col("set") != "aiconfigurator"),
            ],
            how="vertical_relaxed",
        )
        # a dtype whose table never reaches a model-sized n or k is a partial collection (RTX PRO
        # 6000 fp8-block: 7 shapes with n, k <= 128 at 167-180 us each, which the lookup would
        # extrapolate to ~342 ms for 4096 x 4096): left out, so those GEMMs take the roofline
        partial = partial_gemm_dtypes(g)
        g = g.filter(~pl.col("dtype").is_in(partial))
        out["gemm"] = g.sort(["dtype", "set", "n", "k", "m"])
        sel["gemm"] = "; ".join(
            f"{d}: {', '.join(sorted(set(k)))}"
            for d, k in g.group_by("dtype").agg(pl.col("kernel").unique()).sort("dtype").iter_rows()
        )
        if partial:
            sel["gemm"] += "; left out (no n or k reaches " + f"{MIN_GEMM_REACH:,}): " + ", ".join(partial)
    for fam, size in (("attn_decode", "ctx"), ("attn_prefill", "isl")):
        a = m.get(fam)
        if a.height:
            a = _prefer_set(a, ["kv_dtype"])
            a = pl.concat(
                [
                    _most_rows(a.filter(pl.col("set") == "aiconfigurator"), ["kv_dtype"]),
                    a.filter(pl.col("set") != "aiconfigurator"),
                ],
                how="vertical_relaxed",
            )
            out[fam] = a.sort(["kv_dtype", "set", "nkv", "d", "nq", "batch", size])
            sel[fam] = "; ".join(
                f"{d}: {', '.join(sorted(set(k)))}"
                for d, k in a.group_by("kv_dtype").agg(pl.col("kernel").unique()).sort("kv_dtype").iter_rows()
            )
    ar = m.get("allreduce")
    if ar.height:
        out["allreduce"] = ar.sort(["backend", "gpus", "bytes"])
        sel["allreduce"] = (
            "vLLM custom all-reduce (graph and eager) and NCCL all_reduce, all_gather and reduce_scatter in 16-bit"
        )
    moe = m.get("moe")
    if moe.height:
        moe = moe_rows(moe)
        out["moe"] = moe.sort(["dtype", "distribution", "moe_tp", "moe_ep", "h", "inter", "topk", "experts", "tokens"])
        sel["moe"] = "; ".join(
            f"{d}: {', '.join(sorted(set(k)))}"
            for d, k in moe.group_by("dtype").agg(pl.col("kernel").unique()).sort("dtype").iter_rows()
        )
    mixed = m.get("attn_mixed")
    if mixed.height:
        rows = mixed_ratio_rows(mixed, m.get("attn_decode"), m.get("attn_prefill"))
        if rows.height:
            keep = ["gpu", "set", "source", "model", "tp", "nq", "nkv", "d", "chunk", "kv_prefill", "n_decode"]
            out["attn_mixed"] = rows.select(*keep, "kv_decode", "time_s", "base_s", "ratio").sort(
                ["nq", "nkv", "d", "model", "tp", "chunk", "kv_prefill", "n_decode", "kv_decode"]
            )
            sel["attn_mixed"] = (
                "LLMServingSim mixed batches (one prefill chunk over a cached prefix beside decodes) with their "
                "ratio to the same bundle's pure prefill + pure decode"
            )
    ops = m.get("model_ops")
    if ops.height:
        out["model_ops"] = ops.sort(["model", "tp", "op", "size"])
        sel["model_ops"] = "LLMServingSim per-model operators (dense by tokens, lm_head/sampler by sequences)"
    for fam in [f for f, frame in out.items() if frame.height == 0]:
        # every row was of a kind a profile does not keep (a weight format without a catalog
        # entry, m beyond MAX_GEMM_M, ...): no table, rather than an empty one
        del out[fam]
        sel.pop(fam, None)
        meas.skip(gpu, f"{gpu}: none of the {fam} rows is of a kind a profile keeps; no {fam} table")
    return out, sel


def mixed_ratio_rows(mixed: pl.DataFrame, decode: pl.DataFrame, prefill: pl.DataFrame) -> pl.DataFrame:
    """Mixed rows (chunk > 0) with ``base_s`` — the sum of the same source's pure prefill (at the
    step's causal pairs) and pure decode (batch, context) — and ``ratio`` = time / base. The pure
    rows must be the same set's (``source`` joins them: one LLMServingSim bundle)."""
    parts = []
    for (gpu, source), part in mixed.filter(pl.col("chunk") > 0).group_by(["gpu", "source"], maintain_order=True):
        d = decode.filter((pl.col("gpu") == gpu) & (pl.col("source") == source))
        p = prefill.filter((pl.col("gpu") == gpu) & (pl.col("source") == source))
        if d.height == 0 or p.height == 0:
            continue
        prof = frames_profile(str(gpu), {"attn_decode": d, "attn_prefill": p})
        base = composed_attention(prof, part, every_row_prefills=True)
        if base is None:
            continue
        parts.append(part.with_columns(base_s=pl.Series(base), ratio=pl.col("time_s") / pl.Series(base)))
    if not parts:
        return pl.DataFrame()
    return pl.concat(parts)
