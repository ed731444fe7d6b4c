"""The thin Click layer: one command per stage; each parses options and calls one library function."""

from __future__ import annotations

import click

from pipeline import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rooftrace")
def main() -> None:
    """rooftrace: capacity-plan LLM inference from real traffic.

    Ingest request logs into a Parquet store, split input tokens into fresh and cache-hit,
    replay the workload through a roofline model of a continuous-batching fleet, and report.
    """


# Commands from the stage modules. Each module owns its commands; this file only registers them.
from pipeline.cli_ingest import ingest, synth  # noqa: E402

main.add_command(ingest)
main.add_command(synth)
from pipeline.cli_classify import classify  # noqa: E402

main.add_command(classify)
from pipeline.cli_replay import replay_cmd  # noqa: E402

main.add_command(replay_cmd)
from pipeline.cli_catalog import calibrate_cmd, catalog, fit_cmd, validate_cmd  # noqa: E402

main.add_command(catalog)
main.add_command(fit_cmd)
main.add_command(validate_cmd)
main.add_command(calibrate_cmd)
from pipeline.cli_warehouse import query, sql  # noqa: E402

main.add_command(sql)
main.add_command(query)
from pipeline.cli_nightly import demo_cmd, nightly_cmd, report  # noqa: E402

main.add_command(report)
main.add_command(nightly_cmd)
main.add_command(demo_cmd)
from pipeline.cli_plan import cost_cmd, plan_cmd  # noqa: E402

main.add_command(plan_cmd)
main.add_command(cost_cmd)
