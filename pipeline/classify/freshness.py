"""Whether a date's token accounting (``rooftrace classify``) still covers the store's requests of
that date.

Classify writes the accounting of the requests a date holds when it runs; logs of the same date
ingested afterwards are in the store (and in any replay run since) but not in the accounting, so
every figure read from it (the report's Input tokens card and token-accounting chart, ``query
token_totals``) would be of the older, smaller day. :func:`classify_freshness` says so: the
requests classify counted against the ones the store holds now, then, for equal counts, the
request ids of both (a date ingested again with other requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from pipeline.classify.accounting import accounting_paths, classify_totals
from pipeline.ingest.store import Store


@dataclass(frozen=True)
class ClassifyFreshness:
    """The date's accounting against its stored requests."""

    date: str
    #: Requests classify accounted for (its summary.json); None when the date was never classified.
    classified_requests: int | None
    #: Requests the store holds for the date now.
    store_requests: int
    #: Same count, other request ids (the date's logs replaced since classify ran).
    other_ids: bool = False

    @property
    def classified(self) -> bool:
        return self.classified_requests is not None

    @property
    def stale(self) -> bool:
        """Classify ran, and on other requests than the store holds now."""
        return self.classified_requests is not None and (
            self.classified_requests != self.store_requests or self.other_ids
        )

    def note(self, store_root: Path | str | None = None) -> str | None:
        """One sentence for a person when the accounting is stale (None otherwise): both counts,
        what it means and the command that fixes it."""
        if not self.stale:
            return None
        if self.other_ids:
            what = (
                f"its {self.classified_requests:,} requests are not the {self.store_requests:,} the store holds now "
                "(same count, other request ids)"
            )
        else:
            what = (
                f"it covers {self.classified_requests:,} requests, the store holds {self.store_requests:,} "
                "of the date now"
            )
        where = f" --store {store_root}" if store_root is not None else ""
        return (
            f"STALE CLASSIFY: the token accounting of {self.date} predates its requests: {what} (logs ingested "
            "after `rooftrace classify` ran), so the recorded / cache-hit / fresh input figures it gives are "
            f"of the older day. Run `rooftrace classify{where} --date {self.date}` and report again"
        )


def _summary_requests(store: Store, date: str) -> int | None:
    n = (classify_totals(store, date) or {}).get("requests")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def request_id_digest(files: list[Path]) -> int:
    """An order-free digest of the request ids in ``files`` (the sum of their hashes, mod 2^64),
    read a batch at a time."""
    import numpy as np
    import polars as pl
    import pyarrow.parquet as pq

    total = 0
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1 << 20, columns=["request_id"]):
            ids = pl.Series(batch.column(0)).cast(pl.String)
            # numpy's array sum wraps at 2^64 without a warning; Python's int keeps the rest exact
            total = (total + int(np.sum(ids.hash(seed=0).to_numpy(), dtype=np.uint64))) % 2**64
    return total


def classify_freshness(store: Store, date: str) -> ClassifyFreshness:
    """Whether classify's accounting of ``date`` covers the store's requests of it now: counts
    first (summary.json against the request files' footers), then, for equal counts, the request
    ids (an unreadable file leaves the count as all there is to go on)."""
    paths = accounting_paths(store, date)
    classified = _summary_requests(store, date)
    stored = store.stored_rows(date)
    if classified is None or classified != stored or not stored:
        return ClassifyFreshness(date, classified, stored)
    try:
        other = request_id_digest([paths["requests"]]) != request_id_digest(store.request_files(date))
    except (OSError, ValueError, KeyError, pa.ArrowException):
        other = False
    return ClassifyFreshness(date, classified, stored, other)
