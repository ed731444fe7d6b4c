from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI (CI=true) replays a fixed set of examples, so a submission's result does not depend on the
# draw; development runs search afresh each time (and ROOFTRACE_HYPOTHESIS_EXAMPLES deepens the
# engine search), which is where new counterexamples are found and turned into regression tests.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

#: The public traces and measurements some tests check against (not part of the repository):
#: $ROOFTRACE_SHARED_DATA, else a ``shared`` folder beside the checkout. Tests that need it skip
#: with the path they looked for, and the run ends with the skips and their reasons (-rs).
SHARED_ENV = "ROOFTRACE_SHARED_DATA"
SHARED = Path(os.environ.get(SHARED_ENV) or Path(__file__).resolve().parents[2] / "shared")
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n``), compile the replay engine once in the controller before the
    workers start, when numba's disk cache lacks it: otherwise every worker that replays first
    compiles it for minutes at the same time (the workers then load it from the cache)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    from pipeline.limits import jit_compile_needed

    if not jit_compile_needed():
        return
    import sys
    import time

    import numpy as np

    from pipeline.engine.jit import simulate_jit
    from pipeline.engine.model import FleetSpec, SchedulerConfig, Workload
    from pipeline.stepcost import affine_cost, scalars

    t0 = time.monotonic()
    sys.stderr.write("conftest: compiling the replay engine once for the test workers\n")
    one = np.ones(2)
    cost = affine_cost(np.zeros((2, 7)), np.zeros((2, 7)), one, one, np.array([True, False]), one, scalars())
    work = Workload(np.zeros(1), np.array([40]), np.array([3]), np.array([7], np.uint64), np.array([0, 1]))
    cfg = SchedulerConfig(num_gpu_blocks=64, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128,
                          block_size=16, enable_chunked_prefill=True, enable_prefix_caching=True)  # fmt: skip
    simulate_jit(work, FleetSpec(replicas=1, scheduler=cfg), cost)
    sys.stderr.write(f"conftest: compiled in {time.monotonic() - t0:.0f} s\n")


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test when the shared data is not laid out beside us."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not available: {path}")
    return path


@pytest.fixture(scope="session")
def replayed_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, str]:
    """A small synthetic day taken through ingest, classify and replay on the default fleet.
    One tenant is named like a script tag, to check escaping end to end."""
    import polars as pl

    from pipeline.classify.accounting import classify_tokens
    from pipeline.ingest import ingest_logs
    from pipeline.replay import replay
    from pipeline.store import Store
    from pipeline.synth import SynthConfig, generate, write_logs

    root = tmp_path_factory.mktemp("replayed")
    frame = generate(SynthConfig(requests=400, seed=11, duration_s=900, tenants=3))
    frame = frame.with_columns(
        tenant=pl.when(pl.col("tenant") == "tenant-2").then(pl.lit(EVIL_TENANT)).otherwise(pl.col("tenant"))
    )
    write_logs(frame, "openai", root / "logs" / "day.jsonl")
    store = Store(root / "store")
    ingest_logs([root / "logs" / "day.jsonl"], store)
    classify_tokens(store)
    result = replay(store)
    # the nightly's headroom stage, so that reports built from this store carry a load curve
    from pipeline.nightly import write_load_curve

    write_load_curve(store, result, None, store.resolve_date(None), "chat", 120.0, lambda _m: None)
    return store, result.run_id


EVIL_TENANT = "<script>alert(1)</script>"


def pytest_report_header(config: pytest.Config) -> str:
    found = "found" if SHARED.is_dir() else "not found: the tests that need it skip"
    return f"public data (${SHARED_ENV}): {SHARED} ({found})"
