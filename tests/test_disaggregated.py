"""Disaggregated prefill/decode pools (pipeline/replay/pools.py roles ``prefill`` and ``decode``,
pipeline/replay/run.py's pooled replay): a 1P1D request computed by hand from the cost model's
step times, the compiled engine == the reference engine pool by pool on generated traces (with
preemption and a decode pool out of KV), every request kept across the seam, the replay of a
day on fleets/disagg-1p1d.toml, and the fleet file's one-line refusals."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import cast

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine_support import LinearCost, workload

from pipeline.common.errors import ConfigError
from pipeline.costmodel.steps import StepBatch
from pipeline.engine.jit import simulate_jit
from pipeline.engine.model import (
    REJECT_KV_CAPACITY,
    EngineResult,
    FleetSpec,
    SchedulerConfig,
    Speculation,
    Workload,
    tokens_per_verification,
)
from pipeline.engine.reference import simulate_reference
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.replay.fleet import resolve
from pipeline.replay.pools import (
    SPLIT_COLUMNS,
    Link,
    PooledFleet,
    hand_off,
    join_disaggregated,
    load_fleet_file,
    merge_handoffs,
    take_result,
)
from pipeline.replay.run import ReplayOptions, replay, run_workload

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "sample" / "gateway_demo_2025-01-15.jsonl.gz"
ONE_P_ONE_D = ROOT / "fleets" / "disagg-1p1d.toml"


def _one(x: float) -> np.ndarray:
    return np.array([float(x)])


def _step(cost: object, prefill: int = 0, offset: int = 0, decode_ctx: int = 0) -> float:
    """One step's seconds from the cost model: one prefill chunk of ``prefill`` tokens at context
    ``offset``, or one decode at context ``decode_ctx`` (tokens in the KV cache, the new one
    included)."""
    c = prefill
    batch = StepBatch(
        _one(c),
        _one(1 if c else 0),
        _one(c * offset + c * (c + 1) / 2),
        _one(offset + c if c else 0),
        _one(1 if decode_ctx else 0),
        _one(decode_ctx),
    )
    return float(cost(batch).time_s[0])  # type: ignore[operator]


# -- one request by hand ------------------------------------------------------------------------


def test_one_request_1p1d_ttft_is_prefill_plus_transfer_plus_first_decode_step_by_hand() -> None:
    """fleets/disagg-1p1d.toml, one request of 2,000 prompt tokens and 5 output tokens arriving at
    t = 0 on an idle fleet: TTFT = the prefill step (2,000 tokens) + 50 µs + 2,000 × the decode
    pool's KV bytes per token / 50 GB/s + the decode pool's first step (the last prompt token, one
    token at context 2,000 with itself: costed as a decode, docs/engine.md); E2E adds four decode
    steps at contexts 2,001..2,004."""
    pooled = load_fleet_file(ONE_P_ONE_D)
    assert isinstance(pooled, PooledFleet)
    pre, dec = (resolve(p.config) for p in pooled.pools)
    P, O = 2000, 5  # noqa: E741 (prompt and output, as the docstring names them)
    work = Workload(arrival_s=np.zeros(1), prompt_tokens=np.array([P]), output_tokens=np.array([O]))
    first = run_workload(
        Workload(arrival_s=np.zeros(1), prompt_tokens=np.array([P]), output_tokens=np.ones(1, np.int64)),
        pre,
        ReplayOptions(),
    )
    link = pooled.pools[0].link
    assert link is not None and (link.kind, link.bandwidth_gb_s, link.latency_us) == ("rdma", 50.0, 50.0)
    moved = hand_off(
        first.work, first.result, dec.memory.kv_bytes_per_token, link.link(), output_tokens=work.output_tokens
    )
    second = run_workload(moved.work, dec, ReplayOptions())
    joined = join_disaggregated(first.result, moved, second.result)

    # llama-3.1-8b bf16 at tp 1: 32 layers × 8 KV heads × 128 × 2 (K and V) × 2 bytes = 131,072 B/token
    assert dec.memory.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2 == 131072
    prefill = _step(pre.cost_model, prefill=P)
    transfer = 50e-6 + P * 131072 / 50e9
    first_step = _step(dec.cost_model, decode_ctx=P)
    decodes = sum(_step(dec.cost_model, decode_ctx=P + k) for k in range(1, O))
    res = joined.result
    assert res.first_token_s[0] == pytest.approx(prefill + transfer + first_step, rel=1e-9)
    assert res.finish_s[0] == pytest.approx(prefill + transfer + first_step + decodes, rel=1e-9)
    split = {k: float(v[0]) for k, v in joined.split.items()}
    assert split["prefill_s"] == pytest.approx(prefill, rel=1e-9)
    assert split["transfer_s"] == pytest.approx(transfer, rel=1e-12)
    assert split["decode_queue_s"] == 0.0
    assert split["first_decode_step_s"] == pytest.approx(first_step, rel=1e-9)
    assert res.prefill_tokens[0] == P + 1  # the whole prompt at the prefill pool, its last token again at decode
    assert joined.kv_bytes[0] == P * 131072


def test_a_layerwise_link_exposes_the_last_layers_share_or_what_the_prefill_cannot_hide() -> None:
    """Layer-wise over L layers: exposed = latency + max(T / L, T − P · (L − 1) / L)."""
    link = Link(bytes_per_s=1e9, latency_s=1e-5, layerwise=True)
    nbytes = np.array([1e8, 1e8])  # T = 0.1 s each
    prefill = np.array([0.5, 0.05])  # a long prefill hides all but the last layer; a short one does not
    got = link.exposed(nbytes, prefill, 10)
    np.testing.assert_allclose(got, [1e-5 + 0.01, 1e-5 + (0.1 - 0.05 * 0.9)], rtol=0, atol=1e-15)
    plain = Link(bytes_per_s=1e9, latency_s=1e-5)
    np.testing.assert_allclose(plain.exposed(nbytes, prefill, 10), [0.10001, 0.10001], rtol=0, atol=1e-15)


# -- engine == oracle, pool by pool -------------------------------------------------------------


def _spec(blocks: int, seqs: int, budget: int, replicas: int, router: str) -> FleetSpec:
    cfg = SchedulerConfig(
        num_gpu_blocks=blocks,
        max_model_len=400,
        max_num_seqs=seqs,
        max_num_batched_tokens=max(budget, seqs),
        block_size=4,
        enable_prefix_caching=True,
    )
    return FleetSpec(replicas=replicas, scheduler=cfg, router=router)


def _same(fast: EngineResult, ref: EngineResult) -> None:
    for name in ("first_token_s", "finish_s", "arrival_s", "scheduled_s", "max_itl_s"):
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=1e-9, atol=1e-12, err_msg=name)
    for name in ("replica", "preemptions", "cache_hit_tokens", "prefill_tokens", "reject_reason"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=name)


def _disaggregate(
    work: Workload, pre: FleetSpec, dec: FleetSpec, link: Link, bpt: float
) -> tuple[EngineResult, EngineResult, object]:
    """Both pools with both engines, each pool's results held equal; the reference's join."""
    cost = LinearCost()
    first = Workload(arrival_s=work.arrival_s, prompt_tokens=work.prompt_tokens,
                     output_tokens=np.ones(work.n, np.int64))  # fmt: skip
    ref_p = simulate_reference(first, pre, cost)
    _same(simulate_jit(first, pre, cost), ref_p)
    moved = hand_off(first, ref_p, bpt, link, output_tokens=work.output_tokens)
    ref_d = simulate_reference(moved.work, dec, cost)
    _same(simulate_jit(moved.work, dec, cost), ref_d)
    return ref_p, ref_d, join_disaggregated(ref_p, moved, ref_d)


def _check_seam(work: Workload, ref_p: EngineResult, joined: object) -> None:
    """No request lost across the seam; each one's TTFT is its split, term by term."""
    from pipeline.replay.pools import Disaggregated

    assert isinstance(joined, Disaggregated)
    res = joined.result
    n = work.n
    assert res.reject_reason.shape == (n,)
    at = joined.rejected_at
    served = at == 0
    # every row is served (first and last token out) or rejected at exactly one pool
    assert np.isfinite(res.first_token_s[served]).all() and np.isfinite(res.finish_s[served]).all()
    assert (res.reject_reason[~served] != 0).all() and (res.reject_reason[served] == 0).all()
    assert ((at == 1) == (ref_p.reject_reason != 0)).all()
    handed = np.isfinite(joined.kv_bytes)
    assert (handed == (at != 1)).all()  # everything the prefill pool served crossed the link
    ttft = res.first_token_s - res.arrival_s
    queue = res.scheduled_s - res.arrival_s
    parts = queue + sum(joined.split[c] for c in SPLIT_COLUMNS)
    np.testing.assert_allclose(parts[served], ttft[served], rtol=1e-9, atol=1e-12)
    assert (joined.split["transfer_s"][served] > 0).all()
    assert (res.finish_s[served] >= res.first_token_s[served]).all()


@st.composite
def _traces(draw: st.DrawFn) -> tuple[Workload, FleetSpec, FleetSpec, Link]:
    n = draw(st.integers(1, 30))
    gaps = draw(st.lists(st.floats(0.0, 0.3, allow_nan=False), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 150), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 80), min_size=n, max_size=n))
    work = workload(np.cumsum(gaps), prompt, output)
    pre = _spec(draw(st.integers(2, 80)), draw(st.integers(1, 6)), draw(st.integers(8, 96)), draw(st.integers(1, 3)),
                draw(st.sampled_from(["round_robin", "least_outstanding"])))  # fmt: skip
    # a small decode pool: preemptions, and requests its KV can never hold (exceeds_kv_capacity);
    # routed by outstanding requests or by free KV, and speculating or not (its drafts hold KV too)
    dec = _spec(draw(st.integers(2, 60)), draw(st.integers(1, 8)), draw(st.integers(8, 64)), draw(st.integers(1, 3)),
                draw(st.sampled_from(["least_outstanding", "most_free_kv"])))  # fmt: skip
    if draw(st.booleans()):
        k = draw(st.integers(1, 5))
        e = tokens_per_verification(draw(st.floats(0.0, 1.0)), k)
        passes = tuple(draw(st.lists(st.floats(0.0, 2e-3), min_size=dec.scheduler.max_num_seqs + 1,
                                     max_size=dec.scheduler.max_num_seqs + 1)))  # fmt: skip
        dec = replace(dec, speculation=Speculation(k, e, passes, draw(st.floats(0.0, 1e-6))))
    link = Link(draw(st.floats(1e3, 1e6)), draw(st.floats(0.0, 0.01)), draw(st.booleans()))
    return work, pre, dec, link


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_traces())
def test_each_pool_of_a_disaggregated_fleet_replays_as_the_reference_engine_does(
    case: tuple[Workload, FleetSpec, FleetSpec, Link],
) -> None:
    work, pre, dec, link = case
    ref_p, _, joined = _disaggregate(work, pre, dec, link, bpt=64.0)
    _check_seam(work, ref_p, joined)


def test_a_speculating_decode_pool_by_hand_ttft_unchanged_and_tokens_by_the_accumulator() -> None:
    """1P1D, one request (prompt 10, output 16) at t = 1; the decode pool speculates (k = 3, each draft
    accepted with a = 0.5: E = 1.875) and routes by free KV. TTFT = the prefill step + the transfer
    + the decode pool's first step, which admits the request (the last prompt token, a decode at
    context 10: no drafts in an admission step), exactly as without speculation. The 15 tokens
    after it come from verifications as in test_engine.py's by-hand case: the accumulator reaches
    1.875, 3.75, ..., 15, so 8 verifications of 1, 2, 2, 2, 2, 2, 2, 2 tokens, each priced as a
    chunk of 1 + k' tokens plus k' draft passes (k' = 3, the last 1). The prompt's KV crosses with
    the drafter's: 10 × (1,000 + 100) bytes at 1 MB/s after 1 ms."""
    cost = LinearCost(a=0.01, b=0.001, c=0.0, d=0.002, e=0.0001)
    sd = Speculation(3, tokens_per_verification(0.5, 3), (0.0, 0.0005, 0.0007), 1e-6)
    pre = _spec(200, 4, 256, 1, "round_robin")
    dec = replace(_spec(200, 4, 256, 2, "most_free_kv"), speculation=sd)
    work = workload([1.0], [10], [16])
    first = Workload(arrival_s=work.arrival_s, prompt_tokens=work.prompt_tokens, output_tokens=np.ones(1, np.int64))
    link = Link(1e6, 1e-3)
    for sim in (simulate_jit, simulate_reference):
        got_p = sim(first, pre, cost)
        moved = hand_off(first, got_p, 1000.0 + 100.0, link, output_tokens=work.output_tokens)
        got_d = sim(moved.work, dec, cost)
        joined = join_disaggregated(got_p, moved, got_d)
        res = joined.result
        prefill = 0.01 + 0.001 * 10
        transfer = 1e-3 + 10 * 1100 / 1e6
        first_step = 0.01 + 0.002 + 0.0001 * 10
        computed = [10, 11, 13, 15, 17, 19, 21, 23]  # before each verification
        drafts = [3, 3, 3, 3, 3, 3, 3, 1]
        steps = [0.01 + 0.001 * (1 + k) + k * (0.0005 + 1e-6 * (c + 1)) for c, k in zip(computed, drafts, strict=True)]
        assert res.first_token_s[0] == pytest.approx(1.0 + prefill + transfer + first_step, rel=1e-12)
        assert res.finish_s[0] == pytest.approx(1.0 + prefill + transfer + first_step + sum(steps), rel=1e-12)
        assert joined.split["first_decode_step_s"][0] == pytest.approx(first_step, rel=1e-12)
        assert joined.split["transfer_s"][0] == pytest.approx(transfer, rel=1e-12)
        assert joined.kv_bytes[0] == 11000.0
        assert joined.decode_replica.tolist() == [0] and res.prefill_tokens[0] == 10 + 1
        # without speculation the decode pool takes 15 decode steps for the same tokens
        plain = sim(moved.work, replace(dec, speculation=None), cost)
        decodes = [0.01 + 0.002 + 0.0001 * (c + 1) for c in range(10, 25)]
        assert plain.first_token_s[0] == got_d.first_token_s[0]
        assert plain.finish_s[0] == pytest.approx(got_d.first_token_s[0] + sum(decodes), rel=1e-12)


@pytest.mark.parametrize("speculation", [None, Speculation(3, 2.5, (), 0.0)], ids=["plain", "speculating"])
def test_a_full_decode_pool_preempts_and_rejects_what_its_kv_cannot_hold(speculation: Speculation | None) -> None:
    """The decode pool has 30 blocks of 4 tokens: two 40-token prompts decoding 30 tokens each do not
    fit together (one is preempted and recomputed from its moved KV's last token), and a 150-token
    prompt with 20 output tokens never fits (rejected at decode, exceeds_kv_capacity), though the
    prefill pool served it. The same with the decode pool speculating (k = 3: its draft slots hold
    KV too), both engines equal."""
    work = workload([0.0, 0.0, 0.01], [40, 40, 150], [30, 30, 20])
    pre = _spec(200, 4, 256, 1, "round_robin")
    dec = replace(_spec(30, 4, 64, 1, "least_outstanding"), speculation=speculation)
    ref_p, ref_d, joined = _disaggregate(work, pre, dec, Link(1e6, 1e-4), bpt=100.0)
    _check_seam(work, ref_p, joined)
    from pipeline.replay.pools import Disaggregated

    assert isinstance(joined, Disaggregated)
    assert (ref_p.reject_reason == 0).all()
    assert joined.rejected_at.tolist() == [0, 0, 2]
    assert joined.result.reject_reason[2] == REJECT_KV_CAPACITY
    assert int(ref_d.preemptions.sum()) >= 1 and int(joined.result.preemptions.sum()) >= 1
    np.testing.assert_allclose(joined.kv_bytes, [4000.0, 4000.0, 15000.0])


def test_merged_hand_offs_of_two_prefill_pools_keep_every_request_in_arrival_order() -> None:
    a = workload([0.0, 0.1], [10, 20], [3, 4])
    b = workload([0.05], [30], [5])
    res_a, res_b = EngineResult.empty(2), EngineResult.empty(1)
    res_a.first_token_s[:], res_a.scheduled_s[:] = [0.2, 0.4], [0.0, 0.1]
    res_b.first_token_s[:], res_b.scheduled_s[:] = [0.3], [0.05]
    link = Link(1e3, 0.0)  # 1 byte per token: 0.01, 0.02, 0.03 s on the link
    ma, mb = hand_off(a, res_a, 1.0, link), hand_off(b, res_b, 1.0, link)
    merged, (pa_, pb_) = merge_handoffs([ma, mb])
    np.testing.assert_allclose(merged.arrival_s, [0.21, 0.33, 0.42])
    assert pa_.tolist() == [0, 2] and pb_.tolist() == [1]
    assert merged.output_tokens.tolist() == [3, 5, 4]  # the whole output: the decode pool samples every token
    back = take_result(EngineResult(**{k: v for k, v in vars(res_a).items()}), np.array([1, 0]))
    assert back.first_token_s.tolist() == [0.4, 0.2]


# -- the fleet file -----------------------------------------------------------------------------

HEAD = """
name = "d"
model = "llama-3.1-8b"
hardware = "h100-sxm"
[link]
kind = "rdma"
"""


#: A [pool.speculative] table: method, k.
SPEC = '[pool.speculative]\nmethod = "{}"\nnum_speculative_tokens = {}'


def _p(name: str, role: str, extra: str = "") -> str:
    return f'\n[[pool]]\nname = "{name}"\nrole = "{role}"\n{extra}\n'


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (HEAD + _p("p", "prefill"), r"prefill pool\(s\) \['p'\] but no decode pool"),
        (HEAD + _p("u", "unified") + _p("d", "decode"), r"decode pool\(s\) \['d'\] but no prefill pool"),
        (HEAD + _p("p", "prefill") + _p("d", "decoder"), r"'d': role 'decoder' unknown; choose one of"),
        (HEAD.replace('kind = "rdma"', 'kind = "rdma"\nbandwidth_gb_s = 0.0') + _p("p", "prefill") + _p("d", "decode"),
         r"\[link\]: bandwidth_gb_s must be a number of GB/s in \(0, 100,000\], got 0.0"),
        (HEAD.replace('kind = "rdma"', 'kind = "rdma"\nbandwidth_gb_s = nan') + _p("p", "prefill") + _p("d", "decode"),
         r"bandwidth_gb_s must be .* got nan"),
        (HEAD.replace('kind = "rdma"', 'kind = "rdma"\nbandwidth_gb_s = 1e300') + _p("p", "prefill")
         + _p("d", "decode"), r"bandwidth_gb_s must be .* got 1e\+300"),
        (HEAD + _p("p", "prefill", '[pool.link]\nkind = "nvlink"\nlatency_us = -1.0') + _p("d", "decode"),
         r"'p' \[pool.link\]: latency_us must be a number of µs in \[0, 1,000,000\], got -1.0"),
        (HEAD + _p("p", "prefill", '[pool.link]\nkind = "smoke-signals"') + _p("d", "decode"), r"kind"),
        (HEAD + _p("p", "prefill", '[pool.link]\nkind = "rdma"\nbandwidth_gb_s = "fast"') + _p("d", "decode"),
         r"bandwidth_gb_s must be a number"),
        (HEAD + _p("p", "prefill", '[pool.handoff]\nto = "u"\n[pool.match]\ntenant = ["a"]') + _p("u", "unified")
         + _p("d", "decode"), r"'p' \[pool.handoff\]: to 'u' is a unified pool; a prefill pool hands to a decode"),
        (HEAD + _p("p", "prefill", '[pool.handoff]\nto = "nowhere"') + _p("d", "decode"),
         r"to 'nowhere' names no pool"),
        (HEAD + _p("p", "prefill") + _p("d1", "decode") + _p("d2", "decode"),
         r"'p': the fleet has decode pools \['d1', 'd2'\]: say which in \[pool.handoff\] to"),
        (HEAD + _p("p", "prefill", '[pool.handoff]\nto = "d1"') + _p("d1", "decode") + _p("d2", "decode"),
         r"decode pool\(s\) \['d2'\] get no requests"),
        (HEAD + _p("p", "prefill") + _p("d", "decode", "[pool.match]\nmin_input_tokens = 5"),
         r"'d': a decode pool takes only the requests prefill pools hand it"),
        (HEAD + _p("u", "unified", '[pool.link]\nkind = "rdma"'), r"'u': \['link'\] belong to a prefill pool"),
        (HEAD.replace('[link]\nkind = "rdma"\n', "") + _p("p", "prefill") + _p("d", "decode"),
         r"'p': a prefill pool needs a link to its decode pool"),
        (HEAD + _p("d", "decode"), r"every pool is a decode pool"),
        (HEAD + _p("u", "unified"), r"\[link\]: a link joins prefill pools to decode pools; this fleet has none"),
        (HEAD + _p("p", "prefill", SPEC.format("eagle3", 3)) + _p("d", "decode"),
         r"'p' \[pool.speculative\]: a prefill pool samples one token a request"),
        (HEAD + _p("p", "prefill") + _p("d", "decode", SPEC.format("eagle3", 0)),
         r"'d' \[speculative\]: num_speculative_tokens must be in 1..16, got 0"),
        (HEAD + _p("p", "prefill") + _p("d", "decode", SPEC.format("eagle3", 3) + "\nacceptance = nan"),
         r"'d' \[speculative\]: acceptance must be a probability"),
        (HEAD + _p("p", "prefill") + _p("d", "decode", SPEC.format("medusa", 3)), r"'d'.*method"),
        (HEAD + SPEC.format("eagle3", '"3"').replace("[pool.", "[") + "\n" + _p("p", "prefill") + _p("d", "decode"),
         r"\[speculative\]: num_speculative_tokens must be an integer"),
        (HEAD + _p("p", "prefill") + _p("d", "decode", 'router = "most_free_kv_please"'), r"'d'.*router"),
    ],
)  # fmt: skip
def test_bad_disaggregated_fleet_files_are_one_line_errors(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says) as info:
        load_fleet_file(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_speculation_runs_on_the_pools_that_decode_and_the_prefill_pool_loads_a_model_drafter(
    tmp_path: Path,
) -> None:
    """The fleet's [speculative] is the decode pool's (and a unified pool's); the prefill pool takes
    none of its own but loads the decode pool's EAGLE-3 head, whose weights and KV its memory fit
    counts (26,721 blocks on an H100 against 27,795 without: test_speculative.py's figures), and
    whose KV crosses the link with the prompt's. An n-gram drafter stays on the decode side. A
    pool's own [pool.speculative] replaces the fleet's. The decode router by free KV is accepted."""
    text = ONE_P_ONE_D.read_text().replace(
        'router = "least_outstanding"\n',
        'router = "least_outstanding"\n[speculative]\nmethod = "eagle3"\nnum_speculative_tokens = 3\n',
    )
    path = tmp_path / "spec.toml"
    path.write_text(text)
    pooled = load_fleet_file(path)
    assert isinstance(pooled, PooledFleet)
    pre, dec = (resolve(p.config) for p in pooled.pools)
    plain_pre, plain_dec = (resolve(p.config) for p in cast(PooledFleet, load_fleet_file(ONE_P_ONE_D)).pools)
    assert dec.speculation is not None and (dec.speculation.k, dec.speculation.mean_accepted) == (3, 2.79)
    assert pre.config.speculative == dec.config.speculative
    assert (plain_pre.memory.kv_capacity_blocks, pre.memory.kv_capacity_blocks) == (27795, 26721)
    assert pre.memory.draft_kv_bytes_per_token == dec.memory.draft_kv_bytes_per_token == 131072 / 32
    assert dec.memory.kv_capacity_blocks < plain_dec.memory.kv_capacity_blocks
    # n-gram drafting on the decode pool alone; a pool's own table wins over the fleet's
    ngram = '[pool.speculative]\nmethod = "ngram"\nnum_speculative_tokens = 5\n'
    path.write_text(text.replace('[pool.engine]\nmax_num_seqs = 512', 'router = "most_free_kv"\n' + ngram
                                 + '[pool.engine]\nmax_num_seqs = 512'))  # fmt: skip
    pooled = cast(PooledFleet, load_fleet_file(path))
    pre, dec = (resolve(p.config) for p in pooled.pools)
    assert pre.config.speculative is None and pre.memory.kv_capacity_blocks == 27795
    assert dec.config.speculative is not None and dec.config.speculative.method == "ngram"
    assert dec.config.router == "most_free_kv" and dec.spec().router == "most_free_kv"
    assert dec.memory.kv_capacity_blocks == plain_dec.memory.kv_capacity_blocks


def test_the_example_fleets_parse_with_their_hand_offs_and_links() -> None:
    one = load_fleet_file(ONE_P_ONE_D)
    many = load_fleet_file(ROOT / "fleets" / "disagg-xpyd.toml")
    assert isinstance(one, PooledFleet) and isinstance(many, PooledFleet)
    assert [(p.role, p.handoff) for p in one.pools] == [("prefill", "decode"), ("decode", None)]
    assert [(p.name, p.role, p.handoff) for p in many.pools] == [
        ("prefill-long", "prefill", "decode-long"),
        ("prefill-short", "prefill", "decode-short"),
        ("decode-long", "decode", None),
        ("decode-short", "decode", None),
    ]
    link = many.pools[0].link
    assert link is not None and (link.kind, link.bandwidth_gb_s, link.latency_us, link.layerwise) == (
        "nvlink", 450.0, 30.0, True
    )  # fmt: skip
    frame = pl.DataFrame({"recorded_input_tokens": [10, 5000, 4096]})
    assert many.assign(frame).tolist() == [1, 0, 0]  # decode pools take nothing by rule


# -- a day on fleets/disagg-1p1d.toml -----------------------------------------------------------


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Store:
    store = Store(tmp_path_factory.mktemp("disagg") / "store")
    ingest_logs([SAMPLE], store)
    return store


def test_a_day_on_a_1p1d_fleet_keeps_every_request_in_one_row_with_its_ttft_split(day: Store, tmp_path: Path) -> None:
    shutil.copytree(day.root, tmp_path / "store")
    store = Store(tmp_path / "store")
    run = replay(store, ONE_P_ONE_D)
    got = pl.from_arrow(pq.read_table(run.run_dir / "requests.parquet"))
    assert isinstance(got, pl.DataFrame)
    assert got.height == 3000 and got.get_column("request_id").is_unique().all()  # rows in = rows out
    assert set(got.get_column("pool").to_list()) == {"prefill"}
    served = got.filter(pl.col("status") == "finished")
    assert set(served.get_column("decode_pool").to_list()) == {"decode"}
    assert set(served.get_column("replica").to_list()) == {0} and set(
        served.get_column("decode_replica").to_list()
    ) == {1}
    total = served.select(pl.sum_horizontal("queue_s", *SPLIT_COLUMNS)).to_series().to_numpy()
    np.testing.assert_allclose(total, served.get_column("ttft_s").to_numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(
        served.get_column("kv_transfer_bytes").to_numpy(),
        np.maximum(served.get_column("recorded_input_tokens").to_numpy(), 1) * 131072.0,
    )
    d = run.summary["disaggregation"]
    rejected = got.filter(pl.col("status") == "rejected")
    never = rejected.filter(pl.col("decode_pool").is_null()).height
    assert sum(d["rejected_at_prefill"].values()) == never
    assert sum(d["rejected_at_decode"].values()) == rejected.height - never
    assert d["handed_off"] == got.height - never == run.summary["pools"]["decode"]["requests"]
    assert d["served"] == served.height == run.summary["finished"]
    assert d["ttft_split"]["ttft_s"]["mean"] == pytest.approx(served.get_column("ttft_s").mean(), rel=1e-12)
    assert run.summary["pools"]["prefill"]["requests"] == 3000
    steps = pl.from_arrow(pq.read_table(run.run_dir / "steps.parquet"))
    assert isinstance(steps, pl.DataFrame) and set(steps.get_column("pool").to_list()) == {"prefill", "decode"}
    config = json.loads((run.run_dir / "config.json").read_text())
    assert [(p["pool"], p["role"]) for p in config["resolved"]["pools"]] == [
        ("prefill", "prefill"),
        ("decode", "decode"),
    ]
    assert config["resolved"]["fleet"]["pools"][0]["link"]["kind"] == "rdma"
    before = {p.name: p.read_bytes() for p in run.run_dir.iterdir()}
    again = replay(store, ONE_P_ONE_D)  # the same run, the same bytes
    assert again.run_id == run.run_id
    assert {p.name: p.read_bytes() for p in again.run_dir.iterdir()} == before


def test_the_load_curve_of_a_disaggregated_fleet_counts_each_request_once_over_both_pools(day: Store) -> None:
    """Headroom on fleets/disagg-1p1d.toml: at 1× a point counts the replay's requests, finished and
    rejected (each once, though two pools served it), and its p99 TTFT and TPOT are the run's."""
    from pipeline.classify.accounting import day_identity
    from pipeline.replay.loadcurve import curve_point

    run = replay(day, ONE_P_ONE_D)
    pooled = load_fleet_file(ONE_P_ONE_D)
    assert isinstance(pooled, PooledFleet)
    requests = day.read_requests("2025-01-15")
    point = curve_point(requests, pooled, 1.0, None, day_identity(day, "2025-01-15", requests))
    assert (point["requests"], point["finished"], point["rejected"]) == (
        run.summary["requests"],
        run.summary["finished"],
        run.summary["rejected"],
    )
    assert point["ttft_p99_s"] == pytest.approx(run.summary["ttft_s"]["p99"], rel=1e-9)
    assert point["tpot_p99_s"] == pytest.approx(run.summary["tpot_s"]["p99"], rel=1e-9)


def test_a_day_on_a_1p1d_fleet_speculating_on_its_decode_pool(day: Store, tmp_path: Path) -> None:
    """fleets/disagg-1p1d.toml with the fleet's [speculative] (EAGLE-3, k = 3): every request keeps
    one row, the KV moved per prompt token is the target's and the drafter's (131,072 + 4,096
    bytes), the decode pool's line in ``replay`` says what it speculated and the prefill pool's the
    drafter it loads, and the decode pool's TPOT falls against the same day without speculation."""
    from pipeline.replay.run import pool_lines

    shutil.copytree(day.root, tmp_path / "store")
    store = Store(tmp_path / "store")
    path = tmp_path / "spec.toml"
    path.write_text(
        ONE_P_ONE_D.read_text().replace(
            'router = "least_outstanding"\n',
            'router = "least_outstanding"\n[speculative]\nmethod = "eagle3"\nnum_speculative_tokens = 3\n',
        )
    )
    run = replay(store, path)
    got = pl.from_arrow(pq.read_table(run.run_dir / "requests.parquet"))
    assert isinstance(got, pl.DataFrame)
    assert got.height == 3000 and got.get_column("request_id").is_unique().all()  # rows in = rows out
    served = got.filter(pl.col("status") == "finished")
    np.testing.assert_allclose(
        served.get_column("kv_transfer_bytes").to_numpy(),
        np.maximum(served.get_column("recorded_input_tokens").to_numpy(), 1) * (131072.0 + 4096.0),
    )
    pools = run.summary["pools"]
    assert pools["prefill"]["drafter"] == {"method": "eagle3", "of": "decode"} and "speculative" not in pools["prefill"]
    sd = pools["decode"]["speculative"]
    assert (sd["method"], sd["num_speculative_tokens"], sd["mean_accepted_tokens"]) == ("eagle3", 3, 2.79)
    assert 1.0 < sd["tokens_per_decode_step"] <= 2.79
    assert "speculative" not in run.summary  # each pool says its own
    lines = pool_lines(run.summary)
    assert "loads decode's eagle3 drafter" in lines[0]
    assert "speculative eagle3 k = 3, 2.79 accepted tokens per verification" in lines[1]
    plain = replay(store, ONE_P_ONE_D)
    assert run.summary["tpot_s"]["mean"] < 0.6 * plain.summary["tpot_s"]["mean"]
    assert run.summary["finished"] == plain.summary["finished"]


def test_the_free_kv_router_is_a_fleet_key_the_schema_accepts_and_a_misspelling_is_refused() -> None:
    from pipeline.replay.fleet import parse_fleet

    base = {"name": "r", "model": "llama-3.1-8b", "hardware": "h200", "replicas": 2}
    assert parse_fleet({**base, "router": "most_free_kv"}, "fleets/r.toml").router == "most_free_kv"
    with pytest.raises(ConfigError) as info:
        parse_fleet({**base, "router": "most_free"}, "fleets/r.toml")
    text = str(info.value)
    assert text.startswith("fleets/r.toml") and "router" in text and "most_free_kv" in text and "\n" not in text
