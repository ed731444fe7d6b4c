"""``rooftrace ingest`` and ``rooftrace synth``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.cli_common import emit_json, get_store, json_option, progress, run, store_option
from pipeline.ingest import ALL_FORMATS, ingest_logs
from pipeline.store import check_date
from pipeline.synth import SYNTH_FORMATS, SynthConfig, generate, write_logs


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(ALL_FORMATS), default=None, help="Log format (default: detect).")
@click.option("--date", default=None, help="YYYY-MM-DD anchor for traces with relative timestamps.")
@click.option(
    "--mapping",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="TOML column mapping for --format csv|jsonl|parquet.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Ingest files already ingested again, REPLACING the rows stored from them (not adding).",
)
@store_option
@json_option
def ingest(
    sources: tuple[Path, ...],
    fmt: str | None,
    date: str | None,
    mapping: Path | None,
    force: bool,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Ingest request logs (files or directories; plain, .gz or .zst) into the store.

    Writes STORE/requests/date=YYYY-MM-DD/, quarantines malformed or implausible records with a
    reason in STORE/quarantine/ and records every file in STORE/manifest.parquet. Exits 1 if any
    file could not be read or had every row quarantined (the others are still ingested; a failed
    file is not recorded, so a corrected re-run takes it). Limits: docs/limits.md.

    Example: rooftrace ingest traces/azure_conv.csv.gz
    """
    summary = run(lambda: ingest_logs(list(sources), get_store(store_path), fmt, date, mapping, progress, force=force))
    progress(summary.line())
    if as_json:
        emit_json(summary.to_json())
    if not summary.ok:
        sys.exit(1)


@click.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(SYNTH_FORMATS),
    default="openai",
    show_default=True,
    help="Log format to write.",
)
@click.option("--requests", "n", type=click.IntRange(min=1), default=10_000, show_default=True, help="Requests.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed (same seed, same log).")
@click.option("--date", default="2025-01-15", show_default=True, help="Day the arrivals start (UTC).")
@click.option(
    "--hours",
    type=click.FloatRange(min=0.001),
    default=24.0,
    show_default=True,
    help="Span of session starts.",
)
@click.option("--tenants", type=click.IntRange(min=1), default=4, show_default=True, help="Number of tenants.")
@click.option("--models", default="llama-3.1-70b,llama-3.1-8b", show_default=True, help="Comma-separated model names.")
@click.option(
    "--cv",
    type=click.FloatRange(min=0.05),
    default=None,
    help="Inter-arrival CV (default: ServeGen's 1.108).",
)
@click.option("--flat", is_flag=True, help="No diurnal rate profile.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Output file (.gz/.zst compress).",
)
@json_option
def synth(
    fmt: str,
    n: int,
    seed: int,
    date: str,
    hours: float,
    tenants: int,
    models: str,
    cv: float | None,
    flat: bool,
    out: Path,
    as_json: bool,
) -> None:
    """Generate a realistic synthetic request log (seeded, reproducible) in any ingest format.

    Agent and chat sessions whose prompts grow turn by turn, several tenants and models, bursty
    Gamma arrivals with a diurnal profile, heavy-tailed lengths and provider-style reported
    cached tokens. Generic formats (jsonl, csv, parquet) also write OUT.mapping.toml.

    Example: rooftrace synth --format anthropic --requests 50000 --out logs/day.jsonl.gz
    """

    def work() -> tuple[list[Path], int]:
        check_date(date)
        cfg = SynthConfig(
            requests=n,
            seed=seed,
            date=date,
            duration_s=hours * 3600.0,
            tenants=tenants,
            models=tuple(m.strip() for m in models.split(",") if m.strip()),
            cv=cv,
            diurnal=not flat,
        )
        frame = generate(cfg)
        return write_logs(frame, fmt, out), frame.height

    files, rows = run(work)
    progress(f"synth: wrote {rows} {fmt} requests to {', '.join(map(str, files))}")
    if as_json:
        emit_json({"files": [str(f) for f in files], "requests": rows, "format": fmt})
