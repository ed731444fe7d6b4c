"""The tabulated roofline the replay engines use (roofline.roofline_cost) against step_cost.

The tables must return what step_cost returns — to a relative 1e-12 (the same terms summed in
another order) — on every step shape the engine produces, for every catalog model, dense and
MoE; and the jit engine's one-row kernel must return the tables' numbers exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.catalog import list_models, load_hardware, load_model
from pipeline.costmodel.roofline import (
    TABLE_RTOL,
    Deployment,
    affine_check_batch,
    fast_step_cost,
    roofline_cost,
    step_cost,
)
from pipeline.costmodel.stepcost import TabulatedCost
from pipeline.costmodel.steps import StepBatch, StepCost

_FLOAT_FIELDS = ("time_s", "flops", "bytes", "compute_s", "memory_s", "comm_s", "overhead_s", "mfu", "mbu")


def _assert_close(want: StepCost, got: StepCost) -> None:
    for name in _FLOAT_FIELDS:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=TABLE_RTOL, atol=0, err_msg=name)
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
def test_tables_are_step_cost(dep: Deployment) -> None:
    # MoE included: the fused experts' non-linear cost in the tokens is a table like any other.
    fast = fast_step_cost(dep)
    assert isinstance(fast, TabulatedCost)
    batch = affine_check_batch(n=512, seed=7)  # other points than the self-check's
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
    st.sampled_from(
        [
            ("llama-3.1-8b", "h100-sxm", 1),
            ("llama-3.1-70b", "h200", 4),
            ("qwen3-8b", "l40s", 1),
            ("qwen3-30b-a3b", "h100-sxm", 2),
        ]
    ),
)
def test_tables_equal_step_cost_on_engine_steps(
    rows: list[tuple[int, int, int, int, int]], where: tuple[str, str, int]
) -> None:
    # Engine-shaped steps: `chunks` prefill chunks of c tokens at offset o, ds decodes of mean
    # context ctx; includes one-token steps, pure prefill, pure decode and empty steps. Steps
    # beyond the tables (up to 65,536 tokens here) extend them.
    model, hw, tp = where
    dep = Deployment(load_model(model), load_hardware(hw), tp=tp)
    fast = roofline_cost(dep, max_tokens=4096)
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


def test_empty_steps_cost_nothing_and_window_steps_are_exact() -> None:
    dep = _dense()
    fast = fast_step_cost(dep)
    zero = StepBatch(*(np.zeros(3) for _ in range(6)))
    got = fast(zero)
    assert np.all(got.time_s == 0) and np.all(got.flops == 0)
    _assert_close(step_cost(dep, zero), got)
    # Sliding-window sums given explicitly: answered by step_cost itself.
    win = StepBatch(
        *(np.array([v]) for v in (64.0, 1.0, 2080.0, 64.0, 4.0, 400.0)), decode_ctx_tokens_window=np.array([100.0])
    )
    _assert_close(step_cost(dep, win), fast(win))


def test_efficiency_factors_flow_through() -> None:
    # The tables read the same HardwareSpec: a slower memory roof changes both alike.
    dep = _dense()
    slow = dataclasses.replace(dep, hardware=dataclasses.replace(dep.hardware, memory_efficiency=0.3))
    batch = affine_check_batch(n=64, seed=3)
    fast = fast_step_cost(slow)
    _assert_close(step_cost(slow, batch), fast(batch))
    assert np.all(fast(batch).time_s >= fast_step_cost(dep)(batch).time_s)


@pytest.mark.parametrize("dep", _deployments()[::4], ids=lambda d: f"{d.model.name}-{d.hardware.name}-tp{d.tp}")
def test_jit_engine_row_cost_is_the_table_kernel(dep: Deployment) -> None:
    # The jit engine prices each step (and each step of a decode span) with the compiled
    # stepcost.tab_row: it must return the tables' numbers exactly.
    from pipeline.engine import _jit_kernels

    fast = fast_step_cost(dep)
    batch = affine_check_batch(n=256, seed=11)
    want = fast(batch)
    out = np.zeros(8)
    for r in range(batch.n):
        x = np.array([getattr(batch, f)[r] for f in list(StepBatch.__dataclass_fields__)[:6]])
        _jit_kernels._tab_row(x, *fast.kernel_args, out)
        got = (want.time_s, want.compute_s, want.memory_s, want.comm_s, want.overhead_s, want.flops, want.bytes)
        assert out[:7].tolist() == [float(g[r]) for g in got]


@pytest.mark.parametrize("tier", ["roofline", "measured"])
@pytest.mark.parametrize(("model", "hw"), [("llama-3.1-8b", "h100-sxm"), ("qwen3-30b-a3b", "rtx-pro-6000")])
def test_decode_span_kernels_are_the_row_kernel(tier: str, model: str, hw: str) -> None:
    # Inside a decode span the jit engine prices each step with tab_span_prep (once per span) and
    # tab_span_row (per step): the same operations on the same values as tab_row, bit for bit.
    from pipeline.costmodel.profile.cost import step_cost_for
    from pipeline.costmodel.stepcost import row_kernel, span_kernels

    dep = Deployment(load_model(model), load_hardware(hw))
    cost = step_cost_for(dep, tier, 4096, 256)
    assert cost.source == tier
    tok, logit, af, ab, acount, apeak, ahas, abw, dla, dlb, dlt, _pla, _plb, _plt, _mx, sc = cost.kernel_args
    prep, span_row = span_kernels()
    row = row_kernel()
    pre, pf, pb, grid_row = np.zeros(9), np.zeros(af.shape[0]), np.zeros(af.shape[0]), np.zeros(dlt.shape[1])
    a, b = np.zeros(8), np.zeros(8)
    rng = np.random.default_rng(3)
    for nr in (1, 3, 17, 64, 255, 1024):
        prep(float(nr), tok, logit, af, ab, dla, dlt, sc, pre, pf, pb, grid_row)
        for ctx in rng.integers(nr, nr * 300_000, 40).tolist():
            span_row(float(nr), float(ctx), af, ab, acount, apeak, ahas, abw, dlb, sc, pre, pf, pb, grid_row, a)
            row(np.array([0.0, 0.0, 0.0, 0.0, float(nr), float(ctx)]), *cost.kernel_args, b)
            assert a.tolist() == b.tolist()


def test_read_only_tables_reuse_the_one_compiled_kernel() -> None:
    """Tables whose arrays are read-only (as a Ray worker receives them) cost the same and are
    evaluated by the same compiled specialisation: numba types a read-only array differently,
    which had every Ray worker compile the kernel again for a minute or more."""
    from pipeline.costmodel.stepcost import _rows_kernel

    fast = fast_step_cost(_dense())
    batch = StepBatch(*(np.array([v, 2 * v]) for v in (64.0, 1.0, 2080.0, 64.0, 4.0, 400.0)))
    want = fast(batch)
    before = len(_rows_kernel().signatures)

    def frozen(a: object) -> object:
        if isinstance(a, np.ndarray):
            a = a.copy()
            a.setflags(write=False)
        elif isinstance(a, tuple):
            a = tuple(frozen(x) for x in a)
        return a

    fields = {f.name: frozen(getattr(fast, f.name)) for f in dataclasses.fields(fast) if f.init}
    ro = dataclasses.replace(fast, **fields)
    assert any(isinstance(a, np.ndarray) and not a.flags.writeable for a in ro.kernel_args)
    got = ro(batch)
    assert len(_rows_kernel().signatures) == before
    np.testing.assert_array_equal(got.time_s, want.time_s)
