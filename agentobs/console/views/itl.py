"""itl page (waiting for the metrics API)."""

from agentobs.console import metrics, ui

ctx = ui.page("itl", "")
metrics.missing_metrics_notice()
