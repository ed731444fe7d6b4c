"""Replay's refusals and limits (replay, cost, fleet, store, limits): a run's stored fleet reads back as the fleet
it ran (the shipped fleets whose [calibration] is partial replayed then costed), a backslash in the
store path, calibration factors near 0 and the simulated span they make, --rate-scale where it does
nothing, the limits' messages, and a malformed config.json given to ``cost``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_checks import invoke as _invoke
from cli_checks import one_error_line as _one_error_line
from conftest import own_copy

from pipeline.common.budget import Limits, ResourceLimitError, current_limits, parse_days
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.economics.cost import run_cost
from pipeline.ingest.store import Store
from pipeline.replay.fleet import MIN_EFFICIENCY, fleet_from_dict, load_fleet, resolve
from pipeline.replay.limits import MAX_SIM_SPAN_S, ReplayEstimate, distinct_numbers, enforce, format_bytes
from pipeline.replay.run import ReplayOptions, replay, series_frames

ROOT = Path(__file__).resolve().parents[1]
#: The shipped fleets of one pool (fleets/pools.toml and fleets/disagg-*.toml, fleets of pools:
#: tests/test_pools.py, tests/test_disaggregated.py).
FLEETS = sorted(
    p for p in (ROOT / "fleets").glob("*.toml") if p.name != "pools.toml" and not p.name.startswith("disagg-")
)
FACTORS = ("compute_efficiency", "memory_efficiency", "link_efficiency")


def _partial(path: Path) -> bool:
    table = tomllib.loads(path.read_text()).get("calibration")
    return table is not None and not all(k in table for k in FACTORS)


PARTIAL = [p for p in FLEETS if _partial(p)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    from pipeline.ingest import ingest_logs
    from pipeline.synth import SynthConfig, generate, write_logs

    base = tmp_path_factory.mktemp("replay-limits")
    st = Store(base / "store")
    frame = generate(SynthConfig(requests=200, seed=6, models=("llama-3.1-8b",), duration_s=200, diurnal=False))
    ingest_logs(write_logs(frame, "anthropic", base / "day.jsonl"), st)
    return st


# -- 1. a run's stored fleet reads back as the fleet it ran ----------------------------------------


def test_shipped_fleets_include_a_partial_calibration() -> None:
    assert PARTIAL, "no shipped fleet sets only some [calibration] factors: the round trip below is weaker"


@pytest.mark.parametrize("path", FLEETS, ids=lambda p: p.name)
def test_every_shipped_fleet_round_trips_through_its_stored_config(path: Path) -> None:
    """resolve -> to_dict -> JSON (as config.json) -> the reader cost uses: the same fleet, and
    it resolves to the same scheduler and hardware factors."""
    cfg = load_fleet(path)
    fleet = resolve(cfg, str(path))
    doc = json.loads(json.dumps(fleet.to_dict()))
    back = fleet_from_dict(doc["fleet"], "config.json")
    assert back == cfg
    again = resolve(back, "config.json", doc["catalog"])
    assert again.scheduler == fleet.scheduler
    assert again.deployment.hardware == fleet.deployment.hardware


@pytest.mark.parametrize("path", PARTIAL, ids=lambda p: p.name)
def test_a_partially_calibrated_shipped_fleet_replays_and_costs(store: Store, path: Path, tmp_path: Path) -> None:
    store = own_copy(store, tmp_path)
    run = replay(store, path, ReplayOptions())
    result = run_cost(store, run.run_id)
    assert result.gpu.total_usd > 0
    res = _invoke(["cost", "--store", str(store.root), "--run", run.run_id, "--json"])
    assert res.exit_code == 0, res.output


def test_a_stored_fleet_with_a_bad_value_is_one_line_naming_the_file() -> None:
    doc = resolve(load_fleet(PARTIAL[0] if PARTIAL else FLEETS[0])).to_dict()["fleet"]
    doc["calibration"] = {"source": "x", "compute_efficiency": "fast", "memory_efficiency": None}
    with pytest.raises(ConfigError, match=r"^config\.json \[calibration\]: compute_efficiency must be a number, got"):
        fleet_from_dict(doc, "config.json")
    with pytest.raises(ConfigError, match=r"^config\.json: the recorded fleet must be a table"):
        fleet_from_dict([1], "config.json")


# -- 2. a backslash in the store path ---------------------------------------------------------------


def test_a_backslash_in_the_store_path_is_refused_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "back\\slash" / "st"
    with pytest.raises(RooftraceError, match=r"contains \\: use a folder name without any of"):
        Store(root)
    res = _invoke(["classify", "--store", str(root)])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert str(root) in line and "backslash" in line, line


# -- 3. calibration factors near 0, and the simulated span they make -------------------------------


def _fleet_with(tmp_path: Path, calibration: str) -> Path:
    text = (ROOT / "fleets" / "default.toml").read_text()
    path = tmp_path / "calibrated.toml"
    path.write_text(f'{text}\n[calibration]\nsource = "hostile"\n{calibration}\n')
    return path


@pytest.mark.parametrize("key", FACTORS)
def test_a_calibration_factor_near_zero_is_refused_naming_the_key_and_file(tmp_path: Path, key: str) -> None:
    path = _fleet_with(tmp_path, f"{key} = 1e-300")
    with pytest.raises(ConfigError) as info:
        load_fleet(path)
    message = str(info.value)
    assert message.startswith(f"{path} [calibration]: {key} must be in [0.001, 1]") and "1e-300" in message
    assert load_fleet(_fleet_with(tmp_path, f"{key} = {MIN_EFFICIENCY}")).calibration is not None


def _estimate(**over: Any) -> ReplayEstimate:
    parts = dict.fromkeys(
        ("process", "overhead", "compile", "chains", "engine state", "requests", "step log", "series"), 0
    )
    base: dict[str, Any] = {
        "requests": 10,
        "replicas": 1,
        "engine": "jit",
        "mode": "open",
        "rate_scale": 1.0,
        "arrival_span_s": 10.0,
        "span_s": 20.0,
        "busy_replicas": 1,
        "kv_blocks": 0,
        "log_rows": 40,
        "parts": parts,
        "seconds": 1.0,
        "progress_units": "requests done",
        "progress_total": 10,
    }
    return ReplayEstimate(**(base | over))


def test_a_span_too_long_for_the_series_is_refused_whatever_the_limits() -> None:
    free = Limits(None, "--max-memory", None, "--max-sim-days")
    enforce(_estimate(), free)
    for span in (1e12, 7.8e292 * 86400, float("nan")):
        with pytest.raises(ResourceLimitError, match="its per-second series can hold") as info:
            enforce(_estimate(span_s=span), free)
        assert "\n" not in str(info.value)
    # the series itself, when the steps end past it (the estimate is rough): no numpy error
    cols = {
        "replica": np.zeros(2, np.int32),
        "start_s": np.array([0.0, 1.0]),
        "end_s": np.array([1.0, 2 * MAX_SIM_SPAN_S]),
        **{k: np.ones(2) for k in ("prefill_tokens", "decode_tokens", "running", "waiting", "kv_blocks_used")},
    }
    with pytest.raises(ResourceLimitError, match="covers 23,148 simulated days"):
        series_frames(cols, 100)


def test_a_hardware_entry_whose_steps_take_forever_is_refused(store: Store, tmp_path: Path) -> None:
    """A hardware entry's factors are bounded like a fleet's [calibration]: an efficiency of
    1e-300 is refused when the entry loads, in one line naming the file and the key."""
    hw = (ROOT / "pipeline" / "catalog" / "hardware" / "h100-sxm.toml").read_text()
    hw = hw.replace('name = "h100-sxm"', 'name = "slowgpu"').replace("\ncompute = 0.643", "\ncompute = 1e-300")
    (tmp_path / "slow.toml").write_text(hw)
    text = (ROOT / "fleets" / "default.toml").read_text()
    fleet = tmp_path / "slowfleet.toml"
    fleet.write_text(
        "\n".join(
            f'hardware = "{tmp_path / "slow.toml"}"\ncost_model = "roofline"' if ln.startswith("hardware =") else ln
            for ln in text.splitlines()
            if not ln.startswith("cost_model")
        )
    )
    root = str(store.root)
    res = _invoke(["replay", "--store", root, "--fleet", str(fleet), "--max-memory", "none", "--max-sim-days", "none"])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert "slow.toml [efficiency]: compute must be in [0.001, 1]" in line and "Maximum allowed size" not in line, line


# -- 4. --rate-scale where it changes nothing ------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "args"), [("offline", {"offline": True}), ("concurrency", {"concurrency": 4})], ids=["offline", "closed"]
)
def test_rate_scale_with_a_closed_loop_or_offline_is_refused(mode: str, args: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=f"--rate-scale 2 and --{mode}.* exclude each other"):
        ReplayOptions(rate_scale=2.0, **args)
    assert ReplayOptions(rate_scale=1.0, **args).mode in ("offline", "closed")


def test_replay_cli_refuses_rate_scale_with_offline_in_one_line(store: Store) -> None:
    for extra in (["--offline"], ["--concurrency", "3"]):
        res = _invoke(["replay", "--store", str(store.root), "--rate-scale", "0.5", *extra])
        assert res.exit_code == 1
        assert "exclude each other" in _one_error_line(res.stderr)


# -- 6. the limits' messages --------------------------------------------------------------------------


def test_small_memory_limits_are_said_in_bytes(store: Store) -> None:
    assert format_bytes(1) == "1 byte" and format_bytes(1000) == "1,000 bytes" and format_bytes(2048) == "2 KiB"
    res = _invoke(["replay", "--store", str(store.root), "--max-memory", "1"])
    assert res.exit_code == 1
    line = _one_error_line(res.stderr)
    assert "more than the limit of 1 byte (--max-memory)" in line, line


def test_max_sim_days_that_is_not_a_number_is_said_like_max_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="'junk' is not a number of days"):
        parse_days("junk")
    monkeypatch.setenv("ROOFTRACE_MAX_SIM_DAYS", "junk")
    with pytest.raises(ResourceLimitError) as info:
        current_limits()
    message = str(info.value)
    assert message.startswith("$ROOFTRACE_MAX_SIM_DAYS: 'junk' is not a number") and "convert" not in message


def test_a_span_just_past_a_tiny_limit_is_said_with_enough_digits() -> None:
    assert distinct_numbers(0.0405, 1e-7) == ("0.0405", "1e-07")
    assert distinct_numbers(30.0004, 30.0) == ("30.0004", "30")
    assert distinct_numbers(4166.66, 30.0) == ("4,166.7", "30")
    limits = Limits(None, "--max-memory", 1e-7, "$ROOFTRACE_MAX_SIM_DAYS")
    with pytest.raises(ResourceLimitError) as info:
        enforce(_estimate(arrival_span_s=3500.0), limits)
    assert "over 0.0405 simulated days, more than the limit of 1e-07 days" in str(info.value)


# -- 7. cost on a malformed config.json ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        ('{"run_id": 1,,}', "not valid JSON: Expecting property name enclosed in double quotes (line 1, column 14)"),
        ("[1, 2]", "must hold a JSON object, got list"),
        ("{}", "resolved.fleet is missing"),
        ('{"resolved": {"fleet": {"name": "x"}}}', "missing key(s) ['hardware', 'model']"),
    ],
)
def test_cost_of_a_malformed_config_json_is_one_line_naming_the_file(
    store: Store, text: str, wanted: str, tmp_path: Path
) -> None:
    store = own_copy(store, tmp_path)
    run = replay(store, ROOT / "fleets" / "default.toml", ReplayOptions())
    path = run.run_dir / "config.json"
    original = path.read_bytes()
    try:
        path.write_text(text)
        res = _invoke(["cost", "--store", str(store.root), "--run", run.run_id])
        assert res.exit_code == 1
        line = _one_error_line(res.stderr)
        assert line.startswith(f"error: {path}") and wanted in line, line
    finally:
        path.write_bytes(original)
