"""Shared helpers for the engine tests: a deterministic stand-in cost model and trace builders.

The stand-in is independent of the roofline model on purpose: the engine tests check scheduling,
not hardware numbers. Its step time is affine in the StepBatch fields, so hand calculations are
easy: time = a + b·prefill_tokens + c·prefill_attn_pairs + d·decode_seqs + e·decode_ctx_tokens.
It is built as a tabulated step cost (pipeline/costmodel/stepcost.py) so every engine runs it.
"""

from __future__ import annotations

import numpy as np

from pipeline.costmodel.stepcost import TabulatedCost, affine_cost, scalars
from pipeline.engine.model import Workload


def LinearCost(
    a: float = 0.005,
    b: float = 2e-5,
    c: float = 1e-9,
    d: float = 1e-4,
    e: float = 1e-7,
) -> TabulatedCost:
    """time = a + b·prefill_tokens + c·prefill_attn_pairs + d·decode_seqs + e·decode_ctx_tokens,
    as a tabulated cost (what every engine evaluates): a compute-only operator
    b·prefill_tokens + c·prefill_attn_pairs and a memory-only one d·decode_seqs +
    e·decode_ctx_tokens at unit rates, no kernel floor, per-step overhead a."""
    fc = np.zeros((2, 7))
    bc = np.zeros((2, 7))
    fc[0, 1], fc[0, 3] = b, c  # columns: intercept, then the six StepBatch fields
    bc[1, 5], bc[1, 6] = d, e
    one = np.ones(2)
    return affine_cost(fc, bc, one, one, np.array([True, False]), one, scalars(base_s=a))


def workload(
    arrival: list[float] | np.ndarray,
    prompt: list[int] | np.ndarray,
    output: list[int] | np.ndarray,
    chains: list[list[int]] | None = None,
    affinity: list[int] | None = None,
) -> Workload:
    n = len(arrival)
    offsets = None
    hashes = np.zeros(0, np.uint64)
    if chains is not None:
        offsets = np.zeros(n + 1, np.int64)
        offsets[1:] = np.cumsum([len(c) for c in chains])
        hashes = np.array([h for c in chains for h in c], np.uint64)
    return Workload(
        arrival_s=np.asarray(arrival, np.float64),
        prompt_tokens=np.asarray(prompt, np.int64),
        output_tokens=np.asarray(output, np.int64),
        chain_hashes=hashes,
        chain_offsets=offsets,
        affinity=None if affinity is None else np.asarray(affinity, np.int64),
    )
