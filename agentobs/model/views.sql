-- Normalized model: views over the raw tables. Columns are documented in docs/schema.md.
-- Recreated on every read-write open (agentobs.store.db.migrate), so they follow the code.

-- Per trace: the task / session / task type / tenant / agent a span inherits when it lacks its own
-- (agent harnesses often put them only on the root invoke_agent span).
CREATE OR REPLACE VIEW trace_context AS
SELECT trace_id,
       arg_min(task_id, start_ns)    FILTER (WHERE task_id IS NOT NULL)    AS task_id,
       arg_min(session_id, start_ns) FILTER (WHERE session_id IS NOT NULL AND role IN ('agent', 'other')) AS session_id,
       arg_min(task_type, start_ns)  FILTER (WHERE task_type IS NOT NULL)  AS task_type,
       arg_min(tenant, start_ns)     FILTER (WHERE tenant IS NOT NULL)     AS tenant,
       arg_min(agent_name, start_ns) FILTER (WHERE agent_name IS NOT NULL) AS agent_name
FROM spans
WHERE role IN ('agent', 'gateway', 'tool', 'other')
GROUP BY trace_id;

-- Gateway-side model-call spans. When one call is traced twice (an agent SDK span with a gateway
-- span as its child), the outer span is the call and the inner one only fills gaps.
CREATE OR REPLACE VIEW _gateway_spans AS
SELECT s.*,
       (p.span_id IS NOT NULL) AS is_inner
FROM spans s
LEFT JOIN spans p
  ON p.trace_id = s.trace_id AND p.span_id = s.parent_span_id AND p.role = 'gateway'
WHERE s.role = 'gateway';

CREATE OR REPLACE VIEW _gateway_calls AS
SELECT o.trace_id, o.span_id, o.parent_span_id, o.name, o.start_ns, o.end_ns, o.status_code,
       o.ingest_source,
       coalesce(o.session_id, i.session_id)       AS session_id,
       coalesce(o.task_id, i.task_id)             AS task_id,
       coalesce(o.task_type, i.task_type)         AS task_type,
       coalesce(o.tenant, i.tenant)               AS tenant,
       coalesce(o.agent_name, i.agent_name)       AS agent_name,
       coalesce(o.attempt, i.attempt)             AS attempt,
       coalesce(o.branch, i.branch)               AS branch,
       coalesce(o.model, i.model)                 AS model,
       coalesce(o.provider, i.provider)           AS provider,
       coalesce(o.engine, i.engine)               AS engine,
       coalesce(o.instance, i.instance)           AS instance,
       coalesce(o.response_id, i.response_id)     AS response_id,
       coalesce(i.span_id, o.span_id)             AS inner_span_id,
       coalesce(o.input_tokens, i.input_tokens)   AS input_tokens,
       coalesce(o.cached_tokens, i.cached_tokens) AS cached_tokens,
       coalesce(o.output_tokens, i.output_tokens) AS output_tokens,
       coalesce(o.system_tokens, i.system_tokens) AS system_tokens,
       coalesce(o.tool_def_tokens, i.tool_def_tokens) AS tool_def_tokens,
       coalesce(o.ttft_s, i.ttft_s)               AS ttft_s,
       coalesce(o.finish_reason, i.finish_reason) AS finish_reason,
       coalesce(o.error_type, i.error_type)       AS error_type,
       coalesce(o.itl_ms, i.itl_ms)               AS itl_ms,
       coalesce(o.block_hashes, i.block_hashes)   AS block_hashes
FROM _gateway_spans o
-- the inner spans: gateway spans whose parent is a gateway span (written from the children, which have a parent
-- id: mostly none, so no table of every span's id is built for them)
LEFT JOIN (SELECT s.*, true AS is_inner FROM spans s
           WHERE s.role = 'gateway' AND s.parent_span_id IS NOT NULL
             AND EXISTS (SELECT 1 FROM spans p
                         WHERE p.trace_id = s.trace_id AND p.span_id = s.parent_span_id AND p.role = 'gateway')
           QUALIFY row_number() OVER (PARTITION BY trace_id, parent_span_id ORDER BY start_ns) = 1) i
  ON i.trace_id = o.trace_id AND i.parent_span_id = o.span_id
WHERE NOT o.is_inner;

-- Engine span ↔ gateway call: W3C parent/child first, else gateway gen_ai.response.id =
-- engine gen_ai.request.id (vLLM: chatcmpl-<X-Request-Id>). One engine span per call.
CREATE OR REPLACE VIEW _engine_match AS
SELECT * FROM (
    SELECT g.trace_id AS g_trace_id, g.span_id AS g_span_id, e.trace_id AS e_trace_id, e.span_id AS e_span_id, 1 AS prio
    FROM _gateway_calls g JOIN spans e
      ON e.role = 'engine' AND e.trace_id = g.trace_id AND e.parent_span_id = g.span_id
    UNION ALL
    SELECT g.trace_id, g.span_id, e.trace_id, e.span_id, 2
    FROM _gateway_calls g JOIN spans e
      ON e.role = 'engine' AND e.trace_id = g.trace_id AND e.parent_span_id = g.inner_span_id
    WHERE g.inner_span_id <> g.span_id
    UNION ALL
    SELECT g.trace_id, g.span_id, e.trace_id, e.span_id, 3
    FROM _gateway_calls g JOIN spans e
      ON e.role = 'engine' AND e.request_id = g.response_id
)
QUALIFY row_number() OVER (PARTITION BY e_trace_id, e_span_id ORDER BY prio) = 1
    AND row_number() OVER (PARTITION BY g_trace_id, g_span_id ORDER BY prio) = 1;

CREATE OR REPLACE VIEW _calls_joined AS
SELECT g.span_id AS call_id, g.trace_id, g.span_id, e.span_id AS engine_span_id,
       coalesce(g.session_id, tc.session_id) AS session_id,
       coalesce(g.task_id, tc.task_id, g.trace_id) AS task_id,
       coalesce(g.task_type, tc.task_type) AS task_type,
       coalesce(g.tenant, tc.tenant) AS tenant,
       coalesce(g.agent_name, tc.agent_name) AS agent_name,
       coalesce(g.attempt, 1) AS attempt,
       coalesce(g.branch, 'main') AS branch,
       coalesce(g.instance, e.instance) AS instance,
       coalesce(e.engine, g.engine) AS engine,
       coalesce(g.model, e.model) AS model,
       g.start_ns, g.end_ns,
       -- TTFT: the engine's own (its time to first token; else its queue + prefill) before the gateway's
       -- (docs/span-conventions.md); ttft_source says which; first_token_us from the start of the span it came from
       CASE WHEN e.ttft_s IS NOT NULL THEN e.ttft_s
            WHEN e.queue_s IS NOT NULL AND e.prefill_s IS NOT NULL THEN e.queue_s + e.prefill_s
            ELSE g.ttft_s END AS ttft_s,
       CASE WHEN e.ttft_s IS NOT NULL THEN 'engine'
            WHEN e.queue_s IS NOT NULL AND e.prefill_s IS NOT NULL THEN 'engine_queue_prefill'
            WHEN g.ttft_s IS NOT NULL THEN 'gateway' END AS ttft_source,
       CASE WHEN e.ttft_s IS NOT NULL THEN e.start_ns // 1000 + CAST(round(e.ttft_s * 1e6) AS BIGINT)
            WHEN e.queue_s IS NOT NULL AND e.prefill_s IS NOT NULL
                THEN e.start_ns // 1000 + CAST(round((e.queue_s + e.prefill_s) * 1e6) AS BIGINT)
            WHEN g.ttft_s IS NOT NULL THEN g.start_ns // 1000 + CAST(round(g.ttft_s * 1e6) AS BIGINT)
       END AS first_token_us,
       e.queue_s, e.prefill_s, e.decode_s,
       coalesce(g.input_tokens, e.input_tokens) AS prompt_tokens,
       coalesce(g.cached_tokens, e.cached_tokens) AS cached_tokens,
       coalesce(g.output_tokens, e.output_tokens) AS output_tokens,
       g.system_tokens, g.tool_def_tokens,
       CASE WHEN g.status_code = 2 OR g.error_type IS NOT NULL OR e.status_code = 2 OR e.error_type IS NOT NULL
            THEN 'error' ELSE 'ok' END AS status,
       coalesce(g.finish_reason, e.finish_reason) AS finish_reason,
       coalesce(g.error_type, e.error_type) AS error_type,
       coalesce(g.itl_ms, e.itl_ms) AS itl_ms,
       coalesce(g.block_hashes, e.block_hashes) AS block_hashes,
       g.response_id, e.request_id,
       CASE WHEN e.span_id IS NULL THEN 'gateway' ELSE 'gateway+engine' END AS source
FROM _gateway_calls g
LEFT JOIN _engine_match m ON m.g_trace_id = g.trace_id AND m.g_span_id = g.span_id
-- only engine spans can match (_engine_match): the join reads those, not every span
LEFT JOIN (SELECT * FROM spans WHERE role = 'engine') e ON e.trace_id = m.e_trace_id AND e.span_id = m.e_span_id
LEFT JOIN trace_context tc ON tc.trace_id = g.trace_id
UNION ALL
-- engine spans no gateway call claims: still model calls (e.g. traffic that bypasses the gateway)
SELECT e.span_id, e.trace_id, e.span_id, e.span_id,
       coalesce(e.session_id, tc.session_id), coalesce(e.task_id, tc.task_id, e.trace_id),
       coalesce(e.task_type, tc.task_type), coalesce(e.tenant, tc.tenant), coalesce(e.agent_name, tc.agent_name),
       coalesce(e.attempt, 1), coalesce(e.branch, 'main'), e.instance, e.engine, e.model,
       e.start_ns, e.end_ns,
       coalesce(e.ttft_s, e.queue_s + e.prefill_s),
       CASE WHEN e.ttft_s IS NOT NULL THEN 'engine'
            WHEN e.queue_s IS NOT NULL AND e.prefill_s IS NOT NULL THEN 'engine_queue_prefill' END,
       e.start_ns // 1000 + CAST(round(coalesce(e.ttft_s, e.queue_s + e.prefill_s) * 1e6) AS BIGINT),
       e.queue_s, e.prefill_s, e.decode_s,
       e.input_tokens, e.cached_tokens, e.output_tokens, e.system_tokens, e.tool_def_tokens,
       CASE WHEN e.status_code = 2 OR e.error_type IS NOT NULL THEN 'error' ELSE 'ok' END,
       e.finish_reason, e.error_type, e.itl_ms, e.block_hashes, e.response_id, e.request_id, 'engine'
FROM spans e
LEFT JOIN trace_context tc ON tc.trace_id = e.trace_id
WHERE e.role = 'engine'
  AND NOT EXISTS (SELECT 1 FROM _engine_match m WHERE m.e_trace_id = e.trace_id AND m.e_span_id = e.span_id);

-- One row per model call.
CREATE OR REPLACE VIEW llm_calls AS
SELECT call_id, trace_id, span_id, engine_span_id, session_id, task_id, task_type, tenant, agent_name,
       attempt, branch, instance, engine, model,
       make_timestamp(start_ns // 1000) AS start_ts,
       CASE WHEN first_token_us IS NOT NULL THEN make_timestamp(first_token_us) END AS first_token_ts,
       make_timestamp(end_ns // 1000) AS end_ts,
       start_ns / 1e9 AS start_s,
       end_ns / 1e9 AS end_s,
       ttft_s, ttft_source,
       (end_ns - start_ns) / 1e9 AS e2e_s,
       queue_s, prefill_s, decode_s,
       prompt_tokens, cached_tokens, output_tokens, system_tokens, tool_def_tokens,
       status, finish_reason, error_type, itl_ms, block_hashes, response_id, request_id, source
FROM _calls_joined;

CREATE OR REPLACE VIEW tool_calls AS
SELECT s.span_id AS tool_call_span_id, s.trace_id,
       coalesce(s.session_id, tc.session_id) AS session_id,
       coalesce(s.task_id, tc.task_id, s.trace_id) AS task_id,
       s.tool_name,
       make_timestamp(s.start_ns // 1000) AS start_ts,
       make_timestamp(s.end_ns // 1000) AS end_ts,
       s.start_ns / 1e9 AS start_s,
       s.end_ns / 1e9 AS end_s,
       (s.end_ns - s.start_ns) / 1e9 AS duration_s,
       CASE WHEN s.status_code = 2 OR s.error_type IS NOT NULL THEN 'error' ELSE 'ok' END AS status
FROM spans s
LEFT JOIN trace_context tc ON tc.trace_id = s.trace_id
WHERE s.role = 'tool';

-- Consecutive calls of a session and branch: prev(c) is the latest earlier call of the same
-- session and branch that ended before c started (METRICS.md notation); gap_s is the idle window.
CREATE OR REPLACE VIEW turn_gaps AS
SELECT c.session_id, c.branch,
       p.call_id AS prev_call_id, c.call_id,
       p.end_ts AS prev_end_ts, c.start_ts,
       c.start_s - p.end_s AS gap_s,
       p.instance AS prev_instance, c.instance,
       p.prompt_tokens AS prev_prompt_tokens, p.output_tokens AS prev_output_tokens,
       p.status AS prev_status,
       c.prompt_tokens, c.cached_tokens
FROM llm_calls c
ASOF JOIN llm_calls p
  ON p.session_id = c.session_id AND p.branch = c.branch AND c.start_s >= p.end_s
WHERE c.session_id IS NOT NULL;

-- Retries, one definition (call_reuse's is_retry; METRICS.md §7, docs/metrics.md): a call is a retry when its
-- attempt is > 1, or when prev(c) — the latest earlier call of its session and branch that ended before it started,
-- as in turn_gaps — failed and c re-sends the same number of prompt tokens. A branch's first call is never a retry
-- of its fork point. The calls of one read of llm_calls (materialized: the ASOF join reads them twice).
CREATE OR REPLACE VIEW _calls_retry AS
WITH c AS MATERIALIZED (
    SELECT call_id, session_id, task_id, task_type, tenant, agent_name, attempt, branch, instance, model,
           start_ts, end_ts, start_s, end_s, prompt_tokens, cached_tokens, output_tokens, status
    FROM llm_calls
)
SELECT c.*,
       -- a call that ended when it started may find itself as p: it is then taken to have no previous call (the
       -- one edge where call_reuse, which looks further back, can differ; zero-length calls are rare)
       coalesce(c.attempt > 1 OR (p.call_id <> c.call_id AND p.status = 'error' AND c.prompt_tokens = p.prompt_tokens),
                false) AS is_retry
FROM c
ASOF LEFT JOIN c p
  ON p.session_id = c.session_id AND p.branch = c.branch AND c.start_s >= p.end_s;

-- Session hit rate H = ΣC / ΣP over the calls whose C is known (METRICS.md §2): a call of unknown cached tokens is
-- in neither sum (calls_cached_unknown counts them). The main branch and the sub-agent branches (every other
-- branch) each get their calls and H beside the session's.
CREATE OR REPLACE VIEW sessions AS
SELECT session_id,
       arg_min(task_id, start_s) AS task_id,
       arg_min(task_type, start_s) FILTER (WHERE task_type IS NOT NULL) AS task_type,
       arg_min(tenant, start_s) FILTER (WHERE tenant IS NOT NULL) AS tenant,
       arg_min(agent_name, start_s) FILTER (WHERE agent_name IS NOT NULL) AS agent_name,
       count(*) AS calls,
       count(*) FILTER (WHERE is_retry) AS retries,
       count(DISTINCT branch) AS branches,
       count(DISTINCT instance) AS instances,
       string_agg(DISTINCT model, ',' ORDER BY model) AS models,
       min(start_ts) AS first_start_ts,
       max(end_ts) AS last_end_ts,
       max(end_s) - min(start_s) AS span_s,
       sum(prompt_tokens)::BIGINT AS prompt_tokens,
       sum(cached_tokens)::BIGINT AS cached_tokens,
       count(*) FILTER (WHERE cached_tokens IS NULL) AS calls_cached_unknown,
       sum(cached_tokens) / nullif(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0) AS hit_rate,
       count(*) FILTER (WHERE branch = 'main') AS main_calls,
       sum(cached_tokens) FILTER (WHERE branch = 'main')
           / nullif(sum(prompt_tokens) FILTER (WHERE branch = 'main' AND cached_tokens IS NOT NULL), 0)
           AS main_hit_rate,
       count(*) FILTER (WHERE branch <> 'main') AS branch_calls,
       sum(cached_tokens) FILTER (WHERE branch <> 'main')
           / nullif(sum(prompt_tokens) FILTER (WHERE branch <> 'main' AND cached_tokens IS NOT NULL), 0)
           AS branch_hit_rate,
       sum(output_tokens)::BIGINT AS output_tokens,
       count(*) FILTER (WHERE status = 'error') AS errors
FROM _calls_retry
WHERE session_id IS NOT NULL
GROUP BY session_id;

CREATE OR REPLACE VIEW tasks AS
SELECT task_id,
       arg_min(task_type, start_s) FILTER (WHERE task_type IS NOT NULL) AS task_type,
       arg_min(tenant, start_s) FILTER (WHERE tenant IS NOT NULL) AS tenant,
       arg_min(agent_name, start_s) FILTER (WHERE agent_name IS NOT NULL) AS agent_name,
       count(DISTINCT session_id) AS sessions,
       count(*) AS calls,
       count(*) FILTER (WHERE is_retry) AS retries,
       count(DISTINCT session_id || '/' || branch) AS branches,
       min(start_ts) AS first_start_ts,
       max(end_ts) AS last_end_ts,
       sum(prompt_tokens)::BIGINT AS prompt_tokens,
       sum(cached_tokens)::BIGINT AS cached_tokens,
       sum(output_tokens)::BIGINT AS output_tokens,
       count(*) FILTER (WHERE status = 'error') AS errors
FROM _calls_retry
GROUP BY task_id;

-- Engine configuration: the latest value of every key per instance, and the normalized fields
-- the metrics need (block size, KV capacity, prefix caching, HiCache, schedule policy).
CREATE OR REPLACE VIEW engine_config_latest AS
SELECT instance, key, arg_max(value, ts) AS value, arg_max(engine, ts) AS engine, max(ts) AS ts
FROM engine_config
GROUP BY instance, key;

CREATE OR REPLACE VIEW instance_config AS
WITH k AS (
    SELECT instance, any_value(engine) AS engine, max(ts) AS config_ts,
           max(value) FILTER (WHERE key = 'block_size') AS v_block_size,
           max(value) FILTER (WHERE key = 'page_size') AS v_page_size,
           max(value) FILTER (WHERE key = 'num_gpu_blocks') AS v_num_gpu_blocks,
           max(value) FILTER (WHERE key = 'num_cpu_blocks') AS v_num_cpu_blocks,
           max(value) FILTER (WHERE key = 'max_total_num_tokens') AS v_max_total_num_tokens,
           max(value) FILTER (WHERE key = 'memory_usage.token_capacity') AS v_token_capacity,
           max(value) FILTER (WHERE key = 'enable_prefix_caching') AS v_enable_prefix_caching,
           max(value) FILTER (WHERE key = 'disable_radix_cache') AS v_disable_radix_cache,
           max(value) FILTER (WHERE key = 'enable_hierarchical_cache') AS v_hicache,
           max(value) FILTER (WHERE key = 'hicache_ratio') AS v_hicache_ratio,
           max(value) FILTER (WHERE key = 'hicache_write_policy') AS v_hicache_write_policy,
           max(value) FILTER (WHERE key = 'schedule_policy') AS v_schedule_policy,
           max(value) FILTER (WHERE key = 'kv_offloading_size') AS v_kv_offloading_size,
           max(value) FILTER (WHERE key = 'kv_offloading_backend') AS v_kv_offloading_backend,
           max(value) FILTER (WHERE key = 'enable_cache_report') AS v_enable_cache_report,
           max(value) FILTER (WHERE key = 'chunked_prefill_size') AS v_chunked_prefill_size,
           max(value) FILTER (WHERE key IN ('served_model_name', 'model_path')) AS v_model,
           max(value) FILTER (WHERE key = 'cache_dtype') AS v_cache_dtype
    FROM engine_config_latest
    GROUP BY instance
)
SELECT instance, engine, config_ts,
       CASE WHEN engine = 'sglang' THEN TRY_CAST(v_page_size AS INTEGER)
            ELSE TRY_CAST(v_block_size AS INTEGER) END AS block_size,
       CASE WHEN engine = 'sglang' THEN coalesce(TRY_CAST(v_max_total_num_tokens AS BIGINT), TRY_CAST(v_token_capacity AS BIGINT))
            ELSE TRY_CAST(v_num_gpu_blocks AS BIGINT) * TRY_CAST(v_block_size AS BIGINT) END AS kv_capacity_tokens,
       CASE WHEN engine = 'sglang' THEN NOT (lower(v_disable_radix_cache) = 'true')
            WHEN v_enable_prefix_caching IS NULL THEN NULL
            ELSE lower(v_enable_prefix_caching) = 'true' END AS prefix_caching,
       CASE WHEN engine = 'sglang' THEN lower(v_hicache) = 'true' END AS hicache,
       TRY_CAST(v_hicache_ratio AS DOUBLE) AS hicache_ratio,
       v_hicache_write_policy AS hicache_write_policy,
       v_schedule_policy AS schedule_policy,
       CASE WHEN engine = 'vllm' THEN NOT (v_kv_offloading_size IS NULL OR v_kv_offloading_size IN ('None', 'null', '0', '0.0'))
                                       OR coalesce(TRY_CAST(v_num_cpu_blocks AS BIGINT), 0) > 0 END AS kv_offloading,
       CASE WHEN engine = 'sglang' THEN lower(v_enable_cache_report) = 'true' END AS cache_report,
       TRY_CAST(v_chunked_prefill_size AS BIGINT) AS chunked_prefill_size,
       v_model AS model,
       v_cache_dtype AS cache_dtype
FROM k;
