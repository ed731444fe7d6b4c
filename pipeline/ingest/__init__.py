"""Ingest: production logs in many formats -> canonical requests in the Parquet store.

``formats`` declares each log format (its columns and its detection rule), ``source`` detects
and ``readers`` reads them, ``normalize`` and ``mapping`` make canonical requests, ``core`` runs a
file set into the store; ``store`` is the on-disk store every later stage reads and writes
(partitions, locks, atomic commits) and ``project`` says where it is when no path is given;
``benchruns`` reads the result files of benchmark clients (vLLM bench, GuideLLM, AIPerf).

Public entry: :func:`ingest_logs`.
"""

from pipeline.ingest.core import FileResult, IngestSummary, ingest_logs
from pipeline.ingest.formats import ALL_FORMATS

__all__ = ["ALL_FORMATS", "FileResult", "IngestSummary", "ingest_logs"]
