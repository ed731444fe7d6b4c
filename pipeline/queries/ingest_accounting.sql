-- Ingest row accounting per source file (rows read = stored + quarantined + duplicates) and,
-- below, the quarantine reasons with their counts.
SELECT 'file' AS kind, source_file AS item, source_format, rows_read, rows_stored, rows_quarantined,
       rows_duplicate, CAST(NULL AS VARCHAR) AS reason
FROM manifest
UNION ALL
SELECT 'quarantine', source_file, source_format, count(*), NULL, count(*), NULL, reason
FROM quarantine GROUP BY source_file, source_format, reason
ORDER BY kind, item, reason;
