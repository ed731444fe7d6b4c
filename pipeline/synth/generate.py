"""The workload model behind ``rooftrace synth`` (vectorised numpy; seeded, reproducible).

* **Sessions.** Each session belongs to a tenant and a model and is a single-shot request, a chat
  or an agent loop. Turn k re-sends turn k−1's prompt and answer plus new text (a user message,
  or a tool result for agents), so prompts grow turn by turn; every prompt starts with its
  tenant's system prompt, shared across that tenant's sessions.
* **Arrivals.** Session starts form a Gamma renewal process with the inter-arrival CV measured in
  Alibaba ServeGen, time-rescaled by its hour-of-day rate profile (``profile.toml``). Later turns
  follow the previous turn's answer after a think time (chat) or a tool-call wait (agents).
* **Lengths.** Log-normal (heavy right tail), clipped to the context window.
* **Reported cache hits**, following the providers' documented rules: a prompt of at least 1,024
  tokens hits the cached prefix it shares with a request of the same tenant seen within the cache
  TTL, counted in 128-token increments (OpenAI prompt caching guide); Anthropic additionally
  reports the tokens written to the cache (``cache_creation_input_tokens``).

The generated frame keeps the ground truth (``shared_prefix_tokens``, ``turn``) beside the
logged fields, so tests can check prefix reconstruction against it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from datetime import date as _date
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.common import defaults, system
from pipeline.common.budget import ResourceLimitError, current_limits
from pipeline.common.defaults import MAX_MEMORY_ENV
from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.common.units import format_bytes
from pipeline.ingest.timeparse import PLAUSIBLE_ARRIVAL, anchor_us

_PROFILE = Path(__file__).with_name("profile.toml")

#: Provider prompt-cache rules (OpenAI "Prompt caching" guide: prompts of 1,024 tokens or more,
#: hits in 128-token increments; Anthropic: 1,024-token minimum cacheable prompt for most models,
#: 5-minute default TTL).
CACHE_MIN_TOKENS = 1024
CACHE_INCREMENT = 128
CACHE_TTL_S = 300.0

#: Session kinds: (share of sessions, mean turns, median new-text tokens per later turn,
#: median gap between a turn's answer and the next turn in seconds, median output tokens).
#: Chosen, not measured: chat turns wait for a human (tens of seconds); agent turns wait for a
#: tool call (seconds) and resend a tool result. First-turn lengths resemble the Azure 2023
#: conversation trace (input median 1,020, output median 129 tokens;
#: Azure/AzurePublicDataset, AzureLLMInferenceTrace_conv).
KINDS: dict[str, tuple[float, float, float, float, float]] = {
    "single": (0.35, 1.0, 0.0, 0.0, 150.0),
    "chat": (0.45, 4.0, 120.0, 25.0, 180.0),
    "agent": (0.20, 12.0, 600.0, 2.0, 90.0),
}
LENGTH_SIGMA = 1.0  # log-normal sigma of every length: a heavy right tail
FIRST_USER_MEDIAN = 700.0
DECODE_TOKENS_PER_S = 60.0  # assumed server speed, only to space a session's turns in time
MAX_CONTEXT = 131_072


#: Bounds of a SynthConfig (pipeline/common/defaults.py, shared with ``rooftrace synth``).
MAX_REQUESTS, MAX_TENANTS, MAX_SEED = defaults.SYNTH_MAX_REQUESTS, defaults.SYNTH_MAX_TENANTS, defaults.SYNTH_MAX_SEED
MAX_DURATION_S = defaults.SYNTH_MAX_DURATION_S
MIN_CV, MAX_CV = defaults.SYNTH_MIN_CV, defaults.SYNTH_MAX_CV
#: The first microsecond past the arrivals ingest accepts (2100-01-01 UTC, PLAUSIBLE_ARRIVAL).
_ARRIVAL_END_US = 4_102_444_800 * 1_000_000

#: Memory of ``synth`` beyond the process's size before it starts: per request (the generated
#: frame and the arrays it is built from; the writers stream the text a piece at a time,
#: writers.PIECE_CHARS / ROWS_PER_PIECE), and the pieces themselves. Measured with
#: ``/usr/bin/time -v rooftrace synth --requests N --format F --out x.gz`` (peak RSS, every
#: format) over a 135 MiB start: 2·10^5 requests 259-330 MiB (jsonl the most, its 131,072-row
#: pieces), 10^6 requests 750-770 MiB, 3·10^6 requests 1.88-1.90 GiB: about 640-665 B a
#: request plus up to ~60 MiB of pieces. Before the writers streamed, the whole text was held
#: too (up to 1.95 KiB a request, otel).
REQUEST_BYTES = 768
PIECE_BYTES = 96 * 1024**2


def estimate_bytes(requests: int) -> int:
    """Peak memory of generating and writing ``requests`` requests, with the process's size now."""
    return system.process_rss() + PIECE_BYTES + int(requests) * REQUEST_BYTES


def check_memory(requests: int) -> None:
    """Refuse (ResourceLimitError, one line) a log estimated to need more memory than the limit
    (``--max-memory``, ``$ROOFTRACE_MAX_MEMORY``, else half the physical memory), or than the
    process's address-space limit (``ulimit -v``) leaves, before any of it is built: past either,
    polars or numpy aborts the process when an allocation fails."""
    limits = current_limits()
    need = estimate_bytes(requests)
    space = system.address_space_limit()
    if space is not None and system.virtual_size() + need - system.process_rss() > space:
        # mapped beyond the resident size already, the log's memory would pass ``ulimit -v``
        fits = (space - system.virtual_size() - PIECE_BYTES) // REQUEST_BYTES
        fewer = f"write at most about {fits:,} requests per log (--requests), or " if fits >= 1 else ""
        raise ResourceLimitError(
            f"synth: {int(requests):,} requests would need about {format_bytes(need)} of memory, more than this "
            f"process's address-space limit (ulimit -v, {format_bytes(space)}) leaves: {fewer}raise that limit"
        )
    if limits.max_memory is not None and need > limits.max_memory:
        fits = (limits.max_memory - estimate_bytes(0)) // REQUEST_BYTES
        fewer = f"write at most about {fits:,} requests per log (--requests), or " if fits >= 1 else ""
        raise ResourceLimitError(
            f"synth: {int(requests):,} requests would need about {format_bytes(need)} of memory, more than the "
            f"limit of {format_bytes(limits.max_memory)} ({limits.memory_origin}): {fewer}raise the limit with "
            f"--max-memory SIZE (${MAX_MEMORY_ENV})"
        )


def _bad_number(value: object, low: float, high: float, *, low_open: bool = False) -> bool:
    """True unless ``value`` is a finite real number in [low, high] (or (low, high])."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return True
    try:
        x = float(value)
    except OverflowError:  # an int past float's range
        return True
    return not math.isfinite(x) or x < low or x > high or (low_open and x == low)


def _shown(value: object) -> str:
    """``repr(value)`` cut to 40 characters (an int past 4,300 digits has no repr at all)."""
    try:
        text = repr(value)
    except ValueError:
        return "a number too long to show"
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class SynthConfig:
    requests: int = 10_000
    seed: int = 0
    date: str = "2025-01-15"
    duration_s: float = 86_400.0
    tenants: int = 4
    models: tuple[str, ...] = ("llama-3.1-70b", "llama-3.1-8b")
    cv: float | None = None  # None: the ServeGen median
    diurnal: bool = True
    cache_ttl_s: float = CACHE_TTL_S

    def __post_init__(self) -> None:
        for key, high in (("requests", MAX_REQUESTS), ("tenants", MAX_TENANTS), ("seed", MAX_SEED)):
            value, low = getattr(self, key), 0 if key == "seed" else 1
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not low <= int(value) <= high:
                raise ConfigError(f"synth: {key} must be an integer in {low:,}..{high:,}, got {_shown(value)}")
        if not self.models:
            raise ConfigError("synth: need at least one model")
        try:
            _date.fromisoformat(self.date)
        except (TypeError, ValueError):
            raise ConfigError(f"synth: date must be YYYY-MM-DD, got {_shown(self.date)}") from None
        if _bad_number(self.duration_s, 0.0, MAX_DURATION_S, low_open=True):
            raise ConfigError(
                f"synth: duration_s must be a finite number of seconds in (0, {MAX_DURATION_S:,.0f}] "
                f"(366 days), got {_shown(self.duration_s)}"
            )
        from datetime import UTC, datetime, timedelta

        start = datetime.combine(_date.fromisoformat(self.date), datetime.min.time(), UTC)
        lo, hi = PLAUSIBLE_ARRIVAL
        if not lo <= start < hi or start + timedelta(seconds=float(self.duration_s)) >= hi:
            raise ConfigError(
                f"synth: the arrivals must fall in {lo:%Y-%m-%d} .. {hi:%Y-%m-%d} UTC, the range ingest accepts "
                f"(docs/limits.md); date {self.date} with {float(self.duration_s) / 3600:,.6g} hours does not"
            )
        if self.cv is not None and _bad_number(self.cv, MIN_CV, MAX_CV):
            raise ConfigError(f"synth: cv must be a finite number in {MIN_CV:g}..{MAX_CV:g}, got {_shown(self.cv)}")
        if _bad_number(self.cache_ttl_s, 0.0, math.inf):
            raise ConfigError(
                f"synth: cache_ttl_s must be a finite number of seconds >= 0, got {_shown(self.cache_ttl_s)}"
            )


def load_profile() -> tuple[float, npt.NDArray[np.float64]]:
    data = read_toml(_PROFILE, "synth profile")
    prof = np.asarray(data["hourly_profile"], dtype=np.float64)
    return float(data["cv"]), prof / prof.mean()


def _lognormal(rng: np.random.Generator, median: float, n: int) -> npt.NDArray[np.float64]:
    return median * np.exp(LENGTH_SIGMA * rng.standard_normal(n))


def _rescale(t_op: npt.NDArray[np.float64], profile: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Map operational time (unit rate) to wall time under a piecewise-constant hourly intensity
    (inverse of the cumulative intensity, repeating daily)."""
    hour = 3600.0
    cum = np.concatenate([[0.0], np.cumsum(profile) * hour])  # Λ at each hour boundary
    day = cum[-1]
    days, rem = np.divmod(t_op, day)
    h = np.clip(np.searchsorted(cum, rem, side="right") - 1, 0, len(profile) - 1)
    return np.asarray(days * 86_400.0 + h * hour + (rem - cum[h]) / profile[h], dtype=np.float64)


def generate(cfg: SynthConfig) -> pl.DataFrame:
    """One row per request, sorted by arrival. Columns: request_id, arrival (datetime),
    tenant, model, session_id, kind, turn, prompt_tokens, output_tokens, reasoning_tokens,
    shared_prefix_tokens (true prefix shared with the previous turn), system_tokens,
    cached_tokens (provider-reported), cache_write_tokens, ttft_s, e2e_s. A log estimated to need
    more memory than the limit is refused first (:func:`check_memory`)."""
    check_memory(cfg.requests)
    rng = np.random.default_rng(cfg.seed)
    cv_default, profile = load_profile()
    cv = cfg.cv if cfg.cv is not None else cv_default
    if not cfg.diurnal:
        profile = np.ones(24)

    names = list(KINDS)
    shares = np.array([KINDS[k][0] for k in names])
    mean_turns = float((shares * np.array([KINDS[k][1] for k in names])).sum())
    n_sessions = int(cfg.requests / mean_turns * 1.2) + 16
    while True:
        kind = rng.choice(len(names), size=n_sessions, p=shares)
        turns_mean = np.array([KINDS[k][1] for k in names])[kind]
        turns = np.where(turns_mean <= 1, 1, rng.geometric(1.0 / np.maximum(turns_mean, 1.0)))
        if turns.sum() >= cfg.requests:
            break
        n_sessions *= 2
    # Keep whole sessions in start order until the request count is reached (the last one cut).
    cum = np.cumsum(turns)
    last = int(np.searchsorted(cum, cfg.requests))
    kind, turns = kind[: last + 1], turns[: last + 1].copy()
    turns[-1] -= int(cum[last] - cfg.requests)
    n_sessions = len(turns)

    # Session starts: Gamma renewal (shape 1/cv², mean gap so that all sessions span the duration).
    shape = 1.0 / (cv * cv)
    gaps = rng.gamma(shape, 1.0 / shape, size=n_sessions)
    t_op = np.cumsum(gaps)
    t_op *= (cfg.duration_s * profile.sum() / 24.0) / max(t_op[-1], 1e-9) * (n_sessions - 0.5) / n_sessions
    start = _rescale(t_op, profile) if cfg.diurnal else t_op

    tenant_of = rng.integers(0, cfg.tenants, size=n_sessions)
    model_of = rng.integers(0, len(cfg.models), size=n_sessions)
    sys_len = np.round(_lognormal(rng, 1200.0, cfg.tenants)).astype(np.int64).clip(64, 16_000)

    # Flatten to requests.
    sess = np.repeat(np.arange(n_sessions), turns)
    first_idx = np.concatenate([[0], np.cumsum(turns)[:-1]])
    turn = np.arange(len(sess)) - np.repeat(first_idx, turns)
    k = kind[sess]
    new_median = np.where(turn == 0, FIRST_USER_MEDIAN, np.array([KINDS[x][2] for x in names])[k])
    new_text = np.maximum(1, np.round(new_median * np.exp(LENGTH_SIGMA * rng.standard_normal(len(sess)))))
    out_median = np.array([KINDS[x][4] for x in names])[k]
    output = np.clip(np.round(out_median * np.exp(LENGTH_SIGMA * rng.standard_normal(len(sess)))), 1, 8192)
    output = output.astype(np.int64)
    reasoning = np.where(rng.random(len(sess)) < 0.25, np.floor(output * rng.random(len(sess))), 0)

    # prompt_k = prompt_{k-1} + output_{k-1} + new_k, with prompt_0 = system + new_0.
    increment = new_text.astype(np.int64)
    prev_out = np.concatenate([[0], output[:-1]])
    increment = np.where(turn == 0, sys_len[tenant_of[sess]] + increment, prev_out + increment)
    prompt = _group_cumsum(increment, turn == 0)
    shared = np.where(turn == 0, 0, prompt - new_text.astype(np.int64))
    over = prompt > MAX_CONTEXT
    prompt = np.minimum(prompt, MAX_CONTEXT)
    shared = np.minimum(shared, prompt)

    # Times: next turn = previous arrival + previous e2e + gap.
    ttft = 0.15 + prompt / 20_000.0  # assumed server latency, only for spacing turns
    e2e = ttft + output / DECODE_TOKENS_PER_S
    gap_median = np.array([KINDS[x][3] for x in names])[k]
    gap = gap_median * np.exp(LENGTH_SIGMA * rng.standard_normal(len(sess)))
    prev_e2e = np.concatenate([[0.0], e2e[:-1]])
    prev_gap = np.concatenate([[0.0], gap[:-1]])
    step = np.where(turn == 0, start[sess], prev_e2e + prev_gap)
    arrival_s = _group_cumsum(step, turn == 0)
    base = anchor_us(cfg.date)
    assert base is not None
    if base + float(arrival_s.max()) * 1e6 >= _ARRIVAL_END_US:  # a session's later turns, past the span
        raise ConfigError(
            f"synth: arrivals from {cfg.date} over {cfg.duration_s / 3600:g} hours run past 2100-01-01 UTC, "
            "the end of the range ingest accepts (docs/limits.md); use an earlier date or fewer hours"
        )

    frame = pl.DataFrame(
        {
            "session": sess,
            "turn": turn.astype(np.int64),
            "kind": np.array(names)[k],
            "tenant": np.array([f"tenant-{i}" for i in range(cfg.tenants)])[tenant_of[sess]],
            "model": np.array(cfg.models)[model_of[sess]],
            "arrival_s": arrival_s,
            "prompt_tokens": prompt.astype(np.int64),
            "output_tokens": output,
            "reasoning_tokens": reasoning.astype(np.int64),
            "shared_prefix_tokens": shared.astype(np.int64),
            "system_tokens": sys_len[tenant_of[sess]],
            "ttft_s": ttft,
            "e2e_s": e2e,
            "truncated": over,
        }
    )
    frame = _reported_cache(frame, cfg.cache_ttl_s)
    return (
        frame.sort(["arrival_s", "session", "turn"])
        .with_columns(
            request_id=pl.format("req-{}-{}-{}", pl.lit(cfg.seed), pl.col("session"), pl.col("turn")),
            session_id=pl.format("sess-{}-{}", pl.lit(cfg.seed), pl.col("session")),
            arrival=(pl.lit(base) + (pl.col("arrival_s") * 1e6).round(0).cast(pl.Int64)).cast(pl.Datetime("us", "UTC")),
        )
        .drop("truncated")
    )


def _group_cumsum(values: npt.NDArray[np.generic], starts: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """Cumulative sum restarting at every True in ``starts`` (rows grouped contiguously)."""
    total = np.cumsum(values)
    idx = np.flatnonzero(starts)
    offsets = np.concatenate([[0], total[idx[1:] - 1]]) if len(idx) else np.zeros(0)
    group = np.cumsum(starts) - 1
    return np.asarray(total - offsets[group])


def _reported_cache(frame: pl.DataFrame, ttl_s: float) -> pl.DataFrame:
    """Provider-style cached tokens: the longer of (prefix shared with the previous turn, if it
    arrived within the TTL) and (the tenant system prompt, if the tenant sent any request within
    the TTL), in 128-token increments, for prompts of at least 1,024 tokens."""
    by_tenant = frame.sort(["tenant", "arrival_s"]).with_columns(tenant_gap=pl.col("arrival_s").diff().over("tenant"))
    by_session = by_tenant.sort(["session", "turn"]).with_columns(
        session_gap=pl.col("arrival_s").diff().over("session")
    )
    session_hit = pl.when(pl.col("session_gap") <= ttl_s).then(pl.col("shared_prefix_tokens")).otherwise(0)
    system_hit = pl.when(pl.col("tenant_gap") <= ttl_s).then(pl.col("system_tokens")).otherwise(0)
    hit = pl.max_horizontal(session_hit.fill_null(0), system_hit.fill_null(0))
    hit = pl.min_horizontal(hit, pl.col("prompt_tokens"))
    cached = pl.when(pl.col("prompt_tokens") >= CACHE_MIN_TOKENS).then((hit // CACHE_INCREMENT) * CACHE_INCREMENT)
    out = by_session.with_columns(cached_tokens=cached.otherwise(0).cast(pl.Int64))
    write = pl.when(pl.col("prompt_tokens") >= CACHE_MIN_TOKENS).then(pl.col("prompt_tokens") - pl.col("cached_tokens"))
    return out.with_columns(cache_write_tokens=write.otherwise(0).cast(pl.Int64)).drop("tenant_gap", "session_gap")
