"""How a profile prices shapes it never measured (pipeline/costmodel/profile/interp.py, tables.py).

Two rules found on the held-out checks (docs/validation.md, "Why the misses"), each pinned by
hand-computed cases so that a regression fails here and not only in the held-out table:

- GEMM curves drop isolated upward spikes (``upward_spikes``) before interpolating: a spike in
  one measured shape must not leak into the shapes around it, while tile / wave steps and
  measured zig-zags stay;
- a grouped-query decode (nq > nkv) is interpolated among grouped shapes only — never with the
  one-query-per-KV-head shape, which runs another kernel path — and prefill is unaffected.
"""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest

from pipeline.costmodel.profile.interp import Curve, curve_family, upward_spikes
from pipeline.costmodel.profile.tables import GEMM_SPIKE_REL, GQA_SEPARATE, frames_profile

# ----------------------------------------------------------------------------------- spikes


def test_single_spike_is_flagged() -> None:
    t = [1.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0]
    assert upward_spikes(t, 0.2).tolist() == [False, False, False, True, False, False, False]


def test_two_adjacent_spikes_are_flagged() -> None:
    t = [1.0, 1.0, 1.0, 2.0, 2.1, 1.0, 1.0, 1.0]
    assert np.flatnonzero(upward_spikes(t, 0.2)).tolist() == [3, 4]


def test_threshold_is_relative_to_the_second_highest_neighbour() -> None:
    # neighbours of index 2 are 1.0, 1.1, 1.0, 1.05: second-highest 1.05
    t = [1.0, 1.1, 1.26, 1.0, 1.05]
    assert not upward_spikes(t, 0.2)[2]  # 1.26 = 1.2 * 1.05 exactly: not above
    t[2] = 1.27
    assert upward_spikes(t, 0.2)[2]


@pytest.mark.parametrize(
    "t",
    [
        [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0],  # a wave step: higher from here on
        [1.0, 1.3, 1.0, 1.3, 1.0, 1.3, 1.0],  # sizes in pairs m, m+1 with the odd one slower
        [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],  # proportional growth
        [3.0, 1.0, 1.0, 1.0, 1.0, 3.0],  # ends are never judged
    ],
)
def test_steps_zigzags_growth_and_ends_are_kept(t: list[float]) -> None:
    assert not upward_spikes(t, 0.2).any()


def test_short_curves_are_kept() -> None:
    assert upward_spikes([1.0, 5.0, 1.0, 1.0], 0.2).tolist() == [False] * 4
    assert upward_spikes([], 0.2).size == 0


def test_curve_of_despike_drops_only_the_spike() -> None:
    x = [1, 2, 3, 4, 5, 6, 7]
    t = [1.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0]
    plain = Curve.of(x, t)
    clean = Curve.of(x, t, despike=0.2)
    assert plain.x.tolist() == x
    assert clean.x.tolist() == [1, 2, 3, 5, 6, 7]
    assert float(clean(4.0)[0]) == pytest.approx(1.0, rel=1e-12)


# ----------------------------------------------------------------------------------- GEMM


def _gemm_frame(spike: tuple[float, float, float] | None) -> pl.DataFrame:
    """t = 1e-9 · m^0.5 · n · k^0.5 on a 3 × 3 (n, k) grid, m = 1 … 256 (×2); optionally one row
    three times too slow."""
    rows = []
    for m, n, k in itertools.product([2.0**i for i in range(9)], [256.0, 1024.0, 4096.0], [256.0, 1024.0, 4096.0]):
        t = 1e-9 * m**0.5 * n * k**0.5
        if spike is not None and (m, n, k) == spike:
            t *= 3.0
        rows.append(("bf16", m, n, k, t, "s", "aiconfigurator"))
    return pl.DataFrame(rows, schema=["dtype", "m", "n", "k", "time_s", "source", "set"], orient="row")


def test_gemm_spike_in_a_neighbour_does_not_move_an_unseen_shape() -> None:
    clean = frames_profile("h100-sxm", {"gemm": _gemm_frame(None)})
    spiky = frames_profile("h100-sxm", {"gemm": _gemm_frame((16.0, 1024.0, 1024.0))})
    m = np.array([16.0])
    # (n, k) = (512, 2048) lies between measured shapes, one of which has the spike at m = 16:
    # the power law is exact in log-log, so the prediction is the law's value with or without it
    expect = 1e-9 * 16**0.5 * 512 * 2048**0.5
    assert float(clean.gemm_time("bf16", 512, 2048, m)[0]) == pytest.approx(expect, rel=1e-9)
    assert float(spiky.gemm_time("bf16", 512, 2048, m)[0]) == pytest.approx(expect, rel=1e-9)
    # without the rule the spike would leak in with its log weight (1/2 in n × 1/2 in k): 3^0.25
    raw = {
        (float(n), float(k)): Curve.of(sub["m"].to_numpy(), sub["time_s"].to_numpy())
        for (n, k), sub in _gemm_frame((16.0, 1024.0, 1024.0)).group_by(["n", "k"])
    }
    leaked = float(curve_family(raw, (512.0, 2048.0), m)[0])
    assert leaked == pytest.approx(expect * 3.0**0.25, rel=1e-9)
    assert GEMM_SPIKE_REL == 0.2


def test_gemm_measured_shape_reads_its_own_rows_except_a_spike() -> None:
    spiky = frames_profile("h100-sxm", {"gemm": _gemm_frame((16.0, 1024.0, 1024.0))})
    m = np.array([8.0, 16.0, 32.0])
    got = spiky.gemm_time("bf16", 1024, 1024, m)
    np.testing.assert_allclose(got, 1e-9 * m**0.5 * 1024 * 32, rtol=1e-9)


# ----------------------------------------------------------------------------------- GQA decode


def _attn_frame(family: str) -> pl.DataFrame:
    """One KV head, head size 128: nq = 1 (one query per KV head) four times slower than the
    grouped shapes nq = 4 and nq = 16, whose time grows as nq^0.5."""
    size = "ctx" if family == "attn_decode" else "isl"
    rows = []
    for nq, b, s in itertools.product([1, 4, 16], [1, 4, 16], [128, 1024, 8192]):
        base = 1e-6 * b**0.5 * s**0.5
        t = 4.0 * base if nq == 1 else base * (nq / 4) ** 0.5
        rows.append(("bf16", nq, 1, 128, b, s, t, "s", "aiconfigurator"))
    return pl.DataFrame(
        rows, schema=["kv_dtype", "nq", "nkv", "d", "batch", size, "time_s", "source", "set"], orient="row"
    )


def test_gqa_decode_never_borrows_from_the_one_query_per_kv_head_shape() -> None:
    assert "attn_decode" in GQA_SEPARATE and "attn_prefill" not in GQA_SEPARATE
    prof = frames_profile("a100-80gb-sxm", {"attn_decode": _attn_frame("attn_decode")})
    b, s = np.array([4.0]), np.array([1024.0])
    base = 1e-6 * 2.0 * 32.0
    # nq = 2: below the smallest grouped shape, so nq = 4's grid as is (not the mix with nq = 1)
    g2 = prof.attention_grid("attn_decode", "bf16", 2, 1, 128)
    assert g2 is not None
    assert float(g2(b, s)[0]) == pytest.approx(base, rel=1e-9)
    # nq = 8: between the grouped shapes 4 and 16, log-log: (8/4)^0.5
    g8 = prof.attention_grid("attn_decode", "bf16", 8, 1, 128)
    assert g8 is not None
    assert float(g8(b, s)[0]) == pytest.approx(base * 2**0.5, rel=1e-9)
    # nq = 1 is measured: read as is
    g1 = prof.attention_grid("attn_decode", "bf16", 1, 1, 128)
    assert g1 is not None
    assert float(g1(b, s)[0]) == pytest.approx(4.0 * base, rel=1e-9)


def test_gqa_decode_falls_back_to_every_shape_without_grouped_ones() -> None:
    frame = _attn_frame("attn_decode").filter(pl.col("nq") != 4)
    frame = frame.filter(pl.col("nq") != 16)
    prof = frames_profile("a100-80gb-sxm", {"attn_decode": frame})
    g = prof.attention_grid("attn_decode", "bf16", 2, 1, 128)
    assert g is not None  # only nq = 1 measured: its grid, proportional in nq above it
    assert float(g(np.array([4.0]), np.array([1024.0]))[0]) == pytest.approx(4.0 * 64e-6 * 2, rel=1e-9)


def test_prefill_still_interpolates_across_every_shape() -> None:
    prof = frames_profile("a100-80gb-sxm", {"attn_prefill": _attn_frame("attn_prefill")})
    g = prof.attention_grid("attn_prefill", "bf16", 2, 1, 128)
    assert g is not None
    # half way (in log nq) between nq = 1 (4·base) and nq = 4 (base): 2·base
    assert float(g(np.array([4.0]), np.array([1024.0]))[0]) == pytest.approx(2.0 * 64e-6, rel=1e-9)
