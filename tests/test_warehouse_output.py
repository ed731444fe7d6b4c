"""What ``rooftrace sql`` and ``rooftrace query`` tell a person besides the rows
(pipeline/publish/warehouse.py): a hint when a view they read is empty because classify or replay has
not run, a table fitted to the terminal's width, errors as one ``error:`` line, and a named query
over classify's tables that says on its first line when the day's classify predates its requests."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from cli_checks import cli, one_error

from pipeline.ingest.store import Store
from pipeline.publish.warehouse import MIN_COLUMN_WIDTH, empty_view_hints, terminal_table

DAY = "2025-01-15"


def _ingest(store: Store, tmp_path: Path, seed: int, name: str, requests: int = 300) -> None:
    from pipeline.ingest import ingest_logs
    from pipeline.synth import SynthConfig, generate, write_logs

    frame = generate(SynthConfig(requests=requests, seed=seed, duration_s=3600, tenants=2, date=DAY, diurnal=False))
    frame = frame.with_columns(frame["request_id"] + f"-{name}")  # (ids of their own: not duplicates)
    write_logs(frame, "openai", tmp_path / f"{name}.jsonl")
    summary = ingest_logs([tmp_path / f"{name}.jsonl"], store)
    assert not summary.errors


@pytest.fixture(scope="module")
def stale(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, int, int]:
    """Hostile: 300 requests ingested and classified, then 300 more of the same date ingested."""
    from pipeline.classify.accounting import classify_tokens

    tmp = tmp_path_factory.mktemp("stale")
    store = Store(tmp / "store")
    _ingest(store, tmp, 1, "first")
    classify_tokens(store, DAY)
    first = store.stored_rows(DAY)
    _ingest(store, tmp, 2, "second")
    return store, first, store.stored_rows(DAY)


def test_token_totals_says_first_that_the_classify_predates_the_requests(stale: tuple[Store, int, int]) -> None:
    store, first, now = stale
    assert first == 300 and now == 600
    res = cli("query", "token_totals", "--store", str(store.root))
    assert res.exit_code == 0, (res.stderr, res.exception)
    head = res.stderr.splitlines()[0]
    assert head.startswith(f"warning: STALE CLASSIFY: the token accounting of {DAY} predates its requests")
    assert "it covers 300 requests, the store holds 600" in head and f"rooftrace classify --date {DAY}" in head
    doc = cli("query", "token_totals", "--store", str(store.root), "--json")
    (row,) = json.loads(doc.stdout)
    assert row["requests"] == 300  # the accounting's day, as it is ...
    assert row["stale_classify"].startswith("STALE CLASSIFY:") and "holds 600" in row["stale_classify"]  # ... said


def test_a_query_of_a_current_classify_has_no_warning(stale: tuple[Store, int, int], tmp_path: Path) -> None:
    from pipeline.classify.accounting import classify_tokens

    store = Store(tmp_path / "store")
    _ingest(store, tmp_path, 1, "only", requests=50)
    classify_tokens(store, DAY)
    res = cli("query", "token_totals", "--store", str(store.root), "--json")
    assert res.exit_code == 0 and "warning" not in res.stderr, res.stderr
    (row,) = json.loads(res.stdout)
    assert row["requests"] == 50 and "stale_classify" not in row
    # a query that reads no accounting says nothing of it
    lat = cli("query", "ingest_accounting", "--store", str(stale[0].root))
    assert lat.exit_code == 0, lat.stderr


def test_sql_hints_which_command_fills_an_empty_view(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    _ingest(store, tmp_path, 4, "day", requests=40)
    res = cli("sql", "select count(*) AS n from accounting_requests", "--store", str(store.root), "--format", "csv")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines() == ['"n"', "0"]
    assert res.stderr.splitlines() == [
        f"hint: accounting_requests: {DAY} is not classified yet (40 stored requests not in it); "
        f"`rooftrace classify --date {DAY}` fills it"
    ]
    both = cli("sql", "SELECT * FROM Replay_Requests, cache_curve LIMIT 1", "--store", str(store.root))
    assert both.stderr.splitlines() == [
        f"hint: cache_curve: {DAY} is not classified yet (40 stored requests not in it); "
        f"`rooftrace classify --date {DAY}` fills it",
        "hint: replay_requests: the store holds no replay run yet; `rooftrace replay` fills it",
    ]
    assert empty_view_hints(store, "select count(*) from requests") == []


def test_sql_errors_are_one_error_line(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    _ingest(store, tmp_path, 4, "day", requests=10)
    line = one_error(cli("sql", "select nope from requests", "--store", str(store.root)), "SQL failed: Binder Error")
    assert line.startswith("error: SQL failed: ") and "\n" not in line


def test_terminal_table_fits_the_width_and_ellipsizes_long_cells() -> None:
    long_model = "hosted_vllm/meta-llama/Llama-3.1-70B-Instruct-" + "x" * 80
    table = pa.table({"model": [long_model, "llama-3.1-8b"], "requests": [19366, 2], "note": ["n" * 300, "short"]})
    text = terminal_table(table, width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) == 80
    assert "19366" in text and "requests" in text  # the narrow columns keep their width
    assert lines[3] == "│ hosted_vllm/meta-llama/Llama-3… │ 19366    │ " + "n" * 30 + "… │"
    assert long_model not in text
    # a wide terminal shows the whole value
    assert long_model in terminal_table(table, width=400)


def test_terminal_table_too_many_columns_prints_one_block_per_row() -> None:
    table = pa.table({f"column_{i}": [i, 10 * i] for i in range(10)})
    assert 10 * MIN_COLUMN_WIDTH + 31 > 80
    lines = terminal_table(table, width=80).splitlines()
    assert lines[0] == "-[ row 1 ]".ljust(80, "-")
    assert lines[1:3] == ["column_0 | 0", "column_1 | 1"]
    assert lines[11] == "-[ row 2 ]".ljust(80, "-") and lines[12 + 9] == "column_9 | 90"
    assert max(len(line) for line in lines) == 80


def test_tables_show_latencies_in_ms_and_files_keep_seconds() -> None:
    from pipeline.publish.warehouse import latencies_in_ms

    table = pa.table(
        {
            "metric": ["ttft_s", "samples_per_s", None],
            "p50": [0.00971, 2.5, 1.0],
            "p99_9": [0.25, 3.0, None],
            "samples": [10, 10, 10],
            "observed_p99_s": [0.5, 0.5, 0.5],
            "tokens_per_s": [100.0, 100.0, 100.0],
            "bin_s": [60, 60, 60],
        }
    )
    shown = latencies_in_ms(table)
    assert shown.column_names == ["metric", "p50", "p99_9", "samples", "observed_p99_ms", "tokens_per_s", "bin_s"]
    assert shown.to_pylist()[0] == {
        "metric": "ttft_ms", "p50": 9.71, "p99_9": 250.0, "samples": 10, "observed_p99_ms": 500.0,
        "tokens_per_s": 100.0, "bin_s": 60,
    }  # fmt: skip
    # a rate is no latency, nor is a row without a metric
    assert shown.column("p50").to_pylist()[1:] == [2.5, 1.0]
    assert shown.column("metric").to_pylist()[1:] == ["samples_per_s", None]


def test_sql_table_in_ms_csv_in_seconds(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    _ingest(store, tmp_path, 4, "day", requests=10)
    sql = "SELECT 0.00971 AS tpot_s, 3 AS output_tokens"
    table = cli("sql", sql, "--store", str(store.root))
    assert "tpot_ms" in table.stdout and "9.71" in table.stdout and "0.00971" not in table.stdout
    csv_out = cli("sql", sql, "--store", str(store.root), "--format", "csv")
    assert csv_out.stdout.splitlines() == ['"tpot_s","output_tokens"', "0.00971,3"]
