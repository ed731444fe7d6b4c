"""``rooftrace sql``: SQL on the read-only warehouse.

The warehouse runs in a DuckDB sandbox (pipeline/publish/warehouse.py, ``connect``): only queries run and
only files under the store are read; a missing store is an error rather than a new empty one, and
``--out`` may not point inside the store.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.cli.common import get_store, json_option, output_options, progress, run, store_option


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

    One statement a call: SQL holding several is refused (only the last result would print).

    DuckDB may use at most the replay's memory limit ($ROOFTRACE_MAX_MEMORY, default half the
    physical memory); a query past it fails with one line. The result is streamed in batches, so
    csv, json and parquet output of any size stays within it; a table is laid out whole, and one
    too large for the limit is refused with one line. Ctrl-C stops a query (exit code 130), and
    SIGTERM too (exit code 143).

    The table format shows control characters in the data as escapes (\\x1b) and prints at most
    1,000 rows (a note on stderr says how many more; --format csv or json give all). Dates and
    timestamps outside years 1..9999 (and +-infinity) print as DuckDB writes them. --out -
    writes to stdout; --out FILE creates its folder and says how many rows it wrote.

    Example: rooftrace sql "SELECT model, count(*) FROM requests GROUP BY model"
    """
    fmt = "json" if as_json else fmt  # --json is --format json, as on every command
    from pipeline.publish.warehouse import STDOUT, check_out_path, export_sql, require_store, sigterm_exits

    with sigterm_exits():
        store = run(lambda: get_store(store_path))
        run(lambda: require_store(store))
        if out != STDOUT:
            run(lambda: check_out_path(store, out))
        sys.stdout.flush()
        written = run(lambda: export_sql(store, query, fmt, out, sys.stdout.buffer, tty=sys.stdout.isatty()))
    if written.note is not None:
        progress(written.note)
    from pipeline.publish.warehouse import empty_view_hints

    for hint in run(lambda: empty_view_hints(store, query)):
        progress(f"hint: {hint}")
    if out is not None and out != STDOUT:
        progress(f"wrote {written.rows:,} row{'' if written.rows == 1 else 's'} to {out}")
