"""Hostile days for the nightly, the report, the index and ``sql``: quarantined rows, every request
rejected, what-if runs beside the nightly's report, a fleet that serves nothing, exit codes, SLO
wording and control characters in query output. Each failure must show where the user looks
first (the last terminal line, the top of the report, the index), with numbers people read."""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from pipeline.cli import main
from pipeline.ingest.store import Store
from pipeline.publish.nightly import _status
from pipeline.publish.report import (
    QUARANTINE_FLAG_SHARE,
    build_report,
    ingest_headline,
    overload_phrase,
    slo_phrase,
)
from pipeline.replay.slo import day_projection, traffic_span

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _nightly(log: Path, store: Path, reports: Path, date: str, *extra: str) -> Result:
    args = ["nightly", str(log), "--format", "vidur", "--date", date, "--fleet", str(FLEET)]
    return CliRunner().invoke(main, [*args, "--store", str(store), "--reports", str(reports), *extra])


def _top(page: str) -> str:
    """The report's text before its first chart: the title, the banner and the cards."""
    return html_lib.unescape(page[: page.index("<section")])


# --- 1. quarantined rows ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quarantined(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("qmix")
    log = root / "a.csv"
    log.write_text(VIDUR + "0,100,10\n1,-200,20\n2,abc,30\n3,400,1e30\n4,500,50\n")
    res = _nightly(log, root / "s", root / "r", "2025-02-20", "--headroom-budget", "0")
    return {"res": res, "root": root, "report": root / "r" / "2025-02-20" / "default"}


def test_quarantined_rows_reach_the_last_line_the_report_top_the_headline_and_the_index(
    quarantined: dict[str, Any],
) -> None:
    res, root, folder = quarantined["res"], quarantined["root"], quarantined["report"]
    assert "Traceback" not in res.output
    assert res.exit_code == 3, res.stderr  # 60 % quarantined: someone must look
    # the ingest accounting line, as `rooftrace ingest` prints it
    assert "5 rows read = 2 stored + 3 quarantined + 0 duplicates" in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("nightly 2025-02-20: run ") and "3 of 5 log rows (60.0%) quarantined" in last, last
    assert str((root / "s" / "quarantine").resolve()) in last and "ingest_accounting --date 2025-02-20" in last
    head = json.loads((folder / "headline.json").read_text())
    assert head["ingest_rows_read"] == 5 and head["ingest_rows_stored"] == 2
    assert head["ingest_rows_quarantined"] == 3 and head["ingest_rows_duplicate"] == 0
    assert head["quarantined_share"] == pytest.approx(0.6) and head["quarantine_flagged"] is True
    top = _top((folder / "index.html").read_text())
    assert "Every request finished" not in top
    assert "This day's logs need attention" in top and "3 of 5 log rows (60.0%) quarantined" in top
    assert 'href="#ingest-accounting"' in top
    assert re.search(r"<span>Log rows</span><b>2 of 5 stored</b><span>quarantined 3 \(60\.0%\)", top), top
    assert '<section id="ingest-accounting"><h2>Ingest accounting' in (folder / "index.html").read_text()
    index = (root / "r" / "index.html").read_text()
    assert '<td class="bad">3 of 5 log rows quarantined (60.0%)</td>' in index


def test_a_small_quarantined_share_is_mentioned_but_not_flagged(tmp_path: Path) -> None:
    rows = [{"kind": "file", "rows_read": 2000, "rows_stored": 1997, "rows_quarantined": 1, "rows_duplicate": 2}]
    h = ingest_headline(rows, tmp_path / "quarantine", "2025-01-01")
    assert h["quarantined_share"] == pytest.approx(0.0005) and h["quarantine_flagged"] is False
    assert h["ingest_note"].startswith("1 of 2,000 log rows (<0.1%) quarantined, not replayed; 2 duplicate log rows")
    assert "(the 1 log file with requests on 2025-01-01, all their days)" in h["ingest_note"]
    two = ingest_headline(rows * 2, tmp_path / "quarantine", "2025-01-01")["ingest_note"]
    assert two.startswith("2 of 4,000 log rows") and "(the 2 log files with requests on 2025-01-01" in two
    assert _status(h) == '<td class="warn">1 of 2,000 log rows quarantined (&lt;0.1%); 2 duplicate rows</td>'
    at = int(QUARANTINE_FLAG_SHARE * 2000)
    flagged = ingest_headline([{**rows[0], "rows_quarantined": at}], tmp_path, "2025-01-01")
    assert flagged["quarantine_flagged"] is True and _status(flagged).startswith('<td class="bad">20 of 2,000')
    assert ingest_headline([], tmp_path, "2025-01-01")["ingest_note"] is None


# --- 3, 4, 5, 6: every request rejected ---------------------------------------------------------


@pytest.fixture(scope="module")
def all_rejected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("allrej")
    log = root / "a.csv"
    log.write_text(VIDUR + "0,20000,10\n1,30000,20\n2.5,17000,5\n")  # all past max_model_len 16384
    res = _nightly(log, root / "s", root / "r", "2025-02-01")
    return {"res": res, "root": root, "store": root / "s", "reports": root / "r"}


def test_a_night_with_rejections_writes_its_report_and_exits_3(all_rejected: dict[str, Any]) -> None:
    res = all_rejected["res"]
    assert res.exit_code == 3 and "Traceback" not in res.output, res.output
    assert (all_rejected["reports"] / "2025-02-01" / "default" / "index.html").exists()
    assert "3 requests: 0 finished, 3 rejected" in res.stderr.strip().splitlines()[-1]


def test_png_of_a_run_with_nothing_to_draw_skips_the_empty_chart(all_rejected: dict[str, Any], tmp_path: Path) -> None:
    png = tmp_path / "png"
    args = ["report", "--store", str(all_rejected["store"]), "--reports", str(tmp_path / "r"), "--png", str(png)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    line = res.stderr.strip().splitlines()[-1]
    assert "not drawn as PNG: load_curve: No data to draw: no request finished" in line, line
    assert not (png / "load_curve.png").exists()
    drawn = sorted(p.name for p in png.glob("*.png"))
    assert "token_accounting.png" in drawn and all((png / n).read_bytes()[:4] == b"\x89PNG" for n in drawn)
    page = (tmp_path / "r" / "2025-02-01" / "default" / "index.html").read_text()
    assert '<p class="nodata" id="nodata-load_curve">No data to draw' in page
    assert '"chart-load_curve"' not in page  # no spec for Vega to fail on


def test_report_out_empty_is_one_error_line(all_rejected: dict[str, Any]) -> None:
    res = CliRunner().invoke(main, ["report", "--store", str(all_rejected["store"]), "--out", ""])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.stderr.startswith("error: --out '.' is empty or a folder, not a file name")
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["headline.json", "HEADLINE.JSON"])
def test_report_out_named_headline_json_is_refused(all_rejected: dict[str, Any], tmp_path: Path, name: str) -> None:
    """--out DIR/headline.json wrote the page, then replaced it with headline.json and said it had
    written the report (hostile round 13): refused before any work, nothing written."""
    out = tmp_path / "odd" / name
    res = CliRunner().invoke(main, ["report", "--store", str(all_rejected["store"]), "--out", str(out)])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "headline.json is the file written beside the report" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()


def test_report_png_to_a_device_is_refused_before_any_write(all_rejected: dict[str, Any], tmp_path: Path) -> None:
    """--png /dev/null failed only after the page and headline.json were written (round 13)."""
    out = tmp_path / "rep" / "p.html"
    res = CliRunner().invoke(
        main, ["report", "--store", str(all_rejected["store"]), "--png", "/dev/null", "--out", str(out)]
    )
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "--png /dev/null: /dev/null is a device, not a folder" in res.stderr
    assert not out.exists() and not (out.parent / "headline.json").exists()


def test_the_chart_bundle_is_built_when_the_store_cannot_cache_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only store: report crashed writing the vega bundle into STORE/.cache (round 13);
    the bundle is a cache, so the page is made without storing it."""
    import pipeline.publish.report as report_mod

    def read_only(path: Path, data: bytes) -> None:
        raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr(report_mod, "atomic_write_bytes", read_only)
    bundle = report_mod.vega_bundle(tmp_path / "ro" / ".cache")
    assert "vegaEmbed" in bundle and not (tmp_path / "ro").exists()


def test_a_few_seconds_of_traffic_are_not_projected_to_a_day(all_rejected: dict[str, Any]) -> None:
    page = html_lib.unescape((all_rejected["reports"] / "2025-02-01" / "default" / "index.html").read_text())
    assert "US$ over 2.5 s of traffic; not projected to a day" in page
    people = re.sub(r"<script>.*?</script>", "", page, flags=re.S).split("<h2>Run config")[0]  # not the raw config
    assert not re.search(r"\d[eE][+-]\d", people)
    assert day_projection(2.5) == "2.5 s of traffic; not projected to a day: too short a span to extrapolate from"
    assert day_projection(3600.0) == "1 h of traffic -> x24 per day"
    assert day_projection(3480.0).startswith("58 min of traffic; not projected")
    assert traffic_span(3 * 86400) == "3 days of traffic"


def test_overload_with_nothing_served_has_no_infinite_percentage() -> None:
    over = {
        "detected": True,
        "from_s": 0.0,
        "from_utc": "2025-01-15T00:01:46Z",
        "backlog_requests": 254,
        "arrival_rate_per_s": 80_428_840_956.29,
        "service_rate_per_s": 0.0,
        "excess": None,
        "drain_s": 30.1,
    }
    line = overload_phrase(over)
    # (hostile round 11 #8: not "nothing is served", which the requests served after the last
    # arrival contradicted; the phrase is the run's own overload line)
    assert line == (
        "OVERLOADED from 2025-01-15T00:01:46Z (+0.00 ms): 80,428,840,956.29 req/s arrive and none is admitted "
        "before the last arrival; 254 waiting at the last arrival, 30.10 s to drain"
    )
    from pipeline.publish.report import _health_cards

    card = next(c for c in _health_cards({"overload": over}) if c[0] == "Overload")
    assert card[2] == (
        "from 2025-01-15T00:01:46Z: 80,428,840,956 req/s arrive and none is admitted before the last arrival; "
        "254 waiting"
    )
    served = overload_phrase({**over, "service_rate_per_s": 2.0, "arrival_rate_per_s": 3.0})
    assert "(+50%)" in served and "inf" not in served


# --- 7. SLO wording -----------------------------------------------------------------------------


def test_slo_verdict_says_rejections_make_the_percentile_infinite() -> None:
    h = {
        "replayed_requests": 300,
        "finished": 255,
        "rejected": 45,
        "verdict": {
            "slo": "ttft_p99=0.001s",
            "passed": False,
            "goodput": 0.0,
            "requests": 300,
            "targets": [
                {"target": "ttft_p99", "limit_s": 0.001, "value_s": None, "met": False, "finished_value_s": 0.296},
                {"target": "tpot_p50", "limit_s": 0.1, "value_s": 0.02, "met": True, "finished_value_s": 0.02},
            ],
        },
    }
    assert slo_phrase(h) == (
        "SLO ttft_p99=0.001s: FAIL: ttft_p99 over all requests infinite > 1 ms (45 of 300 requests rejected, "
        "15.0%, count as never served; p99 of the 255 finished 296 ms); tpot_p50 20 ms <= 100 ms; goodput 0.0%"
    )
    none = {**h, "finished": 0, "rejected": 300}
    none["verdict"] = {**h["verdict"], "targets": [{**h["verdict"]["targets"][0], "finished_value_s": None}]}
    assert "300 of 300 requests rejected, 100.0%, count as never served; no request finished" in slo_phrase(none)


def test_nightly_slo_line_gives_the_finished_percentile(tmp_path: Path) -> None:
    log = tmp_path / "a.csv"
    log.write_text(VIDUR + "0,100,10\n1,200,20\n2,300,30\n3,20000,10\n")  # one of four past max_model_len
    res = _nightly(log, tmp_path / "s", tmp_path / "r", "2025-02-03", "--slo", "ttft_p99=1ms", "--headroom-budget",
                   "0", "--json")  # fmt: skip
    assert res.exit_code == 3, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "ttft_p99 over all requests infinite > 1 ms (1 of 4 requests rejected, 25.0%" in last, last
    assert "p99 of the 3 finished " in last and "never >" not in last
    assert not any("never >" in line for line in res.stderr.splitlines())  # the warning lines too
    doc = json.loads(res.stdout)
    assert doc["exit_code"] == 3 and "1 requests rejected" in doc["attention"]
    target = doc["headline"]["verdict"]["targets"][0]
    assert target["value_s"] is None and 0 < target["finished_value_s"] < 1


def test_a_healthy_night_exits_0(tmp_path: Path) -> None:
    log = tmp_path / "a.csv"
    log.write_text(VIDUR + "0,100,10\n1,200,20\n2,300,30\n")
    res = _nightly(log, tmp_path / "s", tmp_path / "r", "2025-02-04", "--headroom-budget", "0")
    assert res.exit_code == 0, res.stderr
    top = _top((tmp_path / "r" / "2025-02-04" / "default" / "index.html").read_text())
    assert "Every request finished, no overload." in top and "quarantined, not replayed" not in top
    assert '<div class="card good"><span>Log rows</span><b>3 of 3 stored</b><span>quarantined 0 (0%)' in top


# --- 2. what-if runs keep the nightly's report ----------------------------------------------------


def test_a_what_if_report_goes_beside_the_nightly_and_the_index_keeps_the_nightly(tmp_path: Path) -> None:
    from pipeline.replay.run import ReplayOptions, replay

    log = tmp_path / "a.csv"
    log.write_text(VIDUR + "".join(f"{i * 0.5},{100 + i},{10 + i % 7}\n" for i in range(40)))
    reports = tmp_path / "r"
    assert _nightly(log, tmp_path / "s", reports, "2025-02-05", "--headroom-budget", "0").exit_code == 0
    store = Store(tmp_path / "s")
    nightly_page = reports / "2025-02-05" / "default" / "index.html"
    before = nightly_page.read_bytes()
    nightly_head = json.loads((nightly_page.parent / "headline.json").read_text())
    assert nightly_head["published_by"] == "nightly"
    what_if = replay(store, FLEET, ReplayOptions(rate_scale=1e12, replicas=1))
    res = CliRunner().invoke(main, ["report", "--store", str(store.root), "--reports", str(reports),
                                    "--run", what_if.run_id])  # fmt: skip
    assert res.exit_code == 0, res.output
    out = reports / "2025-02-05" / "default" / "what-if" / what_if.run_id / "index.html"
    assert out.exists() and nightly_page.read_bytes() == before
    assert "what-if run (rate scale 1,000,000,000,000, replicas 1)" in res.stderr
    assert json.loads((out.parent / "headline.json").read_text())["what_if"] == {"rate_scale": 1e12, "replicas": 1}
    index = (reports / "index.html").read_text()
    first = index[: index.index("What-if runs")]
    assert 'href="2025-02-05/default/index.html"' in first and what_if.run_id not in first
    assert f'href="2025-02-05/default/what-if/{what_if.run_id}/index.html"' in index
    assert "rate scale 1,000,000,000,000, replicas 1" in index
    # a run with the nightly's options but another fleet file of the same name: not the nightly's either
    other = tmp_path / "bigger.toml"
    other.write_text(FLEET.read_text().replace("replicas = 2", "replicas = 3"))
    plain = replay(store, other, ReplayOptions())
    again = build_report(store, plain.run_id, reports_dir=reports)
    assert again.path.parent.name == plain.run_id and "not the nightly's run" in (again.placement or "")
    # the nightly's own run, reported again, stays in place and stays the nightly's
    refreshed = build_report(store, nightly_head["run_id"], reports_dir=reports)
    assert refreshed.path == nightly_page and refreshed.placement is None
    assert json.loads((nightly_page.parent / "headline.json").read_text())["published_by"] == "nightly"
    # the nightly's own run re-judged against an SLO by `replay --slo`: a what-if, the page kept
    before = nightly_page.read_bytes()
    res = CliRunner().invoke(main, ["replay", "--store", str(store.root), "--fleet", str(FLEET), "--date",
                                    "2025-02-05", "--slo", "interactive", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    judged = json.loads(res.stdout)["run_id"]
    assert judged == nightly_head["run_id"]  # the SLO is not part of the run id
    slo_report = build_report(store, judged, reports_dir=reports)
    assert slo_report.path.parent.name == judged and "slo interactive" in (slo_report.placement or "")
    assert nightly_page.read_bytes() == before


def test_a_small_quarantine_is_in_the_banner_of_a_run_with_failures(tmp_path: Path) -> None:
    """The note on a small (unflagged) quarantined share was shown only under a green banner: a
    night with rejections dropped it from the report's top."""
    rows = "".join(f"{t},{100 + t},10\n" for t in range(148))
    log = tmp_path / "a.csv"
    log.write_text(VIDUR + rows + "148,20000,10\n149,abc,10\n")  # one too long, one unreadable
    res = _nightly(log, tmp_path / "s", tmp_path / "r", "2025-02-21", "--headroom-budget", "0")
    assert res.exit_code == 3, res.output  # the rejection
    top = _top((tmp_path / "r" / "2025-02-21" / "default" / "index.html").read_text())
    assert "This run has failures" in top
    banner = top[top.index("This run has failures") :]
    assert "1 of 150 log rows (0.7%) quarantined" in banner[: banner.index("</ul>")]
