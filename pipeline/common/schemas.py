"""Parquet table schemas declared as data (``schemas/*.toml``), loaded into pyarrow.

Every Parquet file rooftrace writes carries ``rooftrace.schema`` and ``rooftrace.schema_version``
in its key-value metadata, is validated against the declared schema before it is written, and is
checked again when it is read. Writes are atomic: a temporary file beside the target, then rename.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.common.errors import SchemaError
from pipeline.common.system import not_regular
from pipeline.common.tomlfile import read_toml

META_NAME = b"rooftrace.schema"
META_VERSION = b"rooftrace.schema_version"

_SCALARS: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "date32": pa.date32(),
    "timestamp[us, UTC]": pa.timestamp("us", tz="UTC"),
    "timestamp[us]": pa.timestamp("us"),
}


def parse_type(text: str) -> pa.DataType:
    """Turn a schema type string (``int64``, ``list<uint64>``, ``timestamp[us, UTC]``) into Arrow."""
    text = text.strip()
    if text.startswith("list<") and text.endswith(">"):
        return pa.list_(parse_type(text[5:-1]))
    try:
        return _SCALARS[text]
    except KeyError:
        raise SchemaError(f"unknown column type {text!r}; known: {sorted(_SCALARS)} or list<T>") from None


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool
    unit: str
    doc: str
    #: A column a table may leave out (``optional = true``): written only where it says
    #: something (a pooled fleet's ``pool``), so tables without it keep their bytes.
    optional: bool = False


@dataclass(frozen=True)
class TableSchema:
    name: str
    version: int
    doc: str
    columns: tuple[Column, ...]

    @property
    def arrow(self) -> pa.Schema:
        fields = [pa.field(c.name, parse_type(c.type), nullable=c.nullable) for c in self.columns]
        return pa.schema(
            fields,
            metadata={META_NAME: self.name.encode(), META_VERSION: str(self.version).encode()},
        )

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def arrow_for(self, present: Sequence[str]) -> pa.Schema:
        """The Arrow schema of a table holding the columns ``present`` has: every required column,
        and the optional ones ``present`` names."""
        arrow = self.arrow
        drop = [c.name for c in self.columns if c.optional and c.name not in present]
        for name in drop:
            arrow = arrow.remove(arrow.get_field_index(name))
        return arrow


def schema_dir() -> Path:
    """``schemas/`` at the repository root in a checkout, ``pipeline/_schemas`` in a wheel."""
    here = Path(__file__).resolve().parents[1]  # the package: pipeline/
    for candidate in (here.parent / "schemas", here / "_schemas"):
        if candidate.is_dir():
            return candidate
    raise SchemaError(f"schema directory not found beside {here}")


_COLUMN_KEYS = {"name", "type", "nullable", "unit", "doc"}
_COLUMN_OPTIONAL_KEYS = {"optional"}
_TABLE_KEYS = {"name", "version", "doc", "columns"}


def _parse_schema(data: Mapping[str, Any], origin: str) -> TableSchema:
    unknown = set(data) - _TABLE_KEYS
    missing = _TABLE_KEYS - set(data)
    if unknown or missing:
        raise SchemaError(f"{origin}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    cols = []
    for i, raw in enumerate(data["columns"]):
        if not _COLUMN_KEYS <= set(raw) <= _COLUMN_KEYS | _COLUMN_OPTIONAL_KEYS:
            raise SchemaError(
                f"{origin}: column {i} must have exactly the keys {sorted(_COLUMN_KEYS)} (and maybe "
                f"{sorted(_COLUMN_OPTIONAL_KEYS)}), got {sorted(raw)}"
            )
        parse_type(raw["type"])
        optional = bool(raw.get("optional", False))
        if optional and not raw["nullable"]:
            raise SchemaError(f"{origin}: column {raw['name']!r} is optional, so it must be nullable")
        cols.append(Column(raw["name"], raw["type"], bool(raw["nullable"]), raw["unit"], raw["doc"], optional))
    names = [c.name for c in cols]
    if len(set(names)) != len(names):
        raise SchemaError(f"{origin}: duplicate column names")
    return TableSchema(data["name"], int(data["version"]), data["doc"], tuple(cols))


@cache
def load_schema(name: str) -> TableSchema:
    """Load ``schemas/<name>.toml``."""
    path = schema_dir() / f"{name}.toml"
    if not path.exists():
        raise SchemaError(f"no schema named {name!r} in {path.parent}")
    schema = _parse_schema(read_toml(path, "schema"), str(path))
    if schema.name != name:
        raise SchemaError(f"{path}: declares name {schema.name!r}, expected {name!r}")
    return schema


def list_schemas() -> list[str]:
    return sorted(p.stem for p in schema_dir().glob("*.toml"))


def conform(table: pa.Table, name: str, columns: Sequence[str] | None = None) -> pa.Table:
    """Select, order and cast ``table`` to schema ``name`` (to its ``columns`` only, in that
    order, when given); raise if a column is missing, undeclared, or non-nullable with nulls."""
    schema = load_schema(name)
    arrow = schema.arrow_for(table.column_names)
    if columns is not None:
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise SchemaError(f"schema {name!r} declares no columns {unknown}")
        arrow = pa.schema([arrow.field(c) for c in columns], metadata=arrow.metadata)
    missing = [c for c in arrow.names if c not in table.column_names]
    if missing:
        raise SchemaError(f"table for schema {name!r} lacks columns {missing}")
    extra = [c for c in table.column_names if c not in arrow.names]
    if extra:
        raise SchemaError(f"table for schema {name!r} has undeclared columns {extra}")
    arrays = []
    for field in arrow:
        col = table.column(field.name)
        if not col.type.equals(field.type):
            try:
                col = col.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(
                    f"schema {name!r}: column {field.name!r} of type {col.type} cannot be cast to {field.type}: {exc}"
                ) from None
        if not field.nullable and col.null_count:
            raise SchemaError(f"schema {name!r}: column {field.name!r} is not nullable but has {col.null_count} nulls")
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=arrow)


def _logical(t: pa.DataType) -> pa.DataType:
    """The Parquet-level type: Arrow's large and view variants of strings and lists are the same
    column in a Parquet file (polars writes large_string, pyarrow and DuckDB string)."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(_logical(t.value_type))  # the list's item field name may differ too
    return t


def _types_match(got: pa.Schema, want: pa.Schema) -> bool:
    """Same column names, order and (Parquet-level) types. Nullability is not compared (writers
    such as DuckDB mark every Parquet column optional); required columns are checked for nulls
    instead."""
    if got.names != want.names:
        return False
    return all(_logical(g.type).equals(_logical(w.type)) for g, w in zip(got, want, strict=True))


def file_metadata(path: Path) -> dict[bytes, bytes]:
    """A Parquet file's key-value metadata, read from its footer (whatever wrote it)."""
    with unreadable(path):
        return dict(pq.read_metadata(path).metadata or {})


@contextmanager
def unreadable(path: Path | str) -> Iterator[None]:
    """A file that cannot be read as Parquet (truncated, not Parquet, no permission) as one
    SchemaError naming it."""
    try:
        yield
    except (OSError, pa.ArrowException) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SchemaError(f"{path}: not a readable Parquet file: {first}") from None


def validate(table: pa.Table, name: str) -> None:
    """Raise unless ``table`` has schema ``name``'s columns and types, and no nulls in a required
    column."""
    arrow = load_schema(name).arrow_for(table.column_names)
    if not _types_match(table.schema, arrow):
        raise SchemaError(f"table does not match schema {name!r}: got {table.schema.remove_metadata()}")
    for field in arrow:
        if not field.nullable and table.column(field.name).null_count:
            raise SchemaError(f"schema {name!r}: non-nullable column {field.name!r} has nulls")


def check_file_schema(path: Path, name: str) -> None:
    """Check a Parquet file's metadata (schema name and version) and column types, reading only
    its footer."""
    with unreadable(path):
        got = pq.read_schema(path)
    meta = file_metadata(path)
    expected = load_schema(name)
    found, version = meta.get(META_NAME), meta.get(META_VERSION, b"0")
    if found != name.encode() or version != str(expected.version).encode():
        says = "no rooftrace schema"
        if found:
            says = f"{found.decode(errors='replace')!r} v{version.decode(errors='replace')}"
        raise SchemaError(f"{path}: expected a {name!r} v{expected.version} table, the file holds {says}")
    if not _types_match(got, expected.arrow_for(got.names)):
        raise SchemaError(f"{path}: columns do not match schema {name!r}: {got.remove_metadata()}")


#: mkstemp creates 0600 files; outputs are ordinary shareable files (umask still applies on create).
_FILE_MODE = 0o644


def check_replaceable(path: Path) -> None:
    """Refuse (FileExistsError, naming what is there) to write over anything at ``path`` that is
    not a regular file: an atomic write renames over it, which would replace a named pipe, a
    device or a folder's entry with a file."""
    if not os.path.lexists(path):
        return
    why = not_regular(path) if os.path.exists(path) else None  # (a dangling link is replaced)
    if why is not None:
        raise FileExistsError(errno.EEXIST, f"is {why}, not a regular file; refusing to replace it", str(path))


def os_write_reason(path: Path, exc: OSError) -> str:
    """Why ``path`` could not be written, in words: a parent that is a file is named."""
    if isinstance(exc, FileExistsError | NotADirectoryError) and exc.filename and Path(exc.filename) != path:
        for parent in reversed(path.parents):
            try:
                if parent.exists() and not parent.is_dir():
                    return f"{parent} is a file, not a folder"
            except OSError:
                break
    return exc.strerror or str(exc) or type(exc).__name__


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename); never
    over something that is not a regular file (:func:`check_replaceable`)."""
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: Rows per Parquet row group, and the writer's options (fixed, so the same rows give the same
#: bytes). zstd level 1: most of level 3's ratio on these columns at about half the write time.
ROW_GROUP_ROWS = 1 << 18
_WRITER: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 1,
    "write_statistics": True,
    "store_schema": True,
}


class ParquetStream:
    """A table of schema ``name`` written as its rows arrive (``write``, any number of pieces),
    in row groups of exactly ROW_GROUP_ROWS rows (the last one shorter): the file's bytes depend
    on the rows alone, not on how they were handed over, and at most one row group is held.
    Written to a temporary name beside ``path`` and moved there by ``close`` (``abort`` removes
    it)."""

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name
        self.rows = 0
        self._buf: list[pa.Table] = []
        self._held = 0
        self._tmp: str | None = None
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        table = conform(table, self.name)
        validate(table, self.name)
        if table.num_rows:
            self._buf.append(table)
            self._held += table.num_rows
            self.rows += table.num_rows
        while self._held >= ROW_GROUP_ROWS:
            self._flush(ROW_GROUP_ROWS)

    def _flush(self, n: int) -> None:
        parts, need = [], n
        while need:
            head = self._buf[0]
            if head.num_rows <= need:
                parts.append(self._buf.pop(0))
                need -= head.num_rows
            else:
                parts.append(head.slice(0, need))
                self._buf[0] = head.slice(need)
                need = 0
        self._held -= n
        group = pa.concat_tables(parts).combine_chunks()
        self._open(group.column_names).write_table(group, row_group_size=n)

    def _open(self, present: Sequence[str] = ()) -> pq.ParquetWriter:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
            os.close(fd)
            arrow = load_schema(self.name).arrow_for(present)
            self._writer = pq.ParquetWriter(self._tmp, arrow, **_WRITER)
        return self._writer

    def finish(self) -> Path:
        """Write what is held and close the file, still under its temporary name (returned)."""
        if self._held:
            self._flush(self._held)
        if self._tmp is None:  # no rows at all: a file with the schema and no row group
            self._open()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        assert self._tmp is not None
        return Path(self._tmp)

    def commit(self) -> Path:
        """Move the finished file into place."""
        tmp = self.finish()
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, self.path)
        self._tmp = None
        return self.path

    def close(self) -> Path:
        """Write what is held and move the file into place."""
        return self.commit()

    def abort(self) -> None:
        """Drop the partial file (the run failed or was interrupted)."""
        if self._writer is not None:
            self._writer.close()
        if self._tmp is not None:
            Path(self._tmp).unlink(missing_ok=True)
        self._writer, self._tmp = None, None


def write_parquet(table: pa.Table, path: Path, name: str) -> Path:
    """Conform ``table`` to schema ``name`` and write it to ``path`` atomically.

    Output is deterministic for the same rows (no timestamps in the file, fixed writer options),
    so re-running a stage gives byte-identical files.
    """
    table = conform(table, name)
    validate(table, name)
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP_ROWS, **_WRITER)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_parquet(path: Path | str, name: str, columns: Sequence[str] | None = None) -> pa.Table:
    """Read a Parquet file written by rooftrace and check it carries schema ``name`` (only its
    ``columns``, in that order and cast to their declared types, when given)."""
    path = Path(path)
    meta = file_metadata(path)
    found = meta.get(META_NAME)
    if found != name.encode():
        says = found.decode(errors="replace") if found else "nothing"
        raise SchemaError(f"{path}: expected a {name!r} table, file says {says}")
    expected = load_schema(name)
    version = meta.get(META_VERSION, b"0").decode(errors="replace")
    if version != str(expected.version):
        older = version.isdigit() and int(version) < expected.version
        hint = (
            " (written by an earlier rooftrace: make it again, e.g. re-run `rooftrace replay` for a run)"
            if older
            else ""
        )
        raise SchemaError(f"{path}: schema {name!r} version {version}, this rooftrace reads {expected.version}{hint}")
    if columns is None:
        with unreadable(path):
            table = pq.read_table(path)
        validate(table, name)
        return conform(table, name)  # the declared Arrow types, whichever writer made the file
    try:
        table = pq.read_table(path, columns=list(columns))
    except (KeyError, OSError, pa.ArrowException) as exc:
        raise SchemaError(f"{path}: cannot read columns {list(columns)}: {exc}") from None
    return conform(table, name, columns)
