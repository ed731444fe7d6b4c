"""``STORE/warehouse.duckdb``: DuckDB views over the Parquet store, and named queries.

The warehouse holds no data of its own, only views (absolute paths into the store), so it is
cheap to rebuild and any DuckDB client can open it. It is rebuilt beside the old file and renamed
into place. A table with no files yet gets an empty view with its declared columns, so every
named query runs on any store.

The views depend on which files exist (a table's first file, every run's files, where the store
is), so the warehouse records what it was built from (``warehouse_info.files_key``) and every
reader (:func:`connect`) rebuilds it first when that changed: a new run, a table's first rows, a
moved store, a changed hardware catalog. A store the reader may not write gets a private
warehouse outside it, built for that connection.

Named queries are ``pipeline/publish/queries/<name>.sql``. Their first comment lines describe them
(``-- description``) and name their parameters (``-- params: run_id, date``); parameters are read
with DuckDB's ``getvariable('name')`` and set with ``SET VARIABLE`` before the query runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import difflib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import tomllib
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.catalog import list_hardware, load_hardware
from pipeline.catalog.entries import hardware_dir
from pipeline.classify.freshness import classify_freshness
from pipeline.common.budget import current_limits
from pipeline.common.defaults import MAX_MEMORY_ENV, OUTPUT_FORMATS
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import check_file_schema, check_replaceable, load_schema, os_write_reason, unreadable
from pipeline.common.system import not_regular
from pipeline.common.tables import _cell, for_csv, render, table_to_json
from pipeline.common.terminal import escape_controls
from pipeline.common.units import format_bytes
from pipeline.ingest.store import Store, check_date
from pipeline.replay.runfolder import latest_run, read_checked_config, read_config, run_date, run_ids

QUERY_DIR = Path(__file__).with_name("queries")

_DUCK_TYPES = {
    "string": "VARCHAR",
    "bool": "BOOLEAN",
    "int8": "TINYINT",
    "int16": "SMALLINT",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "uint32": "UINTEGER",
    "uint64": "UBIGINT",
    "float32": "FLOAT",
    "float64": "DOUBLE",
    "date32": "DATE",
    "timestamp[us, UTC]": "TIMESTAMPTZ",
    "timestamp[us]": "TIMESTAMP",
}


def _duck_type(t: str) -> str:
    if t.startswith("list<"):
        return _duck_type(t[5:-1]) + "[]"
    return _DUCK_TYPES[t]


def _empty_view(schema_name: str, extra: Mapping[str, str] | None = None) -> str:
    cols = [f'CAST(NULL AS {_duck_type(c.type)}) AS "{c.name}"' for c in load_schema(schema_name).columns]
    cols += [f'CAST(NULL AS {t}) AS "{n}"' for n, t in (extra or {}).items()]
    return f"SELECT {', '.join(cols)} LIMIT 0"


def _lit(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


@dataclass(frozen=True)
class ViewSpec:
    name: str
    schema: str | None  # declared schema of the files (for the empty view)
    glob: str  # relative to the store root
    kind: str  # "hive" (date=... folders), "run" (runs/<id>/...), "plain", "json"
    doc: str


VIEWS: tuple[ViewSpec, ...] = (
    ViewSpec("requests", "requests", "requests/*/*.parquet", "hive", "canonical requests, one row per request"),
    ViewSpec("quarantine", "quarantine", "quarantine/*.parquet", "plain", "rejected records with reasons"),
    ViewSpec("manifest", "manifest", "manifest.parquet", "plain", "ingested files and their row accounting"),
    ViewSpec(
        "accounting_requests",
        "accounting_requests",
        "accounting/requests/*/*.parquet",
        "hive",
        "fresh vs cache-hit tokens per request",
    ),
    ViewSpec(
        "accounting_minutes",
        "accounting_minutes",
        "accounting/minutes/*/*.parquet",
        "hive",
        "token family rates per minute (overall, per tenant, per model)",
    ),
    ViewSpec("cache_curve", "cache_curve", "accounting/cache_curve/*/*.parquet", "hive", "prefix-cache capacity curve"),
    ViewSpec("runs", None, "runs/*/config.json", "json", "replay runs: resolved fleet, options and summary"),
    ViewSpec(
        "replay_requests", "replay_requests", "runs/*/requests.parquet", "run", "replayed requests with latencies"
    ),
    ViewSpec("replay_steps", "replay_steps", "runs/*/steps.parquet", "run", "engine step spans"),
    ViewSpec("replay_series", "replay_series", "runs/*/series.parquet", "run", "per replica per second series"),
    ViewSpec(
        "load_curve",
        "load_curve",
        "runs/*/load_curve.parquet",
        "plain",
        "headroom: the traffic of each run at several multipliers",
    ),
    ViewSpec("plans", "plan", "plans/*/plan.parquet", "plain", "capacity plans: one row per configuration"),
    ViewSpec("plan_search", "plan_search", "plans/*/search.parquet", "plain", "replica-search replays of each plan"),
    ViewSpec("gpu_cost", "plan_gpu_cost", "costs/*/gpu_cost.parquet", "plain", "GPU cost split by token class"),
    ViewSpec("api_cost", "plan_api_cost", "costs/*/api_cost.parquet", "plain", "API-equivalent cost vs self-hosted"),
)

_RUN_ID = r"regexp_extract(filename, '/runs/([^/]+)/[^/]+$', 1)"


def _per_run(spec: ViewSpec) -> bool:
    """Whether ``spec``'s files belong to replay runs (runs/<id>/...): a damaged one skips its run."""
    return spec.glob.startswith("runs/")


# --- what the views are built from, checked before DuckDB reads it ------------------------------


def check_parquet(path: Path) -> None:
    """Refuse (SchemaError naming ``path``) a file DuckDB could not open as Parquet: not a regular
    file, truncated, empty, not Parquet. Reads only the footer."""
    why = not_regular(path)
    if why is not None:
        raise RooftraceError(f"{path}: not a readable Parquet file: {why}")
    with unreadable(path):
        pq.read_metadata(path)


@dataclass
class _Scan:
    """The files each view reads: every store-level file checked (a damaged one is an error), and
    each run's files checked together (a damaged one skips its run, named in ``skipped``)."""

    files: dict[str, list[Path]] = dataclasses.field(default_factory=dict)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # run id -> why (one line naming the file)


def _request_files(store: Store) -> list[Path]:
    """The requests partitions' files as the store lists them (:meth:`Store.request_files`, date by
    date), not a glob of the folders: a file the store did not write (a copy, a stray table dropped
    in a date folder) never enters the ``requests`` view. Paths under the resolved store root."""
    root = store.root.resolve()
    return [root / f.relative_to(store.root) for date in store.dates() for f in store.request_files(date)]


def _partition_date(folder: Path) -> str | None:
    """The date of a partition folder named ``date=YYYY-MM-DD`` (a real date), else None."""
    text = folder.name.removeprefix("date=")
    if text == folder.name:
        return None
    try:
        return check_date(text)
    except RooftraceError:
        return None


def _view_files(store: Store, spec: ViewSpec) -> list[Path]:
    """The files ``spec``'s view reads, listed (the views name their files, never a glob): the
    requests partitions as the store lists them (:func:`_request_files`), a partitioned table's
    files in its own ``date=YYYY-MM-DD`` folders, the others as their glob finds them."""
    if spec.name == "requests":
        return _request_files(store)
    files = sorted(store.root.resolve().glob(spec.glob))
    if spec.kind == "hive":
        files = [f for f in files if _partition_date(f.parent) is not None]
    return files


def _partitioned_sql(files: Sequence[Path]) -> str:
    """A partitioned table's files as one query, its ``date`` column a literal per partition taken
    from each file's own folder (``date=YYYY-MM-DD``), never by DuckDB's hive partitioning: that
    reads every ``key=value`` folder of the absolute path as a column, so a store kept under
    ``/data/date=2020-01-01/store`` or ``/lake/model=x/store`` had every request dated 2020-01-01
    or every model 'x'. One branch per date: a filter on ``date`` prunes the other dates' files,
    as partition pruning did. Columns in the order the hive view gave them (the files' columns as
    ``union_by_name`` orders them, then ``date``)."""
    by_date: dict[str, list[Path]] = {}
    order: dict[str, None] = {}
    dated: set[str] = set()  # dates with a file that holds a `date` column of its own
    for f in files:
        date = _partition_date(f.parent)
        assert date is not None  # _view_files lists only date=YYYY-MM-DD folders
        by_date.setdefault(date, []).append(f)
        names = pq.read_schema(f).names
        if "date" in names:
            dated.add(date)
        order.update(dict.fromkeys(names))
    order.pop("date", None)
    branches = []
    for date, listed in sorted(by_date.items()):
        star = '* EXCLUDE ("date")' if date in dated else "*"
        paths = ", ".join(_lit(f) for f in listed)
        branches.append(
            f"SELECT {star}, DATE '{date}' AS \"date\" "
            f"FROM read_parquet([{paths}], hive_partitioning=false, union_by_name=true)"
        )
    if len(branches) == 1:
        return branches[0]
    columns = ", ".join('"' + name.replace('"', '""') + '"' for name in [*order, "date"])
    return f"SELECT {columns} FROM ({' UNION ALL BY NAME '.join(branches)})"


def _scan(store: Store) -> _Scan:
    scan = _Scan()
    listed = {spec.name: _view_files(store, spec) for spec in VIEWS}
    # a run folder holding run files but no config.json is no replay run: every command says so,
    # so its files are left out of every view too (they stayed in replay_* while `runs` had none)
    folders = {f.parent for spec in VIEWS if _per_run(spec) for f in listed[spec.name]}
    for folder in sorted(folders):
        if not (folder / "config.json").exists():
            scan.skipped[folder.name] = f"{folder / 'config.json'}: missing (a run folder without its config.json)"
    for spec in VIEWS:
        if _per_run(spec):
            for f in listed[spec.name]:
                if f.parent.name in scan.skipped:
                    continue
                try:
                    if spec.kind == "json":
                        read_checked_config(f)
                    else:
                        check_parquet(f)
                except RooftraceError as exc:
                    scan.skipped[f.parent.name] = str(exc)
        else:
            for f in listed[spec.name]:
                check_parquet(f)  # the store itself is damaged: one error, nothing is built
                if spec.name == "requests":  # the readers' schema check: no other table merged in
                    check_file_schema(f, "requests")
            scan.files[spec.name] = listed[spec.name]
    for spec in VIEWS:
        if _per_run(spec):
            scan.files[spec.name] = [f for f in listed[spec.name] if f.parent.name not in scan.skipped]
    return scan


def _view_sql(store: Store, spec: ViewSpec, scan: _Scan | None = None) -> str:
    root = store.root.resolve()
    pattern = root / spec.glob
    files = (scan or _scan(store)).files[spec.name]
    has_files = bool(files)
    if spec.kind == "json":
        if not has_files:
            return "SELECT CAST(NULL AS VARCHAR) AS run_id, CAST(NULL AS VARCHAR) AS date LIMIT 0"
        listed = "[" + ", ".join(_lit(f) for f in files) + "]"
        return (
            f"SELECT {_RUN_ID} AS run_id, * EXCLUDE (filename) "
            f"FROM read_json({listed}, filename=true, union_by_name=true, hive_partitioning=false, "
            "maximum_object_size=67108864)"
        )
    assert spec.schema is not None
    if not has_files:
        extra = {"date": "DATE"} if spec.kind == "hive" else {"run_id": "VARCHAR"} if spec.kind == "run" else None
        return _empty_view(spec.schema, extra)
    if spec.kind == "hive":  # the files listed (see _request_files), their date from their own folder
        return _partitioned_sql(files)
    # hive_partitioning=false everywhere: DuckDB would otherwise detect a `key=value` folder above
    # the store (/data/date=2020-01-01/store) and add it to every row as a column
    if spec.kind == "run":
        # One branch per run with a constant run_id: a filter on run_id then prunes every other
        # run's files instead of scanning them all (the warehouse is rebuilt after each replay).
        # a column a table may leave out (a single pool's tables have no ``pool``) is NULL in the
        # runs without it, so the view has it whichever runs the store holds
        optional = [c for c in load_schema(spec.schema).columns if c.optional]
        branches = []
        for f in files:
            if "'" in f.parent.name:
                continue
            names = set(pq.read_schema(f).names) if optional else set()
            fill = "".join(
                f', CAST(NULL AS {_duck_type(c.type)}) AS "{c.name}"' for c in optional if c.name not in names
            )
            branches.append(
                f"SELECT '{f.parent.name}' AS run_id, *{fill} FROM read_parquet({_lit(f)}, hive_partitioning=false)"
            )
        if not branches:
            return _empty_view(spec.schema, {"run_id": "VARCHAR"})
        return " UNION ALL BY NAME ".join(branches)
    if _per_run(spec):  # the runs' files that are not skipped, not every file the glob finds
        listed = ", ".join(_lit(f) for f in files)
        return f"SELECT * FROM read_parquet([{listed}], hive_partitioning=false, union_by_name=true)"
    return f"SELECT * FROM read_parquet({_lit(pattern)}, hive_partitioning=false, union_by_name=true)"


def hardware_catalog() -> pa.Table:
    """The hardware catalog as a table, so cost queries can join it (prices are dated data)."""
    rows = []
    for name in list_hardware():
        hw = load_hardware(name)
        rows.append(
            {
                "name": hw.name,
                "display_name": hw.display_name,
                "memory_bytes": hw.memory_bytes,
                "memory_bandwidth_bytes_per_s": hw.memory_bandwidth_bytes_per_s,
                "peak_bf16_flops_per_s": hw.peak_for("bf16"),
                "peak_fp8_flops_per_s": hw.peak_for("fp8"),
                "price_usd_per_gpu_hour": hw.price_usd_per_gpu_hour,
                "price_date": hw.price_date,
            }
        )
    return pa.Table.from_pylist(rows)


def warehouse_path(store: Store) -> Path:
    return store.warehouse_path


#: Bumped when the warehouse gains a table or a column (2: run_hardware; 3: run_hardware by pool,
#: the run views' ``pool``), so one built before is rebuilt.
WAREHOUSE_LAYOUT = 3


def files_key(store: Store) -> str:
    """What the views were built from: the store's place, which tables have files, every run's
    files, and the hardware catalog's files (their bytes: a reader never parses the catalog, so
    an entry that cannot be read breaks a rebuild, not the queries of a current warehouse)."""
    root = store.root.resolve()
    h = hashlib.sha256(str(root).encode())
    h.update(f"\0layout:{WAREHOUSE_LAYOUT}".encode())  # a warehouse of an older layout rebuilds
    for spec in VIEWS:
        if _per_run(spec) or spec.kind == "hive":
            # every run file (and partitioned file: the views list them) with its size and time:
            # a run damaged or repaired in place, a new partition or a file replaced rebuilds
            files = _view_files(store, spec)
            listed = sorted(f"{f.relative_to(root)}\0{_stamp(f)}" for f in files)
            h.update(f"\0{spec.name}:{len(listed)}\0".encode() + "\0".join(listed).encode())
        else:
            h.update(f"\0{spec.name}:{any(root.glob(spec.glob))}".encode())
    for entry in sorted(hardware_dir().glob("*.toml")):
        h.update(f"\0{entry.name}\0".encode())
        with contextlib.suppress(OSError):
            h.update(entry.read_bytes())
    return h.hexdigest()


def _stamp(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}"


#: Warnings already given by this process (a skipped run is named once, not at each connection).
_WARNED: set[str] = set()


def warn_stderr(message: str) -> None:
    """The default warning sink: one ``warning:`` line on stderr, once per message."""
    if message in _WARNED:
        return
    _WARNED.add(message)
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _skip_warning(run_id: str, why: str) -> str:
    return f"run {run_id} left out of the warehouse (re-run or delete it): {why}"


def _run_price(config: Mapping[str, Any]) -> tuple[str | None, float | None, str | None]:
    """The declared name, $/GPU-hour and price date of the hardware a run was replayed on, read
    from the snapshot of its hardware entry in ``config.json`` (``resolved.catalog.hardware``):
    a fleet whose ``hardware`` is a file path (a ``calibrate`` output) is priced like a catalog
    one. (None, None, None) when the snapshot is missing or holds no usable price."""
    resolved = config.get("resolved")
    catalog = resolved.get("catalog") if isinstance(resolved, dict) else None
    text = catalog.get("hardware") if isinstance(catalog, dict) else None
    if not isinstance(text, str):
        return None, None, None
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        return None, None, None
    name = data.get("name") if isinstance(data.get("name"), str) else None
    price = data.get("price")
    if not isinstance(price, dict):
        return name, None, None
    usd = price.get("usd_per_gpu_hour")
    if isinstance(usd, bool) or not isinstance(usd, int | float) or not 0 < usd <= 1e6:
        usd = None
    date = price.get("date")
    date_text = date if isinstance(date, str) else date.isoformat() if isinstance(date, datetime.date) else None
    return name, (float(usd) if usd is not None else None), date_text


def _whole(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def run_hardware(scan: _Scan) -> pa.Table:
    """One row per run and pool (a fleet of one pool: one row, ``pool`` NULL): the hardware it
    was replayed on (the fleet's ``hardware`` key and the declared name of the entry it
    recorded), its replicas and GPUs, with the price its config.json recorded."""
    rows = []
    for f in scan.files.get("runs", []):
        config = read_config(f)
        found = config.get("resolved")
        resolved: dict[str, Any] = found if isinstance(found, dict) else {}
        pools = resolved.get("pools") if isinstance(resolved.get("pools"), list) else None
        for item in pools if pools is not None else [resolved]:
            entry: dict[str, Any] = item if isinstance(item, dict) else {}
            fleet: dict[str, Any] = entry["fleet"] if isinstance(entry.get("fleet"), dict) else {}
            name, usd, date = _run_price({"resolved": entry})
            replicas, per = _whole(fleet.get("replicas")), _whole(entry.get("gpus_per_replica"))
            memory: dict[str, Any] = entry["memory"] if isinstance(entry.get("memory"), dict) else {}
            dp = _whole(fleet.get("dp")) or 1
            rows.append(
                {
                    "run_id": f.parent.name,
                    "name": name,
                    "price_usd_per_gpu_hour": usd,
                    "price_date": date,
                    "pool": entry.get("pool") if pools is not None else None,
                    "hardware": fleet.get("hardware") if isinstance(fleet.get("hardware"), str) else None,
                    "replicas": replicas,
                    "gpus_per_replica": per,
                    "gpus": replicas * per if replicas is not None and per is not None else None,
                    "tp": _whole(fleet.get("tp")),
                    "first_replica": _whole(entry.get("first_replica")) or 0,
                    "ranks": replicas * dp if replicas is not None else None,
                    "kv_capacity_blocks": _whole(memory.get("kv_capacity_blocks")),
                    "kv_pool_bytes_per_gpu": _number(memory.get("kv_pool_bytes_per_gpu")),
                }
            )
    schema = pa.schema(
        [
            ("run_id", pa.string()),
            ("name", pa.string()),
            ("price_usd_per_gpu_hour", pa.float64()),
            ("price_date", pa.string()),
            ("pool", pa.string()),
            ("hardware", pa.string()),
            ("replicas", pa.int64()),
            ("gpus_per_replica", pa.int64()),
            ("gpus", pa.int64()),
            ("tp", pa.int64()),
            ("first_replica", pa.int64()),
            ("ranks", pa.int64()),
            ("kv_capacity_blocks", pa.int64()),
            ("kv_pool_bytes_per_gpu", pa.float64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def build_warehouse(store: Store, target: Path | None = None, warn: Callable[[str], None] | None = warn_stderr) -> Path:
    """(Re)build STORE/warehouse.duckdb (or ``target``) atomically; returns its path.

    Every file the views read is checked first (its Parquet footer, a run's config.json): a damaged
    run is left out of every view, with a warning through ``warn`` naming the file, and recorded
    in the ``warehouse_skipped`` table (:func:`connect` repeats the warning); a damaged
    store-level file (a requests partition, the manifest, ...) is one RooftraceError naming it."""
    scan = _scan(store)
    if target is None:
        store.root.mkdir(parents=True, exist_ok=True)
        target = warehouse_path(store)
    fd, tmp_name = tempfile.mkstemp(prefix=".warehouse.", suffix=".duckdb", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # DuckDB wants to create the file itself
    try:
        con = duckdb.connect(str(tmp))
        try:
            catalog = hardware_catalog()  # noqa: F841  (read by a statement below)
            run_hw = run_hardware(scan)  # noqa: F841  (read by a statement below)
            key = files_key(store)  # before the views: a file that lands meanwhile rebuilds again
            for spec in VIEWS:
                try:
                    con.execute(f'CREATE VIEW "{spec.name}" AS {_view_sql(store, spec, scan)}')
                except duckdb.Error as exc:  # a file whose footer reads but whose columns do not
                    raise RooftraceError(
                        f"{store.root}: cannot build the warehouse view {spec.name!r}: {str(exc).splitlines()[0]}"
                    ) from None
                con.execute(f"COMMENT ON VIEW \"{spec.name}\" IS '{spec.doc}'")
            con.execute("CREATE TABLE hardware_catalog AS SELECT * FROM catalog")
            con.execute("COMMENT ON TABLE hardware_catalog IS 'GPU catalog: memory, bandwidth, peaks, price'")
            con.execute("CREATE TABLE run_hardware AS SELECT * FROM run_hw")
            con.execute(
                "COMMENT ON TABLE run_hardware IS 'each run and pool: its hardware, replicas, GPUs, replica "
                "numbers, KV capacity and price, from its config.json'"
            )
            con.execute("CREATE TABLE warehouse_info AS SELECT ? AS files_key", [key])
            con.execute("COMMENT ON TABLE warehouse_info IS 'what the views were built from (rebuilt when it changes)'")
            con.execute("CREATE TABLE warehouse_skipped (run_id VARCHAR, reason VARCHAR)")
            if scan.skipped:
                con.executemany("INSERT INTO warehouse_skipped VALUES (?, ?)", sorted(scan.skipped.items()))
            con.execute("COMMENT ON TABLE warehouse_skipped IS 'damaged runs left out of the views, and why'")
        finally:
            con.close()
        os.replace(tmp, target)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)
    except BaseException:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)
        raise
    if warn is not None:
        for run_id, why in sorted(scan.skipped.items()):
            warn(_skip_warning(run_id, why))
    return target


def _current_warehouse(store: Store, private: Path) -> Path:
    """The store's warehouse, rebuilt first when the store changed since it was built (or it is
    unreadable); for a store this user may only write nothing to, a fresh one in ``private``."""
    path = warehouse_path(store)
    if path.exists() and _built_from(path) == files_key(store):
        return path
    try:
        return build_warehouse(store, warn=None)  # connect() gives the warnings
    except OSError:  # a store this user may only read: a private warehouse, for this connection
        own = private / "warehouse.duckdb"
        try:
            return build_warehouse(store, own, warn=None)
        except OSError as exc:
            raise RooftraceError(f"cannot build the warehouse {own}: {exc.strerror or exc}") from None


def _built_from(path: Path) -> str | None:
    """The files key a warehouse file records (None: unreadable, or built before it recorded one)."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"ATTACH {_lit(path.resolve())} AS w (READ_ONLY)")
        row = con.execute("SELECT files_key FROM w.warehouse_info").fetchone()
        return str(row[0]) if row else None
    except duckdb.Error:
        return None
    finally:
        con.close()


def linked_folders(store: Store) -> list[str]:
    """Where the folders holding the views' files lead when a symlink takes them outside the store
    (runs/ or requests/ moved to another disk and linked back, a date or run folder linked
    elsewhere): DuckDB resolves every path it opens and refuses one outside its allowed
    directories, so the sandbox allows these folders too. Only a folder that holds a file a view
    reads (a run's config.json or steps.parquet, a date's part file) is allowed, not where a
    linked folder above it leads (runs/ linked to /etc allows no more than the run folders in
    it), and never through a linked *file*: a file linked outside the store stays refused. A
    folder that is the filesystem root or holds the store is never allowed (it would open all)."""
    root = store.root.resolve()
    files = [*_request_files(store), *(f for spec in VIEWS if spec.name != "requests" for f in root.glob(spec.glob))]
    found: set[Path] = set()
    for f in files:
        try:
            folder = f.parent.resolve()
        except (OSError, RuntimeError):  # a symlink loop: nothing to allow
            continue
        if folder == root or root in folder.parents:
            continue  # inside the store: allowed already
        if folder == Path(folder.anchor) or folder in root.parents:
            continue
        found.add(folder)
    return [str(t).rstrip(os.sep) + os.sep for t in sorted(found)]


def require_store(store: Store) -> None:
    """Refuse a store folder that does not exist (reading must never create one)."""
    if not store.root.is_dir():
        raise RooftraceError(f"store {store.root} does not exist (check --store or $ROOFTRACE_STORE)")


def connect(store: Store, warn: Callable[[str], None] | None = warn_stderr) -> duckdb.DuckDBPyConnection:
    """Open the warehouse read-only in a sandbox (building it first if it does not exist).

    The connection is a fresh in-memory DuckDB with the warehouse file attached READ_ONLY (a
    fresh instance per call: settings are per instance, and a second plain connection to the
    same file in this process would share the first one's locked settings). Then:

    * ``temp_directory`` is a private folder outside the store (the default for an attached file
      is ``<file>.tmp``, inside the store, used when a large sort spills);
    * ``allowed_directories = [<store root>/]`` and ``enable_external_access = false``: files
      are read only under the store root (the views' Parquet and JSON), nothing else is opened;
      extensions cannot be installed or loaded, secrets cannot be stored;
    * ``autoinstall/autoload_known_extensions = false``, no community or unsigned extensions;
    * ``memory_limit``: the replay's memory limit (``--max-memory`` / ``$ROOFTRACE_MAX_MEMORY``,
      default half the physical memory; pipeline/replay/limits.py): a query past it fails with one line
      (:func:`sql_error`) instead of growing until the machine swaps;
    * ``lock_configuration = true``: no later SET, RESET or PRAGMA can change any of it.

    Runs the warehouse left out (damaged files, see :func:`build_warehouse`) are named through
    ``warn`` at each connection.

    DuckDB does not tell reads from writes under an allowed directory, so :func:`run_sql` also
    refuses every statement that is not a query (COPY, EXPORT, ATTACH, SET, ...) before it runs.
    """
    require_store(store)
    memory_limit = current_limits().max_memory  # a bad $ROOFTRACE_MAX_MEMORY: one error, before any work
    tmp = tempfile.mkdtemp(prefix="rooftrace-duckdb-")
    try:
        path = _current_warehouse(store, Path(tmp))
        root = str(store.root.resolve())
        con = duckdb.connect(":memory:")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    weakref.finalize(con, shutil.rmtree, tmp, ignore_errors=True)
    try:
        con.execute(f"ATTACH {_lit(path.resolve())} AS warehouse (READ_ONLY)")
        con.execute("USE warehouse")
        with contextlib.suppress(duckdb.CatalogException):
            for run_id, why in con.execute("SELECT run_id, reason FROM warehouse_skipped ORDER BY run_id").fetchall():
                if warn is not None:
                    warn(_skip_warning(str(run_id), str(why)))
        # Applied in this order: temp_directory and allowed_directories can only be set while
        # external access is still on, and lock_configuration comes last (it also refuses the
        # table functions that change settings, such as enable_profiling or enable_logging).
        sandbox: dict[str, object] = {
            "temp_directory": tmp,
            "allowed_directories": [root.rstrip(os.sep) + os.sep, *linked_folders(store)],
            "enable_external_access": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            "allow_unsigned_extensions": False,
            "allow_persistent_secrets": False,
            # No progress bar: stdout carries --json documents and tables.
            "enable_progress_bar": False,
        }
        if memory_limit is not None:
            sandbox["memory_limit"] = f"{memory_limit}B"
        sandbox["lock_configuration"] = True
        for name, value in sandbox.items():
            con.execute(f"SET {name} = ?", [value])
    except duckdb.Error as exc:
        con.close()
        raise RooftraceError(
            f"cannot open the warehouse {path}: {str(exc).splitlines()[0]} (rebuild it: rooftrace query NAME --rebuild)"
        ) from None
    except BaseException:
        con.close()
        raise
    return con


# --- named queries ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NamedQuery:
    name: str
    description: str
    params: tuple[str, ...]
    sql: str


def _parse_query(path: Path) -> NamedQuery:
    text = path.read_text()
    desc: list[str] = []
    params: tuple[str, ...] = ()
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        body = line[2:].strip()
        if body.startswith("params:"):
            params = tuple(p.strip() for p in body[7:].split(",") if p.strip())
        elif body:
            desc.append(body)
    used = tuple(sorted(set(re.findall(r"getvariable\('([a-z0-9_]+)'\)", text))))
    if set(used) != {p.rstrip("?") for p in params}:
        raise RooftraceError(f"{path}: declares params {params} but uses {used}")
    return NamedQuery(path.stem, " ".join(desc), params, text)


def list_queries() -> list[NamedQuery]:
    return [_parse_query(p) for p in sorted(QUERY_DIR.glob("*.sql"))]


def get_query(name: str) -> NamedQuery:
    path = QUERY_DIR / f"{name}.sql"
    # A name is a file stem in QUERY_DIR, never a path ("../x" would run another .sql file).
    if not re.fullmatch(r"[a-z0-9_]+", name) or not path.is_file():
        known = ", ".join(q.name for q in list_queries())
        raise RooftraceError(f"no named query {name!r}; known: {known}")
    return _parse_query(path)


def _newest(files: list[Path]) -> str | None:
    """The folder name of the most recently written of ``files`` (ties: the greater name)."""
    if not files:
        return None
    return max(files, key=lambda f: (f.stat().st_mtime_ns, f.parent.name)).parent.name


def latest_plan(store: Store, date: str | None = None, model: str | None = None) -> str | None:
    """The most recently written capacity plan (of ``date`` and ``model`` when given): plan ids
    are ``DATE-MODEL-DIGEST``, so the greatest id is not the newest plan."""
    day = re.escape(date) if date else r"\d{4}-\d{2}-\d{2}"
    pattern = re.compile(day + "-" + (re.escape(model) if model else ".+") + "-[0-9a-f]+")
    files = [p for p in (store.root / "plans").glob("*/plan.parquet") if pattern.fullmatch(p.parent.name)]
    return _newest(files)


def latest_cost_subject(store: Store, table: str) -> str | None:
    """The plan or run whose ``table`` (gpu_cost, api_cost) was written last."""
    return _newest(list((store.root / "costs").glob(f"*/{table}.parquet")))


def check_date_option(store: Store, date: str | None, run_id: str | None, query: NamedQuery | None = None) -> None:
    """``--date`` is a YYYY-MM-DD date (as ``replay --date``), and with ``--run`` the run's own date:
    a date that contradicts the run is refused, never ignored; so is a ``--date`` given to a
    ``query`` that takes neither a date nor a run."""
    if date is None:
        return
    check_date(date)
    if query is not None and not {"date", "run_id"} & {p.rstrip("?") for p in query.params}:
        takes = ", ".join(query.params) or "none"
        raise RooftraceError(f"query {query.name!r} takes no --date (its parameters: {takes})")
    if run_id is not None:
        check_run_id(store, run_id)
        own = run_date(store, run_id)
        if own != date:
            raise RooftraceError(f"--date {date} contradicts --run {run_id}, a replay of {own} (give one of them)")
    elif query is not None and "date" in {p.rstrip("?") for p in query.params}:
        check_stored_date(store, date)  # an optional date (date?) too: 2099-01-01 printed an empty table


#: The views classify writes, by their folder under STORE/accounting/.
_CLASSIFY_VIEWS = {"accounting_requests": "requests", "accounting_minutes": "minutes", "cache_curve": "cache_curve"}


def check_classified(store: Store, query: NamedQuery, date: str | None) -> None:
    """Refuse a named query that reads classify's tables for a ``date`` (given, or the latest) the
    store holds requests on but classify has not split yet: it printed ``requests 0`` (or nothing)
    with exit code 0, read as a day without traffic."""
    if "date" not in {p.rstrip("?") for p in query.params}:
        return
    if date is None:
        dates = store.dates()
        if not dates:
            return
        date = dates[-1]
    if date not in store.dates():
        return  # check_stored_date's refusal
    for view, folder in _CLASSIFY_VIEWS.items():
        if not re.search(rf"\b{view}\b", query.sql):
            continue
        partition = store.partition(store.accounting_dir / folder, date)
        if not any(partition.glob("*.parquet")):
            n = store.stored_rows(date)
            raise RooftraceError(
                f"{date} holds {n:,} request{'' if n == 1 else 's'} but is not classified yet: "
                f"run rooftrace classify --date {date}"
            )


def stale_classify_note(store: Store, query: NamedQuery, date: str | None) -> str | None:
    """A named query that reads classify's tables for a ``date`` (given, or the latest) whose
    accounting predates the date's requests (logs of the date ingested after classify ran): the
    sentence that says so (pipeline/classify/freshness.py), printed on the query's first line and
    given in its --json rows as ``stale_classify``; None when the accounting is current or the
    query reads none of classify's tables."""
    if "date" not in {p.rstrip("?") for p in query.params}:
        return None
    if not any(re.search(rf"\b{view}\b", query.sql) for view in _CLASSIFY_VIEWS):
        return None
    dates = store.dates()
    date = date or (dates[-1] if dates else None)
    if date is None or date not in dates:
        return None

    return classify_freshness(store, date).note()


#: The command that fills each view a new store holds nothing in yet.
_FILLED_BY = {
    "accounting_requests": "classify",
    "accounting_minutes": "classify",
    "cache_curve": "classify",
    "runs": "replay",
    "replay_requests": "replay",
    "replay_steps": "replay",
    "replay_series": "replay",
}


def empty_view_hints(store: Store, sql: str) -> list[str]:
    """For ``rooftrace sql``: one hint per stage whose views the query reads but that has not run
    on the store (``select count(*) from accounting_requests`` answered 0 with no word that
    classify had not run): the dates classify has not split, or that no replay run exists, and
    the command that fills them."""
    read = [v for v in _FILLED_BY if re.search(rf"\b{v}\b", sql, re.IGNORECASE)]
    hints = []
    accounting = [v for v in read if _FILLED_BY[v] == "classify"]
    if accounting:
        dates = store.dates()
        missing = [
            d
            for d in dates
            if not any(store.partition(store.accounting_dir / _CLASSIFY_VIEWS[accounting[0]], d).glob("*.parquet"))
        ]
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3:,} more" if len(missing) > 3 else "")
            n = sum(store.stored_rows(d) for d in missing)
            whole = f"{shown} {'is' if len(missing) == 1 else 'are'} not"
            if len(missing) == len(dates) > 1:
                whole = f"none of the store's {len(dates):,} dates is"
            hints.append(
                f"{', '.join(accounting)}: {whole} classified yet ({n:,} stored requests not in it); "
                f"`rooftrace classify --date {missing[-1]}` fills it{' (one run per date)' if len(missing) > 1 else ''}"
            )
    replayed = [v for v in read if _FILLED_BY[v] == "replay"]
    if replayed and not any(store.runs_dir.glob("*/config.json")):
        hints.append(f"{', '.join(replayed)}: the store holds no replay run yet; `rooftrace replay` fills it")
    return hints


def plan_ids(store: Store) -> list[str]:
    """The capacity plans in the store (folders ``plans/<id>/`` with a ``plan.parquet``), sorted."""
    return sorted(p.parent.name for p in (store.root / "plans").glob("*/plan.parquet"))


def cost_subjects(store: Store, table: str) -> list[str]:
    """The runs and plans ``rooftrace cost`` priced (folders ``costs/<id>/`` holding ``table``)."""
    return sorted(p.parent.name for p in (store.root / "costs").glob(f"*/{table}.parquet"))


def check_named_ids(store: Store, query: NamedQuery, values: Mapping[str, object]) -> None:
    """Refuse a ``plan_id`` or ``subject`` the store holds no files of, naming the nearest known
    ids, as an unknown ``--run`` is (:func:`check_run_id`): it printed an empty table, exit code 0."""
    names = {p.rstrip("?") for p in query.params}
    checks: list[tuple[str, list[str], str, Path, str]] = []
    if "plan_id" in names:
        checks.append(("plan_id", plan_ids(store), "capacity plan", store.root / "plans", "rooftrace plan"))
    if "subject" in names:
        table = "api_cost" if re.search(r"\bapi_cost\b", query.sql) else "gpu_cost"
        checks.append(
            ("subject", cost_subjects(store, table), "cost of a run or plan", store.root / "costs", "rooftrace cost")
        )
    for key, known, what, folder, command in checks:
        value = values.get(key)
        if value is None or str(value) in known:
            continue
        value = str(value)
        if not known:
            raise RooftraceError(f"no {what} {value!r}: {folder} holds none (run `{command}`)")
        nearest = difflib.get_close_matches(value, known, n=3, cutoff=0.0)
        raise RooftraceError(f"no {what} {value!r} in {folder}; nearest: {', '.join(nearest)}")


def check_stored_date(store: Store, date: str) -> None:
    """Refuse a ``--date`` the store has no requests on (a query of that date would print a row of
    nulls, or nothing, and exit 0), naming the dates it has."""
    dates = store.dates()
    if date in dates:
        return
    if not dates:
        raise RooftraceError(f"no requests on {date}: {store.requests_dir} holds none yet (run `rooftrace ingest`)")
    span = dates[0] if len(dates) == 1 else f"{len(dates)} dates, {dates[0]} .. {dates[-1]}"
    raise RooftraceError(f"no requests on {date} in {store.requests_dir} (it has {span}); pass one of them as --date")


def check_run_id(store: Store, run_id: str) -> None:
    """Refuse a run id the store does not hold, naming the nearest known ids."""
    known = run_ids(store)
    if run_id in known:
        return
    if not known:
        raise RooftraceError(f"no replay run {run_id!r}: {store.runs_dir} holds none (run `rooftrace replay`)")
    nearest = difflib.get_close_matches(run_id, known, n=3, cutoff=0.0)
    raise RooftraceError(f"no replay run {run_id!r} in {store.runs_dir}; nearest: {', '.join(nearest)}")


class Session:
    """One sandboxed read-only warehouse connection for several named queries (the report runs a dozen)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.con = connect(store)
        #: run id -> why: the runs the warehouse left out (damaged), never answered for
        self.skipped: dict[str, str] = {}
        with contextlib.suppress(duckdb.CatalogException):
            rows = self.con.execute("SELECT run_id, reason FROM warehouse_skipped").fetchall()
            self.skipped = {str(r): str(why) for r, why in rows}

    def check_readable(self, name: str, run_id: str) -> None:
        """Refuse a run the warehouse left out (a truncated file, a missing or refused config.json):
        its views hold nothing of it, so a query of it would print an empty table, zeros or a
        DuckDB binder error with exit code 0."""
        why = self.skipped.get(run_id)
        if why is not None:
            raise RooftraceError(f"query {name!r}: run {run_id} cannot be read (re-run or delete it): {why}")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(duckdb.Error):  # (a query that ignored an interrupt still holds it)
            self.con.close()

    def query(self, name: str, params: Mapping[str, Any] | None = None) -> pa.Table:
        """Run a named query; missing ``run_id``/``date`` default to the latest run and date."""
        store, con = self.store, self.con
        query = get_query(name)
        values = dict(params or {})
        names = {p.rstrip("?") for p in query.params}
        if values.get("date") is not None:
            check_date(str(values["date"]))  # '2023-11' would match no row, or a prefix
        for key, value in values.items():
            if key.endswith("_s") and value is not None:
                values[key] = seconds_param(name, key, value)
        if "date" in names and values.get("date") is None:
            values["date"] = store.resolve_date(None) if store.dates() else None
        if "run_id" in names and values.get("run_id") is None:
            values["run_id"] = latest_run(store, values.get("date"), exclude=self.skipped)
            newest = latest_run(store, values.get("date"))
            if newest is not None and newest != values["run_id"]:  # the newest run is damaged
                if values["run_id"] is None:
                    self.check_readable(name, newest)
                warn_stderr(
                    f"query {name!r}: the latest run {newest} cannot be read (see above); "
                    f"answering for {values['run_id']}, the latest run that can (or pass --run)"
                )
            if values["run_id"] is None:
                dates = sorted({r[:10] for r in run_ids(store)})
                if values.get("date") is not None and dates:
                    raise RooftraceError(
                        f"query {name!r}: no replay run of {values['date']} in {store.root}; "
                        f"runs exist for {', '.join(dates[-5:])} (--date, or --run RUN_ID)"
                    )
                raise RooftraceError(
                    f"query {name!r} needs a replay run and {store.root} has none (run `rooftrace replay`)"
                )
        elif "run_id" in names:
            self.check_readable(name, str(values["run_id"]))
            check_run_id(store, str(values["run_id"]))
        if "plan_id" in names and values.get("plan_id") is None:  # the newest plan, not the greatest id
            date, model = values.get("date"), values.get("model")
            values["plan_id"] = latest_plan(
                store, None if date is None else str(date), None if model is None else str(model)
            )
        if "subject" in names and values.get("subject") is None:
            table = "api_cost" if "FROM api_cost" in query.sql else "gpu_cost"  # the view the query reads
            values["subject"] = latest_cost_subject(store, table)
        for p in query.params:
            optional = p.endswith("?")
            key = p.rstrip("?")
            if key not in values and not optional:
                raise RooftraceError(f"query {name!r} needs --param {key}=VALUE")
            value = values.get(key)
            if isinstance(value, str) and not _is_utf8(value):  # bytes that are not UTF-8 on the command line
                raise RooftraceError(f"query {name!r}: {key} {value.encode('utf-8', 'replace')!r} is not UTF-8 text")
            con.execute(f"SET VARIABLE {key} = ?", [value])
        try:
            return interruptible(con, lambda: con.sql(query.sql).to_arrow_table())
        except duckdb.Error as exc:
            raise sql_error(exc, f"query {name!r} failed") from None


_T = TypeVar("_T")


def interruptible(con: duckdb.DuckDBPyConnection, fn: Callable[[], _T]) -> _T:
    """``fn()`` (a query on ``con``) run so that Ctrl-C stops it: DuckDB does not look at Python's
    signals while a query runs (a recursive query that never ends could not be stopped), so the
    query runs in a worker thread while the main thread waits; Ctrl-C there interrupts the query
    and raises KeyboardInterrupt (the CLI's one line and exit code 130). DuckDB has no statement
    timeout; this is the way to stop a query (docs/limits.md)."""
    if threading.current_thread() is not threading.main_thread():
        return fn()  # signals reach only the main thread
    box: dict[str, Any] = {}
    done = threading.Event()  # not Thread.join: a join interrupted by Ctrl-C can mark the thread ended

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=work, name="rooftrace-duckdb-query", daemon=True).start()
    try:
        while not done.wait(0.2):
            pass
    except BaseException:  # Ctrl-C, or SIGTERM's exit (handle_sigterm): stop the query first
        con.interrupt()
        done.wait(10)  # the query stops at once; then the connection can be closed
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


#: Exit code of ``sql`` and ``query`` stopped by SIGTERM (128 + 15, as shells report it).
EXIT_TERMINATED = 143


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While ``sql`` or ``query`` runs, SIGTERM (``timeout``, ``kill``) ends it as Ctrl-C does: the
    running query is interrupted (:func:`interruptible`), the connection closed and its private
    temporary folder (``/tmp/rooftrace-duckdb-*``, where large sorts spill) removed, then one
    ``terminated (SIGTERM)`` line and exit code 143. It was left behind: SIGTERM's default action
    ends the process at once. A SIGTERM the process inherited as ignored stays ignored, and the
    handler before is put back afterwards."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    if before is not signal.SIG_DFL:  # ignored, or a handler of the caller's
        yield
        return

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
        print("terminated (SIGTERM)", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_TERMINATED)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def sql_error(exc: duckdb.Error, what: str) -> BaseException:
    """A DuckDB error as one line: an interrupt (Ctrl-C) as KeyboardInterrupt (the CLI exits 130),
    running out of the warehouse's memory limit as what to do about it."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, duckdb.InterruptException):
        return KeyboardInterrupt()
    if isinstance(exc, duckdb.OutOfMemoryException):
        limits = current_limits()
        limit = "no" if limits.max_memory is None else f"{format_bytes(limits.max_memory)} ({limits.memory_origin})"
        return RooftraceError(
            f"{what}: out of memory: the query needs more than the warehouse's {limit} memory limit; "
            f"aggregate or add a LIMIT, or raise ${MAX_MEMORY_ENV} ({first})"
        )
    if isinstance(exc, duckdb.PermissionException):
        return RooftraceError(
            f"{what}: {first} (the warehouse reads only files under the store and in the folders its own "
            "folders link to; a file linked from outside them is refused)"
        )
    # DuckDB's own hints to change a setting ('Use "SET max_expression_depth TO x"') point at a
    # statement the read-only warehouse refuses: say what to do instead
    first = re.sub(r'\s*Use "SET [^"]*"[^.]*\.?', "", first)
    if "expression depth" in first:
        first += " (the warehouse's settings cannot be changed: write the expression with fewer nested terms)"
    return RooftraceError(f"{what}: {first}")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def run_query(store: Store, name: str, params: Mapping[str, Any] | None = None) -> pa.Table:
    """Run one named query (see :meth:`Session.query`)."""
    with Session(store) as session:
        return session.query(name, params)


# Statements a user's SQL may hold: queries only (SELECT, FROM ..., WITH, VALUES, DESCRIBE, SHOW and
# SUMMARIZE all parse as SELECT). Everything else (COPY, EXPORT, ATTACH, DETACH, INSTALL, LOAD, SET,
# RESET, PRAGMA, CALL, CHECKPOINT, CREATE, EXPLAIN ANALYZE, PIVOT's hidden CREATE TYPE, ...) is refused
# before it runs.
_QUERY_STATEMENTS = frozenset({duckdb.StatementType.SELECT})


def check_read_only_sql(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse ``sql`` unless every statement in it is a query."""
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as exc:  # bytes that are not UTF-8 on the command line
        raise RooftraceError(f"SQL failed: not UTF-8 text (character {exc.start})") from None
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise sql_error(exc, "SQL failed") from None
    if not statements:
        raise RooftraceError("SQL failed: no statement to run")
    for statement in statements:
        if statement.type not in _QUERY_STATEMENTS:
            kind = _statement_kind(statement)
            raise RooftraceError(
                f"SQL refused: the warehouse is read-only and runs queries only (SELECT, WITH, FROM, "
                f"DESCRIBE, SHOW, SUMMARIZE); this is {kind}"
            )
    if len(statements) > 1:  # only the last result would print: the others were dropped silently
        raise RooftraceError(
            f"SQL refused: {len(statements)} statements; `sql` runs one query at a time (one result to print)"
        )


def _statement_kind(statement: Any) -> str:
    """The statement's kind in words, 'a COPY statement': DuckDB files INSTALL under LOAD (its type
    is LOAD_STATEMENT), so an INSTALL is named as one, with DuckDB's kind after it."""
    kind = str(statement.type.name).replace("_", " ")
    first = (statement.query.split() or [""])[0].upper()
    if kind == "LOAD" and first in {"INSTALL", "FORCE"}:
        return "an INSTALL statement (DuckDB files it as a LOAD statement)"
    return f"{'an' if kind[:1] in ('A', 'E', 'I', 'O', 'U') else 'a'} {kind} statement"


def run_sql(store: Store, sql: str) -> pa.Table:
    """Run ad-hoc SQL on the read-only, sandboxed warehouse (see :func:`connect`); the whole result
    as one table (``rooftrace sql`` streams it instead: :func:`export_sql`)."""
    with sql_batches(store, sql) as (schema, batches):
        return pa.Table.from_batches(list(batches), schema=schema)


#: Rows a streamed result is read in (:func:`sql_batches`): what is held outside DuckDB's memory
#: limit at a time is one batch and its text, not the whole result.
BATCH_ROWS = 16_384


@contextlib.contextmanager
def sql_batches(store: Store, sql: str) -> Iterator[tuple[pa.Schema, Iterator[pa.RecordBatch]]]:
    """Run ad-hoc SQL on the read-only, sandboxed warehouse (see :func:`connect`) and stream its
    result: the schema and the record batches, read from DuckDB as they are consumed (each read
    can be stopped by Ctrl-C; an error on the way, such as running out of memory, is one line)."""
    try:
        con = connect(store)
    except RuntimeError as exc:  # Ctrl-C while DuckDB ran in this thread (building the views)
        if "interrupted" in str(exc).lower():
            raise KeyboardInterrupt from None
        raise
    try:
        check_read_only_sql(con, sql)
        reader = interruptible(con, lambda: con.sql(sql).to_arrow_reader(BATCH_ROWS))

        def batches() -> Iterator[pa.RecordBatch]:
            while True:
                try:
                    batch = interruptible(con, reader.read_next_batch)
                except StopIteration:
                    return
                except (OSError, pa.ArrowException) as exc:  # DuckDB's error, through Arrow's stream
                    raise _stream_error(exc) from None
                yield batch

        yield reader.schema, batches()
    except duckdb.PermissionException as exc:
        raise RooftraceError(
            f"SQL refused: {str(exc).splitlines()[0]} (the warehouse reads only the store {store.root})"
        ) from None
    except duckdb.Error as exc:
        raise sql_error(exc, "SQL failed") from None
    except RuntimeError as exc:  # Ctrl-C while DuckDB ran in this thread (building the views)
        if "interrupted" in str(exc).lower():
            raise KeyboardInterrupt from None
        raise
    finally:
        with contextlib.suppress(duckdb.Error):  # (a query that ignored an interrupt still holds it)
            con.close()


def _stream_error(exc: BaseException) -> BaseException:
    """An error DuckDB raised while a streamed result was read (it reaches Python as Arrow's
    OSError holding DuckDB's message) as :func:`sql_error` words it."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if first.startswith("Out of Memory Error"):
        return sql_error(duckdb.OutOfMemoryException(first), "SQL failed")
    if first.startswith("INTERRUPT"):
        return KeyboardInterrupt()
    return RooftraceError(f"SQL failed: {first}")


# --------------------------------------------------------------------------------------------
# what sql and query check before they read


def check_out_path(store: Store, out: Path | None) -> None:
    """``--out`` may not point inside the store: reading the warehouse never changes the store."""
    if out is None:
        return
    root = store.root.resolve()
    target = out.resolve()
    if target == root or root in target.parents:
        raise RooftraceError(f"--out {out} is inside the store {store.root}; write query output elsewhere")


def check_run_option(name: str, params: tuple[str, ...], run_id: str | None) -> None:
    """``--run`` given to a query that takes no run id is a mistake, not something to ignore."""
    if run_id is not None and "run_id" not in {p.rstrip("?") for p in params}:
        takes = ", ".join(params) or "none"
        raise RooftraceError(f"query {name!r} takes no --run (its parameters: {takes})")


def parse_params(query: NamedQuery, items: Sequence[str]) -> dict[str, object]:
    """``--param NAME=VALUE`` items of ``query``: a name it does not take is an error (a typo
    would silently leave the default in place); a value is a number where the name says seconds
    (``ttft_slo_s=2``), text otherwise."""
    declared = [p.rstrip("?") for p in query.params]
    values: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in declared:
            raise RooftraceError(
                f"--param {item!r}: query {query.name!r} takes {', '.join(declared) or 'none'} (NAME=VALUE)"
            )
        if key in values:
            raise RooftraceError(f"--param {key} is given twice; give it once")
        values[key] = seconds_param(query.name, key, value) if key.endswith("_s") else value
    return values


#: Parameters that have their own option, checked there: ``--param`` gives them through it.
_OPTION_PARAMS = {"date": "--date", "run_id": "--run"}


def merge_option_params(
    values: Mapping[str, object], run_id: str | None, date: str | None
) -> tuple[str | None, str | None, dict[str, object]]:
    """``--param run_id=``/``date=`` taken as ``--run``/``--date`` (returned with the other
    parameters), so that they are checked exactly as the options are (a known, readable run; a
    date the store has requests on): a --param copy skipped those checks and replaced the
    option's value (``--param date=2031-02-03`` printed a row of nulls, exit code 0). One that
    contradicts its option is refused."""
    rest = dict(values)
    given = {"run_id": run_id, "date": date}
    for key, option in _OPTION_PARAMS.items():
        if key not in rest:
            continue
        value = str(rest.pop(key))
        if given[key] is not None and given[key] != value:
            raise RooftraceError(f"--param {key}={value} contradicts {option} {given[key]} (give one of them)")
        given[key] = value
    return given["run_id"], given["date"], rest


#: Largest seconds parameter (an SLO) a named query takes: a day is already no SLO.
MAX_SECONDS_PARAM = 1_000_000.0


def seconds_param(query: str, key: str, value: object) -> float:
    """A seconds parameter (``ttft_slo_s=2``): a finite number > 0 and at most
    :data:`MAX_SECONDS_PARAM`, else one error naming it (NaN met every SLO: DuckDB orders NaN
    above every number; a negative SLO met none; 'abc' was DuckDB's conversion error)."""
    shown = value if isinstance(value, str) else repr(value)
    try:
        seconds = float(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else None
    except ValueError:
        seconds = None
    if seconds is None:
        raise RooftraceError(f"--param {key}={shown}: query {query!r} takes a number of seconds for {key}")
    if not 0.0 < seconds <= MAX_SECONDS_PARAM:  # NaN fails every comparison
        raise RooftraceError(
            f"--param {key}={shown}: {key} must be a number of seconds > 0 and at most {MAX_SECONDS_PARAM:,.0f}"
        )
    return seconds


def rebuild(store: Store) -> None:
    try:
        build_warehouse(store)
    except OSError as exc:
        raise RooftraceError(f"cannot rebuild the warehouse in {store.root}: {exc.strerror or exc}") from None


# --- sql output ---------------------------------------------------------------------------------

#: Rows ``rooftrace sql`` prints as a table on the terminal (rendering 100,000 rows took 24 s);
#: the rest is counted in a note that says how to get all of them (--format csv/json, --out FILE).
TABLE_MAX_ROWS = 1000


def _is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _is_text(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or str(t) == "string_view"


def printable(table: pa.Table) -> pa.Table:
    """``table`` for a terminal: control characters in its text columns and column names escaped
    (:func:`escape_controls`). Nested values print as Python literals, which escape them already."""
    names = [escape_controls(n) for n in table.column_names]
    for i, field in enumerate(table.schema):
        if _is_text(field.type):
            cells = [None if v is None else escape_controls(v) for v in table.column(i).to_pylist()]
            table = table.set_column(i, pa.field(field.name, pa.string()), pa.array(cells, pa.string()))
    return table.rename_columns(names)


@dataclass(frozen=True)
class SqlOutput:
    """What ``rooftrace query`` prints: ``text`` or ``data`` (Parquet bytes) for stdout, or
    neither when written to a file; ``note`` (to stderr) when the table shows only some rows;
    ``rows``: the rows of the result."""

    text: str | None = None
    data: bytes | None = None
    note: str | None = None
    rows: int = 0


#: ``--out -``: standard output (a file named '-' is ``--out ./-``).
STDOUT = Path("-")


def sql_output(
    table: pa.Table,
    fmt: str,
    out: Path | None,
    max_rows: int = TABLE_MAX_ROWS,
    tty: bool = False,
    title: str | None = None,
) -> SqlOutput:
    """Render a query's result (a whole table: ``query``) as :func:`write_result` writes it, the
    text or Parquet bytes for stdout returned rather than written."""
    buf = io.BytesIO()
    written = write_result(table.schema, table.to_batches(), fmt, out, buf, max_rows=max_rows, tty=tty, title=title)
    to_stdout = out is None or out == STDOUT
    data = buf.getvalue()
    if not to_stdout:
        return SqlOutput(note=written.note, rows=written.rows)
    if fmt == "parquet":
        return SqlOutput(data=data, note=written.note, rows=written.rows)
    return SqlOutput(text=data.decode(), note=written.note, rows=written.rows)


@dataclass(frozen=True)
class Written:
    """What :func:`write_result` wrote: the result's rows, and the note on rows a table left out."""

    rows: int
    note: str | None = None


def export_sql(store: Store, sql: str, fmt: str, out: Path | None, stdout: IO[bytes], tty: bool = False) -> Written:
    """``rooftrace sql``: run ``sql`` on the warehouse and write its result as ``fmt`` to ``out``
    (None or :data:`STDOUT`: ``stdout``), streamed batch by batch (:func:`sql_batches`): a large
    export holds one batch at a time outside DuckDB's memory limit, not the whole result as Python
    objects (a 1,000,000-row JSON export took 4x the limit). A table is the exception: it is laid
    out whole, so a table past the memory limit is refused (:func:`write_result`)."""
    with sql_batches(store, sql) as (schema, batches):
        return write_result(schema, batches, fmt, out, stdout, tty=tty)


def write_result(
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    fmt: str,
    out: Path | None,
    stdout: IO[bytes],
    max_rows: int = TABLE_MAX_ROWS,
    tty: bool = False,
    title: str | None = None,
) -> Written:
    """Write a result as ``fmt`` to ``out`` (None or :data:`STDOUT`: ``stdout``), batch by batch.
    The table format escapes control characters (a tenant named '\\x1b]0;...' must not retitle the
    terminal) and shows at most ``max_rows`` rows on stdout, saying how many it left out; csv,
    json, parquet and a table to --out FILE get every row (csv and parquet as the data is; json
    escapes control characters itself). Parquet goes to stdout only when it is not a terminal
    (``tty``). A file is written beside ``out`` and renamed into place (no half-written file);
    its folder is created as the other commands' --out do. ``title``: the table's heading.

    Dates and timestamps outside Python's years 1..9999 (year 12025, ±infinity) are written as
    DuckDB's text of them ('infinity', '12025-01-15 00:00:00') in the table, csv and json formats
    (:func:`_readable_batch`); Parquet keeps them as they are."""
    if fmt not in OUTPUT_FORMATS:
        raise RooftraceError(f"unknown format {fmt!r}; use one of {OUTPUT_FORMATS}")
    to_stdout = out is None or out == STDOUT
    if fmt == "parquet" and out == STDOUT and tty:
        raise RooftraceError("--format parquet --out -: stdout is a terminal; pipe it or give --out FILE")
    if fmt == "parquet" and out is None:
        raise RooftraceError("--format parquet needs --out FILE (or --out - to write it to a pipe)")
    if fmt in ("json", "parquet"):
        check_unique_names(schema.names, fmt)
    with stdout_errors(to_stdout), _opened(None if to_stdout else out, stdout) as sink:
        try:
            if fmt == "parquet":
                return _write_parquet(schema, batches, sink)
            if fmt == "csv":
                return _write_csv(schema, batches, sink)
            if fmt == "json":
                return _write_json(batches, sink)
            if to_stdout and tty:  # a person reads it: fitted to the terminal's width
                return _write_table(schema, batches, sink, max_rows, title, terminal_table)
            return _write_table(schema, batches, sink, max_rows if to_stdout else None, title, render)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise RooftraceError(f"cannot write the result as {fmt}: {first}") from None


#: A column of latencies in seconds, by its name (ttft_s, max_itl_s, observed_p99_s, ttft_slo_s;
#: not a rate such as tokens_per_s, nor a span such as bin_s).
_LATENCY_COLUMN_RE = re.compile(
    r"^(?!.*_per_s$)(?:[a-z0-9_]*_)?(?:queue|ttft|tpot|itl|e2e|slo|p[0-9]+(?:_[0-9]+)?)(?:_[a-z0-9]+)*_s$"
)
#: The statistics columns of a named query with one row per latency ``metric`` (latency,
#: latency_by, latency_cdf): in the metric's unit.
_STAT_COLUMN_RE = re.compile(r"^(?:p[0-9]+(?:_[0-9]+)?|mean|min|max|std|seconds)$")


def latencies_in_ms(table: pa.Table) -> pa.Table:
    """``table`` as a person reads it: latencies in ms, as vLLM's benchmark, GuideLLM and AIPerf
    print them. A latency column in seconds (``ttft_s``) becomes ``ttft_ms``, its values x 1000;
    in a table with a ``metric`` column, the statistics (p50 ... p99_9, mean, min, max, std,
    seconds) of the rows whose metric is a latency in seconds are in ms and the metric is named
    ``ttft_ms``. For the table format only: csv, json and Parquet keep SI seconds, as the schemas
    say. Shown to 0.01 ms."""
    import pyarrow.compute as pc

    def ms(col: pa.ChunkedArray) -> pa.ChunkedArray:  # (to 0.01 ms: 1,126.3 ms, not 1,126.3046)
        return pc.round(pc.multiply(col.cast(pa.float64()), 1000.0), 2)

    kinds = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
    numeric = {f.name for f in table.schema if any(kind(f.type) for kind in kinds)}
    names = table.column_names
    for i, name in enumerate(names):
        if name in numeric and _LATENCY_COLUMN_RE.match(name):
            table = table.set_column(i, name[:-2] + "_ms", ms(table.column(i)))
    if "metric" in names and pa.types.is_string(table.schema.field("metric").type):
        metrics = table.column("metric").to_pylist()
        is_latency = [m is not None and bool(_LATENCY_COLUMN_RE.match(m)) for m in metrics]
        if any(is_latency):
            latency = pa.array(is_latency, pa.bool_())
            for i, name in enumerate(table.column_names):
                if name in numeric and _STAT_COLUMN_RE.match(name):
                    col = table.column(i).cast(pa.float64())
                    table = table.set_column(i, name, pc.if_else(latency, ms(col), col))
            renamed = [m[:-2] + "_ms" if hit else m for m, hit in zip(metrics, is_latency, strict=True)]
            table = table.set_column(names.index("metric"), "metric", pa.array(renamed, pa.string()))
    return table


#: A table whose columns would get fewer characters than this each on the terminal is printed
#: one row at a time instead (``column  value`` lines), as psql's expanded display does.
MIN_COLUMN_WIDTH = 8


def terminal_width() -> int:
    """The terminal's width in characters ($COLUMNS when set, else the terminal's, else 80)."""
    return max(20, shutil.get_terminal_size((80, 24)).columns)


def terminal_table(
    table: pa.Table, fmt: str = "table", out: Path | None = None, title: str | None = None, width: int | None = None
) -> str:
    """``table`` laid out for a terminal ``width`` characters wide (default: this terminal's): no
    line longer than that, so the terminal never wraps it. Columns share the width, a cell too
    long for its column ends in '…'; when the columns would get fewer than
    :data:`MIN_COLUMN_WIDTH` characters each, one block per row instead (``column  value``, long
    values ellipsized). ``fmt`` and ``out`` are :func:`pipeline.common.tables.render`'s (a table on stdout)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    width = width or terminal_width()
    names = table.column_names
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    cells = [[_cell(v) for v in col] for col in columns]
    natural = [max([len(n), *map(len, col)]) for n, col in zip(names, cells, strict=True)]
    room = width - (3 * len(names) + 1)  # each column's '│ ' and ' ', and the last '│'
    if names and sum(min(w, MIN_COLUMN_WIDTH) for w in natural) > room:
        return _vertical(names, columns, width, title)
    console = Console(
        file=io.StringIO(), width=width, record=True, force_terminal=False, markup=False, emoji=False, highlight=False
    )
    cap = max(natural, default=0)
    while cap > MIN_COLUMN_WIDTH and sum(min(w, cap) for w in natural) > room:
        cap -= 1  # the widest columns give way first, the narrow ones keep their width
    grid = Table(title=Text(title) if title is not None else None, show_lines=False)
    for name, w in zip(names, natural, strict=True):
        grid.add_column(Text(name), overflow="ellipsis", no_wrap=True, width=min(w, cap))
    for row in zip(*cells, strict=True):
        grid.add_row(*(Text(c) for c in row))
    console.print(grid)
    return console.export_text()


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _vertical(names: list[str], columns: list[list[Any]], width: int, title: str | None) -> str:
    pad = min(max(len(n) for n in names), width // 3)
    lines = [title] if title else []
    for i, row in enumerate(zip(*columns, strict=True)):
        lines.append(f"-[ row {i + 1} ]".ljust(width, "-"))
        lines.extend(_clip(f"{_clip(n, pad):<{pad}} | {_cell(v)}", width) for n, v in zip(names, row, strict=True))
    if not columns or not columns[0]:
        lines.append(f"(0 rows; columns: {', '.join(names)})")
    return "\n".join(lines) + "\n"


def check_unique_names(names: Sequence[str], fmt: str) -> None:
    """Refuse a result whose columns share a name in a format that keeps one column per name: a
    JSON object holds one value per key (``select 1 as a, 2 as a`` printed ``[{"a": 2}]``, the
    first column dropped without a word), and a Parquet file with two columns of one name cannot
    be read back by name (pyarrow refuses it). csv and the table show every column."""
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    dups = [name for name, n in seen.items() if n > 1]
    if dups:
        shown = ", ".join(repr(escape_controls(name)) for name in dups)
        raise RooftraceError(
            f"the result has more than one column named {shown}: --format {fmt} keeps one column per name; "
            f"alias them (SELECT ... AS {escape_controls(dups[0])}_2) or list the columns you want"
        )


def _detach_stdout() -> None:
    """Point file descriptor 1 at /dev/null after a write to it failed: what is still buffered
    (and the interpreter's last flush at exit) then goes nowhere instead of failing again with
    a second error after the one line (stdout as a file object of its own, as in tests: no-op)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


@contextlib.contextmanager
def stdout_errors(to_stdout: bool = True) -> Iterator[None]:
    """A write to stdout that fails (``> /dev/full``: No space left on device; an I/O error) as one
    error line, ``cannot write the result to stdout: ...`` (exit code 1), not a traceback. A
    broken pipe (``| head``) is left as it was: click ends the command quietly."""
    try:
        yield
    except OSError as exc:
        if not to_stdout or isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE:
            raise
        _detach_stdout()
        reason = exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0]
        reason = re.sub(r"^\[Errno \d+\] ", "", reason)
        raise RooftraceError(f"cannot write the result to stdout: {reason}") from None


@contextlib.contextmanager
def _opened(out: Path | None, stdout: IO[bytes]) -> Iterator[IO[bytes]]:
    """``stdout``, or a temporary file beside ``out`` renamed onto it when the writing ended well
    (never over a folder or a pipe: :func:`pipeline.common.schemas.check_replaceable`)."""
    if out is None:
        yield stdout
        stdout.flush()
        return

    tmp: Path | None = None
    try:
        check_replaceable(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        tmp = Path(name)
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
        tmp = None
    except OSError as exc:
        raise RooftraceError(f"cannot write {out}: {os_write_reason(out, exc)}") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _write_parquet(schema: pa.Schema, batches: Iterable[pa.RecordBatch], sink: IO[bytes]) -> Written:
    rows = 0
    with pq.ParquetWriter(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
            rows += batch.num_rows
    return Written(rows)


def _write_csv(schema: pa.Schema, batches: Iterable[pa.RecordBatch], sink: IO[bytes]) -> Written:
    import pyarrow.csv as pacsv

    rows, header = 0, True
    for batch in batches:
        part = for_csv(pa.Table.from_batches([_readable_batch(batch, "csv")]))
        pacsv.write_csv(part, sink, pacsv.WriteOptions(include_header=header))
        header = False
        rows += batch.num_rows
    if header:  # no rows: the header alone
        pacsv.write_csv(for_csv(schema.empty_table()), sink)
    return Written(rows)


def _write_json(batches: Iterable[pa.RecordBatch], sink: IO[bytes]) -> Written:
    """A JSON array of row objects, as ``json.dumps(rows, indent=2)`` lays it out, a batch at a time."""
    rows = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        text = json.dumps(table_to_json(pa.Table.from_batches([_readable_batch(batch, "json")])), indent=2, default=str)
        sink.write((("[\n" if rows == 0 else ",\n") + text[2:-2]).encode())  # the rows, not '[\n' and '\n]'
        rows += batch.num_rows
    sink.write(b"[]\n" if rows == 0 else b"\n]\n")
    return Written(rows)


#: Bytes of memory a table cell takes while the table format lays it out (rich's cell objects and
#: the rendered text; measured at about 1.3 KB): a table to --out FILE past the memory limit is
#: refused before it is laid out.
TABLE_CELL_BYTES = 1536


def _write_table(
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    sink: IO[bytes],
    max_rows: int | None,
    title: str | None,
    render: Callable[..., str | None],
) -> Written:

    limit = current_limits().max_memory
    kept: list[pa.RecordBatch] = []
    held = rows = 0
    for batch in batches:
        rows += batch.num_rows
        room = batch.num_rows if max_rows is None else max(0, max_rows - (rows - batch.num_rows))
        if room:
            part = _readable_batch(batch.slice(0, room))
            kept.append(part)
            held += part.nbytes + part.num_rows * max(1, part.num_columns) * TABLE_CELL_BYTES
            if limit is not None and held > limit:
                raise RooftraceError(
                    f"the result is too large to lay out as a table ({rows:,} rows so far would take more than "
                    f"the {format_bytes(limit)} memory limit): use --format csv, json or parquet, or add a LIMIT"
                )
    table = pa.Table.from_batches(kept, schema=_readable_schema(schema, kept))
    note = None
    if max_rows is not None and rows > max_rows:
        note = (
            f"showing the first {max_rows:,} of {rows:,} rows; for all of them: --format csv or "
            "--format json (to stdout or --out FILE), or add a LIMIT"
        )
    text = render(printable(latencies_in_ms(table)), "table", None, title=title)
    sink.write((text or "").encode())
    return Written(rows, note)


def _readable_schema(schema: pa.Schema, batches: list[pa.RecordBatch]) -> pa.Schema:
    """The schema of ``batches`` once :func:`_readable_batch` made a column text: the column is
    text in every batch (the batches that did not need it are cast to text as well)."""
    if not batches:
        return schema
    fields = list(schema)
    for b in batches:
        for i, f in enumerate(b.schema):
            if f.type != fields[i].type:
                fields[i] = pa.field(fields[i].name, pa.string())
    want = pa.schema(fields)
    for n, b in enumerate(batches):
        if b.schema != want:
            cols = [c if c.type == f.type else _duck_text(c) for c, f in zip(b.columns, want, strict=True)]
            batches[n] = pa.RecordBatch.from_arrays(cols, schema=want)
    return want


_EPOCH = datetime.date(1970, 1, 1)
#: Days from 1970-01-01 of the first and last date Python can hold (years 1 and 9999).
_PY_DAYS = ((datetime.date.min - _EPOCH).days, (datetime.date.max - _EPOCH).days)
_PER_DAY = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}


def _as_ints(column: pa.Array) -> tuple[pa.Array, int, int]:
    """A plain date or timestamp column as integers, with the first and last integer Python's
    datetime holds (a day's margin each side for timestamps: an aware one is shown in its zone)."""
    t = column.type
    if pa.types.is_date32(t):
        return column.cast(pa.int32()), _PY_DAYS[0], _PY_DAYS[1]
    if pa.types.is_date64(t):
        return column.cast(pa.int64()), _PY_DAYS[0] * 86_400_000, (_PY_DAYS[1] + 1) * 86_400_000 - 1
    per = _PER_DAY[t.unit]
    return column.cast(pa.int64()), (_PY_DAYS[0] + 1) * per, _PY_DAYS[1] * per - 1


def _outside_python(column: pa.Array) -> bool:
    """Whether a date or timestamp column holds a value Python's datetime cannot hold (a year past
    9999, DuckDB's ±infinity, a BC date): converting it raised OverflowError (a traceback)."""
    import pyarrow.compute as pc

    t = column.type
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        ints, lo, hi = _as_ints(column)
    elif pa.types.is_nested(t):
        try:
            column.to_pylist()
        except (OverflowError, ValueError):
            return True
        return False
    else:
        return False
    bounds = pc.min_max(ints).as_py()
    return bounds["min"] is not None and (bounds["min"] < lo or bounds["max"] > hi)


def _has_temporal(t: pa.DataType) -> bool:
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return True
    if pa.types.is_dictionary(t):
        return _has_temporal(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_temporal(t.value_type)
    if pa.types.is_map(t):
        return _has_temporal(t.key_type) or _has_temporal(t.item_type)
    if pa.types.is_struct(t):
        return any(_has_temporal(t.field(i).type) for i in range(t.num_fields))
    return False


def _readable_batch(batch: pa.RecordBatch, fmt: str = "table") -> pa.RecordBatch:
    """``batch`` with every column holding a date or timestamp Python cannot hold as text: the
    cells out of Python's range as DuckDB's text of them ('infinity', '12025-01-15 00:00:00',
    '0044-03-15 (BC)'), the same words in the table, csv and json formats (csv wrote '<value out
    of range: 2147483647>', table and json stopped with a traceback).

    csv and json are written a batch at a time, so there the other cells of a plain date or
    timestamp column keep the text that format gives them in every other batch (csv: Arrow's,
    '2025-01-15 01:02:03.400000'; json: ISO 8601, '2025-01-15T01:02:03.400000'): one column is not
    written two ways because one batch held a far date. The table format holds every batch and
    makes the whole column DuckDB's text (:func:`_readable_schema`); a nested column with a far
    date is DuckDB's text of the whole cell in every format."""
    columns = list(batch.columns)
    changed = False
    for i, column in enumerate(columns):
        if _has_temporal(column.type) and _outside_python(column):
            columns[i] = _cellwise_text(column, fmt) if fmt in ("csv", "json") else _duck_text(column)
            changed = True
    if not changed:
        return batch
    fields = [pa.field(f.name, c.type) for f, c in zip(batch.schema, columns, strict=True)]
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def _cellwise_text(column: pa.Array, fmt: str) -> pa.Array:
    """A date or timestamp column as text for ``fmt`` (csv or json): DuckDB's text where a cell is
    outside Python's range, the format's own text of the value elsewhere."""
    import pyarrow.compute as pc

    duck = _duck_text(column)
    t = column.type
    if not (pa.types.is_date(t) or pa.types.is_timestamp(t)):
        return duck  # nested: the whole cell, as DuckDB writes it
    far = _far_cells(column)
    near = pc.if_else(far, pa.scalar(None, t), column)
    if fmt == "csv":
        own = near.cast(pa.string())
    else:
        own = pa.array([None if v is None else v.isoformat() for v in near.to_pylist()], pa.string())
    return pc.if_else(far, duck, own)


def _far_cells(column: pa.Array) -> pa.Array:
    """Per cell of a plain date or timestamp column: outside Python's years 1..9999 (null: False)."""
    import pyarrow.compute as pc

    ints, lo, hi = _as_ints(column)
    return pc.fill_null(pc.or_(pc.less(ints, lo), pc.greater(ints, hi)), False)


def _duck_text(column: pa.Array) -> pa.Array:
    """A column as DuckDB writes its values as text (times in UTC), from a private in-memory
    DuckDB that reads nothing but this column."""
    con = duckdb.connect(":memory:")
    try:
        with contextlib.suppress(duckdb.Error):
            con.execute("SET TimeZone = 'UTC'")
        con.execute("SET enable_external_access = false")
        data = pa.table({"v": column})
        text = con.from_arrow(data).select('CAST("v" AS VARCHAR) AS "v"').to_arrow_table()
        return text.column(0).combine_chunks().cast(pa.string())
    finally:
        con.close()
