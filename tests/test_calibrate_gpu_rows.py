"""Calibrate and validate by GPU: one GPU's rows are never fitted or judged as another's.

``calibrate`` / ``validate --hardware X`` relabelled every row of a table labelled with other
catalog GPUs as X and wrote (or reported) the pooled fit; rows whose label no catalog GPU has
are still taken as X, now with a note; a fit with every factor at a bound is a failed fit; CSV
messages echo at most a short value, name short rows and duplicate columns; ``--out`` is checked
before the work; a folder inside an AIConfigurator set, and ``--measurements /``, are one line.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cli_checks import invoke, one_error_line
from conftest import SHARED as SHARED_DATA
from test_measurements_hostile import _aic, _llmss

from pipeline.calibrate import validate as validate_mod
from pipeline.calibrate.measurements import calibrate
from pipeline.calibrate.validate import discover, label_hardware, run_validation
from pipeline.common.errors import RooftraceError

SHARED = SHARED_DATA / "measurements"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (public measurements) not present")

HEADER = "model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel"
#: Rows of splitwise-perf-model/perf_model.csv (columns as HEADER): Llama-2-70B on A100 and H100.
REAL_ROWS = """llama2-70b,a100-80gb,512,1,128,196.2532191537321,54.87951193752838,2
llama2-70b,a100-80gb,1024,1,128,373.4062194824219,55.40232658386231,2
llama2-70b,a100-80gb,2048,1,128,746.4473247528076,56.43157577514648,2
llama2-70b,h100-80gb,512,1,128,101.05524063110352,35.18418788909912,2
llama2-70b,h100-80gb,1024,1,128,188.4627342224121,35.573577880859375,2
llama2-70b,h100-80gb-pcap,512,1,128,104.4919490814209,36.78750991821289,2
"""
PROMPTS = (128, 256, 512, 1024, 2048, 4096)


def _roofline_rows(label: str, gpu: str, scale: float, *, ideal: bool = False) -> list[str]:
    """Splitwise rows of Llama-3.1-8B TP 1 labelled ``label``, timed by the roofline of ``gpu``
    (every factor at its best with ``ideal``) times ``scale``."""
    from pipeline.catalog import load_hardware, load_model
    from pipeline.costmodel.roofline import Deployment, decode_batch, prefill_batch

    hw = load_hardware(gpu)
    if ideal:
        hw = replace(hw, compute_efficiency=1.0, memory_efficiency=1.0, link_efficiency=1.0, step_overhead_s=0.0)
    dep = Deployment(load_model("llama-3.1-8b"), hw, weight_dtype="fp16", kv_dtype="fp16")
    p = np.array(PROMPTS, dtype=float)
    pre = dep.cost(prefill_batch(p)).time_s * 1e3 * scale
    dec = dep.cost(decode_batch(1.0, p + 64)).time_s * 1e3 * scale
    return [
        f"llama-3.1-8b,{label},{int(a)},1,128,{float(b)!r},{float(c)!r},1" for a, b, c in zip(p, pre, dec, strict=True)
    ]


def _table(path: Path, *parts: list[str] | str) -> Path:
    lines = [HEADER]
    for part in parts:
        lines += part.strip().splitlines() if isinstance(part, str) else part
    path.write_text("\n".join(lines) + "\n")
    return path


def _lines(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


def _calibrate(table: Path, hardware: str, out: Path, *extra: str):  # type: ignore[no-untyped-def]
    return invoke(["calibrate", "--measurements", str(table), "--hardware", hardware, "--out", str(out), *extra])


def _validate(table: Path, store: Path, *extra: str):  # type: ignore[no-untyped-def]
    return invoke(["validate", "--measurements", str(table), "--store", str(store), *extra])


# ----------------------------------------------------------------------------- H2: calibrate


@pytest.mark.parametrize("hardware", ["h200", "a100-40gb-sxm", "l4"])
def test_calibrate_refuses_a_gpu_the_table_has_no_rows_of(tmp_path: Path, hardware: str) -> None:
    table = _table(tmp_path / "perf_model.csv", REAL_ROWS)
    out = tmp_path / "fit.toml"
    res = _calibrate(table, hardware, out)
    assert res.exit_code == 1
    line = one_error_line(res.stderr)
    assert f"holds no rows of {hardware}, only of a100-80gb-sxm (labelled 'a100-80gb') and h100-sxm " in line
    assert "(labelled 'h100-80gb', 'h100-80gb-pcap')" in line
    assert "calibrate one of those (--hardware a100-80gb-sxm)" in line
    assert not out.exists()
    with pytest.raises(RooftraceError, match="holds no rows of"):
        calibrate(table, hardware)


def test_calibrate_a_gpu_the_table_has_uses_only_its_rows(tmp_path: Path) -> None:
    table = _table(tmp_path / "perf_model.csv", _roofline_rows("a100-80gb", "a100-80gb-sxm", 1.3),
                   _roofline_rows("h100-80gb", "h100-sxm", 1.3))  # fmt: skip
    res = _calibrate(table, "h100-sxm", tmp_path / "fit.toml", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["n_train"] + doc["n_holdout"] == 2 * len(PROMPTS)  # prefill + decode of the H100 rows only
    assert doc["notes"] == []
    assert any("rows for 'a100-80gb' (a100-80gb-sxm) are not used: calibrating h100-sxm" in s for s in doc["skipped"])
    assert doc["holdout_median_abs_error"] < 0.02


def test_a_label_that_is_a_catalog_name_is_that_gpu(tmp_path: Path) -> None:
    assert label_hardware("h100-sxm") == "h100-sxm" and label_hardware("a100") == "a100-80gb-sxm"
    assert label_hardware("my-gpu") is None and label_hardware("../h100-sxm") is None
    table = _table(tmp_path / "perf_model.csv", _roofline_rows("h100-sxm", "h100-sxm", 1.3))
    res = _calibrate(table, "h200", tmp_path / "fit.toml")
    assert "holds no rows of h200, only of h100-sxm (labelled 'h100-sxm')" in one_error_line(res.stderr)


@needs_shared
@pytest.mark.parametrize("measurements", ["splitwise-perf-model/perf_model.csv", "vidur-profiling"])
def test_calibrate_h200_on_the_public_sets_is_refused(tmp_path: Path, measurements: str) -> None:
    out = tmp_path / "h200.toml"
    res = _calibrate(SHARED / measurements, "h200", out)
    assert res.exit_code == 1
    line = one_error_line(res.stderr)
    assert "holds no rows of h200, only of a100-80gb-sxm" in line and "h100-sxm" in line
    assert not out.exists()


# ----------------------------------------------------------------------------- M6: unknown labels


def test_an_unknown_label_is_taken_as_hardware_with_a_note(tmp_path: Path) -> None:
    table = _table(tmp_path / "perf_model.csv", _roofline_rows("tpu-v5", "l40s", 1.3))
    res = _calibrate(table, "l40s", tmp_path / "fit.toml", "--json")
    assert res.exit_code == 0, res.stderr
    note = f"{table}: splitwise rows labelled 'tpu-v5' are taken as l40s (--hardware): no catalog GPU has that label"
    assert _lines(res.stderr, "note: ") == [f"note: {note}"]
    assert not any("tpu-v5" in line for line in _lines(res.stderr, "skipped: "))  # used, not skipped
    doc = json.loads(res.stdout)
    assert doc["notes"] == [note] and doc["skipped"] == []
    # validate says the same, as a note
    val = _validate(table, tmp_path / "s", "--hardware", "l40s")
    assert val.exit_code == 0, val.stderr
    assert _lines(val.stderr, "note: ") == [f"note: {note}"]
    assert run_validation(table, "l40s").notes == [note]


def test_unknown_labels_beside_known_gpus_are_left_out_and_said_so(tmp_path: Path) -> None:
    table = _table(tmp_path / "perf_model.csv", _roofline_rows("h100-80gb", "h100-sxm", 1.3),
                   _roofline_rows("my-gpu", "h100-sxm", 5.0))  # fmt: skip
    res = _calibrate(table, "h100-sxm", tmp_path / "fit.toml", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    said = [s for s in doc["skipped"] if "'my-gpu'" in s]
    assert len(said) == 1 and "pass --hardware" not in said[0]
    assert (
        "rows labelled 'my-gpu' are left out: no catalog GPU has that label and the measurements hold rows "
        in (said[0])
    )
    assert "known GPUs (h100-sxm)" in said[0]
    assert doc["n_train"] + doc["n_holdout"] == 2 * len(PROMPTS) and doc["holdout_median_abs_error"] < 0.02
    # without --hardware, validate does not suggest it either
    val = _validate(table, tmp_path / "s")
    assert val.exit_code == 0, val.stderr
    [line] = [x for x in _lines(val.stderr, "skipped: ") if "my-gpu" in x]
    assert "no catalog GPU has that label" in line and "known GPUs (h100-sxm)" in line
    assert "; pass --hardware" not in line


# ----------------------------------------------------------------------------- H3: validate


def test_validate_refuses_a_gpu_the_table_has_no_rows_of(tmp_path: Path) -> None:
    table = _table(tmp_path / "perf_model.csv", REAL_ROWS)
    store = tmp_path / "s"
    res = _validate(table, store, "--hardware", "l4")
    assert res.exit_code == 1
    line = one_error_line(res.stderr)
    assert "holds no rows of l4, only of a100-80gb-sxm" in line
    assert "validate one of those (--hardware a100-80gb-sxm) or all of them (no --hardware)" in line
    assert not (store / "validation" / "errors.parquet").exists()


def test_validate_one_gpu_leaves_the_others_out(tmp_path: Path) -> None:
    table = _table(tmp_path / "perf_model.csv", _roofline_rows("a100-80gb", "a100-80gb-sxm", 1.3),
                   _roofline_rows("h100-80gb", "h100-sxm", 1.3))  # fmt: skip
    rep = run_validation(table, "h100-sxm")
    assert set(rep.errors["hardware"].unique()) == {"h100-sxm"}
    assert set(rep.errors["hardware_label"].unique()) == {"h100-80gb"}
    assert [c.hardware for c in rep.calibrations] == ["h100-sxm"]
    assert (
        rep.skipped == [f"{table}: splitwise rows for 'a100-80gb' (a100-80gb-sxm) are not used: validating h100-sxm"]
        and rep.notes == []
    )


def test_a_fit_with_every_factor_at_a_bound_is_failed(tmp_path: Path) -> None:
    # rows faster than the GPU's roofline at its best: compute, memory and link pin at 1, overhead at 0
    table = _table(tmp_path / "perf_model.csv", _roofline_rows("tpu-v5", "l40s", 0.8, ideal=True))
    out = tmp_path / "fit.toml"
    res = _calibrate(table, "l40s", out)
    assert res.exit_code == 1
    line = one_error_line(res.stderr)
    assert "the splitwise fit for l40s failed: every factor sits at a bound of its range" in line
    assert "compute=1 (max)" in line and "overhead=" in line and "(min)" in line and "is not written" in line
    assert not out.exists()
    # validate marks it: the text, the JSON, and one warning line
    val = _validate(table, tmp_path / "s", "--hardware", "l40s")
    assert val.exit_code == 0, val.stderr
    assert "FIT FAILED: every factor at a bound" in val.stdout
    [warning] = _lines(val.stderr, "warning: ")
    assert "the splitwise fit for l40s failed" in warning
    doc = json.loads(_validate(table, tmp_path / "s2", "--hardware", "l40s", "--json").stdout)
    assert [c["fit_failed"] for c in doc["calibrations"]] == [True] and len(doc["failed_fits"]) == 1
    # a plausible table is not flagged
    ok = _table(tmp_path / "ok.csv", _roofline_rows("tpu-v5", "l40s", 1.3))
    assert [c.at_bounds for c in run_validation(ok, "l40s").calibrations] == [False]


@needs_shared
def test_the_public_sets_fits_are_not_flagged() -> None:
    rep = run_validation(SHARED / "splitwise-perf-model")
    assert rep.calibrations and not any(c.at_bounds for c in rep.calibrations)
    assert rep.notes == []


# ----------------------------------------------------------------------------- L5: CSV messages


def test_a_huge_cell_is_echoed_cut(tmp_path: Path) -> None:
    rows = _roofline_rows("tpu-v5", "l40s", 1.3)
    table = _table(tmp_path / "perf_model.csv", rows, [f"llama-3.1-8b,tpu-v5,{'9' * 5000},1,128,1.0,1.0,1"])
    res = _calibrate(table, "l40s", tmp_path / "fit.toml")
    assert res.exit_code == 0, res.stderr
    [line] = _lines(res.stderr, "skipped: ")
    assert "line 8: prompt_size = '99999" in line and "… is not a whole number" in line
    assert len(line) < 400


def test_a_short_row_is_named_by_its_field_count(tmp_path: Path) -> None:
    rows = _roofline_rows("tpu-v5", "l40s", 1.3)
    table = _table(tmp_path / "perf_model.csv", rows[:3], ["llama-3.1-8b,tpu-v5,512,1"], rows[3:])
    rep = run_validation(table, "l40s")
    assert rep.skipped == [f"{table}: 1 row(s) left out, the first at line 5: 4 fields where the header has 8"]
    assert rep.errors.height == 2 * 2 * len(PROMPTS)  # the six good rows, prefill and decode, two factor sets
    # an empty cell in a full row is named as such (not "None")
    empty = _table(tmp_path / "empty.csv", rows[:3], ["llama-3.1-8b,tpu-v5,,1,128,1.0,1.0,1"], rows[3:])
    [note] = run_validation(empty, "l40s").skipped
    assert "line 5: prompt_size = '' is not a whole number" in note and "None" not in note


def test_a_duplicate_header_column_is_refused(tmp_path: Path) -> None:
    rows = _roofline_rows("tpu-v5", "l40s", 1.3)
    table = tmp_path / "perf_model.csv"
    table.write_text("\n".join([HEADER + ",prompt_time", *(r + ",1.0" for r in rows)]) + "\n")
    for res in (_calibrate(table, "l40s", tmp_path / "fit.toml"), _validate(table, tmp_path / "s")):
        assert res.exit_code == 1
        assert one_error_line(res.stderr) == (
            f"error: {table}: the header names column 'prompt_time' twice (fields 6 and 9); which one holds "
            "the values is unclear: rename or remove one"
        )


def test_notes_are_not_repeated_in_one_message(tmp_path: Path) -> None:
    rows = [r.replace("llama-3.1-8b,", "gpt-9,") for r in _roofline_rows("a100-80gb", "l40s", 1.3)]
    table = _table(tmp_path / "perf_model.csv", rows, *([r[: r.rindex(",")] + f",{tp}" for r in rows] for tp in (2, 4)))
    for res in (_calibrate(table, "a100-80gb-sxm", tmp_path / "fit.toml"), _validate(table, tmp_path / "s")):
        line = one_error_line(res.stderr)
        assert line.count("model 'gpt-9' has no catalog entry") == 1, line


def test_a_header_only_table_says_so(tmp_path: Path) -> None:
    table = _table(tmp_path / "perf_model.csv")
    line = one_error_line(_calibrate(table, "a100-80gb-sxm", tmp_path / "fit.toml").stderr)
    assert line == f"error: {table}: no rows for a100-80gb-sxm: the measurements hold no data rows"
    line = one_error_line(_validate(table, tmp_path / "s").stderr)
    assert line == f"error: {table}: no rows rooftrace can model: the tables hold no data rows"


# ----------------------------------------------------------------------------- L6: --out first


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.calibrate.measurements
    import pipeline.costmodel.profile.build

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work started before --out was checked")

    monkeypatch.setattr(pipeline.costmodel.profile.build, "build_profiles", refuse)
    monkeypatch.setattr(pipeline.calibrate.measurements, "calibrate", refuse)


@pytest.mark.parametrize("out", ["file", "file/sub", "/dev/null"])
def test_profile_out_is_checked_before_the_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str) -> None:
    src = _aic(tmp_path / "m")
    (tmp_path / "file").write_text("keep")
    target = out if out.startswith("/") else str(tmp_path / out)
    _no_work(monkeypatch)
    res = invoke(["calibrate", "--measurements", str(src), "--out", target])
    assert res.exit_code == 1
    line = one_error_line(res.stderr)
    what = "it is a device" if out == "/dev/null" else ("it is a file" if out == "file" else f"{tmp_path / 'file'} is")
    assert f"error: {target}: cannot write the profiles there: {what}" in line
    assert (tmp_path / "file").read_text() == "keep"


def test_factor_out_is_checked_before_the_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _table(tmp_path / "perf_model.csv", _roofline_rows("tpu-v5", "l40s", 1.3))
    _no_work(monkeypatch)
    for out, said in ((tmp_path, "it is a folder"), (Path("/dev/null"), "it is a device")):
        line = one_error_line(_calibrate(table, "l40s", out).stderr)
        assert line.startswith(f"error: cannot write {out}: {said}"), line


# ----------------------------------------------------------------------------- L7: a piece of a set


def test_a_folder_inside_an_aiconfigurator_set_names_the_parent(tmp_path: Path) -> None:
    root = _aic(tmp_path / "m")
    gpu = root / "aiconfigurator-vllm-ops" / "h100_sxm"
    for folder in (gpu, gpu / "gemm"):
        for args in (["calibrate", "--out", str(tmp_path / "p")], ["calibrate", "--hardware", "h100-sxm"],
                     ["validate", "--store", str(tmp_path / "s")]):  # fmt: skip
            res = invoke([*args, "--measurements", str(folder)])
            assert res.exit_code == 1
            line = one_error_line(res.stderr)
            assert "a folder inside the aiconfigurator-vllm-ops set (GPU folder 'h100_sxm')" in line
            assert f"pass its parent folder (--measurements {root.resolve()}) and --hardware to pick one GPU" in line
    # the set itself, and its parent, are read as before
    assert invoke(["calibrate", "--measurements", str(root), "--out", str(tmp_path / "p2")]).exit_code == 0


def test_a_copied_gpu_folder_and_an_llmservingsim_bundle(tmp_path: Path) -> None:
    import shutil

    root = _aic(tmp_path / "m")
    copy = tmp_path / "just-h100"
    shutil.copytree(root / "aiconfigurator-vllm-ops" / "h100_sxm", copy)
    line = one_error_line(invoke(["validate", "--measurements", str(copy), "--store", str(tmp_path / "s")]).stderr)
    assert "looks like one GPU's folder of an AIConfigurator set" in line
    bundle = _llmss(tmp_path / "l") / "llmservingsim-profiles" / "RTXPRO6000"
    line = one_error_line(invoke(["calibrate", "--measurements", str(bundle), "--out", str(tmp_path / "p")]).stderr)
    assert "a folder inside the llmservingsim-profiles set (GPU folder 'RTXPRO6000')" in line


# ----------------------------------------------------------------------------- L8: bounded walk


def test_the_search_for_tables_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(60):
        (wide / f"f{i}.txt").write_text("")
    monkeypatch.setattr(validate_mod, "MAX_WALK_ENTRIES", 50)
    with pytest.raises(RooftraceError, match=r"more than 50 files and folders under it; not a folder of measurements"):
        discover(wide)
    res = invoke(["validate", "--measurements", str(wide), "--store", str(tmp_path / "s")])
    assert "more than 50 files and folders" in one_error_line(res.stderr)
    deep = tmp_path / "deep"
    (deep / "a" / "b" / "c" / "d").mkdir(parents=True)
    _table(deep / "a" / "perf_model.csv", REAL_ROWS)
    monkeypatch.setattr(validate_mod, "MAX_WALK_DEPTH", 3)
    res = _calibrate(deep, "a100-80gb-sxm", tmp_path / "fit.toml")
    assert "folders more than 3 deep under it" in one_error_line(res.stderr)
    monkeypatch.setattr(validate_mod, "MAX_WALK_DEPTH", 4)
    assert discover(deep) == [deep / "a" / "perf_model.csv"]


@needs_shared
def test_the_public_sets_are_within_the_walk_bounds() -> None:
    files = discover(SHARED)
    assert len(files) == 11 and all(f.name in {"mlp.csv", "all_reduce.csv", "perf_model.csv"} for f in files)
