"""Same-die donors (pipeline/costmodel/profile/prior.py die_donor, donor_times, die_donor_check): an
unprofiled GPU on a profiled GPU's die is priced from that GPU's measured tables, scaled to its
datasheet by the size-aware prior.

Checked: which donor each catalog GPU gets (and that a per-layer harness's tables never lend);
the scaling by hand (identity on the donor itself; a GPU with twice the bandwidth runs a
memory-bound decode faster by the prior curve's ratio); the held-out pair in the tables (H100
SXM and H200, each from the other, prior fitted without it) beating the prior alone; the tier's
record in the cost model and the report's first card; the hardware entry's ``die`` field.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.catalog import load_hardware, load_model
from pipeline.catalog.entries import load_hardware_file
from pipeline.common.errors import ConfigError
from pipeline.costmodel.profile import prior as P
from pipeline.costmodel.profile.cost import gemm_shapes, step_cost_for
from pipeline.costmodel.profile.tables import load_profile
from pipeline.costmodel.roofline import Deployment, decode_batch
from pipeline.publish.report import cost_card


def _dep(model: str, gpu: str, tp: int = 1) -> Deployment:
    return Deployment(load_model(model), load_hardware(gpu), tp=tp)


def test_donors_of_the_catalog() -> None:
    got = {g: (d[0] if (d := P.die_donor(load_hardware(g))) else None) for g in (
        "h100-pcie", "a100-40gb-sxm", "gb200", "l4", "a10g", "mi300x", "h100-sxm", "h200", "l40s",
    )}  # fmt: skip
    assert got == {
        "h100-pcie": "h100-sxm",  # GH100: H100 SXM's bandwidth (3.35 TB/s) is closer to 2.0 than H200's 4.8
        "a100-40gb-sxm": "a100-80gb-sxm",  # GA100
        "gb200": "b200",  # GB100
        "l4": None,  # AD104: no profiled GPU on it
        "a10g": None,  # GA102
        "mi300x": None,  # no die stated
        "h100-sxm": "h200",  # (a profiled GPU never lends to itself: the held-out check's pair)
        "h200": "h100-sxm",
        # AD102: the RTX 4090's tables are LLMServingSim per-layer timings, not kernel-level ones
        "l40s": None,
    }
    # H200 is on the same die but 2.4x H100 PCIe's bandwidth: beyond DONOR_MAX_RATIO, no donor
    assert P.die_donor(load_hardware("h100-pcie"), exclude={"h100-sxm"}) is None
    assert not P.kernel_level(load_profile("rtx-4090"))  # type: ignore[arg-type]
    assert P.kernel_level(load_profile("h100-sxm"))  # type: ignore[arg-type]


def test_scaling_is_the_identity_on_the_donor_itself() -> None:
    """The donor's own rows, scaled to its own datasheet, are its tables' lookups: its measured
    times at the measured points (GEMM curves drop isolated spikes, so the median, not every row)."""
    prof = load_profile("h100-sxm")
    assert prof is not None
    hw = load_hardware("h100-sxm")
    prior = P.load_prior()
    assert prior is not None
    for family in ("gemm", "attn_decode", "moe"):
        frame = prof.frame(family)
        frame = frame[np.linspace(0, frame.height - 1, 400).round().astype(int)]
        got = P.donor_times(family, frame, prof, hw, hw, prior.curves)
        rel = got / frame["time_s"].to_numpy() - 1.0
        assert np.isfinite(got).mean() > 0.95, family
        assert float(np.nanmedian(np.abs(rel))) < 1e-6, family


def test_scaling_follows_the_curve_ratio() -> None:
    """A made-up H100 with twice the memory bandwidth: a decode-attention row (memory-bound) is
    faster by exactly the attn_decode curve's ratio between the two datasheets, so between 1x
    (the kernel floor) and 2x (bandwidth alone); a compute-bound GEMM barely moves."""
    prof = load_profile("h100-sxm")
    prior = P.load_prior()
    assert prof is not None and prior is not None
    hw = load_hardware("h100-sxm")
    fast = replace(hw, name="h100-2x", memory_bandwidth_bytes_per_s=2 * hw.memory_bandwidth_bytes_per_s)
    dec = pl.DataFrame({"kv_dtype": "bf16", "nq": 32, "nkv": 8, "d": 128, "batch": [64], "ctx": [8192]})
    base = P.donor_times("attn_decode", dec, prof, hw, hw, prior.curves)[0]
    got = P.donor_times("attn_decode", dec, prof, hw, fast, prior.curves)[0]
    c = prior.curves["attn_decode"]
    ratio = float(c.time(*P.decode_terms(fast, "bf16", 64.0, 8192.0, 32, 8, 128))) / float(
        c.time(*P.decode_terms(hw, "bf16", 64.0, 8192.0, 32, 8, 128))
    )
    assert got == pytest.approx(base * ratio, rel=1e-9)
    assert 0.5 < got / base < 0.75
    gem = pl.DataFrame({"dtype": "bf16", "m": [8192], "n": [8192], "k": [8192]})
    g0 = P.donor_times("gemm", gem, prof, hw, hw, prior.curves)[0]
    g1 = P.donor_times("gemm", gem, prof, hw, fast, prior.curves)[0]
    assert 0.9 < g1 / g0 <= 1.0
    # a dtype the donor never measured is not invented
    fp4 = pl.DataFrame({"dtype": "nvfp4", "m": [64], "n": [4096], "k": [4096]})
    assert np.isnan(P.donor_times("gemm", fp4, prof, hw, hw, prior.curves)[0])


@pytest.fixture(scope="module")
def h200_check() -> pl.DataFrame:
    """H200's operator rows from H100 SXM's tables (prior fitted without H200)."""
    prior = P.load_prior()
    assert prior is not None
    return P.die_donor_check(P.measured_rows(), only="h200", used=prior.used)


def test_held_out_pair_beats_the_prior_alone(h200_check: pl.DataFrame) -> None:
    """H200's operator rows from H100 SXM's tables, scaled by a prior fitted without H200: in
    every bf16 GEMM and attention family and token range, better than that prior alone
    (measured: 2-11 % median against 9-50 %)."""
    check = h200_check
    assert set(check["gpu"]) == {"h200"} and set(check["donor"]) == {"h100-sxm"}
    main = check.filter(pl.col("family").is_in(["gemm:bf16", "attn_decode", "attn_prefill"]))
    assert main.height == 6
    for r in main.iter_rows(named=True):
        assert r["median_abs_error"] < r["prior_median_abs_error"], r
        assert r["median_abs_error"] < 0.12, r


def test_cost_model_records_the_donor() -> None:
    """H100 PCIe (no profile) is priced from H100 SXM's tables: a decode step of Llama-3.1-8B is
    slower than on H100 SXM by about the bandwidth ratio (memory-bound: 3.35 / 2.0 TB/s),
    and the record and the report's first card say whose tables priced it."""
    pcie = step_cost_for(_dep("llama-3.1-8b", "h100-pcie"), "auto", 8192, 256)
    sxm = step_cost_for(_dep("llama-3.1-8b", "h100-sxm"), "auto", 8192, 256)
    assert pcie.source == "prior" and sxm.source == "measured"
    assert pcie.describe["stack"]["scaled_from"] == "h100-sxm"
    assert "h100-sxm's measured tables" in pcie.describe["gemm"]
    steps = decode_batch(64.0, 2048.0)
    r = float(pcie(steps).time_s[0] / sxm(steps).time_s[0])
    assert 1.3 < r < 3.35 / 2.0 + 0.05
    card = cost_card(pcie.describe | {"source": "prior"})
    assert card is not None and "same-die h100-sxm tables, scaled" in card[1] and "GH100" in card[2]
    # without a donor: the prior's curves, as before
    l4 = step_cost_for(_dep("llama-3.1-8b", "l4"), "auto", 8192, 256)
    assert "scaled_from" not in l4.describe["stack"]
    card = cost_card(l4.describe | {"source": "prior"})
    assert card is not None and card[1].startswith("size-aware prior")


def test_prior_profile_without_the_donor() -> None:
    prior = P.load_prior()
    assert prior is not None
    dep = _dep("qwen3-30b-a3b", "a100-40gb-sxm")
    with_donor = P.prior_profile(dep.hardware, dep, prior, gemm_shapes(dep))
    without = P.prior_profile(dep.hardware, dep, prior, gemm_shapes(dep), use_donor=False)
    assert with_donor.meta.stack["scaled_from"] == "a100-80gb-sxm"
    assert "scaled_from" not in without.meta.stack
    # the donor's routing distributions come along (the measured tier prefers skewed routing)
    assert "power_law_1.01" in set(with_donor.frame("moe")["distribution"])
    assert set(without.frame("moe")["distribution"]) <= {P.MOE_ROUTING}


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ('"GH 100"', "die must be a die name"),
        ('""', "die must be a non-empty string"),
        ("3", "die must be a non-empty string"),
        ('"' + "x" * 40 + '"', "die must be a die name"),
    ],
)
def test_bad_die_in_a_hardware_file(tmp_path: Path, value: str, match: str) -> None:
    text = (Path(load_hardware("h100-pcie").path)).read_text()
    bad = text.replace('die = "GH100"', f"die = {value}", 1)
    assert bad != text
    path = tmp_path / "gpu.toml"
    path.write_text(bad)
    with pytest.raises(ConfigError, match=match):
        load_hardware_file(path)


def test_die_needs_a_source(tmp_path: Path) -> None:
    text = Path(load_hardware("h100-pcie").path).read_text()
    lines = [ln for ln in text.splitlines() if not (ln.startswith("die = ") and "whitepaper" in ln)]
    path = tmp_path / "gpu.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"missing key\(s\) \['die'\]"):
        load_hardware_file(path)
    # and a file without die at all is fine (no donor)
    path.write_text("\n".join(ln for ln in lines if not ln.startswith("die = ")) + "\n")
    assert load_hardware_file(path).die == ""


def test_a_format_neither_gpu_has_a_peak_for_is_still_lent(h200_check: pl.DataFrame) -> None:
    """MXFP4 fused MoE on Hopper (no FP4 tensor cores: the kernels dequantise): H100 SXM measured
    gpt-oss-120b's expert shape, so H100 PCIe takes it, scaled at the bf16 peak both run it at;
    and the record names the donor only for what it lent."""
    dep = Deployment(load_model("gpt-oss-120b"), load_hardware("h100-pcie"), tp=2, weight_dtype="mxfp4")
    cost = step_cost_for(dep, "auto", 4096)
    assert "mxfp4" in cost.describe["moe"] and "h100-sxm's measured tables" in cost.describe["moe"]
    assert "MoE experts" not in cost.describe["roofline_parts"]
    # gpt-oss's sliding-window attention is the roofline's: no donor named there
    assert cost.describe["attention"].startswith("roofline") and "h100-sxm" not in cost.describe["attention"]
    # a head shape the donor never measured (Llama-2-7B's 32 KV heads in decode): said so
    llama2 = step_cost_for(_dep("llama-2-7b", "h100-pcie"), "auto", 4096)
    assert "(prefill attention only)" in llama2.describe["attention"]
    # held out: H200's balanced MXFP4 rows from H100 SXM's, where the prior alone has no FP4 peak
    mx = h200_check.filter(pl.col("family").str.starts_with("moe:mxfp4"))
    assert mx.height > 0
    assert float(mx["median_abs_error"].median()) < 0.15  # type: ignore[arg-type]
    assert (mx["median_abs_error"] < mx["prior_median_abs_error"]).all()


def test_a_file_claiming_a_die_far_from_its_datasheet_borrows_nothing(tmp_path: Path) -> None:
    """An L4 entry relabelled GH100 (300 GB/s against H100 SXM's 3,35 TB/s, 11x): no die-mate of
    the profiled H100s (DONOR_MAX_RATIO), so the prior's curves price it; the catalog's lent
    pairs stay within the bound (H100 PCIe 1.68x in bandwidth)."""
    text = Path(load_hardware("l4").path).read_text()
    fake = text.replace('name = "l4"', 'name = "fakegh"', 1).replace('die = "AD104"', 'die = "GH100"', 1)
    path = tmp_path / "fakegh.toml"
    path.write_text(fake)
    hw = load_hardware_file(path)
    assert hw.die == "GH100" and P.die_donor(hw) is None
    cost = step_cost_for(Deployment(load_model("llama-3.1-8b"), hw), "auto", 4096)
    assert cost.source == "prior" and "scaled_from" not in cost.describe["stack"]
    pcie = load_hardware("h100-pcie")
    sxm = load_hardware("h100-sxm")
    assert sxm.memory_bandwidth_bytes_per_s / pcie.memory_bandwidth_bytes_per_s < P.DONOR_MAX_RATIO


def test_a_calibrated_hardware_file_is_told_its_factors_are_not_used(tmp_path: Path) -> None:
    """A `calibrate` output (the H100's datasheet under another name, fitted factors) is priced by
    the auto tier from H100 SXM's measured tables; the record and the card say that its
    [efficiency] factors price only the roofline tier."""
    text = Path(load_hardware("h100-sxm").path).read_text()
    path = tmp_path / "h100cal.toml"
    path.write_text(text.replace('name = "h100-sxm"', 'name = "h100cal"', 1))
    hw = load_hardware_file(path)
    cost = step_cost_for(Deployment(load_model("llama-3.1-8b"), hw), "auto", 4096)
    assert cost.describe["stack"]["scaled_from"] == "h100-sxm"
    assert "price only the roofline tier" in cost.describe["factors_note"]
    card = cost_card(cost.describe | {"source": "prior"})
    assert card is not None and 'cost_model = "roofline"' in card[2] and "1x h100-sxm's" in card[2]
    # the catalog's own GPUs get no such note
    plain = step_cost_for(_dep("llama-3.1-8b", "h100-pcie"), "auto", 4096)
    assert "factors_note" not in plain.describe
