-- Pareto front of a capacity plan: configurations no other one beats on both $/day and p99 TTFT
-- (the cost-latency trade-off to choose from). plan_id defaults to the plan written last.
-- params: plan_id?
SELECT config, gpus, replicas, usd_per_day, ttft_p99_s, tpot_p99_s, slo_headroom, binding
FROM plans
WHERE plan_id = coalesce(getvariable('plan_id'), (SELECT max(plan_id) FROM plans)) AND pareto
ORDER BY usd_per_day;
