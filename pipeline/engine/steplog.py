"""Growable columnar log of engine spans (one row per span of identical-composition steps).

Rows are kept in numpy buffers that double when full, so a million-request replay with a few
million spans costs ~100 bytes per span instead of a Python tuple per field.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from pipeline.costmodel.steps import StepCost

#: Columns and dtypes of the span log (the replay ``steps`` table adds derived columns).
SPAN_COLUMNS: dict[str, type] = {
    "replica": np.int32,
    "start_s": np.float64,
    "end_s": np.float64,
    "steps": np.int64,
    "prefill_tokens": np.int64,
    "prefill_seqs": np.int64,
    "decode_seqs": np.int64,
    "decode_tokens": np.int64,
    "running": np.int32,
    "waiting": np.int32,
    "kv_blocks_used": np.int64,
    "flops": np.float64,
    "bytes": np.float64,
    "compute_s": np.float64,
    "memory_s": np.float64,
    "comm_s": np.float64,
    "overhead_s": np.float64,
    "measured_s": np.float64,
}

#: Rows :meth:`StepLog.extend_rows` copies at a time (4.5 MiB of float64 rows).
_EXTEND_ROWS = 32768


class RowSink(Protocol):
    """Where an engine run's step-log rows go (a float64 matrix, one column per SPAN_COLUMNS
    entry): a StepLog, a pod's capture (pipeline.engine.shard.run_pod), or the replay stage's
    writer (pipeline.replay.run.RunSteps), which writes them a pod at a time and keeps none."""

    def extend_rows(self, rows: npt.NDArray[np.float64]) -> None: ...


class StepLog:
    def __init__(self, capacity: int = 1024) -> None:
        self.n = 0
        self._cols: dict[str, npt.NDArray[np.generic]] = {
            name: np.zeros(capacity, dtype) for name, dtype in SPAN_COLUMNS.items()
        }

    def _grow(self, at_least: int = 0) -> None:
        for name, col in self._cols.items():
            bigger = np.zeros(max(col.shape[0] * 2, at_least), col.dtype)
            bigger[: self.n] = col[: self.n]
            self._cols[name] = bigger

    def add(
        self,
        replica: int,
        start: float,
        end: float,
        steps: int,
        prefill_tokens: int,
        prefill_seqs: int,
        decode_seqs: int,
        running: int,
        waiting: int,
        kv_blocks_used: int,
        cost: StepCost,
        upto: int,
    ) -> None:
        """Append one span covering ``cost`` rows ``[0, upto)``."""
        if self.n == self._cols["replica"].shape[0]:
            self._grow()
        i = self.n
        c = self._cols
        c["replica"][i] = replica
        c["start_s"][i] = start
        c["end_s"][i] = end
        c["steps"][i] = steps
        c["prefill_tokens"][i] = prefill_tokens
        c["prefill_seqs"][i] = prefill_seqs
        c["decode_seqs"][i] = decode_seqs
        c["decode_tokens"][i] = decode_seqs * steps
        c["running"][i] = running
        c["waiting"][i] = waiting
        c["kv_blocks_used"][i] = kv_blocks_used
        if upto == 1:
            c["flops"][i] = cost.flops[0]
            c["bytes"][i] = cost.bytes[0]
            c["compute_s"][i] = cost.compute_s[0]
            c["memory_s"][i] = cost.memory_s[0]
            c["comm_s"][i] = cost.comm_s[0]
            c["overhead_s"][i] = cost.overhead_s[0]
            c["measured_s"][i] = cost.measured_s[0] if cost.measured_s is not None else 0.0
        else:
            c["flops"][i] = cost.flops[:upto].sum()
            c["bytes"][i] = cost.bytes[:upto].sum()
            c["compute_s"][i] = cost.compute_s[:upto].sum()
            c["memory_s"][i] = cost.memory_s[:upto].sum()
            c["comm_s"][i] = cost.comm_s[:upto].sum()
            c["overhead_s"][i] = cost.overhead_s[:upto].sum()
            c["measured_s"][i] = cost.measured_s[:upto].sum() if cost.measured_s is not None else 0.0
        self.n += 1

    def extend_rows(self, rows: npt.NDArray[np.float64]) -> None:
        """Append rows given as a float64 matrix with one column per SPAN_COLUMNS entry, in that
        order (what the jit engine writes; every integer it holds is exact in float64)."""
        m = int(rows.shape[0])
        if self.n + m > self._cols["replica"].shape[0]:
            self._grow(self.n + m)
        # a block of rows at a time, so each column's strided read stays in cache (a whole
        # million-request day's rows, 2.7 M of them, 0.38 s a column at a time, 0.11 s in blocks)
        for a in range(0, m, _EXTEND_ROWS):
            block = rows[a : a + _EXTEND_ROWS]
            at = self.n + a
            for j, col in enumerate(self._cols.values()):
                col[at : at + block.shape[0]] = block[:, j]
        self.n += m

    def rows(self) -> npt.NDArray[np.float64]:
        """The logged rows as :meth:`extend_rows` takes them (insertion order)."""
        return np.column_stack([col[: self.n].astype(np.float64) for col in self._cols.values()])

    def columns(self) -> dict[str, npt.NDArray[np.generic]]:
        """The logged rows, ordered by replica then start time."""
        cols = {name: col[: self.n] for name, col in self._cols.items()}
        order = np.lexsort((cols["start_s"], cols["replica"]))
        return {name: col[order] for name, col in cols.items()}
