"""Per-format knowledge: the raw layout to parse and how it maps onto the canonical request.

A format is data: a raw layout (nested field names; every leaf is read as text so a wrong type
becomes a per-record reason, not a failed batch) and a function from the raw polars frame to the
*candidate* frame below. Validation, typing and quarantine are shared (``normalize.py``).

Candidate columns (all String unless noted; null = absent in the log):
``request_id, arrival (Datetime us UTC), arrival_raw, model, tenant, session_id, adapter, status,
input_raw, cache_read_raw, cache_write_raw, output_raw, reasoning_raw, ttft_raw, e2e_raw,
hashes (List[String]), block_size (Int32)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipeline.ingest.timeparse import parse_time

#: A raw layout: field name -> None (text leaf), "list" (list of text) or a nested layout.
Layout = Mapping[str, Any]

CANDIDATE_TEXT = (
    "request_id",
    "arrival_raw",
    "model",
    "tenant",
    "session_id",
    "adapter",
    "status",
    "input_raw",
    "cache_read_raw",
    "cache_write_raw",
    "output_raw",
    "reasoning_raw",
    "ttft_raw",
    "e2e_raw",
)


@dataclass(frozen=True)
class Context:
    """What a normaliser may need beyond the raw rows."""

    anchor_date: str | None  # --date, for relative timestamps
    time_kind: str = "auto"


@dataclass(frozen=True)
class FormatSpec:
    name: str
    kind: str  # "jsonl", "csv", "otel", "parquet"
    layout: Layout
    normalize: Callable[[pl.DataFrame, Context], pl.DataFrame]
    #: Source field names for messages, keyed by candidate column.
    labels: Mapping[str, str]
    #: True when the log's input count excludes cache reads and writes (Anthropic).
    input_excludes_cache: bool = False
    #: True when timestamps are relative to an unknown start, so --date is required.
    relative_time: bool = False
    #: Required CSV header columns (lower-cased), to fail fast on a wrongly forced format.
    required_columns: tuple[str, ...] = field(default_factory=tuple)
    #: Values for layout columns that a CSV header lacks altogether (not for empty cells).
    absent_defaults: Mapping[str, str] = field(default_factory=dict)


def polars_schema(layout: Layout) -> dict[str, pl.DataType]:
    out: dict[str, pl.DataType] = {}
    for name, sub in layout.items():
        if sub is None:
            out[name] = pl.String()
        elif sub == "list":
            out[name] = pl.List(pl.String())
        else:
            out[name] = pl.Struct(polars_schema(sub))
    return out


def duckdb_type(sub: Any) -> str:
    if sub is None:
        return "VARCHAR"
    if sub == "list":
        return "VARCHAR[]"
    inner = ", ".join(f'"{k}" {duckdb_type(v)}' for k, v in sub.items())
    return f"STRUCT({inner})"


def duckdb_columns(layout: Layout) -> str:
    """The ``columns=`` argument of DuckDB's read_json for a layout."""
    items = ", ".join(f"'{k}': '{duckdb_type(v)}'" for k, v in layout.items())
    return "{" + items + "}"


def path(dotted: str) -> pl.Expr:
    """``a.b.c`` -> pl.col("a").struct.field("b").struct.field("c")."""
    head, *rest = dotted.split(".")
    expr = pl.col(head)
    for part in rest:
        expr = expr.struct.field(part)
    return expr


def first(*dotted: str) -> pl.Expr:
    """The first non-null, non-empty of several raw paths."""
    exprs = [pl.when(path(d).str.len_bytes() > 0).then(path(d)) for d in dotted]
    return pl.coalesce(exprs) if len(exprs) > 1 else exprs[0]


def _none() -> pl.Expr:
    return pl.lit(None, dtype=pl.String)


def candidate(
    raw: pl.DataFrame, exprs: Mapping[str, pl.Expr], arrival: pl.Expr, arrival_raw: pl.Expr
) -> pl.DataFrame:
    """Build the candidate frame; missing text columns become null."""
    cols = [exprs.get(name, _none()).cast(pl.String).alias(name) for name in CANDIDATE_TEXT]
    cols = [c for c in cols if c.meta.output_name() != "arrival_raw"]
    hashes = exprs.get("hashes", pl.lit(None, dtype=pl.List(pl.String)))
    block = exprs.get("block_size", pl.lit(None, dtype=pl.Int32))
    return raw.select(
        *cols,
        arrival_raw.cast(pl.String).alias("arrival_raw"),
        arrival.alias("arrival"),
        hashes.alias("hashes"),
        block.cast(pl.Int32).alias("block_size"),
    )


# --- OpenAI -------------------------------------------------------------------------------------
# Chat Completions object, Responses object, Batch API output line
# ({"custom_id", "response": {"status_code", "request_id", "body": <object>}, "error"}), or a
# logged pair ({"request": {...}, "response": <object>, "timestamp"?}).

_OPENAI_USAGE = {
    "prompt_tokens": None,
    "completion_tokens": None,
    "input_tokens": None,
    "output_tokens": None,
    "prompt_tokens_details": {"cached_tokens": None},
    "input_tokens_details": {"cached_tokens": None},
    "completion_tokens_details": {"reasoning_tokens": None},
    "output_tokens_details": {"reasoning_tokens": None},
}
_OPENAI_OBJECT = {
    "id": None,
    "object": None,
    "created": None,
    "created_at": None,
    "model": None,
    "status": None,
    "usage": _OPENAI_USAGE,
}
_META = {"session_id": None, "conversation_id": None, "tenant": None, "user": None}
OPENAI_LAYOUT: Layout = {
    **_OPENAI_OBJECT,
    "user": None,
    "custom_id": None,
    "timestamp": None,
    "ttft_s": None,
    "e2e_s": None,
    "metadata": _META,
    "error": {"message": None, "code": None},
    "request": {"model": None, "user": None, "metadata": _META},
    "response": {**_OPENAI_OBJECT, "status_code": None, "request_id": None, "body": _OPENAI_OBJECT},
}

_OBJ_PREFIXES = ("response.body.", "response.", "")


def _obj(suffix: str) -> pl.Expr:
    return first(*(p + suffix for p in _OBJ_PREFIXES))


def _openai(raw: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    created = _obj("created")
    created_at = _obj("created_at")
    ts = first("timestamp")
    # A logger's own timestamp (sub-second) beats `created` (whole seconds in the API object).
    arrival = pl.coalesce(parse_time(ts, "auto"), parse_time(created, "s"), parse_time(created_at, "s"))
    status = pl.when(path("error.message").is_not_null()).then(pl.lit("error"))
    exprs = {
        "request_id": first("response.body.id", "response.id", "id", "custom_id"),
        "model": first("response.body.model", "response.model", "model", "request.model"),
        "tenant": first("request.user", "user", "metadata.tenant", "request.metadata.tenant"),
        "session_id": first(
            "metadata.session_id",
            "request.metadata.session_id",
            "metadata.conversation_id",
            "request.metadata.conversation_id",
        ),
        "status": pl.coalesce(status, first("response.status_code", "response.body.status", "status")),
        "input_raw": pl.coalesce(_obj("usage.prompt_tokens"), _obj("usage.input_tokens")),
        "cache_read_raw": pl.coalesce(
            _obj("usage.prompt_tokens_details.cached_tokens"),
            _obj("usage.input_tokens_details.cached_tokens"),
        ),
        "output_raw": pl.coalesce(_obj("usage.completion_tokens"), _obj("usage.output_tokens")),
        "reasoning_raw": pl.coalesce(
            _obj("usage.completion_tokens_details.reasoning_tokens"),
            _obj("usage.output_tokens_details.reasoning_tokens"),
        ),
        "ttft_raw": first("ttft_s"),
        "e2e_raw": first("e2e_s"),
    }
    return candidate(raw, exprs, arrival, pl.coalesce(ts, created, created_at))


# --- Anthropic ----------------------------------------------------------------------------------
# Messages response (a log line may add "timestamp"/"created_at"), a logged pair
# ({"timestamp", "request": {...}, "response": <message>}), or a Message Batches result line
# ({"custom_id", "result": {"type", "message": <message>}}). input_tokens EXCLUDES cache reads and
# cache writes (Anthropic prompt-caching docs), so recorded = input + read + creation.

_ANTH_USAGE = {
    "input_tokens": None,
    "output_tokens": None,
    "cache_creation_input_tokens": None,
    "cache_read_input_tokens": None,
}
_ANTH_MESSAGE = {"id": None, "type": None, "model": None, "stop_reason": None, "usage": _ANTH_USAGE}
ANTHROPIC_LAYOUT: Layout = {
    **_ANTH_MESSAGE,
    "timestamp": None,
    "created_at": None,
    "custom_id": None,
    "session_id": None,
    "tenant": None,
    "ttft_s": None,
    "e2e_s": None,
    "metadata": {"user_id": None, "session_id": None},
    "request": {"model": None, "metadata": {"user_id": None, "session_id": None}},
    "response": _ANTH_MESSAGE,
    "result": {"type": None, "message": _ANTH_MESSAGE},
}
_ANTH_PREFIXES = ("response.", "result.message.", "")


def _anth(suffix: str) -> pl.Expr:
    return first(*(p + suffix for p in _ANTH_PREFIXES))


def _anthropic(raw: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    ts = first("timestamp", "created_at")
    exprs = {
        "request_id": first("response.id", "result.message.id", "id", "custom_id"),
        "model": first("response.model", "result.message.model", "model", "request.model"),
        "tenant": first("tenant", "request.metadata.user_id", "metadata.user_id"),
        "session_id": first("session_id", "request.metadata.session_id", "metadata.session_id"),
        "status": first("result.type", "response.stop_reason", "stop_reason"),
        "input_raw": _anth("usage.input_tokens"),
        "cache_read_raw": _anth("usage.cache_read_input_tokens"),
        "cache_write_raw": _anth("usage.cache_creation_input_tokens"),
        "output_raw": _anth("usage.output_tokens"),
        "ttft_raw": first("ttft_s"),
        "e2e_raw": first("e2e_s"),
    }
    return candidate(raw, exprs, parse_time(ts, "auto"), ts)


# --- LiteLLM SpendLogs --------------------------------------------------------------------------
LITELLM_LAYOUT: Layout = {
    "request_id": None,
    "startTime": None,
    "endTime": None,
    "completionStartTime": None,
    "model": None,
    "model_group": None,
    "user": None,
    "team_id": None,
    "end_user": None,
    "session_id": None,
    "prompt_tokens": None,
    "completion_tokens": None,
    "status": None,
    "metadata": None,  # JSON text (CSV) or object read as text
}


def _litellm(raw: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    start = parse_time(first("startTime"), "auto")
    end = parse_time(first("endTime"), "auto")
    first_tok = parse_time(first("completionStartTime"), "auto")
    meta = pl.col("metadata")
    cached = pl.coalesce(
        meta.str.json_path_match("$.usage_object.prompt_tokens_details.cached_tokens"),
        meta.str.json_path_match("$.additional_usage_values.prompt_tokens_details.cached_tokens"),
        meta.str.json_path_match("$.usage_object.cache_read_input_tokens"),
    )
    exprs = {
        "request_id": first("request_id"),
        "model": first("model", "model_group"),
        "tenant": first("team_id", "user", "end_user"),
        "session_id": first("session_id"),
        "status": first("status"),
        "input_raw": first("prompt_tokens"),
        "cache_read_raw": cached,
        "output_raw": first("completion_tokens"),
        "ttft_raw": ((first_tok - start).dt.total_microseconds() / 1e6).cast(pl.String),
        "e2e_raw": ((end - start).dt.total_microseconds() / 1e6).cast(pl.String),
    }
    return candidate(raw, exprs, start, first("startTime"))


# --- Public traces ------------------------------------------------------------------------------
AZURE_LAYOUT: Layout = {"TIMESTAMP": None, "ContextTokens": None, "GeneratedTokens": None}


def _azure(raw: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    # No time zone in the trace (SOURCE.md): read as UTC.
    ts = first("TIMESTAMP")
    exprs = {"input_raw": first("ContextTokens"), "output_raw": first("GeneratedTokens")}
    return candidate(raw, exprs, parse_time(ts, "iso"), ts)


MOONCAKE_LAYOUT: Layout = {
    "timestamp": None,
    "input_length": None,
    "output_length": None,
    "hash_ids": "list",
}
#: Mooncake hash_ids cover 512-token blocks (FAST'25 release README).
MOONCAKE_BLOCK_TOKENS = 512


def _mooncake(raw: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    ts = first("timestamp")
    exprs = {
        "input_raw": first("input_length"),
        "output_raw": first("output_length"),
        "hashes": pl.col("hash_ids"),
        "block_size": pl.when(pl.col("hash_ids").is_not_null()).then(pl.lit(MOONCAKE_BLOCK_TOKENS)),
    }
    return candidate(raw, exprs, parse_time(ts, "relative_ms", ctx.anchor_date), ts)


VIDUR_LAYOUT: Layout = {"arrived_at": None, "num_prefill_tokens": None, "num_decode_tokens": None}


def _vidur(raw: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    ts = first("arrived_at")
    exprs = {"input_raw": first("num_prefill_tokens"), "output_raw": first("num_decode_tokens")}
    return candidate(raw, exprs, parse_time(ts, "relative_s", ctx.anchor_date), ts)


# --- OpenTelemetry GenAI spans (flattened by otel.py into these text columns) ---------------------
OTEL_LAYOUT: Layout = {
    "span_id": None,
    "trace_id": None,
    "start": None,
    "end": None,
    "gen_ai.response.id": None,
    "gen_ai.request.model": None,
    "gen_ai.response.model": None,
    "gen_ai.usage.input_tokens": None,
    "gen_ai.usage.output_tokens": None,
    "gen_ai.usage.cache_read.input_tokens": None,
    "gen_ai.usage.cache_creation.input_tokens": None,
    "gen_ai.usage.reasoning.output_tokens": None,
    "gen_ai.conversation.id": None,
    "tenant": None,
    "status": None,
    "ttft_s": None,
}


def _otel(raw: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    start = parse_time(pl.col("start"), "ns")
    end = parse_time(pl.col("end"), "ns")
    exprs = {
        "request_id": pl.coalesce(pl.col("gen_ai.response.id"), pl.col("trace_id") + ":" + pl.col("span_id")),
        "model": pl.coalesce(pl.col("gen_ai.response.model"), pl.col("gen_ai.request.model")),
        "tenant": pl.col("tenant"),
        "session_id": pl.col("gen_ai.conversation.id"),
        "status": pl.col("status"),
        "input_raw": pl.col("gen_ai.usage.input_tokens"),
        "cache_read_raw": pl.col("gen_ai.usage.cache_read.input_tokens"),
        "cache_write_raw": pl.col("gen_ai.usage.cache_creation.input_tokens"),
        "output_raw": pl.col("gen_ai.usage.output_tokens"),
        "reasoning_raw": pl.col("gen_ai.usage.reasoning.output_tokens"),
        "ttft_raw": pl.col("ttft_s"),
        "e2e_raw": ((end - start).dt.total_microseconds() / 1e6).cast(pl.String),
    }
    return candidate(raw, exprs, start, pl.col("start"))


_COMMON_LABELS = {"ttft_raw": "ttft_s", "e2e_raw": "e2e_s"}

FORMATS: dict[str, FormatSpec] = {
    "openai": FormatSpec(
        "openai",
        "jsonl",
        OPENAI_LAYOUT,
        _openai,
        {
            "arrival": "timestamp/created",
            "input_raw": "usage.prompt_tokens",
            "cache_read_raw": "usage.prompt_tokens_details.cached_tokens",
            "output_raw": "usage.completion_tokens",
            "reasoning_raw": "usage.completion_tokens_details.reasoning_tokens",
            **_COMMON_LABELS,
        },
    ),
    "anthropic": FormatSpec(
        "anthropic",
        "jsonl",
        ANTHROPIC_LAYOUT,
        _anthropic,
        {
            "arrival": "timestamp",
            "input_raw": "usage.input_tokens",
            "cache_read_raw": "usage.cache_read_input_tokens",
            "cache_write_raw": "usage.cache_creation_input_tokens",
            "output_raw": "usage.output_tokens",
            **_COMMON_LABELS,
        },
        input_excludes_cache=True,
    ),
    "litellm": FormatSpec(
        "litellm",
        "csv_or_json",
        LITELLM_LAYOUT,
        _litellm,
        {
            "arrival": "startTime",
            "input_raw": "prompt_tokens",
            "cache_read_raw": "metadata.usage_object.prompt_tokens_details.cached_tokens",
            "output_raw": "completion_tokens",
            "ttft_raw": "completionStartTime",
            "e2e_raw": "endTime",
        },
        required_columns=("request_id", "starttime", "prompt_tokens", "completion_tokens"),
    ),
    "azure": FormatSpec(
        "azure",
        "csv",
        AZURE_LAYOUT,
        _azure,
        {"arrival": "TIMESTAMP", "input_raw": "ContextTokens", "output_raw": "GeneratedTokens"},
        required_columns=("timestamp", "contexttokens", "generatedtokens"),
    ),
    "mooncake": FormatSpec(
        "mooncake",
        "jsonl",
        MOONCAKE_LAYOUT,
        _mooncake,
        {
            "arrival": "timestamp",
            "input_raw": "input_length",
            "output_raw": "output_length",
            "hashes": "hash_ids",
        },
        relative_time=True,
    ),
    "vidur": FormatSpec(
        "vidur",
        "csv",
        VIDUR_LAYOUT,
        _vidur,
        {"arrival": "arrived_at", "input_raw": "num_prefill_tokens", "output_raw": "num_decode_tokens"},
        relative_time=True,
        required_columns=("num_prefill_tokens", "num_decode_tokens"),
        # Length-only files (Vidur's arxiv_summarization stats) have no arrival column: they are an
        # offline batch, every request arriving at the anchor (t = 0).
        absent_defaults={"arrived_at": "0"},
    ),
    "otel": FormatSpec(
        "otel",
        "otel",
        OTEL_LAYOUT,
        _otel,
        {
            "arrival": "startTimeUnixNano",
            "input_raw": "gen_ai.usage.input_tokens",
            "cache_read_raw": "gen_ai.usage.cache_read.input_tokens",
            "cache_write_raw": "gen_ai.usage.cache_creation.input_tokens",
            "output_raw": "gen_ai.usage.output_tokens",
            "reasoning_raw": "gen_ai.usage.reasoning.output_tokens",
            "e2e_raw": "endTimeUnixNano",
            "ttft_raw": "gen_ai.server.time_to_first_token",
        },
    ),
}

GENERIC_FORMATS = ("csv", "jsonl", "parquet")
ALL_FORMATS = (*FORMATS, *GENERIC_FORMATS)
