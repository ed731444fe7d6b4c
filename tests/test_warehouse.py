"""Named queries checked against independent computations (polars/numpy) over the same Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.common.errors import RooftraceError
from pipeline.common.tables import table_to_json
from pipeline.ingest.store import Store
from pipeline.publish.warehouse import build_warehouse, list_queries, run_query, run_sql
from pipeline.replay.slo import percentile
from tests.conftest import copy_replayed

PCTS = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p99_9": 99.9}


@pytest.fixture(scope="module")
def run(replayed_template: tuple[Store, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, str, Path]:
    store, run_id = copy_replayed(replayed_template, tmp_path_factory.mktemp("warehouse") / "store")
    build_warehouse(store)
    return store, run_id, store.runs_dir / run_id


def q(store: Store, name: str, **params: Any) -> list[dict[str, Any]]:
    return table_to_json(run_query(store, name, params))


def test_latency_percentiles_match_numpy(run: tuple[Store, str, Path]) -> None:
    store, run_id, d = run
    req = pl.read_parquet(d / "requests.parquet").filter(pl.col("status") == "finished")
    rows = {r["metric"]: r for r in q(store, "latency", run_id=run_id)}
    for metric in ("queue_s", "ttft_s", "tpot_s", "e2e_s"):
        v = req[metric].drop_nulls().to_numpy()
        v = v[np.isfinite(v)]
        assert rows[metric]["samples"] == len(v) > 100
        for col, p in PCTS.items():
            # one percentile definition: the SQL (quantile_disc) and pipeline.replay.slo.percentile agree exactly
            assert rows[metric][col] == percentile(v, p) == np.percentile(v, p, method="inverted_cdf"), (metric, col)
        assert rows[metric]["mean"] == pytest.approx(v.mean(), rel=1e-9)


def test_itl_is_the_token_weighted_step_time(run: tuple[Store, str, Path]) -> None:
    store, run_id, d = run
    steps = pl.read_parquet(d / "steps.parquet").filter((pl.col("decode_seqs") > 0) & (pl.col("steps") > 0))
    v = ((steps["end_s"] - steps["start_s"]) / steps["steps"]).to_numpy()
    w = (steps["decode_seqs"] * steps["steps"]).to_numpy().astype(float)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cw = np.cumsum(w)
    row = next(r for r in q(store, "latency", run_id=run_id) if r["metric"] == "itl_s")
    for col, p in PCTS.items():
        expect = v[np.searchsorted(cw, p / 100 * cw[-1] - 1e-9 * cw[-1])]
        assert row[col] == pytest.approx(expect, rel=1e-9), col
    assert row["mean"] == pytest.approx(float((v * w).sum() / w.sum()), rel=1e-9)
    # Output tokens minus first tokens = decode tokens: the ITL samples cover them all.
    req = pl.read_parquet(d / "requests.parquet").filter(pl.col("status") == "finished")
    assert row["samples"] >= int((req["output_tokens"] - 1).clip(lower_bound=0).sum())


def test_peak_throughput_matches_polars(run: tuple[Store, str, Path]) -> None:
    store, run_id, d = run
    s = pl.read_parquet(d / "series.parquet")
    per_s = s.group_by("second").agg(
        pl.col("fresh_prefill_tokens_per_s").sum(), pl.col("decode_tokens_per_s").sum(), pl.col("time").min()
    )
    per_min = per_s.group_by(pl.col("second") // 60).agg(
        (pl.col("fresh_prefill_tokens_per_s").sum() / 60), (pl.col("decode_tokens_per_s").sum() / 60)
    )
    rows = {(r["metric"], r["window"]): r for r in q(store, "peak_throughput", run_id=run_id)}
    assert rows[("fresh_prefill", "1s")]["tokens_per_s"] == pytest.approx(per_s["fresh_prefill_tokens_per_s"].max())
    assert rows[("decode", "1s")]["tokens_per_s"] == pytest.approx(per_s["decode_tokens_per_s"].max())
    assert rows[("fresh_prefill", "1min")]["tokens_per_s"] == pytest.approx(per_min["fresh_prefill_tokens_per_s"].max())
    assert rows[("decode", "1min")]["tokens_per_s"] == pytest.approx(per_min["decode_tokens_per_s"].max())
    best = per_s.filter(pl.col("decode_tokens_per_s") == per_s["decode_tokens_per_s"].max())
    assert rows[("decode", "1s")]["at"] in {t.isoformat() for t in best["time"]}  # ties: any of them
    # The series' prefill work adds up to the tokens the requests actually prefilled.
    req = pl.read_parquet(d / "requests.parquet")
    total_prefill = float(s["fresh_prefill_tokens_per_s"].sum())
    assert total_prefill == pytest.approx(float(req["prefill_tokens"].sum()), rel=1e-6)


def test_token_totals_and_rates_match_accounting(run: tuple[Store, str, Path]) -> None:
    store, _, _ = run
    date = store.dates()[0]
    acc = pl.read_parquet(next(store.accounting_dir.glob(f"requests/date={date}/*.parquet")))
    (row,) = q(store, "token_totals", date=date)
    for col in ("recorded_input_tokens", "cache_hit_tokens", "fresh_input_tokens", "output_tokens"):
        assert row[col] == int(acc[col].sum())
    assert row["requests"] == acc.height
    assert row["inflation_ratio"] == pytest.approx(acc["recorded_input_tokens"].sum() / acc["fresh_input_tokens"].sum())
    minutes = q(store, "token_rates", date=date)
    assert sum(r["requests"] for r in minutes) == acc.height


def test_kv_memory_and_cost_from_config(run: tuple[Store, str, Path]) -> None:
    store, run_id, d = run
    cfg = json.loads((d / "config.json").read_text())["resolved"]
    steps = pl.read_parquet(d / "steps.parquet")
    kv = {r["replica"]: r for r in q(store, "kv_memory", run_id=run_id)}
    cap = cfg["memory"]["kv_capacity_blocks"]
    assert kv["fleet"]["capacity_blocks"] == cap
    assert kv["fleet"]["peak_blocks"] == steps["kv_blocks_used"].max()
    assert kv["fleet"]["headroom"] == pytest.approx(1 - steps["kv_blocks_used"].max() / cap)
    assert kv["fleet"]["peak_blocks"] <= cap
    (cost,) = q(store, "cost", run_id=run_id)
    from pipeline.catalog import load_hardware

    hw = load_hardware(cfg["fleet"]["hardware"])
    gpus = cfg["fleet"]["replicas"] * cfg["gpus_per_replica"]
    assert cost["gpus"] == gpus
    assert cost["usd_per_day"] == pytest.approx(gpus * hw.price_usd_per_gpu_hour * 24)
    req = pl.read_parquet(d / "requests.parquet").filter(pl.col("status") == "finished")
    span = float(req["finish_s"].max() - req["arrival_s"].min())
    usd = gpus * hw.price_usd_per_gpu_hour * span / 3600
    assert cost["usd_per_million_output_tokens"] == pytest.approx(usd / (req["output_tokens"].sum() / 1e6))


def test_goodput_and_binding(run: tuple[Store, str, Path]) -> None:
    store, run_id, d = run
    req = pl.read_parquet(d / "requests.parquet")
    fin = req.filter(pl.col("status") == "finished")
    slo = float(np.percentile(fin["ttft_s"].to_numpy(), 80))
    (g,) = q(store, "goodput", run_id=run_id, ttft_slo_s=slo)
    assert g["meeting_slo"] == fin.filter(pl.col("ttft_s") <= slo).height
    span = float(fin["finish_s"].max() - fin["arrival_s"].min())
    assert g["goodput_requests_per_s"] == pytest.approx(g["meeting_slo"] / span)
    (no_slo,) = q(store, "goodput", run_id=run_id)
    assert no_slo["meeting_slo"] == fin.height
    shares = q(store, "binding_shares", run_id=run_id)
    fleet = [r for r in shares if r["replica"] == "fleet"]
    assert sum(r["share"] for r in fleet) == pytest.approx(1.0)
    steps = pl.read_parquet(d / "steps.parquet")
    assert sum(r["busy_s"] for r in fleet) == pytest.approx(float((steps["end_s"] - steps["start_s"]).sum()))


def test_latency_by_tenant_matches_numpy(run: tuple[Store, str, Path]) -> None:
    store, run_id, d = run
    req = pl.read_parquet(d / "requests.parquet").filter(pl.col("status") == "finished")
    canon = store.read_requests().select("request_id", "tenant")
    joined = req.join(canon, on="request_id")
    rows = [r for r in q(store, "latency_by", run_id=run_id) if r["dimension"] == "tenant" and r["metric"] == "ttft_s"]
    assert len(rows) == joined["tenant"].n_unique()
    for r in rows:
        v = joined.filter(pl.col("tenant") == r["bucket"])["ttft_s"].to_numpy()
        assert r["samples"] == len(v)
        assert r["p99"] == percentile(v, 99)
    dims = {r["dimension"] for r in q(store, "latency_by", run_id=run_id)}
    assert dims == {"prompt_tokens", "output_tokens", "batch_occupancy", "tenant", "model", "hardware", "hour"}


def test_predicted_vs_observed_matches_numpy_and_the_report(run: tuple[Store, str, Path]) -> None:
    """The logs' own latencies (the synthetic OpenAI pairs carry ttft_s and e2e_s) against the
    replay's, per hour and for the day: numpy over the two tables, and the report's numbers."""
    from pipeline.publish.report import compare_observed

    store, run_id, d = run
    rows = q(store, "predicted_vs_observed", run_id=run_id)
    logged = store.read_requests(columns=["request_id", "arrival", "output_tokens", "ttft_s", "e2e_s"])
    replayed = pl.read_parquet(d / "requests.parquet", columns=["request_id", "status", "ttft_s", "tpot_s"])
    assert rows == compare_observed(logged, replayed).rows  # the report computes the same numbers
    both = logged.join(replayed.rename({"ttft_s": "ttft_s_r", "tpot_s": "tpot_s_r"}), on="request_id")
    j = both.filter(pl.col("status") == "finished")
    out = j["output_tokens"].to_numpy().astype(float)
    observed = {
        "ttft_s": j["ttft_s"].to_numpy(),
        "tpot_s": np.where(out > 1, (j["e2e_s"].to_numpy() - j["ttft_s"].to_numpy()) / np.maximum(out - 1, 1), np.nan),
    }
    hours = j["arrival"].dt.convert_time_zone("UTC").dt.strftime("%Y-%m-%d %H:00").to_numpy()
    assert {r["hour"] for r in rows} == {*hours.tolist(), "all"}
    for r in rows:
        g = np.ones(len(hours), bool) if r["hour"] == "all" else hours == r["hour"]
        o, p = observed[r["metric"]], j[f"{r['metric']}_r"].to_numpy()
        ok = g & np.isfinite(o) & np.isfinite(p)
        assert r["samples"] == int(ok.sum()) > 0
        if r["hour"] == "all":  # rejected requests counted, not compared
            assert (r["matched"], r["unfinished"]) == (both.height, both.height - j.height)
        for pct in (50, 99):
            want_o = np.percentile(o[ok], pct, method="inverted_cdf")
            want_p = np.percentile(p[ok], pct, method="inverted_cdf")
            assert r[f"observed_p{pct}_s"] == want_o and r[f"replayed_p{pct}_s"] == want_p
            assert r[f"p{pct}_error"] == pytest.approx(want_p / want_o - 1, rel=1e-12)


def test_every_named_query_runs_on_an_empty_store(tmp_path: Path) -> None:
    store = Store(tmp_path / "empty")
    build_warehouse(store)
    for query in list_queries():
        names = {p.rstrip("?") for p in query.params}
        if "run_id" in names:
            with pytest.raises(RooftraceError, match="needs a replay run"):
                run_query(store, query.name, {"date": "2024-01-01"})
        else:
            rows = table_to_json(run_query(store, query.name, {"date": "2024-01-01"}))
            # Row queries return nothing; aggregates return one row that counts nothing.
            assert all(r.get("requests") in (0, None) for r in rows) and len(rows) <= 1, query.name
    assert all(q.description for q in list_queries())


def test_sql_is_read_only_and_cli_formats(run: tuple[Store, str, Path]) -> None:
    store, _, _ = run
    with pytest.raises(RooftraceError, match="read-only"):
        run_sql(store, "CREATE TABLE x AS SELECT 1")
    runner = CliRunner()
    res = runner.invoke(
        main, ["sql", "SELECT count(*) AS n FROM requests", "--store", str(store.root), "--format", "csv"]
    )
    assert res.exit_code == 0 and res.stdout.splitlines() == ['"n"', "400"]
    res = runner.invoke(main, ["query", "latency", "--store", str(store.root), "--format", "json"])
    assert res.exit_code == 0
    assert {r["metric"] for r in json.loads(res.stdout)} >= {"ttft_s", "tpot_s", "e2e_s", "itl_s"}
    res = runner.invoke(main, ["sql", "SELECT count(*) AS n FROM requests", "--store", str(store.root), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == [{"n": 400}]
    res = runner.invoke(main, ["query", "latency", "--store", str(store.root), "--json"])
    assert res.exit_code == 0 and {r["metric"] for r in json.loads(res.stdout)} >= {"ttft_s", "e2e_s"}
    res = runner.invoke(main, ["query", "nope", "--store", str(store.root)])
    assert res.exit_code == 1 and "no named query" in res.stderr
    res = runner.invoke(main, ["query", "--list", "--format", "json"])
    assert {d["name"] for d in json.loads(res.stdout)} >= {"latency", "peak_throughput", "kv_memory", "cost"}


def _digest(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_warehouse_follows_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sql`` and ``query`` read what the store holds now: a warehouse built before the first
    ingest, before a replay, or before the store was moved is rebuilt on read (it used to answer
    0 rows, an empty latency table, or a missing file, with exit code 0); an unchanged store is
    not rewritten; a store the reader cannot write gets a private warehouse and stays as it was."""
    import shutil

    from pipeline.ingest import ingest_logs
    from pipeline.publish import warehouse
    from pipeline.replay.run import ReplayOptions, replay
    from pipeline.synth import SynthConfig, generate, write_logs

    store = Store(tmp_path / "store")
    build_warehouse(store)  # an empty store's warehouse: every view empty
    assert run_sql(store, "SELECT count(*) AS n FROM requests").to_pylist() == [{"n": 0}]
    write_logs(generate(SynthConfig(requests=120, seed=3, duration_s=300)), "openai", tmp_path / "d.jsonl")
    ingest_logs([tmp_path / "d.jsonl"], store)
    assert run_sql(store, "SELECT count(*) AS n FROM requests").to_pylist() == [{"n": 120}]
    assert run_sql(store, "SELECT count(*) AS n FROM replay_requests").to_pylist() == [{"n": 0}]
    first = replay(store).run_id
    assert {r["metric"] for r in q(store, "latency")} >= {"ttft_s", "tpot_s"}
    second = replay(store, options=ReplayOptions(rate_scale=2.0)).run_id
    runs = run_sql(store, "SELECT run_id, count(*) AS n FROM replay_requests GROUP BY run_id ORDER BY run_id")
    assert sorted(r["run_id"] for r in runs.to_pylist()) == sorted([first, second])
    before = _digest(store.root)
    run_sql(store, "SELECT 1")
    assert _digest(store.root) == before  # nothing changed: nothing rebuilt

    moved = Store(tmp_path / "moved")
    shutil.move(store.root, moved.root)  # the views held the old absolute paths
    assert run_sql(moved, "SELECT count(*) AS n FROM replay_requests").to_pylist() == [{"n": 240}]

    # a store this user may not write: the rebuild goes to a private folder, the store is unchanged
    (moved.root / "warehouse.duckdb").unlink()
    real = warehouse.tempfile.mkstemp

    def refuse(*args: Any, **kwargs: Any) -> Any:
        if Path(kwargs.get("dir", "")) == moved.root:
            raise PermissionError(13, "Permission denied")
        return real(*args, **kwargs)

    monkeypatch.setattr(warehouse.tempfile, "mkstemp", refuse)
    before = _digest(moved.root)
    assert run_sql(moved, "SELECT count(*) AS n FROM requests").to_pylist() == [{"n": 120}]
    assert _digest(moved.root) == before and not (moved.root / "warehouse.duckdb").exists()


def test_the_latest_plan_is_the_newest_written_not_the_greatest_id(tmp_path: Path) -> None:
    """Plan ids are DATE-MODEL-DIGEST: ``max(plan_id)`` picked an older plan (a hostile test saw a
    report show a 1-second-window plan beside an overloaded fleet). Named queries now default to
    the plan (and cost subject) written last, of the date and model asked."""
    import os

    from pipeline.publish.warehouse import latest_cost_subject, latest_plan

    store = Store(tmp_path / "s")
    made = {
        "2025-01-15-llama-3.1-8b-ffff000000": 100,  # the greatest id, the oldest file
        "2025-01-15-llama-3.1-8b-0000aaaa00": 300,  # the newest of that date and model
        "2025-01-16-llama-3.1-8b-0000bbbb00": 400,
        "2025-01-15-llama-3.1-70b-0000cccc00": 500,
    }
    for plan_id, t in made.items():
        f = store.root / "plans" / plan_id / "plan.parquet"
        f.parent.mkdir(parents=True)
        f.write_bytes(b"")
        os.utime(f, ns=(t * 10**9, t * 10**9))
    assert latest_plan(store) == "2025-01-15-llama-3.1-70b-0000cccc00"
    assert latest_plan(store, "2025-01-15", "llama-3.1-8b") == "2025-01-15-llama-3.1-8b-0000aaaa00"
    assert latest_plan(store, "2025-01-15") == "2025-01-15-llama-3.1-70b-0000cccc00"
    assert latest_plan(store, model="llama-3.1-8b") == "2025-01-16-llama-3.1-8b-0000bbbb00"
    assert latest_plan(store, "2025-01-17") is None
    for subject, t in (("2025-01-15-default-ffffffffff", 100), ("2025-01-15-llama-3.1-8b-0000aaaa00", 200)):
        f = store.root / "costs" / subject / "gpu_cost.parquet"
        f.parent.mkdir(parents=True)
        f.write_bytes(b"")
        os.utime(f, ns=(t * 10**9, t * 10**9))
    assert latest_cost_subject(store, "gpu_cost") == "2025-01-15-llama-3.1-8b-0000aaaa00"
    assert latest_cost_subject(store, "api_cost") is None


PWNED = "\x1b]0;PWNED\x07"


@pytest.fixture(scope="module")
def hostile_tenant_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """An ingested day (no replay) whose tenant names set the terminal's title and reorder text."""
    from pipeline.ingest import ingest_logs
    from pipeline.synth import SynthConfig, generate, write_logs

    root = tmp_path_factory.mktemp("pwned")
    frame = generate(SynthConfig(requests=60, seed=3, duration_s=300, tenants=2)).with_columns(
        tenant=pl.when(pl.col("tenant") == "tenant-1").then(pl.lit(PWNED)).otherwise(pl.lit("rtl\u202eevil"))
    )
    write_logs(frame, "openai", root / "day.jsonl")
    log = root / "day.jsonl"  # raw controls are not JSON: written as the escapes a JSON log has
    log.write_text(log.read_text().replace("\x1b", "\\u001b").replace("\x07", "\\u0007"))
    store = Store(root / "store")
    summary = ingest_logs([log], store)
    assert summary.ok and summary.total("rows_quarantined") == 0
    return store


def test_sql_table_escapes_control_characters_from_the_data(hostile_tenant_store: Store) -> None:
    store = hostile_tenant_store
    sql = 'SELECT DISTINCT tenant, tenant AS "t\x1b[2J", [tenant] AS nested FROM requests ORDER BY 1'
    res = CliRunner().invoke(main, ["sql", sql, "--store", str(store.root)])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout and "\u202e" not in res.stdout
    assert "\\x1b]0;PWNED\\x07" in res.stdout and "rtl\\u202eevil" in res.stdout and "t\\x1b[2J" in res.stdout
    # data formats keep the data: JSON escapes it, CSV and --out keep every byte
    res = CliRunner().invoke(main, ["sql", "SELECT DISTINCT tenant FROM requests ORDER BY 1", "--store",
                                    str(store.root), "--json"])  # fmt: skip
    assert json.loads(res.stdout) == [{"tenant": PWNED}, {"tenant": "rtl\u202eevil"}] and "\x1b" not in res.stdout


def test_sql_out_dash_is_stdout(hostile_tenant_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = hostile_tenant_store
    res = CliRunner().invoke(main, ["sql", "SELECT 41 + 1 AS n", "--store", str(store.root), "--out", "-",
                                    "--format", "csv"])  # fmt: skip
    assert res.exit_code == 0 and res.stdout.splitlines() == ['"n"', "42"], res.output
    res = CliRunner().invoke(main, ["sql", "SELECT 42 AS n", "--store", str(store.root), "--out", "-"])
    assert res.exit_code == 0 and "│ 42 │" in res.stdout
    res = CliRunner().invoke(main, ["sql", "SELECT 42 AS n", "--store", str(store.root), "--out", "-",
                                    "--format", "parquet"])  # fmt: skip
    assert res.exit_code == 0 and res.stdout_bytes[:4] == b"PAR1" and res.stdout_bytes[-4:] == b"PAR1"
    assert not (tmp_path / "-").exists()
    res = CliRunner().invoke(main, ["sql", "SELECT 42 AS n", "--store", str(store.root), "--format", "parquet"])
    assert res.exit_code == 1 and "needs --out FILE (or --out - " in res.stderr


def test_sql_table_output_is_capped_with_a_note(hostile_tenant_store: Store, tmp_path: Path) -> None:
    from pipeline.publish.warehouse import TABLE_MAX_ROWS

    store = hostile_tenant_store
    n = TABLE_MAX_ROWS + 500
    sql = f"SELECT range AS i FROM range({n})"
    res = CliRunner().invoke(main, ["sql", sql, "--store", str(store.root)])
    assert res.exit_code == 0
    shown = [line for line in res.stdout.splitlines() if line.startswith("│")]
    assert len(shown) == TABLE_MAX_ROWS and f"│ {TABLE_MAX_ROWS - 1} " in shown[-1]
    assert f"showing the first {TABLE_MAX_ROWS:,} of {n:,} rows" in res.stderr and "--format csv" in res.stderr
    res = CliRunner().invoke(main, ["sql", sql, "--store", str(store.root), "--format", "csv"])
    assert len(res.stdout.splitlines()) == n + 1 and "showing" not in res.stderr
    out = tmp_path / "all.txt"
    res = CliRunner().invoke(main, ["sql", sql, "--store", str(store.root), "--out", str(out)])
    assert res.exit_code == 0 and sum(line.startswith("│") for line in out.read_text().splitlines()) == n
