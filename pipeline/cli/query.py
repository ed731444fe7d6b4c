"""``rooftrace query``: a named query (pipeline/publish/queries/NAME.sql) on the read-only warehouse."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.cli.common import (
    emit_json,
    emit_output,
    get_store,
    json_option,
    output_options,
    run,
    store_option,
    warn,
)


@click.command()
@click.argument("name", required=False)
@click.option("--list", "list_", is_flag=True, help="List the named queries with their descriptions.")
@click.option("--run", "run_id", default=None, help="Replay run id (default: the latest run).")
@click.option("--date", default=None, help="Date YYYY-MM-DD (default: the latest in the store).")
@click.option("--param", "params", multiple=True, help="Extra parameter NAME=VALUE (e.g. ttft_slo_s=2).")
@click.option("--rebuild", is_flag=True, help="Rebuild the warehouse views (done by itself when the store changed).")
@output_options
@json_option
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
    as_json: bool,
    store_path: str | None,
) -> None:
    """Run a named query (pipeline/publish/queries/NAME.sql) on the warehouse.

    An unknown --run id is an error that names the nearest known runs, and so is a run the
    warehouse left out as damaged (named with what is wrong); without --run, the latest run it
    can read. --param date=/run_id= are checked as --date/--run are (one contradicting them is
    refused); a seconds parameter (ttft_slo_s) is a number > 0. SIGTERM stops a query as Ctrl-C does (exit code 143).

    Percentiles are the inverse CDF (the smallest value with at least p % of the rows at or below
    it). tpot_s is what AIPerf and GuideLLM call ITL; itl_s is vLLM's benchmark's ITL. Tables show
    latencies in ms (ttft_s as ttft_ms); csv, json and parquet keep seconds. A query over classify's
    tables whose day got more requests since classify ran says so first (stale_classify in --json).

    Example: rooftrace query latency --format json
    """
    fmt = "json" if as_json else fmt  # --json is --format json, as on every command
    from pipeline.common.tables import table_to_json
    from pipeline.publish.warehouse import (
        STDOUT,
        check_classified,
        check_date_option,
        check_named_ids,
        check_out_path,
        check_run_option,
        check_unique_names,
        get_query,
        list_queries,
        merge_option_params,
        parse_params,
        require_store,
        run_query,
        sigterm_exits,
        sql_output,
        stale_classify_note,
        stdout_errors,
    )
    from pipeline.publish.warehouse import (
        rebuild as rebuild_warehouse,
    )

    if list_ or name is None:
        queries = list_queries()
        with stdout_errors():  # > /dev/full: one line, not a traceback
            if fmt == "json":
                emit_json([{"name": q.name, "params": list(q.params), "description": q.description} for q in queries])
                return
            for q in queries:
                args = f" [{', '.join(q.params)}]" if q.params else ""
                click.echo(f"{q.name}{args}\n    {q.description}\n")
        return
    with sigterm_exits():
        store = run(lambda: get_store(store_path))
        named = run(lambda: get_query(name))
        given = run(lambda: parse_params(named, params))
        # --param run_id=/date= are --run/--date, checked as they are (a contradiction is refused)
        run_id, date, given = run(lambda: merge_option_params(given, run_id, date))
        run(lambda: check_run_option(name, named.params, run_id))
        values: dict[str, object] = {"run_id": run_id, "date": date, **given}
        run(lambda: require_store(store))
        run(lambda: check_date_option(store, date, run_id, named))
        run(lambda: check_named_ids(store, named, given))
        if run_id is None:  # (a run's date is its own; classify's tables are not read by run)
            run(lambda: check_classified(store, named, date))
        if out != STDOUT:
            run(lambda: check_out_path(store, out))
        if rebuild:
            run(lambda: rebuild_warehouse(store))
        stale = run(lambda: stale_classify_note(store, named, date))
        if stale is not None:  # the first line: the day's accounting predates its requests
            warn(stale)
        table = run(lambda: run_query(store, name, values))
    if fmt == "json" and out is None:
        run(lambda: check_unique_names(table.column_names, fmt))
        rows = table_to_json(table)
        if stale is not None:
            rows = [{**row, "stale_classify": stale} for row in rows]
        with stdout_errors():
            emit_json(rows)
        return
    # as `sql` prints: control characters escaped, at most 1,000 table rows on stdout, --out -
    result = run(lambda: sql_output(table, fmt, out, tty=sys.stdout.isatty(), title=name))
    with stdout_errors():
        emit_output(result, f"wrote {table.num_rows} rows to {out}")
