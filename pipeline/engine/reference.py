"""The reference engine: one step at a time, one token at a time, physical KV blocks.

It is the oracle of the one production engine, :mod:`pipeline.engine.jit` (tests compare the two
on every request's results on generated traces and fleets and on trace slices), and runs nowhere
but in tests and benchmarks. It is written for obviousness, not speed: every step is costed on
its own, every KV block is a numbered object in a free queue, every token is a loop turn. It
shares the configuration types, the rejection rule and the router (pipeline/engine/model.py)
with the compiled engine, and nothing that steps the batch. A new engine feature is written
here and in the compiled loop, with a test that they agree. Semantics: docs/engine.md.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from pipeline.costmodel.steps import STEP_FIELDS, StepBatch, StepCostFn
from pipeline.engine.model import (
    EngineResult,
    FleetSpec,
    Workload,
    apply_frontend,
    choose_replica,
    dummy_step_s,
    initial_arrivals,
    reject_reasons,
    timeline_spec,
)


@dataclass
class _Req:
    idx: int
    arrival: float
    prompt: int
    output: int
    chain: list[int]
    #: prompt tokens the log reports as cache hits, counted as computed at admission
    #: (Workload.skipped_tokens: at most prompt − 1; −1: none reported, look the chain up)
    skip: int = -1
    generated: int = 0
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    last_token: float = float("nan")
    started: bool = False
    #: speculative decoding's accumulator (model.Speculation.advance)
    acc: float = 0.0

    @property
    def num_tokens(self) -> int:
        # vLLM v1 Request.num_tokens: prompt plus the tokens sampled so far.
        return self.prompt + self.generated


class _RefReplica:
    def __init__(self, index: int, spec: FleetSpec, cost: StepCostFn, res: EngineResult) -> None:
        cfg = spec.scheduler
        self.index = index
        self.cfg = cfg
        self.spec_dec = spec.speculation
        self.cost = cost
        self.res = res
        self.clock = 0.0
        #: the start of this replica's latest step (its lockstep group's): with asynchronous
        #: scheduling the next step was scheduled then
        self.prev_start = float("-inf")
        self.pending: deque[_Req] = deque()
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.ref_cnt = [0] * cfg.num_gpu_blocks
        self.block_hash: list[int | None] = [None] * cfg.num_gpu_blocks
        # The free queue in eviction order (head = least recently freed), as vLLM's
        # FreeKVCacheBlockQueue; an OrderedDict gives O(1) removal from the middle.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(cfg.num_gpu_blocks))
        self.cached: dict[int, OrderedDict[int, None]] = {}
        self.routed = 0
        #: KV blocks claimed by the prompts of requests routed here and not yet admitted (most_free_kv)
        self.claimed = 0
        self.finish_times: list[float] = []  # nondecreasing: steps run in time order

    def outstanding(self, t: float) -> int:
        """Requests routed here and not finished by time ``t`` (a finish at ``t`` counts as done)."""
        return self.routed - bisect.bisect_right(self.finish_times, t)

    def free_kv(self) -> int:
        """Free KV blocks (cached ones no request holds included, as vLLM counts them) less the
        blocks claimed by requests routed here and not yet admitted: the most_free_kv router's."""
        return len(self.free) - self.claimed

    def has_work(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    def next_start(self) -> float:
        if self.waiting or self.running:
            return self.clock
        return max(self.clock, self.pending[0].arrival)

    # -- KV blocks -------------------------------------------------------------------------
    def _lookup(self, req: _Req) -> list[int]:
        """Cached blocks for the longest prefix of the chain, never covering the last token."""
        if not self.cfg.enable_prefix_caching:
            return []
        hits: list[int] = []
        limit = (req.num_tokens - 1) // self.cfg.block_size
        for j in range(min(limit, len(req.chain))):
            holders = self.cached.get(req.chain[j])
            if not holders:
                break
            hits.append(next(iter(holders)))
        return hits

    def _allocate(self, req: _Req, n_new: int, hits: list[int], skip: int = 0) -> bool:
        """All-or-nothing allocation of the blocks that ``n_new`` more tokens need, after the
        ``skip`` tokens the log reports as cached (their blocks are the request's own)."""
        bs = self.cfg.block_size
        have = len(req.blocks) + len(hits)
        tokens_after = req.computed + skip + len(hits) * bs + n_new
        need = 0
        # Count per token: a new block starts at every multiple of block_size.
        for pos in range(have * bs, tokens_after):
            if pos % bs == 0:
                need += 1
        evictable_hits = sum(1 for b in hits if self.ref_cnt[b] == 0)
        if need + evictable_hits > len(self.free):
            return False
        for b in hits:
            if self.ref_cnt[b] == 0:
                del self.free[b]
            self.ref_cnt[b] += 1
            req.blocks.append(b)
        for _ in range(need):
            b, _unused = self.free.popitem(last=False)
            old = self.block_hash[b]
            if old is not None:
                holders = self.cached[old]
                del holders[b]
                if not holders:
                    del self.cached[old]
                self.block_hash[b] = None
            self.ref_cnt[b] = 1
            req.blocks.append(b)
        # Register the blocks that are full once this step has run (vLLM caches at allocation).
        if self.cfg.enable_prefix_caching:
            full = min(tokens_after, req.num_tokens) // bs
            for j in range(min(full, len(req.chain))):
                b = req.blocks[j]
                if self.block_hash[b] is None:
                    self.block_hash[b] = req.chain[j]
                    self.cached.setdefault(req.chain[j], OrderedDict())[b] = None
        return True

    def _free(self, req: _Req) -> None:
        for b in reversed(req.blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free[b] = None
        req.blocks = []

    # -- one engine step ---------------------------------------------------------------------
    def step(self) -> list[_Req]:
        """Run one step; return the requests that finished in it."""
        now = self.next_start()
        scheduled, dt = self.schedule(now)
        return self.commit(scheduled, now + dt)

    def schedule(self, now: float) -> tuple[list[tuple[_Req, int]], float]:
        """Schedule the step starting at ``now`` (vLLM v1 schedule()); return the batch and the
        step's duration on this replica."""
        cfg = self.cfg
        self.clock = now
        # Arrivals join the waiting queue. With asynchronous scheduling (docs/engine.md, "The step
        # timeline") a busy replica scheduled this step when its previous one started: only the
        # requests that had arrived by then are seen. A replica with nothing running and nothing
        # seen waiting was idle, and schedules now, seeing every arrival up to now.
        cut = self.prev_start if cfg.async_scheduling else now
        while self.pending and self.pending[0].arrival <= cut:
            self.waiting.append(self.pending.popleft())
        if not self.running and not self.waiting:
            while self.pending and self.pending[0].arrival <= now:
                self.waiting.append(self.pending.popleft())
        self.prev_start = now
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[_Req, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n_new = min(req.num_tokens - req.computed, budget)
            sd = self.spec_dec
            if sd is not None and req.num_tokens - req.computed == 1 and req.generated > 0:
                # a verification: the last token and k' draft tokens (model.Speculation)
                n_new += max(0, min(sd.k, req.output - req.generated - 1, budget - 1))
            self_preempted = False
            while not self._allocate(req, n_new, []):
                victim = self.running.pop()
                self._free(victim)
                victim.computed = 0
                self.res.preemptions[victim.idx] += 1
                self.waiting.appendleft(victim)
                preempted = True
                if victim is req:
                    self_preempted = True
                    break
            if self_preempted:
                break
            scheduled.append((req, n_new))
            budget -= n_new
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self.waiting[0]
                # the log's reported hits stand in for the replica's own prefix cache
                skip = max(req.skip, 0) if req.computed == 0 else 0
                hits = self._lookup(req) if req.computed == 0 and req.skip < 0 else []
                n_new = req.num_tokens - req.computed - skip - len(hits) * cfg.block_size
                if not cfg.enable_chunked_prefill and n_new > budget:
                    break
                n_new = min(n_new, budget)
                if not self._allocate(req, n_new, hits, skip):
                    break
                self.waiting.popleft()
                self.running.append(req)
                req.computed += skip + len(hits) * cfg.block_size
                if not req.started:
                    req.started = True
                    self.claimed -= -(-req.prompt // cfg.block_size)
                    self.res.scheduled_s[req.idx] = now
                    self.res.cache_hit_tokens[req.idx] = skip + len(hits) * cfg.block_size
                scheduled.append((req, n_new))
                budget -= n_new
        assert scheduled, "a replica with work always schedules something"

        row: dict[str, float] = dict.fromkeys(STEP_FIELDS, 0.0)
        verified = 0
        passes = 0
        draft_ctx = 0.0
        for req, n in scheduled:
            if req.computed + n > req.num_tokens:  # a verification of n − 1 drafts
                verified += 1
                passes = max(passes, n - 1)
                draft_ctx += req.computed + 1
            if n == 1:
                row["decode_seqs"] += 1
                row["decode_ctx_tokens"] += req.computed + 1
            else:
                row["prefill_tokens"] += n
                row["prefill_seqs"] += 1
                row["prefill_attn_pairs"] += n * req.computed + n * (n + 1) / 2
                row["prefill_kv_tokens"] += req.computed + n
        batch = StepBatch(**{k: np.array([v]) for k, v in row.items()})
        dt = float(self.cost(batch).time_s[0])
        if verified:
            assert self.spec_dec is not None
            dt += passes * (self.spec_dec.pass_s(verified) + self.spec_dec.draft_ctx_s * draft_ctx)
        return scheduled, dt

    def commit(self, scheduled: list[tuple[_Req, int]], end: float) -> list[_Req]:
        """Feed the scheduled tokens, sample at ``end``; return the requests that finished."""
        self.clock = end
        finished: list[_Req] = []
        for req, n in scheduled:
            sampled = 0
            if req.computed + n > req.num_tokens:
                # A verification: of its n tokens the last sampled one and the accepted drafts are
                # kept, each fed and each followed by one more sampled token (model.Speculation).
                assert self.spec_dec is not None
                adv, req.acc = self.spec_dec.advance(req.acc)
                for _ in range(min(adv, n)):
                    self.res.prefill_tokens[req.idx] += 1
                    req.computed += 1
                    req.generated += 1
                    sampled += 1
            else:
                for _ in range(n):  # one token at a time; prefill_tokens counts every token fed
                    self.res.prefill_tokens[req.idx] += 1
                    req.computed += 1
                if req.computed == req.num_tokens:
                    req.generated += 1
                    sampled = 1
            if sampled:
                if req.generated == 1:
                    self.res.first_token_s[req.idx] = end
                else:
                    gap = end - req.last_token
                    prev = self.res.max_itl_s[req.idx]
                    self.res.max_itl_s[req.idx] = gap if np.isnan(prev) else max(prev, gap)
                req.last_token = end
                if req.generated == req.output:
                    self.res.finish_s[req.idx] = end
                    # Of the tokens fed, the output−1 sampled tokens fed back once each are
                    # decode work; the rest is prefill (prompt and any recomputation).
                    self.res.prefill_tokens[req.idx] -= req.output - 1
                    finished.append(req)
        for req in finished:
            self.running.remove(req)
            self._free(req)
            self.finish_times.append(end)
        return finished


def simulate_reference(work: Workload, spec: FleetSpec, cost: StepCostFn) -> EngineResult:
    """Replay ``work`` on ``spec`` step by step. Test use only: slow by design."""
    spec = timeline_spec(spec, cost)
    work = work.explicit()
    n = work.n
    res = EngineResult.empty(n)
    res.reject_reason[:] = reject_reasons(work, spec.scheduler)
    offsets = work.offsets()
    skipped = work.skipped_tokens()
    affinity = work.affinity if work.affinity is not None else np.full(n, -1, np.int64)
    replicas = [_RefReplica(r, spec, cost, res) for r in range(spec.replicas)]
    dummy = dummy_step_s(cost)

    # Arrival events (time, sequence, request index). Closed loop issues the next request of the
    # trace when one finishes (or is rejected), ``think_s`` later; offline sends everything at t = 0.
    # A closed loop's event sends the trace's next request when it is popped (``sent``), and a
    # client sends its next one ``think_s`` after its request ends.
    events, seq, next_issue = initial_arrivals(work, spec)
    closed = spec.mode == "closed"
    sent = 0
    rr = 0

    while True:
        busy = [rep for rep in replicas if rep.has_work()]
        first = min(busy, key=lambda rep: (rep.next_start(), rep.index)) if busy else None
        if events and (first is None or events[0][0] <= first.next_start()):
            t, _s, i = heapq.heappop(events)
            if closed:
                i = sent
                sent += 1
            res.arrival_s[i] = t
            if res.reject_reason[i]:
                if closed and next_issue < n:
                    heapq.heappush(events, (t + spec.think_s, seq, next_issue))
                    seq += 1
                    next_issue += 1
                continue
            free_kv = [rep.free_kv() for rep in replicas] if spec.router == "most_free_kv" else None
            r = choose_replica(spec.router, int(affinity[i]), [rep.outstanding(t) for rep in replicas], rr, free_kv)
            rr += 1
            res.replica[i] = r
            chain = [int(h) for h in work.chain_hashes[offsets[i] : offsets[i + 1]]]
            rep = replicas[r]
            rep.pending.append(
                _Req(i, t, int(work.prompt_tokens[i]), int(work.output_tokens[i]), chain, int(skipped[i]))
            )
            rep.routed += 1
            rep.claimed += -(-int(work.prompt_tokens[i]) // spec.scheduler.block_size)
            continue
        if first is None:
            break
        if spec.lockstep == 1:
            done = first.step()
        else:
            # The lockstep group: every rank with work schedules its own batch, idle ranks run
            # a dummy batch, and the step ends when the slowest rank's does (docs/engine.md).
            g0 = first.index - first.index % spec.lockstep
            now = first.next_start()
            plans: list[tuple[_RefReplica, list[tuple[_Req, int]]]] = []
            dt = 0.0
            for rep in replicas[g0 : g0 + spec.lockstep]:
                if rep.has_work() and rep.next_start() <= now:
                    scheduled, dt_r = rep.schedule(now)
                    plans.append((rep, scheduled))
                else:
                    rep.clock = now
                    rep.prev_start = now
                    plans.append((rep, []))
                    dt_r = dummy
                dt = max(dt, dt_r)
            done = []
            for rep, scheduled in plans:
                done += rep.commit(scheduled, now + dt)
        for req in done:
            if closed and next_issue < n:
                heapq.heappush(events, (float(res.finish_s[req.idx]) + spec.think_s, seq, next_issue))
                seq += 1
                next_issue += 1
    apply_frontend(res, work.output_tokens, spec)
    return res
