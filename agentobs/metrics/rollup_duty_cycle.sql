-- duty_cycle (defs/duty_cycle.sql) by session over every call, from the maintained per-session rollup
-- model_rollup_session (agentobs/model/rollups.py: each session's busy_s and life_s, computed as that metric does):
-- the same final aggregation over one row per session. {filter} is always true here (agentobs/metrics/rollup.py
-- uses it only without a window or filters).
SELECT session_id AS grp,
       count(*) AS sessions,
       sum(busy_s) AS busy_s,
       sum(life_s) AS life_s,
       quantile_cont(busy_s / life_s, 0.25) AS duty_cycle_p25,
       quantile_cont(busy_s / life_s, 0.5) AS duty_cycle_p50,
       quantile_cont(busy_s / life_s, 0.75) AS duty_cycle_p75,
       avg(busy_s / life_s) AS duty_cycle_mean
FROM model_rollup_session r
WHERE {filter}
GROUP BY grp
ORDER BY grp
