"""Scale-out: a day of requests on a large fleet, in one process, in pods, and on Ray.

Three measurements, each in a fresh child process (its own peak RSS):

1. ``flat``: the whole fleet in one engine run (pipeline.engine.jit.simulate_jit);
2. ``pods``: the same fleet cut into pods, replayed one after another in this process
   (pipeline.engine.shard.simulate_sharded, ``--executor local``);
3. ``ray``: the same pods as Ray tasks on a local Ray instance with ``--ray-workers`` CPUs;
4. ``steps`` (not in the default ``--modes``): ``pods`` with the step log kept, streamed pod by
   pod to steps.parquet and series.parquet in a temporary folder (pipeline.replay.run.RunSteps, what
   ``rooftrace replay --pods`` does), so its peak RSS includes writing the step log;
5. ``store`` (not in the default ``--modes``): the whole command on a store. The same requests are
   written as a Vidur trace, ingested (``rooftrace ingest``), and replayed with
   ``rooftrace replay --pods N``: the store's requests read, every table of the run written
   (requests, steps, series) and the summary computed. Wall time and peak RSS
   of each command's own process (``wait4``).

Round robin is a static router, so all three must give the same per-request results bit for bit
(checked here on first-token time, finish time and replica). Then, on a fleet one process runs
easily, the hierarchical router (a load balancer over pods, least outstanding inside each) against
the flat least-outstanding router: TTFT and TPOT percentiles and their differences. With
``--hierarchy-arrivals sessions`` the requests belong to sessions of heavy-tailed sizes
(:func:`sessions`, ``--session-*``), each request's session its affinity key, and flat and
hierarchical ``session_affinity`` are compared with flat and hierarchical least outstanding,
with the load imbalance across pods and replicas (:func:`hierarchy_sessions`).

Workload: Azure-conversation-like lengths (benchmarks/replay.py), Poisson arrivals at 6 requests/s
per replica, Llama-3.1-8B on H100 with its measured profile, no prefix caching; no step log but
in ``steps`` (gathered in memory, the step log of 10^7 requests would be ~4 GB).

    python benchmarks/scale.py [--requests 10000000] [--replicas 1000] [--pods 10] [--ray-workers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _util import run_child  # noqa: E402

#: Bursty arrivals (``--hierarchy-arrivals bursty``): a two-state Markov-modulated Poisson process
#: that alternates busy and quiet periods of exponentially distributed length (mean BURST_MEAN_S
#: each) at BURST_HIGH and BURST_LOW times the mean rate: the same mean load as Poisson, with
#: fleet-wide surges of tens of seconds (a traffic spike, a batch job starting).
BURST_MEAN_S = 20.0
BURST_HIGH, BURST_LOW = 1.6, 0.4

#: Sessions (``--hierarchy-arrivals sessions``, :func:`sessions`): turns per session Zipf-distributed
#: with exponent SESSION_ZIPF (P(k) ∝ k^-a; a = 2: median 1 turn, mean about 5), sessions of more
#: than SESSION_MAX_TURNS turns redrawn; turns SESSION_GAP_S seconds apart on average (exponential
#: gaps: a chat's think time).
SESSION_ZIPF = 2.0
SESSION_MAX_TURNS = 4000
SESSION_GAP_S = 20.0


def arrivals(n: int, fleet_rate: float, rng: np.random.Generator, kind: str = "poisson") -> np.ndarray:
    """``n`` arrival times at a mean of ``fleet_rate`` requests/s: Poisson, or bursty (above)."""
    if kind == "poisson":
        return np.cumsum(rng.exponential(1.0 / fleet_rate, n))
    if kind != "bursty":
        raise ValueError(f"arrivals {kind!r}: poisson or bursty")
    out = np.empty(n)
    t, i, high = 0.0, 0, True
    while i < n:
        end = t + rng.exponential(BURST_MEAN_S)
        rate = fleet_rate * (BURST_HIGH if high else BURST_LOW)
        gaps = rng.exponential(1.0 / rate, max(16, int(2 * rate * (end - t)) + 16))
        times = t + np.cumsum(gaps)
        times = times[times < end][: n - i]
        out[i : i + times.size] = times
        i += times.size
        t, high = end, not high
    return out


def sessions(
    n: int,
    fleet_rate: float,
    rng: np.random.Generator,
    zipf: float = SESSION_ZIPF,
    max_turns: int = SESSION_MAX_TURNS,
    gap_s: float = SESSION_GAP_S,
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` requests in sessions at a mean of ``fleet_rate`` requests/s: their arrival times
    (increasing, in [0, T), T = n / fleet_rate) and each one's session key (int64, 0, 1, ...).

    Turns per session are Zipf-distributed with exponent ``zipf`` (draws above ``max_turns``
    redrawn; the last session is cut so that the turns add up to ``n``). A session starts at a
    uniformly random time of the run and its turns follow at exponential gaps of mean ``gap_s``
    (a chat's think time); a session that would span more than the run at that pace is squeezed
    into it (its gaps scaled down until it spans (k − 1)/k of T: a client that sends many
    requests a day sends them faster). The run is one period of a steady day: turns past its end
    wrap around to its start, so the mean rate is the same throughout."""
    T = n / fleet_rate
    parts, total = [], 0
    while total < n:
        k = rng.zipf(zipf, max(1024, (n - total) // 2))
        k = k[k <= max_turns]
        k = k[: int(np.searchsorted(np.cumsum(k), n - total)) + 1]  # up to the first that reaches n
        parts.append(k)
        total += int(k.sum())
    sizes = np.concatenate(parts).astype(np.int64)
    sizes[-1] -= total - n
    first = np.cumsum(sizes) - sizes  # each session's first turn (requests grouped by session)
    gaps = rng.exponential(gap_s, n)
    gaps[first] = 0.0
    offset = np.cumsum(gaps)
    offset -= np.repeat(offset[first], sizes)  # seconds after the session's first turn
    span = offset[first + sizes - 1]
    limit = T * (sizes - 1) / sizes
    squeeze = np.divide(limit, span, out=np.ones(sizes.size), where=span > limit)
    t = (np.repeat(rng.uniform(0.0, T, sizes.size), sizes) + offset * np.repeat(squeeze, sizes)) % T
    key = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    order = np.argsort(t, kind="stable")
    return t[order], key[order]


def build(
    n: int,
    replicas: int,
    router: str,
    seed: int = 0,
    rate: float = 6.0,
    kind: str = "poisson",
    session: tuple[float, int, float] = (SESSION_ZIPF, SESSION_MAX_TURNS, SESSION_GAP_S),
) -> tuple[object, object, object, object]:
    """The workload (``kind`` arrivals, :func:`arrivals`, at ``rate`` requests/s per replica on
    average; ``sessions``: :func:`sessions` with ``session`` = (zipf, max_turns, gap_s), each
    request's session its affinity key), the fleet spec, the measured step cost and the resolved
    fleet (deterministic in ``seed``)."""
    from replay import lengths

    from pipeline.costmodel.profile.cost import step_cost_for
    from pipeline.engine.model import FleetSpec, Workload
    from pipeline.replay.fleet import parse_fleet, resolve

    fleet = resolve(
        parse_fleet(
            {
                "name": "scale",
                "model": "llama-3.1-8b",
                "hardware": "h100-sxm",
                "replicas": replicas,
                "router": router,
                "engine": {"max_model_len": 16384},
            },
            "scale",
        )
    )
    sched = fleet.scheduler
    cost = step_cost_for(
        fleet.deployment, "measured", max(sched.max_num_batched_tokens, sched.max_num_seqs) + 1, sched.max_num_seqs
    )
    rng = np.random.default_rng(seed)
    prompt, output = lengths(n, rng)
    affinity = None
    if kind == "sessions":
        arrival, affinity = sessions(n, rate * fleet.ranks, rng, *session)
    else:
        arrival = arrivals(n, rate * fleet.ranks, rng, kind)
    work = Workload(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, affinity=affinity)
    spec = FleetSpec(replicas=fleet.ranks, scheduler=sched, router=router, lockstep=fleet.lockstep)
    return work, spec, cost, fleet


def child(mode: str, n: int, replicas: int, pods: int, workers: int, out: str) -> dict[str, float]:
    """One measurement (run in a fresh process by the parent)."""
    from pipeline.engine.jit import simulate_jit
    from pipeline.engine.model import Workload
    from pipeline.engine.shard import simulate_sharded
    from pipeline.replay.run import RunSteps

    work, spec, cost, fleet = build(n, replicas, "round_robin")
    w10 = Workload(arrival_s=work.arrival_s[:10], prompt_tokens=work.prompt_tokens[:10],  # type: ignore[attr-defined]
                   output_tokens=work.output_tokens[:10])  # type: ignore[attr-defined]  # fmt: skip
    # load the compiled engine (disk cache) before timing; a flat fleet of 1,000 replicas is more
    # engine state than the jit engine allocates at once (its block tables: 5.7 GiB here)
    if mode == "flat":
        simulate_jit(w10, spec, cost)
    else:
        simulate_sharded(w10, spec, cost, None, pods)
    if mode == "ray":
        import ray

        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        # each Ray worker loads the compiled engine once: warm them before timing
        small = Workload(arrival_s=work.arrival_s[:400], prompt_tokens=work.prompt_tokens[:400],  # type: ignore[attr-defined]
                         output_tokens=work.output_tokens[:400])  # type: ignore[attr-defined]  # fmt: skip
        simulate_sharded(small, spec, cost, None, 4 * workers, "ray")
    sink = RunSteps(Path(out).with_suffix(""), fleet, 0) if mode == "steps" else None  # type: ignore[arg-type]
    if sink is not None:
        sink.cost_source = str(getattr(cost, "source", "roofline"))
    t0 = time.perf_counter()
    if mode == "flat":
        res = simulate_jit(work, spec, cost)
    else:
        res = simulate_sharded(work, spec, cost, sink, pods, "ray" if mode == "ray" else "local")
    extra: dict[str, float] = {}
    if sink is not None:
        sink.close()
        size = sum(p.stat().st_size for p in (sink.steps.path, sink.series.path)) / 2**20
        extra = {"spans": sink.sums.spans, "steps_series_mib": size, "series_rows": sink.series.rows}
    wall = time.perf_counter() - t0
    np.savez(out, first=res.first_token_s, finish=res.finish_s, replica=res.replica)
    ok = res.reject_reason == 0
    return {"wall_s": wall, "finished": int(ok.sum()), "span_s": float(np.nanmax(res.finish_s)), **extra}


def _command(args: list[str], cwd: Path) -> tuple[float, float, str]:
    """One ``rooftrace`` command in a fresh process: (wall s, its own peak RSS GiB, stdout)."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "ROOFTRACE_STORE"}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"rooftrace {args[0]} failed")
    return wall, usage.ru_maxrss / 1024**2, stdout


def store(n: int, replicas: int, pods: int, work_dir: Path) -> None:
    """``rooftrace ingest`` then ``rooftrace replay --pods`` on the same requests, in a store."""
    import polars as pl

    work, _, _, _ = build(n, replicas, "round_robin")
    day = work_dir / "day.csv"
    pl.DataFrame(
        {
            "arrived_at": np.round(work.arrival_s, 6),  # type: ignore[attr-defined]
            "num_prefill_tokens": work.prompt_tokens,  # type: ignore[attr-defined]
            "num_decode_tokens": work.output_tokens,  # type: ignore[attr-defined]
        }
    ).write_csv(day)
    del work
    fleet = work_dir / "scale.toml"
    fleet.write_text(
        f'name = "scale"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\nreplicas = {replicas}\n'
        'router = "round_robin"\n[engine]\nmax_model_len = 16384\nenable_prefix_caching = false\n'
    )
    wall, rss, _ = _command(["ingest", str(day), "--format", "vidur", "--date", "2025-01-15"], work_dir)
    print(f"store ingest {n:,} requests: {wall:.1f} s, peak RSS {rss:.2f} GiB")
    wall, rss, text = _command(
        ["replay", "--fleet", str(fleet), "--date", "2025-01-15", "--pods", str(pods), "--json"], work_dir
    )
    doc = json.loads(text)
    summary = doc.get("summary", doc)
    print(
        f"store replay {n:,} requests on {replicas:,} replicas in {pods} pods: {wall:.1f} s = {n / wall:,.0f} req/s, "
        f"peak RSS {rss:.2f} GiB; {summary['finished']:,} finished, {summary['spans']:,} spans; "
        f"TTFT p99 {summary['ttft_s']['p99'] * 1e3:.1f} ms"
    )


def hierarchy(n: int, replicas: int, pod_sizes: list[int], rate: float = 6.0, kind: str = "poisson") -> None:
    """Flat least outstanding vs a load balancer over pods (round robin) + least outstanding inside."""
    from pipeline.engine.jit import simulate_jit
    from pipeline.engine.shard import simulate_sharded
    from pipeline.replay.slo import percentile

    work, spec, cost, _ = build(n, replicas, "least_outstanding", seed=1, rate=rate, kind=kind)
    ok_lat = {}
    for size in [0, *pod_sizes]:
        t0 = time.perf_counter()
        res = (
            simulate_jit(work, spec, cost) if size == 0 else simulate_sharded(work, spec, cost, None, 1, pod_ranks=size)
        )
        wall = time.perf_counter() - t0
        ok = res.reject_reason == 0
        ttft = (res.first_token_s - res.arrival_s)[ok]
        out = work.output_tokens[ok]  # type: ignore[attr-defined]
        tpot = ((res.finish_s - res.first_token_s)[ok] / np.maximum(out - 1, 1))[out > 1]
        row = {f"{k}_p{p}": percentile(v, p) for k, v in (("ttft", ttft), ("tpot", tpot)) for p in (50, 99)}
        ok_lat[size] = row
        label = "flat" if size == 0 else f"pods of {size}"
        diff = (
            ""
            if size == 0
            else "  vs flat: " + ", ".join(f"{k} {100 * (v / ok_lat[0][k] - 1):+.1f}%" for k, v in row.items())
        )
        print(
            f"  {label:<12} " + ", ".join(f"{k} {v * 1e3:,.1f} ms" for k, v in row.items()) + f" ({wall:.1f} s){diff}"
        )


def _latencies(work: object, res: object) -> dict[str, float]:
    """TTFT and TPOT p50 and p99 of the finished requests (seconds)."""
    from pipeline.replay.slo import percentile

    ok = res.reject_reason == 0  # type: ignore[attr-defined]
    ttft = (res.first_token_s - res.arrival_s)[ok]  # type: ignore[attr-defined]
    out = work.output_tokens[ok]  # type: ignore[attr-defined]
    tpot = ((res.finish_s - res.first_token_s)[ok] / np.maximum(out - 1, 1))[out > 1]  # type: ignore[attr-defined]
    return {f"{k}_p{p}": percentile(v, p) for k, v in (("ttft", ttft), ("tpot", tpot)) for p in (50, 99)}


def _imbalance(counts: np.ndarray) -> float:
    """Max over mean of requests per pod or replica."""
    return float(counts.max() / counts.mean())


def hierarchy_sessions(
    n: int,
    replicas: int,
    pod_sizes: list[int],
    rate: float,
    session: tuple[float, int, float] = (SESSION_ZIPF, SESSION_MAX_TURNS, SESSION_GAP_S),
) -> None:
    """Sessions of heavy-tailed sizes (:func:`sessions`) on flat and hierarchical routers:
    ``session_affinity`` (sessions hashed to replicas; hierarchical: to pods, then to replicas)
    and ``least_outstanding`` (ignores sessions; hierarchical: round robin over pods), and
    FLEET.toml ``router_pod_balancer = "session_affinity"``: sessions hashed to pods (the
    balancer's salted hash) with least outstanding inside each pod. TTFT / TPOT percentiles and
    the load imbalance (max / mean requests) across pods and across replicas."""
    from dataclasses import replace

    from pipeline.engine.jit import simulate_jit
    from pipeline.engine.shard import simulate_sharded

    work, spec, cost, _ = build(n, replicas, "session_affinity", seed=1, rate=rate, kind="sessions", session=session)
    key = work.affinity  # type: ignore[attr-defined]
    print(f"  workload: {session_summary(key, rate * spec.replicas)}")  # type: ignore[attr-defined]
    print(f"  max/mean requests over 200 draws of the hash: {hash_spread(key, replicas, pod_sizes)}")
    runs: list[tuple[str, str, int]] = [("session_affinity", "", s) for s in [0, *pod_sizes]]
    runs += [("least_outstanding", "", s) for s in [0, *pod_sizes]]
    runs += [("least_outstanding", "hashed pods", s) for s in pod_sizes]
    base: dict[str, dict[str, float]] = {}
    for router, how, size in runs:
        sp = replace(spec, router=router)  # type: ignore[type-var]
        t0 = time.perf_counter()
        if how:  # FLEET.toml router_pod_balancer = "session_affinity": sessions hashed to pods
            res: object = simulate_sharded(work, sp, cost, None, 1, pod_ranks=size, pod_balancer="session_affinity")
        elif size == 0:
            res = simulate_jit(work, sp, cost)
        else:
            res = simulate_sharded(work, sp, cost, None, 1, pod_ranks=size)
        wall = time.perf_counter() - t0
        row = _latencies(work, res)
        ok = res.reject_reason == 0  # type: ignore[attr-defined]
        rep = res.replica[ok]  # type: ignore[attr-defined]
        per_replica = np.bincount(rep, minlength=replicas)
        pods = "" if size == 0 else f"pods {_imbalance(np.bincount(rep // size, minlength=-(-replicas // size))):.2f}, "
        name = {"session_affinity": "affinity", "least_outstanding": "least out."}[router]
        label = f"{name} " + ("flat" if size == 0 else f"{how or 'pods'} of {size}")
        base.setdefault(router, row)
        diff = (
            ""
            if size == 0
            else "  vs flat: " + ", ".join(f"{k} {100 * (v / base[router][k] - 1):+.1f}%" for k, v in row.items())
        )
        print(
            f"  {label:<28} "
            + ", ".join(f"{k} {v * 1e3:,.1f} ms" for k, v in row.items())
            + f"; max/mean requests: {pods}replicas {_imbalance(per_replica):.2f}"
            + f", last finish {float(np.nanmax(res.finish_s)):,.0f} s ({wall:.1f} s){diff}"  # type: ignore[attr-defined]
        )


def hash_spread(key: np.ndarray, replicas: int, pod_sizes: list[int], draws: int = 200) -> str:
    """How the load imbalance (max / mean requests) across replicas, and across pods, of the
    sessions ``key`` varies with the draw of the hash: the same sessions relabelled ``draws``
    times (key + d × sessions, d = 0 the labels replayed), hashed as the flat affinity router and
    as the hierarchical one (shard._cut_hierarchical's salted hash to pods, then the pod's own)."""
    from pipeline.engine.jit import affinity_replicas
    from pipeline.engine.shard import _POD_SALT

    sizes = np.bincount(key).astype(np.float64)
    m = sizes.size
    spread: dict[str, list[float]] = {}
    for d in range(draws):
        k = np.arange(m, dtype=np.int64) + d * m
        spread.setdefault("flat replicas", []).append(
            _imbalance(np.bincount(affinity_replicas(k, replicas), sizes, replicas))
        )
        for size in pod_sizes:
            n_pods = -(-replicas // size)
            salted = ((k.astype(np.uint64) ^ _POD_SALT) & np.uint64(0x7FFFFFFFFFFFFFFF)).astype(np.int64)
            pod = affinity_replicas(salted, n_pods)
            rep = pod * size + affinity_replicas(k, size)
            last = pod == n_pods - 1  # (a smaller last pod)
            rep[last] = (n_pods - 1) * size + affinity_replicas(k[last], replicas - (n_pods - 1) * size)
            spread.setdefault(f"pods of {size}: pods", []).append(_imbalance(np.bincount(pod, sizes, n_pods)))
            spread.setdefault(f"pods of {size}: replicas", []).append(_imbalance(np.bincount(rep, sizes, replicas)))
    return "; ".join(
        f"{name} median {np.median(v):.2f} (5-95 %: {np.percentile(v, 5):.2f}-{np.percentile(v, 95):.2f})"
        for name, v in spread.items()
    )


def session_summary(key: np.ndarray, fleet_rate: float) -> str:
    """The sessions of the session keys ``key`` (one a request), in words."""
    n = key.shape[0]
    sizes = np.sort(np.bincount(key))[::-1]
    top = sizes[: max(1, sizes.size // 100)].sum() / n
    return (
        f"{sizes.size:,} sessions: turns median {np.median(sizes):g}, mean {sizes.mean():.2f}, max {sizes[0]:,}; "
        f"top 1 % of sessions {100 * top:.1f} % of requests, largest {100 * sizes[0] / n:.2f} % "
        f"({sizes[0] * fleet_rate / n:.1f} requests/s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=10)
    ap.add_argument("--ray-workers", type=int, default=2)
    ap.add_argument("--modes", default="flat,pods,ray")
    ap.add_argument("--hierarchy-requests", type=int, default=400_000)
    ap.add_argument("--hierarchy-replicas", type=int, default=64)
    ap.add_argument(
        "--hierarchy-rates", default="6", help="requests/s per replica, comma-separated (one comparison each)"
    )
    ap.add_argument(
        "--hierarchy-arrivals", choices=["poisson", "bursty", "sessions"], default="poisson",
        help="arrival process of the routing comparison (bursty: busy / quiet periods, BURST_*; "
        "sessions: heavy-tailed sessions as affinity keys, affinity and least-outstanding routers, --session-*)",
    )  # fmt: skip
    ap.add_argument("--session-zipf", type=float, default=SESSION_ZIPF, help="Zipf exponent of turns per session")
    ap.add_argument("--session-max-turns", type=int, default=SESSION_MAX_TURNS, help="most turns of a session")
    ap.add_argument("--session-gap", type=float, default=SESSION_GAP_S, help="mean seconds between a session's turns")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rooftrace-scale-"))
    results = {}
    for mode in filter(None, args.modes.split(",")):  # "": only the routing comparison
        if mode == "store":
            store(args.requests, args.replicas, args.pods, tmp)
            continue
        out = tmp / f"{mode}.npz"
        code = (
            f"import sys; sys.path.insert(0, {str(HERE)!r}); import scale\n"
            f"RESULT = scale.child({mode!r}, {args.requests}, {args.replicas}, {args.pods}, "
            f"{args.ray_workers}, {str(out)!r})"
        )
        _, rss, doc = run_child(code)
        results[mode] = out
        print(
            f"{mode:<5} {args.requests:,} requests on {args.replicas:,} replicas"
            + ("" if mode == "flat" else f" in {args.pods} pods")
            + (f" on Ray ({args.ray_workers} workers)" if mode == "ray" else "")
            + f": {doc['wall_s']:.1f} s = {args.requests / doc['wall_s']:,.0f} req/s, peak RSS {rss / 1024:.2f} GiB"
            f" (driver), {doc['finished']:,} finished, {doc['span_s']:,.0f} s simulated"
            + (
                f"; step log streamed: {doc['spans']:,} spans, {doc['series_rows']:,} series rows, "
                f"{doc['steps_series_mib']:,.0f} MiB of Parquet"
                if "spans" in doc
                else ""
            )
        )
    base = next(iter(results), "")
    ref = np.load(results[base]) if base else {}
    for mode, path in results.items():
        if mode == base:
            continue
        other = np.load(path)
        same = all(np.array_equal(ref[k], other[k], equal_nan=k != "replica") for k in ("first", "finish", "replica"))
        print(f"{mode} == {base} bit for bit (first token, finish, replica): {same}")
        if not same:
            raise SystemExit(f"{mode} differs from {base}")
    if args.hierarchy_requests > 0:  # 0: skip
        session = (args.session_zipf, args.session_max_turns, args.session_gap)
        for rate in (float(r) for r in args.hierarchy_rates.split(",")):
            if args.hierarchy_arrivals == "sessions":
                print(
                    f"sessions on flat and hierarchical routers: {args.hierarchy_requests:,} requests on "
                    f"{args.hierarchy_replicas} replicas at {rate:g} requests/s per replica (zipf {session[0]:g}, "
                    f"at most {session[1]:,} turns, {session[2]:g} s apart)"
                )
                hierarchy_sessions(args.hierarchy_requests, args.hierarchy_replicas, [32, 16, 8], rate, session)
                continue
            print(
                f"hierarchical vs flat least outstanding: {args.hierarchy_requests:,} requests on "
                f"{args.hierarchy_replicas} replicas at {rate:g} requests/s per replica ({args.hierarchy_arrivals})"
            )
            hierarchy(args.hierarchy_requests, args.hierarchy_replicas, [32, 16, 8], rate, args.hierarchy_arrivals)
    print(json.dumps({"workdir": str(tmp)}))


if __name__ == "__main__":
    main()
