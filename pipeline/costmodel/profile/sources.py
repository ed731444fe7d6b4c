"""Readers of the public operator-measurement sets, into one normalised frame per operator family.

Two layouts are read (times are converted to seconds):

- **AIConfigurator** (``<gpu>/<family>/vllm/<version>/*.parquet`` and ``<gpu>/comm/nccl/<v>/``):
  vLLM's GEMMs by m × n × k and dtype, prefill ("context") and decode ("generation") attention by
  batch × length × head shape, vLLM's custom all-reduce (CUDA-graph and eager) and NCCL
  collectives by bytes × GPUs, fused MoE by tokens × expert shape. ``latency`` is in ms.
- **LLMServingSim** bundles (``<hardware>/<org>/<model>/<variant>/tp<N>/*.csv``): one decoder
  layer's operators of one model measured under vLLM (eager), times in µs. The GEMM operators are
  turned into GEMM rows with the model's shapes per TP shard; pure-decode and pure-prefill
  attention rows into attention rows; mixed batches and per-sequence operators are kept as they are.

Where a family has several vLLM versions the newest version folder that has the table is read
(the one the profile describes; an empty newer folder never hides it); for NCCL the newest NCCL
version. Every row keeps ``source`` (its file, relative to the root given) so a profile can say
which rows it was built and judged on.

Every table's rows are checked as they are read (:func:`_checked`): cells are cast leniently, and
a row whose time is not a finite time in (0, :data:`MAX_KERNEL_S`] s, whose sizes are not whole
numbers within their bounds (:data:`MAX_SIZE`, :data:`MAX_MESSAGE_ELEMENTS`) or whose labels are
missing is left out; ``Measurements.skipped`` says how many, why and where the first is, per
file. A table with no row left is skipped (said). Repeated measurements of one key are kept (every
lookup takes their median, pipeline/costmodel/profile/interp.py ``Curve.of``); keys whose repeats differ by
more than :data:`REPEAT_SPREAD` are said in ``Measurements.notes``.

Frames (columns; ``time_s`` always seconds):

==============  ==========================================================================
gemm            gpu, set, source, dtype, kernel, m, n, k, time_s
attn_decode     gpu, set, source, kv_dtype, kernel, nq, nkv, d, batch, ctx, time_s
attn_prefill    gpu, set, source, kv_dtype, kernel, nq, nkv, d, batch, isl, time_s
allreduce       gpu, set, source, backend, gpus, bytes, time_s
moe             gpu, set, source, dtype, kernel, distribution, h, inter, topk, experts,
                moe_tp, moe_ep, tokens, time_s
model_ops       gpu, set, source, model, tp, op, size, time_s      (LLMServingSim: dense ops by
                tokens, lm_head/sampler by sequences)
attn_mixed      gpu, set, source, model, tp, nq, nkv, d, chunk, kv_prefill, n_decode,
                kv_decode, time_s                                   (LLMServingSim attention.csv)
moe_touched     gpu, set, source, model, tp, tokens, experts_touched, time_s
==============  ==========================================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline.catalog import ModelSpec, load_hardware, load_model
from pipeline.catalog.entries import weight_format
from pipeline.common.errors import ConfigError

AICONFIGURATOR_GPUS: dict[str, str] = {
    # folder -> catalog hardware. The RTX PRO 6000 measured is the Blackwell Server Edition:
    # the same GB202 chip, 96 GB GDDR7 and 1.79 TB/s as the catalog's rtx-pro-6000 entry.
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "a100_sxm": "a100-80gb-sxm",
    "l40s": "l40s",
    "rtx_pro_6000_server": "rtx-pro-6000",
}
LLMSERVINGSIM_GPUS: dict[str, str] = {"RTXPRO6000": "rtx-pro-6000", "RTX4090": "rtx-4090"}
LLMSERVINGSIM_MODELS: dict[str, str] = {
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b",
}
#: AIConfigurator dtype labels -> catalog format names (pipeline/catalog/dtypes.toml).
DTYPES: dict[str, str] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "fp8_block": "fp8-block",
    "nvfp4": "nvfp4",
    "w4a16_mxfp4": "mxfp4",
    "int4_wo": "int4",
}

FAMILIES = ("gemm", "attn_decode", "attn_prefill", "allreduce", "moe", "model_ops", "attn_mixed", "moe_touched")


@dataclass
class Measurements:
    """Every family's rows, plus what was skipped and why."""

    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    #: What was read but deserves a word (repeated measurements of one key that disagree).
    notes: list[str] = field(default_factory=list)
    #: Per catalog GPU, the skipped rows and notes of its own files (written to its profile.toml).
    gpu_notes: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, gpu: str | None, note: str) -> None:
        """Say that rows (or a table, or a folder) were left out, and why."""
        self.skipped.append(note)
        if gpu is not None:
            self.gpu_notes.setdefault(gpu, []).append(note)

    def note(self, gpu: str, note: str) -> None:
        """Say something about rows that were kept."""
        self.notes.append(note)
        self.gpu_notes.setdefault(gpu, []).append(note)

    def get(self, family: str) -> pl.DataFrame:
        return self.frames.get(family, pl.DataFrame())

    def add(self, family: str, frame: pl.DataFrame) -> None:
        if frame.height == 0:
            return
        old = self.frames.get(family)
        self.frames[family] = frame if old is None else pl.concat([old, frame], how="diagonal_relaxed")

    def for_gpu(self, gpu: str) -> Measurements:
        out = Measurements(skipped=list(self.skipped), files=list(self.files), notes=list(self.notes))
        out.gpu_notes = {gpu: list(self.gpu_notes.get(gpu, []))}
        for fam, frame in self.frames.items():
            sub = frame.filter(pl.col("gpu") == gpu)
            if sub.height:
                out.frames[fam] = sub
        return out

    @property
    def gpus(self) -> list[str]:
        names: set[str] = set()
        for frame in self.frames.values():
            names.update(frame["gpu"].unique().to_list())
        return sorted(names)


#: Bytes per element of AIConfigurator's all-reduce tables: their ``message_size`` counts elements
#: of the 16-bit tensor all-reduced, not bytes (its collector, ``collect_all_reduce.py``, builds
#: ``torch.ones(size)`` in bfloat16 and logs ``message_size = size``; ``collect_nccl.py`` logs
#: ``size // bytes_per_element``). Read as bytes, the tables give H100 x8 NCCL ~235 GB/s of bus
#: bandwidth at its largest 16-bit row (512 MiB of elements); as elements ~445 GB/s, what NVLink 4
#: delivers.
AR_ELEMENT_BYTES = 2


#: The NCCL collectives read from AIConfigurator's ``nccl_perf.parquet`` (its ``op_name``) and the
#: backend label each gets in a profile's collective table. Their ``message_size`` is the whole
#: tensor in 16-bit elements: nccl-tests' ``-b`` count, which for all_gather is the gathered
#: output (each rank sends a 1/n share) and for reduce_scatter the input (each rank keeps 1/n).
#: vLLM's default expert-parallel all-to-all (``allgather_reducescatter``) is one of each.
NCCL_BACKENDS = {"all_reduce": "nccl", "all_gather": "nccl_all_gather", "reduce_scatter": "nccl_reduce_scatter"}


#: Sizes and counts of a measured row (m, n, k, tokens, batch, context, heads, GPUs, experts, top-k,
#: TP / EP sizes) are whole numbers in [1, MAX_SIZE] (a few columns may be 0, e.g. a decode-free
#: mixed batch); beyond that a row is broken, not a kernel.
MAX_SIZE = 2**31
#: AIConfigurator all-reduce message sizes (16-bit elements) are at most this many: 2 TiB of bf16,
#: beyond any collective, and twice it (the bytes) stays far inside int64.
MAX_MESSAGE_ELEMENTS = 2**40
#: A measured kernel (or one LLMServingSim operator) longer than this, in seconds, is a broken row
#: or a unit mistake: left out. (The longest measured rows are ~40 s AIConfigurator MoE
#: all-to-all sweeps; GEMMs and attention stay under 0.3 s.)
MAX_KERNEL_S = 60.0
#: A GEMM row faster than this share of its datasheet roofline (2·m·n·k FLOPs at the GPU's
#: fastest dense peak, its weights read once at the datasheet bandwidth) is physically
#: impossible (a unit slip such as s for ms, a broken timer): left out, said in the notes and
#: profile.toml. Loose on purpose (100x faster than the datasheet allows): it catches unit slips
#: and garbage, never a real kernel (the shipped AIConfigurator GEMMs all sit above 0.5x).
ROOFLINE_MARGIN = 0.01
#: Repeated measurements of one key (same shape and size) whose times differ by more than this
#: factor (max / min) are said in the notes; the lookups take the median of repeats either way.
REPEAT_SPREAD = 2.0


def _version_key(name: str) -> tuple[tuple[int, ...], str]:
    """Sort key of a version folder's name: its numbers in order (any length: Python integers),
    then the name; a name without digits sorts first."""
    return tuple(int(p) for p in re.findall(r"\d+", name)) or (0,), name


def _newest_with(folder: Path, fname: str) -> Path | None:
    """``folder/<version>/fname`` of the newest version folder that has ``fname`` (an empty or
    partial newer folder never hides an older table); None when none has it."""
    try:
        versions = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    except OSError as exc:
        raise ConfigError(f"{folder}: cannot list the version folders: {exc.strerror or exc}") from None
    have = [p for p in versions if (p / fname).exists()]
    return max(have, key=lambda p: _version_key(p.name)) / fname if have else None


def _read_parquet(path: Path, required: list[str]) -> pl.DataFrame:
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file; measurement tables are read from files")
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # polars raises several types for a corrupt file
        raise ConfigError(f"{path}: cannot read Parquet: {exc}") from None
    missing = sorted(set(required) - set(frame.columns))
    if missing:
        raise ConfigError(f"{path}: missing column(s) {missing}")
    return frame


def _read_csv(path: Path, required: list[str]) -> pl.DataFrame:
    """The CSV at ``path``, every column as text (the row checks cast them, row by row)."""
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file; measurement tables are read from files")
    try:
        frame = pl.read_csv(path, infer_schema_length=0)
    except Exception as exc:
        raise ConfigError(f"{path}: cannot read CSV: {exc}") from None
    missing = sorted(set(required) - set(frame.columns))
    if missing:
        raise ConfigError(f"{path}: missing column(s) {missing}")
    return frame


def _as_number(frame: pl.DataFrame, col: str) -> pl.Expr:
    """``col`` as Float64, null where a cell is no number. Text is parsed; a bool (True would be
    1), a list, a struct or a date is no number."""
    dtype = frame.schema[col]
    if dtype.is_numeric() or dtype in (pl.Utf8, pl.Null):
        return pl.col(col).cast(pl.Float64, strict=False)
    return pl.lit(None, pl.Float64)


def _as_label(frame: pl.DataFrame, col: str) -> pl.Expr:
    """``col`` as text, null where a cell is no label (a list, a struct, bytes)."""
    dtype = frame.schema[col]
    if dtype.is_numeric() or dtype in (pl.Utf8, pl.Null, pl.Boolean, pl.Categorical) or isinstance(dtype, pl.Enum):
        return pl.col(col).cast(pl.Utf8, strict=False)
    return pl.lit(None, pl.Utf8)


def _checked(
    frame: pl.DataFrame,
    path: Path,
    out: Measurements,
    gpu: str,
    *,
    time: tuple[str, float, str],
    ints: dict[str, tuple[int, int]],
    labels: tuple[str, ...] = (),
    derived: tuple[tuple[str, pl.Expr, int, int], ...] = (),
    keep: pl.Expr | None = None,
    csv: bool = False,
) -> pl.DataFrame | None:
    """The rows of one measurement table that are measurements, typed: ``time`` = (column,
    factor to seconds, unit) becomes ``time_s`` (finite, > 0, at most :data:`MAX_KERNEL_S`);
    ``ints`` columns become Int64 (whole numbers within their bounds); ``labels`` text (not
    null); each ``derived`` (name, expression over the typed columns, bounds) must fall within its
    bounds. Cells are cast leniently (a text cell, a bool, NaN or an overflow makes its row bad,
    never the table), bad rows are left out and ``out`` says how many, why and where the first
    is. ``keep`` then selects the rows this reader uses (not a fault of the others). None, said,
    when no row is left."""
    col, factor, unit = time
    n = frame.height
    where = "line" if csv else "row"
    first_line = 2 if csv else 1
    if n == 0:
        out.skip(gpu, f"{path}: no rows; the table is skipped")
        return None
    checks: list[tuple[str, pl.Expr, pl.Expr, str]] = []  # (column, typed value, ok, what it must be)
    for c in labels:
        v = _as_label(frame, c)
        checks.append((c, v, v.is_not_null(), "a label"))
    for c, (lo, hi) in ints.items():
        v = _as_number(frame, c)
        ok = v.is_not_null() & v.is_finite() & (v == v.floor()) & (v >= lo) & (v <= hi)
        checks.append((c, pl.when(ok).then(v).otherwise(None).cast(pl.Int64), ok, f"a whole number in [{lo}, {hi}]"))
    t_s = _as_number(frame, col) * factor
    ok_t = t_s.is_not_null() & t_s.is_finite() & (t_s > 0) & (t_s <= MAX_KERNEL_S)
    checks.append((col, t_s, ok_t, f"a time in (0, {MAX_KERNEL_S / factor:g}] {unit}"))
    typed = frame.with_columns(
        *(v.alias(c) for c, v, _, _ in checks if c != col),
        pl.when(ok_t).then(t_s).otherwise(None).alias("time_s"),
        *(ok.fill_null(False).alias(f"__ok_{i}") for i, (_, _, ok, _) in enumerate(checks)),
    )
    names = [c for c, _, _, _ in checks]
    whats = [w for _, _, _, w in checks]
    for name, expr, lo, hi in derived:
        typed = typed.with_columns(expr.alias(f"__v_{len(names)}"))
        v = pl.col(f"__v_{len(names)}")
        typed = typed.with_columns(
            (v.is_not_null() & (v >= lo) & (v <= hi)).fill_null(False).alias(f"__ok_{len(names)}")
        )
        names.append(name)
        whats.append(f"a whole number in [{lo}, {hi}]")
    oks = typed.select(pl.col(f"__ok_{i}") for i in range(len(names)))
    good = oks.select(pl.all_horizontal(pl.all())).to_series()
    n_bad = n - int(good.sum())
    if n_bad:
        first = int((~good).arg_true()[0])
        i = next(i for i in range(len(names)) if not oks[first, i])
        value = frame[names[i]][first] if i < len(checks) else typed[f"__v_{i}"][first]  # raw cell, or derived
        counts = [(names[j], n - int(oks[:, j].sum())) for j in range(len(names))]
        by = ", ".join(f"{c} {k}" for c, k in counts if k)
        left = f"every row ({n})" if n_bad == n else f"{n_bad} of {n} row(s)"
        out.skip(
            gpu,
            f"{path}: {left} left out, the first at {where} {first + first_line}: {names[i]} = {value!r} is not "
            f"{whats[i]}"
            + (f" (bad cells by column: {by})" if len([1 for _, k in counts if k]) > 1 else "")
            + ("; the table is skipped" if n_bad == n else ""),
        )
    kept = typed.filter(good).drop([c for c in typed.columns if c.startswith("__")])
    if keep is not None:
        kept = kept.filter(keep)
    return kept if kept.height else None


def repeats_note(
    df: pl.DataFrame,
    keys: list[str],
    times: list[str],
    path: Path,
    what: str,
    unit: str = "s",
    shown: list[str] | None = None,
) -> str | None:
    """One sentence saying how many ``keys`` were measured more than once with one of ``times``
    more than :data:`REPEAT_SPREAD` apart (max / min), and the first such key (``shown`` of its
    columns); None when there is none. The lookups and fits take the median of repeats either
    way. Shared by the profile readers here and the Vidur / Splitwise readers (pipeline/calibrate/validate.py)."""
    if df.height == 0:
        return None
    g = df.group_by(keys, maintain_order=True).agg(
        pl.len().alias("__n"), *(pl.col(c).min().alias(f"__lo{i}") for i, c in enumerate(times)),
        *(pl.col(c).max().alias(f"__hi{i}") for i, c in enumerate(times)),
    )  # fmt: skip
    far = pl.any_horizontal(pl.col(f"__hi{i}") > REPEAT_SPREAD * pl.col(f"__lo{i}") for i in range(len(times)))
    bad = g.filter((pl.col("__n") > 1) & far)
    if bad.height == 0:
        return None
    r = bad.row(0, named=True)
    i = next(i for i in range(len(times)) if r[f"__hi{i}"] > REPEAT_SPREAD * r[f"__lo{i}"])
    which = f"{times[i]} " if len(times) > 1 else ""
    return (
        f"{path}: {bad.height} {what}(s) measured more than once with times over {REPEAT_SPREAD:g}x apart "
        f"(max/min), e.g. {', '.join(f'{k}={r[k]}' for k in (shown if shown is not None else keys))}: "
        f"{r['__n']} rows, {which}from {r[f'__lo{i}']:.4g} {unit} to {r[f'__hi{i}']:.4g} {unit}; "
        "the median of the repeats is used"
    )


#: Repeats of one measurement more than this far apart (max / min) contradict each other: no
#: kernel's time varies tenfold between runs of one shape (:func:`_repeats`).
CONTRADICTORY_SPREAD = 10.0


def _repeats(frame: pl.DataFrame, path: Path, out: Measurements, gpu: str, what: str) -> bool:
    """:func:`repeats_note` over a profile table (its key: every column but the time), said once.
    Returns True when the table contradicts itself — for more than half of its repeated keys, no
    majority of the repeats lies within :data:`CONTRADICTORY_SPREAD` of their median (two runs
    100x apart: a unit mix-up, or two sets in one file) — after saying so as a skipped file: the
    caller leaves the table out, as such a median is a time nobody measured. Repeats where most
    agree and one is off keep their median (a measured value), and are only noted."""
    keys = [c for c in frame.columns if c != "time_s"]
    shown = [k for k in keys if k not in ("gpu", "set", "source", "model", "tp")]
    if frame.height and not frame.select(keys).is_unique().all():
        med = pl.col("time_s").median().over(keys)
        ratio = pl.max_horizontal(pl.col("time_s"), med) / pl.min_horizontal(pl.col("time_s"), med)
        g = (
            frame.with_columns((ratio <= CONTRADICTORY_SPREAD).alias("__near"))
            .group_by(keys, maintain_order=True)
            .agg(
                pl.len().alias("__n"),
                pl.col("__near").sum().alias("__agree"),
                pl.col("time_s").min().alias("__lo"),
                pl.col("time_s").max().alias("__hi"),
            )
        )
        repeated = g.filter(pl.col("__n") > 1)
        split = repeated.filter(pl.col("__agree") * 2 <= pl.col("__n"))
        if split.height * 2 > repeated.height:
            r = split.row(0, named=True)
            out.skip(
                gpu,
                f"{path}: {split.height} of the {repeated.height} {what}s measured more than once have no majority "
                f"of their repeats within {CONTRADICTORY_SPREAD:g}x of each other, e.g. "
                f"{', '.join(f'{k}={r[k]}' for k in shown)}: {r['__n']} rows from {r['__lo']:.4g} s to "
                f"{r['__hi']:.4g} s; a unit mix-up or two sets in one file: the file is left out",
            )
            return True
    note = repeats_note(frame, keys, ["time_s"], path, what, shown=shown)
    if note is not None:
        out.note(gpu, note)
    return False


def _median_of_repeats(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per key (every column but the time) with the median time, where a key repeats."""
    keys = [c for c in frame.columns if c != "time_s"]
    if frame.select(keys).is_unique().all():
        return frame
    return frame.group_by(keys, maintain_order=True).agg(pl.col("time_s").median()).select(frame.columns)


def _sixteen_bit(frame: pl.DataFrame, column: str, path: Path, out: Measurements, gpu: str) -> pl.DataFrame:
    """The 16-bit rows of an all-reduce table: ``message_size`` counts elements, and only 16-bit
    ones are :data:`AR_ELEMENT_BYTES` each. A table without the dtype column is read as 16-bit
    (the collector's default, bfloat16), and said."""
    if column not in frame.columns:
        out.note(gpu, f"{path}: no {column} column; message sizes read as 16-bit elements (the collector's default)")
        return frame
    keep = _as_label(frame, column).is_in(["bfloat16", "half", "float16"]).fill_null(False)
    return frame.filter(keep)


def _dtype(col: str) -> pl.Expr:
    return pl.col(col).replace_strict(DTYPES, default=pl.col(col))


def read_aiconfigurator(root: Path, out: Measurements) -> None:
    """Append every AIConfigurator table under ``root`` (a folder of ``<gpu>/`` folders)."""
    for gpu_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        gpu = AICONFIGURATOR_GPUS.get(gpu_dir.name)
        if gpu is None:
            out.skip(None, f"{gpu_dir}: GPU folder not mapped to a catalog entry")
            continue

        def src(path: Path, base: Path = root) -> str:
            return str(path.relative_to(base.parent))

        def ident(path: Path, gpu: str = gpu) -> list[pl.Expr]:
            """The columns naming a row's GPU, set and source file."""
            return [pl.lit(gpu).alias("gpu"), pl.lit("aiconfigurator").alias("set"), pl.lit(src(path)).alias("source")]

        def add(fam: str, frame: pl.DataFrame, path: Path, what: str, gpu: str = gpu) -> None:
            if _repeats(frame, path, out, gpu, what):
                return
            out.files.append(src(path))
            out.add(fam, frame)

        ms = ("latency", 1e-3, "ms")  # AIConfigurator's times
        path = _newest_with(gpu_dir / "gemm" / "vllm", "gemm_perf.parquet")
        if path is not None:
            f = _read_parquet(path, ["gemm_dtype", "kernel_source", "m", "n", "k", "latency"])
            c = _checked(
                f,
                path,
                out,
                gpu,
                time=ms,
                ints={"m": (1, MAX_SIZE), "n": (1, MAX_SIZE), "k": (1, MAX_SIZE)},
                labels=("gemm_dtype", "kernel_source"),
            )
            if c is not None:
                add(
                    "gemm",
                    c.select(
                        *ident(path),
                        _dtype("gemm_dtype").alias("dtype"),
                        pl.col("kernel_source").alias("kernel"),
                        "m",
                        "n",
                        "k",
                        "time_s",
                    ),
                    path,
                    "GEMM shape",
                )
        for fname, fam, length in (
            ("generation_attention_perf.parquet", "attn_decode", "ctx"),
            ("context_attention_perf.parquet", "attn_prefill", "isl"),
        ):
            path = _newest_with(gpu_dir / "attention" / "vllm", fname)
            if path is None:
                continue
            need = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype", "latency"]
            f = _read_parquet(path, [*need, "kernel_source"])
            if "step" not in f.columns:
                f = f.with_columns(step=pl.lit(0))
            sizes = {c: (1, MAX_SIZE) for c in ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim")}
            sizes["step"] = (0, MAX_SIZE)
            windowed = "window_size" in f.columns
            if windowed:
                sizes["window_size"] = (0, MAX_SIZE)
            # decode rows: one step at context isl + step tokens (AIConfigurator's generation
            # collector); prefill rows: isl tokens
            derived = (("isl + step", pl.col("isl") + pl.col("step"), 1, MAX_SIZE),) if fam == "attn_decode" else ()
            c = _checked(
                f,
                path,
                out,
                gpu,
                time=ms,
                ints=sizes,
                labels=("kv_cache_dtype", "kernel_source"),
                derived=derived,
                keep=(pl.col("window_size") == 0) if windowed else None,
            )
            if c is None:
                continue
            size = (pl.col("isl") + pl.col("step")) if fam == "attn_decode" else pl.col("isl")
            add(
                fam,
                c.select(
                    *ident(path),
                    _dtype("kv_cache_dtype").alias("kv_dtype"),
                    pl.col("kernel_source").alias("kernel"),
                    pl.col("num_heads").alias("nq"),
                    pl.col("num_key_value_heads").alias("nkv"),
                    pl.col("head_dim").alias("d"),
                    pl.col("batch_size").alias("batch"),
                    size.alias(length),
                    "time_s",
                ),
                path,
                "attention shape",
            )
        comm = gpu_dir / "comm"
        # custom all-reduce and NCCL: message_size counts bf16 elements (the collector all-reduces
        # torch.ones(size) in bfloat16): twice as many bytes
        ar_sizes = {"num_gpus": (1, MAX_SIZE), "message_size": (1, MAX_MESSAGE_ELEMENTS)}
        path = _newest_with(comm / "vllm", "custom_allreduce_perf.parquet")
        if path is not None:
            f = _read_parquet(path, ["backend", "num_gpus", "message_size", "latency"])
            f = _sixteen_bit(f, "allreduce_dtype", path, out, gpu)
            c = _checked(f, path, out, gpu, time=ms, ints=ar_sizes, labels=("backend",))
            if c is not None:
                add(
                    "allreduce",
                    c.select(
                        *ident(path),
                        pl.col("backend").replace_strict(
                            {"vllm_graph": "custom_graph", "vllm_eager": "custom_eager"}, default=pl.col("backend")
                        ),
                        pl.col("num_gpus").alias("gpus"),
                        (pl.col("message_size") * AR_ELEMENT_BYTES).alias("bytes"),
                        "time_s",
                    ),
                    path,
                    "all-reduce size",
                )
        path = _newest_with(comm / "nccl", "nccl_perf.parquet")
        if path is not None:
            f = _read_parquet(path, ["op_name", "num_gpus", "message_size", "latency"])
            op = _as_label(f, "op_name")
            f = _sixteen_bit(
                f.with_columns(op.alias("op_name")).filter(op.is_in(list(NCCL_BACKENDS)).fill_null(False)),
                "nccl_dtype",
                path,
                out,
                gpu,
            )
            c = _checked(f, path, out, gpu, time=ms, ints=ar_sizes)
            if c is not None:
                add(
                    "allreduce",
                    c.select(
                        *ident(path),
                        pl.col("op_name").replace_strict(NCCL_BACKENDS).alias("backend"),
                        pl.col("num_gpus").alias("gpus"),
                        (pl.col("message_size") * AR_ELEMENT_BYTES).alias("bytes"),  # 16-bit elements
                        "time_s",
                    ),
                    path,
                    "all-reduce size",
                )
        path = _newest_with(gpu_dir / "moe" / "vllm", "moe_perf.parquet")
        if path is not None:
            need = ["moe_dtype", "kernel_source", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts"]
            f = _read_parquet(path, [*need, "moe_tp_size", "moe_ep_size", "distribution", "latency"])
            sizes = {
                c: (1, MAX_SIZE)
                for c in (
                    "num_tokens",
                    "hidden_size",
                    "inter_size",
                    "topk",
                    "num_experts",
                    "moe_tp_size",
                    "moe_ep_size",
                )
            }
            c = _checked(
                f,
                path,
                out,
                gpu,
                time=ms,
                ints=sizes,
                labels=("moe_dtype", "kernel_source", "distribution"),
                derived=(("num_experts - topk", pl.col("num_experts") - pl.col("topk"), 0, MAX_SIZE),),
            )
            if c is not None:
                add(
                    "moe",
                    c.select(
                        *ident(path),
                        _dtype("moe_dtype").alias("dtype"),
                        pl.col("kernel_source").alias("kernel"),
                        pl.col("distribution"),
                        pl.col("hidden_size").alias("h"),
                        pl.col("inter_size").alias("inter"),
                        pl.col("topk"),
                        pl.col("num_experts").alias("experts"),
                        pl.col("moe_tp_size").alias("moe_tp"),
                        pl.col("moe_ep_size").alias("moe_ep"),
                        pl.col("num_tokens").alias("tokens"),
                        "time_s",
                    ),
                    path,
                    "MoE shape",
                )


def gemm_shapes(model: ModelSpec, tp: int) -> dict[str, tuple[int, int]]:
    """(n, k) of a dense model's per-layer GEMMs on one TP shard, by LLMServingSim operator name:
    fused QKV and gate/up projections are column-parallel (n sharded), o_proj and down_proj
    row-parallel (k sharded), as in vLLM's Llama/Qwen3 layers."""
    d = model.head_dim
    nq = model.num_attention_heads // tp
    nkv = max(1, model.num_kv_heads // tp)
    h = model.hidden_size
    shapes = {"qkv_proj": ((nq + 2 * nkv) * d, h), "o_proj": (h, nq * d)}
    if model.num_dense_layers:
        inter = model.intermediate_size // tp
        shapes["gate_up_proj"] = (2 * inter, h)
        shapes["down_proj"] = (h, inter)
    return shapes


#: Largest TP degree an LLMServingSim bundle folder (``tp<N>``) may name.
MAX_TP = 1024


def _tp_problem(name: str, model: ModelSpec) -> tuple[int, str | None]:
    """The TP degree a ``tp<N>`` folder names, and why it cannot be read (None when it can):
    N must be a whole number in [1, MAX_TP] that divides the model's attention heads and whose
    KV heads split evenly (vLLM's own conditions for tensor parallelism)."""
    digits = name[2:]
    if not digits.isdigit() or not digits.isascii():
        return 0, f"not a tp<N> folder (N a whole number in [1, {MAX_TP}])"
    if len(digits) > 6 or not 1 <= int(digits) <= MAX_TP:
        return 0, f"TP {digits} is not in [1, {MAX_TP}]"
    tp = int(digits)
    nq, nkv = model.num_attention_heads, model.num_kv_heads
    if nq % tp:
        return tp, f"TP {tp} does not divide the model's {nq} attention heads"
    if nkv % tp and tp % nkv:
        return tp, f"TP {tp} does not split the model's {nkv} KV heads evenly"
    if model.num_dense_layers and model.intermediate_size % tp:
        return tp, f"TP {tp} does not divide the model's intermediate size {model.intermediate_size}"
    return tp, None


def read_llmservingsim(root: Path, out: Measurements) -> None:
    """Append every LLMServingSim bundle under ``root`` (``<hardware>/<org>/<model>/<variant>/``)."""
    for tp_dir in sorted(root.glob("*/*/*/*/tp*")):
        if not tp_dir.is_dir():
            continue
        hw_label, org, model_dir, variant = tp_dir.parts[-5:-1]
        gpu = LLMSERVINGSIM_GPUS.get(hw_label)
        hf_id = f"{org}/{model_dir}"
        model_name = LLMSERVINGSIM_MODELS.get(hf_id)
        if gpu is None or model_name is None:
            out.skip(None, f"{tp_dir}: hardware or model not mapped to the catalog")
            continue
        if variant != "bf16":
            out.skip(gpu, f"{tp_dir}: variant {variant} not read (bf16 only)")
            continue
        model = load_model(model_name)
        tp, problem = _tp_problem(tp_dir.name, model)
        if problem is not None:
            out.skip(gpu, f"{tp_dir}: {problem}; the bundle is skipped")
            continue
        base = root.parent

        def src(path: Path, base: Path = base) -> str:
            return str(path.relative_to(base))

        def ident(path: Path, gpu: str = gpu, model_name: str = model_name, tp: int = tp) -> list[pl.Expr]:
            """The columns naming a row's GPU, set, source file, model and TP shard."""
            return [
                pl.lit(gpu).alias("gpu"),
                pl.lit("llmservingsim").alias("set"),
                pl.lit(src(path)).alias("source"),
                pl.lit(model_name).alias("model"),
                pl.lit(tp).cast(pl.Int64).alias("tp"),
            ]

        us = ("time_us", 1e-6, "us")  # LLMServingSim's times
        dense = tp_dir / "dense.csv"
        if dense.exists():
            f = _read_csv(dense, ["layer", "tokens", "time_us"])
            c = _checked(f, dense, out, gpu, time=us, ints={"tokens": (1, MAX_SIZE)}, labels=("layer",), csv=True)
            ops = (
                None
                if c is None
                else c.select(*ident(dense), pl.col("layer").alias("op"), pl.col("tokens").alias("size"), "time_s")
            )
            if ops is not None and not _repeats(ops, dense, out, gpu, "operator size"):
                out.files.append(src(dense))
                out.add("model_ops", ops)
                shapes = gemm_shapes(model, tp)
                rows = [
                    ops.filter(pl.col("op") == name).select(
                        "gpu",
                        "set",
                        "source",
                        pl.lit("bf16").alias("dtype"),
                        pl.lit(f"vllm eager ({name})").alias("kernel"),
                        pl.col("size").alias("m"),
                        pl.lit(n).cast(pl.Int64).alias("n"),
                        pl.lit(k).cast(pl.Int64).alias("k"),
                        "time_s",
                    )
                    for name, (n, k) in shapes.items()
                ]
                out.add("gemm", pl.concat(rows))
        per_seq = tp_dir / "per_sequence.csv"
        if per_seq.exists():
            f = _read_csv(per_seq, ["layer", "sequences", "time_us"])
            c = _checked(f, per_seq, out, gpu, time=us, ints={"sequences": (1, MAX_SIZE)}, labels=("layer",), csv=True)
            ops = (
                None
                if c is None
                else c.select(*ident(per_seq), pl.col("layer").alias("op"), pl.col("sequences").alias("size"), "time_s")
            )
            if ops is not None and not _repeats(ops, per_seq, out, gpu, "operator size"):
                out.files.append(src(per_seq))
                out.add("model_ops", ops)
        attn = tp_dir / "attention.csv"
        if attn.exists():
            f = _read_csv(attn, ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"])
            steps = {c: (0, MAX_SIZE) for c in ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")}
            c = _checked(f, attn, out, gpu, time=us, ints=steps, csv=True)
            if c is not None:
                out.files.append(src(attn))
                nq = model.num_attention_heads // tp
                nkv = max(1, model.num_kv_heads // tp)
                mixed = c.select(
                    *ident(attn),
                    pl.lit(nq).cast(pl.Int64).alias("nq"),
                    pl.lit(nkv).cast(pl.Int64).alias("nkv"),
                    pl.lit(model.head_dim).cast(pl.Int64).alias("d"),
                    pl.col("prefill_chunk").alias("chunk"),
                    "kv_prefill",
                    "n_decode",
                    "kv_decode",
                    "time_s",
                )
                if _repeats(mixed, attn, out, gpu, "batch"):
                    out.files.remove(src(attn))
                else:
                    # the mixed-batch ratio grid averages log ratios per cell: repeats of one batch
                    # enter it once, at their median (as every other table's lookup takes them)
                    mixed = _median_of_repeats(mixed)
                    out.add("attn_mixed", mixed)
                    head: list[str | pl.Expr] = [
                        "gpu",
                        "set",
                        "source",
                        pl.lit("bf16").alias("kv_dtype"),
                        pl.lit("vllm eager (attention.csv)").alias("kernel"),
                        "nq",
                        "nkv",
                        "d",
                    ]
                    out.add(
                        "attn_decode",
                        mixed.filter((pl.col("chunk") == 0) & (pl.col("n_decode") > 0)).select(
                            *head,
                            pl.col("n_decode").alias("batch"),
                            pl.col("kv_decode").alias("ctx"),
                            "time_s",
                        ),
                    )
                    out.add(
                        "attn_prefill",
                        mixed.filter(
                            (pl.col("chunk") > 0) & (pl.col("kv_prefill") == 0) & (pl.col("n_decode") == 0)
                        ).select(
                            *head,
                            pl.lit(1).cast(pl.Int64).alias("batch"),
                            pl.col("chunk").alias("isl"),
                            "time_s",
                        ),
                    )
        moe = tp_dir / "moe.csv"
        if moe.exists():
            f = _read_csv(moe, ["tokens", "activated_experts", "time_us"])
            sizes = {"tokens": (1, MAX_SIZE), "activated_experts": (1, MAX_SIZE)}
            c = _checked(f, moe, out, gpu, time=us, ints=sizes, csv=True)
            if c is not None:
                out.files.append(src(moe))
                out.add(
                    "moe_touched",
                    c.select(
                        *ident(moe),
                        "tokens",
                        pl.col("activated_experts").alias("experts_touched"),
                        "time_s",
                    ),
                )


def drop_impossible_gemms(out: Measurements) -> None:
    """Leave out the GEMM rows faster than :data:`ROOFLINE_MARGIN` x the ideal time their GPU's
    datasheet allows (per source file, said through ``out.skip``)."""

    g = out.frames.get("gemm")
    if g is None or g.height == 0:
        return
    parts = []
    for (gpu, source), part in g.group_by(["gpu", "source"], maintain_order=True):
        try:
            hw = load_hardware(str(gpu))
        except ConfigError:  # a GPU the catalog cannot read: nothing to judge the rows on
            parts.append(part)
            continue
        peak = max(hw.peak_flops_per_s.values())

        def bpp(dtype: str) -> float:
            try:
                return weight_format(dtype).bytes_per_param
            except ConfigError:
                return 0.5  # the smallest format: never flags a row it should not

        m, n, k = (pl.col(c).cast(pl.Float64) for c in ("m", "n", "k"))
        weight_bytes = n * k * pl.col("dtype").map_elements(bpp, return_dtype=pl.Float64)
        ideal = pl.max_horizontal(2.0 * m * n * k / peak, weight_bytes / hw.memory_bandwidth_bytes_per_s)
        part = part.with_columns(ideal.alias("__ideal_s"))
        bad = part.filter(pl.col("time_s") < ROOFLINE_MARGIN * pl.col("__ideal_s"))
        if bad.height:
            first = bad.row(0, named=True)
            out.skip(
                str(gpu),
                f"{source}: {bad.height} of {part.height} GEMM row(s) left out as physically impossible: faster "
                f"than {ROOFLINE_MARGIN:g}x the {hw.name} datasheet roofline (FLOPs / peak, weight bytes / "
                f"bandwidth), the first m={first['m']} n={first['n']} k={first['k']} {first['dtype']} at "
                f"{first['time_s']:.3g} s vs an ideal {first['__ideal_s']:.3g} s",
            )
        parts.append(part.filter(pl.col("time_s") >= ROOFLINE_MARGIN * pl.col("__ideal_s")).drop("__ideal_s"))
    kept = [p for p in parts if p.height]
    if kept:
        out.frames["gemm"] = pl.concat(kept, how="vertical_relaxed")
    else:
        del out.frames["gemm"]


def read_measurements(root: Path) -> Measurements:
    """Read every known set under ``root`` (a folder holding ``aiconfigurator-vllm-ops/`` and/or
    ``llmservingsim-profiles/``) or one set's folder."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root}: not a folder of measurements")
    out = Measurements()
    found = False
    for name, reader in (
        ("aiconfigurator-vllm-ops", read_aiconfigurator),
        ("llmservingsim-profiles", read_llmservingsim),
    ):
        folder = root / name if (root / name).is_dir() else (root if root.name == name else None)
        if folder is not None:
            reader(folder, out)
            found = True
    drop_impossible_gemms(out)
    if not found:
        raise ConfigError(
            f"{root}: holds neither aiconfigurator-vllm-ops/ nor llmservingsim-profiles/ (operator measurements)"
        )
    return out
