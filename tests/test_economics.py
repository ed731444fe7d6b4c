"""Economics: hand-computed API bills and GPU cost splits, price-table validation, invariants."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import own_copy
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.common.errors import ConfigError
from pipeline.costmodel.steps import StepBatch
from pipeline.economics.cost import (
    ApiPrice,
    GpuCost,
    TokenTotals,
    api_cost,
    attribute_busy_time,
    kv_read_shares,
    load_prices,
    parse_price_table,
)
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.replay.run import ReplayOptions, replay
from pipeline.replay.slo import day_projection
from pipeline.synth import SynthConfig, generate, write_logs

ROOT = Path(__file__).resolve().parents[1]
TODAY = dt.date(2026, 11, 30)
SONNET = ApiPrice("anthropic", "sonnet", 3.0, 0.3, 3.75, 15.0, "2026-11-30", "test", "test")


def test_api_cost_hand_computed() -> None:
    # 1M fresh input of which 200k are cache writes, 4M cache hits, 100k output on Sonnet's table:
    # 800k x $3 + 200k x $3.75 + 4M x $0.30 + 100k x $15 = 2.40 + 0.75 + 1.20 + 1.50 = $5.85
    c = api_cost(TokenTotals(1_000_000, 4_000_000, 100_000, 200_000), SONNET)
    assert c.fresh_input_usd == pytest.approx(2.40)
    assert c.cache_write_usd == pytest.approx(0.75)
    assert c.cache_hit_usd == pytest.approx(1.20)
    assert c.output_usd == pytest.approx(1.50)
    assert c.total_usd == pytest.approx(5.85)


def test_token_totals_reject_impossible_counts() -> None:
    with pytest.raises(ConfigError, match="cache_write"):
        TokenTotals(100, 0, 0, 200)
    with pytest.raises(ConfigError, match="output"):
        TokenTotals(100, 0, -1)


def _table(**model: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "input": 1.0,
        "cached_input": 0.1,
        "cache_write": 1.25,
        "output": 5.0,
        "date": "2026-01-01",
        "source": "x",
    }
    entry.update(model)
    return {"provider": "p", "unit": "usd_per_million_tokens", "source": "s", "models": {"m": entry}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"input": -1.0}, "input must be between 0 and 1,000,000 USD per million tokens"),
        ({"output": "5"}, "output must be a number"),
        ({"cached_input": 2.0}, "cached_input .* exceeds input"),
        ({"date": "2026-13-01"}, "not a calendar date"),
        ({"date": "01/02/2026"}, "YYYY-MM-DD"),
        ({"date": "2027-01-01"}, "in the future"),
        ({"colour": 1}, r"unknown key\(s\) \['colour'\]"),
        ({"source": ""}, "source must be a non-empty string"),
    ],
)
def test_price_table_validation(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_price_table(_table(**change), "t.toml", TODAY)


def test_price_table_unit_and_missing_keys() -> None:
    bad = _table()
    bad["unit"] = "usd_per_thousand_tokens"
    with pytest.raises(ConfigError, match="unit must be 'usd_per_million_tokens'"):
        parse_price_table(bad, "t.toml", TODAY)
    entry = _table()
    del entry["models"]["m"]["output"]  # type: ignore[index, attr-defined]
    with pytest.raises(ConfigError, match=r"missing key\(s\) \['output'\]"):
        parse_price_table(entry, "t.toml", TODAY)


def test_bundled_prices_load_dated_and_sourced() -> None:
    prices = load_prices()
    assert {p.provider for p in prices} >= {"openai", "anthropic", "google"}
    for p in prices:
        assert p.source and dt.date.fromisoformat(p.date) <= dt.date.today()
        assert 0 <= p.cached_input <= p.input <= p.cache_write
    # spot-check one published figure: Anthropic's 5-minute cache write is 1.25x the input price
    for p in prices:
        if p.provider == "anthropic":
            assert p.cache_write == pytest.approx(1.25 * p.input)
            assert p.cached_input == pytest.approx(0.1 * p.input)


def test_duplicate_price_is_an_error(tmp_path: Path) -> None:
    src = next((ROOT / "pipeline" / "catalog" / "prices").glob("*.toml"))
    copy = tmp_path / "copy.toml"
    copy.write_text(src.read_text())
    with pytest.raises(ConfigError, match="also priced"):
        load_prices([src, copy])


def test_kv_read_shares_hand_computed() -> None:
    # P=10 (H=6 cached, F=4 fresh), O=3: hits read 6x3=18, fresh 4x3=12, output 3x2/2=3 (of 33)
    s = kv_read_shares([10], [6], [3])
    assert s["cache_hit"] == pytest.approx(18 / 33)
    assert s["fresh_input"] == pytest.approx(12 / 33)
    assert s["output"] == pytest.approx(3 / 33)


def _affine(a: float, b: float):  # type: ignore[no-untyped-def]
    def cost(batch: StepBatch) -> np.ndarray:
        return a + b * (batch.prefill_tokens + batch.decode_seqs)

    return cost


def test_attribute_busy_time_hand_computed() -> None:
    # Span A: one mixed step of 10 ms, 300 prefill tokens + 100 decodes; linear time
    # 2 ms + 400 x 10 us = 6 ms -> 4.5 ms fresh, 1.5 ms output; 4 ms attention split by shares.
    # Span B: 10 decode steps of 50 sequences over 50 ms; linear 10 x 2.5 ms = 25 ms -> output;
    # 25 ms attention split by shares.
    spans = {
        "start_s": np.array([0.0, 0.010]),
        "end_s": np.array([0.010, 0.060]),
        "steps": np.array([1.0, 10.0]),
        "prefill_tokens": np.array([300.0, 0.0]),
        "prefill_seqs": np.array([1.0, 0.0]),
        "decode_seqs": np.array([100.0, 50.0]),
    }
    shares = {"cache_hit": 0.5, "fresh_input": 0.25, "output": 0.25}
    t = attribute_busy_time(spans, _affine(2e-3, 1e-5), shares)
    attn = 0.004 + 0.025
    assert t["fresh_input"] == pytest.approx(0.0045 + 0.25 * attn)
    assert t["output"] == pytest.approx(0.0015 + 0.025 + 0.25 * attn)
    assert t["cache_hit"] == pytest.approx(0.5 * attn)
    assert sum(t.values()) == pytest.approx(0.060)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(1e-4, 1.0), st.integers(1, 50), st.integers(0, 5000), st.integers(0, 8), st.integers(0, 256)
        ),
        min_size=1,
        max_size=30,
    ),
    st.floats(0, 1e-2),
    st.floats(0, 1e-4),
)
def test_attribution_conserves_busy_time(rows: list[tuple[float, int, int, int, int]], a: float, b: float) -> None:
    dur = np.array([r[0] for r in rows])
    start = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    spans = {
        "start_s": start,
        "end_s": start + dur,
        "steps": np.array([r[1] for r in rows], float),
        "prefill_tokens": np.array([r[2] for r in rows], float),
        "prefill_seqs": np.array([r[3] for r in rows], float),
        "decode_seqs": np.array([r[4] for r in rows], float),
    }
    t = attribute_busy_time(spans, _affine(a, b), {"cache_hit": 0.2, "fresh_input": 0.3, "output": 0.5})
    assert all(v >= -1e-12 for v in t.values())
    assert sum(t.values()) == pytest.approx(float(dur.sum()), rel=1e-9)


def test_gpu_cost_hand_computed() -> None:
    # 2 GPUs at $3/GPU-h for 30 min = $3.00; busy 1,800 GPU-s of 3,600 -> $1.50 busy, $1.50 idle.
    g = GpuCost(
        hardware="h100-sxm",
        gpus=2,
        usd_per_gpu_hour=3.0,
        price_date="2026-03",
        window_s=1800.0,
        busy_gpu_s=1800.0,
        class_busy_s={"fresh_input": 1.0, "cache_hit": 1.0, "output": 2.0},
        tokens=TokenTotals(1e6, 2e6, 5e5),
    )
    assert g.total_usd == pytest.approx(3.0)
    assert g.busy_usd == pytest.approx(1.5) and g.idle_usd == pytest.approx(1.5)
    assert g.utilization == pytest.approx(0.5)
    assert g.usd_per_day == pytest.approx(144.0)
    rows = {r["token_class"]: r for r in g.rows()}
    # output: half the busy time -> $0.75 busy, + half the idle $1.50 -> $1.50 all-in over 0.5M tokens
    assert rows["output"]["busy_usd"] == pytest.approx(0.75)
    assert rows["output"]["all_in_usd_per_million_tokens"] == pytest.approx(3.0)
    assert rows["cache_hit"]["all_in_usd_per_million_tokens"] == pytest.approx(0.375)
    assert sum(r["all_in_usd"] for r in rows.values() if r["token_class"] != "idle") == pytest.approx(3.0)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Store:
    base = tmp_path_factory.mktemp("cost")
    store = Store(base / "store")
    frame = generate(SynthConfig(requests=300, seed=1, models=("llama-3.1-8b",), duration_s=300, diurnal=False))
    ingest_logs(write_logs(frame, "anthropic", base / "day.jsonl"), store)
    replay(store, ROOT / "fleets" / "default.toml", ReplayOptions())
    return store


def test_cost_command_on_a_replay(replayed: Store, tmp_path: Path) -> None:
    replayed = own_copy(replayed, tmp_path)
    res = CliRunner().invoke(main, ["cost", "--store", str(replayed.root), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["total_usd"] == pytest.approx(doc["gpus"] * doc["usd_per_gpu_hour"] * doc["period_s"] / 3600)
    classes = {r["token_class"]: r for r in doc["token_classes"]}
    # idle dollars are spread over the classes' all-in figures (and shown once on the idle row)
    assert sum(r["all_in_usd"] for k, r in classes.items() if k != "idle") == pytest.approx(doc["total_usd"])
    assert classes["idle"]["all_in_usd"] == pytest.approx(doc["idle_usd"])
    assert 0 < doc["utilization"] <= 1
    for a in doc["api_equivalent"]:
        assert a["self_host_to_api_ratio"] == pytest.approx(doc["total_usd"] / a["api_usd"])
    assert (Path(doc["out_dir"]) / "api_cost.parquet").exists()


def test_cost_prices_a_run_with_the_catalog_it_ran_on(
    replayed: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog edit after the replay (here: the GPU's hourly price doubled) does not change the
    cost of the stored run: cost resolves the fleet from the entries the run recorded. A run
    without recorded entries falls back to today's catalog and says so."""
    import pipeline.catalog.entries as entries
    from pipeline.economics.cost import run_cost
    from pipeline.publish.warehouse import latest_run

    replayed = own_copy(replayed, tmp_path)  # its config.json is edited below
    before = run_cost(replayed)
    assert before.catalog_source == "the run's recorded catalog entries"
    run_id = latest_run(replayed)
    assert run_id is not None
    config_path = replayed.runs_dir / run_id / "config.json"
    original = config_path.read_text()
    config = json.loads(original)
    recorded = config["resolved"]["catalog"]
    assert 'name = "h100-sxm"' in recorded["hardware"] and "llama" in recorded["model"].lower()

    real = entries.load_hardware_file

    def doubled(path: Path | str) -> entries.HardwareSpec:
        hw = real(path)
        return dataclasses.replace(hw, price_usd_per_gpu_hour=2 * hw.price_usd_per_gpu_hour)

    entries.load_hardware.cache_clear()
    monkeypatch.setattr(entries, "load_hardware_file", doubled)
    try:
        after = run_cost(replayed)
        assert after.gpu.usd_per_gpu_hour == before.gpu.usd_per_gpu_hour
        assert after.gpu.total_usd == pytest.approx(before.gpu.total_usd)
        del config["resolved"]["catalog"]
        config_path.write_text(json.dumps(config))
        old = run_cost(replayed)
        assert old.catalog_source.startswith("today's catalog")
        assert old.gpu.usd_per_gpu_hour == pytest.approx(2 * before.gpu.usd_per_gpu_hour)
    finally:
        config_path.write_text(original)
        entries.load_hardware.cache_clear()


def test_cost_and_plan_never_project_seconds_of_traffic_to_a_day(replayed: Store, tmp_path: Path) -> None:
    # The hostile round saw `cost` on a few seconds of traffic print "-> x1.73e+04 per day": the
    # projection is now the report's (pipeline.replay.slo.day_projection): none below an hour of traffic.
    replayed = own_copy(replayed, tmp_path)
    res = CliRunner().invoke(main, ["cost", "--store", str(replayed.root), "--json"])
    doc = json.loads(res.stdout)
    assert doc["day_projection"] == day_projection(doc["period_s"])
    text = CliRunner().invoke(main, ["cost", "--store", str(replayed.root)]).output
    assert doc["day_projection"] in text and "e+" not in text
    if doc["period_s"] < 3600:
        assert "not projected to a day" in text
    else:
        assert " per day" in text and "not projected" not in text
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        assert day_projection(bad) == "no traffic span; not projected to a day"
    assert day_projection(1e300).endswith("per day") and len(day_projection(1e300)) < 80
    assert day_projection(5.0) == "5 s of traffic; not projected to a day: too short a span to extrapolate from"
    assert day_projection(7200.0) == "2 h of traffic -> x12 per day"
    assert day_projection(60.0 * 70) == "1.17 h of traffic -> x20.6 per day"


def test_cost_stack_on_a_replay_each_line_in_the_output_and_the_report(replayed: Store, tmp_path: Path) -> None:
    """`cost` with stated inputs: the stack's total is (N + k) × $/GPU-h × fraction × (1 + ops) ×
    (1 + margin) over the period, computed here from the run's own GPUs, price and period; every
    line is printed and shown in the report, and so is the break-even volume of each alternative."""
    replayed = own_copy(replayed, tmp_path)
    args = ["cost", "--store", str(replayed.root), "--purchase", "reserved_1y", "--redundancy", "1"]
    args += ["--operations", "10%", "--network", "0.5/h", "--margin", "15"]
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    hours = doc["period_s"] / 3600
    catalog = 4.76  # pipeline/catalog/hardware/h100-sxm.toml [price], the fleet's GPU
    assert doc["usd_per_gpu_hour"] == pytest.approx(catalog * 0.63)
    per_replica = 1  # fleets/default.toml: tp 1
    gpu_lines = (doc["gpus"] + per_replica) * catalog * 0.63
    want = (gpu_lines * 1.10 + 0.5) * 1.15 * hours
    stack = doc["cost_stack"]
    assert stack["total_usd"] == pytest.approx(want)
    lines = {x["line"]: x for x in stack["lines"]}
    assert lines["network"]["usd"] == pytest.approx(0.5 * hours)
    assert lines["operations"]["usd"] == pytest.approx(0.10 * gpu_lines * hours)
    assert stack["inputs"]["origin"] == "command line"
    # the API comparison and break-even use the full cost
    for a in doc["api_equivalent"]:
        assert a["self_host_usd"] == pytest.approx(want)
    tokens = sum(r["tokens"] for r in doc["token_classes"] if r["token_class"] != "idle")
    for r in doc["replacement"]:
        api = next(
            a for a in doc["api_equivalent"] if (a["provider"], a["api_model"]) == (r["provider"], r["api_model"])
        )
        assert r["blended_usd_per_million_tokens"] == pytest.approx(api["api_usd"] / tokens * 1e6)
        assert r["break_even_tokens_per_day"] == pytest.approx(
            stack["usd_per_day"] / r["blended_usd_per_million_tokens"] * 1e6
        )
    assert any(r["same_model"] for r in doc["replacement"])  # the run serves llama-3.1-8b, which DeepInfra hosts
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    for name in lines:
        assert any(ln.startswith(f"  {name} ") for ln in text.stdout.splitlines()), (name, text.stdout)
    assert (
        "break-even" in text.stdout
        and "deepinfra/Meta-Llama-3.1-8B-Instruct (2026-12-07; hosted llama-3.1-8b, same model)" in text.stdout
    )
    out = tmp_path / "report" / "index.html"
    rep = CliRunner().invoke(main, ["report", "--store", str(replayed.root), "--out", str(out)])
    assert rep.exit_code == 0, rep.output
    page = out.read_text()
    assert "Cost stack" in page and "Replacement cost and break-even volume" in page
    for name in ("compute", "redundancy", "spot_restarts", "network", "storage", "operations", "margin"):
        assert f"<td>{name}</td>" in page or f">{name}<" in page, name
    assert "N+1" in page and "V* = F / p" in page


def test_cost_options_and_price_files_refused_in_one_line(replayed: Store, tmp_path: Path) -> None:
    replayed = own_copy(replayed, tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'provider = "p"\nunit = "usd_per_million_tokens"\nsource = "s"\n[models.m]\ninput = -1\n'
        'cached_input = 0\ncache_write = 0\noutput = 1\ndate = "2026-11-01"\nsource = "s"\n'
    )
    fleet = tmp_path / "fleet.toml"
    fleet.write_text((ROOT / "fleets" / "default.toml").read_text() + "\n[cost]\nmargin_percent = -5\n")
    cases = [
        (["--prices", str(bad)], f"{bad} [models.m]: input must be between 0"),
        (["--margin", "nan"], "margin_percent must be a number in [0, 1,000] %, got nan"),
        (["--network", "lots"], "--network: 'lots' must be a percentage"),
        (["--purchase", "spot"], "purchase = 'spot' needs ['spot_interruptions_per_day', 'spot_restart_s']"),
        (["--fleet", str(fleet)], f"{fleet} [cost]: margin_percent must be a number in [0, 1,000] %, got -5.0"),
        (["--prices-only"], "--prices-only needs at least one --prices FILE"),
    ]
    for extra, message in cases:
        res = CliRunner().invoke(main, ["cost", "--store", str(replayed.root), *extra])
        assert res.exit_code == 1, (extra, res.output)
        assert message in res.output and "Traceback" not in res.output, (extra, res.output)
    missing = tmp_path / "missing.toml"
    gone = CliRunner().invoke(main, ["cost", "--store", str(replayed.root), "--prices-only", "--prices", str(missing)])
    assert gone.exit_code == 1 and str(missing) in gone.output and "Traceback" not in gone.output, gone.output
    assert len(gone.output.strip().splitlines()) == 1, gone.output
