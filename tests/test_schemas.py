from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.common.errors import SchemaError
from pipeline.common.schemas import META_NAME, META_VERSION, list_schemas, load_schema, read_parquet, write_parquet


def test_every_schema_loads_and_documents_each_column() -> None:
    names = list_schemas()
    assert {"requests", "quarantine", "manifest"} <= set(names)
    for name in names:
        schema = load_schema(name)
        assert schema.arrow.metadata[b"rooftrace.schema"] == name.encode()
        for col in schema.columns:
            assert col.doc.strip(), f"{name}.{col.name} has no doc"


def _one_manifest_row() -> pa.Table:
    return pa.table(
        {
            "source_file": ["a.jsonl"],
            "content_sha256": ["00"],
            "source_format": ["openai"],
            "rows_read": [3],
            "rows_stored": [1],
            "rows_quarantined": [1],
            "rows_duplicate": [1],
            "dates": [["2024-01-01"]],
            "ingested_at": pa.array([0], pa.timestamp("us", tz="UTC")),
        }
    )


def test_write_then_read_round_trips_with_metadata(tmp_path: Path) -> None:
    path = write_parquet(_one_manifest_row(), tmp_path / "m.parquet", "manifest")
    meta = pq.read_schema(path).metadata
    assert meta[b"rooftrace.schema"] == b"manifest"
    assert meta[b"rooftrace.schema_version"] == b"1"
    assert read_parquet(path, "manifest").column("rows_read").to_pylist() == [3]
    with pytest.raises(SchemaError, match="expected a 'requests' table"):
        read_parquet(path, "requests")


def test_write_rejects_missing_column_and_nulls(tmp_path: Path) -> None:
    table = _one_manifest_row()
    with pytest.raises(SchemaError, match="lacks columns"):
        write_parquet(table.drop_columns(["rows_read"]), tmp_path / "x.parquet", "manifest")
    nulls = table.set_column(3, "rows_read", pa.array([None], pa.int64()))
    with pytest.raises(SchemaError, match="not nullable"):
        write_parquet(nulls, tmp_path / "x.parquet", "manifest")
    assert not list(tmp_path.iterdir()), "a failed write must leave nothing behind"


def _manifest_rows(n: int) -> pa.Table:
    return pa.table(
        {
            "source_file": [f"f{i}.jsonl" for i in range(n)],
            "content_sha256": [f"{i:064x}" for i in range(n)],
            "source_format": ["openai"] * n,
            "rows_read": list(range(n)),
            "rows_stored": list(range(n)),
            "rows_quarantined": [0] * n,
            "rows_duplicate": [0] * n,
            "dates": [["2024-01-01"]] * n,
            "ingested_at": pa.array(list(range(n)), pa.timestamp("us", tz="UTC")),
        }
    )


@given(n=st.integers(0, 60), cuts=st.lists(st.integers(0, 60), max_size=8))
@settings(max_examples=60, deadline=None)
def test_parquet_stream_bytes_do_not_depend_on_how_rows_arrive(n: int, cuts: list[int]) -> None:
    """Rows handed over whole or in any pieces give the same file, byte for byte, in row groups
    of exactly ROW_GROUP_ROWS (here 7) but the last; the rows read back are the rows written."""
    import tempfile

    from pipeline.common import schemas

    table = _manifest_rows(n)
    bounds = sorted({0, n, *(c for c in cuts if c <= n)})
    saved = schemas.ROW_GROUP_ROWS
    schemas.ROW_GROUP_ROWS = 7
    try:
        with tempfile.TemporaryDirectory() as tmp:
            whole = schemas.ParquetStream(Path(tmp) / "whole.parquet", "manifest")
            whole.write(table)
            whole.close()
            pieces = schemas.ParquetStream(Path(tmp) / "pieces.parquet", "manifest")
            for a, b in itertools.pairwise(bounds):
                pieces.write(table.slice(a, b - a))
            pieces.close()
            data = (Path(tmp) / "whole.parquet").read_bytes()
            assert (Path(tmp) / "pieces.parquet").read_bytes() == data
            meta = pq.ParquetFile(Path(tmp) / "whole.parquet").metadata
            sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            assert sum(sizes) == n and all(s == 7 for s in sizes[:-1]) and (not sizes or 0 < sizes[-1] <= 7)
            back = read_parquet(Path(tmp) / "pieces.parquet", "manifest")
            assert back.column("source_file").to_pylist() == table.column("source_file").to_pylist()
            assert sorted(p.name for p in Path(tmp).iterdir()) == ["pieces.parquet", "whole.parquet"]
    finally:
        schemas.ROW_GROUP_ROWS = saved


def test_parquet_stream_abort_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.common import schemas

    monkeypatch.setattr(schemas, "ROW_GROUP_ROWS", 3)
    stream = schemas.ParquetStream(tmp_path / "run" / "m.parquet", "manifest")
    stream.write(_manifest_rows(10))  # three row groups already on disk, under a temporary name
    assert [p.name for p in (tmp_path / "run").iterdir()] != ["m.parquet"]
    stream.abort()
    assert not list((tmp_path / "run").iterdir())
    stream.abort()  # twice is harmless


def test_hostile_parquet_metadata_is_one_short_error(tmp_path: Path) -> None:
    """A version that is not a number, a name that is not UTF-8, another table's file, a file
    that is not Parquet: each a SchemaError naming the file, short (no Arrow schema dump)."""
    from pipeline.common.schemas import check_file_schema

    table = pa.table({"x": [1]})
    cases = {
        "version.parquet": {b"rooftrace.schema": b"requests", b"rooftrace.schema_version": b"abc"},
        "name.parquet": {b"rooftrace.schema": b"\xff\xfe", b"rooftrace.schema_version": b"1"},
        "other.parquet": {b"rooftrace.schema": b"replay_steps", b"rooftrace.schema_version": b"2"},
    }
    for name, meta in cases.items():
        pq.write_table(table.replace_schema_metadata(meta), tmp_path / name)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    for path in sorted(tmp_path.iterdir()):
        for read in (lambda p: read_parquet(p, "requests"), lambda p: check_file_schema(p, "requests")):
            with pytest.raises(SchemaError) as err:
                read(path)
            assert str(path) in str(err.value) and len(str(err.value)) < 300, str(err.value)


def test_a_run_of_an_earlier_schema_says_to_replay_it(tmp_path: Path) -> None:
    """requests.parquet went to replay_requests v2 (the warmup column), then v3 (cache_hit_source):
    a run written before says what to do, not only which versions differ."""
    path = tmp_path / "requests.parquet"
    table = pa.table({"request_id": ["a"]}).replace_schema_metadata({META_NAME: b"replay_requests", META_VERSION: b"1"})
    pq.write_table(table, path)
    with pytest.raises(
        SchemaError, match=r"version 1, this rooftrace reads 3 \(written by an earlier rooftrace: make it again"
    ):
        read_parquet(path, "replay_requests")
