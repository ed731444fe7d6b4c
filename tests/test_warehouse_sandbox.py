"""The warehouse only reads the store: `rooftrace sql` and `rooftrace query` refuse writes, reads of
other files, extensions and settings changes with one `error:` line, and leave the store byte for byte
as it was. Also: nested values in CSV, a missing store, an unknown run id."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from pipeline.cli import main
from pipeline.common.errors import RooftraceError
from pipeline.ingest.store import Store
from pipeline.publish.warehouse import Session, build_warehouse, connect, run_query, run_sql
from tests.conftest import copy_replayed

SECRET = "s3cr3t-outside-the-store"


@pytest.fixture(scope="module")
def wh(replayed_template: tuple[Store, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, str]:
    store, run_id = copy_replayed(replayed_template, tmp_path_factory.mktemp("sandbox") / "store")
    build_warehouse(store)
    return store, run_id


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """A folder outside the store holding files a query must not read."""
    (tmp_path / "secret.csv").write_text(f"secret\n{SECRET}\n")
    (tmp_path / "secret.txt").write_text(SECRET)
    (tmp_path / "secret.json").write_text(json.dumps({"secret": SECRET}))
    pq.write_table(pa.table({"secret": [SECRET]}), tmp_path / "secret.parquet")
    return tmp_path


def digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (and the list of folders): any change shows."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


@pytest.fixture()
def unchanged(wh: tuple[Store, str]) -> Iterator[None]:
    """The store's files are identical before and after the test."""
    store, _ = wh
    before = digest(store.root)
    assert "manifest.parquet" in before and "warehouse.duckdb" in before
    yield
    assert digest(store.root) == before


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def assert_refused(res: Result, *needles: str) -> str:
    """Exit code 1, one `error: ...` line on stderr, nothing on stdout, no traceback."""
    assert res.exit_code == 1, (res.exit_code, res.stdout, res.stderr)
    assert isinstance(res.exception, SystemExit), res.exception
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    assert res.stdout == ""
    assert SECRET not in res.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# Each attack: SQL (with {store} and {out} filled in) and a word the error line must contain.
ATTACKS = {
    "copy_outside": ("COPY (SELECT 1 AS a) TO '{out}/stolen.csv'", "COPY"),
    "copy_over_manifest": ("COPY (SELECT 1 AS a) TO '{store}/manifest.parquet' (FORMAT parquet)", "COPY"),
    "copy_new_file_in_store": ("COPY (SELECT * FROM requests) TO '{store}/requests/new.parquet'", "COPY"),
    "copy_from": ("COPY requests FROM '{out}/secret.csv'", "COPY"),
    "export_outside": ("EXPORT DATABASE '{out}/export'", "EXPORT"),
    "export_in_store": ("EXPORT DATABASE '{store}/export'", "EXPORT"),
    "attach_new_outside": ("ATTACH '{out}/new.duckdb' AS n", "ATTACH"),
    "attach_new_in_store": ("ATTACH '{store}/new.duckdb' AS n", "ATTACH"),
    "attach_memory": ("ATTACH ':memory:' AS m", "ATTACH"),
    "read_csv": ("SELECT * FROM read_csv('{out}/secret.csv')", "secret.csv"),
    "read_csv_etc": ("SELECT * FROM read_csv('/etc/passwd')", "/etc/passwd"),
    "read_text": ("SELECT * FROM read_text('{out}/secret.txt')", "secret.txt"),
    "read_blob": ("SELECT * FROM read_blob('{out}/secret.txt')", "secret.txt"),
    "read_json": ("SELECT * FROM read_json('{out}/secret.json')", "secret.json"),
    "read_parquet": ("SELECT * FROM read_parquet('{out}/secret.parquet')", "secret.parquet"),
    "replacement_scan": ("SELECT * FROM '{out}/secret.parquet'", "secret.parquet"),
    "dotdot": ("SELECT * FROM read_text('{store}/../secret.txt')", "secret.txt"),
    "sibling_prefix": ("SELECT * FROM read_text('{store}-evil/secret.txt')", "secret.txt"),
    "glob_outside": ("SELECT * FROM glob('{out}/*')", "Permission"),
    "glob_etc": ("SELECT * FROM glob('/etc/*')", "Permission"),
    "install": ("INSTALL httpfs", "LOAD"),
    "load": ("LOAD httpfs", "LOAD"),
    "load_file": ("LOAD '{out}/evil.duckdb_extension'", "LOAD"),
    "set_external_access": ("SET enable_external_access = true", "SET"),
    "reset_external_access": ("RESET enable_external_access", "SET"),
    "set_allowed_directories": ("SET allowed_directories = ['/']", "SET"),
    "unlock": ("SET lock_configuration = false", "SET"),
    "set_then_read": ("SET enable_external_access = true; SELECT * FROM read_text('{out}/secret.txt')", "SET"),
    "pragma": ("PRAGMA enable_profiling", "PRAGMA"),
    "profiling_function": ("SELECT * FROM enable_profiling(save_location='{store}/profile.json')", "locked"),
    "logging_function": ("SELECT * FROM enable_logging(storage='file', storage_path='{store}/logs')", "locked"),
    "select_then_copy": ("SELECT 1; COPY (SELECT 1 AS a) TO '{store}/manifest.parquet'", "COPY"),
    "query_function_copy": ("SELECT * FROM query('COPY (SELECT 1) TO ''{store}/q.csv''')", "SELECT"),
    "explain_analyze_copy": ("EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{store}/manifest.parquet'", "EXPLAIN"),
    "create_table": ("CREATE TABLE t AS SELECT 1", "read-only"),
    "create_secret": ("CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')", "CREATE"),
    "checkpoint": ("CHECKPOINT", "CALL"),
    "use": ("USE memory", "SET"),
    "detach": ("DETACH warehouse", "DETACH"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_sql_attack_is_refused_and_the_store_unchanged(
    attack: str, wh: tuple[Store, str], outside: Path, unchanged: None
) -> None:
    store, _ = wh
    sibling = store.root.resolve().parent / f"{store.root.name}-evil"  # shares the store's prefix
    sibling.mkdir(exist_ok=True)
    (sibling / "secret.txt").write_text(SECRET)
    template, needle = ATTACKS[attack]
    text = template.format(store=store.root.resolve(), out=outside)
    before_outside = digest(outside)
    assert_refused(cli("sql", text, "--store", str(store.root), "--format", "csv"), needle)
    assert digest(outside) == before_outside  # nothing written outside either


@pytest.mark.parametrize("attack", ["copy_over_manifest", "read_text", "set_external_access", "install"])
def test_library_run_sql_raises_one_line_rooftrace_error(
    attack: str, wh: tuple[Store, str], outside: Path, unchanged: None
) -> None:
    store, _ = wh
    with pytest.raises(RooftraceError) as info:
        run_sql(store, ATTACKS[attack][0].format(store=store.root.resolve(), out=outside))
    assert len(str(info.value).splitlines()) == 1


def test_duckdb_settings_are_locked_beneath_the_statement_filter(
    wh: tuple[Store, str], outside: Path, unchanged: None
) -> None:
    """The connection itself (the one named queries use too) is sandboxed and locked, whatever
    statement reaches it: the statement filter of run_sql is a second wall, not the only one."""
    store, run_id = wh
    with Session(store) as session:
        con = session.con
        settings = dict(
            con.execute(
                "SELECT name, value FROM duckdb_settings() WHERE name IN ('enable_external_access', "
                "'lock_configuration', 'autoinstall_known_extensions', 'autoload_known_extensions', "
                "'allow_community_extensions', 'temp_directory')"
            ).fetchall()
        )
        assert settings["enable_external_access"] == "false"
        assert settings["lock_configuration"] == "true"
        assert settings["autoinstall_known_extensions"] == "false"
        assert settings["autoload_known_extensions"] == "false"
        assert settings["allow_community_extensions"] == "false"
        # Spills go to a private folder, not to <store>/warehouse.duckdb.tmp.
        assert not Path(settings["temp_directory"]).resolve().is_relative_to(store.root.resolve())
        for stmt in (
            "SET enable_external_access = true",
            "RESET enable_external_access",
            "SET allowed_directories = ['/']",
            "SET lock_configuration = false",
            "SET autoload_known_extensions = true",
            "PRAGMA enable_profiling",
        ):
            with pytest.raises(duckdb.Error, match="locked"):
                con.execute(stmt)
        for stmt in (
            f"SELECT * FROM read_text('{outside}/secret.txt')",
            f"COPY (SELECT 1 AS a) TO '{outside}/stolen.csv'",
            f"ATTACH '{outside}/new.duckdb' AS n",
            "INSTALL httpfs",
            "LOAD httpfs",
        ):
            with pytest.raises(duckdb.Error):
                con.execute(stmt)
        assert not (outside / "stolen.csv").exists() and not (outside / "new.duckdb").exists()
        # The views still read the store, and named queries still bind their variables.
        assert con.execute("SELECT count(*) FROM requests").fetchone() == (400,)
        rows = session.query("latency", {"run_id": run_id}).to_pylist()
        assert {r["metric"] for r in rows} >= {"ttft_s", "e2e_s"}


def test_normal_queries_still_work(wh: tuple[Store, str], unchanged: None) -> None:
    store, run_id = wh
    res = cli("sql", "SELECT count(*) AS n FROM requests", "--store", str(store.root), "--format", "csv")
    assert res.exit_code == 0 and res.stdout.splitlines() == ['"n"', "400"]
    # Reading a store file directly is allowed (the sandbox is the store, not only the views).
    manifest = store.root.resolve() / "manifest.parquet"
    n_manifest = pq.read_table(manifest).num_rows
    res = cli(
        "sql", f"SELECT count(*) AS n FROM read_parquet('{manifest}')", "--store", str(store.root), "--format", "json"
    )
    assert res.exit_code == 0 and json.loads(res.stdout) == [{"n": n_manifest}]
    res = cli("sql", "SHOW TABLES", "--store", str(store.root), "--format", "json")
    assert {"requests", "manifest", "runs", "replay_requests"} <= {r["name"] for r in json.loads(res.stdout)}
    res = cli(
        "sql", "WITH x AS (SELECT 2 AS v) SELECT v * 21 AS w FROM x", "--store", str(store.root), "--format", "csv"
    )
    assert res.exit_code == 0 and res.stdout.splitlines() == ['"w"', "42"]
    res = cli("query", "latency", "--run", run_id, "--store", str(store.root), "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert {r["metric"] for r in json.loads(res.stdout)} >= {"ttft_s", "tpot_s", "e2e_s", "itl_s"}
    assert run_query(store, "latency", {"run_id": run_id}).num_rows >= 4


def test_query_parameters_are_values_not_sql(wh: tuple[Store, str], unchanged: None) -> None:
    store, _ = wh
    evil = f"2024-01-01'; COPY (SELECT 1 AS a) TO '{store.root.resolve()}/manifest.parquet'; --"
    # a date is checked before any SQL runs (and the store is left unchanged: the fixture)
    assert_refused(cli("query", "token_totals", "--date", evil, "--store", str(store.root)), "is not YYYY-MM-DD")
    # a well-formed date the store has no requests on is one line, not a row of nulls
    res = cli("query", "token_totals", "--date", "1999-01-01", "--store", str(store.root), "--format", "json")
    assert_refused(res, "no requests on 1999-01-01")


def test_query_name_is_not_a_path(wh: tuple[Store, str], tmp_path: Path, unchanged: None) -> None:
    store, _ = wh
    evil = tmp_path / "evil.sql"
    evil.write_text(f"-- evil\nSELECT * FROM read_text('{tmp_path}/evil.sql')\n")
    from pipeline.publish.warehouse import QUERY_DIR

    rel = Path("..", "..", "..", "..", "..", "..", "..", "..", *tmp_path.resolve().parts[1:], "evil")
    assert (QUERY_DIR / f"{rel}.sql").resolve() == evil.resolve()
    assert_refused(cli("query", str(rel), "--store", str(store.root)), "no named query")


def test_out_inside_the_store_is_refused(wh: tuple[Store, str], unchanged: None) -> None:
    store, run_id = wh
    target = store.root / "manifest.parquet"
    assert_refused(
        cli("sql", "SELECT 1 AS a", "--store", str(store.root), "--format", "parquet", "--out", str(target)),
        "inside the store",
    )
    assert_refused(
        cli("query", "latency", "--run", run_id, "--store", str(store.root), "--format", "csv", "--out", str(target)),
        "inside the store",
    )


# --- nested values as CSV --------------------------------------------------------------------------


def read_csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_struct_and_list_columns_as_csv(wh: tuple[Store, str], unchanged: None) -> None:
    store, _ = wh
    sql = (
        "SELECT {'a': 1, 'b': [1, 2], 'c': 'x,\"y\"'} AS s, [1, 2, 3] AS l, ['p', NULL] AS names, "
        "MAP {'k': 2} AS m, CAST(NULL AS INTEGER[]) AS empty, 7 AS n"
    )
    res = cli("sql", sql, "--store", str(store.root), "--format", "csv")
    assert res.exit_code == 0, res.output
    header, row = read_csv_rows(res.stdout)
    assert header == ["s", "l", "names", "m", "empty", "n"]
    assert json.loads(row[0]) == {"a": 1, "b": [1, 2], "c": 'x,"y"'}
    assert json.loads(row[1]) == [1, 2, 3]
    assert json.loads(row[2]) == ["p", None]
    assert json.loads(row[3]) == [["k", 2]]
    assert row[4] == "" and row[5] == "7"


def test_nested_column_of_a_view_as_csv(wh: tuple[Store, str], unchanged: None) -> None:
    store, run_id = wh
    config = json.loads((store.runs_dir / run_id / "config.json").read_text())
    nested = [k for k, v in config.items() if isinstance(v, dict)]
    assert nested, config.keys()
    key = nested[0]
    res = cli(
        "sql",
        f"SELECT run_id, \"{key}\" FROM runs WHERE run_id = '{run_id}'",
        "--store",
        str(store.root),
        "--format",
        "csv",
    )
    assert res.exit_code == 0, res.output
    header, row = read_csv_rows(res.stdout)
    assert header == ["run_id", key] and row[0] == run_id
    cell = json.loads(row[1])
    # Every leaf the config file holds is in the cell (DuckDB may add keys of other runs as null).
    for k, v in config[key].items():
        if isinstance(v, (str, int, bool)):
            assert cell[k] == v, k


def test_query_csv_to_out_file(wh: tuple[Store, str], tmp_path: Path, unchanged: None) -> None:
    store, run_id = wh
    out = tmp_path / "latency.csv"
    res = cli("query", "latency", "--run", run_id, "--store", str(store.root), "--format", "csv", "--out", str(out))
    assert res.exit_code == 0, res.output
    header, *rows = read_csv_rows(out.read_text())
    assert "metric" in header and len(rows) >= 4


# --- missing store, unknown run --------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["sql", "SELECT 1"],
        ["query", "latency"],
        ["query", "token_totals", "--date", "2024-01-01"],
        ["query", "latency", "--rebuild"],
    ],
    ids=["sql", "query", "query_date", "query_rebuild"],
)
def test_missing_store_is_an_error_and_creates_nothing(args: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "store"
    line = assert_refused(cli(*args, "--store", str(missing)), str(missing), "does not exist")
    assert "store" in line
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RooftraceError, match="does not exist"):
        run_sql(Store(missing), "SELECT 1")
    with pytest.raises(RooftraceError, match="does not exist"):
        connect(Store(missing))
    assert list(tmp_path.iterdir()) == []


def test_unknown_run_id_is_an_error_naming_the_nearest(wh: tuple[Store, str], unchanged: None) -> None:
    store, run_id = wh
    typo = run_id[:-1] + ("x" if run_id[-1] != "x" else "y")
    for name in ("latency", "kv_memory", "cost", "goodput"):
        line = assert_refused(cli("query", name, "--run", typo, "--store", str(store.root)), repr(typo))
        assert "nearest" in line and run_id in line
    line = assert_refused(cli("query", "latency", "--param", f"run_id={typo}", "--store", str(store.root)), repr(typo))
    assert run_id in line
    # A path-like id is just an unknown id.
    assert_refused(cli("query", "latency", "--run", "../runs", "--store", str(store.root)), "'../runs'")
    with pytest.raises(RooftraceError, match="no replay run"):
        run_query(store, "latency", {"run_id": typo})


def test_unknown_run_id_in_a_store_without_runs(tmp_path: Path) -> None:
    store = Store(tmp_path / "empty")
    build_warehouse(store)
    before = digest(store.root)
    line = assert_refused(cli("query", "latency", "--run", "r1", "--store", str(store.root)), "'r1'")
    assert "holds none" in line
    assert digest(store.root) == before


def test_run_option_on_a_query_without_a_run(wh: tuple[Store, str], unchanged: None) -> None:
    store, run_id = wh
    assert_refused(cli("query", "token_totals", "--run", run_id, "--store", str(store.root)), "takes no --run")


def test_a_damaged_warehouse_is_rebuilt_on_read(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    build_warehouse(store)
    (store.root / "warehouse.duckdb").write_bytes(b"not a duckdb file" * 100)
    res = cli("sql", "SELECT count(*) AS n FROM requests", "--store", str(store.root), "--format", "csv")
    assert res.exit_code == 0 and res.stdout.splitlines() == ['"n"', "0"], res.output
    (store.root / "warehouse.duckdb").write_bytes(b"not a duckdb file" * 100)
    res = cli("query", "ingest_accounting", "--rebuild", "--store", str(store.root), "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == []  # an empty store: no files ingested


def test_a_too_deep_expression_does_not_suggest_a_refused_set(tmp_path: Path) -> None:
    """DuckDB's hint 'Use "SET max_expression_depth TO x"' pointed at a statement the sandbox
    refuses."""
    store = Store(tmp_path / "st")
    store.root.mkdir(parents=True)
    res = CliRunner().invoke(main, ["sql", "SELECT " + "+".join(["1"] * 3000), "--store", str(store.root)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "SET max_expression_depth" not in res.stderr
    assert "expression depth" in res.stderr and "fewer nested terms" in res.stderr
