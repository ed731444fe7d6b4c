"""Every command is documented with an example (the CLI is the user's manual)."""

from __future__ import annotations

import click
from click.testing import CliRunner

from pipeline.cli import main


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
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


HEAVY = ("numpy", "polars", "pyarrow", "duckdb", "numba", "altair", "scipy", "rich", "vl_convert")


def test_help_imports_no_stage() -> None:
    """``rooftrace --help`` and every command's ``--help`` import none of the heavy libraries:
    each command module imports its stage only when the command runs (pipeline/cli/__init__.py)."""
    import subprocess
    import sys

    names = [n for n, _ in _commands(main)]
    script = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from pipeline.cli import main\n"
        "r = CliRunner()\n"
        f"for args in [[]] + [n.split() for n in {names!r}]:\n"
        "    assert r.invoke(main, [*args, '--help']).exit_code == 0, args\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_command_imports_its_stage_when_it_runs() -> None:
    """The lazy registry names real commands: running one imports what it needs (here: fit)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from pipeline.cli import main\n"
        "r = CliRunner().invoke(main, ['fit', '--model', 'llama-3.1-8b', '--hardware', 'h100-sxm', '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print('numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stdout + out.stderr


def test_help_choices_are_the_stages_own() -> None:
    """The option choices --help shows without importing a stage (pipeline/common/defaults.py) are
    exactly what the stages read and write."""
    from pipeline.common import defaults
    from pipeline.common.tables import FORMATS
    from pipeline.ingest import ALL_FORMATS
    from pipeline.synth import SYNTH_FORMATS

    assert defaults.INGEST_FORMATS == ALL_FORMATS
    assert defaults.SYNTH_FORMATS == SYNTH_FORMATS
    assert defaults.OUTPUT_FORMATS == FORMATS
    from pipeline.engine.shard import EXECUTORS

    assert defaults.REPLAY_EXECUTORS == EXECUTORS
    from pipeline.economics.stack import PURCHASES

    assert defaults.PURCHASE_MODELS == PURCHASES
