"""Shared helpers for the engine tests: a deterministic stand-in cost model and trace builders.

The stand-in is independent of the roofline model on purpose: the engine tests check scheduling,
not hardware numbers. Its step time is affine in the StepBatch fields, so hand calculations are
easy: time = a + b·prefill_tokens + c·prefill_attn_pairs + d·decode_seqs + e·decode_ctx_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.engine.model import Workload
from pipeline.steps import StepBatch, StepCost


@dataclass(frozen=True)
class LinearCost:
    a: float = 0.005
    b: float = 2e-5
    c: float = 1e-9
    d: float = 1e-4
    e: float = 1e-7

    @property
    def kernel_args(self) -> tuple[Any, ...]:
        """This cost as roofline._affine_rows' fixed arguments (what the jit engine evaluates): a
        compute-only operator b·prefill_tokens + c·prefill_attn_pairs and a memory-only one
        d·decode_seqs + e·decode_ctx_tokens at unit rates, no kernel floor, overhead a."""
        fc = np.zeros((2, 7))
        bc = np.zeros((2, 7))
        fc[0, 1], fc[0, 3] = self.b, self.c  # columns: intercept, then the six StepBatch fields
        bc[1, 5], bc[1, 6] = self.d, self.e
        one = np.ones(2)
        return (
            fc,
            bc,
            np.zeros(2, np.bool_),  # no collectives
            one,  # count
            one,  # peak FLOP/s
            np.array([True, False]),  # only operator 0 is compute-timed
            one,  # bandwidth
            np.zeros(2),  # collective calls
            1.0,  # link bandwidth
            0.0,  # link latency
            0.0,  # kernel floor
            self.a,  # per-step overhead
            1.0,  # pipeline stages
            1.0,  # peak FLOP/s per GPU (mfu)
            1.0,  # bandwidth per GPU (mbu)
        )

    def __call__(self, batch: StepBatch) -> StepCost:
        compute = self.b * batch.prefill_tokens + self.c * batch.prefill_attn_pairs
        memory = self.d * batch.decode_seqs + self.e * batch.decode_ctx_tokens
        overhead = np.full(batch.n, self.a)
        comm = np.zeros(batch.n)
        # Summed in roofline._affine_rows' order so the jit engine (kernel_args) is bit-identical.
        time = compute + memory + comm + overhead
        parts = np.stack([compute, memory, comm, overhead])
        return StepCost(
            time_s=time,
            flops=2.0 * batch.prefill_tokens + 2.0 * batch.decode_seqs,
            bytes=batch.decode_ctx_tokens + batch.prefill_kv_tokens,
            compute_s=compute,
            memory_s=memory,
            comm_s=comm,
            overhead_s=overhead,
            binding=np.argmax(parts, axis=0).astype(np.int8),
            mfu=np.zeros(batch.n),
            mbu=np.zeros(batch.n),
        )


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
