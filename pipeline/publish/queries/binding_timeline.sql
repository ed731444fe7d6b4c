-- Binding resource over time: for each minute of a replay, the engine busy seconds (summed over
-- replicas) bound by compute, memory, communication or overhead, attributed to the minute in
-- which each step span starts.
-- params: run_id
WITH t0 AS (
    SELECT min(time) - to_seconds(min(second)) AS t0 FROM replay_series WHERE run_id = getvariable('run_id')
)
SELECT t0.t0 + to_seconds(CAST(floor(start_s / 60) * 60 AS BIGINT)) AS minute, binding,
       sum(end_s - start_s) AS busy_s
FROM replay_steps, t0
WHERE run_id = getvariable('run_id')
GROUP BY ALL
ORDER BY minute, binding;
