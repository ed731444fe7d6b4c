"""GPU memory fit: weights, activations, runtime reserve and the KV cache left over.

Follows vLLM V1's own accounting (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``
with ``vllm/utils/mem_utils.py`` ``memory_profiling``; see tests/data/vllm_kv_method.md), per GPU
of one replica of ``tp × pp`` GPUs::

    requested = total × gpu_memory_utilization          (total = what CUDA reports, not the datasheet)
    available = requested − (weights + peak activation + non-torch memory
                             [+ CUDA-graph estimate, vLLM ≥ 0.21 only])
    blocks    = available // (block_size × KV bytes per token of one layer × layers)
    tokens    = blocks × block_size

- **total**: ``torch.cuda.mem_get_info()`` total, about 1 % under the datasheet capacity the
  hardware catalog carries (:data:`CUDA_VISIBLE_FRACTION`).
- **weights**: :func:`weights_bytes_per_gpu`, from the catalog model and the weight format.
- **peak activation**: the torch peak of vLLM's profile run (``gpu_model_runner.profile_run``): a
  dummy forward of ``max_num_batched_tokens`` tokens spread over min(that, ``max_num_seqs``)
  requests, then a sampler run on one logits row per request. The forward's intermediates are
  freed before the sampler runs, so the peak is the larger of the two
  (:func:`activation_bytes_per_gpu`).
- **non-torch memory**: what the profile run adds outside PyTorch's allocator (cuBLAS and
  attention workspaces, lazily created NCCL/custom all-reduce buffers when tp > 1); CUDA context
  and NCCL communicators made before vLLM's initial snapshot are not charged. A constant per
  vLLM generation and single/multi-GPU (:func:`non_torch_bytes_per_gpu`), read from start-up logs.
- **CUDA graphs**: captured after the KV cache is sized, so not charged, except from vLLM 0.21,
  which subtracts its estimate of the graph pool (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
  on by default). ``fit(vllm_version=...)`` selects the accounting; the default is
  :data:`DEFAULT_VLLM_VERSION`, the newest version the checked reports come from.

Checked against public vLLM start-up logs in tests/test_vllm_kv_capacity.py (table and errors in
docs/catalog.md, "Memory fit").

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

from pipeline.catalog import HardwareSpec, ModelSpec, kv_format, list_hardware, load_hardware, weight_format
from pipeline.common.errors import ConfigError
from pipeline.costmodel.roofline import ACT_BYTES, Deployment

GiB = float(2**30)

#: vLLM's requested memory is ``gpu_memory_utilization`` × the total CUDA reports
#: (``torch.cuda.mem_get_info``), which is under the datasheet capacity of the hardware catalog:
#: an H100 80GB reports 79.19 GiB (llm-d-planner accuracy report v0.19.0: "catalog 80 GiB,
#: physical 79.19 GiB"; llm-d-benchmark: 79.18 GiB). Applied to every GPU as a fraction; only the
#: H100 is measured here (an RTX 3090 reports 23.58 of 24 GiB, vllm#10517: 0.7 % less again).
CUDA_VISIBLE_FRACTION = 79.19 / 80.0

#: The version whose accounting ``fit`` follows by default: the newest vLLM release that the
#: reports in tests/data/vllm_kv_reports.toml were logged with (llm-d-planner, v0.19.0).
DEFAULT_VLLM_VERSION = "0.19.0"

#: Oldest version modelled: V1 is the default engine from v0.8.0, and its profile run includes
#: the sampler since vllm#13594 (Feb 2025). V0's profiler (vllm/worker/worker.py) differs.
MIN_VLLM_VERSION = (0, 8)
#: First version *not* modelled: the accounting covers the 0.x series only. A 0.x release newer
#: than the last change modelled (CUDA_GRAPH_ESTIMATE_SINCE, 0.21) takes that change's accounting;
#: a 1.0 or later release may account memory differently, so it is refused rather than guessed.
VLLM_VERSION_LIMIT = (1,)

#: vLLM's ``--block-size`` choices (vllm/config/cache.py: ``BlockSize = Literal[1, 8, 16, 32, 64,
#: 128, 256]``); vLLM refuses any other value at start-up.
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
#: Most tokens one step (``max_num_batched_tokens``) or sequences (``max_num_seqs``) the memory
#: fit takes. vLLM sets no bound; this one is 2,048 times its 8192-token default, where the profile
#: run's activation alone (≥ 3 · hidden_size · 2 B per token) is at least 96 GiB per GPU for every
#: catalog model (hidden_size ≥ 1024).
MAX_BATCH = 2**24

#: Sampler bytes per logit element (rows × vocab) live at the sampler's peak in the profile
#: run, counted from vLLM's code. Both paths hold the model-dtype logits from ``compute_logits``
#: (2 B; gpu_model_runner._dummy_sampler_run) and their fp32 copy (4 B; v1/sample/sampler.py
#: ``logits.to(torch.float32)``).
#: Fused top-k/top-p (Triton ``apply_top_k_top_p_triton`` or FlashInfer; both mask in place):
#: + fp32 probabilities (4 B; topk_topp_sampler.forward_native ``logits.softmax``) + the
#: exponential noise of ``random_sample`` (4 B; ``q = empty_like(probs)``) = 14 B.
SAMPLER_FUSED_BYTES_PER_LOGIT = 14.0
#: PyTorch sort-based top-k/top-p (``apply_top_k_top_p_pytorch``: ``logits.sort``): + PyTorch's
#: segmented radix sort, an int64 index iota (8 B), the sorted values and int64 indices
#: (4 + 8 B) and CUB's alternate key/value buffers (4 + 8 B) = 38 B. Check on runs outside the
#: judged table: llm-d-benchmark's gpt-oss-20b and gpt-oss-120b logs (H100, 1,024 rows × 201,088
#: vocab) show a 7.38 GiB peak; 38 B gives 7.29 GiB + 0.04 GiB of hidden states (-0.7 %).
SAMPLER_SORT_BYTES_PER_LOGIT = 38.0
#: Which sampler path the profile run takes, by version (first version of each span):
#: - before 0.11: sort (flashinfer-python was not a pip dependency yet; vllm#26859 says it became
#:   one, and the LMCache images ship without it, LMCache#1384; vLLM's own docker image did ship
#:   FlashInfer, whose fused path this does not cover for those versions);
#: - 0.11.0: fused (FlashInfer sampler on by default; vllm#26859, merged 2025-10-15, turned it off);
#: - 0.11.1: sort again;
#: - 0.18: fused (Triton top-k/top-p, vllm#33538 merged Feb 2026; listed in the v0.18.0 API docs,
#:   docs.vllm.ai/en/v0.18.0/api/vllm/v1/sample/ops/topk_topp_triton; 0.16/0.17 may have it already).
SAMPLER_PATH_SINCE: tuple[tuple[tuple[int, ...], str], ...] = (
    ((0, 8), "sort"),
    ((0, 11, 0), "fused"),
    ((0, 11, 1), "sort"),
    ((0, 18), "fused"),
)

#: Non-torch memory the profile run adds per GPU ("non-torch forward increase memory" in
#: vLLM's DEBUG log), by generation and single vs multi-GPU (tp > 1: NCCL and custom all-reduce
#: buffers are created lazily in the first forward). pp > 1 with tp = 1 takes the single-GPU value.
#: From 0.18 (v0.19.0 logs, H100), llm-d-planner accuracy report v0.19.0 (runs that are not rows
#: of the checked table): 0.25 GiB at tp = 1 (Qwen3-8B, phi-4, gemma-2-9b: -40.00 % against the
#: planner's 0.15 GiB constant); 2.1 GiB at tp > 1 (Llama-3.1-8B and Qwen2.5-7B at TP=2:
#: 2.06-2.07, at TP=4: 2.13).
NON_TORCH_BYTES = 0.25 * GiB
NON_TORCH_MULTI_GPU_BYTES = 2.1 * GiB
#: Before 0.18 (llm-d-benchmark config_explorer runs, H100, v0.11 era): 0.13 GiB at tp = 1 (its
#: gpt-oss-20b and gpt-oss-120b runs, not rows of the checked table) and 0.55 GiB at tp > 1 (its
#: Llama-3.3-70B-FP8 TP=2 row: FITTED, so that row is not judged). Where between 0.11 and 0.19
#: the values changed is not observed; 0.18 (the sampler change above) is assumed.
NON_TORCH_BYTES_PRE_018 = 0.13 * GiB
NON_TORCH_MULTI_GPU_BYTES_PRE_018 = 0.55 * GiB
NON_TORCH_SINCE = (0, 18)
#: What tensor parallelism adds to the single-GPU non-torch memory when the GPUs talk over PCIe
#: (no NVLink, no NVSwitch: NCCL runs few channels over PCIe and never sets up NVLink SHARP
#: buffers): the only public PCIe log with tp > 1, two RTX 4090s (vllm-project/vllm#13061, V0
#: engine: "non_torch_memory takes 0.25GiB" at TP=2), less that generation's single-GPU 0.13 GiB.
#: The multi-GPU constants above were measured on H100 NVLink boxes and over-reserved 1.7-1.9 GiB
#: per GPU on two RTX PRO 6000s over PCIe (rows 27 and 36 of tests/data/vllm_kv_reports.toml,
#: which missed by -7.0 % and -40.1 % before; this value was not fitted on them: docs/catalog.md).
#: An assumption: the increment is taken as version-independent, though on H100 NVLink it grew
#: from 0.42 to 1.85 GiB between the two generations; scaled the same way (0.53 GiB) row 27
#: would read -4.7 % instead of -3.9 %.
NON_TORCH_TP_PCIE_EXTRA_BYTES = 0.12 * GiB

#: From v0.21 vLLM subtracts its estimate of the CUDA-graph pool from the KV budget
#: (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default: "CUDA graph memory profiling is
#: enabled (default since v0.21.0)", gpustack/runner#251 log of v0.27.1; tests/data/vllm_kv_method.md §4).
CUDA_GRAPH_ESTIMATE_SINCE = (0, 21)
#: The estimate: "Estimated CUDA graph memory: 0.84 GiB total" for 51 PIECEWISE + 51 FULL
#: capture sizes (llm-d-planner v0.19.0 Llama-3.1-8B H100 log, which computed but did not
#: apply it; 0.71-0.84 GiB in the other v0.19.0 logs). One figure for every model and GPU; not
#: checked against a v0.21+ KV figure (no such report in the table).
CUDA_GRAPH_ESTIMATE_BYTES = 0.84 * GiB

#: Kept for API compatibility: vLLM's profiler measures the allocator's peak, which includes
#: fragmentation, so no separate term is charged (MemoryFit.fragmentation_bytes_per_gpu is 0).
FRAGMENTATION_FRACTION = 0.0
#: vLLM v1's default token budget per step for online serving (SchedulerConfig,
#: max_num_batched_tokens = 8192 since v0.8 on data-centre GPUs); sets the profiling activation.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


def parse_vllm_version(version: str) -> tuple[int, ...]:
    """``"0.19.0"``, ``"v0.11.1"``, ``"0.20.2rc1.dev9+g01d4d1a"`` -> (0, 19, 0), (0, 11, 1), (0, 20, 2)."""
    text = version.strip().lstrip("vV")
    parts: list[int] = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(piece):
            break
    if len(parts) < 2:
        raise ConfigError(f"vllm_version must look like '0.19.0', got {version!r}")
    if tuple(parts) < MIN_VLLM_VERSION:
        raise ConfigError(
            f"vllm_version {version!r}: the V0 engine's memory accounting (before 0.8) is not modelled; "
            f"{KNOWN_VLLM_VERSIONS}"
        )
    if tuple(parts) >= VLLM_VERSION_LIMIT:
        raise ConfigError(f"vllm_version {version!r} is not a release the memory model knows; {KNOWN_VLLM_VERSIONS}")
    return tuple(parts)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)


#: What ``vllm_version`` accepts, as error messages say it.
_CHANGES = sorted({v for v, _ in SAMPLER_PATH_SINCE[1:]} | {NON_TORCH_SINCE, CUDA_GRAPH_ESTIMATE_SINCE})
KNOWN_VLLM_VERSIONS = (
    f"allowed: {_dotted(MIN_VLLM_VERSION)} <= vllm_version < {_dotted(VLLM_VERSION_LIMIT)}.0, the V1 engine's "
    f"0.x releases (the accounting changes at {', '.join(_dotted(v) for v in _CHANGES)}; a later 0.x release "
    f"takes the {_dotted(_CHANGES[-1])} accounting)"
)


def check_batch_args(block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> None:
    """vLLM's ranges for the engine arguments the memory fit takes; errors name the argument, the
    value and the allowed range."""
    if block_size not in VLLM_BLOCK_SIZES:
        raise ConfigError(f"block_size must be one of vLLM's block sizes {list(VLLM_BLOCK_SIZES)}, got {block_size!r}")
    for name, value in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
        if not 1 <= value <= MAX_BATCH:
            raise ConfigError(f"{name} must be in 1..{MAX_BATCH:,}, got {value!r}")


def sampler_bytes_per_logit(vllm_version: str) -> float:
    """Bytes per logit element at the sampler's peak in vLLM's profile run (see SAMPLER_PATH_SINCE)."""
    v = parse_vllm_version(vllm_version)
    path = "sort"
    for since, name in SAMPLER_PATH_SINCE:
        if v >= since:
            path = name
    return SAMPLER_FUSED_BYTES_PER_LOGIT if path == "fused" else SAMPLER_SORT_BYTES_PER_LOGIT


def non_torch_bytes_per_gpu(
    tp: int, vllm_version: str = DEFAULT_VLLM_VERSION, extra_reserved_bytes: float = 0.0, link_kind: str = ""
) -> float:
    """Non-torch memory the profile run adds on each GPU (constants above), plus the GPU model's
    own reserve (``extra_reserved_bytes``: the hardware entry's key of that name, with its source
    there; 0 for the data-centre GPUs the constants come from). ``link_kind`` is the hardware's
    link (``pcie…``: the PCIe increment instead of the NVLink boxes' multi-GPU constant)."""
    recent = parse_vllm_version(vllm_version) >= NON_TORCH_SINCE
    extra = extra_reserved_bytes
    single = NON_TORCH_BYTES if recent else NON_TORCH_BYTES_PRE_018
    if tp > 1 and link_kind.lower().startswith("pcie"):
        return single + NON_TORCH_TP_PCIE_EXTRA_BYTES + extra
    if tp > 1:
        return (NON_TORCH_MULTI_GPU_BYTES if recent else NON_TORCH_MULTI_GPU_BYTES_PRE_018) + extra
    return single + extra


def cuda_graph_bytes_per_gpu(vllm_version: str = DEFAULT_VLLM_VERSION) -> float:
    """CUDA-graph memory vLLM charges to the KV budget: its estimate from 0.21 on, else none."""
    return CUDA_GRAPH_ESTIMATE_BYTES if parse_vllm_version(vllm_version) >= CUDA_GRAPH_ESTIMATE_SINCE else 0.0


def cuda_total_bytes(hw: HardwareSpec) -> float:
    """Device memory as CUDA reports it (what ``gpu_memory_utilization`` multiplies): the
    catalog's logged value where a vLLM log of that GPU showed it, else the H100's fraction."""
    return hw.cuda_memory_bytes or hw.memory_bytes * CUDA_VISIBLE_FRACTION


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
        + moe_frac * m.num_experts * m.expert_params() / dep.moe_shards
        + moe_frac * m.num_shared_experts * m.expert_params() / tp
    )
    per_layer_16bit = 2 * h + moe_frac * m.router_params()
    layers = _stage_layers(dep)
    embed = m.vocab_size * h / tp
    head = (0 if m.tie_word_embeddings else m.vocab_size * h / tp) if dep.pp == 1 else m.vocab_size * h / tp
    ends = embed + head if dep.pp == 1 else max(embed, head)
    return layers * (per_layer_linear * w + per_layer_16bit * ACT_BYTES) + (ends + h) * ACT_BYTES


def forward_activation_bytes_per_gpu(dep: Deployment, max_num_batched_tokens: int) -> float:
    """Peak of the profile run's dummy forward of ``max_num_batched_tokens`` tokens on one GPU.

    Per token: hidden state, residual and norm output (3·h) plus the widest intermediate of a
    layer on this rank: a dense MLP's gate+up output and its activation (3·I/tp); a fused MoE's
    buffers for the top-k expanded tokens, ``intermediate_cache13`` (gate+up output, reused for
    the down output: max(2·I/tp, h)) and ``intermediate_cache2`` (I/tp)
    (vllm/model_executor/layers/fused_moe/fused_marlin_moe.py); or attention's q/k/v.
    Activations in 16 bit (ACT_BYTES).
    """
    m, tp = dep.model, dep.tp
    widths = [3.0 * m.intermediate_size / tp if m.num_dense_layers else 0.0]
    if m.is_moe:
        # with dp ranks the MoE layer holds the gathered tokens of all of them
        i_moe = m.moe_intermediate_size / dep.moe_shards
        widths.append(dep.dp * m.experts_per_token * (max(2.0 * i_moe, m.hidden_size) + i_moe))
    if m.is_mla:
        widths.append(2.0 * m.num_attention_heads / tp * (m.qk_nope_head_dim + m.v_head_dim))
    else:
        widths.append((m.num_attention_heads / tp + 2 * _kv_heads_per_gpu(m, tp)) * m.head_dim)
    per_token = 3.0 * m.hidden_size + max(widths)
    return float(max_num_batched_tokens) * per_token * ACT_BYTES


def sampler_activation_bytes_per_gpu(
    dep: Deployment, max_num_batched_tokens: int, max_num_seqs: int, vllm_version: str = DEFAULT_VLLM_VERSION
) -> float:
    """Peak of the profile run's sampler step: one logits row per dummy request.

    ``_dummy_run`` spreads ``max_num_batched_tokens`` over min(that, ``max_num_seqs``) requests
    and returns one hidden row per request; ``_dummy_sampler_run`` computes their logits over
    the full vocabulary (gathered on every TP rank, so tp does not divide it) and samples with
    top-k/top-p (gpu_model_runner.py). The forward's hidden states (tokens × h) are still held.
    """
    rows = min(max_num_batched_tokens, max_num_seqs)
    hidden = float(max_num_batched_tokens) * dep.model.hidden_size * ACT_BYTES
    return hidden + float(rows) * dep.model.vocab_size * sampler_bytes_per_logit(vllm_version)


def activation_bytes_per_gpu(
    dep: Deployment, max_num_batched_tokens: int, max_num_seqs: int, vllm_version: str = DEFAULT_VLLM_VERSION
) -> float:
    """Torch peak of vLLM's profile run ("torch peak memory increase"): the larger of the
    forward and the sampler step (the forward's intermediates are freed before sampling)."""
    return max(
        forward_activation_bytes_per_gpu(dep, max_num_batched_tokens),
        sampler_activation_bytes_per_gpu(dep, max_num_batched_tokens, max_num_seqs, vllm_version),
    )


def reserve_bytes_per_gpu(dep: Deployment, vllm_version: str = DEFAULT_VLLM_VERSION) -> float:
    """Memory charged to the KV budget besides weights and activations: non-torch memory, plus
    the CUDA-graph estimate where the version subtracts it."""
    return non_torch_bytes_per_gpu(
        dep.tp, vllm_version, dep.hardware.extra_reserved_bytes, dep.hardware.link_kind
    ) + cuda_graph_bytes_per_gpu(vllm_version)


@dataclass(frozen=True)
class MemoryFit:
    """Memory plan of one replica; byte figures are per GPU unless the name says replica.

    ``memory_bytes_per_gpu`` is the total CUDA reports (the catalog capacity × CUDA_VISIBLE_FRACTION)
    and ``budget_bytes_per_gpu`` vLLM's requested memory (that × gpu_memory_utilization).
    ``reserve_bytes_per_gpu`` = ``non_torch_bytes_per_gpu`` + ``cuda_graph_bytes_per_gpu``;
    ``fragmentation_bytes_per_gpu`` is always 0 (inside the measured activation peak).
    ``kv_pool_bytes_per_gpu`` is vLLM's "Available KV cache memory".
    """

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
    non_torch_bytes_per_gpu: float = 0.0
    cuda_graph_bytes_per_gpu: float = 0.0
    vllm_version: str = DEFAULT_VLLM_VERSION
    suggestions: list[str] = field(default_factory=list)
    #: A speculative drafter's share (:class:`DraftMemory`; 0 without one): its weights come off
    #: the KV pool, its KV bytes per token join the target's in every sequence's footprint.
    draft_weights_bytes_per_gpu: float = 0.0
    draft_kv_bytes_per_token: float = 0.0
    _model_spec: ModelSpec | None = field(default=None, compare=False, repr=False)

    def sequence_kv_bytes(self, context: int) -> float:
        """Per-GPU KV bytes of one sequence of ``context`` tokens (whole blocks)."""
        if self._model_spec is None:
            raise ConfigError("MemoryFit lacks its model spec")
        stage = math.ceil(self._model_spec.num_layers / self.pp) / self._model_spec.num_layers
        padded = math.ceil(context / self.block_size) * self.block_size
        return (
            stage * sequence_kv_bytes(self._model_spec, context, self.kv_dtype, self.tp, self.block_size)
            + self.draft_kv_bytes_per_token * padded
        )

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
        # what runs at once: the KV cache's figure capped by max_num_seqs (the engine's cap)
        doc["max_running_seqs_at_context"] = min(doc["max_concurrent_seqs_at_context"], self.max_num_seqs)
        return doc


def fit_capacity_text(f: MemoryFit) -> str:
    """How many sequences of the fit's context run at once: what the KV cache holds, capped by
    ``max_num_seqs`` (the engine never runs more), said when the cap binds: '27,795 sequences of
    1 token fit the KV cache, but max_num_seqs = 1,024 runs at most 1,024 at once'."""
    held = f.max_concurrent_seqs(f.context)
    of = f"of {f.context:,} token{'' if f.context == 1 else 's'}"
    if held <= f.max_num_seqs:
        return f"{held:,} concurrent sequence{'' if held == 1 else 's'} {of}"
    return (
        f"{f.max_num_seqs:,} concurrent sequences {of} (max_num_seqs = {f.max_num_seqs:,}, the engine's cap; "
        f"the KV cache would hold {held:,})"
    )


@dataclass(frozen=True)
class DraftMemory:
    """What a speculative drafter adds to each GPU of a replica (vLLM loads it beside the target
    and sizes one KV cache for both): its weights, and its KV bytes per token of context."""

    weights_bytes_per_gpu: float = 0.0
    kv_bytes_per_token: float = 0.0
    #: What it is, for messages ("eagle3 head: one decoder layer of llama-3.1-8b").
    what: str = ""


def _core(
    dep: Deployment,
    util: float,
    context: int,
    block_size: int,
    max_num_seqs: int,
    max_batched: int,
    vllm_version: str = DEFAULT_VLLM_VERSION,
    draft: DraftMemory | None = None,
) -> MemoryFit:
    m, hw = dep.model, dep.hardware
    total = cuda_total_bytes(hw)
    budget = util * total  # vLLM's "requested memory"
    weights = weights_bytes_per_gpu(dep)
    act = activation_bytes_per_gpu(dep, max_batched, max_num_seqs, vllm_version)
    non_torch = non_torch_bytes_per_gpu(dep.tp, vllm_version, hw.extra_reserved_bytes, hw.link_kind)
    graphs = cuda_graph_bytes_per_gpu(vllm_version)
    frag = FRAGMENTATION_FRACTION * act
    d = draft or DraftMemory()
    pool = budget - weights - d.weights_bytes_per_gpu - act - non_torch - graphs - frag  # "Available KV cache memory"
    stage = _stage_layers(dep) / m.num_layers
    bpt = kv_bytes_per_token(m, dep.kv_dtype, dep.tp) * stage
    wbpt = kv_window_bytes_per_token(m, dep.kv_dtype, dep.tp) * stage
    # Tokens of context the pool holds when every sequence is `context` long: window layers
    # cost wbpt for min(context, W) of those tokens. Without window layers this is vLLM's
    # num_blocks = available // (block_size · bytes per token of one layer) // layers.
    # (a drafter's layers hold KV for every token of context too: vLLM sizes one cache for both)
    padded = math.ceil(context / block_size) * block_size
    seq = stage * sequence_kv_bytes(m, context, dep.kv_dtype, dep.tp, block_size) + d.kv_bytes_per_token * padded
    per_token_eff = seq / padded
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
        memory_bytes_per_gpu=total,
        budget_bytes_per_gpu=budget,
        weights_bytes_per_gpu=weights,
        activation_bytes_per_gpu=act,
        reserve_bytes_per_gpu=non_torch + graphs,
        fragmentation_bytes_per_gpu=frag,
        kv_pool_bytes_per_gpu=pool,
        kv_bytes_per_token=bpt,
        kv_window_bytes_per_token=wbpt,
        sliding_window=m.sliding_window,
        kv_capacity_tokens=tokens,
        kv_capacity_blocks=blocks,
        fits=fits,
        shortfall_bytes=shortfall,
        non_torch_bytes_per_gpu=non_torch,
        cuda_graph_bytes_per_gpu=graphs,
        vllm_version=vllm_version,
        draft_weights_bytes_per_gpu=d.weights_bytes_per_gpu,
        draft_kv_bytes_per_token=d.kv_bytes_per_token,
        _model_spec=m,
    )


def _gib(x: float) -> str:
    return f"{x / GiB:.1f} GiB"


#: Where a suggestion's setting lives in a FLEET.toml, by the ``rooftrace fit`` option that sets it.
_FLEET_KEYS = {
    "--max-num-batched-tokens": "[engine] max_num_batched_tokens",
    "--max-num-seqs": "max_num_seqs",
    "--tp": "tp",
    "--weight-dtype": "weight_dtype",
    "--kv-dtype": "kv_dtype",
    "--context": "[engine] max_model_len",
    "--gpu-memory-utilization": "[engine] gpu_memory_utilization",
    "--hardware": "hardware",
}


def _setting(option: str, value: int | float | str, fleet: bool) -> str:
    """A setting as a suggestion words it: the ``rooftrace fit`` option (``--tp 2``,
    ``--max-num-batched-tokens 4,096``), or for a FLEET.toml its key and a TOML value
    (``tp = 2``, ``[engine] max_num_batched_tokens = 4096``, ``weight_dtype = "fp8"``)."""
    if not fleet:
        return f"{option} {value:,}" if isinstance(value, int) else f"{option} {value}"
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    return f"{_FLEET_KEYS[option]} = {shown}"


def _suggest(
    dep: Deployment,
    util: float,
    context: int,
    block_size: int,
    max_num_seqs: int,
    max_batched: int,
    base: MemoryFit,
    vllm_version: str = DEFAULT_VLLM_VERSION,
    fleet: bool = False,
    draft: DraftMemory | None = None,
) -> list[str]:
    """Concrete changes that make the deployment fit, each checked by re-running the fit; worded
    as ``rooftrace fit`` options, or with ``fleet`` as FLEET.toml keys (:func:`_setting`)."""
    out: list[str] = []
    m, hw = dep.model, dep.hardware

    def attempt(**changes: Any) -> MemoryFit | None:
        try:
            candidate = replace(dep, **changes)
        except ConfigError:
            return None
        return _core(candidate, util, context, block_size, max_num_seqs, max_batched, vllm_version, draft)

    if base.activation_bytes_per_gpu > base.weights_bytes_per_gpu:
        # the token budget's activation outweighs the weights: a smaller budget is the fix (more
        # GPUs barely help: the sampler's logits are gathered on every TP rank). The largest
        # budget that fits, with max_num_seqs at most the budget (vLLM refuses more).
        def at(tokens: int) -> MemoryFit:
            return _core(dep, util, context, block_size, min(max_num_seqs, tokens), tokens, vllm_version, draft)

        lo, hi = 0, max_batched - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if at(mid).fits:
                lo = mid
            else:
                hi = mid - 1
        if lo >= 1:
            seqs = f" and {_setting('--max-num-seqs', lo, fleet)}" if max_num_seqs > lo else ""
            out.append(
                f"a smaller token budget: {_setting('--max-num-batched-tokens', lo, fleet)}{seqs} fits (activations "
                f"{_gib(at(lo).activation_bytes_per_gpu)} per GPU instead of {_gib(base.activation_bytes_per_gpu)})"
            )

    tp = dep.tp * 2
    while tp <= hw.gpus_per_node:
        got = attempt(tp=tp)
        if got is not None and got.fits:
            out.append(
                f"more tensor parallelism: {_setting('--tp', tp, fleet)} fits ({_gib(got.kv_pool_bytes_per_gpu)} "
                "KV per GPU, "
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
                f"lower weight precision: {_setting('--weight-dtype', dtype, fleet)} fits "
                f"({_gib(got.weights_bytes_per_gpu)} weights per GPU)"
            )
            break
    if kv_format(dep.kv_dtype).bytes > kv_format("fp8").bytes:
        got = attempt(kv_dtype="fp8")
        if got is not None and got.fits:
            out.append(f"fp8 KV cache: {_setting('--kv-dtype', 'fp8', fleet)} fits at context {context:,}")
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
            out.append(f"shorter context: {_setting('--context', lo, fleet)} fits (one sequence)")
    if util < 0.95:
        got = _core(dep, 0.95, context, block_size, max_num_seqs, max_batched, vllm_version, draft)
        if got.fits:
            out.append(f"higher {_setting('--gpu-memory-utilization', 0.95, fleet)} fits")
    for name in list_hardware():
        other = load_hardware(name)
        if other.memory_bytes <= hw.memory_bytes or name == hw.name:
            continue
        got = attempt(hardware=other)
        if got is not None and got.fits:
            gpu = _setting("--hardware", name, fleet) if fleet else name
            at_tp = f"tp = {dep.tp}" if fleet else f"tp {dep.tp}"
            out.append(f"a larger GPU: {gpu} ({_gib(other.memory_bytes)}) fits at {at_tp}")
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
    vllm_version: str = DEFAULT_VLLM_VERSION,
    fleet_keys: bool = False,
    draft: DraftMemory | None = None,
) -> MemoryFit:
    """Plan the memory of one replica; when it does not fit, say by how much and what would
    (``suggestions``: as ``rooftrace fit`` options, or with ``fleet_keys`` as the FLEET.toml
    keys to set, ``[engine] gpu_memory_utilization = 0.95``, ``tp = 2``).

    ``context`` defaults to the model's max_position_embeddings; the deployment fits when one
    sequence of that length fits the KV pool (vLLM's start-up check for max_model_len).
    ``vllm_version`` (default DEFAULT_VLLM_VERSION, "0.19.0") selects the accounting of that
    release: the sampler path of the profile run, the non-torch constants and, from 0.21, the
    CUDA-graph estimate charged to the budget. Versions before 0.8 (V0 engine) and from 1.0 on (not
    modelled) are refused; ``block_size`` must be one of VLLM_BLOCK_SIZES, the batch limits in 1..MAX_BATCH.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    check_batch_args(block_size, max_num_seqs, max_num_batched_tokens)
    parse_vllm_version(vllm_version)
    ctx = context if context is not None else dep.model.max_position_embeddings
    if ctx < 1:
        raise ConfigError(f"context must be >= 1, got {ctx}")
    if 0 < dep.model.max_position_embeddings < ctx:  # vLLM refuses a max_model_len past the model's (0: unknown)
        raise ConfigError(
            f"context {ctx:,} is longer than {dep.model.name}'s maximum ({dep.model.max_position_embeddings:,} "
            "tokens, max_position_embeddings); vLLM refuses it"
        )
    base = _core(
        dep, gpu_memory_utilization, ctx, block_size, max_num_seqs, max_num_batched_tokens, vllm_version, draft
    )
    if base.fits:
        return base
    tips = _suggest(
        dep, gpu_memory_utilization, ctx, block_size, max_num_seqs, max_num_batched_tokens, base, vllm_version,
        fleet=fleet_keys, draft=draft,
    )  # fmt: skip
    return replace(base, suggestions=tips)
