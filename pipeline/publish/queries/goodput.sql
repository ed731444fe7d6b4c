-- Goodput of a replay: requests per second (over the replay's span) that finished and met every
-- SLO given (ttft_slo_s, tpot_slo_s, e2e_slo_s; an SLO not given is not checked), beside the
-- plain throughput and the share of requests meeting the SLOs.
-- params: run_id, ttft_slo_s?, tpot_slo_s?, e2e_slo_s?
WITH r AS (
    SELECT * FROM replay_requests WHERE run_id = getvariable('run_id')
), span AS (
    SELECT greatest(max(finish_s) - min(arrival_s), 1e-9) AS s FROM r WHERE status = 'finished'
), ok AS (
    SELECT *, status = 'finished'
        AND (getvariable('ttft_slo_s') IS NULL OR ttft_s <= getvariable('ttft_slo_s'))
        AND (getvariable('tpot_slo_s') IS NULL OR tpot_s IS NULL OR tpot_s <= getvariable('tpot_slo_s'))
        AND (getvariable('e2e_slo_s') IS NULL OR e2e_s <= getvariable('e2e_slo_s')) AS meets
    FROM r
)
SELECT count(*) AS requests,
       count(*) FILTER (WHERE status = 'finished') AS finished,
       count(*) FILTER (WHERE meets) AS meeting_slo,
       count(*) FILTER (WHERE meets) / count(*) AS slo_attainment,
       count(*) FILTER (WHERE status = 'finished') / max(span.s) AS throughput_requests_per_s,
       count(*) FILTER (WHERE meets) / max(span.s) AS goodput_requests_per_s,
       getvariable('ttft_slo_s') AS ttft_slo_s, getvariable('tpot_slo_s') AS tpot_slo_s,
       getvariable('e2e_slo_s') AS e2e_slo_s
FROM ok, span;
