"""Scale-out: a day of requests on a large fleet, in one process, in pods, and on Ray.

Three measurements, each in a fresh child process (its own peak RSS):

1. ``flat``: the whole fleet in one engine run (pipeline.engine.jit.simulate_jit);
2. ``pods``: the same fleet cut into pods, replayed one after another in this process
   (pipeline.engine.shard.simulate_sharded, ``--executor local``);
3. ``ray``: the same pods as Ray tasks on a local Ray instance with ``--ray-workers`` CPUs;
4. ``steps`` (not in the default ``--modes``): ``pods`` with the step log kept, streamed pod by
   pod to steps.parquet and series.parquet in a temporary folder (pipeline.replay.RunSteps, what
   ``rooftrace replay --pods`` does), so its peak RSS includes writing the step log;
5. ``store`` (not in the default ``--modes``): the whole command on a store. The same requests are
   written as a Vidur trace, ingested (``rooftrace ingest``), and replayed with
   ``rooftrace replay --pods N``: the store's requests read, every table of the run written
   (requests, steps, series) and the summary computed. Wall time and peak RSS
   of each command's own process (``wait4``).

Round robin is a static router, so all three must give the same per-request results bit for bit
(checked here on first-token time, finish time and replica). Then, on a fleet one process runs
easily, the hierarchical router (a load balancer over pods, least outstanding inside each) against
the flat least-outstanding router: TTFT and TPOT percentiles and their differences.

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


def build(
    n: int, replicas: int, router: str, seed: int = 0, rate: float = 6.0, kind: str = "poisson"
) -> tuple[object, object, object, object]:
    """The workload (``kind`` arrivals, :func:`arrivals`, at ``rate`` requests/s per replica on
    average), the fleet spec, the measured step cost and the resolved fleet (deterministic in
    ``seed``)."""
    from replay import lengths

    from pipeline.engine.model import FleetSpec, Workload
    from pipeline.fleet import parse_fleet, resolve
    from pipeline.profile.cost import step_cost_for

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
    arrival = arrivals(n, rate * fleet.ranks, rng, kind)
    work = Workload(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output)
    spec = FleetSpec(replicas=fleet.ranks, scheduler=sched, router=router, lockstep=fleet.lockstep)
    return work, spec, cost, fleet


def child(mode: str, n: int, replicas: int, pods: int, workers: int, out: str) -> dict[str, float]:
    """One measurement (run in a fresh process by the parent)."""
    from pipeline.engine.jit import simulate_jit
    from pipeline.engine.model import Workload
    from pipeline.engine.shard import simulate_sharded
    from pipeline.replay import RunSteps

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
    from pipeline.slo import percentile

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
        "--hierarchy-arrivals", choices=["poisson", "bursty"], default="poisson",
        help="arrival process of the routing comparison (bursty: busy / quiet periods, BURST_*)",
    )  # fmt: skip
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
        for rate in (float(r) for r in args.hierarchy_rates.split(",")):
            print(
                f"hierarchical vs flat least outstanding: {args.hierarchy_requests:,} requests on "
                f"{args.hierarchy_replicas} replicas at {rate:g} requests/s per replica ({args.hierarchy_arrivals})"
            )
            hierarchy(args.hierarchy_requests, args.hierarchy_replicas, [32, 16, 8], rate, args.hierarchy_arrivals)
    print(json.dumps({"workdir": str(tmp)}))


if __name__ == "__main__":
    main()
