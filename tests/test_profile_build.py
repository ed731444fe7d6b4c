"""Profiles on disk: loading and refusing them (pipeline/costmodel/profile/tables.py), building them from
operator measurements and judging them on held-out shapes (pipeline/costmodel/profile/build.py,
pipeline/costmodel/profile/heldout.py).

A tiny synthetic AIConfigurator set (power-law latencies, so log-log interpolation is exact and
held-out errors are ~0) goes through the whole build; where ../shared/measurements is laid out,
the real H100 tables are judged against the accuracy targets.
"""

from __future__ import annotations

import itertools
import shutil
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from pipeline.common.errors import ConfigError
from pipeline.costmodel.profile.build import build_profiles, select_rows
from pipeline.costmodel.profile.heldout import (
    TARGET_MEDIAN,
    TARGET_P90,
    _alternate,
    fit_fallbacks,
    heldout_summary,
    judge,
    summarise,
)
from pipeline.costmodel.profile.select import MAX_GEMM_M
from pipeline.costmodel.profile.sources import read_measurements
from pipeline.costmodel.profile.tables import PROFILES_DIR, list_profiles, load_profile, load_profile_dir
from tests.conftest import shared_path

# ----------------------------------------------------------------------------------- loading


@pytest.fixture
def small_profile(tmp_path: Path) -> Path:
    """A copy of the smallest shipped profile (rtx-4090: five small tables)."""
    folder = tmp_path / "rtx-4090"
    shutil.copytree(PROFILES_DIR / "rtx-4090", folder)
    return folder


def test_shipped_profiles_load_with_their_row_counts() -> None:
    assert set(list_profiles()) >= {"h100-sxm", "h200", "b200", "a100-80gb-sxm", "l40s", "rtx-4090", "rtx-pro-6000"}
    for gpu in ("rtx-4090", "h100-sxm"):
        prof = load_profile(gpu)
        assert prof is not None and prof.gpu == gpu
        assert prof.meta.rows
        for fam, n in prof.meta.rows.items():
            assert prof.frame(fam).height == n > 0
    assert load_profile("mi300x") is None


def test_copy_of_a_profile_loads(small_profile: Path) -> None:
    prof = load_profile_dir(small_profile)
    assert prof.meta.rows == {"attn_decode": 99, "attn_prefill": 8, "gemm": 608, "model_ops": 1448, "attn_mixed": 8544}
    assert prof.gemm_dtypes() == ["bf16"]
    assert prof.fitted("attention_tile_tokens", -1.0) == 32.0
    assert prof.fitted("no_such_number", 7.0) == 7.0


def test_truncated_table_is_refused(small_profile: Path) -> None:
    path = small_profile / "gemm.parquet"
    pl.read_parquet(path).head(100).write_parquet(path)
    with pytest.raises(ConfigError) as err:
        load_profile_dir(small_profile)
    assert str(path) in str(err.value)
    assert "100 rows" in str(err.value) and "608" in str(err.value)


def test_missing_table_is_refused(small_profile: Path) -> None:
    path = small_profile / "attn_prefill.parquet"
    path.unlink()
    with pytest.raises(ConfigError) as err:
        load_profile_dir(small_profile)
    assert str(path) in str(err.value) and "0 rows" in str(err.value)


def test_corrupt_table_is_refused(small_profile: Path) -> None:
    path = small_profile / "model_ops.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError) as err:
        load_profile_dir(small_profile)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)
    path.write_bytes(b"not a parquet file at all")
    with pytest.raises(ConfigError, match=r"model_ops\.parquet"):
        load_profile_dir(small_profile)


def test_unknown_key_in_profile_toml_is_refused(small_profile: Path) -> None:
    toml = small_profile / "profile.toml"
    toml.write_text('colour = "red"\n' + toml.read_text())
    with pytest.raises(ConfigError) as err:
        load_profile_dir(small_profile)
    assert str(toml) in str(err.value) and "colour" in str(err.value)


def test_missing_key_and_bad_toml_are_refused(small_profile: Path) -> None:
    toml = small_profile / "profile.toml"
    text = toml.read_text()
    toml.write_text(text.replace('gpu = "rtx-4090"\n', ""))
    with pytest.raises(ConfigError, match=r"missing key.*gpu"):
        load_profile_dir(small_profile)
    toml.write_text(text + "\n[rows\n")
    with pytest.raises(ConfigError) as err:
        load_profile_dir(small_profile)
    assert str(toml) in str(err.value)
    toml.unlink()
    with pytest.raises(ConfigError, match=r"profile\.toml"):
        load_profile_dir(small_profile)


@pytest.mark.parametrize("bad", ["rows-value-not-int", "built_from-not-list"])
def test_mistyped_profile_toml_value_is_a_config_error(small_profile: Path, bad: str) -> None:
    toml = small_profile / "profile.toml"
    lines = toml.read_text().splitlines()
    if bad == "rows-value-not-int":
        assert "gemm = 608" in lines
        lines = ['gemm = "six hundred"' if ln == "gemm = 608" else ln for ln in lines]
    else:
        lines = ["built_from = 3" if ln.startswith("built_from = ") else ln for ln in lines]
    toml.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"profile\.toml"):
        load_profile_dir(small_profile)


def test_table_missing_a_column_is_refused(small_profile: Path) -> None:
    path = small_profile / "gemm.parquet"
    pl.read_parquet(path).drop("time_s").write_parquet(path)
    with pytest.raises(ConfigError, match=r"gemm\.parquet"):
        load_profile_dir(small_profile)


# ----------------------------------------------------------------------------------- held-out helpers


def test_alternate_positions() -> None:
    assert _alternate([5, 1, 3, 2, 4, 3]) == ({1, 3, 5}, {2, 4})
    assert _alternate([1, 2, 3, 4]) == ({1, 3}, {2})  # 4 is last: never extrapolated to
    assert _alternate([7]) == ({7}, set())


def test_fit_fallbacks_hand_computed() -> None:
    sizes = [1024, 4096, 65536, 1 << 20]
    rows = []
    for b in sizes:
        rows.append(("custom_graph", 2, b, 10e-6 + b * 1e-12))
        rows.append(("custom_eager", 2, b, 10e-6 + b * 1e-12 + (4e-6 if b < 4096 else 6e-6)))
    frame = pl.DataFrame(rows, schema=["backend", "gpus", "bytes", "time_s"], orient="row")
    fitted = fit_fallbacks({"allreduce": frame})
    # eager − graph over ≤ 64 KiB: 4, 6, 6 µs → median 6 µs; graph floor: ≤ 4 KiB → median(1024, 4096)
    assert fitted["eager_call_overhead_s"] == pytest.approx(6e-6, rel=1e-9)
    assert fitted["graph_kernel_floor_s"] == pytest.approx(10e-6 + 2560e-12, rel=1e-9)
    assert fit_fallbacks({}) == {}


# ----------------------------------------------------------------------------------- a synthetic build

_MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, MAX_GEMM_M, 2 * MAX_GEMM_M]
_NK = [512, 1024, 2048, 4096, 8192, 16384]


def _latency_ms(m: float, n: float, k: float, c: float) -> float:
    return c * m**0.7 * n**0.5 * k**0.3


def _write_synthetic(root: Path) -> dict[str, int]:
    """An AIConfigurator-layout set for h100_sxm: GEMM and custom all-reduce tables. Returns the
    row counts a profile must keep."""
    gemm_dir = root / "aiconfigurator-vllm-ops" / "h100_sxm" / "gemm" / "vllm" / "0.24.0"
    gemm_dir.mkdir(parents=True)
    rows = []
    for dtype, kernel, c in (("bfloat16", "torch.nn.functional.linear", 1e-6), ("fp8", "cutlass_fp8", 6e-7)):
        for m, n, k in itertools.product(_MS, _NK, _NK):
            rows.append((dtype, kernel, m, n, k, _latency_ms(m, n, k, c)))
    # dropped by the selection: a second bf16 kernel with fewer rows, a dtype without a catalog
    # weight format (int4 weight-only), and (above) m beyond MAX_GEMM_M
    for m, n, k in itertools.product([1, 64, 1024], [1024, 4096], [1024, 4096]):
        rows.append(("bfloat16", "triton_other", m, n, k, 3 * _latency_ms(m, n, k, 1e-6)))
        rows.append(("int4_wo", "marlin", m, n, k, _latency_ms(m, n, k, 2e-7)))
    # and a partial collection (RTX PRO 6000's fp8-block: no n or k reaches a model's layers)
    for m, n, k in itertools.product([1, 64, 1024], [64, 128], [64, 128]):
        rows.append(("fp8_block", "cutlass_block", m, n, k, 0.17))
    frame = pl.DataFrame(rows, schema=["gemm_dtype", "kernel_source", "m", "n", "k", "latency"], orient="row")
    frame.write_parquet(gemm_dir / "gemm_perf.parquet")
    # an older version folder the reader must ignore (newest version read)
    old = gemm_dir.parent / "0.9.0"
    old.mkdir()
    frame.with_columns(latency=pl.col("latency") * 100).write_parquet(old / "gemm_perf.parquet")

    comm_dir = root / "aiconfigurator-vllm-ops" / "h100_sxm" / "comm" / "vllm" / "0.24.0"
    comm_dir.mkdir(parents=True)
    ar = []
    for gpus in (2, 4):
        for b in [2**i for i in range(8, 25)]:
            base = 0.008 + b * 2e-9 / gpus
            ar.append(("vllm_graph", gpus, b, base))
            ar.append(("vllm_eager", gpus, b, base + 0.005))
    pl.DataFrame(ar, schema=["backend", "num_gpus", "message_size", "latency"], orient="row").write_parquet(
        comm_dir / "custom_allreduce_perf.parquet"
    )
    kept_m = sum(1 for m in _MS if m <= MAX_GEMM_M)
    return {"gemm": 2 * kept_m * len(_NK) ** 2, "allreduce": len(ar)}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    root = tmp_path_factory.mktemp("measurements")
    return root, _write_synthetic(root)


def test_select_rows_keeps_the_swept_kernel(synthetic: tuple[Path, dict[str, int]]) -> None:
    root, want = synthetic
    meas = read_measurements(root)
    assert meas.gpus == ["h100-sxm"]
    frames, selection = select_rows(meas, "h100-sxm")
    g = frames["gemm"]
    assert g.height == want["gemm"]
    assert sorted(g["dtype"].unique().to_list()) == ["bf16", "fp8"]
    assert set(g["kernel"].unique().to_list()) == {"torch.nn.functional.linear", "cutlass_fp8"}
    assert g["m"].max() == MAX_GEMM_M
    assert selection["gemm"] == (
        "bf16: torch.nn.functional.linear; fp8: cutlass_fp8; left out (no n or k reaches 1,024): fp8-block"
    )
    # latencies in ms became seconds; the newest version folder was read
    row = g.filter((pl.col("dtype") == "bf16") & (pl.col("m") == 64) & (pl.col("n") == 4096) & (pl.col("k") == 1024))
    assert row["time_s"].to_list() == pytest.approx([_latency_ms(64, 4096, 1024, 1e-6) * 1e-3], rel=1e-12)
    assert set(frames["allreduce"]["backend"].unique().to_list()) == {"custom_graph", "custom_eager"}
    # AIConfigurator's message_size counts bf16 elements: 2**8 of them are 512 bytes
    ar = frames["allreduce"]
    assert sorted(ar["bytes"].unique().to_list()) == [2 * 2**i for i in range(8, 25)]


def test_build_profiles_writes_a_loadable_exact_profile(synthetic: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    root, want = synthetic
    built = build_profiles(root, out_dir=tmp_path / "profiles")
    assert [b.gpu for b in built] == ["h100-sxm"]
    folder = tmp_path / "profiles" / "h100-sxm"
    assert built[0].folder == folder
    assert built[0].rows == want
    prof = load_profile_dir(folder)
    assert dict(prof.meta.rows) == want
    for fam, n in want.items():
        assert pl.read_parquet(folder / f"{fam}.parquet").height == n
    assert sorted(p.name for p in folder.iterdir()) == ["allreduce.parquet", "gemm.parquet", "profile.toml"]
    assert prof.meta.built_from == (
        "aiconfigurator-vllm-ops/h100_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet",
        "aiconfigurator-vllm-ops/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
    )
    # held-out GEMM errors ~0 (a power law is exact in log-log), in both token ranges
    held = prof.meta.heldout
    for rng in ("1-127", "128+"):
        entry = held[f"gemm, {rng}"]
        assert entry["rows"] > 0
        assert entry["median_abs_error"] < 1e-6 and entry["p90_abs_error"] < 1e-6
    # fitted fallbacks read off the all-reduce table: eager − graph = 5 µs; graph floor ≤ 4 KiB
    # (message_size counts 2-byte elements: 4 KiB is 2,048 of them)
    assert prof.fitted("eager_call_overhead_s", 0.0) == pytest.approx(5e-6, rel=1e-9)
    floor = np.median([0.008 + b * 2e-9 / g for g in (2, 4) for b in (256, 512, 1024, 2048)]) * 1e-3
    assert prof.fitted("graph_kernel_floor_s", 0.0) == pytest.approx(floor, rel=1e-9)
    assert prof.fitted("attention_tile_tokens", -1.0) == 0.0  # no attention measured
    # the profile answers GEMMs it never saw exactly (both coordinates interpolated)
    m = np.array([3.0, 100.0, 3000.0])
    np.testing.assert_allclose(
        prof.gemm_time("bf16", 3000, 5000, m), [_latency_ms(x, 3000, 5000, 1e-6) * 1e-3 for x in m], rtol=1e-9
    )
    # rebuilding over an existing profile gives the same files (atomic rewrite) and removes the
    # table of a family the new build does not have
    before = _toml_without_trained_on(folder / "profile.toml")
    (folder / "moe.parquet").write_bytes(b"stale")
    build_profiles(root, out_dir=tmp_path / "profiles")
    assert not (folder / "moe.parquet").exists()
    after = _toml_without_trained_on(folder / "profile.toml")
    assert after == before
    assert after["rows"] == want


def _toml_without_trained_on(path: Path) -> dict[str, Any]:
    """profile.toml parsed, less the held-out checks' ``trained_on`` (not reproducible: see
    test_heldout_summary_is_reproducible)."""
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    for entry in data.get("heldout", {}).values():
        entry.pop("trained_on", None)
    return data


def test_heldout_summary_is_reproducible(synthetic: tuple[Path, dict[str, int]]) -> None:
    root, _ = synthetic
    meas = read_measurements(root)
    first = heldout_summary(judge(meas, "h100-sxm"))
    for _ in range(30):
        assert heldout_summary(judge(meas, "h100-sxm")) == first


def test_judge_synthetic_errors_are_zero(synthetic: tuple[Path, dict[str, int]]) -> None:
    root, _ = synthetic
    errors = judge(read_measurements(root), "h100-sxm")
    gemm = errors.filter(pl.col("check") == "gemm")
    # both dtypes of the swept kernel; odd interior n, k: 1024 and 4096 → 4 shapes × every m a
    # profile ships (m ≤ MAX_GEMM_M: the judge reads the rows the build keeps; the partial
    # fp8-block table and the int4 rows are not judged either)
    assert gemm.height == 2 * 4 * sum(1 for m in _MS if m <= MAX_GEMM_M)
    assert float(gemm["error"].abs().max()) < 1e-9
    coll = errors.filter(pl.col("check") == "collectives")
    # the all-reduce latency is affine in the bytes (a + b·x): convex in log-log, so the chord
    # between every other size over-predicts the sizes in between, by at most a few %
    assert coll.height == 2 * 2 * 8  # 2 backends × 2 GPU counts × 8 interior odd sizes
    assert float(coll["error"].min()) >= -1e-12
    assert 0.01 < float(coll["error"].max()) < 0.1
    s = summarise(errors)
    assert s.filter(pl.col("check") == "gemm")["meets"].to_list() == [True, True]
    assert set(heldout_summary(errors)) >= {"gemm, 1-127", "gemm, 128+"}


def test_build_only_the_gpus_asked(synthetic: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    root, _ = synthetic
    assert build_profiles(root, out_dir=tmp_path / "p", gpus=["l40s"]) == []
    assert not (tmp_path / "p").exists()


def test_folder_without_measurement_sets_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("nothing here")
    with pytest.raises(ConfigError, match="neither aiconfigurator-vllm-ops"):
        build_profiles(empty, out_dir=tmp_path / "profiles")
    with pytest.raises(ConfigError, match="not a folder"):
        build_profiles(tmp_path / "absent", out_dir=tmp_path / "profiles")
    assert not (tmp_path / "profiles").exists()


def test_bad_measurement_table_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "aiconfigurator-vllm-ops" / "h100_sxm" / "gemm" / "vllm" / "0.24.0"
    d.mkdir(parents=True)
    pl.DataFrame({"gemm_dtype": ["bfloat16"], "m": [1], "n": [1], "k": [1], "latency": [1.0]}).write_parquet(
        d / "gemm_perf.parquet"
    )
    with pytest.raises(ConfigError, match=r"missing column.*kernel_source"):
        build_profiles(tmp_path, out_dir=tmp_path / "profiles")


# ----------------------------------------------------------------------------------- the real H100 set


@pytest.fixture(scope="module")
def h100_errors() -> pl.DataFrame:
    root = shared_path("measurements")
    return judge(read_measurements(root), "h100-sxm")


def _summary_row(summary: pl.DataFrame, check: str, token_range: str) -> dict[str, float]:
    rows = summary.filter((pl.col("check") == check) & (pl.col("token_range") == token_range))
    assert rows.height == 1, (check, token_range)
    return rows.row(0, named=True)


@pytest.mark.parametrize("token_range", ["1-127", "128+"])
def test_h100_gemm_heldout_meets_targets(h100_errors: pl.DataFrame, token_range: str) -> None:
    row = _summary_row(summarise(h100_errors), "gemm", token_range)
    assert row["rows"] > 1000
    assert row["median_abs"] <= TARGET_MEDIAN == 0.05
    assert row["p90_abs"] <= TARGET_P90 == 0.15


@pytest.mark.parametrize("token_range", ["1-127", "128+"])
def test_h100_decode_attention_heldout_median(h100_errors: pl.DataFrame, token_range: str) -> None:
    row = _summary_row(summarise(h100_errors), "decode attention", token_range)
    assert row["rows"] > 1000
    assert row["median_abs"] <= 0.05


def test_h100_shipped_profile_states_these_errors(h100_errors: pl.DataFrame) -> None:
    # profile.toml of h100-sxm was judged on the same rows: its figures are these, rounded
    prof = load_profile("h100-sxm")
    assert prof is not None
    summary = heldout_summary(h100_errors)
    for key in ("gemm, 1-127", "gemm, 128+", "decode attention, 1-127", "decode attention, 128+"):
        shipped = prof.meta.heldout[key]
        assert shipped["rows"] == summary[key]["rows"], key
        assert shipped["median_abs_error"] == pytest.approx(summary[key]["median_abs_error"], abs=5e-4), key
        assert shipped["p90_abs_error"] == pytest.approx(summary[key]["p90_abs_error"], abs=5e-4), key


def test_shipped_all_reduce_tables_are_in_bytes() -> None:
    # AIConfigurator's message_size counts bf16 elements; read as bytes, H100 x8 NCCL moved 1 GiB
    # at ~235 GB/s of bus bandwidth, half of what NVLink 4 gives (NCCL's ring: 2(n-1)/n x bytes /
    # time). In bytes it is 400-500 GB/s, and A100's NVLink 3 about half of that.
    for gpu, lo, hi in (("h100-sxm", 400e9, 520e9), ("a100-80gb-sxm", 180e9, 260e9)):
        curve = load_profile(gpu).allreduce_curve("nccl", 8)
        assert curve is not None
        size = float(2**30)
        busbw = 2 * 7 / 8 * size / float(curve(np.array([size]))[0])
        assert lo < busbw < hi, (gpu, busbw / 1e9)


def test_shipped_h100_nccl_curve_agrees_with_vidur() -> None:
    # An independent measurement of the same collective: Vidur's DGX H100 NCCL all-reduce over 8
    # GPUs (network/h100_dgx/all_reduce.csv, size in bytes; medians 51, 115 and 322 us at 4, 16
    # and 64 MiB). The corrected AIConfigurator curve is within 1-6 %; read as bytes it was ~1.8x.
    import polars as pl

    path = shared_path("measurements", "vidur-profiling", "network", "h100_dgx", "all_reduce.csv")
    vidur = pl.read_csv(path).filter(pl.col("num_workers") == 8)
    curve = load_profile("h100-sxm").allreduce_curve("nccl", 8)
    assert curve is not None
    for mib in (4, 16, 64):
        size = mib * 2**20
        want = float(vidur.filter(pl.col("size") == size)["time_stats.all_reduce.median"].median()) * 1e-3
        assert float(curve(np.array([float(size)]))[0]) == pytest.approx(want, rel=0.10), mib


def test_a_partial_gemm_table_is_not_shipped() -> None:
    # RTX PRO 6000's fp8-block GEMMs were 7 shapes with n, k <= 128: a 4096 x 4096 GEMM was
    # extrapolated to ~342 ms. The dtype is left out, so such a model's GEMMs take the roofline.
    prof = load_profile("rtx-pro-6000")
    assert not prof.has_gemm("fp8-block") and prof.has_gemm("fp8") and prof.has_gemm("bf16")
    assert "left out (no n or k reaches 1,024): fp8-block" in prof.meta.selection["gemm"]
