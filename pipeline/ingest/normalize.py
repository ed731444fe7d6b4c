"""Shared validation: candidate frame -> canonical requests + quarantined records with reasons.

Every check is vectorised; a record gets the *first* failing check as its reason, and names the
source field (the provider's own name, e.g. ``usage.prompt_tokens``) so a user can find it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

TOKEN_FIELDS = ("input_raw", "cache_read_raw", "cache_write_raw", "output_raw", "reasoning_raw")
LATENCY_FIELDS = ("ttft_raw", "e2e_raw")


@dataclass(frozen=True)
class Normalised:
    good: pl.DataFrame  # canonical request columns (types as in schemas/requests.toml)
    bad: pl.DataFrame  # source_line, field, reason


def _num(name: str) -> pl.Expr:
    return pl.col(name).str.strip_chars().cast(pl.Float64, strict=False)


def finalize(
    cand: pl.DataFrame,
    *,
    source_format: str,
    source_file: str,
    file_id: str,
    labels: Mapping[str, str],
    input_excludes_cache: bool,
) -> Normalised:
    """Validate and type a candidate frame (must carry ``source_line``)."""

    def label(col: str) -> str:
        return labels.get(col, col.removesuffix("_raw"))

    # (condition, field label, reason expression), in priority order.
    checks: list[tuple[pl.Expr, str, pl.Expr]] = []
    checks.append((pl.col("arrival_raw").is_null(), label("arrival"), pl.lit("missing timestamp")))
    checks.append(
        (
            pl.col("arrival").is_null(),
            label("arrival"),
            pl.format("unparseable timestamp {}", pl.col("arrival_raw").str.slice(0, 60)),
        )
    )
    for col in ("input_raw", "output_raw"):
        checks.append((pl.col(col).is_null(), label(col), pl.lit(f"missing token count {label(col)}")))
    for col in TOKEN_FIELDS:
        raw = pl.col(col)
        num = _num(col)
        present = raw.is_not_null()
        checks.append(
            (
                present & num.is_null(),
                label(col),
                pl.format(f"{label(col)} is not a number: {{}}", raw.str.slice(0, 40)),
            )
        )
        checks.append(
            (present & num.is_not_null() & num.is_nan(), label(col), pl.lit(f"{label(col)} is NaN"))
        )
        checks.append(
            (
                present & (num < 0),
                label(col),
                pl.format(f"{label(col)} is negative: {{}}", raw),
            )
        )
        checks.append(
            (
                present & ((num != num.floor()) | num.is_infinite()),
                label(col),
                pl.format(f"{label(col)} is not a whole number: {{}}", raw),
            )
        )
    inp = _num("input_raw").cast(pl.Int64, strict=False)
    read = _num("cache_read_raw").cast(pl.Int64, strict=False)
    write = _num("cache_write_raw").cast(pl.Int64, strict=False)
    out = _num("output_raw").cast(pl.Int64, strict=False)
    reasoning = _num("reasoning_raw").cast(pl.Int64, strict=False)
    if input_excludes_cache:
        recorded = inp + read.fill_null(0) + write.fill_null(0)
    else:
        recorded = inp
        checks.append(
            (
                read > inp,
                label("cache_read_raw"),
                pl.format(f"{label('cache_read_raw')} ({{}}) exceeds {label('input_raw')} ({{}})", read, inp),
            )
        )
        checks.append(
            (
                (read.fill_null(0) + write.fill_null(0)) > inp,
                label("cache_write_raw"),
                pl.lit("cache read + cache write tokens exceed the input tokens"),
            )
        )
    checks.append(
        (
            reasoning > out,
            label("reasoning_raw"),
            pl.format(
                f"{label('reasoning_raw')} ({{}}) exceeds {label('output_raw')} ({{}})", reasoning, out
            ),
        )
    )
    for col in LATENCY_FIELDS:
        raw = pl.col(col)
        num = _num(col)
        checks.append(
            (
                raw.is_not_null() & (num.is_null() | num.is_nan() | num.is_infinite()),
                label(col),
                pl.format(f"{label(col)} is not a number: {{}}", raw.str.slice(0, 40)),
            )
        )
        checks.append((num < 0, label(col), pl.format(f"{label(col)} is negative: {{}}", raw)))
    checks.append(
        (
            _num("ttft_raw") > _num("e2e_raw"),
            label("ttft_raw"),
            pl.lit("time to first token exceeds end-to-end latency"),
        )
    )
    if "hashes" in cand.columns:
        h = pl.col("hashes")
        bad_hash = h.list.eval(pl.element().cast(pl.UInt64, strict=False).is_null()).list.any()
        checks.append(
            (
                h.is_not_null() & bad_hash.fill_null(False),
                label("hashes"),
                pl.lit(f"{label('hashes')} holds a value that is not a non-negative integer"),
            )
        )

    field_expr: pl.Expr = pl.lit(None, dtype=pl.String)
    reason_expr: pl.Expr = pl.lit(None, dtype=pl.String)
    for cond, field, reason in reversed(checks):
        hit = cond.fill_null(False)
        field_expr = pl.when(hit).then(pl.lit(field)).otherwise(field_expr)
        reason_expr = pl.when(hit).then(reason).otherwise(reason_expr)

    checked = cand.with_columns(_field=field_expr, _reason=reason_expr)
    bad = checked.filter(pl.col("_reason").is_not_null()).select(
        pl.col("source_line").cast(pl.Int64),
        pl.col("_field").alias("field"),
        pl.col("_reason").alias("reason"),
    )
    ok = checked.filter(pl.col("_reason").is_null())
    derived_id = pl.format(f"{source_format}:{file_id}:{{}}", pl.col("source_line"))
    good = ok.select(
        pl.when(pl.col("request_id").str.len_bytes() > 0)
        .then(pl.col("request_id"))
        .otherwise(derived_id)
        .alias("request_id"),
        pl.col("arrival").cast(pl.Datetime("us", "UTC")),
        pl.col("model").fill_null("unknown"),
        recorded.alias("recorded_input_tokens"),
        out.alias("output_tokens"),
        pl.lit(source_format).alias("source_format"),
        pl.lit(source_file).alias("source_file"),
        pl.col("source_line").cast(pl.Int64),
        pl.col("tenant"),
        pl.col("session_id"),
        pl.col("adapter"),
        read.alias("reported_cache_hit_tokens"),
        write.alias("cache_write_tokens"),
        reasoning.alias("reasoning_tokens"),
        pl.col("hashes").list.eval(pl.element().cast(pl.UInt64)).alias("prefix_block_hashes"),
        pl.col("block_size").cast(pl.Int32).alias("prefix_block_size"),
        _num("ttft_raw").alias("ttft_s"),
        _num("e2e_raw").alias("e2e_s"),
        pl.col("status"),
    )
    return Normalised(good=good, bad=bad)
