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
-- union of the call intervals in one sweep: in start order, each call adds the part of it that lies beyond
-- the furthest end reached by the session's earlier calls (reach), i.e. max(0, end − max(start, reach))
ordered AS (
    SELECT grp, session_id, start_s, end_s,
           max(end_s) OVER (PARTITION BY grp, session_id ORDER BY start_s, end_s
                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM base
),
sess AS (
    SELECT grp, session_id,
           sum(greatest(end_s - greatest(start_s, coalesce(reach, start_s)), 0)) AS busy_s,
           max(end_s) - min(start_s) AS life_s
    FROM ordered GROUP BY grp, session_id
    HAVING max(end_s) > min(start_s)
)
-- final: from sess, one row per group × session (busy_s, life_s) (the rollup form, rollup_duty_cycle.sql, reads them
--   from model_rollup_session: agentobs/metrics/rollup.py)
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
