"""Turn-resume TTFT: TTFT of calls 2…n by idle-gap bucket and hit class, and the miss penalty (METRICS.md §5)."""

from __future__ import annotations

import polars as pl
import streamlit as st

from agentobs.console import charts, ui
from agentobs.output import bound_text, rel_err_column


def _bound_note(df: pl.DataFrame, col: str) -> str:
    """Where the percentiles come from the hourly sketches (whole-hour windows over the maintained state): their
    bound, as the metric states it (its ``*_rel_err`` column)."""
    err = rel_err_column(col)
    bounds = df[err].drop_nulls().unique().to_list() if err in df.columns else []
    return (f" Percentiles from the hourly TTFT sketches: each within{bound_text(bounds[0])} of the exact one."
            if len(bounds) == 1 else "")


ctx = ui.page("Turn-resume TTFT", "TTFT (first token − start) of calls 2…n of each session, by the idle gap before "
              "the call ([0,1) [1,5) [5,30) [30,120) [120,600) [600,∞) s) and hit class (hit: C ≥ R_eff − B; partial; "
              "miss: C = 0). Miss penalty = miss p50 ÷ hit p50 within a bucket.")
df, by = ui.metric_section(ctx, "turn_resume_ttft", choose_by=True)
if df is not None and not ui.empty(df, "turn-resume calls"):
    group = df.columns[0]  # the grouping's column (instance, model, task_type)
    ui.from_url("trt_stat", "stat", options=list(charts.TTFT_STATS), default="p50")
    stat = st.radio("Percentile", list(charts.TTFT_STATS), key="trt_stat", horizontal=True)
    ui.to_url("stat", stat, default="p50")
    rows = charts.ttft_by_gap_data(df)
    col = charts.TTFT_STATS[stat]
    top = rows[col].max() if rows.height else None
    y_max = float(top) if isinstance(top, (int, float)) else None
    groups = rows[group].unique(maintain_order=True).to_list()
    # one small chart per group, on one y scale: each bar is the metric's percentile over the calls of one
    # group × gap bucket × hit class (never a sum or mean over groups)
    cells = st.columns(2 if len(groups) > 1 else 1)
    for i, g in enumerate(groups):
        part = rows.filter(pl.col(group).is_null() if g is None else pl.col(group) == g)
        with cells[i % len(cells)]:
            st.altair_chart(charts.ttft_by_gap(part, stat, height=220, y_max=y_max,
                                               title=f"{group}: {g if g is not None else '(none)'}"),
                            width="stretch")
    st.caption(ui.md(f"TTFT {stat} per {group}: each bar is the percentile over that cell's calls (the metric's "
                     "row), never combined across groups. Rows with gap bucket `all` are each group's overall "
                     "figures over all its calls 2…n."
                     + _bound_note(df, col)))
    ui.table(df)
