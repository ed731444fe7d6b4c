"""The measured cost model (tier 1): a deployment's step-cost tables from its GPU's profile.

For every operator of a step the roofline model knows (pipeline/roofline.operators: the same
operator list, FLOPs and bytes), the time comes from the GPU's measured tables where they cover
it, and from the roofline otherwise:

========================  ====================================================================
operator                  measured source (pipeline/costmodel/profile/tables.py)
========================  ====================================================================
QKV, O, MLP, router,      GEMM table of the weight dtype at (n, k) of the layer on one TP
shared-expert GEMMs       shard, m = the step's tokens (padded to the CUDA-graph size, below)
fused MoE experts         fused-MoE table of the exact expert shape, dtype and TP sharding
                          (skewed routing — ``power_law_1.01`` — where measured)
norms, activation,        the model's own operator curves where the GPU was profiled with it
rotary, embedding         (LLMServingSim); the residual add is fused into the norm as in vLLM
attention                 decode and prefill (batch × length) grids of the head shape and KV
                          dtype, composed per pipeline/costmodel/profile/attention.py
all-reduce                vLLM's custom all-reduce under CUDA graphs (or eager) where vLLM
                          uses it — NVLink, or 2 GPUs with PCIe peer access, < 8 MiB — NCCL
                          otherwise (measured curves by bytes and GPU count)
LM head, sampler          GEMM table (vocab shard × hidden) / the model's own curves; the
                          sampler otherwise by the fitted bytes-per-logit rule
========================  ====================================================================

**vLLM as run** (V1 engine defaults): steps of up to the largest CUDA-graph capture size run
captured, padded up to the next capture size (``[1, 2, 4] + 8, 16, … 248 + 256, 272, … ≤
min(2·max_num_seqs, 512)``); larger steps run eagerly, where each kernel launch costs host time
(the fitted ``eager_call_overhead_s`` per operator call) and collectives take their eager
times. With asynchronous scheduling the host's per-step work (``HOST_STEP_S``) overlaps the
GPU's: only what exceeds the GPU time of the step shows (pipeline/costmodel/stepcost.py).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pipeline.common.errors import ConfigError
from pipeline.costmodel.profile.prior import load_prior, prior_profile
from pipeline.costmodel.profile.tables import (
    MOE_DISTRIBUTIONS,
    Profile,
    is_catalog_device,
    no_profile_message,
    profile_for,
)
from pipeline.costmodel.roofline import (
    LOGIT_OPS,
    Deployment,
    _is_affine_op,
    add_roofline_terms,
    comm_time,
    fast_step_cost,
    op_times,
    operators,
    roofline_affine,
)
from pipeline.costmodel.stackcal import apply, check_applies
from pipeline.costmodel.stepcost import N_TAB, TabulatedCost, flat_ratio_grid, grid_arrays, scalars, table_size
from pipeline.costmodel.steps import FloatArray, StepBatch

#: Host time of one engine step that asynchronous scheduling hides behind the GPU's work (the
#: scheduler, input preparation and output processing of vLLM V1). A prior, not fitted: vLLM
#: issue #10634 estimates the remaining per-step gap at "about 200-300us" once scheduling
#: overlaps the forward pass (PR #23569, "Fully overlap model execution"). It only shows in
#: steps whose GPU time is shorter; calibrate it from a fleet's logs where that matters.
HOST_STEP_S = 250e-6
#: vLLM's custom all-reduce buffer (CustomAllreduce max_size, 8 MiB): messages of that size or larger use NCCL.
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024
#: vLLM's CUDA-graph capture sizes are capped here (CompilationConfig, max_cudagraph_capture_size).
MAX_CAPTURE = 512
#: Tables measured in one 16-bit format price the other: FP16 and BF16 run the same tensor-core
#: kernels at the same peak rate (NVIDIA A100 / H100 / H200 / B200 / L40S datasheets list equal
#: dense FP16 and BF16 tensor TFLOPS) and move the same bytes; the sets measured BF16 only.
TABLE_DTYPE = {"fp16": "bf16"}


def table_dtype(dtype: str, measured: Collection[str] = ()) -> str:
    """The measured tables' dtype that prices ``dtype``: its own where the profile measured it
    (``measured``), else the stand-in of :data:`TABLE_DTYPE` (FP16 reads the BF16 tables)."""
    return dtype if dtype in measured else TABLE_DTYPE.get(dtype, dtype)


def capture_sizes(max_num_seqs: int) -> np.ndarray:
    """vLLM V1's default CUDA-graph capture sizes for ``max_num_seqs``."""
    cap = min(2 * max_num_seqs, MAX_CAPTURE)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, cap + 1, 16)]
    return np.array(sorted({s for s in sizes if s <= cap}), dtype=np.int64)


def padded_tokens(tokens: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tokens the step's kernels run on, whether the step runs under a CUDA graph)."""
    t = np.asarray(tokens, dtype=np.int64)
    graph = (t > 0) & (t <= sizes[-1])
    idx = np.clip(np.searchsorted(sizes, t, side="left"), 0, sizes.size - 1)
    return np.where(graph, sizes[idx], t), graph


@dataclass(frozen=True)
class Coverage:
    """Which operators the measured tables priced (for the run's metadata and docs)."""

    gemm: str
    moe: str
    attention: str
    allreduce: str
    model_ops: str
    lm_head: str
    moe_dispatch: str = "none (dp = 1)"

    def as_dict(self) -> dict[str, str]:
        keys = ("gemm", "moe", "moe_dispatch", "attention", "allreduce", "model_ops", "lm_head")
        return {k: getattr(self, k) for k in keys}


def _gemm_shape(dep: Deployment, name: str, measured: Collection[str] = ()) -> tuple[int, int, str] | None:
    """(n, k, dtype) of a roofline GEMM operator on one TP shard (None: not a plain GEMM here)."""
    m, tp = dep.model, dep.tp
    if m.is_mla:
        return None
    h, d = m.hidden_size, m.head_dim
    nq = m.num_attention_heads // tp
    nkv = max(1, m.num_kv_heads // tp)
    wd = table_dtype(dep.weight_dtype, measured)
    if name == "attn_pre_proj":
        return (nq + 2 * nkv) * d, h, wd
    if name == "attn_post_proj":
        return h, nq * d, wd
    if name == "mlp_up_proj":
        return 2 * (m.intermediate_size // tp), h, wd
    if name == "mlp_down_proj":
        return h, m.intermediate_size // tp, wd
    if name == "moe_router":
        return m.num_experts, h, "bf16"
    if name == "moe_shared_up_proj":
        return 2 * (m.num_shared_experts * m.moe_intermediate_size // tp), h, wd
    if name == "moe_shared_down_proj":
        return h, m.num_shared_experts * m.moe_intermediate_size // tp, wd
    return None


#: roofline elementwise operator -> LLMServingSim operator name
_MODEL_OPS = {
    "input_layernorm": "layernorm",
    "post_attention_layernorm": "layernorm",
    "mlp_act": "act_fn",
    "attn_rope": "rotary_emb",
    "embedding": "embedding",
    "final_norm": "final_layernorm",
}


def _allreduce_backend(dep: Deployment) -> str:
    """The all-reduce vLLM uses for this TP group (before the message-size limit)."""
    hw = dep.hardware
    nvlink = hw.link_kind.lower().startswith(("nvlink", "nvswitch", "xgmi", "infinity"))
    # a GPU without peer-to-peer access (its hardware entry's peer_to_peer = false: GeForce RTX
    # 40-series) cannot run vLLM's custom all-reduce over PCIe and falls back to NCCL
    if dep.tp in (2, 4, 6, 8) and (nvlink or (dep.tp == 2 and hw.peer_to_peer)):
        return "custom"
    return "nccl"


def measured_tables(
    dep: Deployment, prof: Profile, max_tokens: int, max_num_seqs: int
) -> tuple[FloatArray, FloatArray, Coverage]:
    """(token table, logits table, coverage) of ``dep`` priced from ``prof``."""
    m, hw = dep.model, dep.hardware
    sizes = capture_sizes(max_num_seqs)
    t = np.arange(max_tokens + 1, dtype=np.int64)
    tp_pad, graph = padded_tokens(t, sizes)
    tf = tp_pad.astype(np.float64)
    zero = np.zeros_like(tf)
    probe = StepBatch(zero, zero.copy(), zero.copy(), zero.copy(), tf, tf.copy())
    ops = operators(dep, probe)
    tok = np.zeros((t.size, N_TAB))
    eager = ~graph & (t > 0)
    busy = t > 0
    eager_call = prof.fitted("eager_call_overhead_s", 0.0)
    model_ops_used = False
    gemm_used: set[str] = set()
    gemm_dtypes = prof.gemm_dtypes()
    moe_dtypes = prof.moe_dtypes()
    gemm_missing: set[str] = set()
    gemm_other = False
    moe_used = "roofline (no MoE layers)" if not m.is_moe else "roofline"
    ar_used = "none (tp = 1)"
    a2a_used = "none (dp = 1)" if m.is_moe else "none (dense model)"
    kernels = np.zeros(t.size)  # kernel launches per step, for the eager host time

    def add_roofline(op: Any) -> None:
        add_roofline_terms(tok, op, hw, dep.link)

    def add_measured(op: Any, seconds: np.ndarray, column: int | None = None) -> None:
        s = np.where(busy, seconds, 0.0)
        if column is None:
            t_c, t_m, _ = op_times(hw, op)
            compute = t_c > t_m
            tok[:, 0] += op.count * np.where(compute, s, 0.0)
            tok[:, 1] += op.count * np.where(compute, 0.0, s)
        else:
            tok[:, column] += op.count * s
        tok[:, 6] += op.count * s

    for op in ops:
        if op.name in LOGIT_OPS or _is_affine_op(op):
            continue
        kernels += op.count * busy
        tok[:, 4] += op.count * op.flops
        tok[:, 5] += op.count * op.bytes
        if op.name == "add":
            # vLLM fuses the residual add into the next norm (RMSNorm with a residual runs
            # fused_add_rms_norm): no kernel of its own; its bytes stay in the accounting.
            kernels -= op.count * busy
            continue
        shape = _gemm_shape(dep, op.name, gemm_dtypes)
        if shape is not None:
            n, k, dtype = shape
            if prof.has_gemm(dtype) and n > 0 and k > 0:
                add_measured(op, prof.gemm_time(dtype, n, k, np.maximum(tf, 1.0)))
                gemm_used.add(dtype)
            else:
                add_roofline(op)
                gemm_missing.add(dtype)
            continue
        if op.name == "moe_experts":
            got = None
            # experts sharded whole over the GPUs (ep = tp·dp) or each expert split over them;
            # with dp ranks the layer runs on the tokens of all of them (each padded to t)
            moe_tp, moe_ep = (1, dep.ep) if dep.ep > 1 else (dep.moe_shards, 1)
            for dist in MOE_DISTRIBUTIONS:
                got = prof.moe_time(
                    table_dtype(dep.weight_dtype, moe_dtypes),
                    dist,
                    moe_tp,
                    moe_ep,
                    (m.hidden_size, m.moe_intermediate_size, m.experts_per_token, m.num_experts),
                    np.maximum(tf * dep.dp, 1.0),
                )
                if got is not None:
                    moe_used = (
                        f"measured fused MoE ({table_dtype(dep.weight_dtype, moe_dtypes)}, {dist} routing, "
                        f"moe_tp={moe_tp}, moe_ep={moe_ep})"
                    )
                    break
            if got is None:
                add_roofline(op)
            else:
                add_measured(op, got)
            continue
        if op.name in _MODEL_OPS:
            curve = prof.model_op(m.name, dep.tp, _MODEL_OPS[op.name])
            if curve is not None:
                add_measured(op, curve(np.maximum(tf, 1.0)), column=1)
                model_ops_used = True
            else:
                add_roofline(op)
            continue
        if op.kind == "comm" and dep.link is not None:
            # the fleet's box states its link (FLEET.toml [topology]) or calibrate --measurements
            # fitted it on an nccl-tests log: that path prices the collectives, not the curves
            # measured on the profile's box (docs/collectives.md)
            add_roofline(op)
            if op.name == "all_reduce":
                ar_used = f"ring all-reduce on {dep.link.describe()}"
            elif op.name == "moe_dispatch_combine":
                a2a_used = f"allgather_reducescatter on {dep.link.describe()}"
            continue
        if op.name == "moe_dispatch_combine":
            # vLLM's default all-to-all (allgather_reducescatter): an NCCL all-gather of the dp
            # ranks' dp·t·h tensor before the experts and a reduce-scatter of it after, each
            # from its measured table; where those were not measured, NCCL's all-reduce of the
            # same tensor (the two halves of a ring all-reduce).
            nbytes_a2a = np.maximum(tf * dep.dp * m.hidden_size * 2.0, 1.0)
            gather_c = prof.allreduce_curve("nccl_all_gather", dep.dp)
            scatter_c = prof.allreduce_curve("nccl_reduce_scatter", dep.dp)
            nccl_c = prof.allreduce_curve("nccl", dep.dp)
            if gather_c is not None and scatter_c is not None:
                add_measured(op, gather_c(nbytes_a2a) + scatter_c(nbytes_a2a), column=2)
                a2a_used = (
                    f"allgather_reducescatter: NCCL all-gather + reduce-scatter (measured: {prof.gpu} x{dep.dp} curves)"
                )
            elif nccl_c is not None:
                add_measured(op, nccl_c(nbytes_a2a), column=2)
                a2a_used = f"allgather_reducescatter as NCCL all-reduce (measured: {prof.gpu} x{dep.dp} curve)"
            else:
                add_roofline(op)
                a2a_used = f"allgather_reducescatter, no NCCL table over {dep.dp} GPUs here: roofline link"
            continue
        if op.name == "all_reduce":
            backend = _allreduce_backend(dep)
            custom = "vLLM custom all-reduce (CUDA graph / eager)"
            curves = f"{prof.gpu} x{dep.tp} curves"
            nbytes = tf * m.hidden_size * 2.0
            if backend == "custom":
                graph_c = prof.allreduce_curve("custom_graph", dep.tp)
                eager_c = prof.allreduce_curve("custom_eager", dep.tp)
                nccl_c = prof.allreduce_curve("nccl", dep.tp)
                if graph_c is not None and eager_c is not None:
                    secs = np.where(graph, graph_c(np.maximum(nbytes, 1.0)), eager_c(np.maximum(nbytes, 1.0)))
                    big = nbytes >= CUSTOM_AR_MAX_BYTES  # vLLM: custom only when size < max_size
                    if nccl_c is not None:
                        secs = np.where(big, nccl_c(np.maximum(nbytes, 1.0)), secs)
                        ar_used = f"{custom}, NCCL above 8 MiB: {curves}"
                    else:
                        secs = np.where(big, comm_time(hw, op), secs)
                        ar_used = f"{custom}, roofline above 8 MiB: {curves}"
                    add_measured(op, secs, column=2)
                    # the eager curve's times hold the call's host cost (the fitted eager cost
                    # per call is read off it): not charged a second time as a launch
                    kernels -= op.count * (eager & ~big)
                    continue
            nccl_c = prof.allreduce_curve("nccl", dep.tp)
            if nccl_c is not None:
                add_measured(op, nccl_c(np.maximum(nbytes, 1.0)), column=2)
                ar_used = f"NCCL (measured: {prof.gpu} x{dep.tp} curve)"
            else:
                add_roofline(op)
                what = "NCCL" if backend == "nccl" else "custom all-reduce"
                ar_used = f"{what}: no table over {dep.tp} GPUs here: roofline link"
            continue
        if op.kind == "gemm":  # a projection the tables do not key (MLA's): the roofline's
            gemm_other = True
        add_roofline(op)
    # Qwen3's per-head q/k norms: a kernel the roofline list does not carry; measured or nothing.
    qk = prof.model_op(m.name, dep.tp, "qk_norm")
    if qk is not None:
        s = np.where(busy, qk(np.maximum(tf, 1.0)), 0.0) * m.num_layers
        tok[:, 1] += s
        tok[:, 6] += s
        kernels += m.num_layers * busy
    # attention kernels count as launches too (one per layer)
    kernels += m.num_layers * busy
    tok[:, 7] = np.where(eager, kernels * eager_call, 0.0)

    # ---- logits table: LM head and sampler on n sampled positions (eager, unpadded)
    nseq = np.arange(max_tokens + 1, dtype=np.float64)
    nz = np.zeros_like(nseq)
    nprobe = StepBatch(nz, nz.copy(), nz.copy(), nz.copy(), nseq, nseq.copy())
    logit = np.zeros((nseq.size, N_TAB))
    lm_used = "roofline"
    for op in operators(dep, nprobe):
        if op.name not in LOGIT_OPS:
            continue
        logit[:, 4] += op.count * op.flops
        logit[:, 5] += op.count * op.bytes
        if op.kind == "comm":
            logit[:, 2] += op.count * comm_time(hw, op, dep.link)
            continue
        own = prof.model_op(m.name, dep.tp, "lm_head")
        nn = np.maximum(nseq, 1.0)
        if own is not None:
            secs = own(nn)
            lm_used = "measured (the model's own lm_head)"
        elif prof.has_gemm("bf16"):
            secs = prof.gemm_time("bf16", m.vocab_size // dep.tp, m.hidden_size, nn)
            lm_used = "measured (bf16 GEMM table)"
        else:
            t_c, t_m, t_f = op_times(hw, op)
            logit[:, 0] += op.count * t_c
            logit[:, 1] += op.count * t_m
            logit[:, 3] += op.count * t_f
            continue
        s = np.where(nseq > 0, secs, 0.0)
        t_c, t_m, _ = op_times(hw, op)
        logit[:, 0] += np.where(t_c > t_m, s, 0.0)
        logit[:, 1] += np.where(t_c > t_m, 0.0, s)
        logit[:, 6] += s
    sampler = prof.model_op(m.name, dep.tp, "sampler")
    if sampler is not None:
        s = np.where(nseq > 0, sampler(np.maximum(nseq, 1.0)), 0.0)
        logit[:, 6] += s
    else:
        fixed = prof.fitted("sampler_fixed_s", 0.0)
        per_byte = prof.fitted("sampler_s_per_logit_byte_per_bw", 0.0)
        s = np.where(nseq > 0, fixed + per_byte * nseq * m.vocab_size * 4.0 / hw.memory_bandwidth_bytes_per_s, 0.0)
    logit[:, 1] += s
    logit[:, 5] += nseq * m.vocab_size * 4.0

    gemm_desc = ", ".join(f"{d} measured" for d in sorted(gemm_used))
    if gemm_other:
        gemm_desc += ("; " if gemm_desc else "") + "roofline (projections the tables do not key, e.g. MLA's)"
    if gemm_missing:
        gemm_desc += ("; " if gemm_desc else "") + ", ".join(
            f"{d} roofline (not measured)" for d in sorted(gemm_missing)
        )
    stand_in = table_dtype(dep.weight_dtype, gemm_dtypes)
    if stand_in != dep.weight_dtype and gemm_used:  # say it: same kernels, same rate
        gemm_desc += f"; {dep.weight_dtype} priced from the {stand_in} tables"
    cov = Coverage(
        gemm=gemm_desc or "none",
        moe=moe_used,
        attention="",
        allreduce=ar_used if dep.tp > 1 else "none (tp = 1)",
        model_ops="measured (the model's own operators)" if model_ops_used else "roofline elementwise kernels",
        lm_head=lm_used,
        moe_dispatch=a2a_used,
    )
    return tok, logit, cov


def measured_cost(
    dep: Deployment,
    prof: Profile,
    max_tokens: int = 16384,
    max_num_seqs: int = 256,
    overhead_s: float | None = None,
    tier: str = "measured",
    measured_source: str = "auto",
) -> TabulatedCost:
    """The deployment's step cost from its GPU's profile (module doc); ``tier = "prior"`` when
    ``prof`` is the size-aware prior's synthetic profile (pipeline/costmodel/profile/prior.py)."""
    m, hw = dep.model, dep.hardware
    max_tokens = table_size(max_tokens)
    tok, logit, cov = measured_tables(dep, prof, max_tokens, max_num_seqs)
    aff = roofline_affine(dep)
    grids_ok = not m.is_mla and m.num_sliding_layers == 0
    nq = m.num_attention_heads // dep.tp
    nkv = max(1, m.num_kv_heads // dep.tp)
    kv = table_dtype(dep.kv_dtype, prof.attention_kv_dtypes("attn_decode"))
    dgrid = prof.attention_grid("attn_decode", kv, nq, nkv, m.head_dim) if grids_ok else None
    pgrid = prof.attention_grid("attn_prefill", kv, nq, nkv, m.head_dim) if grids_ok else None
    measured_attn = dgrid is not None and pgrid is not None
    mixed = prof.mixed_ratio(nq, nkv, m.head_dim) if measured_attn else None
    attention = (
        f"measured grids ({kv} KV, nq={nq} nkv={nkv} d={m.head_dim}; "
        + (
            f"steps with a prefill chunk: parts summed x the mixed-batch ratio from {mixed[1]})"
            if mixed is not None
            else f"query tile {prof.fitted('attention_tile_tokens', 0.0):g})"
        )
        if measured_attn
        else "roofline (no measured grid for this head shape / KV dtype, or MLA / sliding window)"
    )
    sc = scalars(
        min_kernel_s=hw.min_kernel_s,
        tile=prof.fitted("attention_tile_tokens", 0.0),
        layers=float(m.num_layers),
        base_s=float(overhead_s) if overhead_s is not None else 0.0,
        host_s=HOST_STEP_S,
        pp=float(dep.pp),
        measured_attention=1.0 if measured_attn else 0.0,
        peak_gpu=hw.peak_for(dep.compute_dtype),
        bw_gpu=hw.memory_bandwidth_bytes_per_s,
    )
    cov_desc = cov.as_dict()
    if tier == "prior":  # the synthetic profile's "measured" tables are the prior's curves
        cov_desc = {k: v.replace("measured", "prior") for k, v in cov_desc.items()}
        attention = attention.replace("measured", "prior")
        scaled = prof.meta.stack.get("scaled_from")
        if scaled:  # the prior's tables are a same-die GPU's measured ones, scaled (prior.die_donor)
            lent = set(str(prof.meta.stack.get("scaled_families", "")).split(","))
            note = f" — {scaled}'s measured tables (same {prof.meta.stack.get('die', '')} die), scaled to this GPU"
            for key in ("gemm", "moe"):
                words = set(re.findall(r"[a-z0-9-]+", cov_desc.get(key, "")))
                if "prior" in words and any(f"{key}:{w}" in lent for w in words):
                    cov_desc[key] += note
            parts = [name for fam, name in (("attn_decode", "decode"), ("attn_prefill", "prefill")) if fam in lent]
            if attention.startswith("prior") and parts:
                attention += note + ("" if len(parts) == 2 else f" ({parts[0]} attention only)")
        donor = prof.meta.stack.get("collectives_from")
        if donor:  # collectives are measured curves, of the GPU on the same link
            for key in ("allreduce", "moe_dispatch"):
                cov_desc[key] = cov_desc[key].replace(f"{prof.gpu} x", f"{donor} x").replace("(prior:", "(measured:")
                if donor in cov_desc[key]:
                    cov_desc[key] += (
                        f" — measured on {donor}, the profiled GPU on the same link ({dep.hardware.link_kind})"
                    )
    describe: dict[str, Any] = {
        "tier": tier,
        "profile": prof.gpu,
        "stack": dict(prof.meta.stack),
        # where several measured sets cover an operator: which one priced the run, over which,
        # and why (only then: a profile of one source keeps the record it had)
        **({"tables": prof.source_choice(measured_source)} if prof.alternatives() else {}),
        **cov_desc,
        "attention": attention,
        "host_step_s": HOST_STEP_S,
        "cuda_graph_max_tokens": int(capture_sizes(max_num_seqs)[-1]),
    }
    return TabulatedCost(
        tok=np.ascontiguousarray(tok),
        logit=np.ascontiguousarray(logit),
        affine_flops=aff["flops"],
        affine_bytes=aff["nbytes"],
        affine_count=aff["count"],
        affine_peak=aff["peak"],
        affine_has_peak=aff["has_peak"],
        affine_bw=aff["bw"],
        decode_grid=grid_arrays(dgrid if measured_attn else None),
        prefill_grid=grid_arrays(pgrid if measured_attn else None),
        mixed_ratio=flat_ratio_grid(mixed[0] if mixed is not None else None),
        scalars=sc,
        source=tier,
        describe=describe,
        extend=lambda t: measured_cost(
            dep, prof, max(t, 2 * max_tokens), max_num_seqs, overhead_s, tier, measured_source
        ),
    )


COST_MODELS = ("auto", "measured", "prior", "roofline")


def gemm_shapes(dep: Deployment) -> list[tuple[int, int]]:
    """(n, k) of every plain GEMM of ``dep`` on one TP shard, the LM head's included."""
    names = (
        "attn_pre_proj",
        "attn_post_proj",
        "mlp_up_proj",
        "mlp_down_proj",
        "moe_router",
        "moe_shared_up_proj",
        "moe_shared_down_proj",
    )
    out = {(dep.model.vocab_size // dep.tp, dep.model.hidden_size)}
    for name in names:
        shape = _gemm_shape(dep, name)
        if shape is not None and shape[0] > 0 and shape[1] > 0:
            out.add((shape[0], shape[1]))
    return sorted(out)


def prior_cost(
    dep: Deployment,
    max_tokens: int = 16384,
    max_num_seqs: int = 256,
    overhead_s: float | None = None,
    reason: str = "no measured profile of this GPU",
) -> TabulatedCost | None:
    """The deployment's step cost from the size-aware roofline prior (pipeline/costmodel/profile/prior.py),
    or None when the catalog has no prior. ``describe`` says why the prior priced it
    (``prior_reason``), the GPU's vendor, and which operators fell to the plain roofline."""
    prior = load_prior()
    if prior is None:
        return None
    prof = prior_profile(dep.hardware, dep, prior, gemm_shapes(dep))
    cost = measured_cost(dep, prof, max_tokens, max_num_seqs, overhead_s, tier="prior")
    roofline_parts = [
        name
        for name, key in (("GEMMs", "gemm"), ("MoE experts", "moe"), ("attention", "attention"))
        if "roofline" in str(cost.describe.get(key, ""))
        and not str(cost.describe.get(key, "")).startswith("roofline (no MoE")
    ]
    return replace(
        cost,
        describe={
            **cost.describe,
            "prior_reason": reason,
            "vendor": dep.hardware.vendor,
            "roofline_parts": roofline_parts,
        },
    )


def step_cost_for(
    dep: Deployment,
    cost_model: str = "auto",
    max_tokens: int = 16384,
    max_num_seqs: int = 256,
    overhead_s: float | None = None,
    measured_source: str = "auto",
    vllm_version: str | None = None,
) -> TabulatedCost:
    """The step cost of ``dep``: its GPU's measured profile when the catalog has one (``auto``
    or ``measured``; where several measured sets cover an operator, the one ``measured_source``
    and the stated precedence pick, pipeline/costmodel/profile/precedence.py); else, for ``auto``
    on a GPU whose hardware entry lets the prior apply
    (``prior_applies``, true unless the entry says false: the AMD GPUs) or ``prior`` anywhere, the
    size-aware roofline prior fitted on the measured GPUs; else the roofline with the catalog's
    factors."""
    if cost_model not in COST_MODELS:
        raise ConfigError(f"cost_model must be one of {list(COST_MODELS)}, got {cost_model!r}")
    prof = profile_for(dep.hardware) if cost_model in ("auto", "measured") else None
    if prof is None:
        if cost_model == "measured":
            raise ConfigError(no_profile_message(dep.hardware.name, dep.hardware))
        if cost_model == "prior" or (cost_model == "auto" and dep.hardware.prior_applies):
            why = "cost_model = 'prior' asked for" if cost_model == "prior" else "no measured profile of this GPU"
            got = prior_cost(dep, max_tokens, max_num_seqs, overhead_s, why)
            if got is not None:
                if cost_model == "auto" and not is_catalog_device(dep.hardware):
                    # a hardware file (a `calibrate` output, a user's entry): its [efficiency]
                    # factors are the roofline tier's; measured tables price this run instead
                    note = (
                        "this hardware file's [efficiency] factors "
                        f"({dep.hardware.calibrated_on[:80]}) price only the roofline tier: "
                        'set cost_model = "roofline" to use them'
                    )
                    got = replace(got, describe={**got.describe, "factors_note": note})
                return got
            if cost_model == "prior":
                raise ConfigError(
                    "cost_model = 'prior' but the catalog has no prior (pipeline/catalog/profiles/prior.toml)"
                )
        if overhead_s is not None:
            dep = replace(dep, step_overhead_s=overhead_s)
        return fast_step_cost(dep, max(max_tokens, 1024))  # type: ignore[no-any-return]
    prof = prof.with_sources(measured_source, vllm_version)
    return measured_cost(dep, prof, max_tokens, max_num_seqs, overhead_s, measured_source=measured_source)


def fleet_sources(fleet: Any) -> tuple[str, str | None]:
    """(measured_source, vllm_version) of a resolved fleet's config (defaults where unset)."""
    cfg = fleet.config
    return getattr(cfg, "measured_source", "") or "auto", getattr(getattr(cfg, "engine", None), "vllm_version", None)


def alternative_sources(fleet: Any) -> list[str]:
    """The measured sets other than the one pricing ``fleet`` that cover one of its GPU's
    operators (the band across sources re-prices its replay with each); empty where one source
    covers the GPU, or the fleet is not priced from a measured profile."""
    model = getattr(fleet.config, "cost_model", "auto")
    if model not in ("auto", "measured") or fleet.config.calibration is not None:
        return []
    prof = profile_for(fleet.deployment.hardware)
    if prof is None:
        return []
    sets = prof.alternatives()
    if not sets:
        return []
    source, version = fleet_sources(fleet)
    first = prof.with_sources(source, version).order[0]
    return [s for s in sets if s != first]


def fleet_step_cost(fleet: Any, measured_source: str | None = None) -> TabulatedCost:
    """The step cost a resolved fleet (pipeline.replay.fleet.ResolvedFleet) replays with;
    ``measured_source``: another measured set first instead of the fleet's (the band across
    sources)."""
    sched = fleet.scheduler
    need = max(sched.max_num_batched_tokens, sched.max_num_seqs) + 1
    model = getattr(fleet.config, "cost_model", "auto")
    if model == "auto" and fleet.config.calibration is not None:
        # A [calibration] holds roofline efficiency factors of another serving stack: it applies
        # to the roofline tier (a measured profile describes vLLM's own kernels).
        model = "roofline"
    source, version = fleet_sources(fleet)
    try:
        cost = step_cost_for(
            fleet.deployment,
            model,
            need,
            sched.max_num_seqs,
            fleet.config.engine.step_overhead_s,
            measured_source or source,
            version,
        )
        cal = fleet.config.calibration
        if cal is not None and cost.source == "roofline":  # say whose factors priced it
            return replace(
                cost, describe={**cost.describe, "calibrated_on": f"the fleet's [calibration]: {cal.source}"}
            )
        stack = fleet.config.stack_calibration
        if stack is not None:  # learnt from logs (calibrate --observed): on top of the tier
            check_applies(stack, fleet.deployment.hardware.name, cost.source, f"calibration ({stack.source[:120]})")
            cost = apply(cost, stack)
        return cost
    except ConfigError as exc:
        # name the fleet (a FLEET.toml is refused sooner, by pipeline.replay.fleet.load_fleet, naming its file)
        raise ConfigError(f"fleet {fleet.config.name!r}: {exc}") from None
