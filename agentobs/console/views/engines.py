"""Engines: raw engine metrics per instance (metric_samples), config highlights, fleet hit rate from counters."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from agentobs.console import charts, data, metrics, ui

ctx = ui.page("Engines", "Raw samples scraped from each engine's /metrics (vLLM `vllm:*`, SGLang `sglang:*`), "
              "per instance, in the view's time window. model: the served model name (vLLM: the model_name label "
              "of its series; SGLang: /server_info).",
              note="The instance filter applies here; the model and task type filters do not.")


def series_chart(df: pl.DataFrame, title: str, fraction: bool = False) -> alt.Chart:
    fmt = ".0%" if fraction else ",.3~g"
    top = df.group_by("instance").agg(pl.col("ts").n_unique().alias("k"))["k"].max()
    per_instance = top if isinstance(top, int) else 0  # the most scrapes of one instance
    tooltip = ["instance", "metric", "ts", alt.Tooltip("value:Q", format=fmt)]
    if per_instance <= 1:  # one snapshot per instance: a bar per instance reads better than a dot
        return alt.Chart(df).mark_bar().encode(
            x=alt.X("value:Q", title=title, axis=alt.Axis(format=fmt)), y=alt.Y("instance:N"),
            color=charts.instance_color(), tooltip=tooltip)
    # a dot per scrape only while they can be told apart: thousands of dots cost the browser seconds to draw
    line = alt.Chart(df).mark_line(point=alt.OverlayMarkDef(size=12)) if per_instance <= 60 \
        else alt.Chart(df).mark_line(strokeWidth=1.2)
    return line.encode(
        x=alt.X("ts:T", title="time (UTC)"), y=alt.Y("value:Q", title=title, axis=alt.Axis(format=fmt)),
        color=charts.instance_color(), strokeDash=alt.StrokeDash("metric:N", title="metric"), tooltip=tooltip)


ov = ui.engine_overview(ctx.stamp, ctx.filters.instance)
if not ui.empty(ov, "engine metric samples"):
    st.subheader("Instances")
    ui.table(ov, column_config={
        "kv_capacity_tokens": st.column_config.NumberColumn("KV capacity (tokens)", format="%,d"),
        "block_size": st.column_config.NumberColumn("block size (tokens)", format="%,d"),
    })

    st.subheader("Fleet prefix-cache hit rate from engine counters",
                 help="vLLM: Δprefix_cache_hits / Δprefix_cache_queries; SGLang: Δcached_tokens / Δprompt_tokens "
                      "over the window (METRICS.md §2; never `sglang:cache_hit_rate`, which is the last batch only). "
                      "A single scrape has no Δ: the rate is then empty.")
    fh = metrics.compute(ctx, "fleet_hit_rate", by="instance")
    if not ui.empty(fh, "counter samples for the fleet hit rate"):
        ui.table(fh)

    for title, names in data.ENGINE_SERIES.items():
        df = ui.engine_samples(ctx.stamp, names, ctx.filters.instance, ctx.since, ctx.until)
        st.subheader(title)
        if df.height == 0:
            st.caption(f"no samples of {', '.join(f'`{m}`' for m in names)} in this view")
            continue
        if df["value"].abs().max() == 0:  # a flat zero line says nothing: say it in words
            what = "no queue observed" if "waiting" in title else "none observed"
            st.caption(f"{what}: {', '.join(f'`{m}`' for m in df['metric'].unique().sort())} was 0 at every one "
                       f"of {df['ts'].n_unique():,} scrapes on {df['instance'].n_unique()} instance(s) in this view.")
            continue
        st.altair_chart(series_chart(df, title, fraction="fraction" in title), width="stretch")

    st.subheader("Any metric")
    names = ui.metric_names(ctx.stamp)
    ui.from_url("eng_metric", "metric", options=names)
    pick = st.selectbox("Metric", names, index=None, key="eng_metric", placeholder="choose a metric")
    ui.to_url("metric", pick)
    if pick:
        df = ui.engine_samples(ctx.stamp, [pick], ctx.filters.instance, ctx.since, ctx.until)
        st.caption("summed over label sets per instance and scrape; counters are cumulative since engine start")
        if df.height:
            st.altair_chart(series_chart(df, pick), width="stretch")
            ui.table(df)
