from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.common.errors import RooftraceError
from pipeline.ingest.store import ColumnReader, Store, open_store


def test_lock_is_reentrant_in_process_and_exclusive_across_processes(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    code = (
        "import sys; from pathlib import Path; from pipeline.ingest.store import Store\n"
        "try:\n"
        f"    with Store(Path({str(store.root)!r})).lock(): pass\n"
        "except Exception as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    with store.lock():
        with store.lock():  # nested: the nightly job calls stages that lock again
            pass
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        assert other.returncode == 3 and "holds the store lock" in other.stdout
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert again.returncode == 0


def test_store_paths_and_dates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOFTRACE_STORE", str(tmp_path / "env"))
    assert open_store().root == tmp_path / "env"
    store = Store(tmp_path / "s")
    assert store.dates() == []
    with pytest.raises(RooftraceError, match="no requests ingested"):
        store.resolve_date(None)
    (store.requests_dir / "date=2024-01-02").mkdir(parents=True)
    (store.requests_dir / "date=2024-01-01").mkdir(parents=True)
    (store.requests_dir / ".date=2024-01-03.new-x").mkdir(parents=True)
    assert store.dates() == ["2024-01-01", "2024-01-02"]
    assert store.resolve_date(None) == "2024-01-02"
    with pytest.raises(RooftraceError, match="no partition for date 2024-02-01"):
        store.resolve_date("2024-02-01")


def test_some_columns_of_a_date_read_as_the_whole_date_is(tmp_path: Path) -> None:
    """``read_requests(date, columns)``: the same rows in the same order as the whole read (a
    partition of two files that need the sort, ties in arrival included), only those columns;
    a file damaged in one of them is one error naming it."""
    import numpy as np
    import polars as pl
    from polars.testing import assert_frame_equal

    from pipeline.common.schemas import write_parquet
    from pipeline.ingest import ingest_logs
    from pipeline.synth import SynthConfig, generate, write_logs

    store = Store(tmp_path / "store")
    write_logs(generate(SynthConfig(requests=300, seed=1, duration_s=60)), "openai", tmp_path / "d.jsonl")
    ingest_logs([tmp_path / "d.jsonl"], store)
    date = store.resolve_date(None)
    (stored,) = store.request_files(date)
    rows = pl.read_parquet(stored).with_row_index("i")
    # two files, rows dealt between them at random, and a tie in arrival across them
    rows = rows.with_columns(
        pl.when(pl.col("i") == 7).then(rows.get_column("arrival")[8]).otherwise(pl.col("arrival")).alias("arrival")
    )
    odd = (pl.Series(np.random.default_rng(0).integers(0, 2, rows.height)) == 1).to_list()
    files = [stored, stored.with_name("part-00001.parquet")]
    for path, part in zip(files, (rows.filter(~pl.Series(odd)), rows.filter(pl.Series(odd))), strict=True):
        write_parquet(part.drop("i").sample(fraction=1.0, shuffle=True, seed=3).to_arrow(), path, "requests")
    whole = store.read_requests(date)
    assert len(files) == 2 and whole.height == 300
    cols = ["output_tokens", "request_id", "session_id"]
    assert_frame_equal(store.read_requests(date, cols), whole.select(cols))
    keys = ["arrival", "request_id"]
    assert_frame_equal(whole.select(keys), whole.select(keys).sort(keys))
    # the ids read back a slice at a time from their positions, in the returned order
    with_pos = store.read_requests(date, ["output_tokens"], positions=True)
    ids = ColumnReader(store, date, "request_id", with_pos.get_column("_position").to_numpy())
    rng = np.random.default_rng(5)
    for a, n in [(0, 300), (0, 0), (299, 1), *((int(a), int(rng.integers(1, 80))) for a in rng.integers(0, 299, 12))]:
        want = whole.get_column("request_id").slice(a, n).to_list()
        assert ids.slice(a, n).to_pylist() == want
    # the ids' digest: what hashing the whole ordered column gives, read a row group at a time
    import hashlib

    want_h, got_h = hashlib.sha256(), hashlib.sha256()
    want_h.update(np.ascontiguousarray(whole.get_column("request_id").hash(seed=0).to_numpy()).data)
    ids.digest(got_h, chunk=7)
    assert got_h.hexdigest() == want_h.hexdigest()
    write_parquet(pl.read_parquet(files[1]).to_arrow(), files[1], "requests")  # ingested again, say
    with pytest.raises(RooftraceError, match="changed during the run"):
        ids.slice(0, 10)
    pl.read_parquet(files[0]).with_columns(pl.lit(None, pl.Int64).alias("output_tokens")).write_parquet(files[0])
    with pytest.raises(RooftraceError, match=str(files[0].name)):
        store.read_requests(date, cols)
    stored.write_bytes(stored.read_bytes()[:1000])  # truncated: no footer
    for columns in (None, cols):
        with pytest.raises(RooftraceError, match=f"{stored.name}: not a readable Parquet file"):
            store.read_requests(date, columns)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["a", "b", "ab", "", "c", "é"])), min_size=0, max_size=60),
)
def test_arrival_order_is_a_sort_by_arrival_then_request_id(rows: list[tuple[int, str]]) -> None:
    """:func:`arrival_order` (ids read only where arrivals tie) orders rows as polars' stable
    sort by (arrival, request_id) does; None exactly when that order is the stored one; the ids
    it asks for are the tied rows', in increasing stored order."""
    import numpy as np
    import polars as pl

    from pipeline.ingest.store import arrival_order

    frame = pl.DataFrame({"arrival": [a for a, _ in rows], "request_id": [i for _, i in rows]},
                         schema={"arrival": pl.Int64, "request_id": pl.String})  # fmt: skip
    want = frame.select(pl.arg_sort_by(["arrival", "request_id"], maintain_order=True)).to_series().to_numpy()
    asked: list[np.ndarray] = []

    def ids(at: np.ndarray) -> pl.Series:
        asked.append(at)
        return frame.get_column("request_id").gather(at)

    got = arrival_order(frame.get_column("arrival").to_numpy(), ids)
    assert np.array_equal(np.arange(len(rows)) if got is None else got, want)
    assert (got is None) == bool(np.array_equal(want, np.arange(len(rows))))
    arrivals = frame.get_column("arrival")
    tied = np.flatnonzero(arrivals.is_duplicated().to_numpy())
    assert (np.concatenate(asked) if asked else np.zeros(0, np.int64)).tolist() == tied.tolist()


def test_ids_of_tied_rows_are_read_by_row_group_and_nulls_refused(tmp_path: Path) -> None:
    """The ids ``arrival_order`` asks for come from the row groups that hold them, across files;
    a null among them is one error naming the date's folder."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.ingest.store import _ids_at

    files = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    pq.write_table(pa.table({"request_id": [f"a{i}" for i in range(10)]}), files[0], row_group_size=3)
    pq.write_table(pa.table({"request_id": ["b0", None, "b2"]}), files[1], row_group_size=2)
    rows = np.array([0, 4, 5, 9, 10, 12])
    assert _ids_at(files, rows).to_list() == ["a0", "a4", "a5", "a9", "b0", "b2"]
    assert _ids_at(files, np.zeros(0, np.int64)).to_list() == []
    with pytest.raises(RooftraceError, match=f"{tmp_path}: required column request_id holds nulls"):
        _ids_at(files, np.array([2, 11]))
