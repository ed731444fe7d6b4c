"""The period cost and report price (cost and report): one period for cost and report (an overloaded run is priced
over its makespan and its unit costs are marked not valid), utilization from time not dollars, a
STALE run (its date's requests changed in the store since it ran), GPUs per replica = tp x pp x dp
in the report's header, a stale API price said in text, and `report --out` paths that cannot be."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.common.errors import RooftraceError
from pipeline.economics.cost import (
    PERIOD_ARRIVALS,
    PERIOD_MAKESPAN,
    GpuCost,
    Period,
    TokenTotals,
    run_cost,
    run_overload_sustained,
    run_period,
)
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.publish.report import build_report, fleet_text, stale_headline
from pipeline.replay.run import ReplayOptions, replay
from pipeline.synth import SynthConfig, generate, write_logs

ROOT = Path(__file__).resolve().parents[1]
DAY = "2025-01-15"
H100_USD_PER_GPU_HOUR = 4.76  # pipeline/catalog/hardware: h100-sxm's dated on-demand price

#: One H100 that runs one sequence at a time: ten times the synthetic day's rate overloads it.
ONE_AT_A_TIME = 'name = "mns1"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n[engine]\nmax_num_seqs = 1\n'

STALE_PRICE = """provider = "x"
unit = "usd_per_million_tokens"
source = "s"
[models.m]
input = 1.0
cached_input = 0.5
cache_write = 1.0
output = 2.0
date = "1900-01-01"
source = "s"
"""


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(main, args)


def _logs(base: Path, seed: int, requests: int = 200) -> Path:
    frame = generate(SynthConfig(requests=requests, seed=seed, models=("llama-3.1-8b",), duration_s=120, diurnal=False))
    return write_logs(frame, "anthropic", base / f"day-{seed}.jsonl")


def _spans(run_dir: Path) -> tuple[float, float, float]:
    """(arrival span, makespan, busy seconds of all ranks) read straight from the run's tables."""
    req = pq.read_table(run_dir / "requests.parquet", columns=["arrival_s", "finish_s", "status"])
    arrival = req.column("arrival_s").to_numpy()
    ok = np.asarray(req.column("status").to_pylist()) == "finished"
    finish = req.column("finish_s").to_numpy()[ok]
    steps = pq.read_table(run_dir / "steps.parquet", columns=["start_s", "end_s"])
    busy = float((steps.column("end_s").to_numpy() - steps.column("start_s").to_numpy()).sum())
    return float(arrival.max() - arrival.min()), float(finish.max() - arrival.min()), busy


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("h9")
    store = Store(base / "store")
    ingest_logs(_logs(base, 1), store)
    normal = replay(store, ROOT / "fleets" / "default.toml", ReplayOptions())
    fleet = base / "mns1.toml"
    fleet.write_text(ONE_AT_A_TIME)
    over = replay(store, fleet, ReplayOptions(rate_scale=10.0))
    return {"base": base, "store": store, "normal": normal, "over": over}


def _own(runs: dict[str, Any], tmp_path: Path) -> Store:
    """A copy of the module's store for a test that runs `cost` or `report` (both write into the
    store: costs/, the chart cache): what one test costs must not be what another one reports."""
    return Store(shutil.copytree(runs["store"].root, tmp_path / "store", symlinks=True))


# -- 1. one period: the makespan of a fleet that fell behind ----------------------------------------


def test_run_period_hand_computed() -> None:
    # arrivals over 100 s; rank 0 busy 200 + 190 = 390 s > 100 s: the GPUs were needed until the
    # last finish at 400 s, whether or not the overload rule fired
    behind = run_period(
        [0.0, 10.0, 100.0], [50.0, 110.0, 400.0], [0, 0, 1], [0.0, 210.0, 0.0], [200.0, 400.0, 50.0], False
    )
    assert behind.basis == PERIOD_MAKESPAN and behind.seconds == 400.0
    assert behind.arrival_span_s == 100.0 and behind.busiest_rank_busy_s == 390.0
    assert not behind.unit_costs_valid and behind.unit_costs_flag == "fleet fell behind: not valid"
    assert "serving 1.67 min of arrivals took 6.67 min (the GPU time priced)" in str(behind.unit_costs_note)
    assert "not projected to a day" in behind.day_projection
    # 2 GPUs at $3/GPU-h over the 400 s makespan: 2 x 3 x 400 / 3600 = $0.6667 (was $0.1667 over the arrivals)
    g = GpuCost("h100-sxm", 2, 3.0, "2026-03", behind.seconds, 590.0, {"output": 1.0}, TokenTotals(0, 0, 1e6))
    assert g.total_usd == pytest.approx(2 * 3.0 * 400 / 3600)
    assert g.utilization == pytest.approx(590.0 / 800.0)
    # a fleet that keeps up: the arrival span, even though the last answer ends 2 s after the last arrival
    ok = run_period([0.0, 100.0], [30.0, 102.0], [0, 1], [0.0, 5.0], [90.0, 102.0], False)
    assert ok.basis == PERIOD_ARRIVALS and ok.seconds == 100.0 and ok.makespan_s == 102.0
    assert ok.busiest_rank_busy_s == 97.0
    assert ok.unit_costs_valid and ok.unit_costs_note is None and ok.text == "1.67 min of traffic"
    # overloaded by the run's own rule: the makespan, and said OVERLOADED
    over = run_period([0.0, 100.0], [30.0, 160.0], [0], [0.0], [95.0], True)
    assert over.basis == PERIOD_MAKESPAN and over.seconds == 160.0
    assert over.unit_costs_flag == "OVERLOADED: not valid"
    assert str(over.unit_costs_note).startswith("OVERLOADED run: $ per token and self-host/API ratios are not valid")


def test_cost_of_an_overloaded_run_prices_its_makespan(runs: dict[str, Any], tmp_path: Path) -> None:
    store, over = _own(runs, tmp_path), runs["over"]
    assert over.summary["health"]["overload"]["detected"]
    span, makespan, busy = _spans(over.run_dir)
    assert makespan > 4 * span  # one sequence at a time: the queue takes minutes to drain
    res = _invoke(["cost", "--store", str(store.root), "--run", over.run_id, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["period_basis"] == "makespan" and doc["period_s"] == pytest.approx(makespan, rel=1e-9)
    assert doc["arrival_span_s"] == pytest.approx(span, rel=1e-9)
    # 1 GPU x $4.76/GPU-h x the makespan, not the arrival span
    assert doc["total_usd"] == pytest.approx(H100_USD_PER_GPU_HOUR * makespan / 3600, rel=1e-9)
    assert doc["total_usd"] > 4 * H100_USD_PER_GPU_HOUR * span / 3600
    assert doc["utilization"] == pytest.approx(busy / makespan, rel=1e-9)
    assert doc["overloaded"] is True and doc["unit_costs_valid"] is False
    assert all(r["unit_cost_valid"] is False for r in doc["token_classes"])
    assert doc["api_equivalent"] and all(a["self_host_to_api_ratio_valid"] is False for a in doc["api_equivalent"])
    assert all(a["self_host_usd"] == pytest.approx(doc["total_usd"]) for a in doc["api_equivalent"])
    text = _invoke(["cost", "--store", str(store.root), "--run", over.run_id])
    lines = text.stdout.splitlines()
    assert lines[1].startswith("OVERLOADED run: $ per token and self-host/API ratios are not valid unit costs")
    assert f"${doc['total_usd']:,.2f} over " in lines[2] and "makespan (first arrival to last finish)" in lines[2]
    priced = [ln for ln in lines if "/M all-in" in ln or ("self-host/API" in ln and ln.startswith("  vs "))]
    assert priced and all(ln.endswith("(OVERLOADED: not valid)") for ln in priced)
    # the run's warnings stay what the replay said (the note is on stdout, with the figures)
    assert [ln for ln in text.stderr.splitlines() if ln.startswith("warning: ")] == [
        f"warning: {w}" for w in over.summary["health"]["warnings"]
    ]


def test_report_states_the_cost_period_and_marks_overloaded_unit_costs(runs: dict[str, Any], tmp_path: Path) -> None:
    store, over = _own(runs, tmp_path), runs["over"]
    cost = run_cost(store, over.run_id).to_dict()
    out = tmp_path / "over" / "index.html"
    res = _invoke(["report", "--store", str(store.root), "--run", over.run_id, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "warning: OVERLOADED run: $ per token" in res.stderr
    h = json.loads(out.with_name("headline.json").read_text())
    _, makespan, _ = _spans(over.run_dir)
    assert h["cost_period_s"] == pytest.approx(makespan, rel=1e-9) == pytest.approx(cost["period_s"], rel=1e-9)
    tokens = over.summary["recorded_input_tokens"] + over.summary["output_tokens"]
    # the same $ as `cost`: $4.76 x makespan / 3600 over the finished requests' tokens
    per_million = H100_USD_PER_GPU_HOUR * makespan / 3600 / (tokens / 1e6)
    assert h["usd_per_million_tokens"] == pytest.approx(per_million, rel=1e-9)
    assert h["usd_per_million_tokens"] == pytest.approx(cost["total_usd"] / (tokens / 1e6), rel=1e-9)
    assert h["unit_costs_valid"] is False and h["unit_costs_flag"] == "OVERLOADED: not valid"
    page = out.read_text()
    banner = page[page.index('<div class="alert">') : page.index('<div class="cards">')]
    assert "OVERLOADED from" in banner and "$ per token and self-host/API ratios are not valid" in banner
    cost_table = page[page.index("<h2>Cost (US$ over ") :]
    assert cost_table.count("(OVERLOADED: not valid)") >= 4  # every $ per million of the Cost table
    api = page[page.index("<h2>API-equivalent cost (US$ over ") :]
    assert api[: api.index("</table>")].count("(OVERLOADED: not valid)") == len(cost["api_equivalent"])
    assert f"{_fmt_dollars(per_million)} (OVERLOADED: not valid)" in page  # the $ per million tokens card


def _fmt_dollars(x: float) -> str:
    return f"${x:,.2f}"


# -- 2. utilization from time -----------------------------------------------------------------------


def test_utilization_is_busy_over_total_gpu_seconds_at_any_price(runs: dict[str, Any], tmp_path: Path) -> None:
    store, normal = _own(runs, tmp_path), runs["normal"]
    span, _, busy = _spans(normal.run_dir)
    docs = []
    for extra in ([], ["--gpu-price", "0"]):
        res = _invoke(["cost", "--store", str(store.root), "--run", normal.run_id, "--json", *extra])
        assert res.exit_code == 0, res.output
        docs.append(json.loads(res.stdout))
    catalog, free = docs
    assert catalog["period_basis"] == "arrivals" and catalog["period_s"] == pytest.approx(span, rel=1e-9)
    # 2 GPUs (2 replicas of tp 1) over the arrival span
    assert free["utilization"] == pytest.approx(busy / (2 * span), rel=1e-9) == catalog["utilization"]
    assert 0 < free["utilization"] < 1 and free["total_usd"] == 0.0
    text = _invoke(["cost", "--store", str(store.root), "--run", normal.run_id, "--gpu-price", "0"]).stdout
    assert f"busy {busy / (2 * span):.0%} of the time" in text and "not valid" not in text
    g = GpuCost("h100-sxm", 2, 0.0, "override", 1800.0, 1800.0, {}, TokenTotals(0, 0, 0))
    assert g.utilization == pytest.approx(0.5)


# -- 3. a STALE run -------------------------------------------------------------------------------------


def test_report_of_a_run_whose_date_grew_says_stale(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    ingest_logs(_logs(tmp_path, 1), store)
    run = replay(store, ROOT / "fleets" / "default.toml", ReplayOptions())
    assert run.summary["requests"] == 200
    ingest_logs(_logs(tmp_path, 2), store)  # more logs of the same date, after the run
    assert store.stored_rows(DAY) == 400
    out = tmp_path / "r" / "index.html"
    res = _invoke(["report", "--store", str(store.root), "--run", run.run_id, "--out", str(out)])
    assert res.exit_code == 0, res.output  # the report did what it was asked (docs/reports.md)
    err = res.stderr.splitlines()
    assert err[0].startswith(f"warning: STALE: this run replayed 200 requests of {DAY}; the store now holds 400")
    assert "rooftrace replay" in err[0] and f"--date {DAY}" in err[0]
    assert "needs attention: STALE run: it replayed 200, the store now holds 400 requests of the date" in err[-1]
    h = json.loads(out.with_name("headline.json").read_text())
    assert h["stale"] is True and h["store_requests"] == 400 and h["replayed_requests"] == 200
    assert h["classify_requests"] == h["requests"]  # (classify was not run: nothing of the store's mixed in)
    page = out.read_text()
    banner = page[page.index('<div class="alert">') : page.index('<div class="cards">')]
    # first in the banner (above the run's own failures: 57 of its 200 requests were too long)
    assert banner.index("<li>STALE: this run replayed 200 requests") < banner.index("<li>200 requests: ")
    cards = page[page.index('<div class="cards">') :]
    assert cards.index("<b>STALE</b>") < cards.index("Served (this run)")
    assert "(the store holds 400 now)" in cards


def test_same_count_other_requests_is_stale_too(runs: dict[str, Any], tmp_path: Path) -> None:
    normal = runs["normal"]
    config = json.loads((normal.run_dir / "config.json").read_text())
    same = stale_headline(runs["store"], DAY, config, normal.run_dir)
    assert same == {"stale": False, "stale_note": None, "store_requests": 200}
    other = Store(tmp_path / "store")
    ingest_logs(_logs(tmp_path, 3), other)  # 200 requests of the date, other request ids
    assert other.stored_rows(DAY) == 200
    shutil.copytree(normal.run_dir, other.run_dir(normal.run_id))
    h = stale_headline(other, DAY, config, other.run_dir(normal.run_id))
    assert h["stale"] is True and h["store_requests"] == 200
    assert "are not the 200 this run replayed (same count, other request ids)" in h["stale_note"]


# -- 4. GPUs per replica = tp x pp x dp --------------------------------------------------------------


def test_report_header_counts_every_gpu_of_a_replica() -> None:
    def cfg(tp: int, pp: int, dp: int, replicas: int, per: int | None) -> dict[str, Any]:
        fleet = {"model": "qwen3-30b-a3b", "hardware": "h100-sxm", "tp": tp, "pp": pp, "dp": dp, "replicas": replicas}
        return {"resolved": {"fleet": fleet, **({"gpus_per_replica": per} if per is not None else {})}}

    assert fleet_text(cfg(1, 1, 64, 1, 64)) == "1× qwen3-30b-a3b, each on 64× h100-sxm (tp 1 × pp 1 × dp 64; 64 GPUs)"
    assert fleet_text(cfg(1, 2, 1, 1, 2)) == "1× qwen3-30b-a3b, each on 2× h100-sxm (tp 1 × pp 2 × dp 1; 2 GPUs)"
    # a run that did not record gpus_per_replica: tp x pp x dp of its fleet
    assert fleet_text(cfg(2, 2, 2, 3, None)) == "3× qwen3-30b-a3b, each on 8× h100-sxm (tp 2 × pp 2 × dp 2; 24 GPUs)"
    assert fleet_text(cfg(1, 1, 1, 2, 1)) == "2× qwen3-30b-a3b, each on 1× h100-sxm (2 GPUs)"


# -- 5. a stale price in text; --out paths that cannot be written ------------------------------------


def test_stale_price_is_said_in_text_and_in_the_report(runs: dict[str, Any], tmp_path: Path) -> None:
    store, normal, base = _own(runs, tmp_path), runs["normal"], tmp_path
    prices = base / "old.toml"
    prices.write_text(STALE_PRICE)
    res = _invoke(["cost", "--store", str(store.root), "--run", normal.run_id, "--prices", str(prices)])
    assert res.exit_code == 0, res.output
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("  vs x/m")]
    assert line.startswith("  vs x/m (1900-01-01, STALE price: checked over 365 days ago): API $")
    out = base / "normal" / "index.html"
    assert _invoke(["report", "--store", str(store.root), "--run", normal.run_id, "--out", str(out)]).exit_code == 0
    page = out.read_text()
    assert "1900-01-01 (STALE: checked over 365 days ago)" in page
    h = json.loads(out.with_name("headline.json").read_text())
    span, _, _ = _spans(normal.run_dir)
    assert h["cost_period_basis"] == "arrivals" and h["cost_period_s"] == pytest.approx(span, rel=1e-9)
    tokens = normal.summary["recorded_input_tokens"] + normal.summary["output_tokens"]
    assert h["usd_per_million_tokens"] == pytest.approx(2 * H100_USD_PER_GPU_HOUR * span / 3600 / (tokens / 1e6))
    assert h["unit_costs_valid"] is True and "not valid" not in page
    assert "2× llama-3.1-8b, each on 1× h100-sxm (2 GPUs)" in page


def test_report_out_paths_that_cannot_be(runs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, normal = runs["store"], runs["normal"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    base = ["report", "--store", str(store.root), "--run", normal.run_id, "--out"]
    res = _invoke([*base, "afile/x.html"])
    assert res.exit_code == 1 and res.stderr == "error: --out afile/x.html: afile is a file, not a folder\n"
    res = _invoke([*base, "-"])
    assert res.exit_code == 1 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: --out -: the report cannot go to standard output")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no "-", no stray headline.json
    with pytest.raises(RooftraceError, match=r"^--out -: the report cannot go to standard output"):
        build_report(store, normal.run_id, out=Path("-"))  # the library refuses it as the command does


def test_a_stale_run_without_failures_has_a_red_banner_of_its_own() -> None:
    from pipeline.publish.report import ReportResult, render_html

    h = {
        "stale": True,
        "stale_note": "STALE: this run replayed 3,000 requests of 2025-01-15; the store now holds 6,000",
        "store_requests": 6000,
        "replayed_requests": 3000,
        "finished": 3000,
        "slo_passed": True,
    }
    page = render_html("t", "s", h, [], [], "")
    banner = html.unescape(page[page.index('<div class="alert">') : page.index('<div class="cards">')])
    assert "<b>This run is STALE: its date's requests changed in the store since it ran</b>" in banner
    assert "Every request finished" not in page  # no green banner beside it
    res = ReportResult(Path("r/index.html"), "run", "2025-01-15", h)
    assert res.warning_lines() == [h["stale_note"]]
    assert "needs attention: STALE run: it replayed 3,000, the store now holds 6,000 requests of the date" in res.line()


# -- an overload still queued at the last arrival, and the cost note --------------------------------


def _config(over: dict[str, object]) -> dict[str, object]:
    return {"summary": {"health": {"overload": over}}}


def test_an_overload_still_queued_at_the_last_arrival_is_priced_over_the_makespan() -> None:
    # a transient episode (started less than 10 % of the span before the last arrival) that
    # still had 344 waiting at it and drained 221 s later: the GPUs were needed past the
    # arrivals, so the period is the makespan and unit costs are not valid, as when sustained
    queued = {"detected": True, "sustained": False, "backlog_requests": 344, "until_s": 1220.0}
    drained = {"detected": True, "sustained": False, "backlog_requests": 0, "until_s": 500.0}
    assert run_overload_sustained(_config(queued)) is True
    assert run_overload_sustained(_config(drained)) is False
    assert run_overload_sustained(_config({"detected": True})) is True  # a summary from before episodes
    assert run_overload_sustained({}) is True


def test_a_cost_note_never_says_serving_took_less_than_the_arrivals() -> None:
    # the day's last arrivals were rejected: the admitted requests were still queued at their own
    # last arrival, and their makespan (18.7 min) is shorter than the arrival span (24.6 min)
    p = Period(24.6 * 60, PERIOD_ARRIVALS, 24.6 * 60, 18.7 * 60, 18.0 * 60, True)
    note = p.unit_costs_note
    assert note is not None and "took" not in note
    assert "still queued at their last arrival" in note and "last ones were rejected" in note
    longer = Period(30 * 60, "makespan", 24.6 * 60, 30 * 60, 29 * 60, True).unit_costs_note
    assert longer is not None and "of arrivals took 30" in longer
