-- metric: turn_goodput
-- summary: Good turns (last attempt ok, TTFT and ITL SLOs met) per second; waste of failed attempts
-- section: METRICS.md §7
-- definition: A turn is one logical model step: a call and its retries. It is good when its last attempt succeeded
--   and met the SLOs (TTFT ≤ ttft_slo_s, p99 of its inter-token gaps ≤ itl_slo_ms; an SLO without data is not
--   checked and the turn is counted in slo_unverified). Turn goodput = good turns ÷ window seconds; tokens
--   (P + O) of failed attempts are waste.
-- unit: turns per second; turns; tokens; ratio
-- grain: one row per group (default: instance, of the turn's last attempt)
-- sources: call_reuse (llm_calls: attempt, status, ttft_s, itl_ms)
-- by: instance, model, task_type, task, session
WITH calls AS (
    SELECT * FROM m_calls WHERE in_win
),
-- a turn: (session, branch, turn_no); a call without a session is a turn of its own
-- a turn is its first attempt and the retries after it (turn_no, call_reuse); its outcome is the last attempt's.
-- Most turns are one call (not a retry, and the last attempt): those are read as they are; only the calls of
-- turns with retries are grouped (grouping every call by turn was a 10M-group aggregation)
turns AS (
    SELECT CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type
                    WHEN 'task' THEN task_id WHEN 'session' THEN session_id END AS grp,
           1 AS attempts,
           status AS last_status,
           ttft_s AS last_ttft_s,
           list_aggregate(itl_ms, 'quantile_cont', 0.99) AS last_itl_p99_ms,
           CASE WHEN status = 'error' THEN coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0) END AS waste_tokens
    FROM calls
    WHERE is_last_attempt AND NOT is_retry
    UNION ALL
    SELECT arg_max(CASE $by WHEN 'instance' THEN instance WHEN 'model' THEN model WHEN 'task_type' THEN task_type
                            WHEN 'task' THEN task_id WHEN 'session' THEN session_id END, start_s) AS grp,
           count(*) AS attempts,
           arg_max(status, start_s) AS last_status,
           arg_max(ttft_s, start_s) AS last_ttft_s,
           arg_max(list_aggregate(itl_ms, 'quantile_cont', 0.99), start_s) AS last_itl_p99_ms,
           sum(coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0)) FILTER (WHERE status = 'error') AS waste_tokens
    FROM calls
    WHERE is_retry OR NOT is_last_attempt
    GROUP BY session_id, CASE WHEN session_id IS NULL THEN call_id END, branch, turn_no
),
judged AS (
    SELECT *,
           last_status = 'ok' AND coalesce(last_ttft_s <= $ttft_slo_s, true)
               AND coalesce(last_itl_p99_ms <= $itl_slo_ms, true) AS good,
           last_ttft_s IS NULL OR last_itl_p99_ms IS NULL AS unverified
    FROM turns
),
span AS (SELECT coalesce($until, max(end_s)) - coalesce($since, min(start_s)) AS window_s FROM calls),
-- aggregate the turns first, then put the one-row window beside the groups
agg AS (
    SELECT grp,
           count(*) AS turns,
           count(*) FILTER (WHERE good) AS good_turns,
           count(*) FILTER (WHERE last_status <> 'ok') AS failed_turns,
           count(*) FILTER (WHERE last_status = 'ok' AND NOT good) AS slo_missed_turns,
           count(*) FILTER (WHERE unverified) AS slo_unverified,
           CAST(sum(attempts) AS BIGINT) AS attempts,
           CAST(coalesce(sum(waste_tokens), 0) AS BIGINT) AS waste_tokens
    FROM judged
    GROUP BY grp
)
SELECT grp, turns, good_turns, failed_turns, slo_missed_turns, slo_unverified, attempts,
       good_turns / nullif(span.window_s, 0) AS goodput_turns_per_s,
       good_turns / turns AS good_share,
       waste_tokens,
       span.window_s AS window_s,
       $ttft_slo_s AS ttft_slo_s,
       $itl_slo_ms AS itl_slo_ms
FROM agg CROSS JOIN span
ORDER BY grp
