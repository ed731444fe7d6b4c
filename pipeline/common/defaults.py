"""Names and defaults the command line shows before any stage is imported.

``rooftrace --help`` (and every command's ``--help``) must answer without loading numpy, polars,
duckdb, numba or altair, so the option choices and defaults it prints live here, with the standard
library only. The stages import them from here: each value is defined once.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pipeline.common.errors import ConfigError

#: Log formats ``ingest`` and ``nightly`` read. A hand copy of pipeline/ingest/formats.py's
#: ALL_FORMATS (each format's spec, detection rule included, lives there): that module imports
#: polars, which ``--help`` must not load, so the names are repeated here and
#: tests/test_format_identity.py checks that the two agree, in the same order.
INGEST_FORMATS = ("openai", "anthropic", "litellm", "azure", "mooncake", "vidur", "otel", "csv", "jsonl", "parquet")
#: Log formats ``synth`` writes (pipeline/synth/writers.py; checked by the same test).
SYNTH_FORMATS = ("openai", "anthropic", "otel", "litellm", "azure", "mooncake", "vidur", "jsonl", "csv", "parquet")
#: Bounds of ``synth`` and of pipeline.synth.SynthConfig (here, so that --help needs no numpy).
#: The whole log is built in memory: about 1.4 KiB per request at the peak (measured:
#: 1.4 GiB for 1,000,000 OpenAI-format requests, 0.8 GiB as Parquet), so the largest log needs
#: about 14 GiB; write a bigger workload as several logs (other seeds or dates).
SYNTH_MAX_REQUESTS = 10_000_000
#: Tenants beyond this are not a gateway's workload (each one is a system prompt and a name held
#: in memory; a tenant without a session is possible and harmless).
SYNTH_MAX_TENANTS = 100_000
#: Session starts span at most a leap year (arrival times stay far inside datetime's range).
SYNTH_MAX_DURATION_S = 366 * 86_400.0
#: Gamma inter-arrival CV, shape 1/cv²: ServeGen measures CVs of about 1-3, so 20 is already an
#: extreme burst and 0.05 nearly periodic arrivals (past either end the shape over- or underflows).
SYNTH_MIN_CV, SYNTH_MAX_CV = 0.05, 20.0
#: numpy accepts any non-negative seed; request ids embed it, so it stays a 64-bit integer.
SYNTH_MAX_SEED = 2**63 - 1
#: Output formats of ``sql`` and ``query`` (pipeline/common/tables.py).
OUTPUT_FORMATS = ("table", "csv", "json", "parquet")
#: Where a replay's pods run (pipeline.engine.shard.EXECUTORS).
REPLAY_EXECUTORS = ("local", "thread", "process", "ray")
#: ... and where the replay and nightly commands run them unless told: threads, a usable core each.
DEFAULT_REPLAY_EXECUTOR = "thread"

#: MLPerf LoadGen runs a Server scenario for at least 600 s (MLPerf Inference rules, "min_duration"),
#: long enough for a p99 over thousands of requests; ``plan``'s default peak window follows it.
DEFAULT_WINDOW_S = 600.0
#: Requests arriving in the warm-up before the window are replayed (so the window starts with
#: a loaded batch, a warm prefix cache and any queue) but not measured. Two minutes cover the
#: residence time of all but the longest requests at the SLOs we plan for (TTFT <= 2 s plus a few
#: hundred tokens at <= 200 ms each).
DEFAULT_WARMUP_S = 120.0
#: Replica ceiling of ``plan``'s search: beyond it a configuration is reported as not meeting the SLO.
DEFAULT_MAX_REPLICAS = 512
#: ``plan --modes``: the serving modes searched by default (colocated only: a plan without
#: --modes is the plan it always was), the prefill:decode replica ratios a disaggregated search
#: tries (from decode-heavy to prefill-heavy; docs/planning.md, "Serving modes"), the link kind the
#: prefill pool hands over (pipeline/catalog/links.toml), the speculative method and k, and the
#: offload tier's GB per replica (the catalog's host DRAM per GPU, pipeline/catalog/offload.toml:
#: DGX H100's 2 TB for 8 GPUs) and kind.
DEFAULT_PLAN_MODES = "colocated"
DEFAULT_PD_RATIOS = "1:3,1:2,1:1,2:1,3:1"
DEFAULT_PD_LINK = "rdma"
DEFAULT_PLAN_SPECULATIVE = "eagle3:3"
DEFAULT_PLAN_OFFLOAD_GB = "256"
DEFAULT_PLAN_OFFLOAD_KIND = "cpu"
#: ... and the stores below a cpu tier it tries too (none: the cpu tier alone).
DEFAULT_PLAN_OFFLOAD_STORE_GB = ""
#: Wall-time budget of the nightly's headroom curve (seconds): the nightly stays bounded however
#: slow a point is; unfinished points are recorded as skipped.
DEFAULT_HEADROOM_BUDGET_S = 300.0

#: Environment variables of the resource limits (pipeline/replay/limits.py).
MAX_MEMORY_ENV = "ROOFTRACE_MAX_MEMORY"
MAX_SIM_DAYS_ENV = "ROOFTRACE_MAX_SIM_DAYS"
PROGRESS_EVERY_ENV = "ROOFTRACE_PROGRESS_EVERY_S"

#: The catalog file naming the GPUs ``plan`` searches when --hardware is not given (its
#: ``default_hardware`` list, with the reason in its [sources]).
PLAN_DEFAULTS_PATH = Path(__file__).resolve().parents[1] / "catalog" / "plan.toml"


def plan_default_hardware(path: Path = PLAN_DEFAULTS_PATH) -> tuple[str, ...]:
    """The hardware names of ``default_hardware`` in ``path`` (pipeline/catalog/plan.toml): read
    with the standard library, so ``rooftrace plan --help`` can show them. A file that cannot be
    read, or a list that is not one of non-empty names, is one line naming the file and the key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the plan's default hardware ({type(exc).__name__}: {exc})") from None
    names = data.get("default_hardware")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise ConfigError(
            f"{path}: default_hardware must be a non-empty array of hardware names, got {str(names)[:80]!r}"
        )
    return tuple(dict.fromkeys(names))


def plan_default_hardware_text() -> str:
    """What ``plan --help`` shows as --hardware's default: the list, or where it is when the file
    cannot be read (the command itself then says why)."""
    try:
        return ",".join(plan_default_hardware())
    except ConfigError:
        return "default_hardware of pipeline/catalog/plan.toml"


#: The purchase models `rooftrace cost --purchase` takes (pipeline/economics/stack.py PURCHASES,
#: the [purchase.*] tables of pipeline/catalog/cost.toml; a test keeps the three equal).
PURCHASE_MODELS: tuple[str, ...] = ("on_demand", "reserved_1y", "reserved_3y", "spot")
