"""The continuous-batching replay engine (docs/architecture.md; semantics in docs/engine.md).

One production engine and one oracle:

- ``jit.simulate_jit`` (the loop compiled by numba in ``_jit_kernels.py``) runs every replay:
  the replay stage, its pods (``shard``), plan, fit, validate, calibrate and loadcurve.
- ``reference.simulate_reference`` is the per-step, per-token engine written for obviousness;
  tests hold the compiled engine equal to it on every request's results (hypothesis-generated
  traces and fleets, trace slices). It runs nowhere else.

A new engine feature is written in both, ``_jit_kernels.py`` (with ``jit.py`` for its arguments)
and ``reference.py``, and comes with a test that they agree (tests/test_engine.py's generated
cases, or a strategy of its own there or in tests/test_lockstep.py).

Public entry: :func:`simulate_jit`.
"""

from pipeline.engine.jit import simulate_jit

__all__ = ["simulate_jit"]
