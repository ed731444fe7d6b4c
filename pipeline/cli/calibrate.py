"""``rooftrace calibrate``: measured GPU profiles from operator tables, or fitted factors
(pipeline/calibrate/measurements.py)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import click

from pipeline.cli.common import (
    check_out_of_store,
    default_store,
    emit_json,
    get_store,
    json_option,
    progress,
    run,
    store_option,
)
from pipeline.common.errors import RooftraceError


@click.command("calibrate")
@click.option(
    "--measurements",
    default=None,
    type=click.Path(),
    help="Operator measurements: a folder with AIConfigurator / LLMServingSim sets (builds GPU profiles), "
    "or a Vidur / Splitwise CSV (fits one GPU's roofline factors; needs --hardware).",
)
@click.option(
    "--hardware",
    default=None,
    help="Catalog GPU: the only profile to build, or the GPU whose factors to fit (from its rows; a table whose "
    "labels no catalog GPU has is taken as it).",
)
@click.option("--out", type=click.Path(), default=None,
              help="Profiles: folder to write <gpu>/ into (default: the catalog's profiles). "
                   "Factors: hardware TOML to write (default: <hardware>-calibrated.toml here).")  # fmt: skip
@click.option(
    "--observed",
    is_flag=True,
    help="Learn the serving stack's calibration from a day of the fleet's own logs (their observed TTFT / E2E): "
    "needs --fleet; writes --out (default: <fleet name>-calibration.toml here).",
)
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="--observed: the FLEET.toml of the fleet that served the logs.",
)
@click.option(
    "--date", default=None, help="--observed: the arrival date YYYY-MM-DD (default: the latest in the store)."
)
@click.option(
    "--train-share",
    type=float,
    default=0.6,
    show_default=True,
    help="--observed: the share of the day's arrivals (by time), or with --steps of the steps, that trains; "
    "the rest is judged.",
)
@click.option(
    "--steps",
    "steps_path",
    type=click.Path(),
    default=None,
    help="--observed: fit on the engine's step telemetry instead of a day of logs: a file or folder of Dynamo "
    "ForwardPassMetrics JSON lines, TensorRT-LLM iteration stats or SGLang scheduler logs (docs/calibration.md).",
)
@click.option(
    "--hold-out",
    type=click.Choice(["shape", "file"]),
    default="shape",
    show_default=True,
    help="--steps: judge the largest steps (shape: by batch, then tokens) or the last ones in file order (file).",
)
@store_option
@json_option
def calibrate_cmd(
    measurements: str | None,
    hardware: str | None,
    out: str | None,
    observed: bool,
    fleet_path: str | None,
    date: str | None,
    train_share: float,
    steps_path: str | None,
    hold_out: str,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Build measured GPU profiles from operator tables, fit one GPU's roofline factors, or learn a
    serving stack's calibration from a fleet's own logs (--observed).

    With AIConfigurator / LLMServingSim sets: writes pipeline/catalog/profiles/<gpu>/ (the rows,
    and profile.toml with their sources, selection, fitted values and held-out errors), then fits
    the size-aware roofline prior on every profile there (prior.toml, each GPU held out once);
    replays price steps from the GPU's profile by default, from the prior on an NVIDIA GPU without
    one (FLEET.toml cost_model).

    Example: rooftrace calibrate --measurements path/to/measurements --hardware h100-sxm
    Example: rooftrace calibrate --measurements perf_model.csv --hardware h100-sxm --out h100-splitwise.toml

    With an nccl-tests all_reduce_perf log of your box: fits the GPU link's efficiency and latency
    (docs/collectives.md) and writes a hardware entry a FLEET.toml names as its hardware: still the
    same GPU for every other operator, its collectives priced on the fitted link in every tier.

    Example: rooftrace calibrate --measurements all_reduce.log --hardware h100-pcie --out my-box.toml

    With --observed: replays a day whose logs carry observed latencies on the fleet that served it,
    fits the stack's scales and per-step overhead on the first part of the day, judges them on the
    rest, and writes a calibration file a FLEET.toml includes with calibration_file = "CAL.toml";
    refuses (exit 1, nothing written) when the fleet cannot explain the logs.

    Example: rooftrace calibrate --observed --fleet fleets/prod.toml --date 2025-01-15 --out prod-cal.toml

    With --observed --steps: fits the same calibration on the engine's per-step telemetry (each step's
    wall time against the cost model's price of its token mix), holding out the larger steps.

    Example: rooftrace calibrate --observed --fleet fleets/prod.toml --steps fpm.jsonl --out prod-cal.toml
    """

    if steps_path is not None:
        run(lambda: _calibrate_steps(observed, measurements, hardware, fleet_path, date, store_path, steps_path,
                                     hold_out, train_share, out, as_json))  # fmt: skip
        return
    if observed or fleet_path is not None:
        run(lambda: _calibrate_observed(observed, measurements, hardware, fleet_path, date, train_share, out,
                                        store_path, as_json))  # fmt: skip
        return
    misplaced = next((n for n, v in (("--date", date), ("--store", store_path)) if v is not None), None)
    if misplaced is not None:
        run(lambda: _refuse(f"{misplaced} is for --observed (a day of the fleet's own logs)"))
        return
    if measurements is None:
        run(
            lambda: _refuse(
                "give --measurements DIR (operator tables) or --observed --fleet FLEET.toml (a day of logs)"
            )
        )
        return
    source_path: str = measurements

    def body() -> None:
        from pipeline.cli.validate import refuse_empty
        from pipeline.costmodel.profile.heldout import has_profile_sets

        # an empty path is no path: it would read the current folder, or write the catalog's profiles
        refuse_empty("--measurements", source_path, "path/to/measurements")
        refuse_empty("--out", out, "/tmp/profiles")
        check_out_of_store(default_store(), out, "--out")  # (not over the files of the store commands use)
        from pipeline.calibrate.validate import refuse_part_of_a_set

        source = Path(source_path)
        if not source.exists():
            raise RooftraceError(f"{source}: no such file or folder of measurements")
        from pipeline.calibrate.nccl import is_all_reduce_log

        if is_all_reduce_log(source):
            _calibrate_link(source, hardware, out, as_json)
            return
        if has_profile_sets(source):
            _calibrate_profiles(source, hardware, out, as_json)
            return
        refuse_part_of_a_set(source)
        if hardware is None:
            what = "holds no AIConfigurator or LLMServingSim set; a" if source.is_dir() else "a"
            raise RooftraceError(
                f"{source}: {what} Vidur or Splitwise table needs --hardware (the GPU whose factors to fit)"
            )
        from pipeline.calibrate.measurements import calibrate, check_entry_out, format_share, write_calibrated

        target = Path(out) if out is not None else Path(f"{hardware}-calibrated.toml")
        check_entry_out(target)
        result = calibrate(source, hardware, name=target.stem)
        write_calibrated(result, target)
        progress(f"wrote {target}")
        doc = {
            "hardware": result.hardware.name,
            "written_to": str(target),
            "fitted": result.calibration.params,
            "fitted_on": result.calibration.description,
            "n_train": result.calibration.n_train,
            "n_holdout": result.calibration.n_holdout,
            "train_median_abs_error": result.train_median_abs_error,
            "holdout_median_abs_error": result.holdout_median_abs_error,
            "holdout_median_abs_error_before": result.before_median_abs_error,
            "skipped": list(result.skipped),
            "notes": list(result.notes),
        }
        _report_skipped(result.skipped)
        for note in result.notes:
            progress(f"note: {note}")
        if as_json:
            emit_json(doc)
            return
        click.echo(f"fitted {', '.join(f'{k}={v:.4g}' for k, v in result.calibration.params.items())}")
        click.echo(f"  on: {result.calibration.description}")
        click.echo(
            f"  median abs error: train {format_share(result.train_median_abs_error)}, hold-out "
            f"{format_share(result.holdout_median_abs_error)} "
            f"(catalog factors: {format_share(result.before_median_abs_error)})"
        )

    run(body)


def _refuse(message: str) -> None:
    raise RooftraceError(message)


def _calibrate_link(source: Path, hardware: str | None, out: str | None, as_json: bool) -> None:
    """An nccl-tests all_reduce_perf log: fit the GPU link's efficiency and latency, write the entry."""
    if hardware is None:
        raise RooftraceError(f"{source}: an nccl-tests log needs --hardware (the GPU whose link it measured)")
    from pipeline.calibrate.measurements import check_entry_out, write_calibrated_toml
    from pipeline.calibrate.nccl import fit_link, read_all_reduce

    target = Path(out) if out is not None else Path(f"{hardware}-link.toml")
    check_entry_out(target)
    run = read_all_reduce(source)
    fit = fit_link(run, hardware, name=target.stem)
    write_calibrated_toml(fit.toml, target)
    progress(f"wrote {target}")
    _report_skipped(run.skipped)
    doc = {
        "hardware": fit.hardware.name,
        "fitted_from": fit.hardware.link_fitted_from,
        "written_to": str(target),
        "gpus": run.ranks,
        "devices": list(run.devices),
        "link_efficiency": fit.efficiency,
        "link_latency_s": fit.latency_s,
        "effective_bandwidth_bytes_per_s": fit.effective_bandwidth,
        "n_train": fit.n_train,
        "n_holdout": fit.n_holdout,
        "train_median_abs_error": fit.train_median_abs_error,
        "holdout_median_abs_error": fit.holdout_median_abs_error,
        "holdout_median_abs_error_before": fit.before_median_abs_error,
        "skipped": list(run.skipped),
    }
    if as_json:
        emit_json(doc)
        return
    click.echo(
        f"fitted link efficiency={fit.efficiency:.4g} (an effective {fit.effective_bandwidth / 1e9:.1f} GB/s per "
        f"direction), latency={fit.latency_s * 1e6:.1f} us"
    )
    click.echo(f"  on: {source} ({run.ranks} GPUs{': ' + ', '.join(run.devices) if run.devices else ''})")
    click.echo(
        f"  median abs error: train {fit.train_median_abs_error:.1%}, hold-out {fit.holdout_median_abs_error:.1%} "
        f"(catalog link: {fit.before_median_abs_error:.1%})"
    )
    click.echo(
        f'  use it: hardware = "{target}" in a FLEET.toml: a {fit.hardware.link_fitted_from} for every other '
        "operator, its collectives priced on this link in every cost tier"
    )


def _calibrate_observed(
    observed: bool,
    measurements: str | None,
    hardware: str | None,
    fleet_path: str | None,
    date: str | None,
    train_share: float,
    out: str | None,
    store_path: str | None,
    as_json: bool,
) -> None:
    from pipeline.calibrate.observed_fit import calibration_toml, fit_store
    from pipeline.cli.validate import refuse_empty
    from pipeline.common.schemas import atomic_write_bytes, check_replaceable, os_write_reason

    if not observed:
        raise RooftraceError("--fleet is for --observed (learn a calibration from a day of the fleet's own logs)")
    if measurements is not None or hardware is not None:
        raise RooftraceError("--observed learns from logs: --measurements and --hardware are for operator tables")
    if fleet_path is None:
        raise RooftraceError("--observed needs --fleet FLEET.toml (the fleet that served the logs)")
    from pipeline.engine.jitcache import compile_ahead

    compile_ahead()  # --observed replays the day: the engine compiles meanwhile
    refuse_empty("--fleet", fleet_path, "fleets/prod.toml")
    refuse_empty("--out", out, "prod-calibration.toml")
    store = get_store(store_path)
    from pipeline.replay.fleet import load_fleet

    name = load_fleet(fleet_path).name
    target = Path(out) if out is not None else Path(f"{name}-calibration.toml")
    check_out_of_store(store, target, "--out")
    try:
        check_replaceable(target)
        same = target.exists() and target.resolve() == Path(fleet_path).resolve()
    except OSError as exc:
        raise RooftraceError(f"--out {target}: {exc.strerror or exc}") from None
    if same:
        raise RooftraceError(
            f"--out {target} is the fleet file: the calibration would replace it; write it beside, e.g. "
            f"--out {target.with_name(target.stem + '-calibration.toml')}"
        )
    fit = fit_store(store, Path(fleet_path), date, train_share, progress)
    refusal = fit.refusal()
    doc = {
        "calibration": fit.calibration.to_dict(),
        "fitted": list(fit.fitted),
        "fixed": list(fit.fixed),
        "train_requests": fit.n_train,
        "held_out_requests": fit.n_held_out,
        "split_at": fit.cut_utc,
        "in_sample": fit.in_sample,
        "held_out": fit.held_out,
        "held_out_uncalibrated": fit.held_out_uncalibrated,
        "held_out_error": fit.held_out_error,
        "replays": fit.evaluations,
        "notes": fit.notes,
        "written_to": None if refusal else str(target),
        "refused": refusal,
    }
    if refusal is None:
        try:
            atomic_write_bytes(target, calibration_toml(fit).encode())
        except OSError as exc:
            raise RooftraceError(f"cannot write {target}: {os_write_reason(target, exc)}") from None
    for note in fit.notes:
        progress(f"note: {note}")
    if as_json:
        emit_json(doc)
    else:
        _print_fit(fit, target if refusal is None else None, Path(fleet_path))
    if refusal is not None:
        raise RooftraceError(refusal)


def _calibrate_steps(
    observed: bool,
    measurements: str | None,
    hardware: str | None,
    fleet_path: str | None,
    date: str | None,
    store_path: str | None,
    steps_path: str,
    hold_out: str,
    train_share: float,
    out: str | None,
    as_json: bool,
) -> None:
    from pipeline.calibrate.step_fit import check_split, fit_steps, step_calibration_toml
    from pipeline.cli.validate import refuse_empty
    from pipeline.common.schemas import atomic_write_bytes, check_replaceable, os_write_reason
    from pipeline.ingest.steptelemetry import read_steps

    if not observed:
        raise RooftraceError("--steps is for --observed (learn a calibration from the engine's step telemetry)")
    if measurements is not None or hardware is not None:
        raise RooftraceError("--observed learns from telemetry: --measurements and --hardware are for operator tables")
    misplaced = next((n for n, v in (("--date", date), ("--store", store_path)) if v is not None), None)
    if misplaced is not None:
        raise RooftraceError(f"{misplaced} is for a day of logs; --steps reads the telemetry files alone")
    if fleet_path is None:
        raise RooftraceError("--steps needs --fleet FLEET.toml (the fleet that ran the steps)")
    check_split(hold_out, train_share)
    refuse_empty("--fleet", fleet_path, "fleets/prod.toml")
    refuse_empty("--out", out, "prod-calibration.toml")
    from pipeline.replay.fleet import load_fleet, resolve

    cfg = load_fleet(fleet_path)
    target = Path(out) if out is not None else Path(f"{cfg.name}-calibration.toml")
    check_out_of_store(default_store(), target, "--out")
    try:
        check_replaceable(target)
        same = target.exists() and target.resolve() == Path(fleet_path).resolve()
    except OSError as exc:
        raise RooftraceError(f"--out {target}: {exc.strerror or exc}") from None
    if same:
        raise RooftraceError(f"--out {target} is the fleet file: the calibration would replace it; write it beside")
    telemetry = read_steps(steps_path)
    for reason, n, first in telemetry.reasons():
        progress(f"quarantined: {n:,} record(s): {reason} (the first: {first.text()})")
    if telemetry.used == 0:
        why = telemetry.quarantined[0].text() if telemetry.quarantined else "no records"
        raise RooftraceError(f"{steps_path}: none of the {telemetry.rows_in:,} telemetry records is usable ({why})")
    source = (
        f"step telemetry {steps_path} ({telemetry.used:,} steps of {telemetry.rows_in:,} records: "
        f"{', '.join(f'{k} {v:,}' for k, v in sorted(telemetry.formats.items()))}) priced on fleet {cfg.name!r} "
        f"({fleet_path})"
    )
    fit = fit_steps(telemetry, resolve(cfg, str(fleet_path)), hold_out, train_share, source, progress)
    refusal = fit.refusal()
    doc = {
        "calibration": fit.calibration.to_dict(),
        "fitted": list(fit.fitted),
        "fixed": list(fit.fixed),
        "records": telemetry.rows_in,
        "steps_used": telemetry.used,
        "quarantined": [{"reason": r, "count": n, "first": q.text()} for r, n, q in telemetry.reasons()],
        "formats": telemetry.formats,
        "hold_out": fit.hold_out,
        "split": fit.split,
        "train_steps": fit.n_train,
        "held_out_steps": fit.n_held_out,
        "in_sample": fit.in_sample,
        "held_out": fit.held_out,
        "held_out_uncalibrated": fit.held_out_uncalibrated,
        "seen": {k: {"time_share": s, "steps_moved_10pct": n} for k, (s, n) in fit.seen.items()},
        "evaluations": fit.evaluations,
        "notes": fit.notes,
        "written_to": None if refusal else str(target),
        "refused": refusal,
    }
    if refusal is None:
        try:
            atomic_write_bytes(target, step_calibration_toml(fit, telemetry).encode())
        except OSError as exc:
            raise RooftraceError(f"cannot write {target}: {os_write_reason(target, exc)}") from None
    for note in fit.notes:
        progress(f"note: {note}")
    if as_json:
        emit_json(doc)
    else:
        shown = ", ".join(f"{k} {getattr(fit.calibration, k):.4g}" for k in fit.fitted)
        click.echo(f"fitted {shown}  ({fit.evaluations} evaluations)")
        click.echo(
            f"  steps: {telemetry.rows_in:,} records, {telemetry.used:,} used, {len(telemetry.quarantined):,} "
            "quarantined"
        )
        click.echo(f"  split: {fit.split}")
        click.echo("  per-step error (priced / measured - 1)   mean|e|   p50|e|   p90|e|     bias")
        for label, e in (
            ("in sample", fit.in_sample),
            ("held out", fit.held_out),
            ("held out, uncalibrated", fit.held_out_uncalibrated),
        ):
            click.echo(f"  {label:38s} {e['mean_abs']:8.1%} {e['p50_abs']:8.1%} {e['p90_abs']:8.1%} {e['bias']:+8.1%}")
        for name, (share, n) in fit.seen.items():
            click.echo(f"  {name} moves {share:.1%} of the training steps' time ({n:,} steps by 10 % or more)")
        if refusal is None:
            import os

            rel = os.path.relpath(target.resolve(), Path(fleet_path).resolve().parent)
            click.echo(f'wrote {target} (include it from {fleet_path}: calibration_file = "{rel}", relative to it)')
    if refusal is not None:
        raise RooftraceError(refusal)


def _print_fit(fit: object, target: Path | None, fleet_path: Path) -> None:
    from pipeline.calibrate.observed import METRICS
    from pipeline.calibrate.observed_fit import ObservedFit

    assert isinstance(fit, ObservedFit)
    shown = ", ".join(f"{k} {getattr(fit.calibration, k):.4g}" for k in fit.fitted)
    click.echo(f"fitted {shown}  ({fit.evaluations} replays in all)")
    click.echo(f"  split: arrivals up to {fit.cut_utc} train ({fit.n_train:,} requests), {fit.n_held_out:,} judged")
    click.echo("  error (replayed / observed - 1)    mean      p50      p99")
    for label, table in (
        ("in sample", fit.in_sample),
        ("held out", fit.held_out),
        ("held out, uncalibrated", fit.held_out_uncalibrated),
    ):
        for m in METRICS:
            if m in table:
                e = table[m]
                click.echo(f"  {label:24s} {m.upper():5s} {e['mean']:+8.1%} {e['p50']:+8.1%} {e['p99']:+8.1%}")
    if target is not None:
        import os

        rel = os.path.relpath(target.resolve(), fleet_path.resolve().parent)
        click.echo(f'wrote {target} (include it from {fleet_path}: calibration_file = "{rel}", relative to it)')


def _calibrate_profiles(source: Path, hardware: str | None, out: str | None, as_json: bool) -> None:
    from pipeline.calibrate.measurements import check_profiles_out
    from pipeline.costmodel.profile.build import build_profiles
    from pipeline.costmodel.profile.tables import PROFILES_DIR

    target = Path(out) if out is not None else PROFILES_DIR
    check_profiles_out(target)
    if hardware is not None:
        from pipeline.catalog import load_hardware

        load_hardware(hardware)  # a one-line error for an unknown name
    skipped: list[str] = []
    notes: list[str] = []
    built = build_profiles(source, target, [hardware] if hardware else None, progress, skipped=skipped, notes=notes)
    if not built:
        why = f" ({'; '.join(dict.fromkeys(skipped))})" if skipped else ""
        raise RooftraceError(f"{source}: no GPU{' ' + hardware if hardware else ''} found in the measurements{why}")
    doc = [{"gpu": b.gpu, "folder": str(b.folder), "rows": b.rows, "heldout": b.heldout} for b in built]
    progress(f"wrote {len(built)} profile(s) under {target}")
    from pipeline.costmodel.profile.prior import write_prior

    progress("fitting the size-aware roofline prior on every profile there (leave one GPU out)")
    prior = write_prior(target)
    if prior is not None:
        progress(f"wrote {prior[0]}")
    _report_skipped(skipped)
    for note in dict.fromkeys(notes):
        progress(f"note: {note}")
    if as_json:
        emit_json(
            {
                "profiles": doc,
                "prior": str(prior[0]) if prior is not None else None,
                "prior_leave_one_gpu_out": prior[1].to_dicts() if prior is not None else [],
                "skipped": list(dict.fromkeys(skipped)),
                "notes": list(dict.fromkeys(notes)),
            }
        )
        return
    for b in built:
        rows = ", ".join(f"{k} {v:,}" for k, v in sorted(b.rows.items()))
        click.echo(f"{b.gpu}: {rows} -> {b.folder}")
        for name, e in sorted(b.heldout.items()):
            click.echo(f"    held out {name:52s} median {e['median_abs_error']:6.1%}  p90 {e['p90_abs_error']:6.1%}")


def _report_skipped(notes: Iterable[str]) -> None:
    """What the measurements held that was not used, one stderr line per cause, as ``validate``
    reports it ("skipped: FILE: N row(s) left out, the first at line L: ...")."""
    for note in dict.fromkeys(notes):
        progress(f"skipped: {note}")
