"""Where the configurations' searches run: local processes or a Ray cluster (optional extra)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

from pipeline.common.errors import RooftraceError
from pipeline.engine.jitcache import await_compile_ahead
from pipeline.engine.shard import ray_connect
from pipeline.plan.search import CandidateResult, Task, search_candidate


def run_local(tasks: Sequence[Task], jobs: int, progress: Callable[[str], None] | None) -> list[CandidateResult]:
    """Configurations in parallel processes (each replay is single-threaded Python + numpy)."""
    if jobs <= 1 or len(tasks) <= 1:
        out = []
        for t in tasks:
            out.append(search_candidate(t))
            if progress:
                progress(_progress_line(out[-1]))
        return out
    results: list[CandidateResult | None] = [None] * len(tasks)
    await_compile_ahead()  # the workers load the engine the command's compile ahead is compiling
    # spawn, not fork: the parent has started polars' and numba's thread pools, and a forked child
    # can inherit one of their locks held (polars documents fork as unsafe for that reason).
    ctx = multiprocessing.get_context("spawn")
    workers = min(jobs, len(tasks))
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(search_candidate, t): i for i, t in enumerate(tasks)}
            for fut in as_completed(futures):
                results[futures[fut]] = r = fut.result()
                if progress:
                    progress(_progress_line(r))
    except BrokenProcessPool:
        # a worker died without a Python error: on Linux the kernel's OOM killer, most often
        done = sum(r is not None for r in results)
        raise RooftraceError(
            f"plan: a worker process died after {done} of {len(tasks)} configurations (killed from outside, most "
            f"often for memory: {workers} workers each replay the window in memory); run again with fewer "
            "--jobs, a shorter --window, or fewer configurations"
        ) from None
    return [r for r in results if r is not None]


def run_ray(
    tasks: Sequence[Task], address: str | None, progress: Callable[[str], None] | None
) -> list[CandidateResult]:
    """Configurations as Ray tasks on an existing cluster (``ray.init(address=...)``); ``ray`` is
    the optional extra ``rooftrace[ray]`` and is imported only here."""
    ray = ray_connect(address)
    remote = ray.remote(search_candidate)
    refs = [remote.remote(t) for t in tasks]
    results: list[CandidateResult] = ray.get(refs)
    if progress:
        for r in results:
            progress(_progress_line(r))
    return results


def _progress_line(r: CandidateResult) -> str:
    if r.skipped:
        return f"  {r.candidate.label}: {r.note}"
    if not r.fits:
        return f"  {r.candidate.label}: does not fit ({r.note})"
    if r.replicas is None:
        return f"  {r.candidate.label}: SLO not met ({r.note}); {len(r.evaluations)} replays"
    pools = r.chosen.pools if r.chosen is not None else {}
    split = f" ({pools['prefill_replicas']}P + {pools['decode_replicas']}D)" if pools else ""
    line = f"  {r.candidate.label}: {r.replicas} replicas{split} after {len(r.evaluations)} replays"
    return f"{line}; {r.note}" if r.note else line
