"""KV rent and capacity: idle vs running KV per instance, rent $, break-even g* vs the gap distribution,
admission/queue pressure (METRICS.md §4, §7)."""

from __future__ import annotations

import altair as alt
import streamlit as st

from agentobs.console import ui

ctx = ui.page("KV rent & capacity", "Rent = KV at rest K = P(prev)+O(prev) tokens × idle gap g, priced at instance "
              "$/s ÷ KV capacity (tokens) — the opportunity cost of a KV slot. g* = KV capacity ÷ prefill "
              "throughput: gaps longer than g* are cheaper to recompute than to hold.")

st.subheader("Idle-time KV rent")
rent, _ = ui.metric_section(ctx, "idle_kv_rent", choose_by=True, key="rent")
if rent is not None and not ui.empty(rent, "idle windows"):
    st.dataframe(rent, hide_index=True, width="stretch")

st.subheader("Capacity: running vs idle KV, queue pressure")
cap, _ = ui.metric_section(ctx, "capacity", key="cap")
if cap is not None and not ui.empty(cap, "capacity samples"):
    cols = set(cap.columns)
    t = next((c for c in ("bucket_ts", "ts", "bucket_start") if c in cols), None)
    series = [c for c in ("running_kv_tokens", "idle_kv_tokens", "kv_capacity_tokens") if c in cols]
    if t and series and "instance" in cols:
        long = cap.unpivot(index=[t, "instance"], on=series, variable_name="kv", value_name="tokens")
        st.altair_chart(alt.Chart(long).mark_line().encode(
            x=alt.X(f"{t}:T", title="time (UTC)"), y=alt.Y("tokens:Q", title="KV tokens"),
            color="kv:N", strokeDash="instance:N", tooltip=[t, "instance", "kv", "tokens"]), width="stretch")
    st.dataframe(cap, hide_index=True, width="stretch")

st.subheader("Concurrency (time-weighted)")
conc, _ = ui.metric_section(ctx, "concurrency", key="conc")
if conc is not None and not ui.empty(conc, "calls"):
    st.dataframe(conc, hide_index=True, width="stretch")
