"""``ingest_logs``: source files -> STORE/requests (by arrival date), quarantine and manifest.

Guarantees (docs/limits.md):

- Accounting is exact per file: rows read = rows stored + rows quarantined + duplicates dropped.
- Files are named by their absolute path, ``.``/``..`` and links resolved
  (``source.file_identity``), in the manifest, the rows, the quarantine and messages.
- A file already ingested (same SHA-256) is skipped, unless ``force``: then it is read again and
  its earlier rows (every row stored from that file, and from another path whose every manifest
  entry has that content: the file renamed) are REPLACED by the new ones, with its manifest
  entries and quarantine records. A path ingested before with other content is read (its new
  rows added) and said: a note when it grew, a warning otherwise.
- Rows are deduplicated on (source_format, request_id) against the store and within the run,
  keeping the first seen; a duplicate whose values differ from the row kept is counted
  (``rows_conflicting``) and said, one warning per file. A record without an id gets one
  derived from its content and its occurrence in the file (``normalize.DerivedIds``), never from
  the whole file, so re-ingesting a log that has grown stores only its new records.
- A bad row that an earlier read of the same path (an entry of the manifest) quarantined, the
  same record at the same line (same format, line and raw text), is a duplicate of that read,
  not quarantined again (``_drop_quarantined_before``): over the reads of a growing log each bad
  line is quarantined once. With ``force`` the earlier reads' records are replaced instead.
- A file that cannot be read, or whose every row is quarantined (a wrong ``--format``, a wrong
  ``--date``), fails: one line naming it (and the commonest quarantine reason), exit 1, and it is
  not recorded in the manifest, so a corrected re-run ingests it. The quarantine records of an
  all-quarantined file are kept (to see why), and replaced when the file is ingested again.
  Anything else that goes wrong reading one file fails that file only: the other files of the
  command still ingest.
- Writes are all or nothing and readers never see a partial file (``Store.commit``): new
  partitions, quarantine files and the manifest are written under STORE/.staging/<run>/ and
  moved into place after a journal marks the commit point. A run killed before it leaves the
  store as it was; killed after it, the next run (or command opening the store) completes it.
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.common.errors import RooftraceError, SchemaError
from pipeline.common.schemas import META_NAME, META_VERSION, check_file_schema, load_schema, read_parquet, write_parquet
from pipeline.ingest.formats import ALL_FORMATS, FORMATS, Context, FormatSpec
from pipeline.ingest.mapping import load_mapping
from pipeline.ingest.normalize import DerivedIds, finalize, reason_kind, shift_occurrences
from pipeline.ingest.readers import (
    RAW_LIMIT,
    FastPathFailed,
    Prefetch,
    RawBatch,
    csv_batches,
    interrupted,
    jsonl_fast,
    jsonl_robust,
    otel_batches,
    parquet_batches,
)
from pipeline.ingest.source import (
    FAST_RECORD_BYTES,
    MAX_RECORD_BYTES,
    THREADS_ENV,
    FileDigest,
    SourceError,
    absolute_source,
    check_text,
    copy_range,
    fetch_lines,
    file_identity,
    iter_files,
    leading_nuls,
    logical_name,
    read_head,
    sniff_format,
)
from pipeline.ingest.store import COPY_OF, JOURNAL, Commit, Store, Unaccounted, check_date, store_write_error

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
    #: Stored rows of earlier ingests this file replaced (``force``).
    rows_replaced: int = 0
    #: Of ``rows_duplicate``, the rows whose request id was seen first with other content (a
    #: corrected or conflicting record: the first one seen is kept).
    rows_conflicting: int = 0
    #: Of ``rows_duplicate``, the rows dropped as a request already stored from another format
    #: (the same request id, arrival and tokens; ``dedupe_across_formats`` only).
    rows_cross_format: int = 0


@dataclass
class IngestSummary:
    files: list[FileResult]
    seconds: float
    #: ``warning:`` lines about the store as this run left it (requests stored under two formats).
    warnings: list[str] = field(default_factory=list)
    #: Rows stored that repeat a request stored from another format (same request id, arrival and
    #: tokens): each such request counts once more than it happened in classify and replay.
    cross_format_repeats: int = 0

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
        replaced = self.total("rows_replaced")
        conflicting = self.total("rows_conflicting")
        return (
            f"ingested {n_files} file(s) ({skipped} already ingested, {len(self.errors)} failed): "
            f"{self.total('rows_read')} rows read = {self.total('rows_stored')} stored + "
            f"{self.total('rows_quarantined')} quarantined + {self.total('rows_duplicate')} duplicates"
            + (f" ({conflicting} of them with other content than the row kept)" if conflicting else "")
            + (
                f" ({self.total('rows_cross_format')} of them a request stored from another format)"
                if self.total("rows_cross_format")
                else ""
            )
            + (f", replacing {replaced} rows stored before" if replaced else "")
            + f" in {self.seconds:.1f} s"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rows_read": self.total("rows_read"),
            "rows_stored": self.total("rows_stored"),
            "rows_quarantined": self.total("rows_quarantined"),
            "rows_duplicate": self.total("rows_duplicate"),
            "rows_replaced": self.total("rows_replaced"),
            "rows_conflicting": self.total("rows_conflicting"),
            "rows_cross_format": self.total("rows_cross_format"),
            "cross_format_repeats": self.cross_format_repeats,
            "warnings": list(self.warnings),
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "errors": self.errors,
            "files": [asdict(f) for f in self.files],
        }


#: Normalised rows are held in memory up to this size (polars' estimate; about 1.3 M rows of the
#: OpenAI shape), then spilled to the staging folder, so a huge input never needs memory in
#: proportion to its size.
STAGE_MEMORY_BYTES = 256 << 20
#: Most worker processes ``--jobs`` may ask for.
MAX_JOBS = 256


SortKey = tuple[Any, ...]


class Stager:
    """Holds normalised batches in reading order: in memory up to STAGE_MEMORY_BYTES, then on disk
    (one Parquet file per batch, named by its first ``_seq`` so a sorted listing is reading order).

    It also tracks whether the rows, in reading order, are already in partition order (SORT_KEYS):
    then a large merge can stream them to the partition without sorting."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.memory: dict[int, list[pl.DataFrame]] = {}
        self.bytes_in_memory = 0.0
        self.seq = 0
        self.in_order = True
        self._last: SortKey | None = None
        self._file_start: dict[int, tuple[bool, SortKey | None]] = {}

    def add(self, file_index: int, frame: pl.DataFrame) -> None:
        # _seq orders rows as they were read, so "keep the first duplicate" is well defined.
        frame = frame.with_columns(
            _file=pl.lit(file_index, pl.Int32),
            _seq=pl.int_range(self.seq, self.seq + frame.height, dtype=pl.Int64),
        )
        self.seq += frame.height
        self._file_start.setdefault(file_index, (self.in_order, self._last))
        if self.in_order and frame.height:
            keys = frame.select(SORT_KEYS)
            head, tail = keys.row(0), keys.row(frame.height - 1)
            self.in_order = (self._last is None or self._last <= head) and _is_sorted(keys, SORT_KEYS)
            self._last = tail
        size = frame.estimated_size()
        if self.bytes_in_memory + size <= STAGE_MEMORY_BYTES:
            self.memory.setdefault(file_index, []).append(frame)
            self.bytes_in_memory += size
            return
        self._spill(file_index, frame)

    def _spill(self, file_index: int, frame: pl.DataFrame) -> None:
        folder = self.root / f"f{file_index:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(folder / f"batch-{int(frame['_seq'][0]):012d}.parquet", compression="lz4")

    def flush(self) -> None:
        """Move the batches held in memory to disk, so that all staged rows are files."""
        for file_index, frames in self.memory.items():
            for frame in frames:
                self._spill(file_index, frame)
        self.memory.clear()
        self.bytes_in_memory = 0.0

    def drop(self, file_index: int) -> None:
        """Forget a file's rows (its read failed, or the fast path is being retried)."""
        self.bytes_in_memory -= sum(f.estimated_size() for f in self.memory.pop(file_index, []))
        shutil.rmtree(self.root / f"f{file_index:05d}", ignore_errors=True)
        if file_index in self._file_start:
            self.in_order, self._last = self._file_start.pop(file_index)

    def spilled_files(self) -> list[Path]:
        """Staging files in reading order (by the first ``_seq`` in their name, which grows across
        files and runs of any length)."""
        return sorted(self.root.glob("f*/batch-*.parquet"), key=lambda p: int(p.stem.removeprefix("batch-")))


#: Bytes read to detect a format, and how far detection may read when the first record is longer
#: (as far as the longest record ingest reads at all).
SNIFF_HEAD = 1 << 16
SNIFF_MAX = MAX_RECORD_BYTES


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
    head = read_head(path, SNIFF_HEAD)
    if head.startswith(b"PAR1"):  # a Parquet file by its magic number, whatever its name (x.parquet.1)
        raise SourceError(f"{path}: Parquet input needs --format parquet and a --mapping")
    check_text(path, head)
    skip = leading_nuls(path, head) or 0  # a zero-filled start (copytruncate): its text after it
    if skip:
        head = read_head(path, SNIFF_HEAD, skip)
    try:
        return FORMATS[sniff_format(path, head, whole=len(head) < SNIFF_HEAD)]
    except SourceError:
        if len(head) < SNIFF_HEAD:
            raise
        # The head may end inside the first record (a record over 64 KiB): look further.
        head = read_head(path, SNIFF_MAX, skip)
        return FORMATS[sniff_format(path, head, whole=len(head) < SNIFF_MAX)]


def _raw_batches(path: Path, spec: FormatSpec, size: int | None = None) -> Iterator[RawBatch]:
    """The file's raw batches by its reader; with ``size``, of its first ``size`` bytes (those its
    hash covers) for the line readers."""
    kind = spec.kind
    if kind in ("csv", "parquet") or kind == "otel":
        pass
    else:
        head = read_head(path)
        check_text(path, head)
    if kind == "csv_or_json":
        head = read_head(path, 4096).removeprefix(codecs.BOM_UTF8).lstrip()
        kind = "jsonl" if head[:1] in (b"{", b"[") else "csv"
    if kind == "csv":
        check_text(path, read_head(path))
        yield from csv_batches(path, spec, size)
    elif kind == "otel":
        check_text(path, read_head(path))
        yield from otel_batches(path, spec, size)
    elif kind == "parquet":
        yield from parquet_batches(path, spec)
    else:
        yield from jsonl_robust(path, spec, size)


class Sink(Protocol):
    """Where a file's normalised batches go: the run's Stager, or a worker's batch files."""

    def add(self, file_index: int, frame: pl.DataFrame) -> None: ...

    def drop(self, file_index: int) -> None: ...


class BatchFiles:
    """A worker process's sink: each batch as it came, one Arrow IPC file, in order; the parent
    feeds them to its Stager in file order, so a parallel run stages exactly what a serial one
    does (same rows, batches, order and ``_seq``). Uncompressed IPC: the batch crosses the
    process boundary as its own Arrow buffers, with no encoding to pay twice (Parquet with lz4
    cost the two processes ~0.1 s per 125,000 rows)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: list[Path] = []

    def add(self, file_index: int, frame: pl.DataFrame) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"batch-{len(self.files):06d}.arrow"
        frame.write_ipc(path, compression="uncompressed")
        self.files.append(path)

    def drop(self, file_index: int) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.files = []


def _stage_file(
    path: Path,
    spec: FormatSpec,
    ctx: Context,
    digest: FileDigest,
    stager: Sink,
    file_index: int,
    pre: Prefetch[RawBatch] | None = None,
    notes: list[str] | None = None,
) -> tuple[int, pl.DataFrame]:
    """Read, normalise and stage one file. Returns (rows read, quarantine frame). The digest may
    still be computing: the JSON fast path's final line check waits for its line count. ``pre``
    is the file's fast-path reader when it was started early (:class:`_Lookahead`). A mapped
    field with no value in any record is said in ``notes``."""
    if spec.relative_time and ctx.anchor_date is None:
        raise SourceError(f"{path}: {spec.name} timestamps are relative to the trace start; pass --date YYYY-MM-DD")
    seen: set[str] | None = set() if spec.mapped else None
    if spec.kind == "jsonl":
        try:
            fast = pre if pre is not None else jsonl_fast(path, spec, digest.stats, size=digest.size)
            read, bad_frames = _stage_batches(path, spec, ctx, stager, file_index, fast, seen=seen)
        except FastPathFailed:
            stager.drop(file_index)
            seen = set() if spec.mapped else None
            raw = _raw_batches(path, spec, digest.size)
            read, bad_frames = _stage_batches(path, spec, ctx, stager, file_index, raw, seen=seen)
    else:
        raw = _raw_batches(path, spec, digest.size)
        read, bad_frames = _stage_batches(path, spec, ctx, stager, file_index, raw, seen=seen)
    if seen is not None and notes is not None and read:
        for name in spec.fields:
            if name not in seen:
                notes.append(
                    f"warning: {path}: the mapping's column {spec.labels.get(name, name)!r} has no value in any "
                    "record (check its spelling)"
                )
    return read, _quarantine_frame(path, spec, bad_frames)


def _stage_batches(
    path: Path,
    spec: FormatSpec,
    ctx: Context,
    stager: Sink,
    file_index: int,
    batches: Iterator[RawBatch],
    derived: DerivedIds | None = None,
    seen: set[str] | None = None,
) -> tuple[int, list[pl.DataFrame]]:
    """Normalise ``batches`` (read from ``path``, or from a piece of it) in reading order and stage
    their good rows. Returns (rows read, quarantine frames). Derived ids count occurrences from
    the first batch, in ``derived`` when given (a fresh count otherwise). ``seen`` collects the
    raw columns that had a value in some record."""
    read = 0
    bad_frames: list[pl.DataFrame] = []
    ids = derived if derived is not None else DerivedIds()
    try:
        for batch in batches:
            read += batch.frame.height + len(batch.failures)
            if seen is not None:
                frame = batch.frame
                seen.update(
                    c for c in frame.columns if c not in seen and frame.get_column(c).null_count() < frame.height
                )
            bad = _stage_batch(path, spec, ctx, stager, file_index, batch, ids)
            if bad.height:
                bad_frames.append(bad)
    finally:
        ids.close()
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a reader stopped early (an error here, Ctrl-C) stops now, not at exit
    return read, bad_frames


_BAD_SCHEMA = {"source_line": pl.Int64, "field": pl.String, "reason": pl.String, "raw": pl.String}


def _stage_batch(
    path: Path, spec: FormatSpec, ctx: Context, stager: Sink, file_index: int, batch: RawBatch, derived: DerivedIds
) -> pl.DataFrame:
    cand = spec.post(batch.frame, ctx).with_columns(batch.frame["source_line"])
    if "_where" in batch.frame.columns:  # an OTel span's label and place, for its quarantine record
        cand = cand.with_columns(batch.frame["_where"], batch.frame["_span"])
    norm = finalize(
        cand,
        source_format=spec.name,
        source_file=str(path),
        derived_ids=derived,
        labels=spec.labels,
        input_excludes_cache=spec.input_excludes_cache,
    )
    if norm.good.height:
        stager.add(file_index, norm.good)
    if "_span" in norm.bad.columns:  # an OTel span's raw text: its own JSON
        text = batch.span_text
        raws = [text(n, at) if text is not None else None for n, at in norm.bad.select("source_line", "_span").rows()]
        bad = norm.bad.drop("_span").with_columns(raw=pl.Series(raws, dtype=pl.String))
    else:
        bad = norm.bad.with_columns(raw=pl.lit(None, dtype=pl.String))
    if spec.kind == "parquet" and bad.height:
        raw = pl.struct(pl.all().exclude("source_line")).struct.json_encode()
        raw_json = batch.frame.select("source_line", raw=raw)
        bad = bad.drop("raw").join(raw_json, on="source_line", how="left")
    if batch.failures:
        fail = pl.DataFrame(
            {
                "source_line": [f[0] for f in batch.failures],
                "field": batch.failure_field_list
                if batch.failure_field_list is not None
                else [batch.failure_fields.get(f[0]) for f in batch.failures],
                "reason": [f[1] for f in batch.failures],
                "raw": [f[2] for f in batch.failures],
            },
            schema=_BAD_SCHEMA,
        )
        bad = pl.concat([fail, bad])
    return bad


def _quarantine_frame(path: Path, spec: FormatSpec, bad_frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The quarantine rows of a read, in line order, with each line's raw text (read back from
    ``path`` where the reader did not keep it)."""
    bad = pl.concat(bad_frames) if bad_frames else pl.DataFrame(schema=_BAD_SCHEMA)
    missing_raw = bad.filter(pl.col("raw").is_null())
    if missing_raw.height and spec.kind != "parquet":
        texts = fetch_lines(path, set(missing_raw["source_line"].to_list()), RAW_LIMIT)
        bad = bad.with_columns(
            raw=pl.coalesce(
                pl.col("raw"),
                pl.col("source_line").replace_strict(texts, default=None, return_dtype=pl.String),
            )
        )
    return bad.with_columns(pl.col("raw").fill_null("")).sort("source_line", maintain_order=True)


#: What identifies a quarantined row across reads of one path: the reader, the line and the raw
#: text (as stored: the first RAW_LIMIT bytes). The quarantine keeps no hash of the whole record.
_QUARANTINE_IDENTITY = ("source_format", "source_line", "raw")


def _quarantined_before(store: Store, manifest: pl.DataFrame, path: str) -> pl.DataFrame:
    """The quarantine records (``_QUARANTINE_IDENTITY``, unique) that the manifest's reads of
    ``path`` left: those of each of its contents' quarantine files that name ``path``. A read
    that failed (every row quarantined) is not in the manifest and does not count. A quarantine
    file that cannot be read counts as none (its rows are then quarantined again)."""
    schema = dict(zip(_QUARANTINE_IDENTITY, (pl.String, pl.Int64, pl.String), strict=True))
    frames: list[pl.DataFrame] = []
    shas = manifest.filter(pl.col("source_file") == path)["content_sha256"].unique().sort().to_list()
    for sha in shas:
        target = store.quarantine_dir / f"file={str(sha)[:16]}.parquet"
        if not target.is_file():
            continue
        try:
            got = pl.from_arrow(read_parquet(target, "quarantine"))
        except (RooftraceError, OSError, pa.ArrowException):
            continue
        assert isinstance(got, pl.DataFrame)
        frames.append(got.filter(pl.col("source_file") == path).select(list(schema)))
    if not frames:
        return pl.DataFrame(schema=schema)
    return pl.concat(frames).unique(maintain_order=True)


def _drop_quarantined_before(bad: pl.DataFrame, source_format: str, before: pl.DataFrame) -> pl.DataFrame:
    """``bad`` (a read's quarantine rows, in line order) less the rows ``before`` (an earlier read
    of the same path) quarantined already: the same format, line and raw text."""
    if not bad.height or not before.height:
        return bad
    earlier = (
        before.filter(pl.col("source_format") == source_format)
        .select("source_line", "raw")
        .unique()
        .with_columns(_again=pl.lit(True))
    )
    marked = bad.join(earlier, on=["source_line", "raw"], how="left", maintain_order="left")
    return marked.filter(pl.col("_again").is_null()).drop("_again")


def _read_message(path: Path, source_format: str | None, read: int, quarantined: int, again: int = 0) -> str:
    """The line said of each file read: its format, rows read and quarantined (and the bad rows an
    earlier read of the path quarantined already, counted as duplicates)."""
    return f"{path}: {source_format}, {read} rows read, {quarantined} quarantined" + (
        f", {again} already quarantined by an earlier read of this file (counted as duplicates)" if again else ""
    )


def _read_manifest(store: Store) -> pl.DataFrame:
    if store.manifest_path.exists():
        got = pl.from_arrow(read_parquet(store.manifest_path, "manifest"))
        assert isinstance(got, pl.DataFrame)
        return got
    return pl.from_arrow(load_schema("manifest").arrow.empty_table())  # type: ignore[return-value]


@dataclass
class _Replace:
    """What ``force`` replaces: the stored rows from these source files (on these dates), their
    manifest entries and the quarantine files of these contents."""

    files: set[str] = field(default_factory=set)
    dates: set[str] = field(default_factory=set)
    shas: set[str] = field(default_factory=set)
    owner: dict[str, int] = field(default_factory=dict)  # source file -> result it is replaced by
    force: bool = False
    on_date: dict[str, set[str]] = field(default_factory=dict)  # date -> manifest files stored on it
    dropped: dict[str, list[Path]] = field(default_factory=dict)  # date -> unreadable files rebuilt
    # date -> its files held rows the manifest does not count; rebuilt (all its files in dropped)
    unaccounted: dict[str, Unaccounted] = field(default_factory=dict)
    results: list[FileResult] = field(default_factory=list)  # the run's results (to credit)

    def credit(self, results: list[FileResult], removed: Sequence[tuple[Any, Any]]) -> None:
        """Count (source file, rows) removed from the store to the files that replace them."""
        for source_file, n in removed:
            results[self.owner[str(source_file)]].rows_replaced += int(n)


def _replaced(manifest: pl.DataFrame, results: list[FileResult], force: bool) -> _Replace:
    """With ``force``: the earlier ingests each re-read file replaces, from the manifest: every
    entry of its own path (whatever content that path had), and the entries of another path only
    when each of them has this file's content (the same file renamed or copied): a path that also
    stored other content keeps its rows, which are not this file's to replace."""
    rep = _Replace(force=force, results=results)
    for path, dates in zip(manifest["source_file"].to_list(), manifest["dates"].to_list(), strict=True):
        for d in dates or []:
            rep.on_date.setdefault(d, set()).add(path)
    if not force:
        return rep
    shas_of: dict[str, set[str]] = {}
    paths_with: dict[str, set[str]] = {}
    for path, sha in zip(manifest["source_file"].to_list(), manifest["content_sha256"].to_list(), strict=True):
        shas_of.setdefault(path, set()).add(sha)
        paths_with.setdefault(sha, set()).add(path)
    for idx, res in enumerate(results):
        if res.skipped or res.error or res.content_sha256 is None:
            continue
        sha = res.content_sha256
        mine = {p for p in paths_with.get(sha, set()) if shas_of[p] == {sha}}
        if res.source_file in shas_of:
            mine.add(res.source_file)
        if not mine:
            continue
        same = manifest.filter(pl.col("source_file").is_in(sorted(mine)))
        for source_file in sorted(mine):
            rep.files.add(source_file)
            rep.owner.setdefault(source_file, idx)
        rep.dates.update(d for ds in same["dates"].to_list() for d in ds)
        rep.shas.update(same["content_sha256"].to_list())
    return rep


@dataclass
class _Conflicts:
    """Rows dropped as duplicates whose request id was first seen with other content, per file
    (result index): how many, and the first of them in reading order (its ``_seq``, request id and
    line, and the file and line of the row kept)."""

    counts: dict[int, int] = field(default_factory=dict)
    first: dict[int, tuple[int, str, int, str, int]] = field(default_factory=dict)

    def add(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """(file index, count, _seq, request id, line, kept file, kept line) of the first one."""
        for f, n, seq, rid, line, kept_file, kept_line in rows:
            idx = int(f)
            self.counts[idx] = self.counts.get(idx, 0) + int(n)
            if idx not in self.first or int(seq) < self.first[idx][0]:
                self.first[idx] = (int(seq), str(rid), int(line), str(kept_file), int(kept_line))

    def line(self, idx: int, path: str) -> str | None:
        n = self.counts.get(idx, 0)
        if not n:
            return None
        _, rid, line, kept_file, kept_line = self.first[idx]
        if kept_file != path:
            where = f"{kept_file} line {kept_line}"
        elif kept_line < line:  # an earlier line of this read
            where = f"line {kept_line} of this file"
        else:  # the same line, or a later one: this file's content as an earlier ingest read it
            where = f"line {kept_line} of this file as an earlier ingest read it"
        return (
            f"warning: {path}: {n} row(s) have a request id seen before with other content: dropped as "
            f"duplicates, the first seen kept; e.g. id {rid!r} at line {line} here, kept from {where}"
        )


#: The columns that make rows of two formats one request: a gateway's response log and its OTel
#: spans (or LiteLLM's SpendLogs) of the same calls carry the same request id, arrival and tokens.
CROSS_FORMAT_KEY = ("request_id", "arrival", "recorded_input_tokens", "output_tokens")


@dataclass
class _Across:
    """Requests logged in two formats (the same ``CROSS_FORMAT_KEY``, another ``source_format``):
    with ``dedupe`` the rows read after the first of such a request are dropped as duplicates of
    their file (``FileResult.rows_cross_format``); the rows that stay stored twice are counted per
    date, for one warning each."""

    dedupe: bool = False
    #: date -> (rows left that repeat a request of another format, the formats of those requests)
    left: dict[str, tuple[int, set[str]]] = field(default_factory=dict)

    def note(self, date: str, repeats: int, formats: set[str]) -> None:
        if repeats:
            self.left[date] = (repeats, formats)

    @property
    def repeats(self) -> int:
        return sum(n for n, _ in self.left.values())

    def lines(self) -> list[str]:
        out = []
        for d, (n, formats) in sorted(self.left.items()):
            out.append(
                f"warning: requests/date={d}: {n} request(s) are stored twice, logged in two formats "
                f"({', '.join(sorted(formats))}: the same request id, arrival and tokens); classify and replay "
                "count each of them twice -- ingest with --dedupe-across-formats to store each request once "
                "(stored rows stay: ingest the later format's logs again with --force --dedupe-across-formats)"
            )
        return out


def _cross_format(rows: pl.DataFrame, first: pl.Series) -> tuple[pl.Series, set[str]]:
    """Of ``rows`` (a date's stored rows, then its staged rows in reading order), the rows kept by
    the per-format key (``first``) that repeat an earlier kept row's ``CROSS_FORMAT_KEY`` (so
    under another format: the per-format key is unique among kept rows), and the formats of the
    requests so repeated."""
    if rows["source_format"].n_unique() < 2:  # one format: no request can be logged in two
        return pl.repeat(False, rows.height, dtype=pl.Boolean, eager=True), set()
    frame = rows.select("source_format", _k=pl.struct(CROSS_FORMAT_KEY), _f=first)
    marks = frame.select(
        again=pl.col("_f") & ~pl.col("_k").is_first_distinct().over("_f"),
        twice=pl.col("_f") & pl.col("_k").is_duplicated().over("_f"),
    )
    formats = set(frame.filter(marks["twice"])["source_format"].to_list())
    return marks["again"], formats


#: Columns that say where a row came from, not what it is: two rows with the same key that differ
#: only in these are the same record (a grown or copied log), not a conflict.
_WHERE_FROM = ("source_format", "request_id", "source_file", "source_line")


def _content_columns(names: Sequence[str]) -> list[str]:
    return [c for c in names if c not in _WHERE_FROM]


def _clashes(rows: pl.DataFrame, first: pl.Series, files: pl.Series, seqs: pl.Series) -> list[tuple[Any, ...]]:
    """The rows of ``rows`` (a date's stored rows, then its staged rows in reading order) dropped
    as duplicates whose content differs from their key's first row, as :meth:`_Conflicts.add`
    takes them. ``files`` and ``seqs`` are each row's file index and ``_seq`` (-1 when stored)."""
    keys = ["source_format", "request_id"]
    content = pl.struct(_content_columns(rows.columns))
    frame = rows.with_columns(_file=files, _seq=seqs, _first=first)
    repeated = frame.filter(pl.struct(keys).is_duplicated()).with_columns(_c=content)
    clash = repeated.with_columns(
        _c0=pl.col("_c").first().over(keys),
        _f0=pl.col("source_file").first().over(keys),
        _l0=pl.col("source_line").first().over(keys),
    ).filter(~pl.col("_first") & pl.col("_c").ne_missing(pl.col("_c0")))
    if not clash.height:
        return []
    return (
        clash.sort("_seq")
        .group_by("_file", maintain_order=True)
        .agg(
            pl.len(),
            pl.col("_seq").first(),
            pl.col("request_id").first(),
            pl.col("source_line").first(),
            pl.col("_f0").first(),
            pl.col("_l0").first(),
        )
        .rows()
    )


def _after_merge_lines(
    manifest: pl.DataFrame,
    results: list[FileResult],
    conflicts: _Conflicts,
    force: bool,
    requarantined: dict[int, int] | None = None,
) -> list[str]:
    """What to say of each file once it is merged: that its path was ingested before with other
    content (not with ``force``, which replaced that), and its conflicting duplicates.
    ``requarantined`` counts, per file, its duplicates that are bad rows an earlier read of the
    path quarantined."""
    last: dict[str, dict[str, Any]] = {}
    again_bad = requarantined or {}
    if not force:
        columns = ("source_file", "content_sha256", "rows_read", "rows_stored", "rows_duplicate")
        for entry in manifest.select(columns).iter_rows(named=True):
            last[entry["source_file"]] = entry  # the path's latest read (entries are appended)
    out: list[str] = []
    for idx, res in enumerate(results):
        res.rows_conflicting = conflicts.counts.get(idx, 0)
        if res.skipped or res.error or res.content_sha256 is None:
            continue
        before = last.get(res.source_file)
        if before is not None and before["content_sha256"] != res.content_sha256:
            out.append(_changed_line(res, before, again_bad.get(idx, 0)))
        clash = conflicts.line(idx, res.source_file)
        if clash is not None:
            out.append(clash)
    return out


def _changed_line(res: FileResult, before: dict[str, Any], bad_again: int = 0) -> str:
    """One line for a path ingested before with other content: it grew (every row the earlier read
    read is read again, unchanged: its kept rows as duplicates, its quarantined rows as the same
    bad rows, ``bad_again`` of this read's duplicates), it is a new log under the name (none of
    the rows the earlier read kept), or it changed, and ``--force`` replaces what the earlier
    read stored."""
    kept_before = int(before["rows_stored"]) + int(before["rows_duplicate"])
    again = res.rows_duplicate - res.rows_conflicting
    if again - bad_again == 0 and kept_before > 0:  # none of the earlier rows: a log name reused (rotated daily)
        return (
            f"{res.source_file}: new content under a name ingested before (none of the earlier read's "
            f"{kept_before} row(s) is in it): read as a new log, the earlier rows stay (--force would replace "
            "every earlier read of this name)"
        )
    if again - bad_again >= kept_before:  # every row the earlier read kept is back: it grew
        return (
            f"{res.source_file}: grew since it was ingested ({again} earlier row(s) read again as "
            f"duplicates, {res.rows_stored} new row(s) stored)"
        )
    return (
        f"warning: {res.source_file}: ingested before with other content (that read stored "
        f"{before['rows_stored']} row(s)); this read adds {res.rows_stored} new row(s) to them "
        f"({res.rows_duplicate} duplicate(s)); if the file was corrected rather than appended to, ingest it "
        "with --force to replace what the earlier read stored"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def file_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised while one file was read, fails that file alone: any error, and a
    Rust panic inside polars or pyarrow (pyo3's ``PanicException`` derives from BaseException,
    so ``except Exception`` let it end the whole run, and a worker process could not even send
    it back: a PicklingError). Ctrl-C and an exit request stop the run."""
    return not isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit)


def _internal_error(path: Path, exc: BaseException) -> str:
    """The one line said of a file that failed on something unexpected (an internal error): the
    same in a serial run and in a worker process."""
    return f"{path}: cannot ingest ({type(exc).__name__}: {_first_line(exc)})"


def _all_quarantined(path: Path, bad: pl.DataFrame) -> str:
    """The one-line error for a file whose every row was quarantined: the commonest kind of
    reason, how many rows have it and the first of them."""
    reasons = bad["reason"].to_list()
    lines = bad["source_line"].to_list()
    kinds = Counter(reason_kind(r) for r in reasons)
    kind, k = kinds.most_common(1)[0]
    at = next(i for i, r in enumerate(reasons) if reason_kind(r) == kind)
    example = " ".join(reasons[at].split())
    if len(example) > 200:
        example = example[:199] + "…"
    n = len(reasons)
    return (
        f"{path}: all {n:,} rows quarantined, none stored (commonest reason, {k:,} of {n:,} rows, "
        f"first at line {lines[at]}: {example}); not recorded as ingested: check --format, --date "
        "or --mapping and run again"
    )


def ingest_logs(
    sources: Sequence[str | Path],
    store: Store,
    fmt: str | None = None,
    date: str | None = None,
    mapping: Path | None = None,
    progress: Progress | None = None,
    force: bool = False,
    jobs: int = 1,
    dedupe_across_formats: bool = False,
) -> IngestSummary:
    """Ingest log files or directories into ``store``. See the module docstring for guarantees;
    ``force`` re-reads files already ingested and replaces their rows; ``jobs`` > 1 reads the
    files in that many worker processes (the store ends byte-identical to a serial run's);
    ``dedupe_across_formats`` stores a request logged in two formats (the same request id,
    arrival and tokens) once, the first read, and counts the other rows as duplicates."""
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    if any(isinstance(src, str) and src == "" for src in sources):
        raise RooftraceError(
            "an empty SOURCE ('') names no file (it would read the whole current folder); "
            "name a file or folder ('.' for the current folder)"
        )
    if date is not None:
        check_date(date)
    if fmt is not None and fmt not in ALL_FORMATS:
        raise RooftraceError(f"unknown --format {fmt!r}; known: {', '.join(ALL_FORMATS)}")
    if mapping is not None:
        load_mapping(mapping, fmt if fmt in ("csv", "jsonl", "parquet") else None)  # fail fast
    elif fmt in ("csv", "jsonl", "parquet"):  # a usage error, not one per file
        raise RooftraceError(f"--format {fmt} needs --mapping FILE (a TOML column mapping)")
    if not 1 <= jobs <= MAX_JOBS:
        raise RooftraceError(f"--jobs must be in 1..{MAX_JOBS}, got {jobs}")
    ctx = Context(anchor_date=date)
    across = _Across(dedupe=dedupe_across_formats)
    now = datetime.now(UTC)
    run_id = f"{now.strftime('%Y%m%dT%H%M%S')}-{time.perf_counter_ns() % 1_000_000:06d}"
    with store.lock():  # taking it finishes or undoes what a killed run left
        commit = store.commit(run_id)
        try:
            commit.root.mkdir(parents=True)
        except OSError as exc:
            raise store_write_error(store, exc) from None
        try:
            results = _ingest_locked(sources, store, commit, fmt, mapping, ctx, now, force, say, jobs, across)
        finally:
            if not (commit.root / JOURNAL).exists():  # else a failed commit is rolled forward later
                shutil.rmtree(commit.root, ignore_errors=True)
                with contextlib.suppress(OSError):
                    store.staging_dir.rmdir()
    return IngestSummary(results, time.perf_counter() - t0, across.lines(), across.repeats)


def _ingest_locked(
    sources: Sequence[str | Path],
    store: Store,
    commit: Commit,
    fmt: str | None,
    mapping: Path | None,
    ctx: Context,
    now: datetime,
    force: bool,
    say: Progress,
    jobs: int = 1,
    across: _Across | None = None,
) -> list[FileResult]:
    results: list[FileResult] = []
    stager = Stager(commit.root)
    manifest = _read_manifest(store)
    known = set() if force else set(manifest["content_sha256"].to_list())
    seen_paths = set(manifest["source_file"].to_list())
    in_manifest = set() if force else set(seen_paths)  # with force, earlier reads are replaced
    quarantines: dict[int, pl.DataFrame] = {}
    requarantined: dict[int, int] = {}  # file -> its bad rows quarantined by an earlier read
    paths: list[Path] = []
    for src in sources:
        # Files are named by their absolute, link-free path (file_identity) everywhere: the same
        # relative path typed in two folders is two files, two spellings of one file are one.
        where = absolute_source(src)
        try:
            for path in iter_files([where], skipped=say, exclude=store.root):
                paths.append(file_identity(path))
        except SourceError as exc:
            results.append(FileResult(source_file=str(where), error=str(exc)))
            say(f"error: {exc}")
    first = len(results)
    seen: list[bool] = []
    for path in paths:
        seen.append(str(path) in seen_paths)
        seen_paths.add(str(path))
    plans = [_split_plan(path, seen[k], fmt, mapping, ctx, jobs) for k, path in enumerate(paths)]
    if jobs > 1 and (len(paths) > 1 or plans[0] is not None):
        outcomes: Iterator[_Outcome] = _read_parallel(paths, plans, seen, first, fmt, mapping, ctx, known, commit, jobs)
    else:
        ahead = _Lookahead(paths, seen, fmt, mapping)
        outcomes = _read_serial(paths, first, fmt, mapping, ctx, known, seen, stager, ahead)
    tick = _Ticker(len(paths), say)
    for k, out in enumerate(outcomes):
        idx = first + k
        results.append(out.res)
        tick.file_done(out.res.rows_read)
        if out.bad is not None:
            quarantines[idx] = out.bad  # kept even when the file fails, to see why
        if out.batches is not None and out.ok and out.res.content_sha256 in known:
            # the same content as a file read earlier in this run (a parallel reader cannot know)
            out.res.skipped, out.res.rows_read, out.res.rows_quarantined = True, 0, 0
            if seen[k]:  # a serial run hashes a path it has seen first and skips before parsing
                out.res.source_format = None
            quarantines.pop(idx, None)
            out.messages[-1:] = [_skipped_line(paths[k])]
        else:
            if out.ok and out.bad is not None and out.bad.height and out.res.source_file in in_manifest:
                again = _count_quarantined_before(out, _quarantined_before(store, manifest, out.res.source_file))
                if again:
                    quarantines[idx], requarantined[idx] = out.bad, again
            if out.batches is not None and out.ok:
                for j, batch in enumerate(out.batches):
                    stager.add(idx, _load_batch(batch, out.shifts[j] if out.shifts else None))
        for folder in {b.parent for b in out.batches or []}:
            shutil.rmtree(folder, ignore_errors=True)
        if out.ok:
            known.add(str(out.res.content_sha256))
        for line in out.messages:
            say(line)

    replace = _replaced(manifest, results, force)
    conflicts = _Conflicts()
    try:
        _merge(store, stager, commit, results, say, replace, conflicts, across)
        _write_quarantine(store, commit, manifest, results, quarantines, now, replace)
        _write_manifest(store, commit, manifest, results, now, replace)
        commit.apply()
    except OSError as exc:
        raise store_write_error(store, exc) from None
    except (duckdb.Error, pl.exceptions.PolarsError) as exc:
        raise RooftraceError(f"{store.root}: cannot merge into the store ({_first_line(exc)})") from None
    for line in _after_merge_lines(manifest, results, conflicts, force, requarantined):
        say(line)
    for line in across.lines() if across is not None else []:
        say(line)
    return results


#: Seconds between the progress lines of a run of many files.
PROGRESS_EVERY_S = 5.0


class _Ticker:
    """A line on ``say`` every PROGRESS_EVERY_S seconds while the files of a run of more than one
    are read (files done of all, rows read, time so far): a day of thousands of small files
    otherwise ran for minutes with no word of how far it was."""

    def __init__(self, total: int, say: Progress) -> None:
        self.total, self.say = total, say
        self.done = self.rows = 0
        self.start = self.last = time.monotonic()

    def file_done(self, rows: int) -> None:
        self.done += 1
        self.rows += rows
        now = time.monotonic()
        if self.total > 1 and self.done < self.total and now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            self.say(
                f"ingest: {self.done:,} of {self.total:,} files read ({self.rows:,} rows), "
                f"{now - self.start:.0f} s elapsed"
            )


@dataclass
class _Outcome:
    """One file read: its result, its quarantine rows, what to say, and (parallel runs) the
    batch files a worker staged."""

    res: FileResult
    bad: pl.DataFrame | None = None
    messages: list[str] = field(default_factory=list)
    batches: list[Path] | None = None
    shifts: list[_Shift] | None = None  # per batch, for a file read as pieces

    @property
    def ok(self) -> bool:
        """Read and kept: its rows go to the store."""
        return not self.res.skipped and self.res.error is None and self.res.content_sha256 is not None


def _count_quarantined_before(out: _Outcome, before: pl.DataFrame) -> int:
    """Count the bad rows of ``out`` that an earlier read of its path quarantined (``before``) as
    duplicates of that read, and keep them out of its quarantine rows (and its read line).
    Returns how many."""
    assert out.bad is not None
    res = out.res
    left = _drop_quarantined_before(out.bad, str(res.source_format), before)
    again = out.bad.height - left.height
    if not again:
        return 0
    said = _read_message(Path(res.source_file), res.source_format, res.rows_read, res.rows_quarantined)
    out.bad = left
    res.rows_quarantined -= again
    res.rows_duplicate += again
    now = _read_message(Path(res.source_file), res.source_format, res.rows_read, res.rows_quarantined, again)
    out.messages = [now if m == said else m for m in out.messages]
    return again


class _Lookahead:
    """A serial run's next file, when it is a small or compressed JSON Lines file, already being
    parsed by DuckDB while this one is normalised. DuckDB parses a plain file under
    FAST_RECORD_BYTES, and a compressed file of any size (one decompression stream), on one
    thread, so a day of such files otherwise left a core idle between files. The early
    reader is the fast path's own (same batches, so the same store); it counts the file's lines
    itself. Its file's read takes it over only for the format that read resolves; a file that is
    skipped, fails first or resolves another format has it closed."""

    def __init__(self, paths: list[Path], seen: list[bool], fmt: str | None, mapping: Path | None) -> None:
        self.paths, self.seen, self.fmt, self.mapping = paths, seen, fmt, mapping
        self.started: dict[int, tuple[str, int, Prefetch[RawBatch]]] = {}

    def _start(self, k: int) -> None:
        if k >= len(self.paths) or self.seen[k] or k in self.started:
            return  # (a path seen before is hashed first, most likely to be skipped)
        path = self.paths[k]
        try:
            if not path.is_file():
                return
            if logical_name(path) == path.name and path.stat().st_size >= FAST_RECORD_BYTES:
                return  # a large plain file: DuckDB uses every core on it
            spec = _resolve_spec(path, self.fmt, self.mapping)
        except BaseException as exc:  # the file's own read reports why
            if not file_failure(exc):
                raise
            return
        if spec.kind == "jsonl":
            size = path.stat().st_size
            self.started[k] = (spec.name, size, jsonl_fast(path, spec, size=size))

    def next_after(self, k: int) -> Callable[[FormatSpec], Prefetch[RawBatch] | None]:
        """Start file ``k + 1``'s reader; file ``k``'s early reader, if any, for its read (its
        ``size`` says the bytes it reads: the read takes it only for the size it hashes)."""
        self._start(k + 1)

        def take(spec: FormatSpec) -> Prefetch[RawBatch] | None:
            name, _, reader = self.started.pop(k, (None, None, None))
            if reader is not None and name != spec.name:
                reader.close()
                return None
            return reader

        return take

    def close(self) -> None:
        for _, _, reader in self.started.values():
            reader.close()
        self.started.clear()


def _read_serial(
    paths: list[Path],
    first: int,
    fmt: str | None,
    mapping: Path | None,
    ctx: Context,
    known: set[str],
    seen: list[bool],
    stager: Stager,
    ahead: _Lookahead,
) -> Iterator[_Outcome]:
    """Each file read in this process, in order, the next small one read ahead; whatever stops
    the run (an error, Ctrl-C) stops the reader ahead too."""
    try:
        for k, path in enumerate(paths):
            yield _read_one(path, first + k, fmt, mapping, ctx, known, seen[k], stager, ahead.next_after(k))
    finally:
        ahead.close()


def _skipped_line(path: Path) -> str:
    return (
        f"{path}: already ingested (the same content as a file of this run or an earlier one), skipped; "
        "--force re-reads what an earlier run ingested"
    )


def _read_one(
    path: Path,
    idx: int,
    fmt: str | None,
    mapping: Path | None,
    ctx: Context,
    known: set[str],
    seen_before: bool,
    sink: Sink,
    ahead: Callable[[FormatSpec], Prefetch[RawBatch] | None] | None = None,
) -> _Outcome:
    """Read, normalise and stage one file into ``sink``; any failure is the file's alone.
    ``ahead`` hands over the file's JSON fast-path reader when one was started early."""
    out = _Outcome(FileResult(source_file=str(path)))
    pre: Prefetch[RawBatch] | None = None
    res = out.res
    digest: FileDigest | None = None
    try:
        # A path seen before is most likely the same content again (a re-run): hash it first,
        # so skipping it costs one read. A new path is hashed on a worker thread while it is
        # parsed; if its content turns out to be known after all, its rows are dropped and it
        # is skipped just the same.
        # The bytes read are the file's first ``size`` (its size now): its rows and its hash then
        # cover the same bytes even when it grows meanwhile (a live log), and the next run sees
        # it as grown and stores the lines appended since (a hash of more bytes than were read
        # made the next run skip them as "already ingested").
        size = _file_size(path)
        digest = FileDigest(path, background=not seen_before, size=size, shrink_ok=True)
        if not digest.background and digest.sha() in known:
            res.content_sha256 = digest.sha()
            res.skipped = True
            out.messages.append(_skipped_line(path))
            return out
        spec = _resolve_spec(path, fmt, mapping)
        res.source_format = spec.name
        pre = ahead(spec) if ahead is not None else None
        if pre is not None and pre.size != size:  # grew since its early reader began: read it again
            pre.close()
            pre = None
        notes: list[str] = []
        read, bad = _stage_file(path, spec, ctx, digest, sink, idx, pre, notes)
        sha = res.content_sha256 = digest.sha()
        if sha in known:
            sink.drop(idx)
            res.skipped = True
            out.messages.append(_skipped_line(path))
            return out
        res.rows_read = read
        res.rows_quarantined = bad.height
        out.bad = bad
        if read and bad.height == read:
            sink.drop(idx)
            res.error = _all_quarantined(path, bad)
            out.messages.append(f"error: {res.error}")
            return out
        out.messages.append(_read_message(path, spec.name, read, bad.height))
        out.messages += notes
    except (SourceError, OSError) as exc:
        msg = str(exc) if isinstance(exc, SourceError) else f"{path}: {exc}"
        res.error = msg
        sink.drop(idx)
        out.messages.append(f"error: {msg}")
    except BaseException as exc:  # one file's failure, whatever it is, must not lose the others
        if not file_failure(exc):
            raise
        if interrupted(exc):  # Ctrl-C inside DuckDB's read: the run stops, not this file alone
            raise KeyboardInterrupt from None
        res.error = _internal_error(path, exc)
        sink.drop(idx)
        out.messages.append(f"error: {res.error}")
    finally:
        if digest is not None:
            digest.close()  # a hash still running for a failed file stops here
        if pre is not None:
            pre.close()  # (read to the end already, unless the file failed first)
    return out


def _file_size(path: Path) -> int | None:
    """The file's size as stored (None when it cannot be said: the read then reports why)."""
    try:
        return path.stat().st_size
    except OSError:
        return None


def _read_in_worker(
    path: Path,
    idx: int,
    fmt: str | None,
    mapping: Path | None,
    ctx: Context,
    known: set[str],
    seen_before: bool,
    root: Path,
) -> _Outcome:
    """:func:`_read_one` in a worker process, staging into batch files under ``root``."""
    sink = BatchFiles(root)
    out = _read_one(path, idx, fmt, mapping, ctx, known, seen_before, sink)
    out.batches = sink.files
    return out


def _read_parallel(
    paths: list[Path],
    plans: list[list[tuple[int, int]] | None],
    seen: list[bool],
    first: int,
    fmt: str | None,
    mapping: Path | None,
    ctx: Context,
    known: set[str],
    commit: Commit,
    jobs: int,
) -> Iterator[_Outcome]:
    """Read ``paths`` in ``jobs`` worker processes (a file with a split plan as pieces, each
    piece a task), yielding outcomes in file order (so the parent stages them exactly as a
    serial run would)."""
    import multiprocessing
    import os
    from concurrent.futures import Future, ProcessPoolExecutor

    tasks = sum(len(plan) if plan else 1 for plan in plans)
    workers = min(jobs, tasks)
    # spawn, not fork: polars' and DuckDB's thread pools make fork unsafe. Each worker gets its
    # share of the cores for polars and DuckDB (read from the environment when it starts).
    share = str(max(1, (os.cpu_count() or 1) // workers))
    budget = {"POLARS_MAX_THREADS": share, THREADS_ENV: share}
    saved = {k: os.environ.get(k) for k in budget}
    os.environ.update(budget)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    root = commit.root / "workers"
    manifest_known = set(known)

    def whole(k: int) -> Future[_Outcome]:
        folder = root / f"f{first + k:05d}"
        return pool.submit(_read_in_worker, paths[k], first + k, fmt, mapping, ctx, manifest_known, seen[k], folder)

    try:
        futures: list[Future[_Outcome] | list[Future[_PieceRead]]] = []
        for k, (path, plan) in enumerate(zip(paths, plans, strict=True)):
            if plan is None:
                futures.append(whole(k))
                continue
            folders = [root / f"f{first + k:05d}-p{j:05d}" for j in range(len(plan))]
            futures.append(
                [
                    pool.submit(_read_piece, path, a, b, fmt, mapping, ctx, d)
                    for (a, b), d in zip(plan, folders, strict=True)
                ]
            )
        _restore(saved)  # every worker has started (spawn starts them all at the first submit)
        for k, (path, fut) in enumerate(zip(paths, futures, strict=True)):
            try:
                if isinstance(fut, list):
                    # the parent hashes the file (on a thread) while the workers read its pieces:
                    # exactly the bytes the pieces read, [0, end of the last piece), so that lines
                    # appended meanwhile make the next run see the file as grown and read them
                    plan = plans[k]
                    assert plan is not None
                    digest = FileDigest(path, background=True, size=plan[-1][1])
                    try:
                        out = _gather_pieces(path, [f.result() for f in fut], digest)
                    finally:
                        digest.close()
                    # a piece the JSON fast path could not read: the whole file, as a serial run would
                    yield out if out is not None else whole(k).result()
                else:
                    yield fut.result()
            except Exception as exc:  # the worker died (killed, out of memory): that file fails
                res = FileResult(source_file=str(path))
                res.error = f"{path}: cannot ingest (worker process failed: {type(exc).__name__}: {_first_line(exc)})"
                yield _Outcome(res, messages=[f"error: {res.error}"], batches=[])
    finally:
        _restore(saved)
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(root, ignore_errors=True)


#: With ``--jobs N`` (N > 1), an uncompressed JSON Lines file of at least SPLIT_MIN_BYTES is read
#: as pieces cut at line boundaries, at least N of them and at most PIECE_BYTES each.
SPLIT_MIN_BYTES = 64 << 20
PIECE_BYTES = 256 << 20


def _split_plan(
    path: Path, seen_before: bool, fmt: str | None, mapping: Path | None, ctx: Context, jobs: int
) -> list[tuple[int, int]] | None:
    """The byte ranges (start, end) to read ``path`` in, or None to read it whole: a file seen
    before (most likely skipped after one hash), compressed, small, not JSON Lines, or one whose
    format cannot be resolved (the whole-file read reports why)."""
    if jobs < 2 or seen_before or logical_name(path) != path.name:
        return None
    try:
        size = path.stat().st_size
        if size < SPLIT_MIN_BYTES:
            return None
        spec = _resolve_spec(path, fmt, mapping)
        if spec.kind != "jsonl" or (spec.relative_time and ctx.anchor_date is None):
            return None
        cuts = line_cuts(path, size, max(jobs, -(-size // PIECE_BYTES)))
    except (RooftraceError, OSError):
        return None
    return list(itertools.pairwise(cuts)) if len(cuts) > 2 else None


def line_cuts(path: Path, size: int, pieces: int) -> list[int]:
    """Byte offsets cutting ``path`` (``size`` bytes) into about ``pieces`` equal parts, each cut
    just after a newline: [0, ..., size], strictly increasing (fewer parts where lines are long)."""
    cuts = [0]
    with path.open("rb") as fh:
        for k in range(1, pieces):
            at = max(size * k // pieces, cuts[-1] + 1) - 1  # the first newline from here ends a part
            fh.seek(at)
            while True:
                chunk = fh.read(1 << 16)
                if not chunk:
                    at = size
                    break
                i = chunk.find(b"\n")
                if i >= 0:
                    at += i + 1
                    break
                at += len(chunk)
            if at >= size:
                break
            cuts.append(at)
    cuts.append(size)
    return cuts


@dataclass(frozen=True)
class _Shift:
    """What a piece's rows need to read as rows of the whole file: the lines before the piece,
    and the derived-id occurrence counts of the pieces before it."""

    lines: int
    keys: np.ndarray[Any, np.dtype[np.uint64]]
    counts: np.ndarray[Any, np.dtype[np.int64]]


def _load_batch(batch: Path, shift: _Shift | None) -> pl.DataFrame:
    frame = pl.read_ipc(batch)
    if shift is None:
        return frame
    frame = frame.with_columns(pl.col("source_line") + shift.lines)
    return shift_occurrences(frame, shift.keys, shift.counts)


@dataclass
class _PieceRead:
    """One piece of a split file, read by the JSON fast path in a worker: its rows (= lines),
    quarantine rows and staged batches (line numbers and derived ids as if the piece were a file),
    and its derived ids' occurrence keys; or why the fast path could not read it."""

    spec_name: str = ""
    read: int = 0
    bad: pl.DataFrame | None = None
    batches: list[Path] = field(default_factory=list)
    keys: np.ndarray[Any, np.dtype[np.uint64]] = field(default_factory=lambda: np.empty(0, np.uint64))
    counts: np.ndarray[Any, np.dtype[np.int64]] = field(default_factory=lambda: np.empty(0, np.int64))
    failed: str | None = None


def _read_piece(
    path: Path, start: int, end: int, fmt: str | None, mapping: Path | None, ctx: Context, root: Path
) -> _PieceRead:
    """Bytes ``start:end`` of ``path`` (whole lines), copied to a file under ``root`` and read by
    the JSON fast path as ``path`` itself is read (rows named after ``path``)."""
    out = _PieceRead()
    part = root / "piece.jsonl"
    try:
        spec = _resolve_spec(path, fmt, mapping)
        out.spec_name = spec.name
        root.mkdir(parents=True, exist_ok=True)
        copy_range(path, start, end, part)
        sink = BatchFiles(root / "batches")
        derived = DerivedIds(tag=True)
        out.read, bad_frames = _stage_batches(path, spec, ctx, sink, 0, jsonl_fast(part, spec), derived)
        out.bad = _quarantine_frame(part, spec, bad_frames)
        out.keys, out.counts = derived.seen()
        out.batches = sink.files
    except FastPathFailed as exc:
        out.failed = str(exc)
    except BaseException as exc:  # the whole-file read that follows reports what it is
        if not file_failure(exc):
            raise
        if interrupted(exc):
            raise KeyboardInterrupt from None
        out.failed = f"{type(exc).__name__}: {_first_line(exc)}"
    finally:
        part.unlink(missing_ok=True)
    return out


def _gather_pieces(path: Path, pieces: list[_PieceRead], digest: FileDigest) -> _Outcome | None:
    """One file's outcome from its pieces, in order, and its ``digest`` (None when a piece could
    not be read by the fast path: the caller reads the whole file instead)."""
    if any(p.failed is not None for p in pieces):
        for p in pieces:
            for folder in {b.parent for b in p.batches}:
                shutil.rmtree(folder, ignore_errors=True)
        return None
    out = _Outcome(FileResult(source_file=str(path), source_format=pieces[0].spec_name))
    res = out.res
    try:
        res.content_sha256 = digest.sha()
    except OSError as exc:
        res.error = f"{path}: {exc}"
        out.messages.append(f"error: {res.error}")
        return out
    lines = 0
    keys, counts = np.empty(0, np.uint64), np.empty(0, np.int64)
    bad_frames: list[pl.DataFrame] = []
    out.batches, out.shifts = [], []
    for p in pieces:
        shift = _Shift(lines, keys, counts)
        out.batches += p.batches
        out.shifts += [shift] * len(p.batches)
        if p.bad is not None and p.bad.height:
            bad_frames.append(p.bad.with_columns(pl.col("source_line") + lines))
        lines += p.read
        keys, inverse = np.unique(np.concatenate([keys, p.keys]), return_inverse=True)
        counts = np.bincount(inverse, np.concatenate([counts, p.counts]), len(keys)).astype(np.int64)
    bad = pl.concat(bad_frames) if bad_frames else pl.DataFrame(schema=_BAD_SCHEMA)
    res.rows_read, res.rows_quarantined = lines, bad.height
    out.bad = bad
    if lines and bad.height == lines:
        res.error = _all_quarantined(path, bad)
        out.messages.append(f"error: {res.error}")
    else:
        out.messages.append(_read_message(path, res.source_format, lines, bad.height))
    return out


def _restore(saved: dict[str, str | None]) -> None:
    import os

    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


#: A date partition (its stored rows plus the staged ones) up to this estimated size is merged in
#: memory with polars; anything larger, or any run that spilled while staging, is merged by
#: DuckDB out of core within MERGE_MEMORY (spilling to the staging folder).
MEMORY_MERGE_BYTES = 768 << 20
MERGE_MEMORY = "512MB"

#: The partition order: arrival, then where the row came from (unique per row).
SORT_KEYS = ("arrival", "source_file", "source_line", "request_id")


def _merge(
    store: Store,
    stager: Stager,
    commit: Commit,
    results: list[FileResult],
    say: Progress,
    replace: _Replace,
    conflicts: _Conflicts | None = None,
    across: _Across | None = None,
) -> None:
    """Deduplicate the staged rows against the store and each other (first seen wins: stored rows,
    then staged rows in reading order) and stage each touched date partition, sorted by
    SORT_KEYS, in ``commit``. Stored rows that ``replace`` names are dropped first (and the
    partitions they were in rewritten without them). Every way of merging gives the same rows
    and the same Parquet bytes, and the same ``conflicts`` (duplicates with other content)."""
    clashes = conflicts if conflicts is not None else _Conflicts()
    touched = _merge_staged(store, stager, commit, results, say, replace, clashes, across or _Across())
    for d in sorted(replace.dates - touched):
        _drop_replaced(store, commit, d, results, say, replace)
    for d, gap in sorted(replace.unaccounted.items()):
        say(
            f"requests/date={d}: rebuilt from the files read now: its files held {gap.held} rows, "
            f"{gap.extra} more than the manifest counted ({gap.counted}); every file the manifest stored "
            f"on that date was read again ({', '.join(p.name for p in replace.dropped.get(d, []))} replaced by the "
            "rebuilt part-00000.parquet)"
        )
    for d, paths in sorted(replace.dropped.items()):
        if d in replace.unaccounted:
            continue
        for p in paths:
            say(
                f"requests/date={d}: {p.name} could not be read; rebuilt from the files read now "
                "(every file the manifest stored on that date was read again)"
            )


def _merge_staged(
    store: Store,
    stager: Stager,
    commit: Commit,
    results: list[FileResult],
    say: Progress,
    replace: _Replace,
    conflicts: _Conflicts,
    across: _Across,
) -> set[str]:
    frames = [f for fs in stager.memory.values() for f in fs]
    if not frames and not stager.spilled_files():
        return set()
    if not stager.spilled_files():
        staged = pl.concat(frames, how="vertical", rechunk=False)
        parts = _split_by_date(staged)
        per_row = staged.estimated_size() / max(staged.height, 1)
        fits = all(
            (_rows_in(_stored_files(store, d, replace)) + part.height) * per_row <= MEMORY_MERGE_BYTES
            for d, part in parts.items()
        )
        if fits:
            for d, part in parts.items():
                _merge_date_memory(store, commit, d, part, results, say, replace, conflicts, across)
            return set(parts)
        del staged, parts
    del frames
    stager.flush()
    return _merge_out_of_core(store, stager, commit, results, say, replace, conflicts, across)


def _drop_replaced(
    store: Store, commit: Commit, date: str, results: list[FileResult], say: Progress, replace: _Replace
) -> None:
    """Rewrite a partition without the rows ``replace`` names (streamed: the rows stay sorted),
    or remove it when nothing is left."""
    existing = _stored_files(store, date, replace)
    if not existing:
        if replace.dropped.get(date):  # only unreadable files, every one of their rows replaced
            commit.remove(store.partition(store.requests_dir, date))
            say(f"requests/date={date}: removed (its rows were replaced)")
        return
    rows = pl.scan_parquet(existing, glob=False)
    gone = pl.col("source_file").is_in(sorted(replace.files))
    removed = rows.filter(gone).group_by("source_file").len().collect().rows()
    if not removed:
        return
    replace.credit(results, removed)
    left = rows.filter(~gone).select(pl.len()).collect().item()
    if left == 0:
        commit.remove(store.partition(store.requests_dir, date))
        say(f"requests/date={date}: removed (its rows were replaced)")
        return
    _stage_partition(store, commit, date, existing, say, lambda target: _write_requests(rows.filter(~gone), target))
    say(f"requests/date={date}: {left} rows")


def _stage_partition(
    store: Store, commit: Commit, date: str, existing: list[Path], say: Progress, write: Callable[[Path], None]
) -> None:
    """Write a date partition's new file into the commit: at commit time it replaces the old file
    by one rename (or, for a new date, the partition folder appears with it), so a reader sees the
    old partition or the new one, never a part of either. The store's other files of the
    partition are removed: only an older layout had them (their rows are in the new file), or
    they are unreadable ones a forced re-ingest rebuilds, or byte-for-byte copies of one of them
    under a store name (its rows are in the new file once; left, it would be read as the store's
    once the file it copies is rewritten). Files with names the store does not use are left."""
    target = store.partition(store.requests_dir, date) / "part-00000.parquet"
    write(commit.stage(target))
    files, foreign = store.partition_files(date)
    for p, why in foreign:
        if why.startswith(COPY_OF) and store.owns_name(p):
            commit.remove(p)
            say(f"requests/date={date}: {p.name} removed ({why}: its rows are stored once)")
    for p in sorted({*existing, *files}):
        if p != target:
            commit.remove(p)


def _split_by_date(staged: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """Staged rows by arrival date (YYYY-MM-DD), each in reading order. Rows read in arrival order
    (the usual log) are split by slicing, without copying."""
    day = staged["arrival"].dt.date()
    if day.is_sorted():
        bounds = day.unique_counts()
        starts = [0, *bounds.cum_sum().to_list()]
        firsts = day.unique(maintain_order=True).to_list()
        return {d.isoformat(): staged.slice(starts[i], starts[i + 1] - starts[i]) for i, d in enumerate(firsts)}
    return {d.isoformat(): staged.filter(day == d) for d in sorted(day.unique().to_list())}


def _first_seen(rows: pl.DataFrame) -> pl.Series:
    """True for the first row of each (source_format, request_id), in row order. Distinct key hashes
    prove there is no duplicate; otherwise (a duplicate, or a hash collision) the keys decide."""
    keys = pl.struct("source_format", "request_id")
    if rows.select(keys.hash().n_unique()).item() == rows.height:
        return pl.repeat(True, rows.height, dtype=pl.Boolean, eager=True)
    return rows.select(keys.is_first_distinct()).to_series()


def _stored_files(store: Store, date: str, replace: _Replace) -> list[Path]:
    """The store's readable request files of ``date`` (their schema checked before merging).

    A file that cannot be read (truncated, not Parquet, another schema) is one error naming it
    and saying what to do, unless this is a forced re-ingest that reads again every file the
    manifest stored on that date: then none of its rows is kept anyway, and it is left out (put
    in ``replace.dropped``; :func:`_stage_partition` removes it with the date's rewrite)."""
    present = (store.requests_dir / f"date={date}").exists()
    gap = store.unaccounted(date) if present else None
    if gap is not None:
        missing = sorted(replace.on_date.get(date, set()) - replace.files)
        if not (replace.force and not missing):
            raise RooftraceError(_unaccounted_line(gap, replace, missing))
        # Every file the manifest stored on the date is read again: none of the stored rows
        # would be kept, the foreign ones included. The date is rebuilt from the files read now.
        if date not in replace.unaccounted:
            replace.unaccounted[date] = gap
            _credit_rows(gap.files, replace.results, replace)
        for p in store.partition_files(date)[0]:
            if p not in replace.dropped.setdefault(date, []):
                replace.dropped[date].append(p)
        return []
    existing = store.request_files(date) if present else []
    readable = []
    for p in existing:
        try:
            check_file_schema(p, "requests")  # schema check before merging
        except SchemaError as exc:
            missing = sorted(replace.on_date.get(date, set()) - replace.files)
            if replace.force and not missing:
                if p not in replace.dropped.setdefault(date, []):
                    replace.dropped[date].append(p)
                continue
            raise RooftraceError(_damaged_line(str(exc), date, replace, missing)) from None
        readable.append(p)
    return readable


def _credit_rows(files: Sequence[Path], results: list[FileResult], replace: _Replace) -> None:
    """Credit the rows of ``files`` from the source files ``replace`` re-reads to those files
    (rows replaced); a file that cannot be read is left out of the count."""
    if not replace.files or not results:
        return
    try:
        rows = pl.scan_parquet(list(files), glob=False).select("source_file")
        got = rows.filter(pl.col("source_file").is_in(sorted(replace.files))).group_by("source_file").len()
        replace.credit(results, got.collect().rows())
    except (OSError, pl.exceptions.PolarsError):
        pass


def _unaccounted_line(gap: Unaccounted, replace: _Replace, missing: list[str]) -> str:
    """One line refusing an ingest into a date whose files hold rows the manifest does not count."""
    if replace.force:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        todo = (
            f"--force rebuilds the requests of {gap.date} only when it reads again every file stored on that "
            f"date; also name {shown}, or move the file that is not the store's out of {gap.store.requests_dir}"
        )
    else:
        logs = ", ".join(gap.logs[:3]) + (f" and {len(gap.logs) - 3} more" if len(gap.logs) > 3 else "")
        todo = (
            f"nothing ingested: merging would keep the {gap.extra} rows the manifest does not count for good; "
            f"repair it first with `rooftrace ingest --force` of the date's logs{f' ({logs})' if logs else ''}, "
            f"or move the file that is not the store's out of {gap.store.requests_dir}"
        )
    folder = gap.store.partition(gap.store.requests_dir, gap.date)
    return (
        f"{folder}: the store's files of {gap.where()} hold {gap.held} rows but the manifest counts "
        f"{gap.counted} stored there ({gap.extra} not from ingest; files: {gap.names()}) -- {todo}"
    )


def _damaged_line(reason: str, date: str, replace: _Replace, missing: list[str]) -> str:
    """One line for a stored file of ``date`` that cannot be read: what is wrong and what to do."""
    if replace.force:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return (
            f"{reason} -- --force rebuilds the requests of {date} only when it reads again every file stored "
            f"on that date; also name {shown}, or move the damaged file out of the store"
        )
    logs = sorted(replace.on_date.get(date, set()))
    named = f" ({', '.join(logs[:3])}{f' and {len(logs) - 3} more' if len(logs) > 3 else ''})" if logs else ""
    return (
        f"{reason} -- the stored requests of {date} are damaged: rebuild the date with "
        f"`rooftrace ingest --force` of its original logs{named}, or move the file out of the store"
    )


def _rows_in(files: Sequence[Path]) -> int:
    """Rows of readable Parquet files, from their footers."""
    return sum(pq.read_metadata(p).num_rows for p in files)


def _count(results: list[FileResult], date: str, counts: Sequence[tuple[Any, Any, Any]]) -> None:
    """Credit (file index, rows stored, duplicates) of one date to the files' results."""
    for file_index, stored, dup in counts:
        res = results[int(file_index)]
        res.rows_stored += int(stored)
        res.rows_duplicate += int(dup)
        res.dates.append(date)


def _merge_date_memory(
    store: Store,
    commit: Commit,
    date: str,
    part: pl.DataFrame,
    results: list[FileResult],
    say: Progress,
    replace: _Replace,
    conflicts: _Conflicts,
    across: _Across,
) -> None:
    names = load_schema("requests").names
    existing = _stored_files(store, date, replace)
    old = [pl.read_parquet(p, glob=False).select(names) for p in existing]
    if old and replace.files:
        stored = pl.concat(old, how="vertical")
        gone = stored["source_file"].is_in(sorted(replace.files))
        if gone.any():
            replace.credit(results, stored.filter(gone).group_by("source_file").len().rows())
            old = [stored.filter(~gone)]
    rows = pl.concat([*old, part.select(names)], how="vertical") if old else part.select(names)
    n_old = rows.height - part.height
    first = _first_seen(rows)
    again, formats = _cross_format(rows, first)
    # stored rows stay whatever they repeat (the manifest counts them stored); a row read now that
    # repeats a request of another format is dropped with ``dedupe``
    if across.dedupe:
        dropped = again & (pl.int_range(rows.height, eager=True) >= n_old)
    else:
        dropped = pl.repeat(False, rows.height, dtype=pl.Boolean, eager=True)
    keep = first & ~dropped
    across.note(date, int((again & ~dropped).sum()), formats)
    new_first = keep.slice(n_old)
    counts = (
        part.select("_file", _first=new_first)
        .group_by("_file")
        .agg(pl.col("_first").sum().alias("stored"), (~pl.col("_first")).sum().alias("dup"))
        .rows()
    )
    _count(results, date, counts)
    if across.dedupe and dropped.any():
        for f, n in part.select("_file", _x=dropped.slice(n_old)).group_by("_file").agg(pl.col("_x").sum()).rows():
            results[int(f)].rows_cross_format += int(n)
    if not first.all():
        stored_marks = pl.repeat(-1, n_old, dtype=pl.Int64, eager=True)
        files = pl.concat([stored_marks, part["_file"].cast(pl.Int64)])
        seqs = pl.concat([stored_marks, part["_seq"].cast(pl.Int64)])
        conflicts.add(_clashes(rows, first, files, seqs))
    kept = rows if keep.all() else rows.filter(keep)
    if not _is_sorted(kept, SORT_KEYS):  # a log written in arrival order needs no sort
        kept = kept.sort(SORT_KEYS)
    kept = kept.rechunk()  # one chunk per column: the writer encodes contiguous row groups faster
    _stage_partition(store, commit, date, existing, say, lambda target: _write_requests(kept.lazy(), target))
    say(f"requests/date={date}: {kept.height} rows")


def _is_sorted(frame: pl.DataFrame, keys: Sequence[str]) -> bool:
    """Whether ``frame`` is in ascending lexicographic order of ``keys`` (no nulls in them). The
    first key decides almost every neighbour pair; only pairs tied on it look at the rest."""
    n = frame.height
    if n < 2 or not keys:
        return True
    first = frame[keys[0]]
    nxt = first.shift(-1)
    less, equal = (first < nxt).slice(0, n - 1), (first == nxt).slice(0, n - 1)
    if not (less | equal).all():
        return False
    ties = equal.arg_true()
    if ties.len() == 0 or len(keys) == 1:
        return True
    rest = list(keys[1:])
    left, right = frame.select(rest)[ties], frame.select(rest)[ties + 1]
    in_order = pl.repeat(True, ties.len(), dtype=pl.Boolean, eager=True)
    for key in reversed(rest):  # left <= right on keys[j:], built from the last key
        a, b = left[key], right[key]
        in_order = (a < b) | ((a == b) & in_order)
    return bool(in_order.all())


def _merge_out_of_core(
    store: Store,
    stager: Stager,
    commit: Commit,
    results: list[FileResult],
    say: Progress,
    replace: _Replace,
    conflicts: _Conflicts,
    across: _Across,
) -> set[str]:
    """The merge for staged rows that do not fit in memory, all of them in staging files. DuckDB
    counts rows and finds duplicate keys in one pass over the key columns (within MERGE_MEMORY,
    spilling beyond it). A date with no duplicates, no stored rows and rows read in partition
    order is streamed by polars from the staging files into its partition; otherwise DuckDB drops
    the duplicates (and the stored rows ``replace`` names) and sorts into a staging file that
    polars then streams into the partition. Duplicates whose content differs from the row kept
    (a 64-bit hash of the content columns differs) are counted in ``conflicts``. Returns the
    dates merged."""
    names = load_schema("requests").names
    cols = ", ".join(f'"{c}"' for c in names)
    content_hash = "hash(" + ", ".join(f'"{c}"' for c in _content_columns(names)) + ") AS _ch"
    files = stager.spilled_files()
    tmp = stager.root / "duckdb"
    tmp.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute(f"SET memory_limit = '{MERGE_MEMORY}'")
        con.execute(f"SET temp_directory = '{_sql_str(tmp)}'")
        con.execute("SET enable_progress_bar = false")
        con.execute(
            "CREATE TEMP VIEW staged AS SELECT *, strftime(arrival, '%Y-%m-%d') AS _date, 1 AS _ord "
            f"FROM {_read(files)}"
        )
        per_file: dict[str, list[tuple[int, int]]] = {}
        for d, f, n in con.execute("SELECT _date, _file, count(*) FROM staged GROUP BY ALL ORDER BY ALL").fetchall():
            per_file.setdefault(d, []).append((int(f), int(n)))
        stored = {d: _stored_files(store, d, replace) for d in per_file}
        # Stored rows a forced re-ingest replaces take no part (filtered wherever stored rows are read).
        con.execute("CREATE TEMP TABLE replaced (source_file VARCHAR)")
        if replace.files:
            con.executemany("INSERT INTO replaced VALUES (?)", [[f] for f in sorted(replace.files)])
        keep_stored = "WHERE source_file NOT IN (SELECT source_file FROM replaced)"
        removed: dict[str, int] = {}
        for d, existing in stored.items():
            if existing and replace.files:
                got = con.execute(
                    f"SELECT source_file, count(*) FROM {_read(existing)} "
                    "WHERE source_file IN (SELECT source_file FROM replaced) GROUP BY ALL"
                ).fetchall()
                replace.credit(results, got)
                removed[d] = sum(int(n) for _, n in got)
        # Keys of every row that takes part: the stored rows of touched dates (first, _ord 0) and
        # the staged rows (in reading order, _ord 1).
        keys = ["SELECT _date, source_format, request_id, _file, _seq, _ord FROM staged"]
        # The same with a hash of their content, to rank the repeated keys and tell a conflicting
        # duplicate (same id, other content) from a copy; and with where they came from, to name
        # the row kept for a conflicting one.
        ranked = [f"SELECT _date, source_format, request_id, _file, _seq, _ord, {content_hash} FROM staged"]
        origin = ["SELECT _date, source_format, request_id, _seq, source_file, source_line FROM staged"]
        req = ", ".join(CROSS_FORMAT_KEY)
        requests = [f"SELECT _date, source_format, {req}, _file, _seq, _ord FROM staged"]
        for d, existing in stored.items():
            if existing:
                keys.append(
                    f"SELECT '{d}' AS _date, source_format, request_id, -1 AS _file, -1 AS _seq, 0 AS _ord "
                    f"FROM {_read(existing)} {keep_stored}"
                )
                ranked.append(
                    f"SELECT '{d}' AS _date, source_format, request_id, -1 AS _file, -1 AS _seq, 0 AS _ord, "
                    f"{content_hash} FROM {_read(existing)} {keep_stored}"
                )
                origin.append(
                    f"SELECT '{d}' AS _date, source_format, request_id, -1 AS _seq, source_file, source_line "
                    f"FROM {_read(existing)} {keep_stored}"
                )
                requests.append(
                    f"SELECT '{d}' AS _date, source_format, {req}, -1 AS _file, -1 AS _seq, 0 AS _ord "
                    f"FROM {_read(existing)} {keep_stored}"
                )
        con.execute(f"CREATE TEMP VIEW keys AS {' UNION ALL '.join(keys)}")
        con.execute(f"CREATE TEMP VIEW ranked AS {' UNION ALL '.join(ranked)}")
        con.execute(f"CREATE TEMP VIEW origin AS {' UNION ALL '.join(origin)}")
        # Repeated keys: first the repeated 64-bit hashes of (date, key), an aggregate of one
        # integer that DuckDB keeps within MERGE_MEMORY (grouping 10^8 distinct request-id
        # strings, or the date string with the hash, did not: measured), then the keys
        # themselves among the rows with such a hash.
        con.execute(
            "CREATE TEMP TABLE duphash AS SELECT hash(_date, source_format, request_id) AS _h FROM keys "
            "GROUP BY ALL HAVING count(*) > 1"
        )
        con.execute(
            "CREATE TEMP TABLE dupkeys AS SELECT _date, source_format, request_id FROM keys "
            "SEMI JOIN duphash ON hash(keys._date, keys.source_format, keys.request_id) = duphash._h "
            "GROUP BY ALL HAVING count(*) > 1"
        )
        # Rows after the first of their key in their date (stored rows are unique already), and
        # whether their content differs from the first's.
        select_dup = (
            "SELECT _date, _file, _seq, _clash FROM (SELECT _date, _file, _seq, row_number() OVER w AS _n, "
            "_ch IS DISTINCT FROM first_value(_ch) OVER w AS _clash "
            "FROM ranked SEMI JOIN dupkeys USING (_date, source_format, request_id) "
            "WINDOW w AS (PARTITION BY _date, source_format, request_id ORDER BY _ord, _seq)) WHERE _n > 1"
        )
        if not con.execute("SELECT count(*) FROM dupkeys").fetchall()[0][0]:
            select_dup += " LIMIT 0"  # no key is repeated: nothing to rank
        con.execute(f"CREATE TEMP TABLE dup AS {select_dup}")
        _out_of_core_conflicts(con, conflicts)
        con.execute(f"CREATE TEMP VIEW reqs AS {' UNION ALL '.join(requests)}")
        for _d, f, n in _out_of_core_across(con, across):
            results[f].rows_cross_format += n
        dups: dict[tuple[str, int], int] = {
            (d, int(f)): int(n)
            for d, f, n in con.execute("SELECT _date, _file, count(*) FROM dup GROUP BY ALL").fetchall()
        }
        for d in sorted(per_file):
            counts = [(f, n - dups.get((d, f), 0), dups.get((d, f), 0)) for f, n in per_file[d]]
            _count(results, d, counts)
            existing = stored[d]
            kept = sum(c[1] for c in counts) + sum(pq.read_metadata(p).num_rows for p in existing) - removed.get(d, 0)
            if _can_stream(stager, existing, sum(c[2] for c in counts)):
                start = datetime.fromisoformat(d).replace(tzinfo=UTC)
                arrival = pl.col("arrival")
                # A range on the column itself, so row groups of other days are skipped by their
                # statistics.
                in_day = pl.scan_parquet(files, glob=False).filter(
                    (arrival >= start) & (arrival < start + timedelta(days=1))
                )

                def stream(target: Path, rows: pl.LazyFrame = in_day) -> None:
                    _write_requests(rows, target)

                _stage_partition(store, commit, d, existing, say, stream)
            else:
                old = f"SELECT {cols} FROM {_read(existing)} {keep_stored} UNION ALL " if existing else ""
                sorted_file = tmp / f"sorted-{d}.parquet"
                con.execute(
                    f"COPY (SELECT * FROM ({old}SELECT {cols} FROM staged ANTI JOIN dup USING (_date, _file, _seq) "
                    f"WHERE _date = $d) ORDER BY {', '.join(SORT_KEYS)}) "
                    f"TO '{_sql_str(sorted_file)}' (FORMAT parquet, COMPRESSION lz4)",
                    {"d": d},
                )

                def write(target: Path, src: Path = sorted_file) -> None:
                    _write_requests(pl.scan_parquet(src, glob=False), target)

                _stage_partition(store, commit, d, existing, say, write)
                sorted_file.unlink()
            say(f"requests/date={d}: {kept} rows")
    finally:
        con.close()
    return set(per_file)


def _out_of_core_across(con: duckdb.DuckDBPyConnection, across: _Across) -> list[tuple[str, int, int]]:
    """:func:`_cross_format` over view ``reqs`` (a touched date's stored rows, ``_ord`` 0, and
    its staged ones), the rows of table ``dup`` left out: note the requests stored twice in
    ``across`` and, with ``dedupe``, add the staged rows after the first of their request to
    ``dup`` (not conflicts), returning (date, file index, rows) of those. As for the per-format key,
    the repeated 64-bit hashes of the key come first (an aggregate of one integer), then the
    keys themselves among the rows with such a hash."""
    if con.execute("SELECT count(DISTINCT source_format) FROM reqs").fetchall()[0][0] < 2:
        return []
    key = ", ".join(CROSS_FORMAT_KEY)
    live = "(SELECT * FROM reqs ANTI JOIN dup USING (_date, _file, _seq))"
    con.execute(
        f"CREATE TEMP TABLE xhash AS SELECT hash(_date, {key}) AS _h FROM {live} GROUP BY ALL HAVING count(*) > 1"
    )
    con.execute(
        "CREATE TEMP TABLE xrows AS SELECT _date, source_format, _file, _seq, _ord, "
        f"row_number() OVER (PARTITION BY _date, {key} ORDER BY _ord, _seq) AS _n, "
        f"count(*) OVER (PARTITION BY _date, {key}) AS _c "
        f"FROM {live} r SEMI JOIN xhash ON hash(r._date, {', '.join('r.' + c for c in CROSS_FORMAT_KEY)}) = xhash._h"
    )
    drop = "_n > 1 AND _ord = 1" if across.dedupe else "false"
    for d, n in con.execute(f"SELECT _date, count(*) FROM xrows WHERE _n > 1 AND NOT ({drop}) GROUP BY ALL").fetchall():
        formats = con.execute("SELECT DISTINCT source_format FROM xrows WHERE _c > 1 AND _date = $d", {"d": d})
        across.note(str(d), int(n), {str(f) for (f,) in formats.fetchall()})
    if not across.dedupe:
        return []
    con.execute(f"INSERT INTO dup SELECT _date, _file, _seq, false FROM xrows WHERE {drop}")
    got = con.execute(f"SELECT _date, _file, count(*) FROM xrows WHERE {drop} GROUP BY ALL").fetchall()
    return [(str(d), int(f), int(n)) for d, f, n in got]


def _out_of_core_conflicts(con: duckdb.DuckDBPyConnection, conflicts: _Conflicts) -> None:
    """Count the conflicting duplicates of table ``dup`` per file into ``conflicts``, with the
    first of each file (its id and line, and the file and line of the row kept: the first of its
    key in reading order, a stored row's ``_seq`` being -1)."""
    per_file = con.execute(
        "SELECT _file, count(*), min(_seq), arg_min(_date, _seq) FROM dup WHERE _clash GROUP BY _file ORDER BY _file"
    ).fetchall()
    if not per_file:
        return
    con.execute("CREATE TEMP TABLE clash_first (_file INTEGER, n BIGINT, _seq BIGINT, _date VARCHAR)")
    con.executemany("INSERT INTO clash_first VALUES (?, ?, ?, ?)", [list(r) for r in per_file])
    conflicts.add(
        con.execute(
            "WITH x AS (SELECT c._file, c.n, c._seq, c._date, s.source_format, s.request_id, s.source_line "
            "FROM clash_first c JOIN staged s ON s._file = c._file AND s._seq = c._seq) "
            "SELECT x._file, x.n, x._seq, x.request_id, x.source_line, arg_min(o.source_file, o._seq), "
            "arg_min(o.source_line, o._seq) FROM x JOIN origin o USING (_date, source_format, request_id) "
            "GROUP BY ALL ORDER BY x._file"
        ).fetchall()
    )


def _can_stream(stager: Stager, existing: list[Path], n_dup: int) -> bool:
    """A date's staged rows are its partition as they are: read in partition order, nothing
    stored for the date yet, no duplicates."""
    return stager.in_order and not existing and not n_dup


def _sql_str(path: Path) -> str:
    return str(path).replace("'", "''")


def _sql_list(paths: Sequence[Path]) -> str:
    return ", ".join(f"'{_sql_str(p)}'" for p in paths)


def _read(files: Sequence[Path]) -> str:
    """DuckDB's read of the store's own Parquet ``files``: their columns only (no hive partition
    columns from folder names, the store's or any folder above it)."""
    return f"read_parquet([{_sql_list(files)}], hive_partitioning = false)"


def _write_requests(rows: pl.LazyFrame, target: Path) -> None:
    """Stream sorted canonical requests into one Parquet file with the store's writer settings
    (zstd level 1, row groups of 256 Ki rows so polars compresses them in parallel) and the
    schema's metadata, then check what was written. The bytes depend only on the rows, not on how
    they arrive (a frame in memory or a scan of DuckDB's sorted output)."""
    schema = load_schema("requests")
    rows.select(schema.names).sink_parquet(
        target,
        compression="zstd",
        compression_level=1,
        row_group_size=1 << 18,
        metadata={META_NAME.decode(): schema.name, META_VERSION.decode(): str(schema.version)},
    )
    check_file_schema(target, "requests")  # the written file carries its schema and types


def _write_quarantine(
    store: Store,
    commit: Commit,
    manifest: pl.DataFrame,
    results: list[FileResult],
    quarantines: dict[int, pl.DataFrame],
    now: datetime,
    replace: _Replace,
) -> None:
    """Stage each read file's quarantine records (``file=<sha prefix>.parquet``), replacing those
    of an earlier read of the same content; a clean read removes them. With ``force``, the
    quarantine files of replaced contents no file in the manifest still has are removed too."""
    written: set[str] = set()
    for idx, bad in quarantines.items():
        res = results[idx]
        if res.content_sha256 is None:
            continue
        target = store.quarantine_dir / f"file={res.content_sha256[:16]}.parquet"
        written.add(res.content_sha256)
        if not bad.height:
            if target.exists():
                commit.remove(target)
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
        write_parquet(table, commit.stage(target), "quarantine")
    if replace.shas:
        still = set(manifest.filter(~pl.col("source_file").is_in(sorted(replace.files)))["content_sha256"].to_list())
        for sha in sorted(replace.shas - written - still):
            target = store.quarantine_dir / f"file={sha[:16]}.parquet"
            if target.exists():
                commit.remove(target)


def _write_manifest(
    store: Store,
    commit: Commit,
    manifest: pl.DataFrame,
    results: list[FileResult],
    now: datetime,
    replace: _Replace,
) -> None:
    """Stage the manifest with a row for each file ingested now, less the rows of the earlier
    ingests that ``force`` replaced."""
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
    kept = manifest.filter(~pl.col("source_file").is_in(sorted(replace.files))) if replace.files else manifest
    if not rows and kept.height == manifest.height:
        return
    add = pl.DataFrame(rows, schema=manifest.schema)
    out = pl.concat([kept, add], how="vertical")
    table: pa.Table = out.to_arrow()
    write_parquet(table, commit.stage(store.manifest_path), "manifest")
