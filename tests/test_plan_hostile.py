"""Hostile findings on ``plan`` and fleets: cost_model = "measured" on a GPU without a measured
profile (a fleet error naming the file; a plan that skips that hardware with its reason), and a
base fleet's expert parallelism following each candidate's tp x dp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import own_copy

from pipeline.cli import main
from pipeline.common.errors import ConfigError
from pipeline.costmodel.profile.cost import fleet_step_cost
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.plan import Candidate, PlanOptions, candidate_fleet, plan
from pipeline.plan.stage import _with_model
from pipeline.replay.fleet import load_fleet, parse_fleet, resolve

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "traces" / "sample" / "azure_conv_2023.csv.gz"
#: Loose targets: one or two replicas meet them, so each search is a few short replays.
LOOSE = "ttft_p99=60s,tpot_p99=1s"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    s = Store(tmp_path_factory.mktemp("plan-hostile") / "store")
    ingest_logs([AZURE], s, date="2023-11-16")
    return s


def _fleet(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _opts(fleet: Path, **kw: object) -> PlanOptions:
    args: dict[str, object] = {
        "model": "llama-3.1-8b",
        "slo": LOOSE,
        "fleet_path": str(fleet),
        "tp": (1,),
        "window_s": 20.0,
        "warmup_s": 5.0,
        "traffic_model": "*",
        "jobs": 1,
        "max_replicas": 8,
    }
    args.update(kw)
    return PlanOptions(**args)  # type: ignore[arg-type]


def test_measured_fleet_without_profile_names_the_file(store: Store, tmp_path: Path) -> None:
    bad = _fleet(
        tmp_path / "bad.toml",
        ['name = "bad"', 'model = "llama-3.1-8b"', 'hardware = "mi300x"', 'cost_model = "measured"'],
    )
    with pytest.raises(ConfigError, match=r"bad\.toml: cost_model = 'measured' but hardware mi300x has no"):
        load_fleet(bad)
    res = CliRunner().invoke(main, ["replay", "--fleet", str(bad), "--store", str(store.root)])
    assert res.exit_code == 1, res.output
    # one line, naming the file and the key, before any work (no "replaying ..." progress)
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(bad) in errors[0] and "cost_model" in errors[0], res.output
    assert "replaying" not in res.output
    # a fleet built in code (no file) is refused when its step cost is built, naming the fleet
    fleet = resolve(
        parse_fleet({"name": "mem", "model": "llama-3.1-8b", "hardware": "mi300x", "cost_model": "measured"}, "mem")
    )
    with pytest.raises(ConfigError, match=r"^fleet 'mem': cost_model = 'measured'"):
        fleet_step_cost(fleet)
    # auto on the same GPU is fine (the roofline)
    ok = _fleet(tmp_path / "ok.toml", ['name = "ok"', 'model = "llama-3.1-8b"', 'hardware = "mi300x"'])
    assert load_fleet(ok).cost_model == "auto"


def test_plan_measured_base_skips_hardware_without_profile(store: Store, tmp_path: Path) -> None:
    base = _fleet(
        tmp_path / "measured.toml",
        ['name = "m"', 'model = "llama-3.1-8b"', 'hardware = "h100-sxm"', 'cost_model = "measured"'],
    )
    result = plan(own_copy(store, tmp_path), _opts(base, hardware=("mi300x", "h100-sxm")))
    rows = {r["hardware"]: r for r in result.table.to_pylist()}
    assert rows["h100-sxm"]["meets_slo"] and rows["h100-sxm"]["rank"] == 1, rows["h100-sxm"]
    mi = rows["mi300x"]
    assert not mi["meets_slo"] and mi["replays"] == 0
    assert mi["note"].startswith("skipped: mi300x has no measured profile"), mi["note"]
    assert str(base) in mi["note"] and "cost_model = 'auto'" in mi["note"]
    assert any("skipped mi300x" in n and "cost_model = 'measured'" in n for n in result.doc["notes"])
    assert result.doc["chosen"]["hardware"] == "h100-sxm"
    on_disk = json.loads((result.plan_dir / "plan.json").read_text())
    assert on_disk["notes"] == result.doc["notes"]


def test_plan_ep_follows_tp_times_dp(store: Store, tmp_path: Path) -> None:
    lines = [
        'name = "moe"',
        'model = "qwen3-30b-a3b"',
        'hardware = "h100-sxm"',
        "tp = 1",
        "dp = 2",
        "ep = 2",
        "[engine]",
        "max_model_len = 8192",
    ]
    base_path = _fleet(tmp_path / "moe.toml", lines)
    base = load_fleet(base_path)
    for tp in (1, 2):
        cfg = candidate_fleet(base, Candidate("h100-sxm", tp, "bf16"))
        assert (cfg.tp, cfg.dp, cfg.ep) == (tp, 2, tp * 2)
        assert resolve(cfg).deployment.gpus == tp
    # ep = 1 stays 1 (no expert parallelism asked for); tp x dp = 1 gives ep = 1
    dp1 = parse_fleet({"name": "d", "model": "qwen3-30b-a3b", "hardware": "h100-sxm", "tp": 2, "ep": 2}, "d")
    assert candidate_fleet(dp1, Candidate("h100-sxm", 1, "bf16")).ep == 1
    no_ep = parse_fleet({"name": "n", "model": "qwen3-30b-a3b", "hardware": "h100-sxm", "dp": 2}, "n")
    assert candidate_fleet(no_ep, Candidate("h100-sxm", 2, "bf16")).ep == 1
    # a dense model planned from an expert-parallel base runs ep = 1
    assert _with_model(base, "llama-3.1-8b").ep == 1

    store = own_copy(store, tmp_path)
    result = plan(store, _opts(base_path, model="qwen3-30b-a3b", hardware=("h100-sxm",), tp=(1, 2), max_replicas=4))
    rows = result.table.to_pylist()
    assert [r["tp"] for r in sorted(rows, key=lambda r: r["tp"])] == [1, 2]
    for r in rows:
        assert r["fits"], r["note"]
        assert "ep must be" not in (r["note"] or "")
        assert r["gpus_per_replica"] == r["tp"] * 2
    assert any("ep follows tp x dp" in n and "tp 2: ep 4" in n for n in result.doc["notes"]), result.doc["notes"]


def test_a_worker_killed_from_outside_is_one_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan worker the kernel kills (the OOM killer) breaks the process pool: the command says what
    happened and what to change, in one line, instead of concurrent.futures' traceback."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from pipeline.common.errors import RooftraceError
    from pipeline.plan import executors

    class KilledPool:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def __enter__(self) -> KilledPool:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def submit(self, fn: object, *args: object) -> Future[object]:
            fut: Future[object] = Future()
            fut.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly"))
            return fut

    monkeypatch.setattr(executors, "ProcessPoolExecutor", KilledPool)
    monkeypatch.setattr(executors, "await_compile_ahead", lambda: None)
    with pytest.raises(RooftraceError) as info:
        executors.run_local([object(), object(), object()], 2, None)  # type: ignore[list-item]
    line = str(info.value)
    assert "\n" not in line and "a worker process died after 0 of 3 configurations" in line and "--jobs" in line
