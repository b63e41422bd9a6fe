"""Long-prefill ITL interference: decode tail latency caused by long prefills co-scheduled with it.

Trigger (METRICS.md §6): on an instance, of the tail inter-token gaps (above ``itl_slo_ms``, or the
p99 of the model's gaps with ``itl_tail_threshold = p99``) at least ``findings_itl_long_prefill_share``
overlap a prefill window ``[t0 + queue, t1]`` of another call on the same instance whose attributed
prefill (the overlapping one computing the most tokens P − C; a tie: the greater call id) computed
≥ ``long_prefill_tokens``; at least ``findings_itl_min_tail_gaps`` tail gaps. The gaps and their
attribution are the ``itl_tail`` metric's (the table m_itl_gap, agentobs/model/itl_gaps.sql).

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


# every instance of $instances in one query, a row each; the evidence shows it with $instances = [the finding's
# instance]. The gaps, tail flags and attributions are m_itl_gap (agentobs/model/itl_gaps.sql): the itl_tail
# metric's, so the finding and the metric count the same tail gaps and name the same offending prefills. The
# query reads the run's table when itl_tail made it already (the report), else the gaps inline (Context.
# with_itl_gaps; the evidence always shows the inline form). ``ikey`` is the instance as the findings name it
# (NULL → '').
SQL = """
WITH gg AS (
    SELECT coalesce(instance, '') AS ikey, g_ms, thr_ms, tail, long_overlap, off_call_id, off_computed
    FROM m_itl_gap
    WHERE list_contains($instances, coalesce(instance, ''))
),
n AS (
    SELECT ikey, count(*) AS gaps,
           -- the threshold: itl_slo_ms, or in p99 mode the p99 of the model's gaps (an instance serving one
           -- model: that model's; several: their mean, weighted by gaps)
           avg(thr_ms) AS t,
           count(*) FILTER (WHERE tail) AS tail_gaps,
           count(*) FILTER (WHERE tail AND off_call_id IS NOT NULL) AS attributed,
           count(*) FILTER (WHERE tail AND off_computed >= $long_tokens) AS long_gaps,
           quantile_cont(g_ms, 0.5) AS p50, quantile_cont(g_ms, 0.99) AS p99,
           quantile_cont(g_ms, 0.5) FILTER (WHERE long_overlap) AS p50_with,
           quantile_cont(g_ms, 0.99) FILTER (WHERE long_overlap) AS p99_with,
           quantile_cont(g_ms, 0.5) FILTER (WHERE NOT long_overlap) AS p50_without,
           quantile_cont(g_ms, 0.99) FILTER (WHERE NOT long_overlap) AS p99_without,
           -- the offending long prefills' ids (gg is read once: with the gaps inline, a second reader computed
           -- them twice)
           list(off_call_id) FILTER (WHERE tail AND off_computed >= $long_tokens) AS offs
    FROM gg GROUP BY ikey
),
-- the offending long prefills: their few ids first, then those calls (not every attributed gap joined to every call)
off AS (
    SELECT coalesce(instance, '') AS ikey, prompt_tokens - coalesce(cached_tokens, 0) AS computed, reprefill_tokens,
           reprefill_cost_usd
    FROM m_calls
    WHERE in_filter AND list_contains($instances, coalesce(instance, ''))
      AND call_id IN (SELECT unnest(offs) FROM n)
),
o AS (
    SELECT ikey, count(*) AS prefills, CAST(coalesce(sum(computed), 0) AS BIGINT) AS computed_tokens,
           CAST(coalesce(sum(reprefill_tokens), 0) AS BIGINT) AS reprefill_tokens,
           coalesce(sum(reprefill_cost_usd), 0) AS reprefill_usd
    FROM off GROUP BY ikey
)
SELECT n.ikey AS instance,
       n.gaps,
       n.t AS tail_threshold_ms,
       n.tail_gaps,
       n.long_gaps AS tail_gaps_long_prefill,
       n.tail_gaps - n.attributed AS tail_gaps_unattributed,
       n.p50 AS itl_p50_ms, n.p99 AS itl_p99_ms,
       n.p50_with AS itl_p50_with_long_ms, n.p99_with AS itl_p99_with_long_ms,
       n.p50_without AS itl_p50_without_long_ms, n.p99_without AS itl_p99_without_long_ms,
       coalesce(o.prefills, 0) AS offending_prefills,
       coalesce(o.computed_tokens, 0) AS offending_computed_tokens,
       coalesce(o.reprefill_tokens, 0) AS offending_reprefill_tokens,
       coalesce(o.reprefill_usd, 0) AS offending_reprefill_usd
FROM n LEFT JOIN o USING (ikey)
ORDER BY n.ikey
"""


def _pow2_below(n: int) -> int:
    p = 512
    while p * 2 <= n:
        p *= 2
    return p


def check(ctx: Context) -> list[Finding]:
    out = []
    mode = str(ctx.setting("itl_tail_threshold"))
    long_tokens = int(ctx.setting("long_prefill_tokens"))
    params_base = {"mode": mode, "slo_ms": float(ctx.setting("itl_slo_ms")), "long_tokens": long_tokens}
    min_tail = int(ctx.setting("findings_itl_min_tail_gaps"))
    counts = {r["instance"]: r for r in ctx.rows(PRECHECK, {"slo_ms": params_base["slo_ms"]})}
    wanted = [inst for inst in ctx.instances if inst in counts
              and (counts[inst]["over_slo"] if mode != "p99" else counts[inst]["gaps"]) >= max(min_tail, 1)]
    per = {r["instance"]: r for r in ctx.rows(*ctx.with_itl_gaps(
        SQL, {"instances": wanted, "long_tokens": params_base["long_tokens"]}))} if wanted else {}
    for inst, cfg in ctx.instances.items():
        if inst not in per:
            continue
        params = {"instances": [inst], "long_tokens": params_base["long_tokens"]}  # the evidence: this instance
        r = per[inst]
        tail = r.get("tail_gaps") or 0
        if tail < max(min_tail, 1):
            continue
        share = r["tail_gaps_long_prefill"] / tail
        if share < float(ctx.setting("findings_itl_long_prefill_share")):
            continue
        L = long_tokens
        if cfg["engine"] == "sglang":
            cur = cfg["chunked_prefill_size"]
            chunk = _pow2_below(max(1024, (cur or 8192) // 2))
            fix = (f"Bound what one step may prefill next to running decodes: `--chunked-prefill-size {chunk}` "
                   f"(now {cur if cur else 'the GPU-memory default'}); give interactive turns priority with "
                   "`--enable-priority-scheduling` (needs `--schedule-policy fcfs` or `lof`; send a request "
                   "`priority`); or separate prefill from decode (`--disaggregation-mode prefill` / `decode`).")
            short = f"`--chunked-prefill-size {chunk}`"
        else:
            fix = ("Keep long prefills away from interactive decodes: `--scheduling-policy priority` with a higher "
                   "request `priority` for interactive turns; a smaller chunked-prefill token budget (vLLM's "
                   "`max_num_batched_tokens` engine argument); or prefill/decode disaggregation through "
                   "`--kv-transfer-config`.")
            short = "`--scheduling-policy priority`"
        x, usd = r["offending_reprefill_tokens"], r["offending_reprefill_usd"]
        # a latency finding: the re-prefill inside the offending prefills is evidence, owned in the ledger by the
        # finding of its miss cause (counting it here too would charge the same tokens twice)
        tax = Tax(None, None, "latency: the tail inter-token gaps of co-scheduled decodes; the re-prefill inside the "
                  "offending prefills is counted under its miss cause", method="observed",
                  period="week" if ctx.scaled else "window", window_s=ctx.window_s, scale=ctx.tax_scale)
        p99w, p99wo = r["itl_p99_with_long_ms"], r["itl_p99_without_long_ms"]
        out.append(Finding(
            rule=ID,
            title="Long prefills inflate the inter-token latency tail of co-scheduled decodes",
            severity=ctx.severity(None),
            kind="latency",
            scope=Scope(instance=inst or None, model=cfg["model"]),
            evidence=ctx.evidence({**{k: r[k] for k in (
                "gaps", "tail_threshold_ms", "tail_gaps", "tail_gaps_long_prefill", "tail_gaps_unattributed",
                "itl_p50_ms", "itl_p99_ms", "itl_p50_with_long_ms", "itl_p99_with_long_ms",
                "itl_p50_without_long_ms", "itl_p99_without_long_ms", "offending_prefills",
                "offending_computed_tokens", "offending_reprefill_tokens", "offending_reprefill_usd")},
                "share_tail_long_prefill": share, "long_prefill_tokens": L},
                *ctx.with_itl_gaps(SQL, params, inline=True)),
            tax=tax,
            recoverable=Tax(None, None, f"the fix recovers ITL tail (p99 {p99w or 0:.0f} ms next to long prefills vs "
                                        f"{p99wo or 0:.0f} ms without), not tokens", method="analytical"),
            confidence=ctx.confidence(tail, exact=True),
            remediation=fix,
            fix=short,
            summary=(f"{share:.0%} of {tail} tail gaps (> {r['tail_threshold_ms']:.0f} ms) overlap a prefill of ≥ "
                     f"{fmt_tokens(L)} tokens; ITL p99 {p99w or 0:,.0f} ms next to them vs {p99wo or 0:,.0f} ms "
                     f"without; {fmt_tokens(x)} of those prefills were re-prefill ({fmt_usd(usd)} observed)"),
        ))
    return out
