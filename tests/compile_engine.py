"""Compile the replay engine into numba's disk cache: a one-request replay (run by
tests/conftest.py in the background while the test workers start on tests that need no engine).
Prints how long it took on stderr; exit status non-zero if the compile failed."""

from __future__ import annotations

import sys
import time

import numpy as np


def main() -> int:
    from pipeline.costmodel.stepcost import affine_cost, scalars
    from pipeline.engine.jit import simulate_jit
    from pipeline.engine.model import FleetSpec, SchedulerConfig, Workload

    t0 = time.monotonic()
    sys.stderr.write("conftest: compiling the replay engine for the test workers (in the background)\n")
    one = np.ones(2)
    cost = affine_cost(np.zeros((2, 7)), np.zeros((2, 7)), one, one, np.array([True, False]), one, scalars())
    work = Workload(np.zeros(1), np.array([40]), np.array([3]), np.array([7], np.uint64), np.array([0, 1]))
    cfg = SchedulerConfig(num_gpu_blocks=64, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128,
                          block_size=16, enable_chunked_prefill=True, enable_prefix_caching=True)  # fmt: skip
    simulate_jit(work, FleetSpec(replicas=1, scheduler=cfg), cost)
    sys.stderr.write(f"conftest: replay engine compiled in {time.monotonic() - t0:.0f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
