"""Real traces with exact counts, idempotence, atomic partition swaps, and a hypothesis round trip."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline.ingest.core as core
from pipeline.common.errors import RooftraceError
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.synth import SynthConfig, generate, write_logs
from tests.conftest import shared_path


def _csv_sums(path: Path, cols: tuple[str, str]) -> tuple[int, int, int]:
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    return len(rows), sum(int(r[cols[0]]) for r in rows), sum(int(r[cols[1]]) for r in rows)


@pytest.mark.parametrize(
    ("folder", "name", "rows"),
    [
        ("azure-llm-inference-2023", "AzureLLMInferenceTrace_code.csv", 8819),
        ("azure-llm-inference-2023", "AzureLLMInferenceTrace_conv.csv", 19366),
        ("vidur-processed-traces", "splitwise_code.csv", 8819),
        ("vidur-processed-traces", "splitwise_conv.csv", 19366),
        ("vidur-processed-traces", "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", 28257),
    ],
)
def test_real_csv_traces_exact(tmp_path: Path, folder: str, name: str, rows: int) -> None:
    path = shared_path("traces", folder, name)
    store = Store(tmp_path / "s")
    s = ingest_logs([path], store, date="2024-05-01")
    assert s.ok and s.total("rows_read") == rows and s.total("rows_stored") == rows
    got = pl.concat([store.read_requests(d) for d in store.dates()])
    cols = (
        ("ContextTokens", "GeneratedTokens")
        if folder.startswith("azure")
        else ("num_prefill_tokens", "num_decode_tokens")
    )
    n, inp, out = _csv_sums(path, cols)
    assert (got.height, got["recorded_input_tokens"].sum(), got["output_tokens"].sum()) == (n, inp, out)


def test_azure_conv_first_row_and_span(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    ingest_logs([shared_path("traces", "azure-llm-inference-2023", "AzureLLMInferenceTrace_conv.csv")], store)
    df = store.read_requests("2023-11-16")
    first = df.row(0, named=True)
    # First data row: 2023-11-16 18:15:46.6805900,374,44 (7 fractional digits truncated to µs).
    assert first["arrival"] == datetime(2023, 11, 16, 18, 15, 46, 680590, tzinfo=UTC)
    assert (first["recorded_input_tokens"], first["output_tokens"], first["source_line"]) == (374, 44, 2)
    # Last row: 2023-11-16 19:14:08.4025270,197,183
    last = df.row(df.height - 1, named=True)
    assert last["arrival"] == datetime(2023, 11, 16, 19, 14, 8, 402527, tzinfo=UTC)
    assert (last["recorded_input_tokens"], last["output_tokens"]) == (197, 183)


@pytest.mark.parametrize(("name", "rows"), [("conversation_trace.jsonl", 12031), ("synthetic_trace.jsonl", 3993)])
def test_real_mooncake_exact(tmp_path: Path, name: str, rows: int) -> None:
    path = shared_path("traces", "mooncake-fast25", name)
    store = Store(tmp_path / "s")
    s = ingest_logs([path], store, date="2024-05-01")
    assert s.ok and s.total("rows_stored") == rows
    got = store.read_requests("2024-05-01").sort("source_line")
    with path.open() as fh:
        recs = [json.loads(line) for line in fh]
    assert got["recorded_input_tokens"].to_list() == [r["input_length"] for r in recs]
    assert got["prefix_block_hashes"].to_list() == [r["hash_ids"] for r in recs]
    assert set(got["prefix_block_size"].to_list()) == {512}
    base = datetime(2024, 5, 1, tzinfo=UTC)
    assert got["arrival"].to_list() == [base + timedelta(milliseconds=r["timestamp"]) for r in recs]


def _digest(store: Store) -> dict[str, str]:
    out = {}
    for p in sorted(store.requests_dir.rglob("*.parquet")):
        out[str(p.relative_to(store.root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_ingest_twice_is_identical_and_independent_of_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs"
    write_logs(generate(SynthConfig(requests=3000, seed=5, duration_s=7200)), "openai", logs / "day.jsonl")
    write_logs(generate(SynthConfig(requests=500, seed=6, duration_s=7200)), "azure", logs / "az.csv")
    a = Store(tmp_path / "a")
    s1 = ingest_logs([logs], a)
    before = _digest(a)
    s2 = ingest_logs([logs], a)
    assert _digest(a) == before
    assert s1.total("rows_stored") == 3500 and s2.total("rows_read") == 0
    assert all(f.skipped for f in s2.files)
    b = Store(tmp_path / "b")
    monkeypatch.setattr(core, "STAGE_MEMORY_BYTES", 100_000)  # exercise the spill-to-disk staging path
    ingest_logs([logs], b)
    assert _digest(b) == before, "same input, same Parquet bytes"


def test_failed_write_leaves_previous_store_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs"
    write_logs(generate(SynthConfig(requests=400, seed=1, duration_s=3600)), "openai", logs / "a.jsonl")
    store = Store(tmp_path / "s")
    ingest_logs([logs / "a.jsonl"], store)
    before = _digest(store)
    write_logs(generate(SynthConfig(requests=400, seed=2, duration_s=3600)), "openai", logs / "b.jsonl")

    def boom(*args: object, **kw: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(core, "_stage_partition", boom)
    with pytest.raises(RooftraceError, match="cannot write to the store: disk full"):
        ingest_logs([logs / "b.jsonl"], store)
    assert _digest(store) == before
    assert not store.staging_dir.exists(), "a failed run leaves no staging behind"
    monkeypatch.undo()
    s = ingest_logs([logs / "b.jsonl"], store)
    assert s.total("rows_stored") == 400 and store.read_requests().height == 800


def test_interrupted_swap_is_repaired(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_logs(generate(SynthConfig(requests=300, seed=3, duration_s=3600)), "openai", logs / "a.jsonl")
    store = Store(tmp_path / "s")
    ingest_logs([logs / "a.jsonl"], store)
    (d,) = store.dates()
    final = store.requests_dir / f"date={d}"
    # A run killed between "rename old away" and "rename new in".
    final.rename(store.requests_dir / f".date={d}.old-killed")
    (store.requests_dir / f".date={d}.new-killed").mkdir()
    ingest_logs([], store)
    assert store.dates() == [d] and store.read_requests().height == 300
    assert [p.name for p in store.requests_dir.iterdir()] == [f"date={d}"]


_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
_record = st.fixed_dictionaries(
    {
        "prompt": st.integers(0, 2_000_000),
        "output": st.integers(0, 100_000),
        "cached_frac": st.floats(0, 1),
        "offset_us": st.integers(0, 86_400_000_000 - 1),
        "tenant": st.one_of(st.none(), st.text(min_size=1, max_size=10)),
        "shape": st.sampled_from(["chat", "responses", "batch", "pair"]),
    }
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.tuples(_ids, _record), min_size=1, max_size=40, unique_by=lambda r: r[0]))
def test_hypothesis_round_trip(
    tmp_path_factory: pytest.TempPathFactory, records: list[tuple[str, dict[str, object]]]
) -> None:
    tmp = tmp_path_factory.mktemp("rt")
    base = datetime(2024, 12, 1, tzinfo=UTC)
    lines = []
    expect = {}
    for rid, r in records:
        prompt, output = int(r["prompt"]), int(r["output"])  # type: ignore[call-overload]
        cached = int(prompt * float(r["cached_frac"]))  # type: ignore[arg-type]
        when = base + timedelta(microseconds=int(r["offset_us"]))  # type: ignore[call-overload]
        ts = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        body = {
            "id": rid,
            "object": "chat.completion",
            "created": int(when.timestamp()),
            "model": "m",
            "usage": usage,
        }
        shape = r["shape"]
        if shape == "chat":
            rec: dict[str, object] = {**body, "timestamp": ts}
        elif shape == "responses":
            rec = {
                "id": rid,
                "object": "response",
                "created_at": int(when.timestamp()),
                "model": "m",
                "timestamp": ts,
                "usage": {
                    "input_tokens": prompt,
                    "output_tokens": output,
                    "input_tokens_details": {"cached_tokens": cached},
                },
            }
        elif shape == "batch":
            rec = {
                "id": f"batch_{rid}",
                "custom_id": rid,
                "timestamp": ts,
                "response": {"status_code": 200, "body": body},
            }
        else:
            rec = {"timestamp": ts, "request": {"model": "m", "user": r["tenant"]}, "response": body}
        lines.append(json.dumps(rec))
        expect[rid] = (when, prompt, cached, output, r["tenant"] if shape == "pair" else None)
    src = tmp / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    store = Store(tmp / "store")
    s = ingest_logs([src], store)
    assert s.ok and s.total("rows_read") == len(records)
    assert s.total("rows_stored") + s.total("rows_quarantined") + s.total("rows_duplicate") == len(records)
    assert s.total("rows_stored") == len(records)
    got = pl.concat([store.read_requests(d) for d in store.dates()])
    seen = {
        row["request_id"]: (
            row["arrival"],
            row["recorded_input_tokens"],
            row["reported_cache_hit_tokens"],
            row["output_tokens"],
            row["tenant"],
        )
        for row in got.iter_rows(named=True)
    }
    assert seen == expect


def test_prefetch_keeps_order_passes_errors_and_stops_the_producer() -> None:
    import gc
    import threading

    from pipeline.ingest.readers import Prefetch

    assert list(Prefetch(iter(range(1000)), depth=3)) == list(range(1000))

    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("bad batch")

    got: list[int] = []
    with pytest.raises(ValueError, match="bad batch"):
        for x in Prefetch(failing()):
            got.append(x)
    assert got == [1, 2]

    closed: list[bool] = []

    def endless() -> Iterator[int]:
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.append(True)

    it = Prefetch(endless(), depth=2)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    it.close()  # the consumer stops early: the worker stops and closes the producer
    assert closed == [True]

    # a consumer that just drops it: the worker stops and is waited for, the producer closed
    workers = sum(1 for t in threading.enumerate() if t.name == "rooftrace-prefetch")
    it = Prefetch(endless(), depth=2)
    assert next(it) == 0
    del it
    gc.collect()
    assert closed == [True, True]
    assert sum(1 for t in threading.enumerate() if t.name == "rooftrace-prefetch") == workers


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["a", "b"]), st.integers(0, 3)), max_size=12))
def test_is_sorted_matches_python_sorting(rows: list[tuple[int, str, int]]) -> None:
    frame = pl.DataFrame(rows, schema={"t": pl.Int64, "f": pl.String, "n": pl.Int64}, orient="row")
    assert core._is_sorted(frame, ("t", "f", "n")) == (rows == sorted(rows))
    by_text = [(f, t, n) for t, f, n in rows]  # a text first key, ties broken by the others
    assert core._is_sorted(frame, ("f", "t", "n")) == (by_text == sorted(by_text))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["openai", "azure"]), st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 4)),
        max_size=30,
    )
)
def test_first_seen_and_date_split(rows: list[tuple[str, str, int]]) -> None:
    """First-seen flags equal a dict walk over (source_format, request_id); the date split keeps
    every row once, in reading order, whether the rows are in date order or not."""
    base = datetime(2025, 1, 1, tzinfo=UTC)
    frame = pl.DataFrame(
        {
            "source_format": [r[0] for r in rows],
            "request_id": [r[1] for r in rows],
            "arrival": [base + timedelta(days=r[2], hours=5) for r in rows],
            "_seq": list(range(len(rows))),
        },
        schema={
            "source_format": pl.String,
            "request_id": pl.String,
            "arrival": pl.Datetime("us", "UTC"),
            "_seq": pl.Int64,
        },
    )
    seen: set[tuple[str, str]] = set()
    want = []
    for fmt, rid, _ in rows:
        want.append((fmt, rid) not in seen)
        seen.add((fmt, rid))
    assert core._first_seen(frame).to_list() == want
    for frame_in in (frame, frame.sort("arrival", maintain_order=True)):
        parts = core._split_by_date(frame_in)
        assert sorted(parts) == sorted({(base + timedelta(days=r[2])).date().isoformat() for r in rows})
        for d, part in parts.items():
            expect = frame_in.filter(pl.col("arrival").dt.date().cast(pl.String) == d)["_seq"].to_list()
            assert part["_seq"].to_list() == expect
        assert sum(p.height for p in parts.values()) == frame.height


def test_known_content_under_a_new_name_is_skipped_after_parsing(tmp_path: Path) -> None:
    """A new path is hashed while it is parsed; when its content was ingested before (a renamed
    copy), its rows are dropped and it counts as skipped: the store does not change."""
    logs = tmp_path / "logs"
    write_logs(generate(SynthConfig(requests=500, seed=9, duration_s=3600)), "openai", logs / "a.jsonl")
    write_logs(generate(SynthConfig(requests=300, seed=9, duration_s=3600)), "azure", logs / "b.csv")
    store = Store(tmp_path / "s")
    first = ingest_logs([logs], store)
    before = _digest(store)
    ids = set(store.read_requests()["request_id"].to_list())
    # Azure has no request ids: each record gets one derived from its content and occurrence.
    assert first.total("rows_stored") == 800 and sum(i.startswith("azure:") for i in ids) == 300
    copies = tmp_path / "copies"
    copies.mkdir()
    (copies / "renamed.jsonl").write_bytes((logs / "a.jsonl").read_bytes())
    (copies / "renamed.csv").write_bytes((logs / "b.csv").read_bytes())
    again = ingest_logs([copies], store)
    assert [f.skipped for f in again.files] == [True, True]
    assert again.total("rows_read") == 0 and again.total("rows_stored") == 0
    assert _digest(store) == before
    manifest = pl.read_parquet(store.manifest_path)
    assert manifest.height == 2


def _shuffled(src: Path, dst: Path, seed: int) -> None:
    import random

    lines = src.read_text().splitlines(keepends=True)
    random.Random(seed).shuffle(lines)
    dst.write_text("".join(lines))


@pytest.mark.parametrize("scenario", ["in_order", "duplicates", "stored_partition", "shuffled"])
def test_out_of_core_merge_equals_in_memory_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    """Forcing the out-of-core merge (tiny staging memory) gives the same Parquet bytes and the
    same per-file accounting as the in-memory merge, for rows in order (streamed, no sort),
    duplicates within the run, a partition already stored, and rows out of order."""
    logs = tmp_path / "logs"
    write_logs(generate(SynthConfig(requests=2500, seed=11, duration_s=2 * 86400)), "openai", logs / "a.jsonl")
    runs: list[list[Path]] = [[logs / "a.jsonl"]]
    if scenario == "duplicates":
        lines = (logs / "a.jsonl").read_text().splitlines(keepends=True)
        (logs / "b.jsonl").write_text("".join(lines) + "".join(lines[:300]))  # 300 repeats at the end
        runs = [[logs / "b.jsonl"]]
    elif scenario == "stored_partition":
        write_logs(generate(SynthConfig(requests=900, seed=12, duration_s=86400)), "openai", logs / "c.jsonl")
        runs = [[logs / "c.jsonl"], [logs / "a.jsonl"]]
    elif scenario == "shuffled":
        _shuffled(logs / "a.jsonl", logs / "d.jsonl", seed=3)
        runs = [[logs / "d.jsonl"]]

    def ingest_all(store: Store) -> list[tuple[int, int, int]]:
        out = []
        for run in runs:
            s = ingest_logs(run, store)
            out += [(f.rows_read, f.rows_stored, f.rows_duplicate) for f in s.files]
        return out

    a = Store(tmp_path / "mem")
    counts_a = ingest_all(a)
    streamed: list[bool] = []
    real = core._can_stream
    monkeypatch.setattr(core, "_can_stream", lambda *args: streamed.append(real(*args)) or streamed[-1])
    monkeypatch.setattr(core, "STAGE_MEMORY_BYTES", 50_000)
    b = Store(tmp_path / "ooc")
    counts_b = ingest_all(b)
    assert counts_b == counts_a and _digest(b) == _digest(a)
    assert streamed, "the out-of-core merge ran"
    if scenario == "in_order":
        assert all(streamed)  # read in partition order: streamed without a sort
    elif scenario == "stored_partition":
        assert False in streamed  # the date already stored is merged and sorted by DuckDB
    else:
        assert not any(streamed)
    if scenario == "duplicates":
        assert counts_a == [(2800, 2500, 300)]


def test_out_of_core_after_a_fast_path_retry_and_for_a_large_stored_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose DuckDB fast path fails after its batches were staged (a blank line deep in it:
    rows and lines stop matching) is re-read by the robust path: its staged rows and its in-order
    state are rolled back, so the out-of-core merge still streams it and matches the in-memory merge byte for byte. A
    partition too large to merge in memory (MEMORY_MERGE_BYTES) goes out of core without spilling
    first, with the same result."""
    from functools import partial

    from pipeline.ingest import readers

    logs = tmp_path / "logs"
    write_logs(generate(SynthConfig(requests=2000, seed=21, duration_s=3 * 3600)), "openai", logs / "a.jsonl")
    lines = (logs / "a.jsonl").read_text().splitlines(keepends=True)
    lines.insert(1500, "\n")  # a blank line: DuckDB skips it, so its rows stop matching lines at the end
    (logs / "a.jsonl").write_text("".join(lines))
    monkeypatch.setattr(core, "jsonl_fast", partial(readers.jsonl_fast, batch_rows=400))

    dropped: list[int] = []
    real_drop = core.Stager.drop

    def drop(self: core.Stager, file_index: int) -> None:
        dropped.append(sum(f.height for f in self.memory.get(file_index, [])) + len(self.spilled_files()))
        real_drop(self, file_index)

    monkeypatch.setattr(core.Stager, "drop", drop)
    mem = Store(tmp_path / "mem")
    s_mem = ingest_logs([logs / "a.jsonl"], mem)
    assert dropped and dropped[0] > 0, "the fast path had staged rows before it failed"
    assert (s_mem.total("rows_read"), s_mem.total("rows_stored"), s_mem.total("rows_quarantined")) == (2000, 2000, 0)

    streamed: list[bool] = []
    real = core._can_stream
    monkeypatch.setattr(core, "_can_stream", lambda *args: streamed.append(real(*args)) or streamed[-1])
    with monkeypatch.context() as m:
        m.setattr(core, "STAGE_MEMORY_BYTES", 50_000)
        ooc = Store(tmp_path / "ooc")
        s_ooc = ingest_logs([logs / "a.jsonl"], ooc)
    assert s_ooc.total("rows_stored") == 2000 and _digest(ooc) == _digest(mem)
    assert streamed and all(streamed)

    streamed.clear()
    monkeypatch.setattr(core, "MEMORY_MERGE_BYTES", 1)
    big = Store(tmp_path / "big")
    ingest_logs([logs / "a.jsonl"], big)
    assert streamed and _digest(big) == _digest(mem)


def test_file_names_with_glob_characters_are_read_as_themselves(tmp_path: Path) -> None:
    """DuckDB reads a path as a glob pattern: ``x[1].jsonl`` would match ``x1.jsonl``. Ingest reads
    the named file itself (plain and gzip), and a store path that is a pattern is refused."""
    logs = tmp_path / "logs"
    write_logs(generate(SynthConfig(requests=30, seed=31, duration_s=600)), "openai", logs / "x[1].jsonl")
    write_logs(generate(SynthConfig(requests=30, seed=32, duration_s=600)), "openai", logs / "x1.jsonl")
    write_logs(generate(SynthConfig(requests=20, seed=33, duration_s=600)), "openai", logs / "y{a}.jsonl.gz")
    want = {json.loads(line)["response"]["id"] for line in (logs / "x[1].jsonl").read_text().splitlines()}
    store = Store(tmp_path / "s")
    s = ingest_logs([logs / "x[1].jsonl", logs / "y{a}.jsonl.gz"], store)
    assert s.ok and s.total("rows_stored") == 50
    got = set(store.read_requests()["request_id"].to_list())
    assert want <= got and len(got) == 50
    with pytest.raises(RooftraceError, match="store path"):
        Store(tmp_path / "store[2]")


def test_a_failed_file_leaves_no_hashing_thread_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new file is hashed on a worker thread while it is read; when reading it fails (here a
    wrong forced format), that hash is stopped and its thread is gone before ingest returns."""
    import threading

    from pipeline.ingest import source

    def slow_hash(path: Path, stop: threading.Event | None = None) -> tuple[str, None]:
        assert stop is not None and stop.wait(10), "the hash of a failed file was not stopped"
        raise source.HashCancelled(str(path))

    monkeypatch.setattr(source, "sha256_file", slow_hash)
    path = tmp_path / "wrong.csv"
    path.write_text("a,b,c\n1,2,3\n")
    s = ingest_logs([path], Store(tmp_path / "s"), fmt="litellm")
    assert not s.ok and "header lacks" in s.errors[0]
    assert not [t.name for t in threading.enumerate() if t.name.startswith("rooftrace-hash")]
