-- metric: duty_cycle
-- summary: Union of a session's call intervals / its life span (last end − first start)
-- section: METRICS.md §7
-- definition: Duty cycle of a session = length of the union of its call intervals ÷ (last end − first start):
--   the share of a session's life spent in model calls (AgentSysBench median: 20%). Per session, or the
--   distribution of sessions (p25/p50/p75, mean) per group. Sessions with a zero life span are left out.
-- unit: ratio 0–1; seconds
-- grain: one row per group (default: one per session)
-- sources: llm_calls (start/end of calls in [since, until))
-- by: session, task, task_type, model, instance
WITH base AS (
    SELECT CASE $by WHEN 'session' THEN session_id WHEN 'task' THEN task_id WHEN 'task_type' THEN task_type
                    WHEN 'model' THEN model WHEN 'instance' THEN instance END AS grp,
           session_id, start_s, end_s
    FROM m_calls
    WHERE in_win AND session_id IS NOT NULL AND end_s >= start_s
),
ordered AS (
    SELECT *, max(end_s) OVER (PARTITION BY grp, session_id ORDER BY start_s, end_s
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM base
),
islands AS (
    SELECT *, sum(CASE WHEN reach IS NULL OR start_s > reach THEN 1 ELSE 0 END)
                  OVER (PARTITION BY grp, session_id ORDER BY start_s, end_s ROWS UNBOUNDED PRECEDING) AS island
    FROM ordered
),
busy AS (
    SELECT grp, session_id, island, max(end_s) - min(start_s) AS busy_s, min(start_s) AS s0, max(end_s) AS s1
    FROM islands GROUP BY grp, session_id, island
),
sess AS (
    SELECT grp, session_id, sum(busy_s) AS busy_s, max(s1) - min(s0) AS life_s, count(*) AS bursts
    FROM busy GROUP BY grp, session_id
    HAVING max(s1) > min(s0)
)
SELECT grp,
       count(*) AS sessions,
       sum(busy_s) AS busy_s,
       sum(life_s) AS life_s,
       quantile_cont(busy_s / life_s, 0.25) AS duty_cycle_p25,
       quantile_cont(busy_s / life_s, 0.5) AS duty_cycle_p50,
       quantile_cont(busy_s / life_s, 0.75) AS duty_cycle_p75,
       avg(busy_s / life_s) AS duty_cycle_mean
FROM sess
GROUP BY grp
ORDER BY grp
