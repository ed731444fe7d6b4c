"""The command line's stages and outputs: the nightly's headroom stage under a spent budget (an
infinite wait crashed it and the night published nothing), a failed stage after the replay that no
longer stops the report, ``--out`` / ``--reports`` / ``--png`` over the store's own files (a report
written over the run's config.json), a fleet ``[calibration]`` with a cost model that never uses
it, and ``--executor`` / ``--ray-address`` that did nothing without a word."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from cli_checks import invoke as _invoke
from cli_checks import one_error_line

import pipeline.publish.nightly as nightly_mod
from pipeline.common.errors import ConfigError
from pipeline.ingest.store import Store
from pipeline.publish.nightly import StageError, _stage
from pipeline.replay import loadcurve
from pipeline.replay.fleet import FleetConfig, load_fleet, unused_pod_options
from pipeline.replay.loadcurve import DEFAULT_MULTIPLIERS, _skipped, load_curve
from pipeline.synth import SynthConfig, generate, write_logs

DATE = "2025-02-01"
RR_FLEET = """\
name = "rr"
model = "llama-3.1-8b"
hardware = "h100-sxm"
replicas = 4
router = "round_robin"
[engine]
max_model_len = 131072
"""


def _fleet(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    return path


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One tiny nightly, on the command line, whose headroom stage fails as the OverflowError of
    the report did (an unexpected exception, not a RooftraceError), with ``--executor process``
    on a fleet small enough for one engine."""
    root = tmp_path_factory.mktemp("cli-outputs")
    logs = root / "logs"
    frame = generate(SynthConfig(requests=120, seed=11, models=("llama-3.1-8b",), duration_s=300, date=DATE))
    write_logs(frame, "openai", logs / "day.jsonl")
    fleet = _fleet(root, "rr", RR_FLEET)
    store, reports = root / "store", root / "reports"

    def broken(*_a: object, **_k: object) -> Path:
        raise OverflowError("timestamp out of range for platform time_t")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nightly_mod, "write_load_curve", broken)
        res = _invoke(
            [
                "nightly",
                str(logs),
                "--fleet",
                str(fleet),
                "--store",
                str(store),
                "--reports",
                str(reports),
                "--executor",
                "process",
            ]
        )
    yield {"root": root, "fleet": fleet, "store": Store(store), "reports": reports, "res": res, "logs": logs}


# --- the headroom stage -----------------------------------------------------------------------


class _Threads(ThreadPoolExecutor):
    """The load curve's process pool, as threads: the same futures and waits, without starting
    processes (the fake points below are patched in, which a spawned process would not see)."""

    def __init__(self, max_workers: int, mp_context: object = None) -> None:
        super().__init__(max_workers=max_workers)


def _fake_point(_requests: object, _cfg: object, m: float, slo: str | None, _identity: object = None) -> dict[str, Any]:
    time.sleep(0.2)
    return {**_skipped(m, 10, slo), "status": "ok", "finished": 10, "rejected": 0, "overloaded": False,
            "ttft_p99_s": 0.1, "tpot_p99_s": 0.01}  # fmt: skip


@pytest.mark.parametrize("budget_s", [0.0, 1e300, math.inf])
def test_parallel_load_curve_never_waits_with_an_infinite_timeout(
    monkeypatch: pytest.MonkeyPatch, budget_s: float
) -> None:
    """jobs > 1: a budget that runs out skips the points not started (it used to wait with
    timeout=inf, the OverflowError of the report) and tries no point past the defaults (the inf it
    set also let the doubling run); a huge or infinite budget is waited out in bounded steps."""
    monkeypatch.setattr(loadcurve, "ProcessPoolExecutor", _Threads)
    monkeypatch.setattr(loadcurve, "curve_point", _fake_point)
    cfg = FleetConfig(name="rr", model="llama-3.1-8b", hardware="h100-sxm")
    rows = load_curve(pl.DataFrame({"x": range(10)}), cfg, None, DEFAULT_MULTIPLIERS, budget_s=budget_s, jobs=2)
    done = [r["multiplier"] for r in rows if r["status"] == "ok"]
    if budget_s == 0:
        assert [r["multiplier"] for r in rows] == list(DEFAULT_MULTIPLIERS)
        assert 0 < len(done) < len(DEFAULT_MULTIPLIERS), rows  # the two started finish, the rest skipped
    else:  # every point, then doubling to the cap while each stays healthy
        assert done == [*DEFAULT_MULTIPLIERS, 8.0, 16.0, 32.0, 64.0]
    with pytest.raises(ValueError, match="time budget"):
        load_curve(pl.DataFrame({"x": range(10)}), cfg, None, budget_s=math.nan, jobs=2)


def test_headroom_budget_nan_is_refused(tmp_path: Path) -> None:
    res = _invoke(
        ["nightly", str(tmp_path), "--fleet", str(_fleet(tmp_path, "rr", RR_FLEET)), "--headroom-budget", "nan"]
    )
    assert res.exit_code == 2 and "--headroom-budget" in res.stderr and "nan" in res.stderr


def test_a_failed_headroom_stage_is_named_and_the_night_is_still_published(night: dict[str, Any]) -> None:
    res, store, reports = night["res"], night["store"], night["reports"]
    assert res.exit_code == 1, res.stderr
    line = one_error_line(res.stderr)
    page = reports / DATE / "rr" / "index.html"
    assert line == (
        f"error: stage headroom failed (the later stages ran; report {page}): "
        "OverflowError: timestamp out of range for platform time_t"
    ), line
    lines = res.stderr.splitlines()
    assert lines[-1] == line and lines[-2].startswith(f"nightly {DATE}: run "), lines[-2:]
    for stage in ("cost", "warehouse", "report", "index"):
        assert f"[{stage}] done in" in res.stderr, stage
    assert "[headroom] FAILED after" in res.stderr
    # the later stages' outputs: the report and its headline, the index, the cost tables, the warehouse
    assert page.is_file() and (page.parent / "headline.json").is_file() and (reports / "index.html").is_file()
    (run_dir,) = store.runs_dir.iterdir()
    assert json.loads((page.parent / "headline.json").read_text())["run_id"] == run_dir.name
    assert list((store.root / "costs").glob("*/*.parquet")) and store.warehouse_path.is_file()
    assert not (run_dir / "load_curve.parquet").exists()


def test_an_unexpected_exception_in_a_stopping_stage_is_one_stage_error() -> None:
    def bug() -> None:
        raise KeyError("engine_pods")

    with pytest.raises(StageError, match=r"^stage replay failed \(earlier stages' outputs are intact\): KeyError: "):
        _stage("replay", {}, lambda _m: None, bug)


# --- outputs over the store's own files -------------------------------------------------------


def _refused(res: Any, option: str, path: Path, real: Path, what: str) -> None:
    assert res.exit_code == 1, res.stderr
    assert one_error_line(res.stderr) == (
        f"error: {option} {path}: {real} is {what}; output never goes over the store's own files: write it elsewhere"
    )


def test_report_out_over_the_runs_files_is_refused_and_the_run_kept(night: dict[str, Any], tmp_path: Path) -> None:
    store: Store = night["store"]
    (run_dir,) = store.runs_dir.iterdir()
    run, root = run_dir.name, store.root.resolve()
    before = _digest(store.root)
    base = ["report", "--store", str(store.root), "--run", run]
    for name in ("config.json", "requests.parquet"):
        target = run_dir / name
        _refused(_invoke([*base, "--out", str(target)]), "--out", target, target.resolve(),
                 f"in the runs/ folder of the store {root}")  # fmt: skip
    link = tmp_path / "innocent.html"  # a link into the run: the real path is compared
    link.symlink_to(run_dir / "config.json")
    _refused(_invoke([*base, "--out", str(link)]), "--out", link, (run_dir / "config.json").resolve(),
             f"in the runs/ folder of the store {root}")  # fmt: skip
    manifest = store.manifest_path
    _refused(_invoke([*base, "--out", str(manifest)]), "--out", manifest, manifest.resolve(),
             f"the manifest.parquet of the store {root}")  # fmt: skip
    runs = store.runs_dir
    _refused(_invoke([*base, "--reports", str(runs)]), "--reports", runs, runs.resolve(),
             f"the runs/ folder of the store {root}")  # fmt: skip
    png = store.requests_dir / "png"
    _refused(_invoke([*base, "--out", str(tmp_path / "r.html"), "--png", str(png)]), "--png", png, png.resolve(),
             f"in the requests/ folder of the store {root}")  # fmt: skip
    assert _digest(store.root) == before, "a refused --out changed the store"
    assert not (run_dir / "headline.json").exists() and not png.exists()
    ok = _invoke([*base, "--out", str(tmp_path / "r.html")])  # the run is still readable
    assert ok.exit_code == 0 and (tmp_path / "r.html").is_file(), ok.stderr


def test_nightly_reports_in_the_store_is_refused_before_any_stage(night: dict[str, Any]) -> None:
    store: Store = night["store"]
    before = _digest(store.root)
    res = _invoke(["nightly", str(night["logs"]), "--fleet", str(night["fleet"]), "--store", str(store.root),
                   "--reports", str(store.root)])  # fmt: skip
    _refused(res, "--reports", store.root, store.root.resolve(), "the store's own folder")
    assert "[ingest]" not in res.stderr and _digest(store.root) == before


def test_demo_reports_in_the_store_is_refused_before_any_stage(tmp_path: Path) -> None:
    store = tmp_path / "store"
    res = _invoke(["demo", "--store", str(store), "--reports", str(store / "runs")])
    assert res.exit_code != 0
    line = one_error_line(res.stderr)
    assert line.startswith(f"error: --reports {store / 'runs'}: ") and "of the store" in line
    assert "[ingest]" not in res.stderr and not (store / "runs").exists()


def test_commands_without_store_do_not_write_into_the_default_one(
    night: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """synth, catalog import-hf and calibrate take no --store: their --out may not go over the
    files of the store the other commands use ($ROOFTRACE_STORE here)."""
    store: Store = night["store"]
    root = store.root.resolve()
    monkeypatch.setenv("ROOFTRACE_STORE", str(store.root))
    before = _digest(store.root)
    day = store.requests_dir / f"date={DATE}" / "part-0.parquet"
    res = _invoke(["synth", "--format", "openai", "--requests", "5", "--out", str(day)])
    _refused(res, "--out", day, day.resolve(), f"in the requests/ folder of the store {root}")
    config = tmp_path / "config.json"
    config.write_text("{}")
    wh = store.warehouse_path
    res = _invoke(["catalog", "import-hf", str(config), "--hf-id", "a/b", "--out", str(wh)])
    _refused(res, "--out", wh, wh.resolve(), f"the warehouse.duckdb of the store {root}")
    out = store.runs_dir / "x.toml"
    res = _invoke(["calibrate", "--measurements", str(config), "--hardware", "h100-sxm", "--out", str(out)])
    _refused(res, "--out", out, out.resolve(), f"in the runs/ folder of the store {root}")
    assert _digest(store.root) == before


# --- [calibration] with a tier that ignores it ------------------------------------------------


@pytest.mark.parametrize("cost_model", ["measured", "prior"])
def test_calibration_with_a_tier_that_ignores_it_is_refused(tmp_path: Path, cost_model: str) -> None:
    text = RR_FLEET.replace("[engine]", f'cost_model = "{cost_model}"\n[engine]')
    path = _fleet(tmp_path, "cal", text + '[calibration]\nsource = "my stack"\ncompute_efficiency = 0.01\n')
    message = (
        f"{path}: [calibration] prices the roofline tier; cost_model = '{cost_model}' ignores it: remove one, "
        "or use cost_model = 'roofline' / 'auto'"
    )
    with pytest.raises(ConfigError) as err:
        load_fleet(path)
    assert str(err.value) == message
    res = _invoke(["replay", "--store", str(tmp_path / "s"), "--fleet", str(path)])
    assert res.exit_code == 1 and one_error_line(res.stderr) == f"error: {message}"
    for ok in ("auto", "roofline"):  # the tiers it prices (auto: switched to the roofline for it)
        path.write_text(path.read_text().replace(f'cost_model = "{cost_model}"', f'cost_model = "{ok}"'))
        assert load_fleet(path).calibration is not None
        cost_model = ok


# --- --executor / --ray-address that do nothing -----------------------------------------------


def test_unused_pod_options_say_why() -> None:
    rr = FleetConfig(name="rr", model="llama-3.1-8b", hardware="h100-sxm", replicas=4)
    lo = FleetConfig(name="lo", model="llama-3.1-8b", hardware="h100-sxm", replicas=4, router="least_outstanding")
    one = "--executor ray not used: the fleet replayed as one engine"
    assert unused_pod_options(lo, 1, "ray", None, 1) == [f"{one} (router least_outstanding cannot be cut into pods)"]
    assert unused_pod_options(rr, 1, "ray", None, 1) == [f"{one} (no --pods N asked, and it fits one engine)"]
    assert unused_pod_options(rr, 1, "ray", None, 1, closed=True) == [
        f"{one} (the closed loop of --concurrency cannot be cut into pods)"
    ]
    assert unused_pod_options(rr, 2, "ray", "auto", 2) == []  # both used
    assert unused_pod_options(rr, 2, "local", None, 2) == []
    assert unused_pod_options(rr, 2, "local", "garbage", 2) == [
        "--ray-address not used: --executor local runs the pods one after another here "
        "(the address is for --executor ray)"
    ]
    hierarchical = FleetConfig(name="h", model="llama-3.1-8b", hardware="h100-sxm", replicas=4, router_pod_size=2)
    assert unused_pod_options(hierarchical, 1, "process", None, 1) == []  # its routing pods are the executor's


def test_replay_and_nightly_say_the_executor_was_not_used(night: dict[str, Any], tmp_path: Path) -> None:
    assert (
        "replay: --executor process not used: the fleet replayed as one engine (no --pods N asked, and it fits "
        "one engine)"
    ) in night["res"].stderr.splitlines()
    # its replays go into a copy: the night's store holds the night's one run for the other tests
    shutil.copytree(night["store"].root, tmp_path / "store")
    store = Store(tmp_path / "store")
    lo = _fleet(tmp_path, "lo", RR_FLEET.replace("round_robin", "least_outstanding"))
    res = _invoke(["replay", "--store", str(store.root), "--fleet", str(lo), "--executor", "process"])
    assert res.exit_code == 0, res.stderr
    notes = [ln for ln in res.stderr.splitlines() if "not used" in ln]
    assert notes == [
        "replay: --executor process not used: the fleet replayed as one engine (router least_outstanding "
        "cannot be cut into pods)"
    ]
    res = _invoke(["replay", "--store", str(store.root), "--fleet", str(night["fleet"]), "--pods", "2",
                   "--ray-address", "garbage"])  # fmt: skip
    assert res.exit_code == 0 and "in 2 pods" in res.stderr, res.stderr
    assert [ln for ln in res.stderr.splitlines() if "not used" in ln] == [
        "replay: --ray-address not used: --executor thread runs the pods in threads here (the address is for "
        "--executor ray)"
    ]
