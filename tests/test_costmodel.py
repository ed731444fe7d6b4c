"""pipeline.costmodel.model: one cost model per pool, built once, that every consumer prices with."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.costmodel.model import UNPRICED_STEP_S, CostModel, tokens_per_s
from pipeline.costmodel.profile.cost import fleet_step_cost
from pipeline.costmodel.roofline import decode_batch, prefill_batch
from pipeline.plan.search import capacity_per_replica
from pipeline.replay.fleet import load_fleet, parse_fleet, resolve
from pipeline.replay.limits import estimate_replay
from pipeline.replay.pools import load_fleet_file

ROOT = Path(__file__).resolve().parents[1]
BASE = {"name": "t", "model": "llama-3.1-8b", "hardware": "h100-sxm", "replicas": 1}


def _fleet(**over: object):  # type: ignore[no-untyped-def]
    return resolve(parse_fleet(BASE | over, "t"))


def test_a_fleet_builds_its_cost_model_once_and_it_is_the_fleets_tier() -> None:
    fleet = _fleet()
    first = fleet.cost_model
    assert fleet.cost_model is first  # built once, kept
    assert first.source == "measured" == fleet_step_cost(fleet).source
    assert first.deployment is fleet.deployment
    batch = decode_batch([1.0, 8.0, 64.0], [512.0, 2048.0, 4096.0])
    np.testing.assert_array_equal(first(batch).time_s, fleet_step_cost(fleet)(batch).time_s)
    assert _fleet(cost_model="roofline").cost_model.source == "roofline"


def test_step_s_is_the_tables_price_of_one_step() -> None:
    model = _fleet().cost_model
    want = float(model.table(decode_batch([16.0], [1000.0])).time_s[0])
    assert model.step_s(16, 1000.0) == pytest.approx(want, rel=1e-12)
    want_pre = float(model.table(prefill_batch([512.0])).time_s[0])
    assert model.step_s(0, 0.0, 512.0) == pytest.approx(want_pre, rel=1e-12)
    assert model.step_s(16, 1000.0, 512.0) > max(want, want_pre)  # a mixed step costs more than either part


def test_capacity_is_the_budget_and_the_kv_bound_batch_over_their_step_times() -> None:
    fleet = _fleet()
    model, sched = fleet.cost_model, fleet.scheduler
    cap = model.capacity(sched, 1500.0)
    budget = float(sched.max_num_batched_tokens)
    batch = float(max(1, min(sched.max_num_seqs, sched.num_gpu_blocks * sched.block_size // 1500)))
    assert cap["decode_batch"] == batch
    assert cap["prefill_tokens_per_s"] == pytest.approx(budget / float(model(prefill_batch([budget])).time_s[0]))
    assert cap["decode_tokens_per_s"] == pytest.approx(batch / float(model(decode_batch([batch], [1500.0])).time_s[0]))
    assert cap["kv_capacity_tokens"] == sched.num_gpu_blocks * sched.block_size


def test_plan_sizes_with_the_fleets_own_tier_not_the_roofline() -> None:
    fleet = _fleet()
    assert capacity_per_replica(fleet, 1500.0) == fleet.cost_model.capacity(fleet.scheduler, 1500.0)
    roofline = fleet.deployment(decode_batch([64.0], [1500.0])).time_s[0]
    measured = fleet.cost_model(decode_batch([64.0], [1500.0])).time_s[0]
    assert roofline != pytest.approx(measured, rel=1e-3)  # the two tiers differ: which one plan uses matters


def test_the_estimate_prices_steps_with_the_fleets_cost_model(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = _fleet()
    arrival = pl.Series("arrival", [datetime(2025, 1, 15, tzinfo=UTC) + timedelta(seconds=i) for i in range(50)])
    requests = pl.DataFrame({"recorded_input_tokens": [500] * 50, "output_tokens": [100] * 50}).with_columns(arrival)
    asked: list[tuple[float, float, float]] = []
    real = CostModel.step_s

    def spy(self: CostModel, d: float, c: float, p: float = 0.0) -> float:
        asked.append((d, c, p))
        return real(self, d, c, p)

    monkeypatch.setattr(CostModel, "step_s", spy)
    est = estimate_replay(requests, fleet, "open", 1.0, None)
    assert asked and est.seconds > 0
    assert fleet.__dict__["cost_model"] is fleet.cost_model  # the estimate built the one the replay reuses


def test_unpriceable_steps_take_the_estimates_stand_in() -> None:
    model = _fleet().cost_model
    assert model.step_s(float("nan"), 1.0) == UNPRICED_STEP_S
    assert tokens_per_s(100.0, float("inf")) == 0.0 and tokens_per_s(100.0, 0.0) == float("inf")


def test_a_fleet_made_from_another_builds_its_own_model() -> None:
    fleet = _fleet()
    first = fleet.cost_model
    bigger = replace(fleet, config=replace(fleet.config, replicas=4))  # as plan sizes a candidate
    assert "cost_model" not in bigger.__dict__
    batch = decode_batch([4.0], [800.0])
    np.testing.assert_array_equal(bigger.cost_model(batch).time_s, first(batch).time_s)
    assert bigger.cost_model is not first


def test_each_pool_has_a_cost_model_of_its_own_gpu() -> None:
    pooled = load_fleet_file(ROOT / "fleets" / "pools.toml")
    models = {p.name: resolve(p.config).cost_model for p in pooled.pools}  # type: ignore[union-attr]
    assert models["long"].deployment.hardware.name == "h200"
    assert models["short"].deployment.hardware.name == "h100-sxm"
    batch = decode_batch([32.0], [3000.0])
    assert models["long"](batch).time_s[0] < models["short"](batch).time_s[0]  # H200: more HBM bandwidth


def test_the_default_fleet_file_resolves_to_the_measured_tier() -> None:
    assert resolve(load_fleet(ROOT / "fleets" / "default.toml")).cost_model.source == "measured"
