"""ITL tails: tail share with and without overlapping long prefills, p50 vs p99, offenders, retries and
re-prefills (METRICS.md §6)."""

from __future__ import annotations

import polars as pl
import streamlit as st

from agentobs.console import charts, ui

ctx = ui.page("ITL tails", "Inter-token gaps of streamed calls. A tail gap (above the SLO, default 100 ms, or the "
              "model's p99) is attributed to the overlapping prefill on the same instance with the most computed "
              "tokens P − C; long prefill = more than 8k tokens by default.")
df, by = ui.metric_section(ctx, "itl_tail", choose_by=True)
if df is not None and not ui.empty(df, "inter-token gaps"):
    group = df.columns[0]  # the grouping's column
    rows = charts.itl_long_prefill_data(df, group)
    if rows.height and by in ("instance", "model"):
        st.subheader("ITL with and without long prefills")
        st.caption(ui.md("p50 and p99 inter-token gap of all gaps, of the gaps no long prefill overlapped and of "
                         "those a long prefill on the same instance overlapped (the metric's columns; log scale). "
                         "The p50 barely moves; the damage is in the tail."))
        groups = rows["group"].unique(maintain_order=True).to_list()
        cells = st.columns(2 if len(groups) > 1 else 1)
        for i, g in enumerate(groups):
            with cells[i % len(cells)]:
                st.altair_chart(charts.itl_long_prefill(rows.filter(pl.col("group") == g),
                                                        title=f"{group}: {g}"), width="stretch")
    elif by in ("instance", "model"):
        st.caption("No per-chunk gaps in this view (coarse histogram rows only): no with/without chart.")
    ui.table(df)
