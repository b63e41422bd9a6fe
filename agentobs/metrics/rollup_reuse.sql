-- reuse (defs/reuse.sql) from the maintained rollup model_rollup_task (agentobs/model/rollups.py) instead of m_calls:
-- the relation the definition's final part reads (base: the sums per session × task × instance × model × task type,
-- here per hour too), exact, for a run over the maintained state whose window is whole hours and whose filters are
-- on the rollup's keys (agentobs/metrics/rollup.py decides). <filter> is our own SQL text (list_contains over
-- parameters), $h0/$h1 the window in hours.
WITH base AS NOT MATERIALIZED (
    SELECT r.*
    FROM model_rollup_task r
    WHERE session_id IS NOT NULL AND ($h0 IS NULL OR hour >= $h0) AND ($h1 IS NULL OR hour < $h1) AND {filter}
),
