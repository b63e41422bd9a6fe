"""Retention vs recompute: idle sessions' KV held past the break-even gap g*, or dropped before it.

METRICS.md §4: holding a prefix of K tokens for g seconds costs ``K × g × $/s ÷ capacity``;
recomputing it costs ``K ÷ prefill_tps × $/s``; they are equal at ``g* = capacity ÷ prefill_tps``.

Trigger, per instance with a known g* (idle windows ``[t2(prev), t0(c)]`` on the same instance):

- *holding too long*: at least ``findings_beyond_gstar_share`` of the windows are longer than g*
  and idle sessions hold more KV (time-weighted, retained windows) than running requests;
  tax = Σ over retained windows longer than g* of ``K × (g − g*) × $/s ÷ capacity``;
- *dropping too early* (the reverse): at least that share of the windows are shorter than g*,
  running requests hold more KV than idle sessions, and sessions were evicted in windows shorter
  than g*; tax = Σ over those windows of ``max(0, cost(X) − K × g × $/s ÷ capacity)``.

Instances with the prefix cache / radix cache off are left to ``prefix_cache_off``: they retain
nothing, so "retain longer" is not the fix there.

Evidence: windows, share beyond g*, idle vs running KV token-seconds, gap p50/p90, g*.
Fix: how long to retain (g*) and the mechanisms that set it — per-session KV TTLs (vLLM Router
``kv_retention_ttl_seconds``, Dynamo ``nvext.cache_control``), a host tier (SGLang
``--enable-hierarchical-cache``, vLLM ``--kv-offloading-size``), or a larger pool (SGLang
``--mem-fraction-static``).
"""

from __future__ import annotations

from ..context import Context, fmt_tokens, fmt_usd
from ..finding import Claim, Finding, Scope

ID = "retention_vs_recompute"

SQL = """
WITH w AS (
    -- a window nothing explains (estimate mode, no evidence) whose call re-prefilled counts as evicted: the band of
    -- the finding keeps it out of its lower end (docs/findings.md)
    SELECT call_id, session_id, gap_before_s AS g, kv_tokens_before AS k,
           CASE WHEN window_outcome = 'unknown' THEN 'evicted' ELSE window_outcome END AS window_outcome,
           reprefill_tokens, reprefill_cost_usd,
           usd_per_token_s, g_star_s
    FROM m_calls
    WHERE in_win AND coalesce(instance, '') = $instance AND prev_instance = instance
      AND gap_before_s > 0 AND g_star_s > 0
      AND (window_outcome IN ('retained', 'evicted') OR (window_outcome = 'unknown' AND reprefill_tokens > 0))
),
run AS (
    SELECT sum((coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0)) * (end_s - start_s)) AS running_kv_token_s
    FROM m_calls WHERE in_win AND coalesce(instance, '') = $instance
)
SELECT count(*) AS windows,
       count(*) FILTER (WHERE g > g_star_s) AS windows_beyond_gstar,
       count(*) FILTER (WHERE window_outcome = 'retained') AS retained,
       count(*) FILTER (WHERE window_outcome = 'evicted') AS evicted,
       count(*) FILTER (WHERE window_outcome = 'evicted' AND g <= g_star_s) AS evicted_below_gstar,
       any_value(g_star_s) AS g_star_s,
       quantile_cont(g, 0.5) AS gap_p50_s,
       quantile_cont(g, 0.9) AS gap_p90_s,
       coalesce(sum(k * g) FILTER (WHERE window_outcome = 'retained'), 0) AS idle_kv_token_s,
       coalesce((SELECT running_kv_token_s FROM run), 0) AS running_kv_token_s,
       coalesce(sum(k * (g - g_star_s) * usd_per_token_s)
                FILTER (WHERE window_outcome = 'retained' AND g > g_star_s), 0) AS hold_excess_usd,
       coalesce(sum(k * (g - g_star_s) / g_star_s) FILTER (WHERE window_outcome = 'retained' AND g > g_star_s), 0)
           AS hold_excess_tokens,
       CAST(coalesce(sum(reprefill_tokens) FILTER (WHERE window_outcome = 'evicted' AND g <= g_star_s), 0) AS BIGINT)
           AS evicted_below_tokens,
       coalesce(sum(greatest(reprefill_cost_usd - k * g * usd_per_token_s, 0))
                FILTER (WHERE window_outcome = 'evicted' AND g <= g_star_s), 0) AS evicted_below_net_usd
FROM w
"""


W_CTE = SQL[:SQL.index("),\nrun AS")] + ")\n"

# the calls the finding owns in the ledger (one per idle window): holding — retained windows beyond g*, their
# rent beyond break-even (kind "rent"); dropping — windows evicted below g*, their re-prefill net of holding
CLAIM_SQL = {
    "hold": W_CTE + """
SELECT call_id, session_id, k * (g - g_star_s) / g_star_s AS tokens, k * (g - g_star_s) * usd_per_token_s AS usd
FROM w WHERE window_outcome = 'retained' AND g > g_star_s
""",
    "drop": W_CTE + """
SELECT call_id, session_id, reprefill_tokens AS tokens,
       greatest(coalesce(reprefill_cost_usd, 0) - k * g * usd_per_token_s, 0) AS usd
FROM w WHERE window_outcome = 'evicted' AND g <= g_star_s AND reprefill_tokens > 0
""",
}


def check(ctx: Context) -> list[Finding]:
    out = []
    thr = float(ctx.setting("findings_beyond_gstar_share"))
    for inst, cfg in ctx.instances.items():
        if not cfg["g_star_s"] or cfg["prefix_caching"] is False:
            continue  # with the prefix cache off nothing is retained: prefix_cache_off owns that instance
        r = ctx.one(SQL, {"instance": inst})
        n = r.get("windows") or 0
        if not n:
            continue
        beyond = r["windows_beyond_gstar"] / n
        idle, running = r["idle_kv_token_s"], r["running_kv_token_s"]
        g = r["g_star_s"]
        host = ("`--enable-hierarchical-cache`" if cfg["engine"] == "sglang" else
                "`--kv-offloading-size <GiB>`" if cfg["engine"] == "vllm" else "a host KV tier")
        numbers = {"idle_windows": n, "share_beyond_gstar": beyond, "g_star_s": g,
                   "gap_p50_s": r["gap_p50_s"], "gap_p90_s": r["gap_p90_s"], "retained_windows": r["retained"],
                   "evicted_windows": r["evicted"], "idle_kv_token_s": idle, "running_kv_token_s": running}
        if beyond >= thr and idle > running:
            usd, tokens, case = r["hold_excess_usd"], r["hold_excess_tokens"], "hold"
            numbers.update(hold_excess_usd=usd, hold_excess_recompute_equiv_tokens=tokens)
            title = "Idle sessions hold GPU KV past the break-even gap g*: recomputing would be cheaper"
            fix = (f"Retain an idle session's GPU KV for at most g* ≈ {g:,.0f} s (KV capacity ÷ prefill throughput); "
                   f"{beyond:.0%} of the idle gaps are longer (p50 {r['gap_p50_s']:,.0f} s) and idle sessions hold "
                   f"{idle / max(running, 1e-9):.1f}× the KV of running requests. Set a per-session KV TTL ≈ g* where "
                   "the router supports one (vLLM Router program scheduling `kv_retention_ttl_seconds`, Dynamo "
                   f"`nvext.cache_control` TTL), or move idle KV off the GPU ({host}) so the GPU pool serves running "
                   "requests.")
            short = f"per-session KV TTL ≈ {g:,.0f} s (vLLM Router `kv_retention_ttl_seconds`)"
            basis = "KV slot opportunity cost beyond g* (K × (g − g*) × $/s ÷ capacity), tokens as recompute-equivalent"
        elif (1 - beyond) >= thr and running > idle and r["evicted_below_gstar"]:
            usd, tokens, case = r["evicted_below_net_usd"], r["evicted_below_tokens"], "drop"
            numbers.update(evicted_below_gstar=r["evicted_below_gstar"], evicted_below_tokens=tokens,
                           evicted_below_net_usd=usd)
            title = "Idle sessions lose their KV before the break-even gap g*: holding would be cheaper"
            fix = (f"Retain idle sessions' KV for up to g* ≈ {g:,.0f} s: {1 - beyond:.0%} of the idle gaps are "
                   f"shorter (p90 {r['gap_p90_s']:,.0f} s) yet {r['evicted_below_gstar']} sessions were evicted within "
                   f"them. Give idle sessions room — a host tier ({host}), "
                   + ("a larger KV pool (`--mem-fraction-static`), " if cfg["engine"] == "sglang" else "")
                   + "or a per-session KV TTL ≈ g* (vLLM Router `kv_retention_ttl_seconds`, Dynamo "
                   "`nvext.cache_control`).")
            short = f"retain idle KV up to g* ≈ {g:,.0f} s: a host tier ({host})"
            basis = f"re-prefill cost net of holding cost ({cfg['basis'] or 'cost model'})"
        else:
            continue
        if not ctx.at_stake(usd, tokens):
            continue
        tax = ctx.tax(tokens, usd, basis)
        rec = ctx.tax(tokens, usd, "analytical: retention set to g* saves exactly the excess over break-even",
                      method="analytical")
        out.append(Finding(
            rule=ID,
            title=title,
            severity=ctx.severity(tax),
            scope=Scope(instance=inst or None, model=cfg["model"]),
            evidence=ctx.evidence({**numbers, "case": case}, SQL, {"instance": inst}),
            tax=tax,
            recoverable=rec,
            confidence=ctx.confidence(n),
            kind="rent" if case == "hold" else "reprefill",
            claim=Claim(CLAIM_SQL[case], (("instance", inst),)),
            remediation=fix,
            fix=short,
            summary=(f"{n} idle windows, {beyond:.0%} beyond g* = {g:,.0f} s; {fmt_tokens(tokens)} tokens-equivalent, "
                     f"{fmt_usd(tax.usd_week)}{tax.per}"),
        ))
    return out
