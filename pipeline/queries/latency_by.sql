-- TTFT, TPOT and E2E percentiles (p50/p90/p95/p99/p99.9 and mean, linear interpolation) of a
-- replay by prompt-length bucket (recorded input tokens), output-length bucket, batch occupancy
-- (sequences running on the request's replica in the second it was scheduled), tenant, model,
-- hardware pool and hour of arrival.
-- params: run_id
WITH run AS (
    SELECT resolved.fleet.hardware AS hardware, resolved.fleet.tp AS tp FROM runs WHERE run_id = getvariable('run_id')
), occ AS (
    SELECT replica, second, running FROM replay_series WHERE run_id = getvariable('run_id')
), r AS (
    SELECT rr.*, q.tenant, q.model,
           CASE WHEN rr.recorded_input_tokens < 512 THEN '0-511'
                WHEN rr.recorded_input_tokens < 2048 THEN '512-2047'
                WHEN rr.recorded_input_tokens < 8192 THEN '2048-8191'
                WHEN rr.recorded_input_tokens < 32768 THEN '8192-32767'
                ELSE '32768+' END AS prompt_bucket,
           CASE WHEN rr.output_tokens < 64 THEN '0-63'
                WHEN rr.output_tokens < 256 THEN '64-255'
                WHEN rr.output_tokens < 1024 THEN '256-1023'
                ELSE '1024+' END AS output_bucket,
           CASE WHEN occ.running IS NULL THEN 'unknown'
                WHEN occ.running < 8 THEN '0-7' WHEN occ.running < 32 THEN '8-31'
                WHEN occ.running < 128 THEN '32-127' ELSE '128+' END AS occupancy_bucket,
           strftime(rr.arrival, '%H') AS hour
    FROM replay_requests rr
    LEFT JOIN requests q ON q.request_id = rr.request_id AND q.arrival = rr.arrival
    LEFT JOIN occ ON occ.replica = rr.replica AND occ.second = CAST(floor(rr.scheduled_s) AS BIGINT)
    WHERE rr.run_id = getvariable('run_id') AND rr.status = 'finished'
), dims AS (
    SELECT 'prompt_tokens' AS dimension, prompt_bucket AS bucket, * FROM r
    UNION ALL SELECT 'output_tokens', output_bucket, * FROM r
    UNION ALL SELECT 'batch_occupancy', occupancy_bucket, * FROM r
    UNION ALL SELECT 'tenant', coalesce(tenant, '(none)'), * FROM r
    UNION ALL SELECT 'model', coalesce(model, '(none)'), * FROM r
    UNION ALL SELECT 'hardware', (SELECT hardware || ' tp' || tp FROM run), * FROM r
    UNION ALL SELECT 'hour', hour, * FROM r
), m AS (
    UNPIVOT (SELECT dimension, bucket, ttft_s, tpot_s, e2e_s FROM dims)
    ON ttft_s, tpot_s, e2e_s INTO NAME metric VALUE v
)
SELECT dimension, bucket, metric, count(v) AS samples,
       quantile_cont(v, 0.5) AS p50, quantile_cont(v, 0.9) AS p90, quantile_cont(v, 0.95) AS p95,
       quantile_cont(v, 0.99) AS p99, quantile_cont(v, 0.999) AS p99_9, avg(v) AS mean
FROM m WHERE v IS NOT NULL AND isfinite(v)
GROUP BY dimension, bucket, metric
ORDER BY dimension, bucket, metric;
