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
    naive = base.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="ns")
    digits = tz.str.replace_all(r"[^0-9]", "")
    minutes = digits.str.slice(0, 2).cast(pl.Int64, strict=False) * 60 + digits.str.slice(2, 2).cast(
        pl.Int64, strict=False
    )
    offset = pl.when(tz.is_null() | (tz == "Z")).then(0).when(tz.str.starts_with("-")).then(-minutes).otherwise(minutes)
    return (naive - pl.duration(minutes=offset)).dt.cast_time_unit("us").dt.replace_time_zone("UTC")


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
        return _iso(expr)
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
        secs = (
            pl.when(num.abs() < _EPOCH_MAX_S)
            .then(num)
            .when(num.abs() < _EPOCH_MAX_S * 1e3)
            .then(num / 1e3)
            .when(num.abs() < _EPOCH_MAX_S * 1e6)
            .then(num / 1e6)
            .otherwise(num / 1e9)
        )
        epoch = pl.when((secs >= _EPOCH_MIN_S) & (secs < _EPOCH_MAX_S)).then(_epoch(secs, 1e6))
        return pl.when(num.is_not_null()).then(epoch).otherwise(_iso(expr))
    raise ValueError(f"unknown time kind {kind!r}")
