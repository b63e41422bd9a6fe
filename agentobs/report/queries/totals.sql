-- query: totals
-- summary: Fleet totals of the calls starting in [lo, hi) under the attribute filters: calls, sessions, tasks,
--   tokens, GPU seconds, $, hit rates, re-prefill, idle KV rent, retries (the headline, and the week before).
-- reads: m_calls, m_cost (the metric run's prepared tables, agentobs/metrics/run.py)
-- params: lo, hi
-- template:
-- notes: idle KV rent: token-seconds summed per pricing instance (the previous call's, where the KV sat; else the
--   call's own), then priced — as the idle_kv_rent metric does; joining m_cost to every call built the join's
--   hash table on the calls (a positional view is estimated at 0 rows). The distinct sessions and tasks are
--   counted from their distinct pairs, apart from the sums (DISTINCT aggregates among the sums slow all of them;
--   docs/metrics.md).
WITH st AS MATERIALIZED (
    SELECT DISTINCT session_id, task_id FROM m_calls WHERE in_filter AND start_s >= $lo AND start_s < $hi
),
rent AS (
    SELECT sum(r.paid_ts * k.usd_per_token_s) AS rent_paid_usd, sum(r.wasted_ts * k.usd_per_token_s) AS rent_wasted_usd
    FROM (SELECT coalesce(prev_instance, instance, '') AS inst,
                 sum(rent_paid_token_s) FILTER (WHERE session_id IS NOT NULL) AS paid_ts,
                 sum(rent_wasted_token_s) FILTER (WHERE session_id IS NOT NULL) AS wasted_ts
          FROM m_calls
          WHERE in_filter AND start_s >= $lo AND start_s < $hi
          GROUP BY 1) r
    LEFT JOIN m_cost k ON k.instance = r.inst
)

SELECT count(*) AS calls,
       (SELECT count(DISTINCT session_id) FROM st) AS sessions,
       (SELECT count(DISTINCT task_id) FROM st) AS tasks,
       CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
       CAST(sum(cached_tokens) AS BIGINT) AS cached_tokens,
       CAST(sum(prompt_tokens - coalesce(cached_tokens, 0)) AS BIGINT) AS computed_prompt_tokens,
       CAST(sum(output_tokens) AS BIGINT) AS output_tokens,
       sum(gpu_s) AS gpu_s,
       sum(cost_usd) AS cost_usd,
       sum(list_cost_usd) AS list_cost_usd,
       sum(cached_tokens) FILTER (WHERE session_id IS NOT NULL)
           / nullif(sum(prompt_tokens) FILTER (WHERE session_id IS NOT NULL AND cached_tokens IS NOT NULL), 0) AS hit_rate,
       sum(cached_tokens) FILTER (WHERE session_id IS NOT NULL AND reusable_tokens_eff IS NOT NULL)
           / nullif(sum(reusable_tokens_eff) FILTER (WHERE session_id IS NOT NULL AND cached_tokens IS NOT NULL), 0)
           AS reuse_hit_rate,
       CAST(sum(reprefill_tokens) AS BIGINT) AS reprefill_tokens,
       sum(reprefill_tokens) / nullif(sum(reprefill_tokens) + sum(cached_tokens) FILTER (WHERE reprefill_tokens IS NOT NULL), 0)
           AS reprefill_share_of_cache_tokens,
       sum(reprefill_tokens) / nullif(sum(prompt_tokens - cached_tokens) FILTER (WHERE reprefill_tokens IS NOT NULL), 0)
           AS reprefill_share_of_computed_prefill,
       sum(reprefill_cost_usd) AS reprefill_cost_usd,
       sum(reprefill_cost_usd) / nullif(sum(cost_usd), 0) AS reprefill_cost_share,
       (SELECT rent_paid_usd FROM rent) AS rent_paid_usd,
       (SELECT rent_wasted_usd FROM rent) AS rent_wasted_usd,
       count(*) FILTER (WHERE is_retry) AS retries
FROM m_calls m
WHERE m.in_filter AND m.start_s >= $lo AND m.start_s < $hi
