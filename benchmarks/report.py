"""Report build time and size for a 1,000,000-request day.

A real replay of a million requests takes minutes with today's engine, so the run is built by
*tiling*: a real replay of a smaller Azure-conversation-like day (synth -> ingest -> classify ->
replay, default fleet) is repeated back to back in time until the run holds the requested number
of requests. Every table the report reads is tiled the same way (canonical requests, per-request
and per-minute accounting, the run's requests, step spans and per-second series), so the warehouse
queries scan a run of the full size. The figure is the time of ``build_report`` (warehouse rebuild,
every named query, the charts and the HTML; the Vega bundle cache warm) and the HTML size.
Targets (issue 6): <= 10 s and <= 5 MB.

    python benchmarks/report.py [--requests 1000000] [--base 20000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import run_child


def _tile(
    path: Path, copies: int, shift_s: float, time_cols: list[str], sec_cols: list[str], id_cols: list[str]
) -> None:
    """Rewrite a Parquet file as ``copies`` back-to-back copies, keeping its schema metadata."""
    import pyarrow.parquet as pq

    from pipeline.common.schemas import write_parquet

    meta = pq.read_schema(path).metadata
    name = meta[b"rooftrace.schema"].decode()
    base = pl.read_parquet(path)
    parts = []
    for k in range(copies):
        part = base.with_columns(
            *[pl.col(c) + pl.duration(microseconds=int(k * shift_s * 1e6)) for c in time_cols],
            *[(pl.col(c) + (k * shift_s)).cast(base.schema[c]) for c in sec_cols],
            *[pl.col(c) + f"~{k}" for c in id_cols],
        )
        parts.append(part)
    write_parquet(pl.concat(parts).to_arrow(), path, name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--base", type=int, default=20_000, help="requests actually replayed before tiling")
    ap.add_argument("--workdir", default="/tmp/rooftrace-bench-report")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (store, run, report)")
    args = ap.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    copies = max(1, round(args.requests / args.base))
    hours = 24.0 / copies

    wall, rss, res = run_child(
        "from pathlib import Path\n"
        "from pipeline.synth import SynthConfig, generate, write_logs\n"
        "from pipeline.ingest import ingest_logs\n"
        "from pipeline.classify.accounting import classify_tokens\n"
        "from pipeline.replay.run import replay\n"
        "from pipeline.ingest.store import Store\n"
        f"work = Path({str(work)!r})\n"
        f"write_logs(generate(SynthConfig(requests={args.base}, seed=7, duration_s={hours * 3600}, diurnal=False)), "
        "'azure', work / 'logs.csv')\n"
        "store = Store(work / 'store')\n"
        "ingest_logs([work / 'logs.csv'], store)\n"
        "classify_tokens(store)\n"
        "r = replay(store)\n"
        "RESULT = {'run_id': r.run_id}"
    )
    run_id = res["run_id"]
    print(f"base run: {args.base:,} requests replayed in {wall:.1f} s (peak RSS {rss:,.0f} MiB), run {run_id}")

    store_root = work / "store"
    run_dir = store_root / "runs" / run_id
    cfg = json.loads((run_dir / "config.json").read_text())
    span = float(cfg["summary"]["makespan_s"]) + 1.0
    shift = max(span, hours * 3600)
    date_dir = next((store_root / "requests").glob("date=*"))
    _tile(next(date_dir.glob("*.parquet")), copies, shift, ["arrival"], [], ["request_id"])
    acc = store_root / "accounting"
    _tile(next((acc / "requests").glob("date=*/*.parquet")), copies, shift, ["arrival"], [], ["request_id"])
    _tile(next((acc / "minutes").glob("date=*/*.parquet")), copies, shift, ["minute"], [], [])
    _tile(
        run_dir / "requests.parquet",
        copies,
        shift,
        ["arrival"],
        ["arrival_s", "scheduled_s", "first_token_s", "finish_s"],
        ["request_id"],
    )
    _tile(run_dir / "steps.parquet", copies, shift, [], ["start_s", "end_s"], [])
    _tile(run_dir / "series.parquet", copies, shift, ["time"], ["second"], [])
    total = pl.scan_parquet(run_dir / "requests.parquet").select(pl.len()).collect().item()
    steps = pl.scan_parquet(run_dir / "steps.parquet").select(pl.len()).collect().item()
    print(f"tiled x{copies}: {total:,} requests, {steps:,} step spans over {copies * shift / 3600:.1f} h")

    out = work / "report" / "index.html"
    code = (
        "from pathlib import Path\nfrom pipeline.publish.report import build_report, vega_bundle\n"
        "from pipeline.ingest.store import Store\n"
        f"store = Store(Path({str(store_root)!r}))\n"
        "vega_bundle(store.root / '.cache')\n"
        "import time\nt0 = time.perf_counter()\n"
        f"r = build_report(store, {run_id!r}, out=Path({str(out)!r}))\n"
        "RESULT = {'seconds': time.perf_counter() - t0, 'charts': len(r.charts)}"
    )
    wall, rss, res = run_child(code)
    size = out.stat().st_size
    print(
        f"report: {res['seconds']:.2f} s in build_report ({res['charts']} charts), HTML {size / 2**20:.2f} MiB, "
        f"peak RSS {rss:,.0f} MiB"
    )
    print(
        f"targets: <= 10 s {'met' if res['seconds'] <= 10 else 'NOT met'}; "
        f"<= 5 MB {'met' if size <= 5e6 else 'NOT met'}"
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
