"""Damaged files under the warehouse, report's run and folder checks,
``--date`` validation, and DuckDB's memory limit and Ctrl-C (docs/limits.md, "The SQL warehouse")."""

from __future__ import annotations

import _thread
import json
import shutil
import threading
from pathlib import Path

import pytest
from cli_checks import cli
from click.testing import Result

from pipeline.common.errors import RooftraceError
from pipeline.ingest.store import Store
from pipeline.publish.warehouse import build_warehouse, latest_run, run_sql

COPY = "copy"


def one_error(res: Result, *needles: str) -> str:
    """The result is exit 1 with exactly one ``error:`` line on stderr (no traceback) holding ``needles``."""
    assert res.exit_code == 1, (res.exit_code, res.stderr, res.exception)
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def two_runs(replayed_store: tuple[Store, str], tmp_path: Path) -> tuple[Store, str, str]:
    """A copy of the replayed store with a second run (the first one's files under another id)."""
    src, run_id = replayed_store
    store = Store(tmp_path / "store")
    shutil.copytree(src.root, store.root, ignore=shutil.ignore_patterns("warehouse.duckdb*"))
    for run in store.runs_dir.iterdir():  # other tests may have added runs to the shared store
        if run.name != run_id:
            shutil.rmtree(run) if run.is_dir() else run.unlink()
    other = f"{run_id}-{COPY}"
    shutil.copytree(store.runs_dir / run_id, store.runs_dir / other)
    return store, run_id, other


def truncate(path: Path, keep: int = 300) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# --- A: a damaged run is skipped with a warning, a damaged store file is one error ---------------


@pytest.mark.parametrize("name", ["requests.parquet", "steps.parquet", "series.parquet", "config.json"])
def test_damaged_run_is_left_out_with_a_warning(two_runs: tuple[Store, str, str], name: str) -> None:
    store, run_id, other = two_runs
    damaged = store.runs_dir / run_id / name
    good = damaged.read_bytes()
    if name == "config.json":
        damaged.write_text('{"date": ')
    else:
        truncate(damaged)
    res = cli("sql", "SELECT DISTINCT run_id FROM replay_requests ORDER BY 1", "--store", str(store.root), "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout) == [{"run_id": other}]  # the other run stays queryable
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and f"run {run_id} " in warnings[0] and str(damaged.resolve()) in warnings[0]
    assert "Traceback" not in res.stderr
    res = cli("sql", "SELECT run_id FROM runs", "--store", str(store.root), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout) == [{"run_id": other}]
    res = cli("query", "latency", "--run", other, "--store", str(store.root), "--json")
    assert res.exit_code == 0, res.stderr
    # repaired in place: the warehouse sees it change and takes the run back
    damaged.write_bytes(good)
    res = cli("sql", "SELECT count(DISTINCT run_id) AS n FROM replay_requests", "--store", str(store.root), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout) == [{"n": 2}]
    assert "warning:" not in res.stderr


def _part(store: Store) -> Path:
    return sorted(store.requests_dir.glob("date=*/part-*.parquet"))[0]


@pytest.mark.parametrize("damage", ["truncated part", "empty part", "truncated manifest"])
def test_damaged_store_file_is_one_error(two_runs: tuple[Store, str, str], damage: str) -> None:
    from pipeline.publish.nightly import StageError, _stage

    store, _, _ = two_runs
    if damage == "truncated manifest":
        target = store.root / "manifest.parquet"
        truncate(target, 100)
    else:
        target = _part(store)
        truncate(target, 300 if damage == "truncated part" else 0)
    for args in (("sql", "SELECT 1"), ("query", "latency"), ("report", "--out", str(store.root.parent / "r.html"))):
        one_error(cli(*args, "--store", str(store.root)), str(target.resolve()), "not a readable Parquet file")
    with pytest.raises(StageError, match=r"^stage warehouse failed .*not a readable Parquet file"):
        _stage("warehouse", {}, lambda _m: None, lambda: build_warehouse(store))


# --- B, C, D: report ---------------------------------------------------------------------------------


def test_report_names_a_malformed_config(two_runs: tuple[Store, str, str], tmp_path: Path) -> None:
    store, run_id, _ = two_runs
    config = store.runs_dir / run_id / "config.json"
    config.write_text('{\n  "date": "2025-01-01",\n  oops\n}\n')
    res = cli("report", "--run", run_id, "--store", str(store.root), "--out", str(tmp_path / "r.html"))
    one_error(res, str(config), "not valid JSON", "line 3, column 3")


def test_report_into_a_folder_that_cannot_be_made(two_runs: tuple[Store, str, str], tmp_path: Path) -> None:
    store, run_id, _ = two_runs
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = cli("report", "--run", run_id, "--store", str(store.root), "--reports", str(blocker / "reports"))
    one_error(res, f"cannot create reports folder {blocker / 'reports'}", "Not a directory")
    if Path("/sys").is_dir():  # a read-only filesystem
        res = cli("report", "--run", run_id, "--store", str(store.root), "--reports", "/sys/rooftrace-reports")
        one_error(res, "cannot create reports folder /sys/rooftrace-reports")


def test_report_refuses_an_incomplete_run(two_runs: tuple[Store, str, str], tmp_path: Path) -> None:
    store, run_id, _ = two_runs
    for name in ("steps.parquet", "series.parquet"):
        (store.runs_dir / run_id / name).unlink()
    res = cli("report", "--run", run_id, "--store", str(store.root), "--out", str(tmp_path / "r.html"))
    one_error(res, "incomplete", str(store.runs_dir / run_id / "steps.parquet"))
    assert not (tmp_path / "r.html").exists()


# --- E: --date --------------------------------------------------------------------------------------


def test_report_and_query_check_the_date(two_runs: tuple[Store, str, str], tmp_path: Path) -> None:
    store, run_id, _ = two_runs
    day = run_id[:10]
    out = str(tmp_path / "r.html")
    base = ("--store", str(store.root), "--out", out)
    one_error(cli("report", "--date", day[:7], *base), f"date '{day[:7]}' is not YYYY-MM-DD")
    one_error(cli("report", "--date", "2023-02-30", *base), "is not YYYY-MM-DD")
    one_error(cli("report", "--date", "1999-01-01", *base), "no replay run of 1999-01-01")
    one_error(cli("report", "--run", run_id, "--date", "1999-01-01", *base), "contradicts --run", run_id)
    one_error(cli("report", "--run", run_id, "--date", "nope", *base), "is not YYYY-MM-DD")
    with pytest.raises(RooftraceError, match="is not YYYY-MM-DD"):
        latest_run(store, day[:7])  # used to prefix-match the run of that month
    assert latest_run(store, day) in {run_id, f"{run_id}-{COPY}"}
    q = ("--store", str(store.root), "--json")
    one_error(cli("query", "latency", "--date", day[:7], *q), "is not YYYY-MM-DD")
    one_error(cli("query", "latency", "--run", run_id, "--date", "1999-01-01", *q), "contradicts --run")
    one_error(cli("query", "api_cost", "--date", day, *q), "takes no --date")
    res = cli("query", "latency", "--run", run_id, "--date", day, *q)
    assert res.exit_code == 0, res.stderr


# --- F: DuckDB's memory limit and Ctrl-C ---------------------------------------------------------


def test_sql_has_the_replay_memory_limit(two_runs: tuple[Store, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    store, _, _ = two_runs
    monkeypatch.setenv("ROOFTRACE_MAX_MEMORY", "64MiB")
    assert run_sql(store, "SELECT current_setting('memory_limit') AS m").to_pylist() == [{"m": "64.0 MiB"}]
    res = cli("sql", "SELECT list(range) FROM range(100000000)", "--store", str(store.root))
    one_error(res, "SQL failed: out of memory", "ROOFTRACE_MAX_MEMORY")
    monkeypatch.setenv("ROOFTRACE_MAX_MEMORY", "lots")
    one_error(cli("sql", "SELECT 1", "--store", str(store.root)), "$ROOFTRACE_MAX_MEMORY")


def test_ctrl_c_stops_a_query_that_never_ends(two_runs: tuple[Store, str, str]) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Ctrl-C reaches only the main thread")
    store, _, _ = two_runs
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    try:
        res = cli("sql", "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t",
                  "--store", str(store.root))  # fmt: skip
    finally:
        timer.cancel()
    assert res.exit_code == 130, (res.stderr, res.exception)
    assert res.stderr.strip().splitlines()[-1] == "interrupted (Ctrl-C)" and "Traceback" not in res.stderr


def test_what_if_shows_no_rate_scale_a_closed_loop_or_offline_batch_ignored() -> None:
    from pipeline.publish.report import options_text, what_if_options

    def opts(**o: object) -> dict[str, object]:
        return what_if_options({"options": o})

    assert opts(rate_scale=3.0) == {"rate_scale": 3.0}
    assert options_text(opts(rate_scale=3.0, replicas=4)) == "rate scale 3, replicas 4"
    assert opts(rate_scale=3.0, concurrency=5) == {"concurrency": 5}
    assert opts(rate_scale=0.001, offline=True) == {"offline": True}
    assert opts(rate_scale="x") == {} and opts(rate_scale=1.0) == {}
