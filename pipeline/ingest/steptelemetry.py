"""Step telemetry: what a serving engine says about each of its iterations, read as a step table.

Engines are converging on one record per forward pass: the prefill and decode work scheduled,
the KV tokens it read, and the wall time the pass took. ``calibrate --observed --steps`` fits the
stack calibration on these records (pipeline/calibrate/step_fit.py; docs/calibration.md, "Step
telemetry"). Three layouts are read, each as its producer writes it (field names looked up in
the producers' own source):

- **fpm**: NVIDIA Dynamo's ``ForwardPassMetrics`` v1, one JSON object per line: ``version``,
  ``worker_id``, ``dp_rank``, ``counter_id``, ``wall_time`` (s), ``scheduled_requests``
  {``num_prefill_requests``, ``sum_prefill_tokens`` (freshly computed), ``sum_prefill_kv_tokens``
  (KV read by the prefills: prefix hits and earlier chunks), ``num_decode_requests``,
  ``sum_decode_kv_tokens``, variances} and ``queued_requests``. The same schema is what vLLM's
  forward-pass-metrics proposal (vllm-project/vllm PR #52061, open, 2026) and SGLang
  (sgl-project/sglang PR #22789, merged 2026-04) publish; their msgpack payloads dumped as JSON
  lines read as this format.
- **trtllm**: TensorRT-LLM's iteration statistics (``LLM.get_stats()`` / ``trtllm-serve``'s
  ``/metrics``: a JSON array, or one object per line): ``iter``, ``iterLatencyMS``,
  ``numActiveRequests``, ``inflightBatchingStats`` {``numScheduledRequests``,
  ``numContextRequests``, ``numGenRequests``, ``numCtxTokens``, ``numPausedRequests``, and since
  TensorRT-LLM PR #13199 (2026-04) ``numCtxKvTokens``, ``numGenKvTokens``}, ``kvCacheStats``
  {``maxNumBlocks``, ``freeNumBlocks``, ``usedNumBlocks``, ``tokensPerBlock``, ...}. Without
  ``numGenKvTokens`` the decodes' context is the KV blocks in use times ``tokensPerBlock`` less the
  prefills' (``context_from = "kv_blocks"``, an over-estimate of at most a block per request).
- **sglang**: SGLang's scheduler log lines (python/sglang/srt/managers/scheduler*.py):
  ``Prefill batch. #new-seq: N, #new-token: T, #cached-token: C, token usage: U, #running-req: R,
  #queue-req: Q`` and ``Decode batch. #running-req: R, #token: K, token usage: U, cuda graph: B,
  gen throughput (token/s): G, #queue-req: Q`` (``accept len: A`` with speculative decoding). A
  decode line is logged every ``decode_log_interval`` (default 40) decode steps and carries no
  step time of its own: its step time is the interval's mean, ``R × A / G``
  (``time_kind = "interval_mean"``). A prefill line carries no time at all and is quarantined as
  such. Other lines of the log are not steps and are not counted.

Every record read is a row: it is used or quarantined with its file, line, field and reason
(``rows_in == used + quarantined``). A file that is missing, empty, not text or of no known
layout is one :class:`StepTelemetryError` line naming it.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.common.errors import RooftraceError
from pipeline.ingest.benchruns import evidence_text

#: The layouts read, as the refusals list them.
KNOWN_LAYOUTS = (
    "fpm: Dynamo ForwardPassMetrics v1 JSON lines ({version, wall_time, scheduled_requests, ...}; also vLLM / "
    "SGLang forward-pass metrics dumped as JSON)",
    "trtllm: TensorRT-LLM iteration stats JSON (get_stats() / /metrics: {iterLatencyMS, inflightBatchingStats, "
    "kvCacheStats, ...})",
    'sglang: SGLang scheduler log ("Prefill batch. #new-seq ..." / "Decode batch. #running-req ... gen throughput")',
)
#: The columns of :attr:`StepTelemetry.steps`, in this order.
STEP_COLUMNS = (
    "file",
    "line",
    "format",
    "wall_s",
    "prefill_tokens",
    "cached_tokens",
    "prefill_seqs",
    "decode_seqs",
    "decode_ctx_tokens",
    "batch_size",
    "kv_tokens",
    "time_kind",
    "context_from",
)
#: The largest file read.
MAX_FILE_BYTES = 4 * 1024**3
#: A token count beyond this is a damaged value (no step schedules 100 M tokens).
MAX_TOKENS = 100_000_000
#: Requests in one step beyond this: a damaged count.
MAX_REQUESTS = 1_000_000
#: A step longer than ten minutes is no measurement.
MAX_STEP_S = 600.0
#: The Dynamo ForwardPassMetrics schema version read.
FPM_VERSION = 1
#: Suffixes of the files read from a folder.
SUFFIXES = (".jsonl", ".json", ".log", ".txt")


class StepTelemetryError(RooftraceError):
    """A telemetry file that cannot be read at all: one line naming the file."""


class _Bad(Exception):
    """A row that cannot be used: ``field`` and ``why``."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}" if field else why)
        self.field, self.why = field, why


@dataclass(frozen=True)
class Quarantined:
    """A record not used, where it was and why."""

    file: str
    line: int
    field: str
    reason: str

    def text(self) -> str:
        where = f"{self.file}: line {self.line}"
        return f"{where}: {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"


@dataclass(frozen=True)
class StepTelemetry:
    """The steps of one or more telemetry files (STEP_COLUMNS) and the records left out."""

    steps: pl.DataFrame
    rows_in: int
    quarantined: tuple[Quarantined, ...] = ()
    files: tuple[str, ...] = ()
    formats: dict[str, int] = field(default_factory=dict)

    @property
    def used(self) -> int:
        return self.steps.height

    def reasons(self) -> list[tuple[str, int, Quarantined]]:
        """The quarantine reasons (field and reason, without the numbers of each row), most frequent
        first: (reason, count, first row)."""
        counts: Counter[str] = Counter()
        first: dict[str, Quarantined] = {}
        for q in self.quarantined:
            key = f"{q.field}: {_generic(q.reason)}" if q.field else _generic(q.reason)
            counts[key] += 1
            first.setdefault(key, q)
        return [(k, n, first[k]) for k, n in counts.most_common()]


def _generic(reason: str) -> str:
    return re.sub(r"-?\d[\d.,e+]*", "N", reason)


# -- checked values ------------------------------------------------------------------------------


def _shown(v: Any) -> str:
    try:
        text = json.dumps(v) if not isinstance(v, float) else repr(v)
    except (TypeError, ValueError):
        text = type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _number(name: str, v: Any, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _Bad(name, f"must be a number, got {_shown(v)}")
    if isinstance(v, int) and abs(v) > 1e18:
        raise _Bad(name, f"{_shown(v)} is out of range (at most {hi:g})")
    x = float(v)
    if not math.isfinite(x):
        raise _Bad(name, f"must be finite, got {_shown(v)}")
    if x < 0:
        raise _Bad(name, f"is negative ({x:g})")
    if x > hi:
        raise _Bad(name, f"{x:g} is out of range (at most {hi:g})")
    return x


def _count(name: str, v: Any, hi: float = MAX_TOKENS) -> int:
    x = _number(name, v, hi)
    if x != int(x):
        raise _Bad(name, f"must be a whole number, got {x:g}")
    return int(x)


def _seconds(name: str, v: Any, scale: float = 1.0) -> float:
    s = _number(name, v, MAX_STEP_S / scale) * scale
    if s <= 0:
        raise _Bad(name, "is 0: no time measured for this step")
    return s


def _table(obj: dict[str, Any], key: str, required: bool = True) -> dict[str, Any] | None:
    v = obj.get(key)
    if v is None:
        if required:
            raise _Bad(key, "missing")
        return None
    if not isinstance(v, dict):
        raise _Bad(key, f"must be an object, got {_shown(v)}")
    return v


def _row(
    fmt: str,
    wall_s: float,
    prefill: int,
    cached: int,
    pseqs: int,
    dseqs: int,
    dctx: int,
    kv: int | None,
    time_kind: str = "step",
    context_from: str = "reported",
) -> dict[str, Any]:
    if prefill + dseqs == 0:
        raise _Bad("", "no tokens scheduled (an idle iteration)")
    if prefill > 0 and pseqs == 0:
        raise _Bad("", f"{prefill} prefill tokens but no prefill request")
    if dseqs > 0 and dctx < dseqs:
        raise _Bad("", f"{dseqs} decode requests but a context of {dctx} tokens (at least one each)")
    return {
        "format": fmt,
        "wall_s": wall_s,
        "prefill_tokens": prefill,
        "cached_tokens": cached,
        "prefill_seqs": pseqs,
        "decode_seqs": dseqs,
        "decode_ctx_tokens": dctx,
        "batch_size": pseqs + dseqs,
        "kv_tokens": kv,
        "time_kind": time_kind,
        "context_from": context_from,
    }


# -- the layouts ---------------------------------------------------------------------------------


def _fpm(rec: dict[str, Any]) -> dict[str, Any]:
    """One Dynamo ForwardPassMetrics v1 record."""
    version = rec.get("version", FPM_VERSION)
    if version != FPM_VERSION or isinstance(version, bool):
        raise _Bad("version", f"{_shown(version)}; read: {FPM_VERSION}")
    wall = _seconds("wall_time", rec.get("wall_time"))
    s = _table(rec, "scheduled_requests")
    assert s is not None
    pseqs = _count("scheduled_requests.num_prefill_requests", s.get("num_prefill_requests", 0), MAX_REQUESTS)
    prefill = _count("scheduled_requests.sum_prefill_tokens", s.get("sum_prefill_tokens", 0))
    cached = _count("scheduled_requests.sum_prefill_kv_tokens", s.get("sum_prefill_kv_tokens", 0))
    dseqs = _count("scheduled_requests.num_decode_requests", s.get("num_decode_requests", 0), MAX_REQUESTS)
    dctx = _count("scheduled_requests.sum_decode_kv_tokens", s.get("sum_decode_kv_tokens", 0))
    if pseqs == 0 and cached > 0:
        raise _Bad("scheduled_requests.sum_prefill_kv_tokens", "prefill KV tokens without a prefill request")
    if dseqs == 0 and dctx > 0:
        raise _Bad("scheduled_requests.sum_decode_kv_tokens", "decode KV tokens without a decode request")
    return _row("fpm", wall, prefill, cached, pseqs, dseqs, dctx, None)


def _trtllm(rec: dict[str, Any]) -> dict[str, Any]:
    """One TensorRT-LLM IterationStats record."""
    wall = _seconds("iterLatencyMS", rec.get("iterLatencyMS"), 1e-3)
    ibs = rec.get("inflightBatchingStats")
    if ibs is None:
        raise _Bad("inflightBatchingStats", "missing (static batching, or the executor's stats are off)")
    if not isinstance(ibs, dict):
        raise _Bad("inflightBatchingStats", f"must be an object, got {_shown(ibs)}")
    pseqs = _count("inflightBatchingStats.numContextRequests", ibs.get("numContextRequests", 0), MAX_REQUESTS)
    prefill = _count("inflightBatchingStats.numCtxTokens", ibs.get("numCtxTokens", 0))
    dseqs = _count("inflightBatchingStats.numGenRequests", ibs.get("numGenRequests", 0), MAX_REQUESTS)
    cached = 0
    if ibs.get("numCtxKvTokens") is not None:
        cached = _count("inflightBatchingStats.numCtxKvTokens", ibs["numCtxKvTokens"])
    kv_stats = _table(rec, "kvCacheStats", required=False)
    kv: int | None = None
    if kv_stats is not None and kv_stats.get("usedNumBlocks") is not None:
        used = _count("kvCacheStats.usedNumBlocks", kv_stats["usedNumBlocks"])
        per = _count("kvCacheStats.tokensPerBlock", kv_stats.get("tokensPerBlock"), 1 << 20)
        if used * per > MAX_TOKENS * 100:
            raise _Bad("kvCacheStats.usedNumBlocks", f"{used} blocks of {per} tokens is out of range")
        kv = used * per
    context_from = "reported"
    if ibs.get("numGenKvTokens") is not None:
        dctx = _count("inflightBatchingStats.numGenKvTokens", ibs["numGenKvTokens"])
    elif dseqs == 0:
        dctx = 0
    elif kv is not None:
        # the KV in use less the prefills' (their read context and their fresh tokens)
        dctx = max(kv - cached - prefill, dseqs)
        context_from = "kv_blocks"
    else:
        raise _Bad(
            "inflightBatchingStats.numGenKvTokens",
            "missing, and no kvCacheStats.usedNumBlocks / tokensPerBlock: the decodes' context is unknown",
        )
    return _row("trtllm", wall, prefill, cached, pseqs, dseqs, dctx, kv, context_from=context_from)


_SGLANG_STEP = re.compile(r"(Prefill batch|Decode batch)\b")
_SGLANG_PAIR = re.compile(r"(#?[A-Za-z][A-Za-z \-/()]*?):\s*([^,\s]+)")


def _sglang_fields(text: str) -> dict[str, str]:
    return {k.strip(): v for k, v in _SGLANG_PAIR.findall(text)}


def _sglang_value(fields: dict[str, str], key: str, hi: float = MAX_TOKENS) -> float:
    if key not in fields:
        raise _Bad(key, "missing")
    raw = fields[key]
    try:
        v: Any = float(raw)
    except ValueError:
        raise _Bad(key, f"must be a number, got {_shown(raw)}") from None
    return _number(key, v, hi)


def _sglang(line: str) -> dict[str, Any]:
    """One SGLang scheduler batch line (the text from ``Prefill batch`` / ``Decode batch`` on)."""
    m = _SGLANG_STEP.search(line)
    assert m is not None
    fields = _sglang_fields(line[m.end() :])
    if m.group(1) == "Prefill batch":
        for key in ("#new-seq", "#new-token", "#cached-token"):
            _sglang_value(fields, key)
        raise _Bad("", "a prefill batch line carries no step time (SGLang logs none for it)")
    running = _sglang_value(fields, "#running-req", MAX_REQUESTS)
    if running != int(running):
        raise _Bad("#running-req", f"must be a whole number, got {running:g}")
    kv = _sglang_value(fields, "#token")
    gen = _sglang_value(fields, "gen throughput (token/s)", 1e12)
    accept = _sglang_value(fields, "accept len", 1e3) if "accept len" in fields else 1.0
    if gen <= 0:
        raise _Bad("gen throughput (token/s)", "is 0: no time measured over the interval")
    if accept <= 0:
        raise _Bad("accept len", "is 0")
    wall = int(running) * accept / gen
    if not 0 < wall <= MAX_STEP_S:
        raise _Bad("gen throughput (token/s)", f"gives a step of {wall:g} s (out of range)")
    return _row("sglang", wall, 0, 0, 0, int(running), int(kv), int(kv), "interval_mean", "kv_pool")


_JSON_LAYOUTS = {"fpm": _fpm, "trtllm": _trtllm}


def _json_layout(rec: Any) -> str | None:
    if not isinstance(rec, dict):
        return None
    if "scheduled_requests" in rec or ("wall_time" in rec and "counter_id" in rec):
        return "fpm"
    if "iterLatencyMS" in rec or "inflightBatchingStats" in rec:
        return "trtllm"
    return None


# -- files ---------------------------------------------------------------------------------------


def _text(path: Path) -> str:
    return evidence_text(path, MAX_FILE_BYTES, StepTelemetryError, "step telemetry", KNOWN_LAYOUTS)


def _json_records(path: Path, text: str) -> list[tuple[int, Any, str | None]]:
    """(line, value, error) per record: a JSON array's elements (numbered from 1, as ``line``), or
    one value per non-empty line (a line that does not parse: its error)."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            where = f"line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else "?"
            raise StepTelemetryError(
                f"{path}: a JSON array that does not parse at {where} (truncated?); a damaged array cannot be read "
                "record by record: write one record per line (JSON Lines)"
            ) from None
        if isinstance(doc, list):
            return [(i, v, None) for i, v in enumerate(doc, 1)]
    out: list[tuple[int, Any, str | None]] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((i, json.loads(line), None))
        except json.JSONDecodeError as exc:
            out.append((i, None, f"not valid JSON at column {exc.colno} ({exc.msg}; truncated?)"))
        except RecursionError:
            out.append((i, None, "JSON nested too deeply"))
        except ValueError as exc:
            out.append((i, None, f"not readable JSON ({str(exc).splitlines()[0][:60]})"))
    return out


def read_file(path: Path, name: str | None = None) -> StepTelemetry:
    """The steps of one telemetry file, its layout detected from its content."""
    name = name or str(path)
    text = _text(path)
    rows: list[dict[str, Any]] = []
    bad: list[Quarantined] = []
    head = text.lstrip()
    # a JSON object per line, or a JSON array of objects; a log line may start with "[" too (SGLang's
    # "[2025-03-04 10:00:00 TP0] ..."), so an array must open with an object
    if head[:1] == "{" or (head[:1] == "[" and head[1:].lstrip()[:1] in ("{", "]")):
        records = _json_records(path, text)
        layout = next((lay for _, rec, _ in records if (lay := _json_layout(rec)) is not None), None)
        if layout is None:
            rec = next((r for _, r, e in records if e is None), None)
            found = sorted(rec)[:8] if isinstance(rec, dict) else type(rec).__name__
            raise StepTelemetryError(
                f"{path}: JSON of no step-telemetry layout rooftrace reads (found {found}); "
                f"known: {'; '.join(KNOWN_LAYOUTS)}"
            )
        parse = _JSON_LAYOUTS[layout]
        for line, rec, err in records:
            try:
                if err is not None:
                    raise _Bad("", err)
                if _json_layout(rec) != layout:
                    raise _Bad("", f"not a {layout} record (found {_shown(rec)})")
                rows.append({"file": name, "line": line, **parse(rec)})
            except _Bad as exc:
                bad.append(Quarantined(name, line, exc.field, exc.why))
    elif _SGLANG_STEP.search(text):
        for line, raw in enumerate(text.splitlines(), 1):
            if not _SGLANG_STEP.search(raw):
                continue
            try:
                rows.append({"file": name, "line": line, **_sglang(raw)})
            except _Bad as exc:
                bad.append(Quarantined(name, line, exc.field, exc.why))
    else:
        raise StepTelemetryError(f"{path}: no step-telemetry layout rooftrace reads; known: {'; '.join(KNOWN_LAYOUTS)}")
    return _telemetry(rows, bad, (name,))


def _telemetry(rows: list[dict[str, Any]], bad: list[Quarantined], files: tuple[str, ...]) -> StepTelemetry:
    schema = {
        "file": pl.String,
        "line": pl.Int64,
        "format": pl.String,
        "wall_s": pl.Float64,
        "prefill_tokens": pl.Int64,
        "cached_tokens": pl.Int64,
        "prefill_seqs": pl.Int64,
        "decode_seqs": pl.Int64,
        "decode_ctx_tokens": pl.Int64,
        "batch_size": pl.Int64,
        "kv_tokens": pl.Int64,
        "time_kind": pl.String,
        "context_from": pl.String,
    }
    frame = pl.DataFrame({c: [r[c] for r in rows] for c in STEP_COLUMNS}, schema=schema)
    formats = dict(Counter(r["format"] for r in rows))
    return StepTelemetry(frame, len(rows) + len(bad), tuple(bad), files, formats)


def read_steps(path: Path | str) -> StepTelemetry:
    """The steps of a telemetry file, or of every ``*.jsonl``, ``*.json``, ``*.log`` and ``*.txt``
    file of a folder (in name order; each file's layout detected on its own)."""
    root = Path(path)
    if not str(path).strip():
        raise StepTelemetryError("--steps: an empty path; give a telemetry file or a folder of them")
    if not root.exists():
        raise StepTelemetryError(f"{root}: no such file or folder of step telemetry")
    if root.is_file():
        return read_file(root)
    if not root.is_dir():
        raise StepTelemetryError(f"{root}: not a file or a folder")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    if not files:
        raise StepTelemetryError(f"{root}: no telemetry files ({', '.join('*' + s for s in SUFFIXES)}) in it")
    parts = [read_file(f, str(f)) for f in files]
    frame = pl.concat([p.steps for p in parts], how="vertical")
    formats: Counter[str] = Counter()
    for p in parts:
        formats.update(p.formats)
    return StepTelemetry(
        frame,
        sum(p.rows_in for p in parts),
        tuple(q for p in parts for q in p.quarantined),
        tuple(f for p in parts for f in p.files),
        dict(formats),
    )
