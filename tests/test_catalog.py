"""Catalog: every entry loads, values are cited, and model shapes reproduce published counts."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from pipeline.catalog import (
    hardware_to_toml,
    import_hf_config,
    list_hardware,
    list_models,
    load_hardware,
    load_hardware_file,
    load_model,
    parse_hardware,
    parse_model,
    weight_format,
)
from pipeline.common.errors import ConfigError

REQUIRED_HARDWARE = {
    "a10g", "l4", "l40s", "a100-40gb-sxm", "a100-80gb-sxm", "h100-pcie", "h100-sxm", "h200", "b200",
    "gb200", "mi300x", "mi325x", "rtx-4090", "rtx-pro-6000",
}  # fmt: skip
REQUIRED_MODELS = {
    "llama-2-7b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b",
    "mixtral-8x7b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
    "gpt-oss-120b",
}  # fmt: skip


def test_required_entries_present_and_load() -> None:
    assert set(list_hardware()) >= REQUIRED_HARDWARE
    assert set(list_models()) >= REQUIRED_MODELS
    for name in list_hardware():
        hw = load_hardware(name)
        assert hw.name == name
        assert set(hw.sources) >= {"memory_bytes", "peak_flops_per_s", "link", "efficiency", "price"}
        assert 0 < hw.compute_efficiency <= 1 and 0 < hw.memory_efficiency <= 1
    for name in list_models():
        assert load_model(name).name == name


@pytest.mark.parametrize(
    ("name", "bf16", "fp8"),
    [
        # Dense datasheet figures (half of the sparse ones).
        ("h100-sxm", 989.4e12, 1978.9e12),
        ("h200", 989.4e12, 1978.9e12),
        ("b200", 2.25e15, 4.5e15),
        ("mi300x", 1307.4e12, 2614.9e12),
        ("l4", 121e12, 242.5e12),
    ],
)
def test_dense_peaks(name: str, bf16: float, fp8: float) -> None:
    hw = load_hardware(name)
    assert hw.peak_for("bf16") == pytest.approx(bf16)
    assert hw.peak_for("fp8") == pytest.approx(fp8)


def test_missing_format_falls_back_to_bf16() -> None:
    a100 = load_hardware("a100-80gb-sxm")
    assert "fp8" not in a100.peak_flops_per_s
    assert a100.peak_for("fp8") == a100.peak_for("bf16") == 312e12
    assert a100.compute_dtype_for("fp4") == "bf16"


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        # Published parameter counts (model cards / papers).
        ("llama-2-7b", 6.74, None),  # Touvron et al. 2023, HF model card "7B" = 6.74B
        ("llama-2-70b", 68.98, None),
        ("llama-3.1-8b", 8.03, None),  # HF model card: 8.03B
        ("llama-3.1-70b", 70.55, None),  # 70.6B
        ("llama-3.1-405b", 405.85, None),  # 405B
        ("mistral-7b", 7.24, None),  # Mistral 7B paper: 7.24B
        ("mixtral-8x7b", 46.70, 12.88),  # Mixtral paper: 46.7B total, 12.9B active
        ("qwen3-30b-a3b", 30.5, 3.3),  # Qwen3 report: 30.5B / 3.3B
        ("qwen3-235b-a22b", 235.1, 22.2),  # 235B / 22B
        (
            "deepseek-v3",
            671.0,
            37.5,
        ),  # DeepSeek-V3 report: 671B total, 37B activated (without the MTP module)
    ],
)
def test_parameter_counts_match_published(name: str, total_b: float, active_b: float | None) -> None:
    m = load_model(name)
    assert m.total_params() / 1e9 == pytest.approx(total_b, rel=0.01)
    if active_b is not None:
        assert m.active_params() / 1e9 == pytest.approx(active_b, rel=0.03)


def test_gpt_oss_counts_and_window() -> None:
    m = load_model("gpt-oss-120b")
    # OpenAI gpt-oss model card: 116.83B total, 5.13B active per token (embedding excluded).
    assert m.total_params() / 1e9 == pytest.approx(116.83, rel=0.01)
    assert (m.active_params() - m.embedding_params()) / 1e9 == pytest.approx(5.13, rel=0.01)
    assert (m.sliding_window, m.num_sliding_layers, m.num_full_attention_layers) == (128, 18, 18)
    assert m.native_dtype == "mxfp4"


def test_attention_kinds() -> None:
    assert load_model("llama-2-7b").attention == "mha"
    assert load_model("llama-3.1-8b").attention == "gqa"
    assert load_model("deepseek-v3").attention == "mla"
    mqa = parse_model(
        {"name": "mqa", "hf_id": "x/mqa", "source": "test", "config": {
            "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16,
            "num_key_value_heads": 1, "vocab_size": 1000, "intermediate_size": 8192}},
        "test",
    )  # fmt: skip
    assert mqa.attention == "mqa"


def test_qwen3_window_disabled_and_mistral_window_everywhere() -> None:
    assert load_model("qwen3-8b").num_sliding_layers == 0
    mistral = load_model("mistral-7b")
    assert (mistral.sliding_window, mistral.num_sliding_layers) == (4096, 32)


def test_weight_bytes_include_scales() -> None:
    assert weight_format("bf16").bytes_per_param == 2.0
    assert weight_format("int4").bytes_per_param == pytest.approx(0.5 + 2.5 / 128)
    assert weight_format("mxfp4").bytes_per_param == pytest.approx(0.5 + 1 / 32)
    assert weight_format("nvfp4").bytes_per_param == pytest.approx(0.5 + 1 / 16)
    with pytest.raises(ConfigError, match="unknown weight dtype 'fp3'"):
        weight_format("fp3")


def _h100_toml() -> dict[str, object]:
    import tomllib

    return tomllib.loads(hardware_to_toml(load_hardware("h100-sxm")))


def test_hardware_roundtrip_and_errors(tmp_path: Path) -> None:
    data = _h100_toml()
    assert parse_hardware(data, "rt") == load_hardware("h100-sxm")
    bad = dict(data, colour="green")
    with pytest.raises(ConfigError, match=r"bad.toml: unknown key\(s\) \['colour'\]"):
        parse_hardware(bad, "bad.toml")
    missing = {k: v for k, v in data.items() if k != "memory_bytes"}
    with pytest.raises(ConfigError, match=r"missing key\(s\) \['memory_bytes'\]"):
        parse_hardware(missing, "bad.toml")
    sources = dict(data["sources"])  # type: ignore[call-overload]
    del sources["price"]
    with pytest.raises(ConfigError, match=r"\[sources\]: missing key\(s\) \['price'\]"):
        parse_hardware(dict(data, sources=sources), "bad.toml")
    eff = dict(data["efficiency"])  # type: ignore[call-overload]
    for value in (1.5, 1e-300, 0.00099):
        eff["memory"] = value
        with pytest.raises(ConfigError, match=r"bad.toml \[efficiency\]: memory must be in \[0.001, 1\]"):
            parse_hardware(dict(data, efficiency=eff), "bad.toml")
    eff["memory"] = 0.001
    assert parse_hardware(dict(data, efficiency=eff), "ok.toml").memory_efficiency == 0.001
    # the device memory CUDA reports: optional, sourced, never above the datasheet's
    logged = dict(data, cuda_memory_bytes=79.19 * 2**30)
    with pytest.raises(ConfigError, match=r"\[sources\]: missing key\(s\) \['cuda_memory_bytes'\]"):
        parse_hardware(logged, "bad.toml")
    logged["sources"] = dict(data["sources"], cuda_memory_bytes="a log")  # type: ignore[call-overload]
    assert parse_hardware(logged, "ok.toml").cuda_memory_bytes == 79.19 * 2**30
    with pytest.raises(ConfigError, match="cuda_memory_bytes must not exceed memory_bytes"):
        parse_hardware(dict(logged, cuda_memory_bytes=81 * 2**30), "bad.toml")
    l40s = load_hardware("l40s")
    assert parse_hardware(tomllib.loads(hardware_to_toml(l40s)), l40s.path) == l40s
    path = tmp_path / "mine.toml"
    path.write_text(hardware_to_toml(load_hardware("h100-sxm")))
    assert load_hardware_file(path).memory_bytes == 80 * 2**30


def test_unknown_names_are_errors() -> None:
    with pytest.raises(ConfigError, match="no hardware named 'h900'"):
        load_hardware("h900")
    with pytest.raises(ConfigError, match="no model named 'llama-9'"):
        load_model("llama-9")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['hiden_size'\]"):
        parse_model({"name": "x", "hf_id": "x", "source": "s", "config": {"hiden_size": 1}}, "x.toml")


@pytest.mark.parametrize("name", sorted(REQUIRED_MODELS))
def test_import_hf_roundtrips_catalog_entries(tmp_path: Path, name: str) -> None:
    spec = load_model(name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(spec.config, some_unread_key=[1, 2])))
    imported, toml_text = import_hf_config(path, name=name, hf_id=spec.hf_id)
    fields = ("hidden_size", "num_layers", "num_kv_heads", "num_experts", "kv_lora_rank", "sliding_window")
    assert all(getattr(imported, f) == getattr(spec, f) for f in fields)
    assert imported.total_params() == spec.total_params()
    import tomllib

    again = parse_model(tomllib.loads(toml_text), "roundtrip")
    assert again.total_params() == spec.total_params()
    assert "some_unread_key" not in toml_text


def test_import_hf_errors(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(ConfigError, match=r"missing key\(s\) \['num_hidden_layers', 'vocab_size'\]"):
        import_hf_config(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        import_hf_config(path)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"num_key_value_heads": 0}, "num_key_value_heads must be > 0 when given"),
        ({"head_dim": 0}, "head_dim must be > 0 when given"),
        ({"num_local_experts": 0, "num_experts_per_tok": 2}, "num_experts_per_tok is 2 but the expert count"),
    ],
)
def test_import_hf_refuses_zero_heads_or_experts(tmp_path: Path, extra: dict[str, int], said: str) -> None:
    """A zero KV-head count or head size was read as "not given" (plain multi-head attention:
    4x the KV per token of a GQA model), and a Mixtral with no experts as a dense model."""
    base = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 100,
        "intermediate_size": 128,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **extra}))
    with pytest.raises(ConfigError, match=re.escape(said)):
        import_hf_config(path)
    path.write_text(json.dumps({**base, "num_key_value_heads": None}))  # null: the default, as before
    assert import_hf_config(path)[0].num_kv_heads == 4
