-- metric: capacity
-- summary: Per instance and bucket: running KV + idle retained KV vs capacity, re-prefill rate, queue, rejections
-- section: METRICS.md §7 (the session formula), §4
-- definition: Per instance and time bucket: time-averaged KV tokens of running requests (P + O/2 over [t0, t2]),
--   KV tokens of idle retained sessions (K = P(prev) + O(prev) over retained idle windows), their sum against
--   the KV capacity, the re-prefill token rate (ΣX of calls starting in the bucket ÷ bucket), the average queue
--   length (vllm:num_requests_waiting / sglang:num_queue_reqs) and admission rejections
--   (Δ vllm:admission_rejections_total, reset-aware) — the admission cliff.
-- unit: tokens (time-averaged), tokens per second, requests, rejections
-- grain: one row per instance × bucket of metrics_bucket_s seconds
-- sources: call_reuse (llm_calls), metric_samples, instance_config / [cost] kv_capacity_tokens
-- by: instance
-- calls is read twice (bounds, src): NOT MATERIALIZED scans m_calls for each, cheaper than one scan fanned out
-- to both (docs/metrics.md, "Round 9")
WITH calls AS NOT MATERIALIZED (
    SELECT instance AS grp,
           greatest(start_s, coalesce($since, start_s)) AS a, least(end_s, coalesce($until, end_s)) AS b,
           coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0) / 2.0 AS kv
    FROM m_calls
    WHERE in_filter AND end_s > start_s AND ($until IS NULL OR start_s < $until) AND ($since IS NULL OR end_s > $since)
),
idle AS (
    SELECT instance AS grp,
           greatest(start_s - gap_before_s, coalesce($since, start_s - gap_before_s)) AS a,
           least(start_s, coalesce($until, start_s)) AS b,
           kv_tokens_before AS kv
    FROM m_calls
    WHERE in_filter AND window_outcome = 'retained' AND gap_before_s > 0
      AND ($until IS NULL OR start_s - gap_before_s < $until) AND ($since IS NULL OR start_s > $since)
),
bounds AS (SELECT coalesce($since, min(a)) AS w0, coalesce($until, max(b)) AS w1 FROM calls),
-- per instance and bucket: the pieces of the calls (request-seconds, KV token-seconds), of the retained idle windows
-- (KV token-seconds) and the re-prefill tokens of the calls starting in it
src AS (
    SELECT grp, k, greatest(0, least(b, (k + 1) * $bucket_s) - greatest(a, k * $bucket_s)) * kv AS run_kv_ts,
           greatest(0, least(b, (k + 1) * $bucket_s) - greatest(a, k * $bucket_s)) AS req_s,
           0.0 AS idle_kv_ts, 0.0 AS x
    FROM (SELECT *, unnest(generate_series(CAST(floor(a / $bucket_s) AS BIGINT), CAST(floor(b / $bucket_s) AS BIGINT))) AS k
          FROM calls)
    UNION ALL
    SELECT grp, k, 0.0, 0.0, greatest(0, least(b, (k + 1) * $bucket_s) - greatest(a, k * $bucket_s)) * kv, 0.0
    FROM (SELECT *, unnest(generate_series(CAST(floor(a / $bucket_s) AS BIGINT), CAST(floor(b / $bucket_s) AS BIGINT))) AS k
          FROM idle WHERE b > a)
    UNION ALL
    SELECT instance, CAST(floor(start_s / $bucket_s) AS BIGINT), 0.0, 0.0, 0.0, CAST(coalesce(reprefill_tokens, 0) AS DOUBLE)
    FROM m_calls WHERE in_win AND reprefill_tokens > 0
),
-- final: from bounds (w0, w1) and src (grp, k, run_kv_ts, req_s, idle_kv_ts, x), the pieces above (the rollup form,
--   rollup_capacity.sql, sums them per minute from model_rollup_minute: agentobs/metrics/rollup.py), with the engine
--   samples of each bucket
parts AS (
    SELECT grp, k, run_kv_ts, req_s, idle_kv_ts, x, NULL::DOUBLE AS queue, 0.0 AS rejections
    FROM src
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
