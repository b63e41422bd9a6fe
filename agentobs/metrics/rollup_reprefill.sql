-- reprefill (defs/reprefill.sql) from the maintained hour rollup model_rollup_hour (agentobs/model/rollups.py) instead
-- of m_calls: the relations the definition's final part reads (base, t: the sums per group), the same values (counts
-- and token sums exact; the $ are the same products summed per instance, equal to rounding), for a run over the
-- maintained state whose window is whole hours and whose filters are on the rollup's keys
-- (agentobs/metrics/rollup.py decides). <filter> is our own SQL text (list_contains over parameters), $h0/$h1 the
-- window in hours, $by the grouping.
WITH base AS NOT MATERIALIZED (
    SELECT CASE $by WHEN 'cause' THEN cause WHEN 'instance' THEN instance WHEN 'model' THEN model
                    WHEN 'task_type' THEN task_type END AS grp,
           r.*
    FROM model_rollup_hour r
    WHERE ($h0 IS NULL OR hour >= $h0) AND ($h1 IS NULL OR hour < $h1) AND {filter}
),
-- per group and instance: the token sums the cost columns are linear in, priced with the instance's m_cost row (a
-- cost column is NULL on a call without its tokens: n_* say whether any call had them)
per_inst AS (
    SELECT b.grp,
           CASE WHEN b.n_x > 0 THEN b.x / k.prefill_tps * k.usd_per_s END AS reprefill_cost_usd,
           CASE WHEN b.n_x_low > 0 THEN b.x_low / k.prefill_tps * k.usd_per_s END AS reprefill_cost_low_usd,
           CASE WHEN b.n_x_high > 0 THEN b.x_high / k.prefill_tps * k.usd_per_s END AS reprefill_cost_high_usd,
           CASE WHEN b.n_p > 0
                THEN (b.computed_prompt_tokens / k.prefill_tps + b.output_p / k.decode_tps) * k.usd_per_s END AS cost_usd
    FROM (SELECT grp, coalesce(instance, '') AS inst, sum(n_x) AS n_x, sum(x) AS x, sum(n_x_low) AS n_x_low,
                 sum(x_low) AS x_low, sum(n_x_high) AS n_x_high, sum(x_high) AS x_high, sum(n_p) AS n_p,
                 sum(computed_prompt_tokens) AS computed_prompt_tokens, sum(output_p) AS output_p
          FROM base GROUP BY grp, inst) b
    LEFT JOIN m_cost k ON k.instance = b.inst
),
costs AS (
    SELECT grp, sum(reprefill_cost_usd) AS reprefill_cost_usd, sum(reprefill_cost_low_usd) AS reprefill_cost_low_usd,
           sum(reprefill_cost_high_usd) AS reprefill_cost_high_usd, sum(cost_usd) AS cost_usd
    FROM per_inst GROUP BY grp
),
tok AS (
    SELECT grp, sum(calls) AS calls, sum(calls_with_reprefill) AS calls_with_reprefill,
           CASE WHEN sum(n_p) > 0 THEN sum(prompt_tokens) END AS p,
           CASE WHEN sum(n_c) > 0 THEN sum(cached_tokens) END AS c,
           CASE WHEN sum(n_r_eff_c) > 0 THEN sum(r_eff_c) END AS r_eff_c,
           CASE WHEN sum(n_x) > 0 THEN sum(x) END AS x,
           CASE WHEN sum(n_x_low) > 0 THEN sum(x_low) END AS x_low,
           CASE WHEN sum(n_x_high) > 0 THEN sum(x_high) END AS x_high,
           CASE WHEN sum(n_p) > 0 THEN sum(computed_prompt_tokens) END AS computed,
           CASE WHEN sum(n_p_known) > 0 THEN sum(p_known) END AS p_known,
           CASE WHEN sum(n_c_reuse) > 0 THEN sum(c_reuse) END AS c_reuse,
           CASE WHEN sum(n_c_x) > 0 THEN sum(c_x) END AS c_x,
           CASE WHEN sum(n_pc_x) > 0 THEN sum(pc_x) END AS pc_x
    FROM base GROUP BY grp
),
t AS (
    SELECT tok.*, k.reprefill_cost_usd, k.reprefill_cost_low_usd, k.reprefill_cost_high_usd, k.cost_usd
    FROM tok JOIN costs k ON k.grp IS NOT DISTINCT FROM tok.grp
),
