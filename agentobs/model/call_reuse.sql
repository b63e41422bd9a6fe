-- call_reuse: one row per model call with the per-call quantities of METRICS.md §1 and §4.
-- Reads six relations the caller binds as CTEs (agentobs/model/reuse.py composes them):
--   calls_src    llm_calls columns (call_id, session_id, branch, instance, start_s, end_s, P, C, O, ...)
--   cfg_src      instance_config (block_size, prefix_caching, kv_capacity_tokens)
--   kv_src       kv_events (BlockStored with session_id, BlockRemoved, AllBlocksCleared)
--   act_src      every model call of the store (instance, start_s, end_s, P, C, O, status, n): the instances'
--                activity, which calls_src may not hold whole (a metric run's pruned working set, one session's
--                calls); n: the calls a row stands for (1; a refresh's row summing an instance's calls before the
--                time its derived calls reach, agentobs/model/state.py: those calls' allocation in O, P = 0, C the
--                instance's first call's)
--   cnt_src      metric_samples of the engines' counters (preemptions, prompt/cached/generated/evicted tokens) and
--                process_start_time_seconds (restarts)
--   reuse_params one row: default_block_size, abandoned_after_s, hit_tolerance_blocks, data_end_s (the latest span
--                end in the store)
-- Columns (docs/metrics.md, "call_reuse"):
--   prev_call_id     prev(c): latest earlier call of the session and branch that ended before c started;
--                    for the first call of a non-main branch, the latest earlier call of the session (fork point)
--   reusable_tokens  R: exact (leading blocks of c present in earlier calls' block_hashes, × B) or
--                    append-only estimate (P(prev) when P(c) ≥ P(prev)); NULL when cold / context reset
--   reusable_tokens_eff  R_eff = floor(min(R, P−1)/B)·B
--   shortfall_tokens S = max(0, R_eff − C); NULL when C is unknown
--   reprefill_tokens X: exact mode S; estimate mode S when the cause is a re-prefill (cache_disabled, routed_away,
--                    evicted_*, unexplained), 0 for a hit within the tolerance and for prompt_edit
--   reprefill_low_tokens / reprefill_high_tokens  the band of X (exact: X = low = high; estimate: low = S with
--                    evidence of the cause, high = S + the decode-filled block vLLM recomputes after an eviction;
--                    a context reset's high counts the control-plane prefix, system + tool-definition tokens)
--   miss_cause       error (the call failed and measured no re-prefill) | cold | prior_hit (first call, C ≥ B: blocks
--                    the session never stored) | routed_away | cache_disabled | evicted_full | evicted_partial |
--                    prompt_edit | unexplained | unknown | NULL (no miss, or a hit within the tolerance)
--   cause_evidence   what the cause rests on: block_hashes | cache_off | other_instance | kv_removal | restart (the
--                    engine restarted in the gap) | kv_no_removal | tolerance | preemption | churn | no_churn (instance
--                    evidence) | none | NULL
--   churn_ratio      the instance's churn during the gap ÷ its pool size (estimate-mode shortfalls beyond the
--                    tolerance on the same instance, pool size known), whatever evidence decided the cause
--   hit_class        hit (C ≥ R_eff − tolerance·B) | partial | miss (C = 0) | NULL
--   window_outcome   the idle window before c: retained | evicted | routed_away | unknown
--   rent_*           token-seconds of KV at rest K = P(prev)+O(prev) over that window (§4)
-- Steps: DuckDB runs this as one query. ClickHouse inlines a CTE at every reference, so it computes the CTEs marked
-- AS MATERIALIZED or preceded by a "--@step" line once each, into a table, in order, and the rest reading those
-- (agentobs/backends/clickhouse/steps.py; docs/clickhouse.md): mark a CTE read more than once that way.
-- calls_src carries rid (a row number fixed once: m_src's column, or the view's materialized CTE), so the
-- wide rows are not copied here: c is read once (by n, so it is inlined, never materialized), bh reads
-- calls_src, and only the final SELECT joins calls_src back
WITH c AS (
    SELECT s.rid, s.call_id, s.trace_id, s.session_id, s.task_id, s.task_type, s.tenant, s.agent_name,
           s.attempt, s.branch, s.instance, s.engine, s.model, s.start_s, s.end_s, s.ttft_s, s.queue_s,
           s.prefill_s, s.decode_s, s.prompt_tokens, s.cached_tokens, s.output_tokens, s.system_tokens,
           s.tool_def_tokens, s.status, s.itl_ms, s.block_hashes,
           coalesce(ic.block_size, rp.default_block_size) AS block_size,
           CASE WHEN ic.block_size IS NOT NULL THEN 'engine_config' ELSE 'default' END AS block_size_source,
           ic.prefix_caching
    FROM calls_src s
    CROSS JOIN reuse_params rp
    LEFT JOIN cfg_src ic ON ic.instance = s.instance
),
-- the narrow working set: every step below carries only these columns (the wide rows join back at the end)
n AS MATERIALIZED (
    SELECT rid, call_id, session_id, branch, instance, start_s, end_s, prompt_tokens, cached_tokens,
           output_tokens, status, attempt, block_size, block_size_source, prefix_caching, queue_s, ttft_s, decode_s,
           block_hashes IS NOT NULL AS has_hashes, engine,
           coalesce(system_tokens, 0) + coalesce(tool_def_tokens, 0) AS control_tokens
    FROM c
),
-- prev(c) within the session and branch. Calls that started before c are the only candidates (a call
-- ends after it starts); when all of them had ended by t0(c) and the one that started last also ended
-- last (the common, sequential case), prev is that one: a single window pass (lag). Otherwise (parallel
-- or overlapping calls) search that session's calls that ended before t0(c).
lagw AS (
    SELECT rid, session_id, branch, start_s,
           max(end_s) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS m_end,
           lag(end_s) OVER w AS lag_end,
           lag(rid) OVER w AS lag_rid,
           -- the row id of the partition's first call: an integer name of (session, branch) for the turn window
           first_value(rid) OVER w AS part_id
    FROM n
    WHERE session_id IS NOT NULL
    WINDOW w AS (PARTITION BY session_id, branch ORDER BY start_s, rid)
),
slow AS (
    SELECT l.rid, arg_max(p.rid, p.end_s) AS prev_rid
    FROM (SELECT * FROM lagw WHERE m_end > start_s OR lag_end < m_end) l
    JOIN n p ON p.session_id = l.session_id AND p.branch = l.branch AND p.end_s <= l.start_s AND p.rid <> l.rid
    GROUP BY l.rid
),
--@step: read by pf and prev_id
pb AS (
    SELECT l.rid, CASE WHEN l.m_end <= l.start_s AND l.lag_end = l.m_end THEN l.lag_rid ELSE s.prev_rid END AS prev_rid,
           l.session_id,
           l.branch, l.start_s, l.part_id
    FROM lagw l LEFT JOIN slow s USING (rid)
),
-- first call of a non-main branch: the fork point is the latest earlier call of the session on any branch
pf AS (
    SELECT b.rid, arg_max(p.rid, p.end_s) AS prev_rid
    FROM (SELECT * FROM pb WHERE prev_rid IS NULL AND branch <> 'main') b
    JOIN n p ON p.session_id = b.session_id AND p.end_s <= b.start_s AND p.rid <> b.rid
    GROUP BY b.rid
),
prev_id AS (
    SELECT pb.rid, coalesce(pb.prev_rid, pf.prev_rid) AS prev_rid, pb.part_id,
           pb.prev_rid IS NULL AND pf.prev_rid IS NOT NULL AS prev_forked
    FROM pb LEFT JOIN pf USING (rid)
),
j AS (
    SELECT n.*, coalesce(pi.part_id, n.rid) AS part_id, pi.prev_forked, p.call_id AS prev_call_id,
           p.instance AS prev_instance, p.prompt_tokens AS prev_prompt_tokens,
           p.output_tokens AS prev_output_tokens, p.end_s AS prev_end_s, p.status AS prev_status,
           p.start_s AS prev_start_s,
           p.has_hashes AS prev_has_hashes
    FROM n
    LEFT JOIN prev_id pi USING (rid)
    LEFT JOIN n p ON p.rid = pi.prev_rid
),
-- exact R: leading blocks of c already present among the blocks of earlier calls of the session
--@step: read by first_seen and lead_blocks
bh AS (
    SELECT rid, session_id, start_s, unnest(block_hashes) AS h, generate_subscripts(block_hashes, 1) AS i
    FROM calls_src
    WHERE block_hashes IS NOT NULL AND session_id IS NOT NULL
),
first_seen AS (
    SELECT session_id, h, min(start_s) AS first_s FROM bh GROUP BY session_id, h
),
lead_blocks AS (
    SELECT b.rid,
           coalesce(min(b.i) FILTER (WHERE NOT (f.first_s < b.start_s)) - 1, max(b.i)) AS n_lead
    FROM bh b JOIN first_seen f ON f.session_id = b.session_id AND f.h = b.h
    GROUP BY b.rid
),
r AS (
    SELECT j.*,
           CASE WHEN j.session_id IS NULL THEN 'no_session'
                WHEN lb.n_lead IS NOT NULL AND j.prev_has_hashes THEN 'exact'
                ELSE 'estimate' END AS mode,
           CASE WHEN j.prev_call_id IS NULL THEN NULL
                WHEN lb.n_lead IS NOT NULL AND j.prev_has_hashes THEN lb.n_lead * j.block_size
                WHEN j.prompt_tokens IS NULL OR j.prev_prompt_tokens IS NULL THEN NULL
                WHEN j.prompt_tokens >= j.prev_prompt_tokens THEN j.prev_prompt_tokens
                -- a sub-agent's first call shorter than its fork point's context: it shares the fork point's
                -- control-plane prefix (system prompt, tool definitions), when the spans say how long that is
                WHEN j.prev_forked AND j.control_tokens > 0 THEN least(j.control_tokens, j.prompt_tokens)
                ELSE NULL END AS reusable_tokens,
           (j.prev_call_id IS NOT NULL AND NOT (lb.n_lead IS NOT NULL AND j.prev_has_hashes)
            AND j.prompt_tokens < j.prev_prompt_tokens AND NOT (j.prev_forked AND j.control_tokens > 0))
               AS context_reset
    FROM j LEFT JOIN lead_blocks lb USING (rid)
),
x AS (
    SELECT r.*,
           CASE WHEN reusable_tokens IS NOT NULL AND prompt_tokens IS NOT NULL
                THEN (greatest(least(reusable_tokens, prompt_tokens - 1), 0) // block_size) * block_size
           END AS reusable_tokens_eff
    FROM r
),
y AS (
    SELECT x.*,
           CASE WHEN reusable_tokens_eff IS NULL THEN NULL
                WHEN reusable_tokens_eff = 0 THEN 0
                WHEN cached_tokens IS NULL THEN NULL
                ELSE greatest(reusable_tokens_eff - cached_tokens, 0) END AS shortfall_tokens,
           CASE WHEN reusable_tokens_eff IS NULL OR cached_tokens IS NULL THEN NULL
                WHEN cached_tokens >= reusable_tokens_eff - rp.hit_tolerance_blocks * block_size THEN 'hit'
                WHEN cached_tokens = 0 THEN 'miss'
                ELSE 'partial' END AS hit_class,
           rp.hit_tolerance_blocks * block_size AS tolerance_tokens
    FROM x CROSS JOIN reuse_params rp
),
z AS MATERIALIZED (
    SELECT y.*,
           start_s - prev_end_s AS gap_before_s,
           CASE WHEN prev_call_id IS NOT NULL
                THEN coalesce(prev_prompt_tokens, 0) + coalesce(prev_output_tokens, 0) END AS kv_tokens_before,
           -- a retry (one definition: the sessions and tasks views count the same, agentobs/model/views.sql):
           -- attempt > 1, or prev(c) of its own branch failed and c re-sends the same P (a branch's first call is
           -- never a retry of its fork point: a turn and its retries stay in one branch, as turn_no counts them)
           coalesce(attempt > 1 OR (prev_status = 'error' AND NOT prev_forked AND prompt_tokens = prev_prompt_tokens),
                    false) AS is_retry,
           -- prior blocks: what the session's first call hit (blocks it never stored: a warm engine, an earlier run,
           -- a prefix shared with other sessions); its own KV events say nothing about them
           CASE WHEN session_id IS NOT NULL
                THEN coalesce(first_value(cached_tokens) OVER (PARTITION BY session_id ORDER BY start_s, rid), 0)
           END AS prior_tokens
    FROM y
),
-- kv index begin (kv_sess … kv_rm_chain read kv_src alone: agentobs.model.kvindex stores their result)
-- KV events: removals of blocks a session stored, tagged with that session (AllBlocksCleared hits all)
-- kv_sess: the sessions that stored blocks, each with an integer name sk (instance and session in one, numbered
-- in their order, so the same every run)
kv_sess AS MATERIALIZED (
    SELECT instance, session_id, row_number() OVER (ORDER BY instance, session_id) AS sk
    FROM (SELECT DISTINCT instance, session_id FROM kv_src
          WHERE type = 'BlockStored' AND len(block_hashes) > 0 AND session_id IS NOT NULL)
),
kv_st AS MATERIALIZED (
    SELECT row_number() OVER (ORDER BY e.instance, e.ts, e.seq, e.event_idx) AS eid, e.instance, k.sk, e.ts,
           e.block_hashes, e.parent_block_hash
    FROM kv_src e LEFT JOIN kv_sess k ON k.instance = e.instance AND k.session_id = e.session_id
    WHERE e.type = 'BlockStored' AND len(e.block_hashes) > 0
),
kv_store AS MATERIALIZED (
    SELECT eid, instance, sk, unnest(block_hashes) AS h, generate_subscripts(block_hashes, 1) AS i, ts
    FROM kv_st
),
-- chain depth of stored blocks (block 0 = the first block of a prompt): an event without a parent starts
-- at 0; an event whose parent block was stored before continues that chain (first storing event of
-- the parent hash on the instance, at the parent's index). Unknown (NULL) when the chain's start was not seen.
-- (only the hashes some event names as its parent: the chain edges below read nothing else)
kv_first AS MATERIALIZED (
    SELECT instance, h, min(eid) AS eid, arg_min(i, eid) AS i FROM kv_store
    WHERE (instance, h) IN (SELECT instance, parent_block_hash FROM kv_st WHERE parent_block_hash IS NOT NULL)
    GROUP BY instance, h
),
-- materialized: the recursion below reads it once per step (inlined, each step grouped every stored block again)
kv_edge AS MATERIALIZED (
    SELECT e.eid, f.eid AS parent_eid, f.i AS parent_i
    FROM kv_st e JOIN kv_first f ON f.instance = e.instance AND f.h = e.parent_block_hash
    WHERE f.eid < e.eid
),
kv_depth AS (
    WITH RECURSIVE d(eid, depth0) AS (
        SELECT eid, 0 FROM kv_st WHERE parent_block_hash IS NULL
        UNION ALL
        SELECT k.eid, d.depth0 + k.parent_i FROM kv_edge k JOIN d ON k.parent_eid = d.eid
    )
    SELECT eid, depth0 FROM d
),
kv_owner AS (
    -- the owner: the session that stored the block first (at the same time: the lesser session, every run)
    SELECT s.instance, s.h, arg_min(s.sk, (s.ts, s.sk)) AS sk, min(s.ts) AS stored_ts,
           min(d.depth0 + s.i - 1) AS depth
    FROM kv_store s LEFT JOIN kv_depth d USING (eid)
    WHERE s.sk IS NOT NULL
    GROUP BY s.instance, s.h
),
-- a block is on the session's live chain from when it was stored until the session stores another block at
-- the same depth (the chain moved on: dead-end output blocks of earlier turns, a compacted context)
kv_live AS (
    SELECT *, epoch_us(stored_ts) / 1e6 AS stored_s,
           epoch_us(lead(stored_ts) OVER (PARTITION BY sk, depth ORDER BY stored_ts, h)) / 1e6 AS superseded_s
    FROM kv_owner
),
-- removals with the removed block's chain position (AllBlocksCleared: every block, depth -1); materialized:
-- read by ev, and as kv_rm (every removal of a session's block, whatever its position) by ab. Blocks removed
-- at one time that were stored and superseded at the same times differ only in depth, and ev asks whether one
-- is below the reusable prefix: one row for them, their least depth
kv_rm_chain AS MATERIALIZED (
    SELECT s.instance, s.session_id, c.ts_s, c.stored_s, c.superseded_s, c.depth
    FROM (SELECT o.sk, epoch_us(r.ts) / 1e6 AS ts_s, o.stored_s, o.superseded_s, min(coalesce(o.depth, -1)) AS depth
          FROM (SELECT instance, ts, unnest(block_hashes) AS h FROM kv_src WHERE type = 'BlockRemoved') r
          JOIN kv_live o ON o.instance = r.instance AND o.h = r.h
          GROUP BY ALL) c
    JOIN kv_sess s USING (sk)
    UNION ALL
    SELECT s.instance, s.session_id, epoch_us(a.ts) / 1e6, NULL, NULL, -1
    FROM kv_src a JOIN kv_sess s ON s.instance = a.instance
    WHERE a.type = 'AllBlocksCleared'
),
-- kv index end
-- a removal event frees many blocks at one time (sample_data: 2.1M blocks in 10.8k events): ab needs each time once
kv_rm AS (SELECT DISTINCT instance, session_id, ts_s FROM kv_rm_chain),
kv_end AS (SELECT instance, epoch_us(max(ts)) / 1e6 AS last_s FROM kv_src GROUP BY instance),
-- the idle window's eviction: the first removal, after the previous call ended and on its instance, of a
-- block the next call would reuse — a block of the session's live chain at t2(prev) before the reusable
-- prefix ends (R_eff of c, else P(prev), in blocks), that c did not replace (a block the session superseded while
-- c ran was rewritten by c's prompt — a re-rendered tail, an edit — so its removal cost c nothing; one superseded
-- between t2(prev) and t0(c) was by another branch of the session, a sub-agent); blocks of
-- unknown depth count. Output/decode blocks of earlier turns that no prompt continues (LRU evicts them first)
-- do not end the window.
-- edit_depth: the least depth of such a removed block that c replaced (superseded while c ran): c's prompt
-- differs from there on, so what c could reuse ends there (the estimate's R = P(prev) assumes it does not)
ev AS (
    SELECT z.rid,
           min(rm.ts_s) FILTER (WHERE NOT coalesce(rm.superseded_s > z.start_s AND rm.superseded_s <= z.end_s, false))
               AS evict_ts_s,
           -- strong evidence: a removed block no call of the session had replaced by t2(c) (a removal of a block
           -- another branch superseded may be of a block c no longer has: counted in X, not in X_low)
           min(rm.ts_s) FILTER (WHERE coalesce(rm.superseded_s > z.end_s, true)) AS strong_ts_s,
           min(rm.depth) FILTER (WHERE rm.depth >= 0 AND rm.superseded_s > z.start_s AND rm.superseded_s <= z.end_s)
               AS edit_depth
    FROM (SELECT z.rid, z.session_id, z.prev_instance, z.prev_end_s, z.start_s, z.end_s,
                 coalesce(z.reusable_tokens_eff, z.prev_prompt_tokens, 0) // z.block_size AS n_blocks
          FROM z JOIN kv_sess k ON k.instance = z.prev_instance AND k.session_id = z.session_id) z
    JOIN kv_rm_chain rm
      ON rm.instance = z.prev_instance AND rm.session_id = z.session_id AND rm.ts_s >= z.prev_end_s
    WHERE rm.depth < z.n_blocks AND coalesce(rm.stored_s <= z.prev_end_s, true)
      AND coalesce(rm.superseded_s > z.prev_end_s, true)
    GROUP BY z.rid
),
-- blocks beyond the reusable prefix that c recomputed: vLLM also caches the block decoding filled (prev's last
-- partial prompt block, completed by its first output tokens), so c can reuse one block more than P(prev) — R_eff
-- stops short of it. A block of the session's live chain at t2(prev), at a depth from R_eff/B (and from C/B: not
-- hit) to c's last hit-able block, removed after t2(prev) and before c's first token and NOT superseded by t2(c),
-- when the session published BlockStored events during c (c's stores are seen): c computed that depth (not hit)
-- and stored it under the same hash (a different block there would have superseded it), so c recomputed what the
-- engine had cached. Removals of blocks stored and superseded at the same times are one row (kv_rm_chain): each
-- row counts one block, a lower bound when several such blocks go at one time.
redo_cand AS (
    SELECT z.rid, z.instance, z.session_id, z.start_s, z.end_s, rm.depth, rm.ts_s
    FROM (SELECT z.rid, z.instance, z.session_id, z.prev_instance, z.prev_end_s, z.start_s, z.end_s,
                 z.reusable_tokens_eff // z.block_size AS n_blocks,
                 z.cached_tokens // z.block_size AS n_hit,
                 (z.prompt_tokens - 1) // z.block_size AS n_max,
                 z.start_s + coalesce(z.queue_s, 0) + coalesce(z.ttft_s, 0) AS first_token_s
          FROM z JOIN kv_sess k ON k.instance = z.prev_instance AND k.session_id = z.session_id
          WHERE z.reusable_tokens_eff IS NOT NULL AND z.instance = z.prev_instance AND z.cached_tokens IS NOT NULL) z
    JOIN kv_rm_chain rm
      ON rm.instance = z.prev_instance AND rm.session_id = z.session_id AND rm.ts_s >= z.prev_end_s
    WHERE rm.depth >= greatest(z.n_blocks, z.n_hit) AND rm.depth < z.n_max AND rm.ts_s < z.first_token_s
      AND rm.stored_s <= z.prev_end_s AND coalesce(rm.superseded_s > z.end_s, true)
),
redo AS (
    SELECT rc.rid, count(DISTINCT rc.depth) AS redo_blocks, min(rc.ts_s) AS redo_ts_s
    FROM redo_cand rc
    WHERE EXISTS (SELECT 1 FROM kv_src e
                  WHERE e.type = 'BlockStored' AND e.instance = rc.instance AND e.session_id = rc.session_id
                    AND epoch_us(e.ts) / 1e6 BETWEEN rc.start_s AND rc.end_s)
    GROUP BY rc.rid
),
-- first removal after the call itself ended (for a session's last call: abandoned KV)
ab AS (
    SELECT z.rid, rm.ts_s AS abandon_evict_ts_s
    FROM (SELECT z.rid, z.session_id, z.instance, z.end_s FROM z
          JOIN kv_sess k ON k.instance = z.instance AND k.session_id = z.session_id) z
    ASOF JOIN kv_rm rm
      ON rm.instance = z.instance AND rm.session_id = z.session_id AND z.end_s <= rm.ts_s
),
tw AS (
    SELECT rid,
           CAST(sum(CASE WHEN is_retry THEN 0 ELSE 1 END) OVER (t ROWS UNBOUNDED PRECEDING) AS BIGINT) AS turn_no,
           coalesce(NOT lead(is_retry) OVER t, true) AS is_last_attempt,
           NOT coalesce(last_value(start_s) OVER (t ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) >= end_s, false) AS is_last
    FROM (SELECT rid, part_id, start_s, end_s, is_retry FROM z)
    -- part_id names the session and branch (a call without a session: its own row id, a sequence of one)
    WINDOW t AS (PARTITION BY part_id ORDER BY start_s, rid)
),
--@step: read by ie_c, rs_c, rs_ab and v
w AS (
    SELECT z.*, tw.turn_no, tw.is_last_attempt, tw.is_last,
           -- abandoned (§4): the session's last call, and the data goes on for abandoned_after_s after it ended
           -- (a session whose last call is more recent may still come back: open, not abandoned)
           coalesce(tw.is_last AND z.session_id IS NOT NULL AND rp.data_end_s - z.end_s >= rp.abandoned_after_s,
                    false) AS abandoned,
           ks.session_id IS NOT NULL AS prev_kv_known,
           ka.session_id IS NOT NULL AS own_kv_known
    FROM z
    JOIN tw USING (rid)
    CROSS JOIN reuse_params rp
    LEFT JOIN kv_sess ks ON ks.instance = z.prev_instance AND ks.session_id = z.session_id
    LEFT JOIN kv_sess ka ON ka.instance = z.instance AND ka.session_id = z.session_id
),
-- instance evidence (docs/metrics.md, "Instance evidence"): what the instance's own activity says about the gap, for
-- the estimate-mode shortfalls beyond the tolerance on the same instance whose pool size (kv_capacity_tokens) is known.
-- Both engines free cached KV least recently used first (vLLM v1: the free block queue is LRU, allocation pops its
-- head; SGLang: the radix cache evicts LRU leaves when the pool is short), so:
--   certain   a preemption / retraction on the instance during the gap (it happens only when nothing free is left:
--             every cached block free at the gap's start was evicted by then), or the gap's churn — blocks allocated
--             (computed prompt + generated tokens) or, SGLang, tokens evicted — at least the pool size
--   impossible the instance's allocation since its engine started, up to c, below the pool size less one block per
--             call (a block is popped at most once before the free queue wraps: no cached block was ever evicted),
--             and no KV-event removal on the instance before c (its events, whatever session stored the blocks)
-- The gap's churn is a lower bound (calls wholly inside the gap, from spans; counter increases over scrape intervals
-- wholly inside it); the allocation since start an upper bound (counters at the first scrape at or after c, since the
-- process started; without counters, spans since the instance's first call seen, when that call hit nothing).
--@step: read by eight ie_* CTEs
ie_c AS (
    SELECT w.rid, w.instance, w.prev_end_s, w.start_s, w.block_size, ic.kv_capacity_tokens AS cap
    FROM w JOIN cfg_src ic ON ic.instance = w.instance
    WHERE w.mode = 'estimate' AND w.instance = w.prev_instance AND w.shortfall_tokens > w.tolerance_tokens
      AND ic.kv_capacity_tokens > 0
),
-- the calls of those instances: what each allocated (computed prompt + output tokens; a failed call may have
-- allocated nothing, so it counts only toward the upper bound)
--@step: read by ie_cum and ie_span
ie_act AS (
    SELECT instance, start_s, end_s, status,
           greatest(coalesce(prompt_tokens, 0) - coalesce(cached_tokens, 0), 0) + coalesce(output_tokens, 0) AS alloc,
           coalesce(cached_tokens, 0) AS cached_tokens, n
    FROM act_src
    WHERE instance IN (SELECT instance FROM ie_c)
),
ie_cum AS (
    SELECT instance, start_s,
           sum(alloc) OVER (PARTITION BY instance ORDER BY start_s) AS cum_alloc,
           CAST(sum(n) OVER (PARTITION BY instance ORDER BY start_s) AS BIGINT) AS cum_calls,
           first_value(cached_tokens) OVER (PARTITION BY instance ORDER BY start_s) AS first_cached
    FROM ie_act
),
-- the engine counters per scrape (summed over their series): cumulative since the process started
ie_k AS (
    SELECT instance, epoch_us(ts) / 1e6 AS ts_s,
           sum(value) FILTER (WHERE metric IN ('vllm:num_preemptions_total', 'sglang:num_retracted_requests_total'))
               AS preempt,
           coalesce(sum(value) FILTER (WHERE metric = 'vllm:prompt_tokens_by_source_total'
                                             AND labels['source'] = 'local_compute'),
                    sum(value) FILTER (WHERE metric = 'vllm:prompt_tokens_total')
                      - sum(value) FILTER (WHERE metric = 'vllm:prefix_cache_hits_total'),
                    sum(value) FILTER (WHERE metric = 'sglang:prompt_tokens_total')
                      - sum(value) FILTER (WHERE metric = 'sglang:cached_tokens_total'))
             + coalesce(sum(value) FILTER (WHERE metric IN ('vllm:generation_tokens_total',
                                                            'sglang:generation_tokens_total')), 0) AS alloc,
           sum(value) FILTER (WHERE metric = 'sglang:evicted_tokens_total') AS evicted
    FROM cnt_src
    WHERE instance IN (SELECT instance FROM ie_c)
    GROUP BY instance, ts
),
-- each scrape with the increase since the previous one (a decrease: the engine restarted, the increase is the value)
--@step: read by ie_has_k, ie_cnt and ie_next
ie_kd AS (
    SELECT instance, ts_s, alloc, evicted, lag(ts_s) OVER k AS prev_ts_s,
           coalesce(preempt < lag(preempt) OVER k, false) OR coalesce(alloc < lag(alloc) OVER k, false) AS reset,
           CASE WHEN preempt < lag(preempt) OVER k THEN preempt ELSE preempt - lag(preempt) OVER k END AS d_preempt,
           CASE WHEN alloc < lag(alloc) OVER k THEN alloc ELSE alloc - lag(alloc) OVER k END AS d_alloc,
           CASE WHEN evicted < lag(evicted) OVER k THEN evicted ELSE evicted - lag(evicted) OVER k END AS d_evicted
    FROM ie_k
    WINDOW k AS (PARTITION BY instance ORDER BY ts_s)
),
ie_has_k AS (SELECT DISTINCT instance FROM ie_kd WHERE alloc IS NOT NULL),
-- the instance's first KV-event removal (of any block, whoever stored it): evictions happen there from then on
ie_rm AS (
    SELECT instance, epoch_us(min(ts)) / 1e6 AS first_rm_s FROM kv_src
    WHERE type IN ('BlockRemoved', 'AllBlocksCleared') AND instance IN (SELECT instance FROM ie_c)
    GROUP BY instance
),
ie_span AS (
    SELECT c.rid, sum(a.alloc) AS churn
    FROM ie_c c JOIN ie_act a ON a.instance = c.instance
    WHERE a.start_s >= c.prev_end_s AND a.end_s <= c.start_s AND a.status IS DISTINCT FROM 'error'
    GROUP BY c.rid
),
ie_cnt AS (
    SELECT c.rid, sum(k.d_preempt) AS preempted,
           greatest(CAST(coalesce(sum(k.d_alloc), 0) AS DOUBLE), CAST(coalesce(sum(k.d_evicted), 0) AS DOUBLE)) AS churn
    FROM ie_c c JOIN ie_kd k ON k.instance = c.instance
    WHERE k.prev_ts_s >= c.prev_end_s AND k.ts_s <= c.start_s
    GROUP BY c.rid
),
-- the upper bound on what the instance allocated before c: counters at the first scrape at or after c's start (not
-- one that restarted: its value would not count what came before), plus a block per call seen for rounding
ie_next AS (
    SELECT c.rid, k.alloc AS k_alloc, k.evicted AS k_evicted, k.reset AS k_reset
    FROM ie_c c ASOF JOIN ie_kd k ON k.instance = c.instance AND k.ts_s >= c.start_s
),
ie_before AS (
    SELECT c.rid, a.cum_alloc, a.cum_calls, a.first_cached
    FROM ie_c c ASOF JOIN ie_cum a ON a.instance = c.instance AND a.start_s < c.start_s
),
ie AS (
    SELECT c.rid, c.cap, r.first_rm_s < c.start_s AS removed_before,
           coalesce(n.preempted, 0) > 0 AS preempted,
           greatest(CAST(coalesce(s.churn, 0) AS DOUBLE), CAST(coalesce(n.churn, 0) AS DOUBLE)) AS churn_tokens,
           CASE WHEN x.k_alloc IS NOT NULL AND NOT x.k_reset
                THEN CASE WHEN x.k_evicted = 0 THEN CAST(0 AS DOUBLE)
                          ELSE x.k_alloc + CAST(c.block_size * (coalesce(b.cum_calls, 0) + 1) AS DOUBLE) END
                -- no counters on the instance: spans since its first call seen, when that call found nothing cached
                -- (a warm engine had traffic before it)
                WHEN h.instance IS NULL AND b.first_cached = 0
                THEN CAST(b.cum_alloc + c.block_size * (b.cum_calls + 1) AS DOUBLE)
           END AS alloc_hi_tokens
    FROM ie_c c
    LEFT JOIN ie_span s USING (rid)
    LEFT JOIN ie_cnt n USING (rid)
    LEFT JOIN ie_next x USING (rid)
    LEFT JOIN ie_before b USING (rid)
    LEFT JOIN ie_has_k h ON h.instance = c.instance
    LEFT JOIN ie_rm r ON r.instance = c.instance
),
-- engine restarts (docs/metrics.md, "Restarts"): a restart empties the instance's whole cache and the old process
-- publishes no removal for it. Where the instance exposes process_start_time_seconds (vLLM with one API server; SGLang
-- and multi-process vLLM do not) it gives the restart's time; otherwise a cumulative counter that decreased between
-- two scrapes places a restart between them. For the estimate-mode shortfalls on prev's instance: a restart certainly
-- inside the gap — its time in (t2(prev), t0(c)], or both bracketing scrapes in it; from t0(prev) when prev failed (a
-- call the restart dropped fails at the restart) — or one that may be (a bracket that straddles the gap's edge).
-- Exact mode too: its cause needs nothing new (the block hashes), its window's eviction time does.
--@step: read by rs_k, rs, rs_w and rs_cr
rs_c AS (
    SELECT rid, instance, session_id, start_s,
           -- the first token: the end less the decode time (the engine's, so the gateway's view: a bound at or after
           -- the engine's first token, before the blocks decoding fills), else start + queue + TTFT
           coalesce(end_s - decode_s, start_s + coalesce(queue_s, 0) + coalesce(ttft_s, 0)) AS first_s,
           prev_kv_known, CASE WHEN prev_status = 'error' THEN prev_start_s ELSE prev_end_s END AS from_s, prev_end_s
    FROM w
    WHERE mode IN ('estimate', 'exact') AND instance = prev_instance AND shortfall_tokens > 0
),
-- per series (metric and labels): a restart resets every series of a counter, while a series that stops (a label
-- value gone) would lower a sum over them without any restart
rs_k AS (
    SELECT instance, metric, labels, epoch_us(ts) / 1e6 AS ts_s, value AS v
    FROM cnt_src
    WHERE metric <> 'process_start_time_seconds' AND instance IN (SELECT instance FROM rs_c)
),
-- each restart: (lo_s, hi_s] holds it (exact: lo_s = hi_s = the process start time)
rs AS (
    SELECT DISTINCT instance, value AS lo_s, value AS hi_s, true AS exact
    FROM cnt_src
    WHERE metric = 'process_start_time_seconds' AND instance IN (SELECT instance FROM rs_c)
    UNION ALL
    SELECT DISTINCT instance, prev_ts_s, ts_s, false
    FROM (SELECT instance, ts_s, v < lag(v) OVER k AS down, lag(ts_s) OVER k AS prev_ts_s
          FROM rs_k WINDOW k AS (PARTITION BY instance, metric, labels ORDER BY ts_s))
    WHERE down AND instance NOT IN (SELECT instance FROM cnt_src WHERE metric = 'process_start_time_seconds')
),
rs_w AS (
    SELECT c.rid,
           max(CASE WHEN r.exact AND r.hi_s > c.from_s AND r.hi_s <= c.start_s THEN 1
                    WHEN NOT r.exact AND r.lo_s >= c.from_s AND r.hi_s <= c.start_s THEN 1 ELSE 0 END) = 1 AS restart,
           max(CASE WHEN r.lo_s < c.start_s AND r.hi_s > c.from_s THEN 1 ELSE 0 END) = 1 AS restart_possible,
           min(r.hi_s) FILTER (WHERE r.exact AND r.hi_s > c.from_s AND r.hi_s <= c.start_s) AS restart_ts_s
    FROM rs_c c JOIN rs r ON r.instance = c.instance
    GROUP BY c.rid
),
-- with the session's KV events, for a restart that is or may be in the gap: where c's prompt stopped sharing what the
-- instance had cached. c stores the blocks it computed before its first token (its session's BlockStored events in
-- [t0(c), first token]); those the instance had never stored by t2(prev) (any session's: a shared system prompt is
-- stored by the session that came first) are new content, and a block's hash names its whole prefix, so they are the
-- tail of c's full prompt blocks: c shared the first floor(P/B) − new blocks (rs_kv). (Counting the old blocks c stored
-- instead would miss those another call re-stored first after the restart: the dropped calls' retries come together.)
--@step: read by rs_st and rs_kv
rs_cr AS (
    SELECT c.rid, c.instance, c.session_id, c.start_s, c.first_s, c.prev_end_s
    FROM rs_c c JOIN rs_w w USING (rid)
    WHERE w.restart_possible AND c.prev_kv_known
),
--@step: read by rs_old and rs_kv
rs_st AS (
    SELECT DISTINCT c.rid, e.h
    FROM rs_cr c
    JOIN (SELECT instance, session_id, epoch_us(ts) / 1e6 AS ts_s, unnest(block_hashes) AS h
          FROM kv_src
          WHERE type = 'BlockStored' AND (instance, session_id) IN (SELECT instance, session_id FROM rs_cr)) e
      ON e.instance = c.instance AND e.session_id = c.session_id AND e.ts_s >= c.start_s AND e.ts_s <= c.first_s
),
rs_old AS (
    SELECT instance, h, min(ts_s) AS first_s
    FROM (SELECT instance, epoch_us(ts) / 1e6 AS ts_s, unnest(block_hashes) AS h
          FROM kv_src WHERE type = 'BlockStored' AND instance IN (SELECT instance FROM rs_cr))
    WHERE h IN (SELECT h FROM rs_st)
    GROUP BY instance, h
),
rs_kv AS (
    SELECT c.rid, count(*) FILTER (WHERE b.first_s IS NULL OR b.first_s > c.prev_end_s) AS new_blocks
    FROM rs_cr c
    JOIN rs_st a USING (rid)
    LEFT JOIN rs_old b ON b.instance = c.instance AND b.h = a.h
    GROUP BY c.rid
),
-- an abandoned call's KV goes with the first restart of its instance after it ended, when the engine dates it (the
-- dying process publishes no removal): abandon_rent runs to it
rs_ab AS (
    SELECT a.rid, min(s.value) AS restart_s
    FROM (SELECT rid, instance, end_s FROM w WHERE abandoned AND own_kv_known) a
    JOIN (SELECT DISTINCT instance, value FROM cnt_src WHERE metric = 'process_start_time_seconds') s
      ON s.instance = a.instance AND s.value > a.end_s
    GROUP BY a.rid
),
-- the cause of a shortfall S = R_eff − C, from evidence (docs/metrics.md, "Miss causes from evidence"). Exact mode
-- (block hashes): R is what c shares with the session's earlier prompts, so S is re-prefill; the cause ladder as
-- before. Estimate mode: R = P(prev) assumes c extends prev to the last token, so S is re-prefill only with
-- evidence: another instance, the cache off, or a KV-event removal of a block c reused before its prefill;
-- without it S within the tolerance is a hit, S beyond it is a prompt edit when the session's own KV events
-- cover the shortfall (they show no removal: the blocks were there, c no longer shares them), else unexplained
v AS (
    SELECT w.*, ev.edit_depth,
           -- the window's eviction: the first removal of a block c would reuse, the recomputed blocks beyond R_eff
           -- included (least of the two, either may be NULL)
           coalesce(least(ev.evict_ts_s, rd.redo_ts_s), ev.evict_ts_s, rd.redo_ts_s) AS evict_ts_s,
           coalesce(rd.redo_blocks, 0) * w.block_size AS redo_tokens,
           coalesce(ev.strong_ts_s < w.start_s + coalesce(w.queue_s, 0) + coalesce(w.ttft_s, 0), false) AS strong,
           -- the instance evidence (ie above)
           ie.preempted AS ie_preempted, ie.churn_tokens AS ie_churn, ie.cap AS ie_cap, ie.alloc_hi_tokens AS ie_alloc_hi,
           ie.removed_before AS ie_removed_before, ie.churn_tokens / CAST(ie.cap AS DOUBLE) AS churn_ratio,
           -- the restart evidence (rs above)
           coalesce(rw.restart, false) AS rs_restart, coalesce(rw.restart_possible, false) AS rs_possible,
           rw.restart_ts_s AS rs_ts_s,
           -- with the session's KV events: what c recomputed of what the instance had cached by t2(prev) (rs_kv)
           CASE WHEN rw.restart_possible AND w.prev_kv_known
                THEN least(greatest((w.prompt_tokens // w.block_size - coalesce(rk.new_blocks, 0)) * w.block_size
                                    - w.cached_tokens, 0), w.shortfall_tokens) END AS rs_x_kv
    FROM w
    LEFT JOIN ev USING (rid)
    LEFT JOIN redo rd USING (rid)
    LEFT JOIN ie USING (rid)
    LEFT JOIN rs_w rw USING (rid)
    LEFT JOIN rs_kv rk USING (rid)
),
v2 AS (
    SELECT v.*,
           CASE WHEN evict_ts_s IS NULL THEN NULL
                WHEN evict_ts_s < start_s THEN 'idle'
                WHEN evict_ts_s < start_s + coalesce(queue_s, 0) + coalesce(ttft_s, 0) THEN 'queued'
                ELSE 'after_resume' END AS evict_phase,
           -- a shortfall, or (S = 0) a recomputed block beyond R_eff (redo): something to explain
           CASE WHEN session_id IS NULL OR prev_call_id IS NULL OR shortfall_tokens IS NULL
                     OR (shortfall_tokens = 0 AND redo_tokens = 0) THEN NULL
                WHEN mode = 'exact' THEN 'block_hashes'
                WHEN prefix_caching = false THEN 'cache_off'
                WHEN instance <> prev_instance THEN 'other_instance'
                WHEN evict_ts_s < start_s + coalesce(queue_s, 0) + coalesce(ttft_s, 0) THEN 'kv_removal'
                -- a restart certainly inside the gap: the whole cache was emptied, evidence like a removal (before the
                -- tolerance). One that may be: with the session's KV events, c recomputing blocks the instance had
                -- cached, of which no removal was published, shows the restart came after them (else "no removal"
                -- holds); without them it rules out "never evicted"
                WHEN rs_restart OR rs_x_kv > 0 THEN 'restart'
                WHEN shortfall_tokens <= tolerance_tokens THEN 'tolerance'
                WHEN prev_kv_known AND cached_tokens >= prior_tokens THEN 'kv_no_removal'
                WHEN ie_preempted THEN 'preemption'
                WHEN ie_churn >= ie_cap THEN 'churn'
                WHEN ie_alloc_hi < ie_cap - block_size AND NOT coalesce(ie_removed_before, false) AND NOT rs_possible
                    THEN 'no_churn'
                ELSE 'none' END AS cause_evidence
    FROM v
),
u0 AS (
    SELECT v2.*,
           -- a removal: what c reused up to where its prompt changed (edit_depth), less what it hit
           CASE WHEN cause_evidence = 'kv_removal' AND edit_depth IS NOT NULL
                THEN greatest(least(reusable_tokens_eff, edit_depth * block_size) - cached_tokens, 0)
                -- a restart, with the session's KV events: what c shared of the cache, up to its new blocks, less
                -- what it hit (the rest of S was not shared: an edit, a re-rendered tail); without them all of S
                WHEN cause_evidence = 'restart' AND prev_kv_known THEN rs_x_kv
                WHEN cause_evidence IS NULL OR cause_evidence IN ('block_hashes', 'cache_off', 'other_instance',
                                                                   'kv_removal', 'restart', 'preemption', 'churn',
                                                                   'none')
                THEN shortfall_tokens ELSE 0 END AS x0,
           CASE WHEN cause_evidence = 'kv_removal' AND NOT strong THEN 0
                WHEN cause_evidence = 'kv_removal' AND edit_depth IS NOT NULL
                THEN greatest(least(reusable_tokens_eff, edit_depth * block_size) - cached_tokens, 0)
                -- a restart makes the eviction certain; how much of S it cost only the KV events say (as instance
                -- evidence: c's prompt may have changed within R)
                WHEN cause_evidence = 'restart' AND prev_kv_known THEN rs_x_kv
                -- instance evidence (preemption, churn) makes the eviction certain, not how much of S it cost: c's
                -- prompt may have changed within R (an edit, a compaction), which only per-session KV events show
                WHEN cause_evidence IS NULL OR cause_evidence IN ('block_hashes', 'cache_off', 'other_instance',
                                                                   'kv_removal')
                THEN shortfall_tokens ELSE 0 END AS x0_low,
           CASE WHEN context_reset AND cached_tokens IS NOT NULL AND prompt_tokens IS NOT NULL
                -- a reset keeps at most the control-plane prefix (system prompt, tool definitions)
                THEN greatest((greatest(least(control_tokens, prompt_tokens - 1), 0) // block_size) * block_size
                              - cached_tokens, 0)
                WHEN cause_evidence IS NULL OR cause_evidence = 'block_hashes' THEN shortfall_tokens
                -- vLLM caches the block decoding filled (the previous prompt's last partial block, completed by
                -- its first output tokens): after an eviction it recomputes that block too (docs/metrics.md)
                WHEN engine = 'vllm' AND cause_evidence IN ('kv_removal', 'restart', 'preemption', 'churn')
                     AND prev_prompt_tokens % block_size > 0
                     AND prev_prompt_tokens % block_size + coalesce(prev_output_tokens, 0) >= block_size
                     AND reusable_tokens_eff + block_size <= ((prompt_tokens - 1) // block_size) * block_size
                THEN shortfall_tokens + block_size
                ELSE shortfall_tokens END AS x0_high
    FROM v2
),
-- the blocks c recomputed beyond R_eff (redo, above) are re-prefill on the same evidence as a removal below it
--@step: read by lab and fin (ClickHouse computes it once, into a table; see the header)
u AS (
    SELECT u0.*,
           x0 + CASE WHEN cause_evidence IN ('block_hashes', 'kv_removal') THEN redo_tokens ELSE 0 END
               AS reprefill_tokens,
           x0_low + CASE WHEN cause_evidence IN ('block_hashes', 'kv_removal') THEN redo_tokens ELSE 0 END
               AS reprefill_low_tokens,
           CASE WHEN cause_evidence IN ('block_hashes', 'kv_removal') THEN greatest(x0_high, x0 + redo_tokens)
                ELSE x0_high END AS reprefill_high_tokens
    FROM u0
),
-- the labels of each call (cause, window outcome) from the evidence
lab AS (
    SELECT w.rid,
       -- a failed call (error type, HTTP error, exception, span status ERROR) is its own cause, not a hit or a
       -- cold start; one that did recompute a prefix (X > 0) keeps the cause of that recompute
       CASE WHEN w.status = 'error' AND coalesce(w.reprefill_tokens, 0) = 0 THEN 'error'
            WHEN w.session_id IS NULL THEN NULL
            WHEN w.prev_call_id IS NULL THEN CASE WHEN w.cached_tokens >= w.block_size THEN 'prior_hit' ELSE 'cold' END
            WHEN w.reusable_tokens_eff IS NULL THEN NULL
            WHEN w.shortfall_tokens IS NULL THEN 'unknown'
            WHEN w.shortfall_tokens = 0 AND w.reprefill_tokens = 0 THEN NULL
            WHEN w.cause_evidence = 'cache_off' OR (w.cause_evidence = 'block_hashes' AND w.prefix_caching = false)
                THEN 'cache_disabled'
            WHEN w.cause_evidence = 'other_instance'
                 OR (w.cause_evidence = 'block_hashes' AND w.instance <> w.prev_instance) THEN 'routed_away'
            -- a removal, but c hit all it reused up to where its prompt changed: the shortfall is the edit
            WHEN w.cause_evidence IN ('kv_removal', 'restart') AND w.reprefill_tokens = 0 THEN 'prompt_edit'
            WHEN w.cause_evidence IN ('block_hashes', 'kv_removal', 'restart', 'preemption', 'churn')
                THEN CASE WHEN w.cached_tokens = 0 THEN 'evicted_full' ELSE 'evicted_partial' END
            WHEN w.cause_evidence = 'tolerance' THEN NULL
            WHEN w.cause_evidence IN ('kv_no_removal', 'no_churn') THEN 'prompt_edit'
            ELSE 'unexplained' END AS miss_cause,
       -- the idle window: retained (a hit, or KV events that show the blocks stayed), evicted only with evidence
       -- (exact mode, the cache off, a removal), unknown when nothing says which
       CASE WHEN w.prev_call_id IS NULL THEN NULL
            WHEN w.instance <> w.prev_instance THEN 'routed_away'
            WHEN w.hit_class IS NULL THEN 'unknown'
            -- a hit of all of R_eff, but the block beyond it (vLLM's decode-filled block) was evicted and recomputed
            WHEN w.redo_tokens > 0 AND w.cause_evidence IN ('block_hashes', 'kv_removal') THEN 'evicted'
            -- the restart emptied the cache, whatever c recomputed of it
            WHEN w.cause_evidence = 'restart' THEN 'evicted'
            WHEN w.hit_class = 'hit' THEN 'retained'
            WHEN w.cause_evidence = 'kv_removal' AND w.reprefill_tokens = 0 THEN 'retained'
            WHEN w.cause_evidence IN ('block_hashes', 'cache_off', 'kv_removal', 'preemption', 'churn') THEN 'evicted'
            WHEN w.cause_evidence IN ('kv_no_removal', 'no_churn') THEN 'retained'
            ELSE 'unknown' END AS window_outcome
    FROM u w
),
-- every computed column, keyed by rid (the narrow result: the metric run stores it as is, see reuse.py)
fin AS (
    SELECT w.rid, w.instance, w.start_s, w.prompt_tokens, w.cached_tokens, w.output_tokens,
       w.block_size, w.block_size_source, w.prefix_caching,
       w.prev_call_id, w.prev_instance, w.gap_before_s, w.mode,
       w.reusable_tokens, w.reusable_tokens_eff, w.reprefill_tokens, l.miss_cause, w.context_reset, w.hit_class,
       w.is_retry, w.turn_no, w.is_last_attempt, w.is_last,
       w.kv_tokens_before, l.window_outcome,
       CASE WHEN w.prev_call_id IS NULL THEN NULL WHEN w.prev_kv_known THEN 'kv_events' ELSE 'estimate' END AS rent_mode,
       -- a window a restart ended (the restart rule, or an eviction in exact mode or by a removal with a restart
       -- certainly in the gap too): the restart's time when the instance exposes it (process_start_time_seconds; a
       -- removal before it, if any), else unknown — the dying process published no removal to date it
       CASE WHEN w.cause_evidence = 'restart' OR (w.rs_restart AND l.window_outcome = 'evicted')
            THEN CASE WHEN w.rs_ts_s IS NOT NULL THEN least(w.rs_ts_s, coalesce(w.evict_ts_s, w.rs_ts_s)) END
            ELSE w.evict_ts_s END AS evict_ts_s,
       CASE WHEN w.cause_evidence = 'restart' OR (w.rs_restart AND l.window_outcome = 'evicted')
            THEN CASE WHEN w.rs_ts_s IS NOT NULL THEN 'idle' END
            ELSE w.evict_phase END AS evict_phase,
       CASE WHEN l.window_outcome = 'retained' THEN w.kv_tokens_before * w.gap_before_s END AS rent_paid_token_s,
       CASE WHEN w.cause_evidence = 'restart' OR (w.rs_restart AND l.window_outcome = 'evicted')
                THEN CASE WHEN w.rs_ts_s IS NOT NULL
                          THEN w.kv_tokens_before * greatest(least(w.rs_ts_s, coalesce(w.evict_ts_s, w.rs_ts_s))
                                                             - w.prev_end_s, 0) END
            WHEN l.window_outcome = 'evicted' AND w.prev_kv_known
                THEN w.kv_tokens_before * (least(coalesce(w.evict_ts_s, w.start_s), w.start_s) - w.prev_end_s)
            WHEN l.window_outcome = 'routed_away' AND w.prev_kv_known AND w.evict_ts_s IS NOT NULL
                THEN w.kv_tokens_before * (w.evict_ts_s - w.prev_end_s)
       END AS rent_wasted_token_s,
       CASE WHEN w.abandoned
            THEN coalesce(w.prompt_tokens, 0) + coalesce(w.output_tokens, 0) END AS abandon_kv_tokens,
       CASE WHEN w.abandoned AND w.own_kv_known
            THEN (coalesce(w.prompt_tokens, 0) + coalesce(w.output_tokens, 0))
                 * (coalesce(least(ab.abandon_evict_ts_s, ra.restart_s), ab.abandon_evict_ts_s, ra.restart_s,
                             ke.last_s) - w.end_s) END AS abandon_rent_token_s,
       CASE WHEN w.abandoned AND w.own_kv_known THEN ab.abandon_evict_ts_s IS NULL AND ra.restart_s IS NULL
       END AS abandon_censored,
       w.abandoned,
       w.shortfall_tokens, w.reprefill_low_tokens, w.reprefill_high_tokens, w.cause_evidence, w.churn_ratio
    FROM u w
    JOIN lab l USING (rid)
    LEFT JOIN ab USING (rid)
    LEFT JOIN rs_ab ra USING (rid)
    LEFT JOIN kv_end ke ON ke.instance = w.instance
)
-- final: the call columns joined back onto the computed ones (reuse.py cuts the body here for the narrow form)
SELECT c.call_id, c.trace_id, c.session_id, c.task_id, c.task_type, c.tenant, c.agent_name, c.attempt, c.branch,
       c.instance, c.engine, c.model, c.start_s, c.end_s, c.ttft_s, c.queue_s, c.prefill_s, c.decode_s,
       c.prompt_tokens, c.cached_tokens, c.output_tokens, c.system_tokens, c.tool_def_tokens, c.status, c.itl_ms,
       f.block_size, f.block_size_source, f.prefix_caching,
       f.prev_call_id, f.prev_instance, f.gap_before_s, f.mode,
       f.reusable_tokens, f.reusable_tokens_eff, f.reprefill_tokens, f.miss_cause, f.context_reset, f.hit_class,
       f.is_retry, f.turn_no, f.is_last_attempt, f.is_last,
       f.kv_tokens_before, f.window_outcome, f.rent_mode, f.evict_ts_s, f.evict_phase,
       f.rent_paid_token_s, f.rent_wasted_token_s, f.abandon_kv_tokens, f.abandon_rent_token_s, f.abandon_censored,
       f.abandoned, f.shortfall_tokens, f.reprefill_low_tokens, f.reprefill_high_tokens, f.cause_evidence,
       f.churn_ratio
FROM fin f
JOIN calls_src c USING (rid)
