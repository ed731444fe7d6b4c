"""Vectorised timestamp parsing for log fields (polars expressions; null where unparseable)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import numpy as np
import polars as pl
import pyarrow as pa

#: Kinds a timestamp field can have. "auto" picks epoch units by magnitude and ISO-8601 otherwise.
TIME_KINDS = ("auto", "s", "ms", "us", "ns", "iso", "relative_s", "relative_ms")

_US = pl.Datetime("us", "UTC")
_NS_NAIVE = pl.Datetime("ns")

#: The plausible arrival range, [2000-01-01, 2100-01-01) UTC. A request log of an LLM service
#: cannot predate 2000 (nor, in practice, 2017) and a time past 2100 is a unit mix-up, a relative
#: offset read as absolute, or corruption. Ingest quarantines arrivals outside it
#: (``normalize.py``), and "auto" reads a number as epoch time only when it lands inside it. It
#: also keeps every stored time far from the ends of what tools with ns timestamps represent
#: (1677-09-21 .. 2262-04-11), where values used to wrap around silently.
PLAUSIBLE_ARRIVAL = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
_EPOCH_MIN_S = int(PLAUSIBLE_ARRIVAL[0].timestamp())  # 946_684_800
_EPOCH_MAX_S = int(PLAUSIBLE_ARRIVAL[1].timestamp())  # 4_102_444_800
#: Microseconds from the epoch beyond which a number is not converted at all (about 146,000
#: years): far outside the plausible range, and far from Int64's ends, so nothing wraps.
_MAX_ABS_US = float(1 << 62)


#: The zone suffix: ``Z`` (RFC 3339 allows ``z`` too) or an offset ±hh:mm / ±hhmm.
_TZ = r"(?i)(Z|[+-]\d{2}:?\d{2})$"
#: The largest UTC offset taken, in minutes (±18:00, ISO 8601's and java.time's bound; real zones
#: span -12:00 .. +14:00). A larger one, or minutes past 59, makes the time unparseable.
MAX_OFFSET_MINUTES = 18 * 60


def _offset_parts(tz: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    digits = tz.str.replace_all(r"[^0-9]", "")
    return digits.str.slice(0, 2).cast(pl.Int64, strict=False), digits.str.slice(2, 2).cast(pl.Int64, strict=False)


def offset_out_of_range(expr: pl.Expr) -> pl.Expr:
    """True for a timestamp text whose UTC offset is beyond ±18:00 or has minutes past 59 (what
    :func:`_iso` refuses), for the quarantine reason."""
    tz = expr.str.strip_chars().str.extract(r"\d:\d{2}(?:\.\d+)?([+-]\d{2}:?\d{2})$", 1)
    hours, minutes = _offset_parts(tz)
    return ((hours * 60 + minutes) > MAX_OFFSET_MINUTES) | (minutes > 59)


def _iso(expr: pl.Expr) -> pl.Expr:
    """ISO-8601 / RFC 3339 (``T`` or space, optional fraction up to ns, optional ``Z`` or ±hh:mm)
    in one parse: the zone suffix is split off and applied as an offset, naive times are UTC.
    RFC 3339's lower-case ``t`` and ``z`` are taken; an offset beyond ±18:00 (or with minutes
    past 59) is not a time (null)."""
    s = expr.str.strip_chars()
    tz = s.str.extract(_TZ, 1).str.to_uppercase()
    base = s.str.replace(_TZ, "").str.replace(r"[Tt]", " ")
    # Parsed at us precision: every year 0001..9999 is representable (at ns precision a year past
    # 2262 wrapped around to some other year without an error). Digits past us are truncated.
    naive = base.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us", cache=False)
    hours, mins = _offset_parts(tz)
    minutes = hours * 60 + mins
    offset = pl.when(tz.is_null() | (tz == "Z")).then(0).when(tz.str.starts_with("-")).then(-minutes).otherwise(minutes)
    valid = tz.is_null() | (tz == "Z") | ((minutes <= MAX_OFFSET_MINUTES) & (mins <= 59))
    parsed = (naive - pl.duration(minutes=offset)).dt.cast_time_unit("us").dt.replace_time_zone("UTC")
    return pl.when(valid).then(parsed)


#: The shape most logs write (RFC 3339 in UTC with a "Z"). It is parsed directly, and the general
#: ISO parser (``_iso``, several string passes) runs only on the rows this one does not take; on a
#: row both take they agree (same fields, fraction to ns then truncated to us, UTC).
_ZULU = "%Y-%m-%dT%H:%M:%S%.fZ"

# Byte layout of "YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z": separators by position, digits elsewhere.
_SEPARATORS = {4: ord("-"), 7: ord("-"), 10: ord("T"), 13: ord(":"), 16: ord(":")}
#: Years the byte parser takes (all four-digit years, as the general parser, at us precision).
_YEARS = (1, 9999)


def _days_from_civil(y: np.ndarray, m: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil)."""
    y = y - (m <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + np.where(m > 2, -3, 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days: np.ndarray = era * 146097 + doe - 719468
    return days


def _zulu_fixed(s: pl.Series) -> pl.Series | None:
    """Parse a batch whose values all have one length in the "...Z" layout straight from the bytes
    (numpy over an (n, length) view): Datetime(us, UTC), null on a row that is not a valid time in
    that layout. None when the batch does not have that shape (the caller uses chrono instead)."""
    n = len(s)
    if n == 0:
        return None
    lengths = s.str.len_bytes().drop_nulls()
    if lengths.len() == 0:
        return None
    width = int(lengths[0])
    if not (20 <= width <= 30 and width != 21) or lengths.n_unique() != 1:
        return None
    filled = s.fill_null("0" * width) if s.null_count() else s
    arr = pa.chunked_array(filled.to_arrow()).cast(pa.large_string()).combine_chunks()
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0] : offsets[0] + n * width]
    dig = data.reshape(n, width) - np.uint8(ord("0"))  # a non-digit wraps to a value above 9
    layout = {**_SEPARATORS, 19: ord("."), width - 1: ord("Z")} if width > 20 else {**_SEPARATORS, 19: ord("Z")}
    sep_pos = np.array(sorted(layout))
    sep_want = np.array([layout[p] for p in sorted(layout)], dtype=np.uint8) - np.uint8(ord("0"))
    digit_pos = np.array([p for p in range(width) if p not in layout])
    ok = (dig[:, sep_pos] == sep_want).all(axis=1) & (dig[:, digit_pos] <= 9).all(axis=1)

    def num(at: int, k: int) -> np.ndarray:
        value: np.ndarray = dig[:, at].astype(np.int64)
        for pos in range(at + 1, at + k):
            value = value * 10 + dig[:, pos]
        return value

    year, month, day = num(0, 4), num(5, 2), num(8, 2)
    hour, minute, sec = num(11, 2), num(14, 2), num(17, 2)
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    month_days = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[np.clip(month, 0, 12)] + (
        leap & (month == 2)
    )
    ok &= (year >= _YEARS[0]) & (year <= _YEARS[1]) & (month >= 1) & (month <= 12) & (day >= 1)
    ok &= (day <= month_days) & (hour < 24) & (minute < 60) & (sec < 60)
    frac_digits = width - 21 if width > 20 else 0
    kept = min(frac_digits, 6)  # digits past microseconds are truncated, as the general parser does
    frac_us = num(20, kept) * 10 ** (6 - kept) if kept else 0
    secs = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + sec
    ok &= s.is_not_null().to_numpy()
    us = pl.Series(secs * 1_000_000 + frac_us, dtype=pl.Int64)
    return us.scatter(np.flatnonzero(~ok), None).cast(_US)


def patch(base: pl.Series, rows: pl.Series, values: pl.Series) -> pl.Series:
    """``base`` with the ``rows`` (a mask) replaced by ``values`` (one per true row)."""
    return base.scatter(rows.arg_true(), values)


def _iso_series(s: pl.Series) -> pl.Series:
    s = s.cast(pl.String)
    fast = _zulu_fixed(s)
    if fast is None:
        fast = s.str.to_datetime(_ZULU, strict=False, time_unit="us", cache=False)
        fast = fast.dt.replace_time_zone("UTC")
    rest = fast.is_null() & s.is_not_null()
    if not rest.any():
        return fast
    slow = pl.select(_iso(pl.lit(s.filter(rest)))).to_series()
    return patch(fast, rest, slow)


def _auto_series(s: pl.Series) -> pl.Series:
    s = s.cast(pl.String)
    num = s.cast(pl.Float64, strict=False)
    if num.null_count() == len(num):
        return _iso_series(s)  # no epoch numbers at all: the usual case for ISO-stamped logs
    secs = (
        pl.when(pl.col("n").abs() < _EPOCH_MAX_S)
        .then(pl.col("n"))
        .when(pl.col("n").abs() < _EPOCH_MAX_S * 1e3)
        .then(pl.col("n") / 1e3)
        .when(pl.col("n").abs() < _EPOCH_MAX_S * 1e6)
        .then(pl.col("n") / 1e6)
        .otherwise(pl.col("n") / 1e9)
    )
    n = pl.col("n")
    scale = (
        pl.when(n.abs() < _EPOCH_MAX_S)
        .then(pl.lit(1e6))
        .when(n.abs() < _EPOCH_MAX_S * 1e3)
        .then(pl.lit(1e3))
        .when(n.abs() < _EPOCH_MAX_S * 1e6)
        .then(pl.lit(1.0))
        .otherwise(pl.lit(1e-3))
    )
    # an integer is converted exactly in its unit (a float of 19 digits of ns is off by up to
    # 128 ns, which moved some arrivals by a microsecond); a fraction through the float
    by_float = _epoch(secs, 1e6)
    whole = pl.col("s").str.strip_chars().cast(pl.Int64, strict=False)
    exact = pl.when(scale >= 1).then(whole * scale.cast(pl.Int64)).otherwise(whole.floordiv(1000))
    bound = pl.lit(_MAX_ABS_US) / pl.when(scale >= 1).then(scale).otherwise(1.0)
    exact_us = pl.when(whole.is_not_null() & (whole.cast(pl.Float64).abs() <= bound)).then(exact).cast(_US)
    epoch = (
        pl.DataFrame({"n": num, "s": s})
        .select(pl.when((secs >= _EPOCH_MIN_S) & (secs < _EPOCH_MAX_S)).then(pl.coalesce(exact_us, by_float)))
        .to_series()
    )
    text = num.is_null() & s.is_not_null()
    if not text.any():
        return epoch
    return patch(epoch, text, _iso_series(s.filter(text)))


def _epoch_exact(text: pl.Expr, scale_to_us: float, otherwise: pl.Expr) -> pl.Expr:
    """An epoch time written as a whole number, converted exactly (ns truncated to us, as digits
    past us of an ISO time are); ``otherwise`` (the float conversion) for any other text. Through
    a float, 19 digits of ns are off by up to 128 ns: an OTel span's start and the same request's
    ISO timestamp then differed by a microsecond."""
    whole = text.cast(pl.String).str.strip_chars().cast(pl.Int64, strict=False)
    exact: pl.Expr
    if scale_to_us >= 1:
        factor = int(scale_to_us)
        exact = pl.when(whole.abs() <= int(_MAX_ABS_US) // factor).then(whole * factor)
    else:
        exact = whole.floordiv(round(1 / scale_to_us))
    return pl.when(whole.is_not_null()).then(exact.cast(_US)).otherwise(otherwise)


def _epoch(num: pl.Expr, scale_to_us: float) -> pl.Expr:
    us = num * scale_to_us
    return pl.when(us.abs() <= _MAX_ABS_US).then(us.round(0).cast(pl.Int64, strict=False)).cast(_US)


def anchor_us(anchor: str | None) -> int | None:
    if anchor is None:
        return None
    d = date.fromisoformat(anchor)
    return int(datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp() * 1_000_000)


def parse_time(expr: pl.Expr, kind: str, anchor: str | None = None) -> pl.Expr:
    """Parse a String expression into Datetime(us, UTC); null where it cannot be parsed.

    ``relative_*`` kinds need ``anchor`` (YYYY-MM-DD, midnight UTC) and give null without it.
    """
    num = expr.cast(pl.Float64, strict=False)
    if kind == "iso":
        return expr.map_batches(_iso_series, return_dtype=_US, is_elementwise=True)
    scales = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}
    if kind in scales:
        return _epoch_exact(expr, scales[kind], _epoch(num, scales[kind]))
    if kind in ("relative_s", "relative_ms"):
        base = anchor_us(anchor)
        if base is None:
            return pl.lit(None, dtype=_US)
        scale = 1e6 if kind == "relative_s" else 1e3
        offset = num * scale
        # an offset from the trace's start is never negative: such a row is quarantined, it does
        # not land on the day before
        return (
            pl.when((offset >= 0) & (offset <= _MAX_ABS_US))
            .then(pl.lit(base, pl.Int64) + offset.round(0).cast(pl.Int64, strict=False))
            .cast(_US)
        )
    if kind == "auto":
        # A number is an epoch time whose unit is picked by magnitude; anything else is ISO-8601.
        return expr.map_batches(_auto_series, return_dtype=_US, is_elementwise=True)
    raise ValueError(f"unknown time kind {kind!r}")
