-- Self-hosted GPU cost split by token class: busy GPU time attributed to fresh input (prefill rows),
-- cache hits (their share of attention KV reads) and output (decode rows), idle time spread pro rata,
-- as $ and $ per million tokens. subject is a plan id or replay run id (default: the one priced last).
-- params: subject?
SELECT token_class, tokens, busy_share, busy_usd, all_in_usd, busy_usd_per_million_tokens,
       all_in_usd_per_million_tokens, hardware, gpus, usd_per_gpu_hour, price_date, period_s, subject
FROM gpu_cost
WHERE subject = coalesce(getvariable('subject'), (SELECT max(subject) FROM gpu_cost))
ORDER BY token_class;
