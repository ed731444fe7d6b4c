"""The full cost stack (pipeline/economics/stack.py) and the replacement cost (pipeline/economics/cost.py):
hand-computed stacks, spot restarts and break-even volumes, price tables that add to the bundled
ones, hostile price files and [cost] tables refused in one line, the catalog's cited fractions."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pytest

from pipeline.common.defaults import PURCHASE_MODELS
from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml
from pipeline.economics.cost import (
    PRICES_DIR,
    ApiPrice,
    TokenTotals,
    api_cost_rows,
    load_price_file,
    load_prices,
    replacement_rows,
)
from pipeline.economics.stack import (
    PURCHASES,
    CostInputs,
    CostLine,
    Overhead,
    PoolGpus,
    break_even_tokens_per_day,
    build_stack,
    gpu_hour_price,
    load_purchases,
    parse_cost_table,
    parse_overhead_option,
    with_options,
)
from pipeline.replay.fleet import parse_fleet
from pipeline.replay.pools import parse_pooled

DAY_S = 86400.0


def _inputs(**kw: object) -> CostInputs:
    overheads = tuple(
        Overhead(n, kw.pop(f"{n}_percent", None), kw.pop(f"{n}_usd_per_hour", None))  # type: ignore[arg-type]
        for n in ("network", "storage", "operations")
    )
    return CostInputs(overheads=overheads, **kw)  # type: ignore[arg-type]


# -- the stack by hand ---------------------------------------------------------------------------


def test_reserved_n_plus_one_ops_and_margin_by_hand() -> None:
    """2 GPUs (2 replicas of 1) × 24 h, reserved 1 year at 0.63 of $4.00 on demand, N+1, 10 %
    operations, 15 % margin: (2 + 1) × 24 × 2.52 × 1.10 × 1.15 = $229.5216."""
    purchases = load_purchases()
    inputs = _inputs(purchase="reserved_1y", redundancy_replicas=1, operations_percent=10.0, margin_percent=15.0)
    price, what = gpu_hour_price(4.0, "2026-03", inputs, purchases)
    assert price == pytest.approx(2.52) and "reserved_1y" in what and "0.63" in what
    stack = build_stack([PoolGpus(None, 2, 1, price)], inputs, DAY_S)
    usd = {r["line"]: r["usd"] for r in stack.rows()}
    assert usd["compute"] == pytest.approx(2 * 24 * 2.52)  # 120.96
    assert usd["redundancy"] == pytest.approx(1 * 24 * 2.52)  # 60.48
    assert usd["spot_restarts"] == 0.0 and usd["network"] == 0.0 and usd["storage"] == 0.0
    assert usd["operations"] == pytest.approx(0.10 * 181.44)  # 18.144
    assert usd["margin"] == pytest.approx(0.15 * 199.584)  # 29.9376
    assert stack.total_usd == pytest.approx(229.5216)
    assert stack.usd_per_day == pytest.approx(229.5216)
    # every line is there, in order, even the ones that are 0
    assert [r["line"] for r in stack.rows()] == [
        "compute",
        "redundancy",
        "spot_restarts",
        "network",
        "storage",
        "operations",
        "margin",
    ]


def test_spot_interruptions_cost_by_hand() -> None:
    """4 GPUs (2 replicas of 2) on spot at a quoted $1.50/GPU-h, 3 interruptions a replica a day,
    1,200 s lost each: each GPU loses 3 × 1200 / 86400 = 1/24 of its hours, $144/day × 1/24 = $6/day;
    a flat $2/h network line is $48/day; 12 hours of it are half of each."""
    inputs = _inputs(
        purchase="spot",
        usd_per_gpu_hour=1.5,
        spot_interruptions_per_day=3.0,
        spot_restart_s=1200.0,
        network_usd_per_hour=2.0,
    )
    price, what = gpu_hour_price(4.76, "2026-03", inputs, load_purchases())
    assert price == 1.5 and "quoted" in what
    stack = build_stack([PoolGpus(None, 4, 2, price)], inputs, 12 * 3600.0)
    per_day = {r["line"]: r["usd_per_day"] for r in stack.rows()}
    assert per_day["compute"] == pytest.approx(144.0)
    assert per_day["spot_restarts"] == pytest.approx(6.0)
    assert per_day["network"] == pytest.approx(48.0)
    assert stack.usd_per_day == pytest.approx(198.0)
    assert stack.total_usd == pytest.approx(99.0)
    # with N+1 the spare replica's 2 GPUs are interrupted too: 6 GPUs × 1.5 × 24 / 24 = $9/day
    spare = build_stack(
        [PoolGpus(None, 4, 2, price)], CostInputs(**{**inputs.__dict__, "redundancy_replicas": 1}), DAY_S
    )
    assert spare.line("spot_restarts").usd_per_hour * 24 == pytest.approx(9.0)


def test_percent_overheads_are_taken_on_the_gpu_lines_and_an_extra_line_sits_before_the_margin() -> None:
    inputs = _inputs(network_percent=5.0, storage_usd_per_hour=1.0, margin_percent=10.0)
    energy = CostLine("energy", "a line another module adds", 3.0)
    stack = build_stack([PoolGpus("a", 2, 1, 2.0), PoolGpus("b", 8, 8, 1.0)], inputs, 3600.0, extra=[energy])
    assert stack.line("compute").usd_per_hour == pytest.approx(2 * 2.0 + 8 * 1.0)
    assert stack.line("network").usd_per_hour == pytest.approx(0.05 * 12.0)
    assert [x.key for x in stack.lines][-2:] == ["energy", "margin"]
    assert stack.line("margin").usd_per_hour == pytest.approx(0.10 * (12.0 + 0.6 + 1.0 + 3.0))


def test_defaults_leave_the_gpu_cost_alone() -> None:
    """No [cost] table: on demand, N+0, no overheads, no margin: the stack is the GPU cost."""
    price, what = gpu_hour_price(4.76, "2026-03", CostInputs(), load_purchases())
    assert (price, what) == (4.76, "2026-03")
    stack = build_stack([PoolGpus(None, 3, 1, price)], CostInputs(), 7200.0)
    assert stack.total_usd == pytest.approx(3 * 4.76 * 2)
    assert all(x.usd_per_hour == 0 for x in stack.lines if x.key != "compute")


# -- replacement: blended price and break-even by hand ------------------------------------------


def test_break_even_volume_by_hand() -> None:
    """A fleet of 10 GPUs at $1/h on demand costs F = $240/day. A day of 3 M fresh, 1 M cache-hit
    and 1 M output tokens on a provider at $1 input, $0.10 cached, $4 output per M costs 3 + 0.1 + 4
    = $7.10 over 5 M tokens: p = $1.42/M blended. V* = F / p × 1e6 = 169,014,084.5 tokens/day,
    33.80x the day's 5 M tokens."""
    stack = build_stack([PoolGpus(None, 10, 1, 1.0)], CostInputs(), DAY_S)
    tokens = TokenTotals(3e6, 1e6, 1e6)
    price = ApiPrice("host", "open-8b", 1.0, 0.1, 1.0, 4.0, "2026-11-30", "test", "t.toml", "llama-3.1-8b")
    rows = api_cost_rows("run", tokens, [price], stack.total_usd, DAY_S)
    assert rows[0]["api_usd"] == pytest.approx(7.1)
    (r,) = replacement_rows(stack, tokens, [price], rows, "llama-3.1-8b")
    assert r["blended_usd_per_million_tokens"] == pytest.approx(1.42)
    assert r["self_host_blended_usd_per_million_tokens"] == pytest.approx(240 / 5)
    assert r["break_even_tokens_per_day"] == pytest.approx(240 / 1.42 * 1e6)
    assert r["break_even_tokens_per_day"] == pytest.approx(169_014_084.5, rel=1e-9)
    assert r["break_even_to_day_volume"] == pytest.approx(169_014_084.5 / 5e6, rel=1e-9)
    assert r["same_model"] is True and r["kind"] == "hosted open model"
    # another model's price is the closed-API kind, and a free price is never beaten
    other = replacement_rows(stack, tokens, [price], rows, "llama-3.1-70b")[0]
    assert other["same_model"] is False
    assert break_even_tokens_per_day(240.0, 0.0) is None and break_even_tokens_per_day(240.0, None) is None


def test_break_even_scales_with_the_fleet_not_the_traffic() -> None:
    """V* depends on the fleet's $/day and the price per token only: the same traffic over a
    shorter period (so a bigger day) moves the day's volume, not V*; below an hour of traffic the
    day's volume is not projected."""
    tokens = TokenTotals(3e6, 1e6, 1e6)
    price = ApiPrice("p", "m", 1.0, 0.1, 1.0, 4.0, "2026-11-30", "test", "t.toml")
    day = build_stack([PoolGpus(None, 10, 1, 1.0)], CostInputs(), DAY_S)
    hours = build_stack([PoolGpus(None, 10, 1, 1.0)], CostInputs(), 2 * 3600.0)
    a = replacement_rows(day, tokens, [price], api_cost_rows("r", tokens, [price], day.total_usd, DAY_S), None)[0]
    b = replacement_rows(hours, tokens, [price], api_cost_rows("r", tokens, [price], hours.total_usd, 7200), None)[0]
    assert a["break_even_tokens_per_day"] == pytest.approx(b["break_even_tokens_per_day"])
    assert b["day_tokens"] == pytest.approx(5e6 * 12)
    short = build_stack([PoolGpus(None, 10, 1, 1.0)], CostInputs(), 600.0)
    c = replacement_rows(short, tokens, [price], api_cost_rows("r", tokens, [price], short.total_usd, 600), None)[0]
    assert c["day_tokens"] is None and c["break_even_to_day_volume"] is None


# -- price tables: --prices adds, --prices-only replaces, hostile files refused ------------------


_PRICE = """provider = "acme"
unit = "usd_per_million_tokens"
source = "acme price page"

[models.m]
input = {input}
cached_input = 0.1
cache_write = 1.0
output = 2.0
date = "2026-11-30"
source = "acme"
{extra}
"""


def _price_file(tmp_path: Path, name: str = "acme.toml", input: str = "1.0", extra: str = "") -> Path:
    path = tmp_path / name
    path.write_text(_PRICE.format(input=input, extra=extra))
    return path


def test_prices_file_adds_to_the_bundled_tables(tmp_path: Path) -> None:
    bundled = {p.key for p in load_prices()}
    assert {"openai/gpt-4-1", "deepinfra/Meta-Llama-3.1-8B-Instruct", "fireworks/deepseek-v3"} <= bundled
    mine = _price_file(tmp_path)
    added = {p.key: p for p in load_prices([mine])}
    assert set(added) == bundled | {"acme/m"}
    only = load_prices([mine], only=True)
    assert [p.key for p in only] == ["acme/m"]
    with pytest.raises(ConfigError, match="--prices-only needs at least one --prices FILE"):
        load_prices([], only=True)


def test_a_prices_file_reprices_a_bundled_model(tmp_path: Path) -> None:
    """A negotiated price of a bundled provider/model replaces that one (once), from the user's file."""
    text = (PRICES_DIR / "openai.toml").read_text().replace("input = 2.0\n", "input = 1.5\n", 1)
    mine = tmp_path / "openai-negotiated.toml"
    mine.write_text(text)
    prices = [p for p in load_prices([mine]) if p.key == "openai/gpt-4-1"]
    assert len(prices) == 1 and prices[0].input == 1.5 and prices[0].path == str(mine)


@pytest.mark.parametrize(
    ("input", "extra", "field"),
    [
        ("-1.0", "", "input must be between 0 and 1,000,000"),
        ("nan", "", "input must be a number, got nan"),
        ("1e300", "", "input must be between 0 and 1,000,000"),
        ("inf", "", "input must be a number"),
        ("1.0", 'catalog_model = "no-such-model"', "catalog_model 'no-such-model' is no catalog model"),
        ("1.0", "catalog_model = 7", "catalog_model must be"),
        ("'1.0'", "", "input must be a number, got '1.0'"),
    ],
)
def test_hostile_price_files_are_refused_in_one_line(tmp_path: Path, input: str, extra: str, field: str) -> None:
    path = _price_file(tmp_path, input=input, extra=extra)
    with pytest.raises(ConfigError) as info:
        load_prices([path])
    text = str(info.value)
    assert "\n" not in text and str(path) in text and "[models.m]" in text and field in text, text


def test_a_price_file_missing_a_field_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "short.toml"
    path.write_text(_PRICE.format(input="1.0", extra="").replace("output = 2.0\n", ""))
    with pytest.raises(ConfigError, match=r"short\.toml \[models\.m\]: missing key\(s\) \['output'\]"):
        load_price_file(path)


def test_hosted_open_model_prices_name_catalog_models_and_cite_a_page() -> None:
    """The bundled hosted prices serve catalog models, are dated and cite the page they were read from."""
    hosted = [p for p in load_prices() if p.catalog_model is not None]
    assert {p.catalog_model for p in hosted} >= {"llama-3.1-8b", "llama-3.1-70b", "deepseek-v3"}
    for p in hosted:
        assert p.provider in ("deepinfra", "fireworks")
        assert ("deepinfra.com/" in p.source or "docs.fireworks.ai/" in p.source) and p.date == "2026-12-07"
        assert 0 <= p.cached_input <= p.input <= p.cache_write
    # spot-check figures as the pages state them
    by = {p.key: p for p in hosted}
    assert (by["fireworks/deepseek-v3"].input, by["fireworks/deepseek-v3"].cached_input) == (0.56, 0.28)
    assert by["fireworks/deepseek-v3"].output == 1.68
    assert (
        by["deepinfra/Meta-Llama-3.1-70B-Instruct-Turbo"].input,
        by["deepinfra/Meta-Llama-3.1-70B-Instruct-Turbo"].output,
    ) == (
        0.13,
        0.40,
    )


# -- the catalog's purchase fractions --------------------------------------------------------------


def test_purchase_fractions_are_cited_and_match_the_quoted_list_prices() -> None:
    """cost.toml's fractions are the quoted Google Cloud us-central1 a2-highgpu-1g list prices'
    ratios (1-year and 3-year commitment per 730-hour month, Spot per hour)."""
    purchases = load_purchases()
    assert tuple(purchases) == PURCHASES == PURCHASE_MODELS
    assert purchases["on_demand"].fraction == 1.0
    assert purchases["reserved_1y"].fraction == pytest.approx(1689.3711392 / 2681.57105, abs=5e-4)
    assert purchases["reserved_3y"].fraction == pytest.approx(938.56707798 / 2681.57105, abs=5e-4)
    assert purchases["spot"].fraction == pytest.approx(1.293355 / 3.673385, abs=5e-4)
    for p in purchases.values():
        assert p.source and dt.date.fromisoformat(p.date) <= dt.date.today()
    assert purchases["reserved_3y"].fraction < purchases["reserved_1y"].fraction < 1.0


# -- FLEET.toml [cost] and the command line's options ---------------------------------------------


def test_cost_table_reads_and_the_options_win() -> None:
    raw = {"purchase": "reserved_3y", "redundancy_replicas": 2, "operations_percent": 10, "margin_percent": 15.0}
    inputs = parse_cost_table(raw, "f.toml [cost]")
    assert (inputs.purchase, inputs.redundancy_replicas, inputs.margin_percent) == ("reserved_3y", 2, 15.0)
    assert inputs.overhead("operations").percent == 10.0 and inputs.origin == "f.toml [cost]"
    over = with_options(inputs, redundancy_replicas=1, overheads={"operations": "3/h", "network": "5%"})
    assert over.redundancy_replicas == 1 and over.purchase == "reserved_3y"
    assert over.overhead("operations") == Overhead("operations", None, 3.0)
    assert over.overhead("network") == Overhead("network", 5.0, None)
    assert over.origin == "f.toml [cost] and the command line"
    assert parse_overhead_option("$2.5/h", "--storage") == (None, 2.5)
    with pytest.raises(ConfigError, match=r"--storage: 'lots' must be a percentage"):
        parse_overhead_option("lots", "--storage")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"margin_percent": -5}, "margin_percent must be a number in [0, 1,000] %, got -5.0"),
        ({"margin_percent": math.nan}, "margin_percent must be a number in [0, 1,000] %, got nan"),
        ({"operations_percent": 1e300}, "operations_percent must be a number in [0, 1,000] %"),
        ({"network_percent": 5, "network_usd_per_hour": 2}, "network_percent and network_usd_per_hour both set"),
        ({"redundancy_replicas": -1}, "redundancy_replicas must be in [0, 1000]"),
        ({"redundancy_replicas": True}, "redundancy_replicas must be an integer, got True"),
        ({"purchase": "lease"}, "purchase 'lease' unknown; choose one of"),
        ({"purchase": "spot"}, "purchase = 'spot' needs ['spot_interruptions_per_day', 'spot_restart_s']"),
        ({"purchase": "spot", "spot_interruptions_per_day": 2, "spot_restart_s": -1}, "spot_restart_s must be"),
        ({"spot_restart_s": 60.0}, "apply to purchase = 'spot' only"),
        ({"usd_per_gpu_hour": -1.0}, "usd_per_gpu_hour must be a number in [0, 1,000,000]"),
        ({"price_date": "2026-01-01"}, "price_date dates a quoted usd_per_gpu_hour, which is not set"),
        ({"margin": 15}, "unknown key(s) ['margin']"),
        ({"storage_usd_per_hour": "2"}, "storage_usd_per_hour must be a number, got '2'"),
    ],
)
def test_hostile_cost_tables_are_refused_in_one_line(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cost_table(raw, "fleets/x.toml [cost]")
    text = str(info.value)
    assert "\n" not in text and text.startswith("fleets/x.toml [cost]") and message in text, text


def test_a_cost_table_changes_nothing_the_replay_records(tmp_path: Path) -> None:
    """[cost] prices the fleet: the fleet a run records (and so its run id) is the same with it."""
    base = read_toml(Path(__file__).resolve().parents[1] / "fleets" / "default.toml", "fleet file")
    with_cost = {**base, "cost": {"purchase": "reserved_1y", "margin_percent": 15.0}}
    assert parse_fleet(with_cost, "f.toml").to_dict() == parse_fleet(dict(base), "f.toml").to_dict()
    with pytest.raises(ConfigError, match=r"f\.toml \[cost\]: unknown key\(s\) \['nope'\]"):
        parse_fleet({**base, "cost": {"nope": 1}}, "f.toml")
    pooled = {
        "name": "p",
        "model": base["model"],
        "hardware": base["hardware"],
        "cost": {"redundancy_replicas": 1},
        "pool": [{"name": "a", "match": {"tenant": ["t"]}}, {"name": "b", "cost": {"margin_percent": 1}}],
    }
    with pytest.raises(ConfigError, match=r"\[\[pool\]\] 'b': \['cost'\] belong to the whole fleet"):
        parse_pooled(pooled, "f.toml")
    del pooled["pool"][1]["cost"]  # type: ignore[index]
    assert len(parse_pooled(pooled, "f.toml").pools) == 2


def test_the_cost_inputs_come_from_the_recorded_fleet_file_unless_one_is_named(tmp_path: Path) -> None:
    """`cost` reads [cost] from --fleet, else from the fleet file the run recorded while it is there;
    the options win over its keys; no file: the defaults."""
    from pipeline.economics.cost import run_cost_inputs

    recorded = tmp_path / "recorded.toml"
    recorded.write_text('name = "f"\n[cost]\npurchase = "reserved_3y"\nmargin_percent = 15\n')
    named = tmp_path / "named.toml"
    named.write_text('name = "f"\n[cost]\noperations_usd_per_hour = 2.5\n')
    config = {"fleet_file": str(recorded)}
    inputs, read = run_cost_inputs(config, None, {})
    assert (inputs.purchase, inputs.margin_percent, read) == ("reserved_3y", 15.0, str(recorded))
    assert inputs.origin == f"{recorded} [cost]"
    inputs, read = run_cost_inputs(config, str(named), {"margin_percent": 5.0})
    assert inputs.purchase == "on_demand" and inputs.overhead("operations").usd_per_hour == 2.5
    assert inputs.margin_percent == 5.0 and read == str(named)
    recorded.unlink()
    inputs, read = run_cost_inputs(config, None, {})
    assert inputs == CostInputs() and read is None
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "f"\ncost = 3\n')
    with pytest.raises(ConfigError, match=r"bad\.toml: cost must be a table \(\[cost\]\), got 3"):
        run_cost_inputs({}, str(bad), {})
