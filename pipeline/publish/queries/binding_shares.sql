-- Share of engine busy time bound by each resource (compute, memory, communication, overhead)
-- in a replay, per replica and over the fleet, from the step spans' binding attribution.
-- params: run_id
WITH s AS (
    SELECT replica, binding, sum(end_s - start_s) AS busy_s, sum(steps) AS steps
    FROM replay_steps WHERE run_id = getvariable('run_id') GROUP BY ALL
)
SELECT CAST(replica AS VARCHAR) AS replica, binding, busy_s, steps,
       busy_s / sum(busy_s) OVER (PARTITION BY replica) AS share
FROM s
UNION ALL
SELECT 'fleet', binding, sum(busy_s), sum(steps), sum(busy_s) / (SELECT sum(busy_s) FROM s)
FROM s GROUP BY binding
ORDER BY replica, binding;
