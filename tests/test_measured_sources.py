"""Several measured sources per GPU (pipeline/costmodel/profile/precedence.py): the stated
precedence, the fleet's override, the run's record, and the implausible rows the build leaves out
(pipeline/costmodel/profile/plausible.py), on hand-made rows."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pipeline.common.errors import ConfigError
from pipeline.costmodel.profile.build import leave_out_implausible, select_rows
from pipeline.costmodel.profile.plausible import drop_flagged, fp8_table_notes, implausible_rows, non_monotone
from pipeline.costmodel.profile.precedence import choose_sets, known_sources, source_order
from pipeline.costmodel.profile.sources import read_measurements
from pipeline.costmodel.profile.tables import PROFILES_DIR, list_profiles, load_profile
from tests.conftest import shared_path


def _gemm(rows: list[tuple[str, int, int, int, float]]) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {"gpu": "g", "set": "aiconfigurator", "source": "s", "dtype": d, "kernel": f"k-{d}", "m": m, "n": n, "k": k,
             "time_s": t}
            for d, n, k, m, t in rows
        ]
    )  # fmt: skip


def _moe(rows: list[tuple[str, int, float]]) -> pl.DataFrame:
    shape = {"distribution": "balanced", "h": 2048, "inter": 768, "topk": 8, "experts": 128, "moe_tp": 1, "moe_ep": 1}
    return pl.DataFrame(
        [{"gpu": "g", "set": "aiconfigurator", "source": "s", "dtype": d, "kernel": f"k-{d}", **shape, "tokens": n,
          "time_s": t} for d, n, t in rows]
    )  # fmt: skip


MS = (1, 2, 4, 8, 16, 32, 64, 128)


def test_fp8_slower_than_bf16_beyond_its_table_is_flagged_and_near_it_is_not() -> None:
    rows = [("bf16", 4096, 4096, m, 1e-5 * (1 + m / 64)) for m in MS]
    fp8 = {m: 0.6 * 1e-5 * (1 + m / 64) for m in MS}
    fp8[8] *= 5.0  # 3x bf16: beyond 2x the table's 0.6x (taken as 1x)
    fp8[32] *= 2.5  # 1.5x bf16: within noise
    rows += [("fp8", 4096, 4096, m, t) for m, t in fp8.items()]
    # a tiny shape where fp8's fixed costs dominate: no model layer, never judged
    rows += [("bf16", 32, 64, 8, 3e-6), ("fp8", 32, 64, 8, 2e-4)]
    flagged = implausible_rows({"gemm": _gemm(rows)})
    assert flagged.select("rule", "size").rows() == [("fp8_slower_than_bf16", 8)]
    assert "3.00x bf16" in flagged["reason"][0]


def test_a_systematically_slower_fp8_kernel_is_said_not_removed() -> None:
    rows = [("bf16", n, 1e-4 * n) for n in MS] + [("fp8", n, 2.3e-4 * n) for n in MS]
    frame = _moe(rows)
    assert implausible_rows({"moe": frame}).height == 0
    (note,) = fp8_table_notes(frame, "moe")
    assert "median 2.30x" in note and "kept" in note
    spiked = _moe([*rows[:-1], ("fp8", 128, 2.3e-4 * 128 * 2.5)])  # 5.75x bf16 > 2 x 2.3
    assert implausible_rows({"moe": spiked})["size"].to_list() == [128]


def test_flagged_rows_come_in_curve_order_whatever_the_row_order() -> None:
    """profile.toml lists the first flagged rows: the same ones on every build (re-runs give the
    same bytes), in curve order (shape, then size), however the table's rows were ordered. The
    FP8 rule's joins used to hand them over in hash order (B200's list changed between builds)."""
    rows = []
    for n in range(1024, 1024 + 64 * 128, 128):
        for k in (1024, 2048, 4096):
            for m in MS:
                t = 1e-5 * (1 + m / 64) * n / 1024
                slow = m == 8 or (m == 64 and (n // 128 + k) % 3 == 0)
                rows += [("bf16", n, k, m, t), ("fp8", n, k, m, 0.6 * t * (5.0 if slow else 1.0))]
    frame = _gemm(rows)
    first = implausible_rows({"gemm": frame})
    assert first.height == 64 * 3 + 65 and set(first["rule"]) == {"fp8_slower_than_bf16"}
    for seed in range(4):
        again = implausible_rows({"gemm": frame.sample(fraction=1.0, shuffle=True, seed=seed)})
        assert again.select("key", "size").rows() == first.select("key", "size").rows()
    nks = [tuple(int(part.split("=")[1]) for part in key.split()) for key in first["key"]]
    assert list(zip(nks, first["size"], strict=True)) == sorted(zip(nks, first["size"], strict=True))


@pytest.mark.parametrize(
    ("times", "flagged"),
    [
        ((10, 11, 12, 30, 13, 14, 15, 16), [8]),  # one slow glitch: the glitch, not what follows
        ((10, 11, 4, 12, 13, 14, 15, 16), [4]),  # one fast glitch: the glitch, not what precedes
        ((10, 9, 12, 11, 13, 14, 15, 16), []),  # non-monotone within noise
        ((1, 1, 1, 1, 1, 1, 1, 1), []),
    ],
)
def test_non_monotone_in_tokens_beyond_noise_flags_the_glitch(times: tuple[int, ...], flagged: list[int]) -> None:
    frame = _moe([("bf16", n, t * 1e-5) for n, t in zip(MS, times, strict=True)])
    assert non_monotone(frame, "moe")["size"].to_list() == flagged


def test_the_stated_precedence_and_the_fleets_override() -> None:
    assert source_order() == ("aiconfigurator", "llmservingsim")
    # vLLM 0.19 is llmservingsim's version, but it ran eagerly: CUDA graphs (vLLM's default) come first
    assert source_order("auto", "0.19.0") == ("aiconfigurator", "llmservingsim")
    assert source_order("llmservingsim") == ("llmservingsim", "aiconfigurator")
    with pytest.raises(ConfigError, match="measured_source 'vidur' unknown"):
        source_order("vidur")
    both = pl.DataFrame(
        {"set": ["aiconfigurator", "llmservingsim", "llmservingsim"], "dtype": ["bf16", "bf16", "fp8"], "x": [1, 2, 3]}
    )
    chosen = choose_sets({"gemm": both}, ("aiconfigurator", "llmservingsim"))["gemm"]
    assert chosen["x"].to_list() == [1, 3]  # bf16 from the first set; fp8 only the other measured
    assert choose_sets({"gemm": both}, ("llmservingsim", "aiconfigurator"))["gemm"]["x"].to_list() == [2, 3]


def test_the_editor_schema_offers_the_sources_of_the_catalog() -> None:
    from pipeline.common.tomlschema import _MEASURED_SOURCES

    assert known_sources() == _MEASURED_SOURCES


def test_rtx_pro_6000_keeps_both_sets_and_prices_from_the_chosen_one() -> None:
    prof = load_profile("rtx-pro-6000")
    assert prof is not None
    assert prof.alternatives() == ["aiconfigurator", "llmservingsim"]
    assert prof.frame("attn_decode").filter(pl.col("kv_dtype") == "bf16")["set"].unique().to_list() == [
        "aiconfigurator"
    ]
    other = prof.with_sources("llmservingsim")
    assert other.frame("attn_decode").filter(pl.col("kv_dtype") == "bf16")["set"].unique().to_list() == [
        "llmservingsim"
    ]
    assert other.frame("attn_decode").filter(pl.col("kv_dtype") == "fp8")["set"].unique().to_list() == [
        "aiconfigurator"
    ]  # what only one set measured stays
    import numpy as np

    a = prof.attention_grid("attn_decode", "bf16", 64, 8, 128)
    b = other.attention_grid("attn_decode", "bf16", 64, 8, 128)
    assert a is not None and b is not None
    at = np.array([64.0]), np.array([8192.0])
    assert float(a(*at)[0]) != float(b(*at)[0])  # two kernels' decode at batch 64, 8k context
    assert prof.meta.implausible["count"] > 0  # left out by the build, listed in profile.toml


def test_the_run_record_names_the_tables_only_where_sources_overlap() -> None:
    from pipeline.catalog import load_hardware, load_model
    from pipeline.costmodel.profile.cost import step_cost_for
    from pipeline.costmodel.roofline import Deployment

    rtx = Deployment(load_model("qwen3-32b"), load_hardware("rtx-pro-6000"), tp=2)
    tables = step_cost_for(rtx, max_tokens=1024).describe["tables"]
    assert tables["attn_decode:bf16"].startswith("aiconfigurator (vllm 0.24.0, CUDA graphs) over llmservingsim")
    forced = step_cost_for(rtx, max_tokens=1024, measured_source="llmservingsim").describe["tables"]
    assert forced["attn_decode:bf16"].startswith("llmservingsim (vllm 0.19.0, eager) over aiconfigurator")
    assert "measured_source = 'llmservingsim'" in forced["attn_decode:bf16"]
    h100 = Deployment(load_model("llama-3.1-8b"), load_hardware("h100-sxm"))
    assert "tables" not in step_cost_for(h100, max_tokens=1024).describe  # one source: the record it had


def test_an_unknown_measured_source_is_refused_in_one_line(tmp_path: Path) -> None:
    from pipeline.replay.fleet import load_fleet

    text = Path("fleets/qwen3-32b-rtx-pro-6000-tp2.toml").read_text()
    bad = tmp_path / "f.toml"
    bad.write_text(text.replace('cost_model = "auto"', 'cost_model = "auto"\nmeasured_source = "vidur"'))
    with pytest.raises(ConfigError) as err:
        load_fleet(bad)
    assert "measured_source 'vidur' unknown" in str(err.value) and "\n" not in str(err.value)
    ok = tmp_path / "ok.toml"
    ok.write_text(text.replace('cost_model = "auto"', 'cost_model = "auto"\nmeasured_source = "llmservingsim"'))
    cfg = load_fleet(ok)
    assert cfg.measured_source == "llmservingsim" and cfg.to_dict()["measured_source"] == "llmservingsim"
    assert "measured_source" not in load_fleet(Path("fleets/qwen3-32b-rtx-pro-6000-tp2.toml")).to_dict()


def test_replay_says_none_where_one_source_covers_the_gpu() -> None:
    from pipeline.cli.replay import band_line

    line = band_line({"cost_model": {"source": "measured", "profile": "h100-sxm"}})
    assert line == "band across measured sources: none (one measured source covers h100-sxm's operators)"
    band = {
        "chosen": "aiconfigurator",
        "sources": [{"source": "aiconfigurator"}, {"source": "llmservingsim"}],
        "ttft_s": {"p50": [0.155, 0.1575]},
        "tpot_s": {"p50": [0.0311, 0.0323]},
    }
    got = band_line({"ttft_s": {"p50": 0.1575}, "tpot_s": {"p50": 0.0311}, "source_band": band})
    assert got.startswith("TTFT p50 157.5 ms (band 155.0 ms - 157.5 ms), TPOT p50 31.1 ms (band 31.1 ms - 32.3 ms)")


#: Rows the two rules flag on the shared sets per profiled GPU (rooftrace validate --measurements,
#: measured 2026-12-07): B200's are mostly fp8 GEMMs at large k and small m.
FLAGGED_ON_SHARED_SETS = {
    "a100-80gb-sxm": 0, "b200": 1711, "h100-sxm": 498, "h200": 657, "l40s": 350, "rtx-4090": 0, "rtx-pro-6000": 69,
}  # fmt: skip


def test_every_shipped_profile_leaves_out_the_rows_its_measurements_flag() -> None:
    """Every profile in the catalog was built with both rules: its profile.toml states exactly what
    the build says of the shared sets' flagged rows (count, per family / dtype / rule, the rows
    listed), and none of them is in its GEMM or MoE tables."""
    meas = read_measurements(shared_path("measurements"))
    assert list_profiles() == sorted(FLAGGED_ON_SHARED_SETS)
    for gpu, count in FLAGGED_ON_SHARED_SETS.items():
        frames, _ = select_rows(meas, gpu)
        flagged = implausible_rows(frames)
        assert flagged.height == count, gpu
        _, info = leave_out_implausible(frames)
        prof = load_profile(gpu)
        assert prof is not None
        assert dict(prof.meta.implausible) == info, gpu
        for fam in ("gemm", "moe"):
            path = PROFILES_DIR / gpu / f"{fam}.parquet"
            if path.exists():
                shipped = pl.read_parquet(path)
                assert drop_flagged(shipped, fam, flagged).height == shipped.height, (gpu, fam)
