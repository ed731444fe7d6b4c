"""Read a TOML file into a dict, turning every way it can fail into one ``ConfigError`` line.

Every TOML the tool reads (fleets, price tables, SLO presets, catalog entries, ingest mappings,
profile metadata, schemas) goes through :func:`read_toml`, so a missing file, a directory, a
device, a file past :data:`MAX_CONFIG_BYTES`, bytes that are not UTF-8, a document nested deeper
than the parser's recursion allows and a syntax error all read the same way wherever they occur:
``<path>: <what> …``. :func:`read_config_bytes` is the same read for other config files (a
Hugging Face ``config.json``).
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from pipeline.common.system import not_regular

from .errors import ConfigError

#: The most bytes a config file (TOML, a Hugging Face config.json) may hold: 16 MiB, about a
#: thousand times the largest the tool ships or reads (a fleet or price table is a few KiB). At most
#: this much plus one byte is ever read, so ``/dev/zero``, a multi-GB file or ``--fleet <(yes)``
#: is one error line, not all of memory.
MAX_CONFIG_BYTES = 16 * 2**20


def read_toml(path: Path | str, what: str = "TOML file") -> dict[str, Any]:
    """The parsed document at ``path``; ``what`` names it in errors ("fleet file", "price file")."""
    path = Path(path)
    data = read_config_bytes(path, what)
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


def read_config_bytes(path: Path | str, what: str = "config file") -> bytes:
    """The bytes of the config file at ``path`` (links followed): a regular file or a pipe of at
    most :data:`MAX_CONFIG_BYTES`. Anything else (missing, a folder, a device, a socket, larger)
    is one ``ConfigError`` line naming ``path`` and ``what``."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError
        if stat.S_ISFIFO(mode):
            data = _read_pipe(path, what)
        elif stat.S_ISREG(mode):
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size > MAX_CONFIG_BYTES:
                    raise ConfigError(_too_large(path, what))
                data = fh.read(MAX_CONFIG_BYTES + 1)  # (a file that grows, or lies about its size)
        else:
            raise ConfigError(f"{path}: {what} is {not_regular(path) or 'not a file'}, not a regular file")
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: {what} is a directory, not a file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except ValueError as exc:  # a path holding a NUL byte
        raise ConfigError(f"{str(path)!r}: cannot read {what}: {exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(_too_large(path, what))
    return data


def _too_large(path: Path, what: str) -> str:
    return f"{path}: {what} is larger than {MAX_CONFIG_BYTES // 2**20} MiB; not a config file"


def _read_pipe(path: Path, what: str) -> bytes:
    """The bytes of a pipe (``--fleet <(...)``), at most ``MAX_CONFIG_BYTES + 1`` of them. Opened
    without waiting for a writer, so a named pipe nobody writes to is an empty read and one error
    line, not a read blocked forever (Ctrl-C could not stop it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)  # a writer that is there: read to its end (or past the cap)
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read(MAX_CONFIG_BYTES + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if not data.strip():
        raise ConfigError(f"{path}: {what} is a named pipe with nothing written to it")
    return data
