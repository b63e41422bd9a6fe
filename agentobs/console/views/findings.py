"""Findings: each with its evidence, $ at stake and a copyable fix (from agentobs.findings)."""

from __future__ import annotations

from agentobs.console import findings, ui

ctx = ui.page("Findings", "Rules over the metrics and engine config (agentobs.findings): evidence, tokens and $ per "
              "week at stake, and the exact change. Sorted by $ at stake.")
findings.top(ctx, 1000)
