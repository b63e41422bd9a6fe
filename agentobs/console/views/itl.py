"""ITL tails: tail share with and without overlapping long prefills, p50 vs p99, offenders, retries and
re-prefills (METRICS.md §6)."""

from __future__ import annotations

import streamlit as st

from agentobs.console import ui

ctx = ui.page("ITL tails", "Inter-token gaps of streamed calls. A tail gap (above the SLO, default 100 ms, or the "
              "model's p99) is attributed to the overlapping prefill on the same instance with the most computed "
              "tokens P − C; long prefill = more than 8k tokens by default.")
df, by = ui.metric_section(ctx, "itl_tail", choose_by=True)
if df is not None and not ui.empty(df, "inter-token gaps"):
    st.dataframe(df, hide_index=True, width="stretch")
