"""Opening source files: decompression, content hashing, binary detection, format sniffing,
and streaming line batches with their 1-based line numbers."""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import json
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import duckdb
import numpy as np
import zstandard

from pipeline.common.errors import RooftraceError
from pipeline.common.system import not_regular
from pipeline.ingest.formats import SNIFFED

#: Lines per batch in streaming readers: bounds memory (a batch of OpenAI JSON lines is ~30 MB).
BATCH_LINES = 100_000

COMPRESSED_SUFFIXES = (".gz", ".zst")
_NEWLINE = 10


class SourceError(RooftraceError):
    """A whole file cannot be read (truncated, binary, wrong format). Other files still ingest."""


@dataclass(frozen=True)
class LineBatch:
    lines: list[bytes]  # raw lines without the newline, blank lines removed
    numbers: list[int]  # 1-based physical line numbers, aligned with ``lines``


#: File names taken from a directory (a named file is always tried, whatever its name).

#: The longest record ingest reads and format detection sniffs.
MAX_RECORD_BYTES = 1 << 26
#: The longest record the JSON fast path asks DuckDB to read (its ``maximum_object_size``). DuckDB
#: sizes its read buffers by it, and a file that fits in one buffer is parsed by one thread: at
#: 64 MiB, JSON files under about 64 MB used one core. A file with a longer record fails the fast
#: path and is read line by line, which takes records up to MAX_RECORD_BYTES.
FAST_RECORD_BYTES = 1 << 24


#: A log file's name in a folder (after any compression suffix): a log suffix, optionally
#: followed by a rotation suffix (``app.log.1``, ``day.jsonl.3.gz``, ``app.log-20250115``).
_LOG_NAME = re.compile(r"\.(jsonl|ndjson|json|csv|log|parquet)([.-][0-9][0-9-]*)?$", re.IGNORECASE)

#: Files of a folder that are not log files named one by one on stderr, before a count of the rest.
SKIPPED_NAMED = 10


def is_log_name(path: Path) -> bool:
    """Whether ingest reads ``path`` when it is found in a folder (a file named directly is
    always read)."""
    return _LOG_NAME.search(logical_name(path)) is not None


def _walk(
    folder: Path, say: Callable[[str], None], exclude: dict[tuple[int, int], str] | None = None
) -> Iterator[Path]:
    """Every entry under ``folder`` that is not a folder, leaving out hidden names. Real folders
    are read first; then each link to a folder, in name order, unless its folder was already read
    (under its real name or another link: said on ``say``), so a tree without links is read as
    ``sorted(folder.rglob("*"))`` reads it and a link never hides its folder's real name. A folder
    that cannot be read is said, not silently passed over, and so is a folder of ``exclude``
    ((device, inode) -> why: the store's own folder), which is not read."""
    seen: set[tuple[int, int]] = set()
    links: list[Path] = []
    excluded = exclude or {}

    def read(top: Path, via_link: bool) -> Iterator[Path]:
        todo = [top]
        while todo:
            d = todo.pop()
            try:
                st = os.stat(d)
                if (st.st_dev, st.st_ino) in seen:
                    if via_link and d == top:
                        say(f"{d}: skipped: a link to a folder read under another name")
                    continue
                seen.add((st.st_dev, st.st_ino))
                why = excluded.get((st.st_dev, st.st_ino))
                if why is not None:
                    say(f"{d}: skipped: {why}")
                    continue
                entries = list(os.scandir(d))
            except OSError as exc:
                say(f"{d}: skipped: cannot be read ({exc.strerror or exc})")
                continue
            for e in entries:
                if e.name.startswith("."):
                    continue
                try:
                    real_dir = e.is_dir(follow_symlinks=False)
                    linked_dir = not real_dir and e.is_symlink() and e.is_dir()
                except OSError:
                    real_dir = linked_dir = False
                if real_dir:
                    todo.append(Path(e.path))
                elif linked_dir:
                    links.append(Path(e.path))
                else:
                    yield Path(e.path)

    yield from read(folder, via_link=False)
    done = 0
    while done < len(links):  # (links found under a link's folder join the queue)
        pending = sorted(links[done:])
        del links[done:]
        links.extend(pending)
        for link in pending:
            done += 1
            yield from read(link, via_link=True)


def iter_files(
    sources: list[Path], skipped: Callable[[str], None] | None = None, exclude: Path | None = None
) -> Iterator[Path]:
    """Files named directly, and the log files (by name: :func:`is_log_name`) under named
    folders, sorted. Nothing is passed over in silence: a file of a folder whose name is not a
    log file's, a folder that cannot be read and a link back to a folder already read are said on
    ``skipped``; a folder with no log file at all is a SourceError. The folder ``exclude`` (the
    store's own, when it lies inside a folder being read) is not read, and said on ``skipped``.

    Only regular files are read: a named one that is not (a FIFO, socket, device) is a
    SourceError; one found in a folder is skipped, with a message to ``skipped``."""
    say = skipped if skipped is not None else (lambda _m: None)
    excluded: dict[tuple[int, int], str] = {}
    if exclude is not None:
        try:
            st = os.stat(exclude)
            excluded[(st.st_dev, st.st_ino)] = "the store's own folder (it lies inside the folder being ingested)"
        except OSError:
            pass  # no store folder yet: nothing of it to pass over
    for src in sources:
        try:
            is_dir, exists = src.is_dir(), src.exists()
        except OSError as exc:  # a name too long for the file system, a loop of links, ...
            raise SourceError(f"{src}: cannot be read ({exc.strerror or exc})") from None
        if not exists and os.path.islink(src):  # a link to nothing, or to itself through others
            try:
                os.stat(src)
            except OSError as exc:
                raise SourceError(f"{src}: cannot be read ({exc.strerror or exc})") from None
        if is_dir:
            found = 0
            other: list[Path] = []
            for p in sorted(_walk(src, say, excluded)):
                if not is_log_name(p):
                    other.append(p)
                    continue
                why = not_regular(p)
                if why is not None:
                    say(f"{p}: skipped: {why}, not a regular file")
                    continue
                found += 1
                yield p
            for p in other[:SKIPPED_NAMED]:
                say(f"{p}: skipped: not a log file name (*.jsonl, *.ndjson, *.json, *.csv, *.log, *.parquet; "
                    "compressed or rotated as .gz, .zst, .1); name it directly to read it")  # fmt: skip
            if len(other) > SKIPPED_NAMED:
                say(f"{src}: {len(other) - SKIPPED_NAMED:,} more files skipped: not log file names")
            if not found:
                more = f" ({len(other):,} other file(s) skipped: name them directly to read them)" if other else ""
                raise SourceError(f"{src}: no log files in this folder{more}")
        elif exists:
            why = not_regular(src)
            if why is not None:
                raise SourceError(f"{src}: {why}, not a regular file; ingest reads regular files only")
            yield src
        else:
            raise SourceError(f"{src}: no such file or directory")


def absolute_source(src: str | Path) -> Path:
    """A SOURCE as ingest walks it: absolute, with ``.`` and ``..`` resolved and links followed
    (``os.path.realpath``) when it exists; one that does not (or a broken link, a loop of
    links) is made absolute as it is spelled (``os.path.abspath``), so its error names it."""
    try:
        if os.path.exists(src):
            return Path(os.path.realpath(src))
    except (OSError, ValueError):
        pass
    return Path(os.path.abspath(src))


def file_identity(path: Path) -> Path:
    """The name a file is recorded by (manifest, stored rows, quarantine, messages): its
    absolute path, normalised, with every symbolic link resolved (``os.path.realpath``). Two
    spellings of one file (``a.csv`` from its folder, ``./x/../x/a.csv``, a link to it) are one
    file; two files with the same relative path in different folders are two."""
    return Path(os.path.realpath(path))


@dataclass(frozen=True)
class LineStats:
    lines: int  # physical lines (a last line without a newline counts)
    longest: int = 0  # bytes of the longest line, its newline left out (a "\r" before it counted)


def count_lines(chunks: Iterator[bytes]) -> LineStats:
    """Newline count and the longest line. Blank lines need no separate check: DuckDB skips
    them, so a file with any blank line yields fewer rows than lines and the JSON fast path
    falls back to the robust one. The longest line is how the fast path keeps the record limit
    (MAX_RECORD_BYTES): DuckDB reads a longer record whatever its ``maximum_object_size``."""
    n = 0
    tail = b"\n"
    base = 0  # offset of the chunk in the file
    last = -1  # offset of the last newline seen
    longest = 0
    for chunk in chunks:
        # numpy finds newlines about 3x faster than bytes.count and releases the GIL meanwhile.
        at = np.flatnonzero(np.frombuffer(chunk, np.uint8) == _NEWLINE)
        if at.size:
            n += int(at.size)
            longest = max(longest, base + int(at[0]) - last - 1)
            if at.size > 1:
                longest = max(longest, int(np.diff(at).max()) - 1)
            last = base + int(at[-1])
        base += len(chunk)
        tail = chunk[-1:]
    longest = max(longest, base - last - 1)
    if tail != b"\n":
        n += 1
    return LineStats(n, longest)


def copy_range(src: Path, start: int, end: int, dest: Path) -> None:
    """Bytes ``start:end`` of ``src`` into a new file ``dest`` (in the kernel where it can:
    ``copy_file_range``; else through a buffer)."""
    with src.open("rb") as fin, dest.open("wb") as fout:
        at, left = start, end - start
        try:
            while left > 0:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), min(left, 1 << 30), at)
                if n == 0:
                    raise OSError(f"{src}: shorter than expected ({at} of {end} bytes)")
                at, left = at + n, left - n
        except (AttributeError, OSError) as exc:
            if isinstance(exc, OSError) and "shorter" in str(exc):
                raise
            fin.seek(at)
            while left > 0:
                chunk = fin.read(min(left, 1 << 22))
                if not chunk:
                    raise OSError(f"{src}: shorter than expected ({at} of {end} bytes)") from None
                fout.write(chunk)
                at, left = at + len(chunk), left - len(chunk)


class HashCancelled(Exception):
    """A background hash was stopped because its file is no longer wanted."""


def sha256_file(
    path: Path, stop: threading.Event | None = None, size: int | None = None, shrink_ok: bool = False
) -> tuple[str, LineStats | None]:
    """SHA-256 of the file's bytes and, for an uncompressed file, its line statistics from the same
    read (the JSON fast path needs them; a compressed file is counted when decompressed). Setting
    ``stop`` ends the read at the next chunk with HashCancelled. With ``size``, only the first
    ``size`` bytes are read (the bytes a split read took: a file that grows meanwhile is then
    seen as grown by the next run, its new lines read then); fewer is an OSError, unless
    ``shrink_ok`` (a serial read, whose readers stop at the file's end too: the hash and rows are
    then both of the file as it was cut)."""
    h = hashlib.sha256()
    plain = logical_name(path) == path.name
    left = [size]

    def chunk_of(fh: IO[bytes]) -> bytes:
        want = 1 << 22 if left[0] is None else min(1 << 22, left[0])
        if want <= 0:
            return b""
        data = fh.read(want)
        if left[0] is not None:
            left[0] -= len(data)
        return data

    def read() -> Iterator[bytes]:
        # The hash of chunk i runs on a worker thread (hashlib releases the GIL) while chunk i is
        # counted and chunk i+1 read; updates stay in file order (one pending at a time).
        with path.open("rb") as fh, ThreadPoolExecutor(1) as pool:
            pending: Future[None] | None = None
            for chunk in iter(lambda: chunk_of(fh), b""):
                if stop is not None and stop.is_set():
                    raise HashCancelled(str(path))
                if pending is not None:
                    pending.result()
                pending = pool.submit(h.update, chunk)
                yield chunk
            if pending is not None:
                pending.result()
            short = left[0]
            if size is not None and short and not shrink_ok:  # the file shrank below the bytes its pieces read
                raise OSError(f"shorter than when it was read ({size - short:,} of {size:,} bytes)")

    if plain:
        stats: LineStats | None = count_lines(read())
    else:
        for _ in read():
            pass
        stats = None
    return h.hexdigest(), stats


#: Threads each DuckDB connection of ingest may use: set by a parallel ingest for its worker
#: processes (cores / workers), so that they share the machine instead of each taking it all.
THREADS_ENV = "ROOFTRACE_INGEST_THREADS"


_DUCK_BASE: duckdb.DuckDBPyConnection | None = None
_DUCK_LOCK = threading.Lock()


def duck_connect() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection for reading and hashing: no progress bar, and the thread budget of a
    parallel ingest's worker (``THREADS_ENV``) when one is set. Each is a new connection (a
    cursor: its own registrations and temporary objects, safe to use on its own thread) to one
    in-memory database per process: opening a database cost about 45 ms, most of the fixed cost
    of reading a small file (a run of 3,000 one-line files took minutes); a cursor costs 0.5 ms."""
    global _DUCK_BASE
    with _DUCK_LOCK:
        if _DUCK_BASE is None:
            base = duckdb.connect()
            threads = os.environ.get(THREADS_ENV, "")
            if threads.isdigit() and int(threads) > 0:
                base.execute(f"SET threads = {int(threads)}")
            _DUCK_BASE = base
        con = _DUCK_BASE.cursor()
    con.execute("SET enable_progress_bar = false")
    return con


class FileDigest:
    """A file's SHA-256 and line statistics (``sha256_file``), computed at once or, with
    ``background``, on a worker thread while the caller already parses the file. ``sha()`` and
    ``stats()`` wait for the result and raise what the hashing raised."""

    def __init__(self, path: Path, background: bool = False, size: int | None = None, shrink_ok: bool = False) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rooftrace-hash") if background else None
        self._stop = threading.Event()
        self.size = size  # the bytes hashed (None: the whole file)
        if self._pool is not None:
            self._future: Future[tuple[str, LineStats | None]] = self._pool.submit(
                sha256_file, path, self._stop, size, shrink_ok
            )
            self._pool.shutdown(wait=False)
        else:
            self._future = Future()
            self._future.set_result(sha256_file(path, size=size, shrink_ok=shrink_ok))

    @property
    def background(self) -> bool:
        return self._pool is not None

    def sha(self) -> str:
        return self._future.result()[0]

    def stats(self) -> LineStats | None:
        return self._future.result()[1]

    def close(self) -> None:
        """Stop a hash still running (its file failed or is being skipped) and wait for the
        worker, so no read of the file outlives the caller's use of it."""
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def logical_name(path: Path) -> str:
    """The file name without a compression suffix (``a.jsonl.gz`` -> ``a.jsonl``)."""
    name = path.name
    for suf in COMPRESSED_SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


class _ZstdReader(io.RawIOBase):
    """A ``.zst`` file decompressed frame after frame, that raises EOFError when the file ends
    inside a frame (a truncated file), as gzip does; a plain stream reader just stops there."""

    def __init__(self, path: Path, size: int | None = None) -> None:
        self._fh = _raw_open(path, size)
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._fed = False  # whether the current frame has had any input
        self._buf = b""
        self._pos = 0

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        while True:
            chunk = self._fh.read(1 << 20)
            if not chunk:
                if self._fed and not self._obj.eof:
                    raise EOFError("zstd data ends inside a frame (truncated file)")
                return False
            data = b""
            while chunk:
                data += self._obj.decompress(chunk)
                self._fed = True
                chunk = b""
                if self._obj.eof:  # a frame ended: what follows starts the next one
                    chunk = self._obj.unused_data
                    self._obj = self._dctx.decompressobj()
                    self._fed = False
            if data:
                self._buf, self._pos = data, 0
                return True

    def readinto(self, b: Any) -> int:
        if self._pos >= len(self._buf) and not self._fill():
            return 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._fh.close()
        super().close()


class _GzipReader(io.RawIOBase):
    """A ``.gz`` file decompressed, whose corrupt data is an OSError (gzip.BadGzipFile) like its
    other read errors: gzip lets zlib.error out of a damaged stream."""

    def __init__(self, path: Path, size: int | None = None) -> None:
        self._raw = _raw_open(path, size)
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="rb")

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            data = self._gz.read1(len(b))
        except zlib.error as exc:
            raise gzip.BadGzipFile(f"corrupt gzip data ({exc})") from None
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._gz.close()
        self._raw.close()
        super().close()


class _Prefix(io.RawIOBase):
    """The first ``size`` bytes of a file (fewer if it is shorter): what a read of a file that
    may be growing takes, so that its rows and its hash cover the same bytes."""

    def __init__(self, path: Path, size: int) -> None:
        self._fh = path.open("rb", buffering=0)
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._left <= 0:
            return 0
        view = memoryview(b)[: min(len(b), self._left)]
        n = self._fh.readinto(view) or 0
        self._left -= n
        return n

    def close(self) -> None:
        self._fh.close()
        super().close()


def _raw_open(path: Path, size: int | None) -> IO[bytes]:
    if size is None:
        return path.open("rb")
    return io.BufferedReader(_Prefix(path, size), buffer_size=1 << 20)


def open_binary(path: Path, size: int | None = None) -> IO[bytes]:
    """Open ``path`` for reading, transparently decompressing ``.gz`` and ``.zst``; with
    ``size``, only the file's first ``size`` bytes (as stored) are read."""
    if path.name.endswith(".gz"):
        return io.BufferedReader(_GzipReader(path, size), buffer_size=1 << 20)
    if path.name.endswith(".zst"):
        return io.BufferedReader(_ZstdReader(path, size), buffer_size=1 << 20)
    return _raw_open(path, size)


def read_head(path: Path, size: int = 1 << 16, skip: int = 0) -> bytes:
    """The first ``size`` decompressed bytes (after the first ``skip``); errors become a
    one-line SourceError."""
    try:
        with open_binary(path) as fh:
            while skip > 0:
                got = len(fh.read(min(skip, 1 << 20)))
                if not got:
                    return b""
                skip -= got
            return fh.read(size)
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        raise SourceError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from None


#: Magic numbers of compressions ingest does not read, so the error can say which it is.
_OTHER_COMPRESSION = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip", b"\x04\x22\x4d\x18": "lz4"}


#: Byte-order marks of the Unicode encodings other than UTF-8 (UTF-32 first: its little-endian
#: mark starts with UTF-16's).
_OTHER_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32", "UTF-32LE"),
    (codecs.BOM_UTF32_BE, "UTF-32", "UTF-32BE"),
    (codecs.BOM_UTF16_LE, "UTF-16", "UTF-16LE"),
    (codecs.BOM_UTF16_BE, "UTF-16", "UTF-16BE"),
)


def _other_unicode(head: bytes) -> tuple[str, str] | None:
    """(what it is, iconv's name for it) of a UTF-16 or UTF-32 text, by its byte-order mark or,
    without one, by the NUL byte every ASCII character of UTF-16 has on the same side; else None."""
    for bom, name, codec in _OTHER_BOMS:
        if head.startswith(bom):
            return f"{name} text (byte-order mark {bom.hex(' ').upper()})", codec
    sample = head[: min(len(head), 256) & ~1]
    if len(sample) >= 8:
        even, odd = sample[0::2], sample[1::2]
        if odd.count(0) == len(odd) and 0 not in even:
            return "UTF-16 text (little-endian, no byte-order mark)", "UTF-16LE"
        if even.count(0) == len(even) and 0 not in odd:
            return "UTF-16 text (big-endian, no byte-order mark)", "UTF-16BE"
    return None


#: Bytes judged for a binary file, and the share of NUL bytes among them that makes it one. A
#: text log with a stray NUL (a line cut by a crash) is read, its line quarantined; a leading run
#: of NULs (``logrotate copytruncate`` leaves the old size as a zero-filled hole before the new
#: lines) is passed over and the text after it judged: the run costs only the line it is on.
BINARY_SAMPLE = 8192
BINARY_NUL_SHARE = 0.10


def leading_nuls(path: Path, head: bytes) -> int | None:
    """Where the file's leading run of NUL bytes ends (0 without one), reading past ``head``
    (its first bytes) as far as the run goes; None when the file is nothing but NULs."""
    end = len(head) - len(head.lstrip(b"\x00"))
    if end < len(head) or not head:
        return end  # (an empty file is no binary one: it is said to be empty)
    try:
        with open_binary(path) as fh:
            at = 0
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    return None
                rest = chunk.lstrip(b"\x00")
                if rest:
                    return at + len(chunk) - len(rest)
                at += len(chunk)
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        raise SourceError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from None


def check_text(path: Path, head: bytes) -> None:
    other = _other_unicode(head)
    if other is not None:
        what, codec = other
        raise SourceError(
            f"{path}: {what}; ingest reads UTF-8 only: convert it first (iconv -f {codec} -t UTF-8 FILE > FILE.utf8)"
        )
    for magic, kind in _OTHER_COMPRESSION.items():
        if head.startswith(magic):
            raise SourceError(
                f"{path}: compressed with {kind}, which ingest does not read; "
                "decompress it, or use gzip (.gz) or zstd (.zst)"
            )
    start = leading_nuls(path, head)
    if start is None:
        raise SourceError(f"{path}: binary file (nothing but NUL bytes), not a text log")
    sample = head[start : start + BINARY_SAMPLE] if start < len(head) else read_head(path, BINARY_SAMPLE, start)
    nuls = sample.count(0)
    if nuls > len(sample) * BINARY_NUL_SHARE:
        at = start + sample.index(0)
        raise SourceError(
            f"{path}: binary file ({nuls:,} NUL bytes in {len(sample):,}"
            f"{f' after a run of {start:,} NUL bytes' if start else ''}, the first at byte {at:,}), not a text log"
        )
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character may be cut at the boundary; only judge well inside the sample.
        # A stray bad byte in one record is that record's problem (it is quarantined); a file
        # with many is not UTF-8 text at all.
        invalid = sum(1 for ch in sample[:8188].decode("utf-8", "surrogateescape") if "\udc80" <= ch <= "\udcff")
        if exc.start < 8188 and invalid > len(sample) // 100:
            raise SourceError(f"{path}: not UTF-8 text (byte {exc.start})") from None


class LongLine(bytes):
    """A line longer than the record limit, read no further than its limit: the bytes are its
    start (at most ``LONG_LINE_KEPT``), ``len()`` its true length (so every length check against
    the limit sees it), and the rest of the line was skipped unread into memory."""

    length: int

    def __new__(cls, head: bytes, length: int) -> LongLine:
        obj = super().__new__(cls, head)
        obj.length = length
        return obj

    def __len__(self) -> int:
        return self.length


#: The start of a line past the record limit that is kept (its quarantine record's raw text).
LONG_LINE_KEPT = 1 << 16
#: Bytes read at a time while skipping the rest of a line past the record limit.
_SKIP_CHUNK = 1 << 20


def iter_lines(fh: IO[bytes], limit: int | None = None) -> Iterator[bytes]:
    """The physical lines of ``fh`` (each with its newline, as ``for line in fh`` gives them),
    except that a line longer than ``limit`` bytes (MAX_RECORD_BYTES by default; its newline and
    a "\r" before it not counted) is never held whole: it is read up to the limit, the rest
    skipped in chunks to the next newline, and it comes as a :class:`LongLine` of its start whose
    ``len()`` is its length. Memory stays near the limit whatever the line's length."""
    limit = MAX_RECORD_BYTES if limit is None else limit
    want = limit + 3  # room for "\r\n" after a line of exactly the limit
    while True:
        raw = fh.readline(want)
        if not raw:
            return
        if raw.endswith(b"\n") or len(raw) < want:
            yield raw
            continue
        length, blank = len(raw), not raw.strip()
        head = raw[:LONG_LINE_KEPT]
        last = raw[-2:]
        del raw
        while not last.endswith(b"\n"):
            more = fh.readline(_SKIP_CHUNK)
            if not more:
                break
            length += len(more)
            blank = blank and not more.strip()
            last = (last + more)[-2:]
            if len(head) < LONG_LINE_KEPT:  # (a limit below the start kept)
                head += more[: LONG_LINE_KEPT - len(head)]
        if blank:  # a (very long) blank line is no record, as a short one is not
            yield b"\n"
            continue
        if last.endswith(b"\n"):
            length -= 2 if last == b"\r\n" else 1
        yield LongLine(head[:length], length)


def _strip_eol(raw: bytes) -> bytes:
    if isinstance(raw, LongLine):
        return raw  # its length leaves the newline out already
    return raw.rstrip(b"\r\n")


def iter_line_batches(
    path: Path, batch_lines: int = BATCH_LINES, limit: int | None = None, size: int | None = None
) -> Iterator[LineBatch]:
    """Stream the decompressed file as batches of non-blank lines with their line numbers. A
    line past ``limit`` (MAX_RECORD_BYTES) is a :class:`LongLine` (its start; ``len()`` its
    length), never read whole. With ``size``, only the first ``size`` bytes of the file (as
    stored, before decompression) are read: the bytes its hash covers."""
    try:
        with open_binary(path, size) as fh:
            lines: list[bytes] = []
            numbers: list[int] = []
            for n, raw in enumerate(iter_lines(fh, limit), start=1):
                line = _strip_eol(raw)
                if n == 1 and not isinstance(line, LongLine):
                    line = line.removeprefix(codecs.BOM_UTF8)  # a byte-order mark is not data
                if not isinstance(line, LongLine) and not line.strip():
                    continue
                lines.append(line)
                numbers.append(n)
                if len(lines) >= batch_lines:
                    yield LineBatch(lines, numbers)
                    lines, numbers = [], []
            if lines:
                yield LineBatch(lines, numbers)
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        raise SourceError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from None


def fetch_lines(path: Path, wanted: set[int], limit: int = 65536) -> dict[int, str]:
    """Raw text of the given 1-based lines (for quarantine records)."""
    out: dict[int, str] = {}
    if not wanted:
        return out
    last = max(wanted)
    try:
        with open_binary(path) as fh:
            for n, raw in enumerate(iter_lines(fh), start=1):
                if n in wanted:
                    out[n] = _strip_eol(raw)[:limit].decode("utf-8", errors="replace")
                if n >= last:
                    break
    except (OSError, EOFError, zstandard.ZstdError):
        pass  # the raw text is best effort; the reason and line are already recorded
    return out


def first_line_complete(head: bytes) -> bool:
    """Whether the first non-blank line of ``head`` ends inside it (a newline follows it)."""
    body = head.removeprefix(codecs.BOM_UTF8).lstrip()
    return b"\n" in body


def sniff_format(path: Path, head: bytes, whole: bool = True) -> str:
    """Guess the log format from the file name and its first record. ``whole`` says ``head`` is
    the whole file; when it is not and the first record does not end inside it, a JSON record
    that fails to parse is reported as cut short, not as a bad record."""
    name = logical_name(path).lower()
    if name.endswith(".parquet"):
        raise SourceError(f"{path}: Parquet input needs --format parquet and a --mapping")
    text = head.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not first:
        raise SourceError(f"{path}: empty file")
    if first.startswith("{") or first.startswith("["):
        try:
            return _sniff_json(path, first, text)
        except SourceError:
            if not whole and not first_line_complete(head):
                raise SourceError(
                    f"{path}: the first record is longer than the {len(head):,} bytes format detection "
                    "reads; pass --format"
                ) from None
            raise
    header = first.lower().replace('"', "")
    cols = {c.strip() for c in header.split(",")}
    for name, rule in SNIFFED:  # each format's rule lives on its spec (formats.py, Sniff)
        if rule.matches_header(cols):
            return name
    raise SourceError(f"{path}: cannot detect the log format from its header; pass --format")


def _first_array_element(text: str) -> Any:
    """The first element of a JSON array whose text is cut short, if that element is whole."""
    start = re.match(r"\s*\[\s*", text)
    if start is None:
        return None
    try:
        return json.JSONDecoder().raw_decode(text, start.end())[0]
    except ValueError:  # not JSON, or a number too long for int()
        return None


def _sniff_json(path: Path, first: str, text: str) -> str:
    try:
        return _sniff_json_record(path, first, text)
    except RecursionError:
        raise SourceError(f"{path}: first record is nested too deeply to read; pass --format") from None


def _sniff_json_record(path: Path, first: str, text: str) -> str:
    try:
        obj = json.loads(first)
    except ValueError:  # not JSON (or a number too long for int())
        # A JSON array export or a pretty-printed document: parse what we have of it.
        try:
            obj = json.loads(text)
        except ValueError:
            # Larger than the head: an array's first element may still be whole in it, and an
            # OTLP document says what it is in its first key.
            obj = _first_array_element(text)
            if obj is None:
                for name, rule in SNIFFED:
                    lead = rule.json_leading_key
                    if lead and re.match(r"\s*\{\s*" + re.escape(json.dumps(lead)) + r"\s*:", text):
                        return name
    if isinstance(obj, list):
        obj = obj[0] if obj else None
    if not isinstance(obj, dict):
        raise SourceError(f"{path}: first record is not a JSON object; pass --format")
    record = obj
    blob: list[str] = []

    def record_text() -> str:  # the record's JSON text, made once and only for a rule that reads it
        if not blob:
            blob.append(json.dumps(record))
        return blob[0]

    for name, rule in SNIFFED:  # each format's rule lives on its spec (formats.py, Sniff)
        if rule.matches_record(record, record_text):
            return name
    raise SourceError(f"{path}: cannot detect the JSON log format; pass --format")
