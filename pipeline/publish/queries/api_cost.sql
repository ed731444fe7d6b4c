-- API-equivalent cost of the same traffic on dated provider price tables (fresh input, cache
-- writes, cache hits at the cached-input price, output) beside the self-hosted fleet cost, and the
-- self-host / API ratio. subject is a plan id or replay run id (default: the one priced last).
-- params: subject?
SELECT provider, api_model, price_date, price_stale, api_usd, self_host_usd, self_host_to_api_ratio,
       fresh_input_usd, cache_write_usd, cache_hit_usd, output_usd, fresh_input_tokens,
       cache_write_tokens, cache_hit_tokens, output_tokens, period_s, price_source, subject
FROM api_cost
WHERE subject = coalesce(getvariable('subject'), (SELECT max(subject) FROM api_cost))
ORDER BY api_usd;
