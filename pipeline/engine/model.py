"""Types shared by the compiled engine and the reference engine: scheduler settings, the workload,
arrival modes, rejection rules, routing and the per-request result.

Both engines take the same :class:`SchedulerConfig`, :class:`Workload` and cost function and
must produce the same :class:`EngineResult`; they share nothing that steps the batch. The
semantics they implement are documented once, in ``docs/engine.md``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pipeline.common.blockhash import mix64
from pipeline.common.errors import ConfigError
from pipeline.costmodel.steps import FloatArray, IntArray, StepBatch, StepCostFn

if TYPE_CHECKING:
    from pipeline.classify.prefix import ChainTree

U64Array = npt.NDArray[np.uint64]

#: Routing policies (docs/engine.md, "Arrivals and routing"). Dispatch is by plain string comparison.
ROUTERS: tuple[str, ...] = ("round_robin", "least_outstanding", "session_affinity", "prefix_affinity", "most_free_kv")

#: How requests are sent: the trace's arrival times, C closed-loop clients, or all at t=0.
MODES: tuple[str, ...] = ("open", "closed", "offline")

#: Reject reason codes (index into this tuple; 0 = not rejected).
REJECT_REASONS: tuple[str, ...] = ("", "exceeds_max_model_len", "exceeds_kv_capacity")
REJECT_MAX_MODEL_LEN = 1
REJECT_KV_CAPACITY = 2


@dataclass(frozen=True)
class SchedulerConfig:
    """One replica's continuous-batching engine, with vLLM's names.

    ``num_gpu_blocks`` is the KV-cache capacity in blocks of ``block_size`` tokens (what vLLM
    computes from ``gpu_memory_utilization`` at start-up, or ``num_gpu_blocks_override``).
    """

    num_gpu_blocks: int
    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    #: vLLM's ``--async-scheduling`` (vllm/config/scheduler.py ``SchedulerConfig.async_scheduling``):
    #: the scheduler prepares step k while step k−1 runs on the GPU, so a busy replica's step k
    #: admits only the requests that arrived by the start of step k−1; an idle replica admits at
    #: once (docs/engine.md, "The step timeline"). The fleet's default is keyed on its vLLM
    #: release (pipeline/replay/fleet.py: on from 0.14.0); the engines' default is off.
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        for name in (
            "num_gpu_blocks",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"engine.{name} must be a positive integer, got {value!r}")
        # vLLM's SchedulerConfig rejects these combinations at start-up too (vllm/config/scheduler.py):
        # a step must be able to hold one token of every running sequence, and without chunked
        # prefill a whole prompt must fit in one step's token budget.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"engine.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"engine.max_num_seqs ({self.max_num_seqs})"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                f"engine.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_model_len ({self.max_model_len}) when enable_chunked_prefill is false"
            )


@dataclass(frozen=True)
class Workload:
    """Requests as parallel arrays, in trace order (sorted by ``arrival_s`` for open loop).

    ``chain_hashes[chain_offsets[i]:chain_offsets[i+1]]`` is request i's prefix chain: one hash
    per *full* block of ``block_size`` tokens, in token order (CSR layout, as pipeline.classify.prefix
    builds it). Blocks past the prompt may be included (they then describe output tokens).
    ``chain_tree`` holds the same chains compactly instead (pipeline.classify.prefix.ChainTree:
    O(requests), not O(blocks)); the jit engine hashes a request's blocks from it when it needs
    them, the other engines take :meth:`explicit`. ``affinity`` is the routing key of the
    session/prefix affinity routers (−1 = none).

    ``reported_hit_tokens`` are the leading prompt tokens the log says its serving stack took
    from a prefix cache (provider-reported ``cached_tokens``; −1 = the log reports nothing for
    the request). A request with a report (0 included) never looks its chain up in the
    replica's own prefix cache: at its first admission (and again after a preemption) the
    engines count its reported tokens as already computed, at most ``prompt − 1`` of them (the
    last prompt token is always computed for its logits, as vLLM does). No prefill is spent on
    them, but they take KV blocks of the request's own, counted against the replica's capacity,
    freed with the request and never shared (the log names no content to share them by). Its
    full blocks still enter the replica's cache under its chain, if it has one.
    docs/engine.md, "Cache hits the log reports".

    ``recorded_input_tokens`` are the prompts as logged where they differ from ``prompt_tokens``
    (a logged 0 is replayed as 1: an engine computes at least one prompt token); the engines
    never read it, the run's requests table does.
    """

    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    chain_hashes: U64Array = field(default_factory=lambda: np.zeros(0, np.uint64))
    chain_offsets: IntArray | None = None
    affinity: IntArray | None = None
    chain_tree: ChainTree | None = None
    reported_hit_tokens: IntArray | None = None
    recorded_input_tokens: IntArray | None = None

    def __post_init__(self) -> None:
        n = self.n
        if self.prompt_tokens.shape != (n,) or self.output_tokens.shape != (n,):
            raise ValueError("arrival_s, prompt_tokens and output_tokens must have the same length")
        if self.reported_hit_tokens is not None and (
            self.reported_hit_tokens.shape != (n,) or (n and self.reported_hit_tokens.min() < -1)
        ):
            raise ValueError("reported_hit_tokens must have length n and be >= -1 (-1: none reported)")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("every request needs at least one prompt token and one output token")
        if self.chain_offsets is not None and self.chain_offsets.shape != (n + 1,):
            raise ValueError("chain_offsets must have length n + 1")
        if self.affinity is not None and self.affinity.shape != (n,):
            raise ValueError("affinity must have length n")
        if self.chain_tree is not None and (self.chain_tree.n != n or self.chain_hashes.size):
            raise ValueError("chain_tree must cover the n requests, without chain_hashes")

    @property
    def n(self) -> int:
        return int(self.arrival_s.shape[0])

    def offsets(self) -> IntArray:
        if self.chain_tree is not None:
            return self.chain_tree.offsets()
        if self.chain_offsets is None:
            return np.zeros(self.n + 1, np.int64)
        return self.chain_offsets

    @property
    def has_chains(self) -> bool:
        """Whether any request has a prefix block to cache."""
        if self.chain_tree is not None:
            return bool(self.chain_tree.blocks.any())
        return bool(self.chain_hashes.shape[0] > 0)

    def recorded(self, a: int = 0, b: int | None = None) -> IntArray:
        """The logged prompt lengths of requests ``a:b``."""
        src = self.recorded_input_tokens if self.recorded_input_tokens is not None else self.prompt_tokens
        return src[a:b]

    def has_chain(self, a: int = 0, b: int | None = None) -> npt.NDArray[np.bool_]:
        """Whether each of requests ``a:b`` has a prefix block to look up in a replica's cache."""
        if self.chain_tree is not None:
            return self.chain_tree.blocks[a:b] > 0
        if self.chain_offsets is None:
            return np.zeros(self.prompt_tokens[a:b].shape[0], np.bool_)
        end = None if b is None else b + 1
        return np.diff(self.chain_offsets[a:end]) > 0

    def skipped_tokens(self) -> IntArray:
        """Per request, the prompt tokens the engines count as computed at admission from the
        log's report, ``min(reported_hit_tokens, prompt_tokens − 1)``, or −1 where the log
        reports nothing (the replica's own prefix cache is looked up instead)."""
        if self.reported_hit_tokens is None:
            return np.full(self.n, -1, np.int64)
        rep = self.reported_hit_tokens.astype(np.int64)
        return np.where(rep < 0, -1, np.minimum(rep, self.prompt_tokens - 1)).astype(np.int64)

    def explicit(self) -> Workload:
        """This workload with its chains as hashes (``chain_tree`` materialised)."""
        if self.chain_tree is None:
            return self
        hashes, offsets = self.chain_tree.materialise()
        return replace(self, chain_hashes=hashes, chain_offsets=offsets, chain_tree=None)


#: Most speculative tokens a verification may carry (vLLM's ``num_speculative_tokens`` has no hard
#: cap; past 16 no published drafter keeps a useful acceptance, and the bound keeps the scheduled
#: chunk of one request small).
MAX_SPECULATIVE_TOKENS = 16


def tokens_per_verification(acceptance: float, k: int) -> float:
    """Expected tokens one verification of ``k`` draft tokens advances when each draft token is
    accepted with probability ``acceptance`` independently, the chain stopping at the first
    rejection, plus the target's own (bonus or correction) token: ``(1 − a^(k+1)) / (1 − a)``
    (``k + 1`` at a = 1). Leviathan et al., "Fast Inference from Transformers via Speculative
    Decoding" (ICML 2023), eq. (1)."""
    if acceptance >= 1.0:
        return float(k + 1)
    return float((1.0 - acceptance ** (k + 1)) / (1.0 - acceptance))


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding as both engines run it (docs/engine.md, "Speculative decoding").

    A running request whose next step is a decode (one token to compute, at least one sampled)
    schedules ``1 + k'`` tokens instead, ``k' = min(k, output − generated − 1, budget − 1)``: the
    target verifies its last token and ``k'`` draft tokens, priced as a prefill chunk of
    ``1 + k'`` query tokens at its context, and its KV blocks are allocated for all of them. The
    verification advances it by ``floor(acc + E) − floor(acc)`` tokens (at most ``1 + k'``), where
    ``acc`` is the request's accumulator (it starts at 0 and gains ``mean_accepted`` = E each
    verification): deterministic, E tokens a step on average. The step also pays the drafter:
    ``passes × (draft_pass_s[B] + draft_ctx_s × C)`` seconds, with B the requests verified, C
    their contexts summed (computed + 1 each) and ``passes`` the largest ``k'`` among them."""

    k: int
    #: E: tokens a verification of ``k`` drafts advances on average (accepted drafts + the
    #: target's own token), in [1, k + 1]
    mean_accepted: float
    #: seconds of one draft pass over B sequences (index B = 0 .. max_num_seqs) at no context
    draft_pass_s: tuple[float, ...] = ()
    #: seconds one draft pass adds per context token of the sequences it drafts for
    draft_ctx_s: float = 0.0
    #: what drafts: draft_model, eagle, mtp or ngram (for people; the engines read the numbers)
    method: str = "ngram"

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or not 1 <= self.k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"num_speculative_tokens must be an integer in 1..{MAX_SPECULATIVE_TOKENS}, got {self.k!r}"
            )
        e = self.mean_accepted
        if not (math.isfinite(e) and 1.0 <= e <= self.k + 1):
            raise ConfigError(
                f"mean accepted tokens per step must be in [1, num_speculative_tokens + 1 = {self.k + 1}], got {e!r}"
            )
        if not all(math.isfinite(x) and x >= 0 for x in (*self.draft_pass_s, self.draft_ctx_s)):
            raise ConfigError("draft pass seconds must be finite and >= 0")

    def pass_s(self, seqs: int) -> float:
        """Seconds of one draft pass over ``seqs`` sequences at no context (0 past the table:
        the table covers max_num_seqs)."""
        return self.draft_pass_s[seqs] if seqs < len(self.draft_pass_s) else 0.0

    def advance(self, acc: float) -> tuple[int, float]:
        """(tokens a verification advances, the new accumulator) from accumulator ``acc``."""
        nxt = acc + self.mean_accepted
        return math.floor(nxt) - math.floor(acc), nxt


@dataclass(frozen=True)
class FleetSpec:
    """What the engines simulate: N identical replicas behind a router, and how requests arrive."""

    replicas: int
    scheduler: SchedulerConfig
    router: str = "round_robin"
    mode: str = "open"
    concurrency: int = 0
    #: Consecutive replicas that step together (data-parallel ranks of an MoE model): a step of
    #: the group starts when any of them has work, every rank with work schedules its own batch,
    #: idle ranks run a dummy batch, and the step lasts as long as the slowest rank's.
    lockstep: int = 1
    #: Closed loop only: the clients start one after another over ``ramp_s`` seconds (client c
    #: sends its first request at c·ramp_s/(concurrency − 1), so the last one at ``ramp_s``:
    #: AIPerf's ``--concurrency-ramp-duration``, one more concurrent request at even steps), and
    #: each waits ``think_s`` seconds after its request's last token (or its rejection) before it
    #: sends the next. docs/engine.md, "Closed loop".
    ramp_s: float = 0.0
    think_s: float = 0.0
    #: The API server's front end (docs/engine.md, "The front end"): seconds per request
    #: (tokenize, HTTP) and seconds per output token per concurrent stream (detokenize, one
    #: streamed event per token), applied to the engines' results by :func:`apply_frontend`.
    frontend_request_s: float = 0.0
    frontend_token_s: float = 0.0
    #: Speculative decoding (None: off): docs/engine.md, "Speculative decoding".
    speculation: Speculation | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if self.lockstep < 1 or self.replicas % self.lockstep:
            raise ConfigError(f"lockstep groups of {self.lockstep} do not divide {self.replicas} replicas")
        if self.router not in ROUTERS:
            raise ConfigError(f"router {self.router!r} unknown; choose one of {list(ROUTERS)}")
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} unknown; choose one of {list(MODES)}")
        if self.mode == "closed" and self.concurrency < 1:
            raise ConfigError("closed-loop mode needs concurrency >= 1")
        for name in ("ramp_s", "think_s", "frontend_request_s", "frontend_token_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number of seconds >= 0, got {value}")
            if value and self.mode != "closed" and name in ("ramp_s", "think_s"):
                raise ConfigError(f"{name} applies to the closed loop only (mode {self.mode!r})")

    @property
    def ramp_step_s(self) -> float:
        """Seconds between two clients' first requests (0 without a ramp or with one client): client
        c starts at ``c * ramp_step_s``, the same product in every engine."""
        return self.ramp_s / (self.concurrency - 1) if self.concurrency > 1 else 0.0


#: The signals a scaling policy decides on (:class:`Scaling`), in the compiled loop's order.
SCALING_SIGNALS: tuple[str, ...] = ("utilisation", "queue", "kv")


@dataclass
class Scaling:
    """A live replica set the compiled loop decides as it replays (docs/engine.md, "Scaling
    decisions"; pipeline/replay/autoscale.py makes one from a pool's ``[autoscale]`` policy).

    ``initial`` replicas (the lowest indices) are live from time 0; each change of the target
    provisions or retires replicas as ``autoscale.timeline`` does (a new replica takes requests
    ``delay_s`` after its decision; a retired one takes none and finishes its running ones), and
    every arrival is routed to a replica live at its time. ``signal`` is "schedule" (the target
    changes ``planned``, (time, target) pairs in time order) or one of :data:`SCALING_SIGNALS`,
    decided at the end of each of ``windows`` windows of ``window_s`` seconds but the last, from
    the window's signal, as ``autoscale.decide``.

    The run fills in ``decisions``, the (time, target) changes a signal policy made, and
    ``signals``: per window, the mean live replicas (``live``) and each signal, as the decisions
    read them (a schedule: none)."""

    signal: str
    initial: int
    delay_s: float
    min_replicas: int = 1
    max_replicas: int = 1
    scale_up_at: float = math.inf
    scale_down_at: float = 0.0
    window_s: float = 60.0
    windows: int = 1
    cooldown_s: float = 0.0
    planned: tuple[tuple[float, int], ...] = ()
    decisions: list[tuple[float, int]] = field(default_factory=list)
    signals: dict[str, FloatArray] = field(default_factory=dict)


@dataclass
class EngineResult:
    """Per-request outcome (arrays of length n; NaN / −1 where it does not apply).

    Times are seconds from the start of the replay. ``arrival_s`` is the arrival as replayed
    (closed-loop and offline modes change it). ``cache_hit_tokens`` are the prefix-cache hits at
    the request's first scheduling; ``prefill_tokens`` counts every prompt token actually
    computed, recomputation after preemption included.
    """

    arrival_s: FloatArray
    replica: npt.NDArray[np.int32]
    scheduled_s: FloatArray
    first_token_s: FloatArray
    finish_s: FloatArray
    max_itl_s: FloatArray
    preemptions: npt.NDArray[np.int32]
    cache_hit_tokens: IntArray
    prefill_tokens: IntArray
    reject_reason: npt.NDArray[np.int8]

    @classmethod
    def empty(cls, n: int) -> EngineResult:
        nan = np.full(n, np.nan)
        return cls(
            arrival_s=nan.copy(),
            replica=np.full(n, -1, np.int32),
            scheduled_s=nan.copy(),
            first_token_s=nan.copy(),
            finish_s=nan.copy(),
            max_itl_s=nan.copy(),
            preemptions=np.zeros(n, np.int32),
            cache_hit_tokens=np.zeros(n, np.int64),
            prefill_tokens=np.zeros(n, np.int64),
            reject_reason=np.zeros(n, np.int8),
        )


def reject_reasons(work: Workload, cfg: SchedulerConfig) -> npt.NDArray[np.int8]:
    """Requests that can never run on a replica, with the reason code.

    vLLM refuses a request whose prompt plus requested output exceeds ``max_model_len``; and a
    request whose KV (prompt + output − 1 tokens: the last sampled token is never fed back)
    needs more blocks than the whole cache could never finish, so it is rejected rather than
    left to preempt itself forever.
    """
    total = work.prompt_tokens + work.output_tokens
    out = np.zeros(work.n, np.int8)
    # ceil((total - 1) / block_size) > num_gpu_blocks, for integers: no array of block counts
    out[total > cfg.num_gpu_blocks * cfg.block_size + 1] = REJECT_KV_CAPACITY
    out[total > cfg.max_model_len] = REJECT_MAX_MODEL_LEN
    return out


def affinity_replica(key: int, replicas: int) -> int:
    """Replica of an affinity key: the prefix hashes' 64-bit mix (pipeline.common.blockhash.mix64,
    splitmix64's finaliser) so that consecutive keys spread evenly, then modulo the replica count."""
    return int(mix64(np.array([key], np.uint64))[0] % np.uint64(replicas))


def is_stateful_router(router: str) -> bool:
    """Routers that read replica state (outstanding requests) at arrival time. The affinity
    routers fall back to least-outstanding for requests without a key."""
    return router != "round_robin"


def choose_replica(
    router: str, key: int, outstanding: list[int], rr_next: int, free_kv: list[int] | None = None
) -> int:
    """The replica for one arrival. ``outstanding[r]`` = requests routed to r and not finished
    at the arrival time; ties go to the lowest index. ``rr_next`` is the round-robin cursor.
    ``free_kv[r]`` (most_free_kv): r's free KV blocks at the arrival less the blocks the prompts
    of the requests routed to r and not yet admitted need, ⌈prompt / block_size⌉ each
    (docs/engine.md, "Routers")."""
    n = len(outstanding)
    if router == "round_robin":
        return rr_next % n
    if router == "most_free_kv":
        assert free_kv is not None and len(free_kv) == n
        return max(range(n), key=lambda r: (free_kv[r], -r))
    if router in ("session_affinity", "prefix_affinity") and key >= 0:
        return affinity_replica(key, n)
    best = 0
    for r in range(1, n):
        if outstanding[r] < outstanding[best]:
            best = r
    return best


def initial_arrivals(work: Workload, spec: FleetSpec) -> tuple[list[tuple[float, int, int]], int, int]:
    """The arrival events the reference engine starts from, as a heap of (time, sequence, request):
    a closed loop starts ``concurrency`` clients at t = 0, or client c at ``c * ramp_step_s`` with
    a ramp (each finish or rejection issues the client's next request ``think_s`` later; the
    request an event sends is chosen when it is popped: the next of the trace, so requests go
    out in the trace's order whatever order the clients come back in); offline sends every
    request at t = 0, open loop uses the trace's arrival times. Returns the heap, the next
    sequence number and the number of arrival events a closed loop has scheduled (at most one
    per request)."""
    n = work.n
    if spec.mode == "closed":
        k = min(spec.concurrency or 0, n)
        step = spec.ramp_step_s
        return [(c * step, c, c) for c in range(k)], k, k
    times = np.zeros(n) if spec.mode == "offline" else work.arrival_s
    events = [(float(t), i, i) for i, t in enumerate(times.tolist())]
    heapq.heapify(events)
    return events, n, n


def dummy_step_s(cost: StepCostFn) -> float:
    """Seconds of the dummy batch an idle data-parallel rank runs while its lockstep group steps
    (vLLM ``execute_dummy_batch``: a forward pass of one token, one sequence, one cached token)."""
    one = np.ones(1)
    zero = np.zeros(1)
    batch = StepBatch(zero, zero.copy(), zero.copy(), zero.copy(), one, one.copy())
    return float(cost(batch).time_s[0])


#: The step cost's ``describe`` key under which a stack calibration hands the timeline's terms to
#: the engines (pipeline.costmodel.stackcal.TIMELINE_KEY, the same text: that module sits below
#: this package and cannot import it; tests/test_timeline.py holds the two equal).
TIMELINE_KEY = "timeline"


def timeline_spec(spec: FleetSpec, cost: object) -> FleetSpec:
    """``spec`` with the timeline terms a calibrated step cost carries in place of the fleet's own
    (``cost.describe[TIMELINE_KEY]``, set by stackcal.apply: ``async_scheduling`` a bool,
    ``frontend_request_s`` and ``frontend_token_s`` seconds, only those the calibration changes):
    how ``calibrate --observed`` replays a candidate calibration through the one value it hands
    the engine (the cost). Both engines call it first, so they replay the same timeline."""
    describe = getattr(cost, "describe", None)
    terms = describe.get(TIMELINE_KEY) if isinstance(describe, dict) else None
    if not terms:
        return spec
    if "async_scheduling" in terms:
        spec = replace(spec, scheduler=replace(spec.scheduler, async_scheduling=bool(terms["async_scheduling"])))
    return replace(
        spec,
        frontend_request_s=float(terms.get("frontend_request_s", spec.frontend_request_s)),
        frontend_token_s=float(terms.get("frontend_token_s", spec.frontend_token_s)),
    )


def concurrent_streams(res: EngineResult) -> IntArray:
    """Per request, the streams open on its replica when its first token is sent: requests j of
    the same replica with ``first_j ≤ first_i ≤ finish_j`` (itself included); 0 for a request
    that produced no token. Integer counts from sorted keys, so every engine gets the same."""
    n = res.first_token_s.shape[0]
    out = np.zeros(n, np.int64)
    ok = (res.replica >= 0) & np.isfinite(res.first_token_s) & np.isfinite(res.finish_s)
    if not ok.any():
        return out
    rep = res.replica[ok].astype(np.int64)
    first = res.first_token_s[ok]
    finish = res.finish_s[ok]
    # times as ranks (exact: equal times get equal ranks), then one integer key per (replica, time)
    times, inv = np.unique(np.concatenate([first, finish]), return_inverse=True)
    m = int(times.shape[0]) + 1
    k = first.shape[0]
    base = rep * m
    key_first = base + inv[:k]
    key_finish = base + inv[k:]
    sf = np.sort(key_first)
    se = np.sort(key_finish)
    started = np.searchsorted(sf, key_first, side="right") - np.searchsorted(sf, base, side="left")
    ended = np.searchsorted(se, key_first, side="left") - np.searchsorted(se, base, side="left")
    out[ok] = started - ended
    return out


def apply_frontend(res: EngineResult, output_tokens: IntArray, spec: FleetSpec) -> None:
    """The API server's front end on the engines' results, in place (docs/engine.md, "The front
    end"). With R = ``frontend_request_s``, c = ``frontend_token_s`` and N the streams open on the
    request's replica at its first token (:func:`concurrent_streams`):

    - first token: + R + c·N (tokenize and HTTP, then the step's N streamed events before it);
    - time per output token: max(engine TPOT, c·N) (the front end streams one event per token
      per stream: it paces the stream when it is slower than the engine), so the finish moves
      by R + c·N + (output − 1)·max(0, c·N − TPOT), and the longest gap is at least c·N.

    Arrival and scheduling times are the engine's. Both engines call it last, with the same
    arrays, so they agree by construction; with R = c = 0 nothing changes."""
    add_frontend(res, output_tokens, spec.frontend_request_s, spec.frontend_token_s)


def add_frontend(res: EngineResult, output_tokens: IntArray, R: float, c: float) -> None:
    """:func:`apply_frontend` with the front end's terms given: R seconds per request, c seconds
    per output token per concurrent stream (``calibrate --observed`` solves them per candidate)."""
    if R == 0.0 and c == 0.0:
        return
    done = np.isfinite(res.first_token_s) & (res.replica >= 0)
    lag = np.zeros(res.first_token_s.shape[0])
    if c != 0.0:
        lag = c * concurrent_streams(res).astype(np.float64)
    more = done & np.isfinite(res.finish_s) & (output_tokens > 1)
    extra = np.zeros_like(lag)
    if more.any():
        tpot = (res.finish_s[more] - res.first_token_s[more]) / (output_tokens[more] - 1)
        extra[more] = (output_tokens[more] - 1) * np.maximum(0.0, lag[more] - tpot)
        itl = res.max_itl_s[more]
        res.max_itl_s[more] = np.where(np.isnan(itl), itl, np.maximum(itl, lag[more]))
    shift = R + lag
    res.first_token_s[done] += shift[done]
    fin = done & np.isfinite(res.finish_s)
    res.finish_s[fin] += shift[fin] + extra[fin]
