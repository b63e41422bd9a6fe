-- metric: throughput
-- summary: Processed (P+O) and computed (P−C+O) tokens per second; output tokens/s secondary
-- section: METRICS.md §7
-- definition: Token throughput over [since, until): processed tokens (P + O) and computed tokens (P − C + O) per
--   second, output tokens per second as a secondary figure. Each call's tokens are apportioned to the window by
--   the share of its interval [t0, t2] inside it (no completion-time slicing). C unknown counts as 0 computed-saving.
-- unit: tokens per second; tokens
-- grain: one row per group (default: instance)
-- sources: llm_calls (P, C, O, start/end)
-- by: instance, model, task_type, task, session
WITH base AS (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type
                    WHEN 'task' THEN task_id WHEN 'session' THEN session_id END AS grp,
           prompt_tokens, cached_tokens, output_tokens, reprefill_tokens,
           CASE WHEN end_s > start_s
                THEN greatest(0, least(end_s, coalesce($until, end_s)) - greatest(start_s, coalesce($since, start_s)))
                     / (end_s - start_s)
                ELSE 1.0 END AS frac,
           start_s, end_s
    FROM m_calls
    WHERE in_filter AND ($until IS NULL OR start_s < $until) AND ($since IS NULL OR end_s > $since)
),
span AS (SELECT coalesce($until, max(end_s)) - coalesce($since, min(start_s)) AS window_s FROM base),
-- aggregate the calls first, then put the one-row window beside the groups
agg AS (
    SELECT grp,
           count(*) AS calls,
           sum(frac * (coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0))) AS processed_tokens,
           sum(frac * (coalesce(prompt_tokens, 0) - coalesce(cached_tokens, 0) + coalesce(output_tokens, 0))) AS computed_tokens,
           sum(frac * coalesce(reprefill_tokens, 0)) AS reprefill_tokens,
           sum(frac * coalesce(output_tokens, 0)) AS output_tokens
    FROM base
    GROUP BY grp
)
SELECT grp, calls, span.window_s AS window_s, processed_tokens, computed_tokens, reprefill_tokens,
       processed_tokens / nullif(span.window_s, 0) AS processed_tokens_per_s,
       computed_tokens / nullif(span.window_s, 0) AS computed_tokens_per_s,
       output_tokens / nullif(span.window_s, 0) AS output_tokens_per_s,
       output_tokens / nullif(computed_tokens, 0) AS decode_share_of_computed
FROM agg CROSS JOIN span
ORDER BY grp
