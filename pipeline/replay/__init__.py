"""The replay stage: a day of requests through a fleet, written as a run to the store.

``fleet`` reads FLEET.toml (one homogeneous pool) and ``pools`` its ``[[pool]]`` form; ``run`` builds
each pool's workload, runs the engine and writes the run (``runrequests``: the per-request side,
written as it comes; ``runfolder``: the run's folder and config.json); ``limits`` estimates a
replay's memory and time before it starts; ``slo`` judges the result against latency targets;
``loadcurve`` replays the day at several loads (headroom).

Public entry: :func:`replay` (one day of the store on one fleet, with :class:`ReplayOptions`).
"""

from pipeline.replay.run import ReplayOptions, ReplayResult, replay

__all__ = ["ReplayOptions", "ReplayResult", "replay"]
