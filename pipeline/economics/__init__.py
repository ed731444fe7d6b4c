"""Economics: what a fleet costs, which tokens that money buys, and what an API would charge.

``cost`` prices a run's GPUs (per pool) over its period and attributes the money to tokens;
``energy`` works out what the GPUs drew (a power model per GPU over the run's step log).

Public entries: :func:`run_cost`, :func:`run_energy`.
"""

from pipeline.economics.cost import run_cost
from pipeline.economics.energy import run_energy

__all__ = ["run_cost", "run_energy"]
