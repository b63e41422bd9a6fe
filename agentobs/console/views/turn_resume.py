"""turn_resume page (waiting for the metrics API)."""

from agentobs.console import metrics, ui

ctx = ui.page("turn_resume", "")
metrics.missing_metrics_notice()
