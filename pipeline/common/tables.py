"""Printing Arrow tables for people (rich) and programs (CSV, JSON, Parquet)."""

from __future__ import annotations

import io
import json
import math
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipeline.common.defaults import OUTPUT_FORMATS
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import atomic_write_bytes

FORMATS = OUTPUT_FORMATS


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.4g}"
        return f"{v:,.4f}".rstrip("0").rstrip(".")
    if isinstance(v, datetime):
        return v.isoformat(sep=" ")
    return str(v)


def _jsonable(v: Any) -> Any:
    """A JSON-ready copy of one Arrow value, nested values included (non-finite floats: null)."""
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, datetime | date | time):
        return v.isoformat()
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return str(v)


def _csv_ready(t: pa.DataType) -> bool:
    """Whether pyarrow's CSV writer takes this column type as it is."""
    if pa.types.is_dictionary(t):
        return _csv_ready(t.value_type)
    return (
        pa.types.is_null(t)
        or pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or (pa.types.is_temporal(t) and not pa.types.is_interval(t))
    )


def _csv_text(v: Any, nested: bool) -> str | None:
    if v is None:
        return None
    return json.dumps(_jsonable(v), ensure_ascii=False, default=str) if nested else str(_jsonable(v))


def for_csv(table: pa.Table) -> pa.Table:
    """Nested cells (struct, list, map, union) become JSON text; other exotic cells become text."""
    for i, field in enumerate(table.schema):
        if _csv_ready(field.type):
            continue
        nested = pa.types.is_nested(field.type)
        cells = [
            None
            if v is None
            else json.dumps(_jsonable(v), ensure_ascii=False, default=str)
            if nested
            else str(_jsonable(v))
            for v in table.column(i).to_pylist()
        ]
        table = table.set_column(i, pa.field(field.name, pa.string()), pa.array(cells, pa.string()))
    return table


def table_to_json(table: pa.Table) -> list[dict[str, Any]]:
    return [{k: _jsonable(v) for k, v in row.items()} for row in table.to_pylist()]


def render(table: pa.Table, fmt: str, out: Path | None = None, title: str | None = None) -> str | None:
    """Render ``table`` (any column type DuckDB returns); returns text for stdout, or None when
    written to ``out``. A file that cannot be written or a value the format cannot hold is one
    RooftraceError line."""
    try:
        return _render(table, fmt, out, title)
    except OSError as exc:
        raise RooftraceError(f"cannot write {out}: {exc.strerror or exc}") from None
    except (pa.ArrowException, TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RooftraceError(f"cannot write the result as {fmt}: {first}") from None


def _render(table: pa.Table, fmt: str, out: Path | None, title: str | None) -> str | None:
    if fmt not in FORMATS:
        raise RooftraceError(f"unknown format {fmt!r}; use one of {FORMATS}")
    if fmt == "parquet":
        if out is None:
            raise RooftraceError("--format parquet needs --out FILE")
        buf = io.BytesIO()
        pq.write_table(table, buf)
        atomic_write_bytes(out, buf.getvalue())
        return None
    if fmt == "csv":
        buf = io.BytesIO()
        pacsv.write_csv(for_csv(table), buf)
        text = buf.getvalue().decode()
    elif fmt == "json":
        text = json.dumps(table_to_json(table), indent=2, default=str) + "\n"
    else:
        # Data is text, never markup or emoji codes: a tenant "[bold]x" or a path "[/x]" prints as
        # it is (as Text it is not parsed). Rows by position: duplicate column names keep their own values.
        rich_table = Table(title=Text(title) if title is not None else None, show_lines=False)
        for name in table.column_names:
            rich_table.add_column(Text(name), overflow="fold")
        columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
        for row in zip(*columns, strict=True):
            rich_table.add_row(*(Text(_cell(v)) for v in row))
        console = Console(
            file=io.StringIO(), width=200, record=True, force_terminal=False, markup=False, emoji=False, highlight=False
        )
        console.print(rich_table)
        text = console.export_text()
    if out is not None:
        atomic_write_bytes(out, text.encode())
        return None
    return text


def json_safe(doc: Any) -> Any:
    """``doc`` with every float that is not finite (NaN, ±Infinity: not JSON) as null."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: json_safe(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [json_safe(v) for v in doc]
    return doc
