"""``rooftrace replay``: replay a day of requests through a continuous-batching fleet."""

from __future__ import annotations

from typing import Any

import click

from pipeline.cli.common import (
    emit_json,
    get_store,
    json_option,
    limit_options,
    limits_from,
    pod_options,
    progress,
    run,
    store_option,
    warn,
)


def _ms(x: float | None) -> str:
    """A latency: ms below 10 s (the usual figures, one decimal), then as pipeline.replay.slo words
    durations (s, min, h, days): an overloaded run's p99 is not '84,861,166.4 ms'."""
    from pipeline.common.units import format_seconds

    if x is None:
        return "n/a"
    return f"{x * 1e3:,.1f} ms" if abs(x) < 10 else format_seconds(x)


#: The columns of the latency summary a person reads (replay --json has the same keys, in seconds).
LATENCY_STATS = ("mean", "std", "min", "p50", "p90", "p99", "p99_9", "max")


def latency_lines(summary: dict[str, Any]) -> list[str]:
    """The latency summary as a small table in ms: TTFT, TPOT (AIPerf and GuideLLM call it ITL)
    and E2E, each with mean, standard deviation, min, percentiles and max, as vLLM's benchmark
    prints them."""
    head = ["", *(k.replace("_", ".") for k in LATENCY_STATS)]
    rows = [head]
    for name, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        st = summary.get(name) or {}
        rows.append([label, *(_ms(st.get(k)) for k in LATENCY_STATS)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    out = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows
    ]
    return [*out, "(TPOT = (E2E - TTFT) / (output tokens - 1): the inter-token latency AIPerf and GuideLLM call ITL)"]


def band_line(summary: dict[str, Any]) -> str:
    """TTFT and TPOT p50 with their band across the measured sources that cover the fleet's GPU
    (the run's ``source_band``), or why there is none."""
    band = summary.get("source_band")
    cost = summary.get("cost_model") or {}
    if not band:
        if cost.get("source") == "measured":
            why = f"one measured source covers {cost.get('profile') or 'this GPU'}'s operators"
        else:
            why = f"priced by the {cost.get('source') or 'roofline'} tier, not measured tables"
        return f"band across measured sources: none ({why})"

    def one(label: str, key: str) -> str:
        st = summary.get(key) or {}
        rng = (band.get(key) or {}).get("p50")
        if st.get("p50") is None or not rng:
            return f"{label} p50 n/a"
        return f"{label} p50 {_ms(st['p50'])} (band {_ms(rng[0])} - {_ms(rng[1])})"

    names = ", ".join(str(s.get("source")) for s in band.get("sources", []))
    return (
        f"{one('TTFT', 'ttft_s')}, {one('TPOT', 'tpot_s')} across sources ({names}; chosen {band.get('chosen')}, "
        "the others replayed again)"
    )


@click.command("replay")
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="FLEET.toml: hardware, model, parallelism, replicas, router, engine "
    "(default: the project's fleet, fleets/default.toml).",
)
@click.option("--date", default=None, help="Arrival date YYYY-MM-DD (default: the latest in the store).")
@click.option(
    "--rate-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Multiply the trace's arrival rate (2 = twice the traffic, same requests).",
)
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="Override the fleet's replicas.")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Closed loop: C clients, each sends its next request when the previous one finishes.",
)
@click.option(
    "--ramp-s",
    type=float,
    default=0.0,
    show_default=True,
    help="Closed loop: start the clients one after another over this many seconds (AIPerf's "
    "--concurrency-ramp-duration), so they do not send every wave together.",
)
@click.option(
    "--think-s",
    type=float,
    default=0.0,
    show_default=True,
    help="Closed loop: each client waits this many seconds after an answer's last token before its next request.",
)
@click.option(
    "--warmup",
    type=int,
    default=0,
    show_default=True,
    help="Closed loop: replay the first N requests sent as warm-up, left out of the latencies, SLO and goodput.",
)
@click.option("--offline", is_flag=True, help="Send every request at t=0 (offline throughput).")
@click.option(
    "--cache-hits",
    type=click.Choice(["reported", "simulated"]),
    default="reported",
    show_default=True,
    help="reported: serve the cache hits the log reports (cached_tokens) where it has them, as classify counts "
    "them, and the replicas' own prefix caches elsewhere; simulated: ignore the reports and look every request "
    "up in the replicas' prefix caches.",
)
@click.option(
    "--slo",
    default=None,
    help="Judge the run against an SLO: a preset (chat, interactive, ...) or ttft_p99=2s,tpot_p99=100ms "
    "(default: the fleet's [slo]).",
)
@click.option(
    "--usd-per-kwh",
    type=float,
    default=None,
    help="Electricity price for the energy lines (default: the fleet's [energy], else 0.0811: EIA 2024 industrial).",
)
@click.option(
    "--pue",
    type=float,
    default=None,
    help="Facility PUE for the energy lines (default: the fleet's [energy], else 1.56: Uptime Institute 2024).",
)
@pod_options
@limit_options
@store_option
@json_option
def replay_cmd(
    fleet_path: str | None,
    date: str | None,
    rate_scale: float,
    replicas: int | None,
    concurrency: int | None,
    ramp_s: float,
    think_s: float,
    warmup: int,
    offline: bool,
    cache_hits: str,
    slo: str | None,
    usd_per_kwh: float | None,
    pue: float | None,
    pods: int,
    executor: str,
    ray_address: str | None,
    max_memory: str | None,
    max_sim_days: str | None,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Replay requests through vLLM-v1 scheduling on a fleet of replicas, each step priced from the GPU's
    measured profile where the catalog has one, else a roofline prior fitted on the measured GPUs; failures first,
    then latencies.

    Writes STORE/runs/<run_id>/ with config.json and requests, steps and series Parquet.
    Refuses, before it starts, a replay estimated to need more memory than --max-memory or whose
    arrivals span more than --max-sim-days simulated days; long runs report progress on stderr and
    stop on Ctrl-C (exit code 130).

    Latencies follow vLLM: TTFT includes queueing, TPOT = (E2E - TTFT) / (output tokens - 1) is
    what AIPerf and GuideLLM call ITL. The summary gives mean, std, min, p50 ... p99.9 and max, in ms
    here and in seconds in --json (keys p50 ... p99_9, as `rooftrace query latency`).

    Example: rooftrace replay --fleet fleets/default.toml --rate-scale 2
    """
    from pipeline.engine.jitcache import compile_ahead

    compile_ahead()  # a fresh clone's first replay: the engine compiles meanwhile, on the other core
    from pipeline.common.units import format_seconds
    from pipeline.economics.energy import EnergySettings, energy_lines, energy_summary
    from pipeline.replay.run import ReplayOptions, pool_lines, replay

    run(lambda: EnergySettings().with_options(usd_per_kwh, pue))  # refused before the replay, not after
    from pipeline.replay.slo import failures_line, overload_text, verdict_text

    def body() -> Any:
        options = ReplayOptions(
            date=date,
            rate_scale=rate_scale,
            replicas=replicas,
            concurrency=concurrency,
            ramp_s=ramp_s,
            think_s=think_s,
            warmup=warmup,
            offline=offline,
            cache_hits=cache_hits,
            slo=slo,
            pods=pods,
            executor=executor,
            ray_address=ray_address,
        )
        with limits_from(max_memory, max_sim_days):
            return replay(get_store(store_path), fleet_path, options, progress=progress)

    result = run(body)
    for note in _unused_pod_options(result, pods, executor, ray_address, concurrency is not None):
        progress(f"replay: {note}")
    s = result.summary
    h = s["health"]
    split_note = (s.get("cache_split") or {}).get("note")
    if split_note:  # first: the day replayed is not split as the report's token figures say
        warn(split_note)
    for line in h["warnings"]:  # (they quote log values, model names: escaped by warn)
        warn(line)
    energy = run(lambda: energy_summary(result.run_dir, usd_per_kwh, pue))
    if as_json:
        emit_json({"run_id": result.run_id, "run_dir": str(result.run_dir), **s, "energy": energy})
        return
    click.echo(f"run {result.run_id} -> {result.run_dir}")
    for line in pool_lines(s):
        click.echo(line)
    # failures first: what did not get served, then whether the fleet kept up, then the SLO
    click.echo(failures_line(h))
    click.echo(overload_text(h["overload"]))
    v = h["verdict"]
    click.echo(verdict_text(v) if v else "SLO: none set (FLEET.toml [slo] or --slo chat)")
    tput = s["output_tokens_per_s"]
    span = s["makespan_s"]
    long = f" ({format_seconds(span)})" if span >= 600 else ""
    click.echo(
        f"makespan {span:,.1f} s{long}; decode {tput or 0:,.0f} output tokens/s; preemptions {s['preemptions']:,}"
    )
    split = s.get("cache_split")
    if split:
        reported, own = (split["by_source"][k]["cache_hit_tokens"] for k in ("reported", "prefix_cache"))
        click.echo(
            f"input: {split['recorded_input_tokens']:,} recorded tokens, {split['cache_hit_tokens']:,} served from "
            f"cache ({reported:,} as the log reports, {own:,} from the replicas' prefix caches), "
            f"{split['fresh_input_tokens']:,} fresh"
        )
    sd = s.get("speculative")
    if sd:
        per_step = sd["tokens_per_decode_step"]
        click.echo(
            f"speculative decoding: {sd['method']}, {sd['num_speculative_tokens']} draft tokens a step, "
            f"{sd['mean_accepted_tokens']:.2f} accepted tokens per verification ({sd['acceptance_source']}); "
            f"{per_step or 0:.2f} output tokens per decode step over {sd['decode_steps']:,} decode steps"
        )
    tiered = [("", s.get("kv_offload"))] + [
        (f"pool {k}: ", p.get("kv_offload")) for k, p in (s.get("pools") or {}).items()
    ]
    if any(kv for _, kv in tiered):
        from pipeline.replay.offload import offload_line

        for prefix, kv in tiered:
            if kv:
                click.echo(prefix + offload_line(kv))
    scaled = [("", s.get("autoscale"))] + [
        (f"pool {k}: ", p.get("autoscale")) for k, p in (s.get("pools") or {}).items()
    ]
    if any(auto for _, auto in scaled):
        from pipeline.replay.run import autoscale_lines

        for prefix, auto in scaled:
            for line in autoscale_lines(auto) if auto else []:
                click.echo(prefix + line)
    click.echo(f"latency over {h['latency_covers']}:")
    for line in latency_lines(s):
        click.echo(line)
    click.echo(band_line(s))
    for line in energy_lines(energy):
        click.echo(line)
    pods = s.get("engine_pods", 1)
    in_pods = f", in {pods:,} pods" if pods > 1 else ""
    if pods > 1 and executor == "thread":
        from pipeline.engine.shard import thread_workers

        workers = thread_workers(pods)
        in_pods += f" on {workers:,} thread{'s' if workers != 1 else ''}"
    click.echo(f"engine: {s['engine_wall_s']:.2f} s wall, {s['spans']:,} spans{in_pods}", err=True)


def _unused_pod_options(result: Any, pods: int, executor: str, ray_address: str | None, closed: bool) -> list[str]:
    """pipeline.replay.fleet.unused_pod_options for the run just written: the fleet as its config.json
    recorded it (the file may have changed since), the pods from its summary."""
    import json

    from pipeline.common.errors import RooftraceError
    from pipeline.replay.fleet import fleet_from_dict, unused_pod_options

    if executor in ("local", "thread") and ray_address is None:  # (thread: the default, used where it can be)
        return []
    config = result.run_dir / "config.json"
    try:
        cfg = fleet_from_dict(json.loads(config.read_text())["resolved"]["fleet"], str(config))
    except (OSError, ValueError, KeyError, TypeError, RooftraceError):
        return []  # (the run is written; a note is not worth failing it)
    return unused_pod_options(cfg, pods, executor, ray_address, int(result.summary.get("engine_pods") or 1), closed)
