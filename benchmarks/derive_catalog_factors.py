"""Print the catalog's efficiency factors, re-derived from the operator measurements in $ROOFTRACE_MEASUREMENTS.

    python benchmarks/derive_catalog_factors.py

elementwise kernel scales (pipeline.costmodel.roofline.ELEMENTWISE_KERNEL_SCALE): one HBM share per
elementwise kernel class fitted per GPU on the train split of Vidur mlp.csv, divided by the gated
activation's share, geometric mean of A100 and H100;
compute / elementwise / min_kernel_s: least-squares fit on the train split of Vidur mlp.csv, with
those kernel scales fixed;
memory: median achieved HBM bandwidth of weight-streaming Vidur GEMMs (train split);
link / latency: fit on the train split of Vidur all_reduce.csv (DGX, one node);
step_overhead_s: what the vLLM CI latency run (H200, Llama-3.1-8B, TP1, batch 8, 32 in / 128 out,
median e2e 833.53 ms) leaves after the roofline time of its 128 steps.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from pipeline.calibrate.validate import (
    discover,
    fit_elementwise_kernels,
    fit_factors,
    load_groups,
    overhead_from_latency_run,
    weight_streaming_efficiency,
)
from pipeline.catalog import load_hardware, load_model
from pipeline.costmodel.roofline import Deployment

SHARED = Path(os.environ.get("ROOFTRACE_MEASUREMENTS", "measurements"))
SKUS = {"a100": "a100-80gb-sxm", "h100": "h100-sxm"}
VLLM_CI_E2E_S = 0.83353  # vllm_buildkite_perf_9515_h200.csv, latency_llama8B_tp1 median_e2e_latency


def main() -> int:
    if not SHARED.is_dir():
        print(f"{SHARED} not found: the measurements are needed", file=sys.stderr)
        return 1
    out: dict[str, dict[str, float]] = {}
    compute = {sku: load_groups(discover(SHARED / "vidur-profiling" / "compute" / sku))[0] for sku in SKUS}
    kernels = fit_elementwise_kernels([g for groups in compute.values() for g in groups])
    out["elementwise_kernel_scale"] = {k: round(v, 3) for k, v in kernels.scales.items()}
    for name, fit in kernels.per_hardware.items():
        out[f"elementwise_kernel_fit/{name}"] = {
            **{k: round(v, 3) for k, v in fit.items() if k != "min_kernel"},
            "min_kernel_s": round(fit["min_kernel"], 7),
            "rows": kernels.n_train[name],
        }
    for sku, name in SKUS.items():
        base = load_hardware(name)
        mlp = compute[sku]
        fitted, cal = fit_factors(mlp, "vidur_mlp", base)
        streaming, n_stream = weight_streaming_efficiency(mlp)
        net, _ = load_groups(discover(SHARED / "vidur-profiling" / "network" / f"{sku}_dgx" / "all_reduce.csv"))
        linked, lcal = fit_factors(net, "vidur_all_reduce", base)
        out[name] = {
            "compute": round(fitted.compute_efficiency, 3),
            "memory": round(streaming, 3),
            "elementwise": round(fitted.elementwise_efficiency, 3),
            "min_kernel_s": round(fitted.min_kernel_s, 7),
            "link": round(linked.link_efficiency, 3),
            "link_latency_s": round(linked.link_latency_s, 7),
            "vidur_rows": cal.n_train,
            "streaming_rows": n_stream,
            "all_reduce_rows": lcal.n_train,
        }
    h = out["h100-sxm"]
    h200 = replace(
        load_hardware("h200"),
        compute_efficiency=h["compute"],
        memory_efficiency=h["memory"],
        elementwise_efficiency=h["elementwise"],
        min_kernel_s=h["min_kernel_s"],
    )
    dep = Deployment(load_model("llama-3.1-8b"), h200)
    out["step_overhead_s"] = {"value": round(overhead_from_latency_run(dep, 8, 32, 128, VLLM_CI_E2E_S), 6)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
