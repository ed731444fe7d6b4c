"""The on-disk store: where each stage's Parquet lives, a lock for writers, and the commit that
moves a writer's new files into place.

Layout (docs/architecture.md, Data flow)::

    STORE/requests/date=YYYY-MM-DD/part-00000.parquet   canonical requests (schema ``requests``)
    STORE/quarantine/file=<sha256 prefix>.parquet        rejected records (schema ``quarantine``)
    STORE/manifest.parquet                               one row per ingested file (schema ``manifest``)
    STORE/accounting/...                                 classify outputs
    STORE/runs/<run_id>/...                              replay outputs
    STORE/.staging/<run_id>/                             a writer's work in progress (never read)

A date's requests are the files the store wrote there (:meth:`Store.request_files`, which every
reader goes through): ``part-NNNNN.parquet`` in a store ingest wrote, every ``*.parquet`` in one
built without ingest (no manifest), never a byte copy of another. Anything else in the folder is
named in one ``warning:`` line and not read; a request file that cannot be read is one error
naming it and saying how to rebuild the date (docs/ingest.md, "What a date folder holds").

Readers never see a partial write (docs/limits.md): ingest writes every new file under
``STORE/.staging/<run_id>/commit/`` (outside every glob readers use), then writes a journal (the
commit point) and moves the files into place, each by one rename. A run killed before the commit
point leaves only its staging folder: the store is as it was. A run killed after it is finished
from the journal by the next process that takes the lock or opens the store (``open_store``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date as _date
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.common.errors import RooftraceError, SchemaError
from pipeline.common.schemas import check_file_schema, load_schema, read_parquet, unreadable
from pipeline.common.system import not_regular
from pipeline.ingest.project import default_store_path

_DATE_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


def check_date(text: str) -> str:
    """``text`` if it is a real calendar date written YYYY-MM-DD; else a one-line error."""
    if not _DATE_RE.match(text):
        raise RooftraceError(f"date {text!r} is not YYYY-MM-DD")
    try:
        _date.fromisoformat(text)
    except ValueError as exc:
        raise RooftraceError(f"date {text!r} is not YYYY-MM-DD: {exc}") from None
    return text


#: Characters DuckDB and polars read as a glob pattern in a path, and the backslash, which DuckDB
#: reads as a path separator (``back\\slash/st`` is not the folder it names).
GLOB_CHARS = frozenset("*?[]{}\\")

#: What an id built from data (a run, plan or cost id: date, fleet or model name, digest) may be
#: when it names a file or folder: letters, digits, '.', '_' and '-', not starting with '.', at
#: most 200 characters (docs/limits.md, "Paths").
SAFE_ID_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")


def confined(root: Path, name: str, what: str = "id") -> Path:
    """``root / name``, for a ``name`` built from data or read from the command line: refused
    (one-line RooftraceError) unless it is one safe path component (:data:`SAFE_ID_RE`, so no
    ``/``, ``..``, glob or markup characters) and the path resolves inside ``root`` (not through
    a symbolic link to elsewhere)."""
    if not isinstance(name, str) or not SAFE_ID_RE.fullmatch(name):
        raise RooftraceError(
            f"{what} {name!r} is not a safe name (1-200 letters, digits, '.', '_' or '-', not starting "
            f"with '.'): refusing to use it as a path under {root}"
        )
    path = root / name
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        raise RooftraceError(f"{what} {name!r}: {path} resolves outside {root}; refusing to use it") from None
    return path


@dataclass(frozen=True)
class Store:
    root: Path

    def __post_init__(self) -> None:
        # The store is read through glob patterns (requests/*/*.parquet, runs/*/...): a root that
        # is itself a pattern would match other folders or nothing.
        bad = sorted(GLOB_CHARS & set(str(self.root)))
        if bad:
            chars = " ".join(sorted(GLOB_CHARS))
            raise RooftraceError(
                f"store path {self.root} contains {' '.join(bad)}: use a folder name without any of {chars} "
                "(DuckDB reads them as a pattern or, the backslash, as a separator)"
            )
        if self.root.exists() and not self.root.is_dir():
            raise RooftraceError(f"store path {self.root} is a file, not a folder (check --store or $ROOFTRACE_STORE)")

    @property
    def requests_dir(self) -> Path:
        return self.root / "requests"

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.parquet"

    @property
    def accounting_dir(self) -> Path:
        return self.root / "accounting"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def warehouse_path(self) -> Path:
        """The DuckDB file of views over the store (rebuilt from the Parquet; never the record)."""
        return self.root / "warehouse.duckdb"

    @property
    def cache_dir(self) -> Path:
        """Derived files kept between runs (the unpacked Vega bundle of the reports)."""
        return self.root / ".cache"

    @property
    def validation_dir(self) -> Path:
        return self.root / "validation"

    def run_dir(self, run_id: str) -> Path:
        """``runs/<run id>/``, the id checked to be one safe path component."""
        return confined(self.runs_dir, run_id, "run id")

    def plan_dir(self, plan_id: str) -> Path:
        return confined(self.root / "plans", plan_id, "plan id")

    def cost_dir(self, subject: str) -> Path:
        """``costs/<run or plan id>/``."""
        return confined(self.root / "costs", subject, "run or plan id")

    @property
    def staging_dir(self) -> Path:
        """Writers' work in progress (hidden: no reader's glob matches it)."""
        return self.root / STAGING

    def partition(self, table_dir: Path, date: str) -> Path:
        return table_dir / f"date={check_date(date)}"

    def dates(self) -> list[str]:
        """Arrival dates that have a requests partition, oldest first. A folder of ``requests/``
        that is not ``date=YYYY-MM-DD`` of a real date (``date=2025-13-45``, a copy such as
        ``date=2025-01-15.bak``) is named once per process in a ``warning:`` line on stderr and
        never read; hidden names (``.date=…``: a killed writer's leftovers) are neither."""
        if not self.requests_dir.is_dir():
            return []
        try:
            entries = sorted(self.requests_dir.iterdir())
        except OSError as exc:
            raise RooftraceError(f"{self.requests_dir}: cannot list the store's dates: {_os_reason(exc)}") from None
        dates = []
        for p in entries:
            if p.name.startswith(".") or not p.is_dir():
                continue
            day = p.name.removeprefix("date=")
            if p.name.startswith("date=") and _DATE_RE.match(day):
                try:
                    _date.fromisoformat(day)
                except ValueError:
                    pass
                else:
                    dates.append(day)
                    continue
            _warn_once(
                f"warning: {_shown(p)}: not a date partition (the store names them date=YYYY-MM-DD); "
                f"not read as requests, move it out of {_shown(self.requests_dir)}"
            )
        return dates

    def resolve_date(self, date: str | None) -> str:
        """``date`` if given (and present), else the latest date in the store."""
        dates = self.dates()
        if not dates:
            raise RooftraceError(f"{self.requests_dir}: no requests ingested yet (run `rooftrace ingest`)")
        if date is None:
            return dates[-1]
        check_date(date)
        if date not in dates:
            raise RooftraceError(f"{self.requests_dir}: no partition for date {date}; have {dates}")
        return date

    def stored_rows(self, date: str) -> int:
        """Requests stored for ``date`` (0 when it has no partition), from the files' footers."""
        if not (self.requests_dir / f"date={date}").exists():
            return 0
        total = 0
        for p in self.request_files(date):
            with damaged_request_file(p):
                total += pq.read_metadata(p).num_rows
        return total

    def request_files(self, date: str) -> list[Path]:
        """The store's own request files of a date partition, sorted by name (:meth:`partition_files`).
        Anything else in the folder is named once per process in a ``warning:`` line on stderr
        and never read."""
        files, foreign = self.partition_files(date)
        for path, why in foreign:
            _warn_foreign(path, why)
        gap = self.unaccounted(date, files)
        if gap is not None:
            _warn_once(f"warning: {gap.message()}")
        return files

    def unaccounted(self, date: str, files: list[Path] | None = None) -> Unaccounted | None:
        """Whether the store's files of ``date`` hold more rows than the manifest counts stored
        on it: a ``part-NNNNN.parquet`` that is not the store's (another date's part copied in,
        the same rows re-saved by another writer) that names cannot tell apart. The manifest
        counts a source file's stored rows over all its dates, so dates that share a file are
        checked together. None when they agree, when there is no manifest (a store built
        without ingest) or when a file's footer cannot be read (its reader says why). Fewer rows
        than counted is not reported: a damaged file moved out of the store leaves that, as
        documented (docs/ingest.md, "What a date folder holds")."""
        if not self.manifest_path.exists():
            return None
        try:
            entries = _manifest_rows(self.manifest_path)
        except (OSError, pa.ArrowException, KeyError, TypeError, ValueError):
            return None
        group = {date}
        grown = True
        while grown:
            grown = False
            for _, days, _src in entries:
                if group.intersection(days) and not group.issuperset(days):
                    group.update(days)
                    grown = True
        expected = sum(n for n, days, _src in entries if group.intersection(days))
        logs = sorted({src for _n, days, src in entries if date in days})
        held = 0
        shown: list[Path] = []
        try:
            for day in sorted(group):
                day_files = files if day == date and files is not None else self.partition_files(day)[0]
                for f in day_files:
                    held += _footer_rows(f)
                    shown.append(f)
        except (OSError, pa.ArrowException):
            return None
        if held <= expected:
            return None
        return Unaccounted(self, date, sorted(group), held, expected, shown, logs)

    def partition_files(self, date: str) -> tuple[list[Path], list[tuple[Path, str]]]:
        """(the store's own request files of ``date``, the other entries of its folder with why
        each is not the store's). A store written by ingest (it has ``manifest.parquet``) holds
        only files named ``part-NNNNN.parquet`` (:data:`REQUEST_FILE_RE`: ingest writes
        ``part-00000.parquet``, an older layout numbered further parts); a store built without
        ingest (no manifest: Parquet of the ``requests`` schema written into date folders by a
        library caller) is every ``*.parquet``. A byte-for-byte copy of a file before it in
        name order is never the store's, whatever its name. Hidden names (``.x``: a writer's
        temporary file) are neither."""
        folder = self.partition(self.requests_dir, date)
        try:
            entries = sorted(folder.iterdir()) if folder.is_dir() else []
        except OSError as exc:
            raise RooftraceError(f"{folder}: cannot list the partition: {_os_reason(exc)}") from None
        ingested = self.manifest_path.exists()
        files: list[Path] = []
        foreign: list[tuple[Path, str]] = []
        for p in entries:
            if p.name.startswith("."):
                continue
            irregular = _irregular(p)
            if irregular is not None:
                foreign.append((p, f"{irregular}, not a regular file"))
            elif not self.owns_name(p, ingested):
                why = "ingest names its files part-NNNNN.parquet" if ingested else "not a .parquet file"
                foreign.append((p, why))
            else:
                files.append(p)
        return _drop_copies(files, foreign)

    def owns_name(self, path: Path, ingested: bool | None = None) -> bool:
        """Whether ``path``'s name is one the store gives a request file: ``part-NNNNN.parquet``
        in a store ingest wrote (``ingested``: it has a manifest), any ``*.parquet`` otherwise."""
        if ingested is None:
            ingested = self.manifest_path.exists()
        if ingested:
            return REQUEST_FILE_RE.fullmatch(path.name) is not None
        return path.name.endswith(".parquet") and not path.name.startswith(".")

    def read_requests(
        self, date: str | None = None, columns: Sequence[str] | None = None, positions: bool = False
    ) -> pl.DataFrame:
        """All canonical requests of one arrival date (the latest when ``date`` is None), sorted
        by arrival then request id (:func:`arrival_order`); only ``columns`` when given (read
        and put in order one column at a time, so the date is never held twice, and the request
        ids read only where arrivals tie unless asked for), with ``positions``: and a
        ``_position`` column, each row's place in the date's files (:class:`ColumnReader`)."""
        date = self.resolve_date(date)
        files = self.request_files(date)
        if not files:
            raise RooftraceError(f"{self.partition(self.requests_dir, date)}: empty partition")
        if columns is not None:
            return _read_sorted(files, list(columns), positions)
        frames = []
        for p in files:
            with damaged_request_file(p):
                frames.append(pl.from_arrow(read_parquet(p, "requests")))
        out = pl.concat([f for f in frames if isinstance(f, pl.DataFrame)], how="vertical", rechunk=False)
        del frames
        ids = out.get_column("request_id")
        order = arrival_order(epoch_us(out.get_column("arrival")), lambda rows: ids.gather(rows))
        return out if order is None else out[order]

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive writer lock on the store, so two runs at once cannot corrupt it.

        Re-entrant within one process (the nightly job holds it while its stages take it again);
        another process gets a one-line error instead of waiting. Whoever takes it first finishes
        or undoes what a killed writer left (:meth:`recover`). A store that cannot be written
        (read-only, no space for the lock file) is a one-line error naming the path.
        """
        key = str(self.root.resolve())
        if _HELD.get(key, 0):
            _HELD[key] += 1
            try:
                yield
            finally:
                _HELD[key] -= 1
            return
        path = self.root / ".lock"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fh = path.open("a")
        except OSError as exc:
            raise RooftraceError(f"{_os_path(exc, path)}: cannot lock the store: {_os_reason(exc)}") from None
        with fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RooftraceError(
                    f"{path}: another rooftrace run holds the store lock; wait for it to finish"
                ) from None
            _HELD[key] = 1
            try:
                try:
                    self.recover()
                except OSError as exc:
                    raise store_write_error(self, exc) from None
                yield
            finally:
                _HELD[key] = 0
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def check_writable(self, folder: Path) -> None:
        """Refuse, in one line, a store whose ``folder`` (or, while it does not exist, whose root)
        this process cannot write: before a long run, not after it. Nothing is left behind."""
        import tempfile

        try:
            fd, probe = tempfile.mkstemp(prefix=".probe.", dir=folder if folder.is_dir() else self.root)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise store_write_error(self, exc) from None

    def check_unlocked(self) -> None:
        """Refuse now, in one line, when another process holds the store's lock: a long run
        (replay, plan) would otherwise find out only when it writes, its work lost. A store
        that does not exist yet is not created."""
        if self.root.is_dir():
            with self.lock():
                pass

    def leftovers(self) -> list[Path]:
        """What killed writers left behind: staging folders, half-swapped partitions of older
        versions (``requests/.date=…``) and the temporary files of atomic writes."""
        found: list[Path] = []
        if self.staging_dir.is_dir():
            found.append(self.staging_dir)
        if self.requests_dir.is_dir():
            found += sorted(p for p in self.requests_dir.iterdir() if p.name.startswith(".date="))
        for folder in (self.root, self.quarantine_dir):
            if folder.is_dir():
                found += sorted(p for p in folder.glob(".*.tmp") if p.is_file())
        return found + self.stage_temp_files()

    def stage_temp_files(self) -> list[Path]:
        """The temporary files of atomic and streamed writes (:data:`TEMP_NAME_RE`) that a killed
        writer left in the folders the stages write into: runs/<id>/, the accounting partitions,
        the request partitions, plans/<id>/, costs/<id>/, validation/ (any folder down to three
        levels below the store, hidden ones excepted). Never a file that a live process has open.
        A replay writes its run's tables into runs/<id>/ before it takes the store lock and
        renames them under it, so there a temporary file is a leftover only when the run's
        config.json was written after it (a later replay of the run completed) or when it has not
        changed for :data:`RUN_TEMP_IDLE_S`; the other stages write under the lock, which the
        caller holds. Where /proc cannot say which files are open, nothing is found here."""
        if not self.root.is_dir():
            return []
        found = []
        for pattern in ("*/.*.tmp", "*/*/.*.tmp", "*/*/*/.*.tmp"):
            for path in self.root.glob(pattern):
                inside = path.relative_to(self.root).parts[:-1]
                if any(part.startswith(".") for part in inside) or not TEMP_NAME_RE.fullmatch(path.name):
                    continue
                if path.parent == self.quarantine_dir or path.is_symlink() or not path.is_file():
                    continue  # (quarantine/: swept with the top folder, as ever)
                found.append(path)
        if not found:
            return []
        busy = _open_files()
        if busy is None:
            return []
        now = time.time()
        out = []
        for path in found:
            if str(path.resolve()) in busy:
                continue  # a live writer's work in progress
            if path.parent.parent == self.runs_dir:
                config = path.parent / "config.json"
                try:
                    changed = path.stat().st_mtime
                    done = config.stat().st_mtime if config.is_file() else None
                except OSError:
                    continue
                if not ((done is not None and done > changed) or now - changed > RUN_TEMP_IDLE_S):
                    continue  # perhaps a replay's table between its last write and its rename
            out.append(path)
        return sorted(out)

    def recover(self) -> list[Path]:
        """Finish or undo what killed writers left (call it holding the lock; ``lock`` does).

        A staging folder with a commit journal is rolled forward (its remaining moves are made);
        one without is removed. A partition swap of the older layout (``.date=D.old-…`` /
        ``.date=D.new-…``) is undone: the old partition is put back, the new one dropped. Returns
        what was repaired."""
        found = self.leftovers()
        for p in found:
            if p == self.staging_dir:
                for run_dir in sorted(p.iterdir()) if p.is_dir() else []:
                    if (run_dir / JOURNAL).is_file():
                        with contextlib.suppress(ValueError, KeyError, TypeError):  # not a journal it wrote
                            Commit.roll_forward(self, run_dir)
                    shutil.rmtree(run_dir, ignore_errors=True)
                shutil.rmtree(p, ignore_errors=True)
            elif p.parent == self.requests_dir and p.is_dir():
                final = self.requests_dir / p.name[1:].split(".old-")[0].split(".new-")[0]
                if ".old-" in p.name and not final.exists():
                    p.rename(final)
                else:
                    shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        return found

    def commit(self, run_id: str) -> Commit:
        """A new commit whose files are staged under STORE/.staging/<run_id>/commit/."""
        return Commit(self, self.staging_dir / run_id)


#: The temporary name of an atomic or streamed write (pipeline/common/schemas.py: ``mkstemp`` with the
#: prefix ``.<file name>.`` and the suffix ``.tmp``, eight random characters between them).
TEMP_NAME_RE = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")

#: A temporary file in runs/<id>/ that no process has open and that has not changed for this
#: long is a killed replay's, even when no later replay of the run completed.
RUN_TEMP_IDLE_S = 3600.0


def _open_files() -> set[str] | None:
    """The paths of the files open in every process this user can see (``/proc/<pid>/fd``), or
    None where /proc cannot say (another system)."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    out: set[str] = set()
    for fds in proc.glob("[0-9]*/fd"):
        try:
            names = os.listdir(fds)
        except OSError:  # (another user's process, or one that just ended)
            continue
        for name in names:
            with contextlib.suppress(OSError):
                out.add(os.readlink(fds / name))
    return out


#: The hidden folder of writers' work in progress, and the journal that marks a commit point.
STAGING = ".staging"
JOURNAL = "COMMIT.json"


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _os_path(exc: OSError, default: Path) -> str:
    return str(exc.filename) if exc.filename else str(default)


def store_write_error(store: Store, exc: OSError) -> RooftraceError:
    """A one-line error for a failed write into the store, naming the path at fault."""
    return RooftraceError(f"{_os_path(exc, store.root)}: cannot write to the store: {_os_reason(exc)}")


@dataclass
class Commit:
    """New versions of store files, staged and then moved into place together.

    ``stage(target)`` gives the path to write ``target``'s new version to; ``remove(target)``
    drops a file or folder. ``apply()`` flushes the staged files to disk, writes the journal (the
    commit point, itself written atomically) and makes the moves in order: a file replaces its
    target by one rename; a staged folder whose target folder does not exist yet (a new date
    partition) is renamed in whole, so the partition appears with its file; a removed folder is
    first renamed out of sight. Each move is idempotent, so a roll-forward after a kill finishes
    the list whatever was done already."""

    store: Store
    root: Path
    ops: list[tuple[str, str]] = field(default_factory=list)

    @property
    def files_dir(self) -> Path:
        return self.root / "commit"

    def stage(self, target: Path) -> Path:
        rel = target.relative_to(self.store.root)
        staged = self.files_dir / rel
        staged.parent.mkdir(parents=True, exist_ok=True)
        self.ops.append(("replace", rel.as_posix()))
        return staged

    def remove(self, target: Path) -> None:
        self.ops.append(("remove", target.relative_to(self.store.root).as_posix()))

    def apply(self) -> None:
        if not self.ops:
            return
        for _, rel in self.ops:
            staged = self.files_dir / rel
            if staged.is_file():
                _fsync(staged)
        journal = self.root / JOURNAL
        tmp = self.root / f".{JOURNAL}.tmp"
        tmp.write_text(json.dumps({"version": 1, "ops": self.ops}))
        _fsync(tmp)
        os.replace(tmp, journal)  # the commit point
        self.roll_forward(self.store, self.root)

    @staticmethod
    def roll_forward(store: Store, root: Path) -> None:
        """Make the moves listed in ``root``'s journal that are not made yet."""
        ops = json.loads((root / JOURNAL).read_text())["ops"]
        files, trash = root / "commit", root / "trash"
        for op, rel in ops:
            target = store.root / rel
            if op == "remove":
                if target.is_dir():
                    trash.mkdir(parents=True, exist_ok=True)
                    gone = trash / f"{len(list(trash.iterdir())):05d}"
                    target.rename(gone)  # out of readers' sight in one step, then deleted
                    shutil.rmtree(gone, ignore_errors=True)
                else:
                    target.unlink(missing_ok=True)
                continue
            staged = files / rel
            if not staged.exists():
                continue  # moved already (or its folder was)
            if target.parent.is_dir():
                os.replace(staged, target)
            else:
                # A new folder (a new date partition): it appears whole, with its files.
                target.parent.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staged.parent, target.parent)
        (root / JOURNAL).unlink()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Stores this process holds the lock of, with the nesting depth.
_HELD: dict[str, int] = {}


def open_store(path: str | Path | None = None) -> Store:
    """The store at ``path`` (default: :func:`default_store_path`), repaired first when a killed
    writer left something behind and no other run holds the lock (a store that cannot be written
    is left as it is: readers ignore the leftovers). An empty path is refused: it would make the
    current directory a store."""
    if path is not None and not str(path).strip():
        raise RooftraceError("--store: the store path is empty (name a directory, e.g. --store traces/store)")
    store = Store(Path(path) if path is not None else default_store_path())
    try:
        if store.leftovers():
            with store.lock():
                pass  # taking the lock recovers
    except (RooftraceError, OSError):
        pass  # another run is writing (its leftovers are its work) or the store is read-only
    return store


#: The names ingest gives a date partition's files: ``part-00000.parquet`` (an older layout
#: numbered further parts, folded into ``part-00000`` by the next ingest into the date).
REQUEST_FILE_RE = re.compile(r"part-[0-9]{5}\.parquet")

#: How :meth:`Store.partition_files` says an entry is a copy of one of the store's files.
COPY_OF = "a byte-for-byte copy of "

#: Foreign entries of date folders already named by this process (each once, not at every listing).
_FOREIGN_WARNED: set[str] = set()

_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _shown(path: Path) -> str:
    """``path`` as text for a one-line message: control characters as escapes."""
    return _CONTROL_RE.sub(lambda m: ascii(m.group())[1:-1], str(path))


def _warn_foreign(path: Path, why: str) -> None:
    """One ``warning:`` line on stderr, once per process, for an entry of a date folder that is
    not one of the store's request files (never read as requests)."""
    _warn_once(
        f"warning: {_shown(path)}: not part of the store ({why}); not read as requests, "
        f"move it out of {_shown(path.parent.parent)}"
    )


def _warn_once(line: str) -> None:
    """``line`` on stderr, unless this process said it already."""
    if line in _FOREIGN_WARNED:
        return
    _FOREIGN_WARNED.add(line)
    print(line, file=sys.stderr, flush=True)


def _irregular(path: Path) -> str | None:
    """What ``path`` (links followed) is when it is not a regular file (a folder, a named pipe,
    a socket, a device: :func:`pipeline.common.schemas.not_regular`), without opening it: opening a FIFO
    blocks until a writer comes. None for a regular file, and for one that cannot be looked at
    (its reader says why)."""
    why = not_regular(path)
    return None if why is None or why.startswith("cannot be opened") else why


@dataclass(frozen=True)
class Unaccounted:
    """A date whose files hold more rows than the manifest counts stored on it
    (:meth:`Store.unaccounted`): ``dates`` are checked together (a source file stored rows on
    each), ``held`` rows in ``files``, ``counted`` in the manifest, ``logs`` the source files
    the manifest stored on ``date``."""

    store: Store
    date: str
    dates: list[str]
    held: int
    counted: int
    files: list[Path]
    logs: list[str]

    @property
    def extra(self) -> int:
        return self.held - self.counted

    def where(self) -> str:
        """The date, or the dates checked together with it."""
        return self.date if len(self.dates) == 1 else f"{', '.join(self.dates)} (checked together)"

    def names(self) -> str:
        """The files, by name (with their date folder when not ``date``'s), at most six."""
        folder = self.store.partition(self.store.requests_dir, self.date)
        shown = [
            _shown(Path(f.name) if f.parent == folder else f.relative_to(self.store.requests_dir))
            for f in self.files[:6]
        ]
        return ", ".join(shown) + (f" and {len(self.files) - 6} more" if len(self.files) > 6 else "")

    def message(self) -> str:
        """One line: the date, both counts, the files and how to repair it."""
        folder = self.store.partition(self.store.requests_dir, self.date)
        names = self.names()
        logs = ", ".join(self.logs[:3]) + (f" and {len(self.logs) - 3} more" if len(self.logs) > 3 else "")
        return (
            f"{_shown(folder)}: the store's files of {self.where()} hold {self.held} rows but the manifest "
            f"counts {self.counted} stored there ({self.extra} not from ingest: a part file copied in or "
            f"re-saved?); files: {names} -- repair it with `rooftrace ingest --force` of the date's "
            f"logs{f' ({logs})' if logs else ''}, or move the file that is not the store's out of "
            f"{_shown(self.store.requests_dir)}"
        )


#: The manifest's (rows stored, dates, source file) per entry, by the manifest's (inode, size, mtime).
_MANIFESTS: dict[tuple[str, int, int, int], list[tuple[int, frozenset[str], str]]] = {}


def _manifest_rows(path: Path) -> list[tuple[int, frozenset[str], str]]:
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _MANIFESTS:
        table = pq.read_table(path, columns=["rows_stored", "dates", "source_file"])
        _MANIFESTS.clear()
        _MANIFESTS[key] = [
            (int(n or 0), frozenset(days or []), str(src))
            for n, days, src in zip(
                table.column("rows_stored").to_pylist(),
                table.column("dates").to_pylist(),
                table.column("source_file").to_pylist(),
                strict=True,
            )
        ]
    return _MANIFESTS[key]


#: Footer row counts by (path, inode, size, mtime).
_FOOTERS: dict[tuple[str, int, int, int], int] = {}


def _footer_rows(path: Path) -> int:
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _FOOTERS:
        _FOOTERS[key] = pq.read_metadata(path).num_rows
    return _FOOTERS[key]


def _drop_copies(files: list[Path], foreign: list[tuple[Path, str]]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """``files`` less each one whose bytes equal a file's before it (moved to ``foreign``): a
    copy holds the same rows again. Only files of equal size are read, to compare."""
    by_size: dict[int, list[Path]] = {}
    for p in files:
        with contextlib.suppress(OSError):
            by_size.setdefault(p.stat().st_size, []).append(p)
    copies: dict[Path, Path] = {}
    for same in by_size.values():
        if len(same) < 2:
            continue
        first_of: dict[str, Path] = {}
        for p in same:
            try:
                digest = _file_sha256(p)
            except OSError:
                continue  # its reader says why it cannot be read
            if digest in first_of:
                copies[p] = first_of[digest]
            else:
                first_of[digest] = p
    if not copies:
        return files, foreign
    foreign = foreign + [(p, f"{COPY_OF}{copies[p].name}") for p in files if p in copies]
    return [p for p in files if p not in copies], sorted(foreign)


#: File digests by (path, inode, size, mtime): a date is listed many times in one command.
_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def _file_sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def damaged_hint(path: Path) -> str:
    """What to do about a stored request file that cannot be read (truncated, not Parquet, not
    the ``requests`` schema)."""
    day = path.parent.name.removeprefix("date=")
    return (
        f"the stored requests of {day} are damaged: rebuild the date with `rooftrace ingest --force` "
        "of its original logs, or move the file out of the store"
    )


@contextmanager
def damaged_request_file(path: Path) -> Iterator[None]:
    """A stored request file that cannot be read as one error naming it and saying what to do
    (:func:`damaged_hint`), never a traceback."""
    try:
        yield
    except SchemaError as exc:
        if " -- the stored requests of " in str(exc):
            raise
        raise SchemaError(f"{exc} -- {damaged_hint(path)}") from None
    except (OSError, pa.ArrowException) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SchemaError(f"{_shown(path)}: not a readable Parquet file: {first} -- {damaged_hint(path)}") from None


def _read_columns(path: Path, columns: Sequence[str]) -> pl.DataFrame:
    """Some columns of a requests file: its footer checked against the schema, then read by
    polars (a damaged file is one error naming it)."""
    with damaged_request_file(path):
        check_file_schema(path, "requests")
    try:
        frame = pl.read_parquet(path, columns=list(columns))
    except (OSError, pl.exceptions.PolarsError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RooftraceError(f"{path}: cannot read columns {list(columns)}: {first} -- {damaged_hint(path)}") from None
    required = [c.name for c in load_schema("requests").columns if not c.nullable and c.name in columns]
    nulls = [c for c in required if frame.get_column(c).null_count()]
    if nulls:
        raise RooftraceError(f"{path}: required columns {nulls} hold nulls -- {damaged_hint(path)}")
    return frame


def _read_sorted(files: list[Path], columns: list[str], positions: bool = False) -> pl.DataFrame:
    """``columns`` of the requests in ``files`` in :func:`arrival_order`: the arrivals read
    first to find the order, then each column read and put in that order on its own (and, with
    ``positions``, the order itself as ``_position``)."""
    # one buffer (a file's column comes in row groups): the order is found on it without a copy
    arrival = pl.concat([_read_columns(p, ["arrival"]).to_series() for p in files]).rechunk()
    order = arrival_order(epoch_us(arrival), lambda rows: _ids_at(files, rows))
    n = arrival.len()
    if order is not None and n < 2**32:
        order = order.astype(np.uint32)  # polars' row index type: 4 bytes a row
    out = {}
    for name in columns:
        if name == "arrival":
            col = arrival
        else:
            col = pl.concat([_read_columns(p, [name]).to_series() for p in files], rechunk=False)
        out[name] = col if order is None else col.gather(order)
        del col
    del arrival
    if positions:  # positions as polars indexes rows: 4 bytes a row
        at = np.arange(n, dtype=np.uint32 if n < 2**32 else np.int64) if order is None else order
        out["_position"] = pl.Series("_position", at)
    return pl.DataFrame(out)


def epoch_us(arrival: pl.Series) -> npt.NDArray[np.int64]:
    """Microseconds since the epoch of a datetime column (the stored one, in microseconds: a
    read-only view of its own buffer when it is one chunk, no copy)."""
    return arrival.dt.cast_time_unit("us").to_physical().to_numpy()


def arrival_order(
    arrival_us: npt.NDArray[np.int64], ids: Callable[[npt.NDArray[np.int64]], pl.Series]
) -> npt.NDArray[Any] | None:
    """The store's request order: rows sorted by arrival, then request id, then stored order;
    None when they are in that order already (most partitions are). ``ids(rows)`` gives the
    request ids of stored rows ``rows`` (increasing): only rows whose arrival another row
    shares are asked for, so a date's ids need not be read to order it."""
    n = arrival_us.shape[0]
    order = None if n < 2 or bool((arrival_us[1:] >= arrival_us[:-1]).all()) else np.argsort(arrival_us, kind="stable")
    a = arrival_us if order is None else arrival_us[order]
    same = a[1:] == a[:-1]  # in sorted order: row i + 1 arrives with row i
    del a
    if not same.any():
        return order
    tied = np.zeros(n, bool)
    tied[1:] |= same
    tied[:-1] |= same
    at = np.flatnonzero(tied)  # sorted places of rows that share their arrival
    del tied
    group = np.cumsum(~np.r_[False, same][at])  # one number per arrival the tied rows share
    del same
    rows = at if order is None else order[at]  # their stored rows
    up = np.argsort(rows, kind="stable")
    back = np.empty_like(up)
    back[up] = np.arange(up.shape[0])
    rid = ids(rows[up]).gather(back)
    within = pl.DataFrame({"g": group, "id": rid}).select(pl.arg_sort_by(["g", "id"], maintain_order=True))
    moved = rows[within.to_series().to_numpy()]  # the tied rows, each tie put in id order
    if order is None and bool((moved == at).all()):
        return None  # (only tied rows can move: the rest stays where it is)
    full = np.arange(n, dtype=np.int64) if order is None else order
    full[at] = moved
    return full


def _ids_at(files: list[Path], rows: npt.NDArray[np.int64]) -> pl.Series:
    """The request ids of the date's rows ``rows`` (increasing positions over ``files``), read
    a row group at a time: only the groups that hold them."""
    parts: list[pl.Series] = []
    for first, size, read in _row_groups(files, "request_id"):
        lo, hi = np.searchsorted(rows, [first, first + size])
        if hi > lo:
            part = pl.from_arrow(read().take(pa.array(rows[lo:hi] - first)))
            assert isinstance(part, pl.Series)
            parts.append(part.cast(pl.String))
    ids = pl.concat(parts) if parts else pl.Series("request_id", [], pl.String)
    if ids.null_count():
        raise RooftraceError(f"{files[0].parent}: required column request_id holds nulls")
    return ids


def _row_groups(files: list[Path], column: str) -> Iterator[tuple[int, int, Callable[[], pa.ChunkedArray]]]:
    """(its first row over ``files``, its rows, a reader of ``column`` in it) for each row group
    of ``files`` in order; a file that cannot be read is one error naming it."""
    first = 0
    for path in files:
        with damaged_request_file(path), unreadable(path):
            fh = pq.ParquetFile(path)
            sizes = [fh.metadata.row_group(g).num_rows for g in range(fh.metadata.num_row_groups)]
        for g, size in enumerate(sizes):

            def read(fh: pq.ParquetFile = fh, g: int = g, path: Path = path) -> pa.ChunkedArray:
                with damaged_request_file(path), unreadable(path):
                    return fh.read_row_group(g, columns=[column]).column(0)

            yield first, size, read
            first += size


class ColumnReader:
    """One column of a date's request files, read back a slice of rows at a time in the order
    :meth:`Store.read_requests` returned them (``positions``: its ``_position`` column), so a
    long run need not hold it. The files must not change meanwhile: a file ingested again since
    is one error asking to run again."""

    def __init__(self, store: Store, date: str, name: str, positions: npt.NDArray[Any]) -> None:
        self.files, self.name = store.request_files(date), name
        self.positions = np.asarray(positions)  # polars' row index type (4 bytes a row)
        if not np.issubdtype(self.positions.dtype, np.integer):
            raise TypeError(f"positions must be integers, not {self.positions.dtype}")
        self._stamps = [_stamp(f) for f in self.files]
        rows = []
        for f in self.files:
            with damaged_request_file(f), unreadable(f):
                rows.append(pq.ParquetFile(f).metadata.num_rows)
        self.starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        if self.positions.size and (self.positions.min() < 0 or self.positions.max() >= self.starts[-1]):
            raise RooftraceError(f"{self.files[0].parent}: the request rows changed while they were read; run again")

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    def digest(self, h: Any, chunk: int = 1 << 20) -> None:
        """Feed ``h`` (a hashlib object) the polars hashes (seed 0) of the column in the returned
        order, the bytes ``Series.hash(seed=0)`` of the whole ordered column gives, reading it a
        row group at a time (8 bytes a row held)."""
        self._check()
        stored = np.empty(int(self.starts[-1]), np.uint64)
        at = 0
        for first, size, read in _row_groups(self.files, self.name):
            at = first + size
            if at > stored.shape[0]:
                break  # more rows than when the reader was made: the check below says so
            col = pl.from_arrow(read())
            assert isinstance(col, pl.Series)
            stored[first:at] = col.hash(seed=0).to_numpy()
        if at != stored.shape[0]:
            raise RooftraceError(f"{self.files[0].parent}: the request rows changed while they were read; run again")
        for a in range(0, len(self), chunk):
            h.update(np.ascontiguousarray(stored[self.positions[a : a + chunk]]).data)

    def _check(self) -> None:
        if [_stamp(f) for f in self.files] != self._stamps:
            raise RooftraceError(
                f"{self.files[0].parent}: the date's requests changed during the run (ingested again?); run it again"
            )

    def slice(self, offset: int, length: int) -> pa.Array:
        """Rows ``offset`` to ``offset + length`` (in the returned order) of the column."""
        pos = self.positions[offset : offset + length]
        self._check()
        file_of = np.searchsorted(self.starts, pos, side="right") - 1
        by_file = np.argsort(file_of, kind="stable")
        parts = []
        for k in np.unique(file_of).tolist():
            local = pos[file_of == k].astype(np.int64) - self.starts[k]
            parts.append(self._take(self.files[k], local))
        values = pa.concat_arrays(parts) if parts else pa.array([], pa.large_string())
        back = np.empty_like(by_file)
        back[by_file] = np.arange(by_file.shape[0])
        return values.take(pa.array(back))

    def _take(self, path: Path, local: npt.NDArray[np.int64]) -> pa.Array:
        """The column at rows ``local`` of one file: the row groups that cover them, read."""
        with damaged_request_file(path), unreadable(path):
            fh = pq.ParquetFile(path)
            sizes = [fh.metadata.row_group(g).num_rows for g in range(fh.metadata.num_row_groups)]
            first = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
            lo = int(np.searchsorted(first, int(local.min()), side="right") - 1)
            hi = int(np.searchsorted(first, int(local.max()), side="right") - 1)
            col = fh.read_row_groups(list(range(lo, hi + 1)), columns=[self.name]).column(0).combine_chunks()
        return col.take(pa.array(local - first[lo]))


def _stamp(path: Path) -> tuple[int, int, int]:
    try:
        st = path.stat()
    except OSError:
        return (-1, -1, -1)
    return (st.st_ino, st.st_size, st.st_mtime_ns)
