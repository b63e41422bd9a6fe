"""Engines: raw engine metrics per instance (metric_samples), config highlights, fleet hit rate from counters."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from agentobs.console import data, metrics, ui

ctx = ui.page("Engines", "Raw samples scraped from each engine's /metrics (vLLM `vllm:*`, SGLang `sglang:*`), "
              "per instance, in the view's time window; instance filter applies, model/task filters do not.")

ov = ui.engine_overview(ctx.stamp, ctx.filters.instance)
if not ui.empty(ov, "engine metric samples"):
    st.subheader("Instances")
    st.dataframe(ov, hide_index=True, width="stretch", column_config={
        "kv_capacity_tokens": st.column_config.NumberColumn("KV capacity (tokens)", format="localized"),
        "block_size": st.column_config.NumberColumn("block size (tokens)"),
    })

    st.subheader("Fleet prefix-cache hit rate from engine counters")
    fh = metrics.compute(ctx, "fleet_hit_rate", by="instance")
    if ui.empty(fh, "counter samples for the fleet hit rate"):
        pass
    else:
        st.caption("vLLM: Δprefix_cache_hits / Δprefix_cache_queries; SGLang: Δcached_tokens / Δprompt_tokens "
                   "over the window (METRICS.md §2; never `sglang:cache_hit_rate`, which is the last batch only). "
                   "A single scrape has no Δ: the rate is then empty.")
        st.dataframe(fh, hide_index=True, width="stretch")

    for title, names in data.ENGINE_SERIES.items():
        df = ui.engine_samples(ctx.stamp, names, ctx.filters.instance, ctx.since, ctx.until)
        st.subheader(title)
        if df.height == 0:
            st.caption(f"no samples of {', '.join(f'`{m}`' for m in names)} in this view")
            continue
        scrapes = df.group_by("instance").agg(pl.col("ts").n_unique().alias("k"))
        if scrapes["k"].max() <= 1:  # one snapshot per instance: a bar per instance reads better than a dot
            chart = alt.Chart(df).mark_bar().encode(
                x=alt.X("value:Q", title=title), y=alt.Y("instance:N"), color="metric:N",
                tooltip=["instance", "metric", "ts", "value"])
        else:
            chart = alt.Chart(df).mark_line(point=True).encode(
                x=alt.X("ts:T", title="time (UTC)"), y=alt.Y("value:Q", title=title),
                color="instance:N", strokeDash="metric:N", tooltip=["instance", "metric", "ts", "value"])
        st.altair_chart(chart, width="stretch")

    st.subheader("Any metric")
    names = ui.metric_names(ctx.stamp)
    pick = st.selectbox("Metric", names, index=None, key="eng_metric", placeholder="choose a metric")
    if pick:
        df = ui.engine_samples(ctx.stamp, [pick], ctx.filters.instance, ctx.since, ctx.until)
        st.caption("summed over label sets per instance and scrape; counters are cumulative since engine start")
        if df.height:
            st.altair_chart(alt.Chart(df).mark_line(point=True).encode(
                x=alt.X("ts:T", title="time (UTC)"), y=alt.Y("value:Q", title=pick), color="instance:N",
                tooltip=["instance", "ts", "value"]), width="stretch")
            st.dataframe(df, hide_index=True, width="stretch")
