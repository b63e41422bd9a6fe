-- m_itl_gap: every inter-token gap of the run's streamed calls in the window, with its tail flag and the
-- co-scheduled prefill it is attributed to (METRICS.md §6). One definition for the itl_tail metric and the
-- long-prefill ITL finding (agentobs/findings/rules/itl_interference.py). The metric stores it once per metric
-- run (a temp table, MetricRun.itl_gaps); the finding reads that table when it is there (the weekly report
-- computes itl_tail first: the tail gap × prefill join, the costliest step of either, runs once), else
-- inlines this query (Context.with_itl_gaps).
-- Parameters: $itl_tail_mode ('slo' | 'p99'), $itl_slo_ms, $long_prefill_tokens.
-- Columns:
--   call_id        the streamed call (one row per element of its itl_ms)
--   instance, model
--   g_ms           the gap; gap i ends at tb = t1 + Σ_{j≤i} itl_j and starts at ta = tb − g_ms (the overlap joins
--                  below; not stored: no reader needs them, and the table is written in every run that reads it)
--   thr_ms, tail   the tail threshold ($itl_slo_ms, or with $itl_tail_mode = 'p99' the p99 of the model's
--                  gaps) and g_ms > thr_ms
--   long_overlap   a prefill window [t0 + queue_time, t1] of another call on the instance that computes
--                  P − C ≥ $long_prefill_tokens overlaps the gap
--   off_call_id, off_computed  (tail gaps) the overlapping prefill computing the most tokens P − C (a tie: the
--                  greater call id) and its P − C; NULL: unattributed
-- Gaps come from calls in_win (in_filter and starting in the window); prefills from any call in_filter (a
-- prefill that started before the window still overlaps gaps inside it). A prefill window that is empty
-- (time to first token ≤ queue time) overlaps nothing.
-- gap i of a call ends at t1 + Σ_{j≤i} itl_j: the list's running sum (agentobs_cumsum, one vectorized pass over
-- lists already in order) read at i, not a window over the unnested gaps (which partitions and sorts them). The
-- streamed calls are gathered first, so the function gets full vectors, not the few rows of each m_calls vector
WITH streamed AS MATERIALIZED (
    SELECT call_id, instance, model, start_s + ttft_s AS t1, itl_ms
    FROM m_calls
    WHERE in_filter AND in_win AND itl_ms IS NOT NULL AND ttft_s IS NOT NULL AND len(itl_ms) > 0
),
gaps0 AS (
    SELECT call_id, instance, model, t1, cs, unnest(itl_ms) AS g_ms, generate_subscripts(itl_ms, 1) AS i
    FROM (SELECT *, agentobs_cumsum(itl_ms) AS cs FROM streamed)
),
gaps AS (
    SELECT call_id, i, instance, model, g_ms, t1 + cs[i] / 1000.0 AS tb
    FROM gaps0
),
gt AS (
    SELECT *, tb - g_ms / 1000.0 AS ta,
           CASE WHEN $itl_tail_mode = 'p99' THEN quantile_cont(g_ms, 0.99) OVER (PARTITION BY model)
                ELSE $itl_slo_ms END AS thr_ms
    FROM gaps
),
prefills AS (
    SELECT call_id AS p_call_id, instance, start_s + coalesce(queue_s, 0) AS pa, start_s + ttft_s AS pb,
           prompt_tokens - coalesce(cached_tokens, 0) AS computed
    FROM m_calls
    WHERE in_filter AND ttft_s IS NOT NULL AND prompt_tokens IS NOT NULL AND ttft_s > coalesce(queue_s, 0)
      AND instance IN (SELECT DISTINCT instance FROM gaps0)
),
-- overlap joins on (instance, 5-second cell) so that each gap meets only nearby prefills
pcells AS (
    SELECT *, unnest(generate_series(CAST(floor(pa / 5) AS BIGINT), CAST(floor(pb / 5) AS BIGINT))) AS cell FROM prefills
),
gcells AS (
    SELECT call_id, i, instance, ta, tb, g_ms > thr_ms AS tail,
           unnest(generate_series(CAST(floor(ta / 5) AS BIGINT), CAST(floor(tb / 5) AS BIGINT))) AS cell
    FROM gt
),
-- a tail gap: every prefill it overlaps (the attribution below). A pair is kept in one cell only, the first both
-- span (the greater of their first cells), so no pair repeats and none needs a DISTINCT pass
tail_ov AS (
    SELECT g.call_id, g.i, p.p_call_id, p.computed
    FROM (SELECT * FROM gcells WHERE tail) g JOIN pcells p ON p.instance = g.instance AND p.cell = g.cell
    WHERE p.pa < g.tb AND p.pb > g.ta AND p.p_call_id <> g.call_id
      AND g.cell = greatest(CAST(floor(g.ta / 5) AS BIGINT), CAST(floor(p.pa / 5) AS BIGINT))
),
-- any other gap: only whether a long prefill overlaps it (a semi-join: no pairs are formed)
long_gap AS (
    SELECT DISTINCT g.call_id, g.i
    FROM (SELECT * FROM gcells WHERE NOT coalesce(tail, false)) g
    SEMI JOIN (SELECT * FROM pcells WHERE computed >= $long_prefill_tokens) p
      ON p.instance = g.instance AND p.cell = g.cell AND p.pa < g.tb AND p.pb > g.ta AND p.p_call_id <> g.call_id
),
per_gap AS MATERIALIZED (
    SELECT call_id, i,
           max(computed) >= $long_prefill_tokens AS long_overlap,
           -- the prefill computing the most tokens; on a tie, the greater call id (the same every run)
           arg_max(p_call_id, (computed, p_call_id)) AS off_call_id,
           max(computed) AS off_computed
    FROM tail_ov GROUP BY call_id, i
    UNION ALL
    SELECT call_id, i, true, NULL, NULL FROM long_gap
)
SELECT gt.call_id, gt.instance, gt.model, gt.g_ms, gt.thr_ms, gt.g_ms > gt.thr_ms AS tail,
       coalesce(pg.long_overlap, false) AS long_overlap, pg.off_call_id, pg.off_computed
FROM gt LEFT JOIN per_gap pg ON pg.call_id = gt.call_id AND pg.i = gt.i
