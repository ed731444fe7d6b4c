"""Copied and damaged files in the store: a copied or foreign file inside a date folder (it was counted:
a copy of ``part-00000.parquet`` doubled the day in classify and replay while the manifest said
the rows once) and a stored partition that cannot be read (``ingest``, and ``ingest --force``,
the documented recovery, ended in a pyarrow traceback from ``Store.stored_rows``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from cli_checks import cli as _cli
from click.testing import Result

import pipeline.ingest.core as core
import pipeline.ingest.store as store_mod
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import read_parquet, write_parquet
from pipeline.ingest import IngestSummary, ingest_logs
from pipeline.ingest.store import Store
from pipeline.synth import SynthConfig, generate, write_logs

DAY = "2025-01-15"
FLEET = str(Path(__file__).resolve().parents[1] / "fleets" / "default.toml")


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the store's warnings (given once per process) anew."""
    monkeypatch.setattr(store_mod, "_FOREIGN_WARNED", set())


def _log(tmp_path: Path, name: str, requests: int, seed: int) -> Path:
    out = tmp_path / name
    write_logs(generate(SynthConfig(requests=requests, seed=seed, duration_s=600, date=DAY)), "openai", out)
    return out


def _balanced(s: IngestSummary) -> None:
    for f in s.files:
        assert f.rows_read == f.rows_stored + f.rows_quarantined + f.rows_duplicate, f


def _manifest_rows(store: Store) -> int:
    return int(pl.from_arrow(read_parquet(store.manifest_path, "manifest"))["rows_stored"].sum())  # type: ignore[index]


def _error_lines(res: Result) -> list[str]:
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]


def _warnings(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("warning:") and "not part of the store" in ln]


# --- 1. a copy or a foreign file in a date folder is named, never counted ------------------------


def test_a_copy_or_foreign_file_in_a_date_folder_is_named_and_never_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path / "store")
    _balanced(ingest_logs([_log(tmp_path, "a.jsonl", 150, 1)], store))
    folder = store.partition(store.requests_dir, DAY)
    ours = folder / "part-00000.parquet"
    copy = folder / "part-00000 (copy).parquet"
    shutil.copy(ours, copy)  # this copy doubled the day before
    shutil.copy(ours, folder / "part-00001.parquet")  # a copy under a name the store uses
    head = store.read_requests(DAY).head(10)
    write_parquet(head.to_arrow(), folder / "zz-stray.parquet", "requests")  # a foreign file, the right schema
    (folder / "notes.txt").write_text("not requests\n")
    capsys.readouterr()
    store_mod._FOREIGN_WARNED.clear()

    assert store.request_files(DAY) == [ours]
    assert store.stored_rows(DAY) == 150 == _manifest_rows(store)
    assert store.read_requests(DAY).height == 150
    assert store.read_requests(DAY, ["request_id"])["request_id"].n_unique() == 150
    said = _warnings(capsys.readouterr().err)
    assert said == [  # each once, however often the date is listed
        f"warning: {folder / 'notes.txt'}: not part of the store (ingest names its files part-NNNNN.parquet); "
        f"not read as requests, move it out of {store.requests_dir}",
        f"warning: {copy}: not part of the store (ingest names its files part-NNNNN.parquet); "
        f"not read as requests, move it out of {store.requests_dir}",
        f"warning: {folder / 'part-00001.parquet'}: not part of the store (a byte-for-byte copy of "
        f"part-00000.parquet); not read as requests, move it out of {store.requests_dir}",
        f"warning: {folder / 'zz-stray.parquet'}: not part of the store (ingest names its files "
        f"part-NNNNN.parquet); not read as requests, move it out of {store.requests_dir}",
    ]

    # classify and replay count the day once, and say why the other files are left out
    store_mod._FOREIGN_WARNED.clear()
    res = _cli("classify", "--store", str(store.root), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["totals"]["requests"] == 150
    assert len(_warnings(res.stderr)) == 4 and str(copy) in res.stderr
    store_mod._FOREIGN_WARNED.clear()
    res = _cli("replay", "--store", str(store.root), "--fleet", FLEET, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["finished"] + doc["rejected"] == 150
    assert len(_warnings(res.stderr)) == 4

    # another ingest into the date merges the store's file only and leaves the others alone
    lines: list[str] = []
    summary = ingest_logs([_log(tmp_path, "b.jsonl", 40, 2)], store, progress=lines.append)
    _balanced(summary)
    assert (
        f"requests/date={DAY}: part-00001.parquet removed (a byte-for-byte copy of part-00000.parquet: its rows "
        "are stored once)" in lines
    )
    assert summary.files[0].rows_stored == 40
    assert store.stored_rows(DAY) == 190 == _manifest_rows(store)
    # (the copy under a store name is removed, said: once part-00000 is rewritten it would no
    # longer be a copy, and would be read as the store's)
    assert sorted(p.name for p in folder.iterdir()) == [
        "notes.txt",
        "part-00000 (copy).parquet",
        "part-00000.parquet",
        "zz-stray.parquet",
    ]
    assert pl.read_parquet(copy).height == 150  # untouched
    assert store.request_files(DAY) == [ours]


def test_a_store_built_without_ingest_reads_its_parquet_but_not_a_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No manifest (a library caller wrote the date folder): every ``*.parquet`` is requests,
    except a byte copy of one before it."""
    full = Store(tmp_path / "full")
    ingest_logs([_log(tmp_path, "a.jsonl", 60, 3)], full)
    rows = full.read_requests(DAY)
    store = Store(tmp_path / "store")
    folder = store.partition(store.requests_dir, DAY)
    write_parquet(rows.head(20).to_arrow(), folder / "a.parquet", "requests")
    write_parquet(rows.tail(40).to_arrow(), folder / "b.parquet", "requests")
    shutil.copy(folder / "b.parquet", folder / "c.parquet")
    capsys.readouterr()
    assert [p.name for p in store.request_files(DAY)] == ["a.parquet", "b.parquet"]
    assert store.stored_rows(DAY) == 60 == store.read_requests(DAY).height
    assert _warnings(capsys.readouterr().err) == [
        f"warning: {folder / 'c.parquet'}: not part of the store (a byte-for-byte copy of b.parquet); "
        f"not read as requests, move it out of {store.requests_dir}"
    ]


# --- 6. a stored partition that cannot be read: one line, and --force rebuilds the date ------------


@pytest.mark.parametrize("merge", ["memory", "out_of_core"])
def test_a_damaged_partition_is_one_line_and_force_rebuilds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merge: str
) -> None:
    if merge == "out_of_core":
        monkeypatch.setattr(core, "MEMORY_MERGE_BYTES", 0)  # DuckDB's merge
    store = Store(tmp_path / "store")
    a, b = _log(tmp_path, "a.jsonl", 120, 4), _log(tmp_path, "b.jsonl", 30, 5)
    ingest_logs([a], store)
    part = store.partition(store.requests_dir, DAY) / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:1000])  # truncated: no footer
    damaged = part.read_bytes()
    manifest = store.manifest_path.read_bytes()
    reason = f"{part}: not a readable Parquet file: Parquet magic bytes not found in footer."

    with pytest.raises(RooftraceError, match="ingest --force") as got:
        store.stored_rows(DAY)
    assert str(got.value).startswith(reason)

    # an ingest into the date: one line naming the file and the logs to re-ingest, nothing written
    res = _cli("ingest", "--store", str(store.root), str(b))
    assert res.exit_code == 1
    (line,) = _error_lines(res)
    assert line.startswith(f"error: {reason}")
    assert line.endswith(
        f"-- the stored requests of {DAY} are damaged: rebuild the date with `rooftrace ingest --force` "
        f"of its original logs ({a}), or move the file out of the store"
    )
    # --force of a log that did not store the date cannot rebuild it: it says which one is missing
    res = _cli("ingest", "--store", str(store.root), "--force", str(b))
    assert res.exit_code == 1
    (line,) = _error_lines(res)
    assert line.endswith(
        f"-- --force rebuilds the requests of {DAY} only when it reads again every file stored on that "
        f"date; also name {a}, or move the damaged file out of the store"
    )
    assert part.read_bytes() == damaged and store.manifest_path.read_bytes() == manifest

    # classify and replay: the same one line
    for args in (["classify"], ["replay", "--fleet", FLEET]):
        res = _cli(*args, "--store", str(store.root))
        assert res.exit_code == 1, res.output
        (line,) = _error_lines(res)
        assert line.startswith(f"error: {reason}") and "`rooftrace ingest --force` of its original logs" in line

    # the documented recovery: --force of the date's logs rewrites it
    res = _cli("ingest", "--store", str(store.root), "--force", str(a))
    assert res.exit_code == 0, res.output
    assert not _error_lines(res)
    assert f"requests/date={DAY}: part-00000.parquet could not be read; rebuilt from the files read now" in res.stderr
    assert [p.name for p in store.request_files(DAY)] == ["part-00000.parquet"]
    assert store.stored_rows(DAY) == 120 == _manifest_rows(store) == store.read_requests(DAY).height
    # and the store takes more logs again
    summary = ingest_logs([b], store)
    _balanced(summary)
    assert store.stored_rows(DAY) == 120 + summary.files[0].rows_stored == _manifest_rows(store)
