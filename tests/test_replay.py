"""The replay stage on real traces: the compiled engine == reference on slices, invariants, the
written run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import shared_path
from test_engine import _assert_same, check_invariants
from test_engine_support import LinearCost

from pipeline.cli import main
from pipeline.common.schemas import read_parquet, write_parquet
from pipeline.costmodel.profile.cost import fleet_step_cost
from pipeline.engine.jit import MAX_STATE_BYTES, simulate_jit, state_bytes, unsupported_reason
from pipeline.engine.model import FleetSpec
from pipeline.engine.reference import simulate_reference
from pipeline.engine.steplog import StepLog
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.replay.fleet import parse_fleet, resolve
from pipeline.replay.run import ReplayOptions, build_workload, run_replay, series_frames

ROOT = Path(__file__).resolve().parents[1]
# A cost stand-in with magnitudes like an 8B model on one H100 (2.3 ms per-step overhead, 70 µs
# per prefill token, 20 µs per decode sequence): it checks scheduling on real lengths, not hardware.
REAL_COST = LinearCost(a=2.3e-3, b=7e-5, c=2e-10, d=2e-5, e=1.5e-8)


@pytest.fixture(scope="module")
def azure_conv(tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    src = shared_path("traces", "azure-llm-inference-2023", "AzureLLMInferenceTrace_conv.csv")
    store = Store(tmp_path_factory.mktemp("azure"))
    ingest_logs([src], store)
    return store.read_requests()


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    src = shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    store = Store(tmp_path_factory.mktemp("mooncake"))
    ingest_logs([src], store, date="2023-11-17")
    return store.read_requests()


def _fleet(**engine: int | bool) -> object:
    cfg = parse_fleet(
        {"name": "t", "model": "llama-3.1-8b", "hardware": "h100-sxm", "replicas": 2, "engine": engine}, "t"
    )
    return resolve(cfg)


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
def test_azure_slice_jit_equals_reference(azure_conv: pl.DataFrame, router: str) -> None:
    # 400 requests at 20x the trace rate on a KV cache small enough to preempt.
    fleet = resolve(
        parse_fleet(
            {
                "name": "t",
                "model": "llama-3.1-8b",
                "hardware": "h100-sxm",
                "replicas": 2,
                "router": router,
                "engine": {"num_gpu_blocks_override": 600, "max_model_len": 8192, "max_num_seqs": 64},
            },
            "t",
        )
    )
    work = build_workload(azure_conv.head(400), fleet, ReplayOptions(rate_scale=20.0))
    spec = FleetSpec(replicas=2, scheduler=fleet.scheduler, router=router)
    ref = simulate_reference(work, spec, REAL_COST)
    log = StepLog()
    res = simulate_jit(work, spec, REAL_COST, log)
    _assert_same(res, ref)
    check_invariants(work, spec, res, log)
    assert ref.preemptions.sum() > 0, "the slice should exercise preemption"


def test_mooncake_slice_with_prefix_chains(mooncake: pl.DataFrame) -> None:
    # Mooncake's 512-token hash chains become 16-token engine blocks; long prompts and a
    # 64k-token KV cache exercise prefix hits, evictions and kv-capacity rejections.
    fleet = resolve(
        parse_fleet(
            {
                "name": "t",
                "model": "llama-3.1-8b",
                "hardware": "h100-sxm",
                "replicas": 1,
                "engine": {"num_gpu_blocks_override": 4000, "max_model_len": 131072},
            },
            "t",
        )
    )
    work = build_workload(mooncake.head(70), fleet, ReplayOptions())
    assert work.chain_tree is not None and work.explicit().chain_hashes.shape[0] > 0
    spec = FleetSpec(replicas=1, scheduler=fleet.scheduler)
    ref = simulate_reference(work, spec, REAL_COST)
    log = StepLog()
    res = simulate_jit(work, spec, REAL_COST, log)
    _assert_same(res, ref)
    check_invariants(work, spec, res, log)
    ok = ref.reject_reason == 0
    assert ref.cache_hit_tokens[ok].sum() > 0
    assert (ref.reject_reason == 2).any()  # prompts beyond 64k tokens of KV


@pytest.mark.parametrize("router", ["least_outstanding", "prefix_affinity"])
def test_run_replay_with_the_measured_cost_is_the_reference_bit_for_bit(mooncake: pl.DataFrame, router: str) -> None:
    # The stage's configuration: the h100-sxm measured profile's tables, Mooncake's prefix
    # chains (hits, evictions), 2 replicas. The compiled engine evaluates in its loop the same
    # cost kernel the reference calls once a step: every request's times must be the
    # reference's, bit for bit, and run_replay must be that engine (its step log row for row).
    fleet = resolve(
        parse_fleet(
            {
                "name": "t",
                "model": "llama-3.1-8b",
                "hardware": "h100-sxm",
                "replicas": 2,
                "router": router,
                "engine": {"num_gpu_blocks_override": 3000, "max_model_len": 131072},
            },
            "t",
        )
    )
    frame = mooncake.head(100)  # (the reference steps token by token: 200 take minutes)
    options = ReplayOptions(rate_scale=4.0)
    work = build_workload(frame, fleet, options)
    spec = FleetSpec(replicas=2, scheduler=fleet.scheduler, router=router)
    cost = fleet_step_cost(fleet)  # what run_replay uses: the h100-sxm measured profile
    assert cost.source == "measured"
    assert unsupported_reason(spec, cost) is None
    ref = simulate_reference(work, spec, cost)
    run = run_replay(frame, fleet, options)
    for name in ("first_token_s", "finish_s", "scheduled_s", "max_itl_s", "arrival_s"):
        np.testing.assert_array_equal(getattr(run.result, name), getattr(ref, name), err_msg=name)
    for name in ("replica", "preemptions", "cache_hit_tokens", "prefill_tokens", "reject_reason"):
        np.testing.assert_array_equal(getattr(run.result, name), getattr(ref, name), err_msg=name)
    check_invariants(work, spec, run.result, run.log)
    direct = StepLog()
    simulate_jit(work, spec, cost, direct)
    a, b = run.log.columns(), direct.columns()
    assert a.keys() == b.keys() and a["steps"].sum() > 0
    for col in a:
        np.testing.assert_array_equal(a[col], b[col], err_msg=col)
    assert run.result.cache_hit_tokens.sum() > 0 and run.result.preemptions.sum() > 0


@pytest.mark.slow
def test_invariants_on_the_full_azure_trace(azure_conv: pl.DataFrame) -> None:
    fleet = resolve(
        parse_fleet(
            {"name": "t", "model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": {"max_model_len": 16384}},
            "t",
        )
    )
    work = build_workload(azure_conv, fleet, ReplayOptions(rate_scale=4.0))
    spec = FleetSpec(replicas=2, scheduler=fleet.scheduler, router="least_outstanding")
    log = StepLog()
    res = simulate_jit(work, spec, REAL_COST, log)
    check_invariants(work, spec, res, log)
    _assert_same(res, simulate_reference(work, spec, REAL_COST))
    assert np.all(res.reject_reason == 0)
    series = series_frames(log.columns(), fleet.scheduler.num_gpu_blocks)
    # Spreading spans over seconds conserves every token.
    assert series["fresh_prefill_tokens_per_s"].sum() == pytest.approx(log.columns()["prefill_tokens"].sum())
    assert series["decode_tokens_per_s"].sum() == pytest.approx(log.columns()["decode_tokens"].sum())
    assert np.all(series["busy_fraction"] <= 1 + 1e-9)


def test_rate_scale_and_modes(azure_conv: pl.DataFrame) -> None:
    fleet = resolve(parse_fleet({"name": "t", "model": "llama-3.1-8b", "hardware": "h100-sxm"}, "t"))
    one = build_workload(azure_conv.head(100), fleet, ReplayOptions())
    two = build_workload(azure_conv.head(100), fleet, ReplayOptions(rate_scale=2.0))
    np.testing.assert_allclose(two.arrival_s, one.arrival_s / 2)
    assert one.arrival_s[0] == 0.0
    with pytest.raises(Exception, match="exclude"):
        ReplayOptions(concurrency=4, offline=True)


def _sample_store(tmp_path: Path, n: int) -> tuple[Store, pl.DataFrame]:
    """A store holding the first ``n`` requests of the bundled sample (skips without it)."""
    sample = ROOT / "traces" / "sample" / "azure_conv_2023.csv.gz"
    if not sample.exists():
        pytest.skip(f"bundled sample missing: {sample}")
    full = Store(tmp_path / "full")
    ingest_logs([sample], full)
    small = Store(tmp_path / "store")
    head = full.read_requests().head(n)
    write_parquet(head.to_arrow(), small.partition(small.requests_dir, "2023-11-16") / "p.parquet", "requests")
    return small, head


def test_replay_command_writes_an_idempotent_run(tmp_path: Path) -> None:
    # A 300-request store from the bundled sample, replayed with the roofline cost model.
    small, head = _sample_store(tmp_path, 300)
    runner = CliRunner()
    args = ["replay", "--store", str(small.root), "--fleet", str(ROOT / "fleets" / "default.toml"), "--json"]
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert doc["finished"] == 300 and doc["rejected"] == 0
    run_dir = Path(doc["run_dir"])
    reqs = read_parquet(run_dir / "requests.parquet", "replay_requests")
    read_parquet(run_dir / "steps.parquet", "replay_steps")
    read_parquet(run_dir / "series.parquet", "replay_series")
    config = json.loads((run_dir / "config.json").read_text())
    assert config["resolved"]["scheduler"]["block_size"] == 16
    r = pl.from_arrow(reqs)
    assert isinstance(r, pl.DataFrame)
    assert (r["ttft_s"] >= r["queue_s"]).all() and (r["e2e_s"] >= r["ttft_s"]).all()
    assert r["output_tokens"].sum() == head["output_tokens"].clip(lower_bound=1).sum()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    again = runner.invoke(main, args)
    assert again.exit_code == 0
    assert json.loads(again.stdout)["run_id"] == doc["run_id"]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert pq.read_metadata(run_dir / "steps.parquet").num_rows > 0
    # Errors are one line and exit 1.
    bad = runner.invoke(main, ["replay", "--store", str(small.root), "--fleet", str(tmp_path / "no.toml")])
    assert bad.exit_code == 1 and "fleet file not found" in bad.stderr


def test_closed_loop_client_options_through_the_command(tmp_path: Path) -> None:
    # 120 requests of the bundled sample in a closed loop: the ramp, think time and warm-up are
    # part of the run id, the warm-up rows are marked in the requests table and left out of the
    # summary; bad values and the options without --concurrency are one line, exit 1.
    small, _ = _sample_store(tmp_path, 120)
    runner = CliRunner()
    base = ["replay", "--store", str(small.root), "--fleet", str(ROOT / "fleets" / "default.toml"), "--json"]
    plain = runner.invoke(main, [*base, "--concurrency", "8"])
    assert plain.exit_code == 0, plain.output
    zero = runner.invoke(main, [*base, "--concurrency", "8", "--ramp-s", "0", "--think-s", "0", "--warmup", "0"])
    assert json.loads(zero.stdout)["run_id"] == json.loads(plain.stdout)["run_id"]  # unset: the same run
    ramped = runner.invoke(main, [*base, "--concurrency", "8", "--ramp-s", "2", "--think-s", "0.5", "--warmup", "20"])
    assert ramped.exit_code == 0, ramped.output
    doc = json.loads(ramped.stdout)
    assert doc["run_id"] != json.loads(plain.stdout)["run_id"]
    assert doc["requests"] == 100 and doc["warmup_requests"] == 20
    r = pl.from_arrow(read_parquet(Path(doc["run_dir"]) / "requests.parquet", "replay_requests"))
    assert isinstance(r, pl.DataFrame)
    assert r["warmup"].to_list() == [True] * 20 + [False] * 100
    # the clients' first requests at c · 2 / (8 − 1) s (a client back before the ramp's end sends
    # the trace's next request in between); requests go out in the trace's order
    arrival = r["arrival_s"].to_numpy()
    assert np.isin(np.arange(8) * (2.0 / 7), arrival).all()
    assert arrival[0] == 0.0 and (np.diff(arrival) >= 0).all()
    measured = r.filter(~pl.col("warmup"))
    assert doc["ttft_s"]["mean"] == pytest.approx(measured["ttft_s"].mean(), rel=1e-12)
    config = json.loads((Path(doc["run_dir"]) / "config.json").read_text())
    assert config["options"]["ramp_s"] == 2.0 and config["options"]["warmup"] == 20
    for extra, says in [
        (["--ramp-s", "5"], "--ramp-s needs --concurrency"),
        (["--concurrency", "8", "--think-s", "nan"], "--think-s must be"),
        (["--concurrency", "8", "--ramp-s", "-1"], "--ramp-s must be"),
        (["--concurrency", "8", "--warmup", "120"], "--warmup 120 leaves no request"),
    ]:
        bad = runner.invoke(main, [*base, *extra])
        assert bad.exit_code == 1 and says in bad.stderr and bad.stderr.count("\n") == 1, bad.output


def test_moe_replays_on_the_jit_engine_and_plain_callables_are_refused(azure_conv: pl.DataFrame) -> None:
    # MoE step cost is non-linear in the tokens (fused-MoE tables, touched experts): the token
    # table carries it, so the jit engine runs MoE fleets, equal to the per-step reference.
    fleet = resolve(parse_fleet({"name": "t", "model": "qwen3-30b-a3b", "hardware": "h100-sxm", "replicas": 2}, "t"))
    frame = azure_conv.head(40)
    options = ReplayOptions(rate_scale=20.0)
    work = build_workload(frame, fleet, options)
    spec = FleetSpec(replicas=2, scheduler=fleet.scheduler, router=fleet.config.router)
    cost = fleet_step_cost(fleet)
    assert unsupported_reason(spec, cost) is None
    assert "fused MoE" in cost.describe["moe"]
    run = run_replay(frame, fleet, options)
    _assert_same(run.result, simulate_reference(work, spec, cost))
    # A plain callable has no tables the compiled loop can evaluate: refused in one line that
    # says what to build instead (the reference, the tests' oracle, takes any callable).
    assert unsupported_reason(spec, REAL_COST) is None
    plain = lambda batch: REAL_COST(batch)  # noqa: E731
    why = unsupported_reason(spec, plain) or ""
    assert "TabulatedCost" in why and "fleet_step_cost" in why
    with pytest.raises(ValueError, match="does not apply: the step cost is a plain callable"):
        simulate_jit(work, spec, plain)
    # tables that do not reach the fleet's largest step, with nothing to extend them
    short = replace(REAL_COST, extend=None)  # (a stand-in's tables are built for one token)
    assert "tables cover 1 tokens, the fleet's steps 8,193 (no extend)" in (unsupported_reason(spec, short) or "")
    # a scheduler state past jit.MAX_STATE_BYTES is no reason: 4,096 round-robin replicas, one
    # request each, as 40 replicas replay them
    huge = FleetSpec(replicas=4096, scheduler=fleet.scheduler)
    assert state_bytes(huge) > MAX_STATE_BYTES and unsupported_reason(huge, REAL_COST) is None
    _assert_same(simulate_jit(work, huge, REAL_COST), simulate_reference(work, replace(huge, replicas=40), REAL_COST))


def test_workload_from_a_handed_over_frame_and_session_keys() -> None:
    """A frame handed over in a list gives the same engine arrays as the frame itself, and the
    list is emptied; session-affinity keys are each session id's key64 (63 bits), −1 for none,
    whatever the order the sessions come in."""
    from pipeline.classify.prefix import key64

    fleet = resolve(
        parse_fleet(
            {
                "name": "t",
                "model": "llama-3.1-8b",
                "hardware": "h100-sxm",
                "router": "session_affinity",
                "engine": {"enable_prefix_caching": False},
            },
            "t",
        )
    )
    sessions = ["b", None, "a", "b", "ü", None, "a"]
    frame = pl.DataFrame(
        {
            "arrival": pl.datetime_range(
                pl.datetime(2025, 1, 1), pl.datetime(2025, 1, 1, 0, 0, 6), "1s", eager=True, time_zone="UTC"
            ),
            "recorded_input_tokens": [5, 0, 7, 9, 1, 2, 3],
            "output_tokens": [1, 2, 0, 4, 5, 6, 7],
            "session_id": sessions,
        }
    )
    opts = ReplayOptions(rate_scale=2.0)
    whole = build_workload(frame, fleet, opts)
    hand = [frame.clone()]
    given = build_workload(hand, fleet, opts)
    assert hand == []
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "affinity"):
        assert np.array_equal(getattr(whole, name), getattr(given, name)), name
    assert whole.arrival_s.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert whole.prompt_tokens.tolist() == [5, 1, 7, 9, 1, 2, 3]  # a logged 0 replays as 1
    assert whole.output_tokens.tolist() == [1, 2, 1, 4, 5, 6, 7]
    want = [-1 if s is None else key64(s) & 0x7FFFFFFFFFFFFFFF for s in sessions]
    assert whole.affinity is not None and whole.affinity.tolist() == want


def test_a_day_of_other_models_is_said_when_replayed_on_one(tmp_path: Path) -> None:
    """Requests logged for another catalog model (or for several models) are all replayed as the
    fleet's model: the run says how many, for which models, in its health warnings (the terminal,
    the report's banner). A day whose every request names one model the catalog does not know
    ("unknown": logs without a model field) is the fleet's traffic by definition: no warning."""
    from pipeline.replay.run import model_mix_warning

    sample = ROOT / "traces" / "sample" / "azure_conv_2023.csv.gz"
    if not sample.exists():
        pytest.skip(f"bundled sample missing: {sample}")
    full = Store(tmp_path / "full")
    ingest_logs([sample], full)
    head = full.read_requests().head(200)
    assert head["model"].unique().to_list() == ["unknown"]
    fleet = str(ROOT / "fleets" / "default.toml")  # llama-3.1-8b
    store = Store(tmp_path / "store")
    part = store.partition(store.requests_dir, "2023-11-16") / "p.parquet"
    write_parquet(head.to_arrow(), part, "requests")
    assert model_mix_warning(store, "2023-11-16", "llama-3.1-8b") is None
    mixed = head.with_columns(
        model=pl.when(pl.int_range(pl.len()) < 70).then(pl.lit("llama-3.1-70b")).otherwise(pl.lit("llama-3.1-8b"))
    )
    write_parquet(mixed.to_arrow(), part, "requests")
    line = model_mix_warning(store, "2023-11-16", "llama-3.1-8b")
    assert line == (
        "MODEL MIX: 70 of 200 requests (35.0%) were logged for other models (llama-3.1-70b: 70) and are replayed "
        "as llama-3.1-8b; a fleet per model sizes each (rooftrace plan --traffic-model)"
    )
    out = CliRunner().invoke(main, ["replay", "--store", str(store.root), "--fleet", fleet, "--json"])
    assert out.exit_code == 0, out.output
    health = json.loads(out.stdout)["health"]
    assert line in health["warnings"] and health["healthy"] is False
    assert f"warning: {line}" in out.stderr
    # one model the catalog knows, not the fleet's: said too
    write_parquet(head.with_columns(model=pl.lit("qwen3-32b")).to_arrow(), part, "requests")
    assert "200 of 200 requests (100.0%)" in str(model_mix_warning(store, "2023-11-16", "llama-3.1-8b"))
    # the fleet's model, a few rows without one (unknown), and the fleet's model by its HF id: no mix
    from pipeline.catalog import load_model

    hf = load_model("llama-3.1-8b").hf_id
    ours = head.with_columns(
        model=pl.when(pl.int_range(pl.len()) < 3)
        .then(pl.lit("unknown"))
        .when(pl.int_range(pl.len()) < 50)
        .then(pl.lit(hf))
        .otherwise(pl.lit("llama-3.1-8b"))
    )
    write_parquet(ours.to_arrow(), part, "requests")
    assert model_mix_warning(store, "2023-11-16", "llama-3.1-8b") is None
    # an API model's day sized on this fleet: the fleet's traffic by definition
    write_parquet(head.with_columns(model=pl.lit("gpt-4o")).to_arrow(), part, "requests")
    assert model_mix_warning(store, "2023-11-16", "llama-3.1-8b") is None
