"""Parallel ingest (``--jobs``): files read in worker processes, the store byte-identical to a
serial run's, with the same per-file accounting, quarantine and manifest."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import shutil
from pathlib import Path

import polars as pl
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.common.errors import RooftraceError
from pipeline.ingest import core, ingest_logs
from pipeline.ingest.store import Store
from pipeline.synth import SynthConfig, generate, write_logs


def _files(store: Store) -> dict[str, str]:
    """Every stored Parquet file's bytes (requests partitions), by path in the store."""
    return {
        str(p.relative_to(store.root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.requests_dir.rglob("*.parquet"))
    }


def _table(path: Path) -> pl.DataFrame:
    """A manifest or quarantine table without its wall-clock column, in a stable order."""
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    frame = pl.concat([pl.read_parquet(f) for f in files]) if files else pl.DataFrame()
    return frame.drop("ingested_at").sort(frame.drop("ingested_at").columns) if frame.height else frame


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files of several kinds: two formats, duplicates across files, a copy of a file under
    another name, bad lines, a file whose every row is bad, a file listed twice."""
    root = tmp_path_factory.mktemp("logs")
    write_logs(generate(SynthConfig(requests=1500, seed=5, duration_s=2 * 86400)), "openai", root / "a.jsonl")
    write_logs(generate(SynthConfig(requests=700, seed=6, duration_s=7200)), "azure", root / "b.csv")
    write_logs(generate(SynthConfig(requests=600, seed=7, duration_s=7200)), "anthropic", root / "c.jsonl")
    lines = (root / "a.jsonl").read_text().splitlines(keepends=True)
    (root / "d.jsonl").write_text("".join(lines[:200]) + "{not json\n" + '{"timestamp": 5}\n')  # repeats a.jsonl
    shutil.copy(root / "c.jsonl", root / "e-copy.jsonl")  # same content, another name
    (root / "f-bad.jsonl").write_text('{"x": 1}\n{"y": 2}\n')  # every row quarantined: fails
    write_logs(generate(SynthConfig(requests=400, seed=8, duration_s=7200)), "openai", root / "g.jsonl")
    (root / "g.jsonl.gz").write_bytes(gzip.compress((root / "g.jsonl").read_bytes()))
    (root / "g.jsonl").unlink()
    return root


def _ingest(store: Store, logs: Path, jobs: int) -> list[dict[str, object]]:
    said: list[str] = []
    summary = ingest_logs([logs, logs / "a.jsonl"], store, progress=said.append, jobs=jobs)
    files = summary.to_json()["files"]
    assert isinstance(files, list)
    for f in files:  # rows in = stored + quarantined + duplicates, per file
        assert f["rows_read"] == f["rows_stored"] + f["rows_quarantined"] + f["rows_duplicate"], f
    return [{**f, "said": [s for s in said if f["source_file"] in s]} for f in files]


def test_parallel_ingest_equals_serial_byte_for_byte(logs: Path, tmp_path: Path) -> None:
    serial, parallel = Store(tmp_path / "serial"), Store(tmp_path / "parallel")
    one = _ingest(serial, logs, jobs=1)
    two = _ingest(parallel, logs, jobs=2)
    assert one == two  # per-file accounting, errors, skips and what was said, in file order
    by_name = {Path(str(f["source_file"])).name: f for f in one}
    assert by_name["e-copy.jsonl"]["skipped"] is True  # the same content as c.jsonl, read earlier
    assert by_name["d.jsonl"]["rows_duplicate"] == 200 and by_name["d.jsonl"]["rows_quarantined"] == 2
    assert by_name["f-bad.jsonl"]["error"] and sum(1 for f in one if f["error"]) == 1
    assert [f["skipped"] for f in one].count(True) == 2  # and a.jsonl, listed twice
    assert _files(parallel) == _files(serial) and _files(serial)
    assert _table(parallel.quarantine_dir).equals(_table(serial.quarantine_dir))
    assert _table(parallel.manifest_path).equals(_table(serial.manifest_path))
    assert not (parallel.root / ".staging").exists()
    # a re-run is idempotent in both modes
    again = ingest_logs([logs], parallel, jobs=2)
    assert again.total("rows_read") == 0 and _files(parallel) == _files(serial)


def test_parallel_ingest_spilling_and_into_a_stored_date(
    logs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a tiny staging memory (the spill path and the out-of-core merge) and a date already
    stored, parallel and serial still write the same bytes."""
    monkeypatch.setattr(core, "STAGE_MEMORY_BYTES", 60_000)
    stores = []
    for jobs in (1, 2):
        store = Store(tmp_path / f"j{jobs}")
        ingest_logs([logs / "b.csv"], store)
        ingest_logs([logs / "a.jsonl", logs / "c.jsonl", logs / "d.jsonl"], store, jobs=jobs)
        stores.append(store)
    assert _files(stores[0]) == _files(stores[1])


def test_jobs_out_of_range_is_one_error(tmp_path: Path, logs: Path) -> None:
    with pytest.raises(RooftraceError, match=r"--jobs must be in 1\.\.256"):
        ingest_logs([logs], Store(tmp_path / "s"), jobs=0)
    from click.testing import CliRunner

    from pipeline.cli import main

    res = CliRunner().invoke(main, ["ingest", str(logs), "--jobs", "100000", "--store", str(tmp_path / "s")])
    assert res.exit_code == 2 and "--jobs" in res.output


def _anonymous_log(path: Path, requests: int, seed: int) -> list[str]:
    """An OpenAI-style log whose records mostly carry no id (derived ids), with identical records
    repeated far apart (occurrence numbers that span pieces) and a field-level bad record."""
    src = path.with_suffix(".src")
    write_logs(generate(SynthConfig(requests=requests, seed=seed, duration_s=3 * 3600)), "openai", src)
    lines = src.read_text().splitlines()
    src.unlink()
    out = []
    for i, line in enumerate(lines):
        if i % 5:
            line = line.replace('"id":"chatcmpl-', '"idx":"chatcmpl-')  # no id: derived
        out.append(line)
        if i % 97 == 3:
            out.append(out[i // 2])  # an earlier record again, identical
    out.insert(len(out) // 3, out[5].replace('"prompt_tokens":', '"prompt_tokens":-').replace('"idx"', '"id"'))
    path.write_text("\n".join(out) + "\n")
    return out


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("split") / "day.jsonl"
    _anonymous_log(path, 1800, seed=21)
    return path


def _split_small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "SPLIT_MIN_BYTES", 1)
    monkeypatch.setattr(core, "PIECE_BYTES", 60_000)


def test_one_large_file_split_across_workers_equals_serial(
    big_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One JSON Lines file read as pieces cut at line boundaries: line numbers, derived ids (their
    occurrence numbers counted from the file's start), quarantine and accounting as one read."""
    _split_small(monkeypatch)
    plan = core._split_plan(big_log, False, None, None, core.Context(None), 2)
    assert plan is not None and len(plan) >= 8  # really split, into pieces of ~60 kB
    serial, parallel = Store(tmp_path / "serial"), Store(tmp_path / "parallel")
    one = _ingest_one(serial, big_log, jobs=1)
    two = _ingest_one(parallel, big_log, jobs=2)
    assert one == two
    # a repeat of a record with an id is a duplicate; one without gets the next occurrence number
    assert one[0]["rows_quarantined"] == 1 and one[0]["rows_duplicate"] > 0
    assert _files(parallel) == _files(serial) and _files(serial)
    assert _table(parallel.quarantine_dir).equals(_table(serial.quarantine_dir))
    assert _table(parallel.manifest_path).equals(_table(serial.manifest_path))
    stored = pl.concat([pl.read_parquet(p) for p in sorted(serial.requests_dir.rglob("*.parquet"))])
    occ = stored["request_id"].str.extract(r":(\d+)$").cast(pl.Int64)
    assert occ.max() >= 1  # repeated records got occurrence numbers past 0
    assert stored["request_id"].n_unique() == stored.height
    assert not (parallel.root / ".staging").exists()


def test_a_split_file_with_a_line_the_fast_path_cannot_read(
    big_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A piece with a broken line: the whole file is read again as a serial run reads it (the
    robust path), so the result is still the serial one."""
    _split_small(monkeypatch)
    lines = big_log.read_text().splitlines(keepends=True)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(lines[: len(lines) * 2 // 3]) + "{not json\n" + "".join(lines[len(lines) * 2 // 3 :]))
    serial, parallel = Store(tmp_path / "serial"), Store(tmp_path / "parallel")
    one, two = _ingest_one(serial, broken, jobs=1), _ingest_one(parallel, broken, jobs=2)
    assert one == two and one[0]["rows_quarantined"] == 2
    assert _files(parallel) == _files(serial)
    assert _table(parallel.quarantine_dir).equals(_table(serial.quarantine_dir))


def _ingest_one(store: Store, path: Path, jobs: int) -> list[dict[str, object]]:
    said: list[str] = []
    summary = ingest_logs([path], store, progress=said.append, jobs=jobs)
    files = summary.to_json()["files"]
    assert isinstance(files, list)
    for f in files:
        assert f["rows_read"] == f["rows_stored"] + f["rows_quarantined"] + f["rows_duplicate"], f
    return [{**f, "said": [s for s in said if f["source_file"] in s]} for f in files]


@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=40),
    last_newline=st.booleans(),
    pieces=st.integers(1, 12),
)
@settings(max_examples=200, deadline=None)
def test_line_cuts_cut_after_newlines(lines: list[bytes], last_newline: bool, pieces: int) -> None:
    import tempfile

    data = b"\n".join(lines) + (b"\n" if last_newline else b"")
    assume(data)  # an empty file is never split
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.jsonl"
        path.write_bytes(data)
        cuts = core.line_cuts(path, len(data), pieces)
    assert cuts[0] == 0 and cuts[-1] == len(data)
    assert all(a < b for a, b in itertools.pairwise(cuts))
    assert len(cuts) - 1 <= max(pieces, 1)
    assert all(data[c - 1 : c] == b"\n" for c in cuts[1:-1])  # every inner cut follows a newline
    pieces_text = [data[a:b] for a, b in itertools.pairwise(cuts)]
    assert b"".join(pieces_text) == data


def test_the_serial_lookahead_changes_nothing(logs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A serial run has DuckDB parse the next small JSON Lines file while it normalises this one
    (core._Lookahead). Over files of several formats, bad lines, a copy of a file (skipped once
    parsed), a file whose every row is bad and a file named twice, it gives the same store,
    per-file accounting, progress lines, quarantine and manifest as a run without it. The early
    readers are used, and none is left running."""
    import threading

    took: list[bool] = []
    took_by: list[str] = []
    next_after = core._Lookahead.next_after

    def spy(self: core._Lookahead, k: int) -> object:
        take = next_after(self, k)

        def wrapped(spec: object) -> object:
            got = take(spec)  # type: ignore[arg-type]
            took.append(got is not None)
            if got is not None:
                took_by.append(self.paths[k].name)
            return got

        return wrapped

    monkeypatch.setattr(core._Lookahead, "next_after", spy)
    ahead = Store(tmp_path / "ahead")
    with_it = _ingest(ahead, logs, jobs=1)
    assert took.count(True) >= 4  # c.jsonl, d.jsonl, e-copy.jsonl, f-bad.jsonl follow another file
    assert "g.jsonl.gz" in took_by  # a compressed file is read ahead too (one DuckDB thread reads it)
    assert not [t for t in threading.enumerate() if t.name == "rooftrace-prefetch"]
    monkeypatch.setattr(core._Lookahead, "_start", lambda self, k: None)
    plain = Store(tmp_path / "plain")
    assert _ingest(plain, logs, jobs=1) == with_it
    assert _files(ahead) == _files(plain) and _files(plain)
    assert _table(ahead.quarantine_dir).equals(_table(plain.quarantine_dir))
    assert _table(ahead.manifest_path).equals(_table(plain.manifest_path))


def test_no_reader_thread_outlives_its_file(logs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader (DuckDB on its prefetch thread) stops when its consumer does, here when the run
    stops in the second file while the third is read ahead (a dropped reader:
    test_ingest_store's prefetch test). A reader still inside DuckDB when the interpreter exits aborts the process
    (Ctrl-C used to end an ingest of many small files with 'terminate called', rc -6)."""
    import threading

    def live() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "rooftrace-prefetch")

    before = live()

    calls = {"n": 0}
    stage_batch = core._stage_batch

    def failing(*args: object, **kw: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:  # the second file's first batch
            raise KeyboardInterrupt
        return stage_batch(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(core, "_stage_batch", failing)
    names = ["a.jsonl", "c.jsonl", "d.jsonl", "e-copy.jsonl"]
    with pytest.raises(KeyboardInterrupt):
        ingest_logs([logs / n for n in names], Store(tmp_path / "s"))
    assert live() == before
