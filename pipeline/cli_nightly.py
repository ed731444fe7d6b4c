"""``rooftrace report``, ``rooftrace nightly`` and ``rooftrace demo``."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli_common import emit_json, get_store, json_option, progress, run, store_option
from pipeline.ingest import ALL_FORMATS
from pipeline.loadcurve import DEFAULT_BUDGET_S
from pipeline.nightly import build_index, default_reports_dir, demo, nightly
from pipeline.report import ReportResult, build_report

_reports = click.option(
    "--reports",
    "reports_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Reports folder (default: reports/ in the checkout).",
)


@click.command()
@click.option("--run", "run_id", default=None, help="Replay run id (default: the latest run).")
@click.option("--date", default=None, help="Date of the run (default: the run's own date).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="HTML file to write.")
@click.option(
    "--png",
    "png_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write each chart as PNG here.",
)
@_reports
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

    Example: rooftrace report --png reports/png
    """
    store = get_store(store_path)
    rdir = reports_dir or default_reports_dir()

    def work() -> ReportResult:
        res = build_report(store, run_id, date, out, png_dir, None if out is not None else rdir)
        if out is None:
            build_index(rdir, store.root / ".cache")
        return res

    res = run(work)
    progress(f"report: {res.path} ({len(res.charts)} charts, {res.seconds:.1f} s)")
    if as_json:
        emit_json(res.to_json())


@click.command("nightly")
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--fleet", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True, help="FLEET.toml."
)
@click.option("--date", default=None, help="Date to process (anchor for relative traces); default: newest in LOGS.")
@click.option("--format", "fmt", type=click.Choice(ALL_FORMATS), default=None, help="Log format (default: detect).")
@click.option(
    "--slo", default=None, help="SLO to judge the night against: a preset or targets (default: the fleet's [slo])."
)
@click.option(
    "--headroom-budget",
    type=click.FloatRange(min=0),
    default=DEFAULT_BUDGET_S,
    show_default=True,
    help="Seconds the load curve (traffic x0.5 .. x4 and beyond) may take; points left are marked skipped.",
)
@_reports
@store_option
@json_option
def nightly_cmd(
    logs: tuple[Path, ...],
    fleet: Path,
    date: str | None,
    fmt: str | None,
    slo: str | None,
    headroom_budget: float,
    reports_dir: Path | None,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Run ingest, classify, replay, warehouse and report for one night.

    Writes reports/<date>/index.html and updates reports/index.html. Safe to re-run; a second run
    on the same store at the same time is refused; a failed stage is named and earlier outputs
    are kept.

    Example: rooftrace nightly logs/2025-01-15/ --fleet fleets/default.toml
    """
    store = get_store(store_path)
    res = run(lambda: nightly(list(logs), fleet, store, date, reports_dir, fmt, progress, slo, headroom_budget))
    for w in res.headline.get("warnings") or []:
        progress(f"warning: {w}")
    progress(res.line())
    if as_json:
        emit_json(res.to_json())


@click.command("demo")
@_reports
@store_option
@json_option
def demo_cmd(reports_dir: Path | None, store_path: str | None, as_json: bool) -> None:
    """Run the nightly job on the bundled sample (Azure 2023 conversation trace) with the default
    fleet, and print where the report is.

    Example: rooftrace demo
    """
    store = get_store(store_path)
    results = run(lambda: demo(store, reports_dir, progress))
    for res in results:
        for w in res.headline.get("warnings") or []:
            progress(f"warning: {w}")
        progress(res.line())
        click.echo(f"report: {res.report}")
    if as_json:
        emit_json([r.to_json() for r in results])
