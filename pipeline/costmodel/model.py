"""One pool's cost model: the one owner of "how long does this step take, and what bound it".

A :class:`CostModel` is built once per pool (``ResolvedFleet.cost_model``) from the catalog (the
deployment: model, GPU, parallelism, dtypes), the measured profile or the size-aware prior (the
tier the fleet's ``cost_model`` picks, :func:`pipeline.costmodel.profile.cost.fleet_step_cost`) and
the calibrations (``[calibration]`` roofline factors, a stack calibration learnt from logs). Every
consumer asks it, so all of them price with the same tier:

- the engine reads its tables as one value (:attr:`kernel_tables`), and the replay records its
  :attr:`source` per step (``cost_source``);
- the replay's estimate prices single steps with :meth:`step_s`;
- plan's analytic lower bound takes one replica's ceilings from :meth:`capacity`;
- ``calibrate --observed`` fits a stack calibration on top of its :attr:`table`.

``rooftrace validate`` judges the tiers themselves (the roofline on operator measurements, the
measured profiles held out by shape), so it builds deployments and tables of its own on purpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.costmodel.profile.cost import fleet_step_cost
from pipeline.costmodel.roofline import Deployment, decode_batch, prefill_batch
from pipeline.costmodel.stepcost import TabulatedCost
from pipeline.costmodel.steps import BINDING_NAMES, StepBatch, StepCost

#: Seconds a step is taken to last where the cost model cannot say (a non-finite or zero price):
#: the estimate's stand-in, never a replay's.
UNPRICED_STEP_S = 0.02


def tokens_per_s(tokens: float, seconds: float) -> float:
    """Tokens per second of a step of ``seconds``: 0 for a step that never ends (inf, NaN: a
    hardware entry with a vanishing bandwidth or FLOP/s), inf for one that takes no time."""
    if not seconds < math.inf:  # inf and NaN
        return 0.0
    return tokens / seconds if seconds > 0 else math.inf


def _label(code: int) -> str:
    name = BINDING_NAMES[code]
    return "bandwidth" if name == "memory" else name


@dataclass(frozen=True)
class CostModel:
    """A pool's step cost: its deployment and the tables built for it (see the module doc)."""

    deployment: Deployment
    table: TabulatedCost

    @classmethod
    def of(cls, fleet: Any) -> CostModel:
        """The cost model of a resolved fleet or pool (``pipeline.replay.fleet.ResolvedFleet``)."""
        return cls(fleet.deployment, fleet_step_cost(fleet))

    @property
    def source(self) -> str:
        """The tier that priced it: measured, prior or roofline."""
        return self.table.source

    @property
    def describe(self) -> dict[str, Any]:
        """Which tier costed what, for the run's record."""
        return self.table.describe

    @property
    def kernel_tables(self) -> tuple[np.ndarray[Any, Any], ...]:
        """The tables as the compiled engine takes them: one value, built once."""
        return self.table.kernel_tables

    def __call__(self, batch: StepBatch) -> StepCost:
        """Time and binding of each step of ``batch``."""
        return self.table(batch)

    def step_s(self, decode_seqs: float, ctx: float, prefill: float = 0.0) -> float:
        """Seconds of one step of ``decode_seqs`` decodes at context ``ctx`` plus one ``prefill``-token
        chunk (:data:`UNPRICED_STEP_S` where the tables cannot say)."""

        def one(x: float) -> np.ndarray[Any, np.dtype[np.float64]]:
            return np.array([float(x)])

        batch = StepBatch(
            one(prefill),
            one(1.0 if prefill else 0.0),
            one(prefill * (prefill + 1) / 2),
            one(prefill),
            one(decode_seqs),
            one(decode_seqs * ctx),
        )
        try:
            s = float(self(batch).time_s[0])
        except Exception:  # an estimate's price: a step the tables cannot price must not stop the run
            return UNPRICED_STEP_S
        return s if math.isfinite(s) and s > 0 else UNPRICED_STEP_S

    def capacity(self, scheduler: Any, mean_context: float) -> dict[str, Any]:
        """One replica's ceilings under ``scheduler`` (``SchedulerConfig``): fresh prefill tokens/s
        with full token-budget steps, and decode tokens/s at the largest batch its KV cache and
        ``max_num_seqs`` allow at ``mean_context``, each with what bound the step."""
        budget = float(scheduler.max_num_batched_tokens)
        pre = self(prefill_batch([budget]))
        kv_tokens = scheduler.num_gpu_blocks * scheduler.block_size
        batch = float(max(1, min(scheduler.max_num_seqs, int(kv_tokens // max(mean_context, 1.0)))))
        dec = self(decode_batch([batch], [mean_context]))
        return {
            "prefill_tokens_per_s": tokens_per_s(budget, float(pre.time_s[0])),
            "prefill_binding": _label(int(pre.binding[0])),
            "decode_tokens_per_s": tokens_per_s(batch, float(dec.time_s[0])),
            "decode_batch": batch,
            "decode_binding": _label(int(dec.binding[0])),
            "kv_capacity_tokens": kv_tokens,
        }
