-- Fleet cost of a replay: GPUs x the catalog's dated on-demand $/GPU-hour, per day (the fleet
-- provisioned around the clock) and over the replay's span (first arrival to last finish), and
-- $ per million tokens over that span: recorded input, fresh input and output tokens.
-- params: run_id
WITH cfg AS (
    SELECT resolved.fleet.hardware AS hardware, resolved.fleet.replicas AS replicas,
           resolved.gpus_per_replica AS gpus_per_replica,
           resolved.fleet.replicas * resolved.gpus_per_replica AS gpus
    FROM runs WHERE run_id = getvariable('run_id')
), r AS (
    SELECT min(arrival_s) AS t0, max(finish_s) AS t1,
           sum(recorded_input_tokens) AS recorded, sum(fresh_input_tokens) AS fresh,
           sum(output_tokens) AS output
    FROM replay_requests WHERE run_id = getvariable('run_id') AND status = 'finished'
)
SELECT cfg.hardware, cfg.replicas, cfg.gpus, h.price_usd_per_gpu_hour, h.price_date,
       cfg.gpus * h.price_usd_per_gpu_hour * 24 AS usd_per_day,
       r.t1 - r.t0 AS span_s,
       cfg.gpus * h.price_usd_per_gpu_hour * (r.t1 - r.t0) / 3600 AS usd_span,
       (cfg.gpus * h.price_usd_per_gpu_hour * (r.t1 - r.t0) / 3600) / nullif(r.recorded / 1e6, 0) AS usd_per_million_recorded_input_tokens,
       (cfg.gpus * h.price_usd_per_gpu_hour * (r.t1 - r.t0) / 3600) / nullif(r.fresh / 1e6, 0) AS usd_per_million_fresh_input_tokens,
       (cfg.gpus * h.price_usd_per_gpu_hour * (r.t1 - r.t0) / 3600) / nullif(r.output / 1e6, 0) AS usd_per_million_output_tokens,
       (cfg.gpus * h.price_usd_per_gpu_hour * (r.t1 - r.t0) / 3600) / nullif((r.recorded + r.output) / 1e6, 0) AS usd_per_million_tokens
FROM cfg JOIN hardware_catalog h ON h.name = cfg.hardware, r;
