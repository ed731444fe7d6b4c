"""An autoscaled day (pipeline/replay/autoscale.py, FLEET.toml [autoscale]): the replica timeline a
policy makes, round robin over the live replicas (the loop's own decisions, routing and fixed
point: tests/test_autoscale_loop.py), the GPU-hours ``cost``
charges (hand-computed for a schedule), a synthetic diurnal day on which an autoscaled fleet
meets the SLO for less than the static fleet sized for its peak while a long scale-up delay
misses TTFT at the morning ramp, and hostile [autoscale] tables (one line each)."""

from __future__ import annotations

import json
import math
import re
import shutil
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from autoscale_support import diurnal, ttft_p99
from click.testing import CliRunner
from test_engine_support import LinearCost, workload

from pipeline.cli import main
from pipeline.common.errors import ConfigError
from pipeline.engine.jit import simulate_jit
from pipeline.engine.model import FleetSpec, Scaling, SchedulerConfig
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.replay.autoscale import (
    AUTOSCALE_CATALOG,
    AutoscaleSettings,
    decide,
    minute_percentiles,
    replay_autoscaled,
    scale_up_delay,
    slo_miss,
    timeline,
    window_signals,
)
from pipeline.replay.fleet import load_fleet, resolve
from pipeline.replay.run import replay

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "sample" / "gateway_demo_2025-01-15.jsonl.gz"
EXAMPLE = ROOT / "fleets" / "autoscale.toml"

FLEET = """
name = "scaled"
model = "llama-3.1-8b"
hardware = "h100-sxm"
router = "{router}"
[engine]
max_model_len = 131072
[autoscale]
{table}
"""


def _fleet(tmp_path: Path, table: str, router: str = "round_robin") -> Path:
    path = tmp_path / "scaled.toml"
    path.write_text(FLEET.format(table=table, router=router))
    return path


# -- the replica timeline and routing ------------------------------------------------------------


def test_timeline_pays_a_new_replica_from_the_decision_and_serves_it_after_the_delay() -> None:
    incs = timeline([(100.0, 3), (500.0, 1)], initial=1, delay_s=30.0, replicas=4)
    got = sorted((i.replica, i.paid_from_s, i.live_from_s, i.retire_s) for i in incs)
    # replica 0 is warm from the start; 1 and 2 are paid at 100, live at 130; the scale-down to 1
    # retires the newest first (2, then 1), never the warm one
    assert got == [(0, 0.0, 0.0, math.inf), (1, 100.0, 130.0, 500.0), (2, 100.0, 130.0, 500.0)]


def test_a_replica_still_starting_is_cancelled_before_a_serving_one_retires() -> None:
    incs = timeline([(100.0, 2), (110.0, 3), (120.0, 2)], initial=1, delay_s=60.0, replicas=4)
    by = {(i.replica, i.paid_from_s): i for i in incs}
    assert by[(2, 110.0)].retire_s == 120.0 and by[(2, 110.0)].live_from_s == 170.0  # never live
    assert by[(1, 100.0)].retire_s == math.inf


def test_round_robin_cycles_over_the_live_replicas_only() -> None:
    work = workload([0.0, 1.0, 12.0, 15.0, 16.0, 17.0, 18.0], [16] * 7, [1] * 7)
    cfg = SchedulerConfig(num_gpu_blocks=64, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64)
    scaling = Scaling("schedule", initial=1, delay_s=5.0, max_replicas=3, planned=((10.0, 3),))
    res = simulate_jit(work, FleetSpec(replicas=3, scheduler=cfg), LinearCost(), scaling=scaling)
    # replica 0 alone until 15 s; from then the counter (at 3) walks 0, 1, 2 in index order
    assert res.replica.tolist() == [0, 0, 0, 0, 1, 2, 0]


def test_signals_are_spans_spread_over_the_windows_per_live_replica() -> None:
    incs = timeline([], initial=2, delay_s=0.0, replicas=2)
    cols = {
        "start_s": np.array([5.0, 8.0]),
        "end_s": np.array([15.0, 10.0]),
        "waiting": np.array([4, 0]),
        "kv_blocks_used": np.array([100, 50]),
    }
    sig = window_signals(cols, incs, np.array([0.0, 10.0, 20.0]), kv_blocks=1000)
    # window [0, 10): busy 5 s + 2 s of 2 × 10 replica-seconds; waiting 4 × 5 s; kv 100·5 + 50·2
    assert sig["utilisation"].tolist() == pytest.approx([7 / 20, 5 / 20])
    assert sig["queue"].tolist() == pytest.approx([20 / 20, 20 / 20])
    assert sig["kv"].tolist() == pytest.approx([600 / 20 / 1000, 500 / 20 / 1000])


def test_decide_scales_up_in_proportion_and_down_one_at_a_time_after_the_cooldown() -> None:
    policy = AutoscaleSettings(1, 8, "utilisation", 0.5, 0.2, window_s=10.0, cooldown_s=15.0)
    edges = np.arange(6, dtype=float) * 10.0
    # 0.9 at 10 s: ⌈1 × 0.9 / 0.5⌉ = 2; 20 s inside the cooldown; 0.1 at 30 s: one fewer
    assert decide(policy, np.array([0.9, 0.9, 0.1, 0.1, 0.1]), edges) == [(10.0, 2), (30.0, 1)]


# -- hand-computed GPU-hours of a schedule, through replay and cost --------------------------------


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The bundled gateway demo hour (3,000 requests), ingested."""
    store = Store(tmp_path_factory.mktemp("autoscale") / "store")
    ingest_logs([SAMPLE], store)
    return store


def test_a_schedule_that_doubles_the_replicas_charges_the_extra_gpu_hours_from_its_hour(
    day: Store, tmp_path: Path
) -> None:
    from pipeline.economics.cost import run_cost

    shutil.copytree(day.root, tmp_path / "store")
    store = Store(tmp_path / "store")
    path = _fleet(tmp_path, 'min_replicas = 1\nmax_replicas = 2\nsignal = "schedule"\nschedule = [[0, 1], [0.25, 2]]')
    run = replay(store, path)
    config = json.loads((run.run_dir / "config.json").read_text())
    auto = config["summary"]["autoscale"]
    fleet = resolve(load_fleet(path))
    catalog = tomllib.loads(AUTOSCALE_CATALOG.read_text())
    load = catalog["storage"][catalog["default_storage"]]["load_gb_s"]
    delay = fleet.memory.weights_bytes_per_gpu / (load * 1e9) + catalog["engine_start_s"] + catalog["cuda_graph_s"]
    assert auto["scale_up_delay_s"] == pytest.approx(delay, rel=1e-12)
    second = [r for r in auto["replicas"] if r["replica"] == 1]
    assert [(r["paid_from_s"], r["live_from_s"]) for r in second] == [(900.0, pytest.approx(900.0 + delay))]
    req = pl.from_arrow(pq.read_table(run.run_dir / "requests.parquet"))
    assert isinstance(req, pl.DataFrame)
    assert req.height == day.read_requests("2025-01-15").height  # rows in = rows out
    early = req.filter(pl.col("arrival_s") < 900.0 + delay)
    assert early.filter(pl.col("replica") == 1).height == 0 and req.filter(pl.col("replica") == 1).height > 0
    # the series: each replica's live share of each second (replica 1 from the decision + delay)
    series = pl.from_arrow(pq.read_table(run.run_dir / "series.parquet"))
    assert isinstance(series, pl.DataFrame)
    second = series.filter(pl.col("replica") == 1)
    assert second.filter(pl.col("second") + 1 <= 900.0 + delay)["live_fraction"].sum() == 0.0
    assert (second.filter(pl.col("second") >= 900.0 + delay)["live_fraction"] == 1.0).all()
    assert (series.filter(pl.col("replica") == 0)["live_fraction"] == 1.0).all()
    # the report's rows: live and provisioned replicas per minute, arrivals per minute
    from pipeline.publish.report import autoscale_day

    shown = autoscale_day(auto, run.run_dir)
    at = {r["minute"]: r for r in shown.replicas}
    assert at[15] == {"minute": 15, "live": 1, "provisioned": 2}  # paid from 900 s, not yet serving
    assert at[math.ceil((900.0 + delay) / 60.0)]["live"] == 2
    assert sum(r["requests"] for r in shown.load) == req.height
    cost = run_cost(store, run.run_id)
    span, price = cost.gpu.window_s, cost.gpu.usd_per_gpu_hour
    # one replica all the period, the second from the decision at 0.25 h (its delay paid, not served)
    assert cost.gpu.paid_gpu_s == pytest.approx(span + (span - 900.0), rel=1e-12)
    assert cost.gpu.total_usd == pytest.approx((2 * span - 900.0) * price / 3600.0, rel=1e-12)
    doc = json.loads((cost.out_dir / "cost.json").read_text())["autoscale"]
    assert doc["static_usd"] - doc["autoscaled_usd"] == pytest.approx(900.0 * price / 3600.0, rel=1e-9)
    assert doc["static_gpu_hours"] == pytest.approx(2 * span / 3600.0, rel=1e-12)
    # energy: a replica idles only while paid (the second one not before 900 s)
    from pipeline.economics.energy import load_power, run_energy

    pool = run_energy(run.run_dir, config).pools[0]
    steps = pl.from_arrow(pq.read_table(run.run_dir / "steps.parquet"))
    assert isinstance(steps, pl.DataFrame)
    busy = float((steps["end_s"] - steps["start_s"]).sum())
    idle_w = load_power()["h100-sxm"].idle_w
    assert pool.idle_j == pytest.approx(idle_w * (2 * span - 900.0 - busy), rel=1e-9)


# -- a synthetic diurnal day -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def diurnal_runs() -> dict[str, Any]:
    """The diurnal day on 1..4 replicas by KV use, with a 41 s engine start ("quick") and a 20-minute
    one ("slow"): each run's results and its recorded autoscale (as config.json holds it)."""
    fleet = resolve(replace(load_fleet(EXAMPLE), autoscale=None, replicas=4))
    spec, cost = fleet.spec(), fleet.cost_model.table
    work = diurnal()
    weights = fleet.memory.weights_bytes_per_gpu
    out: dict[str, Any] = {"work": work, "spec": spec, "cost": cost}
    for name, start_s in (("quick", 41.0), ("slow", 1200.0)):
        policy = AutoscaleSettings(
            1, 4, "kv", 0.3, 0.1, window_s=60.0, load_gb_s=7.0, engine_start_s=start_s, cuda_graph_s=17.0
        )
        res, routes, scaled, _ = replay_autoscaled(work, spec, policy, weights, cost)
        assert (routes >= 0).all() and res.arrival_s.shape == work.arrival_s.shape
        assert scaled.delay_s == pytest.approx(scale_up_delay(policy, weights))
        out[name] = (res, scaled, json.loads(json.dumps(scaled.to_dict())))
    return out


def test_on_a_diurnal_day_autoscaling_meets_the_slo_for_less_and_a_slow_start_misses_the_ramp(
    diurnal_runs: dict[str, Any],
) -> None:
    SLO_S, RAMP = 2.0, (1200.0, 2400.0)
    work, spec, cost = diurnal_runs["work"], diurnal_runs["spec"], diurnal_runs["cost"]
    last = float(work.arrival_s.max())
    static = {r: ttft_p99(simulate_jit(work, replace(spec, replicas=r), cost)) for r in (3, 4)}
    assert static[3] > SLO_S >= static[4]  # 4 replicas is the static fleet sized for the peak
    static_gpu_h = 4 * last / 3600.0
    quick, scaled, record = diurnal_runs["quick"]
    assert (record["decided_in"], record["passes"], record["converged"]) == ("event_loop", 1, True)
    assert ttft_p99(quick) <= SLO_S  # meets the SLO over the day ...
    assert scaled.provisioned_s(0.0, last) / 3600.0 < 0.75 * static_gpu_h  # ... for well under the peak's GPU-hours
    slow = diurnal_runs["slow"][0]  # a 20-minute start: the replicas come after the ramp
    assert ttft_p99(slow, *RAMP) > SLO_S > ttft_p99(quick)
    assert ttft_p99(slow, *RAMP) > 10 * ttft_p99(quick, *RAMP)


def test_a_slow_start_that_misses_the_slo_says_when_and_why_and_a_quick_one_says_nothing(
    diurnal_runs: dict[str, Any],
) -> None:
    slow, scaled, record = diurnal_runs["slow"]
    ttft = slow.first_token_s - slow.arrival_s
    per = minute_percentiles(slow.arrival_s, ttft, 99.0)
    # the run's own minutes, checked by hand: the night and the ramp's first 4 minutes stay under
    # 0.4 s; from minute 24 (the ramp's 5th) every minute's p99 is above 2 s until minute 75, when
    # the 4 replicas have worked off the backlog built while they started (the decisions made in
    # the loop, one pass; the 8 passes of the earlier control loop had not converged and kept the
    # backlog to the day's end)
    assert per.shape == (90,) and per[:24].max() < 0.4 and per[24:75].min() > 2.0 and per[75:].max() < 2.0
    assert per[:24].tolist() == pytest.approx([ttft_p99(slow, 60.0 * m, 60.0 * (m + 1)) for m in range(24)])
    miss = slo_miss(record, slow.arrival_s, ttft, 2.0)
    assert miss is not None
    assert (miss["from_s"], miss["until_s"], miss["minutes_above"], miss["spans"]) == (1440.0, 4500.0, 51, 1)
    # the first scale-up was decided at the end of minute 23's window; 3 replicas start together
    first = min(r["paid_from_s"] for r in record["replicas"] if r["paid_from_s"] > 0)
    assert miss["decided_from_s"] == first == 1440.0 and miss["starting_replicas"] == 3
    assert miss["serving_from_s"] == pytest.approx(1440.0 + scaled.delay_s)
    line = miss["line"]
    assert line.startswith("AUTOSCALE: TTFT p99 above the SLO's 2 s from minute 24 to minute 75 (after the first")
    assert "while 3 replicas were starting (scale-up delay 1,219 s: weights 16.1 GB at 7 GB/s (2.3 s) + " in line
    assert "engine start 1,200 s + CUDA graphs 17 s; the first decided at minute 24 served from minute 44)" in line
    assert "a lower scale_up_at (0.3)" in line
    # on the log's clock: a day whose first arrival was 07:10 UTC
    t0 = int(np.datetime64("2025-01-15T07:10", "us").astype(np.int64))
    on_clock = slo_miss(record, slow.arrival_s, ttft, 2.0, t0_us=t0)
    assert on_clock is not None and "from 07:34 to 08:25 (UTC;" in on_clock["line"]
    # the quick start met the SLO over the day (one bad minute at the ramp is not a miss): no line
    quick, _, quick_record = diurnal_runs["quick"]
    q_ttft = quick.first_token_s - quick.arrival_s
    assert minute_percentiles(quick.arrival_s, q_ttft, 99.0).max() > 2.0
    assert slo_miss(quick_record, quick.arrival_s, q_ttft, 2.0) is None


def _record(replicas: list[tuple[float, float, float | None]], max_replicas: int = 3) -> dict[str, Any]:
    settings = AutoscaleSettings(
        1, max_replicas, "queue", 4.0, 1.0, load_gb_s=2.0, engine_start_s=41.0, cuda_graph_s=17.0
    )
    return {
        "settings": settings.to_dict(),
        "scale_up_delay_s": 16e9 / 2e9 + 41.0 + 17.0,
        "replicas": [
            {"replica": i, "paid_from_s": p, "live_from_s": lv, "retire_s": rt, "end_s": 600.0}
            for i, (p, lv, rt) in enumerate(replicas)
        ],
    }


def test_the_missed_span_is_the_minutes_above_the_limit_and_names_its_cause() -> None:
    # 5 minutes, 100 arrivals each (the 99th of 100 sorted values is the p99): minutes 1 and 2
    # above 2 s, minute 4 above too but alone (a second span, shorter)
    arrival = np.repeat(np.arange(5) * 60.0, 100) + np.tile(np.linspace(0, 59, 100), 5)
    ttft = np.full(500, 0.5)
    for m, v in ((1, 3.0), (2, 9.0), (4, 2.5)):
        ttft[100 * m : 100 * m + 2] = v  # the two largest of the minute: its p99 is one of them
    ttft[250] = np.nan  # never served: infinite, but minute 2's p99 (the 99th value) is still 9 s
    per = minute_percentiles(arrival, ttft, 99.0)
    assert per.tolist() == [0.5, 3.0, 9.0, 0.5, 2.5]
    # a replica decided at 70 s that serves at 136 s (8 s of weights + 41 + 17); one cancelled
    record = _record([(0.0, 0.0, None), (70.0, 136.0, None), (250.0, 316.0, 260.0)])
    miss = slo_miss(record, arrival, ttft, 2.0)
    assert miss is not None
    assert (miss["from_s"], miss["until_s"], miss["minutes_above"], miss["spans"]) == (60.0, 180.0, 5 - 2, 2)
    assert (miss["starting_replicas"], miss["decided_from_s"], miss["serving_from_s"]) == (1, 70.0, 136.0)
    assert miss["worst_s"] == 9.0 and miss["live_replicas"] == 1  # the new one serves from 136 s, after minute 2 starts
    assert miss["line"] == (
        "AUTOSCALE: TTFT p99 above the SLO's 2 s from minute 1 to minute 3 (after the first arrival; worst minute "
        "9.0 s) while 1 replica was starting (scale-up delay 66 s: weights 16.0 GB at 2 GB/s (8.0 s) + engine start "
        "41 s + CUDA graphs 17 s; the first decided at minute 1 served from minute 2): a shorter scale-up delay "
        "(faster weight storage, a quicker engine start) or a lower scale_up_at (4) would have had them serving "
        "sooner (3 minutes above in all, in 2 spans)"
    )
    # every replica live and none to add: the cause is max_replicas
    full = slo_miss(_record([(0.0, 0.0, None), (0.0, 0.0, None)], max_replicas=2), arrival, ttft, 2.0)
    assert full is not None and full["starting_replicas"] == 0
    assert "with all 2 replicas (max_replicas) live: the policy had no replica left to add" in full["line"]
    # a day within the limit says nothing, whatever its worst minute
    assert slo_miss(record, arrival, ttft, 10.0) is None
    assert slo_miss(record, np.zeros(0), np.zeros(0), 2.0) is None


# -- hostile [autoscale] tables ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('min_replicas = 4\nmax_replicas = 2\nsignal = "queue"', "min_replicas (4) is more than max_replicas (2)"),
        (
            'min_replicas = 1\nmax_replicas = 2\nsignal = "kv"\nscale_up_at = 0.8\nscale_down_at = 0.2\n'
            "engine_start_s = -5.0",
            "engine_start_s must be a number in [0, 86400], got -5.0",
        ),
        (
            'min_replicas = 1\nmax_replicas = 2\nsignal = "kv"\nscale_up_at = nan\nscale_down_at = 0.2',
            "scale_up_at must be a number in (0, 1], got nan",
        ),
        ('min_replicas = 1\nmax_replicas = 2\nsignal = "cpu"', "signal 'cpu' unknown"),
        (
            'min_replicas = 1\nmax_replicas = 2\nsignal = "schedule"\nschedule = [[1, 2], [0.5, 1]]',
            "schedule hours must increase",
        ),
        ('min_replicas = 1\nmax_replicas = 2\nsignal = "schedule"\nschedule = [[0, 3]]', "schedule[0] replicas"),
        ('min_replicas = 1\nmax_replicas = 2\nsignal = "queue"\nscale_up_at = 1.0', "needs scale_down_at"),
        (
            'min_replicas = 1\nmax_replicas = 2\nsignal = "queue"\nscale_up_at = 1.0\nscale_down_at = 0.1\n'
            "load_gb_s = 1e300",
            "load_gb_s must be a number in (0, 10000], got 1e+300",
        ),
        ('min_replicas = 1\nmax_replicas = "two"\nsignal = "queue"', "max_replicas must be an integer"),
    ],
)
def test_hostile_autoscale_tables_are_one_line_naming_the_file_and_key(tmp_path: Path, table: str, says: str) -> None:
    path = _fleet(tmp_path, table)
    with pytest.raises(ConfigError) as info:
        load_fleet(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)) and says in message, message
    out = CliRunner().invoke(main, ["replay", "--fleet", str(path), "--store", str(tmp_path / "none")])
    assert out.exit_code == 1 and len(out.output.strip().splitlines()) == 1 and says in out.output


def test_an_autoscaled_fleet_refuses_what_it_does_not_route(tmp_path: Path) -> None:
    table = 'min_replicas = 1\nmax_replicas = 2\nsignal = "schedule"\nschedule = [[0, 1]]'
    with pytest.raises(ConfigError, match="routes over its live replicas"):
        load_fleet(_fleet(tmp_path, table, router="session_affinity"))
    with pytest.raises(ConfigError, match="autoscales"):
        load_fleet(_fleet(tmp_path, table)).with_replicas(3)
    path = _fleet(tmp_path, table)
    path.write_text(path.read_text().replace('router = "round_robin"', 'router = "round_robin"\ndp = 2'))
    with pytest.raises(ConfigError, match="dp = 2"):
        load_fleet(path)


def test_the_example_fleet_records_its_policy_and_reads_it_back() -> None:
    from pipeline.replay.fleet import fleet_from_dict

    cfg = load_fleet(EXAMPLE)
    assert cfg.autoscale is not None and cfg.replicas == cfg.autoscale.max_replicas
    recorded = json.loads(json.dumps(resolve(cfg).to_dict()["fleet"]))
    assert fleet_from_dict(recorded, "run").autoscale == cfg.autoscale


# -- plan --autoscale --------------------------------------------------------------------------------


def test_plan_prices_the_chosen_configuration_static_and_autoscaled(day: Store, tmp_path: Path) -> None:
    from pipeline.plan import PlanOptions, plan

    path = _fleet(tmp_path, 'min_replicas = 1\nmax_replicas = 4\nsignal = "schedule"\nschedule = [[0, 1], [0.5, 4]]')
    opts = PlanOptions(model="llama-3.1-8b", fleet_path=str(path), hardware=("h100-sxm",), tp=(1,), window="day")
    result = plan(day, replace(opts, autoscale=True))
    chosen, scaled = result.doc["chosen"], result.doc["autoscale"]
    price = scaled["usd_per_gpu_hour"]
    # static: the chosen replicas all the period, the figure the plan ranks by
    assert scaled["static_replicas"] == chosen["replicas"]
    assert scaled["static_usd"] == pytest.approx(chosen["usd_per_period"], rel=1e-9)
    # autoscaled: the schedule clipped to the chosen replicas, priced at the same $/GPU-h
    assert scaled["policy"]["max_replicas"] == chosen["replicas"]
    assert scaled["autoscaled_usd"] == pytest.approx(scaled["autoscaled_gpu_hours"] * price, rel=1e-12)
    assert scaled["autoscaled_gpu_hours"] <= scaled["static_gpu_hours"] + 1e-9
    # a day that misses its TTFT target says when and why; one that meets it says nothing
    ttft_failed = any(t["target"].startswith("ttft") and not t["met"] for t in scaled["autoscaled_targets"])
    assert (scaled["autoscaled_slo_miss"] is not None) == ttft_failed
    with pytest.raises(ConfigError, match="has none"):
        plan(day, replace(opts, autoscale=True, fleet_path=str(ROOT / "fleets" / "default.toml")))


def test_a_pool_autoscales_and_is_priced_for_what_it_provisioned(day: Store, tmp_path: Path) -> None:
    from pipeline.economics.cost import PooledGpuCost, run_cost

    shutil.copytree(day.root, tmp_path / "store")
    store = Store(tmp_path / "store")
    text = (
        'name = "split"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n[engine]\nmax_model_len = 131072\n'
        '[[pool]]\nname = "gold"\nreplicas = 1\n[pool.match]\ntenant = ["tenant-1"]\n'
        '[[pool]]\nname = "main"\n[pool.autoscale]\nmin_replicas = 1\nmax_replicas = 2\nsignal = "schedule"\n'
        "schedule = [[0, 1], [0.25, 2]]\n"
    )
    path = tmp_path / "pools.toml"
    path.write_text(text)
    run = replay(store, path)
    summary = json.loads((run.run_dir / "config.json").read_text())["summary"]
    assert "autoscale" in summary["pools"]["main"] and "autoscale" not in summary["pools"]["gold"]
    cost = run_cost(store, run.run_id)
    assert isinstance(cost.gpu, PooledGpuCost)
    parts = dict(cost.gpu.pools)
    span = cost.gpu.pools[0][1].window_s
    assert parts["gold"].paid_gpu_s == pytest.approx(span, rel=1e-12)  # static: all the period
    assert parts["main"].paid_gpu_s == pytest.approx(2 * span - 900.0, rel=1e-12)
    series = pl.from_arrow(pq.read_table(run.run_dir / "series.parquet"))
    assert isinstance(series, pl.DataFrame)
    assert (series.filter(pl.col("pool") == "gold")["live_fraction"] == 1.0).all()


def test_every_default_of_the_autoscale_catalog_cites_its_source() -> None:
    catalog = tomllib.loads(AUTOSCALE_CATALOG.read_text())
    sources = catalog["sources"]
    assert catalog["default_storage"] in catalog["storage"]
    for key in ("engine_start_s", "cuda_graph_s", *catalog["storage"]):
        assert len(str(sources.get(key, ""))) > 40, key  # a title, a date or an address, not a word
    for kind in catalog["storage"].values():
        assert 0 < kind["load_gb_s"] <= 100


def test_a_plan_without_autoscale_records_the_options_it_always_did() -> None:
    from pipeline.plan import PlanOptions

    opts = PlanOptions(model="llama-3.1-8b", hardware=("h100-sxm",), tp=(1,))
    assert "autoscale" not in opts.record() and replace(opts, autoscale=True).record()["autoscale"] is True


# -- the missed SLO in the replay's output and the report's banner -----------------------------------

SLOW_START = (
    'min_replicas = 1\nmax_replicas = 4\nsignal = "queue"\nscale_up_at = 2.0\nscale_down_at = 0.1\nwindow_s = 30.0\n'
    'engine_start_s = {start}\n[slo]\npreset = "chat"'
)


@pytest.fixture(scope="module")
def slow_start_run(day: Store, tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, str, str]:
    """The demo hour 10 times as fast (3,000 requests in 6 minutes) on 1..4 replicas by queue,
    each new one starting in 300 s: the `replay` command's output and the run's id."""
    where = tmp_path_factory.mktemp("slow-start")
    shutil.copytree(day.root, where / "store")
    path = _fleet(where, SLOW_START.format(start=300.0))
    out = CliRunner().invoke(
        main, ["replay", "--fleet", str(path), "--store", str(where / "store"), "--rate-scale", "10"]
    )
    assert out.exit_code == 0, out.output
    run_id = next(line.split()[1] for line in out.output.splitlines() if line.startswith("run "))
    return Store(where / "store"), run_id, out.output


def test_the_replay_says_first_when_and_why_a_slow_start_missed_the_slo(
    slow_start_run: tuple[Store, str, str], tmp_path: Path
) -> None:
    store, run_id, output = slow_start_run
    lines = output.splitlines()
    auto = next(i for i, line in enumerate(lines) if "AUTOSCALE: TTFT p99 above the SLO's 2 s" in line)
    assert auto < next(i for i, line in enumerate(lines) if line.startswith("run "))  # with the failures, first
    assert "SLO chat: FAIL" in lines[auto - 1]  # right after the SLO's own line
    summary = json.loads((store.run_dir(run_id) / "config.json").read_text())["summary"]
    miss = summary["autoscale"]["slo_miss"]
    assert miss["line"] in summary["health"]["warnings"]
    # the run's clock: minutes after the first arrival; the log's: 10 logged seconds a replayed one,
    # from the demo day's first arrival (2025-01-15T00:00 UTC)
    req = pl.from_arrow(pq.read_table(store.run_dir(run_id) / "requests.parquet"))
    assert isinstance(req, pl.DataFrame)
    per = minute_percentiles(req["arrival_s"].to_numpy(), req["ttft_s"].to_numpy(), 99.0)
    above = np.flatnonzero(per > 2.0)
    assert miss["from_s"] == 60.0 * above[0] and miss["until_s"] == 60.0 * (above[-1] + 1)
    first = req["arrival"].min()
    assert str(first).startswith("2025-01-15 00:00")
    assert (
        f"from 00:{int(miss['from_s'] * 10 / 60):02d} to 00:{int(miss['until_s'] * 10 / 60):02d} (UTC;" in miss["line"]
    )
    assert "engine start 300 s + CUDA graphs 17 s" in miss["line"] and miss["starting_replicas"] >= 1
    # a policy that starts in 5 s at 8 times the rate meets the SLO: no such line
    path = _fleet(tmp_path, SLOW_START.format(start=5.0))
    shutil.copytree(store.root, tmp_path / "store")
    quick = CliRunner().invoke(
        main, ["replay", "--fleet", str(path), "--store", str(tmp_path / "store"), "--rate-scale", "8"]
    )
    assert quick.exit_code == 0 and "SLO chat: PASS" in quick.output and "AUTOSCALE" not in quick.output


@pytest.mark.browser
def test_the_report_of_a_slow_start_renders_in_chromium_with_the_line_in_its_banner(
    slow_start_run: tuple[Store, str, str], tmp_path: Path
) -> None:
    import html as html_lib

    from pipeline.publish.report import build_report
    from tests.test_report import offline_dom

    store, run_id, _ = slow_start_run
    res = build_report(store, run_id, out=tmp_path / "index.html")
    miss = json.loads((store.run_dir(run_id) / "config.json").read_text())["summary"]["autoscale"]["slo_miss"]
    dom = offline_dom(res.path, tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert [line for line in dom.stderr.splitlines() if ":CONSOLE" in line] == []
    page = dom.stdout
    banner = html_lib.unescape(page.split('<div class="alert">')[1].split("</div>")[0])
    assert miss["line"] in banner
    ids = re.findall(r'<div class="chart[^"]*" id="(chart-[a-z_]+)"', page)
    assert {"chart-autoscale_replicas", "chart-autoscale_ttft"} <= set(ids)
    parts = re.split(r'<div class="chart[^"]*" id="chart-[a-z_]+"', page)[1:]
    for chart_id, part in zip(ids, parts, strict=True):
        body = part.split("</section>")[0]
        assert "<svg" in body and re.search(r'class="mark-(line|area|rect|symbol)', body), chart_id
        assert "chart failed" not in body, chart_id
