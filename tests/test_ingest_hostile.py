"""Hostile inputs and hostile conditions for ingest (docs/limits.md): implausible timestamps and
token counts, a log that grows, a file read with the wrong --format or --date, --force, a bad
--date, FIFOs, a read-only store, a huge first record, and a run killed at any point. Every test
checks rows in = stored + quarantined + duplicates; every error is one ``error: ...`` line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import polars as pl
import pytest
from click.testing import CliRunner, Result

import pipeline.ingest.core as core
from pipeline.cli import main
from pipeline.common.schemas import read_parquet
from pipeline.ingest import IngestSummary, ingest_logs
from pipeline.ingest.normalize import MAX_LATENCY_S, MAX_TOKENS_PER_REQUEST
from pipeline.ingest.store import Store, open_store
from pipeline.synth import SynthConfig, generate, write_logs
from tests.test_cli_hostile import HEADER as CSV_HEADER
from tests.test_cli_hostile import MAPPING as CSV_MAPPING
from tests.test_ingest_bad import GOOD_OPENAI, _good_line, _write, oa
from tests.test_ingest_store import _digest

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
REPO = Path(__file__).resolve().parents[1]


def _balanced(s: IngestSummary) -> None:
    """rows in = stored + quarantined + duplicates, per file and in total."""
    for f in s.files:
        assert f.rows_read == f.rows_stored + f.rows_quarantined + f.rows_duplicate, f
    assert s.total("rows_read") == s.total("rows_stored") + s.total("rows_quarantined") + s.total("rows_duplicate")


def _balanced_json(doc: dict[str, object]) -> None:
    assert doc["rows_read"] == doc["rows_stored"] + doc["rows_quarantined"] + doc["rows_duplicate"]  # type: ignore[operator]


def _quarantine(store: Store) -> pl.DataFrame:
    files = sorted(store.quarantine_dir.glob("*.parquet"))
    if not files:
        schema = {"source_file": pl.String, "source_line": pl.Int64, "field": pl.String, "reason": pl.String}
        return pl.DataFrame(schema=schema)
    got = pl.concat([pl.from_arrow(read_parquet(p, "quarantine")) for p in files])  # type: ignore[misc]
    assert isinstance(got, pl.DataFrame)
    return got.sort("source_file", "source_line")


def _manifest(store: Store) -> pl.DataFrame:
    got = pl.from_arrow(read_parquet(store.manifest_path, "manifest"))
    assert isinstance(got, pl.DataFrame)
    return got


def _all_rows(store: Store) -> pl.DataFrame:
    return pl.concat([store.read_requests(d) for d in store.dates()])


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _one_error_line(res: Result) -> str:
    """The single ``error:`` line of a failed command, with no traceback anywhere."""
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr
    return errors[0]


# --- 1. timestamps ------------------------------------------------------------------------------


def test_timestamps_outside_the_plausible_range_are_quarantined_not_wrapped(tmp_path: Path) -> None:
    """Years past 2262 used to wrap around at ns precision (9999-12-31 stored as 1816-03-30,
    2600-01-01 as a plausible 2015 date). Every arrival outside 2000-01-01 .. 2100-01-01 is now
    quarantined with a reason that quotes it, in every timestamp kind."""
    azure = _write(
        tmp_path / "az.csv",
        [
            "2023-11-16 18:15:46.6805900,374,44",
            "9999-12-31 00:00:00.0000000,10,10",
            "2262-04-12 00:00:00.0000000,10,10",
            "2600-01-01 00:00:00.0000000,10,10",  # wrapped into 2015 at ns precision
            "1999-12-31 23:59:59.9999990,10,10",
            "2100-01-01 00:00:00.0000000,10,10",
            "2099-12-31 23:59:59.0000000,10,10",  # the last plausible second
        ],
        AZURE_HEADER,
    )
    openai = _write(
        tmp_path / "oa.jsonl",
        [
            oa(id="ok"),
            oa(id="zulu", timestamp="9999-12-31T00:00:00Z"),
            oa(id="epoch", created=253402214400),  # 9999-12-31 in epoch seconds
            oa(id="huge", created=10**30),
        ],
    )
    moon = _write(
        tmp_path / "moon.jsonl",
        [
            '{"timestamp": 5, "input_length": 6, "output_length": 4}',
            '{"timestamp": 1e15, "input_length": 6, "output_length": 4}',  # 1e15 ms after the anchor
        ],
    )
    store = Store(tmp_path / "s")
    s = ingest_logs([azure, openai], store)
    s.files += ingest_logs([moon], store, fmt="mooncake", date="2024-01-01").files
    _balanced(s)
    assert s.ok, s.errors
    assert [(f.rows_read, f.rows_stored, f.rows_quarantined) for f in s.files] == [(7, 2, 5), (4, 1, 3), (2, 1, 1)]
    assert store.dates() == ["2023-11-16", "2024-01-01", "2024-12-01", "2099-12-31"]
    q = _quarantine(store)
    outside = q.filter(pl.col("reason").str.starts_with("timestamp outside the plausible range"))
    assert outside.height == 8, q["reason"].to_list()
    assert set(outside["field"].to_list()) == {"TIMESTAMP", "timestamp/created", "timestamp"}
    assert any("9999-12-31 00:00:00.0000000 (read as 9999-12-31T00:00:00" in r for r in outside["reason"])
    assert any("2600-01-01" in r for r in outside["reason"])
    # A number too large to be any time is unparseable (it is not converted at all).
    assert q.filter(pl.col("raw").str.contains('"huge"'))["reason"][0].startswith("unparseable timestamp: ")


# --- 2. derived ids -----------------------------------------------------------------------------


def test_a_grown_log_without_ids_stores_only_its_new_records(tmp_path: Path) -> None:
    """A log without request ids (Azure) ingested at 5,000 lines and again after 1,000 more were
    appended stores 6,000 requests, not 11,000: a derived id comes from the record's content and
    its occurrence in the file, so the first 5,000 keep their ids and count as duplicates. A
    record repeated in the file is another request (its occurrence number differs)."""
    frame = generate(SynthConfig(requests=5999, seed=7, duration_s=3600))
    full = tmp_path / "full.csv"
    write_logs(frame, "azure", full)
    lines = full.read_text().splitlines(keepends=True)
    header, rows = lines[0], lines[1:]
    assert len(rows) == 5999
    log = tmp_path / "grow.csv"
    log.write_text(header + "".join(rows[:5000]))
    store = Store(tmp_path / "s")
    first = ingest_logs([log], store)
    _balanced(first)
    ids_before = dict(_all_rows(store).select("source_line", "request_id").iter_rows())
    assert first.total("rows_stored") == 5000

    log.write_text(header + "".join(rows) + rows[0])  # 999 new records, and the first one again
    second = ingest_logs([log], store)
    _balanced(second)
    assert second.ok
    assert (second.total("rows_read"), second.total("rows_stored"), second.total("rows_duplicate")) == (
        6000,
        1000,
        5000,
    )
    got = _all_rows(store)
    assert got.height == 6000 and got["request_id"].n_unique() == 6000
    first_lines = got.filter(pl.col("source_line") <= 5001)
    assert dict(first_lines.select("source_line", "request_id").iter_rows()) == ids_before
    repeated = got.filter(pl.col("source_line").is_in([2, 6001]))["request_id"].to_list()
    assert sorted(r.rsplit(":", 1)[1] for r in repeated) == ["0", "1"]
    assert all(r.startswith("azure:") for r in got["request_id"].to_list())


def test_derived_ids_do_not_depend_on_batches_or_reading_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The occurrence count runs across batches: the same file read in batches of 7 lines gives
    the ids it gives read whole."""
    from pipeline.ingest import readers, source

    text = "".join(f"2024-03-01 00:00:{i % 5:02d}.0000000,{10 + i % 3},5\n" for i in range(40))  # many repeats
    path = tmp_path / "rep.csv"
    path.write_text(AZURE_HEADER + "\n" + text)
    whole = Store(tmp_path / "a")
    s = ingest_logs([path], whole)
    _balanced(s)
    assert s.total("rows_stored") == 40
    monkeypatch.setattr(readers, "BATCH_LINES", 7)
    monkeypatch.setattr(source, "BATCH_LINES", 7)
    batched = Store(tmp_path / "b")
    s = ingest_logs([path], batched)
    _balanced(s)
    assert _digest(batched) == _digest(whole)


# --- 3. all rows quarantined, --force -----------------------------------------------------------


def test_a_file_read_with_the_wrong_format_fails_and_is_not_recorded(tmp_path: Path) -> None:
    """--format openai on an Azure CSV quarantines every row: the file fails (exit 1, one line
    naming it and the commonest reason) and is not recorded, so --format azure then ingests it.
    Its quarantine records are kept until then, and replaced by the correct read's."""
    path = _write(
        tmp_path / "azure.csv",
        [f"2023-11-16 18:15:{i:02d}.0000000,{100 + i},{10 + i}" for i in range(20)],
        AZURE_HEADER,
    )
    good = _write(tmp_path / "good.jsonl", GOOD_OPENAI)
    st = str(tmp_path / "s")
    res = _cli("ingest", str(path), str(good), "--format", "openai", "--store", st, "--json")
    assert res.exit_code == 1, res.output
    line = _one_error_line(res)
    assert str(path) in line and "all 21 rows quarantined" in line and "commonest reason" in line
    assert "21 of 21 rows" in line and "invalid JSON" in line and "not recorded" in line
    doc = json.loads(res.stdout)
    _balanced_json(doc)
    assert (doc["rows_read"], doc["rows_stored"], doc["rows_quarantined"]) == (24, 3, 21)
    store = Store(Path(st))
    assert str(path) not in _manifest(store)["source_file"].to_list()
    assert _quarantine(store).filter(pl.col("source_file") == str(path)).height == 21  # kept, to see why

    res = _cli("ingest", str(path), "--format", "azure", "--store", st, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    _balanced_json(doc)
    assert (doc["rows_read"], doc["rows_stored"], doc["rows_quarantined"]) == (20, 20, 0)
    assert _quarantine(store).filter(pl.col("source_file") == str(path)).height == 0  # the clean read replaced them
    assert str(path) in _manifest(store)["source_file"].to_list()


def test_a_relative_trace_with_an_implausible_date_fails_and_can_be_rerun(tmp_path: Path) -> None:
    """A relative-time trace anchored at an implausible --date has every row quarantined: it fails
    and is not recorded, so the re-run with the corrected --date ingests it."""
    path = tmp_path / "vidur.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(f"{i}.5,10,2\n" for i in range(30)))
    store = Store(tmp_path / "s")
    s = ingest_logs([path], store, date="1970-01-01")
    _balanced(s)
    assert (
        not s.ok and "all 30 rows quarantined" in s.errors[0] and "timestamp outside the plausible range" in s.errors[0]
    )
    assert "\n" not in s.errors[0] and not store.dates()
    s = ingest_logs([path], store, date="2024-05-01")
    _balanced(s)
    assert s.ok and s.total("rows_stored") == 30 and store.dates() == ["2024-05-01"]


@pytest.mark.parametrize("merge", ["memory", "out_of_core"])
def test_force_replaces_a_files_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merge: str) -> None:
    """--force re-reads a file already ingested and REPLACES its rows: a trace anchored at the
    wrong (plausible) --date moves to the right one, a log with ids is not doubled, and the
    manifest keeps one entry per file. Without --force the re-run is skipped. The same with the
    out-of-core (DuckDB) merge."""
    if merge == "out_of_core":
        monkeypatch.setattr(core, "STAGE_MEMORY_BYTES", 20_000)
    moon = _write(
        tmp_path / "moon.jsonl",
        [f'{{"timestamp": {i * 1000}, "input_length": {600 + i}, "output_length": 4}}' for i in range(50)],
    )
    other = tmp_path / "other.jsonl"
    write_logs(generate(SynthConfig(requests=300, seed=3, duration_s=3600)), "openai", other)
    store = Store(tmp_path / "s")
    s = ingest_logs([moon, other], store, date="2024-05-01")
    _balanced(s)
    before_other = _all_rows(store).filter(pl.col("source_file") == str(other))
    assert s.total("rows_stored") == 350

    again = ingest_logs([moon], store, date="2024-06-01")
    _balanced(again)
    assert again.files[0].skipped and "2024-06-01" not in store.dates()

    st = str(store.root)
    res = _cli("ingest", str(moon), str(other), "--force", "--date", "2024-06-01", "--store", st, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    _balanced_json(doc)
    assert (doc["rows_read"], doc["rows_stored"], doc["rows_duplicate"], doc["rows_replaced"]) == (350, 350, 0, 350)
    assert "replacing 350 rows stored before" in res.stderr
    rows = _all_rows(store)
    assert rows.height == 350
    assert rows.filter(pl.col("source_file") == str(moon))["arrival"].dt.date().cast(pl.String).unique().to_list() == [
        "2024-06-01"
    ]
    assert "2024-05-01" not in store.dates()  # the moved day is gone, not left empty
    assert rows.filter(pl.col("source_file") == str(other)).equals(before_other)
    man = _manifest(store)
    assert sorted(man["source_file"].to_list()) == sorted([str(moon), str(other)])


# --- 4. huge token counts, one crashing file ----------------------------------------------------


def test_implausible_token_counts_are_quarantined_and_good_files_survive(tmp_path: Path) -> None:
    """Counts at or past 2^63 used to crash the whole ingest in a polars cast (losing the good
    files of the same command) and 1e18 was accepted. Anything over MAX_TOKENS_PER_REQUEST is
    quarantined with a reason; MAX_TOKENS_PER_REQUEST itself is stored."""
    huge = _write(
        tmp_path / "huge.jsonl",
        [
            oa(id="max", usage_prompt_tokens=MAX_TOKENS_PER_REQUEST),
            oa(id="i63", usage_prompt_tokens=9223372036854775807),
            oa(id="e19", usage_completion_tokens=1e19),
            oa(id="e18", usage_prompt_tokens=10**18),
            oa(id="over", usage_prompt_tokens=MAX_TOKENS_PER_REQUEST + 1),
            oa(id="late", e2e_s=MAX_LATENCY_S * 2),
        ],
    )
    good = _write(tmp_path / "good.jsonl", GOOD_OPENAI)
    store = Store(tmp_path / "s")
    s = ingest_logs([huge, good], store)
    _balanced(s)
    assert s.ok, s.errors
    assert [(f.rows_stored, f.rows_quarantined) for f in s.files] == [(1, 5), (3, 0)]
    q = _quarantine(store)
    assert all("is implausibly large" in r for r in q["reason"].to_list()), q["reason"].to_list()
    assert q["field"].to_list() == [
        "usage.prompt_tokens",
        "usage.completion_tokens",
        "usage.prompt_tokens",
        "usage.prompt_tokens",
        "e2e_s",
    ]
    assert _all_rows(store)["recorded_input_tokens"].max() == MAX_TOKENS_PER_REQUEST


def test_a_crash_in_one_file_does_not_lose_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever goes wrong inside one file's read (here a polars error raised in its validation)
    fails that file with one line; the other files of the command are still ingested."""
    a = _write(tmp_path / "a.jsonl", GOOD_OPENAI)
    b = _write(tmp_path / "b.jsonl", [oa(id="b1"), oa(id="b2")])
    real = core.finalize

    def finalize(cand: pl.DataFrame, **kw: object) -> object:
        if str(kw["source_file"]).endswith("a.jsonl"):
            raise pl.exceptions.InvalidOperationError("conversion from `f64` to `i64` failed\nin column x")
        return real(cand, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(core, "finalize", finalize)
    st = str(tmp_path / "s")
    res = _cli("ingest", str(a), str(b), "--store", st, "--json")
    assert res.exit_code == 1
    line = _one_error_line(res)
    assert str(a) in line and "InvalidOperationError" in line
    doc = json.loads(res.stdout)
    _balanced_json(doc)
    assert doc["rows_stored"] == 2
    assert sorted(Store(Path(st)).read_requests()["request_id"].to_list()) == ["b1", "b2"]


# --- 5. a bad --date ----------------------------------------------------------------------------


@pytest.mark.parametrize("date", ["2023-13-45", "2023-02-30", "2024-13"])
def test_an_invalid_date_is_one_line(tmp_path: Path, date: str) -> None:
    good = _write(tmp_path / "good.jsonl", GOOD_OPENAI)
    res = _cli("ingest", str(good), "--date", date, "--store", str(tmp_path / "s"))
    assert res.exit_code == 1
    line = _one_error_line(res)
    assert f"date {date!r} is not YYYY-MM-DD" in line


# --- 6. FIFOs, a read-only store, a huge first record -------------------------------------------


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail (rather than hang the suite) if the block takes longer than ``seconds``."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A named pipe with no writer used to block ingest forever. Named, it is a one-line error;
    inside a folder it is skipped with a message and the folder's files are ingested."""
    fifo = tmp_path / "logs" / "pipe.jsonl"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    _write(tmp_path / "logs" / "good.jsonl", GOOD_OPENAI)
    st = str(tmp_path / "s")
    with _deadline(60):
        res = _cli("ingest", str(fifo), "--store", st)
        assert res.exit_code == 1
        line = _one_error_line(res)
        assert str(fifo) in line and "named pipe (FIFO), not a regular file" in line
        res = _cli("ingest", str(tmp_path / "logs"), "--store", st, "--json")
    assert res.exit_code == 0, res.output
    assert f"{fifo}: skipped: a named pipe (FIFO)" in res.stderr
    doc = json.loads(res.stdout)
    _balanced_json(doc)
    assert doc["rows_stored"] == 3


def test_a_read_only_store_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that cannot be written is a one-line error naming the path, and is left as it was:
    when the lock file cannot be opened, and when writing the new files fails midway."""
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([_write(tmp_path / "a.jsonl", GOOD_OPENAI)], store))
    before = _digest(store)
    new = _write(tmp_path / "b.jsonl", [oa(id="b1")])
    if os.geteuid() != 0:  # root writes through permission bits
        for p in [store.root, *store.root.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        try:
            res = _cli("ingest", str(new), "--store", str(store.root))
        finally:
            for p in [store.root, *store.root.rglob("*")]:
                p.chmod(p.stat().st_mode | 0o200)
        assert res.exit_code == 1 and str(store.root) in _one_error_line(res)

    real_open = Path.open

    def no_lock(self: Path, *args: object, **kw: object) -> object:
        if self.name == ".lock":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kw)  # type: ignore[call-overload]

    with monkeypatch.context() as m:
        m.setattr(Path, "open", no_lock)
        res = _cli("ingest", str(new), "--store", str(store.root))
    assert res.exit_code == 1
    assert _one_error_line(res) == f"error: {store.root / '.lock'}: cannot lock the store: Permission denied"

    def read_only(table: object, path: Path, name: str) -> Path:
        raise PermissionError(13, "Permission denied", str(path))

    with monkeypatch.context() as m:
        m.setattr(core, "write_parquet", read_only)
        res = _cli("ingest", str(new), "--store", str(store.root))
    assert res.exit_code == 1
    line = _one_error_line(res)
    assert "cannot write to the store: Permission denied" in line and str(store.root) in line
    assert _digest(store) == before and not store.staging_dir.exists()
    s = ingest_logs([new], store)  # and once writable, the same file ingests
    _balanced(s)
    assert s.total("rows_stored") == 1


def test_a_50_mb_first_record_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JSON Lines file whose first record is 50 MB used to be reported as "first record is not a
    JSON object". Detection reads on to the end of the first record (up to the longest record
    ingest reads at all); past that limit it says the record is too long to sniff, truthfully."""
    big = json.loads(_good_line(0))
    big["request"] = {"model": "m", "metadata": {"note": "x" * 50_000_000}}
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps(big) + "\n" + _good_line(1) + "\n")
    s = ingest_logs([path], Store(tmp_path / "s"))
    _balanced(s)
    assert s.ok, s.errors
    assert [(f.source_format, f.rows_stored) for f in s.files] == [("openai", 2)]

    monkeypatch.setattr(core, "SNIFF_MAX", 1 << 20)
    s = ingest_logs([path], Store(tmp_path / "s2"))
    assert not s.ok
    assert s.errors == [
        f"{path}: the first record is longer than the 1,048,576 bytes format detection reads; pass --format"
    ]
    s = ingest_logs([path], Store(tmp_path / "s3"), fmt="openai")
    _balanced(s)
    assert s.ok and s.total("rows_stored") == 2


# --- 7. killed runs -----------------------------------------------------------------------------


def _glob_count(store: Store) -> int:
    """Rows under requests/ as any reader's glob sees them (DuckDB matches hidden folders too)."""
    pattern = str(store.requests_dir / "*" / "*.parquet").replace("'", "''")
    return int(duckdb.sql(f"SELECT count(*) FROM read_parquet('{pattern}')").fetchall()[0][0])


def test_a_leftover_of_a_killed_partition_write_is_ignored_and_repaired(tmp_path: Path) -> None:
    """A run of the older layout killed while writing a partition left ``.date=D.new-…`` with a
    truncated file, which every glob reader then failed on ("No magic bytes found"). Store reads
    ignore it, and any command that opens the store (here ``rooftrace sql``) repairs it first."""
    logs = tmp_path / "a.jsonl"
    write_logs(generate(SynthConfig(requests=300, seed=4, duration_s=3600)), "openai", logs)
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([logs], store))
    (d,) = store.dates()
    part = store.requests_dir / f"date={d}" / "part-00000.parquet"
    leftover = store.requests_dir / f".date={d}.new-20250101T000000-000001"
    leftover.mkdir()
    (leftover / "part-00000.parquet").write_bytes(part.read_bytes()[:1000])
    with pytest.raises(duckdb.Error):
        _glob_count(store)
    assert store.read_requests().height == 300  # the store's own reader never looks there
    res = _cli("sql", "SELECT count(*) AS n FROM requests", "--store", str(store.root), "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == [{"n": 300}]
    assert not leftover.exists() and _glob_count(store) == 300


_KILL = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import pipeline.ingest.core as core
    import pipeline.ingest.store as store_mod
    from pipeline.ingest import ingest_logs
    from pipeline.ingest.store import Store

    where, store, log = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if where == "write":  # half-way through writing a partition file
        def write(rows, target):
            target.write_bytes(b"PAR1" + b"x" * 500)
            os.kill(os.getpid(), signal.SIGKILL)
        core._write_requests = write
    else:  # just after the commit point (the journal's rename), before any file is moved
        real = os.replace
        def replace(src, dst):
            real(src, dst)
            if Path(dst).name == store_mod.JOURNAL:
                os.kill(os.getpid(), signal.SIGKILL)
        os.replace = replace
    ingest_logs([log], Store(store))
    """
)


@pytest.mark.parametrize("where", ["write", "commit"])
def test_a_run_killed_at_any_point_leaves_a_readable_store(tmp_path: Path, where: str) -> None:
    """kill -9 while a partition file is being written: readers see the store as it was (the half
    file is in STORE/.staging, which no glob reads) and the next run removes it. kill -9 just
    after the commit point: readers still see a whole store, and the next command that opens it
    finishes the commit (all the run's partitions and its manifest entry, so a re-run skips the
    file)."""
    logs = tmp_path / "logs"
    write_logs(generate(SynthConfig(requests=200, seed=5, duration_s=3600)), "openai", logs / "a.jsonl")
    write_logs(generate(SynthConfig(requests=500, seed=6, duration_s=2 * 86400)), "openai", logs / "b.jsonl")
    store = Store(tmp_path / "s")
    _balanced(ingest_logs([logs / "a.jsonl"], store))
    before = _digest(store)
    proc = subprocess.run(
        [sys.executable, "-c", _KILL, where, str(store.root), str(logs / "b.jsonl")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert store.staging_dir.exists(), "the killed run left its staging folder"
    assert _digest(store) == before and _glob_count(store) == 200  # nothing partial is visible
    assert sum(store.read_requests(d).height for d in store.dates()) == 200

    open_store(store.root)  # any command opening the store repairs it
    assert not store.staging_dir.exists()
    if where == "write":
        assert _digest(store) == before
        s = ingest_logs([logs / "b.jsonl"], store)
        _balanced(s)
        assert s.total("rows_stored") == 500
    else:
        assert _glob_count(store) == 700
        assert str(logs / "b.jsonl") in _manifest(store)["source_file"].to_list()
        s = ingest_logs([logs / "b.jsonl"], store)
        _balanced(s)
        assert s.files[0].skipped
    assert _glob_count(store) == 700 and sum(store.read_requests(d).height for d in store.dates()) == 700


def test_a_folder_says_every_file_it_passes_over(tmp_path: Path) -> None:
    """Ingesting a folder used to pass over rotated logs (app.log.1), other names, links to
    folders and unreadable folders without a word, and to exit 0 having read nothing. Now rotated
    names are read, links to folders followed (each folder once), every file passed over is named
    on stderr, and a folder with no log file is a one-line error."""
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    _write(logs / "app.log.1", [oa(id="a1")])
    _write(logs / "sub" / "day.jsonl.2", [oa(id="a2")])
    _write(logs / "notes.txt", [oa(id="a3")])
    (tmp_path / "elsewhere").mkdir()
    _write(tmp_path / "elsewhere" / "x.jsonl", [oa(id="a4")])
    (logs / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (logs / "sub" / "loop").symlink_to(logs, target_is_directory=True)
    (logs / ".hidden.jsonl").write_text(oa(id="h") + "\n")
    res = _cli("ingest", str(logs), "--store", str(tmp_path / "s"), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    _balanced_json(doc)
    read = sorted(Path(f["source_file"]).name for f in doc["files"])
    assert read == ["app.log.1", "day.jsonl.2", "x.jsonl"], read
    assert f"{logs / 'notes.txt'}: skipped: not a log file name" in res.stderr
    assert f"{logs / 'sub' / 'loop'}: skipped: a link to a folder read under another name" in res.stderr
    assert "hidden" not in res.stderr  # hidden names stay out, as before

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("hello\n")
    res = _cli("ingest", str(empty), "--store", str(tmp_path / "s2"))
    assert res.exit_code == 1
    line = _one_error_line(res)
    assert f"{empty}: no log files in this folder (1 other file(s) skipped" in line, line


def test_csv_rows_of_empty_fields_are_quarantined_and_records_keep_their_first_line(tmp_path: Path) -> None:
    """A ``,,`` row was neither stored nor quarantined (rows in != stored + quarantined); a record
    whose quoted field spans lines was reported at its last line."""
    log = tmp_path / "d.csv"
    log.write_text(
        f"{CSV_HEADER}\n"
        "r1,2025-01-15T04:24:00Z,m,t,s,10,5,0,0\n"
        ",,\n"
        "\n"  # a blank line is no record, as in JSON Lines
        "   \n"  # nor is a line of spaces
        ",,,,,,,,\n"
        'r2,2025-01-15T04:25:00Z,m,"two\nlines",s,10\n'
        'r3,2025-01-15T04:26:00Z,m,"a\nb",s,10,5,0,0\n'
    )
    (tmp_path / "m.toml").write_text(CSV_MAPPING)
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store, fmt="csv", mapping=tmp_path / "m.toml")
    _balanced(s)
    f = s.files[0]
    assert (f.rows_read, f.rows_stored, f.rows_quarantined) == (5, 2, 3)
    q = read_parquet(next(store.quarantine_dir.glob("*.parquet")), "quarantine")
    got = sorted(zip(q["source_line"].to_pylist(), q["reason"].to_pylist(), strict=True))
    assert got == [(3, "every field is empty"), (6, "every field is empty"), (7, "expected 9 fields, found 6")]
    assert store.read_requests("2025-01-15")["tenant"].to_list() == ["t", "a\nb"]


def test_an_openai_timestamp_that_cannot_be_read_is_not_replaced_by_created(tmp_path: Path) -> None:
    """A logged pair whose own ``timestamp`` is there but unreadable used to be stored at the
    response's ``created`` second: it is quarantined, naming the value; a pair without one still
    takes ``created``."""
    usage = '"usage": {{"prompt_tokens": 5, "completion_tokens": 3}}'
    pair = '{{"timestamp": {ts}"response": {{"id": "{id}", "created": 1736915040, "model": "m", ' + usage + "}}}}"
    lines = [
        pair.format(ts='"2025-02-30T00:00:00Z", ', id="a"),
        pair.format(ts='"garbage", ', id="b"),
        pair.format(ts="", id="c").replace('"timestamp": ', ""),
        pair.format(ts='"2025-01-15T04:24:00.5Z", ', id="d"),
    ]
    log = _write(tmp_path / "p.jsonl", lines)
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store)
    _balanced(s)
    q = read_parquet(next(store.quarantine_dir.glob("*.parquet")), "quarantine")
    assert sorted(q["reason"].to_pylist()) == [
        "unparseable timestamp: 2025-02-30T00:00:00Z",
        "unparseable timestamp: garbage",
    ]
    stored = store.read_requests("2025-01-15")
    assert stored["request_id"].to_list() == ["c", "d"]


def test_mapped_keys_with_quotes_are_data_not_sql(tmp_path: Path) -> None:
    """Mapped JSON keys were pasted into DuckDB's SQL: ``it's model`` quarantined every row as a
    parser error, and a key could carry SQL. Keys are quoted now, whatever they hold."""
    log = tmp_path / "m.jsonl"
    log.write_text(
        '{"ts": "2025-01-15T04:24:00Z", "it\'s model": "m1", "q\\"uote": "t1", "in": 10, "out": 5}\n'
        '{"ts": "2025-01-15T04:25:00Z", "it\'s model": "m2", "q\\"uote": "t2", "in": 11, "out": 6}\n'
    )
    mapping = tmp_path / "m.toml"
    mapping.write_text(
        'format = "jsonl"\ntime_unit = "iso"\n[fields]\narrival = "ts"\nmodel = "it\'s model"\n'
        'tenant = \'q"uote\'\nrecorded_input_tokens = "in"\noutput_tokens = "out"\n'
    )
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store, fmt="jsonl", mapping=mapping)
    _balanced(s)
    assert s.files[0].rows_stored == 2
    rows = store.read_requests("2025-01-15")
    assert rows["model"].to_list() == ["m1", "m2"] and rows["tenant"].to_list() == ["t1", "t2"]


def test_other_compressions_and_link_loops_say_what_they_are(tmp_path: Path) -> None:
    """A .bz2 file was "binary file (NUL bytes)" and a loop of links "no such file or directory"."""
    import bz2

    log = tmp_path / "d.jsonl.bz2"
    log.write_bytes(bz2.compress(("\n".join(GOOD_OPENAI) + "\n").encode()))
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for src, needle in ((log, "compressed with bzip2, which ingest does not read"), (tmp_path / "a", "symbolic links")):
        res = _cli("ingest", str(src), "--store", str(tmp_path / "s"))
        assert res.exit_code == 1
        assert needle in _one_error_line(res)


def test_a_negative_offset_from_the_trace_start_is_quarantined(tmp_path: Path) -> None:
    """A Vidur row at -5 s landed on the day before --date; it is quarantined, saying why."""
    log = tmp_path / "v.csv"
    log.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n-5.0,100,10\n0.5,100,10\n")
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store, fmt="vidur", date="2025-01-15")
    _balanced(s)
    assert store.dates() == ["2025-01-15"] and s.files[0].rows_stored == 1
    q = read_parquet(next(store.quarantine_dir.glob("*.parquet")), "quarantine")
    assert q["reason"].to_pylist() == ["negative timestamp: -5.0"] and q["source_line"].to_pylist() == [2]


def test_a_mapped_column_no_record_has_is_said(tmp_path: Path) -> None:
    """A typo in a JSONL mapping (model = "modle") made every row's model "unknown" in silence;
    the file's read line is now followed by a warning naming the column."""
    log = tmp_path / "m.jsonl"
    log.write_text('{"ts": "2025-01-15T04:24:00Z", "model": "m1", "in": 10, "out": 5}\n')
    mapping = tmp_path / "m.toml"
    mapping.write_text(
        'format = "jsonl"\ntime_unit = "iso"\n[fields]\narrival = "ts"\nmodel = "modle"\n'
        'recorded_input_tokens = "in"\noutput_tokens = "out"\n'
    )
    said: list[str] = []
    s = ingest_logs([log], Store(tmp_path / "s"), fmt="jsonl", mapping=mapping, progress=said.append)
    _balanced(s)
    assert f"warning: {log}: the mapping's column 'modle' has no value in any record (check its spelling)" in said
    assert not [m for m in said if "'in'" in m or "'ts'" in m]  # the columns that are there: no warning


def test_a_link_never_hides_its_folders_real_name(tmp_path: Path) -> None:
    """``current -> 2025-01-15`` beside the real folder: the real folder's files are read under
    its own name, in the order of a walk without links, and the link is said to be skipped."""
    logs = tmp_path / "logs"
    (logs / "2025-01-15").mkdir(parents=True)
    _write(logs / "2025-01-15" / "app.log", [oa(id="a1")])
    _write(logs / "b.log", [oa(id="b1")])
    (logs / "current").symlink_to(logs / "2025-01-15", target_is_directory=True)
    said: list[str] = []
    s = ingest_logs([logs], Store(tmp_path / "s"), progress=said.append)
    _balanced(s)
    assert [f.source_file for f in s.files] == [str(logs / "2025-01-15" / "app.log"), str(logs / "b.log")]
    assert f"{logs / 'current'}: skipped: a link to a folder read under another name" in said


@pytest.mark.parametrize("raised", ["interrupt", "runtime"])
def test_ctrl_c_inside_duckdb_stops_the_run_not_one_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: str
) -> None:
    """A Ctrl-C that reached DuckDB while it read a file came back as "cannot ingest
    (RuntimeError: Query interrupted)": that file failed and the others were committed, exit 1.
    It now stops the run: exit 130, nothing committed."""
    a = _write(tmp_path / "a.jsonl", [oa(id="a1")])
    b = _write(tmp_path / "b.jsonl", [oa(id="b1")])
    real = core._stage_file

    def stage(path: Path, *args: object, **kwargs: object) -> object:
        if path == a:
            raise (
                duckdb.InterruptException("INTERRUPT Error: Interrupted!")
                if raised == "interrupt"
                else RuntimeError("Query interrupted")
            )
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(core, "_stage_file", stage)
    res = _cli("ingest", str(a), str(b), "--store", str(tmp_path / "s"))
    assert res.exit_code == 130, res.output
    assert res.stderr.strip().splitlines()[-1] == "interrupted (Ctrl-C)"
    assert not (tmp_path / "s" / "requests").exists()


def test_ctrl_c_inside_duckdbs_jsonl_read_is_not_a_quarantine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the JSON Lines readers themselves: an interrupt raised by DuckDB's query became a
    fast-path failure and then quarantined rows ("all 5 rows quarantined … INTERRUPT Error"). It
    stops the run: exit 130, nothing stored."""
    from pipeline.ingest import readers

    log = _write(tmp_path / "a.jsonl", [oa(id=f"a{i}") for i in range(5)])
    real = readers.duck_connect

    class Interrupting:
        def __init__(self, con: object) -> None:
            self.con = con

        def sql(self, *args: object, **kwargs: object) -> object:
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

        def __getattr__(self, name: str) -> object:
            return getattr(self.con, name)

    monkeypatch.setattr(readers, "duck_connect", lambda *a, **k: Interrupting(real(*a, **k)))
    res = _cli("ingest", str(log), "--store", str(tmp_path / "s"))
    assert res.exit_code == 130, res.output
    assert "quarantined" not in res.stderr and not (tmp_path / "s" / "requests").exists()
