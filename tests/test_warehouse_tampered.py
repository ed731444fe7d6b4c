"""The warehouse, ``sql``, ``query`` and ``cost`` on a tampered store
(docs/limits.md, "The SQL warehouse")."""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_checks import cli, one_error, rows

from pipeline.common.errors import RooftraceError
from pipeline.ingest.store import Store
from pipeline.publish.warehouse import Session, build_warehouse, write_result

COPY = "copy"


@pytest.fixture
def store(replayed_store: tuple[Store, str], tmp_path: Path) -> tuple[Store, str]:
    """A private copy of the replayed store, with its one run only."""
    src, run_id = replayed_store
    store = Store(tmp_path / "store")
    shutil.copytree(src.root, store.root, ignore=shutil.ignore_patterns("warehouse.duckdb*"))
    for run in store.runs_dir.iterdir():  # other tests may have added runs to the shared store
        if run.name != run_id:
            shutil.rmtree(run) if run.is_dir() else run.unlink()
    return store, run_id


def count(store: Store, sql: str) -> list[str]:
    res = cli("sql", sql, "--store", str(store.root), "--format", "csv")
    assert res.exit_code == 0, res.stderr
    return res.stdout.splitlines()[1].split(",")


def truncate(path: Path, keep: int = 300) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# --- 2. a foreign Parquet file in a date folder never enters the requests view -----------------------


def test_a_foreign_file_in_a_date_folder_is_not_counted(store: tuple[Store, str]) -> None:
    st, run_id = store
    n = int(count(st, "SELECT count(*) FROM requests")[0])
    assert n > 0
    date = st.dates()[0]
    stray = st.requests_dir / f"date={date}" / "zz-stray.parquet"
    shutil.copy(st.runs_dir / run_id / "requests.parquet", stray)
    res = cli("sql", "SELECT count(*), count(DISTINCT request_id) FROM requests", "--store", str(st.root), "--json")
    if res.exit_code == 0:  # the store lists its own files only: the stray is not read
        got = json.loads(res.stdout)[0]
        assert list(got.values()) == [n, n]
    else:  # or the schema check names it
        one_error(res, "zz-stray.parquet", "'requests'")


def test_the_requests_view_lists_the_stores_files(store: tuple[Store, str]) -> None:
    from pipeline.publish.warehouse import VIEWS, _scan, _view_sql

    st, _ = store
    spec = next(v for v in VIEWS if v.name == "requests")
    text = _view_sql(st, spec, _scan(st))
    files = [f for d in st.dates() for f in st.request_files(d)]
    assert files and "*.parquet" not in text  # no glob: the files by name
    for f in files:
        assert str(f.resolve()) in text


# --- 3. --param date=/run_id= are checked as --date/--run ------------------------------------------------


def test_param_date_is_checked_as_the_date_option(store: tuple[Store, str]) -> None:
    st, _ = store
    date = st.dates()[0]
    args = ("query", "token_totals", "--store", str(st.root), "--format", "csv")
    one_error(cli(*args, "--date", date, "--param", "date=2031-02-03"), "contradicts --date", "2031-02-03")
    one_error(cli(*args, "--param", "date=2031-02-03"), "no requests on 2031-02-03")
    one_error(cli(*args, "--param", "date=2031-02"), "2031-02")
    same = rows(cli(*args, "--param", f"date={date}"))
    assert same == rows(cli(*args, "--date", date)) and int(same[0]["requests"]) > 0


def test_param_run_id_is_checked_as_the_run_option(store: tuple[Store, str]) -> None:
    st, run_id = store
    args = ("query", "latency", "--store", str(st.root), "--format", "csv")
    one_error(cli(*args, "--param", "run_id=nope"), "'nope'", "nearest", run_id)
    one_error(cli(*args, "--run", run_id, "--param", "run_id=other"), "contradicts --run")
    assert rows(cli(*args, "--param", f"run_id={run_id}")) == rows(cli(*args, "--run", run_id))


# --- 4. seconds parameters are finite numbers > 0 ------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "abc", "1e9", ""])
def test_a_bad_slo_is_one_error_naming_it(store: tuple[Store, str], value: str) -> None:
    st, _ = store
    res = cli("query", "goodput", "--param", f"ttft_slo_s={value}", "--store", str(st.root))
    line = one_error(res, "ttft_slo_s")
    assert "Could not convert" not in line


def test_a_good_slo_is_applied(store: tuple[Store, str]) -> None:
    st, _ = store
    base = ("query", "goodput", "--store", str(st.root), "--format", "csv")
    none = rows(cli(*base))[0]
    tight = rows(cli(*base, "--param", "ttft_slo_s=0.000001"))[0]
    loose = rows(cli(*base, "--param", "ttft_slo_s=1000"))[0]
    assert float(tight["ttft_slo_s"]) == 1e-6 and int(tight["meeting_slo"]) < int(none["meeting_slo"])
    assert loose["meeting_slo"] == none["meeting_slo"] == none["finished"]
    with pytest.raises(RooftraceError, match="ttft_slo_s"), Session(st) as session:
        session.query("goodput", {"ttft_slo_s": float("nan")})


# --- 5. a damaged run is never answered for ------------------------------------------------------------


@pytest.mark.parametrize("name", ["steps.parquet", "requests.parquet"])
def test_a_damaged_only_run_fails_every_run_query(store: tuple[Store, str], name: str) -> None:
    st, run_id = store
    damaged = st.runs_dir / run_id / name
    truncate(damaged)
    for query in ("latency", "goodput", "cost", "kv_memory"):
        for extra in ((), ("--run", run_id)):
            res = cli("query", query, *extra, "--store", str(st.root), "--format", "csv")
            line = one_error(res, f"run {run_id} cannot be read", str(damaged.resolve()))
            assert "Binder Error" not in line and res.stdout == ""


def test_the_latest_readable_run_is_the_default(store: tuple[Store, str]) -> None:
    st, run_id = store
    newer = f"{run_id}-{COPY}"
    shutil.copytree(st.runs_dir / run_id, st.runs_dir / newer)
    later = time.time() + 10
    os.utime(st.runs_dir / newer / "config.json", (later, later))
    good = rows(cli("query", "latency", "--run", run_id, "--store", str(st.root), "--format", "csv"))
    truncate(st.runs_dir / newer / "steps.parquet")
    res = cli("query", "latency", "--store", str(st.root), "--format", "csv")
    assert rows(res) == good
    assert f"the latest run {newer} cannot be read" in res.stderr and f"answering for {run_id}" in res.stderr
    one_error(cli("query", "latency", "--run", newer, "--store", str(st.root)), f"run {newer} cannot be read")


# --- 7. store folders linked to another disk ---------------------------------------------------------------


def test_linked_runs_and_requests_folders_are_read(store: tuple[Store, str], tmp_path: Path) -> None:
    st, _ = store
    args = ("query", "latency", "--store", str(st.root), "--format", "csv")
    before = rows(cli(*args))
    n = count(st, "SELECT count(*) FROM requests")
    other = tmp_path / "other-disk"
    other.mkdir()
    for folder in ("runs", "requests"):
        shutil.move(st.root / folder, other / folder)
        (st.root / folder).symlink_to(other / folder)
    assert rows(cli(*args)) == before
    assert count(st, "SELECT count(*) FROM requests") == n
    # a date folder linked on its own
    date_dir = other / "requests" / f"date={st.dates()[0]}"
    shutil.move(date_dir, other / "a-date")
    date_dir.symlink_to(other / "a-date")
    assert count(st, "SELECT count(*) FROM requests") == n


def test_a_linked_file_or_a_folder_linked_to_etc_stays_refused(store: tuple[Store, str], tmp_path: Path) -> None:
    st, run_id = store
    secret = tmp_path / "secret.csv"
    secret.write_text("secret\nhunter2\n")
    (st.runs_dir / run_id / "leak.csv").symlink_to(secret)
    res = cli("sql", f"SELECT * FROM read_csv('{st.runs_dir / run_id / 'leak.csv'}')", "--store", str(st.root))
    one_error(res, "SQL refused", "Permission Error")
    assert "hunter2" not in res.stdout
    (st.runs_dir / "etc").symlink_to("/etc")
    one_error(cli("sql", "SELECT * FROM read_text('/etc/hostname')", "--store", str(st.root)), "SQL refused")


# --- 8. dates outside Python's range ----------------------------------------------------------------------

FAR = (
    "SELECT 'infinity'::DATE AS d, '-infinity'::TIMESTAMP AS t, '294247-01-10'::DATE AS far, "
    "DATE '2025-01-15' + INTERVAL 10000 YEAR AS ts, DATE '2025-01-15' AS ok, ['infinity'::DATE] AS l"
)


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_far_dates_print_as_text(store: tuple[Store, str], fmt: str) -> None:
    st, _ = store
    res = cli("sql", FAR, "--store", str(st.root), "--format", fmt)
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert "Traceback" not in res.output and "out of range" not in res.output
    for text in ("infinity", "-infinity", "294247-01-10", "12025-01-15 00:00:00", "2025-01-15", "[infinity]"):
        assert text in res.stdout, (text, res.stdout)
    if fmt == "json":
        assert json.loads(res.stdout) == [
            {
                "d": "infinity",
                "t": "-infinity",
                "far": "294247-01-10",
                "ts": "12025-01-15 00:00:00",
                "ok": "2025-01-15",
                "l": "[infinity]",
            }
        ]


def test_parquet_keeps_far_dates(store: tuple[Store, str], tmp_path: Path) -> None:
    st, _ = store
    out = tmp_path / "far.parquet"
    res = cli("sql", "SELECT 'infinity'::DATE AS d", "--store", str(st.root), "--format", "parquet", "--out", str(out))
    assert res.exit_code == 0, res.stderr
    assert pq.read_table(out).column("d").cast(pa.int32()).to_pylist() == [2**31 - 1]


# --- 9. the result is streamed --------------------------------------------------------------------------


def test_the_writer_streams_batch_by_batch() -> None:
    """Each batch is written before the next one is read: nothing holds the whole result."""
    schema = pa.schema([("i", pa.int64()), ("s", pa.string())])
    sink = io.BytesIO()
    sizes: list[int] = []

    def batches() -> Iterator[pa.RecordBatch]:
        for k in range(5):
            sizes.append(len(sink.getvalue()))  # what was written before this batch was read
            yield pa.record_batch([pa.array(range(k * 100, k * 100 + 100)), pa.array(["x"] * 100)], schema=schema)

    for fmt in ("csv", "json"):
        sink.seek(0)
        sink.truncate()
        sizes.clear()
        written = write_result(schema, batches(), fmt, None, sink)
        assert written.rows == 500
        assert sizes[0] == 0 and all(b > a for a, b in itertools.pairwise(sizes)), sizes
    assert [r["i"] for r in json.loads(sink.getvalue())] == list(range(500))


def test_a_large_export_within_a_small_limit(store: tuple[Store, str], tmp_path: Path) -> None:
    st, _ = store
    env = {"ROOFTRACE_MAX_MEMORY": "64MiB"}
    sql = "SELECT range AS i, 'abcdefghij' || range AS s FROM range(100000)"
    out = tmp_path / "deep" / "er" / "big.json"
    res = cli("sql", sql, "--store", str(st.root), "--format", "json", "--out", str(out), env=env)
    assert res.exit_code == 0, res.stderr
    assert f"wrote 100,000 rows to {out}" in res.stderr
    got = json.loads(out.read_text())
    assert len(got) == 100_000 and got[-1] == {"i": 99_999, "s": "abcdefghij99999"}
    # a table is laid out whole: one past the limit is refused with one line, no file left
    table = tmp_path / "big.txt"
    res = cli("sql", sql, "--store", str(st.root), "--out", str(table), env=env)
    one_error(res, "too large to lay out as a table", "--format csv")
    assert not table.exists() and not list(tmp_path.glob(".big.txt.*"))


# --- 10. query cost checks the run's config as cost does --------------------------------------------------


@pytest.mark.parametrize("replicas", [0, 10**30, 2.5])
def test_query_cost_refuses_what_cost_refuses(store: tuple[Store, str], replicas: object) -> None:
    st, run_id = store
    path = st.runs_dir / run_id / "config.json"
    doc = json.loads(path.read_text())
    doc["resolved"]["fleet"]["replicas"] = replicas
    path.write_text(json.dumps(doc))
    refused = one_error(cli("cost", "--store", str(st.root)), "replicas")
    reason = refused.split(": ", 2)[-1]  # after 'error: <config.json>:'
    line = one_error(cli("query", "cost", "--store", str(st.root), "--format", "csv"), f"run {run_id} cannot be read")
    assert reason in line


def test_a_tampered_gpus_per_replica_is_refused(store: tuple[Store, str]) -> None:
    st, run_id = store
    path = st.runs_dir / run_id / "config.json"
    doc = json.loads(path.read_text())
    doc["resolved"]["gpus_per_replica"] = 1000
    path.write_text(json.dumps(doc))
    one_error(cli("cost", "--store", str(st.root)), "gpus_per_replica")
    one_error(cli("query", "cost", "--store", str(st.root)), "gpus_per_replica")


# --- 11. a run folder without config.json is in no view ------------------------------------------------------


def test_a_run_without_config_is_left_out_of_every_view(store: tuple[Store, str]) -> None:
    st, run_id = store
    (st.runs_dir / run_id / "config.json").unlink()
    res = cli(
        "sql",
        "SELECT (SELECT count(*) FROM runs) AS runs, (SELECT count(*) FROM replay_requests) AS requests, "
        "(SELECT count(*) FROM replay_steps) AS steps, (SELECT count(*) FROM replay_series) AS series",
        "--store",
        str(st.root),
        "--json",
    )
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout) == [{"runs": 0, "requests": 0, "steps": 0, "series": 0}]
    assert f"run {run_id} left out of the warehouse" in res.stderr and "config.json: missing" in res.stderr


# --- 12. minor --------------------------------------------------------------------------------------------


def test_several_statements_are_refused(store: tuple[Store, str]) -> None:
    st, _ = store
    res = cli("sql", "SELECT 'first' AS a; SELECT 'second' AS b", "--store", str(st.root))
    one_error(res, "2 statements", "one query at a time")
    assert res.stdout == ""
    assert cli("sql", "SELECT 1 AS a;", "--store", str(st.root), "--format", "csv").stdout == '"a"\n1\n'


def test_install_is_named_install(store: tuple[Store, str]) -> None:
    st, _ = store
    one_error(cli("sql", "INSTALL httpfs", "--store", str(st.root)), "an INSTALL statement")
    one_error(cli("sql", "EXPORT DATABASE '/tmp/x'", "--store", str(st.root)), "an EXPORT statement")
    one_error(cli("sql", "LOAD httpfs", "--store", str(st.root)), "a LOAD statement")


def test_out_into_a_new_folder_says_what_it_wrote(store: tuple[Store, str], tmp_path: Path) -> None:
    st, _ = store
    out = tmp_path / "new" / "x.csv"
    res = cli("sql", "SELECT range AS r FROM range(3)", "--store", str(st.root), "--format", "csv", "--out", str(out))
    assert res.exit_code == 0 and res.stdout == ""
    assert res.stderr.strip() == f"wrote 3 rows to {out}"
    assert out.read_text() == '"r"\n0\n1\n2\n'


def test_cost_refuses_an_empty_run_id(store: tuple[Store, str]) -> None:
    st, _ = store
    one_error(cli("cost", "--run", "", "--store", str(st.root)), "run id is empty")
    assert not (st.root / "costs").exists()


def test_sigterm_removes_the_temporary_folder(store: tuple[Store, str], tmp_path: Path) -> None:
    st, _ = store
    build_warehouse(st)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    endless = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "sql", endless, "--store", str(st.root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("rooftrace-duckdb-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(tmp.glob("rooftrace-duckdb-*")), "the query never started"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert list(tmp.glob("rooftrace-duckdb-*")) == []
