"""Parallel ingest: a day split over several OpenAI-style JSONL files, read by 1 and by N worker
processes (``rooftrace ingest --jobs N``), in alternating rounds on fresh stores.

With ``--files 1`` the day is one file, which ``--jobs N`` splits at line boundaries into
pieces read by the workers (pipeline.ingest.core.SPLIT_MIN_BYTES, PIECE_BYTES). With ``--gzip``
the files are gzip-compressed first (rotated production logs): a compressed file is read on
one core (no random access, one decompression stream), so that is where workers gain most.

Prints the wall time of each mode (inside its own process, interpreter start excluded, worker
start included), the speed-up, and checks that both stores hold byte-identical Parquet files.

    python benchmarks/ingest_parallel.py [--files 8] [--requests 1000000] [--jobs 2] [--rounds 3] [--gzip]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import run_child


def digest(store: Path) -> dict[str, str]:
    return {
        str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((store / "requests").rglob("*.parquet"))
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--requests", type=int, default=1_000_000, help="lines in all, over the files")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gzip", action="store_true", help="gzip the log files (level 1) before ingest")
    ap.add_argument("--workdir", default="/tmp/rooftrace-bench-ingest-parallel")
    args = ap.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(parents=True)
    per = args.requests // args.files
    wall, _, _ = run_child(
        "from pathlib import Path; from pipeline.synth import SynthConfig, generate, write_logs\n"
        f"for i in range({args.files}):\n"
        f"    write_logs(generate(SynthConfig(requests={per}, seed=100 + i)), 'openai',"
        f" Path({str(logs)!r}) / f'part-{{i:03d}}.jsonl')"
    )
    if args.gzip:
        for p in sorted(logs.iterdir()):
            with gzip.open(p.with_name(p.name + ".gz"), "wb", compresslevel=1) as out:
                out.write(p.read_bytes())
            p.unlink()
    size = sum(p.stat().st_size for p in logs.iterdir()) / 1e6
    kind = " gzipped" if args.gzip else ""
    print(
        f"synth: {args.files} files x {per:,} lines = {per * args.files:,} lines, {size:,.0f} MB{kind} ({wall:.1f} s)"
    )
    times: dict[int, list[float]] = {1: [], args.jobs: []}
    stores: dict[int, Path] = {}
    for r in range(args.rounds):
        for jobs in (1, args.jobs):
            store = work / f"store-j{jobs}-{r}"
            _, rss, doc = run_child(
                "import resource, time; from pathlib import Path; from pipeline.ingest import ingest_logs\n"
                "from pipeline.store import Store\n"
                "def cpu():  # this process and its waited-for workers\n"
                "    use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]\n"
                "    return sum(u.ru_utime + u.ru_stime for u in use)\n"
                "t0, c0 = time.perf_counter(), cpu()\n"
                f"s = ingest_logs([Path({str(logs)!r})], Store(Path({str(store)!r})), jobs={jobs})\n"
                "RESULT = {'seconds': time.perf_counter() - t0, 'stored': s.total('rows_stored'), 'cpu': cpu() - c0}"
            )
            times[jobs].append(doc["seconds"])
            print(
                f"round {r + 1}: --jobs {jobs}: {doc['seconds']:.2f} s, {doc['cpu']:.1f} CPU-s "
                f"({doc['cpu'] / doc['seconds']:.2f} cores busy), {doc['stored']:,} rows stored, "
                f"parent peak RSS {rss:,.0f} MiB"
            )
            if jobs in stores:
                shutil.rmtree(store)
            else:
                stores[jobs] = store
    same = digest(stores[1]) == digest(stores[args.jobs])
    one, many = statistics.median(times[1]), statistics.median(times[args.jobs])
    print(
        f"median --jobs 1: {one:.2f} s = {per * args.files / one:,.0f} rows/s; "
        f"--jobs {args.jobs}: {many:.2f} s = {per * args.files / many:,.0f} rows/s; speed-up {one / many:.2f}x"
    )
    print(f"stores byte-identical: {same}")
    if not same:
        raise SystemExit("parallel and serial stores differ")


if __name__ == "__main__":
    main()
