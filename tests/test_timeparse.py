"""Vectorised timestamp parsing against Python's datetime on random instants and zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ingest.timeparse import _iso, _iso_series, _zulu_fixed, parse_time

_instants = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31)).map(
    lambda d: d.replace(tzinfo=UTC)
)
_offsets = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))


@settings(max_examples=200, deadline=None)
@given(when=_instants, zone=_offsets, sep=st.sampled_from(["T", " "]), zulu=st.booleans())
def test_iso_matches_datetime(when: datetime, zone: timezone, sep: str, zulu: bool) -> None:
    local = when.astimezone(zone)
    text = local.isoformat(sep=sep)
    if zulu and zone.utcoffset(None) == timedelta(0):
        text = text.replace("+00:00", "Z")
    got = pl.DataFrame({"t": [text]}).select(parse_time(pl.col("t"), "iso").alias("t"))["t"][0]
    assert got == when, text
    auto = pl.DataFrame({"t": [text]}).select(parse_time(pl.col("t"), "auto").alias("t"))["t"][0]
    assert auto == when


@settings(max_examples=100, deadline=None)
@given(when=_instants)
def test_epoch_units_and_auto_magnitude(when: datetime) -> None:
    us = int(when.timestamp() * 1_000_000)
    for kind, value in (("s", us / 1e6), ("ms", us / 1e3), ("us", us), ("ns", us * 1000)):
        got = pl.DataFrame({"t": [str(value)]}).select(parse_time(pl.col("t"), kind).alias("t"))["t"][0]
        assert abs((got - when).total_seconds()) < 1e-3, kind
        auto = pl.DataFrame({"t": [str(value)]}).select(parse_time(pl.col("t"), "auto").alias("t"))["t"][0]
        assert abs((auto - when).total_seconds()) < 1e-3, ("auto", kind)


def test_relative_needs_an_anchor_and_garbage_is_null() -> None:
    df = pl.DataFrame({"t": ["1500", "abc", None]})
    rel = df.select(parse_time(pl.col("t"), "relative_ms", "2024-05-01").alias("t"))["t"].to_list()
    assert rel[0] == datetime(2024, 5, 1, 0, 0, 1, 500000, tzinfo=UTC) and rel[1:] == [None, None]
    assert df.with_columns(parse_time(pl.col("t"), "relative_ms").alias("t"))["t"].null_count() == 3
    assert df.select(parse_time(pl.col("t"), "auto").alias("t"))["t"].to_list()[1:] == [None, None]


@settings(max_examples=150, deadline=None)
@given(
    when=_instants,
    digits=st.integers(0, 9),
    sep=st.sampled_from(["T", " "]),
)
def test_zulu_fast_path_agrees_with_general_iso_parser(when: datetime, digits: int, sep: str) -> None:
    """The direct "...Z" parse and the general ISO parser give the same instant on every row the
    fast one takes (fractions of 0-9 digits truncate to microseconds alike)."""
    frac = f"{when.microsecond:06d}123"[:digits]
    text = when.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + (f".{frac}" if digits else "") + "Z"
    fast = _iso_series(pl.Series([text]))[0]
    general = pl.select(_iso(pl.lit(text))).item()
    assert fast == general and general is not None, text


def test_mixed_batch_parses_each_row_as_alone() -> None:
    """'auto' on a batch mixing shapes (epoch units, Z, offsets, naive, garbage, null) gives every
    row what it gets on its own: the fast path and the patching of the rest line up."""
    rows = [
        "2025-01-15T00:00:00.327677Z",
        "1736899200",
        "2025-01-15T05:30:00+05:30",
        None,
        "2025-01-15 00:00:01",
        "not a time",
        "1736899200123",
        "2025-01-15T00:00:02Z",
        " 2025-01-15T00:00:03Z ",
        "2025-01-15T00:00:04.5-0100",
    ]
    batch = pl.DataFrame({"t": rows}).select(parse_time(pl.col("t"), "auto").alias("t"))["t"].to_list()
    alone = [
        pl.DataFrame({"t": [r]}, schema={"t": pl.String}).select(parse_time(pl.col("t"), "auto"))["t"][0] for r in rows
    ]
    assert batch == alone
    assert batch[0] == datetime(2025, 1, 15, 0, 0, 0, 327677, tzinfo=UTC)
    assert batch[1] == batch[2] == datetime(2025, 1, 15, tzinfo=UTC)
    assert batch[3] is None and batch[5] is None
    assert batch[6] == datetime(2025, 1, 15, 0, 0, 0, 123000, tzinfo=UTC)
    assert batch[8] == datetime(2025, 1, 15, 0, 0, 3, tzinfo=UTC)
    assert batch[9] == datetime(2025, 1, 15, 1, 0, 4, 500000, tzinfo=UTC)


_field = st.tuples(
    st.integers(1600, 2300),
    st.integers(0, 19),
    st.integers(0, 39),
    st.integers(0, 29),
    st.integers(0, 69),
    st.integers(0, 69),
)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(_field, min_size=1, max_size=40), digits=st.integers(0, 9), nulls=st.booleans())
def test_fixed_width_zulu_parser_agrees_with_general_parser(
    rows: list[tuple[int, int, int, int, int, int]], digits: int, nulls: bool
) -> None:
    """The byte-level parser of equal-width "...Z" batches, on dates and times both valid and not
    (month 13, 30 Feb, 24:00, second 60, years the general parser cannot hold): each row it takes
    equals the general parser's result, each row it rejects is left null, and the whole 'iso'
    parse equals the general parser row by row."""
    frac = ("." + "123456789"[:digits]) if digits else ""
    texts: list[str | None] = [
        f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}Z" for y, mo, d, h, mi, s in rows
    ]
    if nulls and len(texts) > 1:
        texts[0] = None
    series = pl.Series(texts, dtype=pl.String)
    general = pl.select(_iso(pl.lit(series))).to_series().to_list()
    fixed = _zulu_fixed(series)
    assert fixed is not None
    for got, want in zip(fixed.to_list(), general, strict=True):
        assert got is None or got == want
    assert _iso_series(series).to_list() == general


@settings(max_examples=200, deadline=None)
@given(when=_instants, sub_us=st.integers(0, 999))
def test_integer_epochs_are_exact_and_ns_truncate_like_iso(when: datetime, sub_us: int) -> None:
    """A whole number of ns (OTel's startTimeUnixNano), us or ms is converted exactly: the same
    instant as the ISO text with nine fraction digits (digits past us truncated). Through a float,
    19 digits of ns were off by up to 128 ns, and some arrivals moved by a microsecond."""
    us = (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    ns = us * 1000 + sub_us
    iso = when.strftime("%Y-%m-%dT%H:%M:%S") + f".{when.microsecond:06d}{sub_us:03d}Z"
    frame = pl.DataFrame({"ns": [str(ns)], "us": [str(us)], "iso": [iso]})
    got = frame.select(
        parse_time(pl.col("ns"), "ns").alias("ns"),
        parse_time(pl.col("ns"), "auto").alias("ns_auto"),
        parse_time(pl.col("us"), "us").alias("us"),
        parse_time(pl.col("us"), "auto").alias("us_auto"),
        parse_time(pl.col("iso"), "iso").alias("iso"),
    ).row(0)
    assert got == (when, when, when, when, when), (ns, got)


def test_integer_epoch_examples() -> None:
    frame = pl.DataFrame({"t": ["1733011200123456999", "1733011200123456500", "1733011200123"]})
    got = frame.select(
        parse_time(pl.col("t"), "ns").alias("ns"), parse_time(pl.col("t"), "auto").alias("auto")
    ).to_dict(as_series=False)
    base = datetime(2024, 12, 1, tzinfo=UTC)
    assert got["ns"][:2] == [base + timedelta(microseconds=123456)] * 2
    assert got["auto"] == [*[base + timedelta(microseconds=123456)] * 2, base + timedelta(milliseconds=123)]
