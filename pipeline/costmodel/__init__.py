"""The cost model: how long an engine step takes on a GPU, and what bound it.

The stage between the catalog (GPUs, models, dtypes) and the engine. ``steps`` is the contract
with the engine (a step's batch in, its time and binding out); ``roofline`` prices a step from
per-operator FLOPs and bytes; ``profile/`` builds and reads measured per-operator tables and
prices a step from them (``profile.cost.fleet_step_cost``: the step cost of a fleet, from
catalog + profile + calibration); ``stackcal`` is a serving stack's calibration learnt from its
logs; ``stepcost`` tabulates any of them into the one form the engine's kernels read; ``fit``
says what fits in a GPU's memory (weights, activations, the KV cache left over).

Public entry: :func:`fleet_step_cost` (a fleet's step cost); the memory fit is ``fit.fit``.
"""

from pipeline.costmodel.profile.cost import fleet_step_cost

__all__ = ["fleet_step_cost"]
