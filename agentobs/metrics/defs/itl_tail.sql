-- metric: itl_tail
-- summary: Tail inter-token gaps attributed to co-scheduled prefills (long prefills, retries, re-prefills)
-- section: METRICS.md §6
-- definition: Inter-token gaps of streamed calls (llm_calls.itl_ms; gap i ends at t1 + Σ_{j≤i} itl_j) above the
--   tail threshold (itl_slo_ms, or with itl_tail_threshold = p99 the p99 of the model's gaps) are attributed to the
--   co-scheduled prefill on the same instance whose window [t0 + queue_time, t1] overlaps the gap and computes
--   the most tokens P − C (a tie: the greater call id; none: unattributed). Reports the tail share overlapping a
--   long prefill (P − C ≥ long_prefill_tokens), p50/p99 ITL with and without overlapping long prefills, the
--   share of tail gaps caused by retries and by re-prefills, and the top offending session and task; by
--   session/task the rows are the offenders. Without per-chunk data (method coarse_histogram, instance grouping
--   only): per scrape interval the share of inter_token_latency_seconds observations above the threshold bucket
--   against the computed prompt tokens of the interval — correlation and tail share in high- vs low-prefill
--   intervals. Coarse.
-- unit: milliseconds (gaps), ratio 0–1 (shares), correlation −1…1
-- grain: one row per group (default: instance; session/task: the offending prefill's session/task)
-- sources: llm_calls (itl_ms, ttft_s, queue_s, P, C), call_reuse (miss cause, retries), metric_samples (fallback)
-- by: instance, model, session, task
-- the gaps, their tail flags and attributions: m_itl_gap (agentobs/model/itl_gaps.sql), made once per run and
-- read by the long-prefill ITL finding too; m_calls is read here only for the offending prefills' calls (the
-- gaps that have one)
WITH offender AS (
    SELECT call_id AS off_call_id,
           any_value({'session_id': session_id, 'task_id': task_id, 'retry': is_retry, 'reprefill_tokens': reprefill_tokens,
            'miss_cause': miss_cause, 'computed': prompt_tokens - coalesce(cached_tokens, 0)}) AS off
    FROM m_calls
    WHERE in_filter AND call_id IN (SELECT off_call_id FROM m_itl_gap WHERE off_call_id IS NOT NULL)
    GROUP BY call_id  -- one row per call even if a call id repeats
),
-- grp: the group of the gap (by session/task: the offending prefill's)
g_all AS (
    SELECT CASE $by WHEN 'instance' THEN g.instance WHEN 'model' THEN g.model
                    WHEN 'session' THEN o.off.session_id WHEN 'task' THEN o.off.task_id END AS grp,
           g.call_id, g.g_ms, g.thr_ms, g.tail, g.long_overlap, o.off
    FROM m_itl_gap g
    LEFT JOIN offender o ON o.off_call_id = g.off_call_id
),
pc AS (
    SELECT grp,
           'per_chunk' AS method,
           CAST(count(*) AS BIGINT) AS gaps,
           CAST(count(*) FILTER (WHERE tail) AS BIGINT) AS tail_gaps,
           CAST(count(DISTINCT call_id) AS BIGINT) AS calls,
           avg(thr_ms) AS threshold_ms,
           count(*) FILTER (WHERE tail) / count(*) AS tail_share,
           count(*) FILTER (WHERE tail AND long_overlap) / nullif(count(*) FILTER (WHERE tail), 0) AS tail_long_prefill_share,
           CAST(count(*) FILTER (WHERE tail AND off IS NULL) AS BIGINT) AS unattributed_tail_gaps,
           quantile_cont(g_ms, 0.5) AS p50_ms,
           quantile_cont(g_ms, 0.99) AS p99_ms,
           quantile_cont(g_ms, 0.5) FILTER (WHERE long_overlap) AS p50_with_long_prefill_ms,
           quantile_cont(g_ms, 0.99) FILTER (WHERE long_overlap) AS p99_with_long_prefill_ms,
           quantile_cont(g_ms, 0.5) FILTER (WHERE NOT long_overlap) AS p50_without_long_prefill_ms,
           quantile_cont(g_ms, 0.99) FILTER (WHERE NOT long_overlap) AS p99_without_long_prefill_ms,
           count(*) FILTER (WHERE tail AND off.retry) / nullif(count(*) FILTER (WHERE tail), 0) AS retry_share,
           count(*) FILTER (WHERE tail AND off.reprefill_tokens > 0) / nullif(count(*) FILTER (WHERE tail), 0)
               AS reprefill_share,
           NULL::BIGINT AS intervals,
           NULL::DOUBLE AS corr_tail_vs_computed_prefill,
           NULL::DOUBLE AS tail_share_high_prefill,
           NULL::DOUBLE AS tail_share_low_prefill,
           NULL::VARCHAR AS note
    FROM g_all
    WHERE $by IN ('instance', 'model') OR (tail AND off IS NOT NULL)
    GROUP BY grp
),
-- the top offending session and task of each group: the one whose prefills caused the most tail gaps; a tie goes
-- to the least id (the same every run: mode() broke ties by the order it met the rows)
tc AS MATERIALIZED (
    SELECT grp, off.session_id AS s, off.task_id AS t, count(*) AS n
    FROM g_all
    WHERE tail AND off IS NOT NULL
    GROUP BY ALL
),
top_s AS (
    SELECT grp, arg_min(s, (-n, s)) AS top_offender_session
    FROM (SELECT grp, s, sum(n) AS n FROM tc WHERE s IS NOT NULL GROUP BY grp, s) GROUP BY grp
),
top_t AS (
    SELECT grp, arg_min(t, (-n, t)) AS top_offender_task
    FROM (SELECT grp, t, sum(n) AS n FROM tc WHERE t IS NOT NULL GROUP BY grp, t) GROUP BY grp
),
per_chunk AS (
    SELECT pc.*, ts.top_offender_session, tt.top_offender_task
    FROM pc
    LEFT JOIN top_s ts ON ts.grp IS NOT DISTINCT FROM pc.grp
    LEFT JOIN top_t tt ON tt.grp IS NOT DISTINCT FROM pc.grp
),
-- coarse fallback: histogram bucket increments per scrape interval, for instances without per-chunk gaps
hist AS (
    SELECT instance, ts_s, metric, TRY_CAST(labels['le'] AS DOUBLE) AS le, delta
    FROM m_samples
    WHERE $by = 'instance' AND delta IS NOT NULL
      AND metric IN ('vllm:inter_token_latency_seconds_bucket', 'sglang:inter_token_latency_seconds_bucket',
                     'vllm:inter_token_latency_seconds_count', 'sglang:inter_token_latency_seconds_count')
      AND instance NOT IN (SELECT DISTINCT instance FROM m_itl_gap WHERE instance IS NOT NULL)
),
le_sel AS (
    SELECT instance, min(le) AS le FROM hist
    WHERE metric LIKE '%_bucket' AND le >= $itl_slo_ms / 1000.0 - 1e-9 GROUP BY instance
),
iv AS (
    SELECT h.instance, h.ts_s,
           sum(h.delta) FILTER (WHERE h.metric LIKE '%_count') AS n,
           sum(h.delta) FILTER (WHERE h.metric LIKE '%_bucket' AND h.le = s.le) AS below,
           any_value(s.le) AS le
    FROM hist h JOIN le_sel s USING (instance)
    GROUP BY h.instance, h.ts_s
),
comp AS (
    SELECT instance, ts_s,
           coalesce(sum(delta) FILTER (WHERE metric = 'vllm:prompt_tokens_by_source_total' AND labels['source'] = 'local_compute'),
                    sum(delta) FILTER (WHERE metric = 'sglang:prompt_tokens_total')
                      - coalesce(sum(delta) FILTER (WHERE metric = 'sglang:cached_tokens_total'), 0)) AS computed
    FROM m_samples
    WHERE delta IS NOT NULL
      AND metric IN ('vllm:prompt_tokens_by_source_total', 'sglang:prompt_tokens_total', 'sglang:cached_tokens_total')
    GROUP BY instance, ts_s
),
ivc AS (
    SELECT iv.*, (iv.n - iv.below) / iv.n AS tail_i, c.computed,
           median(c.computed) OVER (PARTITION BY iv.instance) AS med_computed
    FROM iv LEFT JOIN comp c USING (instance, ts_s)
    WHERE iv.n > 0
),
coarse AS (
    SELECT instance AS grp, 'coarse_histogram' AS method,
           CAST(sum(n) AS BIGINT) AS gaps, CAST(sum(n - below) AS BIGINT) AS tail_gaps, NULL::BIGINT AS calls,
           any_value(le) * 1000 AS threshold_ms,
           sum(n - below) / sum(n) AS tail_share,
           NULL::DOUBLE AS tail_long_prefill_share, NULL::BIGINT AS unattributed_tail_gaps,
           NULL::DOUBLE AS p50_ms, NULL::DOUBLE AS p99_ms, NULL::DOUBLE AS p50_with_long_prefill_ms,
           NULL::DOUBLE AS p99_with_long_prefill_ms, NULL::DOUBLE AS p50_without_long_prefill_ms,
           NULL::DOUBLE AS p99_without_long_prefill_ms, NULL::DOUBLE AS retry_share, NULL::DOUBLE AS reprefill_share,
           NULL::VARCHAR AS top_offender_session, NULL::VARCHAR AS top_offender_task,
           CAST(count(*) AS BIGINT) AS intervals,
           corr(tail_i, computed) AS corr_tail_vs_computed_prefill,
           sum(n - below) FILTER (WHERE computed > med_computed) / nullif(sum(n) FILTER (WHERE computed > med_computed), 0)
               AS tail_share_high_prefill,
           sum(n - below) FILTER (WHERE computed <= med_computed) / nullif(sum(n) FILTER (WHERE computed <= med_computed), 0)
               AS tail_share_low_prefill,
           'coarse: per scrape interval from the inter_token_latency_seconds histogram (threshold rounded up to the bucket le='
               || any_value(le) || ' s), no per-call attribution' AS note
    FROM ivc
    GROUP BY instance
)
-- the same explicit column list in both branches (portable: no UNION ALL BY NAME)
SELECT grp, method, gaps, tail_gaps, calls, threshold_ms, tail_share, tail_long_prefill_share,
       unattributed_tail_gaps, p50_ms, p99_ms, p50_with_long_prefill_ms, p99_with_long_prefill_ms,
       p50_without_long_prefill_ms, p99_without_long_prefill_ms, retry_share, reprefill_share,
       top_offender_session, top_offender_task, intervals, corr_tail_vs_computed_prefill,
       tail_share_high_prefill, tail_share_low_prefill, note
FROM per_chunk
UNION ALL
SELECT grp, method, gaps, tail_gaps, calls, threshold_ms, tail_share, tail_long_prefill_share,
       unattributed_tail_gaps, p50_ms, p99_ms, p50_with_long_prefill_ms, p99_with_long_prefill_ms,
       p50_without_long_prefill_ms, p99_without_long_prefill_ms, retry_share, reprefill_share,
       top_offender_session, top_offender_task, intervals, corr_tail_vs_computed_prefill,
       tail_share_high_prefill, tail_share_low_prefill, note
FROM coarse
ORDER BY method DESC, grp
