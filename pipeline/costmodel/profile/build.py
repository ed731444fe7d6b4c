"""Build GPU profiles from operator measurements (``rooftrace calibrate --measurements DIR``).

For each GPU found in the measurements, the rows a replay needs are selected — per dtype the
kernel vLLM runs by default (the one with the most rows in the set, which is the one the
collector swept), window-less attention, the bf16 collectives — and written to
``pipeline/catalog/profiles/<gpu>/`` with a ``profile.toml`` that states the files, the row
counts, the selection, how the kernels were measured and the held-out errors
(pipeline/costmodel/profile/heldout.py). AIConfigurator's tables are preferred where a GPU has them;
LLMServingSim's per-model operators are kept as model-specific tables (and are the only GEMM
and attention source for the RTX 4090).

Writes are atomic per file and the profile.toml goes last, so a killed build leaves either the
previous profile or a folder whose row counts do not match (refused on load, rebuilt next run).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.common.errors import ConfigError
from pipeline.common.schemas import atomic_write_bytes
from pipeline.costmodel.profile.heldout import attention_tile, fit_fallbacks, fit_sampler, heldout_summary, judge
from pipeline.costmodel.profile.plausible import drop_flagged, implausible_rows
from pipeline.costmodel.profile.select import select_rows
from pipeline.costmodel.profile.sources import read_measurements
from pipeline.costmodel.profile.tables import FAMILY_FILES, PROFILES_DIR, frames_profile

#: Implausible rows profile.toml lists by their reason (the rest are counted; validate lists all).
IMPLAUSIBLE_LISTED = 20


def leave_out_implausible(frames: dict[str, pl.DataFrame]) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    """``frames`` without the rows pipeline/costmodel/profile/plausible.py flags, and what
    profile.toml says of them (empty when none): the count, the count per family / dtype / rule,
    and the first :data:`IMPLAUSIBLE_LISTED` with their reasons."""
    flagged = implausible_rows(frames)
    if flagged.height == 0:
        return frames, {}
    out = dict(frames)
    for fam in flagged["family"].unique().to_list():
        out[fam] = drop_flagged(frames[fam], fam, flagged)
    counts = flagged.group_by(["family", "dtype", "rule"]).len().sort(["family", "dtype", "rule"])
    listed = [
        f"{r['family']} {r['dtype']} {r['kernel']} {r['key']}: {r['reason']} ({r['source']})"
        for r in flagged.head(IMPLAUSIBLE_LISTED).iter_rows(named=True)
    ]
    info = {
        "count": int(flagged.height),
        "by_rule": "; ".join(f"{f} {d} {rule}: {n:,}" for f, d, rule, n in counts.iter_rows()),
        "rows": listed,
    }
    if flagged.height > IMPLAUSIBLE_LISTED:
        info["rows_not_listed"] = int(flagged.height - IMPLAUSIBLE_LISTED)
    return out, info


#: How each set's kernels were timed (AIConfigurator's collection_meta.yaml, LLMServingSim's meta.yaml).
STACKS: dict[str, dict[str, Any]] = {
    "aiconfigurator": {
        "engine": "vLLM 0.24 (A100: 0.14) operators, timed one call at a time by AIConfigurator",
        "cuda_graphs": "custom all-reduce timed both under CUDA graphs and eager; other kernels are kernel times",
    },
    "llmservingsim": {
        "engine": "vLLM 0.19, enforce_eager (no CUDA graphs), one decoder layer per TP shard",
        "cuda_graphs": "off: kernel times only",
    },
}


@dataclass(frozen=True)
class BuiltProfile:
    gpu: str
    folder: Path
    rows: dict[str, int]
    heldout: dict[str, Any]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):  # never written: meta_toml leaves such entries out
            raise ValueError(f"cannot write the non-finite number {value!r} to a profile")
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def meta_toml(
    gpu: str,
    stack: dict[str, Any],
    files: list[str],
    rows: dict[str, int],
    selection: dict[str, str],
    fitted: dict[str, Any],
    heldout: dict[str, Any],
    implausible: dict[str, Any] | None = None,
) -> str:
    def finite(v: Any) -> bool:
        if isinstance(v, float):
            return math.isfinite(v)
        if isinstance(v, list | tuple):
            return all(finite(x) for x in v)
        return True

    # a figure that is not a finite number (a fit or a held-out error with nothing to stand on)
    # is left out rather than written as "nan"
    fitted = {k: v for k, v in fitted.items() if finite(v)}
    heldout = {name: e for name, e in heldout.items() if all(finite(v) for v in e.values())}
    lines = [
        "# Measured operator profile of one GPU, written by `rooftrace calibrate --measurements`.",
        "# The Parquet files beside this one hold the measured rows (times in seconds); see docs/validation.md.",
        f"gpu = {_toml_value(gpu)}",
        'licence = "rows derived from AIConfigurator (Apache-2.0, ai-dynamo/aiconfigurator) and '
        "LLMServingSim (MIT, casys-kaist/LLMServingSim) measurements; see each row's source\"",
        f"built_from = {_toml_value(sorted(files))}",
        "",
        "[stack]",
        *(f"{k} = {_toml_value(v)}" for k, v in stack.items()),
        "",
        "[rows]",
        *(f"{k} = {v}" for k, v in sorted(rows.items())),
        "",
        "[selection]",
        *(f"{k} = {_toml_value(v)}" for k, v in sorted(selection.items())),
        "",
        "[fitted]",
        *(f"{k} = {_toml_value(v)}" for k, v in sorted(fitted.items())),
        "",
    ]
    if implausible:
        lines += [
            "# rows left out as implausible (pipeline/costmodel/profile/plausible.py; rooftrace validate lists all)",
            "[implausible]",
            *(f"{k} = {_toml_value(v)}" for k, v in implausible.items()),
            "",
        ]
    for name, entry in sorted(heldout.items()):
        lines.append(f'[heldout."{name}"]')
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in entry.items())
        lines.append("")
    return "\n".join(lines)


def write_profile(
    folder: Path,
    gpu: str,
    frames: dict[str, pl.DataFrame],
    selection: dict[str, str],
    fitted: dict[str, Any],
    heldout: dict[str, Any],
    implausible: dict[str, Any] | None = None,
) -> BuiltProfile:
    """Write one profile folder (tables first, profile.toml last); OSError becomes a one-line error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        rows: dict[str, int] = {}
        files: set[str] = set()
        sets: set[str] = set()
        for fam, frame in frames.items():
            # float32 would halve the files but change the numbers a profile was judged on
            buf = io.BytesIO()
            frame.write_parquet(buf, compression="zstd", compression_level=19, statistics=False)
            atomic_write_bytes(folder / FAMILY_FILES[fam], buf.getvalue())
            rows[fam] = frame.height
            files.update(frame["source"].unique().to_list())
            sets.update(frame["set"].unique().to_list())
        for fam, fname in FAMILY_FILES.items():
            if fam not in frames and (folder / fname).exists():
                (folder / fname).unlink()
        stack = {f"{s}_{k}": v for s in sorted(sets) for k, v in STACKS[s].items()}
        text = meta_toml(gpu, stack, sorted(files), rows, selection, fitted, heldout, implausible)
        atomic_write_bytes(folder / "profile.toml", text.encode())
        return BuiltProfile(gpu, folder, rows, heldout)
    except OSError as exc:
        raise ConfigError(f"{folder}: cannot write the profile: {exc.strerror or exc}") from None


@dataclass
class _Previous:
    """What a rebuild keeps of the profile already in its folder: the tables of the families the
    new measurements do not cover, with their selection, held-out errors and fitted values."""

    frames: dict[str, pl.DataFrame]
    selection: dict[str, str]
    fitted: dict[str, Any]
    heldout: dict[str, Any]
    notes: list[str]


#: How profile.toml's [heldout] entries name each family ("<prefix>, 1-127").
_HELDOUT_PREFIX = {
    "allreduce": "collectives",
    "attn_decode": "decode attention",
    "attn_prefill": "prefill attention",
    "attn_mixed": "mixed attention",
}


def keep_previous(folder: Path, gpu: str, covered: set[str]) -> _Previous:
    """The tables of the profile in ``folder`` whose families are not in ``covered`` (a set of
    measurements that holds only GEMMs must not delete a profile's attention, collectives and MoE
    tables). Nothing when there is no readable profile of ``gpu`` there; a table that cannot be
    read is said in ``notes`` (and dropped)."""
    import tomllib

    prev = _Previous({}, {}, {}, {}, [])
    meta_path = folder / "profile.toml"
    try:
        meta = tomllib.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return prev
    if meta.get("gpu") != gpu:
        return prev
    raw_selection = meta.get("selection")
    selection: dict[str, Any] = raw_selection if isinstance(raw_selection, dict) else {}
    raw_rows = meta.get("rows")
    listed: dict[str, Any] = raw_rows if isinstance(raw_rows, dict) else {}
    for fam, fname in FAMILY_FILES.items():
        # a file the previous profile.toml does not list is no part of it (a stray or a killed
        # build's leftover): replaced as before
        if fam in covered or fam not in listed or not (folder / fname).is_file():
            continue
        try:
            frame = pl.read_parquet(folder / fname)
        except Exception as exc:  # polars raises many kinds for a damaged file
            prev.notes.append(
                f"{folder / fname}: the previous {fam} table cannot be read ({type(exc).__name__}); dropped"
            )
            continue
        if frame.height != listed[fam]:
            prev.notes.append(
                f"{folder / fname}: the previous {fam} table has {frame.height:,} rows, its profile.toml "
                f"{listed[fam]!r}; dropped"
            )
            continue
        prev.frames[fam] = frame
        if isinstance(selection.get(fam), str):
            prev.selection[fam] = selection[fam]
    if prev.frames:
        kept = ", ".join(f"{fam} ({frame.height:,} rows)" for fam, frame in sorted(prev.frames.items()))
        prev.notes.append(f"{gpu}: kept from the previous profile in {folder} (not in these measurements): {kept}")
        heldout = meta.get("heldout")
        if isinstance(heldout, dict):  # the kept families' errors, not those the new rows replace
            replaced = tuple(_HELDOUT_PREFIX.get(fam, fam) for fam in covered)
            prev.heldout = {k: v for k, v in heldout.items() if isinstance(v, dict) and not str(k).startswith(replaced)}
        fitted = meta.get("fitted")
        if isinstance(fitted, dict):
            prev.fitted = dict(fitted)
    return prev


def build_profiles(
    measurements: Path,
    out_dir: Path = PROFILES_DIR,
    gpus: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    skipped: list[str] | None = None,
    notes: list[str] | None = None,
) -> list[BuiltProfile]:
    """Read ``measurements``, judge the tables on held-out shapes, write one profile per GPU;
    ``skipped`` gets what the measurements held that was not read, and why; ``notes`` what the
    reader said about rows it kept (repeated measurements that disagree)."""
    meas = read_measurements(measurements)
    names = meas.gpus if gpus is None else [g for g in meas.gpus if g in gpus]
    built: list[BuiltProfile] = []
    sampler = fit_sampler(meas)
    for gpu in names:
        if progress:
            progress(f"profile {gpu}: selecting rows")
        frames, selection = select_rows(meas, gpu)
        frames, implausible = leave_out_implausible(frames)
        if implausible:
            meas.note(gpu, f"{gpu}: {implausible['count']:,} implausible row(s) left out ({implausible['by_rule']})")
        if not frames:
            meas.skip(gpu, f"{gpu}: no rows a profile keeps; no profile written")
            continue
        measured = set(frames)
        prev = keep_previous(out_dir / gpu, gpu, measured)
        for note in prev.notes:
            meas.note(gpu, note)
        frames = {**frames, **prev.frames}
        selection = {**prev.selection, **selection}
        said = meas.gpu_notes.get(gpu)
        if said:  # rows of this GPU's files left out, and repeats that disagree: in its profile.toml too
            selection["notes"] = "; ".join(dict.fromkeys(said))
        if progress:
            progress(f"profile {gpu}: judging held-out shapes")
        errors = judge(meas, gpu)
        # fitted on the rows a fleet reads by default (the stated precedence where sets overlap)
        chosen = dict(frames_profile(gpu, frames).frames)
        fitted = fit_fallbacks(chosen) | sampler | attention_tile(meas, gpu, chosen)
        if "attn_mixed" in prev.frames:  # the tile was fitted on the kept mixed batches
            fitted |= {k: v for k, v in prev.fitted.items() if k.startswith("attention_tile")}
        heldout = {**prev.heldout, **heldout_summary(errors)} if prev.frames else heldout_summary(errors)
        built.append(write_profile(out_dir / gpu, gpu, frames, selection, fitted, heldout, implausible))
    if skipped is not None:
        skipped.extend(meas.skipped)
    if notes is not None:
        notes.extend(meas.notes)
    return built
