"""Prefix identity and prefix-cache simulation (pipeline.classify.prefix).

The one-pass stack distances are checked against two explicit simulations: the library's
LRUPrefixCache and an independent list-based LRU written here, on random chains, capacities and
TTLs. Session reconstruction is checked against a token-level ground truth.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.classify import prefix as P
from pipeline.common.errors import RooftraceError

# --------------------------------------------------------------------------------------------
# an independent LRU: a plain list, most recent last, with eager TTL expiry


class ListLRU:
    def __init__(self, capacity: int | None, ttl: float | None = None) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self.items: list[int] = []  # least recent first
        self.last: dict[int, float] = {}

    def expire(self, now: float) -> None:
        if self.ttl is None:
            return
        ttl = self.ttl
        dead = [h for h in self.items if now - self.last[h] > ttl]
        for h in dead:
            self.items.remove(h)
            del self.last[h]

    def request(self, touches: Sequence[int], lookups: int, now: float, head_first: bool = False) -> int:
        """Look up the first ``lookups`` blocks (stop at the first miss), then touch all blocks."""
        self.expire(now)
        hits = 0
        for h in touches[:lookups]:
            if h not in self.last:
                break
            hits += 1
        order = list(touches) if head_first else list(reversed(touches))
        for h in order:
            if h in self.last:
                self.items.remove(h)
            self.items.append(h)
            self.last[h] = now
            if self.capacity is not None and len(self.items) > self.capacity:
                old = self.items.pop(0)
                del self.last[old]
        return hits


# --------------------------------------------------------------------------------------------
# hashing


def test_mix64_is_splitmix64() -> None:
    # Vigna's splitmix64 seeded with 0 outputs 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, ...;
    # output k is the finaliser of k * golden, and mix64(x) is the finaliser of x + golden.
    assert int(P.mix64(np.array([0], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF
    assert int(P.mix64(np.array([0x9E3779B97F4A7C15], dtype=np.uint64))[0]) == 0x6E789E6AA1B965F4


def test_key64_is_blake2b() -> None:
    expected = int.from_bytes(hashlib.blake2b(b"tenant-a", digest_size=8).digest(), "little")
    assert P.key64("tenant-a") == expected


def test_string_keys_are_fnv1a_then_splitmix() -> None:
    # FNV-1a 64 reference vectors (Fowler/Noll/Vo test suite): "" is the offset basis.
    fnv = {"": 0xCBF29CE484222325, "a": 0xAF63DC4C8601EC8C, "foobar": 0x85944171F73967E8}
    series = pl.Series(["x", *fnv, "y"]).slice(1, 3)  # a sliced Arrow buffer must still work
    got = P.string_keys(series)
    assert got.tolist() == P.mix64(np.array(list(fnv.values()), dtype=np.uint64)).tolist()
    assert P.string_keys(pl.Series(["a", None])).tolist() == P.string_keys(pl.Series(["a", ""])).tolist()


# --------------------------------------------------------------------------------------------
# classic stack distances


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=80), st.lists(st.integers(0, 15), min_size=1, max_size=5))
def test_stack_distances_equal_explicit_lru_at_every_capacity(seq: list[int], caps: list[int]) -> None:
    dist = P.lru_stack_distances(np.array(seq, dtype=np.uint64))
    for cap in caps:
        lru = ListLRU(cap)
        explicit = [lru.request([h], 1, 0.0) == 1 for h in seq]
        assert list(dist <= cap) == explicit


def test_stack_distances_hand_case() -> None:
    inf = P.INF_DISTANCE
    # a b c a b d a: a's reuse sees {a, b, c}; b's sees {b, c, a}; a's last sees {a, b, d}
    d = P.lru_stack_distances(np.array([1, 2, 3, 1, 2, 4, 1], dtype=np.uint64))
    assert d.tolist() == [inf, inf, inf, 3, 3, inf, 3]
    assert P.lru_stack_distances(np.array([5, 5], dtype=np.uint64)).tolist() == [inf, 1]


# --------------------------------------------------------------------------------------------
# random chains: requests walk a random prefix tree, in several isolation domains


@dataclass
class Workload:
    touches: list[list[int]]
    lookups: list[int]
    times: list[float]


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    n_req = draw(st.integers(1, 25))
    touches: list[list[int]] = []
    lookups: list[int] = []
    times: list[float] = []
    t = 0.0
    for _ in range(n_req):
        domain = draw(st.integers(0, 1))
        length = draw(st.integers(0, 7))
        # block j's identity is its prefix of branch choices: (domain, c_0, ..., c_j)
        path = [draw(st.integers(0, 2)) for _ in range(length)]
        chain = [hash_path((domain, *path[: j + 1])) for j in range(length)]
        touches.append(chain)
        lookups.append(draw(st.integers(0, length)))
        t += draw(st.sampled_from([0.0, 1.0, 5.0, 10.0]))
        times.append(t)
    return Workload(touches, lookups, times)


def hash_path(path: tuple[int, ...]) -> int:
    return P.key64(repr(path))


def _distances(w: Workload, ttl: float | None, running_max: bool = True) -> P.Distances:
    counts = np.array([len(c) for c in w.touches], dtype=np.int64)
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    flat = np.array([h for c in w.touches for h in c], dtype=np.uint64)
    return P.request_distances(
        flat,
        off,
        np.array(w.lookups, dtype=np.int64),
        times_s=np.array(w.times),
        ttl_s=ttl,
        running_max=running_max,
    )


@settings(max_examples=200, deadline=None)
@given(
    workloads(),
    st.lists(st.integers(0, 30), min_size=1, max_size=4),
    st.sampled_from([None, 0.0, 4.0, 12.0]),
)
def test_one_pass_equals_explicit_lru(w: Workload, caps: list[int], ttl: float | None) -> None:
    dist = _distances(w, ttl)
    for cap in [*caps, None]:
        one_pass = dist.hit_blocks(cap).tolist()
        lib = P.LRUPrefixCache(cap, ttl)
        ref = ListLRU(cap, ttl)
        lib_hits = [lib.access(c, t, max_hits=k) for c, k, t in zip(w.touches, w.lookups, w.times, strict=True)]
        ref_hits = [ref.request(c, k, t) for c, k, t in zip(w.touches, w.lookups, w.times, strict=True)]
        assert one_pass == lib_hits == ref_hits


@settings(max_examples=150, deadline=None)
@given(workloads(), st.sampled_from([None, 4.0]))
def test_tail_first_touch_makes_prefix_property_automatic(w: Workload, ttl: float | None) -> None:
    raw = _distances(w, ttl, running_max=False)
    for i in range(len(w.touches)):
        seg = raw.distance[raw.offsets[i] : raw.offsets[i + 1]]
        assert (np.diff(seg) >= 0).all(), "distances must not decrease along a chain"
    assert np.array_equal(raw.distance, _distances(w, ttl).distance)


def test_head_first_touch_would_break_the_prefix_property() -> None:
    # Touching a chain head-first leaves its head least recent: a tight cache evicts the head and
    # keeps the useless tail. Tail-first touching (vLLM frees blocks in reverse) keeps the head.
    chain, other = [1, 2], [3]
    head_first = ListLRU(2)
    head_first.request(chain, 0, 0.0, head_first=True)
    head_first.request(other, 0, 1.0, head_first=True)
    assert 2 in head_first.last and 1 not in head_first.last
    tail_first = ListLRU(2)
    tail_first.request(chain, 0, 0.0)
    tail_first.request(other, 0, 1.0)
    assert 1 in tail_first.last and 2 not in tail_first.last
    assert tail_first.request(chain, 2, 2.0) == 1


@settings(max_examples=50, deadline=None)
@given(workloads(), st.lists(st.integers(0, 40), min_size=2, max_size=6))
def test_hits_are_monotone_in_capacity(w: Workload, caps: list[int]) -> None:
    dist = _distances(w, None)
    caps = sorted(caps)
    totals = [int(dist.hit_blocks(c).sum()) for c in caps]
    assert totals == sorted(totals)
    assert (dist.hit_blocks(None) <= np.array(w.lookups)).all()
    curve = P.hits_by_capacity(dist.distance, 1.0, caps)
    assert curve.tolist() == totals


def test_ttl_expiry_by_age_since_last_use() -> None:
    lru = P.LRUPrefixCache(None, ttl_s=300.0)
    chain = [11, 12, 13]
    assert lru.access(chain, 0.0, max_hits=2) == 0
    assert lru.access(chain, 300.0, max_hits=2) == 2  # age == ttl: still cached
    assert lru.access(chain, 600.5, max_hits=2) == 0  # age 300.5 > ttl: expired
    assert lru.access(chain, 700.0, max_hits=2) == 2  # refreshed at 600.5
    w = Workload([chain] * 4, [2] * 4, [0.0, 300.0, 600.5, 700.0])
    assert _distances(w, 300.0).hit_blocks(None).tolist() == [0, 2, 0, 2]


def test_lru_cache_rejects_bad_settings() -> None:
    with pytest.raises(RooftraceError, match="capacity"):
        P.LRUPrefixCache(-1)
    with pytest.raises(RooftraceError, match="TTL"):
        P.LRUPrefixCache(None, ttl_s=-5)


def test_python_kernels_agree_with_compiled() -> None:
    rng = np.random.default_rng(7)
    seq = rng.integers(0, 40, 500).astype(np.uint64)
    assert np.array_equal(P.lru_stack_distances(seq), P.lru_stack_distances(seq, kernels=P._python_kernels()))
    df = _session_frame(rng, n_sessions=6, turns=5, bs=16)
    slow = P._python_kernels()
    a = P.build_chains(df, 16)
    b = P.build_chains(df, 16, kernels=slow)
    assert np.array_equal(a.hashes, b.hashes) and np.array_equal(a.out_hashes, b.out_hashes)
    plan = P.access_plan(a)
    assert all(np.array_equal(x, y) for x, y in zip(plan, P.access_plan(a, kernels=slow), strict=True))
    times = np.sort(rng.uniform(0, 100, a.n_requests))
    fast_d = P.request_distances(*plan, times_s=times, ttl_s=20.0)
    slow_d = P.request_distances(*plan, times_s=times, ttl_s=20.0, kernels=slow)
    assert np.array_equal(fast_d.distance, slow_d.distance)
    # log chains: the longest-common-prefix table (thousands of distinct prefixes: it is rehashed)
    chains = [[int(x) for x in rng.integers(0, 3, int(rng.integers(1, 40)))] for _ in range(200)]
    log = _frame(
        [
            {"arrival": _t(i), "recorded_input_tokens": 16 * len(c) + 5, "prefix_block_hashes": c}
            for i, c in enumerate(chains)
        ]
    ).with_columns(pl.lit(16, pl.Int32).alias("prefix_block_size"))
    fast_i, slow_i = P.build_identity(log), P.build_identity(log, kernels=slow)
    assert np.array_equal(fast_i.parent, slow_i.parent) and np.array_equal(fast_i.shared, slow_i.shared)
    # against a brute-force longest common prefix over all earlier rows
    for i, c in enumerate(chains):
        best = max((next((k for k in range(min(len(c), len(d))) if c[k] != d[k]), min(len(c), len(d))), -j)
                   for j, d in enumerate(chains[:i])) if i else (0, 0)  # fmt: skip
        assert fast_i.shared[i] == 16 * best[0] and (best[0] == 0 or fast_i.parent[i] == -best[1]), i


# --------------------------------------------------------------------------------------------
# build_chains


def _frame(rows: list[dict[str, object]]) -> pl.DataFrame:
    base: dict[str, object] = {
        "tenant": None,
        "adapter": None,
        "session_id": None,
        "prefix_block_hashes": None,
        "prefix_block_size": None,
        "output_tokens": 10,
        "model": "m",
    }
    full = [{**base, **r, "request_id": r.get("request_id", f"r{i}")} for i, r in enumerate(rows)]
    return pl.DataFrame(
        full,
        schema={
            "request_id": pl.String,
            "arrival": pl.Datetime("us", "UTC"),
            "model": pl.String,
            "tenant": pl.String,
            "adapter": pl.String,
            "session_id": pl.String,
            "recorded_input_tokens": pl.Int64,
            "output_tokens": pl.Int64,
            "prefix_block_hashes": pl.List(pl.UInt64),
            "prefix_block_size": pl.Int32,
        },
    )


def _t(seconds: float) -> int:
    return int(1_700_000_000_000_000 + seconds * 1e6)


def test_log_chains_partial_blocks_and_lengths() -> None:
    df = _frame(
        [
            {
                "arrival": _t(0),
                "recorded_input_tokens": 1100,
                "prefix_block_hashes": [7, 8, 9],
                "prefix_block_size": 512,
            },
            {
                "arrival": _t(1),
                "recorded_input_tokens": 1536,
                "prefix_block_hashes": [7, 8, 10],
                "prefix_block_size": 512,
            },
            {
                "arrival": _t(2),
                "recorded_input_tokens": 1300,
                "prefix_block_hashes": [7],
                "prefix_block_size": 512,
            },
            {"arrival": _t(3), "recorded_input_tokens": 100},
        ]
    )
    ch = P.build_chains(df, block_size=16)
    assert ch.block_size == 512  # the log's block size wins
    assert ch.prompt_blocks().tolist() == [3, 3, 3, 1]
    assert ch.block_tokens.tolist() == [512, 512, 76, 512, 512, 512, 512, 512, 276, 100]
    assert [P.SOURCE_NAMES[s] for s in ch.source] == ["log", "log", "log", "none"]
    assert ch.input_tokens().tolist() == [1100, 1536, 1300, 100]
    assert ch.lookup_blocks().tolist() == [2, 2, 2, 0]  # (n - 1) // 512
    r0, r1, r2 = ch.prompt(0), ch.prompt(1), ch.prompt(2)
    assert r0[0] == r1[0] == r2[0] and r0[1] == r1[1]  # shared log prefix [7, 8]
    assert r2[1] != r0[1]  # a short log chain is extended with blocks of its own
    assert r0[2] != r1[2]  # a partial block never equals a full one, even with the same log id
    assert len(set(ch.hashes.tolist())) == len(ch.hashes) - 3
    assert ch.out_hashes.size == 0


def test_log_block_sizes_must_agree() -> None:
    df = _frame(
        [
            {
                "arrival": _t(0),
                "recorded_input_tokens": 10,
                "prefix_block_hashes": [1],
                "prefix_block_size": 512,
            },
            {
                "arrival": _t(1),
                "recorded_input_tokens": 10,
                "prefix_block_hashes": [1],
                "prefix_block_size": 256,
            },
        ]
    )
    with pytest.raises(RooftraceError, match="prefix_block_size differs"):
        P.build_chains(df)


def test_isolation_keeps_identical_prompts_apart() -> None:
    rows = [
        {
            "arrival": _t(i),
            "recorded_input_tokens": 2048,
            "prefix_block_hashes": [1, 2, 3, 4],
            "prefix_block_size": 512,
            "tenant": tenant,
        }
        for i, tenant in enumerate(["a", "b", "a", None])
    ]
    df = _frame(rows)
    ch = P.build_chains(df)
    a0, b, a1, none = (set(ch.prompt(i).tolist()) for i in range(4))
    assert a0 == a1
    assert not (a0 & b) and not (a0 & none) and not (b & none)
    shared = P.build_chains(df, isolation=("model",))
    assert all(set(shared.prompt(i).tolist()) == set(shared.prompt(0).tolist()) for i in range(4))
    with pytest.raises(RooftraceError, match="isolation keys"):
        P.build_chains(df, isolation=("colour",))


def test_hashes_are_deterministic_across_processes() -> None:
    import subprocess
    import sys

    code = (
        "import polars as pl, numpy as np; from pipeline.classify import prefix as P;"
        "df = pl.DataFrame({'request_id': ['x', 'y'], 'arrival': [0, 1], 'model': ['m', 'm'],"
        "'tenant': ['t', None], 'adapter': [None, None], 'session_id': ['s', 's'],"
        "'recorded_input_tokens': [40, 70], 'output_tokens': [5, 5]},"
        "schema_overrides={'adapter': pl.String, 'arrival': pl.Datetime('us', 'UTC')});"
        "print(','.join(str(int(h)) for h in P.build_chains(df, 16).hashes))"
    )
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert len(outs) == 1 and outs.pop().strip()


# --------------------------------------------------------------------------------------------
# session reconstruction against a token-level ground truth


def _session_frame(rng: np.random.Generator, n_sessions: int, turns: int, bs: int) -> pl.DataFrame:
    frame, _ = _agent_sessions(rng, n_sessions, turns, bs)
    return frame


def _agent_sessions(
    rng: np.random.Generator, n_sessions: int, turns: int, bs: int
) -> tuple[pl.DataFrame, list[np.ndarray]]:
    """Agent loops: each turn re-sends the previous prompt and output, plus new tool output.

    Returns the canonical frame (no token contents: what a log holds) and each request's true
    token sequence (prompt + output) for the ground truth. Sessions interleave in time; two
    tenants reuse the same session ids.
    """
    rows: list[dict[str, object]] = []
    seqs: list[np.ndarray] = []
    events: list[tuple[float, int, int]] = []
    for s in range(n_sessions):
        t = float(rng.uniform(0, 50))
        for k in range(turns):
            events.append((t, s, k))
            t += float(rng.uniform(1, 30))
    events.sort()
    history: dict[int, np.ndarray] = {}
    for t, s, k in events:
        new = rng.integers(0, 2**31, int(rng.integers(1, 3 * bs)))
        prompt = new if k == 0 else np.concatenate([history[s], new])
        output = rng.integers(0, 2**31, int(rng.integers(1, 2 * bs)))
        history[s] = np.concatenate([prompt, output])
        seqs.append(history[s])
        rows.append(
            {
                "request_id": f"s{s}-t{k}",
                "arrival": _t(t),
                "recorded_input_tokens": len(prompt),
                "output_tokens": len(output),
                "session_id": f"sess{s // 2}",  # two tenants share each session id
                "tenant": f"tenant{s % 2}",
            }
        )
    return _frame(rows), seqs


def _true_blocks(tokens: np.ndarray, n_tokens: int, bs: int, tenant: str) -> list[int]:
    """vLLM-style chained hashes of the full blocks of tokens[:n_tokens]."""
    out, parent = [], tenant.encode()
    for j in range(n_tokens // bs):
        parent = hashlib.blake2b(parent + tokens[j * bs : (j + 1) * bs].tobytes(), digest_size=8).digest()
        out.append(int.from_bytes(parent, "little"))
    return out


@pytest.mark.parametrize("capacity", [None, 3, 10, 40])
def test_session_reconstruction_matches_token_level_truth(capacity: int | None) -> None:
    bs = 16
    rng = np.random.default_rng(11)
    df, seqs = _agent_sessions(rng, n_sessions=8, turns=6, bs=bs)
    ch = P.build_chains(df, block_size=bs)
    assert (ch.source == P.SOURCE_SESSION).all()
    plan = P.access_plan(ch)
    times = (df["arrival"].dt.epoch("us").to_numpy() / 1e6).astype(float)
    one_pass = P.request_distances(*plan, times_s=times).hit_blocks(capacity)

    truth = P.LRUPrefixCache(capacity)
    truth_hits = []
    for i, row in enumerate(df.iter_rows(named=True)):
        n_in, n_out = row["recorded_input_tokens"], row["output_tokens"]
        blocks = _true_blocks(seqs[i], n_in + n_out, bs, row["tenant"])
        prompt_full = n_in // bs
        truth_hits.append(
            truth.access(blocks[:prompt_full], times[i], max_hits=(n_in - 1) // bs, extra=blocks[prompt_full:])
        )
    assert one_pass.tolist() == truth_hits
    if capacity is None:
        assert sum(truth_hits) > 0


def test_session_shared_prefix_follows_min_rule() -> None:
    bs = 16
    # turn 2 truncates its context below turn 1's input + output: only min(...) is shared
    rows = [
        {"arrival": _t(0), "recorded_input_tokens": 100, "output_tokens": 40, "session_id": "s"},
        {"arrival": _t(9), "recorded_input_tokens": 300, "output_tokens": 40, "session_id": "s"},
        {"arrival": _t(20), "recorded_input_tokens": 90, "output_tokens": 40, "session_id": "s"},
        {"arrival": _t(30), "recorded_input_tokens": 300, "output_tokens": 40, "session_id": "other"},
    ]
    ch = P.build_chains(_frame(rows), block_size=bs)
    c0, c1, c2, c3 = (ch.cacheable(i).tolist() for i in range(4))
    # turn 1 shares min(100 + 40, 300) = 140 tokens: 8 full blocks, and those come from turn 0's
    # prompt (6 full blocks) and from the 2 blocks turn 0's output completed
    assert len(c0) == 140 // bs == 8 and c1[:8] == c0 and c1[8] != c0[-1]
    # turn 2 shares min(300 + 40, 90) = 90 tokens: 5 full blocks
    assert c2[:5] == c1[:5] and len(ch.prompt(2)) == 6
    assert not set(c3) & set(c0 + c1 + c2)  # another session shares nothing
    # output blocks: (in + out) // 16 - in // 16 = 8-6, 21-18, 8-5, 21-18
    assert np.diff(ch.out_offsets).tolist() == [2, 3, 3, 3]


def _true_prefix_equal(a: np.ndarray, b: np.ndarray, n_tokens: int) -> bool:
    return len(a) >= n_tokens and len(b) >= n_tokens and bool(np.array_equal(a[:n_tokens], b[:n_tokens]))


@pytest.mark.parametrize("bs", [1, 7, 16, 48, 512])
def test_identity_is_exact_at_every_block_size(bs: int) -> None:
    """One identity, cut at any block size, names two blocks alike exactly when the true token
    sequences (agent sessions with a token-level ground truth) agree up to the end of the block
    in the same tenant: the identity itself carries no block size."""
    rng = np.random.default_rng(5)
    df, seqs = _agent_sessions(rng, n_sessions=6, turns=5, bs=16)
    ident = P.build_identity(df)
    hashes, offs = ident.block_hashes(bs)
    tenants = df.get_column("tenant").to_list()
    cached = ident.cached
    n = df.height
    assert cached.tolist() == [len(s) for s in seqs]  # prompt + output for every session turn
    for i in range(n):
        for j in range(n):
            hi, hj = hashes[offs[i] : offs[i + 1]], hashes[offs[j] : offs[j + 1]]
            for m in range(min(hi.size, hj.size)):
                same = tenants[i] == tenants[j] and _true_prefix_equal(seqs[i], seqs[j], (m + 1) * bs)
                assert (hi[m] == hj[m]) == same, (i, j, m)


def test_log_identity_takes_the_longest_common_prefix() -> None:
    """Log chains: the parent is the earlier request with the longest run of equal full blocks,
    and any engine block size works (48 does not divide 512: a block straddling the end of the
    shared run is the request's own)."""
    df = _frame(
        [
            {"arrival": _t(0), "recorded_input_tokens": 2048, "prefix_block_hashes": [1, 2, 3, 4]},
            {"arrival": _t(1), "recorded_input_tokens": 2048, "prefix_block_hashes": [1, 2, 9, 9]},
            {"arrival": _t(2), "recorded_input_tokens": 1600, "prefix_block_hashes": [1, 2, 3]},
            {"arrival": _t(3), "recorded_input_tokens": 700, "prefix_block_hashes": [5]},
        ]
    ).with_columns(pl.lit(512, pl.Int32).alias("prefix_block_size"))
    ident = P.build_identity(df)
    assert ident.log_block_size == 512
    assert ident.parent.tolist() == [-1, 0, 0, -1]  # row 2 shares 3 blocks with row 0, 2 with row 1
    assert ident.shared.tolist() == [0, 1024, 1536, 0]
    hashes, offs = ident.block_hashes(48)
    rows = [hashes[offs[i] : offs[i + 1]].tolist() for i in range(4)]
    assert [len(r) for r in rows] == [2048 // 48, 2048 // 48, 1600 // 48, 700 // 48]
    assert rows[1][: 1024 // 48] == rows[0][: 1024 // 48] and rows[1][1024 // 48] != rows[0][1024 // 48]
    assert rows[2][: 1536 // 48] == rows[0][: 1536 // 48] and rows[2][1536 // 48] != rows[0][1536 // 48]
    assert not set(rows[3]) & set(rows[0] + rows[1] + rows[2])
    ident.check()


def test_identity_check_refuses_damage() -> None:
    df = _frame([{"arrival": _t(i), "recorded_input_tokens": 100, "session_id": "s"} for i in range(3)])
    ident = P.build_identity(df)
    ident.check()
    assert ident.parent.tolist() == [-1, 0, 1]
    for field, value in [("parent", [-1, 2, 1]), ("shared", [0, 500, 100]), ("parent", [0, 0, 1])]:
        bad = P.PrefixIdentity(**{**ident.__dict__, field: np.asarray(value, np.int64)})
        with pytest.raises(RooftraceError, match="prefix identity: row"):
            bad.check()


def _day_store(tmp_path: Path, requests: int = 60) -> tuple[object, str]:
    from pipeline.ingest import ingest_logs
    from pipeline.ingest.store import Store
    from pipeline.synth import SynthConfig, generate, write_logs

    store = Store(tmp_path / "store")
    log = write_logs(generate(SynthConfig(requests=requests, seed=2, duration_s=120)), "openai", tmp_path / "day.jsonl")
    ingest_logs(log, store)
    return store, store.resolve_date(None)


def test_replay_reads_the_identity_classify_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One prefix identity for both stages: classify builds and stores it; the store-level
    replay cuts its engine chains from it (with classify's isolation key) and builds none."""
    from pipeline.classify import accounting
    from pipeline.classify.accounting import classify_tokens, identity_path, load_identity
    from pipeline.replay.run import ReplayOptions, replay

    store, date = _day_store(tmp_path)
    assert load_identity(store, date) is None  # before classify
    summary = classify_tokens(store, date, isolation=("model",), block_size=64)
    assert summary.paths["prefix_identity"] == str(identity_path(store, date))
    stored = load_identity(store, date)
    assert stored is not None and stored.isolation == ("model",)
    requests = store.read_requests(date)
    fresh = P.build_identity(requests, ("model",))
    for name in ("request_key", "key", "parent", "shared", "prompt", "cached", "source"):
        assert np.array_equal(getattr(stored, name), getattr(fresh, name)), name
    # classify's chains (64-token blocks) are the stored identity cut at 64
    acc = accounting.account(requests, accounting.ClassifyOptions(block_size=64, isolation=("model",)))
    assert np.array_equal(P.chains_at(stored, 64).hashes, P.build_chains(requests, 64, ("model",)).hashes)
    assert np.array_equal(acc.identity.parent, stored.parent)

    def no_rebuild(*_a: object, **_k: object) -> None:
        raise AssertionError("the replay rebuilt the prefix identity")

    monkeypatch.setattr(P, "build_identity", no_rebuild)
    monkeypatch.setattr("pipeline.replay.run.build_identity", no_rebuild)
    monkeypatch.setattr("pipeline.classify.accounting.prefix.build_identity", no_rebuild)
    fleet = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"
    run = replay(store, fleet, ReplayOptions())
    config = json.loads((run.run_dir / "config.json").read_text())
    assert config["options"]["isolation"] == ["model"]
    assert int(run.summary["cache_hit_tokens"]) > 0  # the synthetic day shares prefixes


def test_replay_engine_chains_are_the_identity_at_the_engine_block_size(tmp_path: Path) -> None:
    from pipeline.classify.accounting import classify_tokens, load_identity
    from pipeline.replay.fleet import load_fleet, resolve
    from pipeline.replay.run import ReplayOptions, build_workload

    store, date = _day_store(tmp_path)
    classify_tokens(store, date)
    stored = load_identity(store, date)
    assert stored is not None
    fleet_path = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"
    fleet = resolve(load_fleet(fleet_path), str(fleet_path))
    requests = store.read_requests(date)
    work = build_workload(requests, fleet, ReplayOptions(), stored)
    bs = fleet.scheduler.block_size
    hashes, offs = stored.block_hashes(bs)
    assert np.array_equal(work.explicit().chain_hashes, hashes) and np.array_equal(work.offsets(), offs)
    # a subset (a plan window) maps onto the day's rows: the same blocks, parents outside it kept
    sub = requests[20:40]
    work_sub = build_workload(sub, fleet, ReplayOptions(), stored)
    want, want_off = stored.block_hashes(bs, np.arange(20, 40))
    assert np.array_equal(work_sub.explicit().chain_hashes, want) and np.array_equal(work_sub.offsets(), want_off)


def test_stale_or_damaged_identity(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pipeline.classify.accounting import classify_tokens, day_identity, identity_path, load_identity
    from pipeline.cli import main

    store, date = _day_store(tmp_path)
    classify_tokens(store, date, isolation=("model", "tenant"))
    requests = store.read_requests(date)
    said: list[str] = []
    changed = requests.with_columns(pl.col("recorded_input_tokens") + 1)
    ident = day_identity(store, date, changed, said.append)
    assert len(said) == 1 and "does not match its requests" in said[0] and date in said[0]
    assert ident.isolation == ("model", "tenant") and np.array_equal(ident.prompt, changed["recorded_input_tokens"])
    said.clear()
    current = day_identity(store, date, requests, said.append)
    assert not said and np.array_equal(current.prompt, requests["recorded_input_tokens"])

    path = identity_path(store, date)
    path.write_bytes(b"PAR1 not parquet")
    with pytest.raises(RooftraceError, match="not a usable prefix identity"):
        load_identity(store, date)
    res = CliRunner().invoke(main, ["replay", "--store", str(store.root)])
    assert res.exit_code == 1 and "not a usable prefix identity" in res.output and str(path) in res.output
    assert "Traceback" not in res.output


@st.composite
def _identities(draw: st.DrawFn) -> P.PrefixIdentity:
    """Random identities: each request may repeat part of any earlier one (sessions, shared system
    prompts, forks), shared runs of any length."""
    n = draw(st.integers(1, 30))
    prompt = np.array(draw(st.lists(st.integers(1, 120), min_size=n, max_size=n)), np.int64)
    cached = prompt + np.array(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), np.int64)
    parent = np.full(n, -1, np.int64)
    shared = np.zeros(n, np.int64)
    for i in range(1, n):
        if draw(st.integers(0, 4)):
            p = draw(st.integers(0, i - 1))
            s = draw(st.integers(0, int(min(prompt[i], cached[p]))))
            parent[i], shared[i] = (p, s) if s else (-1, 0)
    ident = P.PrefixIdentity(
        request_key=np.arange(n, dtype=np.uint64),
        key=P.mix64(np.arange(n, dtype=np.uint64) + np.uint64(draw(st.integers(0, 1000)))),
        parent=parent,
        shared=shared,
        prompt=prompt,
        cached=cached,
        source=np.zeros(n, np.int8),
        log_block_size=None,
        isolation=(),
    )
    ident.check()
    return ident


@settings(deadline=None)
@given(_identities(), st.sampled_from([1, 3, 7, 16]), st.data())
def test_chain_tree_is_the_identity_cut_at_a_block_size(ident: P.PrefixIdentity, bs: int, data: st.DataObject) -> None:
    """The compact chains the engine hashes lazily are exactly the identity's materialised chains,
    for any subset of rows in any order, compiled or plain Python, and after ``take``."""
    n = ident.n_requests
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2 * n)), np.int64)
    want, want_off = ident.block_hashes(bs, rows)
    for ks in (None, P._python_kernels()):
        tree = ident.tree(bs, rows, kernels=ks)
        got, off = tree.materialise(kernels=ks)
        assert np.array_equal(got, want) and np.array_equal(off, want_off)
        assert np.array_equal(tree.offsets(), want_off)
        # every node a walk visits shares strictly fewer blocks than the one before it
        live = tree.up >= 0
        assert np.all(tree.fb[tree.up[live]] < tree.fb[live]) and np.all(tree.fb[~live] == 0)
    idx = np.array(data.draw(st.lists(st.integers(0, rows.shape[0] - 1), max_size=8)), np.int64)
    sub, sub_off = tree.take(idx).materialise()
    for k, i in enumerate(idx):
        assert np.array_equal(sub[sub_off[k] : sub_off[k + 1]], want[want_off[i] : want_off[i + 1]])
    first, _ = tree.materialise(n_blocks=np.ones(rows.shape[0], np.int64))
    assert np.array_equal(first, want[want_off[:-1][np.diff(want_off) > 0]])


def test_chain_tree_keeps_requests_not_blocks() -> None:
    """A long session (turn t repeats all of turn t-1): the tree is a few arrays per request while
    the materialised chains grow with every turn's whole context."""
    turns, step = 400, 64
    prompt = np.arange(1, turns + 1, dtype=np.int64) * step
    ident = P.PrefixIdentity(
        request_key=np.arange(turns, dtype=np.uint64),
        key=P.mix64(np.arange(turns, dtype=np.uint64)),
        parent=np.arange(-1, turns - 1, dtype=np.int64),
        shared=np.concatenate([[0], prompt[:-1]]).astype(np.int64),
        prompt=prompt,
        cached=prompt,
        source=np.zeros(turns, np.int8),
        log_block_size=None,
        isolation=(),
    )
    tree = ident.tree(16)
    hashes, _ = tree.materialise()
    assert hashes.shape[0] == int((prompt // 16).sum()) == 400 * 401 // 2 * 4
    assert tree.nbytes == 5 * 8 * turns  # rows, blocks, key, up, fb
    assert tree.max_depth() == int(prompt[-2] // 16) + 1
    assert np.array_equal(hashes, ident.block_hashes(16)[0])
