"""Hostile tester, round 13: fleets and the commands that read them (the small ones; the report,
calibration and measurement findings are tested beside their features)."""

from __future__ import annotations

from pathlib import Path

from cli_checks import cli, one_error

from pipeline.fleet import load_fleet


def test_fit_refuses_more_sequences_than_batched_tokens_as_a_fleet_does(tmp_path: Path) -> None:
    """`fit --max-num-seqs 16777216` said it fits a set-up a fleet file refuses (round 13); and a
    vllm_version with spaces around it is the same release and the same recorded fleet."""
    one_error(
        cli("fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--max-num-seqs", "16777216"),
        "--max-num-seqs 16,777,216 is more than --max-num-batched-tokens 8,192",
    )
    fleet = tmp_path / "f.toml"
    head = 'name = "f"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n[engine]\n'
    fleet.write_text(head + 'vllm_version = " 0.11.1 "\n')
    spaced = load_fleet(fleet).to_dict()
    fleet.write_text(head + 'vllm_version = "0.11.1"\n')
    assert spaced == load_fleet(fleet).to_dict()


def test_a_moe_intermediate_size_of_zero_is_refused(tmp_path: Path) -> None:
    """moe_intermediate_size = 0 was read as unset (the dense intermediate size: 435 GiB of
    weights for Qwen3-30B-A3B), where head_dim = 0 is refused (round 13)."""
    from pipeline.catalog import models_dir

    text = (
        (models_dir() / "qwen3-30b-a3b.toml")
        .read_text()
        .replace("moe_intermediate_size = 768", "moe_intermediate_size = 0")
    )
    model = tmp_path / "zero.toml"
    model.write_text(text)
    one_error(
        cli("fit", "--model", str(model), "--hardware", "h100-sxm"),
        "moe_intermediate_size must be > 0 when given, got 0",
    )


def test_plan_window_day_with_a_window_length_is_refused() -> None:
    """`plan --window day --window-s 5` ignored --window-s without a word (round 13)."""
    res = cli("plan", "--model", "llama-3.1-8b", "--window", "day", "--window-s", "5")
    assert res.exit_code == 2 and "--window-s is the length of the peak window" in res.output


def test_a_too_deep_expression_does_not_suggest_a_refused_set(tmp_path: Path) -> None:
    """DuckDB's hint 'Use "SET max_expression_depth TO x"' pointed at a statement the sandbox
    refuses (round 13)."""
    from pipeline.store import Store

    store = Store(tmp_path / "st")
    store.root.mkdir(parents=True)
    res = cli("sql", "SELECT " + "+".join(["1"] * 3000), "--store", str(store.root))
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "SET max_expression_depth" not in res.stderr
    assert "expression depth" in res.stderr and "fewer nested terms" in res.stderr


def test_a_run_of_an_earlier_schema_says_to_replay_it(tmp_path: Path) -> None:
    """requests.parquet went to replay_requests v2 (the warmup column), then v3 (cache_hit_source):
    a run written before says what to do, not only which versions differ."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pytest

    from pipeline.errors import SchemaError
    from pipeline.schemas import META_NAME, META_VERSION, read_parquet

    path = tmp_path / "requests.parquet"
    table = pa.table({"request_id": ["a"]}).replace_schema_metadata({META_NAME: b"replay_requests", META_VERSION: b"1"})
    pq.write_table(table, path)
    with pytest.raises(
        SchemaError, match=r"version 1, this rooftrace reads 3 \(written by an earlier rooftrace: make it again"
    ):
        read_parquet(path, "replay_requests")
