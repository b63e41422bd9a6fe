"""Findings: the recompute-tax ledger's findings, each with its evidence, $ at stake, sessions and a copyable fix."""

from __future__ import annotations

from agentobs.console import findings, ui

ctx = ui.page("Findings", "The recompute-tax ledger (agentobs.findings): the same findings, $ and order as "
              "`agentobs findings` for this window and filters — $/week at stake first, each call's re-prefill "
              "owned by at most one finding, recoverable by simulator replay and never above the tax.")
findings.top(ctx, 1000)
