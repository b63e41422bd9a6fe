"""Findings: each with its evidence, $ at stake and a copyable fix (from agentobs.findings)."""

from __future__ import annotations

from agentobs.console import findings, ui

ctx = ui.page("Findings", "Rules over the metrics and engine config (agentobs.findings): evidence, tokens and $ per "
              "week at stake, and the exact change. Sorted by $ at stake.")
import streamlit as st  # noqa: E402

simulate = st.toggle("Estimate the recoverable tax by replaying sessions through the simulator (slower)",
                     value=False, help="Off: the analytical estimate (an upper bound); on: agentobs.sim replays up to "
                                       "`findings_sim_sessions` observed sessions with each fix applied.")
findings.top(ctx, 1000, simulate=simulate)
