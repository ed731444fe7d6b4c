"""pipeline.calibrate.nccl: nccl-tests all_reduce_perf logs -> the GPU link's efficiency and latency."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.calibrate.nccl import MIN_FIT_BYTES, fit_link, is_all_reduce_log, read_all_reduce
from pipeline.catalog import load_hardware, load_model, parse_hardware
from pipeline.cli import main
from pipeline.common.errors import RooftraceError
from pipeline.costmodel.roofline import Deployment

HEADER = """# nThread 1 nGpus 1 minBytes 8 maxBytes 536870912 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 \
validation: 1 graph: 0
#
# Using devices
{ranks}
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""


def write_log(path: Path, gpus: int, bandwidth: float, latency_s: float, noise: float = 0.0, wrong: int = 0,
              sizes: list[int] | None = None, seed: int = 0) -> Path:  # fmt: skip
    """An all_reduce_perf log as nccl-tests prints it, for a link of ``bandwidth`` B/s per
    direction and ``latency_s`` per call (time = latency + 2(n-1)/n · size / bandwidth)."""
    rng = np.random.default_rng(seed)
    ranks = "\n".join(
        f"#  Rank {i:2d} Group  0 Pid  {4000 + i} on    box device {i:2d} [0x{16 + i:02x}] NVIDIA H100 PCIe"
        for i in range(gpus)
    )
    lines = [HEADER.format(ranks=ranks)]
    for k, size in enumerate(sizes or [2**e for e in range(3, 30)]):
        t = (latency_s + 2 * (gpus - 1) / gpus * size / bandwidth) * (1 + noise * rng.standard_normal())
        algbw = size / t / 1e9
        busbw = algbw * 2 * (gpus - 1) / gpus
        bad = wrong if k == 20 else 0
        lines.append(
            f"{size:12d}  {size // 4:12d}     float     sum      -1  {t * 1e6:7.2f}  {algbw:6.2f}  {busbw:6.2f}  "
            f"{bad:6d}  {t * 1e6:7.2f}  {algbw:6.2f}  {busbw:6.2f}  {bad:6d}"
        )
    lines.append("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 10.0\n#")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_log_is_read_row_by_row_with_its_gpus(tmp_path: Path) -> None:
    log = write_log(tmp_path / "ar.log", 4, 20e9, 30e-6)
    assert is_all_reduce_log(log)
    run = read_all_reduce(log)
    assert run.ranks == 4 and run.devices == ("NVIDIA H100 PCIe",)
    assert run.size_bytes.min() == MIN_FIT_BYTES  # 8..512 B are launch latency alone: left out, said
    assert any("below 1024 B" in s for s in run.skipped)
    # first fitted row: 1024 B at 30 us + 1.5 · 1024 / 20e9 s, as printed (two decimals of a microsecond)
    assert run.time_s[0] == pytest.approx(round((30e-6 + 1.5 * 1024 / 20e9) * 1e6, 2) * 1e-6)
    np.testing.assert_allclose(run.ring_bytes, run.size_bytes * 1.5)


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_the_fit_recovers_a_known_link(tmp_path: Path, gpus: int) -> None:
    hw = load_hardware("h100-pcie")
    bw, lat = 0.35 * hw.link_bandwidth_bytes_per_s, 28e-6  # a PCIe box whose P2P goes through the CPU
    fit = fit_link(read_all_reduce(write_log(tmp_path / "ar.log", gpus, bw, lat, noise=0.01, seed=gpus)), "h100-pcie")
    assert fit.efficiency == pytest.approx(0.35, rel=0.03)
    assert fit.latency_s == pytest.approx(lat, rel=0.05)
    assert fit.holdout_median_abs_error < 0.02
    assert fit.before_median_abs_error > 0.3  # the catalog's assumed 0.7 is twice too fast for this box
    entry = parse_hardware(tomllib.loads(fit.toml), "fitted")
    assert entry.link_efficiency == pytest.approx(fit.efficiency) and entry.link_latency_s == pytest.approx(
        lat, rel=0.05
    )
    assert "nccl-tests" in entry.sources["link"] and "nccl-tests" in entry.calibrated_on


def test_a_fitted_link_prices_tensor_parallel_all_reduce_slower() -> None:
    model = load_model("llama-3.1-8b")
    hw = load_hardware("h100-pcie")
    from dataclasses import replace

    from pipeline.costmodel.roofline import decode_batch

    slow = replace(hw, link_efficiency=0.35)
    batch = decode_batch([32.0], [2000.0])
    fast_t = Deployment(model, hw, tp=2)(batch).time_s[0]
    slow_t = Deployment(model, slow, tp=2)(batch).time_s[0]
    assert slow_t > fast_t
    assert Deployment(model, slow, tp=1)(batch).time_s[0] == Deployment(model, hw, tp=1)(batch).time_s[0]


def test_wrong_results_are_left_out_with_their_line(tmp_path: Path) -> None:
    run = read_all_reduce(write_log(tmp_path / "ar.log", 2, 20e9, 30e-6, wrong=3))
    assert any("3 wrong results" in s for s in run.skipped)
    assert run.size_bytes.size == 27 - 7 - 1  # 27 sizes, 7 under 1 KiB, one failed


@pytest.mark.parametrize(
    "text, says",
    [
        ("size,time\n1,2\n", "before nccl-tests' column header"),
        ("# just a comment\n", "not an nccl-tests log"),
        ("# nThread 1 nGpus 2\n  1024 256 float sum -1 10 0 0 0 10 0 0 0\n", "before nccl-tests' column header"),
        ("", "not an nccl-tests log"),
    ],
)
def test_what_is_not_a_log_is_refused_in_one_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "x.log"
    path.write_text(text)
    with pytest.raises(RooftraceError, match=says) as err:
        read_all_reduce(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_too_few_sizes_or_one_gpu_or_an_impossible_link_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RooftraceError, match="at least 6"):
        read_all_reduce(write_log(tmp_path / "a.log", 2, 20e9, 30e-6, sizes=[4096, 8192, 16384]))
    with pytest.raises(RooftraceError, match="fewer than 2"):
        read_all_reduce(write_log(tmp_path / "b.log", 1, 20e9, 30e-6))
    fast = read_all_reduce(write_log(tmp_path / "c.log", 2, 400e9, 10e-6))  # an NVLink box's log
    with pytest.raises(RooftraceError, match="not this GPU's link"):
        fit_link(fast, "h100-pcie")


def test_calibrate_measurements_writes_a_hardware_entry_from_an_nccl_log(tmp_path: Path) -> None:
    log = write_log(tmp_path / "all_reduce.log", 2, 25e9, 20e-6, noise=0.01)
    out = tmp_path / "my-box.toml"
    got = CliRunner().invoke(
        main, ["calibrate", "--measurements", str(log), "--hardware", "h100-pcie", "--out", str(out), "--json"]
    )
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    assert doc["gpus"] == 2 and doc["link_efficiency"] == pytest.approx(25e9 / 63e9, rel=0.03)
    entry = parse_hardware(tomllib.loads(out.read_text()), "written")
    assert entry.name == "my-box" and entry.link_latency_s == pytest.approx(20e-6, rel=0.1)
    missing = CliRunner().invoke(main, ["calibrate", "--measurements", str(log)])
    assert missing.exit_code != 0 and "needs --hardware" in missing.output
