"""The per-request side of a replay run, written as it is produced.

A run's ``requests.parquet`` holds one row per request in arrival order. Replayed in one engine
run, the results are in memory and are written a chunk of rows at a time. Replayed in pods, each
pod's results are appended to a spool file in the run's folder as the pod ends (73 bytes a
request, :data:`RESULT_DTYPE`) and never gathered: the table is then written a chunk at a time,
each chunk's rows read back from the pods that hold them (every pod's rows are in arrival order,
so each pod is read front to back once). Either way the file is written by one
:class:`pipeline.common.schemas.ParquetStream`, so its bytes do not depend on the pods.

The summary is then computed from the written rows (:class:`StoredColumns`), one column at a
time, with the same code as an in-memory run's (:class:`MemoryColumns`); pipeline.replay.run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import ParquetStream
from pipeline.engine.model import REJECT_REASONS, EngineResult, Workload
from pipeline.replay.slo import request_latencies

#: One request's engine result as a spool record (the EngineResult fields, packed).
_FIELD_TYPES = {"replica": np.int32, "preemptions": np.int32, "reject_reason": np.int8,
                "cache_hit_tokens": np.int64, "prefill_tokens": np.int64}  # fmt: skip
RESULT_DTYPE = np.dtype([(f.name, _FIELD_TYPES.get(f.name, np.float64)) for f in fields(EngineResult)])

#: Rows of requests.parquet built and written at a time.
CHUNK_ROWS = 1 << 20

#: Where a replayed request's cache-hit tokens come from (the ``cache_hit_source`` column; index
#: = the code the summary counts by): the log reports none and the replica had no prefix to look
#: up; the log's reported count (``reported_cache_hit_tokens``, honoured as logged); the
#: replica's own prefix cache (its chain looked up at admission).
CACHE_HIT_SOURCES: tuple[str, ...] = ("none", "reported", "prefix_cache")


def cache_split(
    res: EngineResult, work: Workload, a: int = 0, b: int | None = None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int8]]:
    """Requests ``a:b``'s (recorded input tokens, cache-hit tokens, source code) as the run's
    table states them (``res`` holds those requests' results). A request whose hits the log
    reports has exactly the logged count, rejected or not, so the replay's split of every such
    request is classify's to the token, even where the engine had to compute a whole prompt's
    last token (docs/engine.md, "Cache hits the log reports"); the others have what the
    replica's prefix cache gave them at first scheduling."""
    recorded = np.asarray(work.recorded(a, b), np.int64)
    hits = np.asarray(res.cache_hit_tokens, np.int64).copy()
    code = np.where(work.has_chain(a, b), 2, 0).astype(np.int8)
    if work.reported_hit_tokens is not None:
        rep = np.asarray(work.reported_hit_tokens[a:b], np.int64)
        has = rep >= 0
        hits[has] = np.minimum(rep[has], recorded[has])
        code[has] = 1
    return recorded, hits, code


def _records(res: EngineResult) -> npt.NDArray[Any]:
    rec = np.empty(res.reject_reason.shape[0], RESULT_DTYPE)
    for name in RESULT_DTYPE.names or ():
        rec[name] = getattr(res, name)
    return rec


def _result(rec: npt.NDArray[Any]) -> EngineResult:
    return EngineResult(**{name: np.ascontiguousarray(rec[name]) for name in RESULT_DTYPE.names or ()})


def _slice(res: EngineResult, a: int, b: int) -> EngineResult:
    return EngineResult(**{f.name: getattr(res, f.name)[a:b] for f in fields(EngineResult)})


class ResultSpool:
    """Pods' per-request results in a file, pod after pod, read back in request order."""

    def __init__(self, path: Path, n: int) -> None:
        self.path, self.n = path, n
        self.pod_of = np.full(n, -1, np.int32)  # the pod holding each request's result
        self.starts: list[int] = []  # each pod's first record in the file
        self.written = 0
        self._fh: Any = None

    def add(self, rows: npt.NDArray[Any], res: EngineResult) -> None:
        """A pod's results; ``rows`` are its requests' rows, increasing."""
        if rows.shape[0] != res.reject_reason.shape[0]:
            raise ValueError(f"pod of {rows.shape[0]} rows handed {res.reject_reason.shape[0]} results")
        if rows.shape[0] > 1 and bool((np.diff(rows) <= 0).any()):
            raise ValueError("a pod's rows must be increasing")
        if bool((self.pod_of[rows] >= 0).any()):
            raise ValueError("a request's result handed over twice")
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("wb")
        self.pod_of[rows] = len(self.starts)
        self.starts.append(self.written)
        _records(res).tofile(self._fh)
        self.written += int(rows.shape[0])

    def chunks(self, rows: int | None = None) -> Iterator[tuple[int, int, EngineResult]]:
        """(first row, end row, their results), ``rows`` (CHUNK_ROWS) requests at a time, in
        request order."""
        rows = rows or CHUNK_ROWS
        missing = int((self.pod_of < 0).sum())
        if missing:
            raise ValueError(f"{missing:,} requests have no result")
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        cursor = np.asarray(self.starts, np.int64)
        size = RESULT_DTYPE.itemsize
        if not self.n:
            return
        with self.path.open("rb") as fh:
            for a in range(0, self.n, rows):
                b = min(self.n, a + rows)
                pod = self.pod_of[a:b]
                counts = np.bincount(pod, minlength=cursor.shape[0])
                parts = []
                for p in np.flatnonzero(counts).tolist():
                    fh.seek(int(cursor[p]) * size)
                    parts.append(np.fromfile(fh, RESULT_DTYPE, count=int(counts[p])))
                    if parts[-1].shape[0] != counts[p]:  # cut short behind our back
                        raise RooftraceError(f"{self.path}: the spooled results end early; run the replay again")
                    cursor[p] += counts[p]
                rec = np.empty(b - a, RESULT_DTYPE)
                rec[np.argsort(pod, kind="stable")] = np.concatenate(parts)
                yield a, b, _result(rec)

    def remove(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self.path.unlink(missing_ok=True)


def _nullable(values: npt.NDArray[np.float64]) -> pa.Array:
    return pa.array(values, mask=~np.isfinite(values))


def requests_table(
    request_id: pa.Array | pa.ChunkedArray, res: EngineResult, prompt: npt.NDArray[np.int64],
    output: npt.NDArray[np.int64], t0_us: int, warmup: npt.NDArray[np.bool_] | None = None,
    split: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int8]] | None = None,
) -> pa.Table:  # fmt: skip
    """Rows of ``requests.parquet`` (schema replay_requests) for requests with these ids, engine
    results and replayed prompt / output lengths; ``warmup`` marks the rows replayed as warm-up
    (left out of the run's summary; none when not given); ``split`` is :func:`cache_split` of
    these rows (default: the engine's prompts and hits as they are)."""
    ok = res.reject_reason == 0
    lat = request_latencies(res, Workload(arrival_s=res.arrival_s, prompt_tokens=prompt, output_tokens=output))
    if split is None:
        split = (prompt, res.cache_hit_tokens, np.where(res.cache_hit_tokens > 0, 2, 0).astype(np.int8))
    recorded, hits, code = split
    reasons = np.array(REJECT_REASONS, dtype=object)[res.reject_reason]
    arrival_us = t0_us + np.round(res.arrival_s * 1e6).astype(np.int64)
    return pa.table(
        {
            "request_id": request_id,
            "replica": pa.array(res.replica, mask=~ok),
            "arrival": pa.array(arrival_us, pa.timestamp("us", tz="UTC")),
            "arrival_s": res.arrival_s,
            "scheduled_s": _nullable(res.scheduled_s),
            "first_token_s": _nullable(res.first_token_s),
            "finish_s": _nullable(res.finish_s),
            "queue_s": _nullable(lat["queue"]),
            "ttft_s": _nullable(lat["ttft"]),
            "tpot_s": _nullable(lat["tpot"]),
            "e2e_s": _nullable(lat["e2e"]),
            "max_itl_s": _nullable(res.max_itl_s),
            "preemptions": res.preemptions,
            "recorded_input_tokens": recorded,
            "output_tokens": output,
            "cache_hit_tokens": hits,
            "fresh_input_tokens": recorded - hits,
            "cache_hit_source": np.array(CACHE_HIT_SOURCES, dtype=object)[code],
            "prefill_tokens": np.where(ok, res.prefill_tokens, 0),
            "status": np.where(ok, "finished", "rejected").astype(object),
            "reject_reason": pa.array(reasons, mask=ok),
            "warmup": np.zeros(ok.shape[0], np.bool_) if warmup is None else np.asarray(warmup, np.bool_),
        }
    )


class IdColumn(Protocol):
    """The run's request ids in request order: an Arrow array, or one read back from the store a
    slice at a time (pipeline.ingest.store.ColumnReader)."""

    def slice(self, offset: int, length: int) -> Any: ...


@contextlib.contextmanager
def run_writes(run_dir: Path, what: str) -> Iterator[None]:
    """A failed write of a run's table (disk full, no permission) as one line naming the run's
    folder."""
    try:
        yield
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise RooftraceError(f"{run_dir}: cannot write the run's {what}: {why}") from None


class RunRequests:
    """A run's ``requests.parquet``, from a whole engine result (:meth:`write_result`) or from
    pods' results as they end (:meth:`add_pod`, spooled; then :meth:`write_spooled`)."""

    def __init__(
        self,
        run_dir: Path,
        request_id: IdColumn,
        work: Workload,
        t0_us: int,
        say: Callable[[str], None] | None = None,
        warmup: int = 0,
    ) -> None:
        self.run_dir, self.request_id, self.work, self.t0_us = run_dir, request_id, work, t0_us
        self.say = say
        self.warmup = warmup  # the first rows: the warm-up requests (ReplayOptions.warmup)
        self.stream = ParquetStream(run_dir / "requests.parquet", "replay_requests")
        self.spool = ResultSpool(run_dir / f".requests.{os.getpid()}.spool", work.n)

    def add_pod(self, rows: npt.NDArray[Any], res: EngineResult) -> None:
        with run_writes(self.run_dir, "per-request results"):
            self.spool.add(rows, res)

    def _announce(self) -> None:
        if self.say is not None and self.work.n > CHUNK_ROWS:  # several seconds: say what it does
            self.say(f"replay: writing the run's requests table ({self.work.n:,} rows) and its summary")

    def write_result(self, res: EngineResult) -> None:
        self._announce()
        for a in range(0, self.work.n, CHUNK_ROWS):
            b = min(self.work.n, a + CHUNK_ROWS)
            self._write(a, b, _slice(res, a, b))

    def write_spooled(self) -> None:
        self._announce()
        with run_writes(self.run_dir, "per-request results"):
            for a, b, res in self.spool.chunks():
                self._write(a, b, res)
            self.spool.remove()

    def _write(self, a: int, b: int, res: EngineResult) -> None:
        w = self.work
        warm = np.arange(a, b) < self.warmup
        table = requests_table(
            self.request_id.slice(a, b - a),
            res,
            w.prompt_tokens[a:b],
            w.output_tokens[a:b],
            self.t0_us,
            warm,
            cache_split(res, w, a, b),
        )
        with run_writes(self.run_dir, "requests table"):
            self.stream.write(table)

    def finish(self) -> Path:
        """Write what is held; the finished file (under its temporary name) for the summary."""
        with run_writes(self.run_dir, "requests table"):
            return self.stream.finish()

    def release(self) -> None:
        """Let go of what writing the table needed (the engine's arrays, the ids' positions, the
        spool's index) once :meth:`finish` has written it: the summary reads the table."""
        del self.work, self.request_id
        self.spool.pod_of = np.zeros(0, np.int32)

    def commit(self) -> None:
        with run_writes(self.run_dir, "requests table"):
            self.stream.commit()

    def abort(self) -> None:
        self.spool.remove()
        self.stream.abort()


class Columns(Protocol):
    """Per-request columns a run's summary reads (arrays of the run's length, arrival order)."""

    n: int

    def get(self, name: str) -> npt.NDArray[Any]: ...


#: The columns a summary reads: the replay_requests column for each, and for ``reject_code``
#: the reason as its REJECT_REASONS index (0: not rejected).
SUMMARY_COLUMNS = (
    "arrival_s", "scheduled_s", "finish_s", "reject_code", "preemptions", "cache_hit_tokens",
    "recorded_input_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s", "queue_s", "cache_hit_code",
)  # fmt: skip


class MemoryColumns:
    """Summary columns of an engine result in memory."""

    def __init__(self, res: EngineResult, work: Workload) -> None:
        self.res, self.work, self.n = res, work, work.n

    def get(self, name: str) -> npt.NDArray[Any]:
        res, work = self.res, self.work
        if name in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
            return request_latencies(res, work)[name.removesuffix("_s")]
        if name == "reject_code":
            return res.reject_reason
        if name in ("recorded_input_tokens", "cache_hit_tokens", "cache_hit_code"):
            recorded, hits, code = cache_split(res, work)
            parts: dict[str, npt.NDArray[Any]] = {
                "recorded_input_tokens": recorded,
                "cache_hit_tokens": hits,
                "cache_hit_code": code,
            }
            return parts[name]
        if name == "output_tokens":
            return work.output_tokens
        return np.asarray(getattr(res, name))


class StoredColumns:
    """Summary columns read from a written ``requests.parquet``, one column at a time (nulls as
    NaN: the written table's nulls are exactly the in-memory run's NaNs)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.n = pq.ParquetFile(path).metadata.num_rows

    def get(self, name: str) -> npt.NDArray[Any]:
        """The column as one numpy array, read a row group at a time into it (nothing else of
        the column's size is held)."""
        column = {"reject_code": "reject_reason", "cache_hit_code": "cache_hit_source"}.get(name, name)
        out: npt.NDArray[Any] | None = None
        at = 0
        try:
            fh = pq.ParquetFile(self.path)
            for g in range(fh.metadata.num_row_groups):
                part = self._values(name, fh.read_row_group(g, columns=[column]).column(0))
                if out is None:
                    out = np.empty(self.n, part.dtype)
                out[at : at + part.shape[0]] = part
                at += part.shape[0]
        except (OSError, pa.ArrowException) as exc:
            raise RooftraceError(f"{self.path}: cannot read column {name!r} back: {exc}") from None
        if out is None:  # no rows: the type an empty read gives
            return self._values(name, pq.read_schema(self.path).empty_table().column(column))
        if at != self.n:
            raise RooftraceError(f"{self.path}: column {name!r} holds {at:,} rows, not {self.n:,}")
        return out

    @staticmethod
    def _values(name: str, col: pa.ChunkedArray) -> npt.NDArray[Any]:
        if name in ("reject_code", "cache_hit_code"):
            names = REJECT_REASONS if name == "reject_code" else CACHE_HIT_SOURCES
            codes = pc.index_in(col, value_set=pa.array(names)).fill_null(0)
            return np.asarray(codes.to_numpy(), np.int8)
        if pa.types.is_floating(col.type):
            return np.asarray(col.fill_null(np.nan).to_numpy(), np.float64)
        return np.asarray(col.to_numpy())
