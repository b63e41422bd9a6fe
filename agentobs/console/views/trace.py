"""Trace: one trace's span tree as a waterfall (agent → chat → engine request with queue / prefill / decode, tool
spans), the attributes of the span clicked. Reached from the session timeline (each call's trace) with
``?trace=ID`` or ``?call=CALL_ID`` (any span id of the trace)."""

from __future__ import annotations

import json
from typing import Any

import altair as alt
import streamlit as st

from agentobs.console import charts, data, shell, ui
from agentobs.model.trace import TraceNotFound, load

ctx = ui.page("Trace", "The spans of one trace as stored (the spans table): rows in tree order (parent → children by "
              "start), bars from each span's start to its end, in seconds from the trace's first start; an engine "
              "span's queue, prefill and decode (its promoted phase times) drawn over it. Click a span for its "
              "attributes.")

ident = st.query_params.get("trace") or st.query_params.get("call")
typed = st.text_input("Trace id, or the id of any span in it (a call id)", value=ident or "", key="trace_id")
if typed and typed != ident:
    st.query_params["trace"] = typed.strip()
    st.query_params.pop("call", None)
    ident = typed.strip()
if not ident:
    st.info("Open a trace from a session's timeline (the calls' trace links), or paste a trace id.")
    st.stop()


def _rows(sql: str, params: dict) -> list[dict]:
    return data.query(ctx.stamp, sql, params).to_dicts()


# the spans' events when the source's model keeps them (the DuckDB store does; the ClickHouse model does not)
schema = ui.schema(ctx.stamp)
has_events = bool(((schema["name"] == "spans") & (schema["column"] == "events")).any())
try:
    tr = load(_rows, ident, events=has_events)
except TraceNotFound as e:
    st.error(str(e))
    st.stop()

sessions = tr.session_ids()
c = st.columns(4)
c[0].metric("spans", f"{len(tr.nodes):,}")
c[1].metric("duration", ui.secs(tr.duration_s))
c[2].metric("calls (engine requests)", f"{sum(1 for n in tr.nodes if n.role == 'engine'):,}")
c[3].metric("tool spans", f"{sum(1 for n in tr.nodes if n.role == 'tool'):,}")
st.caption(ui.md(f"trace `{tr.trace_id}`" + ("" if not tr.truncated else " — first spans only")))
for s in sessions:
    st.page_link(shell.page_path("session.py"), label=f"session {s} — timeline", icon=":material/timeline:",
                 query_params=ui.nav_params(ctx, session=s))

df = charts.waterfall_data(tr)
pick = alt.selection_point(fields=["span_id"], name="span", on="click")
event = st.altair_chart(charts.waterfall(df, pick), width="stretch", on_select="rerun", key="waterfall")
clicked = None
try:
    state: Any = event or {}
    sel = state.get("selection", {}).get("span") or []
    clicked = sel[0].get("span_id") if sel else None
except AttributeError:
    clicked = None

ids = [n.span_id for n in tr.nodes]
labels = {n.span_id: f"{n.prefix}{n.span.get('name') or ''} ({n.role}, {n.span_id})" for n in tr.nodes}
if clicked in ids:
    st.session_state["trace_span"] = clicked
chosen = st.selectbox("Span", ids, format_func=labels.__getitem__, key="trace_span")
node = tr.node(chosen) if chosen is not None else None
if node is not None:
    left, right = st.columns(2)
    with left:
        st.markdown(ui.md(f"**{node.span.get('name')}** — {node.role}, {ui.secs(node.duration_s)} from "
                          f"{node.offset_s:,.3f} s"))
        shown = {k: v for k, v in node.span.items() if k not in ("attributes", "events") and v is not None}
        st.json(json.loads(json.dumps(shown, default=str)), expanded=True)
    with right:
        st.markdown("**attributes**")
        st.json(node.attributes(), expanded=True)
        ev = node.events()
        if ev:
            st.markdown(f"**events** ({len(ev)})")
            st.json(ev, expanded=False)
ui.table(df.filter(df["layer"] == "span").select("row", "kind", "start_s", "duration_s", "detail"))
