"""``plan --objective``: each passing configuration's full cost stack and GPU energy a day, and the
configuration chosen by $ (the stack), energy or GPUs, on a small generated day."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_checks import cli, one_error
from test_plan_modes import write_day

from pipeline.common.errors import ConfigError
from pipeline.common.schemas import read_parquet
from pipeline.economics.energy import load_power, run_energy
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.plan import PlanOptions, plan
from pipeline.plan.objective import check_objective
from pipeline.replay.run import ReplayOptions, replay
from pipeline.replay.runfolder import config_path, read_config

DAY = "2025-01-15"
H100, A100 = "h100-sxm", "a100-80gb-sxm"
#: Board power per GPU, pipeline/catalog/power.toml: H100 SXM idle 105 W (about 15 % of TDP, an
#: assumption stated there), A100 SXM idle 60 W and TDP 400 W (NVIDIA A100 datasheet, SXM).
H100_IDLE_W, A100_IDLE_W, A100_MAX_W = 105.0, 60.0, 400.0
#: The A100 at a quoted $5.00/GPU-hour: dearer than the H100's catalog $4.76 (RunPod, March 2026).
A100_QUOTE = 5.00
H100_PRICE = 4.76


@pytest.fixture(scope="module")
def quiet_day(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """200 agent requests at 0.1/s (a 4,096-token shared prompt + 2,000-6,000 of their own, 8-40
    out): one replica of either GPU serves it, busy a few % of the time."""
    root = tmp_path_factory.mktemp("quiet")
    write_day(root / "agent.jsonl", "agent", 200, 0.1)
    store = Store(root / "store")
    assert ingest_logs([root / "agent.jsonl"], store, fmt="mooncake", date=DAY).ok
    return store


def _plan(store: Store, objective: str | None, **kw: object) -> dict:  # type: ignore[type-arg]
    args: dict[str, object] = {
        "model": "llama-3.1-8b",
        "slo": "ttft_p99=2s,tpot_p99=100ms",
        "hardware": (H100, A100),
        "tp": (1,),
        "window": "day",
        "jobs": 1,
        "gpu_prices": ((A100, A100_QUOTE),),
        "objective": objective,
    }
    args.update(kw)
    return plan(store, PlanOptions(**args)).doc  # type: ignore[arg-type]


def _rows(doc: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {r["hardware"]: r for r in doc["configurations"]}


def test_energy_objective_picks_the_lower_power_gpu_usd_the_cheaper(quiet_day: Store) -> None:
    usd, energy, gpus = (_plan(quiet_day, o) for o in ("usd", "energy", "gpus"))
    # both GPUs serve the day on one replica: the same GPU count, different prices and power
    rows = _rows(energy)
    assert rows[H100]["gpus"] == rows[A100]["gpus"] == 1
    assert usd["chosen"]["hardware"] == H100  # $4.76 x 24 = $114.24 < $5.00 x 24 = $120.00
    assert rows[H100]["stack_usd_per_day"] == pytest.approx(H100_PRICE * 24)
    assert rows[A100]["stack_usd_per_day"] == pytest.approx(A100_QUOTE * 24)
    assert energy["chosen"]["hardware"] == A100
    assert gpus["chosen"]["hardware"] == H100  # a tie on GPUs falls back to $/day
    # why, by hand: the H100 draws at least its idle 105 W all day; the A100 at most its idle 60 W
    # all day plus (400 - 60) W over its busy GPU-hours (a day busy under 13 % of the time)
    a100_busy_h = rows[A100]["energy"]["busy_gpu_hours_per_day"]
    assert a100_busy_h == pytest.approx(rows[A100]["day_utilization"] * 24, rel=1e-9)
    assert a100_busy_h < 24 * (H100_IDLE_W - A100_IDLE_W) / (A100_MAX_W - A100_IDLE_W)
    h100_floor_kwh = H100_IDLE_W * 24 / 1000
    a100_ceiling_kwh = (A100_IDLE_W * 24 + (A100_MAX_W - A100_IDLE_W) * a100_busy_h) / 1000
    assert rows[A100]["gpu_kwh_per_day"] <= a100_ceiling_kwh < h100_floor_kwh <= rows[H100]["gpu_kwh_per_day"]
    # each kWh/day is its busy hours at the spans' mean power plus the rest of 24 h at idle power
    for hw, idle_w in ((H100, H100_IDLE_W), (A100, A100_IDLE_W)):
        e = rows[hw]["energy"]
        assert e["idle_w"] == idle_w == load_power()[hw].idle_w
        assert idle_w <= e["busy_w_per_gpu"] <= e["max_w"]
        by_hand = (
            e["busy_w_per_gpu"] * e["busy_gpu_hours_per_day"] + idle_w * (24 - e["busy_gpu_hours_per_day"])
        ) / 1e3
        assert e["gpu_kwh_per_day"] == pytest.approx(by_hand, rel=1e-9)
        assert rows[hw]["facility_kwh_per_day"] == pytest.approx(e["gpu_kwh_per_day"] * 1.56)
    # the table ranks by the objective: rank 1 is the chosen configuration
    assert _rows(usd)[H100]["rank"] == 1 and _rows(energy)[A100]["rank"] == 1
    verdict = energy["objective"]["verdict"]
    assert verdict.startswith(f"chosen by energy: 1x {A100} tp1 bf16 (1 GPU, $120/day")
    assert f"against the best by usd and gpus, 1x {H100} tp1 bf16" in verdict
    assert energy["objective"]["best_by"] == {
        "usd": f"{H100} tp1 bf16",
        "energy": f"{A100} tp1 bf16",
        "gpus": f"{H100} tp1 bf16",
    }


def test_plan_energy_equals_a_stored_replay_of_the_chosen_fleet(quiet_day: Store, tmp_path: Path) -> None:
    """An independent computation: `rooftrace replay` of the chosen fleet (the default fleet on
    one A100) and run_energy of its stored step log, over the same period, projected to a day."""
    doc = _plan(quiet_day, "energy")
    fleet = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"
    text = (
        fleet.read_text()
        .replace('hardware = "h100-sxm"', f'hardware = "{A100}"')
        .replace("replicas = 2", "replicas = 1")
    )
    (tmp_path / "a100.toml").write_text(text)
    run = replay(quiet_day, tmp_path / "a100.toml", ReplayOptions(date=DAY))
    e = run_energy(run.run_dir, read_config(config_path(run.run_dir))).to_dict()
    assert doc["chosen"]["energy"]["period_s"] == pytest.approx(e["period_s"])
    assert doc["chosen"]["energy"]["gpu_kwh_per_day"] == pytest.approx(e["gpu_kwh"] * 86400 / e["period_s"], rel=1e-9)


def test_plan_json_carries_each_candidates_stack(quiet_day: Store) -> None:
    opts = (("redundancy_replicas", 1), ("operations", "5%"), ("margin_percent", 10.0), ("electricity", True))
    doc = _plan(quiet_day, "usd", cost_options=opts)
    for hw, price in ((H100, H100_PRICE), (A100, A100_QUOTE)):
        row = _rows(doc)[hw]
        stack = row["cost_stack"]
        lines = {x["line"]: x["usd_per_day"] for x in stack["lines"]}
        assert lines["compute"] == pytest.approx(price * 24)  # 1 GPU
        assert lines["redundancy"] == pytest.approx(price * 24)  # N+1: one spare 1-GPU replica
        assert lines["operations"] == pytest.approx(0.05 * 2 * price * 24)
        elec = row["energy"]["gpu_kwh_per_day"] * 1.56 * 0.0811  # facility kWh at EIA's 2024 price
        assert lines["electricity"] == pytest.approx(elec)
        assert stack["usd_per_day"] == pytest.approx((2 * price * 24 * 1.05 + elec) * 1.10)
        assert row["stack_usd_per_day"] == stack["usd_per_day"]
    assert doc["objective"]["pricing"]["inputs"]["redundancy_replicas"] == 1
    chosen = doc["chosen"]
    assert chosen["cost_stack"] == _rows(doc)[chosen["hardware"]]["cost_stack"]
    # the API bills are set against the full cost over the period of record, not the GPUs alone
    full = chosen["cost_stack"]["usd_per_day"] * chosen["period_s"] / 86400
    assert chosen["stack_usd_per_period"] == pytest.approx(full) and full > chosen["usd_per_period"] * 2
    assert {a["self_host_usd"] for a in doc["api_equivalent"]} == {chosen["stack_usd_per_period"]}
    # the files carry the columns too
    table = read_parquet(quiet_day.plan_dir(doc["plan_id"]) / "plan.parquet", "plan")
    assert {"objective", "stack_usd_per_day", "gpu_kwh_per_day", "facility_kwh_per_day"} <= set(table.column_names)
    on_disk = json.loads((quiet_day.plan_dir(doc["plan_id"]) / "plan.json").read_text())
    assert on_disk["configurations"][0]["energy"]["gpu_kwh_per_day"] == doc["configurations"][0]["gpu_kwh_per_day"]


def test_a_disaggregated_stack_has_spares_in_each_pool(quiet_day: Store) -> None:
    doc = _plan(
        quiet_day, "gpus", hardware=(H100,), gpu_prices=(), modes=("colocated", "disaggregated"), pd_ratios=((1, 1),),
        cost_options={"redundancy_replicas": 1},
    )  # fmt: skip
    rows = {r["config"]: r for r in doc["configurations"]}
    dis = rows[f"{H100} tp1 bf16 pd1:1"]
    assert (dis["prefill_replicas"], dis["decode_replicas"], dis["gpus"]) == (1, 1, 2)
    lines = {x["line"]: x for x in dis["cost_stack"]["lines"]}
    # N+1 per pool: a spare prefill replica and a spare decode replica, 2 GPUs
    assert lines["redundancy"]["usd_per_day"] == pytest.approx(2 * H100_PRICE * 24)
    assert "2 GPUs" in lines["redundancy"]["basis"]
    assert dis["stack_usd_per_day"] == pytest.approx(4 * H100_PRICE * 24)
    assert rows[f"{H100} tp1 bf16"]["stack_usd_per_day"] == pytest.approx(2 * H100_PRICE * 24)
    assert doc["chosen"]["config"] == f"{H100} tp1 bf16"  # 1 GPU against 2


def test_no_objective_plans_as_before(quiet_day: Store) -> None:
    doc = _plan(quiet_day, None)
    assert "objective" not in doc and "cost_stack" not in doc["chosen"]
    assert not {"objective", "stack_usd_per_day", "gpu_kwh_per_day"} & set(doc["configurations"][0])
    assert "objective" not in doc["options"] and "cost_options" not in doc["options"]
    assert doc["chosen"]["hardware"] == H100  # by GPU $/day, as it always was
    table = read_parquet(quiet_day.plan_dir(doc["plan_id"]) / "plan.parquet", "plan")
    assert "gpu_kwh_per_day" not in table.column_names
    # the plan id digests the options: one asked with --objective is another plan
    assert _plan(quiet_day, "usd")["plan_id"] != doc["plan_id"]


def test_plan_objective_cli_table_and_hostile_input(quiet_day: Store, tmp_path: Path) -> None:
    base = ("plan", "--store", str(quiet_day.root), "--model", "llama-3.1-8b", "--slo", "ttft_p99=2s,tpot_p99=100ms",
            "--hardware", f"{H100},{A100}", "--tp", "1", "--window", "day", "--jobs", "1",
            "--gpu-price", f"{A100}={A100_QUOTE}")  # fmt: skip
    res = cli(*base, "--objective", "energy")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    head = next(x for x in lines if x.lstrip().startswith("#"))
    assert head.endswith("stack $/day   kWh/day")
    first = next(x for x in lines if x.lstrip().startswith("1 "))
    assert A100 in first and first.split()[-2:] == ["120", "1.9"]
    assert any(x.startswith(f"chosen by energy: 1x {A100}") for x in lines)
    one_error(cli(*base, "--objective", "foo"), "--objective", "'foo'", "usd, energy, gpus")
    one_error(cli(*base, "--redundancy", "1"), "--redundancy", "--objective")
    one_error(cli(*base, "--objective", "usd", "--margin", "nan"), "margin_percent")
    one_error(cli(*base, "--objective", "usd", "--network", "lots"), "--network", "'lots'")
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "b"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n[cost]\nmargin_percent = "high"\n')
    one_error(cli(*base, "--objective", "usd", "--fleet", str(bad)), str(bad), "[cost]", "margin_percent")


def test_check_objective_refuses_what_is_not_one() -> None:
    for bad in ("foo", "", "USD", None, 1):
        with pytest.raises(ConfigError, match="--objective"):
            check_objective(bad)
    with pytest.raises(ConfigError, match="--objective"):
        PlanOptions(model="llama-3.1-8b", objective="watts")
