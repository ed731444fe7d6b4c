"""Data-parallel ranks in lockstep (FleetSpec.lockstep, FLEET.toml ``dp`` on an MoE model): a
hand-computed schedule, the jit engine equal to the reference on generated traces, and the
fleet-level wiring (ranks, memory per rank, cost of the MoE layers over dp ranks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import _EXAMPLES, _assert_same, _cases, check_invariants
from test_engine_support import LinearCost, workload

from pipeline.common.errors import ConfigError
from pipeline.engine.jit import simulate_jit
from pipeline.engine.model import FleetSpec, SchedulerConfig, Workload, dummy_step_s
from pipeline.engine.reference import simulate_reference
from pipeline.engine.steplog import StepLog


def _cfg() -> SchedulerConfig:
    return SchedulerConfig(
        num_gpu_blocks=1000, max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=256, block_size=4
    )


def test_lockstep_hand_calculation() -> None:
    # cost = a + b·prefill_tokens + d·decode_seqs; dummy step (one decode) = a + d.
    a, b, d = 1.0, 0.1, 0.5
    cost = LinearCost(a=a, b=b, c=0.0, d=d, e=0.0)
    assert dummy_step_s(cost) == pytest.approx(a + d)
    # Two ranks, round robin: request 0 (prompt 10, output 3) on rank 0 at t=0, request 1
    # (prompt 2, output 1) on rank 1 at t=0.
    w = workload([0.0, 0.0], [10, 2], [3, 1])
    spec = FleetSpec(replicas=2, scheduler=_cfg(), lockstep=2)
    # Step 1 (both prefill): rank 0 costs a + 10b = 2.0, rank 1 a + 2b = 1.2 -> 2.0 for both.
    # Request 1 finishes at 2.0. Steps 2, 3: rank 0 decodes (a + d = 1.5), rank 1 idle runs a
    # dummy (1.5): request 0 finishes at 2.0 + 1.5 + 1.5 = 5.0.
    for res in (simulate_reference(w, spec, cost), simulate_jit(w, spec, cost)):
        np.testing.assert_allclose(res.first_token_s, [2.0, 2.0])
        np.testing.assert_allclose(res.finish_s, [5.0, 2.0])
    # Independent ranks: request 1 is done at a + 2b = 1.2, request 0 unchanged.
    free = FleetSpec(replicas=2, scheduler=_cfg())
    np.testing.assert_allclose(simulate_jit(w, free, cost).finish_s, [5.0, 1.2])


def test_idle_group_waits_for_the_next_arrival_and_a_slow_rank_sets_the_pace() -> None:
    a, b, d = 1.0, 0.1, 0.5
    cost = LinearCost(a=a, b=b, c=0.0, d=d, e=0.0)
    # Rank 0 gets a long prompt at t=0 (one step of a + 100b = 11), rank 1 a short one at t=3
    # that must wait for the group's step to end at 11, then both run together.
    w = workload([0.0, 3.0], [100, 2], [2, 1])
    spec = FleetSpec(replicas=2, scheduler=_cfg(), lockstep=2)
    ref = simulate_reference(w, spec, cost)
    # step 1: [0, 11] rank 0 prefill, rank 1 dummy; step 2 at 11: rank 0 decodes (1.5), rank 1
    # prefills 2 tokens (1.2): 1.5.
    np.testing.assert_allclose(ref.scheduled_s, [0.0, 11.0])
    np.testing.assert_allclose(ref.finish_s, [12.5, 12.5])
    _assert_same(simulate_jit(w, spec, cost), ref)


def test_lockstep_groups_past_the_state_limit_stay_on_the_compiled_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Least outstanding over lockstep groups that keeps more groups busy than jit.MAX_STATE_BYTES
    starts on grows on the compiled engine a whole group at a time, equal to the reference (no
    engine refuses dp ranks any more, and none other takes over); ranks that do not make whole
    groups are refused."""
    from dataclasses import replace

    from pipeline.engine import jit

    w = workload([0.0] * 12, [30, 8, 50, 12, 20, 9, 40, 16, 11, 35, 7, 22], [6, 3, 9, 2, 5, 4, 8, 3, 2, 7, 1, 4])
    spec = FleetSpec(replicas=8, scheduler=_cfg(), router="least_outstanding", lockstep=2)
    monkeypatch.setattr(jit, "MAX_STATE_BYTES", jit.state_bytes(replace(spec, replicas=2)))
    busy = jit.busy_fleet(w, spec)
    assert busy.open_top and busy.spec.replicas == 2  # one group fits
    cost = LinearCost(a=1.0, b=0.1, c=0.0, d=0.5, e=0.0)
    log = StepLog()
    res = simulate_jit(w, spec, cost, log)
    ref = simulate_reference(w, spec, cost)
    _assert_same(res, ref)
    check_invariants(w, spec, res, log)
    assert res.replica.max() >= 4  # it grew past the first group, and past the limit
    with pytest.raises(ConfigError, match="do not divide"):
        FleetSpec(replicas=3, scheduler=_cfg(), lockstep=2)


@st.composite
def _lockstep_cases(draw: st.DrawFn) -> tuple[Workload, FleetSpec, object]:
    w, spec, cost = draw(_cases())
    g = draw(st.integers(2, 3))
    groups = draw(st.integers(1, 2))
    spec = FleetSpec(
        replicas=g * groups,
        scheduler=spec.scheduler,
        router=spec.router,
        mode=spec.mode,
        concurrency=spec.concurrency,
        lockstep=g,
    )
    return w, spec, cost


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_lockstep_cases())
def test_jit_lockstep_equals_reference(case: tuple[Workload, FleetSpec, object]) -> None:
    w, spec, cost = case
    ref = simulate_reference(w, spec, cost)  # type: ignore[arg-type]
    log = StepLog()
    res = simulate_jit(w, spec, cost, log)  # type: ignore[arg-type]
    _assert_same(res, ref)
    check_invariants(w, spec, res, log)


# -- fleets: FLEET.toml dp / ep ------------------------------------------------------------------

FLEETS = __import__("pathlib").Path(__file__).resolve().parents[1] / "fleets"


def test_dp_ep_fleet_replays_on_the_jit_engine_equal_to_the_reference() -> None:
    from test_measured_fleets import _requests

    from pipeline.costmodel.profile.cost import fleet_step_cost
    from pipeline.replay.fleet import load_fleet, resolve
    from pipeline.replay.run import ReplayOptions, build_workload, run_replay, summarize

    fleet = resolve(load_fleet(FLEETS / "qwen3-30b-a3b-h100-dp2-ep2.toml"))
    assert (fleet.ranks, fleet.lockstep) == (4, 2)
    cost = fleet_step_cost(fleet)
    assert "moe_ep=2" in cost.describe["moe"]
    assert cost.describe["moe_dispatch"].startswith("allgather_reducescatter")
    frame = _requests(80)
    options = ReplayOptions(rate_scale=4.0)
    run = run_replay(frame, fleet, options)
    assert run.spec.lockstep == 2 and run.spec.replicas == 4
    work = build_workload(frame, fleet, options)
    ref = simulate_reference(work, run.spec, cost)
    _assert_same(run.result, ref)
    assert set(run.result.replica.tolist()) == {0, 1, 2, 3}  # every rank served requests
    summary = summarize(run)
    assert summary["cost_model"]["source"] == "measured"


def test_dp_fleet_keys_memory_per_rank_and_validation() -> None:
    from pipeline.costmodel.fit import weights_bytes_per_gpu
    from pipeline.replay.fleet import parse_fleet, resolve

    base = {"name": "t", "model": "qwen3-30b-a3b", "hardware": "h100-sxm", "engine": {"max_model_len": 8192}}
    one = resolve(parse_fleet(base, "t"))
    dp2 = resolve(parse_fleet(base | {"dp": 2, "ep": 2}, "t"))
    m = one.deployment.model
    # Experts are spread over both ranks' GPUs: each GPU holds half of them, the rest is whole.
    expert_bytes = m.num_moe_layers * m.num_experts * m.expert_params() * 2.0
    assert weights_bytes_per_gpu(one.deployment) - weights_bytes_per_gpu(dp2.deployment) == pytest.approx(
        expert_bytes / 2, rel=1e-9
    )
    # so each rank's KV cache is larger than the single GPU's
    assert dp2.memory.kv_capacity_blocks > one.memory.kv_capacity_blocks
    assert dp2.to_dict()["gpus_per_replica"] == 2
    # dense models: dp ranks are independent engines (no lockstep)
    dense = resolve(
        parse_fleet({"name": "d", "model": "llama-3.1-8b", "hardware": "h100-sxm", "dp": 2, "replicas": 3}, "d")
    )
    assert (dense.ranks, dense.lockstep) == (6, 1)
    with pytest.raises(ConfigError, match=r"ep must be 1 or tp x dp = 2"):
        resolve(parse_fleet(base | {"dp": 2, "ep": 4}, "t"))
    with pytest.raises(ConfigError, match="dp must be >= 1"):
        parse_fleet(base | {"dp": 0}, "t")
    with pytest.raises(ConfigError, match="more than 1024"):
        parse_fleet(base | {"dp": 10**9}, "t")


def test_moe_layers_over_dp_ranks_roofline_hand_check() -> None:
    from pipeline.catalog import load_hardware, load_model
    from pipeline.costmodel.roofline import ACT_BYTES, Deployment, operators
    from pipeline.costmodel.steps import StepBatch

    m, hw = load_model("qwen3-30b-a3b"), load_hardware("h100-sxm")
    t = np.array([0.0, 64.0, 1000.0])
    z = np.zeros(3)
    batch = StepBatch(z, z.copy(), z.copy(), z.copy(), t, t * 100)
    one = {op.name: op for op in operators(Deployment(m, hw), batch)}
    dp4 = {op.name: op for op in operators(Deployment(m, hw, ep=4, dp=4), batch)}
    assert "moe_dispatch_combine" not in one
    a2a = dp4["moe_dispatch_combine"]
    # all-gather + reduce-scatter of the 4 ranks' 4·T·h activations: 2·(3/4) of it per GPU
    np.testing.assert_allclose(a2a.bytes, 2 * 0.75 * 4 * t * m.hidden_size * ACT_BYTES)
    np.testing.assert_allclose(a2a.calls, [0.0, 2.0, 2.0])
    assert a2a.count == m.num_moe_layers
    # Expert FLOPs per GPU are those of T tokens on one GPU (4·T tokens over 4 GPUs) ...
    np.testing.assert_allclose(dp4["moe_experts"].flops, one["moe_experts"].flops)
    # ... and the attention of a rank is its own (unchanged by dp)
    np.testing.assert_allclose(dp4["attn_decode"].bytes, one["attn_decode"].bytes)
    # Expert weight bytes: 1/4 of the experts, each touched by 4·T tokens' routing.
    E, k = m.num_experts, m.experts_per_token
    touched = E * (1 - (1 - k / E) ** (4 * t))
    w_bytes = touched * 3 * m.hidden_size * m.moe_intermediate_size / 4 * 2.0
    act = 4 * t * k * ACT_BYTES * (2 * m.hidden_size + 6 * m.moe_intermediate_size / 4)
    np.testing.assert_allclose(dp4["moe_experts"].bytes, w_bytes + act, rtol=1e-12)


def test_fit_command_per_rank() -> None:
    import json

    from click.testing import CliRunner

    from pipeline.cli import main

    args = ["fit", "--model", "qwen3-30b-a3b", "--hardware", "h100-sxm", "--context", "32768", "--json"]
    one = json.loads(CliRunner().invoke(main, args).output)
    dp2 = json.loads(CliRunner().invoke(main, [*args, "--dp", "2", "--ep", "2"]).output)
    assert dp2["weights_bytes_per_gpu"] < 0.55 * one["weights_bytes_per_gpu"]
    assert dp2["kv_capacity_blocks"] > 3 * one["kv_capacity_blocks"]
    bad = CliRunner().invoke(main, [*args, "--dp", "2", "--ep", "3"])
    assert bad.exit_code != 0 and "ep must be 1 or tp x dp = 2" in bad.output
