"""The nightly job: end to end, idempotent, and a failed stage named with earlier outputs kept."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.ingest.store import Store
from pipeline.publish.nightly import NightlyResult, StageError, nightly
from pipeline.synth import SynthConfig, generate, write_logs

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"


def _digest(root: Path, pattern: str) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.glob(pattern))}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nightly-logs")
    write_logs(
        generate(SynthConfig(requests=250, seed=21, duration_s=600, date="2025-02-01")), "anthropic", root / "a.jsonl"
    )
    return root


def test_nightly_end_to_end_and_rerun_is_identical(logs: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    reports = tmp_path / "reports"
    first = nightly([logs], FLEET, store, reports_dir=reports)
    assert first.date == "2025-02-01"
    assert first.report == reports / "2025-02-01" / "default" / "index.html" and first.report.exists()
    assert (reports / "index.html").exists()
    assert set(first.stages) == {"ingest", "classify", "replay", "headroom", "cost", "warehouse", "report", "index"}
    assert first.headline["requests"] == 250
    page = first.report.read_text()
    assert "API-equivalent cost" in page and "GPU cost by token class" in page  # the cost stage's tables
    parquet = _digest(store.root, "**/*.parquet")
    second = nightly([logs], FLEET, store, reports_dir=reports)
    assert second.run_id == first.run_id
    assert _digest(store.root, "**/*.parquet") == parquet, "a re-run rewrites the same bytes"
    index = (reports / "index.html").read_text()
    assert index.count('href="2025-02-01/default/index.html"') == 1
    head = json.loads((reports / "2025-02-01" / "default" / "headline.json").read_text())
    assert head["run_id"] == first.run_id


def test_failed_stage_is_named_and_earlier_outputs_kept(logs: Path, tmp_path: Path) -> None:
    """A bad fleet is refused before anything runs (it used to fail the replay stage after
    ingest and classify had run); a stage that fails later is named, and what ran before stays."""
    bad = tmp_path / "bad.toml"
    bad.write_text(
        FLEET.read_text().replace('router = "least_outstanding"', 'router = "least_outstanding"\nturbo = true')
    )
    store = Store(tmp_path / "store")
    runner = CliRunner()
    res = runner.invoke(main, ["nightly", str(logs), "--fleet", str(bad), "--store", str(store.root)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: unknown key(s) ['turbo']"), res.stderr
    assert not store.root.exists()
    with pytest.raises(StageError, match=r"stage replay failed .*nonsense"):
        nightly([logs], FLEET, store, reports_dir=tmp_path / "reports", slo="nonsense")
    assert store.dates() == ["2025-02-01"]
    assert list(store.accounting_dir.glob("requests/date=2025-02-01/*.parquet"))
    assert not (tmp_path / "reports").exists()


def test_reports_are_scoped_to_their_run_fleet_and_store(logs: Path, tmp_path: Path) -> None:
    """A second date's report shows neither the first date's plan nor its files; two fleets on
    one date both keep their reports; another store's report is never overwritten; the index
    keeps one trend per fleet and store."""
    from pipeline.plan import PlanOptions, plan
    from pipeline.synth import SynthConfig, generate, write_logs

    reports = tmp_path / "reports"
    store = Store(tmp_path / "store")
    day2 = tmp_path / "day2"
    write_logs(
        generate(SynthConfig(requests=120, seed=9, duration_s=600, date="2025-02-02")), "anthropic", day2 / "b.jsonl"
    )
    first = nightly([logs], FLEET, store, reports_dir=reports, headroom_budget_s=0)
    long = tmp_path / "long.toml"
    long.write_text(FLEET.read_text().replace("max_model_len = 16384", "max_model_len = 131072"))
    plan(
        store,
        PlanOptions(
            model="llama-3.1-8b",
            slo="batch",
            fleet_path=str(long),
            hardware=("h100-sxm",),
            tp=(1,),
            traffic_model="*",
            window="day",
            jobs=1,
            max_rejected=1.0,
        ),
    )
    second = nightly([day2], FLEET, store, reports_dir=reports, headroom_budget_s=0)
    assert first.date == "2025-02-01" and second.date == "2025-02-02"
    page2 = second.report.read_text()
    assert "Capacity plan" not in page2  # the plan was made for 2025-02-01's traffic
    assert "a.jsonl" not in page2 and "b.jsonl" in page2  # only its own day's files
    # rebuilding the first date's report shows the plan made for it
    from pipeline.publish.report import build_report

    again = build_report(store, first.run_id, reports_dir=reports)
    assert again.path == first.report and "Capacity plan" in again.path.read_text()
    # a second fleet on the same date keeps its own report
    other = tmp_path / "other.toml"
    other.write_text(FLEET.read_text().replace('name = "default"', 'name = "other"'))
    third = nightly([logs], other, store, date="2025-02-01", reports_dir=reports, headroom_budget_s=0)
    assert third.report == reports / "2025-02-01" / "other" / "index.html"
    assert first.report.exists() and third.report.exists()
    # another store may not overwrite those reports
    store_b = Store(tmp_path / "store-b")
    with pytest.raises(StageError, match="holds the report made from store"):
        nightly([logs], FLEET, store_b, reports_dir=reports, headroom_budget_s=0)
    assert json.loads((first.report.parent / "headline.json").read_text())["store"] == str(store.root.resolve())
    # the index: one group per fleet and store, never one trend across them
    index = (reports / "index.html").read_text()
    assert "default · store" in index and "other · store" in index
    assert 'href="2025-02-01/other/index.html"' in index


def test_report_paths_from_data_are_confined(tmp_path: Path) -> None:
    """A run id from the command line, and the date and fleet name read from a run's config.json,
    never lead outside the store or the reports folder."""
    from pipeline.common.errors import RooftraceError
    from pipeline.publish.report import build_report, report_path

    store = Store(tmp_path / "store")
    with pytest.raises(RooftraceError, match="not a safe name"):
        build_report(store, "../../x")
    reports = tmp_path / "reports"
    assert report_path(reports, "2025-01-02", "fleet-a") == reports / "2025-01-02" / "fleet-a" / "index.html"
    for date, fleet in (("../../etc", "a"), ("2025-01-02", "../../x"), ("2025-01-02", "<script>")):
        with pytest.raises(RooftraceError):
            report_path(reports, date, fleet)
    assert not (tmp_path / "x").exists() and not (tmp_path / "etc").exists()


def test_a_nightly_reports_on_the_day_its_logs_hold_not_the_stragglers(tmp_path: Path) -> None:
    """A day's log whose last requests arrive after midnight used to make the nightly report on
    those few (the newest date); it now takes the date the logs hold most requests of, says which
    others they hold, and picks the same one again on a re-run that skips the file."""
    import polars as pl

    frame = generate(SynthConfig(requests=150, seed=4, duration_s=600, date="2025-02-01"))
    last = frame["arrival"].max()
    late = frame.tail(3).with_columns(
        arrival=pl.lit(last) + pl.duration(days=1), request_id=pl.Series([f"late-{i}" for i in range(3)])
    )
    write_logs(pl.concat([frame, late]), "openai", tmp_path / "day.jsonl")
    store = Store(tmp_path / "store")
    said: list[str] = []
    first = nightly([tmp_path / "day.jsonl"], FLEET, store, reports_dir=tmp_path / "r", headroom_budget_s=0,
                    progress=said.append)  # fmt: skip
    assert store.dates() == ["2025-02-01", "2025-02-02"]
    assert first.date == "2025-02-01"
    assert any("reporting on 2025-02-01 (150 requests)" in m and "2025-02-02 (3 requests)" in m for m in said), said
    again = nightly([tmp_path / "day.jsonl"], FLEET, store, reports_dir=tmp_path / "r", headroom_budget_s=0)
    assert again.date == "2025-02-01" and again.run_id == first.run_id


def test_a_nightly_whose_log_starts_before_midnight_reports_on_its_own_day(tmp_path: Path) -> None:
    """Night 1 stores 200 requests on 02-01; night 2's log holds 5 more of 02-01 and 150 of 02-02.
    Ranked by the store's rows, night 2 reported on 02-01 again (205 requests); it reports on the
    day its own log holds most of, and a re-run of it (the file skipped) picks the same."""
    import polars as pl

    first = generate(SynthConfig(requests=200, seed=5, duration_s=600, date="2025-02-01"))
    second = generate(SynthConfig(requests=150, seed=6, duration_s=600, date="2025-02-02"))
    early = first.tail(5).with_columns(
        arrival=pl.col("arrival") + pl.duration(minutes=1), request_id=pl.Series([f"early-{i}" for i in range(5)])
    )
    write_logs(first, "openai", tmp_path / "n1.jsonl")
    write_logs(pl.concat([early, second]), "openai", tmp_path / "n2.jsonl")
    store = Store(tmp_path / "store")
    kw = {"reports_dir": tmp_path / "r", "headroom_budget_s": 0}
    assert nightly([tmp_path / "n1.jsonl"], FLEET, store, **kw).date == "2025-02-01"
    said: list[str] = []
    night2 = nightly([tmp_path / "n2.jsonl"], FLEET, store, progress=said.append, **kw)
    assert night2.date == "2025-02-02"
    assert any("reporting on 2025-02-02 (150 requests)" in m and "2025-02-01 (5 requests)" in m for m in said), said
    assert nightly([tmp_path / "n2.jsonl"], FLEET, store, **kw).date == "2025-02-02"


def test_the_nightly_line_says_multi_node_and_model_mix() -> None:
    wide = (
        "MULTI-NODE: each replica spans 2 nodes (tp 8 × pp 1 × dp 2 = 16 h100-sxm GPUs, 8 per node), but its "
        "cross-node communication is priced as within one nvlink4 node: latencies are optimistic"
    )
    mix = "MODEL MIX: 10 of 20 requests (50%) were logged for other models (x: 10) and are replayed as y; a fleet"
    res = NightlyResult("2025-01-15", "r", Path("r.html"), Path("i.html"), {"warnings": [wide, mix]})
    line = res.line()
    assert (
        "; MULTI-NODE: each replica spans 2 nodes (tp 8 × pp 1 × dp 2 = 16 h100-sxm GPUs, 8 per node), "
        "priced as one node (latencies optimistic); "
    ) in line
    assert "; MODEL MIX: 10 of 20 requests (50%) were logged for other models (x: 10) and are replayed as y; " in line
