"""Token accounting: split every recorded input token into cache-hit and fresh (``rooftrace classify``).

:func:`account` is the pure computation over a requests frame; :func:`classify_tokens` reads one
date of the store, runs it, and writes::

    STORE/accounting/requests/date=D/part-0.parquet     schema accounting_requests (per request)
    STORE/accounting/minutes/date=D/part-0.parquet      schema accounting_minutes  (per minute)
    STORE/accounting/cache_curve/date=D/part-0.parquet  schema cache_curve (capacity -> hits)
    STORE/accounting/summary/date=D/summary.json        the options used and the totals printed

Each model has its own simulated prefix cache (replicas of different models do not share KV
memory); tenants and adapters of one model share its capacity but, being salted apart, never hit
each other's blocks. Requests are replayed through the cache in arrival order and touch it at
arrival: the replay engine later does the same with real admission times.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.catalog import load_model
from pipeline.catalog.names import canonical_model_names
from pipeline.classify import offload, prefix
from pipeline.classify.memory import check_classify_memory
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.schemas import atomic_write_bytes, load_schema, read_parquet, write_parquet
from pipeline.costmodel.fit import kv_bytes_per_token
from pipeline.ingest.project import find_project
from pipeline.ingest.store import Store

#: Points of the capacity grid per doubling of the cache size.
CURVE_POINTS_PER_DOUBLING = 4

_UNITS_TOKENS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS_BYTES = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
#: Bounds far beyond any real cache, block or model, that keep every count of the accounting
#: (capacity tokens x KV bytes per token included) within 64-bit integers.
MAX_CAPACITY_TOKENS = 2**38
MAX_CAPACITY_BYTES = 2**50
MAX_BLOCK_SIZE = 2**24
MAX_KV_BYTES_PER_TOKEN = 2**24
_CAPACITY_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*$")


@dataclass(frozen=True)
class Capacity:
    """A prefix-cache size per model: in tokens, in bytes, or unbounded (both None)."""

    tokens: int | None = None
    bytes: int | None = None

    def __post_init__(self) -> None:
        if self.tokens is not None and self.bytes is not None:
            raise RooftraceError("a cache capacity is given in tokens or in bytes, not both")
        for name, value, top in (
            ("tokens", self.tokens, MAX_CAPACITY_TOKENS),
            ("bytes", self.bytes, MAX_CAPACITY_BYTES),
        ):
            if value is not None and value < 0:
                raise RooftraceError(f"cache capacity {name} must be >= 0, got {value}")
            if value is not None and value > top:
                raise RooftraceError(
                    f"cache capacity {name} must be <= {top:,}, got {value:.3g}; for no limit give no capacity"
                )

    @property
    def unbounded(self) -> bool:
        return self.tokens is None and self.bytes is None

    def describe(self) -> str:
        if self.tokens is not None:
            return f"{self.tokens} tokens"
        if self.bytes is not None:
            return f"{self.bytes} bytes"
        return "unbounded"


def parse_capacity(text: str | None) -> Capacity:
    """``2M`` / ``2000000`` tokens (K, M, G, T = 10^3..10^12); ``40GB``, ``40GiB``, ``512MB``
    bytes (SI and binary prefixes); ``unbounded``, ``inf`` or None: no limit."""
    if text is None or text.strip().lower() in {"unbounded", "inf", "none"}:
        return Capacity()
    m = _CAPACITY_RE.match(text)
    if not m:
        raise RooftraceError(f"capacity {text!r}: expected a number with an optional unit, e.g. 2M or 40GB")
    value, unit = float(m.group(1)), m.group(2).upper()
    if not math.isfinite(value * _UNITS_TOKENS.get(unit, _UNITS_BYTES.get(unit, 1))):
        raise RooftraceError(f"capacity {text!r}: too large; for no limit leave --capacity out or say unbounded")
    if unit in _UNITS_TOKENS:
        return Capacity(tokens=int(value * _UNITS_TOKENS[unit]))
    if unit in _UNITS_BYTES:
        return Capacity(bytes=int(value * _UNITS_BYTES[unit]))
    raise RooftraceError(
        f"capacity {text!r}: unknown unit {m.group(2)!r}; tokens take K/M/G/T, bytes take B, KB..TB, KiB..TiB"
    )


def parse_offload_sizes(text: str | None, flag: str = "--offload-gb") -> tuple[float, ...]:
    """``--offload-gb`` (or ``--shared-gb``, named by ``flag``): comma-separated sizes in GB (1e9
    bytes), each in [0, 1e6]; None: none."""
    if text is None:
        return ()
    out = []
    for part in text.split(","):
        try:
            gb = float(part)
        except ValueError:
            raise RooftraceError(f"{flag} {text!r}: {part.strip()!r} is not a number of GB") from None
        if not 0 <= gb <= offload.MAX_OFFLOAD_GB:
            raise RooftraceError(
                f"{flag} {text!r}: each size must be in [0, {offload.MAX_OFFLOAD_GB:g}] GB, got {part.strip()}"
            )
        out.append(gb)
    return tuple(out)


def catalog_kv_bytes_per_token(model: str, kv_dtype: str = "bf16", *, required: bool = False) -> float | None:
    """KV-cache bytes per token of catalog model ``model`` (all full-attention layers, no tensor
    parallel split: the whole replica's bytes), or None when the catalog has no such model."""
    # Imported here: the catalog and memory model are another stage's, loaded only when needed.

    try:
        spec = load_model(model)
    except ConfigError:
        if required:
            raise
        return None
    return float(kv_bytes_per_token(spec, kv_dtype))


@dataclass(frozen=True)
class ClassifyOptions:
    """Options of one classify run (echoed in the summary)."""

    block_size: int = 512
    capacity: Capacity = field(default_factory=Capacity)
    isolation: tuple[str, ...] = prefix.DEFAULT_ISOLATION
    ttl_s: float | None = None
    kv_bytes_per_token: float | None = None
    kv_model: str | None = None
    kv_dtype: str = "bf16"
    #: Lower-tier sizes (GB, 1e9 bytes, per model's cache) to tabulate the GPU tier's hits, the
    #: lower tier's and the fresh prefill against (``--offload-gb``; :mod:`pipeline.classify.offload`).
    offload_gb: tuple[float, ...] = ()
    #: Sizes (GB) of a store below the ``--offload-gb`` tier (``--shared-gb``): the table becomes
    #: a grid, every lower-tier size against every store size (docs/accounting.md, "Three levels").
    shared_gb: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, Capacity):
            raise RooftraceError(f"capacity must be a Capacity, got {type(self.capacity).__name__}")
        if self.kv_bytes_per_token is not None and self.kv_model is not None:
            raise RooftraceError("give --kv-bytes-per-token or --kv-model, not both")
        if not 0 < self.block_size <= MAX_BLOCK_SIZE:
            raise RooftraceError(f"--block-size must be in 1..{MAX_BLOCK_SIZE:,}, got {self.block_size}")
        if self.ttl_s is not None and not self.ttl_s >= 0:
            raise RooftraceError(f"--ttl must be >= 0 seconds, got {self.ttl_s}")
        if self.kv_bytes_per_token is not None and not 0 < self.kv_bytes_per_token <= MAX_KV_BYTES_PER_TOKEN:
            raise RooftraceError(
                f"--kv-bytes-per-token must be in (0, {MAX_KV_BYTES_PER_TOKEN:,}], got {self.kv_bytes_per_token}"
            )
        for flag, sizes in (("--offload-gb", self.offload_gb), ("--shared-gb", self.shared_gb)):
            for gb in sizes:
                if isinstance(gb, bool) or not isinstance(gb, int | float) or not 0 <= gb <= offload.MAX_OFFLOAD_GB:
                    raise RooftraceError(
                        f"{flag}: each size must be a number of GB in [0, {offload.MAX_OFFLOAD_GB:g}], got {gb!r}"
                    )
        if self.shared_gb and not self.offload_gb:
            raise RooftraceError(
                "--shared-gb needs --offload-gb (the host tier above the store; --offload-gb 0 for none)"
            )
        if self.offload_gb and self.capacity.unbounded:
            raise RooftraceError(
                "--offload-gb needs --capacity (the GPU tier's size): an unbounded GPU cache leaves a lower tier "
                "nothing to hold"
            )


@dataclass(frozen=True)
class Accounting:
    """What :func:`account` computes: the three tables and the summary numbers."""

    requests: pl.DataFrame
    minutes: pl.DataFrame
    curve: pl.DataFrame
    summary: dict[str, Any]
    #: The day's prefix identity (rows in arrival order), stored for the replay to reuse.
    identity: prefix.PrefixIdentity


def _kv_per_token(model: str, opts: ClassifyOptions) -> float | None:
    """KV bytes per token for ``model``'s cache: the option, else ``--kv-model``'s, else the
    catalog entry named like the model, else unknown."""
    if opts.kv_bytes_per_token is not None:
        return opts.kv_bytes_per_token
    if opts.kv_model is not None:
        return catalog_kv_bytes_per_token(opts.kv_model, opts.kv_dtype, required=True)
    return catalog_kv_bytes_per_token(model, opts.kv_dtype)


def _capacity_blocks(model: str, bs: int, opts: ClassifyOptions) -> int | None:
    cap = opts.capacity
    if cap.tokens is not None:
        return cap.tokens // bs
    if cap.bytes is not None:
        per_token = _kv_per_token(model, opts)
        if per_token is None:
            raise RooftraceError(
                f"capacity {cap.describe()}: KV bytes per token of model {model!r} unknown "
                "(no catalog model of that name); pass --kv-model or --kv-bytes-per-token, "
                "or give the capacity in tokens"
            )
        if cap.bytes / per_token > MAX_CAPACITY_TOKENS:
            raise RooftraceError(
                f"capacity {cap.describe()} at {per_token:g} KV bytes per token is {cap.bytes / per_token:.3g} "
                f"tokens, more than {MAX_CAPACITY_TOKENS:,}; for no limit give no capacity"
            )
        return int(cap.bytes // (per_token * bs))
    return None


def _capacity_grid(max_distance: int, chosen: Sequence[int]) -> npt.NDArray[np.int64]:
    """0, then ~4 points per doubling up to the largest finite stack distance, plus ``chosen``."""
    pts = [0, *chosen]
    if max_distance >= 1:
        n = math.ceil(math.log2(max_distance) * CURVE_POINTS_PER_DOUBLING) + 1
        pts.extend(np.unique(np.round(np.geomspace(1, max_distance, max(n, 2)))).astype(np.int64).tolist())
    return np.unique(np.asarray(pts, dtype=np.int64))


def account(requests: pl.DataFrame, options: ClassifyOptions | None = None) -> Accounting:
    """Classify every input token of ``requests`` (a canonical requests frame) as cache-hit or fresh."""
    opts = options if options is not None else ClassifyOptions()
    n = requests.height
    # Replay order is arrival, then request id (as Store.read_requests returns it already: skip
    # the copy of the hash-chain column then).
    order = requests.select(pl.arg_sort_by(["arrival", "request_id"])).to_series().to_numpy()
    df = requests if np.array_equal(order, np.arange(n)) else requests[order]
    identity = prefix.build_identity(df, opts.isolation)
    chains = prefix.chains_at(identity, identity.log_block_size or opts.block_size)
    bs = chains.block_size

    arrival_us = df.get_column("arrival").dt.epoch("us").to_numpy().astype(np.int64)
    t0 = int(arrival_us.min()) if n else 0
    times_s = (arrival_us - t0).astype(np.float64) / 1e6
    minute_us = (arrival_us // 60_000_000) * 60_000_000
    minutes, minute_idx = np.unique(minute_us, return_inverse=True)
    recorded = df.get_column("recorded_input_tokens").to_numpy().astype(np.int64)

    logged = df.get_column("model")
    aliases = find_project().models
    models = logged.replace(canonical_model_names(logged.unique().sort().to_list(), aliases)).to_numpy()
    prompt_blocks = chains.prompt_blocks()

    hit_blocks = np.zeros(n, dtype=np.int64)
    domain_data: list[tuple[str, npt.NDArray[np.int64], prefix.Distances, int | None]] = []
    chosen_blocks: dict[str, int | None] = {}
    for model in sorted(set(models.tolist())):
        rows = np.flatnonzero(models == model).astype(np.int64)
        plan = prefix.access_plan(chains, rows)
        dist = prefix.request_distances(*plan, times_s=times_s[rows], ttl_s=opts.ttl_s)
        cap = _capacity_blocks(model, bs, opts)
        chosen_blocks[model] = cap
        hit_blocks[rows] = dist.hit_blocks(cap)
        domain_data.append((model, rows, dist, cap))

    finite = [int(d.distance[d.distance < prefix.INF_DISTANCE].max(initial=0)) for _, _, d, _ in domain_data]
    grid = _capacity_grid(max(finite, default=0), [c for c in chosen_blocks.values() if c is not None])
    hits_grid = np.zeros((len(domain_data), minutes.shape[0], grid.shape[0] + 1), dtype=np.int64)
    for k, (_, rows, dist, _) in enumerate(domain_data):
        owner = np.repeat(rows, np.diff(dist.offsets))
        bucket = np.searchsorted(grid, dist.distance, side="left")  # first capacity that holds it
        bucket[dist.distance == prefix.INF_DISTANCE] = grid.shape[0] + 1  # never (the unbounded slot too)
        width = grid.shape[0] + 2
        flat = np.bincount(minute_idx[owner] * width + bucket, minlength=minutes.shape[0] * width)
        per = flat.reshape(minutes.shape[0], width)
        # columns 0..K-1: capacity grid[g]; column K: unbounded; finite distances above the grid
        # (none by construction) would land in column K.
        hits_grid[k] = np.cumsum(per[:, : grid.shape[0] + 1], axis=1)

    sim_tokens = hit_blocks * bs
    has_chain = chains.source != prefix.SOURCE_NONE
    simulated = pl.Series("simulated_cache_hit_tokens", np.where(has_chain, sim_tokens, 0)).set(
        pl.Series(~has_chain), None
    )
    sim_blocks = pl.Series("simulated_hit_blocks", hit_blocks).set(pl.Series(~has_chain), None)
    acc = df.select(
        "request_id",
        "arrival",
        "model",
        "tenant",
        "adapter",
        "session_id",
        "recorded_input_tokens",
        "output_tokens",
        "reported_cache_hit_tokens",
    ).with_columns(
        simulated,
        sim_blocks,
        pl.Series("prefix_source", np.asarray(prefix.SOURCE_NAMES)[chains.source]),
        pl.Series("prefix_blocks", prompt_blocks),
    )
    acc = acc.with_columns(
        pl.coalesce("reported_cache_hit_tokens", "simulated_cache_hit_tokens", pl.lit(0, pl.Int64))
        .cast(pl.Int64)
        .alias("cache_hit_tokens"),
        pl.when(pl.col("reported_cache_hit_tokens").is_not_null())
        .then(pl.lit("reported"))
        .when(pl.col("simulated_cache_hit_tokens").is_not_null())
        .then(pl.lit("simulated"))
        .otherwise(pl.lit("none"))
        .alias("cache_hit_source"),
    ).with_columns((pl.col("recorded_input_tokens") - pl.col("cache_hit_tokens")).alias("fresh_input_tokens"))
    bad = acc.filter(
        (pl.col("reported_cache_hit_tokens") < 0)
        | (pl.col("reported_cache_hit_tokens") > pl.col("recorded_input_tokens"))
    )
    if bad.height:
        row = bad.row(0, named=True)
        raise RooftraceError(
            f"requests: request {row['request_id']!r} reports reported_cache_hit_tokens="
            f"{row['reported_cache_hit_tokens']} outside [0, recorded_input_tokens="
            f"{row['recorded_input_tokens']}] ({bad.height} such rows)"
        )
    acc = acc.select([c.name for c in load_schema("accounting_requests").columns])  # the table's own order

    minutes_df = minute_table(acc)
    curve = _curve_table(domain_data, grid, hits_grid, minutes, minute_idx, recorded, prompt_blocks, bs, opts)
    summary = _summary(acc, minutes_df, chains, chosen_blocks, opts)
    if opts.offload_gb:
        summary["offload"] = offload_rows(domain_data, recorded, bs, opts)
    return Accounting(acc, minutes_df, curve, summary, identity)


def offload_rows(
    domain_data: list[tuple[str, npt.NDArray[np.int64], prefix.Distances, int | None]],
    recorded: npt.NDArray[np.int64],
    bs: int,
    opts: ClassifyOptions,
) -> list[dict[str, Any]]:
    """Per model and lower-tier size of ``--offload-gb`` (and, with ``--shared-gb``, per store
    size below it): the GPU tier's hits (the ``--capacity`` cache), the write-through lower
    tier's, the store's, and the fresh prefill left (every request simulated, as the capacity
    curve counts them); the bytes each lower tier's hits load. Every tier on the model's one
    access sequence: one pass of stack distances gives every cell of the grid."""
    rows: list[dict[str, Any]] = []
    for model, idx, dist, gpu in domain_data:
        per_token = _kv_per_token(model, opts)
        if per_token is None:
            raise RooftraceError(
                f"--offload-gb: KV bytes per token of model {model!r} unknown (no catalog model of that name); "
                "pass --kv-model or --kv-bytes-per-token"
            )
        rec = int(recorded[idx].sum())
        for gb in opts.offload_gb:
            tier = offload.OffloadTier("cpu", float(gb), 1.0, 0.0)
            lower = tier.capacity_blocks(per_token, bs)
            if not opts.shared_gb:
                g, low = offload.tier_hits(dist, gpu, lower)
                gpu_tok, low_tok = int(g.sum()) * bs, int(low.sum()) * bs
                rows.append(
                    {
                        "model": model,
                        "offload_gb": float(gb),
                        "gpu_capacity_blocks": gpu,
                        "offload_capacity_blocks": lower,
                        "recorded_input_tokens": rec,
                        "gpu_hit_tokens": gpu_tok,
                        "offload_hit_tokens": low_tok,
                        "fresh_input_tokens": rec - gpu_tok - low_tok,
                        "offload_load_bytes": round(low_tok * per_token),
                        "requests_loading": int((low > 0).sum()),
                    }
                )
                continue
            assert gpu is not None  # (ClassifyOptions: --offload-gb needs a bounded --capacity)
            for sgb in opts.shared_gb:
                store = offload.OffloadTier("shared", float(sgb), 1.0, 0.0).capacity_blocks(per_token, bs)
                g, low, below = offload.tiers_hits(dist, gpu, [lower, store])
                gpu_tok, low_tok, sh_tok = (int(h.sum()) * bs for h in (g, low, below))
                rows.append(
                    {
                        "model": model,
                        "offload_gb": float(gb),
                        "shared_gb": float(sgb),
                        "gpu_capacity_blocks": gpu,
                        "offload_capacity_blocks": lower,
                        "shared_capacity_blocks": store,
                        "recorded_input_tokens": rec,
                        "gpu_hit_tokens": gpu_tok,
                        "offload_hit_tokens": low_tok,
                        "shared_hit_tokens": sh_tok,
                        "fresh_input_tokens": rec - gpu_tok - low_tok - sh_tok,
                        "offload_load_bytes": round(low_tok * per_token),
                        "shared_load_bytes": round(sh_tok * per_token),
                        "requests_loading": int(((low + below) > 0).sum()),
                        "requests_loading_shared": int((below > 0).sum()),
                    }
                )
    return rows


def minute_table(acc: pl.DataFrame) -> pl.DataFrame:
    """Per-minute sums and rates of the token family, overall and per model / tenant / both."""
    base = acc.with_columns(pl.col("arrival").dt.truncate("1m").alias("minute"))
    sums = [
        pl.len().cast(pl.Int64).alias("requests"),
        *(
            pl.col(c).sum().cast(pl.Int64).alias(c)
            for c in ("recorded_input_tokens", "cache_hit_tokens", "fresh_input_tokens", "output_tokens")
        ),
    ]
    parts = []
    for scope, keys in (
        ("all", []),
        ("model", ["model"]),
        ("tenant", ["tenant"]),
        ("model_tenant", ["model", "tenant"]),
    ):
        g = base.group_by(["minute", *keys]).agg(sums)
        for col in ("model", "tenant"):
            if col not in keys:
                g = g.with_columns(pl.lit(None, pl.String).alias(col))
        parts.append(g.with_columns(pl.lit(scope).alias("scope")))
    out = pl.concat([p.select(sorted(p.columns)) for p in parts], how="vertical")
    rates = [
        (pl.col(c) / 60.0).alias(f"{c}_per_s")
        for c in ("recorded_input_tokens", "cache_hit_tokens", "fresh_input_tokens", "output_tokens")
    ]
    inflation = (
        pl.when(pl.col("fresh_input_tokens") > 0)
        .then(pl.col("recorded_input_tokens") / pl.col("fresh_input_tokens"))
        .otherwise(None)
        .alias("inflation_ratio")
    )
    scope_order = pl.col("scope").replace_strict(
        {"all": 0, "model": 1, "tenant": 2, "model_tenant": 3}, return_dtype=pl.Int8
    )
    return (
        out.with_columns(*rates, inflation)
        .sort([scope_order, "model", "tenant", "minute"], nulls_last=False)
        .select(
            "minute",
            "scope",
            "model",
            "tenant",
            "requests",
            "recorded_input_tokens",
            "cache_hit_tokens",
            "fresh_input_tokens",
            "output_tokens",
            "recorded_input_tokens_per_s",
            "cache_hit_tokens_per_s",
            "fresh_input_tokens_per_s",
            "output_tokens_per_s",
            "inflation_ratio",
        )
    )


def _curve_table(
    domain_data: list[tuple[str, npt.NDArray[np.int64], prefix.Distances, int | None]],
    grid: npt.NDArray[np.int64],
    hits_grid: npt.NDArray[np.int64],
    minutes: npt.NDArray[np.int64],
    minute_idx: npt.NDArray[np.int64],
    recorded: npt.NDArray[np.int64],
    prompt_blocks: npt.NDArray[np.int64],
    bs: int,
    opts: ClassifyOptions,
) -> pl.DataFrame:
    n_min = minutes.shape[0]
    caps: list[int | None] = [*grid.tolist(), None]
    rows: list[dict[str, Any]] = []

    def add_rows(
        model: str | None,
        n_req: int,
        blocks: int,
        rec_min: npt.NDArray[np.int64],
        hits: npt.NDArray[np.int64],
        per_token: float | None,
    ) -> None:
        rec_total = int(rec_min.sum())
        for g, cap in enumerate(caps):
            hit_min = hits[:, g] * bs
            fresh_min = rec_min - hit_min
            hit_b = int(hits[:, g].sum())
            peak = int(np.argmax(fresh_min)) if n_min else -1
            rows.append(
                {
                    "model": model,
                    "capacity_blocks": cap,
                    "capacity_tokens": None if cap is None else cap * bs,
                    "capacity_bytes": None if cap is None or per_token is None else round(cap * bs * per_token),
                    "block_size_tokens": bs,
                    "ttl_s": opts.ttl_s,
                    "requests": n_req,
                    "prompt_blocks": blocks,
                    "hit_blocks": hit_b,
                    "block_hit_fraction": hit_b / blocks if blocks else None,
                    "recorded_input_tokens": rec_total,
                    "cache_hit_tokens": hit_b * bs,
                    "token_hit_fraction": hit_b * bs / rec_total if rec_total else None,
                    "fresh_input_tokens": rec_total - hit_b * bs,
                    "peak_minute": int(minutes[peak]) if peak >= 0 else None,
                    "peak_fresh_input_tokens_per_s": float(fresh_min[peak]) / 60.0 if peak >= 0 else 0.0,
                }
            )

    total_rec = np.zeros(n_min, dtype=np.int64)
    for k, (model, rows_idx, _, _) in enumerate(domain_data):
        rec_min = np.bincount(minute_idx[rows_idx], weights=recorded[rows_idx], minlength=n_min).astype(np.int64)
        total_rec += rec_min
        add_rows(
            model,
            rows_idx.shape[0],
            int(prompt_blocks[rows_idx].sum()),
            rec_min,
            hits_grid[k],
            _kv_per_token(model, opts),
        )
    if len(domain_data) > 1:
        add_rows(
            None,
            int(recorded.shape[0]),
            int(prompt_blocks.sum()),
            total_rec,
            hits_grid.sum(axis=0),
            None,
        )
    frame = pl.DataFrame(rows, schema=_CURVE_SCHEMA, orient="row") if rows else pl.DataFrame(schema=_CURVE_SCHEMA)
    return frame.with_columns(pl.col("peak_minute").cast(pl.Datetime("us", "UTC")))


_CURVE_SCHEMA: dict[str, Any] = {
    "model": pl.String,
    "capacity_blocks": pl.Int64,
    "capacity_tokens": pl.Int64,
    "capacity_bytes": pl.Int64,
    "block_size_tokens": pl.Int64,
    "ttl_s": pl.Float64,
    "requests": pl.Int64,
    "prompt_blocks": pl.Int64,
    "hit_blocks": pl.Int64,
    "block_hit_fraction": pl.Float64,
    "recorded_input_tokens": pl.Int64,
    "cache_hit_tokens": pl.Int64,
    "token_hit_fraction": pl.Float64,
    "fresh_input_tokens": pl.Int64,
    "peak_minute": pl.Int64,
    "peak_fresh_input_tokens_per_s": pl.Float64,
}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _summary(
    acc: pl.DataFrame,
    minutes: pl.DataFrame,
    chains: prefix.Chains,
    chosen_blocks: dict[str, int | None],
    opts: ClassifyOptions,
) -> dict[str, Any]:
    tot = acc.select(
        pl.len().alias("requests"),
        *(
            pl.col(c).sum().cast(pl.Int64).alias(c)
            for c in ("recorded_input_tokens", "cache_hit_tokens", "fresh_input_tokens", "output_tokens")
        ),
    ).row(0, named=True)
    by_source = {
        str(r["cache_hit_source"]): {"requests": int(r["requests"]), "cache_hit_tokens": int(r["tokens"])}
        for r in acc.group_by("cache_hit_source")
        .agg(pl.len().alias("requests"), pl.col("cache_hit_tokens").sum().alias("tokens"))
        .iter_rows(named=True)
    }
    prefix_sources = {
        str(r["prefix_source"]): int(r["n"])
        for r in acc.group_by("prefix_source").agg(pl.len().alias("n")).iter_rows(named=True)
    }
    sim = acc.filter(pl.col("simulated_cache_hit_tokens").is_not_null())
    sim_rec = int(sim.get_column("recorded_input_tokens").sum())
    sim_hit = int(sim.get_column("simulated_cache_hit_tokens").sum())
    sim_blocks = int(sim.get_column("prefix_blocks").sum())
    sim_hit_blocks = int(sim.get_column("simulated_hit_blocks").sum())
    both = acc.filter(
        pl.col("reported_cache_hit_tokens").is_not_null() & pl.col("simulated_cache_hit_tokens").is_not_null()
    )
    overall = minutes.filter(pl.col("scope") == "all")
    peak: dict[str, Any] = {}
    if overall.height:
        top = overall.sort(["fresh_input_tokens", "minute"], descending=[True, False]).row(0, named=True)
        peak = {
            "minute": top["minute"].isoformat(),
            "fresh_input_tokens_per_s": top["fresh_input_tokens_per_s"],
            "recorded_input_tokens_per_s": top["recorded_input_tokens_per_s"],
            "output_tokens_per_s": top["output_tokens_per_s"],
        }
    return {
        "requests": int(tot["requests"]),
        "block_size_tokens": chains.block_size,
        "isolation": list(opts.isolation),
        "capacity": opts.capacity.describe(),
        "capacity_blocks": chosen_blocks,
        "ttl_s": opts.ttl_s,
        "recorded_input_tokens": int(tot["recorded_input_tokens"] or 0),
        "cache_hit_tokens": int(tot["cache_hit_tokens"] or 0),
        "fresh_input_tokens": int(tot["fresh_input_tokens"] or 0),
        "output_tokens": int(tot["output_tokens"] or 0),
        "inflation_ratio": _ratio(tot["recorded_input_tokens"] or 0, tot["fresh_input_tokens"] or 0),
        "cache_hit_source": by_source,
        "prefix_source": prefix_sources,
        "simulated": {
            "requests": sim.height,
            "token_hit_fraction": _ratio(sim_hit, sim_rec),
            "block_hit_fraction": _ratio(sim_hit_blocks, sim_blocks),
        },
        "reported_vs_simulated": {
            "requests": both.height,
            "reported_cache_hit_tokens": int(both.get_column("reported_cache_hit_tokens").sum()),
            "simulated_cache_hit_tokens": int(both.get_column("simulated_cache_hit_tokens").sum()),
        },
        "peak_minute": peak,
    }


@dataclass(frozen=True)
class ClassifySummary:
    """What ``rooftrace classify`` prints: the date, the files written and :func:`account`'s summary."""

    date: str
    paths: dict[str, str]
    totals: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def classify_totals(store: Store, date: str) -> dict[str, Any] | None:
    """The totals classify recorded for ``date`` (its summary.json: requests, the token family,
    where the hits came from, block size, capacity), or None when the date is not classified or
    the file cannot be read. The one reader of that file for the other stages."""
    try:
        doc = json.loads(accounting_paths(store, date)["summary"].read_text())
    except (OSError, ValueError):
        return None
    totals = doc.get("totals") if isinstance(doc, dict) else None
    return totals if isinstance(totals, dict) else None


def accounting_paths(store: Store, date: str) -> dict[str, Path]:
    base = store.accounting_dir
    return {
        "requests": store.partition(base / "requests", date) / "part-0.parquet",
        "minutes": store.partition(base / "minutes", date) / "part-0.parquet",
        "cache_curve": store.partition(base / "cache_curve", date) / "part-0.parquet",
        "prefix_identity": identity_path(store, date),
        "summary": store.partition(base / "summary", date) / "summary.json",
    }


def identity_path(store: Store, date: str) -> Path:
    """Where ``classify`` keeps the date's prefix identity (schema ``prefix_identity``)."""
    return store.partition(store.accounting_dir / "prefix_identity", date) / "part-0.parquet"


def identity_table(identity: prefix.PrefixIdentity) -> pa.Table:
    n = identity.n_requests
    return pa.table(
        {
            "request_key": identity.request_key,
            "block_key": identity.key,
            "parent": identity.parent,
            "shared_tokens": identity.shared,
            "prompt_tokens": identity.prompt,
            "cached_tokens": identity.cached,
            "prefix_source": np.asarray(prefix.SOURCE_NAMES)[identity.source],
            "isolation": pa.array([json.dumps(list(identity.isolation))] * n, pa.string()),
            "log_block_size": pa.array([identity.log_block_size] * n, pa.int32()),
        }
    )


def load_identity(store: Store, date: str) -> prefix.PrefixIdentity | None:
    """The prefix identity ``classify`` stored for ``date`` (None before classify), so that the
    replay's engine caches share exactly what the day's accounting shares and nothing is
    rebuilt. A damaged file is a one-line error naming it."""
    path = identity_path(store, date)
    if not path.is_file():
        return None
    try:
        t = read_parquet(path, "prefix_identity")
        log_bs = t.column("log_block_size")
        keys = _isolation_keys(t.column("isolation"))
        names = t.column("prefix_source")
        codes = pc.index_in(names, value_set=pa.array(prefix.SOURCE_NAMES, names.type))
        if codes.null_count:
            unknown = pc.unique(pc.filter(names, pc.is_null(codes))).to_pylist()
            raise RooftraceError(f"unknown prefix_source in {sorted(map(str, unknown))}")
        identity = prefix.PrefixIdentity(
            request_key=_u64(t, "request_key"),
            key=_u64(t, "block_key"),
            parent=_i64(t, "parent"),
            shared=_i64(t, "shared_tokens"),
            prompt=_i64(t, "prompt_tokens"),
            cached=_i64(t, "cached_tokens"),
            source=np.asarray(codes.to_numpy(), np.int8),
            log_block_size=log_bs[0].as_py() if len(log_bs) else None,
            isolation=tuple(keys),
        )
        identity.check()
    except (RooftraceError, OSError, ValueError, pa.ArrowException) as exc:
        raise RooftraceError(
            f"{path}: not a usable prefix identity ({exc}); run `rooftrace classify --date {date}` again"
        ) from None
    return identity


def _isolation_keys(iso: pa.ChunkedArray) -> tuple[str, ...]:
    keys: Any = json.loads(iso[0].as_py()) if len(iso) else list(prefix.DEFAULT_ISOLATION)
    if not isinstance(keys, list) or not all(k in prefix.ISOLATION_COLUMNS for k in keys):
        raise RooftraceError(f"isolation {keys!r} is not a list of isolation columns")
    return tuple(keys)


def stored_isolation(store: Store, date: str) -> tuple[str, ...]:
    """The isolation key classify used for ``date`` (the default before classify), read from the
    stored identity's first row only."""
    path = identity_path(store, date)
    if not path.is_file():
        return prefix.DEFAULT_ISOLATION
    try:
        fh = pq.ParquetFile(path)
        if not fh.metadata.num_rows:
            return prefix.DEFAULT_ISOLATION
        return _isolation_keys(fh.read_row_group(0, columns=["isolation"]).column(0))
    except (RooftraceError, OSError, ValueError, KeyError, pa.ArrowException) as exc:
        raise RooftraceError(
            f"{path}: not a usable prefix identity ({exc}); run `rooftrace classify --date {date}` again"
        ) from None


def day_identity(
    store: Store, date: str, requests: pl.DataFrame, say: Callable[[str], None] | None = None
) -> prefix.PrefixIdentity:
    """The prefix identity to replay ``requests`` (the date's, as the store returns them) with:
    the one classify stored when it covers them, else one built now with classify's isolation
    key (or the default before classify), saying why when a stored one is out of date. A frame
    of only some columns will do (request_id and recorded_input_tokens at least): the date is
    read again, whole, when the identity must be built."""
    stored = load_identity(store, date)
    if stored is not None and stored.rows_of(requests) is not None:
        return stored
    if stored is not None and say is not None:
        say(
            f"the prefix identity classify stored for {date} does not match its requests (ingested again "
            f"since?): rebuilt for this run; `rooftrace classify --date {date}` stores a current one"
        )
    if not set(load_schema("requests").names) <= set(requests.columns):
        requests = store.read_requests(date)
    return prefix.build_identity(requests, stored.isolation if stored is not None else prefix.DEFAULT_ISOLATION)


def _u64(t: pa.Table, name: str) -> prefix.U64Array:
    return np.ascontiguousarray(t.column(name).to_numpy(), dtype=np.uint64)


def _i64(t: pa.Table, name: str) -> prefix.I64Array:
    return np.ascontiguousarray(t.column(name).to_numpy(), dtype=np.int64)


def classify_tokens(
    store: Store,
    date: str | None = None,
    *,
    block_size: int = 512,
    capacity: Capacity | str | None = None,
    isolation: Sequence[str] = prefix.DEFAULT_ISOLATION,
    ttl_s: float | None = None,
    kv_bytes_per_token: float | None = None,
    kv_model: str | None = None,
    kv_dtype: str = "bf16",
    offload_gb: Sequence[float] = (),
    shared_gb: Sequence[float] = (),
) -> ClassifySummary:
    """Classify one date of ``store`` (the latest when ``date`` is None) and write its tables."""
    cap = capacity if isinstance(capacity, Capacity) else parse_capacity(capacity)
    prefix.check_isolation(isolation)  # before the day is read
    opts = ClassifyOptions(
        block_size,
        cap,
        tuple(isolation),
        ttl_s,
        kv_bytes_per_token,
        kv_model,
        kv_dtype,
        tuple(offload_gb),
        tuple(shared_gb),
    )
    day = store.resolve_date(date)
    requests = store.read_requests(day)
    check_classify_memory(requests, block_size)  # before the chains are built, not when memory runs out
    result = account(requests, opts)
    paths = accounting_paths(store, day)
    with store.lock():
        write_parquet(result.requests.to_arrow(), paths["requests"], "accounting_requests")
        write_parquet(result.minutes.to_arrow(), paths["minutes"], "accounting_minutes")
        write_parquet(result.curve.to_arrow(), paths["cache_curve"], "cache_curve")
        write_parquet(identity_table(result.identity), paths["prefix_identity"], "prefix_identity")
        doc = {"date": day, "options": _options_json(opts), "totals": result.summary}
        atomic_write_bytes(paths["summary"], (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    return ClassifySummary(day, {k: str(v) for k, v in paths.items()}, result.summary)


def _options_json(opts: ClassifyOptions) -> dict[str, Any]:
    out = asdict(opts)
    out["capacity"] = opts.capacity.describe()
    if opts.offload_gb:
        out["offload_gb"] = list(opts.offload_gb)
    else:  # unset: a day classified before it keeps the same summary bytes
        del out["offload_gb"]
    if opts.shared_gb:
        out["shared_gb"] = list(opts.shared_gb)
    else:  # unset: a day classified before it keeps the same summary bytes
        del out["shared_gb"]
    return out
