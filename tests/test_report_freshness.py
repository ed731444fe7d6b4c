"""A stale classify shown as the day's truth (hostile case): 300 requests ingested and classified,
300 more of the same date ingested after, then replay and report. The replay replays 600; the
token accounting covers 300. The report must say so on its first line, with both counts, and the
library function (pipeline/classify/freshness.py) must tell any other caller the same."""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path

import pytest
from cli_checks import cli

from pipeline.classify.accounting import classify_tokens
from pipeline.classify.freshness import ClassifyFreshness, classify_freshness
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.publish.nightly import _status
from pipeline.publish.report import build_report
from pipeline.replay.run import replay
from pipeline.synth import SynthConfig, generate, write_logs

DAY = "2025-01-15"


def _log(root: Path, seed: int) -> Path:
    frame = generate(SynthConfig(requests=300, seed=seed, date=DAY, duration_s=600.0, tenants=2,
                                 models=("llama-3.1-8b",)))  # fmt: skip
    out = root / f"part-{seed}.jsonl"
    write_logs(frame, "openai", out)
    return out


@pytest.fixture(scope="module")
def stale(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, str, Path]:
    root = tmp_path_factory.mktemp("stale-classify")
    store = Store(root / "store")
    ingest_logs([_log(root, 1)], store)
    classify_tokens(store, DAY)
    ingest_logs([_log(root, 2)], store)  # the same date, after classify
    run = replay(store, None).run_id
    return store, run, root


def test_the_library_says_the_accounting_predates_the_requests(stale: tuple[Store, str, Path]) -> None:
    store, _, _ = stale
    fresh = classify_freshness(store, DAY)
    assert (fresh.classified_requests, fresh.store_requests, fresh.stale) == (300, 600, True)
    note = fresh.note(store.root)
    assert note is not None and note.startswith(
        f"STALE CLASSIFY: the token accounting of {DAY} predates its requests: it covers 300 requests, "
        "the store holds 600 of the date now"
    )
    assert f"rooftrace classify --store {store.root} --date {DAY}" in note


def test_the_report_says_so_on_its_first_line(stale: tuple[Store, str, Path]) -> None:
    store, run, root = stale
    res = build_report(store, run, out=root / "report" / "index.html")
    h = res.headline
    assert h["replayed_requests"] == 600 and h["classified_requests"] == 300 and h["store_requests"] == 600
    assert h["classify_stale"] is True and h["stale"] is False  # the run itself is current
    page = html_lib.unescape(res.path.read_text())
    banner = page[page.index('<div class="alert">') : page.index('<div class="cards">')]
    first = re.search(r"<b>(.*?)</b>", banner)
    assert first is not None and first.group(1) == (
        "This report's token accounting is STALE: classify ran before some of its date's requests were ingested"
    )
    items = re.findall(r"<li>(.*?)</li>", banner, re.S)
    assert items[0].startswith(f"STALE CLASSIFY: the token accounting of {DAY} predates its requests: it covers 300")
    # the Input tokens card names both counts and is red
    card_re = r'<div class="card bad"><span>Input tokens \(STALE classify\)</span><b>(.*?)</b><span>(.*?)</span>'
    card = re.search(card_re, page)
    assert card is not None and "of the 300 requests classify saw; the store holds 600 of the date now" in card.group(2)
    assert res.warning_lines()[0].startswith("STALE CLASSIFY:")
    # and the reports index's failures cell, red, before anything else
    assert _status(h).startswith('<td class="bad">STALE classify (300 of 600 requests)')
    assert "needs attention: STALE classify: it covers 300 requests of the date, the store holds 600" in res.line()


def test_classify_again_and_the_report_agrees_with_the_run(stale: tuple[Store, str, Path]) -> None:
    import shutil

    shared, run, root = stale
    # a copy: the module's store stays stale for the other tests, whatever order they run in
    store = Store(shutil.copytree(shared.root, root / "classified-again" / "store"))
    classify_tokens(store, DAY)
    assert classify_freshness(store, DAY).stale is False
    res = build_report(store, run, out=root / "classified-again" / "report" / "index.html")
    h = res.headline
    assert h["classify_stale"] is False and h["classify_stale_note"] is None
    assert h["requests"] == h["replayed_requests"] == 600  # token_totals now covers the run's day
    assert "STALE" not in res.path.read_text()


def test_same_count_other_ids_and_never_classified() -> None:
    other = ClassifyFreshness(DAY, 300, 300, other_ids=True)
    assert other.stale and "its 300 requests are not the 300 the store holds now" in str(other.note())
    never = ClassifyFreshness(DAY, None, 300)
    assert not never.stale and not never.classified and never.note() is None
    assert not ClassifyFreshness(DAY, 300, 300).stale


def test_a_warm_up_run_is_not_called_stale(tmp_path: Path) -> None:
    """A closed loop with --warmup replayed every request, but report compared only the measured
    ones with the store's count and called the run STALE."""
    from tests.test_replay import ROOT, _sample_store

    small, _ = _sample_store(tmp_path, 120)
    fleet = str(ROOT / "fleets" / "default.toml")
    res = cli("replay", "--store", str(small.root), "--fleet", fleet, "--concurrency", "4", "--warmup", "10", "--json")
    assert res.exit_code == 0, res.output
    run_id = json.loads(res.stdout)["run_id"]
    rep = cli("report", "--store", str(small.root), "--run", run_id, "--out", str(tmp_path / "r.html"))
    assert rep.exit_code in (0, 3), rep.output
    assert "STALE" not in rep.stderr, rep.stderr
