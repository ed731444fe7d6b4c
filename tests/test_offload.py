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
