"""Write a generated workload (``generate.generate``) as logs in each ingest format, following
each provider's documented field semantics (inclusive vs exclusive input counts, cache fields)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import zstandard

from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import _FILE_MODE, atomic_write_bytes, check_replaceable, os_write_reason

#: Mooncake blocks are 512 tokens (FAST'25 trace README).
MOONCAKE_BLOCK = 512


def _iso(col: str) -> pl.Expr:
    return pl.col(col).dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ")


def _openai(df: pl.DataFrame) -> Iterable[str]:
    # A gateway's logged request/response pair: the request carries `user` and `metadata`, the
    # response is a Chat Completions object whose usage.prompt_tokens INCLUDES cached tokens.
    rows = df.select(
        "request_id",
        "model",
        "tenant",
        "session_id",
        "prompt_tokens",
        "output_tokens",
        "reasoning_tokens",
        "cached_tokens",
        "ttft_s",
        "e2e_s",
        ts=_iso("arrival"),
        created=pl.col("arrival").dt.epoch("s"),
    ).iter_rows()
    for rid, model, tenant, sess, p, o, r, c, ttft, e2e, ts, created in rows:
        yield (
            f'{{"timestamp":"{ts}","request":{{"model":"{model}","user":"{tenant}",'
            f'"metadata":{{"session_id":"{sess}"}}}},"response":{{"id":"chatcmpl-{rid}",'
            f'"object":"chat.completion","created":{created},"model":"{model}","usage":{{'
            f'"prompt_tokens":{p},"completion_tokens":{o},"total_tokens":{p + o},'
            f'"prompt_tokens_details":{{"cached_tokens":{c}}},'
            f'"completion_tokens_details":{{"reasoning_tokens":{r}}}}}}},'
            f'"ttft_s":{ttft:.6f},"e2e_s":{e2e:.6f}}}'
        )


def _anthropic(df: pl.DataFrame) -> Iterable[str]:
    # Anthropic usage.input_tokens EXCLUDES cache reads and cache writes.
    rows = df.select(
        "request_id",
        "model",
        "tenant",
        "session_id",
        "prompt_tokens",
        "output_tokens",
        "cached_tokens",
        "cache_write_tokens",
        ts=_iso("arrival"),
    ).iter_rows()
    for rid, model, tenant, sess, p, o, c, w, ts in rows:
        usage = {
            "input_tokens": p - c - w,
            "output_tokens": o,
            "cache_read_input_tokens": c,
            "cache_creation_input_tokens": w,
        }
        yield json.dumps(
            {
                "timestamp": ts,
                "session_id": sess,
                "request": {"model": model, "metadata": {"user_id": tenant}},
                "response": {
                    "id": f"msg_{rid}",
                    "type": "message",
                    "model": model,
                    "stop_reason": "end_turn",
                    "usage": usage,
                },
            }
        )


def _otel(df: pl.DataFrame) -> Iterable[str]:
    # OTLP JSON, one ExportTraceServiceRequest per line with up to 100 GenAI spans; per the GenAI
    # semantic conventions gen_ai.usage.input_tokens INCLUDES cache reads and writes.
    def attr(k: str, v: object) -> dict[str, object]:
        key = "intValue" if isinstance(v, int) else "stringValue"
        return {"key": k, "value": {key: str(v) if key == "intValue" else v}}

    start = df["arrival"].dt.epoch("ns").to_numpy()
    end = start + (df["e2e_s"].to_numpy() * 1e9).astype(np.int64)
    spans = []
    for i, row in enumerate(df.iter_rows(named=True)):
        attrs = [
            attr("gen_ai.operation.name", "chat"),
            attr("gen_ai.request.model", row["model"]),
            attr("gen_ai.response.id", f"chatcmpl-{row['request_id']}"),
            attr("gen_ai.usage.input_tokens", int(row["prompt_tokens"])),
            attr("gen_ai.usage.output_tokens", int(row["output_tokens"])),
            attr("gen_ai.usage.cache_read.input_tokens", int(row["cached_tokens"])),
            attr("gen_ai.conversation.id", row["session_id"]),
            attr("tenant.id", row["tenant"]),
        ]
        spans.append(
            {
                "traceId": f"{i:032x}",
                "spanId": f"{i:016x}",
                "name": f"chat {row['model']}",
                "kind": 3,
                "startTimeUnixNano": str(int(start[i])),
                "endTimeUnixNano": str(int(end[i])),
                "attributes": attrs,
                "status": {"code": 1},
            }
        )
        if len(spans) == 100:
            yield _otlp(spans)
            spans = []
    if spans:
        yield _otlp(spans)


def _otlp(spans: list[dict[str, object]]) -> str:
    res = {"attributes": [{"key": "service.name", "value": {"stringValue": "llm-gateway"}}]}
    return json.dumps(
        {"resourceSpans": [{"resource": res, "scopeSpans": [{"scope": {"name": "synth"}, "spans": spans}]}]}
    )


def _mooncake(df: pl.DataFrame) -> Iterable[str]:
    # Block j of a prompt is the tenant system prompt's block j when it lies wholly inside the
    # system prompt, else the session's block j when full; a partial last block is unique.
    t0 = df["arrival"].dt.epoch("ms").min()
    rows = df.select(
        "prompt_tokens",
        "output_tokens",
        "system_tokens",
        "session",
        tenant=pl.col("tenant").str.extract(r"(\d+)$").cast(pl.Int64),
        ts=pl.col("arrival").dt.epoch("ms") - t0,
    ).iter_rows()
    for i, (p, o, sys_len, sess, tenant, ts) in enumerate(rows):
        ids = []
        for j in range(-(-p // MOONCAKE_BLOCK)):
            end = (j + 1) * MOONCAKE_BLOCK
            if end <= sys_len:
                ids.append((1 << 58) | (tenant << 20) | j)
            elif end <= p:
                ids.append((2 << 58) | (sess << 20) | j)
            else:
                ids.append((3 << 58) | (i << 20) | j)
        yield f'{{"timestamp": {ts}, "input_length": {p}, "output_length": {o}, "hash_ids": {ids}}}'


def _csv_rows(header: list[str], rows: Iterable[tuple[object, ...]]) -> Iterable[str]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="")
    w.writerow(header)
    yield buf.getvalue()
    for row in rows:
        buf.seek(0)
        buf.truncate()
        w.writerow(row)
        yield buf.getvalue()


def _azure(df: pl.DataFrame) -> Iterable[str]:
    ts = pl.col("arrival").dt.strftime("%Y-%m-%d %H:%M:%S%.6f")
    rows = df.select(ts, "prompt_tokens", "output_tokens").iter_rows()
    return _csv_rows(["TIMESTAMP", "ContextTokens", "GeneratedTokens"], rows)


def _vidur(df: pl.DataFrame) -> Iterable[str]:
    t0 = df["arrival"].min()
    rel = ((pl.col("arrival") - t0).dt.total_microseconds() / 1e6).round(6)
    rows = df.select(rel, "prompt_tokens", "output_tokens").iter_rows()
    return _csv_rows(["arrived_at", "num_prefill_tokens", "num_decode_tokens"], rows)


def _litellm(df: pl.DataFrame) -> Iterable[str]:
    fmt = "%Y-%m-%d %H:%M:%S%.6f"
    us = pl.duration(microseconds=1)
    rows = df.select(
        "request_id",
        start=pl.col("arrival").dt.strftime(fmt),
        end=(pl.col("arrival") + us * (pl.col("e2e_s") * 1e6).round(0).cast(pl.Int64)).dt.strftime(fmt),
        first=(pl.col("arrival") + us * (pl.col("ttft_s") * 1e6).round(0).cast(pl.Int64)).dt.strftime(fmt),
        model="model",
        user="tenant",
        team_id="tenant",
        session_id="session_id",
        prompt_tokens="prompt_tokens",
        completion_tokens="output_tokens",
        total=pl.col("prompt_tokens") + pl.col("output_tokens"),
        status=pl.lit("success"),
        metadata=pl.format(
            '{{"usage_object": {{"prompt_tokens_details": {{"cached_tokens": {}}}}}}}',
            pl.col("cached_tokens"),
        ),
    ).iter_rows()
    header = [
        "request_id",
        "startTime",
        "endTime",
        "completionStartTime",
        "model",
        "user",
        "team_id",
        "session_id",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "status",
        "metadata",
    ]
    return _csv_rows(header, rows)


_GENERIC_COLUMNS = {
    "request_id": "request_id",
    "arrival": "arrival",
    "model": "model",
    "tenant": "tenant",
    "session_id": "session_id",
    "recorded_input_tokens": "prompt_tokens",
    "output_tokens": "output_tokens",
    "cache_hit_tokens": "cached_tokens",
    "reasoning_tokens": "reasoning_tokens",
}


def _generic_frame(df: pl.DataFrame) -> pl.DataFrame:
    return df.select(
        pl.col(src).alias(dst) if dst != "arrival" else _iso(src).alias(dst) for dst, src in _GENERIC_COLUMNS.items()
    )


def _generic_mapping(fmt: str) -> str:
    lines = [f'format = "{fmt}"', 'source_format = "synth"', 'time_unit = "iso"', "", "[fields]"]
    lines += [f'{k} = "{k}"' for k in _GENERIC_COLUMNS]
    return "\n".join(lines) + "\n"


LINE_WRITERS: dict[str, Callable[[pl.DataFrame], Iterable[str]]] = {
    "openai": _openai,
    "anthropic": _anthropic,
    "otel": _otel,
    "litellm": _litellm,
    "azure": _azure,
    "mooncake": _mooncake,
    "vidur": _vidur,
}
SYNTH_FORMATS = (*LINE_WRITERS, "jsonl", "csv", "parquet")


#: The file names ingest reads each format's text by (after .gz/.zst; a folder's other files are
#: skipped, and a ``.parquet`` name or Parquet bytes ask for --format parquet).
_JSON_NAMES = (".jsonl", ".ndjson", ".json", ".log")
_NAMES: dict[str, tuple[str, ...]] = {
    **{fmt: _JSON_NAMES for fmt in ("openai", "anthropic", "otel", "mooncake", "jsonl")},
    **{fmt: (".csv", ".log") for fmt in ("litellm", "azure", "vidur", "csv")},
    "parquet": (".parquet",),
}
_ROTATION = re.compile(r"([.-][0-9][0-9-]*)$")


def name_warning(fmt: str, out: Path) -> str | None:
    """One line when ``out``'s name does not say what ``fmt`` writes there (``--format parquet
    --out x.jsonl``: ingest reads a file by its name and would ask for another format), or puts a
    compression suffix on Parquet (written uncompressed: it compresses its own columns); else None."""
    want = _NAMES.get(fmt)
    if want is None:
        return None
    name = out.name
    squeezed = next((suf for suf in (".gz", ".zst") if name.lower().endswith(suf)), "")
    base = name[: len(name) - len(squeezed)]
    logical = _ROTATION.sub("", base).lower()
    stem = Path(_ROTATION.sub("", base)).stem or "day"
    if fmt == "parquet" and squeezed:
        return (
            f"warning: --out {out}: Parquet is written uncompressed (it compresses its own columns), "
            f"but the name ends in {squeezed}; name it {stem}.parquet"
        )
    if logical.endswith(want):
        return None
    kind = "Parquet" if fmt == "parquet" else "CSV" if want[0] == ".csv" else "JSON lines"
    better = f"name it {stem}{want[0]}{squeezed}"
    said = next((suf for suf in (".parquet", *_JSON_NAMES, ".csv") if logical.endswith(suf)), None)
    if said is None:
        return (
            f"warning: --out {out}: the name has no log suffix ({', '.join(_JSON_NAMES)}, .csv, .parquet), so "
            f"ingest skips the file inside a folder; --format {fmt} writes {kind}: {better}"
        )
    return f"warning: --out {out}: --format {fmt} writes {kind}, not what the name's {said} says: {better}"


#: Characters of a line format written per piece (whole lines, at least one): the log is streamed
#: to its file (and compressor) a piece at a time, never held whole as text.
PIECE_CHARS = 1 << 23
#: Rows of a generic format (jsonl, csv) converted and written per piece.
ROWS_PER_PIECE = 1 << 17


class _Sink:
    """A file written a piece at a time, compressed by its name (``.gz``: gzip level 1, no time
    stamp; ``.zst``: zstd level 3), to a temporary name beside ``path`` and moved there when
    done (:func:`pipeline.common.schemas.atomic_write_bytes`'s rules: never over something that is not
    a regular file; a file that cannot be written is one RooftraceError line naming it)."""

    def __init__(self, path: Path, compress: bool = True) -> None:
        self.path = path
        try:
            check_replaceable(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        except OSError as exc:
            raise RooftraceError(f"cannot write {path}: {os_write_reason(path, exc)}") from None
        self.tmp = Path(tmp)
        self.raw = os.fdopen(fd, "wb")
        self.out: Any = self.raw
        if compress and path.name.endswith(".gz"):
            self.out = gzip.GzipFile(fileobj=self.raw, mode="wb", compresslevel=1, mtime=0)
        elif compress and path.name.endswith(".zst"):
            self.out = zstandard.ZstdCompressor(level=3).stream_writer(self.raw, closefd=False)

    def write(self, data: bytes) -> None:
        try:
            self.out.write(data)
        except OSError as exc:
            self.abort()
            raise RooftraceError(f"cannot write {self.path}: {os_write_reason(self.path, exc)}") from None

    def close(self) -> None:
        try:
            if self.out is not self.raw:
                self.out.close()
            self.raw.flush()
            os.fsync(self.raw.fileno())
            self.raw.close()
            os.chmod(self.tmp, _FILE_MODE)
            os.replace(self.tmp, self.path)
        except OSError as exc:
            self.abort()
            raise RooftraceError(f"cannot write {self.path}: {os_write_reason(self.path, exc)}") from None

    def abort(self) -> None:
        for fh in (self.out, self.raw):
            with suppress(OSError, ValueError, zstandard.ZstdError):
                fh.close()
        self.tmp.unlink(missing_ok=True)


@contextmanager
def _sink(path: Path, compress: bool = True) -> Iterator[_Sink]:
    sink = _Sink(path, compress)
    try:
        yield sink
    except BaseException:
        sink.abort()
        raise
    sink.close()


def _write(path: Path, data: bytes) -> None:
    """``atomic_write_bytes``, with a file that cannot be written (a parent that is a file, no
    permission, a full disk) one RooftraceError line naming it."""
    try:
        atomic_write_bytes(path, data)
    except OSError as exc:
        raise RooftraceError(f"cannot write {path}: {os_write_reason(path, exc)}") from None


def write_logs(df: pl.DataFrame, fmt: str, out: Path) -> list[Path]:
    """Write ``df`` as ``fmt`` to ``out`` (``.gz``/``.zst`` compress; Parquet is written as it
    is, whatever the name). Generic formats also write ``<out>.mapping.toml`` for ``rooftrace
    ingest --mapping``. The text is streamed to the file a piece at a time (PIECE_CHARS characters,
    ROWS_PER_PIECE rows), so the log is never held whole as text. Returns the files written; a
    file that cannot be written is one RooftraceError line."""
    if fmt in LINE_WRITERS:
        with _sink(out) as sink:
            piece: list[str] = []
            size = 0
            for line in LINE_WRITERS[fmt](df):
                piece.append(line)
                size += len(line) + 1
                if size >= PIECE_CHARS:
                    sink.write(("\n".join(piece) + "\n").encode())
                    piece, size = [], 0
            if piece or df.height == 0:
                sink.write(("\n".join(piece) + "\n").encode())
        return [out]
    if fmt not in ("jsonl", "csv", "parquet"):
        raise RooftraceError(f"synth: unknown format {fmt!r}; known: {', '.join(SYNTH_FORMATS)}")
    if fmt == "parquet":
        with _sink(out, compress=False) as sink:
            _generic_frame(df).write_parquet(sink.raw)
    else:
        with _sink(out) as sink:
            for start in range(0, max(df.height, 1), ROWS_PER_PIECE):
                frame = _generic_frame(df.slice(start, ROWS_PER_PIECE))
                text = frame.write_ndjson() if fmt == "jsonl" else frame.write_csv(include_header=start == 0)
                sink.write(text.encode())
    mapping = out.with_name(out.name + ".mapping.toml")
    _write(mapping, _generic_mapping(fmt).encode())
    return [out, mapping]
