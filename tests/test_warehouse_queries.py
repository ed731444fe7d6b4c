"""The warehouse, ``sql`` and ``query`` (docs/limits.md, "The SQL warehouse")."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import cli, one_error, rows

from pipeline.ingest.store import Store


def copy_store(src: Store, root: Path, run_id: str) -> Store:
    store = Store(root)
    shutil.copytree(src.root, root, ignore=shutil.ignore_patterns("warehouse.duckdb*"))
    for run in store.runs_dir.iterdir():  # other tests may have added runs to the shared store
        if run.name != run_id:
            shutil.rmtree(run) if run.is_dir() else run.unlink()
    return store


@pytest.fixture(scope="module")
def two_days(replayed_template: tuple[Store, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, str]:
    """The replayed store (one classified date, one run) plus a second date ingested but not classified."""
    from pipeline.ingest import ingest_logs
    from pipeline.synth import SynthConfig, generate, write_logs

    src, run_id = replayed_template
    root = tmp_path_factory.mktemp("h12")
    store = copy_store(src, root / "store", run_id)
    frame = generate(SynthConfig(requests=120, seed=5, duration_s=600, tenants=2, date="2031-02-03"))
    write_logs(frame, "openai", root / "logs" / "later.jsonl")
    ingest_logs([root / "logs" / "later.jsonl"], store)
    assert "2031-02-03" in store.dates() and len(store.dates()) == 2
    return store, run_id


# --- 1. a key=value folder above the store is no partition column -----------------------------------

_ANSWERS = {
    "requests": "SELECT CAST(date AS VARCHAR) d, model, count(*) n FROM requests GROUP BY ALL ORDER BY ALL",
    "accounting": "SELECT CAST(date AS VARCHAR) d, model, count(*) n FROM accounting_requests "
    "GROUP BY ALL ORDER BY ALL",
    "others": "SELECT (SELECT list(DISTINCT CAST(date AS VARCHAR) ORDER BY 1) FROM accounting_minutes), "
    "(SELECT list(DISTINCT CAST(date AS VARCHAR) ORDER BY 1) FROM cache_curve), "
    "(SELECT list((run_id, CAST(date AS VARCHAR))) FROM runs), (SELECT count(*) FROM replay_requests), "
    "(SELECT count(*) FROM manifest), (SELECT count(*) FROM quarantine)",
}


def _answers(store: Store) -> dict[str, str]:
    out = {}
    for name, sql in _ANSWERS.items():
        res = cli("sql", sql, "--store", str(store.root), "--format", "csv")
        assert res.exit_code == 0, (name, res.stderr)
        out[name] = res.stdout
    for view in ("requests", "manifest"):
        res = cli("sql", f"SELECT * FROM {view} LIMIT 0", "--store", str(store.root), "--format", "csv")
        assert res.exit_code == 0, (view, res.stderr)
        out[f"columns {view}"] = res.stdout  # the header: no column gained from a folder above
    return out


@pytest.mark.parametrize("above", ["date=2020-01-01", "model=evil", "x=1"])
def test_a_hive_folder_above_the_store_changes_nothing(two_days: tuple[Store, str], tmp_path: Path, above: str) -> None:
    src, run_id = two_days
    plain = copy_store(src, tmp_path / "plain" / "st", run_id)
    hidden = copy_store(src, tmp_path / above / "st", run_id)
    want, got = _answers(plain), _answers(hidden)
    assert got == want
    dates = [r["d"] for r in csv.DictReader(io.StringIO(got["requests"]))]
    assert sorted(set(dates)) == sorted(src.dates())  # not 2020-01-01
    assert "evil" not in got["requests"] and "evil" not in got["accounting"]
    assert '"x"' not in got["columns requests"] and '"x"' not in got["columns manifest"]
    # a named query of a classified date answers, as it does for the store elsewhere
    date = src.dates()[0]
    a = rows(cli("query", "token_totals", "--date", date, "--store", str(hidden.root), "--format", "csv"))
    b = rows(cli("query", "token_totals", "--date", date, "--store", str(plain.root), "--format", "csv"))
    assert a == b and int(a[0]["requests"]) > 0


# --- 4. sql --format json refuses columns that share a name -----------------------------------------


def test_json_refuses_duplicate_column_names(two_days: tuple[Store, str], tmp_path: Path) -> None:
    st, _ = two_days
    res = cli("sql", "SELECT 1 AS a, 2 AS a, 3 AS b", "--store", str(st.root), "--format", "json")
    line = one_error(res, "more than one column named 'a'", "alias")
    assert "'b'" not in line and res.stdout == ""
    res = cli("sql", "SELECT * FROM requests r JOIN accounting_requests a USING (request_id) LIMIT 1",
              "--store", str(st.root), "--json")  # fmt: skip
    one_error(res, "'model'", "alias")
    # parquet keeps one column per name on reading back: refused as well, no file written
    out = tmp_path / "dup.parquet"
    res = cli("sql", "SELECT 1 AS a, 2 AS a", "--store", str(st.root), "--format", "parquet", "--out", str(out))
    one_error(res, "'a'")
    assert not out.exists()
    # csv shows both columns, as before; aliased names pass in json
    assert cli("sql", "SELECT 1 AS a, 2 AS a", "--store", str(st.root), "--format", "csv").stdout.splitlines() == [
        '"a","a"',
        "1,2",
    ]
    res = cli("sql", "SELECT 1 AS a, 2 AS a_2", "--store", str(st.root), "--format", "json")
    assert res.exit_code == 0 and json.loads(res.stdout) == [{"a": 1, "a_2": 2}]


# --- 6. a full stdout is one error line --------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_stdout_is_one_line(two_days: tuple[Store, str]) -> None:
    st, _ = two_days
    base = [str(Path(sys.executable).with_name("rooftrace"))]
    if not Path(base[0]).exists():
        pytest.skip("no rooftrace script beside the interpreter")
    sql = "SELECT * FROM requests"
    cases = [
        ["sql", sql, "--format", "csv"],
        ["sql", sql, "--format", "json"],
        ["sql", sql, "--format", "parquet", "--out", "-"],
        ["query", "--list"],
        ["query", "ingest_accounting", "--format", "json"],
        ["query", "ingest_accounting", "--format", "table"],
    ]
    env = {**os.environ, "ROOFTRACE_MAX_MEMORY": "2GiB"}
    for args in cases:
        with open("/dev/full", "wb") as full:
            done = subprocess.run(
                [*base, *args, "--store", str(st.root)], stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                timeout=120,
            )  # fmt: skip
        assert done.returncode == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, (args, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert lines == ["error: cannot write the result to stdout: No space left on device"], (args, lines)


# --- 7. optional dates, plan ids and cost subjects are checked --------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["ingest_accounting", "--date", "2099-01-01"],
        ["ingest_accounting", "--param", "date=2099-01-01"],
        ["plan", "--date", "2099-01-01"],
        ["plan", "--param", "date=2099-01-01"],
    ],
)
def test_an_optional_date_is_checked(two_days: tuple[Store, str], args: list[str]) -> None:
    st, _ = two_days
    one_error(cli("query", *args, "--store", str(st.root), "--format", "csv"), "no requests on 2099-01-01")


def test_a_stored_optional_date_still_answers(two_days: tuple[Store, str]) -> None:
    st, _ = two_days
    got = rows(cli("query", "ingest_accounting", "--date", "2031-02-03", "--store", str(st.root), "--format", "csv"))
    assert [r["rows_stored"] for r in got if r["kind"] == "file"] == ["120"]


def test_unknown_plan_and_subject_are_refused(two_days: tuple[Store, str], tmp_path: Path) -> None:
    st, run_id = two_days
    one_error(
        cli("query", "plan", "--param", "plan_id=nope", "--store", str(st.root)),
        "no capacity plan 'nope'",
        "holds none",
    )
    one_error(cli("query", "plan_pareto", "--param", "plan_id=nope", "--store", str(st.root)), "'nope'")
    one_error(
        cli("query", "api_cost", "--param", "subject=nope", "--store", str(st.root)),
        "no cost of a run or plan 'nope'",
        "rooftrace cost",
    )
    # with costs written, the nearest subjects are named and a known one answers
    priced = copy_store(st, tmp_path / "priced", run_id)
    res = cli("cost", "--store", str(priced.root))
    assert res.exit_code == 0, res.stderr
    line = one_error(cli("query", "api_cost", "--param", f"subject={run_id}x", "--store", str(priced.root)))
    assert f"nearest: {run_id}" in line
    got = rows(cli("query", "api_cost", "--param", f"subject={run_id}", "--store", str(priced.root), "--format", "csv"))
    assert got


# --- 8. a date ingested but not classified is said to be so ----------------------------------------


@pytest.mark.parametrize("name", ["token_totals", "cache_curve_points", "token_rates"])
def test_an_unclassified_date_is_refused(two_days: tuple[Store, str], name: str) -> None:
    st, _ = two_days
    msg = "2031-02-03 holds 120 requests but is not classified yet: run rooftrace classify --date 2031-02-03"
    one_error(cli("query", name, "--date", "2031-02-03", "--store", str(st.root), "--format", "csv"), msg)
    one_error(cli("query", name, "--store", str(st.root)), msg)  # the latest date, by default
    got = rows(cli("query", name, "--date", st.dates()[0], "--store", str(st.root), "--format", "csv"))
    assert got


# --- 9. one column, one format, whatever batch a far date falls in -------------------------------------


def _two_batches(fmt: str) -> list[list[str]]:
    """A timestamp and a date column written in two batches, the second holding a far value."""
    import datetime as dt

    import pyarrow as pa

    from pipeline.publish.warehouse import write_result

    schema = pa.schema([("t", pa.timestamp("us")), ("d", pa.date32())])
    near_t = dt.datetime(2025, 1, 15, 1, 2, 3, 400000)
    near_us = (near_t - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    far_us = near_us + 10_000 * 366 * 86_400_000_000  # past year 9999
    near_d = (dt.date(2025, 1, 2) - dt.date(1970, 1, 1)).days
    first = pa.record_batch(
        [pa.array([near_us], pa.int64()).cast(schema[0].type), pa.array([near_d], pa.int32()).cast(pa.date32())],
        schema=schema,
    )
    second = pa.record_batch(
        [
            pa.array([near_us, far_us], pa.int64()).cast(schema[0].type),
            pa.array([2**31 - 1, near_d], pa.int32()).cast(pa.date32()),  # DuckDB's 'infinity'
        ],
        schema=schema,
    )
    sink = io.BytesIO()
    write_result(schema, [first, second], fmt, None, sink)
    text = sink.getvalue().decode()
    if fmt == "csv":
        return [row for row in csv.reader(io.StringIO(text))][1:]
    return [[r["t"], r["d"]] for r in json.loads(text)]


@pytest.mark.parametrize(
    ("fmt", "t_text", "d_text"),
    [("csv", "2025-01-15 01:02:03.400000", "2025-01-02"), ("json", "2025-01-15T01:02:03.400000", "2025-01-02")],
)
def test_a_far_date_in_one_batch_leaves_the_others_format(fmt: str, t_text: str, d_text: str) -> None:
    got = _two_batches(fmt)
    assert got[0] == [t_text, d_text]  # the first batch: the format's own text
    assert got[1][0] == t_text  # the same value in the batch with the far date: the same text
    assert got[2][0] == "12045-10-12 01:02:03.4"  # the far one: DuckDB's text
    assert got[1][1] == "infinity" and got[2][1] == d_text
