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
-- the calls are aggregated without joins; the per-instance prices (the previous call's instance for rent, the
-- call's own for the basis text) and the one-row window are put beside the aggregates afterwards. base is read
-- three times (agg, prev_sums, insts): NOT MATERIALIZED scans m_calls for each (a scan is cheap), which is
-- faster than one scan fanned out to the three (docs/metrics.md, "Round 9")
WITH base AS NOT MATERIALIZED (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type
                    WHEN 'session' THEN session_id WHEN 'task' THEN task_id END AS grp,
           *, coalesce(prev_instance, instance, '') AS prev_key
    FROM m_calls
    WHERE in_win AND session_id IS NOT NULL
),
span AS (
    SELECT coalesce($until, max(end_s)) - coalesce($since, min(start_s)) AS window_s FROM m_calls WHERE in_win
),
-- the rent per group × the previous call's instance (priced with that instance's cost)
prev_sums AS (
    SELECT grp, prev_key, sum(rent_paid_token_s) AS rent_paid_token_s, sum(rent_wasted_token_s) AS rent_wasted_token_s
    FROM base GROUP BY grp, prev_key
),
agg AS (
    SELECT grp,
           count(*) FILTER (WHERE prev_call_id IS NOT NULL) AS windows,
           count(*) FILTER (WHERE window_outcome = 'retained') AS retained,
           count(*) FILTER (WHERE window_outcome = 'evicted') AS evicted,
           count(*) FILTER (WHERE window_outcome = 'routed_away') AS routed_away,
           count(*) FILTER (WHERE window_outcome = 'unknown') AS unknown,
           sum(rent_paid_token_s) AS rent_paid_token_s,
           sum(rent_wasted_token_s) AS rent_wasted_token_s,
           count(*) FILTER (WHERE window_outcome = 'evicted' AND rent_wasted_token_s IS NULL) AS evicted_rent_unknown,
           count(*) FILTER (WHERE evict_phase = 'idle') AS evicted_while_idle,
           count(*) FILTER (WHERE evict_phase = 'queued') AS evicted_while_queued,
           count(*) FILTER (WHERE abandoned) AS abandoned,
           count(*) FILTER (WHERE is_last AND NOT abandoned) AS open_sessions,
           CAST(sum(abandon_kv_tokens) AS BIGINT) AS abandoned_kv_tokens,
           sum(abandon_kv_tokens * bytes_per_token) AS abandoned_kv_bytes,
           sum(abandon_rent_token_s) AS abandoned_rent_token_s,
           sum(abandon_rent_token_s * usd_per_token_s) AS abandoned_rent_usd,
           count(*) FILTER (WHERE abandon_censored) AS abandoned_still_resident,
           quantile_cont(gap_before_s, 0.5) AS gap_p50_s,
           quantile_cont(gap_before_s, 0.9) AS gap_p90_s,
           avg(g_star_s) AS g_star_s,
           count(*) FILTER (WHERE gap_before_s > g_star_s) AS windows_over_g_star,
           sum((coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0) / 2.0) * (end_s - start_s)) AS running_kv_token_s,
           count(*) FILTER (WHERE rent_mode = 'kv_events') AS kv_event_windows,
           count(*) FILTER (WHERE rent_mode = 'estimate') AS estimate_windows
    FROM base
    GROUP BY grp
),
-- final: from base (grp, instance), span, prev_sums and agg, the sums per group above (the rollup form,
--   rollup_idle_kv_rent.sql, gives them from model_rollup_hour and the gap sketches: agentobs/metrics/rollup.py)
rent_by_prev AS (
    SELECT b.grp, sum(b.rent_paid_token_s * k.usd_per_token_s) AS rent_paid_usd,
           sum(b.rent_wasted_token_s * k.usd_per_token_s) AS rent_wasted_usd
    FROM prev_sums b
    LEFT JOIN m_cost k ON k.instance = b.prev_key
    GROUP BY b.grp
),
-- the instances of each group's calls (for the basis text), sorted, from the distinct (group, instance) pairs:
-- a DISTINCT aggregate among agg's slows all of agg (docs/metrics.md, "Round 9")
insts AS (
    SELECT grp, list_sort(list(inst)) AS instances
    FROM (SELECT DISTINCT grp, coalesce(instance, '') AS inst FROM base)
    GROUP BY grp
),
basis AS (
    SELECT d.instances, (SELECT string_agg(DISTINCT k.rent_basis, ' | ' ORDER BY k.rent_basis) FROM m_cost k
                         WHERE list_contains(d.instances, k.instance)) AS rent_basis
    FROM (SELECT DISTINCT instances FROM insts) d
)
SELECT a.grp, a.windows, a.retained, a.evicted, a.routed_away, a.unknown,
       a.rent_paid_token_s, r.rent_paid_usd, a.rent_wasted_token_s, r.rent_wasted_usd,
       a.evicted_rent_unknown, a.evicted_while_idle, a.evicted_while_queued, a.abandoned, a.open_sessions,
       a.abandoned_kv_tokens, a.abandoned_kv_bytes, a.abandoned_rent_token_s, a.abandoned_rent_usd,
       a.abandoned_still_resident,
       a.gap_p50_s,
       a.gap_p90_s,
       a.g_star_s, a.windows_over_g_star,
       a.windows_over_g_star / nullif(a.windows, 0) AS share_over_g_star,
       a.rent_paid_token_s / span.window_s AS idle_kv_tokens_avg,
       a.running_kv_token_s / span.window_s AS running_kv_tokens_avg,
       a.rent_paid_token_s / nullif(a.rent_paid_token_s + a.running_kv_token_s, 0) AS idle_kv_share,
       CASE WHEN a.rent_paid_token_s > a.running_kv_token_s
            THEN 'idle sessions hold more KV than running requests' END AS note,
       CASE WHEN a.kv_event_windows = 0 THEN 'estimate'
            WHEN a.estimate_windows = 0 THEN 'kv_events'
            ELSE 'mixed' END AS rent_mode,
       b.rent_basis
FROM agg a
JOIN insts i ON i.grp IS NOT DISTINCT FROM a.grp
CROSS JOIN span
LEFT JOIN rent_by_prev r ON r.grp IS NOT DISTINCT FROM a.grp
LEFT JOIN basis b ON b.instances = i.instances
ORDER BY a.grp
