"""Publishing: the DuckDB warehouse over the store, the offline HTML report, and the nightly job.

``warehouse`` keeps ``STORE/warehouse.duckdb`` (views over the Parquet store) and runs the named
queries in ``queries/``; ``report`` renders the capacity report from ``templates/``; ``nightly``
chains every stage for one day (ingest, classify, replay, headroom, cost, warehouse, report).

Public entry: :func:`build_report` and :func:`run_query`; the nightly job is
``pipeline.publish.nightly.nightly`` (a function named as its module is not re-exported here: it
would hide the module).
"""

from pipeline.publish.report import build_report
from pipeline.publish.warehouse import run_query

__all__ = ["build_report", "run_query"]
