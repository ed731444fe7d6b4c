"""``rooftrace synth``: a realistic synthetic request log (pipeline/synth/)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.common import emit_json, json_option, progress, run
from pipeline.defaults import SYNTH_FORMATS


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

    from pipeline.store import check_date
    from pipeline.synth import SynthConfig, generate, write_logs

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
