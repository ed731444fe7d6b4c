"""Catalog and config file bounds: a device or a file past 16 MiB given as a config
(it was read whole: /dev/zero took all memory), hardware numbers outside any real accelerator's
range (1e-300 B/s divided by zero in plan, 1e308 bytes printed 300-digit capacities), string
booleans in a model entry read as true, max_position_embeddings and vocab_size of 0, a price
table's native TOML date, and duplicate keys in a Hugging Face config.json."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import threading
import tomllib
import tracemalloc
from pathlib import Path

import pytest
from cli_checks import cli, invoke, one_error, one_error_line

from pipeline.catalog import hardware_to_toml, load_hardware, load_model_file
from pipeline.catalog.entries import MAX_GPUS_PER_NODE, import_hf_config, list_hardware, parse_hardware
from pipeline.common.errors import ConfigError
from pipeline.common.tomlfile import MAX_CONFIG_BYTES, read_toml
from pipeline.economics.cost import load_price_file

CATALOG = Path(__file__).resolve().parents[1] / "pipeline" / "catalog"
H100 = (CATALOG / "hardware" / "h100-sxm.toml").read_text()
LLAMA = (CATALOG / "models" / "llama-3.1-8b.toml").read_text()
TINY_HF = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}


def _edit(text: str, key: str, value: str) -> str:
    """``text`` with the first ``key = ...`` line's value replaced by ``value`` (TOML source)."""
    out, n = re.subn(rf"^{re.escape(key)} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
    assert n == 1, key
    return out


def _fails(args: list[str]) -> str:
    result = invoke(args)
    assert result.exit_code == 1, result.output
    return one_error_line(result.stderr)


# -- H1: devices and oversized files are refused without reading them whole ------------------------


@pytest.fixture
def zero(tmp_path: Path) -> Path:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    return tmp_path


@pytest.mark.parametrize("option", ["--hardware", "--model"])
def test_catalog_entry_linked_to_dev_zero_is_one_line(zero: Path, option: str) -> None:
    link = zero / "z.toml"
    link.symlink_to("/dev/zero")
    other = {"--hardware": ["--model", "llama-3.1-8b"], "--model": ["--hardware", "h100-sxm"]}[option]
    line = _fails(["fit", *other, option, str(link)])
    assert line == f"error: {link}: catalog entry is a device, not a regular file"


@pytest.mark.parametrize("linked", [True, False])
def test_import_hf_of_a_device_is_one_line(zero: Path, linked: bool) -> None:
    path = zero / "config.json" if linked else Path("/dev/zero")
    if linked:
        path.symlink_to("/dev/zero")
    line = _fails(["catalog", "import-hf", str(path), "--name", "x"])
    assert line == f"error: {path}: config file is a device, not a regular file"


def test_sparse_file_past_the_cap_is_refused(tmp_path: Path) -> None:
    """A 20 MiB file (sparse: no disk used) is refused from its size, as a model, a hardware entry,
    a fleet and a config.json."""
    big = tmp_path / "big.toml"
    with big.open("wb") as fh:
        os.truncate(fh.fileno(), 20 * 2**20)
    says = "is larger than 16 MiB; not a config file"
    assert _fails(["fit", "--model", str(big), "--hardware", "h100-sxm"]) == f"error: {big}: catalog entry {says}"
    assert _fails(["fit", "--model", "llama-3.1-8b", "--hardware", str(big)]).endswith(says)
    line = _fails(["plan", "--model", "llama-3.1-8b", "--store", str(tmp_path), "--fleet", str(big)])
    assert line == f"error: {big}: fleet file {says}"
    big_json = big.rename(tmp_path / "config.json")
    assert _fails(["catalog", "import-hf", str(big_json), "--name", "x"]) == f"error: {big_json}: config file {says}"


def test_the_cap_is_exact(tmp_path: Path) -> None:
    """A TOML of exactly MAX_CONFIG_BYTES reads; one byte more is refused."""
    path = tmp_path / "edge.toml"
    body = b"a = 1\n# " + b"x" * (MAX_CONFIG_BYTES - 9) + b"\n"
    path.write_bytes(body)
    assert len(body) == MAX_CONFIG_BYTES
    assert read_toml(path) == {"a": 1}
    path.write_bytes(body + b"\n")
    with pytest.raises(ConfigError, match=r"edge\.toml: TOML file is larger than 16 MiB; not a config file$"):
        read_toml(path)


def test_a_pipe_is_read_up_to_the_cap_only(tmp_path: Path) -> None:
    """A pipe pouring 40 MiB (``--fleet <(yes)``) is cut at 16 MiB + 1 byte and refused; memory
    stays near the cap (it was read to its end, and an endless one took all memory)."""
    r, w = os.pipe()
    written = [0]

    def pour() -> None:
        chunk = b"y\n" * 32768
        try:
            while written[0] < 40 * 2**20:
                written[0] += os.write(w, chunk)
        except BrokenPipeError:
            pass
        finally:
            os.close(w)

    writer = threading.Thread(target=pour, daemon=True)
    writer.start()
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"fleet file is larger than 16 MiB; not a config file"):
            read_toml(f"/dev/fd/{r}", "fleet file")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        os.close(r)  # the writer, blocked on a full pipe, gets EPIPE and ends
        writer.join(timeout=30)
    assert not writer.is_alive()
    assert written[0] < 40 * 2**20  # the read stopped before the writer finished
    assert peak < 3 * MAX_CONFIG_BYTES


# -- M1/M2: hardware numbers are bounded to what an accelerator can be ----------------------------


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("memory_bandwidth_bytes_per_s", "1e-300", "memory_bandwidth_bytes_per_s must be in [1e+09, 1e+15] B/s"),
        ("memory_bandwidth_bytes_per_s", "2e15", "memory_bandwidth_bytes_per_s must be in [1e+09, 1e+15] B/s"),
        ("bf16", "1e-300", "[peak_flops_per_s]: bf16 must be in [1e+11, 1e+18] FLOP/s, got 1e-300"),
        ("fp8", "1e19", "[peak_flops_per_s]: fp8 must be in [1e+11, 1e+18] FLOP/s, got 1e+19"),
        ("memory_bytes", "1e308", "memory_bytes must be in [1 GiB, 16 TiB]"),
        ("memory_bytes", str(10**30), "memory_bytes must be in [1 GiB, 16 TiB]"),
        ("memory_bytes", "1" + "0" * 400, "memory_bytes is an integer too large to use (401 digits)"),
        ("memory_bytes", str(2**30 - 1), "memory_bytes must be in [1 GiB, 16 TiB]"),
        ("memory_bytes", "85899345920.5", "memory_bytes must be a whole number of bytes, got 85899345920.5"),
        ("bandwidth_bytes_per_s", "1e7", "[link]: bandwidth_bytes_per_s must be in [1e+08, 1e+14] B/s, got 1e+07"),
        ("bandwidth_bytes_per_s", "1e15", "[link]: bandwidth_bytes_per_s must be in [1e+08, 1e+14] B/s"),
        ("latency_s", "5", "[link]: latency_s must be in [0, 0.01] s, got 5"),
        ("latency_s", "-1e-6", "[link]: latency_s must be >= 0"),
    ],
)
def test_hardware_numbers_out_of_range(tmp_path: Path, key: str, value: str, says: str) -> None:
    path = tmp_path / "hw.toml"
    path.write_text(_edit(H100, key, value))
    line = _fails(["fit", "--model", "llama-3.1-8b", "--hardware", str(path)])
    assert line.startswith(f"error: {path}") and says in line, line


def test_cuda_memory_above_memory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hw.toml"
    text = _edit(H100, "memory_bytes", str(80 * 2**30)).replace(
        "\n[peak_flops_per_s]\n", f"\ncuda_memory_bytes = {81 * 2**30}\n\n[peak_flops_per_s]\n", 1
    )
    path.write_text(text.replace("\n[sources]\n", '\n[sources]\ncuda_memory_bytes = "a log"\n', 1))
    line = _fails(["fit", "--model", "llama-3.1-8b", "--hardware", str(path)])
    assert f"{path}: cuda_memory_bytes must not exceed memory_bytes (85899345920)" in line


def test_hardware_bounds_hold_real_accelerators(tmp_path: Path) -> None:
    """Every shipped entry loads; so do B200-class numbers at the edges (16 TiB of memory, 8e12 B/s
    of HBM3e, a 1e16 FP4 peak), 8e10 written as a float, and a native TOML price date."""
    assert all(load_hardware(name).memory_bytes >= 2**30 for name in list_hardware())
    text = _edit(H100, "memory_bandwidth_bytes_per_s", "8e12")
    text = _edit(text, "memory_bytes", str(16 * 2**40))
    text = _edit(text, "date", "2025-01-15")
    text = text.replace("int8 = ", "fp4 = 1e16\nint8 = ", 1)
    path = tmp_path / "edge.toml"
    path.write_text(text)
    hw = parse_hardware(read_toml(path), str(path))
    assert (hw.memory_bytes, hw.memory_bandwidth_bytes_per_s) == (16 * 2**40, 8e12)
    assert hw.peak_flops_per_s["fp4"] == 1e16 and hw.price_date == "2025-01-15"
    # written back (calibrate does) and read again: a memory past 1e12 bytes stays a whole number
    again = parse_hardware(tomllib.loads(hardware_to_toml(hw)), str(path))
    assert again == hw and isinstance(tomllib.loads(hardware_to_toml(hw))["memory_bytes"], int)
    path.write_text(_edit(H100, "memory_bytes", "8e10"))
    assert parse_hardware(read_toml(path), "f").memory_bytes == 8e10


def test_a_fit_on_bounded_hardware_prints_plain_numbers(tmp_path: Path) -> None:
    """The largest memory allowed still gives a capacity a person can read (1e308 printed 300 digits)."""
    h100 = load_hardware("h100-sxm")
    path = tmp_path / "huge.toml"
    path.write_text(hardware_to_toml(dataclasses.replace(h100, memory_bytes=float(16 * 2**40))))
    result = invoke(["fit", "--model", "llama-3.1-8b", "--hardware", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert all(len(n) < 20 for n in re.findall(r"\d+", result.stdout))


# -- M3: booleans in a model entry or config.json are true or false, not strings ------------------


@pytest.mark.parametrize(
    "key, value, shown",
    [
        ("tie_word_embeddings", '"false"', "'false'"),
        ("attention_bias", '"true"', "'true'"),
        ("tie_word_embeddings", "0", "0"),
    ],
)
def test_model_entry_string_booleans_are_refused(tmp_path: Path, key: str, value: str, shown: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(_edit(LLAMA, key, value))
    line = _fails(["fit", "--model", str(path), "--hardware", "h100-sxm"])
    assert line == f"error: {path} [config]: {key} must be true or false, got {shown}"


def test_use_sliding_window_must_be_a_boolean(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(LLAMA.replace("\n[config]\n", '\n[config]\nuse_sliding_window = "no"\nsliding_window = 4096\n', 1))
    line = _fails(["fit", "--model", str(path), "--hardware", "h100-sxm"])
    assert line.endswith("use_sliding_window must be true or false, got 'no'") and str(path) in line


def test_real_booleans_still_count_the_lm_head(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    untied = load_model_file(_write(path, _edit(LLAMA, "tie_word_embeddings", "false")))
    tied = load_model_file(_write(path, _edit(LLAMA, "tie_word_embeddings", "true")))
    assert untied.lm_head_params() == untied.vocab_size * untied.hidden_size > 0
    assert tied.lm_head_params() == 0


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_import_hf_string_boolean_is_refused_and_not_written(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(TINY_HF, intermediate_size=128, tie_word_embeddings="false")))
    out = tmp_path / "m.toml"
    line = _fails(["catalog", "import-hf", str(cfg), "--hf-id", "org/m", "--name", "m", "--out", str(out)])
    assert line == f"error: {cfg}: model 'm' config: tie_word_embeddings must be true or false, got 'false'"
    assert not out.exists()
    cfg.write_text(json.dumps(dict(TINY_HF, intermediate_size=128, tie_word_embeddings=None)))
    assert import_hf_config(cfg, name="m")[0].tie_word_embeddings is False  # JSON null: the default


# -- L3 / L10: integer fields where 0 means nothing ----------------------------------------------


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("max_position_embeddings", "0", "max_position_embeddings must be >= 1 when given, got 0"),
        ("max_position_embeddings", "-5", "max_position_embeddings must be a non-negative integer, got -5"),
        ("vocab_size", "0", "vocab_size must be >= 1, got 0"),
    ],
)
def test_model_sizes_of_zero_name_the_file_and_field(tmp_path: Path, key: str, value: str, says: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(_edit(LLAMA, key, value))
    line = _fails(["fit", "--model", str(path), "--hardware", "h100-sxm"])
    assert line == f"error: {path}: model 'llama-3.1-8b' config: {says}"
    assert "context must be" not in line


def test_import_hf_vocab_of_zero_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(TINY_HF, intermediate_size=128, vocab_size=0)))
    assert _fails(["catalog", "import-hf", str(cfg), "--name", "m"]).endswith("vocab_size must be >= 1, got 0")


# -- L4: price tables --------------------------------------------------------------------------


PRICES = """provider = "acme"
unit = "usd_per_million_tokens"
source = "a page"

[models.m]
input = 1.0
cached_input = 0.5
cache_write = 1.0
output = 2.0
date = DATE
source = "a row"
"""


def test_price_native_toml_date_is_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.toml", PRICES.replace("DATE", "2026-11-30"))
    (price,) = load_price_file(path, today=dt.date(2026, 12, 3))
    assert price.date == "2026-11-30" and not price.stale(dt.date(2026, 12, 3))
    future = _write(tmp_path / "f.toml", PRICES.replace("DATE", "2027-01-01"))
    with pytest.raises(ConfigError, match=r"f\.toml \[models\.m\]: date 2027-01-01 is in the future"):
        load_price_file(future, today=dt.date(2026, 12, 3))


def test_price_date_with_a_time_is_one_plain_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.toml", PRICES.replace("DATE", "2026-11-30T10:00:00"))
    with pytest.raises(ConfigError) as info:
        load_price_file(path, today=dt.date(2026, 12, 3))
    assert str(info.value) == f"{path} [models.m]: date must be a day (YYYY-MM-DD), got the time 2026-11-30T10:00:00"


def test_price_key_errors_name_only_what_is_wrong(tmp_path: Path) -> None:
    minimal = _write(tmp_path / "min.toml", 'provider = "acme"\n')
    with pytest.raises(ConfigError) as info:
        load_price_file(minimal)
    assert str(info.value) == f"{minimal}: missing key(s) ['models', 'source', 'unit']"
    extra = _write(
        tmp_path / "x.toml", PRICES.replace("DATE", '"2026-11-30"').replace("input = 1.0", "input = 1.0\ncolour = 1")
    )
    with pytest.raises(ConfigError) as info:
        load_price_file(extra, today=dt.date(2026, 12, 3))
    allowed = ["cache_write", "cached_input", "catalog_model", "date", "input", "output", "source"]
    assert str(info.value) == f"{extra} [models.m]: unknown key(s) ['colour']; allowed: {allowed}"


# -- L13: duplicate keys in a config.json ----------------------------------------------------------


@pytest.mark.parametrize(
    "text, key",
    [
        (
            '{"hidden_size": 64, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, '
            '"vocab_size": 100, "intermediate_size": 128}',
            "hidden_size",
        ),
        (
            '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, '
            '"intermediate_size": 128, "quantization_config": {"quant_method": "fp8", "quant_method": "awq"}}',
            "quant_method",
        ),
    ],
)
def test_import_hf_duplicate_keys_are_refused(tmp_path: Path, text: str, key: str) -> None:
    cfg = _write(tmp_path / "config.json", text)
    out = tmp_path / "m.toml"
    line = _fails(["catalog", "import-hf", str(cfg), "--hf-id", "org/m", "--name", "m", "--out", str(out)])
    assert line == f"error: {cfg}: invalid JSON: key {key!r} appears more than once in one object"
    assert not out.exists()


def test_a_huge_gpus_per_node_is_refused_not_searched() -> None:
    with (CATALOG / "hardware" / "h100-sxm.toml").open("rb") as fh:
        data = tomllib.load(fh)
    data["link"]["gpus_per_node"] = 10**9
    with pytest.raises(ConfigError) as err:
        parse_hardware(data, "hw.toml")
    want = f"hw.toml [link]: gpus_per_node must be at most {MAX_GPUS_PER_NODE:,} (one node), got 1,000,000,000"
    assert str(err.value) == want


def test_a_moe_intermediate_size_of_zero_is_refused(tmp_path: Path) -> None:
    """moe_intermediate_size = 0 was read as unset (the dense intermediate size: 435 GiB of
    weights for Qwen3-30B-A3B), where head_dim = 0 is refused."""
    text = (
        (CATALOG / "models" / "qwen3-30b-a3b.toml")
        .read_text()
        .replace("moe_intermediate_size = 768", "moe_intermediate_size = 0")
    )
    model = tmp_path / "zero.toml"
    model.write_text(text)
    one_error(
        cli("fit", "--model", str(model), "--hardware", "h100-sxm"),
        "moe_intermediate_size must be > 0 when given, got 0",
    )
