"""Economics: what a fleet costs, which tokens that money buys, and what an API would charge.

``cost`` prices a run's GPUs (per pool) over its period and attributes the money to tokens.

Public entry: :func:`run_cost`.
"""

from pipeline.economics.cost import run_cost

__all__ = ["run_cost"]
