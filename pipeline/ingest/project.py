"""Where a command reads and writes when no path is given: the project, found from the current
directory.

Like git or dbt, rooftrace looks for a project file, ``rooftrace.toml``, in the current directory
and then in each parent. Its folder is the project root, and its optional keys say where things
live, relative to that folder::

    store = "traces/store"            # the Parquet store (default)
    reports = "reports"               # the reports folder (default)
    fleet = "fleets/default.toml"     # the fleet replay, nightly and plan use without --fleet

    [models]                          # aliases: a model name as the logs say it = a catalog id
    "my-70b-deployment" = "llama-3.1-70b"

Without a project file the current directory is the root, with the same defaults. ``--store`` /
``$ROOFTRACE_STORE`` and ``--reports`` still win. Nothing is ever written next to the installed
package: a copy of a checkout writes into the copy, a directory outside any checkout into itself.
Only reading falls back to the source checkout the package runs from (the bundled sample, and
its ``fleets/default.toml`` when the project has no fleet of its own).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import read_toml

PROJECT_FILE = "rooftrace.toml"
STORE_ENV = "ROOFTRACE_STORE"
_KEYS = {"store": "traces/store", "reports": "reports", "fleet": "fleets/default.toml"}


@dataclass(frozen=True)
class Project:
    """The project root and the paths its commands default to."""

    root: Path
    #: The rooftrace.toml found (None: the current directory, no project file).
    file: Path | None
    store: Path
    reports: Path
    fleet: Path
    #: ``[models]``: logged model names (as the logs spell them) -> catalog ids, checked on load
    #: (pipeline/catalog/names.py reads them first).
    models: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def find_project(start: Path | None = None) -> Project:
    """The project of ``start`` (default: the current directory): the nearest ``rooftrace.toml``
    at or above it, else ``start`` itself with the default layout."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / PROJECT_FILE
        if candidate.is_file():
            return _load(candidate)
    return Project(here, None, here / _KEYS["store"], here / _KEYS["reports"], here / _KEYS["fleet"])


def _load(path: Path) -> Project:
    from pipeline.common.tomlschema import ProjectFile, check  # lazy: pydantic, loaded only when a file is read

    data = read_toml(path, "project file")
    check(data, ProjectFile, str(path))  # keys and types (pipeline/common/tomlschema.py); values below
    paths = {}
    for key, default in _KEYS.items():
        value = data.get(key, default)
        if not value.strip() or "\x00" in value:
            raise ConfigError(f"{path}: {key} must be a path (text), got {value!r}")
        paths[key] = path.parent / value
    models = _model_aliases(path, data.get("models", {}))
    return Project(path.parent, path, paths["store"], paths["reports"], paths["fleet"], models)


def _model_aliases(path: Path, table: object) -> Mapping[str, str]:
    """The ``[models]`` table: each key a model name as logged, each value a catalog model id
    (one line naming the file and key otherwise)."""
    if not isinstance(table, dict) or not table:
        return MappingProxyType({})
    from pipeline.catalog.entries import list_models  # lazy: pyarrow; only a project with aliases reads the catalog

    known = list_models()
    for key, value in table.items():
        if not key.strip() or "\x00" in key:
            raise ConfigError(f"{path}: [models] {key!r}: an alias must be a model name as logged, got {key!r}")
        if value not in known:
            raise ConfigError(f"{path}: [models] {key!r} = {value!r}: no catalog model {value!r}; known: {known}")
    return MappingProxyType(dict(table))


def default_store_path() -> Path:
    """``$ROOFTRACE_STORE``, else the project's store (see the module doc)."""
    env = os.environ.get(STORE_ENV)
    return Path(env) if env else find_project().store


def default_reports_dir() -> Path:
    return find_project().reports


def source_checkout() -> Path | None:
    """The source checkout this package runs from, if any (has pyproject.toml and traces/): read
    from (the bundled sample), never written to."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").exists() and (root / "traces").is_dir():
        return root
    return None


def default_fleet_path() -> Path:
    """The project's fleet, else ``fleets/default.toml`` of the source checkout (read only)."""
    project = find_project()
    if project.fleet.is_file() or project.file is not None:
        return project.fleet
    checkout = source_checkout()
    if checkout is not None and (checkout / "fleets" / "default.toml").is_file():
        return checkout / "fleets" / "default.toml"
    return project.fleet  # missing: the caller's "fleet file not found" names it


def sample_dir() -> Path:
    """The bundled sample traces (only in a source checkout)."""
    for root in (find_project().root, source_checkout()):
        if root is not None and (root / "traces" / "sample").is_dir():
            return root / "traces" / "sample"
    raise ConfigError("the bundled sample (traces/sample) is only in a source checkout")
