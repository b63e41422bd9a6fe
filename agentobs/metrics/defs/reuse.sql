-- metric: reuse
-- summary: Session hit rate H = ΣC/ΣP and reuse hit rate U = ΣC/ΣR_eff, per session or as distributions per group
-- section: METRICS.md §1–2
-- definition: Session hit rate H = ΣC / ΣP (calls whose C is known) and reuse hit rate U = ΣC / ΣR_eff over
--   calls 2…n whose R_eff and C are known (not cold, not a context reset): the share of what could have been
--   reused that was. Per session, or per group with the distribution of its sessions' H and U (p10/p50/p90).
-- unit: ratio 0–1 (hit_rate, reuse_hit_rate); tokens (sums)
-- grain: one row per group (default: one per session); groups by instance/model split a session's calls
-- sources: call_reuse (llm_calls, instance_config, kv_events); calls starting in [since, until)
-- by: session, task, instance, model, task_type, session_length
WITH base AS (
    SELECT *, count(*) OVER (PARTITION BY session_id) AS session_calls
    FROM m_calls
    WHERE in_win AND session_id IS NOT NULL
),
g AS (
    SELECT CASE $by WHEN 'session' THEN session_id WHEN 'task' THEN task_id WHEN 'instance' THEN instance
                    WHEN 'model' THEN model WHEN 'task_type' THEN task_type
                    WHEN 'session_length' THEN CASE WHEN session_calls = 1 THEN '1 call'
                                                    WHEN session_calls < 5 THEN '2-4 calls'
                                                    WHEN session_calls < 10 THEN '5-9 calls'
                                                    WHEN session_calls < 20 THEN '10-19 calls'
                                                    ELSE '20+ calls' END END AS grp,
           *
    FROM base
),
per_session AS (
    SELECT grp, session_id,
           min(session_calls) AS session_calls,
           count(*) AS calls,
           sum(prompt_tokens) AS p,
           sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS p_known,
           sum(cached_tokens) AS c,
           sum(cached_tokens) FILTER (WHERE reusable_tokens_eff IS NOT NULL) AS c_reuse,
           sum(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL) AS r_eff,
           sum(reprefill_tokens) AS x,
           count(*) FILTER (WHERE context_reset) AS resets,
           count(*) FILTER (WHERE cached_tokens IS NULL) AS c_unknown,
           count(*) FILTER (WHERE prev_call_id IS NOT NULL) AS follow_ups,
           count(*) FILTER (WHERE mode = 'exact' AND prev_call_id IS NOT NULL) AS exact_calls,
           min(start_s) AS first_s
    FROM g
    GROUP BY grp, session_id
)
SELECT grp,
       count(*) AS sessions,
       CAST(sum(calls) AS BIGINT) AS calls,
       CAST(sum(p) AS BIGINT) AS prompt_tokens,
       CAST(sum(c) AS BIGINT) AS cached_tokens,
       CAST(sum(r_eff) AS BIGINT) AS reusable_tokens_eff,
       CAST(sum(x) AS BIGINT) AS reprefill_tokens,
       sum(c) / nullif(sum(p_known), 0) AS hit_rate,
       sum(c_reuse) / nullif(sum(r_eff), 0) AS reuse_hit_rate,
       quantile_cont(c / nullif(p_known, 0), 0.1) AS hit_rate_p10,
       quantile_cont(c / nullif(p_known, 0), 0.5) AS hit_rate_p50,
       quantile_cont(c / nullif(p_known, 0), 0.9) AS hit_rate_p90,
       quantile_cont(c_reuse / nullif(r_eff, 0), 0.1) AS reuse_hit_rate_p10,
       quantile_cont(c_reuse / nullif(r_eff, 0), 0.5) AS reuse_hit_rate_p50,
       quantile_cont(c_reuse / nullif(r_eff, 0), 0.9) AS reuse_hit_rate_p90,
       CAST(sum(resets) AS BIGINT) AS context_resets,
       CAST(sum(c_unknown) AS BIGINT) AS calls_cached_unknown,
       CASE WHEN sum(exact_calls) = 0 THEN 'estimate'
            WHEN sum(exact_calls) = sum(follow_ups) THEN 'exact'
            ELSE 'mixed' END AS mode
FROM per_session
GROUP BY grp
ORDER BY min(CASE WHEN $by = 'session_length' THEN session_calls END), min(first_s), grp
