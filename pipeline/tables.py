"""Printing Arrow tables for people (rich) and programs (CSV, JSON, Parquet)."""

from __future__ import annotations

import io
import json
import math
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from pipeline.errors import RooftraceError
from pipeline.schemas import atomic_write_bytes

FORMATS = ("table", "csv", "json", "parquet")


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
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def table_to_json(table: pa.Table) -> list[dict[str, Any]]:
    return [{k: _jsonable(v) for k, v in row.items()} for row in table.to_pylist()]


def render(table: pa.Table, fmt: str, out: Path | None = None, title: str | None = None) -> str | None:
    """Render ``table``; returns text for stdout, or None when written to ``out``."""
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
        pacsv.write_csv(table, buf)
        text = buf.getvalue().decode()
    elif fmt == "json":
        text = json.dumps(table_to_json(table), indent=2) + "\n"
    else:
        rich_table = Table(title=title, show_lines=False)
        for name in table.column_names:
            rich_table.add_column(name, overflow="fold")
        for row in table.to_pylist():
            rich_table.add_row(*(_cell(row[c]) for c in table.column_names))
        console = Console(file=io.StringIO(), width=200, record=True, force_terminal=False)
        console.print(rich_table)
        text = console.export_text()
    if out is not None:
        atomic_write_bytes(out, text.encode())
        return None
    return text
