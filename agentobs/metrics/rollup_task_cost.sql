-- task_cost (defs/task_cost.sql) from the maintained rollup model_rollup_task (agentobs/model/rollups.py) instead of
-- m_calls: the relations the definition's final part reads (base, t: the sums per group), the same values (counts and
-- token sums exact; the $ are sums of the same products taken per instance, equal to rounding), for a run over the maintained state whose window is whole hours and
-- whose filters are on the rollup's keys (agentobs/metrics/rollup.py decides). {filter} is our own SQL text
-- (list_contains over parameters), $h0/$h1 the window in hours, $by the grouping.
WITH base AS NOT MATERIALIZED (
    SELECT CASE $by WHEN 'task' THEN task_id WHEN 'task_type' THEN task_type WHEN 'session' THEN session_id
                    WHEN 'model' THEN model WHEN 'instance' THEN instance END AS grp,
           r.*
    FROM model_rollup_task r
    WHERE ($h0 IS NULL OR hour >= $h0) AND ($h1 IS NULL OR hour < $h1) AND {filter}
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
tok AS (
    SELECT grp,
           sum(calls) AS calls,
           sum(retries) AS retries,
           sum(failed_calls) AS failed_calls,
           CASE WHEN sum(n_p) > 0 THEN sum(prompt_tokens) END AS p,
           CASE WHEN sum(n_c) > 0 THEN sum(cached_tokens) END AS c,
           CASE WHEN sum(n_p) > 0 THEN sum(computed_prompt_tokens) END AS computed_p,
           CASE WHEN sum(n_o) > 0 THEN sum(output_tokens) END AS o,
           CASE WHEN sum(n_x) > 0 THEN sum(reprefill_tokens) END AS x,
           CASE WHEN sum(n_p) > 0 THEN sum(computed) END AS computed,
           CASE WHEN sum(n_final) > 0 THEN sum(computed_final) END AS computed_final,
           CASE WHEN sum(failed_calls) > 0 THEN sum(wasted_tokens) END AS wasted,
           CASE WHEN sum(ctrl_calls) > 0 THEN sum(ctrl_num) END AS ctrl_num,
           CASE WHEN sum(n_ctrl_den) > 0 THEN sum(ctrl_den) END AS ctrl_den
    FROM base
    GROUP BY grp
),
t AS (
    SELECT tok.*, k.gpu_s, k.cost_usd, k.reprefill_cost_usd, k.list_price_usd
    FROM tok JOIN costs k ON k.grp IS NOT DISTINCT FROM tok.grp
),
