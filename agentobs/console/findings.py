"""The recompute-tax ledger in the console (agentobs.findings.build), computed once per (store state, window,
filters) and rendered by the Overview's first screen, the Findings page and the Sessions page's finding filter.

The console asks for the same ledger as ``agentobs findings`` with the same window and ``--filter``s: the same
simulator replay for the recoverable figures (cached, so only the first render of a view pays it), the same ids,
$ and order. The global instance / model / task type filters are the ledger's filters (its calls), not a filter
on the finished list.
"""

from __future__ import annotations

import importlib

import altair as alt
import polars as pl
import streamlit as st

from . import data, ui
from .shell import Context, page_path

# miss causes in the console's colours (charts.CLASS_COLORS: a miss is red everywhere)
CAUSE_COLORS = {
    "cache_disabled": "#c62828",
    "routed_away": "#ef6c00",
    "evicted_full": "#8e24aa",
    "evicted_partial": "#fdd835",
    "unexplained": "#90a4ae",   # a shortfall nothing explains (estimate mode without evidence: docs/metrics.md)
    "unknown": "#b0bec5",
    "error": "#6a1b9a",
}


@st.cache_data(show_spinner="computing the recompute-tax ledger…", max_entries=64, ttl=3600)
def _ledger(stamp, since, until, filters: tuple, simulate: bool):
    mod = importlib.import_module("agentobs.findings")
    return mod.build(data.source(stamp), since=since, until=until, filters=dict(filters) or None,
                     simulate=simulate)


def ledger(ctx: Context, simulate: bool = True):
    """The ledger of the view: its window and its filters."""
    flt = tuple(sorted((k, tuple(v)) for k, v in ctx.filters.lists().items()))
    return _ledger(ctx.stamp, ctx.since, ctx.until, flt, simulate)


def money(v) -> str:
    """$ on the first screen as the CLI, the report and `agentobs findings` print it (cents: the same string on every
    surface; agentobs.findings.context.fmt_usd)."""
    from agentobs.findings.context import fmt_usd

    return "–" if ui.is_missing(v) else fmt_usd(v)


def num(v) -> str:
    """An evidence value as the Markdown rendering of a finding writes it (agentobs.findings.render)."""
    from agentobs.findings.render import _num

    return _num(v)


def _fix_text(f) -> str:
    from agentobs.findings.render import short_fix

    return short_fix(f)


def sessions_page_link(ctx: Context, f) -> None:
    """"N sessions affected" → the Sessions page filtered to the finding (in the app, keeping the view)."""
    st.page_link(page_path("sessions.py"), label=f"{f.sessions or 0:,} sessions affected",
                 icon=":material/list:", query_params=ui.nav_params(ctx, finding=f.id))


def trend_chart(led) -> alt.Chart | None:
    """The fleet's recompute tax over time by miss cause (the ledger's trend rows, $ per bucket)."""
    if not led.trend:
        return None
    df = pl.DataFrame({"t_s": [r[0] for r in led.trend], "cause": [r[1] for r in led.trend],
                       "usd": [r[3] for r in led.trend]}).with_columns(
        pl.from_epoch(pl.col("t_s"), time_unit="s").alias("time"))
    causes = [c for c in CAUSE_COLORS if c in set(df["cause"].to_list())] + \
        sorted(set(df["cause"].to_list()) - set(CAUSE_COLORS))
    b = led.trend_bucket_s
    bucket = f"{b / 60:g} min" if b < 3600 else f"{b / 3600:g} h"
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("time:T", title=f"call start (UTC), {bucket} buckets"),
        y=alt.Y("sum(usd):Q", title=f"re-prefill $ per {bucket}", axis=alt.Axis(format="$,.2f")),
        color=alt.Color("cause:N", title="miss cause",
                        scale=alt.Scale(domain=causes, range=[CAUSE_COLORS.get(c, "#607d8b") for c in causes])),
        tooltip=[alt.Tooltip("time:T"), "cause", alt.Tooltip("usd:Q", format="$,.4f")],
    ).properties(height=230)


def answer(ctx: Context, simulate: bool = True, slot=None):
    """The Overview's first screen: the fleet's recompute tax per week with its scaling, the top fixes with their
    $/week and the sessions they affect, and the tax over time by cause. Drawn into ``slot`` (an ``st.empty``;
    a new one when None), which it returns: the Overview draws it first without the simulator replay (the tax,
    fixes and sessions are the same; only "recovers" waits for the replay), then again with it once the rest of
    the page is drawn."""
    slot = slot if slot is not None else st.empty()
    try:
        led = ledger(ctx, simulate)
    except Exception as e:  # noqa: BLE001 - the ledger is another module's; show its error, keep the page
        slot.error(f"recompute-tax ledger failed: {e}")
        return slot
    # .st-key-tax_answer: the final draw, what the browser test reads (a key is unique per run: the first draw's differs)
    box = slot.container(key="tax_answer" if simulate else "tax_answer_pending")
    left, right = box.columns([5, 6])
    with left:
        st.metric("Recompute tax" + (" per week" if led.period == "week" else " (observed window)"),
                  money(led.usd_week),
                  help="Every re-prefill token of the view (METRICS.md §1: X = max(0, R_eff − C)) at its GPU-time "
                       "cost (§8), observed in the window and scaled to a week. Findings own parts of it; each "
                       "call's re-prefill is owned by at most one finding (docs/findings.md).")
        band = led.band_text()
        st.caption((f"band {band} (X_low: evidence of the cause; X_high: every shortfall) · " if band else "")
                   + f"{money(led.usd_window)} observed · {led.window_text} · findings own "
                   f"{money(led.owned('reprefill')[1])}, {money(led.unattributed_usd_week)} unattributed · "
                   f"{led.sessions_with_reprefill:,} of {led.sessions:,} sessions paid it")
        fixes = led.top_fixes(3)
        if not fixes:
            st.success("No finding has a $ figure in this view: no default config is making sessions pay a "
                       "recompute tax above the floors.")
        for i, f in enumerate(fixes, 1):
            rec = f.recoverable.usd_week
            recovers = ("recovers … (replaying sessions)" if not simulate else
                        f"recovers {money(rec)}{f.tax.per if rec is not None else ''}")
            band = f.tax.band_text()  # estimate mode: the same band the CLI and the Findings page print
            st.markdown(f"**{i}. {money(f.tax.usd_week)}{f.tax.per}**" + (f" ({band})" if band else "")
                        + f" · {_fix_text(f)}  \n"
                        f"<small>`{f.id}` · {f.severity} · {recovers}</small>", unsafe_allow_html=True)
            sessions_page_link(ctx, f)
    with right:
        chart = trend_chart(led)
        if chart is None:
            st.caption("No re-prefill in this view.")
        else:
            st.altair_chart(chart, width="stretch")
    return slot


def _scope_parts(f) -> list[str]:
    return [f"{k}: {getattr(f.scope, k)}" for k in ("instance", "model", "task_type") if getattr(f.scope, k, None)]


def head(f) -> str:
    """A finding's one-line label: $ at stake (or its kind), title, scope (so findings of one rule on several
    instances tell apart), severity."""
    usd, per = f.tax.usd_week, f.tax.per  # per: "/week", or " in the observed window" for short windows
    scope = ", ".join(_scope_parts(f))
    return ((f"**{money(usd)}{per}** · {f.title}" if usd is not None else f"**{f.kind}** · {f.title}")
            + (f" · {scope}" if scope else "") + f" · {f.severity}")


def render(f, ctx: Context | None = None, expanded: bool = False) -> None:
    tax = f.tax
    usd = tax.usd_week
    per = tax.per
    with st.expander(head(f), expanded=expanded):
        if f.summary:
            st.write(f.summary)
        parts = _scope_parts(f)
        st.caption(f"`{f.id}` · confidence {f.confidence} · scope: {', '.join(parts) or 'fleet'}")
        c = st.columns(3)
        c[0].metric(f"Tax{per}", money(usd) if usd is not None else "–",
                    help=f"{tax.method}: {tax.basis}")
        rec = f.recoverable
        c[1].metric(f"Recoverable{rec.per}", money(rec.usd_week) if rec.usd_week is not None else "–",
                    help=f"{rec.method}: {rec.basis}")
        if f.sessions is not None:
            c[2].metric("Sessions affected", f"{f.sessions:,}")
            if ctx is not None:
                with c[2]:
                    sessions_page_link(ctx, f)
        if tax.usd_window is not None and tax.window_s:
            st.caption(f"observed {money(tax.usd_window)} in the window, × {tax.scale:,.2f} → {money(usd)}{per}")
        if tax.band_text():
            st.caption(f"band {tax.band_text()}: severity on the lower end, confidence from the spread")
        if f.also_recovers is not None:
            st.caption(f"also recovers {money(f.also_recovers.usd_week)}{f.also_recovers.per} beyond this "
                       f"finding's tax: {f.also_recovers.basis}")
        st.markdown("**Fix** (copy)")
        st.code(f.remediation, language="bash")
        ev = f.evidence
        if ev.numbers:
            st.markdown("**Evidence**")
            st.table({"number": [k for k, _ in ev.numbers], "value": [num(v) for _, v in ev.numbers]})
            if ev.sql:
                with st.popover("Evidence SQL"):
                    st.code(ev.sql, language="sql")


def top(ctx: Context, n: int = 5, simulate: bool = True) -> None:
    """The ledger's findings in its order ($/week at stake, then severity)."""
    try:
        led = ledger(ctx, simulate)
    except Exception as e:  # noqa: BLE001 - findings are someone else's module; show its error, keep the page
        st.error(f"findings failed: {e}")
        return
    if not led.findings:
        st.success("No findings in this view.")
        return
    st.caption(f"{len(led.findings)} finding(s), most $/week at stake first · recompute tax "
               f"{money(led.usd_week)}{led.per} ({led.window_text})")
    for f in led.findings[:n]:
        render(f, ctx)
    if len(led.findings) > n:
        st.page_link(page_path("findings.py"), label=f"All {len(led.findings)} findings",
                     icon=":material/lightbulb:", query_params=ui.nav_params(ctx))
