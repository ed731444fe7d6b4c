"""``rooftrace cost``: GPU cost of a replay against API prices (pipeline/economics/cost.py)."""

from __future__ import annotations

import click

from pipeline.cli.common import emit_json, fmt_num, get_store, json_option, run, store_option, warn


@click.command("cost")
@click.option("--run", "run_id", default=None, help="Replay run id (default: the latest run).")
@click.option("--prices", "price_files", multiple=True, type=click.Path(dir_okay=False), help="API price TOML.")
@click.option("--gpu-price", type=float, default=None, help="Override $/GPU-hour (0 to 1,000,000).")
@store_option
@json_option
def cost_cmd(
    run_id: str | None, price_files: tuple[str, ...], gpu_price: float | None, store_path: str | None, as_json: bool
) -> None:
    """GPU cost of a replay split into $ per million fresh-input, cache-hit and output tokens, and
    the API-equivalent cost of the same traffic on dated price tables.

    Writes STORE/costs/<run_id>/ (gpu_cost.parquet, api_cost.parquet, cost.json).

    Example: rooftrace cost --prices my_prices.toml
    """
    from pipeline.economics.cost import STALE_AFTER_DAYS, run_cost

    result = run(lambda: run_cost(get_store(store_path), run_id, price_files, gpu_price))
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
    for r in doc["token_classes"]:
        if r["token_class"] == "idle":
            continue
        click.echo(
            f"  {r['token_class']:<12} {r['tokens']:>16,.0f} tokens  busy {r['busy_share']:>5.1%}  "
            f"${fmt_num(r['all_in_usd_per_million_tokens'], '.4f')}/M all-in{bad}"
        )
    for a in doc["api_equivalent"]:
        stale = f", STALE price: checked over {STALE_AFTER_DAYS} days ago" if a["price_stale"] else ""
        click.echo(
            f"  vs {a['provider']}/{a['api_model']} ({a['price_date']}{stale}): API ${a['api_usd']:,.2f}, "
            f"self-host/API {fmt_num(a['self_host_to_api_ratio'], '.2f')}{bad}"
        )
