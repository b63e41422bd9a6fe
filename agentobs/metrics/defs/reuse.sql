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
-- the calls are summed per session × task × instance × model × task type first (per_session sums those sums: a
-- sum over no values is NULL, so n_* count the values beside each sum, as the rollup model_rollup_task keeps them)
WITH base AS (
    SELECT session_id, task_id, instance, model, task_type,
           count(*) AS calls,
           sum(prompt_tokens) AS prompt_tokens, count(prompt_tokens) AS n_p,
           sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS p_known,
           count(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS n_p_known,
           sum(cached_tokens) AS cached_tokens, count(cached_tokens) AS n_c,
           sum(cached_tokens) FILTER (WHERE reusable_tokens_eff IS NOT NULL) AS c_reuse,
           count(cached_tokens) FILTER (WHERE reusable_tokens_eff IS NOT NULL) AS n_c_reuse,
           sum(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL) AS r_eff_c,
           count(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL) AS n_r_eff_c,
           sum(reprefill_tokens) AS reprefill_tokens, count(reprefill_tokens) AS n_x,
           count(*) FILTER (WHERE context_reset) AS resets,
           count(*) FILTER (WHERE cached_tokens IS NULL) AS c_unknown,
           count(*) FILTER (WHERE prev_call_id IS NOT NULL) AS follow_ups,
           count(*) FILTER (WHERE mode = 'exact' AND prev_call_id IS NOT NULL) AS exact_calls,
           min(start_s) AS first_s
    FROM m_calls
    WHERE in_win AND session_id IS NOT NULL
    GROUP BY session_id, task_id, instance, model, task_type
),
-- final: from base, the sums above per session × task × instance × model × task type (the rollup form,
--   rollup_reuse.sql, reads them from model_rollup_task: agentobs/metrics/rollup.py)
sess AS (SELECT session_id, sum(calls) AS session_calls FROM base GROUP BY session_id),
g AS (
    SELECT CASE $by WHEN 'session' THEN b.session_id WHEN 'task' THEN b.task_id WHEN 'instance' THEN b.instance
                    WHEN 'model' THEN b.model WHEN 'task_type' THEN b.task_type
                    WHEN 'session_length' THEN CASE WHEN s.session_calls = 1 THEN '1 call'
                                                    WHEN s.session_calls < 5 THEN '2-4 calls'
                                                    WHEN s.session_calls < 10 THEN '5-9 calls'
                                                    WHEN s.session_calls < 20 THEN '10-19 calls'
                                                    ELSE '20+ calls' END END AS grp,
           b.*, s.session_calls
    FROM base b JOIN sess s USING (session_id)
),
per_session AS (
    SELECT grp, session_id,
           min(session_calls) AS session_calls,
           sum(calls) AS calls,
           CASE WHEN sum(n_p) > 0 THEN sum(prompt_tokens) END AS p,
           CASE WHEN sum(n_p_known) > 0 THEN sum(p_known) END AS p_known,
           CASE WHEN sum(n_c) > 0 THEN sum(cached_tokens) END AS c,
           CASE WHEN sum(n_c_reuse) > 0 THEN sum(c_reuse) END AS c_reuse,
           CASE WHEN sum(n_r_eff_c) > 0 THEN sum(r_eff_c) END AS r_eff,
           CASE WHEN sum(n_x) > 0 THEN sum(reprefill_tokens) END AS x,
           sum(resets) AS resets,
           sum(c_unknown) AS c_unknown,
           sum(follow_ups) AS follow_ups,
           sum(exact_calls) AS exact_calls,
           min(first_s) AS first_s
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
