"""The roofline fast path the replay engine uses (roofline.AffineStepCost) against step_cost.

The fast path must return what step_cost returns — to a relative 1e-12, in practice bit for bit —
on every step shape the engine produces, for every catalog model it accepts; models where it
cannot (MoE: the expected number of touched experts is non-linear in the tokens) must fall
back to step_cost itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.catalog import list_models, load_hardware, load_model
from pipeline.roofline import (
    AFFINE_RTOL,
    AffineStepCost,
    Deployment,
    affine_check_batch,
    fast_step_cost,
    step_cost,
)
from pipeline.steps import StepBatch, StepCost

_FLOAT_FIELDS = ("time_s", "flops", "bytes", "compute_s", "memory_s", "comm_s", "overhead_s", "mfu", "mbu")


def _assert_close(want: StepCost, got: StepCost) -> None:
    for name in _FLOAT_FIELDS:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=AFFINE_RTOL, atol=0, err_msg=name)
    np.testing.assert_array_equal(got.binding, want.binding)


def _deployments() -> list[Deployment]:
    out = []
    for name in list_models():
        model = load_model(name)
        for hw, tp in (("h100-sxm", 1), ("h100-sxm", 8), ("mi300x", 2), ("a100-80gb-sxm", 4)):
            try:
                out.append(Deployment(model, load_hardware(hw), tp=tp))
            except Exception:  # tp that does not divide the heads: not a deployment
                continue
    return out


@pytest.mark.parametrize("dep", _deployments(), ids=lambda d: f"{d.model.name}-{d.hardware.name}-tp{d.tp}")
def test_fast_path_is_step_cost_or_falls_back(dep: Deployment) -> None:
    fast = fast_step_cost(dep)
    batch = affine_check_batch(n=512, seed=7)  # other points than the self-check's
    if dep.model.is_moe:
        assert fast is dep, "MoE step cost is not affine in the tokens: must fall back"
        return
    assert isinstance(fast, AffineStepCost)
    _assert_close(step_cost(dep, batch), fast(batch))


def _dense() -> Deployment:
    return Deployment(load_model("llama-3.1-8b"), load_hardware("h100-sxm"))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 8),
            st.integers(2, 8192),
            st.integers(0, 200_000),
            st.integers(0, 1024),
            st.integers(1, 200_000),
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([("llama-3.1-8b", "h100-sxm", 1), ("llama-3.1-70b", "h200", 4), ("qwen3-8b", "l40s", 1)]),
)
def test_fast_path_equals_step_cost_on_engine_steps(
    rows: list[tuple[int, int, int, int, int]], where: tuple[str, str, int]
) -> None:
    # Engine-shaped steps: `chunks` prefill chunks of c tokens at offset o, ds decodes of mean
    # context ctx; includes one-token steps, pure prefill, pure decode and empty steps.
    model, hw, tp = where
    dep = Deployment(load_model(model), load_hardware(hw), tp=tp)
    fast = fast_step_cost(dep)
    arr = np.array(rows, dtype=np.float64)
    chunks, c, o, ds, ctx = arr.T
    batch = StepBatch(
        prefill_tokens=chunks * c,
        prefill_seqs=chunks,
        prefill_attn_pairs=chunks * (c * o + c * (c + 1) / 2),
        prefill_kv_tokens=chunks * (o + c),
        decode_seqs=ds,
        decode_ctx_tokens=ds * ctx,
    )
    _assert_close(step_cost(dep, batch), fast(batch))


def test_empty_steps_cost_nothing_and_odd_rows_fall_back() -> None:
    dep = _dense()
    fast = fast_step_cost(dep)
    zero = StepBatch(*(np.zeros(3) for _ in range(6)))
    got = fast(zero)
    assert np.all(got.time_s == 0) and np.all(got.flops == 0)
    _assert_close(step_cost(dep, zero), got)
    # Prefill seqs without tokens: outside the affine domain, answered by step_cost.
    odd = StepBatch(*(np.array([v]) for v in (0.0, 1.0, 0.0, 0.0, 0.0, 0.0)))
    _assert_close(step_cost(dep, odd), fast(odd))
    # Sliding-window sums given explicitly: answered by step_cost too.
    win = StepBatch(
        *(np.array([v]) for v in (64.0, 1.0, 2080.0, 64.0, 4.0, 400.0)), decode_ctx_tokens_window=np.array([100.0])
    )
    _assert_close(step_cost(dep, win), fast(win))


def test_efficiency_factors_flow_through() -> None:
    # The fast path reads the same HardwareSpec: a slower memory roof changes both alike.
    import dataclasses

    dep = _dense()
    slow = dataclasses.replace(dep, hardware=dataclasses.replace(dep.hardware, memory_efficiency=0.3))
    batch = affine_check_batch(n=64, seed=3)
    fast = fast_step_cost(slow)
    assert isinstance(fast, AffineStepCost)
    _assert_close(step_cost(slow, batch), fast(batch))
    assert np.all(fast(batch).time_s >= fast_step_cost(dep)(batch).time_s)


@pytest.mark.parametrize(
    "dep",
    [d for d in _deployments() if not d.model.is_moe][::3],
    ids=lambda d: f"{d.model.name}-{d.hardware.name}-tp{d.tp}",
)
def test_jit_engine_row_cost_is_the_affine_kernel(dep: Deployment) -> None:
    # The jit engine prices each step with its own one-row copy of the affine kernel (zero
    # fields skipped): it must return the kernel's numbers exactly, on every engine step shape.
    from pipeline.engine import _jit_kernels

    fast = fast_step_cost(dep)
    assert isinstance(fast, AffineStepCost) and fast.kernel_args is not None
    batch = affine_check_batch(n=256, seed=11)
    want = fast(batch)
    out = np.zeros(7)
    for r in range(batch.n):
        x = np.array([getattr(batch, f)[r] for f in list(StepBatch.__dataclass_fields__)[:6]])
        _jit_kernels._row_cost(x, *fast.kernel_args, out)
        got = (want.time_s, want.compute_s, want.memory_s, want.comm_s, want.overhead_s, want.flops, want.bytes)
        assert out.tolist() == [float(g[r]) for g in got]
    # Decode spans: per-span precomputation of the context-independent operators, then one call
    # per step; the same numbers again.
    args = fast.kernel_args
    n_ops = args[0].shape[0]
    scratch = (np.zeros(n_ops, np.bool_), np.zeros(n_ops), np.zeros(n_ops), np.zeros(n_ops, np.int8))
    scratch += (np.zeros(n_ops), np.zeros(n_ops), np.zeros(n_ops))
    span = np.zeros(7)
    rng = np.random.default_rng(5)
    for nr in (1, 7, 64, 1024):
        _jit_kernels._span_prep(float(nr), *args[:11], *scratch)
        for ctx in rng.integers(nr, nr * 20_000, 20).tolist():
            _jit_kernels._row_cost(np.array([0.0, 0.0, 0.0, 0.0, nr, ctx]), *args, out)
            _jit_kernels._span_cost(float(ctx), *args[:13], *scratch, span)
            assert span.tolist() == out.tolist()
