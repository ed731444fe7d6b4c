"""``ingest_logs``: source files -> STORE/requests (by arrival date), quarantine and manifest.

Accounting is exact per file: rows read = rows stored + rows quarantined + duplicates dropped.
A file already ingested (same SHA-256) is skipped. Rows are deduplicated on
(source_format, request_id) against the store and within the run, keeping the first seen.
Each touched date partition is rewritten beside the old one and swapped in by rename; an
interrupted swap is repaired at the start of the next run, so a killed run leaves the previous
store intact. A whole file that cannot be read is reported and skipped; the others still ingest.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from pipeline.errors import RooftraceError
from pipeline.ingest.formats import ALL_FORMATS, FORMATS, Context, FormatSpec
from pipeline.ingest.mapping import load_mapping
from pipeline.ingest.normalize import finalize
from pipeline.ingest.readers import (
    RAW_LIMIT,
    FastPathFailed,
    RawBatch,
    csv_batches,
    jsonl_fast,
    jsonl_robust,
    otel_batches,
    parquet_batches,
)
from pipeline.ingest.source import (
    LineStats,
    SourceError,
    check_text,
    fetch_lines,
    iter_files,
    logical_name,
    read_head,
    sha256_file,
    sniff_format,
)
from pipeline.schemas import check_file_schema, load_schema, read_parquet, write_parquet
from pipeline.store import Store, check_date

Progress = Callable[[str], None]


@dataclass
class FileResult:
    source_file: str
    source_format: str | None = None
    content_sha256: str | None = None
    rows_read: int = 0
    rows_stored: int = 0
    rows_quarantined: int = 0
    rows_duplicate: int = 0
    dates: list[str] = field(default_factory=list)
    skipped: bool = False  # already ingested (same content hash)
    error: str | None = None


@dataclass
class IngestSummary:
    files: list[FileResult]
    seconds: float

    def total(self, name: str) -> int:
        return sum(int(getattr(f, name)) for f in self.files)

    @property
    def errors(self) -> list[str]:
        return [f.error for f in self.files if f.error]

    @property
    def ok(self) -> bool:
        return not self.errors

    def line(self) -> str:
        n_files = sum(1 for f in self.files if not f.skipped and not f.error)
        skipped = sum(1 for f in self.files if f.skipped)
        return (
            f"ingested {n_files} file(s) ({skipped} already ingested, {len(self.errors)} failed): "
            f"{self.total('rows_read')} rows read = {self.total('rows_stored')} stored + "
            f"{self.total('rows_quarantined')} quarantined + {self.total('rows_duplicate')} duplicates "
            f"in {self.seconds:.1f} s"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rows_read": self.total("rows_read"),
            "rows_stored": self.total("rows_stored"),
            "rows_quarantined": self.total("rows_quarantined"),
            "rows_duplicate": self.total("rows_duplicate"),
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "errors": self.errors,
            "files": [asdict(f) for f in self.files],
        }


#: Normalised rows kept in memory before spilling to the staging folder (tens of MB), so a huge
#: input never needs memory in proportion to its size.
SPILL_ROWS = 250_000


class Stager:
    """Holds normalised batches per source file: in memory up to SPILL_ROWS, then on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.memory: dict[int, list[pl.DataFrame]] = {}
        self.rows_in_memory = 0
        self.spilled = 0
        self.seq = 0

    def add(self, file_index: int, frame: pl.DataFrame) -> None:
        # _seq orders rows as they were read, so "keep the first duplicate" is well defined.
        frame = frame.with_columns(
            _file=pl.lit(file_index, pl.Int32),
            _seq=pl.int_range(self.seq, self.seq + frame.height, dtype=pl.Int64),
        )
        self.seq += frame.height
        if self.rows_in_memory + frame.height <= SPILL_ROWS:
            self.memory.setdefault(file_index, []).append(frame)
            self.rows_in_memory += frame.height
            return
        folder = self.root / f"f{file_index:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(folder / f"batch-{self.spilled:06d}.parquet")
        self.spilled += 1

    def drop(self, file_index: int) -> None:
        """Forget a file's rows (its read failed, or the fast path is being retried)."""
        self.rows_in_memory -= sum(f.height for f in self.memory.pop(file_index, []))
        shutil.rmtree(self.root / f"f{file_index:05d}", ignore_errors=True)

    def lazy(self) -> pl.LazyFrame | None:
        parts = [f.lazy() for frames in self.memory.values() for f in frames]
        files = sorted(self.root.glob("f*/batch-*.parquet"))
        if files:
            parts.append(pl.scan_parquet(files))
        return pl.concat(parts, how="vertical") if parts else None


def _resolve_spec(path: Path, fmt: str | None, mapping: Path | None) -> FormatSpec:
    if mapping is not None:
        return load_mapping(mapping, fmt if fmt in ("csv", "jsonl", "parquet") else None)
    if fmt in ("csv", "jsonl", "parquet"):
        raise RooftraceError(f"--format {fmt} needs --mapping FILE (a TOML column mapping)")
    if fmt is not None:
        if fmt not in FORMATS:
            raise RooftraceError(f"unknown --format {fmt!r}; known: {', '.join(ALL_FORMATS)}")
        return FORMATS[fmt]
    if logical_name(path).lower().endswith(".parquet"):
        raise SourceError(f"{path}: Parquet input needs --format parquet and a --mapping")
    head = read_head(path)
    check_text(path, head)
    return FORMATS[sniff_format(path, head)]


def _raw_batches(path: Path, spec: FormatSpec) -> Iterator[RawBatch]:
    kind = spec.kind
    if kind in ("csv", "parquet") or kind == "otel":
        pass
    else:
        head = read_head(path)
        check_text(path, head)
    if kind == "csv_or_json":
        head = read_head(path, 4096).lstrip()
        kind = "jsonl" if head[:1] in (b"{", b"[") else "csv"
    if kind == "csv":
        check_text(path, read_head(path))
        yield from csv_batches(path, spec)
    elif kind == "otel":
        check_text(path, read_head(path))
        yield from otel_batches(path, spec)
    elif kind == "parquet":
        yield from parquet_batches(path, spec)
    else:
        yield from jsonl_robust(path, spec)


def _stage_file(
    path: Path,
    spec: FormatSpec,
    ctx: Context,
    sha: str,
    stager: Stager,
    file_index: int,
    stats: LineStats | None = None,
) -> tuple[int, pl.DataFrame]:
    """Read, normalise and stage one file. Returns (rows read, quarantine frame)."""
    if spec.relative_time and ctx.anchor_date is None:
        raise SourceError(f"{path}: {spec.name} timestamps are relative to the trace start; pass --date YYYY-MM-DD")
    file_id = sha[:12]

    def run(batches: Iterator[RawBatch]) -> tuple[int, list[pl.DataFrame]]:
        read = 0
        bad_frames: list[pl.DataFrame] = []
        for batch in batches:
            read += batch.frame.height + len(batch.failures)
            cand = spec.post(batch.frame, ctx).with_columns(batch.frame["source_line"])
            norm = finalize(
                cand,
                source_format=spec.name,
                source_file=str(path),
                file_id=file_id,
                labels=spec.labels,
                input_excludes_cache=spec.input_excludes_cache,
            )
            if norm.good.height:
                stager.add(file_index, norm.good)
            bad = norm.bad.with_columns(raw=pl.lit(None, dtype=pl.String))
            if spec.kind == "parquet" and bad.height:
                raw_json = batch.frame.select(
                    "source_line", raw=pl.struct(pl.all().exclude("source_line")).struct.json_encode()
                )
                bad = bad.drop("raw").join(raw_json, on="source_line", how="left")
            if batch.failures:
                fail = pl.DataFrame(
                    {
                        "source_line": [f[0] for f in batch.failures],
                        "field": [None] * len(batch.failures),
                        "reason": [f[1] for f in batch.failures],
                        "raw": [f[2] for f in batch.failures],
                    },
                    schema={
                        "source_line": pl.Int64,
                        "field": pl.String,
                        "reason": pl.String,
                        "raw": pl.String,
                    },
                )
                bad = pl.concat([fail, bad])
            if bad.height:
                bad_frames.append(bad)
        return read, bad_frames

    if spec.kind == "jsonl":
        try:
            read, bad_frames = run(jsonl_fast(path, spec, stats))
        except FastPathFailed:
            stager.drop(file_index)
            read, bad_frames = run(_raw_batches(path, spec))
    else:
        read, bad_frames = run(_raw_batches(path, spec))

    schema = {"source_line": pl.Int64, "field": pl.String, "reason": pl.String, "raw": pl.String}
    bad = pl.concat(bad_frames) if bad_frames else pl.DataFrame(schema=schema)
    missing_raw = bad.filter(pl.col("raw").is_null())
    if missing_raw.height and spec.kind != "parquet":
        texts = fetch_lines(path, set(missing_raw["source_line"].to_list()), RAW_LIMIT)
        bad = bad.with_columns(
            raw=pl.coalesce(
                pl.col("raw"),
                pl.col("source_line").replace_strict(texts, default=None, return_dtype=pl.String),
            )
        )
    bad = bad.with_columns(pl.col("raw").fill_null("")).sort("source_line", maintain_order=True)
    return read, bad


def _recover(store: Store) -> None:
    """Finish or undo a partition swap that a killed run left half-done; drop stale staging."""
    for table_dir in (store.requests_dir,):
        if not table_dir.is_dir():
            continue
        for p in sorted(table_dir.iterdir()):
            name = p.name
            if name.startswith(".") and ".old-" in name:
                final = table_dir / name[1:].split(".old-")[0]
                if final.exists():
                    shutil.rmtree(p)
                else:
                    p.rename(final)
            elif name.startswith(".") and ".new-" in name:
                shutil.rmtree(p)
    shutil.rmtree(store.root / ".staging", ignore_errors=True)


def _read_manifest(store: Store) -> pl.DataFrame:
    if store.manifest_path.exists():
        got = pl.from_arrow(read_parquet(store.manifest_path, "manifest"))
        assert isinstance(got, pl.DataFrame)
        return got
    return pl.from_arrow(load_schema("manifest").arrow.empty_table())  # type: ignore[return-value]


def ingest_logs(
    sources: Sequence[str | Path],
    store: Store,
    fmt: str | None = None,
    date: str | None = None,
    mapping: Path | None = None,
    progress: Progress | None = None,
) -> IngestSummary:
    """Ingest log files or directories into ``store``. See the module docstring for guarantees."""
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    if date is not None:
        check_date(date)
    if fmt is not None and fmt not in ALL_FORMATS:
        raise RooftraceError(f"unknown --format {fmt!r}; known: {', '.join(ALL_FORMATS)}")
    if mapping is not None:
        load_mapping(mapping, fmt if fmt in ("csv", "jsonl", "parquet") else None)  # fail fast
    ctx = Context(anchor_date=date)
    now = datetime.now(UTC)
    run_id = f"{now.strftime('%Y%m%dT%H%M%S')}-{time.perf_counter_ns() % 1_000_000:06d}"
    results: list[FileResult] = []
    with store.lock():
        _recover(store)
        stager = Stager(store.root / ".staging" / run_id)
        manifest = _read_manifest(store)
        known = set(manifest["content_sha256"].to_list())
        quarantines: dict[int, pl.DataFrame] = {}
        paths: list[Path] = []
        for src in sources:
            try:
                paths.extend(iter_files([Path(src)]))
            except SourceError as exc:
                results.append(FileResult(source_file=str(src), error=str(exc)))
                say(f"error: {exc}")
        for path in paths:
            res = FileResult(source_file=str(path))
            results.append(res)
            idx = len(results) - 1
            try:
                sha, stats = sha256_file(path)
                res.content_sha256 = sha
                if sha in known:
                    res.skipped = True
                    say(f"{path}: already ingested (same content), skipped")
                    continue
                spec = _resolve_spec(path, fmt, mapping)
                res.source_format = spec.name
                read, bad = _stage_file(path, spec, ctx, sha, stager, idx, stats)
                res.rows_read = read
                res.rows_quarantined = bad.height
                quarantines[idx] = bad
                known.add(sha)
                say(f"{path}: {spec.name}, {read} rows read, {bad.height} quarantined")
            except (SourceError, OSError) as exc:
                msg = str(exc) if isinstance(exc, SourceError) else f"{path}: {exc}"
                res.error = msg
                stager.drop(idx)
                say(f"error: {msg}")

        _merge(store, stager, results, run_id, say)
        _write_quarantine(store, results, quarantines, now)
        _write_manifest(store, manifest, results, now)
        shutil.rmtree(store.root / ".staging", ignore_errors=True)
    return IngestSummary(results, time.perf_counter() - t0)


#: Memory DuckDB may use to deduplicate, sort and write a date partition; beyond it DuckDB spills
#: to the staging folder, so a day of any size is merged in bounded memory.
MERGE_MEMORY = "512MB"


def _merge(store: Store, stager: Stager, results: list[FileResult], run_id: str, say: Progress) -> None:
    """Deduplicate the staged rows against the store and each other (first seen wins) and rewrite
    each touched date partition sorted by (arrival, source_file, source_line). DuckDB does the
    work out of core (memory_limit, spilling), so memory does not grow with the input."""
    frames = [f for fs in stager.memory.values() for f in fs]
    spilled = sorted(stager.root.glob("f*/batch-*.parquet"))
    if not frames and not spilled:
        return
    schema = load_schema("requests")
    cols = ", ".join(f'"{c}"' for c in schema.names)
    tmp = stager.root / "duckdb"
    tmp.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute(f"SET memory_limit = '{MERGE_MEMORY}'")
        con.execute(f"SET temp_directory = '{tmp}'")
        con.execute("SET enable_progress_bar = false")
        parts = []
        if frames:
            con.register("mem", pl.concat(frames, how="vertical").to_arrow())
            parts.append("SELECT * FROM mem")
        if spilled:
            files = ", ".join("'" + str(f).replace("'", "''") + "'" for f in spilled)
            parts.append(f"SELECT * FROM read_parquet([{files}])")
        # A view, not a table: the staged rows are read once per date, straight from memory and
        # the spilled files, and materialised only once deduplicated ("flagged").
        con.execute(
            "CREATE TEMP VIEW staged AS SELECT *, strftime(arrival, '%Y-%m-%d') AS _date FROM ("
            + " UNION ALL BY NAME ".join(parts)
            + ")"
        )
        dates = [r[0] for r in con.execute("SELECT DISTINCT _date FROM staged ORDER BY 1").fetchall()]
        for d in dates:
            existing = store.request_files(d) if (store.requests_dir / f"date={d}").exists() else []
            for p in existing:
                check_file_schema(p, "requests")  # schema check before merging
            old = ""
            if existing:
                files = ", ".join("'" + str(f).replace("'", "''") + "'" for f in existing)
                old = f"SELECT {cols}, -1 AS _file, -1 AS _seq, 0 AS _ord FROM read_parquet([{files}]) UNION ALL "
            con.execute(
                "CREATE OR REPLACE TEMP TABLE flagged AS SELECT *, row_number() OVER "
                "(PARTITION BY source_format, request_id ORDER BY _ord, _seq) = 1 AS _first FROM ("
                f"{old}SELECT {cols}, _file, _seq, 1 AS _ord FROM staged WHERE _date = ?)",
                [d],
            )
            counts = con.execute(
                "SELECT _file, count(*) FILTER (WHERE _first), count(*) FILTER (WHERE NOT _first) "
                "FROM flagged WHERE _ord = 1 GROUP BY _file"
            ).fetchall()
            for file_index, stored, dup in counts:
                res = results[int(file_index)]
                res.rows_stored += int(stored)
                res.rows_duplicate += int(dup)
                res.dates.append(d)
            kept = con.execute("SELECT count(*) FROM flagged WHERE _first").fetchall()[0][0]
            _swap_partition_sql(con, store.requests_dir, d, cols, run_id)
            say(f"requests/date={d}: {kept} rows")
    finally:
        con.close()


def _swap_partition_sql(con: duckdb.DuckDBPyConnection, table_dir: Path, date: str, cols: str, run_id: str) -> None:
    final = table_dir / f"date={date}"
    new = table_dir / f".date={date}.new-{run_id}"
    old = table_dir / f".date={date}.old-{run_id}"
    new.mkdir(parents=True, exist_ok=True)
    target = new / "part-00000.parquet"
    schema = load_schema("requests")
    meta = f"{{'rooftrace.schema': '{schema.name}', 'rooftrace.schema_version': '{schema.version}'}}"
    con.execute(
        f"COPY (SELECT {cols} FROM flagged WHERE _first ORDER BY arrival, source_file, source_line, request_id) "
        f"TO '{str(target).replace(chr(39), chr(39) * 2)}' "
        f"(FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1, ROW_GROUP_SIZE 1048576, KV_METADATA {meta})"
    )
    check_file_schema(target, "requests")  # the written file carries its schema and types
    if final.exists():
        final.rename(old)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _write_quarantine(
    store: Store, results: list[FileResult], quarantines: dict[int, pl.DataFrame], now: datetime
) -> None:
    for idx, bad in quarantines.items():
        res = results[idx]
        if not bad.height or res.content_sha256 is None:
            continue
        table = bad.select(
            pl.lit(res.source_format).alias("source_format"),
            pl.lit(res.source_file).alias("source_file"),
            pl.col("source_line"),
            pl.col("field"),
            pl.col("reason"),
            pl.col("raw"),
            pl.lit(now).cast(pl.Datetime("us", "UTC")).alias("ingested_at"),
        ).to_arrow()
        write_parquet(table, store.quarantine_dir / f"file={res.content_sha256[:16]}.parquet", "quarantine")


def _write_manifest(store: Store, manifest: pl.DataFrame, results: list[FileResult], now: datetime) -> None:
    rows = [
        {
            "source_file": r.source_file,
            "content_sha256": r.content_sha256,
            "source_format": r.source_format,
            "rows_read": r.rows_read,
            "rows_stored": r.rows_stored,
            "rows_quarantined": r.rows_quarantined,
            "rows_duplicate": r.rows_duplicate,
            "dates": sorted(set(r.dates)),
            "ingested_at": now,
        }
        for r in results
        if not r.skipped and not r.error and r.content_sha256 is not None
    ]
    if not rows:
        return
    add = pl.DataFrame(rows, schema=manifest.schema)
    out = pl.concat([manifest, add], how="vertical")
    table: pa.Table = out.to_arrow()
    write_parquet(table, store.manifest_path, "manifest")
