"""What ``rooftrace ingest`` / ``rooftrace query`` quarantine or refuse: a polars panic on a layout DuckDB
rejects among records without ids, a split file growing during a parallel run, another provider's
records in a file, CSV fields over Python's 128 KiB limit, malformed OTel spans, the 64 MiB
record limit, control characters in file names, the mapped-CSV header message and a query of a
date with no requests."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import polars as pl
import pytest
from cli_checks import cli as _cli
from click.testing import Result

import pipeline.ingest.core as core
import pipeline.ingest.readers as readers
from pipeline.common.schemas import read_parquet
from pipeline.ingest import IngestSummary, ingest_logs
from pipeline.ingest.formats import FORMATS
from pipeline.ingest.readers import FastPathFailed, jsonl_fast
from pipeline.ingest.source import count_lines
from pipeline.ingest.store import Store
from pipeline.synth import SynthConfig, generate, write_logs

TS = '"timestamp":"2025-01-15T00:00:00Z"'
USAGE = '"usage":{"prompt_tokens":100,"completion_tokens":10}'
WITH_ID = [f'{{{TS},"response":{{"id":"{c}","model":"m",{USAGE}}}}}' for c in "abc"]
NO_ID = f'{{{TS},"response":{{"model":"m",{USAGE}}}}}'
#: Valid JSON that DuckDB's OpenAI layout rejects (a duplicate key; a list where usage is an object).
REJECTED = {
    "duplicate_key": f'{{{TS},"response":{{"usage":{{"prompt_tokens":5,"prompt_tokens":7,"completion_tokens":1}}}}}}',
    "usage_list": f'{{{TS},"response":{{"usage":[1,2]}}}}',
}
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2025-01-15 00:00:01,100,10\n2025-01-15 00:00:02,200,20\n"


def _balanced(s: IngestSummary) -> None:
    for f in s.files:
        assert f.rows_read == f.rows_stored + f.rows_quarantined + f.rows_duplicate, f


def _quarantine(store: Store) -> pl.DataFrame:
    files = sorted(store.quarantine_dir.glob("*.parquet"))
    if not files:
        return pl.DataFrame(schema={"source_line": pl.Int64, "field": pl.String, "reason": pl.String})
    got = pl.concat([pl.from_arrow(read_parquet(p, "quarantine")) for p in files])  # type: ignore[misc]
    assert isinstance(got, pl.DataFrame)
    return got.sort("source_file", "source_line", "reason")


def _rows(store: Store) -> pl.DataFrame:
    return pl.concat([store.read_requests(d) for d in store.dates()]).sort("source_file", "source_line")


def _parquet_bytes(store: Store) -> dict[str, str]:
    return {
        str(p.relative_to(store.root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.requests_dir.rglob("*.parquet"))
    }


def _error_lines(res: Result) -> list[str]:
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]


# --- 1. a layout DuckDB rejects, among records without ids: no polars panic -----------------------


@pytest.mark.parametrize("bad", sorted(REJECTED))
def test_a_rejected_layout_among_id_less_records_is_quarantined_not_a_panic(tmp_path: Path, bad: str) -> None:
    """The robust reader assembles a batch from the pieces around the bad line; filtering the
    records without an id left an empty chunk, on which polars' pl.format panicked (a
    BaseException that ended the whole command). Now the good rows are stored (ids derived), the
    bad line quarantined, the other file of the command ingested, and --jobs 2 writes the same."""
    log = tmp_path / "mixed.jsonl"
    log.write_text("\n".join([*WITH_ID, NO_ID, NO_ID, REJECTED[bad]]) + "\n")
    azure = tmp_path / "azure.csv"
    azure.write_text(AZURE)
    stores = []
    for jobs in (1, 2):
        store = Store(tmp_path / f"j{jobs}")
        s = ingest_logs([azure, log], store, jobs=jobs)
        _balanced(s)
        assert s.ok, s.errors
        got = {Path(f.source_file).name: (f.rows_read, f.rows_stored, f.rows_quarantined) for f in s.files}
        assert got == {"azure.csv": (2, 2, 0), "mixed.jsonl": (6, 5, 1)}
        q = _quarantine(store)
        assert q["source_line"].to_list() == [6]
        assert q["reason"][0].startswith("record does not match the openai layout")
        ids = _rows(store).filter(pl.col("source_format") == "openai")["request_id"].to_list()
        assert ids[:3] == ["a", "b", "c"]
        # the two identical records without an id: one content, occurrences 0 and 1
        assert ids[3].startswith("openai:") and ids[3].endswith(":0") and ids[4] == ids[3][:-1] + "1"
        stores.append(store)
    assert _parquet_bytes(stores[0]) == _parquet_bytes(stores[1])


def _panic_in(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the validation of file ``name`` raise pyo3's PanicException (a BaseException)."""
    real = core.finalize

    def finalize(cand: pl.DataFrame, **kw: object) -> object:
        if str(kw["source_file"]).endswith(name):
            raise pl.exceptions.PanicException("assertion failed: i < self.len()")
        return real(cand, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(core, "finalize", finalize)


def test_a_panic_inside_one_file_fails_that_file_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected internal error, a Rust panic included, fails its file with one line; the
    other files of the command are ingested and the exit code is 1."""
    assert not issubclass(pl.exceptions.PanicException, Exception)  # why `except Exception` missed it
    a = tmp_path / "a.jsonl"
    a.write_text("\n".join(WITH_ID) + "\n")
    azure = tmp_path / "azure.csv"
    azure.write_text(AZURE)
    _panic_in("a.jsonl", monkeypatch)
    st = tmp_path / "s"
    res = _cli("ingest", str(a), str(azure), "--store", str(st), "--json")
    assert res.exit_code == 1
    errors = _error_lines(res)
    assert errors == [f"error: {a}: cannot ingest (PanicException: assertion failed: i < self.len())"]
    doc = json.loads(res.stdout)
    assert (doc["rows_read"], doc["rows_stored"]) == (2, 2)
    assert Store(st).read_requests()["source_file"].unique().to_list() == [str(azure)]


def test_a_worker_reports_a_panic_as_the_serial_run_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a --jobs worker runs for a file: the panic is the file's error, the same line as a
    serial run's, in an outcome that pickles back to the parent (the exception itself cannot:
    a PicklingError used to replace the message)."""
    a = tmp_path / "a.jsonl"
    a.write_text("\n".join(WITH_ID) + "\n")
    _panic_in("a.jsonl", monkeypatch)
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(pl.exceptions.PanicException("x"))
    out = core._read_in_worker(a, 0, None, None, core.Context(None), set(), False, tmp_path / "w")
    back = pickle.loads(pickle.dumps(out))
    serial = ingest_logs([a], Store(tmp_path / "s"))
    assert (
        back.res.error == serial.errors[0] == f"{a}: cannot ingest (PanicException: assertion failed: i < self.len())"
    )
    assert back.messages == [f"error: {back.res.error}"] and not back.batches


# --- 2. a split file that grows during a --jobs run -----------------------------------------------


def test_a_split_file_growing_during_the_run_is_read_again_as_grown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pieces are cut from the file's size when it is planned; lines appended after that are
    not read. The manifest records the hash of exactly the bytes the pieces read, so the next run
    sees the file as grown and stores the appended rows (it used to say "already ingested")."""
    log = tmp_path / "day.jsonl"
    write_logs(generate(SynthConfig(requests=600, seed=3, duration_s=3600)), "openai", log)
    extra = tmp_path / "extra.jsonl"
    write_logs(generate(SynthConfig(requests=40, seed=4, date="2025-01-16", duration_s=3600)), "openai", extra)
    original = log.read_bytes()
    n_old, n_new = original.count(b"\n"), extra.read_bytes().count(b"\n")
    monkeypatch.setattr(core, "SPLIT_MIN_BYTES", 1)
    monkeypatch.setattr(core, "PIECE_BYTES", 60_000)
    real = core._split_plan

    def plan_then_grow(path: Path, *args: object) -> object:
        got = real(path, *args)  # type: ignore[arg-type]
        if path == log:
            with log.open("ab") as fh:  # a logger appends while the workers read
                fh.write(extra.read_bytes())
        return got

    monkeypatch.setattr(core, "_split_plan", plan_then_grow)
    store = Store(tmp_path / "s")
    first = ingest_logs([log], store, jobs=2)
    _balanced(first)
    assert first.ok and (first.total("rows_read"), first.total("rows_stored")) == (n_old, n_old)
    manifest = pl.from_arrow(read_parquet(store.manifest_path, "manifest"))
    assert isinstance(manifest, pl.DataFrame)
    assert manifest["content_sha256"].to_list() == [hashlib.sha256(original).hexdigest()]

    monkeypatch.setattr(core, "_split_plan", real)
    said: list[str] = []
    again = ingest_logs([log], store, progress=said.append)
    _balanced(again)
    assert not any(f.skipped for f in again.files)
    assert (again.total("rows_read"), again.total("rows_stored"), again.total("rows_duplicate")) == (
        n_old + n_new,
        n_new,
        n_old,
    )
    assert any("grew since it was ingested" in line for line in said), said
    assert _rows(store).height == n_old + n_new


# --- 3. another provider's records in a file ------------------------------------------------------


def _lines(fmt: str, tmp_path: Path, seed: int) -> list[str]:
    path = tmp_path / f"{fmt}-{seed}.jsonl"
    write_logs(generate(SynthConfig(requests=6, seed=seed, duration_s=600)), fmt, path)
    return path.read_text().splitlines()


@pytest.mark.parametrize(("first", "other"), [("openai", "anthropic"), ("anthropic", "openai")])
def test_another_providers_records_are_quarantined_not_misread(tmp_path: Path, first: str, other: str) -> None:
    """Anthropic messages in a file detected as OpenAI were stored with the input tokens that
    exclude the cache reads (0 for 4,100); OpenAI records in an Anthropic file are the converse."""
    mine, theirs = _lines(first, tmp_path, 1)[:2], _lines(other, tmp_path, 2)[1:3]
    log = tmp_path / "mixed.jsonl"
    log.write_text("\n".join(mine + theirs) + "\n")
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store)
    _balanced(s)
    assert [(f.source_format, f.rows_read, f.rows_stored, f.rows_quarantined) for f in s.files] == [(first, 4, 2, 2)]
    q = _quarantine(store)
    assert q["source_line"].to_list() == [3, 4]
    reason = f"record does not match the {first} layout (looks like {other}); ingest such records with --format {other}"
    assert q["reason"].to_list() == [reason, reason]
    assert q["field"].to_list() == [FORMATS[first].labels["input_raw"]] * 2
    # the same records are stored, with their true counts, when read as what they are
    theirs_file = tmp_path / "theirs.jsonl"
    theirs_file.write_text("\n".join(theirs) + "\n")
    s = ingest_logs([theirs_file], Store(tmp_path / "t"))
    assert s.ok and [f.source_format for f in s.files] == [other] and s.total("rows_stored") == 2


# --- 4. CSV fields beyond Python's 128 KiB ----------------------------------------------------------

LITELLM_HEADER = "request_id,startTime,endTime,completionStartTime,model,user,team_id,prompt_tokens,completion_tokens"
MAPPED_HEADER = (
    "request_id,arrival,model,tenant,session_id,recorded_input_tokens,output_tokens,cache_hit_tokens,reasoning_tokens"
)
MAPPING = """format = "csv"
[fields]
request_id = "request_id"
arrival = "arrival"
model = "model"
tenant = "tenant"
recorded_input_tokens = "recorded_input_tokens"
output_tokens = "output_tokens"
"""


def _litellm_row(i: int, user: str) -> str:
    return f"r{i},2025-01-15 00:00:0{i},2025-01-15 00:00:0{i + 1},2025-01-15 00:00:0{i}.5,m,{user},t,10,2"


def test_a_csv_field_past_128_kib_is_read(tmp_path: Path) -> None:
    """Python's csv reader refuses a field over 131,072 characters by default: the whole file
    failed. The limit is the record limit now (64 MiB)."""
    log = tmp_path / "lite.csv"
    log.write_text("\n".join([LITELLM_HEADER, _litellm_row(1, "a"), _litellm_row(2, "u" * 200_000), ""]))
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store)
    _balanced(s)
    assert s.ok, s.errors
    assert (s.total("rows_stored"), s.total("rows_quarantined")) == (2, 0)


@pytest.mark.parametrize("kind", ["azure", "litellm", "mapped"])
def test_a_csv_field_over_the_record_limit_is_quarantined_naming_line_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A field longer than the limit (here lowered to 1,000 characters) quarantines its record,
    naming its line and field; a quoted one that spans lines is skipped to its end (its lines are
    not taken for records), and the rows around it are stored with their own line numbers."""
    monkeypatch.setattr(readers, "MAX_RECORD_BYTES", 1000)
    # the quoted field passes the limit on its first line: the reader stops there, and its next
    # two lines (which would read as a 4-field and a 2-field record) are skipped with it
    big, quoted = "9" * 1500, '"' + "x" * 1200 + '\n,"",2025-01-15,9\n' + "y" * 10 + '"'
    mapping: list[str] = []
    if kind == "azure":
        header, field = "TIMESTAMP,ContextTokens,GeneratedTokens", "ContextTokens"
        rows = [f"2025-01-15 00:00:0{i},{v},10" for i, v in enumerate(["100", big, "100", quoted, "100"], 1)]
    elif kind == "litellm":
        header, field = LITELLM_HEADER, "user"
        rows = [_litellm_row(i, u) for i, u in enumerate(["a", big, "b", quoted, "c"], 1)]
    else:
        header, field = MAPPED_HEADER, "tenant"
        rows = [f"r{i},2025-01-15T00:00:0{i}Z,m,{t},s,10,2,0,0" for i, t in enumerate(["a", big, "b", quoted, "c"], 1)]
        (tmp_path / "m.toml").write_text(MAPPING)
        mapping = ["--format", "csv", "--mapping", str(tmp_path / "m.toml")]
    log = tmp_path / f"{kind}.csv"
    log.write_text("\n".join([header, *rows]) + "\n")  # line 5 holds a quoted field of 3 lines
    store = Store(tmp_path / "s")
    res = _cli("ingest", str(log), "--store", str(store.root), "--json", *mapping)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["rows_read"], doc["rows_stored"], doc["rows_quarantined"]) == (5, 3, 2)
    q = _quarantine(store)
    assert q["source_line"].to_list() == [3, 5]
    assert q["field"].to_list() == [field, field]
    assert (
        q["reason"].to_list()
        == [f"field longer than 1,000 characters (the most ingest reads in one CSV field): {field}"] * 2
    )
    assert q["raw"][1].startswith(rows[3][:30]) and "yyy" in q["raw"][1]
    assert _rows(store)["source_line"].to_list() == [2, 4, 8]


# --- 5. malformed OTel spans ------------------------------------------------------------------------


def _otel(spans: object) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "x"}, "spans": spans}]}]})


def _span(i: int, attributes: object) -> dict[str, object]:
    start = 1736900794701253000 + i * 10**9
    return {
        "traceId": "0" * 32,
        "spanId": f"{i:016d}",
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 10**8),
        "attributes": attributes,
    }


GENAI = [
    {"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
    {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "10"}},
    {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "2"}},
]


def test_malformed_otel_spans_are_quarantined_not_lost(tmp_path: Path) -> None:
    """Spans that cannot be read used to vanish from the accounting (rows read counted only the
    GenAI spans found): each is now a quarantined record with its reason."""
    lines = [
        _otel([_span(1, GENAI)]),
        _otel(None),  # line 2
        _otel([5, "x", None]),  # line 3: three spans
        _otel([_span(4, "notalist")]),  # line 4
        _otel([_span(5, [{"key": "gen_ai.usage.input_tokens"}, *GENAI[2:]])]),  # line 5
        _otel([_span(6, [{"key": "http.method"}, *GENAI])]),  # a non-GenAI attribute without a value
        _otel([_span(7, [{"key": "http.method", "value": {"stringValue": "GET"}}])]),  # not a request
    ]
    log = tmp_path / "otel.jsonl"
    log.write_text("\n".join(lines) + "\n")
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store)
    _balanced(s)
    assert s.ok, s.errors
    assert (s.total("rows_read"), s.total("rows_stored"), s.total("rows_quarantined")) == (8, 2, 6)
    q = _quarantine(store)
    assert list(zip(q["source_line"].to_list(), q["reason"].to_list(), strict=True)) == [
        (2, "resourceSpans[1].scopeSpans[1].spans is null, not a list of spans"),
        (3, "span is a number, not an object: resourceSpans[1].scopeSpans[1].spans[1]"),
        (3, "span is a string, not an object: resourceSpans[1].scopeSpans[1].spans[2]"),
        (3, "span is null, not an object: resourceSpans[1].scopeSpans[1].spans[3]"),
        (
            4,
            "span attributes are a string, not a list: span 1 of the record "
            "(resourceSpans[1].scopeSpans[1].spans[1]), spanId 0000000000000004",
        ),
        (
            5,
            "GenAI attribute without a value: gen_ai.usage.input_tokens = null: span 1 of the record "
            "(resourceSpans[1].scopeSpans[1].spans[1]), spanId 0000000000000005",
        ),
    ]
    assert _rows(store)["source_line"].to_list() == [1, 6]


# --- 6. the 64 MiB record limit --------------------------------------------------------------------


def test_count_lines_finds_the_longest_line() -> None:
    data = b"ab\n" + b"x" * 70 + b"\n\nabc"
    for size in (1, 3, 7, 100):
        got = count_lines(iter([data[i : i + size] for i in range(0, len(data), size)]))
        assert (got.lines, got.longest) == (4, 70)


def test_the_record_limit_is_kept_on_every_json_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB reads a record longer than its maximum_object_size (a 70 MB record was stored): the
    fast path now fails on a line past the limit and the robust path quarantines it. The limit is
    lowered to 2,000 bytes here (70 MB files are not written in tests)."""
    monkeypatch.setattr(readers, "MAX_RECORD_BYTES", 2000)
    long = json.dumps({"timestamp": "2025-01-15T00:00:09Z", "note": "n" * 3000, "response": {"id": "long"}})
    log = tmp_path / "a.jsonl"
    log.write_text("\n".join([*WITH_ID, long]) + "\n")
    with pytest.raises(FastPathFailed, match="a line of 3,"):
        list(jsonl_fast(log, FORMATS["openai"]))
    store = Store(tmp_path / "s")
    s = ingest_logs([log], store)
    _balanced(s)
    assert (s.total("rows_stored"), s.total("rows_quarantined")) == (3, 1)
    q = _quarantine(store)
    assert q["source_line"].to_list() == [4]
    assert q["reason"].to_list() == ["record is longer than 2,000 bytes, the most ingest reads"]
    # OTel lines too
    otel = tmp_path / "o.jsonl"
    otel.write_text(_otel([_span(1, GENAI)]) + "\n" + _otel([_span(2, [*GENAI, {"key": "n" * 3000}])]) + "\n")
    s = ingest_logs([otel], Store(tmp_path / "o"))
    _balanced(s)
    assert (s.total("rows_stored"), s.total("rows_quarantined")) == (1, 1)


# --- 7. cosmetics -------------------------------------------------------------------------------------


def test_control_characters_in_a_file_name_are_escaped(tmp_path: Path) -> None:
    weird = tmp_path / "new\nline\x1b[31m.csv"
    weird.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,2\n")
    res = _cli("ingest", str(weird), "--store", str(tmp_path / "s"))  # vidur without --date: fails
    assert res.exit_code == 1
    assert "\x1b" not in res.stderr and "new\nline" not in res.stderr
    errors = _error_lines(res)
    assert len(errors) == 1 and "new\\nline\\x1b[31m.csv: vidur timestamps are relative" in errors[0]
    res = _cli("ingest", str(tmp_path / "no\nsuch.csv"), "--store", str(tmp_path / "s"))
    assert _error_lines(res) == [f"error: {tmp_path}/no\\nsuch.csv: no such file or directory"]


def test_a_missing_mapped_column_names_the_whole_header(tmp_path: Path) -> None:
    log = tmp_path / "m.csv"
    log.write_text(MAPPED_HEADER + "\nr1,2025-01-15T00:00:01Z,m,t,s,10,2,0,0\n")
    mapping = tmp_path / "m.toml"
    mapping.write_text(MAPPING.replace('output_tokens = "output_tokens"', 'output_tokens = "completion_tokens"'))
    s = ingest_logs([log], Store(tmp_path / "s"), fmt="csv", mapping=mapping)
    header = ", ".join(repr(c) for c in MAPPED_HEADER.split(","))
    assert s.errors == [
        f"{log}: the CSV header lacks the mapping's column(s) ['completion_tokens'] (header: [{header}])"
    ]
    assert "reasoning_tokens" in s.errors[0] and "csv CSV" not in s.errors[0]


def test_a_query_of_a_date_without_requests_is_one_error(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text(AZURE)
    st = str(tmp_path / "s")
    assert ingest_logs([azure], Store(Path(st))).ok
    res = _cli("query", "token_totals", "--date", "1999-01-01", "--store", st)
    assert res.exit_code == 1 and res.stdout == ""
    assert _error_lines(res) == [
        f"error: no requests on 1999-01-01 in {st}/requests (it has 2025-01-15); pass one of them as --date"
    ]
    # the stored date, not classified yet: said, then answered once classified
    todo = _cli("query", "token_totals", "--date", "2025-01-15", "--store", st, "--format", "csv")
    assert todo.exit_code == 1 and _error_lines(todo) == [
        "error: 2025-01-15 holds 2 requests but is not classified yet: run rooftrace classify --date 2025-01-15"
    ]
    assert _cli("classify", "--date", "2025-01-15", "--store", st).exit_code == 0
    ok = _cli("query", "token_totals", "--date", "2025-01-15", "--store", st, "--format", "csv")
    assert ok.exit_code == 0, ok.output
