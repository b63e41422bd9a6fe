"""Session timeline: calls as bars on instance lanes, tool calls and idle gaps between them, each call
colored hit / partial / miss with its re-prefill tokens, instance changes marked; then the per-call table, each
call linked to its trace's span waterfall (the Trace page)."""

from __future__ import annotations

import polars as pl
import streamlit as st

from agentobs.console import charts, metrics, ui

ctx = ui.page("Session timeline", "Calls on the lane of the instance that served them; hit class and re-prefill "
              "X = max(0, R_eff − C) per call come from the metrics API's `call_reuse` (METRICS.md §1, §5: hit when "
              "C ≥ R_eff − B). Times UTC.")

sid = st.query_params.get("session")
if not sid:
    recent = ui.sessions(ctx.stamp, ctx.filters, ctx.since, ctx.until, "", "newest", 200)
    if ui.empty(recent, "sessions"):
        st.stop()
    sid = st.selectbox("Session", recent["session_id"].to_list(), index=None, key="timeline_pick",
                       placeholder="choose a session")
    if not sid:
        st.stop()
    st.query_params["session"] = sid

calls = ui.session_calls(ctx.stamp, sid)
if calls.height == 0:
    alts = ui.session_ids_like(ctx.stamp, sid, 3)
    st.error(f"no calls for session {sid!r}" + (f" — did you mean {', '.join(repr(a) for a in alts)}?" if alts else ""))
    st.stop()
tools = ui.session_tools(ctx.stamp, sid)
reuse = metrics.call_reuse(ctx, sid)

st.subheader(f"`{sid}`")
c = st.columns(6)
c[0].metric("calls", f"{calls.height:,}")
c[1].metric("instances", f"{calls['instance'].n_unique():,}")
span = calls.select(pl.col("end_s").max() - pl.col("start_s").min()).item()
c[2].metric("span", ui.secs(span))
c[3].metric("ΣP prompt (tokens)", ui.n(calls["prompt_tokens"].sum()))
c[4].metric("ΣC cached (tokens)", ui.n(calls["cached_tokens"].sum()))
c[5].metric("errors", f"{(calls['status'] == 'error').sum():,}")

table = charts.timeline_calls(calls, reuse)
st.altair_chart(charts.timeline(table, tools), width="stretch")
st.caption("Lanes: one per instance, then tool calls and idle gaps (tool execution / think time between a call's end "
           "and the next call's start). A red rule marks a call served by a different instance than the previous one. "
           "Labels show re-prefill tokens X.")

st.subheader("Calls")
table = table.with_columns(pl.col("trace_id").map_elements(lambda t: ui.link("trace", ctx, trace=t),
                                                          return_dtype=pl.String).alias("trace"))
cols = [c for c in ("trace", "call_id", "start_ts", "attempt", "branch", "instance", "model", "ttft_s", "e2e_s", "gap_before_s",
                    "prompt_tokens", "cached_tokens", "r_eff", "reprefill_tokens", "reprefill_low_tokens",
                    "reprefill_high_tokens", "hit_class", "miss_cause", "cause_evidence",
                    "output_tokens", "status", "finish_reason", "source") if c in table.columns]
ui.table(table.select(cols), column_config={
    "trace": st.column_config.LinkColumn("trace", display_text="spans ↗", width="small"),
    "start_ts": st.column_config.DatetimeColumn("start (UTC)", format="HH:mm:ss.SSS"),
    "ttft_s": st.column_config.NumberColumn("TTFT", format="%,.3g s"),
    "e2e_s": st.column_config.NumberColumn("e2e", format="%,.3g s"),
    "gap_before_s": st.column_config.NumberColumn("idle gap before", format="%,.3g s"),
    "prompt_tokens": st.column_config.NumberColumn("P", format="%,d"),
    "cached_tokens": st.column_config.NumberColumn("C", format="%,d"),
    "r_eff": st.column_config.NumberColumn("R_eff", format="%,d"),
    "reprefill_tokens": st.column_config.NumberColumn("X re-prefill", format="%,d"),
    "reprefill_low_tokens": st.column_config.NumberColumn("X low", format="%,d",
                                                         help="re-prefill with evidence of its cause (estimate mode)"),
    "reprefill_high_tokens": st.column_config.NumberColumn("X high", format="%,d",
                                                          help="every shortfall R_eff − C (estimate mode)"),
    "output_tokens": st.column_config.NumberColumn("O", format="%,d"),
})
if tools.height:
    with st.expander(f"Tool calls ({tools.height})"):
        ui.table(tools.drop("start_s", "end_s"))
