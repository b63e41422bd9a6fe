"""kv_rent page (waiting for the metrics API)."""

from agentobs.console import metrics, ui

ctx = ui.page("kv_rent", "")
metrics.missing_metrics_notice()
