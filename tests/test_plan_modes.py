"""``plan --modes``: colocated, disaggregated (xPyD splits over a link), speculative and a KV
offload tier searched with one cost model; the frontier per mode and why the others lost, on small generated days."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from cli_checks import cli, one_error
from hypothesis import given
from hypothesis import strategies as st

from pipeline.common.errors import ConfigError
from pipeline.common.schemas import read_parquet
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.plan import PlanOptions, plan
from pipeline.plan.modes import parse_offload_gb, parse_ratios, parse_speculative
from pipeline.plan.search import disaggregated_seed, ratio_split
from pipeline.replay.fleet import parse_fleet, resolve
from pipeline.replay.pools import link_of_kind, parse_pooled
from pipeline.replay.run import ReplayOptions, replay_pools, replay_prefill_decode

DAY = "2025-01-15"
#: Llama-3.1-8B in bf16 at tp 1 stores 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072
#: bytes of KV per token (docs/pools.md); the rdma link kind is 50 GB/s and 50 µs (links.toml).
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
RDMA_BYTES_PER_S, RDMA_LATENCY_S = 50e9, 50e-6


def write_day(path: Path, kind: str, n: int, rate: float, seed: int = 0) -> list[dict[str, object]]:
    """A Mooncake-format day (the log's own 512-token block hashes): ``agent`` requests re-send
    one of four 4,096-token agent prompts plus 2,000-6,000 tokens of their own and answer in
    8-40 tokens (prefill-heavy); ``chat`` requests send 100-400 tokens and answer in 300-700
    (decode-heavy). Poisson arrivals at ``rate`` per second."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n)) * 1000.0
    rows: list[dict[str, object]] = []
    nid = 10_000
    for i in range(n):
        if kind == "agent":
            shared = [int(rng.integers(0, 4)) * 100 + j for j in range(8)]
            inp, out = 4096 + int(rng.integers(2000, 6000)), int(rng.integers(8, 40))
        else:
            shared = []
            inp, out = int(rng.integers(100, 400)), int(rng.integers(300, 700))
        blocks = -(-inp // 512)
        ids = shared + list(range(nid, nid + blocks - len(shared)))
        nid += blocks
        rows.append({"timestamp": int(t[i]), "input_length": inp, "output_length": out, "hash_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def write_sessions(path: Path, sessions: int, rate: float, seed: int = 0) -> list[dict[str, object]]:
    """A Mooncake-format agent-session day: ``sessions`` sessions start at ``rate`` per second,
    each of 8-12 turns a think time apart (exponential, mean 180 s: a tool call or a person). The
    first turn sends a 16,000-24,000-token context (tools, files, a repository map); each later
    turn re-sends the previous turn's prompt and answer plus 500-1,500 new tokens, so its 512-token
    blocks extend the previous prompt's full blocks (the session's own ids, shared with no other
    session). Answers are 100-400 tokens."""
    rng = np.random.default_rng(seed)
    start = np.cumsum(rng.exponential(1.0 / rate, sessions))
    rows: list[dict[str, object]] = []
    nid = 10_000
    for s in range(sessions):
        t = float(start[s])
        prompt, ids = 0, []
        answer = 0
        for k in range(int(rng.integers(8, 13))):
            if k:
                t += float(rng.exponential(180.0))
            keep = ids[: prompt // 512]  # the previous prompt's full blocks
            prompt += answer + (int(rng.integers(16_000, 24_000)) if k == 0 else int(rng.integers(500, 1500)))
            new = -(-prompt // 512) - len(keep)
            ids = keep + list(range(nid, nid + new))
            nid += new
            answer = int(rng.integers(100, 400))
            rows.append(
                {"timestamp": int(t * 1000.0), "input_length": prompt, "output_length": answer, "hash_ids": ids}
            )
    rows.sort(key=lambda r: r["timestamp"])  # type: ignore[arg-type, return-value]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def _store(root: Path, kind: str, n: int, rate: float) -> tuple[Store, list[dict[str, object]]]:
    root.mkdir(parents=True, exist_ok=True)
    if kind == "sessions":
        rows = write_sessions(root / f"{kind}.jsonl", n, rate)
    else:
        rows = write_day(root / f"{kind}.jsonl", kind, n, rate)
    store = Store(root / "store")
    assert ingest_logs([root / f"{kind}.jsonl"], store, fmt="mooncake", date=DAY).ok
    return store, rows


@pytest.fixture(scope="module")
def agent_day(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, list[dict[str, object]]]:
    return _store(tmp_path_factory.mktemp("agent"), "agent", 2000, 10.0)


@pytest.fixture(scope="module")
def session_day(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, list[dict[str, object]]]:
    return _store(tmp_path_factory.mktemp("sessions"), "sessions", 300, 0.3)


@pytest.fixture(scope="module")
def chat_busy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, list[dict[str, object]]]:
    return _store(tmp_path_factory.mktemp("chat-busy"), "chat", 3000, 100.0)


@pytest.fixture(scope="module")
def chat_day(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, list[dict[str, object]]]:
    return _store(tmp_path_factory.mktemp("chat"), "chat", 2000, 20.0)


@pytest.fixture(scope="module")
def chat_quiet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, list[dict[str, object]]]:
    return _store(tmp_path_factory.mktemp("chat-quiet"), "chat", 300, 0.5)


def _opts(slo: str, modes: tuple[str, ...], **kw: object) -> PlanOptions:
    args: dict[str, object] = {
        "model": "llama-3.1-8b",
        "slo": slo,
        "hardware": ("h100-sxm",),
        "tp": (1,),
        "window": "day",
        "jobs": 1,
        "max_replicas": 32,
        "modes": modes,
        "pd_ratios": ((1, 1), (2, 1)),
    }
    args.update(kw)
    return PlanOptions(**args)  # type: ignore[arg-type]


def _front(doc: dict[str, object]) -> dict[str, dict[str, object]]:
    return {f["mode"]: f for f in doc["frontier"]}  # type: ignore[attr-defined, index]


# -- long prompts, short outputs: disaggregation wins --------------------------------------------


def test_agent_day_disaggregation_wins(agent_day: tuple[Store, list[dict[str, object]]], tmp_path: Path) -> None:
    store, rows = agent_day
    res = cli(
        "plan", "--store", str(store.root), "--model", "llama-3.1-8b", "--slo", "ttft_p99=3s,tpot_p99=15ms",
        "--hardware", "h100-sxm", "--tp", "1", "--window", "day", "--jobs", "1", "--max-replicas", "32",
        "--modes", "colocated,disaggregated", "--pd-ratios", "1:1,2:1", "--link", "rdma", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    front = _front(doc)
    dis, col = front["disaggregated"], front["colocated"]
    assert dis["verdict"] == "wins" and col["verdict"] == "loses"
    assert doc["chosen"]["mode"] == "disaggregated"
    # colocated: prefill chunks share steps with the decodes, so TPOT needs many more replicas
    assert dis["gpus"] < col["gpus"] and dis["usd_per_day"] < col["usd_per_day"]
    assert dis["prefill_replicas"] + dis["decode_replicas"] == dis["replicas"] == dis["gpus"]
    assert "more than disaggregated" in col["why"] and "tpot_p99 misses" in col["why"]
    # the transfer's p99 is the hand-computed latency + bytes / bandwidth over the day's prompts
    prompts = np.array([r["input_length"] for r in rows], dtype=np.float64)
    want = np.percentile(RDMA_LATENCY_S + prompts * KV_BYTES_PER_TOKEN / RDMA_BYTES_PER_S, 99, method="inverted_cdf")
    split = dis["ttft_split_p99_s"]
    assert split["transfer_s"] == pytest.approx(want, rel=1e-9)
    assert set(split) == {"queue_s", "prefill_s", "transfer_s", "decode_queue_s", "first_decode_step_s"}
    # the chosen count is the smallest: one replica fewer (split by the same ratio) misses
    assert doc["chosen"]["one_fewer"]["meets"] is False
    table = read_parquet(Path(doc["plan_dir"]) / "plan.parquet", "plan").to_pylist()
    best = next(r for r in table if r["rank"] == 1)
    assert best["mode"] == "disaggregated" and best["ttft_transfer_p99_s"] == pytest.approx(want, rel=1e-9)
    assert best["link"].startswith("rdma 50 GB/s")


# -- short prompts, long outputs: it does not ----------------------------------------------------


def test_chat_day_disaggregation_loses_decode_bound(chat_day: tuple[Store, list[dict[str, object]]]) -> None:
    store, _ = chat_day
    res = cli(
        "plan", "--store", str(store.root), "--model", "llama-3.1-8b", "--slo", "ttft_p99=2s,tpot_p99=100ms",
        "--hardware", "h100-sxm", "--tp", "1", "--window", "day", "--jobs", "1", "--max-replicas", "32",
        "--modes", "colocated,disaggregated", "--pd-ratios", "1:1,1:2",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    out = res.stdout
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("disaggregated"))
    assert "-> loses:" in line and "decode-bound: a prefill pool idles" in line, out
    assert "more than colocated" in line  # strictly dearer: one colocated replica keeps up
    assert next(ln for ln in out.splitlines() if ln.strip().startswith("colocated")).count("-> wins:") == 1
    assert "TTFT p99 by part: queue" in out


# -- speculation: wins at low load, not at high load ---------------------------------------------


def test_speculation_wins_at_low_load(chat_quiet: tuple[Store, list[dict[str, object]]]) -> None:
    store, _ = chat_quiet
    # 5 ms TPOT: one plain decode step of Llama-3.1-8B on an H100 is slower (a latency floor
    # for colocated); EAGLE-3 at k = 3 advances 2.79 tokens a verification (the catalog's figure)
    doc = plan(store, _opts("ttft_p99=2s,tpot_p99=5ms", ("colocated", "speculative"))).doc
    front = _front(doc)
    assert front["speculative"]["verdict"] == "wins"
    assert front["speculative"]["tpot_p99_s"] <= 0.005
    assert front["colocated"]["verdict"] == "no configuration meets the SLO"
    assert "latency floor" in front["colocated"]["why"]
    assert doc["chosen"]["config"] == "h100-sxm tp1 bf16 spec-eagle3:3"


def test_speculation_does_not_win_at_high_load(chat_busy: tuple[Store, list[dict[str, object]]]) -> None:
    store, _ = chat_busy
    doc = plan(store, _opts("ttft_p99=2s,tpot_p99=40ms", ("colocated", "speculative"))).doc
    front = _front(doc)
    spec, col = front["speculative"], front["colocated"]
    assert col["verdict"] == "wins" and spec["verdict"] == "loses"
    assert spec["usd_per_day"] >= col["usd_per_day"]
    assert "the drafts save no replica" in spec["why"]
    assert doc["chosen"]["config"] == "h100-sxm tp1 bf16"


# -- disaggregated with a speculating decode pool --------------------------------------------------

#: The EAGLE-3 drafter of Llama-3.1-8B is one decoder layer: 1 x 8 KV heads x 128 x 2 (K, V) x 2
#: bytes = 4,096 bytes of KV per token, which the prefill pool computes and sends with the target's
#: (docs/pools.md, "Speculative decoding on the decode side").
EAGLE3_KV_BYTES_PER_TOKEN = 1 * 8 * 128 * 2 * 2


def test_agent_day_speculating_decode_pool_wins(agent_day: tuple[Store, list[dict[str, object]]]) -> None:
    store, rows = agent_day
    modes = ("colocated", "disaggregated", "speculative", "disaggregated-speculative")
    res = plan(store, _opts("ttft_p99=3s,tpot_p99=8ms", modes))
    doc = res.doc
    front = _front(doc)
    both, dis, spec = front["disaggregated-speculative"], front["disaggregated"], front["speculative"]
    assert both["verdict"] == "wins" and doc["chosen"]["mode"] == "disaggregated-speculative"
    assert both["gpus"] < dis["gpus"] and both["gpus"] < spec["gpus"] < front["colocated"]["gpus"]
    assert both["tpot_p99_s"] <= 0.008 and "the decode pool speculates (eagle3 k = 3)" in both["why"]
    assert both["prefill_replicas"] + both["decode_replicas"] == both["replicas"]
    # the speculative one-pool configuration beat colocated without winning: said so
    saved = front["colocated"]["replicas"] - spec["replicas"]
    assert f"the drafts save {saved} replicas against colocated" in spec["why"]
    # the link moves the target's KV and the drafter's: latency + prompt x bytes / bandwidth, by hand
    prompts = np.array([r["input_length"] for r in rows], dtype=np.float64)
    per_token = KV_BYTES_PER_TOKEN + EAGLE3_KV_BYTES_PER_TOKEN
    want = np.percentile(RDMA_LATENCY_S + prompts * per_token / RDMA_BYTES_PER_S, 99, method="inverted_cdf")
    assert both["ttft_split_p99_s"]["transfer_s"] == pytest.approx(want, rel=1e-9)
    best = next(r for r in res.table.to_pylist() if r["rank"] == 1)
    assert best["speculative"] == "eagle3:3" and best["pd_ratio"] in ("1:1", "2:1")


# -- a KV offload tier: wins on agent sessions revisited minutes apart, not on chat ----------------

#: The agent day's base fleet: a session's turns on the replica that holds its blocks (every
#: session's first block is its own, so prefix_affinity keeps a session on one replica).
AFFINITY_FLEET = 'name = "agents"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\nrouter = "prefix_affinity"\n'


def test_agent_sessions_offload_wins(session_day: tuple[Store, list[dict[str, object]]], tmp_path: Path) -> None:
    store, rows = session_day
    fleet = tmp_path / "FLEET.toml"
    fleet.write_text(AFFINITY_FLEET, encoding="utf-8")
    res = cli(
        "plan", "--store", str(store.root), "--model", "llama-3.1-8b", "--fleet", str(fleet),
        "--slo", "ttft_p99=2s,tpot_p99=100ms", "--hardware", "h100-sxm", "--tp", "1", "--window", "day",
        "--jobs", "1", "--max-replicas", "32", "--modes", "colocated,offload", "--offload-gb", "256,512", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    front = _front(doc)
    off, col = front["offload"], front["colocated"]
    assert off["verdict"] == "wins" and col["verdict"] == "loses"
    assert doc["chosen"]["mode"] == "offload" and doc["chosen"]["config"] == "h100-sxm tp1 bf16 offload-cpu:256GB"
    assert off["replicas"] < col["replicas"] and off["usd_per_day"] < col["usd_per_day"]
    # the reason in words, its figures the chosen replay's own pre-pass
    got = doc["chosen"]["offload"]
    assert got["kind"] == "cpu" and got["capacity_gb"] == 256.0 and got["routing"] == "replica"
    loaded = got["offload_hit_tokens"]
    assert loaded == off["offload_hit_tokens"] > 0 and got["requests_loading"] == off["offload_requests_loading"] > 0
    fewer = col["replicas"] - off["replicas"]
    assert f"the tier turned {loaded / 1e6:,.1f} M fresh prefill tokens into loads from host memory" in off["why"]
    assert off["why"].endswith(f": {fewer} replica{'s' if fewer != 1 else ''} fewer"), off["why"]
    assert "more than offload" in col["why"]
    # every loaded token is a prompt token some earlier turn of its session sent: at most the day's
    # prompts less each session's first turn (nothing before it to load)
    prompts = sum(int(r["input_length"]) for r in rows)  # type: ignore[call-overload]
    assert loaded < prompts and off["fresh_prefill_tokens"] < prompts - loaded + 1
    # the tier adds no $ line: host DRAM comes with the GPU instance (priced in its GPU-hour)
    assert off["usd_per_day"] == pytest.approx(off["gpus"] * doc["chosen"]["usd_per_day"] / doc["chosen"]["gpus"])
    # 512 GB does not fit one H100's 256 GB of host DRAM: skipped, the fleet parser's reason in one line
    big = next(c for c in doc["configurations"] if c["config"] == "h100-sxm tp1 bf16 offload-cpu:512GB")
    assert big["replicas"] is None and big["note"].startswith("skipped: --offload-gb 512 (h100-sxm tp1)")
    assert "more than the 256 GB of host memory one replica has" in big["note"]
    table = read_parquet(Path(doc["plan_dir"]) / "plan.parquet", "plan").to_pylist()
    best = next(r for r in table if r["rank"] == 1)
    assert best["mode"] == "offload" and best["offload_hit_tokens"] == loaded
    assert best["offload"] == "cpu 256 GB per replica, 50 GB/s, 10 µs"


def test_chat_day_offload_saves_nothing(chat_day: tuple[Store, list[dict[str, object]]]) -> None:
    store, _ = chat_day
    doc = plan(store, _opts("ttft_p99=2s,tpot_p99=100ms", ("colocated", "offload"))).doc
    front = _front(doc)
    off, col = front["offload"], front["colocated"]
    assert col["verdict"] == "wins" and off["verdict"] == "loses"
    assert off["offload_hit_tokens"] == 0 and off["replicas"] == col["replicas"]
    assert "which is the simpler to run" in off["why"]
    assert off["why"].endswith("no reuse beyond the GPU cache: the tier loaded nothing, so it saved nothing")
    assert doc["chosen"]["config"] == "h100-sxm tp1 bf16"


def test_offload_refuses_a_base_fleet_with_a_tier(
    chat_quiet: tuple[Store, list[dict[str, object]]], tmp_path: Path
) -> None:
    store, _ = chat_quiet
    fleet = tmp_path / "FLEET.toml"
    fleet.write_text(AFFINITY_FLEET + '[kv_offload]\nkind = "cpu"\ncapacity_gb = 100\n', encoding="utf-8")
    res = cli("plan", "--store", str(store.root), "--model", "llama-3.1-8b", "--fleet", str(fleet),
              "--hardware", "h100-sxm", "--tp", "1", "--modes", "colocated,offload")  # fmt: skip
    one_error(res, "--modes: the base fleet sets [kv_offload]")


def test_autoscale_prices_the_cheapest_configuration_without_a_tier(
    session_day: tuple[Store, list[dict[str, object]]], tmp_path: Path
) -> None:
    store, _ = session_day
    fleet = tmp_path / "FLEET.toml"  # (an autoscaled fleet routes round robin over its live replicas)
    policy = '[autoscale]\nmin_replicas = 1\nmax_replicas = 2\nsignal = "schedule"\nschedule = [[0, 1]]\n'
    fleet.write_text(AFFINITY_FLEET.replace("prefix_affinity", "round_robin") + policy, encoding="utf-8")
    opts = _opts("ttft_p99=3s,tpot_p99=100ms", ("colocated", "offload"), fleet_path=str(fleet), autoscale=True)
    doc = plan(store, opts).doc
    assert doc["chosen"]["mode"] == "offload"  # the tier wins the plan ...
    note = next(n for n in doc["notes"] if n.startswith("--autoscale"))
    assert "without an offload tier: [kv_offload] with [autoscale] is not modelled yet" in note
    assert doc["autoscale"]["config"] == "h100-sxm tp1 bf16"  # ... and autoscaling prices colocated


def test_agent_sessions_three_levels_beside_the_cpu_tier(
    session_day: tuple[Store, list[dict[str, object]]], tmp_path: Path
) -> None:
    """``--offload-store-gb 2000``: each cpu tier is tried alone and over a 2,000 GB store for the
    pool ([kv_offload.shared]). The store keeps what the host tiers lose, so the three-level
    configuration loads more and needs no more replicas; the frontier says what each lower tier
    loaded, and that the store is not priced."""
    from pipeline.plan.modes import frontier_lines

    store, _rows = session_day
    fleet = tmp_path / "FLEET.toml"
    fleet.write_text(AFFINITY_FLEET, encoding="utf-8")
    opts = _opts("ttft_p99=2s,tpot_p99=100ms", ("colocated", "offload"), offload_gb=(256.0,),
                 offload_store_gb=(2000.0,), fleet_path=str(fleet))  # fmt: skip
    res = plan(store, opts)
    doc = res.doc
    by_config = {c["config"]: c for c in doc["configurations"]}
    alone = by_config["h100-sxm tp1 bf16 offload-cpu:256GB"]
    three = by_config["h100-sxm tp1 bf16 offload-cpu:256GB+store:2000GB"]
    assert three["replicas"] is not None and alone["replicas"] is not None
    assert three["replicas"] <= alone["replicas"]
    off = _front(doc)["offload"]
    assert off["config"] == "h100-sxm tp1 bf16 offload-cpu:256GB+store:2000GB" and off["verdict"] == "wins"
    below = "then shared 2000 GB shared by the pool, 50 GB/s, 50 µs"
    assert off["offload"] == f"cpu 256 GB per replica, 50 GB/s, 10 µs, {below}"
    got = doc["chosen"]["offload"]
    tiers = got["by_tier"]
    loaded = tiers["cpu"]["hit_tokens"] + tiers["shared"]["hit_tokens"]
    assert loaded == got["offload_hit_tokens"] == off["offload_hit_tokens"]
    assert tiers["shared"]["hit_tokens"] > 0  # the store loaded what host memory lost
    cpu_m, store_m = tiers["cpu"]["hit_tokens"] / 1e6, tiers["shared"]["hit_tokens"] / 1e6
    assert f"from host memory ({cpu_m:,.1f} M) and the pool's store ({store_m:,.1f} M)" in off["why"]
    assert "the store not priced" in "\n".join(frontier_lines(doc["frontier"]))
    assert list(doc["options"]["offload_store_gb"]) == [2000.0]
    # without a store the options (and the plan id) are those of a plan before three levels
    assert "offload_store_gb" not in _opts("ttft_p99=2s", ("colocated", "offload")).record()


def test_offload_options_keep_other_plans_ids(chat_quiet: tuple[Store, list[dict[str, object]]]) -> None:
    store, _ = chat_quiet
    loose = "ttft_p99=10s,tpot_p99=1s"
    a = plan(store, _opts(loose, ("colocated", "speculative")))
    b = plan(store, _opts(loose, ("colocated", "speculative"), offload_gb=(64.0,), offload_kind="shared"))
    assert a.plan_id == b.plan_id  # the offload options are not part of a plan without offload
    assert "offload" not in a.table.column_names and "offload_gb" not in a.doc["options"]
    c = plan(store, _opts(loose, ("colocated", "offload"), offload_gb=(64.0,), offload_kind="shared"))
    assert list(c.doc["options"]["offload_gb"]) == [64.0] and "offload" in c.table.column_names
    assert _front(c.doc)["offload"]["offload"] == "shared 64 GB shared by the pool, 50 GB/s, 50 µs"


# -- the default is the plan it always was -------------------------------------------------------


def test_colocated_only_plan_has_no_mode_records(chat_quiet: tuple[Store, list[dict[str, object]]]) -> None:
    store, _ = chat_quiet
    loose = "ttft_p99=10s,tpot_p99=1s"
    a = plan(store, _opts(loose, ("colocated",), pd_ratios=((1, 1),)))
    b = plan(store, _opts(loose, ("colocated",), pd_ratios=((3, 1),), link="nvlink"))
    assert a.plan_id == b.plan_id  # the modes' options are not part of a colocated-only plan
    assert "frontier" not in a.doc and "modes" not in a.doc["options"]
    assert "mode" not in a.table.column_names and "ttft_transfer_p99_s" not in a.table.column_names
    c = plan(store, _opts(loose, ("colocated", "speculative")))
    assert c.plan_id != a.plan_id and "mode" in c.table.column_names


# -- the replay entry point it reuses ------------------------------------------------------------


def test_replay_prefill_decode_equals_the_pooled_replay(chat_quiet: tuple[Store, list[dict[str, object]]]) -> None:
    store, _ = chat_quiet
    req = store.read_requests(DAY).head(120)
    pooled = parse_pooled(
        {
            "name": "pd", "model": "llama-3.1-8b", "hardware": "h100-sxm", "link": {"kind": "rdma"},
            "pool": [{"name": "p", "role": "prefill", "replicas": 1}, {"name": "d", "role": "decode", "replicas": 2}],
        },
        "test",
    )  # fmt: skip
    [joined_run] = replay_pools(req, pooled, ReplayOptions())
    base = parse_fleet({"name": "x", "model": "llama-3.1-8b", "hardware": "h100-sxm"}, "test")
    pre, dec = resolve(base.with_replicas(1), "p"), resolve(base.with_replicas(2), "d")
    got = replay_prefill_decode(req, pre, dec, link_of_kind("rdma", "test"), ReplayOptions())
    for name in ("arrival_s", "first_token_s", "finish_s", "scheduled_s", "reject_reason"):
        assert np.array_equal(getattr(got.joined.result, name), getattr(joined_run.result, name), equal_nan=True)
    assert np.array_equal(got.work.output_tokens, req.get_column("output_tokens").cast(pl.Int64).to_numpy())


# -- the split and the bound ---------------------------------------------------------------------


@given(st.integers(2, 600), st.integers(1, 16), st.integers(1, 16))
def test_ratio_split_keeps_both_pools_and_the_ratio(total: int, p: int, d: int) -> None:
    pre, dec = ratio_split(total, (p, d))
    assert pre + dec == total and pre >= 1 and dec >= 1
    exact = total * p / (p + d)
    if 1 <= round(exact) <= total - 1:
        assert abs(pre - exact) <= 0.5


def test_disaggregated_seed_gives_each_pool_its_need() -> None:
    demand = {"fresh_min_tokens_per_s": 25_000.0, "output_tokens_per_s": 900.0}
    cap = {"prefill_tokens_per_s": 10_000.0, "decode_tokens_per_s": 1_000.0}
    # prefill needs 3 replicas, decode 1: at 1:1 the smallest total giving 3 prefill is 5 (3 + 2)
    assert disaggregated_seed(demand, cap, (1, 1), 64) == 5
    assert disaggregated_seed(demand, cap, (3, 1), 64) == 4
    assert disaggregated_seed(demand, cap, (1, 1), 3) == 3  # never past --max-replicas
    assert disaggregated_seed({**demand, "fresh_min_tokens_per_s": float("inf")}, cap, (1, 1), 8) == 8


# -- hostile flags: one line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--modes", "foo", "--modes: unknown mode 'foo'"),
        ("--modes", ",", "--modes: give at least one"),
        ("--pd-ratios", "0:1", "--pd-ratios '0:1'"),
        ("--pd-ratios", "1:nan", "--pd-ratios '1:nan'"),
        ("--pd-ratios", "1:1e300", "--pd-ratios '1:1e300'"),
        ("--pd-ratios", "2", "--pd-ratios '2'"),
        ("--link", "warp", "--link: unknown link kind 'warp'"),
        ("--speculative", "eagle3:0", "--speculative 'eagle3:0'"),
        ("--speculative", "medusa:3", "--speculative 'medusa:3'"),
        ("--speculative", "draft_model:3", "draft_model needs its draft"),
        ("--offload-gb", "0", "--offload-gb '0'"),
        ("--offload-gb", "-256", "--offload-gb '-256'"),
        ("--offload-gb", "nan", "--offload-gb 'nan'"),
        ("--offload-gb", "1e30", "--offload-gb '1e30'"),
        ("--offload-gb", "lots", "--offload-gb 'lots'"),
        ("--offload-gb", "256,inf", "--offload-gb 'inf'"),
        ("--offload-gb", ",", "--offload-gb: expected GB"),
        ("--offload-kind", "nvme", "--offload-kind: unknown kind 'nvme'"),
        ("--offload-store-gb", "0", "--offload-store-gb '0'"),
        ("--offload-store-gb", "nan", "--offload-store-gb 'nan'"),
        ("--offload-store-gb", "1e30", "--offload-store-gb '1e30'"),
        ("--offload-store-gb", ",", "--offload-store-gb: expected GB"),
    ],
)
def test_hostile_mode_flags_are_one_line(tmp_path: Path, flag: str, value: str, needle: str) -> None:
    res = cli("plan", "--store", str(tmp_path), "--model", "llama-3.1-8b", "--modes", "colocated,disaggregated",
              flag, value)  # fmt: skip
    one_error(res, needle)


def test_parsers_refuse_in_the_library() -> None:
    assert parse_ratios("1:2, 2:4 ,3:1") == ((1, 2), (3, 1))  # 2:4 is 1:2
    assert parse_speculative("ngram:5") == ("ngram", 5)
    with pytest.raises(ConfigError, match="--modes: unknown mode"):
        PlanOptions(model="llama-3.1-8b", modes=("colocated", "pd"))
    with pytest.raises(ConfigError, match="--pd-ratios"):
        PlanOptions(model="llama-3.1-8b", pd_ratios=((0, 1),))
    assert parse_offload_gb("256, 512,256") == (256.0, 512.0)
    # the default tier is one GPU's share of host DRAM in the catalog (DGX H100: 2 TB for 8 GPUs)
    from pipeline.classify.offload import offload_kinds
    from pipeline.common.defaults import DEFAULT_PLAN_OFFLOAD_GB

    share = offload_kinds()["cpu"]["host_memory_gb_per_gpu"]
    assert parse_offload_gb(DEFAULT_PLAN_OFFLOAD_GB) == PlanOptions(model="llama-3.1-8b").offload_gb == (share,)
    for bad in ((0.0,), (float("nan"),), (-1.0,), (1e30,), ()):
        with pytest.raises(ConfigError, match="--offload-gb"):
            PlanOptions(model="llama-3.1-8b", offload_gb=bad)
    assert parse_offload_gb("", "--offload-store-gb") == () and parse_offload_gb("8000,2000", "--offload-store-gb") == (
        8000.0,
        2000.0,
    )
    for bad in ((0.0,), (float("inf"),)):
        with pytest.raises(ConfigError, match="--offload-store-gb"):
            PlanOptions(model="llama-3.1-8b", offload_store_gb=bad)
    with pytest.raises(ConfigError, match="a store goes below a cpu tier"):
        PlanOptions(model="llama-3.1-8b", offload_kind="shared", offload_store_gb=(100.0,))


def test_a_mode_option_no_mode_reads_is_said(chat_quiet: tuple[Store, list[dict[str, object]]]) -> None:
    """`plan --modes colocated --offload-store-gb 2000 --pd-ratios 1:1` plans as without them, and
    says on stderr that each changed nothing; a default or a mode that reads it says nothing."""
    from pipeline.plan.modes import unused_mode_options

    store, _ = chat_quiet
    base = ("plan", "--store", str(store.root), "--model", "llama-3.1-8b", "--slo", "ttft_p99=10s,tpot_p99=1s",
            "--hardware", "h100-sxm", "--tp", "1", "--window", "day", "--jobs", "1", "--max-replicas", "8")  # fmt: skip
    res = cli(*base, "--modes", "colocated", "--offload-store-gb", "2000", "--pd-ratios", "1:1")
    assert res.exit_code == 0, res.stderr
    notes = [ln for ln in res.stderr.splitlines() if "not used" in ln]
    assert notes == [
        "plan: --pd-ratios not used: --modes has no disaggregated or disaggregated-speculative",
        "plan: --offload-store-gb not used: --modes has no offload",
    ]
    quiet = cli(*base, "--modes", "colocated,speculative", "--speculative", "ngram:3")
    assert quiet.exit_code == 0 and "not used" not in quiet.stderr, quiet.stderr
    assert unused_mode_options(["--link", "--jobs"], ["disaggregated-speculative"]) == []
    assert unused_mode_options(["--speculative"], ["offload"]) == [
        "--speculative not used: --modes has no speculative or disaggregated-speculative"
    ]
