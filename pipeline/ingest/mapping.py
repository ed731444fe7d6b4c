"""Generic inputs (CSV, JSON Lines, Parquet) through a small TOML column mapping.

Example ``mapping.toml``::

    format = "jsonl"                 # csv | jsonl | parquet
    source_format = "gateway"        # label stored in requests.source_format (default: format)
    time_unit = "ms"                 # auto | s | ms | us | ns | iso | relative_s | relative_ms
    input_excludes_cache = false     # true when input counts exclude cache reads/writes
    block_size = 16                  # tokens per prefix hash block, when hashes are mapped

    [fields]                         # canonical field = source column (dotted path into JSON)
    request_id = "id"
    arrival = "ts"
    model = "model"
    recorded_input_tokens = "usage.input"
    output_tokens = "usage.output"
    cache_hit_tokens = "usage.cached"
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.errors import ConfigError
from pipeline.ingest.formats import Context, FormatSpec, Layout, candidate, path
from pipeline.ingest.timeparse import TIME_KINDS, parse_time

#: canonical field -> candidate column
FIELD_TO_CANDIDATE = {
    "request_id": "request_id",
    "arrival": "arrival_raw",
    "model": "model",
    "tenant": "tenant",
    "session_id": "session_id",
    "adapter": "adapter",
    "status": "status",
    "recorded_input_tokens": "input_raw",
    "cache_hit_tokens": "cache_read_raw",
    "cache_write_tokens": "cache_write_raw",
    "output_tokens": "output_raw",
    "reasoning_tokens": "reasoning_raw",
    "ttft_s": "ttft_raw",
    "e2e_s": "e2e_raw",
    "prefix_block_hashes": "hashes",
}
_REQUIRED = ("arrival", "recorded_input_tokens", "output_tokens")
_TOP_KEYS = {"format", "source_format", "time_unit", "input_excludes_cache", "block_size", "fields"}


def _layout(paths: dict[str, str]) -> Layout:
    root: dict[str, Any] = {}
    for canonical, dotted in paths.items():
        parts = dotted.split(".")
        node = root
        for part in parts[:-1]:
            sub = node.setdefault(part, {})
            if not isinstance(sub, dict):
                raise ConfigError(f"mapping: {dotted!r} nests under a column also mapped as a value")
            node = sub
        if isinstance(node.get(parts[-1]), dict):
            raise ConfigError(f"mapping: {dotted!r} is also used as a parent path")
        node[parts[-1]] = "list" if canonical == "prefix_block_hashes" else None
    return root


def load_mapping(file: Path, forced_format: str | None) -> FormatSpec:
    try:
        with file.open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read mapping ({exc})") from None
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{file}: unknown keys {sorted(unknown)}; allowed {sorted(_TOP_KEYS)}")
    fields = data.get("fields")
    if not isinstance(fields, dict):
        raise ConfigError(f"{file}: missing [fields] table")
    bad = set(fields) - set(FIELD_TO_CANDIDATE)
    if bad:
        raise ConfigError(f"{file}: unknown fields {sorted(bad)}; allowed {sorted(FIELD_TO_CANDIDATE)}")
    missing = [f for f in _REQUIRED if f not in fields]
    if missing:
        raise ConfigError(f"{file}: [fields] must map {missing}")
    for k, v in fields.items():
        if not isinstance(v, str) or not v:
            raise ConfigError(f"{file}: fields.{k} must be a non-empty column name")
    fmt = forced_format or data.get("format")
    if fmt not in ("csv", "jsonl", "parquet"):
        raise ConfigError(f"{file}: format must be csv, jsonl or parquet (got {fmt!r})")
    kind = data.get("time_unit", "auto")
    if kind not in TIME_KINDS:
        raise ConfigError(f"{file}: time_unit must be one of {TIME_KINDS} (got {kind!r})")
    block = data.get("block_size")
    if block is not None and (not isinstance(block, int) or block <= 0):
        raise ConfigError(f"{file}: block_size must be a positive integer")
    excludes = data.get("input_excludes_cache", False)
    if not isinstance(excludes, bool):
        raise ConfigError(f"{file}: input_excludes_cache must be true or false")
    label = str(data.get("source_format", fmt))
    paths = {k: str(v) for k, v in fields.items()}
    if fmt == "csv":
        # CSV columns are flat: a dotted name is a column name, not a path.
        layout: Layout = {v: ("list" if k == "prefix_block_hashes" else None) for k, v in paths.items()}
    else:
        layout = _layout(paths)

    def expr_for(canonical: str) -> pl.Expr:
        p = paths[canonical]
        return pl.col(p) if fmt == "csv" else path(p)

    def normalize(raw: pl.DataFrame, ctx: Context) -> pl.DataFrame:
        exprs = {FIELD_TO_CANDIDATE[k]: expr_for(k) for k in paths if k != "arrival"}
        if "hashes" in exprs and fmt == "csv":
            # CSV: hashes as a space/semicolon separated list in one column.
            exprs["hashes"] = exprs["hashes"].str.strip_chars().str.split(" ")
        if "hashes" in exprs:
            exprs["block_size"] = pl.when(exprs["hashes"].is_not_null()).then(pl.lit(block or 16))
        ts = expr_for("arrival")
        return candidate(raw, exprs, parse_time(ts, kind, ctx.anchor_date), ts)

    labels = {FIELD_TO_CANDIDATE[k]: v for k, v in paths.items()}
    labels["arrival"] = paths["arrival"]
    return FormatSpec(
        name=label,
        kind=fmt,
        layout=layout,
        normalize=normalize,
        labels=labels,
        input_excludes_cache=excludes,
        relative_time=kind.startswith("relative"),
        required_columns=tuple(v.lower() for v in paths.values()) if fmt == "csv" else (),
    )
