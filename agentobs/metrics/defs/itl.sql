-- metric: itl
-- summary: Inter-token latency percentiles over the per-chunk gaps of streamed calls (no attribution)
-- section: METRICS.md §6
-- definition: The inter-token gaps of streamed calls (llm_calls.itl_ms, one value per gap between output
--   chunks) of calls starting in the window: count, p50/p90/p99 (linear interpolation), max and mean, and the
--   gaps above itl_slo_ms. The same gaps and the same p50/p99 as itl_tail's per-chunk rows (which add the tail
--   attribution to co-scheduled prefills); by session/task the calls' own session/task (itl_tail's are the
--   offenders'). Calls without per-chunk data are not in it (itl_tail's coarse_histogram rows cover those).
-- unit: milliseconds (gaps), ratio 0–1 (share over the SLO)
-- grain: one row per group (default: instance)
-- sources: llm_calls (itl_ms, ttft_s)
-- by: instance, model, task_type, session, task
-- the cheap half of §6 (no gap is placed in time, no prefill is joined): what the console's Overview shows as
-- "ITL p99" per model; the tail attribution is itl_tail
WITH g AS (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type
                    WHEN 'session' THEN session_id WHEN 'task' THEN task_id END AS grp,
           call_id, unnest(itl_ms) AS g_ms
    FROM m_calls
    WHERE in_filter AND in_win AND itl_ms IS NOT NULL AND ttft_s IS NOT NULL AND len(itl_ms) > 0
)
SELECT grp,
       CAST(count(*) AS BIGINT) AS gaps,
       CAST(count(DISTINCT call_id) AS BIGINT) AS calls,
       quantile_cont(g_ms, 0.5) AS p50_ms,
       quantile_cont(g_ms, 0.9) AS p90_ms,
       quantile_cont(g_ms, 0.99) AS p99_ms,
       max(g_ms) AS max_ms,
       avg(g_ms) AS mean_ms,
       CAST(count(*) FILTER (WHERE g_ms > $itl_slo_ms) AS BIGINT) AS gaps_over_slo,
       count(*) FILTER (WHERE g_ms > $itl_slo_ms) / count(*) AS share_over_slo
FROM g
GROUP BY grp
ORDER BY grp
