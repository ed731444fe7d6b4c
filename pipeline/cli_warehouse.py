"""``rooftrace sql`` and ``rooftrace query``: the warehouse from the command line."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli_common import emit_json, get_store, progress, run, store_option
from pipeline.tables import FORMATS, render, table_to_json
from pipeline.warehouse import build_warehouse, list_queries, run_query, run_sql

_format = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format."
)
_out = click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write to FILE.")


@click.command()
@click.argument("query")
@_format
@_out
@store_option
def sql(query: str, fmt: str, out: Path | None, store_path: str | None) -> None:
    """Run SQL on the read-only warehouse (STORE/warehouse.duckdb).

    Views: requests, quarantine, manifest, accounting_requests, accounting_minutes, cache_curve,
    runs, replay_requests, replay_steps, replay_series.

    Example: rooftrace sql "SELECT model, count(*) FROM requests GROUP BY model"
    """
    store = get_store(store_path)
    table = run(lambda: run_sql(store, query))
    text = run(lambda: render(table, fmt, out))
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
    store = get_store(store_path)
    values: dict[str, object] = {"run_id": run_id, "date": date}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--param")
        try:
            values[key] = float(value)
        except ValueError:
            values[key] = value
    if rebuild:
        run(lambda: build_warehouse(store))
    table = run(lambda: run_query(store, name, values))
    if fmt == "json" and out is None:
        emit_json(table_to_json(table))
        return
    text = run(lambda: render(table, fmt, out, title=name))
    if text is not None:
        click.echo(text, nl=False)
    else:
        progress(f"wrote {table.num_rows} rows to {out}")
