-- concurrency (defs/concurrency.sql) from the maintained minute rollup model_rollup_minute (agentobs/model/rollups.py)
-- instead of m_calls (the relations the definition's final part reads: agg, bounds), for a run over the maintained
-- state whose window is whole hours, whose filters are on the rollup's keys and whose bucket is a whole number of
-- minutes (agentobs/metrics/rollup.py decides). A bucket sums its minutes inside the window: the calls' overlaps
-- (req_ps, whole pico-seconds) and their pieces (a bucket row exists where a call has a piece, of zero overlap too,
-- as per call). The calls overlapping it: those starting in it (inside the window) plus those running across its
-- first instant t_k = max(bucket start, $since) (run_at of that minute) — a call's clipped interval
-- [max(start, since), end] meets the bucket for a positive time exactly then. The window's bounds, when open, come
-- from the per-call state (<bounds>). <filter> is our own SQL text (list_contains over parameters), $since/$until
-- the window, $bucket_s the bucket.
WITH r AS (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type END AS grp,
           CAST(floor(minute * 60.0 / $bucket_s) AS BIGINT) AS k, minute, run_pieces, req_ps, run_starts, run_at
    FROM model_rollup_minute r
    WHERE run_pieces > 0 AND ($since IS NULL OR minute >= $since / 60) AND ($until IS NULL OR minute < $until / 60)
      AND {filter}
),
agg AS (
    SELECT grp, k,
           CAST(sum(run_starts) + coalesce(sum(run_at) FILTER (
               WHERE minute * 60.0 = greatest(k * $bucket_s, coalesce($since, k * $bucket_s))), 0) AS BIGINT) AS calls,
           sum(req_ps) / 1e12 AS request_s
    FROM r
    GROUP BY grp, k
),
bounds AS ({bounds})
