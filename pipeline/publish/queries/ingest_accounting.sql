-- Ingest row accounting per source file (rows read = stored + quarantined + duplicates) and,
-- below, the quarantine reasons with their counts. With date, only the files whose rows went to
-- that date (a report shows its own day's files, not the whole store).
-- params: date?
WITH files AS (
    SELECT * FROM manifest
    WHERE getvariable('date') IS NULL OR list_contains(dates, CAST(getvariable('date') AS VARCHAR))
)
SELECT 'file' AS kind, source_file AS item, source_format, rows_read, rows_stored, rows_quarantined,
       rows_duplicate, CAST(NULL AS VARCHAR) AS reason
FROM files
UNION ALL
SELECT 'quarantine', source_file, source_format, count(*), NULL, count(*), NULL, reason
FROM quarantine WHERE source_file IN (SELECT source_file FROM files)
GROUP BY source_file, source_format, reason
ORDER BY kind, item, reason;
