"""Attention time of an engine step from measured (batch × length) grids.

The engine describes a step's attention by sums (pipeline/costmodel/steps.py): prefill chunks (count,
tokens, causal query-key pairs, KV tokens read) and decodes (count, context tokens). The
measured tables are for uniform batches: prefill of ``batch`` prompts of ``isl`` tokens with no
cached prefix, and one decode step of ``batch`` sequences of ``ctx`` tokens. The rules that map
one onto the other (each judged against measured batches in docs/validation.md):

- **pure decode**: ``D(seqs, mean context)`` — a batch of unequal contexts costs about what a
  uniform batch at the mean costs (LLMServingSim's skew measurements put it within a few % of the
  mean for most batches).
- **prefill over a cached prefix**: a chunk of ``c`` queries at offset ``o`` does the work of
  ``pairs = c·o + c(c+1)/2`` query-key pairs; it costs what the prefill table says for the
  prompt length with the same number of causal pairs, ``c_eq = (√(8·pairs+1) − 1)/2``, at the
  same batch (LLMServingSim: within a few % for chunks ≥ 256 tokens); past the longest
  measured prompt it grows with the pairs (quadratic), not in proportion to the length.
  Chunks shorter than the kernel's query tile are padded to it (``tile``: below it a chunk costs
  what a tile-long chunk costs — measured flat on both RTX cards).
- **mixed steps**: prefill part + decode part. vLLM runs them in one varlen kernel; with
  FlashAttention-2 kernels (``tile > 0``) the decodes then lose the split-KV decode path and each
  costs at least what a tile-long chunk at its context costs: ``max(D(n, k), P(n, c_eq(tile, k)))``.
  With ``tile = 0`` (FA3 / FlashInfer profiles, no mixed measurement) the parts are summed as
  measured alone.
"""

from __future__ import annotations

import numpy as np

from pipeline.costmodel.profile.interp import FloatArray, Grid2


def equivalent_chunk(pairs: FloatArray) -> FloatArray:
    """Prompt length whose causal attention has ``pairs`` query-key pairs."""
    return np.asarray((np.sqrt(8.0 * np.asarray(pairs, dtype=np.float64) + 1.0) - 1.0) / 2.0)


def prefill_grid_time(grid: Grid2, seqs: FloatArray, chunk: FloatArray) -> FloatArray:
    """``grid`` at ``seqs`` prompts of ``chunk`` tokens; past the longest measured prompt the
    time grows with the causal pairs (quadratic), not in proportion to the length."""
    c = np.asarray(chunk, dtype=np.float64)
    top = float(grid.b[-1])
    inside = grid(seqs, np.minimum(c, top))
    return np.asarray(np.where(c > top, inside * (c * (c + 1.0)) / (top * (top + 1.0)), inside))


def decode_time(grid: Grid2, seqs: FloatArray, ctx_tokens: FloatArray) -> FloatArray:
    s = np.asarray(seqs, dtype=np.float64)
    c = np.asarray(ctx_tokens, dtype=np.float64)
    safe = np.where(s > 0, s, 1.0)
    t = grid(safe, np.maximum(c / safe, 1.0))
    return np.where(s > 0, t, 0.0)


def prefill_time(
    grid: Grid2,
    seqs: FloatArray,
    tokens: FloatArray,
    pairs: FloatArray,
    tile: float = 0.0,
) -> FloatArray:
    """Prefill part: ``seqs`` chunks of ``tokens`` in all with ``pairs`` causal pairs in all."""
    s = np.asarray(seqs, dtype=np.float64)
    safe = np.where(s > 0, s, 1.0)
    c = np.maximum(np.asarray(tokens, dtype=np.float64) / safe, 1.0)
    p = np.maximum(np.asarray(pairs, dtype=np.float64) / safe, 1.0)
    if tile > 0:
        # offset of the mean chunk, then the chunk padded to the tile at that offset
        o = np.maximum((p - c * (c + 1.0) / 2.0) / c, 0.0)
        cp = np.maximum(c, tile)
        p = cp * o + cp * (cp + 1.0) / 2.0
    t = prefill_grid_time(grid, safe, equivalent_chunk(p))
    return np.where(s > 0, t, 0.0)


def mixed_decode_time(
    decode: Grid2, prefill: Grid2, seqs: FloatArray, ctx_tokens: FloatArray, tile: float
) -> FloatArray:
    """Decode part of a step that also prefills (see module doc)."""
    d = decode_time(decode, seqs, ctx_tokens)
    if tile <= 0:
        return d
    s = np.asarray(seqs, dtype=np.float64)
    safe = np.where(s > 0, s, 1.0)
    k = np.maximum(np.asarray(ctx_tokens, dtype=np.float64) / safe, 1.0)
    as_chunk = prefill_grid_time(prefill, safe, equivalent_chunk(tile * k + tile * (tile + 1.0) / 2.0))
    return np.where(s > 0, np.maximum(d, as_chunk), 0.0)


def step_attention(
    decode: Grid2,
    prefill: Grid2,
    prefill_seqs: FloatArray,
    prefill_tokens: FloatArray,
    prefill_pairs: FloatArray,
    decode_seqs: FloatArray,
    decode_ctx_tokens: FloatArray,
    tile: float,
) -> FloatArray:
    """Attention seconds of steps with the given sums (one layer, one GPU)."""
    ps = np.asarray(prefill_seqs, dtype=np.float64)
    pre = prefill_time(prefill, ps, prefill_tokens, prefill_pairs, tile)
    mixed = mixed_decode_time(decode, prefill, decode_seqs, decode_ctx_tokens, tile)
    pure = decode_time(decode, decode_seqs, decode_ctx_tokens)
    return np.asarray(pre + np.where(ps > 0, mixed, pure))
