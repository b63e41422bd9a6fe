"""Observability gap: model calls carry no session id.

Trigger: at least ``findings_no_session_share`` of the calls in the window have no session id
(none of the ``session_keys`` attributes on the call or its trace's agent span).

Evidence: calls, calls without a session, their prompt tokens, the attribute names looked for.

What cannot be measured for them: everything per session — reusable prefix R (so re-prefill X and
miss causes), hit rates U/H, idle gaps and KV rent, turn-resume TTFT, routing affinity. No tax.

Fix: put the agent's session id on the spans as ``gen_ai.conversation.id`` (OpenTelemetry GenAI
conventions) or ``session.id``; or let the gateway record a session header (e.g. ``x-session-id``
as ``http.request.header.x-session-id``) — or add the attribute your stack already uses to the
``session_keys`` setting.
"""

from __future__ import annotations

from ..context import Context, fmt_tokens
from ..finding import Finding, Scope, Tax

ID = "obs_session_id"

SQL = """
SELECT count(*) AS calls,
       count(*) FILTER (WHERE session_id IS NULL) AS no_session_calls,
       CAST(coalesce(sum(prompt_tokens) FILTER (WHERE session_id IS NULL), 0) AS BIGINT) AS no_session_prompt_tokens
FROM m_calls
WHERE in_win
"""


def check(ctx: Context) -> list[Finding]:
    r = ctx.one(SQL)
    if not r.get("calls") or not r["no_session_calls"]:
        return []
    share = r["no_session_calls"] / r["calls"]
    if share < float(ctx.setting("findings_no_session_share")):
        return []
    keys = list(ctx.setting("session_keys"))
    return [Finding(
        rule=ID,
        title="Model calls carry no session id: per-session reuse cannot be measured",
        severity=ctx.severity(None),
        kind="observability",
        scope=Scope(),
        evidence=ctx.evidence({"calls": r["calls"], "calls_without_session": r["no_session_calls"],
                               "share_without_session": share,
                               "prompt_tokens_unattributed": r["no_session_prompt_tokens"],
                               "session_keys": ", ".join(keys[:6]) + (", …" if len(keys) > 6 else "")}, SQL),
        tax=Tax(None, None, "cannot be measured without session ids"),
        recoverable=Tax(None, None, "not applicable: an observability fix", method="analytical"),
        confidence="high",
        fix="`gen_ai.conversation.id` on every model-call span",
        remediation=("Set the agent's session id on every model-call span as `gen_ai.conversation.id` (OpenTelemetry "
                     "GenAI conventions) or `session.id`, or have the gateway record the session header "
                     "(`x-session-id` → `http.request.header.x-session-id`); if your stack already uses another "
                     "attribute, add it to the `session_keys` setting. Until then re-prefill, miss causes, hit rates, "
                     "idle-KV rent, turn-resume TTFT and routing affinity are unknown for these calls."),
        summary=(f"{r['no_session_calls']} of {r['calls']} calls ({share:.0%}, "
                 f"{fmt_tokens(r['no_session_prompt_tokens'])} prompt tokens) have no session id"),
    )]
