"""A log format's identity is its spec: detection reads each format's rule from its FormatSpec
(pipeline/ingest/formats.py, ``Sniff``), source.py holds no format's keys, and defaults.py's
hand copy of the names (kept for ``--help``) equals the specs."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from pipeline.common import defaults
from pipeline.ingest import formats, source
from pipeline.ingest.formats import ALL_FORMATS, FORMATS, SNIFFED, Sniff
from pipeline.ingest.source import SourceError, sniff_format
from pipeline.synth.generate import SynthConfig, generate
from pipeline.synth.writers import LINE_WRITERS

ROOT = Path(__file__).resolve().parents[1]
CSV_KINDS = ("csv", "csv_or_json")


def _sample(fmt: str) -> str:
    """The head of a real log of ``fmt`` as ``rooftrace synth`` writes it: the header and first
    row of a CSV format, the first record of a JSON one."""
    df = generate(SynthConfig(requests=3, duration_s=60.0, seed=5, tenants=1, models=("llama-3.1-8b",)))
    lines = [ln for chunk in LINE_WRITERS[fmt](df) for ln in chunk.splitlines() if ln.strip()]
    return "\n".join(lines[:2]) + "\n" if FORMATS[fmt].kind == "csv" else lines[0] + "\n"


def test_every_named_format_has_a_detection_rule_on_its_spec_in_a_unique_rank() -> None:
    assert set(FORMATS) == {"openai", "anthropic", "litellm", "azure", "mooncake", "vidur", "otel"}
    for name, spec in FORMATS.items():
        assert isinstance(spec.sniff, Sniff), name
    ranks = [spec.sniff.rank for spec in FORMATS.values() if spec.sniff is not None]
    assert len(set(ranks)) == len(ranks)  # no two rules tie: the order is the specs'
    assert [name for name, _ in SNIFFED] == ["otel", "mooncake", "azure", "vidur", "litellm", "anthropic", "openai"]
    # a CSV rule only where the format can be CSV; JSON clauses only where it can be JSON
    for name, spec in FORMATS.items():
        rule = spec.sniff
        assert rule is not None
        has_csv = bool(rule.csv_columns)
        has_json = bool(rule.json_keys or rule.json_text or rule.json_values or rule.json_leading_key)
        assert has_csv == (spec.kind in CSV_KINDS), name
        assert has_json == (spec.kind != "csv"), name
        # a CSV rule's columns are among the columns a forced read requires
        if spec.kind == "csv":
            assert rule.csv_columns <= set(spec.required_columns), name


def test_source_holds_no_format_keys_it_reads_the_specs() -> None:
    # the detection code names no format and no field: every rule's keys appear only in formats.py
    tree = ast.parse((ROOT / "pipeline" / "ingest" / "source.py").read_text())
    start = next(n.lineno for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "sniff_format")
    strings = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and getattr(n, "lineno", 0) >= start
    }
    for name, rule in SNIFFED:
        keys = {*rule.csv_columns, *rule.json_text, *(k for s in rule.json_keys for k in s)}
        keys |= {k for k, _ in rule.json_values} | ({rule.json_leading_key} - {""})
        assert not (strings & (keys | {name})), (name, strings & (keys | {name}))
    assert source.SNIFFED is formats.SNIFFED


@pytest.mark.parametrize("fmt", sorted(LINE_WRITERS))
def test_a_one_record_sample_of_each_format_is_detected_as_that_format(fmt: str) -> None:
    head = _sample(fmt).encode()
    suffix = ".csv" if FORMATS[fmt].kind == "csv" or (fmt == "litellm" and not head.startswith(b"{")) else ".jsonl"
    assert sniff_format(Path(f"day{suffix}"), head) == fmt


# hand-written first records, one per clause of each rule (the synth writers show one clause each)
_CLAUSES = [
    ('{"custom_id": "r1", "response": {"body": {}}}', "openai"),  # Batch API line
    ('{"id": "r", "usage": {"input_tokens": 5, "output_tokens": 2}}', "openai"),  # Responses usage
    ('{"id": "r", "usage": {"prompt_tokens": 5}}', "openai"),
    ('{"id": "m", "type": "message", "usage": {}}', "anthropic"),
    ('{"custom_id": "b", "result": {"type": "succeeded"}}', "anthropic"),  # ranked before openai
    ('{"usage": {"input_tokens": 5, "cache_read_input_tokens": 3}}', "anthropic"),
    ('{"request_id": "x", "startTime": "2025-01-15T00:00:00Z", "prompt_tokens": 5}', "litellm"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}', "mooncake"),
    ('{"resourceSpans": []}', "otel"),
    ('"TIMESTAMP","ContextTokens","GeneratedTokens"\n2023-11-16 18:15:46.6805900,374,44\n', "azure"),
    ("num_prefill_tokens,num_decode_tokens\n100,20\n", "vidur"),
    ("request_id,startTime,prompt_tokens,completion_tokens\nr,2025-01-15T00:00:00Z,5,2\n", "litellm"),
]


@pytest.mark.parametrize(("text", "fmt"), _CLAUSES)
def test_each_clause_of_each_rule_picks_its_format(text: str, fmt: str) -> None:
    name = "day.csv" if not text.startswith("{") else "day.jsonl"
    assert sniff_format(Path(name), text.encode()) == fmt


def test_a_cut_short_otlp_document_is_known_by_its_leading_key() -> None:
    head = ('{ "resourceSpans" : [{"resource": {"attributes": [' + '{"key": "k", "value": 1},' * 50).encode()
    assert sniff_format(Path("spans.json"), head, whole=False) == "otel"


def test_a_rule_changed_on_the_spec_changes_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    # the rule is read from the spec, not repeated in source.py: drop mooncake's rule and its
    # record is no longer known; give vidur's header rule another column and its header is not
    line = '{"timestamp": 0, "input_length": 10, "output_length": 2}'
    assert sniff_format(Path("m.jsonl"), line.encode()) == "mooncake"
    rules = tuple((n, r) for n, r in SNIFFED if n != "mooncake")
    monkeypatch.setattr(source, "SNIFFED", rules)
    with pytest.raises(SourceError, match="cannot detect the JSON log format; pass --format"):
        sniff_format(Path("m.jsonl"), line.encode())
    vidur = dict(SNIFFED)["vidur"]
    stricter = dataclasses.replace(vidur, csv_columns=vidur.csv_columns | {"arrived_at"})
    monkeypatch.setattr(source, "SNIFFED", tuple((n, stricter if n == "vidur" else r) for n, r in SNIFFED))
    with pytest.raises(SourceError, match="cannot detect the log format from its header; pass --format"):
        sniff_format(Path("v.csv"), b"num_prefill_tokens,num_decode_tokens\n1,2\n")
    assert sniff_format(Path("v.csv"), b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,2\n") == "vidur"


def test_unknown_records_and_headers_still_ask_for_format() -> None:
    with pytest.raises(SourceError, match=r"day\.jsonl: cannot detect the JSON log format; pass --format"):
        sniff_format(Path("day.jsonl"), json.dumps({"a": 1, "b": {"c": 2}}).encode())
    with pytest.raises(SourceError, match=r"day\.csv: cannot detect the log format from its header; pass --format"):
        sniff_format(Path("day.csv"), b"when,tokens_in,tokens_out\n1,2,3\n")


def test_the_help_copy_of_the_format_names_equals_the_specs() -> None:
    # defaults.py must not import formats.py (polars) for --help, so it keeps a copy: the same
    # names in the same order (the order --format's choices print in)
    assert defaults.INGEST_FORMATS == ALL_FORMATS
    assert defaults.INGEST_FORMATS[: len(FORMATS)] == tuple(FORMATS)
