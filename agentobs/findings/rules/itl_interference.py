"""Long-prefill ITL interference: decode tail latency caused by long prefills co-scheduled with it.

Trigger (METRICS.md §6): on an instance, of the tail inter-token gaps (above ``itl_slo_ms``, or the
p99 of all gaps with ``itl_tail_threshold = p99``) at least ``findings_itl_long_prefill_share``
overlap a prefill window ``[t0 + queue, t1]`` of another call on the same instance whose attributed
prefill (the overlapping one computing the most tokens P − C) computed ≥ ``long_prefill_tokens``;
at least ``findings_itl_min_tail_gaps`` tail gaps.

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

SQL = """
WITH d AS (
    SELECT call_id, instance, start_s + ttft_s AS t1, itl_ms
    FROM m_calls
    WHERE in_win AND coalesce(instance, '') = $instance AND itl_ms IS NOT NULL AND len(itl_ms) > 0 AND ttft_s IS NOT NULL
),
g AS (SELECT call_id, instance, t1, unnest(itl_ms) AS gap_ms, generate_subscripts(itl_ms, 1) AS i FROM d),
gg AS (
    SELECT *, t1 + sum(gap_ms) OVER (PARTITION BY call_id ORDER BY i ROWS UNBOUNDED PRECEDING) / 1000.0 AS tb FROM g
),
thr AS (SELECT CASE WHEN $mode = 'p99' THEN quantile_cont(gap_ms, 0.99) ELSE $slo_ms END AS t FROM gg),
pf AS (
    SELECT call_id AS p_call, instance, start_s + coalesce(queue_s, 0) AS pa, start_s + ttft_s AS pb,
           prompt_tokens - coalesce(cached_tokens, 0) AS computed, reprefill_tokens, reprefill_cost_usd
    FROM m_calls
    WHERE coalesce(instance, '') = $instance AND ttft_s IS NOT NULL AND prompt_tokens IS NOT NULL
),
tail AS (SELECT gg.*, gg.tb - gg.gap_ms / 1000.0 AS ta FROM gg, thr WHERE gg.gap_ms > thr.t),
-- the overlap joins meet on (instance, 5-second cell): a gap and a prefill window that overlap share a cell (a
-- point of the overlap lies in both), so each gap meets only nearby prefills (the metric itl_tail does the
-- same); a pair sharing several cells repeats, which max/arg_max and DISTINCT absorb
pfc AS (
    SELECT *, unnest(generate_series(CAST(floor(least(pa, pb) / 5) AS BIGINT), CAST(floor(greatest(pa, pb) / 5) AS BIGINT))) AS cell
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
attr AS (  -- each tail gap → the overlapping prefill with the most computed tokens
    SELECT t.call_id, t.i, arg_max(p.p_call, p.computed) AS p_call, max(p.computed) AS computed
    FROM tailc t JOIN pfc p ON p.instance = t.instance AND p.cell = t.cell AND p.p_call <> t.call_id
                            AND p.pa < t.tb AND p.pb > t.ta
    GROUP BY t.call_id, t.i
),
long_ov AS (  -- every gap overlapping some long prefill
    SELECT DISTINCT g.call_id, g.i
    FROM ggc g JOIN (SELECT * FROM pfc WHERE computed >= $long_tokens) p
      ON p.instance = g.instance AND p.cell = g.cell AND p.p_call <> g.call_id AND p.pa < g.tb AND p.pb > g.ta
),
flag AS (
    SELECT gg.gap_ms, lo.call_id IS NOT NULL AS with_long FROM gg LEFT JOIN long_ov lo USING (call_id, i)
),
off AS (
    SELECT DISTINCT pf.* FROM attr JOIN pf USING (p_call) WHERE attr.computed >= $long_tokens
)
SELECT (SELECT count(*) FROM gg) AS gaps,
       (SELECT any_value(t) FROM thr) AS tail_threshold_ms,
       (SELECT count(*) FROM tail) AS tail_gaps,
       (SELECT count(*) FROM attr WHERE computed >= $long_tokens) AS tail_gaps_long_prefill,
       (SELECT count(*) FROM tail) - (SELECT count(*) FROM attr) AS tail_gaps_unattributed,
       (SELECT quantile_cont(gap_ms, 0.5) FROM flag) AS itl_p50_ms,
       (SELECT quantile_cont(gap_ms, 0.99) FROM flag) AS itl_p99_ms,
       (SELECT quantile_cont(gap_ms, 0.5) FROM flag WHERE with_long) AS itl_p50_with_long_ms,
       (SELECT quantile_cont(gap_ms, 0.99) FROM flag WHERE with_long) AS itl_p99_with_long_ms,
       (SELECT quantile_cont(gap_ms, 0.5) FROM flag WHERE NOT with_long) AS itl_p50_without_long_ms,
       (SELECT quantile_cont(gap_ms, 0.99) FROM flag WHERE NOT with_long) AS itl_p99_without_long_ms,
       (SELECT count(*) FROM off) AS offending_prefills,
       (SELECT CAST(coalesce(sum(computed), 0) AS BIGINT) FROM off) AS offending_computed_tokens,
       (SELECT CAST(coalesce(sum(reprefill_tokens), 0) AS BIGINT) FROM off) AS offending_reprefill_tokens,
       (SELECT coalesce(sum(reprefill_cost_usd), 0) FROM off) AS offending_reprefill_usd
"""


# one scan for every instance: gaps, and gaps above the SLO threshold; an instance with fewer than
# findings_itl_min_tail_gaps (tail gaps ≤ gaps in either threshold mode) cannot trigger, so SQL above is
# only run where it can (it reads every gap and prefill of its instance)
PRECHECK = """
SELECT instance, count(*) AS gaps, count(*) FILTER (WHERE gap_ms > $slo_ms) AS over_slo
FROM (SELECT coalesce(instance, '') AS instance, unnest(itl_ms) AS gap_ms FROM m_calls
      WHERE in_win AND itl_ms IS NOT NULL AND len(itl_ms) > 0 AND ttft_s IS NOT NULL)
GROUP BY ALL
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
    for inst, cfg in ctx.instances.items():
        c = counts.get(inst)
        if c is None or (c["over_slo"] if mode != "p99" else c["gaps"]) < max(min_tail, 1):
            continue
        params = {**params_base, "instance": inst}
        r = ctx.one(SQL, params)
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
