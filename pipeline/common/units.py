"""Figures for people: numbers, durations, latencies and sizes as every command and the report
print them (the unit follows the magnitude: ms below 1 s, minutes past 10 min, days past two;
GiB, MiB, KiB; no scientific notation below 10¹²).

The ground floor: it imports no module of the package, so anything may use it.
"""

from __future__ import annotations

import math

import numpy as np

#: Beyond this a figure is printed in scientific notation (a hostile --rate-scale 1e300 made
#: lines of hundreds of digits).
PLAIN_UP_TO = 1e12
DAY_S = 86_400.0
GIB = 1024**3


def plain_number(x: float, digits: int = 3) -> str:
    """Thousands separators from 100 up, significant digits below: no scientific notation from
    10⁻⁹ to 10¹² (outside, as :func:`format_number`: a figure that size is a failure to show)."""
    if not math.isfinite(x) or abs(x) >= PLAIN_UP_TO or 0 < abs(x) < 1e-9:
        return f"{x:.3g}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    # positional with `digits` significant digits (f"{x:.3g}" turns 1e-7 into "1e-07")
    return str(np.format_float_positional(x, precision=digits, unique=False, fractional=False, trim="-"))


def format_number(x: float, decimals: int = 2) -> str:
    """A figure for people: thousands separated, ``decimals`` places, scientific past 10¹²."""
    if math.isfinite(x) and abs(x) >= PLAIN_UP_TO:
        return f"{x:.3g}"
    return f"{x:,.{decimals}f}"


def format_seconds(x: float | None) -> str:
    """Seconds for people: ms below 1 s, seconds below 10 min, then minutes, hours (from 2 h) and
    days (from 2 days; '84,861 s' is '23.6 h'), scientific seconds only past 10¹² s; inf as
    'never'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "never"
    if abs(x) < 1.0:
        return f"{x * 1000:.3g} ms" if x * 1000 >= 1 else f"{x * 1000:.2f} ms"
    if x < 600 or x >= PLAIN_UP_TO:
        return f"{format_number(x, 2 if x < 100 else 0)} s"
    if x < 2 * 3600:
        return f"{plain_number(x / 60)} min"
    if x < 2 * DAY_S:
        return f"{plain_number(x / 3600)} h"
    return f"{plain_number(x / DAY_S)} days"


def format_duration(s: float) -> str:
    """A run's length for a progress line: seconds, minutes, hours, days, rounded."""
    if s < 90:
        return f"{s:,.0f} s"
    if s < 5400:
        return f"{s / 60:,.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:,.1f} h"
    return f"{format_number(s / 86400, 1)} days"


def format_bytes(n: float) -> str:
    """A size in the largest binary unit it reaches: '1.5 GiB', '512.0 MiB', '3 KiB', '1 byte'."""
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2)):
        if n >= size:
            return f"{format_number(n / size, 1)} {unit}"
    if n >= 1024:
        return f"{n / 1024:,.0f} KiB"
    return f"{n:,.0f} byte{'' if n == 1 else 's'}"


def distinct_numbers(a: float, b: float) -> tuple[str, str]:
    """``a`` (one decimal) and the limit ``b`` it is more than, or, where that rounding hides the
    difference, both with as many significant digits as tell them apart: a span just past its
    limit is not said to be "0.0, more than the limit of 1e-07" or "30.0, more than 30"."""
    x = format_number(a, 1)
    if float(x.replace(",", "")) > b:
        return x, f"{b:g}"
    for digits in range(3, 18):
        x, y = f"{a:,.{digits}g}", f"{b:,.{digits}g}"
        if x != y:
            return x, y
    return repr(a), repr(b)
