"""The tabulated step cost (pipeline/costmodel/stepcost.py) and the measured cost model
(pipeline/costmodel/profile/cost.py) on the shipped GPU profiles.

The compiled kernel's pieces are checked against their numpy twins (``_g2`` against
interp.Grid2, ``_attention`` against attention.step_attention); the stand-in affine cost and the
overhead rule against hand-computed numbers; the measured tables against the profile's own
functions, isolated by scaling one family's measured rows and differencing the tables.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.catalog import load_hardware, load_model
from pipeline.common.errors import ConfigError
from pipeline.costmodel import stepcost
from pipeline.costmodel.profile import attention as attn
from pipeline.costmodel.profile.cost import (
    CUSTOM_AR_MAX_BYTES,
    _allreduce_backend,
    capture_sizes,
    measured_cost,
    measured_tables,
    padded_tokens,
    step_cost_for,
)
from pipeline.costmodel.profile.interp import Grid2, grid2_from
from pipeline.costmodel.profile.tables import Profile, load_profile
from pipeline.costmodel.roofline import Deployment
from pipeline.costmodel.stepcost import OUT, TabulatedCost, affine_cost, grid_arrays, scalars
from pipeline.costmodel.steps import StepBatch

# ----------------------------------------------------------------------------------- helpers


def _dep(model: str, gpu: str, tp: int = 1) -> Deployment:
    return Deployment(load_model(model), load_hardware(gpu), tp=tp)


def _batch(rows: list[tuple[float, ...]]) -> StepBatch:
    a = np.array(rows, dtype=np.float64).reshape(-1, 6)
    return StepBatch(*(np.ascontiguousarray(a[:, j]) for j in range(6)))


def _engine_steps(rng: np.random.Generator, n: int, max_tokens: int) -> np.ndarray:
    """Engine-shaped steps (the six fields): prefill chunks at offsets, decodes, mixed, empty."""
    rows = np.zeros((n, 6))
    for r in range(n):
        kind = rng.integers(0, 4)  # 0 pure decode, 1 pure prefill, 2 mixed, 3 one-token decode
        chunks = 0 if kind in (0, 3) else int(rng.integers(1, 4))
        ds = 1 if kind == 3 else (0 if kind == 1 else int(rng.integers(1, 300)))
        budget = max_tokens - ds
        c = rng.integers(1, max(2, budget // max(chunks, 1)), size=chunks) if chunks else np.zeros(0)
        o = rng.integers(0, 40000, size=chunks) * (rng.random(chunks) < 0.7)
        ctx = rng.integers(1, 60000, size=ds)
        rows[r] = (
            c.sum(),
            chunks,
            float(np.sum(c * o + c * (c + 1) / 2)),
            float(np.sum(o + c)),
            ds,
            float(ctx.sum()),
        )
    return rows


def _scaled(prof: Profile, family: str, where: pl.Expr, factor: float) -> Profile:
    """``prof`` with the measured times of the rows ``where`` of one family multiplied."""
    frames = dict(prof.frames)
    frames[family] = frames[family].with_columns(
        time_s=pl.when(where).then(pl.col("time_s") * factor).otherwise(pl.col("time_s"))
    )
    return Profile(prof.meta, frames)


@pytest.fixture(scope="module")
def pro6000() -> Profile:
    prof = load_profile("rtx-pro-6000")
    assert prof is not None
    return prof


@pytest.fixture(scope="module")
def h100() -> Profile:
    prof = load_profile("h100-sxm")
    assert prof is not None
    return prof


# ----------------------------------------------------------------------------------- _g2 / _attention


@pytest.fixture(scope="module")
def g2_jit():  # type: ignore[no-untyped-def]
    return stepcost._compiled()["g2"]


def _random_grid(rng: np.random.Generator, na: int, nb: int) -> Grid2:
    a = np.unique(np.round(np.exp(rng.uniform(0, 8, na))))
    b = np.unique(np.round(np.exp(rng.uniform(0, 12, nb))))
    aa, bb = np.meshgrid(a, b, indexing="ij")
    t = 1e-6 * np.exp(rng.normal(0, 0.3, aa.shape)) * aa**0.3 * bb**0.6
    # drop a few cells: grid2_from fills them along b
    keep = rng.random(aa.size) > 0.2
    keep[:: max(1, b.size)] = True
    g = grid2_from(aa.ravel()[keep], bb.ravel()[keep], t.ravel()[keep])
    assert g is not None
    return g


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (6, 1), (2, 2), (7, 9), (12, 20)])
def test_g2_kernel_matches_grid2(shape: tuple[int, int], g2_jit) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        g = _random_grid(rng, *shape)
        la, lb, lt = grid_arrays(g)
        # inside, on the grid points, below and above each axis
        ga, gb = np.meshgrid(g.a, g.b, indexing="ij")
        qa = np.concatenate(
            [np.exp(rng.uniform(-2, 10, 60)), ga.ravel(), [g.a[0] * 0.5, g.a[-1] * 3.0, g.a[-1] * 2.0, g.a[0]]]
        )
        qb = np.concatenate(
            [np.exp(rng.uniform(-2, 14, 60)), gb.ravel(), [g.b[0] * 0.25, g.b[-1] * 5.0, g.b[0], g.b[-1] * 1.5]]
        )
        want = g(qa, qb)
        got_jit = np.array([g2_jit(la, lb, lt, float(x), float(y)) for x, y in zip(qa, qb, strict=True)])
        got_py = np.array([stepcost._g2(la, lb, lt, float(x), float(y)) for x, y in zip(qa, qb, strict=True)])
        np.testing.assert_allclose(got_jit, want, rtol=1e-12, atol=0)
        np.testing.assert_allclose(got_py, want, rtol=1e-12, atol=0)


def test_g2_kernel_on_profile_grid(h100: Profile, g2_jit) -> None:  # type: ignore[no-untyped-def]
    g = h100.attention_grid("attn_decode", "bf16", 32, 8, 128)
    assert g is not None
    la, lb, lt = grid_arrays(g)
    rng = np.random.default_rng(5)
    qa = np.exp(rng.uniform(-1, np.log(g.a[-1]) + 1, 300))
    qb = np.exp(rng.uniform(-1, np.log(g.b[-1]) + 1, 300))
    got = np.array([g2_jit(la, lb, lt, float(x), float(y)) for x, y in zip(qa, qb, strict=True)])
    np.testing.assert_allclose(got, g(qa, qb), rtol=1e-12, atol=0)


def _attention_grids(prof: Profile, nq: int, nkv: int, d: int) -> tuple[Grid2, Grid2]:
    dg = prof.attention_grid("attn_decode", "bf16", nq, nkv, d)
    pg = prof.attention_grid("attn_prefill", "bf16", nq, nkv, d)
    assert dg is not None and pg is not None
    return dg, pg


@pytest.mark.parametrize("tile", [0.0, 48.0, 32.0])
@pytest.mark.parametrize("gpu", ["rtx-pro-6000", "h100-sxm"])
def test_attention_kernel_matches_step_attention(gpu: str, tile: float) -> None:
    prof = load_profile(gpu)
    assert prof is not None
    dg, pg = _attention_grids(prof, 32, 8, 128)
    rng = np.random.default_rng(int(tile) + len(gpu))
    x = _engine_steps(rng, 300, 8192)
    want = attn.step_attention(dg, pg, x[:, 1], x[:, 0], x[:, 2], x[:, 4], x[:, 5], tile)
    args = (*grid_arrays(dg), *grid_arrays(pg))
    att_jit = stepcost._compiled()["attention"]
    none = np.zeros(1)  # no mixed-batch ratio grid: the composition rules
    got_jit = np.array([att_jit(np.ascontiguousarray(r), *args, tile, none) for r in x])
    got_py = np.array([stepcost._attention(r, *args, tile, none) for r in x])
    np.testing.assert_allclose(got_jit, want, rtol=1e-12, atol=0)
    np.testing.assert_allclose(got_py, want, rtol=1e-12, atol=0)
    # mixed steps with a tile are never cheaper than the parts summed without it
    if tile > 0:
        alone = attn.step_attention(dg, pg, x[:, 1], x[:, 0], x[:, 2], x[:, 4], x[:, 5], 0.0)
        mixed = (x[:, 1] > 0) & (x[:, 4] > 0)
        assert np.any(mixed)
        assert np.all(want[mixed] >= alone[mixed] * (1 - 1e-12))


def test_attention_kernel_hand_computed_composition() -> None:
    # power-law grids: decode D = 1e-6·b·k^0.5, prefill P = 1e-7·b·c²
    a = np.array([1.0, 2.0, 4.0, 8.0])
    L = np.array([1.0, 16.0, 256.0, 4096.0, 65536.0])
    aa, ll = np.meshgrid(a, L, indexing="ij")
    dg = Grid2(a, L, 1e-6 * aa * ll**0.5)
    pg = Grid2(a, L, 1e-7 * aa * ll**2)
    args = (*grid_arrays(dg), *grid_arrays(pg))
    # pure decode: 4 sequences of 1024 tokens → D(4, 1024) = 1e-6·4·32
    x = np.array([0.0, 0.0, 0.0, 0.0, 4.0, 4096.0])
    assert stepcost._attention(x, *args, 48.0, np.zeros(1)) == pytest.approx(1.28e-4, rel=1e-12)
    # one 16-token chunk at offset 0, tile 48: padded to a 48-token chunk → P(1, 48)
    x = np.array([16.0, 1.0, 136.0, 16.0, 0.0, 0.0])
    assert stepcost._attention(x, *args, 48.0, np.zeros(1)) == pytest.approx(1e-7 * 48**2, rel=1e-12)
    assert stepcost._attention(x, *args, 0.0, np.zeros(1)) == pytest.approx(1e-7 * 16**2, rel=1e-12)
    # chunk of 64 at offset 1000: pairs = 64·1000 + 64·65/2; c_eq = (√(8p+1) − 1)/2
    p = 64 * 1000 + 64 * 65 / 2
    ceq = (np.sqrt(8 * p + 1) - 1) / 2
    x = np.array([64.0, 1.0, p, 1064.0, 0.0, 0.0])
    assert stepcost._attention(x, *args, 48.0, np.zeros(1)) == pytest.approx(1e-7 * ceq**2, rel=1e-12)
    # mixed: the chunk above plus 2 decodes at 256: max(D(2, 256), P(2, c_eq(48·256 + 48·49/2)))
    x = np.array([64.0, 1.0, p, 1064.0, 2.0, 512.0])
    ceq_d = (np.sqrt(8 * (48 * 256 + 48 * 49 / 2) + 1) - 1) / 2
    d_mixed = max(1e-6 * 2 * 16, 1e-7 * 2 * ceq_d**2)
    assert stepcost._attention(x, *args, 48.0, np.zeros(1)) == pytest.approx(1e-7 * ceq**2 + d_mixed, rel=1e-12)
    assert stepcost._attention(x, *args, 0.0, np.zeros(1)) == pytest.approx(1e-7 * ceq**2 + 1e-6 * 2 * 16, rel=1e-12)


def test_compiled_row_applies_attention_times_layers() -> None:
    # the full compiled kernel (not just _attention) with measured grids and no affine operator
    a = np.array([1.0, 4.0, 64.0])
    L = np.array([1.0, 256.0, 65536.0])
    aa, ll = np.meshgrid(a, L, indexing="ij")
    dg = Grid2(a, L, 2e-6 * aa**0.5 * ll**0.7)
    pg = Grid2(a, L, 3e-8 * aa * ll**1.5)
    base = affine_cost(
        np.zeros((0, 7)),
        np.zeros((0, 7)),
        np.zeros(0),
        np.ones(0),
        np.zeros(0, bool),
        np.ones(0),
        scalars(),
        max_tokens=8192,  # no extension: extend() would rebuild the stand-in without the grids
    )
    cost = dataclasses.replace(
        base,
        decode_grid=grid_arrays(dg),
        prefill_grid=grid_arrays(pg),
        scalars=scalars(layers=40.0, tile=48.0, measured_attention=1.0),
    )
    x = _engine_steps(np.random.default_rng(3), 200, 4096)
    got = cost(_batch([tuple(r) for r in x]))
    want = 40.0 * attn.step_attention(dg, pg, x[:, 1], x[:, 0], x[:, 2], x[:, 4], x[:, 5], 48.0)
    np.testing.assert_allclose(got.measured_s, want, rtol=1e-12, atol=0)
    np.testing.assert_allclose(got.time_s, want, rtol=1e-12, atol=0)
    np.testing.assert_allclose(got.memory_s, want, rtol=1e-12, atol=0)  # no affine op: memory side
    assert np.all(got.compute_s == 0)


# ----------------------------------------------------------------------------------- affine stand-in


def _stand_in(**sc: float) -> TabulatedCost:
    # op 0: 1e9 FLOPs per prefill token, 1e6 bytes per decode-context token, 2 instances
    # op 1: a constant 10 FLOPs / 10 bytes: below the kernel floor, 3 instances
    # op 2: no work at all
    flops = np.zeros((3, 7))
    nbytes = np.zeros((3, 7))
    flops[0, 1] = 1e9
    nbytes[0, 6] = 1e6
    flops[1, 0] = 10.0
    nbytes[1, 0] = 10.0
    return affine_cost(
        flops,
        nbytes,
        np.array([2.0, 3.0, 1.0]),
        np.array([1e12, 1e12, 1e12]),
        np.array([True, True, False]),
        np.array([1e9, 1e9, 1e9]),
        scalars(**sc),
    )


_STEP = (100.0, 1.0, 5050.0, 100.0, 2.0, 300.0)  # one 100-token prefill, 2 decodes (300 context)


def test_affine_cost_hand_computed_gpu_bound() -> None:
    cost = _stand_in(min_kernel_s=1e-3, base_s=0.01, host_s=0.002, host_per_seq_s=0.001, peak_gpu=1e15, bw_gpu=1e12)
    got = cost(_batch([_STEP]))
    # op 0: t_c = 1e11/1e12 = 0.1 s, t_m = 3e8/1e9 = 0.3 s → memory, ×2 = 0.6 s
    # op 1: t_c = 1e-11, t_m = 1e-8 < floor 1e-3 → floors 3e-3
    # gpu = 0.6 + 0.003 + 0.01 = 0.613 > host = 0.002 + 0.001·3 = 0.005: overhead = base + floors
    assert got.compute_s[0] == 0.0
    assert got.memory_s[0] == pytest.approx(0.6, rel=1e-12)
    assert got.comm_s[0] == 0.0
    assert got.overhead_s[0] == pytest.approx(0.013, rel=1e-12)
    assert got.time_s[0] == pytest.approx(0.613, rel=1e-12)
    assert got.flops[0] == pytest.approx(2 * 1e11 + 3 * 10, rel=1e-12)
    assert got.bytes[0] == pytest.approx(2 * 3e8 + 3 * 10, rel=1e-12)
    assert got.binding[0] == 1  # memory
    assert got.mfu[0] == pytest.approx(got.flops[0] / 0.613 / 1e15, rel=1e-12)
    assert got.mbu[0] == pytest.approx(got.bytes[0] / 0.613 / 1e12, rel=1e-12)
    assert got.measured_s is not None and got.measured_s[0] == 0.0


def test_overhead_rule_host_exceeds_gpu() -> None:
    # host = 1.0 + 0.25·3 = 1.75 s > gpu = 0.6 + 0.003 + 0.01 = 0.613 s
    cost = _stand_in(min_kernel_s=1e-3, base_s=0.01, host_s=1.0, host_per_seq_s=0.25)
    got = cost(_batch([_STEP]))
    assert got.overhead_s[0] == pytest.approx(0.01 + 0.003 + (1.75 - 0.613), rel=1e-12)
    assert got.time_s[0] == pytest.approx(1.75, rel=1e-12)  # the host time shows in full
    assert got.binding[0] == 3  # overhead


def test_overhead_rule_host_just_below_and_above_gpu() -> None:
    gpu = 0.613
    for host, want in ((gpu - 1e-6, gpu), (gpu + 1e-3, gpu + 1e-3)):
        got = _stand_in(min_kernel_s=1e-3, base_s=0.01, host_s=host)(_batch([_STEP]))
        assert got.time_s[0] == pytest.approx(want, rel=1e-12)
        assert got.overhead_s[0] == pytest.approx(0.013 + max(0.0, host - gpu), rel=1e-9)


def test_affine_cost_compute_bound_and_pp() -> None:
    # a prefill-only step of 1000 tokens: op 0 t_c = 1e12/1e12 = 1 s, t_m = 0 → compute, ×2
    cost = _stand_in(min_kernel_s=1e-3, pp=2.0)
    got = cost(_batch([(1000.0, 1.0, 500500.0, 1000.0, 0.0, 0.0)]))
    assert got.compute_s[0] == pytest.approx(2.0, rel=1e-12)
    assert got.memory_s[0] == 0.0
    assert got.time_s[0] == pytest.approx(2.003, rel=1e-12)
    assert got.binding[0] == 0
    # FLOPs and bytes are per GPU: divided by the pipeline stages
    assert got.flops[0] == pytest.approx((2 * 1e12 + 30) / 2, rel=1e-12)


def test_zero_step_costs_zero() -> None:
    cost = _stand_in(min_kernel_s=1e-3, base_s=0.01, host_s=1.0, host_per_seq_s=0.25)
    got = cost(_batch([(0.0,) * 6, (0.0,) * 6]))
    for name in ("time_s", "compute_s", "memory_s", "comm_s", "overhead_s", "flops", "bytes", "mfu", "mbu"):
        np.testing.assert_array_equal(getattr(got, name), [0.0, 0.0], err_msg=name)


def test_zero_step_costs_zero_measured(h100: Profile) -> None:
    cost = measured_cost(_dep("llama-3.1-8b", "h100-sxm"), h100, max_tokens=256, overhead_s=2e-3)
    got = cost(_batch([(0.0,) * 6, (0.0, 0.0, 0.0, 0.0, 1.0, 100.0)]))
    assert got.time_s[0] == 0.0 and got.overhead_s[0] == 0.0 and got.flops[0] == 0.0
    assert got.measured_s is not None and got.measured_s[0] == 0.0
    assert got.time_s[1] > 2e-3  # a one-token step pays the base overhead and more


def test_affine_cost_extends_beyond_its_tables() -> None:
    cost = _stand_in(min_kernel_s=1e-3)
    assert cost.max_tokens == 1
    got = cost(_batch([(1000.0, 1.0, 500500.0, 1000.0, 0.0, 0.0)]))
    assert got.time_s[0] == pytest.approx(2.003, rel=1e-12)
    cost_noext = dataclasses.replace(cost, extend=None)
    with pytest.raises(ValueError, match="beyond the cost tables"):
        cost_noext(_batch([(1000.0, 1.0, 500500.0, 1000.0, 0.0, 0.0)]))


def test_scalars_refuses_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown scalar"):
        scalars(base=1.0)
    sc = scalars(tile=48.0)
    assert sc[stepcost.SCALARS.index("tile")] == 48.0
    assert sc[stepcost.SCALARS.index("pp")] == 1.0


# ----------------------------------------------------------------------------------- capture sizes


def _vllm_sizes(max_num_seqs: int) -> list[int]:
    cap = min(2 * max_num_seqs, 512)
    out = [s for s in (1, 2, 4) if s <= cap]
    out += [s for s in range(8, 249, 8) if s <= cap]
    out += [s for s in range(256, 513, 16) if s <= cap]
    return out


@pytest.mark.parametrize("max_num_seqs", [1, 2, 3, 4, 10, 100, 128, 136, 200, 256, 1024])
def test_capture_sizes_are_vllms(max_num_seqs: int) -> None:
    got = capture_sizes(max_num_seqs)
    assert got.tolist() == _vllm_sizes(max_num_seqs)
    assert got.dtype == np.int64


def test_capture_sizes_hand_written() -> None:
    assert capture_sizes(256).tolist() == [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    assert capture_sizes(256)[-1] == 512 and len(capture_sizes(256)) == 3 + 31 + 17
    assert capture_sizes(64).tolist() == [1, 2, 4, *range(8, 129, 8)]
    assert capture_sizes(1).tolist() == [1, 2]


def test_padded_tokens() -> None:
    sizes = capture_sizes(256)
    t = np.array([0, 1, 3, 4, 5, 9, 248, 249, 256, 257, 500, 512, 513, 4096])
    padded, graph = padded_tokens(t, sizes)
    assert padded.tolist() == [0, 1, 4, 4, 8, 16, 248, 256, 256, 272, 512, 512, 513, 4096]
    assert graph.tolist() == [False] + [True] * 11 + [False, False]


# ----------------------------------------------------------------------------------- measured tables


def test_decode_of_three_costs_gemms_of_four_and_big_steps_are_unpadded(pro6000: Profile) -> None:
    dep = _dep("llama-3.1-8b", "rtx-pro-6000")
    tok, _, _ = measured_tables(dep, pro6000, 1200, 256)
    # every token-driven column of 3 tokens is that of 4 (CUDA-graph padding), 5..8 that of 8
    np.testing.assert_array_equal(tok[3], tok[4])
    for t in (5, 6, 7):
        np.testing.assert_array_equal(tok[t], tok[8])
    np.testing.assert_array_equal(tok[500], tok[512])
    assert not np.array_equal(tok[2], tok[3])  # 2 is a capture size of its own
    # above 512 tokens no padding: every step its own cost, and the eager launches cost host time
    assert not np.array_equal(tok[513], tok[514])
    assert tok[513, 6] < tok[520, 6]
    assert tok[512, 7] == 0.0 and tok[513, 7] > 0.0
    # with max_num_seqs 64 the graphs stop at 128 tokens
    tok64, _, _ = measured_tables(dep, pro6000, 200, 64)
    np.testing.assert_array_equal(tok64[100], tok64[104])
    assert not np.array_equal(tok64[129], tok64[130])
    assert tok64[128, 7] == 0.0 and tok64[129, 7] > 0.0


def test_eager_custom_all_reduce_is_not_charged_a_launch_twice(h100: Profile) -> None:
    # Above the CUDA-graph sizes a step runs eagerly: every kernel launch costs the fitted eager
    # cost per call (column 7), except vLLM's custom all-reduce, whose eager curve already holds
    # that cost. So below 8 MiB (1,023 tokens of a 4,096-wide bf16 hidden state) TP 2 pays the
    # launches of TP 1, and from 8 MiB on (NCCL, not custom) one more per all-reduce: two a
    # layer and the embedding's.
    tok1, _, _ = measured_tables(_dep("llama-3.1-8b", "h100-sxm"), h100, 1100, 256)
    tok2, _, _ = measured_tables(_dep("llama-3.1-8b", "h100-sxm", tp=2), h100, 1100, 256)
    call = h100.fitted("eager_call_overhead_s", 0.0)
    assert call > 0.0
    layers = load_model("llama-3.1-8b").num_layers
    assert tok1[513, 7] > 0.0
    for t in (513, 1023):
        assert tok2[t, 7] == pytest.approx(tok1[t, 7], rel=1e-12)
    assert tok2[1024, 7] - tok1[1024, 7] == pytest.approx((2 * layers + 1) * call, rel=1e-9)
    assert tok2[512, 7] == 0.0  # under CUDA graphs: no launch cost at all


def test_qkv_gemm_is_the_profile_gemm(pro6000: Profile) -> None:
    # isolate the llama-3.1-8b qkv projection (n = (32 + 2·8)·128 = 6144, k = 4096): triple its
    # measured rows, and the tables grow by 2 × layers × its GEMM time (no other GEMM of this
    # model brackets n = 6144 at k = 4096: o_proj and down_proj have n = 4096, gate_up 28672)
    dep = _dep("llama-3.1-8b", "rtx-pro-6000")
    shape = (pl.col("dtype") == "bf16") & (pl.col("n") == 6144) & (pl.col("k") == 4096)
    tripled = _scaled(pro6000, "gemm", shape, 3.0)
    tok, _, cov = measured_tables(dep, pro6000, 1200, 256)
    tok3, _, _ = measured_tables(dep, tripled, 1200, 256)
    assert cov.gemm == "bf16 measured"
    layers = dep.model.num_layers
    qkv = (tok3[:, 6] - tok[:, 6]) / (2.0 * layers)
    # the compute/memory split carries the same seconds
    np.testing.assert_allclose((tok3[:, 0] + tok3[:, 1]) - (tok[:, 0] + tok[:, 1]), 2 * layers * qkv, rtol=1e-9)
    want_1024 = pro6000.gemm_time("bf16", 6144, 4096, np.array([1024.0]))[0]
    assert qkv[1024] == pytest.approx(want_1024, rel=1e-9)
    # that is (within 5 %) the AIConfigurator row measured for exactly this shape
    rows = pl.read_parquet("pipeline/catalog/profiles/rtx-pro-6000/gemm.parquet").filter(
        shape & (pl.col("m") == 1024) & (pl.col("set") == "aiconfigurator")
    )
    assert rows.height >= 1
    measured = float(rows["time_s"].median())
    assert want_1024 == pytest.approx(measured, rel=0.05)
    # padded steps read the capture size's GEMM, eager steps their own m
    g = lambda m: pro6000.gemm_time("bf16", 6144, 4096, np.array([float(m)]))[0]  # noqa: E731
    assert qkv[3] == pytest.approx(g(4), rel=1e-9)
    assert qkv[3] == qkv[4]
    assert qkv[250] == pytest.approx(g(256), rel=1e-9)
    assert qkv[600] == pytest.approx(g(600), rel=1e-9)
    assert qkv[513] == pytest.approx(g(513), rel=1e-9)
    assert qkv[0] == 0.0
    # a decode step of 3 costs (in GEMM time) what 4 costs: through the whole cost too
    cost = measured_cost(dep, pro6000, max_tokens=1200)
    cost3 = measured_cost(dep, tripled, max_tokens=1200)
    steps = _batch([(0, 0, 0, 0, 3, 3000), (0, 0, 0, 0, 4, 4000), (1024, 1, 1024 * 1025 / 2, 1024, 0, 0)])
    dq = cost3(steps).measured_s - cost(steps).measured_s  # type: ignore[operator]
    np.testing.assert_allclose(dq, 2 * layers * np.array([g(4), g(4), g(1024)]), rtol=1e-9)


def test_tp2_allreduce_pcie_vs_nvlink(pro6000: Profile, h100: Profile) -> None:
    pcie = _dep("llama-3.1-8b", "rtx-pro-6000", tp=2)
    nvl = _dep("llama-3.1-8b", "h100-sxm", tp=2)
    assert _allreduce_backend(pcie) == "custom"  # two PCIe GPUs with peer access
    assert _allreduce_backend(nvl) == "custom"
    c_pcie = measured_cost(pcie, pro6000, max_tokens=1200)
    c_nvl = measured_cost(nvl, h100, max_tokens=1200)
    for c, gpu in ((c_pcie, "rtx-pro-6000"), (c_nvl, "h100-sxm")):
        assert (
            c.describe["allreduce"] == f"vLLM custom all-reduce (CUDA graph / eager), NCCL above 8 MiB: {gpu} x2 curves"
        )
    # the curves differ: the PCIe card's custom all-reduce is slower for every message ≥ 64 KiB
    msg = np.array([65536.0, 262144.0, 1 << 20, 4 << 20, 8 << 20])
    for backend in ("custom_graph", "nccl"):
        a, b = pro6000.allreduce_curve(backend, 2), h100.allreduce_curve(backend, 2)
        assert a is not None and b is not None
        assert np.all(a(msg) > b(msg)), backend
    # the token table's comm column is (2·layers + 1) all-reduces of T·hidden·2 bytes at the
    # padded T, read off the profile's curve of the backend vLLM uses at that size
    calls = 2 * pcie.model.num_layers + 1
    h = pcie.model.hidden_size
    for prof, cost in ((pro6000, c_pcie), (h100, c_nvl)):
        graph_c = prof.allreduce_curve("custom_graph", 2)
        eager_c = prof.allreduce_curve("custom_eager", 2)
        nccl_c = prof.allreduce_curve("nccl", 2)
        assert graph_c is not None and eager_c is not None and nccl_c is not None
        assert cost.tok[16, 2] == pytest.approx(calls * graph_c(16 * h * 2.0)[0], rel=1e-12)
        assert cost.tok[13, 2] == pytest.approx(calls * graph_c(16 * h * 2.0)[0], rel=1e-12)
        # eager (> 512 tokens) under 8 MiB: custom eager; above 8 MiB: NCCL
        assert 1000 * h * 2 <= CUSTOM_AR_MAX_BYTES < 1100 * h * 2
        assert cost.tok[1000, 2] == pytest.approx(calls * eager_c(1000 * h * 2.0)[0], rel=1e-12)
        assert cost.tok[1100, 2] == pytest.approx(calls * nccl_c(1100 * h * 2.0)[0], rel=1e-12)
        # exactly 8 MiB (1,024 tokens of 4,096 bf16) is NCCL: vLLM's custom all-reduce takes only
        # messages smaller than its max_size (should_custom_ar: inp_size < max_size)
        assert 1024 * h * 2 == CUSTOM_AR_MAX_BYTES
        assert cost.tok[1024, 2] == pytest.approx(calls * nccl_c(1024 * h * 2.0)[0], rel=1e-12)
        assert cost.tok[1023, 2] == pytest.approx(calls * eager_c(1023 * h * 2.0)[0], rel=1e-12)
    # a decode step of 8..512 sequences (64 KiB .. 4 MiB messages) communicates longer on PCIe
    seqs = np.array([8.0, 32.0, 128.0, 512.0])
    dec = StepBatch(np.zeros(4), np.zeros(4), np.zeros(4), np.zeros(4), seqs, seqs * 2000)
    per_call_pcie = c_pcie.tok[seqs.astype(int), 2] / calls
    per_call_nvl = c_nvl.tok[seqs.astype(int), 2] / calls
    assert np.all(per_call_pcie > per_call_nvl)
    assert np.all(c_pcie(dec).comm_s > c_nvl(dec).comm_s)


def test_rtx4090_tp2_never_uses_custom_allreduce(pro6000: Profile) -> None:
    dep = _dep("llama-3.1-8b", "rtx-4090", tp=2)
    assert _allreduce_backend(dep) == "nccl"
    own = load_profile("rtx-4090")
    assert own is not None
    cost = measured_cost(dep, own, max_tokens=600)
    assert "custom" not in cost.describe["allreduce"]
    # even with a profile that has custom all-reduce curves, the 4090 (no P2P) uses NCCL
    tok, _, cov = measured_tables(dep, pro6000, 600, 256)
    assert cov.allreduce == "NCCL (measured: rtx-pro-6000 x2 curve)"
    nccl = pro6000.allreduce_curve("nccl", 2)
    assert nccl is not None
    calls = 2 * dep.model.num_layers + 1
    assert tok[64, 2] == pytest.approx(calls * nccl(64 * 4096 * 2.0)[0], rel=1e-12)
    # other backends by link and group size
    assert _allreduce_backend(_dep("llama-3.1-8b", "rtx-pro-6000", tp=4)) == "nccl"  # PCIe, > 2 GPUs
    assert _allreduce_backend(_dep("llama-3.1-8b", "h100-sxm", tp=8)) == "custom"


@pytest.mark.parametrize("gpu", ["h100-sxm", "rtx-pro-6000"])
def test_moe_from_fused_moe_table(gpu: str) -> None:
    prof = load_profile(gpu)
    assert prof is not None
    dep = _dep("qwen3-30b-a3b", gpu)
    m = dep.model
    tok, _, cov = measured_tables(dep, prof, 2048, 256)
    assert cov.moe == "measured fused MoE (bf16, power_law_1.01 routing, moe_tp=1, moe_ep=1)"
    # isolate the experts: double the fused-MoE rows, difference the tables
    doubled = _scaled(prof, "moe", pl.lit(True), 2.0)
    tok2, _, _ = measured_tables(dep, doubled, 2048, 256)
    moe = (tok2[:, 6] - tok[:, 6]) / m.num_moe_layers
    shape = (m.hidden_size, m.moe_intermediate_size, m.experts_per_token, m.num_experts)
    ts = np.array([1, 3, 4, 100, 500, 513, 1000, 2048])
    padded = np.array([1, 4, 4, 104, 512, 513, 1000, 2048], dtype=np.float64)
    want = prof.moe_time("bf16", "power_law_1.01", 1, 1, shape, padded)
    assert want is not None
    np.testing.assert_allclose(moe[ts], want, rtol=1e-9)
    assert moe[0] == 0.0
    # non-linear in the tokens: a token alone costs far more per token than one of 2048
    per_token = moe[ts] / ts
    assert per_token[0] > 10 * per_token[-1]
    assert np.all(np.diff(moe[ts]) >= 0)  # 3 and 4 tokens: the same padded step
    # the second token (more experts touched) costs far more than a token added at 1024
    slope_small = moe[2] - moe[1]
    slope_big = (moe[2048] - moe[1024]) / 1024
    assert slope_small > 5 * slope_big
    # the MoE describes itself, and the table total is non-linear in T too
    cost = measured_cost(dep, prof, max_tokens=2048)
    assert cost.describe["moe"].startswith("measured fused MoE")
    t = tok[:, 6]
    assert t[1] / 1 > 10 * (t[2048] / 2048)


def test_moe_tp2_uses_the_tp2_table(h100: Profile) -> None:
    dep = _dep("qwen3-30b-a3b", "h100-sxm", tp=2)
    tok, _, cov = measured_tables(dep, h100, 600, 256)
    assert "moe_tp=2" in cov.moe
    doubled = _scaled(h100, "moe", pl.col("moe_tp") == 2, 2.0)
    tok2, _, _ = measured_tables(dep, doubled, 600, 256)
    m = dep.model
    moe = (tok2[:, 6] - tok[:, 6]) / m.num_moe_layers
    shape = (m.hidden_size, m.moe_intermediate_size, m.experts_per_token, m.num_experts)
    want = h100.moe_time("bf16", "power_law_1.01", 2, 1, shape, np.array([8.0, 600.0]))
    assert want is not None
    np.testing.assert_allclose(moe[[8, 600]], want, rtol=1e-9)


# ----------------------------------------------------------------------------------- cost_model selection


def test_cost_model_selection() -> None:
    h100_dep = _dep("llama-3.1-8b", "h100-sxm")
    roof = step_cost_for(h100_dep, "roofline", max_tokens=1024)
    assert roof.source == "roofline"
    assert roof.describe["tier"] == "roofline"
    auto = step_cost_for(h100_dep, "auto", max_tokens=1024)
    assert auto.source == "measured"
    assert auto.describe["profile"] == "h100-sxm"
    meas = step_cost_for(h100_dep, "measured", max_tokens=1024)
    assert meas.source == "measured"
    np.testing.assert_array_equal(meas.tok, auto.tok)
    mi = _dep("llama-3.1-8b", "mi300x")
    assert step_cost_for(mi, "auto", max_tokens=1024).source == "roofline"
    with pytest.raises(ConfigError) as err:
        step_cost_for(mi, "measured", max_tokens=1024)
    msg = str(err.value)
    assert "\n" not in msg
    assert "mi300x" in msg and "measured" in msg
    with pytest.raises(ConfigError, match="cost_model must be one of"):
        step_cost_for(h100_dep, "vidur")


def test_measured_cost_prices_steps_differently_from_roofline() -> None:
    dep = _dep("llama-3.1-8b", "h100-sxm")
    roof = step_cost_for(dep, "roofline", max_tokens=1024)
    meas = step_cost_for(dep, "measured", max_tokens=1024)
    b = _batch([(0, 0, 0, 0, 64, 64 * 2000), (512, 1, 512 * 513 / 2, 512, 0, 0)])
    got = meas(b)
    assert got.measured_s is not None
    # most of a measured step's time comes from measured tables
    assert np.all(got.measured_s / got.time_s > 0.5)
    assert not np.allclose(got.time_s, roof(b).time_s, rtol=1e-3)


# ----------------------------------------------------------------------------------- jit kernel


@pytest.fixture(scope="module")
def measured_costs(pro6000: Profile, h100: Profile) -> list[TabulatedCost]:
    return [
        measured_cost(_dep("llama-3.1-8b", "rtx-pro-6000"), pro6000, max_tokens=4096, overhead_s=1e-4),
        measured_cost(_dep("qwen3-30b-a3b", "h100-sxm", tp=2), h100, max_tokens=4096),
        measured_cost(_dep("qwen3-32b", "rtx-pro-6000", tp=2), pro6000, max_tokens=4096),
    ]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2))
def test_tabulated_call_is_the_jit_engine_row(measured_costs: list[TabulatedCost], seed: int, which: int) -> None:
    from pipeline.engine._jit_kernels import _tab_row

    cost = measured_costs[which]
    x = _engine_steps(np.random.default_rng(seed), 40, 4096)
    got = cost(_batch([tuple(r) for r in x]))
    out = np.zeros(len(OUT))
    for r, row in enumerate(x):
        binding = _tab_row(np.ascontiguousarray(row), *cost.kernel_args, out)
        assert out[0] == got.time_s[r]
        assert out[1] == got.compute_s[r]
        assert out[2] == got.memory_s[r]
        assert out[3] == got.comm_s[r]
        assert out[4] == got.overhead_s[r]
        assert out[5] == got.flops[r]
        assert out[6] == got.bytes[r]
        assert got.measured_s is not None and out[7] == got.measured_s[r]
        assert binding == got.binding[r]
    # and time = compute + memory + comm + overhead, measured ≤ time
    np.testing.assert_allclose(got.time_s, got.compute_s + got.memory_s + got.comm_s + got.overhead_s, rtol=1e-12)
    assert np.all(got.measured_s <= got.time_s * (1 + 1e-12))
    busy = x[:, 0] + x[:, 4] > 0
    assert np.all(got.time_s[busy] > 0) and np.all(got.time_s[~busy] == 0)


def test_measured_cost_extends_for_big_steps(pro6000: Profile) -> None:
    cost = measured_cost(_dep("llama-3.1-8b", "rtx-pro-6000"), pro6000, max_tokens=600)
    assert cost.max_tokens == 600
    small = cost(_batch([(600, 1, 600 * 601 / 2, 600, 0, 0)]))
    big = cost(_batch([(600, 1, 600 * 601 / 2, 600, 0, 0), (1500, 1, 1500 * 1501 / 2, 1500, 0, 0)]))
    assert big.time_s[0] == small.time_s[0]
    assert big.time_s[1] > 2 * small.time_s[0]


def test_moe_expert_parallel_uses_the_ep_table(h100: Profile) -> None:
    dep = Deployment(load_model("qwen3-30b-a3b"), load_hardware("h100-sxm"), tp=2, ep=2)
    m = dep.model
    shape = (m.hidden_size, m.moe_intermediate_size, m.experts_per_token, m.num_experts)
    ep_table = h100.moe_time("bf16", "power_law_1.01", 1, 2, shape, np.array([8.0, 512.0]))
    assert ep_table is not None  # the profile has the EP measurement
    tok, _, _ = measured_tables(dep, h100, 600, 256)
    doubled = _scaled(h100, "moe", pl.lit(True), 2.0)
    tok2, _, _ = measured_tables(dep, doubled, 600, 256)
    moe = (tok2[:, 6] - tok[:, 6]) / m.num_moe_layers
    np.testing.assert_allclose(moe[[8, 512]], ep_table, rtol=1e-9)


_SHARE_SCRIPT = """
import numpy as np
from pipeline.catalog import load_hardware, load_model
from pipeline.costmodel.profile.cost import measured_cost
from pipeline.costmodel.profile.tables import load_profile
from pipeline.costmodel.roofline import Deployment
from pipeline.costmodel.steps import StepBatch
dep = Deployment(load_model("llama-3.1-8b"), load_hardware("h100-sxm"))
cost = measured_cost(dep, load_profile("h100-sxm"), max_tokens=64)
b = StepBatch(*(np.array([v]) for v in (100.0, 1.0, 5050.0, 100.0, 0.0, 0.0)))
got = cost(b)
print(repr(float(cost.measured_share(b)[0])), repr(float(got.measured_s[0] / got.time_s[0])))
"""


def test_measured_share_of_a_step_beyond_the_tables() -> None:
    import subprocess
    import sys

    # in a child process: the out-of-bounds read may crash it
    run = subprocess.run([sys.executable, "-c", _SHARE_SCRIPT], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    share, want = (float(v) for v in run.stdout.split())
    assert 0.0 < want <= 1.0
    assert share == pytest.approx(want, rel=1e-9)


def test_steps_beyond_the_tables_are_extrapolated_exactly_for_the_roofline() -> None:
    # A token budget of 10^6 must not build 10^6-row tables: they stop at MAX_TABLE_TOKENS and
    # the kernel extrapolates linearly, which for the roofline (linear in T out there) is exact.
    from pipeline.costmodel.roofline import prefill_batch, roofline_cost, step_cost
    from pipeline.costmodel.stepcost import MAX_TABLE_TOKENS

    dep = _dep("llama-3.1-8b", "h100-sxm")
    cost = roofline_cost(dep, max_tokens=1_000_000)
    assert cost.max_tokens == MAX_TABLE_TOKENS
    batch = prefill_batch([70_000.0, 200_000.0, 1_000_000.0])
    np.testing.assert_allclose(cost(batch).time_s, step_cost(dep, batch).time_s, rtol=1e-9)


def test_prefill_attention_past_the_longest_measured_prompt_grows_with_the_pairs() -> None:
    # Beyond the grid's longest prompt the prefill part scales with c(c+1)/2, not with c.
    from pipeline.costmodel.profile.attention import prefill_grid_time

    prof = load_profile("h100-sxm")
    assert prof is not None
    grid = prof.attention_grid("attn_prefill", "bf16", 32, 8, 128)
    assert grid is not None
    top = float(grid.b[-1])
    t_top = float(prefill_grid_time(grid, np.array([1.0]), np.array([top]))[0])
    t_4x = float(prefill_grid_time(grid, np.array([1.0]), np.array([4 * top]))[0])
    assert t_4x / t_top == pytest.approx(4 * top * (4 * top + 1) / (top * (top + 1)), rel=1e-12)
    # the compiled kernel agrees: a 2x-longest prompt alone
    cost = measured_cost(_dep("llama-3.1-8b", "h100-sxm"), prof, max_tokens=40_000)
    args = cost.kernel_args
    att = stepcost._compiled()["attention"]
    c = 2 * top
    x = np.array([c, 1.0, c * (c + 1) / 2, c, 0.0, 0.0])
    want = float(prefill_grid_time(grid, np.array([1.0]), np.array([c]))[0])
    assert att(x, *args[8:14], 0.0, args[14]) == pytest.approx(want, rel=1e-9)


def test_mixed_ratio_grid_kernel_equals_python_and_prices_mixed_steps() -> None:
    """The flat, compiled ratio grid gives the RatioGrid's numbers; a step with a prefill chunk
    costs the parts summed times that ratio; pure decode steps are untouched."""
    prof = load_profile("rtx-pro-6000")
    assert prof is not None
    got = prof.mixed_ratio(32, 8, 128)  # Llama-3.1-8B TP1's own head shape
    assert got is not None and "this head shape" in got[1]
    grid = got[0]
    mx = stepcost.flat_ratio_grid(grid)
    rng = np.random.default_rng(5)
    pts = np.column_stack(
        [rng.uniform(1, 4096, 200), rng.uniform(0, 40000, 200), rng.integers(0, 600, 200), rng.uniform(1, 40000, 200)]
    )
    want = grid(pts[:, 0], pts[:, 1], pts[:, 2], pts[:, 3])
    flat = np.array([stepcost._mixed_ratio(mx, *p) for p in pts])
    np.testing.assert_array_equal(flat, want)
    # at a measured grid point the ratio is the measured cell's (mean log over its rows)
    rows = prof.frame("attn_mixed").filter(
        (pl.col("nq") == 32) & (pl.col("nkv") == 8) & (pl.col("d") == 128)
        & (pl.col("chunk") == 256) & (pl.col("kv_prefill") == 1024) & (pl.col("n_decode") == 8)
        & (pl.col("kv_decode") == 2048)
    )  # fmt: skip
    assert rows.height >= 1
    cell = float(np.exp(np.log(rows["ratio"].to_numpy()).mean()))
    assert stepcost._mixed_ratio(mx, 256.0, 1024.0, 8.0, 2048.0) == pytest.approx(cell, rel=1e-12)
    # the kernel: pure decode ignores the grid; with a chunk, (parts summed) x ratio
    dg, pg = _attention_grids(prof, 32, 8, 128)
    args = (*grid_arrays(dg), *grid_arrays(pg))
    att = stepcost._compiled()["attention"]
    dec = np.array([0.0, 0.0, 0.0, 0.0, 8.0, 8.0 * 2048])
    assert att(dec, *args, 48.0, mx) == att(dec, *args, 48.0, np.zeros(1))
    c, o = 256.0, 1024.0
    step = np.array([c, 1.0, c * o + c * (c + 1) / 2, o + c, 8.0, 8.0 * 2048])
    parts = attn.step_attention(dg, pg, np.ones(1), np.array([c]), step[2:3], step[4:5], step[5:6], 0.0)[0]
    assert att(step, *args, 48.0, mx) == pytest.approx(parts * cell, rel=1e-12)
    assert stepcost._attention(step, *args, 48.0, mx) == pytest.approx(parts * cell, rel=1e-12)


def test_mixed_ratio_grid_fills_holes_between_measured_cells() -> None:
    """A grid cell no row measured, lying between two measured cells along an axis, takes their
    interpolation in the axis' log coordinate (RTX PRO 6000's bundles interleave a x2 and a x1.5
    grid: most cells of the union are such holes). Hand case: chunk 64 between chunks 16 and 256
    at ratios 2 and 8 -> exp(log 2 + 0.5 * log 4) = 4 (the nearest cell would give 2 or 8)."""
    from pipeline.costmodel.profile.mixed import ratio_grid

    rows = pl.DataFrame(
        {
            "chunk": [16, 256, 64],
            "kv_prefill": [0, 0, 512],
            "n_decode": [4, 4, 4],
            "kv_decode": [1024, 1024, 1024],
            "ratio": [2.0, 8.0, 1.0],
        }
    )
    grid = ratio_grid(rows)
    assert grid is not None
    assert float(grid(64.0, 0.0, 4.0, 1024.0)) == pytest.approx(4.0, rel=1e-12)
    assert float(grid(16.0, 0.0, 4.0, 1024.0)) == pytest.approx(2.0, rel=1e-12)  # measured cells stay
    # The shipped profile: a step inside a measured block (chunk 2048, offsets 1,024-2,048, 64-128
    # decodes of 8,192-16,384 context: 2.19-3.64 measured) is priced inside it. Filled from the
    # nearest cells it took 0.90, a no-decode row's ratio copied along the decode axis.
    prof = load_profile("rtx-pro-6000")
    assert prof is not None
    got = prof.mixed_ratio(32, 8, 128)
    assert got is not None
    block = prof.frame("attn_mixed").filter(
        (pl.col("nq") == 32) & (pl.col("nkv") == 8) & (pl.col("d") == 128) & (pl.col("chunk") == 2048)
        & pl.col("kv_prefill").is_in([1024, 2048]) & pl.col("n_decode").is_in([64, 128])
        & pl.col("kv_decode").is_in([8192, 16384])
    )  # fmt: skip
    assert block.height == 8
    lo, hi = float(block["ratio"].min()), float(block["ratio"].max())  # type: ignore[arg-type]
    mx = stepcost.flat_ratio_grid(got[0])
    for o, n, k in [(1448.0, 106.0, 8779.0), (1152.0, 100.0, 12000.0), (1728.0, 80.0, 9000.0)]:
        assert lo <= stepcost._mixed_ratio(mx, 2048.0, o, n, k) <= hi, (o, n, k)


@pytest.mark.parametrize(("model", "gpu"), [("llama-3.1-8b", "h100-sxm"), ("qwen3-30b-a3b", "h100-sxm")])
def test_fp16_reads_the_bf16_tables(model: str, gpu: str) -> None:
    # The sets measured BF16 only; an FP16 deployment runs the same kernels at the same rate, so it
    # must be priced from the same tables, not fall back to the roofline (it did: 5 % faster on
    # a Llama-3.1-70B TP4 H100 batch of 16 x 1,024 / 1,024 tokens)
    prof = load_profile(gpu)
    bf16 = Deployment(load_model(model), load_hardware(gpu), weight_dtype="bf16", kv_dtype="bf16")
    fp16 = dataclasses.replace(bf16, weight_dtype="fp16", kv_dtype="fp16")
    tok_b, log_b, cov_b = measured_tables(bf16, prof, 600, 256)
    tok_f, log_f, cov_f = measured_tables(fp16, prof, 600, 256)
    assert cov_b.gemm == "bf16 measured"
    assert cov_f.gemm == "bf16 measured; fp16 priced from the bf16 tables"
    assert cov_f.moe == cov_b.moe
    np.testing.assert_array_equal(tok_f, tok_b)
    np.testing.assert_array_equal(log_f, log_b)
    steps = _batch(
        [
            (0, 0, 0, 0, 8, 8 * 3000),
            (512, 1, 512 * 513 / 2, 512, 0, 0),
            (256, 1, 256 * 257 / 2 + 256 * 1000, 256, 30, 30 * 900),
        ]
    )
    got_b = measured_cost(bf16, prof, max_tokens=600)(steps).measured_s
    got_f = measured_cost(fp16, prof, max_tokens=600)(steps).measured_s
    np.testing.assert_array_equal(got_f, got_b)
    assert "bf16 KV" in measured_cost(fp16, prof, max_tokens=600).describe["attention"]


def test_a_profile_with_its_own_fp16_gemms_uses_them() -> None:
    # The BF16 stand-in applies only where FP16 was not measured: give the profile FP16 GEMM rows
    # (the BF16 ones at 2x the time) and an FP16 deployment must read them, and say nothing mapped.
    prof = load_profile("h100-sxm")
    assert prof is not None
    gemm = prof.frames["gemm"]
    fp16 = gemm.filter(pl.col("dtype") == "bf16").with_columns(dtype=pl.lit("fp16"), time_s=pl.col("time_s") * 2)
    own = Profile(prof.meta, {**prof.frames, "gemm": pl.concat([gemm, fp16])})
    dep = Deployment(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), weight_dtype="fp16", kv_dtype="fp16")
    bf = dataclasses.replace(dep, weight_dtype="bf16", kv_dtype="bf16")
    tok_own, _, cov_own = measured_tables(dep, own, 300, 256)
    tok_bf, _, _ = measured_tables(bf, own, 300, 256)
    assert cov_own.gemm == "fp16 measured"
    gemm_s = lambda tok: tok[:, 6]  # noqa: E731  (measured seconds: GEMMs double, the rest equal)
    assert np.all(gemm_s(tok_own)[1:] > gemm_s(tok_bf)[1:])
