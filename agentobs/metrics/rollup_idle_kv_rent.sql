-- idle_kv_rent (defs/idle_kv_rent.sql) from the maintained hour rollup model_rollup_hour (agentobs/model/rollups.py)
-- instead of m_calls, for a run over the maintained state whose window is whole hours and whose filters are on the
-- rollup's keys (agentobs/metrics/rollup.py decides): the relations the definition's final part reads (base, span,
-- prev_sums, agg: the sums per group), the same values — counts and token sums exact, token-seconds summed from
-- whole micro-token-seconds (within 1e-6 token-s per call), $ priced per instance (equal to rounding) — except the
-- idle-gap percentiles, read from the merged hourly gap sketches (model_sketch_hour series 'gap'; rollup.py puts
-- their relative error bound beside each: gap_p50_rel_err, gap_p90_rel_err). Windows over g* (a threshold the cost
-- model sets) are counted from the per-call state. <filter> is our own SQL text (list_contains over parameters),
-- <span> the window's length, <gap_q> the sketch quantiles (rollup.py), $h0/$h1 the window in hours, $by the
-- grouping.
WITH base AS NOT MATERIALIZED (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type END AS grp,
           r.*
    FROM model_rollup_hour r
    WHERE sess AND ($h0 IS NULL OR hour >= $h0) AND ($h1 IS NULL OR hour < $h1) AND {filter}
),
span AS ({span}),
prev_sums AS (
    SELECT grp, prev_key,
           CASE WHEN sum(n_rent_paid) > 0 THEN sum(rent_paid_us) / 1e6 END AS rent_paid_token_s,
           CASE WHEN sum(n_rent_wasted) > 0 THEN sum(rent_wasted_us) / 1e6 END AS rent_wasted_token_s
    FROM base GROUP BY grp, prev_key
),
-- per group and the call's own instance: its bytes, $ and g* (avg over the calls = Σ calls·g* ÷ calls with one)
by_inst AS (
    SELECT b.grp,
           CASE WHEN b.n_abandoned_kv > 0 THEN b.abandoned_kv_tokens * k.bytes_per_token END AS abandoned_kv_bytes,
           CASE WHEN b.n_abandoned_rent > 0 THEN b.abandoned_rent_us / 1e6 * k.usd_per_token_s END AS abandoned_rent_usd,
           b.calls * k.g_star_s AS g_sum, CASE WHEN k.g_star_s IS NOT NULL THEN b.calls END AS g_n
    FROM (SELECT grp, coalesce(instance, '') AS inst, sum(calls) AS calls, sum(n_abandoned_kv) AS n_abandoned_kv,
                 sum(abandoned_kv_tokens) AS abandoned_kv_tokens, sum(n_abandoned_rent) AS n_abandoned_rent,
                 sum(abandoned_rent_us) AS abandoned_rent_us
          FROM base GROUP BY grp, inst) b
    LEFT JOIN m_cost k ON k.instance = b.inst
),
inst_sums AS (
    SELECT grp, sum(abandoned_kv_bytes) AS abandoned_kv_bytes, sum(abandoned_rent_usd) AS abandoned_rent_usd,
           sum(g_sum) / sum(g_n) AS g_star_s
    FROM by_inst GROUP BY grp
),
tok AS (
    SELECT grp,
           CAST(sum(windows) AS BIGINT) AS windows,
           CAST(sum(retained) AS BIGINT) AS retained,
           CAST(sum(evicted) AS BIGINT) AS evicted,
           CAST(sum(routed_away) AS BIGINT) AS routed_away,
           CAST(sum(unknown) AS BIGINT) AS unknown,
           CASE WHEN sum(n_rent_paid) > 0 THEN sum(rent_paid_us) / 1e6 END AS rent_paid_token_s,
           CASE WHEN sum(n_rent_wasted) > 0 THEN sum(rent_wasted_us) / 1e6 END AS rent_wasted_token_s,
           CAST(sum(evicted_rent_unknown) AS BIGINT) AS evicted_rent_unknown,
           CAST(sum(evicted_while_idle) AS BIGINT) AS evicted_while_idle,
           CAST(sum(evicted_while_queued) AS BIGINT) AS evicted_while_queued,
           CAST(sum(abandoned) AS BIGINT) AS abandoned,
           CAST(sum(open_sessions) AS BIGINT) AS open_sessions,
           CAST(CASE WHEN sum(n_abandoned_kv) > 0 THEN sum(abandoned_kv_tokens) END AS BIGINT) AS abandoned_kv_tokens,
           CASE WHEN sum(n_abandoned_rent) > 0 THEN sum(abandoned_rent_us) / 1e6 END AS abandoned_rent_token_s,
           CAST(sum(abandoned_still_resident) AS BIGINT) AS abandoned_still_resident,
           CASE WHEN sum(n_running) > 0 THEN sum(running_kv_us) / 1e6 END AS running_kv_token_s,
           sum(kv_event_windows) AS kv_event_windows,
           sum(estimate_windows) AS estimate_windows
    FROM base
    GROUP BY grp
),
gs AS (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type END AS grp,
           bin, sum(n) AS n
    FROM model_sketch_hour r
    WHERE series = 'gap' AND ($h0 IS NULL OR hour >= $h0) AND ($h1 IS NULL OR hour < $h1) AND {filter}
    GROUP BY ALL
),
gq AS ({gap_q}),
-- a threshold per instance the cost model sets: counted over the per-call state (one narrow filtered scan)
over_g AS (
    SELECT CASE $by WHEN 'instance' THEN r.instance WHEN 'model' THEN r.model WHEN 'task_type' THEN r.task_type END
               AS grp,
           count(*) AS windows_over_g_star
    FROM model_calls r JOIN m_cost k ON k.instance = coalesce(r.instance, '')
    WHERE r.session_id IS NOT NULL AND r.gap_before_s > k.g_star_s
      AND ($h0 IS NULL OR r.start_s >= $h0 * 3600.0) AND ($h1 IS NULL OR r.start_s < $h1 * 3600.0) AND {filter}
    GROUP BY ALL
),
agg AS (
    SELECT t.*, s.abandoned_kv_bytes, s.abandoned_rent_usd, g.p50 AS gap_p50_s, g.p90 AS gap_p90_s, s.g_star_s,
           coalesce(o.windows_over_g_star, 0) AS windows_over_g_star
    FROM tok t
    JOIN inst_sums s ON s.grp IS NOT DISTINCT FROM t.grp
    LEFT JOIN gq g ON g.grp IS NOT DISTINCT FROM t.grp
    LEFT JOIN over_g o ON o.grp IS NOT DISTINCT FROM t.grp
),
