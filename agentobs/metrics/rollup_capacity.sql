-- capacity (defs/capacity.sql) from the maintained minute rollup model_rollup_minute (agentobs/model/rollups.py)
-- instead of m_calls, for a run over the maintained state whose window is whole hours, whose filters are on the
-- rollup's keys and whose bucket is a whole number of minutes (agentobs/metrics/rollup.py decides): each bucket sums
-- its minutes' pieces (the calls' and retained idle windows' overlaps and KV token-seconds, in whole pico-units;
-- the re-prefill tokens of the calls starting in it), the engine samples as the metric reads them. The window's
-- bounds, when open, come from the per-call state (<bounds>). <filter> is our own SQL text (list_contains over
-- parameters), $since/$until the window, $bucket_s the bucket.
WITH r AS (
    SELECT instance AS grp, CAST(floor(minute * 60.0 / $bucket_s) AS BIGINT) AS k,
           sum(req_ps) AS req_ps, sum(run_kv_ps) AS run_kv_ps, sum(idle_kv_ps) AS idle_kv_ps, sum(x) AS x
    FROM model_rollup_minute r
    WHERE ($since IS NULL OR minute >= $since / 60) AND ($until IS NULL OR minute < $until / 60) AND {filter}
    GROUP BY ALL
),
bounds AS ({bounds}),
parts AS (
    SELECT grp, k, run_kv_ps / 1e12 AS run_kv_ts, req_ps / 1e12 AS req_s, idle_kv_ps / 1e12 AS idle_kv_ts,
           CAST(x AS DOUBLE) AS x, NULL::DOUBLE AS queue, 0.0 AS rejections
    FROM r
    UNION ALL
    SELECT instance, CAST(floor(ts_s / $bucket_s) AS BIGINT), 0.0, 0.0, 0.0, 0.0, sum(value), 0.0
    FROM m_samples WHERE metric IN ('vllm:num_requests_waiting', 'sglang:num_queue_reqs')
    GROUP BY instance, ts_s
    UNION ALL
    SELECT instance, CAST(floor(ts_s / $bucket_s) AS BIGINT), 0.0, 0.0, 0.0, 0.0, NULL, coalesce(delta, 0)
    FROM m_samples WHERE metric = 'vllm:admission_rejections_total'
),
agg AS (
    SELECT grp, k, sum(run_kv_ts) AS run_kv_ts, sum(req_s) AS req_s, sum(idle_kv_ts) AS idle_kv_ts, sum(x) AS x,
           avg(queue) AS queue, sum(rejections) AS rejections
    FROM parts GROUP BY grp, k
)
SELECT a.grp,
       make_timestamp(CAST(a.k * $bucket_s * 1e6 AS BIGINT)) AS bucket_start,
       least((a.k + 1) * $bucket_s, w1) - greatest(a.k * $bucket_s, w0) AS bucket_s,
       a.req_s / nullif(least((a.k + 1) * $bucket_s, w1) - greatest(a.k * $bucket_s, w0), 0) AS concurrency,
       a.run_kv_ts / nullif(least((a.k + 1) * $bucket_s, w1) - greatest(a.k * $bucket_s, w0), 0) AS running_kv_tokens,
       a.idle_kv_ts / nullif(least((a.k + 1) * $bucket_s, w1) - greatest(a.k * $bucket_s, w0), 0) AS idle_kv_tokens,
       c.kv_capacity_tokens,
       (a.run_kv_ts + a.idle_kv_ts) / nullif(least((a.k + 1) * $bucket_s, w1) - greatest(a.k * $bucket_s, w0), 0)
           / c.kv_capacity_tokens AS kv_demand_ratio,
       a.x / nullif(least((a.k + 1) * $bucket_s, w1) - greatest(a.k * $bucket_s, w0), 0) AS reprefill_tokens_per_s,
       a.queue AS queue_length,
       a.rejections AS admission_rejections,
       CASE WHEN a.idle_kv_ts > a.run_kv_ts THEN 'idle sessions hold more KV than running requests' END AS note
FROM agg a
CROSS JOIN bounds
LEFT JOIN m_cost c ON c.instance = coalesce(a.grp, '')
WHERE (a.k + 1) * $bucket_s > w0 AND a.k * $bucket_s < w1
ORDER BY a.grp, a.k
