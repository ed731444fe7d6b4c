"""FLEET.toml loading: vLLM names and defaults, errors that name the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.catalog import load_hardware
from pipeline.common.errors import ConfigError
from pipeline.replay.fleet import load_fleet, parse_fleet, resolve, vllm_batch_defaults

ROOT = Path(__file__).resolve().parents[1]


def test_every_bundled_fleet_loads_and_resolves() -> None:
    from pipeline.replay.pools import PooledFleet, load_fleet_file

    paths = sorted((ROOT / "fleets").glob("*.toml"))
    assert ROOT / "fleets" / "default.toml" in paths and ROOT / "fleets" / "pools.toml" in paths
    for path in paths:
        loaded = load_fleet_file(path)
        configs = [p.config for p in loaded.pools] if isinstance(loaded, PooledFleet) else [loaded]
        for cfg in configs:
            fleet = resolve(cfg, str(path))
            assert fleet.scheduler.num_gpu_blocks > 0
            assert fleet.scheduler.max_num_batched_tokens >= fleet.scheduler.max_num_seqs


def test_vllm_defaults_follow_the_gpu() -> None:
    # vllm/engine/arg_utils.py: >= 70 GiB and not an A100 -> 8192 tokens / 1024 seqs (API server).
    assert vllm_batch_defaults(load_hardware("h100-sxm")) == (8192, 1024)
    assert vllm_batch_defaults(load_hardware("a100-80gb-sxm")) == (2048, 256)
    assert vllm_batch_defaults(load_hardware("l4")) == (2048, 256)
    fleet = resolve(parse_fleet({"name": "x", "model": "llama-3.1-8b", "hardware": "h100-sxm"}, "t"))
    s = fleet.scheduler
    assert (s.max_num_batched_tokens, s.max_num_seqs, s.block_size) == (8192, 1024, 16)
    assert s.enable_chunked_prefill and s.enable_prefix_caching
    assert s.max_model_len == fleet.deployment.model.max_position_embeddings


def test_unknown_missing_and_mistyped_keys_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\nreplica = 2\n')
    with pytest.raises(ConfigError, match=r"bad\.toml: unknown key\(s\) \['replica'\]"):
        load_fleet(bad)
    bad.write_text('name = "x"\nmodel = "llama-3.1-8b"\n')
    with pytest.raises(ConfigError, match=r"missing key\(s\) \['hardware'\]"):
        load_fleet(bad)
    bad.write_text('name = "x"\nmodel = "m"\nhardware = "h"\n[engine]\nmax_num_seqs = "many"\n')
    with pytest.raises(ConfigError, match=r"\[engine\]: max_num_seqs must be an integer, got 'many'"):
        load_fleet(bad)
    bad.write_text('name = "x"\nmodel = "m"\nhardware = "h"\n[engine]\nenable_prefix_caching = 1\n')
    with pytest.raises(ConfigError, match="enable_prefix_caching must be true or false, got 1"):
        load_fleet(bad)
    bad.write_text('name = "x"\nmodel = "m"\nhardware = "h"\nrouter = "random"\n')
    with pytest.raises(ConfigError, match="router 'random' unknown"):
        load_fleet(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_fleet(tmp_path / "nope.toml")


def test_a_model_that_does_not_fit_is_refused_like_vllm_does() -> None:
    cfg = parse_fleet({"name": "x", "model": "llama-2-70b", "hardware": "l4", "tp": 1}, "t")
    with pytest.raises(ConfigError, match="cannot hold one"):
        resolve(cfg, "t")


def test_overrides_and_frozen() -> None:
    cfg = parse_fleet(
        {
            "name": "x",
            "model": "llama-3.1-8b",
            "hardware": "h100-sxm",
            "engine": {"num_gpu_blocks_override": 100, "max_model_len": 1024, "gpu_memory_utilization": 1},
        },
        "t",
    )
    assert resolve(cfg).scheduler.num_gpu_blocks == 100
    assert cfg.with_replicas(5).replicas == 5
    with pytest.raises(ConfigError, match="replicas"):
        cfg.with_replicas(0)
    with pytest.raises(AttributeError):
        cfg.replicas = 3  # type: ignore[misc]


def test_calibration_table_overrides_the_catalog_factors(tmp_path: Path) -> None:
    base = 'name = "c"\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\n'
    good = tmp_path / "good.toml"
    good.write_text(base + '[calibration]\nsource = "fitted on X"\ncompute_efficiency = 0.5\n')
    fleet = resolve(load_fleet(good))
    assert fleet.deployment.hardware.compute_efficiency == 0.5
    assert fleet.deployment.hardware.memory_efficiency == load_hardware("h100-sxm").memory_efficiency
    for body, message in (
        ("[calibration]\ncompute_efficiency = 0.5\n", r"\[calibration\]: missing key\(s\) \['source'\]"),
        ('[calibration]\nsource = "x"\ncompute_efficiency = 1.5\n', "must be in"),
        ('[calibration]\nsource = "x"\nturbo = 1\n', "unknown key"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(base + body)
        with pytest.raises(ConfigError, match=message):
            load_fleet(bad)
