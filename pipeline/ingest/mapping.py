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

from pathlib import Path

import polars as pl

from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.ingest.formats import Context, FormatSpec, to_candidate
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
#: Tokens per prefix hash block at most (a 32-bit column; real logs use 16 to 512).
MAX_BLOCK_SIZE = 1 << 24
#: The mapping file's keys (declared with their types as ``MappingFile`` in pipeline/common/tomlschema.py).
_TOP_KEYS = {"format", "source_format", "time_unit", "input_excludes_cache", "block_size", "fields"}


def load_mapping(file: Path, forced_format: str | None) -> FormatSpec:
    from pipeline.common.tomlschema import MappingFile, check  # lazy: pydantic, loaded only when a file is read

    data = read_toml(file, "mapping")
    # keys and types: [fields] maps each canonical field it names to a non-empty column name,
    # arrival, recorded_input_tokens and output_tokens among them
    check(data, MappingFile, str(file))
    fields = data["fields"]
    fmt = forced_format or data.get("format")
    if fmt not in ("csv", "jsonl", "parquet"):
        raise ConfigError(f"{file}: format must be csv, jsonl or parquet (got {fmt!r})")
    kind = data.get("time_unit", "auto")
    if kind not in TIME_KINDS:
        raise ConfigError(f"{file}: time_unit must be one of {TIME_KINDS} (got {kind!r})")
    block = data.get("block_size")
    if block is not None and not 0 < block <= MAX_BLOCK_SIZE:
        raise ConfigError(f"{file}: block_size must be an integer in 1..{MAX_BLOCK_SIZE:,} (tokens per hash block)")
    excludes = data.get("input_excludes_cache", False)
    label = str(data.get("source_format", fmt))
    fields_map = {FIELD_TO_CANDIDATE[k]: (str(v),) for k, v in fields.items()}
    # The arrival column is read raw and parsed in post().
    fields_map["arrival_raw"] = fields_map.pop("arrival_raw")

    def post(flat: pl.DataFrame, ctx: Context) -> pl.DataFrame:
        out = flat.with_columns(arrival=parse_time(pl.col("arrival_raw"), kind, ctx.anchor_date))
        if "hashes" in flat.columns:
            if fmt == "csv":
                # CSV: the hash chain is one column of space-separated integers.
                out = out.with_columns(pl.col("hashes").str.strip_chars().str.split(" "))
            out = out.with_columns(block_size=pl.when(pl.col("hashes").is_not_null()).then(pl.lit(block or 16)))
        return to_candidate(out)

    labels = {FIELD_TO_CANDIDATE[k]: str(v) for k, v in fields.items()}
    labels["arrival"] = str(fields["arrival"])
    return FormatSpec(
        name=label,
        kind=fmt,
        fields=fields_map,
        post=post,
        labels=labels,
        list_fields=frozenset({"hashes"}) if ("prefix_block_hashes" in fields and fmt != "csv") else frozenset(),
        input_excludes_cache=excludes,
        relative_time=kind.startswith("relative"),
        required_columns=tuple(str(v).lower() for v in fields.values()) if fmt == "csv" else (),
        mapped=True,
    )
