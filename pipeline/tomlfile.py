"""Read a TOML file into a dict, turning every way it can fail into one ``ConfigError`` line.

Every TOML the tool reads (fleets, price tables, SLO presets, catalog entries, ingest mappings,
profile metadata, schemas) goes through :func:`read_toml`, so a missing file, a directory, bytes
that are not UTF-8, a document nested deeper than the parser's recursion allows and a syntax error
all read the same way wherever they occur: ``<path>: <what> …``.
"""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path
from typing import Any

from .errors import ConfigError


def read_toml(path: Path | str, what: str = "TOML file") -> dict[str, Any]:
    """The parsed document at ``path``; ``what`` names it in errors ("fleet file", "price file")."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a named pipe would block the read forever
            raise ConfigError(f"{path}: {what} is not a regular file (a named pipe, socket or device)")
    except OSError:
        pass  # (opening it says why)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: {what} is a directory, not a file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {what} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {what} is not valid TOML: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: {what} is not valid TOML: nested too deeply to read") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
