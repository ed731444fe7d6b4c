"""``rooftrace sql`` and ``rooftrace query``: the warehouse from the command line.

Both only read the store: the warehouse runs in a DuckDB sandbox (see
:func:`pipeline.warehouse.connect`), a missing store is an error rather than a new empty one,
and ``--out`` may not point inside the store.
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
import pyarrow as pa

from pipeline.cli_common import emit_json, get_store, progress, run, store_option
from pipeline.errors import RooftraceError
from pipeline.schemas import atomic_write_bytes
from pipeline.store import Store
from pipeline.tables import FORMATS, render, table_to_json
from pipeline.warehouse import build_warehouse, get_query, list_queries, require_store, run_query, run_sql

_format = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format."
)
_out = click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write to FILE.")


def _plain(v: Any) -> Any:
    """A JSON-ready copy of one Arrow value (nested values included)."""
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
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
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


def _text(v: Any, nested: bool) -> str | None:
    if v is None:
        return None
    if nested:
        return json.dumps(_plain(v), ensure_ascii=False, default=str)
    return str(_plain(v))


def _for_csv(table: pa.Table) -> pa.Table:
    """Nested cells (struct, list, map, union) become JSON text; other exotic cells become text."""
    for i, field in enumerate(table.schema):
        if _csv_ready(field.type):
            continue
        nested = pa.types.is_nested(field.type)
        cells = [_text(v, nested) for v in table.column(i).to_pylist()]
        table = table.set_column(i, pa.field(field.name, pa.string()), pa.array(cells, pa.string()))
    return table


def _check_out(store: Store, out: Path | None) -> None:
    """``--out`` may not point inside the store: reading the warehouse never changes the store."""
    if out is None:
        return
    root = store.root.resolve()
    target = out.resolve()
    if target == root or root in target.parents:
        raise RooftraceError(f"--out {out} is inside the store {store.root}; write query output elsewhere")


def _check_run_option(name: str, params: tuple[str, ...], run_id: str | None) -> None:
    """``--run`` given to a query that takes no run id is a mistake, not something to ignore."""
    if run_id is not None and "run_id" not in {p.rstrip("?") for p in params}:
        takes = ", ".join(params) or "none"
        raise RooftraceError(f"query {name!r} takes no --run (its parameters: {takes})")


def _rebuild(store: Store) -> None:
    try:
        build_warehouse(store)
    except OSError as exc:
        raise RooftraceError(f"cannot rebuild the warehouse in {store.root}: {exc.strerror or exc}") from None


def _render(table: pa.Table, fmt: str, out: Path | None, title: str | None = None) -> str | None:
    """Render like :func:`pipeline.tables.render`, for any column type DuckDB returns."""
    try:
        if fmt == "json":
            rows = [{k: _plain(v) for k, v in row.items()} for row in table.to_pylist()]
            text = json.dumps(rows, indent=2, default=str) + "\n"
            if out is None:
                return text
            atomic_write_bytes(out, text.encode())
            return None
        return render(_for_csv(table) if fmt == "csv" else table, fmt, out, title=title)
    except OSError as exc:
        raise RooftraceError(f"cannot write {out}: {exc.strerror or exc}") from None
    except (pa.ArrowException, TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RooftraceError(f"cannot write the result as {fmt}: {first}") from None


@click.command()
@click.argument("query")
@_format
@_out
@store_option
def sql(query: str, fmt: str, out: Path | None, store_path: str | None) -> None:
    """Run SQL on the read-only warehouse (STORE/warehouse.duckdb).

    Views: requests, quarantine, manifest, accounting_requests, accounting_minutes, cache_curve,
    runs, replay_requests, replay_steps, replay_series.

    Only queries run (SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE), and they read only files
    under the store: COPY, EXPORT, ATTACH, INSTALL/LOAD, SET/RESET/PRAGMA and reads of other
    files are refused. In CSV output, nested values (structs, lists, maps) are JSON text.

    Example: rooftrace sql "SELECT model, count(*) FROM requests GROUP BY model"
    """
    store = run(lambda: get_store(store_path))
    run(lambda: require_store(store))
    run(lambda: _check_out(store, out))
    table = run(lambda: run_sql(store, query))
    text = run(lambda: _render(table, fmt, out))
    if text is not None:
        click.echo(text, nl=False)


@click.command()
@click.argument("name", required=False)
@click.option("--list", "list_", is_flag=True, help="List the named queries with their descriptions.")
@click.option("--run", "run_id", default=None, help="Replay run id (default: the latest run).")
@click.option("--date", default=None, help="Date YYYY-MM-DD (default: the latest in the store).")
@click.option("--param", "params", multiple=True, help="Extra parameter NAME=VALUE (e.g. ttft_slo_s=2).")
@click.option("--rebuild", is_flag=True, help="Rebuild the warehouse views first.")
@_format
@_out
@store_option
def query(
    name: str | None,
    list_: bool,
    run_id: str | None,
    date: str | None,
    params: tuple[str, ...],
    rebuild: bool,
    fmt: str,
    out: Path | None,
    store_path: str | None,
) -> None:
    """Run a named query (pipeline/queries/NAME.sql) on the warehouse.

    An unknown --run id is an error that names the nearest known runs.

    Example: rooftrace query latency --format json
    """
    if list_ or name is None:
        queries = list_queries()
        if fmt == "json":
            emit_json([{"name": q.name, "params": list(q.params), "description": q.description} for q in queries])
            return
        for q in queries:
            args = f" [{', '.join(q.params)}]" if q.params else ""
            click.echo(f"{q.name}{args}\n    {q.description}\n")
        return
    store = run(lambda: get_store(store_path))
    named = run(lambda: get_query(name))
    run(lambda: _check_run_option(name, named.params, run_id))
    values: dict[str, object] = {"run_id": run_id, "date": date}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--param")
        try:
            values[key] = value if key in ("run_id", "date") else float(value)
        except ValueError:
            values[key] = value
    run(lambda: require_store(store))
    run(lambda: _check_out(store, out))
    if rebuild:
        run(lambda: _rebuild(store))
    table = run(lambda: run_query(store, name, values))
    if fmt == "json" and out is None:
        emit_json(table_to_json(table))
        return
    text = run(lambda: _render(table, fmt, out, title=name))
    if text is not None:
        click.echo(text, nl=False)
    else:
        progress(f"wrote {table.num_rows} rows to {out}")
