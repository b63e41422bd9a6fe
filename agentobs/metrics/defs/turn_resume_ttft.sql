-- metric: turn_resume_ttft
-- summary: TTFT of calls 2…n by idle-gap bucket and hit class; miss penalty = miss p50 / hit p50
-- section: METRICS.md §5
-- definition: TTFT (t1 − t0) of calls 2…n by the idle gap before them ([0,1) [1,5) [5,30) [30,120) [120,600)
--   [600,∞) s) and hit class (hit: C ≥ R_eff − B; partial; miss: C = 0): count, p50, p90, p99; the miss
--   penalty is miss p50 ÷ hit p50 in the same group and gap bucket. Each group also has one overall row
--   (gap_bucket = hit_class = 'all', first in the group): the same statistics over all its calls 2…n, every
--   gap and class (percentiles over the calls, never combined from the bucket rows), miss_penalty empty.
-- unit: seconds (TTFT), ratio (miss_penalty)
-- grain: one row per group × gap bucket × hit class, plus one overall row per group (default group: instance)
-- sources: call_reuse (llm_calls: ttft_s, gap_before_s, hit_class)
-- by: instance, model, task_type
WITH base AS (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type END AS grp,
           CASE WHEN gap_before_s < 1 THEN 0 WHEN gap_before_s < 5 THEN 1 WHEN gap_before_s < 30 THEN 5
                WHEN gap_before_s < 120 THEN 30 WHEN gap_before_s < 600 THEN 120 ELSE 600 END AS gap_lo,
           hit_class, ttft_s
    FROM m_calls
    WHERE in_win AND prev_call_id IS NOT NULL AND hit_class IS NOT NULL AND ttft_s IS NOT NULL
),
agg AS (
    SELECT grp, gap_lo, hit_class, count(*) AS n,
           quantile_cont(ttft_s, 0.5) AS p50,
           quantile_cont(ttft_s, 0.9) AS p90,
           quantile_cont(ttft_s, 0.99) AS p99
    FROM base
    GROUP BY grp, gap_lo, hit_class
),
-- the overall row of each group: its own aggregate over the calls (a percentile of percentiles is none)
overall AS (
    SELECT grp, count(*) AS n,
           quantile_cont(ttft_s, 0.5) AS p50,
           quantile_cont(ttft_s, 0.9) AS p90,
           quantile_cont(ttft_s, 0.99) AS p99
    FROM base
    GROUP BY grp
),
-- final: the rows from agg (grp, gap_lo, hit_class, n, p50, p90, p99) and overall (grp, n, p50, p90, p99); the
--   rollup form (rollup_turn_resume_ttft.sql) gives those two from the sketches (agentobs/metrics/rollup.py)
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
       ttft_p50_s,
       ttft_p90_s,
       ttft_p99_s,
       miss_penalty
FROM rows_
ORDER BY grp, gap_lo, CASE hit_class WHEN 'all' THEN -1 WHEN 'hit' THEN 0 WHEN 'partial' THEN 1 ELSE 2 END
