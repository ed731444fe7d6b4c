-- Latency CDFs of a replay for plotting: TTFT, TPOT and E2E at 201 evenly spaced quantiles
-- (fraction 0, 0.005, ..., 1; inverse CDF: the smallest value with at least that share of the
-- requests at or below it) over finished requests.
-- params: run_id
WITH r AS (
    SELECT ttft_s, tpot_s, e2e_s FROM replay_requests
    WHERE run_id = getvariable('run_id') AND status = 'finished'
), q AS (
    SELECT 'ttft_s' AS metric,
           quantile_disc(ttft_s, list_transform(range(0, 201), lambda x: x / 200.0)) FILTER (WHERE isfinite(ttft_s)) AS v
    FROM r
    UNION ALL
    SELECT 'tpot_s', quantile_disc(tpot_s, list_transform(range(0, 201), lambda x: x / 200.0)) FILTER (WHERE isfinite(tpot_s))
    FROM r
    UNION ALL
    SELECT 'e2e_s', quantile_disc(e2e_s, list_transform(range(0, 201), lambda x: x / 200.0)) FILTER (WHERE isfinite(e2e_s))
    FROM r
)
SELECT metric, (i - 1) / 200.0 AS fraction, v[i] AS seconds
FROM q, range(1, 202) t(i)
WHERE v IS NOT NULL
ORDER BY metric, fraction;
