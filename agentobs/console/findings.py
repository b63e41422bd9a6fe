"""Findings in the console: read from ``agentobs.findings`` when that package exists; until then the
console says so plainly instead of inventing any.

Expected entry point: ``agentobs.findings.evaluate(db=..., since=..., until=..., filters=...)`` returning
findings with ``id``, ``title``, ``severity``, ``evidence``, ``usd_per_week``, ``fix`` (attributes or keys).
"""

from __future__ import annotations

import importlib

import streamlit as st

from .metrics import module_available
from .shell import Context

ENTRY_POINTS = ("evaluate", "run", "compute", "find")


def _get(f, key, default=None):
    return f.get(key, default) if isinstance(f, dict) else getattr(f, key, default)


def load(ctx: Context):
    """(findings list, message). findings is None when there is nothing to evaluate with."""
    if not module_available("agentobs.findings"):
        return None, "No findings module yet (`agentobs.findings` is not in this build)."
    mod = importlib.import_module("agentobs.findings")
    fn = next((getattr(mod, n) for n in ENTRY_POINTS if callable(getattr(mod, n, None))), None)
    if fn is None:
        return None, f"`agentobs.findings` has none of the entry points {', '.join(ENTRY_POINTS)} yet."
    filters = {k: list(v) for k, v in ctx.filters.lists().items()} or None
    return list(fn(db=ctx.db, since=ctx.since, until=ctx.until, filters=filters)), ""


def render(f, expanded: bool = False) -> None:
    usd = _get(f, "usd_per_week")
    head = f"**{_get(f, 'severity', '')}** · {_get(f, 'title', _get(f, 'id'))}"
    if usd is not None:
        head += f" · ${usd:,.2f}/week at stake"
    with st.expander(head, expanded=expanded):
        ev = _get(f, "evidence")
        if ev:
            st.markdown("**Evidence**")
            if isinstance(ev, dict):
                st.table({"evidence": list(ev), "value": [str(v) for v in ev.values()]})
            else:
                st.write(ev)
        fix = _get(f, "fix")
        if fix:
            st.markdown("**Fix** (copy)")
            st.code(str(fix), language="bash")


def top(ctx: Context, n: int = 5) -> None:
    try:
        items, msg = load(ctx)
    except Exception as e:  # noqa: BLE001 - findings are someone else's module; show its error, keep the page
        st.error(f"findings failed: {e}")
        return
    if items is None:
        st.info(msg)
        return
    if not items:
        st.success("No findings in this view.")
        return
    items.sort(key=lambda f: -(_get(f, "usd_per_week") or 0))
    for f in items[:n]:
        render(f)
