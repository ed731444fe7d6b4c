"""Measured rows that no kernel can have produced as they stand: flagged by ``rooftrace validate
--measurements`` and left out of the profiles by the build (counted, listed, with a reason).

Two rules, both "beyond noise" by a factor the tables' own repeats and neighbours set:

- **FP8 slower than BF16** at the same GPU, set, shape and size (GEMM: n, k, m; fused MoE: the
  expert shape, routing, sharding and tokens) by more than :data:`FP8_NOISE` times what that
  pair of kernels does across the table (its median FP8 / BF16 ratio, taken as at least 1). An
  FP8 kernel reads half the weight bytes at twice the peak; it can be slower where its fixed
  costs dominate (activation quantisation, another kernel family: Hopper's FP8 fused MoE, a
  FlashInfer CUTLASS kernel, runs 2.1-3.1x BF16's Triton kernel at the median, a property of
  the kernel that every shape shows), but a row that is slower again by a factor 2 beyond its
  own table's pattern is a broken measurement. A systematic offset is reported per table
  (:func:`fp8_table_notes`), not removed: removing it would empty the table.
- **Non-monotone in tokens**: along one curve (a GEMM's m at fixed n, k; a fused MoE's tokens at
  fixed shape), a row more than :data:`MONOTONE_NOISE` times slower than a row with *more*
  tokens. Of the two sets of rows that remove every such pair — the slow rows before a faster
  one, or the fast rows after a slower one — the smaller is flagged (one glitch, low or high,
  is one row; L40S's MoE at tp = 16, 4.4 and 7.4 ms at 80 and 128 tokens between 0.18 ms at 48
  and 0.27 ms at 160, is two).

Repeated measurements of one key enter at their median (as every lookup takes them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

#: FP8 may be this many times slower than BF16 beyond its table's median FP8/BF16 ratio (>= 1)
#: before a row is flagged: the spread the build already treats as repeats that disagree
#: (pipeline/costmodel/profile/sources.py REPEAT_SPREAD).
FP8_NOISE = 2.0
#: A row this many times slower than a row of the same curve with more tokens is flagged.
MONOTONE_NOISE = 2.0
#: GEMMs are judged at model-sized shapes only (n and k at least this; profile/select.py's
#: MIN_GEMM_REACH): below, fixed costs dominate, the library switches kernels between sizes by
#: design (cuBLAS on L40S, n = 32, k = 8,192: 35 us at m = 2-7, 4.7 us from m = 8) and no model
#: layer falls there.
MIN_GEMM_NK = 1024

#: Per family: (the size axis, the key of one curve besides gpu/set/dtype/kernel).
CURVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemm": ("m", ("n", "k")),
    "moe": ("tokens", ("distribution", "h", "inter", "topk", "experts", "moe_tp", "moe_ep")),
}
#: Columns of the flagged-rows frame.
FLAG_COLUMNS = ("gpu", "set", "source", "family", "dtype", "kernel", "key", "size", "time_s", "rule", "reason")


def _medians(frame: pl.DataFrame, family: str) -> pl.DataFrame:
    """One row per measured key (repeats at their median); GEMMs of model-sized shapes only."""
    size, keys = CURVES[family]
    if family == "gemm":
        frame = frame.filter((pl.col("n") >= MIN_GEMM_NK) & (pl.col("k") >= MIN_GEMM_NK))
    cols = ["gpu", "set", "source", "dtype", "kernel", *keys, size]
    return frame.group_by(cols).agg(pl.col("time_s").median()).sort(cols)


def _key_text(row: dict[str, object], keys: Sequence[str]) -> str:
    return " ".join(f"{k}={row[k]}" for k in keys)


def fp8_slower(frame: pl.DataFrame, family: str) -> pl.DataFrame:
    """FP8 rows slower than the BF16 row at the same shape and size by more than FP8_NOISE x
    their table's median FP8/BF16 ratio (>= 1). Columns: FLAG_COLUMNS."""
    size, keys = CURVES[family]
    if frame.height == 0 or not {"bf16", "fp8"} <= set(frame["dtype"].unique().to_list()):
        return pl.DataFrame(schema=_flag_schema())
    med = _medians(frame.filter(pl.col("dtype").is_in(["bf16", "fp8"])), family)
    on = ["gpu", "set", *keys, size]
    bf = med.filter(pl.col("dtype") == "bf16").group_by(on).agg(pl.col("time_s").median().alias("bf16_s"))
    fp = med.filter(pl.col("dtype") == "fp8").join(bf, on=on, how="inner")
    if fp.height == 0:
        return pl.DataFrame(schema=_flag_schema())
    fp = fp.with_columns(ratio=pl.col("time_s") / pl.col("bf16_s"))
    typical = fp.group_by(["gpu", "set"]).agg(pl.col("ratio").median().alias("typical"))
    fp = fp.join(typical, on=["gpu", "set"]).with_columns(
        limit=FP8_NOISE * pl.max_horizontal(pl.col("typical"), pl.lit(1.0))
    )
    # in curve order (the joins and groupings above keep none): the build lists the first rows
    bad = fp.filter(pl.col("ratio") > pl.col("limit")).sort(["gpu", "set", "source", "dtype", "kernel", *keys, size])
    rows = [
        {
            "gpu": r["gpu"],
            "set": r["set"],
            "source": r["source"],
            "family": family,
            "dtype": r["dtype"],
            "kernel": r["kernel"],
            "key": _key_text(r, keys),
            "size": int(r[size]),
            "time_s": float(r["time_s"]),
            "rule": "fp8_slower_than_bf16",
            "reason": (
                f"fp8 {r['time_s'] * 1e6:.4g} us is {r['ratio']:.2f}x bf16's {r['bf16_s'] * 1e6:.4g} us at the same "
                f"shape and {size}={r[size]}, beyond {FP8_NOISE:g}x this table's median fp8/bf16 ratio "
                f"({r['typical']:.2f}x)"
            ),
        }
        for r in bad.iter_rows(named=True)
    ]
    return pl.DataFrame(rows, schema=_flag_schema()) if rows else pl.DataFrame(schema=_flag_schema())


def fp8_table_notes(frame: pl.DataFrame, family: str) -> list[str]:
    """One line per (GPU, set) whose FP8 rows are slower than BF16 at most shapes (median
    ratio above 1.5): a kernel property, kept, and said."""
    size, keys = CURVES[family]
    if frame.height == 0 or not {"bf16", "fp8"} <= set(frame["dtype"].unique().to_list()):
        return []
    med = _medians(frame.filter(pl.col("dtype").is_in(["bf16", "fp8"])), family)
    on = ["gpu", "set", *keys, size]
    bf = med.filter(pl.col("dtype") == "bf16").group_by(on).agg(pl.col("time_s").median().alias("bf16_s"))
    fp = med.filter(pl.col("dtype") == "fp8").join(bf, on=on, how="inner")
    if fp.height == 0:
        return []
    fp = fp.with_columns(ratio=pl.col("time_s") / pl.col("bf16_s"))
    out = []
    for (gpu, set_), part in fp.group_by(["gpu", "set"], maintain_order=True):
        m = float(np.median(part["ratio"].to_numpy()))
        if m > 1.5:
            kernels = ", ".join(sorted(set(part["kernel"].to_list())))
            slower = float(np.mean(part["ratio"].to_numpy() > 1))
            out.append(
                f"{gpu} {family} ({set_}): fp8 is slower than bf16 at {slower:.0%} of "
                f"{part.height:,} shared shapes (median {m:.2f}x): a property of the fp8 kernel measured ({kernels}), "
                "kept; rows beyond it are flagged"
            )
    return out


def non_monotone(frame: pl.DataFrame, family: str) -> pl.DataFrame:
    """Rows more than MONOTONE_NOISE x slower than a row of the same curve with more tokens (the
    smaller of the two sets that remove every such pair). Columns: FLAG_COLUMNS."""
    size, keys = CURVES[family]
    if frame.height == 0:
        return pl.DataFrame(schema=_flag_schema())
    med = _medians(frame, family)
    group = ["gpu", "set", "source", "dtype", "kernel", *keys]
    rows = []
    for _, part in med.group_by(group, maintain_order=True):
        t = part["time_s"].to_numpy()
        if t.size < 2:
            continue
        suffix_min = np.minimum.accumulate(t[::-1])[::-1]
        later = np.append(suffix_min[1:], np.inf)
        prefix_max = np.maximum.accumulate(t)
        earlier = np.insert(prefix_max[:-1], 0, 0.0)
        slow = np.flatnonzero(t > MONOTONE_NOISE * later)  # slower than a later (larger) row
        fast = np.flatnonzero(t * MONOTONE_NOISE < earlier)  # faster than an earlier (smaller) row
        if not slow.size:
            continue
        pick, what = (slow, "slower than") if slow.size <= fast.size else (fast, "faster than")
        sizes = part[size].to_numpy()
        for i in (int(x) for x in pick):
            r = part.row(i, named=True)
            j = i + 1 + int(np.argmin(t[i + 1 :])) if what == "slower than" else int(np.argmax(t[:i]))
            rows.append(
                {
                    "gpu": r["gpu"],
                    "set": r["set"],
                    "source": r["source"],
                    "family": family,
                    "dtype": r["dtype"],
                    "kernel": r["kernel"],
                    "key": _key_text(r, keys),
                    "size": int(sizes[i]),
                    "time_s": float(t[i]),
                    "rule": "non_monotone",
                    "reason": (
                        f"{t[i] * 1e6:.4g} us at {size}={int(sizes[i])} is {what} {t[j] * 1e6:.4g} us at "
                        f"{size}={int(sizes[j])} by more than {MONOTONE_NOISE:g}x"
                    ),
                }
            )
    return pl.DataFrame(rows, schema=_flag_schema()) if rows else pl.DataFrame(schema=_flag_schema())


def _flag_schema() -> dict[str, type[pl.DataType]]:
    return {
        "gpu": pl.Utf8,
        "set": pl.Utf8,
        "source": pl.Utf8,
        "family": pl.Utf8,
        "dtype": pl.Utf8,
        "kernel": pl.Utf8,
        "key": pl.Utf8,
        "size": pl.Int64,
        "time_s": pl.Float64,
        "rule": pl.Utf8,
        "reason": pl.Utf8,
    }


def implausible_rows(frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Every flagged row of ``frames`` (family -> rows as pipeline/costmodel/profile/sources.py
    reads them), both rules; a row flagged by both is listed once (its first rule)."""
    parts = []
    for family in CURVES:
        f = frames.get(family)
        if f is None or f.height == 0:
            continue
        parts += [fp8_slower(f, family), non_monotone(f, family)]
    parts = [p for p in parts if p.height]
    if not parts:
        return pl.DataFrame(schema=_flag_schema())
    out = pl.concat(parts)
    return out.unique(
        subset=["gpu", "set", "source", "family", "dtype", "kernel", "key", "size"], keep="first", maintain_order=True
    )


def drop_flagged(frame: pl.DataFrame, family: str, flagged: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (one family's rows) without the rows ``flagged`` names (every repeat of a key)."""
    if flagged.height == 0 or frame.height == 0:
        return frame
    size, keys = CURVES[family]
    fl = flagged.filter(pl.col("family") == family)
    if fl.height == 0:
        return frame
    key = pl.concat_str([pl.lit(f"{k}=") + pl.col(k).cast(pl.Utf8) for k in keys], separator=" ")
    tagged = frame.with_columns(__key=key)
    out = tagged.join(
        fl.select("gpu", "set", "source", "dtype", "kernel", pl.col("key").alias("__key"), pl.col("size").alias(size)),
        on=["gpu", "set", "source", "dtype", "kernel", "__key", size],
        how="anti",
    )
    return out.drop("__key")
