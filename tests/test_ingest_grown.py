"""A log that grows between two ingests (docs/limits.md, "A bad row read again"): the bad rows an
earlier read of the same path quarantined are duplicates of that read, not quarantined again, so
over the reads each bad line is quarantined once and rows read = stored + quarantined +
duplicates still holds per read; a line whose content changed is quarantined again; --force and
--jobs keep their meaning."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.ingest.core as core
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from tests.test_ingest_hostile import _balanced, _cli, _manifest, _quarantine
from tests.test_ingest_parallel import _files, _table

T0 = 1764496800  # 2025-11-30 10:00 UTC


def _good(rid: str, k: int = 0) -> str:
    return json.dumps(
        {
            "id": rid,
            "created": T0 + k,
            "model": "llama-3.1-8b",
            "usage": {"prompt_tokens": 100, "completion_tokens": 10},
        }
    )


def _bad(tag: str) -> str:
    return json.dumps(
        {"id": tag, "created": "garbage", "model": "m", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    )


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _append(path: Path, lines: list[str]) -> None:
    with path.open("a") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _first_log(root: Path) -> Path:
    """The reproduction: ten good rows, then a bad one (line 11)."""
    return _write(root / "log.jsonl", [_good(f"r{i}", i) for i in range(10)] + [_bad("bad1")])


def _accounting(store: Store) -> list[dict[str, object]]:
    res = _cli("query", "ingest_accounting", "--store", str(store.root), "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert isinstance(rows, list)
    return rows


@pytest.fixture(params=["memory", "out_of_core"])
def merge(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "out_of_core":
        monkeypatch.setattr(core, "STAGE_MEMORY_BYTES", 1)  # every batch spills: DuckDB merges
    return str(request.param)


def test_a_grown_log_does_not_quarantine_its_old_bad_line_again(tmp_path: Path, merge: str) -> None:
    """The second read said "12 rows read = 1 stored + 1 quarantined + 10 duplicates" and the
    quarantine held line 11 twice: ingest_accounting showed 2 quarantined rows for a file with
    one bad line, and a nightly re-read of a rolling log inflated it night after night."""
    log = _first_log(tmp_path)
    store = Store(tmp_path / "s")
    first = ingest_logs([log], store)
    _balanced(first)
    assert (first.total("rows_stored"), first.total("rows_quarantined")) == (10, 1)
    _append(log, [_good("r99", 100)])
    said: list[str] = []
    s = ingest_logs([log], store, progress=said.append)
    _balanced(s)
    f = s.files[0]
    assert (f.rows_read, f.rows_stored, f.rows_quarantined, f.rows_duplicate) == (12, 1, 0, 11)
    assert "12 rows read = 1 stored + 0 quarantined + 11 duplicates" in s.line()
    assert (
        f"{log}: openai, 12 rows read, 0 quarantined, 1 already quarantined by an earlier read of this file "
        "(counted as duplicates)"
    ) in said
    assert (
        f"{log}: grew since it was ingested (11 earlier row(s) read again as duplicates, 1 new row(s) stored)" in said
    )
    assert not [m for m in said if m.startswith("warning:")], said
    q = _quarantine(store)
    assert q.select("source_file", "source_line").rows() == [(str(log), 11)]
    assert q["raw"].to_list() == [_bad("bad1")]
    man = _manifest(store)
    assert man["rows_quarantined"].to_list() == [1, 0]
    for row in man.iter_rows(named=True):
        assert row["rows_read"] == row["rows_stored"] + row["rows_quarantined"] + row["rows_duplicate"], row
    acc = _accounting(store)
    files = [r for r in acc if r["kind"] == "file"]
    assert sum(int(str(r["rows_quarantined"])) for r in files) == 1
    assert [r["rows_quarantined"] for r in acc if r["kind"] == "quarantine"] == [1]
    # It grows again (a bad line among the new ones): the old bad line still counts once, the new
    # one is quarantined; the unchanged file is then skipped.
    _append(log, [_bad("bad2"), _good("r100", 101)])
    s = ingest_logs([log], store)
    _balanced(s)
    f = s.files[0]
    assert (f.rows_read, f.rows_stored, f.rows_quarantined, f.rows_duplicate) == (14, 1, 1, 12)
    assert _quarantine(store).select("source_line", "raw").rows() == [(11, _bad("bad1")), (13, _bad("bad2"))]
    s = ingest_logs([log], store)
    assert s.files[0].skipped and s.total("rows_quarantined") == 0
    assert _manifest(store)["rows_quarantined"].sum() == _quarantine(store).height == 2


def test_a_bad_line_edited_in_place_is_quarantined_again(tmp_path: Path, merge: str) -> None:
    """Line 11 rewritten (other bad content) before the log grew: a new record, quarantined. Every
    row the earlier read kept is read again, so the log grew (a half-written last line completed
    later is the common case of a bad line changing in place)."""
    log = _first_log(tmp_path)
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([log], store))
    lines = log.read_text().splitlines()
    lines[10] = _bad("bad1-edited")
    _write(log, [*lines, _good("r99", 100)])
    said: list[str] = []
    s = ingest_logs([log], store, progress=said.append)
    _balanced(s)
    f = s.files[0]
    assert (f.rows_read, f.rows_stored, f.rows_quarantined, f.rows_duplicate) == (12, 1, 1, 10)
    q = _quarantine(store)
    assert sorted(q.select("source_line", "raw").rows()) == sorted([(11, _bad("bad1")), (11, _bad("bad1-edited"))])
    assert [m for m in said if m.startswith("warning:")] == []
    grew = f"{log}: grew since it was ingested (10 earlier row(s) read again as duplicates, 1 new row(s) stored)"
    assert grew in said
    # The same bad text moved to another line (a line inserted above it) is another record too.
    moved = tmp_path / "moved.jsonl"
    _write(moved, [_good("m0"), _bad("same")])
    _balanced(ingest_logs([moved], store))
    _write(moved, [_good("m0"), _good("m1", 1), _bad("same")])
    s = ingest_logs([moved], store)
    _balanced(s)
    assert (s.files[0].rows_quarantined, s.files[0].rows_duplicate) == (1, 1)


def test_a_log_name_reused_with_the_same_bad_first_line_is_still_a_new_log(tmp_path: Path) -> None:
    """A log rotated under one name whose line 1 is the same bad banner every time: the banner is
    the earlier read's quarantined row (a duplicate), and the log is still said to be new."""
    log = _write(tmp_path / "current.jsonl", ["# banner", _good("a0"), _good("a1", 1)])
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([log], store, fmt="openai"))
    _write(log, ["# banner", _good("b0", 5), _good("b1", 6), _good("b2", 7)])
    said: list[str] = []
    s = ingest_logs([log], store, fmt="openai", progress=said.append)
    _balanced(s)
    f = s.files[0]
    assert (f.rows_read, f.rows_stored, f.rows_quarantined, f.rows_duplicate) == (4, 3, 0, 1)
    assert not [m for m in said if m.startswith("warning:")], said
    assert [m for m in said if "new content under a name ingested before" in m] == [
        f"{log}: new content under a name ingested before (none of the earlier read's 2 row(s) is in it): read "
        "as a new log, the earlier rows stay (--force would replace every earlier read of this name)"
    ]
    assert _quarantine(store).height == 1


def test_a_grown_log_read_in_parallel_equals_the_serial_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two grown logs read again with --jobs 2 (each file in a worker; their first read split
    into pieces): the same store, accounting and messages as a serial run."""
    monkeypatch.setattr(core, "SPLIT_MIN_BYTES", 1)
    monkeypatch.setattr(core, "PIECE_BYTES", 400)
    one = _first_log(tmp_path)
    two = _write(tmp_path / "two.jsonl", [_bad("x"), *(_good(f"t{i}", i) for i in range(8)), _bad("y")])
    assert core._split_plan(one, False, None, None, core.Context(None), 2) is not None
    serial, parallel = Store(tmp_path / "serial"), Store(tmp_path / "parallel")
    for store, jobs in ((serial, 1), (parallel, 2)):
        _balanced(ingest_logs([one, two], store, jobs=jobs))
    _append(one, [_good("r99", 100)])
    _append(two, [_bad("z"), _good("t99", 99)])
    runs = []
    for store, jobs in ((serial, 1), (parallel, 2)):
        said: list[str] = []
        s = ingest_logs([one, two], store, jobs=jobs, progress=said.append)
        _balanced(s)
        counts = [(f.rows_read, f.rows_stored, f.rows_quarantined, f.rows_duplicate) for f in s.files]
        runs.append((counts, said))
    assert runs[0] == runs[1]
    assert runs[0][0] == [(12, 1, 0, 11), (12, 1, 1, 10)]
    assert _files(parallel) == _files(serial) and _files(serial)
    assert _table(parallel.quarantine_dir).equals(_table(serial.quarantine_dir))
    assert _table(serial.quarantine_dir).height == 4
    assert _table(parallel.manifest_path).equals(_table(serial.manifest_path))


def test_force_after_growth_leaves_one_quarantine_record(tmp_path: Path, merge: str) -> None:
    log = _first_log(tmp_path)
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([log], store))
    _append(log, [_good("r99", 100)])
    _balanced(ingest_logs([log], store))
    assert _quarantine(store).height == 1
    s = ingest_logs([log], store, force=True)
    _balanced(s)
    f = s.files[0]
    assert (f.rows_read, f.rows_stored, f.rows_quarantined, f.rows_duplicate, f.rows_replaced) == (12, 11, 1, 0, 11)
    q = _quarantine(store)
    assert q.select("source_file", "source_line", "raw").rows() == [(str(log), 11, _bad("bad1"))]
    man = _manifest(store)
    assert man.height == 1 and man["rows_quarantined"].to_list() == [1]
    # --force again (the same content): still one record.
    _balanced(ingest_logs([log], store, force=True))
    assert _quarantine(store).height == 1


def test_an_all_quarantined_read_is_no_earlier_read(tmp_path: Path) -> None:
    """A read whose every row was quarantined failed and is not in the manifest: its records do
    not make the same rows duplicates later; read again unchanged it fails again, its records
    replaced (still one set)."""
    log = _write(tmp_path / "bad.jsonl", [_bad("a"), _bad("b")])
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store)
    assert not s.ok and "all 2 rows quarantined" in s.errors[0]
    s = ingest_logs([log], store)
    assert not s.ok and s.files[0].rows_quarantined == 2
    assert _quarantine(store).height == 2
    assert not store.manifest_path.exists() or str(log) not in _manifest(store)["source_file"].to_list()


# --- the accounting over random grown logs --------------------------------------------------------


_ROW = st.one_of(st.just("good"), st.sampled_from(["bad-a", "bad-b", "not json", "{}"]))


@given(
    first=st.lists(_ROW, min_size=1, max_size=8),
    steps=st.lists(
        st.tuples(st.lists(_ROW, max_size=5), st.lists(st.integers(0, 30), max_size=2), st.sampled_from(["a", "b"])),
        min_size=1,
        max_size=3,
    ),
)
@settings(max_examples=15, deadline=None)
def test_accounting_holds_per_read_over_grown_logs(
    first: list[str], steps: list[tuple[list[str], list[int], str]]
) -> None:
    """A log with a good row, read, then grown (some of its bad lines edited in place) and read
    again, a few times: each read's manifest entry has rows read = stored + quarantined +
    duplicates, each bad (line, text) is quarantined once over the reads, and the quarantine
    holds exactly the manifest's quarantined rows."""
    counter = iter(range(10_000))

    def render(kind: str, salt: str = "") -> str:
        n = next(counter)
        if kind == "good":
            return _good(f"g{n}", n)
        if kind.startswith("bad-"):
            return _bad(kind + salt)
        return kind + salt if kind == "not json" else kind

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lines = [render(k) for k in ["good", *first]]
        log = _write(root / "log.jsonl", lines)
        store = Store(root / "s")
        s = ingest_logs([log], store)
        _balanced(s)
        seen: set[tuple[int, str]] = set()  # (line, raw) quarantined so far
        ids: set[str] = set()

        def expect(lines: list[str]) -> tuple[int, int]:
            """(stored, quarantined) of a read of ``lines``."""
            stored = quarantined = 0
            for n, text in enumerate(lines, start=1):
                try:
                    rec = json.loads(text)
                except ValueError:
                    rec = None
                if isinstance(rec, dict) and isinstance(rec.get("created"), int):
                    if rec["id"] not in ids:
                        ids.add(rec["id"])
                        stored += 1
                elif (n, text) not in seen:
                    seen.add((n, text))
                    quarantined += 1
            return stored, quarantined

        assert (s.total("rows_stored"), s.total("rows_quarantined")) == expect(lines)
        for added, edits, salt in steps:
            bad_at = [i for i, text in enumerate(lines) if not text.startswith('{"id": "g')]
            for e in edits:
                if bad_at:
                    i = bad_at[e % len(bad_at)]
                    lines[i] = render("bad-a" if "bad-a" not in lines[i] else "bad-b", salt)
            lines += [render(k, salt) for k in added]
            _write(log, lines)
            s = ingest_logs([log], store)
            _balanced(s)
            if s.files[0].skipped:  # nothing changed
                continue
            assert (s.total("rows_stored"), s.total("rows_quarantined")) == expect(lines)
        man = _manifest(store)
        for row in man.iter_rows(named=True):
            assert row["rows_read"] == row["rows_stored"] + row["rows_quarantined"] + row["rows_duplicate"], row
        q = _quarantine(store)
        assert q.height == man["rows_quarantined"].sum() == len(seen)
        assert (set(q.select("source_line", "raw").rows()) if q.height else set()) == seen
