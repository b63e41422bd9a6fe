-- turn_resume_ttft (defs/turn_resume_ttft.sql) from the maintained hourly TTFT sketches (model_sketch_hour series
-- 'ttft', agentobs/model/rollups.py) instead of m_calls, for a run over the maintained state whose window is whole
-- hours and whose filters are on the sketch's keys (agentobs/metrics/rollup.py decides, unless exact percentiles
-- are asked for): the same rows and counts (exact), each percentile read from the merged sketch with its relative
-- error bound beside it (ttft_p50_rel_err …: the exact quantile_cont x satisfies |p − x| ≤ rel_err·x), and the miss
-- penalty, a ratio of two of them, with its bound ((1 + α)/(1 − α) − 1). <ttft_q>/<ttft_all_q> are the sketch
-- quantiles, <filter> our own SQL text (list_contains over parameters), $h0/$h1 the window in hours, $by the grouping.
WITH s AS (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type END AS grp,
           gap_lo, hit_class, bin, sum(n) AS n
    FROM model_sketch_hour r
    WHERE series = 'ttft' AND ($h0 IS NULL OR hour >= $h0) AND ($h1 IS NULL OR hour < $h1) AND {filter}
    GROUP BY ALL
),
s_all AS (SELECT grp, bin, sum(n) AS n FROM s GROUP BY ALL),
agg AS ({ttft_q}),
-- the overall row of each group: the merged sketch of all its calls (a percentile of percentiles is none)
overall AS ({ttft_all_q}),
rows_ AS (
    SELECT grp, gap_lo, hit_class, n AS calls, p50 AS ttft_p50_s, p90 AS ttft_p90_s, p99 AS ttft_p99_s,
           max(p50) FILTER (WHERE hit_class = 'miss') OVER b
               / nullif(max(p50) FILTER (WHERE hit_class = 'hit') OVER b, 0) AS miss_penalty
    FROM agg
    WINDOW b AS (PARTITION BY grp, gap_lo)
    UNION ALL
    SELECT grp, -1 AS gap_lo, 'all' AS hit_class, n, p50, p90, p99, CAST(NULL AS DOUBLE) AS miss_penalty
    FROM overall
)
SELECT grp,
       CASE gap_lo WHEN -1 THEN 'all' WHEN 0 THEN '[0,1)' WHEN 1 THEN '[1,5)' WHEN 5 THEN '[5,30)'
                   WHEN 30 THEN '[30,120)' WHEN 120 THEN '[120,600)' ELSE '[600,inf)' END AS gap_bucket,
       hit_class, calls,
       ttft_p50_s, {alpha} AS ttft_p50_rel_err,
       ttft_p90_s, {alpha} AS ttft_p90_rel_err,
       ttft_p99_s, {alpha} AS ttft_p99_rel_err,
       miss_penalty, CASE WHEN miss_penalty IS NOT NULL THEN {ratio_err} END AS miss_penalty_rel_err
FROM rows_
ORDER BY grp, gap_lo, CASE hit_class WHEN 'all' THEN -1 WHEN 'hit' THEN 0 WHEN 'partial' THEN 1 ELSE 2 END
