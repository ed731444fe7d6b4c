"""``rooftrace plan``: the cheapest fleet whose replay meets the SLO (pipeline/plan/)."""

from __future__ import annotations

from typing import Any

import click

from pipeline.cli.common import (
    cost_stack_options,
    echo,
    emit_json,
    fmt_num,
    get_store,
    json_option,
    old_option_name,
    option_value,
    progress,
    run,
    store_option,
    warn,
)
from pipeline.common.defaults import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_PD_LINK,
    DEFAULT_PD_RATIOS,
    DEFAULT_PLAN_MODES,
    DEFAULT_PLAN_OFFLOAD_GB,
    DEFAULT_PLAN_OFFLOAD_KIND,
    DEFAULT_PLAN_OFFLOAD_STORE_GB,
    DEFAULT_PLAN_SPECULATIVE,
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    plan_default_hardware,
    plan_default_hardware_text,
)
from pipeline.common.errors import ConfigError


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in _csv(text))
    except ValueError:
        raise ConfigError(f"{option}: expected comma-separated integers, got {text!r}") from None


def _gpu_prices(items: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """HARDWARE=USD_PER_GPU_HOUR items (the plan stage checks the names and prices)."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            raise ConfigError(f"--gpu-price {item!r}: expected HARDWARE=USD_PER_GPU_HOUR") from None
        if not sep or not name.strip():
            raise ConfigError(f"--gpu-price {item!r}: expected HARDWARE=USD_PER_GPU_HOUR")
        out.append((name.strip(), price))
    return tuple(out)


def fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.0f}ms" if x < 1 else f"{x:.2f}s"


def fmt_latency(x: float | None) -> str:
    """A table's latency: ms below 1 s, then pipeline.replay.slo's readable durations (s, min, h, days),
    so an hours-long p99 reads '3.45 h', not '12428.63s'."""
    from pipeline.common.units import format_seconds

    if x is None:
        return "-"
    return f"{x * 1e3:.0f}ms" if x < 1 else format_seconds(x).replace(" ", "")


def _share(text: str, option: str) -> float:
    """``0.1%`` or ``0.001`` as a fraction."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a share like 0.1% or 0.001", param_hint=option) from None
    if not 0.0 <= value <= 1.0:
        raise click.BadParameter(f"{text!r} must be between 0% and 100%", param_hint=option)
    return value


#: The --objective columns, said under the header.
OBJECTIVE_COLUMNS = (
    "    (stack $/day: the full cost stack a day, docs/economics.md; kWh/day: the GPUs' board energy a day, "
    "busy spans at the power model, the rest idle)"
)

#: What the table's share columns are, said under its header: busy time is near 100 % whenever
#: the replicas step continuously (continuous batching), so it does not say how full a step is;
#: the peak phase loads and the KV peak do.
PLAN_COLUMNS = (
    "    (busy: time stepping; pre/dec: peak-minute fresh prefill / decode tokens/s of the roofline ceiling; "
    "KV: peak KV-cache use; SLO slack: how far the worst target is below its limit, 1 − p99/limit)"
)


@click.command("plan")
@click.option("--model", default=None, help="Catalog model to serve (pipeline/catalog/models); required.")
@click.option(
    "--slo",
    default="chat",
    show_default=True,
    help="Preset (interactive, chat, batch, mlperf-server, mlperf-interactive) and/or targets such as "
    "ttft_p99=2s,tpot_p99=100ms; `--list-slos` shows the presets.",
)
@click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False), default=None, help="Base FLEET.toml.")
@click.option(
    "--hardware",
    default=None,
    help=f"Hardware to try.  [default: {plan_default_hardware_text()}, the list in pipeline/catalog/plan.toml]",
)
@click.option("--tp", default="1,2,4,8", show_default=True, help="Tensor-parallel sizes to try.")
@click.option(
    "--weight-dtype",
    "precision",
    default="",
    help="Weight dtypes to try, as FLEET.toml's weight_dtype (default: the base fleet's), e.g. bf16,fp8.",
)
@old_option_name("--precision", "--weight-dtype", "precision")
@click.option("--date", default=None, help="Traffic date YYYY-MM-DD (default: the latest in the store).")
@click.option(
    "--window",
    type=click.Choice(["peak", "day"]),
    default="peak",
    show_default=True,
    help="Replay the busiest --window-s seconds of the day, or the whole day.",
)
@click.option(
    "--window-s", type=click.FloatRange(min=1), default=DEFAULT_WINDOW_S, show_default=True, help="Peak window length."
)
@click.option(
    "--warmup-s",
    type=click.FloatRange(min=0),
    default=DEFAULT_WARMUP_S,
    show_default=True,
    help="Seconds replayed before the window but not measured (fills the batch and cache).",
)
@click.option(
    "--traffic-model",
    default=None,
    help="The requests' logged model name, or a name resolving to a catalog model (default: the names "
    "resolving to --model, and rows without one; '*' = all).",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Run configurations in local processes or on a Ray cluster (optional extra).",
)
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Local processes (default: CPU count).")
@click.option("--ray-address", default=None, help="Ray cluster address for --executor ray (default: auto).")
@click.option(
    "--max-replicas",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_REPLICAS,
    show_default=True,
    help="Give up on a configuration above this many replicas.",
)
@click.option("--gpu-price", multiple=True, help="Override a GPU price: HARDWARE=USD_PER_GPU_HOUR (repeatable).")
@click.option(
    "--prices",
    "price_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Price TOML added to the bundled tables (docs/economics.md).",
)
@click.option(
    "--max-rejected",
    default="0",
    show_default=True,
    help="Share of the measured requests a configuration may reject and still meet the SLO (0.1% or 0.001).",
)
@click.option(
    "--modes",
    default=DEFAULT_PLAN_MODES,
    show_default=True,
    help="Serving modes to search, comma-separated: colocated, disaggregated (prefill and decode pools of the "
    "same GPU and TP, at each --pd-ratios), speculative (--speculative), offload (a KV offload tier of each "
    "--offload-gb), disaggregated-speculative (its decode pool speculates); the output shows the cheapest per mode.",
)
@click.option(
    "--pd-ratios",
    default=DEFAULT_PD_RATIOS,
    show_default=True,
    help="Disaggregated: prefill:decode replica ratios tried (each side 1..16).",
)
@click.option(
    "--link",
    default=DEFAULT_PD_LINK,
    show_default=True,
    help="Disaggregated: the link kind the KV crosses (nvlink, infiniband, rdma, ethernet, pcie).",
)
@click.option(
    "--speculative",
    default=DEFAULT_PLAN_SPECULATIVE,
    show_default=True,
    help="Speculative: METHOD:K (eagle3, eagle, mtp, ngram; K draft tokens); acceptance from the catalog.",
)
@click.option(
    "--offload-gb",
    default=DEFAULT_PLAN_OFFLOAD_GB,
    show_default=True,
    help="Offload: GB of the KV offload tier, per replica for cpu (host DRAM, at most the host's: 256 GB per GPU "
    "by default) or for the pool for shared; a list such as 256,512 tries each.",
)
@click.option(
    "--offload-kind",
    default=DEFAULT_PLAN_OFFLOAD_KIND,
    show_default=True,
    help="Offload: the tier's kind, cpu (each replica's host DRAM over PCIe) or shared (one store over RDMA).",
)
@click.option(
    "--offload-store-gb",
    default=DEFAULT_PLAN_OFFLOAD_STORE_GB,
    help="Offload, three levels: GB of a store shared by the pool below each cpu tier (FLEET.toml "
    "[kv_offload.shared]); a list such as 2000,8000 tries each, beside the cpu tier alone (default: none).",
)
@click.option(
    "--autoscale",
    is_flag=True,
    help="Also price the chosen configuration autoscaled by the --fleet's [autoscale] policy (up to its replicas) "
    "over the whole day, beside static.",
)
@click.option(
    "--objective",
    default=None,
    help="Choose the passing configuration by usd (its full cost stack a day), energy (GPU kWh a day) or gpus; "
    "adds each one's stack $/day and kWh/day. Default: the GPUs' $/day, the plan as it always was.",
)
@cost_stack_options("--objective: ")
@click.option("--list-slos", is_flag=True, help="Print the SLO presets with their numbers and sources, then exit.")
@store_option
@json_option
def plan_cmd(
    model: str | None,
    slo: str,
    fleet_path: str | None,
    hardware: str | None,
    tp: str,
    precision: str,
    date: str | None,
    window: str,
    window_s: float,
    warmup_s: float,
    traffic_model: str | None,
    executor: str,
    jobs: int | None,
    ray_address: str | None,
    max_replicas: int,
    gpu_price: tuple[str, ...],
    price_files: tuple[str, ...],
    max_rejected: str,
    modes: str,
    pd_ratios: str,
    link: str,
    speculative: str,
    offload_gb: str,
    offload_kind: str,
    offload_store_gb: str,
    autoscale: bool,
    objective: str | None,
    purchase: str | None,
    spot_interruptions_per_day: float | None,
    spot_restart_s: float | None,
    redundancy: int | None,
    network: str | None,
    storage: str | None,
    operations: str | None,
    margin: float | None,
    electricity: bool | None,
    list_slos: bool,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Find the cheapest fleet whose replay of the traffic meets the latency SLOs.

    For every hardware x TP (x weight dtype) that fits the model, searches the minimum replicas whose
    replay of the peak window (or the day) meets every SLO target, then ranks by $/day and marks the
    Pareto front of cost vs p99 TTFT. Writes STORE/plans/<plan_id>/ and STORE/costs/<plan_id>/.

    The traffic is the date's requests whose logged model name resolves to --model (a Hugging Face id,
    a provider prefix, an -Instruct or quantized copy, a [models] alias in rooftrace.toml) and those
    logged without one; --traffic-model picks another.

    Example, in the checkout after `rooftrace demo` (its log names meta-llama/Llama-3.1-8B-Instruct):

    \b
    rooftrace plan --model llama-3.1-8b --fleet fleets/demo.toml --slo ttft_p99=2s,tpot_p99=100ms --tp 1,2
    """
    from pipeline.plan import PlanOptions, plan
    from pipeline.plan.modes import (
        frontier_lines,
        parse_offload_gb,
        parse_ratios,
        parse_speculative,
        unused_mode_options,
    )
    from pipeline.replay.slo import load_slo_presets

    if list_slos:
        presets = run(load_slo_presets)
        if as_json:
            emit_json({k: v.to_dict() for k, v in presets.items()})
            return
        for p in presets.values():
            targets = ", ".join(f"{t.name} <= {fmt_s(t.limit_s)}" for t in p.targets)
            click.echo(f"{p.name:<20} {targets:<40} {p.description}")
            click.echo(f"{'':<20} source: {p.source}")
        return

    if model is None:
        raise click.UsageError("Missing option '--model'.")
    from pipeline.engine.jitcache import compile_ahead

    compile_ahead()  # a fresh clone's first plan: the engine compiles meanwhile (its workers wait for it)
    given = click.get_current_context().get_parameter_source("window_s")
    if window == "day" and given == click.core.ParameterSource.COMMANDLINE:
        # (it was ignored without a word): the whole day has no window length
        raise click.UsageError(
            "--window-s is the length of the peak window (--window peak); --window day replays the whole day"
        )

    ctx = click.get_current_context()
    set_here = [
        f"--{p.name.replace('_', '-')}"
        for p in ctx.command.params
        if p.name and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE
    ]
    unused = unused_mode_options(set_here, _csv(modes))  # (said after the plan: an error stays one line)
    stack = {
        "purchase": purchase,
        "spot_interruptions_per_day": spot_interruptions_per_day,
        "spot_restart_s": spot_restart_s,
        "redundancy_replicas": redundancy,
        "network": network,
        "storage": storage,
        "operations": operations,
        "margin_percent": margin,
        "electricity": electricity,
    }

    def body() -> Any:
        opts = PlanOptions(
            model=model,
            slo=slo,
            fleet_path=fleet_path,
            hardware=_csv(hardware) if hardware is not None else plan_default_hardware(),
            tp=_ints(tp, "--tp"),
            precision=_csv(option_value("precision", precision, "--weight-dtype")),
            date=date,
            window=window,
            window_s=window_s,
            warmup_s=warmup_s,
            traffic_model=traffic_model,
            executor=executor,
            jobs=jobs,
            ray_address=ray_address,
            max_replicas=max_replicas,
            gpu_prices=_gpu_prices(gpu_price),
            price_files=price_files,
            max_rejected=_share(max_rejected, "--max-rejected"),
            modes=_csv(modes),
            pd_ratios=parse_ratios(pd_ratios),
            link=link.strip(),
            speculative=parse_speculative(speculative),
            offload_gb=parse_offload_gb(offload_gb),
            offload_kind=offload_kind.strip(),
            offload_store_gb=parse_offload_gb(offload_store_gb, "--offload-store-gb"),
            autoscale=autoscale,
            objective=objective.strip() if objective is not None else None,
            cost_options=tuple((k, v) for k, v in stack.items() if v is not None),
        )
        return plan(get_store(store_path), opts, progress=progress)

    result = run(body)
    for line in unused:
        click.echo(f"plan: {line}", err=True)
    doc = result.doc
    if as_json:  # the same exit code as the text: 1 when no configuration meets the SLO
        emit_json({"plan_dir": str(result.plan_dir), **doc})
        if doc["chosen"] is None:
            click.echo(f"no configuration meets the SLO (each one's note says why); {doc['advice']}", err=True)
            raise SystemExit(1)
        return
    click.echo(f"plan {result.plan_id} -> {result.plan_dir}")
    click.echo(f"SLO {doc['slo']['name']}: {doc['slo']['targets']}")
    header = (
        f"{'#':>3} {'config':<24} {'GPUs':>5} {'repl':>4} {'TTFT99':>8} {'TPOT99':>8} {'busy':>5} {'pre':>5} "
        f"{'dec':>5} {'KV':>5} {'SLO slack':>9} {'binds':<12} {'$/day':>10} {'$/Mtok':>7} {'priced by':<9} pareto"
    )
    by = doc.get("objective")
    if by:  # --objective: the full cost stack a day and the GPUs' energy a day beside each row
        header += f" {'stack $/day':>11} {'kWh/day':>9}"
    click.echo(header)
    click.echo(PLAN_COLUMNS)
    if by:
        click.echo(OBJECTIVE_COLUMNS)
    for r in doc["configurations"]:
        if not r["meets_slo"]:
            # a replay that did not keep up never meets the plan: said in its row (plan.json: overloaded)
            over = " [OVERLOADED]" if r.get("overloaded") else ""
            echo(f"{'-':>3} {r['config']:<24}{over} {r['note']}")  # (a note may name a logged model)
            continue
        click.echo(
            f"{r['rank']:>3} {r['config']:<24} {r['gpus']:>5} {r['replicas']:>4} "
            f"{fmt_latency(r['ttft_p99_s']):>8} {fmt_latency(r['tpot_p99_s']):>8} "
            f"{fmt_num(r['utilization'], '.0%'):>5} {fmt_num(r.get('prefill_utilization'), '.0%'):>5} "
            f"{fmt_num(r.get('decode_utilization'), '.0%'):>5} {fmt_num(r.get('kv_peak_fraction'), '.0%'):>5} "
            f"{fmt_num(r['slo_headroom'], '.0%'):>9} "
            f"{r['binding'] or '-':<12} {fmt_num(r['usd_per_day'], ',.0f'):>10} "
            f"{fmt_num(r['usd_per_million_tokens'], '.3f'):>7} {r.get('priced_by') or '-':<9} "
            f"{'*' if r['pareto'] else ''}" + (objective_cells(r) if by else "")
        )
    if doc.get("frontier"):
        for line in frontier_lines(doc["frontier"]):
            echo(line)
    chosen = doc["chosen"]
    if chosen is None:
        click.echo(f"no configuration meets the SLO (reasons above); {doc['advice']}", err=True)
        raise SystemExit(1)
    if by:
        click.echo(f"{by['verdict']}; binds on {chosen['sizing']['binding']}")
    else:
        click.echo(
            f"cheapest: {chosen['replicas']}x {chosen['config']} ({chosen['gpus']} GPUs, "
            f"${chosen['usd_per_day']:,.0f}/day); binds on {chosen['sizing']['binding']}"
        )
    click.echo(plan_band_line(chosen))
    scaled = doc.get("autoscale")
    if scaled:
        verdict = "meets the SLO" if scaled["autoscaled_meets_slo"] else "MISSES the SLO"
        click.echo(
            f"static {scaled['static_replicas']}x {scaled['config']} all day: {scaled['static_gpu_hours']:,.2f} GPU-h, "
            f"${scaled['static_usd']:,.2f}; autoscaled ({scaled['policy']['signal']}, "
            f"{scaled['policy']['min_replicas']}..{scaled['policy']['max_replicas']}, scale-up delay "
            f"{scaled['scale_up_delay_s']:.0f} s): {scaled['autoscaled_gpu_hours']:,.2f} GPU-h, "
            f"${scaled['autoscaled_usd']:,.2f}, {verdict} over the day"
        )
        if scaled.get("autoscaled_slo_miss"):
            warn(str(scaled["autoscaled_slo_miss"]))
    for r in doc["configurations"]:  # a chosen replica across nodes: its latencies are optimistic
        if r["meets_slo"] and r["config"] == chosen["config"] and str(r.get("note") or "").startswith("MULTI-NODE"):
            warn(str(r["note"]))
    period = chosen.get("replay_period") or {}
    valid = period.get("unit_costs_valid", True) or doc["window"].get("kind") != "day"
    bad = "" if valid else f" ({period.get('unit_costs_flag')})"
    if not valid:  # a day replayed by a fleet that fell behind: priced over its makespan, as `cost` does
        click.echo(period.get("unit_costs_note"))
        usd = chosen.get("stack_usd_per_period", chosen["usd_per_period"])
        click.echo(f"over {period.get('period_text')}: self-hosted ${usd:,.2f}")
    else:
        stack = chosen.get("stack_usd_per_period")
        usd = f"${stack:,.2f} (full cost stack)" if stack is not None else f"${chosen['usd_per_period']:,.2f}"
        click.echo(f"over the period of record ({doc['day_projection']}): self-hosted {usd}")
    from pipeline.economics.cost import STALE_AFTER_DAYS

    for a in doc["api_equivalent"]:
        stale = f", STALE price: checked over {STALE_AFTER_DAYS} days ago" if a.get("price_stale") else ""
        click.echo(
            f"  vs {a['provider']}/{a['api_model']} ({a['price_date']}{stale}): API ${a['api_usd']:,.2f}, "
            f"self-host/API {fmt_num(a['self_host_to_api_ratio'], '.2f')}{bad}"
        )
    progress(f"{doc['replays']} replays in {doc['search_wall_s']:.1f} s")


def objective_cells(r: dict[str, Any]) -> str:
    """An --objective row's stack $/day and kWh/day, under their headers (after 'pareto')."""
    stack, kwh = fmt_num(r.get("stack_usd_per_day"), ",.0f"), fmt_num(r.get("gpu_kwh_per_day"), ",.1f")
    return f"{'':<{6 - (1 if r['pareto'] else 0)}} {stack:>11} {kwh:>9}"


def plan_band_line(chosen: dict[str, Any]) -> str:
    """Whether the chosen GPU's latencies have a band across measured sources: none where one
    measured source covers it; where several do, plan does not replay each again (it replays
    many candidates): the line names them and how to see the band."""
    from pipeline.costmodel.profile.tables import load_profile

    hw = str(chosen.get("hardware") or "")
    prof = load_profile(hw) if hw else None
    sets = prof.alternatives() if prof is not None else []
    if not sets:
        why = "one measured source covers it" if prof is not None else "no measured profile"
        return f"band across measured sources: none for {hw or 'this GPU'} ({why})"
    return (
        f"band across measured sources: {hw} is covered by {', '.join(sets)}; plan priced it from the "
        "stated precedence: `rooftrace replay` of the chosen fleet prints the TTFT / TPOT band"
    )
