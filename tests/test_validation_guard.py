"""The regression guard of the end-to-end checks (issue 39, item 7): every check of
benchmarks/validation_guard.py recomputed and judged against tests/data/validation_baselines.toml.

A check fails when its mean |error| grew by more than 2 percentage points over the recorded figure
(the message names the check, the recorded and the new figure); improvements pass and are listed
under "validation guard" at the end of the run. How to update the baseline honestly: the file's
header, and docs/replay_validation.md ("The regression guard").
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import validation_guard as guard

#: The property a passing guard test records its improvements under (conftest prints them).
IMPROVED_PROPERTY = "validation_guard"


def _baseline() -> dict[str, dict[str, Any]]:
    return guard.read_baseline()[1]


@pytest.mark.parametrize("group", sorted(guard.GROUPS))
def test_no_end_to_end_check_got_worse(group: str, record_property: Callable[[str, object], None]) -> None:
    root = SHARED / "measurements"
    for parts in guard.GROUPS[group].needs:
        if not root.joinpath(*parts).exists():
            pytest.skip(f"shared data not available: {root.joinpath(*parts)}")
    verdict = guard.compare(_baseline(), guard.compute(group, root), group)
    for line in verdict.improvements:
        record_property(IMPROVED_PROPERTY, line)
    if verdict.failures:
        pytest.fail("\n".join(verdict.failures), pytrace=False)


# -- the guard itself -------------------------------------------------------------------------------


def _recorded(group: str) -> list[guard.Figure]:
    """The group's figures exactly as recorded."""
    return [
        guard.Figure(check, int(b["n"]), float(b["mean_abs_error"]), float(b["mean_error"]))
        for check, b in _baseline().items()
        if b["group"] == group
    ]


@pytest.mark.parametrize("group", sorted(guard.GROUPS))
def test_the_recorded_figures_pass(group: str) -> None:
    figures = _recorded(group)
    assert figures, f"no check of {group} is recorded"
    verdict = guard.compare(_baseline(), figures, group)
    assert verdict.failures == [] and verdict.improvements == []


def test_a_check_three_points_worse_fails_naming_it_and_both_figures() -> None:
    base = _baseline()
    figures = _recorded("argonne-h100")
    victim = figures[2]
    worse = guard.Figure(victim.check, victim.n, victim.mean_abs + 0.03, victim.mean + 0.03)
    verdict = guard.compare(base, [worse if f is victim else f for f in figures], "argonne-h100")
    assert len(verdict.failures) == 1
    (msg,) = verdict.failures
    assert victim.check in msg
    assert f"{victim.mean_abs:.2%} -> {worse.mean_abs:.2%}" in msg and "+3.00 points" in msg


def test_within_two_points_passes_and_an_improvement_is_said() -> None:
    base = _baseline()
    figures = _recorded("published-roofline")
    a, b = [f for f in figures if f.mean_abs > 0.05][:2]
    slightly = guard.Figure(a.check, a.n, a.mean_abs + 0.019, a.mean)
    better = guard.Figure(b.check, b.n, b.mean_abs - 0.03, b.mean)
    rest = [f for f in figures if f.check not in (a.check, b.check)]
    verdict = guard.compare(base, [slightly, better, *rest], "published-roofline")
    assert verdict.failures == []
    assert len(verdict.improvements) == 1 and b.check in verdict.improvements[0]
    assert "improved" in verdict.improvements[0]


def test_a_lost_or_an_unrecorded_check_fails() -> None:
    base = _baseline()
    figures = _recorded("prior-steps")
    lost = guard.compare(base, figures[1:], "prior-steps")
    assert len(lost.failures) == 1 and figures[0].check in lost.failures[0] and "not computed" in lost.failures[0]
    new = guard.compare(base, [*figures, guard.Figure("prior-steps/new-gpu/prior", 5, 0.1, 0.0)], "prior-steps")
    assert len(new.failures) == 1 and "prior-steps/new-gpu/prior" in new.failures[0]
    assert "not in the baseline" in new.failures[0]
    nan = guard.compare(base, [guard.Figure(figures[0].check, 1, float("nan"), 0.0), *figures[1:]], "prior-steps")
    assert len(nan.failures) == 1


def test_the_baseline_file_says_how_to_update_it_and_where_its_figures_come_from() -> None:
    text = guard.BASELINE.read_text()
    head = text.split("[meta]")[0]
    assert "python benchmarks/validation_guard.py --write" in head
    assert "commit message" in head and "Never rewrite it to make a red run green" in head
    meta, checks = guard.read_baseline()
    assert {"command", "commit", "recorded", "machine"} <= set(meta["meta"])
    assert meta["meta"]["tolerance_points"] == pytest.approx(guard.TOLERANCE * 100)
    assert set(meta["groups"]) == set(guard.GROUPS)
    for name, g in meta["groups"].items():
        assert g["source"] and g["error"], name
    assert {c["group"] for c in checks.values()} == set(guard.GROUPS)
    for check, c in checks.items():
        assert c["n"] >= 1 and c["mean_abs_error"] >= 0 and abs(c["mean_error"]) <= c["mean_abs_error"] + 1e-4, check


def test_render_reads_back_to_the_same_figures(tmp_path: Path) -> None:
    figures = {
        "argonne-a100": [guard.Figure('argonne/"quoted"\\gpu/tp1/auto', 3, 0.123456, -0.0456789)],
        "prior-steps": [guard.Figure("prior-steps/x/prior", 50, 0.5, 0.25)],
    }
    path = tmp_path / "b.toml"
    path.write_text(guard.render_baseline(figures, {"command": "c", "commit": "abc", "recorded": "d", "machine": "m"}))
    doc = tomllib.loads(path.read_text())
    assert doc["checks"]['argonne/"quoted"\\gpu/tp1/auto'] == {
        "group": "argonne-a100",
        "n": 3,
        "mean_abs_error": 0.1235,
        "mean_error": -0.0457,
    }
    assert guard.read_baseline(path)[1]["prior-steps/x/prior"]["mean_abs_error"] == 0.5


def test_the_guard_script_fails_on_a_worse_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The command line end to end on the cheapest group (~3 s): a baseline that records a check 3
    # points better than the model makes today's figure 3 points worse.
    group = "operator-roofline"
    root = SHARED / "measurements"
    for parts in guard.GROUPS[group].needs:
        if not root.joinpath(*parts).exists():
            pytest.skip(f"shared data not available: {root.joinpath(*parts)}")
    text = guard.BASELINE.read_text()
    checks = tomllib.loads(text)["checks"]
    check = next(k for k, c in checks.items() if c["group"] == group and c["mean_abs_error"] > 0.05)
    old = checks[check]["mean_abs_error"]
    line = next(ln for ln in text.splitlines() if ln.startswith(guard._toml_str(check) + " = "))
    worse = text.replace(line, line.replace(f"mean_abs_error = {old},", f"mean_abs_error = {round(old - 0.03, 4)},"))
    assert worse != text
    path = tmp_path / "baseline.toml"
    path.write_text(worse)
    assert guard.main(["--only", group, "--baseline", str(path), "--measurements", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"WORSE: {group}: {check}: mean |error| {old - 0.03:.2%} -> " in err
    assert err.count("WORSE:") == 1


def test_a_rewrite_records_its_dated_note_and_an_undated_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = {"prior-steps": [guard.Figure("prior-steps/x/prior", 50, 0.5, 0.25)]}
    meta = {"command": "c", "commit": "abc", "recorded": "2026-12-07", "machine": "m"}
    note = '2026-12-07: profiles rebuilt, "prior-steps/x/prior" 50.00 -> 50.00 %'
    path = tmp_path / "b.toml"
    path.write_text(guard.render_baseline(figures, {**meta, "note": note}))
    assert guard.read_baseline(path)[0]["meta"]["note"] == note
    for argv, why in (
        (["--note", "2026-12-07: x"], "--note is recorded by --write only"),
        (["--write", "--note", "profiles rebuilt"], "starts with its date"),
        (["--write", "--note", "2026-12-07: one\ntwo"], "one line"),
    ):
        with pytest.raises(SystemExit) as stop:
            guard.main([*argv, "--baseline", str(path)])
        assert stop.value.code == 2
        assert why in capsys.readouterr().err
    assert guard.read_baseline(path)[0]["meta"]["note"] == note  # a refused run writes nothing
