-- Latency percentiles of a replay (vLLM definitions): queue_s = scheduled - arrival,
-- ttft_s = first token - arrival (queueing included), tpot_s = (e2e - ttft) / (output - 1) (what
-- AIPerf and GuideLLM call ITL, per request),
-- e2e_s = last token - arrival, over finished requests; p50/p90/p95/p99/p99.9 by the inverse CDF
-- (quantile_disc: the smallest value with at least p % of the rows at or below it), the mean, and
-- min, max and the sample standard deviation (std). itl_s is the inter-token latency distribution
-- (vLLM's benchmark's ITL)
-- over decode tokens, taken from the engine's step spans (each decode token of a span waits one
-- step of that span); its percentiles are the lower (inverted-CDF) quantiles of that weighted set.
-- params: run_id
WITH r AS (
    SELECT * FROM replay_requests WHERE run_id = getvariable('run_id') AND status = 'finished'
), per_metric AS (
    SELECT metric, samples, q[1] AS p50, q[2] AS p90, q[3] AS p95, q[4] AS p99, q[5] AS p99_9, mean, min, max, std
    FROM (
        SELECT 'queue_s' AS metric, count(queue_s) FILTER (WHERE isfinite(queue_s)) AS samples,
               quantile_disc(queue_s, [0.5, 0.9, 0.95, 0.99, 0.999]) FILTER (WHERE isfinite(queue_s)) AS q,
               avg(queue_s) FILTER (WHERE isfinite(queue_s)) AS mean,
               min(queue_s) FILTER (WHERE isfinite(queue_s)) AS min,
               max(queue_s) FILTER (WHERE isfinite(queue_s)) AS max,
               stddev_samp(queue_s) FILTER (WHERE isfinite(queue_s)) AS std FROM r
        UNION ALL
        SELECT 'ttft_s', count(ttft_s) FILTER (WHERE isfinite(ttft_s)),
               quantile_disc(ttft_s, [0.5, 0.9, 0.95, 0.99, 0.999]) FILTER (WHERE isfinite(ttft_s)),
               avg(ttft_s) FILTER (WHERE isfinite(ttft_s)),
               min(ttft_s) FILTER (WHERE isfinite(ttft_s)), max(ttft_s) FILTER (WHERE isfinite(ttft_s)),
               stddev_samp(ttft_s) FILTER (WHERE isfinite(ttft_s)) FROM r
        UNION ALL
        SELECT 'tpot_s', count(tpot_s) FILTER (WHERE isfinite(tpot_s)),
               quantile_disc(tpot_s, [0.5, 0.9, 0.95, 0.99, 0.999]) FILTER (WHERE isfinite(tpot_s)),
               avg(tpot_s) FILTER (WHERE isfinite(tpot_s)),
               min(tpot_s) FILTER (WHERE isfinite(tpot_s)), max(tpot_s) FILTER (WHERE isfinite(tpot_s)),
               stddev_samp(tpot_s) FILTER (WHERE isfinite(tpot_s)) FROM r
        UNION ALL
        SELECT 'e2e_s', count(e2e_s) FILTER (WHERE isfinite(e2e_s)),
               quantile_disc(e2e_s, [0.5, 0.9, 0.95, 0.99, 0.999]) FILTER (WHERE isfinite(e2e_s)),
               avg(e2e_s) FILTER (WHERE isfinite(e2e_s)),
               min(e2e_s) FILTER (WHERE isfinite(e2e_s)), max(e2e_s) FILTER (WHERE isfinite(e2e_s)),
               stddev_samp(e2e_s) FILTER (WHERE isfinite(e2e_s)) FROM r
    )
    WHERE samples > 0
), itl AS (
    -- Equal step times are merged first: the weighted quantiles only need the distinct values.
    SELECT (end_s - start_s) / steps AS v, sum(CAST(decode_seqs AS DOUBLE) * steps) AS w
    FROM replay_steps WHERE run_id = getvariable('run_id') AND decode_seqs > 0 AND steps > 0
    GROUP BY 1
), itl_cum AS (
    SELECT v, w, sum(w) OVER (ORDER BY v ROWS UNBOUNDED PRECEDING) AS cw, sum(w) OVER () AS tw FROM itl
), itl_stats AS (
    SELECT 'itl_s' AS metric, CAST(max(tw) AS BIGINT) AS samples,
           min(v) FILTER (WHERE cw >= 0.5 * tw) AS p50, min(v) FILTER (WHERE cw >= 0.9 * tw) AS p90,
           min(v) FILTER (WHERE cw >= 0.95 * tw) AS p95, min(v) FILTER (WHERE cw >= 0.99 * tw) AS p99,
           min(v) FILTER (WHERE cw >= 0.999 * tw) AS p99_9, sum(v * w) / sum(w) AS mean,
           min(v) AS min, max(v) AS max,
           -- the weighted standard deviation of the decode tokens' gaps
           sqrt(greatest(sum(v * v * w) / sum(w) - pow(sum(v * w) / sum(w), 2), 0)) AS std
    FROM itl_cum
)
SELECT * FROM per_metric
UNION ALL
SELECT * FROM itl_stats WHERE samples IS NOT NULL
ORDER BY CASE metric WHEN 'queue_s' THEN 0 WHEN 'ttft_s' THEN 1 WHEN 'tpot_s' THEN 2 WHEN 'itl_s' THEN 3 ELSE 4 END;
