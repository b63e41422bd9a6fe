-- metric: reprefill
-- summary: Re-prefill tokens X = max(0, R_eff − C), token and cost shares, by miss cause
-- section: METRICS.md §1, §3
-- definition: Re-prefill X = max(0, R_eff − C): prompt tokens computed again although the session had computed
--   them before; shares ΣX / (ΣX + ΣC) (of cache-related tokens) and ΣX / Σ(P − C) (of computed prefill), and
--   cost share cost(X) / total cost with the §8 cost model. By miss cause (error, cold, prior_hit, routed_away,
--   cache_disabled, evicted_full, evicted_partial, prompt_edit, unexplained, unknown; context_reset and none = no miss
--   shown separately; error = failed calls without re-prefill). Every X carries its band: exact mode X_low = X =
--   X_high; estimate mode X_low = the shortfall with evidence of its cause, X_high = every shortfall R_eff − C
--   (reprefill_low_tokens, reprefill_high_tokens and their $; mode says which modes the group's calls are in).
-- unit: tokens; ratio 0–1 (shares); USD (costs, basis in cost_basis)
-- grain: one row per group (default: one per miss cause)
-- sources: call_reuse (llm_calls, instance_config, kv_events), cost model ([cost] settings, instance_config)
-- by: cause, session, task, instance, model, task_type
-- base is read twice (t, lab): NOT MATERIALIZED scans m_calls for each, cheaper than one scan fanned out to
-- both; the labels (modes, instances) come from the distinct (group, mode, instance) triples, apart from
-- the sums: DISTINCT aggregates among the sums slow the whole aggregation (docs/metrics.md, "Round 9")
WITH base AS NOT MATERIALIZED (
    SELECT CASE $by WHEN 'cause' THEN coalesce(miss_cause, CASE WHEN session_id IS NULL THEN 'no_session'
                                                                WHEN context_reset THEN 'context_reset'
                                                                ELSE 'none' END)
                    WHEN 'session' THEN session_id WHEN 'task' THEN task_id WHEN 'instance' THEN instance
                    WHEN 'model' THEN model WHEN 'task_type' THEN task_type END AS grp,
           *
    FROM m_calls
    WHERE in_win
),
-- the partial sums per group (the ratios below are taken of these sums)
t AS (
    SELECT grp,
           count(*) AS calls,
           count(*) FILTER (WHERE reprefill_tokens > 0) AS calls_with_reprefill,
           sum(prompt_tokens) AS p,
           sum(cached_tokens) AS c,
           sum(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL) AS r_eff_c,
           sum(reprefill_tokens) AS x,
           sum(reprefill_low_tokens) AS x_low,
           sum(reprefill_high_tokens) AS x_high,
           sum(prompt_tokens - coalesce(cached_tokens, 0)) AS computed,
           sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS p_known,
           sum(cached_tokens) FILTER (WHERE reusable_tokens_eff IS NOT NULL) AS c_reuse,
           sum(cached_tokens) FILTER (WHERE reprefill_tokens IS NOT NULL) AS c_x,
           sum(prompt_tokens - cached_tokens) FILTER (WHERE reprefill_tokens IS NOT NULL) AS pc_x,
           sum(reprefill_cost_usd) AS reprefill_cost_usd,
           sum(reprefill_cost_low_usd) AS reprefill_cost_low_usd,
           sum(reprefill_cost_high_usd) AS reprefill_cost_high_usd,
           sum(cost_usd) AS cost_usd
    FROM base
    GROUP BY grp
),
-- final: from base (grp, mode, instance) and t, the sums per group above (the rollup form, rollup_reprefill.sql,
--   sums them from model_rollup_hour and prices the $ per instance: agentobs/metrics/rollup.py)
lab AS (
    SELECT grp, string_agg(DISTINCT mode, ',' ORDER BY mode) AS mode, list_sort(list(DISTINCT inst)) AS cost_instances
    FROM (SELECT DISTINCT grp, mode, coalesce(instance, '') AS inst FROM base)
    GROUP BY grp
),
sums AS (
SELECT t.grp,
       CAST(t.calls AS BIGINT) AS calls,
       CAST(t.calls_with_reprefill AS BIGINT) AS calls_with_reprefill,
       CAST(t.p AS BIGINT) AS prompt_tokens,
       CAST(t.c AS BIGINT) AS cached_tokens,
       CAST(t.r_eff_c AS BIGINT) AS reusable_tokens_eff,
       CAST(t.x AS BIGINT) AS reprefill_tokens,
       CAST(t.x_low AS BIGINT) AS reprefill_low_tokens,
       CAST(t.x_high AS BIGINT) AS reprefill_high_tokens,
       CAST(t.computed AS BIGINT) AS computed_prompt_tokens,
       t.c / nullif(t.p_known, 0) AS hit_rate,
       t.c_reuse / nullif(t.r_eff_c, 0) AS reuse_hit_rate,
       t.x / nullif(t.x + t.c_x, 0) AS share_of_cache_tokens,
       t.x / nullif(t.pc_x, 0) AS share_of_computed_prefill,
       t.reprefill_cost_usd, t.reprefill_cost_low_usd, t.reprefill_cost_high_usd, t.cost_usd,
       t.reprefill_cost_usd / nullif(t.cost_usd, 0) AS cost_share
FROM t
),
agg AS (SELECT s.*, l.mode, l.cost_instances FROM sums s JOIN lab l ON l.grp IS NOT DISTINCT FROM s.grp),
-- the fleet total (one row) is put beside the groups after aggregating; the basis text once per instance set
fleet AS (SELECT sum(cost_usd) AS fleet_cost_usd FROM agg),
basis AS (
    SELECT d.cost_instances,
           (SELECT string_agg(k.instance || ': ' || k.basis, ' | ' ORDER BY k.instance) FROM m_cost k
            WHERE list_contains(d.cost_instances, k.instance)) AS cost_basis
    FROM (SELECT DISTINCT cost_instances FROM agg) d
)
SELECT agg.grp, agg.calls, agg.calls_with_reprefill, agg.prompt_tokens, agg.cached_tokens, agg.reusable_tokens_eff,
       agg.reprefill_tokens, agg.reprefill_low_tokens, agg.reprefill_high_tokens, agg.computed_prompt_tokens, agg.hit_rate, agg.reuse_hit_rate, agg.share_of_cache_tokens,
       agg.share_of_computed_prefill, agg.reprefill_cost_usd, agg.reprefill_cost_low_usd, agg.reprefill_cost_high_usd,
       agg.cost_usd, agg.cost_share,
       agg.reprefill_cost_usd / nullif(fleet.fleet_cost_usd, 0) AS fleet_cost_share,
       agg.mode, b.cost_basis
FROM agg CROSS JOIN fleet
LEFT JOIN basis b ON b.cost_instances = agg.cost_instances
ORDER BY agg.reprefill_tokens DESC NULLS LAST, agg.grp
