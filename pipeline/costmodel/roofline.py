"""Roofline step-cost model: per-operator FLOPs and bytes, vectorised over N engine steps.

For each operator of a step (docs/catalog.md)::

    time = max(flops / (peak · compute_eff), bytes / (bandwidth · memory_eff))

summed over operators and layers, plus tensor-parallel communication (ring all-reduce:
``2(tp−1)/tp · bytes / (link_bw · link_eff) + latency`` per call), plus a fixed per-step
overhead (scheduler, input preparation, sampling: host time the GPU waits for).

All quantities are per GPU of one replica. Tensor parallelism (vLLM/Megatron layout) shards
heads and the MLP intermediate dimension across ``tp`` ranks; pipeline parallelism splits
layers over ``pp`` stages and is costed as the latency of one step through all stages (no
micro-batch overlap) plus one hidden-state transfer per stage boundary. Expert parallelism
(``ep`` = tp·dp, vLLM's ``enable_expert_parallel``) places whole experts per GPU; under the
uniform-routing expectation used here the per-GPU expert bytes and FLOPs equal the TP-sharded
case, so ep alone changes no cost — it is validated and recorded. Load imbalance between experts
is not modelled.

Attention data parallelism (``dp`` ranks of ``tp`` GPUs each, vLLM's ``data_parallel_size``)
costs one rank's step: attention and dense layers see the rank's own tokens; the MoE layers of an
MoE model run on the tokens of all dp ranks (each rank padded to the same count, as vLLM pads
DP batches) with the experts spread over all tp·dp GPUs, and every MoE layer pays a dispatch
(all-gather) and a combine (reduce-scatter) over the dp ranks — vLLM's default
``allgather_reducescatter`` all2all backend. Dense models' DP ranks share nothing.

Formulas, with units and their sources, are in docs/catalog.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from pipeline.catalog import HardwareSpec, LinkPath, ModelSpec, kv_format, weight_format
from pipeline.common.errors import ConfigError
from pipeline.costmodel.stepcost import N_TAB, TabulatedCost, affine_cost, scalars, table_size
from pipeline.costmodel.steps import FloatArray, StepBatch, StepCost

#: Largest ``dp`` accepted: a bound against absurd values (each rank is an engine with its own state).
MAX_DP = 1024

#: Activations travel in 16-bit (bf16/fp16) between kernels, as in vLLM's default dtype.
ACT_BYTES = 2.0
#: Logits are materialised in fp32 (vLLM LogitsProcessor upcasts before sampling).
LOGIT_BYTES = 4.0

#: Share of HBM bandwidth each class of memory-bound elementwise kernel reaches, relative to the
#: hardware's ``elementwise`` efficiency (which is that of the gated-activation kernel, "act").
#: The kernels stream the same kind of tensors but are written differently, and the Vidur
#: profiles (sarathi-serve, i.e. vLLM's early-2024 CUDA kernels) show the spread on both GPUs:
#:
#: - "norm": vLLM's rms_norm_kernel (csrc/layernorm_kernels.cu before its vec8 rewrite) runs one
#:   thread block per token with scalar 2-byte loads and two passes over the row around a
#:   block-wide reduction, so the block idles at the barrier: the lowest share (~35 % of HBM).
#: - "rotary": vLLM's rotary_embedding_kernel, one block per token, in place on q and k with the
#:   rotated pairs half a head apart (GPT-NeoX layout) plus cos/sin cache reads: strided loads.
#: - "act": act_and_mul_kernel (SiLU(x)·y), one block per token, scalar but contiguous loads.
#: - "add": the residual add is PyTorch's own vectorised elementwise kernel (16-byte accesses,
#:   grid-stride): close to the HBM roof, and its inputs were just written by the previous
#:   kernels so part of them are still in L2.
#:
#: Values: per-class efficiencies fitted by least squares on the TRAIN split of Vidur mlp.csv
#: (A100 and H100 separately), divided by the "act" efficiency of the same GPU, geometric mean of
#: the two GPUs (they agree within 10 %: the ratio is a property of the kernel's access pattern,
#: not of the chip). Re-derive: python benchmarks/derive_catalog_factors.py. vLLM today fuses the
#: residual add into the norm and vectorises both; these kernels are a few % of a step.
ELEMENTWISE_KERNEL_SCALE: dict[str, float] = {
    "norm": 0.705,
    "rotary": 0.854,
    "act": 1.0,
    "add": 1.905,
    # the vocab-parallel embedding lookup is a row gather, contiguous per token like "act"
    "gather": 1.0,
}


@dataclass(frozen=True)
class Deployment:
    """A model served on ``tp × pp`` GPUs of one hardware type, with storage formats.

    ``step_overhead_s`` overrides the hardware's per-step overhead (None: use the catalog's).
    Callable: ``dep(batch)`` is ``step_cost(dep, batch)``, so a Deployment is a StepCostFn.
    """

    model: ModelSpec
    hardware: HardwareSpec
    tp: int = 1
    pp: int = 1
    ep: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    step_overhead_s: float | None = None
    #: Attention data-parallel ranks of one replica (each rank: tp × pp GPUs).
    dp: int = 1
    #: The path the collectives take where the fleet states it (FLEET.toml [topology]) or
    #: ``calibrate --measurements`` fitted it on the box; None: the hardware entry's link factors.
    link: LinkPath | None = None

    def __post_init__(self) -> None:
        m, where = self.model, f"deployment of {self.model.name} on {self.hardware.name}"
        for key in ("tp", "pp", "ep", "dp"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
        if m.num_attention_heads % self.tp:
            raise ConfigError(f"{where}: tp={self.tp} does not divide num_attention_heads={m.num_attention_heads}")
        kv = m.num_kv_heads
        if not m.is_mla and kv % self.tp and self.tp % kv:
            raise ConfigError(f"{where}: tp={self.tp} and num_key_value_heads={kv} must divide one another")
        if self.tp > self.hardware.gpus_per_node:
            raise ConfigError(
                f"{where}: tp={self.tp} exceeds the {self.hardware.gpus_per_node} GPUs of one "
                f"{self.hardware.link_kind} domain; use pp across nodes"
            )
        if self.pp > m.num_layers:
            raise ConfigError(f"{where}: pp={self.pp} exceeds num_layers={m.num_layers}")
        if self.dp > MAX_DP:
            raise ConfigError(f"{where}: dp={self.dp} is more than {MAX_DP} data-parallel ranks in one replica")
        if self.ep > 1:
            if not m.is_moe:
                raise ConfigError(f"{where}: ep={self.ep} given for a dense model")
            if self.ep != self.tp * self.dp:
                raise ConfigError(
                    f"{where}: ep must be 1 or tp x dp = {self.tp * self.dp} (vLLM's enable_expert_parallel "
                    "spreads the experts over every GPU of the replica)"
                )
            if m.num_experts % self.ep:
                raise ConfigError(f"{where}: ep={self.ep} does not divide num_experts={m.num_experts}")
        weight_format(self.weight_dtype)
        kv_format(self.kv_dtype)
        if self.step_overhead_s is not None and self.step_overhead_s < 0:
            raise ConfigError(f"{where}: step_overhead_s must be >= 0")

    @property
    def gpus(self) -> int:
        """GPUs of one data-parallel rank (tp × pp); a replica has ``dp`` of them."""
        return self.tp * self.pp

    @property
    def moe_shards(self) -> int:
        """GPUs the experts of one MoE layer are spread over: tp × dp (vLLM flattens the DP
        and TP groups for the MoE layers, as whole experts with ep or as slices without)."""
        return self.tp * self.dp if self.model.is_moe else self.tp

    @property
    def overhead_s(self) -> float:
        return self.hardware.step_overhead_s if self.step_overhead_s is None else self.step_overhead_s

    @cached_property
    def compute_dtype(self) -> str:
        """Peak-FLOP/s key the linear layers run at (bf16 when the GPU lacks the weight format)."""
        return self.hardware.compute_dtype_for(weight_format(self.weight_dtype).compute)

    def cost(self, batch: StepBatch) -> StepCost:
        return step_cost(self, batch)

    def __call__(self, batch: StepBatch) -> StepCost:
        return step_cost(self, batch)


@dataclass(frozen=True)
class Op:
    """One operator instance per GPU; ``count`` instances per step (e.g. one per layer).

    kind: "gemm" / "attention" / "elementwise" run at max(compute, memory) time; "comm" ops
    move ``bytes`` over the GPU link (already scaled by the ring factor) in ``calls`` collective
    calls per instance (0 or 1 per step), each paying the link latency. ``kernel`` is the
    elementwise kernel class (a key of ELEMENTWISE_KERNEL_SCALE), "" for other kinds.
    """

    name: str
    kind: str
    count: int
    flops: FloatArray
    bytes: FloatArray
    peak_flops_per_s: float = 0.0
    calls: FloatArray | None = None
    kernel: str = ""


def _mask(x: FloatArray) -> FloatArray:
    return (x > 0).astype(np.float64)


def operators(dep: Deployment, batch: StepBatch) -> list[Op]:
    """Every operator of one step, per GPU, with FLOPs and bytes arrays of shape (N,)."""
    m, hw = dep.model, dep.hardware
    tp = dep.tp
    a = ACT_BYTES
    w = weight_format(dep.weight_dtype).bytes_per_param
    kvb = kv_format(dep.kv_dtype).bytes
    peak_lin = hw.peak_for(dep.compute_dtype)
    peak16 = hw.peak_for("bf16")

    pt = np.asarray(batch.prefill_tokens, dtype=np.float64)
    ps = np.asarray(batch.prefill_seqs, dtype=np.float64)
    pairs = np.asarray(batch.prefill_attn_pairs, dtype=np.float64)
    pkv = np.asarray(batch.prefill_kv_tokens, dtype=np.float64)
    ds = np.asarray(batch.decode_seqs, dtype=np.float64)
    dctx = np.asarray(batch.decode_ctx_tokens, dtype=np.float64)
    T = pt + ds  # tokens through every linear layer
    busy = _mask(T)
    n_logits = ps + ds  # one sampled position per prefill chunk and per decode (upper bound)

    h = m.hidden_size
    nq = m.num_attention_heads // tp
    ops: list[Op] = []

    def gemm(
        name: str,
        count: int,
        params: float,
        tokens: FloatArray,
        in_w: float,
        out_w: float,
        bytes_per_param: float = w,
        peak: float = peak_lin,
    ) -> None:
        """A weight GEMM: reads its weights once per step (if any token passes) plus activations."""
        if count <= 0 or params <= 0:
            return
        flops = 2.0 * tokens * params
        nbytes = params * bytes_per_param * _mask(tokens) + tokens * a * (in_w + out_w)
        ops.append(Op(name, "gemm", count, flops, nbytes, peak))

    def elementwise(name: str, kernel: str, count: int, tokens: FloatArray, width_rw: float) -> None:
        """A memory-bound kernel of class ``kernel`` moving width_rw 16-bit values per token
        (reads + writes)."""
        if count <= 0:
            return
        nbytes = tokens * a * width_rw
        ops.append(Op(name, "elementwise", count, np.zeros_like(tokens), nbytes, kernel=kernel))

    L = m.num_layers
    # ---- embedding (vocab-parallel lookup) and final norm
    elementwise("embedding", "gather", 1, T, 2 * h)
    elementwise("input_layernorm", "norm", L, T, 2 * h)
    elementwise("post_attention_layernorm", "norm", L, T, 2 * h)
    elementwise("add", "add", 2 * L, T, 3 * h)  # two residual adds per layer
    elementwise("final_norm", "norm", 1, T, 2 * h)

    # ---- attention projections
    if m.is_mla:
        qk, vd, rope, lora = m.q_head_dim, m.v_head_dim, m.qk_rope_head_dim, m.kv_lora_rank
        latent = lora + rope
        # fused q_a / kv_a projection is replicated on every TP rank in vLLM's DeepSeek-V2/V3 model
        qa_out = m.q_lora_rank + latent
        gemm("attn_pre_proj", L, h * qa_out, T, h, qa_out)
        if m.q_lora_rank:
            gemm("attn_q_b_proj", L, m.q_lora_rank * nq * qk, T, m.q_lora_rank, nq * qk)
        else:  # no query compression (DeepSeek-V2-Lite): a column-parallel q_proj
            gemm("attn_q_proj", L, h * nq * qk, T, h, nq * qk)
        # kv_b_proj: prefill up-projects every context latent (non-absorbed MLA); decode applies
        # the absorbed W_UK / W_UV to each query instead — the same weights either way.
        gemm(
            "attn_kv_b_proj",
            L,
            lora * nq * (m.qk_nope_head_dim + vd),
            pkv + ds,
            lora,
            nq * (m.qk_nope_head_dim + vd),
        )
        elementwise("attn_rope", "rotary", L, T, 2 * (nq + 1) * rope)
        # Prefill attention over expanded heads; decode attention in latent space (MQA-like,
        # one latent "head" of width lora+rope shared by all nq query heads).
        p_flops = 2.0 * pairs * nq * (qk + vd)
        p_bytes = (
            pkv * latent * kvb
            + pt * latent * kvb
            + pkv * nq * (m.qk_nope_head_dim + vd) * a * 2
            + pt * nq * (qk + vd) * a
        )
        ops.append(Op("attn_prefill", "attention", L, p_flops, p_bytes, peak16))
        d_flops = 2.0 * dctx * nq * (latent + lora)
        d_bytes = dctx * latent * kvb + ds * latent * kvb + ds * nq * (latent + lora) * a
        ops.append(Op("attn_decode", "attention", L, d_flops, d_bytes, peak16))
        gemm("attn_post_proj", L, nq * vd * h, T, nq * vd, h)
    else:
        d = m.head_dim
        nkv = max(1, m.num_kv_heads // tp)  # vLLM replicates KV heads when tp > num_kv_heads
        qkv_w = (nq + 2 * nkv) * d
        bias = qkv_w if m.attention_bias else 0
        gemm("attn_pre_proj", L, h * qkv_w + bias, T, h, qkv_w)
        elementwise("attn_rope", "rotary", L, T, 2 * (nq + nkv) * d)
        kv_tok = 2 * nkv * d * kvb  # K and V bytes per token per layer on this rank
        full, win = m.num_full_attention_layers, m.num_sliding_layers

        def attention(suffix: str, count: int, prs: FloatArray, pk: FloatArray, dc: FloatArray) -> None:
            if count <= 0:
                return
            p_flops = 4.0 * prs * nq * d  # QK^T and PV: 2 FLOPs per multiply-add, d wide each
            p_bytes = pk * kv_tok + pt * kv_tok + pt * nq * d * a * 2
            ops.append(Op("attn_prefill" + suffix, "attention", count, p_flops, p_bytes, peak16))
            d_flops = 4.0 * dc * nq * d
            d_bytes = dc * kv_tok + ds * kv_tok + ds * nq * d * a * 2
            ops.append(Op("attn_decode" + suffix, "attention", count, d_flops, d_bytes, peak16))

        attention("", full, pairs, pkv, dctx)
        if win:

            def pick(x: FloatArray | None, default: FloatArray) -> FloatArray:
                return default if x is None else np.asarray(x, dtype=np.float64)

            attention(
                "_window",
                win,
                pick(batch.prefill_attn_pairs_window, pairs),
                pick(batch.prefill_kv_tokens_window, pkv),
                pick(batch.decode_ctx_tokens_window, dctx),
            )
        attn_o = nq * d * h + (h if m.attention_bias else 0)
        gemm("attn_post_proj", L, attn_o, T, nq * d, h)

    # ---- MLP: dense layers and MoE layers
    if m.num_dense_layers:
        inter = m.intermediate_size / tp
        gemm("mlp_up_proj", m.num_dense_layers, 2 * h * inter, T, h, 2 * inter)
        elementwise("mlp_act", "act", m.num_dense_layers, T, 3 * inter)
        gemm("mlp_down_proj", m.num_dense_layers, inter * h, T, inter, h)
    if m.num_moe_layers:
        n_moe, E, k = m.num_moe_layers, m.num_experts, m.experts_per_token
        # The router stays unquantised in vLLM (ReplicatedLinear in 16-bit on every rank).
        gemm("moe_router", n_moe, h * E, T, h, E, bytes_per_param=a, peak=peak16)
        # Expected distinct experts touched by T tokens, top-k of E, uniform routing:
        # E·(1 − (1 − k/E)^T). Each touched expert's weights are read once per step.
        # With dp ranks the layer runs on the tokens of all of them (each padded to T) and the
        # experts are spread over tp·dp GPUs: FLOPs per GPU stay those of T tokens over tp.
        dp = dep.dp
        t_moe = dp * T
        touched = E * (1.0 - np.power(1.0 - k / E, t_moe))
        inter = m.moe_intermediate_size / dep.moe_shards
        ex_params = 3 * h * inter
        ex_flops = 2.0 * t_moe * k * ex_params
        ex_bytes = touched * ex_params * w + t_moe * k * a * (h + 2 * inter + 3 * inter + inter + h)
        ops.append(Op("moe_experts", "gemm", n_moe, ex_flops, ex_bytes, peak_lin))
        if dp > 1:
            # allgather_reducescatter: all-gather the dp ranks' hidden states before the experts,
            # reduce-scatter the outputs after; each moves (dp−1)/dp of the gathered dp·T·h
            # tensor through every GPU's link, one call each.
            moved = 2.0 * (dp - 1) / dp * t_moe * h * a
            ops.append(Op("moe_dispatch_combine", "comm", n_moe, np.zeros_like(T), moved, calls=2.0 * busy))
        if m.num_shared_experts:
            sh = m.num_shared_experts * m.moe_intermediate_size / tp
            gemm("moe_shared_up_proj", n_moe, 2 * h * sh, T, h, 2 * sh)
            elementwise("moe_shared_act", "act", n_moe, T, 3 * sh)
            gemm("moe_shared_down_proj", n_moe, sh * h, T, sh, h)

    # ---- LM head (vocab-parallel, kept in 16-bit by vLLM's quantisation configs)
    vocab = m.vocab_size / tp
    lm_flops = 2.0 * n_logits * h * vocab
    lm_bytes = h * vocab * a * _mask(n_logits) + n_logits * (h * a + vocab * LOGIT_BYTES)
    ops.append(Op("lm_head", "gemm", 1, lm_flops, lm_bytes, peak16))

    # ---- communication
    zeros = np.zeros_like(T)
    if tp > 1:
        # Ring all-reduce moves 2(tp−1)/tp of the message through each GPU's link.
        ring = 2.0 * (tp - 1) / tp
        # after o_proj and after the MLP/MoE of every layer, and after the vocab-parallel embedding
        ops.append(Op("all_reduce", "comm", 2 * L + 1, zeros, ring * T * h * a, calls=busy))
        gather_bytes = n_logits * m.vocab_size * LOGIT_BYTES * (tp - 1) / tp
        ops.append(Op("logits_gather", "comm", 1, zeros, gather_bytes, calls=_mask(n_logits)))
    if dep.pp > 1:
        # hidden states and residual cross each stage boundary (vLLM's PP sends both)
        ops.append(Op("pp_send", "comm", dep.pp - 1, zeros, T * h * a * 2, calls=busy))
    return ops


def comm_time(hw: HardwareSpec, op: Op, link: LinkPath | None = None) -> FloatArray:
    """Seconds of ONE instance of a comm op: bytes over the link plus latency per call; on the
    deployment's stated or fitted ``link`` where it has one (``LinkPath.transfer_s``: hops · bytes /
    busbw + latency per call), else on the hardware entry's link factors."""
    calls = op.calls if op.calls is not None else _mask(op.bytes)
    if link is not None:
        return link.transfer_s(op.bytes, calls)  # type: ignore[no-any-return]
    return op.bytes / (hw.link_bandwidth_bytes_per_s * hw.link_efficiency) + calls * hw.link_latency_s


def elementwise_efficiency(
    hw: HardwareSpec, kernel: str, scales: Mapping[str, float] = ELEMENTWISE_KERNEL_SCALE
) -> float:
    """Share of HBM bandwidth an elementwise kernel of class ``kernel`` reaches on ``hw``: the
    hardware's ``elementwise`` factor times the class's relative scale, capped at the HBM roof
    (L2 hits that beat it on small tensors are not modelled)."""
    return min(1.0, hw.elementwise_efficiency * scales[kernel])


def op_times(
    hw: HardwareSpec, op: Op, scales: Mapping[str, float] = ELEMENTWISE_KERNEL_SCALE
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(compute-bound, memory-bound, kernel-floor-bound) seconds of ONE instance of a non-comm op.

    Exactly one of the three is non-zero per step: the largest of flops / (peak · compute_eff),
    bytes / (bandwidth · eff) and, when the op has any work, the hardware's min_kernel_s.
    ``scales`` swaps in other elementwise kernel scales (used when they are fitted).
    """
    peak = op.peak_flops_per_s * hw.compute_efficiency
    t_c = op.flops / peak if peak else np.zeros_like(op.flops)
    eff = elementwise_efficiency(hw, op.kernel, scales) if op.kind == "elementwise" else hw.memory_efficiency
    t_m = op.bytes / (hw.memory_bandwidth_bytes_per_s * eff)
    floor = np.where((op.flops > 0) | (op.bytes > 0), hw.min_kernel_s, 0.0)
    roof = np.maximum(t_c, t_m)
    floor_bound = floor > roof
    compute_bound = (t_c > t_m) & ~floor_bound
    memory_bound = ~compute_bound & ~floor_bound
    return (
        np.where(compute_bound, t_c, 0.0),
        np.where(memory_bound, t_m, 0.0),
        np.where(floor_bound, floor, 0.0),
    )


def step_cost(dep: Deployment, batch: StepBatch) -> StepCost:
    """Cost N steps at once. Pure and deterministic; a step with no tokens costs nothing."""
    return cost_from_ops(dep, operators(dep, batch), batch)


def cost_from_ops(
    dep: Deployment,
    ops: list[Op],
    batch: StepBatch,
    hardware: HardwareSpec | None = None,
    overhead_s: float | None = None,
) -> StepCost:
    """Assemble a StepCost from precomputed operators; ``hardware``/``overhead_s`` may swap in
    other efficiency factors (calibration re-evaluates the same operators many times)."""
    hw = dep.hardware if hardware is None else hardware
    step_overhead = dep.overhead_s if overhead_s is None else overhead_s
    n = batch.n
    compute = np.zeros(n)
    memory = np.zeros(n)
    comm = np.zeros(n)
    flops = np.zeros(n)
    nbytes = np.zeros(n)
    floor = np.zeros(n)
    for op in ops:
        if op.kind == "comm":
            comm += op.count * comm_time(hw, op, dep.link)
            continue
        t_c, t_m, t_f = op_times(hw, op)
        compute += op.count * t_c
        memory += op.count * t_m
        floor += op.count * t_f
        flops += op.count * op.flops
        nbytes += op.count * op.bytes
    tokens = np.asarray(batch.prefill_tokens, dtype=np.float64) + np.asarray(batch.decode_seqs, dtype=np.float64)
    # Kernels too small to reach either roof are launch/latency bound: counted as overhead.
    overhead = np.where(tokens > 0, step_overhead, 0.0) + floor
    # Pipeline stages run one after another for a step, so each op above (counted over all
    # layers) is already the latency sum; per-GPU work is the replica's work spread over tp×pp
    # GPUs, while the op FLOPs/bytes above are per TP rank over all stages.
    flops_gpu = flops / dep.pp
    bytes_gpu = nbytes / dep.pp
    time = compute + memory + comm + overhead
    stacked = np.stack([compute, memory, comm, overhead])
    binding = np.argmax(stacked, axis=0).astype(np.int8)
    safe = np.where(time > 0, time, 1.0)
    mfu = np.where(time > 0, flops_gpu / safe / hw.peak_for(dep.compute_dtype), 0.0)
    mbu = np.where(time > 0, bytes_gpu / safe / hw.memory_bandwidth_bytes_per_s, 0.0)
    return StepCost(
        time_s=time,
        flops=flops_gpu,
        bytes=bytes_gpu,
        compute_s=compute,
        memory_s=memory,
        comm_s=comm,
        overhead_s=overhead,
        binding=binding,
        mfu=mfu,
        mbu=mbu,
    )


# --------------------------------------------------------------------------------------------
# helpers to build StepBatch arrays for common shapes (used by validation, tests and `fit`)


def prefill_batch(
    prompt_tokens: FloatArray | list[float],
    batch_size: FloatArray | list[float] | float = 1.0,
    offset: FloatArray | list[float] | float = 0.0,
) -> StepBatch:
    """Steps that each prefill ``batch_size`` whole prompts of ``prompt_tokens`` at context ``offset``."""
    c = np.asarray(prompt_tokens, dtype=np.float64)
    b = np.broadcast_to(np.asarray(batch_size, dtype=np.float64), c.shape).astype(np.float64)
    o = np.broadcast_to(np.asarray(offset, dtype=np.float64), c.shape).astype(np.float64)
    zero = np.zeros_like(c)
    return StepBatch(
        prefill_tokens=b * c,
        prefill_seqs=b.copy(),
        prefill_attn_pairs=b * (c * o + c * (c + 1) / 2),
        prefill_kv_tokens=b * (o + c),
        decode_seqs=zero,
        decode_ctx_tokens=zero.copy(),
    )


def decode_batch(batch_size: FloatArray | list[float] | float, context: FloatArray | list[float] | float) -> StepBatch:
    """Steps that each decode one token for ``batch_size`` sequences of ``context`` tokens."""
    b = np.atleast_1d(np.asarray(batch_size, dtype=np.float64))
    c = np.atleast_1d(np.asarray(context, dtype=np.float64))
    b, c = np.broadcast_arrays(b, c)
    zero = np.zeros_like(b, dtype=np.float64)
    return StepBatch(
        prefill_tokens=zero,
        prefill_seqs=zero.copy(),
        prefill_attn_pairs=zero.copy(),
        prefill_kv_tokens=zero.copy(),
        decode_seqs=b.astype(np.float64),
        decode_ctx_tokens=(b * c).astype(np.float64),
    )


# --------------------------------------------------------------------------------------------
# fast path: the same model as tables, for the replay engines' many small calls

#: Size of the probe steps that read off the attention operators' affine coefficients: a power
#: of two small enough that the probed FLOPs and bytes (integer-valued for every catalog model at
#: tp ≤ 8) stay exact in float64, so the differences are exact and structural zeros stay zero.
_PROBE_SCALE = float(2**20)
#: Relative agreement with step_cost the tables must show on their self-check.
TABLE_RTOL = 1e-12
#: Operators driven by the sampled positions (prefill_seqs + decode_seqs), not the tokens.
LOGIT_OPS = frozenset({"lm_head", "logits_gather"})


def _is_affine_op(op: Op) -> bool:
    """Attention operators (and MLA's kv_b projection, driven by the context): the ones whose
    FLOPs and bytes depend on other step fields than the token count."""
    return op.name.startswith(("attn_prefill", "attn_decode", "attn_kv_b_proj"))


def add_roofline_terms(tab: FloatArray, op: Op, hw: HardwareSpec, link: LinkPath | None = None) -> None:
    """Add one operator's roofline seconds (all its instances) to a step-cost table's compute,
    memory, collective and kernel-floor columns (pipeline/costmodel/stepcost.py TAB_COLUMNS);
    collectives on ``link`` where the deployment has one."""
    if op.kind == "comm":
        tab[:, 2] += op.count * comm_time(hw, op, link)
        return
    t_c, t_m, t_f = op_times(hw, op)
    tab[:, 0] += op.count * t_c
    tab[:, 1] += op.count * t_m
    tab[:, 3] += op.count * t_f


def _tabulate(dep: Deployment, ops: list[Op], hw: HardwareSpec) -> FloatArray:
    """Sum the operators' roofline terms per row into TAB_COLUMNS (rows are the probe steps)."""
    n = ops[0].flops.shape[0] if ops else 0
    tab = np.zeros((n, N_TAB))
    for op in ops:
        add_roofline_terms(tab, op, hw, dep.link)
        if op.kind == "comm":
            continue
        tab[:, 4] += op.count * op.flops
        tab[:, 5] += op.count * op.bytes
    return tab


def roofline_tables(dep: Deployment, max_tokens: int) -> tuple[FloatArray, FloatArray]:
    """(token table, logits table) of ``dep`` for T and n in 0..max_tokens (stepcost module doc)."""
    t = np.arange(max_tokens + 1, dtype=np.float64)
    zero = np.zeros_like(t)
    # T tokens as decodes: every token-driven operator sees T tokens (attention is excluded).
    probe = StepBatch(zero, zero.copy(), zero.copy(), zero.copy(), t, t.copy())
    ops = operators(dep, probe)
    tok = _tabulate(dep, [o for o in ops if o.name not in LOGIT_OPS and not _is_affine_op(o)], dep.hardware)
    logit = _tabulate(dep, [o for o in ops if o.name in LOGIT_OPS], dep.hardware)
    return tok, logit


def roofline_affine(dep: Deployment) -> dict[str, Any]:
    """The attention operators as affine maps of the six step fields (stepcost.affine_cost's
    arguments): coefficients read off :func:`operators` itself with 7 probe steps, so the
    formulas exist once."""
    hw = dep.hardware
    s = _PROBE_SCALE
    rows = np.zeros((7, 6))
    rows[:, 4] = 1.0  # row 0: one decode token (every mask 1, every other field 0)
    for j in range(6):
        rows[j + 1, j] += s
    probe = StepBatch(*(rows[:, j].copy() for j in range(6)))
    ops = [op for op in operators(dep, probe) if _is_affine_op(op)]
    base = rows[0]
    fc = np.zeros((len(ops), 7))
    bc = np.zeros((len(ops), 7))
    for i, op in enumerate(ops):
        for coef, v in ((fc, op.flops), (bc, op.bytes)):
            coef[i, 1:] = (v[1:] - v[0]) / s
            intercept = v[0] - float(coef[i, 1:] @ base)
            # Mask terms (weights read once per step) are huge next to one token's share;
            # anything this small is rounding of a structurally absent intercept.
            coef[i, 0] = intercept if abs(intercept) > 1e-9 * abs(v[0]) else 0.0
    peak = np.array([op.peak_flops_per_s * hw.compute_efficiency for op in ops])
    return {
        "flops": fc,
        "nbytes": bc,
        "count": np.array([float(op.count) for op in ops]),
        "peak": np.where(peak > 0, peak, 1.0),
        "has_peak": peak > 0,
        "bw": np.array([hw.memory_bandwidth_bytes_per_s * hw.memory_efficiency for op in ops]),
    }


def roofline_cost(dep: Deployment, max_tokens: int = 32768) -> Any:
    """``step_cost(dep, ·)`` as a :class:`pipeline.costmodel.stepcost.TabulatedCost` (tier 2: the roofline
    with the catalog's efficiency factors), for steps of up to ``max_tokens`` tokens; larger
    steps extend the tables on demand."""
    max_tokens = table_size(max_tokens)
    tok, logit = roofline_tables(dep, max_tokens)
    aff = roofline_affine(dep)
    hw = dep.hardware
    sc = scalars(
        min_kernel_s=hw.min_kernel_s,
        base_s=dep.overhead_s,
        pp=float(dep.pp),
        peak_gpu=hw.peak_for(dep.compute_dtype),
        bw_gpu=hw.memory_bandwidth_bytes_per_s,
    )
    shell = affine_cost(aff["flops"], aff["nbytes"], aff["count"], aff["peak"], aff["has_peak"], aff["bw"], sc)
    return TabulatedCost(
        tok=np.ascontiguousarray(tok),
        logit=np.ascontiguousarray(logit),
        affine_flops=shell.affine_flops,
        affine_bytes=shell.affine_bytes,
        affine_count=shell.affine_count,
        affine_peak=shell.affine_peak,
        affine_has_peak=shell.affine_has_peak,
        affine_bw=shell.affine_bw,
        decode_grid=shell.decode_grid,
        prefill_grid=shell.prefill_grid,
        scalars=sc,
        source="roofline",
        describe={
            "tier": "roofline",
            "hardware": hw.name,
            "calibrated_on": hw.calibrated_on,
            **({"link": dep.link.describe()} if dep.link is not None else {}),
        },
        extend=lambda t: roofline_cost(dep, max(t, 2 * max_tokens)),
        exact=dep,
    )


def affine_check_batch(n: int = 256, seed: int = 0) -> StepBatch:
    """Engine-shaped steps (pure decode, pure prefill chunks, mixed) for checking the fast path."""
    rng = np.random.default_rng(seed)
    ds = rng.integers(0, 1025, n).astype(np.float64)
    dctx = ds * rng.integers(1, 131073, n)
    chunks = rng.integers(0, 4, n).astype(np.float64)
    c = rng.integers(2, 8193, n).astype(np.float64)
    o = rng.integers(0, 131072, n).astype(np.float64)
    pure_decode = rng.random(n) < 0.3
    chunks[pure_decode] = 0.0
    ds[(chunks == 0) & (ds == 0)] = 1.0
    dctx = np.maximum(dctx, ds)
    return StepBatch(
        prefill_tokens=chunks * c,
        prefill_seqs=chunks,
        prefill_attn_pairs=chunks * (c * o + c * (c + 1) / 2),
        prefill_kv_tokens=chunks * (o + c),
        decode_seqs=ds,
        decode_ctx_tokens=np.where(ds > 0, dctx, 0.0),
    )


def fast_step_cost(dep: Deployment, max_tokens: int = 32768) -> Any:
    """``step_cost(dep, ·)`` as tables (:func:`roofline_cost`), checked against step_cost on
    :func:`affine_check_batch` (relative TABLE_RTOL): a failure is a bug, raised."""
    fast: TabulatedCost = roofline_cost(dep, max_tokens)
    check = affine_check_batch()
    want, got = step_cost(dep, check), fast(check)
    for name in ("time_s", "flops", "bytes", "compute_s", "memory_s", "comm_s", "overhead_s"):
        a, b = getattr(want, name), getattr(got, name)
        bad = ~(np.abs(a - b) <= TABLE_RTOL * np.abs(a))
        if np.any(bad):
            raise AssertionError(f"cost tables of {dep.model.name} disagree with step_cost on {name}")
    return fast
