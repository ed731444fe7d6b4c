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

Where a family has several vLLM versions the newest is read (the one the profile describes); for
NCCL the newest NCCL version. Every row keeps ``source`` (its file, relative to the root given) so
a profile can say which rows it was built and judged on.

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

from pipeline.catalog import ModelSpec, load_model
from pipeline.errors import ConfigError

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

    def get(self, family: str) -> pl.DataFrame:
        return self.frames.get(family, pl.DataFrame())

    def add(self, family: str, frame: pl.DataFrame) -> None:
        if frame.height == 0:
            return
        old = self.frames.get(family)
        self.frames[family] = frame if old is None else pl.concat([old, frame], how="diagonal_relaxed")

    def for_gpu(self, gpu: str) -> Measurements:
        out = Measurements(skipped=list(self.skipped), files=list(self.files))
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
#: bandwidth at 1 GiB; as elements ~470 GB/s, what NVLink 4 delivers.
AR_ELEMENT_BYTES = 2


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", name)) or (0,)


def _newest(folder: Path) -> Path | None:
    if not folder.is_dir():
        return None
    versions = [p for p in folder.iterdir() if p.is_dir()]
    return max(versions, key=lambda p: _version_key(p.name)) if versions else None


def _read_parquet(path: Path, required: list[str]) -> pl.DataFrame:
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # polars raises several types for a corrupt file
        raise ConfigError(f"{path}: cannot read Parquet: {exc}") from None
    missing = sorted(set(required) - set(frame.columns))
    if missing:
        raise ConfigError(f"{path}: missing column(s) {missing}")
    return frame


def _read_csv(path: Path, required: list[str]) -> pl.DataFrame:
    try:
        frame = pl.read_csv(path, infer_schema_length=10000)
    except Exception as exc:
        raise ConfigError(f"{path}: cannot read CSV: {exc}") from None
    missing = sorted(set(required) - set(frame.columns))
    if missing:
        raise ConfigError(f"{path}: missing column(s) {missing}")
    return frame


def _dtype(col: str) -> pl.Expr:
    return pl.col(col).replace_strict(DTYPES, default=pl.col(col))


def read_aiconfigurator(root: Path, out: Measurements) -> None:
    """Append every AIConfigurator table under ``root`` (a folder of ``<gpu>/`` folders)."""
    for gpu_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        gpu = AICONFIGURATOR_GPUS.get(gpu_dir.name)
        if gpu is None:
            out.skipped.append(f"{gpu_dir}: GPU folder not mapped to a catalog entry")
            continue

        def src(path: Path, base: Path = root) -> str:
            return str(path.relative_to(base.parent))

        def ident(path: Path, gpu: str = gpu) -> list[pl.Expr]:
            """The columns naming a row's GPU, set and source file."""
            return [pl.lit(gpu).alias("gpu"), pl.lit("aiconfigurator").alias("set"), pl.lit(src(path)).alias("source")]

        v = _newest(gpu_dir / "gemm" / "vllm")
        if v is not None and (v / "gemm_perf.parquet").exists():
            path = v / "gemm_perf.parquet"
            f = _read_parquet(path, ["gemm_dtype", "kernel_source", "m", "n", "k", "latency"])
            out.files.append(src(path))
            out.add(
                "gemm",
                f.select(
                    *ident(path),
                    _dtype("gemm_dtype").alias("dtype"),
                    pl.col("kernel_source").alias("kernel"),
                    pl.col("m").cast(pl.Int64),
                    pl.col("n").cast(pl.Int64),
                    pl.col("k").cast(pl.Int64),
                    (pl.col("latency") * 1e-3).alias("time_s"),
                ),
            )
        v = _newest(gpu_dir / "attention" / "vllm")
        if v is not None:
            for fname, fam, length in (
                ("generation_attention_perf.parquet", "attn_decode", "ctx"),
                ("context_attention_perf.parquet", "attn_prefill", "isl"),
            ):
                path = v / fname
                if not path.exists():
                    continue
                need = [
                    "batch_size",
                    "isl",
                    "num_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "kv_cache_dtype",
                    "latency",
                ]
                f = _read_parquet(path, [*need, "kernel_source"])
                out.files.append(src(path))
                if "window_size" in f.columns:
                    f = f.filter(pl.col("window_size") == 0)
                if "step" not in f.columns:
                    f = f.with_columns(step=pl.lit(0))
                # decode rows: one step at context isl + step tokens (AIConfigurator's generation
                # collector); prefill rows: isl tokens
                size = (pl.col("isl") + pl.col("step")) if fam == "attn_decode" else pl.col("isl")
                out.add(
                    fam,
                    f.select(
                        *ident(path),
                        _dtype("kv_cache_dtype").alias("kv_dtype"),
                        pl.col("kernel_source").alias("kernel"),
                        pl.col("num_heads").cast(pl.Int64).alias("nq"),
                        pl.col("num_key_value_heads").cast(pl.Int64).alias("nkv"),
                        pl.col("head_dim").cast(pl.Int64).alias("d"),
                        pl.col("batch_size").cast(pl.Int64).alias("batch"),
                        size.cast(pl.Int64).alias(length),
                        (pl.col("latency") * 1e-3).alias("time_s"),
                    ),
                )
        comm = gpu_dir / "comm"
        v = _newest(comm / "vllm")
        if v is not None:
            # custom all-reduce: the newest version folder that has the table
            cands = sorted(
                (p for p in (comm / "vllm").iterdir() if (p / "custom_allreduce_perf.parquet").exists()),
                key=lambda p: _version_key(p.name),
            )
            if cands:
                path = cands[-1] / "custom_allreduce_perf.parquet"
                f = _read_parquet(path, ["backend", "num_gpus", "message_size", "latency"])
                out.files.append(src(path))
                out.add(
                    "allreduce",
                    f.select(
                        *ident(path),
                        pl.col("backend").replace_strict(
                            {"vllm_graph": "custom_graph", "vllm_eager": "custom_eager"}, default=pl.col("backend")
                        ),
                        pl.col("num_gpus").cast(pl.Int64).alias("gpus"),
                        # message_size counts bf16 elements (the collector all-reduces
                        # torch.ones(size) in bfloat16): twice as many bytes
                        (pl.col("message_size") * AR_ELEMENT_BYTES).cast(pl.Int64).alias("bytes"),
                        (pl.col("latency") * 1e-3).alias("time_s"),
                    ),
                )
        v = _newest(comm / "nccl")
        if v is not None and (v / "nccl_perf.parquet").exists():
            path = v / "nccl_perf.parquet"
            f = _read_parquet(path, ["op_name", "num_gpus", "message_size", "latency"])
            out.files.append(src(path))
            if "nccl_dtype" in f.columns:
                f = f.filter(pl.col("nccl_dtype").is_in(["half", "bfloat16", "float16"]))
            out.add(
                "allreduce",
                f.filter(pl.col("op_name") == "all_reduce").select(
                    *ident(path),
                    pl.lit("nccl").alias("backend"),
                    pl.col("num_gpus").cast(pl.Int64).alias("gpus"),
                    (pl.col("message_size") * AR_ELEMENT_BYTES).cast(pl.Int64).alias("bytes"),  # 16-bit elements
                    (pl.col("latency") * 1e-3).alias("time_s"),
                ),
            )
        v = _newest(gpu_dir / "moe" / "vllm")
        if v is not None and (v / "moe_perf.parquet").exists():
            path = v / "moe_perf.parquet"
            need = ["moe_dtype", "kernel_source", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts"]
            f = _read_parquet(path, [*need, "moe_tp_size", "moe_ep_size", "distribution", "latency"])
            out.files.append(src(path))
            out.add(
                "moe",
                f.select(
                    *ident(path),
                    _dtype("moe_dtype").alias("dtype"),
                    pl.col("kernel_source").alias("kernel"),
                    pl.col("distribution"),
                    pl.col("hidden_size").cast(pl.Int64).alias("h"),
                    pl.col("inter_size").cast(pl.Int64).alias("inter"),
                    pl.col("topk").cast(pl.Int64),
                    pl.col("num_experts").cast(pl.Int64).alias("experts"),
                    pl.col("moe_tp_size").cast(pl.Int64).alias("moe_tp"),
                    pl.col("moe_ep_size").cast(pl.Int64).alias("moe_ep"),
                    pl.col("num_tokens").cast(pl.Int64).alias("tokens"),
                    (pl.col("latency") * 1e-3).alias("time_s"),
                ),
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


def read_llmservingsim(root: Path, out: Measurements) -> None:
    """Append every LLMServingSim bundle under ``root`` (``<hardware>/<org>/<model>/<variant>/``)."""
    for tp_dir in sorted(root.glob("*/*/*/*/tp*")):
        hw_label, org, model_dir, variant = tp_dir.parts[-5:-1]
        gpu = LLMSERVINGSIM_GPUS.get(hw_label)
        hf_id = f"{org}/{model_dir}"
        model_name = LLMSERVINGSIM_MODELS.get(hf_id)
        if gpu is None or model_name is None:
            out.skipped.append(f"{tp_dir}: hardware or model not mapped to the catalog")
            continue
        if variant != "bf16":
            out.skipped.append(f"{tp_dir}: variant {variant} not read (bf16 only)")
            continue
        try:
            tp = int(tp_dir.name[2:])
        except ValueError:
            out.skipped.append(f"{tp_dir}: not a tp<N> folder")
            continue
        model = load_model(model_name)
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

        dense = tp_dir / "dense.csv"
        if dense.exists():
            f = _read_csv(dense, ["layer", "tokens", "time_us"])
            out.files.append(src(dense))
            ops = f.select(
                *ident(dense),
                pl.col("layer").alias("op"),
                pl.col("tokens").cast(pl.Int64).alias("size"),
                (pl.col("time_us") * 1e-6).alias("time_s"),
            )
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
            out.files.append(src(per_seq))
            out.add(
                "model_ops",
                f.select(
                    *ident(per_seq),
                    pl.col("layer").alias("op"),
                    pl.col("sequences").cast(pl.Int64).alias("size"),
                    (pl.col("time_us") * 1e-6).alias("time_s"),
                ),
            )
        attn = tp_dir / "attention.csv"
        if attn.exists():
            f = _read_csv(attn, ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"])
            out.files.append(src(attn))
            nq = model.num_attention_heads // tp
            nkv = max(1, model.num_kv_heads // tp)
            mixed = f.select(
                *ident(attn),
                pl.lit(nq).cast(pl.Int64).alias("nq"),
                pl.lit(nkv).cast(pl.Int64).alias("nkv"),
                pl.lit(model.head_dim).cast(pl.Int64).alias("d"),
                pl.col("prefill_chunk").cast(pl.Int64).alias("chunk"),
                pl.col("kv_prefill").cast(pl.Int64),
                pl.col("n_decode").cast(pl.Int64),
                pl.col("kv_decode").cast(pl.Int64),
                (pl.col("time_us") * 1e-6).alias("time_s"),
            )
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
                mixed.filter((pl.col("chunk") > 0) & (pl.col("kv_prefill") == 0) & (pl.col("n_decode") == 0)).select(
                    *head,
                    pl.lit(1).cast(pl.Int64).alias("batch"),
                    pl.col("chunk").alias("isl"),
                    "time_s",
                ),
            )
        moe = tp_dir / "moe.csv"
        if moe.exists():
            f = _read_csv(moe, ["tokens", "activated_experts", "time_us"])
            out.files.append(src(moe))
            out.add(
                "moe_touched",
                f.select(
                    *ident(moe),
                    pl.col("tokens").cast(pl.Int64),
                    pl.col("activated_experts").cast(pl.Int64).alias("experts_touched"),
                    (pl.col("time_us") * 1e-6).alias("time_s"),
                ),
            )


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
    if not found:
        raise ConfigError(
            f"{root}: holds neither aiconfigurator-vllm-ops/ nor llmservingsim-profiles/ (operator measurements)"
        )
    return out
