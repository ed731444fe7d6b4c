"""``rooftrace classify``: split recorded input tokens into cache-hit and fresh."""

from __future__ import annotations

import click

from pipeline.cli.common import emit_json, get_store, json_option, progress, run, store_option


def _fmt_frac(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


@click.command()
@click.option("--date", default=None, help="Arrival date YYYY-MM-DD (default: the latest in the store).")
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Tokens per cache block for reconstructed chains (a log's own hash chains keep theirs).",
)
@click.option(
    "--capacity",
    default=None,
    help="Prefix-cache size per model: tokens (2M) or bytes (40GB, 40GiB). Default: unbounded.",
)
@click.option(
    "--isolation",
    default="model,adapter,tenant",
    show_default=True,
    help="Comma-separated request columns no cache hit may cross ('' to share across everything).",
)
@click.option(
    "--ttl",
    "ttl_s",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds an unused cached block survives (provider caches expire after minutes).",
)
@click.option(
    "--kv-bytes-per-token",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="KV-cache bytes per token, to turn a capacity in bytes into blocks.",
)
@click.option(
    "--kv-model",
    default=None,
    help="Catalog model whose KV bytes per token convert a capacity in bytes "
    "(default: the catalog entry named like each logged model).",
)
@click.option("--kv-dtype", default="bf16", show_default=True, help="KV-cache storage format (catalog).")
@click.option(
    "--offload-gb",
    default=None,
    help="Lower KV tier sizes in GB (host DRAM or a shared store), comma-separated, e.g. 0,256,512: "
    "GPU-tier hits, lower-tier hits and fresh prefill for each (needs --capacity, the GPU tier).",
)
@click.option(
    "--shared-gb",
    default=None,
    help="Sizes in GB of a store shared by the pool below the --offload-gb tier, comma-separated, e.g. "
    "0,1000,4000: a grid of every --offload-gb size against every store size (GPU, host tier, store hits).",
)
@store_option
@json_option
def classify(
    date: str | None,
    block_size: int,
    capacity: str | None,
    isolation: str,
    ttl_s: float | None,
    kv_bytes_per_token: float | None,
    kv_model: str | None,
    kv_dtype: str,
    offload_gb: str | None,
    shared_gb: str | None,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Split every recorded input token into cache-hit and fresh, per request and per minute,
    and write the prefix-cache capacity curve.

    Writes STORE/accounting/{requests,minutes,cache_curve}/date=D/part-0.parquet and
    STORE/accounting/summary/date=D/summary.json. Reported cache hits (OpenAI cached_tokens,
    Anthropic cache reads) are used where the log has them; elsewhere an LRU prefix cache is
    simulated over the requests' block hash chains (see docs/accounting.md).

    Example: rooftrace classify --capacity 40GB --kv-model llama-3.1-70b --ttl 300
    """
    from pipeline.classify.accounting import classify_tokens, parse_offload_sizes

    keys = tuple(k.strip() for k in isolation.split(",") if k.strip())
    sizes = run(lambda: parse_offload_sizes(offload_gb))
    below = run(lambda: parse_offload_sizes(shared_gb, "--shared-gb"))
    summary = run(
        lambda: classify_tokens(
            get_store(store_path),
            date,
            block_size=block_size,
            capacity=capacity,
            isolation=keys,
            ttl_s=ttl_s,
            kv_bytes_per_token=kv_bytes_per_token,
            kv_model=kv_model,
            kv_dtype=kv_dtype,
            offload_gb=sizes,
            shared_gb=below,
        )
    )
    t = summary.totals
    progress(f"wrote {summary.paths['requests']} and the per-minute and cache-curve tables")
    if as_json:
        emit_json(summary.to_json())
        return
    click.echo(
        f"{summary.date}: {t['requests']} requests, block size {t['block_size_tokens']} tokens, cache {t['capacity']}"
    )
    click.echo(
        f"  recorded input {t['recorded_input_tokens']:,} = cache hit {t['cache_hit_tokens']:,} "
        f"+ fresh {t['fresh_input_tokens']:,} tokens; output {t['output_tokens']:,} tokens"
    )
    ratio = t["inflation_ratio"]
    click.echo(f"  recorded/fresh inflation: {'n/a' if ratio is None else f'{ratio:.2f}x'}")
    sources = ", ".join(f"{k} {v['requests']}" for k, v in sorted(t["cache_hit_source"].items()))
    click.echo(f"  cache_hit_tokens from: {sources} requests")
    sim = t["simulated"]
    click.echo(
        f"  simulated hits: {_fmt_frac(sim['token_hit_fraction'])} of tokens, "
        f"{_fmt_frac(sim['block_hit_fraction'])} of blocks ({sim['requests']} requests with a prefix chain)"
    )
    both = t["reported_vs_simulated"]
    if both["requests"]:
        click.echo(
            f"  reported vs simulated on {both['requests']} requests: "
            f"{both['reported_cache_hit_tokens']:,} vs {both['simulated_cache_hit_tokens']:,} tokens"
        )
    peak = t["peak_minute"]
    if peak:
        click.echo(
            f"  peak minute {peak['minute']}: fresh {peak['fresh_input_tokens_per_s']:,.0f} tok/s, "
            f"recorded {peak['recorded_input_tokens_per_s']:,.0f} tok/s"
        )
    for row in t.get("offload", []):
        if "shared_gb" in row:  # a grid: the host tier, then the store below it
            loads = (row["offload_load_bytes"] + row["shared_load_bytes"]) / 1e9
            click.echo(
                f"  {row['model']} + {row['offload_gb']:g} GB lower tier + {row['shared_gb']:g} GB store: "
                f"GPU-tier hits {row['gpu_hit_tokens']:,}, lower-tier hits {row['offload_hit_tokens']:,}, store hits "
                f"{row['shared_hit_tokens']:,}, fresh {row['fresh_input_tokens']:,} tokens "
                f"({row['requests_loading']:,} requests load {loads:,.1f} GB, "
                f"{row['shared_load_bytes'] / 1e9:,.1f} GB of it from the store)"
            )
            continue
        click.echo(
            f"  {row['model']} + {row['offload_gb']:g} GB lower tier: GPU-tier hits {row['gpu_hit_tokens']:,}, "
            f"lower-tier hits {row['offload_hit_tokens']:,}, fresh {row['fresh_input_tokens']:,} tokens "
            f"({row['requests_loading']:,} requests load {row['offload_load_bytes'] / 1e9:,.1f} GB)"
        )
