-- Predicted vs observed: the latencies a replay predicted against those the real fleet's logs
-- carry (requests.ttft_s, requests.e2e_s; observed TPOT = (e2e - ttft) / (output tokens - 1) for
-- outputs of two tokens or more, as pipeline/calibrate/observed.py), per hour of the log (UTC, the logged
-- arrival) and for the whole day (hour = 'all'). Requests are matched by request_id between the
-- store's requests of the run's date and the run's requests (an id twice on either side is left
-- out); matched = requests of the hour in both, unfinished = matched requests the replay rejected
-- or did not finish (never compared), not_compared = finished ones without both values (no observed
-- latency in the log, or the TPOT of a one-token output); p50/p99 by quantile_disc (the project's
-- inverse-CDF percentile) over the same requests on both sides; error = replayed / observed - 1.
-- The report's "Predicted vs observed" section shows these numbers.
-- params: run_id
WITH run AS (
    SELECT CAST(date AS DATE) AS day FROM runs WHERE run_id = getvariable('run_id') LIMIT 1
), logged AS (
    SELECT request_id, arrival, output_tokens, ttft_s, e2e_s FROM requests
    WHERE date = (SELECT day FROM run)
    QUALIFY count(*) OVER (PARTITION BY request_id) = 1
), replayed AS (
    SELECT request_id, status, ttft_s, tpot_s FROM replay_requests
    WHERE run_id = getvariable('run_id')
    QUALIFY count(*) OVER (PARTITION BY request_id) = 1
), m AS (
    SELECT strftime(date_trunc('hour', timezone('UTC', l.arrival)), '%Y-%m-%d %H:00') AS hour,
           coalesce(r.status = 'finished' AND isfinite(r.ttft_s), false) AS finished,
           l.ttft_s AS observed_ttft,
           CASE WHEN l.output_tokens > 1 THEN (l.e2e_s - l.ttft_s) / (l.output_tokens - 1) END AS observed_tpot,
           r.ttft_s AS replayed_ttft, r.tpot_s AS replayed_tpot
    FROM logged l JOIN replayed r USING (request_id)
), long AS (
    SELECT hour, finished, 'ttft_s' AS metric, observed_ttft AS o, replayed_ttft AS p FROM m
    UNION ALL
    SELECT hour, finished, 'tpot_s', observed_tpot, replayed_tpot FROM m
), tagged AS (
    SELECT *, coalesce(finished AND isfinite(o) AND isfinite(p), false) AS ok FROM long
), g AS (
    SELECT coalesce(hour, 'all') AS hour, metric,
           count(*) AS matched,
           count(*) FILTER (WHERE NOT finished) AS unfinished,
           count(*) FILTER (WHERE finished AND NOT ok) AS not_compared,
           count(*) FILTER (WHERE ok) AS samples,
           quantile_disc(o, 0.5) FILTER (WHERE ok) AS observed_p50_s,
           quantile_disc(p, 0.5) FILTER (WHERE ok) AS replayed_p50_s,
           quantile_disc(o, 0.99) FILTER (WHERE ok) AS observed_p99_s,
           quantile_disc(p, 0.99) FILTER (WHERE ok) AS replayed_p99_s
    FROM tagged
    GROUP BY GROUPING SETS ((hour, metric), (metric))
)
SELECT hour, metric, matched, unfinished, not_compared, samples,
       observed_p50_s, replayed_p50_s,
       CASE WHEN observed_p50_s > 0 THEN replayed_p50_s / observed_p50_s - 1 END AS p50_error,
       observed_p99_s, replayed_p99_s,
       CASE WHEN observed_p99_s > 0 THEN replayed_p99_s / observed_p99_s - 1 END AS p99_error
FROM g
ORDER BY hour = 'all', hour, CASE metric WHEN 'ttft_s' THEN 0 ELSE 1 END;
