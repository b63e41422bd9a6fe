-- metric: idle_kv_rent
-- summary: KV held by idle sessions between calls: rent paid/wasted (token-s, $), abandoned KV, g*, idle share
-- section: METRICS.md §4, §8
-- definition: For each idle window [t2(prev), t0(c)] of length g, the session's KV at rest K = P(prev) + O(prev):
--   retained (C ≥ R_eff − B, same instance) pays rent K·g token-seconds; evicted windows waste
--   K·(t_evict − t2(prev)) when KV events give t_evict, else the rent is unknown (counted, re-prefill charged);
--   abandoned sessions (no later call, and the data goes on ≥ abandoned_after_s after the last one ended; more
--   recent last calls are open sessions) hold K·(t_evict − t2) with KV events, else only count and bytes.
--   Money = token-seconds × $/s ÷ KV capacity; break-even gap g* = KV capacity ÷ prefill throughput; idle
--   share = idle-retained KV token-seconds ÷ (idle + running-request KV token-seconds).
-- unit: token-seconds, USD (basis in rent_basis), seconds (gaps, g*), bytes, ratio 0–1
-- grain: one row per group (default: one per instance; windows are grouped by the resuming call's group)
-- sources: call_reuse (llm_calls, kv_events, instance_config), cost model
-- by: instance, model, task_type, session, task
WITH base AS (
    SELECT CASE $by WHEN 'instance' THEN m.instance WHEN 'model' THEN m.model WHEN 'task_type' THEN m.task_type
                    WHEN 'session' THEN m.session_id WHEN 'task' THEN m.task_id END AS grp,
           m.*, k.usd_per_token_s AS prev_usd_per_token_s, k.bytes_per_token AS prev_bytes_per_token
    FROM m_calls m
    LEFT JOIN m_cost k ON k.instance = coalesce(m.prev_instance, m.instance, '')
    WHERE m.in_win AND m.session_id IS NOT NULL
),
span AS (
    SELECT coalesce($until, max(end_s)) - coalesce($since, min(start_s)) AS window_s FROM m_calls WHERE in_win
)
SELECT grp,
       count(*) FILTER (WHERE prev_call_id IS NOT NULL) AS windows,
       count(*) FILTER (WHERE window_outcome = 'retained') AS retained,
       count(*) FILTER (WHERE window_outcome = 'evicted') AS evicted,
       count(*) FILTER (WHERE window_outcome = 'routed_away') AS routed_away,
       count(*) FILTER (WHERE window_outcome = 'unknown') AS unknown,
       sum(rent_paid_token_s) AS rent_paid_token_s,
       sum(rent_paid_token_s * prev_usd_per_token_s) AS rent_paid_usd,
       sum(rent_wasted_token_s) AS rent_wasted_token_s,
       sum(rent_wasted_token_s * prev_usd_per_token_s) AS rent_wasted_usd,
       count(*) FILTER (WHERE window_outcome = 'evicted' AND rent_wasted_token_s IS NULL) AS evicted_rent_unknown,
       count(*) FILTER (WHERE evict_phase = 'idle') AS evicted_while_idle,
       count(*) FILTER (WHERE evict_phase = 'queued') AS evicted_while_queued,
       count(*) FILTER (WHERE abandoned) AS abandoned,
       count(*) FILTER (WHERE is_last AND NOT abandoned) AS open_sessions,
       CAST(sum(abandon_kv_tokens) AS BIGINT) AS abandoned_kv_tokens,
       sum(abandon_kv_tokens * base.bytes_per_token) AS abandoned_kv_bytes,
       sum(abandon_rent_token_s) AS abandoned_rent_token_s,
       sum(abandon_rent_token_s * base.usd_per_token_s) AS abandoned_rent_usd,
       count(*) FILTER (WHERE abandon_censored) AS abandoned_still_resident,
       quantile_cont(gap_before_s, 0.5) AS gap_p50_s,
       quantile_cont(gap_before_s, 0.9) AS gap_p90_s,
       avg(base.g_star_s) AS g_star_s,
       count(*) FILTER (WHERE gap_before_s > base.g_star_s) AS windows_over_g_star,
       count(*) FILTER (WHERE gap_before_s > base.g_star_s) / nullif(count(*) FILTER (WHERE prev_call_id IS NOT NULL), 0)
           AS share_over_g_star,
       sum(rent_paid_token_s) / any_value(span.window_s) AS idle_kv_tokens_avg,
       sum((coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0) / 2.0) * (end_s - start_s)) / any_value(span.window_s)
           AS running_kv_tokens_avg,
       sum(rent_paid_token_s) / nullif(sum(rent_paid_token_s)
           + sum((coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0) / 2.0) * (end_s - start_s)), 0) AS idle_kv_share,
       CASE WHEN sum(rent_paid_token_s) > sum((coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0) / 2.0) * (end_s - start_s))
            THEN 'idle sessions hold more KV than running requests' END AS note,
       CASE WHEN count(*) FILTER (WHERE rent_mode = 'kv_events') = 0 THEN 'estimate'
            WHEN count(*) FILTER (WHERE rent_mode = 'estimate') = 0 THEN 'kv_events'
            ELSE 'mixed' END AS rent_mode,
       string_agg(DISTINCT k2.rent_basis, ' | ') AS rent_basis
FROM base
CROSS JOIN span
LEFT JOIN m_cost k2 ON k2.instance = coalesce(base.instance, '')
GROUP BY grp
ORDER BY grp
