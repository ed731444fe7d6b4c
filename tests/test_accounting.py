"""Token accounting (pipeline.classify.accounting) and the ``rooftrace classify`` command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import SHARED
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.classify import prefix as P
from pipeline.classify.accounting import (
    Capacity,
    ClassifyOptions,
    account,
    accounting_paths,
    classify_tokens,
    parse_capacity,
)
from pipeline.cli import main
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import read_parquet, write_parquet
from pipeline.ingest.store import Store

MOONCAKE_CONV = SHARED / "traces" / "mooncake-fast25" / "conversation_trace.jsonl"
DAY = "2024-05-01"
T0 = 1_714_521_600_000_000  # 2024-05-01T00:00:00Z in µs


def requests_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """A canonical requests frame (schemas/requests.toml) from partial rows."""
    base: dict[str, Any] = {
        "model": "m",
        "output_tokens": 1,
        "source_format": "jsonl",
        "source_file": "test.jsonl",
        "tenant": None,
        "session_id": None,
        "adapter": None,
        "reported_cache_hit_tokens": None,
        "cache_write_tokens": None,
        "reasoning_tokens": None,
        "prefix_block_hashes": None,
        "prefix_block_size": None,
        "ttft_s": None,
        "e2e_s": None,
        "status": None,
    }
    full = [
        {**base, "request_id": f"r{i}", "source_line": i + 1, **row, "arrival": T0 + int(row["t"] * 1e6)}
        for i, row in enumerate(rows)
    ]
    for row in full:
        del row["t"]
    schema = {
        "request_id": pl.String,
        "arrival": pl.Datetime("us", "UTC"),
        "model": pl.String,
        "recorded_input_tokens": pl.Int64,
        "output_tokens": pl.Int64,
        "source_format": pl.String,
        "source_file": pl.String,
        "source_line": pl.Int64,
        "tenant": pl.String,
        "session_id": pl.String,
        "adapter": pl.String,
        "reported_cache_hit_tokens": pl.Int64,
        "cache_write_tokens": pl.Int64,
        "reasoning_tokens": pl.Int64,
        "prefix_block_hashes": pl.List(pl.UInt64),
        "prefix_block_size": pl.Int32,
        "ttft_s": pl.Float64,
        "e2e_s": pl.Float64,
        "status": pl.String,
    }
    return pl.DataFrame(full, schema=schema)


def make_store(tmp_path: Path, frame: pl.DataFrame) -> Store:
    store = Store(tmp_path / "store")
    write_parquet(frame.to_arrow(), store.requests_dir / f"date={DAY}" / "part-0.parquet", "requests")
    return store


# --------------------------------------------------------------------------------------------
# a hand-computed day: 4-token blocks, two minutes, two tenants


def hand_rows() -> list[dict[str, Any]]:
    return [
        # r0: 10 tokens = blocks 4+4+2; nothing cached yet
        {"t": 10, "tenant": "a", "recorded_input_tokens": 10, "output_tokens": 3,
         "prefix_block_hashes": [1, 2, 3], "prefix_block_size": 4},
        # r1: 40 tokens, 10 full blocks; shares blocks [1, 2] with r0 -> 8 hit tokens
        {"t": 50, "tenant": "a", "recorded_input_tokens": 40, "output_tokens": 5,
         "prefix_block_hashes": [1, 2, 9, 10, 11, 12, 13, 14, 15, 16], "prefix_block_size": 4},
        # r2: tenant b, same prompt as r1: no simulated hit; the provider reported 6
        {"t": 65, "tenant": "b", "recorded_input_tokens": 12, "output_tokens": 2,
         "prefix_block_hashes": [1, 2, 9], "prefix_block_size": 4, "reported_cache_hit_tokens": 6},
        # r3: no prefix identity at all
        {"t": 90, "tenant": "a", "recorded_input_tokens": 12, "output_tokens": 4},
    ]  # fmt: skip


def test_hand_computed_requests_table() -> None:
    acc = account(requests_frame(hand_rows()))
    cols = ["cache_hit_tokens", "cache_hit_source", "simulated_cache_hit_tokens", "fresh_input_tokens"]
    assert acc.requests.select(cols).rows() == [
        (0, "simulated", 0, 10),
        (8, "simulated", 8, 32),
        (6, "reported", 0, 6),
        (0, "none", None, 12),
    ]
    assert acc.requests["prefix_source"].to_list() == ["log", "log", "log", "none"]
    assert acc.requests["prefix_blocks"].to_list() == [3, 10, 3, 3]
    assert acc.summary["reported_vs_simulated"] == {
        "requests": 1,
        "reported_cache_hit_tokens": 6,
        "simulated_cache_hit_tokens": 0,
    }
    assert acc.summary["block_size_tokens"] == 4


def test_hand_computed_minutes() -> None:
    m = account(requests_frame(hand_rows())).minutes
    key = ["scope", "model", "tenant", "requests", "recorded_input_tokens", "cache_hit_tokens",
           "fresh_input_tokens", "output_tokens"]  # fmt: skip
    minute = m["minute"].dt.epoch("us").to_list()
    assert set(minute) == {T0, T0 + 60_000_000}
    all_rows = m.filter(pl.col("scope") == "all").sort("minute")
    assert all_rows.select(key[3:]).rows() == [(2, 50, 8, 42, 8), (2, 24, 6, 18, 6)]
    assert all_rows["fresh_input_tokens_per_s"].to_list() == [42 / 60, 18 / 60]
    assert all_rows["inflation_ratio"].to_list() == [50 / 42, 24 / 18]
    tenants = m.filter(pl.col("scope") == "tenant").sort(["minute", "tenant"])
    assert tenants.select("tenant", "recorded_input_tokens", "cache_hit_tokens").rows() == [
        ("a", 50, 8),
        ("a", 12, 0),
        ("b", 12, 6),
    ]
    assert m.filter(pl.col("scope") == "model_tenant").height == 3
    assert m.filter(pl.col("scope") == "model")["model"].to_list() == ["m", "m"]
    assert m.height == 2 + 2 + 3 + 3


def test_hand_computed_capacity_curve() -> None:
    curve = account(requests_frame(hand_rows())).curve
    # Before r1 the cache holds r0's two full blocks, block 1 most recent (touched tail first):
    # r1's block 0 is at stack distance 1, block 1 at distance 2.
    got = curve.select("capacity_blocks", "hit_blocks", "cache_hit_tokens", "peak_fresh_input_tokens_per_s").rows()
    assert got == [(0, 0, 0, 50 / 60), (1, 1, 4, 46 / 60), (2, 2, 8, 42 / 60), (None, 2, 8, 42 / 60)]
    unbounded = curve.row(-1, named=True)
    assert unbounded["prompt_blocks"] == 19
    assert unbounded["block_hit_fraction"] == 2 / 19
    assert unbounded["token_hit_fraction"] == 8 / 74
    assert unbounded["peak_minute"].timestamp() * 1e6 == T0
    assert curve["capacity_tokens"].to_list()[:3] == [0, 4, 8]


def test_reported_hits_out_of_range_are_an_error() -> None:
    rows = [{"t": 0, "recorded_input_tokens": 10, "reported_cache_hit_tokens": 11}]
    with pytest.raises(RooftraceError, match="request 'r0' reports reported_cache_hit_tokens=11"):
        account(requests_frame(rows))


def test_tenants_never_share_and_ttl_expires() -> None:
    chain = {"recorded_input_tokens": 2048, "prefix_block_hashes": [5, 6, 7, 8], "prefix_block_size": 512}
    rows = [
        {"t": 0, "tenant": "a", **chain},
        {"t": 100, "tenant": "b", **chain},  # identical prompt, other tenant
        {"t": 200, "tenant": "a", **chain},  # 200 s after a's last use
        {"t": 601, "tenant": "a", **chain},  # 401 s after: expired with a 300 s TTL
        {"t": 700, "tenant": "b", **chain},  # 600 s after b's last use: expired
    ]
    frame = requests_frame(rows)
    no_ttl = account(frame).requests["simulated_cache_hit_tokens"].to_list()
    assert no_ttl == [0, 0, 1536, 1536, 1536]  # (2048 - 1) // 512 = 3 blocks can hit
    ttl = account(frame, ClassifyOptions(ttl_s=300)).requests["simulated_cache_hit_tokens"].to_list()
    assert ttl == [0, 0, 1536, 0, 0]
    shared = account(frame, ClassifyOptions(isolation=("model",)))
    assert shared.requests["simulated_cache_hit_tokens"].to_list() == [0, 1536, 1536, 1536, 1536]


# --------------------------------------------------------------------------------------------
# capacity parsing and bytes -> blocks


def test_parse_capacity() -> None:
    assert parse_capacity("2M") == Capacity(tokens=2_000_000)
    assert parse_capacity("12") == Capacity(tokens=12)
    assert parse_capacity("40GB") == Capacity(bytes=40 * 10**9)
    assert parse_capacity("1.5GiB") == Capacity(bytes=3 * 2**29)
    assert parse_capacity(None).unbounded and parse_capacity("unbounded").unbounded
    for bad in ("abc", "5XB", "-3M"):
        with pytest.raises(RooftraceError, match="capacity"):
            parse_capacity(bad)


def test_capacity_in_bytes_uses_kv_bytes_per_token(tmp_path: Path) -> None:
    rows = [{"t": i, "recorded_input_tokens": 5000, "output_tokens": 10} for i in range(3)]
    store = make_store(tmp_path, requests_frame(rows))
    # Llama-3.1-70B (Hugging Face config.json: 80 layers, 8 KV heads, head_dim 128), bf16 KV:
    # 2 (K and V) * 80 * 8 * 128 * 2 bytes = 327,680 bytes per token.
    out = classify_tokens(store, capacity="40GB", kv_model="llama-3.1-70b")
    assert out.totals["capacity_blocks"] == {"m": 40 * 10**9 // (327_680 * 512)}
    out = classify_tokens(store, capacity="40GB", kv_bytes_per_token=1e6)
    assert out.totals["capacity_blocks"] == {"m": 40 * 10**9 // (10**6 * 512)}
    curve = read_parquet(accounting_paths(store, DAY)["cache_curve"], "cache_curve")
    chosen = [r for r in curve.to_pylist() if r["capacity_blocks"] == 78]
    assert chosen and chosen[0]["capacity_bytes"] == 78 * 512 * 10**6
    with pytest.raises(RooftraceError, match="KV bytes per token of model 'm' unknown"):
        classify_tokens(store, capacity="40GB")
    assert classify_tokens(store, capacity="2M").totals["capacity_blocks"] == {"m": 2_000_000 // 512}


# --------------------------------------------------------------------------------------------
# the Mooncake conversation trace (must-show)


def mooncake_rows() -> list[dict[str, Any]]:
    if not MOONCAKE_CONV.exists():
        pytest.skip(f"{MOONCAKE_CONV} not present (the shared data folder is not checked out here)")
    with MOONCAKE_CONV.open() as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def mooncake_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    mooncake_rows()
    from pipeline.ingest import ingest_logs

    store = Store(tmp_path_factory.mktemp("mooncake") / "store")
    summary = ingest_logs([MOONCAKE_CONV], store, fmt="mooncake", date=DAY)
    assert summary.ok and summary.total("rows_stored") == 12_031
    return store


def _classified_copy(store: Store, tmp_path: Path) -> Store:
    """A copy of the module's ingested store for a test that classifies (writes accounting/): the
    module's store stays as ingested, whatever ran before."""
    return Store(shutil.copytree(store.root, tmp_path / "store", symlinks=True))


def test_mooncake_unbounded_hits_match_an_independent_walk(mooncake_store: Store, tmp_path: Path) -> None:
    mooncake_store = _classified_copy(mooncake_store, tmp_path)
    rows = mooncake_rows()
    # The SOURCE.md figure: leading-prefix blocks seen before / all blocks, any block counted.
    seen: set[int] = set()
    raw_hits = raw_blocks = raw_tokens = raw_hit_tokens = 0
    for r in rows:
        n, ids = r["input_length"], r["hash_ids"]
        lead = True
        for j, h in enumerate(ids):
            lead = lead and h in seen
            raw_hits += lead
            raw_hit_tokens += min(512, n - 512 * j) if lead else 0
        seen.update(ids)
        raw_blocks += len(ids)
        raw_tokens += n
    assert round(raw_hits / raw_blocks, 3) == 0.366
    assert round(raw_hit_tokens / raw_tokens, 3) == 0.374  # the third-party 37.4 % ceiling

    # rooftrace's semantics, counted independently: only full blocks are cached, and at most
    # (n - 1) // 512 leading blocks can hit (vLLM recomputes the last prompt token).
    cached: set[int] = set()
    hits = 0
    for r in rows:
        n, ids = r["input_length"], r["hash_ids"]
        for h in ids[: (n - 1) // 512]:
            if h not in cached:
                break
            hits += 1
        cached.update(ids[: n // 512])

    out = classify_tokens(mooncake_store)
    sim = out.totals["simulated"]
    assert sim["block_hit_fraction"] == hits / raw_blocks
    assert sim["token_hit_fraction"] == hits * 512 / raw_tokens
    assert round(sim["token_hit_fraction"], 4) == 0.3734  # the figure docs/accounting.md reports
    curve = read_parquet(accounting_paths(mooncake_store, DAY)["cache_curve"], "cache_curve").to_pylist()
    unbounded = curve[-1]
    assert unbounded["capacity_blocks"] is None and unbounded["hit_blocks"] == hits
    assert unbounded["prompt_blocks"] == raw_blocks and unbounded["recorded_input_tokens"] == raw_tokens


def test_mooncake_bounded_curve_equals_explicit_lru(mooncake_store: Store) -> None:
    rows = mooncake_rows()
    frame = mooncake_store.read_requests(DAY)
    acc = account(frame, ClassifyOptions(capacity=Capacity(tokens=3000 * 512)))
    curve = acc.curve.to_dicts()
    hits_at = {r["capacity_blocks"]: r["hit_blocks"] for r in curve}
    assert 3000 in hits_at
    totals = [r["hit_blocks"] for r in curve]
    assert totals == sorted(totals)  # monotone in capacity
    # the trace is in arrival order, ties in file order, as the store sorts (arrival, request_id)
    order = frame.select("source_line").to_series().to_numpy() - 1
    grid = [*[c for c in hits_at if c is not None and 0 < c < 20000][::9], 3000]
    for cap in grid:
        lru = P.LRUPrefixCache(cap)
        per_request = []
        for i in order:
            r = rows[i]
            n, ids = r["input_length"], r["hash_ids"]
            per_request.append(lru.access(ids[: n // 512], r["timestamp"] / 1e3, max_hits=(n - 1) // 512))
        assert sum(per_request) == hits_at[cap], cap
        if cap == 3000:
            assert acc.requests["simulated_hit_blocks"].to_list() == per_request


def test_mooncake_peak_fresh_rate_is_reproducible_in_sql(mooncake_store: Store, tmp_path: Path) -> None:
    mooncake_store = _classified_copy(mooncake_store, tmp_path)
    out = classify_tokens(mooncake_store)
    paths = accounting_paths(mooncake_store, DAY)
    peak = (
        duckdb.connect()
        .execute(
            f"""
        SELECT date_trunc('minute', arrival) AS minute, sum(fresh_input_tokens) / 60.0 AS rate
        FROM read_parquet('{paths["requests"]}') GROUP BY 1 ORDER BY rate DESC, minute LIMIT 1
        """
        )
        .fetchone()
    )
    assert peak is not None
    assert out.totals["peak_minute"]["fresh_input_tokens_per_s"] == pytest.approx(peak[1], rel=1e-12)
    curve = pl.read_parquet(paths["cache_curve"])
    assert curve.filter(pl.col("capacity_blocks").is_null())["peak_fresh_input_tokens_per_s"][0] == pytest.approx(
        peak[1], rel=1e-12
    )


# --------------------------------------------------------------------------------------------
# invariants on random days


@st.composite
def random_days(draw: st.DrawFn) -> list[dict[str, Any]]:
    rows = []
    for _ in range(draw(st.integers(1, 30))):
        n = draw(st.integers(0, 3000))
        row: dict[str, Any] = {
            "t": draw(st.floats(0, 600)),
            "recorded_input_tokens": n,
            "output_tokens": draw(st.integers(0, 900)),
            "tenant": draw(st.sampled_from(["a", "b", None])),
            "model": draw(st.sampled_from(["m1", "m2"])),
        }
        kind = draw(st.sampled_from(["log", "session", "none", "reported"]))
        if kind == "log":
            k = -(-n // 256)
            row["prefix_block_hashes"] = [draw(st.integers(0, 3)) for _ in range(k)]
            row["prefix_block_size"] = 256
        elif kind == "session":
            row["session_id"] = draw(st.sampled_from(["s1", "s2"]))
        elif kind == "reported":
            row["reported_cache_hit_tokens"] = draw(st.integers(0, n))
        rows.append(row)
    return rows


@settings(max_examples=40, deadline=None)
@given(random_days(), st.sampled_from([None, "0", "1K", "6K"]), st.sampled_from([None, 60.0]))
def test_accounting_invariants(rows: list[dict[str, Any]], cap: str | None, ttl: float | None) -> None:
    acc = account(requests_frame(rows), ClassifyOptions(block_size=256, capacity=parse_capacity(cap), ttl_s=ttl))
    r = acc.requests
    assert (r["fresh_input_tokens"] == r["recorded_input_tokens"] - r["cache_hit_tokens"]).all()
    assert (r["fresh_input_tokens"] >= 0).all()
    sim = r.filter(pl.col("simulated_cache_hit_tokens").is_not_null())
    assert (sim["simulated_cache_hit_tokens"] <= sim["recorded_input_tokens"]).all()
    for scope in ("all", "model", "tenant", "model_tenant"):
        part = acc.minutes.filter(pl.col("scope") == scope)
        assert part["recorded_input_tokens"].sum() == r["recorded_input_tokens"].sum()
        assert part["fresh_input_tokens"].sum() == r["fresh_input_tokens"].sum()
    for model, group in acc.curve.group_by("model"):
        hits = group.filter(pl.col("capacity_blocks").is_not_null()).sort("capacity_blocks")["hit_blocks"]
        assert hits.is_sorted(), model
        unbounded = group.filter(pl.col("capacity_blocks").is_null())["hit_blocks"][0]
        assert hits[-1] == unbounded


# --------------------------------------------------------------------------------------------
# the store and the command


def test_classify_writes_schemas_and_is_idempotent(tmp_path: Path) -> None:
    store = make_store(tmp_path, requests_frame(hand_rows()))
    out = classify_tokens(store)
    paths = accounting_paths(store, DAY)
    first = {k: Path(p).read_bytes() for k, p in out.paths.items()}
    for name, schema in (("requests", "accounting_requests"), ("minutes", "accounting_minutes"),
                         ("cache_curve", "cache_curve")):  # fmt: skip
        read_parquet(paths[name], schema)
    summary = json.loads(paths["summary"].read_text())
    assert summary["options"]["capacity"] == "unbounded" and summary["totals"]["requests"] == 4
    classify_tokens(store)
    assert {k: Path(p).read_bytes() for k, p in out.paths.items()} == first


def test_cli_classify(tmp_path: Path) -> None:
    store = make_store(tmp_path, requests_frame(hand_rows()))
    runner = CliRunner()
    res = runner.invoke(main, ["classify", "--store", str(store.root), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["date"] == DAY and doc["totals"]["cache_hit_tokens"] == 14
    res = runner.invoke(main, ["classify", "--store", str(store.root), "--capacity", "4", "--ttl", "60"])
    assert res.exit_code == 0, res.output
    assert "recorded input 74 = cache hit 10 + fresh 64 tokens" in res.stdout
    assert "reported vs simulated on 1 requests: 6 vs 0 tokens" in res.stdout
    res = runner.invoke(main, ["classify", "--store", str(tmp_path / "empty")])
    assert res.exit_code == 1 and "no requests ingested yet" in res.stderr
    res = runner.invoke(main, ["classify", "--store", str(store.root), "--capacity", "9 parsecs"])
    assert res.exit_code == 1 and "capacity" in res.stderr
    res = runner.invoke(main, ["classify", "--block-size", "0"])
    assert res.exit_code == 2
