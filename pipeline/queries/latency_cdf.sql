-- Latency CDFs of a replay for plotting: the empirical CDF of TTFT, TPOT and E2E over finished
-- requests, thinned to about 200 points per metric (every sample where the 0.5% grid steps, plus
-- the minimum and maximum); fraction = (rank - 1) / (n - 1).
-- params: run_id
WITH r AS (
    SELECT ttft_s, tpot_s, e2e_s FROM replay_requests
    WHERE run_id = getvariable('run_id') AND status = 'finished'
), m AS (
    UNPIVOT r ON ttft_s, tpot_s, e2e_s INTO NAME metric VALUE v
), ranked AS (
    SELECT metric, v, row_number() OVER (PARTITION BY metric ORDER BY v) AS rn,
           count(*) OVER (PARTITION BY metric) AS n
    FROM m WHERE v IS NOT NULL AND isfinite(v)
)
SELECT metric, CASE WHEN n = 1 THEN 1.0 ELSE (rn - 1) / (n - 1) END AS fraction, v AS seconds
FROM ranked
WHERE rn = 1 OR rn = n OR (rn * 200) // n <> ((rn - 1) * 200) // n
ORDER BY metric, fraction;
