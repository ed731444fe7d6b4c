"""The continuous-batching replay engine (DESIGN.md §3; semantics in docs/engine.md).

``fast.simulate`` is the production engine (spans of identical steps, cost grows with events);
``reference.simulate_reference`` is the per-step, per-token engine used only to check it.
"""
