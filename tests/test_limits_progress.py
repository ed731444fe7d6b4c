"""A replay's progress (pipeline/replay/limits.py, ``engine_progress``): the compile is said up front,
the time left is measured from the first work done (not from the start, which counted numba's
compile: '2,136 of 19,366 (11%), 2 min elapsed, ~14 min left' 0.4 s before the end), plain lines
when stderr is not a terminal and a rich.progress bar when it is."""

from __future__ import annotations

import io
from typing import Any

import pytest

from pipeline.common.budget import Channel, progress_to
from pipeline.replay.limits import COMPILE_S, ReplayEstimate, _Reporter, engine_progress, format_duration


def _estimate(compile_bytes: int = 0, seconds: float = 1.0, total: int = 19_366) -> ReplayEstimate:
    parts = dict.fromkeys(("process", "overhead", "compile", "chains", "engine", "requests", "steps", "series"), 0)
    parts["compile"] = compile_bytes
    return ReplayEstimate(
        requests=total, replicas=2, engine="jit", mode="open", rate_scale=1.0, arrival_span_s=10.0, span_s=20.0,
        busy_replicas=2, kv_blocks=0, log_rows=0, parts=parts, seconds=seconds, progress_units="requests done",
        progress_total=total,
    )  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_time_left_starts_at_the_first_work_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOFTRACE_PROGRESS_EVERY_S", "5")
    said: list[str] = []
    clock = Clock()
    rep = _Reporter(_estimate(), Channel(0, said.append), clock)
    clock.t += 27.0  # the engine compiles: nothing done yet
    rep(0)
    assert said == ["replay: 0 of 19,366 requests done (0%), 27 s elapsed, waiting for the engine's first results"]
    clock.t += 93.0  # compiled (2 min in all); the first results
    rep(2_136)
    # 2 min elapsed, but no rate measured yet: no guess that counts the compile
    assert said[-1] == "replay: 2,136 of 19,366 requests done (11%), 2 min elapsed"
    clock.t += 5.0
    rep(12_136)  # 10,000 in 5 s: 7,230 left take 3.6 s
    assert said[-1] == "replay: 12,136 of 19,366 requests done (63%), 2 min elapsed, ~4 s left"
    assert rep.left_s(12_136, clock.t) == pytest.approx(5.0 * 7_230 / 10_000)
    clock.t += 1.0
    rep(19_366)  # within 5 s of the last line: not said again
    assert len(said) == 3


def test_a_compile_is_said_apart_from_the_replay_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the engine compiles, the lines say so, with no count, share or time left; the first
    results start the replay's own progress, whose time left is measured from them."""
    monkeypatch.setenv("ROOFTRACE_PROGRESS_EVERY_S", "5")
    said: list[str] = []
    clock = Clock()
    rep = _Reporter(_estimate(compile_bytes=1), Channel(0, said.append), clock)
    for _ in range(301):  # the engine thread polls every 0.1 s for 30 s: nothing done, a line every 5 s
        clock.t += 0.1
        rep(0)
    assert len(said) == 6
    assert said[0] == "replay: compiling the replay engine (one time), 5 s elapsed"
    assert said[-1] == "replay: compiling the replay engine (one time), 30 s elapsed"
    clock.t += 5.0
    rep(1_000)
    assert said[-1] == "replay: 1,000 of 19,366 requests done (5%), 35 s elapsed"
    clock.t += 5.0
    rep(2_000)  # 1,000 in 5 s: 17,366 left take 87 s, not counting the 30 s of compile
    assert said[-1].endswith("40 s elapsed, ~87 s left")


def test_the_estimate_leaves_the_compile_out(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    est = _estimate(compile_bytes=1, seconds=600.0)
    est.parts.update({"engine state": 0, "step log": 0})
    with progress_to(said.append):
        engine_progress(est)
    assert said[1].startswith("replay: estimated ~10 min once compiled and ")


def test_the_compile_is_said_before_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    with progress_to(said.append):
        rep = engine_progress(_estimate(compile_bytes=1))
    assert rep is not None
    assert said == [
        f"replay: compiling the replay engine (one time, ~{format_duration(COMPILE_S)}; cached for later runs "
        "until an upgrade)"
    ]
    said.clear()
    with progress_to(said.append):
        engine_progress(_estimate())
    assert said == []  # compiled already, a short run: nothing to say
    assert engine_progress(_estimate()) is None  # outside a command


def test_a_terminal_gets_a_live_bar_closed_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    import rich.console

    out = io.StringIO()
    real = rich.console.Console

    def console(*args: Any, **kwargs: Any) -> rich.console.Console:
        kwargs.pop("stderr", None)
        return real(*args, file=out, force_terminal=True, width=100, **kwargs)

    monkeypatch.setattr(rich.console, "Console", console)
    said: list[str] = []
    with progress_to(said.append, live=True):
        rep = engine_progress(_estimate(total=100))
        assert isinstance(rep, _Reporter) and rep.bar is not None
        rep(0)
        rep(40)
        rep(100)  # the last: the bar is stopped and cleared
        assert rep.bar is None
    assert said == []  # no plain lines on a terminal
    assert "replay" in out.getvalue() and "100/100" in out.getvalue()


def test_a_bar_left_open_is_closed_when_the_command_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    import rich.console

    real = rich.console.Console
    monkeypatch.setattr(
        rich.console, "Console", lambda *a, **k: real(file=io.StringIO(), force_terminal=True, width=80)
    )
    with progress_to(lambda _m: None, live=True):
        rep = engine_progress(_estimate(total=100))
        assert isinstance(rep, _Reporter)
        rep(50)  # a run that stops short of its total (Ctrl-C, an error)
        assert rep.bar is not None
    assert rep.bar is None
