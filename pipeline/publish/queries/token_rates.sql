-- The token family per minute of a date (docs/architecture.md, vocabulary), over all traffic: recorded input,
-- cache-hit input and fresh input rates (tokens/s of wall time), output rate, and the
-- recorded/fresh inflation ratio. Cache hits are as classified (reported when the log has them,
-- else simulated).
-- params: date
SELECT minute, requests,
       recorded_input_tokens_per_s, cache_hit_tokens_per_s, fresh_input_tokens_per_s,
       output_tokens_per_s, inflation_ratio
FROM accounting_minutes
WHERE scope = 'all' AND CAST(date AS VARCHAR) = getvariable('date')
ORDER BY minute;
