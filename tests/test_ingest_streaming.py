"""How ``rooftrace ingest`` streams and bounds what it reads: a line past the record limit read whole, a JSON array
log loaded whole, a file growing during a serial read, Mooncake hash_ids that contradict the
input length, duplicate OTel attribute keys, quarantined OTel spans that cannot be found, NUL
bytes, and many small files."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import threading
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import pipeline.ingest.core as core
import pipeline.ingest.readers as readers
import pipeline.ingest.source as source
from pipeline.ingest import IngestSummary, ingest_logs
from pipeline.ingest.store import Store
from tests.test_ingest_grown import _append, _write
from tests.test_ingest_hostile import _balanced, _cli, _manifest, _quarantine

T0 = 1764496800  # 2025-11-30 10:00 UTC


def _good(rid: str, k: int = 0, prompt: int = 100) -> str:
    return json.dumps(
        {
            "id": rid,
            "created": T0 + k,
            "model": "llama-3.1-8b",
            "usage": {"prompt_tokens": prompt, "completion_tokens": 10},
        }
    )


def _stored(store: Store) -> pl.DataFrame:
    return pl.concat([store.read_requests(d) for d in store.dates()]).sort("source_line")


def _one(s: IngestSummary) -> core.FileResult:
    _balanced(s)
    assert len(s.files) == 1, s.files
    return s.files[0]


# --- 3. a line past the record limit is never held whole ----------------------------------------


def test_a_line_past_the_record_limit_is_skipped_unread_and_quarantined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 MB .gz held a 1 GiB line: the reader kept the whole line (2.25 GB of memory) before
    checking the 64 MiB record limit. Now a line is read no further than the limit (lowered here
    to 2,000 bytes), the rest skipped in chunks: the batch holds only its start, and it is
    quarantined with its line number as before."""
    monkeypatch.setattr(readers, "MAX_RECORD_BYTES", 2000)
    log = tmp_path / "bomb.jsonl.gz"
    long = 3_000_000
    with gzip.open(log, "wb") as fh:
        fh.write((_good("a", 0) + "\n").encode())
        fh.write(b"a" * long + b"\r\n")
        fh.write((_good("b", 1) + "\n").encode())
    # the reader: the long line comes as its start only, with its true length
    batches = list(source.iter_line_batches(log, limit=2000))
    lines = [ln for b in batches for ln in b.lines]
    assert [b.numbers for b in batches] == [[1, 2, 3]]
    assert len(lines[1]) == long  # its length, "\r\n" left out
    assert len(bytes(lines[1])) <= source.LONG_LINE_KEPT  # but never held whole
    assert isinstance(lines[1], source.LongLine)
    # the ingest: quarantined with its line, the lines around it stored
    store = Store(tmp_path / "s")
    res = _one(ingest_logs([log], store))
    assert (res.rows_read, res.rows_stored, res.rows_quarantined) == (3, 2, 1)
    q = _quarantine(store)
    assert q["source_line"].to_list() == [2]
    assert q["reason"].to_list() == ["record is longer than 2,000 bytes, the most ingest reads"]
    assert q["raw"].to_list() == ["a" * readers.RAW_LIMIT]
    assert _stored(store)["source_line"].to_list() == [1, 3]


def test_bounded_line_reading_keeps_every_line_as_it_was(tmp_path: Path) -> None:
    """Lines at and around the limit, CRLF, a last line without a newline and a long blank line
    read as ``for line in fh`` reads them (only a line past the limit differs)."""
    limit = 10
    data = b"0123456789\n0123456789\r\n01234567890\n          \n" + b" " * 50 + b"\n" + b"x" * 25 + b"\r\nend"
    got = list(source.iter_lines(io.BytesIO(data), limit))
    assert got[:4] == [b"0123456789\n", b"0123456789\r\n", b"01234567890\n", b"          \n"]
    assert got[4] == b"\n"  # a blank line past the limit is still blank
    assert isinstance(got[5], source.LongLine) and len(got[5]) == 25
    assert got[6] == b"end"
    assert len(got) == 7


# --- 2. a JSON array log is streamed -------------------------------------------------------------


def _array_records() -> list[Any]:
    recs: list[Any] = [json.loads(_good(f"r{i}", i, prompt=100 + i)) for i in range(40)]
    recs[7] = 12345  # not an object: quarantined at its position
    recs[20] = {"id": "bad", "created": "garbage", "model": "m", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    recs[31] = "a string"
    recs[35]["note"] = "é ünïcødé \u2028 and a long text " * 20
    return recs


@pytest.mark.parametrize("read_chars", [7, 100, 1 << 20])
def test_a_json_array_log_is_streamed_and_equals_the_same_records_as_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_chars: int
) -> None:
    """A JSON array (LiteLLM SpendLogs style) was loaded whole by ``json.load`` (7 bytes of memory
    per byte of file). It is now parsed element by element from a bounded buffer (read here in
    pieces as small as 7 characters, so elements and numbers are cut at every place): the stored
    requests equal those of the same records as JSON Lines, and a bad element is quarantined
    with its position, as before."""

    def no_whole_load(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the JSON array was loaded whole")

    monkeypatch.setattr(readers.json, "load", no_whole_load)
    monkeypatch.setattr(readers, "ARRAY_READ_CHARS", read_chars)
    recs = _array_records()
    arr = tmp_path / "a" / "spend.json"
    arr.parent.mkdir()
    arr.write_text("[\n  " + ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in recs) + "\n]\n")
    lines = tmp_path / "b" / "spend.jsonl"
    lines.parent.mkdir()
    _write(lines, [json.dumps(r) for r in recs])
    sa, sb = Store(tmp_path / "sa"), Store(tmp_path / "sb")
    ra, rb = _one(ingest_logs([arr], sa)), _one(ingest_logs([lines], sb))
    assert (ra.rows_read, ra.rows_stored, ra.rows_quarantined) == (40, 37, 3)
    assert (rb.rows_read, rb.rows_stored, rb.rows_quarantined) == (40, 37, 3)
    a, b = _stored(sa).drop("source_file"), _stored(sb).drop("source_file")
    assert a.equals(b)
    qa, qb = _quarantine(sa), _quarantine(sb)
    assert qa["source_line"].to_list() == [8, 21, 32]
    assert qa.select("source_line", "field", "reason").equals(qb.select("source_line", "field", "reason"))
    assert qa["reason"][0] == "record is a number, not an object"


def test_a_json_array_longer_than_a_batch_is_read_in_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Elements are handed on BATCH_LINES at a time (lowered to 4 here), numbered on across
    batches; a broken document still fails as one file, naming the element after which it
    broke."""
    monkeypatch.setattr(readers, "BATCH_LINES", 4)
    monkeypatch.setattr(readers, "ARRAY_READ_CHARS", 16)
    recs = [json.loads(_good(f"r{i}", i)) for i in range(10)]
    arr = tmp_path / "spend.json"
    arr.write_text(json.dumps(recs))
    batches = list(readers._json_array_lines(readers._array_elements(arr)))
    assert [n for _, n in batches] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    store = Store(tmp_path / "s")
    assert _one(ingest_logs([arr], store)).rows_stored == 10
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(recs)[:-1] + " x]")
    s = ingest_logs([broken], Store(tmp_path / "s2"))
    assert s.files[0].error is not None
    assert "invalid JSON document (after element 10" in str(s.files[0].error)
    # a JSON Lines file whose first line is an array stays JSON Lines (that line one bad record)
    jl = _write(tmp_path / "jl.jsonl", ["[1, 2]", _good("x", 1), _good("y", 2)])
    res = _one(ingest_logs([jl], Store(tmp_path / "s3"), fmt="openai"))
    assert (res.rows_read, res.rows_stored, res.rows_quarantined) == (3, 2, 1)


# --- 9. a file growing during a serial read -------------------------------------------------------


def test_a_log_appended_to_after_its_read_is_hashed_as_it_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background hash read to the end of the file on its own: lines appended after the
    reader's end but before the hash's were in the manifest's hash and never stored (the next run
    said "already ingested"). The hash now covers exactly the bytes read. Deterministic: the hash
    waits until the read is done, and three lines are appended in between (an Azure CSV: its
    reader does not wait for the hash's line count, as the JSON fast path does)."""
    rows = [f"2025-01-15 00:00:{i:02d},{100 + i},10" for i in range(13)]
    log = _write(tmp_path / "live.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", *rows[:10]])
    before = log.read_bytes()
    extra = rows[10:]
    read_done = threading.Event()
    stage_file, sha256_file = core._stage_file, source.sha256_file

    def stage_then_append(*args: Any, **kwargs: Any) -> Any:
        out = stage_file(*args, **kwargs)
        _append(log, extra)
        read_done.set()
        return out

    def hash_after_read(*args: Any, **kwargs: Any) -> Any:
        read_done.wait(30)
        return sha256_file(*args, **kwargs)

    monkeypatch.setattr(core, "_stage_file", stage_then_append)
    monkeypatch.setattr(source, "sha256_file", hash_after_read)
    store = Store(tmp_path / "s")
    res = _one(ingest_logs([log], store))
    assert (res.rows_read, res.rows_stored) == (10, 10)
    assert _manifest(store)["content_sha256"].to_list() == [hashlib.sha256(before).hexdigest()]
    monkeypatch.undo()
    again = _one(ingest_logs([log], store))
    assert not again.skipped
    assert (again.rows_read, again.rows_stored, again.rows_duplicate) == (13, 3, 10)
    assert _stored(store).height == 13


def test_a_log_appended_to_between_its_hash_and_its_read_stores_exactly_the_hashed_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path seen before is hashed first, then read: lines appended in between were read (and
    stored) though the hash did not cover them, so the next run said "grew" and stored nothing.
    The read now stops where the hash did, and the next run stores the rest."""
    log = _write(tmp_path / "live.jsonl", [_good(f"r{i}", i) for i in range(5)])
    store = Store(tmp_path / "s")
    assert _one(ingest_logs([log], store)).rows_stored == 5
    _append(log, [_good(f"a{i}", 10 + i) for i in range(2)])  # grew: seen before, hashed first
    hashed = log.read_bytes()
    later = [_good(f"b{i}", 20 + i) for i in range(4)]
    sha256_file = source.sha256_file
    done: list[bool] = []

    def hash_then_append(*args: Any, **kwargs: Any) -> Any:
        out = sha256_file(*args, **kwargs)
        if not done:
            done.append(True)
            _append(log, later)
        return out

    monkeypatch.setattr(source, "sha256_file", hash_then_append)
    res = _one(ingest_logs([log], store))
    assert (res.rows_read, res.rows_stored, res.rows_duplicate) == (7, 2, 5)
    assert res.content_sha256 == hashlib.sha256(hashed).hexdigest()
    monkeypatch.undo()
    last = _one(ingest_logs([log], store))
    assert (last.rows_read, last.rows_stored, last.rows_duplicate) == (11, 4, 7)
    assert _stored(store).height == 11


# --- 8. Mooncake hash_ids against input_length ---------------------------------------------------


def test_mooncake_hash_ids_past_the_input_length_are_quarantined(tmp_path: Path) -> None:
    """10 blocks of 512 tokens for a 1,000-token prompt were stored (and built prefix chains of
    tokens the request never had)."""
    rows = [
        {"timestamp": 4000, "input_length": 1000, "output_length": 10, "hash_ids": list(range(10))},
        {"timestamp": 4001, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 4002, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 4003, "input_length": 1025, "output_length": 10, "hash_ids": [1, 2, 3]},
        {"timestamp": 4004, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2, 3]},
        {"timestamp": 4005, "input_length": 5, "output_length": 10, "hash_ids": []},
    ]
    log = _write(tmp_path / "mc.jsonl", [json.dumps(r) for r in rows])
    store = Store(tmp_path / "s")
    res = _one(ingest_logs([log], store, date="2025-01-15"))
    assert (res.rows_read, res.rows_stored, res.rows_quarantined) == (6, 4, 2)
    q = _quarantine(store)
    assert q["source_line"].to_list() == [1, 5]
    assert q["field"].to_list() == ["hash_ids", "hash_ids"]
    assert q["reason"].to_list() == [
        "hash_ids holds 10 blocks of 512 tokens for input_length 1000 (at most 2 blocks)",
        "hash_ids holds 3 blocks of 512 tokens for input_length 1024 (at most 2 blocks)",
    ]


# --- 5, 6. OTel spans: duplicate attribute keys, and naming the span ------------------------------


def _span(i: int, inp: Any = None, extra: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    attrs = [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
        {"key": "gen_ai.response.id", "value": {"stringValue": f"o{i}"}},
        {"key": "gen_ai.usage.input_tokens", "value": inp if inp is not None else {"intValue": "100"}},
        {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "10"}},
        *extra,
    ]
    return {
        "traceId": f"{i:032x}",
        "spanId": f"{i:016x}",
        "name": "chat",
        "startTimeUnixNano": "1736904793424782000",
        "endTimeUnixNano": "1736904810053332000",
        "attributes": attrs,
    }


def _otel(spans: list[dict[str, Any]]) -> str:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]})


def test_a_duplicate_otel_attribute_key_quarantines_its_span(tmp_path: Path) -> None:
    """A span with gen_ai.usage.input_tokens twice (100, then 999999) was stored with the last
    value and no word, while a duplicate JSON key quarantines its record."""
    dup = {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "999999"}}
    http = {"traceId": "f" * 32, "spanId": "e" * 16, "attributes": [{"key": "x", "value": {}}] * 2}
    log = _write(tmp_path / "o.jsonl", [_otel([_span(1), _span(2, extra=(dup,)), http, _span(3)])])
    store = Store(tmp_path / "s")
    res = _one(ingest_logs([log], store))
    assert (res.rows_read, res.rows_stored, res.rows_quarantined) == (3, 2, 1)
    q = _quarantine(store)
    assert q["field"].to_list() == ["gen_ai.usage.input_tokens"]
    assert q["reason"].to_list() == [
        "span attribute gen_ai.usage.input_tokens is given more than once (OTLP attribute keys are unique): "
        "span 2 of the record (resourceSpans[1].scopeSpans[1].spans[2]), spanId 0000000000000002"
    ]
    assert sorted(_stored(store)["request_id"].to_list()) == ["o1", "o3"]


def test_a_quarantined_otel_span_names_itself_and_keeps_its_own_json(tmp_path: Path) -> None:
    """Every bad span of an export line said "line 1" with the whole line as its raw text (which
    may not even hold it past RAW_LIMIT). Now the reason names the span (its number in the line
    and its spanId) and the raw text is the span's own JSON."""
    spans = [_span(1), _span(2, {"intValue": "-5"}), _span(3), _span(4, {"boolValue": True}), _span(5)]
    spans[2]["attributes"] = "oops"  # unreadable attributes: quarantined before validation
    log = _write(tmp_path / "o.jsonl", [_otel([_span(9)]), _otel(spans)])
    store = Store(tmp_path / "s")
    res = _one(ingest_logs([log], store))
    assert (res.rows_read, res.rows_stored, res.rows_quarantined) == (6, 3, 3)
    q = _quarantine(store).sort("reason")
    assert q["source_line"].to_list() == [2, 2, 2]
    assert q["reason"].to_list() == [
        "gen_ai.usage.input_tokens is negative: -5: span 2 of the record "
        "(resourceSpans[1].scopeSpans[1].spans[2]), spanId 0000000000000002",
        "gen_ai.usage.input_tokens is not a number: True: span 4 of the record "
        "(resourceSpans[1].scopeSpans[1].spans[4]), spanId 0000000000000004",
        "span attributes are a string, not a list: span 3 of the record "
        "(resourceSpans[1].scopeSpans[1].spans[3]), spanId 0000000000000003",
    ]
    assert [json.loads(r)["spanId"] for r in q["raw"].to_list()] == [f"{i:016x}" for i in (2, 4, 3)]
    assert [json.loads(r) for r in q["raw"].to_list()] == [spans[1], spans[3], spans[2]]


# --- 7. NUL bytes ----------------------------------------------------------------------------------


def test_a_leading_nul_run_costs_only_its_line(tmp_path: Path) -> None:
    """``logrotate copytruncate`` leaves a zero-filled start: a NUL in the first 4 KiB refused the
    whole log without a line number, while the same NUL later cost one line. Now the run costs
    the line it is on, with its number, whatever its length."""
    good = [_good(f"r{i}", i) for i in range(20)]
    for run in (4096, 200_000):
        log = tmp_path / f"live{run}.jsonl"
        log.write_bytes(b"\x00" * run + "".join(g + "\n" for g in good).encode())
        store = Store(tmp_path / f"s{run}")
        res = _one(ingest_logs([log], store))
        assert (res.rows_read, res.rows_stored, res.rows_quarantined) == (20, 19, 1)
        q = _quarantine(store)
        assert q["source_line"].to_list() == [1]
        assert q["reason"].to_list() == [
            f"invalid JSON: the line starts with {run:,} NUL bytes (zero-filled or cut while the log was written?)"
        ]
    # a stray NUL early in the file costs its line, as one later does
    lines = [ln.encode() for ln in good]
    lines[3] = lines[3][:50] + b"\x00" + lines[3][50:]
    log = tmp_path / "nul.jsonl"
    log.write_bytes(b"\n".join(lines) + b"\n")
    store = Store(tmp_path / "s")
    res = _one(ingest_logs([log], store))
    assert (res.rows_read, res.rows_stored, res.rows_quarantined) == (20, 19, 1)
    q = _quarantine(store)
    assert q["source_line"].to_list() == [4]
    assert q["reason"].to_list() == [
        "invalid JSON: the line holds a NUL byte at byte 51 (zero-filled or cut while the log was written?)"
    ]


def test_a_binary_file_is_refused_naming_its_first_nul(tmp_path: Path) -> None:
    """A file whose sniffed block is more than 10 % NUL bytes is binary: refused whole, saying
    where the first NUL is; a file of nothing but NULs too."""
    blob = tmp_path / "blob.jsonl"
    blob.write_bytes(b'{"a": 1}\n' + b"\x00\x01\x02\x03" * 500)
    zeros = tmp_path / "zeros.jsonl"
    zeros.write_bytes(b"\x00" * 100_000)
    good = _write(tmp_path / "good.jsonl", [_good("r1")])
    res = _cli("ingest", str(blob), str(zeros), str(good), "--store", str(tmp_path / "s"))
    assert res.exit_code == 1, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [
        f"error: {blob}: binary file (500 NUL bytes in 2,009, the first at byte 9), not a text log",
        f"error: {zeros}: binary file (nothing but NUL bytes), not a text log",
    ]
    assert "1 rows read = 1 stored" in res.stderr


# --- 4. many small files ---------------------------------------------------------------------------


def test_a_run_of_many_files_says_how_far_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 one-line files ran for minutes with no word of progress. A run of several files now
    says every few seconds (here every file: the interval set to 0) how many files of how many
    are read, and the rows so far; not after the last file, whose summary follows."""
    monkeypatch.setattr(core, "PROGRESS_EVERY_S", 0.0)
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(4):
        _write(logs / f"f{i}.jsonl", [_good(f"r{i}-{j}", j) for j in range(i + 1)])
    said: list[str] = []
    s = ingest_logs([logs], Store(tmp_path / "s"), progress=said.append)
    _balanced(s)
    ticks = [re.sub(r"\d+ s elapsed", "T s elapsed", ln) for ln in said if ln.startswith("ingest: ")]
    assert ticks == [
        "ingest: 1 of 4 files read (1 rows), T s elapsed",
        "ingest: 2 of 4 files read (3 rows), T s elapsed",
        "ingest: 3 of 4 files read (6 rows), T s elapsed",
    ]
    one: list[str] = []
    ingest_logs([logs / "f0.jsonl"], Store(tmp_path / "s1"), progress=one.append)
    assert not [ln for ln in one if ln.startswith("ingest: ")]


def test_readers_share_one_duckdb_database_with_connections_of_their_own() -> None:
    """Each file's reader opened a DuckDB database of its own (about 45 ms, most of the fixed cost
    of a one-line file: 300 such files took 25.9 s, now 13.0 s). Readers now take connections
    (cursors) to one database per process: a table made on one is seen on another (one
    database), while what a reader registers (DerivedIds' ``contents``) stays its own, so a
    file read ahead on another thread cannot see it."""
    a, b = source.duck_connect(), source.duck_connect()
    try:
        a.execute("CREATE TABLE rooftrace_probe AS SELECT 42 AS x")
        assert b.execute("SELECT x FROM rooftrace_probe").fetchall() == [(42,)]
        a.register("contents", pl.DataFrame({"content": ["mine"]}).to_arrow())
        with pytest.raises(Exception, match="contents"):
            b.execute("SELECT * FROM contents").fetchall()
    finally:
        a.execute("DROP TABLE IF EXISTS rooftrace_probe")
        a.close()
        b.close()
