"""Where numba keeps the jit engine's compiled loop on disk, and the stamp that says whether that
cache still matches the sources the loop inlines (pipeline/engine/_jit_kernels.py drops a stale
cache when it is imported; pipeline/replay/limits.py reads the stamp to know whether a compile is ahead).
numba itself is imported only to ask where its cache is."""

from __future__ import annotations

import hashlib
import inspect
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
