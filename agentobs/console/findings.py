"""Findings in the console, from ``agentobs.findings.run(db, since, until)`` (rules over the metrics and engine
config). By default without the simulator replay (the analytical recoverable estimate, seconds instead of
tens of seconds); the Findings page can ask for the replay.

The global instance / model / task type filters keep findings whose scope matches (fleet-wide findings,
with no scope value, always show).
"""

from __future__ import annotations

import importlib

import streamlit as st

from . import data
from .shell import Context


@st.cache_data(show_spinner="evaluating findings…", max_entries=64, ttl=3600)
def _run(stamp, since, until, simulate: bool = False) -> list:
    mod = importlib.import_module("agentobs.findings")
    return list(mod.run(data.source(stamp), since=since, until=until, simulate=simulate))


def _in_scope(f, ctx: Context) -> bool:
    scope = getattr(f, "scope", None)
    for key, wanted in ctx.filters.lists().items():
        v = getattr(scope, key, None)
        if v is not None and v not in wanted:
            return False
    return True


def load(ctx: Context, simulate: bool = False):
    """(findings, message)."""
    return [f for f in _run(ctx.stamp, ctx.since, ctx.until, simulate) if _in_scope(f, ctx)], ""


def usd_week(f) -> float:
    tax = getattr(f, "tax", None)
    return getattr(tax, "usd_week", None) or 0.0


def render(f, expanded: bool = False) -> None:
    tax = getattr(f, "tax", None)
    usd = getattr(tax, "usd_week", None)
    per = getattr(tax, "per", "/week")  # "/week", or " in the observed window" for short windows
    head = f"**{f.severity}** · {f.title}" + (f" · ${usd:,.2f}{per} at stake" if usd is not None else "")
    with st.expander(head, expanded=expanded):
        if getattr(f, "summary", ""):
            st.write(f.summary)
        scope = getattr(f, "scope", None)
        parts = [f"{k}: {getattr(scope, k)}" for k in ("instance", "model", "task_type") if getattr(scope, k, None)]
        st.caption(f"rule `{f.rule}` · confidence {f.confidence} · scope: {', '.join(parts) or 'fleet'}")
        ev = getattr(f, "evidence", None)
        if ev is not None and ev.numbers:
            st.markdown("**Evidence**")
            st.table({"number": [k for k, _ in ev.numbers], "value": [str(v) for _, v in ev.numbers]})
            if getattr(ev, "sql", ""):
                with st.popover("Evidence SQL"):
                    st.code(ev.sql, language="sql")
        if tax is not None:
            tok = f"{tax.tokens_week:,.0f} tokens{per}" if tax.tokens_week is not None else "tokens unknown"
            st.caption(f"at stake: {tok}; ${usd:,.2f}{per}" if usd is not None else f"at stake: {tok}")
            st.caption(f"basis: {tax.basis} ({tax.method})")
        st.markdown("**Fix** (copy)")
        st.code(f.remediation, language="bash")


def top(ctx: Context, n: int = 5, simulate: bool = False) -> None:
    try:
        items, msg = load(ctx, simulate)
    except Exception as e:  # noqa: BLE001 - findings are someone else's module; show its error, keep the page
        st.error(f"findings failed: {e}")
        return
    if items is None:
        st.info(msg)
        return
    if not items:
        st.success("No findings in this view.")
        return
    items = sorted(items, key=lambda f: -usd_week(f))
    st.caption(f"{len(items)} finding(s), most $ at stake first")
    for f in items[:n]:
        render(f)
