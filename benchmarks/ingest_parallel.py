"""Parallel ingest: a day split over several log files, read by 1 and by N worker processes
(``rooftrace ingest --jobs N``), in alternating rounds on fresh stores.

By default the files are OpenAI-style JSON Lines, which DuckDB parses (on every core it has for
a large file; a small one on a reader thread while the previous file is normalised), so a serial
run already keeps more than one core busy. ``--format`` writes the day in another synth format
instead; the formats whose reader parses in Python, so that a serial run is bound to one core,
are ``otel`` (``json.loads`` per line), ``litellm``, ``azure``, ``vidur`` and ``csv`` (Python's
``csv`` module; ``csv`` and ``jsonl`` are generic files read through the mapping synth writes).
``--bad-lines K`` inserts K malformed lines in each file (the first half of a record, as a
truncated write leaves it; in a CSV file, a record with one field too many): a JSON Lines file
then fails DuckDB's fast path and is read again by the line-by-line robust path, which
quarantines the bad lines. ``--bad-at`` says where they go: spread evenly through the file
(default), at its start (the fast path fails at once) or at its end (it fails after parsing the
whole file, as with a last line cut short by a crash).

With ``--files 1`` the day is one file, which ``--jobs N`` splits at line boundaries into
pieces read by the workers (pipeline.ingest.core.SPLIT_MIN_BYTES, PIECE_BYTES; JSON Lines
formats only: another format's single file is read by one worker). With ``--gzip`` the files
are gzip-compressed first (rotated production logs; the serial run reads the next compressed
file ahead, so on 2 cores workers gained nothing there: docs/ingest.md, "What it buys").

Prints, for each round, the wall time of each mode (inside its own process, interpreter start
excluded, worker start included), its CPU seconds (its workers included) and the load average;
then the medians, the speed-up and the CPU cost of the workers. Checks that both stores hold
byte-identical request Parquet files and the same quarantine and manifest rows (the time of the
run aside), and that every inserted bad line was quarantined. On a shared machine, each run's
line also gives the cores other processes kept busy during it (from /proc/stat), and
``--settle CORES`` waits before each run until they keep fewer than CORES busy.

    python benchmarks/ingest_parallel.py [--files 8] [--requests 1000000] [--jobs 2] [--rounds 3]
        [--gzip] [--format openai] [--bad-lines 0] [--bad-at spread] [--settle CORES]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import run_child

from pipeline.synth import SYNTH_FORMATS

#: Synth formats written as CSV (a header line, then one record per line).
CSV_FORMATS = frozenset({"azure", "vidur", "litellm", "csv"})
#: Generic formats, read through the column mapping synth writes beside each file.
MAPPED_FORMATS = frozenset({"csv", "jsonl", "parquet"})
#: Formats whose timestamps are relative to the trace start: ingest needs the day (--date).
RELATIVE_FORMATS = frozenset({"mooncake", "vidur"})
#: The day synth starts its arrivals on (SynthConfig.date), the anchor of relative timestamps.
SYNTH_DATE = "2025-01-15"
#: OTLP lines written by synth hold this many spans (requests) each.
OTEL_SPANS_PER_LINE = 100
#: A run during which other processes kept fewer cores than this busy counts as quiet.
QUIET_CORES = 0.2
#: Columns that name the run, not the data: left out of the quarantine and manifest comparison.
RUN_COLUMNS = ("ingested_at",)


def digest(store: Path) -> dict[str, str]:
    """SHA-256 of each request Parquet file of ``store``, by its path in the store."""
    return {
        str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((store / "requests").rglob("*.parquet"))
    }


def side_rows(store: Path) -> dict[str, list[dict[str, Any]]]:
    """The quarantine and manifest rows of ``store`` (by file), less the columns naming the run."""
    files = [*sorted((store / "quarantine").glob("*.parquet")), store / "manifest.parquet"]
    out: dict[str, list[dict[str, Any]]] = {}
    for p in files:
        if p.exists():
            table = pq.read_table(p)
            out[str(p.relative_to(store))] = table.drop_columns(
                [c for c in RUN_COLUMNS if c in table.column_names]
            ).to_pylist()
    return out


def busy_seconds() -> float | None:
    """CPU seconds every process of the machine has used since boot (Linux's /proc/stat: user,
    nice, system, irq, softirq and steal time), or None where there is no /proc/stat."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def own_seconds() -> float:
    """CPU seconds of this process and its waited-for children (and theirs)."""
    use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in use)


def run_measured(code: str) -> tuple[float, dict[str, Any], float | None]:
    """``run_child(code)``; returns (its peak RSS MiB, RESULT, the cores other processes of the
    machine kept busy on average meanwhile, or None where that cannot be read)."""
    busy0, own0, t0 = busy_seconds(), own_seconds(), time.perf_counter()
    _, rss, doc = run_child(code)
    busy1, own1, wall = busy_seconds(), own_seconds(), time.perf_counter() - t0
    if busy0 is None or busy1 is None:
        return rss, doc, None
    return rss, doc, max(0.0, busy1 - busy0 - (own1 - own0)) / wall


def settle(cores: float, patience: float = 120.0, window: float = 2.0) -> str:
    """Wait until the machine has fewer than ``cores`` cores busy (with other work: this process
    is idle meanwhile), measured over ``window`` seconds, for at most ``patience`` seconds.
    Returns what was waited, for the round's line."""
    t0 = time.perf_counter()
    while True:
        before = busy_seconds()
        time.sleep(window)
        after = busy_seconds()
        if before is None or after is None:
            return ""
        now = (after - before) / window
        waited = time.perf_counter() - t0
        if now < cores:
            return f", settled {waited:.0f} s" if waited > window * 1.5 else ""
        if waited >= patience:
            return f", NOT settled ({now:.2f} cores busy after {waited:.0f} s)"


def extension(fmt: str) -> str:
    """The file suffix synth's ``fmt`` is written under (one ingest finds in a folder)."""
    return "csv" if fmt in CSV_FORMATS else "parquet" if fmt == "parquet" else "jsonl"


def bad_positions(records: int, count: int, where: str) -> list[int]:
    """Indices among ``records`` records before which the ``count`` bad lines go, ascending."""
    if where == "start":
        return [0] * count
    if where == "end":
        return [records] * count
    return [(j + 1) * records // (count + 1) for j in range(count)]


def insert_bad_lines(path: Path, count: int, where: str, csv_file: bool) -> None:
    """Rewrite ``path`` with ``count`` malformed lines among its records, each made from the
    record it precedes (the last record for one at the end)."""
    lines = path.read_bytes().split(b"\n")
    if lines[-1] != b"":
        raise SystemExit(f"{path}: expected a file ending in a newline")
    head, body = (lines[:1], lines[1:-1]) if csv_file else ([], lines[:-1])
    out: list[bytes] = []
    at = 0
    for pos in bad_positions(len(body), count, where):
        out += body[at:pos]
        at = pos
        model = body[min(pos, len(body) - 1)]
        out.append(model + b",x" if csv_file else model[: len(model) // 2])
    out += body[at:]
    path.write_bytes(b"\n".join([*head, *out, b""]))


def report(
    args: argparse.Namespace,
    total: int,
    times: dict[int, list[float]],
    cpus: dict[int, list[float]],
    others: dict[int, list[float | None]],
    loads: list[float],
) -> None:
    """Print the medians of each mode, the speed-up, the workers' CPU cost, and the speed-up of
    each round beside what other processes took meanwhile (the rounds they left alone apart)."""
    one, many = statistics.median(times[1]), statistics.median(times[args.jobs])
    cpu_one, cpu_many = statistics.median(cpus[1]), statistics.median(cpus[args.jobs])
    print(
        f"median --jobs 1: {one:.2f} s, {cpu_one:.1f} CPU-s ({cpu_one / one:.2f} cores) = {total / one:,.0f} req/s; "
        f"--jobs {args.jobs}: {many:.2f} s, {cpu_many:.1f} CPU-s ({cpu_many / many:.2f} cores) "
        f"= {total / many:,.0f} req/s"
    )
    print(
        f"speed-up {one / many:.2f}x; the workers cost {cpu_many - cpu_one:+.1f} CPU-s "
        f"({cpu_many / cpu_one:.2f}x the serial CPU); load average {min(loads):.2f}-{max(loads):.2f} "
        f"(1-min, after each run; {os.cpu_count()} cores)"
    )
    rounds = list(zip(times[1], times[args.jobs], others[1], others[args.jobs], strict=True))
    if any(a is None or b is None for *_, a, b in rounds):
        return
    taken = [max(a or 0.0, b or 0.0) for *_, a, b in rounds]
    ups = [t1 / tn for t1, tn, *_ in rounds]
    print(
        "speed-up by round: " + ", ".join(f"{u:.2f}x (others {o:.2f} cores)" for u, o in zip(ups, taken, strict=True))
    )
    quiet = [u for u, o in zip(ups, taken, strict=True) if o < QUIET_CORES]
    if quiet:
        print(
            f"quiet rounds (other processes under {QUIET_CORES} cores in both runs): {len(quiet)} of "
            f"{len(rounds)}, median speed-up {statistics.median(quiet):.2f}x"
        )
    else:
        print(f"no quiet round (other processes under {QUIET_CORES} cores in both runs): try --settle, more --rounds")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--requests", type=int, default=1_000_000, help="requests in all, over the files")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gzip", action="store_true", help="gzip the log files (level 1) before ingest")
    ap.add_argument(
        "--format",
        dest="fmt",
        choices=SYNTH_FORMATS,
        default="openai",
        help="synth format of the files (default openai; otel, litellm, azure, vidur and csv parse in Python)",
    )
    ap.add_argument("--bad-lines", type=int, default=0, help="malformed lines inserted in each file")
    ap.add_argument(
        "--bad-at",
        choices=("spread", "start", "end"),
        default="spread",
        help="where the bad lines go in each file (default: spread evenly)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        metavar="CORES",
        help="before each run, wait (up to 2 min) until other processes keep fewer than CORES cores busy",
    )
    ap.add_argument("--workdir", default="/tmp/rooftrace-bench-ingest-parallel")
    args = ap.parse_args()
    if min(args.files, args.requests, args.jobs, args.rounds) < 1 or args.bad_lines < 0:
        ap.error("--files, --requests, --jobs and --rounds must be at least 1, --bad-lines at least 0")
    if args.requests < args.files:
        ap.error("--requests must be at least --files (one request per file)")
    if args.fmt == "parquet" and (args.gzip or args.bad_lines):
        ap.error("--format parquet takes neither --gzip (Parquet compresses itself) nor --bad-lines")
    return args


def synth(args: argparse.Namespace, logs: Path, work: Path) -> tuple[int, Path | None]:
    """Write the day's files under ``logs``. Returns (requests per file, the column mapping of a
    generic format, kept outside ``logs`` so that ingest does not list it among skipped files)."""
    per = args.requests // args.files
    ext = extension(args.fmt)
    wall, _, _ = run_child(
        "from pathlib import Path; from pipeline.synth import SynthConfig, generate, write_logs\n"
        f"for i in range({args.files}):\n"
        f"    write_logs(generate(SynthConfig(requests={per}, seed=100 + i)), {args.fmt!r},"
        f" Path({str(logs)!r}) / f'part-{{i:03d}}.{ext}')"
    )
    mapping: Path | None = None
    for p in sorted(logs.glob("*.mapping.toml")):
        if mapping is None:
            mapping = p.rename(work / "mapping.toml")  # the same mapping for every file
        else:
            p.unlink()
    if args.bad_lines:
        for p in sorted(logs.iterdir()):
            insert_bad_lines(p, args.bad_lines, args.bad_at, args.fmt in CSV_FORMATS)
    if args.gzip:
        for p in sorted(logs.iterdir()):
            with gzip.open(p.with_name(p.name + ".gz"), "wb", compresslevel=1) as out:
                out.write(p.read_bytes())
            p.unlink()
    size = sum(p.stat().st_size for p in logs.iterdir()) / 1e6
    kind = " gzipped" if args.gzip else ""
    bad = f", {args.bad_lines} bad line(s) per file ({args.bad_at})" if args.bad_lines else ""
    lines = "" if args.fmt != "otel" else f" in {-(-per // OTEL_SPANS_PER_LINE):,} OTLP lines each"
    print(
        f"synth: {args.files} {args.fmt} files x {per:,} requests{lines} = {per * args.files:,} requests, "
        f"{size:,.0f} MB{kind}{bad} ({wall:.1f} s)"
    )
    return per, mapping


def ingest_code(args: argparse.Namespace, logs: Path, store: Path, mapping: Path | None, jobs: int) -> str:
    """A child's code: ingest ``logs`` into ``store``, timed, leaving its figures in RESULT."""
    fmt = args.fmt if args.fmt in MAPPED_FORMATS else None  # a named format is detected, as ingest does
    date = SYNTH_DATE if args.fmt in RELATIVE_FORMATS else None
    where = str(mapping) if mapping is not None else None
    return (
        "import resource, time; from pathlib import Path; from pipeline.ingest import ingest_logs\n"
        "from pipeline.ingest.store import Store\n"
        "def cpu():  # this process and its waited-for workers\n"
        "    use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]\n"
        "    return sum(u.ru_utime + u.ru_stime for u in use)\n"
        f"where = {where!r}\n"
        "t0, c0 = time.perf_counter(), cpu()\n"
        f"s = ingest_logs([Path({str(logs)!r})], Store(Path({str(store)!r})), fmt={fmt!r}, date={date!r},\n"
        f"                mapping=Path(where) if where else None, jobs={jobs})\n"
        "RESULT = {'seconds': time.perf_counter() - t0, 'cpu': cpu() - c0, 'stored': s.total('rows_stored'),\n"
        "          'quarantined': s.total('rows_quarantined'), 'errors': s.errors,\n"
        "          'formats': sorted({str(f.source_format) for f in s.files})}"
    )


def main() -> None:
    args = parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(parents=True)
    per, mapping = synth(args, logs, work)
    modes = (1, args.jobs)
    times: dict[int, list[float]] = {j: [] for j in modes}
    cpus: dict[int, list[float]] = {j: [] for j in modes}
    others: dict[int, list[float | None]] = {j: [] for j in modes}  # cores other processes kept busy
    loads: list[float] = []
    stores: dict[int, Path] = {}
    quarantined: dict[int, int] = {}
    for r in range(args.rounds):
        for jobs in modes:
            store = work / f"store-j{jobs}-{r}"
            waited = settle(args.settle) if args.settle is not None else ""
            rss, doc, busy = run_measured(ingest_code(args, logs, store, mapping, jobs))
            if doc["errors"]:
                raise SystemExit(f"--jobs {jobs}: ingest failed: {doc['errors'][0]}")
            load = os.getloadavg()[0]
            loads.append(load)
            times[jobs].append(doc["seconds"])
            cpus[jobs].append(doc["cpu"])
            others[jobs].append(busy)
            quarantined[jobs] = doc["quarantined"]
            print(
                f"round {r + 1}: --jobs {jobs}: {doc['seconds']:.2f} s, {doc['cpu']:.1f} CPU-s "
                f"({doc['cpu'] / doc['seconds']:.2f} cores busy), {doc['stored']:,} rows stored, "
                f"{doc['quarantined']:,} quarantined ({'/'.join(doc['formats'])}), "
                f"parent peak RSS {rss:,.0f} MiB, load {load:.2f}"
                + (f", other processes {busy:.2f} cores" if busy is not None else "")
                + waited
            )
            if jobs in stores:
                shutil.rmtree(store)
            else:
                stores[jobs] = store
    report(args, per * args.files, times, cpus, others, loads)
    same = digest(stores[1]) == digest(stores[args.jobs])
    same_side = side_rows(stores[1]) == side_rows(stores[args.jobs])
    print(f"stores byte-identical: {same}; quarantine and manifest rows identical: {same_side}")
    if not (same and same_side):
        raise SystemExit("parallel and serial stores differ")
    if args.bad_lines and quarantined[1] < args.bad_lines * args.files:
        raise SystemExit(
            f"{quarantined[1]:,} rows quarantined, fewer than the {args.bad_lines * args.files:,} bad lines"
        )


if __name__ == "__main__":
    main()
