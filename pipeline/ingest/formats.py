"""Per-format knowledge, declared as data: which raw fields feed which column, and a small
post-step that parses times and derives columns.

A format maps each *flat* column to a list of raw paths (dotted, into the JSON object) in
priority order: the first non-null wins. Every leaf is read as text, so a wrong type becomes a
per-record reason rather than a failed batch. The projection runs inside DuckDB's scan on the
fast path (``project_sql``) and in polars on the robust path (``project_polars``): one
declaration, two engines, the same flat frame. ``post`` then turns the flat frame into the
*candidate* frame that ``normalize.finalize`` validates:

``request_id, arrival (Datetime us UTC), arrival_raw, model, tenant, session_id, adapter, status,
input_raw, cache_read_raw, cache_write_raw, output_raw, reasoning_raw, ttft_raw, e2e_raw,
foreign, hashes (List[String]), block_size (Int32)`` (text unless noted; null = absent in the log).
``foreign`` is the reason a record is another provider's (an Anthropic message in a file read
as OpenAI, or the converse), which ``finalize`` quarantines: read with the wrong layout its token
counts would be wrong (an Anthropic ``input_tokens`` excludes cache reads, an OpenAI one
includes them), not missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from pipeline.ingest.timeparse import parse_time

#: A raw layout: field name -> None (text leaf), "list" (list of text) or a nested layout.
Layout = Mapping[str, Any]
Fields = Mapping[str, tuple[str, ...]]

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
    "foreign",
)
_US = pl.Datetime("us", "UTC")


@dataclass(frozen=True)
class Context:
    """What a post-step may need beyond the rows."""

    anchor_date: str | None  # --date, for relative timestamps


@dataclass(frozen=True)
class Sniff:
    """How format detection (``source.sniff_format``) knows a log of this format from its first
    record when no --format is given. Formats are tried in ``rank`` order, lowest first: a more
    specific rule goes before a looser one (a LiteLLM record also holds OpenAI's
    ``prompt_tokens``; an Anthropic one holds ``input_tokens``, which the OpenAI rule accepts).

    A JSON record matches when any one clause holds: its top-level keys include every key of one
    set of ``json_keys``; its JSON text holds one of ``json_text`` (a key nested anywhere); a
    top-level key has the value given in ``json_values``; or, for a document too long to parse,
    its first key is ``json_leading_key``. A CSV header matches when its columns (lower-cased,
    quotes dropped) include every one of ``csv_columns``."""

    rank: int
    json_keys: tuple[frozenset[str], ...] = ()
    json_text: tuple[str, ...] = ()
    json_values: tuple[tuple[str, str], ...] = ()
    json_leading_key: str = ""
    csv_columns: frozenset[str] = frozenset()

    def matches_record(self, record: Mapping[str, Any], text: Callable[[], str]) -> bool:
        """Whether the JSON object ``record`` is of this format; ``text()`` gives its JSON text
        (asked for only by a ``json_text`` clause: a large record is serialised once, if at all)."""
        keys = set(record)
        return (
            any(need <= keys for need in self.json_keys)
            or any(record.get(key) == value for key, value in self.json_values)
            or any(piece in text() for piece in self.json_text)
        )

    def matches_header(self, columns: set[str]) -> bool:
        """Whether a CSV header with ``columns`` (lower-cased) is of this format."""
        return bool(self.csv_columns) and self.csv_columns <= columns


@dataclass(frozen=True)
class FormatSpec:
    name: str
    kind: str  # "jsonl", "csv", "csv_or_json", "otel", "parquet"
    fields: Fields
    post: Callable[[pl.DataFrame, Context], pl.DataFrame]
    #: Source field names for messages, keyed by candidate column.
    labels: Mapping[str, str]
    #: Flat columns whose raw value is a list (prefix hash ids).
    list_fields: frozenset[str] = frozenset()
    #: True when the log's input count excludes cache reads and writes (Anthropic).
    input_excludes_cache: bool = False
    #: True when timestamps are relative to an unknown start, so --date is required.
    relative_time: bool = False
    #: Required CSV header columns (lower-cased), to fail fast on a wrongly forced format.
    required_columns: tuple[str, ...] = ()
    #: Values for raw columns that a CSV header lacks altogether (not for empty cells).
    absent_defaults: Mapping[str, str] = field(default_factory=dict)
    #: Fields the user named in a mapping file: one with no value in any record of a file is
    #: said (a typo in the mapping would otherwise make every model "unknown").
    mapped: bool = False
    #: How detection knows this format without --format (None: only when asked for by name).
    sniff: Sniff | None = None

    @property
    def flat_input(self) -> bool:
        """CSV and OTel readers produce flat frames: names are not paths."""
        return self.kind in ("csv", "otel")

    @property
    def layout(self) -> Layout:
        """The raw layout implied by every path in ``fields`` (nested unless flat_input)."""
        root: dict[str, Any] = {}
        for name, paths in self.fields.items():
            for dotted in paths:
                parts = [dotted] if self.flat_input else dotted.split(".")
                node = root
                for part in parts[:-1]:
                    node = node.setdefault(part, {})
                node.setdefault(parts[-1], "list" if name in self.list_fields else None)
        return root


def sql_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier: a mapped key may hold any character, quotes included."""
    return '"' + name.replace('"', '""') + '"'


def sql_text(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _duckdb_type(sub: Any) -> str:
    if sub is None:
        return "VARCHAR"
    if sub == "list":
        return "VARCHAR[]"
    inner = ", ".join(f"{sql_ident(k)} {_duckdb_type(v)}" for k, v in sub.items())
    return f"STRUCT({inner})"


def duckdb_columns(layout: Layout) -> str:
    """The ``columns=`` argument of DuckDB's read_json for a layout (names from a mapping file are
    data: quoted, never pasted into the SQL)."""
    items = ", ".join(f"{sql_text(k)}: {sql_text(_duckdb_type(v))}" for k, v in layout.items())
    return "{" + items + "}"


def path(dotted: str) -> pl.Expr:
    """``a.b.c`` -> pl.col("a").struct.field("b").struct.field("c")."""
    head, *rest = dotted.split(".")
    expr = pl.col(head)
    for part in rest:
        expr = expr.struct.field(part)
    return expr


def project_polars(fields: Fields, flat: bool = False) -> list[pl.Expr]:
    """Nested raw frame -> flat frame (first non-null path per column). With ``flat`` the raw
    frame is already flat (CSV, OTel) and a dotted name is a column name, not a path."""
    exprs = []
    for name, paths in fields.items():
        parts = [pl.col(p) if flat else path(p) for p in paths]
        exprs.append((pl.coalesce(parts) if len(parts) > 1 else parts[0]).alias(name))
    return exprs


def project_sql(fields: Fields) -> str:
    """The same projection as a DuckDB select list."""

    def sql_path(dotted: str) -> str:
        return ".".join(sql_ident(p) for p in dotted.split("."))

    items = []
    for name, paths in fields.items():
        parts = [sql_path(p) for p in paths]
        expr = f"coalesce({', '.join(parts)})" if len(parts) > 1 else parts[0]
        items.append(f"{expr} AS {sql_ident(name)}")
    return ", ".join(items)


def to_candidate(flat: pl.DataFrame) -> pl.DataFrame:
    """Select the candidate columns; those a format does not have become null."""
    cols: list[pl.Expr] = []
    for name in CANDIDATE_TEXT:
        if name in flat.columns:
            cols.append(pl.col(name).cast(pl.String))
        else:
            cols.append(pl.lit(None, dtype=pl.String).alias(name))
    cols.append(pl.col("arrival").cast(_US) if "arrival" in flat.columns else pl.lit(None, dtype=_US).alias("arrival"))
    cols.append(
        pl.col("hashes") if "hashes" in flat.columns else pl.lit(None, dtype=pl.List(pl.String)).alias("hashes")
    )
    cols.append(
        pl.col("block_size").cast(pl.Int32)
        if "block_size" in flat.columns
        else pl.lit(None, dtype=pl.Int32).alias("block_size")
    )
    return flat.select(cols)


# --- OpenAI -------------------------------------------------------------------------------------
# Chat Completions object, Responses object, Batch API output line
# ({"custom_id", "response": {"status_code", "request_id", "body": <object>}, "error"}), or a
# logged pair ({"timestamp", "request": {...}, "response": <object>}). usage.prompt_tokens (Chat)
# and usage.input_tokens (Responses) INCLUDE cached tokens (OpenAI prompt-caching guide).

_OBJ = ("response.body.", "response.", "")


def _obj(*suffixes: str) -> tuple[str, ...]:
    return tuple(p + s for s in suffixes for p in _OBJ)


OPENAI_FIELDS: Fields = {
    "request_id": ("response.body.id", "response.id", "id", "custom_id"),
    "model": ("response.body.model", "response.model", "model", "request.model"),
    "tenant": ("request.user", "user", "metadata.tenant", "request.metadata.tenant"),
    "session_id": (
        "metadata.session_id",
        "request.metadata.session_id",
        "metadata.conversation_id",
        "request.metadata.conversation_id",
    ),
    "status_raw": ("response.status_code", "response.body.status", "response.status", "status"),
    "error_raw": ("error.message",),
    "ts_raw": ("timestamp",),
    "created_raw": _obj("created"),
    "created_at_raw": _obj("created_at"),
    "prompt_raw": _obj("usage.prompt_tokens"),
    "input_tokens_raw": _obj("usage.input_tokens"),
    "cache_read_raw": _obj("usage.prompt_tokens_details.cached_tokens", "usage.input_tokens_details.cached_tokens"),
    "output_raw": _obj("usage.completion_tokens", "usage.output_tokens"),
    "reasoning_raw": _obj(
        "usage.completion_tokens_details.reasoning_tokens", "usage.output_tokens_details.reasoning_tokens"
    ),
    "ttft_raw": ("ttft_s",),
    "e2e_raw": ("e2e_s",),
    # Anthropic's marks, to tell its Messages records from OpenAI's (``foreign``)
    "type_raw": _obj("type"),
    "anthropic_cache_raw": _obj("usage.cache_read_input_tokens", "usage.cache_creation_input_tokens"),
}


def _foreign(looks: pl.Expr, fmt: str, other: str) -> pl.Expr:
    """The ``foreign`` reason for the records where ``looks`` holds (null elsewhere)."""
    return pl.when(looks.fill_null(False)).then(
        pl.lit(
            f"record does not match the {fmt} layout (looks like {other}); ingest such records with --format {other}"
        )
    )


def _openai(flat: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    ts, created, created_at = pl.col("ts_raw"), pl.col("created_raw"), pl.col("created_at_raw")
    # An Anthropic Messages record (its usage has no prompt_tokens, and it says "type": "message"
    # or counts cache reads/writes Anthropic's way) read with this layout would store its
    # input_tokens, which exclude the cache reads, as the whole input.
    anthropic = pl.col("prompt_raw").is_null() & (
        (pl.col("type_raw") == "message") | pl.col("anthropic_cache_raw").is_not_null()
    )
    return to_candidate(
        flat.with_columns(
            input_raw=pl.coalesce(pl.col("prompt_raw"), pl.col("input_tokens_raw")),
            foreign=_foreign(anthropic, "openai", "anthropic"),
            # A logger's own timestamp (sub-second) beats `created` (whole seconds in the object);
            # one that is there but unreadable quarantines the record (arrival_raw names it), it is
            # not quietly replaced by `created`.
            arrival=pl.when(ts.is_not_null())
            .then(parse_time(ts, "auto"))
            .otherwise(pl.coalesce(parse_time(created, "s"), parse_time(created_at, "s"))),
            arrival_raw=pl.coalesce(ts, created, created_at),
            status=pl.when(pl.col("error_raw").is_not_null()).then(pl.lit("error")).otherwise(pl.col("status_raw")),
        )
    )


# --- Anthropic ----------------------------------------------------------------------------------
# Messages response (a log line adds "timestamp"/"created_at"), a logged pair ({"timestamp",
# "request", "response": <message>}), or a Message Batches result line ({"custom_id", "result":
# {"type", "message"}}). usage.input_tokens EXCLUDES cache reads and writes (Anthropic
# prompt-caching docs): recorded = input + cache_read + cache_creation.

_MSG = ("response.", "result.message.", "")


def _msg(*suffixes: str) -> tuple[str, ...]:
    return tuple(p + s for s in suffixes for p in _MSG)


ANTHROPIC_FIELDS: Fields = {
    "request_id": (*_msg("id"), "custom_id"),
    "model": (*_msg("model"), "request.model"),
    "tenant": ("tenant", "request.metadata.user_id", "metadata.user_id"),
    "session_id": ("session_id", "request.metadata.session_id", "metadata.session_id"),
    "status": ("result.type", *_msg("stop_reason")),
    "arrival_raw": ("timestamp", "created_at"),
    "input_raw": _msg("usage.input_tokens"),
    "cache_read_raw": _msg("usage.cache_read_input_tokens"),
    "cache_write_raw": _msg("usage.cache_creation_input_tokens"),
    "output_raw": _msg("usage.output_tokens"),
    "ttft_raw": ("ttft_s",),
    "e2e_raw": ("e2e_s",),
    # OpenAI's marks, to tell its records from Anthropic's (``foreign``)
    "type_raw": _msg("type"),
    "openai_raw": _msg("usage.prompt_tokens", "usage.completion_tokens", "usage.input_tokens_details", "object"),
}


def _anthropic(flat: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    # An OpenAI record (prompt_tokens, a Responses input_tokens_details, an "object" kind; no
    # Anthropic cache counts, not "type": "message") read with this layout would add no cache
    # reads to an input that already holds them, or miss its input altogether.
    openai = (
        pl.col("openai_raw").is_not_null()
        & pl.col("cache_read_raw").is_null()
        & pl.col("cache_write_raw").is_null()
        & (pl.col("type_raw") != "message").fill_null(True)
    )
    return to_candidate(
        flat.with_columns(
            arrival=parse_time(pl.col("arrival_raw"), "auto"),
            foreign=_foreign(openai, "anthropic", "openai"),
        )
    )


# --- LiteLLM SpendLogs --------------------------------------------------------------------------
# prompt_tokens follows the OpenAI (inclusive) convention; cached tokens, when logged, sit in the
# metadata's usage object. completionStartTime is the first token: TTFT = it − startTime.

LITELLM_FIELDS: Fields = {
    "request_id": ("request_id",),
    "model": ("model", "model_group"),
    "tenant": ("team_id", "user", "end_user"),
    "session_id": ("session_id",),
    "status": ("status",),
    "arrival_raw": ("startTime",),
    "end_raw": ("endTime",),
    "first_raw": ("completionStartTime",),
    "input_raw": ("prompt_tokens",),
    "output_raw": ("completion_tokens",),
    "metadata": ("metadata",),
}


def _seconds(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    return ((b - a).dt.total_microseconds() / 1e6).cast(pl.String)


#: Where LiteLLM's metadata (a JSON object, or its text in a CSV cell) holds the cache reads, in
#: priority order: the provider's usage object (OpenAI's or Anthropic's spelling) as LiteLLM logs
#: it, or its additional usage values.
LITELLM_CACHED_PATHS = (
    "metadata.usage_object.prompt_tokens_details.cached_tokens",
    "metadata.additional_usage_values.prompt_tokens_details.cached_tokens",
    "metadata.usage_object.cache_read_input_tokens",
)


def _litellm(flat: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    start = parse_time(pl.col("arrival_raw"), "auto")
    meta = pl.col("metadata")
    cached = pl.coalesce([meta.str.json_path_match("$." + p.removeprefix("metadata.")) for p in LITELLM_CACHED_PATHS])
    return to_candidate(
        flat.with_columns(
            arrival=start,
            cache_read_raw=cached,
            ttft_raw=_seconds(start, parse_time(pl.col("first_raw"), "auto")),
            e2e_raw=_seconds(start, parse_time(pl.col("end_raw"), "auto")),
        )
    )


# --- Public traces ------------------------------------------------------------------------------
AZURE_FIELDS: Fields = {
    "arrival_raw": ("TIMESTAMP",),
    "input_raw": ("ContextTokens",),
    "output_raw": ("GeneratedTokens",),
}


def _azure(flat: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    # No time zone in the trace (Azure's release states none): read as UTC.
    return to_candidate(flat.with_columns(arrival=parse_time(pl.col("arrival_raw"), "iso")))


#: Mooncake hash_ids cover 512-token blocks (FAST'25 release README).
MOONCAKE_BLOCK_TOKENS = 512
MOONCAKE_FIELDS: Fields = {
    "arrival_raw": ("timestamp",),
    "input_raw": ("input_length",),
    "output_raw": ("output_length",),
    "hashes": ("hash_ids",),
}


def _mooncake(flat: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    return to_candidate(
        flat.with_columns(
            arrival=parse_time(pl.col("arrival_raw"), "relative_ms", ctx.anchor_date),
            block_size=pl.when(pl.col("hashes").is_not_null()).then(pl.lit(MOONCAKE_BLOCK_TOKENS)),
        )
    )


VIDUR_FIELDS: Fields = {
    "arrival_raw": ("arrived_at",),
    "input_raw": ("num_prefill_tokens",),
    "output_raw": ("num_decode_tokens",),
}


def _vidur(flat: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    return to_candidate(flat.with_columns(arrival=parse_time(pl.col("arrival_raw"), "relative_s", ctx.anchor_date)))


# --- OpenTelemetry GenAI spans -------------------------------------------------------------------
# otel.py flattens each GenAI span into text columns named by the attribute with "." -> "/"
# (so they are not read as nested paths). Per the GenAI semantic conventions, cache_read and
# cache_creation input tokens SHOULD be included in gen_ai.usage.input_tokens.


def otel_column(attribute: str) -> str:
    return attribute.replace(".", "/")


OTEL_ATTRIBUTES = (
    "gen_ai.response.id",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.usage.reasoning.output_tokens",
    "gen_ai.conversation.id",
)
OTEL_FIELDS: Fields = {
    "span_id": ("span_id",),
    "trace_id": ("trace_id",),
    "start": ("start",),
    "end": ("end",),
    "tenant": ("tenant",),
    "status": ("status",),
    "ttft_raw": ("ttft_s",),
    **{otel_column(a): (otel_column(a),) for a in OTEL_ATTRIBUTES},
}


def _otel(flat: pl.DataFrame, ctx: Context) -> pl.DataFrame:
    def a(name: str) -> pl.Expr:
        return pl.col(otel_column(name))

    start = parse_time(pl.col("start"), "ns")
    return to_candidate(
        flat.with_columns(
            request_id=pl.coalesce(a("gen_ai.response.id"), pl.col("trace_id") + ":" + pl.col("span_id")),
            model=pl.coalesce(a("gen_ai.response.model"), a("gen_ai.request.model")),
            session_id=a("gen_ai.conversation.id"),
            input_raw=a("gen_ai.usage.input_tokens"),
            cache_read_raw=a("gen_ai.usage.cache_read.input_tokens"),
            cache_write_raw=a("gen_ai.usage.cache_creation.input_tokens"),
            output_raw=a("gen_ai.usage.output_tokens"),
            reasoning_raw=a("gen_ai.usage.reasoning.output_tokens"),
            arrival=start,
            arrival_raw=pl.col("start"),
            e2e_raw=_seconds(start, parse_time(pl.col("end"), "ns")),
        )
    )


_LATENCY_LABELS = {"ttft_raw": "ttft_s", "e2e_raw": "e2e_s"}

FORMATS: dict[str, FormatSpec] = {
    "openai": FormatSpec(
        "openai",
        "jsonl",
        OPENAI_FIELDS,
        _openai,
        {
            "arrival": "timestamp/created",
            "input_raw": "usage.prompt_tokens",
            "cache_read_raw": "usage.prompt_tokens_details.cached_tokens",
            "output_raw": "usage.completion_tokens",
            "reasoning_raw": "usage.completion_tokens_details.reasoning_tokens",
            **_LATENCY_LABELS,
        },
        # a usage object (Chat Completions' prompt_tokens, Responses' input_tokens) or a Batch
        # API line; last of the JSON rules, the loosest
        sniff=Sniff(rank=70, json_text=("prompt_tokens", "input_tokens"), json_keys=(frozenset({"custom_id"}),)),
    ),
    "anthropic": FormatSpec(
        "anthropic",
        "jsonl",
        ANTHROPIC_FIELDS,
        _anthropic,
        {
            "arrival": "timestamp",
            "input_raw": "usage.input_tokens",
            "cache_read_raw": "usage.cache_read_input_tokens",
            "cache_write_raw": "usage.cache_creation_input_tokens",
            "output_raw": "usage.output_tokens",
            **_LATENCY_LABELS,
        },
        input_excludes_cache=True,
        # Anthropic's own usage key, a Messages response (type "message") or a Message Batches
        # result line; before OpenAI's rule, which its input_tokens would also pass
        sniff=Sniff(
            rank=60,
            json_text=("cache_read_input_tokens",),
            json_values=(("type", "message"),),
            json_keys=(frozenset({"result"}),),
        ),
    ),
    "litellm": FormatSpec(
        "litellm",
        "csv_or_json",
        LITELLM_FIELDS,
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
        # LiteLLM's spend-log row, as JSON or CSV; before OpenAI's rule (it holds prompt_tokens)
        sniff=Sniff(
            rank=50,
            json_keys=(frozenset({"startTime", "request_id"}),),
            csv_columns=frozenset({"request_id", "starttime"}),
        ),
    ),
    "azure": FormatSpec(
        "azure",
        "csv",
        AZURE_FIELDS,
        _azure,
        {"arrival": "TIMESTAMP", "input_raw": "ContextTokens", "output_raw": "GeneratedTokens"},
        required_columns=("timestamp", "contexttokens", "generatedtokens"),
        sniff=Sniff(rank=30, csv_columns=frozenset({"timestamp", "contexttokens", "generatedtokens"})),
    ),
    "mooncake": FormatSpec(
        "mooncake",
        "jsonl",
        MOONCAKE_FIELDS,
        _mooncake,
        {
            "arrival": "timestamp",
            "input_raw": "input_length",
            "output_raw": "output_length",
            "hashes": "hash_ids",
        },
        list_fields=frozenset({"hashes"}),
        relative_time=True,
        sniff=Sniff(rank=20, json_keys=(frozenset({"input_length", "output_length"}),)),
    ),
    "vidur": FormatSpec(
        "vidur",
        "csv",
        VIDUR_FIELDS,
        _vidur,
        {"arrival": "arrived_at", "input_raw": "num_prefill_tokens", "output_raw": "num_decode_tokens"},
        relative_time=True,
        required_columns=("num_prefill_tokens", "num_decode_tokens"),
        # Length-only files (Vidur's arxiv_summarization stats) have no arrival column: they are an
        # offline batch, every request arriving at the anchor (t = 0).
        absent_defaults={"arrived_at": "0"},
        sniff=Sniff(rank=40, csv_columns=frozenset({"num_prefill_tokens", "num_decode_tokens"})),
    ),
    "otel": FormatSpec(
        "otel",
        "otel",
        OTEL_FIELDS,
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
        # an OTLP/JSON export says what it is in its first key, also when too long to parse
        sniff=Sniff(rank=10, json_keys=(frozenset({"resourceSpans"}),), json_leading_key="resourceSpans"),
    ),
}

GENERIC_FORMATS = ("csv", "jsonl", "parquet")
ALL_FORMATS = (*FORMATS, *GENERIC_FORMATS)
#: The formats detection tries, in their rules' rank order (:class:`Sniff`).
SNIFFED: tuple[tuple[str, Sniff], ...] = tuple(
    sorted(((name, spec.sniff) for name, spec in FORMATS.items() if spec.sniff is not None), key=lambda x: x[1].rank)
)
