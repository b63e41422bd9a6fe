-- metric: cost_model
-- summary: Cost basis per instance: $/h, prefill/decode tokens/s, KV capacity, bytes/token, $/token-s, g*
-- section: METRICS.md §4, §8
-- definition: The cost basis per instance: $/hour, prefill and decode throughput, KV capacity, KV bytes per token
--   (model geometry), $ per KV-token-second (= $/s ÷ KV capacity) and the break-even idle gap
--   g* = KV capacity ÷ prefill throughput, with where each number came from; plus the observed idle-gap
--   distribution against g* (windows longer than g* are cheaper to recompute than to hold).
-- unit: USD/hour, tokens/s, tokens, bytes/token, USD/(token·s), seconds
-- grain: one row per instance
-- sources: [cost] settings, instance_config, engine spans (prefill_s), call_reuse (gaps)
-- by: instance
WITH gaps AS (
    SELECT instance, count(*) AS windows, quantile_cont(gap_before_s, 0.5) AS gap_p50_s,
           quantile_cont(gap_before_s, 0.9) AS gap_p90_s,
           count(*) FILTER (WHERE gap_before_s > g_star_s) AS windows_over_g_star
    FROM m_calls
    WHERE in_win AND prev_call_id IS NOT NULL
    GROUP BY instance
)
SELECT k.instance AS grp,
       k.usd_per_s * 3600 AS usd_per_hour,
       k.prefill_tps AS prefill_tokens_per_s,
       k.decode_tps AS decode_tokens_per_s,
       k.kv_capacity_tokens,
       k.bytes_per_token,
       k.usd_per_token_s,
       k.g_star_s,
       coalesce(g.windows, 0) AS windows,
       g.gap_p50_s, g.gap_p90_s,
       coalesce(g.windows_over_g_star, 0) AS windows_over_g_star,
       k.basis,
       k.rent_basis
FROM m_cost k
LEFT JOIN gaps g ON g.instance = k.instance
WHERE k.instance <> '' OR g.windows IS NOT NULL
ORDER BY k.instance
