"""Long-prefill ITL interference: decode tail latency caused by long prefills co-scheduled with it.

Trigger (METRICS.md §6): on an instance, of the tail inter-token gaps (above ``itl_slo_ms``, or the
p99 of all gaps with ``itl_tail_threshold = p99``) at least ``findings_itl_long_prefill_share``
overlap a prefill window ``[t0 + queue, t1]`` of another call on the same instance whose attributed
prefill (the overlapping one computing the most tokens P − C; a tie: the greater call id) computed
≥ ``long_prefill_tokens``; at least ``findings_itl_min_tail_gaps`` tail gaps.

Evidence: gaps, tail gaps, the share attributed to long prefills, p50/p99 ITL with and without an
overlapping long prefill (the p50 barely moves — the damage is in the tail), the offending prefills
and how much of them was re-prefill (recompute tax paid twice: in GPU time, and in other users' ITL).

Fix: a smaller chunked-prefill budget (SGLang ``--chunked-prefill-size``), priority scheduling for
interactive turns (SGLang ``--enable-priority-scheduling``, vLLM ``--scheduling-policy priority``),
or prefill/decode separation (SGLang ``--disaggregation-mode``, vLLM ``--kv-transfer-config``).
Tax: the re-prefill tokens inside the offending long prefills; the fix itself recovers ITL, not tokens.
"""

from __future__ import annotations

from ..context import Context, fmt_tokens, fmt_usd
from ..finding import Finding, Scope, Tax

ID = "itl_long_prefill"

# one scan for every instance: gaps, and gaps above the SLO threshold; an instance with fewer than
# findings_itl_min_tail_gaps (tail gaps ≤ gaps in either threshold mode) cannot trigger, so SQL below is
# only run for the instances that can
PRECHECK = """
SELECT instance, count(*) AS gaps, count(*) FILTER (WHERE gap_ms > $slo_ms) AS over_slo
FROM (SELECT coalesce(instance, '') AS instance, unnest(itl_ms) AS gap_ms FROM m_calls
      WHERE in_win AND itl_ms IS NOT NULL AND len(itl_ms) > 0 AND ttft_s IS NOT NULL)
GROUP BY ALL
"""


# every instance of $instances in one query, a row each (the calls are read twice in all, not twice per
# instance); the evidence shows it with $instances = [the finding's instance]. ``ikey`` is the instance as the
# findings name it (NULL → ''); the overlap joins compare the raw instance (a NULL instance overlaps nothing).
SQL = """
WITH d AS MATERIALIZED (
    SELECT call_id, instance, coalesce(instance, '') AS ikey, start_s + ttft_s AS t1, itl_ms
    FROM m_calls
    WHERE in_win AND list_contains($instances, coalesce(instance, '')) AND itl_ms IS NOT NULL AND len(itl_ms) > 0
      AND ttft_s IS NOT NULL
),
g AS (SELECT call_id, instance, ikey, t1, cs, unnest(itl_ms) AS gap_ms, generate_subscripts(itl_ms, 1) AS i
      FROM (SELECT *, agentobs_cumsum(itl_ms) AS cs FROM d)),
-- gap i ends at t1 + Σ_{j≤i} itl_j: the list's running sum read at i, computed over the gathered calls (as in
-- itl_tail)
gg AS (SELECT call_id, instance, ikey, gap_ms, i, t1 + cs[i] / 1000.0 AS tb FROM g),
thr AS (
    SELECT ikey, CASE WHEN $mode = 'p99' THEN quantile_cont(gap_ms, 0.99) ELSE $slo_ms END AS t FROM gg GROUP BY ikey
),
pf AS (
    SELECT call_id AS p_call, instance, coalesce(instance, '') AS ikey, start_s + coalesce(queue_s, 0) AS pa,
           start_s + ttft_s AS pb, prompt_tokens - coalesce(cached_tokens, 0) AS computed, reprefill_tokens,
           reprefill_cost_usd
    FROM m_calls
    WHERE list_contains($instances, coalesce(instance, '')) AND ttft_s IS NOT NULL AND prompt_tokens IS NOT NULL
),
tail AS (SELECT gg.*, gg.tb - gg.gap_ms / 1000.0 AS ta FROM gg JOIN thr USING (ikey) WHERE gg.gap_ms > thr.t),
-- the prefills' cells carry only what the overlap joins read (the offenders' tokens and $ are read by id, in off)
pfc AS (
    SELECT p_call, instance, pa, pb, computed,
           unnest(generate_series(CAST(floor(least(pa, pb) / 5) AS BIGINT),
                                  CAST(floor(greatest(pa, pb) / 5) AS BIGINT))) AS cell
    FROM pf
),
tailc AS (
    SELECT *, unnest(generate_series(CAST(floor(least(ta, tb) / 5) AS BIGINT), CAST(floor(greatest(ta, tb) / 5) AS BIGINT))) AS cell
    FROM tail
),
ggc AS (
    SELECT call_id, i, instance, tb, tb - gap_ms / 1000.0 AS ta,
           unnest(generate_series(CAST(floor(least(tb - gap_ms / 1000.0, tb) / 5) AS BIGINT),
                                  CAST(floor(greatest(tb - gap_ms / 1000.0, tb) / 5) AS BIGINT))) AS cell
    FROM gg
),
-- a pair is kept in one cell only, the first both span (the greater of their first cells); the attributed
-- prefill computes the most tokens, on a tie the greater call id (the same every run, as in itl_tail)
attr AS (
    SELECT t.call_id, t.i, any_value(t.ikey) AS ikey, arg_max(p.p_call, (p.computed, p.p_call)) AS p_call,
           max(p.computed) AS computed
    FROM tailc t JOIN pfc p ON p.instance = t.instance AND p.cell = t.cell AND p.p_call <> t.call_id
                            AND p.pa < t.tb AND p.pb > t.ta
    WHERE t.cell = greatest(CAST(floor(least(t.ta, t.tb) / 5) AS BIGINT), CAST(floor(least(p.pa, p.pb) / 5) AS BIGINT))
    GROUP BY t.call_id, t.i
),
-- whether a long prefill overlaps the gap: a semi-join (no gap × prefill pairs are formed)
long_ov AS (
    SELECT DISTINCT g.call_id, g.i
    FROM ggc g SEMI JOIN (SELECT * FROM pfc WHERE computed >= $long_tokens) p
      ON p.instance = g.instance AND p.cell = g.cell AND p.p_call <> g.call_id AND p.pa < g.tb AND p.pb > g.ta
),
flag AS (
    SELECT gg.ikey, gg.gap_ms, lo.call_id IS NOT NULL AS with_long FROM gg LEFT JOIN long_ov lo USING (call_id, i)
),
-- the offending prefills: their few ids first, then those calls (not every attributed gap joined to every call)
off AS (
    SELECT DISTINCT * FROM pf WHERE p_call IN (SELECT p_call FROM attr WHERE computed >= $long_tokens)
),
k AS (SELECT DISTINCT ikey FROM d),
n_gg AS (SELECT ikey, count(*) AS gaps FROM gg GROUP BY ikey),
n_tail AS (SELECT ikey, count(*) AS tail_gaps FROM tail GROUP BY ikey),
n_attr AS (SELECT ikey, count(*) AS attributed, count(*) FILTER (WHERE computed >= $long_tokens) AS long_gaps
           FROM attr GROUP BY ikey),
q AS (
    SELECT ikey, quantile_cont(gap_ms, 0.5) AS p50, quantile_cont(gap_ms, 0.99) AS p99,
           quantile_cont(gap_ms, 0.5) FILTER (WHERE with_long) AS p50_with,
           quantile_cont(gap_ms, 0.99) FILTER (WHERE with_long) AS p99_with,
           quantile_cont(gap_ms, 0.5) FILTER (WHERE NOT with_long) AS p50_without,
           quantile_cont(gap_ms, 0.99) FILTER (WHERE NOT with_long) AS p99_without
    FROM flag GROUP BY ikey
),
o AS (
    SELECT ikey, count(*) AS prefills, CAST(coalesce(sum(computed), 0) AS BIGINT) AS computed_tokens,
           CAST(coalesce(sum(reprefill_tokens), 0) AS BIGINT) AS reprefill_tokens,
           coalesce(sum(reprefill_cost_usd), 0) AS reprefill_usd
    FROM off GROUP BY ikey
)
SELECT k.ikey AS instance,
       coalesce(n_gg.gaps, 0) AS gaps,
       thr.t AS tail_threshold_ms,
       coalesce(n_tail.tail_gaps, 0) AS tail_gaps,
       coalesce(n_attr.long_gaps, 0) AS tail_gaps_long_prefill,
       coalesce(n_tail.tail_gaps, 0) - coalesce(n_attr.attributed, 0) AS tail_gaps_unattributed,
       q.p50 AS itl_p50_ms, q.p99 AS itl_p99_ms,
       q.p50_with AS itl_p50_with_long_ms, q.p99_with AS itl_p99_with_long_ms,
       q.p50_without AS itl_p50_without_long_ms, q.p99_without AS itl_p99_without_long_ms,
       coalesce(o.prefills, 0) AS offending_prefills,
       coalesce(o.computed_tokens, 0) AS offending_computed_tokens,
       coalesce(o.reprefill_tokens, 0) AS offending_reprefill_tokens,
       coalesce(o.reprefill_usd, 0) AS offending_reprefill_usd
FROM k
LEFT JOIN n_gg USING (ikey) LEFT JOIN thr USING (ikey) LEFT JOIN n_tail USING (ikey) LEFT JOIN n_attr USING (ikey)
LEFT JOIN q USING (ikey) LEFT JOIN o USING (ikey)
"""


def _pow2_below(n: int) -> int:
    p = 512
    while p * 2 <= n:
        p *= 2
    return p


def check(ctx: Context) -> list[Finding]:
    out = []
    mode = str(ctx.setting("itl_tail_threshold"))
    params_base = {"mode": mode, "slo_ms": float(ctx.setting("itl_slo_ms")),
                   "long_tokens": int(ctx.setting("long_prefill_tokens"))}
    min_tail = int(ctx.setting("findings_itl_min_tail_gaps"))
    counts = {r["instance"]: r for r in ctx.rows(PRECHECK, {"slo_ms": params_base["slo_ms"]})}
    wanted = [inst for inst in ctx.instances if inst in counts
              and (counts[inst]["over_slo"] if mode != "p99" else counts[inst]["gaps"]) >= max(min_tail, 1)]
    per = {r["instance"]: r for r in ctx.rows(SQL, {**params_base, "instances": wanted})} if wanted else {}
    for inst, cfg in ctx.instances.items():
        if inst not in per:
            continue
        params = {**params_base, "instances": [inst]}   # the evidence: the same query for this instance
        r = per[inst]
        tail = r.get("tail_gaps") or 0
        if tail < max(min_tail, 1):
            continue
        share = r["tail_gaps_long_prefill"] / tail
        if share < float(ctx.setting("findings_itl_long_prefill_share")):
            continue
        L = params["long_tokens"]
        if cfg["engine"] == "sglang":
            cur = cfg["chunked_prefill_size"]
            chunk = _pow2_below(max(1024, (cur or 8192) // 2))
            fix = (f"Bound what one step may prefill next to running decodes: `--chunked-prefill-size {chunk}` "
                   f"(now {cur if cur else 'the GPU-memory default'}); give interactive turns priority with "
                   "`--enable-priority-scheduling` (needs `--schedule-policy fcfs` or `lof`; send a request "
                   "`priority`); or separate prefill from decode (`--disaggregation-mode prefill` / `decode`).")
        else:
            fix = ("Keep long prefills away from interactive decodes: `--scheduling-policy priority` with a higher "
                   "request `priority` for interactive turns; a smaller chunked-prefill token budget (vLLM's "
                   "`max_num_batched_tokens` engine argument); or prefill/decode disaggregation through "
                   "`--kv-transfer-config`.")
        x, usd = r["offending_reprefill_tokens"], r["offending_reprefill_usd"]
        tax = ctx.tax(x, usd, "re-prefill inside the offending long prefills, GPU-time cost "
                      f"({cfg['basis'] or 'cost model'})")
        p99w, p99wo = r["itl_p99_with_long_ms"], r["itl_p99_without_long_ms"]
        out.append(Finding(
            rule=ID,
            title="Long prefills inflate the inter-token latency tail of co-scheduled decodes",
            severity="high" if share >= 0.5 else "medium",
            scope=Scope(instance=inst or None, model=cfg["model"]),
            evidence=ctx.evidence({**{k: r[k] for k in (
                "gaps", "tail_threshold_ms", "tail_gaps", "tail_gaps_long_prefill", "tail_gaps_unattributed",
                "itl_p50_ms", "itl_p99_ms", "itl_p50_with_long_ms", "itl_p99_with_long_ms",
                "itl_p50_without_long_ms", "itl_p99_without_long_ms", "offending_prefills",
                "offending_computed_tokens", "offending_reprefill_tokens", "offending_reprefill_usd")},
                "share_tail_long_prefill": share, "long_prefill_tokens": L}, SQL, params),
            tax=tax,
            recoverable=Tax(None, None, f"the fix recovers ITL tail (p99 {p99w or 0:.0f} ms next to long prefills vs "
                                        f"{p99wo or 0:.0f} ms without), not tokens", method="analytical"),
            confidence=ctx.confidence(tail, exact=True),
            remediation=fix,
            summary=(f"{share:.0%} of {tail} tail gaps (> {r['tail_threshold_ms']:.0f} ms) overlap a prefill of ≥ "
                     f"{fmt_tokens(L)} tokens; {fmt_tokens(x)} of those prefills were re-prefill "
                     f"({fmt_usd(tax.usd_week)}{tax.per})"),
        ))
    return out
