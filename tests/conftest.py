from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


#: Set in the test workers' environment while the engine compiles in the background: a file
#: whose exclusive lock the compiling process holds until it exits.
ENGINE_LOCK_ENV = "ROOFTRACE_TEST_ENGINE_LOCK"

#: Modules that run first under pytest-xdist because none of their tests replays or starts a
#: subprocess: the workers spend the engine's first compile on them. Only a scheduling hint: a
#: test elsewhere, or one of these that starts to replay, waits for the compile instead.
ENGINE_FREE_FIRST = (
    "test_ingest_formats.py", "test_ingest_store.py", "test_engine_cost.py", "test_profile_build.py",
    "test_ingest_bad.py", "test_timeparse.py", "test_ingest_parallel.py", "test_accounting.py",
    "test_validate.py", "test_warehouse_sandbox.py", "test_profile_interp.py", "test_layout.py",
    "test_roofline.py", "test_memory.py", "test_vllm_kv_capacity.py", "test_catalog.py",
    "test_profile_unseen.py", "test_fleet.py", "test_schemas.py", "test_readme.py",
    "test_profile_cost.py", "test_ingest_hostile.py",
)  # fmt: skip

_COMPILER: dict[str, object] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n``), when numba's disk cache lacks the replay engine, compile it
    once in a background process (tests/compile_engine.py) while the workers run the tests that
    need no engine (ENGINE_FREE_FIRST goes first). A worker's first replay, subprocess or Ray
    start waits for that compile and then loads the engine from the cache: otherwise every
    process that replays first would compile it for minutes at the same time."""
    if hasattr(config, "workerinput"):
        _wait_for_compile_before_use()
        return
    if not getattr(config.option, "numprocesses", None):
        return
    from pipeline.replay.limits import jit_compile_needed

    if not jit_compile_needed():
        return
    import fcntl
    import subprocess
    import sys
    import tempfile

    fd, lock = tempfile.mkstemp(prefix="rooftrace-engine-compile-")
    fcntl.flock(fd, fcntl.LOCK_EX)  # held by the child (same open file) until it exits
    script = Path(__file__).with_name("compile_engine.py")
    _COMPILER["proc"] = subprocess.Popen([sys.executable, str(script)], pass_fds=(fd,))
    _COMPILER["lock"] = lock
    os.close(fd)
    os.environ[ENGINE_LOCK_ENV] = lock


def pytest_unconfigure(config: pytest.Config) -> None:
    import subprocess

    proc = _COMPILER.pop("proc", None)
    if isinstance(proc, subprocess.Popen):
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        Path(str(_COMPILER.pop("lock"))).unlink(missing_ok=True)
        os.environ.pop(ENGINE_LOCK_ENV, None)


def _await_engine() -> None:
    """Block until the background compile has finished (at once when there is none)."""
    import fcntl

    lock = os.environ.pop(ENGINE_LOCK_ENV, None)
    if not lock:
        return
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def _wait_for_compile_before_use() -> None:
    """In a worker: the compiled loop, and every subprocess (a CLI run, Chromium, Ray's own
    processes), first wait for the background compile."""
    if not os.environ.get(ENGINE_LOCK_ENV):
        return
    import subprocess

    from pipeline.engine import _jit_kernels

    kernel = _jit_kernels.run_fleet

    def run_fleet(*args: object) -> object:
        _await_engine()
        return kernel(*args)

    _jit_kernels.run_fleet = run_fleet
    popen_init = subprocess.Popen.__init__

    def init(self: subprocess.Popen[object], *args: object, **kwargs: object) -> None:
        _await_engine()
        popen_init(self, *args, **kwargs)  # type: ignore[arg-type]

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Engine-free modules first (stable, so the same order in every worker)."""
    if not getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    rank = {name: i for i, name in enumerate(ENGINE_FREE_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test when the shared data is not laid out beside us."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not available: {path}")
    return path


@pytest.fixture(scope="session")
def replayed_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, str]:
    """A small synthetic day taken through ingest, classify and replay on the default fleet, built
    once per worker and never written to afterwards: tests take a copy (:func:`replayed_store`,
    or :func:`copy_replayed` in a module-scoped fixture), so no test writes into a store that
    another test reads, whatever the order. One tenant is named like a script tag, to check
    escaping end to end."""
    import polars as pl

    from pipeline.classify.accounting import classify_tokens
    from pipeline.ingest import ingest_logs
    from pipeline.ingest.store import Store
    from pipeline.replay.run import replay
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
    from pipeline.publish.nightly import write_load_curve

    write_load_curve(store, result, None, store.resolve_date(None), "chat", 120.0, lambda _m: None)
    return store, result.run_id


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def own_copy(store: Any, tmp_path: Path) -> Any:
    """A test's own copy of a module's shared store (``tmp_path / "store"``), for a test that writes
    into it (replay, classify, plan, cost, report): the module's store stays as its fixture made
    it, whatever order the tests run in."""
    import shutil

    from pipeline.ingest.store import Store

    return Store(shutil.copytree(store.root, tmp_path / "store", symlinks=True))


def copy_replayed(template: tuple[object, str], dest: Path) -> tuple[object, str]:
    """A private copy of :func:`replayed_template`'s store at ``dest`` (which must not exist)."""
    import shutil

    from pipeline.ingest.store import Store

    src, run_id = template
    assert isinstance(src, Store)
    shutil.copytree(src.root, dest, symlinks=True)
    return Store(dest), run_id


@pytest.fixture
def replayed_store(replayed_template: tuple[object, str], tmp_path: Path) -> Iterator[tuple[object, str]]:
    """This test's own copy of the replayed store (write to it freely). The template is checked
    after the test: a test that wrote into it (instead of its copy) fails here, naming the files."""
    src, _ = replayed_template
    root: Path = src.root  # type: ignore[attr-defined]
    before = _listing(root)
    yield copy_replayed(replayed_template, tmp_path / "replayed-store")
    after = _listing(root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"a test wrote into the shared replayed template: {changed[:5]}"


EVIL_TENANT = "<script>alert(1)</script>"


def _shared_data_line() -> str:
    found = "found" if SHARED.is_dir() else "not found: the tests that need it skip"
    return f"public data (${SHARED_ENV}): {SHARED} ({found})"


def pytest_report_header(config: pytest.Config) -> str:
    return _shared_data_line()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The shared-data line under ``-q`` too (pyproject's addopts): pytest shows report headers
    only at normal verbosity, and the README promises that the run's header names the folder."""
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if hasattr(config, "workerinput") or reporter is None or config.get_verbosity() >= 0:
        return
    reporter.write_line(_shared_data_line())


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """What the regression guard (tests/test_validation_guard.py) found better than its baseline:
    a passing test says so through its ``validation_guard`` property (it crosses pytest-xdist's
    workers with the report), listed here so an improvement is seen and recorded."""
    lines = [
        str(value)
        for report in terminalreporter.stats.get("passed", [])
        for name, value in getattr(report, "user_properties", ())
        if name == "validation_guard"
    ]
    if lines:
        terminalreporter.section("validation guard: better than the baseline")
        for line in lines:
            terminalreporter.write_line(line)
