"""Validation against measured GPUs (../shared/measurements) and calibration.

The error targets of issue 4 are asserted here on the HOLD-OUT split (alternate distinct shapes
never used by the fit); docs/validation.md records the full table.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import SHARED as SHARED_DATA

from pipeline.calibrate.measurements import calibrate
from pipeline.calibrate.validate import (
    GEMM_OPS,
    TARGET_MEDIAN_ABS_ERROR,
    VIDUR_OPS,
    Group,
    discover,
    fit_elementwise_kernels,
    load_groups,
    run_validation,
    weight_streaming_efficiency,
)
from pipeline.catalog import load_hardware, load_hardware_file, parse_hardware
from pipeline.cli import main
from pipeline.common.errors import RooftraceError
from pipeline.common.schemas import read_parquet
from pipeline.costmodel.roofline import ELEMENTWISE_KERNEL_SCALE

SHARED = SHARED_DATA / "measurements"
ELEMENTWISE_OPS = frozenset(VIDUR_OPS) - GEMM_OPS
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (public measurements) not present")


@pytest.fixture(scope="module")
def report():  # type: ignore[no-untyped-def]
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} (public measurements) not present")
    return run_validation(SHARED)


def _stat(summary: pl.DataFrame, **where: str) -> float:
    rows = summary
    for key, value in where.items():
        rows = rows.filter(pl.col(key) == value)
    assert rows.height == 1, where
    return float(rows["median_abs_error"][0])


@needs_shared
@pytest.mark.parametrize("hw", ["a100-80gb-sxm", "h100-sxm"])
def test_vidur_gemm_target_on_holdout(report, hw: str) -> None:  # type: ignore[no-untyped-def]
    s = report.summary
    for params in ("calibrated", "catalog"):
        err = _stat(s, set="vidur_mlp", hardware=hw, parameters=params, split="holdout", subset="gemm, tokens>=128")
        assert err <= TARGET_MEDIAN_ABS_ERROR, (hw, params, err)


#: Hold-out median absolute errors recorded in docs/validation.md (Vidur operators, >= 128 tokens),
#: per (hardware, factors, subset). Before the per-kernel elementwise scales, H100 all-operator
#: was 16.7 % (calibrated) and its elementwise kernels 23.1 %.
RECORDED_VIDUR = {
    ("a100-80gb-sxm", "calibrated", "all ops, tokens>=128"): 0.062,
    ("a100-80gb-sxm", "catalog", "all ops, tokens>=128"): 0.062,
    ("h100-sxm", "calibrated", "all ops, tokens>=128"): 0.103,
    ("h100-sxm", "catalog", "all ops, tokens>=128"): 0.107,
    ("a100-80gb-sxm", "calibrated", "elementwise, tokens>=128"): 0.059,
    ("h100-sxm", "calibrated", "elementwise, tokens>=128"): 0.092,
}


@needs_shared
@pytest.mark.parametrize(("hw", "params", "subset"), sorted(RECORDED_VIDUR))
def test_vidur_all_ops_target_on_holdout(report, hw: str, params: str, subset: str) -> None:  # type: ignore[no-untyped-def]
    err = _stat(report.summary, set="vidur_mlp", hardware=hw, parameters=params, split="holdout", subset=subset)
    assert err <= TARGET_MEDIAN_ABS_ERROR, (hw, params, subset, err)
    assert err == pytest.approx(RECORDED_VIDUR[(hw, params, subset)], abs=0.005)


@needs_shared
def test_elementwise_kernel_scales_are_reproducible() -> None:
    """The shipped kernel scales and elementwise factors are what the train-split fits give, and
    the two GPUs agree on each class's scale (it describes the kernel, not the chip)."""
    groups: list[Group] = []
    for sku in ("a100", "h100"):
        groups += load_groups(discover(SHARED / "vidur-profiling" / "compute" / sku))[0]
    fit = fit_elementwise_kernels(groups)
    assert set(fit.per_hardware) == {"a100-80gb-sxm", "h100-sxm"}
    for kernel, scale in fit.scales.items():
        assert ELEMENTWISE_KERNEL_SCALE[kernel] == pytest.approx(scale, abs=0.002), kernel
        ratios = [v[kernel] / v["act"] for v in fit.per_hardware.values()]
        assert max(ratios) / min(ratios) < 1.1, (kernel, ratios)
    # the spread the scales exist for: norm well below the activation, the vectorised add near 2x
    assert fit.scales["norm"] < 0.8 < fit.scales["rotary"] < 1.0 < 1.5 < fit.scales["add"]
    # fitted on the train split only: elementwise rows at alternate token counts
    train = sum(
        int((~g.holdout & np.isin(np.array(g.item), list(ELEMENTWISE_OPS))).sum())
        for g in groups
        if g.hardware.name == "h100-sxm"
    )
    assert fit.n_train["h100-sxm"] == train


@needs_shared
@pytest.mark.parametrize("hw", ["a100-80gb-sxm", "h100-sxm"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_splitwise_target_on_holdout(report, hw: str, phase: str) -> None:  # type: ignore[no-untyped-def]
    for split in ("holdout", "all"):  # the train split alone is recorded in docs/validation.md
        err = _stat(report.summary, set="splitwise", hardware=hw, parameters="calibrated", split=split, subset=phase)
        assert err <= TARGET_MEDIAN_ABS_ERROR, (hw, phase, split, err)


@needs_shared
def test_all_reduce_fit_and_catalog(report) -> None:  # type: ignore[no-untyped-def]
    for hw in ("a100-80gb-sxm", "h100-sxm"):
        for params in ("calibrated", "catalog"):
            sel = {"set": "vidur_all_reduce", "hardware": hw, "parameters": params, "split": "holdout"}
            err = _stat(report.summary, subset="all", **sel)
            assert err <= 0.10, (hw, params, err)


@needs_shared
def test_catalog_factors_are_reproducible() -> None:
    """The shipped memory factor is the weight-streaming median of the Vidur train rows."""
    for sku, name in (("a100", "a100-80gb-sxm"), ("h100", "h100-sxm")):
        groups, _ = load_groups(discover(SHARED / "vidur-profiling" / "compute" / sku))
        eff, n = weight_streaming_efficiency(groups)
        assert n > 50
        assert load_hardware(name).memory_efficiency == pytest.approx(eff, abs=0.002)


@needs_shared
def test_catalog_elementwise_is_the_vidur_fit(report) -> None:  # type: ignore[no-untyped-def]
    """The shipped compute / elementwise / min_kernel_s are the Vidur train-split fit."""
    for cal in report.calibrations:
        if cal.kind == "vidur_mlp":
            hw = load_hardware(cal.hardware)
            assert hw.compute_efficiency == pytest.approx(cal.params["compute"], abs=0.001)
            assert hw.elementwise_efficiency == pytest.approx(cal.params["elementwise"], abs=0.001)
            assert hw.min_kernel_s == pytest.approx(cal.params["min_kernel"], abs=1e-7)


@needs_shared
def test_fitted_rows_and_holdout_are_disjoint(report) -> None:  # type: ignore[no-untyped-def]
    for cal in report.calibrations:
        assert cal.n_train > 0 and cal.n_holdout > 0
    e = report.errors
    keys = (
        e.filter(pl.col("set") == "vidur_mlp").group_by(["source_file", "tp", "tokens"]).agg(pl.col("split").n_unique())
    )
    assert (keys["split"] == 1).all()  # a token count is either fitted or held out, never both


@needs_shared
def test_calibrate_writes_a_loadable_toml(tmp_path: Path) -> None:
    result = calibrate(SHARED / "splitwise-perf-model" / "perf_model.csv", "h100-sxm", name="h100-splitwise")
    assert result.holdout_median_abs_error <= TARGET_MEDIAN_ABS_ERROR
    assert result.holdout_median_abs_error < result.before_median_abs_error
    doc = tomllib.loads(result.toml)
    hw = parse_hardware(doc, "calibrated")
    assert hw.name == "h100-splitwise" and "splitwise" in hw.calibrated_on
    assert set(result.calibration.params) == {"compute", "memory", "link", "overhead"}
    out = tmp_path / "h100-splitwise.toml"
    cli = CliRunner().invoke(
        main,
        ["calibrate", "--measurements", str(SHARED / "vidur-profiling/network/h100_dgx/all_reduce.csv"),
         "--hardware", "h100-sxm", "--out", str(out), "--json"],
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    doc = json.loads(cli.stdout)
    assert set(doc["fitted"]) == {"link", "latency"}
    assert load_hardware_file(out).link_efficiency == pytest.approx(doc["fitted"]["link"])


def test_user_table_in_splitwise_format(tmp_path: Path) -> None:
    """A user's own perf table: predictions match a hand-made 'measurement' made by the model itself."""
    from pipeline.catalog import load_model
    from pipeline.costmodel.roofline import Deployment, decode_batch, prefill_batch

    dep = Deployment(load_model("llama-3.1-8b"), load_hardware("l40s"), weight_dtype="fp16", kv_dtype="fp16")
    prompts = np.array([128, 256, 512, 1024, 2048, 4096], dtype=float)
    pre = dep.cost(prefill_batch(prompts)).time_s * 1e3 * 1.3  # a stack 30% slower than the roofline
    dec = dep.cost(decode_batch(1.0, prompts + 64)).time_s * 1e3 * 1.3
    lines = ["model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel"]
    lines += [f"llama-3.1-8b,my-l40s,{int(p)},1,128,{a},{b},1" for p, a, b in zip(prompts, pre, dec, strict=True)]
    path = tmp_path / "perf_model.csv"
    path.write_text("\n".join(lines) + "\n")
    rep = run_validation(path, hardware="l40s")
    cat = rep.errors.filter(pl.col("parameters") == "catalog")
    np.testing.assert_allclose(cat["error"].to_numpy(), 1 / 1.3 - 1, rtol=1e-9)
    fitted = rep.errors.filter(pl.col("parameters") == "calibrated")
    assert fitted["error"].abs().median() < 0.02  # the fit recovers the slowdown


def test_bad_measurements_are_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "perf_model.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(RooftraceError, match=r"not a Vidur mlp\.csv"):
        run_validation(bad)
    with pytest.raises(RooftraceError, match="no such file or folder"):
        run_validation(tmp_path / "missing")


@needs_shared
def test_validate_cli_stores_tables(tmp_path: Path) -> None:
    store = tmp_path / "store"
    r = CliRunner().invoke(
        main,
        ["validate", "--measurements", str(SHARED / "splitwise-perf-model"), "--store", str(store), "--json"],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert any(row["set"] == "splitwise" for row in doc["summary"])
    errors = read_parquet(store / "validation" / "errors.parquet", "validation_errors")
    assert errors.num_rows > 0
    read_parquet(store / "validation" / "summary.parquet", "validation_summary")


def test_catalog_and_fit_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["catalog", "list", "--json"])
    assert r.exit_code == 0 and "h100-sxm" in {h["name"] for h in json.loads(r.stdout)["hardware"]}
    r = runner.invoke(main, ["catalog", "show", "h200", "--json"])
    assert json.loads(r.stdout)["memory_bytes"] == 141 * 2**30
    r = runner.invoke(main, ["catalog", "show", "nope"])
    assert r.exit_code == 1 and "no hardware or model named 'nope'" in r.output
    r = runner.invoke(main, ["fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--context", "8192", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["fits"] is True
    r = runner.invoke(main, ["fit", "--model", "llama-3.1-405b", "--hardware", "h100-sxm", "--tp", "8"])
    assert r.exit_code == 1 and "DOES NOT FIT" in r.output and "--weight-dtype" in r.output
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "vocab_size": 100, "intermediate_size": 128}))  # fmt: skip
    r = runner.invoke(main, ["catalog", "import-hf", str(cfg), "--name", "tiny"])
    assert r.exit_code == 0 and 'name = "tiny"' in r.output


def test_a_row_polars_cannot_read_is_left_out_not_the_whole_table(tmp_path: Path) -> None:
    """A row with extra fields, or a byte that is not UTF-8, stopped the whole run ("found more
    fields than defined in 'Schema'", no line); such rows are left out and said, with the first
    one's line, and the rest is validated as before."""
    from pipeline.catalog import load_model
    from pipeline.costmodel.roofline import Deployment, decode_batch, prefill_batch

    dep = Deployment(load_model("llama-3.1-8b"), load_hardware("l40s"), weight_dtype="fp16", kv_dtype="fp16")
    prompts = np.array([128, 256, 512, 1024, 2048, 4096], dtype=float)
    pre = dep.cost(prefill_batch(prompts)).time_s * 1e3
    dec = dep.cost(decode_batch(1.0, prompts + 64)).time_s * 1e3
    head = "model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel"
    good = [f"llama-3.1-8b,my-l40s,{int(p)},1,128,{a},{b},1" for p, a, b in zip(prompts, pre, dec, strict=True)]
    clean = tmp_path / "clean" / "perf_model.csv"
    clean.parent.mkdir()
    clean.write_text("\n".join([head, *good]) + "\n")
    dirty = tmp_path / "dirty" / "perf_model.csv"
    dirty.parent.mkdir()
    body = [head, *good[:3], good[3] + ",extra,extra", *good[4:]]
    dirty.write_bytes(("\n".join(body) + "\n").encode() + b"llama-3.1-8b,my-l40s,64,1,128,1.0,\xe9,1\n")
    want = run_validation(clean, hardware="l40s").errors
    got = run_validation(dirty, hardware="l40s")
    assert got.skipped == [f"{dirty}: 2 row(s) left out, the first at line 5: 10 fields where the header has 8"]
    assert 0 < got.errors.height < want.height  # the other five prompt sizes validated


def test_a_named_pipe_among_measurements_is_named(tmp_path: Path) -> None:
    """A named pipe called mlp.csv hung validate; then it was refused but the CLI reported "no
    operator measurements" (and dropped the real tables beside it). It is one line naming it."""
    import os

    (tmp_path / "m").mkdir()
    os.mkfifo(tmp_path / "m" / "mlp.csv")
    res = CliRunner().invoke(main, ["validate", "--measurements", str(tmp_path / "m"), "--store", str(tmp_path / "s")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"{tmp_path / 'm' / 'mlp.csv'}: a named pipe (FIFO), not a regular file" in res.stderr


def _user_table(tmp_path: Path, scale: float, prompts: list[int], name: str = "perf_model.csv") -> Path:
    """A Splitwise-format table made by the roofline itself, times multiplied by ``scale``."""
    from pipeline.catalog import load_model
    from pipeline.costmodel.roofline import Deployment, decode_batch, prefill_batch

    dep = Deployment(load_model("llama-3.1-8b"), load_hardware("l40s"), weight_dtype="fp16", kv_dtype="fp16")
    p = np.array(prompts, dtype=float)
    pre = dep.cost(prefill_batch(p)).time_s * 1e3 * scale
    dec = dep.cost(decode_batch(1.0, p + 64)).time_s * 1e3 * scale
    lines = ["model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel"]
    lines += [
        f"llama-3.1-8b,my-l40s,{int(a)},1,128,{float(b)!r},{float(c)!r},1" for a, b, c in zip(p, pre, dec, strict=True)
    ]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("scale", "prompts", "said"),
    [
        (1.3, [512] * 50, "too few distinct splitwise shapes"),  # one row repeated: nothing held out
        (1000.0, [128, 256, 512, 1024, 2048, 4096], "misses the held-out rows by"),  # seconds taken as ms
        (1e304, [128, 256, 512, 1024, 2048, 4096], "is not a time in [1e-06, 1e+08]"),
        (1e-303, [128, 256, 512, 1024, 2048, 4096], "is not a time in [1e-06, 1e+08]"),
    ],
)
def test_calibrate_refuses_tables_it_cannot_fit_or_judge(
    tmp_path: Path, scale: float, prompts: list[int], said: str
) -> None:
    """A table of one repeated row fitted 4 factors with nothing held out and wrote `nan%`; times
    of 1e308 or 1e-300 wrote a calibration pinned at its bounds, or printed 300-digit errors."""
    path = _user_table(tmp_path, scale, prompts)
    out = tmp_path / "cal.toml"
    res = CliRunner().invoke(main, ["calibrate", "--measurements", str(path), "--hardware", "l40s", "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert said in res.stderr and "Traceback" not in res.output
    assert not out.exists()
    assert len(max(res.stderr.splitlines(), key=len)) < 400  # no figure hundreds of digits long


def test_calibrate_writes_a_fit_of_a_plausible_table(tmp_path: Path) -> None:
    path = _user_table(tmp_path, 1.3, [128, 256, 512, 1024, 2048, 4096])
    out = tmp_path / "cal.toml"
    res = CliRunner().invoke(
        main, ["calibrate", "--measurements", str(path), "--hardware", "l40s", "--out", str(out), "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["holdout_median_abs_error"] < 0.02 and out.exists()
