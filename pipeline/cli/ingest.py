"""``rooftrace ingest``: request logs into the store (pipeline/ingest/)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pipeline.cli.common import emit_json, get_store, jobs_option, json_option, progress, run, store_option
from pipeline.common.defaults import INGEST_FORMATS

if TYPE_CHECKING:
    from pipeline.ingest.core import IngestSummary


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path())  # as typed: '' is refused, not '.'
@click.option("--format", "fmt", type=click.Choice(INGEST_FORMATS), default=None, help="Log format (default: detect).")
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
    help="Ingest files already ingested again, REPLACING the rows stored from them (not adding); "
    "given every log of a date, also rebuilds a date whose stored file is damaged.",
)
@click.option(
    "--dedupe-across-formats",
    "dedupe_across_formats",
    is_flag=True,
    help="Store a request logged in two formats (the same request id, arrival and tokens, e.g. a "
    "gateway's OpenAI log and its OTel spans) once: the first read is kept, the others count as duplicates.",
)
@jobs_option
@store_option
@json_option
def ingest(
    sources: tuple[str, ...],
    fmt: str | None,
    date: str | None,
    mapping: Path | None,
    force: bool,
    dedupe_across_formats: bool,
    jobs: int,
    store_path: str | None,
    as_json: bool,
) -> None:
    """Ingest request logs (files or directories; plain, .gz or .zst) into the store.

    Writes STORE/requests/date=YYYY-MM-DD/, quarantines malformed or implausible records with a
    reason in STORE/quarantine/ and records every file in STORE/manifest.parquet. Exits 1 if any
    file could not be read or had every row quarantined (the others are still ingested; a failed
    file is not recorded, so a corrected re-run takes it). Limits: docs/limits.md.

    \b
    Examples (the bundled samples, from the repository root; then your own logs):
      rooftrace ingest traces/sample/azure_conv_2023.csv.gz
      rooftrace ingest traces/sample/mooncake_conversation.jsonl.gz --date 2024-01-01
      rooftrace ingest /path/to/your/gateway-logs/ --store my-store
    """
    from pipeline.common.errors import RooftraceError
    from pipeline.common.terminal import escape_controls
    from pipeline.ingest import ingest_logs

    def say(line: str) -> None:  # a file name may hold a newline or an escape sequence: shown escaped
        progress(escape_controls(line))

    def call() -> IngestSummary:
        try:
            return ingest_logs(
                list(sources),
                get_store(store_path),
                fmt,
                date,
                mapping,
                say,
                force=force,
                jobs=jobs,
                dedupe_across_formats=dedupe_across_formats,
            )
        except RooftraceError as exc:
            raise RooftraceError(escape_controls(str(exc))) from None

    summary = run(call)
    progress(summary.line())
    if as_json:
        emit_json(summary.to_json())
    if not summary.ok:
        sys.exit(1)
