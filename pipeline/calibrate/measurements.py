"""``rooftrace calibrate``: fit a GPU's roofline factors on its operator measurements.

``calibrate --measurements FILE --hardware GPU`` loads the Vidur / Splitwise tables the way
``validate`` does (pipeline/calibrate/validate.py), fits the factors those tables identify on the training
split, and writes a new hardware entry stating what it was fitted on and its held-out error.
``calibrate --measurements DIR`` of operator profiles builds measured GPU profiles instead
(pipeline/costmodel/profile/build.py).
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pipeline.calibrate.validate import (
    MIN_TARGET_TOKENS,
    Calibration,
    discover,
    failed_fit,
    fit_factors,
    fit_rows,
    load_groups,
    select_hardware,
)
from pipeline.catalog import HardwareSpec, hardware_to_toml, load_hardware, parse_hardware
from pipeline.catalog.entries import write_entry
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.system import not_regular


@dataclass(frozen=True)
class CalibrateResult:
    hardware: HardwareSpec
    calibration: Calibration
    train_median_abs_error: float
    holdout_median_abs_error: float
    before_median_abs_error: float
    toml: str
    #: What the fit did not use and why, as ``validate`` reports it (rows left out, groups skipped,
    #: other GPUs' rows): one note per cause, in file order.
    skipped: tuple[str, ...] = ()
    #: What the fit used as something its table does not say it is (rows whose label no catalog
    #: GPU has, taken as --hardware): one note per label.
    notes: tuple[str, ...] = ()


#: Held-out median error above which ``calibrate`` refuses to write a hardware entry.
MAX_HOLDOUT_ERROR = 0.5


def format_share(x: float) -> str:
    """A relative error as a percentage a person can read (no 300-digit figures)."""
    if not math.isfinite(x):
        return "an undefined share"
    return f"{x:.1%}" if x < 100 else f"{x:.3g}x"


def calibrate(measurements: Path, hardware: str, name: str | None = None) -> CalibrateResult:
    """Fit the factors a measurement file identifies for one GPU; return the new catalog entry."""
    base = load_hardware(hardware)
    groups, skipped = load_groups(discover(measurements), hardware)
    notes: list[str] = []
    # Rows labelled with a catalog GPU are that GPU's, never `hardware`'s; a user's own table
    # whose labels no catalog GPU has is taken as `hardware` (said in `notes`).
    mine = select_hardware(groups, hardware, measurements, skipped, notes, "calibrate")
    skipped = list(dict.fromkeys(skipped))
    if not mine:
        why = f" ({'; '.join(skipped)})" if skipped else ": the measurements hold no data rows"
        raise RooftraceError(f"{measurements}: no rows for {base.name}{why}")
    mine = [replace(g, hardware=base) for g in mine]
    kinds = sorted({g.kind for g in mine})
    fitted = base
    cals = []
    for kind in kinds:
        fitted, cal = fit_factors([g for g in mine if g.kind == kind], kind, fitted)
        if cal.n_holdout == 0 or cal.n_train < len(cal.params):
            raise RooftraceError(
                f"{measurements}: too few distinct {kind} shapes for {base.name} to fit {len(cal.params)} factors and "
                f"judge them ({cal.n_train} training rows, {cal.n_holdout} held out; a row repeated counts as one "
                "shape): measure more sizes"
            )
        cals.append(cal)
    cal = cals[0] if len(cals) == 1 else Calibration(
        "+".join(c.kind for c in cals), base.name, {k: v for c in cals for k, v in c.params.items()},
        sum(c.n_train for c in cals), sum(c.n_holdout for c in cals),
        tuple(f for c in cals for f in c.files), " | ".join(c.description for c in cals),
    )  # fmt: skip

    def med(hw: HardwareSpec, which: str) -> float:
        errs = []
        for g in mine:
            rows = fit_rows(g) if which == "train" else g.holdout
            if g.kind == "vidur_mlp" and which != "train":
                rows = rows & (g.tokens >= MIN_TARGET_TOKENS)
            errs.append(np.abs(g.predict(hw)[rows] / g.measured_s[rows] - 1.0))
        allerr = np.concatenate(errs)
        return float(np.median(allerr)) if allerr.size else math.nan

    held = med(fitted, "holdout")
    if not held <= MAX_HOLDOUT_ERROR:  # (NaN too)
        said = f" ({'; '.join(dict.fromkeys(skipped))})" if skipped else ""
        raise RooftraceError(
            f"{measurements}: the fitted roofline misses the held-out rows by {format_share(held)} (median); "
            f"a calibration off by more than {MAX_HOLDOUT_ERROR:.0%} is not written (check the table's units "
            f"and that its rows are this GPU's){said}"
        )
    for c in cals:
        if c.at_bounds:
            raise RooftraceError(f"{measurements}: {failed_fit(c)}; a calibration pinned at its bounds is not written")
    stem = name or f"{base.name}-calibrated"
    note = f"{cal.description}; hold-out median abs error {med(fitted, 'holdout'):.1%}"
    new = replace(
        fitted,
        name=stem,
        display_name=f"{base.display_name} (calibrated)",
        calibrated_on=note,
        sources={**dict(base.sources), "efficiency": f"rooftrace calibrate: {note}"},
    )
    return CalibrateResult(
        hardware=new,
        calibration=cal,
        train_median_abs_error=med(fitted, "train"),
        holdout_median_abs_error=med(fitted, "holdout"),
        before_median_abs_error=med(base, "holdout"),
        toml=f"# {new.display_name}: written by `rooftrace calibrate`.\n" + hardware_to_toml(new),
        skipped=tuple(dict.fromkeys(skipped)),
        notes=tuple(dict.fromkeys(notes)),
    )


def check_profiles_out(target: Path) -> None:
    """``calibrate --out`` of measured profiles is a folder that exists or can be made (the
    <gpu>/ profiles go in it): anything else is one error line before any work is done."""
    for folder in (target, *target.parents):
        if not os.path.lexists(folder):
            continue
        if not folder.is_dir():
            what = (not_regular(folder) or "a file") if os.path.exists(folder) else "a link to nothing"
            where = "it is" if folder == target else f"{folder} is"
            raise RooftraceError(
                f"{target}: cannot write the profiles there: {where} {what}, not a folder (--out names the "
                "folder the <gpu>/ profiles go in)"
            )
        if not os.access(folder, os.W_OK | os.X_OK):
            raise RooftraceError(f"{target}: cannot write the profiles there: no permission to write in {folder}")
        return


def check_entry_out(target: Path) -> None:
    """``calibrate --out`` of fitted factors is a hardware TOML file: a folder, a device or a
    path under a file is one error line before the fit."""
    for parent in reversed(target.parents):
        if os.path.lexists(parent) and not parent.is_dir():
            raise RooftraceError(f"cannot write {target}: {parent} is a file, not a folder")
    why = not_regular(target) if os.path.exists(target) else None  # (a link to nothing is replaced)
    if why is not None:
        raise RooftraceError(f"cannot write {target}: it is {why}, not a file (--out names the hardware TOML to write)")


def write_calibrated(result: CalibrateResult, out: Path) -> Path:
    """Write the fitted entry to ``out`` (atomically), only if the catalog reads it back; a path
    that cannot be written (a parent that is a file, a folder in its place) is one error line."""
    return write_calibrated_toml(result.toml, out)


def write_calibrated_toml(toml: str, out: Path) -> Path:
    """Write a fitted hardware entry's TOML to ``out`` as :func:`write_calibrated` does."""
    try:
        parse_hardware(tomllib.loads(toml), "fitted entry")
    except ConfigError as exc:
        raise ConfigError(f"{out}: not written: the catalog would refuse the {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{out}: not written: the fitted entry is not valid TOML: {exc}") from None
    return write_entry(out, toml)
