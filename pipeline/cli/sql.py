"""``rooftrace sql``: SQL on the read-only warehouse.

The warehouse runs in a DuckDB sandbox (pipeline/warehouse.py, ``connect``): only queries run and
only files under the store are read; a missing store is an error rather than a new empty one, and
``--out`` may not point inside the store.
"""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.common import get_store, json_option, output_options, run, store_option


@click.command()
@click.argument("query")
@output_options
@json_option
@store_option
def sql(query: str, fmt: str, out: Path | None, as_json: bool, store_path: str | None) -> None:
    """Run SQL on the read-only warehouse (STORE/warehouse.duckdb).

    Views: requests, quarantine, manifest, accounting_requests, accounting_minutes, cache_curve,
    runs, replay_requests, replay_steps, replay_series.

    Only queries run (SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE), and they read only files
    under the store: COPY, EXPORT, ATTACH, INSTALL/LOAD, SET/RESET/PRAGMA and reads of other
    files are refused. In CSV output, nested values (structs, lists, maps) are JSON text.

    Example: rooftrace sql "SELECT model, count(*) FROM requests GROUP BY model"
    """
    fmt = "json" if as_json else fmt  # --json is --format json, as on every command
    from pipeline.tables import render
    from pipeline.warehouse import check_out_path, require_store, run_sql

    store = run(lambda: get_store(store_path))
    run(lambda: require_store(store))
    run(lambda: check_out_path(store, out))
    table = run(lambda: run_sql(store, query))
    text = run(lambda: render(table, fmt, out))
    if text is not None:
        click.echo(text, nl=False)
