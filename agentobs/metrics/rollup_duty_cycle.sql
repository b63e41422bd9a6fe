-- duty_cycle (defs/duty_cycle.sql) by session over every call, from the maintained per-session rollup
-- model_rollup_session (agentobs/model/rollups.py: each session's busy_s and life_s, computed as that metric does):
-- the relation the definition's final part reads (sess: one row per session). {filter} is always true here
-- (agentobs/metrics/rollup.py uses it only without a window or filters).
WITH sess AS (SELECT session_id AS grp, session_id, busy_s, life_s FROM model_rollup_session r WHERE {filter})
