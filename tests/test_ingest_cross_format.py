"""One request logged in two formats (pipeline/ingest/core.py, docs/ingest.md "Nothing lost,
nothing duplicated"): a gateway's OpenAI response log and its OTel spans of the same 300 calls
(same request id, arrival and tokens) are 300 requests, not 600. Without
``--dedupe-across-formats`` ingest stores both and says so in one ``warning:`` line per date (and
in ``--json``); with it, the second format's rows are duplicates. Rows in = stored + quarantined +
duplicates either way, in memory and in the out-of-core merge."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import pipeline.ingest.core as core
from pipeline.cli import main
from pipeline.ingest import IngestSummary, ingest_logs
from pipeline.ingest.store import Store

N = 300
T0_NS = 1_733_011_200_000_000_000  # 2024-12-01T00:00:00Z


def _tokens(i: int) -> tuple[int, int]:
    return 1000 + 7 * i, 50 + i


def _arrival_ns(i: int) -> int:
    return T0_NS + i * 1_250_000_000  # every 1.25 s: sub-second arrivals


def _openai_log(path: Path, ids: range = range(N)) -> Path:
    """A gateway's logged pairs: logger timestamp (ISO, ms), Chat Completions response."""
    lines = []
    for i in ids:
        rin, out = _tokens(i)
        ns = _arrival_ns(i)
        secs, frac = divmod(ns, 1_000_000_000)
        ts = pl.Series([secs * 1_000_000 + frac // 1000]).cast(pl.Datetime("us", "UTC"))[0]
        lines.append(
            json.dumps(
                {
                    "timestamp": ts.isoformat().replace("+00:00", "Z"),
                    "request": {"model": "gpt-4o", "user": "team-a"},
                    "response": {
                        "id": f"chatcmpl-{i}",
                        "object": "chat.completion",
                        "created": secs,
                        "model": "gpt-4o",
                        "usage": {"prompt_tokens": rin, "completion_tokens": out, "total_tokens": rin + out},
                    },
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _attr(key: str, value: object) -> dict[str, object]:
    v = {"intValue": str(value)} if isinstance(value, int) else {"stringValue": str(value)}
    return {"key": key, "value": v}


def _otel_log(path: Path, ids: range = range(N), tokens_delta: int = 0) -> Path:
    """The same calls as OTel GenAI spans, one export per line."""
    lines = []
    for i in ids:
        rin, out = _tokens(i)
        ns = _arrival_ns(i)
        span = {
            "traceId": f"{i:032x}",
            "spanId": f"{i:016x}",
            "name": "chat gpt-4o",
            "startTimeUnixNano": str(ns),
            "endTimeUnixNano": str(ns + 2_000_000_000),
            "attributes": [
                _attr("gen_ai.response.id", f"chatcmpl-{i}"),
                _attr("gen_ai.request.model", "gpt-4o"),
                _attr("gen_ai.usage.input_tokens", rin + tokens_delta),
                _attr("gen_ai.usage.output_tokens", out),
            ],
        }
        doc = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [span]}]}]}
        lines.append(json.dumps(doc))
    path.write_text("\n".join(lines) + "\n")
    return path


def _balanced(s: IngestSummary) -> None:
    for f in s.files:
        assert f.rows_read == f.rows_stored + f.rows_quarantined + f.rows_duplicate, f
    assert s.total("rows_read") == s.total("rows_stored") + s.total("rows_quarantined") + s.total("rows_duplicate")


def _stored(store: Store) -> pl.DataFrame:
    return pl.concat([store.read_requests(d) for d in store.dates()])


@pytest.fixture(params=["memory", "out_of_core"])
def merge(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "out_of_core":
        monkeypatch.setattr(core, "STAGE_MEMORY_BYTES", 1)  # every batch spills: DuckDB merges
    return str(request.param)


def test_two_formats_of_one_request_are_said_not_silently_doubled(tmp_path: Path, merge: str) -> None:
    oa, ot = _openai_log(tmp_path / "gw.jsonl"), _otel_log(tmp_path / "spans.jsonl")
    lines: list[str] = []
    s = ingest_logs([oa, ot], Store(tmp_path / "store"), progress=lines.append)
    _balanced(s)
    assert (s.total("rows_read"), s.total("rows_stored"), s.total("rows_duplicate")) == (600, 600, 0)
    assert s.cross_format_repeats == N
    warn = [ln for ln in lines if ln.startswith("warning:")]
    assert warn == s.warnings
    assert len(warn) == 1 and "requests/date=2024-12-01: 300 request(s) are stored twice" in warn[0]
    assert "(openai, otel:" in warn[0] and "--dedupe-across-formats" in warn[0]
    assert s.to_json()["cross_format_repeats"] == N and s.to_json()["warnings"] == warn
    # the repair the warning names: the later format's logs again, with --force --dedupe-across-formats
    store = Store(tmp_path / "store")
    fixed = ingest_logs([ot], store, force=True, dedupe_across_formats=True)
    _balanced(fixed)
    assert (fixed.total("rows_replaced"), fixed.total("rows_stored"), fixed.total("rows_duplicate")) == (N, 0, N)
    assert fixed.warnings == [] and _stored(store).height == N


def test_dedupe_across_formats_keeps_the_first_read(tmp_path: Path, merge: str) -> None:
    oa, ot = _openai_log(tmp_path / "gw.jsonl"), _otel_log(tmp_path / "spans.jsonl")
    store = Store(tmp_path / "store")
    s = ingest_logs([oa, ot], store, dedupe_across_formats=True)
    _balanced(s)
    assert (s.total("rows_read"), s.total("rows_stored"), s.total("rows_duplicate")) == (600, 300, 300)
    by_file = {Path(f.source_file).name: f for f in s.files}
    assert (by_file["gw.jsonl"].rows_stored, by_file["gw.jsonl"].rows_duplicate) == (300, 0)
    assert (by_file["spans.jsonl"].rows_stored, by_file["spans.jsonl"].rows_duplicate) == (0, 300)
    assert by_file["spans.jsonl"].rows_cross_format == 300 and by_file["spans.jsonl"].rows_conflicting == 0
    assert s.cross_format_repeats == 0 and s.warnings == []
    rows = _stored(store)
    assert rows.height == N and set(rows["source_format"]) == {"openai"}
    assert rows["recorded_input_tokens"].sum() == sum(_tokens(i)[0] for i in range(N))
    assert "(300 of them a request stored from another format)" in s.line()


def test_dedupe_against_the_store_and_other_tokens_stay(tmp_path: Path, merge: str) -> None:
    """The OTel spans ingested in a later run are matched against the stored OpenAI rows; spans
    whose tokens differ are other requests, stored."""
    store = Store(tmp_path / "store")
    first = ingest_logs([_openai_log(tmp_path / "gw.jsonl")], store)
    assert first.total("rows_stored") == N
    ot = _otel_log(tmp_path / "spans.jsonl", ids=range(200))
    other = _otel_log(tmp_path / "spans-b.jsonl", ids=range(200, 300), tokens_delta=1)
    s = ingest_logs([ot, other], store, dedupe_across_formats=True)
    _balanced(s)
    assert (s.total("rows_read"), s.total("rows_stored"), s.total("rows_duplicate")) == (300, 100, 200)
    assert s.total("rows_cross_format") == 200 and s.cross_format_repeats == 0
    assert _stored(store).height == 400


def test_cli_warns_on_stderr_and_in_json(tmp_path: Path) -> None:
    oa, ot = _openai_log(tmp_path / "gw.jsonl"), _otel_log(tmp_path / "spans.jsonl")
    store = str(tmp_path / "store")
    res = CliRunner().invoke(main, ["ingest", str(oa), str(ot), "--store", store, "--json"])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    doc = json.loads(res.stdout)
    assert doc["rows_read"] == doc["rows_stored"] + doc["rows_quarantined"] + doc["rows_duplicate"] == 600
    assert doc["cross_format_repeats"] == N
    warn = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "300 request(s) are stored twice" in warn[0] and doc["warnings"] == warn
    again = tmp_path / "store2"
    res = CliRunner().invoke(
        main, ["ingest", str(oa), str(ot), "--store", str(again), "--json", "--dedupe-across-formats"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["rows_stored"], doc["rows_duplicate"], doc["rows_cross_format"]) == (300, 300, 300)
    assert doc["warnings"] == [] and "warning:" not in res.stderr


def test_nightly_passes_the_dedupe_option_to_its_ingest(tmp_path: Path) -> None:
    """``nightly --dedupe-across-formats`` stores the 300 calls once, as ingest's option does."""
    from pipeline.publish.nightly import nightly

    logs = [_openai_log(tmp_path / "gateway.jsonl"), _otel_log(tmp_path / "spans.jsonl")]
    store = Store(tmp_path / "store")
    fleet = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"
    res = nightly(logs, fleet, store, reports_dir=tmp_path / "reports", dedupe_across_formats=True)
    assert res.headline["replayed_requests"] == N
    assert store.read_requests().height == N
