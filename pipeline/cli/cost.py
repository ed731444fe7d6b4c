"""``rooftrace cost``: GPU cost of a replay against API prices (pipeline/economics/cost.py)."""

from __future__ import annotations

from typing import Any

import click

from pipeline.cli.common import cost_stack_options, emit_json, fmt_num, get_store, json_option, run, store_option, warn


@click.command("cost")
@click.option("--run", "run_id", default=None, help="Replay run id (default: the latest run).")
@click.option(
    "--prices",
    "price_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Price TOML added to the bundled tables (its price of a bundled provider/model replaces that one).",
)
@click.option("--prices-only", is_flag=True, help="Price on the --prices files alone, without the bundled tables.")
@click.option("--gpu-price", type=float, default=None, help="Quoted $/GPU-hour of the purchase model (0 to 1,000,000).")
@click.option(
    "--fleet",
    "fleet_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Fleet file whose [cost] table states the cost inputs (default: the one the run was replayed from).",
)
@cost_stack_options()
@store_option
@json_option
def cost_cmd(
    run_id: str | None,
    price_files: tuple[str, ...],
    prices_only: bool,
    gpu_price: float | None,
    fleet_file: str | None,
    purchase: str | None,
    spot_interruptions_per_day: float | None,
    spot_restart_s: float | None,
    redundancy: int | None,
    network: str | None,
    storage: str | None,
    operations: str | None,
    margin: float | None,
    electricity: bool | None,
    store_path: str | None,
    as_json: bool,
) -> None:
    """GPU cost of a replay split into $ per million fresh-input, cache-hit and output tokens; the
    full cost stack (purchase model, N+k, spot restarts, overheads, margin), each line shown; and
    the replacement cost of the same traffic on dated price tables (closed APIs and hosted open
    models), with each one's blended $ per million tokens and break-even daily volume.

    Writes STORE/costs/<run_id>/ (gpu_cost.parquet, api_cost.parquet, cost.json).

    Example: rooftrace cost --purchase reserved_1y --redundancy 1 --operations 10% --margin 15
    """
    from pipeline.economics.cost import STALE_AFTER_DAYS, run_cost

    overheads = {k: v for k, v in (("network", network), ("storage", storage), ("operations", operations)) if v}
    options: dict[str, Any] = {
        "purchase": purchase,
        "spot_interruptions_per_day": spot_interruptions_per_day,
        "spot_restart_s": spot_restart_s,
        "redundancy_replicas": redundancy,
        "overheads": overheads,
        "margin_percent": margin,
        "electricity": electricity,
    }
    result = run(
        lambda: run_cost(
            get_store(store_path),
            run_id,
            price_files,
            gpu_price,
            prices_only=prices_only,
            fleet_file=fleet_file,
            options=options,
        )
    )
    doc = result.to_dict()
    for line in result.warnings:  # the run's failures first: a cost is only as good as its run
        warn(line)
    if as_json:
        emit_json(doc)
        return
    click.echo(f"cost of run {result.subject} -> {result.out_dir}")
    if doc["unit_costs_note"]:  # before any $ per token: those below are not valid unit costs
        click.echo(doc["unit_costs_note"])
    bad = f" ({doc['unit_costs_flag']})" if doc["unit_costs_flag"] else ""
    period = doc["day_projection"]
    over = period if doc["period_basis"] == "makespan" else f"the period of record ({period})"
    gpus = f"{doc['gpus']}x {doc['hardware']}"
    scaled = doc.get("autoscale")
    if scaled:  # an autoscaled fleet: what it provisioned, beside max_replicas all the period
        gpus = f"{scaled['mean_gpus']:.2f} {doc['hardware']} GPUs on average (autoscaled, at most {doc['gpus']})"
    if doc.get("pools"):  # a fleet of pools: each pool's GPUs at its own price, then the sum
        gpus = f"{doc['gpus']} GPUs (" + " + ".join(f"{p['gpus']}x {p['hardware']}" for p in doc["pools"]) + ")"
        for p in doc["pools"]:
            click.echo(
                f"  pool {p['pool']}: {p['gpus']}x {p['hardware']} at ${p['usd_per_gpu_hour']:.2f}/GPU-h "
                f"({p['price_date']}): ${p['total_usd']:,.2f}, busy {p['utilization']:.0%}, idle ${p['idle_usd']:,.2f}"
            )
    click.echo(
        f"{gpus} at {'a mean ' if doc.get('pools') else ''}${doc['usd_per_gpu_hour']:.2f}/GPU-h ({doc['price_date']}): "
        f"${doc['total_usd']:,.2f} over {over}, "
        f"busy {doc['utilization']:.0%} of the time, "
        f"idle ${doc['idle_usd']:,.2f}"
    )
    if scaled:
        click.echo(
            f"  autoscaled: {scaled['provisioned_gpu_hours']:,.2f} GPU-h provisioned, "
            f"${scaled['autoscaled_usd']:,.2f}; "
            f"static at {doc['gpus']} GPUs all the period: {scaled['static_gpu_hours']:,.2f} GPU-h, "
            f"${scaled['static_usd']:,.2f}"
        )
    for r in doc["token_classes"]:
        if r["token_class"] == "idle":
            continue
        click.echo(
            f"  {r['token_class']:<12} {r['tokens']:>16,.0f} tokens  busy {r['busy_share']:>5.1%}  "
            f"${fmt_num(r['all_in_usd_per_million_tokens'], '.4f')}/M all-in{bad}"
        )
    stack = doc.get("cost_stack")
    if stack:
        where = doc["cost_inputs_file"] or "no fleet file read"
        click.echo(f"full cost stack (inputs: {stack['inputs']['origin']}; {where}):")
        for line in stack["lines"]:
            click.echo(
                f"  {line['line']:<14} ${line['usd']:>12,.2f}  ${line['usd_per_day']:>12,.2f}/day  {line['basis']}"
            )
        click.echo(f"  {'total':<14} ${stack['total_usd']:>12,.2f}  ${stack['usd_per_day']:>12,.2f}/day")
    replacement = {(r["provider"], r["api_model"]): r for r in doc["replacement"]}
    click.echo("replacement (self-host = the full cost; break-even V* = fleet $/day / blended $/M x 1e6):")
    for a in doc["api_equivalent"]:
        stale = f", STALE price: checked over {STALE_AFTER_DAYS} days ago" if a["price_stale"] else ""
        r = replacement.get((a["provider"], a["api_model"]), {})
        kind = f"; hosted {r['catalog_model']}" if r.get("catalog_model") else ""
        kind += ", same model" if r.get("same_model") else ""
        day = r.get("break_even_to_day_volume")
        versus = f"{day:,.2f}x the day's volume" if day is not None else "no day's volume under an hour of traffic"
        click.echo(
            f"  vs {a['provider']}/{a['api_model']} ({a['price_date']}{stale}{kind}): API ${a['api_usd']:,.2f}, "
            f"self-host/API {fmt_num(a['self_host_to_api_ratio'], '.2f')}{bad}; "
            f"${fmt_num(r.get('blended_usd_per_million_tokens'), ',.4f')}/M blended; break-even "
            f"{fmt_num(r.get('break_even_tokens_per_day'), ',.0f')} tokens/day ({versus}){bad}"
        )
