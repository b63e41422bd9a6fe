"""Findings: the recompute-tax ledger's findings, each with its evidence, $ at stake, sessions and a copyable fix."""

from __future__ import annotations

import streamlit as st

from agentobs.console import findings, ui

ctx = ui.page("Findings", "The recompute-tax ledger (agentobs.findings): the same findings, $ and order as "
              "`agentobs findings` for this window and filters — $/week at stake first, each call's re-prefill "
              "owned by at most one finding, recoverable by simulator replay and never above the tax.")
findings.top(ctx, 1000)

with st.expander("Evidence available per instance", icon=":material/fact_check:"):
    st.caption("What a miss cause can rest on, per instance (docs/metrics.md, \"Miss causes from evidence\"): KV events "
               "with session ids show each session's removals; scrapes with preemption and token counters, with the "
               "pool size, show an eviction certain (a preemption in the gap, the gap's churn ≥ the pool) or impossible "
               "(the pool never filled since the engine started); spans alone, with the pool size, bound the churn "
               "from the calls seen. Without any, a shortfall is `unexplained`: counted in X, not in X_low, so a "
               "finding's severity (on X_low) stays low — typical of SGLang, which publishes no session ids.")
    st.dataframe(ui.instance_evidence(ctx.stamp), hide_index=True, width="stretch")
