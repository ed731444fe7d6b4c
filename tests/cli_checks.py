"""Shared checks for tests that drive the command line: run ``rooftrace`` in-process and read
its one-line error."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

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
