"""Shared Click plumbing: the --store and --json options and the error boundary.

Every command runs its library call inside :func:`run`, which turns a :class:`RooftraceError`
into one line on stderr and exit code 1 (the user must act); usage errors stay Click's exit 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from pipeline.errors import RooftraceError
from pipeline.store import Store, open_store

F = TypeVar("F", bound=Callable[..., Any])


def store_option(fn: F) -> F:
    return click.option(
        "--store",
        "store_path",
        type=click.Path(file_okay=False),
        default=None,
        help="Store directory (default: $ROOFTRACE_STORE or traces/store).",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")(fn)


def get_store(store_path: str | None) -> Store:
    return open_store(store_path)


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))


def progress(message: str) -> None:
    """Progress and messages go to stderr, so stdout stays clean for --json."""
    click.echo(message, err=True)


def run(fn: Callable[[], Any]) -> Any:
    """Call ``fn``; turn rooftrace errors into a one-line message and exit code 1."""
    try:
        return fn()
    except RooftraceError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
