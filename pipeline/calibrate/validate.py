"""Validate the roofline model against measured GPUs, and calibrate its efficiency factors.

Measurement formats read (public sets: Vidur's profiling data, microsoft/vidur; Splitwise's
perf model, Patel et al. ISCA 2024):

- Vidur ``mlp.csv``: per-operator kernel times (ms) of one transformer layer on one TP shard,
  by ``num_tokens``; the model shape comes from the row's own columns (n_head, n_kv_head, n_embd,
  n_expanded_embd, vocab_size), the GPU from the folder name (``compute/<sku>/...``).
- Vidur ``all_reduce.csv``: NCCL all-reduce times (ms) by message size (bytes) and GPU count,
  GPU from the folder name (``network/<device>/...``). Rows spanning nodes are skipped.
- Splitwise ``perf_model.csv``: prompt (prefill) time and per-token decode time (ms) by model,
  hardware, TP, prompt size, batch size and output length.

Each set is predicted twice: with the catalog's factors as shipped ("catalog") and with factors
fitted by :func:`fit_factors` on the set's *train* split ("calibrated"). The hold-out split is
every other distinct shape (token count, message size, or Splitwise configuration), so the
error on it measures interpolation to shapes the fit never saw. Fits minimise soft-L1 of
log(predicted / measured) with scipy's least_squares.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.catalog import HardwareSpec, ModelSpec, list_hardware, load_hardware, load_model, model_from_hf_config
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.common.schemas import write_parquet
from pipeline.common.system import not_regular
from pipeline.costmodel.profile.sources import repeats_note
from pipeline.costmodel.roofline import (
    Deployment,
    Op,
    cost_from_ops,
    decode_batch,
    op_times,
    operators,
    prefill_batch,
)
from pipeline.costmodel.steps import FloatArray, StepBatch

#: Folder / column labels of the public measurement sets -> catalog hardware. Vidur's "a100" and
#: "h100" compute SKUs and the DGX network devices are 80 GB SXM parts (Vidur paper §6);
#: Splitwise profiled DGX-A100 (80 GB) and DGX-H100 (the "-pcap" rows are power-capped H100s).
HARDWARE_LABELS: dict[str, str] = {
    "a100": "a100-80gb-sxm",
    "h100": "h100-sxm",
    "a100_dgx": "a100-80gb-sxm",
    "h100_dgx": "h100-sxm",
    "a100-80gb": "a100-80gb-sxm",
    "h100-80gb": "h100-sxm",
    "h100-80gb-pcap": "h100-sxm",
}
#: Splitwise model labels -> catalog models (BLOOM-176B is not in the catalog: ALiBi, GELU MLP).
SPLITWISE_MODELS: dict[str, str] = {"llama2-70b": "llama-2-70b"}

#: Vidur operators compared one to one with the cost model's operators of the same name.
VIDUR_OPS: tuple[str, ...] = (
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_down_proj",
    "mlp_act",
    "input_layernorm",
    "post_attention_layernorm",
    "attn_rope",
    "add",
)
GEMM_OPS = frozenset({"attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"})
#: The targets of issue 4 apply from this many tokens up (small GEMMs are launch-latency bound).
MIN_TARGET_TOKENS = 128
TARGET_MEDIAN_ABS_ERROR = 0.15

#: Which factors each kind of measurement identifies, in the order of the parameter vector.
FIT_PARAMS: dict[str, tuple[str, ...]] = {
    "vidur_mlp": ("compute", "memory", "elementwise", "min_kernel"),
    "vidur_all_reduce": ("link", "latency"),
    "splitwise": ("compute", "memory", "link", "overhead"),
}
_BOUNDS: dict[str, tuple[float, float]] = {
    "compute": (0.02, 1.0),
    "memory": (0.02, 1.0),
    "elementwise": (0.02, 1.0),
    "link": (0.01, 1.0),
    "latency": (0.0, 1e-3),
    "min_kernel": (0.0, 1e-4),
    "overhead": (0.0, 0.2),
}


@dataclass(frozen=True)
class Group:
    """Rows of one measurement set on one GPU that share a prediction function."""

    set_name: str
    kind: str  # key of FIT_PARAMS
    source_file: str
    hardware_label: str
    hardware: HardwareSpec
    model: str
    tp: int
    item: list[str]
    tokens: np.ndarray
    batch_size: np.ndarray
    context: np.ndarray
    measured_s: FloatArray
    holdout: np.ndarray
    predict: Callable[[HardwareSpec], FloatArray]
    #: Vidur operator sets only: the operator behind each block of rows, in row order.
    ops: tuple[Op, ...] = ()
    #: True when no catalog GPU has ``hardware_label`` and the rows are taken as --hardware.
    assumed: bool = False


def _alternate(keys: np.ndarray) -> np.ndarray:
    """Hold out every other distinct key (sorted), so both splits span the whole range."""
    distinct = np.unique(keys)
    rank = np.searchsorted(distinct, keys)
    held: np.ndarray = (rank % 2) == 1
    return held


def _step_predictor(dep: Deployment, parts: list[tuple[list[Op], StepBatch]]) -> Callable[[HardwareSpec], FloatArray]:
    """Step times of precomputed operator sets under any hardware factors (overhead included)."""

    def predict(h: HardwareSpec) -> FloatArray:
        times = [cost_from_ops(dep, ops, b, hardware=h, overhead_s=h.step_overhead_s).time_s for ops, b in parts]
        return np.concatenate(times)

    return predict


def _op_predictor(chosen: list[Op]) -> Callable[[HardwareSpec], FloatArray]:
    """Single-instance times of the chosen operators under any hardware factors."""

    def predict(h: HardwareSpec) -> FloatArray:
        return np.concatenate([sum(op_times(h, o)) for o in chosen])

    return predict


#: Longest value of a measurement table echoed in a message (a 5000-digit cell is cut).
ECHO_CHARS = 40


def echo(value: object) -> str:
    """``repr(value)`` for a message, cut to :data:`ECHO_CHARS` characters and "…"."""
    text = repr(value)
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "…"


def label_hardware(label: str) -> str | None:
    """The catalog GPU a measurement label names (a public set's label in :data:`HARDWARE_LABELS`,
    or a catalog entry's own name), or None when no catalog GPU has that label."""
    name = HARDWARE_LABELS.get(label)
    if name is not None:
        return name
    return label if label in list_hardware() else None


def _hardware_for(label: str, override: str | None) -> tuple[HardwareSpec | None, bool]:
    """The GPU of rows labelled ``label`` and whether it was assumed: the catalog GPU the label
    names (even when ``override`` names another: :func:`select_hardware` leaves such rows out);
    else ``override`` (--hardware), assumed; else None."""
    name = label_hardware(label)
    if name is not None:
        return load_hardware(name), False
    if override:
        return load_hardware(override), True
    return None, False


#: A label no catalog GPU has, met without --hardware: (file, what the label is, the label).
Unlabelled = tuple[str, str, str]


def _no_hardware(
    skipped: list[str] | None, unknown: list[Unlabelled] | None, path: Path, what: str, label: str
) -> None:
    """Rows whose label no catalog GPU has, read without --hardware: into ``unknown`` (for
    :func:`load_groups` to word once it knows the whole set), else a note in ``skipped``."""
    if unknown is not None:
        unknown.append((str(path), what, label))
    elif skipped is not None:
        skipped.append(f"{path}: no catalog hardware for {what}{echo(label)}; pass --hardware")


#: Shape and count columns of a measurement table are whole numbers in [1, MAX_INT_CELL].
MAX_INT_CELL = 2**31 - 1
#: A measured time, in the table's unit (milliseconds in Vidur's and Splitwise's tables), is kept
#: between 1 ns and about 28 hours: outside that it is a unit mistake or a broken row, not a kernel.
MIN_TIME_CELL, MAX_TIME_CELL = 1e-6, 1e8


#: Splitwise prompt and output lengths and batch sizes are at most this (16.7 M): beyond any
#: context or batch a GPU serves; a larger count is a broken row (2,147,483,647 tokens "in 1 ms").
MAX_SPLITWISE_TOKENS = 2**24


def _read_csv(
    path: Path,
    required: Iterable[str],
    skipped: list[str] | None,
    ints: Iterable[str] = (),
    times: Iterable[str] = (),
    int_max: dict[str, int] | None = None,
) -> pl.DataFrame:
    """The table at ``path`` with ``ints`` as Int64 (whole numbers in [1, MAX_INT_CELL], or
    [1, ``int_max[col]``]) and ``times`` as Float64 (in [MIN_TIME_CELL, MAX_TIME_CELL]). A row with
    any other value in those columns is left out, and ``skipped`` says how many rows and the first
    one's line, field and value."""
    top = int_max or {}
    _refuse_duplicate_columns(path)
    lines: np.ndarray[Any, np.dtype[np.int64]] | None = None  # each row's line (None: row + 2)
    try:
        df = pl.read_csv(path, infer_schema_length=0)
    except pl.exceptions.PolarsError:  # a row of another width, bytes that are not UTF-8: row by row
        df, lines = _read_csv_rows(path, skipped)
    except OSError as exc:
        raise RooftraceError(f"{path}: cannot read CSV: {exc.strerror or exc}") from None
    else:
        if sum(df.null_count().row(0)):  # polars pads a short row with nulls: row by row, said as such
            df, lines = _read_csv_rows(path, skipped)
    missing = sorted(set(required) - set(df.columns))
    if missing:
        raise RooftraceError(f"{path}: missing column(s) {missing}")
    bad = np.zeros(df.height, dtype=bool)
    first_bad: tuple[int, str, object] | None = None
    typed: dict[str, pl.Series] = {}
    for col, whole in [(c, True) for c in ints] + [(c, False) for c in times]:
        raw = df.get_column(col)
        v = raw.cast(pl.Float64, strict=False).to_numpy().astype(np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(v) & (v > 0)
            if whole:
                ok &= (v == np.floor(v)) & (v <= top.get(col, MAX_INT_CELL))
            else:
                ok &= (v >= MIN_TIME_CELL) & (v <= MAX_TIME_CELL)
        rows = np.flatnonzero(~ok & ~bad)
        if rows.size and (first_bad is None or rows[0] < first_bad[0]):
            first_bad = (int(rows[0]), col, raw[int(rows[0])])
        bad |= ~ok
        clean = np.where(ok, v, 1.0)
        typed[col] = pl.Series(col, clean.astype(np.int64) if whole else clean)
    if typed:
        df = df.with_columns(list(typed.values()))
    if first_bad is not None:
        row, col, value = first_bad
        line = int(lines[row]) - 2 if lines is not None else row
        what = (
            f"a whole number in [1, {top.get(col, MAX_INT_CELL)}]"
            if col in set(ints)
            else f"a time in [{MIN_TIME_CELL:g}, {MAX_TIME_CELL:g}] (the table's unit, ms)"
        )
        if skipped is not None:
            skipped.append(
                f"{path}: {int(bad.sum())} row(s) left out, the first at line {line + 2}: {col} = {echo(value)} "
                f"is not {what}"
            )
        df = df.filter(pl.Series(~bad))
    return df


def _say_repeats(
    df: pl.DataFrame, keys: list[str], times: list[str], path: Path, skipped: list[str] | None, what: str
) -> None:
    """:func:`pipeline.costmodel.profile.sources.repeats_note` of a Vidur / Splitwise table, into ``skipped``."""
    if skipped is None:
        return
    note = repeats_note(df.sort(keys), keys, times, path, what, unit="ms")
    if note is not None:
        skipped.append(note)


def _refuse_duplicate_columns(path: Path) -> None:
    """A header that names a column twice is refused: which of the two holds the values is a guess."""
    import csv

    try:
        with path.open(encoding="utf-8-sig", errors="replace", newline="") as fh:
            header = next(csv.reader([fh.readline(1 << 20)]), [])
    except (OSError, csv.Error):
        return  # the read proper says what is wrong
    seen: dict[str, int] = {}
    for i, key in enumerate(header, start=1):
        if key in seen:
            raise RooftraceError(
                f"{path}: the header names column {echo(key)} twice (fields {seen[key]} and {i}); which one "
                "holds the values is unclear: rename or remove one"
            )
        seen[key] = i


def _read_csv_rows(path: Path, skipped: list[str] | None) -> tuple[pl.DataFrame, np.ndarray[Any, np.dtype[np.int64]]]:
    """The CSV at ``path`` read row by row, when polars cannot read it whole: the rows with as
    many fields as the header, as text, and each one's line; a row with more or fewer fields, or
    with bytes that are not UTF-8, is left out, and ``skipped`` says how many and the first."""
    import csv

    try:
        with path.open(encoding="utf-8", errors="replace", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if not header:
                raise RooftraceError(f"{path}: cannot read CSV: no header")
            rows: list[list[str]] = []
            lines: list[int] = []
            bad: list[tuple[int, str]] = []
            after = reader.line_num
            for row in reader:
                line, after = after + 1, reader.line_num
                if not row:
                    continue
                if len(row) != len(header):
                    bad.append((line, f"{len(row)} fields where the header has {len(header)}"))
                elif any("\ufffd" in cell for cell in row):
                    bad.append((line, "bytes that are not UTF-8"))
                else:
                    rows.append(row)
                    lines.append(line)
    except (OSError, csv.Error) as exc:
        raise RooftraceError(f"{path}: cannot read CSV: {exc}") from None
    if bad and skipped is not None:
        skipped.append(f"{path}: {len(bad)} row(s) left out, the first at line {bad[0][0]}: {bad[0][1]}")
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    df = pl.DataFrame(
        {name: pl.Series(name, list(col), dtype=pl.String) for name, col in zip(header, columns, strict=True)}
    )
    return df, np.asarray(lines, dtype=np.int64)


def detect_kind(path: Path) -> str:
    """Which measurement format a CSV is, from its columns."""
    try:
        with path.open("rb") as fh:
            raw = fh.readline(1 << 20)
    except OSError as exc:
        raise RooftraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        header = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RooftraceError(f"{path}: not UTF-8 text (byte {exc.start} of the header line)") from None
    if "time_stats.mlp_up_proj" in header:
        return "vidur_mlp"
    if "time_stats.all_reduce" in header:
        return "vidur_all_reduce"
    if "prompt_time" in header and "token_time" in header:
        return "splitwise"
    raise RooftraceError(
        f"{path}: not a Vidur mlp.csv / all_reduce.csv or Splitwise perf_model.csv (columns: {header[:120]!r})"
    )


def _vidur_model(row: dict[str, object], label: str) -> ModelSpec:
    gated = str(row["use_gated_mlp"]).lower() == "true"
    if not gated:
        raise RooftraceError(f"{label}: use_gated_mlp=False rows are not modelled (gated SwiGLU only)")
    cfg = {
        "hidden_size": int(str(row["n_embd"])),
        "num_hidden_layers": 1,
        "num_attention_heads": int(str(row["n_head"])),
        "num_key_value_heads": int(str(row["n_kv_head"])),
        "intermediate_size": int(str(row["n_expanded_embd"])),
        "vocab_size": int(str(row["vocab_size"])),
        "max_position_embeddings": 4096,
    }
    return model_from_hf_config(cfg, label)


def load_vidur_mlp(
    path: Path, hardware: str | None = None, skipped: list[str] | None = None, unknown: list[Unlabelled] | None = None
) -> list[Group]:
    shape_cols = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]
    op_cols = [f"time_stats.{op}.median" for op in VIDUR_OPS]
    int_cols = [*shape_cols[:-1], "num_tokens", "num_tensor_parallel_workers"]
    df = _read_csv(path, [*int_cols, "use_gated_mlp", *op_cols], skipped, ints=int_cols, times=op_cols)
    sku = path.parent.parent.parent.name if path.parent.parent.name == "meta-llama" else path.parent.parent.name
    hw, assumed = _hardware_for(sku, hardware)
    if hw is None:
        _no_hardware(skipped, unknown, path, "SKU ", sku)
        return []
    model_label = path.parent.name
    df = df.with_columns(pl.col("use_gated_mlp").cast(pl.Utf8))
    _say_repeats(df, [*shape_cols, "num_tensor_parallel_workers", "num_tokens"], op_cols, path, skipped, "shape")
    agg = df.group_by([*shape_cols, "num_tensor_parallel_workers", "num_tokens"]).agg(
        [pl.col(c).median() for c in op_cols]
    )
    groups: list[Group] = []
    for key, part in agg.sort("num_tokens").group_by([*shape_cols, "num_tensor_parallel_workers"], maintain_order=True):
        row = dict(zip([*shape_cols, "num_tensor_parallel_workers"], key, strict=True))
        tp = int(str(row["num_tensor_parallel_workers"]))
        try:
            spec = _vidur_model(row, model_label)
            dep = Deployment(spec, hw, tp=tp, weight_dtype="fp16", kv_dtype="fp16")
        except RooftraceError as exc:
            if skipped is not None:
                shape = ", ".join(f"{k}={echo(v)}" for k, v in row.items())
                skipped.append(f"{path}: rows with TP {tp} and shape {shape} are skipped: {exc}")
            continue
        tokens = part["num_tokens"].to_numpy().astype(np.float64)
        ops = {o.name: o for o in operators(dep, prefill_batch(tokens))}
        items, toks, meas = [], [], []
        for op, col in zip(VIDUR_OPS, op_cols, strict=True):
            items += [op] * len(tokens)
            toks.append(tokens)
            meas.append(part[col].to_numpy().astype(np.float64) / 1e3)
        tok = np.concatenate(toks)
        chosen = [ops[op] for op in VIDUR_OPS]

        predict = _op_predictor(chosen)

        groups.append(
            Group(
                set_name="vidur_mlp",
                kind="vidur_mlp",
                source_file=str(path),
                hardware_label=sku,
                hardware=hw,
                assumed=assumed,
                model=model_label,
                tp=tp,
                item=items,
                tokens=tok,
                batch_size=np.ones_like(tok),
                context=np.zeros_like(tok),
                measured_s=np.concatenate(meas),
                holdout=_alternate(tok),
                predict=predict,
                ops=tuple(chosen),
            )
        )
    return groups


def load_vidur_all_reduce(
    path: Path, hardware: str | None = None, skipped: list[str] | None = None, unknown: list[Unlabelled] | None = None
) -> list[Group]:
    cols = ["time_stats.all_reduce.median", "num_workers", "size", "devices_per_node"]
    df = _read_csv(path, cols, skipped, ints=cols[1:], times=cols[:1])
    device = path.parent.name
    hw, assumed = _hardware_for(device, hardware)
    if hw is None:
        _no_hardware(skipped, unknown, path, "network device ", device)
        return []
    # One node only: the intra-node link is what the catalog describes.
    df = df.filter(pl.col("num_workers") <= pl.col("devices_per_node"))
    _say_repeats(df, ["num_workers", "size"], cols[:1], path, skipped, "message size")
    agg = (
        df.group_by(["num_workers", "size"])
        .agg(pl.col("time_stats.all_reduce.median").median())
        .sort(["num_workers", "size"])
    )
    groups = []
    for (workers,), part in agg.group_by(["num_workers"], maintain_order=True):
        n = int(str(workers))
        size = part["size"].to_numpy().astype(np.float64)
        ring = 2.0 * (n - 1) / n

        def predict(h: HardwareSpec, size: FloatArray = size, ring: float = ring) -> FloatArray:
            return ring * size / (h.link_bandwidth_bytes_per_s * h.link_efficiency) + h.link_latency_s

        groups.append(
            Group(
                set_name="vidur_all_reduce",
                kind="vidur_all_reduce",
                source_file=str(path),
                hardware_label=device,
                hardware=hw,
                assumed=assumed,
                model="",
                tp=n,
                item=["all_reduce"] * len(size),
                tokens=size,
                batch_size=np.ones_like(size),
                context=np.zeros_like(size),
                measured_s=part["time_stats.all_reduce.median"].to_numpy().astype(np.float64) / 1e3,
                holdout=_alternate(size),
                predict=predict,
            )
        )
    return groups


def load_splitwise(
    path: Path, hardware: str | None = None, skipped: list[str] | None = None, unknown: list[Unlabelled] | None = None
) -> list[Group]:
    cols = ["model", "hardware", "prompt_size", "batch_size", "token_size", "prompt_time", "token_time",
            "tensor_parallel"]  # fmt: skip
    int_cols = ["prompt_size", "batch_size", "token_size", "tensor_parallel"]
    counts = {c: MAX_SPLITWISE_TOKENS for c in int_cols[:3]}
    df = _read_csv(path, cols, skipped, ints=int_cols, times=["prompt_time", "token_time"], int_max=counts)
    keys = ["model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size"]
    _say_repeats(df, keys, ["prompt_time", "token_time"], path, skipped, "configuration")
    agg = df.group_by(keys).agg(pl.col("prompt_time").median(), pl.col("token_time").median()).sort(keys)
    groups = []
    for (model_label, hw_label, tp_raw), part in agg.group_by(
        ["model", "hardware", "tensor_parallel"], maintain_order=True
    ):
        model_name = SPLITWISE_MODELS.get(str(model_label), str(model_label))
        try:
            spec = load_model(model_name)
        except ConfigError:
            if skipped is not None:
                skipped.append(f"{path}: model {echo(model_label)} has no catalog entry; its rows are skipped")
            continue
        hw, assumed = _hardware_for(str(hw_label), hardware)
        if hw is None:
            _no_hardware(skipped, unknown, path, "", str(hw_label))
            continue
        tp = int(str(tp_raw))
        try:
            dep = Deployment(spec, hw, tp=tp, weight_dtype="fp16", kv_dtype="fp16")
        except RooftraceError as exc:
            if skipped is not None:
                skipped.append(f"{path}: {model_label} rows with TP {tp} are skipped: {exc}")
            continue
        prompt = part["prompt_size"].to_numpy().astype(np.float64)
        batch = part["batch_size"].to_numpy().astype(np.float64)
        out_len = part["token_size"].to_numpy().astype(np.float64)
        # Decode: token_time averages one step over the whole output, whose context grows from
        # prompt to prompt + output; the mean context is prompt + output / 2.
        ctx = prompt + out_len / 2.0
        pre_b = prefill_batch(prompt, batch)
        dec_b = decode_batch(batch, ctx)
        pre_ops, dec_ops = operators(dep, pre_b), operators(dep, dec_b)

        predict = _step_predictor(dep, [(pre_ops, pre_b), (dec_ops, dec_b)])

        shape_key = prompt * 1e8 + batch * 1e4 + out_len
        hold = _alternate(shape_key)
        n = len(prompt)
        groups.append(
            Group(
                set_name="splitwise",
                kind="splitwise",
                source_file=str(path),
                hardware_label=str(hw_label),
                hardware=hw,
                assumed=assumed,
                model=model_name,
                tp=tp,
                item=["prefill"] * n + ["decode"] * n,
                tokens=np.concatenate([prompt, out_len]),
                batch_size=np.concatenate([batch, batch]),
                context=np.concatenate([np.zeros(n), ctx]),
                measured_s=np.concatenate([part["prompt_time"].to_numpy(), part["token_time"].to_numpy()]).astype(
                    np.float64
                )
                / 1e3,
                holdout=np.concatenate([hold, hold]),
                predict=predict,
            )
        )
    return groups


LOADERS: dict[str, Callable[[Path, str | None, list[str] | None, list[Unlabelled] | None], list[Group]]] = {
    "vidur_mlp": load_vidur_mlp,
    "vidur_all_reduce": load_vidur_all_reduce,
    "splitwise": load_splitwise,
}
_FILE_NAMES = {"mlp.csv", "all_reduce.csv", "perf_model.csv"}


class UnreadableMeasurements(RooftraceError):
    """A measurement file that cannot be read as one (a named pipe, a device): an error wherever
    the folder is searched, never the same as a folder without tables."""


#: The search for measurement files under --measurements stops (one error line) past this many
#: folders below it, or this many entries seen: the public sets are 10 deep and a few hundred
#: entries; ``--measurements /`` is not a folder of measurements.
MAX_WALK_DEPTH = 16
MAX_WALK_ENTRIES = 100_000


def _walk(root: Path) -> list[Path]:
    """Files named as measurement tables under ``root`` (links to folders not followed, as
    ``rglob``), bounded by :data:`MAX_WALK_DEPTH` and :data:`MAX_WALK_ENTRIES`."""
    found: list[Path] = []
    seen = 0
    stack: list[tuple[str, int]] = [(str(root), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue  # a folder that cannot be listed holds nothing rooftrace can read (as rglob)
        seen += len(entries)
        if seen > MAX_WALK_ENTRIES:
            raise UnreadableMeasurements(
                f"{root}: more than {MAX_WALK_ENTRIES:,} files and folders under it; not a folder of "
                "measurements: pass the folder that holds the measurement sets"
            )
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                if depth + 1 > MAX_WALK_DEPTH:
                    raise UnreadableMeasurements(
                        f"{root}: folders more than {MAX_WALK_DEPTH} deep under it (e.g. {entry.path}); not a "
                        "folder of measurements: pass the folder that holds the measurement sets"
                    )
                stack.append((entry.path, depth + 1))
            elif entry.name in _FILE_NAMES:
                found.append(Path(entry.path))
    return sorted(found)


#: The operator-profile sets ``calibrate`` / ``validate`` read from their parent folder
#: (pipeline/costmodel/profile/heldout.py ``has_profile_sets``), and a piece of one's tables.
PROFILE_SETS = ("aiconfigurator-vllm-ops", "llmservingsim-profiles")
#: Operator families of an AIConfigurator GPU folder (``<gpu>/<family>/vllm/<version>/``).
_AIC_FAMILIES = ("gemm", "comm", "attention", "moe")


def refuse_part_of_a_set(path: Path) -> None:
    """A folder inside an AIConfigurator / LLMServingSim set (one GPU's folder, one family's) is
    not read alone: one error line saying to pass the set's parent folder, with --hardware to
    pick one GPU. Nothing happens for any other path."""
    if not path.is_dir() or path.name in PROFILE_SETS:
        return
    here = path.resolve()
    inside = next((a for a in here.parents if a.name in PROFILE_SETS), None)
    if inside is not None:
        gpu = here.relative_to(inside).parts[0]
        raise RooftraceError(
            f"{path}: a folder inside the {inside.name} set (GPU folder {gpu!r}); a set is read whole: pass "
            f"its parent folder (--measurements {inside.parent}) and --hardware to pick one GPU"
        )

    # a copy under another name: one GPU's folder (<family>/vllm/) or one family's (vllm/)
    def family(folder: Path) -> bool:
        return next(iter(folder.glob("vllm/*/*_perf.parquet")), None) is not None

    if family(path) or any(family(path / f) for f in _AIC_FAMILIES):
        raise RooftraceError(
            f"{path}: looks like one GPU's folder of an AIConfigurator set, which is read whole: pass the "
            f"folder that holds {PROFILE_SETS[0]}/<gpu>/ (and --hardware to pick one GPU)"
        )


def discover(measurements: Path) -> list[Path]:
    """Measurement files under a folder (or the one file given), in a stable order."""
    if measurements.is_file():
        return [measurements]
    if not measurements.is_dir():
        why = not_regular(measurements) if measurements.exists() else None
        raise RooftraceError(f"{measurements}: {why + ', not a regular file' if why else 'no such file or folder'}")
    files = _walk(measurements)
    for p in files:
        why = not_regular(p)
        if why is not None:  # a named pipe would block the read forever
            raise UnreadableMeasurements(f"{p}: {why}, not a regular file; measurement tables are read from files")
    if not files:
        raise RooftraceError(f"{measurements}: no mlp.csv, all_reduce.csv or perf_model.csv found")
    return files


def load_groups(paths: Iterable[Path], hardware: str | None = None) -> tuple[list[Group], list[str]]:
    """Every table's rows as groups, and what was left out (one note per cause). A row's GPU is
    the catalog GPU its label names; rows whose label no catalog GPU has are taken as
    ``hardware`` (``Group.assumed``), or left out without it. Pass the groups through
    :func:`select_hardware` to keep one GPU's."""
    skipped: list[str] = []
    groups: list[Group] = []
    unknown: list[Unlabelled] = []
    for path in paths:
        groups += LOADERS[detect_kind(path)](path, hardware, skipped, unknown)
    known = sorted({g.hardware.name for g in groups if not g.assumed})
    for source, what, label in unknown:
        if known:  # --hardware would pick among the known GPUs, never name these rows
            skipped.append(
                f"{source}: rows labelled {echo(label)} are skipped: no catalog GPU has that label, and the "
                f"measurements hold rows of known GPUs ({', '.join(known)}); to take them as one GPU, pass "
                "their table alone with --hardware"
            )
        else:
            skipped.append(f"{source}: no catalog hardware for {what}{echo(label)}; pass --hardware")
    return groups, list(dict.fromkeys(skipped))


def select_hardware(
    groups: list[Group], hardware: str, measurements: Path, skipped: list[str], notes: list[str], command: str
) -> list[Group]:
    """The groups of ``hardware`` (--hardware) for ``command`` ("calibrate", "validate").

    Rows labelled with a catalog GPU are that GPU's and never another's: the other GPUs' rows are
    left out (said in ``skipped``), and measurements that hold known GPUs' rows but none of
    ``hardware``'s are one error line naming the GPUs they hold. Rows whose label no catalog GPU
    has are taken as ``hardware`` only in measurements without known GPUs' rows (said once per
    label in ``notes``); beside known GPUs' rows they are left out."""
    base = load_hardware(hardware)
    known = [g for g in groups if not g.assumed]
    mine = [g for g in known if g.hardware.name == base.name]
    if known and not mine:
        held: dict[str, list[str]] = {}
        for g in known:
            labels = held.setdefault(g.hardware.name, [])
            if g.hardware_label not in labels:
                labels.append(g.hardware_label)
        gpus = [f"{n} (labelled {', '.join(echo(x) for x in labels)})" for n, labels in sorted(held.items())]
        listed = ", ".join(gpus[:-1]) + " and " + gpus[-1] if len(gpus) > 1 else gpus[0]
        also = " or all of them (no --hardware)" if command == "validate" else ""
        raise RooftraceError(
            f"{measurements}: holds no rows of {base.name}, only of {listed}; one GPU's rows are never taken "
            f"as another's: {command} one of those (--hardware {min(held)}){also}, or pass a table of "
            f"{base.name}'s own rows"
        )
    if not known:  # a user's own table, every label unknown: all its rows are this GPU's
        for g in groups:
            notes.append(
                f"{g.source_file}: {g.kind} rows labelled {echo(g.hardware_label)} are taken as {base.name} "
                "(--hardware): no catalog GPU has that label"
            )
        return groups
    names = ", ".join(sorted({g.hardware.name for g in known}))
    doing = "calibrating" if command == "calibrate" else "validating"
    for g in groups:
        if g.assumed:
            skipped.append(
                f"{g.source_file}: {g.kind} rows labelled {echo(g.hardware_label)} are left out: no catalog GPU "
                f"has that label and the measurements hold rows of known GPUs ({names}), so --hardware picks "
                f"{base.name}'s rows among those; to take them as {base.name}, pass their table alone"
            )
        elif g.hardware.name != base.name:
            skipped.append(
                f"{g.source_file}: {g.kind} rows for {echo(g.hardware_label)} ({g.hardware.name}) are not used: "
                f"{doing} {base.name}"
            )
    return mine


# --------------------------------------------------------------------------------------------
# calibration


def with_params(hw: HardwareSpec, names: tuple[str, ...], values: Iterable[float]) -> HardwareSpec:
    fields = {
        "compute": "compute_efficiency",
        "memory": "memory_efficiency",
        "elementwise": "elementwise_efficiency",
        "link": "link_efficiency",
        "latency": "link_latency_s",
        "min_kernel": "min_kernel_s",
        "overhead": "step_overhead_s",
    }
    changes: dict[str, Any] = {fields[n]: float(v) for n, v in zip(names, values, strict=True)}
    return replace(hw, **changes)


def _current(hw: HardwareSpec, name: str) -> float:
    return {
        "compute": hw.compute_efficiency,
        "memory": hw.memory_efficiency,
        "elementwise": hw.elementwise_efficiency,
        "link": hw.link_efficiency,
        "latency": hw.link_latency_s,
        "min_kernel": hw.min_kernel_s,
        "overhead": hw.step_overhead_s,
    }[name]


def fit_rows(group: Group) -> np.ndarray:
    """Rows a fit may use: the train split (every token count; the kernel floor explains the
    small ones)."""
    return ~group.holdout


@dataclass(frozen=True)
class Calibration:
    kind: str
    hardware: str
    params: dict[str, float]
    n_train: int
    n_holdout: int
    files: tuple[str, ...]
    description: str
    #: Every factor the rows determine sits at a bound of its range: the fit failed (rows that do
    #: not behave like this GPU, or times in another unit); :attr:`pinned` says which bound each
    #: one hit (a factor the rows do not move, as the link at TP 1, is neither).
    at_bounds: bool = False
    pinned: tuple[str, ...] = ()


#: A fitted factor within this share of its range's width of a bound sits at that bound.
AT_BOUND = 1e-5


def _pinned(
    names: tuple[str, ...], x: FloatArray, lo: FloatArray, hi: FloatArray, jac: FloatArray
) -> tuple[tuple[str, ...], bool]:
    """``name=value (min)`` / ``(max)`` for each factor the rows determine (a Jacobian column
    that is not zero) at a bound of its range, and whether that is every such factor."""
    norms = np.linalg.norm(np.asarray(jac, dtype=np.float64), axis=0) if np.size(jac) else np.zeros(len(names))
    moved = norms > 1e-12 * max(float(norms.max(initial=0.0)), 1e-300)
    out = []
    for n, v, a, b, m in zip(names, x, lo, hi, moved, strict=True):
        tol = AT_BOUND * (b - a)
        if m and (v - a <= tol or b - v <= tol):
            out.append(f"{n}={float(v):.4g} ({'min' if v - a <= tol else 'max'})")
    return tuple(out), bool(moved.any()) and len(out) == int(moved.sum())


def failed_fit(cal: Calibration) -> str:
    """One line saying that ``cal`` failed because every factor it determines sits at a bound."""
    return (
        f"the {cal.kind} fit for {cal.hardware} failed: every factor sits at a bound of its range "
        f"({', '.join(cal.pinned)}): these rows do not behave like {cal.hardware}'s "
        "(another GPU's rows, or times in another unit)"
    )


def fit_factors(groups: list[Group], kind: str, base: HardwareSpec) -> tuple[HardwareSpec, Calibration]:
    """Least-squares fit of the factors ``FIT_PARAMS[kind]`` on the train rows of ``groups``."""
    from scipy.optimize import least_squares

    names = FIT_PARAMS[kind]
    chosen = [g for g in groups if g.kind == kind]
    if not chosen:
        raise RooftraceError(f"no {kind} rows for hardware {base.name}")
    lo = np.array([_BOUNDS[n][0] for n in names])
    hi = np.array([_BOUNDS[n][1] for n in names])
    x0 = np.clip(np.array([_current(base, n) for n in names]), lo + 1e-9, hi - 1e-9)
    tiny = ("latency", "overhead", "min_kernel")
    scale = np.maximum(np.abs(x0), np.array([1e-5 if n in tiny else 0.1 for n in names]))
    masks = [fit_rows(g) for g in chosen]

    def residuals(x: FloatArray) -> FloatArray:
        hw = with_params(base, names, x)
        parts = [np.log(g.predict(hw)[m] / g.measured_s[m]) for g, m in zip(chosen, masks, strict=True)]
        return np.concatenate(parts)

    result = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, x_scale=scale)
    fitted = with_params(base, names, result.x)
    n_train = int(sum(int(m.sum()) for m in masks))
    n_hold = int(sum(int(g.holdout.sum()) for g in chosen))
    files = tuple(sorted({g.source_file for g in chosen}))
    params = {n: float(v) for n, v in zip(names, result.x, strict=True)}
    split = {
        "vidur_mlp": "distinct num_tokens at even rank",
        "vidur_all_reduce": "distinct message sizes at even rank",
        "splitwise": "distinct (prompt, batch, output) configurations at even rank",
    }[kind]
    description = (
        f"{', '.join(names)} fitted by least squares (soft-L1 on log ratio) to {n_train} {kind} rows "
        f"({split}) of {', '.join(Path(f).as_posix() for f in files)}; {n_hold} alternate rows held out"
    )
    pinned, at_bounds = _pinned(names, result.x, lo, hi, result.jac)
    if at_bounds:
        description += "; FIT FAILED: every factor at a bound of its range"
    return fitted, Calibration(kind, base.name, params, n_train, n_hold, files, description, at_bounds, pinned)


# --------------------------------------------------------------------------------------------
# validation report


@dataclass(frozen=True)
class ValidationReport:
    errors: pl.DataFrame
    summary: pl.DataFrame
    calibrations: list[Calibration]
    skipped: list[str]
    #: What was used as something it does not say it is (rows taken as --hardware), one per cause.
    notes: list[str] = field(default_factory=list)


def _error_rows(group: Group, hw: HardwareSpec, parameters: str) -> pl.DataFrame:
    pred = group.predict(hw)
    return pl.DataFrame(
        {
            "set": [group.set_name] * len(pred),
            "source_file": [group.source_file] * len(pred),
            "hardware_label": [group.hardware_label] * len(pred),
            "hardware": [group.hardware.name] * len(pred),
            "model": [group.model] * len(pred),
            "tp": np.full(len(pred), group.tp, dtype=np.int64),
            "item": group.item,
            "tokens": group.tokens.astype(np.int64),
            "batch_size": group.batch_size.astype(np.int64),
            "context_tokens": group.context.astype(np.float64),
            "measured_s": group.measured_s,
            "predicted_s": pred,
            "error": pred / group.measured_s - 1.0,
            "split": np.where(group.holdout, "holdout", "train"),
            "parameters": [parameters] * len(pred),
        }
    )


def _subset(errors: pl.DataFrame) -> pl.DataFrame:
    """Label each row with the subset its target is stated for."""
    gemm = pl.col("item").is_in(list(GEMM_OPS))
    big = pl.col("tokens") >= MIN_TARGET_TOKENS
    return errors.with_columns(
        pl.when(pl.col("set") == "vidur_mlp")
        .then(
            pl.when(big)
            .then(pl.when(gemm).then(pl.lit("gemm, tokens>=128")).otherwise(pl.lit("elementwise, tokens>=128")))
            .otherwise(pl.lit("all ops, tokens<128"))
        )
        .when(pl.col("set") == "splitwise")
        .then(pl.col("item"))
        .otherwise(pl.lit("all"))
        .alias("subset")
    )


def summarise(errors: pl.DataFrame) -> pl.DataFrame:
    """N, median / p90 / max absolute relative error per set, hardware, parameters, split, subset."""
    e = _subset(errors).with_columns(pl.col("error").abs().alias("abs_error"))
    vidur_all = e.filter((pl.col("set") == "vidur_mlp") & (pl.col("tokens") >= MIN_TARGET_TOKENS)).with_columns(
        pl.lit("all ops, tokens>=128").alias("subset")
    )
    e = pl.concat([e, vidur_all])
    both = e.with_columns(pl.lit("all").alias("split"))
    full = pl.concat([e, both])
    out = (
        full.group_by(["set", "hardware", "parameters", "subset", "split"])
        .agg(
            pl.len().cast(pl.Int64).alias("n"),
            pl.col("abs_error").median().alias("median_abs_error"),
            pl.col("abs_error").quantile(0.9, interpolation="linear").alias("p90_abs_error"),
            pl.col("abs_error").max().alias("max_abs_error"),
            pl.col("error").median().alias("median_error"),
        )
        .sort(["set", "subset", "hardware", "parameters", "split"])
    )
    return out


def run_validation(measurements: Path, hardware: str | None = None) -> ValidationReport:
    """Predict every measurement with the catalog's factors and with factors fitted per set and
    GPU on the train split; return per-row errors and the summary table."""
    groups, skipped = load_groups(discover(measurements), hardware)
    notes: list[str] = []
    if hardware:
        groups = select_hardware(groups, hardware, measurements, skipped, notes, "validate")
    skipped = list(dict.fromkeys(skipped))
    if not groups:
        why = f" ({'; '.join(skipped)})" if skipped else ": the tables hold no data rows"
        raise RooftraceError(f"{measurements}: no rows rooftrace can model{why}")
    frames = [_error_rows(g, g.hardware, "catalog") for g in groups]
    calibrations: list[Calibration] = []
    keys = sorted({(g.kind, g.hardware.name) for g in groups})
    for kind, hw_name in keys:
        members = [g for g in groups if g.kind == kind and g.hardware.name == hw_name]
        fitted, cal = fit_factors(members, kind, members[0].hardware)
        calibrations.append(cal)
        frames += [_error_rows(g, fitted, "calibrated") for g in members]
    errors = pl.concat(frames)
    return ValidationReport(errors, summarise(errors), calibrations, skipped, list(dict.fromkeys(notes)))


def store_report(report: ValidationReport, out_dir: Path) -> list[Path]:
    """Write errors and summary as Parquet (schemas validation_errors / validation_summary)."""
    paths = [
        write_parquet(report.errors.to_arrow(), out_dir / "errors.parquet", "validation_errors"),
        write_parquet(report.summary.to_arrow(), out_dir / "summary.parquet", "validation_summary"),
    ]
    cal = pl.DataFrame(
        {
            "kind": [c.kind for c in report.calibrations],
            "hardware": [c.hardware for c in report.calibrations],
            "params": [", ".join(f"{k}={v:.6g}" for k, v in c.params.items()) for c in report.calibrations],
            "n_train": [c.n_train for c in report.calibrations],
            "n_holdout": [c.n_holdout for c in report.calibrations],
            "description": [c.description for c in report.calibrations],
        },
        schema={
            "kind": pl.Utf8,
            "hardware": pl.Utf8,
            "params": pl.Utf8,
            "n_train": pl.Int64,
            "n_holdout": pl.Int64,
            "description": pl.Utf8,
        },
    )
    paths.append(write_parquet(pa.table(cal.to_arrow()), out_dir / "calibrations.parquet", "validation_calibrations"))
    return paths


# --------------------------------------------------------------------------------------------
# derivations behind the catalog's default factors (docs/validation.md, benchmarks/)

#: A GEMM streaming at least this many weight bytes at a handful of tokens is HBM-bound and long
#: enough (>20 µs on H100) that launch latency does not distort its achieved bandwidth.
STREAMING_MIN_BYTES = 64 * 2**20
STREAMING_MAX_TOKENS = 64


def weight_streaming_efficiency(groups: list[Group]) -> tuple[float, int]:
    """Median achieved / peak HBM bandwidth of Vidur GEMMs in the decode regime (train split).

    Decode steps stream weights at small batch; the Vidur fit over all token counts pulls the
    memory factor down to absorb GEMM tile quantisation at 128-512 tokens, which would make
    decode look slower than vLLM measures it. This median is what the catalog ships instead.
    """
    ratios: list[float] = []
    for g in groups:
        if g.kind != "vidur_mlp":
            continue
        ideal = replace(
            g.hardware,
            compute_efficiency=1.0,
            memory_efficiency=1.0,
            elementwise_efficiency=1.0,
            min_kernel_s=0.0,
        )
        pred = g.predict(ideal)
        for i, (item, tokens) in enumerate(zip(g.item, g.tokens, strict=True)):
            streamed = pred[i] * g.hardware.memory_bandwidth_bytes_per_s
            if (
                item in GEMM_OPS
                and tokens <= STREAMING_MAX_TOKENS
                and streamed >= STREAMING_MIN_BYTES
                and not g.holdout[i]
            ):
                ratios.append(float(pred[i] / g.measured_s[i]))
    if not ratios:
        raise RooftraceError("no Vidur GEMM rows in the weight-streaming regime")
    return float(np.median(ratios)), len(ratios)


@dataclass(frozen=True)
class KernelScales:
    """Elementwise kernel classes fitted per GPU, and their hardware-independent relative scales."""

    #: per hardware name: class -> fitted share of HBM bandwidth, plus "min_kernel" (seconds)
    per_hardware: dict[str, dict[str, float]]
    #: class -> geometric mean over GPUs of (class efficiency / reference class efficiency)
    scales: dict[str, float]
    n_train: dict[str, int]


#: Reference class of the ``elementwise`` factor: the gated activation, the largest elementwise
#: kernel of a layer by bytes (3 × intermediate values per token).
REFERENCE_KERNEL = "act"


def _fit_kernel_classes(base: HardwareSpec, rows: list[tuple[Op, np.ndarray, FloatArray]]) -> dict[str, float]:
    """Least-squares HBM share per elementwise kernel class plus the kernel floor, on the rows'
    masks (soft-L1 on log(predicted / measured), as fit_factors)."""
    from scipy.optimize import least_squares

    classes = sorted({op.kernel for op, _, _ in rows})
    names = [*classes, "min_kernel"]

    def residuals(x: FloatArray) -> FloatArray:
        hw = replace(base, elementwise_efficiency=1.0, min_kernel_s=float(x[-1]))
        scales = {c: float(v) for c, v in zip(classes, x[:-1], strict=True)}
        parts = []
        for op, m, meas in rows:
            t_c, t_m, t_f = op_times(hw, op, scales)
            parts.append(np.log((t_c + t_m + t_f)[m] / meas[m]))
        return np.concatenate(parts)

    lo = np.array([_BOUNDS["elementwise"][0]] * len(classes) + [_BOUNDS["min_kernel"][0]])
    hi = np.array([_BOUNDS["elementwise"][1]] * len(classes) + [_BOUNDS["min_kernel"][1]])
    x0 = np.clip(np.array([0.5] * len(classes) + [base.min_kernel_s]), lo + 1e-9, hi - 1e-9)
    scale = np.array([0.1] * len(classes) + [1e-5])
    result = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, x_scale=scale)
    return {n: float(v) for n, v in zip(names, result.x, strict=True)}


def fit_elementwise_kernels(groups: list[Group]) -> KernelScales:
    """Per GPU, fit one HBM-bandwidth share per elementwise kernel class (and the kernel floor)
    on the TRAIN split of the Vidur operator rows; the relative scales are each class's share
    divided by the reference class's share, geometric mean over GPUs."""
    per_hw: dict[str, dict[str, float]] = {}
    n_train: dict[str, int] = {}
    vidur = [g for g in groups if g.kind == "vidur_mlp"]
    for hw_name in sorted({g.hardware.name for g in vidur}):
        mine = [g for g in vidur if g.hardware.name == hw_name]
        rows: list[tuple[Op, np.ndarray, FloatArray]] = []  # (op, train mask, measured)
        for g in mine:
            n = len(g.tokens) // len(g.ops)
            for k, op in enumerate(g.ops):
                block = slice(k * n, (k + 1) * n)
                if op.kind == "elementwise":
                    rows.append((op, ~g.holdout[block], g.measured_s[block]))
        per_hw[hw_name] = _fit_kernel_classes(mine[0].hardware, rows)
        n_train[hw_name] = int(sum(int(m.sum()) for _, m, _ in rows))
    if not per_hw:
        raise RooftraceError("no Vidur operator rows to fit elementwise kernels on")
    classes = sorted(set.intersection(*(set(v) - {"min_kernel"} for v in per_hw.values())))
    scales = {c: float(np.exp(np.mean([np.log(v[c] / v[REFERENCE_KERNEL]) for v in per_hw.values()]))) for c in classes}
    return KernelScales(per_hw, scales, n_train)


def overhead_from_latency_run(dep: Deployment, batch_size: int, input_len: int, output_len: int, e2e_s: float) -> float:
    """Per-step host overhead that makes a fixed-batch latency run (1 prefill step, then
    output_len − 1 decode steps) take ``e2e_s``, with the deployment's other factors fixed."""
    no_overhead = replace(dep, step_overhead_s=0.0)
    pre = no_overhead.cost(prefill_batch(np.array([float(input_len)]), float(batch_size))).time_s.sum()
    ctx = input_len + np.arange(1, output_len, dtype=np.float64)
    dec = no_overhead.cost(decode_batch(float(batch_size), ctx)).time_s.sum()
    return float((e2e_s - pre - dec) / output_len)


def implausible_measurements(source: Path, hardware: str | None = None) -> tuple[pl.DataFrame, list[str]]:
    """The rows of the operator sets under ``source`` that pipeline/costmodel/profile/plausible.py
    flags (FP8 slower than BF16 beyond its table's pattern, non-monotone in tokens beyond noise),
    among the rows a profile would keep (profile/select.py), with the reason for each; and one
    line per table whose FP8 kernel is slower than BF16 throughout (kept, said). The profile
    build leaves the flagged rows out (profile.toml ``[implausible]``)."""
    from pipeline.costmodel.profile.plausible import fp8_table_notes, implausible_rows  # lazy: --measurements only
    from pipeline.costmodel.profile.select import select_rows  # lazy: --measurements only
    from pipeline.costmodel.profile.sources import read_measurements  # lazy: --measurements only

    meas = read_measurements(source)
    parts: list[pl.DataFrame] = []
    notes: list[str] = []
    for gpu in meas.gpus:
        if hardware is not None and gpu != hardware:
            continue
        frames, _ = select_rows(meas, gpu)
        flagged = implausible_rows(frames)
        if flagged.height:
            parts.append(flagged)
        for fam in ("gemm", "moe"):
            notes += fp8_table_notes(frames.get(fam, pl.DataFrame()), fam)
    return (pl.concat(parts) if parts else implausible_rows({})), notes
