-- metric: task_cost
-- summary: Per task: calls, retries, branches, tokens, re-prefill, GPU-time cost, amplification, waste
-- section: METRICS.md §7, §8
-- definition: Per task: calls, retries (attempt > 1, or the same prompt re-sent after an error), parallel branches,
--   tokens ΣP ΣC Σ(P − C) ΣO, re-prefill ΣX, GPU-time cost Σ((P − C)/prefill_tps + O/decode_tps)·$/s and its
--   re-prefill part ΣX/prefill_tps·$/s, optional list-price cost, amplification = computed tokens of all calls ÷
--   computed tokens of the final successful path (each turn's last attempt, when it succeeded), waste = tokens
--   of failed attempts, control-plane share = Σ(system + tool-definition tokens) ÷ ΣP where spans carry them.
-- unit: tokens; USD (basis in cost_basis); ratio
-- grain: one row per group (default: one per task)
-- sources: call_reuse (llm_calls), cost model ([cost] settings, instance_config, engine spans)
-- by: task, task_type, session, model, instance
-- base is read twice (t, lab): NOT MATERIALIZED scans m_calls for each, cheaper than one scan fanned out to
-- both. The distinct counts and instance lists come from the distinct (group, session, branch, instance)
-- tuples, apart from the sums: among them they slow the whole aggregation (docs/metrics.md, "Round 9")
WITH base AS NOT MATERIALIZED (
    SELECT CASE $by WHEN 'task' THEN task_id WHEN 'task_type' THEN task_type WHEN 'session' THEN session_id
                    WHEN 'model' THEN model WHEN 'instance' THEN instance END AS grp,
           *, prompt_tokens - coalesce(cached_tokens, 0) + coalesce(output_tokens, 0) AS computed,
           coalesce(session_id, call_id) || '/' || branch AS bk
    FROM m_calls
    WHERE in_win
),
-- the partial sums per group (the ratios below are taken of these sums)
t AS (
    SELECT grp,
           count(*) AS calls,
           count(*) FILTER (WHERE is_retry) AS retries,
           count(*) FILTER (WHERE status = 'error') AS failed_calls,
           sum(prompt_tokens) AS p,
           sum(cached_tokens) AS c,
           sum(prompt_tokens - coalesce(cached_tokens, 0)) AS computed_p,
           sum(output_tokens) AS o,
           sum(reprefill_tokens) AS x,
           sum(computed) AS computed,
           sum(computed) FILTER (WHERE is_last_attempt AND status = 'ok') AS computed_final,
           sum(coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0)) FILTER (WHERE status = 'error') AS wasted,
           sum(coalesce(system_tokens, 0) + coalesce(tool_def_tokens, 0))
               FILTER (WHERE system_tokens IS NOT NULL OR tool_def_tokens IS NOT NULL) AS ctrl_num,
           sum(prompt_tokens) FILTER (WHERE system_tokens IS NOT NULL OR tool_def_tokens IS NOT NULL) AS ctrl_den,
           sum(gpu_s) AS gpu_s,
           sum(cost_usd) AS cost_usd,
           sum(reprefill_cost_usd) AS reprefill_cost_usd,
           sum(list_cost_usd) AS list_price_usd
    FROM base
    GROUP BY grp
),
-- final: from base (grp, session_id, bk, instance) and t, the sums per group above (the rollup form,
--   rollup_task_cost.sql, sums them from model_rollup_task and prices the $ per instance: agentobs/metrics/rollup.py)
lab AS (
    SELECT grp, count(DISTINCT session_id) AS sessions, count(DISTINCT bk) AS branches,
           list_sort(list(DISTINCT inst)) AS cost_instances
    FROM (SELECT DISTINCT grp, session_id, bk, coalesce(instance, '') AS inst FROM base)
    GROUP BY grp
),
sums AS (
SELECT grp,
       CAST(calls AS BIGINT) AS calls,
       CAST(retries AS BIGINT) AS retries,
       CAST(failed_calls AS BIGINT) AS failed_calls,
       CAST(p AS BIGINT) AS prompt_tokens,
       CAST(c AS BIGINT) AS cached_tokens,
       CAST(computed_p AS BIGINT) AS computed_prompt_tokens,
       CAST(o AS BIGINT) AS output_tokens,
       CAST(x AS BIGINT) AS reprefill_tokens,
       computed / nullif(computed_final, 0) AS amplification,
       CAST(wasted AS BIGINT) AS wasted_tokens,
       ctrl_num / nullif(ctrl_den, 0) AS control_plane_share,
       gpu_s,
       cost_usd,
       reprefill_cost_usd,
       reprefill_cost_usd / nullif(cost_usd, 0) AS reprefill_cost_share,
       list_price_usd
FROM t
),
-- the columns in their documented order
agg AS (
SELECT s.grp, l.sessions, s.calls, s.retries, l.branches, s.* EXCLUDE (grp, calls, retries), l.cost_instances
FROM sums s JOIN lab l ON l.grp IS NOT DISTINCT FROM s.grp
)
-- the basis text once per distinct set of instances (not once per group: the groups are tasks, the sets few)
, basis AS (
    SELECT d.cost_instances,
           (SELECT string_agg(k.instance || ': ' || k.basis, ' | ' ORDER BY k.instance) FROM m_cost k
            WHERE list_contains(d.cost_instances, k.instance)) AS cost_basis
    FROM (SELECT DISTINCT cost_instances FROM agg) d
)
SELECT agg.* EXCLUDE (cost_instances), b.cost_basis
FROM agg LEFT JOIN basis b ON b.cost_instances = agg.cost_instances
ORDER BY cost_usd DESC NULLS LAST, grp
