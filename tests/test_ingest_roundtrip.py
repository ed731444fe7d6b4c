"""Every field each ingest format reads, round-tripped (pipeline/ingest/formats.py, readers.py,
mapping.py; docs/ingest.md "Formats and their field semantics" and "Observed latencies").

Each case writes one record carrying the field (besides the fields a record needs), ingests it
into a fresh store and reads the stored request back, asserting the exact value the field gives,
unit conversions included (ms -> s, Anthropic's exclusive ``input_tokens`` -> inclusive
``recorded_input_tokens``, ``cached_tokens`` -> ``reported_cache_hit_tokens``, ns -> us). The
cases are a table; ``test_every_read_field_has_a_case`` enumerates the fields the code reads (the
format specs' raw paths, the OTel attributes, the mapping's fields and options) and fails for any
without a case, and ``test_every_documented_field_has_a_case`` does the same for every field
docs/ingest.md names in a format's row."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.common.schemas import load_schema
from pipeline.ingest import ingest_logs
from pipeline.ingest.formats import FORMATS, LITELLM_CACHED_PATHS, MOONCAKE_BLOCK_TOKENS, OTEL_ATTRIBUTES
from pipeline.ingest.mapping import _TOP_KEYS, FIELD_TO_CANDIDATE
from pipeline.ingest.readers import _OTEL_TENANT, _OTEL_TTFT
from pipeline.ingest.store import Store

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2024, 12, 1, tzinfo=UTC)
T0_S = int(T0.timestamp())
T0_NS = T0_S * 1_000_000_000
ANCHOR = "2024-12-01"


def at(seconds: float = 0.0, us: int = 0) -> datetime:
    return T0 + timedelta(seconds=seconds, microseconds=us)


@dataclass(frozen=True)
class Case:
    """One field of one format: ``value`` written at ``field`` (the format's own name for it: a
    dotted JSON path, a CSV column, an OTel attribute), ``expect`` the stored columns it gives.
    ``extra`` adds other fields to the record; ``options`` are mapping options (generic formats)."""

    fmt: str
    field: str
    value: Any
    expect: Mapping[str, Any]
    container: str = ""  # litellm: csv | jsonl | array; generic: csv | jsonl | parquet
    extra: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def id(self) -> str:
        return "-".join(x for x in (self.fmt, self.container, self.field, self.note) if x)


# --- OpenAI -------------------------------------------------------------------------------------
# Base fields by the column they feed: a case replaces the base fields of its column.
OPENAI_BASE = {
    "request_id": ("id", "chatcmpl-base"),
    "arrival": ("timestamp", "2024-12-01T00:00:00Z"),
    "input": ("usage.prompt_tokens", 1000),
    "output": ("usage.completion_tokens", 100),
    "model": ("model", "gpt-4o"),
}
OPENAI_COLUMN = {
    "request_id": "request_id",
    "model": "model",
    "tenant": "tenant",
    "session_id": "session_id",
    "status_raw": "status",
    "error_raw": "status",
    "ts_raw": "arrival",
    "created_raw": "arrival",
    "created_at_raw": "arrival",
    "prompt_raw": "input",
    "input_tokens_raw": "input",
    "cache_read_raw": "cache",
    "output_raw": "output",
    "reasoning_raw": "reasoning",
    "ttft_raw": "ttft",
    "e2e_raw": "e2e",
}
# Flat columns that are no stored field: they tell another provider's record (``foreign``, which
# is quarantined: tests/test_ingest_bad.py), or hold a JSON object whose fields are listed apart.
MARKS = {
    "openai": {"type_raw", "anthropic_cache_raw"},
    "anthropic": {"type_raw", "openai_raw"},
    "litellm": {"metadata"},
}

_OPENAI_VALUES: dict[str, tuple[Any, dict[str, Any]]] = {
    "request_id": ("rid-7", {"request_id": "rid-7"}),
    "model": ("gpt-4o-mini", {"model": "gpt-4o-mini"}),
    "tenant": ("team-x", {"tenant": "team-x"}),
    "session_id": ("sess-9", {"session_id": "sess-9"}),
    "status_raw": ("completed", {"status": "completed"}),
    "error_raw": ("rate limited", {"status": "error"}),
    "ts_raw": ("2024-12-01T00:00:01.250Z", {"arrival": at(1.25)}),
    "created_raw": (T0_S + 60, {"arrival": at(60)}),
    "created_at_raw": (T0_S + 90, {"arrival": at(90)}),
    "prompt_raw": (2000, {"recorded_input_tokens": 2000}),
    "input_tokens_raw": (3000, {"recorded_input_tokens": 3000}),
    "cache_read_raw": (512, {"reported_cache_hit_tokens": 512, "recorded_input_tokens": 1000}),
    "output_raw": (77, {"output_tokens": 77}),
    "reasoning_raw": (30, {"reasoning_tokens": 30, "output_tokens": 100}),
    "ttft_raw": (0.41, {"ttft_s": 0.41}),
    "e2e_raw": (2.5, {"e2e_s": 2.5}),
}


def _openai_cases() -> list[Case]:
    out = []
    for name, paths in FORMATS["openai"].fields.items():
        if name in MARKS["openai"]:
            continue
        value, expect = _OPENAI_VALUES[name]
        for p in paths:
            if name == "status_raw" and p == "response.status_code":
                out.append(Case("openai", p, 200, {"status": "200"}))
            else:
                out.append(Case("openai", p, value, expect))
    return out


# --- Anthropic ----------------------------------------------------------------------------------
ANTHROPIC_BASE = {
    "request_id": ("id", "msg_base"),
    "arrival": ("timestamp", "2024-12-01T00:00:00Z"),
    "input": ("usage.input_tokens", 1000),
    "output": ("usage.output_tokens", 100),
    "model": ("model", "claude-sonnet-4-5"),
    "type": ("type", "message"),
}
ANTHROPIC_COLUMN = {
    "request_id": "request_id",
    "model": "model",
    "tenant": "tenant",
    "session_id": "session_id",
    "status": "status",
    "arrival_raw": "arrival",
    "input_raw": "input",
    "cache_read_raw": "cache_read",
    "cache_write_raw": "cache_write",
    "output_raw": "output",
    "ttft_raw": "ttft",
    "e2e_raw": "e2e",
}
_ANTHROPIC_VALUES: dict[str, tuple[Any, dict[str, Any]]] = {
    "request_id": ("msg_7", {"request_id": "msg_7"}),
    "model": ("claude-haiku-4-5", {"model": "claude-haiku-4-5"}),
    "tenant": ("acme", {"tenant": "acme"}),
    "session_id": ("conv-3", {"session_id": "conv-3"}),
    "status": ("end_turn", {"status": "end_turn"}),
    "arrival_raw": ("2024-12-01T00:01:30.500Z", {"arrival": at(90.5)}),
    "input_raw": (2000, {"recorded_input_tokens": 2000}),
    # exclusive counts made inclusive: 1000 + 300 cache reads (+ 200 cache writes)
    "cache_read_raw": (300, {"recorded_input_tokens": 1300, "reported_cache_hit_tokens": 300}),
    "cache_write_raw": (200, {"recorded_input_tokens": 1200, "cache_write_tokens": 200}),
    "output_raw": (77, {"output_tokens": 77}),
    "ttft_raw": (0.25, {"ttft_s": 0.25}),
    "e2e_raw": (1.5, {"e2e_s": 1.5}),
}


def _anthropic_cases() -> list[Case]:
    out = []
    for name, paths in FORMATS["anthropic"].fields.items():
        if name in MARKS["anthropic"]:
            continue
        value, expect = _ANTHROPIC_VALUES[name]
        for p in paths:
            if p == "result.type":  # a Message Batches result line
                out.append(Case("anthropic", p, "succeeded", {"status": "succeeded"}))
            else:
                out.append(Case("anthropic", p, value, expect))
    out.append(
        Case(
            "anthropic",
            "usage.cache_read_input_tokens",
            188086,
            {
                "recorded_input_tokens": 21 + 188086 + 414,
                "reported_cache_hit_tokens": 188086,
                "cache_write_tokens": 414,
            },
            extra={"usage.input_tokens": 21, "usage.cache_creation_input_tokens": 414},
            note="read+write",
        )
    )
    return out


# --- LiteLLM ------------------------------------------------------------------------------------
LITELLM_BASE = {
    "request_id": ("request_id", "chatcmpl-L0"),
    "arrival": ("startTime", "2024-12-01 00:00:00.000000"),
    "input": ("prompt_tokens", 1000),
    "output": ("completion_tokens", 100),
    "model": ("model", "gpt-4o"),
}
LITELLM_COLUMN = {
    "request_id": "request_id",
    "model": "model",
    "tenant": "tenant",
    "session_id": "session_id",
    "status": "status",
    "arrival_raw": "arrival",
    "end_raw": "e2e",
    "first_raw": "ttft",
    "input_raw": "input",
    "output_raw": "output",
    "cached": "cache",
}
_LITELLM_VALUES: dict[str, tuple[Any, dict[str, Any]]] = {
    "request_id": ("chatcmpl-L7", {"request_id": "chatcmpl-L7"}),
    "model": ("gpt-4o-mini", {"model": "gpt-4o-mini"}),
    "tenant": ("team-b", {"tenant": "team-b"}),
    "session_id": ("s-1", {"session_id": "s-1"}),
    "status": ("success", {"status": "success"}),
    # no zone: read as UTC
    "arrival_raw": ("2024-12-01 00:00:01.500000", {"arrival": at(1.5)}),
    "end_raw": ("2024-12-01 00:00:03.500000", {"e2e_s": 3.5}),
    "first_raw": ("2024-12-01 00:00:00.800000", {"ttft_s": 0.8}),
    "input_raw": (2000, {"recorded_input_tokens": 2000}),
    "output_raw": (77, {"output_tokens": 77}),
    "cached": (512, {"reported_cache_hit_tokens": 512, "recorded_input_tokens": 1000}),
}


def _litellm_cases() -> list[Case]:
    out = []
    for container in ("csv", "jsonl", "array"):
        for name, paths in FORMATS["litellm"].fields.items():
            if name in MARKS["litellm"]:
                continue
            value, expect = _LITELLM_VALUES[name]
            out += [Case("litellm", p, value, expect, container) for p in paths]
        value, expect = _LITELLM_VALUES["cached"]
        out += [Case("litellm", p, value, expect, container) for p in LITELLM_CACHED_PATHS]
        # a zone given is honoured
        out.append(
            Case("litellm", "startTime", "2024-12-01T01:00:02+01:00", {"arrival": at(2)}, container, note="zone")
        )
    return out


# --- Azure, Mooncake, Vidur ---------------------------------------------------------------------
AZURE_BASE = {
    "arrival": ("TIMESTAMP", "2024-12-01 00:00:00"),
    "input": ("ContextTokens", 1000),
    "output": ("GeneratedTokens", 100),
}
MOONCAKE_BASE = {
    "arrival": ("timestamp", 0),
    "input": ("input_length", 1000),
    "output": ("output_length", 100),
}
VIDUR_BASE = {
    "arrival": ("arrived_at", 0.0),
    "input": ("num_prefill_tokens", 1000),
    "output": ("num_decode_tokens", 100),
}
TRACE_COLUMN = {"arrival_raw": "arrival", "input_raw": "input", "output_raw": "output", "hashes": "hashes"}


def _trace_cases() -> list[Case]:
    return [
        # Azure's own layout: seven fraction digits, no zone (read as UTC)
        Case(
            "azure",
            "TIMESTAMP",
            "2023-11-16 18:15:46.6805900",
            {"arrival": datetime(2023, 11, 16, 18, 15, 46, 680590, UTC)},
        ),
        Case("azure", "ContextTokens", 4808, {"recorded_input_tokens": 4808}),
        Case("azure", "GeneratedTokens", 10, {"output_tokens": 10}),
        # ms from the trace's start, on --date
        Case("mooncake", "timestamp", 27482, {"arrival": at(27.482)}),
        Case("mooncake", "input_length", 6955, {"recorded_input_tokens": 6955}),
        Case("mooncake", "output_length", 52, {"output_tokens": 52}),
        Case(
            "mooncake",
            "hash_ids",
            [46, 47],
            {"prefix_block_hashes": [46, 47], "prefix_block_size": MOONCAKE_BLOCK_TOKENS},
        ),
        Case("vidur", "arrived_at", 1.5, {"arrival": at(1.5)}),
        # a length-only file (no arrived_at column): an offline batch at t = 0
        Case("vidur", "arrived_at", None, {"arrival": at(0)}, note="absent"),
        Case("vidur", "num_prefill_tokens", 2000, {"recorded_input_tokens": 2000}),
        Case("vidur", "num_decode_tokens", 77, {"output_tokens": 77}),
    ]


# --- OTel ---------------------------------------------------------------------------------------
SPAN = "span"  # case fields that are span fields, not attributes
_OTEL_ATTR_VALUES: dict[str, tuple[Any, dict[str, Any]]] = {
    "gen_ai.response.id": ("chatcmpl-o7", {"request_id": "chatcmpl-o7"}),
    "gen_ai.request.model": ("gpt-4o", {"model": "gpt-4o"}),
    "gen_ai.response.model": ("gpt-4o-2024-08-06", {"model": "gpt-4o-2024-08-06"}),
    "gen_ai.usage.input_tokens": (3000, {"recorded_input_tokens": 3000}),
    "gen_ai.usage.output_tokens": (250, {"output_tokens": 250}),
    # inclusive by the GenAI conventions: the input count stays as logged
    "gen_ai.usage.cache_read.input_tokens": (512, {"reported_cache_hit_tokens": 512, "recorded_input_tokens": 1000}),
    "gen_ai.usage.cache_creation.input_tokens": (64, {"cache_write_tokens": 64, "recorded_input_tokens": 1000}),
    "gen_ai.usage.reasoning.output_tokens": (30, {"reasoning_tokens": 30, "output_tokens": 100}),
    "gen_ai.conversation.id": ("conv-9", {"session_id": "conv-9"}),
    "gen_ai.server.time_to_first_token": (0.35, {"ttft_s": 0.35}),
    "gen_ai.response.time_to_first_chunk": (0.2, {"ttft_s": 0.2}),
}


def _otel_cases() -> list[Case]:
    out = [Case("otel", name, v, e) for name, (v, e) in _OTEL_ATTR_VALUES.items()]
    out += [Case("otel", name, "tenant-q", {"tenant": "tenant-q"}) for name in _OTEL_TENANT]
    out += [
        Case("otel", "resource:tenant.id", "tenant-r", {"tenant": "tenant-r"}),
        # 19 digits of ns: exact, truncated to us as an ISO time's digits are
        Case("otel", "startTimeUnixNano", str(T0_NS + 123_456_999), {"arrival": at(us=123_456), "e2e_s": 2.376544}),
        Case("otel", "endTimeUnixNano", str(T0_NS + 2_500_000_000), {"e2e_s": 2.5}),
        Case("otel", "status.code", 2, {"status": "error"}),
        Case("otel", "status.code", 1, {"status": "ok"}, note="ok"),
        Case("otel", "status.code", "STATUS_CODE_ERROR", {"status": "error"}, note="text"),
        Case("otel", "status.code", "STATUS_CODE_OK", {"status": "ok"}, note="text-ok"),
        Case("otel", "traceId:spanId", ("5b8e", "eee1"), {"request_id": "5b8e:eee1"}),
    ]
    return out


# --- generic: csv, jsonl, parquet through a mapping ----------------------------------------------
_GENERIC_VALUES: dict[str, tuple[Any, dict[str, Any]]] = {
    "request_id": ("g-7", {"request_id": "g-7"}),
    "arrival": ("2024-12-01T00:00:01.500Z", {"arrival": at(1.5)}),
    "model": ("llama-3.1-8b", {"model": "llama-3.1-8b"}),
    "tenant": ("org-1", {"tenant": "org-1"}),
    "session_id": ("s-5", {"session_id": "s-5"}),
    "adapter": ("lora-7", {"adapter": "lora-7"}),
    "status": ("200", {"status": "200"}),
    "recorded_input_tokens": (2000, {"recorded_input_tokens": 2000}),
    "cache_hit_tokens": (512, {"reported_cache_hit_tokens": 512, "recorded_input_tokens": 1000}),
    "cache_write_tokens": (64, {"cache_write_tokens": 64, "recorded_input_tokens": 1000}),
    "output_tokens": (77, {"output_tokens": 77}),
    "reasoning_tokens": (30, {"reasoning_tokens": 30}),
    "ttft_s": (0.25, {"ttft_s": 0.25}),
    "e2e_s": (1.75, {"e2e_s": 1.75}),
    "prefix_block_hashes": ([11, 12], {"prefix_block_hashes": [11, 12], "prefix_block_size": 16}),
}
GENERIC_REQUIRED = {
    "request_id": "g-base",
    "arrival": "2024-12-01T00:00:00Z",
    "recorded_input_tokens": 1000,
    "output_tokens": 100,
}


def _generic_cases() -> list[Case]:
    out = []
    for container in ("csv", "jsonl", "parquet"):
        out += [Case(container, name, v, e, container) for name, (v, e) in _GENERIC_VALUES.items()]
        out += [
            Case(container, "option:source_format", None, {"source_format": "gateway"}, container,
                 options={"source_format": "gateway"}),
            Case(container, "option:block_size", [5, 6], {"prefix_block_hashes": [5, 6], "prefix_block_size": 32},
                 container, options={"block_size": 32}),
            Case(container, "option:input_excludes_cache", 300,
                 {"recorded_input_tokens": 1500, "reported_cache_hit_tokens": 300, "cache_write_tokens": 200},
                 container, options={"input_excludes_cache": True}, extra={"cache_write_tokens": 200}),
        ]  # fmt: skip
    # every time_unit, on the arrival field
    units: dict[str, tuple[Any, datetime]] = {
        "auto": (T0_S + 1.5, at(1.5)),
        "s": (T0_S + 1.5, at(1.5)),
        "ms": ((T0_S * 1000) + 1500, at(1.5)),
        "us": (T0_S * 1_000_000 + 1_500_001, at(1.500001)),
        "ns": (T0_NS + 1_500_001_999, at(1.500001)),
        "iso": ("2024-12-01 02:00:01.5+02:00", at(1.5)),
        "relative_s": (1.5, at(1.5)),
        "relative_ms": (1500, at(1.5)),
    }
    for unit, (raw, want) in units.items():
        out.append(
            Case("jsonl", "option:time_unit", raw, {"arrival": want}, "jsonl", options={"time_unit": unit}, note=unit)
        )
    return out


CASES = [*_openai_cases(), *_anthropic_cases(), *_litellm_cases(), *_trace_cases(), *_otel_cases(), *_generic_cases()]


# --- writing one record -------------------------------------------------------------------------


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        *head, last = dotted.split(".")
        node = out
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _record(
    case: Case, base: Mapping[str, tuple[str, Any]], column: Mapping[str, str], fields: Mapping[str, Any]
) -> dict[str, Any]:
    """The base record without the base fields of the case's column, plus the case's field."""
    names = {p: n for n, ps in fields.items() for p in ps}
    mine = "cache" if case.field in LITELLM_CACHED_PATHS else column.get(names.get(case.field, ""), "")
    flat = {p: v for slot, (p, v) in base.items() if slot != mine}
    flat.update(case.extra)
    if case.value is not None:
        flat[case.field] = case.value
    return flat


def _csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    names = list(dict.fromkeys(k for r in rows for k in r))
    w = csv.DictWriter(buf, names, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in r.items()})
    return buf.getvalue()


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        v: dict[str, Any] = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    else:
        v = {"stringValue": value}
    return {"key": key, "value": v}


def _otel_doc(case: Case) -> dict[str, Any]:
    attrs = {
        "gen_ai.response.id": "otel-base",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.usage.input_tokens": 1000,
        "gen_ai.usage.output_tokens": 100,
    }
    span: dict[str, Any] = {
        "traceId": "aaaa",
        "spanId": "bbbb",
        "name": "chat",
        "startTimeUnixNano": str(T0_NS),
        "endTimeUnixNano": str(T0_NS + 2_500_000_000),
    }
    resource: list[dict[str, Any]] = [_attr("service.name", "gw")]
    if case.field == "traceId:spanId":
        del attrs["gen_ai.response.id"]
        span["traceId"], span["spanId"] = case.value
    elif case.field in ("startTimeUnixNano", "endTimeUnixNano"):
        span[case.field] = case.value
    elif case.field == "status.code":
        span["status"] = {"code": case.value}
    elif case.field.startswith("resource:"):
        resource.append(_attr(case.field.removeprefix("resource:"), case.value))
    else:
        if case.field == "gen_ai.response.model":
            attrs["gen_ai.request.model"] = "gpt-4o"  # the response's model wins
        attrs[case.field] = case.value
    span["attributes"] = [_attr(k, v) for k, v in attrs.items()]
    return {"resourceSpans": [{"resource": {"attributes": resource}, "scopeSpans": [{"spans": [span]}]}]}


def _write(case: Case, folder: Path) -> tuple[Path, dict[str, Any]]:
    """The case's file and the ingest options it needs."""
    kw: dict[str, Any] = {"fmt": case.fmt}
    if case.fmt == "openai":
        rec = _nest(_record(case, OPENAI_BASE, OPENAI_COLUMN, FORMATS["openai"].fields))
        path = folder / "log.jsonl"
        path.write_text(json.dumps(rec) + "\n")
    elif case.fmt == "anthropic":
        rec = _nest(_record(case, ANTHROPIC_BASE, ANTHROPIC_COLUMN, FORMATS["anthropic"].fields))
        path = folder / "log.jsonl"
        path.write_text(json.dumps(rec) + "\n")
    elif case.fmt == "litellm":
        rec = _nest(_record(case, LITELLM_BASE, LITELLM_COLUMN, FORMATS["litellm"].fields))
        if case.container == "csv":
            path = folder / "spend.csv"
            path.write_text(_csv([rec]))
        elif case.container == "jsonl":
            path = folder / "spend.jsonl"
            path.write_text(json.dumps(rec) + "\n")
        else:
            path = folder / "spend.json"
            path.write_text(json.dumps([rec], indent=1))
    elif case.fmt in ("azure", "vidur"):
        base = AZURE_BASE if case.fmt == "azure" else VIDUR_BASE
        rec = _record(case, base, TRACE_COLUMN, FORMATS[case.fmt].fields)
        path = folder / "trace.csv"
        path.write_text(_csv([rec]))
        if case.fmt == "vidur":
            kw["date"] = ANCHOR
    elif case.fmt == "mooncake":
        rec = _record(case, MOONCAKE_BASE, TRACE_COLUMN, FORMATS["mooncake"].fields)
        path = folder / "trace.jsonl"
        path.write_text(json.dumps(rec) + "\n")
        kw["date"] = ANCHOR
    elif case.fmt == "otel":
        path = folder / "spans.json"
        path.write_text(json.dumps(_otel_doc(case)) + "\n")
    else:
        path, kw = _write_generic(case, folder)
    return path, kw


def _write_generic(case: Case, folder: Path) -> tuple[Path, dict[str, Any]]:
    values: dict[str, Any] = dict(GENERIC_REQUIRED)
    options = dict(case.options)
    name = case.field
    if name.startswith("option:"):
        option = name.removeprefix("option:")
        if option == "time_unit":
            name = "arrival"
        elif option == "block_size":
            name = "prefix_block_hashes"
        elif option == "input_excludes_cache":
            name = "cache_hit_tokens"
        else:
            name = ""
    if name:
        values[name] = case.value
    values.update({k: v for k, v in case.extra.items() if v is not None})
    if name == "prefix_block_hashes" and case.container == "csv":
        values[name] = " ".join(str(h) for h in case.value)
    unit = options.pop("time_unit", "auto")
    options_date = {"date": ANCHOR} if unit.startswith("relative") else {}
    # a column name per field; JSON Lines reads dotted paths into nested objects
    col = {k: (f"src.{k}" if case.container == "jsonl" else f"col_{k}") for k in values}
    mapping = {"format": case.container, "time_unit": unit, **options}
    lines = [f"{k} = {json.dumps(v)}" for k, v in mapping.items()]
    lines += ["", "[fields]"] + [f"{k} = {json.dumps(c)}" for k, c in col.items()]
    toml = folder / "mapping.toml"
    toml.write_text("\n".join(lines) + "\n")
    if case.container == "csv":
        path = folder / "log.csv"
        path.write_text(_csv([{col[k]: v for k, v in values.items()}]))
    elif case.container == "jsonl":
        path = folder / "log.jsonl"
        path.write_text(json.dumps(_nest({col[k]: v for k, v in values.items()})) + "\n")
    else:
        path = folder / "log.parquet"
        data: dict[str, Any] = {}
        for k, v in values.items():
            if k == "arrival" and isinstance(v, str) and unit == "auto":
                data[col[k]] = pl.Series([v]).str.to_datetime(time_unit="us", time_zone="UTC")
            else:
                data[col[k]] = [v]
        pl.DataFrame(data).write_parquet(path)
    return path, {"fmt": case.container, "mapping": toml, **options_date}


# --- the round trip -----------------------------------------------------------------------------


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return math.isclose(got, want, rel_tol=0, abs_tol=1e-9)
    return bool(got == want)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_field_round_trip(case: Case, tmp_path: Path) -> None:
    path, kw = _write(case, tmp_path)
    store = Store(tmp_path / "store")
    summary = ingest_logs([path], store, **kw)
    assert summary.ok, summary.errors
    assert (summary.total("rows_read"), summary.total("rows_stored"), summary.total("rows_quarantined")) == (1, 1, 0)
    rows = pl.concat([store.read_requests(d) for d in store.dates()]).to_dicts()
    assert len(rows) == 1
    got = rows[0]
    for column, want in case.expect.items():
        assert _same(got[column], want), (column, got[column], want)


# --- every field the code reads, and every field the docs name, has a case -----------------------


def _case_fields(fmt: str, container: str = "") -> set[str]:
    return {c.field for c in CASES if c.fmt == fmt and (not container or c.container == container)}


def test_every_read_field_has_a_case() -> None:
    for fmt in ("openai", "anthropic", "azure", "mooncake", "vidur"):
        read = {p for name, ps in FORMATS[fmt].fields.items() if name not in MARKS.get(fmt, set()) for p in ps}
        assert read <= _case_fields(fmt), (fmt, sorted(read - _case_fields(fmt)))
    litellm = {p for name, ps in FORMATS["litellm"].fields.items() if name not in MARKS["litellm"] for p in ps}
    for container in ("csv", "jsonl", "array"):
        missing = (litellm | set(LITELLM_CACHED_PATHS)) - _case_fields("litellm", container)
        assert not missing, (container, sorted(missing))
    otel = {*OTEL_ATTRIBUTES, *_OTEL_TENANT, *_OTEL_TTFT, "startTimeUnixNano", "endTimeUnixNano", "status.code"}
    assert otel <= _case_fields("otel"), sorted(otel - _case_fields("otel"))
    # the OTel spec's flat columns are the attributes and span fields above, nothing else
    span_fields = {"span_id", "trace_id", "start", "end", "tenant", "status", "ttft_raw"}
    assert set(FORMATS["otel"].fields) == {*(a.replace(".", "/") for a in OTEL_ATTRIBUTES), *span_fields}
    options = {f"option:{k}" for k in _TOP_KEYS - {"fields", "format"}}
    for container in ("csv", "jsonl", "parquet"):
        missing = (set(FIELD_TO_CANDIDATE) | options) - _case_fields(container, container)
        assert not missing or (missing == {"option:time_unit"} and container != "jsonl"), (container, sorted(missing))
    # every stored column a field can fill is filled by some case
    filled = {k for c in CASES for k in c.expect}
    names = set(load_schema("requests").names) - {"source_file", "source_line"}
    assert names <= filled, sorted(names - filled)


#: Words in the docs' format rows that are no source field: values, options, stored columns.
DOC_WORDS = {"ExportTraceServiceRequest", "input_excludes_cache"}


def _doc_rows() -> dict[str, list[str]]:
    """Backticked names in the rows of docs/ingest.md's two format tables, by format."""
    text = (REPO / "docs" / "ingest.md").read_text()
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        formats = [f for f in re.findall(r"`([a-z]+)`", line.split("|")[1]) if f in FORMATS]
        names = re.findall(r"`([^`]+)`", line.split("|", 2)[2])
        for fmt in formats:
            out.setdefault(fmt, []).extend(names)
    return out


def test_every_documented_field_has_a_case() -> None:
    """Each name docs/ingest.md gives in a format's rows is a field with a case of that format (a
    case at a nested path such as ``response.body.usage.prompt_tokens`` covers the documented
    ``usage.prompt_tokens``), a stored column, or one of DOC_WORDS; record layouts (``{...}``),
    patterns (``gen_ai.*``), options (``--date``) and quoted values (``"error"``) are passed over."""
    rows = _doc_rows()
    assert set(rows) == set(FORMATS), sorted(set(FORMATS) - set(rows))
    stored = set(load_schema("requests").names)
    for fmt, names in rows.items():
        fields = _case_fields(fmt)
        for name in names:
            if name.startswith(("{", "--", '"')) or name.endswith("*"):
                continue  # a record's layout (its fields named in the other columns), an option, a value, a pattern
            # a formula (`endTime − startTime`) or a list (`TIMESTAMP, ContextTokens, ...`): each name
            for word in re.findall(r"[A-Za-z_][\w./-]*", name):
                if word in stored or word in DOC_WORDS:
                    continue
                covered = {f for f in fields if word in f.split(":") or f.endswith("." + word)}
                assert covered, (fmt, word, name)
