"""Click commands: ``catalog list|show|import-hf``, ``fit``, ``validate``, ``calibrate``.

Each command parses options, calls one library function and prints (or, with --json, emits one
JSON document on stdout). Errors surface as one line and exit code 1 through cli_common.run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from pipeline.cli_common import emit_json, get_store, json_option, progress, run, store_option
from pipeline.errors import RooftraceError


def _gib(x: float) -> str:
    return f"{x / 2**30:,.2f} GiB"


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
                f"  {h.name:15s} {_gib(h.memory_bytes):>11s}  "
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
        from pipeline.errors import ConfigError
        from pipeline.memory import kv_bytes_per_token, kv_window_bytes_per_token

        if name in list_hardware():
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
            click.echo(f"  memory            {_gib(h.memory_bytes)}  at {_si(h.memory_bandwidth_bytes_per_s, 'B/s')}")
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
        if name in list_models():
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
@click.option("--name", default=None, help="Catalog name (file stem); default: from --hf-id or the folder.")
@click.option("--hf-id", default="", help="Hugging Face repository id, recorded as the source.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the TOML here.")
@json_option
def catalog_import_hf(config_json: str, name: str | None, hf_id: str, out: str | None, as_json: bool) -> None:
    """Turn a Hugging Face config.json into a catalog model entry.

    Example: rooftrace catalog import-hf config.json --hf-id Qwen/Qwen3-8B --out qwen3-8b.toml
    """

    def body() -> None:
        from pipeline.catalog import import_hf_config
        from pipeline.schemas import atomic_write_bytes

        spec, text = import_hf_config(Path(config_json), name=name, hf_id=hf_id)
        if out:
            atomic_write_bytes(Path(out), text.encode())
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


@click.command("fit")
@click.option("--model", "model_name", required=True, help="Catalog model name (or a .toml path).")
@click.option("--hardware", "hardware_name", required=True, help="Catalog hardware name (or a .toml path).")
@click.option("--tp", default=1, show_default=True, type=int, help="Tensor-parallel GPUs.")
@click.option("--pp", default=1, show_default=True, type=int, help="Pipeline-parallel stages.")
@click.option(
    "--dp", default=1, show_default=True, type=int, help="Data-parallel ranks (MoE: experts over tp x dp GPUs)."
)
@click.option("--ep", default=1, show_default=True, type=int, help="Expert-parallel size: 1 or tp x dp.")
@click.option("--weights", "weight_dtype", default="bf16", show_default=True, help="Weight format (dtypes.toml).")
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
    help="vLLM release whose memory accounting to follow (default: pipeline.memory.DEFAULT_VLLM_VERSION).",
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

    def body() -> bool:
        from pipeline.catalog import load_hardware, load_model
        from pipeline.memory import fit
        from pipeline.roofline import Deployment

        dep = Deployment(
            load_model(model_name), load_hardware(hardware_name), tp=tp, pp=pp, ep=ep, dp=dp,
            weight_dtype=weight_dtype, kv_dtype=kv_dtype,
        )  # fmt: skip
        from pipeline.fleet import vllm_batch_defaults
        from pipeline.memory import DEFAULT_VLLM_VERSION

        default_tokens, default_seqs = vllm_batch_defaults(dep.hardware)
        tokens = max_num_batched_tokens if max_num_batched_tokens is not None else default_tokens
        seqs = max_num_seqs if max_num_seqs is not None else min(default_seqs, tokens)
        for name, value in (("--max-num-seqs", seqs), ("--max-num-batched-tokens", tokens)):
            if value < 1:
                raise RooftraceError(f"{name} must be >= 1, got {value}")
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
        click.echo(f"  per GPU: budget {_gib(f.budget_bytes_per_gpu)} ({gpu_memory_utilization:.0%} of "
                   f"{_gib(f.memory_bytes_per_gpu)})")  # fmt: skip
        click.echo(f"    weights            {_gib(f.weights_bytes_per_gpu)}")
        click.echo(f"    activations        {_gib(f.activation_bytes_per_gpu)} "
                   f"({f.max_num_batched_tokens:,} batched tokens, {f.max_num_seqs} seqs)")  # fmt: skip
        click.echo(f"    runtime reserve    {_gib(f.reserve_bytes_per_gpu)}")
        click.echo(f"    fragmentation      {_gib(f.fragmentation_bytes_per_gpu)}")
        click.echo(f"    KV cache           {_gib(f.kv_pool_bytes_per_gpu)}")
        click.echo(f"  KV bytes per token   {f.kv_bytes_per_token:,.0f} per GPU"
                   + (f" (+{f.kv_window_bytes_per_token:,.0f} for window layers, ≤{f.sliding_window} tokens)"
                      if f.kv_window_bytes_per_token else ""))  # fmt: skip
        click.echo(f"  KV capacity          {f.kv_capacity_tokens:,} tokens = {f.kv_capacity_blocks:,} blocks"
                   " "
                   f"of {block_size}")  # fmt: skip
        if f.fits:
            click.echo(f"  fits: {f.max_concurrent_seqs(f.context):,} concurrent sequences of {f.context:,} tokens")
        else:
            click.echo(
                f"  DOES NOT FIT: short by {_gib(f.shortfall_bytes)} per GPU for one {f.context:,}-token sequence"
            )
            for tip in f.suggestions:
                click.echo(f"    - {tip}")
        return f.fits

    if not run(body):
        raise SystemExit(1)


def _default_measurements() -> Path:
    env = os.environ.get("ROOFTRACE_MEASUREMENTS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "measurements"


def _pct(x: float) -> str:
    return f"{x:6.1%}"


@click.command("validate")
@click.option(
    "--measurements",
    type=click.Path(),
    default=None,
    help="Folder (or file) of operator measurements: AIConfigurator / LLMServingSim sets (the measured "
    "profiles' held-out check) and Vidur mlp.csv / all_reduce.csv / Splitwise perf_model.csv (the roofline's) "
    "(default: $ROOFTRACE_MEASUREMENTS or ../shared/measurements).",
)
@click.option(
    "--hardware",
    default=None,
    help="Only this catalog GPU (profiles); for your own Vidur/Splitwise tables, the GPU of every row.",
)
@store_option
@json_option
def validate_cmd(measurements: str | None, hardware: str | None, store_path: str | None, as_json: bool) -> None:
    """Judge the cost model on measurements it was not built from; print and store the error tables
    under STORE/validation/.

    Two tiers: the measured profiles' interpolation, held out by shape (whole GEMM n x k shapes,
    whole head shapes, whole models of another set, mixed batches never fitted), split by operator
    class and token range (1-127, 128+); and the roofline with catalog and calibrated factors
    (Vidur, Splitwise). docs/validation.md explains both.

    Example: rooftrace validate --measurements path/to/measurements --json
    """

    def body() -> bool:
        from pipeline.profile.heldout import TARGET_MEDIAN, TARGET_P90, has_profile_sets, judge_all
        from pipeline.schemas import write_parquet
        from pipeline.validate import discover, run_validation, store_report

        source = Path(measurements) if measurements else _default_measurements()
        if not source.exists():
            raise RooftraceError(f"{source}: no such file or folder of measurements")
        progress(f"validating against {source}")
        store = get_store(store_path)
        doc: dict[str, Any] = {"files": [], "skipped": []}
        ok = True
        profile = None
        if has_profile_sets(source):
            profile, skipped = judge_all(source, [hardware] if hardware else None, progress)
            doc["skipped"] += skipped
            if profile.height:
                with store.lock():
                    path = write_parquet(profile.to_arrow(), store.root / "validation" / "profile_heldout.parquet",
                                         "profile_heldout")  # fmt: skip
                doc["files"].append(str(path))
                doc["profile_heldout"] = profile.to_dicts()
        try:
            legacy_files = discover(source)
        except RooftraceError:
            legacy_files = []
        report = None
        if legacy_files:
            report = run_validation(source, hardware if profile is None else None)
            with store.lock():
                doc["files"] += [str(p) for p in store_report(report, store.root / "validation")]
            summary = report.summary.filter(report.summary["split"] != "train")
            doc["summary"] = summary.to_dicts()
            doc["calibrations"] = [
                {"kind": c.kind, "hardware": c.hardware, "params": c.params, "n_train": c.n_train,
                 "n_holdout": c.n_holdout, "description": c.description}
                for c in report.calibrations
            ]  # fmt: skip
            doc["skipped"] += report.skipped
        if profile is None and report is None:
            raise RooftraceError(f"{source}: no operator measurements rooftrace reads (see --help)")
        progress(f"wrote {', '.join(doc['files'])}")
        if as_json:
            emit_json(doc)
            return ok
        if profile is not None and profile.height:
            click.echo(
                f"measured profiles, held out by shape (target: median <= {TARGET_MEDIAN:.0%}, p90 <= {TARGET_P90:.0%})"
            )
            click.echo(
                f"{'gpu':14s} {'check':45s} {'tokens':7s} {'N':>7s} {'median':>7s} {'p90':>7s} {'bias':>7s}  target"
            )
            for r in profile.iter_rows(named=True):
                click.echo(
                    f"{r['gpu']:14s} {r['check']:45s} {r['token_range']:7s} {r['rows']:7d} {_pct(r['median_abs'])} "
                    f"{_pct(r['p90_abs'])} {r['median_signed']:+7.1%}  {'met' if r['meets'] else 'MISSED'}"
                )
        if report is not None:
            click.echo("roofline tier (Vidur, Splitwise):")
            click.echo(f"{'set':17s} {'subset':25s} {'hardware':14s} {'params':10s} {'split':7s} "
                       f"{'N':>6s} {'median':>7s} {'p90':>7s} {'max':>7s}")  # fmt: skip
            for r in doc["summary"]:
                click.echo(
                    f"{r['set']:17s} {r['subset']:25s} {r['hardware']:14s} {r['parameters']:10s} {r['split']:7s} "
                    f"{r['n']:6d} {_pct(r['median_abs_error'])} {_pct(r['p90_abs_error'])} "
                    f"{_pct(r['max_abs_error'])}"
                )
            click.echo("fitted (calibrated rows):")
            for c in report.calibrations:
                values = ", ".join(f"{k}={v:.4g}" for k, v in c.params.items())
                click.echo(f"  {c.kind} / {c.hardware}: {values} — {c.n_train} train rows, {c.n_holdout} held out")
        for note in dict.fromkeys(doc["skipped"]):
            progress(f"skipped: {note}")
        return ok

    run(body)


@click.command("calibrate")
@click.option(
    "--measurements",
    required=True,
    type=click.Path(),
    help="Operator measurements: a folder with AIConfigurator / LLMServingSim sets (builds GPU profiles), "
    "or a Vidur / Splitwise CSV (fits one GPU's roofline factors; needs --hardware).",
)
@click.option(
    "--hardware", default=None, help="Catalog GPU: the only profile to build, or the GPU whose factors to fit."
)
@click.option("--out", type=click.Path(), default=None,
              help="Profiles: folder to write <gpu>/ into (default: the catalog's profiles). "
                   "Factors: hardware TOML to write (default: <hardware>-calibrated.toml here).")  # fmt: skip
@json_option
def calibrate_cmd(measurements: str, hardware: str | None, out: str | None, as_json: bool) -> None:
    """Build measured GPU profiles from operator tables, or fit one GPU's roofline factors.

    With AIConfigurator / LLMServingSim sets: writes pipeline/catalog/profiles/<gpu>/ (the rows,
    and profile.toml with their sources, selection, fitted values and held-out errors); replays
    then price steps from the GPU's profile by default (FLEET.toml cost_model).

    Example: rooftrace calibrate --measurements path/to/measurements --hardware h100-sxm
    Example: rooftrace calibrate --measurements perf_model.csv --hardware h100-sxm --out h100-splitwise.toml
    """

    def body() -> None:
        from pipeline.profile.heldout import has_profile_sets

        source = Path(measurements)
        if not source.exists():
            raise RooftraceError(f"{source}: no such file or folder of measurements")
        if has_profile_sets(source):
            _calibrate_profiles(source, hardware, out, as_json)
            return
        if hardware is None:
            what = "holds no AIConfigurator or LLMServingSim set; a" if source.is_dir() else "a"
            raise RooftraceError(
                f"{source}: {what} Vidur or Splitwise table needs --hardware (the GPU whose factors to fit)"
            )
        from pipeline.validate import calibrate, write_calibrated

        target = Path(out) if out else Path(f"{hardware}-calibrated.toml")
        result = calibrate(source, hardware, name=target.stem)
        write_calibrated(result, target)
        progress(f"wrote {target}")
        doc = {
            "hardware": result.hardware.name,
            "written_to": str(target),
            "fitted": result.calibration.params,
            "fitted_on": result.calibration.description,
            "n_train": result.calibration.n_train,
            "n_holdout": result.calibration.n_holdout,
            "train_median_abs_error": result.train_median_abs_error,
            "holdout_median_abs_error": result.holdout_median_abs_error,
            "holdout_median_abs_error_before": result.before_median_abs_error,
        }
        if as_json:
            emit_json(doc)
            return
        click.echo(f"fitted {', '.join(f'{k}={v:.4g}' for k, v in result.calibration.params.items())}")
        click.echo(f"  on: {result.calibration.description}")
        click.echo(
            f"  median abs error: train {result.train_median_abs_error:.1%}, hold-out "
            f"{result.holdout_median_abs_error:.1%} (catalog factors: {result.before_median_abs_error:.1%})"
        )

    run(body)


def _calibrate_profiles(source: Path, hardware: str | None, out: str | None, as_json: bool) -> None:
    from pipeline.profile.build import build_profiles
    from pipeline.profile.tables import PROFILES_DIR

    target = Path(out) if out else PROFILES_DIR
    if hardware is not None:
        from pipeline.catalog import load_hardware

        load_hardware(hardware)  # a one-line error for an unknown name
    built = build_profiles(source, target, [hardware] if hardware else None, progress)
    if not built:
        raise RooftraceError(f"{source}: no GPU{' ' + hardware if hardware else ''} found in the measurements")
    doc = [{"gpu": b.gpu, "folder": str(b.folder), "rows": b.rows, "heldout": b.heldout} for b in built]
    progress(f"wrote {len(built)} profile(s) under {target}")
    if as_json:
        emit_json({"profiles": doc})
        return
    for b in built:
        rows = ", ".join(f"{k} {v:,}" for k, v in sorted(b.rows.items()))
        click.echo(f"{b.gpu}: {rows} -> {b.folder}")
        for name, e in sorted(b.heldout.items()):
            click.echo(f"    held out {name:52s} median {e['median_abs_error']:6.1%}  p90 {e['p90_abs_error']:6.1%}")
