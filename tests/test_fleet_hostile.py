"""Hostile FLEET.toml values and measurement tables: every fleet error is one line that starts with
the fleet file and names the key, its value and the allowed range, checked before the memory fit
(so a bad key is not reported as "does not fit"); nothing is accepted silently out of range, and
``calibrate`` reports the rows it leaves out as ``validate`` does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.common.errors import ConfigError
from pipeline.replay.fleet import load_fleet, resolve

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = (ROOT / "fleets" / "default.toml").read_text()


def _fleet(tmp_path: Path, top: str = "", engine: str = "", name: str = "hostile.toml") -> Path:
    """The default fleet with ``top`` keys added (or replacing ``tp``) and ``engine`` keys added."""
    text = DEFAULT
    if top:
        text = text.replace("tp = 1\n", "") if top.startswith("tp =") else text
        text = text.replace("[engine]\n", f"{top}\n\n[engine]\n")
    if engine:
        for line in engine.splitlines():  # a key the default sets is replaced, not repeated
            key = line.split("=")[0].strip()
            text = "\n".join(x for x in text.splitlines() if x.split("=")[0].strip() != key) + "\n"
        text += engine + "\n"
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(load_fleet(path), str(path))
    message = str(info.value)
    assert "\n" not in message
    return message


# --- 1. every fleet error starts with the file and names the key ---------------------------------


@pytest.mark.parametrize(
    ("top", "engine", "key", "wanted"),
    [
        ("", "block_size = 0", "block_size", "[1, 8, 16, 32, 64, 128, 256]"),
        ("", "max_model_len = 0", "max_model_len", "1..2,147,483,647"),
        ("tp = 3", "", "tp=3", "one of [1, 2, 4, 8]"),
        ("", f"max_num_seqs = {2**40}", "max_num_seqs", "1..16,777,216"),
        ("", "max_num_seqs = 0", "max_num_seqs", "1..16,777,216"),
        ("", "max_num_batched_tokens = 0", "max_num_batched_tokens", "1..16,777,216"),
    ],
)
def test_fleet_errors_start_with_the_file_and_name_the_key(
    tmp_path: Path, top: str, engine: str, key: str, wanted: str
) -> None:
    path = _fleet(tmp_path, top, engine)
    message = _error(path)
    assert message.startswith(str(path)), message
    assert key in message and wanted in message, message


def test_catalog_and_dtype_errors_name_the_fleet_key(tmp_path: Path) -> None:
    for old, new, key in (
        ('model = "llama-3.1-8b"', 'model = "nope"', "model: no model named 'nope'"),
        ('hardware = "h100-sxm"', 'hardware = "nope"', "hardware: no hardware named 'nope'"),
        ('weight_dtype = "bf16"', 'weight_dtype = "bf15"', "weight_dtype: unknown weight dtype 'bf15'"),
        ('kv_dtype = "bf16"', 'kv_dtype = "int3"', "kv_dtype: unknown KV-cache dtype 'int3'"),
    ):
        path = tmp_path / "catalog.toml"
        path.write_text(DEFAULT.replace(old, new))
        message = _error(path)
        assert message.startswith(f"{path}: {key}"), message


def test_scheduler_combinations_name_the_file_and_keys(tmp_path: Path) -> None:
    # max_num_seqs above vLLM's default token budget for the GPU (8192 on an H100)
    message = _error(_fleet(tmp_path, engine="max_num_seqs = 10000"))
    assert message.startswith(str(tmp_path / "hostile.toml") + " [engine]: max_num_seqs = 10,000 is more than")
    assert "max_num_batched_tokens = 8,192 (vLLM's default on h100-sxm)" in message
    message = _error(_fleet(tmp_path, engine="enable_chunked_prefill = false\nmax_num_batched_tokens = 8192"))
    assert "[engine]: max_num_batched_tokens = 8,192 is less than max_model_len = 16,384" in message


def test_replay_cli_prints_the_fleet_error_as_one_line(tmp_path: Path) -> None:
    path = _fleet(tmp_path, "tp = 3")
    res = CliRunner().invoke(main, ["replay", "--fleet", str(path), "--store", str(tmp_path / "store")])
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and "tp=3" in lines[0], res.stderr


# --- 2. each key's own range, before the memory fit ---------------------------------------------


@pytest.mark.parametrize(
    ("engine", "wanted"),
    [
        ("block_size = 100000000", "[engine]: block_size must be one of vLLM's block sizes"),
        ("block_size = 24", "[engine]: block_size must be one of vLLM's block sizes"),
        (f"max_num_batched_tokens = {2**63 - 1}", "[engine]: max_num_batched_tokens must be in 1..16,777,216"),
        ("num_gpu_blocks_override = 0", "[engine]: num_gpu_blocks_override must be in 1..2,147,483,647 blocks"),
    ],
)
def test_a_key_out_of_range_is_not_reported_as_not_fitting(tmp_path: Path, engine: str, wanted: str) -> None:
    message = _error(_fleet(tmp_path, engine=engine))
    assert wanted in message, message
    assert "cannot hold" not in message and "more GPUs" not in message, message


def test_a_batch_too_large_for_memory_names_the_batch_keys(tmp_path: Path) -> None:
    """In range but too large to fit: the profile run's activation is the cause, not the GPUs."""
    message = _error(_fleet(tmp_path, engine=f"max_num_batched_tokens = {2**24}"))
    assert message.startswith(f"{tmp_path / 'hostile.toml'} [engine]: max_num_batched_tokens = 16,777,216 is too large")
    assert "activation" in message and "vLLM's defaults for h100-sxm" in message, message
    assert "cannot hold" not in message and "more GPUs" not in message


def test_a_model_that_does_not_fit_says_where_the_memory_goes(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_text('name = "big"\nmodel = "llama-2-70b"\nhardware = "l4"\n')
    message = _error(path)
    assert message.startswith(f"{path}: llama-2-70b on 1x l4 cannot hold one 4096-token sequence")
    assert "weights 128.5 GiB" in message and "tp = 8 fits" in message, message  # the file's key


# --- 3. nothing accepted silently out of range --------------------------------------------------


def test_router_pod_size_is_bounded_and_zero_is_one_flat_router(tmp_path: Path) -> None:
    assert load_fleet(_fleet(tmp_path, "router_pod_size = 0")).router_pod_size == 0  # documented: flat
    for value in (-1, 2**31, 2**63 - 1):
        path = _fleet(tmp_path, f"router_pod_size = {value}")
        with pytest.raises(ConfigError) as info:
            load_fleet(path)
        message = str(info.value)
        assert message.startswith(f"{path}: router_pod_size must be >= 0") and "at most 2,147,483,647" in message
        assert f"got {value}" in message


def test_an_unknown_vllm_version_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    for version in ("99.0", "1.0", "2.3.1"):
        path = _fleet(tmp_path, engine=f'vllm_version = "{version}"')
        with pytest.raises(ConfigError) as info:
            load_fleet(path)
        message = str(info.value)
        assert message.startswith(f"{path} [engine]: vllm_version '{version}' is not a release"), message
        assert "0.8 <= vllm_version < 1.0" in message and "0.21" in message
    # the rule: a 0.x release newer than the last accounting change modelled takes that accounting
    newer = resolve(load_fleet(_fleet(tmp_path, engine='vllm_version = "0.30.0"')))
    at = resolve(load_fleet(_fleet(tmp_path, engine='vllm_version = "0.21.0"')))
    assert newer.scheduler.num_gpu_blocks == at.scheduler.num_gpu_blocks


def test_num_gpu_blocks_override_fits_the_engines_int32_block_numbers(tmp_path: Path) -> None:
    for value in (2**31, 2**63 - 1):
        message = _error(_fleet(tmp_path, engine=f"num_gpu_blocks_override = {value}"))
        assert "num_gpu_blocks_override must be in 1..2,147,483,647 blocks" in message and f"got {value}" in message
    top = resolve(load_fleet(_fleet(tmp_path, engine=f"num_gpu_blocks_override = {2**31 - 1}")))
    assert top.scheduler.num_gpu_blocks == 2**31 - 1


# --- 4. calibrate reports the rows it leaves out, as validate does --------------------------------


def _splitwise_with_bad_rows(path: Path) -> Path:
    """A user's Splitwise-format table: six good TP 1 rows, six TP 3 rows (32 heads: not a TP size)
    and two rows with a bad cell."""
    from pipeline.catalog import load_hardware, load_model
    from pipeline.costmodel.roofline import Deployment, decode_batch, prefill_batch

    dep = Deployment(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), weight_dtype="fp16", kv_dtype="fp16")
    prompts = np.array([128, 256, 512, 1024, 2048, 4096], dtype=float)
    pre = dep.cost(prefill_batch(prompts)).time_s * 1e3 * 1.3
    dec = dep.cost(decode_batch(1.0, prompts + 64)).time_s * 1e3 * 1.3
    lines = ["model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel"]
    for tp in (1, 3):
        lines += [
            f"llama-3.1-8b,my-h100,{int(p)},1,128,{a},{b},{tp}" for p, a, b in zip(prompts, pre, dec, strict=True)
        ]
    lines += ["llama-3.1-8b,my-h100,512,1,128,p,1.0,1", "llama-3.1-8b,my-h100,512,1,128,1.0,0,1"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _skipped_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("skipped: ")]


def test_calibrate_reports_left_out_and_skipped_rows_like_validate(tmp_path: Path) -> None:
    table = _splitwise_with_bad_rows(tmp_path / "perf_model.csv")
    runner = CliRunner()
    val = runner.invoke(
        main, ["validate", "--measurements", str(table), "--hardware", "h100-sxm", "--store", str(tmp_path / "s")]
    )
    assert val.exit_code == 0, val.output
    cal = runner.invoke(
        main,
        ["calibrate", "--measurements", str(table), "--hardware", "h100-sxm", "--out", str(tmp_path / "fit.toml")],
    )
    assert cal.exit_code == 0, cal.output
    wanted = _skipped_lines(val.stderr)
    assert any("2 row(s) left out, the first at line 14: prompt_time = 'p'" in line for line in wanted), val.stderr
    assert any("rows with TP 3 are skipped" in line for line in wanted), val.stderr
    assert _skipped_lines(cal.stderr) == wanted, cal.stderr
    as_json = runner.invoke(
        main,
        ["calibrate", "--measurements", str(table), "--hardware", "h100-sxm", "--out", str(tmp_path / "f2.toml"),
         "--json"],
    )  # fmt: skip
    assert as_json.exit_code == 0, as_json.output
    assert [f"skipped: {note}" for note in json.loads(as_json.stdout)["skipped"]] == wanted


def test_calibrate_refuses_to_fit_another_gpus_rows(tmp_path: Path) -> None:
    """Rows labelled with another catalog GPU are never taken as --hardware's (they were, with a
    note, before hostile round 7): one line naming the GPUs the table has, nothing written."""
    table = _splitwise_with_bad_rows(tmp_path / "perf_model.csv")
    table.write_text(table.read_text().replace("my-h100", "a100-80gb"))
    res = CliRunner().invoke(
        main,
        ["calibrate", "--measurements", str(table), "--hardware", "h100-sxm", "--out", str(tmp_path / "fit.toml")],
    )
    assert res.exit_code == 1, res.output
    assert f"error: {table}: holds no rows of h100-sxm, only of a100-80gb-sxm (labelled 'a100-80gb')" in res.stderr
    assert not (tmp_path / "fit.toml").exists()


def test_calibrate_profiles_report_what_validate_skips(tmp_path: Path) -> None:
    """The profile path (AIConfigurator sets) too: a GPU folder the catalog does not map is named."""
    from tests.test_measured_fleets import _tiny_aiconfigurator

    root = _tiny_aiconfigurator(tmp_path / "meas")
    (root / "aiconfigurator-vllm-ops" / "zz_gpu").mkdir()
    runner = CliRunner()
    val = runner.invoke(main, ["validate", "--measurements", str(root), "--store", str(tmp_path / "s")])
    assert val.exit_code == 0, val.output
    wanted = _skipped_lines(val.stderr)
    assert wanted == [
        f"skipped: {root / 'aiconfigurator-vllm-ops' / 'zz_gpu'}: GPU folder not mapped to a catalog entry"
    ]
    cal = runner.invoke(main, ["calibrate", "--measurements", str(root), "--out", str(tmp_path / "p"), "--json"])
    assert cal.exit_code == 0, cal.output
    assert _skipped_lines(cal.stderr) == wanted
    assert [f"skipped: {note}" for note in json.loads(cal.stdout)["skipped"]] == wanted


def test_a_context_past_the_models_maximum_is_refused(tmp_path: Path) -> None:
    """``fit --context 400000`` said a Llama-3.1-8B (131,072 tokens) "fits", and a fleet with
    max_model_len = 400000 replayed; vLLM refuses both. A plan on a fleet set for a longer model
    takes the planned model's maximum instead."""
    from dataclasses import replace

    from click.testing import CliRunner

    from pipeline.cli import main
    from pipeline.plan.stage import _with_model
    from pipeline.replay.fleet import load_fleet, resolve

    res = CliRunner().invoke(main, ["fit", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--context", "400000"])
    assert res.exit_code == 1 and "context 400,000 is longer than llama-3.1-8b's maximum (131,072 tokens" in res.stderr
    default = Path(__file__).resolve().parents[1] / "fleets" / "default.toml"
    long = tmp_path / "long.toml"
    long.write_text(default.read_text().replace("max_model_len = 16384", "max_model_len = 400000"))
    with pytest.raises(ConfigError, match=r"max_model_len = 400,000 is longer than llama-3\.1-8b's maximum context"):
        resolve(load_fleet(long), str(long))
    base = load_fleet(default)
    base = replace(base, engine=replace(base.engine, max_model_len=131072))
    assert _with_model(base, "llama-2-7b").engine.max_model_len == 4096
    assert _with_model(base, "llama-3.1-70b").engine.max_model_len == 131072
