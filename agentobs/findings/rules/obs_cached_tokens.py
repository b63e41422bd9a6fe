"""Observability gap: the spans do not report cached prompt tokens.

Trigger: on an instance, at least ``findings_unknown_cached_share`` of the calls have no cached
token count ``C`` (NULL = unknown, never 0; METRICS.md notation).

Evidence: calls, calls with unknown C, their prompt tokens; for SGLang the ``enable_cache_report``
config value.

What cannot be measured there: session and reuse hit rates (H, U), re-prefill X and its miss
causes (they show as ``unknown``), the idle-window outcome and KV rent, turn-resume TTFT by hit
class — so every other rule is blind on that instance. No tax is computed.

Fix: vLLM ``--enable-prompt-tokens-details`` (reference/vllm.md §3; note vLLM then still omits the
field when 0 tokens were cached), SGLang ``--enable-cache-report`` (reference/sglang.md §3.2); the
gateway must copy ``usage.prompt_tokens_details.cached_tokens`` into a span attribute such as
``gen_ai.usage.cache_read.input_tokens``.
"""

from __future__ import annotations

from ..context import Context, fmt_tokens
from ..finding import Claim, Finding, Scope, Tax

ID = "obs_cached_tokens"

SQL = """
SELECT count(*) AS calls,
       count(*) FILTER (WHERE cached_tokens IS NULL) AS unknown_calls,
       CAST(coalesce(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NULL), 0) AS BIGINT) AS unknown_prompt_tokens
FROM m_calls
WHERE in_win AND coalesce(instance, '') = $instance
"""

# the same numbers for every instance in one scan (SQL above is what the evidence shows, per instance)
ALL = """
SELECT coalesce(instance, '') AS instance, count(*) AS calls,
       count(*) FILTER (WHERE cached_tokens IS NULL) AS unknown_calls,
       CAST(coalesce(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NULL), 0) AS BIGINT) AS unknown_prompt_tokens
FROM m_calls
WHERE in_win
GROUP BY ALL
"""

# the calls it covers in the ledger (sessions affected): calls of the instance without a cached-token count
CLAIM_SQL = """
SELECT call_id, session_id, 0 AS tokens, 0 AS usd FROM m_calls
WHERE in_win AND coalesce(instance, '') = $instance AND cached_tokens IS NULL
"""

FIX = {
    "vllm": ("Launch vLLM with `--enable-prompt-tokens-details` so responses carry "
             "`usage.prompt_tokens_details.cached_tokens` (vLLM omits the field when nothing was cached: a gateway "
             "should then record 0)"),
    "sglang": ("Launch SGLang with `--enable-cache-report` so responses carry "
               "`usage.prompt_tokens_details.cached_tokens` (omitted when 0: a gateway should then record 0)"),
}


def check(ctx: Context) -> list[Finding]:
    out = []
    thr = float(ctx.setting("findings_unknown_cached_share"))
    per = {r["instance"]: r for r in ctx.rows(ALL)}
    for inst, cfg in ctx.instances.items():
        r = per.get(inst, {})
        if not r.get("calls") or not r["unknown_calls"]:
            continue
        share = r["unknown_calls"] / r["calls"]
        if share < thr:
            continue
        engine = cfg["engine"]
        fix = FIX.get(engine, f"{FIX['vllm']}; for SGLang: {FIX['sglang'][0].lower()}{FIX['sglang'][1:]}")
        numbers = {"engine": engine, "calls": r["calls"], "calls_cached_unknown": r["unknown_calls"],
                   "share_unknown": share, "prompt_tokens_unmeasured": r["unknown_prompt_tokens"]}
        if engine == "sglang":
            numbers["enable_cache_report"] = cfg["cache_report"]
        out.append(Finding(
            rule=ID,
            title="Cached prompt tokens are not reported: cache reuse cannot be measured",
            severity=ctx.severity(None),
            kind="observability",
            claim=Claim(CLAIM_SQL, (("instance", inst),)),
            scope=Scope(instance=inst or None, model=cfg["model"]),
            evidence=ctx.evidence(numbers, SQL, {"instance": inst}),
            tax=Tax(None, None, "cannot be measured without cached-token counts"),
            recoverable=Tax(None, None, "not applicable: an observability fix", method="analytical"),
            confidence="high",
            fix="`--enable-cache-report`" if engine == "sglang" else "`--enable-prompt-tokens-details`",
            remediation=(fix + ", and have the gateway export it on its spans as "
                         "`gen_ai.usage.cache_read.input_tokens`. Until then hit rates, re-prefill and its causes, "
                         "idle-KV rent and turn-resume TTFT by hit class are unknown on this instance."),
            summary=(f"{r['unknown_calls']} of {r['calls']} calls ({share:.0%}, "
                     f"{fmt_tokens(r['unknown_prompt_tokens'])} prompt tokens) have no cached-token count"),
        ))
    return out
