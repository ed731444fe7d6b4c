"""``rooftrace validate --runs``: replay benchmark client runs under their own methodology and
measure how far the replay is from what the client observed (docs/benchruns.md).

Each bench run (pipeline/ingest/benchruns.py) becomes canonical requests — its successful
requests in the order sent, with their input and output tokens — replayed by the replay stage's
own machinery (:func:`pipeline.replay.run.run_replay`: the closed loop of C clients with the run's
ramp, the open loop at the run's arrival times, or everything at once; no second simulator) on
the given fleet. Per run and metric the table holds the observed and replayed mean, p50, p90 and
p99 and their errors, replayed / observed − 1 (positive: the replay is slower than the server):

- **TTFT, TPOT, E2E** over the requests the replay finished, with the project's definitions
  (pipeline/calibrate/observed.py: TPOT = (e2e − ttft) / (output tokens − 1)) and its one percentile;
- **ITL**, the inter-token latency as vLLM's benchmark reports it: every gap between streamed
  tokens (the file's ``itls`` / ``inter_chunk_latency``) against the replay's, each decode token
  of a step waiting that step (the named query ``latency``'s ``itl_s``); a file without per-token
  gaps (GuideLLM) has no ITL row values.

The table is written under STORE/validation/runs.parquet (schema ``validation_runs``), atomically,
the same bytes for the same runs and fleet; the report shows it when it is there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from pipeline.calibrate.observed import observed_latencies, percentile_pair
from pipeline.catalog.names import resolve_model_name
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import read_parquet, write_parquet
from pipeline.ingest.benchruns import BenchRun, arrivals_s, find_runs
from pipeline.ingest.project import default_fleet_path, find_project
from pipeline.ingest.store import Store
from pipeline.replay.fleet import ResolvedFleet, resolve
from pipeline.replay.pools import PooledFleet, load_fleet_file, pooled_refusal
from pipeline.replay.run import ReplayOptions, run_replay
from pipeline.replay.slo import percentile, request_latencies

#: The metrics of the table, in this order, with the names people read.
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))
#: The statistics compared.
STATS = ("mean", "p50", "p90", "p99")
#: The stored table's file under STORE/validation/ and its schema.
TABLE_FILE = "runs.parquet"
SCHEMA = "validation_runs"


@dataclass(frozen=True)
class RunsValidation:
    """Every run's rows (schema validation_runs) and what was said about the runs."""

    table: pl.DataFrame
    fleet: str
    notes: list[str] = field(default_factory=list)


def _canonical(run: BenchRun) -> pl.DataFrame:
    """The run's requests as the replay reads them: ids in the order sent, arrivals from
    :func:`pipeline.ingest.benchruns.arrivals_s` (µs from the epoch), tokens."""
    t_us = np.round(arrivals_s(run) * 1e6).astype(np.int64)
    t_us = np.maximum.accumulate(t_us)  # sent order kept where rounding would swap two sends
    return pl.DataFrame(
        {
            "request_id": [f"{i:08d}" for i in range(run.n)],
            "arrival": pl.Series(t_us, dtype=pl.Int64).cast(pl.Datetime("us", "UTC")),
            "recorded_input_tokens": run.requests.get_column("input_tokens"),
            "output_tokens": run.requests.get_column("output_tokens"),
        }
    )


def options_of(run: BenchRun) -> ReplayOptions:
    """The replay options that reproduce the run's client. No isolation keys: a benchmark's
    requests are one model's, and they share prefixes only where their tokens do."""
    m = run.methodology
    if m.mode == "closed":
        return ReplayOptions(concurrency=m.concurrency or 1, ramp_s=m.ramp_s, isolation=())
    return ReplayOptions(offline=m.mode == "offline", isolation=())


def replayed_itls(log_columns: dict[str, npt.NDArray[Any]]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The replay's inter-token latencies as (value, weight): each decode token of a span of
    identical steps waits one step of that span (the named query ``latency``'s ``itl_s``)."""
    steps = log_columns["steps"].astype(np.float64)
    ok = (log_columns["decode_seqs"] > 0) & (steps > 0)
    v = (log_columns["end_s"][ok] - log_columns["start_s"][ok]) / steps[ok]
    w = log_columns["decode_seqs"][ok].astype(np.float64) * steps[ok]
    return v.astype(np.float64), w


def weighted_percentile(v: npt.NDArray[np.float64], w: npt.NDArray[np.float64], pct: float) -> float:
    """The inverse-CDF percentile of values ``v`` with weights ``w`` (the smallest value with at
    least ``pct`` % of the weight at or below it: the project's definition, weighted)."""
    order = np.argsort(v, kind="stable")
    cw = np.cumsum(w[order])
    i = int(np.searchsorted(cw, pct / 100.0 * cw[-1] * (1 - 1e-12), side="left"))
    return float(v[order][min(i, v.size - 1)])


def _row(observed: npt.NDArray[np.float64], replayed: npt.NDArray[np.float64]) -> dict[str, Any]:
    """Observed and replayed mean, p50, p90, p99 of paired values, and the errors."""
    out: dict[str, Any] = {"samples": int(observed.size)}
    if observed.size == 0:
        return out
    o_mean, r_mean = float(observed.mean()), float(replayed.mean())
    out |= {"observed_mean_s": o_mean, "replayed_mean_s": r_mean,
            "mean_error": r_mean / o_mean - 1.0 if o_mean > 0 else None}  # fmt: skip
    for q in (50, 90, 99):
        o, r, err = percentile_pair(observed, replayed, q)
        out |= {f"observed_p{q}_s": o, f"replayed_p{q}_s": r, f"p{q}_error": err}
    return out


def _itl_row(
    gaps: npt.NDArray[np.float64] | None, v: npt.NDArray[np.float64], w: npt.NDArray[np.float64]
) -> dict[str, Any]:
    """ITL: the run's per-token gaps against the replay's weighted step times (no pairing)."""
    if gaps is None or gaps.size == 0 or v.size == 0:
        return {"samples": 0 if gaps is None else int(gaps.size)}
    o_mean, r_mean = float(gaps.mean()), float(np.sum(v * w) / np.sum(w))
    out: dict[str, Any] = {"samples": int(gaps.size), "observed_mean_s": o_mean, "replayed_mean_s": r_mean,
                           "mean_error": r_mean / o_mean - 1.0 if o_mean > 0 else None}  # fmt: skip
    for q in (50, 90, 99):
        o, r = percentile(gaps, q), weighted_percentile(v, w, q)
        out |= {f"observed_p{q}_s": o, f"replayed_p{q}_s": r, f"p{q}_error": r / o - 1.0 if o > 0 else None}
    return out


def replay_run(run: BenchRun, fleet: ResolvedFleet) -> tuple[list[dict[str, Any]], int]:
    """The run replayed on ``fleet`` under its methodology: one row per metric (without the
    run's identifying columns), and how many of its requests the replay finished."""
    requests = _canonical(run)
    result = run_replay(requests, fleet, options_of(run))
    res = result.result
    lat = request_latencies(res, result.work)
    done = res.reject_reason == 0
    done &= np.isfinite(res.finish_s)
    obs = observed_latencies(run.requests)
    rows = []
    for key, label in METRICS:
        if key == "itl":
            v, w = replayed_itls(result.log.columns())
            row = _itl_row(run.itls_s, v, w)
        else:
            ok = done & np.isfinite(obs[key]) & np.isfinite(lat[key])
            row = _row(obs[key][ok], lat[key][ok])
        rows.append({"metric": label, **row})
    return rows, int(done.sum())


def load_one_pool(fleet_path: Path | str | None) -> tuple[Path, ResolvedFleet]:
    """The fleet the runs are replayed on: one pool's FLEET.toml (the project's by default)."""
    path = Path(fleet_path) if fleet_path is not None else default_fleet_path()
    cfg = load_fleet_file(path)
    if isinstance(cfg, PooledFleet):
        raise pooled_refusal(path, "validate --runs")
    return path, resolve(cfg, str(path))


def _model_note(run: BenchRun, fleet: ResolvedFleet) -> str | None:
    """A note when the run names a model that is not the fleet's (replayed as the fleet's)."""
    if not run.model:
        return None
    match = resolve_model_name(run.model, aliases=find_project().models)
    if match.model == fleet.config.model:
        return None
    said = f"the catalog's {match.model}" if match.model is not None else "no catalog model"
    return f"{run.name}: the run's model {run.model!r} is {said}; replayed as the fleet's {fleet.config.model}"


def validate_runs(
    runs_path: Path | str, fleet_path: Path | str | None = None, progress: Callable[[str], None] | None = None
) -> RunsValidation:
    """Read every run under ``runs_path``, replay each on the fleet, and return the table."""
    say = progress or (lambda _m: None)
    path, fleet = load_one_pool(fleet_path)
    runs = find_runs(runs_path)
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    for run in runs:
        say(f"replaying {run.name} ({run.tool}: {run.n:,} requests, {run.methodology.describe()}) on {path.name}")
        notes += [f"{run.name}: {n}" for n in run.notes]
        if run.failed:
            what = "request" if run.failed == 1 else "requests"
            notes.append(f"{run.name}: {run.failed:,} failed {what} left out (the client counted them failed)")
        if (note := _model_note(run, fleet)) is not None:
            notes.append(note)
        metric_rows, finished = replay_run(run, fleet)
        if finished < run.n:
            notes.append(f"{run.name}: the replay finished {finished:,} of {run.n:,} requests (the rest rejected)")
        for r in metric_rows:
            rows.append({"run": run.name, "tool": run.tool, "model": run.model, "fleet": fleet.config.name,
                         "methodology": run.methodology.describe(), "requests": run.n, "replayed": finished,
                         **r})  # fmt: skip
    columns = _columns()
    table = pl.DataFrame([{c: r.get(c) for c in columns} for r in rows], schema=columns)
    return RunsValidation(table, fleet.config.name, notes)


def _columns() -> dict[str, Any]:
    cols: dict[str, Any] = {"run": pl.String, "tool": pl.String, "model": pl.String, "fleet": pl.String,
                            "methodology": pl.String, "requests": pl.Int64, "replayed": pl.Int64,
                            "metric": pl.String, "samples": pl.Int64}  # fmt: skip
    for s in STATS:
        cols[f"observed_{s}_s"] = pl.Float64
        cols[f"replayed_{s}_s"] = pl.Float64
        cols[f"{s}_error"] = pl.Float64
    return cols


def store_table(store: Store, table: pl.DataFrame) -> Path:
    """Write the table to STORE/validation/runs.parquet (atomic; the same bytes for the same rows)."""
    with store.lock():
        return write_parquet(table.to_arrow(), store.validation_dir / TABLE_FILE, SCHEMA)


def stored_table(store: Store) -> pl.DataFrame | None:
    """The stored table of the last ``validate --runs``, None when there is none."""
    path = store.validation_dir / TABLE_FILE
    if not path.is_file():
        return None
    frame = pl.from_arrow(read_parquet(path, SCHEMA))
    assert isinstance(frame, pl.DataFrame)
    return frame


def _pct(x: Any) -> str:
    return f"{x:+7.1%}" if isinstance(x, int | float) and math.isfinite(x) else "      -"


def table_lines(table: pl.DataFrame) -> list[str]:
    """The table as people read it: one line per run and metric, the signed errors."""
    head = f"{'run':44s} {'tool':8s} {'methodology':34s} {'reqs':>6s} {'metric':6s} " + " ".join(
        f"{s:>7s}" for s in STATS
    )
    lines = [head]
    last = None
    for r in table.iter_rows(named=True):
        first = r["run"] != last
        last = r["run"]
        ident = (
            f"{_cut(r['run'], 44):44s} {r['tool']:8s} {_cut(r['methodology'], 34):34s} {r['requests']:6d}"
            if first
            else " " * (44 + 1 + 8 + 1 + 34 + 1 + 6)
        )
        lines.append(f"{ident} {r['metric']:6s} " + " ".join(_pct(r[f"{s}_error"]) for s in STATS))
    return lines


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def report_rows(table: pl.DataFrame) -> list[dict[str, Any]]:
    """The table as the report shows it: observed and replayed means in ms, signed errors."""
    out = []
    for r in table.iter_rows(named=True):
        row: dict[str, Any] = {"run": r["run"], "tool": r["tool"], "methodology": r["methodology"],
                               "requests": r["requests"], "metric": r["metric"]}  # fmt: skip
        for s in ("mean", "p99"):
            for side in ("observed", "replayed"):
                v = r[f"{side}_{s}_s"]
                row[f"{side} {s} (ms)"] = round(v * 1e3, 2) if v is not None else None
        for s in STATS:
            row[f"{s} error"] = _pct(r[f"{s}_error"]).strip()
        out.append(row)
    return out


def check_runs_path(runs: str) -> Path:
    if not runs.strip():
        raise RooftraceError("--runs: the path is empty (name one, e.g. --runs path/to/results)")
    return Path(runs)
