"""Log-log interpolation of measured kernel times (pipeline/costmodel/profile/interp.py).

Hand-computed cases (a power law is reproduced exactly between grid points, proportional
extrapolation above the grid, clamping below it) and property tests (monotone data gives a
monotone interpolant; an interpolated value lies between its neighbours).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.costmodel.profile.interp import Curve, Grid2, bracket, curve_family, grid2_from, loglog

REL = 1e-12

# ----------------------------------------------------------------------------------- bracket


def test_bracket_hand_computed() -> None:
    grid = np.array([1.0, 4.0, 16.0])
    q = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    i0, i1, w, lf = bracket(grid, q)
    assert i0.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert i1.tolist() == [1, 1, 1, 1, 2, 2, 2]
    # log-space weights: 2 is half way (in log) between 1 and 4, 8 half way between 4 and 16
    np.testing.assert_allclose(w, [0.0, 0.0, 0.5, 1.0, 0.5, 1.0, 1.0], rtol=0, atol=1e-15)
    # only above the grid a proportional factor: log(32 / 16)
    np.testing.assert_allclose(lf, [0, 0, 0, 0, 0, 0, math.log(2.0)], rtol=0, atol=1e-15)
    assert i0.dtype == np.int64 and i1.dtype == np.int64


def test_bracket_not_proportional_clamps_above() -> None:
    grid = np.array([1.0, 4.0, 16.0])
    i0, i1, w, lf = bracket(grid, np.array([64.0, 0.25]), proportional=False)
    assert (i0.tolist(), i1.tolist()) == ([1, 0], [2, 1])
    np.testing.assert_array_equal(w, [1.0, 0.0])
    np.testing.assert_array_equal(lf, [0.0, 0.0])


def test_bracket_single_point_grid() -> None:
    i0, i1, w, lf = bracket(np.array([8.0]), np.array([2.0, 8.0, 32.0]))
    assert i0.tolist() == [0, 0, 0] and i1.tolist() == [0, 0, 0]
    np.testing.assert_array_equal(w, [0.0, 0.0, 0.0])
    np.testing.assert_allclose(lf, [0.0, 0.0, math.log(4.0)], rtol=0, atol=1e-15)
    _, _, _, lf2 = bracket(np.array([8.0]), np.array([32.0]), proportional=False)
    assert lf2.tolist() == [0.0]


def test_bracket_empty_grid_refused() -> None:
    with pytest.raises(ValueError, match="empty grid"):
        bracket(np.array([]), np.array([1.0]))


# ----------------------------------------------------------------------------------- loglog


def test_loglog_power_law_exact_between_points() -> None:
    xs = np.array([1.0, 2.0, 8.0, 64.0, 1024.0])
    ys = 3e-6 * xs**0.6
    q = np.array([1.0, 1.5, 3.0, 7.0, 8.0, 50.0, 500.0, 1024.0])
    np.testing.assert_allclose(loglog(xs, ys, q), 3e-6 * q**0.6, rtol=1e-12)


def test_loglog_piecewise_power_law_hand_computed() -> None:
    # flat at 10 µs up to x = 16, then proportional: 10 µs · x / 16
    xs = np.array([1.0, 16.0, 256.0])
    ys = np.array([10e-6, 10e-6, 160e-6])
    q = np.array([4.0, 16.0, 32.0, 64.0, 128.0])
    np.testing.assert_allclose(loglog(xs, ys, q), [10e-6, 10e-6, 20e-6, 40e-6, 80e-6], rtol=1e-12)
    # linear interpolation in x would say 10 + 150·(32−16)/240 = 20 µs at 32 too, but 15 µs at 24:
    # log-log says 10 · 24/16 = 15 µs as well; and at 20: 12.5 µs (linear: 11.25 µs)
    np.testing.assert_allclose(loglog(xs, ys, 20.0), [12.5e-6], rtol=1e-12)


def test_loglog_above_grid_is_proportional() -> None:
    # t = a·x measured up to 1024: doubling x doubles t above the grid too
    xs = np.array([16.0, 64.0, 256.0, 1024.0])
    ys = 2e-9 * xs
    q = np.array([2048.0, 4096.0, 8192.0])
    got = loglog(xs, ys, q)
    np.testing.assert_allclose(got, 2e-9 * q, rtol=1e-12)
    np.testing.assert_allclose(got[1:] / got[:-1], [2.0, 2.0], rtol=1e-12)
    # a flat curve is also continued proportionally (the throughput at the last point is kept)
    flat = loglog(np.array([1.0, 10.0]), np.array([5.0, 5.0]), np.array([20.0, 40.0]))
    np.testing.assert_allclose(flat, [10.0, 20.0], rtol=1e-12)
    # and not at all when proportional=False
    np.testing.assert_allclose(loglog(xs, ys, q, proportional=False), [ys[-1]] * 3, rtol=1e-12)


def test_loglog_below_grid_is_clamped() -> None:
    xs = np.array([16.0, 64.0, 256.0])
    ys = np.array([7.0, 9.0, 30.0])
    np.testing.assert_allclose(loglog(xs, ys, np.array([1.0, 8.0, 15.999])), [7.0, 7.0, 7.0], rtol=1e-12)


def test_loglog_scalar_query_returns_array() -> None:
    out = loglog(np.array([1.0, 4.0]), np.array([1.0, 4.0]), 2.0)
    assert out.shape == (1,)
    assert out[0] == pytest.approx(2.0, rel=1e-12)


# ----------------------------------------------------------------------------------- Curve.of


def test_curve_of_sorts_takes_medians_and_drops_bad_rows() -> None:
    x = [64, 0, 8, 8, 8, 16, 16, 1, -4, 32, 32, 128]
    t = [6.0, 1.0, 5.0, 1.0, 3.0, 4.0, 8.0, 0.5, 2.0, 0.0, -1.0, float("nan")]
    c = Curve.of(x, t)
    # dropped: x = 0, x = −4, t = 0, t = −1, t = NaN (the x = 32 rows both go: no size 32 left)
    np.testing.assert_array_equal(c.x, [1.0, 8.0, 16.0, 64.0])
    # medians of repeats: size 8 → median(5, 1, 3) = 3; size 16 → median(4, 8) = 6
    np.testing.assert_array_equal(c.t, [0.5, 3.0, 6.0, 6.0])
    assert c.x.dtype == np.float64 and c.t.dtype == np.float64


def test_curve_of_drops_infinite_times() -> None:
    c = Curve.of([1, 2, 4], [1.0, float("inf"), 4.0])
    np.testing.assert_array_equal(c.x, [1.0, 4.0])
    # the curve interpolates across the dropped row
    assert c(2.0)[0] == pytest.approx(2.0, rel=1e-12)


def test_curve_call_is_loglog() -> None:
    c = Curve.of([256, 1, 16], [160e-6, 10e-6, 10e-6])  # unsorted
    np.testing.assert_allclose(c(np.array([0.5, 4.0, 64.0, 512.0])), [10e-6, 10e-6, 40e-6, 320e-6], rtol=1e-12)


# ----------------------------------------------------------------------------------- curve_family


def _power(m: float | np.ndarray, n: float, k: float) -> np.ndarray:
    return np.asarray(1e-9 * np.power(m, 0.8) * n**0.5 * k**0.7)


def _sparse_family() -> dict[tuple[float, ...], Curve]:
    """A non-rectangular set of (n, k) shapes: every n has its own k list."""
    ms = np.array([1.0, 4.0, 16.0, 64.0, 256.0, 1024.0])
    shapes = {
        1024.0: [512.0, 2048.0, 8192.0],
        4096.0: [1024.0, 4096.0],
        16384.0: [256.0, 1024.0, 4096.0, 16384.0],
    }
    return {(n, k): Curve.of(ms, _power(ms, n, k)) for n, ks in shapes.items() for k in ks}


def test_curve_family_reproduces_separable_power_law_inside() -> None:
    fam = _sparse_family()
    m = np.array([1.0, 3.0, 100.0, 1024.0])
    # n between 1024 and 4096, k inside both rows' k ranges (1024..2048): exact
    for key in ((2048.0, 1500.0), (1024.0, 1024.0), (8192.0, 2048.0), (4096.0, 3000.0), (16384.0, 300.0)):
        np.testing.assert_allclose(curve_family(fam, key, m), _power(m, *key), rtol=1e-12, err_msg=str(key))


def test_curve_family_reads_measured_keys_exactly() -> None:
    # neighbours far from any law: a measured key must still be read as measured
    ms = np.array([1.0, 64.0, 4096.0])
    fam = {
        (1024.0, 1024.0): Curve.of(ms, [1.0, 2.0, 3.0]),
        (1024.0, 4096.0): Curve.of(ms, [100.0, 200.0, 300.0]),
        (4096.0, 2048.0): Curve.of(ms, [7.0, 70.0, 700.0]),
        (8192.0, 512.0): Curve.of(ms, [0.01, 0.02, 0.03]),
    }
    for key, c in fam.items():
        np.testing.assert_allclose(curve_family(fam, key, ms), c.t, rtol=REL, err_msg=str(key))
    # an int key finds the same curve
    np.testing.assert_allclose(curve_family(fam, (4096, 2048), [64]), [70.0], rtol=REL)


def test_curve_family_non_rectangular_hand_computed() -> None:
    ms = np.array([1.0, 100.0])
    fam = {
        (1.0, 1.0): Curve.of(ms, [1.0, 1.0]),
        (1.0, 4.0): Curve.of(ms, [4.0, 4.0]),
        (4.0, 2.0): Curve.of(ms, [8.0, 8.0]),
        (4.0, 8.0): Curve.of(ms, [64.0, 64.0]),
    }
    # key (2, 2): n half way (log) between 1 and 4.
    #   row n=1 at k=2: log-log between (1, 1) and (4, 4) → 2
    #   row n=4 at k=2: measured → 8
    #   mix at w = 1/2 in log: sqrt(2 · 8) = 4
    assert curve_family(fam, (2.0, 2.0), [10.0])[0] == pytest.approx(4.0, rel=1e-12)
    # key (2, 8): row n=1 above its k range → 4 · 8/4 = 8; row n=4 measured → 64; sqrt(8·64)
    assert curve_family(fam, (2.0, 8.0), [10.0])[0] == pytest.approx(math.sqrt(8 * 64), rel=1e-12)
    # key (4, 1): row n=4 below its k range → clamped at k=2: 8
    assert curve_family(fam, (4.0, 1.0), [10.0])[0] == pytest.approx(8.0, rel=1e-12)


def test_curve_family_proportional_above_clamped_below() -> None:
    fam = _sparse_family()
    m = np.array([1.0, 64.0, 1024.0])
    top = _power(m, 16384.0, 16384.0)
    # wider than any measured shape: time ∝ n · k beyond the largest measured n and k
    np.testing.assert_allclose(curve_family(fam, (32768.0, 16384.0), m), 2 * top, rtol=1e-12)
    np.testing.assert_allclose(curve_family(fam, (32768.0, 65536.0), m), 8 * top, rtol=1e-12)
    # m above the grid: ∝ m
    np.testing.assert_allclose(
        curve_family(fam, (16384.0, 16384.0), [2048.0, 4096.0]),
        [2 * top[-1], 4 * top[-1]],
        rtol=1e-12,
    )
    # below the smallest n / k / m: the smallest measured one's time
    low = _power(m, 1024.0, 512.0)
    np.testing.assert_allclose(curve_family(fam, (256.0, 512.0), m), low, rtol=1e-12)
    np.testing.assert_allclose(curve_family(fam, (1024.0, 64.0), m), low, rtol=1e-12)
    np.testing.assert_allclose(curve_family(fam, (1024.0, 512.0), [0.25]), [low[0]], rtol=1e-12)


def test_curve_family_one_dimensional_keys() -> None:
    xs = np.array([1.0, 10.0])
    fam = {(2.0,): Curve.of(xs, [2.0, 20.0]), (8.0,): Curve.of(xs, [8.0, 80.0])}
    # (4,) half way in log between 2 and 8 → sqrt(2·8) = 4 at x = 1
    assert curve_family(fam, (4.0,), [1.0])[0] == pytest.approx(4.0, rel=1e-12)
    assert curve_family(fam, (16.0,), [10.0])[0] == pytest.approx(160.0, rel=1e-12)


# ----------------------------------------------------------------------------------- Grid2


def _g_power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(2e-6 * np.power(a, 0.4) * np.power(b, 0.9))


def test_grid2_power_law_inside_and_extrapolation() -> None:
    a = np.array([1.0, 4.0, 16.0, 64.0])
    b = np.array([128.0, 1024.0, 8192.0])
    aa, bb = np.meshgrid(a, b, indexing="ij")
    g = grid2_from(aa.ravel(), bb.ravel(), _g_power(aa, bb).ravel())
    assert g is not None
    np.testing.assert_array_equal(g.a, a)
    np.testing.assert_array_equal(g.b, b)
    qa = np.array([1.0, 2.0, 10.0, 64.0, 33.0])
    qb = np.array([128.0, 500.0, 5000.0, 8192.0, 129.0])
    np.testing.assert_allclose(g(qa, qb), _g_power(qa, qb), rtol=1e-12)
    top = _g_power(np.array([64.0]), np.array([8192.0]))[0]
    # above both axes: proportional in each
    np.testing.assert_allclose(g(128.0, 8192.0), [2 * top], rtol=1e-12)
    np.testing.assert_allclose(g(64.0, 16384.0), [2 * top], rtol=1e-12)
    np.testing.assert_allclose(g(256.0, 32768.0), [16 * top], rtol=1e-12)
    # below both axes: clamped
    low = _g_power(np.array([1.0]), np.array([128.0]))[0]
    np.testing.assert_allclose(g(0.5, 1.0), [low], rtol=1e-12)
    # broadcasting: a scalar against an array
    np.testing.assert_allclose(g(4.0, b), _g_power(np.full(3, 4.0), b), rtol=1e-12)


def test_grid2_bilinear_hand_computed() -> None:
    g = Grid2(np.array([1.0, 4.0]), np.array([1.0, 9.0]), np.array([[1.0, 3.0], [2.0, 12.0]]))
    # (2, 3): w = v = 1/2 in log; exp(mean of logs) = (1·3·2·12)^(1/4) = 72^(1/4)
    assert g(2.0, 3.0)[0] == pytest.approx(72.0**0.25, rel=1e-12)
    assert g(4.0, 9.0)[0] == pytest.approx(12.0, rel=1e-12)
    assert g(1.0, 3.0)[0] == pytest.approx(math.sqrt(3.0), rel=1e-12)


def test_grid2_from_fills_missing_cells_along_b_and_drops_bad_rows() -> None:
    # a=1 measured at b = 1, 4, 16; a=2 only at b = 1 and 16; a=3 only non-positive times
    a = [1, 1, 1, 2, 2, 3, 3, 2]
    b = [1, 4, 16, 1, 16, 1, 4, 4]
    t = [1.0, 2.0, 4.0, 10.0, 40.0, 0.0, -1.0, float("nan")]
    g = grid2_from(a, b, t)
    assert g is not None
    np.testing.assert_array_equal(g.a, [1.0, 2.0])
    np.testing.assert_array_equal(g.b, [1.0, 4.0, 16.0])
    # the missing cell (2, 4): log-log along b between 10 (b=1) and 40 (b=16) → 20
    np.testing.assert_allclose(g.t, [[1.0, 2.0, 4.0], [10.0, 20.0, 40.0]], rtol=1e-12)


def test_grid2_from_fills_above_a_rows_range_proportionally() -> None:
    g = grid2_from([1, 1, 2], [1, 8, 2], [1.0, 8.0, 5.0])
    assert g is not None
    np.testing.assert_array_equal(g.b, [1.0, 2.0, 8.0])
    # row a=2 has one cell (b=2): clamped below (b=1 → 5), proportional above (b=8 → 20)
    np.testing.assert_allclose(g.t[1], [5.0, 5.0, 20.0], rtol=1e-12)


def test_grid2_from_nothing_left() -> None:
    assert grid2_from([], [], []) is None
    assert grid2_from([1, 2], [0, 3], [1.0, 0.0]) is None


# ----------------------------------------------------------------------------------- properties


@st.composite
def _monotone_curve(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(2, 8))
    steps = draw(st.lists(st.floats(1.05, 16.0), min_size=n - 1, max_size=n - 1))
    x0 = draw(st.floats(0.5, 100.0))
    xs = x0 * np.cumprod([1.0, *steps])
    incs = draw(st.lists(st.floats(1.0, 10.0), min_size=n - 1, max_size=n - 1))
    y0 = draw(st.floats(1e-7, 1e-2))
    ys = y0 * np.cumprod([1.0, *incs])
    return xs, ys


@settings(max_examples=200, deadline=None)
@given(_monotone_curve(), st.lists(st.floats(0.01, 1e7), min_size=2, max_size=30))
def test_monotone_data_gives_monotone_interpolation(curve: tuple[np.ndarray, np.ndarray], qs: list[float]) -> None:
    xs, ys = curve
    q = np.sort(np.array(qs))
    f = loglog(xs, ys, q)
    assert np.all(f > 0)
    assert np.all(np.diff(f) >= -1e-12 * f[1:])
    # the same through a Curve built from shuffled rows
    order = np.random.default_rng(len(qs)).permutation(xs.size)
    np.testing.assert_allclose(Curve.of(xs[order], ys[order])(q), f, rtol=1e-15)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(1.0, 1e6), min_size=2, max_size=10, unique=True),
    st.lists(st.floats(1e-7, 1.0), min_size=10, max_size=10),
    st.floats(0.0, 1.0),
    st.integers(0, 8),
)
def test_interpolated_value_lies_between_neighbours(xs_: list[float], ys_: list[float], frac: float, i: int) -> None:
    xs = np.sort(np.array(xs_))
    assume(np.all(np.diff(xs) / xs[1:] > 1e-9))
    ys = np.array(ys_[: xs.size])
    i = i % (xs.size - 1)
    q = xs[i] * (xs[i + 1] / xs[i]) ** frac
    f = loglog(xs, ys, q)[0]
    lo, hi = min(ys[i], ys[i + 1]), max(ys[i], ys[i + 1])
    assert lo * (1 - 1e-12) <= f <= hi * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(
    st.floats(1e-9, 1e-3),
    st.floats(-1.0, 2.0),
    st.lists(st.floats(1.0, 1e5), min_size=2, max_size=8, unique=True),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10),
)
def test_power_law_reproduced_between_points(c: float, p: float, xs_: list[float], fr: list[float]) -> None:
    xs = np.sort(np.array(xs_))
    assume(np.all(np.diff(xs) / xs[1:] > 1e-6))
    ys = c * xs**p
    q = xs[0] * (xs[-1] / xs[0]) ** np.array(fr)
    np.testing.assert_allclose(loglog(xs, ys, q), c * q**p, rtol=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(1.0, 1e4), min_size=2, max_size=6, unique=True),
    st.lists(st.floats(1.0, 1e4), min_size=2, max_size=6, unique=True),
    st.floats(0.1, 1.5),
    st.floats(0.1, 1.5),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
)
def test_grid2_monotone_and_bounded_by_corners(
    a_: list[float], b_: list[float], pa: float, pb: float, fa: float, fb: float
) -> None:
    a, b = np.sort(np.array(a_)), np.sort(np.array(b_))
    assume(np.all(np.diff(a) / a[1:] > 1e-6) and np.all(np.diff(b) / b[1:] > 1e-6))
    t = np.outer(a**pa, b**pb) * 1e-6
    g = Grid2(a, b, t)
    qa = a[0] * (a[-1] / a[0]) ** fa
    qb = b[0] * (b[-1] / b[0]) ** fb
    v = g(qa, qb)[0]
    assert v == pytest.approx(1e-6 * qa**pa * qb**pb, rel=1e-9)
    # increasing in each axis, including beyond the grid
    assert g(qa * 1.5, qb)[0] >= v * (1 - 1e-12)
    assert g(qa, qb * 1.5)[0] >= v * (1 - 1e-12)
    assert t.min() * (1 - 1e-12) <= v <= t.max() * (1 + 1e-12)
