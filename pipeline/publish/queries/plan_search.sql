-- Every replay a capacity plan's replica search ran, per configuration: replicas, whether the SLO
-- was met, the target furthest over its limit and the p99s (shows n meets and n - 1 misses).
-- params: plan_id?
SELECT config, replicas, meets_slo, failing, slo_worst_ratio, ttft_p99_s, tpot_p99_s, e2e_p99_s,
       queue_p99_s, utilization, kv_peak_fraction, preemptions, rejected_kv, cache_hit_fraction
FROM plan_search
WHERE plan_id = coalesce(getvariable('plan_id'), (SELECT max(plan_id) FROM plan_search))
ORDER BY config, replicas;
