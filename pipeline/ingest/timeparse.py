"""Vectorised timestamp parsing for log fields (polars expressions; null where unparseable)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import polars as pl

#: Kinds a timestamp field can have. "auto" picks epoch units by magnitude and ISO-8601 otherwise.
TIME_KINDS = ("auto", "s", "ms", "us", "ns", "iso", "relative_s", "relative_ms")

_US = pl.Datetime("us", "UTC")
_NS_NAIVE = pl.Datetime("ns")

# Plausible epoch range for "auto" (2000-01-01 .. 2100-01-01, in seconds): outside it a number is
# more likely a relative offset or a unit mix-up than a real wall-clock time.
_EPOCH_MIN_S = 946_684_800
_EPOCH_MAX_S = 4_102_444_800


_TZ = r"(Z|[+-]\d{2}:?\d{2})$"


def _iso(expr: pl.Expr) -> pl.Expr:
    """ISO-8601 / RFC 3339 (``T`` or space, optional fraction up to ns, optional ``Z`` or ±hh:mm)
    in one parse: the zone suffix is split off and applied as an offset, naive times are UTC."""
    s = expr.str.strip_chars()
    tz = s.str.extract(_TZ, 1)
    base = s.str.replace(_TZ, "").str.replace("T", " ", literal=True)
    naive = base.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="ns", cache=False)
    digits = tz.str.replace_all(r"[^0-9]", "")
    minutes = digits.str.slice(0, 2).cast(pl.Int64, strict=False) * 60 + digits.str.slice(2, 2).cast(
        pl.Int64, strict=False
    )
    offset = pl.when(tz.is_null() | (tz == "Z")).then(0).when(tz.str.starts_with("-")).then(-minutes).otherwise(minutes)
    return (naive - pl.duration(minutes=offset)).dt.cast_time_unit("us").dt.replace_time_zone("UTC")


#: The shape most logs write (RFC 3339 in UTC with a "Z"). It is parsed directly, and the general
#: ISO parser (``_iso``, several string passes) runs only on the rows this one does not take; on a
#: row both take they agree (same fields, fraction to ns then truncated to us, UTC).
_ZULU = "%Y-%m-%dT%H:%M:%S%.fZ"


def _patch(base: pl.Series, rows: pl.Series, values: pl.Series) -> pl.Series:
    """``base`` with the ``rows`` (a mask) replaced by ``values`` (one per true row)."""
    return base.scatter(rows.arg_true(), values)


def _iso_series(s: pl.Series) -> pl.Series:
    s = s.cast(pl.String)
    fast = s.str.to_datetime(_ZULU, strict=False, time_unit="ns", cache=False)
    fast = fast.dt.cast_time_unit("us").dt.replace_time_zone("UTC")
    rest = fast.is_null() & s.is_not_null()
    if not rest.any():
        return fast
    slow = pl.select(_iso(pl.lit(s.filter(rest)))).to_series()
    return _patch(fast, rest, slow)


def _auto_series(s: pl.Series) -> pl.Series:
    s = s.cast(pl.String)
    num = s.cast(pl.Float64, strict=False)
    secs = (
        pl.when(pl.col("n").abs() < _EPOCH_MAX_S)
        .then(pl.col("n"))
        .when(pl.col("n").abs() < _EPOCH_MAX_S * 1e3)
        .then(pl.col("n") / 1e3)
        .when(pl.col("n").abs() < _EPOCH_MAX_S * 1e6)
        .then(pl.col("n") / 1e6)
        .otherwise(pl.col("n") / 1e9)
    )
    epoch = (
        pl.DataFrame({"n": num})
        .select(pl.when((secs >= _EPOCH_MIN_S) & (secs < _EPOCH_MAX_S)).then(_epoch(secs, 1e6)))
        .to_series()
    )
    text = num.is_null() & s.is_not_null()
    if not text.any():
        return epoch
    return _patch(epoch, text, _iso_series(s.filter(text)))


def _epoch(num: pl.Expr, scale_to_us: float) -> pl.Expr:
    return (num * scale_to_us).round(0).cast(pl.Int64, strict=False).cast(_US)


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
        return _epoch(num, scales[kind])
    if kind in ("relative_s", "relative_ms"):
        base = anchor_us(anchor)
        if base is None:
            return pl.lit(None, dtype=_US)
        scale = 1e6 if kind == "relative_s" else 1e3
        return (pl.lit(base, pl.Int64) + (num * scale).round(0).cast(pl.Int64, strict=False)).cast(_US)
    if kind == "auto":
        # A number is an epoch time whose unit is picked by magnitude; anything else is ISO-8601.
        return expr.map_batches(_auto_series, return_dtype=_US, is_elementwise=True)
    raise ValueError(f"unknown time kind {kind!r}")
