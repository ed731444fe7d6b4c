"""Compile the replay engine into numba's disk cache, both its loops (jit.compile_engine; run by
tests/conftest.py in the background while the test workers start on tests that need no engine).
Prints how long it took on stderr; exit status non-zero if the compile failed."""

from __future__ import annotations

import sys
import time


def main() -> int:
    from pipeline.engine.jit import compile_engine

    t0 = time.monotonic()
    sys.stderr.write("conftest: compiling the replay engine for the test workers (in the background)\n")
    compile_engine(parallel=True)  # the loop of fleets without lockstep groups (in two processes) ...
    compile_engine(lockstep=2)  # ... and the loop of fleets with (tests/test_lockstep.py)
    sys.stderr.write(f"conftest: replay engine compiled in {time.monotonic() - t0:.0f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
