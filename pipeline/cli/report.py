"""``rooftrace report``: the offline HTML capacity report of a run (pipeline/publish/report.py)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.common import (
    check_out_of_store,
    emit_json,
    get_store,
    json_option,
    progress,
    reports_option,
    run,
    store_option,
)


@click.command()
@click.option("--run", "run_id", default=None, help="Replay run id (default: the latest run).")
@click.option("--date", default=None, help="Date of the run (default: the run's own date).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="HTML file to write (headline.json goes beside it; not '-').",
)
@click.option(
    "--png",
    "png_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write each chart as PNG here.",
)
@reports_option
@store_option
@json_option
def report(
    run_id: str | None,
    date: str | None,
    out: Path | None,
    png_dir: Path | None,
    reports_dir: Path | None,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Write the offline HTML capacity report of a replay run and refresh reports/index.html.

    Goes to reports/<date>/<fleet>/; a what-if run (--rate-scale, --replicas, --concurrency,
    --offline) or any run other than the one the nightly published there goes to
    reports/<date>/<fleet>/what-if/<run_id>/, so the nightly's report and index row stay.
    A chart with nothing to draw is said so on the page and not written as PNG.

    Example: rooftrace report --png reports/png
    """
    from pipeline.common.errors import RooftraceError
    from pipeline.ingest.project import default_reports_dir
    from pipeline.publish.nightly import build_index
    from pipeline.publish.report import ReportResult, build_report

    store = get_store(store_path)
    rdir = reports_dir or default_reports_dir()

    def work() -> ReportResult:
        # never over the store's own files: a report written to the run's config.json or
        # requests.parquet would leave the run it reports unreadable
        if out is not None:
            check_out_of_store(store, out, "--out")
            check_out_of_store(store, out.parent / "headline.json", "--out (its headline.json)")
        else:
            check_out_of_store(store, rdir, "--reports")
        check_out_of_store(store, png_dir, "--png")
        res = build_report(store, run_id, date, out, png_dir, None if out is not None else rdir)
        if out is None:
            try:
                build_index(rdir, store.cache_dir)
            except OSError as exc:
                raise RooftraceError(f"cannot write the reports index in {rdir}: {exc.strerror or exc}") from None
        return res

    res = run(work)
    for line in res.warning_lines():  # a STALE run, not-valid unit costs: before the summary line
        progress(f"warning: {line}")
    progress(res.line())
    if as_json:
        emit_json(res.to_json())
