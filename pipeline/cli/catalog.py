"""``rooftrace catalog``: the hardware and model entries (pipeline/catalog/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.common import check_out_of_store, default_store, emit_json, gib, json_option, progress, run


def _si(x: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:,.4g} {prefix}{unit}"
    return f"{x:,.4g} {unit}"


@click.group("catalog")
def catalog() -> None:
    """Hardware and model entries (pipeline/catalog/*.toml)."""


@catalog.command("list")
@json_option
def catalog_list(as_json: bool) -> None:
    """List hardware and models.

    Example: rooftrace catalog list --json
    """

    def body() -> None:
        from pipeline.catalog import list_hardware, list_models, load_hardware, load_model

        hw = [load_hardware(n) for n in list_hardware()]
        models = [load_model(n) for n in list_models()]
        if as_json:
            emit_json(
                {
                    "hardware": [
                        {
                            "name": h.name,
                            "display_name": h.display_name,
                            "memory_bytes": h.memory_bytes,
                            "memory_bandwidth_bytes_per_s": h.memory_bandwidth_bytes_per_s,
                            "bf16_flops_per_s": h.peak_for("bf16"),
                            "usd_per_gpu_hour": h.price_usd_per_gpu_hour,
                        }
                        for h in hw
                    ],
                    "models": [
                        {
                            "name": m.name,
                            "hf_id": m.hf_id,
                            "attention": m.attention,
                            "total_params": m.total_params(),
                            "active_params": m.active_params(),
                        }
                        for m in models
                    ],
                }
            )
            return
        click.echo("hardware (per GPU; dense bf16 peak):")
        for h in hw:
            click.echo(
                f"  {h.name:15s} {gib(h.memory_bytes):>11s}  "
                f"{_si(h.memory_bandwidth_bytes_per_s, 'B/s'):>11s}  "
                f"{_si(h.peak_for('bf16'), 'FLOP/s'):>14s}  "
                f"${h.price_usd_per_gpu_hour:.2f}/h ({h.price_date})"
            )
        click.echo("models:")
        for m in models:
            active = f" ({m.active_params() / 1e9:.1f}B active)" if m.is_moe else ""
            click.echo(f"  {m.name:16s} {m.total_params() / 1e9:8.1f}B{active:18s} {m.attention:4s} {m.hf_id}")

    run(body)


@catalog.command("show")
@click.argument("name")
@json_option
def catalog_show(name: str, as_json: bool) -> None:
    """Show one hardware or model entry with units.

    Example: rooftrace catalog show h100-sxm
    """

    def body() -> None:
        from pipeline.catalog import list_hardware, list_models, load_hardware, load_model
        from pipeline.catalog.entries import _exists
        from pipeline.common.errors import ConfigError
        from pipeline.common.tomlfile import read_toml
        from pipeline.costmodel.fit import kv_bytes_per_token, kv_window_bytes_per_token

        # a path to a TOML entry (as fit/replay/plan accept): hardware when it has the
        # hardware-only [peak_flops_per_s] table, else a model
        as_path = Path(name).suffix == ".toml" and _exists(Path(name))
        path_is_hw = as_path and "peak_flops_per_s" in read_toml(Path(name), "catalog entry")
        if path_is_hw or (not as_path and name in list_hardware()):
            h = load_hardware(name)
            doc: dict[str, Any] = {
                "kind": "hardware",
                "name": h.name,
                "display_name": h.display_name,
                "vendor": h.vendor,
                "memory_bytes": h.memory_bytes,
                "memory_bandwidth_bytes_per_s": h.memory_bandwidth_bytes_per_s,
                "peak_flops_per_s": dict(h.peak_flops_per_s),
                "link": {
                    "kind": h.link_kind,
                    "bandwidth_bytes_per_s": h.link_bandwidth_bytes_per_s,
                    "latency_s": h.link_latency_s,
                    "gpus_per_node": h.gpus_per_node,
                },
                "efficiency": {
                    "compute": h.compute_efficiency,
                    "memory": h.memory_efficiency,
                    "elementwise": h.elementwise_efficiency,
                    "link": h.link_efficiency,
                    "min_kernel_s": h.min_kernel_s,
                    "step_overhead_s": h.step_overhead_s,
                    "calibrated_on": h.calibrated_on,
                },
                "price": {"usd_per_gpu_hour": h.price_usd_per_gpu_hour, "date": h.price_date},
                "sources": dict(h.sources),
            }
            if as_json:
                emit_json(doc)
                return
            click.echo(f"{h.display_name} [{h.name}]")
            click.echo(f"  memory            {gib(h.memory_bytes)}  at {_si(h.memory_bandwidth_bytes_per_s, 'B/s')}")
            for dtype, peak in h.peak_flops_per_s.items():
                click.echo(f"  peak {dtype:5s}        {_si(peak, 'FLOP/s')} (dense)")
            click.echo(
                f"  link              {h.link_kind}, {_si(h.link_bandwidth_bytes_per_s, 'B/s')} per dir., "
                f"{h.link_latency_s * 1e6:.1f} µs per call, {h.gpus_per_node} GPUs per domain"
            )
            click.echo(
                f"  efficiency        compute {h.compute_efficiency:.3f}, memory {h.memory_efficiency:.3f}, "
                f"elementwise {h.elementwise_efficiency:.3f}, link {h.link_efficiency:.3f}"
            )
            click.echo(
                f"  overheads         min kernel {h.min_kernel_s * 1e6:.1f} µs, step {h.step_overhead_s * 1e3:.3f} ms"
            )
            click.echo(f"  price             ${h.price_usd_per_gpu_hour:.2f} per GPU-hour ({h.price_date})")
            click.echo("  sources:")
            for key, text in h.sources.items():
                click.echo(f"    {key}: {text}")
            return
        if as_path or name in list_models():
            m = load_model(name)
            doc = {
                "kind": "model",
                "name": m.name,
                "hf_id": m.hf_id,
                "source": m.source,
                "attention": m.attention,
                "native_dtype": m.native_dtype,
                "total_params": m.total_params(),
                "active_params": m.active_params(),
                "kv_bytes_per_token_bf16": kv_bytes_per_token(m),
                "kv_window_bytes_per_token_bf16": kv_window_bytes_per_token(m),
                "config": dict(m.config),
            }
            if as_json:
                emit_json(doc)
                return
            click.echo(f"{m.name} ({m.hf_id}) — {m.source}")
            click.echo(
                f"  parameters        {m.total_params() / 1e9:.2f}B total, {m.active_params() / 1e9:.2f}B active"
            )
            click.echo(
                f"  shape             {m.num_layers} layers, hidden {m.hidden_size}, "
                f"{m.num_attention_heads} heads / {m.num_kv_heads} KV heads of {m.q_head_dim} ({m.attention})"
            )
            if m.is_moe:
                click.echo(
                    f"  MoE               {m.num_experts} experts, top-{m.experts_per_token}, "
                    f"{m.num_shared_experts} shared, {m.first_dense_layers} dense layers first"
                )
            if m.sliding_window:
                click.echo(f"  sliding window    {m.sliding_window} tokens on {m.num_sliding_layers} layers")
            click.echo(f"  KV cache (bf16)   {kv_bytes_per_token(m):,.0f} bytes per token (full-attention layers)")
            click.echo(f"  native weights    {m.native_dtype}")
            return
        raise ConfigError(f"no hardware or model named {name!r}; see `rooftrace catalog list`")

    run(body)


@catalog.command("import-hf")
@click.argument("config_json", type=click.Path(dir_okay=False))
@click.option(
    "--name",
    default=None,
    help="Catalog name (file stem): 1-64 letters, digits, '.', '_' or '-', not starting with '.'; "
    "default: from --hf-id or the folder.",
)
@click.option("--hf-id", default="", help="Hugging Face repository id, recorded as the source (needed with --out).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the TOML here (only an entry the catalog reads back; needs --hf-id).",
)
@json_option
def catalog_import_hf(config_json: str, name: str | None, hf_id: str, out: str | None, as_json: bool) -> None:
    """Turn a Hugging Face config.json into a catalog model entry.

    Example: rooftrace catalog import-hf config.json --hf-id Qwen/Qwen3-8B --out qwen3-8b.toml
    """

    def body() -> None:
        from pipeline.catalog import import_hf_config
        from pipeline.catalog.entries import write_model_entry

        if out:
            check_out_of_store(default_store(), out, "--out")  # (not over the files of the store commands use)
        spec, text = import_hf_config(Path(config_json), name=name, hf_id=hf_id)
        if out:
            write_model_entry(Path(out), text)
            progress(f"wrote {out}")
        if as_json:
            emit_json(
                {
                    "name": spec.name,
                    "attention": spec.attention,
                    "total_params": spec.total_params(),
                    "active_params": spec.active_params(),
                    "toml": text,
                    "written_to": out,
                }
            )
        elif not out:
            click.echo(text, nl=False)

    run(body)


#: The files ``catalog schema`` describes (pipeline/common/tomlschema.py, EDITOR_SCHEMAS; a test keeps
#: the two lists equal, so ``--help`` needs no pydantic).
SCHEMA_KINDS = ("fleet", "pooled-fleet", "hardware", "model", "mapping", "prices", "project")


@catalog.command("schema")
@click.argument("kind", type=click.Choice(SCHEMA_KINDS))
def catalog_schema(kind: str) -> None:
    """Print the JSON Schema of a TOML file kind, for editors: FLEET.toml (fleet), a hardware or
    model entry, an ingest mapping, a price table or rooftrace.toml (project). The same files are
    in schemas/editor/; with Taplo / Even Better TOML, put "#:schema PATH" on a file's first line.

    Example: rooftrace catalog schema fleet > fleet.schema.json
    """

    def body() -> None:
        from pipeline.common.tomlschema import schema_text

        click.echo(schema_text(kind), nl=False)

    run(body)


@catalog.command("resolve")
@click.argument("names", nargs=-1, required=True)
@json_option
def catalog_resolve(names: tuple[str, ...], as_json: bool) -> None:
    """Which catalog model each logged model name stands for, and why: Hugging Face ids, provider
    prefixes, -Instruct / -FP8-style variants, and the project's [models] aliases (rooftrace.toml);
    the rules the replay, plan and classify use (docs/catalog.md, "Model names in logs"). Exit 1
    when a name resolves to no model, or to more than one.

    Example: rooftrace catalog resolve hosted_vllm/meta-llama/Llama-3.1-70B-Instruct my-deployment
    """
    from pipeline.catalog.names import resolve_model_names
    from pipeline.common.terminal import escape_controls
    from pipeline.ingest.project import find_project

    matches = run(lambda: resolve_model_names(names, aliases=find_project().models))
    found = [matches[n] for n in dict.fromkeys(names)]
    if as_json:
        keys = ("logged", "model", "how", "detail")
        emit_json([{**{k: getattr(m, k) for k in keys}, "candidates": list(m.candidates)} for m in found])
    else:
        for m in found:
            click.echo(escape_controls(m.describe()))
    if any(m.model is None for m in found):
        raise SystemExit(1)
