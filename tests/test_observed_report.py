"""Predicted vs observed in the nightly's report: the replay's latencies against the ones the logs
carry, per hour, checked against numpy over the two tables; the drift warning; the trend over
nights; the named query; the section rendered in headless Chromium; no section without observed
latencies or for a what-if run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from pipeline.classify.accounting import classify_tokens
from pipeline.cli import main
from pipeline.common.tables import table_to_json
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.publish.nightly import NightlyResult, nightly
from pipeline.publish.report import (
    DRIFT_LIMIT,
    OBSERVED_COLUMNS,
    OBSERVED_TITLE,
    build_report,
    compare_observed,
    observed_headline,
)
from pipeline.publish.warehouse import run_query
from pipeline.replay.run import ReplayOptions, replay
from pipeline.synth import SynthConfig, generate, write_logs
from tests.test_report import offline_dom

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"
EQUAL, SCALED = "2025-03-01", "2025-03-02"  # observed = the replay's own; observed = 1.5 x the replay's
SEEDS = {EQUAL: 31, SCALED: 32}
#: Lines of the scaled day whose logged latencies are removed (left out of the comparison, counted).
STRIPPED = 7


def _frame(day: str) -> pl.DataFrame:
    """A synthetic day over three hours, so that the per-hour table has several rows."""
    return generate(SynthConfig(requests=180, seed=SEEDS[day], duration_s=3 * 3600, date=day))


def _replayed(tmp: Path) -> dict[str, pl.DataFrame]:
    """The replay's own latencies of each day (request_id, status, ttft_s, e2e_s), from a scratch
    store that ingested the same requests (the replay never reads the logged latencies)."""
    store = Store(tmp / "scratch")
    out = {}
    for day in (EQUAL, SCALED):
        write_logs(_frame(day), "openai", tmp / "scratch-logs" / f"{day}.jsonl")
    ingest_logs([tmp / "scratch-logs"], store)
    for day in (EQUAL, SCALED):
        classify_tokens(store, day)
        res = replay(store, FLEET, ReplayOptions(date=day))
        columns = ["request_id", "status", "ttft_s", "e2e_s"]
        out[day] = pl.read_parquet(res.run_dir / "requests.parquet", columns=columns)
    return out


def _log(day: str, replayed: pl.DataFrame, scale: float, path: Path, strip: int = 0) -> None:
    """The day's OpenAI logged pairs whose ttft_s / e2e_s are ``scale`` x the replay's own (the
    synthetic ones where the replay did not finish the request); ``strip`` lines lose both."""
    rep = replayed.filter(pl.col("status") == "finished").select(
        pl.col("request_id").str.strip_prefix("chatcmpl-"),
        (pl.col("ttft_s") * scale).alias("rep_ttft"),
        (pl.col("e2e_s") * scale).alias("rep_e2e"),
    )
    frame = (
        _frame(day)
        .join(rep, on="request_id", how="left")
        .with_columns(
            ttft_s=pl.coalesce("rep_ttft", "ttft_s"),
            e2e_s=pl.coalesce("rep_e2e", "e2e_s"),
        )
        .drop("rep_ttft", "rep_e2e")
    )
    write_logs(frame, "openai", path)
    if strip:
        lines = path.read_text().splitlines()
        for i in range(0, strip * 5, 5):  # every fifth line, from the first
            doc = json.loads(lines[i])
            del doc["ttft_s"], doc["e2e_s"]
            lines[i] = json.dumps(doc)
        path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One store, two nights of one fleet: the first logs the replay's own latencies, the second
    1.5 x them (with a few lines without latencies), run through the CLI to see its stderr."""
    tmp = tmp_path_factory.mktemp("observed")
    replayed = _replayed(tmp)
    store, reports = Store(tmp / "store"), tmp / "reports"
    _log(EQUAL, replayed[EQUAL], 1.0, tmp / "logs-1" / "day.jsonl")
    _log(SCALED, replayed[SCALED], 1.5, tmp / "logs-2" / "day.jsonl", strip=STRIPPED)
    first = nightly([tmp / "logs-1"], FLEET, store, EQUAL, reports, headroom_budget_s=0)
    res = CliRunner().invoke(
        main,
        [
            "nightly",
            str(tmp / "logs-2"),
            "--fleet",
            str(FLEET),
            "--date",
            SCALED,
            "--headroom-budget",
            "0",
            "--store",
            str(store.root),
            "--reports",
            str(reports),
            "--json",
        ],
    )
    assert res.exit_code in (0, 3), res.output + res.stderr
    doc = json.loads(res.stdout)
    return {"store": store, "reports": reports, "first": first, "second": doc, "stderr": res.stderr}


def _independent(store: Store, day: str, run_id: str) -> list[dict[str, Any]]:
    """The section's rows computed again with numpy over the two Parquet tables."""
    logged = pl.read_parquet(sorted((store.root / "requests" / f"date={day}").glob("*.parquet")))
    run = pl.read_parquet(store.root / "runs" / run_id / "requests.parquet")
    j = logged.select("request_id", "arrival", "output_tokens", "ttft_s", "e2e_s").join(
        run.select("request_id", "status", pl.col("ttft_s").alias("r_ttft"), pl.col("tpot_s").alias("r_tpot")),
        on="request_id",
    )
    hour = j["arrival"].dt.convert_time_zone("UTC").dt.strftime("%Y-%m-%d %H:00").to_numpy()
    out_tokens = j["output_tokens"].to_numpy().astype(float)
    o_ttft = j["ttft_s"].fill_null(np.nan).to_numpy()
    o_e2e = j["e2e_s"].fill_null(np.nan).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        o_tpot = np.where(out_tokens >= 2, (o_e2e - o_ttft) / (out_tokens - 1), np.nan)
    r_ttft = j["r_ttft"].fill_null(np.nan).to_numpy()
    r_tpot = j["r_tpot"].fill_null(np.nan).to_numpy()
    done = (j["status"].to_numpy() == "finished") & np.isfinite(r_ttft)
    rows = []
    for h in [*sorted(set(hour)), "all"]:
        g = np.ones(len(hour), bool) if h == "all" else hour == h
        for metric, o, r in (("ttft_s", o_ttft, r_ttft), ("tpot_s", o_tpot, r_tpot)):
            ok = g & done & ~np.isnan(o) & ~np.isnan(r)
            row = {"hour": h, "metric": metric, "matched": int(g.sum()), "unfinished": int((g & ~done).sum())}
            row |= {"not_compared": int((g & done & ~ok).sum()), "samples": int(ok.sum())}
            for p in (50, 99):
                ov = float(np.percentile(o[ok], p, method="inverted_cdf"))
                rv = float(np.percentile(r[ok], p, method="inverted_cdf"))
                row |= {f"observed_p{p}_s": ov, f"replayed_p{p}_s": rv, f"p{p}_error": rv / ov - 1}
            rows.append(row)
    return rows


def _same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [(r["hour"], r["metric"]) for r in got] == [(r["hour"], r["metric"]) for r in want]
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(OBSERVED_COLUMNS)
        for k, v in w.items():
            assert g[k] == (pytest.approx(v, rel=1e-12) if isinstance(v, float) else v), (g["hour"], g["metric"], k)


def _page(nights: dict[str, Any], day: str) -> str:
    return str((nights["reports"] / day / "default" / "index.html").read_text())


def test_section_numbers_match_numpy_over_the_two_tables(nights: dict[str, Any]) -> None:
    store = nights["store"]
    for day, run_id, head in (
        (EQUAL, nights["first"].run_id, nights["first"].headline),
        (SCALED, nights["second"]["run_id"], nights["second"]["headline"]),
    ):
        want = _independent(store, day, run_id)
        _same(head["observed_rows"], want)
        assert len({r["hour"] for r in want}) >= 3  # three hours of traffic, then the day
    head = nights["second"]["headline"]
    day_ttft = next(r for r in head["observed_rows"] if r["hour"] == "all" and r["metric"] == "ttft_s")
    # the stripped lines are counted, not compared; rejected requests are counted and said
    run = pl.read_parquet(store.runs_dir / nights["second"]["run_id"] / "requests.parquet")
    rejected = run.filter(pl.col("status") != "finished").height
    assert day_ttft["unfinished"] == rejected > 0
    assert 0 < day_ttft["not_compared"] <= STRIPPED
    assert day_ttft["matched"] == run.height == 180
    page = _page(nights, SCALED)
    section = page.split('<section id="predicted-vs-observed">')[1].split("</section>")[0]
    assert f"{rejected:,} of them rejected or unfinished by the replay (not compared)" in section
    assert f"{day_ttft['not_compared']:,} finished without an observed TTFT" in section
    for r in head["observed_rows"]:  # every error of the table, as printed
        for p in ("p50", "p99"):
            assert f"{r[f'{p}_error'] * 100:+.1f}%" in section, (r["hour"], r["metric"], p)


def test_drift_warned_when_observed_is_scaled_not_when_equal(nights: dict[str, Any]) -> None:
    first = nights["first"]
    assert isinstance(first, NightlyResult)
    h = first.headline
    assert h["observed_compared"] and not h["drift"] and h["drift_note"] is None
    for key in ("ttft_p50_error", "ttft_p99_error", "tpot_p50_error", "tpot_p99_error"):
        assert abs(h[f"observed_{key}"]) < 1e-3, key  # logged to the microsecond
    assert "DRIFT" not in first.line()
    page = _page(nights, EQUAL)
    assert "DRIFT" not in page and f"Within {DRIFT_LIMIT:.0%} of the observed latencies" in page

    second = nights["second"]["headline"]
    assert second["drift"] and second["drift_note"].startswith("DRIFT:")
    assert second["observed_ttft_p50_error"] == pytest.approx(1 / 1.5 - 1, abs=1e-3)
    assert second["observed_tpot_p50_error"] == pytest.approx(1 / 1.5 - 1, abs=1e-3)
    # where the user looks first: the nightly's warning and last line, the report's banner and card
    stderr = nights["stderr"].strip().splitlines()
    assert any(line.startswith("warning: DRIFT:") for line in stderr), stderr
    assert "DRIFT vs observed latencies: p50 TTFT -33.3%, p50 TPOT -33.3%" in stderr[-1]
    page = _page(nights, SCALED)
    banner = page.split('<div class="alert">')[1].split("</div>")[0]
    assert "DRIFT: the replay is off the observed latencies beyond 10%" in banner
    assert "<span>Predicted vs observed</span><b>DRIFT: p50 TTFT -33.3%" in page
    assert page.index('<section id="predicted-vs-observed">') < page.index('id="chart-')
    index = (nights["reports"] / "index.html").read_text()
    assert "DRIFT vs observed latencies" in index


def test_trend_over_nights(nights: dict[str, Any]) -> None:
    trend = nights["second"]["headline"]["observed_trend"]
    assert [n["date"] for n in trend] == [EQUAL]
    assert trend[0]["run_id"] == nights["first"].run_id and not trend[0]["drift"]
    assert abs(trend[0]["ttft_p50_error"]) < 1e-3
    # an earlier night's errors are kept beside the store, not computed from its day every night
    cached = json.loads((nights["store"].cache_dir / "observed" / f"{trend[0]['run_id']}.json").read_text())
    assert cached["night"] == trend[0]
    page = _page(nights, SCALED)
    section = page.split('<section id="predicted-vs-observed">')[1].split("</section>")[0]
    assert "Trend over nights" in section and EQUAL in section and SCALED in section
    assert 'id="chart-observed_trend"' in section
    assert nights["first"].headline["observed_trend"] == []  # the first night has none before it


def test_named_query_gives_the_report_numbers(nights: dict[str, Any]) -> None:
    store = nights["store"]
    for run_id, head in (
        (nights["first"].run_id, nights["first"].headline),
        (nights["second"]["run_id"], nights["second"]["headline"]),
    ):
        _same(table_to_json(run_query(store, "predicted_vs_observed", {"run_id": run_id})), head["observed_rows"])
    # as the other named queries take their parameters: --date gives the latest run of the date
    res = CliRunner().invoke(
        main, ["query", "predicted_vs_observed", "--date", EQUAL, "--store", str(store.root), "--json"]
    )
    assert res.exit_code == 0, res.output + res.stderr
    _same(json.loads(res.stdout), nights["first"].headline["observed_rows"])


def test_no_section_without_observed_latencies(tmp_path: Path) -> None:
    """Logs that carry no latencies (Vidur's CSV) get no section, no card and no warning; a
    what-if replay of a day that has them gets no section either."""
    store, reports = Store(tmp_path / "store"), tmp_path / "reports"
    write_logs(generate(SynthConfig(requests=60, seed=5, duration_s=600, date=EQUAL)), "vidur", tmp_path / "l.csv")
    night = nightly([tmp_path / "l.csv"], FLEET, store, EQUAL, reports, fmt="vidur", headroom_budget_s=0)
    assert night.headline["observed_compared"] is False and not night.headline["drift"]
    page = night.report.read_text()
    assert OBSERVED_TITLE not in page and "DRIFT" not in page and "DRIFT" not in night.line()


def test_no_section_for_a_what_if_run(nights: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    # a copy: a what-if run in the module's store would become the date's latest run for the others
    store = Store(shutil.copytree(nights["store"].root, tmp_path / "store"))
    res = replay(store, FLEET, ReplayOptions(date=EQUAL, rate_scale=2.0))
    rep = build_report(store, res.run_id, out=tmp_path / "what-if.html")
    assert rep.headline["observed_compared"] is False and not rep.headline["drift"]
    assert OBSERVED_TITLE not in rep.path.read_text()


def test_bad_input_is_counted_never_a_crash() -> None:
    """NaN, null and missing latencies are left out and counted; a run that matches nothing is
    one line; ids seen twice are left out."""
    t0 = pl.datetime(2025, 3, 1, 0, 30, time_zone="UTC")
    logged = pl.DataFrame(
        {
            "request_id": ["a", "b", "c", "d", "d"],
            "output_tokens": [10, 1, 10, 10, 10],
            "ttft_s": [0.2, 0.3, None, float("nan"), 0.1],
            "e2e_s": [1.1, 0.3, None, 1.0, 1.0],
        }
    ).with_columns(arrival=t0)
    replayed = pl.DataFrame(
        {
            "request_id": ["a", "b", "c", "d", "x"],
            "status": ["finished", "finished", "rejected", "finished", "finished"],
            "ttft_s": [0.1, 0.3, None, 0.1, 0.1],
            "tpot_s": [0.05, None, None, 0.1, 0.1],
        }
    )
    cmp = compare_observed(logged, replayed)
    assert (cmp.matched, cmp.unfinished, cmp.ambiguous_ids) == (3, 1, 1)
    ttft, tpot = cmp.day("ttft_s"), cmp.day("tpot_s")
    assert (ttft["samples"], ttft["not_compared"], ttft["observed_p50_s"], ttft["p50_error"]) == (2, 0, 0.2, -0.5)
    assert (tpot["samples"], tpot["not_compared"]) == (1, 1)  # b: a one-token output has no TPOT
    assert tpot["p50_error"] == pytest.approx(0.05 / 0.1 - 1)
    assert not cmp.drifted()  # two requests: too few to judge drift
    head = observed_headline(cmp)
    assert "1 of them rejected or unfinished" in head["observed_note"] and "more than once" in head["observed_note"]
    none = compare_observed(logged, replayed.with_columns(pl.lit("other").alias("request_id")))
    assert none.matched == 0 and all(r["samples"] == 0 and r["p50_error"] is None for r in none.rows)
    assert observed_headline(none)["observed_note"].startswith("no request of the run matches")


@pytest.mark.browser
def test_section_renders_in_headless_chromium_offline(nights: dict[str, Any], tmp_path: Path) -> None:
    dom = offline_dom(nights["reports"] / SCALED / "default" / "index.html", tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert [line for line in dom.stderr.splitlines() if ":CONSOLE" in line] == []
    html = dom.stdout
    section = html.split('<section id="predicted-vs-observed">')[1].split("</section>")[0]
    assert f"<h2>{OBSERVED_TITLE}</h2>" in section and "Trend over nights" in section
    assert "DRIFT: the replay is off the observed latencies" in section and "whole day" in section
    chart = section.split('id="chart-observed_trend"')[1]
    assert "<svg" in chart and re.search(r'class="mark-(line|symbol)', chart) and "chart failed" not in chart
