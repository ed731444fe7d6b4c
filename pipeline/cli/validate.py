"""``rooftrace validate``: judge the cost model on measurements it was not built from
(pipeline/calibrate/validate.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import click

from pipeline.cli.common import emit_json, get_store, json_option, progress, run, store_option
from pipeline.common.errors import RooftraceError

#: The tables ``validate`` writes under STORE/validation/ (one validation at a time).
VALIDATION_TABLES = (
    "profile_heldout", "prior_heldout", "prior_steps", "prior_die_donors", "errors", "summary", "calibrations",
)  # fmt: skip
#: Where ``validate`` finds the operator measurements when --measurements is not given.
MEASUREMENTS_ENV = "ROOFTRACE_MEASUREMENTS"


def _default_measurements() -> Path:
    env = os.environ.get(MEASUREMENTS_ENV)
    if not env:
        raise RooftraceError(f"no measurements given: pass --measurements DIR or set ${MEASUREMENTS_ENV}")
    return Path(env)


def _pct(x: float) -> str:
    return f"{x:6.1%}" if math.isfinite(x) else "     - "


def refuse_empty(option: str, value: str | None, example: str) -> None:
    """An option given as the empty string names no path (it would read or write the current
    folder, or the default): refused, as ``--store ''`` is."""
    if value is not None and not value.strip():
        raise RooftraceError(f"{option}: the path is empty (name one, e.g. {option} {example})")


def _prior_check(hardware: str | None) -> tuple[Any, Any, Any, Any]:
    """The size-aware prior's leave-one-GPU-out check on the catalog's profiles (operator rows,
    same-die donors' scaled tables, whole steps), for one GPU when ``hardware`` is given."""
    import polars as pl

    from pipeline.costmodel.profile.heldout import heldout_steps
    from pipeline.costmodel.profile.prior import (
        collective_donor_check,
        die_donor_check,
        leave_one_gpu_out,
        load_prior,
        measured_rows,
    )

    progress("judging the size-aware prior: each profiled GPU predicted from the others")
    rows = measured_rows()
    prior = load_prior()
    loo = leave_one_gpu_out(rows)
    fits: dict[str, Any] = {}  # the prior fitted without each GPU, shared by the two checks below
    used = prior.used if prior is not None else None
    steps = heldout_steps(rows, used, only=hardware, fits=fits)
    if hardware is not None and loo.height:
        loo = loo.filter(pl.col("gpu") == hardware)
    progress("judging same-die donors: each profiled GPU from the other one on its die, scaled")
    dies = die_donor_check(rows, only=hardware, used=used, fits=fits)
    if hardware is not None and dies.height:
        dies = dies.filter(pl.col("gpu") == hardware)
    donors = collective_donor_check()
    if donors.height:
        donors = (
            donors.group_by("gpu", "donor", "predictor", maintain_order=True)
            .agg(
                pl.len().alias("rows"),
                pl.col("error").abs().median().alias("median_abs_error"),
                pl.col("error").abs().quantile(0.9).alias("p90_abs_error"),
                pl.col("error").median().alias("bias"),
            )
            .filter(pl.col("gpu") == hardware if hardware is not None else pl.lit(True))
        )
    return loo, steps, donors, dies


def _die_display(dies: Any) -> Any:
    """The same-die check as printed: the MoE shardings summarised per dtype, as _loo_display."""
    cols = ["median_abs_error", "p90_abs_error", "bias", "prior_median_abs_error", "prior_p90_abs_error"]
    return _moe_by_dtype(dies, ["gpu", "donor"], cols)


def _loo_display(loo: Any) -> Any:
    """The prior's held-out table as printed: GEMM and attention families row by row; the fused
    MoE's one curve per (dtype, tp, ep) summarised per dtype (medians over its shardings; every
    row is in prior_heldout.parquet and the JSON)."""
    cols = ["median_abs_error", "p90_abs_error", "bias", "roofline_median_abs_error", "roofline_p90_abs_error"]
    return _moe_by_dtype(loo, ["gpu"], cols)


def _moe_by_dtype(frame: Any, keys: list[str], cols: list[str]) -> Any:
    """``frame``'s rows with the ``moe:<dtype>:tp<t>ep<e>`` families summarised per dtype and
    ``keys`` (medians of ``cols`` over the shardings, rows summed); other families as they are."""
    import polars as pl

    moe = frame.filter(pl.col("family").str.starts_with("moe:"))
    rest = frame.filter(~pl.col("family").str.starts_with("moe:")).select(*keys, "family", "tokens", "rows", *cols)
    if moe.height == 0:
        return rest
    grouped = (
        moe.with_columns(pl.col("family").str.split(":").list.get(1).alias("dtype"))
        .group_by(*keys, "dtype", "tokens", maintain_order=True)
        .agg(pl.len().alias("n"), pl.col("rows").sum(), *[pl.col(c).median() for c in cols])
        .with_columns(pl.format("moe:{} ({} shardings)", "dtype", "n").alias("family"))
        .select(*keys, "family", "tokens", "rows", *cols)
    )
    return pl.concat([rest, grouped])


def _step_summary(steps: Any) -> Any:
    import polars as pl

    return steps.group_by("gpu", "model", "tp", maintain_order=True).agg(
        pl.len().alias("steps"),
        pl.col("prior_error").abs().median().alias("prior_median"),
        pl.col("prior_error").abs().quantile(0.9).alias("prior_p90"),
        pl.col("donor_error").abs().median().fill_null(float("nan")).alias("donor_median"),
        pl.col("donor_error").abs().quantile(0.9).fill_null(float("nan")).alias("donor_p90"),
        pl.col("roofline_error").abs().median().alias("roofline_median"),
        pl.col("roofline_error").abs().quantile(0.9).alias("roofline_p90"),
    )


@click.command("validate")
@click.option(
    "--measurements",
    type=click.Path(),
    default=None,
    help="Folder (or file) of operator measurements: AIConfigurator / LLMServingSim sets (the measured "
    "profiles' held-out check) and Vidur mlp.csv / all_reduce.csv / Splitwise perf_model.csv (the roofline's) "
    "(default: $ROOFTRACE_MEASUREMENTS).",
)
@click.option(
    "--hardware",
    default=None,
    help="Only this catalog GPU: its profiles, its Vidur/Splitwise rows (rows of a table whose labels no "
    "catalog GPU has are taken as it).",
)
@click.option(
    "--runs",
    type=click.Path(),
    default=None,
    help="Folder (or file) of benchmark client results to replay under their own methodology instead: vLLM "
    "`vllm bench serve --save-result --save-detailed` JSON, GuideLLM benchmarks JSON, AIPerf profile_export.jsonl "
    "(docs/benchruns.md); prints the TTFT, TPOT, ITL and E2E errors per run and stores them.",
)
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --runs: the FLEET.toml of the server the runs were made against (default: the project's fleet).",
)
@store_option
@json_option
def validate_cmd(
    measurements: str | None,
    hardware: str | None,
    runs: str | None,
    fleet_path: str | None,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Judge the cost model on measurements it was not built from; print and store the error tables
    under STORE/validation/.

    The measured profiles' interpolation, held out by shape (whole GEMM n x k shapes, whole head
    shapes, whole models of another set, mixed batches never fitted), split by operator class and
    token range (1-127, 128+); the size-aware prior for GPUs without a profile, each profiled GPU
    held out whole (operators, whole steps, NVLink collectives); and the plain roofline with
    catalog and calibrated factors (Vidur, Splitwise). docs/validation.md explains each.

    With --runs, replay benchmark client runs (closed loop at their concurrency, open loop at their
    send times, or all at once) on --fleet and store the errors under STORE/validation/runs.parquet.

    Example: rooftrace validate --measurements path/to/measurements --json

    Example: rooftrace validate --runs results/ --fleet fleets/default.toml
    """
    if runs is not None:
        if measurements is not None or hardware is not None:
            raise click.UsageError("--runs replays benchmark runs; give --measurements / --hardware in another run")
        run(lambda: _validate_runs(runs, fleet_path, store_path, as_json))
        return
    if fleet_path is not None:
        raise click.UsageError("--fleet goes with --runs (the operator checks need no fleet)")

    def body() -> bool:
        from pipeline.calibrate.validate import (
            UnreadableMeasurements,
            discover,
            failed_fit,
            refuse_part_of_a_set,
            run_validation,
            store_report,
        )
        from pipeline.common.schemas import write_parquet
        from pipeline.costmodel.profile.heldout import TARGET_MEDIAN, TARGET_P90, has_profile_sets, judge_all

        refuse_empty("--measurements", measurements, "path/to/measurements")
        source = Path(measurements) if measurements is not None else _default_measurements()
        if not source.exists():
            raise RooftraceError(f"{source}: no such file or folder of measurements")
        if not has_profile_sets(source):
            refuse_part_of_a_set(source)
        progress(f"validating against {source}")
        store = get_store(store_path)
        doc: dict[str, Any] = {"files": [], "skipped": [], "notes": []}
        ok = True
        profile = None
        if has_profile_sets(source):
            profile, skipped = judge_all(source, [hardware] if hardware else None, progress, notes=doc["notes"])
            doc["skipped"] += skipped
            if profile.height:
                with store.lock():
                    path = write_parquet(profile.to_arrow(), store.validation_dir / "profile_heldout.parquet",
                                         "profile_heldout")  # fmt: skip
                doc["files"].append(str(path))
                doc["profile_heldout"] = profile.to_dicts()
        implausible = None
        if has_profile_sets(source):  # rows no kernel can have produced as they stand: flagged, left out of profiles
            from pipeline.calibrate.validate import implausible_measurements

            implausible, fp8_notes = implausible_measurements(source, hardware)
            doc["implausible_rows"] = implausible.to_dicts()
            doc["notes"] += fp8_notes
        prior_loo = prior_steps = donors = dies = None
        # The prior is judged on the catalog's profiles: when these measurements are sets of
        # several GPUs (the public sets they were built from), not a user's table of one GPU.
        if profile is not None and profile.height and profile["gpu"].n_unique() >= 2:
            prior_loo, prior_steps, donors, dies = _prior_check(hardware)
            with store.lock():
                tables = (("prior_heldout", prior_loo), ("prior_steps", prior_steps), ("prior_die_donors", dies))
                for name, frame in tables:
                    if frame.height:
                        path = write_parquet(frame.to_arrow(), store.validation_dir / f"{name}.parquet", name)
                        doc["files"].append(str(path))
            doc["prior_heldout"] = prior_loo.to_dicts()
            doc["prior_steps"] = prior_steps.to_dicts()
            doc["prior_collectives"] = donors.to_dicts()
            doc["prior_die_donors"] = dies.to_dicts()
        try:
            legacy_files = discover(source)
        except UnreadableMeasurements:
            raise
        except RooftraceError:  # no Vidur or Splitwise tables here (the profile tables may be)
            legacy_files = []
        report = None
        if legacy_files:
            report = run_validation(source, hardware if profile is None else None)
            with store.lock():
                doc["files"] += [str(p) for p in store_report(report, store.validation_dir)]
            summary = report.summary.filter(report.summary["split"] != "train")
            doc["summary"] = summary.to_dicts()
            doc["calibrations"] = [
                {"kind": c.kind, "hardware": c.hardware, "params": c.params, "n_train": c.n_train,
                 "n_holdout": c.n_holdout, "description": c.description, "fit_failed": c.at_bounds}
                for c in report.calibrations
            ]  # fmt: skip
            doc["failed_fits"] = [failed_fit(c) for c in report.calibrations if c.at_bounds]
            doc["skipped"] += report.skipped
            doc["notes"] += report.notes
        if profile is None and report is None:
            raise RooftraceError(f"{source}: no operator measurements rooftrace reads (see --help)")
        if report is None and (profile is None or profile.height == 0):
            # operator sets, but not one held-out check could be run on them: nothing was judged
            why = f" ({'; '.join(dict.fromkeys(doc['skipped']))})" if doc["skipped"] else ""
            if hardware is not None and profile is not None:  # a GPU the folder does not hold?
                from pipeline.costmodel.profile.sources import read_measurements

                held = sorted(read_measurements(source).gpus)
                if hardware not in held:
                    raise RooftraceError(
                        f"{source}: --hardware {hardware}: these measurements hold no rows of it "
                        f"(they hold {', '.join(held) if held else 'no catalog GPU'})"
                    )
            raise RooftraceError(f"{source}: no held-out check could be run on these measurements{why}")
        # The store keeps one validation: tables an earlier run wrote and this one did not would
        # read as this run's (a one-GPU table after a full run left the full run's prior tables).
        written = {Path(f).name for f in doc["files"]}
        with store.lock():
            for stem in VALIDATION_TABLES:
                stale = store.validation_dir / f"{stem}.parquet"
                if stale.name not in written and stale.is_file():
                    stale.unlink()
                    progress(f"removed {stale} (an earlier validate run's; this run has no such table)")
        progress(f"wrote {', '.join(doc['files'])}")
        if as_json:
            doc["skipped"] = list(dict.fromkeys(doc["skipped"]))
            doc["notes"] = list(dict.fromkeys(doc["notes"]))
            emit_json(doc)
            return ok
        if profile is not None and profile.height:
            click.echo(
                f"measured profiles, held out by shape (target: median <= {TARGET_MEDIAN:.0%}, p90 <= {TARGET_P90:.0%})"
            )
            click.echo(
                f"{'gpu':14s} {'check':45s} {'tokens':7s} {'N':>7s} {'median':>7s} {'p90':>7s} {'bias':>7s}  target"
            )
            for r in profile.iter_rows(named=True):
                click.echo(
                    f"{r['gpu']:14s} {r['check']:45s} {r['token_range']:7s} {r['rows']:7d} {_pct(r['median_abs'])} "
                    f"{_pct(r['p90_abs'])} {r['median_signed']:+7.1%}  {'met' if r['meets'] else 'MISSED'}"
                )
        if implausible is not None:
            for line in implausible_lines(implausible):
                click.echo(line)
        if prior_loo is not None and prior_loo.height:
            click.echo(
                "size-aware roofline prior (GPUs without a profile), each GPU predicted from the others' profiles:"
            )
            click.echo(f"{'gpu':14s} {'family':24s} {'tokens':7s} {'N':>7s} {'median':>7s} {'p90':>7s} {'bias':>7s}  "
                       f"{'plain roofline: median':>22s} {'p90':>7s}")  # fmt: skip
            for r in _loo_display(prior_loo).iter_rows(named=True):
                click.echo(
                    f"{r['gpu']:14s} {r['family']:24s} {r['tokens']:7s} {r['rows']:7d} {_pct(r['median_abs_error'])} "
                    f"{_pct(r['p90_abs_error'])} {r['bias']:+7.1%}  {_pct(r['roofline_median_abs_error']):>22s} "
                    f"{_pct(r['roofline_p90_abs_error'])}"
                )
        if dies is not None and dies.height:
            click.echo(
                "same-die donors (an unprofiled GPU on a profiled GPU's die): each GPU from the other one on its die, "
                "its tables scaled by the prior fitted without it:"
            )
            click.echo(f"{'gpu':14s} {'from':14s} {'family':24s} {'tokens':7s} {'N':>7s} {'median':>7s} {'p90':>7s} "
                       f"{'bias':>7s}  {'prior alone: median':>19s} {'p90':>7s}")  # fmt: skip
            for r in _die_display(dies).iter_rows(named=True):
                click.echo(
                    f"{r['gpu']:14s} {r['donor']:14s} {r['family']:24s} {r['tokens']:7s} {r['rows']:7d} "
                    f"{_pct(r['median_abs_error'])} {_pct(r['p90_abs_error'])} {r['bias']:+7.1%}  "
                    f"{_pct(r['prior_median_abs_error']):>19s} {_pct(r['prior_p90_abs_error'])}"
                )
        if prior_steps is not None and prior_steps.height:
            click.echo("whole steps (decode, prefill, mixed; bf16) against the GPU's measured profile, GPU held out:")
            click.echo(f"{'gpu':14s} {'model':14s} {'tp':>3s} {'steps':>5s} {'prior median':>13s} {'p90':>7s} "
                       f"{'same-die donor median':>22s} {'p90':>7s} "
                       f"{'plain roofline median':>22s} {'p90':>7s}")  # fmt: skip
            for r in _step_summary(prior_steps).iter_rows(named=True):
                click.echo(
                    f"{r['gpu']:14s} {r['model']:14s} {r['tp']:3d} {r['steps']:5d} {_pct(r['prior_median']):>13s} "
                    f"{_pct(r['prior_p90'])} {_pct(r['donor_median']):>22s} {_pct(r['donor_p90'])} "
                    f"{_pct(r['roofline_median']):>22s} {_pct(r['roofline_p90'])}"
                )
        if donors is not None and donors.height:
            click.echo(
                "all-reduce of a GPU from the curves of the profiled GPU on the same NVLink (prior's collectives):"
            )
            for r in donors.iter_rows(named=True):
                click.echo(
                    f"{r['gpu']:14s} from {r['donor'] if r['predictor'] == 'donor' else 'plain roofline link':20s} "
                    f"{r['rows']:5d} rows  median {_pct(r['median_abs_error'])}  p90 {_pct(r['p90_abs_error'])}  "
                    f"bias {r['bias']:+7.1%}"
                )
        if report is not None:
            click.echo("roofline tier (Vidur, Splitwise):")
            click.echo(f"{'set':17s} {'subset':25s} {'hardware':14s} {'params':10s} {'split':7s} "
                       f"{'N':>6s} {'median':>7s} {'p90':>7s} {'max':>7s}")  # fmt: skip
            for r in doc["summary"]:
                click.echo(
                    f"{r['set']:17s} {r['subset']:25s} {r['hardware']:14s} {r['parameters']:10s} {r['split']:7s} "
                    f"{r['n']:6d} {_pct(r['median_abs_error'])} {_pct(r['p90_abs_error'])} "
                    f"{_pct(r['max_abs_error'])}"
                )
            click.echo("fitted (calibrated rows):")
            for c in report.calibrations:
                values = ", ".join(f"{k}={v:.4g}" for k, v in c.params.items())
                failed = " — FIT FAILED: every factor at a bound" if c.at_bounds else ""
                click.echo(
                    f"  {c.kind} / {c.hardware}: {values} — {c.n_train} train rows, {c.n_holdout} held out{failed}"
                )
        for note in dict.fromkeys(doc["skipped"]):
            progress(f"skipped: {note}")
        for note in dict.fromkeys(doc["notes"]):
            progress(f"note: {note}")
        for line in doc.get("failed_fits", []):
            progress(f"warning: {line}")
        return ok

    run(body)


def _validate_runs(runs: str, fleet_path: str | None, store_path: str | None, as_json: bool) -> None:
    """``validate --runs``: each benchmark run replayed on the fleet under its own methodology."""
    from pipeline.calibrate.benchruns import check_runs_path, store_table, table_lines, validate_runs
    from pipeline.engine.jitcache import compile_ahead

    refuse_empty("--fleet", fleet_path, "fleets/default.toml")
    compile_ahead()  # each run is replayed: the engine compiles while the runs are read
    source = check_runs_path(runs)
    store = get_store(store_path)
    result = validate_runs(source, fleet_path, progress)
    path = store_table(store, result.table)
    progress(f"wrote {path}")
    if as_json:
        emit_json({"file": str(path), "fleet": result.fleet, "runs": result.table.to_dicts(), "notes": result.notes})
        return
    click.echo(f"benchmark runs replayed on fleet {result.fleet!r}; error = replayed / observed - 1:")
    for line in table_lines(result.table):
        click.echo(line)
    for note in result.notes:
        progress(f"note: {note}")


#: Flagged rows validate prints one by one per GPU, family and rule (--json has them all).
IMPLAUSIBLE_SHOWN = 3


def implausible_lines(flagged: Any) -> list[str]:
    """validate's block on implausible rows: a count per GPU, family, dtype and rule, and the
    first rows of each with their reason; "none" when none."""
    if flagged.height == 0:
        return ["implausible rows (fp8 slower than bf16, non-monotone in tokens, beyond noise): none"]
    out = [
        f"implausible rows, left out by the profile build: {flagged.height:,} (profile/plausible.py; "
        "--json lists every one)"
    ]
    for (gpu, fam, dtype, rule), part in flagged.group_by(["gpu", "family", "dtype", "rule"], maintain_order=True):
        out.append(f"  {gpu} {fam} {dtype} {rule}: {part.height:,}")
        for r in part.head(IMPLAUSIBLE_SHOWN).iter_rows(named=True):
            out.append(f"    {r['key']}: {r['reason']}")
    return out
