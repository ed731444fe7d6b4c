from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import SchemaError
from pipeline.schemas import list_schemas, load_schema, read_parquet, write_parquet


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
