"""Shared Click plumbing: the --store and --json options and the error boundary.

Every command runs its library call inside :func:`run`, which turns a :class:`RooftraceError`
into one line on stderr and exit code 1 (the user must act), and Ctrl-C into one line and exit
code 130 (no traceback); usage errors stay Click's exit 2. Inside :func:`run`, long replays report
their progress on stderr (pipeline/replay/limits.py).
"""

from __future__ import annotations

import contextvars
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pipeline.common.defaults import (
    DEFAULT_REPLAY_EXECUTOR,
    MAX_MEMORY_ENV,
    MAX_SIM_DAYS_ENV,
    OUTPUT_FORMATS,
    PURCHASE_MODELS,
    REPLAY_EXECUTORS,
)
from pipeline.common.errors import RooftraceError
from pipeline.common.terminal import escape_controls, escape_lines

if TYPE_CHECKING:
    from pipeline.ingest.store import Store

# Only the standard library, click and pipeline.common.defaults/errors/terminal at module level: every command's
# --help is answered from here without importing a stage (tests/test_cli.py, test_help_imports_no_stage).

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def store_option(fn: F) -> F:
    return click.option(
        "--store",
        "store_path",
        type=click.Path(file_okay=False),
        default=None,
        help="Store directory (default: $ROOFTRACE_STORE, else the store of the rooftrace.toml found from the "
        "current directory, else ./traces/store).",
    )(fn)


#: Whether the running command was asked for --json: its failure is then a JSON document on
#: stdout too ({"error": ..., "exit_code": ...}), so a script reading stdout never gets nothing.
_JSON_MODE: contextvars.ContextVar[bool] = contextvars.ContextVar("rooftrace_json_mode", default=False)


def _note_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        _JSON_MODE.set(True)
    return value


def json_option(fn: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, callback=_note_json, help="Print one JSON document on stdout."
    )(fn)


def get_store(store_path: str | None) -> Store:
    from pipeline.ingest.store import open_store

    return open_store(store_path)


def output_options(fn: F) -> F:
    """``--format`` (table, csv, json, parquet) and ``--out FILE`` of ``sql`` and ``query``."""
    fn = click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write to FILE.")(fn)
    return click.option(
        "--format", "fmt", type=click.Choice(OUTPUT_FORMATS), default="table", show_default=True, help="Output format."
    )(fn)


def emit_output(result: Any, wrote: str | None = None) -> None:
    """Print a ``warehouse.SqlOutput`` (``sql`` and ``query``): bytes (parquet to a pipe) or text
    on stdout, else ``wrote`` on stderr; its note (rows left out of a table) on stderr."""
    import sys

    if result.data is not None:  # --format parquet --out -
        sys.stdout.flush()
        sys.stdout.buffer.write(result.data)
        sys.stdout.buffer.flush()
    if result.text is not None:
        click.echo(result.text, nl=False)
    elif result.data is None and wrote is not None:
        progress(wrote)
    if result.note is not None:
        progress(result.note)


def emit_json(doc: Any) -> None:
    """``doc`` on stdout as strict JSON (a value that is not finite is null: bare ``Infinity`` /
    ``NaN`` are not JSON, and a plan with an unservable row used to print them)."""
    from pipeline.common.tables import json_safe

    click.echo(json.dumps(json_safe(doc), indent=2, sort_keys=True, default=str, allow_nan=False))


def progress(message: str) -> None:
    """Progress and messages go to stderr, so stdout stays clean for --json. A message may carry
    values from a log (a model or file name): every control character in it is shown escaped
    (pipeline/common/terminal.py), so no value retitles the terminal or reorders the line."""
    click.echo(escape_lines(message), err=True)


def warn(text: str) -> None:
    """One ``warning:`` line on stderr, the text escaped whole (a warning is one line, and it
    quotes log values: a model name with ESC or a right-to-left override is shown, not obeyed)."""
    click.echo(f"warning: {escape_controls(text)}", err=True)


def echo(text: str) -> None:
    """A result line on stdout, escaped as :func:`progress` escapes (it may quote log values)."""
    click.echo(escape_lines(text))


#: Exit code of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


@contextmanager
def error_boundary() -> Iterator[None]:
    """The CLI's one error handler: a rooftrace error becomes one ``error:`` line on stderr and
    exit code 1 (the user must act), Ctrl-C one line and exit code 130, never a traceback. Every
    command runs inside it (pipeline/cli/__init__.py, ``LazyGroup.invoke``)."""
    try:
        yield
    except RooftraceError as exc:
        click.echo(f"error: {escape_lines(str(exc))}", err=True)
        _json_failure(str(exc), 1)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted (Ctrl-C)", err=True)
        _json_failure("interrupted (Ctrl-C)", EXIT_INTERRUPTED)
        sys.exit(EXIT_INTERRUPTED)


def _json_failure(message: str, code: int) -> None:
    if _JSON_MODE.get():
        click.echo(json.dumps({"error": message, "exit_code": code}))


def run(fn: Callable[[], Any]) -> Any:
    """Call ``fn`` inside :func:`error_boundary`, with long replays reporting progress on stderr."""
    from pipeline.common.budget import progress_to
    from pipeline.common.system import keep_ignored_sigint

    keep_ignored_sigint()  # a SIGINT the caller ignores stays ignored (polars' import installs a handler)
    with error_boundary(), progress_to(progress, live=_stderr_is_terminal()):
        return fn()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # (closed, or replaced by an object without it)
        return False


def old_option_name(old: str, new: str, dest: str) -> Callable[[F], F]:
    """A hidden, deprecated spelling ``old`` of option ``new`` (whose parameter is ``dest``): it
    still works, with a ``warning:`` line that names ``new``; giving both, with different values,
    is a usage error. The command reads the value with :func:`option_value`."""

    def note(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            warn(f"{old} is deprecated; use {new} (the same values)")
            ctx.meta[f"rooftrace.old.{dest}"] = (old, value)
        return value

    return click.option(old, f"_old_{dest}", hidden=True, default=None, callback=note, expose_value=False)


def option_value(dest: str, value: T, new: str) -> T:
    """The value of option ``dest`` given by its new name or by its old one (:func:`old_option_name`)."""
    ctx = click.get_current_context(silent=True)
    given = ctx.meta.get(f"rooftrace.old.{dest}") if ctx is not None else None
    if given is None:
        return value
    old, old_value = given
    source = ctx.get_parameter_source(dest) if ctx is not None else None
    if source is click.core.ParameterSource.COMMANDLINE and old_value != value:
        raise click.UsageError(f"{new} {value} and {old} {old_value} disagree: give {new} only")
    return old_value  # type: ignore[no-any-return]


def _validated(parser: str) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    """A callback that checks the option with ``pipeline.common.budget.<parser>`` (imported when used)."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            from pipeline.common import budget as limits

            try:
                getattr(limits, parser)(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
        return value

    return check


@contextmanager
def limits_from(max_memory: str | None, max_sim_days: str | None) -> Iterator[None]:
    """The limits of ``limit_options`` in force for the duration (options not given: unchanged)."""
    from pipeline.common.budget import override, parse_days, parse_size

    given: dict[str, Any] = {}
    if max_memory is not None:
        given["max_memory"] = parse_size(max_memory)
    if max_sim_days is not None:
        given["max_sim_days"] = parse_days(max_sim_days)
    with override(**given):
        yield


def limit_options(fn: F) -> F:
    """``--max-memory`` and ``--max-sim-days`` (pipeline/replay/limits.py; apply them with
    :func:`limits_from`)."""
    fn = click.option(
        "--max-memory",
        callback=_validated("parse_size"),
        default=None,
        metavar="SIZE",
        help="Refuse a replay estimated to need more memory: 64GiB, 512MiB, 80% (of physical memory) or none "
        f"(default: ${MAX_MEMORY_ENV}, else 50% of physical memory).",
    )(fn)
    return click.option(
        "--max-sim-days",
        callback=_validated("parse_days"),
        default=None,
        metavar="DAYS",
        help="Refuse an open-loop replay whose arrivals span more simulated days (--rate-scale stretches them) "
        f"or none (default: ${MAX_SIM_DAYS_ENV}, else 30).",
    )(fn)


def jobs_option(fn: F) -> F:
    """``--jobs``: worker processes reading log files (pipeline/ingest; the store ends identical)."""
    return click.option(
        "--jobs",
        type=click.IntRange(1, 256),
        default=1,
        show_default=True,
        help=(
            "Worker processes reading the log files; a large JSON Lines file is split at line "
            "boundaries (the store ends identical to --jobs 1)."
        ),
    )(fn)


def pod_options(fn: F) -> F:
    """``--pods``, ``--executor`` and ``--ray-address``: where a replay's pods run
    (pipeline/engine/shard.py; docs/scale.md)."""
    fn = click.option(
        "--ray-address", default=None, help="Ray cluster address for --executor ray (default: a local one)."
    )(fn)
    fn = click.option(
        "--executor",
        type=click.Choice(REPLAY_EXECUTORS),
        default=DEFAULT_REPLAY_EXECUTOR,
        show_default=True,
        help="Where the pods run: one after another here, in threads here (a usable core each; a large replay of "
        "a round robin or affinity fleet then runs in a pod a core), in local processes, or as Ray tasks "
        "(optional extra).",
    )(fn)
    return click.option(
        "--pods",
        type=click.IntRange(1, 1_000_000),
        default=1,
        show_default=True,
        help="Replay the fleet in N pods of replicas, each alone: the same results bit for bit, for round robin and "
        "affinity routers (docs/scale.md).",
    )(fn)


# --------------------------------------------------------------------------------------------
# shared by several commands


def check_out_of_store(store: Store | None, path: Path | str | None, option: str) -> None:
    """Refuse an output ``path`` (a file or a folder, given as ``option``) that would write over
    the store's own files: the store's folder itself, anything in one of its folders (runs/,
    requests/, accounting/, quarantine/, plans/, costs/, validation/ and the hidden ones) or one
    of its files (manifest.parquet, warehouse.duckdb...). Links are followed and real paths
    compared, so a link to a run's config.json is refused too. One line naming the path, before
    any work; a new file beside them at the store's top (STORE/report.html) is let through."""
    if store is None or path is None:
        return
    try:
        root = store.root.resolve()
        real = Path(path).resolve()
    except (OSError, RuntimeError):  # (a link loop: the write itself says why)
        return
    if real != root and root not in real.parents:
        return
    parts = real.relative_to(root).parts
    folders = {
        d.name
        for d in (
            store.requests_dir,
            store.quarantine_dir,
            store.accounting_dir,
            store.runs_dir,
            store.validation_dir,
            store.cache_dir,
            store.staging_dir,
            store.plan_dir("x").parent,
            store.cost_dir("x").parent,
        )
    }
    if not parts:
        what = "the store's own folder"
    else:
        first = parts[0]
        # (the hidden names are the store's: .lock, .cache, .staging, its files' temporary names)
        owned = first in folders or first == store.manifest_path.name or first.startswith(".")
        if not (owned or first.startswith(store.warehouse_path.name)):  # (and its .wal)
            return
        folder = first in folders or len(parts) > 1
        what = f"{'in ' if len(parts) > 1 else ''}the {first}{'/ folder' if folder else ''} of the store {root}"
    raise RooftraceError(
        f"{option} {path}: {real} is {what}; output never goes over the store's own files: write it elsewhere"
    )


def default_store() -> Store | None:
    """The store a command without --store would use ($ROOFTRACE_STORE, else the project's), not
    opened (nothing repaired or created), for :func:`check_out_of_store`; None when the project's
    settings cannot be read (the commands that need them say why)."""
    from pipeline.ingest.project import default_store_path
    from pipeline.ingest.store import Store

    try:
        return Store(default_store_path())
    except (RooftraceError, OSError):
        return None


def gib(x: float) -> str:
    return f"{x / 2**30:,.2f} GiB"


def fmt_num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _refuse_empty_path(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """The path as a Path, an empty one refused (``Path('')`` is ``.``, the current folder)."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter("the path is empty (name a folder)")
    return Path(value)


reports_option = click.option(
    "--reports",
    "reports_dir",
    type=click.Path(file_okay=False),
    callback=_refuse_empty_path,
    default=None,
    help="Reports folder (default: the rooftrace.toml project's reports, else ./reports).",
)


def cost_stack_options(prefix: str = "") -> Callable[[F], F]:
    """The cost stack's stated inputs as options (pipeline/economics/stack.py: ``cost`` and
    ``plan --objective`` take the same ones), each help text after ``prefix``."""

    def say(text: str) -> str:
        return f"{prefix}{text}" if prefix else text[:1].upper() + text[1:]

    options = [
        click.option(
            "--purchase", type=click.Choice(PURCHASE_MODELS), default=None, help=say("how the GPUs are bought.")
        ),
        click.option(
            "--spot-interruptions-per-day", type=float, default=None, help=say("spot: interruptions per replica a day.")
        ),
        click.option(
            "--spot-restart-s", type=float, default=None, help=say("spot: seconds a replica is lost per interruption.")
        ),
        click.option("--redundancy", type=int, default=None, help=say("k of N+k: spare replicas per pool.")),
        click.option(
            "--network", default=None, help=say("network overhead: '10%' of the GPU cost or '2.5/h' dollars an hour.")
        ),
        click.option("--storage", default=None, help=say("storage overhead: '10%' or '2.5/h'.")),
        click.option("--operations", default=None, help=say("operations overhead: '10%' or '2.5/h'.")),
        click.option("--margin", type=float, default=None, help=say("margin, % on top of every cost line.")),
        click.option(
            "--electricity/--no-electricity",
            default=None,
            help=say(
                "count the GPUs' electricity as a line (owned GPUs; a cloud GPU-hour price already pays for the "
                "power; default: the fleet's [cost])."
            ),
        ),
    ]

    def wrap(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return wrap
