"""The HTML report: self-contained, escaped, small; rendered in headless Chromium with no network."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.ingest.store import Store
from pipeline.publish.report import build_report
from tests.conftest import EVIL_TENANT, copy_replayed

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@pytest.fixture(scope="module")
def report(replayed_template: tuple[Store, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    store, run_id = copy_replayed(replayed_template, tmp_path_factory.mktemp("report-store") / "store")
    out = tmp_path_factory.mktemp("report") / "index.html"
    png = out.parent / "png"
    res = build_report(store, run_id, out=out, png_dir=png)
    assert res.path == out and len(res.charts) >= 8
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in res.pngs)
    return out


def test_self_contained_small_and_escaped(report: Path) -> None:
    page = report.read_text()
    assert report.stat().st_size < 5 * 2**20
    # Nothing is fetched: no external scripts, styles or images outside the inlined scripts.
    markup = re.sub(r"<script>.*?</script>", "", page, flags=re.S)
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", markup, re.I)
    assert page.count("<script>") == 2, "the Vega bundle inlined once, plus the chart specs"
    # The hostile tenant name appears only escaped: as HTML text, and as \\u003c-escaped JSON.
    assert EVIL_TENANT not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    for key in ("Peak fresh prefill", "Peak decode", "Peak KV vs capacity", "p99 TTFT", "p99 TPOT", "GPUs", "/day"):
        assert key in page, key


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium not installed (CI installs Debian's chromium package)")


def offline_flags(profile: Path) -> list[str]:
    """Headless Chromium with networking off (every host resolves to nothing and every connection
    goes to a dead proxy) and 20 s of virtual time."""
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--proxy-server=127.0.0.1:9",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=20000",
    ]


def offline_dom(page: Path, profile: Path) -> subprocess.CompletedProcess[str]:
    """The DOM headless Chromium renders from ``page`` offline (:func:`offline_flags`); skips the
    test without Chromium. Shared by every browser test of a report."""
    url = page.resolve().as_uri()
    return subprocess.run(
        [_chromium(), *offline_flags(profile), "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.browser
def test_renders_in_headless_chromium_offline(report: Path, tmp_path: Path) -> None:
    dom = offline_dom(report, tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    html = dom.stdout
    ids = re.findall(r'<div class="chart[^"]*" id="(chart-[a-z_]+)"', html)
    assert len(ids) >= 8, html[:3000]
    assert "chart-load_curve" in ids  # the headroom chart of every nightly report
    parts = re.split(r'<div class="chart[^"]*" id="chart-[a-z_]+"', html)[1:]
    for chart_id, part in zip(ids, parts, strict=True):
        body = part.split("</section>")[0]
        assert "<svg" in body, f"{chart_id} did not render"
        assert re.search(r'class="mark-(line|area|rect|symbol)', body), f"{chart_id} has no marks"
        assert "chart failed" not in body
    # The hostile tenant is text, not a script element.
    assert EVIL_TENANT not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    subprocess.run(
        [
            _chromium(),
            *offline_flags(tmp_path / "profile"),
            "--window-size=1100,5200",
            f"--screenshot={shot}",
            report.resolve().as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.exists() and shot.read_bytes()[:4] == b"\x89PNG"


def test_two_cache_models_say_which_cache_and_block_size(replayed_store: tuple[Store, str], tmp_path: Path) -> None:
    """Every token figure names the cache that produced it: classify's (512-token blocks here)
    or this fleet's engine caches (the fleet's 16-token blocks), cut from one prefix identity."""
    import html as html_lib
    import json

    store, run_id = replayed_store
    res = build_report(store, run_id, out=tmp_path / "index.html")
    page = html_lib.unescape(res.path.read_text())
    section = page[page.index("Two cache models") :]
    row = re.compile(r"<tr><td>(classify \(rooftrace classify\)|replay \(this fleet\))</td>(.*?)</tr>", re.S)
    cells = {m.group(1): re.findall(r"<td[^>]*>(.*?)</td>", m.group(2)) for m in row.finditer(section)}
    assert cells["classify (rooftrace classify)"][1] == "512"
    assert cells["replay (this fleet)"][1] == "16"
    assert "isolation key: model, adapter, tenant" in section
    h = res.headline
    assert h["classify_recorded_input_tokens"] == h["classify_cache_hit_tokens"] + h["classify_fresh_input_tokens"]
    assert h["classify_recorded_input_tokens"] > 0 and "recorded_input_tokens" not in h
    assert h["replay_cache_hit_tokens"] is not None
    config = json.loads((store.run_dir(run_id) / "config.json").read_text())
    assert config["options"]["isolation"] == ["model", "adapter", "tenant"]


def test_out_never_replaces_a_pipe_a_device_or_a_folder(replayed_store: tuple[Store, str], tmp_path: Path) -> None:
    """``report --out`` wrote a temporary file and renamed it over the target: a named pipe (or,
    run as root, /dev/full) became a regular file. It now refuses before any work, with one line;
    a failed write of the page or the PNGs is one line too."""
    import os
    import stat

    from click.testing import CliRunner

    from pipeline.cli import main

    store, run_id = replayed_store
    fifo = tmp_path / "out.html"
    os.mkfifo(fifo)
    folder = tmp_path / "page"
    (folder / "headline.json").mkdir(parents=True)  # the page's neighbour is a folder
    for out, what in ((fifo, "a named pipe (FIFO)"), (folder / "index.html", "a folder")):
        res = CliRunner().invoke(main, ["report", "--store", str(store.root), "--run", run_id, "--out", str(out)])
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        assert res.stderr.startswith(f"error: --out {out}: ") and f"is {what}, not a regular file" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and not (folder / "index.html").exists()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the PNG folder would go")
    res = CliRunner().invoke(main, ["report", "--store", str(store.root), "--run", run_id,
                                    "--out", str(tmp_path / "ok.html"), "--png", str(blocked / "png")])  # fmt: skip
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    # refused before any write (the page and headline.json are not left behind)
    assert res.stderr.startswith(f"error: --png {blocked / 'png'}: {blocked} is a file, not a folder"), res.stderr
    assert not (tmp_path / "ok.html").exists()
