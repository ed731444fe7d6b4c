"""The replay honours the cache hits a log reports (provider ``cached_tokens``): the day it replays
is split into fresh and cache-hit tokens as classify splits it, to the token, for every provider
format that reports them; ``--cache-hits simulated`` and a fleet without prefix caching replay
another split and say so first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner, Result

from pipeline.cli import main
from pipeline.common.schemas import load_schema, read_parquet
from pipeline.engine.model import Workload
from pipeline.ingest.store import Store
from pipeline.replay.run import REPORTED, ReplayOptions, build_workload, cache_split_note, reported_hits

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "fleets" / "default.toml"
#: The provider formats whose logs carry reported cache hits and no prefix chain.
FORMATS = ("openai", "anthropic", "litellm", "otel")


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output + (result.stderr if result.stderr_bytes else "")
    return result


def _day(tmp_path: Path, fmt: str, requests: int = 400) -> Store:
    """A synthetic gateway day in ``fmt`` (provider-reported cached tokens), ingested and classified."""
    runner = CliRunner()
    log = tmp_path / f"day.{fmt}.jsonl"
    store = tmp_path / "store"
    _ok(
        runner.invoke(
            main,
            ["synth", "--format", fmt, "--requests", str(requests), "--hours", "0.1", "--seed", "7",
             "--models", "llama-3.1-8b", "--out", str(log)],
        )
    )  # fmt: skip
    _ok(runner.invoke(main, ["ingest", "--store", str(store), str(log)]))
    _ok(runner.invoke(main, ["classify", "--store", str(store)]))
    return Store(store)


def _replay(store: Store, *extra: str, fleet: Path = FLEET) -> tuple[dict[str, Any], pl.DataFrame, Result]:
    res = _ok(CliRunner().invoke(main, ["replay", "--store", str(store.root), "--fleet", str(fleet), "--json", *extra]))
    doc = json.loads(res.stdout)
    table = pl.from_arrow(read_parquet(Path(doc["run_dir"]) / "requests.parquet", "replay_requests"))
    assert isinstance(table, pl.DataFrame)
    return doc, table, res


def _classified(store: Store) -> tuple[dict[str, object], pl.DataFrame]:
    date = store.resolve_date(None)
    summary = json.loads((store.accounting_dir / "summary" / f"date={date}" / "summary.json").read_text())
    acc = pl.read_parquet(store.accounting_dir / "requests" / f"date={date}" / "part-0.parquet")
    return summary["totals"], acc


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_gateway_day_replays_with_classify_split_to_the_token(tmp_path: Path, fmt: str) -> None:
    store = _day(tmp_path, fmt)
    totals, acc = _classified(store)
    assert acc["cache_hit_source"].unique().to_list() == ["reported"]  # counts only: the log's report
    assert int(totals["cache_hit_tokens"]) > 0
    doc, table, res = _replay(store)
    split = doc["cache_split"]
    assert isinstance(split, dict)
    assert split["cache_hit_tokens"] == totals["cache_hit_tokens"]
    assert split["fresh_input_tokens"] == totals["fresh_input_tokens"]
    assert split["recorded_input_tokens"] == totals["recorded_input_tokens"]
    assert split["by_source"]["reported"]["requests"] == acc.height
    assert split["note"] is None and "CACHE SPLIT" not in res.stderr
    # per request, too: the replay's table against classify's
    both = table.join(acc, on="request_id", suffix="_cls")
    assert both.height == acc.height
    assert (both["cache_hit_tokens"] == both["cache_hit_tokens_cls"]).all()
    assert (both["fresh_input_tokens"] == both["fresh_input_tokens_cls"]).all()
    assert (table["cache_hit_source"] == "reported").all()
    # the engine prefilled exactly the fresh tokens (one token where the whole prompt was cached)
    calm = table.filter((pl.col("status") == "finished") & (pl.col("preemptions") == 0))
    whole = (calm["cache_hit_tokens"] >= calm["recorded_input_tokens"]).sum()
    assert int(calm["prefill_tokens"].sum()) == int(calm["fresh_input_tokens"].sum()) + int(whole)


def test_simulated_hits_prefill_more_and_say_so_first(tmp_path: Path) -> None:
    store = _day(tmp_path, "openai")
    totals, _ = _classified(store)
    doc, table, _ = _replay(store)
    sim_doc, sim, res = _replay(store, "--cache-hits", "simulated")
    assert sim_doc["run_id"] != doc["run_id"]
    # the replicas' own caches, looked up by session chains, serve fewer hits than the provider did
    assert sim_doc["cache_split"]["cache_hit_tokens"] < totals["cache_hit_tokens"]
    assert int(sim["prefill_tokens"].sum()) > int(table["prefill_tokens"].sum())
    # so its first token comes later: the skipped prefill is what the reported run saves
    assert float(sim["ttft_s"].mean()) > float(table["ttft_s"].mean())
    note = sim_doc["cache_split"]["note"]
    assert isinstance(note, str) and note.startswith("CACHE SPLIT")
    assert "--cache-hits simulated ignores" in note
    assert f"classify counts {int(totals['cache_hit_tokens']):,}" in note
    # the first thing said after the progress lines, before any other warning
    assert next(line for line in res.stderr.splitlines() if line.startswith("warning:")) == f"warning: {note}"


def test_a_fleet_without_prefix_caching_prefills_everything_and_says_so(tmp_path: Path) -> None:
    store = _day(tmp_path, "anthropic", requests=200)
    fleet = tmp_path / "nocache.toml"
    fleet.write_text(FLEET.read_text().replace("enable_prefix_caching = true", "enable_prefix_caching = false"))
    res = _ok(CliRunner().invoke(main, ["replay", "--store", str(store.root), "--fleet", str(fleet), "--json"]))
    doc = json.loads(res.stdout)
    assert doc["cache_split"]["cache_hit_tokens"] == 0
    assert "enable_prefix_caching = false" in doc["cache_split"]["note"]


def test_a_logged_zero_token_prompt_stays_zero_in_the_run(tmp_path: Path) -> None:
    fleet = _resolved()
    frame = pl.DataFrame(
        {
            "request_id": ["a", "b", "c"],
            "arrival": pl.Series([0, 1_000_000, 2_000_000]).cast(pl.Datetime("us", "UTC")),
            "model": ["llama-3.1-8b"] * 3,
            "recorded_input_tokens": [0, 40, 40],
            "output_tokens": [3, 3, 3],
            "reported_cache_hit_tokens": [None, 40, 16],
        }
    )
    empty = pl.from_arrow(load_schema("requests").arrow.empty_table())
    assert isinstance(empty, pl.DataFrame)
    frame = pl.concat([empty, frame], how="diagonal_relaxed")  # every requests column, nulls where unset
    work = build_workload(frame, fleet, ReplayOptions())
    np.testing.assert_array_equal(work.prompt_tokens, [1, 40, 40])
    np.testing.assert_array_equal(work.recorded(), [0, 40, 40])
    np.testing.assert_array_equal(work.skipped_tokens(), [-1, 39, 16])


def test_reported_counts_outside_the_prompt_are_refused() -> None:
    fleet = _resolved()
    frame = pl.DataFrame({"reported_cache_hit_tokens": [3, 50]})
    with pytest.raises(Exception, match=r"1 requests report reported_cache_hit_tokens outside \[0, recorded"):
        reported_hits(frame, np.array([10, 40], np.int64), fleet, ReplayOptions())
    # none reported, or the option or the fleet says not to honour them: nothing to honour
    unreported = pl.DataFrame({"reported_cache_hit_tokens": [None, None]}, schema={REPORTED: pl.Int64})
    assert reported_hits(unreported, np.array([10, 40], np.int64), fleet, ReplayOptions()) is None
    assert reported_hits(frame, np.array([10, 40], np.int64), fleet, ReplayOptions(cache_hits="simulated")) is None
    with pytest.raises(Exception, match="--cache-hits must be one of reported, simulated"):
        ReplayOptions(cache_hits="both")


def test_cache_split_note_by_hand() -> None:
    fleet = _resolved()
    split = {
        "requests": 10,
        "recorded_input_tokens": 1000,
        "cache_hit_tokens": 300,
        "fresh_input_tokens": 700,
        "by_source": {
            "none": {"requests": 0, "recorded_input_tokens": 0, "cache_hit_tokens": 0},
            "reported": {"requests": 4, "recorded_input_tokens": 400, "cache_hit_tokens": 200},
            "prefix_cache": {"requests": 6, "recorded_input_tokens": 600, "cache_hit_tokens": 100},
        },
    }
    classified = {
        "requests": 10,
        "cache_hit_tokens": 500,
        "cache_hit_source": {
            "reported": {"requests": 4, "cache_hit_tokens": 200},
            "simulated": {"requests": 6, "cache_hit_tokens": 300},
        },
        "capacity": "unbounded",
    }  # fmt: skip
    config = {"date": "2025-01-15", "options": {"cache_hits": "reported"}, "resolved": fleet.to_dict()}
    note = cache_split_note(split, classified, config)
    assert note is not None
    assert note.startswith("CACHE SPLIT: the replay served 300 of 1,000 recorded input tokens from cache (30.0%)")
    assert "classify counts 500 (50.0%)" in note
    assert "served 100 tokens where classify's cache model (unbounded) counts 300" in note
    assert "(2 × " in note and " KV blocks of 16 tokens" in note
    assert cache_split_note(split, {**classified, "cache_hit_tokens": 300}, config) is None
    assert cache_split_note(split, None, config) is None
    stale = cache_split_note(split, {**classified, "requests": 7}, config)
    assert stale is not None and "classify of 2025-01-15 counted 7 requests, the replay 10" in stale


def test_a_pod_keeps_its_requests_reports() -> None:
    """The reported split survives a replay cut into pods (each pod's rows keep their reports)."""
    from pipeline.engine.shard import _subset

    w = Workload(
        arrival_s=np.zeros(4),
        prompt_tokens=np.array([10, 20, 30, 40], np.int64),
        output_tokens=np.ones(4, np.int64),
        reported_hit_tokens=np.array([-1, 5, 30, -1], np.int64),
    )
    sub = _subset(w, np.array([1, 2], np.int64), keep_affinity=False)
    np.testing.assert_array_equal(sub.skipped_tokens(), [5, 29])


def _resolved() -> Any:
    from pipeline.replay.fleet import load_fleet, resolve

    return resolve(load_fleet(FLEET), str(FLEET))


def test_the_report_says_a_different_split_on_its_first_line(tmp_path: Path) -> None:
    import html as html_lib
    import re

    from pipeline.publish.report import build_report

    store = _day(tmp_path, "litellm", requests=200)
    totals, _ = _classified(store)
    # a 128k context: no request rejected, so the split is the banner's only line
    fleet = tmp_path / "long.toml"
    fleet.write_text(FLEET.read_text().replace("max_model_len = 16384", "max_model_len = 131072"))
    doc, _, _ = _replay(store, "--cache-hits", "simulated", fleet=fleet)
    assert doc["rejected"] == 0
    res = build_report(store, str(doc["run_id"]), out=tmp_path / "report" / "index.html")
    note = res.headline["cache_split_note"]
    assert note == doc["cache_split"]["note"]  # the same classify: the same line as the replay's
    page = html_lib.unescape(res.path.read_text())
    banner = page[page.index('<div class="alert">') : page.index('<div class="cards">')]
    first = re.search(r"<b>(.*?)</b>", banner)
    assert first is not None
    assert first.group(1) == "This run replayed another fresh / cache-hit split than the token figures below"
    items = re.findall(r"<li>(.*?)</li>", banner, re.S)
    assert items[0] == note and f"classify counts {int(totals['cache_hit_tokens']):,}" in items[0]
    assert res.warning_lines()[0] == note
    # the as-reported replay of the same day has no such line
    plain, _, _ = _replay(store, fleet=fleet)
    again = build_report(store, str(plain["run_id"]), out=tmp_path / "plain" / "index.html")
    assert again.headline["cache_split_note"] is None
    assert "CACHE SPLIT" not in again.path.read_text()


def test_a_logged_zero_token_prompt_is_stored_as_logged_by_the_command(tmp_path: Path) -> None:
    """The hostile case end to end: `requests` says 0 and so does the run's table; the engine's
    one computed token is in prefill_tokens."""
    log = tmp_path / "m.jsonl"
    log.write_text(
        '{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}\n'
        '{"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    )
    store = tmp_path / "store"
    _ok(CliRunner().invoke(main, ["ingest", "--store", str(store), "--date", "2024-01-01", str(log)]))
    doc, table, _ = _replay(Store(store))
    rows = table.sort("recorded_input_tokens").select(
        "recorded_input_tokens", "cache_hit_tokens", "fresh_input_tokens", "prefill_tokens", "cache_hit_source"
    )
    assert rows.rows() == [(0, 0, 0, 1, "none"), (600, 0, 600, 600, "prefix_cache")]
    assert doc["cache_split"]["recorded_input_tokens"] == 600
