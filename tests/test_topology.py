"""Interconnect as data: FLEET.toml [topology], pipeline/catalog/topology.toml, and the link
``calibrate --measurements`` fits, pricing the tensor-parallel collectives of every tier.

Hand checks use Llama-3.1-8B at TP 2: per decode token, 2·32 + 1 = 65 all-reduces of one 4096-wide
bf16 hidden state (8,192 B each, ring factor 2(2−1)/2 = 1) and one gather of the fp32 logits of
the other half of the vocabulary (128,256 · 4 / 2 = 256,512 B): 65 · 8,192 + 256,512 = 788,992 B
through each GPU's link per token, in 66 collective calls.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from test_nccl_link import write_log

from pipeline.calibrate.nccl import fit_link, read_all_reduce
from pipeline.catalog import load_hardware, load_model, load_topology, parse_hardware
from pipeline.common.errors import ConfigError
from pipeline.costmodel.roofline import Deployment, decode_batch
from pipeline.replay.fleet import fleet_from_dict, load_fleet, resolve

MODEL = "llama-3.1-8b"
#: Ring bytes per decode token at TP 2 and collective calls per step (module doc).
BYTES_PER_TOKEN = 65 * 8192 + 128256 * 4 // 2
CALLS = 66


def test_the_hand_numbers_are_the_catalog_models() -> None:
    m = load_model(MODEL)
    assert (m.num_layers, m.hidden_size, m.vocab_size) == (32, 4096, 128256)
    assert BYTES_PER_TOKEN == 788_992


#: (link, generation, p2p) -> (busbw B/s, latency s, hops): the cited defaults, read off topology.toml's sources.
DEFAULTS = {
    ("nvlink", 3, "nvlink"): (300e9 * 0.56, 47e-6, 1),
    ("nvlink", 4, "nvlink"): (450e9 * 0.784, 29.6e-6, 1),
    ("nvlink", 5, "nvlink"): (900e9 * 0.784, 29.6e-6, 1),
    ("pcie", 4, "switch"): (31.5e9 * 0.7, 20e-6, 1),
    ("pcie", 4, "root_complex"): (31.5e9 * 0.7 * 45 / 54, 20e-6, 1),
    ("pcie", 4, "none"): (31.5e9 * 0.7, 40e-6, 2),
    ("pcie", 5, "switch"): (63e9 * 0.7, 25e-6, 1),
    ("pcie", 5, "root_complex"): (63e9 * 0.7 * 45 / 54, 25e-6, 1),
    ("pcie", 5, "none"): (63e9 * 0.7, 40e-6, 2),
}


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_each_path_prices_a_ring_all_reduce_by_hand(key: tuple[str, int, str]) -> None:
    path = load_topology()[key]
    busbw, lat, hops = DEFAULTS[key]
    assert path.busbw_bytes_per_s == pytest.approx(busbw, rel=1e-12)
    assert path.latency_s == pytest.approx(lat, rel=1e-12) and path.hops == hops and path.source
    # 16 MiB over 2, 4 and 8 GPUs: hops · 2(n−1)/n · B / busbw + latency
    for n, ring in ((2, 1.0), (4, 1.5), (8, 1.75)):
        assert path.all_reduce_s(16 * 2**20, n) == pytest.approx(hops * ring * 16 * 2**20 / busbw + lat, rel=1e-12)
    assert path.all_reduce_s(16 * 2**20, 1) == 0.0


def test_a_tp2_step_pays_the_stated_path_by_hand() -> None:
    m, hw = load_model(MODEL), load_hardware("h100-pcie")
    got = Deployment(m, hw, tp=2, link=load_topology()[("pcie", 5, "none")])(decode_batch([16.0], [2000.0]))
    # 2 copies · 788,992 B · 16 tokens / 44.1 GB/s + 66 calls · 40 us
    assert got.comm_s[0] == pytest.approx(2 * 788_992 * 16 / 44.1e9 + 66 * 40e-6, rel=1e-12)
    assert got.comm_s[0] == pytest.approx(3.212511e-3, rel=1e-6)


def test_nvlink4_stated_on_an_h100_sxm_prices_as_its_catalog_entry() -> None:
    """The path's defaults are the catalog's fitted NVLink 4 factors: stating the box changes nothing."""
    m, hw = load_model(MODEL), load_hardware("h100-sxm")
    batch = decode_batch([1.0, 16.0, 256.0], [2000.0])
    plain = Deployment(m, hw, tp=2)(batch)
    stated = Deployment(m, hw, tp=2, link=load_topology()[("nvlink", 4, "nvlink")])(batch)
    np.testing.assert_allclose(stated.comm_s, plain.comm_s, rtol=1e-12)


def _write(tmp_path: Path, name: str, hardware: str, tp: int, extra: str = "", cost_model: str = "roofline") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\nmodel = "{MODEL}"\nhardware = "{hardware}"\ntp = {tp}\ncost_model = "{cost_model}"\n'
        f"{extra}\n[engine]\nmax_model_len = 8192\n"
    )
    return path


def _comm(fleet_path: Path, tokens: int) -> float:
    """The collective seconds the fleet's step-cost tables hold for a decode step of ``tokens``."""
    table = resolve(load_fleet(fleet_path), str(fleet_path)).cost_model.table
    return float(table.tok[tokens, 2] + table.logit[tokens, 2])


def test_pcie_without_p2p_is_slower_than_with_it_by_the_staging_ratio(tmp_path: Path) -> None:
    """TP 2 on PCIe 5: staging through host memory doubles the bytes term and the latency is 40 us
    against 25, so the ratio grows with the batch's bytes from 1.66 at 16 tokens toward 2."""
    switch = _write(tmp_path, "p2p", "h100-pcie", 2, '[topology]\nlink = "pcie"\ngeneration = 5\np2p = "switch"')
    host = _write(tmp_path, "host", "h100-pcie", 2, '[topology]\nlink = "pcie"\ngeneration = 5\np2p = "none"')
    ratios = []
    for t in (16, 64, 256, 1024):
        x = BYTES_PER_TOKEN * t / 44.1e9
        want_s, want_h = x + CALLS * 25e-6, 2 * x + CALLS * 40e-6
        assert _comm(switch, t) == pytest.approx(want_s, rel=1e-9)
        assert _comm(host, t) == pytest.approx(want_h, rel=1e-9)
        ratios.append(_comm(host, t) / _comm(switch, t))
    assert ratios[0] == pytest.approx(1.6591, abs=1e-4)
    assert all(a < b for a, b in itertools.pairwise(ratios)) and ratios[-1] < 2.0


def test_a_fleet_without_topology_prices_and_records_as_before(tmp_path: Path) -> None:
    plain = _write(tmp_path, "plain", "h100-pcie", 2)
    cfg = load_fleet(plain)
    assert "topology" not in cfg.to_dict()  # run ids of fleets without it are unchanged
    hw = load_hardware("h100-pcie")
    want = BYTES_PER_TOKEN * 16 / (hw.link_bandwidth_bytes_per_s * hw.link_efficiency) + CALLS * hw.link_latency_s
    assert _comm(plain, 16) == pytest.approx(want, rel=1e-9)


def test_a_recorded_topology_keeps_its_numbers(tmp_path: Path) -> None:
    topology = '[topology]\nlink = "pcie"\ngeneration = 4\np2p = "root_complex"'
    cfg = load_fleet(_write(tmp_path, "t", "l40s", 2, topology))
    rec = cfg.to_dict()["topology"]
    assert rec == {
        "link": "pcie",
        "generation": 4,
        "p2p": "root_complex",
        "busbw_bytes_per_s": pytest.approx(18.375e9),
        "latency_s": pytest.approx(20e-6),
    }
    back = fleet_from_dict(cfg.to_dict(), "config.json")
    assert back.topology is not None and back.topology.path().busbw_bytes_per_s == pytest.approx(18.375e9)
    assert back.to_dict() == cfg.to_dict()


def test_a_fleets_own_busbw_and_latency_replace_the_defaults(tmp_path: Path) -> None:
    own = _write(
        tmp_path,
        "own",
        "l40s",
        2,
        '[topology]\nlink = "pcie"\ngeneration = 4\np2p = "switch"\nbusbw_bytes_per_s = 2.5e10\nlatency_s = 1.2e-05',
    )
    assert _comm(own, 64) == pytest.approx(BYTES_PER_TOKEN * 64 / 25e9 + CALLS * 12e-6, rel=1e-9)


def test_the_measured_tier_prices_collectives_on_the_stated_topology(tmp_path: Path) -> None:
    """L40S has a measured profile with its all-reduce curves; a stated box replaces them."""
    measured = _write(tmp_path, "m", "l40s", 2, cost_model="measured")
    stated = _write(
        tmp_path, "s", "l40s", 2, '[topology]\nlink = "pcie"\ngeneration = 4\np2p = "none"', cost_model="measured"
    )
    fleet = resolve(load_fleet(stated), "s")
    assert fleet.cost_model.source == "measured" and "pcie4-none" in fleet.cost_model.describe["allreduce"]
    # the all-reduces in the token table (padded to the CUDA-graph size 16), the gather in the logits table
    want = 65 * (2 * 8192 * 16 / 22.05e9 + 40e-6) + (2 * 256_512 * 16 / 22.05e9 + 40e-6)
    assert _comm(stated, 16) == pytest.approx(want, rel=1e-9)
    assert _comm(measured, 16) != pytest.approx(want, rel=0.01)  # the profile's curves, as before


def test_the_measured_tier_prices_collectives_on_a_fitted_link(tmp_path: Path) -> None:
    """`calibrate --measurements` on a 2-GPU H100 SXM log of 200 GB/s bus bandwidth and 15 us per
    call: the written entry is still the H100 SXM device (its measured profile prices the GEMMs and
    attention) and the fitted link prices its collectives, not the profile's NVLink curves."""
    log = write_log(tmp_path / "all_reduce.log", 2, 200e9, 15e-6)
    fit = fit_link(read_all_reduce(log), "h100-sxm")
    entry = tmp_path / "h100-sxm-link.toml"
    entry.write_text(fit.toml)
    hw = parse_hardware(__import__("tomllib").loads(fit.toml), "written")
    assert hw.link_fitted_from == "h100-sxm"
    assert hw.link_bandwidth_bytes_per_s * hw.link_efficiency == pytest.approx(200e9, rel=0.01)
    assert hw.link_latency_s == pytest.approx(15e-6, rel=0.02)
    fitted = _write(tmp_path, "fitted", str(entry), 2, cost_model="measured")
    fleet = resolve(load_fleet(fitted), "fitted")
    assert fleet.cost_model.source == "measured"
    assert "fitted on an nccl-tests log" in fleet.cost_model.describe["allreduce"]
    # by hand: 65 all-reduces of 8,192 B x 16 tokens and one 256,512 B x 16 gather, at 200 GB/s and 15 us each
    want = 65 * (8192 * 16 / 200e9 + 15e-6) + (256_512 * 16 / 200e9 + 15e-6)
    assert want == pytest.approx(1.05312e-3, rel=1e-5)
    assert _comm(fitted, 16) == pytest.approx(want, rel=0.02)
    catalog = _write(tmp_path, "catalog", "h100-sxm", 2, cost_model="measured")
    assert "fitted" not in resolve(load_fleet(catalog), "c").cost_model.describe["allreduce"]
    assert _comm(catalog, 16) != pytest.approx(want, rel=0.05)


HOSTILE = [
    ('link = "pcie"\ngeneration = 3\np2p = "switch"', "generation 3 is not a pcie generation"),
    ('link = "nvlink"\ngeneration = 6', "generation 6 is not a nvlink generation"),
    ('link = "infiniband"\ngeneration = 4', "link 'infiniband' unknown"),
    ('link = "pcie"\ngeneration = 4\np2p = "switch"\nbusbw_bytes_per_s = nan', "busbw_bytes_per_s must be a finite"),
    ('link = "pcie"\ngeneration = 4\np2p = "switch"\nbusbw_bytes_per_s = 1e300', "busbw_bytes_per_s must be a finite"),
    ('link = "pcie"\ngeneration = 4\np2p = "switch"\nlatency_s = -1e-5', "latency_s must be a finite"),
    ('link = "nvlink"\ngeneration = 4\np2p = "switch"', "p2p = 'switch' is a PCIe path"),
    ('link = "pcie"\ngeneration = 4', "p2p is required for a PCIe link"),
    ('link = "pcie"\ngeneration = 4\np2p = "nvswitch"', "p2p 'nvswitch' unknown"),
    ('link = "pcie"\ngeneration = "4"\np2p = "switch"', "generation must be an integer"),
    ('link = "pcie"\ngeneration = 4\np2p = "switch"\nbandwidth = 3', "unknown key(s) ['bandwidth']"),
]


@pytest.mark.parametrize(("table", "says"), HOSTILE)
def test_hostile_topology_keys_are_one_line(tmp_path: Path, table: str, says: str) -> None:
    path = _write(tmp_path, "bad", "l40s", 2, f"[topology]\n{table}")
    with pytest.raises(ConfigError) as info:
        resolve(load_fleet(path), str(path))
    text = str(info.value)
    assert "\n" not in text and str(path) in text and says in text and "topology" in text


@pytest.mark.parametrize(
    ("hardware", "table", "says"),
    [
        ("h100-sxm", 'link = "pcie"\ngeneration = 5\np2p = "switch"', "joined by nvlink4"),
        ("rtx-4090", 'link = "pcie"\ngeneration = 4\np2p = "switch"', "no peer-to-peer"),
        ("h100-sxm", 'link = "nvlink"\ngeneration = 5', "generation = 5 for h100-sxm, whose GPUs' link is nvlink4"),
        ("l40s", 'link = "pcie"\ngeneration = 5\np2p = "switch"', "generation = 5 for l40s"),
    ],
)
def test_a_topology_the_hardware_contradicts_is_one_line(tmp_path: Path, hardware: str, table: str, says: str) -> None:
    path = _write(tmp_path, "bad", hardware, 2, f"[topology]\n{table}")
    with pytest.raises(ConfigError) as info:
        resolve(load_fleet(path), str(path))
    assert "\n" not in str(info.value) and says in str(info.value) and "[topology]" in str(info.value)


def test_a_fitted_link_and_a_stated_topology_together_are_refused(tmp_path: Path) -> None:
    fit = fit_link(read_all_reduce(write_log(tmp_path / "a.log", 2, 200e9, 15e-6)), "h100-sxm")
    entry = tmp_path / "box.toml"
    entry.write_text(fit.toml)
    path = _write(tmp_path, "both", str(entry), 2, '[topology]\nlink = "nvlink"\ngeneration = 4')
    with pytest.raises(ConfigError, match="both state the link: keep one"):
        resolve(load_fleet(path), str(path))


def test_the_cli_says_a_bad_topology_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pipeline.cli import main

    topology = '[topology]\nlink = "pcie"\ngeneration = 4\np2p = "switch"\nlatency_s = nan'
    path = _write(tmp_path, "bad", "l40s", 2, topology)
    got = CliRunner().invoke(main, ["replay", "--fleet", str(path), "--store", str(tmp_path / "store")])
    assert got.exit_code == 1 and "Traceback" not in got.output
    lines = [x for x in got.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "[topology]: latency_s must be a finite number" in lines[0] and "nan" in lines[0]


def test_the_prior_tier_prices_collectives_on_a_fitted_pcie_link(tmp_path: Path) -> None:
    """H100 PCIe has no measured profile: `auto` prices it with the prior, whose collectives are
    then the fitted link's (25 GB/s, 20 us: the box's own log), by hand."""
    fit = fit_link(read_all_reduce(write_log(tmp_path / "a.log", 2, 25e9, 20e-6)), "h100-pcie")
    entry = tmp_path / "box.toml"
    entry.write_text(fit.toml)
    fleet = resolve(load_fleet(_write(tmp_path, "f", str(entry), 2, cost_model="auto")), "f")
    assert fleet.cost_model.source == "prior" and "fitted" in fleet.cost_model.describe["allreduce"]
    table = fleet.cost_model.table
    want = BYTES_PER_TOKEN * 64 / 25e9 + CALLS * 20e-6
    assert float(table.tok[64, 2] + table.logit[64, 2]) == pytest.approx(want, rel=0.02)


def test_a_pool_states_its_own_topology(tmp_path: Path) -> None:
    from pipeline.replay.pools import PooledFleet, load_fleet_file

    path = tmp_path / "pools.toml"
    path.write_text(
        f'name = "two"\nmodel = "{MODEL}"\nhardware = "l40s"\ntp = 2\ncost_model = "roofline"\n'
        '[topology]\nlink = "pcie"\ngeneration = 4\np2p = "switch"\n[engine]\nmax_model_len = 8192\n'
        '[[pool]]\nname = "short"\n[pool.match]\nmax_input_tokens = 1000\n'
        '[[pool]]\nname = "long"\n[pool.topology]\nlink = "pcie"\ngeneration = 4\np2p = "none"\n'
    )
    pooled = load_fleet_file(path)
    assert isinstance(pooled, PooledFleet)
    pools = {p.name: p.config.topology for p in pooled.pools}
    assert pools["short"] is not None and pools["short"].p2p == "switch"
    assert pools["long"] is not None and pools["long"].p2p == "none"


def test_a_gen5_card_may_run_in_a_gen4_box(tmp_path: Path) -> None:
    path = _write(tmp_path, "g4", "h100-pcie", 2, '[topology]\nlink = "pcie"\ngeneration = 4\np2p = "switch"')
    assert _comm(path, 16) == pytest.approx(BYTES_PER_TOKEN * 16 / 22.05e9 + CALLS * 20e-6, rel=1e-9)


def test_plan_keeps_the_topology_for_the_base_gpu_only(tmp_path: Path) -> None:
    from pipeline.plan.search import Candidate, candidate_fleet

    base = load_fleet(_write(tmp_path, "b", "l40s", 2, '[topology]\nlink = "pcie"\ngeneration = 4\np2p = "none"'))
    same = candidate_fleet(base, Candidate(hardware="l40s", tp=2, weight_dtype="bf16"))
    other = candidate_fleet(base, Candidate(hardware="h100-sxm", tp=2, weight_dtype="bf16"))
    assert same.topology == base.topology and other.topology is None


def test_a_replay_without_p2p_decodes_slower_than_with_it(tmp_path: Path) -> None:
    """End to end on the compiled engine: the same requests on a TP 2 L40S fleet (measured tier)
    whose box has P2P through a switch, and one staging through host memory: every request's
    time per output token is longer without P2P, and the run records the path that priced it."""
    import polars as pl
    from published import benchmark_requests

    from pipeline.replay.run import ReplayOptions, run_replay, summarize

    rng = np.random.default_rng(3)
    n = 40
    frame = benchmark_requests(rng.integers(100, 2000, n), rng.integers(20, 200, n))
    arrival = frame["arrival"].dt.epoch("us").to_numpy() + np.cumsum(rng.exponential(1e5, n)).astype(np.int64)
    frame = frame.with_columns(
        arrival=pl.Series(arrival).cast(pl.Datetime("us", "UTC")),
        model=pl.lit(MODEL),
        tenant=pl.lit(None, pl.Utf8),
        adapter=pl.lit(None, pl.Utf8),
        session_id=pl.lit(None, pl.Utf8),
    )
    runs = {}
    for p2p in ("switch", "none"):
        path = _write(
            tmp_path, p2p, "l40s", 2, f'[topology]\nlink = "pcie"\ngeneration = 4\np2p = "{p2p}"', cost_model="measured"
        )
        runs[p2p] = run_replay(frame, resolve(load_fleet(path), str(path)), ReplayOptions(rate_scale=1.0))
    tpot = {k: np.asarray(summarize(r)["tpot_s"]["mean"]) for k, r in runs.items()}
    assert tpot["none"] > tpot["switch"]
    assert "pcie4-none" in summarize(runs["none"])["cost_model"]["allreduce"]
