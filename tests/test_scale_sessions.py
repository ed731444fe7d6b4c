"""benchmarks/scale.py's session generator (``--hierarchy-arrivals sessions``): seeded, keyed,
heavy-tailed, and paced like a chat."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scale

N, RATE = 20_000, 400.0  # T = 50 s


def _draw(seed: int = 3, **kw: float) -> tuple[np.ndarray, np.ndarray]:
    return scale.sessions(N, RATE, np.random.default_rng(seed), **kw)  # type: ignore[arg-type]


def test_seeded_and_keyed() -> None:
    t, key = _draw()
    t2, key2 = _draw()
    assert np.array_equal(t, t2) and np.array_equal(key, key2)
    assert not np.array_equal(_draw(4)[1], key)
    assert t.shape == key.shape == (N,) and key.dtype == np.int64
    assert (key >= 0).all()
    assert (np.diff(t) >= 0).all() and t[0] >= 0 and t[-1] < N / RATE
    sizes = np.bincount(key)
    assert (sizes >= 1).all() and sizes.max() <= scale.SESSION_MAX_TURNS


def test_heavy_tail() -> None:
    sizes = np.sort(np.bincount(_draw(max_turns=1000)[1]))[::-1]
    assert np.median(sizes) == 1 and sizes.max() <= 1000
    assert sizes[: sizes.size // 100].sum() / N > 0.3  # the top 1 % of sessions carry a large share


def test_turns_paced_like_a_chat() -> None:
    """Sessions short enough for the run keep the chat's gaps (mean gap_s), in time order; long ones
    are spread over the run, not sent at once."""
    t, key = _draw(gap_s=5.0)
    T = N / RATE
    order = np.lexsort((t, key))  # each session's turns in time order
    k, tt = key[order], t[order]
    same = k[1:] == k[:-1]
    sizes = np.bincount(key)
    pair = same & (sizes[k[1:]] == 2)  # two-turn sessions: one gap each
    d = (tt[1:] - tt[:-1])[pair]
    gap = np.minimum(d, T - d)  # a session may wrap past the end of the run; two turns span <= T / 2
    assert abs(gap.mean() / 5.0 - 1) < 0.15
    big = int(np.argmax(sizes))  # squeezed into the run: spread over most of it
    bt = np.sort(t[key == big])
    assert np.diff(bt).max() < T / 4 and (bt[-1] - bt[0]) > T / 2
