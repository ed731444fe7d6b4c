"""The contract between the batching engine and the roofline cost model.

The engine describes arrays of engine steps by their aggregate shape (:class:`StepBatch`); the
cost model turns them into per-step times and attributions (:class:`StepCost`). Both are columnar
(one numpy element per step), so a span of steps with a constant batch composition is costed in
one vectorised call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: The six fields of a StepBatch that describe a step (the ``*_window`` sums aside), in the order
#: the tabulated step cost (pipeline/costmodel/stepcost.py) takes them.
STEP_FIELDS: tuple[str, ...] = (
    "prefill_tokens",
    "prefill_seqs",
    "prefill_attn_pairs",
    "prefill_kv_tokens",
    "decode_seqs",
    "decode_ctx_tokens",
)

#: Codes used in StepCost.binding and in the replay ``steps`` table.
BINDING_NAMES: tuple[str, ...] = ("compute", "memory", "communication", "overhead")


@dataclass(frozen=True)
class StepBatch:
    """Aggregate shape of N engine steps (every field has shape (N,), dtype float64).

    prefill_tokens       query tokens prefilled this step, over all prefill chunks
    prefill_seqs         number of sequences with a prefill chunk this step
    prefill_attn_pairs   causal query-key pairs of the prefill chunks:
                         Σ_chunks c·o + c·(c+1)/2 for a chunk of c tokens at context offset o
    prefill_kv_tokens    KV tokens read by prefill attention: Σ_chunks (o + c)
    decode_seqs          sequences taking one decode token this step
    decode_ctx_tokens    KV tokens read by decode attention: Σ_decodes context length
                         (tokens already in the KV cache, including the new one)

    The ``*_window`` fields are the same sums for sliding-window attention layers (keys limited to
    the last W positions). ``None`` means "equal to the full-attention value" (no window, or a
    window longer than every context).
    """

    prefill_tokens: FloatArray
    prefill_seqs: FloatArray
    prefill_attn_pairs: FloatArray
    prefill_kv_tokens: FloatArray
    decode_seqs: FloatArray
    decode_ctx_tokens: FloatArray
    prefill_attn_pairs_window: FloatArray | None = None
    prefill_kv_tokens_window: FloatArray | None = None
    decode_ctx_tokens_window: FloatArray | None = None

    @property
    def n(self) -> int:
        return int(self.prefill_tokens.shape[0])


@dataclass(frozen=True)
class StepCost:
    """Per-step cost of a StepBatch (every field has shape (N,)).

    time_s = compute-bound op time + memory-bound op time + comm_s + overhead_s, where each
    operator contributes max(flops / (peak·eff), bytes / (bw·eff)) to the side that binds it.
    binding is an index into BINDING_NAMES: the largest of compute_s, memory_s, comm_s, overhead_s.
    mfu and mbu are achieved FLOP/s and bytes/s over the *datasheet* peaks (per GPU).
    """

    time_s: FloatArray
    flops: FloatArray
    bytes: FloatArray
    compute_s: FloatArray
    memory_s: FloatArray
    comm_s: FloatArray
    overhead_s: FloatArray
    binding: npt.NDArray[np.int8]
    mfu: FloatArray
    mbu: FloatArray
    #: Seconds of each step that came from measured tables (None: a cost model without them).
    measured_s: FloatArray | None = None


class StepCostFn(Protocol):
    """Anything that costs steps: the roofline model, or a simple stand-in in engine tests."""

    def __call__(self, batch: StepBatch) -> StepCost: ...
