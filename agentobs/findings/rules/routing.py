"""Non-affine routing: a session's next turn lands on a replica that does not hold its prefix.

Trigger: per model, the ``routed_away`` re-prefill (METRICS.md §1: ``I(c) ≠ I(prev)``) is at least
``findings_routed_away_share`` of the reusable prefix tokens ΣR_eff, and clears
``findings_min_usd_week``.

Evidence: follow-up calls, how many changed replica, routed-away re-prefill tokens, their share of
ΣR_eff and of computed prefill, GPU-time cost, replicas serving the model.

Fix: route by session. Per router (reference/gateway-otel.md §3.3–3.6, reference/sglang.md §6.1):
sgl-model-gateway policy ``manual`` keyed by the ``X-SMG-Routing-Key`` header (or ``cache_aware``,
its default); vLLM Router ``--policy consistent_hash`` keyed by ``x-session-id``; vLLM
production-stack ``--routing-logic session --session-key x-session-id``; llm-d
``session-affinity-scorer`` (strategy ``session_id``, header ``x-session-id``).
Recoverable: the routed-away re-prefill (analytical upper bound: the home replica still holds the
prefix; a simulator replay can refine this, see agentobs.findings.estimate).
"""

from __future__ import annotations

from ..context import Context, fmt_tokens, fmt_usd
from ..finding import Finding, Scope
from ..sizing import cause_claim

ID = "non_affine_routing"

SQL = """
WITH a AS (  -- per model and instance first: the cost basis then joins a few rows, not every call
    SELECT coalesce(model, '') AS model, instance,
           count(*) AS calls,
           count(*) FILTER (WHERE prev_call_id IS NOT NULL) AS follow_ups,
           count(*) FILTER (WHERE prev_call_id IS NOT NULL AND instance <> prev_instance) AS changed_replica,
           count(*) FILTER (WHERE miss_cause = 'routed_away') AS routed_away_calls,
           count(*) FILTER (WHERE miss_cause = 'routed_away' AND mode = 'exact') AS routed_away_exact,
           sum(reprefill_tokens) FILTER (WHERE miss_cause = 'routed_away') AS routed_away_tokens,
           sum(reprefill_cost_usd) FILTER (WHERE miss_cause = 'routed_away') AS routed_away_usd,
           sum(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL) AS reusable_tokens,
           sum(prompt_tokens - coalesce(cached_tokens, 0)) AS computed_prefill
    FROM m_calls
    WHERE in_win AND session_id IS NOT NULL
    GROUP BY ALL
)
SELECT a.model,
       count(DISTINCT a.instance) AS replicas,
       CAST(sum(a.calls) AS BIGINT) AS calls,
       CAST(sum(a.follow_ups) AS BIGINT) AS follow_ups,
       CAST(sum(a.changed_replica) AS BIGINT) AS changed_replica,
       CAST(sum(a.routed_away_calls) AS BIGINT) AS routed_away_calls,
       CAST(sum(a.routed_away_exact) AS BIGINT) AS routed_away_exact,
       CAST(coalesce(sum(a.routed_away_tokens), 0) AS BIGINT) AS routed_away_tokens,
       coalesce(sum(a.routed_away_usd), 0) AS routed_away_usd,
       CAST(coalesce(sum(a.reusable_tokens), 0) AS BIGINT) AS reusable_tokens,
       CAST(coalesce(sum(a.computed_prefill), 0) AS BIGINT) AS computed_prefill,
       string_agg(DISTINCT cb.cost_basis, ' | ' ORDER BY cb.cost_basis) AS cost_basis
FROM a LEFT JOIN (SELECT instance AS cb_instance, basis AS cost_basis FROM m_cost) cb
  ON cb.cb_instance = coalesce(a.instance, '')
GROUP BY a.model
ORDER BY a.model
"""

MECHANISMS = (
    "sgl-model-gateway: policy `manual` (sticky sessions) with header `X-SMG-Routing-Key: <session id>`, "
    "or its default `cache_aware` policy",
    "vLLM Router: `--policy consistent_hash` with header `x-session-id: <session id>`",
    "vLLM production-stack router: `--routing-logic session --session-key x-session-id`",
    "llm-d endpoint picker: the `session-affinity-scorer` (strategy `session_id`, header `x-session-id`)",
)


def check(ctx: Context) -> list[Finding]:
    out = []
    min_share = float(ctx.setting("findings_routed_away_share"))
    for r in ctx.rows(SQL):
        x, usd = r["routed_away_tokens"], r["routed_away_usd"]
        share = x / r["reusable_tokens"] if r["reusable_tokens"] else None
        if share is None or share < min_share or not ctx.at_stake(usd, x):
            continue
        tax = ctx.tax(x, usd, f"GPU-time re-prefill cost ({r['cost_basis']})")
        rec = ctx.tax(x, usd, "analytical upper bound: the session's previous replica still holds its prefix",
                      method="analytical")
        out.append(Finding(
            rule=ID,
            title="Sessions are not routed to the replica that holds their prefix",
            severity=ctx.severity(tax),
            scope=Scope(model=r["model"] or None),
            evidence=ctx.evidence({
                "replicas": r["replicas"],
                "follow_up_calls": r["follow_ups"],
                "changed_replica_calls": r["changed_replica"],
                "routed_away_calls": r["routed_away_calls"],
                "routed_away_tokens": x,
                "share_of_reusable_tokens": share,
                "share_of_computed_prefill": x / r["computed_prefill"] if r["computed_prefill"] else None,
                "routed_away_usd": usd,
            }, SQL),
            tax=tax,
            recoverable=rec,
            confidence=ctx.confidence(r["routed_away_calls"], exact=r["routed_away_exact"] == r["routed_away_calls"]),
            remediation=("Route each session to the same replica (session affinity) or to the replica holding its "
                         "prefix (cache-aware), passing the session id the spans carry. " + "; ".join(MECHANISMS) + "."),
            fix="route by session: vLLM Router `--policy consistent_hash` (`x-session-id`)",
            claim=cause_claim("routed_away", model=r["model"]),
            summary=(f"{r['changed_replica']} of {r['follow_ups']} follow-up calls changed replica; {fmt_tokens(x)} "
                     f"tokens ({share:.0%} of the reusable prefix) recomputed, {fmt_usd(tax.usd_week)}{tax.per}"),
        ))
    return out
