-- KV-cache memory of a replay per replica: the peak KV blocks in use (over engine step spans),
-- the p99 over one-second samples, the capacity the memory fit left for KV, and the headroom
-- (1 - peak / capacity), in blocks and bytes. The 'fleet' row is the worst replica: the highest
-- peak and p99 of any replica. A fleet of pools: each replica against its own pool's capacity,
-- a 'pool NAME' row per pool (its replicas' highest peak and p99), and the 'fleet' row is the
-- pool row with the least headroom.
-- params: run_id
WITH cfg AS (
    SELECT pool, first_replica, first_replica + ranks AS end_replica, kv_capacity_blocks AS capacity_blocks,
           kv_pool_bytes_per_gpu * gpus_per_replica AS capacity_bytes
    FROM run_hardware WHERE run_id = getvariable('run_id')
), peak AS (
    SELECT replica, max(kv_blocks_used) AS peak_blocks
    FROM replay_steps WHERE run_id = getvariable('run_id') GROUP BY replica
), p99 AS (
    SELECT replica, quantile_disc(kv_blocks_used, 0.99) AS p99_blocks
    FROM replay_series WHERE run_id = getvariable('run_id') GROUP BY replica
), rep AS (
    SELECT peak.replica, peak_blocks, p99_blocks, cfg.pool, capacity_blocks, capacity_bytes
    FROM peak LEFT JOIN p99 USING (replica)
    JOIN cfg ON peak.replica >= cfg.first_replica AND peak.replica < cfg.end_replica
), pools AS (
    SELECT CASE WHEN pool IS NULL THEN 'fleet' ELSE 'pool ' || pool END AS replica,
           max(peak_blocks) AS peak_blocks, max(p99_blocks) AS p99_blocks,
           any_value(capacity_blocks) AS capacity_blocks, any_value(capacity_bytes) AS capacity_bytes,
           pool IS NOT NULL AS pooled
    FROM rep GROUP BY pool
), per AS (
    SELECT CAST(replica AS VARCHAR) AS replica, peak_blocks, p99_blocks, capacity_blocks, capacity_bytes FROM rep
    UNION ALL
    SELECT replica, peak_blocks, p99_blocks, capacity_blocks, capacity_bytes FROM pools
    UNION ALL
    SELECT 'fleet', peak_blocks, p99_blocks, capacity_blocks, capacity_bytes
    FROM (SELECT * FROM pools WHERE pooled ORDER BY 1 - peak_blocks / capacity_blocks, replica LIMIT 1)
)
SELECT replica, peak_blocks, p99_blocks, capacity_blocks,
       peak_blocks * capacity_bytes / capacity_blocks AS peak_bytes,
       p99_blocks * capacity_bytes / capacity_blocks AS p99_bytes,
       capacity_bytes,
       1 - peak_blocks / capacity_blocks AS headroom
FROM per
ORDER BY replica = 'fleet', replica LIKE 'pool %', replica;
