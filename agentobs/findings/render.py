"""Findings as a terminal table, JSON, or Markdown (the weekly report embeds the Markdown)."""

from __future__ import annotations

import json

import pyarrow as pa

from ..output import _jsonable
from .context import fmt_duration, fmt_tokens, fmt_usd
from .finding import Finding


def to_table(findings: list[Finding]) -> pa.Table:
    """The ledger's findings as rows, in the ledger's order: $/week at stake, what the fix recovers, sessions."""
    return pa.table({
        "id": [f.id for f in findings],
        "severity": [f.severity for f in findings],
        "usd_week": [f.tax.usd_week for f in findings],
        "recoverable_usd_week": [f.recoverable.usd_week for f in findings],
        "sessions": [f.sessions for f in findings],
        "confidence": [f.confidence for f in findings],
        "summary": [f.summary for f in findings],
    }, schema=pa.schema([("id", pa.string()), ("severity", pa.string()), ("usd_week", pa.float64()),
                         ("recoverable_usd_week", pa.float64()), ("sessions", pa.int64()),
                         ("confidence", pa.string()), ("summary", pa.string())]))


def headline(ledger) -> list[str]:
    """The answer in a few short lines: the fleet's recompute tax per week with its scaling, what findings own of
    it, and the top fixes (each: $/week, sessions, the exact change; then its id and what it recovers)."""
    per = ledger.per
    scale = f", ×{ledger.scale:,.1f}" if ledger.period == "week" else ""
    band = ledger.band_text()
    out = [f"Recompute tax: {fmt_usd(ledger.usd_week)}{per} ({fmt_usd(ledger.usd_window)} observed in "
           f"{fmt_duration(ledger.window_s)}{scale}; {fmt_tokens(ledger.tokens_week)} tokens)"
           + (f" · band {band}" if band else "")]
    if ledger.usd_week > 0:
        out.append(f"Findings own {fmt_usd(ledger.owned('reprefill')[1])}{per}; "
                   f"{fmt_usd(ledger.unattributed_usd_week)} below the floors or without a rule")
    for i, f in enumerate(ledger.top_fixes(3), 1):
        rec = f.recoverable.usd_week
        fb = f.tax.band_text()
        out.append(f"{i}. {fmt_usd(f.tax.usd_week)}{f.tax.per}" + (f" ({fb})" if fb else "")
                   + (f" · {f.sessions:,} sessions" if f.sessions is not None else "") + f" · {short_fix(f)}")
        out.append(f"   {f.id}" + (f" · recovers {fmt_usd(rec)}" if rec is not None else ""))
    return out


def short_fix(f: Finding) -> str:
    """The finding's one-line exact change, else the first `code` span of its remediation."""
    if f.fix:
        return f.fix
    remediation = f.remediation
    if "`" in remediation:
        parts = remediation.split("`")
        if len(parts) >= 3:
            return parts[1]
    return remediation.split(". ")[0]


def to_json(findings: list[Finding]) -> bytes:
    return (json.dumps([_jsonable(f.to_dict()) for f in findings], indent=2, ensure_ascii=False) + "\n").encode()


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def to_markdown(findings: list[Finding], heading: str = "##") -> str:
    if not findings:
        return "No findings: no default config is making sessions pay a recompute tax in this window.\n"
    lines = []
    for f in findings:
        lines += [f"{heading} [{f.severity}] {f.title}", "",
                  f"`{f.id}` — scope {f.scope.key()}, confidence {f.confidence}"
                  + (f", acknowledged: {dict(f.acked)['reason']}" if f.acked else ""), ""]
        if f.summary:
            lines += [f.summary, ""]
        t = f.tax
        observed = (f"; observed {fmt_usd(t.usd_window)} in {fmt_duration(t.window_s)} × {t.scale:,.1f}"
                    if t.usd_window is not None and t.window_s and t.scale else "")
        lines += [f"- **Tax** ({f.kind}): {fmt_tokens(t.tokens_week)} tokens{t.per}, {fmt_usd(t.usd_week)}{t.per}"
                  f"{observed} ({t.basis})" + (f"; band {t.band_text()}" if t.band_text() else ""),
                  f"- **Recoverable** ({f.recoverable.method}): {fmt_tokens(f.recoverable.tokens_week)} tokens"
                  f"{f.recoverable.per}, {fmt_usd(f.recoverable.usd_week)}{f.recoverable.per} ({f.recoverable.basis})"]
        if f.also_recovers is not None:
            a = f.also_recovers
            lines += [f"- **Also recovers** (beyond this finding's tax): {fmt_usd(a.usd_week)}{a.per} ({a.basis})"]
        if f.sessions is not None:
            lines += [f"- **Sessions affected**: {f.sessions:,} (`agentobs findings sessions {f.id}`)"]
        lines += [f"- **Fix**: {f.remediation}", "", "Evidence:", "",
                  "| measure | value |", "|---|---|"]
        lines += [f"| {k} | {_num(v)} |" for k, v in f.evidence.numbers]
        params = ", ".join(f"${k} = {v!r}" for k, v in f.evidence.params)
        lines += ["", f"<details><summary>SQL ({params})</summary>", "", "```sql", f.evidence.sql, "```",
                  "", "</details>", ""]
    return "\n".join(lines)
