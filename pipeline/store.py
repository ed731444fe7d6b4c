"""The on-disk store: where each stage's Parquet lives, and a lock for writers.

Layout (docs/architecture.md, Data flow)::

    STORE/requests/date=YYYY-MM-DD/part-*.parquet   canonical requests (schema ``requests``)
    STORE/quarantine/date=YYYY-MM-DD/*.parquet       rejected records (schema ``quarantine``)
    STORE/manifest.parquet                           one row per ingested file (schema ``manifest``)
    STORE/accounting/...                             classify outputs
    STORE/runs/<run_id>/...                          replay outputs
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline.errors import RooftraceError
from pipeline.schemas import read_parquet

_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def repo_root() -> Path | None:
    """The source checkout this package runs from, if any (has pyproject.toml and traces/)."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").exists() and (root / "traces").is_dir():
        return root
    return None


def default_store_path() -> Path:
    """``$ROOFTRACE_STORE``, else ``traces/store`` in the checkout, else ``./traces/store``."""
    env = os.environ.get("ROOFTRACE_STORE")
    if env:
        return Path(env)
    root = repo_root()
    return (root if root is not None else Path.cwd()) / "traces" / "store"


def check_date(text: str) -> str:
    if not _DATE_RE.match(text):
        raise RooftraceError(f"date {text!r} is not YYYY-MM-DD")
    return text


#: Characters DuckDB and polars read as a glob pattern in a path.
GLOB_CHARS = frozenset("*?[]{}")


@dataclass(frozen=True)
class Store:
    root: Path

    def __post_init__(self) -> None:
        # The store is read through glob patterns (requests/*/*.parquet, runs/*/...): a root that
        # is itself a pattern would match other folders or nothing.
        bad = sorted(GLOB_CHARS & set(str(self.root)))
        if bad:
            chars = "".join(sorted(GLOB_CHARS))
            raise RooftraceError(f"store path {self.root} contains {''.join(bad)!r}: use a folder name without {chars}")

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

    def partition(self, table_dir: Path, date: str) -> Path:
        return table_dir / f"date={check_date(date)}"

    def dates(self) -> list[str]:
        """Arrival dates that have a requests partition, oldest first."""
        if not self.requests_dir.is_dir():
            return []
        return sorted(
            p.name.removeprefix("date=")
            for p in self.requests_dir.iterdir()
            if p.is_dir() and p.name.startswith("date=") and _DATE_RE.match(p.name[5:])
        )

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

    def request_files(self, date: str) -> list[Path]:
        return sorted(self.partition(self.requests_dir, date).glob("*.parquet"))

    def read_requests(self, date: str | None = None) -> pl.DataFrame:
        """All canonical requests of one arrival date (the latest when ``date`` is None)."""
        date = self.resolve_date(date)
        tables = [read_parquet(p, "requests") for p in self.request_files(date)]
        if not tables:
            raise RooftraceError(f"{self.partition(self.requests_dir, date)}: empty partition")
        frames = [pl.from_arrow(t) for t in tables]
        out = pl.concat([f for f in frames if isinstance(f, pl.DataFrame)], how="vertical")
        return out.sort(["arrival", "request_id"])

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive writer lock on the store, so two runs at once cannot corrupt it.

        Re-entrant within one process (the nightly job holds it while its stages take it again);
        another process gets a one-line error instead of waiting.
        """
        key = str(self.root.resolve())
        if _HELD.get(key, 0):
            _HELD[key] += 1
            try:
                yield
            finally:
                _HELD[key] -= 1
            return
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / ".lock"
        with path.open("a") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RooftraceError(
                    f"{path}: another rooftrace run holds the store lock; wait for it to finish"
                ) from None
            _HELD[key] = 1
            try:
                yield
            finally:
                _HELD[key] = 0
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


#: Stores this process holds the lock of, with the nesting depth.
_HELD: dict[str, int] = {}


def open_store(path: str | Path | None = None) -> Store:
    return Store(Path(path) if path is not None else default_store_path())
