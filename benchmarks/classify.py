"""Benchmark ``rooftrace classify`` on ~10,000,000 block accesses, capacity curve included.

Target (issue 3): <= 10 s and <= 2 GB peak RSS on the project's 2-core VM.

The input is a synthetic day of agent sessions: each session starts from one of 16 shared system
prompts, and each turn re-sends the previous turn's blocks plus new ones (Mooncake-style log hash
chains, 512-token blocks), or, with ``--source session``, only session ids (chains are then
reconstructed). A child process writes the input store, so its memory does not count in the
figures; this process then times the whole stage (read, chains, stack distances, curve, tables,
atomic writes) after compiling the numba kernels on a tiny input (their compile time is printed
separately; numba caches it on disk).

    python benchmarks/classify.py [--accesses 10000000] [--source log|session] [--capacity 2M]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

TURNS = 10
SYSTEM_BLOCKS = 4
NEW_BLOCKS_PER_TURN = 7
BLOCK = 512
DAY = "2024-05-01"
T0_US = 1_714_521_600_000_000


def session_blocks() -> int:
    """Prompt blocks one session touches over its turns."""
    return sum(SYSTEM_BLOCKS + NEW_BLOCKS_PER_TURN * (k + 1) for k in range(TURNS))


def generate(root: Path, accesses: int, source: str, seed: int = 3) -> None:
    from pipeline.common.schemas import write_parquet
    from pipeline.ingest.store import Store

    rng = np.random.default_rng(seed)
    n_sess = max(1, accesses // session_blocks())
    n = n_sess * TURNS
    sess = np.repeat(np.arange(n_sess), TURNS)
    turn = np.tile(np.arange(TURNS), n_sess)
    blocks = SYSTEM_BLOCKS + NEW_BLOCKS_PER_TURN * (turn + 1)
    start = rng.uniform(0, 86_400 - TURNS * 60, n_sess)
    arrival = T0_US + ((start[sess] + turn * rng.uniform(5, 60, n)) * 1e6).astype(np.int64)
    tokens = blocks * BLOCK - rng.integers(0, BLOCK, n)
    # hash ids: system prompt ids, then per session a running sequence of fresh ids
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(blocks, out=offsets[1:])
    pos = np.arange(offsets[-1]) - np.repeat(offsets[:-1], blocks)
    owner = np.repeat(np.arange(n), blocks)
    system = rng.integers(0, 16, n_sess)[sess[owner]]
    ids = np.where(
        pos < SYSTEM_BLOCKS,
        system * SYSTEM_BLOCKS + pos,
        1000 + sess[owner].astype(np.int64) * 10_000 + pos,
    ).astype(np.uint64)
    null_list = pa.nulls(n, pa.list_(pa.uint64()))
    table = pa.table(
        {
            "request_id": pa.array([f"s{s}-t{t}" for s, t in zip(sess, turn, strict=True)]),
            "arrival": pa.array(arrival, pa.timestamp("us", tz="UTC")),
            "model": pa.array(["bench-model"] * n),
            "recorded_input_tokens": pa.array(tokens, pa.int64()),
            "output_tokens": pa.array(rng.integers(50, 600, n), pa.int64()),
            "source_format": pa.array(["mooncake"] * n),
            "source_file": pa.array(["bench.jsonl"] * n),
            "source_line": pa.array(np.arange(1, n + 1), pa.int64()),
            "tenant": pa.array([f"t{s % 7}" for s in sess]),
            "session_id": pa.array([f"sess{s}" for s in sess] if source == "session" else [None] * n, pa.string()),
            "adapter": pa.nulls(n, pa.string()),
            "reported_cache_hit_tokens": pa.nulls(n, pa.int64()),
            "cache_write_tokens": pa.nulls(n, pa.int64()),
            "reasoning_tokens": pa.nulls(n, pa.int64()),
            "prefix_block_hashes": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
            if source == "log"
            else null_list,
            "prefix_block_size": pa.array([BLOCK if source == "log" else None] * n, pa.int32()),
            "ttft_s": pa.nulls(n, pa.float64()),
            "e2e_s": pa.nulls(n, pa.float64()),
            "status": pa.nulls(n, pa.string()),
        }
    )
    store = Store(root)
    write_parquet(table, store.requests_dir / f"date={DAY}" / "part-0.parquet", "requests")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", type=int, default=10_000_000)
    ap.add_argument("--source", choices=["log", "session"], default="log")
    ap.add_argument("--capacity", default="2M", help="cache size (tokens or bytes); the curve covers all")
    ap.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        generate(args.generate, args.accesses, args.source)
        return

    with tempfile.TemporaryDirectory(prefix="rooftrace-bench-") as tmp:
        root = Path(tmp) / "store"
        t = time.perf_counter()
        cmd = [sys.executable, __file__, "--generate", str(root), "--accesses", str(args.accesses)]
        subprocess.run([*cmd, "--source", args.source], check=True)
        print(f"input written in {time.perf_counter() - t:.1f} s (child process, not counted)")

        import polars as pl

        from pipeline.classify import prefix
        from pipeline.classify.accounting import classify_tokens
        from pipeline.ingest.store import Store

        t = time.perf_counter()
        tiny = np.array([1, 2, 1], dtype=np.uint64)
        prefix.lru_stack_distances(tiny)
        one = pl.DataFrame(
            {"request_id": ["a"], "arrival": [0], "model": ["m"], "session_id": ["s"],
             "recorded_input_tokens": [1000], "output_tokens": [1], "tenant": [None], "adapter": [None]},
            schema_overrides={"arrival": pl.Datetime("us", "UTC"), "tenant": pl.String, "adapter": pl.String},
        )  # fmt: skip
        prefix.build_chains(one, 16)
        print(f"numba kernels ready in {time.perf_counter() - t:.2f} s (compile or disk cache)")

        rss0 = peak_rss_mib()
        cpu0 = cpu_s()
        t = time.perf_counter()
        out = classify_tokens(Store(root), capacity=args.capacity)
        wall = time.perf_counter() - t
        cpu = cpu_s() - cpu0
        tot = out.totals
        curve = pl.read_parquet(out.paths["cache_curve"])
        touches = tot["prefix_source"]
        n_blocks = int(pl.read_parquet(out.paths["requests"])["prefix_blocks"].sum())
        print(f"requests: {tot['requests']:,}  prefix sources: {touches}")
        print(f"block accesses (prompt blocks): {n_blocks:,}  curve points: {curve.height}")
        unbounded = curve.filter(pl.col("capacity_blocks").is_null())["token_hit_fraction"][0]
        sim = tot["simulated"]["token_hit_fraction"]
        print(f"simulated token hit fraction at {tot['capacity']}: {sim:.4f}; unbounded: {unbounded:.4f}")
        print(f"classify wall time: {wall:.2f} s  ({n_blocks / wall / 1e6:.2f} M block accesses/s)")
        print(f"classify CPU time: {cpu:.2f} s (user + system; the wall time includes waiting for a shared CPU)")
        print(f"peak RSS: {peak_rss_mib():.0f} MiB (before the stage: {rss0:.0f} MiB)")


if __name__ == "__main__":
    main()
