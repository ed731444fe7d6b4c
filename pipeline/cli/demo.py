"""``rooftrace demo``: the nightly job on the bundled sample (pipeline/publish/nightly.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.common import (
    check_out_of_store,
    emit_json,
    get_store,
    json_option,
    progress,
    reports_option,
    run,
    store_option,
)


@click.command("demo")
@reports_option
@store_option
@json_option
def demo_cmd(reports_dir: Path | None, store_path: str | None, as_json: bool) -> None:
    """Run the nightly job on the bundled demo night (a synthetic gateway log: sessions, cache
    hits, tenants) on the demo fleet against its SLO, and print where the report is.

    The log (traces/sample/gateway_demo_2025-01-15.jsonl.gz) is synthetic, made by `rooftrace
    synth`: 3,000 requests of meta-llama/Llama-3.1-8B-Instruct from 4 tenants over an hour, with
    provider-reported cached tokens; fleets/demo.toml serves them on two H100s against the `chat`
    SLO (docs/reports.md, "The demo").

    Example: rooftrace demo
    """
    from pipeline.engine.jitcache import compile_ahead

    compile_ahead()  # a fresh clone's first demo: the engine compiles meanwhile, on the other core
    from pipeline.ingest.project import default_reports_dir
    from pipeline.publish.nightly import demo

    store = get_store(store_path)

    def work() -> list[Any]:
        check_out_of_store(store, reports_dir or default_reports_dir(), "--reports")
        return demo(store, reports_dir, progress)

    results = run(work)
    for res in results:
        for w in res.headline.get("warnings") or []:
            progress(f"warning: {w}")
        progress(res.line())
        click.echo(f"report: {res.report}")
    if as_json:
        emit_json([r.to_json() for r in results])
