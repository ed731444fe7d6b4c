"""The prefix cache's block hash: splitmix64 and the hash of a full block from its origin's key.
One definition shared by the prefix identity's chains (pipeline/classify/prefix.py) and the jit
engine's lazy chains (pipeline/engine/_jit_kernels.py), so both give the same hashes; the engines
map affinity keys to replicas with :func:`mix64`. numba compiles them only when asked
(:func:`compiled_hash`)."""

from __future__ import annotations

import types
from collections.abc import Callable
from functools import cache
from typing import cast

import numpy as np
import numpy.typing as npt

U64Array = npt.NDArray[np.uint64]

# splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014;
# constants as in Vigna's public-domain splitmix64.c): a fixed, well-mixing 64-bit bijection, so
# hashes are identical across runs, processes and machines (Python's hash() of str is not).
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def mix64(x: npt.ArrayLike) -> U64Array:
    """splitmix64 finaliser over a uint64 array (vectorised; wraps modulo 2**64 as intended)."""
    z = np.asarray(x, dtype=np.uint64) + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return cast(U64Array, z ^ (z >> np.uint64(31)))


def mix(x: np.uint64) -> np.uint64:
    """:func:`mix64` of one value, as the compiled kernels call it."""
    z = x + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def block_hash(key: np.uint64, m: int) -> np.uint64:
    """Hash of full block ``m`` whose origin (the request that introduced it) has key ``key``: the
    one definition the identity's chains (pipeline/classify/prefix.py: ``_origin_kernel``,
    ``_tree_hash_kernel``) and the jit engine's lazy chains (pipeline/engine/_jit_kernels.py) share."""
    return mix(key ^ mix(np.uint64(m)))


@cache
def compiled_hash() -> tuple[Callable[..., np.uint64], Callable[..., np.uint64]]:
    """``mix`` and ``block_hash`` compiled by numba (inlined where they are called): the prefix
    kernels and the jit engine (pipeline/engine/_jit_kernels.py) hash blocks with these."""
    import numba

    compiled_mix = numba.njit(cache=True, inline="always")(mix)
    glb = {**block_hash.__globals__, "mix": compiled_mix}
    compiled_block = numba.njit(cache=True, inline="always")(types.FunctionType(block_hash.__code__, glb, "block_hash"))
    return compiled_mix, compiled_block
