"""``rooftrace synth``: a realistic synthetic request log (pipeline/synth/)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from pipeline.cli.common import check_out_of_store, default_store, emit_json, json_option, limits_from, progress, run
from pipeline.common.defaults import (
    MAX_MEMORY_ENV,
    SYNTH_FORMATS,
    SYNTH_MAX_CV,
    SYNTH_MAX_DURATION_S,
    SYNTH_MAX_REQUESTS,
    SYNTH_MAX_SEED,
    SYNTH_MAX_TENANTS,
    SYNTH_MIN_CV,
)
from pipeline.common.errors import RooftraceError

MAX_REQUESTS, MAX_TENANTS, MAX_SEED = SYNTH_MAX_REQUESTS, SYNTH_MAX_TENANTS, SYNTH_MAX_SEED
MAX_HOURS = SYNTH_MAX_DURATION_S / 3600.0
MIN_CV, MAX_CV = SYNTH_MIN_CV, SYNTH_MAX_CV


def _size(value: str | None) -> str | None:
    """``--max-memory`` checked as ``pipeline.replay.limits.parse_size`` reads it (applied in the command)."""
    if value is not None:
        from pipeline.common.budget import parse_size

        try:
            parse_size(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan (which compares false with both bounds)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number in the range {self.min}<=x<={self.max}.", param, ctx)
        return rv


@click.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(SYNTH_FORMATS),
    default="openai",
    show_default=True,
    help="Log format to write.",
)
@click.option(
    "--requests",
    "n",
    type=click.IntRange(1, MAX_REQUESTS),
    default=10_000,
    show_default=True,
    help="Requests (built in memory, about 0.75 KiB each; refused up front past --max-memory).",
)
@click.option(
    "--seed",
    type=click.IntRange(0, MAX_SEED),
    default=0,
    show_default=True,
    help="Random seed (same seed, same log).",
)
@click.option("--date", default="2025-01-15", show_default=True, help="Day the arrivals start (UTC).")
@click.option(
    "--hours",
    type=FiniteFloatRange(0.001, MAX_HOURS),
    default=24.0,
    show_default=True,
    help="Span of session starts (at most 366 days).",
)
@click.option("--tenants", type=click.IntRange(1, MAX_TENANTS), default=4, show_default=True, help="Number of tenants.")
@click.option("--models", default="llama-3.1-70b,llama-3.1-8b", show_default=True, help="Comma-separated model names.")
@click.option(
    "--cv",
    type=FiniteFloatRange(MIN_CV, MAX_CV),
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
@click.option(
    "--max-memory",
    callback=lambda ctx, param, value: _size(value),
    default=None,
    metavar="SIZE",
    help="Refuse a log estimated to need more memory: 64GiB, 512MiB, 80% (of physical memory) or none "
    f"(default: ${MAX_MEMORY_ENV}, else 50% of physical memory).",
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
    max_memory: str | None,
    as_json: bool,
) -> None:
    """Generate a realistic synthetic request log (seeded, reproducible) in any ingest format.

    Agent and chat sessions whose prompts grow turn by turn, several tenants and models, bursty
    Gamma arrivals with a diurnal profile, heavy-tailed lengths and provider-style reported
    cached tokens. Generic formats (jsonl, csv, parquet) also write OUT.mapping.toml.

    Example: rooftrace synth --format anthropic --requests 50000 --out logs/day.jsonl.gz
    """

    from pipeline.ingest.store import check_date
    from pipeline.synth import SynthConfig, generate, name_warning, write_logs

    def work() -> tuple[list[Path], int]:
        check_date(date)
        store = default_store()  # (synth takes no --store: the one the next ingest would fill)
        check_out_of_store(store, out, "--out")
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
        try:
            with limits_from(max_memory, None):
                frame = generate(cfg)  # refused first past the memory limit (synth.check_memory)
            return write_logs(frame, fmt, out), frame.height
        except MemoryError:
            raise RooftraceError(
                f"synth: out of memory for {n:,} requests (about 1.4 KiB each); lower --requests"
            ) from None

    files, rows = run(work)
    warning = name_warning(fmt, out)
    if warning is not None:
        progress(warning)
    progress(f"synth: wrote {rows} {fmt} requests to {', '.join(map(str, files))}")
    if as_json:
        emit_json({"files": [str(f) for f in files], "requests": rows, "format": fmt})
