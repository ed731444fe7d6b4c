"""Ingest: production logs in many formats -> canonical requests in the Parquet store."""

from pipeline.ingest.core import FileResult, IngestSummary, ingest_logs
from pipeline.ingest.formats import ALL_FORMATS

__all__ = ["ALL_FORMATS", "FileResult", "IngestSummary", "ingest_logs"]
