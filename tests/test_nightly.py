"""The nightly job: end to end, idempotent, and a failed stage named with earlier outputs kept."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.nightly import StageError, nightly
from pipeline.store import Store
from pipeline.synth import SynthConfig, generate, write_logs

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"


def _digest(root: Path, pattern: str) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.glob(pattern))}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nightly-logs")
    write_logs(
        generate(SynthConfig(requests=250, seed=21, duration_s=600, date="2025-02-01")), "anthropic", root / "a.jsonl"
    )
    return root


def test_nightly_end_to_end_and_rerun_is_identical(logs: Path, tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    reports = tmp_path / "reports"
    first = nightly([logs], FLEET, store, reports_dir=reports)
    assert first.date == "2025-02-01"
    assert first.report == reports / "2025-02-01" / "index.html" and first.report.exists()
    assert (reports / "index.html").exists()
    assert set(first.stages) == {"ingest", "classify", "replay", "cost", "warehouse", "report", "index"}
    assert first.headline["requests"] == 250
    page = first.report.read_text()
    assert "API-equivalent cost" in page and "GPU cost by token class" in page  # the cost stage's tables
    parquet = _digest(store.root, "**/*.parquet")
    second = nightly([logs], FLEET, store, reports_dir=reports)
    assert second.run_id == first.run_id
    assert _digest(store.root, "**/*.parquet") == parquet, "a re-run rewrites the same bytes"
    index = (reports / "index.html").read_text()
    assert index.count('href="2025-02-01/index.html"') == 1
    head = json.loads((reports / "2025-02-01" / "headline.json").read_text())
    assert head["run_id"] == first.run_id


def test_failed_stage_is_named_and_earlier_outputs_kept(logs: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        FLEET.read_text().replace('router = "least_outstanding"', 'router = "least_outstanding"\nturbo = true')
    )
    store = Store(tmp_path / "store")
    with pytest.raises(StageError, match=r"stage replay failed .*turbo"):
        nightly([logs], bad, store, reports_dir=tmp_path / "reports")
    assert store.dates() == ["2025-02-01"]
    assert list(store.accounting_dir.glob("requests/date=2025-02-01/*.parquet"))
    assert not (tmp_path / "reports").exists()
    runner = CliRunner()
    res = runner.invoke(main, ["nightly", str(logs), "--fleet", str(bad), "--store", str(store.root)])
    assert res.exit_code == 1
    assert "stage replay failed" in res.stderr and "Traceback" not in res.output
