"""The bad-input corpus: every malformation is quarantined (or the file reported) with the right
reason, no traceback, and rows read = stored + quarantined + duplicates, per file and in total."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.common.schemas import read_parquet
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store

GOOD_USAGE = {"prompt_tokens": 100, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0}}


def oa(**over: object) -> str:
    rec: dict[str, object] = {"id": "x", "object": "chat.completion", "created": 1733011200, "model": "m"}
    rec["usage"] = dict(GOOD_USAGE)
    for k, v in over.items():
        if k.startswith("usage_"):
            usage = rec["usage"]
            assert isinstance(usage, dict)
            if v is None:
                usage.pop(k[6:], None)
            else:
                usage[k[6:]] = v
        elif v is None:
            rec.pop(k, None)
        else:
            rec[k] = v
    return json.dumps(rec)


# (line, expected field or None, expected reason fragment) — OpenAI JSON Lines.
OPENAI_BAD = [
    ("{bad json", None, "invalid JSON"),
    ("[1, 2]", None, "not an object"),
    ('"just a string"', None, "not an object"),
    (oa(id="u1", usage=None), "usage.prompt_tokens", "missing token count usage.prompt_tokens"),
    (oa(id="u2", usage_prompt_tokens="abc"), "usage.prompt_tokens", "is not a number: abc"),
    (oa(id="u3", usage_prompt_tokens=-5), "usage.prompt_tokens", "is negative"),
    (oa(id="u4", usage_prompt_tokens=12.5), "usage.prompt_tokens", "not a whole number"),
    (
        oa(id="u5", usage_prompt_tokens_details={"cached_tokens": 500}),
        "usage.prompt_tokens_details.cached_tokens",
        "exceeds",
    ),
    (oa(id="u6", created=None), "timestamp/created", "missing timestamp"),
    (oa(id="u7", created=None, timestamp="yesterday"), "timestamp/created", "unparseable timestamp"),
    (
        oa(id="u8", usage_completion_tokens=None),
        "usage.completion_tokens",
        "missing token count usage.completion_tokens",
    ),
    (
        oa(id="u9", usage_completion_tokens_details={"reasoning_tokens": 11}),
        "usage.completion_tokens_details.reasoning_tokens",
        "exceeds usage.completion_tokens",
    ),
    (oa(id="u10", usage=5), None, "does not match the openai layout"),
    (oa(id="u11", ttft_s=-0.1), "ttft_s", "ttft_s is negative"),
    (oa(id="u12", ttft_s=3.0, e2e_s=1.0), "ttft_s", "exceeds end-to-end"),
    (oa(id="u13", e2e_s="fast"), "e2e_s", "e2e_s is not a number"),
    (oa(id="u14", created=None, timestamp=5), "timestamp/created", "unparseable timestamp"),
    (oa(id="u15", usage_completion_tokens=True), "usage.completion_tokens", "is not a number"),
    (oa(id="u16", usage_prompt_tokens={"n": 1}), "usage.prompt_tokens", "is not a number"),
    (
        oa(id="u17", usage_completion_tokens_details={"reasoning_tokens": "lots"}),
        "usage.completion_tokens_details.reasoning_tokens",
        "is not a number",
    ),
]

ANTHROPIC_BAD = [
    (
        '{"id":"a1","type":"message","timestamp":"2024-12-01T00:00:00Z","usage":{"output_tokens":3}}',
        "usage.input_tokens",
        "missing token count usage.input_tokens",
    ),
    (
        '{"id":"a2","type":"message","timestamp":"2024-12-01T00:00:00Z","usage":{"input_tokens":3,"output_tokens":3,"cache_read_input_tokens":"x"}}',
        "usage.cache_read_input_tokens",
        "is not a number",
    ),
    (
        '{"id":"a3","type":"message","timestamp":"2024-12-01T00:00:00Z","usage":{"input_tokens":3,"output_tokens":3,"cache_creation_input_tokens":-1}}',
        "usage.cache_creation_input_tokens",
        "is negative",
    ),
    (
        '{"id":"a4","type":"message","usage":{"input_tokens":3,"output_tokens":3}}',
        "timestamp",
        "missing timestamp",
    ),
]

AZURE_BAD = [
    ("2023-11-16 18:15:46.6805900,374,44,9", None, "expected 3 fields, found 4"),
    ("2023-11-16 18:15:47.0000000,,44", "ContextTokens", "missing token count ContextTokens"),
    ("not-a-time,10,10", "TIMESTAMP", "unparseable timestamp"),
    ('2023-11-16 18:15:48.0000000,"1,000",5', "ContextTokens", "is not a number: 1,000"),
    ("2023-11-16 18:15:49.0000000,10,-2", "GeneratedTokens", "is negative"),
]

MOONCAKE_BAD = [
    (
        '{"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": ["a", 1]}',
        "hash_ids",
        "not a non-negative integer",
    ),
    (
        '{"timestamp": "soon", "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}',
        "timestamp",
        "unparseable timestamp",
    ),
]

OTEL_BAD_SPAN = {
    "resourceSpans": [
        {
            "scopeSpans": [
                {
                    "spans": [
                        {
                            "traceId": "t",
                            "spanId": "s",
                            "startTimeUnixNano": "1733011200000000000",
                            "endTimeUnixNano": "1733011201000000000",
                            "attributes": [{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "9"}}],
                        }
                    ]
                }
            ]
        }
    ]
}
OTEL_BAD = [
    (
        json.dumps(OTEL_BAD_SPAN),
        "gen_ai.usage.output_tokens",
        "missing token count gen_ai.usage.output_tokens",
    ),
    ('{"somethingElse": []}', None, "no resourceSpans"),
]

LITELLM_HEADER = "request_id,startTime,endTime,completionStartTime,model,prompt_tokens,completion_tokens"
LITELLM_BAD = [
    ("l1,garbage,2024-12-01 00:00:01,2024-12-01 00:00:00.5,m,10,1", "startTime", "unparseable timestamp"),
    (
        "l2,2024-12-01 00:00:00,2024-12-01 00:00:01,2024-12-01 00:00:02,m,10,1",
        "completionStartTime",
        "exceeds end-to-end",
    ),
]

GOOD_OPENAI = [oa(id=f"g{i}") for i in range(3)]
# One good record per format: a file whose every row is quarantined fails as a whole
# (tests/test_ingest_hostile.py), so each bad corpus file also holds a record that is stored.
GOOD_ANTHROPIC = (
    '{"id":"ag","type":"message","timestamp":"2024-12-01T00:00:00Z","usage":{"input_tokens":3,"output_tokens":3}}'
)
GOOD_MOONCAKE = '{"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}'
GOOD_OTEL_SPAN = json.loads(json.dumps(OTEL_BAD_SPAN))
GOOD_OTEL_SPAN["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].append(
    {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "2"}}
)
GOOD_LITELLM = "lg,2024-12-01 00:00:00,2024-12-01 00:00:01,2024-12-01 00:00:00.5,m,10,1"


def _write(path: Path, lines: list[str], header: str | None = None) -> Path:
    body = ([header] if header else []) + lines
    path.write_text("\n".join(body) + "\n")
    return path


def _cases(tmp_path: Path) -> list[tuple[Path, str, str | None, list[tuple[str, str | None, str]], int]]:
    """(file, format, date, bad cases in file order, good rows)"""
    good_azure = "2023-11-16 18:15:50.0000000,10,10"
    return [
        (
            _write(tmp_path / "openai.jsonl", GOOD_OPENAI + [c[0] for c in OPENAI_BAD]),
            "openai",
            None,
            OPENAI_BAD,
            3,
        ),
        (
            _write(tmp_path / "anth.jsonl", [GOOD_ANTHROPIC] + [c[0] for c in ANTHROPIC_BAD]),
            "anthropic",
            None,
            ANTHROPIC_BAD,
            1,
        ),
        (
            _write(
                tmp_path / "azure.csv",
                [good_azure] + [c[0] for c in AZURE_BAD],
                "TIMESTAMP,ContextTokens,GeneratedTokens",
            ),
            "azure",
            None,
            AZURE_BAD,
            1,
        ),
        (
            _write(tmp_path / "moon.jsonl", [GOOD_MOONCAKE] + [c[0] for c in MOONCAKE_BAD]),
            "mooncake",
            "2024-01-01",
            MOONCAKE_BAD,
            1,
        ),
        (
            _write(tmp_path / "otel.jsonl", [json.dumps(GOOD_OTEL_SPAN)] + [c[0] for c in OTEL_BAD]),
            "otel",
            None,
            OTEL_BAD,
            1,
        ),
        (
            _write(tmp_path / "lite.csv", [GOOD_LITELLM] + [c[0] for c in LITELLM_BAD], LITELLM_HEADER),
            "litellm",
            None,
            LITELLM_BAD,
            1,
        ),
    ]


def test_corpus_has_at_least_25_distinct_malformations() -> None:
    reasons = {
        (c[1], c[2])
        for group in (OPENAI_BAD, ANTHROPIC_BAD, AZURE_BAD, MOONCAKE_BAD, OTEL_BAD, LITELLM_BAD)
        for c in group
    }
    assert len(reasons) >= 25


def test_every_malformation_quarantined_with_its_reason(tmp_path: Path) -> None:
    for path, fmt, date, bad, good in _cases(tmp_path):
        store = Store(tmp_path / f"store-{fmt}")
        summary = ingest_logs([path], store, fmt=fmt, date=date)
        assert summary.ok, summary.errors
        res = summary.files[0]
        assert res.rows_read == len(bad) + good, fmt
        assert res.rows_quarantined == len(bad), fmt
        assert res.rows_stored == good
        assert res.rows_read == res.rows_stored + res.rows_quarantined + res.rows_duplicate
        files = list(store.quarantine_dir.glob("*.parquet"))
        assert len(files) == 1
        q = pl.from_arrow(read_parquet(files[0], "quarantine"))
        assert isinstance(q, pl.DataFrame)
        q = q.sort("source_line")
        assert q.height == len(bad)
        for (raw, field, fragment), row in zip(bad, q.iter_rows(named=True), strict=True):
            assert fragment in row["reason"], (fmt, raw, row["reason"])
            if field is not None:
                assert row["field"] == field, (fmt, raw, row["field"])
            if fmt == "otel" and row["raw"].startswith('{"traceId"'):
                # a span's record keeps the span's own JSON (test_ingest_streaming)
                spans = json.loads(raw)["resourceSpans"][0]["scopeSpans"][0]["spans"]
                assert json.loads(row["raw"]) in spans, (raw, row["raw"])
            else:
                assert row["raw"].strip() == raw.strip()
            assert row["source_file"] == str(path)
        # The manifest records the same accounting.
        man = pl.from_arrow(read_parquet(store.manifest_path, "manifest"))
        assert isinstance(man, pl.DataFrame)
        assert man.select("rows_read", "rows_stored", "rows_quarantined", "rows_duplicate").row(0) == (
            res.rows_read,
            res.rows_stored,
            res.rows_quarantined,
            res.rows_duplicate,
        )


def test_duplicates_are_counted_not_stored(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", [oa(id="d1"), oa(id="d2"), oa(id="d1")])
    b = _write(tmp_path / "b.jsonl", [oa(id="d2"), oa(id="d3")])
    store = Store(tmp_path / "store")
    s = ingest_logs([a, b], store)
    assert (s.total("rows_read"), s.total("rows_stored"), s.total("rows_duplicate")) == (5, 3, 2)
    assert [f.rows_duplicate for f in s.files] == [1, 1]
    assert sorted(store.read_requests()["request_id"]) == ["d1", "d2", "d3"]
    # Against the store in a later run too.
    c = _write(tmp_path / "c.jsonl", [oa(id="d3"), oa(id="d4")])
    s2 = ingest_logs([c], store)
    assert (s2.total("rows_stored"), s2.total("rows_duplicate")) == (1, 1)


@pytest.mark.parametrize(
    ("name", "content", "fmt", "fragment"),
    [
        ("trunc.jsonl.gz", gzip.compress(b'{"a": 1}\n' * 2000, mtime=0)[:-40], None, "cannot read"),
        ("binary.jsonl", b"\x00\x01\x02\xff" * 100, None, "binary file"),
        ("forced.jsonl", (oa() + "\n").encode(), "azure", "not a azure CSV: header lacks"),
        ("empty.jsonl", b"", None, "empty file"),
        ("unknown.csv", b"a,b,c\n1,2,3\n", None, "cannot detect the log format"),
        (
            "moon.jsonl",
            b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n',
            "mooncake",
            "pass --date",
        ),
    ],
)
def test_unreadable_file_is_reported_and_others_still_ingest(
    tmp_path: Path, name: str, content: bytes, fmt: str | None, fragment: str
) -> None:
    bad = tmp_path / name
    bad.write_bytes(content)
    good = _write(tmp_path / "good.jsonl", GOOD_OPENAI)
    store = Store(tmp_path / "store")
    if fmt is None:
        summary = ingest_logs([bad, good], store)
    else:
        summary = ingest_logs([bad], store, fmt=fmt)
        summary.files += ingest_logs([good], store).files
    assert not summary.ok
    assert len(summary.errors) == 1 and fragment in summary.errors[0] and str(bad) in summary.errors[0]
    assert "\n" not in summary.errors[0]
    assert store.read_requests().height == 3
    # A failed file is not in the manifest, so a fixed re-run is not skipped as "already ingested".
    man = pl.from_arrow(read_parquet(store.manifest_path, "manifest"))
    assert isinstance(man, pl.DataFrame)
    assert str(bad) not in man["source_file"].to_list()


def test_cli_reports_one_line_and_exit_code(tmp_path: Path) -> None:
    bad = tmp_path / "binary.jsonl"
    bad.write_bytes(b"\x00" * 64)
    good = _write(tmp_path / "good.jsonl", [*GOOD_OPENAI, "{oops"])
    runner = CliRunner()
    res = runner.invoke(main, ["ingest", str(bad), str(good), "--store", str(tmp_path / "s"), "--json"])
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    doc = json.loads(res.stdout)
    assert (doc["rows_read"], doc["rows_stored"], doc["rows_quarantined"]) == (4, 3, 1)
    assert "Traceback" not in res.output
    assert "binary file" in res.stderr
    # Usage errors are exit code 2.
    assert runner.invoke(main, ["ingest"]).exit_code == 2
    assert runner.invoke(main, ["ingest", str(good), "--format", "nope"]).exit_code == 2
    # A bad --date is the user's to fix: exit 1 with one line.
    res = runner.invoke(main, ["ingest", str(good), "--date", "2024-13", "--store", str(tmp_path / "s2")])
    assert res.exit_code == 1 and "not YYYY-MM-DD" in res.stderr


_number_text = st.one_of(
    st.none(),
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=" \t0123456789.eE+-xna", max_size=8),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_number_text, st.sampled_from(["", " ", "\t", "  "]), st.sampled_from(["", " ", "\n"]))))
def test_number_parse_equals_strip_then_cast(values: list[tuple[str | None, str, str]]) -> None:
    """The token/latency number parse (cast first, strip and retry only what failed) gives what
    stripping every value and casting gives, on numbers, padding and garbage alike."""
    from pipeline.ingest.normalize import _number

    texts = [None if v is None else f"{a}{v}{b}" for v, a, b in values]
    series = pl.Series(texts, dtype=pl.String)
    want = series.str.strip_chars().cast(pl.Float64, strict=False)
    got = _number(series)
    assert got.to_list() == want.to_list() or all(
        (g == w) or (g != g and w != w) for g, w in zip(got.to_list(), want.to_list(), strict=True)
    )


def _good_line(i: int) -> str:
    return json.dumps(
        {
            "timestamp": f"2025-01-15T00:00:{i:02d}Z",
            "response": {"id": f"r-{i}", "usage": {"prompt_tokens": 10 + i, "completion_tokens": 2}},
        }
    )


@pytest.mark.parametrize(
    ("odd", "stored"),
    [
        (
            '{"timestamp": "2025-01-15T00:01:00Z", "response": {"id": "tc", "usage": {"prompt_tokens": 5, '
            '"completion_tokens": 1,}}}',
            True,
        ),  # a trailing comma: DuckDB's parser takes it
        (
            '{"timestamp": "2025-01-15T00:01:00Z", "ttft_s": inf, "response": {"id": "inf", "usage": '
            '{"prompt_tokens": 5, "completion_tokens": 1}}}',
            False,
        ),  # read, then quarantined for its ttft
        ("[" * 5000 + "]" * 5000, False),  # nested deeper than Python's parser goes
        ('{"timestamp": "2025-01-15T00:01:00Z", "response": 5}', False),  # a layout DuckDB cannot take
    ],
)
def test_a_line_is_judged_the_same_with_or_without_a_bad_neighbour(tmp_path: Path, odd: str, stored: bool) -> None:
    """An unusual line gets the same fate (stored, or quarantined with the same reason) whether
    the fast path reads its file or a malformed neighbour sends the file to the robust path; no
    reason names the robust path's scratch file."""
    outcomes = []
    for neighbour in ("", "{garbage\n"):
        path = tmp_path / f"f{len(neighbour)}.jsonl"
        path.write_text("\n".join(_good_line(i) for i in range(3)) + "\n" + odd + "\n" + neighbour)
        store = Store(tmp_path / f"s{len(neighbour)}")
        s = ingest_logs([path], store, fmt="openai")
        assert s.ok and s.total("rows_read") == 4 + bool(neighbour)
        q = pl.read_parquet(store.quarantine_dir / "*.parquet") if store.quarantine_dir.exists() else None
        odd_q = [] if q is None else q.filter(pl.col("source_line") == 4)["reason"].to_list()
        outcomes.append((s.total("rows_stored"), odd_q))
        assert all("chunk" not in r and "rooftrace-" not in r for r in ([] if q is None else q["reason"].to_list()))
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0][0] == 4) == stored


def test_byte_order_mark_and_truncated_zstd(tmp_path: Path) -> None:
    """A UTF-8 byte-order mark does not hide the format nor spoil line 1; a .zst file cut short
    is reported as unreadable (like gzip), not half ingested; several zstd frames read whole."""
    import zstandard

    lines = [_good_line(i) for i in range(40)]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + ("\n".join(lines[:5]) + "\n{garbage\n").encode())
    s = ingest_logs([bom], Store(tmp_path / "s1"))
    assert s.ok and (s.total("rows_stored"), s.total("rows_quarantined")) == (5, 1)
    text = ("\n".join(lines) + "\n").encode()
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(zstandard.ZstdCompressor().compress(text)[:-20])
    s = ingest_logs([cut], Store(tmp_path / "s2"))
    assert not s.ok and "truncated" in s.errors[0] and s.total("rows_stored") == 0
    frames = tmp_path / "frames.jsonl.zst"
    half = text.index(b"\n", len(text) // 2) + 1
    zc = zstandard.ZstdCompressor()
    frames.write_bytes(zc.compress(text[:half]) + zc.compress(text[half:]))
    s = ingest_logs([frames], Store(tmp_path / "s3"))
    assert s.ok and s.total("rows_stored") == 40


def test_one_bad_byte_is_a_bad_record_but_a_non_utf8_file_is_refused(tmp_path: Path) -> None:
    """A stray invalid UTF-8 byte near the top quarantines only its record; a file that is mostly
    not UTF-8 (Latin-1 text) is refused as a whole with a one-line reason."""
    lines = [_good_line(i).encode() for i in range(6)]
    lines[1] = lines[1].replace(b'"r-1"', b'"r-\xff1"')
    one = tmp_path / "one.jsonl"
    one.write_bytes(b"\n".join(lines) + b"\n")
    s = ingest_logs([one], Store(tmp_path / "s1"), fmt="openai")
    assert s.ok and (s.total("rows_stored"), s.total("rows_quarantined")) == (5, 1)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes("\n".join(f'{{"note": "{"é" * 40}"}}' for _ in range(50)).encode("latin-1"))
    s = ingest_logs([latin], Store(tmp_path / "s2"), fmt="openai")
    assert not s.ok and "not UTF-8 text" in s.errors[0]


def test_json_lines_whose_first_line_is_an_array(tmp_path: Path) -> None:
    """A JSON Lines file whose first line is a whole JSON array is JSON Lines with a bad record
    (quarantined), not a JSON array document; a real array document is still read by element."""
    path = tmp_path / "x.jsonl"
    path.write_text("[1, 2]\n" + "\n".join(_good_line(i) for i in range(6)) + "\n")
    store = Store(tmp_path / "s")
    s = ingest_logs([path], store, fmt="openai")
    assert s.ok and (s.total("rows_read"), s.total("rows_stored"), s.total("rows_quarantined")) == (7, 6, 1)
    q = pl.read_parquet(store.quarantine_dir / "*.parquet")
    assert q["source_line"].to_list() == [1] and q["reason"][0] == "record is an array, not an object"
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps([json.loads(_good_line(i)) for i in range(6)], indent=1))
    s = ingest_logs([doc], Store(tmp_path / "s2"), fmt="openai")
    assert s.ok and s.total("rows_stored") == 6
