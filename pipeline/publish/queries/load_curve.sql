-- Headroom of a run: p50/p99 TTFT and TPOT of its traffic replayed at several multipliers of
-- today's arrival rate (same requests, closer in time), with rejections, overload and the SLO
-- verdict per point; status 'skipped' = not computed within the nightly's time budget.
-- params: run_id
SELECT multiplier, status, requests, finished, rejected,
       ttft_p50_s, ttft_p99_s, tpot_p50_s, tpot_p99_s,
       slo, slo_passed, slo_worst_ratio, goodput, overloaded
FROM load_curve
WHERE run_id = getvariable('run_id')
ORDER BY multiplier;
