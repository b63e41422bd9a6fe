-- turn_resume_ttft (defs/turn_resume_ttft.sql) from the maintained hourly TTFT sketches (model_sketch_hour series
-- 'ttft', agentobs/model/rollups.py) instead of m_calls, for a run over the maintained state whose window is whole
-- hours and whose filters are on the sketch's keys (agentobs/metrics/rollup.py decides, unless exact percentiles
-- are asked for): the relations the definition's final part reads (agg, overall), the same rows and counts (exact),
-- each percentile read from the merged sketch; rollup.py puts its relative error bound beside it (ttft_p50_rel_err
-- …: the exact quantile_cont x satisfies |p − x| ≤ rel_err·x), and beside the miss penalty, a ratio of two of them,
-- its bound ((1 + α)/(1 − α) − 1). <ttft_q>/<ttft_all_q> are the sketch quantiles, <filter> our own SQL text
-- (list_contains over parameters), $h0/$h1 the window in hours, $by the grouping.
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
