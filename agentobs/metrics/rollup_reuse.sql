-- reuse (defs/reuse.sql) from the maintained rollup model_rollup_task (agentobs/model/rollups.py) instead of m_calls:
-- the same per-session sums (exact), then the same final aggregation, for a run over the maintained state whose
-- window is whole hours and whose filters are on the rollup's keys (agentobs/metrics/rollup.py decides). <filter> is
-- our own SQL text (list_contains over parameters), $h0/$h1 the window in hours, $by the grouping.
WITH base AS NOT MATERIALIZED (
    SELECT r.*
    FROM model_rollup_task r
    WHERE session_id IS NOT NULL AND ($h0 IS NULL OR hour >= $h0) AND ($h1 IS NULL OR hour < $h1) AND {filter}
),
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
