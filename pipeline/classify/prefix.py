"""Prefix identity (block hash chains) and prefix-cache simulation.

A request's cacheable prefix is a chain of block hashes (docs/architecture.md, Prefix identity). This module builds the
chains (:func:`build_chains`), simulates a block-granular LRU prefix cache explicitly
(:class:`LRUPrefixCache`, one per replica in the replay engine) and in one pass for every
capacity at once (:func:`request_distances`, :func:`lru_stack_distances`: Mattson stack distances
with a Fenwick tree, O(n log n)).

Semantics (the tests pin each of them down; ``docs/accounting.md`` explains them for users):

* **Chained, salted hashes.** ``h_0 = mix(salt ^ mix(c_0))``, ``h_j = mix(h_{j-1} ^ mix(c_j))``
  where ``c_j`` is the block's content id (the log's own id, or one reconstructed from sessions)
  and ``salt`` hashes the request's isolation key (default model, adapter, tenant). A hash thus
  names the whole prefix up to its block, as vLLM's block hash does (each block hash includes
  its parent's), and two tenants with identical prompts never share a hash.
* **Only full blocks are cached** (vLLM caches full blocks only). The last block of a prompt may
  be partial: it gets a hash of its own (tagged, so it can never equal a full block's) and is
  never looked up nor inserted.
* **A prompt never hits on its own last token.** vLLM v1 ``KVCacheManager.get_computed_blocks``
  caps the hit at ``num_tokens - 1`` tokens (the last token must be recomputed for logits) and
  hits whole blocks, so at most ``(n - 1) // block_size`` blocks of an ``n``-token prompt can hit.
* **LRU with tail-first recency.** A request touches all its full blocks at its arrival; the
  first block becomes the most recent. vLLM frees a request's blocks in reverse order into the
  eviction queue for the same reason: a prefix must outlive its suffix. With this order the
  prefix property holds by itself: whenever block ``j`` is touched, block ``j-1`` is touched
  right after it, so ``j-1`` is always more recent than ``j`` and is evicted later. The one-pass
  distances still take a running maximum along each chain, which makes the rule explicit (and
  is a no-op, as a test shows).
* **TTL** (provider caches expire prefixes minutes after their last use): a block whose last
  touch is more than ``ttl_s`` before now is gone. Expired blocks are the least recent ones, so
  with capacity C a block hits iff its stack distance is <= C *and* its age is <= ttl_s.
"""

from __future__ import annotations

import hashlib
import json
import types
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from pipeline.catalog.names import canonical_model_names
from pipeline.common.blockhash import block_hash as _block_hash
from pipeline.common.blockhash import compiled_hash, mix64
from pipeline.common.blockhash import mix as _mix
from pipeline.common.errors import RooftraceError
from pipeline.ingest.project import find_project

U64Array = npt.NDArray[np.uint64]
I64Array = npt.NDArray[np.int64]
I8Array = npt.NDArray[np.int8]
F64Array = npt.NDArray[np.float64]

#: Codes of :attr:`Chains.source` (index into this tuple).
SOURCE_NAMES: tuple[str, ...] = ("none", "log", "session")
SOURCE_NONE, SOURCE_LOG, SOURCE_SESSION = 0, 1, 2

DEFAULT_ISOLATION: tuple[str, ...] = ("model", "adapter", "tenant")
ISOLATION_COLUMNS: frozenset[str] = frozenset({"model", "adapter", "tenant", "session_id"})

#: Stack distance of a block never seen before (or expired): a miss at every capacity.
INF_DISTANCE = int(np.iinfo(np.int64).max)

#: Mixed into the content id of a partial last block so its hash can never equal a full block's.
_PARTIAL_TAG = 0x5041525449414C21  # ASCII "PARTIAL!"


def key64(text: str) -> int:
    """A stable 64-bit key of a string (BLAKE2b, 8-byte digest)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


# --------------------------------------------------------------------------------------------
# hot loops: plain Python functions, compiled with numba when it is installed


def _fnv1a_kernel(offsets: I64Array, data: npt.NDArray[np.uint8], out: U64Array) -> None:
    """FNV-1a 64 of each string (Fowler, Noll & Vo; offset basis 0xCBF29CE484222325, prime
    0x100000001B3, from the FNV reference), given Arrow-style offsets into UTF-8 bytes."""
    for i in range(out.shape[0]):
        h = np.uint64(0xCBF29CE484222325)
        for k in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[k])) * np.uint64(0x100000001B3)
        out[i] = h


def _log_chain_kernel(
    salt: U64Array, ids: U64Array, id_start: I64Array, n_full: I64Array, off: I64Array, out: U64Array
) -> None:
    """Salted chained hashes of the leading full blocks a log's own chain names:
    ``h_0 = mix(salt ^ mix(id_0))``, ``h_j = mix(h_{j-1} ^ mix(id_j))``, so two equal hashes mean
    two equal prefixes in one isolation domain (each hash names its whole prefix, as vLLM's does)."""
    for r in range(salt.shape[0]):
        h = salt[r]
        for j in range(n_full[r]):
            h = _mix(h ^ _mix(ids[id_start[r] + j]))
            out[off[r] + j] = h


def _lcp_kernel(off: I64Array, hashes: U64Array, parent: I64Array, lcp: I64Array) -> None:
    """Rows in order; per row, the longest leading run of blocks an earlier row already has, and
    the earliest row that has the whole run (``parent``). One pass with an open-addressing table
    from hash to its first row, doubled when half full (memory follows the distinct blocks)."""
    cap = 1024
    keys = np.zeros(cap, dtype=np.uint64)
    owner = np.full(cap, -1, dtype=np.int64)
    used = 0
    for r in range(off.shape[0] - 1):
        run = True
        for j in range(off[r], off[r + 1]):
            h = hashes[j]
            mask = np.uint64(cap - 1)
            slot = int(h & mask)
            while owner[slot] >= 0 and keys[slot] != h:
                slot = int((np.uint64(slot) + np.uint64(1)) & mask)
            if owner[slot] >= 0:
                if run and owner[slot] < r:
                    parent[r] = owner[slot]
                    lcp[r] = j - off[r] + 1
                else:
                    run = False
                continue
            run = False
            keys[slot] = h
            owner[slot] = r
            used += 1
            if 2 * used > cap:  # rehash into a table twice the size
                old_keys, old_owner = keys, owner
                cap *= 2
                keys = np.zeros(cap, dtype=np.uint64)
                owner = np.full(cap, -1, dtype=np.int64)
                mask = np.uint64(cap - 1)
                for k in range(old_keys.shape[0]):
                    if old_owner[k] >= 0:
                        slot = int(old_keys[k] & mask)
                        while owner[slot] >= 0:
                            slot = int((np.uint64(slot) + np.uint64(1)) & mask)
                        keys[slot] = old_keys[k]
                        owner[slot] = old_owner[k]


def _origin_kernel(
    rows: I64Array,
    n_blocks: I64Array,
    key: U64Array,
    parent: I64Array,
    shared: I64Array,
    bs: int,
    off: I64Array,
    out: U64Array,
) -> None:
    """Hash of full block m of each request in ``rows``: ``mix(key[a] ^ mix(m))``, where ``a``, the
    block's origin, is the first request up the parent path whose shared prefix ends before the
    block does. Blocks are walked last to first, so the walk only ever moves up: O(blocks + depth)."""
    for k in range(rows.shape[0]):
        a = rows[k]
        for m in range(n_blocks[k] - 1, -1, -1):
            end = (m + 1) * bs
            while shared[a] >= end:
                a = parent[a]
            out[off[k] + m] = _block_hash(key[a], m)


def _up_kernel(parent: I64Array, shared: I64Array, bs: int, fb: I64Array, up: I64Array) -> None:
    """Per row: ``fb``, its full blocks shared with its parent, and ``up``, its nearest ancestor
    sharing strictly fewer (−1 where ``fb`` is 0). Block m's origin is the first row on the path
    from a request up whose ``fb <= m``; the ``up`` links skip rows that can never be it."""
    for i in range(parent.shape[0]):
        f = shared[i] // bs
        fb[i] = f
        up[i] = -1
        if f > 0:
            c = parent[i]
            while fb[c] >= f:
                c = up[c]
            up[i] = c


def _tree_hash_kernel(
    rows: I64Array, n_blocks: I64Array, key: U64Array, up: I64Array, fb: I64Array, off: I64Array, out: U64Array
) -> None:
    """:func:`_origin_kernel` on a :class:`ChainTree`: blocks last to first, following ``up``."""
    for k in range(rows.shape[0]):
        a = rows[k]
        for m in range(n_blocks[k] - 1, -1, -1):
            while fb[a] > m:
                a = up[a]
            out[off[k] + m] = _block_hash(key[a], m)


def _cut_kernel(
    prompt: I64Array,
    key: U64Array,
    bs: int,
    tag: np.uint64,
    cache_off: I64Array,
    cache_hashes: U64Array,
    p_off: I64Array,
    o_off: I64Array,
    p_hash: U64Array,
    p_tokens: I64Array,
    o_hash: U64Array,
) -> None:
    """Lay a request's cacheable blocks out as Chains: its full prompt blocks, a tagged partial
    last block of its own (never cached), then the blocks its output completes."""
    for r in range(prompt.shape[0]):
        full = prompt[r] // bs
        c = cache_off[r]
        for j in range(p_off[r + 1] - p_off[r]):
            if j < full:
                p_hash[p_off[r] + j] = cache_hashes[c + j]
                p_tokens[p_off[r] + j] = bs
            else:
                p_hash[p_off[r] + j] = _mix(key[r] ^ tag ^ _mix(np.uint64(j)))
                p_tokens[p_off[r] + j] = prompt[r] - j * bs
        for j in range(o_off[r + 1] - o_off[r]):
            o_hash[o_off[r] + j] = cache_hashes[c + full + j]


def _plan_kernel(
    rows: I64Array,
    p_off: I64Array,
    full: I64Array,
    o_off: I64Array,
    p_hash: U64Array,
    o_hash: U64Array,
    t_off: I64Array,
    touches: U64Array,
) -> None:
    """Gather, per request in ``rows`` order, its full prompt blocks then its output blocks."""
    for k in range(rows.shape[0]):
        r = rows[k]
        dst = t_off[k]
        for j in range(full[k]):
            touches[dst + j] = p_hash[p_off[r] + j]
        dst += full[k]
        for j in range(o_off[r + 1] - o_off[r]):
            touches[dst + j] = o_hash[o_off[r] + j]


def _popcount(x: np.uint64) -> np.uint64:
    """Set bits of a 64-bit word (the SWAR method, Hacker's Delight §5-1)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


def _distance_kernel(
    touches: U64Array,
    t_off: I64Array,
    lookups: I64Array,
    q_off: I64Array,
    t_req: F64Array,
    ttl: float,
    running_max: bool,
    table: U64Array,
    max_lookups: int,
    out: I64Array,
) -> None:
    """Mattson LRU stack distances per request, with a Fenwick tree over touch positions.

    Touches get positions in time order; a request's blocks are touched tail first, so block j
    of a request with touches [s, e) gets position e-1-j. A set of positions holds each block's
    latest one (found through ``table``, open addressing keyed by block hash: [key, pos + 1]
    pairs, 0 = empty). Before request r's touches, a block last touched at p has stack distance
    1 + |{positions in the set within (p, s)}|: the distinct blocks touched since. Request r's
    first lookups[r] blocks are looked up first, then all its touches are applied. A running
    maximum along the chain enforces the prefix property.

    The set is a bitmap (one bit per position) plus a Fenwick tree over its 64-bit words, so a
    rank query is one popcount and a walk over a tree 64 times smaller than the positions:
    1.3 MB of bitmap and 0.6 MB of tree for 10 M touches, which stay in cache.
    """
    n = touches.shape[0]
    n_words = (n >> 6) + 1
    bits = np.zeros(n_words, dtype=np.uint64)
    tree = np.zeros(n_words + 1, dtype=np.int32)
    mask = np.uint64((table.shape[0] >> 1) - 1)
    # Table slot of each looked-up block that was present (-1 otherwise): a present block's slot
    # never moves (nothing is deleted), so the touch phase reuses it instead of probing again.
    saved = np.empty(max_lookups + 1, dtype=np.int64)
    last = np.empty(max_lookups + 1, dtype=np.int64)
    for r in range(t_off.shape[0] - 1):
        s = t_off[r]
        e = t_off[r + 1]
        # |set ∩ [0, s)|
        w = s >> 6
        before = np.int64(0)
        i = w
        while i > 0:
            before += tree[i]
            i -= i & (-i)
        before += np.int64(_popcount(bits[w] & ((np.uint64(1) << np.uint64(s & 63)) - np.uint64(1))))
        # Pass 1: find each looked-up block's last position (independent probes, so the CPU can
        # overlap their cache misses); stop at the first absent block when the prefix rule holds.
        probed = lookups[r]
        for j in range(lookups[r]):
            key = touches[s + j]
            slot = _mix(key) & mask
            while table[2 * slot + 1] != 0 and table[2 * slot] != key:
                slot = (slot + np.uint64(1)) & mask
            p = np.int64(table[2 * slot + 1]) - 1
            last[j] = p
            saved[j] = slot if p >= 0 else -1
            if p < 0 and running_max:
                probed = j + 1
                break
        # Pass 2: distances.
        running = np.int64(0)
        for j in range(lookups[r]):
            p = last[j] if j < probed else np.int64(-1)
            # never seen, or expired: the age is since the request that last touched it
            if p < 0 or (ttl < np.inf and t_req[r] - t_req[np.searchsorted(t_off, p, side="right") - 1] > ttl):
                d = np.int64(INF_DISTANCE)
            else:
                # |set ∩ [0, p]|
                w = (p + 1) >> 6
                upto = np.int64(0)
                i = w
                while i > 0:
                    upto += tree[i]
                    i -= i & (-i)
                upto += np.int64(_popcount(bits[w] & ((np.uint64(1) << np.uint64((p + 1) & 63)) - np.uint64(1))))
                d = 1 + before - upto
            if not running_max or d > running:
                running = d
            out[q_off[r] + j] = running
        for m in range(e - s):
            c = e - 1 - m - s  # chain index of the block touched at position s + m
            key = touches[s + c]
            pos = s + m
            if c < probed and saved[c] >= 0:
                slot = np.uint64(saved[c])
            else:
                slot = _mix(key) & mask
                while table[2 * slot + 1] != 0 and table[2 * slot] != key:
                    slot = (slot + np.uint64(1)) & mask
            p = np.int64(table[2 * slot + 1]) - 1
            if p >= 0:
                w = p >> 6
                bits[w] &= ~(np.uint64(1) << np.uint64(p & 63))
                i = w + 1
                while i <= n_words:
                    tree[i] -= 1
                    i += i & (-i)
            w = pos >> 6
            bits[w] |= np.uint64(1) << np.uint64(pos & 63)
            i = w + 1
            while i <= n_words:
                tree[i] += 1
                i += i & (-i)
            table[2 * slot] = key
            table[2 * slot + 1] = np.uint64(pos + 1)


def _lru_kernel(
    touches: U64Array,
    t_off: I64Array,
    rows: I64Array,
    lookups: I64Array,
    top: int,
    cap: int,
    nkey: U64Array,
    nprev: npt.NDArray[np.int32],
    nnext: npt.NDArray[np.int32],
    intop: npt.NDArray[np.bool_],
    tkey: U64Array,
    tnode: npt.NDArray[np.int32],
    out: I64Array,
) -> None:
    """Leading hits of requests ``rows`` (in that order) in LRU caches of ``top`` and ``cap``
    blocks (``0 < top <= cap``), simulated directly as one recency list of at most ``cap`` blocks
    whose ``top`` most recent form the smaller cache (a block is in it iff ``intop``; one LRU
    stack holds both, as in the module doc). Nodes (key, previous and next node, −1 = none) are
    found by block hash in a linear-probing table (a power of two of slots: the key and its node,
    −1 = empty; a deletion shifts the cluster back). Request r looks up its first ``lookups[r]``
    blocks (hits: the leading run in each cache), then touches every block tail first (each
    moves to the front; a new one takes a fresh node, or the least recent block's once the list
    is full); out[0] and out[1] get the hits."""
    mask = np.uint64(tkey.shape[0] - 1)
    head = np.int64(-1)
    tail = np.int64(-1)
    bound = np.int64(-1)  # the last node of the top segment
    size = np.int64(0)
    ntop = np.int64(0)
    for q in range(rows.shape[0]):
        r = rows[q]
        s = t_off[r]
        e = t_off[r + 1]
        h_top = np.int64(-1)
        h_all = lookups[r]
        for j in range(lookups[r]):
            key = touches[s + j]
            slot = _mix(key) & mask
            while tnode[slot] >= 0 and tkey[slot] != key:
                slot = (slot + np.uint64(1)) & mask
            x = tnode[slot]
            if x < 0:
                h_all = np.int64(j)
                break
            if h_top < 0 and not intop[x]:
                h_top = np.int64(j)
        out[0, q] = h_all if h_top < 0 else h_top
        out[1, q] = h_all
        for m in range(e - s):
            key = touches[e - 1 - m]
            slot = _mix(key) & mask
            while tnode[slot] >= 0 and tkey[slot] != key:
                slot = (slot + np.uint64(1)) & mask
            x = np.int64(tnode[slot])
            if x == head and x >= 0:
                continue
            if x >= 0:  # present: unlink it (it is not the head)
                p = np.int64(nprev[x])
                nx = np.int64(nnext[x])
                if x == bound:  # (the top segment keeps its blocks, its last one changes)
                    bound = p
                nnext[p] = nx
                if nx >= 0:
                    nprev[nx] = p
                else:
                    tail = p
                grows = not intop[x]
            else:
                grows = True
                if size < cap:  # a fresh node
                    x = size
                    size += 1
                else:  # evict the least recent block and reuse its node
                    x = tail
                    tail = np.int64(nprev[x])
                    if tail >= 0:
                        nnext[tail] = -1
                    else:
                        head = np.int64(-1)
                    if intop[x]:  # (top == cap: every block is in the top segment)
                        intop[x] = False
                        ntop -= 1
                        bound = tail
                    old = nkey[x]
                    i = _mix(old) & mask
                    while tkey[i] != old or tnode[i] < 0:
                        i = (i + np.uint64(1)) & mask
                    jj = i
                    while True:
                        jj = (jj + np.uint64(1)) & mask
                        if tnode[jj] < 0:
                            break
                        home = _mix(tkey[jj]) & mask
                        stays = (i < home <= jj) if i <= jj else (home > i or home <= jj)
                        if stays:
                            continue
                        tkey[i] = tkey[jj]
                        tnode[i] = tnode[jj]
                        i = jj
                    tnode[i] = -1
                    slot = _mix(key) & mask  # the new key's empty slot, after the shift
                    while tnode[slot] >= 0:
                        slot = (slot + np.uint64(1)) & mask
                tkey[slot] = key
                tnode[slot] = x
                nkey[x] = key
            # x to the front
            nprev[x] = -1
            nnext[x] = head
            if head >= 0:
                nprev[head] = x
            else:
                tail = x
            head = x
            if grows:  # x joins the top segment: its last block leaves it when it is full
                intop[x] = True
                if ntop < top:
                    ntop += 1
                    if bound < 0:
                        bound = x
                else:
                    intop[bound] = False
                    bound = np.int64(nprev[bound])


class _Kernels(NamedTuple):
    fnv1a: Callable[..., None]
    log_chain: Callable[..., None]
    lcp: Callable[..., None]
    origin: Callable[..., None]
    cut: Callable[..., None]
    plan: Callable[..., None]
    distance: Callable[..., None]
    up: Callable[..., None]
    tree_hash: Callable[..., None]
    lru: Callable[..., None]


_KERNEL_FUNCTIONS = (
    _fnv1a_kernel,
    _log_chain_kernel,
    _lcp_kernel,
    _origin_kernel,
    _cut_kernel,
    _plan_kernel,
    _distance_kernel,
    _up_kernel,
    _tree_hash_kernel,
    _lru_kernel,
)


def _python_fallback(fn: Callable[..., None]) -> Callable[..., None]:
    def run(*args: Any) -> None:
        # numpy scalars warn on the uint64 wrap-around that the hash mix relies on.
        with np.errstate(over="ignore"):
            fn(*args)

    return run


@cache
def _kernels() -> _Kernels:
    """The hot loops, compiled by numba on first use (cached on disk); plain Python without it."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a runtime dependency; this keeps it optional
        return _python_kernels()
    mix, block_hash = compiled_hash()
    compiled = []
    popcount = numba.njit(cache=True, inline="always")(_popcount)
    for fn in _KERNEL_FUNCTIONS:
        # The kernels call _mix, _block_hash and _popcount through their globals; give each
        # compiled copies.
        glb = dict(fn.__globals__)
        glb["_mix"] = mix
        glb["_block_hash"] = block_hash
        glb["_popcount"] = popcount
        clone = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
        # nogil: the offload pre-pass simulates replicas' tiers in threads (replay.offload.tier_runs)
        compiled.append(_writeable_inputs(numba.njit(cache=True, nogil=True)(clone)))
    return _Kernels(*compiled)


def _writeable_inputs(kernel: Callable[..., None]) -> Callable[..., None]:
    """``kernel`` with read-only array arguments (polars' zero-copy ``to_numpy``, a Ray worker's
    object store) passed as writeable copies: numba types a read-only array differently, so each
    kernel would be compiled (and cached) twice. The kernels only write to arrays their callers
    allocate, which are writeable and passed as they are."""

    def call(*args: Any) -> None:
        kernel(*(a.copy() if isinstance(a, np.ndarray) and not a.flags.writeable else a for a in args))

    return call


def _python_kernels() -> _Kernels:
    """Uncompiled kernels: the fallback without numba, and the tests' check of the compiled ones."""
    return _Kernels(*(_python_fallback(f) for f in _KERNEL_FUNCTIONS))


# --------------------------------------------------------------------------------------------
# chains


@dataclass(frozen=True, eq=False)
class Chains:
    """Block hash chains of N requests in CSR layout, in the requests frame's row order.

    hashes        salted block hashes of every prompt, concatenated (uint64)
    offsets       request i's prompt blocks are hashes[offsets[i]:offsets[i+1]] (int64, N+1)
    block_tokens  tokens per prompt block (int64, aligned with hashes); only a prompt's last block
                  may hold fewer than block_size tokens, and such a partial block is never cached
    block_size    tokens per full block
    source        per request, an index into SOURCE_NAMES ("none", "log", "session") (int8)
    out_hashes    hashes of the full blocks the request's *output* completes (the block holding the
                  prompt's partial tail and the first output tokens, then further output blocks);
                  filled for session chains only, where the next turn can reuse them; empty for
                  "log" (the log's next chain names those blocks itself) and "none"
    out_offsets   CSR offsets into out_hashes (int64, N+1)
    """

    hashes: U64Array
    offsets: I64Array
    block_tokens: I64Array
    block_size: int
    source: I8Array
    out_hashes: U64Array
    out_offsets: I64Array

    @property
    def n_requests(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def prompt_blocks(self) -> I64Array:
        """Prompt blocks per request (full and partial)."""
        return cast(I64Array, np.diff(self.offsets))

    def input_tokens(self) -> I64Array:
        """Prompt tokens per request covered by the chain (= recorded_input_tokens)."""
        # every block but the last is full
        n_blocks = np.diff(self.offsets)
        last = self.block_tokens[np.maximum(self.offsets[1:] - 1, 0)] if self.block_tokens.size else n_blocks
        return cast(I64Array, np.where(n_blocks > 0, (n_blocks - 1) * self.block_size + last, 0))

    def full_blocks(self) -> I64Array:
        """Full (cacheable) prompt blocks per request."""
        return self.input_tokens() // self.block_size

    def lookup_blocks(self) -> I64Array:
        """Prompt blocks that may hit per request: ``(n - 1) // block_size`` (see module doc)."""
        return max_hit_blocks(self.input_tokens(), self.block_size)

    def prompt(self, i: int) -> U64Array:
        """Prompt block hashes of request ``i`` (the last one may be partial)."""
        return self.hashes[self.offsets[i] : self.offsets[i + 1]]

    def cacheable(self, i: int) -> U64Array:
        """Full prompt block hashes of request ``i``, then the full blocks its output completes:
        what a cache holds once the request is done, first block first."""
        start = int(self.offsets[i])
        full = int(np.count_nonzero(self.block_tokens[start : self.offsets[i + 1]] == self.block_size))
        outs = self.out_hashes[self.out_offsets[i] : self.out_offsets[i + 1]]
        return np.concatenate([self.hashes[start : start + full], outs])


def max_hit_blocks(input_tokens: npt.ArrayLike, block_size: int) -> I64Array:
    """Most prompt blocks that can hit: vLLM v1 ``get_computed_blocks`` caps the hit length at
    ``num_tokens - 1`` and counts whole blocks, so ``(n - 1) // block_size`` (0 for n = 0)."""
    n = np.asarray(input_tokens, dtype=np.int64)
    return cast(I64Array, np.maximum(n - 1, 0) // block_size)


def string_keys(values: pl.Series, *, kernels: _Kernels | None = None) -> U64Array:
    """A stable 64-bit key per string (FNV-1a 64, then splitmix64 to spread it); null -> key of ""."""
    kern = kernels if kernels is not None else _kernels()
    arr = values.cast(pl.String).fill_null("").to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.large_string())
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    out = np.empty(len(arr), dtype=np.uint64)
    kern.fnv1a(np.ascontiguousarray(offsets), data, out)
    return mix64(out)


def check_isolation(isolation: Sequence[str]) -> None:
    """Refuse isolation keys that are not request columns that can isolate a cache, or a key
    named twice (one line each)."""
    cols = list(isolation)
    unknown = [c for c in cols if c not in ISOLATION_COLUMNS]
    if unknown:
        raise RooftraceError(
            f"isolation keys {unknown} are not request columns that can isolate a cache; "
            f"choose from {sorted(ISOLATION_COLUMNS)}"
        )
    twice = sorted({c for c in cols if cols.count(c) > 1})
    if twice:
        raise RooftraceError(f"isolation keys named more than once: {twice} (each key once, e.g. model,tenant)")


def isolation_salts(requests: pl.DataFrame, isolation: Sequence[str]) -> U64Array:
    """Per row, a 64-bit salt naming its isolation domain (null and "" are different values).
    A model is its catalog id where its logged name resolves to one (pipeline/catalog/names.py),
    so two spellings of one deployment are one domain; a catalog id's salt is the one it always had."""
    cols = list(isolation)
    check_isolation(cols)
    if not cols:
        return np.full(requests.height, key64("[]"), dtype=np.uint64)
    keys = requests.select(cols)
    if "model" in cols:
        logged = keys.get_column("model").drop_nulls().unique().sort().to_list()
        names = canonical_model_names(logged, find_project().models)
        keys = keys.with_columns(pl.col("model").replace({k: v for k, v in names.items() if k != v}))
    combos = keys.unique(maintain_order=True)
    salts = [key64(json.dumps(list(zip(cols, row, strict=True)))) for row in combos.iter_rows()]
    combos = combos.with_columns(pl.Series("_salt", salts, dtype=pl.UInt64))
    joined = keys.with_row_index("_row").join(combos, on=cols, how="left", nulls_equal=True).sort("_row")
    return cast(U64Array, joined.get_column("_salt").to_numpy())


def _log_chains(requests: pl.DataFrame) -> tuple[npt.NDArray[np.bool_], int | None]:
    """Which rows carry a usable log hash chain, and the chain block size."""
    if "prefix_block_hashes" not in requests.columns:
        return np.zeros(requests.height, dtype=bool), None
    has = requests.select(
        pl.col("prefix_block_hashes").is_not_null() & (pl.col("prefix_block_hashes").list.len() > 0)
    ).to_series()
    mask = has.to_numpy().astype(bool)
    if not mask.any():
        return mask, None
    sizes = requests.filter(has).get_column("prefix_block_size").unique().to_list()
    if None in sizes:
        raise RooftraceError("requests: prefix_block_hashes present but prefix_block_size is null")
    if len(sizes) != 1:
        raise RooftraceError(
            f"requests: prefix_block_size differs between rows ({sorted(sizes)}); classify one block size at a time"
        )
    size = int(sizes[0])
    if size <= 0:
        raise RooftraceError(f"requests: prefix_block_size must be positive, got {size}")
    return mask, size


def _csr(counts: I64Array) -> I64Array:
    out = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


@dataclass(frozen=True, eq=False)
class PrefixIdentity:
    """Which tokens of which requests are the same, independent of any block size.

    Request ``i`` repeats the first ``shared[i]`` tokens of request ``parent[i]`` (−1: of none)
    and its other tokens are its own. ``classify`` builds it once per date and stores it
    (:func:`pipeline.classify.accounting.identity_path`); ``classify`` (512-token blocks by
    default) and the replay engine (the model's KV block size) both cut it into block hash
    chains with :func:`chains_at`, so the two stages can never disagree on what is shared.

    request_key  string_keys(request_id): maps a requests frame onto these rows
    key          names the blocks this request introduces (isolation salt, request and position)
    parent       row whose prefix this request repeats (always an earlier row), −1 for none
    shared       tokens shared with ``parent`` (0 without one)
    prompt       recorded_input_tokens
    cached       tokens whose full blocks the request leaves in a cache: the prompt, plus the
                 output for session turns (the next turn re-sends them)
    source       per request, an index into SOURCE_NAMES
    log_block_size  the log's own chain block size (``prefix_block_size``), None without one
    isolation    the columns that keep caches apart
    """

    request_key: U64Array
    key: U64Array
    parent: I64Array
    shared: I64Array
    prompt: I64Array
    cached: I64Array
    source: I8Array
    log_block_size: int | None
    isolation: tuple[str, ...]

    @property
    def n_requests(self) -> int:
        return int(self.key.shape[0])

    def check(self) -> None:
        """Raise RooftraceError unless the invariants hold (a stored identity may be damaged)."""
        n = self.n_requests
        cols = (self.request_key, self.parent, self.shared, self.prompt, self.cached, self.source)
        if any(c.shape != (n,) for c in cols):
            raise RooftraceError("prefix identity: columns differ in length")
        if self.log_block_size is not None and not 0 < self.log_block_size <= 1 << 20:
            raise RooftraceError(f"prefix identity: log block size {self.log_block_size} out of range")
        idx = np.arange(n, dtype=np.int64)
        has = self.parent >= 0
        bad = (
            (self.parent < -1)
            | (self.parent >= idx)
            | (self.shared < 0)
            | (~has & (self.shared != 0))
            | (self.prompt < 0)
            | (self.cached < self.prompt)
            | (self.shared > self.prompt)
            | ((self.source < 0) | (self.source >= len(SOURCE_NAMES)))
        )
        if n and not bad.any():
            par = self.parent[has]
            bad[has] = self.shared[has] > self.cached[par]
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise RooftraceError(
                f"prefix identity: row {row} is inconsistent (parent {int(self.parent[row])}, "
                f"shared {int(self.shared[row])} tokens)"
            )

    def rows_of(self, requests: pl.DataFrame) -> I64Array | None:
        """The identity's row of every request of ``requests`` (the whole date or any subset of
        it), or None when some request is not in it or differs from it (the date was ingested
        again after classify) or its request ids are ambiguous."""
        keys = string_keys(requests.get_column("request_id"))
        prompt = requests.get_column("recorded_input_tokens").cast(pl.Int64).to_numpy()
        if keys.shape == self.request_key.shape and np.array_equal(keys, self.request_key):
            rows = np.arange(self.n_requests, dtype=np.int64)
        else:
            order = np.argsort(self.request_key, kind="stable")
            sorted_keys = self.request_key[order]
            if sorted_keys.size > 1 and bool((sorted_keys[1:] == sorted_keys[:-1]).any()):
                return None
            pos = np.searchsorted(sorted_keys, keys)
            pos = np.minimum(pos, max(sorted_keys.size - 1, 0))
            if sorted_keys.size == 0 or not np.array_equal(sorted_keys[pos], keys):
                return None
            rows = order[pos].astype(np.int64)
        if not np.array_equal(self.prompt[rows], prompt):
            return None
        return cast(I64Array, rows)

    def block_hashes(
        self, block_size: int, rows: I64Array | None = None, *, kernels: _Kernels | None = None
    ) -> tuple[U64Array, I64Array]:
        """The hashes of the full blocks each request leaves in a cache (``cached // block_size``
        per request, first block first; what vLLM's block pool holds once it finishes), for
        ``rows`` (default all) in the order given, as (hashes, CSR offsets)."""
        if block_size <= 0:
            raise RooftraceError(f"block size must be positive, got {block_size}")
        rows = np.arange(self.n_requests, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        counts = self.cached[rows] // block_size
        off = _csr(counts)
        out = np.empty(int(off[-1]), dtype=np.uint64)
        (kernels if kernels is not None else _kernels()).origin(
            rows, counts, self.key, self.parent, self.shared, block_size, off, out
        )
        return out, off

    def tree(self, block_size: int, rows: I64Array | None = None, *, kernels: _Kernels | None = None) -> ChainTree:
        """The chains :meth:`block_hashes` gives, kept compactly for the replay engine, which
        hashes a request's blocks when it needs them: O(requests) memory, not O(blocks)."""
        if block_size <= 0:
            raise RooftraceError(f"block size must be positive, got {block_size}")
        rows = np.arange(self.n_requests, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        fb = np.empty(self.n_requests, np.int64)
        up = np.empty(self.n_requests, np.int64)
        ks = kernels if kernels is not None else _kernels()
        ks.up(self.parent, self.shared, block_size, fb, up)
        tree = ChainTree(rows, self.cached[rows] // block_size, self.key, up, fb, block_size)
        return tree.compact()


@dataclass(frozen=True, eq=False)
class ChainTree:
    """Prefix chains of N requests without their hashes: request ``i``'s block ``m`` (of
    ``blocks[i]`` full blocks it leaves in a cache) hashes to ``_block_hash(key[a], m)`` where ``a``,
    the block's origin, is the first node from ``rows[i]`` along the ``up`` links whose ``fb`` (full
    blocks shared with its parent) is at most ``m``. Built by :meth:`PrefixIdentity.tree`;
    :meth:`materialise` gives exactly :meth:`PrefixIdentity.block_hashes`.

    rows        node of each request (int64, N)
    blocks      full blocks each request leaves in a cache (int64, N)
    key, up, fb per node (M): key of the blocks it introduces, nearest ancestor sharing fewer
                blocks (−1: none), full blocks shared with its parent
    block_size  tokens per block
    """

    rows: I64Array
    blocks: I64Array
    key: U64Array
    up: I64Array
    fb: I64Array
    block_size: int

    @property
    def n(self) -> int:
        return int(self.rows.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.rows, self.blocks, self.key, self.up, self.fb))

    def offsets(self) -> I64Array:
        """CSR offsets of the requests' chains (what :meth:`materialise` lays out)."""
        return _csr(self.blocks)

    def max_depth(self) -> int:
        """Most ``up`` links a request's walk visits, plus one (a bound for the engine's scratch)."""
        return int(self.fb[self.rows].max()) + 1 if self.n else 1

    def materialise(
        self, idx: I64Array | None = None, n_blocks: I64Array | None = None, *, kernels: _Kernels | None = None
    ) -> tuple[U64Array, I64Array]:
        """(hashes, CSR offsets) of requests ``idx`` (default all), their first ``n_blocks``
        blocks each (default all of them)."""
        idx = np.arange(self.n, dtype=np.int64) if idx is None else np.asarray(idx, np.int64)
        counts = self.blocks[idx] if n_blocks is None else np.minimum(self.blocks[idx], n_blocks)
        off = _csr(counts)
        out = np.empty(int(off[-1]), dtype=np.uint64)
        ks = kernels if kernels is not None else _kernels()
        ks.tree_hash(self.rows[idx], counts, self.key, self.up, self.fb, off, out)
        return out, off

    def take(self, idx: I64Array) -> ChainTree:
        """The chains of requests ``idx``, in that order (only the nodes their walks visit kept)."""
        idx = np.asarray(idx, np.int64)
        return ChainTree(self.rows[idx], self.blocks[idx], self.key, self.up, self.fb, self.block_size).compact()

    def compact(self) -> ChainTree:
        """The same chains over only the nodes the requests' walks can visit, renumbered."""
        need = np.zeros(self.key.shape[0], np.bool_)
        front = np.unique(self.rows)
        while front.size:
            need[front] = True
            nxt = self.up[front]
            nxt = np.unique(nxt[nxt >= 0])
            front = nxt[~need[nxt]]
        nodes = np.flatnonzero(need)
        if nodes.shape[0] == self.key.shape[0]:
            return self
        new = np.full(self.key.shape[0], -1, np.int64)
        new[nodes] = np.arange(nodes.shape[0], dtype=np.int64)
        up = self.up[nodes]
        up = np.where(up >= 0, new[np.maximum(up, 0)], -1)
        return ChainTree(new[self.rows], self.blocks, self.key[nodes], up, self.fb[nodes], self.block_size)


def build_identity(
    requests: pl.DataFrame, isolation: Sequence[str] = DEFAULT_ISOLATION, *, kernels: _Kernels | None = None
) -> PrefixIdentity:
    """The prefix identity of every request, from the best source available, rows in the frame's
    order (``parent`` must precede its child: pass the frame sorted by arrival, as the store
    returns it).

    1. ``log``: the log's own chain (``prefix_block_hashes``, e.g. Mooncake ``hash_ids``) with its
       own block size (``prefix_block_size``). The parent is the earlier request with the longest
       common run of full blocks; a chain shorter than the prompt continues with tokens of the
       request's own, one longer than the prompt is cut to it.
    2. ``session``: turn k of a session (same ``session_id`` and isolation key, turns by arrival)
       repeats ``min(in_{k-1} + out_{k-1}, in_k)`` leading tokens of turn k-1.
    3. ``none``: every token is the request's own (it takes cache space but never hits).

    Taking the longest common prefix with one earlier request loses nothing: prefix lengths form
    an ultrametric (``lcp(a, c) >= min(lcp(a, b), lcp(b, c))``), so for the earlier request ``q``
    with the longest one, ``lcp(i, r) = min(lcp(i, q), lcp(q, r))`` for every other earlier ``r``.
    """
    kern = kernels if kernels is not None else _kernels()
    n = requests.height
    log_mask, log_size = _log_chains(requests)
    in_tok = requests.get_column("recorded_input_tokens").cast(pl.Int64).to_numpy().astype(np.int64)
    out_tok = requests.get_column("output_tokens").cast(pl.Int64).to_numpy().astype(np.int64)
    if n and (in_tok.min() < 0 or out_tok.min() < 0):
        raise RooftraceError("requests: recorded_input_tokens and output_tokens must be >= 0")
    if n and int(in_tok.max()) + int(out_tok.max()) > 1 << 60:
        raise RooftraceError("requests: token counts too large to index blocks")

    salt = isolation_salts(requests, isolation)
    request_key = string_keys(requests.get_column("request_id"), kernels=kern)
    key = mix64(salt ^ mix64(request_key ^ mix64(np.arange(n, dtype=np.uint64))))
    parent = np.full(n, -1, dtype=np.int64)
    shared = np.zeros(n, dtype=np.int64)

    if "session_id" in requests.columns:
        sess_mask = requests.get_column("session_id").is_not_null().to_numpy().astype(bool) & ~log_mask
    else:
        sess_mask = np.zeros(n, dtype=bool)
    source = np.full(n, SOURCE_NONE, dtype=np.int8)
    source[log_mask] = SOURCE_LOG
    source[sess_mask] = SOURCE_SESSION

    if log_size is not None:
        _log_parents(requests, log_mask, log_size, in_tok, salt, kern, parent, shared)
    if sess_mask.any():
        _session_parents(requests, sess_mask, in_tok, out_tok, salt, kern, parent, shared)
    cached = np.where(sess_mask, in_tok + out_tok, in_tok).astype(np.int64)
    return PrefixIdentity(request_key, key, parent, shared, in_tok, cached, source, log_size, tuple(isolation))


def _log_parents(
    requests: pl.DataFrame,
    mask: npt.NDArray[np.bool_],
    bs: int,
    in_tok: I64Array,
    salt: U64Array,
    kern: _Kernels,
    parent: I64Array,
    shared: I64Array,
) -> None:
    """Fill ``parent``/``shared`` of log-chain rows: the earliest earlier row holding the
    request's longest prefix of full, log-named blocks (one pass over the block hashes)."""
    n = requests.height
    ids, id_off = _log_lists(requests, mask)
    n_full = np.where(mask, np.minimum(id_off[1:] - id_off[:-1], in_tok // bs), 0).astype(np.int64)
    off = _csr(n_full)
    hashes = np.empty(int(off[-1]), dtype=np.uint64)
    kern.log_chain(salt, ids, np.ascontiguousarray(id_off[:-1]), n_full, off, hashes)
    lcp = np.zeros(n, dtype=np.int64)
    kern.lcp(off, hashes, parent, lcp)
    shared[:] = np.where(parent >= 0, lcp * bs, shared)


def _session_parents(
    requests: pl.DataFrame,
    mask: npt.NDArray[np.bool_],
    in_tok: I64Array,
    out_tok: I64Array,
    salt: U64Array,
    kern: _Kernels,
    parent: I64Array,
    shared: I64Array,
) -> None:
    """Fill ``parent``/``shared`` of session turns: the previous turn, ``min(in + out, in_k)``."""
    rows = np.flatnonzero(mask)
    sessions = (
        pl.DataFrame({"salt": pl.Series(salt).cast(pl.String), "sid": requests.get_column("session_id")})
        .select(pl.concat_str(["salt", "sid"], separator="\x00"))
        .to_series()
    )
    session_key = string_keys(sessions, kernels=kern)
    arrival = requests.get_column("arrival").to_physical().to_numpy()[rows]
    order = rows[np.lexsort((rows, arrival, session_key[rows]))]
    same = session_key[order][1:] == session_key[order][:-1]
    child, par = order[1:][same], order[:-1][same]
    parent[child] = par
    shared[child] = np.minimum(in_tok[par] + out_tok[par], in_tok[child])


def chains_at(identity: PrefixIdentity, block_size: int, *, kernels: _Kernels | None = None) -> Chains:
    """The identity cut into ``block_size``-token block hash chains (prompt blocks, the last
    one possibly partial and never cached, then the blocks a session turn's output completes)."""
    if block_size <= 0:
        raise RooftraceError(f"block size must be positive, got {block_size}")
    bs = block_size
    in_tok = identity.prompt
    cache_hashes, cache_off = identity.block_hashes(bs, kernels=kernels)
    full = in_tok // bs
    n_prompt = (in_tok + bs - 1) // bs
    p_off = _csr(n_prompt)
    n_out = identity.cached // bs - full
    o_off = _csr(n_out)
    p_hash = np.empty(int(p_off[-1]), dtype=np.uint64)
    p_tokens = np.empty(int(p_off[-1]), dtype=np.int64)
    o_hash = np.empty(int(o_off[-1]), dtype=np.uint64)
    tag = mix64(np.array([_PARTIAL_TAG], dtype=np.uint64))[0]
    (kernels if kernels is not None else _kernels()).cut(
        in_tok, identity.key, bs, tag, cache_off, cache_hashes, p_off, o_off, p_hash, p_tokens, o_hash
    )
    return Chains(p_hash, p_off, p_tokens, bs, identity.source, o_hash, o_off)


def build_chains(
    requests: pl.DataFrame,
    block_size: int = 512,
    isolation: Sequence[str] = DEFAULT_ISOLATION,
    *,
    kernels: _Kernels | None = None,
) -> Chains:
    """:func:`build_identity` cut at ``block_size`` (the log's own block size when the frame
    carries log chains: the identity is exact at that size)."""
    if block_size <= 0:
        raise RooftraceError(f"block size must be positive, got {block_size}")
    identity = build_identity(requests, isolation, kernels=kernels)
    return chains_at(identity, identity.log_block_size or block_size, kernels=kernels)


def _log_lists(requests: pl.DataFrame, mask: npt.NDArray[np.bool_]) -> tuple[U64Array, I64Array]:
    """The log hash chains as flat ids and per-row offsets (rows outside ``mask`` get none)."""
    n = requests.height
    if not mask.any():
        return np.zeros(0, dtype=np.uint64), np.zeros(n + 1, dtype=np.int64)
    arr = requests.get_column("prefix_block_hashes").cast(pl.List(pl.UInt64)).to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    # Offsets index into the child array, sliced or not; only rows in mask are read.
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    ids = np.asarray(arr.values.fill_null(0), dtype=np.uint64)
    return ids, offsets


# --------------------------------------------------------------------------------------------
# explicit LRU (the replay engine uses one per replica; the tests use it as the reference)


class LRUPrefixCache:
    """A block-granular LRU prefix cache with an optional TTL.

    ``capacity_blocks=None`` is unbounded. Blocks are identified by their (salted, chained) hash.
    :meth:`lookup` is read-only; :meth:`touch` records use; :meth:`access` does both the way the
    accounting stage models one request. Expired blocks are dropped lazily: they are always the
    least recently used, so capacity eviction removes them first and the set of live blocks is
    exactly that of an eager implementation.
    """

    def __init__(self, capacity_blocks: int | None, ttl_s: float | None = None) -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise RooftraceError(f"cache capacity must be >= 0 blocks, got {capacity_blocks}")
        if ttl_s is not None and ttl_s < 0:
            raise RooftraceError(f"cache TTL must be >= 0 s, got {ttl_s}")
        self.capacity_blocks = capacity_blocks
        self.ttl_s = ttl_s
        self.evictions = 0
        self._last: OrderedDict[int, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def _live(self, block: int, now: float) -> bool:
        last = self._last.get(block)
        return last is not None and (self.ttl_s is None or now - last <= self.ttl_s)

    def __contains__(self, block: object) -> bool:
        return isinstance(block, int) and block in self._last

    def lookup(self, hashes: Iterable[int], now: float) -> int:
        """Number of leading blocks present and unexpired (the prefix property: stop at a miss)."""
        hits = 0
        for h in hashes:
            if not self._live(int(h), now):
                break
            hits += 1
        return hits

    def touch(self, hashes: Sequence[int] | U64Array, now: float) -> None:
        """Insert or refresh blocks used at ``now``, tail first, so the first block is the most
        recent and a prefix outlives its suffix; evict least recently used beyond capacity."""
        last = self._last
        for h in reversed([int(x) for x in hashes]):
            last[h] = now
            last.move_to_end(h)
        cap = self.capacity_blocks
        if cap is not None:
            while len(last) > cap:
                last.popitem(last=False)
                self.evictions += 1

    def access(
        self,
        hashes: Sequence[int] | U64Array,
        now: float,
        max_hits: int | None = None,
        extra: Sequence[int] | U64Array = (),
    ) -> int:
        """Look up ``hashes[:max_hits]``, then touch ``hashes`` and ``extra`` (blocks the request
        completes later, e.g. its output); return the number of leading hits."""
        limit = len(hashes) if max_hits is None else min(max_hits, len(hashes))
        hits = self.lookup([int(x) for x in hashes[:limit]], now)
        self.touch([*(int(x) for x in hashes), *(int(x) for x in extra)], now)
        return hits


# --------------------------------------------------------------------------------------------
# one pass: stack distances


#: Largest load factor of the block -> last position table of the distance kernel.
_TABLE_LOAD = 0.7


@dataclass(frozen=True, eq=False)
class Distances:
    """Per looked-up block (chain order), its effective LRU stack distance before its request.

    distance   int64; INF_DISTANCE for a first (or expired) touch. Block j of request i hits in a
               cache of C blocks iff distance <= C; distances are non-decreasing along a chain,
               so the hits are always a leading run (the prefix property).
    offsets    request i's looked-up blocks are distance[offsets[i]:offsets[i+1]] (int64, N+1)
    """

    distance: I64Array
    offsets: I64Array

    def hit_blocks(self, capacity_blocks: int | None) -> I64Array:
        """Leading hit blocks per request in a cache of ``capacity_blocks`` (None: unbounded)."""
        cap = INF_DISTANCE - 1 if capacity_blocks is None else capacity_blocks
        hit = (self.distance <= cap).astype(np.int64)
        csum = np.concatenate([[0], np.cumsum(hit)])
        return cast(I64Array, csum[self.offsets[1:]] - csum[self.offsets[:-1]])


def request_distances(
    touches: U64Array,
    touch_offsets: I64Array,
    lookups: I64Array,
    times_s: F64Array | None = None,
    ttl_s: float | None = None,
    *,
    running_max: bool = True,
    kernels: _Kernels | None = None,
) -> Distances:
    """One-pass LRU stack distances for requests that each look up a prefix, then touch blocks.

    Request i (in time order) touches ``touches[touch_offsets[i]:touch_offsets[i+1]]`` given in
    chain order (first block first; they are applied tail-first, see the module doc) and looks up
    its first ``lookups[i]`` blocks against the cache as it stood before the request.
    O(T log T) for T touches. ``times_s`` (per request) is needed only with ``ttl_s``.
    ``running_max=False`` returns the raw distances (tests use it to show that tail-first touching
    already makes them non-decreasing along each chain).
    """
    n_req = touch_offsets.shape[0] - 1
    counts = np.diff(touch_offsets)
    lookups = np.asarray(lookups, dtype=np.int64)
    if lookups.shape[0] != n_req or (lookups > counts).any() or (lookups < 0).any():
        raise RooftraceError("lookups must be between 0 and each request's number of touches")
    if ttl_s is not None and times_s is None:
        raise RooftraceError("a TTL needs the request times")
    kern = kernels if kernels is not None else _kernels()
    n = int(touches.shape[0])
    # Open-addressing table: one slot per distinct block at most, kept below _TABLE_LOAD full.
    slots = 1 << max(4, int(np.ceil(np.log2(max(n, 1) / _TABLE_LOAD))))
    table = np.zeros(2 * slots, dtype=np.uint64)
    q_off = _csr(lookups)
    out = np.empty(int(q_off[-1]), dtype=np.int64)
    t_req = np.zeros(n_req, dtype=np.float64) if times_s is None else np.asarray(times_s, dtype=np.float64)
    ttl = np.inf if ttl_s is None else float(ttl_s)
    kern.distance(
        np.ascontiguousarray(touches, dtype=np.uint64),
        np.ascontiguousarray(touch_offsets, dtype=np.int64),
        lookups,
        q_off,
        t_req,
        ttl,
        running_max,
        table,
        int(lookups.max(initial=0)),
        out,
    )
    return Distances(out, q_off)


def lru_hit_blocks(
    touches: U64Array,
    touch_offsets: I64Array,
    lookups: I64Array,
    capacities: Sequence[int],
    rows: I64Array | None = None,
    *,
    kernels: _Kernels | None = None,
) -> list[I64Array]:
    """Leading hit blocks of requests ``rows`` (time order; default all, as laid out) in an LRU
    cache of each of ``capacities`` blocks: ``request_distances(...).hit_blocks(c)`` on the
    requests ``rows`` alone, for a few capacities known in advance, by simulating each cache
    directly instead of a stack of every block ever seen. Reads the chains in place (no copy of
    the touches of ``rows``) and holds at most ``c`` blocks a cache, so the tables stay
    cache-sized; O(touches × capacities). Request arrays as for :func:`request_distances`:
    ``lookups`` per request of the layout (those of ``rows`` are read)."""
    off = np.asarray(touch_offsets, dtype=np.int64)
    rows = np.arange(off.shape[0] - 1, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    lookups = np.asarray(lookups, dtype=np.int64)
    counts = off[rows + 1] - off[rows]
    if lookups.shape[0] != off.shape[0] - 1 or (lookups[rows] > counts).any() or (lookups[rows] < 0).any():
        raise RooftraceError("lookups must be between 0 and each request's number of touches")
    if any(int(c) < 0 for c in capacities):
        raise RooftraceError("cache capacities must be >= 0 blocks")
    total = int(counts.sum())
    if total >= np.iinfo(np.int32).max:
        raise RooftraceError(f"{total:,} block touches are more than one LRU simulation indexes (2^31 - 1)")
    # a cache never holds more blocks than the requests touch: size it by the smaller
    caps = [min(int(c), total) for c in capacities]
    sizes = sorted({c for c in caps if c > 0})
    hits: dict[int, I64Array] = {0: np.zeros(rows.shape[0], dtype=np.int64)}
    kern = kernels if kernels is not None else _kernels()
    touches = np.ascontiguousarray(touches, dtype=np.uint64)
    for top, cap in zip(sizes[::2], [*sizes[1::2], sizes[-1]] if len(sizes) % 2 else sizes[1::2], strict=True):
        # one list of ``cap`` blocks whose ``top`` most recent are the smaller cache
        slots = 1 << max(4, (2 * cap - 1).bit_length())  # load factor at most 1/2
        out = np.zeros((2, rows.shape[0]), dtype=np.int64)
        kern.lru(
            touches,
            off,
            rows,
            lookups,
            top,
            cap,
            np.zeros(cap, dtype=np.uint64),
            np.zeros(cap, dtype=np.int32),
            np.zeros(cap, dtype=np.int32),
            np.zeros(cap, dtype=np.bool_),
            np.zeros(slots, dtype=np.uint64),
            np.full(slots, -1, dtype=np.int32),
            out,
        )
        hits[top], hits[cap] = out[0], out[1]
    return [hits[c] for c in caps]


def lru_stack_distances(accesses: npt.ArrayLike, *, kernels: _Kernels | None = None) -> I64Array:
    """Classic per-access LRU stack distances (Mattson et al. 1970) of an access sequence.

    Distance 1 means the block was the most recently used one; INF_DISTANCE marks a first access.
    An access hits in an LRU cache of C blocks iff its distance <= C, for every C at once.
    """
    seq = np.asarray(accesses, dtype=np.uint64)
    n = seq.shape[0]
    return request_distances(
        seq, np.arange(n + 1, dtype=np.int64), np.ones(n, dtype=np.int64), kernels=kernels
    ).distance


def hits_by_capacity(distance: I64Array, weights: npt.ArrayLike, capacities: npt.ArrayLike) -> F64Array:
    """Sum of ``weights`` of the lookups that hit, for every capacity (in blocks) at once."""
    order = np.argsort(distance, kind="stable")
    d = distance[order]
    w = np.asarray(weights, dtype=np.float64)
    if w.shape == ():
        w = np.full(distance.shape[0], float(w))
    csum = np.concatenate([[0.0], np.cumsum(w[order])])
    idx = np.searchsorted(d, np.asarray(capacities, dtype=np.int64), side="right")
    return cast(F64Array, csum[idx])


class AccessPlan(NamedTuple):
    """How the cache sees each request of a Chains: what it touches and what it looks up."""

    touches: U64Array
    touch_offsets: I64Array
    lookups: I64Array


def access_plan(chains: Chains, rows: I64Array | None = None, *, kernels: _Kernels | None = None) -> AccessPlan:
    """Touches per request (full prompt blocks, then the full blocks its output completes) and
    lookups (``(n - 1) // block_size`` leading blocks), for ``rows`` in the order given."""
    rows = np.arange(chains.n_requests, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
    full = chains.full_blocks()[rows]
    n_out = np.diff(chains.out_offsets)[rows]
    counts = full + n_out
    t_off = _csr(counts)
    touches = np.empty(int(t_off[-1]), dtype=np.uint64)
    (kernels if kernels is not None else _kernels()).plan(
        rows, chains.offsets, full, chains.out_offsets, chains.hashes, chains.out_hashes, t_off, touches
    )
    return AccessPlan(touches, t_off, chains.lookup_blocks()[rows])
