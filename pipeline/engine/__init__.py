"""The continuous-batching replay engine (docs/architecture.md; semantics in docs/engine.md).

``fast.simulate`` is the production engine (spans of identical steps, cost grows with events);
``reference.simulate_reference`` is the per-step, per-token engine used only to check it.
"""
