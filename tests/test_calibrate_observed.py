"""``calibrate --observed``: a serving stack's calibration learnt from a day of its own logs
(pipeline/calibrate/observed_fit.py, pipeline/costmodel/stackcal.py; docs/calibration.md).

The logs are made by replaying a day with *known* stack parameters — step-cost scales, a per-step
overhead and the step timeline (synchronous scheduling on a vLLM release whose default is
asynchronous, and an API front end of 20 ms per request plus 0.2 ms per token per open stream) —
and multiplying each request's TTFT and decode time by 5 % log-normal noise: the fit must find the
parameters again (identifiability), predict the held-out part of the day, and carry over to
another model on the same GPU (transfer). A busy day, whose training requests share their batches with later
arrivals, shows what replaying the whole day fixes: the former fit, which replayed the training
part alone, overshot the rest of that day."""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from cli_checks import cli, one_error

from pipeline.calibrate.observed import observed_latencies
from pipeline.calibrate.observed_fit import ObservedFit, calibration_toml, fit_requests, latency_errors
from pipeline.common.errors import ConfigError
from pipeline.costmodel.profile.cost import fleet_step_cost
from pipeline.costmodel.stackcal import StackCalibration, apply, parse_calibration
from pipeline.costmodel.steps import StepBatch
from pipeline.replay.fleet import EngineSettings, FleetConfig, fleet_from_dict, load_fleet, resolve
from pipeline.replay.run import ReplayOptions, build_workload, run_workload
from pipeline.replay.slo import request_latencies

#: The stack the synthetic logs come from: 25 % slower linear layers, 20 % faster attention and
#: 1.5 ms per step more than the H100's measured tables say.
KNOWN = {"linear_scale": 1.25, "attention_scale": 0.8, "comm_scale": 1.0, "step_overhead_s": 0.0015}
#: The same stack with its timeline: the scheduler runs synchronously (the fleet's vLLM release
#: defaults to asynchronous: the fit must turn it off) behind an API server that adds 20 ms per
#: request and 0.2 ms per output token per open stream.
TIMELINE = KNOWN | {"async_scheduling": 0.0, "frontend_request_s": 0.02, "frontend_token_s": 0.0002}
#: The identifiability day's shape: busy and quiet spells (rate 2/s × (1 ± 0.9) over 2 minutes),
#: so the streams open at a first token range from one to about a dozen and the front end's
#: per-request and per-stream terms can be told apart.
WAVY = {"wave": 0.9, "period_s": 120.0, "output_median": 300.0}


def day(
    model: str,
    n: int,
    rate: float,
    seed: int,
    prompt_median: float = 4000,
    output_median: float = 200,
    wave: float = 0.0,
    period_s: float = 60.0,
) -> pl.DataFrame:
    """Canonical requests of one replica's day: Poisson arrivals at ``rate``/s (``wave`` > 0: at
    ``rate * (1 + wave * sin(2 pi t / period_s))``, busy and quiet spells in turn), log-normal
    prompt and output lengths (prompts 50..30,000 tokens: attention is a real share of the steps)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    if wave:
        gaps = rng.exponential(1.0, n)
        t = np.empty(n)
        now = 0.0
        for i in range(n):
            now += gaps[i] / (rate * (1.0 + wave * math.sin(2 * math.pi * now / period_s)))
            t[i] = now
    prompt = np.clip(rng.lognormal(math.log(prompt_median), 1.0, n), 50, 30_000).astype(np.int64)
    output = np.clip(rng.lognormal(math.log(output_median), 0.8, n), 2, 2_000).astype(np.int64)
    t0 = int(datetime(2025, 1, 15, tzinfo=UTC).timestamp() * 1e6)
    none = pl.Series([None] * n, dtype=pl.Utf8)
    return pl.DataFrame(
        {
            "request_id": [f"r{seed}-{i}" for i in range(n)],
            "arrival": pl.Series(t0 + (t * 1e6).astype(np.int64)).cast(pl.Datetime("us", "UTC")),
            "recorded_input_tokens": prompt,
            "output_tokens": output,
            "model": [model] * n,
            "adapter": none,
            "tenant": ["t"] * n,
            "session_id": none,
        }
    )


def fleet_of(model: str) -> object:
    return resolve(FleetConfig(name="obs", model=model, hardware="h100-sxm", replicas=1))


def observed_day(
    model: str, n: int, rate: float, seed: int, stack: dict[str, float] = KNOWN, **shape: float
) -> pl.DataFrame:
    """``day`` (``shape``: its lengths and wave) with the latencies a fleet running ``stack``
    delivered, 5 % noise on each request's TTFT and on its decode time (so E2E ≥ TTFT, as
    ingest requires)."""
    frame = day(model, n, rate, seed, **shape)
    fleet = fleet_of(model)
    work = build_workload(frame, fleet, ReplayOptions())
    run = run_workload(work, fleet, ReplayOptions(), cost=apply(fleet_step_cost(fleet), stack))
    lat = request_latencies(run.result, work)
    rng = np.random.default_rng(seed + 100)
    ttft = lat["ttft"] * np.exp(rng.normal(0.0, 0.05, n))
    decode = (lat["e2e"] - lat["ttft"]) * np.exp(rng.normal(0.0, 0.05, n))
    return frame.with_columns(ttft_s=pl.Series(ttft), e2e_s=pl.Series(ttft + decode))


def _once(name: str, make: Callable[[], ObservedFit], factory: pytest.TempPathFactory, worker_id: str) -> ObservedFit:
    """``make()`` once per test run: under pytest-xdist the first worker to need it fits and the
    others read its result (the folder above each worker's is the run's own)."""
    if worker_id == "master":
        return make()
    import fcntl
    import pickle

    shared = factory.getbasetemp().parent
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = shared / f"{name}.pickle"
        if cached.exists():
            got: ObservedFit = pickle.loads(cached.read_bytes())
            return got
        made = make()
        cached.write_bytes(pickle.dumps(made))
        return made


@pytest.fixture(scope="session")
def fitted(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> ObservedFit:
    """The fit of the known stack's day, made once per test run."""

    def fit() -> ObservedFit:
        return fit_requests(
            observed_day("llama-3.1-8b", 3000, 2.0, 1, TIMELINE, **WAVY),
            fleet_of("llama-3.1-8b"),
            source="synthetic day",
        )

    return _once("observed_fit", fit, tmp_path_factory, worker_id)


#: A busy day: 1,000 requests at 10/s, prompts of median 1,000 tokens and outputs of median 300,
#: on one H100 — about 140 requests decode together, each for ~14 s, so the training part's
#: last requests share their batches with the first held-out ones.
BUSY = {"prompt_median": 1000.0, "output_median": 300.0}


def busy_day(model: str, n: int = 1000, seed: int = 1) -> pl.DataFrame:
    return observed_day(model, n, 10.0, seed, **BUSY)


@pytest.fixture(scope="session")
def busy_fit(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> ObservedFit:
    """The fit of the known stack's busy day (the whole day replayed), made once per test run."""
    return _once(
        "observed_fit_busy",
        lambda: fit_requests(busy_day("llama-3.1-8b"), fleet_of("llama-3.1-8b"), source="busy day"),
        tmp_path_factory,
        worker_id,
    )


def test_identifiability_recovers_the_known_stack(fitted: ObservedFit) -> None:
    """Known parameters, 5 % noise: the step-cost terms within 5 %, the timeline's within 10 %
    (asynchronous scheduling found off), held-out error ≤ 3 %."""
    got = fitted.calibration.values()
    assert fitted.fitted == (  # no collectives at tp 1
        "linear_scale", "attention_scale", "step_overhead_s", "async_scheduling", "frontend_request_s",
        "frontend_token_s",
    )  # fmt: skip
    for name in ("linear_scale", "attention_scale", "step_overhead_s"):
        assert got[name] == pytest.approx(TIMELINE[name], rel=0.05), (name, got)
    for name in ("frontend_request_s", "frontend_token_s"):
        assert got[name] == pytest.approx(TIMELINE[name], rel=0.10), (name, got)
    assert got["async_scheduling"] == 0.0
    assert got["comm_scale"] == 1.0
    assert fitted.held_out_error <= 0.03, fitted.held_out
    for m in ("ttft", "tpot", "e2e"):
        assert abs(fitted.held_out[m]["p50"]) <= 0.03, (m, fitted.held_out[m])
    # the tables alone are 20-35 % fast on this stack: the fit is what closes the gap
    assert fitted.held_out_uncalibrated["tpot"]["mean"] < -0.2
    assert fitted.n_train + fitted.n_held_out == 3000 and fitted.n_train == 1800
    assert fitted.refusal() is None


def _transfer_errors(frame: pl.DataFrame, model: str, cal: StackCalibration) -> dict[str, dict[str, dict[str, float]]]:
    """Errors of the whole of ``frame`` replayed on ``model`` with ``cal`` and with the tables alone."""
    fleet = fleet_of(model)
    work = build_workload(frame, fleet, ReplayOptions())
    obs = observed_latencies(frame)
    everyone = np.ones(frame.height, dtype=bool)
    errors = {}
    for label, cost in (("calibrated", apply(fleet_step_cost(fleet), cal)), ("tables", fleet_step_cost(fleet))):
        run = run_workload(work, fleet, ReplayOptions(), cost=cost)
        errors[label] = latency_errors(request_latencies(run.result, work), obs, everyone)
    return errors


def test_transfer_to_another_model_on_the_same_gpu(fitted: ObservedFit) -> None:
    """The calibration learnt on Llama-3.1-8B's day predicts Qwen3-8B's day on the same GPU and
    stack better than the uncalibrated tables, within 3 % on every mean."""
    errors = _transfer_errors(observed_day("qwen3-8b", 1500, 2.0, 7, TIMELINE, **WAVY), "qwen3-8b", fitted.calibration)
    for m in ("ttft", "tpot", "e2e"):
        assert abs(errors["calibrated"][m]["mean"]) < abs(errors["tables"][m]["mean"]), (m, errors)
        assert abs(errors["calibrated"][m]["mean"]) <= 0.03, (m, errors["calibrated"])


def test_a_busy_day_is_fitted_on_the_whole_day_replayed(busy_fit: ObservedFit) -> None:
    """Before / after on a busy day (:data:`BUSY`), where the training part's last requests
    share their batches with later arrivals. The former fit replayed the training part alone:
    those requests ran in emptier batches than the fleet's, faster than observed (E2E −11 % in
    its own in-sample replay), so it raised the per-step costs and overshot the rest of the day
    (held-out TPOT +16 %, E2E +14 %). Replaying the whole day for every candidate, with the loss
    on the training requests only: held-out TTFT +4.9 %, TPOT +2.6 %, E2E +1.9 %, and the linear
    scale within 1 %. (On a day this busy the split between attention and the per-step overhead
    is not recovered — both are near-constant per decode step — see docs/calibration.md.)"""
    got = busy_fit.calibration.values()
    assert busy_fit.fitted[:3] == ("linear_scale", "attention_scale", "step_overhead_s")
    assert got["async_scheduling"] == 1.0  # the fleet's own timeline (asynchronous), as the logs
    assert busy_fit.held_out_error <= 0.06, busy_fit.held_out
    assert busy_fit.in_sample_error <= 0.03, busy_fit.in_sample
    assert got["linear_scale"] == pytest.approx(KNOWN["linear_scale"], rel=0.05), got
    assert busy_fit.refusal() is None
    # the former method on the same logs: the case tells the two apart
    old = fit_requests(busy_day("llama-3.1-8b"), fleet_of("llama-3.1-8b"), train_alone=True)
    assert old.held_out["tpot"]["mean"] > 0.10 and old.held_out["e2e"]["mean"] > 0.10, old.held_out  # too slow
    assert old.in_sample["e2e"]["mean"] < -0.05, old.in_sample  # its training replay ran too fast
    assert busy_fit.held_out_error < 0.5 * old.held_out_error


@pytest.mark.xfail(
    strict=True,
    reason="left (issue 39 item 5): a day this busy does not fix the split between attention and the per-step "
    "overhead, and the wrong split shows in another model's TTFT (+15 %; TPOT and E2E within 2 %)",
)
def test_a_busy_day_transfers_to_another_model_on_the_same_gpu(busy_fit: ObservedFit) -> None:
    """The busy day's calibration (Llama-3.1-8B) on a busy Qwen3-8B day made by the same stack:
    every mean within 5 % and closer than the tables'. Fails today on TTFT (see the mark)."""
    errors = _transfer_errors(busy_day("qwen3-8b", 800, 9), "qwen3-8b", busy_fit.calibration)
    for m in ("ttft", "tpot", "e2e"):
        assert abs(errors["calibrated"][m]["mean"]) < abs(errors["tables"][m]["mean"]), (m, errors)
        assert abs(errors["calibrated"][m]["mean"]) <= 0.05, (m, errors["calibrated"])


def test_the_loss_sees_only_the_training_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every replay is of the whole day, and the held-out requests' observed latencies never
    enter the loss: tripling them leaves the fitted numbers exactly as they were (Nelder-Mead is
    deterministic), and only the held-out errors move."""
    import pipeline.calibrate.observed_fit as observed_fit

    monkeypatch.setattr(observed_fit, "MAX_EVALUATIONS", 12)
    sizes: list[int] = []
    real = observed_fit.run_workload

    def counted(work, *args, **kwargs):  # type: ignore[no-untyped-def]
        sizes.append(work.n)
        return real(work, *args, **kwargs)

    monkeypatch.setattr(observed_fit, "run_workload", counted)
    frame = observed_day("llama-3.1-8b", 300, 2.0, 12)
    fleet = fleet_of("llama-3.1-8b")
    a = fit_requests(frame, fleet)
    assert sizes and set(sizes) == {300}
    later = pl.int_range(pl.len()) >= a.n_train
    tripled = frame.with_columns(
        ttft_s=pl.when(later).then(pl.col("ttft_s") * 3).otherwise(pl.col("ttft_s")),
        e2e_s=pl.when(later).then(pl.col("e2e_s") * 3).otherwise(pl.col("e2e_s")),
    )
    b = fit_requests(tripled, fleet)
    assert b.calibration == a.calibration and b.in_sample == a.in_sample
    assert b.held_out_error > 0.5 > a.held_out_error


def test_a_fleet_that_cannot_explain_the_logs_is_refused() -> None:
    """Logs measured behind a gateway that adds 5 s to every request: no bounded calibration
    explains them, so the fit says why instead of writing one."""
    frame = observed_day("llama-3.1-8b", 400, 2.0, 3)
    frame = frame.with_columns(pl.col("ttft_s") + 5.0, pl.col("e2e_s") + 5.0)
    fit = fit_requests(frame, fleet_of("llama-3.1-8b"))
    assert fit.held_out_error > 0.25
    why = fit.refusal()
    assert why is not None and "cannot explain the logs" in why and "replicas" in why and "router" in why


def test_too_few_observed_latencies_is_one_clear_error() -> None:
    frame = day("llama-3.1-8b", 300, 2.0, 4).with_columns(
        ttft_s=pl.lit(None, pl.Float64), e2e_s=pl.lit(None, pl.Float64)
    )
    with pytest.raises(Exception, match="only 0 of 300 requests carry observed latencies above 0 s"):
        fit_requests(frame, fleet_of("llama-3.1-8b"))


# --- the calibration applied to the step cost ------------------------------------------------------


def test_apply_scales_each_part_of_a_step() -> None:
    """Hand check on the measured tier: linear ×2 doubles the token tables' compute, memory and
    floor seconds, attention ×0.5 halves the grids' attention, comm ×3 triples collectives, and
    the overhead adds its seconds to every step with tokens (and to the GPU time, so the time of
    a step whose host time was not showing grows by exactly that much)."""
    fleet = resolve(FleetConfig(name="a", model="llama-3.1-70b", hardware="h100-sxm", tp=4))
    base = fleet_step_cost(fleet)
    cal = {"linear_scale": 2.0, "attention_scale": 0.5, "comm_scale": 3.0, "step_overhead_s": 0.004}
    got = apply(base, cal)
    np.testing.assert_allclose(got.tok[:, [0, 1, 3]], 2.0 * base.tok[:, [0, 1, 3]])
    np.testing.assert_allclose(got.tok[:, 2], 3.0 * base.tok[:, 2])
    np.testing.assert_array_equal(got.tok[:, 7], base.tok[:, 7])  # host seconds: not the GPU's
    assert got.scalars[2] == pytest.approx(0.5 * base.scalars[2])
    assert got.scalars[3] == pytest.approx(base.scalars[3] + 0.004)
    batch = StepBatch(
        prefill_tokens=np.array([0.0, 2048.0]),
        prefill_seqs=np.array([0.0, 1.0]),
        prefill_attn_pairs=np.array([0.0, 2048 * 2049 / 2]),
        prefill_kv_tokens=np.array([0.0, 2048.0]),
        decode_seqs=np.array([64.0, 0.0]),
        decode_ctx_tokens=np.array([64 * 3000.0, 0.0]),
    )
    a, b = base(batch), got(batch)
    np.testing.assert_allclose(b.comm_s, 3.0 * a.comm_s, rtol=1e-12)
    assert np.all(b.time_s > a.time_s)
    one = apply(base, {"step_overhead_s": 0.004})(batch)
    hidden = (a.overhead_s - base.scalars[3]) > 1e-12  # steps whose host time showed
    np.testing.assert_allclose(one.time_s[~hidden], a.time_s[~hidden] + 0.004, rtol=1e-12)
    # an extension of the tables (a step past them) keeps the calibration
    big = got.extend(got.max_tokens * 2) if got.extend is not None else None
    assert big is not None and big.describe["stack_calibration"]["linear_scale"] == 2.0
    assert apply(base, {}) is base  # no change: the same cost


def test_calibration_toml_round_trip(fitted: ObservedFit, tmp_path: Path) -> None:
    """The written file is read back by a FLEET.toml's calibration_file, recorded by value in the
    run's fleet, and its [fit] and [errors] say what was measured."""
    cal_path = tmp_path / "cal" / "stack.toml"
    cal_path.parent.mkdir()
    cal_path.write_text(calibration_toml(fitted))
    doc = tomllib.loads(cal_path.read_text())
    assert doc["fit"]["train_requests"] == 1800 and doc["fit"]["held_out_error"] == pytest.approx(fitted.held_out_error)
    assert doc["errors"]["held_out"]["tpot"]["mean"] == pytest.approx(fitted.held_out["tpot"]["mean"])
    assert doc["calibration"]["source"] == "synthetic day"
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(
        'name = "f"\nmodel = "qwen3-8b"\nhardware = "h100-sxm"\ncalibration_file = "cal/stack.toml"\n'
    )
    cfg = load_fleet(fleet_file)
    assert cfg.stack_calibration == fitted.calibration
    recorded = cfg.to_dict()
    assert "calibration_file" not in recorded and recorded["stack_calibration"]["linear_scale"] == pytest.approx(
        fitted.calibration.linear_scale
    )
    assert fleet_from_dict(recorded, "config.json").stack_calibration == fitted.calibration
    assert "stack_calibration" not in FleetConfig(name="g", model="qwen3-8b", hardware="h100-sxm").to_dict()
    cost = fleet_step_cost(resolve(cfg))
    assert cost.describe["stack_calibration"]["linear_scale"] == pytest.approx(fitted.calibration.linear_scale)


def _cal(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "source": "s",
        "hardware": "h100-sxm",
        "cost_tier": "measured",
        "linear_scale": 1.1,
        "attention_scale": 1.0,
        "comm_scale": 1.0,
        "step_overhead_s": 0.0,
    }
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (_cal(linear_scale=float("nan")), "linear_scale must be in [0.25, 4]"),
        (_cal(linear_scale=9.0), "linear_scale must be in [0.25, 4]"),
        (_cal(step_overhead_s=-1.0), "step_overhead_s must be in [0, 0.02]"),
        (_cal(attention_scale="1.0"), "attention_scale must be a number"),
        (_cal(attention_scale=True), "attention_scale must be a number"),
        (_cal(hardware=""), "hardware is required"),
        (_cal(speed=2.0), "unknown key(s) ['speed']"),
        # lost in an edit: not read as 1
        (_cal(linear_scale=None), "missing key(s) ['linear_scale'] (linear_scale: a number in [0.25, 4]"),
    ],
)
def test_bad_calibration_values_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_calibration(table, "cal.toml [calibration]")
    assert message in str(exc.value) and "cal.toml [calibration]" in str(exc.value)


def _write_cal(path: Path, **over: object) -> None:
    lines = ["[calibration]"] + [
        f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in _cal(**over).items()
    ]
    path.write_text("\n".join(lines) + "\n")


def test_fleet_file_errors_name_the_file_and_key(tmp_path: Path) -> None:
    """Every calibration error is raised when the fleet is loaded, before any request is read,
    and names the fleet file and its calibration_file key."""
    fleet = tmp_path / "fleet.toml"
    head = 'name = "f"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n'
    fleet.write_text(head + 'calibration_file = "missing.toml"\n')
    with pytest.raises(ConfigError, match=r"fleet.toml: calibration_file = 'missing.toml'"):
        load_fleet(fleet)
    _write_cal(tmp_path / "l40s.toml", hardware="l40s")
    fleet.write_text(head + 'calibration_file = "l40s.toml"\n')
    with pytest.raises(ConfigError, match=r"fleet.toml: calibration_file = 'l40s.toml': the calibration was fitted on "
                       r"'l40s', this fleet runs 'h100-sxm'"):  # fmt: skip
        load_fleet(fleet)
    _write_cal(tmp_path / "roof.toml", cost_tier="roofline")
    fleet.write_text(head + 'calibration_file = "roof.toml"\n')
    with pytest.raises(
        ConfigError, match=r"calibration_file = 'roof.toml': the calibration was fitted on the 'roofline'"
    ):
        load_fleet(fleet)
    fleet.write_text(head + 'cost_model = "roofline"\ncalibration_file = "roof.toml"\n')
    assert load_fleet(fleet).stack_calibration is not None  # the same tier: fine
    _write_cal(tmp_path / "ok.toml")
    fleet.write_text(head + 'calibration_file = "ok.toml"\n[calibration]\nsource = "x"\ncompute_efficiency = 0.5\n')
    with pytest.raises(ConfigError, match="keep one"):
        load_fleet(fleet)
    (tmp_path / "notcal.toml").write_text("[other]\nx = 1\n")
    fleet.write_text(head + 'calibration_file = "notcal.toml"\n')
    with pytest.raises(ConfigError, match="has no \\[calibration\\] table"):
        load_fleet(fleet)
    fleet.write_text(head + '[stack_calibration]\nsource = "s"\nhardware = "h100-sxm"\ncost_tier = "measured"\n')
    with pytest.raises(
        ConfigError, match="stack_calibration is what a run records; a fleet file names its calibration"
    ):
        load_fleet(fleet)
    fleet.write_text(head + 'calibration_file = "ok.toml"\n')
    cal = load_fleet(fleet).stack_calibration
    assert cal == StackCalibration(source="s", hardware="h100-sxm", cost_tier="measured", linear_scale=1.1)
    assert cal is not None and "origin" not in cal.to_dict() and "calibration_file = 'ok.toml'" in cal.origin


def test_plan_skips_the_gpus_a_calibration_does_not_describe(tmp_path: Path) -> None:
    """A plan over h100-sxm and h200 from a base fleet calibrated on h100-sxm plans the H100 and
    skips the H200 with the reason (it stopped the whole plan at the H200, naming a fleet the
    user never wrote)."""
    from pipeline.plan.search import skip_reason
    from pipeline.plan.stage import plan_notes

    _write_cal(tmp_path / "cal.toml")
    fleet = tmp_path / "base.toml"
    fleet.write_text('name = "b"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\ncalibration_file = "cal.toml"\n')
    base = load_fleet(fleet)
    assert skip_reason(base, "h100-sxm", str(fleet)) is None
    why = skip_reason(base, "h200", str(fleet))
    assert why is not None and why.startswith("skipped: the base fleet's calibration does not apply")
    assert "fitted on 'h100-sxm', this fleet runs 'h200'" in why and "calibration_file = 'cal.toml'" in why

    class Opts:
        hardware = ("h100-sxm", "h200")
        tp = (1,)
        autoscale = False
        modes = ("colocated",)

    notes = plan_notes(Opts(), base, str(fleet))  # type: ignore[arg-type]
    assert any(n.startswith("skipped h200: the base fleet's calibration") for n in notes), notes


# --- the command ---------------------------------------------------------------------------------


def test_cli_calibrates_a_stored_day_and_a_fleet_includes_the_file(tmp_path: Path) -> None:
    """Logs in the OpenAI logged-pairs format (which carry TTFT and E2E) of a day served by a
    stack with known parameters: ``calibrate --observed`` writes the calibration file, a fleet
    includes it and replays with it; a second run with 5 s added by a gateway is refused, exit 1,
    nothing written."""
    from pipeline.ingest import ingest_logs
    from pipeline.ingest.store import Store
    from pipeline.synth import SynthConfig, generate, write_logs

    synth = generate(
        SynthConfig(requests=700, seed=11, duration_s=900, tenants=1, models=("llama-3.1-8b",), diurnal=False)
    )
    write_logs(synth, "openai", tmp_path / "raw.jsonl")
    raw = Store(tmp_path / "raw")
    ingest_logs([tmp_path / "raw.jsonl"], raw)
    frame = raw.read_requests(None)
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text('name = "prod"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n')
    fleet = resolve(load_fleet(fleet_file))
    work = build_workload(frame, fleet, ReplayOptions())
    lat = request_latencies(
        run_workload(work, fleet, ReplayOptions(), cost=apply(fleet_step_cost(fleet), KNOWN)).result, work
    )
    # the stored id is the log's ("chatcmpl-" + the synthetic id)
    ids = frame["request_id"].str.strip_prefix("chatcmpl-")
    served = pl.DataFrame({"request_id": ids, "ttft": lat["ttft"], "e2e": lat["e2e"]})
    assert served.join(synth, on="request_id").height == synth.height
    for name, extra in (("good", 0.0), ("gateway", 5.0)):
        logs = (
            synth.drop("ttft_s", "e2e_s")
            .join(served, on="request_id")
            .with_columns(ttft_s=pl.col("ttft") + extra, e2e_s=pl.col("e2e") + extra)
        )
        write_logs(logs.drop("ttft", "e2e"), "openai", tmp_path / f"{name}.jsonl")
        ingest_logs([tmp_path / f"{name}.jsonl"], Store(tmp_path / name))
    out = tmp_path / "prod-cal.toml"
    res = cli(
        "calibrate", "--observed", "--fleet", str(fleet_file), "--store", str(tmp_path / "good"), "--out", str(out)
    )
    assert res.exit_code == 0, res.output
    assert "held out" in res.stdout and f"wrote {out}" in res.stdout
    doc = tomllib.loads(out.read_text())
    assert doc["calibration"]["hardware"] == "h100-sxm" and "prod" in doc["calibration"]["source"]
    assert doc["fit"]["held_out_error"] <= 0.05
    included = tmp_path / "included.toml"
    included.write_text(
        f'name = "prod2"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\ncalibration_file = "{out.name}"\n'
    )
    res = cli("replay", "--fleet", str(included), "--store", str(tmp_path / "good"), "--json")
    assert res.exit_code == 0, res.output
    refused = tmp_path / "refused.toml"
    res = cli(
        "calibrate",
        "--observed",
        "--fleet",
        str(fleet_file),
        "--store",
        str(tmp_path / "gateway"),
        "--out",
        str(refused),
    )
    one_error(res, "cannot explain the logs")
    assert not refused.exists()
    one_error(cli("calibrate", "--fleet", str(fleet_file)), "--fleet is for --observed")
    one_error(cli("calibrate", "--observed", "--measurements", str(tmp_path)), "--observed learns from logs")
    one_error(cli("calibrate"), "give --measurements DIR")


def test_a_fleet_that_replays_none_of_the_requests_is_refused_in_words() -> None:
    """max_model_len 64: every request is rejected by the replay; the refusal crashed with
    KeyError: 'ttft'."""
    frame = observed_day("llama-3.1-8b", 200, 2.0, 5)
    small = resolve(
        FleetConfig(name="tiny", model="llama-3.1-8b", hardware="h100-sxm", engine=EngineSettings(max_model_len=64))
    )
    fit = fit_requests(frame, small)
    why = fit.refusal()
    assert why is not None and "finished none of the held-out requests" in why and "max_model_len" in why


def test_latencies_of_zero_are_not_measurements() -> None:
    """All-zero observed latencies ran 300 replays on a NaN loss: refused at once."""
    frame = day("llama-3.1-8b", 300, 2.0, 4).with_columns(ttft_s=pl.lit(0.0), e2e_s=pl.lit(0.0))
    fleet = resolve(FleetConfig(name="z", model="llama-3.1-8b", hardware="h100-sxm"))
    with pytest.raises(Exception, match="only 0 of 300 requests carry observed latencies above 0 s"):
        fit_requests(frame, fleet)


def test_calibrate_out_never_replaces_the_fleet_file_or_a_folder(tmp_path: Path) -> None:
    """--out naming the --fleet file replaced the fleet with the calibration; --out a folder was a
    traceback. Both are one line before any work."""
    fleet = tmp_path / "fleet.toml"
    text = 'name = "f"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n'
    fleet.write_text(text)
    store = tmp_path / "store"
    store.mkdir()
    one_error(
        cli("calibrate", "--observed", "--fleet", str(fleet), "--store", str(store), "--out", str(fleet)),
        "is the fleet file: the calibration would replace it",
    )
    assert fleet.read_text() == text
    (tmp_path / "folder").mkdir()
    one_error(
        cli("calibrate", "--observed", "--fleet", str(fleet), "--store", str(store), "--out", str(tmp_path / "folder")),
        "is a folder, not a regular file",
    )


def test_the_run_id_follows_the_calibration_numbers_not_its_prose(tmp_path: Path) -> None:
    """The run id took the calibration's source text, which names the store and fleet paths it
    was fitted from: the same numbers taught elsewhere made another run."""
    from tests.test_replay import _sample_store

    small, _ = _sample_store(tmp_path, 60)
    ids = []
    for name, over in (
        ("a", {"source": "from /x/store"}),
        ("b", {"source": "from /y/other"}),
        ("c", {"linear_scale": 1.2}),
    ):
        _write_cal(tmp_path / f"{name}.toml", **over)
        fleet = tmp_path / f"fleet-{name}.toml"
        fleet.write_text(
            f'name = "f"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\ncalibration_file = "{name}.toml"\n'
        )
        res = cli("replay", "--store", str(small.root), "--fleet", str(fleet), "--json")
        assert res.exit_code == 0, res.output
        ids.append(json.loads(res.stdout)["run_id"])
    assert ids[0] == ids[1] != ids[2]
