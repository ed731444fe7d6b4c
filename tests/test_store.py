from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import RooftraceError
from pipeline.store import Store, open_store


def test_lock_is_reentrant_in_process_and_exclusive_across_processes(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    code = (
        "import sys; from pathlib import Path; from pipeline.store import Store\n"
        "try:\n"
        f"    with Store(Path({str(store.root)!r})).lock(): pass\n"
        "except Exception as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    with store.lock():
        with store.lock():  # nested: the nightly job calls stages that lock again
            pass
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        assert other.returncode == 3 and "holds the store lock" in other.stdout
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert again.returncode == 0


def test_store_paths_and_dates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOFTRACE_STORE", str(tmp_path / "env"))
    assert open_store().root == tmp_path / "env"
    store = Store(tmp_path / "s")
    assert store.dates() == []
    with pytest.raises(RooftraceError, match="no requests ingested"):
        store.resolve_date(None)
    (store.requests_dir / "date=2024-01-02").mkdir(parents=True)
    (store.requests_dir / "date=2024-01-01").mkdir(parents=True)
    (store.requests_dir / ".date=2024-01-03.new-x").mkdir(parents=True)
    assert store.dates() == ["2024-01-01", "2024-01-02"]
    assert store.resolve_date(None) == "2024-01-02"
    with pytest.raises(RooftraceError, match="no partition for date 2024-02-01"):
        store.resolve_date("2024-02-01")
