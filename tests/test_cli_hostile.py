"""Hostile values at the command line: store data that looks like rich markup in table output,
absurd --tp, non-finite or unknown --gpu-price, a negative --max-num-batched-tokens, SLO strings
with a target given twice or a percentile finer than its name shows, non-finite --window-s /
--warmup-s. Every refusal is one ``error:`` line naming the option, exit code 1, no traceback."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from pipeline.cli import main
from pipeline.common.errors import ConfigError
from pipeline.replay.slo import parse_slo

HEADER = (
    "request_id,arrival,model,tenant,session_id,recorded_input_tokens,output_tokens,cache_hit_tokens,reasoning_tokens"
)
MAPPING = """format = "csv"
source_format = "synth"
time_unit = "iso"

[fields]
request_id = "request_id"
arrival = "arrival"
model = "model"
tenant = "tenant"
session_id = "session_id"
recorded_input_tokens = "recorded_input_tokens"
output_tokens = "output_tokens"
cache_hit_tokens = "cache_hit_tokens"
reasoning_tokens = "reasoning_tokens"
"""
#: A log folder and file named like a closing markup tag (the ingest_accounting query shows it).
LOG = Path("[/x]") / "m.csv"


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _one_error_line(res: Result) -> str:
    """The single ``error:`` line of a failed command (exit 1), with no traceback anywhere."""
    assert res.exit_code == 1, (res.exit_code, res.output)
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr
    return errors[0]


@pytest.fixture
def markup_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A one-request store whose model, tenant and log path read as rich markup (cwd: tmp_path;
    the log is stored under its absolute path, which ends in ``[/x]/m.csv``)."""
    monkeypatch.chdir(tmp_path)
    LOG.parent.mkdir(parents=True)
    LOG.write_text(f"{HEADER}\nr1,2025-01-15T04:24:00Z,[/x],[bold red]t[/bold red],s,10,5,0,0\n")
    Path("m.toml").write_text(MAPPING)
    res = _cli("ingest", "--store", "store", "--format", "csv", "--mapping", "m.toml", str(LOG))
    assert res.exit_code == 0, res.output
    return "store"


# --- 1. table output: data is text, not rich markup ---------------------------------------------


def test_sql_table_prints_markup_like_values_as_they_are(markup_store: str) -> None:
    """A model named ``[/x]`` crashed the table renderer (MarkupError traceback); a tenant
    ``[bold red]t[/bold red]`` printed as a bare ``t``; a column alias lost its brackets."""
    res = _cli(
        "sql",
        "--store",
        markup_store,
        "select model, tenant, 1 as \"[bold]c\", '\\[b]x\\' as e, {'k': '[/y]'} as st from requests",
    )
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert "[/x]" in res.stdout
    assert "[bold red]t[/bold red]" in res.stdout
    assert "[bold]c" in res.stdout
    assert "\\[b]x\\ " in res.stdout  # backslashes kept as they are, the trailing one single
    assert "{'k': '[/y]'}" in res.stdout  # nested values too


def test_sql_other_formats_are_not_escaped(markup_store: str) -> None:
    res = _cli("sql", "--store", markup_store, "--format", "csv", "select model, tenant from requests")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[1] == '"[/x]","[bold red]t[/bold red]"'


def test_query_table_prints_a_markup_like_path_as_it_is(markup_store: str) -> None:
    res = _cli("query", "ingest_accounting", "--store", markup_store)
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert str(LOG) in res.stdout


def test_table_output_keeps_duplicate_columns_and_emoji_codes() -> None:
    """Rows are read by position (two columns named ``a`` used to both show the second's value),
    and an emoji code in data stays text."""
    import pyarrow as pa

    from pipeline.common.tables import render

    table = pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array([":smile: [b]x"])], names=["a", "a", "e"])
    text = render(table, "table")
    assert text is not None
    row = next(line for line in text.splitlines() if ":smile:" in line)
    assert [c.strip() for c in row.strip("│ ").split("│")] == ["1", "2", ":smile: [b]x"]


# --- 2. plan --tp ---------------------------------------------------------------------------------

_PLAN = ["plan", "--model", "llama-3.1-8b", "--traffic-model", "*", "--hardware", "h100-sxm", "--jobs", "1"]


@pytest.mark.parametrize("tp", [str(2**63), str(2**63 - 1), "0", "-1", "16", "1,2,9"])
def test_plan_refuses_a_tp_beyond_one_node_up_front(markup_store: str, tp: str) -> None:
    """2**63 raised OverflowError building the plan table; 2**63 - 1 ran the whole plan and then
    failed the table's int32 schema. Now refused before any replay."""
    line = _one_error_line(_cli(*_PLAN, "--store", markup_store, "--tp", tp))
    assert "--tp" in line and "between 1 and 8" in line and "h100-sxm 8" in line


def test_plan_tp_bound_is_the_widest_hardware(markup_store: str) -> None:
    res = _cli(*_PLAN[:-4], "--hardware", "h100-sxm,gb200", "--jobs", "1", "--store", markup_store, "--tp", "128")
    line = _one_error_line(res)
    assert "between 1 and 72" in line and "gb200 72" in line


# --- 3. --gpu-price ---------------------------------------------------------------------------------


@pytest.mark.parametrize("price", ["nan", "inf", "-inf", "1e308", "-1", "1000000.5"])
def test_plan_refuses_a_gpu_price_out_of_range(markup_store: str, price: str) -> None:
    res = _cli(*_PLAN, "--store", markup_store, "--tp", "1", "--gpu-price", f"h100-sxm={price}")
    line = _one_error_line(res)
    assert "--gpu-price" in line and "between 0 and 1,000,000 USD per GPU-hour" in line


def test_plan_refuses_a_gpu_price_for_hardware_not_planned(markup_store: str) -> None:
    """``--gpu-price nope=1`` was silently ignored."""
    line = _one_error_line(_cli(*_PLAN, "--store", markup_store, "--tp", "1", "--gpu-price", "nope=1"))
    assert "--gpu-price nope" in line and "planned: h100-sxm" in line


def test_plan_refuses_a_gpu_price_given_twice(markup_store: str) -> None:
    args = [*_PLAN, "--store", markup_store, "--tp", "1", "--gpu-price", "h100-sxm=1", "--gpu-price", "h100-sxm=2"]
    assert "given more than once" in _one_error_line(_cli(*args))


def _strict_json(path: Path) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{path}: {name} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("price", ["nan", "inf", "1e308", "-1"])
def test_cost_refuses_a_gpu_price_as_plan_does(replayed_store: tuple[Any, str], price: str) -> None:
    """``cost --gpu-price nan`` (inf, 1e308) was accepted and wrote NaN into cost.json."""
    store, run_id = replayed_store
    res = _cli("cost", "--store", str(store.root), "--run", run_id, f"--gpu-price={price}")
    line = _one_error_line(res)
    assert "--gpu-price" in line and "between 0 and 1,000,000 USD per GPU-hour" in line


def test_cost_with_a_gpu_price_writes_plain_json(replayed_store: tuple[Any, str]) -> None:
    store, run_id = replayed_store
    res = _cli("cost", "--store", str(store.root), "--run", run_id, "--gpu-price", "1000000", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["usd_per_gpu_hour"] == 1_000_000.0 and math.isfinite(doc["total_usd"])
    for path in (store.root / "costs" / run_id).glob("*.json"):
        _strict_json(path)


# --- 4. fit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "0"])
def test_fit_names_max_num_batched_tokens(value: str) -> None:
    """The default --max-num-seqs derives from --max-num-batched-tokens, and the error used to
    name --max-num-seqs for a bad --max-num-batched-tokens."""
    res = _cli("fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--max-num-batched-tokens", value)
    line = _one_error_line(res)
    assert line == f"error: --max-num-batched-tokens must be >= 1, got {value}"


def test_fit_names_max_num_seqs() -> None:
    res = _cli("fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--max-num-seqs", "0")
    assert _one_error_line(res) == "error: --max-num-seqs must be >= 1, got 0"


# --- 5. SLO strings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "slo", ["ttft_p99=2s,ttft_p99=3s", "ttft_p99=2s,ttft_p099.0=3s", "chat,tpot_p99=1s,tpot_p99=1s"]
)
def test_slo_refuses_a_target_given_twice(markup_store: str, slo: str) -> None:
    line = _one_error_line(_cli(*_PLAN, "--store", markup_store, "--tp", "1", "--slo", slo))
    assert "--slo" in line and "given more than once" in line


def test_slo_preset_targets_may_be_overridden_once() -> None:
    slo = parse_slo("chat,ttft_p99=1s")
    assert {t.name: t.limit_s for t in slo.targets}["ttft_p99"] == 1.0


def test_slo_refuses_a_percentile_finer_than_its_name(markup_store: str) -> None:
    """``ttft_p99.9999999`` was shown (and keyed) as ``ttft_p100``."""
    line = _one_error_line(_cli(*_PLAN, "--store", markup_store, "--tp", "1", "--slo", "ttft_p99.9999999=1s"))
    assert "ttft_p99.9999999" in line and "more than 4 decimals" in line


@pytest.mark.parametrize("key", ["ttft_p99.9999", "ttft_p0.0001", "e2e_p12.3456", "tpot_p99.99990000"])
def test_slo_percentiles_show_as_given(key: str) -> None:
    (target,) = parse_slo(f"{key}=1s").targets
    assert target.name == key.rstrip("0")
    assert parse_slo(target.name + "=1s").targets[0].percentile == target.percentile


def test_slo_finer_percentile_refused_in_the_library() -> None:
    with pytest.raises(ConfigError, match="more than 4 decimals"):
        parse_slo("queue_p50.00001=1s")


# --- plan --window-s / --warmup-s ------------------------------------------------------------------


@pytest.mark.parametrize(("option", "value"), [("--window-s", "inf"), ("--window-s", "nan"), ("--warmup-s", "inf")])
def test_plan_refuses_a_non_finite_window(markup_store: str, option: str, value: str) -> None:
    """An infinite --window-s or --warmup-s was accepted and written to plan.json as Infinity."""
    line = _one_error_line(_cli(*_PLAN, "--store", markup_store, "--tp", "1", option, value))
    assert option in line and "finite" in line


def test_fit_refuses_absurd_data_parallel_ranks() -> None:
    """``fit --dp 2**63`` answered "fits"; a fleet caps dp at 1,024, and so does a deployment."""
    res = _cli("fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--dp", str(2**63 - 1))
    assert "is more than 1024 data-parallel ranks in one replica" in _one_error_line(res)


def test_absurd_rates_print_as_numbers_not_pages_of_digits(replayed_store: tuple[Any, str]) -> None:
    """``--rate-scale 1e-300`` printed a 300-digit count of days and of TiB; ``1e300`` an
    overload line of 300 digits. Figures past 10¹² are printed in scientific notation."""
    from pipeline.replay.slo import format_number, format_seconds

    assert format_number(1234.5) == "1,234.50" and format_number(1.5e300) == "1.5e+300"
    assert format_seconds(3e15) == "3e+15 s" and format_seconds(250.0) == "250 s"
    store, _ = replayed_store
    res = _cli("replay", "--store", str(store.root), "--rate-scale", "1e-300")
    line = _one_error_line(res)
    assert re.search(r"over \d\.\d+e\+\d{3} simulated days", line) and re.search(r"\d\.\d+e\+\d{3} TiB", line), line
    assert len(line) < 400, line


def test_engine_reports_the_pods_it_cut(replayed_store: tuple[Any, str], tmp_path: Path) -> None:
    """``--pods 1000000`` on 2 replicas said "in 1,000,000 pods"; a fleet is cut into at most one
    pod per replica (lockstep group)."""
    store, _ = replayed_store
    fleet = tmp_path / "rr.toml"
    default = (Path(__file__).resolve().parents[1] / "fleets" / "default.toml").read_text()
    fleet.write_text(default.replace('router = "least_outstanding"', 'router = "round_robin"'))
    res = _cli("replay", "--store", str(store.root), "--fleet", str(fleet), "--pods", "1000000", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["engine_pods"] == 2


def test_replay_on_a_store_it_cannot_write_stops_before_the_engine(
    replayed_store: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only store used to be found out after the whole replay (2 minutes in the hostile
    test); the runs folder is probed first."""
    import tempfile

    from pipeline.replay import run as replay_module

    store, _ = replayed_store
    real = tempfile.mkstemp

    def refuse(*args: Any, **kwargs: Any) -> Any:
        if Path(kwargs.get("dir", "")) == store.runs_dir:
            raise PermissionError(13, "Permission denied", str(store.runs_dir / ".probe.x"))
        return real(*args, **kwargs)

    def engine(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the engine ran")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    monkeypatch.setattr(replay_module, "run_workload", engine)
    line = _one_error_line(_cli("replay", "--store", str(store.root), "--rate-scale", "0.77"))
    assert "cannot write to the store: Permission denied" in line, line


def test_a_failure_under_json_is_a_json_document_too(tmp_path: Path) -> None:
    """Commands asked for --json printed nothing on stdout when they failed (only ingest printed
    its summary): a script got an empty document. The error line stays on stderr; stdout holds
    {"error", "exit_code"} under --json, and nothing without it."""
    store = str(tmp_path / "none")
    for cmd in (["replay"], ["query", "latency"], ["cost"]):
        res = _cli(*cmd, "--store", store, "--json")
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        doc = json.loads(res.stdout)
        assert doc["exit_code"] == 1 and doc["error"] == res.stderr.strip().removeprefix("error: "), (cmd, doc)
        plain = _cli(*cmd, "--store", store)
        assert plain.exit_code == 1 and plain.stdout == ""


def test_second_round_checks(replayed_store: tuple[Any, str], tmp_path: Path) -> None:
    """From a second hostile round: two presets in one --slo (the later silently replaced the
    earlier's targets), a --param name a query does not take (silently ignored), a store another
    process holds (found out only after the engine ran), and cost hiding its run's failures."""
    import fcntl

    from pipeline.replay.slo import parse_slo

    with pytest.raises(ConfigError, match="preset 'chat' after 'interactive'"):
        parse_slo("interactive,chat")
    with pytest.raises(ConfigError, match="preset 'chat' after 'ttft_p99=1s'"):
        parse_slo("ttft_p99=1s,chat")
    store, _ = replayed_store
    res = _cli("query", "goodput", "--store", str(store.root), "--param", "ttft_slo=2")
    line = _one_error_line(res)
    assert "--param 'ttft_slo=2': query 'goodput' takes run_id, ttft_slo_s" in line, line
    res = _cli("query", "plan", "--store", str(store.root), "--param", "model=7", "--json")  # text, not 7.0
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    lock = (store.root / ".lock").open("a")
    try:  # another writer (a lock on another open file: as another process's)
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        for cmd in (["replay", "--rate-scale", "0.91"], [*_PLAN, "--tp", "1"]):
            line = _one_error_line(_cli(*cmd, "--store", str(store.root)))
            assert "another rooftrace run holds the store lock" in line, (cmd, line)
    finally:
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        lock.close()
    # a run's failures (rejections, overload, a failed SLO) come first in its cost, as in the replay
    over = _cli("replay", "--store", str(store.root), "--rate-scale", "40", "--slo", "interactive", "--json")
    assert over.exit_code == 0, over.output
    over_id = json.loads(over.stdout)["run_id"]
    res = _cli("cost", "--store", str(store.root), "--run", over_id)
    assert res.exit_code == 0, res.output
    warned = [ln for ln in over.stderr.splitlines() if ln.startswith("warning: ")]
    assert warned and [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ")] == warned
    assert json.loads(_cli("cost", "--store", str(store.root), "--run", over_id, "--json").stdout)["warnings"]


def test_a_toml_file_that_is_a_pipe(tmp_path: Path) -> None:
    """A named pipe with no writer given as a TOML file blocked forever (Ctrl-C did not stop it);
    it is one error line now, while a pipe with a writer (``--fleet <(...)``) is still read."""
    import os
    import threading

    from pipeline.common.tomlfile import read_toml

    fifo = tmp_path / "f.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"f\.toml: fleet file is a named pipe with nothing written to it"):
        read_toml(fifo, "fleet file")
    r, w = os.pipe()  # a pipe whose writer is there, as process substitution gives
    writer = threading.Thread(target=lambda: (os.write(w, b'name = "x"\nreplicas = 2\n'), os.close(w)))
    writer.start()
    writer.join()
    try:
        assert read_toml(Path(f"/dev/fd/{r}"), "fleet file") == {"name": "x", "replicas": 2}
    finally:
        os.close(r)


# --- 4th round -------------------------------------------------------------------------------------


@pytest.mark.parametrize("keys", ["model,model", "tenant, model ,tenant"])
def test_classify_refuses_an_isolation_key_named_twice(markup_store: str, keys: str) -> None:
    line = _one_error_line(_cli("classify", "--store", markup_store, "--isolation", keys))
    assert "isolation keys named more than once" in line and "'" in line


@pytest.mark.parametrize("command", [["ingest", "x.csv"], ["sql", "select 1"], ["classify"]])
def test_an_empty_store_path_is_refused_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("x.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n")
    line = _one_error_line(_cli(command[0], "--store", "", *command[1:]))
    assert "--store" in line and "empty" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"]  # nothing made a store here


@pytest.mark.parametrize("price", ["1e308", "1e300", "1000001"])
def test_cost_refuses_an_api_price_beyond_a_dollar_a_token(
    replayed_store: tuple[Any, str], tmp_path: Path, price: str
) -> None:
    """A price file of 1e308 USD per million tokens printed `API $inf` and wrote Infinity."""
    store, run_id = replayed_store
    prices = tmp_path / "huge.toml"
    prices.write_text(
        'provider = "p"\nunit = "usd_per_million_tokens"\nsource = "s"\n[models.m]\n'
        f'input = {price}\ncached_input = 0\ncache_write = 0\noutput = {price}\ndate = "2026-11-01"\nsource = "s"\n'
    )
    line = _one_error_line(_cli("cost", "--store", str(store.root), "--run", run_id, "--prices", str(prices)))
    assert str(prices) in line and "[models.m]" in line and "between 0 and 1,000,000 USD per million" in line


def test_busy_share_is_a_share_of_time_whatever_the_gpu_price(replayed_store: tuple[Any, str]) -> None:
    """`cost --gpu-price 0` reported a busy share of 0 for every token class."""
    store, run_id = replayed_store
    shares = {}
    for price in ("0", "2.5"):
        res = _cli("cost", "--store", str(store.root), "--run", run_id, "--gpu-price", price, "--json")
        assert res.exit_code == 0, res.output
        rows = json.loads(res.stdout)["token_classes"]
        shares[price] = {r["token_class"]: r["busy_share"] for r in rows}
    assert shares["0"] == pytest.approx(shares["2.5"], rel=1e-12)
    assert sum(v for k, v in shares["0"].items() if k != "idle") == pytest.approx(1.0)


def test_query_prints_as_sql_does(markup_store: str, tmp_path: Path) -> None:
    """`query --out -` wrote a file named '-'; named queries now print through the same output
    as `sql` (control characters escaped, at most 1,000 table rows, --out - is stdout)."""
    res = _cli("query", "ingest_accounting", "--store", markup_store, "--out", "-", "--format", "csv")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith('"kind","item",') and "[/x]/m.csv" in res.stdout
    assert not (tmp_path / "-").exists()


def test_a_toml_integer_of_70000_digits_is_one_error_line(tmp_path: Path) -> None:
    """Found by the fuzz test: tomllib raised ValueError (Python's int digit limit), a traceback."""
    fleet = tmp_path / "f.toml"
    fleet.write_text("a = " + "9" * 70000 + "\n")
    line = _one_error_line(_cli("replay", "--store", str(tmp_path / "s"), "--fleet", str(fleet)))
    assert str(fleet) in line and "too long to read" in line
