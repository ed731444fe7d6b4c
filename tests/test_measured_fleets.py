"""Fleets priced from measured profiles: what the replay and the CLI show of the measured tier.

The profiles themselves (interpolation, tables, held-out checks) are tested in test_profile_*.py;
here: fleet-level choices (cost_model, collectives over PCIe vs NVLink, MoE on the compiled
engine), the run's record of which tier costed what, and the calibrate/validate commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.common.errors import ConfigError
from pipeline.costmodel.profile.cost import fleet_step_cost
from pipeline.costmodel.profile.tables import load_profile
from pipeline.costmodel.roofline import decode_batch
from pipeline.engine.jit import unsupported_reason
from pipeline.engine.model import FleetSpec
from pipeline.engine.reference import simulate_reference
from pipeline.replay.fleet import load_fleet, parse_fleet, resolve
from pipeline.replay.run import ReplayOptions, build_workload, run_replay, steps_table, summarize

FLEETS = Path(__file__).resolve().parents[1] / "fleets"


def _requests(n: int, seed: int = 0) -> pl.DataFrame:
    """Canonical requests: Poisson arrivals, 4 sessions whose turns share growing prefixes."""
    from published import benchmark_requests

    rng = np.random.default_rng(seed)
    frame = benchmark_requests(rng.integers(50, 3000, n), rng.integers(2, 300, n))
    arrival = frame["arrival"].dt.epoch("us").to_numpy() + np.cumsum(rng.exponential(2e5, n)).astype(np.int64)
    return frame.with_columns(
        arrival=pl.Series(arrival).cast(pl.Datetime("us", "UTC")),
        model=pl.lit("qwen3-30b-a3b"),
        tenant=pl.lit(None, pl.Utf8),
        adapter=pl.lit(None, pl.Utf8),
        session_id=pl.Series([f"s{i % 4}" for i in range(n)]),
    )


def test_tp2_over_pcie_and_over_nvlink_cost_different_collectives() -> None:
    pcie = resolve(load_fleet(FLEETS / "qwen3-32b-rtx-pro-6000-tp2.toml"))
    nvl = resolve(load_fleet(FLEETS / "qwen3-32b-h100-tp2.toml"))
    steps = decode_batch([64], [2000])
    c_pcie, c_nvl = fleet_step_cost(pcie), fleet_step_cost(nvl)
    assert c_pcie.source == c_nvl.source == "measured"
    assert "custom all-reduce" in c_pcie.describe["allreduce"] and "custom all-reduce" in c_nvl.describe["allreduce"]
    # Per call at this step's message (64 tokens x 5120 x 2 bytes = 640 KiB), from the profiles:
    msg = 64 * 5120 * 2.0
    per_call_pcie = float(load_profile("rtx-pro-6000").allreduce_curve("custom_graph", 2)(msg)[0])  # type: ignore[union-attr]
    per_call_nvl = float(load_profile("h100-sxm").allreduce_curve("custom_graph", 2)(msg)[0])  # type: ignore[union-attr]
    assert per_call_pcie > 3 * per_call_nvl
    calls = 2 * pcie.deployment.model.num_layers + 1
    # The token table's collective seconds at 64 tokens (a CUDA-graph size) are exactly those
    # calls; the step adds the logits gather (a roofline op in the logits table).
    assert c_pcie.tok[64, 2] == pytest.approx(calls * per_call_pcie, rel=1e-9)
    assert c_nvl.tok[64, 2] == pytest.approx(calls * per_call_nvl, rel=1e-9)
    for c in (c_pcie, c_nvl):
        assert c(steps).comm_s[0] == pytest.approx(c.tok[64, 2] + c.logit[64, 2], rel=1e-12)


def test_no_p2p_consumer_card_uses_nccl() -> None:
    fleet = resolve(parse_fleet({"name": "t", "model": "llama-3.1-8b", "hardware": "rtx-4090", "tp": 2}, "t"))
    cost = fleet_step_cost(fleet)
    # No measured NCCL on the 4090: the roofline link, and it says so.
    assert "NCCL" in cost.describe["allreduce"] and "roofline" in cost.describe["allreduce"]


def test_moe_fleet_replays_on_the_jit_engine_equal_to_the_reference() -> None:
    fleet = resolve(load_fleet(FLEETS / "qwen3-30b-a3b-rtx-pro-6000.toml"))
    cost = fleet_step_cost(fleet)
    assert cost.describe["moe"].startswith("measured fused MoE")
    frame = _requests(60)
    options = ReplayOptions(rate_scale=1.0)
    work = build_workload(frame, fleet, options)
    spec = FleetSpec(replicas=fleet.config.replicas, scheduler=fleet.scheduler, router=fleet.config.router)
    assert unsupported_reason(spec, cost) is None
    run = run_replay(frame, fleet, options)
    ref = simulate_reference(work, spec, cost)
    for name in ("first_token_s", "finish_s", "scheduled_s"):
        np.testing.assert_array_equal(getattr(run.result, name), getattr(ref, name), err_msg=name)
    table = steps_table(run).to_pydict()
    assert set(table["cost_source"]) == {"measured"}
    assert all(m > 0 for m in table["measured_s"])
    summary = summarize(run)["cost_model"]
    assert summary["source"] == "measured" and summary["profile"] == "rtx-pro-6000"
    assert 0.9 < summary["measured_share_of_busy_time"] <= 1.0


def test_cost_model_key() -> None:
    base = {"name": "t", "model": "llama-3.1-8b", "hardware": "h100-sxm"}
    assert fleet_step_cost(resolve(parse_fleet(base, "t"))).source == "measured"
    assert fleet_step_cost(resolve(parse_fleet(base | {"cost_model": "roofline"}, "t"))).source == "roofline"
    with pytest.raises(ConfigError, match="cost_model 'fast' unknown"):
        parse_fleet(base | {"cost_model": "fast"}, "t")
    mi = resolve(parse_fleet(base | {"hardware": "mi300x", "cost_model": "measured"}, "t"))
    with pytest.raises(ConfigError, match="mi300x has no measured profile"):
        fleet_step_cost(mi)
    # auto without a profile: the roofline, said in the run's record
    assert fleet_step_cost(resolve(parse_fleet(base | {"hardware": "mi300x"}, "t"))).source == "roofline"
    # a [calibration] (roofline factors of another stack) keeps auto on the roofline tier
    cal = {"calibration": {"source": "a test", "compute_efficiency": 0.5}}
    assert fleet_step_cost(resolve(parse_fleet(base | cal, "t"))).source == "roofline"


def _tiny_aiconfigurator(root: Path) -> Path:
    """An AIConfigurator-layout folder with one GPU's bf16 GEMMs following t = 2 µs + flops/600 TF."""
    folder = root / "aiconfigurator-vllm-ops" / "h100_sxm" / "gemm" / "vllm" / "0.24.0"
    folder.mkdir(parents=True)
    rows = [
        (m, n, k)
        for m in (1, 4, 16, 64, 256, 1024)
        for n in (512, 1024, 2048, 4096, 8192)
        for k in (512, 1024, 2048, 4096, 8192)
    ]
    m, n, k = (np.array(c, dtype=np.int64) for c in zip(*rows, strict=True))
    latency_ms = (2e-6 + 2.0 * m * n * k / 600e12) * 1e3
    pl.DataFrame(
        {
            "gemm_dtype": ["bfloat16"] * len(rows),
            "kernel_source": ["torch.nn.functional.linear"] * len(rows),
            "m": m,
            "n": n,
            "k": k,
            "latency": latency_ms,
        }
    ).write_parquet(folder / "gemm_perf.parquet")
    return root


def test_calibrate_and_validate_commands_on_profile_sets(tmp_path: Path) -> None:
    src = _tiny_aiconfigurator(tmp_path / "meas")
    runner = CliRunner()
    out = tmp_path / "profiles"
    res = runner.invoke(main, ["calibrate", "--measurements", str(src), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (prof,) = doc["profiles"]
    assert prof["gpu"] == "h100-sxm" and prof["rows"] == {"gemm": 150}
    assert (out / "h100-sxm" / "profile.toml").exists()
    held = prof["heldout"]
    # t = 2 µs + flops / 600 TF is not a power law: interpolating across 4x-spaced held-out
    # shapes misses by a few %.
    assert held and all(v["median_abs_error"] < 0.1 and v["p90_abs_error"] < 0.15 for v in held.values())
    # Re-running writes the same bytes (idempotent).
    before = (out / "h100-sxm" / "profile.toml").read_bytes()
    assert runner.invoke(main, ["calibrate", "--measurements", str(src), "--out", str(out)]).exit_code == 0
    assert (out / "h100-sxm" / "profile.toml").read_bytes() == before
    store = tmp_path / "store"
    res = runner.invoke(main, ["validate", "--measurements", str(src), "--store", str(store), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["profile_heldout"]
    assert {r["check"] for r in rows} == {"gemm"} and all(r["p90_abs"] < 0.15 for r in rows)
    assert (store / "validation" / "profile_heldout.parquet").exists()
    text = runner.invoke(main, ["validate", "--measurements", str(src), "--store", str(store)])
    assert text.exit_code == 0 and "held out by shape" in text.stdout and "met" in text.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["calibrate", "--measurements", "/no/such/folder"], "no such file or folder"),
        (["validate", "--measurements", "/no/such/folder"], "no such file or folder"),
        (["calibrate", "--measurements", "{csv}"], "needs --hardware"),
        (["calibrate", "--measurements", "{meas}", "--hardware", "no-such-gpu"], "no hardware named"),
        (["calibrate", "--measurements", "{meas}", "--out", "{csv}"], "cannot write the profile"),
        (["calibrate", "--measurements", "{empty}"], "holds no AIConfigurator or LLMServingSim set"),
    ],
)
def test_calibrate_and_validate_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    csv = tmp_path / "perf_model.csv"
    csv.write_text("a,b\n1,2\n")
    meas = _tiny_aiconfigurator(tmp_path / "meas")
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [a.format(csv=csv, meas=meas, empty=empty) for a in args]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 1
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in res.stderr


def test_validate_without_measurements_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """No folder outside the repository is assumed: without --measurements or its environment
    variable, validate says what to pass."""
    monkeypatch.delenv("ROOFTRACE_MEASUREMENTS", raising=False)
    res = CliRunner().invoke(main, ["validate"])
    assert res.exit_code == 1
    assert res.stderr.strip() == "error: no measurements given: pass --measurements DIR or set $ROOFTRACE_MEASUREMENTS"
