"""How `rooftrace plan` ranks and words its candidates: overloaded replays never rank, a configuration whose
replay cannot run is skipped (not the plan), advice only where it can help, no "-0" dollars,
STALE API prices and readable latencies in the text."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import own_copy
from test_plan import _opts  # the plan options both files start from

import pipeline.plan.search as search_mod
from pipeline.cli import main
from pipeline.cli.plan import fmt_latency
from pipeline.common.budget import ResourceLimitError
from pipeline.common.schemas import read_parquet
from pipeline.ingest import ingest_logs
from pipeline.ingest.store import Store
from pipeline.plan import Candidate, CandidateResult, Evaluation, min_replicas, plan
from pipeline.plan.search import OVERLOADED, rejection_note
from pipeline.plan.stage import no_fit_advice
from pipeline.replay.fleet import parse_fleet
from pipeline.replay.slo import parse_slo

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "traces" / "sample" / "azure_conv_2023.csv.gz"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    s = Store(tmp_path_factory.mktemp("h10") / "store")
    ingest_logs([AZURE], s, date="2023-11-16")
    return s


# -- 1: an overloaded replay never meets the plan -------------------------------------------------


def test_day_batch_plan_does_not_rank_an_overloaded_fleet(store: Store, tmp_path: Path) -> None:
    # the tester's case: 1 L4 "met" the 24 h batch SLO while its replay of the day was OVERLOADED
    result = plan(own_copy(store, tmp_path), _opts(window="day", slo="batch"))
    row = result.doc["configurations"][0]
    n = row["replicas"]
    assert row["meets_slo"] and row["rank"] == 1 and n is not None
    assert row["overloaded"] is False
    # not overloaded; its busiest replica may still run past the last arrival, and then `cost`
    # prices it over the makespan with unit costs not valid: the plan says the same
    period = row["replay_period"]
    assert row["unit_costs_valid"] is period["unit_costs_valid"]
    assert period["period_basis"] == ("arrivals" if period["unit_costs_valid"] else "makespan")
    # the counts the search found overloaded are below the answer, and the one below it is one
    assert row["overloaded_replicas"] and max(row["overloaded_replicas"]) == n - 1
    search = read_parquet(result.plan_dir / "search.parquet", "plan_search").to_pylist()
    by_n = {s["replicas"]: s for s in search}
    assert by_n[n - 1]["failing"] == OVERLOADED and not by_n[n - 1]["meets_slo"]
    assert by_n[n]["meets_slo"] and by_n[n]["failing"] is None
    # the chosen replay is priced over the same period `cost` would price it over
    chosen = result.doc["chosen"]
    assert chosen["replay_period"]["overloaded"] is False
    assert chosen["period_s"] == pytest.approx(chosen["replay_period"]["period_s"])
    assert chosen["usd_per_period"] == pytest.approx(n * row["usd_per_gpu_hour"] * chosen["period_s"] / 3600.0)


def test_min_replicas_grows_past_overload_without_a_false_latency_floor() -> None:
    # overloaded replays whose SLO ratio does not move must not read as a "latency floor"
    calls: list[int] = []

    def check(n: int) -> Evaluation:
        calls.append(n)
        over = n < 9
        return Evaluation(
            n, not over, {"e2e_p99": 0.1}, {}, 0.1, OVERLOADED if over else None, 0, 0, 1.0, 0.1, 0.0, 0.0
        )

    n, why = min_replicas(check, 1, 1024)
    assert n == 9 and why == "" and 8 in calls


# -- 2: a configuration whose replay cannot run is skipped ---------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        ResourceLimitError(
            "this replay would cover about 1.71e+297 simulated days, more than the 11,574 days "
            "(limits.MAX_SIM_SPAN_S) its per-second series can hold, whatever --max-sim-days and --max-memory "
            "say: check the fleet's step cost or use a larger --rate-scale"
        ),
        OverflowError("cannot convert float infinity to integer"),
    ],
)
def test_unreplayable_configuration_is_skipped_not_the_plan(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    real = search_mod.evaluate

    def evaluate(window, fleet, replicas, slo, max_rejected=0.0):  # type: ignore[no-untyped-def]
        if fleet.config.hardware == "l4":
            raise exc
        return real(window, fleet, replicas, slo, max_rejected)

    monkeypatch.setattr(search_mod, "evaluate", evaluate)
    result = plan(own_copy(store, tmp_path), _opts(hardware=("l4", "h100-sxm")))
    rows = {r["config"]: r for r in result.doc["configurations"]}
    l4, h100 = rows["l4 tp1 bf16"], rows["h100-sxm tp1 bf16"]
    assert h100["meets_slo"] and h100["rank"] == 1
    assert not l4["meets_slo"] and l4["rank"] is None
    assert l4["note"].startswith("skipped: l4's replay cannot run")
    assert "--rate-scale" not in l4["note"]
    assert "[efficiency] step_overhead_s" in l4["note"]  # names the keys to check and the file
    assert "l4" in l4["note"] and ".toml" in l4["note"]


# -- 3: advice only where it can change the outcome -----------------------------------------------


def _rejecting(share: float) -> CandidateResult:
    ev = Evaluation(
        1, False, {}, {}, math.inf, "rejected", 0, 0, 0.0, 0.0, 0.0, 0.0,
        rejected=int(share * 1000), rejected_by_reason={"exceeds_kv_capacity": int(share * 1000)},
        rejected_share=share, failing_target="ttft_p99",
    )  # fmt: skip
    return CandidateResult(Candidate("l4", 1, "bf16"), fits=True, evaluations=[ev])


def test_max_rejected_advice_only_when_it_can_help() -> None:
    base = parse_fleet({"name": "b", "model": "llama-3.1-8b", "hardware": "h100-sxm"}, "defaults")
    slo = parse_slo("chat")  # p99 targets: more than 1 % rejected misses them at any --max-rejected
    futile = no_fit_advice([_rejecting(0.5)], base, "defaults", "llama-3.1-8b", 0.5, slo)
    assert "--max-rejected" not in futile and futile.startswith("widen --hardware/--tp")
    futile = no_fit_advice([_rejecting(0.5)], base, "defaults", "llama-3.1-8b", 1.0, slo)
    assert "--max-rejected" not in futile
    useful = no_fit_advice([_rejecting(0.005)], base, "defaults", "llama-3.1-8b", 0.0, slo)
    assert useful.endswith("or accept rejections with --max-rejected")
    note = rejection_note(_rejecting(0.5).evaluations[0], 0.5, slo)
    assert "whatever --max-rejected allows" in note and "allowed 50.00%" not in note
    assert rejection_note(_rejecting(0.005).evaluations[0], 0.0, slo).endswith("allowed 0.00% (--max-rejected)")


# -- 4 and 5: no "-0" dollars; STALE prices and readable latencies in the text -------------------


def test_negative_zero_price_is_zero() -> None:
    opts = _opts(gpu_prices=(("l4", -0.0),))
    assert math.copysign(1.0, opts.gpu_prices[0][1]) == 1.0


def test_fmt_latency_is_readable() -> None:
    assert fmt_latency(12428.63) == "3.45h"
    assert fmt_latency(0.151) == "151ms"
    assert fmt_latency(50.49) == "50.49s"
    assert fmt_latency(None) == "-"


def test_cli_text_stale_price_and_no_negative_zero(store: Store, tmp_path: Path) -> None:
    prices = tmp_path / "old.toml"
    prices.write_text(
        'provider = "old"\nunit = "usd_per_million_tokens"\nsource = "s"\n[models.m0]\ninput = 1.0\n'
        'cached_input = 0.1\ncache_write = 1.0\noutput = 3.0\ndate = "0001-01-01"\nsource = "s"\n'
    )
    args = ["plan", "--model", "llama-3.1-8b", "--traffic-model", "*", "--hardware", "l4", "--tp", "1"]
    args += ["--window-s", "20", "--warmup-s", "10", "--jobs", "1", "--store", str(own_copy(store, tmp_path).root)]
    args += ["--gpu-price", "l4=-0", "--prices", str(prices)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "$-" not in res.stdout and " -0" not in res.stdout, res.stdout
    assert "self-hosted $0.00" in res.stdout and "$0/day" in res.stdout
    line = next(x for x in res.stdout.splitlines() if "old/m0" in x)
    assert "STALE price" in line, line
    doc = json.loads((Path(res.stdout.splitlines()[0].split(" -> ")[1]) / "plan.json").read_text())
    assert doc["configurations"][0]["usd_per_day"] == 0.0
    assert np.signbit(doc["configurations"][0]["usd_per_day"]) == False  # noqa: E712
