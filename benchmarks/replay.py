"""Replay engine speed: requests per wall-second, peak RSS, and the speed-up over the reference.

Workload: Azure-conversation-like lengths (prompt and output tokens resampled from the bundled
Azure 2023 conversation trace when it is present, else lognormals with its mean and median),
Poisson arrivals, a 16-replica fleet of Llama-3.1-8B on H100 (KV capacity from memory.fit).

    python benchmarks/replay.py                                      # 1,000,000 requests, jit
    python benchmarks/replay.py --cost measured                      # H100's measured profile
    python benchmarks/replay.py --cost measured --model qwen3-30b-a3b  # a MoE fleet, measured
    python benchmarks/replay.py --cost measured --model qwen3-30b-a3b --replicas 8 --dp 2 --ep 2
                                                        # dp 2 x ep 2 ranks in lockstep
    python benchmarks/replay.py --requests 20000 --cost roofline     # with the roofline model
    python benchmarks/replay.py --reference 2000                     # engine vs reference
    python benchmarks/replay.py --disagg 6:10                        # 6 prefill + 10 decode replicas
                                                        # (KV over 50 GB/s RDMA, 50 us per transfer)
    python benchmarks/replay.py --speculative eagle3:3               # speculation off, then on
    python benchmarks/replay.py --offload 200                        # agent sessions, cpu KV tier off, then on
    python benchmarks/replay.py --offload 200 --offload-shared 8000  # the same, a pool's store below the cpu tier
    python benchmarks/replay.py --autoscale schedule                 # static, then autoscaled (schedule or kv)

The engine is pipeline/engine/jit.py, the one the replay stage uses (``--reference N`` times the
per-step reference, the tests' oracle, on N requests). ``linear`` is the affine stand-in cost of
the tests, so the figure measures the engine; ``roofline`` adds the catalog's roofline and
``measured`` the GPU's measured profile (pipeline/costmodel/profile/cost.py) — both tabulated step costs
(pipeline/costmodel/stepcost.py) the jit engine evaluates inside its loop, dense or MoE alike.
The jit engine's numba compilation is cached on disk; a warm-up call on 10 requests loads it
before timing (its wall time is printed too). ``--disagg P:D`` times the disaggregated mode
instead (docs/pools.md, "Disaggregated prefill/decode"): P prefill replicas replay every request
with one output token, pipeline.replay.pools.hand_off moves them over the link, D decode
replicas decode them, and join_disaggregated makes one row per request; the rate counts the
requests over the wall time of all four. ``--offload GB`` times the KV offload tier instead
(FLEET.toml ``[kv_offload]``, docs/accounting.md "KV offload tiers") on agent-session traffic
(sessions of 1–6 turns minutes apart, each turn re-sending its session's context, every request
keyed to its session, ``session_affinity``): the same day replayed without the tier, then with a
``cpu`` tier of GB per replica, the rate of the second counting the pre-pass
(pipeline.replay.offload.plan_offload: the tiers simulated directly, the replayed day sharing the
day's arrays), the engine and giving the results back their logged arrivals. Each is timed twice:
first as ``rooftrace replay`` runs it (its default ``--executor thread``: shard.auto_pods cuts
the fleet into a pod a usable core, simulate_sharded runs them on threads, and the pre-pass
simulates its replicas' tiers on the same threads; ``--threads N`` sets the cores, 1 skips it),
then in one engine on one thread; the two give the same results (asserted). 2026-12-07, shared
2-core VM, 3343d4d, load 1.0-1.2, ``--offload 200`` twice: as the replay runs it (4 pods on 2
threads) tier on 81,041 and 100,491 requests per wall-s (pre-pass 3.16 and 2.90 s), tier off
108,622 and 132,090, peak RSS 1.75 and 1.76 GiB; one engine, one thread: tier on 45,930 and
48,542 (pre-pass 4.27 and 3.12 s), tier off 55,585 and 62,175. ``--offload-shared GB`` puts a
store of GB for the pool below the cpu tier (docs/accounting.md, "Three levels"); the same
sitting, ``--offload 200 --offload-shared 8000`` once: tier on 62,192 as the replay runs it
(pre-pass 8.61 s: the store's one LRU list), 30,726 in one thread; 1.77 GiB. Earlier figures:
docs/benchmarks.md.
``--autoscale schedule|kv`` times an autoscaled fleet (FLEET.toml ``[autoscale]``, docs/pools.md)
against the same day replayed static on all its replicas, round robin: ``schedule`` runs half the
replicas until half the day, then all; ``kv`` scales on KV occupancy (60 s windows). Either is one
run of the compiled loop, which decides the live replicas and routes each arrival to a live one
as it goes (docs/engine.md, "Scaling decisions"); the rate counts the whole replay_autoscaled call
(the loop, then the timeline, drains and record in Python).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_engine_support import LinearCost  # noqa: E402

from pipeline.costmodel.profile.cost import step_cost_for  # noqa: E402
from pipeline.engine.jit import simulate_jit  # noqa: E402
from pipeline.engine.model import FleetSpec, Workload  # noqa: E402
from pipeline.engine.reference import simulate_reference  # noqa: E402
from pipeline.engine.steplog import StepLog  # noqa: E402
from pipeline.replay.fleet import parse_fleet, resolve  # noqa: E402

SAMPLE = ROOT / "traces" / "sample" / "azure_conv_2023.csv.gz"


def lengths(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if SAMPLE.exists():
        df = pl.read_csv(SAMPLE)
        idx = rng.integers(0, df.height, n)
        return (
            np.maximum(df["ContextTokens"].to_numpy()[idx], 1).astype(np.int64),
            np.maximum(df["GeneratedTokens"].to_numpy()[idx], 1).astype(np.int64),
        )
    # Azure conv 2023 (Azure/AzurePublicDataset, AzureLLMInferenceTrace_conv):
    # input mean 1155 / median 1020, output mean 211 / median 129.
    p = rng.lognormal(np.log(1020), np.sqrt(2 * np.log(1155 / 1020)), n)
    o = rng.lognormal(np.log(129), np.sqrt(2 * np.log(211 / 129)), n)
    return np.clip(p, 1, 14050).astype(np.int64), np.clip(o, 1, 1000).astype(np.int64)


def _tpot(res: Any, output: np.ndarray) -> np.ndarray:
    """Per request (e2e − ttft) / (output − 1), vLLM's TPOT (NaN for one-token outputs)."""
    many = output > 1
    return np.where(many, (res.finish_s - res.first_token_s) / np.maximum(output - 1, 1), np.nan)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--rate", type=float, default=None, help="req/s for the fleet (default: ~70%% load)")
    ap.add_argument("--cost", choices=["linear", "roofline", "measured", "prior"], default="linear")
    ap.add_argument("--model", default="llama-3.1-8b", help="catalog model (qwen3-30b-a3b: a MoE fleet)")
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel ranks per replica (MoE: lockstep)")
    ap.add_argument("--ep", type=int, default=1, help="expert parallel size (1 or tp x dp)")
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--reference", type=int, default=0, help="also time the reference on N requests")
    ap.add_argument("--disagg", default=None, help="P:D prefill and decode replicas (the disaggregated mode)")
    ap.add_argument(
        "--speculative",
        default=None,
        metavar="METHOD:K",
        help="also replay with speculative decoding (FLEET.toml [speculative] method and num_speculative_tokens, "
        "acceptance from the catalog), after the same replay without, and print both rates",
    )
    ap.add_argument(
        "--offload",
        type=float,
        default=None,
        metavar="GB",
        help="agent-session traffic replayed without, then with, a cpu KV offload tier of GB per replica",
    )
    ap.add_argument(
        "--offload-shared",
        type=float,
        default=None,
        metavar="GB",
        help="with --offload: a store of GB shared by the pool below the cpu tier (FLEET.toml [kv_offload.shared])",
    )
    ap.add_argument(
        "--autoscale",
        choices=["schedule", "kv"],
        default=None,
        help="the same day replayed static, then autoscaled (a schedule, or KV occupancy), and both rates",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="with --offload: also time the replay as `rooftrace replay` runs it, pods in N threads (default: the "
        "usable cores; 1: one engine only)",
    )
    args = ap.parse_args()
    if args.offload is not None:
        offload(args)
        return
    if args.disagg is not None:
        disagg(args)
        return
    engine = simulate_jit

    fleet = resolve(
        parse_fleet(
            {
                "name": "bench",
                "model": args.model,
                "hardware": args.hardware,
                "replicas": args.replicas,
                "dp": args.dp,
                "ep": args.ep,
                "router": args.router,
                "engine": {"max_model_len": 16384},
                **(
                    {
                        "speculative": {
                            "method": args.speculative.split(":")[0],
                            "num_speculative_tokens": int(args.speculative.split(":")[1]),
                        }
                    }
                    if args.speculative
                    else {}
                ),
            },
            "bench",
        )
    )
    sched = fleet.scheduler
    t_build = time.perf_counter()
    cost = (
        step_cost_for(
            fleet.deployment,
            args.cost,
            max(sched.max_num_batched_tokens, sched.max_num_seqs) + 1,
            sched.max_num_seqs,
        )
        if args.cost != "linear"
        else LinearCost(a=2.3e-3, b=7e-5, c=2e-10, d=2e-5, e=1.5e-8)
    )
    t_build = time.perf_counter() - t_build
    rng = np.random.default_rng(0)
    n = args.requests
    prompt, output = lengths(n, rng)
    rate = args.rate if args.rate is not None else 6.0 * fleet.ranks
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    work = Workload(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output)
    spec = FleetSpec(replicas=fleet.ranks, scheduler=fleet.scheduler, router=args.router, lockstep=fleet.lockstep)
    t0 = time.perf_counter()
    engine(Workload(arrival_s=arrival[:10], prompt_tokens=prompt[:10], output_tokens=output[:10]), spec, cost)
    warm = time.perf_counter() - t0
    if fleet.speculation is not None:  # the same replay without speculation first, same process
        t0 = time.perf_counter()
        off = engine(work, spec, cost, StepLog(capacity=1024))
        wall_off = time.perf_counter() - t0
        print(f"speculation off     {n / wall_off:,.0f} requests per wall-s ({wall_off:,.2f} s)")
        print(f"  mean TPOT         {np.nanmean(_tpot(off, output)) * 1e3:.2f} ms")
        spec = replace(spec, speculation=fleet.speculation)
        sd = fleet.speculation
        print(f"speculation on      {sd.method}, k = {sd.k}, {sd.mean_accepted:.2f} tokens per step (catalog)")
    if args.autoscale is not None:
        autoscaled(args, fleet, work, spec, cost)
        return
    log = StepLog(capacity=1024)
    t0, c0 = time.perf_counter(), time.process_time()
    res = engine(work, spec, cost, log)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if fleet.speculation is not None:
        print(f"  mean TPOT         {np.nanmean(_tpot(res, output)) * 1e3:.2f} ms")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    ok = res.reject_reason == 0
    print(
        f"requests            {n:,} ({ok.sum():,} finished) on {args.replicas} replicas x dp {args.dp} "
        f"(lockstep groups of {fleet.lockstep}), {args.router}"
    )
    print(f"engine              jit (warm-up on 10 requests {warm:.2f} s)")
    print(f"model               {args.model} on {args.hardware}")
    print(f"cost model          {args.cost} (tables built in {t_build:.2f} s)")
    print(f"simulated span      {np.nanmax(res.finish_s):,.0f} s at {rate:.1f} req/s offered")
    print(f"spans               {log.n:,} ({log.n / n:.2f} per request)")
    print(f"wall                {wall:,.2f} s")
    print(f"requests per wall-s {n / wall:,.0f}")
    print(
        f"CPU                 {cpu:,.2f} s = {n / cpu:,.0f} requests per CPU-s (load average {os.getloadavg()[0]:.1f})"
    )
    print(f"peak RSS            {rss:,.2f} GiB")
    if args.reference:
        m = args.reference
        sub = Workload(arrival_s=arrival[:m], prompt_tokens=prompt[:m], output_tokens=output[:m])
        t0 = time.perf_counter()
        mine = engine(sub, spec, cost)
        t_mine = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = simulate_reference(sub, spec, cost)
        t_ref = time.perf_counter() - t0
        print(f"reference on {m:,}  jit {t_mine:.3f} s, reference {t_ref:.2f} s, speed-up {t_ref / t_mine:,.0f}x")
        for name in ("first_token_s", "finish_s"):
            a, b = getattr(mine, name), getattr(ref, name)
            print(f"max rel. diff {name:<13} {np.nanmax(np.abs(a - b) / np.abs(b)):.2e}")


def autoscaled(args: argparse.Namespace, fleet: Any, work: Workload, spec: FleetSpec, cost: Any) -> None:
    """The day replayed static (all replicas, round robin), then under an [autoscale] policy."""
    from pipeline.costmodel.fit import weights_bytes_per_gpu
    from pipeline.replay.autoscale import parse_autoscale, replay_autoscaled

    n, r = work.n, spec.replicas
    spec = replace(spec, router="round_robin")
    t0 = time.perf_counter()
    static = simulate_jit(work, spec, cost, StepLog(capacity=2 * n))
    wall_static = time.perf_counter() - t0
    hours = float(np.max(work.arrival_s)) / 3600.0
    table: dict[str, Any] = {"min_replicas": max(1, r // 4), "max_replicas": r}
    if args.autoscale == "schedule":
        table |= {"signal": "schedule", "schedule": [[0.0, max(1, r // 2)], [hours / 2.0, r]]}
    else:
        table |= {"signal": "kv", "scale_up_at": 0.8, "scale_down_at": 0.3, "window_s": 60.0, "cooldown_s": 120.0}
    settings = parse_autoscale(table, "benchmark [autoscale]", r)
    weights = weights_bytes_per_gpu(fleet.deployment) * fleet.deployment.gpus

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    t0 = time.perf_counter()
    res, _, outcome, _ = replay_autoscaled(work, spec, settings, weights, cost)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    ok_s, ok_a = static.reject_reason == 0, res.reject_reason == 0
    print(f"requests            {n:,} on up to {r} replicas, round robin (load average {os.getloadavg()[0]:.1f})")
    done = f"{ok_s.sum():,} finished"
    print(f"static              {n / wall_static:,.0f} requests per wall-s ({wall_static:,.2f} s, {done})")
    print(
        f"autoscaled ({args.autoscale}) {n / wall:,.0f} requests per wall-s ({wall:,.2f} s, {ok_a.sum():,} finished; "
        f"{len(outcome.changes)} changes decided in the event loop, one pass)"
    )
    print(f"ratio               {wall_static / wall:.2f} of the static rate")
    print(f"peak RSS            {max(rss0, rss):,.2f} GiB")


def disagg(args: argparse.Namespace) -> None:
    """The disaggregated mode's rate: prefill pool, hand-off, decode pool and join, timed together."""
    from pipeline.replay.pools import Link, hand_off, join_disaggregated

    p, d = (int(x) for x in args.disagg.split(":"))
    fleet = resolve(
        parse_fleet(
            {"name": "bench", "model": args.model, "hardware": args.hardware, "engine": {"max_model_len": 16384}},
            "bench",
        )
    )
    cost = LinearCost(a=2.3e-3, b=7e-5, c=2e-10, d=2e-5, e=1.5e-8)
    rng = np.random.default_rng(0)
    n = args.requests
    prompt, output = lengths(n, rng)
    rate = args.rate if args.rate is not None else 6.0 * (p + d) / 2
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    first = Workload(arrival_s=arrival, prompt_tokens=prompt, output_tokens=np.ones(n, np.int64))
    pre = FleetSpec(replicas=p, scheduler=fleet.scheduler, router="least_outstanding")
    dec = FleetSpec(replicas=d, scheduler=fleet.scheduler, router="least_outstanding")
    link = Link(50e9, 50e-6)
    small = Workload(arrival_s=arrival[:10], prompt_tokens=prompt[:10], output_tokens=np.ones(10, np.int64))
    t0 = time.perf_counter()
    simulate_jit(small, pre, cost)
    warm = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    res_p = simulate_jit(first, pre, cost, StepLog(capacity=1024))
    t1 = time.perf_counter()
    moved = hand_off(first, res_p, fleet.memory.kv_bytes_per_token, link, output_tokens=output)
    t2 = time.perf_counter()
    res_d = simulate_jit(moved.work, dec, cost, StepLog(capacity=1024))
    t3 = time.perf_counter()
    joined = join_disaggregated(res_p, moved, res_d)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    served = int((joined.rejected_at == 0).sum())
    print(f"requests            {n:,} ({served:,} finished) on {p} prefill + {d} decode replicas, least_outstanding")
    print(f"engine              jit (warm-up on 10 requests {warm:.2f} s), cost linear")
    print(f"model               {args.model} on {args.hardware}")
    print(f"simulated span      {np.nanmax(joined.result.finish_s):,.0f} s at {rate:.1f} req/s offered")
    print(f"wall                {wall:,.2f} s (prefill {t1 - t0:.2f}, hand-off {t2 - t1:.2f}, decode {t3 - t2:.2f}, "
          f"join {time.perf_counter() - t3:.2f})")  # fmt: skip
    print(f"requests per wall-s {n / wall:,.0f}")
    load = os.getloadavg()[0]
    print(f"CPU                 {cpu:,.2f} s = {n / cpu:,.0f} requests per CPU-s (load average {load:.1f})")
    print(f"peak RSS            {rss:,.2f} GiB")


def agent_sessions(n: int, rate: float, rng: np.random.Generator) -> Workload:
    """``n`` requests of agent sessions arriving at ``rate`` requests per second: sessions of 1–6
    turns (mean 3.5) start as a Poisson process; turn k arrives a think time (exponential, mean
    300 s: a tool call or a person) after turn k − 1; its prompt re-sends turn k − 1's prompt and
    answer plus a new message, so its prefix chain (one hash per full 16-token block, unique to
    its session and position) extends the previous turn's. First prompts are lognormal (median
    400 tokens: system prompt and tools), messages median 100, answers median 129."""
    turns = rng.integers(1, 7, n)
    turns = turns[: int(np.searchsorted(np.cumsum(turns), n)) + 1]
    turns[-1] -= int(turns.sum()) - n
    turns = turns[turns > 0]
    s = turns.shape[0]
    session = np.repeat(np.arange(s, dtype=np.int64), turns)
    first = np.concatenate([[0], np.cumsum(turns)[:-1]])
    k = np.arange(n, dtype=np.int64) - first[session]  # turn index within the session
    start = np.cumsum(rng.exponential(turns.mean() / rate, s))
    think = np.where(k > 0, rng.exponential(300.0, n), 0.0)
    arrival = start[session] + np.cumsum(think) - np.cumsum(think)[first][session]
    output = np.clip(rng.lognormal(np.log(129), 0.9, n), 1, 2000).astype(np.int64)
    added = np.where(k == 0, rng.lognormal(np.log(400), 0.6, n), rng.lognormal(np.log(100), 0.8, n))
    added = np.clip(added, 1, 8000).astype(np.int64)
    added[k > 0] += output[np.flatnonzero(k > 0) - 1]  # the previous turn's answer
    csum = np.cumsum(added)
    prompt = (csum - (csum[first] - added[first])[session]).astype(np.int64)
    order = np.argsort(arrival, kind="stable")
    arrival, prompt, output, session = arrival[order], prompt[order], output[order], session[order]
    blocks = prompt // 16
    offsets = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
    h = np.empty(int(offsets[-1]), np.uint64)
    for a in range(0, n, 65536):  # in slices: the temporaries stay small beside the chains
        b = min(a + 65536, n)
        lo, hi = int(offsets[a]), int(offsets[b])
        pos = np.arange(lo, hi, dtype=np.int64) - np.repeat(offsets[a:b], blocks[a:b])
        x = (np.repeat(session[a:b], blocks[a:b]) << 24) + pos
        x = x.astype(np.uint64)
        h[lo:hi] = (x ^ (x >> np.uint64(31))) * np.uint64(0x9E3779B97F4A7C15)  # distinct per (session, block)
    return Workload(
        arrival_s=arrival - arrival[0],
        prompt_tokens=prompt,
        output_tokens=output,
        chain_hashes=h,
        chain_offsets=offsets,
        affinity=session,
    )


def offload(args: argparse.Namespace) -> None:
    """The KV offload tier's rate: agent sessions replayed without the tier, then with it; in one
    engine on one thread, then as the replay stage runs it (pods on threads, the pre-pass's
    replicas too)."""
    from pipeline.common.system import usable_cores
    from pipeline.engine.shard import auto_pods, routes_static, simulate_sharded
    from pipeline.replay.offload import OffloadPlan, plan_offload

    spec_dict = {
        "name": "bench",
        "model": args.model,
        "hardware": args.hardware,
        "replicas": args.replicas,
        "router": "session_affinity",
        "engine": {"max_model_len": 131072, "enable_prefix_caching": True},
        "kv_offload": {"kind": "cpu", "capacity_gb": args.offload},
    }
    if args.offload_shared is not None:  # three levels: GPU, each replica's host DRAM, the pool's store
        spec_dict["kv_offload"]["shared"] = {"capacity_gb": args.offload_shared}  # type: ignore[index]
    fleet = resolve(parse_fleet(spec_dict, "bench"))
    tier = fleet.config.kv_offload
    assert tier is not None
    cost = LinearCost(a=2.3e-3, b=7e-5, c=2e-10, d=2e-5, e=1.5e-8)
    rng = np.random.default_rng(0)
    n = args.requests
    rate = args.rate if args.rate is not None else 6.0 * fleet.ranks
    t0 = time.perf_counter()
    work = agent_sessions(n, rate, rng)
    t_gen = time.perf_counter() - t0
    spec = FleetSpec(replicas=fleet.ranks, scheduler=fleet.scheduler, router="session_affinity")
    simulate_jit(Workload(arrival_s=work.arrival_s[:10], prompt_tokens=work.prompt_tokens[:10],
                          output_tokens=work.output_tokens[:10]), spec, cost)  # fmt: skip
    threads = max(1, args.threads if args.threads is not None else usable_cores())

    def engine(w: Workload, workers: int) -> tuple[Any, int]:
        """One engine (workers 1), or pods as the replay stage picks them (shard.auto_pods)."""
        pods = auto_pods(spec, w.n, lambda: routes_static(w, spec), cores=workers) if workers > 1 else 1
        if pods == 1:
            return simulate_jit(w, spec, cost, StepLog(capacity=1024)), 1
        return simulate_sharded(w, spec, cost, StepLog(capacity=1024), pods, "thread"), pods

    def timed(workers: int) -> tuple[Any, Any, OffloadPlan, float, float, float, float, float, int]:
        t0, c0 = time.perf_counter(), time.process_time()
        off, _ = engine(work, workers)
        wall_off, cpu_off = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_offload(
            work, spec, tier, fleet.memory.kv_bytes_per_token, fleet.deployment.gpus, fleet.config.dp, workers
        )
        t1 = time.perf_counter()
        assert plan is not None
        on, pods = engine(plan.work, workers)
        res = plan.restore(on)
        wall_on, cpu_on = time.perf_counter() - t0, time.process_time() - c0
        return off, res, plan, wall_off, cpu_off, wall_on, cpu_on, t1 - t0, pods

    def digest(*results: Any) -> str:
        h = hashlib.sha256()
        for r in results:
            for f in ("first_token_s", "finish_s", "replica"):
                h.update(np.ascontiguousarray(getattr(r, f)).tobytes())
        return h.hexdigest()

    def peak() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2

    # as the replay stage runs it first (its peak RSS apart), then one engine on one thread
    staged = None
    if threads > 1:  # (only its figures and a digest kept: the one-thread run's peak is its own)
        s_off, s_res, _, *figures = timed(threads)
        staged = (digest(s_off, s_res), *figures)
        del s_off, s_res
    staged_rss = peak()
    off, res, plan, wall_off, cpu_off, wall_on, cpu_on, pre, _ = timed(1)
    loads = plan.offload_hit_tokens > 0
    print(f"requests            {n:,} agent-session turns ({int(work.affinity.max()) + 1:,} sessions) on "  # type: ignore[union-attr]
          f"{args.replicas} replicas, session_affinity, cost linear (generated in {t_gen:.2f} s)")  # fmt: skip
    print(f"model               {args.model} on {args.hardware}; GPU tier {fleet.scheduler.num_gpu_blocks * 16:,} "
          f"tokens a replica; mean prompt {work.prompt_tokens.mean():,.0f} tokens")  # fmt: skip
    print(f"simulated span      {np.nanmax(off.finish_s):,.0f} s at {rate:.1f} req/s offered")
    tiers = f"{tier.capacity_gb:g} GB cpu" + (f" + {tier.shared.capacity_gb:g} GB store" if tier.shared else "")

    def rates(how: str, off: Any, res: Any, wall_off: float, cpu_off: float, wall_on: float, cpu_on: float,
              pre: float) -> None:  # fmt: skip
        print(f"{how}")
        print(f"  tier off          {n / wall_off:,.0f} requests per wall-s ({wall_off:,.2f} s), "
              f"{n / cpu_off:,.0f} per CPU-s; "
              f"mean TTFT {np.mean(off.first_token_s - off.arrival_s) * 1e3:,.1f} ms")  # fmt: skip
        print(f"  tier on ({tiers}) {n / wall_on:,.0f} requests per wall-s ({wall_on:,.2f} s: "
              f"pre-pass {pre:.2f}), {n / cpu_on:,.0f} per CPU-s; "
              f"mean TTFT {np.mean(res.first_token_s - res.arrival_s) * 1e3:,.1f} ms")  # fmt: skip

    if staged is not None:
        staged_digest, w_off, c_off, w_on, c_on, p, pods = staged
        assert digest(off, res) == staged_digest  # pods on threads: the same results bit for bit
        rates(f"as the replay stage runs it: {pods} pods on {threads} threads (results identical; "
              f"peak RSS {staged_rss:,.2f} GiB)", off, res, w_off, c_off, w_on, c_on, p)  # fmt: skip
    rates("one engine, one thread", off, res, wall_off, cpu_off, wall_on, cpu_on, pre)
    print(f"lower-tier hits     {int(loads.sum()):,} requests loaded {int(plan.offload_hit_tokens.sum()):,} tokens "
          f"({float(plan.load_s.sum()):,.1f} s of loads, routing {plan.routing})")  # fmt: skip
    if plan.shared_hit_tokens is not None:
        by = plan.by_tier()
        cpu, store = by["cpu"], by["shared"]
        print(f"per lower tier      cpu {cpu['hit_tokens']:,} tokens to {cpu['requests_loading']:,} requests, "
              f"store {store['hit_tokens']:,} to {store['requests_loading']:,}")  # fmt: skip
    print(f"peak RSS            {peak():,.2f} GiB (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
