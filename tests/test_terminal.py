"""Every value from a log printed to a terminal goes through one escaping function
(pipeline/common/terminal.py): the CLI's warning, error and progress lines (pipeline/cli/common.py),
replay's MODEL MIX warning and nightly's warnings and one-line summary (pipeline/publish/nightly.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_checks import cli

from pipeline.cli.common import error_boundary, progress, warn
from pipeline.common.errors import RooftraceError
from pipeline.common.terminal import escape_controls, escape_lines
from pipeline.publish.nightly import NightlyResult, night_warnings

#: A model name as a hostile log writes it: a title-setting OSC sequence, a right-to-left
#: override and the ';' nightly's summary used to cut warnings at.
EVIL_MODEL = "team;x\x1b]0;pwned\x07\u202eevil"
SHOWN = "team;x\\x1b]0;pwned\\x07\\u202eevil"


def _raw(text: str) -> bool:
    """Whether ``text`` holds a character a terminal acts on."""
    return any(c in text for c in ("\x1b", "\x07", "\u202e"))


def test_escape_controls_shows_every_control_character() -> None:
    assert escape_controls(EVIL_MODEL) == SHOWN
    assert escape_controls("a\tb\r\nc\x9b\u2066") == "a\\tb\\r\\nc\\x9b\\u2066"
    # a message of several lines keeps its line breaks; nothing else passes
    assert escape_lines(f"one {EVIL_MODEL}\ntwo") == f"one {SHOWN}\ntwo"


def test_warn_progress_and_errors_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    warn(f"MODEL MIX: 1 of 2 requests were logged for other models ({EVIL_MODEL}: 1)")
    progress(f"ingest: {EVIL_MODEL}.jsonl")
    with pytest.raises(SystemExit) as stop, error_boundary():
        raise RooftraceError(f"no model {EVIL_MODEL!s}")
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert not _raw(err)
    assert err.splitlines() == [
        f"warning: MODEL MIX: 1 of 2 requests were logged for other models ({SHOWN}: 1)",
        f"ingest: {SHOWN}.jsonl",
        f"error: no model {SHOWN}",
    ]


def _mix(model: str) -> str:
    """The MODEL MIX warning as pipeline.replay.run.model_mix_warning words it."""
    return (
        f"MODEL MIX: 120 of 400 requests (30 %) were logged for other models ({model}: 120) and are replayed "
        "as llama-3.1-8b; a fleet per model sizes each (rooftrace plan --traffic-model)"
    )


def _night(warnings: list[str], tmp_path: Path) -> NightlyResult:
    headline = {"warnings": warnings, "gpus": 2, "usd_per_day": 100.0, "ttft_p99_s": 0.25}
    return NightlyResult("2025-01-15", "run-1", tmp_path / "index.html", tmp_path / "all.html", headline, {"x": 1.0})


def test_nightly_summary_keeps_a_model_name_with_a_semicolon_whole(tmp_path: Path) -> None:
    """Hostile: 'team;' cut the summary at the model name's ';' ("other models (team;")."""
    night = _night([_mix(EVIL_MODEL)], tmp_path)
    (w,) = night_warnings(night.headline)
    assert (w.code, w.text) == ("MODEL MIX", _mix(EVIL_MODEL))
    assert w.short == (
        f"MODEL MIX: 120 of 400 requests (30 %) were logged for other models ({EVIL_MODEL}: 120) and are "
        "replayed as llama-3.1-8b"
    )
    line = night.line()
    assert f"other models ({EVIL_MODEL}: 120) and are replayed as llama-3.1-8b; p99 TTFT" in line
    assert "a fleet per model" not in line  # the advice stays on the warning's own line
    # --json carries the warnings structured: code and text, nothing to re-split
    assert night.to_json()["warnings"] == [{"code": "MODEL MIX", "text": _mix(EVIL_MODEL)}]


def test_nightly_multi_node_and_uncoded_warnings(tmp_path: Path) -> None:
    multi = (
        "MULTI-NODE: each replica spans 2 nodes (tp 16 × pp 1 × dp 1 = 16 h100-sxm GPUs, 8 per node), but its "
        "cross-node communication (all-reduce) is priced as within one nvlink node: latencies optimistic"
    )
    night = _night([multi, "something else; with a semicolon"], tmp_path)
    ws = night_warnings({**night.headline, "drift_note": "DRIFT: the replay is off"})
    assert [(w.code, w.short) for w in ws] == [
        ("MULTI-NODE", "MULTI-NODE: each replica spans 2 nodes (tp 16 × pp 1 × dp 1 = 16 h100-sxm GPUs, 8 per node), "
         "priced as one node (latencies optimistic)"),
        ("", None),
        ("DRIFT", None),
    ]  # fmt: skip
    assert "something else" not in night.line()


def test_nightly_cli_prints_warnings_and_summary_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nightly command's warning lines and its one-line summary go through the escaping."""
    from pipeline.publish import nightly as nightly_module

    night = _night([_mix(EVIL_MODEL)], tmp_path)
    monkeypatch.setattr(nightly_module, "nightly", lambda *a, **k: night)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("")
    res = cli("nightly", str(tmp_path / "logs"), "--fleet", str(fleet), "--store", str(tmp_path / "store"))
    assert res.exit_code == 3, (res.stderr, res.exception)  # (a model mix needs someone to act)
    assert not _raw(res.stderr)
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ")]
    assert warnings == [f"warning: {escape_controls(_mix(EVIL_MODEL))}"]
    summary = res.stderr.splitlines()[-1]
    assert summary.startswith("nightly 2025-01-15: run run-1") and f"other models ({SHOWN}: 120)" in summary


def test_replay_model_mix_warning_is_escaped(tmp_path: Path) -> None:
    """Hostile: a model named with ESC ]0;…BEL retitled the terminal through replay's MODEL MIX
    warning, and a right-to-left override reordered the line."""
    from pipeline.classify.accounting import classify_tokens
    from pipeline.ingest import ingest_logs
    from pipeline.ingest.store import Store
    from pipeline.synth import SynthConfig, generate, write_logs

    frame = generate(SynthConfig(requests=200, seed=3, duration_s=600, tenants=1, models=("llama-3.1-8b", "TEAMX")))
    write_logs(frame, "openai", tmp_path / "day.jsonl")
    log = tmp_path / "day.jsonl"  # the model's name as JSON writes it: escaped, and read back raw
    log.write_text(log.read_text().replace("TEAMX", json.dumps(EVIL_MODEL)[1:-1]))
    store = Store(tmp_path / "store")
    ingest_logs([tmp_path / "day.jsonl"], store)
    classify_tokens(store)
    res = cli("replay", "--fleet", "fleets/default.toml", "--store", str(store.root), "--json")
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert not _raw(res.stderr)
    mix = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: MODEL MIX")]
    assert len(mix) == 1 and f"({SHOWN}: " in mix[0], res.stderr
    # the JSON keeps the value as logged (JSON escapes it itself)
    doc = json.loads(res.stdout)
    assert any(EVIL_MODEL in w for w in doc["health"]["warnings"])
