"""The command line: a thin Click layer, one module per command (``pipeline/cli/<command>.py``).

Each command module imports only click, :mod:`pipeline.cli.common` and :mod:`pipeline.common.defaults` at
module level and its stage inside the command's body, so ``rooftrace --help`` and every command's
``--help`` answer without importing numpy, polars, duckdb, numba or altair; ``main`` imports a
command's module only when that command is named (or listed by ``--help``).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from pipeline import __version__

#: command name -> (module under pipeline.cli, attribute), in the order ``--help`` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("calibrate", "calibrate_cmd"),
    "catalog": ("catalog", "catalog"),
    "classify": ("classify", "classify"),
    "cost": ("cost", "cost_cmd"),
    "demo": ("demo", "demo_cmd"),
    "fit": ("fit", "fit_cmd"),
    "ingest": ("ingest", "ingest"),
    "nightly": ("nightly", "nightly_cmd"),
    "plan": ("plan", "plan_cmd"),
    "query": ("query", "query"),
    "replay": ("replay", "replay_cmd"),
    "report": ("report", "report"),
    "sql": ("sql", "sql"),
    "synth": ("synth", "synth"),
    "validate": ("validate", "validate_cmd"),
}


class LazyGroup(click.Group):
    """A group whose commands are imported from their modules when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def invoke(self, ctx: click.Context) -> Any:
        from pipeline.cli.common import _JSON_MODE, error_boundary

        token = _JSON_MODE.set(False)  # (each invocation its own: tests run many in one process)
        try:
            with error_boundary():
                return super().invoke(ctx)
        finally:
            _JSON_MODE.reset(token)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(f"pipeline.cli.{module}"), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rooftrace")
def main() -> None:
    """rooftrace: capacity-plan LLM inference from real traffic.

    Ingest request logs into a Parquet store, split input tokens into fresh and cache-hit,
    replay the workload through a roofline model of a continuous-batching fleet, and report.
    """
