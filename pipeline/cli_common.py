"""Shared Click plumbing: the --store and --json options and the error boundary.

Every command runs its library call inside :func:`run`, which turns a :class:`RooftraceError`
into one line on stderr and exit code 1 (the user must act), and Ctrl-C into one line and exit
code 130 (no traceback); usage errors stay Click's exit 2. Inside :func:`run`, long replays report
their progress on stderr (pipeline/limits.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from pipeline.errors import RooftraceError
from pipeline.limits import MAX_MEMORY_ENV, MAX_SIM_DAYS_ENV, override, parse_days, parse_size, progress_to
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


#: Exit code of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


def run(fn: Callable[[], Any]) -> Any:
    """Call ``fn``; turn rooftrace errors into a one-line message and exit code 1, Ctrl-C into
    one line and exit code 130. Long replays inside report progress on stderr."""
    try:
        with progress_to(progress):
            return fn()
    except RooftraceError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted (Ctrl-C)", err=True)
        sys.exit(EXIT_INTERRUPTED)


def _validated(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                parse(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
        return value

    return check


@contextmanager
def limits_from(max_memory: str | None, max_sim_days: str | None) -> Iterator[None]:
    """The limits of ``limit_options`` in force for the duration (options not given: unchanged)."""
    given: dict[str, Any] = {}
    if max_memory is not None:
        given["max_memory"] = parse_size(max_memory)
    if max_sim_days is not None:
        given["max_sim_days"] = parse_days(max_sim_days)
    with override(**given):
        yield


def limit_options(fn: F) -> F:
    """``--max-memory`` and ``--max-sim-days`` (pipeline/limits.py; apply them with
    :func:`limits_from`)."""
    fn = click.option(
        "--max-memory",
        callback=_validated(parse_size),
        default=None,
        metavar="SIZE",
        help="Refuse a replay estimated to need more memory: 64GiB, 512MiB, 80% (of physical memory) or none "
        f"(default: ${MAX_MEMORY_ENV}, else 50% of physical memory).",
    )(fn)
    return click.option(
        "--max-sim-days",
        callback=_validated(parse_days),
        default=None,
        metavar="DAYS",
        help="Refuse an open-loop replay whose arrivals span more simulated days (--rate-scale stretches them) "
        f"or none (default: ${MAX_SIM_DAYS_ENV}, else 30).",
    )(fn)
