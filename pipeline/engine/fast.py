"""The fast engine: event-driven continuous batching that advances spans of steps at once.

Between events the batch composition of a replica is fixed: every running request decodes one
token per step, nobody is admitted, nobody finishes, no KV allocation can fail. Over such a span
the step shapes follow a closed form (decode context grows by the batch size each step), so the
span's k steps are built as one StepBatch of k rows, costed in one vectorised call, and their end
times come from one cumulative sum. A span ends at the first event: a completion, an arrival
that could be admitted, a KV allocation that could fail, or a fleet barrier. Every other step
(admissions, prefill chunks, preemptions) is a single step, still vectorised over the running
batch. The cost therefore grows with events, not tokens.

The KV cache is modelled exactly as vLLM v1's block pool, but compactly: blocks without a prefix
hash are interchangeable, so the free queue stores runs of them as counts and only hashed blocks
individually (an LRU OrderedDict keyed by block id, runs by negative keys). Semantics, and the
vLLM source each rule follows: docs/engine.md. The reference engine (reference.py) implements
the same rules one step and one token at a time; tests require both to agree to 1e-9.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from pipeline.engine.jit import reachable_prefix
from pipeline.engine.model import (
    EngineResult,
    FleetSpec,
    Workload,
    choose_replica,
    initial_arrivals,
    is_stateful_router,
    reject_reasons,
)
from pipeline.engine.steplog import StepLog
from pipeline.errors import ConfigError
from pipeline.steps import FloatArray, IntArray, StepBatch, StepCost, StepCostFn

_INF = float("inf")
#: First span length tried before the time limits are known; doubled while the span survives.
_SPAN_PROBE = 64


class _State:
    """Per-request state shared by all replicas (indexed by request id)."""

    def __init__(self, work: Workload, res: EngineResult) -> None:
        work = work.explicit()  # this engine reads every chain as hashes
        self.prompt = work.prompt_tokens.astype(np.int64)
        self.output = work.output_tokens.astype(np.int64)
        self.offsets = work.offsets()
        self.hashes = work.chain_hashes
        n = work.n
        self.chain_len = np.diff(self.offsets)
        self.skip = work.skipped_tokens()  # the log's reported hits, counted as computed at admission
        self.computed = np.zeros(n, np.int64)
        self.gen = np.zeros(n, np.int64)
        self.nblocks = np.zeros(n, np.int64)
        self.fed = np.zeros(n, np.int64)
        self.last_tok = np.full(n, np.nan)
        self.started = np.zeros(n, bool)
        self.nhashed = np.zeros(n, np.int64)  # len(_Replica.hashed[rid]): for vectorised checks
        self.res = res
        self.finished = 0  # requests finished so far (for progress)


class _Replica:
    def __init__(self, index: int, spec: FleetSpec, cost: StepCostFn, st: _State, log: StepLog | None) -> None:
        cfg = spec.scheduler
        self.index = index
        self.cost = cost
        self.st = st
        self.log = log
        self.bs = cfg.block_size
        self.max_seqs = cfg.max_num_seqs
        self.budget = cfg.max_num_batched_tokens
        self.chunked = cfg.enable_chunked_prefill
        self.caching = cfg.enable_prefix_caching and st.hashes.shape[0] > 0
        self.capacity = cfg.num_gpu_blocks
        self.clock = 0.0
        self.last_dt = 0.0  # duration of the latest step, to size span probes near barriers
        self.pending: deque[int] = deque()
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        # KV block pool: free_count blocks are free (ref 0), in eviction order in self.free.
        self.free_count = cfg.num_gpu_blocks
        self.free: OrderedDict[int, int] = OrderedDict({-1: cfg.num_gpu_blocks})
        self._next_run_key = -2
        self._next_bid = 0
        self.ref: dict[int, int] = {}  # hashed block id -> ref count
        self.bhash: dict[int, int] = {}  # hashed block id -> hash
        # hash -> holders, oldest first (a dict keeps insertion order; holders are few)
        self.cached: dict[int, dict[int, None]] = {}
        self.hashed: dict[int, list[int]] = {}  # request -> its hashed blocks (a prefix of its blocks)
        # A waiting request's last prefix lookup and the eviction count it saw: hashes only ever
        # join the cache between evictions, so its hits stay hits and only the tail is looked up
        # again (a blocked head is looked up at every step).
        self._evictions = 0
        self._looked: dict[int, tuple[int, list[int]]] = {}
        self.routed = 0
        self.finish_times: list[float] = []
        self.finished_now: list[int] = []

    # -- bookkeeping -------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    def next_start(self) -> float:
        if self.waiting or self.running:
            return self.clock
        return max(self.clock, float(self.st.res.arrival_s[self.pending[0]]))

    def outstanding(self, t: float) -> int:
        return self.routed - bisect_right(self.finish_times, t)

    # -- KV block pool -----------------------------------------------------------------------
    def _pop_free(self, n: int) -> None:
        """Take ``n`` blocks from the head of the free queue, evicting their hashes."""
        self.free_count -= n
        free = self.free
        bhash, ref, cached = self.bhash, self.ref, self.cached
        while n > 0:
            key, run = free.popitem(last=False)
            if key < 0:
                if run > n:
                    free[key] = run - n
                    free.move_to_end(key, last=False)
                    return
                n -= run
            else:
                h = bhash.pop(key)
                del ref[key]
                self._evictions += 1
                holders = cached[h]
                del holders[key]
                if not holders:
                    del cached[h]
                n -= 1

    def _release(self, rid: int) -> None:
        """Free a request's blocks in reverse order (tail blocks become the first evicted)."""
        st = self.st
        hashed = self.hashed.pop(rid, [])
        st.nhashed[rid] = 0
        unhashed = int(st.nblocks[rid]) - len(hashed)
        if unhashed:
            self.free[self._next_run_key] = unhashed
            self._next_run_key -= 1
            self.free_count += unhashed
        ref, free = self.ref, self.free
        for bid in reversed(hashed):
            left = ref[bid] - 1
            ref[bid] = left
            if left == 0:
                free[bid] = 1
                self.free_count += 1
        st.nblocks[rid] = 0

    def _lookup(self, rid: int) -> list[int]:
        st = self.st
        if not self.caching:
            return []
        ntok = int(st.prompt[rid] + st.gen[rid])
        lo = int(st.offsets[rid])
        limit = min((ntok - 1) // self.bs, int(st.chain_len[rid]))
        seen = self._looked.get(rid)
        hits = list(seen[1][:limit]) if seen is not None and seen[0] == self._evictions else []
        cached = self.cached
        at = len(hits)
        while at < limit:  # in pieces: a miss usually comes long before a long chain's end
            end = min(limit, at + 64)
            for h in st.hashes[lo + at : lo + end].tolist():
                holders = cached.get(h)
                if not holders:
                    self._looked[rid] = (self._evictions, hits)
                    return list(hits)
                hits.append(next(iter(holders)))
            at = end
        self._looked[rid] = (self._evictions, hits)
        return list(hits)

    def _register(self, rid: int, tokens_after: int) -> None:
        """Give hashes to the request's blocks that are full once ``tokens_after`` are in."""
        st = self.st
        target = min(int(st.chain_len[rid]), tokens_after // self.bs)
        mine = self.hashed.setdefault(rid, [])
        have = len(mine)
        if have >= target:
            return
        lo = int(st.offsets[rid])
        hs = st.hashes[lo + have : lo + target].tolist()
        b0 = self._next_bid
        bids = range(b0, b0 + len(hs))
        self._next_bid = b0 + len(hs)
        self.ref.update(dict.fromkeys(bids, 1))
        self.bhash.update(zip(bids, hs, strict=True))
        cached = self.cached
        for bid, h in zip(bids, hs, strict=True):
            holders = cached.get(h)
            if holders is None:
                cached[h] = {bid: None}
            else:
                holders[bid] = None
        mine.extend(bids)
        st.nhashed[rid] = target

    def _has_pending_chain(self, rid: int) -> bool:
        return self.caching and int(self.st.chain_len[rid]) > int(self.st.nhashed[rid])

    def _preempt(self, rid: int) -> None:
        self._release(rid)
        self.st.computed[rid] = 0
        self.st.res.preemptions[rid] += 1
        self.waiting.appendleft(rid)

    # -- admission check without side effects (for span eligibility) ---------------------------
    def _head_blocked_stably(self, budget_left: int, free_after: int) -> bool:
        """True when the waiting head cannot be admitted now and, while the running batch only
        decodes, will stay so: blocked by max_num_seqs, the token budget, or (without chunked
        prefill) its prompt size — none of which change — or by KV when none of its prefix hits
        sits in the free queue (so no eviction can change its hits) and no running request will
        register new prefix blocks."""
        if not self.waiting:
            return True
        if len(self.running) >= self.max_seqs or budget_left <= 0:
            return True
        st = self.st
        rid = self.waiting[0]
        first, skip = st.computed[rid] == 0, int(st.skip[rid])
        hits = self._lookup(rid) if first and skip < 0 else []
        skip = max(skip, 0) if first else 0
        ntok = int(st.prompt[rid] + st.gen[rid])
        computed = int(st.computed[rid]) + skip + len(hits) * self.bs
        n_new = ntok - computed
        if not self.chunked and n_new > budget_left:
            return True
        n_new = min(n_new, budget_left)
        need = -(-(computed + n_new) // self.bs) - int(st.nblocks[rid]) - len(hits)
        evictable = list(map(self.ref.__getitem__, hits)).count(0)
        if need + evictable <= free_after:
            return False  # admissible: not a span
        if evictable:
            return False  # an eviction could change the head's hits: step singly
        return not self.caching or not any(self._has_pending_chain(r) for r in self.running)

    # -- stepping ----------------------------------------------------------------------------
    def advance(self, lt: float = _INF, le: float = _INF, stop_on_finish: bool = False) -> None:
        """Run steps while the next step starts before ``lt`` and not after ``le``."""
        st = self.st
        arrival = st.res.arrival_s
        while self.waiting or self.running or self.pending:
            start = self.next_start()
            if not (start < lt and start <= le):
                return
            self.clock = start
            pending = self.pending
            while pending and arrival[pending[0]] <= start:
                self.waiting.append(pending.popleft())
            if not self._try_span(lt, le):
                self._single_step()
            if self.finished_now:
                if stop_on_finish:
                    return  # the fleet driver reads and clears finished_now
                self.finished_now.clear()

    def _try_span(self, lt: float, le: float) -> bool:
        """Advance a span of pure-decode steps if the next step is one; False if it is not."""
        st = self.st
        running = self.running
        if not running:
            return False
        ids = np.fromiter(running, np.int64, len(running))
        comp = st.computed[ids]
        ntok = st.prompt[ids] + st.gen[ids]
        if not np.array_equal(ntok - comp, np.ones_like(comp)):
            return False
        n = ids.shape[0]
        bs = self.bs
        # Step m (1-based) writes KV position comp + m − 1, which opens a new block when it is a
        # multiple of block_size: periodic in m with period block_size.
        phase = (-comp) % bs  # 0-based step index of each request's first new block
        per_phase = np.bincount(phase, minlength=bs)
        if per_phase[0] > self.free_count:
            return False  # the first step already needs a preemption
        if not self._head_blocked_stably(self.budget - n, self.free_count - int(per_phase[0])):
            return False
        remaining = st.output[ids] - st.gen[ids]
        kmax = int(remaining.min())
        # KV limit: largest k whose cumulative new blocks fit in the free blocks.
        cyc = int(per_phase.sum())
        cum_phase = np.cumsum(per_phase)
        full_cycles = self.free_count // cyc if cyc else kmax
        k_kv = kmax
        if cyc:
            left = self.free_count - full_cycles * cyc
            k_kv = min(kmax, full_cycles * bs + int(np.searchsorted(cum_phase, left, side="right")))
        k_cap = min(kmax, k_kv)
        next_arrival = _INF
        if not self.waiting and self.pending:
            next_arrival = float(st.res.arrival_s[self.pending[0]])
        limit_lt = min(lt, next_arrival)
        ctx0 = float((comp + 1).sum())
        start = self.clock
        length = min(k_cap, _SPAN_PROBE)
        horizon = min(limit_lt, le)
        if horizon < _INF and self.last_dt > 0.0:
            # Near a barrier: cost only about as many steps as fit before it.
            length = max(1, min(length, int((horizon - start) / self.last_dt) + 2))
        while True:
            j = np.arange(length, dtype=np.float64)
            zeros = np.zeros(length)
            batch = StepBatch(
                prefill_tokens=zeros,
                prefill_seqs=zeros,
                prefill_attn_pairs=zeros,
                prefill_kv_tokens=zeros,
                decode_seqs=np.full(length, float(n)),
                decode_ctx_tokens=ctx0 + n * j,
            )
            cost = self.cost(batch)
            acc = np.empty(length + 1)
            acc[0] = start
            acc[1:] = cost.time_s
            ends = np.cumsum(acc)[1:]  # sequential sums: bit-identical to step-by-step
            # Step m starts at ends[m-2]; it may run if that start is < limit_lt and <= le.
            k_time = 1 + int(
                min(
                    np.searchsorted(ends[:-1], limit_lt, side="left"),
                    np.searchsorted(ends[:-1], le, side="right"),
                )
            )
            if k_time < length or length == k_cap:
                k = min(k_time, length)
                break
            length = min(k_cap, length * 2)
        self.last_dt = float(cost.time_s[k - 1])
        self._commit_span(ids, comp, k, ends, cost, n)
        return True

    def _commit_span(self, ids: IntArray, comp: IntArray, k: int, ends: FloatArray, cost: StepCost, n: int) -> None:
        st = self.st
        res = st.res
        bs = self.bs
        start = self.clock
        end = float(ends[k - 1])
        gen0 = st.gen[ids]
        new_blocks = -(-(comp + k) // bs) - st.nblocks[ids]
        total_new = int(new_blocks.sum())
        if total_new:
            self._pop_free(total_new)
        st.nblocks[ids] += new_blocks
        if self.caching:
            self._register_span(ids, comp, k)
        st.computed[ids] = comp + k
        st.gen[ids] = gen0 + k
        st.fed[ids] += k
        first = gen0 == 0
        if first.any():
            res.first_token_s[ids[first]] = float(ends[0])
        gaps_in = float(np.diff(ends[:k]).max()) if k > 1 else -_INF
        prev_gap = np.where(first, -_INF, ends[0] - st.last_tok[ids])
        gap = np.maximum(prev_gap, gaps_in)
        has_gap = np.isfinite(gap)
        if has_gap.any():
            gi = ids[has_gap]
            res.max_itl_s[gi] = np.fmax(res.max_itl_s[gi], gap[has_gap])
        st.last_tok[ids] = end
        if self.log is not None:
            self.log.add(
                self.index,
                start,
                end,
                k,
                0,
                0,
                n,
                n,
                len(self.waiting),
                self.capacity - self.free_count,
                cost,
                k,
            )
        self.clock = end
        done = st.gen[ids] == st.output[ids]
        if done.any():
            self._finish(ids[done].tolist(), end)

    def _register_span(self, ids: IntArray, comp: IntArray, k: int) -> None:
        """Register the prefix blocks filled during a span in the order vLLM would: by step,
        then by position in the running batch (matters only for duplicate hashes)."""
        st = self.st
        have = st.nhashed[ids]
        target = np.minimum(st.chain_len[ids], (comp + k) // self.bs)
        sel = np.flatnonzero(target > have)
        if sel.shape[0] == 0:
            return
        events: list[tuple[int, int, int]] = []
        for pos, rid, c, h0, t in zip(
            sel.tolist(), ids[sel].tolist(), comp[sel].tolist(), have[sel].tolist(), target[sel].tolist(), strict=True
        ):
            for jb in range(h0, t):
                events.append((max(1, (jb + 1) * self.bs - c), pos, rid))
        if len(sel) > 1:
            events.sort()
        for step, pos, rid in events:
            self._register(rid, int(comp[pos]) + step)

    def _finish(self, rids: list[int], end: float) -> None:
        st = self.st
        res = st.res
        gone = set(rids)
        self.running = [r for r in self.running if r not in gone]
        st.finished += len(rids)
        for rid in rids:
            res.finish_s[rid] = end
            res.prefill_tokens[rid] = st.fed[rid] - (st.output[rid] - 1)
            self._release(rid)
            self.finish_times.append(end)
        self.finished_now.extend(rids)

    def _single_step(self) -> None:
        """One step with admissions, prefill chunks or preemptions (vLLM v1 schedule())."""
        st = self.st
        res = st.res
        bs = self.bs
        now = self.clock
        budget = self.budget
        sched_ids: list[int] = []
        sched_n: list[int] = []
        sched_off: list[int] = []
        preempted = False
        running = self.running
        if running:
            ids = np.fromiter(running, np.int64, len(running))
            comp = st.computed[ids]
            need = st.prompt[ids] + st.gen[ids] - comp
            before = np.cumsum(need) - need
            avail = budget - before
            m = int(np.searchsorted(-avail, 0, side="left"))  # avail > 0 on a prefix
            n_new = np.minimum(need[:m], avail[:m])
            blocks = -(-(comp[:m] + n_new) // bs) - st.nblocks[ids[:m]]
            cum_blocks = np.cumsum(blocks)
            ok = int(np.searchsorted(cum_blocks, self.free_count, side="right"))
            if ok:
                self._pop_free(int(cum_blocks[ok - 1]))
                st.nblocks[ids[:ok]] += blocks[:ok]
                if self.caching:
                    for pos in range(ok):
                        rid = int(ids[pos])
                        if self._has_pending_chain(rid):
                            self._register(rid, int(comp[pos] + n_new[pos]))
                sched_ids = ids[:ok].tolist()
                sched_n = n_new[:ok].tolist()
                sched_off = comp[:ok].tolist()
                budget -= int(n_new[:ok].sum())
            if ok < m:
                # An allocation fails: from here on, request by request with preemption of the
                # most recently admitted running request (vLLM: self.running.pop()).
                idx = ok
                while idx < len(running) and budget > 0:
                    rid = running[idx]
                    c = int(st.computed[rid])
                    n = min(int(st.prompt[rid] + st.gen[rid]) - c, budget)
                    need_b = -(-(c + n) // bs) - int(st.nblocks[rid])
                    self_preempted = False
                    while need_b > self.free_count:
                        victim = running.pop()
                        self._preempt(victim)
                        preempted = True
                        if victim == rid:
                            self_preempted = True
                            break
                    if self_preempted:
                        break
                    self._pop_free(need_b)
                    st.nblocks[rid] += need_b
                    if self._has_pending_chain(rid):
                        self._register(rid, c + n)
                    sched_ids.append(rid)
                    sched_n.append(n)
                    sched_off.append(c)
                    budget -= n
                    idx += 1
        if not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < self.max_seqs:
                rid = waiting[0]
                first, skip = st.computed[rid] == 0, int(st.skip[rid])
                hits = self._lookup(rid) if first and skip < 0 else []
                skip = max(skip, 0) if first else 0
                ntok = int(st.prompt[rid] + st.gen[rid])
                c = int(st.computed[rid]) + skip + len(hits) * bs
                n = ntok - c
                if not self.chunked and n > budget:
                    break
                n = min(n, budget)
                need_b = -(-(c + n) // bs) - int(st.nblocks[rid]) - len(hits)
                evictable = list(map(self.ref.__getitem__, hits)).count(0)
                if need_b + evictable > self.free_count:
                    break
                waiting.popleft()
                self._looked.pop(rid, None)
                running.append(rid)
                if hits:
                    for b in hits:
                        if self.ref[b] == 0:
                            del self.free[b]
                            self.free_count -= 1
                        self.ref[b] += 1
                    self.hashed[rid] = list(hits)
                    st.nhashed[rid] = len(hits)
                self._pop_free(need_b)
                st.nblocks[rid] += len(hits) + need_b
                st.computed[rid] = c
                if self._has_pending_chain(rid):
                    self._register(rid, c + n)
                if not st.started[rid]:
                    st.started[rid] = True
                    res.scheduled_s[rid] = now
                    res.cache_hit_tokens[rid] = c
                sched_ids.append(rid)
                sched_n.append(n)
                sched_off.append(c)
                budget -= n
        self._execute(sched_ids, sched_n, sched_off)

    def _execute(self, sched_ids: list[int], sched_n: list[int], sched_off: list[int]) -> None:
        st = self.st
        res = st.res
        now = self.clock
        ids = np.array(sched_ids, np.int64)
        n = np.array(sched_n, np.int64)
        off = np.array(sched_off, np.int64)
        dec = n == 1
        pre = ~dec
        nf = n[pre].astype(np.float64)
        of = off[pre].astype(np.float64)
        batch = StepBatch(
            prefill_tokens=np.array([nf.sum()]),
            prefill_seqs=np.array([float(nf.shape[0])]),
            prefill_attn_pairs=np.array([(nf * of + nf * (nf + 1) / 2).sum()]),
            prefill_kv_tokens=np.array([(of + nf).sum()]),
            decode_seqs=np.array([float(dec.sum())]),
            decode_ctx_tokens=np.array([float((off[dec] + 1).sum())]),
        )
        cost = self.cost(batch)
        self.last_dt = float(cost.time_s[0])
        end = now + self.last_dt
        comp = off + n
        st.computed[ids] = comp
        st.fed[ids] += n
        sampled = comp == st.prompt[ids] + st.gen[ids]
        if self.log is not None:
            self.log.add(
                self.index,
                now,
                end,
                1,
                int(n[pre].sum()),
                int(pre.sum()),
                int(dec.sum()),
                len(self.running),
                len(self.waiting),
                self.capacity - self.free_count,
                cost,
                1,
            )
        self.clock = end
        if not sampled.any():
            return
        sid = ids[sampled]
        g = st.gen[sid] + 1
        st.gen[sid] = g
        first = g == 1
        if first.any():
            res.first_token_s[sid[first]] = end
        later = sid[~first]
        if later.shape[0]:
            res.max_itl_s[later] = np.fmax(res.max_itl_s[later], end - st.last_tok[later])
        st.last_tok[sid] = end
        done = g == st.output[sid]
        if done.any():
            self._finish(sid[done].tolist(), end)


def simulate(
    work: Workload,
    spec: FleetSpec,
    cost: StepCostFn,
    log: StepLog | None = None,
    progress: Callable[[int], None] | None = None,
) -> EngineResult:
    """Replay ``work`` on the fleet ``spec``; per-request results, spans appended to ``log``."""
    if spec.lockstep > 1:
        raise ConfigError("lockstep data-parallel ranks run on the jit engine only (pipeline.engine.jit)")
    if spec.router in ("round_robin", "least_outstanding"):  # replicas no request can reach cost nothing
        spec = replace(spec, replicas=reachable_prefix(work, spec))
    n = work.n
    res = EngineResult.empty(n)
    res.reject_reason[:] = reject_reasons(work, spec.scheduler)
    st = _State(work, res)
    reps = [_Replica(r, spec, cost, st, log) for r in range(spec.replicas)]
    affinity = work.affinity if work.affinity is not None else np.full(n, -1, np.int64)
    rejected = res.reject_reason != 0

    if spec.mode != "closed" and not is_stateful_router(spec.router):
        # Routing does not depend on replica state: route everything, replay replicas apart.
        res.arrival_s[:] = 0.0 if spec.mode == "offline" else work.arrival_s
        order = np.argsort(res.arrival_s, kind="stable")
        accepted = order[~rejected[order]]
        replica = np.arange(accepted.shape[0]) % spec.replicas
        res.replica[accepted] = replica
        for r, rep in enumerate(reps):
            rep.pending.extend(accepted[replica == r].tolist())
            rep.routed = len(rep.pending)
            rep.advance()
            if progress is not None:
                progress(r + 1)
        return res

    # Lockstep: arrivals in time order; before routing one at time t, every replica has run all
    # steps that start before t. Closed loop adds an arrival at each finish.
    events, seq, next_issue = initial_arrivals(work, spec)
    closed = spec.mode == "closed"
    think = spec.think_s
    sent = 0  # closed loop: requests sent so far (an event sends the trace's next one when popped)
    rr = 0
    n_rejected = int(rejected.sum())
    turns = 0
    while True:
        turns += 1
        if progress is not None and turns % 256 == 0:  # (the reporter writes a line every few seconds)
            progress(st.finished + n_rejected)
        busy = [rep for rep in reps if rep.has_work()]
        starts = [rep.next_start() for rep in busy]
        t_a = events[0][0] if events else _INF
        if busy:
            j = min(range(len(busy)), key=lambda q: (starts[q], busy[q].index))
            first, s_first = busy[j], starts[j]
        if events and (not busy or t_a <= s_first):
            t, _s, i = heapq.heappop(events)
            if closed:
                i = sent
                sent += 1
            res.arrival_s[i] = t
            if rejected[i]:
                if closed and next_issue < n:
                    heapq.heappush(events, (t + think, seq, next_issue))
                    seq += 1
                    next_issue += 1
                continue
            r = choose_replica(spec.router, int(affinity[i]), [rep.outstanding(t) for rep in reps], rr)
            rr += 1
            res.replica[i] = r
            reps[r].pending.append(i)
            reps[r].routed += 1
            continue
        if not busy:
            break
        if closed:
            # Another replica's next finish is after its next step start; stepping no further
            # than the earliest of those keeps every closed-loop arrival in time order.
            # Ties go to the lower replica index, as in the reference (it picks the replica with the
            # smallest (next start, index)): a step starting exactly when a lower-index replica's
            # does must wait for it, so the bound becomes the float just below that start.
            others = [(s, busy[q].index) for q, s in enumerate(starts) if q != j]
            le = _INF
            if others:
                s_min, idx_min = min(others)
                le = s_min if first.index < idx_min else float(np.nextafter(s_min, -np.inf))
            first.advance(lt=t_a, le=le, stop_on_finish=True)
            for rid in first.finished_now:
                if next_issue < n:
                    heapq.heappush(events, (float(res.finish_s[rid]) + think, seq, next_issue))
                    seq += 1
                    next_issue += 1
            first.finished_now.clear()
        else:
            first.advance(lt=t_a)
    return res
