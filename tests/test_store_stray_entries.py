"""Stray entries in the store: a FIFO named like a part file hung every reader, a stray folder in
``requests/`` stopped every command or was skipped without a word, and a ``part-NNNNN.parquet``
that is not a byte copy (another date's part, the same rows re-saved) was read as the store's
and folded into the date for good by the next ingest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from cli_checks import cli as _cli

import pipeline.ingest.store as store_mod
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import read_parquet
from pipeline.ingest import IngestSummary, ingest_logs
from pipeline.ingest.store import Store
from pipeline.synth import SynthConfig, generate, write_logs

DAY, NEXT = "2025-01-15", "2025-01-16"


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the store's warnings (given once per process) anew."""
    monkeypatch.setattr(store_mod, "_FOREIGN_WARNED", set())


def _log(tmp_path: Path, name: str, requests: int, seed: int, day: str = DAY) -> Path:
    out = tmp_path / name
    write_logs(generate(SynthConfig(requests=requests, seed=seed, duration_s=600, date=day)), "openai", out)
    return out


def _balanced(s: IngestSummary) -> None:
    assert s.ok
    for f in s.files:
        assert f.rows_read == f.rows_stored + f.rows_quarantined + f.rows_duplicate, f


def _sql(store: Store, query: str) -> str:
    res = _cli("sql", query, "--store", str(store.root), "--format", "csv")
    assert res.exit_code == 0, res.output
    return res.stdout


def _manifest_rows(store: Store) -> int:
    return int(pl.from_arrow(read_parquet(store.manifest_path, "manifest"))["rows_stored"].sum())  # type: ignore[index]


# --- a FIFO (or any non-regular file) named like a part is never opened ----------------------


def test_a_fifo_named_like_a_part_is_named_and_never_opened(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    _balanced(ingest_logs([_log(tmp_path, "a.jsonl", 120, 1)], store))
    folder = store.partition(store.requests_dir, DAY)
    fifo = folder / "part-00001.parquet"
    os.mkfifo(fifo)
    (folder / "part-00002").mkdir()  # a folder: not the store's either
    os.mkfifo(folder / "part-00003.parquet")  # two "equal-size" FIFOs: _drop_copies must not hash them
    env = {**os.environ, "ROOFTRACE_MAX_MEMORY": "4GiB"}
    cmd = [sys.executable, "-m", "pipeline", "classify", "--store", str(store.root), "--date", DAY]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)  # hung forever before
    assert run.returncode == 0, run.stderr
    assert f"{DAY}: 120 requests" in run.stdout
    assert f"warning: {fifo}: not part of the store (a named pipe (FIFO), not a regular file); not read" in run.stderr
    assert f"warning: {folder / 'part-00002'}: not part of the store (a folder, not a regular file)" in run.stderr
    # in-process: the listing, stored_rows and an ingest into the date (it leaves the FIFO alone)
    assert store.request_files(DAY) == [folder / "part-00000.parquet"]
    assert store.stored_rows(DAY) == 120
    _balanced(ingest_logs([_log(tmp_path, "c.jsonl", 30, 3)], store))
    assert store.stored_rows(DAY) == 150 and fifo.exists() and not fifo.is_file()
    assert _sql(store, "select count(*) n from requests") == '"n"\n150\n'


# --- a folder of requests/ that is not a date partition is named, never read -------------


def test_a_stray_folder_in_requests_is_named_once_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path / "store")
    _balanced(ingest_logs([_log(tmp_path, "a.jsonl", 100, 1)], store))
    shutil.copytree(store.partition(store.requests_dir, DAY), store.requests_dir / f"date={DAY}.bak")
    (store.requests_dir / "date=2025-13-45").mkdir()
    (store.requests_dir / "2025-01-17").mkdir()
    capsys.readouterr()
    assert store.dates() == [DAY]
    assert store.dates() == [DAY]  # once per process
    warned = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert warned == [
        f"warning: {store.requests_dir / name}: not a date partition (the store names them date=YYYY-MM-DD); "
        f"not read as requests, move it out of {store.requests_dir}"
        for name in ("2025-01-17", f"date={DAY}.bak", "date=2025-13-45")
    ]
    store_mod._FOREIGN_WARNED.clear()
    res = _cli("sql", "select 1 as one", "--store", str(store.root), "--format", "csv")
    assert res.exit_code == 0, res.output
    assert res.stdout == '"one"\n1\n'
    assert "date=2025-13-45: not a date partition" in res.stderr
    assert _sql(store, "select count(*) n from requests") == '"n"\n100\n'  # the .bak copy is not read
    res = _cli("classify", "--store", str(store.root))
    assert res.exit_code == 0, res.output
    assert f"{DAY}: 100 requests" in res.stdout


# --- a part that is not the store's, by the manifest's row count ---------------------------


def _two_dates(tmp_path: Path) -> tuple[Store, Path, Path]:
    store = Store(tmp_path / "store")
    a, b = _log(tmp_path, "a.jsonl", 200, 1), _log(tmp_path, "b.jsonl", 150, 2, NEXT)
    _balanced(ingest_logs([a, b], store))
    return store, a, b


def _gap_line(store: Store, held: int, counted: int, log: Path) -> str:
    return (
        f"warning: {store.partition(store.requests_dir, DAY)}: the store's files of {DAY} hold {held} rows but the "
        f"manifest counts {counted} stored there ({held - counted} not from ingest: a part file copied in or "
        "re-saved?); files: part-00000.parquet, part-00001.parquet -- repair it with `rooftrace ingest --force` "
        f"of the date's logs ({log}), or move the file that is not the store's out of {store.requests_dir}"
    )


def test_another_dates_part_copied_in_is_warned_refused_and_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, a, _ = _two_dates(tmp_path)
    shutil.copy(
        store.partition(store.requests_dir, NEXT) / "part-00000.parquet",
        store.partition(store.requests_dir, DAY) / "part-00001.parquet",
    )
    capsys.readouterr()
    assert len(store.request_files(DAY)) == 2
    store.request_files(DAY)  # once per process
    err = capsys.readouterr().err.splitlines()
    assert err == [_gap_line(store, 350, 200, a)]
    assert store.request_files(NEXT)  # the 16th agrees with its manifest: no warning
    assert capsys.readouterr().err == ""
    # an ingest into the date is refused, nothing written
    with pytest.raises(RooftraceError, match="nothing ingested"):
        ingest_logs([_log(tmp_path, "c.jsonl", 30, 3)], store)
    assert store.stored_rows(DAY) == 350 and _manifest_rows(store) == 350
    res = _cli("ingest", str(tmp_path / "c.jsonl"), "--store", str(store.root))
    assert res.exit_code == 1
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [
        f"error: {store.partition(store.requests_dir, DAY)}: the store's files of {DAY} hold 350 rows but the "
        "manifest counts 200 stored there (150 not from ingest; files: part-00000.parquet, part-00001.parquet) -- "
        "nothing ingested: merging would keep the 150 rows the manifest does not count for good; repair it first "
        f"with `rooftrace ingest --force` of the date's logs ({a}), or move the file that is not the store's out "
        f"of {store.requests_dir}"
    ]
    # --force of the date's logs rebuilds it from the files read now
    forced = ingest_logs([a], store, force=True)
    _balanced(forced)
    assert sorted(p.name for p in store.partition(store.requests_dir, DAY).iterdir()) == ["part-00000.parquet"]
    assert store.stored_rows(DAY) == 200 and store.stored_rows(NEXT) == 150
    assert _manifest_rows(store) == 350
    capsys.readouterr()
    _balanced(ingest_logs([tmp_path / "c.jsonl"], store))
    assert store.stored_rows(DAY) == 230 and _manifest_rows(store) == 380
    assert "warning:" not in capsys.readouterr().err


def test_a_resaved_copy_of_the_same_rows_is_warned_and_force_rebuilds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, a, _ = _two_dates(tmp_path)
    folder = store.partition(store.requests_dir, DAY)
    f = pq.ParquetFile(folder / "part-00000.parquet")
    md = f.metadata.metadata or {}
    table = f.read().replace_schema_metadata({k: v for k, v in md.items() if k != b"ARROW:schema"})
    pq.write_table(table, folder / "part-00001.parquet", compression="snappy")  # not byte-identical
    capsys.readouterr()
    res = _cli("sql", "select count(*) n, count(distinct request_id) ids from requests", "--store", str(store.root))
    assert res.exit_code == 0
    assert _gap_line(store, 400, 200, a) in res.stderr.splitlines()
    # the next ingest refuses instead of dropping 200 "duplicates" silently
    with pytest.raises(RooftraceError, match="hold 400 rows but the manifest counts 200"):
        ingest_logs([_log(tmp_path, "c.jsonl", 30, 3)], store)
    assert store.stored_rows(DAY) == 400
    forced = ingest_logs([a], store, force=True)
    _balanced(forced)
    assert store.stored_rows(DAY) == 200 and _manifest_rows(store) == 350
    assert forced.total("rows_replaced") == 400


def test_a_store_without_a_manifest_is_not_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, _, _ = _two_dates(tmp_path)
    shutil.copy(
        store.partition(store.requests_dir, NEXT) / "part-00000.parquet",
        store.partition(store.requests_dir, DAY) / "extra.parquet",
    )
    store.manifest_path.unlink()
    capsys.readouterr()
    assert store.stored_rows(DAY) == 350
    assert capsys.readouterr().err == ""
