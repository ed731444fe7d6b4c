"""Shared checks for tests that drive the command line: run ``rooftrace`` in-process and read
its one-line error."""

from __future__ import annotations

import csv
import io
from typing import Any

from click.testing import CliRunner, Result

from pipeline.cli import main


def invoke(args: list[str]) -> Any:
    """``rooftrace ARGS`` in-process; an exception the CLI does not turn into a message escapes."""
    return CliRunner().invoke(main, args, catch_exceptions=False)


def one_error_line(stderr: str) -> str:
    """The single ``error:`` line of ``stderr`` (no traceback)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr
    return errors[0]


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    """``rooftrace ARGS`` in-process, exceptions caught (as the command line shows them)."""
    return CliRunner().invoke(main, list(args), env=env)


def one_error(res: Result, *needles: str) -> str:
    """Exit 1, exactly one ``error:`` line on stderr holding ``needles``, no traceback."""
    assert res.exit_code == 1, (res.exit_code, res.stdout, res.stderr, res.exception)
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def rows(res: Result) -> list[dict[str, str]]:
    """The CSV rows a successful command printed."""
    assert res.exit_code == 0, (res.stderr, res.exception)
    return list(csv.DictReader(io.StringIO(res.stdout)))
