"""`rooftrace demo`: the bundled demo night (a synthetic gateway log with sessions, reported cache
hits, tenants and a named model) on fleets/demo.toml (the `chat` SLO). Its report must show the
headline features: cache-hit tokens, tenants, the model, an SLO verdict, latencies in ms; and, in
headless Chromium at 1400 px, a collapsed run config and no table wider than the page."""

from __future__ import annotations

import gzip
import html as html_lib
import json
import re
import subprocess
from pathlib import Path

import pytest

from pipeline.ingest.project import sample_dir
from pipeline.ingest.store import Store
from pipeline.publish.nightly import (
    DEMO_DATE,
    DEMO_LOG,
    DEMO_MODEL,
    NightlyResult,
    demo,
    demo_fleet_path,
    demo_log_text,
    write_demo_log,
)
from pipeline.replay.fleet import load_fleet
from tests.test_report import _chromium, offline_flags

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def test_the_bundled_demo_log_is_regenerated_byte_for_byte(tmp_path: Path) -> None:
    bundled = sample_dir() / DEMO_LOG
    assert bundled.stat().st_size < 1024**2  # small enough to ship
    text = gzip.decompress(bundled.read_bytes())
    assert text == demo_log_text()  # the same synth seed and options, the same bytes
    again = write_demo_log(tmp_path / DEMO_LOG)
    assert gzip.decompress(again.read_bytes()) == text
    lines = text.decode().splitlines()
    assert len(lines) == 3000
    first = json.loads(lines[0])
    assert first["request"]["model"] == DEMO_MODEL and first["request"]["user"].startswith("tenant-")
    assert "ttft_s" not in first and "e2e_s" not in first  # no made-up observed latencies
    cached = sum(json.loads(x)["response"]["usage"]["prompt_tokens_details"]["cached_tokens"] for x in lines)
    assert cached > 0
    assert "synthetic" in (sample_dir() / "ATTRIBUTION.md").read_text()


def test_the_demo_fleet_carries_an_slo() -> None:
    cfg = load_fleet(demo_fleet_path())
    assert (cfg.name, cfg.model, cfg.slo) == ("demo", "llama-3.1-8b", "chat")


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> NightlyResult:
    root = tmp_path_factory.mktemp("demo")
    results = demo(Store(root / "store"), root / "reports")
    assert len(results) == 1
    return results[0]


def test_the_demo_report_shows_cache_hits_tenants_the_model_and_a_verdict(night: NightlyResult) -> None:
    h = night.headline
    assert night.date == DEMO_DATE
    assert h["classify_cache_hit_tokens"] > 0 and h["replay_cache_hit_tokens"] > 0
    assert h["slo"] == "chat" and h["slo_passed"] is not None and h["goodput"] is not None
    tenants = dict(h["traffic_tenants"])
    assert sorted(tenants) == ["tenant-0", "tenant-1", "tenant-2", "tenant-3"]
    assert dict(h["traffic_models"]) == {DEMO_MODEL: h["finished"]}
    page = html_lib.unescape(night.report.read_text())
    assert f"logged as {DEMO_MODEL} ({h['finished']:,}); served as llama-3.1-8b" in page
    assert "<span>SLO chat</span>" in page and "FLEET.toml [slo] or --slo chat gives a pass/fail verdict" not in page
    people = re.sub(r"<script>.*?</script>", "", page, flags=re.S).split('<section id="run-config">')[0]
    assert "(s)" not in people and "(seconds" not in people  # latencies are in ms where people read them
    index = html_lib.unescape((night.index).read_text())
    assert "p99 TTFT of finished (ms)" in index and "(s)" not in re.sub(r"<script>.*?</script>", "", index, flags=re.S)


#: Run in the page after it loaded: the run config's state and every table container's overflow.
_PROBE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const d = document.querySelector('#run-config details');
  const pre = d ? d.querySelector('pre') : null;
  const wide = [...document.querySelectorAll('.table-wrap')]
    .filter((w) => w.scrollWidth > w.clientWidth)
    .map((w) => (w.closest('section')?.querySelector('h2')?.textContent || '?') + ': '
      + w.scrollWidth + '>' + w.clientWidth);
  const page = document.documentElement;
  const out = {details: !!d, open: d ? d.open : null, preShown: pre ? pre.checkVisibility() : null,
               wide, tables: document.querySelectorAll('.table-wrap').length,
               pageWide: page.scrollWidth > page.clientWidth};
  const el = document.createElement('pre'); el.id = 'probe'; el.textContent = JSON.stringify(out);
  document.body.appendChild(el);
}, 500));
</script>"""


@pytest.mark.browser
def test_in_a_1400px_browser_the_config_is_collapsed_and_no_table_overflows(
    night: NightlyResult, tmp_path: Path
) -> None:
    page = night.report.read_text()
    probed = tmp_path / "probe.html"  # not beside the module's report: its folder stays as the demo wrote it
    end = page.rindex("</body>")  # the last: the inlined Vega bundle holds the string "</body>" too
    probed.write_text(page[:end] + _PROBE + page[end:])
    dom = subprocess.run(
        [
            _chromium(),
            *offline_flags(tmp_path / "profile"),
            "--window-size=1400,900",
            "--dump-dom",
            probed.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found is not None, dom.stdout[-2000:]
    probe = json.loads(html_lib.unescape(found.group(1)))
    assert probe["details"] is True and probe["open"] is False and probe["preShown"] is False
    assert probe["tables"] >= 10
    assert probe["wide"] == [] and probe["pageWide"] is False, probe
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "demo-report.png"
    subprocess.run(
        [
            _chromium(),
            *offline_flags(tmp_path / "profile"),
            "--window-size=1400,4000",
            f"--screenshot={shot}",
            night.report.resolve().as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.exists() and shot.read_bytes()[:4] == b"\x89PNG"
