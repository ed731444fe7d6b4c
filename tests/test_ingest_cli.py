"""``rooftrace ingest``'s command line (pipeline/cli/ingest.py): its help's examples name files
that exist and run as shown."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import main

REPO = Path(__file__).resolve().parents[1]
#: Rows of the bundled samples (traces/sample/ATTRIBUTION.md).
SAMPLE_ROWS = {"azure_conv_2023.csv.gz": 19_366, "mooncake_conversation.jsonl.gz": 12_031}


def _examples() -> list[list[str]]:
    res = CliRunner().invoke(main, ["ingest", "--help"])
    assert res.exit_code == 0, res.output
    lines = [ln.strip() for ln in res.output.splitlines()]
    assert any(ln.startswith("Examples") for ln in lines), res.output
    got = [shlex.split(ln)[2:] for ln in lines if ln.startswith("rooftrace ingest ")]
    assert len(got) == 3, got
    return got


def test_help_examples_name_real_files_or_an_obviously_own_path() -> None:
    for args in _examples():
        source = args[0]
        if source.startswith("/path/to/your/"):
            continue  # the user's own logs, said as such
        assert (REPO / source).is_file(), source


@pytest.mark.parametrize("name", sorted(SAMPLE_ROWS))
def test_help_examples_run_as_shown(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (args,) = [a for a in _examples() if a[0].endswith(name)]
    monkeypatch.chdir(REPO)  # "from the repository root"
    monkeypatch.delenv("ROOFTRACE_STORE", raising=False)
    res = CliRunner().invoke(main, ["ingest", *args, "--store", str(tmp_path / "store"), "--json"])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    doc = json.loads(res.stdout)
    assert doc["rows_stored"] == SAMPLE_ROWS[name] and doc["rows_quarantined"] == 0 and doc["ok"]
    assert os.path.isdir(tmp_path / "store" / "requests")
