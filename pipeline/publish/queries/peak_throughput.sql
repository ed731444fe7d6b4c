-- Peak fresh prefill and aggregate decode throughput of a replay (tokens/s actually processed by
-- the fleet, summed over replicas), over 1 s and 1 min windows, with the window's start time.
-- A 1 min window's rate is its tokens / 60 s (idle seconds count as zero).
-- params: run_id
WITH per_s AS (
    SELECT second, min(time) AS time,
           sum(fresh_prefill_tokens_per_s) AS prefill, sum(decode_tokens_per_s) AS decode
    FROM replay_series WHERE run_id = getvariable('run_id') GROUP BY second
), per_min AS (
    SELECT second // 60 AS minute, min(time) AS time,
           sum(prefill) / 60.0 AS prefill, sum(decode) / 60.0 AS decode
    FROM per_s GROUP BY 1
)
SELECT 'fresh_prefill' AS metric, '1s' AS "window", arg_max(time, prefill) AS at, max(prefill) AS tokens_per_s FROM per_s
UNION ALL
SELECT 'fresh_prefill', '1min', arg_max(time, prefill), max(prefill) FROM per_min
UNION ALL
SELECT 'decode', '1s', arg_max(time, decode), max(decode) FROM per_s
UNION ALL
SELECT 'decode', '1min', arg_max(time, decode), max(decode) FROM per_min
ORDER BY metric DESC, "window" DESC;
