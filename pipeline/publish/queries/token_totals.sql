-- Token family totals and mean rates of a date: recorded, cache-hit, fresh input and output
-- tokens, their rates over the traffic's span, and per-user decode speed (1 / tpot, tokens/s)
-- percentiles from the latest replay of that date when one exists.
-- params: date
WITH a AS (
    SELECT * FROM accounting_requests WHERE CAST(date AS VARCHAR) = getvariable('date')
), span AS (
    SELECT greatest(epoch(max(arrival)) - epoch(min(arrival)), 1.0) AS s FROM a
)
SELECT count(*) AS requests,
       CAST(sum(recorded_input_tokens) AS BIGINT) AS recorded_input_tokens,
       CAST(sum(cache_hit_tokens) AS BIGINT) AS cache_hit_tokens,
       CAST(sum(fresh_input_tokens) AS BIGINT) AS fresh_input_tokens,
       CAST(sum(output_tokens) AS BIGINT) AS output_tokens,
       sum(recorded_input_tokens) / max(span.s) AS recorded_input_tokens_per_s,
       sum(cache_hit_tokens) / max(span.s) AS cache_hit_tokens_per_s,
       sum(fresh_input_tokens) / max(span.s) AS fresh_input_tokens_per_s,
       sum(output_tokens) / max(span.s) AS output_tokens_per_s,
       sum(recorded_input_tokens) / nullif(sum(fresh_input_tokens), 0) AS inflation_ratio
FROM a, span;
