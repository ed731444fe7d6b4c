"""Every command is documented with an example (the CLI is the user's manual)."""

from __future__ import annotations

import click
from click.testing import CliRunner

from pipeline.cli import main


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name, cmd in sorted(group.commands.items()):
        full = f"{prefix}{name}"
        out.append((full, cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, full + " ")
    return out


def test_every_command_has_help_and_an_example() -> None:
    commands = _commands(main)
    names = {n for n, _ in commands}
    assert {"ingest", "synth", "classify", "replay", "sql", "query", "report", "nightly", "demo"} <= names
    for name, cmd in commands:
        assert cmd.help and len(cmd.help.strip()) > 20, f"{name} has no help"
        if not isinstance(cmd, click.Group):
            assert "Example" in cmd.help or "example" in cmd.help, f"{name} help has no example"
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden and param.name not in ("help",):
                assert param.help, f"{name} {param.opts} has no help"


def test_help_and_version_run() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["--help"]).exit_code == 0
    assert "rooftrace" in runner.invoke(main, ["--version"]).output
    for name, _ in _commands(main):
        res = runner.invoke(main, [*name.split(), "--help"])
        assert res.exit_code == 0, name
