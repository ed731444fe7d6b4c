"""Roofline step cost: hand-computed operators, an independent scalar reference, invariants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.catalog import load_hardware, load_model
from pipeline.costmodel.roofline import (
    ELEMENTWISE_KERNEL_SCALE,
    Deployment,
    decode_batch,
    op_times,
    operators,
    prefill_batch,
    step_cost,
)
from pipeline.costmodel.steps import BINDING_NAMES, StepBatch


def _batch(rows: list[tuple[float, float, float, float, float, float]]) -> StepBatch:
    cols = np.array(rows, dtype=np.float64).T
    return StepBatch(*cols)


def reference_step_time(
    dep: Deployment, pt: float, ps: float, pairs: float, pkv: float, ds: float, dctx: float
) -> float:
    """Scalar re-derivation for a dense, full-attention model (no MoE/MLA/window), written from
    the formulas in docs/catalog.md independently of pipeline.costmodel.roofline's vectorised code."""
    m, hw, tp = dep.model, dep.hardware, dep.tp
    T = pt + ds
    if T == 0:
        return 0.0
    h, d, L, inter = m.hidden_size, m.head_dim, m.num_layers, m.intermediate_size / tp
    nq, nkv = m.num_attention_heads / tp, max(1, m.num_kv_heads // tp)
    peak, bw = (
        hw.peak_for("bf16") * hw.compute_efficiency,
        hw.memory_bandwidth_bytes_per_s * hw.memory_efficiency,
    )

    def op(flops: float, nbytes: float) -> float:
        floor = hw.min_kernel_s if (flops or nbytes) else 0.0
        return max(flops / peak, nbytes / bw, floor)

    def elt(nbytes: float, kernel: str) -> float:
        # the class's share of HBM bandwidth: elementwise factor x its scale, at most the roof
        share = min(1.0, hw.elementwise_efficiency * ELEMENTWISE_KERNEL_SCALE[kernel])
        return max(nbytes / (hw.memory_bandwidth_bytes_per_s * share), hw.min_kernel_s if nbytes else 0.0)

    def gemm(params: float, tokens: float, io: float) -> float:
        return op(2 * tokens * params, (params * 2 if tokens else 0) + tokens * 2 * io)

    kv_tok = 2 * nkv * d * 2
    layer = (
        2 * elt(T * 2 * 2 * h, "norm")  # two RMSNorms
        + 2 * elt(T * 2 * 3 * h, "add")  # two residual adds
        + gemm(h * (nq + 2 * nkv) * d, T, h + (nq + 2 * nkv) * d)
        + elt(T * 2 * 2 * (nq + nkv) * d, "rotary")  # rope
        + op(4 * pairs * nq * d, pkv * kv_tok + pt * kv_tok + pt * nq * d * 4)
        + op(4 * dctx * nq * d, dctx * kv_tok + ds * kv_tok + ds * nq * d * 4)
        + gemm(nq * d * h, T, nq * d + h)
        + gemm(2 * h * inter, T, h + 2 * inter)
        + elt(T * 2 * 3 * inter, "act")  # SiLU(gate) x up
        + gemm(inter * h, T, inter + h)
    )
    n_logits = ps + ds
    vocab = m.vocab_size / tp
    head = op(2 * n_logits * h * vocab, (h * vocab * 2 if n_logits else 0) + n_logits * (2 * h + 4 * vocab))
    ends = elt(T * 2 * 2 * h, "gather") + elt(T * 2 * 2 * h, "norm")  # embedding lookup, final norm
    comm = 0.0
    if tp > 1:
        link = hw.link_bandwidth_bytes_per_s * hw.link_efficiency
        comm = (2 * L + 1) * (2 * (tp - 1) / tp * T * h * 2 / link + hw.link_latency_s)
        if n_logits:
            comm += n_logits * m.vocab_size * 4 * (tp - 1) / tp / link + hw.link_latency_s
    return L * layer + head + ends + comm + hw.step_overhead_s


shape = st.tuples(
    st.integers(0, 8), st.integers(1, 2048), st.integers(0, 4096), st.integers(0, 64), st.integers(1, 8192)
)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(shape, min_size=1, max_size=12), tp=st.sampled_from([1, 2, 4, 8]),
       model=st.sampled_from(["llama-2-7b", "llama-3.1-70b", "qwen3-8b"]))  # fmt: skip
def test_matches_scalar_reference(rows: list[tuple[int, int, int, int, int]], tp: int, model: str) -> None:
    dep = Deployment(load_model(model), load_hardware("h100-sxm"), tp=tp)
    steps = []
    for n_pre, chunk, offset, n_dec, ctx in rows:
        pt, ps = n_pre * chunk, n_pre
        pairs = n_pre * (chunk * offset + chunk * (chunk + 1) / 2)
        steps.append((pt, ps, pairs, n_pre * (offset + chunk), n_dec, n_dec * ctx))
    cost = step_cost(dep, _batch(steps))
    expected = [reference_step_time(dep, *s) for s in steps]
    np.testing.assert_allclose(cost.time_s, expected, rtol=1e-9)


def test_hand_computed_operator() -> None:
    # Llama-2-7B gate+up GEMM at 4096 tokens on H100: 2 x 4096 x (2 x 4096 x 11008) = 738.7 GFLOP
    # (the SOURCE.md sanity example); compute-bound at 989.4 TFLOP/s x compute efficiency.
    dep = Deployment(load_model("llama-2-7b"), load_hardware("h100-sxm"), weight_dtype="fp16")
    ops = {o.name: o for o in operators(dep, prefill_batch([4096.0]))}
    up = ops["mlp_up_proj"]
    assert up.flops[0] == pytest.approx(2 * 4096 * 2 * 4096 * 11008)
    assert up.bytes[0] == pytest.approx(2 * 4096 * 11008 * 2 + 4096 * 2 * (4096 + 2 * 11008))
    assert up.count == 32


def test_elementwise_kernel_classes() -> None:
    """Hand-computed: Llama-2-70B at 4,096 tokens on H100, one layer's unfused kernels. The norm
    moves 4096 x 8192 x (read + write) x 2 B = 134.2 MB at elementwise x 0.705 of 3.35 TB/s; the
    residual add's 3 x 67.1 MB at elementwise x 1.905 (capped at the HBM roof)."""
    hw = load_hardware("h100-sxm")
    dep = Deployment(load_model("llama-2-70b"), hw, weight_dtype="fp16")
    ops = {o.name: o for o in operators(dep, prefill_batch([4096.0]))}
    assert {ops[n].kernel for n in ("input_layernorm", "attn_rope", "mlp_act", "add", "embedding")} == {
        "norm", "rotary", "act", "add", "gather"}  # fmt: skip
    norm_bytes = 4096 * 8192 * 2 * 2
    assert ops["input_layernorm"].bytes[0] == pytest.approx(norm_bytes)
    expected = norm_bytes / (3.35e12 * hw.elementwise_efficiency * ELEMENTWISE_KERNEL_SCALE["norm"])
    assert sum(op_times(hw, ops["input_layernorm"]))[0] == pytest.approx(expected, rel=1e-12)
    add_s = 3 * norm_bytes / 2 / (3.35e12 * hw.elementwise_efficiency * ELEMENTWISE_KERNEL_SCALE["add"])
    assert sum(op_times(hw, ops["add"]))[0] == pytest.approx(add_s, rel=1e-12)
    # A faster elementwise factor cannot push the add past the HBM roof.
    fast = dataclasses.replace(hw, elementwise_efficiency=0.8)
    assert sum(op_times(fast, ops["add"]))[0] == pytest.approx(3 * norm_bytes / 2 / 3.35e12, rel=1e-12)
    # Vidur measured (h100 mlp.csv, TP1, 4096 tokens, median): norm 0.124 ms, add 0.062 ms.
    assert sum(op_times(hw, ops["input_layernorm"]))[0] == pytest.approx(0.124e-3, rel=0.15)
    assert sum(op_times(hw, ops["add"]))[0] == pytest.approx(0.062e-3, rel=0.15)
    # An all-ones scale table turns every class back into the plain elementwise factor.
    flat = dict.fromkeys(ELEMENTWISE_KERNEL_SCALE, 1.0)
    plain = norm_bytes / (3.35e12 * hw.elementwise_efficiency)
    assert sum(op_times(hw, ops["input_layernorm"], flat))[0] == pytest.approx(plain, rel=1e-12)


def test_decomposition_and_binding() -> None:
    dep = Deployment(load_model("llama-3.1-70b"), load_hardware("h100-sxm"), tp=4)
    batch = _batch([(8192, 1, 8192 * 8193 / 2, 8192, 0, 0), (0, 0, 0, 0, 1, 1000), (0, 0, 0, 0, 0, 0)])
    c = step_cost(dep, batch)
    np.testing.assert_allclose(c.time_s, c.compute_s + c.memory_s + c.comm_s + c.overhead_s)
    assert [BINDING_NAMES[b] for b in c.binding[:2]] == ["compute", "memory"]
    assert c.time_s[2] == 0 and c.mfu[2] == 0  # an empty step costs nothing
    assert 0 < c.mfu[0] <= dep.hardware.compute_efficiency
    assert 0 < c.mbu[1] <= dep.hardware.memory_efficiency
    # Decode at batch 1 reads every weight once: bytes per GPU ~ weights / tp.
    assert c.bytes[1] == pytest.approx(load_model("llama-3.1-70b").total_params() * 2 / 4, rel=0.02)
    assert (c.comm_s[:2] > 0).all()


def test_vectorised_equals_elementwise_and_pure() -> None:
    dep = Deployment(load_model("mixtral-8x7b"), load_hardware("a100-80gb-sxm"), tp=2)
    rows = [(512, 1, 512 * 513 / 2, 512, 0, 0), (0, 0, 0, 0, 32, 32 * 900), (256, 2, 70000, 900, 7, 7000)]
    together = step_cost(dep, _batch(rows)).time_s
    alone = [step_cost(dep, _batch([r])).time_s[0] for r in rows]
    np.testing.assert_array_equal(together, alone)
    np.testing.assert_array_equal(together, step_cost(dep, _batch(rows)).time_s)


def test_moe_reads_only_touched_experts() -> None:
    m = load_model("qwen3-30b-a3b")  # 128 experts, top-8
    dep = Deployment(m, load_hardware("h100-sxm"))
    ops = {o.name: o for o in operators(dep, decode_batch([1.0, 4096.0], [100.0, 100.0]))}
    expert_bytes = m.expert_params() * 2
    one, many = ops["moe_experts"].bytes
    assert one == pytest.approx(8 * expert_bytes + 1 * 8 * 2 * (2 * 2048 + 6 * 768), rel=1e-9)
    activations = 4096 * 8 * 2 * (2 * 2048 + 6 * 768)
    assert many - activations == pytest.approx(128 * expert_bytes, rel=1e-6)  # 4096 tokens touch all


def test_sliding_window_fields_reduce_attention() -> None:
    dep = Deployment(load_model("gpt-oss-120b"), load_hardware("h200"), weight_dtype="mxfp4")
    full = decode_batch([64.0], [60000.0])
    windowed = dataclasses.replace(full, decode_ctx_tokens_window=np.array([64 * 128.0]))
    assert step_cost(dep, windowed).time_s[0] < step_cost(dep, full).time_s[0]


def test_mla_decode_reads_latent_cache() -> None:
    m = load_model("deepseek-v3")
    dep = Deployment(m, load_hardware("h200"), tp=8, weight_dtype="fp8-block")
    ops = {o.name: o for o in operators(dep, decode_batch([1.0, 1.0], [1000.0, 2000.0]))}
    d = ops["attn_decode"].bytes
    assert d[1] - d[0] == pytest.approx(1000 * 576 * 2)  # latent (512 + 64) x bf16 per token per layer


def test_monotone_in_work() -> None:
    dep = Deployment(load_model("llama-3.1-8b"), load_hardware("l40s"))
    t = step_cost(dep, decode_batch([1, 2, 4, 8, 16, 64, 256], 2048)).time_s
    assert (np.diff(t) >= 0).all()
    p = step_cost(dep, prefill_batch([16.0, 128.0, 1024.0, 8192.0])).time_s
    assert (np.diff(p) > 0).all()


def test_published_vllm_latency_run() -> None:
    """vLLM CI build 9515 on H200 (../shared/measurements/published-benchmarks): Llama-3-70B TP4,
    batch 8, 32 in / 128 out, median e2e 2,077.56 ms. Not used for fitting (the step overhead came
    from the Llama-3.1-8B TP1 row), so this is an out-of-sample check of a whole request."""
    dep = Deployment(load_model("llama-3.1-70b"), load_hardware("h200"), tp=4)
    prefill = step_cost(dep, prefill_batch([32.0], 8.0)).time_s[0]
    ctx = 32 + np.arange(1, 128)
    decode = step_cost(dep, decode_batch(8.0, ctx.astype(float))).time_s.sum()
    assert (prefill + decode) * 1e3 == pytest.approx(2077.56, rel=0.25)
