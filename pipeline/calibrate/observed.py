"""Latencies the real fleet delivered, as its logs carry them.

Ingest keeps two observed latencies per request when a log has them (docs/ingest.md):
``ttft_s`` (first token − arrival) and ``e2e_s`` (last token − arrival); rows where they are
impossible (negative, TTFT > E2E) are quarantined there. From them this module derives the
observed TPOT with the replay's own definition (:func:`pipeline.replay.slo.request_latencies`):
``(e2e − ttft) / (output tokens − 1)`` for outputs of two tokens or more. ``calibrate
--observed`` fits on these, and the nightly compares them with the replay.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.replay.slo import percentile

#: The metrics compared between a replay and the logs, in this order everywhere.
METRICS = ("ttft", "tpot", "e2e")


def observed_latencies(requests: pl.DataFrame) -> dict[str, npt.NDArray[np.float64]]:
    """Per request, the observed ``ttft``, ``tpot`` and ``e2e`` in seconds (NaN where the log
    has none, and ``tpot`` NaN for one-token outputs), in the frame's row order."""
    n = requests.height

    def col(name: str) -> npt.NDArray[np.float64]:
        if name not in requests.columns:
            return np.full(n, np.nan)
        return requests.get_column(name).cast(pl.Float64).fill_null(np.nan).to_numpy().astype(np.float64)

    ttft = col("ttft_s")
    e2e = col("e2e_s")
    out = col("output_tokens")
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / (out - 1), np.nan)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def observed_count(requests: pl.DataFrame) -> int:
    """How many requests carry an observed TTFT or E2E."""
    lat = observed_latencies(requests)
    return int(np.count_nonzero(np.isfinite(lat["ttft"]) | np.isfinite(lat["e2e"])))


def percentile_pair(
    observed: npt.NDArray[np.float64], replayed: npt.NDArray[np.float64], pct: float
) -> tuple[float | None, float | None, float | None]:
    """The observed and replayed ``pct``-th percentiles (the project's one definition,
    :func:`pipeline.replay.slo.percentile`) of paired values, and the error replayed / observed − 1;
    None for what cannot be formed (no values, or an observed percentile of 0)."""
    if observed.size == 0:
        return None, None, None
    o, r = percentile(observed, pct), percentile(replayed, pct)
    return o, r, (r / o - 1.0 if o > 0 else None)
