"""Findings: the default configs that make sessions pay a recompute tax — evidence, tokens and $
per week, and the exact fix.

    from agentobs.findings import run
    for f in run("agentobs.duckdb", since="7d"):
        print(f.id, f.severity, f.tax.usd_week, f.remediation)

Rules live one per module under ``rules/`` and run in the order of ``rules.RULES``; each reads one
prepared metric run (agentobs.metrics) and the engine config. See docs/findings.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ..config import Settings, load_settings
from .acks import active
from .context import Context, default_since
from .finding import SEVERITIES, Evidence, Finding, Scope, Tax
from .rules import RULES

__all__ = ["RULES", "Evidence", "Finding", "Scope", "Tax", "run"]


def _order(f: Finding):
    return (SEVERITIES.index(f.severity), -(f.tax.usd_week or 0.0), f.id)


def run(db, since=None, until=None, settings: Settings | None = None, *, include_acked: bool = False,
        simulate: bool = True, clock: Callable[[], float] = time.time) -> list[Finding]:
    """Every finding over calls starting in ``[since, until)`` (times as agentobs.metrics.parse_time
    takes them), most severe first. Without ``since`` the window is ``findings_default_window_s``
    (7 days) ending at ``until``, or at the newest call. ``db``: a path or an open (read-only is fine)
    DuckDB connection. Findings acknowledged until a later time are left out unless
    ``include_acked``; then they carry the acknowledgement in ``acked``. ``simulate``: estimate what
    each fix recovers by replaying the observed sessions through the simulator (agentobs.findings.
    estimate; also off when ``findings_sim_sessions`` is 0) — else the analytical estimate."""
    from ..metrics import prepare
    from .estimate import refine

    settings = settings if settings is not None else load_settings()
    mrun, close = prepare(db, since, until, settings=settings, clock=clock)
    try:
        given = mrun.since is not None
        start = mrun.since if given else default_since(mrun, mrun.until,
                                                       float(settings.get("findings_default_window_s")))
        ctx = Context(mrun.cur, settings, start, mrun.until, clock, since_given=given, run=mrun)
        found: list[Finding] = []
        for rule in RULES:
            found.extend(rule.check(ctx))
        found = refine(found, ctx, simulate=simulate)
        acks = active(mrun.cur, clock)
    finally:
        try:
            # the run may be shared with other users (agentobs.metrics.prepare: the report, the console's
            # Overview): give it back with its own window
            mrun.reset_window()
        finally:
            close()
    out = []
    for f in found:
        a = acks.get(f.id)
        if a is not None:
            if not include_acked:
                continue
            f = dataclasses.replace(f, acked=tuple((k, a[k]) for k in ("reason", "until", "created_by")))
        out.append(f)
    return sorted(out, key=_order)
