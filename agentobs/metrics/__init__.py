"""Agent metrics (METRICS.md) as tested SQL: one ``.sql`` file per metric under ``defs/``.

    from agentobs.metrics import compute, compute_all
    from agentobs.source import as_source
    src = as_source("agentobs.duckdb")     # a Source, made once at the edge (a path or an open connection)
    df = compute("reuse", src, since="24h", by="task_type")
    suite = compute_all(src)               # every metric from one preparation

See docs/metrics.md for the catalogue, formulas, assumptions and the cost model.
"""

from __future__ import annotations

from .catalog import Metric, catalogue, parse_metric
from .run import (
    FILTER_COLUMNS,
    MetricRun,
    catalogue_table,
    compute,
    compute_all,
    get_metric,
    names,
    parse_time,
    prepare,
)

__all__ = [
    "FILTER_COLUMNS", "Metric", "MetricRun", "catalogue", "catalogue_table", "compute", "compute_all", "get_metric",
    "names", "parse_metric", "parse_time", "prepare",
]
