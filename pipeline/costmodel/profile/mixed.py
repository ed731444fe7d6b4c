"""Mixed-batch attention: how much a step with a prefill chunk costs relative to its parts.

The composition rules of pipeline/costmodel/profile/attention.py price a step's attention from pure
prefill and pure decode tables. LLMServingSim measured the real thing on RTX PRO 6000 and RTX
4090 (vLLM 0.19): one prefill chunk of ``chunk`` tokens over ``kv_prefill`` cached tokens beside
``n_decode`` decodes of ``kv_decode`` context each, on a full 4-D grid (×2 steps). Against the sum
of its parts measured on the same stack, a mixed batch costs 15–55 % more or less (median, by
model) — FlashAttention-2's varlen launch handles the two kinds together differently from either
alone — which no one-number rule captures.

So the measured grid is kept as a **ratio**: measured mixed time / (pure prefill at the same
causal pairs + pure decode at the same batch and context), both pure parts from the *same* set
(same vLLM, same eager timing). At run time the step's attention is the composition from the
GPU's main tables (summed, no query tile) times the ratio interpolated at the step's mean chunk,
mean cached offset, decode count and mean decode context: the mixed structure from the set that
measured it, the absolute level from the profile's pure tables, so a step never jumps between
two sets' levels when a small chunk joins a decode batch.

Axes (log space): chunk (16…2048), offset log(o + 16) (0…16384), decodes log(n + 1) (0…256),
decode context (16…16384; all equal when n = 0). Outside the grid the ratio is held at its edge
(a ratio, unlike a time, has no reason to grow). Grid cells the set did not measure are filled
before any query: the RTX PRO 6000 bundles interleave two grids (×2 from 16 and ×1.5 from 16 /
512), so about 63 % of the union's cells hold no measurement. A cell between two measured ones
along an axis takes their interpolation (linear in the axis' log coordinate, as queries are):
along chunk and offset first (repeated until nothing changes: there the two grids' points lie
1.1–1.5× apart at the same decode context), then along context, then decodes. Cells outside every
measured span (none in the current bundles) take the nearest measured cell along
context, then decodes, then offset, then chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from pipeline.costmodel.profile.attention import step_attention
from pipeline.costmodel.profile.interp import FloatArray
from pipeline.costmodel.stepcost import _mixed_ratio, flat_ratio_grid

OFFSET_SHIFT = 16.0
MIN_CTX = 16.0


def _la(c: Any) -> Any:
    return np.log(np.maximum(np.asarray(c, dtype=np.float64), 1.0))


def _lo(o: Any) -> Any:
    return np.log(np.maximum(np.asarray(o, dtype=np.float64), 0.0) + OFFSET_SHIFT)


def _ln(n: Any) -> Any:
    return np.log(np.maximum(np.asarray(n, dtype=np.float64), 0.0) + 1.0)


def _lk(k: Any) -> Any:
    return np.log(np.maximum(np.asarray(k, dtype=np.float64), MIN_CTX))


@dataclass(frozen=True)
class RatioGrid:
    """log(mixed / composed) on log axes (chunk, offset, decodes, context)."""

    la: FloatArray
    lb: FloatArray
    lc: FloatArray
    ld: FloatArray
    lt: FloatArray  # shape (len(la), len(lb), len(lc), len(ld))

    def __call__(self, chunk: Any, offset: Any, decodes: Any, ctx: Any) -> FloatArray:
        """The ratio at the given points (vectorised): pipeline.costmodel.stepcost._mixed_ratio, the
        kernel's own interpolation, on this grid's flat form."""
        mx = flat_ratio_grid(self)
        c, o, n, k = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (chunk, offset, decodes, ctx)))
        out = np.empty(c.shape)
        for idx in np.ndindex(c.shape):
            out[idx] = _mixed_ratio(mx, float(c[idx]), float(o[idx]), float(n[idx]), float(k[idx]))
        return out

    def arrays(self) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
        return self.la, self.lb, self.lc, self.ld, self.lt


def composed_attention(
    prof: Any, rows: pl.DataFrame, tile: float = 0.0, every_row_prefills: bool = False
) -> FloatArray | None:
    """The composition rule's time for mixed-batch rows of one head shape (``nq``, ``nkv``, ``d``
    of the first row): the pure decode and prefill grids of ``prof`` summed per step
    (pipeline/costmodel/profile/attention.py ``step_attention``); None when ``prof`` lacks either grid.
    A row prefills when its chunk is > 0, or always with ``every_row_prefills``."""
    row = rows.row(0, named=True)
    shape = (int(row["nq"]), int(row["nkv"]), int(row["d"]))
    gd = prof.attention_grid("attn_decode", "bf16", *shape)
    gp = prof.attention_grid("attn_prefill", "bf16", *shape)
    if gd is None or gp is None:
        return None
    c = rows["chunk"].to_numpy().astype(np.float64)
    o = rows["kv_prefill"].to_numpy().astype(np.float64)
    nd = rows["n_decode"].to_numpy().astype(np.float64)
    kd = rows["kv_decode"].to_numpy().astype(np.float64)
    ps = np.ones_like(c) if every_row_prefills else (c > 0).astype(np.float64)
    return step_attention(gd, gp, ps, c, c * o + c * (c + 1) / 2, nd, nd * kd, tile)


def ratio_grid(rows: pl.DataFrame) -> RatioGrid | None:
    """The grid of mean log ratios over ``rows`` (the output of pipeline/costmodel/profile/select.py's
    mixed_ratio_rows; several models or TP shards average in log space), holes filled between
    measured cells, then from the nearest (the module's docstring)."""
    if rows.height == 0:
        return None
    f = rows.with_columns(pl.when(pl.col("n_decode") == 0).then(0).otherwise(pl.col("kv_decode")).alias("kv_decode"))
    chunks = np.array(sorted(f["chunk"].unique().to_list()), dtype=np.float64)
    offs = np.array(sorted(f["kv_prefill"].unique().to_list()), dtype=np.float64)
    decs = np.array(sorted(f["n_decode"].unique().to_list()), dtype=np.float64)
    ctxs = np.array(sorted(v for v in f["kv_decode"].unique().to_list() if v > 0), dtype=np.float64)
    if ctxs.size == 0:
        ctxs = np.array([MIN_CTX])
    g = (
        f.with_columns(lr=pl.col("ratio").log())
        .group_by(["chunk", "kv_prefill", "n_decode", "kv_decode"])
        .agg(pl.col("lr").mean())
    )
    t = np.full((chunks.size, offs.size, decs.size, ctxs.size), np.nan)
    ia = {v: i for i, v in enumerate(chunks)}
    ib = {v: i for i, v in enumerate(offs)}
    ic = {v: i for i, v in enumerate(decs)}
    idd = {v: i for i, v in enumerate(ctxs)}
    for c, o, n, k, lr in g.iter_rows():
        if not np.isfinite(lr):
            continue
        if n == 0:  # no decodes: the context axis does not apply
            t[ia[float(c)], ib[float(o)], ic[0.0], :] = lr
        elif float(k) in idd:
            t[ia[float(c)], ib[float(o)], ic[float(n)], idd[float(k)]] = lr
    axes = (_la(chunks), _lo(offs), _ln(decs), _lk(ctxs))
    for stage in ((0, 1), (3,), (2,)):
        while True:
            holes = int(np.isnan(t).sum())
            for axis in stage:
                t = _fill_between(t, axes[axis], axis)
            if int(np.isnan(t).sum()) == holes:
                break
    for axis in (3, 2, 1, 0):
        t = _fill_nearest(t, axis)
    if np.isnan(t).any():
        t = np.where(np.isnan(t), 0.0, t)  # nothing measured in a whole slab: ratio 1
    return RatioGrid(*axes, t)


def _fill_between(t: FloatArray, coord: FloatArray, axis: int) -> FloatArray:
    """NaN cells with non-NaN cells on both sides along ``axis`` take the linear interpolation
    between the nearest two in ``coord`` (the axis' log coordinate); other NaN cells stay NaN.
    Vectorised: each cell's nearest measured index before and after it along the axis, by a
    running max / min."""
    moved = np.moveaxis(t, axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    n = flat.shape[1]
    ok = ~np.isnan(flat)
    idx = np.arange(n)
    prev = np.maximum.accumulate(np.where(ok, idx, -1), axis=1)
    nxt = np.minimum.accumulate(np.where(ok, idx, n)[:, ::-1], axis=1)[:, ::-1]
    r, c = np.nonzero(~ok & (prev >= 0) & (nxt < n))
    p, q = prev[r, c], nxt[r, c]
    w = (coord[c] - coord[p]) / (coord[q] - coord[p])
    out = flat.copy()
    out[r, c] = flat[r, p] + w * (flat[r, q] - flat[r, p])
    return np.moveaxis(out.reshape(moved.shape), -1, axis)


def _fill_nearest(t: FloatArray, axis: int) -> FloatArray:
    """NaN cells take the value of the nearest non-NaN cell along ``axis`` (ties: the lower)."""
    moved = np.moveaxis(t, axis, -1).copy()
    flat = moved.reshape(-1, moved.shape[-1])
    idx = np.arange(flat.shape[1])
    for row in flat:
        ok = ~np.isnan(row)
        if ok.all() or not ok.any():
            continue
        good = idx[ok]
        nearest = good[np.abs(idx[:, None] - good[None, :]).argmin(axis=1)]
        row[:] = row[nearest]
    return np.moveaxis(flat.reshape(moved.shape), -1, axis)
