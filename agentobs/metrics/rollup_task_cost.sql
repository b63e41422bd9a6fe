-- task_cost (defs/task_cost.sql) from the maintained rollup model_rollup_task (agentobs/model/rollups.py) instead of
-- m_calls: the same columns, the same values (counts and token sums exact; the $ are sums of the same products
-- taken per instance, equal to rounding), for a run over the maintained state whose window is whole hours and
-- whose filters are on the rollup's keys (agentobs/metrics/rollup.py decides). {filter} is our own SQL text
-- (list_contains over parameters), $h0/$h1 the window in hours, $by the grouping.
WITH base AS NOT MATERIALIZED (
    SELECT CASE $by WHEN 'task' THEN task_id WHEN 'task_type' THEN task_type WHEN 'session' THEN session_id
                    WHEN 'model' THEN model WHEN 'instance' THEN instance END AS grp,
           r.*
    FROM model_rollup_task r
    WHERE ($h0 IS NULL OR hour >= $h0) AND ($h1 IS NULL OR hour < $h1) AND {filter}
),
lab AS (
    SELECT grp, count(DISTINCT session_id) AS sessions, count(DISTINCT bk) AS branches,
           list_sort(list(DISTINCT inst)) AS cost_instances
    FROM (SELECT DISTINCT grp, session_id, bk, coalesce(instance, '') AS inst FROM base)
    GROUP BY grp
),
-- per group and instance: the token sums the cost columns are linear in, priced with the instance's m_cost row
-- (a cost column is NULL on a call without P: the sums count only calls with P, n_p tells whether there were any)
per_inst AS (
    SELECT b.grp,
           CASE WHEN b.n_p > 0 THEN b.computed_prompt_tokens / k.prefill_tps + b.output_p / k.decode_tps END AS gpu_s,
           CASE WHEN b.n_x > 0 THEN b.reprefill_tokens / k.prefill_tps * k.usd_per_s END AS reprefill_cost_usd,
           CASE WHEN b.n_p > 0 THEN b.computed_prompt_tokens * k.list_input_per_tok + b.cached_p * k.list_cached_per_tok
                                    + b.output_p * k.list_output_per_tok END AS list_cost_usd,
           k.usd_per_s
    FROM (SELECT grp, coalesce(instance, '') AS inst, sum(n_p) AS n_p, sum(n_x) AS n_x,
                 sum(computed_prompt_tokens) AS computed_prompt_tokens, sum(output_p) AS output_p,
                 sum(reprefill_tokens) AS reprefill_tokens, sum(cached_p) AS cached_p
          FROM base GROUP BY grp, inst) b
    LEFT JOIN m_cost k ON k.instance = b.inst
),
costs AS (
    SELECT grp, sum(gpu_s) AS gpu_s, sum(gpu_s * usd_per_s) AS cost_usd, sum(reprefill_cost_usd) AS reprefill_cost_usd,
           sum(list_cost_usd) AS list_price_usd
    FROM per_inst GROUP BY grp
),
sums AS (
SELECT grp,
       CAST(sum(calls) AS BIGINT) AS calls,
       CAST(sum(retries) AS BIGINT) AS retries,
       CAST(sum(failed_calls) AS BIGINT) AS failed_calls,
       CAST(CASE WHEN sum(n_p) > 0 THEN sum(prompt_tokens) END AS BIGINT) AS prompt_tokens,
       CAST(CASE WHEN sum(n_c) > 0 THEN sum(cached_tokens) END AS BIGINT) AS cached_tokens,
       CAST(CASE WHEN sum(n_p) > 0 THEN sum(computed_prompt_tokens) END AS BIGINT) AS computed_prompt_tokens,
       CAST(CASE WHEN sum(n_o) > 0 THEN sum(output_tokens) END AS BIGINT) AS output_tokens,
       CAST(CASE WHEN sum(n_x) > 0 THEN sum(reprefill_tokens) END AS BIGINT) AS reprefill_tokens,
       CASE WHEN sum(n_p) > 0 THEN sum(computed) END
           / nullif(CASE WHEN sum(n_final) > 0 THEN sum(computed_final) END, 0) AS amplification,
       CAST(CASE WHEN sum(failed_calls) > 0 THEN sum(wasted_tokens) END AS BIGINT) AS wasted_tokens,
       CASE WHEN sum(ctrl_calls) > 0 THEN sum(ctrl_num) END
           / nullif(CASE WHEN sum(n_ctrl_den) > 0 THEN sum(ctrl_den) END, 0) AS control_plane_share
FROM base
GROUP BY grp
),
agg AS (
SELECT s.grp, l.sessions, s.calls, s.retries, l.branches, s.* EXCLUDE (grp, calls, retries),
       c.gpu_s, c.cost_usd, c.reprefill_cost_usd, c.reprefill_cost_usd / nullif(c.cost_usd, 0) AS reprefill_cost_share,
       c.list_price_usd, l.cost_instances
FROM sums s JOIN lab l ON l.grp IS NOT DISTINCT FROM s.grp
JOIN costs c ON c.grp IS NOT DISTINCT FROM s.grp
),
basis AS (
    SELECT d.cost_instances,
           (SELECT string_agg(k.instance || ': ' || k.basis, ' | ' ORDER BY k.instance) FROM m_cost k
            WHERE list_contains(d.cost_instances, k.instance)) AS cost_basis
    FROM (SELECT DISTINCT cost_instances FROM agg) d
)
SELECT agg.* EXCLUDE (cost_instances), b.cost_basis
FROM agg LEFT JOIN basis b ON b.cost_instances = agg.cost_instances
ORDER BY cost_usd DESC NULLS LAST, grp
