"""Shared validation: candidate frame -> canonical requests + quarantined records with reasons.

Every check is vectorised; a record gets the *first* failing check as its reason, and names the
source field (the provider's own name, e.g. ``usage.prompt_tokens``) so a user can find it.
Conditions are evaluated on every row; the reason text only on the (few) failing rows. A reason
that quotes the record's value puts it after a colon, so the text before the first colon names
the kind of fault (``reason_kind``).

Plausibility bounds (docs/limits.md): an arrival outside ``PLAUSIBLE_ARRIVAL`` (2000-01-01 ..
2100-01-01 UTC), a token count above ``MAX_TOKENS_PER_REQUEST`` (10^8) and a latency above
``MAX_LATENCY_S`` (7 days) are quarantined: such values are corruption or unit mix-ups, and
letting them through would make later stages plan for petabytes (or overflow Int64).

Derived request ids. A record without a request id gets ``FORMAT:CONTENT:N`` (``DerivedIds``):
CONTENT is the first 24 hex digits of the MD5 of the record's canonical values (arrival in us,
model, token counts, tenant, session, adapter, prefix hashes and block size, latencies, status:
every stored column but the id and where the row came from), and N counts the earlier records
of the same file with the same content (0 for the first). The id depends on the record and on
the records before it in its file, never on the whole file: the same record keeps its id when
lines are appended to its file, so re-ingesting a grown log stores only the new records (the
others are duplicates). Within a file identical records are distinct requests (N differs);
across files the same record at the same occurrence is the same request (a file and its grown,
copied or overlapping export are deduplicated).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import duckdb
import numpy as np
import polars as pl

from pipeline.ingest.source import duck_connect
from pipeline.ingest.timeparse import MAX_OFFSET_MINUTES, PLAUSIBLE_ARRIVAL, offset_out_of_range, patch

TOKEN_FIELDS = ("input_raw", "cache_read_raw", "cache_write_raw", "output_raw", "reasoning_raw")
LATENCY_FIELDS = ("ttft_raw", "e2e_raw")

#: The most tokens one request may count in any token field (input, cache read/write, output,
#: reasoning). The longest context windows offered are about 10^7 tokens; 10^8 is ten times that,
#: so a larger count is corruption or a unit mix-up (a byte count, a sum over requests). It also
#: keeps a day's token sums far inside Int64 (10^8 x 10^10 requests = 10^18 < 9.2 x 10^18).
MAX_TOKENS_PER_REQUEST = 100_000_000
#: The longest plausible time to first token or end-to-end latency, in seconds: 7 days (a batch
#: API job completes within 24 h; anything longer is a unit mix-up, e.g. ms read as s).
MAX_LATENCY_S = 7 * 86400.0


#: Latencies a format computes from two timestamps (end - start), by the label of the later one:
#: what a negative value means (said instead of "is negative", which read as a negative timestamp).
_FROM_TIMESTAMPS = {
    "endTimeUnixNano": "the span ends before it starts (negative duration",
    "endTime": "the request ends before it starts (negative duration",
    "completionStartTime": "the first token comes before the request starts (negative time to first token",
}


@dataclass(frozen=True)
class Normalised:
    good: pl.DataFrame  # canonical request columns (types as in schemas/requests.toml)
    bad: pl.DataFrame  # source_line, field, reason


def _n(col: str) -> pl.Expr:
    """The numeric value of a text column (precomputed as ``_n_<col>``)."""
    return pl.col(f"_n_{col}")


def _number(s: pl.Series) -> pl.Series:
    """Text -> Float64 (null where not a number), surrounding whitespace allowed. Only the values
    that do not parse as they are get stripped and tried again."""
    s = s.cast(pl.String)
    num = s.cast(pl.Float64, strict=False)
    retry = num.is_null() & s.is_not_null()
    if not retry.any():
        return num
    return patch(num, retry, s.filter(retry).str.strip_chars().cast(pl.Float64, strict=False))


def _checks(
    labels: Mapping[str, str], input_excludes_cache: bool, has_hashes: bool
) -> list[tuple[pl.Expr, str, pl.Expr]]:
    """(condition, field label, reason) in priority order. Conditions may be null (= pass)."""

    def label(col: str) -> str:
        return labels.get(col, col.removesuffix("_raw"))

    arrival = label("arrival")
    checks: list[tuple[pl.Expr, str, pl.Expr]] = [
        # another provider's record (formats.py, ``foreign``): its reason says which
        (pl.col("foreign").is_not_null(), label("input_raw"), pl.col("foreign")),
        (pl.col("arrival_raw").is_null(), arrival, pl.lit("missing timestamp")),
        (
            pl.col("arrival").is_null(),
            arrival,
            pl.when(pl.col("arrival_raw").cast(pl.Float64, strict=False) < 0)
            .then(pl.format("negative timestamp: {}", pl.col("arrival_raw").str.slice(0, 60)))
            .when(offset_out_of_range(pl.col("arrival_raw")))
            .then(
                pl.format(
                    f"UTC offset out of range (beyond ±{MAX_OFFSET_MINUTES // 60} hours, or minutes past 59): {{}}",
                    pl.col("arrival_raw").str.slice(0, 60),
                )
            )
            .otherwise(pl.format("unparseable timestamp: {}", pl.col("arrival_raw").str.slice(0, 60))),
        ),
        (
            (pl.col("arrival") < PLAUSIBLE_ARRIVAL[0]) | (pl.col("arrival") >= PLAUSIBLE_ARRIVAL[1]),
            arrival,
            pl.format(
                f"timestamp outside the plausible range {PLAUSIBLE_ARRIVAL[0]:%Y-%m-%d} .. "
                f"{PLAUSIBLE_ARRIVAL[1]:%Y-%m-%d} UTC: {{}} (read as {{}})",
                pl.col("arrival_raw").str.slice(0, 60),
                pl.col("arrival").dt.to_string("%Y-%m-%dT%H:%M:%S%.fZ"),
            ),
        ),
    ]
    for col in ("input_raw", "output_raw"):
        checks.append((pl.col(col).is_null(), label(col), pl.lit(f"missing token count {label(col)}")))
    for col in TOKEN_FIELDS:
        raw, num, name = pl.col(col), _n(col), label(col)
        present = raw.is_not_null()
        checks += [
            (present & num.is_null(), name, pl.format(f"{name} is not a number: {{}}", raw.str.slice(0, 40))),
            (num.is_nan(), name, pl.lit(f"{name} is NaN")),
            (num < 0, name, pl.format(f"{name} is negative: {{}}", raw)),
            (
                num > MAX_TOKENS_PER_REQUEST,
                name,
                pl.format(
                    f"{name} is implausibly large (over {MAX_TOKENS_PER_REQUEST:,} tokens per request): {{}}",
                    raw.str.slice(0, 40),
                ),
            ),
            (
                (num != num.floor()) | num.is_infinite(),
                name,
                pl.format(f"{name} is not a whole number: {{}}", raw),
            ),
        ]
    inp, read, write = _n("input_raw"), _n("cache_read_raw"), _n("cache_write_raw")
    out, reasoning = _n("output_raw"), _n("reasoning_raw")
    if not input_excludes_cache:
        checks += [
            (
                read > inp,
                label("cache_read_raw"),
                pl.format(
                    f"{label('cache_read_raw')} ({{}}) exceeds {label('input_raw')} ({{}})",
                    pl.col("cache_read_raw"),
                    pl.col("input_raw"),
                ),
            ),
            (
                (read.fill_null(0) + write.fill_null(0)) > inp,
                label("cache_write_raw"),
                pl.lit("cache read + cache write tokens exceed the input tokens"),
            ),
        ]
    checks.append(
        (
            reasoning > out,
            label("reasoning_raw"),
            pl.format(
                f"{label('reasoning_raw')} ({{}}) exceeds {label('output_raw')} ({{}})",
                pl.col("reasoning_raw"),
                pl.col("output_raw"),
            ),
        )
    )
    for col in LATENCY_FIELDS:
        raw, num, name = pl.col(col), _n(col), label(col)
        checks += [
            (
                raw.is_not_null() & (num.is_null() | num.is_nan() | num.is_infinite()),
                name,
                pl.format(f"{name} is not a number: {{}}", raw.str.slice(0, 40)),
            ),
            (num < 0, name, _negative_latency(name, arrival, raw)),
            (
                num > MAX_LATENCY_S,
                name,
                pl.format(f"{name} is implausibly large (over {MAX_LATENCY_S:,.0f} s): {{}}", raw.str.slice(0, 40)),
            ),
        ]
    checks.append(
        (
            _n("ttft_raw") > _n("e2e_raw"),
            label("ttft_raw"),
            pl.lit("time to first token exceeds end-to-end latency"),
        )
    )
    if has_hashes:
        h = pl.col("hashes")
        bad_hash = h.list.eval(pl.element().cast(pl.UInt64, strict=False).is_null()).list.any()
        checks.append(
            (
                h.is_not_null() & bad_hash,
                label("hashes"),
                pl.lit(f"{label('hashes')} holds a value that is not a non-negative integer"),
            )
        )
        # A block hash stands for a block of block_size prompt tokens: more blocks than the prompt
        # fills (ceil(input / block_size)) contradict the input length, and would build prefix
        # chains of tokens the request never had.
        tokens = inp + read.fill_null(0) + write.fill_null(0) if input_excludes_cache else inp
        block = pl.col("block_size").cast(pl.Float64)
        blocks = h.list.len()
        checks.append(
            (
                h.is_not_null() & (block > 0) & (blocks > (tokens / block).ceil()),
                label("hashes"),
                pl.format(
                    f"{label('hashes')} holds {{}} blocks of {{}} tokens for {label('input_raw')} {{}} "
                    "(at most {} blocks)",
                    blocks,
                    pl.col("block_size"),
                    pl.col("input_raw"),
                    (tokens / block).ceil().cast(pl.Int64),
                ),
            )
        )
    return checks


def _negative_latency(name: str, arrival: str, raw: pl.Expr) -> pl.Expr:
    """The reason for a negative latency: a latency field's own, or, for one computed from two
    timestamps, that the record ends before it starts."""
    said = _FROM_TIMESTAMPS.get(name)
    if said is None:
        return pl.format(f"{name} is negative: {{}}", raw)
    return pl.format(f"{name} is before {arrival}: {said}, {{}} s)", raw)


@dataclass(frozen=True)
class _Plan:
    """The validation expressions for one kind of candidate frame, built once."""

    nums: list[pl.Expr]
    first_fail: pl.Expr
    field_of: dict[int, str]
    reason: pl.Expr


@lru_cache(maxsize=64)
def _plan(labels: tuple[tuple[str, str], ...], input_excludes_cache: bool, has_hashes: bool) -> _Plan:
    nums = [
        pl.col(c).map_batches(_number, return_dtype=pl.Float64, is_elementwise=True).alias(f"_n_{c}")
        for c in (*TOKEN_FIELDS, *LATENCY_FIELDS)
    ]
    checks = _checks(dict(labels), input_excludes_cache, has_hashes)
    first_fail = pl.coalesce(
        [pl.when(cond.fill_null(False)).then(pl.lit(i, pl.Int32)) for i, (cond, _, _) in enumerate(checks)]
    )
    reason: pl.Expr = pl.lit(None, dtype=pl.String)
    for i, (_, _, text) in reversed(list(enumerate(checks))):
        reason = pl.when(pl.col("_fail") == i).then(text).otherwise(reason)
    return _Plan(nums, first_fail, {i: f for i, (_, f, _) in enumerate(checks)}, reason)


def finalize(
    cand: pl.DataFrame,
    *,
    source_format: str,
    source_file: str,
    derived_ids: DerivedIds,
    labels: Mapping[str, str],
    input_excludes_cache: bool,
) -> Normalised:
    """Validate and type a candidate frame (must carry ``source_line``). Records without a request
    id get one from ``derived_ids`` (one per file, fed the file's batches in reading order)."""
    plan = _plan(tuple(sorted(labels.items())), input_excludes_cache, "hashes" in cand.columns)
    # One chunk per column: a filtered multi-chunk column can hold an empty chunk, on which
    # polars' string formatting (``pl.format``) panics (PanicException, polars 2.1: a batch the
    # robust reader assembled from the pieces around a bad line). A single-chunk frame is not copied.
    cand = cand.rechunk()
    checked = cand.with_columns(plan.nums).with_columns(_fail=plan.first_fail)
    n_bad = checked["_fail"].len() - checked["_fail"].null_count()
    if n_bad:
        # A record that is one of several on its line (an OTel span) names itself (``_where``)
        # and says where it is (``_span``: the reader makes its raw text from it).
        where = "_where" in cand.columns
        reason = pl.format("{}: {}", plan.reason, pl.col("_where")) if where else plan.reason
        bad = checked.filter(pl.col("_fail").is_not_null()).select(
            pl.col("source_line").cast(pl.Int64),
            pl.col("_fail").replace_strict(plan.field_of, return_dtype=pl.String).alias("field"),
            reason.alias("reason"),
            *([pl.col("_span")] if "_span" in cand.columns else []),
        )
    else:
        span = {"_span": pl.String} if "_span" in cand.columns else {}
        bad = pl.DataFrame(schema={"source_line": pl.Int64, "field": pl.String, "reason": pl.String, **span})

    ok = checked.filter(pl.col("_fail").is_null()) if n_bad else checked
    as_int = {c: _n(c).cast(pl.Int64) for c in TOKEN_FIELDS}
    recorded = as_int["input_raw"]
    if input_excludes_cache:
        recorded = recorded + as_int["cache_read_raw"].fill_null(0) + as_int["cache_write_raw"].fill_null(0)
    has_id = (pl.col("request_id").str.len_bytes() > 0).fill_null(False)
    # A record without an id gets null here and a derived id below.
    request_id = pl.col("request_id") if ok.select(has_id.all()).item() else pl.when(has_id).then(pl.col("request_id"))
    good = ok.select(
        request_id.alias("request_id"),
        pl.col("arrival").cast(pl.Datetime("us", "UTC")),
        pl.when(pl.col("model").str.len_bytes() > 0).then(pl.col("model")).otherwise(pl.lit("unknown")).alias("model"),
        recorded.alias("recorded_input_tokens"),
        as_int["output_raw"].alias("output_tokens"),
        pl.lit(source_format).alias("source_format"),
        pl.lit(source_file).alias("source_file"),
        pl.col("source_line").cast(pl.Int64),
        pl.col("tenant"),
        pl.col("session_id"),
        pl.col("adapter"),
        as_int["cache_read_raw"].alias("reported_cache_hit_tokens"),
        as_int["cache_write_raw"].alias("cache_write_tokens"),
        as_int["reasoning_raw"].alias("reasoning_tokens"),
        pl.col("hashes").list.eval(pl.element().cast(pl.UInt64)).alias("prefix_block_hashes"),
        pl.col("block_size").cast(pl.Int32).alias("prefix_block_size"),
        _n("ttft_raw").alias("ttft_s"),
        _n("e2e_raw").alias("e2e_s"),
        pl.col("status"),
    )
    if good["request_id"].null_count():
        good = derived_ids.assign(good, source_format)
    return Normalised(good=good, bad=bad)


#: The canonical columns a derived id is computed from (all but the id and the row's origin).
CONTENT_COLUMNS = (
    "arrival",
    "model",
    "recorded_input_tokens",
    "output_tokens",
    "tenant",
    "session_id",
    "adapter",
    "reported_cache_hit_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "prefix_block_hashes",
    "prefix_block_size",
    "ttft_s",
    "e2e_s",
    "status",
)


#: Content columns that hold free text (any character): written with their length first.
_TEXT_COLUMNS = frozenset({"model", "tenant", "session_id", "adapter", "status"})


def _content_text(frame: pl.DataFrame) -> pl.Series:
    """One text per row holding its CONTENT_COLUMNS values unambiguously: ``|`` between values, a
    null as ``-``, numbers as they are (never holding ``|`` or a lone ``-``), arrival as epoch us,
    prefix hashes comma-joined, and free text as its length, a colon and the text."""
    parts = []
    for col in CONTENT_COLUMNS:
        c = pl.col(col)
        if col == "arrival":
            text = c.dt.epoch("us").cast(pl.String).fill_null("-")
        elif col == "prefix_block_hashes":
            text = c.list.eval(pl.element().cast(pl.String)).list.join(",").fill_null("-")
        elif col in _TEXT_COLUMNS:
            text = pl.when(c.is_null()).then(pl.lit("-")).otherwise(pl.format("{}:{}", c.str.len_chars(), c))
        else:
            text = c.cast(pl.String).fill_null("-")
        parts.append(text)
    # one chunk per column: pl.format panics on a filtered column's empty chunk (see finalize)
    return frame.rechunk().select(pl.concat_str(parts, separator="|").alias("content")).to_series()


class DerivedIds:
    """Request ids for the records of one file that have none (module docstring): content hash
    plus occurrence number. Call ``assign`` on the file's batches in reading order; the counts of
    contents seen so far are kept as a sorted array (16 bytes per distinct record)."""

    #: With ``tag`` (a piece of a file split across ingest workers), ``assign`` also adds this
    #: column: the occurrence key of each derived id (null where the record had an id), so the
    #: parent can add the counts of the earlier pieces (``shift_occurrences``).
    TAG = "_id_key"

    def __init__(self, tag: bool = False) -> None:
        self.tag = tag
        self._keys = np.empty(0, np.uint64)  # sorted distinct content keys seen in the file
        self._counts = np.empty(0, np.int64)  # how often each was seen
        self._con: duckdb.DuckDBPyConnection | None = None

    def _digests(self, text: pl.Series) -> tuple[pl.Series, np.ndarray]:
        """MD5 of each text (DuckDB's, vectorised; the same digest in every version): 24 hex
        digits for the id and the first 64 bits as the occurrence key."""
        if self._con is None:
            self._con = duck_connect()
        self._con.register("contents", pl.DataFrame({"content": text}).to_arrow())
        try:
            table = self._con.sql("SELECT substr(md5(content), 1, 24) AS h FROM contents").to_arrow_table()
        finally:
            self._con.unregister("contents")
        got = pl.Series("h", table.column("h"), dtype=pl.String)
        keys = got.str.slice(0, 16).str.to_integer(base=16, dtype=pl.UInt64).to_numpy()
        return got, keys

    def occurrences(self, keys: np.ndarray) -> np.ndarray:
        """For each key (in reading order), how many times it was seen before in the file. One
        stable sort of the batch (numpy, single-threaded: no thread pool to contend for)."""
        n = len(keys)
        order = np.argsort(keys, kind="stable")
        ranked = keys[order]
        first = np.ones(n, bool)
        first[1:] = ranked[1:] != ranked[:-1]
        at = np.arange(n)
        starts = np.flatnonzero(first)
        local = np.empty(n, np.int64)
        local[order] = at - np.maximum.accumulate(np.where(first, at, 0))  # rank within equal keys
        group = np.empty(n, np.int64)
        group[order] = np.cumsum(first) - 1
        uniq, counts = ranked[starts], np.diff(np.append(starts, n))
        pos = np.searchsorted(self._keys, uniq)
        hit = pos < len(self._keys)
        hit[hit] = self._keys[pos[hit]] == uniq[hit]
        before = np.zeros(len(uniq), np.int64)
        before[hit] = self._counts[pos[hit]]
        self._counts[pos[hit]] += counts[hit]
        self._keys = np.insert(self._keys, pos[~hit], uniq[~hit])
        self._counts = np.insert(self._counts, pos[~hit], counts[~hit])
        out: np.ndarray = before[group] + local
        return out

    def assign(self, good: pl.DataFrame, source_format: str) -> pl.DataFrame:
        need = good["request_id"].is_null()
        rows = good.filter(need)
        digests, keys = self._digests(_content_text(rows))
        occ = pl.Series(self.occurrences(keys), dtype=pl.Int64)
        ids = pl.select(pl.format(f"{source_format}:{{}}:{{}}", pl.lit(digests), pl.lit(occ))).to_series()
        good = good.with_columns(request_id=patch(good["request_id"], need, ids))
        if self.tag:
            none = pl.Series(self.TAG, [None] * good.height, dtype=pl.UInt64)
            good = good.with_columns(patch(none, need, pl.Series(keys, dtype=pl.UInt64)))
        return good

    def seen(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct occurrence keys seen so far (sorted) and how often each was seen."""
        return self._keys.copy(), self._counts.copy()

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None


def shift_occurrences(frame: pl.DataFrame, keys: np.ndarray, counts: np.ndarray) -> pl.DataFrame:
    """A tagged piece's rows (``DerivedIds(tag=True)``) as if read after records whose occurrence
    keys and counts were ``keys`` (sorted) and ``counts``: each derived id's occurrence number
    grows by its key's count there. Drops the tag column."""
    tag = DerivedIds.TAG
    if tag not in frame.columns:  # a batch whose records all had ids
        return frame
    derived = frame[tag].is_not_null()
    if len(keys) and derived.any():
        rows = frame.filter(derived).rechunk()  # an empty chunk makes pl.format panic (finalize)
        k = rows[tag].to_numpy()
        pos = np.minimum(np.searchsorted(keys, k), len(keys) - 1)
        add = np.where(keys[pos] == k, counts[pos], 0)
        parts = rows["request_id"].str.extract_groups(r"^(.*):(\d+)$")
        occ = parts.struct.field("2").cast(pl.Int64) + pl.Series(add, dtype=pl.Int64)
        ids = pl.select(pl.format("{}:{}", pl.lit(parts.struct.field("1")), pl.lit(occ))).to_series()
        frame = frame.with_columns(request_id=patch(frame["request_id"], derived, ids))
    return frame.drop(tag)


_DIGITS = re.compile(r"[0-9]+")


def reason_kind(reason: str) -> str:
    """The kind of fault a quarantine reason names: the text before its first colon, numbers
    masked (``expected 3 fields, found 4`` and ``… found 5`` are one kind)."""
    return _DIGITS.sub("#", reason.split(":", 1)[0]).strip()
