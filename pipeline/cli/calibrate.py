"""``rooftrace calibrate``: measured GPU profiles from operator tables, or fitted factors (pipeline/calibrate.py)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import click

from pipeline.cli.common import check_out_of_store, default_store, emit_json, json_option, progress, run
from pipeline.errors import RooftraceError


@click.command("calibrate")
@click.option(
    "--measurements",
    required=True,
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
@json_option
def calibrate_cmd(measurements: str, hardware: str | None, out: str | None, as_json: bool) -> None:
    """Build measured GPU profiles from operator tables, or fit one GPU's roofline factors.

    With AIConfigurator / LLMServingSim sets: writes pipeline/catalog/profiles/<gpu>/ (the rows,
    and profile.toml with their sources, selection, fitted values and held-out errors), then fits
    the size-aware roofline prior on every profile there (prior.toml, each GPU held out once);
    replays price steps from the GPU's profile by default, from the prior on an NVIDIA GPU without
    one (FLEET.toml cost_model).

    Example: rooftrace calibrate --measurements path/to/measurements --hardware h100-sxm
    Example: rooftrace calibrate --measurements perf_model.csv --hardware h100-sxm --out h100-splitwise.toml
    """

    def body() -> None:
        from pipeline.cli.validate import refuse_empty
        from pipeline.profile.heldout import has_profile_sets

        # an empty path is no path: it would read the current folder, or write the catalog's profiles
        refuse_empty("--measurements", measurements, "path/to/measurements")
        refuse_empty("--out", out, "/tmp/profiles")
        check_out_of_store(default_store(), out, "--out")  # (not over the files of the store commands use)
        from pipeline.validate import refuse_part_of_a_set

        source = Path(measurements)
        if not source.exists():
            raise RooftraceError(f"{source}: no such file or folder of measurements")
        if has_profile_sets(source):
            _calibrate_profiles(source, hardware, out, as_json)
            return
        refuse_part_of_a_set(source)
        if hardware is None:
            what = "holds no AIConfigurator or LLMServingSim set; a" if source.is_dir() else "a"
            raise RooftraceError(
                f"{source}: {what} Vidur or Splitwise table needs --hardware (the GPU whose factors to fit)"
            )
        from pipeline.calibrate import calibrate, check_entry_out, format_share, write_calibrated

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


def _calibrate_profiles(source: Path, hardware: str | None, out: str | None, as_json: bool) -> None:
    from pipeline.calibrate import check_profiles_out
    from pipeline.profile.build import build_profiles
    from pipeline.profile.tables import PROFILES_DIR

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
    from pipeline.profile.prior import write_prior

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
