"""numba kernels of the jit engine (pipeline/engine/jit.py). Imported only when that engine runs:
importing this module imports numba and defines (lazily compiled, disk-cached) functions.

The whole fleet runs in one compiled loop, step by step as the reference engine does (same order
of operations, so the same floating-point results), with the scheduler state in arrays:

- per request: computed / sampled tokens, blocks held, prefix blocks registered, slot;
- per replica: the running list (admission order), the waiting queue (a ring buffer: preempted
  requests go to its front), a block table per running slot, the KV block pool as vLLM's
  (free queue = doubly linked list over block ids, in eviction order; reference counts), and the
  prefix cache: an open-addressing table (linear probing, backward-shift deletion) from a block
  hash to the list of blocks holding it, oldest first.

Every step is priced by pipeline.costmodel.stepcost.tab_row (the tabulated step cost) on one row.
Semantics: docs/engine.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numba
import numpy as np
from llvmlite import ir  # type: ignore[import-untyped]
from numba.core import cgutils, types
from numba.extending import intrinsic

from pipeline.common.blockhash import compiled_hash
from pipeline.costmodel.stepcost import row_kernel, span_kernels
from pipeline.engine.jitcache import jit_cache_dir, kernel_stamp


def _drop_stale_cache() -> None:
    """numba's disk cache of this module is keyed on this file alone, but the loop inlines the
    step-cost kernels of pipeline/costmodel/stepcost.py and the block hash of pipeline/common/blockhash.py:
    when they change, the cached machine code would keep the old ones. A stamp of their source
    (jitcache.kernel_stamp) beside the cache detects it; the stale entries are removed so numba
    compiles afresh (silently skipped where the package is installed read-only: an installed
    package's files do not change). The folder is made here when Python has not made it (it
    writes no bytecode under PYTHONDONTWRITEBYTECODE): a cache written without its stamp would
    be taken for stale and removed by the next process."""
    cache = jit_cache_dir(Path(__file__).resolve())
    digest = kernel_stamp()
    stamp = cache / f"_jit_kernels.stepcost-{digest}.stamp"
    try:
        if stamp.exists():
            return
        cache.mkdir(parents=True, exist_ok=True)
        for old in [
            *cache.glob("_jit_kernels.*.nbi"),
            *cache.glob("_jit_kernels.*.nbc"),
            *cache.glob("_jit_kernels.stepcost-*.stamp"),
        ]:
            old.unlink(missing_ok=True)
        stamp.touch()
    except OSError:
        pass


_drop_stale_cache()

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing multiplier (Knuth, TAOCP vol. 3 §6.4)
_SHIFT = np.uint64(32)
_LOW = np.uint64(0xFFFFFFFF)
_U0 = np.uint64(0)
_INF = np.inf
#: An int64 that numba does not type as a literal: a constant passed to a kernel or piece
#: (``_I0(0)``, not ``0``) would compile it once more for that literal value (``Literal[int](0)``
#: beside ``int64``), and a loop counter that starts at a literal 0 compiles the pieces it is
#: passed to twice (typed first with the literal, then with int64). Compile time only: same values.
_I0: Any = np.int64

# Step-log columns (float64 matrix), in steplog.SPAN_COLUMNS order.
LOG_COLS = 18
#: Step-log rows reserved per request before the loop starts (a replay logs 2-3 spans a request:
#: 2.7 on benchmarks/replay.py's agent sessions). np.zeros maps the rows without touching them,
#: so rows never written cost no memory, and a log that outgrows them grows in place
#: (run_fleet): only the rows written are ever faulted in, not every doubling's copy.
LOG_ROWS_PER_REQUEST = 3


# One step's cost: pipeline.costmodel.stepcost.tab_row, compiled (the same function every engine and
# TabulatedCost call uses, so all give the same numbers); in decode spans its split form
# (tab_span_prep once per span, tab_span_row per step: the same operations on the same values).
_tab_row: Any = row_kernel()
_span_prep: Any
_span_row: Any
_span_prep, _span_row = span_kernels()
# A prefix block's hash (pipeline.common.blockhash.block_hash): the lazy chains below give the
# same hashes as the identity's materialised ones.
_block_hash = compiled_hash()[1]

# The KV pool's, prefix cache's, step log's and arrival heap's kernels (forceinline=False: see
# run_fleet's pieces below). Like the pieces they are only ever called from _replay, which is
# compiled and cached with them inlined: they have no Python wrapper and no cache of their own.
_kernel = numba.njit(forceinline=False, _nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]
#: A kernel LLVM must inline (_uncache: left to its judgement, it stayed a call, ~2x slower
#: on agent sessions).
_kernel_inline = numba.njit(forceinline=True, _nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]


@intrinsic
def _prefetch_hint(typingctx, arr, r, i):  # type: ignore[no-untyped-def]
    """A hint that ``arr[r, i]`` will be read soon (llvm.prefetch, for reading, high locality): it
    starts the cache miss early and changes nothing else."""
    sig = types.void(arr, r, i)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], signature.args[1:], strict=True)]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)  # type: ignore[no-untyped-call]
        i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0"
        )
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


#: ``_prefetch(arr, r, i)`` in compiled code (the typing context is numba's; Any for mypy).
_prefetch: Any = _prefetch_hint

#: How many blocks ahead the prefix cache's loops prefetch (_take_blocks, _register).
_AHEAD = 8


@_kernel
def _home(h, mask):  # type: ignore[no-untyped-def]
    return int((h * _GOLDEN) >> _SHIFT) & mask


# The prefix cache's table: per replica one uint64 row of 2·T words, slot i's two in one 16-byte
# pair (a probe reads one cache line, not one per field): word 2i the key, word 2i+1 its holder
# list's ends packed, (head + 1) | (tail + 1) << 32, 0 for an empty slot (a slot in use always has
# a holder, so head >= 0 there).
@_kernel
def _ends(ht, r, i):  # type: ignore[no-untyped-def]
    """(head, tail) of slot ``i``'s holder list (-1, -1 for an empty slot)."""
    w = ht[r, 2 * i + 1]
    return np.int64(w & _LOW) - 1, np.int64(w >> _SHIFT) - 1


@_kernel
def _set_ends(ht, r, i, head, tail):  # type: ignore[no-untyped-def]
    ht[r, 2 * i + 1] = np.uint64(head + 1) | (np.uint64(tail + 1) << _SHIFT)


@_kernel
def _find(ht, r, mask, h):  # type: ignore[no-untyped-def]
    i = _home(h, mask)
    while ht[r, 2 * i + 1] != _U0:
        if ht[r, 2 * i] == h:
            return i
        i = (i + 1) & mask
    return -1


@_kernel
def _delete(ht, r, mask, i):  # type: ignore[no-untyped-def]
    """Remove slot i of a linear-probing table by shifting later entries of its cluster back."""
    ht[r, 2 * i + 1] = _U0
    j = i
    while True:
        j = (j + 1) & mask
        if ht[r, 2 * j + 1] == _U0:
            return
        k = _home(ht[r, 2 * j], mask)
        # Entry j may move to i unless its home lies cyclically in (i, j].
        stays = i < k <= j if i <= j else k > i or k <= j
        if stays:
            continue
        ht[r, 2 * i] = ht[r, 2 * j]
        ht[r, 2 * i + 1] = ht[r, 2 * j + 1]
        ht[r, 2 * j + 1] = _U0
        i = j


@_kernel_inline
def _uncache(r, b, bhash, hashed, hprev, hnext, ht, mask):  # type: ignore[no-untyped-def]
    """Drop block b's hash (b is being reused): unlink it from its hash's holders."""
    e = _find(ht, r, mask, bhash[r, b])
    head, tail = _ends(ht, r, e)
    p = hprev[r, b]
    q = hnext[r, b]
    if p >= 0:
        hnext[r, p] = q
    else:
        head = q
    if q >= 0:
        hprev[r, q] = p
    else:
        tail = p
    if head < 0:
        _delete(ht, r, mask, e)
    else:
        _set_ends(ht, r, e, head, tail)
    hashed[r, b] = False


@_kernel
def _cache(r, b, h, bhash, hashed, hprev, hnext, ht, mask):  # type: ignore[no-untyped-def]
    """Give block b the hash h: append it to h's holders (a lookup takes the oldest)."""
    i = _home(h, mask)
    while ht[r, 2 * i + 1] != _U0 and ht[r, 2 * i] != h:
        i = (i + 1) & mask
    if ht[r, 2 * i + 1] == _U0:
        ht[r, 2 * i] = h
    head, t = _ends(ht, r, i)
    hprev[r, b] = t
    hnext[r, b] = -1
    if t >= 0:
        hnext[r, t] = b
    else:
        head = b
    _set_ends(ht, r, i, head, b)
    bhash[r, b] = h
    hashed[r, b] = True


# The free queue of a replica (the blocks no request holds, in eviction order) is a ring of block
# ids with lazy removal: fq[r] holds the entries at positions fh[r] .. ft[r] - 1 (position p in
# slot p & qm), fpos[r, b] the slot of block b's live entry (-1: b is not free). A cache hit
# leaves the queue by marking its entry stale (fpos = -1, or a later live entry elsewhere), and
# taking the head skips stale entries. The order (so which block, and which hash, is evicted
# next) is a doubly linked list's, but taking n blocks reads the ring in order instead of
# chasing a pointer from each block to the next (a cache miss each, one after the other).
@_kernel
def _pop_block(r, s, rid, nfree, fh, fq, fpos, ft, ref, table, nblk, bhash, hashed, hprev, hnext):  # type: ignore[no-untyped-def]
    """Give request ``rid`` (slot ``s`` of replica ``r``) the free queue's head block, the one vLLM
    evicts first (the caller knows one is free), and prefetch its record and the free-queue slot
    of the entry _AHEAD on (the hash it holds is dropped by the caller: _uncache). Returns it."""
    qm = fq.shape[1] - 1
    h = fh[r]
    b = fq[r, h & qm]
    while fpos[r, b] != h & qm:
        h += 1
        b = fq[r, h & qm]
    fpos[r, b] = -1
    fh[r] = h + 1
    _prefetch(fpos, r, fq[r, (h + _AHEAD) & qm])
    nfree[r] -= 1
    _prefetch(hashed, r, b)
    _prefetch(bhash, r, b)
    _prefetch(hprev, r, b)
    _prefetch(hnext, r, b)
    ref[r, b] = 1
    table[r, s, nblk[rid]] = b
    nblk[rid] += 1
    return b


@_kernel
def _prefetch_slot(r, b, bhash, hashed, ht, mask):  # type: ignore[no-untyped-def]
    """Prefetch the table slot of the hash block ``b`` holds (if it holds one)."""
    if hashed[r, b]:
        _prefetch(ht, r, 2 * _home(bhash[r, b], mask))


# Taking blocks is done in two passes: the free queue's head blocks first (each one's record
# prefetched), then the hashes they held dropped in the same order (each one's table slot
# prefetched _AHEAD blocks on). It is the same operations in the same order on each structure
# (the free queue and the hash table share nothing), with the cache misses of one block
# overlapping the work of the ones before it.
@_kernel
def _take_blocks(  # type: ignore[no-untyped-def]
    r, s, rid, need, nfree, fh, fq, fpos, ft, ref, table, nblk, bhash, hashed, hprev, hnext, ht, mask
):  # fmt: skip
    """Give request ``rid`` (slot ``s`` of replica ``r``) ``need`` blocks from the head of the free
    queue, dropping the hashes they held as cached blocks."""
    j0 = nblk[rid]
    for _ in range(need):
        _pop_block(r, s, rid, nfree, fh, fq, fpos, ft, ref, table, nblk, bhash, hashed, hprev, hnext)
    j1 = j0 + need
    for j in range(j0, min(j0 + _AHEAD, j1)):
        _prefetch_slot(r, table[r, s, j], bhash, hashed, ht, mask)
    for j in range(j0, j1):
        if j + _AHEAD < j1:
            _prefetch_slot(r, table[r, s, j + _AHEAD], bhash, hashed, ht, mask)
        b = table[r, s, j]
        if hashed[r, b]:
            _uncache(r, b, bhash, hashed, hprev, hnext, ht, mask)


@_kernel
def _unlink_free(r, b, nfree, fpos):  # type: ignore[no-untyped-def]
    """Take block ``b`` (a cache hit with no other user) out of replica ``r``'s free queue: its
    entry in the ring goes stale (_pop_block skips it)."""
    fpos[r, b] = -1
    nfree[r] -= 1


@_kernel
def _tree_walk(a, lo, t_up, t_fb, rec_node, rec_fb):  # type: ignore[no-untyped-def]
    """A lazy chain (pipeline.classify.prefix.ChainTree) from node ``a``: the nodes its blocks
    ``lo`` and after can come from, along the ``up`` links until one sharing at most ``lo``
    blocks, into ``rec_node``/``rec_fb``; returns how many (``_tree_hash`` starts at the last)."""
    n = 0
    while True:
        rec_node[n] = a
        rec_fb[n] = t_fb[a]
        n += 1
        if t_fb[a] <= lo:
            return n
        a = t_up[a]


@_kernel
def _tree_hash(j, p, t_key, rec_node, rec_fb):  # type: ignore[no-untyped-def]
    """Hash of block ``j`` of the walk in ``rec_node``/``rec_fb`` (blocks in increasing order,
    ``p`` the record the previous block came from); returns (hash, p)."""
    while p > 0 and rec_fb[p - 1] <= j:
        p -= 1
    return _block_hash(t_key[rec_node[p]], j), p


@_kernel
def _register(  # type: ignore[no-untyped-def]
    r, s, rid, target, nreg, table, chain, chain_off, bhash, hashed, hprev, hnext, ht, mask,
    t_rows, t_key, t_up, t_fb, rec_node, rec_fb,
):  # fmt: skip
    """Give request ``rid``'s blocks ``nreg[rid]`` .. ``target - 1`` (full now) their prefix hashes
    (from ``chain``, or hashed from the lazy chain ``t_*`` when it is given)."""
    lo = nreg[rid]
    if lo >= target:
        return
    tree = t_rows.shape[0] > 0
    p = _tree_walk(t_rows[rid], lo, t_up, t_fb, rec_node, rec_fb) - 1 if tree else 0
    # The table slots of the hashes _AHEAD blocks on are prefetched (a second cursor in the walk).
    pa = p
    for j in range(lo, min(lo + _AHEAD, target)):
        if tree:
            ha, pa = _tree_hash(j, pa, t_key, rec_node, rec_fb)
        else:
            ha = chain[chain_off[rid] + j]
        _prefetch(ht, r, 2 * _home(ha, mask))
    for j in range(lo, target):
        if j + _AHEAD < target:
            if tree:
                ha, pa = _tree_hash(j + _AHEAD, pa, t_key, rec_node, rec_fb)
            else:
                ha = chain[chain_off[rid] + j + _AHEAD]
            _prefetch(ht, r, 2 * _home(ha, mask))
        if tree:
            h, p = _tree_hash(j, p, t_key, rec_node, rec_fb)
        else:
            h = chain[chain_off[rid] + j]
        b = table[r, s, j]
        if not hashed[r, b]:
            _cache(r, b, h, bhash, hashed, hprev, hnext, ht, mask)
    nreg[rid] = target


@_kernel
def _release(r, s, rid, nfree, fh, fq, fpos, ft, ref, table, nblk):  # type: ignore[no-untyped-def]
    """Return request ``rid``'s blocks (slot ``s``) to the free queue's tail, its last block first
    (vLLM frees in reverse order, so a prefix's tail is evicted before its head). A full ring is
    compacted first: its live entries, in order, from its head on."""
    for j in range(nblk[rid] - 1, -1, -1):
        b = table[r, s, j]
        ref[r, b] -= 1
        if ref[r, b] == 0:
            qm = fq.shape[1] - 1
            if ft[r] - fh[r] > qm:
                w = fh[r]
                for p in range(fh[r], ft[r]):
                    e = fq[r, p & qm]
                    if fpos[r, e] == p & qm:
                        fq[r, w & qm] = e
                        fpos[r, e] = w & qm
                        w += 1
                ft[r] = w
            t = ft[r]
            fq[r, t & qm] = b
            fpos[r, b] = t & qm
            ft[r] = t + 1
            nfree[r] += 1


@_kernel
def _log_span(  # type: ignore[no-untyped-def]
    log,
    nlog,
    last_row,
    r,
    start,
    end,
    steps,
    p_tok,
    p_seq,
    d_seq,
    running,
    waiting,
    kv_used,
    flops,
    nbytes,
    compute,
    memory,
    comm,
    overhead,
    measured,
):
    """Append a span of ``steps`` identical-batch steps to the log, or extend the replica's
    latest row when this continues it (decode only, same batch and queue, no gap). The caller
    makes room for one more row."""
    lr = last_row[r]
    if (
        p_tok == 0.0
        and lr >= 0
        and log[lr, 4] == 0.0
        and log[lr, 6] == d_seq
        and log[lr, 8] == running
        and log[lr, 9] == waiting
        and log[lr, 2] == start
    ):
        row = log[lr]
        row[2] = end
        row[3] += steps
        row[7] += d_seq * steps
        row[10] = kv_used
    else:
        row = log[nlog]
        row[0] = r
        row[1] = start
        row[2] = end
        row[3] = steps
        row[4] = p_tok
        row[5] = p_seq
        row[6] = d_seq
        row[7] = d_seq * steps
        row[8] = running
        row[9] = waiting
        row[10] = kv_used
        row[11] = 0.0
        row[12] = 0.0
        row[13] = 0.0
        row[14] = 0.0
        row[15] = 0.0
        row[16] = 0.0
        row[17] = 0.0
        last_row[r] = nlog
        nlog += 1
    row[11] += flops
    row[12] += nbytes
    row[13] += compute
    row[14] += memory
    row[15] += comm
    row[16] += overhead
    row[17] += measured
    return nlog


@_kernel
def _heap_push(heap_t, heap_s, heap_i, heap_n, t, sq, item):  # type: ignore[no-untyped-def]
    """Push ``(t, sq, item)`` on the closed loop's arrival heap (ordered by time, then ``sq``);
    returns the heap's new size."""
    p = heap_n
    while p > 0:
        q = (p - 1) // 2
        if heap_t[q] > t or (heap_t[q] == t and heap_s[q] > sq):
            heap_t[p], heap_s[p], heap_i[p] = heap_t[q], heap_s[q], heap_i[q]
            p = q
        else:
            break
    heap_t[p], heap_s[p], heap_i[p] = t, sq, item
    return heap_n + 1


@_kernel
def _heap_pop(heap_t, heap_s, heap_i, heap_n):  # type: ignore[no-untyped-def]
    """Remove the heap's root (the caller has read it); returns the heap's new size."""
    heap_n -= 1
    if heap_n > 0:  # sift the last entry down from the root
        lt, ls, li = heap_t[heap_n], heap_s[heap_n], heap_i[heap_n]
        p = 0
        while True:
            c = 2 * p + 1
            if c >= heap_n:
                break
            if c + 1 < heap_n and (
                heap_t[c + 1] < heap_t[c] or (heap_t[c + 1] == heap_t[c] and heap_s[c + 1] < heap_s[c])
            ):
                c += 1
            if heap_t[c] < lt or (heap_t[c] == lt and heap_s[c] < ls):
                heap_t[p], heap_s[p], heap_i[p] = heap_t[c], heap_s[c], heap_i[c]
                p = c
            else:
                break
        heap_t[p], heap_s[p], heap_i[p] = lt, ls, li
    return heap_n


@_kernel
def _most_free_kv(nfree, claim):  # type: ignore[no-untyped-def]
    """The replica with the most free KV blocks net of its waiting requests' claims
    (model.choose_replica's most_free_kv: ``nfree[r] - claim[r]``), ties to the lowest index."""
    dest = 0
    for r in range(1, nfree.shape[0]):
        if nfree[r] - claim[r] > nfree[dest] - claim[dest]:
            dest = r
    return dest


@_kernel_inline
def _outstanding(r, t, routed, nfin, last_end, last_nfin):  # type: ignore[no-untyped-def]
    """Requests routed to replica ``r`` and not finished at ``t`` (least outstanding's count).
    Finishes at or before t count as done; only a replica's latest step can end after t (steps
    run in start order, every start so far is <= t)."""
    o = routed[r] - nfin[r]
    if last_end[r] > t:
        o += last_nfin[r]
    return o


@_kernel
def _route(i, t, router, rr, aff_rep, routed, nfin, last_end, last_nfin, nfree, claim):  # type: ignore[no-untyped-def]
    """The replica that request ``i``, arriving at ``t``, is routed to (see run_fleet)."""
    R = routed.shape[0]
    if router == 0:
        return rr % R
    if router == 3:
        return _most_free_kv(nfree, claim)
    if router == 2 and aff_rep[i] >= 0:
        return aff_rep[i]
    dest = 0
    best = -1
    for r in range(R):
        o = _outstanding(r, t, routed, nfin, last_end, last_nfin)
        if best < 0 or o < best:
            best = o
            dest = r
    return dest


@_kernel
def _next_step(nrun, wlen, clock, ready):  # type: ignore[no-untyped-def]
    """The replica whose next step starts first (ties: lowest index; -1 if none has work), its
    start, and the next start of any other busy replica."""
    first = -1
    first_t = _INF
    second_t = _INF
    for r in range(nrun.shape[0]):
        if nrun[r] > 0 or wlen[r] > 0:
            s_r = max(clock[r], ready[r])
            if s_r < first_t:
                second_t = first_t
                first_t = s_r
                first = r
            elif s_r < second_t:
                second_t = s_r
    return first, first_t, second_t


@numba.njit(cache=True)
def _pod_of(key, cuts):  # type: ignore[no-untyped-def]
    if key < 0:  # a rejected request (routed nowhere): pod 0 reports it
        return 0
    if cuts.shape[0] == 0:  # the key is the pod
        return key
    return np.searchsorted(cuts, key, side="right") - 1


@numba.njit(cache=True)
def group_rows(keys, cuts, pods, order):  # type: ignore[no-untyped-def]
    """Request rows grouped by pod (a counting sort, no copy of the day's keys): request i goes
    to the pod whose replica range ``cuts`` holds ``keys[i]`` (its route; with no cuts, the key
    is the pod), or to pod 0 when ``keys[i]`` < 0. Fills ``order`` with the rows, pod after pod,
    increasing within a pod, and returns where each of the ``pods`` pods' rows start (``pods`` +
    1 entries)."""
    n = keys.shape[0]
    start = np.zeros(pods + 1, np.int64)
    for i in range(n):
        start[_pod_of(keys[i], cuts) + 1] += 1
    for k in range(pods):
        start[k + 1] += start[k]
    fill = start[:pods].copy()
    for i in range(n):
        k = _pod_of(keys[i], cuts)
        order[fill[k]] = i
        fill[k] += 1
    return start


@numba.njit(cache=True, nogil=True)
def gather_chains(hashes, offsets, rows, out_offsets, out):  # type: ignore[no-untyped-def]
    """The chains of requests ``rows`` (``hashes[offsets[r]:offsets[r + 1]]`` each), one after
    another into ``out`` at ``out_offsets`` (their lengths' running sum): a pod's chains cut out
    of the day's with no temporary the size of the copy (the thread executor cuts pods at once)."""
    for j in range(rows.shape[0]):
        a = offsets[rows[j]]
        b = out_offsets[j]
        for k in range(out_offsets[j + 1] - b):
            out[b + k] = hashes[a + k]


# -- run_fleet's event loop, in pieces: _replay (the loop) and the functions it calls. They are
# compiled without reference counting (_nrt=False): they allocate nothing, every array they touch
# belongs to run_fleet. Each piece is inlined by LLVM wherever it is called (forceinline), so the
# loop runs as one function and handing the state tuples to a piece costs nothing. (With reference
# counting, every array a piece takes is counted up and down at each call; pieces left as calls
# pass hundreds of arguments: an earlier split ran at half the speed. Inlining them at numba-IR
# level instead, inline="always", is as fast but compiles slower: 41 s against 36 s.) The kernels
# above are left to LLVM's judgement (forceinline=False, else they inherit forceinline from the
# piece that compiles them first, and the loop grows too big to be fast).
#
# Compile time (the first replay in a fresh clone compiles all of this, docs/benchmarks.md): only
# _replay, called from Python, is cached on disk and has a Python wrapper; the pieces and kernels
# are compiled as it needs them, each once, without a wrapper (a wrapper unboxes every array of
# every tuple a function takes: the largest part of a piece's code) and without a cache entry of
# their own (a cached _replay has them inlined; when _replay compiles again, so must they: their
# sources are this file). Everything run_fleet does once (allocation, the argsort of arrival
# times, growing the step log or the waiting queues) is numpy, compiled by nobody. _replay is
# compiled for one kind of fleet at a time (_replay_loop: with lockstep groups or without), each
# piece for one signature (no literal arguments: _I0). A command that replays starts the
# compile in a background process first thing (jitcache.compile_ahead), which shares it with a
# second one (the end of this file: "the compile in two processes"). Leaf pieces take the arrays
# they use, not the whole state tuples (a tuple is passed as all its arrays' fields: the larger
# part of a piece's unoptimised code; measured at load 13: ~5 % less compile CPU, speed unchanged).
#
# The tuples, built by run_fleet:
#   wl   workload (Work): times, prompt, output, chain_off, chain, aff_rep, rejected, and the lazy
#        chains t_rows, t_key, t_up, t_fb with their walk's scratch rec_node, rec_fb; skip (the
#        log's reported cache hits, Workload.skipped_tokens)
#   fl   fleet (Fleet's first 13 fields, then async_scheduling): R, router, closed, C, S, budget_max,
#        bs, chunked, caching, want_log, G, dummy_s, think_s, asy
#   req  per request (_requests), rep per replica (_replicas), pool (jit.alloc_pool),
#   scr  scratch (_scratch), cost (TabulatedCost.kernel_tables), res (results, Results),
#   ev   arrivals: order, heap_t, heap_s, heap_i, static, own_start, own_t, own_ptr.
_piece = numba.njit(forceinline=True, _nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]

#: A piece another process may compile (_span_one: compile_spans), cached on disk with its
#: linkable code like the step-cost kernels.
_piece_cached = numba.njit(  # type: ignore[call-overload]
    cache=True, forceinline=True, _nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True
)

_DONE = 0  # _replay's exits: the fleet is done (or cancelled) ...
_GROW_LOG = 1  # ... the next event may need a bigger step log ...
_GROW_WQ = 2  # ... or bigger waiting queues (run_fleet grows them and calls _replay again).


@_piece
def _issue(t, closed, think, n, heap_t, heap_s, heap_i, heap_n, seq, next_issue):  # type: ignore[no-untyped-def]
    """Closed loop: a request done at ``t`` (finished or rejected) frees its client, who issues the
    next request at ``t + think``. Returns the new (heap_n, seq, next_issue)."""
    if closed and next_issue < n:
        heap_n = _heap_push(heap_t, heap_s, heap_i, heap_n, t + think, seq, next_issue)
        seq += 1
        next_issue += 1
    return heap_n, seq, next_issue


@_piece
def _enqueue(i, t, dest, ready, whead, wlen, routed, res_replica, static, own_ptr, wq):  # type: ignore[no-untyped-def]
    """Request ``i``, arriving at ``t``, joins the tail of replica ``dest``'s waiting queue (the
    caller made room)."""
    res_replica[i] = dest
    if static:
        own_ptr[dest] += 1
    routed[dest] += 1
    if t > ready[dest]:
        ready[dest] = t
    wq[dest, (whead[dest] + wlen[dest]) % wq.shape[1]] = i
    wlen[dest] += 1


@_piece
def _room(g0, G, want_log, nlog, log, nrun, wlen, wq):  # type: ignore[no-untyped-def]
    """_DONE if a step or span of the group from replica ``g0`` cannot outgrow the step log (one row
    per rank) or the waiting queues (a step preempts at most its running requests), else what to
    grow."""
    if want_log and nlog + G > log.shape[0]:
        return _GROW_LOG
    for r in range(g0, g0 + G):
        if wlen[r] + nrun[r] > wq.shape[1]:
            return _GROW_WQ
    return _DONE


@_piece
def _free(r, rid, caching, nblk, nreg, slot_of, slots_free, nslots, pool):  # type: ignore[no-untyped-def]
    """Give back request ``rid``'s KV blocks and running slot on replica ``r`` (it finished or is
    preempted)."""
    nfree, fh, fq, fpos, ft, ref, table = pool[0], pool[1], pool[2], pool[3], pool[4], pool[5], pool[6]
    vs = slot_of[rid]
    if not caching:
        nfree[r] += nblk[rid]
    else:
        _release(r, vs, rid, nfree, fh, fq, fpos, ft, ref, table, nblk)
    nblk[rid] = 0
    nreg[rid] = 0
    slots_free[r, nslots[r]] = vs
    nslots[r] += 1
    slot_of[rid] = -1


@_piece
def _alloc(r, s, rid, need, tokens, bs, caching, nblk, nreg, chains, pool):  # type: ignore[no-untyped-def]
    """Give request ``rid`` (slot ``s`` of replica ``r``) ``need`` more blocks from the head of the
    free queue; with prefix caching, its blocks full at ``tokens`` tokens get their hashes.
    ``chains`` is (chain_off, chain, t_rows, t_key, t_up, t_fb, rec_node, rec_fb)."""
    nfree, fh, fq, fpos, ft, ref, table, bhash, hashed, hprev, hnext, ht, mask = pool
    if not caching:  # unhashed blocks are interchangeable: count them
        nfree[r] -= need
        nblk[rid] += need
    else:
        chain_off, chain, t_rows, t_key, t_up, t_fb, rec_node, rec_fb = chains
        _take_blocks(
            r, s, rid, need, nfree, fh, fq, fpos, ft, ref, table, nblk, bhash, hashed, hprev, hnext, ht, mask
        )  # fmt: skip
        target = min(tokens // bs, chain_off[rid + 1] - chain_off[rid])
        _register(
            r, s, rid, target, nreg, table, chain, chain_off,
            bhash, hashed, hprev, hnext, ht, mask,
            t_rows, t_key, t_up, t_fb, rec_node, rec_fb,
        )  # fmt: skip


@_piece
def _schedule_running(  # type: ignore[no-untyped-def]
    r, gi, budget_max, bs, caching, prompt, output, spk, req, nrun, running, slots_free, nslots, whead, wlen, wq,
    sched_rid, sched_n, res_preempt, chains, pool,
):  # fmt: skip
    """vLLM v1 schedule()'s first loop on replica ``r`` (lockstep rank ``gi``): the running
    requests, in admission order, get their next tokens within the token budget, preempting the
    most recently admitted while the KV pool lacks blocks. With speculative decoding (``spk`` > 0
    draft tokens) a decode is a verification of its last token and up to ``spk`` drafts
    (model.Speculation). Returns (requests scheduled, budget left, whether any was preempted)."""
    computed, gen, nblk, nreg, slot_of = req[0], req[1], req[2], req[3], req[4]
    nfree = pool[0]
    budget = budget_max
    nsched = 0
    preempted = False
    idx = 0
    while idx < nrun[r] and budget > 0:
        rid = running[r, idx]
        ntok = prompt[rid] + gen[rid]
        n_new = min(ntok - computed[rid], budget)
        if spk > 0 and ntok - computed[rid] == 1 and gen[rid] > 0:
            n_new += max(0, min(spk, output[rid] - gen[rid] - 1, budget - 1))
        self_pre = False
        while True:
            tokens_after = computed[rid] + n_new
            need = max(0, -(-tokens_after // bs) - nblk[rid])
            if need <= nfree[r]:
                break
            # Preempt the most recently admitted request (vLLM: self.running.pop()).
            victim = running[r, nrun[r] - 1]
            nrun[r] -= 1
            _free(r, victim, caching, nblk, nreg, slot_of, slots_free, nslots, pool)
            computed[victim] = 0
            res_preempt[victim] += 1
            whead[r] = (whead[r] - 1) % wq.shape[1]  # to the queue's front (_room made room)
            wq[r, whead[r]] = victim
            wlen[r] += 1
            preempted = True
            if victim == rid:
                self_pre = True
                break
        if self_pre:
            break
        # allocate `need` blocks from the head of the free queue
        _alloc(r, slot_of[rid], rid, need, min(tokens_after, ntok), bs, caching, nblk, nreg, chains, pool)
        sched_rid[gi, nsched] = rid
        sched_n[gi, nsched] = n_new
        nsched += 1
        budget -= n_new
        idx += 1
    return nsched, budget, preempted


@_piece
def _prefix_hits(r, rid, ntok, bs, chains, ht, mask, hits):  # type: ignore[no-untyped-def]
    """The prefix cache's hits for waiting request ``rid`` (``ntok`` tokens) on replica ``r``: its
    leading full blocks (never the last token's) whose hashes are cached, into ``hits``; returns
    how many."""
    chain_off, chain, t_rows, t_key, t_up, t_fb, rec_node, rec_fb = chains
    nh = 0
    lo = chain_off[rid]
    lim = min((ntok - 1) // bs, chain_off[rid + 1] - lo)
    tree = t_rows.shape[0] > 0
    p = _tree_walk(t_rows[rid], _I0(0), t_up, t_fb, rec_node, rec_fb) - 1 if tree and lim > 0 else 0
    pa = p  # the table slots of the hashes _AHEAD blocks on are prefetched, as in _register
    for j in range(min(_AHEAD, lim)):
        if tree:
            ha, pa = _tree_hash(j, pa, t_key, rec_node, rec_fb)
        else:
            ha = chain[lo + j]
        _prefetch(ht, r, 2 * _home(ha, mask))
    for j in range(lim):
        if j + _AHEAD < lim:
            if tree:
                ha, pa = _tree_hash(j + _AHEAD, pa, t_key, rec_node, rec_fb)
            else:
                ha = chain[lo + j + _AHEAD]
            _prefetch(ht, r, 2 * _home(ha, mask))
        if tree:
            h, p = _tree_hash(j, p, t_key, rec_node, rec_fb)
        else:
            h = chain[lo + j]
        e = _find(ht, r, mask, h)
        if e < 0:
            break
        hits[nh] = _ends(ht, r, e)[0]
        nh += 1
    return nh


@_piece
def _admit(  # type: ignore[no-untyped-def]
    r, gi, now, cut, nsched, budget, S, bs, chunked, caching, prompt, skip, req, nrun, running, slots_free, nslots,
    whead, wlen, wq, sched_rid, sched_n, hits, res_sched, res_hit, arrival, chains, pool, claim,
):  # fmt: skip
    """vLLM v1 schedule()'s second loop on replica ``r`` (rank ``gi``; only when nobody was
    preempted): waiting requests, from the queue's head, are admitted with their prefix-cache hits
    while the token budget, a running slot and the KV pool allow, and while the head arrived by
    ``cut`` (the time the step was scheduled: its start, or with asynchronous scheduling the
    previous step's; the queue is in arrival order); a request's first admission gives back its
    claim (``claim``: the most_free_kv router's). Returns the requests scheduled."""
    computed, gen, nblk, nreg, slot_of, started = req[0], req[1], req[2], req[3], req[4], req[5]
    nfree, fpos, ref, table = pool[0], pool[3], pool[5], pool[6]
    while wlen[r] > 0 and budget > 0 and nrun[r] < S:
        rid = wq[r, whead[r]]
        if arrival[rid] > cut:  # arrived after this step was scheduled (asynchronous scheduling)
            break
        ntok = prompt[rid] + gen[rid]
        # the log's reported hits stand in for the replica's own prefix cache (Workload.skipped_tokens)
        first = computed[rid] == 0
        sk = max(skip[rid], 0) if first else 0
        nh = 0
        if caching and first and skip[rid] < 0:
            nh = _prefix_hits(r, rid, ntok, bs, chains, pool[11], pool[12], hits)
        c0 = computed[rid] + sk + nh * bs
        n_new = ntok - c0
        if not chunked and n_new > budget:
            break
        n_new = min(n_new, budget)
        tokens_after = c0 + n_new
        need = max(0, -(-tokens_after // bs) - nblk[rid] - nh)
        evictable = 0
        for j in range(nh):
            if ref[r, hits[j]] == 0:
                evictable += 1
        if need + evictable > nfree[r]:
            break
        whead[r] = (whead[r] + 1) % wq.shape[1]
        wlen[r] -= 1
        running[r, nrun[r]] = rid
        nrun[r] += 1
        nslots[r] -= 1
        s = slots_free[r, nslots[r]]
        slot_of[rid] = s
        for j in range(nh):
            b = hits[j]
            if ref[r, b] == 0:  # a hit no one else holds: out of the free queue
                _unlink_free(r, b, nfree, fpos)
            ref[r, b] += 1
            table[r, s, nblk[rid]] = b
            nblk[rid] += 1
        if nh > 0:  # its first nh blocks hold their hashes already (hits): _register starts after them
            nreg[rid] = nh
        _alloc(r, s, rid, need, min(tokens_after, ntok), bs, caching, nblk, nreg, chains, pool)
        computed[rid] = c0
        if not started[rid]:
            started[rid] = True
            claim[r] -= -(-prompt[rid] // bs)
            res_sched[rid] = now
            res_hit[rid] = sk + nh * bs
        sched_rid[gi, nsched] = rid
        sched_n[gi, nsched] = n_new
        nsched += 1
        budget -= n_new
    return nsched


@_piece
def _step_cost(gi, nsched, computed, ntok0, gen, sched_rid, sched_n, gn, gout, gx, x, out, cost, dpass, dctx):  # type: ignore[no-untyped-def]
    """The shape of rank ``gi``'s scheduled batch and its cost (kept in gout and gx, with its size
    in gn), the drafter's passes included (speculative decoding: ``dpass`` seconds per pass by
    batch size, ``dctx`` per context token; ``ntok0`` the prompts); returns the step's duration."""
    tok, logit, af, ab, acount, apeak, ahas, abw, dla, dlb, dlt, pla, plb, plt, mx, sc = cost
    p_tok = 0.0
    p_seq = 0.0
    p_pairs = 0.0
    p_kv = 0.0
    d_seq = 0.0
    d_ctx = 0.0
    verified = 0
    v_tok = 0
    passes = 0
    draft_ctx = 0.0
    for q in range(nsched):
        rid = sched_rid[gi, q]
        nn = sched_n[gi, q]
        if computed[rid] + nn > ntok0[rid] + gen[rid]:  # a verification of nn − 1 drafts
            verified += 1
            v_tok += nn
            passes = max(passes, nn - 1)
            draft_ctx += computed[rid] + 1
        if nn == 1:
            d_seq += 1
            d_ctx += computed[rid] + 1
        else:
            p_tok += nn
            p_seq += 1
            p_pairs += nn * computed[rid] + nn * (nn + 1) / 2
            p_kv += computed[rid] + nn
    x[0] = p_tok
    x[1] = p_seq
    x[2] = p_pairs
    x[3] = p_kv
    x[4] = d_seq
    x[5] = d_ctx
    _tab_row(x, tok, logit, af, ab, acount, apeak, ahas, abw, dla, dlb, dlt, pla, plb, plt, mx, sc, out)
    if verified > 0:
        pass_s = dpass[verified] if verified < dpass.shape[0] else 0.0
        out[0] += passes * (pass_s + dctx * draft_ctx)
    gn[gi] = nsched
    for c in range(8):
        gout[gi, c] = out[c]
    # the step log counts a verification as a decode (its tokens are not prompt work)
    gx[gi, 0] = p_tok - v_tok
    gx[gi, 1] = p_seq - verified
    gx[gi, 2] = d_seq + verified
    return out[0]


@_piece
def _tokens_in(  # type: ignore[no-untyped-def]
    gi, end, prompt, output, computed, gen, last_tok, acc, spe, sched_rid, sched_n, gn, fin,
    res_first, res_finish, res_itl, res_prefill,
):  # fmt: skip
    """Rank ``gi``'s step ended at ``end``: its scheduled tokens are computed, a request whose
    prompt and sampled tokens are all computed samples one more, and finishes when it has all its
    output; a verification (speculative decoding) keeps floor(acc + spe) − floor(acc) of its tokens
    and samples as many (model.Speculation). Returns the finished count (their ids in fin)."""
    nf = 0
    for q in range(gn[gi]):
        rid = sched_rid[gi, q]
        nn = sched_n[gi, q]
        sampled = 0
        if computed[rid] + nn > prompt[rid] + gen[rid]:  # a verification
            a1 = acc[rid] + spe
            adv = min(int(np.floor(a1)) - int(np.floor(acc[rid])), nn)
            acc[rid] = a1
            res_prefill[rid] += adv
            computed[rid] += adv
            gen[rid] += adv
            sampled = adv
        else:
            res_prefill[rid] += nn
            computed[rid] += nn
            if computed[rid] == prompt[rid] + gen[rid]:
                gen[rid] += 1
                sampled = 1
        if sampled > 0:
            if gen[rid] == 1:
                res_first[rid] = end
            else:
                gap = end - last_tok[rid]
                prev = res_itl[rid]
                res_itl[rid] = gap if np.isnan(prev) else max(prev, gap)
            last_tok[rid] = end
            if gen[rid] == output[rid]:
                res_finish[rid] = end
                res_prefill[rid] -= output[rid] - 1
                fin[nf] = rid
                nf += 1
    return nf


@_piece
def _retire(  # type: ignore[no-untyped-def]
    r, nf, end, n, closed, caching, think, output, req, nrun, running, nfin, slots_free, nslots, fin,
    heap_t, heap_s, heap_i, ctl, heap_n, seq, next_issue, pool,
):  # fmt: skip
    """The ``nf`` requests that finished on replica ``r`` at ``end`` leave the running list and give
    back their blocks and slots (closed loop: their clients issue the next requests). Returns the
    new (heap_n, seq, next_issue)."""
    gen, nblk, nreg, slot_of = req[1], req[2], req[3], req[4]
    keep = 0
    for q in range(nrun[r]):
        rid = running[r, q]
        if gen[rid] != output[rid]:
            running[r, keep] = rid
            keep += 1
    nrun[r] = keep
    for q in range(nf):
        rid = fin[q]
        _free(r, rid, caching, nblk, nreg, slot_of, slots_free, nslots, pool)
        heap_n, seq, next_issue = _issue(end, closed, think, n, heap_t, heap_s, heap_i, heap_n, seq, next_issue)
    nfin[r] += nf
    ctl[1] += nf  # progress: requests done
    return heap_n, seq, next_issue


@_piece
def _step(first, now, nlog, wl, fl, cost, res, ctl, req, rep, pool, scr, ev, log, last_row, wq, heap):  # type: ignore[no-untyped-def]
    """One step of replica ``first`` (vLLM v1 schedule(), as reference.step) starting at ``now`` —
    or of its lockstep group: every rank with work schedules its own batch, idle ranks run a dummy
    batch, the step lasts as long as the slowest rank's (docs/engine.md). ``heap`` is (heap_n, seq,
    next_issue); returns (nlog, heap_n, seq, next_issue)."""
    prompt, output, skip = wl[1], wl[2], wl[13]
    chains = (wl[3], wl[4], wl[7], wl[8], wl[9], wl[10], wl[11], wl[12])
    closed, C, S, budget_max, bs, chunked, caching = fl[2], fl[3], fl[4], fl[5], fl[6], fl[7], fl[8]
    want_log, G, dummy_s, think, asy = fl[9], fl[10], fl[11], fl[12], fl[13]
    spk, spe, dctx, dpass = fl[14], fl[15], fl[16], wl[14]
    computed, gen, last_tok, acc = req[0], req[1], req[6], req[7]
    clock, ready, nrun, running, slots_free, nslots = rep[0], rep[1], rep[2], rep[3], rep[4], rep[5]
    whead, wlen, nfin, last_end, last_nfin, sched_t = rep[6], rep[7], rep[9], rep[10], rep[11], rep[12]
    nfree = pool[0]
    sched_rid, sched_n, part, gn, gout, gx = scr[0], scr[1], scr[2], scr[3], scr[4], scr[5]
    fin, hits, x, out = scr[15], scr[16], scr[17], scr[18]
    heap_t, heap_s, heap_i = ev[1], ev[2], ev[3]
    heap_n, seq, next_issue = heap
    g0 = first - first % G
    dt = 0.0
    for gi in range(G):
        r = g0 + gi
        clock[r] = now
        part[gi] = G == 1 or ((nrun[r] > 0 or wlen[r] > 0) and ready[r] <= now)
        gn[gi] = 0
        if not part[gi]:
            sched_t[r] = now
            if dummy_s > dt:
                dt = dummy_s
            continue
        # Asynchronous scheduling (docs/engine.md, "The step timeline"): a busy replica (requests
        # running, or waiting since its previous step was scheduled) scheduled this step when
        # its previous step started, and sees the arrivals up to then; an idle one sees all.
        cut = now
        if asy and (nrun[r] > 0 or (wlen[r] > 0 and res[0][wq[r, whead[r]]] <= sched_t[r])):
            cut = sched_t[r]
        sched_t[r] = now
        nsched, budget, preempted = _schedule_running(
            r, gi, budget_max, bs, caching, prompt, output, spk, req, nrun, running, slots_free, nslots, whead, wlen,
            wq, sched_rid, sched_n, res[6], chains, pool,
        )  # fmt: skip
        if not preempted:
            nsched = _admit(
                r, gi, now, cut, nsched, budget, S, bs, chunked, caching, prompt, skip, req, nrun, running,
                slots_free, nslots, whead, wlen, wq, sched_rid, sched_n, hits, res[2], res[7], res[0], chains, pool,
                rep[13],
            )  # fmt: skip
        # -- the step's shape and cost
        d = _step_cost(gi, nsched, computed, prompt, gen, sched_rid, sched_n, gn, gout, gx, x, out, cost, dpass, dctx)
        if d > dt:
            dt = d
    end = now + dt
    for gi in range(G):
        r = g0 + gi
        clock[r] = end
        if not part[gi]:
            last_end[r] = end
            last_nfin[r] = 0
            continue
        if want_log:
            nlog = _log_span(
                log, nlog, last_row, r, now, end, _I0(1), gx[gi, 0], gx[gi, 1], gx[gi, 2], nrun[r], wlen[r],
                C - nfree[r], gout[gi, 5], gout[gi, 6], gout[gi, 1], gout[gi, 2], gout[gi, 3], gout[gi, 4], gout[gi, 7],
            )  # fmt: skip
        # -- tokens in, tokens sampled, finishes
        nf = _tokens_in(
            gi, end, prompt, output, computed, gen, last_tok, acc, spe, sched_rid, sched_n, gn, fin,
            res[3], res[4], res[5], res[8],
        )  # fmt: skip
        if nf:
            heap_n, seq, next_issue = _retire(
                r, nf, end, prompt.shape[0], closed, caching, think, output, req, nrun, running, nfin, slots_free,
                nslots, fin, heap_t, heap_s, heap_i, ctl, heap_n, seq, next_issue, pool,
            )  # fmt: skip
        last_end[r] = end
        last_nfin[r] = nf
    return nlog, heap_n, seq, next_issue


@_piece
def _decode_kmax(r, k_max, prompt, output, computed, gen, running, nr):  # type: ignore[no-untyped-def]
    """Folds replica ``r``'s ``nr`` running requests into ``k_max``, the steps a decode span may
    take (−1: no bound yet): 0 unless every one is one token from done with its prefill, else at
    most the steps before one finishes. Returns (k_max, Σ computed)."""
    c_sum = 0.0
    for q in range(nr):
        rid = running[r, q]
        left = output[rid] - gen[rid]
        if prompt[rid] + gen[rid] - computed[rid] != 1:
            return 0, c_sum
        c_sum += computed[rid]
        if k_max < 0 or left - 1 < k_max:
            k_max = left - 1  # the step that finishes a request is a general one
    return k_max, c_sum


@_piece
def _buckets(r, nr, bs, computed, running, bstart, bfill, bphase, bitems):  # type: ignore[no-untyped-def]
    """Buckets of running positions by the step phase at which they open a block: bucket ``p`` is
    ``bitems[bstart[p]:bstart[p + 1]]``."""
    for p in range(bs + 1):
        bstart[p] = 0
    for q in range(nr):
        ph = (bs - computed[running[r, q]] % bs) % bs
        bphase[q] = ph
        bstart[ph + 1] += 1
    for p in range(bs):
        bstart[p + 1] += bstart[p]
    for p in range(bs):
        bfill[p] = bstart[p]
    for q in range(nr):
        ph = bphase[q]
        bitems[bfill[ph]] = q
        bfill[ph] += 1


@_piece
def _head_blocked(  # type: ignore[no-untyped-def]
    r, nr, opening, S, budget_max, bs, chunked, caching, prompt, skip, computed, gen, nblk, whead, wlen, nfree, wq
):  # fmt: skip
    """Whether replica ``r``'s waiting head stays blocked for a whole decode span of its ``nr``
    running requests (``opening`` of which open a block in the span's first step)."""
    stable = wlen[r] == 0 or nr >= S or budget_max - nr <= 0
    if not stable and not caching:
        hd = wq[r, whead[r]]
        c_hd = computed[hd] + (max(skip[hd], 0) if computed[hd] == 0 else 0)
        h_new = prompt[hd] + gen[hd] - c_hd
        if not chunked and h_new > budget_max - nr:
            stable = True
        else:
            h_new = min(h_new, budget_max - nr)
            h_need = max(0, -(-(c_hd + h_new) // bs) - nblk[hd])
            # nfree only falls during a span: blocked after step 0, blocked after all
            stable = h_need > nfree[r] - opening
    return stable


@_piece
def _prep_span(nr, cost, prep):  # type: ignore[no-untyped-def]
    """tab_span_prep for a decode span of ``nr`` requests, into ``prep`` (sp_pre, sp_f, sp_b,
    sp_row)."""
    tok, logit, af, ab, dla, dlt, sc = cost[0], cost[1], cost[2], cost[3], cost[8], cost[10], cost[15]
    _span_prep(float(nr), tok, logit, af, ab, dla, dlt, sc, prep[0], prep[1], prep[2], prep[3])


@_piece
def _decode_step(  # type: ignore[no-untyped-def]
    r, m, nr, c_sum, ph_alloc, ph_fill, bstart, bitems, prep, sums, bs, caching, req, running, chains, pool, cost, out
):  # fmt: skip
    """Step ``m`` of a decode span of replica ``r`` (``nr`` running requests): the requests of
    bucket ``ph_alloc`` get their new block, those of bucket ``ph_fill`` (full blocks) their
    hashes; the step's cost (in ``out``) is added to ``sums``. ``prep`` is the span's (sp_pre,
    sp_f, sp_b, sp_row)."""
    computed, nblk, nreg, slot_of = req[0], req[2], req[3], req[4]
    nfree, fh, fq, fpos, ft, ref, table, bhash, hashed, hprev, hnext, ht, mask = pool
    af, ab, acount, apeak, ahas, abw, dlb, sc = cost[2], cost[3], cost[4], cost[5], cost[6], cost[7], cost[9], cost[15]
    a0 = bstart[ph_alloc]
    a1 = bstart[ph_alloc + 1]
    if not caching:
        nfree[r] -= a1 - a0
        for u in range(a0, a1):
            nblk[running[r, bitems[u]]] += 1
    else:
        chain_off, chain, t_rows, t_key, t_up, t_fb, rec_node, rec_fb = chains
        # a block each, in two passes as _take_blocks
        for u in range(a0, a1):
            rid = running[r, bitems[u]]
            _pop_block(
                r, slot_of[rid], rid, nfree, fh, fq, fpos, ft, ref, table, nblk, bhash, hashed, hprev, hnext
            )  # fmt: skip
        for u in range(a0, min(a0 + _AHEAD, a1)):
            rid = running[r, bitems[u]]
            _prefetch_slot(r, table[r, slot_of[rid], nblk[rid] - 1], bhash, hashed, ht, mask)
        for u in range(a0, a1):
            if u + _AHEAD < a1:
                rid = running[r, bitems[u + _AHEAD]]
                _prefetch_slot(r, table[r, slot_of[rid], nblk[rid] - 1], bhash, hashed, ht, mask)
            rid = running[r, bitems[u]]
            b = table[r, slot_of[rid], nblk[rid] - 1]
            if hashed[r, b]:
                _uncache(r, b, bhash, hashed, hprev, hnext, ht, mask)
        # Blocks that are full once this step has run get their hashes.
        for u in range(bstart[ph_fill], bstart[ph_fill + 1]):
            rid = running[r, bitems[u]]
            s_ = slot_of[rid]
            target = min((computed[rid] + m + 1) // bs, chain_off[rid + 1] - chain_off[rid])
            _register(
                r, s_, rid, target, nreg, table, chain, chain_off,
                bhash, hashed, hprev, hnext, ht, mask,
                t_rows, t_key, t_up, t_fb, rec_node, rec_fb,
            )  # fmt: skip
    sp_pre, sp_f, sp_b, sp_row = prep
    _span_row(
        float(nr), c_sum + nr * (m + 1), af, ab, acount, apeak, ahas, abw, dlb, sc, sp_pre, sp_f, sp_b, sp_row, out
    )
    sums[0] += out[5]
    sums[1] += out[6]
    sums[2] += out[1]
    sums[3] += out[2]
    sums[4] += out[3]
    sums[5] += out[4]
    sums[6] += out[7]
    return out[0]


@_piece
def _span_clock(m, now, end, end0, max_gap):  # type: ignore[no-untyped-def]
    """A span's clock after its step ``m`` ran from ``now`` to ``end``: the first step's end
    (``end0``) and the longest later step (``max_gap``)."""
    if m == 0:
        return end, max_gap
    return end0, max(max_gap, end - now)


@_piece
def _span_done(  # type: ignore[no-untyped-def]
    r, m, start, end0, max_gap, now, nlog, C, want_log, computed, gen, last_tok, clock, nrun, running, wlen,
    last_end, last_nfin, nfree, res_first, res_itl, res_prefill, log, last_row, sums,
):  # fmt: skip
    """A decode span of ``m`` steps of replica ``r`` ran from ``start`` to ``now`` (its first step
    ended at ``end0``, the longest later step took ``max_gap``): its running requests get their
    tokens, the step log its row (or the replica's latest row grows). Returns nlog."""
    clock[r] = now
    last_end[r] = now
    last_nfin[r] = 0
    nr = nrun[r]
    for q in range(nr):
        rid = running[r, q]
        res_prefill[rid] += m
        computed[rid] += m
        if gen[rid] == 0:
            res_first[rid] = end0
            g = max_gap
        else:
            g = max(end0 - last_tok[rid], max_gap)
        gen[rid] += m
        if g > -_INF:
            prev = res_itl[rid]
            res_itl[rid] = g if np.isnan(prev) else max(prev, g)
        last_tok[rid] = now
    if want_log:
        nlog = _log_span(
            log, nlog, last_row, r, start, now, m, 0.0, 0.0, float(nr), nr, wlen[r], C - nfree[r],
            sums[0], sums[1], sums[2], sums[3], sums[4], sums[5], sums[6],
        )  # fmt: skip
    return nlog


@_piece_cached
def _span_one(r, first_t, limit, stop, nlog, wl, fl, cost, res, req, rep, pool, scr, log, last_row, wq):  # type: ignore[no-untyped-def]
    """A span of decode steps of replica ``r`` (G == 1) from ``first_t``, when the next steps are
    ones where every running request decodes one token, nobody is admitted, finishes or is
    preempted, each starting before ``limit`` (the next arrival: see below) and before ``stop``
    (the next scaling decision, inf without: a step that starts at or after it is not in the
    window the decision reads). Returns (steps run, nlog): 0 steps when the next step is a
    general one."""
    prompt, output, skip = wl[1], wl[2], wl[13]
    C, S, budget_max, bs, chunked, caching, want_log, asy = fl[3], fl[4], fl[5], fl[6], fl[7], fl[8], fl[9], fl[13]
    computed, gen, nblk, last_tok = req[0], req[1], req[2], req[6]
    clock, nrun, running, whead, wlen, last_end, last_nfin = rep[0], rep[2], rep[3], rep[6], rep[7], rep[10], rep[11]
    nfree = pool[0]
    bfill, bphase, sums = scr[24], scr[25], scr[27]
    bstart, bitems, out = scr[23], scr[26], scr[18]
    nr = nrun[r]
    if nr == 0 or first_t >= limit or first_t >= stop:
        return 0, nlog
    k_max, c_sum = _decode_kmax(r, _I0(-1), prompt, output, computed, gen, running, nr)
    if k_max <= 0:
        return 0, nlog
    # Buckets of running positions by the step phase at which they open a block.
    _buckets(r, nr, bs, computed, running, bstart, bfill, bphase, bitems)
    # The waiting head must stay blocked for the whole span.
    opening = bstart[1] - bstart[0]
    if not _head_blocked(
        r, nr, opening, S, budget_max, bs, chunked, caching, prompt, skip, computed, gen, nblk, whead, wlen, nfree, wq
    ):
        return 0, nlog
    chains = (wl[3], wl[4], wl[7], wl[8], wl[9], wl[10], wl[11], wl[12])
    now = first_t
    m = _I0(0)
    ph_alloc = _I0(0)
    sums[:] = 0.0
    prep = (scr[19], scr[20], scr[21], scr[22])  # sp_pre, sp_f, sp_b, sp_row
    _prep_span(nr, cost, prep)
    max_gap = -_INF
    end0 = now
    # Step m sees an arrival at `limit` if it starts at or after it; with asynchronous scheduling
    # only if the step before it did (it was scheduled then): the span ends one step later. Not
    # under most_free_kv (router 3), whose choice at `limit` reads the free blocks: a step starting
    # at the arrival has not allocated yet when it is routed (the oracle's order, arrival first).
    late = asy and fl[1] != 3
    prev = now
    while m < k_max and (prev if late else now) < limit and now < stop:
        if bstart[ph_alloc + 1] - bstart[ph_alloc] > nfree[r]:
            break  # an allocation fails: the general step preempts
        ph_fill = ph_alloc + 1 if ph_alloc + 1 < bs else 0
        end = now + _decode_step(
            r, m, nr, c_sum, ph_alloc, ph_fill, bstart, bitems, prep, sums, bs, caching, req, running, chains, pool,
            cost, out,
        )  # fmt: skip
        end0, max_gap = _span_clock(m, now, end, end0, max_gap)
        prev = now
        now = end
        m += 1
        ph_alloc = ph_fill
    if m > 0:
        nlog = _span_done(
            r, m, first_t, end0, max_gap, now, nlog, C, want_log, computed, gen, last_tok, clock, nrun, running, wlen,
            last_end, last_nfin, nfree, res[3], res[5], res[8], log, last_row, sums,
        )  # fmt: skip
        rep[12][r] = prev  # the span's last step started then (asynchronous scheduling's cut-off)
    return m, nlog


@_piece
def _group_limit(g0, ev_t, R, closed, G, clock, ready, nrun, wlen, static, own_start, own_t, own_ptr):  # type: ignore[no-untyped-def]
    """The time before which every step of a decode span of the lockstep group from replica ``g0``
    must start: the next arrival that concerns it (closed loop: also another replica's next step)."""
    if closed:
        glimit = ev_t
        for q in range(R):
            if (q < g0 or q >= g0 + G) and (nrun[q] > 0 or wlen[q] > 0):
                s_q = max(clock[q], ready[q])
                if s_q < glimit:
                    glimit = s_q
    elif static:
        glimit = _INF
        for q in range(g0, g0 + G):
            if own_ptr[q] < own_start[q + 1] - own_start[q]:
                t_q = own_t[own_start[q] + own_ptr[q]]
                if t_q < glimit:
                    glimit = t_q
    else:
        glimit = ev_t
    return glimit


@_piece
def _group_kmax(  # type: ignore[no-untyped-def]
    g0, first_t, glimit, G, S, budget_max, bs, chunked, caching, prompt, output, skip, computed, gen, nblk,
    ready, nrun, running, whead, wlen, nfree, wq, gbusy, gcsum, gbstart, gbitems, bfill, bphase,
):  # fmt: skip
    """Whether the lockstep group from replica ``g0`` can run a decode span from ``first_t``: every
    rank with work (gbusy) decodes only and its waiting head stays blocked. Returns (k_max, ranks
    with work), k_max 0 when not; fills gcsum, gbstart and gbitems for the busy ranks."""
    k_max = -1 if first_t < glimit else 0
    nbusy = 0
    for gi in range(G):
        if k_max == 0:
            break
        rq = g0 + gi
        nr = nrun[rq]
        gbusy[gi] = nr > 0 or wlen[rq] > 0
        if not gbusy[gi]:
            continue
        nbusy += 1
        if nr == 0 or ready[rq] > first_t:
            k_max = 0
            break
        k_max, c_sum = _decode_kmax(rq, k_max, prompt, output, computed, gen, running, nr)
        if k_max <= 0:
            k_max = 0
            break
        gcsum[gi] = c_sum
        _buckets(rq, nr, bs, computed, running, gbstart[gi], bfill, bphase, gbitems[gi])
        opening = gbstart[gi, 1] - gbstart[gi, 0]
        if not _head_blocked(
            rq, nr, opening, S, budget_max, bs, chunked, caching, prompt, skip, computed, gen, nblk, whead, wlen,
            nfree, wq,
        ):  # fmt: skip
            k_max = 0
            break
    return k_max, nbusy


@_piece
def _span_group(first, first_t, ev_t, nlog, wl, fl, cost, res, req, rep, pool, scr, ev, log, last_row, wq):  # type: ignore[no-untyped-def]
    """A span of decode steps of the lockstep group of replica ``first`` (G > 1): every rank with
    work is in a span-able state (decode only, waiting head blocked); idle ranks run dummy steps;
    each step lasts as long as the slowest rank's. Same rules and arithmetic as the general group
    step, so results are identical to stepping one at a time. Returns (steps run, nlog)."""
    prompt, output, skip = wl[1], wl[2], wl[13]
    R, closed, C, S, budget_max, bs, chunked, caching = fl[0], fl[2], fl[3], fl[4], fl[5], fl[6], fl[7], fl[8]
    want_log, G, dummy_s = fl[9], fl[10], fl[11]
    computed, gen, nblk, last_tok = req[0], req[1], req[2], req[6]
    clock, ready, nrun, running, whead, wlen = rep[0], rep[1], rep[2], rep[3], rep[6], rep[7]
    last_end, last_nfin, sched_t = rep[10], rep[11], rep[12]
    nfree = pool[0]
    gbusy, gcsum, gbstart, gbitems = scr[6], scr[7], scr[8], scr[9]
    gsp_pre, gsp_f, gsp_b, gsp_row, gsums, out = scr[10], scr[11], scr[12], scr[13], scr[14], scr[18]
    bfill, bphase = scr[24], scr[25]
    g0 = first - first % G
    glimit = _group_limit(g0, ev_t, R, closed, G, clock, ready, nrun, wlen, ev[4], ev[5], ev[6], ev[7])
    k_max, nbusy = _group_kmax(
        g0, first_t, glimit, G, S, budget_max, bs, chunked, caching, prompt, output, skip, computed, gen, nblk,
        ready, nrun, running, whead, wlen, nfree, wq, gbusy, gcsum, gbstart, gbitems, bfill, bphase,
    )  # fmt: skip
    if k_max <= 0 or nbusy == 0:
        return 0, nlog
    for gi in range(G):
        if gbusy[gi]:
            _prep_span(nrun[g0 + gi], cost, (gsp_pre[gi], gsp_f[gi], gsp_b[gi], gsp_row[gi]))
    chains = (wl[3], wl[4], wl[7], wl[8], wl[9], wl[10], wl[11], wl[12])
    now = first_t
    m = _I0(0)
    ph_alloc = _I0(0)
    gsums[:, :] = 0.0
    max_gap = -_INF
    end0 = now
    # As _span_one; an idle rank would admit an arrival at once, so only a group whose every
    # rank is busy ends its span one step later with asynchronous scheduling.
    late = fl[13] and nbusy == G and fl[1] != 3  # not under most_free_kv: _span_one says why
    prev = now
    while m < k_max and (prev if late else now) < glimit:
        fails = False
        for gi in range(G):
            if gbusy[gi] and gbstart[gi, ph_alloc + 1] - gbstart[gi, ph_alloc] > nfree[g0 + gi]:
                fails = True
        if fails:
            break  # an allocation fails: the general step preempts
        ph_fill = ph_alloc + 1 if ph_alloc + 1 < bs else 0
        dt = dummy_s if nbusy < G else 0.0
        for gi in range(G):
            if not gbusy[gi]:
                continue
            prep = (gsp_pre[gi], gsp_f[gi], gsp_b[gi], gsp_row[gi])
            d = _decode_step(
                g0 + gi, m, nrun[g0 + gi], gcsum[gi], ph_alloc, ph_fill, gbstart[gi], gbitems[gi], prep, gsums[gi],
                bs, caching, req, running, chains, pool, cost, out,
            )  # fmt: skip
            if d > dt:
                dt = d
        end = now + dt
        end0, max_gap = _span_clock(m, now, end, end0, max_gap)
        prev = now
        now = end
        m += 1
        ph_alloc = ph_fill
    if m > 0:
        for gi in range(G):
            rq = g0 + gi
            sched_t[rq] = prev
            if not gbusy[gi]:
                clock[rq] = now
                last_end[rq] = now
                last_nfin[rq] = 0
                continue
            nlog = _span_done(
                rq, m, first_t, end0, max_gap, now, nlog, C, want_log, computed, gen, last_tok, clock, nrun, running,
                wlen, last_end, last_nfin, nfree, res[3], res[5], res[8], log, last_row, gsums[gi],
            )  # fmt: skip
    return m, nlog


# -- A live replica set decided inside the loop (an autoscaled pool: jit.Scaling states it,
# pipeline/replay/autoscale.py the policy; docs/engine.md, "Scaling decisions"). ``sc``, built by
# loop_args (``on`` False: a fleet without one, and nothing below runs):
#   (on, mode, K, window, up, down, cooldown, lo, hi, delay, plan_t, plan_n,
#    live_from, retire, paid, retired_at, active, lv, acc, sig, dec_t, dec_n, ist, fst, ok_t)
#   mode   0 a schedule (its changes plan_t, plan_n), 1 utilisation, 2 queue, 3 kv (sig's column)
#   K      decision windows of ``window`` seconds (a decision at each window's end but the last)
#   per replica (its latest incarnation): live_from, retire (inf: not retired), paid (from),
#          retired_at (−inf: never), active (provisioned: starting or serving)
#   lv     the replicas live at the latest arrival, in index order (ist[2] of them)
#   acc    per window: busy, waiting and KV-block seconds of the step log's rows counted so far
#   sig    per window: mean live replicas, utilisation, queue, kv (what the decision read)
#   dec_t, dec_n  the decisions that changed the target (ist[4] of them)
#   ist    (next decision: window index k or schedule position, first log row not yet counted,
#           live replicas in lv, target, decisions made)
#   fst    (when the live set next changes by itself (a start ends), the last change's time, the
#           next decision's time: inf when none is left)
#   ok_t   the arrival times of the requests not rejected, in event order (loop_args fills it)


@_piece
def _live_set(t, live_from, retire, lv, ist, fst):  # type: ignore[no-untyped-def]
    """The replicas live at ``t`` (live_from ≤ t < retire) into lv, in index order, and when
    the next one still starting becomes live."""
    nlv = 0
    until = _INF
    for r in range(live_from.shape[0]):
        if live_from[r] <= t < retire[r]:
            lv[nlv] = r
            nlv += 1
        elif t < live_from[r] < retire[r] and live_from[r] < until:
            until = live_from[r]
    ist[2] = nlv
    fst[0] = until


@_piece
def _route_live(t, router, rr, sc, routed, nfin, last_end, last_nfin):  # type: ignore[no-untyped-def]
    """The live replica a request arriving at ``t`` goes to: round robin over the live replicas in
    index order (``rr``: the requests routed so far), or least outstanding over them (_route's
    count; ties to the lowest index). A replica not live takes no request."""
    lv, ist, fst = sc[17], sc[22], sc[23]
    if t >= fst[0]:
        _live_set(t, sc[12], sc[13], lv, ist, fst)
    nlv = ist[2]
    if router == 0:
        return lv[rr % nlv]
    dest = lv[0]
    best = -1
    for q in range(nlv):
        r = lv[q]
        o = _outstanding(r, t, routed, nfin, last_end, last_nfin)
        if best < 0 or o < best:
            best = o
            dest = r
    return dest


@_piece
def _own_next_live(r, rr, ev_t, sc):  # type: ignore[no-untyped-def]
    """Round robin over a live set: the time before which replica ``r`` receives no request (its
    decode span may run to it). Until the live set changes (a start ends: fst[0]; a decision:
    the span's ``stop``) the k-th request routed from now goes to lv[(rr + k) mod live]: r's next
    is the first whose counter falls on r's position (none while r is not live). Right after a
    decision the set is not read yet: the fleet's next arrival ``ev_t``."""
    lv, ist, fst, ok_t = sc[17], sc[22], sc[23], sc[24]
    lim = fst[0]
    if lim == -_INF:
        return ev_t
    nlv = ist[2]
    for q in range(nlv):
        if lv[q] == r:
            k = rr + (q - rr % nlv) % nlv
            if k < ok_t.shape[0] and ok_t[k] < lim:
                lim = ok_t[k]
            break
    return lim


@_piece
def _count_rows(nlog, log, sc):  # type: ignore[no-untyped-def]
    """Add the step log's rows not yet counted to each window's busy, waiting and KV-block
    seconds (a row's values held over its wall time, the part of it in each window)."""
    K, w, acc, ist = sc[2], sc[3], sc[18], sc[22]
    for row in range(ist[1], nlog):
        s = log[row, 1]
        e = log[row, 2]
        if not e > s:
            continue
        j = max(int(s / w) - 1, 0)
        while j < K:
            a = float(j) * w
            if a >= e:
                break
            ov = min(e, float(j + 1) * w) - max(s, a)
            if ov > 0.0:
                acc[j, 0] += ov
                acc[j, 1] += log[row, 9] * ov
                acc[j, 2] += log[row, 10] * ov
            j += 1
    ist[1] = nlog


@_piece
def _close_window(j, C, sc):  # type: ignore[no-untyped-def]
    """Window ``j``'s signals from its counted seconds over its live replica-seconds (every
    incarnation's [live_from, retire) within it), into sig[j]."""
    w, live_from, retire, acc, sig = sc[3], sc[12], sc[13], sc[18], sc[19]
    a = float(j) * w
    b = float(j + 1) * w
    live = 0.0
    for r in range(live_from.shape[0]):
        ov = min(b, retire[r]) - max(a, live_from[r])
        if ov > 0.0:
            live += ov
    width = b - a
    sig[j, 0] = live / width
    rs = max(sig[j, 0] * width, 1e-12)
    sig[j, 1] = acc[j, 0] / rs
    sig[j, 2] = acc[j, 1] / rs
    sig[j, 3] = acc[j, 2] / (rs * max(C, 1))


@_piece
def _set_target(t, target, sc):  # type: ignore[no-untyped-def]
    """The live set's change to ``target`` replicas at ``t``: a scale-up provisions the replicas
    retired longest ago (never used first, lowest index on ties), paid now, live after the delay;
    a scale-down retires the newest (one still starting before a serving one)."""
    delay, live_from, retire, paid, retired_at, active = sc[9], sc[12], sc[13], sc[14], sc[15], sc[16]
    R = active.shape[0]
    cur = 0
    for r in range(R):
        if active[r]:
            cur += 1
    while cur < target:
        pick = -1
        for r in range(R):
            if not active[r] and (pick < 0 or retired_at[r] < retired_at[pick]):
                pick = r
        active[pick] = True
        paid[pick] = t
        live_from[pick] = t + delay
        retire[pick] = _INF
        cur += 1
    while cur > target:
        pick = -1
        for r in range(R):
            if active[r] and (pick < 0 or paid[r] >= paid[pick]):
                pick = r
        active[pick] = False
        retire[pick] = t
        retired_at[pick] = t
        cur -= 1
    sc[22][3] = target
    sc[23][0] = -_INF  # the live set is read afresh at the next arrival


@_piece
def _decide(t, nlog, C, log, last_row, sc):  # type: ignore[no-untyped-def]
    """The decision at ``t``: a schedule's next change, or a signal policy's at window k's end
    (t = k·window) from window k − 1's signal, every step that starts before t already in the
    log and none that starts at or after it (autoscale.decide's rule: above ``up`` the target
    becomes ⌈target × signal / up⌉, at least one more; below ``down`` one fewer; within lo..hi;
    none within ``cooldown`` of the last change). The log's rows are sealed: a later step
    starts a row of its own, so the rows read here stay as they are."""
    mode, K, w, up, down, cooldown, lo, hi = sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7], sc[8]
    plan_t, plan_n, sig, dec_t, dec_n, ist, fst = sc[10], sc[11], sc[19], sc[20], sc[21], sc[22], sc[23]
    target = ist[3]
    if mode == 0:
        pos = ist[0]
        ist[0] = pos + 1
        fst[2] = plan_t[pos + 1] if pos + 1 < plan_t.shape[0] else _INF
        _set_target(t, plan_n[pos], sc)
        return
    k = ist[0]
    _count_rows(nlog, log, sc)
    _close_window(k - 1, C, sc)
    for r in range(last_row.shape[0]):
        last_row[r] = -1
    ist[0] = k + 1
    fst[2] = float(k + 1) * w if k + 1 < K else _INF
    if t - fst[1] < cooldown:
        return
    s = sig[k - 1, mode]
    want = target
    if s > up:
        want = max(target + 1, int(np.ceil(target * s / up - 1e-9)))
    elif s < down:
        want = target - 1
    want = min(max(want, lo), hi)
    if want != target:
        dec_t[ist[4]] = t
        dec_n[ist[4]] = want
        ist[4] += 1
        fst[1] = t
        _set_target(t, want, sc)


@_piece
def _close_day(nlog, C, log, sc):  # type: ignore[no-untyped-def]
    """A signal policy's windows left without a decision (the last one, which ends the day):
    their signals from the whole log."""
    if sc[1] == 0:
        return
    _count_rows(nlog, log, sc)
    for j in range(sc[22][0] - 1, sc[2]):
        _close_window(j, C, sc)


def _replay_loop(grouped: bool) -> Any:
    """_replay, the event loop, compiled for fleets in lockstep groups (``grouped``: decode spans
    of a group, _span_group) or for fleets without (every group one replica: spans of one
    replica, _span_one). ``grouped`` is a constant of the compiled code: the branch the fleet
    cannot take is pruned before typing, so a fleet compiles only the spans it runs (a fleet
    without lockstep, most of them, compiles no _span_group). Both are cached in the one index
    of ``_replay`` (numba keys a closure's entries on its cells: ``grouped``)."""

    def _replay(wl, fl, cost, res, ctl, req, rep, pool, scr, ev, st, log, last_row, wq, sc):  # type: ignore[no-untyped-def]
        """run_fleet's event loop, from the loop state in ``st`` (ev_pos, heap_n, seq, next_issue,
        rr, nlog) until the fleet is done or cancelled (returns _DONE), or until the next event
        could outgrow the step log (_GROW_LOG) or a waiting queue (_GROW_WQ): the event has not
        started, ``st`` holds the state, run_fleet grows the array and calls again (growing changes
        no result). Every event is an arrival, a decode span (of a replica, or of a lockstep group),
        a step, or (``sc``: a live replica set decided in the loop) a scaling decision, taken
        before any arrival or step at or after its time."""
        times, rejected, aff_rep = wl[0], wl[6], wl[5]
        router, closed, G = fl[1], fl[2], fl[10]
        clock, ready, nrun, wlen, routed = rep[0], rep[1], rep[2], rep[7], rep[8]
        nfin, last_end, last_nfin = rep[9], rep[10], rep[11]
        order, heap_t, heap_s, heap_i, static, own_start, own_t, own_ptr = ev
        n = times.shape[0]
        ev_pos, heap_n, seq, next_issue, rr, nlog = st[0], st[1], st[2], st[3], st[4], st[5]
        code = _DONE
        while True:
            if ctl[0] != 0.0:  # cancelled by the calling thread (Ctrl-C): stop, results incomplete
                break
            first, first_t, second_t = _next_step(nrun, wlen, clock, ready)
            if closed:
                has_ev = heap_n > 0
                ev_t = heap_t[0] if has_ev else _INF
            else:
                has_ev = ev_pos < n
                ev_t = times[order[ev_pos]] if has_ev else _INF
            if sc[0]:
                t_dec = sc[23][2]
                if t_dec < _INF and t_dec <= ev_t and (first < 0 or t_dec <= first_t) and (has_ev or first >= 0):
                    # -- a scaling decision: every step that starts before it has run, none after
                    _decide(t_dec, nlog, fl[3], log, last_row, sc)
                    continue
            if has_ev and (first < 0 or ev_t <= first_t):
                # -- an arrival
                # (closed loop: the trace's next request, whichever client sends it; ev_pos counts them)
                i = ev_pos if closed else order[ev_pos]
                if rejected[i]:
                    dest = -1
                elif sc[0]:
                    dest = _route_live(ev_t, router, rr, sc, routed, nfin, last_end, last_nfin)
                else:
                    dest = _route(i, ev_t, router, rr, aff_rep, routed, nfin, last_end, last_nfin, pool[0], rep[13])
                if dest >= 0 and wlen[dest] == wq.shape[1]:
                    code = _GROW_WQ
                    break
                if closed:
                    heap_n = _heap_pop(heap_t, heap_s, heap_i, heap_n)
                ev_pos += 1
                res[0][i] = ev_t  # res_arrival
                if dest < 0:  # rejected
                    ctl[1] += 1.0  # progress: requests done
                    heap_n, seq, next_issue = _issue(
                        ev_t, closed, fl[12], n, heap_t, heap_s, heap_i, heap_n, seq, next_issue
                    )
                    continue
                rr += 1
                _enqueue(i, ev_t, dest, ready, rep[6], wlen, routed, res[1], static, own_ptr, wq)
                rep[13][dest] += -(-wl[1][i] // fl[6])  # its prompt's blocks, claimed until its admission
                continue
            if first < 0:
                break
            code = _room(first - first % G, G, fl[9], nlog, log, nrun, wlen, wq)
            if code != _DONE:
                break
            # -- a span of decode steps of replica `first`. Steps start before the next arrival (and,
            # in closed loop, before any other replica's next step, whose finishes issue arrivals), so
            # no event is passed.
            if fl[14] > 0:  # speculative decoding: every step is a general one (no decode spans)
                m = 0
            elif grouped:  # a constant (a closure cell): the branch not taken is pruned before typing
                m, nlog = _span_group(
                    first, first_t, ev_t, nlog, wl, fl, cost, res, req, rep, pool, scr, ev, log, last_row, wq
                )
            else:
                r = first
                if closed:
                    limit = min(ev_t, second_t)
                elif static:
                    # Routing ignores replica state: only this replica's own next arrival matters.
                    limit = own_t[own_start[r] + own_ptr[r]] if own_ptr[r] < own_start[r + 1] - own_start[r] else _INF
                elif sc[0] and router == 0:
                    # Round robin over a live set ignores replica state too, while the set holds.
                    limit = _own_next_live(r, rr, ev_t, sc)
                else:
                    limit = ev_t
                m, nlog = _span_one(
                    r, first_t, limit, sc[23][2], nlog, wl, fl, cost, res, req, rep, pool, scr, log, last_row, wq
                )
            if m > 0:
                continue
            nlog, heap_n, seq, next_issue = _step(
                first, first_t, nlog, wl, fl, cost, res, ctl, req, rep, pool, scr, ev, log, last_row, wq,
                (heap_n, seq, next_issue),
            )  # fmt: skip
        if sc[0] and code == _DONE:
            _close_day(nlog, fl[3], log, sc)
        st[0], st[1], st[2], st[3], st[4], st[5] = ev_pos, heap_n, seq, next_issue, rr, nlog
        return code

    _replay.__qualname__ = "_replay"  # its cache's file name (pipeline.replay.limits looks for it)
    return numba.njit(cache=True, nogil=True, _nrt=False)(_replay)  # type: ignore[call-overload]


_replay_single = _replay_loop(grouped=False)
_replay_grouped = _replay_loop(grouped=True)


class Work(NamedTuple):
    """The workload as the loop reads it (``wl``; arrays of one row per request unless said)."""

    times: Any  # arrival times (open loop; zeros offline)
    prompt: Any
    output: Any
    chain_off: Any  # n + 1 offsets into chain
    chain: Any  # explicit prefix chains (empty with the lazy chains)
    aff_rep: Any  # affinity replica, or the given routes (−1: none)
    rejected: Any
    t_rows: Any  # lazy chains (pipeline.classify.prefix.ChainTree; empty: ``chain`` holds them)
    t_key: Any
    t_up: Any
    t_fb: Any
    rec_node: Any  # the chain walk's scratch (ChainTree.max_depth entries)
    rec_fb: Any
    skip: Any  # prompt tokens the log reports as cached (Workload.skipped_tokens)
    draft_pass_s: Any  # speculative decoding: one draft pass's seconds by batch size (model.Speculation)


class Fleet(NamedTuple):
    """The fleet as the loop reads it (``fl``: the first 13 fields, in this order, then
    ``async_scheduling``)."""

    replicas: int
    router: int  # 0 round robin, 1 least outstanding, 2 affinity (aff_rep ≥ 0, else least outstanding), 3 most free KV
    closed: bool
    capacity: int  # KV blocks per replica
    max_seqs: int
    budget: int  # max_num_batched_tokens
    block_size: int
    chunked: bool
    caching: bool
    want_log: bool
    lockstep: int  # G: replicas [g·G, (g+1)·G) step in lockstep
    dummy_s: float  # an idle lockstep rank's step
    think_s: float
    concurrency: int  # closed loop: clients
    ramp_step_s: float  # closed loop: client c sends its first request at c * ramp_step_s
    max_blocks: int  # block-table entries per running slot
    async_scheduling: bool = False  # fl[13]: a busy replica's step sees the arrivals up to its previous step's start
    spec_k: int = 0  # fl[14]: speculative decoding's draft tokens (0: off; model.Speculation)
    spec_e: float = 1.0  # fl[15]: tokens a verification advances on average
    draft_ctx_s: float = 0.0  # fl[16]: a draft pass's seconds per context token


class Results(NamedTuple):
    """Per-request results, filled in (EngineResult's arrays)."""

    arrival: Any
    replica: Any
    scheduled: Any
    first: Any
    finish: Any
    max_itl: Any
    preemptions: Any
    cache_hit: Any
    prefill: Any


def _requests(n: int) -> tuple[Any, ...]:
    """Per request: computed, generated, blocks held, blocks registered, slot, started, last token,
    speculative decoding's accumulator."""
    return (
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.full(n, -1, np.int64),
        np.zeros(n, np.bool_),
        np.full(n, np.nan),
        np.zeros(n),
    )


def _replicas(R: int, S: int) -> tuple[Any, ...]:
    """Per replica: clock, ready, nrun, running, slots_free, nslots, whead, wlen, routed, nfin,
    last_end, last_nfin, sched_t (the start of its latest step: asynchronous scheduling's cut-off),
    claim (the KV blocks the prompts of its routed, not yet admitted requests need: most_free_kv's)."""
    slots_free = np.empty((R, S), np.int64)
    slots_free[:] = np.arange(S - 1, -1, -1, dtype=np.int64)
    return (
        np.zeros(R),
        np.zeros(R),
        np.zeros(R, np.int64),
        np.zeros((R, S), np.int64),
        slots_free,
        np.full(R, S, np.int64),
        np.zeros(R, np.int64),
        np.zeros(R, np.int64),
        np.zeros(R, np.int64),
        np.zeros(R, np.int64),
        np.full(R, -_INF),
        np.zeros(R, np.int64),
        np.full(R, -_INF),
        np.zeros(R, np.int64),
    )


def _scratch(G: int, S: int, bs: int, na: int, nd: int, max_blocks: int) -> tuple[Any, ...]:
    """A step's scratch arrays, per lockstep rank (the first 15) and for one replica."""
    return (
        np.zeros((G, S), np.int64),  # sched_rid
        np.zeros((G, S), np.int64),  # sched_n
        np.zeros(G, np.bool_),  # part
        np.zeros(G, np.int64),  # gn
        np.zeros((G, 8)),  # gout
        np.zeros((G, 3)),  # gx
        np.zeros(G, np.bool_),  # gbusy
        np.zeros(G),  # gcsum
        np.zeros((G, bs + 1), np.int64),  # gbstart
        np.zeros((G, S), np.int64),  # gbitems
        np.zeros((G, 9)),  # gsp_pre
        np.zeros((G, na)),  # gsp_f
        np.zeros((G, na)),  # gsp_b
        np.zeros((G, nd)),  # gsp_row
        np.zeros((G, 7)),  # gsums
        np.zeros(S, np.int64),  # fin
        np.zeros(max_blocks, np.int64),  # hits
        np.zeros(6),  # x
        np.zeros(8),  # out
        np.zeros(9),  # sp_pre
        np.zeros(na),  # sp_f
        np.zeros(na),  # sp_b
        np.zeros(nd),  # sp_row
        np.zeros(bs + 1, np.int64),  # bstart
        np.zeros(bs, np.int64),  # bfill
        np.zeros(S, np.int64),  # bphase
        np.zeros(S, np.int64),  # bitems
        np.zeros(7),  # sums
    )


def _heap(closed: bool, concurrency: int, n: int, ramp_step: float) -> tuple[Any, ...]:
    """The closed loop's arrival heap (time, seq, client event), with the ``concurrency`` clients'
    first requests, client c's at ``c * ramp_step`` (0 without a ramp): (heap_t, heap_s, heap_i,
    heap_n). Times and seqs increase: already a heap. Which request an event sends is decided
    when it is popped."""
    size = max(concurrency, 1) + 1
    heap_t, heap_s, heap_i = np.zeros(size), np.zeros(size, np.int64), np.zeros(size, np.int64)
    k = min(concurrency, n) if closed else 0
    first = np.arange(k, dtype=np.int64)
    heap_t[:k] = first * ramp_step
    heap_s[:k] = first
    heap_i[:k] = first
    return heap_t, heap_s, heap_i, k


@numba.njit(cache=True, nogil=True)
def _static_routes(times, order, rejected, aff_rep, router, closed, R, n):  # type: ignore[no-untyped-def]
    """Static routing (round robin, or affinity with a key for every request, open or offline):
    each replica's own arrival times, in event order. Returns (static, own_start, own_t)."""
    static = False
    if not closed:
        static = router == 0
        if router == 2:
            static = True
            for i in range(n):
                if not rejected[i] and aff_rep[i] < 0:
                    static = False
    own_start = np.zeros(R + 1, np.int64)
    own_t = np.zeros(n if static else 1)
    if static:
        k_acc = 0
        for q in range(n):
            i = order[q]
            if not rejected[i]:
                d = k_acc % R if router == 0 else aff_rep[i]
                own_start[d + 1] += 1
                k_acc += 1
        for d in range(R):
            own_start[d + 1] += own_start[d]
        fill = own_start[:R].copy()
        k_acc = 0
        for q in range(n):
            i = order[q]
            if not rejected[i]:
                d = k_acc % R if router == 0 else aff_rep[i]
                own_t[fill[d]] = times[i]
                fill[d] += 1
                k_acc += 1
    return static, own_start, own_t


def _grow_wq(wq: Any, whead: Any, wlen: Any) -> Any:
    """The waiting queues (ring buffers) at twice the capacity, each unrolled to start at 0."""
    R, wcap = wq.shape
    at = np.arange(wcap, dtype=np.int64)
    held = np.take_along_axis(wq, (whead[:, None] + at) % wcap, axis=1)
    bigger = np.zeros((R, 2 * wcap), np.int64)
    bigger[:, :wcap] = np.where(at < wlen[:, None], held, 0)
    whead[:] = 0
    return bigger


def scaling_state(
    R: int,
    mode: int,
    windows: int,
    window_s: float,
    up: float,
    down: float,
    cooldown_s: float,
    lo: int,
    hi: int,
    delay_s: float,
    plan_t: Any,
    plan_n: Any,
    initial: int,
) -> tuple[Any, ...]:
    """``sc`` for a live replica set decided in the loop (see _live_set above), ``initial``
    replicas (the lowest) live from time 0: mode 0 a schedule's changes (plan_t, plan_n), else a
    signal policy over ``windows`` windows of ``window_s``."""
    active = np.zeros(R, np.bool_)
    active[:initial] = True
    live_from = np.where(active, 0.0, _INF)
    K = max(int(windows), 1)
    ist = np.array([0 if mode == 0 else 1, 0, 0, initial, 0], np.int64)
    first = (plan_t[0] if plan_t.shape[0] else _INF) if mode == 0 else (window_s if K > 1 else _INF)
    fst = np.array([-_INF, -_INF, first])
    return (
        True, int(mode), K, float(window_s), float(up), float(down), float(cooldown_s), int(lo), int(hi),
        float(delay_s), np.asarray(plan_t, np.float64), np.asarray(plan_n, np.int64), live_from, np.full(R, _INF),
        np.zeros(R), np.full(R, -_INF), active, np.zeros(R, np.int64), np.zeros((K, 3)), np.zeros((K, 4)),
        np.zeros(K), np.zeros(K, np.int64), ist, fst, np.zeros(0),
    )  # fmt: skip


def no_scaling() -> tuple[Any, ...]:
    """``sc`` for a fleet whose replicas are all live all the time (the loop reads only ``on``;
    the next decision's time, inf, bounds no span)."""
    one_f, one_i = np.zeros(1), np.zeros(1, np.int64)
    return (
        False, 0, 1, 1.0, 0.0, 0.0, 0.0, 0, 0, 0.0, one_f, one_i, one_f, one_f, one_f, one_f,
        np.zeros(1, np.bool_), one_i, np.zeros((1, 3)), np.zeros((1, 4)), one_f, one_i, np.zeros(5, np.int64),
        np.array([-_INF, -_INF, _INF]), one_f,
    )  # fmt: skip


def run_fleet(
    work: Work,
    fleet: Fleet,
    cost: tuple[Any, ...],
    res: Results,
    ctl: Any,
    pool: tuple[Any, ...],
    sc: tuple[Any, ...] | None = None,
) -> tuple[Any, int]:
    """Replay the whole fleet; returns the step log (rows × LOG_COLS) and its row count.

    ``cost`` is the step cost's tables (pipeline.costmodel.stepcost.TabulatedCost.kernel_tables); ``pool``
    the KV pools (jit.alloc_pool: allocated by numpy, so that pages no replica touches are never
    written). Closed loop (``fleet.closed``): ``fleet.concurrency`` clients send the trace's
    requests in order, client c its first at ``c * fleet.ramp_step_s``, and each finish or
    rejection has its client send the next one ``think_s`` later. An idle lockstep rank costs
    ``dummy_s`` per step; spans of one replica need ``lockstep == 1``.

    ``ctl`` (float64[2]) is shared with the calling thread while the loop runs without the GIL:
    a nonzero ``ctl[0]`` stops the loop at its next event (the results are then incomplete); the
    loop counts the requests done (finished or rejected) in ``ctl[1]``. Neither changes what the
    loop computes.

    The state is allocated here by numpy, and the loop is _replay, the one compiled function (with
    every piece above inlined; its variant for the fleet's kind, _replay_loop): it returns when it
    is done, or to have the step log or a waiting queue grown here (growing changes no result),
    and is called again.

    ``sc`` (:func:`scaling_state`; None: every replica live all the time) has the loop decide the
    live replicas as it goes and route each arrival to a live one; it holds the decisions and
    the windows' signals when the loop returns."""
    args = loop_args(work, fleet, cost, res, ctl, pool, sc)
    wl, fl, cost, results, ctl, req, rep, pool, scr, ev, st, log, last_row, wq, sc = args
    replay = _replay_grouped if fl[10] > 1 else _replay_single
    while True:
        code = replay(wl, fl, cost, results, ctl, req, rep, pool, scr, ev, st, log, last_row, wq, sc)
        if code == _GROW_LOG:  # in place: realloc moves a mapped block without copying it
            log.resize((2 * log.shape[0], LOG_COLS), refcheck=False)
        elif code == _GROW_WQ:
            wq = _grow_wq(wq, rep[6], rep[7])
        else:
            return log, int(st[5])


def loop_args(
    work: Work,
    fleet: Fleet,
    cost: tuple[Any, ...],
    res: Results,
    ctl: Any,
    pool: tuple[Any, ...],
    sc: tuple[Any, ...] | None = None,
) -> tuple[Any, ...]:
    """_replay's arguments for run_fleet's arguments (the loop's state, allocated by numpy):
    (wl, fl, cost, res, ctl, req, rep, pool, scr, ev, st, log, last_row, wq, sc)."""
    n = work.prompt.shape[0]
    R, S, G = int(fleet.replicas), int(fleet.max_seqs), int(fleet.lockstep)
    closed, want_log = bool(fleet.closed), bool(fleet.want_log)
    wl = tuple(work)
    fl = (
        R, int(fleet.router), closed, int(fleet.capacity), S, int(fleet.budget), int(fleet.block_size),
        bool(fleet.chunked), bool(fleet.caching), want_log, G, float(fleet.dummy_s), float(fleet.think_s),
        bool(fleet.async_scheduling), int(fleet.spec_k), float(fleet.spec_e), float(fleet.draft_ctx_s),
    )  # fmt: skip
    req = _requests(n)
    rep = _replicas(R, S)
    wq = np.zeros((R, 64), np.int64)  # waiting queues (ring buffers; grown by _grow_wq)
    scr = _scratch(G, S, fl[6], cost[2].shape[0], cost[10].shape[1], int(fleet.max_blocks))
    # -- step log: rows, and each replica's latest row (a decode span may extend it)
    log = np.zeros((max(1024, LOG_ROWS_PER_REQUEST * n) if want_log else 1, LOG_COLS))
    last_row = np.full(R, -1, np.int64)
    # -- arrival events: open/offline in (time, index) order; closed loop as a binary heap
    order = np.argsort(work.times, kind="stable").astype(np.int64, copy=False)
    heap_t, heap_s, heap_i, heap_n = _heap(closed, int(fleet.concurrency), n, float(fleet.ramp_step_s))
    if sc is None:
        sc = no_scaling()
    else:
        ranked = order[~work.rejected[order]]
        sc = (*sc[:24], np.ascontiguousarray(work.times[ranked], np.float64))
    # (a live set decided in the loop: no static routes; round robin finds a replica's own next
    # arrival as it goes, _own_next_live, from the times of the requests not rejected)
    static, own_start, own_t = _static_routes(
        work.times, order, work.rejected, work.aff_rep, fl[1], closed or sc[0], R, n
    )
    ev = (order, heap_t, heap_s, heap_i, bool(static), own_start, own_t, np.zeros(R, np.int64))
    st = np.zeros(6, np.int64)  # the loop's state: ev_pos, heap_n, seq, next_issue, rr, nlog
    st[1] = st[2] = st[3] = heap_n
    return wl, fl, cost, tuple(res), ctl, req, rep, pool, scr, ev, st, log, last_row, wq, sc


# -- The compile in two processes (jit.compile_engine(parallel=True); a fresh clone's first replay,
# jitcache.compile_ahead). Numba types _replay's calls one after the other, compiling each piece
# the first time a call reaches it: alone, one process compiles everything in turn. Two share it:
# the side process compiles the step-cost kernels (stepcost.tab_row, tab_span_prep, tab_span_row:
# disk-cached with their linkable code) and then _span_one, the decode spans (_piece_cached: on
# disk too); the main process meanwhile compiles the general step's pieces that price nothing
# (compile_leaves: the scheduler's loops, tokens in, retirement), then _step once the kernels are
# on disk, and _replay last, loading _span_one and the kernels from the disk cache. Each piece is
# compiled here for the types the loop passes it (loop_args's values, scalars int64 and float64):
# typing _replay then finds it compiled (were a type to differ, the piece would only compile again,
# for the loop's types: after a parallel compile each has one overload).


def _sig(*values: Any) -> tuple[Any, ...]:
    """The argument types of a call with ``values`` (a numba type stands for itself)."""
    return tuple(v if isinstance(v, numba.types.Type) else numba.typeof(v) for v in values)  # type: ignore[no-untyped-call]


_I64, _F64 = numba.int64, numba.float64


def _chains(wl: tuple[Any, ...]) -> tuple[Any, ...]:
    return (wl[3], wl[4], wl[7], wl[8], wl[9], wl[10], wl[11], wl[12])


def compile_leaves(args: tuple[Any, ...]) -> None:
    """Compile the general step's pieces that price nothing, for ``args`` (:func:`loop_args`)."""
    wl, fl, _, res, ctl, req, rep, pool, scr, ev = args[:10]
    prompt, output, skip, chains = wl[1], wl[2], wl[13], _chains(wl)
    i, f = _I64, _F64
    nrun, running, slots_free, nslots, whead, wlen, wq = rep[2], rep[3], rep[4], rep[5], rep[6], rep[7], args[13]
    _schedule_running.compile(
        _sig(i, i, fl[5], fl[6], fl[8], prompt, output, fl[14], req, nrun, running, slots_free, nslots, whead, wlen,
             wq, scr[0], scr[1], res[6], chains, pool)
    )  # fmt: skip
    _admit.compile(
        _sig(i, i, f, f, i, i, fl[4], fl[6], fl[7], fl[8], prompt, skip, req, nrun, running, slots_free, nslots,
             whead, wlen, wq, scr[0], scr[1], scr[16], res[2], res[7], res[0], chains, pool, rep[13])
    )  # fmt: skip
    _tokens_in.compile(
        _sig(i, f, prompt, output, req[0], req[1], req[6], req[7], fl[15], scr[0], scr[1], scr[3], scr[15], res[3],
             res[4], res[5], res[8])
    )  # fmt: skip
    _retire.compile(
        _sig(i, i, f, i, fl[2], fl[8], fl[12], output, req, nrun, running, rep[9], slots_free, nslots, scr[15],
             ev[1], ev[2], ev[3], ctl, i, i, i, pool)
    )  # fmt: skip


def compile_step(args: tuple[Any, ...]) -> None:
    """Compile _step (the general step, pricing with stepcost.tab_row) for ``args``."""
    wl, fl, cost, res, ctl, req, rep, pool, scr, ev, _, log, last_row, wq, _ = args
    heap = numba.types.UniTuple(_I64, 3)  # type: ignore[no-untyped-call]
    _step.compile(_sig(_I64, _F64, _I64, wl, fl, cost, res, ctl, req, rep, pool, scr, ev, log, last_row, wq, heap))


def compile_kernels(args: tuple[Any, ...]) -> None:
    """Compile the step-cost kernel of the general step (stepcost.tab_row) into the disk cache."""
    cost, scr = args[2], args[8]
    _tab_row.compile(_sig(scr[17], *cost, scr[18]))


def compile_spans(args: tuple[Any, ...]) -> None:
    """Compile the decode span's kernels (stepcost.tab_span_prep, tab_span_row) and _span_one
    into the disk cache, for ``args``."""
    wl, fl, cost, res, _, req, rep, pool, scr, _, _, log, last_row, wq, _ = args
    f = _F64
    _span_prep.compile(_sig(f, cost[0], cost[1], cost[2], cost[3], cost[8], cost[10], cost[15], *scr[19:23]))
    _span_row.compile(_sig(f, f, *cost[2:8], cost[9], cost[15], *scr[19:23], scr[18]))
    _span_one.compile(_sig(_I64, f, f, f, _I64, wl, fl, cost, res, req, rep, pool, scr, log, last_row, wq))
