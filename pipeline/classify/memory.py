"""How much memory ``classify`` will need, checked before it builds a day's prefix chains."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.common import system
from pipeline.common.budget import OVERHEAD_BYTES, Limits, ResourceLimitError, current_limits, token_sums
from pipeline.common.defaults import MAX_MEMORY_ENV
from pipeline.common.units import format_bytes

if TYPE_CHECKING:
    import polars as pl


#: Peak bytes ``classify`` holds per prefix-cache block of a day (its chains, hashes and cache
#: tables), measured on a 5,000-request, 52 M-token synthetic day: 0.50, 1.2 and 4.0 GB peak at
#: block sizes 16, 4 and 1 (3.3, 13 and 52 M blocks; about 70 bytes a block over a 0.3 GB base).
CLASSIFY_BLOCK_BYTES = 80


def check_classify_memory(requests: pl.DataFrame, block_size: int, limits: Limits | None = None) -> None:
    """Refuse (ResourceLimitError, one line) a classify whose prefix blocks would need more memory
    than the limit: a tiny ``--block-size`` on a large day multiplies them."""
    limits = limits or current_limits()
    if limits.max_memory is None or requests.height == 0:
        return
    import polars as pl

    tokens = pl.col("recorded_input_tokens")
    if {"session_id", "output_tokens"} <= set(requests.columns):  # a session's turns cache its answers too
        tokens = pl.when(pl.col("session_id").is_not_null()).then(tokens + pl.col("output_tokens")).otherwise(tokens)
    _, blocks = token_sums(requests.select(tokens.alias("t")).to_series(), max(block_size, 1), ceil=True)
    need = system.process_rss() + OVERHEAD_BYTES + blocks * CLASSIFY_BLOCK_BYTES
    if need > limits.max_memory:
        raise ResourceLimitError(
            f"classifying {requests.height:,} requests in blocks of {block_size} tokens ({blocks:,} blocks) "
            f"would need about {format_bytes(need)} of memory, more than the limit of "
            f"{format_bytes(limits.max_memory)} ({limits.memory_origin}): use a larger --block-size, or raise "
            f"the limit with ${MAX_MEMORY_ENV}"
        )
