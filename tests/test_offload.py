"""KV offload tiers (pipeline/classify/offload.py): a write-through lower tier beside the GPU's
prefix cache. Checked: the two-level LRU against a brute-force simulation of two explicit LRU
lists on random traces; a hand-computed day; the load a lower-tier hit costs; the capacity
curve of a synthetic agent-session day; rows in = rows out; FLEET.toml's [kv_offload] table,
its memory fit per tier and hostile values, each one line."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from test_accounting import requests_frame

from pipeline.classify import prefix as P
from pipeline.classify.accounting import Capacity, ClassifyOptions, account, parse_offload_sizes
from pipeline.classify.offload import OffloadTier, parse_offload, tier_hits
from pipeline.cli import main
from pipeline.common.errors import ConfigError, RooftraceError
from pipeline.replay.fleet import fleet_from_dict, load_fleet

# --------------------------------------------------------------------------------------------
# the two-level LRU against two explicit LRU lists


def _brute_force(chains: list[list[int]], lookups: list[int], gpu: int, lower: int) -> tuple[list[int], list[int]]:
    """Two plain LRU lists (most recent first). Per request: the leading looked-up blocks in the
    GPU list are GPU hits; the run continues through blocks the lower list holds (lower-tier
    hits, loaded); then every block of the request is touched tail first in both lists (a load
    promotes into the GPU tier; every computed block is written through to the lower tier) and
    each list is cut to its capacity."""
    g_list: list[int] = []
    l_list: list[int] = []
    g_hits, l_hits = [], []
    for blocks, k in zip(chains, lookups, strict=True):
        n_g = 0
        while n_g < k and blocks[n_g] in g_list:
            n_g += 1
        n_all = n_g
        while n_all < k and (blocks[n_all] in g_list or blocks[n_all] in l_list):
            n_all += 1
        g_hits.append(n_g)
        l_hits.append(n_all - n_g)
        for lst, cap in ((g_list, gpu), (l_list, lower)):
            for b in reversed(blocks):
                if b in lst:
                    lst.remove(b)
                lst.insert(0, b)
            del lst[cap:]
    return g_hits, l_hits


@st.composite
def traces(draw: Any) -> tuple[list[list[int]], list[int]]:
    """Requests that each take a prefix of one of a few documents (a document's block j is the
    same block wherever it is taken, as a chained hash makes it), looking up a leading part."""
    n_docs = draw(st.integers(1, 4))
    chains, lookups = [], []
    for _ in range(draw(st.integers(1, 30))):
        doc = draw(st.integers(0, n_docs - 1))
        length = draw(st.integers(1, 8))
        chains.append([1000 * (doc + 1) + j for j in range(length)])
        lookups.append(draw(st.integers(0, length)))
    return chains, lookups


@settings(max_examples=300, deadline=None)
@given(traces(), st.integers(0, 12), st.integers(0, 30))
def test_two_level_lru_equals_two_explicit_lru_lists(trace: Any, gpu: int, lower: int) -> None:
    chains, lookups = trace
    flat = np.asarray([b for c in chains for b in c], dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in chains])]).astype(np.int64)
    dist = P.request_distances(flat, offsets, np.asarray(lookups, np.int64))
    g, low = tier_hits(dist, gpu, lower)
    want_g, want_l = _brute_force(chains, lookups, gpu, lower)
    assert g.tolist() == want_g
    assert low.tolist() == want_l


@settings(max_examples=300, deadline=None)
@given(traces(), st.integers(0, 12), st.integers(0, 30), st.integers(0, 2**30))
def test_the_replays_direct_lru_equals_two_explicit_lru_lists(trace: Any, gpu: int, lower: int, pick: int) -> None:
    """The replay's pre-pass simulates the tiers directly (P.lru_hit_blocks, one recency list
    whose most recent blocks are the GPU tier), on some of the day's requests (a replica's),
    reading their chains in place: the same hits as the brute force on those requests alone."""
    chains, lookups = trace
    flat = np.asarray([b for c in chains for b in c], dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in chains])]).astype(np.int64)
    rows = np.asarray([i for i in range(len(chains)) if pick >> (i % 30) & 1], np.int64)
    g, both = P.lru_hit_blocks(flat, offsets, np.asarray(lookups, np.int64), [gpu, max(gpu, lower)], rows)
    want_g, want_l = _brute_force([chains[i] for i in rows], [lookups[i] for i in rows], gpu, lower)
    assert g.tolist() == want_g
    assert (both - g).tolist() == want_l


def test_the_direct_lru_equals_the_stack_distances_with_repeated_blocks() -> None:
    """Random keys (a block may repeat within a request), capacities 0, 1, equal ones, three at
    once, and one beyond every block: the same leading hits as request_distances, compiled and
    in plain Python."""
    rng = np.random.default_rng(7)
    for trial in range(120):
        counts = rng.integers(0, 8, int(rng.integers(1, 50)))
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        flat = rng.integers(0, int(rng.integers(1, 30)), int(offsets[-1])).astype(np.uint64)
        lookups = np.asarray([rng.integers(0, c + 1) for c in counts], np.int64)
        c = int(rng.integers(1, 8))
        caps = [[0, c], [1], [c, c], [c, c + 1, c + 4], [c, 10**12]][trial % 5]
        dist = P.request_distances(flat, offsets, lookups)
        for kernels in (None, P._python_kernels()) if trial < 30 else (None,):
            got = P.lru_hit_blocks(flat, offsets, lookups, caps, kernels=kernels)
            assert [h.tolist() for h in got] == [dist.hit_blocks(k).tolist() for k in caps]
    with pytest.raises(RooftraceError, match="lookups"):
        P.lru_hit_blocks(np.zeros(2, np.uint64), np.array([0, 2], np.int64), np.array([3], np.int64), [4])
    with pytest.raises(RooftraceError, match="capacities"):
        P.lru_hit_blocks(np.zeros(2, np.uint64), np.array([0, 2], np.int64), np.array([1], np.int64), [-1])


def test_a_lower_tier_no_larger_than_the_gpu_tier_adds_nothing() -> None:
    """Write-through tiers are inclusive: the lower tier holds the most recent L blocks, which
    the GPU tier of G >= L already holds."""
    seq = [1, 2, 3, 4, 1, 2, 3, 4, 5, 1]
    dist = P.request_distances(
        np.asarray(seq, np.uint64), np.arange(len(seq) + 1, dtype=np.int64), np.ones(len(seq), np.int64)
    )
    for gpu in range(6):
        for lower in range(gpu + 1):
            assert tier_hits(dist, gpu, lower)[1].sum() == 0
    # the repeats sit at distances 4, 4, 4, 4 (1..4 again), then 5 is new and the last 1 is at
    # distance 5 (2, 3, 4, 5 since): a GPU tier of 3 hits none; a lower tier of 4 takes the four
    # accesses at distance 4, one of 5 all five
    assert tier_hits(dist, 3, 4)[1].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    assert tier_hits(dist, 3, 5)[1].sum() == 5


# --------------------------------------------------------------------------------------------
# by hand

SESSIONS = [
    {"t": 0, "recorded_input_tokens": 9, "output_tokens": 3, "session_id": "A"},
    {"t": 1, "recorded_input_tokens": 9, "output_tokens": 3, "session_id": "B"},
    {"t": 2, "recorded_input_tokens": 13, "output_tokens": 3, "session_id": "A"},
]


def test_classify_splits_hits_between_the_tiers_by_hand() -> None:
    """Block size 4. A's first turn leaves 3 blocks (9 prompt + 3 output tokens = 12), B's the
    same; A's second turn (13 tokens: 12 shared) looks up (13 - 1) // 4 = 3 blocks. After B the
    stack is B0 B1 B2 A0 A1 A2: A's blocks sit at distances 4, 5, 6. A GPU tier of 12 tokens
    (3 blocks) holds none; 1e6 KV bytes per token make a block 4 MB, so a 0.020 GB lower tier
    holds 5 blocks (A0, A1: 8 tokens) and 0.024 GB holds 6 (A0..A2: 12 tokens)."""
    opts = ClassifyOptions(
        block_size=4, capacity=Capacity(tokens=12), kv_bytes_per_token=1e6, offload_gb=(0.0, 0.020, 0.024)
    )
    rows = account(requests_frame(SESSIONS), opts).summary["offload"]
    got = [
        (r["offload_capacity_blocks"], r["gpu_hit_tokens"], r["offload_hit_tokens"], r["fresh_input_tokens"])
        for r in rows
    ]
    assert got == [(0, 0, 0, 31), (5, 0, 8, 23), (6, 0, 12, 19)]
    assert [r["offload_load_bytes"] for r in rows] == [0, 8_000_000, 12_000_000]
    assert [r["requests_loading"] for r in rows] == [0, 1, 1]
    # rows in = rows out: the accounting keeps one row per request whatever the tiers
    assert account(requests_frame(SESSIONS), opts).requests.height == len(SESSIONS)


def test_an_offload_hit_costs_the_load_not_the_prefill() -> None:
    """12 tokens at 1e6 B/token = 12 MB over 50 GB/s = 240 µs, + 10 µs latency = 250 µs; a
    request that loads nothing waits nothing."""
    tier = OffloadTier("cpu", 256.0, 50.0, 10.0)
    assert tier.load_s([12, 0], 1e6).tolist() == pytest.approx([250e-6, 0.0], rel=1e-12)
    # a cpu tier is one per replica, a shared one the pool's
    assert tier.capacity_blocks(1e6, 4, replicas=2) == 2 * 256 * 1000 // 4
    assert OffloadTier("shared", 256.0, 50.0, 50.0).capacity_blocks(1e6, 4, replicas=2) == 256 * 1000 // 4


# --------------------------------------------------------------------------------------------
# the motivating case: an agent-session day


def agent_day(seed: int = 7, sessions: int = 60, turns: int = 6) -> list[dict[str, Any]]:
    """Sessions of an agent: each turn re-sends the whole conversation (a 2,000-token system
    prompt and tools, then every earlier turn) plus a new tool result, and comes back minutes
    later, interleaved with every other session's turns."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for s in range(sessions):
        start = float(rng.uniform(0, 3600))
        prompt = 2000
        t = start
        for _ in range(turns):
            out = int(rng.integers(100, 400))
            rows.append({"t": t, "recorded_input_tokens": prompt, "output_tokens": out, "session_id": f"s{s}"})
            prompt += out + int(rng.integers(200, 1500))
            t += float(rng.uniform(60, 600))
    rows.sort(key=lambda r: r["t"])
    return rows


def test_fresh_prefill_falls_as_the_cpu_tier_grows_on_an_agent_day() -> None:
    """A GPU tier of 100k tokens (13.1 GB at Llama-3.1-8B's 131,072 B/token); lower tiers of 0
    to 1,000 GB. One of 8 GB (below the GPU tier) adds nothing; past it the fresh prefill falls
    step by step to what the whole day's footprint (about 30 GB) leaves."""
    rows = agent_day()
    sizes = (0.0, 8.0, 16.0, 20.0, 24.0, 32.0, 1000.0)
    opts = ClassifyOptions(
        block_size=16, capacity=Capacity(tokens=100_000), kv_bytes_per_token=131_072, offload_gb=sizes
    )
    got = account(requests_frame(rows), opts)
    offload = got.summary["offload"]
    assert got.requests.height == len(rows)  # rows in = rows out
    fresh = [r["fresh_input_tokens"] for r in offload]
    gpu = {r["gpu_hit_tokens"] for r in offload}
    assert len(gpu) == 1  # the GPU tier's hits do not depend on the lower tier's size
    assert fresh[1] == fresh[0]  # inclusion: a lower tier smaller than the GPU tier holds nothing more
    assert all(a >= b for a, b in itertools.pairwise(fresh))
    assert len(set(fresh[1:6])) == 5  # each step of 4-8 GB past the GPU tier serves more
    assert fresh[0] > 2 * fresh[-1]  # the revisits after minutes come back from host memory
    assert all(
        r["fresh_input_tokens"] + r["gpu_hit_tokens"] + r["offload_hit_tokens"] == r["recorded_input_tokens"]
        for r in offload
    )
    # a lower tier past the day's whole footprint serves what an unbounded GPU cache would
    unbounded = account(requests_frame(rows), ClassifyOptions(block_size=16)).curve
    best = unbounded.filter(unbounded["capacity_blocks"].is_null())["fresh_input_tokens"][0]
    assert fresh[-1] == best
    assert offload[0]["offload_hit_tokens"] == 0


# --------------------------------------------------------------------------------------------
# FLEET.toml [kv_offload]


def _fleet(tmp_path: Path, table: str, top: str = "") -> Path:
    path = tmp_path / "f.toml"
    path.write_text(f'name = "off"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n{top}\n[kv_offload]\n{table}\n')
    return path


def test_a_fleet_reads_its_tier_with_the_kinds_cited_defaults(tmp_path: Path) -> None:
    cfg = load_fleet(_fleet(tmp_path, 'kind = "cpu"\ncapacity_gb = 200'))
    assert cfg.kv_offload == OffloadTier("cpu", 200.0, 50.0, 10.0, 256.0)
    recorded = cfg.to_dict()["kv_offload"]
    assert recorded == {
        "kind": "cpu",
        "capacity_gb": 200.0,
        "bandwidth_gb_s": 50.0,
        "latency_us": 10.0,
        "host_memory_gb": 256.0,
    }
    # a run's record reads back the same, a host stated in the file included
    big = load_fleet(_fleet(tmp_path, 'kind = "cpu"\ncapacity_gb = 900\nhost_memory_gb = 1000'))
    again = fleet_from_dict(big.to_dict(), "config.json")
    assert again.kv_offload == big.kv_offload == OffloadTier("cpu", 900.0, 50.0, 10.0, 1000.0)
    shared = load_fleet(_fleet(tmp_path, 'kind = "shared"\ncapacity_gb = 4000\nbandwidth_gb_s = 25'))
    assert shared.kv_offload == OffloadTier("shared", 4000.0, 25.0, 50.0)
    assert "kv_offload" not in load_fleet(Path(__file__).resolve().parents[1] / "fleets" / "default.toml").to_dict()


def test_a_cpu_tier_must_fit_the_replicas_host_memory(tmp_path: Path) -> None:
    """256 GB of DRAM per GPU (DGX H100: 2 TB for 8): 300 GB is too much for one GPU, fits two."""
    with pytest.raises(ConfigError) as err:
        load_fleet(_fleet(tmp_path, 'kind = "cpu"\ncapacity_gb = 300'))
    assert str(err.value).startswith(f"{tmp_path / 'f.toml'} [kv_offload]: capacity_gb 300 is more than the 256 GB")
    assert load_fleet(_fleet(tmp_path, 'kind = "cpu"\ncapacity_gb = 300', "tp = 2")).kv_offload is not None
    with pytest.raises(ConfigError, match="more than the 100 GB of host memory one replica has"):
        load_fleet(_fleet(tmp_path, 'kind = "cpu"\ncapacity_gb = 150\nhost_memory_gb = 100'))


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('kind = "disk"\ncapacity_gb = 3', "kind 'disk' unknown"),
        ('kind = "cpu"', "missing key(s) ['capacity_gb']"),
        ('kind = "cpu"\ncapacity_gb = "big"', "capacity_gb must be a number, got 'big'"),
        ('kind = "cpu"\ncapacity_gb = true', "capacity_gb must be a number, got True"),
        ('kind = "cpu"\ncapacity_gb = nan', "capacity_gb must be a number of GB in [0, 1e+06], got nan"),
        ('kind = "shared"\ncapacity_gb = 1e300', "capacity_gb must be a number of GB in [0, 1e+06], got 1e+300"),
        ('kind = "cpu"\ncapacity_gb = -1', "capacity_gb must be a number of GB in [0, 1e+06], got -1"),
        (
            'kind = "shared"\ncapacity_gb = 9\nbandwidth_gb_s = 0',
            "bandwidth_gb_s must be a number of GB/s in (0, 10000]",
        ),
        ('kind = "cpu"\ncapacity_gb = 9\nlatency_us = inf', "latency_us must be a number of µs in [0, 1e+06], got inf"),
        ('kind = "shared"\ncapacity_gb = 9\nhost_memory_gb = 5', "host_memory_gb is for kind cpu only"),
        ('kind = "cpu"\ncapacity_gb = 9\nsize = 1', "unknown key(s) ['size']"),
    ],
)
def test_a_hostile_kv_offload_table_is_one_line(tmp_path: Path, table: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_fleet(_fleet(tmp_path, table))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / 'f.toml'} [kv_offload]: ") and words in msg


def test_parse_offload_names_where(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^x \[kv_offload\]: capacity_gb is required"):
        parse_offload({"kind": "cpu"}, "x [kv_offload]", 1)


# --------------------------------------------------------------------------------------------
# classify --offload-gb


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("abc", "'abc' is not a number of GB"),
        ("0,nan", "each size must be in [0, 1e+06] GB, got nan"),
        ("-1", "each size must be in [0, 1e+06] GB, got -1"),
        ("1e300", "each size must be in [0, 1e+06] GB, got 1e300"),
        ("1,,2", "'' is not a number of GB"),
    ],
)
def test_a_hostile_offload_size_is_one_line(text: str, words: str, tmp_path: Path) -> None:
    with pytest.raises(RooftraceError) as err:
        parse_offload_sizes(text)
    assert words in str(err.value)
    res = CliRunner().invoke(main, ["classify", "--store", str(tmp_path / "store"), "--offload-gb", text])
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0]


def test_offload_needs_a_bounded_gpu_tier() -> None:
    with pytest.raises(RooftraceError, match="--offload-gb needs --capacity"):
        ClassifyOptions(offload_gb=(256.0,))
    assert parse_offload_sizes("0, 256,512") == (0.0, 256.0, 512.0)


# --------------------------------------------------------------------------------------------
# the replay: a pre-pass turns lower-tier hits into reported hits that arrive after their load

FLEET = {
    "name": "off",
    "model": "llama-3.1-8b",
    "hardware": "h100-sxm",
    "engine": {"num_gpu_blocks_override": 300, "block_size": 16},
}
#: Llama-3.1-8B's KV in bf16 on one GPU: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes.
LLAMA_8B_KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2


def _replay(rows: list[dict[str, Any]], **fleet: Any) -> Any:
    from pipeline.replay.fleet import parse_fleet, resolve
    from pipeline.replay.run import ReplayOptions, run_replay

    return run_replay(requests_frame(rows), resolve(parse_fleet({**FLEET, **fleet}, "f")), ReplayOptions())


def test_a_replayed_offload_hit_costs_the_load_not_the_prefill() -> None:
    """One replica of 300 blocks of 16 tokens. A (3,000 + 10 tokens: 188 full blocks), then B
    (188 more) push A's tail out of the GPU tier; A's second turn (3,210 tokens, 3,010 shared)
    finds A's first 112 blocks in the GPU tier (distances 189..300) and the other 76 (1,216
    tokens) only in a 100 GB host tier. It then computes 3,210 − 188 x 16 = 202 prompt tokens
    instead of the 1,434 the GPU cache alone leaves, and is admitted after its load:
    1,216 x 131,072 B / 50 GB/s + 10 µs = 3.1977 ms after its arrival, on an idle replica."""
    rows = [
        {"t": 0, "recorded_input_tokens": 3000, "output_tokens": 10, "session_id": "A"},
        {"t": 10, "recorded_input_tokens": 3000, "output_tokens": 10, "session_id": "B"},
        {"t": 20, "recorded_input_tokens": 3210, "output_tokens": 10, "session_id": "A"},
    ]
    alone = _replay(rows).result
    run = _replay(rows, kv_offload={"kind": "cpu", "capacity_gb": 100})
    res = run.result
    load = 1216 * LLAMA_8B_KV_BYTES_PER_TOKEN / 50e9 + 10e-6
    assert res.cache_hit_tokens.tolist() == [0, 0, 188 * 16]
    assert res.prefill_tokens.tolist() == [3000, 3000, 202]
    assert alone.prefill_tokens[2] == 1434  # what the GPU tier alone leaves (the engine's own LRU)
    assert res.arrival_s.tolist() == [0.0, 10.0, 20.0]  # the logged arrival: the load is in queue_s and ttft_s
    assert res.scheduled_s[2] - res.arrival_s[2] == pytest.approx(load, rel=1e-9)
    assert res.first_token_s[2] - 20.0 < alone.first_token_s[2] - 20.0  # loading beats recomputing here
    assert run.kv_offload["routing"] == "replica"
    assert run.kv_offload["offload_hit_tokens"] == 1216 and run.kv_offload["requests_loading"] == 1
    assert run.kv_offload["load_s_max"] == pytest.approx(load, rel=1e-12)


def test_an_offloaded_agent_day_keeps_every_row_in_its_place() -> None:
    """Rows in = rows out: every request of the day comes back once, in the day's order, at its
    logged arrival; the tier loads only where a GPU tier of its size would have lost the block,
    and the fresh prefill falls."""
    rows = agent_day(seed=3, sessions=12, turns=4)
    engine = {"num_gpu_blocks_override": 1500, "block_size": 16}  # 24k tokens a replica; the day holds ~100k
    base = _replay(rows, replicas=2, router="round_robin", engine=engine)
    run = _replay(rows, replicas=2, router="round_robin", engine=engine, kv_offload={"kind": "cpu", "capacity_gb": 200})
    res, day = run.result, base.result
    assert res.arrival_s.shape[0] == len(rows)
    assert res.arrival_s.tolist() == day.arrival_s.tolist()
    assert (res.reject_reason == 0).all() and np.isfinite(res.finish_s).all()
    assert int(res.prefill_tokens.sum()) < int(day.prefill_tokens.sum())
    assert run.kv_offload["requests_loading"] > 0
    assert (res.scheduled_s >= res.arrival_s).all()


def test_a_stateful_router_pools_the_tiers_and_a_closed_loop_is_refused() -> None:
    """Least outstanding routes by the engines' state: the pre-pass pools the replicas' GPU tiers
    (and their loads are fewer than per replica: a prefix is no longer split over two caches)."""
    rows = agent_day(seed=3, sessions=30, turns=4)
    engine = {"num_gpu_blocks_override": 1500, "block_size": 16}
    tier = {"kind": "shared", "capacity_gb": 500}
    pooled = _replay(rows, replicas=2, router="least_outstanding", engine=engine, kv_offload=tier)
    routed = _replay(rows, replicas=2, router="round_robin", engine=engine, kv_offload=tier)
    assert pooled.kv_offload["routing"] == "pooled" and routed.kv_offload["routing"] == "replica"
    assert 0 < pooled.kv_offload["requests_loading"] < routed.kv_offload["requests_loading"]
    assert pooled.result.arrival_s.shape[0] == len(rows)
    # no prefix caching: nothing cached, nothing loads, the day replays as it is
    off = _replay(rows[:5], engine={**engine, "enable_prefix_caching": False}, kv_offload=tier)
    assert off.kv_offload["routing"] == "none" and off.kv_offload["requests_loading"] == 0
    from pipeline.replay.fleet import parse_fleet, resolve
    from pipeline.replay.run import ReplayOptions, run_replay

    fleet = resolve(parse_fleet({**FLEET, "kv_offload": {"kind": "cpu", "capacity_gb": 10}}, "f"))
    with pytest.raises(ConfigError, match=r"^fleet 'off' \[kv_offload\]: a load delays its request's admission"):
        run_replay(requests_frame(rows), fleet, ReplayOptions(concurrency=4))


def test_a_pool_has_its_own_tier_or_the_fleets(tmp_path: Path) -> None:
    """[kv_offload] at the top is every pool's default; a pool's own replaces it (per pool, as a
    shared store serves one pool)."""
    from pipeline.replay.pools import PooledFleet, load_fleet_file

    path = tmp_path / "pools.toml"
    path.write_text(
        'name = "p"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n'
        '[kv_offload]\nkind = "cpu"\ncapacity_gb = 100\n'
        '[[pool]]\nname = "long"\n[pool.match]\nmin_input_tokens = 2048\n'
        '[pool.kv_offload]\nkind = "shared"\ncapacity_gb = 2000\n'
        '[[pool]]\nname = "rest"\n'
    )
    fleet = load_fleet_file(path)
    assert isinstance(fleet, PooledFleet)
    tiers = {p.name: p.config.kv_offload for p in fleet.pools}
    assert tiers == {
        "long": OffloadTier("shared", 2000.0, 50.0, 50.0),
        "rest": OffloadTier("cpu", 100.0, 50.0, 10.0, 256.0),
    }


def test_the_tier_defaults_cite_their_sources() -> None:
    """Every default of pipeline/catalog/offload.toml has a [sources] line; the cpu tier's
    bandwidth stays under PCIe 5.0 x16's raw 63 GB/s per direction, the shared tier's at
    400 Gb/s = 50 GB/s, and the host memory per GPU is DGX H100's 2 TB over 8 GPUs."""
    from pipeline.catalog.entries import CATALOG_DIR
    from pipeline.classify.offload import offload_kinds
    from pipeline.common.tomlfile import read_toml

    sources = read_toml(CATALOG_DIR / "offload.toml")["sources"]
    kinds = offload_kinds()
    assert set(kinds) == {"cpu", "shared"}
    for kind in kinds:
        assert sources[f"{kind}_bandwidth"] and sources[f"{kind}_latency"]
    assert "DGX H100" in sources["cpu_host_memory"] and kinds["cpu"]["host_memory_gb_per_gpu"] == 2048 / 8
    assert kinds["cpu"]["bandwidth_gb_s"] < 32 * 16 * 128 / 130 / 8  # 63.0 GB/s raw
    assert kinds["shared"]["bandwidth_gb_s"] == 400 / 8


@pytest.mark.parametrize("seed", [1, 2])
def test_the_offloaded_workload_replays_the_same_on_the_engine_and_its_reference(seed: int) -> None:
    """The pre-pass hands the engines an ordinary workload (delayed arrivals, reported hits): the
    compiled engine and the per-step reference agree on it request by request, as on any."""
    from test_engine import _assert_same

    from pipeline.engine.jit import simulate_jit
    from pipeline.engine.reference import simulate_reference
    from pipeline.replay.fleet import parse_fleet, resolve
    from pipeline.replay.offload import fleet_offload
    from pipeline.replay.run import ReplayOptions, build_workload

    rows = agent_day(seed=seed, sessions=12, turns=3)
    cfg = {
        **FLEET,
        "replicas": 2,
        "router": "round_robin",
        "engine": {"num_gpu_blocks_override": 600, "block_size": 16},
        "kv_offload": {"kind": "cpu", "capacity_gb": 100},
    }
    fleet = resolve(parse_fleet(cfg, "f"))
    options = ReplayOptions()
    work = build_workload(requests_frame(rows), fleet, options)
    spec = fleet.spec(options.mode, 0, 0.0, 0.0)
    plan = fleet_offload(work, fleet, spec)
    assert plan is not None and plan.summary()["requests_loading"] > 0
    cost = fleet.cost_model.table
    _assert_same(simulate_jit(plan.work, spec, cost), simulate_reference(plan.work.explicit(), spec, cost))


def test_the_cache_split_note_names_the_tier() -> None:
    """The replay's hits differ from classify's: the note says the lower tier served some."""
    from pipeline.replay.run import cache_split_note

    split = {
        "requests": 2,
        "recorded_input_tokens": 100,
        "cache_hit_tokens": 60,
        "by_source": {"prefix_cache": {"requests": 2, "recorded_input_tokens": 100, "cache_hit_tokens": 60}},
    }
    classified = {
        "requests": 2,
        "cache_hit_tokens": 20,
        "cache_hit_source": {"simulated": {"requests": 2, "cache_hit_tokens": 20}},
        "capacity": "40000000000 bytes",
    }
    resolved = {"fleet": {"replicas": 2}, "scheduler": {"num_gpu_blocks": 300, "block_size": 16}}
    plain = cache_split_note(split, classified, {"resolved": resolved})
    tier = {"kind": "cpu", "capacity_gb": 200.0}
    with_tier = cache_split_note(
        split, classified, {"resolved": {**resolved, "fleet": {"replicas": 2, "kv_offload": tier}}}
    )
    assert plain is not None and with_tier is not None
    assert "[kv_offload]" not in plain
    assert "shared with running requests) and the fleet's [kv_offload] cpu tier served 60 tokens" in with_tier


# --------------------------------------------------------------------------------------------
# three levels: GPU, then each replica's host DRAM (cpu), then a store shared by the pool


def _brute_force_three(
    chains: list[list[int]],
    lookups: list[int],
    replica_of: list[int | None],
    gpu: int,
    cpu: int,
    store: int,
    pooled: bool = False,
) -> tuple[list[int], list[int], list[int]]:
    """Three kinds of plain LRU list (most recent first): a GPU list and a cpu list per replica,
    fed by that replica's requests, and one store list fed by every request (``replica_of``:
    None for a request skipped, -1 for one no replica's tiers see). Per request: the leading
    blocks its replica's GPU list holds, then the run continues through blocks its cpu list
    holds, then through blocks the store holds; then every block is touched tail first in each
    list the request feeds (write-through everywhere) and each is cut to its capacity.
    ``pooled``: every replica's GPU and cpu lists are one each, of the replicas' sizes together."""
    n_rep = max([r for r in replica_of if r is not None] + [0]) + 1
    g_lists: dict[int, list[int]] = {}
    c_lists: dict[int, list[int]] = {}
    s_list: list[int] = []
    out_g, out_c, out_s = [0] * len(chains), [0] * len(chains), [0] * len(chains)
    for i, (blocks, k, rep) in enumerate(zip(chains, lookups, replica_of, strict=True)):
        if rep is None:
            continue
        key = 0 if pooled else rep
        own = (g_lists.setdefault(key, []), c_lists.setdefault(key, [])) if rep >= 0 else ([], [])
        g_cap, c_cap = (gpu * n_rep, cpu * n_rep) if pooled else (gpu, cpu)
        n = 0
        while n < k and blocks[n] in own[0]:
            n += 1
        out_g[i] = n
        while n < k and (blocks[n] in own[0] or blocks[n] in own[1]):
            n += 1
        out_c[i] = n - out_g[i]
        while n < k and (blocks[n] in own[0] or blocks[n] in own[1] or blocks[n] in s_list):
            n += 1
        out_s[i] = n - out_g[i] - out_c[i]
        lists = ((own[0], g_cap), (own[1], c_cap), (s_list, store)) if rep >= 0 else ((s_list, store),)
        for lst, cap in lists:
            for b in reversed(blocks):
                if b in lst:
                    lst.remove(b)
                lst.insert(0, b)
            del lst[cap:]
    return out_g, out_c, out_s


def _layout(chains: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    flat = np.asarray([b for c in chains for b in c], dtype=np.uint64)
    return flat, np.concatenate([[0], np.cumsum([len(c) for c in chains])]).astype(np.int64)


@settings(max_examples=300, deadline=None)
@given(traces(), st.integers(0, 12), st.integers(0, 30), st.integers(0, 60))
def test_three_levels_on_one_access_sequence_equal_three_explicit_lru_lists(
    trace: Any, gpu: int, cpu: int, store: int
) -> None:
    """classify's view (one cache for the model's traffic): the stack distances' three tiers
    (tiers_hits) are three explicit LRU lists on one stream, and so is the replay's direct
    simulation of one replica."""
    from pipeline.classify.offload import tiers_hits
    from pipeline.replay.offload import tier_runs

    chains, lookups = trace
    flat, offsets = _layout(chains)
    look = np.asarray(lookups, np.int64)
    want = _brute_force_three(chains, lookups, [0] * len(chains), gpu, cpu, store)
    got = tiers_hits(P.request_distances(flat, offsets, look), gpu, [cpu, store])
    assert [h.tolist() for h in got] == [list(w) for w in want]
    rows = np.arange(len(chains), dtype=np.int64)
    g, near, total = tier_runs(flat, offsets, look, rows, None, 1, gpu, cpu, store)
    assert (g.tolist(), (near - g).tolist(), (total - near).tolist()) == tuple(list(w) for w in want)


@settings(max_examples=300, deadline=None)
@given(
    traces(),
    st.integers(1, 3),
    st.integers(0, 2**60),
    st.integers(0, 12),
    st.integers(0, 30),
    st.integers(0, 60),
    st.integers(1, 4),
)
def test_the_pre_passs_three_levels_equal_explicit_lru_lists_per_replica_and_for_the_pool(
    trace: Any, replicas: int, pick: int, gpu: int, cpu: int, store: int, workers: int
) -> None:
    """The replay's pre-pass (tier_runs): each replica's own GPU and cpu lists on its own
    requests, one store on the whole pool's, some requests skipped (rejected) and some seen by
    the store alone (no replica's route); and, pooled, one GPU and one cpu list of the replicas'
    sizes together. Each tier's hits are the brute force's, in one thread or in ``workers``."""
    from pipeline.replay.offload import tier_runs

    chains, lookups = trace
    flat, offsets = _layout(chains)
    draws = [(pick >> (2 * i)) % 4 for i in range(len(chains))]  # 0: skipped, 1: no route, else a replica
    replica_of: list[int | None] = [
        None if d == 0 else -1 if d == 1 else (i + d) % replicas for i, d in enumerate(draws)
    ]
    rows = np.asarray([i for i, r in enumerate(replica_of) if r is not None], np.int64)
    routes = np.asarray([-1 if r is None else r for r in replica_of], np.int64)
    look = np.asarray(lookups, np.int64)
    want = _brute_force_three(chains, lookups, replica_of, gpu, cpu, store)
    g, near, total = tier_runs(flat, offsets, look, rows, routes, replicas, gpu, cpu, store, workers)
    assert (g.tolist(), (near - g).tolist(), (total - near).tolist()) == tuple(list(w) for w in want)
    # pooled: the router keeps state, the pool is one cache (every live row the replicas' together)
    pooled_of = [None if r is None else 0 for r in replica_of]
    want = _brute_force_three(chains, lookups, pooled_of, gpu * replicas, cpu * replicas, store)
    g, near, total = tier_runs(flat, offsets, look, rows, None, replicas, gpu, cpu, store)
    assert (g.tolist(), (near - g).tolist(), (total - near).tolist()) == tuple(list(w) for w in want)


def test_classify_tabulates_a_cpu_by_store_grid_by_hand() -> None:
    """The day of test_classify_splits_hits_between_the_tiers_by_hand: A's second turn looks up
    A0..A2 at distances 4, 5, 6 (block size 4, 4 MB a block). A 3-block GPU tier holds none; a
    0.016 GB host tier (4 blocks) holds A0; a store of 0.020 GB (5 blocks) reaches A1, of 0.024
    GB (6) A2. Each cell: the host tier's tokens, the store's (those past the host tier), fresh."""
    opts = ClassifyOptions(
        block_size=4,
        capacity=Capacity(tokens=12),
        kv_bytes_per_token=1e6,
        offload_gb=(0.0, 0.016),
        shared_gb=(0.0, 0.020, 0.024),
    )
    rows = account(requests_frame(SESSIONS), opts).summary["offload"]
    got = [
        (r["offload_gb"], r["shared_gb"], r["gpu_hit_tokens"], r["offload_hit_tokens"], r["shared_hit_tokens"])
        for r in rows
    ]
    assert got == [
        (0.0, 0.0, 0, 0, 0),
        (0.0, 0.020, 0, 0, 8),
        (0.0, 0.024, 0, 0, 12),
        (0.016, 0.0, 0, 4, 0),
        (0.016, 0.020, 0, 4, 4),
        (0.016, 0.024, 0, 4, 8),
    ]
    assert [r["fresh_input_tokens"] for r in rows] == [31, 23, 19, 27, 23, 19]
    assert [r["shared_capacity_blocks"] for r in rows] == [0, 5, 6, 0, 5, 6]
    assert [(r["offload_load_bytes"], r["shared_load_bytes"]) for r in rows][-1] == (4_000_000, 8_000_000)
    assert [r["requests_loading"] for r in rows] == [0, 1, 1, 1, 1, 1]
    assert [r["requests_loading_shared"] for r in rows] == [0, 1, 1, 0, 1, 1]
    # without --shared-gb the table is the one-tier table, key for key
    one = account(requests_frame(SESSIONS), replace_opts(opts, shared_gb=())).summary["offload"]
    assert [set(r) for r in one] == [
        {
            "model",
            "offload_gb",
            "gpu_capacity_blocks",
            "offload_capacity_blocks",
            "recorded_input_tokens",
            "gpu_hit_tokens",
            "offload_hit_tokens",
            "fresh_input_tokens",
            "offload_load_bytes",
            "requests_loading",
        }
    ] * 2
    with pytest.raises(RooftraceError, match="--shared-gb needs --offload-gb"):
        ClassifyOptions(capacity=Capacity(tokens=12), shared_gb=(1.0,))


def replace_opts(opts: ClassifyOptions, **kw: Any) -> ClassifyOptions:
    from dataclasses import replace

    return replace(opts, **kw)


#: The day of the hand-computed three-level replay: A's turns on replica 0, 1, 0 (round robin),
#: B and C fillers on 0 and 1.
THREE_LEVELS_DAY = [
    {"t": 0, "recorded_input_tokens": 3000, "output_tokens": 10, "session_id": "A"},
    {"t": 5, "recorded_input_tokens": 3210, "output_tokens": 10, "session_id": "A"},
    {"t": 10, "recorded_input_tokens": 3000, "output_tokens": 10, "session_id": "B"},
    {"t": 15, "recorded_input_tokens": 3000, "output_tokens": 10, "session_id": "C"},
    {"t": 20, "recorded_input_tokens": 3500, "output_tokens": 10, "session_id": "A"},
]
THREE_LEVELS = {"kind": "cpu", "capacity_gb": 0.84, "shared": {"capacity_gb": 1.26, "bandwidth_gb_s": 25}}


def test_a_request_served_by_the_gpu_the_host_and_the_store_by_hand() -> None:
    """Two replicas of 300 blocks of 16 tokens, round robin; a block is 16 x 131,072 B = 2,097,152
    B, so the 0.84 GB host tier per replica holds 400 blocks and the 1.26 GB store 600.
    A1 (replica 0) writes A0..A187 (3,010 tokens: 188 full blocks) to replica 0's tiers and the
    store. A2 (replica 1, 3,210 tokens, 3,010 shared) finds nothing on replica 1 and A0..A187 in
    the store: 188 blocks = 3,008 tokens over 25 GB/s + 50 µs = 15.8206 ms; it writes A0..A200.
    B (replica 0) and C (replica 1) write 188 blocks each. A3 (replica 0, 3,500 tokens, 3,220
    shared) looks up (3,500 − 1) // 16 = 218 blocks: A_j sits at distance 188 + j + 1 on replica
    0, so the GPU tier holds j ≤ 111 (112 blocks), the host tier (376 ≤ 400) the other 76 (1,216
    tokens); A188..A200 (13 blocks, 208 tokens) only A2 wrote, to replica 1's tiers and the store,
    where they sit at distance ≤ 376 + 201 = 577 ≤ 600. Its load: 1,216 x 131,072 B / 50 GB/s +
    10 µs, then 208 x 131,072 B / 25 GB/s + 50 µs = 3.1977 + 1.1405 = 4.3382 ms (serial)."""
    run = _replay(THREE_LEVELS_DAY, replicas=2, router="round_robin", kv_offload=THREE_LEVELS)
    res, kv = run.result, run.kv_offload
    B = LLAMA_8B_KV_BYTES_PER_TOKEN
    a2 = 3008 * B / 25e9 + 50e-6
    a3 = (1216 * B / 50e9 + 10e-6) + (208 * B / 25e9 + 50e-6)
    assert res.cache_hit_tokens.tolist() == [0, 188 * 16, 0, 0, 201 * 16]
    assert res.prefill_tokens.tolist() == [3000, 3210 - 3008, 3000, 3000, 3500 - 3216]
    assert (res.scheduled_s - res.arrival_s).tolist() == pytest.approx([0, a2, 0, 0, a3], rel=1e-9, abs=1e-12)
    assert res.arrival_s.tolist() == [0.0, 5.0, 10.0, 15.0, 20.0]
    assert kv["routing"] == "replica" and kv["requests_loading"] == 2
    assert kv["offload_hit_tokens"] == 3008 + 1216 + 208
    assert kv["by_tier"] == {
        "cpu": {"requests_loading": 1, "hit_tokens": 1216},
        "shared": {"requests_loading": 2, "hit_tokens": 3008 + 208},
    }
    assert kv["load_s_max"] == pytest.approx(a2, rel=1e-12)
    assert kv["shared"] == {"capacity_gb": 1.26, "bandwidth_gb_s": 25.0, "latency_us": 50.0}
    from pipeline.replay.offload import offload_line

    line = offload_line(kv)
    assert line.startswith("kv offload (cpu 0.84 GB per replica, 50 GB/s, 10 µs, then shared 1.26 GB shared by the")
    assert "2 requests loaded 4,432 tokens (cpu 1,216 tokens to 1, shared 3,216 tokens to 2)" in line
    # the host tier alone: A2 loads nothing (replica 1 never saw A), A3 loads its 76 blocks only
    alone = _replay(THREE_LEVELS_DAY, replicas=2, router="round_robin", kv_offload={"kind": "cpu", "capacity_gb": 0.84})
    assert alone.result.cache_hit_tokens.tolist() == [0, 0, 0, 0, 188 * 16]
    assert "by_tier" not in alone.kv_offload and "shared" not in alone.kv_offload
    assert offload_line(alone.kv_offload).endswith(
        "1 requests loaded 1,216 tokens, waiting 0.003 s in all, at most 3.20 ms"
    )


def test_an_empty_store_below_the_host_tier_changes_nothing() -> None:
    """A 0 GB store holds nothing: every request, arrival and latency as with the host tier alone."""
    rows = agent_day(seed=3, sessions=12, turns=4)
    engine = {"num_gpu_blocks_override": 1500, "block_size": 16}
    fleet = {"replicas": 2, "router": "round_robin", "engine": engine}
    one = _replay(rows, **fleet, kv_offload={"kind": "cpu", "capacity_gb": 20}).result
    three = _replay(rows, **fleet, kv_offload={"kind": "cpu", "capacity_gb": 20, "shared": {"capacity_gb": 0}})
    for col in ("scheduled_s", "first_token_s", "finish_s", "cache_hit_tokens", "prefill_tokens"):
        assert getattr(three.result, col).tolist() == getattr(one, col).tolist()
    assert three.kv_offload["by_tier"]["shared"] == {"requests_loading": 0, "hit_tokens": 0}


def test_a_three_level_agent_day_keeps_every_row_and_the_store_serves_across_replicas() -> None:
    """Rows in = rows out; round robin spreads each session over both replicas, so a host tier
    per replica misses what the other replica computed and the pool's store serves it: more
    tokens load, and less is prefilled, than with the host tier alone."""
    rows = agent_day(seed=3, sessions=12, turns=4)
    engine = {"num_gpu_blocks_override": 1500, "block_size": 16}
    fleet = {"replicas": 2, "router": "round_robin", "engine": engine}
    host = _replay(rows, **fleet, kv_offload={"kind": "cpu", "capacity_gb": 20})
    run = _replay(rows, **fleet, kv_offload={"kind": "cpu", "capacity_gb": 20, "shared": {"capacity_gb": 500}})
    res = run.result
    assert res.arrival_s.shape[0] == len(rows) and res.arrival_s.tolist() == host.result.arrival_s.tolist()
    assert (res.reject_reason == 0).all() and np.isfinite(res.finish_s).all()
    by = run.kv_offload["by_tier"]
    assert by["shared"]["hit_tokens"] > 0
    assert by["cpu"]["hit_tokens"] + by["shared"]["hit_tokens"] == run.kv_offload["offload_hit_tokens"]
    assert run.kv_offload["offload_hit_tokens"] > host.kv_offload["offload_hit_tokens"]
    assert int(res.prefill_tokens.sum()) < int(host.result.prefill_tokens.sum())
    assert (res.scheduled_s >= res.arrival_s).all()


@pytest.mark.parametrize("seed", [1, 2])
def test_the_three_level_workload_replays_the_same_on_the_engine_and_its_reference(seed: int) -> None:
    from test_engine import _assert_same

    from pipeline.engine.jit import simulate_jit
    from pipeline.engine.reference import simulate_reference
    from pipeline.replay.fleet import parse_fleet, resolve
    from pipeline.replay.offload import fleet_offload
    from pipeline.replay.run import ReplayOptions, build_workload

    rows = agent_day(seed=seed, sessions=12, turns=3)
    cfg = {
        **FLEET,
        "replicas": 2,
        "router": "round_robin",
        "engine": {"num_gpu_blocks_override": 600, "block_size": 16},
        "kv_offload": {"kind": "cpu", "capacity_gb": 12, "shared": {"capacity_gb": 200}},
    }
    fleet = resolve(parse_fleet(cfg, "f"))
    options = ReplayOptions()
    work = build_workload(requests_frame(rows), fleet, options)
    spec = fleet.spec(options.mode, 0, 0.0, 0.0)
    plan = fleet_offload(work, fleet, spec)
    assert plan is not None and plan.summary()["by_tier"]["shared"]["requests_loading"] > 0
    cost = fleet.cost_model.table
    _assert_same(simulate_jit(plan.work, spec, cost), simulate_reference(plan.work.explicit(), spec, cost))


def test_a_fleet_states_both_lower_tiers_and_its_record_reads_back(tmp_path: Path) -> None:
    cfg = load_fleet(_fleet(tmp_path, 'kind = "cpu"\ncapacity_gb = 200\n[kv_offload.shared]\ncapacity_gb = 4000'))
    store = OffloadTier("shared", 4000.0, 50.0, 50.0)
    assert cfg.kv_offload == OffloadTier("cpu", 200.0, 50.0, 10.0, 256.0, store)
    recorded = cfg.to_dict()["kv_offload"]
    assert recorded["shared"] == {"capacity_gb": 4000.0, "bandwidth_gb_s": 50.0, "latency_us": 50.0}
    assert fleet_from_dict(cfg.to_dict(), "config.json").kv_offload == cfg.kv_offload
    # a one-tier fleet's record has no "shared" key: its run id is what it was
    one = load_fleet(_fleet(tmp_path, 'kind = "cpu"\ncapacity_gb = 200')).to_dict()["kv_offload"]
    assert "shared" not in one
    # the example fleet
    example = load_fleet(Path(__file__).resolve().parents[1] / "fleets" / "offload-cpu-shared.toml")
    assert example.kv_offload is not None and example.kv_offload.shared is not None


@pytest.mark.parametrize(
    ("table", "where", "words"),
    [
        (
            'kind = "shared"\ncapacity_gb = 9\n[kv_offload.shared]\ncapacity_gb = 9',
            "[kv_offload.shared]",
            "kind cpu only",
        ),
        ('kind = "cpu"\ncapacity_gb = 9\nshared = 5', "[kv_offload]", "shared must be a table"),
        (
            'kind = "cpu"\ncapacity_gb = 9\n[kv_offload.shared]\nbandwidth_gb_s = 9',
            "[kv_offload.shared]",
            "capacity_gb",
        ),
        (
            'kind = "cpu"\ncapacity_gb = 9\n[kv_offload.shared]\ncapacity_gb = nan',
            "[kv_offload.shared]",
            "capacity_gb must be a number of GB in [0, 1e+06], got nan",
        ),
        (
            'kind = "cpu"\ncapacity_gb = 9\n[kv_offload.shared]\ncapacity_gb = 1e300',
            "[kv_offload.shared]",
            "got 1e+300",
        ),
        (
            'kind = "cpu"\ncapacity_gb = 9\n[kv_offload.shared]\ncapacity_gb = 9\nbandwidth_gb_s = 0',
            "[kv_offload.shared]",
            "bandwidth_gb_s must be a number of GB/s in (0, 10000]",
        ),
        (
            'kind = "cpu"\ncapacity_gb = 9\n[kv_offload.shared]\ncapacity_gb = 9\nlatency_us = -1',
            "[kv_offload.shared]",
            "latency_us must be a number of µs in [0, 1e+06], got -1",
        ),
        (
            'kind = "cpu"\ncapacity_gb = 9\n[kv_offload.shared]\ncapacity_gb = 9\nhost_memory_gb = 9',
            "[kv_offload.shared]",
            "unknown key(s) ['host_memory_gb']",
        ),
        ('kind = "cpu"\ncapacity_gb = 9\n[kv_offload.shared]\ncapacity_gb = "big"', "[kv_offload.shared]", "'big'"),
    ],
)
def test_a_hostile_store_below_the_tier_is_one_line(tmp_path: Path, table: str, where: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_fleet(_fleet(tmp_path, table))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / 'f.toml'} {where}") and words in msg, msg


def test_parse_offload_checks_a_store_given_without_the_schema() -> None:
    """The plan and a run's record call parse_offload on plain dicts: the same refusals."""
    with pytest.raises(ConfigError, match=r"^x \[kv_offload\.shared\]: expected a table"):
        parse_offload({"kind": "cpu", "capacity_gb": 1, "shared": 3}, "x [kv_offload]", 1)
    with pytest.raises(ConfigError, match=r"^x \[kv_offload\.shared\]: unknown key\(s\) \['size'\]"):
        parse_offload({"kind": "cpu", "capacity_gb": 1, "shared": {"capacity_gb": 1, "size": 2}}, "x [kv_offload]", 1)
    with pytest.raises(ConfigError, match=r"^x \[kv_offload\.shared\]: capacity_gb is required"):
        parse_offload({"kind": "cpu", "capacity_gb": 1, "shared": {}}, "x [kv_offload]", 1)
    with pytest.raises(RooftraceError, match="none below it"):
        OffloadTier("cpu", 1.0, 50.0, 10.0).loads_s([1], [1], 1e6)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--offload-gb", "1", "--shared-gb", "-5"], "--shared-gb '-5': each size must be in [0, 1e+06] GB, got -5"),
        (["--offload-gb", "1", "--shared-gb", "x"], "--shared-gb 'x': 'x' is not a number of GB"),
        (["--offload-gb", "1", "--shared-gb", "inf"], "--shared-gb 'inf': each size must be in [0, 1e+06] GB"),
    ],
)
def test_a_hostile_shared_size_is_one_line(args: list[str], words: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["classify", "--store", str(tmp_path / "store"), *args])
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], res.output


#: sha256 (first 16 hex digits) of a one-tier replay's pre-pass arrays (GPU-tier hits, lower-tier
#: hits, load seconds, delayed arrivals) and its results (arrival, scheduled, first token, finish,
#: cache hits, prefill), as the code before the third level computed them (commit 970410b, run
#: 2026-12-07 on this day: agent_day(seed=5, sessions=16, turns=4), 2 replicas of 1,200 blocks),
#: with the tokens it loaded and the requests that loaded.
ONE_TIER_BEFORE = {
    "cpu-rr": ("round_robin", {"kind": "cpu", "capacity_gb": 30}, 1200, 1, 18720, 7, "1d9d7ff684fad18f"),
    "shared-rr": (
        "round_robin",
        {"kind": "shared", "capacity_gb": 60, "bandwidth_gb_s": 20},
        1200,
        1,
        62144,
        22,
        "a82bd81d9f34c595",
    ),
    "cpu-lo": ("least_outstanding", {"kind": "cpu", "capacity_gb": 30}, 1200, 1, 7456, 3, "7ab65e7f9c65acbe"),
    "shared-lo": ("least_outstanding", {"kind": "shared", "capacity_gb": 60}, 1200, 1, 7456, 3, "7ee0dc177f731601"),
    "cpu-dp2-lo": ("least_outstanding", {"kind": "cpu", "capacity_gb": 30}, 300, 2, 20960, 8, "76ce16bf20899cab"),
}


@pytest.mark.parametrize("case", sorted(ONE_TIER_BEFORE))
def test_one_tier_results_are_what_they_were_before_the_third_level(case: str) -> None:
    import hashlib

    from pipeline.replay.fleet import parse_fleet, resolve
    from pipeline.replay.offload import fleet_offload
    from pipeline.replay.run import ReplayOptions, build_workload, run_replay

    router, tier, blocks, dp, tokens, loading, digest = ONE_TIER_BEFORE[case]
    rows = agent_day(seed=5, sessions=16, turns=4)
    engine = {"num_gpu_blocks_override": blocks, "block_size": 16}
    cfg = {**FLEET, "replicas": 2, "router": router, "dp": dp, "engine": engine, "kv_offload": tier}
    fleet = resolve(parse_fleet(cfg, "f"))
    options = ReplayOptions()
    work = build_workload(requests_frame(rows), fleet, options)
    plan = fleet_offload(work, fleet, fleet.spec(options.mode, 0, 0.0, 0.0))
    assert plan is not None and plan.shared_hit_tokens is None
    h = hashlib.sha256()
    for a in (plan.gpu_hit_tokens, plan.offload_hit_tokens, plan.load_s, plan.work.arrival_s):
        h.update(np.ascontiguousarray(a).tobytes())
    run = run_replay(requests_frame(rows), fleet, options)
    r = run.result
    for a in (r.arrival_s, r.scheduled_s, r.first_token_s, r.finish_s, r.cache_hit_tokens, r.prefill_tokens):
        h.update(np.ascontiguousarray(a).tobytes())
    assert (int(plan.offload_hit_tokens.sum()), int((plan.offload_hit_tokens > 0).sum())) == (tokens, loading)
    assert h.hexdigest()[:16] == digest
    assert "by_tier" not in run.kv_offload


def test_the_report_says_what_each_lower_tier_served() -> None:
    """The report's "Two cache models" table names the tiers below the replicas' caches and
    their hits, per tier with a store below the host tier."""
    from pipeline.publish.report import _two_caches

    kv = {
        **THREE_LEVELS,
        "bandwidth_gb_s": 50.0,
        "latency_us": 10.0,
        "shared": {"capacity_gb": 1.26, "bandwidth_gb_s": 25.0, "latency_us": 50.0},
        "routing": "replica",
        "requests_loading": 2,
        "offload_hit_tokens": 4432,
        "load_s_total": 0.0202,
        "load_s_max": 0.0158,
        "by_tier": {
            "cpu": {"requests_loading": 1, "hit_tokens": 1216},
            "shared": {"requests_loading": 2, "hit_tokens": 3216},
        },
    }
    resolved = {"scheduler": {"num_gpu_blocks": 300, "block_size": 16}}
    html = _two_caches({}, {"summary": {"kv_offload": kv}, "resolved": resolved}, {})
    assert "below it, the fleet&#39;s kv offload (cpu 0.84 GB per replica, 50 GB/s, 10 µs, then shared 1.26 GB" in html
    assert "(cpu 1,216 tokens to 1, shared 3,216 tokens to 2)" in html
    assert "kv offload" not in _two_caches({}, {"summary": {}, "resolved": resolved}, {})


@pytest.mark.parametrize("capacity_gb", [1.5, 2.0])
def test_a_pooled_cpu_tier_is_split_over_a_replicas_dp_ranks(capacity_gb: float) -> None:
    """Pooled (least outstanding), a replica's host DRAM is shared by its dp ranks: 2 replicas of
    dp 2 with a C GB cpu tier each load what 4 replicas of dp 1 with C / 2 GB load (the same 4
    ranks, the same fleet's host DRAM), and less than 4 replicas with C GB each: the tier binds
    on this day at these sizes (1.5 GB: 13,152 against 20,960 tokens)."""
    from pipeline.replay.fleet import parse_fleet, resolve
    from pipeline.replay.offload import fleet_offload
    from pipeline.replay.run import ReplayOptions, build_workload

    rows = agent_day(seed=5, sessions=16, turns=4)

    def loaded(replicas: int, dp: int, gb: float) -> int:
        cfg = {**FLEET, "replicas": replicas, "router": "least_outstanding", "dp": dp,
               "kv_offload": {"kind": "cpu", "capacity_gb": gb}}  # fmt: skip
        fleet = resolve(parse_fleet(cfg, "f"))
        work = build_workload(requests_frame(rows), fleet, ReplayOptions())
        plan = fleet_offload(work, fleet, fleet.spec("open", 0, 0.0, 0.0))
        assert plan is not None and plan.routing == "pooled"
        return int(plan.offload_hit_tokens.sum())

    split = loaded(2, 2, capacity_gb)
    assert split == loaded(4, 1, capacity_gb / 2)
    assert split < loaded(4, 1, capacity_gb)
