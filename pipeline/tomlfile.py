"""Read a TOML file into a dict, turning every way it can fail into one ``ConfigError`` line.

Every TOML the tool reads (fleets, price tables, SLO presets, catalog entries, ingest mappings,
profile metadata, schemas) goes through :func:`read_toml`, so a missing file, a directory, bytes
that are not UTF-8, a document nested deeper than the parser's recursion allows and a syntax error
all read the same way wherever they occur: ``<path>: <what> …``.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from .errors import ConfigError


def read_toml(path: Path | str, what: str = "TOML file") -> dict[str, Any]:
    """The parsed document at ``path``; ``what`` names it in errors ("fleet file", "price file")."""
    path = Path(path)
    try:
        data = _read_pipe(path, what) if _is_pipe(path) else path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: {what} is a directory, not a file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {what} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {what} is not valid TOML: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: {what} is not valid TOML: nested too deeply to read") from None
    except ValueError as exc:  # an integer past Python's 4,300-digit conversion limit
        raise ConfigError(f"{path}: {what} holds a value too long to read ({str(exc).split(':')[0]})") from None


def _is_pipe(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(path.stat().st_mode)
    except OSError:
        return False  # (reading it says why)


def _read_pipe(path: Path, what: str) -> bytes:
    """The bytes of a pipe (``--fleet <(...)``). Opened without waiting for a writer, so a named
    pipe nobody writes to is an empty read and one error line, not a read blocked forever
    (Ctrl-C could not stop it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)  # a writer that is there: read to its end
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read()
    finally:
        if fd >= 0:
            os.close(fd)
    if not data.strip():
        raise ConfigError(f"{path}: {what} is a named pipe with nothing written to it")
    return data
