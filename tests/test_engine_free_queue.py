"""The compiled engine's KV free queue (pipeline/engine/_jit_kernels.py: a ring of block ids with
lazy removal, compacted when full) against the obvious model, a Python list in eviction order:
random sequences of the three operations the engine does (take the head block, take a cached
block out from the middle on a prefix hit, return a block to the tail) must take the same blocks
in the same order and leave the same queue, through many compactions of a small ring."""

from __future__ import annotations

from collections import deque
from typing import Any

import numba
import numpy as np
import pytest

from pipeline.engine import _jit_kernels as k
from pipeline.engine.jit import alloc_pool, ring_slots


@numba.njit
def _drive(ops, arg, pool, nblk, popped):  # type: ignore[no-untyped-def]
    """Run ``ops`` on replica 0's pool: 0 takes the head block (into ``popped``), 1 unlinks free
    block ``arg``, 2 returns held block ``arg`` (its only holder). Returns how many were taken."""
    nfree, fh, fq, fpos, ft, ref, table, bhash, hashed, hprev, hnext = pool[:11]
    n = 0
    for q in range(ops.shape[0]):
        if ops[q] == 0:
            nblk[1] = 0
            b = k._pop_block(0, 1, 1, nfree, fh, fq, fpos, ft, ref, table, nblk, bhash, hashed, hprev, hnext)
            popped[n] = b
            n += 1
        elif ops[q] == 1:
            k._unlink_free(0, arg[q], nfree, fpos)
            ref[0, arg[q]] = 1
        else:
            table[0, 0, 0] = arg[q]
            nblk[0] = 1
            k._release(0, 0, 0, nfree, fh, fq, fpos, ft, ref, table, nblk)
    return n


def _ops(rng: np.random.Generator, C: int, steps: int) -> tuple[Any, Any, list[int], int]:
    """A random op sequence valid for the model, the blocks the model takes in order, and how
    many times the ring (ring_slots(C) entries from head to tail, stale ones included) is full
    when a block is returned."""
    free = list(range(C))  # the model: eviction order, head first
    held: list[int] = []
    ops, arg, taken = [], [], []
    ring = deque((b, b) for b in range(C))  # (block, entry id) from head to tail
    live = {b: b for b in range(C)}  # block -> its live entry's id
    next_id, full = C, 0
    for _ in range(steps):
        u = rng.random()
        if free and u < 0.1:
            b = free.pop(0)
            ops.append(0), arg.append(-1), taken.append(b), held.append(b)
            while live.get(ring[0][0]) != ring[0][1]:
                ring.popleft()
            assert ring.popleft()[0] == b
            del live[b]
        elif free and u < 0.55:
            b = free.pop(int(rng.integers(len(free))))
            ops.append(1), arg.append(b), held.append(b)
            del live[b]
        elif held:
            b = held.pop(int(rng.integers(len(held))))
            ops.append(2), arg.append(b), free.append(b)
            if len(ring) == ring_slots(C):
                full += 1
                ring = deque(e for e in ring if live.get(e[0]) == e[1])
            ring.append((b, next_id))
            live[b] = next_id
            next_id += 1
    ops += [0] * len(free)  # drain: the queue left must be the model's, in order
    arg += [-1] * len(free)
    taken += free
    return np.array(ops, np.int64), np.array(arg, np.int64), taken, full


@pytest.mark.parametrize(("C", "seed"), [(1, 0), (3, 1), (8, 2), (8, 3), (16, 4)])
def test_free_queue_ring_takes_blocks_in_the_linked_lists_order(C: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ops, arg, taken, full = _ops(rng, C, 20000)
    pool = alloc_pool(1, 2, C, True, C + 1, 4)
    nblk = np.zeros(2, np.int64)
    popped = np.full(len(taken), -1, np.int64)
    n = _drive(ops, arg, pool, nblk, popped)
    assert n == len(taken)
    assert popped.tolist() == taken
    assert int(pool[0][0]) == 0  # every block taken: none counted free
    assert full > 0  # the ring filled up (and was compacted) along the way


def test_ring_slots_at_least_twice_the_blocks() -> None:
    assert [ring_slots(c) for c in (1, 2, 3, 4, 5, 1000, 27795)] == [2, 4, 8, 8, 16, 2048, 65536]
