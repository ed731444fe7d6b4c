"""Economics: what a fleet costs, which tokens that money buys, and what an API would charge.

Two halves (docs/planning.md has the formulas and a worked example):

* **Self-hosted cost.** A fleet costs ``GPUs × $/GPU-hour`` whether busy or idle (the catalog's dated
  on-demand price, overridable). The busy part is split over the three token classes by the time the
  engine's steps spend on them (:func:`attribute_busy_time`): each step's *linear* time (weights and
  GEMM rows, re-costed by the roofline without attention) is shared by its rows (prefill tokens vs
  decoding sequences); the rest of the step (attention over the KV cache) is shared by the KV entries
  it reads, of which cache-hit tokens are a known part. Idle time is reported on its own and spread
  pro rata for the all-in $ per million tokens.
* **API-equivalent cost.** The same traffic priced on a dated provider table
  (``pipeline/catalog/prices/*.toml``): fresh input at the input price, cache-hit input at the
  cached-input price, cache writes at the cache-write price, output at the output price.

Token classes follow docs/architecture.md (Vocabulary): ``fresh_input_tokens`` (prefill work), ``cache_hit_tokens``
(served from a prefix cache) and ``output_tokens``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.catalog.entries import list_models
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.schemas import atomic_write_bytes, read_parquet, write_parquet
from pipeline.common.tomlfile import read_toml
from pipeline.costmodel.steps import StepBatch
from pipeline.economics.period import (  # the period of record, named here too (cost's callers import it)
    PERIOD_ARRIVALS as PERIOD_ARRIVALS,
)
from pipeline.economics.period import PERIOD_MAKESPAN as PERIOD_MAKESPAN
from pipeline.economics.period import Period as Period
from pipeline.economics.period import run_period as run_period
from pipeline.economics.period import stored_run_period as stored_run_period
from pipeline.economics.period import traffic_period_s as traffic_period_s
from pipeline.economics.stack import (
    CostInputs,
    CostLine,
    CostStack,
    PoolGpus,
    blended_usd_per_million,
    break_even_tokens_per_day,
    build_stack,
    gpu_hour_price,
    load_purchases,
    parse_cost_table,
    with_options,
)
from pipeline.ingest.store import Store
from pipeline.replay.autoscale import autoscale_record, provisioned_from_record
from pipeline.replay.fleet import ResolvedFleet
from pipeline.replay.runfolder import (
    config_path,
    latest_run,
    pools_of,
    read_config,
    run_overload_sustained,
    run_overloaded,
)
from pipeline.replay.slo import MIN_PROJECTION_S

PRICES_DIR = Path(__file__).resolve().parents[1] / "catalog" / "prices"

#: The only unit a price table may declare: USD per million tokens (how every provider publishes).
PRICE_UNIT = "usd_per_million_tokens"
TOKEN_CLASSES: tuple[str, ...] = ("fresh_input", "cache_hit", "output")
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: A price checked more than this long ago is flagged ``stale`` in outputs (list prices of the
#: providers above changed several times a year in 2024-2026).
STALE_AFTER_DAYS = 365

FloatArray = npt.NDArray[np.float64]


# --------------------------------------------------------------------------------------------
# price tables


@dataclass(frozen=True)
class ApiPrice:
    """One model's list price, USD per million tokens."""

    provider: str
    model: str
    input: float
    cached_input: float
    cache_write: float
    output: float
    date: str
    source: str
    path: str
    #: The catalog model (an open model) this price serves, when the provider hosts one: its rows
    #: are the replacement cost of the same model (docs/economics.md, "Replacement cost").
    catalog_model: str | None = None

    @property
    def key(self) -> str:
        return f"{self.provider}/{self.model}"

    def stale(self, today: _dt.date | None = None) -> bool:
        today = today or _dt.date.today()
        return (today - _dt.date.fromisoformat(self.date)).days > STALE_AFTER_DAYS


_PRICE_KEYS = ("input", "cached_input", "cache_write", "output")


def _check_date(value: Any, where: str, today: _dt.date) -> str:
    """The date as ISO text: a "YYYY-MM-DD" string, or a native TOML date (unquoted)."""
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        value = value.isoformat()
    elif isinstance(value, _dt.datetime | _dt.time):
        raise ConfigError(f"{where}: date must be a day (YYYY-MM-DD), got the time {value.isoformat()}")
    if not isinstance(value, str) or not _DATE_RE.match(value):
        raise ConfigError(f"{where}: date must be a YYYY-MM-DD string, got {value!r}")
    try:
        day = _dt.date.fromisoformat(value)
    except ValueError:
        raise ConfigError(f"{where}: date {value!r} is not a calendar date") from None
    if day > today:
        raise ConfigError(f"{where}: date {value} is in the future")
    return value


#: Highest API price accepted, USD per million tokens: a dollar a token, far above any published
#: price, low enough that a day's API bill stays a finite, printable number.
MAX_USD_PER_MILLION_TOKENS = 1_000_000.0


def parse_price_table(data: Mapping[str, Any], origin: str, today: _dt.date | None = None) -> list[ApiPrice]:
    """Validate one price TOML: its keys and value types (``PriceFile`` in pipeline/common/tomlschema.py),
    then the declared unit, dates, non-negative prices, a cached-input price no higher than the
    input price."""
    from pipeline.common.tomlschema import PriceFile, check  # lazy: pydantic, loaded only when a file is read

    today = today or _dt.date.today()
    check(data, PriceFile, origin)
    provider = data["provider"]
    if data["unit"] != PRICE_UNIT:
        raise ConfigError(f"{origin}: unit must be {PRICE_UNIT!r}, got {data['unit']!r}")
    models = data["models"]
    if not models:
        raise ConfigError(f"{origin}: [models.<name>] tables are required")
    out = []
    known: list[str] | None = None
    for name, raw in models.items():
        where = f"{origin} [models.{name}]"
        catalog_model = raw.get("catalog_model")
        if catalog_model is not None:
            known = known if known is not None else list_models()
            if catalog_model not in known:
                raise ConfigError(
                    f"{where}: catalog_model {catalog_model!r} is no catalog model (rooftrace catalog list)"
                )
        values: dict[str, float] = {}
        for key in _PRICE_KEYS:
            v = raw[key]
            if not math.isfinite(v):  # (a number: the schema checked)
                raise ConfigError(f"{where}: {key} must be a number, got {v!r}")
            if not 0 <= v <= MAX_USD_PER_MILLION_TOKENS:
                raise ConfigError(
                    f"{where}: {key} must be between 0 and {MAX_USD_PER_MILLION_TOKENS:,.0f} USD per million "
                    f"tokens, got {v}"
                )
            values[key] = float(v)
        if values["cached_input"] > values["input"]:
            raise ConfigError(f"{where}: cached_input ({values['cached_input']}) exceeds input ({values['input']})")
        out.append(
            ApiPrice(
                provider=provider,
                model=name,
                date=_check_date(raw["date"], where, today),
                source=raw["source"],
                path=origin,
                catalog_model=catalog_model,
                **values,
            )
        )
    return out


def load_price_file(path: Path | str, today: _dt.date | None = None) -> list[ApiPrice]:
    return parse_price_table(read_toml(path, "price file"), str(path), today)


def load_prices(
    paths: Sequence[Path | str] | None = None, today: _dt.date | None = None, *, only: bool = False
) -> list[ApiPrice]:
    """Every bundled table plus the files ``paths`` (``only``: the files alone). A file's price of a
    provider/model a bundled table prices replaces the bundled one (a negotiated price); the same
    provider/model twice among the files, or twice among the bundled tables, is an error."""
    user = [Path(p) for p in paths or ()]
    if only and not user:
        raise ConfigError("--prices-only needs at least one --prices FILE")
    mine: dict[str, ApiPrice] = {}
    for f in user:
        for p in load_price_file(f, today):
            if p.key in mine:
                raise ConfigError(f"{f}: {p.key} is also priced in {mine[p.key].path}")
            mine[p.key] = p
    prices: list[ApiPrice] = []
    if not only:
        seen: dict[str, str] = {}
        for f in sorted(PRICES_DIR.glob("*.toml")):
            for p in load_price_file(f, today):
                if p.key in seen:
                    raise ConfigError(f"{f}: {p.key} is also priced in {seen[p.key]}")
                seen[p.key] = str(f)
                prices.append(mine.pop(p.key, p))
    return prices + list(mine.values())


# --------------------------------------------------------------------------------------------
# API-equivalent cost


@dataclass(frozen=True)
class TokenTotals:
    """Token counts of a body of traffic. ``cache_write`` tokens are part of ``fresh_input``
    (the inclusive convention), as providers that charge for writes count them."""

    fresh_input: float
    cache_hit: float
    output: float
    cache_write: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fresh_input", "cache_hit", "output", "cache_write"):
            if getattr(self, name) < 0:
                raise ConfigError(f"token totals: {name} must be >= 0")
        if self.cache_write > self.fresh_input:
            raise ConfigError("token totals: cache_write tokens cannot exceed fresh_input tokens")

    @property
    def recorded_input(self) -> float:
        return self.fresh_input + self.cache_hit

    def scaled(self, factor: float) -> TokenTotals:
        return TokenTotals(
            self.fresh_input * factor, self.cache_hit * factor, self.output * factor, self.cache_write * factor
        )


@dataclass(frozen=True)
class ApiCost:
    price: ApiPrice
    fresh_input_usd: float
    cache_write_usd: float
    cache_hit_usd: float
    output_usd: float

    @property
    def total_usd(self) -> float:
        return self.fresh_input_usd + self.cache_write_usd + self.cache_hit_usd + self.output_usd


def api_cost(tokens: TokenTotals, price: ApiPrice) -> ApiCost:
    """What ``price``'s provider would bill for ``tokens``: uncached fresh input at ``input``,
    cache writes at ``cache_write``, cache hits at ``cached_input`` (the discount), output at ``output``."""
    m = 1e-6
    return ApiCost(
        price=price,
        fresh_input_usd=(tokens.fresh_input - tokens.cache_write) * price.input * m,
        cache_write_usd=tokens.cache_write * price.cache_write * m,
        cache_hit_usd=tokens.cache_hit * price.cached_input * m,
        output_usd=tokens.output * price.output * m,
    )


# --------------------------------------------------------------------------------------------
# self-hosted cost split


def kv_read_shares(
    prompt_tokens: npt.ArrayLike, cache_hit_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike
) -> dict[str, float]:
    """Share of attention KV reads over a request's life that land on each token class.

    The prefill of request i reads its whole prompt once (``H`` cached + ``F`` fresh entries); each
    of its ``O − 1`` decode steps reads the prompt again plus the ``k`` tokens generated so far. So
    cache-hit entries are read ``H·O`` times, fresh ones ``F·O`` and generated ones ``O(O−1)/2``.
    """
    p = np.asarray(prompt_tokens, dtype=np.float64)
    h = np.asarray(cache_hit_tokens, dtype=np.float64)
    o = np.asarray(output_tokens, dtype=np.float64)
    reads = {
        "cache_hit": float((h * o).sum()),
        "fresh_input": float(((p - h) * o).sum()),
        "output": float((o * (o - 1) / 2).sum()),
    }
    total = sum(reads.values())
    if total <= 0:
        return dict.fromkeys(TOKEN_CLASSES, 0.0)
    return {k: v / total for k, v in reads.items()}


def linear_only_batch(prefill_tokens: FloatArray, prefill_seqs: FloatArray, decode_seqs: FloatArray) -> StepBatch:
    """A step with the given rows and no attention work: what the GEMMs, norms and weight reads cost."""
    zero = np.zeros_like(prefill_tokens)
    return StepBatch(
        prefill_tokens=prefill_tokens,
        prefill_seqs=prefill_seqs,
        prefill_attn_pairs=zero,
        prefill_kv_tokens=zero.copy(),
        decode_seqs=decode_seqs,
        decode_ctx_tokens=zero.copy(),
    )


def attribute_busy_time(
    spans: Mapping[str, npt.NDArray[Any]],
    linear_step_time: Callable[[StepBatch], FloatArray],
    read_shares: Mapping[str, float],
) -> dict[str, float]:
    """Busy seconds (per replica, summed) attributed to each token class.

    ``spans`` holds the engine's span columns (start_s, end_s, steps, prefill_tokens, prefill_seqs,
    decode_seqs). For each span the linear time of one step (``linear_step_time``, e.g. the roofline
    on :func:`linear_only_batch`) times its steps, capped at the span's duration, is shared between
    prefill rows (→ fresh input; recomputation after preemption included) and decode rows
    (→ output) by row count; the remainder (attention) is shared by ``read_shares``.
    """
    dur = np.asarray(spans["end_s"], np.float64) - np.asarray(spans["start_s"], np.float64)
    steps = np.maximum(np.asarray(spans["steps"], np.float64), 1.0)
    p = np.asarray(spans["prefill_tokens"], np.float64) / steps
    ps = np.asarray(spans["prefill_seqs"], np.float64)
    d = np.asarray(spans["decode_seqs"], np.float64)
    if dur.size == 0:
        return dict.fromkeys(TOKEN_CLASSES, 0.0)
    lin = np.minimum(linear_step_time(linear_only_batch(p, ps, d)) * steps, dur)
    rows = p + d
    pf = np.divide(p, rows, out=np.zeros_like(p), where=rows > 0)
    attn = float((dur - lin).sum())
    out = {
        "fresh_input": float((lin * pf).sum()),
        "output": float((lin * (1.0 - pf)).sum()),
        "cache_hit": 0.0,
    }
    for k in TOKEN_CLASSES:
        out[k] += attn * float(read_shares.get(k, 0.0))
    return out


@dataclass(frozen=True)
class GpuCost:
    """A fleet's cost over ``window_s`` seconds and how it splits over token classes."""

    hardware: str
    gpus: int
    usd_per_gpu_hour: float
    price_date: str
    window_s: float
    busy_gpu_s: float
    class_busy_s: Mapping[str, float]
    tokens: TokenTotals
    #: An autoscaled fleet's GPU-seconds provisioned within the window (Σ replicas × the time
    #: each was paid: scale-up delay and drain included); None: ``gpus`` all the window.
    provisioned_gpu_s: float | None = None

    @property
    def paid_gpu_s(self) -> float:
        """GPU-seconds paid over the window: what was provisioned, or every GPU all the window."""
        return self.gpus * self.window_s if self.provisioned_gpu_s is None else self.provisioned_gpu_s

    @property
    def mean_gpus(self) -> float:
        """GPUs paid on average over the window (``gpus`` for a static fleet)."""
        if self.provisioned_gpu_s is None or self.window_s <= 0:
            return float(self.gpus)
        return self.provisioned_gpu_s / self.window_s

    @property
    def total_usd(self) -> float:
        if self.provisioned_gpu_s is None:  # (the static fleet's figure, bit for bit as before)
            return self.gpus * self.usd_per_gpu_hour * self.window_s / 3600.0
        return self.provisioned_gpu_s * self.usd_per_gpu_hour / 3600.0

    @property
    def usd_per_day(self) -> float:
        return self.mean_gpus * self.usd_per_gpu_hour * 24.0

    @property
    def busy_usd(self) -> float:
        return min(self.busy_gpu_s, self.paid_gpu_s) * self.usd_per_gpu_hour / 3600.0

    @property
    def idle_usd(self) -> float:
        return self.total_usd - self.busy_usd

    @property
    def utilization(self) -> float:
        """Busy GPU-seconds over the GPU-seconds of the period (0 to 1): time, not dollars, so a
        free GPU (``--gpu-price 0``) is as busy as a paid one."""
        capacity = self.paid_gpu_s
        return min(max(self.busy_gpu_s / capacity, 0.0), 1.0) if capacity > 0 else 0.0

    def class_usd(self) -> dict[str, float]:
        """Busy dollars per token class (sums to ``busy_usd``)."""
        total = sum(self.class_busy_s.values())
        if total <= 0:
            return dict.fromkeys(TOKEN_CLASSES, 0.0)
        return {k: self.busy_usd * self.class_busy_s.get(k, 0.0) / total for k in TOKEN_CLASSES}

    def rows(self) -> list[dict[str, Any]]:
        """One row per token class plus ``idle``: tokens, busy $, all-in $ (idle spread pro rata by
        busy share), and both per million tokens."""
        usd = self.class_usd()
        seconds = sum(self.class_busy_s.values())  # a share of busy time, whatever the GPU costs
        counts = {
            "fresh_input": self.tokens.fresh_input,
            "cache_hit": self.tokens.cache_hit,
            "output": self.tokens.output,
        }
        out = []
        for k in TOKEN_CLASSES:
            share = self.class_busy_s.get(k, 0.0) / seconds if seconds > 0 else 0.0
            all_in = usd[k] + self.idle_usd * share
            n = counts[k]
            out.append(
                {
                    "token_class": k,
                    "tokens": n,
                    "busy_share": share,
                    "busy_usd": usd[k],
                    "all_in_usd": all_in,
                    "busy_usd_per_million_tokens": usd[k] / n * 1e6 if n > 0 else None,
                    "all_in_usd_per_million_tokens": all_in / n * 1e6 if n > 0 else None,
                }
            )
        out.append(
            {
                "token_class": "idle",
                "tokens": 0.0,
                "busy_share": 0.0,
                "busy_usd": 0.0,
                "all_in_usd": self.idle_usd,
                "busy_usd_per_million_tokens": None,
                "all_in_usd_per_million_tokens": None,
            }
        )
        return out


def api_cost_rows(
    subject: str, tokens: TokenTotals, prices: Sequence[Any], self_host_usd: float, period_s: float
) -> list[dict[str, Any]]:
    """One row per priced API model: the same traffic's API bill and the self-host / API ratio."""
    rows = []
    for p in prices:
        c = api_cost(tokens, p)
        rows.append(
            {
                "subject": subject,
                "provider": p.provider,
                "api_model": p.model,
                "price_date": p.date,
                "price_stale": p.stale(),
                "price_source": p.source,
                "period_s": period_s,
                "fresh_input_tokens": tokens.fresh_input,
                "cache_write_tokens": tokens.cache_write,
                "cache_hit_tokens": tokens.cache_hit,
                "output_tokens": tokens.output,
                "fresh_input_usd": c.fresh_input_usd,
                "cache_write_usd": c.cache_write_usd,
                "cache_hit_usd": c.cache_hit_usd,
                "output_usd": c.output_usd,
                "api_usd": c.total_usd,
                "self_host_usd": self_host_usd,
                "self_host_to_api_ratio": self_host_usd / c.total_usd if c.total_usd > 0 else None,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------
# the `cost` stage: a stored replay run


@dataclass(frozen=True)
class CostResult:
    subject: str
    gpu: GpuCost | PooledGpuCost
    api_rows: list[dict[str, Any]]
    out_dir: Path
    #: Where the hardware and model entries that priced the run came from.
    catalog_source: str = ""
    #: The run's own failures (rejections, overload, SLO verdict) as its summary recorded them: a
    #: cost is only as good as the run it prices, so they are shown with it.
    warnings: tuple[str, ...] = ()
    #: The period priced and why (:func:`run_period`); None: the GPU cost's window, the arrivals.
    period: Period | None = None
    #: The full cost, line by line (pipeline/economics/stack.py); None: the GPU cost alone.
    stack: CostStack | None = None
    #: The replacement cost of the same traffic per alternative (:func:`replacement_rows`).
    replacement: tuple[dict[str, Any], ...] = ()
    #: The fleet file whose [cost] table gave the stack's inputs (None: none read).
    inputs_file: str | None = None
    #: What the run's GPUs drew (pipeline/economics/energy.py ``RunEnergy.to_dict``), over the same period.
    energy: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        g = self.gpu
        period = self.period or Period(g.window_s, PERIOD_ARRIVALS, g.window_s, g.window_s, 0.0, False)
        valid = period.unit_costs_valid
        return {
            "subject": self.subject,
            "warnings": list(self.warnings),
            "out_dir": str(self.out_dir),
            "hardware": g.hardware,
            "gpus": g.gpus,
            "usd_per_gpu_hour": g.usd_per_gpu_hour,
            "price_date": g.price_date,
            **period.to_dict(),
            "period_s": g.window_s,
            "period": period.text,
            "day_projection": period.day_projection,
            "total_usd": g.total_usd,
            "busy_usd": g.busy_usd,
            "idle_usd": g.idle_usd,
            "utilization": g.utilization,
            "usd_per_day": g.usd_per_day,
            "token_classes": [{**r, "unit_cost_valid": valid} for r in g.rows()],
            "api_equivalent": [{**r, "self_host_to_api_ratio_valid": valid} for r in self.api_rows],
            "catalog_source": self.catalog_source,
            **({"cost_stack": self.stack.to_dict()} if self.stack is not None else {}),
            "cost_inputs_file": self.inputs_file,
            **({"energy": self.energy} if self.energy is not None else {}),
            "replacement": [{**r, "break_even_valid": valid, "blended_valid": valid} for r in self.replacement],
            **(
                {"pools": [_pool_cost_dict(name, part, valid) for name, part in g.pools]}
                if isinstance(g, PooledGpuCost)
                else {}
            ),
            **({"autoscale": autoscale_cost(g)} if isinstance(g, GpuCost) and g.provisioned_gpu_s is not None else {}),
        }


def autoscale_cost(g: GpuCost) -> dict[str, Any]:
    """An autoscaled fleet's GPU cost beside the static fleet's (``gpus``, its max_replicas' GPUs,
    all the period): both GPU-hours and both $ at the same price."""
    static_s = g.gpus * g.window_s
    return {
        "provisioned_gpu_hours": g.paid_gpu_s / 3600.0,
        "mean_gpus": g.mean_gpus,
        "static_gpu_hours": static_s / 3600.0,
        "autoscaled_usd": g.total_usd,
        "static_usd": static_s * g.usd_per_gpu_hour / 3600.0,
    }


def _pool_cost_dict(name: str, g: GpuCost, valid: bool) -> dict[str, Any]:
    """One pool's part of a fleet of pools' cost.json."""
    return {
        "pool": name,
        "hardware": g.hardware,
        "gpus": g.gpus,
        "usd_per_gpu_hour": g.usd_per_gpu_hour,
        "price_date": g.price_date,
        "total_usd": g.total_usd,
        "busy_usd": g.busy_usd,
        "idle_usd": g.idle_usd,
        "utilization": g.utilization,
        "usd_per_day": g.usd_per_day,
        "token_classes": [{**r, "unit_cost_valid": valid} for r in g.rows()],
    }


#: Highest $/GPU-hour override accepted: far above any real price, low enough that every $ figure
#: of a fleet stays finite (cost.json and plan.json hold plain JSON numbers).
MAX_USD_PER_GPU_HOUR = 1_000_000.0


def check_gpu_price(price: float, where: str) -> float:
    """A $/GPU-hour override (``cost --gpu-price``, ``plan --gpu-price HW=P``): a finite number in
    [0, MAX_USD_PER_GPU_HOUR], else one ConfigError line naming ``where``."""
    if not 0.0 <= price <= MAX_USD_PER_GPU_HOUR:  # NaN fails every comparison
        raise ConfigError(
            f"{where}: price must be between 0 and {MAX_USD_PER_GPU_HOUR:,.0f} USD per GPU-hour, got {price!r}"
        )
    return price


def _fleet_gpu_cost(
    fleet: ResolvedFleet,
    req: pa.Table,
    ok: npt.NDArray[np.bool_],
    writes: npt.NDArray[np.float64],
    spans: Mapping[str, npt.NDArray[np.float64]],
    step_rows: npt.NDArray[np.bool_],
    span: float,
    price: tuple[float, str] | None,
) -> GpuCost:
    """One homogeneous fleet's GPU cost over ``span`` seconds: its finished requests (``ok``) and
    its steps (``step_rows``), its busy time split over token classes by its own step cost."""
    prompt = req.column("recorded_input_tokens").to_numpy().astype(np.float64)[ok]
    hits = req.column("cache_hit_tokens").to_numpy().astype(np.float64)[ok]
    out = req.column("output_tokens").to_numpy().astype(np.float64)[ok]
    mine = {k: v[step_rows] for k, v in spans.items()}
    dep = fleet.deployment

    def linear(batch: StepBatch) -> FloatArray:
        return np.asarray(dep(batch).time_s, dtype=np.float64)

    busy = attribute_busy_time(mine, linear, kv_read_shares(prompt, hits, out))
    fresh = float(prompt.sum() - hits.sum())
    tokens = TokenTotals(fresh, float(hits.sum()), float(out.sum()), min(float(writes[ok].sum()), fresh))
    hw = dep.hardware
    return GpuCost(
        hardware=hw.name,
        gpus=fleet.ranks * dep.gpus,
        usd_per_gpu_hour=price[0] if price is not None else hw.price_usd_per_gpu_hour,
        price_date=price[1] if price is not None else hw.price_date,
        window_s=span,
        busy_gpu_s=float((mine["end_s"] - mine["start_s"]).sum()) * dep.gpus,
        class_busy_s=busy,
        tokens=tokens,
    )


@dataclass(frozen=True)
class PooledGpuCost:
    """A fleet of pools' GPU cost: each pool's :class:`GpuCost` (its GPUs at its price, its busy
    time split by its own step cost), summed; the same figures a GpuCost gives, each the pools' sum
    (a pool's idle dollars are spread over its own token classes)."""

    pools: tuple[tuple[str, GpuCost], ...]

    @property
    def hardware(self) -> str:
        return " + ".join(dict.fromkeys(g.hardware for _, g in self.pools))

    @property
    def gpus(self) -> int:
        return sum(g.gpus for _, g in self.pools)

    @property
    def window_s(self) -> float:
        return self.pools[0][1].window_s

    @property
    def usd_per_gpu_hour(self) -> float:
        """The fleet's mean $/GPU-hour (its GPUs' prices weighted by their counts)."""
        return sum(g.gpus * g.usd_per_gpu_hour for _, g in self.pools) / self.gpus if self.gpus else 0.0

    @property
    def price_date(self) -> str:
        return "; ".join(dict.fromkeys(g.price_date for _, g in self.pools))

    @property
    def busy_gpu_s(self) -> float:
        return sum(g.busy_gpu_s for _, g in self.pools)

    @property
    def class_busy_s(self) -> dict[str, float]:
        return {k: sum(g.class_busy_s.get(k, 0.0) for _, g in self.pools) for k in TOKEN_CLASSES}

    @property
    def tokens(self) -> TokenTotals:
        t = [g.tokens for _, g in self.pools]
        return TokenTotals(
            sum(x.fresh_input for x in t),
            sum(x.cache_hit for x in t),
            sum(x.output for x in t),
            sum(x.cache_write for x in t),
        )

    @property
    def total_usd(self) -> float:
        return sum(g.total_usd for _, g in self.pools)

    @property
    def usd_per_day(self) -> float:
        return sum(g.usd_per_day for _, g in self.pools)

    @property
    def busy_usd(self) -> float:
        return sum(g.busy_usd for _, g in self.pools)

    @property
    def idle_usd(self) -> float:
        return self.total_usd - self.busy_usd

    @property
    def utilization(self) -> float:
        capacity = sum(g.paid_gpu_s for _, g in self.pools)
        return min(max(self.busy_gpu_s / capacity, 0.0), 1.0) if capacity > 0 else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """GpuCost.rows of the whole fleet: each class's tokens and dollars, the pools' sums."""
        per = [g.rows() for _, g in self.pools]
        seconds = sum(self.class_busy_s.values())
        out = []
        for i, first in enumerate(per[0]):
            k = first["token_class"]
            busy_usd = sum(r[i]["busy_usd"] for r in per)
            all_in = sum(r[i]["all_in_usd"] for r in per)
            n = sum(float(r[i]["tokens"]) for r in per)
            share = self.class_busy_s.get(k, 0.0) / seconds if seconds > 0 and k in TOKEN_CLASSES else 0.0
            out.append(
                {
                    "token_class": k,
                    "tokens": n,
                    "busy_share": share,
                    "busy_usd": busy_usd,
                    "all_in_usd": all_in,
                    "busy_usd_per_million_tokens": busy_usd / n * 1e6 if n > 0 and k in TOKEN_CLASSES else None,
                    "all_in_usd_per_million_tokens": all_in / n * 1e6 if n > 0 and k in TOKEN_CLASSES else None,
                }
            )
        return out


def run_cost_inputs(
    config: Mapping[str, Any], fleet_file: str | None, options: Mapping[str, Any]
) -> tuple[CostInputs, str | None]:
    """The cost stack's stated inputs for a run: ``fleet_file``'s ``[cost]`` table, else the one of
    the fleet file the run recorded (``fleet_file`` in its config.json) when that file is still
    there, else the defaults; the command line's ``options`` over them. Also the file read."""
    path: Path | None = Path(fleet_file) if fleet_file is not None else None
    recorded = config.get("fleet_file")
    if path is None and isinstance(recorded, str) and recorded and Path(recorded).is_file():
        path = Path(recorded)
    base = CostInputs()
    if path is not None:
        data = read_toml(path, "fleet file")
        raw = data.get("cost")
        if raw is not None:
            if not isinstance(raw, dict):
                raise ConfigError(f"{path}: cost must be a table ([cost]), got {raw!r}")
            base = parse_cost_table(raw, f"{path} [cost]")
    return with_options(base, **options), (str(path) if path is not None else None)


def run_model(config: Mapping[str, Any]) -> str | None:
    """The catalog model a run served (its resolved fleet's ``model``)."""
    resolved = config.get("resolved")
    fleet = resolved.get("fleet") if isinstance(resolved, dict) else None
    model = fleet.get("model") if isinstance(fleet, dict) else None
    return model if isinstance(model, str) else None


def replacement_rows(
    stack: CostStack,
    tokens: TokenTotals,
    prices: Sequence[ApiPrice],
    api_rows: Sequence[Mapping[str, Any]],
    model: str | None,
) -> tuple[dict[str, Any], ...]:
    """Per priced alternative: its blended $ per million tokens over the traffic's own mix (its bill
    / every token of the traffic), the self-hosted full cost's, and the break-even volume
    ``V* = F / p × 10⁶`` tokens a day (``F``: the stack's $ a day; ``p``: the alternative's blended
    price), beside the traffic's own volume projected to a day."""
    total = tokens.fresh_input + tokens.cache_hit + tokens.output
    # the day's volume only from an hour of traffic or more (pipeline.replay.slo.day_projection's rule)
    day_tokens = total * 86400.0 / stack.period_s if stack.period_s >= MIN_PROJECTION_S else None
    own = blended_usd_per_million(stack.total_usd, total)
    out = []
    for p, row in zip(prices, api_rows, strict=True):
        blended = blended_usd_per_million(float(row["api_usd"]), total)
        v = break_even_tokens_per_day(stack.usd_per_day, blended)
        out.append(
            {
                "provider": p.provider,
                "api_model": p.model,
                "catalog_model": p.catalog_model,
                "same_model": p.catalog_model is not None and p.catalog_model == model,
                "kind": "hosted open model" if p.catalog_model else "closed API",
                "price_date": p.date,
                "api_usd": row["api_usd"],
                "blended_usd_per_million_tokens": blended,
                "self_host_blended_usd_per_million_tokens": own,
                "self_host_usd_per_day": stack.usd_per_day,
                "day_tokens": day_tokens,
                "break_even_tokens_per_day": v,
                "break_even_to_day_volume": v / day_tokens if v is not None and day_tokens else None,
            }
        )
    return tuple(out)


def electricity_line(
    run_dir: Path, config: Mapping[str, Any], counted: bool, period_s: float
) -> tuple[CostLine, dict[str, Any]]:
    """The stack's ``electricity`` line: the run's facility energy (GPU board energy × PUE,
    pipeline/economics/energy.py) at the fleet's ``[energy]`` price, over the period of record —
    counted when ``counted`` (owned GPUs), else shown at $0 with what it would be (a cloud
    GPU-hour price already pays for the power). Also returns the run's energy (``RunEnergy.to_dict``)."""
    from pipeline.economics.energy import run_energy  # lazy: the power models, read only when a cost is made

    energy = run_energy(run_dir, config).to_dict()
    usd = float(energy["electricity_usd"])
    basis = f"{energy['facility_kwh']:,.4g} kWh (GPU boards x PUE {energy['pue']:g}) x ${energy['usd_per_kwh']:g}/kWh"
    if energy["missing_power"]:
        basis += f"; no power model for {', '.join(energy['missing_power'])} (not counted)"
    rate = usd * 3600.0 / period_s if period_s > 0 and math.isfinite(period_s) else 0.0
    if counted:
        return CostLine("electricity", basis, rate), energy
    return CostLine(
        "electricity",
        f"not counted (a cloud GPU-hour price pays for the power; [cost] electricity = true or --electricity "
        f"for owned GPUs): {basis} = ${usd:,.2f}",
        0.0,
    ), energy


def run_cost(
    store: Store,
    run_id: str | None = None,
    price_files: Sequence[str] = (),
    usd_per_gpu_hour: float | None = None,
    *,
    prices_only: bool = False,
    fleet_file: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> CostResult:
    """GPU cost split, full cost stack and API-equivalent cost of a stored replay run (the latest
    when ``run_id`` is None); writes ``STORE/costs/<run_id>/{gpu_cost,api_cost}.parquet`` and
    ``cost.json``. The stack's inputs: ``fleet_file``'s ``[cost]`` table (default: the fleet file
    the run was replayed from, when it is still there), with ``options`` over it
    (:func:`pipeline.economics.stack.with_options`' keywords); ``usd_per_gpu_hour`` (``--gpu-price``)
    is the quoted price of the purchase model. ``price_files`` add to the bundled price tables
    (``prices_only``: replace them)."""
    if usd_per_gpu_hour is not None:
        check_gpu_price(usd_per_gpu_hour, "--gpu-price")
    if run_id is not None and not run_id.strip():  # '' was quietly the latest run
        raise RooftraceError("--run: the run id is empty (name a run, or leave --run out for the latest one)")
    run_id = run_id if run_id is not None else latest_run(store)
    if run_id is None:
        raise RooftraceError(f"{store.root}: no replay runs yet (run `rooftrace replay` first)")
    run_dir = store.run_dir(run_id)
    cfg_path = config_path(run_dir)
    if not cfg_path.exists():
        raise RooftraceError(f"{run_dir}: no such replay run")
    config = read_config(cfg_path)
    pools = pools_of(config, str(cfg_path))
    catalog_source = "; ".join(dict.fromkeys(p.source for p in pools))
    prices = load_prices(list(price_files), only=prices_only)
    inputs, inputs_file = run_cost_inputs(config, fleet_file, options or {})
    purchases = load_purchases()
    steps = read_parquet(run_dir / "steps.parquet", "replay_steps")
    spans = {
        k: steps.column(k).to_numpy().astype(np.float64)
        for k in ("start_s", "end_s", "steps", "prefill_tokens", "prefill_seqs", "decode_seqs")
    }
    req = read_parquet(run_dir / "requests.parquet", "replay_requests")
    ok = np.asarray(req.column("status").to_pylist()) == "finished"
    period = run_period(
        req.column("arrival_s").to_numpy(),
        req.column("finish_s").to_numpy(zero_copy_only=False).astype(np.float64)[ok],
        steps.column("replica").to_numpy(),
        spans["start_s"],
        spans["end_s"],
        run_overloaded(config),
        run_overload_sustained(config),
    )
    # the period of record: the traffic's own span, or the makespan of a fleet that fell behind
    span = period.seconds
    writes = np.zeros(req.num_rows)
    date = config.get("date")
    if isinstance(date, str) and date in store.dates():
        canon = store.read_requests(date)
        if "cache_write_tokens" in canon.columns:
            # each replayed request's cache writes, by its id (the run's rows are in date order)
            ids = pl.DataFrame({"request_id": req.column("request_id").to_pylist()}, schema={"request_id": pl.String})
            own = canon.select("request_id", pl.col("cache_write_tokens").fill_null(0).cast(pl.Float64))
            own = own.group_by("request_id").agg(pl.col("cache_write_tokens").sum())
            joined = ids.join(own, on="request_id", how="left", maintain_order="left")
            writes = joined.get_column("cache_write_tokens").fill_null(0.0).to_numpy().astype(np.float64)
    parts: list[tuple[str | None, GpuCost]] = []
    per_replica: list[int] = []
    for pool in pools:
        on_pool = np.ones(req.num_rows, np.bool_)
        step_rows = np.ones(steps.num_rows, np.bool_)
        if pool.name is not None:  # a fleet of pools: each pool's requests and steps, priced on its GPUs
            on_pool = np.asarray(req.column("pool").to_pylist(), dtype=object) == pool.name
            step_rows = np.asarray(steps.column("pool").to_pylist(), dtype=object) == pool.name
        hw = pool.fleet.deployment.hardware
        price = (
            (usd_per_gpu_hour, "override")
            if usd_per_gpu_hour is not None
            else gpu_hour_price(hw.price_usd_per_gpu_hour, hw.price_date, inputs, purchases)
        )
        part = _fleet_gpu_cost(pool.fleet, req, ok & on_pool, writes, spans, step_rows, span, price)
        scaled = autoscale_record(config, pool.name)
        if scaled is not None:  # an autoscaled fleet: what it provisioned, not max_replicas all the period
            lo = float(np.min(req.column("arrival_s").to_numpy())) if req.num_rows else 0.0
            paid = provisioned_from_record(scaled, lo, lo + span) * pool.fleet.gpus_per_replica
            part = replace(part, provisioned_gpu_s=paid)
        parts.append((pool.name, part))
        per_replica.append(pool.fleet.gpus_per_replica)
    gpu: GpuCost | PooledGpuCost = parts[0][1]
    if pools[0].name is not None:  # a fleet of pools
        gpu = PooledGpuCost(tuple((str(name), part) for name, part in parts))
    tokens = gpu.tokens
    electricity, energy = electricity_line(run_dir, config, inputs.electricity, span)
    stack = build_stack(
        [PoolGpus(name, g.mean_gpus, n, g.usd_per_gpu_hour) for (name, g), n in zip(parts, per_replica, strict=True)],
        inputs,
        span,
        [electricity],
    )
    api_rows = api_cost_rows(run_id, tokens, prices, stack.total_usd, span)
    out_dir = store.cost_dir(run_id)
    gpu_rows = [
        {
            "subject": run_id if name is None else f"{run_id}/{name}",
            "hardware": part.hardware,
            "gpus": part.gpus,
            "usd_per_gpu_hour": part.usd_per_gpu_hour,
            "price_date": part.price_date,
            "period_s": span,
            **row,
        }
        for name, part in parts
        for row in part.rows()
    ]
    summary = config.get("summary")
    health = summary.get("health") if isinstance(summary, dict) else None
    found = health.get("warnings") if isinstance(health, dict) else None
    warnings = tuple(str(w) for w in found) if isinstance(found, list) else ()
    replacement = replacement_rows(stack, tokens, prices, api_rows, run_model(config))
    result = CostResult(
        run_id, gpu, api_rows, out_dir, catalog_source, warnings, period, stack, replacement, inputs_file, energy
    )
    with store.lock():
        write_parquet(pa.Table.from_pylist(gpu_rows), out_dir / "gpu_cost.parquet", "plan_gpu_cost")
        write_parquet(pa.Table.from_pylist(api_rows), out_dir / "api_cost.parquet", "plan_api_cost")
        doc = json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str)
        atomic_write_bytes(out_dir / "cost.json", doc.encode())
    return result
