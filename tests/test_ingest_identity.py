"""Which file a row came from, and what ingest says when files disagree (docs/limits.md): files are
named by their absolute, link-free path, so ``--force`` replaces the rows of that file only; a
path that comes back with other content, and request ids that come back with other content, are
said; an empty SOURCE and the store's own folder are not read; UTF-16 files, spans that end before
they start and impossible UTC offsets are named for what they are."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

import pipeline.ingest.core as core
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import read_parquet
from pipeline.ingest import IngestSummary, ingest_logs
from pipeline.ingest.store import Store
from pipeline.ingest.timeparse import _iso_series
from tests.test_ingest_bad import GOOD_OTEL_SPAN
from tests.test_ingest_hostile import _all_rows, _balanced, _cli, _manifest, _one_error_line, _quarantine

VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
DATE = "2025-02-11"


def _vidur(path: Path, rows: list[tuple[int, int, int]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(VIDUR + "".join(f"{t},{i},{o}\n" for t, i, o in rows))
    return path


def _oa(rid: str, created: int, prompt: int, ts: str | None = None) -> str:
    rec: dict[str, object] = {"id": rid, "object": "chat.completion", "model": "m"}
    if ts is None:
        rec["created"] = created
    else:
        rec["timestamp"] = ts
    rec["usage"] = {"prompt_tokens": prompt, "completion_tokens": 5}
    return json.dumps(rec)


def _in_store(store: Store) -> list[tuple[str, int, int]]:
    """(source file, line, input tokens) of every stored row."""
    rows = _all_rows(store).sort("source_file", "source_line")
    return list(zip(rows["source_file"], rows["source_line"], rows["recorded_input_tokens"], strict=True))


@pytest.fixture(params=["memory", "out_of_core"])
def merge(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "out_of_core":
        monkeypatch.setattr(core, "STAGE_MEMORY_BYTES", 1)  # every batch spills: DuckDB merges
    return str(request.param)


# --- 1. --force replaces the rows of that file only -----------------------------------------------


def test_force_leaves_a_file_with_the_same_relative_path_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merge: str
) -> None:
    """dA/a.csv and dB/a.csv, each ingested as ``a.csv`` from its own folder, were both stored as
    ``a.csv``: ``--force a.csv`` in dA replaced dB's 3 rows and its manifest entry too."""
    a = _vidur(tmp_path / "dA" / "a.csv", [(0, 100, 10), (1, 200, 20)])
    b = _vidur(tmp_path / "dB" / "a.csv", [(5, 7000, 70), (6, 8000, 80), (7, 9000, 90)])
    store = Store(tmp_path / "s17")
    monkeypatch.chdir(a.parent)
    _balanced(ingest_logs(["a.csv"], store, fmt="vidur", date=DATE))
    monkeypatch.chdir(b.parent)
    _balanced(ingest_logs(["a.csv"], store, fmt="vidur", date=DATE))
    monkeypatch.chdir(a.parent)
    s = ingest_logs(["a.csv"], store, fmt="vidur", date=DATE, force=True)
    _balanced(s)
    assert [f.source_file for f in s.files] == [str(a)]
    assert (s.total("rows_stored"), s.total("rows_replaced")) == (2, 2)
    assert _in_store(store) == [
        (str(a), 2, 100),
        (str(a), 3, 200),
        (str(b), 2, 7000),
        (str(b), 3, 8000),
        (str(b), 4, 9000),
    ]
    assert sorted(_manifest(store)["source_file"].to_list()) == [str(a), str(b)]


def test_force_by_another_spelling_replaces_the_files_earlier_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merge: str
) -> None:
    """A log corrected in place (line 4 changed) and forced as ``./fz/../fz/a.csv``, from another
    folder or through a link was stored twice (4 rows for a 3-row file), without "replacing"."""
    log = _vidur(tmp_path / "fz" / "a.csv", [(0, 100, 10), (1, 200, 20), (2, 300, 30)])
    (tmp_path / "link.csv").symlink_to(log)
    store = Store(tmp_path / "s")
    monkeypatch.chdir(tmp_path)
    _balanced(ingest_logs([Path("fz/a.csv")], store, fmt="vidur", date=DATE))
    spellings = [(tmp_path, "./fz/../fz/a.csv"), (log.parent, "a.csv"), (tmp_path, "link.csv")]
    for k, (cwd, spelling) in enumerate([*spellings, (tmp_path / "fz", "../fz/a.csv")]):
        _vidur(log, [(0, 100, 10), (1, 200, 20), (2, 301 + k, 30)])
        monkeypatch.chdir(cwd)
        s = ingest_logs([spelling], store, fmt="vidur", date=DATE, force=True)
        _balanced(s)
        assert [f.source_file for f in s.files] == [str(log)]  # links resolved, `..` and `.` too
        assert (s.total("rows_stored"), s.total("rows_replaced")) == (3, 3), spelling
        assert "replacing 3 rows stored before" in s.line()
        assert _in_store(store) == [(str(log), 2, 100), (str(log), 3, 200), (str(log), 4, 301 + k)]
        assert _manifest(store)["source_file"].to_list() == [str(log)]


def test_force_does_not_take_the_rows_of_a_path_that_also_stored_other_content(tmp_path: Path, merge: str) -> None:
    """--force on a copy of a log's first version replaced every row stored from the log, the
    rows of its later, grown version included (the content matched one of its manifest entries)."""
    log = _vidur(tmp_path / "live.csv", [(0, 100, 10), (1, 200, 20)])
    old = tmp_path / "old.csv"
    old.write_bytes(log.read_bytes())  # the first version, kept aside
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([log], store, fmt="vidur", date=DATE))
    _vidur(log, [(0, 100, 10), (1, 200, 20), (2, 300, 30)])  # it grew
    _balanced(ingest_logs([log], store, fmt="vidur", date=DATE))
    s = ingest_logs([old], store, fmt="vidur", date=DATE, force=True)
    _balanced(s)
    assert s.total("rows_replaced") == 0 and s.files[0].rows_duplicate == 2
    assert _in_store(store) == [(str(log), 2, 100), (str(log), 3, 200), (str(log), 4, 300)]
    # A renamed file (every entry of its old path has its content) is still replaced by content.
    r = _vidur(tmp_path / "r.csv", [(9, 900, 90), (10, 1000, 100)])
    _balanced(ingest_logs([r], store, fmt="vidur", date=DATE))
    moved = r.rename(tmp_path / "moved.csv")
    s = ingest_logs([moved], store, fmt="vidur", date=DATE, force=True)
    _balanced(s)
    assert (s.total("rows_stored"), s.total("rows_replaced")) == (2, 2)
    assert [row for row in _in_store(store) if row[2] >= 900] == [(str(moved), 2, 900), (str(moved), 3, 1000)]
    assert sorted(_manifest(store)["source_file"].to_list()) == sorted([str(log), str(log), str(old), str(moved)])


# --- 2. a path that comes back with other content ---------------------------------------------


def test_a_log_edited_in_place_is_said_and_a_grown_one_noted(tmp_path: Path) -> None:
    """Re-ingested without --force after an edit of line 4, a log stored 1 new row beside the old
    one and 2 duplicates, in silence."""
    log = _vidur(tmp_path / "a.csv", [(0, 100, 10), (1, 200, 20), (2, 300, 30)])
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([log], store, fmt="vidur", date=DATE))
    _vidur(log, [(0, 100, 10), (1, 200, 20), (2, 333, 30)])
    said: list[str] = []
    s = ingest_logs([log], store, fmt="vidur", date=DATE, progress=said.append)
    _balanced(s)
    assert (s.total("rows_stored"), s.total("rows_duplicate")) == (1, 2)
    warned = [m for m in said if m.startswith("warning:")]
    assert warned == [
        f"warning: {log}: ingested before with other content (that read stored 3 row(s)); this read adds 1 new "
        "row(s) to them (2 duplicate(s)); if the file was corrected rather than appended to, ingest it with "
        "--force to replace what the earlier read stored"
    ]
    # --force now replaces both earlier reads: the file's 3 rows, as they are now.
    s = ingest_logs([log], store, fmt="vidur", date=DATE, force=True, progress=said.append)
    assert s.total("rows_replaced") == 4 and [r[2] for r in _in_store(store)] == [100, 200, 333]
    # An append is a growth: a note, not a warning.
    _vidur(log, [(0, 100, 10), (1, 200, 20), (2, 333, 30), (3, 444, 40)])
    said.clear()
    s = ingest_logs([log], store, fmt="vidur", date=DATE, progress=said.append)
    assert (s.total("rows_stored"), s.total("rows_duplicate")) == (1, 3)
    assert not [m for m in said if m.startswith("warning:")], said
    assert f"{log}: grew since it was ingested (3 earlier row(s) read again as duplicates, 1 new row(s) stored)" in said


# --- 3. the same request id with other content ----------------------------------------------


def _conflicting_logs(root: Path) -> tuple[Path, Path]:
    one = root / "o1.jsonl"
    two = root / "o2.jsonl"
    one.write_text("".join(_oa(f"x{i}", 1733011200, 100) + "\n" for i in range(5)))
    two.write_text("".join(_oa(f"x{i}", 1733029200, 5000) + "\n" for i in range(5)))
    return one, two


def test_conflicting_duplicates_are_counted_and_said(tmp_path: Path, merge: str) -> None:
    """Two files with ids x0..x4, one with 100 prompt tokens at 00:00, the other 5000 at 05:00:
    "10 rows read = 5 stored + 0 quarantined + 5 duplicates", exit 0, nothing else said."""
    one, two = _conflicting_logs(tmp_path)
    copy = tmp_path / "o3.jsonl"
    copy.write_text(one.read_text() + _oa("y", 1733011200, 7) + "\n")  # the same records again, one more
    store = Store(tmp_path / "s")
    said: list[str] = []
    s = ingest_logs([one, two, copy], store, progress=said.append)
    _balanced(s)
    assert [(f.rows_stored, f.rows_duplicate, f.rows_conflicting) for f in s.files] == [(5, 0, 0), (0, 5, 5), (1, 5, 0)]
    assert [m for m in said if m.startswith("warning:")] == [
        f"warning: {two}: 5 row(s) have a request id seen before with other content: dropped as duplicates, "
        f"the first seen kept; e.g. id 'x0' at line 1 here, kept from {one} line 1"
    ]
    assert (
        "16 rows read = 6 stored + 0 quarantined + 10 duplicates (5 of them with other content than the row kept)"
    ) in s.line()
    assert s.to_json()["rows_conflicting"] == 5
    assert _all_rows(store)["recorded_input_tokens"].to_list() == [100] * 5 + [7]  # the first seen is kept

    # Against the store (a later run), one conflicting record among copies, in one file.
    later = tmp_path / "later.jsonl"
    lines = one.read_text().splitlines()
    lines[3] = _oa("x3", 1733011200, 101)
    later.write_text("\n".join([*lines, _oa("x9", 1733011200, 9), _oa("x9", 1733011200, 10)]) + "\n")
    said.clear()
    s = ingest_logs([later], store, progress=said.append)
    _balanced(s)
    assert (s.files[0].rows_stored, s.files[0].rows_duplicate, s.files[0].rows_conflicting) == (1, 6, 2)
    assert [m for m in said if m.startswith("warning:")] == [
        f"warning: {later}: 2 row(s) have a request id seen before with other content: dropped as duplicates, "
        f"the first seen kept; e.g. id 'x3' at line 4 here, kept from {one} line 4"
    ]


def test_conflicts_are_said_alike_by_a_parallel_run(tmp_path: Path) -> None:
    one, two = _conflicting_logs(tmp_path)
    runs = []
    for jobs in (1, 2):
        said: list[str] = []
        s = ingest_logs([one, two], Store(tmp_path / f"s{jobs}"), progress=said.append, jobs=jobs)
        runs.append(([f.rows_conflicting for f in s.files], [m for m in said if m.startswith("warning:")]))
    assert runs[0] == runs[1] and runs[0][0] == [0, 5] and len(runs[0][1]) == 1


# --- 4. an empty SOURCE, the store inside the folder read ---------------------------------------


def test_an_empty_source_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ingest ''`` read the whole current folder, the store's own Parquet files included."""
    monkeypatch.chdir(tmp_path)
    _vidur(tmp_path / "x.csv", [(0, 10, 5)])
    with pytest.raises(RooftraceError, match=r"an empty SOURCE \(''\) names no file"):
        ingest_logs(["", "x.csv"], Store(tmp_path / "s"), fmt="vidur", date=DATE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"]  # nothing read, no store made


def test_the_stores_own_folder_inside_the_folder_read_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store inside the folder being ingested: its manifest.parquet and partitions were read as
    logs and failed ("binary file"), exit 1."""
    logs = tmp_path / "logs"
    _vidur(logs / "a.csv", [(0, 10, 5)])
    store = Store(logs / "store")
    _balanced(ingest_logs([logs], store, fmt="vidur", date=DATE))
    _vidur(logs / "b.csv", [(1, 20, 6)])
    said: list[str] = []
    monkeypatch.chdir(logs)
    s = ingest_logs(["."], store, fmt="vidur", date=DATE, progress=said.append)
    _balanced(s)
    assert s.ok and [(Path(f.source_file).name, f.skipped) for f in s.files] == [("a.csv", True), ("b.csv", False)]
    assert f"{logs / 'store'}: skipped: the store's own folder (it lies inside the folder being ingested)" in said
    # the store itself named as the folder to read: nothing else in it, so nothing to ingest
    s = ingest_logs([logs / "store"], store, fmt="vidur", date=DATE, progress=said.append)
    assert s.errors == [f"{logs / 'store'}: no log files in this folder"]


# --- 5. what a file or a record is, said as it is -----------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "bom", "said"),
    [
        ("utf-16-le", b"\xff\xfe", "UTF-16 text (byte-order mark FF FE)"),
        ("utf-16-be", b"\xfe\xff", "UTF-16 text (byte-order mark FE FF)"),
        ("utf-16-le", b"", "UTF-16 text (little-endian, no byte-order mark)"),
        ("utf-32-le", b"\xff\xfe\x00\x00", "UTF-32 text (byte-order mark FF FE 00 00)"),
    ],
)
@pytest.mark.parametrize("fmt", [None, "openai"])
def test_a_utf16_file_is_said_to_be_utf16(
    tmp_path: Path, encoding: str, bom: bytes, said: str, fmt: str | None
) -> None:
    """A UTF-16 log was "binary file (NUL bytes), not a text log"."""
    log = tmp_path / "u.jsonl"
    log.write_bytes(bom + (_oa("u1", 1733011200, 10) + "\n").encode(encoding))
    args = ["ingest", str(log), "--store", str(tmp_path / "s"), *(["--format", fmt] if fmt else [])]
    res = _cli(*args)
    assert res.exit_code == 1
    line = _one_error_line(res)
    assert line.startswith(f"error: {log}: {said}; ingest reads UTF-8 only: convert it first (iconv -f "), line


def test_a_span_that_ends_before_it_starts_says_so(tmp_path: Path) -> None:
    """An OTel span with end < start was quarantined as "endTimeUnixNano is negative: -68.8"."""
    bad = json.loads(json.dumps(GOOD_OTEL_SPAN))
    span = bad["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["spanId"] = "back"
    span["endTimeUnixNano"] = str(int(span["startTimeUnixNano"]) - 68_800_000_000)
    log = tmp_path / "t.jsonl"
    log.write_text(json.dumps(GOOD_OTEL_SPAN) + "\n" + json.dumps(bad) + "\n")
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store)
    _balanced(s)
    q = _quarantine(store)
    assert q["reason"].to_list() == [
        "endTimeUnixNano is before startTimeUnixNano: the span ends before it starts (negative duration, -68.8 s): "
        "span 1 of the record (resourceSpans[1].scopeSpans[1].spans[1]), spanId back"
    ]
    assert q["field"].to_list() == ["endTimeUnixNano"] and q["source_file"].to_list() == [str(log)]


# --- 6. UTC offsets and RFC 3339's lower-case letters --------------------------------------------


def test_utc_offsets_beyond_18_hours_are_quarantined_and_lower_case_t_z_read(tmp_path: Path) -> None:
    """``+25:00`` shifted an arrival by 25 h; ``2025-01-15t10:00:00z`` (RFC 3339 allows lower
    case) was an unparseable timestamp."""
    stamps = {
        "2025-01-15t10:00:00z": datetime(2025, 1, 15, 10, tzinfo=UTC),
        "2025-01-15t10:00:00.25+01:00": datetime(2025, 1, 15, 9, 0, 0, 250_000, tzinfo=UTC),
        "2025-01-15T10:00:00+18:00": datetime(2025, 1, 14, 16, tzinfo=UTC),
        "2025-01-15T10:00:00-1800": datetime(2025, 1, 16, 4, tzinfo=UTC),
        "2025-01-15T10:00:00+25:00": None,
        "2025-01-15T10:00:00+18:01": None,
        "2025-01-15T10:00:00-2400": None,
        "2025-01-15T10:00:00+05:75": None,
    }
    log = tmp_path / "t.jsonl"
    log.write_text("".join(_oa(f"r{k}", 0, 10, ts=ts) + "\n" for k, ts in enumerate(stamps)))
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store)
    _balanced(s)
    rows = _all_rows(store).sort("source_line")
    got = dict(zip(rows["request_id"], rows["arrival"], strict=True))
    assert got == {f"r{k}": v for k, v in enumerate(stamps.values()) if v is not None}
    q = _quarantine(store)
    assert q["source_line"].to_list() == [5, 6, 7, 8]
    assert q["reason"].to_list() == [
        f"UTC offset out of range (beyond ±18 hours, or minutes past 59): {ts}" for ts in list(stamps)[4:]
    ]
    parsed = _iso_series(pl.Series(list(stamps))).to_list()
    assert [p is None for p in parsed] == [v is None for v in stamps.values()]


def test_manifest_quarantine_and_rows_name_files_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file named by a relative path: the rows, the quarantine and the manifest all hold its
    absolute path."""
    log = tmp_path / "d" / "q.jsonl"
    log.parent.mkdir()
    log.write_text(_oa("a", 1733011200, 10) + "\n" + _oa("b", 1733011200, -1) + "\n")
    monkeypatch.chdir(tmp_path)
    store = Store(Path("s"))
    s: IngestSummary = ingest_logs([os.path.join("d", "..", "d", "q.jsonl")], store)
    _balanced(s)
    assert _all_rows(store)["source_file"].to_list() == [str(log)]
    assert _manifest(store)["source_file"].to_list() == [str(log)]
    q = pl.concat([pl.from_arrow(read_parquet(p, "quarantine")) for p in store.quarantine_dir.glob("*.parquet")])  # type: ignore[misc]
    assert q["source_file"].to_list() == [str(log)]


def test_a_log_name_reused_for_new_content_is_a_note_not_a_force_advice(tmp_path: Path) -> None:
    """A log rewritten every night under one name (`current.csv`) holds none of the earlier rows:
    it is a new log, said as a note. The warning used to advise --force, which replaces every
    earlier read of the name (the earlier nights' rows)."""
    log = _vidur(tmp_path / "current.csv", [(0, 100, 10), (1, 200, 20)])
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([log], store, fmt="vidur", date=DATE))
    _vidur(log, [(5, 700, 70), (6, 800, 80), (7, 900, 90)])
    said: list[str] = []
    s = ingest_logs([log], store, fmt="vidur", date=DATE, progress=said.append)
    _balanced(s)
    assert (s.total("rows_stored"), s.total("rows_duplicate")) == (3, 0)
    assert not [m for m in said if m.startswith("warning:")]
    assert [m for m in said if "new content under a name ingested before" in m] == [
        f"{log}: new content under a name ingested before (none of the earlier read's 2 row(s) is in it): read "
        "as a new log, the earlier rows stay (--force would replace every earlier read of this name)"
    ]
    assert len(_in_store(store)) == 5


def test_a_conflict_with_this_files_earlier_read_says_so(tmp_path: Path) -> None:
    """'id 'x0' at line 1 here, kept from line 1' read as a row conflicting with itself: the row
    kept was this file's line 1 as an earlier ingest read it (the file was edited since)."""
    log = tmp_path / "a.jsonl"
    log.write_text(_oa("x0", 1_736_899_200, 100) + "\n")
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([log], store))
    log.write_text(_oa("x0", 1_736_899_200, 5000) + "\n")
    said: list[str] = []
    _balanced(ingest_logs([log], store, progress=said.append))
    warned = [m for m in said if "request id seen before with other content" in m]
    assert len(warned) == 1 and warned[0].endswith(
        "e.g. id 'x0' at line 1 here, kept from line 1 of this file as an earlier ingest read it"
    ), warned
