-- capacity (defs/capacity.sql) from the maintained minute rollup model_rollup_minute (agentobs/model/rollups.py)
-- instead of m_calls (the relations the definition's final part reads: bounds, src), for a run over the maintained
-- state whose window is whole hours, whose filters are on the rollup's keys and whose bucket is a whole number of
-- minutes (agentobs/metrics/rollup.py decides): each bucket sums its minutes' pieces (the calls' and retained idle
-- windows' overlaps and KV token-seconds, in whole pico-units; the re-prefill tokens of the calls starting in it),
-- the engine samples as the metric reads them (its final part). The window's bounds, when open, come from the per-
-- call state (<bounds>). <filter> is our own SQL text (list_contains over parameters), $since/$until the window,
-- $bucket_s the bucket.
WITH r AS (
    SELECT instance AS grp, CAST(floor(minute * 60.0 / $bucket_s) AS BIGINT) AS k,
           sum(req_ps) AS req_ps, sum(run_kv_ps) AS run_kv_ps, sum(idle_kv_ps) AS idle_kv_ps, sum(x) AS x
    FROM model_rollup_minute r
    WHERE ($since IS NULL OR minute >= $since / 60) AND ($until IS NULL OR minute < $until / 60) AND {filter}
    GROUP BY ALL
),
bounds AS ({bounds}),
src AS (
    SELECT grp, k, run_kv_ps / 1e12 AS run_kv_ts, req_ps / 1e12 AS req_s, idle_kv_ps / 1e12 AS idle_kv_ts,
           CAST(x AS DOUBLE) AS x
    FROM r
),
