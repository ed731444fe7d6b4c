"""``rooftrace ingest`` and ``rooftrace synth``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.cli_common import emit_json, get_store, json_option, progress, run, store_option
from pipeline.ingest import ALL_FORMATS, ingest_logs


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(ALL_FORMATS), default=None, help="Log format (default: detect)."
)
@click.option("--date", default=None, help="YYYY-MM-DD anchor for traces with relative timestamps.")
@click.option(
    "--mapping",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="TOML column mapping for --format csv|jsonl|parquet.",
)
@store_option
@json_option
def ingest(
    sources: tuple[Path, ...],
    fmt: str | None,
    date: str | None,
    mapping: Path | None,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Ingest request logs (files or directories; plain, .gz or .zst) into the store.

    Writes STORE/requests/date=YYYY-MM-DD/, quarantines malformed records with a reason in
    STORE/quarantine/ and records every file in STORE/manifest.parquet. Exits 1 if any file
    could not be read (the others are still ingested).

    Example: rooftrace ingest traces/azure_conv.csv.gz
    """
    summary = run(lambda: ingest_logs(list(sources), get_store(store_path), fmt, date, mapping, progress))
    progress(summary.line())
    if as_json:
        emit_json(summary.to_json())
    if not summary.ok:
        sys.exit(1)
