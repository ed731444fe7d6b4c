-- Fleet time series of a replay in bins of bin_s seconds (at least 1, chosen so a day has at
-- most about 720 points): fresh prefill and decode tokens/s (mean over the bin, summed over
-- replicas), their 1 s peaks within the bin, running and waiting requests (summed over replicas,
-- mean over the bin) and the KV-cache use of the fullest replica (max over the bin).
-- params: run_id
WITH s AS (
    SELECT * FROM replay_series WHERE run_id = getvariable('run_id')
), bounds AS (
    SELECT greatest(1, CAST(ceil((max(second) - min(second) + 1) / 720.0) AS BIGINT)) AS bin_s FROM s
), per_s AS (
    SELECT second, min(time) AS time, sum(fresh_prefill_tokens_per_s) AS prefill,
           sum(decode_tokens_per_s) AS decode, sum(running) AS running, sum(waiting) AS waiting,
           max(kv_use_fraction) AS kv_use
    FROM s GROUP BY second
)
SELECT min(time) AS time, any_value(bounds.bin_s) AS bin_s,
       sum(prefill) / any_value(bounds.bin_s) AS fresh_prefill_tokens_per_s,
       max(prefill) AS peak_fresh_prefill_tokens_per_s,
       sum(decode) / any_value(bounds.bin_s) AS decode_tokens_per_s,
       max(decode) AS peak_decode_tokens_per_s,
       sum(running) / any_value(bounds.bin_s) AS running,
       sum(waiting) / any_value(bounds.bin_s) AS waiting,
       max(kv_use) AS kv_use_fraction
FROM per_s, bounds
GROUP BY second // bounds.bin_s
ORDER BY time;
