"""vLLM's expert-parallel all-to-all as it runs by default (``allgather_reducescatter``): an NCCL
all-gather of the data-parallel ranks' hidden states before the experts and a reduce-scatter
after, each priced from AIConfigurator's measured NCCL tables (pipeline/costmodel/profile/sources.py,
pipeline/costmodel/profile/cost.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import shared_path

from pipeline.catalog import load_hardware, load_model
from pipeline.costmodel.profile.cost import measured_cost
from pipeline.costmodel.profile.sources import NCCL_BACKENDS
from pipeline.costmodel.profile.tables import load_profile
from pipeline.costmodel.roofline import Deployment


def _newest_nccl(gpu_dir: str) -> Path:
    root = Path(shared_path("measurements", "aiconfigurator-vllm-ops", gpu_dir, "comm", "nccl"))
    versions = sorted(root.iterdir(), key=lambda p: tuple(int(x) for x in p.name.split(".")))
    return versions[-1] / "nccl_perf.parquet"


def test_shipped_all_gather_and_reduce_scatter_rows_are_the_measurements() -> None:
    # message_size counts 16-bit elements of the whole tensor (nccl-tests' -b count, divided by
    # the element size by the collector); latency in ms
    raw = pl.read_parquet(_newest_nccl("h100_sxm")).filter(pl.col("nccl_dtype") == "half")
    prof = load_profile("h100-sxm")
    shipped = prof.frame("allreduce")
    for op, backend in NCCL_BACKENDS.items():
        for gpus in (2, 4, 8):
            want = raw.filter((pl.col("op_name") == op) & (pl.col("num_gpus") == gpus)).sort("message_size")
            got = shipped.filter((pl.col("backend") == backend) & (pl.col("gpus") == gpus)).sort("bytes")
            assert got.height == want.height > 10, (op, gpus)
            np.testing.assert_array_equal(got["bytes"].to_numpy(), 2 * want["message_size"].to_numpy())
            np.testing.assert_allclose(got["time_s"].to_numpy(), want["latency"].to_numpy() * 1e-3, rtol=1e-12)
            curve = prof.allreduce_curve(backend, gpus)
            assert curve is not None
            np.testing.assert_allclose(
                curve(got["bytes"].to_numpy().astype(float)), got["time_s"].to_numpy(), rtol=1e-9
            )


def test_dp_ranks_pay_a_measured_all_gather_and_reduce_scatter_per_moe_layer() -> None:
    m, hw = load_model("qwen3-30b-a3b"), load_hardware("h100-sxm")
    prof = load_profile("h100-sxm")
    gather, scatter = prof.allreduce_curve("nccl_all_gather", 2), prof.allreduce_curve("nccl_reduce_scatter", 2)
    assert gather is not None and scatter is not None
    dp2 = measured_cost(Deployment(m, hw, ep=2, dp=2), prof, max_tokens=1200)
    one = measured_cost(Deployment(m, hw), prof, max_tokens=1200)
    assert dp2.describe["moe_dispatch"] == (
        "allgather_reducescatter: NCCL all-gather + reduce-scatter (measured: h100-sxm x2 curves)"
    )
    # tp = 1: the token table's communication column is the all-to-all alone, once per MoE
    # layer, of both ranks' T tokens of hidden state in 16 bits (T: the padded step size)
    for t in (1, 8, 64, 512, 1024):
        nbytes = np.array([2.0 * t * m.hidden_size * 2.0])
        want = m.num_moe_layers * float((gather(nbytes) + scatter(nbytes))[0])
        assert dp2.tok[t, 2] == pytest.approx(want, rel=1e-12), t
        assert one.tok[t, 2] == 0.0
    # measured, the two collectives cost more than one NCCL all-reduce of the same tensor (NCCL's
    # all-reduce on NVSwitch is not two ring halves): 20.4 against 15.6 us at 512 bytes over 8 GPUs
    ar, ag, rs = (prof.allreduce_curve(b, 8) for b in ("nccl", "nccl_all_gather", "nccl_reduce_scatter"))
    assert ar is not None and ag is not None and rs is not None
    x = np.array([512.0, 2.0**20, 2.0**25])
    assert np.all(ag(x) + rs(x) > ar(x))
