"""``rooftrace nightly``: ingest, classify, replay, headroom, warehouse and report for one day
(pipeline/publish/nightly.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.cli.common import (
    check_out_of_store,
    emit_json,
    get_store,
    jobs_option,
    json_option,
    pod_options,
    progress,
    reports_option,
    run,
    store_option,
    warn,
)
from pipeline.common.defaults import DEFAULT_HEADROOM_BUDGET_S, INGEST_FORMATS

#: Exit code of a nightly that ran to the end and wrote its report, but whose night needs someone
#: to act: requests rejected, the fleet overloaded, the SLO failed, or at least 1 % of the log rows
#: quarantined (docs/reports.md, "Exit codes"). 1 stays "the nightly itself failed".
EXIT_ATTENTION = 3


def _not_nan(value: float) -> float:
    if value != value:  # FloatRange(min=0) lets nan through (nan < 0 is false)
        raise click.BadParameter("not a number of seconds (nan); give seconds >= 0, or inf for no limit")
    return value


def _warn_all(headline: dict[str, object]) -> None:
    """The night's warnings (pipeline.publish.nightly.night_warnings), one escaped ``warning:`` line each."""
    from pipeline.publish.nightly import night_warnings

    for w in night_warnings(headline):
        warn(w.text)


@click.command("nightly")
@click.argument("logs", nargs=-1, required=True, type=click.Path())  # as typed: '' is refused, not '.'
@click.option(
    "--fleet", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True, help="FLEET.toml."
)
@click.option("--date", default=None, help="Date to process (anchor for relative traces); default: newest in LOGS.")
@click.option("--format", "fmt", type=click.Choice(INGEST_FORMATS), default=None, help="Log format (default: detect).")
@click.option(
    "--slo", default=None, help="SLO to judge the night against: a preset or targets (default: the fleet's [slo])."
)
@click.option(
    "--headroom-budget",
    type=click.FloatRange(min=0),
    default=DEFAULT_HEADROOM_BUDGET_S,
    show_default=True,
    callback=lambda ctx, param, value: _not_nan(value),
    help="Seconds the load curve (traffic x0.5 .. x4 and beyond) may take; points left are marked skipped "
    "(inf: no limit).",
)
@click.option(
    "--dedupe-across-formats",
    "dedupe_across_formats",
    is_flag=True,
    help="As ingest's: store a request logged in two formats (the same request id, arrival and tokens) once.",
)
@jobs_option
@pod_options
@reports_option
@store_option
@json_option
def nightly_cmd(
    logs: tuple[str, ...],
    fleet: Path,
    date: str | None,
    fmt: str | None,
    slo: str | None,
    headroom_budget: float,
    jobs: int,
    pods: int,
    executor: str,
    ray_address: str | None,
    dedupe_across_formats: bool,
    reports_dir: Path | None,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Run ingest, classify, replay, headroom, cost, warehouse and report for one night.

    Writes reports/<date>/<fleet>/index.html and updates reports/index.html. Safe to re-run; a
    second run on the same store at the same time is refused; a failed stage is named and earlier
    outputs are kept.

    Exit codes: 0 the night is healthy; 3 the report was written but the night needs someone to
    act (requests rejected, overload, a failed SLO, or at least 1% of the log rows quarantined;
    the last line says which); 1 a stage failed, named on the last line (ingest, classify or
    replay: nothing published for the night; headroom, cost or warehouse: the later stages
    still ran and the report was written without it); 130 Ctrl-C.

    Example: rooftrace nightly logs/2025-01-15/ --fleet fleets/default.toml
    """
    from pipeline.engine.jitcache import compile_ahead
    from pipeline.ingest.project import default_reports_dir
    from pipeline.publish.nightly import NightlyResult, StageError, nightly

    compile_ahead()  # a fresh clone's first night: the engine compiles while ingest and classify run
    store = get_store(store_path)

    def work() -> NightlyResult:
        check_out_of_store(store, reports_dir or default_reports_dir(), "--reports")
        try:
            return nightly(
                list(logs),
                fleet,
                store,
                date,
                reports_dir,
                fmt,
                progress,
                slo,
                headroom_budget,
                jobs=jobs,
                pods=pods,
                executor=executor,
                ray_address=ray_address,
                dedupe_across_formats=dedupe_across_formats,
            )
        except StageError as exc:
            if exc.result is not None:  # a stage after the replay failed, the report was written
                _warn_all(exc.result.headline)
                progress(exc.result.line())
            raise

    res = run(work)
    _warn_all(res.headline)
    progress(res.line())
    code = EXIT_ATTENTION if res.attention else 0
    if as_json:
        emit_json({**res.to_json(), "exit_code": code})
    if code:
        sys.exit(code)
