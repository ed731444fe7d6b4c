-- Fleet cost of a replay: GPUs x the dated on-demand $/GPU-hour of the hardware entry the run was
-- replayed on (the snapshot in its config.json, so a fleet whose hardware is a file path, such
-- as a calibrate output, is priced like a catalog entry; the catalog's entry of that name for a
-- run recorded before the snapshot), per day (the fleet provisioned around the clock) and over
-- the replay's span (first arrival to last finish), and $ per million tokens over that span:
-- recorded input, fresh input and output tokens. A fleet of pools: one row per pool, each pool's
-- GPUs at its own price over the whole run's span, per million of the tokens the pool served
-- (pool is NULL for a fleet of one pool).
-- params: run_id
WITH cfg AS (
    SELECT rh.pool, rh.hardware, rh.replicas, rh.gpus_per_replica, rh.gpus,
           coalesce(rh.price_usd_per_gpu_hour, hc.price_usd_per_gpu_hour) AS price_usd_per_gpu_hour,
           CASE WHEN rh.price_usd_per_gpu_hour IS NOT NULL THEN rh.price_date ELSE hc.price_date END AS price_date
    FROM run_hardware rh
    LEFT JOIN hardware_catalog hc ON hc.name = rh.hardware
    WHERE rh.run_id = getvariable('run_id')
      AND coalesce(rh.price_usd_per_gpu_hour, hc.price_usd_per_gpu_hour) IS NOT NULL
), r AS (
    SELECT pool, min(arrival_s) AS t0, max(finish_s) AS t1,
           sum(recorded_input_tokens) AS recorded, sum(fresh_input_tokens) AS fresh,
           sum(output_tokens) AS output
    FROM replay_requests WHERE run_id = getvariable('run_id') AND status = 'finished'
    GROUP BY pool
), w AS (
    SELECT min(t0) AS t0, max(t1) AS t1 FROM r
)
SELECT cfg.hardware, cfg.replicas, cfg.gpus, cfg.price_usd_per_gpu_hour, cfg.price_date,
       cfg.gpus * cfg.price_usd_per_gpu_hour * 24 AS usd_per_day,
       w.t1 - w.t0 AS span_s,
       cfg.gpus * cfg.price_usd_per_gpu_hour * (w.t1 - w.t0) / 3600 AS usd_span,
       (cfg.gpus * cfg.price_usd_per_gpu_hour * (w.t1 - w.t0) / 3600) / nullif(r.recorded / 1e6, 0) AS usd_per_million_recorded_input_tokens,
       (cfg.gpus * cfg.price_usd_per_gpu_hour * (w.t1 - w.t0) / 3600) / nullif(r.fresh / 1e6, 0) AS usd_per_million_fresh_input_tokens,
       (cfg.gpus * cfg.price_usd_per_gpu_hour * (w.t1 - w.t0) / 3600) / nullif(r.output / 1e6, 0) AS usd_per_million_output_tokens,
       (cfg.gpus * cfg.price_usd_per_gpu_hour * (w.t1 - w.t0) / 3600) / nullif((r.recorded + r.output) / 1e6, 0) AS usd_per_million_tokens,
       cfg.pool
FROM cfg
LEFT JOIN r ON r.pool IS NOT DISTINCT FROM cfg.pool
CROSS JOIN w
ORDER BY cfg.pool NULLS FIRST;
