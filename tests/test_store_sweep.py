"""Recovery sweeps the temporary files a killed writer leaves in every folder a stage writes
into (pipeline/ingest/store.py, ``Store.stage_temp_files``): a replay killed with -9 left
``.requests.parquet.*.tmp`` / ``.steps.parquet.*.tmp`` in runs/<id>/ through a complete re-run,
classify and sql, while docs/limits.md said leftovers are removed."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from pipeline.ingest.store import RUN_TEMP_IDLE_S, Store, open_store


def _file(path: Path, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PAR1 half a file")
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def _layout(root: Path) -> dict[str, Path]:
    run = root / "runs" / "2025-01-15-default-0123456789"
    _file(run / "config.json").write_text(json.dumps({"run_id": run.name}))
    part = root / "accounting" / "requests" / "date=2025-01-15"
    return {
        # a killed replay's tables, older than the config.json a later complete re-run wrote
        "run_requests": _file(run / ".requests.parquet.k1lled_x.tmp", age_s=60),
        "run_steps": _file(run / ".steps.parquet.abcd_123.tmp", age_s=60),
        # a run without config.json: a replay between its last write and its rename, or killed long ago
        "fresh_run": _file(root / "runs" / "2025-01-16-default-aaaa" / ".requests.parquet.zzzzzzzz.tmp"),
        "idle_run": _file(root / "runs" / "2025-01-17-b" / ".series.parquet.yyyyyyyy.tmp", RUN_TEMP_IDLE_S + 60),
        # classify's partitions, plans, costs, request partitions, validation
        "accounting": _file(part / ".part-00000.parquet.q1w2e3r4.tmp"),
        "plan": _file(root / "plans" / "p1" / ".plan.parquet.00000000.tmp"),
        "cost": _file(root / "costs" / "c1" / ".gpu_cost.parquet.11111111.tmp"),
        "requests": _file(root / "requests" / "date=2025-01-15" / ".part-00000.parquet.22222222.tmp"),
        "validation": _file(root / "validation" / ".errors.parquet.33333333.tmp"),
        # not ours: other names, and a hidden folder (staging has its own rules)
        "user_file": _file(part / "notes.tmp"),
        "other_hidden": _file(part / ".notes.tmp"),
        "long_suffix": _file(part / ".x.parquet.123456789.tmp"),
        "top": _file(root / ".manifest.parquet.44444444.tmp"),
    }


SWEPT = {"run_requests", "run_steps", "idle_run", "accounting", "plan", "cost", "requests", "validation", "top"}


def test_open_store_sweeps_every_stage_folder_and_only_our_temporary_names(tmp_path: Path) -> None:
    files = _layout(tmp_path / "store")
    store = Store(tmp_path / "store")
    found = {name for name, p in files.items() if p in store.leftovers()}
    assert found == SWEPT
    open_store(tmp_path / "store")
    assert {name for name, p in files.items() if not p.exists()} == SWEPT


def test_a_file_a_live_process_has_open_is_left_alone(tmp_path: Path) -> None:
    files = _layout(tmp_path / "store")
    with files["accounting"].open("ab"), files["run_steps"].open("ab"):
        open_store(tmp_path / "store")
        assert files["accounting"].exists() and files["run_steps"].exists()
        assert not files["run_requests"].exists()
    open_store(tmp_path / "store")  # closed now: a leftover
    assert not files["accounting"].exists() and not files["run_steps"].exists()


def test_nothing_is_swept_while_another_run_holds_the_lock(tmp_path: Path) -> None:
    files = _layout(tmp_path / "store")
    with (tmp_path / "store" / ".lock").open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # (another writer, as another process holds it)
        open_store(tmp_path / "store")
        assert all(p.exists() for p in files.values())
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    open_store(tmp_path / "store")
    assert {name for name, p in files.items() if not p.exists()} == SWEPT


def test_a_writer_taking_the_lock_sweeps_a_killed_replays_tables(tmp_path: Path) -> None:
    """The hostile sequence's last step: the next stage that takes the lock (classify, a replay's
    commit) removes a killed replay's tables in runs/<id>/ once a later replay of it completed."""
    files = _layout(tmp_path / "store")
    store = Store(tmp_path / "store")
    with store.lock():
        pass
    assert not files["run_requests"].exists() and not files["run_steps"].exists()
    assert files["fresh_run"].exists()  # perhaps a live replay's finished table, about to be renamed


def test_a_rerun_of_a_completed_run_keeps_its_new_tables(tmp_path: Path) -> None:
    """The same replay run again (same run id, so runs/<id>/config.json exists from the first):
    its table finished under the temporary name, not yet renamed, is newer than config.json and
    must survive the lock its own commit takes."""
    run = tmp_path / "store" / "runs" / "2025-01-15-default-0123456789"
    _file(run / "config.json", age_s=100)
    table = _file(run / ".requests.parquet.n3wrun00.tmp")
    with Store(tmp_path / "store").lock():
        pass
    assert table.exists()
