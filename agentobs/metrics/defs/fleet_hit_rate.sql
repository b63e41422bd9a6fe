-- metric: fleet_hit_rate
-- summary: Engine-counter prefix hit rate (reset-aware) next to the span-based ΣC/ΣP
-- section: METRICS.md §2 (fleet cross-check)
-- definition: Prefix-cache hit rate from engine counters over [since, until]: vLLM Δprefix_cache_hits ÷
--   Δprefix_cache_queries (older gpu_prefix_cache_*), SGLang Δcached_tokens_total ÷ Δprompt_tokens_total (all
--   cache_source / is_streaming series summed; sglang:cache_hit_rate is never used: it is the last batch only).
--   Increases are per series between consecutive scrapes; a decrease (or a later *_created time) means the engine
--   restarted and the increase is the new value; a first scrape counts from the counter's *_created time when that
--   is in the window (vLLM; SGLang has none). Shown next to the span-based ΣC ÷ ΣP of the same instance and window.
-- unit: ratio 0–1; tokens
-- grain: one row per instance
-- sources: metric_samples (vllm:prefix_cache_*_total, sglang:cached_tokens_total, sglang:prompt_tokens_total), llm_calls
-- by: instance
WITH d AS (
    SELECT instance, any_value(engine) AS engine,
           sum(delta) FILTER (WHERE metric = 'vllm:prefix_cache_hits_total') AS v_hits,
           sum(delta) FILTER (WHERE metric = 'vllm:prefix_cache_queries_total') AS v_queries,
           sum(delta) FILTER (WHERE metric = 'vllm:gpu_prefix_cache_hits_total') AS v_gpu_hits,
           sum(delta) FILTER (WHERE metric = 'vllm:gpu_prefix_cache_queries_total') AS v_gpu_queries,
           sum(delta) FILTER (WHERE metric = 'sglang:cached_tokens_total') AS s_cached,
           sum(delta) FILTER (WHERE metric = 'sglang:prompt_tokens_total') AS s_prompt,
           count(DISTINCT ts) FILTER (WHERE reset AND metric IN ('vllm:prefix_cache_queries_total',
               'vllm:gpu_prefix_cache_queries_total', 'sglang:prompt_tokens_total')) AS restarts,
           count(DISTINCT ts) AS scrapes,
           min(ts) AS first_scrape, max(ts) AS last_scrape
    FROM m_samples
    WHERE metric IN ('vllm:prefix_cache_hits_total', 'vllm:prefix_cache_queries_total',
                     'vllm:gpu_prefix_cache_hits_total', 'vllm:gpu_prefix_cache_queries_total',
                     'sglang:cached_tokens_total', 'sglang:prompt_tokens_total')
    GROUP BY instance
),
spans AS (
    SELECT instance, count(*) AS span_calls,
           sum(cached_tokens) / nullif(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0) AS span_hit_rate
    FROM m_calls WHERE in_win GROUP BY instance
)
SELECT d.instance AS grp, d.engine,
       coalesce(d.v_queries, d.v_gpu_queries, d.s_prompt) AS query_tokens,
       coalesce(d.v_hits, d.v_gpu_hits, d.s_cached, CASE WHEN d.s_prompt IS NOT NULL THEN 0 END) AS hit_tokens,
       coalesce(d.v_hits, d.v_gpu_hits, d.s_cached, CASE WHEN d.s_prompt IS NOT NULL THEN 0 END)
           / nullif(coalesce(d.v_queries, d.v_gpu_queries, d.s_prompt), 0) AS hit_rate,
       CASE WHEN d.v_queries IS NOT NULL OR d.v_gpu_queries IS NOT NULL THEN 'vllm prefix_cache_hits / prefix_cache_queries'
            WHEN d.s_prompt IS NOT NULL THEN 'sglang cached_tokens_total / prompt_tokens_total' END AS basis,
       d.restarts, d.scrapes, d.first_scrape, d.last_scrape,
       s.span_calls, s.span_hit_rate
FROM d LEFT JOIN spans s ON s.instance = d.instance
WHERE coalesce(d.v_queries, d.v_gpu_queries, d.s_prompt) IS NOT NULL
ORDER BY d.instance
