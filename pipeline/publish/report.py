"""The offline HTML capacity report: headline numbers, then charts, then the run's config.

Every number and chart comes from a named warehouse query (``pipeline/publish/queries``), so it can be
reproduced with ``rooftrace query NAME --run RUN``. Charts are aggregated in SQL before plotting
(a day of a million requests still makes a small file). The page is one standalone file: the
Vega, Vega-Lite and vega-embed JavaScript from vl-convert is inlined once and nothing is
fetched. The HTML is jinja2 templates (``pipeline/publish/templates``) with autoescaping on: every string
from a log or a config is escaped by the template engine, and chart data is embedded as JSON with
``<`` escaped, so no log line can inject markup or script. Latencies are shown in milliseconds
(the queries, the Parquet and the JSON keep seconds).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import altair as alt
import jinja2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import vl_convert as vlc
from markupsafe import Markup

from pipeline.calibrate.benchruns import report_rows, stored_table
from pipeline.calibrate.observed import observed_count, observed_latencies, percentile_pair
from pipeline.classify.accounting import classify_totals
from pipeline.classify.freshness import classify_freshness, request_id_digest
from pipeline.common import system
from pipeline.common.budget import notice
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import atomic_write_bytes, check_replaceable, os_write_reason
from pipeline.common.system import not_regular
from pipeline.common.tables import table_to_json
from pipeline.common.units import format_bytes, format_seconds, plain_number
from pipeline.economics.cost import STALE_AFTER_DAYS, Period, stored_run_period
from pipeline.economics.energy import energy_rows, run_energy
from pipeline.ingest.store import Store, check_date, confined
from pipeline.publish.warehouse import Session, check_date_option, check_parquet
from pipeline.replay.loadcurve import headroom_sentence, knee
from pipeline.replay.offload import offload_line
from pipeline.replay.run import cache_split_note
from pipeline.replay.runfolder import latest_run, read_config, run_ids
from pipeline.replay.slo import (
    METRICS,
    MULTI_NODE,
    day_projection,
    overload_from_dict,
    overload_text,
    share_text,
    traffic_span,
)

Rows = list[dict[str, Any]]


class Datasets:
    """Chart data kept out of Altair's objects: Altair validates inline values against the
    Vega-Lite JSON schema value by value, which costs seconds for a few thousand points. Charts
    reference a named dataset instead and the values go into the spec's top-level ``datasets``."""

    def __init__(self) -> None:
        self.pending: dict[str, Rows] = {}
        self.count = 0

    def __call__(self, values: Rows) -> Any:
        self.count += 1
        name = f"d{self.count}"
        self.pending[name] = values
        return alt.NamedData(name=name)

    def spec(self, chart: alt.TopLevelMixin) -> dict[str, Any]:
        out: dict[str, Any] = chart.to_dict()
        out["datasets"] = {**out.get("datasets", {}), **self.pending}
        self.pending = {}
        return out


def _rows(table: pa.Table) -> Rows:
    return table_to_json(table)


#: Address space vl-convert's JavaScript engine (V8, in ``javascript_bundle`` and every
#: ``vegalite_to_*``) reserves when it starts, beyond what the process maps already: under a
#: smaller ``ulimit -v`` it aborts the whole process ("Fatal process out of memory: Oilpan:
#: CagedHeap reservation", SIGTRAP, exit 133), which Python cannot catch. Measured with
#: ``ulimit -v N; python -c 'import vl_convert as v; v.javascript_bundle()'``: it aborts at
#: N = 66,000,000 KiB and runs at 68,000,000 KiB from a 0.1 GiB process, and, after importing
#: pipeline.publish.report (0.9 GiB mapped), aborts at 68,000,000 and runs at 69,000,000 KiB: about
#: 64 GiB beyond the mapped size. 66 GiB leaves room for the engine's own heap.
V8_ADDRESS_SPACE_BYTES = 66 * 1024**3


def charts_blocked(what: str = "charts not rendered") -> str | None:
    """Why vl-convert's JavaScript engine cannot start in this process (an address-space limit,
    ``ulimit -v``, too small for the space it reserves: :data:`V8_ADDRESS_SPACE_BYTES`), or
    None when it can. Checked before any call that starts it: past the limit it aborts the
    process, it does not raise."""
    limit = system.address_space_limit()
    if limit is None or limit - system.virtual_size() >= V8_ADDRESS_SPACE_BYTES:
        return None
    return (
        f"{what}: this process has an address-space limit (ulimit -v, {format_bytes(limit)}) and "
        f"vl-convert's JavaScript engine needs about {format_bytes(V8_ADDRESS_SPACE_BYTES)} of it; the rest "
        "of the report is complete: run it again without the limit (ulimit -v unlimited) to draw them"
    )


#: The page's script where vl-convert's bundle cannot be built (:func:`charts_blocked`): each
#: chart's place says why instead (the index's trend chart included).
_NO_BUNDLE = (
    "function vegaEmbed(id, spec, opts) { const el = document.querySelector(id); "
    "if (el) { el.textContent = NO_CHARTS; el.className = 'nodata'; } return Promise.resolve(); }"
)


def cached_bundle(cache_dir: Path) -> Path:
    """Where vl-convert's JavaScript bundle of this version is cached."""
    key = f"vega-{vlc.get_vega_version()}-vl-{vlc.get_vegalite_versions()[-1]}-embed-{vlc.get_vega_embed_version()}"
    return cache_dir / f"{key}.js"


def vega_bundle(cache_dir: Path) -> str:
    """vl-convert's JavaScript bundle (Vega, Vega-Lite, vega-embed), cached per version: building
    it takes seconds, reading it milliseconds. Where it is not cached and cannot be built (an
    address-space limit, :func:`charts_blocked`), a stand-in whose ``vegaEmbed`` puts the reason
    where each chart would be."""
    path = cached_bundle(cache_dir)
    if path.exists():
        return path.read_text()
    blocked = charts_blocked()
    if blocked is not None:
        return f"const NO_CHARTS = {_script_json(blocked)};\n{_NO_BUNDLE}"
    bundle: str = vlc.javascript_bundle()  # type: ignore[call-arg]
    with contextlib.suppress(OSError):  # a store the reader may not write (read-only): built again next time
        atomic_write_bytes(path, bundle.encode())
    return bundle


def _script_json(doc: Any) -> str:
    """JSON safe inside a <script> element (no '</script>' or HTML comment can form)."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _fmt(v: Any, unit: str = "", digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, int | float):
        x = float(v)
        if unit == "ms":  # a latency (seconds in) for people: always milliseconds
            return f"{plain_number(x * 1000, digits)} ms"
        if unit == "s":
            return f"{plain_number(x * 1000, digits)} ms" if abs(x) < 1 else f"{plain_number(x, digits)} s"
        if unit == "%":
            return f"{x * 100:.1f}%"
        if unit == "$":
            return f"${x:,.2f}"
        return plain_number(x, digits) + (f" {unit}" if unit else "")
    return str(v)


@dataclass
class Chart:
    key: str
    title: str
    definition: str
    spec: dict[str, Any]
    #: Why there is nothing to draw (every dataset empty: no request finished, say); the page
    #: shows this note instead of the chart and no PNG is made.
    empty: str | None = None
    #: Drawn inside a section of its own (its place is ``<div ... id="chart-KEY">`` in that
    #: section's HTML), not as a chart section of its own.
    inline: bool = False
    #: HTML shown below the chart in its section (a table of the sample counts behind it).
    after: str = ""


NO_DATA = "No data to draw"


def _no_data(spec: dict[str, Any]) -> str | None:
    datasets = spec.get("datasets") or {}
    return f"{NO_DATA}." if datasets and not any(datasets.values()) else None


@dataclass
class ReportResult:
    path: Path
    run_id: str
    date: str
    headline: dict[str, Any]
    charts: list[str] = field(default_factory=list)
    pngs: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    #: Charts not written as PNG, each 'key: why' (nothing to draw, or vl-convert could not).
    pngs_skipped: list[str] = field(default_factory=list)
    #: Why the report is not in its date's and fleet's own folder (a what-if run), else None.
    placement: str | None = None
    #: Why the charts were not drawn (page or PNG: an address-space limit, charts_blocked), else None.
    charts_note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "run_id": self.run_id,
            "date": self.date,
            "headline": self.headline,
            "charts": self.charts,
            "pngs": [str(p) for p in self.pngs],
            "pngs_skipped": self.pngs_skipped,
            "placement": self.placement,
            "charts_note": self.charts_note,
            "seconds": round(self.seconds, 3),
        }

    def warning_lines(self) -> list[str]:
        """What the command says on stderr before its line: a STALE run (the store's requests of
        its date changed since it ran), and an overloaded run's not-valid unit costs."""
        h = self.headline
        keys = ("classify_stale_note", "stale_note", "cache_split_note", "unit_costs_note", "drift_note")
        shown = [k for k in keys if h.get(k) and not (k == "cache_split_note" and h.get("classify_stale_note"))]
        return [str(h[k]) for k in shown]

    def line(self) -> str:
        """The command's summary line: where the report is, failures first."""
        h = self.headline
        bits = attention(h)
        if h.get("unit_costs_note") and not h.get("overloaded"):
            bits.append("the fleet fell behind the traffic ($ per token not valid)")
        if h.get("ingest_note") and not h.get("quarantine_flagged"):
            bits.append(f"{int(h.get('ingest_rows_quarantined') or 0):,} log rows quarantined")
        if h.get("drift"):
            bits.append(drift_phrase(h))
        text = f"report: {self.path} ({len(self.charts)} charts, {self.seconds:.1f} s)"
        if bits:
            text += "; needs attention: " + ", ".join(bits)
        if self.placement:
            text += f"; {self.placement}"
        if self.pngs_skipped:
            text += f"; not drawn as PNG: {'; '.join(self.pngs_skipped)}"
        return text


def _first(rows: Rows, **match: Any) -> dict[str, Any]:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return {}


def headline_numbers(q: Callable[[str], Rows]) -> dict[str, Any]:
    peaks = q("peak_throughput")
    lat = q("latency")
    kv = _first(q("kv_memory"), replica="fleet")
    cost = fleet_cost_row(q("cost"))
    tokens = (q("token_totals") or [{}])[0]
    return {
        "peak_fresh_prefill_tokens_per_s_1s": _first(peaks, metric="fresh_prefill", window="1s").get("tokens_per_s"),
        "peak_fresh_prefill_tokens_per_s_1min": _first(peaks, metric="fresh_prefill", window="1min").get(
            "tokens_per_s"
        ),
        "peak_fresh_prefill_at": to_second(_first(peaks, metric="fresh_prefill", window="1s").get("at")),
        "peak_decode_tokens_per_s_1s": _first(peaks, metric="decode", window="1s").get("tokens_per_s"),
        "peak_decode_tokens_per_s_1min": _first(peaks, metric="decode", window="1min").get("tokens_per_s"),
        "peak_decode_at": to_second(_first(peaks, metric="decode", window="1s").get("at")),
        "peak_kv_bytes": kv.get("peak_bytes"),
        "kv_capacity_bytes": kv.get("capacity_bytes"),
        "kv_headroom": kv.get("headroom"),
        "ttft_p99_s": _first(lat, metric="ttft_s").get("p99"),
        "tpot_p99_s": _first(lat, metric="tpot_s").get("p99"),
        "ttft_p50_s": _first(lat, metric="ttft_s").get("p50"),
        "tpot_p50_s": _first(lat, metric="tpot_s").get("p50"),
        "gpus": cost.get("gpus"),
        "hardware": cost.get("hardware"),
        "usd_per_day": cost.get("usd_per_day"),
        "usd_per_million_tokens": cost.get("usd_per_million_tokens"),
        "price_date": cost.get("price_date"),
        "requests": tokens.get("requests"),
        # classify's whole-day cache; the replay's engine caches give replay_* (health_headline)
        "classify_recorded_input_tokens": tokens.get("recorded_input_tokens"),
        "classify_cache_hit_tokens": tokens.get("cache_hit_tokens"),
        "classify_fresh_input_tokens": tokens.get("fresh_input_tokens"),
        "output_tokens": tokens.get("output_tokens"),
    }


def _charts(q: Callable[[str], Rows], headline: dict[str, Any], scaled: AutoscaleDay | None = None) -> list[Chart]:
    charts: list[Chart] = []
    width = 760

    _data = Datasets()

    def add(
        key: str,
        title: str,
        definition: str,
        chart: alt.TopLevelMixin,
        faceted: bool = False,
        empty: str | None = None,
    ) -> None:
        spec = _data.spec(chart if faceted else chart.properties(width=width))
        charts.append(Chart(key, title, definition, spec, empty or _no_data(spec)))

    def utc(field: str, title: str, rows: Rows | None = None) -> alt.X:
        # Vega formats times in the viewer's zone and 12-hour clock by default: force UTC, 24 h,
        # with ticks on whole minutes or hours (no label printed twice on a short day)
        key = field.split(":")[0]
        return alt.X(field, title=title, scale=alt.Scale(type="utc"), axis=time_axis(rows or [], key))

    curve = [r for r in q("load_curve") if r["status"] == "ok"]
    if curve:
        long = [
            {"multiplier": r["multiplier"], "series": f"{pct} {metric.upper()}", "ms": r[f"{metric}_{pct}_s"] * 1000}
            for r in curve
            for metric in ("ttft", "tpot")
            for pct in ("p50", "p99")
            if r[f"{metric}_{pct}_s"] is not None and r[f"{metric}_{pct}_s"] > 0
        ]
        limits = [
            {"series": f"p99 {t['target'][:4].upper()}", "limit": t["limit_s"] * 1000, "label": f"SLO {t['target']}"}
            for t in (headline.get("verdict") or {}).get("targets", [])
            if t["target"] in ("ttft_p99", "tpot_p99")
        ]
        x = alt.X("multiplier:Q", title="traffic multiplier (x today's arrival rate)", scale=alt.Scale(zero=False))
        y = alt.Y("ms:Q", title="milliseconds (log)", scale=alt.Scale(type="log"))
        color = alt.Color("series:N", title=None)
        layers: list[Any] = [
            alt.Chart(_data(long))
            .mark_line(point=True)
            .encode(x=x, y=y, color=color, tooltip=["series:N", "multiplier:Q", alt.Tooltip("ms:Q", format=".3~r")])
        ]
        if limits:
            layers.append(
                alt.Chart(_data(limits))
                .mark_rule(strokeDash=[6, 4])
                .encode(
                    y=alt.Y("limit:Q", scale=alt.Scale(type="log")),
                    color=alt.Color("series:N"),
                    tooltip=["label:N", "limit:Q"],
                )
            )
        k = knee(q("load_curve"))
        if k is not None:
            layers.append(
                alt.Chart(_data([{"knee": k, "label": f"knee {k:g}x"}]))
                .mark_rule(color="#c0392b")
                .encode(x="knee:Q", tooltip=["label:N"])
            )
        add(
            "load_curve",
            f"{TRAFFIC_HEADROOM}: latency against traffic — " + headroom_sentence(q("load_curve")),
            "The day's requests replayed at several multipliers of their arrival rate (same requests, closer "
            "in time); p50 and p99 over finished requests; dashed lines: the SLO limits; red rule: the knee, "
            "the largest multiplier up to which every point meets the SLO (without an SLO: no overload or "
            "rejections). Query: load_curve.",
            alt.layer(*layers),
            empty=None if long else f"{NO_DATA}: no request finished at any traffic multiplier tried.",
        )

    minutes = q("token_rates")
    if minutes:
        long = [
            {"minute": r["minute"], "series": name, "tokens_per_s": r[col]}
            for r in minutes
            for name, col in (
                ("recorded input", "recorded_input_tokens_per_s"),
                ("cache-hit input (classify's cache)", "cache_hit_tokens_per_s"),
                ("fresh input (classify's cache)", "fresh_input_tokens_per_s"),
                ("output", "output_tokens_per_s"),
            )
        ]
        add(
            "token_accounting",
            "Token accounting per minute (tokens/s of wall time)",
            "recorded = input tokens as logged (cached included); cache-hit = served from classify's "
            "prefix cache (whole day, arrival order); fresh = recorded − cache-hit (prefill work); output = "
            "generated tokens. Recorded input is dashed: where nothing hits it coincides with fresh input.",
            alt.Chart(_data(long))
            .mark_line()
            .encode(
                x=utc("minute:T", "minute (UTC)", minutes),
                y=alt.Y("tokens_per_s:Q", title="tokens/s"),
                color=alt.Color("series:N", title=None),
                # recorded input is drawn dashed and wider: with no cache hits it equals fresh input
                # and would otherwise hide under it
                strokeDash=alt.StrokeDash("series:N", title=None),
                strokeWidth=alt.condition(alt.datum.series == "recorded input", alt.value(4), alt.value(1.5)),
                tooltip=["minute:T", "series:N", alt.Tooltip("tokens_per_s:Q", format=",.0f")],
            ),
        )
    timeline = q("fleet_timeline")
    if timeline:
        bin_s = timeline[0].get("bin_s", 1)
        for key, col, peak_col, label, head_key in (
            (
                "prefill",
                "fresh_prefill_tokens_per_s",
                "peak_fresh_prefill_tokens_per_s",
                "Fresh prefill throughput",
                "peak_fresh_prefill_tokens_per_s_1s",
            ),
            (
                "decode",
                "decode_tokens_per_s",
                "peak_decode_tokens_per_s",
                "Aggregate decode throughput",
                "peak_decode_tokens_per_s_1s",
            ),
        ):
            base = alt.Chart(_data(timeline)).encode(x=utc("time:T", "time (UTC)", timeline))
            mean = base.mark_line().encode(y=alt.Y(f"{col}:Q", title="tokens/s"))
            peak = base.mark_line(opacity=0.35, strokeDash=[3, 3]).encode(y=f"{peak_col}:Q")
            mark = headline.get(head_key)
            layers = [mean, peak]
            if mark is not None:
                rule = alt.Chart(_data([{"peak": mark}])).mark_rule(color="firebrick").encode(y="peak:Q")
                text = (
                    alt.Chart(_data([{"peak": mark, "label": f"peak {mark:,.0f} tok/s (1 s)"}]))
                    .mark_text(align="left", dy=-6, color="firebrick")
                    .encode(y="peak:Q", text="label:N", x=alt.value(4))
                )
                layers += [rule, text]
            add(
                key,
                f"{label} (tokens/s, fleet total)",
                f"Solid: mean over {bin_s} s bins; dashed: the highest 1 s value in each bin; red: the "
                "day's 1 s peak. Tokens actually processed by the replayed fleet (fresh prefill "
                "excludes cache hits).",
                alt.layer(*layers),
            )
        add(
            "kv",
            "KV-cache memory in use vs capacity (fraction of KV capacity, fullest replica)",
            "Blocks in use / blocks the memory fit left for KV, max over replicas and over each bin; 1.0 = full "
            "(new requests wait, running ones may be preempted).",
            alt.layer(
                alt.Chart(_data(timeline))
                .mark_area(opacity=0.6)
                .encode(
                    x=utc("time:T", "time (UTC)", timeline),
                    y=alt.Y("kv_use_fraction:Q", title="fraction of KV capacity", scale=alt.Scale(domain=[0, 1.05])),
                ),
                alt.Chart(_data([{"cap": 1.0}])).mark_rule(color="firebrick").encode(y="cap:Q"),
            ),
        )
        queue = [
            {"time": r["time"], "series": name, "requests": r[col]}
            for r in timeline
            for name, col in (("running (batch occupancy)", "running"), ("waiting (queue depth)", "waiting"))
        ]
        add(
            "queue",
            "Queue depth and batch occupancy (requests, fleet total)",
            f"Mean over {bin_s} s bins of the requests running in a batch and waiting to be scheduled.",
            alt.Chart(_data(queue))
            .mark_line()
            .encode(
                x=utc("time:T", "time (UTC)", timeline),
                y=alt.Y("requests:Q", title="requests"),
                color=alt.Color("series:N", title=None),
            ),
        )
    cdf = q("latency_cdf")
    if cdf:
        add(
            "latency_cdf",
            "Latency CDFs (milliseconds, log scale)",
            "ttft_s = first token − arrival (queueing included); tpot_s = (e2e − ttft) / (output − 1); "
            "e2e_s = last token − arrival (vLLM definitions), finished requests.",
            alt.Chart(_data([{**r, "ms": r["seconds"] * 1000} for r in cdf if r["seconds"] and r["seconds"] > 0]))
            .mark_line()
            .encode(
                x=alt.X("ms:Q", title="milliseconds", scale=alt.Scale(type="log")),
                y=alt.Y("fraction:Q", title="fraction of requests ≤ x"),
                color=alt.Color("metric:N", title=None),
            ),
        )
    by = [r for r in q("latency_by") if r["dimension"] == "prompt_tokens"]
    if by:
        order = ["0-511", "512-2047", "2048-8191", "8192-32767", "32768+"]
        by.sort(key=lambda r: (order.index(r["bucket"]) if r["bucket"] in order else len(order), str(r["metric"])))
        long = [
            {
                "bucket": r["bucket"],
                "metric": str(r["metric"]).removesuffix("_s"),  # (the axis says milliseconds)
                "percentile": p,
                "ms": r[p] * 1000,
                "n": r["samples"],
            }
            for r in by
            for p in ("p50", "p90", "p99")
            if r[p] is not None and enough_samples(int(r["samples"] or 0), p)
        ]
        add(
            "latency_by_prompt",
            "Latency percentiles by prompt length (milliseconds)",
            "p50 / p90 / p99 of TTFT, TPOT and E2E per bucket of recorded input tokens (inverse CDF: the "
            "smallest value with at least p % of the bucket's requests at or below it). A percentile is drawn "
            f"only where its bucket has at least {MIN_SAMPLES_FOR['p50']} / {MIN_SAMPLES_FOR['p90']} / "
            f"{MIN_SAMPLES_FOR['p99']} requests (below that p90 or p99 is the bucket's maximum, not a tail); "
            "the table below gives every bucket's count.",
            alt.Chart(_data(long))
            .mark_bar()
            .encode(
                x=alt.X("bucket:N", title="recorded input tokens", sort=order),
                xOffset="percentile:N",
                y=alt.Y("ms:Q", title="milliseconds"),
                color=alt.Color("percentile:N"),
                tooltip=["bucket:N", "percentile:N", alt.Tooltip("ms:Q", format=".3~r"), alt.Tooltip("n:Q", title="n")],
            )
            .properties(width=220, height=200)
            .facet(column=alt.Column("metric:N", title=None))
            .resolve_scale(y="independent"),
            faceted=True,
        )
        charts[-1].after = latency_bucket_table(by)
    binding = q("binding_timeline")
    if binding:
        add(
            "binding",
            "Binding resource over time (engine busy seconds per minute, all replicas)",
            "Each step span is attributed to the resource whose time dominates its roofline cost: compute "
            "(FLOPs), memory (bytes moved), communication (tensor-parallel all-reduce) or fixed overhead.",
            alt.Chart(_data(binding))
            .mark_area()
            .encode(
                x=utc("minute:T", "minute (UTC)", binding),
                y=alt.Y("busy_s:Q", title="busy seconds per minute", stack=True),
                color=alt.Color("binding:N", title=None),
            ),
        )
    if scaled is not None:
        _autoscale_charts(scaled, _data, add)
    curve = q("cache_curve_points")
    if curve:
        add(
            "cache_curve",
            "Prefix-cache capacity curve: hit fraction of input tokens vs cache size (tokens)",
            "How much KV memory buys how much prefill: LRU prefix cache of the given capacity, one pass "
            "over the day's requests (Mattson stack distances); per model.",
            alt.Chart(_data(curve))
            .mark_line(point=True)
            .encode(
                x=alt.X("capacity_tokens:Q", title="cache capacity (tokens)", scale=alt.Scale(type="log")),
                y=alt.Y("token_hit_fraction:Q", title="cache-hit fraction of input tokens"),
                color=alt.Color("model:N", title=None),
            ),
        )
    return charts


@dataclass(frozen=True)
class AutoscaleDay:
    """An autoscaled run's replicas and latencies over the day, per minute since the first arrival."""

    replicas: Rows  # minute, live, provisioned
    load: Rows  # minute, requests (arrivals in the minute)
    ttft: Rows  # minute, ttft_p99_ms (of the minute's arrivals, never-served ones as infinite: left out)


def autoscale_day(record: Mapping[str, Any], run_dir: Path) -> AutoscaleDay:
    """The charts' rows from a run's recorded ``autoscale`` (config.json's summary) and its
    requests table: live and provisioned replicas at each minute's start, arrivals per minute,
    the p99 TTFT of each minute's arrivals (the inverse CDF; a request never served counts as
    infinite, so a minute whose p99 is one is drawn at its finite maximum and said so)."""
    req = pq.read_table(run_dir / "requests.parquet", columns=["arrival_s", "ttft_s"])
    arrival = req.column("arrival_s").to_numpy().astype(np.float64)
    ttft = req.column("ttft_s").to_numpy(zero_copy_only=False).astype(np.float64)
    minutes = int(np.ceil(float(arrival.max()) / 60.0)) + 1 if arrival.size else 1
    lives = record.get("replicas", [])
    rows: Rows = []
    for m in range(minutes):
        t = 60.0 * m
        live = sum(1 for r in lives if r["live_from_s"] <= t < (r["retire_s"] if r["retire_s"] is not None else 1e300))
        paid = sum(1 for r in lives if r["paid_from_s"] <= t < float(r["end_s"]))
        rows.append({"minute": m, "live": live, "provisioned": paid})
    which = (arrival // 60.0).astype(np.int64)
    counts = np.bincount(which, minlength=minutes)
    load = [{"minute": m, "requests": int(c)} for m, c in enumerate(counts)]
    served = np.where(np.isfinite(ttft), ttft, np.inf)
    p99: Rows = []
    for m in np.unique(which):
        x = np.sort(served[which == m])
        v = float(x[max(int(np.ceil(0.99 * x.size)) - 1, 0)])
        p99.append({"minute": int(m), "ttft_p99_ms": v * 1000.0 if math.isfinite(v) else None})
    return AutoscaleDay(rows, load, [r for r in p99 if r["ttft_p99_ms"] is not None])


def _autoscale_charts(day: AutoscaleDay, data: Datasets, add: Callable[..., None]) -> None:
    long = [
        {"minute": r["minute"], "series": name, "replicas": r[col]}
        for r in day.replicas
        for name, col in (("live (serving)", "live"), ("provisioned (paid)", "provisioned"))
    ]
    replicas = (
        alt.Chart(data(long))
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("minute:Q", title="minutes since the first arrival"),
            y=alt.Y("replicas:Q", title="replicas"),
            color=alt.Color("series:N", title=None),
        )
    )
    load = (
        alt.Chart(data(day.load))
        .mark_area(opacity=0.2, color="gray")
        .encode(x="minute:Q", y=alt.Y("requests:Q", title="arrivals per minute"))
    )
    add(
        "autoscale_replicas",
        "Autoscaled replicas over the day against the load",
        "Step lines: replicas live (taking requests) and provisioned (paid: from the scale-up decision, "
        "through the start-up delay, to the end of a retiring replica's drain) at each minute; grey: "
        "arrivals per minute. cost charges the provisioned line's area.",
        alt.layer(load, replicas).resolve_scale(y="independent"),
    )
    add(
        "autoscale_ttft",
        "TTFT over the day (p99 of each minute's arrivals, ms)",
        "What the scale-up delay cost: TTFT (queueing included) p99 over the requests arriving in each "
        "minute, inverse CDF; a minute whose p99 is a request never served is left out.",
        alt.Chart(data(day.ttft))
        .mark_line(point=True)
        .encode(
            x=alt.X("minute:Q", title="minutes since the first arrival"),
            y=alt.Y("ttft_p99_ms:Q", title="TTFT p99 (ms)"),
        ),
    )


#: The fewest requests a bucket needs for each percentile to be shown: below 2 / 10 / 100, p50 /
#: p90 / p99 is one of the bucket's few largest values (with fewer than 100 requests the inverse-CDF
#: p99 is the maximum), so the report says "too few" instead of drawing it.
MIN_SAMPLES_FOR = {"p50": 2, "p90": 10, "p99": 100}


def enough_samples(n: int, percentile: str) -> bool:
    """Whether ``n`` requests are enough to show ``percentile`` (:data:`MIN_SAMPLES_FOR`)."""
    return n >= MIN_SAMPLES_FOR.get(percentile, 1)


def latency_bucket_table(rows: Rows) -> str:
    """Per bucket and metric: the request count (n) and p50 / p90 / p99 / mean in ms, a
    percentile its bucket is too small for said as 'too few (n < 100)'."""
    shown = []
    for r in rows:
        n = int(r.get("samples") or 0)
        row: dict[str, Any] = {"bucket": r["bucket"], "metric": str(r["metric"]).removesuffix("_s"), "n": n}
        for p in ("p50", "p90", "p99"):
            row[f"{p} (ms)"] = ms_cell(r.get(p)) if enough_samples(n, p) else f"too few (n < {MIN_SAMPLES_FOR[p]})"
        row["mean (ms)"] = ms_cell(r.get("mean"))
        shown.append(row)
    return _html_table(shown)


#: Latency summary columns shown in milliseconds (seconds in the query, the Parquet and the JSON).
LATENCY_COLUMNS = ("min", "p50", "p90", "p95", "p99", "p99_9", "max", "mean", "std")


def latency_table(rows: Rows) -> str:
    """A latency summary for people: the metric without its '_s', the sample count as n, each
    percentile, min / max / mean / std in ms ('(ms)' in the header), a percentile its sample is
    too small for said as 'too few' (:data:`MIN_SAMPLES_FOR`; p95 and p99.9 need 20 and 1,000)."""
    need = {**MIN_SAMPLES_FOR, "p95": 20, "p99_9": 1000}
    shown = []
    for r in rows:
        n = int(r.get("samples") or 0)
        row: dict[str, Any] = {k: v for k, v in r.items() if k not in ("samples", "metric", *LATENCY_COLUMNS)}
        row = {"metric": str(r.get("metric", "")).removesuffix("_s"), **row, "n": n}
        for k in LATENCY_COLUMNS:
            if k in r:
                label = f"{k.replace('_', '.')} (ms)"
                row[label] = f"too few (n < {need[k]:,})" if k in need and n < need[k] else ms_cell(r[k])
        shown.append(row)
    return _html_table(shown)


def load_curve_table(rows: Rows) -> str:
    """The load curve's points for people, sorted by traffic multiplier (the headroom search tries
    them in another order): requests, rejections, p50 / p99 TTFT and TPOT in ms, the verdict."""
    shown = []
    for r in sorted(rows, key=lambda r: float(r.get("multiplier") or 0.0)):
        row: dict[str, Any] = {"× today's load": f"{float(r['multiplier']):g}×", "status": r.get("status")}
        row |= {k: r.get(k) for k in ("requests", "finished", "rejected")}
        for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
            row[ms_header(k)] = ms_cell(r.get(k))
        passed = r.get("slo_passed")
        row["SLO"] = "n/a" if passed is None else f"{r.get('slo')} {'pass' if passed else 'FAIL'}"
        row["overloaded"] = r.get("overloaded")
        shown.append(row)
    return _html_table(shown)


def to_second(v: Any) -> Any:
    """An ISO time for people, rounded to the second, UTC: '2025-01-15 00:13:05' (the query keeps
    the microseconds); anything else as it is."""
    try:
        t = datetime.fromisoformat(str(v))
    except (TypeError, ValueError):
        return v
    if t.tzinfo is not None:
        t = t.astimezone(UTC).replace(tzinfo=None)
    return (t + timedelta(microseconds=500_000)).replace(microsecond=0).isoformat(sep=" ")


def time_axis(rows: Rows, key: str) -> alt.Axis:
    """A UTC time axis whose ticks fall on whole minutes, hours or days, at most about 12 of them
    over the rows' span (``key`` holds ISO times), given as explicit values: a 10-minute day gets
    one label a minute, not each label twice."""
    times = []
    for r in rows:
        with contextlib.suppress(TypeError, ValueError):
            t = datetime.fromisoformat(str(r[key]))
            times.append((t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp())
    if not times:
        return alt.Axis(format="%H:%M", labelOverlap=True)
    lo, hi = min(times), max(times)
    span_min = (hi - lo) / 60.0
    fmt = "%H:%M" if span_min <= 24 * 60 else "%b %d %H:%M"  # the date too once the span passes a day
    step_min = next((m for m in TICK_MINUTES if span_min / m <= 12), TICK_MINUTES[-1])
    step = step_min * 60.0
    first = math.ceil(lo / step) * step
    ticks = [first + i * step for i in range(int((hi - first) // step) + 1)] or [lo]
    fmt = "%Y-%m-%d" if step_min >= 1440 else fmt
    return alt.Axis(format=fmt, values=[t * 1000.0 for t in ticks], labelOverlap=True)


#: Tick spacings of a time axis, in minutes: 1, 2, 5, 10, 15, 30 min, 1, 2, 3, 6, 12 h, 1, 2, 7 days.
TICK_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;padding:0 12px;
color:#222}
h1{font-size:1.5em;margin-bottom:0}.sub{color:#666;margin-top:4px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:10px;margin:16px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:10px}.card b{display:block;font-size:1.3em}
.card span{color:#666;font-size:.85em}section{margin:28px 0}.def{color:#555;font-size:.9em}
.table-wrap{max-width:100%;overflow-x:auto;margin:6px 0}
table{border-collapse:collapse;font-size:.85em;max-width:100%}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f6f6f6;overflow-wrap:normal}td.num{text-align:right;white-space:nowrap;overflow-wrap:normal}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:.8em;white-space:pre-wrap;overflow-wrap:anywhere}
details summary{cursor:pointer;color:#555}
.alert{border:2px solid #c0392b;background:#fdecea;border-radius:6px;padding:8px 12px;margin:16px 0}
.alert li{margin:2px 0}.ok{border:1px solid #2e7d32;background:#edf7ed;border-radius:6px;padding:8px 12px}
.card.bad{border:2px solid #c0392b}.card.good{border:2px solid #2e7d32}.card.warn{border:2px solid #b7791f}
.note{border:1px solid #b7791f;background:#fff8e6;border-radius:6px;padding:8px 12px;margin:8px 0}
.nodata{border:1px dashed #bbb;padding:24px;color:#666;text-align:center}
"""


def health_headline(summary: dict[str, Any]) -> dict[str, Any]:
    """The headline's failure fields from a run's summary (config.json): counts, verdict,
    overload and the warnings, flat so the index and the nightly line can show them."""
    h = summary.get("health") or {}
    v = h.get("verdict") or {}
    over = h.get("overload") or {}
    cost = summary.get("cost_model") or {}
    return {
        "cost_model": cost,
        "source_band": summary.get("source_band"),
        "replay_recorded_input_tokens": summary.get("recorded_input_tokens"),
        "replay_cache_hit_tokens": summary.get("cache_hit_tokens"),
        "replay_fresh_input_tokens": summary.get("fresh_input_tokens"),
        "replayed_requests": h.get("requests"),
        "finished": h.get("finished"),
        "rejected": h.get("rejected"),
        "rejected_by_reason": h.get("rejected_by_reason") or {},
        "preempted_requests": h.get("preempted_requests"),
        "latency_covers": h.get("latency_covers"),
        "overloaded": bool(over.get("detected")),
        "overload": over,
        "slo": v.get("slo"),
        "slo_passed": v.get("passed") if v else None,
        "goodput": v.get("goodput") if v else None,
        "verdict": v or None,
        "warnings": list(h.get("warnings") or []),
    }


#: A day is flagged (the report's red banner, the index's failures column, the nightly's exit code
#: 3) when at least this share of the log rows of its files was quarantined; any quarantined or
#: duplicate row is still mentioned at the top of the report and on the nightly's line.
QUARANTINE_FLAG_SHARE = 0.01


def ingest_headline(rows: Rows, quarantine_dir: Path, date: str) -> dict[str, Any]:
    """The day's ingest row accounting (query ``ingest_accounting``: the files with requests on
    ``date``): rows read, stored, quarantined and dropped as duplicates, the quarantined share,
    whether it is flagged (:data:`QUARANTINE_FLAG_SHARE`) and one sentence saying where to look."""
    files = [r for r in rows if r.get("kind") == "file"]

    def total(col: str) -> int:
        return sum(int(r.get(col) or 0) for r in files)

    read, quarantined, duplicate = total("rows_read"), total("rows_quarantined"), total("rows_duplicate")
    share = quarantined / read if read else None
    bits = []
    if quarantined:
        bits.append(f"{quarantined:,} of {read:,} log rows ({share_text(share or 0.0)}) quarantined, not replayed")
    if duplicate:
        bits.append(f"{duplicate:,} duplicate log rows dropped")
    note = None
    if bits:
        # whole files: a file with requests on several days counts on each of them (its bad rows
        # may carry no date at all), so the sentence says whose rows these are
        whose = f"the {len(files):,} log file{'s' if len(files) != 1 else ''} with requests on {date}, all their days"
        note = (
            "; ".join(bits) + f" ({whose}): see {quarantine_dir} and `rooftrace query ingest_accounting --date {date}` "
            "(the report's Ingest accounting table)"
        )
    return {
        "ingest_rows_read": read,
        "ingest_rows_stored": total("rows_stored"),
        "ingest_rows_quarantined": quarantined,
        "ingest_rows_duplicate": duplicate,
        "quarantined_share": share,
        "quarantine_flagged": share is not None and share >= QUARANTINE_FLAG_SHARE,
        "ingest_note": note,
    }


#: The Cost table's figures per million tokens (query ``cost``).
_PER_MILLION = (
    "usd_per_million_recorded_input_tokens",
    "usd_per_million_fresh_input_tokens",
    "usd_per_million_output_tokens",
    "usd_per_million_tokens",
)


def _period_factor(row: dict[str, Any], period: Period) -> float | None:
    """How the ``cost`` query's span (first arrival to last finish) scales to ``period``."""
    span = row.get("span_s")
    if isinstance(span, int | float) and not isinstance(span, bool) and span > 0:
        return period.seconds / float(span)
    return None


def fleet_cost_row(rows: Rows) -> dict[str, Any]:
    """The query ``cost``'s row of the whole fleet: its one row, or for a fleet of pools (a row
    per pool) the pools' GPUs, $/day and $ over the span summed, the hardware as '1× h200 +
    2× h100-sxm', and $ per million tokens as the fleet's dollars over the fleet's tokens."""
    if len(rows) <= 1:
        return dict(rows[0]) if rows else {}

    def total(key: str) -> float | None:
        vals: list[Any] = [r.get(key) for r in rows]
        return None if any(v is None for v in vals) else math.fsum(float(v) for v in vals)

    out: dict[str, Any] = {k: rows[0].get(k) for k in ("span_s",)}
    out["gpus"] = total("gpus")
    out["gpus"] = int(out["gpus"]) if out["gpus"] is not None else None
    out["hardware"] = " + ".join(f"{r.get('gpus')}× {r.get('hardware')}" for r in rows)
    out["usd_per_day"], out["usd_span"] = total("usd_per_day"), total("usd_span")
    out["price_date"] = "; ".join(dict.fromkeys(str(r.get("price_date")) for r in rows))
    for key in _PER_MILLION:  # each pool's tokens: its dollars over its $ per million
        pairs: list[tuple[Any, Any]] = [(r.get("usd_span"), r.get(key)) for r in rows]
        if any(u is None or not v for u, v in pairs):
            out[key] = None
            continue
        tokens = math.fsum(float(u) / float(v) for u, v in pairs)
        out[key] = math.fsum(float(u) for u, _ in pairs) / tokens if tokens > 0 else None
    return out


def cost_period_headline(cost_rows: Rows, period: Period) -> dict[str, Any]:
    """The headline's $ figures over the one period `rooftrace cost` prices (:class:`Period`: the
    arrival span, or the makespan of a fleet that fell behind) and whether its unit costs are
    valid: the query ``cost`` spans first arrival to last finish, which is neither."""
    row = fleet_cost_row(cost_rows)
    per_m, factor = row.get("usd_per_million_tokens"), _period_factor(row, period)
    return {
        "usd_per_million_tokens": per_m * factor if per_m is not None and factor is not None else None,
        "cost_period_s": period.seconds,
        "cost_period_basis": period.basis,
        "cost_period_text": period.text,
        "arrival_span_s": period.arrival_span_s,
        "makespan_s": period.makespan_s,
        "unit_costs_valid": period.unit_costs_valid,
        "unit_costs_note": period.unit_costs_note,
        "unit_costs_flag": period.unit_costs_flag,
    }


def cost_table(rows: Rows, period: Period) -> Rows:
    """The Cost table (query ``cost``) over :class:`Period`, the period `rooftrace cost` prices,
    each $ per million tokens marked when the run's unit costs are not valid."""
    flag = period.unit_costs_flag
    out = []
    for r in rows:
        factor = _period_factor(r, period)
        gpus, price = r.get("gpus"), r.get("price_usd_per_gpu_hour")
        pooled = {"pool": r.get("pool")} if any(x.get("pool") for x in rows) else {}
        row = pooled | {k: r.get(k) for k in ("hardware", "replicas", "gpus", "price_usd_per_gpu_hour", "price_date")}
        row |= {
            "usd_per_day": r.get("usd_per_day"),
            "period": period.text,
            "period_s": period.seconds,
            "usd_period": gpus * price * period.seconds / 3600.0 if gpus is not None and price is not None else None,
        }
        for k in _PER_MILLION:
            v = r.get(k)
            v = v * factor if v is not None and factor is not None else None
            row[k] = f"{_fmt(v)} ({flag})" if flag and v is not None else v
        out.append(row)
    return out


def stale_headline(store: Store, day: str, config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Whether the store's requests of ``day`` are still the ones the run replayed: a date ingested
    again, or more of its logs ingested (and classified) after the run, leaves the run's figures
    beside the store's current ones. Compared by count (config.json's ``summary.requests``), then,
    for the same count, by the set of request ids. ``stale_note`` says so and what to do."""
    summary = config.get("summary") or {}
    ran = summary.get("requests")
    warm = summary.get("warmup_requests")
    if isinstance(ran, int) and isinstance(warm, int) and not isinstance(warm, bool):
        ran += warm  # a closed loop's warm-up requests were replayed too (left out of the summary's count)
    stored = store.stored_rows(day)
    out: dict[str, Any] = {"stale": False, "stale_note": None, "store_requests": stored}
    if not isinstance(ran, int) or isinstance(ran, bool):
        return out  # a run that did not record its count: nothing to compare
    if stored == ran:
        if not ran:
            return out
        try:
            mine = request_id_digest([run_dir / "requests.parquet"])
            theirs = request_id_digest(store.request_files(day))
        except (OSError, ValueError, KeyError, pa.ArrowException):
            return out  # unreadable ids: the count is all there is to go on
        if mine == theirs:
            return out
        what = (
            f"the store's {stored:,} requests of {day} are not the {ran:,} this run replayed "
            "(same count, other request ids)"
        )
    else:
        what = f"this run replayed {ran:,} requests of {day}; the store now holds {stored:,}"
    fleet = config.get("fleet_file") or "FLEET.toml"
    out["stale"] = True
    out["stale_note"] = (
        f"STALE: {what} (logs of {day} ingested after the run). The run's figures (Served, latency, "
        "overload, cost, the replay's charts) are of the requests it replayed; Log rows, Input tokens and the "
        f"token accounting are the store's now. Re-run `rooftrace replay --store {store.root} --date {day} "
        f"--fleet {fleet}` (with this run's options) and report the new run"
    )
    return out


def traffic_headline(latency_by: Rows, config: dict[str, Any]) -> dict[str, Any]:
    """Whose traffic this is: the models the logs named and the tenants, each with its finished
    requests (query ``latency_by``, the TTFT rows), and the model the fleet served them as."""

    def counts(dimension: str) -> list[tuple[str, int]]:
        rows = [r for r in latency_by if r["dimension"] == dimension and r["metric"] == "ttft_s"]
        return sorted(((str(r["bucket"]), int(r["samples"] or 0)) for r in rows), key=lambda c: (-c[1], c[0]))

    served = ((config.get("resolved") or {}).get("fleet") or {}).get("model")
    return {"traffic_models": counts("model"), "traffic_tenants": counts("tenant"), "served_model": served}


def _traffic_card(h: dict[str, Any]) -> tuple[str, str, str, str] | None:
    """The "Traffic" card: the models the logs name (as logged) and the model the fleet serves,
    the tenants and their finished requests; None for a headline without them."""
    models = [(str(m), int(n)) for m, n in h.get("traffic_models") or []]
    tenants = [(str(t), int(n)) for t, n in h.get("traffic_tenants") or [] if t != "(none)"]
    if not models:
        return None
    shown = ", ".join(f"{m} ({n:,})" for m, n in models[:3]) + (f", {len(models) - 3} more" if len(models) > 3 else "")
    note = f"logged as {shown}; served as {h.get('served_model') or '?'}"
    if tenants:
        note += "; tenants: " + ", ".join(f"{t} ({n:,})" for t, n in tenants[:4])
        note += f", {len(tenants) - 4} more" if len(tenants) > 4 else ""
    value = f"{len(models)} model{'s' if len(models) != 1 else ''} · " + (
        f"{len(tenants)} tenant{'s' if len(tenants) != 1 else ''}" if tenants else "no tenants logged"
    )
    return ("Traffic (finished requests)", value, note, "")


#: The KV memory table's columns renamed for people: the query's 'headroom' is the free share of
#: the KV cache, not the traffic headroom.
KV_NAMES = {"headroom": "kv_free_fraction"}


def classify_headline(store: Store, day: str) -> dict[str, Any]:
    """Whether the date's token accounting (classify) covers the store's requests of it now
    (:func:`pipeline.classify.freshness.classify_freshness`): ``classify_stale`` and the banner's
    first line, ``classify_stale_note``, with both counts."""
    fresh = classify_freshness(store, day)
    return {
        "classify_stale": fresh.stale,
        "classify_stale_note": fresh.note(store.root),
        "classified_requests": fresh.classified_requests,
        "store_requests": fresh.store_requests,
    }


def cache_split_headline(store: Store, day: str, config: dict[str, Any]) -> dict[str, Any]:
    """The run's fresh / cache-hit split against the classify the report's token figures come from
    (the day's, as it is now): ``cache_split_note`` is the banner's line when the two differ
    (pipeline.replay.run.cache_split_note; None when they agree, and for a run from before the split
    was recorded)."""
    split = (config.get("summary") or {}).get("cache_split")
    if not isinstance(split, dict):
        return {"cache_split_note": None}
    return {"cache_split_note": cache_split_note(split, classify_totals(store, day), config)}


def _seconds(x: float | None) -> str:
    return _fmt(x, "ms")


def target_phrase(t: dict[str, Any], h: dict[str, Any], seconds: Callable[[float], str] = format_seconds) -> str:
    """One SLO target's result for people. A target whose percentile over all requests is
    infinite (rejected or unfinished requests count as never served, and there are more of them
    than the percentile allows) says so, and gives the percentile of the finished requests:
    'ttft_p99 over all requests infinite > 1 ms (45 of 300 requests rejected, 15.0%, count as
    never served; p99 of the 255 finished 296 ms)'."""
    name, limit = str(t["target"]), float(t["limit_s"])
    if t.get("value_s") is not None:
        return f"{name} {seconds(float(t['value_s']))} {'<=' if t['met'] else '>'} {seconds(limit)}"
    total = int(h.get("replayed_requests") or 0)
    finished = int(h.get("finished") or 0)
    unserved = max(0, total - finished)
    who = "rejected" if int(h.get("rejected") or 0) == unserved else "rejected or unfinished"
    why = []
    if total:
        why.append(f"{unserved:,} of {total:,} requests {who}, {share_text(unserved / total)}, count as never served")
    fin = t.get("finished_value_s")
    if fin is not None:
        why.append(f"p{name.partition('_p')[2]} of the {finished:,} finished {seconds(float(fin))}")
    elif total and not finished:
        why.append("no request finished")
    return f"{name} over all requests infinite > {seconds(limit)}" + (f" ({'; '.join(why)})" if why else "")


def slo_phrase(h: dict[str, Any], seconds: Callable[[float], str] = format_seconds) -> str:
    """The SLO verdict in one line: 'SLO chat: FAIL: ttft_p99 ...; tpot_p99 ...; goodput 12.0%'."""
    v = h.get("verdict") or {}
    if not v:
        return ""
    parts = "; ".join(target_phrase(t, h, seconds) for t in v.get("targets", []))
    verdict = "PASS" if v.get("passed") else "FAIL"
    return f"SLO {v.get('slo')}: {verdict}: {parts}; goodput {float(v.get('goodput') or 0):.1%}"


def overload_phrase(over: dict[str, Any]) -> str:
    """Overload in one line (:func:`pipeline.replay.slo.overload_text`: a fleet that admitted nothing
    while requests kept arriving says so instead of an infinite percentage, and a backlog that
    drained says when)."""
    return overload_text(over)


def _restate(warning: str, h: dict[str, Any]) -> str:
    """A run's overload and SLO warnings said again from the headline's data (the run's own text
    said '+inf%' for a fleet that served nothing and 'ttft_p99 never > 1 ms' for a percentile
    made infinite by rejections; its latencies in ms, as the report prints them); any other
    warning as it is."""
    if warning.startswith("OVERLOADED") and h.get("overloaded"):
        return overload_phrase(h.get("overload") or {})
    v = h.get("verdict") or {}
    if v and warning.startswith(f"SLO {v.get('slo')}:"):
        return slo_phrase(h, _seconds)
    return warning


def attention(h: dict[str, Any]) -> list[str]:
    """Why a night needs someone to act, from its headline (empty: it does not): requests rejected,
    overload, a failed SLO, or a flagged share of quarantined log rows."""
    out = []
    if h.get("classify_stale"):
        out.append(
            f"STALE classify: it covers {int(h.get('classified_requests') or 0):,} requests of the date, the store "
            f"holds {int(h.get('store_requests') or 0):,} (re-run `rooftrace classify`)"
        )
    if h.get("stale"):
        ran, now = int(h.get("replayed_requests") or 0), int(h.get("store_requests") or 0)
        what = f"the store now holds {now:,} requests of the date" if ran != now else "the date's requests changed"
        out.append(f"STALE run: it replayed {ran:,}, {what} (re-run `rooftrace replay`)")
    if h.get("rejected"):
        out.append(f"{int(h['rejected']):,} requests rejected")
    if h.get("overloaded"):
        out.append("overloaded")
    if h.get("slo_passed") is False:
        out.append(f"SLO {h.get('slo')} failed")
    if h.get("quarantine_flagged"):
        out.append(f"{share_text(float(h.get('quarantined_share') or 0.0))} of log rows quarantined")
    if any(str(w).startswith("MODEL MIX") for w in h.get("warnings") or []):
        out.append("requests of other models replayed as the fleet's")
    if any(str(w).startswith(MULTI_NODE) for w in h.get("warnings") or []):
        out.append("replicas span nodes, priced as one (latencies optimistic)")
    return out


def cost_card(cost: dict[str, Any]) -> tuple[str, str, str, str] | None:
    """The "Priced by" card: which cost tier priced the run's steps, why, and how far that tier is
    known to be off (docs/validation.md); None for a run without the record."""
    tier = str(cost.get("source") or cost.get("tier") or "")
    gpu = str(cost.get("profile") or cost.get("hardware") or "")
    if tier == "measured":
        name, note = "measured profile", "operator tables measured under vLLM on this GPU"
    elif tier == "prior":
        stack = cost.get("stack")
        scaled = stack.get("scaled_from") if isinstance(stack, dict) else None
        if scaled and isinstance(stack, dict):
            name = f"same-die {scaled} tables, scaled"
            die = str(stack.get("die") or "")
            checked = (
                "held out on this die (H100 SXM and H200, each from the other, bandwidths 1.43x apart): bf16 "
                "steps 3-6 % median off"
                if die.upper() == "GH100"
                else "checked on the GH100 die only (H100 SXM and H200: bf16 steps 3-6 % median off); no profiled "
                f"pair on {die} to check it"
            )
            ratio = stack.get("bandwidth_ratio")
            if ratio:
                checked += f"; this GPU's memory bandwidth is {ratio}x {scaled}'s"
            note = (
                f"{cost.get('prior_reason') or 'no measured profile of this GPU'}: the measured tables of {scaled} "
                f"(same {die} die) scaled to this GPU's datasheet by the size-aware prior ({checked}) — not a "
                "measurement of this GPU"
            )
        else:
            name = "size-aware prior"
            note = (
                f"{cost.get('prior_reason') or 'no measured profile of this GPU'}: curves fitted on the profiled "
                "GPUs (held out by GPU, bf16 steps at tp <= 4 were 7-10 % median off) — a prior, not a measurement"
            )
        vendor = str(cost.get("vendor") or "nvidia")
        if vendor.lower() != "nvidia":
            note += f"; fitted on NVIDIA GPUs' CUDA kernels, never checked on {vendor}"
        parts = [str(p) for p in cost.get("roofline_parts") or []]
        if parts:
            note += f"; {' and '.join(parts)} priced by the plain roofline (no usable prior for them)"
    elif tier == "roofline":
        name = "plain roofline"
        calibrated = str(cost.get("calibrated_on") or "")
        if calibrated.startswith("the fleet's [calibration]"):
            note = f"efficiency factors from {calibrated}"
        else:
            note = "catalog efficiency factors, one per GPU (held out by GPU: steps ~13 % median off)"
    else:
        return None
    value = f"{name} ({gpu})" if gpu else name
    share = cost.get("prior_share_of_busy_time" if tier == "prior" else "measured_share_of_busy_time")
    if tier in ("measured", "prior") and isinstance(share, int | float):
        note += f"; {share:.0%} of busy time from its tables, the rest from the roofline's operators"
    if cost.get("factors_note"):
        note += f"; {cost['factors_note']}"
    stack = cost.get("stack")
    donor = stack.get("collectives_from") if isinstance(stack, dict) else None
    if donor and str(donor) in str(cost.get("allreduce") or ""):
        note += f"; all-reduce measured on {donor} (same NVLink)"
    return ("Priced by", value, note, "" if tier == "measured" else "warn")


def _health_cards(h: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(name, value, note, css class) of the cards a capacity planner reads first."""
    out = []
    stale = bool(h.get("stale"))
    if stale:  # first: every figure below is either the run's or the store's, not both
        ran, now = _fmt(h.get("replayed_requests")), _fmt(h.get("store_requests"))
        out.append(
            (
                "Run vs store",
                "STALE",
                f"the run replayed {ran} requests of its date, the store holds {now} now: re-run "
                "`rooftrace replay` (see the banner)",
                "bad",
            )
        )
    traffic = _traffic_card(h)
    if traffic is not None:
        out.append(traffic)
    card = cost_card(h.get("cost_model") or {})
    wide = next((str(w) for w in h.get("warnings") or [] if str(w).startswith(MULTI_NODE)), None)
    if card is not None and wide is not None:  # whatever the tier: its collectives are one node's
        name, value, note, _ = card
        spans = wide.removeprefix(MULTI_NODE).split(" (", 1)[0].strip()  # "each replica spans 2 nodes"
        card = (
            name,
            value,
            f"{note}; MULTI-NODE: {spans}, its cross-node communication priced as intra-node (latencies optimistic)",
            "warn",
        )
    if card is not None:
        out.append(card)
    total = h.get("replayed_requests")
    rej = h.get("rejected") or 0
    reasons = ", ".join(f"{k} {v:,}" for k, v in (h.get("rejected_by_reason") or {}).items())
    out.append(
        (
            "Served (this run)" if stale else "Served",
            f"{_fmt(h.get('finished'))} of {_fmt(total)}",
            (
                f"of the {_fmt(total)} requests the run replayed "
                f"(the store holds {_fmt(h.get('store_requests'))} now); "
                if stale
                else ""
            )
            + f"rejected {rej:,}"
            + (f" ({reasons})" if reasons else "")
            + f"; preempted {h.get('preempted_requests') or 0:,}",
            "bad" if rej else "good",
        )
    )
    observed = _observed_card(h)
    if observed is not None:
        out.append(observed)
    read = h.get("ingest_rows_read")
    if read:
        quarantined = int(h.get("ingest_rows_quarantined") or 0)
        out.append(
            (
                "Log rows (store now, not this run)" if stale else "Log rows",
                f"{int(h.get('ingest_rows_stored') or 0):,} of {read:,} stored",
                f"quarantined {quarantined:,} ({share_text(float(h.get('quarantined_share') or 0.0))}); "
                f"duplicates {int(h.get('ingest_rows_duplicate') or 0):,}; see Ingest accounting",
                "bad" if h.get("quarantine_flagged") else ("" if quarantined else "good"),
            )
        )
    if h.get("slo"):
        failing = [t for t in (h.get("verdict") or {}).get("targets", []) if not t["met"]]
        note = "; ".join(target_phrase(t, h, _seconds) for t in failing) or (
            "every target met (rejected requests count as misses)"
        )
        out.append(
            (
                f"SLO {h['slo']}",
                ("PASS" if h.get("slo_passed") else "FAIL") + f" · goodput {_fmt(h.get('goodput'), '%')}",
                note,
                "good" if h.get("slo_passed") else "bad",
            )
        )
    else:
        out.append(("SLO", "not set", "FLEET.toml [slo] or --slo chat gives a pass/fail verdict", ""))
    if h.get("headroom"):
        k = h.get("knee")
        out.append(
            (
                TRAFFIC_HEADROOM,
                ("not computed" if str(h["headroom"]).startswith("load curve: no point") else "fails today")
                if k is None
                else f"{k:g}× today's load",
                str(h["headroom"]),
                "bad" if k is None or k < 1.0 else "good",
            )
        )
    over = h.get("overload") or {}
    if over.get("detected"):
        excess = over.get("excess")
        since = f"from {over.get('from_utc') or '+' + _fmt(over.get('from_s'), 's')}"
        drained = over.get("until_s") is not None
        if drained:
            since += f" until {over.get('until_utc') or '+' + _fmt(over.get('until_s'), 's')}"
        if drained and excess is None and over.get("service_rate_per_s"):  # arrived at once
            what = f"a burst arrives at once, {_fmt(over.get('service_rate_per_s'))} req/s served"
        elif not over.get("service_rate_per_s"):  # arrivals / 0: no percentage, say it
            what = f"{_fmt(over.get('arrival_rate_per_s'))} req/s arrive and none is admitted " + (
                "while the queue grew" if drained else "before the last arrival"
            )
        else:
            what = f"arrivals exceed service by {_fmt(excess, '%') if excess is not None else 'n/a'}"
            what += " while the queue grew" if drained else ""
        waiting = (
            f"up to {int(over.get('peak_backlog_requests') or 0):,} waiting, {overload_from_dict(over).drained()}"
            if drained
            else f"{over.get('backlog_requests', 0):,} waiting"
        )
        out.append(("Overload", "OVERLOADED", f"{since}: {what}; {waiting}", "bad"))
    else:
        out.append(("Overload", "none", "the waiting queue never held a lasting backlog", "good"))
    return out


#: What the report calls the load curve's knee: a multiplier of the day's arrival rate (``plan``'s
#: "headroom" is SLO slack, another thing; docs/reports.md).
TRAFFIC_HEADROOM = "Traffic headroom (× today's load)"


def _observed_card(h: dict[str, Any]) -> tuple[str, str, str, str] | None:
    """The "Predicted vs observed" card: the day-level p50 errors against the logs' own latencies,
    red on drift (:data:`DRIFT_LIMIT`); None for a run not compared (no observed latency, a what-if)."""
    if not h.get("observed_compared"):
        return None
    if not h.get("observed_matched"):
        return ("Predicted vs observed", "no match", str(h.get("observed_note") or ""), "warn")
    value = " · ".join(f"p50 {label} {_signed(h.get(f'observed_{short}_p50_error'))}" for short, _, label in COMPARED)
    note = (
        f"replayed / observed − 1 over the {int(h.get('observed_matched') or 0):,} requests matched; drift limit "
        f"±{DRIFT_LIMIT:.0%} on the p50s; see Predicted vs observed"
    )
    if h.get("drift"):
        return ("Predicted vs observed", f"DRIFT: {value}", note, "bad")
    return ("Predicted vs observed", value, note, "good")


def _cards(h: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(name, value, note, css class) of the run's capacity figures."""
    kv_frac = None
    if h.get("peak_kv_bytes") is not None and h.get("kv_capacity_bytes"):
        kv_frac = h["peak_kv_bytes"] / h["kv_capacity_bytes"]
    cards: list[tuple[str, ...]] = [
        (
            "Peak fresh prefill",
            _fmt(h.get("peak_fresh_prefill_tokens_per_s_1s"), "tok/s"),
            f"1 s window; 1 min: {_fmt(h.get('peak_fresh_prefill_tokens_per_s_1min'), 'tok/s')}",
        ),
        (
            "Peak decode",
            _fmt(h.get("peak_decode_tokens_per_s_1s"), "tok/s"),
            f"1 s window; 1 min: {_fmt(h.get('peak_decode_tokens_per_s_1min'), 'tok/s')}",
        ),
        (
            "Peak KV vs capacity",
            _fmt(kv_frac, "%"),
            f"{_fmt((h.get('peak_kv_bytes') or 0) / 2**30, 'GiB')} of "
            f"{_fmt((h.get('kv_capacity_bytes') or 0) / 2**30, 'GiB')} (fullest replica)",
        ),
        (
            "p99 TTFT (finished requests)",
            _fmt(h.get("ttft_p99_s"), "ms"),
            f"p50 {_fmt(h.get('ttft_p50_s'), 'ms')} (first token − arrival); rejected requests have none; "
            + band_text(h),
        ),
        (
            "p99 TPOT (finished requests)",
            _fmt(h.get("tpot_p99_s"), "ms"),
            f"p50 {_fmt(h.get('tpot_p50_s'), 'ms')} ((e2e − ttft)/(out − 1); AIPerf calls it ITL)",
        ),
        ("GPUs", _fmt(h.get("gpus")), str(h.get("hardware") or "")),
        ("Fleet cost", _fmt(h.get("usd_per_day"), "$") + "/day", f"on-demand price of {h.get('price_date') or 'n/a'}"),
        _unit_cost_card(h),
        _input_card(h),
    ]
    return [(c[0], c[1], c[2], c[3] if len(c) > 3 else "") for c in cards]


def band_text(h: dict[str, Any]) -> str:
    """The TTFT card's band across measured sources (the run's ``source_band``): 'band across
    sources: p50 a - b ms, p99 c - d ms (aiconfigurator, llmservingsim)', or 'none' and why."""
    band = h.get("source_band")
    if not band:
        tier = (h.get("cost_model") or {}).get("source")
        return "band across measured sources: none" + (
            " (one source covers this GPU)" if tier == "measured" else f" ({tier or 'roofline'} tier)"
        )
    ttft = band.get("ttft_s") or {}
    parts = [f"{p} {_fmt(ttft[p][0], 'ms')} – {_fmt(ttft[p][1], 'ms')}" for p in ("p50", "p99") if ttft.get(p)]
    names = ", ".join(str(x.get("source")) for x in band.get("sources", []))
    return f"band across measured sources: {', '.join(parts)} ({names}; chosen {band.get('chosen')})"


def _input_card(h: dict[str, Any]) -> tuple[str, str, str, str]:
    """The "Input tokens" card: classify's recorded / fresh split and the replay's; red, with both
    counts, when classify's accounting predates some of the date's requests."""
    stale = bool(h.get("stale"))
    note = (
        f"fresh (prefill): {_fmt(h.get('classify_fresh_input_tokens'))} by classify"
        + (f" over the {_fmt(h.get('classify_requests'))} requests classified now" if stale else "")
        + f", {_fmt(h.get('replay_fresh_input_tokens'))} as this fleet replayed them (finished requests"
        + (" of this run" if stale else "")
        + "; see 'Two cache models')"
    )
    if h.get("classify_stale"):
        return (
            "Input tokens (STALE classify)",
            _fmt(h.get("classify_recorded_input_tokens")) + " recorded",
            f"of the {_fmt(h.get('classified_requests'))} requests classify saw; the store holds "
            f"{_fmt(h.get('store_requests'))} of the date now (see the banner); {note}",
            "bad",
        )
    recorded = _fmt(h.get("classify_recorded_input_tokens")) + " recorded"
    return ("Input tokens (store now)" if stale else "Input tokens", recorded, note, "")


def _unit_cost_card(h: dict[str, Any]) -> tuple[str, str, str, str]:
    """The "$ per million tokens" card, over the period `cost` prices (the makespan of a fleet
    that fell behind) and marked not valid for such a run."""
    value = _fmt(h.get("usd_per_million_tokens"), "$")
    note = f"input + output, over {h.get('cost_period_text') or 'the replay span'}"
    if h.get("unit_costs_note"):
        return (
            "$ per million tokens",
            f"{value} ({h.get('unit_costs_flag')})",
            f"{note}; {h['unit_costs_note']}",
            "bad",
        )
    return ("$ per million tokens", value, note, "")


#: The page templates (jinja2, autoescaped: every value from a log or a config is escaped by the
#: template engine; parts already rendered are passed as Markup).
TEMPLATES = Path(__file__).with_name("templates")


@functools.cache
def templates() -> jinja2.Environment:
    """The report's and the index's jinja2 environment (pipeline/publish/templates), autoescaping on."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
    )


def render(name: str, **values: Any) -> Markup:
    """A template of pipeline/publish/templates rendered with ``values`` (autoescaped)."""
    return Markup(templates().get_template(name).render(**values))


def fragment(name: str) -> Callable[..., Markup]:
    """A macro of pipeline/publish/templates/fragments.html.j2 (a paragraph, a box, a section, ...)."""
    macro: Callable[..., Markup] = getattr(templates().get_template("fragments.html.j2").module, name)
    return macro


def ms_header(column: str) -> str:
    """A latency column's header for people: 'ttft_p99_s' -> 'ttft_p99 (ms)', 'p50' -> 'p50 (ms)'."""
    return f"{column.removesuffix('_s')} (ms)"


def ms_cell(v: Any) -> str:
    """A latency cell under an '(ms)' header: seconds in, milliseconds out, 3 significant digits
    (thousands separators from 100 ms up), no unit (the header has it)."""
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return plain_number(float(v) * 1000.0, 3)
    return _cell(v)


def _html_table(rows: Rows, limit: int = 200, ms: tuple[str, ...] = ()) -> str:
    """A table of ``rows`` (the first row's keys are the columns); the columns in ``ms`` are
    latencies in seconds, shown in milliseconds with '(ms)' in their header."""
    if not rows:
        return render("table.html.j2", columns=[], rows=[], more=0)
    cols = list(rows[0])

    def cell(v: Any, c: str) -> tuple[str, bool]:  # (text, is a number: right-aligned, never broken)
        number = isinstance(v, int | float) and not isinstance(v, bool)
        return (ms_cell(v) if c in ms else _cell(v)), number or NUMBER_TEXT.fullmatch(str(v or "")) is not None

    return render(
        "table.html.j2",
        # a long snake_case header may break after its underscores (a zero-width space), not mid-word
        columns=[(ms_header(c) if c in ms else str(c)).replace("_", "_\u200b") for c in cols],
        rows=[[cell(r[c], c) for c in cols] for r in rows[:limit]],
        more=max(0, len(rows) - limit),
    )


#: A cell that reads as a number ('1,234', '12.5', '-3%'): right-aligned, never broken across lines.
NUMBER_TEXT = re.compile(r"[-+]?[\d,]+(\.\d+)?\s?[%×]?")


def _cell(v: Any) -> str:
    """A table cell for people: '' for missing, thousands separators, no scientific notation."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return _fmt(v)
    return str(v)


#: The report's title of the full cost stack (docs/economics.md, "Cost stack").
COST_STACK_TITLE = "Cost stack (US$; each line as `rooftrace cost` stated it)"
REPLACEMENT_TITLE = "Replacement cost and break-even volume"


def _cost_json(store: Store, run_id: str) -> dict[str, Any] | None:
    """``STORE/costs/<run_id>/cost.json`` as `rooftrace cost` wrote it (None: not written, or not
    a cost document this version reads: the section then says to run `cost`)."""
    path = store.cost_dir(run_id) / "cost.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def cost_stack_sections(doc: Mapping[str, Any] | None, run_id: str) -> list[tuple[str, str]]:
    """The full cost's lines (every one, none folded into another) and, per alternative, its blended
    $ per million tokens and the break-even daily volume, from `rooftrace cost`'s cost.json."""
    stack = doc.get("cost_stack") if doc else None
    if not isinstance(stack, dict) or not isinstance(stack.get("lines"), list):
        note = f"`rooftrace cost --run {run_id}` has not written this run's cost stack yet."
        return [(COST_STACK_TITLE, fragment("para")(note, "note"))]
    found = stack.get("inputs")
    inputs: dict[str, Any] = found if isinstance(found, dict) else {}
    keep = ("line", "basis", "usd", "usd_per_day")
    rows = [{k: line.get(k) for k in keep} for line in stack["lines"] if isinstance(line, dict)]
    rows.append({"line": "total", "basis": "", "usd": stack.get("total_usd"), "usd_per_day": stack.get("usd_per_day")})
    read = (doc or {}).get("cost_inputs_file") or "no fleet file read"
    purchase = inputs.get("purchase", "on_demand")
    said = fragment("para")(
        f"Inputs from {inputs.get('origin', 'defaults')} ({read}); purchase model {purchase}.",
        "note",
    )
    out: list[tuple[str, str]] = [(COST_STACK_TITLE, said + _html_table(rows))]
    replacement = (doc or {}).get("replacement")
    if isinstance(replacement, list) and replacement:
        cols = (
            "provider",
            "api_model",
            "kind",
            "same_model",
            "price_date",
            "blended_usd_per_million_tokens",
            "self_host_blended_usd_per_million_tokens",
            "break_even_tokens_per_day",
            "break_even_to_day_volume",
        )
        table = [{c: r.get(c) for c in cols} for r in replacement if isinstance(r, dict)]
        formula = fragment("para")(
            "Break-even V* = F / p x 10^6 tokens a day: F the self-hosted fleet's full cost a day (the stack's "
            "total), p the alternative's blended $ per million tokens over this traffic's own token mix; above V* "
            "the fixed fleet is cheaper, as long as it still meets the SLO at that volume.",
            "note",
        )
        flagged = (doc or {}).get("unit_costs_note")
        if isinstance(flagged, str) and flagged:  # a run that fell behind: its blended prices and V* are not valid
            formula += fragment("para")(flagged, "note")
        out.append((REPLACEMENT_TITLE, formula + _html_table(table)))
    return out


def _economics_sections(
    session: Session, run_id: str, charts: list[Chart], date: str, model: str | None, period: Period | None = None
) -> list[tuple[str, str]]:
    """API-equivalent cost and the GPU cost split of this run (written by `rooftrace cost`, which
    the nightly job runs), and the latest capacity plan (`rooftrace plan`) when there is one.
    Over ``period`` (the one `cost` prices): rows that `cost` wrote over another period are said
    so, and the $ per token and self-host / API ratios of a run that fell behind are marked."""
    data = Datasets()
    out: list[tuple[str, str]] = []
    flag = period.unit_costs_flag if period is not None else None

    def marked(v: Any) -> Any:
        return f"{_fmt(v)} ({flag})" if flag and v is not None else v

    api = _rows(session.query("api_cost", {"subject": run_id}))
    if api:
        written = float(api[0]["period_s"])
        same = period is None or math.isclose(written, period.seconds, rel_tol=1e-6, abs_tol=1e-6)
        label = period.text if period is not None and same else traffic_span(written)
        older = (
            ""
            if same or period is None
            else fragment("para")(
                f"These rows were written by `rooftrace cost` over {traffic_span(written)}, not the "
                f"{period.text} this page prices: run `rooftrace cost --run {run_id}` again and report the run again.",
                "note",
            )
        )
        if period is not None and period.unit_costs_note:
            older += fragment("para")(period.unit_costs_note, "note")
        bars = [
            {"what": f"{r['provider']} {r['api_model']}", "usd": r["api_usd"], "kind": "API list price"} for r in api
        ] + [{"what": "self-hosted fleet", "usd": api[0]["self_host_usd"], "kind": "self-hosted"}]
        spec = data.spec(
            alt.Chart(data(bars))
            .mark_bar()
            .encode(
                y=alt.Y("what:N", title=None, sort="x"),
                x=alt.X("usd:Q", title=f"US$ over {label}"),
                color=alt.Color("kind:N", title=None),
            )
            .properties(width=640)
        )
        charts.append(
            Chart(
                "api_cost",
                "API-equivalent cost vs the self-hosted fleet (US$ over "
                + (period.day_projection if period is not None and same else day_projection(written))
                + ")",
                "API: fresh input at the input price, cache hits at the cached-input price, cache writes "
                "and output at theirs (dated price tables); self-hosted: GPU-hours x $/GPU-hour.",
                spec,
            )
        )
        keep: tuple[str, ...] = (
            "provider",
            "api_model",
            "price_date",
            "api_usd",
            "self_host_usd",
            "self_host_to_api_ratio",
        )
        table = [
            {k: r[k] for k in keep}
            | {
                "price_date": f"{r['price_date']} (STALE: checked over {STALE_AFTER_DAYS} days ago)"
                if r.get("price_stale")
                else r["price_date"],
                "self_host_to_api_ratio": marked(r["self_host_to_api_ratio"]),
            }
            for r in api
        ]
        out.append((f"API-equivalent cost (US$ over {label})", older + _html_table(table)))
    split = _rows(session.query("api_cost_gpu_split", {"subject": run_id}))
    if split:
        keep = ("token_class", "tokens", "busy_share", "busy_usd", "all_in_usd", "all_in_usd_per_million_tokens")
        rows = [
            {k: r[k] for k in keep} | {"all_in_usd_per_million_tokens": marked(r["all_in_usd_per_million_tokens"])}
            for r in split
        ]
        out.append(("GPU cost by token class (US$)", _html_table(rows)))
    # only a plan made for this report's own traffic (its date and model)
    plan = _rows(session.query("plan", {"date": date, "model": model}))
    if plan:
        points = [
            {
                "config": r["config"],
                "usd_per_day": r["usd_per_day"],
                "ttft_p99_ms": r["ttft_p99_s"] * 1000,
                "pareto": r["pareto"],
            }
            for r in plan
            if r["usd_per_day"] is not None and r["ttft_p99_s"] is not None
        ]
        if points:
            spec = data.spec(
                alt.Chart(data(points))
                .mark_point(filled=True, size=90)
                .encode(
                    x=alt.X("usd_per_day:Q", title="fleet $/day"),
                    y=alt.Y("ttft_p99_ms:Q", title="p99 TTFT (ms)"),
                    color=alt.Color("pareto:N", title="Pareto front"),
                    tooltip=["config:N", "usd_per_day:Q", alt.Tooltip("ttft_p99_ms:Q", format=".3~r")],
                )
                .properties(width=640)
            )
            charts.append(
                Chart(
                    "plan_pareto",
                    f"Capacity plan {plan[0]['plan_id']}: cost vs p99 TTFT of each configuration",
                    "Each point is the minimum replica count of one hardware x TP x precision that meets the "
                    f"SLO ({plan[0]['slo']}) on the replayed window; Pareto points are not beaten on both axes.",
                    spec,
                )
            )
        keep = ("rank", "config", "gpus", "replicas", "ttft_p99_s", "tpot_p99_s", "binding", "usd_per_day", "note")
        plan_rows = [{k: r[k] for k in keep} for r in plan]
        out.append(("Capacity plan (cheapest first)", _html_table(plan_rows, ms=("ttft_p99_s", "tpot_p99_s"))))
    return out


INGEST_TITLE = "Ingest accounting"
INGEST_ANCHOR = "ingest-accounting"


def render_html(
    title: str,
    subtitle: str,
    headline: dict[str, Any],
    charts: list[Chart],
    extra_sections: list[tuple[str, str]],
    bundle: str,
    charts_note: str | None = None,
    lead: str = "",
    config: dict[str, Any] | None = None,
) -> str:
    """The page (pipeline/publish/templates/report.html.j2, autoescaped). ``charts_note``: why the charts
    cannot be drawn (:func:`charts_blocked`), said in each chart's place instead of it. ``lead``:
    sections shown right below the cards, before the charts (the "Predicted vs observed"
    section); an ``inline`` chart's place is in it. ``config``: the run's config.json, shown
    collapsed at the end, the TOML files it names as text."""
    cards = [
        {"name": name, "value": value, "note": note, "cls": cls}
        for name, value, note, cls in [*_health_cards(headline), *_cards(headline)]
    ]
    failures: list[Any] = [str(w) for w in headline.get("warnings") or []]
    if headline.get("unit_costs_note"):  # beside the OVERLOADED line: its $ per token are not valid
        failures.append(str(headline["unit_costs_note"]))
    stale = headline.get("stale_note")
    stale_classify = headline.get("classify_stale_note")
    # the replay's fresh / cache-hit split is not the token figures' (said by STALE classify already)
    split = None if stale_classify else headline.get("cache_split_note")
    # first: what the figures below are of (the store changed since classify or the replay ran, or
    # the replay split the day's input otherwise)
    warnings: list[Any] = [str(n) for n in (stale_classify, stale, split) if n]
    warnings += failures
    drift = headline.get("drift_note")
    if drift:  # the replay is off the real fleet's own latencies: its figures are in question
        warnings.append(render("link.html.j2", text=str(drift), href=f"#{OBSERVED_ANCHOR}", label="(section)"))
    note = headline.get("ingest_note")
    ingest = render("link.html.j2", text=str(note), href=f"#{INGEST_ANCHOR}", label="(table)") if note else ""
    if note and (headline.get("quarantine_flagged") or warnings):  # said in the banner when it has one
        warnings.append(ingest)
    heading = (
        "This report's token accounting is STALE: classify ran before some of its date's requests were ingested"
        if stale_classify
        else "This run has failures"
        if failures
        else "This run is STALE: its date's requests changed in the store since it ran"
        if stale
        else "This run replayed another fresh / cache-hit split than the token figures below"
        if split
        else "The replay has drifted from the latencies the real fleet delivered"
        if drift
        else "This day's logs need attention"
    )
    ok = (
        f"Every {'replayed ' if note else ''}request finished, no overload"
        + (", every SLO target met" if headline.get("slo_passed") else "")
        + "."
    )

    def place(c: Chart) -> Markup:
        if c.empty:
            return render("place.html.j2", kind="nodata", key=c.key, text=c.empty)
        if charts_note:
            return render("place.html.j2", kind="nochart", key=c.key, text=charts_note)
        return render("place.html.j2", kind="chart", key=c.key, text="")

    for c in charts:
        if c.inline:
            lead = lead.replace(str(render("place.html.j2", kind="chart", key=c.key, text="")), str(place(c)))
    specs = {} if charts_note else {f"chart-{c.key}": c.spec for c in charts if not c.empty}
    return str(
        render(
            "report.html.j2",
            title=title,
            subtitle=subtitle,
            css=Markup(_CSS),
            bundle=Markup(bundle.replace("</script", "<\\/script")),
            banner={"heading": heading, "lines": warnings, "ok": ok, "note": ingest},
            cards=cards,
            lead=Markup(lead),
            charts=[
                {"title": c.title, "definition": c.definition, "place": place(c), "after": Markup(c.after)}
                for c in charts
                if not c.inline
            ],
            extra=[
                {"title": t, "body": Markup(body), "id": INGEST_ANCHOR if t.startswith(INGEST_TITLE) else ""}
                for t, body in extra_sections
            ],
            tomls=config_tomls(config or {}),
            config_json=json.dumps(config or {}, indent=2, sort_keys=True, default=str),
            specs=Markup(_script_json(specs)),
        )
    )


def config_tomls(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The TOML files a run's config.json holds as text (a fleet's own file, a calibration),
    each as (where in config.json, the text), to show as preformatted text rather than one
    escaped JSON string."""
    out: list[tuple[str, str]] = []

    def walk(v: Any, path: str) -> None:
        if isinstance(v, dict):
            for k in sorted(v):
                walk(v[k], f"{path}.{k}" if path else str(k))
        elif isinstance(v, str) and "\n" in v and ("=" in v or "[" in v):
            out.append((path, v))

    walk(config, "")
    return out


def _classified(store: Store, day: str) -> dict[str, Any]:
    """What classify recorded for ``day`` (block size, capacity, requests and where their hits came
    from); empty before classify."""
    totals = classify_totals(store, day)
    if totals is None:
        return {}
    return {k: totals.get(k) for k in ("block_size_tokens", "capacity", "requests", "cache_hit_source")}


def _two_caches(h: dict[str, Any], config: dict[str, Any], classified: dict[str, Any]) -> str:
    """Why the report has two fresh-token figures, side by side: which cache produced each
    column, its block size and the prefix identity both cut their blocks from."""
    sched = config.get("resolved", {}).get("scheduler", {})
    iso = ", ".join((config.get("options") or {}).get("isolation") or []) or "none"
    cap = classified.get("capacity") or "unbounded"
    by_cls = classified.get("cache_hit_source") or {}
    n_reported = int((by_cls.get("reported") or {}).get("requests") or 0)
    split = (config.get("summary") or {}).get("cache_split") or {}
    n_served = int(((split.get("by_source") or {}).get("reported") or {}).get("requests") or 0)
    n_all = int(classified.get("requests") or 0)
    cls_cache = f"one prefix cache per model over the whole day ({cap}), touched at arrival, in arrival order"
    rep_cache = (
        f"each replica's engine KV cache: {sched.get('num_gpu_blocks', '?')} blocks, LRU, "
        "hit at admission, only on the replica the router chose"
    )
    if n_reported:
        rest = f"; the other requests: {cls_cache}" if n_reported < n_all else ""
        cls_cache = f"the log's reported cache hits ({n_reported:,} requests){rest}"
    if n_served:
        rest = f"; the other requests: {rep_cache}" if n_served < n_all else ""
        rep_cache = f"the log's reported cache hits, their prefill skipped ({n_served:,} requests){rest}"
    kv = (config.get("summary") or {}).get("kv_offload")
    if isinstance(kv, dict):  # FLEET.toml [kv_offload]: the lower tiers below the engine's cache, per tier
        rep_cache = f"{rep_cache}; below it, the fleet's {offload_line(kv)}"
    rows = [
        {
            "figure": "classify (rooftrace classify)" + ("; the store now" if h.get("stale") else ""),
            "cache": cls_cache,
            "block size": classified.get("block_size_tokens"),
            "requests": h.get("classify_requests", h.get("requests")),
            "recorded input": h.get("classify_recorded_input_tokens"),
            "cache-hit": h.get("classify_cache_hit_tokens"),
            "fresh": h.get("classify_fresh_input_tokens"),
        },
        {
            "figure": "replay (this fleet)" + ("; this run" if h.get("stale") else ""),
            "cache": rep_cache,
            "block size": sched.get("block_size"),
            "requests": h.get("finished"),
            "recorded input": h.get("replay_recorded_input_tokens"),
            "cache-hit": h.get("replay_cache_hit_tokens"),
            "fresh": h.get("replay_fresh_input_tokens"),
        },
    ]
    note = fragment("para")(
        "Classify measures what the traffic could reuse (its cache sees every request of the "
        "day on one model); the replay measures what this fleet reuses (a request hits only blocks still "
        "cached on the replica it was routed to, and rejected requests are not counted). Both cut their blocks "
        f"from one prefix identity (isolation key: {iso}), so they agree on what is shared. Where the log "
        "reports a request's cache hits (cached_tokens and its kin), both take the report: the replay skips "
        "exactly that prefill and holds those tokens' KV blocks. The "
        "token-accounting chart uses classify's; cost and prefill load use the replay's.",
        "def",
    )
    return note + _html_table([{k: (_fmt(v) if isinstance(v, int | float) else v) for k, v in r.items()} for r in rows])


#: A report folder names the store it was made from, so that another store's report for the same
#: date and fleet is refused instead of silently overwritten.
STORE_MARKER = ".rooftrace-store"


def report_path(reports_dir: Path, date: str, fleet: str) -> Path:
    """``reports/<date>/<fleet>/index.html``: two fleets replayed on one date keep both reports.
    Both parts come from a run's config.json: checked, and confined to ``reports_dir``."""
    return confined(confined(reports_dir, check_date(date), "report date"), fleet, "fleet name") / "index.html"


def claim_report_dir(folder: Path, store: Store) -> None:
    """Refuse to write into a report folder made from another store; mark it as this store's."""
    mine = str(store.root.resolve())
    marker = folder / STORE_MARKER
    try:
        theirs = marker.read_text().strip() if marker.is_file() else None
    except OSError:
        theirs = None
    if theirs is not None and theirs != mine:
        raise RooftraceError(
            f"{folder} holds the report made from store {theirs}; refusing to overwrite it with one from "
            f"{mine} (use another --reports folder or --out)"
        )
    if theirs is None:
        try:
            atomic_write_bytes(marker, (mine + "\n").encode())
        except OSError as exc:
            raise RooftraceError(f"cannot create reports folder {folder}: {os_write_reason(marker, exc)}") from None


#: Where the report of a what-if run goes, beside the nightly's: reports/<date>/<fleet>/what-if/<run_id>/.
WHAT_IF_DIR = "what-if"


def what_if_options(config: dict[str, Any]) -> dict[str, Any]:
    """The replay options of a run that a nightly never sets (``--rate-scale`` other than 1,
    ``--replicas``, ``--concurrency``, ``--offline``): empty for a run like the nightly's."""
    o = config.get("options") or {}
    out: dict[str, Any] = {}
    rate = o.get("rate_scale")
    open_loop = not o.get("offline") and o.get("concurrency") is None
    # a closed loop or an offline batch ignores the arrivals' rate (runs from before that pairing
    # was refused can still record one): not shown as a what-if there
    if open_loop and isinstance(rate, int | float) and not isinstance(rate, bool) and float(rate) != 1.0:
        out["rate_scale"] = rate
    for key in ("replicas", "concurrency"):
        if o.get(key) is not None:
            out[key] = o[key]
    if o.get("offline"):
        out["offline"] = True
    return out


def options_text(options: dict[str, Any]) -> str:
    """What-if options for people: 'rate scale 1,000,000,000,000, replicas 1' (never scientific
    notation; a factor past 10^15 as its power of ten)."""

    def value(v: Any) -> str:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return str(v)
        x = float(v)
        if not math.isfinite(x):
            return "n/a"
        if abs(x) >= 1e15:
            return f"about 10^{math.floor(math.log10(abs(x)))}"
        return f"{int(x):,}" if x == int(x) else plain_number(x)

    return ", ".join(k.replace("_", " ") + ("" if v is True else f" {value(v)}") for k, v in options.items())


def _published(folder: Path) -> dict[str, Any]:
    """The headline.json of a report folder ({} when none or unreadable)."""
    try:
        doc = json.loads((folder / "headline.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _report_target(
    reports_dir: Path, day: str, fleet_name: str, run_id: str, config: dict[str, Any], nightly: bool
) -> tuple[Path, str | None, bool]:
    """Where a run's report goes in the reports tree, and why when it is not the date's and
    fleet's own folder. The nightly's run always goes to reports/<date>/<fleet>/. Any other run
    goes there too unless it is a what-if (:func:`what_if_options`, or the nightly's own run
    judged since against another SLO) or that folder holds a nightly's report of another run:
    then to .../what-if/<run_id>/, and the nightly's is kept.
    The last item: whether the report is (still) the nightly's."""
    canonical = report_path(reports_dir, day, fleet_name)
    if nightly:
        return canonical, None, True
    options = what_if_options(config)
    there = _published(canonical.parent)
    by_nightly = there.get("published_by") == "nightly"
    verdict = ((config.get("summary") or {}).get("health") or {}).get("verdict") or {}
    if by_nightly and there.get("run_id") == run_id and verdict.get("slo") != there.get("slo"):
        # the nightly's own run re-judged by `replay --slo` (the SLO is not part of the run id)
        options = {**options, "slo": verdict.get("slo") or "none"}
    if not options and not (by_nightly and there.get("run_id") != run_id):
        return canonical, None, by_nightly  # a refresh of the nightly's own report stays the nightly's
    why = f"what-if run ({options_text(options)})" if options else f"not the nightly's run ({there.get('run_id')})"
    out = confined(canonical.parent / WHAT_IF_DIR, run_id, "run id") / "index.html"
    return out, f"{why}: written beside the date's report {canonical}, which is kept", False


def _finished_percentiles(session: Session, run_id: str, verdict: dict[str, Any] | None) -> dict[str, Any] | None:
    """The verdict with each target's percentile over the finished requests added
    (``finished_value_s``): what the finished requests achieved when rejections make the
    percentile over all requests infinite. A copy: the run's config is not changed."""
    if not verdict:
        return verdict
    targets = []
    for t in verdict.get("targets") or []:
        t = dict(t)
        metric, _, pct = str(t.get("target")).partition("_p")
        try:
            fraction = float(pct) / 100.0
        except ValueError:
            fraction = math.nan
        if metric in METRICS and 0 < fraction < 1:
            col = f"{metric}_s"
            row = session.con.execute(
                f"SELECT quantile_disc({col}, ?) FROM replay_requests "  # col: one of METRICS, not data
                f"WHERE run_id = ? AND status = 'finished' AND isfinite({col})",
                [fraction, run_id],
            ).fetchone()
            t["finished_value_s"] = None if row is None or row[0] is None else float(row[0])
        targets.append(t)
    return {**verdict, "targets": targets}


def _check_out(out: Path) -> None:
    """``--out`` names a file that may be replaced (before any work: never over a named pipe, a
    device or a folder), and has a name at all (``--out ''`` is the current folder)."""
    if str(out) == "-":
        raise RooftraceError(
            "--out -: the report cannot go to standard output (it is an HTML page with headline.json beside "
            "it); give the HTML file to write, e.g. --out report.html"
        )
    if out.name in ("", ".", ".."):
        raise RooftraceError(
            f"--out {str(out)!r} is empty or a folder, not a file name; give the HTML file to write, e.g. "
            "--out report.html"
        )
    if out.name.casefold() == "headline.json":
        raise RooftraceError(
            f"--out {out}: headline.json is the file written beside the report, so the page would be replaced "
            "by it; give the HTML file another name, e.g. --out report.html"
        )
    for parent in reversed(out.parents):
        try:
            if parent.exists() and not parent.is_dir():
                raise RooftraceError(f"--out {out}: {parent} is a file, not a folder")
        except OSError:
            break  # (unreadable: the write says why)
    for target in (out, out.with_name("headline.json")):
        try:
            check_replaceable(target)
        except OSError as exc:
            raise RooftraceError(f"--out {out}: {target} {exc.strerror}") from None


def _check_png_dir(png_dir: Path) -> None:
    """``--png DIR`` names a folder, or where one can be made, before any work (a device or a file
    failed only after the page and headline.json were written)."""
    for folder in (png_dir, *png_dir.parents):
        try:
            if not folder.exists():
                continue
            if not folder.is_dir():
                what = not_regular(folder) or "a file"
                raise RooftraceError(f"--png {png_dir}: {folder} is {what}, not a folder; give a folder for the PNGs")
        except OSError:
            return  # (unreadable: the write says why)
        return


def _write_pngs(charts: list[Chart], png_dir: Path, pngs: list[Path], skipped: list[str]) -> None:
    """Each chart with data as PNG; a chart with nothing to draw, or one vl-convert cannot draw,
    is named in ``skipped`` (with why) rather than failing the report; where vl-convert cannot
    start (:func:`charts_blocked`), none is drawn and ``skipped`` says why once."""
    if charts_blocked() is not None and any(not c.empty for c in charts):
        skipped.append("every chart: the address-space limit (ulimit -v) is too small for vl-convert")
        return
    for c in charts:
        if c.empty:
            skipped.append(f"{c.key}: {c.empty.rstrip('.')}")
            continue
        try:
            data = vlc.vegalite_to_png(c.spec, scale=1.5)
        except ValueError as exc:
            lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
            skipped.append(f"{c.key}: {lines[-1] if lines else type(exc).__name__}")
            continue
        target = png_dir / f"{c.key}.png"
        try:
            atomic_write_bytes(target, data)
        except OSError as exc:
            raise RooftraceError(f"cannot write {target}: {os_write_reason(target, exc)}") from None
        pngs.append(target)


#: The files every finished replay run holds (pipeline/replay/run.py); a report from fewer would show
#: made-up zeros ("no overload", "0 GiB").
RUN_FILES = ("requests.parquet", "steps.parquet", "series.parquet")


def _check_run_files(run_dir: Path, run_id: str) -> None:
    """Refuse a run that is missing one of :data:`RUN_FILES` or holds a damaged one."""
    for name in RUN_FILES:
        path = run_dir / name
        if not path.exists():
            raise RooftraceError(f"{path}: run {run_id} is incomplete: {name} is missing (re-run `rooftrace replay`)")
        check_parquet(path)


def _make_reports_dir(reports_dir: Path) -> None:
    """Create the reports folder (before any work), or one line saying why it cannot be."""
    try:
        reports_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RooftraceError(
            f"cannot create reports folder {reports_dir}: {os_write_reason(reports_dir, exc)}"
        ) from None
    if not os.access(reports_dir, os.W_OK | os.X_OK):
        raise RooftraceError(f"cannot create reports folder {reports_dir}: it is not writable")


def fleet_text(config: dict[str, Any]) -> str:
    """The fleet for people, GPUs per replica = tp × pp × dp: '2× llama-3.1-8b, each on 1×
    h100-sxm (2 GPUs)', '1× qwen3-30b-a3b, each on 64× h100-sxm (tp 1 × pp 1 × dp 64; 64 GPUs)'."""
    resolved = config.get("resolved") or {}
    fleet = resolved.get("fleet") or {}
    if isinstance(resolved.get("pools"), list):  # a fleet of pools: each pool's part
        parts = []
        for p in (p for p in resolved["pools"] if isinstance(p, dict)):
            n = (p.get("fleet") or {}).get("replicas")
            each = fleet_text({"resolved": p}).split(", each on ", 1)[-1]
            parts.append(f"pool {p.get('pool')}: {n} replica{'' if n == 1 else 's'}, each on {each}")
        return f"{fleet.get('model', '?')} on {len(parts)} pools ({'; '.join(parts)})"

    def whole(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    degrees = {k: whole(fleet.get(k)) or 1 for k in ("tp", "pp", "dp")}
    per = whole(resolved.get("gpus_per_replica")) or degrees["tp"] * degrees["pp"] * degrees["dp"]
    replicas = whole(fleet.get("replicas"))
    split = " × ".join(f"{k} {v}" for k, v in degrees.items()) + "; " if per > 1 else ""
    total = f"{replicas * per:,} GPU{'s' if replicas * per != 1 else ''}" if replicas else "? GPUs"
    return (
        f"{replicas if replicas else '?'}× {fleet.get('model', '?')}, each on {per}× {fleet.get('hardware', '?')} "
        f"({split}{total})"
    )


# --- predicted vs observed ----------------------------------------------------------------------

#: The drift rule: a night's replay has drifted from the real fleet when the day-level p50 TTFT or
#: p50 TPOT it predicts is more than this far from the observed one (|replayed / observed − 1| >
#: DRIFT_LIMIT), each judged over at least :data:`DRIFT_MIN_SAMPLES` compared requests.
DRIFT_LIMIT = 0.10
#: Fewer compared requests than this leave a metric's drift unjudged (said, never a warning).
DRIFT_MIN_SAMPLES = 10
#: The earlier nights the trend reads at most (newest first).
TREND_NIGHTS = 30
#: The metrics compared (of :data:`pipeline.calibrate.observed.METRICS`), as the query names them.
COMPARED = (("ttft", "ttft_s", "TTFT"), ("tpot", "tpot_s", "TPOT"))
OBSERVED_QUERY = "predicted_vs_observed"
OBSERVED_TITLE = "Predicted vs observed"
OBSERVED_ANCHOR = "predicted-vs-observed"
#: The columns of the per-hour table, as the named query returns them.
OBSERVED_COLUMNS = (
    "hour",
    "metric",
    "matched",
    "unfinished",
    "not_compared",
    "samples",
    "observed_p50_s",
    "replayed_p50_s",
    "p50_error",
    "observed_p99_s",
    "replayed_p99_s",
    "p99_error",
)


@dataclass
class ObservedComparison:
    """A run's replayed latencies against the observed ones of its date's logs (the numbers of
    the named query :data:`OBSERVED_QUERY`, computed here with :mod:`pipeline.calibrate.observed` and
    :func:`pipeline.replay.slo.percentile`), with the counts of what could not be compared."""

    #: One row per hour (UTC, 'YYYY-MM-DD HH:00') and metric, then the day ('all'): OBSERVED_COLUMNS.
    rows: Rows
    store_requests: int
    run_requests: int
    #: Store requests of the date carrying an observed TTFT or E2E (pipeline.calibrate.observed.observed_count).
    observed_requests: int
    matched: int
    #: Matched requests the replay rejected or did not finish: counted, never compared.
    unfinished: int
    #: Ids logged (or replayed) more than once: left out, as they cannot be paired.
    ambiguous_ids: int

    def day(self, metric: str) -> dict[str, Any]:
        """The day-level row of ``metric`` ('ttft_s' or 'tpot_s'); {} when none."""
        return _first(self.rows, hour="all", metric=metric)

    def errors(self) -> dict[str, Any]:
        """The day-level signed errors, flat: ttft_p50_error, ttft_p99_error, tpot_p50_error, ..."""
        return {
            f"{short}_{p}_error": self.day(metric).get(f"{p}_error")
            for short, metric, _ in COMPARED
            for p in ("p50", "p99")
        }

    def drifted(self) -> list[str]:
        """The metrics over the drift limit, each as 'p50 TTFT +50.0%' (:data:`DRIFT_LIMIT`)."""
        out = []
        for _, metric, label in COMPARED:
            row = self.day(metric)
            err = row.get("p50_error")
            if err is not None and int(row.get("samples") or 0) >= DRIFT_MIN_SAMPLES and abs(err) > DRIFT_LIMIT:
                out.append(f"p50 {label} {_signed(err)}")
        return out

    def counts_line(self) -> str:
        """What was compared and what was not, in one sentence."""
        bits = [
            f"{self.matched:,} of the store's {self.store_requests:,} requests of the date matched by request_id "
            f"in the run's {self.run_requests:,}"
        ]
        if self.unfinished:
            bits.append(f"{self.unfinished:,} of them rejected or unfinished by the replay (not compared)")
        for _, metric, label in COMPARED:
            row = self.day(metric)
            skipped = int(row.get("not_compared") or 0)
            if skipped:
                bits.append(
                    f"{skipped:,} finished without an observed {label}"
                    + (" (or with a one-token output)" if metric == "tpot_s" else "")
                    + ", left out"
                )
        if self.ambiguous_ids:
            bits.append(f"{self.ambiguous_ids:,} request ids logged or replayed more than once, left out")
        return "; ".join(bits)


def drift_phrase(h: dict[str, Any]) -> str:
    """The drift in a few words for a summary line: 'DRIFT vs observed latencies: p50 TTFT
    -33.3%, p50 TPOT -33.3% (limit 10%)'; '' without drift."""
    if not h.get("drift"):
        return ""
    over = ", ".join(str(m) for m in h.get("drift_metrics") or [])
    return f"DRIFT vs observed latencies: {over} (limit ±{DRIFT_LIMIT:.0%})"


def _signed(x: Any) -> str:
    """A signed error for people: '+12.3%', 'n/a'."""
    if not isinstance(x, int | float) or isinstance(x, bool) or not math.isfinite(x):
        return "n/a"
    return f"{float(x) * 100:+.1f}%"


def compare_observed(logged: Any, replayed: Any) -> ObservedComparison:
    """Compare a run's requests (``replayed``: request_id, status, ttft_s, tpot_s) with the store's
    requests of its date (``logged``: request_id, arrival, output_tokens, ttft_s, e2e_s; polars
    frames): the observed latencies from :func:`pipeline.calibrate.observed.observed_latencies`, matched by
    request_id, per hour of the logged arrival (UTC) and for the day, p50/p99 by
    :func:`pipeline.replay.slo.percentile` over the requests with both values. The same numbers as the
    named query :data:`OBSERVED_QUERY`."""
    import numpy as np
    import polars as pl

    lat = observed_latencies(logged)
    left = logged.select(
        pl.col("request_id").cast(pl.String),
        pl.col("arrival").dt.convert_time_zone("UTC").dt.truncate("1h").dt.strftime("%Y-%m-%d %H:00").alias("hour"),
    ).with_columns(observed_ttft=pl.Series(lat["ttft"]), observed_tpot=pl.Series(lat["tpot"]))
    right = replayed.select(
        pl.col("request_id").cast(pl.String),
        pl.col("status").cast(pl.String),
        pl.col("ttft_s").cast(pl.Float64).fill_null(np.nan).alias("replayed_ttft"),
        pl.col("tpot_s").cast(pl.Float64).fill_null(np.nan).alias("replayed_tpot"),
    )
    dup_left = left.filter(pl.col("request_id").is_duplicated())
    dup_right = right.filter(pl.col("request_id").is_duplicated())
    ambiguous = pl.concat([dup_left.select("request_id"), dup_right.select("request_id")])["request_id"].n_unique()
    m = left.filter(~pl.col("request_id").is_duplicated()).join(
        right.filter(~pl.col("request_id").is_duplicated()), on="request_id", how="inner"
    )
    hours = m["hour"].to_numpy()
    rep_ttft = m["replayed_ttft"].to_numpy()
    finished = (m["status"].to_numpy() == "finished") & np.isfinite(rep_ttft)
    values = {
        metric: (m[f"observed_{short}"].to_numpy(), m[f"replayed_{short}"].to_numpy()) for short, metric, _ in COMPARED
    }
    rows: Rows = []
    groups = [(h, hours == h) for h in sorted(set(hours.tolist()))] + [("all", np.ones(len(hours), dtype=bool))]
    for hour, in_group in groups:
        for _, metric, _ in COMPARED:
            obs, rep = values[metric]
            ok = in_group & finished & np.isfinite(obs) & np.isfinite(rep)
            n = int(np.count_nonzero(ok))
            row: dict[str, Any] = {
                "hour": hour,
                "metric": metric,
                "matched": int(np.count_nonzero(in_group)),
                "unfinished": int(np.count_nonzero(in_group & ~finished)),
                "not_compared": int(np.count_nonzero(in_group & finished & ~ok)),
                "samples": n,
            }
            for p in ("p50", "p99"):
                o, r, err = percentile_pair(obs[ok], rep[ok], float(p[1:]))
                row[f"observed_{p}_s"], row[f"replayed_{p}_s"], row[f"{p}_error"] = o, r, err
            rows.append({k: row[k] for k in OBSERVED_COLUMNS})
    return ObservedComparison(
        rows=rows,
        store_requests=logged.height,
        run_requests=replayed.height,
        observed_requests=observed_count(logged),
        matched=m.height,
        unfinished=int(np.count_nonzero(~finished)),
        ambiguous_ids=int(ambiguous),
    )


_LOGGED_COLUMNS = ("request_id", "arrival", "output_tokens", "ttft_s", "e2e_s")
_REPLAYED_COLUMNS = ("request_id", "status", "ttft_s", "tpot_s")


def observed_comparison(store: Store, day: str, run_dir: Path) -> ObservedComparison | None:
    """:func:`compare_observed` of a run and its date's stored requests, or None when the date's
    logs carry no observed latency (or either side cannot be read: the report is still written)."""
    import polars as pl

    try:
        logged = store.read_requests(day, columns=list(_LOGGED_COLUMNS))
        if not observed_count(logged):
            return None
        replayed = pl.read_parquet(run_dir / "requests.parquet", columns=list(_REPLAYED_COLUMNS))
        return compare_observed(logged, replayed)
    except (RooftraceError, OSError, ValueError, pl.exceptions.PolarsError, pa.ArrowException):
        return None


def observed_headline(cmp: ObservedComparison | None) -> dict[str, Any]:
    """The headline's predicted-vs-observed fields: whether the run was compared, the day-level
    errors, the counts line, and the drift warning (:data:`DRIFT_LIMIT`)."""
    if cmp is None:
        return {"observed_compared": False, "drift": False, "drift_note": None}
    drifted = cmp.drifted()
    if not cmp.matched:
        note = (
            f"no request of the run matches the store's {cmp.store_requests:,} requests of the date by request_id "
            f"(the run replayed {cmp.run_requests:,}): nothing to compare"
        )
    else:
        note = cmp.counts_line()
    drift_note = None
    if drifted:
        drift_note = (
            f"DRIFT: the replay is off the observed latencies beyond {DRIFT_LIMIT:.0%}: {', '.join(drifted)} "
            f"(day-level replayed / observed − 1, {cmp.matched:,} requests matched by request_id); the cost model "
            "needs recalibrating against the fleet's own latencies: rooftrace calibrate --observed --fleet "
            "FLEET.toml (docs/calibration.md)"
        )
    return {
        "observed_compared": True,
        "observed_note": note,
        "observed_matched": cmp.matched,
        "observed_unfinished": cmp.unfinished,
        "observed_requests": cmp.observed_requests,
        **{f"observed_{k}": v for k, v in cmp.errors().items()},
        "observed_rows": cmp.rows,
        "drift": bool(drifted),
        "drift_metrics": drifted,
        "drift_note": drift_note,
    }


def observed_trend(store: Store, run_id: str, day: str, config: dict[str, Any]) -> Rows:
    """The same fleet's earlier nights that had observed latencies (as-logged runs of earlier dates,
    the latest run of each, at most :data:`TREND_NIGHTS`), oldest first: each night's day-level
    p50/p99 errors. This run's own night is not included (the caller adds it)."""
    fleet = ((config.get("resolved") or {}).get("fleet") or {}).get("name")
    by_date: dict[str, tuple[int, str]] = {}
    for other in run_ids(store):
        path = store.run_dir(other) / "config.json"
        try:
            cfg = read_config(path)
            mtime = path.stat().st_mtime_ns
        except (RooftraceError, OSError):
            continue
        when = str(cfg.get("date") or other[:10])
        if other == run_id or when >= day or what_if_options(cfg):
            continue
        if ((cfg.get("resolved") or {}).get("fleet") or {}).get("name") != fleet:
            continue
        if when not in by_date or (mtime, other) > by_date[when]:
            by_date[when] = (mtime, other)
    out: Rows = []
    for when in sorted(by_date, reverse=True)[:TREND_NIGHTS]:
        night = _night_errors(store, when, by_date[when][1])
        if night is not None:
            out.append(night)
    return sorted(out, key=lambda r: str(r["date"]))


def _night_errors(store: Store, day: str, run_id: str) -> dict[str, Any] | None:
    """One earlier night's day-level errors (None: no observed latency, or nothing matched),
    cached in STORE/.cache/observed/ under the sizes and times of the files they come from, so a
    report does not read 30 earlier days again every night."""
    import hashlib

    run_file = store.run_dir(run_id) / "requests.parquet"
    try:
        stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in [*store.request_files(day), run_file]]
    except (RooftraceError, OSError):
        return None
    key = hashlib.sha256(json.dumps(stats).encode()).hexdigest()
    cached = store.cache_dir / "observed" / f"{run_id}.json"
    try:
        doc = json.loads(cached.read_text())
        if isinstance(doc, dict) and doc.get("key") == key:
            night = doc.get("night")
            return night if isinstance(night, dict) or night is None else None
    except (OSError, ValueError):
        pass
    cmp = observed_comparison(store, day, run_file.parent)
    night = (
        None
        if cmp is None or not cmp.matched
        else {"date": day, "run_id": run_id, **cmp.errors(), "drift": bool(cmp.drifted())}
    )
    with contextlib.suppress(OSError):  # a store the reader may not write: computed again next time
        atomic_write_bytes(cached, json.dumps({"key": key, "night": night}).encode())
    return night


def _observed_table(rows: Rows) -> str:
    """The per-hour table for people: seconds as ms/s, errors signed."""
    shown = []
    for r in rows:
        row: dict[str, Any] = {
            "hour (UTC)": "whole day" if r["hour"] == "all" else r["hour"],
            "metric": r["metric"],
            "matched": r["matched"],
            "rejected or unfinished": r["unfinished"],
            "not compared": r["not_compared"],
            "compared": r["samples"],
        }
        for p in ("p50", "p99"):
            row[f"observed {p} (ms)"] = ms_cell(r[f"observed_{p}_s"])
            row[f"replayed {p} (ms)"] = ms_cell(r[f"replayed_{p}_s"])
            row[f"{p} error"] = _signed(r[f"{p}_error"])
        shown.append(row)
    return _html_table(shown, limit=100)


TREND_CHART = "observed_trend"
#: The section of the last ``validate --runs`` (STORE/validation/runs.parquet), shown when stored.
BENCH_RUNS_TITLE = (
    "Benchmark runs replayed (rooftrace validate --runs; error = replayed / observed − 1, each run under its "
    "client's methodology)"
)


def observed_section(
    cmp: ObservedComparison, headline: dict[str, Any], trend: Rows, run_id: str, day: str
) -> tuple[str, Chart | None]:
    """The report's "Predicted vs observed" section (HTML) and its trend chart (None with fewer
    than two nights to draw)."""
    parts: list[str] = [
        fragment("observed_intro")(day, f"{DRIFT_LIMIT:.0%}", DRIFT_MIN_SAMPLES, OBSERVED_QUERY, run_id),
        fragment("para")(str(headline.get("observed_note") or "")),
    ]
    if headline.get("drift_note"):
        parts.append(fragment("box")(str(headline["drift_note"]), "alert", "drift"))
    elif cmp.matched:
        judged = [
            f"p50 {label} {_signed(cmp.day(metric).get('p50_error'))}"
            for _, metric, label in COMPARED
            if int(cmp.day(metric).get("samples") or 0) >= DRIFT_MIN_SAMPLES
        ]
        parts.append(
            fragment("box")(
                f"Within {DRIFT_LIMIT:.0%} of the observed latencies: {', '.join(judged)}."
                if judged
                else f"Too few requests compared to judge drift (fewer than {DRIFT_MIN_SAMPLES} per metric).",
                "ok",
            )
        )
    if cmp.matched:
        parts.append(_observed_table(cmp.rows))
    nights = [*trend, {"date": day, "run_id": run_id, **cmp.errors(), "drift": bool(cmp.drifted())}]
    parts.append(fragment("heading")("Trend over nights"))
    parts.append(
        fragment("para")(
            "This fleet's nights in the store whose logs carried observed latencies (as-logged runs, the latest "
            f"of each date, up to {TREND_NIGHTS} before this one): the day-level signed errors.",
            "def",
        )
    )
    table = [
        {
            "night": n["date"],
            "run": n["run_id"],
            **{
                f"{p} {label} error": _signed(n.get(f"{short}_{p}_error"))
                for short, _, label in COMPARED
                for p in ("p50", "p99")
            },
            "drift": "DRIFT" if n.get("drift") else "no",
        }
        for n in nights
    ]
    parts.append(_html_table(table))
    chart = None
    long = [
        {"night": n["date"], "series": f"{p} {label}", "error": n[f"{short}_{p}_error"]}
        for n in nights
        for short, _, label in COMPARED
        for p in ("p50", "p99")
        if isinstance(n.get(f"{short}_{p}_error"), int | float)
    ]
    if len(nights) > 1 and long:
        data = Datasets()
        band = [{"lo": -DRIFT_LIMIT, "hi": DRIFT_LIMIT}]
        spec = data.spec(
            alt.layer(
                alt.Chart(data(band)).mark_rect(opacity=0.12, color="#2e7d32").encode(y="lo:Q", y2="hi:Q"),
                alt.Chart(data(long))
                .mark_line(point=True)
                .encode(
                    x=alt.X("night:T", title="night", axis=alt.Axis(format="%Y-%m-%d")),
                    y=alt.Y("error:Q", title="replayed / observed − 1", axis=alt.Axis(format="+%")),
                    color=alt.Color("series:N", title=None),
                    tooltip=["night:T", "series:N", alt.Tooltip("error:Q", format="+.1%")],
                ),
            ).properties(width=700)
        )
        chart = Chart(
            TREND_CHART,
            "Predicted vs observed over nights (signed error)",
            f"Green band: within ±{DRIFT_LIMIT:.0%} (the drift limit applies to the p50s).",
            spec,
            _no_data(spec),
            inline=True,
        )
        parts.append(render("place.html.j2", kind="chart", key=TREND_CHART, text=""))
    return "".join(str(p) for p in parts), chart


def _energy_table(run_dir: Path, config: Mapping[str, Any]) -> Any:
    """The run's energy (pipeline/economics/energy.py) as a table; a run it cannot price says why."""
    try:
        return _html_table(energy_rows(run_energy(run_dir, config).to_dict()))
    except RooftraceError as exc:
        return _html_table([{"figure": "energy", "value": f"not computed: {exc}", "per day": ""}])


def build_report(
    store: Store,
    run_id: str | None = None,
    date: str | None = None,
    out: Path | None = None,
    png_dir: Path | None = None,
    reports_dir: Path | None = None,
    nightly: bool = False,
) -> ReportResult:
    """Write the HTML report of one replay run (the latest by default). Its queries read the
    warehouse as it is after the run (warehouse.connect rebuilds the views the run changed).

    Without ``out`` it goes to the reports tree: reports/<date>/<fleet>/ for the nightly's run
    (``nightly``) or a run like it, reports/<date>/<fleet>/what-if/<run_id>/ for a what-if run or
    another run of a date and fleet the nightly published (:func:`_report_target`)."""
    t0 = time.perf_counter()
    if out is not None:
        _check_out(out)
    elif reports_dir is not None:
        _make_reports_dir(reports_dir)
    if png_dir is not None:
        _check_png_dir(png_dir)
    if run_id is None:
        run_id = latest_run(store, date)  # (a date checked YYYY-MM-DD, matched whole)
        if run_id is None:
            dates = sorted({r[:10] for r in run_ids(store)})
            if date is not None and dates:
                raise RooftraceError(
                    f"{store.runs_dir}: no replay run of {date} to report; runs exist for {', '.join(dates[-5:])}"
                )
            raise RooftraceError(f"{store.runs_dir}: no replay run to report (run `rooftrace replay`)")
    config_path = store.run_dir(run_id) / "config.json"
    if not config_path.exists():
        raise RooftraceError(f"{config_path}: no such run")
    config = read_config(config_path)
    check_date_option(store, date, run_id)  # a --date that contradicts --run is refused, not ignored
    _check_run_files(store.run_dir(run_id), run_id)
    day = str(config.get("date") or date or store.resolve_date(None))

    results: dict[str, Rows] = {}
    session = Session(store)

    def q(name: str) -> Rows:
        # Each named query runs once per report, however many charts and tables use it.
        if name not in results:
            results[name] = _rows(session.query(name, {"run_id": run_id, "date": day}))
        return results[name]

    run_dir = store.run_dir(run_id)
    period = stored_run_period(run_dir, config)  # the one period `rooftrace cost` prices
    headline = headline_numbers(q) | health_headline(config.get("summary") or {})
    headline |= cost_period_headline(q("cost"), period)
    headline |= stale_headline(store, day, config, run_dir)
    headline["classify_requests"] = headline.get("requests")  # the store's now, as classify counted
    headline |= classify_headline(store, day)
    headline |= cache_split_headline(store, day, config)
    headline |= traffic_headline(q("latency_by"), config)
    headline |= ingest_headline(q("ingest_accounting"), store.quarantine_dir.resolve(), day)
    headline["verdict"] = _finished_percentiles(session, run_id, headline.get("verdict"))
    headline["warnings"] = [_restate(w, headline) for w in headline["warnings"]]
    curve = q("load_curve")
    if curve:
        headline["headroom"] = headroom_sentence(curve)
        headline["knee"] = knee(curve)
    # predicted vs observed: only for an as-logged replay of a date whose logs carry latencies
    compared = observed_comparison(store, day, run_dir) if not what_if_options(config) else None
    headline |= observed_headline(compared)
    auto = (config.get("summary") or {}).get("autoscale")
    charts = _charts(q, headline, autoscale_day(auto, run_dir) if isinstance(auto, dict) else None)
    lead = ""
    if compared is not None:
        trend = observed_trend(store, run_id, day, config)
        headline["observed_trend"] = trend
        body, trend_chart = observed_section(compared, headline, trend, run_id, day)
        lead = str(fragment("section")(OBSERVED_TITLE, Markup(body), OBSERVED_ANCHOR))
        if trend_chart is not None:
            charts.append(trend_chart)
    fleet_name = str(config.get("resolved", {}).get("fleet", {}).get("name") or "fleet")
    note, published_by_nightly = None, nightly
    if out is None:  # the reports tree: one folder per date and fleet, claimed by this store
        out, note, published_by_nightly = _report_target(
            reports_dir or Path("reports"), day, fleet_name, run_id, config, nightly
        )
        claim_report_dir(out.parent, store)
    by_tenant = [
        {k: r.get(k) for k in ("bucket", "metric", "samples", "min", "p50", "p90", "p99", "max", "mean", "std")}
        for r in q("latency_by")
        if r["dimension"] == "tenant"
    ]
    if curve:
        charts_by_key = {c.key: c for c in charts}
        if "load_curve" in charts_by_key:
            charts_by_key["load_curve"].after = load_curve_table(curve)
    extra = [
        ("Latency percentiles (milliseconds, finished requests)", latency_table(q("latency"))),
        ("Latency by tenant (milliseconds; bucket = tenant)", latency_table(by_tenant)),
        ("Peak throughput", _html_table([{**r, "at": to_second(r.get("at"))} for r in q("peak_throughput")])),
        # the query's 'headroom' is the free share of the KV cache, not the traffic headroom
        ("KV memory", _html_table([{KV_NAMES.get(k, k): v for k, v in r.items()} for r in q("kv_memory")])),
        ("Binding resource shares", _html_table(q("binding_shares"))),
        (f"Cost (US$ over {period.text})", _html_table(cost_table(q("cost"), period))),
        *cost_stack_sections(_cost_json(store, run_id), run_id),
        (f"Energy (GPU board power model, over {period.text}; docs/economics.md)", _energy_table(run_dir, config)),
        *_economics_sections(
            session, run_id, charts, day, config.get("resolved", {}).get("fleet", {}).get("model"), period
        ),
        ("Two cache models", _two_caches(headline, config, _classified(store, day))),
        (f"{INGEST_TITLE} (files with requests on {day})", _html_table(q("ingest_accounting"))),
    ]
    bench = stored_table(store)  # `rooftrace validate --runs`: benchmark client runs replayed on a fleet
    if bench is not None and bench.height:
        extra.append((BENCH_RUNS_TITLE, _html_table(report_rows(bench))))
    what_if = what_if_options(config)
    subtitle = (
        f"{day} · run {run_id}"
        + (f" (what-if: {options_text(what_if)})" if what_if else "")
        + f" · {fleet_text(config)} · numbers reproducible with `rooftrace query NAME --run {run_id}`"
    )
    session.con.close()
    # vl-convert's JavaScript engine aborts the process under a small address-space limit: the
    # charts are left out (said in their places and in one warning line), the rest is written
    blocked = charts_blocked()
    page_note = blocked if blocked is not None and not cached_bundle(store.cache_dir).exists() else None
    page = render_html(
        f"rooftrace capacity report — {day}",
        subtitle,
        headline,
        charts,
        extra,
        "" if page_note else vega_bundle(store.cache_dir),
        charts_note=page_note,
        lead=lead,
        config=config,
    )
    charts_note = page_note or (charts_blocked("charts not drawn as PNG") if png_dir is not None else None)
    if charts_note is not None:
        notice(f"warning: {charts_note}")
    headline_doc = {
        "date": day,
        "run_id": run_id,
        "fleet": fleet_name,
        "store": str(store.root.resolve()),
        "published_by": "nightly" if published_by_nightly else "report",
        "what_if": what_if or None,
        **headline,
    }
    target = out
    pngs: list[Path] = []
    skipped: list[str] = []
    try:
        atomic_write_bytes(out, page.encode())
        target = out.with_name("headline.json")
        atomic_write_bytes(target, (json.dumps(headline_doc, indent=2, default=str) + "\n").encode())
    except OSError as exc:
        raise RooftraceError(f"cannot write {target}: {os_write_reason(target, exc)}") from None
    if png_dir is not None:
        _write_pngs(charts, png_dir, pngs, skipped)
    return ReportResult(
        out, run_id, day, headline, [c.key for c in charts], pngs, time.perf_counter() - t0, skipped, note, charts_note
    )
