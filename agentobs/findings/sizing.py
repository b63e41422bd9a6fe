"""Shared measurements the rules size their fixes from.

- ``misses(ctx, instance)``: per instance, calls, computed prefill Σ(P − C), and re-prefill X with
  its GPU-time cost per miss cause (METRICS.md §1, §3).
- ``evicted_misses(ctx, instance)``: the evicted-prefix re-prefill of an instance (both eviction
  causes) with the idle KV, the evidence both "add a second KV tier" rules (SGLang HiCache, vLLM
  CPU offloading) start from; None when it is not worth a finding.
- ``idle_kv(ctx, instance)``: the KV held by idle sessions on an instance (METRICS.md §4): every
  idle window ``[t2(prev), t0(c)]`` of a session whose previous call ran on the same instance holds
  ``K = P(prev) + O(prev)`` tokens; the peak of their sum over time is what a second tier must hold
  to keep every idle session, the time-weighted mean is the typical load.
"""

from __future__ import annotations

from dataclasses import dataclass

from .context import Context
from .finding import Claim

# the calls a re-prefill finding owns (agentobs.findings.ledger): in-window calls of the scope whose miss cause is
# the finding's; tokens and $ are the call's re-prefill and its GPU-time cost
CAUSE_CLAIM_SQL = """
SELECT call_id, session_id, reprefill_tokens AS tokens, coalesce(reprefill_cost_usd, 0) AS usd
FROM m_calls
WHERE in_win AND reprefill_tokens > 0 AND CAST(miss_cause AS VARCHAR) IN ($cause, $cause2, $cause3)
  AND ($instance IS NULL OR coalesce(instance, '') = $instance)
  AND ($model IS NULL OR coalesce(model, '') = $model)
"""


def cause_claim(cause: str, cause2: str = "", cause3: str = "", instance: str | None = None,
                model: str | None = None) -> Claim:
    return Claim(CAUSE_CLAIM_SQL, (("cause", cause), ("cause2", cause2 or cause), ("cause3", cause3 or cause),
                                   ("instance", instance), ("model", model)))

MISSES_SQL = """
SELECT count(*) AS calls,
       count(*) FILTER (WHERE prev_call_id IS NOT NULL) AS follow_ups,
       CAST(coalesce(sum(prompt_tokens - coalesce(cached_tokens, 0)), 0) AS BIGINT) AS computed_prefill,
       CAST(coalesce(sum(reprefill_tokens), 0) AS BIGINT) AS reprefill_tokens,
       CAST(coalesce(sum(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL), 0) AS BIGINT) AS reusable_tokens,
       count(*) FILTER (WHERE miss_cause = $cause) AS cause_calls,
       CAST(coalesce(sum(reprefill_tokens) FILTER (WHERE miss_cause = $cause), 0) AS BIGINT) AS cause_tokens,
       coalesce(sum(reprefill_cost_usd) FILTER (WHERE miss_cause = $cause), 0) AS cause_usd,
       count(*) FILTER (WHERE miss_cause = $cause AND mode = 'exact') AS cause_exact,
       count(*) FILTER (WHERE miss_cause = $cause2) AS cause2_calls,
       CAST(coalesce(sum(reprefill_tokens) FILTER (WHERE miss_cause = $cause2), 0) AS BIGINT) AS cause2_tokens,
       coalesce(sum(reprefill_cost_usd) FILTER (WHERE miss_cause = $cause2), 0) AS cause2_usd,
       count(*) FILTER (WHERE miss_cause = $cause2 AND mode = 'exact') AS cause2_exact,
       count(*) FILTER (WHERE miss_cause = $cause3) AS cause3_calls,
       CAST(coalesce(sum(reprefill_tokens) FILTER (WHERE miss_cause = $cause3), 0) AS BIGINT) AS cause3_tokens,
       coalesce(sum(reprefill_cost_usd) FILTER (WHERE miss_cause = $cause3), 0) AS cause3_usd,
       count(*) FILTER (WHERE miss_cause = $cause3 AND mode = 'exact') AS cause3_exact,
       any_value(cost_basis) AS cost_basis
FROM m_calls LEFT JOIN (SELECT instance AS cb_instance, basis AS cost_basis FROM m_cost) cb ON cb.cb_instance = coalesce(m_calls.instance, '')
WHERE in_win AND coalesce(instance, '') = $instance
"""

IDLE_KV_SQL = """
WITH iv AS (
    SELECT start_s - gap_before_s AS a, start_s AS b, kv_tokens_before AS k
    FROM m_calls
    WHERE in_win AND coalesce(instance, '') = $instance AND prev_instance = instance
      AND gap_before_s > 0 AND kv_tokens_before > 0
),
ev AS (SELECT a AS t, k AS d FROM iv UNION ALL SELECT b AS t, -k AS d FROM iv),
run AS (SELECT t, sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS held FROM ev)
SELECT (SELECT count(*) FROM iv) AS idle_windows,
       (SELECT coalesce(max(held), 0) FROM run) AS peak_idle_kv_tokens,
       (SELECT coalesce(sum(k * (b - a)), 0) FROM iv) AS idle_kv_token_s,
       (SELECT max(b) - min(a) FROM iv) AS idle_span_s
"""


def misses(ctx: Context, instance: str, cause: str, cause2: str = "", cause3: str = "") -> dict:
    return ctx.one(MISSES_SQL, {"instance": instance, "cause": cause, "cause2": cause2, "cause3": cause3})


def idle_kv(ctx: Context, instance: str) -> dict:
    r = ctx.one(IDLE_KV_SQL, {"instance": instance})
    span = r.get("idle_span_s") or 0.0
    r["mean_idle_kv_tokens"] = r["idle_kv_token_s"] / span if span > 0 else 0.0
    return r


def gib(tokens: float, bytes_per_token: float | None) -> float | None:
    return None if not bytes_per_token else tokens * bytes_per_token / 2**30


# the eviction causes, and the shortfalls nothing explains (estimate mode without evidence: an eviction or a prompt
# edit; the finding's band keeps them out of its lower end, docs/findings.md)
EVICTED_CAUSES = ("evicted_full", "evicted_partial", "unexplained")


@dataclass
class Evicted:
    """Re-prefill of prefixes an instance evicted (METRICS.md §1 causes evicted_full + evicted_partial)."""

    misses: dict        # the MISSES_SQL row
    tokens: int         # X of both causes
    usd: float          # its GPU-time cost
    share: float | None  # of computed prefill Σ(P − C)
    calls: int
    exact: bool         # every miss measured with KV events / block hashes
    idle: dict          # idle_kv() of the instance

    @property
    def cost_basis(self) -> str:
        return self.misses["cost_basis"]

    def evidence(self) -> dict:
        m = self.misses
        return {
            "evicted_miss_calls": self.calls,
            "evicted_full_tokens": m["cause_tokens"],
            "evicted_partial_tokens": m["cause2_tokens"],
            "unexplained_tokens": m["cause3_tokens"],
            "reprefill_tokens": self.tokens,
            "share_of_computed_prefill": self.share,
            "reprefill_usd": self.usd,
            "peak_idle_kv_tokens": self.idle["peak_idle_kv_tokens"],
            "mean_idle_kv_tokens": self.idle["mean_idle_kv_tokens"],
        }

    @staticmethod
    def sql_and_params(instance: str) -> tuple[str, dict]:
        return (MISSES_SQL + ";\n" + IDLE_KV_SQL,
                {"instance": instance, "cause": EVICTED_CAUSES[0], "cause2": EVICTED_CAUSES[1],
                 "cause3": EVICTED_CAUSES[2]})


def evicted_misses(ctx: Context, instance: str) -> Evicted | None:
    m = misses(ctx, instance, *EVICTED_CAUSES)
    x = m["cause_tokens"] + m["cause2_tokens"] + m["cause3_tokens"]
    usd = m["cause_usd"] + m["cause2_usd"] + m["cause3_usd"]
    share = x / m["computed_prefill"] if m["computed_prefill"] else None
    if not ctx.at_stake(usd, x, share):
        return None
    n = m["cause_calls"] + m["cause2_calls"] + m["cause3_calls"]
    return Evicted(m, x, usd, share, n, (m["cause_exact"] + m["cause2_exact"] + m["cause3_exact"]) == n,
                   idle_kv(ctx, instance))
