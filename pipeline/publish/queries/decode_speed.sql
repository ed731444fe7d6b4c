-- Per-user decode speed of a replay: 1 / tpot_s (tokens/s seen by one request), percentiles over
-- finished requests with at least two output tokens (inverse CDF, as every percentile here). Low percentiles are
-- the slow users.
-- params: run_id
WITH s AS (
    SELECT 1.0 / tpot_s AS v FROM replay_requests
    WHERE run_id = getvariable('run_id') AND status = 'finished' AND tpot_s > 0
)
SELECT count(*) AS samples, quantile_disc(v, 0.001) AS p0_1, quantile_disc(v, 0.01) AS p1,
       quantile_disc(v, 0.05) AS p5, quantile_disc(v, 0.1) AS p10, quantile_disc(v, 0.5) AS p50,
       avg(v) AS mean
FROM s;
