"""The cost model: how long an engine step takes on a GPU, and what bound it.

The stage between the catalog (GPUs, models, dtypes) and the engine. ``steps`` is the contract
with the engine (a step's batch in, its time and binding out); ``roofline`` prices a step from
per-operator FLOPs and bytes; ``profile/`` builds and reads measured per-operator tables and
prices a step from them (``profile.cost.fleet_step_cost``: the tables of a fleet's tier);
``stackcal`` is a serving stack's calibration learnt from its logs; ``stepcost`` tabulates any
of them into the one form the engine's kernels read; ``fit`` says what fits in a GPU's memory
(weights, activations, the KV cache left over).

``model.CostModel`` owns all of it for one pool: built once from catalog + profile + calibration
(``ResolvedFleet.cost_model``), it answers "how long does this step take and what bound it" for
the engine (its tables, one value), the replay's estimate, plan's lower bound and ``calibrate
--observed``.

Public entry: :class:`CostModel`; the memory fit is ``fit.fit``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CostModel"]


def __getattr__(name: str) -> Any:
    # The engine imports this package's light modules (steps, stepcost) at the start of every
    # replay, before it compiles: the entry loads the profiles only when asked for.
    if name == "CostModel":
        from pipeline.costmodel.model import CostModel  # lazy: polars and the profiles, for the entry only

        return CostModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
