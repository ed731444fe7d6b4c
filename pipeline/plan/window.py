"""The window ``plan`` sizes for: the busiest ``window_s`` seconds by token volume after a
warm-up, or the whole day."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.classify.prefix import DEFAULT_ISOLATION, PrefixIdentity
from pipeline.common.defaults import DEFAULT_WARMUP_S, DEFAULT_WINDOW_S
from pipeline.common.errors import ConfigError, RooftraceError


@dataclass(frozen=True)
class Window:
    """Requests to replay (warm-up included) and which of them are measured."""

    kind: str
    requests: pl.DataFrame
    measured: npt.NDArray[np.bool_]
    start_s: float  # seconds since the day's first arrival
    duration_s: float
    warmup_s: float
    #: The day's prefix identity (classify's, stored): every replay of the window cuts its
    #: chains from it, as the day's replay does; None builds one from the window's requests.
    identity: PrefixIdentity | None = field(default=None, compare=False, repr=False)

    @property
    def isolation(self) -> tuple[str, ...]:
        return self.identity.isolation if self.identity is not None else DEFAULT_ISOLATION

    def info(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "start_s": self.start_s,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "replayed_requests": self.requests.height,
            "measured_requests": int(self.measured.sum()),
        }


def select_window(
    requests: pl.DataFrame, kind: str, window_s: float = DEFAULT_WINDOW_S, warmup_s: float = DEFAULT_WARMUP_S
) -> Window:
    """``day``: every request. ``peak``: the ``window_s`` seconds whose arrivals carry the most
    tokens (recorded input + output: the load the fleet must absorb), plus ``warmup_s`` before it."""
    if requests.height == 0:
        raise RooftraceError("no requests to plan for")
    req = requests.sort(["arrival", "request_id"])
    t_us = req.get_column("arrival").dt.epoch("us").to_numpy().astype(np.int64)
    t = (t_us - t_us[0]).astype(np.float64) / 1e6
    if kind == "day":
        span = max(float(t[-1]), 1.0)
        return Window("day", req, np.ones(req.height, bool), 0.0, span, 0.0)
    if kind != "peak":
        raise ConfigError(f"--window must be peak or day, got {kind!r}")
    if not (math.isfinite(window_s) and window_s > 0):
        raise ConfigError(f"--window-s must be a finite number of seconds > 0, got {window_s!r}")
    if not (math.isfinite(warmup_s) and warmup_s >= 0):
        raise ConfigError(f"--warmup-s must be a finite number of seconds >= 0, got {warmup_s!r}")
    tokens = (
        req.get_column("recorded_input_tokens").cast(pl.Float64).fill_null(0).to_numpy()
        + req.get_column("output_tokens").cast(pl.Float64).fill_null(0).to_numpy()
    )
    cum = np.concatenate([[0.0], np.cumsum(tokens)])
    end = np.searchsorted(t, t + window_s, side="left")
    load = cum[end] - cum[np.arange(t.shape[0])]
    i = int(np.argmax(load))
    start = float(t[i])
    keep = (t >= start - warmup_s) & (t < start + window_s)
    sub = req.filter(pl.Series(keep))
    measured = t[keep] >= start
    return Window("peak", sub, measured, start, window_s, min(warmup_s, start))
