"""The step timeline's settings (issue 39, item 1; docs/engine.md, "The step timeline" and "The
front end"): asynchronous scheduling's default by vLLM release, FLEET.toml's [engine] keys and
their refusals, what a run records, and a stack calibration handing the terms to the engines.
The engines' semantics themselves are checked in tests/test_engine.py (by hand and against the
reference)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_engine_support import LinearCost, workload

from pipeline.common.errors import ConfigError
from pipeline.costmodel.stackcal import PARAMETERS, TIMELINE_KEY, apply, parse_calibration
from pipeline.engine import model as engine_model
from pipeline.engine.jit import simulate_jit
from pipeline.engine.model import SchedulerConfig, timeline_spec
from pipeline.replay.fleet import async_default, fleet_from_dict, load_fleet, parse_fleet, resolve

_BASE = {"name": "t", "model": "llama-3.1-8b", "hardware": "h100-sxm"}


def _fleet(**engine: object) -> dict[str, object]:
    return {**_BASE, "engine": engine} if engine else dict(_BASE)


def test_async_scheduling_defaults_on_from_vllm_0_14() -> None:
    # vLLM v0.14.0 release notes: "Async scheduling is now enabled by default" (vllm#27614),
    # pipeline parallelism excluded
    assert not async_default("0.13.0") and not async_default("0.11.1")
    assert async_default("0.14.0") and async_default("0.19.0") and async_default("v0.20.2rc1")
    assert not async_default("0.19.0", pp=2)
    assert resolve(parse_fleet(_fleet(), "t")).scheduler.async_scheduling  # the default release, 0.19
    assert not resolve(parse_fleet(_fleet(vllm_version="0.10.0"), "t")).scheduler.async_scheduling
    assert not resolve(parse_fleet(_fleet(async_scheduling=False), "t")).scheduler.async_scheduling
    assert resolve(parse_fleet(_fleet(vllm_version="0.10.0", async_scheduling=True), "t")).scheduler.async_scheduling


def test_frontend_keys_reach_the_spec_and_the_record() -> None:
    cfg = parse_fleet(_fleet(frontend_request_s=1, frontend_token_s=0.001), "t")  # an integer is seconds too
    assert cfg.engine.frontend_request_s == 1.0 and isinstance(cfg.engine.frontend_request_s, float)
    fleet = resolve(cfg)
    spec = fleet.spec()
    assert (spec.frontend_request_s, spec.frontend_token_s) == (1.0, 0.001)
    rec = fleet.to_dict()
    assert rec["frontend"] == {"frontend_request_s": 1.0, "frontend_token_s": 0.001}
    assert rec["scheduler"]["async_scheduling"] is True
    assert rec["fleet"]["engine"]["frontend_token_s"] == 0.001
    assert fleet_from_dict(rec["fleet"], "config.json") == cfg
    # unset keys stay out of the recorded fleet (runs recorded before them keep their ids)
    plain = parse_fleet(_fleet(), "t").to_dict()["engine"]
    assert not {"async_scheduling", "frontend_request_s", "frontend_token_s"} & plain.keys()
    assert resolve(parse_fleet(_fleet(), "t")).spec().frontend_token_s == 0.0


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"frontend_request_s": -0.1}, r"frontend_request_s must be a number of seconds in \[0, 10\]"),
        ({"frontend_request_s": float("nan")}, "frontend_request_s must be a number of seconds"),
        ({"frontend_token_s": 0.5}, r"frontend_token_s must be a number of seconds in \[0, 0.1\]"),
        ({"async_scheduling": "yes"}, "async_scheduling"),
        ({"frontend_token_s": "0.1"}, "frontend_token_s"),
    ],
)
def test_bad_timeline_values_are_refused_in_one_line(engine: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_fleet(_fleet(**engine), "f.toml")
    assert "\n" not in str(err.value) and str(err.value).startswith("f.toml")


def test_a_fleet_file_sets_them(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        'name = "f"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n'
        "[engine]\nasync_scheduling = false\nfrontend_request_s = 0.015\nfrontend_token_s = 0.0002\n"
    )
    fleet = resolve(load_fleet(path))
    assert not fleet.scheduler.async_scheduling
    assert fleet.spec().frontend_request_s == 0.015 and fleet.spec().frontend_token_s == 0.0002


def _cal(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "source": "s",
        "hardware": "h100-sxm",
        "cost_tier": "measured",
        "linear_scale": 1.0,
        "attention_scale": 1.0,
        "comm_scale": 1.0,
        "step_overhead_s": 0.0,
    }
    return {**base, **over}


def test_calibration_files_carry_the_timeline_terms() -> None:
    old = parse_calibration(_cal(), "c")  # written before the terms existed: no change
    assert (old.async_scheduling, old.frontend_request_s, old.frontend_token_s) == (1.0, 0.0, 0.0)
    cal = parse_calibration(_cal(async_scheduling=0, frontend_request_s=0.02, frontend_token_s=0.0001), "c")
    assert cal.values()["frontend_request_s"] == 0.02 and "frontend_token_s 0.0001" in cal.text()
    with pytest.raises(ConfigError, match="async_scheduling must be 0 or 1"):
        parse_calibration(_cal(async_scheduling=0.5), "c")
    with pytest.raises(ConfigError, match=r"frontend_request_s must be in \[0, 0.2\]"):
        parse_calibration(_cal(frontend_request_s=1.0), "c")
    assert {"async_scheduling", "frontend_request_s", "frontend_token_s"} <= PARAMETERS.keys()
    assert engine_model.TIMELINE_KEY == TIMELINE_KEY  # the engines read what apply writes


def test_apply_hands_the_timeline_to_both_engines() -> None:
    """A calibration that changes only the timeline keeps the tables and hands the terms to the
    engines with the cost; the engines replay them as if the fleet had set them."""
    cost = LinearCost(a=0.125, b=0.0, c=0.0, d=0.0, e=0.0)
    assert apply(cost, {"frontend_request_s": 0.0, "async_scheduling": 1.0}) is cost  # no change
    got = apply(cost, {"async_scheduling": 0.0, "frontend_request_s": 0.05, "frontend_token_s": 0.001})
    assert got.describe[TIMELINE_KEY] == {
        "async_scheduling": False,
        "frontend_request_s": 0.05,
        "frontend_token_s": 0.001,
    }
    assert got.tok is cost.tok and "stack_calibration" not in got.describe
    both = apply(cost, {"linear_scale": 2.0, "frontend_token_s": 0.001})
    assert both.describe[TIMELINE_KEY] == {"frontend_token_s": 0.001}
    assert "frontend_token_s" not in both.describe["stack_calibration"]
    ext = both.extend(both.max_tokens * 2) if both.extend is not None else None
    assert ext is not None and ext.describe[TIMELINE_KEY] == {"frontend_token_s": 0.001}
    cfg = SchedulerConfig(num_gpu_blocks=1000, max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=256,
                          block_size=4, async_scheduling=True)  # fmt: skip
    from pipeline.engine.model import FleetSpec

    spec = FleetSpec(replicas=1, scheduler=cfg)
    turned = timeline_spec(spec, got)
    assert not turned.scheduler.async_scheduling and turned.frontend_request_s == 0.05
    # the hand schedule of test_engine's async test, synchronous again, plus the front end
    w = workload([0.0, 0.25, 0.3, 10.0], [4, 4, 4, 4], [20, 3, 3, 3])
    res = simulate_jit(w, spec, got)
    streams = np.array([1, 2, 3, 1])  # A; A and B; A, B and C; D alone
    np.testing.assert_allclose(res.first_token_s, np.array([0.125, 0.375, 0.5, 10.125]) + 0.05 + 0.001 * streams)
