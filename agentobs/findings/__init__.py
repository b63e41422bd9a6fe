"""Findings: the default configs that make sessions pay a recompute tax — evidence, tokens and $
per week, and the exact fix.

    from agentobs.findings import build
    ledger = build(as_source("agentobs.duckdb"), since="7d")   # agentobs.source.as_source: a Source
    print(ledger.usd_week, ledger.window_text)          # the fleet's recompute tax per week
    for f in ledger.findings:                           # $/week at stake first
        print(f.id, f.severity, f.tax.usd_week, f.recoverable.usd_week, f.sessions, f.remediation)

Rules live one per module under ``rules/`` and run in the order of ``rules.RULES``; each reads one
prepared metric run (agentobs.metrics) and the engine config. See docs/findings.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..config import Settings
from ..source import Source
from .finding import Claim, Evidence, Finding, Scope, Tax
from .ledger import Ledger, build
from .rules import RULES

__all__ = ["RULES", "Claim", "Evidence", "Finding", "Ledger", "Scope", "Tax", "build", "run"]


def run(db: Source, since=None, until=None, settings: Settings | None = None, *, filters: dict | None = None,
        include_acked: bool = False, simulate: bool = True, clock: Callable[[], float] = time.time) -> list[Finding]:
    """The findings of the tax ledger (agentobs.findings.ledger.build) over calls starting in ``[since, until)``,
    in the ledger's order ($/week at stake, then severity). Surfaces that show more than the list (the fleet's
    tax, the trend, the sessions affected) take the :class:`~agentobs.findings.ledger.Ledger` itself."""
    return list(build(db, since, until, filters, settings, include_acked=include_acked, simulate=simulate,
                      clock=clock).findings)
