"""Each provider format normalised to the canonical request, values checked by hand against the
providers' documented field semantics (fixtures in tests/fixtures/ingest)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.synth import SynthConfig, generate, write_logs
from tests.conftest import FIXTURES

DIR = FIXTURES / "ingest"


def _ingest(tmp_path: Path, name: str, **kw: Any) -> pl.DataFrame:
    store = Store(tmp_path / "store")
    summary = ingest_logs([DIR / name], store, **kw)
    assert summary.ok, summary.errors
    assert summary.total("rows_quarantined") == 0
    frames = [store.read_requests(d) for d in store.dates()]
    return pl.concat(frames).sort("request_id")


def _row(df: pl.DataFrame, rid: str) -> dict[str, Any]:
    rows = df.filter(pl.col("request_id") == rid).to_dicts()
    assert len(rows) == 1, rid
    return rows[0]


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_openai_shapes(tmp_path: Path) -> None:
    df = _ingest(tmp_path, "openai.jsonl")
    assert df.height == 4
    assert set(df["source_format"]) == {"openai"}
    a = _row(df, "chatcmpl-A1")  # Chat Completions object
    assert a["arrival"] == _t("2024-12-01T00:00:00")
    assert (a["recorded_input_tokens"], a["reported_cache_hit_tokens"], a["output_tokens"]) == (
        2006,
        1920,
        300,
    )
    assert a["model"] == "gpt-4o-2024-08-06" and a["reasoning_tokens"] == 0
    b = _row(df, "resp_B2")  # Responses object: input_tokens / output_tokens_details
    assert b["arrival"] == _t("2024-12-01T00:01:00")
    assert (b["recorded_input_tokens"], b["reported_cache_hit_tokens"]) == (5000, 4096)
    assert (b["output_tokens"], b["reasoning_tokens"], b["status"]) == (1200, 1024, "completed")
    c = _row(df, "chatcmpl-C3")  # Batch API output line
    assert c["arrival"] == _t("2024-12-01T00:02:00")
    assert (c["recorded_input_tokens"], c["output_tokens"], c["model"], c["status"]) == (
        900,
        45,
        "gpt-4o-mini",
        "200",
    )
    d = _row(df, "chatcmpl-D4")  # logged request/response pair, logger timestamp wins over `created`
    assert d["arrival"] == _t("2024-12-01T00:03:00.250")
    assert (d["tenant"], d["session_id"]) == ("team-search", "s-42")
    assert (d["recorded_input_tokens"], d["reported_cache_hit_tokens"], d["output_tokens"]) == (1500, 1280, 1)
    assert (d["ttft_s"], d["e2e_s"]) == (0.41, 0.42)
    assert d["reasoning_tokens"] is None


def test_anthropic_input_is_made_inclusive(tmp_path: Path) -> None:
    df = _ingest(tmp_path, "anthropic.jsonl")
    m1 = _row(df, "msg_01")  # cache write: 21 + 188086 + 0
    assert (m1["recorded_input_tokens"], m1["reported_cache_hit_tokens"], m1["cache_write_tokens"]) == (
        188107,
        0,
        188086,
    )
    assert (m1["tenant"], m1["session_id"], m1["output_tokens"]) == ("acme", "conv-1", 393)
    m2 = _row(df, "msg_02")  # cache read: 50 + 414 + 188086
    assert (m2["recorded_input_tokens"], m2["reported_cache_hit_tokens"], m2["cache_write_tokens"]) == (
        188550,
        188086,
        414,
    )
    assert m2["arrival"] == _t("2024-12-01T00:01:30.500")
    m3 = _row(df, "msg_03")  # no cache fields at all
    assert (m3["recorded_input_tokens"], m3["reported_cache_hit_tokens"], m3["cache_write_tokens"]) == (
        3000,
        None,
        None,
    )
    m4 = _row(df, "msg_04")  # Message Batches result line
    assert (m4["recorded_input_tokens"], m4["reported_cache_hit_tokens"], m4["status"]) == (
        2148,
        2048,
        "succeeded",
    )
    assert m4["arrival"] == _t("2024-12-01T00:05:00")


def test_otel_genai_spans(tmp_path: Path) -> None:
    df = _ingest(tmp_path, "otel.json")
    assert df.height == 2, "the HTTP span is not a GenAI request"
    s1 = _row(df, "chatcmpl-otel1")
    assert s1["arrival"] == _t("2024-12-01T00:00:00")
    assert (s1["recorded_input_tokens"], s1["reported_cache_hit_tokens"], s1["output_tokens"]) == (
        3000,
        2048,
        250,
    )
    assert (s1["e2e_s"], s1["tenant"], s1["session_id"], s1["status"]) == (2.5, "tenant-a", "conv-9", "ok")
    assert s1["model"] == "gpt-4o-2024-08-06"
    s2 = _row(df, "6c8efff798038103d269b633813fc60d:fff19b7ec3c1b176")
    # OTel GenAI conventions: cache reads and writes SHOULD be included in input_tokens.
    assert (s2["recorded_input_tokens"], s2["reported_cache_hit_tokens"], s2["cache_write_tokens"]) == (
        1200,
        1024,
        100,
    )
    assert (s2["e2e_s"], s2["status"], s2["model"]) == (1.0, "error", "claude-sonnet-4-5")


def test_litellm_csv_and_json(tmp_path: Path) -> None:
    df = _ingest(tmp_path, "litellm.csv")
    l1 = _row(df, "chatcmpl-L1")
    assert (l1["recorded_input_tokens"], l1["reported_cache_hit_tokens"], l1["output_tokens"]) == (
        1200,
        1024,
        150,
    )
    assert l1["ttft_s"] == pytest.approx(0.8) and l1["e2e_s"] == pytest.approx(3.5)
    assert (l1["tenant"], l1["session_id"]) == ("team-a", "sess-1")
    l2 = _row(df, "chatcmpl-L2")
    assert (l2["tenant"], l2["reported_cache_hit_tokens"], l2["session_id"]) == ("bob", None, None)
    assert l2["ttft_s"] == pytest.approx(0.3)
    js = _ingest(tmp_path / "j", "litellm.json")
    j1 = _row(js, "chatcmpl-J1")
    assert (j1["recorded_input_tokens"], j1["reported_cache_hit_tokens"], j1["ttft_s"], j1["e2e_s"]) == (
        700,
        512,
        0.5,
        2.0,
    )


def test_generic_mappings(tmp_path: Path) -> None:
    df = _ingest(tmp_path, "mapped.csv", mapping=DIR / "mapped.toml")
    r1 = _row(df, "r1")
    assert r1["source_format"] == "gateway"
    assert r1["arrival"] == _t("2024-12-01T00:00:00")
    assert (r1["recorded_input_tokens"], r1["reported_cache_hit_tokens"], r1["tenant"]) == (
        1000,
        256,
        "org-1",
    )
    assert _row(df, "r2")["reported_cache_hit_tokens"] is None
    nested = _ingest(tmp_path / "n", "mapped_nested.jsonl", mapping=DIR / "mapped_nested.toml")
    n1 = _row(nested, "n1")
    assert (n1["recorded_input_tokens"], n1["reported_cache_hit_tokens"], n1["output_tokens"]) == (
        4000,
        3000,
        100,
    )
    assert n1["arrival"] == _t("2024-12-01T10:00:00") and n1["model"] == "qwen3-32b"


def test_parquet_through_mapping(tmp_path: Path) -> None:
    src = tmp_path / "logs.parquet"
    pl.DataFrame(
        {
            "req": ["p1", "p2"],
            "ts": [datetime(2024, 12, 1, 1, tzinfo=UTC), datetime(2024, 12, 1, 2, tzinfo=UTC)],
            "inp": [10, 20],
            "outp": [1, 2],
        }
    ).write_parquet(src)
    mapping = tmp_path / "m.toml"
    mapping.write_text(
        'format = "parquet"\n[fields]\nrequest_id = "req"\narrival = "ts"\n'
        'recorded_input_tokens = "inp"\noutput_tokens = "outp"\n'
    )
    store = Store(tmp_path / "store")
    assert ingest_logs([src], store, fmt="parquet", mapping=mapping).ok
    got = store.read_requests()
    assert got["request_id"].to_list() == ["p1", "p2"]
    assert got["arrival"].to_list()[1] == _t("2024-12-01T02:00:00")
    assert got["source_line"].to_list() == [1, 2]


def test_compressed_inputs_and_directories(tmp_path: Path) -> None:
    import gzip

    import zstandard

    logs = tmp_path / "logs"
    logs.mkdir()
    data = (DIR / "openai.jsonl").read_bytes()
    (logs / "a.jsonl.gz").write_bytes(gzip.compress(data))
    (logs / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress((DIR / "anthropic.jsonl").read_bytes()))
    (logs / "README.md").write_text("not a log: skipped inside a directory\n")
    shutil.copy(DIR / "litellm.csv", logs / "c.csv")
    store = Store(tmp_path / "store")
    summary = ingest_logs([logs], store)
    assert summary.ok, summary.errors
    assert summary.total("rows_stored") == 4 + 4 + 2
    assert {f.source_format for f in summary.files} == {"openai", "anthropic", "litellm"}


def test_blank_lines_keep_line_numbers_exact(tmp_path: Path) -> None:
    lines = (DIR / "openai.jsonl").read_text().splitlines()
    src = tmp_path / "gaps.jsonl"
    # Blank and whitespace-only lines are not records, but the next records keep their numbers.
    src.write_text("\n".join([lines[0], "", lines[1], "   ", "\t", lines[2], lines[3]]) + "\n\n")
    store = Store(tmp_path / "store")
    summary = ingest_logs([src], store)
    assert summary.ok and summary.total("rows_read") == 4
    got = dict(store.read_requests().select("request_id", "source_line").iter_rows())
    assert got == {"chatcmpl-A1": 1, "resp_B2": 3, "chatcmpl-C3": 6, "chatcmpl-D4": 7}


def _frames(batches: Iterator[Any]) -> pl.DataFrame:
    return pl.concat([b.frame for b in batches], how="vertical")


@pytest.mark.parametrize(
    "source",
    ["fixture:openai.jsonl", "fixture:anthropic.jsonl", "synth:openai", "synth:anthropic", "synth:mooncake"],
)
def test_fast_and_chunked_readers_give_the_same_flat_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """DuckDB over the whole file and DuckDB over chunks of lines (the robust path, here forced
    down to single lines) give the same flat frame, row for row and line for line, on every
    provider shape in the fixtures and on synth logs."""
    from pipeline.ingest import readers
    from pipeline.ingest.formats import FORMATS

    kind, name = source.split(":")
    if kind == "fixture":
        path = DIR / name
        fmt = name.split(".")[0]
    else:
        fmt = name
        path = tmp_path / f"{name}.jsonl"
        write_logs(generate(SynthConfig(requests=100, seed=4, duration_s=3600)), name, path)
    spec = FORMATS[fmt]
    fast = _frames(readers.jsonl_fast(path, spec))
    robust = _frames(readers.jsonl_robust(path, spec))
    assert fast.height > 0 and fast.equals(robust)

    real_parse = readers._ChunkParser.parse

    def one_line_at_a_time(self: Any, lines: list[bytes]) -> Any:
        return real_parse(self, lines) if len(lines) == 1 else None  # reject every chunk: split to lines

    monkeypatch.setattr(readers._ChunkParser, "parse", one_line_at_a_time)
    assert fast.equals(_frames(readers.jsonl_robust(path, spec)))


def test_a_record_has_one_text_whichever_path_reads_it(tmp_path: Path) -> None:
    """Values that are JSON numbers keep DuckDB's text (``1500.0``, ``1e-07``) on the fast path
    and next to a bad line alike, so a record logged in a clean file and again in a file with a
    malformed neighbour is one record: the second copy is a duplicate."""
    rec = {
        "timestamp": "2025-01-15T00:00:00Z",
        "response": {"id": 1500.0, "model": 1e-07, "usage": {"prompt_tokens": 10, "completion_tokens": 2}},
    }
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps(rec) + "\n")
    noisy = tmp_path / "noisy.jsonl"
    noisy.write_text(json.dumps(rec) + '\n{"timestamp": \n')
    store = Store(tmp_path / "s")
    s = ingest_logs([clean, noisy], store)
    assert [(f.rows_read, f.rows_stored, f.rows_quarantined, f.rows_duplicate) for f in s.files] == [
        (1, 1, 0, 0),
        (2, 0, 1, 1),
    ]
    got = store.read_requests()
    assert got["request_id"].to_list() == ["1500.0"] and got["model"].to_list() == ["1e-07"]


def test_bad_lines_deep_in_a_file_are_quarantined_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed line that DuckDB meets after it has streamed some batches (its error then
    arrives as an OSError through the Arrow stream) sends the file to the robust path: the bad
    lines are quarantined with their reasons, every other line is stored. Splitting rejected
    chunks into tenths before bisecting gives the same result as bisecting whole batches."""
    from functools import partial

    from pipeline.ingest import core, readers

    path = tmp_path / "day.jsonl"
    write_logs(generate(SynthConfig(requests=3000, seed=8, duration_s=3600)), "openai", path)
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(2500, '{"timestamp": "2025-01-15T00:00:00Z", "response": {"usage": \n')
    lines.insert(1200, "[1, 2]\n")
    path.write_text("".join(lines))
    monkeypatch.setattr(core, "jsonl_fast", partial(readers.jsonl_fast, batch_rows=200))

    results = []
    for bisect_lines in (10**6, 40):
        monkeypatch.setattr(readers, "BISECT_LINES", bisect_lines)
        store = Store(tmp_path / f"s{bisect_lines}")
        s = ingest_logs([path], store)
        assert s.ok and (s.total("rows_read"), s.total("rows_stored"), s.total("rows_quarantined")) == (3002, 3000, 2)
        q = pl.read_parquet(store.quarantine_dir / "*.parquet").sort("source_line")
        assert q["source_line"].to_list() == [1201, 2502]
        assert q["reason"][0].startswith("record is an array") and q["reason"][1].startswith("invalid JSON")
        results.append(store.read_requests().drop("source_file"))
    assert results[0].equals(results[1])


def test_many_bad_lines_are_screened_not_bisected_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Truncated lines scattered through a file are found by Python's JSON parser in one pass over
    a rejected batch, so DuckDB is called a handful of times, not ~20 times per bad line; every bad
    line is quarantined with its reason and every good one stored."""
    from pipeline.ingest import readers

    path = tmp_path / "day.jsonl"
    write_logs(generate(SynthConfig(requests=2000, seed=12, duration_s=3600)), "openai", path)
    lines = path.read_text().splitlines(keepends=True)
    bad_at = list(range(7, 2000, 40))  # 50 truncated lines
    for i in bad_at:
        lines[i] = lines[i][:60] + "\n"
    path.write_text("".join(lines))
    calls: list[int] = []
    real_parse = readers._ChunkParser.parse

    def counted(self: Any, chunk: list[bytes]) -> Any:
        calls.append(len(chunk))
        return real_parse(self, chunk)

    monkeypatch.setattr(readers._ChunkParser, "parse", counted)
    store = Store(tmp_path / "s")
    s = ingest_logs([path], store)
    assert (s.total("rows_read"), s.total("rows_stored"), s.total("rows_quarantined")) == (2000, 1950, 50)
    q = pl.read_parquet(store.quarantine_dir / "*.parquet").sort("source_line")
    assert q["source_line"].to_list() == [i + 1 for i in bad_at]
    assert all(r.startswith("invalid JSON") for r in q["reason"].to_list())
    assert len(calls) <= 3, calls


def test_large_json_documents_are_detected_past_the_sniffed_head(tmp_path: Path) -> None:
    """A pretty-printed OTLP export or LiteLLM JSON array larger than the 64 KiB head that format
    detection reads is still recognised (by its first key, or its first whole element) and read
    in full without --format."""
    import copy

    doc = json.loads((DIR / "otel.json").read_text())
    scope = doc["resourceSpans"][0]["scopeSpans"][0]
    genai = [sp for sp in scope["spans"] if any(a["key"].startswith("gen_ai.") for a in sp["attributes"])]
    spans = []
    for i in range(400):
        sp = copy.deepcopy(genai[i % len(genai)])
        sp["spanId"] = f"{i:016x}"
        for a in sp["attributes"]:
            if a["key"] == "gen_ai.response.id":
                a["value"] = {"stringValue": f"otel-{i}"}
        spans.append(sp)
    scope["spans"] = spans
    otel = tmp_path / "big_otel.json"
    otel.write_text(json.dumps(doc, indent=2))
    rows = json.loads((DIR / "litellm.json").read_text())
    array = [dict(rows[i % len(rows)], request_id=f"ll-{i}") for i in range(600)]
    litellm = tmp_path / "big_litellm.json"
    litellm.write_text(json.dumps(array, indent=2))
    assert otel.stat().st_size > 1 << 16 and litellm.stat().st_size > 1 << 16
    store = Store(tmp_path / "s")
    s = ingest_logs([otel, litellm], store)
    assert s.ok, s.errors
    assert [(f.source_format, f.rows_read) for f in s.files] == [("otel", 400), ("litellm", 600)]
    assert s.total("rows_stored") == 1000


def test_format_detected_when_the_first_record_is_longer_than_the_head(tmp_path: Path) -> None:
    """Detection reads 64 KiB; a JSON Lines file whose first record is longer (a large logged
    request) is still detected by reading on to the end of that record."""
    big = {
        "timestamp": "2025-01-15T00:00:00Z",
        "request": {"model": "m", "metadata": {"session_id": "s", "note": "x" * 70_000}},
        "response": {"id": "big", "usage": {"prompt_tokens": 7, "completion_tokens": 1}},
    }
    small = dict(
        big, request={"model": "m"}, response={"id": "small", "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    )
    path = tmp_path / "big_first.jsonl"
    path.write_text(json.dumps(big) + "\n" + json.dumps(small) + "\n")
    s = ingest_logs([path], Store(tmp_path / "s"))
    assert s.ok, s.errors
    assert [(f.source_format, f.rows_stored) for f in s.files] == [("openai", 2)]
