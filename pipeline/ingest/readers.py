"""Readers: a source file -> batches of raw frames (text leaves) with their line numbers.

JSON Lines are parsed by DuckDB with the format's explicit layout, in one of two ways that give
the same frames. The fast path lets DuckDB scan the whole file (multi-threaded, streamed as Arrow
batches); it is taken when the file parses cleanly and yields one row per physical line (no blank
lines), so row *i* is line *i + 1*. Otherwise the robust path reads batches of non-blank lines
with their numbers and has DuckDB parse each through a scratch file, splitting a batch it rejects
down to the bad lines, which are reported with a reason. Either way every non-blank line ends up
as exactly one row or one parse failure, and every value has DuckDB's text for it.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import json
import queue
import re
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.ingest.formats import (
    FormatSpec,
    Layout,
    duckdb_columns,
    otel_column,
    project_polars,
    project_sql,
)
from pipeline.ingest.source import (
    BATCH_LINES,
    FAST_RECORD_BYTES,
    MAX_RECORD_BYTES,
    LineBatch,
    LineStats,
    SourceError,
    count_lines,
    duck_connect,
    iter_line_batches,
    logical_name,
    open_binary,
)
from pipeline.ingest.store import GLOB_CHARS

#: Raw text kept for a quarantined record.
RAW_LIMIT = 65536


@dataclass
class RawBatch:
    frame: pl.DataFrame  # raw columns (text leaves) + "source_line"
    failures: list[tuple[int, str, str]] = field(default_factory=list)  # (line, reason, raw)
    #: The field at fault of a failure, where the reader knows it (by line).
    failure_fields: dict[int, str] = field(default_factory=dict)
    #: The field at fault of each failure, aligned with ``failures`` (a reader with several
    #: failures on one line: OTel spans); taken before ``failure_fields`` where given.
    failure_field_list: list[str | None] | None = None
    #: An OTel span's own JSON from its line and place (``_span`` of the frame: "r,s,k"), made
    #: only for the spans that fail validation (their quarantine records' raw text).
    span_text: Callable[[int, str], str] | None = None


class FastPathFailed(Exception):
    """DuckDB could not take the file in one go; the caller re-reads it with the robust path."""


# --- JSON Lines ----------------------------------------------------------------------------------


def _count_lines(path: Path, size: int | None = None) -> LineStats:
    with open_binary(path, size) as fh:
        return count_lines(iter(lambda: fh.read(1 << 24), b""))


def _duck_compression(path: Path) -> str:
    if path.name.endswith(".gz"):
        return "gzip"
    if path.name.endswith(".zst"):
        return "zstd"
    return "none"


def _flat_types(spec: FormatSpec) -> dict[str, pl.DataType]:
    return {n: (pl.List(pl.String()) if n in spec.list_fields else pl.String()) for n in spec.fields}


_T = TypeVar("_T")


class Prefetch(Iterator[_T]):
    """Iterate ``items`` on a worker thread, started at once and up to ``depth`` items ahead, so a
    producer that releases the GIL (DuckDB's scan) overlaps with the consumer's work. Exceptions
    reach the consumer in order. The end of the items, an error, ``close`` or the object being
    dropped stops the worker and waits for it (it closes ``items``): no worker outlives its
    consumer, so none is still inside DuckDB when the interpreter exits (Ctrl-C)."""

    def __init__(self, items: Iterator[_T], depth: int = 2) -> None:
        self._q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        #: The bytes of its file the reader reads (a fast-path reader: the file's size when it began).
        self.size: int | None = None
        # the worker holds the queue and the event, not this object, so dropping it stops the worker
        self._worker = threading.Thread(
            target=_prefetch_work, args=(items, self._q, self._stop), name="rooftrace-prefetch", daemon=True
        )
        self._worker.start()

    def __iter__(self) -> Prefetch[_T]:
        return self

    def __next__(self) -> _T:
        if self._done:
            raise StopIteration
        kind, value = self._q.get()
        if kind == "item":
            return value  # type: ignore[no-any-return]
        self.close()
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the worker and wait for it (it finishes the item it is making)."""
        self._done = True
        self._stop.set()
        if self._worker is not threading.current_thread():
            self._worker.join()

    def __del__(self) -> None:
        self.close()


def _prefetch_work(items: Iterator[Any], q: queue.Queue[tuple[str, Any]], stop: threading.Event) -> None:
    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    try:
        for x in items:
            if not put(("item", x)):
                break
        else:
            put(("end", None))
    except BaseException as exc:  # handed to the consumer, which re-raises it
        put(("error", exc))
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


LineCount = Callable[[], LineStats | None]


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckDB's word for a Ctrl-C that reached it while it read (an
    InterruptException, or "Query interrupted" from its reader thread): the run must stop, not
    treat it as a file's or a record's failure."""
    return isinstance(exc, duckdb.InterruptException) or (
        isinstance(exc, RuntimeError | OSError) and "query interrupted" in str(exc).lower()
    )


def jsonl_fast(
    path: Path,
    spec: FormatSpec,
    stats: LineCount | None = None,
    batch_rows: int = 2 * BATCH_LINES,
    size: int | None = None,
) -> Prefetch[RawBatch]:
    """DuckDB parses and projects the file (on a worker thread, a batch or two ahead of the
    caller); raises FastPathFailed if it cannot, or if lines and rows differ. ``stats`` gives the
    file's line count once the rows are read (it may still be counting meanwhile); without it, or
    when it has none (a compressed file), the file is counted here. With ``size`` (the file's
    size when its read began: the bytes its hash covers), a file whose size is no longer that
    once DuckDB has read it (it grew meanwhile) fails the fast path: DuckDB read it to an end no
    one knows, and the robust path reads exactly those bytes."""
    reader = Prefetch(_jsonl_fast(path, spec, stats, batch_rows, size))
    reader.size = size
    return reader


def _duck_query(spec: FormatSpec, compression: str, longest: int | None = None) -> str:
    """DuckDB's scan of a JSON Lines file (the one parameter) projected to the flat columns, with
    read buffers sized for records of ``longest`` bytes (FAST_RECORD_BYTES by default). DuckDB
    reads a longer record all the same (DuckDB 2.0.1 read a 20 MB record with the setting at
    16 MiB, a 3 kB one with it at 1 kB): the record limit, MAX_RECORD_BYTES, is kept by the line
    lengths (``LineStats.longest``, the robust path's own check), not by DuckDB."""
    longest = FAST_RECORD_BYTES if longest is None else longest
    return (
        f"SELECT {project_sql(spec.fields)} FROM read_json(?, format='newline_delimited', "
        f"records=true, compression='{compression}', maximum_object_size={longest}, "
        f"columns={duckdb_columns(spec.layout)})"
    )


def _duck_frame(batch: pa.RecordBatch | pa.Table, spec: FormatSpec) -> pl.DataFrame:
    frame = pl.from_arrow(batch)
    assert isinstance(frame, pl.DataFrame)
    return frame.cast(_flat_types(spec), strict=False)  # type: ignore[arg-type]


@contextmanager
def _literal_path(path: Path) -> Iterator[str]:
    """A name for ``path`` that DuckDB reads as itself: a file whose name holds glob characters
    (``x[1].jsonl``) is read through a link with a plain name, not as a pattern."""
    if not GLOB_CHARS & set(str(path)):
        yield str(path)
        return
    with tempfile.TemporaryDirectory(prefix="rooftrace-link-") as tmp:
        link = Path(tmp) / ("input" + "".join(path.suffixes[-2:]))
        link.symlink_to(path.resolve())
        yield str(link)


def _jsonl_fast(
    path: Path, spec: FormatSpec, stats: LineCount | None, batch_rows: int, size: int | None = None
) -> Iterator[RawBatch]:
    with _literal_path(path) as name:
        yield from _jsonl_fast_named(path, name, spec, stats, batch_rows, size)


def _jsonl_fast_named(
    path: Path, name: str, spec: FormatSpec, stats: LineCount | None, batch_rows: int, size: int | None = None
) -> Iterator[RawBatch]:
    con = duck_connect()
    row = 0
    try:
        rel = con.sql(_duck_query(spec, _duck_compression(path)), params=[name])
        for rb in rel.to_arrow_reader(batch_rows):
            frame = _duck_frame(rb, spec)
            n = frame.height
            frame = frame.with_columns(source_line=pl.int_range(row + 1, row + n + 1, dtype=pl.Int64))
            row += n
            yield RawBatch(frame)
    except (duckdb.Error, OSError) as exc:
        if interrupted(exc):  # Ctrl-C reached DuckDB: the run stops, the file is not re-read
            raise KeyboardInterrupt from None
        # A parse error in a later batch reaches us through the Arrow stream as a plain OSError,
        # indistinguishable by type from a failed read: either way the robust path re-reads the
        # file, quarantining bad lines or reporting a file it cannot read.
        raise FastPathFailed(str(exc).splitlines()[0]) from None
    except UnicodeDecodeError:
        # DuckDB's message for some malformed records quotes them cut mid-character, and the
        # binding cannot decode the message: the record is just as malformed.
        raise FastPathFailed("DuckDB could not parse a record") from None
    finally:
        con.close()
    if size is not None:
        try:
            now = path.stat().st_size
        except OSError:
            now = -1
        if now != size:
            raise FastPathFailed(f"the file changed while it was read ({size:,} bytes, now {now:,})")
    try:
        counted = stats() if stats is not None else None
        got = counted or _count_lines(path, size)
    except (OSError, EOFError) as exc:
        raise SourceError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from None
    if row != got.lines:
        raise FastPathFailed(f"{row} rows for {got.lines} lines")
    if got.longest > MAX_RECORD_BYTES:  # DuckDB read it (maximum_object_size is no limit): the
        raise FastPathFailed(f"a line of {got.longest:,} bytes")  # robust path quarantines it


def _line_reason(line: bytes, fmt: str, err: str) -> str:
    nul = line.find(0)
    if nul >= 0:  # a line cut or zero-filled while it was written (a crash, logrotate copytruncate)
        run = len(line) - len(line.lstrip(b"\x00")) if nul == 0 else 0
        what = f"starts with {run:,} NUL bytes" if run else f"holds a NUL byte at byte {nul + 1:,}"
        return f"invalid JSON: the line {what} (zero-filled or cut while the log was written?)"
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return f"invalid JSON: {exc}"
    except RecursionError:
        return "invalid JSON: nested too deeply to read"
    except ValueError as exc:  # e.g. a number too long for int()
        return f"invalid JSON: {exc}"
    if not isinstance(obj, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(obj), "a number")
        return f"record is {kind}, not an object"
    first = err.splitlines()[0] if err else "unexpected layout"
    return f"record does not match the {fmt} layout: {first}"


#: Characters of a JSON array read at a time while streaming its elements (an element longer
#: than this is read in growing reads, so parsing it stays linear in its length).
ARRAY_READ_CHARS = 1 << 20
_WS = " \t\n\r"


def _array_is_jsonl(path: Path) -> bool:
    """Whether a file starting with ``[`` is JSON Lines whose first line is a whole JSON value by
    itself (a bad record, not the start of a document): that line parses alone and non-blank
    text follows it, so the file cannot be one JSON document. Only a first line of at most
    ARRAY_READ_CHARS bytes is tried (read no further)."""
    try:
        with open_binary(path) as fh:
            first = fh.readline(ARRAY_READ_CHARS + 1)
            if not first.endswith(b"\n"):
                return False
            try:
                json.loads(first.removeprefix(codecs.BOM_UTF8))
            except (ValueError, RecursionError):
                return False
            while True:
                chunk = fh.read(1 << 16)
                if not chunk:
                    return False
                if chunk.strip():
                    return True
    except (OSError, EOFError) as exc:
        raise SourceError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from None


def _array_elements(path: Path, size: int | None = None) -> Iterator[Any]:
    """The elements of a file holding one JSON array, parsed one at a time from a bounded
    buffer (``json.JSONDecoder.raw_decode`` over reads of ARRAY_READ_CHARS), so memory follows
    the longest element, not the file: ``json.load`` of the whole document took about 7 bytes
    per byte of the file. A document that is not one JSON array is a SourceError, raised where
    the stream finds it, as ``json.load`` of it would have failed.

    Kept rather than ijson (3.6.0, its C yajl2 backend), measured on a 100 MB LiteLLM array of
    196,118 elements (docs/ingest.md): no faster (parsing alone 0.88-0.99 CPU s here against
    0.96-1.43 s; the whole ingest 5.4 against 5.6-5.8 CPU s) and no smaller (873-936 MB peak
    against 877-894 MB), since both parse each element with a C parser into the same Python
    objects. ijson would add a dependency and still need what this does around the parse: the
    record limit per element (an element past MAX_RECORD_BYTES fails the file here instead of
    being built whole), the element number in the error, a UTF-8 BOM, and text after the array."""
    decoder = json.JSONDecoder()
    try:
        with open_binary(path, size) as fh:
            text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="strict")
            buf, pos, eof = "", 0, False
            index = 0  # elements read so far

            def more(at_least: int = 0) -> bool:
                nonlocal buf, pos, eof
                if eof:
                    return False
                chunk = text.read(max(ARRAY_READ_CHARS, at_least))
                if not chunk:
                    eof = True
                    return False
                buf, pos = buf[pos:] + chunk, 0
                return True

            def skip_ws() -> str:
                """The next non-blank character (read as needed), or "" at the end."""
                nonlocal pos
                while True:
                    while pos < len(buf) and buf[pos] in _WS:
                        pos += 1
                    if pos < len(buf):
                        return buf[pos]
                    if not more():
                        return ""

            def fail(why: str) -> SourceError:
                return SourceError(f"{path}: invalid JSON document (after element {index}: {why})")

            if skip_ws() != "[":
                raise SourceError(f"{path}: expected a JSON array of records")
            pos += 1
            if skip_ws() == "]":
                pos += 1
            else:
                while True:
                    if skip_ws() == "":
                        raise fail("the document ends inside the array")
                    while True:
                        try:
                            value, end = decoder.raw_decode(buf, pos)
                        except json.JSONDecodeError as exc:
                            # an element cut by the end of the buffer: read on (in growing reads),
                            # as far as the longest record ingest reads
                            if len(buf) - pos > MAX_RECORD_BYTES:
                                raise fail(
                                    f"element {index + 1} is not valid JSON within {MAX_RECORD_BYTES:,} "
                                    f"characters, the longest record ingest reads ({exc.msg})"
                                ) from None
                            if more(len(buf) - pos):
                                continue
                            raise fail(exc.msg) from None
                        if end < len(buf) or eof:
                            break
                        if not more(len(buf) - pos):  # (a number may go on in the next read)
                            break
                    pos = end
                    index += 1
                    yield value
                    c = skip_ws()
                    pos += 1
                    if c == "]":
                        break
                    if c != ",":
                        raise fail("expecting ',' delimiter" if c else "the document ends inside the array")
            if skip_ws() != "":
                raise fail("extra data after the array")
    except (ValueError, RecursionError) as exc:  # not UTF-8, a number too long, nested too deeply
        if isinstance(exc, SourceError):
            raise
        raise SourceError(f"{path}: invalid JSON document ({exc})") from None
    except (OSError, EOFError) as exc:
        raise SourceError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from None


def _json_array_lines(elements: Iterator[Any]) -> Iterator[tuple[list[bytes], list[int]]]:
    """The elements of a JSON array as records numbered by their index, BATCH_LINES at a time."""
    n = 0
    while True:
        # each element as its text at once: a batch holds bytes, not parsed objects (about 10x more)
        chunk = [json.dumps(rec).encode() for rec in itertools.islice(elements, BATCH_LINES)]
        if not chunk:
            return
        yield chunk, list(range(n + 1, n + len(chunk) + 1))
        n += len(chunk)


def _first_char(path: Path) -> bytes:
    with open_binary(path) as fh:
        head = fh.read(4096)
    return head.removeprefix(codecs.BOM_UTF8).lstrip()[:1]


#: A rejected chunk above this many lines is split into tenths, below it into halves.
BISECT_LINES = 1000
#: Where DuckDB's messages name the scratch file and its line.
_SCRATCH_PLACE = re.compile(r' in file "[^"]*", in line \d+:')


class _ChunkParser:
    """DuckDB's projection applied to a chunk of lines (through a scratch file), so that the lines
    around a bad one still parse exactly as the fast path parses them: one parser, one text for
    every value (DuckDB's rendering of a number, e.g. ``1500.0``)."""

    def __init__(self, spec: FormatSpec) -> None:
        self.spec = spec
        self.dir = tempfile.TemporaryDirectory(prefix="rooftrace-chunks-")
        self.file = Path(self.dir.name) / "chunk.jsonl"
        self.con = duck_connect()
        self.query = _duck_query(spec, "none", MAX_RECORD_BYTES)
        self.error = ""

    def parse(self, lines: list[bytes]) -> pl.DataFrame | None:
        """The flat frame of ``lines`` (no blank ones), or None when DuckDB rejects any of them
        or does not give one row per line (the reason is left in ``error``)."""
        self.file.write_bytes(b"\n".join(lines) + b"\n")
        try:
            table = self.con.sql(self.query, params=[str(self.file)]).to_arrow_table()
        except (duckdb.Error, OSError) as exc:
            if interrupted(exc):  # Ctrl-C reached DuckDB: the run stops, no line is quarantined
                raise KeyboardInterrupt from None
            # The scratch file's name and line number mean nothing to the user: drop them.
            self.error = _SCRATCH_PLACE.sub(":", str(exc).splitlines()[0])
            return None
        except UnicodeDecodeError:  # DuckDB's message quotes the record cut mid-character
            self.error = "DuckDB could not parse the record"
            return None
        if table.num_rows != len(lines):
            self.error = f"{table.num_rows} rows for {len(lines)} lines"
            return None
        return _duck_frame(table, self.spec)

    def screen(self, lines: list[bytes]) -> list[str | None]:
        """For each line, None when DuckDB's JSON reader takes it as a record (an object, or
        null) and otherwise why not, decided by DuckDB's own parser in one query (it accepts
        what Python's does not: trailing commas, inf and nan)."""
        texts: list[str | None] = []
        reasons: list[str | None] = []
        for line in lines:
            try:
                texts.append(line.decode("utf-8"))
                reasons.append(None)
            except UnicodeDecodeError as exc:
                texts.append(None)
                reasons.append(f"invalid JSON: not UTF-8 text ({exc.reason} at byte {exc.start})")
        (kinds,) = self.con.execute(
            "SELECT list_transform(?::VARCHAR[], lambda s: CASE WHEN s IS NULL THEN NULL "
            "WHEN json_valid(s) THEN json_type(s) ELSE 'INVALID' END)",
            [texts],
        ).fetchall()[0]
        for i, kind in enumerate(kinds):
            if reasons[i] is not None or kind in ("OBJECT", "NULL"):
                continue
            if kind == "INVALID":
                why = _line_reason(lines[i], self.spec.name, "")
                reasons[i] = why if why.startswith("invalid JSON") else "invalid JSON"  # Python read it
            else:
                name = {"ARRAY": "an array", "VARCHAR": "a string", "BOOLEAN": "a boolean"}.get(kind, "a number")
                reasons[i] = f"record is {name}, not an object"
        return reasons

    def close(self) -> None:
        self.con.close()
        self.dir.cleanup()


def _parse_chunk(
    duck: _ChunkParser, lines: list[bytes], numbers: list[int], spec: FormatSpec, screened: bool = False
) -> tuple[list[pl.DataFrame], list[tuple[int, str, str]]]:
    """Flat frames and parse failures for a chunk: DuckDB on the whole chunk. In a chunk it
    rejects, the lines that are not JSON records are found at once by DuckDB's JSON parser (each
    read_json call costs tens of ms, so bisecting to every truncated line would be slow) and
    DuckDB reads the rest; a chunk it still rejects (a layout it cannot take) is split, in tenths
    while large, then halves, down to the single bad lines, which get a reason."""
    flat = duck.parse(lines)
    if flat is not None:
        return [flat.with_columns(source_line=pl.Series(numbers, dtype=pl.Int64))], []
    if len(lines) == 1:
        text = lines[0][:RAW_LIMIT].decode("utf-8", errors="replace")
        if len(lines[0]) > MAX_RECORD_BYTES:
            return [], [(numbers[0], _too_long(MAX_RECORD_BYTES), text)]
        return [], [(numbers[0], _line_reason(lines[0], spec.name, duck.error), text)]
    if not screened:
        reasons = duck.screen(lines)
        if any(r is not None for r in reasons):
            bad = [
                (n, reason, line[:RAW_LIMIT].decode("utf-8", errors="replace"))
                for line, n, reason in zip(lines, numbers, reasons, strict=True)
                if reason is not None
            ]
            keep = [i for i, r in enumerate(reasons) if r is None]
            if not keep:
                return [], bad
            frames, more = _parse_chunk(duck, [lines[i] for i in keep], [numbers[i] for i in keep], spec, True)
            return frames, sorted(bad + more)
    out: list[pl.DataFrame] = []
    failures: list[tuple[int, str, str]] = []
    step = -(-len(lines) // (10 if len(lines) > BISECT_LINES else 2))
    for at in range(0, len(lines), step):
        f, e = _parse_chunk(duck, lines[at : at + step], numbers[at : at + step], spec, True)
        out += f
        failures += e
    return out, failures


def jsonl_robust(path: Path, spec: FormatSpec, size: int | None = None) -> Iterator[RawBatch]:
    """Batches of non-blank lines (or the elements of a JSON array), each parsed by DuckDB and
    split around the lines it rejects; with ``size``, of the file's first ``size`` bytes only."""
    if _first_char(path) == b"[" and not _array_is_jsonl(path):
        batches: Iterator[tuple[list[bytes], list[int]]] = _json_array_lines(_array_elements(path, size))
    else:
        batches = ((b.lines, b.numbers) for b in iter_line_batches(path, limit=MAX_RECORD_BYTES, size=size))
    duck = _ChunkParser(spec)
    limit = MAX_RECORD_BYTES
    try:
        for lines, numbers in batches:
            long: list[tuple[int, str, str]] = []
            if max(map(len, lines)) > limit:  # DuckDB would read it: the record limit is kept here
                long = [(n, _too_long(limit), ln[:RAW_LIMIT].decode("utf-8", errors="replace"))
                        for ln, n in zip(lines, numbers, strict=True) if len(ln) > limit]  # fmt: skip
                keep = [i for i, ln in enumerate(lines) if len(ln) <= limit]
                lines, numbers = [lines[i] for i in keep], [numbers[i] for i in keep]
            frames, failures = _parse_chunk(duck, lines, numbers, spec) if lines else ([], [])
            failures = sorted(long + failures) if long else failures
            if frames:
                # one chunk per column (a batch split around bad lines is several frames)
                frame = pl.concat(frames, how="vertical", rechunk=True)
            else:
                frame = pl.DataFrame(schema={**_flat_types(spec), "source_line": pl.Int64()})
            yield RawBatch(frame, failures)
    finally:
        duck.close()


# --- CSV -----------------------------------------------------------------------------------------


#: Header columns a CSV error message lists before a count of the rest.
HEADER_SHOWN = 20


def _header_text(header: list[str]) -> str:
    shown = ", ".join(repr(h) for h in header[:HEADER_SHOWN])
    more = len(header) - HEADER_SHOWN
    return f"[{shown}{f', … and {more} more' if more > 0 else ''}]"


def _missing_columns(path: Path, spec: FormatSpec, header: list[str], missing: list[str]) -> SourceError:
    """The one-line error for a header that lacks required columns, listing the whole header."""
    if spec.mapped:  # a mapping's columns, as the mapping spells them
        named = [v for v in dict.fromkeys(spec.labels.values()) if v.lower() in missing]
        return SourceError(
            f"{path}: the CSV header lacks the mapping's column(s) {named or missing} (header: {_header_text(header)})"
        )
    return SourceError(f"{path}: not a {spec.name} CSV: header lacks {missing} (header: {_header_text(header)})")


_CSV_STOPS = re.compile(r'[,"\r\n]')


def _csv_scan(text: str, limit: int, state: list[int]) -> int | None:
    """Follow Python's csv reader (the default dialect) over ``text``, part of one record, from
    ``state`` = [field index, field length, quoting (0 outside a field, 1 in an unquoted field, 2
    inside quotes, 3 just after a quote inside quotes)], updated in place. Returns the index of
    the first field whose length passes ``limit``, if one does in ``text``."""
    field_no, length, mode = state
    first: int | None = None
    at, end = 0, len(text)
    while at < end:
        if mode == 2:  # inside quotes: everything up to the next quote is the field's
            q = text.find('"', at)
            stop = end if q < 0 else q
            length += stop - at
            at, mode = (stop, 2) if q < 0 else (stop + 1, 3)
            if first is None and length > limit:
                first = field_no
            continue
        m = _CSV_STOPS.search(text, at)
        stop = end if m is None else m.start()
        length += stop - at
        if mode == 3 and stop > at:
            mode = 1  # a character after the closing quote: kept, unquoted (not strict)
        at = stop
        if m is not None:
            c = text[stop]
            at = stop + 1
            if c == '"':
                if mode == 0:
                    mode = 2
                elif mode == 3:
                    mode, length = 2, length + 1  # a doubled quote: one quote in the field
                else:
                    length += 1  # a quote inside an unquoted field is kept as it is
        if first is None and length > limit:
            first = field_no
        if m is not None and text[stop] != '"':
            if text[stop] == ",":
                field_no, length, mode = field_no + 1, 0, 0
            else:  # a line end outside quotes ends the record
                mode = 0
    state[:] = [field_no, length, mode]
    return first


def _long_field(
    path: Path, text: Iterator[str], first: int, last: int, header: list[str], limit: int
) -> tuple[tuple[int, str, str], str, int]:
    """A CSV record (from line ``first``) whose field passed the csv reader's limit at line
    ``last``: its quarantine failure (line, reason, raw text), the field's name, and how many
    more lines of the record were read from ``text`` (the reader stopped inside the field, so a
    quoted field that goes on is read to its end here, not taken for new records)."""
    with open_binary(path) as fb:
        again = io.TextIOWrapper(fb, encoding="utf-8-sig", newline="")
        record = list(itertools.islice(again, first - 1, last))
    state = [0, 0, 0]
    found = None
    for line in record:
        got = _csv_scan(line, limit, state)
        found = got if found is None else found
    extra = 0
    kept = sum(map(len, record))
    while state[2] == 2:  # inside quotes at the end of the line: the record goes on
        more = next(text, None)
        if more is None:
            break
        extra += 1
        got = _csv_scan(more, limit, state)
        found = got if found is None else found
        if kept < RAW_LIMIT:  # (only the start of the record is kept as its raw text)
            record.append(more)
            kept += len(more)
    index = found if found is not None else 0
    name = header[index] if index < len(header) else f"field {index + 1}"
    raw = "".join(record)[:RAW_LIMIT]
    why = f"field longer than {limit:,} characters (the most ingest reads in one CSV field): {name}"
    return (first, why, raw), name, extra


def csv_batches(path: Path, spec: FormatSpec, size: int | None = None) -> Iterator[RawBatch]:
    """Stream a CSV file; columns matched to the layout by case-insensitive header name. A field
    may be as long as the longest record ingest reads (MAX_RECORD_BYTES, as characters: Python's
    csv reader stops at 128 Ki by default); a record with a longer one is quarantined, naming its
    line and field, and the rest of the file is read."""
    layout, required = spec.layout, spec.required_columns
    project = [*project_polars(spec.fields, flat=True), pl.col("source_line")]
    limit = MAX_RECORD_BYTES
    saved_limit = csv.field_size_limit(limit)
    try:
        with open_binary(path, size) as fb:
            text = io.TextIOWrapper(fb, encoding="utf-8-sig", newline="")  # a BOM is not the header
            reader = csv.reader(text)
            header = next(reader, None)
            if header is None:
                raise SourceError(f"{path}: empty CSV file")
            lower = [h.strip().lower() for h in header]
            missing = [c for c in required if c not in lower]
            if missing:
                raise _missing_columns(path, spec, header, missing)
            wanted = [name for name in layout if name.lower() in lower]
            defaults = {k: v for k, v in spec.absent_defaults.items() if k not in wanted}
            index = [lower.index(name.lower()) for name in wanted]
            width = len(header)
            cols: list[list[str | None]] = [[] for _ in wanted]
            lines: list[int] = []
            failures: list[tuple[int, str, str]] = []
            fields: dict[int, str] = {}
            skew = 0  # lines of records cut at a too-long field, read here rather than by the reader
            after = reader.line_num  # a record starts on the line after the previous one ends
            while True:
                try:
                    for row in reader:
                        n, after = after + 1, reader.line_num + skew  # (a quoted field may span lines)
                        if not row or (len(row) == 1 < width and not row[0].strip()):  # a blank line: no record
                            continue  # (as in JSON Lines, where blank or whitespace lines are skipped)
                        if all(not c.strip() for c in row):
                            failures.append((n, "every field is empty", ",".join(row)[:RAW_LIMIT]))
                            continue
                        if len(row) != width:
                            raw = ",".join(row)[:RAW_LIMIT]
                            failures.append((n, f"expected {width} fields, found {len(row)}", raw))
                            continue
                        for j, i in enumerate(index):
                            v = row[i]
                            cols[j].append(v if v != "" else None)
                        lines.append(n)
                        if len(lines) >= BATCH_LINES:
                            frame = _csv_frame(layout, wanted, cols, lines, defaults).select(project)
                            yield RawBatch(frame, failures, fields)
                            cols, lines, failures, fields = [[] for _ in wanted], [], [], {}
                    break
                except csv.Error as exc:
                    if "field larger than field limit" not in str(exc):
                        raise
                    failure, name, extra = _long_field(path, text, after + 1, reader.line_num + skew, header, limit)
                    skew += extra
                    after = reader.line_num + skew
                    failures.append(failure)
                    fields[failure[0]] = name
            if lines or failures:
                yield RawBatch(_csv_frame(layout, wanted, cols, lines, defaults).select(project), failures, fields)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise SourceError(f"{path}: cannot parse as CSV ({exc})") from None
    except (OSError, EOFError) as exc:
        raise SourceError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from None
    finally:
        csv.field_size_limit(saved_limit)


def _csv_frame(
    layout: Layout,
    wanted: list[str],
    cols: list[list[str | None]],
    lines: list[int],
    defaults: Mapping[str, str],
) -> pl.DataFrame:
    data: dict[str, Any] = {
        name: pl.Series(name, [defaults.get(name)] * len(lines), dtype=pl.String) for name in layout
    }
    for name, values in zip(wanted, cols, strict=True):
        data[name] = pl.Series(name, values, dtype=pl.String)
    data["source_line"] = pl.Series("source_line", lines, dtype=pl.Int64)
    return pl.DataFrame(data)


# --- OpenTelemetry OTLP JSON ---------------------------------------------------------------------


def _clean(text: str) -> str:
    """``text`` with any lone surrogate (a "\\ud800" escape in the JSON) as U+FFFD: a column
    cannot hold it, and the value is as unreadable either way."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _attr_value(v: dict[str, Any]) -> str | None:
    for key in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if key in v and v[key] is not None:
            return _clean(str(v[key]))
    return None


def _attrs(items: Any) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and "key" in item and isinstance(item.get("value"), dict):
                out[str(item["key"])] = _attr_value(item["value"])
    return out


#: Attributes read as the tenant, in order (resource first, then span).
_OTEL_TENANT = ("tenant.id", "gen_ai.user.id", "enduser.id", "user.id")
_OTEL_STATUS: dict[int | str, str] = {1: "ok", 2: "error", "STATUS_CODE_OK": "ok", "STATUS_CODE_ERROR": "error"}
_OTEL_TTFT = ("gen_ai.server.time_to_first_token", "gen_ai.response.time_to_first_chunk")


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` when obj is an object, else None (a hostile document has any type anywhere)."""
    return obj.get(key) if isinstance(obj, dict) else None


def _items(obj: Any) -> list[Any]:
    return obj if isinstance(obj, list) else []


def _text(value: Any) -> str | None:
    """A span field as text: OTLP JSON writes 64-bit integers as strings, some exporters as
    numbers; anything else (an object, a list) is kept as JSON text for a per-record reason."""
    if value is None:
        return None
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, dict | list):
        return json.dumps(value)  # ASCII: lone surrogates stay escapes
    return str(value)


def _kind(value: Any) -> str:
    """What a JSON value is, for a reason: "null", "a number", "a string", ..."""
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(type(value), "a number")


def _span_attrs(items: Any) -> tuple[dict[str, str | None], str | None, str | None]:
    """A span's attributes, or why they cannot be read and the attribute at fault (a span whose
    attributes are unreadable might be a GenAI span: it is quarantined, not passed over as "not a
    request"). An attribute without a value is read as absent, unless it is a ``gen_ai.`` one (its
    count would then be taken as missing, with a misleading reason). A key given twice in a GenAI
    span is a fault (OTLP attribute keys are unique; which value counts is anyone's guess), as a
    duplicate key of a JSON record is."""
    if not isinstance(items, list):
        return {}, f"span attributes are {_kind(items)}, not a list", None
    out: dict[str, str | None] = {}
    twice: str | None = None
    for i, item in enumerate(items, 1):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            return {}, f"span attribute {i} is not a {{key, value}} object: {json.dumps(item)[:60]}", None
        key, value = item["key"], item.get("value")
        if not isinstance(value, dict):
            if key.startswith("gen_ai."):
                return {}, f"GenAI attribute without a value: {key[:80]} = {json.dumps(value)[:40]}", key[:200]
            continue
        if key in out and twice is None:
            twice = key
        out[key] = _attr_value(value)
    if twice is not None and any(k.startswith("gen_ai.") for k in out):
        return {}, f"span attribute {twice[:80]} is given more than once (OTLP attribute keys are unique)", twice[:200]
    return out, None, None


#: One OTel record that cannot be read: (reason, the field at fault, its raw text or None for the
#: line's own).
_OtelBad = tuple[str, str | None, str | None]


def _span_raw(span: Any) -> str:
    """A span's own JSON (its quarantine record's raw text), within RAW_LIMIT."""
    return json.dumps(span)[:RAW_LIMIT]


def _otel_rows(doc: Any, line: int) -> tuple[list[dict[str, Any]], list[_OtelBad], str | None]:
    """The GenAI spans of one OTLP document as rows, the spans (or lists of spans) that cannot be
    read, each one quarantined record (its reason names the span: its number in the document and
    its spanId; its raw text is the span's own JSON), and the reason the document is no trace
    export at all. Each row carries its span's label and place (``_where``, ``_span``), for a
    reason and raw text of its own if it fails validation."""
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
        return [], [], "record has no resourceSpans list (not an OTLP trace export)"
    rows = []
    bad: list[_OtelBad] = []
    n_span = 0  # spans of the document so far
    for r, rs in enumerate(doc["resourceSpans"], 1):
        where = f"resourceSpans[{r}]"
        if not isinstance(rs, dict):
            bad.append((f"{where} is {_kind(rs)}, not an object", None, None))
            continue
        res = _attrs(_get(_get(rs, "resource"), "attributes"))
        scopes = rs.get("scopeSpans", [])
        if not isinstance(scopes, list):
            bad.append((f"{where}.scopeSpans is {_kind(scopes)}, not a list", None, None))
            continue
        for s_no, ss in enumerate(scopes, 1):
            scope = f"{where}.scopeSpans[{s_no}]"
            if not isinstance(ss, dict):
                bad.append((f"{scope} is {_kind(ss)}, not an object", None, None))
                continue
            spans = ss.get("spans", [])
            if not isinstance(spans, list):
                bad.append((f"{scope}.spans is {_kind(spans)}, not a list of spans", None, None))
                continue
            for k, span in enumerate(spans, 1):
                n_span += 1
                if not isinstance(span, dict):
                    bad.append((f"span is {_kind(span)}, not an object: {scope}.spans[{k}]", None, _span_raw(span)))
                    continue
                sid = span.get("spanId")
                shown = _text(sid) if sid is not None else "(none)"
                label = f"span {n_span} of the record ({scope}.spans[{k}]), spanId {shown}"
                attrs, why, at_fault = _span_attrs(span.get("attributes", []))
                if why is not None:
                    bad.append((f"{why}: {label[:300]}", at_fault, _span_raw(span)))
                    continue
                if not any(k.startswith("gen_ai.") for k in attrs):
                    continue  # not a GenAI span (HTTP, DB, ...): not a request record
                row: dict[str, Any] = {otel_column(k): v for k, v in attrs.items() if k.startswith("gen_ai.")}
                row["span_id"] = _text(sid)
                row["trace_id"] = _text(span.get("traceId"))
                row["start"] = _text(span.get("startTimeUnixNano"))
                row["end"] = _text(span.get("endTimeUnixNano"))
                merged = {**res, **attrs}
                row["tenant"] = next((merged[k] for k in _OTEL_TENANT if merged.get(k)), None)
                row["ttft_s"] = next((attrs[k] for k in _OTEL_TTFT if attrs.get(k)), None)
                code = _get(span.get("status"), "code")
                row["status"] = _OTEL_STATUS.get(code) if isinstance(code, int | str) else None
                row["source_line"] = line
                row["_where"] = label[:300]
                row["_span"] = f"{r},{s_no},{k}"
                rows.append(row)
    return rows, bad, None


def otel_batches(path: Path, spec: FormatSpec, size: int | None = None) -> Iterator[RawBatch]:
    """OTLP JSON: one ExportTraceServiceRequest per line (file exporter) or one whole document.
    Spans that cannot be read (not an object, attributes not a list, a GenAI attribute without a
    value) and lists of spans that are not lists are quarantined, one record each."""
    first = _first_char(path)
    if first != b"{":
        raise SourceError(f"{path}: not OTLP JSON (expected an object with resourceSpans)")
    whole: Any = None
    try:
        first_batch = next(iter_line_batches(path, batch_lines=1), None)
        json.loads(first_batch.lines[0]) if first_batch else None
    except json.JSONDecodeError:
        try:
            with open_binary(path) as fh:
                whole = json.load(fh)
        except ValueError as exc:  # not JSON, not UTF-8, or a number too long for int()
            raise SourceError(f"{path}: invalid OTLP JSON document ({exc})") from None
        except RecursionError:
            raise SourceError(f"{path}: invalid OTLP JSON document (nested too deeply to read)") from None
    except (ValueError, RecursionError):
        pass  # a first line not UTF-8, nested too deeply or with a huge number: one bad record, below
    if whole is not None:
        rows: list[dict[str, Any]]
        rows, bad, err = _otel_rows(whole, 1)
        if err:
            raise SourceError(f"{path}: {err}")
        text = _head_text(path)
        doc = whole
        yield RawBatch(
            _otel_frame(spec, rows),
            [(1, why, raw or text) for why, _, raw in bad],
            failure_field_list=[f for _, f, _ in bad],
            span_text=lambda _n, at: _span_at(doc, at),
        )
        return
    limit = MAX_RECORD_BYTES
    for batch in iter_line_batches(path, batch_lines=10_000, limit=limit, size=size):
        rows = []
        failures: list[tuple[int, str, str]] = []
        fields: list[str | None] = []
        for line, n in zip(batch.lines, batch.numbers, strict=True):
            text = line[:RAW_LIMIT].decode("utf-8", errors="replace")
            if len(line) > limit:
                failures.append((n, _too_long(limit), text))
                fields.append(None)
                continue
            try:
                doc = json.loads(line)
            except ValueError as exc:  # not JSON, not UTF-8, or a number too long for int()
                failures.append((n, f"invalid JSON: {exc}", text))
                fields.append(None)
                continue
            except RecursionError:
                failures.append((n, "invalid JSON: nested too deeply to read", text))
                fields.append(None)
                continue
            got, bad, err = _otel_rows(doc, n)
            if err:
                failures.append((n, err, text))
                fields.append(None)
            failures += [(n, why, raw or text) for why, _, raw in bad]
            fields += [f for _, f, _ in bad]
            rows.extend(got)
        yield RawBatch(_otel_frame(spec, rows), failures, failure_field_list=fields, span_text=_SpanText(batch))


def _span_at(doc: Any, at: str) -> str:
    """The JSON of the span at ``at`` ("r,s,k", 1-based) of an OTLP document."""
    r, s, k = (int(x) - 1 for x in at.split(","))
    return _span_raw(doc["resourceSpans"][r]["scopeSpans"][s]["spans"][k])


class _SpanText:
    """The spans of a batch of OTLP lines by line and place, parsed again only for the spans
    that fail validation (each line once): keeping every span's text cost a fifth of the read."""

    def __init__(self, batch: LineBatch) -> None:
        self._lines = dict(zip(batch.numbers, batch.lines, strict=True))
        self._doc: tuple[int, Any] | None = None

    def __call__(self, line: int, at: str) -> str:
        if self._doc is None or self._doc[0] != line:
            self._doc = (line, json.loads(self._lines[line]))
        return _span_at(self._doc[1], at)


def _head_text(path: Path) -> str:
    """The first RAW_LIMIT bytes of a file as text (a whole-document record's raw text)."""
    with open_binary(path) as fh:
        return fh.read(RAW_LIMIT).decode("utf-8", errors="replace")


def _too_long(limit: int) -> str:
    return f"record is longer than {limit:,} bytes, the most ingest reads"


def _otel_frame(spec: FormatSpec, rows: list[dict[str, Any]]) -> pl.DataFrame:
    # each flat column from its raw keys in the spec's priority order (the first non-null wins), as
    # project_polars reads the other formats: keying the column by its own name dropped every
    # column whose raw key differs from it (``ttft_raw`` from the span's ``ttft_s``)
    def first(row: dict[str, Any], keys: tuple[str, ...]) -> Any:
        return next((row[k] for k in keys if row.get(k) is not None), None)

    data: dict[str, Any] = {
        name: pl.Series(name, [first(r, keys) for r in rows], dtype=pl.String) for name, keys in spec.fields.items()
    }
    data["source_line"] = pl.Series("source_line", [r["source_line"] for r in rows], dtype=pl.Int64)
    # each span's label and JSON, for the quarantine record of a span that fails validation
    data["_where"] = pl.Series("_where", [r["_where"] for r in rows], dtype=pl.String)
    data["_span"] = pl.Series("_span", [r["_span"] for r in rows], dtype=pl.String)
    return pl.DataFrame(data)


# --- Parquet (generic, through a mapping) ---------------------------------------------------------


def parquet_batches(path: Path, spec: FormatSpec) -> Iterator[RawBatch]:
    if logical_name(path) != path.name:
        raise SourceError(f"{path}: compressed Parquet is not supported (Parquet compresses itself)")
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a non-Parquet file
        raise SourceError(f"{path}: not a readable Parquet file ({exc})") from None
    top = set(pf.schema_arrow.names)
    missing = sorted({p.split(".")[0] for paths in spec.fields.values() for p in paths} - top)
    if missing:
        raise SourceError(f"{path}: Parquet file lacks mapped columns {missing}")
    types = _flat_types(spec)
    row = 0
    for rb in pf.iter_batches(batch_size=BATCH_LINES):
        frame = pl.from_arrow(rb)
        assert isinstance(frame, pl.DataFrame)
        flat = frame.select(project_polars(spec.fields))
        cols = {
            name: _as_text(flat, name) if types[name] == pl.String else pl.col(name).cast(types[name], strict=False)
            for name in types
        }
        try:
            out = flat.select(list(cols.values()))
        except pl.exceptions.PolarsError:
            # a column's type says how every row holds it: one that cannot be read as text (or as
            # a list of hashes) is a file-level mismatch, named here
            for name, expr in cols.items():
                try:
                    flat.select(expr)
                except pl.exceptions.PolarsError:
                    want = "a list of block hashes" if name in spec.list_fields else "text or a number"
                    column = spec.labels.get(name, name)
                    raise SourceError(f"{path}: Parquet column {column!r} is {flat.schema[name]}, not {want}") from None
            raise
        n = flat.height
        out = out.with_columns(source_line=pl.int_range(row + 1, row + n + 1, dtype=pl.Int64))
        row += n
        yield RawBatch(out)


def _as_text(frame: pl.DataFrame, name: str) -> pl.Expr:
    dtype = frame.schema[name]
    col = pl.col(name)
    if isinstance(dtype, pl.Datetime):
        if dtype.time_zone:
            col = col.dt.convert_time_zone("UTC")
        return col.dt.to_string("%Y-%m-%dT%H:%M:%S%.f").alias(name)
    return col.cast(pl.String, strict=False)
