"""GPU memory fit: weights, activations, runtime reserve and the KV cache left over.

Follows vLLM's accounting (``gpu_memory_utilization`` is the fraction of each GPU's memory the
engine may use; the KV cache gets what is left of it after the weights, the peak activation of
a profiling forward pass and non-torch memory). Per GPU of one replica of ``tp × pp`` GPUs.

KV bytes per token (per GPU, per token of context):

- MHA/GQA/MQA: ``2 (K and V) · max(1, kv_heads / tp) · head_dim · dtype_bytes · layers``
  (vLLM replicates KV heads when tp exceeds them).
- MLA (DeepSeek-V2/V3): ``(kv_lora_rank + qk_rope_head_dim) · dtype_bytes · layers``; the
  compressed latent is shared by all heads and *replicated* on every TP rank, so tp does not
  divide it.
- Sliding-window layers keep at most ``W`` tokens per sequence. :func:`kv_bytes_per_token`
  counts the full-attention layers only; :func:`kv_window_bytes_per_token` gives the window
  layers' bytes per token, which a sequence pays for min(context, W) tokens only (vLLM v1's
  hybrid allocator frees blocks that slide out of the window). :func:`sequence_kv_bytes`
  combines both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pipeline.catalog import ModelSpec, kv_format, list_hardware, load_hardware, weight_format
from pipeline.errors import ConfigError
from pipeline.roofline import ACT_BYTES, LOGIT_BYTES, Deployment

GiB = float(2**30)

#: CUDA/HIP context and non-torch allocations on each GPU. vLLM's memory profiler reports
#: "non-torch memory" of about 0.3-1.0 GiB per GPU on H100 runs; 0.75 GiB is the midpoint.
CUDA_CONTEXT_BYTES = 0.75 * GiB
#: NCCL communicator buffers per GPU when tp or pp > 1 (NCCL_BUFFSIZE is 4 MiB per channel and
#: peer; with up to 32 channels on NVLink this reaches ~0.25-0.5 GiB). 0.5 GiB, an upper-middle value.
NCCL_BYTES = 0.5 * GiB
#: CUDA-graph capture pool: vLLM logs "Graph capturing finished ... took 0.3-1.5 GiB" for its
#: default ~67 batch sizes; 1 GiB is the order of that.
CUDA_GRAPH_BYTES = 1.0 * GiB
#: Allocator fragmentation, as a fraction of the activation peak (PyTorch's caching allocator
#: rounds blocks to 2 MiB segments and 512 B; a few percent of the transient peak is typical).
FRAGMENTATION_FRACTION = 0.05
#: vLLM v1's default token budget per step for online serving (SchedulerConfig,
#: max_num_batched_tokens = 8192 since v0.8 on data-centre GPUs); sets the profiling activation.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


def _kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    return max(1, model.num_kv_heads // tp)


def _kv_elems_per_layer(model: ModelSpec, tp: int) -> float:
    """KV elements stored per token per layer on one TP rank."""
    if model.is_mla:
        return float(model.kv_lora_rank + model.qk_rope_head_dim)
    return 2.0 * _kv_heads_per_gpu(model, tp) * model.head_dim


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str = "bf16", tp: int = 1) -> float:
    """KV-cache bytes per token of context on one GPU, for the full-attention layers."""
    if tp < 1:
        raise ConfigError(f"tp must be >= 1, got {tp}")
    return _kv_elems_per_layer(model, tp) * kv_format(kv_dtype).bytes * model.num_full_attention_layers


def kv_window_bytes_per_token(model: ModelSpec, kv_dtype: str = "bf16", tp: int = 1) -> float:
    """KV bytes per token on one GPU for the sliding-window layers (paid for ≤ W tokens)."""
    return _kv_elems_per_layer(model, tp) * kv_format(kv_dtype).bytes * model.num_sliding_layers


def sequence_kv_bytes(
    model: ModelSpec, context: int, kv_dtype: str = "bf16", tp: int = 1, block_size: int = 1
) -> float:
    """KV bytes one sequence of ``context`` tokens holds on one GPU, rounded up to whole blocks.

    Window layers hold min(context, W) tokens plus one block (the block the window straddles).
    """
    blocks = math.ceil(context / block_size) * block_size
    full = kv_bytes_per_token(model, kv_dtype, tp) * blocks
    if model.num_sliding_layers:
        window = min(blocks, (math.ceil(model.sliding_window / block_size) + 1) * block_size)
        full += kv_window_bytes_per_token(model, kv_dtype, tp) * window
    return full


# --------------------------------------------------------------------------------------------


def _stage_layers(dep: Deployment) -> int:
    return math.ceil(dep.model.num_layers / dep.pp)


def weights_bytes_per_gpu(dep: Deployment) -> float:
    """Weight bytes on the most loaded GPU (the pipeline stage with the most layers).

    Linear layers of the blocks take the deployment's weight format; embeddings, LM head,
    norms and MoE routers stay 16-bit (vLLM's quantisation configs skip them). Replicated
    pieces (MLA's fused q_a/kv_a projection, routers) are not divided by tp.
    """
    m, tp = dep.model, dep.tp
    w = weight_format(dep.weight_dtype).bytes_per_param
    h = m.hidden_size
    replicated = 0.0
    if m.is_mla:
        replicated = h * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
        sharded_attn = m.attention_params() - replicated
    else:
        sharded_attn = m.attention_params()
    dense_frac = m.num_dense_layers / m.num_layers
    moe_frac = m.num_moe_layers / m.num_layers
    per_layer_linear = (
        sharded_attn / tp
        + replicated
        + dense_frac * m.dense_mlp_params() / tp
        + moe_frac * (m.num_experts + m.num_shared_experts) * m.expert_params() / tp
    )
    per_layer_16bit = 2 * h + moe_frac * m.router_params()
    layers = _stage_layers(dep)
    embed = m.vocab_size * h / tp
    head = (0 if m.tie_word_embeddings else m.vocab_size * h / tp) if dep.pp == 1 else m.vocab_size * h / tp
    ends = embed + head if dep.pp == 1 else max(embed, head)
    return layers * (per_layer_linear * w + per_layer_16bit * ACT_BYTES) + (ends + h) * ACT_BYTES


def activation_bytes_per_gpu(dep: Deployment, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """Peak transient memory of vLLM's profiling forward pass (``max_num_batched_tokens`` tokens).

    Hidden state, residual and norm output (3·h), plus the widest intermediate of a layer on
    this rank (gate+up output and its activation: 3·I/tp; for MoE the top-k expanded tokens),
    plus fp32 logits and probabilities for ``max_num_seqs`` sampled sequences.
    """
    m, tp = dep.model, dep.tp
    t = float(max_num_batched_tokens)
    widths = [3.0 * m.intermediate_size / tp if m.num_dense_layers else 0.0]
    if m.is_moe:
        widths.append(3.0 * m.experts_per_token * m.moe_intermediate_size / tp)
    if m.is_mla:
        widths.append(2.0 * m.num_attention_heads / tp * (m.qk_nope_head_dim + m.v_head_dim))
    else:
        widths.append((m.num_attention_heads / tp + 2 * _kv_heads_per_gpu(m, tp)) * m.head_dim)
    per_token = 3.0 * m.hidden_size + max(widths)
    logits = 2.0 * max_num_seqs * m.vocab_size / tp * LOGIT_BYTES
    return t * per_token * ACT_BYTES + logits


def reserve_bytes_per_gpu(dep: Deployment) -> float:
    """Non-torch memory: CUDA context, NCCL buffers (multi-GPU), CUDA-graph pool."""
    return CUDA_CONTEXT_BYTES + (NCCL_BYTES if dep.gpus > 1 else 0.0) + CUDA_GRAPH_BYTES


@dataclass(frozen=True)
class MemoryFit:
    """Memory plan of one replica; byte figures are per GPU unless the name says replica."""

    model: str
    hardware: str
    tp: int
    pp: int
    weight_dtype: str
    kv_dtype: str
    gpu_memory_utilization: float
    context: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    memory_bytes_per_gpu: float
    budget_bytes_per_gpu: float
    weights_bytes_per_gpu: float
    activation_bytes_per_gpu: float
    reserve_bytes_per_gpu: float
    fragmentation_bytes_per_gpu: float
    kv_pool_bytes_per_gpu: float
    kv_bytes_per_token: float
    kv_window_bytes_per_token: float
    sliding_window: int
    kv_capacity_tokens: int
    kv_capacity_blocks: int
    fits: bool
    shortfall_bytes: float
    suggestions: list[str] = field(default_factory=list)
    _model_spec: ModelSpec | None = field(default=None, compare=False, repr=False)

    def sequence_kv_bytes(self, context: int) -> float:
        """Per-GPU KV bytes of one sequence of ``context`` tokens (whole blocks)."""
        if self._model_spec is None:
            raise ConfigError("MemoryFit lacks its model spec")
        stage = math.ceil(self._model_spec.num_layers / self.pp) / self._model_spec.num_layers
        return stage * sequence_kv_bytes(self._model_spec, context, self.kv_dtype, self.tp, self.block_size)

    def max_concurrent_seqs(self, context: int) -> int:
        """How many sequences of ``context`` tokens the KV pool holds at once (not capped by
        max_num_seqs; vLLM logs the same figure as "Maximum concurrency")."""
        if context < 1:
            raise ConfigError(f"context must be >= 1, got {context}")
        if self.kv_pool_bytes_per_gpu <= 0:
            return 0
        return int(self.kv_pool_bytes_per_gpu // self.sequence_kv_bytes(context))

    def to_dict(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_model_spec"}
        doc["suggestions"] = list(self.suggestions)
        doc["max_concurrent_seqs_at_context"] = self.max_concurrent_seqs(self.context)
        return doc


def _core(
    dep: Deployment, util: float, context: int, block_size: int, max_num_seqs: int, max_batched: int
) -> MemoryFit:
    m, hw = dep.model, dep.hardware
    budget = util * hw.memory_bytes
    weights = weights_bytes_per_gpu(dep)
    act = activation_bytes_per_gpu(dep, max_batched, max_num_seqs)
    reserve = reserve_bytes_per_gpu(dep)
    frag = FRAGMENTATION_FRACTION * act
    pool = budget - weights - act - reserve - frag
    stage = _stage_layers(dep) / m.num_layers
    bpt = kv_bytes_per_token(m, dep.kv_dtype, dep.tp) * stage
    wbpt = kv_window_bytes_per_token(m, dep.kv_dtype, dep.tp) * stage
    # Tokens of context the pool holds when every sequence is `context` long: window layers
    # cost wbpt for min(context, W) of those tokens.
    seq = stage * sequence_kv_bytes(m, context, dep.kv_dtype, dep.tp, block_size)
    per_token_eff = seq / (math.ceil(context / block_size) * block_size)
    tokens = int(max(pool, 0.0) // per_token_eff) if per_token_eff > 0 else 0
    blocks = tokens // block_size
    tokens = blocks * block_size
    fits = pool >= seq
    shortfall = 0.0 if fits else seq - pool
    return MemoryFit(
        model=m.name,
        hardware=hw.name,
        tp=dep.tp,
        pp=dep.pp,
        weight_dtype=dep.weight_dtype,
        kv_dtype=dep.kv_dtype,
        gpu_memory_utilization=util,
        context=context,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched,
        memory_bytes_per_gpu=hw.memory_bytes,
        budget_bytes_per_gpu=budget,
        weights_bytes_per_gpu=weights,
        activation_bytes_per_gpu=act,
        reserve_bytes_per_gpu=reserve,
        fragmentation_bytes_per_gpu=frag,
        kv_pool_bytes_per_gpu=pool,
        kv_bytes_per_token=bpt,
        kv_window_bytes_per_token=wbpt,
        sliding_window=m.sliding_window,
        kv_capacity_tokens=tokens,
        kv_capacity_blocks=blocks,
        fits=fits,
        shortfall_bytes=shortfall,
        _model_spec=m,
    )


def _gib(x: float) -> str:
    return f"{x / GiB:.1f} GiB"


def _suggest(
    dep: Deployment,
    util: float,
    context: int,
    block_size: int,
    max_num_seqs: int,
    max_batched: int,
    base: MemoryFit,
) -> list[str]:
    """Concrete changes that make the deployment fit, each checked by re-running the fit."""
    out: list[str] = []
    m, hw = dep.model, dep.hardware

    def attempt(**changes: Any) -> MemoryFit | None:
        try:
            candidate = replace(dep, **changes)
        except ConfigError:
            return None
        return _core(candidate, util, context, block_size, max_num_seqs, max_batched)

    tp = dep.tp * 2
    while tp <= hw.gpus_per_node:
        got = attempt(tp=tp)
        if got is not None and got.fits:
            out.append(
                f"more tensor parallelism: --tp {tp} fits ({_gib(got.kv_pool_bytes_per_gpu)} KV per GPU, "
                f"{got.kv_capacity_tokens:,} tokens)"
            )
            break
        tp *= 2
    current = weight_format(dep.weight_dtype).bytes_per_param
    for dtype in ("fp8", "int4", "nvfp4"):
        if weight_format(dtype).bytes_per_param >= current:
            continue
        if dtype == "nvfp4" and "fp4" not in hw.peak_flops_per_s:
            continue
        got = attempt(weight_dtype=dtype)
        if got is not None and got.fits:
            out.append(
                f"lower weight precision: --weights {dtype} fits "
                f"({_gib(got.weights_bytes_per_gpu)} weights per GPU)"
            )
            break
    if kv_format(dep.kv_dtype).bytes > kv_format("fp8").bytes:
        got = attempt(kv_dtype="fp8")
        if got is not None and got.fits:
            out.append(f"fp8 KV cache: --kv-dtype fp8 fits at context {context:,}")
    if base.kv_pool_bytes_per_gpu > 0:
        stage = math.ceil(m.num_layers / dep.pp) / m.num_layers

        def one_seq(c: int) -> float:
            return stage * sequence_kv_bytes(m, c, dep.kv_dtype, dep.tp, block_size)

        lo, hi = 0, context
        while lo < hi:  # largest context whose one sequence fits the pool (bytes grow with c)
            mid = (lo + hi + 1) // 2
            if one_seq(mid) <= base.kv_pool_bytes_per_gpu:
                lo = mid
            else:
                hi = mid - 1
        if lo >= block_size:
            out.append(f"shorter context: --context {lo:,} fits (one sequence)")
    if util < 0.95:
        got = _core(dep, 0.95, context, block_size, max_num_seqs, max_batched)
        if got.fits:
            out.append("higher --gpu-memory-utilization 0.95 fits")
    for name in list_hardware():
        other = load_hardware(name)
        if other.memory_bytes <= hw.memory_bytes or name == hw.name:
            continue
        got = attempt(hardware=other)
        if got is not None and got.fits:
            out.append(f"a larger GPU: {name} ({_gib(other.memory_bytes)}) fits at tp {dep.tp}")
            break
    if not out:
        out.append("no single change fits: combine more tensor/pipeline parallelism with lower precision")
    return out


def fit(
    dep: Deployment,
    gpu_memory_utilization: float = 0.9,
    context: int | None = None,
    block_size: int = 16,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> MemoryFit:
    """Plan the memory of one replica; when it does not fit, say by how much and what would.

    ``context`` defaults to the model's max_position_embeddings; the deployment fits when one
    sequence of that length fits the KV pool (vLLM's start-up check for max_model_len).
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1:
        raise ConfigError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")
    ctx = context if context is not None else dep.model.max_position_embeddings
    if ctx < 1:
        raise ConfigError(f"context must be >= 1, got {ctx}")
    base = _core(dep, gpu_memory_utilization, ctx, block_size, max_num_seqs, max_num_batched_tokens)
    if base.fits:
        return base
    tips = _suggest(dep, gpu_memory_utilization, ctx, block_size, max_num_seqs, max_num_batched_tokens, base)
    return replace(base, suggestions=tips)
