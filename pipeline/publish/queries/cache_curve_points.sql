-- The prefix-cache capacity curve of a date for plotting: per model, cache capacity (tokens) vs
-- the cache-hit fraction of input tokens and of blocks, from the classify stage's one-pass LRU
-- stack-distance curve (capacities above zero).
-- params: date
SELECT model, capacity_tokens, token_hit_fraction, block_hit_fraction, peak_fresh_input_tokens_per_s
FROM cache_curve
WHERE CAST(date AS VARCHAR) = getvariable('date') AND capacity_tokens > 0
ORDER BY model, capacity_tokens;
