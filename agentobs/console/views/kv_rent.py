"""KV rent and capacity: idle vs running KV per instance, rent $, break-even g* vs the gap distribution,
admission/queue pressure (METRICS.md §4, §7)."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from agentobs.console import charts, ui

ctx = ui.page("KV rent & capacity", "Rent = KV at rest K = P(prev)+O(prev) tokens × idle gap g, priced at instance "
              "$/s ÷ KV capacity (tokens) — the opportunity cost of a KV slot. g* = KV capacity ÷ prefill "
              "throughput: gaps longer than g* are cheaper to recompute than to hold.")

st.subheader("Idle-time KV rent")
rent, _ = ui.metric_section(ctx, "idle_kv_rent", choose_by=True, key="rent")
if rent is not None and not ui.empty(rent, "idle windows"):
    ui.table(rent)

st.subheader("Capacity: running vs idle KV, queue pressure")
cap, _ = ui.metric_section(ctx, "capacity", key="cap")
KV_SERIES = {"running_kv_tokens": ("running requests", "#1565c0"), "idle_kv_tokens": ("idle sessions", "#8e24aa"),
             "kv_capacity_tokens": ("KV capacity", "#616161")}
if cap is not None and not ui.empty(cap, "capacity samples"):
    cols = set(cap.columns)
    t = next((c for c in ("bucket_start", "bucket_ts", "ts") if c in cols), None)
    series = [c for c in KV_SERIES if c in cols]
    if t and series and "instance" in cols:
        long = cap.unpivot(index=[t, "instance"], on=series, variable_name="kv", value_name="tokens").with_columns(
            pl.col("kv").replace_strict({k: v[0] for k, v in KV_SERIES.items()}, default=pl.col("kv")))
        names = [KV_SERIES[s][0] for s in series]
        instances = long["instance"].unique(maintain_order=True).to_list()
        cells = st.columns(2 if len(instances) > 1 else 1)
        for i, inst in enumerate(instances):
            with cells[i % len(cells)]:
                st.altair_chart(alt.Chart(long.filter(pl.col("instance") == inst)).mark_line().encode(
                    x=alt.X(f"{t}:T", title="time (UTC)"),
                    y=alt.Y("tokens:Q", title="KV tokens", axis=alt.Axis(format=",.3~s")),
                    color=alt.Color("kv:N", title="KV held by", sort=names,
                                    scale=alt.Scale(domain=names, range=[KV_SERIES[s][1] for s in series])),
                    tooltip=[t, "instance", "kv", alt.Tooltip("tokens:Q", format=",.0f")],
                ).properties(height=200, title=inst), width="stretch")
    if "queue_length" in cols:
        q = cap["queue_length"].drop_nulls()
        if q.len() and q.abs().max() == 0:
            st.caption("Queue: no queue observed — the average queue length (`vllm:num_requests_waiting` / "
                       f"`sglang:num_queue_reqs`) was 0 in all {q.len():,} instance-buckets of this view.")
        elif q.len() and t:
            st.altair_chart(alt.Chart(cap.select(t, "instance", "queue_length")).mark_line().encode(
                x=alt.X(f"{t}:T", title="time (UTC)"),
                y=alt.Y("queue_length:Q", title="average queue length (requests)", axis=alt.Axis(format=",.3~g")),
                color=charts.instance_color(), tooltip=[t, "instance", alt.Tooltip("queue_length:Q", format=",.3~g")],
            ).properties(height=200), width="stretch")
    ui.table(cap)

st.subheader("Concurrency (time-weighted)")
conc, _ = ui.metric_section(ctx, "concurrency", key="conc")
if conc is not None and not ui.empty(conc, "calls"):
    ui.table(conc)
