"""A fleet of pools (pipeline/replay/pools.py, FLEET.toml's [[pool]] tables): parsing and its one-line
errors, the rule that sends each request to a pool (against a plain reference), and the pooled
replay, checked against replaying each pool's share of the day on its own fleet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.common.errors import ConfigError
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.replay.fleet import load_fleet
from pipeline.replay.pools import PooledFleet, PoolMatch, load_fleet_file
from pipeline.replay.run import ReplayOptions, replay

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "sample" / "gateway_demo_2025-01-15.jsonl.gz"

BASE = """
name = "split"
model = "llama-3.1-8b"
router = "least_outstanding"
[engine]
max_model_len = 131072
"""


def _fleet(tmp_path: Path, text: str, name: str = "fleet.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _pool(name: str, hardware: str, replicas: int = 1, match: str = "", extra: str = "") -> str:
    rule = f"[pool.match]\n{match}\n" if match else ""
    return f'\n[[pool]]\nname = "{name}"\nhardware = "{hardware}"\nreplicas = {replicas}\n{extra}\n{rule}'


# -- parsing ------------------------------------------------------------------------------------


def test_pooled_file_parses_each_pool_as_a_fleet_on_the_top_level_defaults(tmp_path: Path) -> None:
    text = BASE + _pool("long", "h200", 1, "min_input_tokens = 2048", "[pool.engine]\nblock_size = 32")
    text += _pool("rest", "h100-sxm", 2)
    pooled = load_fleet_file(_fleet(tmp_path, text))
    assert isinstance(pooled, PooledFleet)
    long, rest = pooled.pools
    assert (long.name, long.role, long.config.name, long.config.hardware) == ("long", "unified", "split-long", "h200")
    assert long.config.router == rest.config.router == "least_outstanding"  # inherited
    assert long.config.engine.block_size == 32 and rest.config.engine.block_size == 16
    assert long.config.engine.max_model_len == rest.config.engine.max_model_len == 131072  # merged [engine]
    assert long.match == PoolMatch(min_input_tokens=2048) and rest.match.catch_all
    assert long.match.text() == "input tokens ≥ 2,048" and rest.match.text() == "every other request"
    assert pooled.columns == ("recorded_input_tokens",)


def test_single_pool_file_reads_as_before(tmp_path: Path) -> None:
    path = ROOT / "fleets" / "default.toml"
    assert load_fleet_file(path) == load_fleet(path)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (BASE + _pool("a", "h200", 1) + _pool("b", "h100-sxm"), r"\[\[pool\]\] 'a': needs a \[pool.match\] rule"),
        (
            BASE + _pool("a", "h200", 1, "tenant = ['x']") + _pool("b", "h100-sxm", 1, "tenant = ['y']"),
            r"'b': the last pool takes every request .* leave out its match",
        ),
        (BASE + _pool("a", "h200", 1, "tenant = ['x']") + _pool("a", "h100-sxm"), r"'a': a second pool of that name"),
        (BASE + _pool("a b", "h200"), r"#1: name must be 1-32 letters"),
        (
            BASE + _pool("a", "h200", extra='role = "encode"'),
            r"role 'encode' unknown; choose one of \['unified', 'prefill', 'decode'\]",
        ),
        (BASE + _pool("a", "h200", extra='model = "qwen3-32b"'), r"\['model'\] belong to the whole fleet"),
        (BASE + _pool("a", "h200", 1, "colour = 'x'") + _pool("b", "h200"), r"unknown key\(s\) \['colour'\]"),
        (
            BASE + _pool("a", "h200", 1, "min_input_tokens = 9\nmax_input_tokens = 3") + _pool("b", "h200"),
            r"min_input_tokens 9 is above max_input_tokens 3",
        ),
        (BASE + _pool("a", "h200", 1, "tenant = []") + _pool("b", "h200"), r"tenant must be a non-empty list"),
        (BASE + _pool("a", "h200", 1, "min_input_tokens = -1") + _pool("b", "h200"), r"min_input_tokens must be"),
        (BASE + _pool("a", "nonesuch-gpu"), r"\[\[pool\]\] 'a'.*nonesuch-gpu"),
        (BASE + _pool("a", "h200", 0), r"\[\[pool\]\] 'a': replicas must be >= 1"),
        (BASE.replace('model = "llama-3.1-8b"', "") + _pool("a", "h200"), r"missing key\(s\) \['model'\]"),
        ("pool = 3\n" + BASE, r"pool must be an array of tables"),
        ("pool = []\n" + BASE, r"pool = \[\] holds no pool"),
        (
            BASE + _pool("a", "h200", 2**30, "tenant = ['x']") + _pool("b", "h200", 2**30),
            r"the pools hold 2,147,483,648 engines .* in all, more than the 2,147,483,647",
        ),
        (BASE + "".join(_pool(f"p{i}", "h200", 1, "tenant = ['x']") for i in range(65)), r"65 pools, more than the 64"),
    ],
)
def test_pooled_file_errors_are_one_line_naming_the_pool(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        fleet = load_fleet_file(_fleet(tmp_path, text))
        # a hardware name is checked when the pool is resolved, as a single pool's is
        from pipeline.replay.fleet import resolve

        assert isinstance(fleet, PooledFleet)
        for pool in fleet.pools:
            resolve(pool.config, f"fleet.toml [[pool]] {pool.name!r}")
    assert "\n" not in str(info.value)


def test_commands_of_one_pool_refuse_a_pooled_file_in_one_line(tmp_path: Path) -> None:
    path = _fleet(tmp_path, BASE + _pool("a", "h200", 1, "tenant = ['x']") + _pool("b", "h100-sxm"))
    with pytest.raises(ConfigError, match=r"a fleet of \[\[pool\]\] tables; this command takes a fleet of one pool"):
        load_fleet(path)


# -- routing ------------------------------------------------------------------------------------


def _reference_assign(rules: list[PoolMatch], tenants: list[str | None], prompts: list[int]) -> list[int]:
    """Each request's pool, one request and one rule at a time."""
    out = []
    for tenant, prompt in zip(tenants, prompts, strict=True):
        i = len(rules) - 1
        for i, rule in enumerate(rules):  # noqa: B007 (the pool it stops at)
            ok = rule.tenants is None or (tenant is not None and tenant in rule.tenants)
            ok = ok and (rule.min_input_tokens is None or prompt >= rule.min_input_tokens)
            ok = ok and (rule.max_input_tokens is None or prompt <= rule.max_input_tokens)
            if ok:
                break
        out.append(i)
    return out


_TENANTS = ["t0", "t1", "t2", "t3"]
_rules = st.builds(
    PoolMatch,
    tenants=st.one_of(st.none(), st.lists(st.sampled_from(_TENANTS), min_size=1, max_size=3).map(tuple)),
    min_input_tokens=st.one_of(st.none(), st.integers(0, 5000)),
    max_input_tokens=st.one_of(st.none(), st.integers(0, 5000)),
)


@settings(max_examples=200, deadline=None)
@given(
    rules=st.lists(_rules, min_size=1, max_size=4),
    requests=st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(_TENANTS)), st.integers(0, 6000)), max_size=60),
)
def test_assign_sends_each_request_to_the_first_pool_whose_rule_holds(
    rules: list[PoolMatch], requests: list[tuple[str | None, int]]
) -> None:
    from pipeline.replay.fleet import FleetConfig
    from pipeline.replay.pools import Pool

    cfg = FleetConfig(name="f", model="llama-3.1-8b", hardware="h100-sxm")
    pools = tuple(Pool(f"p{i}", "unified", r, cfg) for i, r in enumerate([*rules, PoolMatch()]))
    pooled = PooledFleet("f", "llama-3.1-8b", pools)
    tenants = [t for t, _ in requests]
    prompts = [p for _, p in requests]
    frame = pl.DataFrame(
        {"tenant": tenants, "recorded_input_tokens": prompts},
        schema={"tenant": pl.String, "recorded_input_tokens": pl.Int64},
    )
    got = pooled.assign(frame).tolist()
    assert got == _reference_assign([*rules, PoolMatch()], tenants, prompts)


# -- the pooled replay --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The bundled gateway demo hour (3,000 requests, 4 tenants, reported cache hits), ingested."""
    store = Store(tmp_path_factory.mktemp("pools") / "store")
    ingest_logs([SAMPLE], store)
    return store


def _copy(day: Store, tmp_path: Path) -> Store:
    shutil.copytree(day.root, tmp_path / "store")
    return Store(tmp_path / "store")


def _requests(run_dir: Path) -> pl.DataFrame:
    return pl.from_arrow(pq.read_table(run_dir / "requests.parquet"))  # type: ignore[return-value]


SHORT = """
[[pool]]
name = "main"
hardware = "h100-sxm"
replicas = 2
"""


def test_an_empty_first_pool_replays_the_last_as_its_single_pool_fleet_would(day: Store, tmp_path: Path) -> None:
    """A pool no request matches changes nothing: the other pool's every result is the single-pool
    fleet's, bit for bit (the pooled run adds the pool column and numbers replicas after the
    empty pool's, here one)."""
    store = _copy(day, tmp_path)
    single = _fleet(tmp_path, 'hardware = "h100-sxm"\nreplicas = 2\n' + BASE, "single.toml")
    pooled = _fleet(tmp_path, BASE + _pool("none", "h200", 1, "tenant = ['nobody']") + SHORT, "pooled.toml")
    a = replay(store, single)
    b = replay(store, pooled)
    assert a.run_id != b.run_id and b.run_id.startswith("2025-01-15-split-")
    ra, rb = _requests(a.run_dir), _requests(b.run_dir)
    assert set(rb.get_column("pool").unique().to_list()) == {"main"}
    assert rb.get_column("replica").drop_nulls().to_list() == (ra.get_column("replica").drop_nulls() + 1).to_list()
    assert rb.drop("pool", "replica").equals(ra.drop("replica"))
    sa = pl.from_arrow(pq.read_table(a.run_dir / "steps.parquet"))
    sb = pl.from_arrow(pq.read_table(b.run_dir / "steps.parquet"))
    assert isinstance(sa, pl.DataFrame) and isinstance(sb, pl.DataFrame)
    assert sb.drop("pool", "replica").equals(sa.drop("replica").with_columns(pl.col("cost_source")))
    for key in ("requests", "finished", "rejected", "output_tokens", "cache_hit_tokens", "ttft_s", "tpot_s", "e2e_s"):
        assert b.summary[key] == a.summary[key], key
    assert b.summary["pools"]["none"]["requests"] == 0
    assert b.summary["pools"]["main"]["requests"] == a.summary["requests"]


def _share(day: Store, tmp_path: Path, tenants: list[str], name: str) -> Store:
    """A store holding only ``tenants``' requests of the day (ingested from a filtered copy of the log)."""
    import gzip

    keep = []
    with gzip.open(SAMPLE, "rt") as fh:
        for line in fh:
            if json.loads(line)["request"]["user"] in tenants:
                keep.append(line)
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(keep))
    store = Store(tmp_path / f"store-{name}")
    ingest_logs([path], store)
    return store


def test_two_pools_on_two_gpus_replay_each_share_as_its_own_fleet_would(day: Store, tmp_path: Path) -> None:
    """Two pools on two GPUs, split by tenant: every request's latencies are those of a replay of
    its pool's share of the day alone on the pool's fleet (the two clocks start at different
    first arrivals: equal to rounding)."""
    store = _copy(day, tmp_path)
    text = BASE + _pool("gold", "h200", 1, "tenant = ['tenant-1', 'tenant-2']") + SHORT
    run = replay(store, _fleet(tmp_path, text))
    got = _requests(run.run_dir)
    assert got.height == 3000 and got.get_column("request_id").is_unique().all()
    by_pool = dict(got.group_by("pool").len().iter_rows())
    assert by_pool["gold"] + by_pool["main"] == 3000 and by_pool["gold"] > 0 and by_pool["main"] > 0
    # replicas: gold's one first, then main's two
    assert set(got.filter(pl.col("pool") == "gold").get_column("replica").drop_nulls().to_list()) <= {0}
    assert set(got.filter(pl.col("pool") == "main").get_column("replica").drop_nulls().to_list()) <= {1, 2}
    config = json.loads((run.run_dir / "config.json").read_text())
    assert [p["pool"] for p in config["resolved"]["pools"]] == ["gold", "main"]
    assert config["resolved"]["gpus"] == 3
    checks = {
        "gold": (["tenant-1", "tenant-2"], 'hardware = "h200"\nreplicas = 1\n' + BASE),
        "main": (["tenant-0", "tenant-3"], 'hardware = "h100-sxm"\nreplicas = 2\n' + BASE),
    }
    for pool, (tenants, single) in checks.items():
        alone = _share(day, tmp_path, tenants, pool)
        ref = replay(alone, _fleet(tmp_path, single, f"{pool}.toml"))
        want = _requests(ref.run_dir).sort("request_id")
        mine = got.filter(pl.col("pool") == pool).sort("request_id")
        assert mine.get_column("request_id").to_list() == want.get_column("request_id").to_list()
        for col in ("recorded_input_tokens", "output_tokens", "cache_hit_tokens", "prefill_tokens", "status"):
            assert mine.get_column(col).to_list() == want.get_column(col).to_list(), (pool, col)
        for col in ("queue_s", "ttft_s", "tpot_s", "e2e_s"):
            np.testing.assert_allclose(
                mine.get_column(col).to_numpy(), want.get_column(col).to_numpy(), rtol=1e-9, atol=1e-9, err_msg=col
            )
        assert run.summary["pools"][pool]["requests"] == ref.summary["requests"]
    # steps and series carry the pool; the fleet's busy time is the pools' sum
    steps = pl.from_arrow(pq.read_table(run.run_dir / "steps.parquet"))
    series = pl.from_arrow(pq.read_table(run.run_dir / "series.parquet"))
    assert isinstance(steps, pl.DataFrame) and isinstance(series, pl.DataFrame)
    assert (
        set(steps.get_column("pool").unique().to_list())
        == set(series.get_column("pool").unique().to_list())
        == {
            "gold",
            "main",
        }
    )
    # re-running writes the same run with the same bytes
    before = {p.name: p.read_bytes() for p in run.run_dir.iterdir()}
    again = replay(store, _fleet(tmp_path, text))
    assert again.run_id == run.run_id
    assert {p.name: p.read_bytes() for p in again.run_dir.iterdir()} == before


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (ReplayOptions(replicas=3), r"--replicas: .* set replicas in each \[\[pool\]\] table"),
        (ReplayOptions(concurrency=4), r"closed loop \(--concurrency\) over a fleet of pools is not modelled"),
    ],
)
def test_pooled_replay_refuses_what_it_does_not_model(
    day: Store, tmp_path: Path, options: ReplayOptions, says: str
) -> None:
    path = _fleet(tmp_path, BASE + _pool("gold", "h200", 1, "tenant = ['tenant-1']") + SHORT)
    with pytest.raises(ConfigError, match=says):
        replay(day, path, options)
    assert not (day.root / "runs").exists() or not any((day.root / "runs").iterdir())


# -- the seam between pools ---------------------------------------------------------------------


def test_hand_off_moves_finished_prefills_with_their_kv_over_the_link() -> None:
    from pipeline.engine.model import EngineResult, Workload
    from pipeline.replay.pools import Link, hand_off

    source = Workload(
        arrival_s=np.array([0.0, 0.1, 0.2, 0.3]),
        prompt_tokens=np.array([1000, 200, 50, 4000]),
        output_tokens=np.array([5, 1, 7, 3]),
    )
    res = EngineResult.empty(4)
    res.first_token_s[:] = [0.5, 0.2, np.nan, 0.4]
    res.scheduled_s[:] = [0.0, 0.1, np.nan, 0.3]
    res.reject_reason[:] = [0, 0, 1, 0]  # request 2 rejected
    link = Link(bytes_per_s=1e9, latency_s=0.001)
    moved = hand_off(source, res, kv_bytes_per_token=131072.0, link=link)
    # request 0: 0.5 + 0.001 + 1000 × 131072 / 1e9 = 0.632072; request 1: 0.2 + 0.001 + 0.0262144 = 0.2272144;
    # request 3: 0.4 + 0.001 + 0.524288 = 0.925288. A one-token output moves too: the decode pool
    # samples the client's first token (vLLM's decode instance behind its proxy)
    assert moved.rows.tolist() == [1, 0, 3]
    np.testing.assert_allclose(moved.work.arrival_s, [0.2272144, 0.632072, 0.925288], rtol=0, atol=1e-12)
    np.testing.assert_allclose(moved.transfer_s, [0.0272144, 0.132072, 0.525288], rtol=0, atol=1e-12)
    assert moved.work.output_tokens.tolist() == [1, 5, 3]
    assert moved.work.prompt_tokens.tolist() == moved.work.reported_hit_tokens.tolist() == [200, 1000, 4000]
    with pytest.raises(ConfigError, match="bandwidth"):
        Link(bytes_per_s=0.0)
    with pytest.raises(ConfigError, match="latency"):
        Link(bytes_per_s=1.0, latency_s=float("nan"))


def test_a_handed_off_request_prefills_only_its_last_token_in_the_next_pool() -> None:
    """The destination pool takes the moved KV as computed: the engine computes one prompt token
    (for its logits: the first token) and decodes the rest of the output."""
    from pipeline.engine.model import EngineResult, Workload
    from pipeline.replay.fleet import resolve
    from pipeline.replay.pools import Link, hand_off
    from pipeline.replay.run import run_workload

    fleet = resolve(load_fleet(ROOT / "fleets" / "default.toml"))
    source = Workload(
        arrival_s=np.array([0.0, 0.0]), prompt_tokens=np.array([3000, 700]), output_tokens=np.array([40, 9])
    )
    res = EngineResult.empty(2)
    res.first_token_s[:] = [0.3, 0.1]
    res.scheduled_s[:] = [0.0, 0.0]
    moved = hand_off(source, res, kv_bytes_per_token=131072.0, link=Link(5e10, 1e-5))
    run = run_workload(moved.work, fleet, ReplayOptions())
    out = run.result
    assert (out.reject_reason == 0).all()
    assert out.prefill_tokens.tolist() == [1, 1]
    assert (out.first_token_s >= moved.work.arrival_s).all()


def test_a_fleet_of_pools_is_priced_pool_by_pool(day: Store, tmp_path: Path) -> None:
    """Each pool's GPUs at its own price over the run's period, its busy time from its own steps,
    its tokens from its own requests; the fleet's figures are the pools' sums."""
    from pipeline.catalog import load_hardware
    from pipeline.economics.cost import PooledGpuCost, run_cost

    store = _copy(day, tmp_path)
    run = replay(store, _fleet(tmp_path, BASE + _pool("gold", "h200", 1, "tenant = ['tenant-1']") + SHORT))
    cost = run_cost(store, run.run_id)
    gpu = cost.gpu
    assert isinstance(gpu, PooledGpuCost)
    req = _requests(run.run_dir)
    steps = pl.from_arrow(pq.read_table(run.run_dir / "steps.parquet"))
    assert isinstance(steps, pl.DataFrame)
    window = gpu.window_s
    for (name, part), hw, gpus in zip(gpu.pools, ("h200", "h100-sxm"), (1, 2), strict=True):
        price = load_hardware(hw).price_usd_per_gpu_hour
        assert (part.gpus, part.usd_per_gpu_hour) == (gpus, price)
        assert part.total_usd == pytest.approx(gpus * price * window / 3600, rel=1e-12)
        mine = steps.filter(pl.col("pool") == name)
        assert part.busy_gpu_s == pytest.approx(float((mine["end_s"] - mine["start_s"]).sum()), rel=1e-9)
        done = req.filter((pl.col("pool") == name) & (pl.col("status") == "finished"))
        assert part.tokens.output == float(done["output_tokens"].sum())
        assert part.tokens.fresh_input == float(done["fresh_input_tokens"].sum())
    assert gpu.total_usd == pytest.approx(sum(p.total_usd for _, p in gpu.pools), rel=1e-12)
    rows = {r["token_class"]: r for r in gpu.rows()}
    # the idle row is the idle dollars the token classes' all-in figures already spread
    assert rows["idle"]["all_in_usd"] == pytest.approx(gpu.idle_usd, rel=1e-9)
    classes = [r for k, r in rows.items() if k != "idle"]
    assert sum(r["all_in_usd"] for r in classes) == pytest.approx(gpu.total_usd, rel=1e-9)
    assert sum(r["busy_usd"] for r in rows.values()) == pytest.approx(gpu.busy_usd, rel=1e-9)
    assert rows["output"]["tokens"] == float(req.filter(pl.col("status") == "finished")["output_tokens"].sum())
    doc = json.loads((cost.out_dir / "cost.json").read_text())
    assert [p["pool"] for p in doc["pools"]] == ["gold", "main"] and doc["gpus"] == 3
    written = pl.from_arrow(pq.read_table(cost.out_dir / "gpu_cost.parquet"))
    assert isinstance(written, pl.DataFrame)
    assert sorted(written["subject"].unique().to_list()) == [f"{run.run_id}/gold", f"{run.run_id}/main"]


def test_the_report_and_queries_of_a_fleet_of_pools_show_each_pool(day: Store, tmp_path: Path) -> None:
    """The report names the pools and sums their GPUs and $/day; query cost gives a row per pool
    and kv_memory judges each replica against its own pool's KV capacity."""
    from pipeline.publish.report import build_report
    from pipeline.publish.warehouse import run_query

    store = _copy(day, tmp_path)
    run = replay(store, _fleet(tmp_path, BASE + _pool("gold", "h200", 1, "tenant = ['tenant-1']") + SHORT))
    out = tmp_path / "r" / "index.html"
    build_report(store, run.run_id, out=out)
    text = out.read_text()
    assert "llama-3.1-8b on 2 pools (pool gold: 1 replica, each on 1× h200 (1 GPU); pool main: 2 replicas" in text
    headline = json.loads((out.parent / "headline.json").read_text())
    assert headline["gpus"] == 3 and headline["hardware"] == "1× h200 + 2× h100-sxm"
    cost = run_query(store, "cost", {"run_id": run.run_id}).to_pylist()
    kv = run_query(store, "kv_memory", {"run_id": run.run_id}).to_pylist()
    by_pool = {r["pool"]: r for r in cost}
    assert set(by_pool) == {"gold", "main"} and (by_pool["gold"]["gpus"], by_pool["main"]["gpus"]) == (1, 2)
    assert headline["usd_per_day"] == pytest.approx(by_pool["gold"]["usd_per_day"] + by_pool["main"]["usd_per_day"])
    config = json.loads((run.run_dir / "config.json").read_text())
    capacity = {p["pool"]: p["memory"]["kv_capacity_blocks"] for p in config["resolved"]["pools"]}
    rows = {r["replica"]: r for r in kv}
    assert rows["0"]["capacity_blocks"] == capacity["gold"] and rows["1"]["capacity_blocks"] == capacity["main"]
    assert {"pool gold", "pool main", "fleet"} <= set(rows)


def test_a_pool_that_rejects_requests_writes_them_as_a_single_pool_would(day: Store, tmp_path: Path) -> None:
    """One pool refuses the requests longer than its max_model_len, the other refuses none: the run
    holds both pools' rows, the rejected ones with their reason, and the pools' counts add up."""
    store = _copy(day, tmp_path)
    small = _pool("gold", "h200", 1, "tenant = ['tenant-1', 'tenant-2']", "[pool.engine]\nmax_model_len = 4096")
    run = replay(store, _fleet(tmp_path, BASE + small + SHORT))
    got = _requests(run.run_dir)
    gold = got.filter(pl.col("pool") == "gold")
    rejected = gold.filter(pl.col("status") == "rejected")
    assert rejected.height > 0 and got.filter((pl.col("pool") == "main") & (pl.col("status") == "rejected")).height == 0
    assert set(rejected.get_column("reject_reason").to_list()) == {"exceeds_max_model_len"}
    assert (rejected.get_column("recorded_input_tokens") + rejected.get_column("output_tokens") > 4096).all()
    pools = run.summary["pools"]
    assert pools["gold"]["rejected"] == rejected.height == run.summary["rejected"]
    assert pools["gold"]["requests"] + pools["main"]["requests"] == run.summary["requests"] == 3000


def test_the_load_curve_of_a_fleet_of_pools_replays_every_pool(day: Store, tmp_path: Path) -> None:
    """Headroom on a fleet of pools: at 1× a point counts the pooled replay's requests, finished and
    rejected, and its p99 TTFT is the pooled run's (all pools' finished requests together)."""
    from pipeline.classify.accounting import day_identity
    from pipeline.replay.loadcurve import curve_point

    store = _copy(day, tmp_path)
    small = _pool("gold", "h200", 1, "tenant = ['tenant-1', 'tenant-2']", "[pool.engine]\nmax_model_len = 4096")
    path = _fleet(tmp_path, BASE + small + SHORT)
    run = replay(store, path)
    pooled = load_fleet_file(path)
    assert isinstance(pooled, PooledFleet)
    requests = store.read_requests("2025-01-15")
    point = curve_point(requests, pooled, 1.0, "chat", day_identity(store, "2025-01-15", requests))
    assert (point["requests"], point["finished"], point["rejected"]) == (
        run.summary["requests"],
        run.summary["finished"],
        run.summary["rejected"],
    )
    assert point["ttft_p99_s"] == pytest.approx(run.summary["ttft_s"]["p99"], rel=1e-9)
    assert point["slo_passed"] is False  # rejected requests fail the SLO
