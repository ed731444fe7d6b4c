-- Fleet cost of a replay: GPUs x the dated on-demand $/GPU-hour of the hardware entry the run was
-- replayed on (the snapshot in its config.json, so a fleet whose hardware is a file path, such
-- as a calibrate output, is priced like a catalog entry; the catalog's entry of that name for a
-- run recorded before the snapshot), per day (the fleet provisioned around the clock) and over
-- the replay's span (first arrival to last finish), and $ per million tokens over that span:
-- recorded input, fresh input and output tokens.
-- params: run_id
WITH cfg AS (
    SELECT resolved.fleet.hardware AS hardware, resolved.fleet.replicas AS replicas,
           resolved.gpus_per_replica AS gpus_per_replica,
           resolved.fleet.replicas * resolved.gpus_per_replica AS gpus
    FROM runs WHERE run_id = getvariable('run_id')
), h AS (
    SELECT coalesce(rh.price_usd_per_gpu_hour, hc.price_usd_per_gpu_hour) AS price_usd_per_gpu_hour,
           CASE WHEN rh.price_usd_per_gpu_hour IS NOT NULL THEN rh.price_date ELSE hc.price_date END AS price_date
    FROM cfg
    LEFT JOIN run_hardware rh ON rh.run_id = getvariable('run_id')
    LEFT JOIN hardware_catalog hc ON hc.name = cfg.hardware
    WHERE coalesce(rh.price_usd_per_gpu_hour, hc.price_usd_per_gpu_hour) IS NOT NULL
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
FROM cfg, h, r;
