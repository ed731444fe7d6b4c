"""Shared validation: candidate frame -> canonical requests + quarantined records with reasons.

Every check is vectorised; a record gets the *first* failing check as its reason, and names the
source field (the provider's own name, e.g. ``usage.prompt_tokens``) so a user can find it.
Conditions are evaluated on every row; the reason text only on the (few) failing rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import polars as pl

from pipeline.ingest.timeparse import patch

TOKEN_FIELDS = ("input_raw", "cache_read_raw", "cache_write_raw", "output_raw", "reasoning_raw")
LATENCY_FIELDS = ("ttft_raw", "e2e_raw")


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
        (pl.col("arrival_raw").is_null(), arrival, pl.lit("missing timestamp")),
        (
            pl.col("arrival").is_null(),
            arrival,
            pl.format("unparseable timestamp {}", pl.col("arrival_raw").str.slice(0, 60)),
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
            (num < 0, name, pl.format(f"{name} is negative: {{}}", raw)),
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
    return checks


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
    file_id: str | Callable[[], str],
    labels: Mapping[str, str],
    input_excludes_cache: bool,
) -> Normalised:
    """Validate and type a candidate frame (must carry ``source_line``)."""
    plan = _plan(tuple(sorted(labels.items())), input_excludes_cache, "hashes" in cand.columns)
    checked = cand.with_columns(plan.nums).with_columns(_fail=plan.first_fail)
    n_bad = checked["_fail"].len() - checked["_fail"].null_count()
    if n_bad:
        bad = checked.filter(pl.col("_fail").is_not_null()).select(
            pl.col("source_line").cast(pl.Int64),
            pl.col("_fail").replace_strict(plan.field_of, return_dtype=pl.String).alias("field"),
            plan.reason.alias("reason"),
        )
    else:
        bad = pl.DataFrame(schema={"source_line": pl.Int64, "field": pl.String, "reason": pl.String})

    ok = checked.filter(pl.col("_fail").is_null()) if n_bad else checked
    as_int = {c: _n(c).cast(pl.Int64) for c in TOKEN_FIELDS}
    recorded = as_int["input_raw"]
    if input_excludes_cache:
        recorded = recorded + as_int["cache_read_raw"].fill_null(0) + as_int["cache_write_raw"].fill_null(0)
    has_id = (pl.col("request_id").str.len_bytes() > 0).fill_null(False)
    if ok.select(has_id.all()).item():
        request_id = pl.col("request_id")  # every record has its own id: no derived ids needed
    else:
        derived = pl.format(
            f"{source_format}:{file_id() if callable(file_id) else file_id}:{{}}", pl.col("source_line")
        )
        request_id = pl.when(has_id).then(pl.col("request_id")).otherwise(derived)
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
    return Normalised(good=good, bad=bad)
