-- TTFT, TPOT and E2E percentiles (p50/p90/p95/p99/p99.9 by the inverse CDF), the mean, min, max and
-- the sample standard deviation (std) of a replay by prompt-length bucket (recorded input tokens),
-- output-length bucket, batch occupancy (sequences running on the request's replica in the second
-- it was scheduled), tenant, model, hardware (each pool's, for a fleet of pools) and hour of arrival.
-- params: run_id
WITH run AS (
    -- each pool's hardware (a fleet of one pool: one row, pool NULL)
    SELECT pool, hardware || ' tp' || tp AS hardware
    FROM run_hardware WHERE run_id = getvariable('run_id')
), occ AS (
    SELECT replica, second, running FROM replay_series WHERE run_id = getvariable('run_id')
), r AS (
    SELECT rr.ttft_s, rr.tpot_s, rr.e2e_s,
           coalesce(q.tenant, '(none)') AS tenant, coalesce(q.model, '(none)') AS model,
           CASE WHEN rr.recorded_input_tokens < 512 THEN '0-511'
                WHEN rr.recorded_input_tokens < 2048 THEN '512-2047'
                WHEN rr.recorded_input_tokens < 8192 THEN '2048-8191'
                WHEN rr.recorded_input_tokens < 32768 THEN '8192-32767'
                ELSE '32768+' END AS prompt_tokens,
           CASE WHEN rr.output_tokens < 64 THEN '0-63'
                WHEN rr.output_tokens < 256 THEN '64-255'
                WHEN rr.output_tokens < 1024 THEN '256-1023'
                ELSE '1024+' END AS output_tokens,
           CASE WHEN occ.running IS NULL THEN 'unknown'
                WHEN occ.running < 8 THEN '0-7' WHEN occ.running < 32 THEN '8-31'
                WHEN occ.running < 128 THEN '32-127' ELSE '128+' END AS batch_occupancy,
           run.hardware AS hardware,
           strftime(rr.arrival, '%H') AS hour
    FROM replay_requests rr
    LEFT JOIN requests q ON q.request_id = rr.request_id AND q.arrival = rr.arrival
    LEFT JOIN occ ON occ.replica = rr.replica AND occ.second = CAST(floor(rr.scheduled_s) AS BIGINT)
    LEFT JOIN run ON run.pool IS NOT DISTINCT FROM rr.pool
    WHERE rr.run_id = getvariable('run_id') AND rr.status = 'finished'
), g AS (
    -- One pass per dimension (grouping sets), one sort per metric and group (list quantiles).
    SELECT prompt_tokens, output_tokens, batch_occupancy, tenant, model, hardware, hour,
           GROUPING(prompt_tokens) = 0 AS by_prompt, GROUPING(output_tokens) = 0 AS by_output,
           GROUPING(batch_occupancy) = 0 AS by_occ, GROUPING(tenant) = 0 AS by_tenant,
           GROUPING(model) = 0 AS by_model, GROUPING(hardware) = 0 AS by_hw,
           count(ttft_s) FILTER (WHERE isfinite(ttft_s)) AS n_ttft,
           quantile_disc(ttft_s, [0.5, 0.9, 0.95, 0.99, 0.999]) FILTER (WHERE isfinite(ttft_s)) AS q_ttft,
           avg(ttft_s) FILTER (WHERE isfinite(ttft_s)) AS m_ttft,
           min(ttft_s) FILTER (WHERE isfinite(ttft_s)) AS lo_ttft, max(ttft_s) FILTER (WHERE isfinite(ttft_s)) AS hi_ttft,
           stddev_samp(ttft_s) FILTER (WHERE isfinite(ttft_s)) AS sd_ttft,
           count(tpot_s) FILTER (WHERE isfinite(tpot_s)) AS n_tpot,
           quantile_disc(tpot_s, [0.5, 0.9, 0.95, 0.99, 0.999]) FILTER (WHERE isfinite(tpot_s)) AS q_tpot,
           avg(tpot_s) FILTER (WHERE isfinite(tpot_s)) AS m_tpot,
           min(tpot_s) FILTER (WHERE isfinite(tpot_s)) AS lo_tpot, max(tpot_s) FILTER (WHERE isfinite(tpot_s)) AS hi_tpot,
           stddev_samp(tpot_s) FILTER (WHERE isfinite(tpot_s)) AS sd_tpot,
           count(e2e_s) FILTER (WHERE isfinite(e2e_s)) AS n_e2e,
           quantile_disc(e2e_s, [0.5, 0.9, 0.95, 0.99, 0.999]) FILTER (WHERE isfinite(e2e_s)) AS q_e2e,
           avg(e2e_s) FILTER (WHERE isfinite(e2e_s)) AS m_e2e,
           min(e2e_s) FILTER (WHERE isfinite(e2e_s)) AS lo_e2e, max(e2e_s) FILTER (WHERE isfinite(e2e_s)) AS hi_e2e,
           stddev_samp(e2e_s) FILTER (WHERE isfinite(e2e_s)) AS sd_e2e
    FROM r
    GROUP BY GROUPING SETS ((prompt_tokens), (output_tokens), (batch_occupancy), (tenant), (model), (hardware), (hour))
), labelled AS (
    SELECT CASE WHEN by_prompt THEN 'prompt_tokens' WHEN by_output THEN 'output_tokens'
                WHEN by_occ THEN 'batch_occupancy' WHEN by_tenant THEN 'tenant' WHEN by_model THEN 'model'
                WHEN by_hw THEN 'hardware' ELSE 'hour' END AS dimension,
           CASE WHEN by_prompt THEN prompt_tokens WHEN by_output THEN output_tokens
                WHEN by_occ THEN batch_occupancy WHEN by_tenant THEN tenant WHEN by_model THEN model
                WHEN by_hw THEN hardware ELSE hour END AS bucket,
           *
    FROM g
), m AS (
    SELECT dimension, bucket, 'ttft_s' AS metric, n_ttft AS samples, q_ttft AS q, m_ttft AS mean,
           lo_ttft AS min, hi_ttft AS max, sd_ttft AS std FROM labelled
    UNION ALL SELECT dimension, bucket, 'tpot_s', n_tpot, q_tpot, m_tpot, lo_tpot, hi_tpot, sd_tpot FROM labelled
    UNION ALL SELECT dimension, bucket, 'e2e_s', n_e2e, q_e2e, m_e2e, lo_e2e, hi_e2e, sd_e2e FROM labelled
)
SELECT dimension, bucket, metric, samples,
       q[1] AS p50, q[2] AS p90, q[3] AS p95, q[4] AS p99, q[5] AS p99_9, mean, min, max, std
FROM m WHERE samples > 0
ORDER BY dimension, bucket, metric;
