"""A synthetic diurnal day for the autoscaled replay: tests/test_autoscale.py asserts on it and
benchmarks/autoscale_day.py prints its figures (one definition, so the two describe the same day)."""

from __future__ import annotations

import math

import numpy as np

from pipeline.engine.model import EngineResult, Workload


def diurnal(seed: int = 7) -> Workload:
    """90 minutes shaped like a day: a quiet night at 1 request/s, a 15-minute morning ramp to 20
    requests/s, a plateau, an evening ramp down (thinned Poisson arrivals, long prompts)."""
    rng = np.random.default_rng(seed)
    night, peak = 1.0, 20.0

    def rate(t: float) -> float:
        if t < 1200:
            return night
        if t < 2100:
            return night + (peak - night) * (t - 1200) / 900
        if t < 3900:
            return peak
        if t < 4500:
            return peak - (peak - night) * (t - 3900) / 600
        return night

    candidates = np.cumsum(rng.exponential(1 / peak, int(5400 * peak * 1.2)))
    candidates = candidates[candidates < 5400]
    keep = rng.random(candidates.shape[0]) < np.array([rate(t) for t in candidates]) / peak
    arrival = candidates[keep]
    n = arrival.shape[0]
    return Workload(
        arrival_s=arrival,
        prompt_tokens=rng.integers(2000, 4000, n).astype(np.int64),
        output_tokens=rng.integers(300, 700, n).astype(np.int64),
    )


def ttft_p99(res: EngineResult, lo: float = 0.0, hi: float = math.inf) -> float:
    m = (res.arrival_s >= lo) & (res.arrival_s < hi)
    ttft = np.where(np.isfinite(res.first_token_s[m]), res.first_token_s[m] - res.arrival_s[m], np.inf)
    return float(np.quantile(ttft, 0.99, method="inverted_cdf"))
