"""Where numba keeps the jit engine's compiled loop on disk, and the stamp that says whether that
cache still matches the sources the loop inlines (pipeline/engine/_jit_kernels.py drops a stale
cache when it is imported; pipeline/replay/limits.py reads the stamp to know whether a compile is ahead).
numba itself is imported only to ask where its cache is.

:func:`compile_ahead` starts that compile in a background process as soon as a command knows it
will replay (the first replay in a fresh clone): it compiles while the command reads the store,
builds the workload and prices the estimate's steps (on the other core), and the engine's first
run waits for it (:func:`await_compile_ahead`) and loads the loop from the cache."""

from __future__ import annotations

import atexit
import hashlib
import inspect
import os
import subprocess
import sys
import threading
from pathlib import Path

from pipeline.common import blockhash
from pipeline.costmodel import stepcost


def jit_cache_dir(src: Path | None = None) -> Path:
    """The folder numba caches the compiled loop of ``src`` (default: this package's
    _jit_kernels.py) in: ``$NUMBA_CACHE_DIR`` (numba's own sub-path for the source's folder there)
    when set, else the source's ``__pycache__``."""
    src = src or Path(__file__).resolve().with_name("_jit_kernels.py")
    try:
        from numba.core import config
        from numba.core.caching import _CacheLocator
    except ImportError:  # pragma: no cover - numba is a runtime dependency
        return src.parent / "__pycache__"
    root = getattr(config, "CACHE_DIR", "")
    if root:  # numba's _UserProvidedCacheLocator: CACHE_DIR / its sub-path for the source's folder
        sub = str(_CacheLocator.get_suitable_cache_subpath(str(src)))  # type: ignore[no-untyped-call]
        return Path(str(root)) / sub
    return src.parent / "__pycache__"


def kernel_stamp() -> str:
    """Digest of the sources the compiled loop inlines from other modules (pipeline/costmodel/stepcost.py and
    the block hash, pipeline/common/blockhash.py): numba's disk cache of _jit_kernels.py is keyed
    on that file alone, so a stamp named by this digest sits beside the cache (_jit_kernels drops
    the cache when it is missing; pipeline.replay.limits reads it to know whether a compile is ahead)."""
    source = Path(stepcost.__file__).read_bytes()
    source += "".join(inspect.getsource(f) for f in (blockhash.mix, blockhash.block_hash)).encode()
    return hashlib.sha256(source).hexdigest()[:16]


def compile_needed() -> bool:
    """Whether the compiled loop's disk cache is missing or stale (the next replay compiles it)."""
    src = Path(__file__).resolve().with_name("_jit_kernels.py")
    cache = jit_cache_dir(src)
    try:
        if not (cache / f"_jit_kernels.stepcost-{kernel_stamp()}.stamp").exists():
            return True
        mtime = src.stat().st_mtime
        return not any(p.stat().st_mtime >= mtime for p in cache.glob("_jit_kernels._replay-*.nbi"))
    except OSError:
        return True


#: The background compile :func:`compile_ahead` started (at most one), until awaited.
_AHEAD: list[subprocess.Popen[bytes]] = []
#: Held while a thread awaits it (the thread executor's pods start their loops together).
_AHEAD_LOCK = threading.Lock()

#: Set (to anything but empty or 0) to compile in the replaying process itself, as before.
NO_COMPILE_AHEAD_ENV = "ROOFTRACE_NO_COMPILE_AHEAD"


def compile_ahead() -> bool:
    """Start compiling the replay engine (the loop of fleets without lockstep groups, most fleets:
    jit.compile_engine, in two processes on two cores) into numba's disk cache in a background
    process, when the cache lacks it;
    returns whether one was started. The engine's first run in this process waits for it
    (jit.py calls :func:`await_compile_ahead`): were it to compile too, the work would be done
    twice. A process left running when this one exits is stopped (its cache is written whole or
    not at all: numba writes to a temporary file and renames it)."""
    if _AHEAD or os.environ.get(NO_COMPILE_AHEAD_ENV, "0") not in ("", "0") or not compile_needed():
        return False
    root = str(Path(__file__).resolve().parents[2])  # where this `pipeline` package is imported from
    code = f"import sys; sys.path.insert(0, {root!r}); from pipeline.engine.jit import compile_engine; "
    code += "compile_engine(parallel=True)"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except OSError:  # no process to spare: the first replay compiles, as without
        return False
    _AHEAD.append(proc)
    atexit.register(_stop_ahead)
    return True


def await_compile_ahead() -> None:
    """Wait for the background compile :func:`compile_ahead` started, if any (at once if none);
    afterwards the loop loads from the cache (or, if that compile failed, compiles here). Threads
    wait one at a time: the first waits for the process, the others find it gone."""
    with _AHEAD_LOCK:
        while _AHEAD:
            _AHEAD[0].wait()
            _AHEAD.pop(0)


def _stop_ahead() -> None:
    for proc in _AHEAD:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
    _AHEAD.clear()
