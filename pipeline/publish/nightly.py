"""The nightly job: ingest -> classify -> replay -> headroom -> cost -> warehouse -> report, and the index.

Safe to re-run (every stage is idempotent), one run at a time per store (the store lock), and a
failing stage leaves what earlier stages wrote intact and is named in the error (any exception a
stage raises, a bug included: one line, never a traceback). Ingest, classify and replay stop the
night when they fail; after the replay, a failed headroom, cost or warehouse stage does not: the
report is still written (without what the stage would have added) and the error, raised at the
end, names the stage and the report.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import altair as alt
import polars as pl
from markupsafe import Markup

from pipeline.classify.accounting import classify_tokens, day_identity
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import atomic_write_bytes, write_parquet
from pipeline.common.system import keep_ignored_sigint
from pipeline.common.units import format_seconds
from pipeline.economics.cost import run_cost
from pipeline.ingest import IngestSummary, ingest_logs
from pipeline.ingest.project import default_fleet_path, default_reports_dir, sample_dir
from pipeline.ingest.store import Store
from pipeline.publish.report import (
    WHAT_IF_DIR,
    Datasets,
    _fmt,
    _script_json,
    attention,
    build_report,
    drift_phrase,
    ms_cell,
    options_text,
    overload_phrase,
    render,
    slo_phrase,
    vega_bundle,
)
from pipeline.publish.warehouse import build_warehouse
from pipeline.replay.fleet import resolve, unused_pod_options
from pipeline.replay.loadcurve import DEFAULT_BUDGET_S, DEFAULT_MULTIPLIERS, curve_table, headroom_sentence, load_curve
from pipeline.replay.pools import PooledFleet, load_fleet_file
from pipeline.replay.run import ReplayOptions, ReplayResult, replay
from pipeline.replay.slo import failures_line, share_text
from pipeline.synth import SynthConfig, generate
from pipeline.synth.writers import LINE_WRITERS

T = TypeVar("T")
Progress = Callable[[str], None]


class StageError(RooftraceError):
    """A nightly stage failed; what earlier stages wrote is kept. ``result`` is the night as it
    was published when a stage after the replay failed but the report was still written."""

    def __init__(self, message: str, result: NightlyResult | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class NightlyResult:
    date: str
    run_id: str
    report: Path
    index: Path
    headline: dict[str, Any]
    stages: dict[str, float] = field(default_factory=dict)
    ingest: dict[str, Any] = field(default_factory=dict)

    @property
    def attention(self) -> list[str]:
        """Why the night needs someone to act (rejections, overload, a failed SLO, a flagged share
        of quarantined log rows); empty when it does not. The command exits 3 when not empty."""
        return attention(self.headline)

    def line(self) -> str:
        """One line, failures first: quarantined log rows, what was not served, overload, the SLO
        verdict, then the latency of the finished requests, size and cost."""
        h = self.headline
        parts = [f"nightly {self.date}: run {self.run_id}"]
        if h.get("ingest_note"):
            parts.append(("QUARANTINE: " if h.get("quarantine_flagged") else "") + str(h["ingest_note"]))
        if h.get("replayed_requests") is not None:
            parts.append(failures_line({**h, "requests": h["replayed_requests"]}))
        if h.get("overloaded"):
            parts.append(overload_phrase(h.get("overload") or {}))
        if h.get("verdict"):
            parts.append(slo_phrase(h))
        # the run's other warnings that make it need attention, each by its code (never by cutting
        # the text at a character a log value may hold: a model named 'team;x' cut the line there)
        parts.extend(w.short for w in night_warnings(h) if w.short is not None)
        if h.get("drift"):  # the replay is off the latencies the real fleet delivered
            parts.append(drift_phrase(h))
        ttft = h.get("ttft_p99_s")
        parts.append(
            f"p99 TTFT of finished {format_seconds(ttft) if ttft is not None else 'n/a'}, "
            f"{h['gpus'] if h.get('gpus') is not None else 'n/a'} GPUs, "
            # no price (never a made-up $0): the hardware entry the run recorded had none
            + (f"${usd:,.0f}/day" if (usd := h.get("usd_per_day")) is not None else "$/day n/a (no price)")
            + f"; report {self.report} ({sum(self.stages.values()):.1f} s)"
        )
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "date": self.date,
            "run_id": self.run_id,
            "report": str(self.report),
            "index": str(self.index),
            "headline": self.headline,
            "stage_seconds": self.stages,
            "ingest": self.ingest,
            "attention": self.attention,
            "warnings": [w.to_json() for w in night_warnings(self.headline)],
        }


#: The codes a night's warnings start with ("CODE: ..."), as the replay and the report write them.
WARNING_CODES = ("MODEL MIX", "MULTI-NODE", "OVERLOADED", "CACHE SPLIT", "STALE CLASSIFY", "STALE", "DRIFT")

#: The advice each coded warning ends with, left out of the night's one-line summary. Found at its
#: last occurrence: the values from the logs (model names) come before it in the text.
_ADVICE = {"MODEL MIX": "; a fleet per model", "MULTI-NODE": ", but its cross-node communication"}


@dataclass(frozen=True)
class NightWarning:
    """One of the night's warnings: ``code`` (one of :data:`WARNING_CODES`, else ''), ``text`` (the
    whole line) and ``short`` (its phrase in the one-line summary; None: the summary leaves it to
    its own ``warning:`` line). Built once, from the run's warnings and the report's notes, so
    that no printer re-splits a text that quotes log values."""

    code: str
    text: str
    short: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"code": self.code or None, "text": self.text}


def _warning(text: str) -> NightWarning:
    code = next((c for c in WARNING_CODES if text.startswith(f"{c}:")), "")
    short = None
    if code == "MODEL MIX":
        cut = text.rfind(_ADVICE[code])
        short = text[:cut] if cut > 0 else text
    elif code == "MULTI-NODE":
        cut = text.rfind(_ADVICE[code])
        short = (text[:cut] if cut > 0 else text) + ", priced as one node (latencies optimistic)"
    return NightWarning(code, text, short)


def night_warnings(headline: dict[str, Any]) -> list[NightWarning]:
    """The night's warnings, structured: the run's, then a replay that drifted from the observed
    latencies (code DRIFT; the summary has its own phrase for it)."""
    out = [_warning(str(w)) for w in headline.get("warnings") or []]
    if headline.get("drift_note"):
        out.append(NightWarning("DRIFT", str(headline["drift_note"])))
    return out


class _Failed(Exception):
    """A stage that failed, with why (one line); :func:`_stage` raises it, the nightly decides
    whether the stages after it can still run."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(why)
        self.name, self.why = name, why


def _why(exc: BaseException) -> str:
    """One line saying why a stage failed: a rooftrace error as it is; anything else (a bug, an
    OSError a stage did not turn into a rooftrace error) with its type, as it is not self-explanatory."""
    text = " ".join(str(exc).split())
    if isinstance(exc, RooftraceError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _stage(name: str, timings: dict[str, float], say: Progress, fn: Callable[[], T]) -> T:
    """Run one stage, timed; any exception it raises (Ctrl-C aside) is a :class:`StageError`
    naming it, never a traceback that hides which stage failed."""
    try:
        return _attempt(name, timings, say, fn)
    except _Failed as failed:
        raise StageError(f"stage {name} failed (earlier stages' outputs are intact): {failed.why}") from (
            failed.__cause__
        )


def _attempt(name: str, timings: dict[str, float], say: Progress, fn: Callable[[], T]) -> T:
    say(f"[{name}] ...")
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:  # (not BaseException: Ctrl-C stays Ctrl-C)
        say(f"[{name}] FAILED after {time.perf_counter() - t0:.1f} s")
        raise _Failed(name, _why(exc)) from (None if isinstance(exc, RooftraceError) else exc)
    timings[name] = time.perf_counter() - t0
    say(f"[{name}] done in {timings[name]:.1f} s")
    return out


def nightly(
    logs: Sequence[str | Path],
    fleet: Path | str | None,
    store: Store,
    date: str | None = None,
    reports_dir: Path | None = None,
    fmt: str | None = None,
    progress: Progress | None = None,
    slo: str | None = None,
    headroom_budget_s: float = DEFAULT_BUDGET_S,
    jobs: int = 1,
    pods: int = 1,
    executor: str = "local",
    ray_address: str | None = None,
    dedupe_across_formats: bool = False,
) -> NightlyResult:
    """Run the whole pipeline on ``logs`` for one date (``date``, else the date they hold the most
    requests of: :func:`_night`); ``jobs`` ingest workers, and the replay in ``pods`` run by
    ``executor`` (docs/scale.md); ``dedupe_across_formats``: ingest's option of that name (a
    request logged in two formats stored once). The fleet is checked before anything runs."""
    keep_ignored_sigint()  # a SIGINT the caller ignores is ignored by every stage (polars' handler)
    say = progress or (lambda _m: None)
    reports_dir = reports_dir or default_reports_dir()
    fleet_path = Path(fleet) if fleet is not None else default_fleet_path()
    cfg = load_fleet_file(fleet_path)
    for one in cfg.pools if isinstance(cfg, PooledFleet) else ():  # a bad fleet is one error, before the ingest
        resolve(one.config, f"{fleet_path} [[pool]] {one.name!r}")
    if not isinstance(cfg, PooledFleet):
        resolve(cfg, str(fleet_path))
    timings: dict[str, float] = {}
    with store.lock():
        summary = _stage(
            "ingest",
            timings,
            say,
            lambda: ingest_logs(
                logs, store, fmt=fmt, date=date, progress=say, jobs=jobs, dedupe_across_formats=dedupe_across_formats
            ),
        )
        if summary.errors:
            raise StageError(f"stage ingest failed (nothing after it ran): {'; '.join(summary.errors)}")
        if isinstance(summary, IngestSummary):  # rows read = stored + quarantined + duplicates, as ingest says
            say(summary.line())
        day = date or _night(store, summary, say)
        _stage("classify", timings, say, lambda: classify_tokens(store, day))
        options = ReplayOptions(date=day, slo=slo, pods=pods, executor=executor, ray_address=ray_address)
        result = _stage("replay", timings, say, lambda: replay(store, fleet, options, progress=say))
        for pool_cfg in [p.config for p in cfg.pools] if isinstance(cfg, PooledFleet) else [cfg]:
            ran = int(result.summary.get("engine_pods") or 1)
            for note in dict.fromkeys(unused_pod_options(pool_cfg, pods, executor, ray_address, ran)):
                say(f"replay: {note}")
        # From here on a failed stage does not stop the night: the headroom curve, the cost
        # tables and the warehouse are parts of the report, which is still written without them
        # (the report and the index need the report stage). The failures are raised at the end.
        failed: list[_Failed] = []

        def optional(name: str, fn: Callable[[], object]) -> None:
            try:
                _attempt(name, timings, say, fn)
            except _Failed as exc:
                failed.append(exc)

        optional("headroom", lambda: write_load_curve(store, result, fleet, day, slo, headroom_budget_s, say))
        optional("cost", lambda: run_cost(store, result.run_id))
        optional("warehouse", lambda: build_warehouse(store))
        try:
            report = _attempt(
                "report",
                timings,
                say,
                lambda: build_report(store, result.run_id, day, reports_dir=reports_dir, nightly=True),
            )
            index = _attempt("index", timings, say, lambda: build_index(reports_dir, store.cache_dir))
        except _Failed as exc:
            raise StageError(_failures_line([*failed, exc], None)) from exc.__cause__
        night = NightlyResult(day, result.run_id, report.path, index, report.headline, timings, summary.to_json())
        if failed:
            raise StageError(_failures_line(failed, report.path), night) from failed[0].__cause__
    return night


def _failures_line(failed: Sequence[_Failed], report: Path | None) -> str:
    """The stages that failed, in one line: those after which the night went on say so (and
    where its report is), the last one when it stopped the night says what was kept."""
    parts = []
    for i, f in enumerate(failed):
        if report is None and i == len(failed) - 1:
            parts.append(f"stage {f.name} failed (earlier stages' outputs are intact): {f.why}")
        else:
            after = f"the later stages ran; report {report}" if report is not None else "the later stages ran"
            parts.append(f"stage {f.name} failed ({after}): {f.why}")
    return "; ".join(parts)


def _night(store: Store, summary: IngestSummary, say: Progress) -> str:
    """The date a nightly reports on when none is given: of the dates its logs hold, the one they
    hold the most stored requests of (the newest of equals); the others are named on ``say``.
    The newest date alone would be the few requests of a day file that arrive after midnight;
    the store's own count per date would pick yesterday when tonight's log starts a few minutes
    early. The logs' rows are the stored rows whose source file has the content of a file of
    this night (ingested now, or skipped as ingested before: a re-run picks the same date)."""
    shas = [f.content_sha256 for f in summary.files if f.content_sha256 and not f.error]
    if not shas or not store.manifest_path.exists():
        return store.resolve_date(None)
    manifest = pl.read_parquet(store.manifest_path, columns=["source_file", "content_sha256", "dates"])
    mine = manifest.filter(pl.col("content_sha256").is_in(shas))
    files = mine["source_file"].unique().to_list()
    dates = {d for held in mine["dates"].to_list() for d in held or []}
    if not dates:
        return store.resolve_date(None)
    counts = []
    for d in dates:
        rows = pl.scan_parquet(store.request_files(d)).filter(pl.col("source_file").is_in(files))
        counts.append((int(rows.select(pl.len()).collect().item()), d))
    counts.sort(reverse=True)
    day = counts[0][1]
    if len(counts) > 1:
        others = ", ".join(f"{d} ({n:,} requests)" for n, d in sorted(counts[1:], key=lambda c: c[1]))
        say(
            f"nightly: reporting on {day} ({counts[0][0]:,} requests), the date the logs hold most of; "
            f"also in them: {others} (--date DATE for another)"
        )
    return str(day)


def write_load_curve(
    store: Store,
    result: ReplayResult,
    fleet: Path | str | None,
    day: str,
    slo: str | None,
    budget_s: float,
    say: Progress,
) -> Path:
    """The headroom stage: the run's traffic at DEFAULT_MULTIPLIERS, in parallel processes when
    one replay takes long enough to pay for starting them, within ``budget_s`` seconds."""
    cfg = load_fleet_file(Path(fleet) if fleet is not None else default_fleet_path())
    wall = float(result.summary.get("engine_wall_s") or 0.0)
    jobs = min(os.cpu_count() or 1, len(DEFAULT_MULTIPLIERS)) if wall > 5.0 else 1
    requests = store.read_requests(day)
    identity = day_identity(store, day, requests, say)
    rows = load_curve(requests, cfg, slo or cfg.slo, DEFAULT_MULTIPLIERS, budget_s, jobs, say, identity)
    say(headroom_sentence(rows))
    return write_parquet(curve_table(result.run_id, rows), result.run_dir / "load_curve.parquet", "load_curve")


#: The demo's night: a synthetic gateway log (OpenAI-style request/response pairs, made by
#: :func:`demo_log_text`), 3,000 requests of one model from 4 tenants over an hour of 2025-01-15,
#: chat and agent sessions whose prompts grow turn by turn, with provider-reported
#: ``cached_tokens``, and no latencies (nothing to compare a replay with: made up, they would drift).
DEMO_LOG = "gateway_demo_2025-01-15.jsonl.gz"
DEMO_DATE = "2025-01-15"
#: The model the demo's log names, as a gateway logs it (the fleet serves it as llama-3.1-8b).
DEMO_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: The fleet the demo replays on: fleets/demo.toml (the default fleet with a 128k context,
#: session-affinity routing and the `chat` SLO).
DEMO_FLEET = "demo.toml"


def demo_log_text() -> bytes:
    """The demo's gateway log, uncompressed: `rooftrace synth --format openai` (seed 37, 3,000
    requests, 4 tenants, one hour, model :data:`DEMO_MODEL`) without its ttft_s / e2e_s fields.
    The same bytes on every call: the bundled file is this text gzipped (a test checks it)."""

    frame = generate(
        SynthConfig(requests=3000, seed=37, date=DEMO_DATE, duration_s=3600.0, tenants=4, models=(DEMO_MODEL,))
    )
    lines = [line.rsplit(',"ttft_s":', 1)[0] + "}" for line in LINE_WRITERS["openai"](frame)]
    return ("\n".join(lines) + "\n").encode()


def write_demo_log(path: Path | None = None) -> Path:
    """Write the demo's log (:func:`demo_log_text`, gzipped with no name or time in the header, so
    the file is the same bytes wherever zlib compresses alike) to ``path`` (default: the bundled
    sample's own file), atomically."""
    import gzip

    target = path or sample_dir() / DEMO_LOG
    atomic_write_bytes(target, gzip.compress(demo_log_text(), compresslevel=9, mtime=0))
    return target


def demo_fleet_path() -> Path:
    """fleets/demo.toml of the source checkout (beside the bundled sample)."""
    return sample_dir().parents[1] / "fleets" / DEMO_FLEET


def demo(store: Store, reports_dir: Path | None = None, progress: Progress | None = None) -> list[NightlyResult]:
    """The nightly job on the bundled demo night: :data:`DEMO_LOG`, a synthetic gateway log with
    prefix reuse (sessions, reported cache hits), tenants and a named model, on fleets/demo.toml,
    which carries the `chat` SLO, so its report has cache-hit tokens, tenants and a verdict."""
    sample = sample_dir()
    fleet = demo_fleet_path()
    return [nightly([sample / DEMO_LOG], fleet, store, DEMO_DATE, reports_dir, progress=progress)]


# --- the reports index --------------------------------------------------------------------------

_TREND = (
    ("goodput", "goodput", "%"),
    ("knee", "traffic headroom (× today's load)", "×"),
    ("ttft_p99_s", "p99 TTFT of finished (ms)", "ms"),
    ("tpot_p99_s", "p99 TPOT of finished (ms)", "ms"),
    ("peak_fresh_prefill_tokens_per_s_1s", "peak fresh prefill (tokens/s, 1 s)", ""),
    ("peak_decode_tokens_per_s_1s", "peak decode (tokens/s, 1 s)", ""),
    ("usd_per_day", "fleet $/day", "$"),
)


def _trend_cell(v: Any, unit: str) -> str:
    """One index cell: latencies as a number under an '(ms)' header, the knee as '2×'."""
    if unit == "ms":
        return ms_cell(v) if v is not None else "n/a"
    if unit == "×":
        return f"{float(v):g}×" if isinstance(v, int | float) and not isinstance(v, bool) else "n/a"
    return _fmt(v, unit)


def _headlines(reports_dir: Path, patterns: Sequence[str]) -> list[dict[str, Any]]:
    """The headline.json documents under ``reports_dir`` matching ``patterns``, each with the
    link to its page (``_href``) and its trend group (``_group``: fleet and store)."""
    nights = []
    for path in sorted(p for pattern in patterns for p in reports_dir.glob(pattern)):
        try:
            night = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a half-written night is skipped, not fatal
        if not isinstance(night, dict):
            continue
        night["_href"] = path.parent.relative_to(reports_dir).as_posix() + "/index.html"
        store = str(night.get("store") or "")
        night["_group"] = f"{night.get('fleet') or '?'} · {Path(store).name or '?'}"
        nights.append(night)
    nights.sort(key=lambda n: (n["_group"], str(n.get("date")), str(n.get("run_id"))))
    return nights


def _status_parts(n: dict[str, Any]) -> tuple[str, str]:
    """The index's failures cell: rejections, overload, the SLO, quarantined log rows and a
    replay that drifted from the observed latencies; red when any needs acting on (a quarantined
    share of at least QUARANTINE_FLAG_SHARE included), amber when log rows were quarantined below
    it or the replay drifted, green otherwise. A report whose run or token accounting is STALE
    says so first."""
    bits = []
    if n.get("classify_stale"):
        bits.append(
            f"STALE classify ({int(n.get('classified_requests') or 0):,} of "
            f"{int(n.get('store_requests') or 0):,} requests)"
        )
    if n.get("stale"):
        bits.append("STALE run")
    if n.get("rejected"):
        bits.append(f"{n['rejected']:,} rejected")
    if n.get("overloaded"):
        bits.append("OVERLOADED")
    if n.get("slo_passed") is not None:
        bits.append(f"SLO {n.get('slo')} {'pass' if n['slo_passed'] else 'FAIL'}")
    quarantined = int(n.get("ingest_rows_quarantined") or 0)
    if quarantined:
        share = share_text(float(n.get("quarantined_share") or 0.0))
        bits.append(f"{quarantined:,} of {int(n.get('ingest_rows_read') or 0):,} log rows quarantined ({share})")
    if n.get("ingest_rows_duplicate"):
        bits.append(f"{int(n['ingest_rows_duplicate']):,} duplicate rows")
    if n.get("drift"):
        bits.append(drift_phrase(n))
    cls = "bad" if attention(n) else ("warn" if quarantined or n.get("drift") else "good")
    return cls, "; ".join(bits) or "ok"


def _status(n: dict[str, Any]) -> str:
    """The failures cell as HTML (:func:`_status_parts`), escaped by the template engine."""
    cls, text = _status_parts(n)
    return str(render("cell.html.j2", cls=cls, text=text))


def build_index(reports_dir: Path, cache_dir: Path) -> Path:
    """Write ``reports/index.html``: every report's headline numbers, failures first, and their
    trend — one line per fleet and traffic source (the store it was made from), never one trend
    across different fleets or traffic. What-if runs' reports (reports/<date>/<fleet>/what-if/)
    are listed below, out of the trend."""
    nights = _headlines(reports_dir, ("*/*/headline.json", "*/headline.json"))
    what_ifs = _headlines(reports_dir, (f"*/*/{WHAT_IF_DIR}/*/headline.json",))

    def row(n: dict[str, Any]) -> dict[str, Any]:
        cls, text = _status_parts(n)
        return {
            "href": n["_href"],
            "date": str(n.get("date")),
            "run_id": str(n.get("run_id")),
            "group": n["_group"],
            "status": text,
            "status_cls": cls,
            "cells": [_trend_cell(n.get(k), unit) for k, _, unit in _TREND],
            "gpus": f"{_fmt(n.get('gpus'))} × {n.get('hardware')}",
            "options": options_text(n.get("what_if") or {}) or "-",
        }

    long = [
        {
            "date": n.get("date"),
            "metric": title,
            "value": n[key] * 1000 if unit == "ms" else n[key],  # a latency: ms, as its title says
            "fleet · traffic": n["_group"],
        }
        for n in nights
        for key, title, unit in _TREND
        if isinstance(n.get(key), int | float)
    ]
    data = Datasets()
    spec = data.spec(
        alt.Chart(data(long))
        .mark_line(point=True)
        .encode(
            x=alt.X("date:T", title="night"),
            y=alt.Y("value:Q", title=None),
            color=alt.Color("fleet · traffic:N"),
            row=alt.Row("metric:N", title=None),
        )
        .properties(width=700, height=110)
        .resolve_scale(y="independent")
    )
    bundle = vega_bundle(cache_dir).replace("</script", "<\\/script")
    page = render(
        "index.html.j2",
        bundle=Markup(bundle),
        trend_titles=[t for _, t, _ in _TREND],
        nights=[row(n) for n in nights],
        what_ifs=[row(n) for n in what_ifs],
        spec=Markup(_script_json(spec)),
    )
    out = reports_dir / "index.html"
    atomic_write_bytes(out, (str(page) + "\n").encode())
    return out
