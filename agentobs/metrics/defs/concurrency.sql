-- metric: concurrency
-- summary: Time-weighted requests in flight per bucket: Σ overlap / bucket length
-- section: METRICS.md §7
-- definition: Time-weighted concurrency per group and time bucket: Σ over calls of the overlap of [t0, t2] with
--   the bucket ÷ the bucket's length inside [since, until) (request-seconds conservation). A call spanning a
--   bucket boundary counts in both buckets in proportion; never attributed to the bucket where it completed.
-- unit: requests (average in flight); request-seconds
-- grain: one row per group × bucket of metrics_bucket_s seconds (aligned to the epoch)
-- sources: llm_calls (start/end), calls overlapping [since, until)
-- by: instance, model, task_type
WITH base AS (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type END AS grp,
           greatest(start_s, coalesce($since, start_s)) AS a,
           least(end_s, coalesce($until, end_s)) AS b
    FROM m_calls
    WHERE in_filter AND end_s > start_s
      AND ($until IS NULL OR start_s < $until) AND ($since IS NULL OR end_s > $since)
),
bounds AS (SELECT coalesce($since, min(a)) AS w0, coalesce($until, max(b)) AS w1 FROM base),
cells AS (
    SELECT grp, a, b, unnest(generate_series(CAST(floor(a / $bucket_s) AS BIGINT), CAST(floor(b / $bucket_s) AS BIGINT))) AS k
    FROM base
),
o AS (
    SELECT grp, k, greatest(0, least(b, (k + 1) * $bucket_s) - greatest(a, k * $bucket_s)) AS overlap_s
    FROM cells
),
-- aggregate per (group, bucket) first, then put the one-row window bounds beside the buckets
agg AS (
    SELECT grp, k, count(*) FILTER (WHERE overlap_s > 0) AS calls, sum(overlap_s) AS request_s
    FROM o
    GROUP BY grp, k
)
-- final: from agg (grp, k, calls, request_s) and bounds (w0, w1), the buckets above (the rollup form,
--   rollup_concurrency.sql, sums them per minute from model_rollup_minute: agentobs/metrics/rollup.py)
SELECT grp,
       make_timestamp(CAST(k * $bucket_s * 1e6 AS BIGINT)) AS bucket_start,
       least((k + 1) * $bucket_s, w1) - greatest(k * $bucket_s, w0) AS bucket_s,
       calls,
       request_s,
       request_s / nullif(least((k + 1) * $bucket_s, w1) - greatest(k * $bucket_s, w0), 0) AS concurrency
FROM agg CROSS JOIN bounds
WHERE (k + 1) * $bucket_s > w0 AND k * $bucket_s < w1
ORDER BY grp, k
