-- KV-cache memory of a replay per replica: the peak KV blocks in use (over engine step spans),
-- the p99 over one-second samples, the capacity the memory fit left for KV, and the headroom
-- (1 - peak / capacity), in blocks and bytes. The 'fleet' row is the worst replica.
-- params: run_id
WITH cfg AS (
    SELECT resolved.memory.kv_capacity_blocks AS capacity_blocks,
           resolved.memory.kv_pool_bytes_per_gpu * resolved.gpus_per_replica AS capacity_bytes
    FROM runs WHERE run_id = getvariable('run_id')
), peak AS (
    SELECT replica, max(kv_blocks_used) AS peak_blocks
    FROM replay_steps WHERE run_id = getvariable('run_id') GROUP BY replica
), p99 AS (
    SELECT replica, quantile_disc(kv_blocks_used, 0.99) AS p99_blocks
    FROM replay_series WHERE run_id = getvariable('run_id') GROUP BY replica
), per AS (
    SELECT CAST(peak.replica AS VARCHAR) AS replica, peak_blocks, p99_blocks
    FROM peak LEFT JOIN p99 USING (replica)
    UNION ALL
    SELECT 'fleet', (SELECT max(peak_blocks) FROM peak), (SELECT max(p99_blocks) FROM p99)
)
SELECT replica, peak_blocks, p99_blocks, capacity_blocks,
       peak_blocks * capacity_bytes / capacity_blocks AS peak_bytes,
       p99_blocks * capacity_bytes / capacity_blocks AS p99_bytes,
       capacity_bytes,
       1 - peak_blocks / capacity_blocks AS headroom
FROM per, cfg
ORDER BY replica = 'fleet', replica;
