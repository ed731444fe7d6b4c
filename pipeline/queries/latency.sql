-- Latency percentiles of a replay (vLLM definitions): queue_s = scheduled - arrival,
-- ttft_s = first token - arrival (queueing included), tpot_s = (e2e - ttft) / (output - 1),
-- e2e_s = last token - arrival, over finished requests; p50/p90/p95/p99/p99.9 by linear
-- interpolation (numpy's default) and the mean. itl_s is the inter-token latency distribution
-- over decode tokens, taken from the engine's step spans (each decode token of a span waits one
-- step of that span); its percentiles are the lower (inverted-CDF) quantiles of that weighted set.
-- params: run_id
WITH r AS (
    SELECT * FROM replay_requests WHERE run_id = getvariable('run_id') AND status = 'finished'
), m AS (
    UNPIVOT (SELECT queue_s, ttft_s, tpot_s, e2e_s FROM r)
    ON queue_s, ttft_s, tpot_s, e2e_s INTO NAME metric VALUE v
), per_metric AS (
    SELECT metric, count(v) AS samples,
           quantile_cont(v, 0.5) AS p50, quantile_cont(v, 0.9) AS p90, quantile_cont(v, 0.95) AS p95,
           quantile_cont(v, 0.99) AS p99, quantile_cont(v, 0.999) AS p99_9, avg(v) AS mean
    FROM m WHERE v IS NOT NULL AND isfinite(v) GROUP BY metric
), itl AS (
    SELECT (end_s - start_s) / steps AS v, CAST(decode_seqs AS DOUBLE) * steps AS w
    FROM replay_steps WHERE run_id = getvariable('run_id') AND decode_seqs > 0 AND steps > 0
), itl_cum AS (
    SELECT v, w, sum(w) OVER (ORDER BY v ROWS UNBOUNDED PRECEDING) AS cw, sum(w) OVER () AS tw FROM itl
), itl_stats AS (
    SELECT 'itl_s' AS metric, CAST(max(tw) AS BIGINT) AS samples,
           min(v) FILTER (WHERE cw >= 0.5 * tw) AS p50, min(v) FILTER (WHERE cw >= 0.9 * tw) AS p90,
           min(v) FILTER (WHERE cw >= 0.95 * tw) AS p95, min(v) FILTER (WHERE cw >= 0.99 * tw) AS p99,
           min(v) FILTER (WHERE cw >= 0.999 * tw) AS p99_9, sum(v * w) / sum(w) AS mean
    FROM itl_cum
)
SELECT * FROM per_metric
UNION ALL
SELECT * FROM itl_stats WHERE samples IS NOT NULL
ORDER BY CASE metric WHEN 'queue_s' THEN 0 WHEN 'ttft_s' THEN 1 WHEN 'tpot_s' THEN 2 WHEN 'itl_s' THEN 3 ELSE 4 END;
