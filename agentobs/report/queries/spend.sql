-- query: spend
-- summary: Spend by every dimension of SPEND_DIMENSIONS (instance, model, task type, tenant, agent) from one scan
--   of the window's calls: calls, sessions, tasks, tokens, GPU seconds, $, share of spend, re-prefill, list price.
-- reads: m_calls
-- params:
-- template: cols, sets, dim, value (from agentobs.report.build.SPEND_DIMENSIONS)
-- notes: the calls are first summed per (dimensions, session, task) — far fewer rows than calls (a session rarely
--   changes instance or model), and enough to count distinct sessions and tasks — then GROUPING SETS gives one
--   group per value of each dimension. The spend share divides by the sum of the dimension's groups (a window
--   over the few groups). One query, not five each counting distinct sessions and tasks over every call
--   (docs/report.md has the figures).
WITH pre AS (
    SELECT {cols}, session_id, task_id, count(*) AS n,
           sum(prompt_tokens) AS p, sum(cached_tokens) AS c, sum(prompt_tokens - coalesce(cached_tokens, 0)) AS pc,
           sum(output_tokens) AS o, sum(gpu_s) AS g, sum(cost_usd) AS usd, sum(reprefill_tokens) AS x,
           sum(reprefill_cost_usd) AS x_usd, sum(list_cost_usd) AS list_usd
    FROM m_calls
    WHERE in_win
    GROUP BY {cols}, session_id, task_id
),
agg AS (
    SELECT {dim} AS dimension,
           coalesce({value}, '(none)') AS value,
           CAST(sum(n) AS BIGINT) AS calls,
           count(DISTINCT session_id) AS sessions,
           count(DISTINCT task_id) AS tasks,
           CAST(sum(p) AS BIGINT) AS prompt_tokens,
           CAST(sum(c) AS BIGINT) AS cached_tokens,
           CAST(sum(pc) AS BIGINT) AS computed_prompt_tokens,
           CAST(sum(o) AS BIGINT) AS output_tokens,
           sum(g) AS gpu_s,
           sum(usd) AS cost_usd,
           CAST(sum(x) AS BIGINT) AS reprefill_tokens,
           sum(x_usd) AS reprefill_cost_usd,
           sum(list_usd) AS list_price_usd
    FROM pre
    GROUP BY GROUPING SETS ({sets})
)
SELECT dimension, value, calls, sessions, tasks, prompt_tokens, cached_tokens, computed_prompt_tokens,
       output_tokens, gpu_s, cost_usd,
       cost_usd / nullif(sum(cost_usd) OVER (PARTITION BY dimension), 0) AS share_of_spend,
       reprefill_tokens, reprefill_cost_usd, list_price_usd
FROM agg
