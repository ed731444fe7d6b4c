"""The size-aware prior tier and what the run says about its pricing.

Each test guards one case where a command mislabelled or mispriced a run, or printed invalid
JSON.
"""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from cli_checks import invoke, one_error_line

from pipeline.catalog import load_hardware, load_hardware_file, load_model
from pipeline.common.errors import ConfigError
from pipeline.costmodel.profile import prior as P
from pipeline.costmodel.profile.cost import fleet_step_cost, step_cost_for
from pipeline.costmodel.profile.tables import is_catalog_device, profile_for
from pipeline.costmodel.roofline import Deployment, decode_batch
from pipeline.publish.report import cost_card
from pipeline.replay.fleet import parse_fleet, resolve

CATALOG = Path(__file__).resolve().parents[1] / "pipeline" / "catalog" / "hardware"


def _lookalike(tmp_path: Path) -> Path:
    """An L4 entry that calls itself h100-sxm (a profiled GPU's name)."""
    text = (CATALOG / "l4.toml").read_text().replace('name = "l4"', 'name = "h100-sxm"')
    path = tmp_path / "fake-h100.toml"
    path.write_text(text)
    return path


def test_a_hardware_file_with_a_profiled_gpus_name_is_not_priced_by_its_profile(tmp_path: Path) -> None:
    """An L4 file named h100-sxm used to get the H100's measured tables (TPOT 6.4 ms on a 300 GB/s
    card that needs 53 ms to read the weights once), labelled "measured"."""
    hw = load_hardware_file(_lookalike(tmp_path))
    assert hw.name == "h100-sxm" and not is_catalog_device(hw) and profile_for(hw) is None
    assert is_catalog_device(load_hardware("h100-sxm")) and profile_for(load_hardware("h100-sxm")) is not None
    dep = Deployment(load_model("llama-3.1-8b"), hw)
    cost = step_cost_for(dep, "auto", 4096)
    assert cost.source == "prior"
    decode = float(cost(decode_batch([1], [1024])).time_s[0])
    weights_read = 16.06e9 / hw.memory_bandwidth_bytes_per_s
    assert decode > weights_read  # a step reads the weights at least once
    with pytest.raises(ConfigError, match="is not the catalog's h100-sxm"):
        step_cost_for(dep, "measured", 4096)


def test_measured_fleet_on_a_lookalike_file_is_refused_in_one_line(tmp_path: Path) -> None:
    hw = _lookalike(tmp_path)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f'name = "f"\nmodel = "llama-3.1-8b"\nhardware = "{hw}"\ncost_model = "measured"\n')
    res = invoke(["replay", "--fleet", str(fleet), "--store", str(tmp_path / "store")])
    assert res.exit_code == 1
    line = one_error_line(res.stderr)
    assert str(fleet) in line and "is not the catalog's h100-sxm" in line


def test_the_card_says_why_the_prior_priced_and_what_it_did_not() -> None:
    asked = step_cost_for(Deployment(load_model("llama-3.1-8b"), load_hardware("h100-sxm")), "prior", 4096)
    card = cost_card({"source": "prior", **asked.describe, "prior_share_of_busy_time": 0.9})
    assert card is not None
    assert "cost_model = 'prior' asked for" in card[2] and "no measured profile" not in card[2]
    assert "all-reduce" not in card[2]  # tp = 1: no collective, no donor to name
    amd = step_cost_for(Deployment(load_model("llama-3.1-8b"), load_hardware("mi300x")), "prior", 4096)
    card = cost_card({"source": "prior", **amd.describe})
    assert card is not None and "never checked on amd" in card[2]
    # FP8 fused MoE has no usable curve: its experts are the plain roofline's, and the card says so
    # (on a GPU without a same-die donor: L4)
    fp8 = step_cost_for(Deployment(load_model("qwen3-30b-a3b"), load_hardware("l4"), weight_dtype="fp8"), "auto", 4096)
    assert fp8.source == "prior" and "MoE experts" in fp8.describe["roofline_parts"]
    card = cost_card({"source": "prior", **fp8.describe})
    assert card is not None and "MoE experts priced by the plain roofline" in card[2]
    # H100 PCIe takes H100 SXM's measured FP8 MoE tables, scaled (tests/test_die_donor.py)
    pcie = step_cost_for(
        Deployment(load_model("qwen3-30b-a3b"), load_hardware("h100-pcie"), weight_dtype="fp8"), "auto", 4096
    )
    assert "MoE experts" not in pcie.describe["roofline_parts"] and "h100-sxm" in pcie.describe["moe"]
    tp2 = step_cost_for(Deployment(load_model("llama-3.1-8b"), load_hardware("a100-40gb-sxm"), tp=2), "auto", 4096)
    card = cost_card({"source": "prior", **tp2.describe})
    assert card is not None and "all-reduce measured on a100-80gb-sxm" in card[2]


def test_a_calibrated_fleet_is_labelled_with_its_own_factors() -> None:
    spec = {
        "name": "cal",
        "model": "llama-3.1-8b",
        "hardware": "h100-sxm",
        "calibration": {"source": "my stack's perf table", "compute_efficiency": 0.5},
    }
    cost = fleet_step_cost(resolve(parse_fleet(spec, "t")))
    assert cost.source == "roofline"
    card = cost_card({"source": cost.source, **cost.describe})
    assert card is not None and "the fleet's [calibration]: my stack's perf table" in card[2]


def test_json_output_is_strict() -> None:
    """A plan with an unservable row printed bare Infinity (not JSON)."""
    from pipeline.cli.common import emit_json

    buf = io.StringIO()
    with redirect_stdout(buf):
        emit_json({"a": math.inf, "b": [-math.inf, math.nan, 1.5], "c": {"d": float("nan")}})
    assert json.loads(buf.getvalue()) == {"a": None, "b": [None, None, 1.5], "c": {"d": None}}


def test_mla_projections_are_said_to_be_roofline() -> None:
    cost = step_cost_for(Deployment(load_model("deepseek-v3"), load_hardware("h200"), tp=8), "auto", 4096)
    assert "roofline" in cost.describe["gemm"] and cost.describe["gemm"] != "none"


@pytest.mark.parametrize(
    "curve",
    [
        'floor_s = "1e-6"\ncompute_eff = 0.5\nmemory_eff = 0.5\nblend = 2.0\n',
        "floor_s = 1e-6\ncompute_eff = 0.5\nmemory_eff = 0.5\nblend = true\n",
    ],
)
def test_prior_numbers_must_be_numbers(tmp_path: Path, curve: str) -> None:
    path = tmp_path / "prior.toml"
    path.write_text('[curves."gemm:bf16"]\nused = true\n' + curve)
    with pytest.raises(ConfigError, match="needs numbers"):
        P.load_prior.__wrapped__(path)


def test_validate_removes_an_earlier_runs_tables(tmp_path: Path) -> None:
    """A one-GPU validate after a full one left the full run's prior tables beside its own."""
    from test_measured_fleets import _tiny_aiconfigurator

    src = _tiny_aiconfigurator(tmp_path / "meas")
    store = tmp_path / "store"
    stale = store / "validation" / "prior_heldout.parquet"
    stale.parent.mkdir(parents=True)
    pl.DataFrame({"x": np.arange(3)}).write_parquet(stale)
    res = invoke(["validate", "--measurements", str(src), "--store", str(store)])
    assert res.exit_code == 0, res.output
    assert not stale.exists() and "removed" in res.stderr
    assert (store / "validation" / "profile_heldout.parquet").exists()
