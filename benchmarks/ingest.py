"""Ingest throughput: a 1,000,000-line OpenAI-style JSONL (made by synth) into a fresh store.

Prints rows/s and peak RSS of the ingest process, and, in the same run, DuckDB's plain
``read_json`` -> Parquet copy of the same file as the baseline (alternating rounds, medians).
Targets (issue 2): at least 500,000 rows/s, and no slower than 2x the DuckDB copy.

    python benchmarks/ingest.py [--requests 1000000] [--workdir /tmp/rooftrace-bench]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import run_child


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--workdir", default="/tmp/rooftrace-bench-ingest")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timed rounds (medians compared)")
    ap.add_argument("--input", help="an existing synth OpenAI JSONL to use instead of making one (kept)")
    args = ap.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.input:
        src = Path(args.input).resolve()
        with open(src, "rb") as fh:
            args.requests = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 24), b""))
        print(f"input: {src}, {args.requests:,} lines, {src.stat().st_size / 1e6:,.0f} MB")
    else:
        src = work / "openai.jsonl"
        wall, _, _ = run_child(
            "from pathlib import Path; from pipeline.synth import SynthConfig, generate, write_logs;"
            f"write_logs(generate(SynthConfig(requests={args.requests}, seed=1)), 'openai', Path({str(src)!r}))"
        )
        size_mb = src.stat().st_size / 1e6
        print(f"synth: {args.requests:,} OpenAI-style lines, {size_mb:,.0f} MB, written in {wall:.1f} s")

    # Both are timed inside their own process (interpreter start and imports excluded), in
    # alternating rounds on a fresh store each time; the medians are compared.
    duck_s: list[float] = []
    ing_s: list[float] = []
    scan_s: list[float] = []
    scan_cpu: list[float] = []
    ing_cpu: list[float] = []
    duck_rss = ing_rss = 0.0
    # The floor: DuckDB's scan of exactly the fields ingest reads (the OpenAI layout's projection,
    # every leaf as text), with nothing done to the rows. Its CPU time bounds ingest's rate.
    scan = (
        "import time, duckdb\n"
        "from pipeline.ingest.formats import FORMATS, duckdb_columns, project_sql\n"
        "spec = FORMATS['openai']; con = duckdb.connect(); con.execute('SET enable_progress_bar = false')\n"
        "t0, c0 = time.perf_counter(), time.process_time()\n"
        "q = (f'SELECT {project_sql(spec.fields)} FROM read_json(?, format=\\'newline_delimited\\', '\n"
        "     f'records=true, columns={duckdb_columns(spec.layout)})')\n"
        f"n = sum(b.num_rows for b in con.sql(q, params=[{str(src)!r}]).to_arrow_reader(100_000))\n"
        "RESULT = {'seconds': time.perf_counter() - t0, 'cpu': time.process_time() - c0, 'rows': n}"
    )
    for r in range(args.rounds):
        _, rss, duck = run_child(
            "import time, duckdb; t0 = time.perf_counter()\n"
            'duckdb.sql("COPY (SELECT * FROM read_json('
            f"'{src}', format='newline_delimited')) TO '{work / 'duck.parquet'}' (FORMAT parquet)\")\n"
            "RESULT = {'seconds': time.perf_counter() - t0}"
        )
        duck_s.append(duck["seconds"])
        duck_rss = max(duck_rss, rss)
        store = work / f"store-{r}"
        _, rss, doc = run_child(
            "import time; from pathlib import Path; from pipeline.ingest import ingest_logs\n"
            "from pipeline.ingest.store import Store\n"
            "c0 = time.process_time()\n"
            f"s = ingest_logs([Path({str(src)!r})], Store(Path({str(store)!r})))\n"
            "RESULT = {'stored': s.total('rows_stored'), 'read': s.total('rows_read'), 'seconds': s.seconds,\n"
            "          'cpu': time.process_time() - c0}"
        )
        assert doc["stored"] == args.requests, doc
        ing_s.append(doc["seconds"])
        ing_cpu.append(doc["cpu"])
        ing_rss = max(ing_rss, rss)
        shutil.rmtree(store, ignore_errors=True)
        _, _, floor = run_child(scan)
        assert floor["rows"] == args.requests, floor
        scan_s.append(floor["seconds"])
        scan_cpu.append(floor["cpu"])
        print(
            f"round {r + 1}: duckdb copy {duck_s[-1]:.2f} s, rooftrace ingest {ing_s[-1]:.2f} s "
            f"({ing_cpu[-1]:.2f} CPU-s), "
            f"duckdb scan of the ingested fields {scan_s[-1]:.2f} s ({scan_cpu[-1]:.2f} CPU-s)",
            flush=True,
        )
    duck_med, ing_med = statistics.median(duck_s), statistics.median(ing_s)
    rate = args.requests / ing_med
    print(f"duckdb read_json -> parquet (all columns): median {duck_med:.2f} s, peak RSS {duck_rss:,.0f} MiB")
    cores = os.cpu_count() or 1
    floor_cpu = statistics.median(scan_cpu)
    print(
        f"duckdb scan of the fields ingest reads, nothing else: median {statistics.median(scan_s):.2f} s, "
        f"{floor_cpu:.2f} CPU-s, so at most {args.requests / (floor_cpu / cores):,.0f} rows/s on {cores} CPU(s)"
    )
    print(
        f"rooftrace ingest (parse, validate, dedup, sort, write): median {ing_med:.2f} s, "
        f"{statistics.median(ing_cpu):.2f} CPU-s, "
        f"{rate:,.0f} rows/s, peak RSS {ing_rss:,.0f} MiB"
    )
    print(
        f"ratio ingest / duckdb copy: {ing_med / duck_med:.2f}x (target <= 2x); "
        f"rows/s target >= 500,000: {'met' if rate >= 500_000 else 'NOT met'} on {os.cpu_count()} CPU(s)"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
