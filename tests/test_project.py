"""The store, reports and default fleet are found from the current directory (rooftrace.toml,
looked up like git), never from where the package is installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.common.errors import ConfigError
from pipeline.ingest.project import PROJECT_FILE, default_store_path, find_project, sample_dir, source_checkout

CHECKOUT = Path(__file__).resolve().parents[1]


def test_found_from_a_subfolder_with_its_own_paths(tmp_path: Path) -> None:
    (tmp_path / PROJECT_FILE).write_text('store = "data/store"\nreports = "out/reports"\n')
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    project = find_project(deep)
    assert project.root == tmp_path.resolve()
    assert project.file == (tmp_path / PROJECT_FILE).resolve()
    assert project.store == tmp_path.resolve() / "data" / "store"
    assert project.reports == tmp_path.resolve() / "out" / "reports"
    assert project.fleet == tmp_path.resolve() / "fleets" / "default.toml"  # default kept


def test_without_a_project_file_the_current_directory_is_the_root(tmp_path: Path) -> None:
    project = find_project(tmp_path)
    assert project.file is None
    assert (project.store, project.reports) == (tmp_path.resolve() / "traces" / "store", tmp_path.resolve() / "reports")


def test_nearest_project_file_wins(tmp_path: Path) -> None:
    (tmp_path / PROJECT_FILE).write_text('store = "outer"\n')
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / PROJECT_FILE).write_text('store = "mine"\n')
    assert find_project(inner).store == inner.resolve() / "mine"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('stor = "x"\n', "unknown key(s) ['stor']"),
        ("store = 3\n", "store must be a path"),
        ('store = ""\n', "store must be a path"),
        ("store = [\n", "project file is not valid TOML"),
    ],
)
def test_a_bad_project_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / PROJECT_FILE).write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        find_project(tmp_path)


def test_environment_store_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROOFTRACE_STORE", raising=False)
    assert default_store_path() == tmp_path.resolve() / "traces" / "store"
    monkeypatch.setenv("ROOFTRACE_STORE", str(tmp_path / "elsewhere"))
    assert default_store_path() == tmp_path / "elsewhere"


def test_the_checkout_is_a_project_and_only_read_from_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert find_project(CHECKOUT / "docs").root == CHECKOUT
    assert source_checkout() == CHECKOUT
    monkeypatch.chdir(tmp_path)
    assert sample_dir() == CHECKOUT / "traces" / "sample"  # reading the bundled sample is fine


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_commands_run_outside_the_checkout_write_under_the_current_directory(tmp_path: Path) -> None:
    """synth, ingest, classify and replay (default fleet read from the checkout) from a folder
    outside the checkout: everything lands under that folder; the checkout's store and reports
    are untouched."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    # a date no other test uses: other tests may write under the checkout at the same time
    # (pytest-xdist workers), so what this test must not leave there is named by it
    date = "2031-07-04"

    def mine() -> list[str]:
        listed = _listing(CHECKOUT / "traces" / "store") + _listing(CHECKOUT / "reports")
        return [p for p in listed if date in p]

    assert mine() == []
    env = {k: v for k, v in os.environ.items() if k != "ROOFTRACE_STORE"}
    cli = [sys.executable, "-m", "pipeline"]

    def run(*args: str) -> None:
        out = subprocess.run([*cli, *args], cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, (args, out.stdout, out.stderr)

    run("synth", "--format", "openai", "--requests", "200", "--models", "llama-3.1-8b", "--date", date,
        "--out", "log.jsonl")  # fmt: skip
    run("ingest", "log.jsonl")
    run("classify")
    run("replay")
    assert (work / "traces" / "store" / "requests" / f"date={date}").is_dir()
    runs = list((work / "traces" / "store" / "runs").iterdir())
    assert runs and all(r.name.startswith(date) for r in runs)
    assert mine() == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"store = [\n", "project file is not valid TOML"),
        (b"\x80", "not UTF-8 text"),
        (b'store = "\\u0000"\n', "store must be a path"),
        (b"a = " + b"[" * 100_000, "nested too deeply"),
    ],
)
@pytest.mark.parametrize("command", [["report"], ["sql", "SELECT 1"], ["demo"], ["query", "latency"], ["classify"]])
def test_a_hostile_project_file_is_one_error_line_for_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, message: str, command: list[str]
) -> None:
    """Commands that look the project up, inside or outside their library call, answer a broken
    rooftrace.toml with one ``error:`` line and exit 1 (the CLI's one error handler)."""
    from click.testing import CliRunner

    from pipeline.cli import main

    (tmp_path / PROJECT_FILE).write_bytes(content)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROOFTRACE_STORE", raising=False)
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


@pytest.mark.parametrize("command", [["report"], ["sql", "SELECT 1"], ["classify"], ["replay"], ["ingest", "x.jsonl"]])
def test_a_store_path_that_is_a_file_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    from click.testing import CliRunner

    from pipeline.cli import main

    (tmp_path / "afile").write_text("not a store")
    (tmp_path / "x.jsonl").write_text("{}\n")
    (tmp_path / PROJECT_FILE).write_text('store = "afile"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROOFTRACE_STORE", raising=False)
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1, (result.output, result.exception)
    assert (
        result.stderr.strip()
        == f"error: store path {tmp_path / 'afile'} is a file, not a folder (check --store or $ROOFTRACE_STORE)"
    )
