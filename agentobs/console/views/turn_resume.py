"""Turn-resume TTFT: TTFT of calls 2…n by idle-gap bucket and hit class, and the miss penalty (METRICS.md §5)."""

from __future__ import annotations

import altair as alt
import streamlit as st

from agentobs.console import ui

ctx = ui.page("Turn-resume TTFT", "TTFT (first token − start) of calls 2…n of each session, by the idle gap before "
              "the call ([0,1) [1,5) [5,30) [30,120) [120,600) [600,∞) s) and hit class (hit: C ≥ R_eff − B). "
              "Miss penalty = miss p50 ÷ hit p50 within a bucket.")
df, by = ui.metric_section(ctx, "turn_resume_ttft", choose_by=True)
if df is not None and not ui.empty(df, "turn-resume calls"):
    cols = set(df.columns)
    gap = next((c for c in ("gap_bucket", "bucket") if c in cols), None)
    cls = next((c for c in ("hit_class", "class") if c in cols), None)
    p50 = next((c for c in ("ttft_p50_s", "p50_s") if c in cols), None)
    if gap and cls and p50:
        st.altair_chart(alt.Chart(df).mark_bar().encode(
            x=alt.X(f"{gap}:N", title="idle gap before the call (s)", sort=None),
            xOffset=f"{cls}:N", y=alt.Y(f"{p50}:Q", title="TTFT p50 (s)"),
            color=alt.Color(f"{cls}:N", title="hit class"),
            tooltip=list(df.columns)), width="stretch")
    st.dataframe(df, hide_index=True, width="stretch")
