"""Findings as a terminal table, JSON, or Markdown (the weekly report embeds the Markdown)."""

from __future__ import annotations

import json

import pyarrow as pa

from ..output import _jsonable
from .context import fmt_tokens, fmt_usd
from .finding import Finding


def to_table(findings: list[Finding]) -> pa.Table:
    return pa.table({
        "id": [f.id for f in findings],
        "severity": [f.severity for f in findings],
        "tokens_week": [f.tax.tokens_week for f in findings],
        "usd_week": [f.tax.usd_week for f in findings],
        "confidence": [f.confidence for f in findings],
        "summary": [f.summary for f in findings],
    }, schema=pa.schema([("id", pa.string()), ("severity", pa.string()), ("tokens_week", pa.float64()), ("usd_week", pa.float64()), ("confidence", pa.string()),
                         ("summary", pa.string())]))


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
        lines += [f"- **Tax**: {fmt_tokens(f.tax.tokens_week)} tokens{f.tax.per}, {fmt_usd(f.tax.usd_week)}{f.tax.per} "
                  f"({f.tax.basis})",
                  f"- **Recoverable** ({f.recoverable.method}): {fmt_tokens(f.recoverable.tokens_week)} tokens"
                  f"{f.recoverable.per}, {fmt_usd(f.recoverable.usd_week)}{f.recoverable.per} ({f.recoverable.basis})",
                  f"- **Fix**: {f.remediation}", "", "Evidence:", "",
                  "| measure | value |", "|---|---|"]
        lines += [f"| {k} | {_num(v)} |" for k, v in f.evidence.numbers]
        params = ", ".join(f"${k} = {v!r}" for k, v in f.evidence.params)
        lines += ["", f"<details><summary>SQL ({params})</summary>", "", "```sql", f.evidence.sql, "```",
                  "", "</details>", ""]
    return "\n".join(lines)
