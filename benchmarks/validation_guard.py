"""The regression guard of the end-to-end checks (issue 39, item 7; docs/replay_validation.md).

Every check the project already runs against published or measured figures, computed by the
code that already computes it — the published serving benchmarks (tests/published.py: MLPerf,
NIM, the TensorRT-LLM table; roofline tier as shipped and measured tier), the Argonne vLLM
static batches (both tiers), the operator hold-outs of ``rooftrace validate`` (the measured
profiles held out by shape, pipeline/costmodel/profile/heldout.py; the roofline tier on Vidur and
Splitwise, pipeline/calibrate/validate.py) and the size-aware prior's whole steps with each GPU held out
— reduced to one figure per check: the mean |error| over its rows (and the signed mean, kept
for the reader). tests/data/validation_baselines.toml records them; tests/test_validation_guard.py
fails when a check's mean |error| grows by more than TOLERANCE (2 percentage points).

    python benchmarks/validation_guard.py                 # compare with the baseline, exit 1 if worse
    python benchmarks/validation_guard.py --only argonne-h100
    python benchmarks/validation_guard.py --write --note "YYYY-MM-DD: why"   # record (read the header first)

Measurements: $ROOFTRACE_MEASUREMENTS, else $ROOFTRACE_SHARED_DATA/measurements, else
../shared/measurements beside the checkout (where the tests look).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the published tables are test data (tests/published.py)

from published import (  # noqa: E402
    ARGONNE_CSV,
    MLPERF_SYSTEMS,
    NIM_CSV,
    PUBLISHED,
    TRTLLM_CSV,
    TRTLLM_FLEETS,
    argonne_configs,
    benchmark_fleet,
    mlperf_summary_parts,
    read_argonne_table,
    read_mlperf_summary,
    read_nim_table,
    read_trtllm_table,
    replay_argonne,
    replay_mlperf_offline,
    replay_nim_point,
    replay_trtllm_point,
)

#: The recorded figures.
BASELINE = ROOT / "tests" / "data" / "validation_baselines.toml"
#: A check fails when its mean |error| exceeds the baseline's by more than this (2 points).
TOLERANCE = 0.02
#: A check whose mean |error| fell by more than this is reported as improved (the baseline is then
#: stale: a later regression of the same size would pass unseen until it is rewritten).
IMPROVED = 0.005
#: Decimals kept in the baseline file (0.01 percentage point).
DIGITS = 4
#: A --note starts with its date (and a colon): YYYY-MM-DD:
_DATED = re.compile(r"\d{4}-\d{2}-\d{2}: \S")

HEADER = """\
# Recorded figures of the end-to-end checks: the regression guard (issue 39, item 7).
#
# tests/test_validation_guard.py recomputes every figure below with benchmarks/validation_guard.py
# and FAILS when a check's mean |error| exceeds its recorded value by more than {tol:.0f} percentage
# points; it names the check, the recorded and the new figure. A check missing from the run, or a
# new check missing from this file, fails too. Improvements pass and are listed at the end of the
# pytest run ("validation guard").
#
# How to update this file honestly:
#   1. python benchmarks/validation_guard.py --write --note "YYYY-MM-DD: what changed, what moved"
#      (the shared measurements beside the checkout, or $ROOFTRACE_MEASUREMENTS; the whole run takes
#      a few minutes on 2 cores; the note, dated, is kept below as meta's note for the reader)
#   2. git diff tests/data/validation_baselines.toml: read every figure that moved.
#   3. Commit the file with the change that moved it, and say in the commit message which checks
#      moved, by how much, and why (the cause, measured; e.g. "prior: h100 steps 6.1 -> 5.2 %, the
#      donor's GEMM tables now scaled per dtype").
#   Never rewrite it to make a red run green: a check that got worse is a finding to fix or to
#   explain in the docs (docs/replay_validation.md, docs/validation.md), not a number to move.
#   Rewrite it after improvements too, so the next regression is measured from where the model is.
#
# Figures: mean_abs_error = mean |error| over the check's rows (the guarded figure), mean_error =
# the signed mean (each check's own sign convention, in its group's "error" line), n = rows.
# 0.0123 = 1.23 %.
"""


@dataclass(frozen=True)
class Figure:
    """One check: mean |error| and signed mean error over its ``n`` rows."""

    check: str
    n: int
    mean_abs: float
    mean: float


def figure(check: str, errors: Iterable[float]) -> Figure:
    e = np.asarray(list(errors), dtype=np.float64)
    e = e[np.isfinite(e)]
    if e.size == 0:
        raise ValueError(f"{check}: no finite error to summarise")
    return Figure(check, int(e.size), float(np.abs(e).mean()), float(e.mean()))


@dataclass(frozen=True)
class Group:
    """Checks computed together; ``needs`` are paths under the measurements folder."""

    source: str
    error: str
    needs: tuple[tuple[str, ...], ...]
    compute: Callable[[Path], list[Figure]]


# -- the published serving benchmarks (tests/published.py) ---------------------------------------


def _published(root: Path, measured: bool) -> list[Figure]:
    tier = "measured" if measured else "roofline"
    out: list[Figure] = []
    variants = (False,) if measured else (False, True)  # the fleets' [calibration]: roofline only
    for system in sorted(MLPERF_SYSTEMS):
        summary = read_mlperf_summary(root.joinpath(*mlperf_summary_parts(system)))
        for calibrated in variants:
            fleet = benchmark_fleet(f"mlperf-llama2-70b-{system}", measured=measured, calibrated=calibrated)
            c = replay_mlperf_offline(fleet, summary)
            out.append(figure(f"mlperf-offline/{system}/{tier}{'-calibrated' if calibrated else ''}", [c.error]))
    fleet = benchmark_fleet("nim-llama33-70b-h100-tp2", measured=measured)
    ttft, itl = [], []
    for p in read_nim_table(root.joinpath(*PUBLISHED, NIM_CSV)):
        t, i = replay_nim_point(fleet, p)
        ttft.append(t / p.ttft_s - 1)
        itl.append(i / p.itl_s - 1)
    out += [figure(f"nim/ttft/{tier}", ttft), figure(f"nim/itl/{tier}", itl)]
    errors = []
    for q in read_trtllm_table(root.joinpath(*PUBLISHED, TRTLLM_CSV)):
        rate, _ = replay_trtllm_point(benchmark_fleet(TRTLLM_FLEETS[(q.model, q.gpu)], measured=measured), q)
        errors.append(rate / q.output_tokens_per_s - 1)
    out.append(figure(f"trtllm/throughput/{tier}", errors))
    return out


_PUBLISHED_NEEDS = (
    *(mlperf_summary_parts(s) for s in sorted(MLPERF_SYSTEMS)),
    (*PUBLISHED, NIM_CSV),
    (*PUBLISHED, TRTLLM_CSV),
)
_PUBLISHED_ERROR = "replayed / measured - 1 (tokens/s, TTFT, ITL; positive: the replay is faster / optimistic)"

# -- Argonne LLM-Inference-Bench: vLLM 0.5 / 0.6 static batches ---------------------------------


def _argonne(gpu: str) -> Callable[[Path], list[Figure]]:
    def compute(root: Path) -> list[Figure]:
        configs = {k: v for k, v in argonne_configs(read_argonne_table(root.joinpath(*ARGONNE_CSV))[0]).items()
                   if k[0] == gpu}  # fmt: skip
        out = []
        for tier in ("auto", "roofline"):
            replayed = replay_argonne(configs, tier)
            for tp in sorted({k[2] for k in configs}):
                errors = [configs[k] / r - 1 for k, r in replayed.items() if k[2] == tp]
                out.append(figure(f"argonne/{gpu}/tp{tp}/{tier}", errors))
        return out

    return compute


_ARGONNE_ERROR = "measured latency / replayed latency - 1 (throughput; positive: the replay is faster)"

# -- operator hold-outs (rooftrace validate) ------------------------------------------------------


def _profiles(root: Path) -> list[Figure]:
    """pipeline/costmodel/profile/heldout.py as ``rooftrace validate`` runs it (judge_all): every profiled
    GPU's tables held out by shape, and Vidur's GEMMs where the GPU has them; per GPU, check and
    token range, the mean over the held-out rows instead of judge_all's median."""
    import polars as pl

    from pipeline.costmodel.profile.heldout import judge, judge_vidur
    from pipeline.costmodel.profile.select import select_rows
    from pipeline.costmodel.profile.sources import read_measurements
    from pipeline.costmodel.profile.tables import frames_profile

    meas = read_measurements(root)
    out = []
    for gpu in sorted(meas.gpus):
        frames = [judge(meas, gpu)]
        if (root / "vidur-profiling").is_dir():
            frames.append(judge_vidur(root / "vidur-profiling", frames_profile(gpu, select_rows(meas, gpu)[0])))
        frames = [f for f in frames if f.height]
        if not frames:
            continue
        errors = pl.concat(frames)
        for (check, tokens), part in errors.sort("check", "token_range").group_by(
            ["check", "token_range"], maintain_order=True
        ):
            out.append(figure(f"profile/{gpu}/{check}/{tokens}", part["error"].to_numpy()))
    return out


def _roofline_ops(root: Path) -> list[Figure]:
    """pipeline/calibrate/validate.py's run_validation (the roofline tier on Vidur and Splitwise operators),
    per set, GPU, factors and subset as its summary labels them: catalog factors over every row
    (nothing fitted), calibrated factors over the held-out split only."""
    import polars as pl

    from pipeline.calibrate.validate import _subset, run_validation

    errors = _subset(run_validation(root).errors)
    vidur_big = errors.filter((pl.col("set") == "vidur_mlp") & (pl.col("tokens") >= 128))
    errors = pl.concat([errors, vidur_big.with_columns(pl.lit("all ops, tokens>=128").alias("subset"))])
    errors = errors.filter((pl.col("parameters") == "catalog") | (pl.col("split") == "holdout"))
    out = []
    keys = ["set", "hardware", "parameters", "subset"]
    for key, part in errors.sort(keys).group_by(keys, maintain_order=True):
        out.append(figure("roofline-ops/" + "/".join(str(k) for k in key), part["error"].to_numpy()))
    return out


def _prior_steps(root: Path) -> list[Figure]:
    """The size-aware prior's whole-step check of ``rooftrace validate`` (heldout_steps): each
    profiled GPU's steps priced by the prior fitted on the other GPUs, by that prior behind a
    same-die donor's tables, and by the plain roofline, against the GPU's measured profile."""
    from pipeline.costmodel.profile.heldout import heldout_steps
    from pipeline.costmodel.profile.prior import load_prior, measured_rows

    prior = load_prior()
    steps = heldout_steps(measured_rows(), prior.used if prior is not None else None, fits={})
    out = []
    for gpu in sorted(set(steps["gpu"].to_list())):
        part = steps.filter(steps["gpu"] == gpu)
        for how in ("prior", "donor", "roofline"):
            e = part[f"{how}_error"].drop_nulls().to_numpy()
            if e.size and np.isfinite(e).any():
                out.append(figure(f"prior-steps/{gpu}/{how}", e))
    return out


GROUPS: dict[str, Group] = {
    "published-roofline": Group(
        "tests/published.py (replay_mlperf_offline, replay_nim_point, replay_trtllm_point) on fleets/*.toml as "
        "shipped (cost_model = roofline; -calibrated: with the MLPerf fleets' [calibration], fitted on H100); "
        "tests/test_published_benchmarks.py asserts the bounds",
        _PUBLISHED_ERROR,
        _PUBLISHED_NEEDS,
        lambda root: _published(root, measured=False),
    ),
    "published-measured": Group(
        "the same workloads with each fleet's GPU profile (cost_model = auto, no [calibration]): "
        "benchmarks/published_measured.py",
        _PUBLISHED_ERROR,
        _PUBLISHED_NEEDS,
        lambda root: _published(root, measured=True),
    ),
    "argonne-a100": Group(
        "tests/published.py (argonne_configs, replay_argonne) on every A100 40 GB configuration of Argonne's "
        "All_results.csv, per TP; auto = the size-aware prior (no A100 40 GB profile): benchmarks/argonne_vllm.py",
        _ARGONNE_ERROR,
        (ARGONNE_CSV,),
        _argonne("a100-40gb-sxm"),
    ),
    "argonne-h100": Group(
        "the same on H100 SXM; auto = the measured profile (it models vLLM V1, the runs were vLLM 0.5 / 0.6)",
        _ARGONNE_ERROR,
        (ARGONNE_CSV,),
        _argonne("h100-sxm"),
    ),
    "operator-profiles": Group(
        "rooftrace validate's measured-profile hold-outs (pipeline/costmodel/profile/heldout.py judge, judge_vidur) on "
        "AIConfigurator, LLMServingSim and Vidur: per GPU, check and token range",
        "predicted / measured - 1 (operator time; positive: predicted slower)",
        (("aiconfigurator-vllm-ops",), ("llmservingsim-profiles",)),
        _profiles,
    ),
    "operator-roofline": Group(
        "rooftrace validate's roofline tier (pipeline/calibrate/validate.py run_validation) on Vidur and Splitwise: "
        "catalog "
        "factors over every row, calibrated factors over the held-out split",
        "predicted / measured - 1 (operator or step time; positive: predicted slower)",
        (("vidur-profiling",), ("splitwise-perf-model",)),
        _roofline_ops,
    ),
    "prior-steps": Group(
        "rooftrace validate's whole-step check of the size-aware prior "
        "(pipeline/costmodel/profile/heldout.py heldout_steps): "
        "each profiled GPU held out, its steps against its measured profile (needs no measurements folder)",
        "priced / measured-profile step time - 1 (positive: slower than the profile)",
        (),
        _prior_steps,
    ),
}


def measurements_root() -> Path:
    env = os.environ.get("ROOFTRACE_MEASUREMENTS")
    if env:
        return Path(env)
    shared = os.environ.get("ROOFTRACE_SHARED_DATA")
    return (Path(shared) if shared else ROOT.parent / "shared") / "measurements"


def compute(group: str, root: Path) -> list[Figure]:
    return GROUPS[group].compute(root)


# -- the baseline ---------------------------------------------------------------------------------


@dataclass
class Verdict:
    failures: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)


def _pct(x: float) -> str:
    return f"{x:.2%}"


def compare(baseline: Mapping[str, Mapping[str, Any]], figures: Iterable[Figure], group: str) -> Verdict:
    """Judge ``group``'s new figures against the recorded ones (``baseline``: check -> its
    table, as :func:`read_baseline` returns them). Fails a check whose mean |error| grew by more
    than TOLERANCE, a recorded check of the group that was not computed, and a computed check
    that was never recorded; lists the checks that improved by more than IMPROVED."""
    v = Verdict()
    new = {f.check: f for f in figures}
    recorded = {k: b for k, b in baseline.items() if b.get("group") == group}
    for check, b in sorted(recorded.items()):
        f = new.get(check)
        if f is None:
            v.failures.append(f"{group}: {check}: recorded (mean |error| {_pct(b['mean_abs_error'])}) but not computed")
            continue
        old = float(b["mean_abs_error"])
        delta = f.mean_abs - old
        if not math.isfinite(f.mean_abs) or delta > TOLERANCE:
            v.failures.append(
                f"{group}: {check}: mean |error| {_pct(old)} -> {_pct(f.mean_abs)} ({delta * 100:+.2f} points, "
                f"more than {TOLERANCE * 100:.0f} allowed); signed mean {_pct(float(b['mean_error']))} -> "
                f"{_pct(f.mean)}, {f.n} rows (recorded {b['n']})"
            )
        elif delta < -IMPROVED:
            v.improvements.append(
                f"{group}: {check}: mean |error| {_pct(old)} -> {_pct(f.mean_abs)} ({delta * 100:+.2f} points): "
                f"improved; record it (python benchmarks/validation_guard.py --write, say why in the commit)"
            )
    for check in sorted(set(new) - set(baseline)):
        v.failures.append(
            f"{group}: {check}: not in the baseline (mean |error| {_pct(new[check].mean_abs)}); record it with "
            "python benchmarks/validation_guard.py --write"
        )
    for check in sorted(set(new) & set(baseline) - set(recorded)):
        v.failures.append(f"{group}: {check}: recorded under group {baseline[check].get('group')!r}")
    return v


def read_baseline(path: Path = BASELINE) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(the file's [meta] and [groups] tables, check -> its table)."""
    with path.open("rb") as fh:
        doc = tomllib.load(fh)
    meta = {k: v for k, v in doc.items() if k != "checks"}
    return meta, dict(doc.get("checks", {}))


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_baseline(figures: Mapping[str, list[Figure]], meta: Mapping[str, str]) -> str:
    """The baseline file's text: HEADER, [meta], one [groups.<name>] table per group and one
    inline table per check, in group then check order (a rewrite diffs line by line)."""
    lines = [HEADER.format(tol=TOLERANCE * 100), "[meta]"]
    lines += [f"{k} = {_toml_str(v)}" for k, v in meta.items()]
    lines.append(f"tolerance_points = {TOLERANCE * 100:g}")
    for name in figures:
        g = GROUPS[name]
        lines += ["", f"[groups.{name}]", f"source = {_toml_str(g.source)}", f"error = {_toml_str(g.error)}"]
    lines += ["", "[checks]"]
    for name, figs in figures.items():
        for f in sorted(figs, key=lambda f: f.check):
            lines.append(
                f"{_toml_str(f.check)} = {{ group = {_toml_str(name)}, n = {f.n}, "
                f"mean_abs_error = {round(f.mean_abs, DIGITS)}, mean_error = {round(f.mean, DIGITS)} }}"
            )
    return "\n".join(lines) + "\n"


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def _machine() -> str:
    import platform

    return (
        f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}"
        " (the figures are deterministic: the machine is for the record)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the baseline file with these figures")
    ap.add_argument("--only", action="append", choices=sorted(GROUPS), help="only this group (repeatable)")
    ap.add_argument(
        "--note",
        default=None,
        help='with --write: the dated reason recorded in [meta] ("YYYY-MM-DD: what changed, which checks moved")',
    )
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--measurements", type=Path, default=None, help="the shared measurements folder")
    args = ap.parse_args(argv)
    if args.write and args.only:
        ap.error("--write records every group: drop --only")
    if args.note is not None and not args.write:
        ap.error("--note is recorded by --write only")
    if args.note is not None and (not _DATED.match(args.note) or "\n" in args.note):
        ap.error(f"--note: one line that starts with its date, 'YYYY-MM-DD: ...' (got {args.note[:40]!r})")
    root = args.measurements or measurements_root()
    _, baseline = read_baseline(args.baseline) if args.baseline.is_file() else ({}, {})
    figures: dict[str, list[Figure]] = {}
    verdict = Verdict()
    for name in args.only or list(GROUPS):
        missing = [root.joinpath(*p) for p in GROUPS[name].needs if not root.joinpath(*p).exists()]
        if missing:
            sys.exit(f"{name}: {missing[0]}: not found (set ROOFTRACE_MEASUREMENTS to the shared measurements)")
        t0 = time.perf_counter()
        figures[name] = compute(name, root)
        print(f"{name}: {len(figures[name])} checks in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        print(f"{'check':62s} {'n':>6s} {'mean |e|':>9s} {'mean':>8s} {'recorded':>9s}")
        for f in figures[name]:
            old = baseline.get(f.check, {}).get("mean_abs_error")
            rec = _pct(float(old)) if old is not None else "-"
            print(f"{f.check:62s} {f.n:6d} {_pct(f.mean_abs):>9s} {_pct(f.mean):>8s} {rec:>9s}")
        v = compare(baseline, figures[name], name)
        verdict.failures += v.failures
        verdict.improvements += v.improvements
    for line in verdict.improvements:
        print(f"improved: {line}", file=sys.stderr)
    if args.write:
        meta = {
            "command": "python benchmarks/validation_guard.py --write",
            "commit": _commit(),
            "recorded": datetime.now(UTC).strftime("%Y-%m-%d"),
            "machine": os.environ.get("ROOFTRACE_GUARD_MACHINE") or _machine(),
        }
        if args.note:
            meta["note"] = args.note
        args.baseline.write_text(render_baseline(figures, meta))
        print(f"wrote {args.baseline}: {sum(len(f) for f in figures.values())} checks", file=sys.stderr)
        return 0
    for line in verdict.failures:
        print(f"WORSE: {line}", file=sys.stderr)
    return 1 if verdict.failures else 0


if __name__ == "__main__":
    sys.exit(main())
