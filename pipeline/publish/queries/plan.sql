-- Capacity plan: every configuration tried, cheapest first, with the minimum replicas meeting the
-- SLO, the p99s achieved, utilization, headroom, binding resource, $/day and $ per million tokens.
-- plan_id defaults to the plan written last (of the given date and model, when given:
-- a report shows only a plan made for its own traffic).
-- params: plan_id?, date?, model?
WITH scope AS (
    SELECT * FROM plans
    WHERE (getvariable('date') IS NULL OR CAST(date AS VARCHAR) = CAST(getvariable('date') AS VARCHAR))
      AND (getvariable('model') IS NULL OR model = getvariable('model'))
)
SELECT rank, config, gpus, replicas, ttft_p99_s, tpot_p99_s, e2e_p99_s, utilization, slo_headroom,
       prefill_utilization, decode_utilization, kv_peak_fraction, binding, usd_per_gpu_hour, price_date,
       usd_per_day, usd_per_million_tokens, usd_per_million_fresh_input_tokens,
       usd_per_million_cache_hit_tokens, usd_per_million_output_tokens, pareto, one_fewer_meets_slo,
       replays, note, plan_id, slo, "window", date, model
FROM scope
WHERE plan_id = coalesce(getvariable('plan_id'), (SELECT max(plan_id) FROM scope))
ORDER BY rank NULLS LAST, config;
