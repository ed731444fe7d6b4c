"""``rooftrace fit``: does a model fit a GPU setup, and how much KV cache is left (pipeline/costmodel/fit.py)."""

from __future__ import annotations

import click

from pipeline.cli.common import emit_json, gib, json_option, old_option_name, option_value, run
from pipeline.common.errors import RooftraceError


@click.command("fit")
@click.option("--model", "model_name", required=True, help="Catalog model name (or a .toml path).")
@click.option("--hardware", "hardware_name", required=True, help="Catalog hardware name (or a .toml path).")
@click.option("--tp", default=1, show_default=True, type=int, help="Tensor-parallel GPUs.")
@click.option("--pp", default=1, show_default=True, type=int, help="Pipeline-parallel stages.")
@click.option(
    "--dp", default=1, show_default=True, type=int, help="Data-parallel ranks (MoE: experts over tp x dp GPUs)."
)
@click.option("--ep", default=1, show_default=True, type=int, help="Expert-parallel size: 1 or tp x dp.")
@click.option(
    "--weight-dtype",
    "weight_dtype",
    default="bf16",
    show_default=True,
    help="Weight format (dtypes.toml), as FLEET.toml's weight_dtype and plan's --weight-dtype.",
)
@old_option_name("--weights", "--weight-dtype", "weight_dtype")
@click.option("--kv-dtype", default="bf16", show_default=True, help="KV-cache dtype: bf16, fp16 or fp8.")
@click.option("--context", type=int, default=None, help="Context length to fit (default: the model's maximum).")
@click.option(
    "--gpu-memory-utilization",
    default=0.9,
    show_default=True,
    type=float,
    help="Share of GPU memory vLLM may use (weights, activations, KV).",
)
@click.option("--block-size", default=16, show_default=True, type=int, help="KV-cache block size (tokens).")
@click.option(
    "--max-num-seqs",
    default=None,
    type=int,
    help="Sequences per batch (default: vLLM's for the GPU; sizes the sampler).",
)
@click.option(
    "--max-num-batched-tokens",
    default=None,
    type=int,
    help="Token budget per step (default: vLLM's for the GPU; sizes the profile run's activation).",
)
@click.option(
    "--vllm-version",
    default=None,
    help="vLLM release whose memory accounting to follow (default: pipeline.costmodel.fit.DEFAULT_VLLM_VERSION).",
)
@json_option
def fit_cmd(
    model_name: str,
    hardware_name: str,
    tp: int,
    pp: int,
    dp: int,
    ep: int,
    weight_dtype: str,
    kv_dtype: str,
    context: int | None,
    gpu_memory_utilization: float,
    block_size: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    vllm_version: str | None,
    as_json: bool,
) -> None:
    """Does a model fit a GPU setup, and how much KV cache is left? Exit 1 when it does not fit.
    The KV cache is what vLLM's own accounting leaves (docs/catalog.md, "Memory fit").

    Example: rooftrace fit --model llama-3.1-70b --hardware h100-sxm --tp 4 --kv-dtype fp8 --context 32768
    """
    weight_dtype = option_value("weight_dtype", weight_dtype, "--weight-dtype")

    def body() -> bool:
        from pipeline.catalog import load_hardware, load_model
        from pipeline.costmodel.fit import fit, fit_capacity_text
        from pipeline.costmodel.roofline import Deployment

        dep = Deployment(
            load_model(model_name), load_hardware(hardware_name), tp=tp, pp=pp, ep=ep, dp=dp,
            weight_dtype=weight_dtype, kv_dtype=kv_dtype,
        )  # fmt: skip
        from pipeline.costmodel.fit import DEFAULT_VLLM_VERSION
        from pipeline.replay.fleet import vllm_batch_defaults

        # the options as given, before a default derives from them (--max-num-seqs defaults to
        # at most --max-num-batched-tokens): the error names the option at fault
        for name, given in (("--max-num-batched-tokens", max_num_batched_tokens), ("--max-num-seqs", max_num_seqs)):
            if given is not None and given < 1:
                raise RooftraceError(f"{name} must be >= 1, got {given}")
        default_tokens, default_seqs = vllm_batch_defaults(dep.hardware)
        tokens = max_num_batched_tokens if max_num_batched_tokens is not None else default_tokens
        seqs = max_num_seqs if max_num_seqs is not None else min(default_seqs, tokens)
        if seqs > tokens:  # as a fleet file's [engine] is refused (pipeline.replay.fleet)
            whose = "" if max_num_batched_tokens is not None else f" (vLLM's default on {dep.hardware.name})"
            raise RooftraceError(
                f"--max-num-seqs {seqs:,} is more than --max-num-batched-tokens {tokens:,}{whose}; vLLM needs "
                "max_num_batched_tokens >= max_num_seqs (a step holds one token of every running sequence)"
            )
        f = fit(dep, gpu_memory_utilization, context, block_size, seqs, tokens, vllm_version or DEFAULT_VLLM_VERSION)
        if as_json:
            emit_json(f.to_dict())
            return f.fits
        ranks = f" per rank, dp {dp} ranks, ep {ep}" if dp > 1 else ""
        click.echo(
            f"{f.model} on {tp * pp}x {f.hardware} (tp {tp}, pp {pp}{ranks}), weights {weight_dtype}, "
            f"KV {kv_dtype}, "
            f"context {f.context:,}"
        )
        click.echo(f"  per GPU: budget {gib(f.budget_bytes_per_gpu)} ({gpu_memory_utilization:.0%} of "
                   f"{gib(f.memory_bytes_per_gpu)})")  # fmt: skip
        click.echo(f"    weights            {gib(f.weights_bytes_per_gpu)}")
        click.echo(f"    activations        {gib(f.activation_bytes_per_gpu)} "
                   f"({f.max_num_batched_tokens:,} batched tokens, {f.max_num_seqs} seqs)")  # fmt: skip
        click.echo(f"    runtime reserve    {gib(f.reserve_bytes_per_gpu)}")
        click.echo(f"    fragmentation      {gib(f.fragmentation_bytes_per_gpu)}")
        click.echo(f"    KV cache           {gib(f.kv_pool_bytes_per_gpu)}")
        click.echo(f"  KV bytes per token   {f.kv_bytes_per_token:,.0f} per GPU"
                   + (f" (+{f.kv_window_bytes_per_token:,.0f} for window layers, ≤{f.sliding_window} tokens)"
                      if f.kv_window_bytes_per_token else ""))  # fmt: skip
        click.echo(f"  KV capacity          {f.kv_capacity_tokens:,} tokens = {f.kv_capacity_blocks:,} blocks"
                   " "
                   f"of {block_size}")  # fmt: skip
        if f.fits:
            click.echo(f"  fits: {fit_capacity_text(f)}")
        else:
            click.echo(
                f"  DOES NOT FIT: short by {gib(f.shortfall_bytes)} per GPU for one {f.context:,}-token sequence"
            )
            for tip in f.suggestions:
                click.echo(f"    - {tip}")
        return f.fits

    if not run(body):
        raise SystemExit(1)
