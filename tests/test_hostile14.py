"""Hostile tester, round 14: ``calibrate --observed``, ``calibration_file``, the closed loop's
client options and the predicted-vs-observed section (the day's own features)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from cli_checks import cli, one_error

from pipeline.fleet import EngineSettings, FleetConfig, resolve
from pipeline.observed_fit import fit_requests
from tests.test_calibrate_observed import day, observed_day


def test_a_fleet_that_replays_none_of_the_requests_is_refused_in_words() -> None:
    """max_model_len 64: every request is rejected by the replay; the refusal crashed with
    KeyError: 'ttft' (round 14)."""
    frame = observed_day("llama-3.1-8b", 200, 2.0, 5)
    small = resolve(
        FleetConfig(name="tiny", model="llama-3.1-8b", hardware="h100-sxm", engine=EngineSettings(max_model_len=64))
    )
    fit = fit_requests(frame, small)
    why = fit.refusal()
    assert why is not None and "finished none of the held-out requests" in why and "max_model_len" in why


def test_latencies_of_zero_are_not_measurements() -> None:
    """All-zero observed latencies ran 300 replays on a NaN loss (round 14): refused at once."""
    frame = day("llama-3.1-8b", 300, 2.0, 4).with_columns(ttft_s=pl.lit(0.0), e2e_s=pl.lit(0.0))
    fleet = resolve(FleetConfig(name="z", model="llama-3.1-8b", hardware="h100-sxm"))
    with pytest.raises(Exception, match="only 0 of 300 requests carry observed latencies above 0 s"):
        fit_requests(frame, fleet)


def test_calibrate_out_never_replaces_the_fleet_file_or_a_folder(tmp_path: Path) -> None:
    """--out naming the --fleet file replaced the fleet with the calibration; --out a folder was a
    traceback (round 14). Both are one line before any work."""
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


def test_a_warm_up_run_is_not_called_stale(tmp_path: Path) -> None:
    """A closed loop with --warmup replayed every request, but report compared only the measured
    ones with the store's count and called the run STALE (round 14)."""
    from tests.test_replay import ROOT, _sample_store

    small, _ = _sample_store(tmp_path, 120)
    fleet = str(ROOT / "fleets" / "default.toml")
    res = cli("replay", "--store", str(small.root), "--fleet", fleet, "--concurrency", "4", "--warmup", "10", "--json")
    assert res.exit_code == 0, res.output
    run_id = json.loads(res.stdout)["run_id"]
    rep = cli("report", "--store", str(small.root), "--run", run_id, "--out", str(tmp_path / "r.html"))
    assert rep.exit_code in (0, 3), rep.output
    assert "STALE" not in rep.stderr, rep.stderr


def test_the_run_id_follows_the_calibration_numbers_not_its_prose(tmp_path: Path) -> None:
    """The run id took the calibration's source text, which names the store and fleet paths it
    was fitted from: the same numbers taught elsewhere made another run (round 14)."""
    from tests.test_calibrate_observed import _write_cal
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
