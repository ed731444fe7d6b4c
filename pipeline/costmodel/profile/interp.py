"""Interpolation of measured kernel times, in log-log space.

Kernel time against a size (tokens, context, bytes, a GEMM dimension) is close to a power law
piecewise: flat while a kernel is launch- or latency-bound, then proportional once it fills the
GPU. Interpolating ``log t`` linearly in ``log x`` is exact for both regimes and for anything
proportional in between, which linear interpolation of ``t`` in ``x`` is not on grids spaced by
powers of two. Outside the measured range:

- below the smallest size: the smallest size's time (a kernel never gets faster than its floor);
- above the largest size: time grows in proportion to size (the throughput reached at the
  largest measurement is kept) — the conservative choice for work that only gets bigger.

Everything here is plain numpy on arrays, evaluated when a deployment's cost curves are built;
the replay engines then read the resulting tables (pipeline/costmodel/profile/cost.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def bracket(
    grid: FloatArray, q: FloatArray, proportional: bool = True
) -> tuple[IntArray, IntArray, FloatArray, FloatArray]:
    """For each query, the grid points around it and its log-space weight.

    Returns ``(i0, i1, w, log_factor)`` so that ``log f(q) ≈ (1−w)·log f[i0] + w·log f[i1] +
    log_factor``. ``grid`` is sorted, strictly increasing and positive. Below the grid the first
    point is used as is; above it the last point scaled by ``q / grid[-1]`` (``proportional``) or
    as is.
    """
    g = np.asarray(grid, dtype=np.float64)
    x = np.asarray(q, dtype=np.float64)
    n = g.shape[0]
    if n == 0:
        raise ValueError("empty grid")
    if n == 1:
        zero = np.zeros(x.shape, np.int64)
        lf = np.log(np.maximum(x, g[0]) / g[0]) if proportional else np.zeros(x.shape)
        return zero, zero, np.zeros(x.shape), lf
    i1 = np.clip(np.searchsorted(g, x, side="left"), 1, n - 1)
    i0 = i1 - 1
    lg = np.log(g)
    lx = np.log(np.clip(x, g[0], g[-1]))
    w = (lx - lg[i0]) / (lg[i1] - lg[i0])
    w = np.clip(w, 0.0, 1.0)
    lf = np.zeros(x.shape)
    if proportional:
        above = x > g[-1]
        lf = np.where(above, np.log(np.where(above, x, 1.0) / g[-1]), 0.0)
    return i0.astype(np.int64), i1.astype(np.int64), w, lf


def loglog(xs: FloatArray, ys: FloatArray, q: FloatArray | float, proportional: bool = True) -> FloatArray:
    """Piecewise power-law interpolation of ``ys`` (> 0) at ``xs`` (sorted, > 0), see module doc."""
    xs = np.asarray(xs, dtype=np.float64)
    ly = np.log(np.asarray(ys, dtype=np.float64))
    i0, i1, w, lf = bracket(xs, np.atleast_1d(np.asarray(q, dtype=np.float64)), proportional)
    return np.asarray(np.exp((1.0 - w) * ly[i0] + w * ly[i1] + lf))


def upward_spikes(t: npt.ArrayLike, rel: float, half: int = 2) -> npt.NDArray[np.bool_]:
    """Which points of a curve (times sorted by size) are isolated upward spikes.

    A point is a spike when it exceeds the *second*-highest of its ``2·half`` nearest neighbours
    (``half`` on each side; interior points only) by more than ``rel``: a single point, or two
    adjacent points, standing above an otherwise level or rising stretch. A monotone step (a
    tile or wave boundary: higher from here on) is never one, nor is a regular zig-zag (sizes
    measured in pairs m, m+1 with the odd one slower): both have a neighbour as high. Measured
    GEMM sweeps have such spikes at random sizes (B200 fp8: one row in 25 at 2× its neighbours,
    docs/validation.md); interpolating through one would carry it into every shape nearby.
    """
    ta = np.asarray(t, dtype=np.float64)
    n = ta.size
    bad = np.zeros(n, dtype=bool)
    if n < 2 * half + 1:
        return bad
    win = np.lib.stride_tricks.sliding_window_view(ta, 2 * half + 1)
    others = np.delete(win, half, axis=1)
    second = np.sort(others, axis=1)[:, -2]
    bad[half : n - half] = win[:, half] > (1.0 + rel) * second
    return bad


@dataclass(frozen=True)
class Curve:
    """One measured curve: time (s) against one size, sorted by size, sizes unique and > 0."""

    x: FloatArray
    t: FloatArray

    @staticmethod
    def of(x: npt.ArrayLike, t: npt.ArrayLike, despike: float = 0.0) -> Curve:
        """The curve of rows (x, t); with ``despike`` > 0, isolated upward spikes (see
        :func:`upward_spikes`) are dropped first."""
        xa = np.asarray(x, dtype=np.float64)
        ta = np.asarray(t, dtype=np.float64)
        keep = (xa > 0) & np.isfinite(xa) & (ta > 0) & np.isfinite(ta)
        xa, ta = xa[keep], ta[keep]
        order = np.argsort(xa, kind="stable")
        xa, ta = xa[order], ta[order]
        # repeated sizes (repeated measurements): their median
        ux, start, counts = np.unique(xa, return_index=True, return_counts=True)
        tm = ta[start].copy()
        for i in np.flatnonzero(counts > 1):
            tm[i] = np.median(ta[start[i] : start[i] + counts[i]])
        if despike > 0.0:
            keep_pts = ~upward_spikes(tm, despike)
            ux, tm = ux[keep_pts], tm[keep_pts]
        return Curve(ux, tm)

    def __call__(self, q: FloatArray | float) -> FloatArray:
        return loglog(self.x, self.t, q)


def curve_family(
    curves: Mapping[tuple[float, ...], Curve], key: tuple[float, ...], q: FloatArray | float
) -> FloatArray:
    """Evaluate a family of curves indexed by shape keys at shape ``key`` and sizes ``q``.

    The keys are tuples of positive numbers (e.g. GEMM ``(n, k)``). The first coordinate is
    bracketed among the distinct first coordinates; for each, the next coordinate among the keys
    that share it; and so on — so a sparse, non-rectangular set of measured shapes works, and a
    key that is measured is read exactly. The interpolation in every coordinate is log-log with
    proportional extrapolation above the measured range (time ∝ n·k for a GEMM wider than any
    measured) and clamping below it.
    """
    qa = np.atleast_1d(np.asarray(q, dtype=np.float64))

    def rec(prefix: tuple[float, ...], keys: list[tuple[float, ...]]) -> FloatArray:
        depth = len(prefix)
        if depth == len(key):
            return np.log(curves[prefix](qa))
        coords = np.unique(np.array([k[depth] for k in keys], dtype=np.float64))
        i0, i1, w, lf = bracket(coords, np.array([float(key[depth])]))
        a, b, wt = float(coords[i0[0]]), float(coords[i1[0]]), float(w[0])
        out = rec((*prefix, a), [k for k in keys if k[depth] == a])
        if b != a and wt > 0.0:
            out = (1.0 - wt) * out + wt * rec((*prefix, b), [k for k in keys if k[depth] == b])
        return out + float(lf[0])

    return np.asarray(np.exp(rec((), list(curves))))


@dataclass(frozen=True)
class Grid2:
    """Times on a rectangular grid of two sizes (e.g. batch × context), for one kernel shape.

    ``t[i, j]`` is the time at ``a[i]``, ``b[j]``; every cell is filled (see :func:`grid2_from`).
    Evaluated by bilinear interpolation of log t in (log a, log b), with the module's
    extrapolation rules on each axis.
    """

    a: FloatArray
    b: FloatArray
    t: FloatArray

    def __call__(self, qa: FloatArray | float, qb: FloatArray | float) -> FloatArray:
        xa = np.atleast_1d(np.asarray(qa, dtype=np.float64))
        xb = np.atleast_1d(np.asarray(qb, dtype=np.float64))
        xa, xb = np.broadcast_arrays(xa, xb)
        lt = np.log(self.t)
        i0, i1, w, lfa = bracket(self.a, xa)
        j0, j1, v, lfb = bracket(self.b, xb)
        out = (1 - w) * (1 - v) * lt[i0, j0] + (1 - w) * v * lt[i0, j1] + w * (1 - v) * lt[i1, j0] + w * v * lt[i1, j1]
        return np.asarray(np.exp(out + lfa + lfb))


def grid2_from(a: npt.ArrayLike, b: npt.ArrayLike, t: npt.ArrayLike) -> Grid2 | None:
    """A :class:`Grid2` from scattered rows (a, b, t): the grid is every distinct a × b; a cell
    with no row is filled from its row's measured cells (log-log along b), and rows with fewer
    than one measured cell are dropped. None when nothing is left."""
    aa = np.asarray(a, dtype=np.float64)
    bb = np.asarray(b, dtype=np.float64)
    tt = np.asarray(t, dtype=np.float64)
    keep = (aa > 0) & (bb > 0) & (tt > 0) & np.isfinite(tt)
    aa, bb, tt = aa[keep], bb[keep], tt[keep]
    if aa.size == 0:
        return None
    ua, ub = np.unique(aa), np.unique(bb)
    rows: list[FloatArray] = []
    kept_a: list[float] = []
    for av in ua:
        sel = aa == av
        c = Curve.of(bb[sel], tt[sel])
        if c.x.size == 0:
            continue
        rows.append(c(ub))
        kept_a.append(float(av))
    if not rows:
        return None
    return Grid2(np.array(kept_a), ub, np.vstack(rows))
