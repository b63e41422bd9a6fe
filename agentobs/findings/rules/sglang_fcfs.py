"""SGLang scheduling first-come-first-served while queued requests share cached prefixes.

Trigger: an SGLang instance with ``schedule_policy=fcfs`` (the default) where calls waited in the
queue (engine span queue time ≥ ``findings_queue_s``, or — SGLang spans carry no queue time — the
latest ``sglang:num_queue_reqs`` sample before the call was > 0), some of the queued calls had a
reusable or cached prefix, and the evicted-miss re-prefill of queued calls clears the floors.
FCFS admits in arrival order, so a request whose prefix is cached waits behind others while its
prefix ages out of the LRU; ``lpm`` (longest prefix match) admits the best-cached first.

Evidence: queued calls, queued calls with a reusable/cached prefix, evicted misses among them
(and, with KV events, how many were evicted while queued), queue-length samples (peak, share > 128).

Fix: ``--schedule-policy lpm`` (reference/sglang.md §2). Caveats stated in the text: LPM silently
falls back to FCFS while more than 128 requests wait, and when the radix cache is disabled.
Recoverable: the evicted-miss re-prefill of queued calls (analytical upper bound; LPM reorders
admission, it adds no memory).
"""

from __future__ import annotations

from ..context import Context, fmt_tokens, fmt_usd
from ..finding import Claim, Finding, Scope

ID = "sglang_fcfs"

QUEUED_CTE = """
WITH c AS (
    SELECT m.*, q.value AS queue_len
    FROM (SELECT * FROM m_calls LEFT JOIN (SELECT instance AS cb_instance, basis AS cost_basis FROM m_cost) cb ON cb.cb_instance = coalesce(m_calls.instance, '') WHERE in_win AND coalesce(instance, '') = $instance) m
    ASOF LEFT JOIN (SELECT instance, ts_s, max(value) AS value FROM m_samples
                    WHERE metric = 'sglang:num_queue_reqs' GROUP BY ALL) q
      ON q.instance = m.instance AND m.start_s >= q.ts_s
),
q AS (
    SELECT *, CASE WHEN queue_s IS NOT NULL THEN queue_s >= $queue_s ELSE coalesce(queue_len > 0, false) END AS queued
    FROM c
)
"""

SQL = QUEUED_CTE + """
SELECT count(*) AS calls,
       count(*) FILTER (WHERE queue_s IS NOT NULL) AS queue_time_known,
       count(*) FILTER (WHERE queued) AS queued_calls,
       count(*) FILTER (WHERE queued AND (reusable_tokens_eff > 0 OR cached_tokens > 0)) AS queued_with_prefix,
       count(*) FILTER (WHERE queued AND miss_cause IN ('evicted_full', 'evicted_partial', 'unexplained')) AS queued_evicted_calls,
       count(*) FILTER (WHERE evict_phase = 'queued') AS evicted_while_queued,
       CAST(coalesce(sum(reprefill_tokens) FILTER (WHERE queued AND miss_cause IN ('evicted_full', 'evicted_partial', 'unexplained')), 0)
            AS BIGINT) AS queued_reprefill_tokens,
       coalesce(sum(reprefill_cost_usd) FILTER (WHERE queued AND miss_cause IN ('evicted_full', 'evicted_partial', 'unexplained')), 0)
           AS queued_reprefill_usd,
       CAST(coalesce(sum(prompt_tokens - coalesce(cached_tokens, 0)), 0) AS BIGINT) AS computed_prefill,
       count(*) FILTER (WHERE queued AND miss_cause IN ('evicted_full', 'evicted_partial', 'unexplained') AND mode = 'exact') AS exact,
       any_value(cost_basis) AS cost_basis
FROM q
"""

# the calls the finding owns in the ledger: queued calls that lost their prefix to eviction
CLAIM_SQL = QUEUED_CTE + """
SELECT call_id, session_id, reprefill_tokens AS tokens, coalesce(reprefill_cost_usd, 0) AS usd FROM q
WHERE queued AND reprefill_tokens > 0 AND miss_cause IN ('evicted_full', 'evicted_partial', 'unexplained')
"""

QUEUE_SQL = """
SELECT count(*) AS samples, max(value) AS peak_queue,
       count(*) FILTER (WHERE value > 0) AS samples_queued,
       count(*) FILTER (WHERE value > 128) AS samples_over_128
FROM (SELECT ts, max(value) AS value FROM m_samples
      WHERE metric = 'sglang:num_queue_reqs' AND instance = $instance GROUP BY ts)
"""


def check(ctx: Context) -> list[Finding]:
    out = []
    for inst, cfg in ctx.instances.items():
        if cfg["engine"] != "sglang" or (cfg["schedule_policy"] or "").lower() != "fcfs":
            continue
        r = ctx.one(SQL, {"instance": inst, "queue_s": float(ctx.setting("findings_queue_s"))})
        if not r or not r["queued_with_prefix"]:
            continue
        x, usd = r["queued_reprefill_tokens"], r["queued_reprefill_usd"]
        share = x / r["computed_prefill"] if r["computed_prefill"] else None
        if not ctx.at_stake(usd, x, share):
            continue
        qs = ctx.one(QUEUE_SQL, {"instance": inst})
        over = qs.get("samples_over_128") or 0
        fallback = (f" Caveat: LPM falls back to FCFS while more than 128 requests wait — that was the case in "
                    f"{over} of {qs['samples']} queue samples (peak {qs['peak_queue']:.0f}); there, add capacity."
                    if over else
                    " LPM falls back to FCFS while more than 128 requests wait (peak observed "
                    f"{qs['peak_queue']:.0f})." if qs.get("samples") else
                    " LPM falls back to FCFS while more than 128 requests wait.")
        tax = ctx.tax(x, usd, f"GPU-time re-prefill cost ({r['cost_basis']})")
        rec = ctx.tax(x, usd, "analytical upper bound: LPM admits every queued call with a cached prefix before it "
                      "is evicted", method="analytical")
        n = r["queued_evicted_calls"]
        out.append(Finding(
            rule=ID,
            title="SGLang schedules FCFS while queued requests share cached prefixes",
            severity=ctx.severity(tax),
            scope=Scope(instance=inst, model=cfg["model"]),
            evidence=ctx.evidence({
                "schedule_policy": "fcfs",
                "calls": r["calls"],
                "queued_calls": r["queued_calls"],
                "queued_with_prefix": r["queued_with_prefix"],
                "queued_evicted_calls": n,
                "evicted_while_queued": r["evicted_while_queued"],
                "queued_reprefill_tokens": x,
                "queued_reprefill_usd": usd,
                "share_of_computed_prefill": share,
                "queue_samples": qs.get("samples"),
                "peak_queue": qs.get("peak_queue"),
                "queue_samples_over_128": over,
            }, SQL + ";\n" + QUEUE_SQL, {"instance": inst, "queue_s": float(ctx.setting("findings_queue_s"))}),
            tax=tax,
            recoverable=rec,
            confidence="low" if n < int(ctx.setting("findings_min_calls")) else "medium",
            claim=Claim(CLAIM_SQL, (("instance", inst), ("queue_s", float(ctx.setting("findings_queue_s"))))),
            fix="`--schedule-policy lpm`",
            remediation=("Launch SGLang with `--schedule-policy lpm` (longest prefix match first) so queued requests "
                         "whose prefix is cached are admitted before it is evicted; it needs the radix cache (do not "
                         "pass `--disable-radix-cache`)." + fallback),
            summary=(f"{r['queued_with_prefix']} of {r['queued_calls']} queued calls had a cached/reusable prefix; "
                     f"{n} lost it ({fmt_tokens(x)} tokens recomputed, {fmt_usd(tax.usd_week)}{tax.per})"),
        ))
    return out
