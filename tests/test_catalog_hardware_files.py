"""Hardware files: catalog bounds, path-named hardware priced, calibrate keeping tables and
refusing physically impossible GEMM rows."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest
from cli_checks import invoke, one_error_line

from pipeline.catalog import hardware_to_toml, load_hardware
from pipeline.catalog.entries import hardware_dir, load_hardware_file, model_from_hf_config
from pipeline.common.errors import ConfigError

L4 = hardware_dir() / "l4.toml"


def _edit(text: str, key: str, value: str) -> str:
    out, n = re.subn(rf"^{re.escape(key)} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
    assert n == 1, key
    return out


def _hw_file(tmp_path: Path, key: str, value: str, name: str = "hw.toml") -> Path:
    path = tmp_path / name
    path.write_text(_edit(L4.read_text(), key, value))
    return path


# -- bounds at load time ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("min_kernel_s", "1e300", r"\[efficiency\]: min_kernel_s must be in \[0, 1\] s, got 1e\+300"),
        ("min_kernel_s", "2.0", r"min_kernel_s must be in \[0, 1\] s, got 2"),
        ("step_overhead_s", "1e300", r"\[efficiency\]: step_overhead_s must be in \[0, 10\] s, got 1e\+300"),
        ("step_overhead_s", "11", r"step_overhead_s must be in \[0, 10\] s, got 11"),
        ("usd_per_gpu_hour", "1e300", r"\[price\]: usd_per_gpu_hour must be in \(0, 1,000,000\] USD, got 1e\+300"),
        ("usd_per_gpu_hour", "0", r"usd_per_gpu_hour must be > 0"),
        ("date", '"2026-99-77"', r"\[price\]: date must be a real calendar date .*'2026-99-77'"),
        ("date", '"2026-02-30"', r"date must be a real calendar date .*'2026-02-30'"),
        ("date", '"2026-13"', r"date must be a real calendar date .*'2026-13'"),
        ("date", '"2026-03x"', r"date must be YYYY-MM or YYYY-MM-DD, got '2026-03x'"),
    ],
)
def test_hardware_bounds_one_line_naming_file_and_key(tmp_path: Path, key: str, value: str, expect: str) -> None:
    path = _hw_file(tmp_path, key, value)
    with pytest.raises(ConfigError, match=expect) as info:
        load_hardware_file(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_hardware_bounds_accept_edges_and_real_dates(tmp_path: Path) -> None:
    text = L4.read_text()
    for key, value in (("min_kernel_s", "1.0"), ("step_overhead_s", "10"), ("step_overhead_s", "0")):
        path = tmp_path / "ok.toml"
        path.write_text(_edit(text, key, value))
        hw = load_hardware_file(path)
        assert getattr(hw, key) == float(value)
    path.write_text(_edit(_edit(text, "date", '"2024-02-29"'), "usd_per_gpu_hour", "1000000"))
    hw = load_hardware_file(path)
    assert (hw.price_date, hw.price_usd_per_gpu_hour) == ("2024-02-29", 1e6)
    # every shipped entry still loads, and a written-back entry reads back
    assert load_hardware("l4").price_date == "2026-03"
    assert load_hardware_file(tmp_path / "ok.toml").name == "l4"
    (tmp_path / "back.toml").write_text(hardware_to_toml(load_hardware("h200")))
    assert load_hardware_file(tmp_path / "back.toml").min_kernel_s == load_hardware("h200").min_kernel_s


def test_replay_with_huge_min_kernel_is_one_line(tmp_path: Path) -> None:
    hw = _hw_file(tmp_path, "min_kernel_s", "1e300")
    result = invoke(["fit", "--model", "llama-3.1-8b", "--hardware", str(hw)])
    assert result.exit_code != 0
    line = one_error_line(result.stderr)
    assert "min_kernel_s must be in [0, 1] s" in line and str(hw) in line


# -- a path-named hardware is priced from the run's own snapshot -------------------------------


def test_cost_query_prices_a_path_named_hardware(tmp_path: Path, replayed_store: tuple[object, str]) -> None:
    from pipeline.ingest.store import Store
    from pipeline.publish.warehouse import build_warehouse, run_query

    store, run_id = replayed_store
    assert isinstance(store, Store)
    src = store.runs_dir / run_id
    new = Store(tmp_path / "store")
    dst = new.runs_dir / "path-run"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    base = load_hardware(cfg["resolved"]["fleet"]["hardware"])
    entry = tmp_path / "mygpu.toml"
    text = _edit(_edit(hardware_to_toml(base), "usd_per_gpu_hour", "7.25"), "name", '"mygpu"')
    entry.write_text(_edit(text, "date", '"2025-07"'))
    cfg["resolved"]["fleet"]["hardware"] = str(entry)
    cfg["resolved"]["catalog"]["hardware"] = entry.read_text()
    cfg["run_id"] = "path-run"
    (dst / "config.json").write_text(json.dumps(cfg))
    build_warehouse(new, warn=None)
    (row,) = run_query(new, "cost", {"run_id": "path-run"}).to_pylist()
    gpus = cfg["resolved"]["fleet"]["replicas"] * cfg["resolved"]["gpus_per_replica"]
    assert row["hardware"] == str(entry)
    assert row["gpus"] == gpus
    assert row["price_usd_per_gpu_hour"] == 7.25 and row["price_date"] == "2025-07"
    assert row["usd_per_day"] == pytest.approx(gpus * 7.25 * 24)
    # a run recorded without the snapshot falls back to the catalog entry of its name
    cfg["resolved"]["fleet"]["hardware"] = base.name
    del cfg["resolved"]["catalog"]["hardware"]
    (dst / "config.json").write_text(json.dumps(cfg))
    build_warehouse(new, warn=None)
    (row,) = run_query(new, "cost", {"run_id": "path-run"}).to_pylist()
    assert row["price_usd_per_gpu_hour"] == base.price_usd_per_gpu_hour
    assert row["usd_per_day"] == pytest.approx(gpus * base.price_usd_per_gpu_hour * 24)


def test_nightly_line_never_prints_a_made_up_zero() -> None:
    from pipeline.publish.nightly import NightlyResult

    res = NightlyResult(date="d", run_id="r", report=Path("r"), index=Path("i"), headline={"gpus": None})
    line = res.line()
    assert "n/a GPUs" in line and "$/day n/a (no price)" in line and "$0/day" not in line
    res = NightlyResult(
        date="d", run_id="r", report=Path("r"), index=Path("i"), headline={"gpus": 4, "usd_per_day": 456.7}
    )
    assert "4 GPUs, $457/day" in res.line()


# -- calibrate keeps tables, refuses impossible GEMM rows ---------------------------------

MEAS = Path("/work/shared/measurements/aiconfigurator-vllm-ops")


def _gemm_set(root: Path, latency: pl.Expr | None = None, rows: int = 1500) -> Path:
    src = MEAS / "h200_sxm" / "gemm" / "vllm" / "0.24.0"
    if not (src / "gemm_perf.parquet").is_file():
        pytest.skip("no AIConfigurator measurements here")
    base = pl.read_parquet(src / "gemm_perf.parquet").sample(rows, seed=1)
    if latency is not None:
        base = base.with_columns(latency.alias("latency"))
    d = root / "aiconfigurator-vllm-ops" / "h200_sxm" / "gemm" / "vllm" / "0.24.0"
    d.mkdir(parents=True)
    if (src / "collection_meta.yaml").is_file():
        shutil.copy(src / "collection_meta.yaml", d)
    base.write_parquet(d / "gemm_perf.parquet")
    return root


def test_impossibly_fast_gemms_are_left_out_and_said(tmp_path: Path) -> None:
    from pipeline.costmodel.profile.sources import ROOFLINE_MARGIN, read_measurements

    meas = read_measurements(_gemm_set(tmp_path / "tiny", pl.lit(1e-300)))
    assert "gemm" not in meas.frames
    (note,) = [s for s in meas.skipped if "physically impossible" in s]
    assert "1500 of 1500 GEMM row(s)" in note and "h200 datasheet roofline" in note
    # constant 1 µs: only the shapes whose ideal time exceeds 100 µs (1 µs / ROOFLINE_MARGIN) are left out
    meas = read_measurements(_gemm_set(tmp_path / "const", pl.lit(1e-3)))
    kept = meas.frames["gemm"]
    h200 = load_hardware("h200")
    flops = 2.0 * kept["m"].cast(pl.Float64) * kept["n"] * kept["k"]
    assert (flops / max(h200.peak_flops_per_s.values()) <= 1e-6 / ROOFLINE_MARGIN * (1 + 1e-9)).all()
    assert ROOFLINE_MARGIN == 0.01
    (note,) = [s for s in meas.skipped if "physically impossible" in s]
    n_out = int(note.split(":")[1].split(" of ")[0])
    assert 0 < n_out < 1500 and kept.height == 1500 - n_out
    # real measurements: nothing left out
    meas = read_measurements(_gemm_set(tmp_path / "real"))
    assert meas.frames["gemm"].height == 1500
    assert not [s for s in meas.skipped if "physically impossible" in s]


def test_absurdly_slow_rows_are_left_out(tmp_path: Path) -> None:
    from pipeline.costmodel.profile.sources import MAX_KERNEL_S, read_measurements

    assert MAX_KERNEL_S == 60.0
    meas = read_measurements(_gemm_set(tmp_path / "huge", pl.lit(61_000.0)))
    assert "gemm" not in meas.frames
    assert any("every row (1500) left out" in s and "(0, 60000] ms" in s for s in meas.skipped)


def test_calibrate_keeps_tables_the_new_measurements_do_not_cover(tmp_path: Path) -> None:
    from pipeline.costmodel.profile.build import build_profiles
    from pipeline.costmodel.profile.tables import load_profile_dir

    out = tmp_path / "prof"
    folder = out / "h200"
    folder.mkdir(parents=True)
    # a previous profile: its gemm table and a fake collectives table of 3 rows
    first = build_profiles(_gemm_set(tmp_path / "a", rows=1200), out, ["h200"])
    assert first[0].rows == {"gemm": first[0].rows["gemm"]}
    ar = pl.DataFrame(
        {
            "gpu": ["h200"] * 3,
            "set": ["aiconfigurator"] * 3,
            "source": ["x/allreduce.parquet"] * 3,
            "backend": ["nccl"] * 3,
            "gpus": [2, 2, 2],
            "bytes": [1024, 2048, 4096],
            "time_s": [1e-5, 2e-5, 3e-5],
        }
    )
    ar.write_parquet(folder / "allreduce.parquet")
    meta = (folder / "profile.toml").read_text()
    meta = meta.replace("[rows]\n", "[rows]\nallreduce = 3\n").replace(
        "[selection]\n", '[selection]\nallreduce = "old collectives"\n'
    )
    (folder / "profile.toml").write_text(meta)
    notes: list[str] = []
    built = build_profiles(_gemm_set(tmp_path / "b", rows=800), out, ["h200"], notes=notes)
    assert built[0].rows["allreduce"] == 3 and built[0].rows["gemm"] > 0
    assert (folder / "allreduce.parquet").is_file()
    assert pl.read_parquet(folder / "allreduce.parquet")["time_s"].to_list() == [1e-5, 2e-5, 3e-5]
    (note,) = [n for n in notes if "kept from the previous profile" in n]
    assert "allreduce (3 rows)" in note
    text = (folder / "profile.toml").read_text()
    assert 'allreduce = "old collectives"' in text and "kept from the previous profile" in text
    assert load_profile_dir(folder).meta.rows["allreduce"] == 3


# -- catalog show by path, import-hf head size -------------------------------------------------


def test_catalog_show_accepts_a_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(L4.read_text())
    result = invoke(["catalog", "show", str(path)])
    assert result.exit_code == 0, result.output
    assert "NVIDIA L4" in result.output and "[l4]" in result.output
    bad = _hw_file(tmp_path, "date", '"2026-99-77"', "bad.toml")
    result = invoke(["catalog", "show", str(bad)])
    assert result.exit_code == 1
    assert "date must be a real calendar date" in one_error_line(result.stderr)


def test_import_hf_refuses_a_hidden_size_heads_do_not_divide() -> None:
    cfg = {"hidden_size": 4097, "num_hidden_layers": 2, "num_attention_heads": 32, "vocab_size": 100,
           "intermediate_size": 1024}  # fmt: skip
    with pytest.raises(ConfigError, match="hidden_size 4097 is not divisible by num_attention_heads 32"):
        model_from_hf_config(cfg, "x")
    m = model_from_hf_config({**cfg, "head_dim": 128}, "x")
    assert m.head_dim == 128
    assert model_from_hf_config({**cfg, "hidden_size": 4096}, "x").head_dim == 128


def test_validate_of_a_gpu_the_folder_does_not_hold_names_what_it_holds(tmp_path: Path) -> None:
    """`validate --hardware h100-pcie` on an H200-only set: one line naming the GPUs it holds."""
    from click.testing import CliRunner

    from pipeline.cli import main

    root = _gemm_set(tmp_path / "m")
    res = CliRunner().invoke(
        main, ["validate", "--measurements", str(root), "--hardware", "h100-pcie", "--store", str(tmp_path / "s")]
    )
    assert res.exit_code == 1, res.output
    last = res.output.strip().splitlines()[-1]
    assert "--hardware h100-pcie: these measurements hold no rows of it (they hold h200)" in last
