"""Running metrics by name: ``compute`` (one metric), ``compute_all`` (the suite from one preparation), the
catalogue's order and table.

The preparation (``MetricRun``: the temp tables every metric reads) is agentobs.metrics.prepare; sharing one
preparation between callers (``prepare``) is agentobs.metrics.runcache. Both are re-exported here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import polars as pl
import pyarrow as pa

from ..config import Settings
from ..errors import QueryError
from ..source import Source
from .catalog import catalogue, get_metric
from .prepare import FILTER_COLUMNS, MetricRun, parse_time
from .runcache import prepare

__all__ = [
    "FILTER_COLUMNS", "ORDER", "MetricRun", "catalogue_table", "compute", "compute_all",
    "get_metric", "names", "parse_time", "prepare",
]

ORDER = ("reuse", "reprefill", "idle_kv_rent", "turn_resume_ttft", "itl", "itl_tail", "task_cost", "turn_goodput",
         "duty_cycle", "concurrency", "throughput", "capacity", "fleet_hit_rate", "cost_model")


def names() -> list[str]:
    cat = catalogue()
    return [n for n in ORDER if n in cat] + sorted(set(cat) - set(ORDER))


def compute(name: str, db: Source, since=None, until=None, by: str | None = None, filters: dict | None = None,
            settings: Settings | None = None, clock: Callable[[], float] = time.time, exact: bool = False
            ) -> pl.DataFrame:
    """One metric as a DataFrame from the Source ``db``. ``exact``: exact percentiles where the
    rollups would read them from the hourly sketches (MetricRun.compute)."""
    metric = get_metric(name)
    if by is not None and by not in metric.by:
        raise QueryError(f"metric {name!r} cannot be grouped by {by!r}; it supports {', '.join(metric.by)}")
    run, close = prepare(db, since, until, filters, settings, clock)
    try:
        return run.compute(name, by, exact=exact)
    finally:
        close()


def compute_all(db: Source, since=None, until=None, filters: dict | None = None, settings: Settings | None = None,
                metrics: Iterable[str] | None = None, by: dict[str, str] | None = None,
                clock: Callable[[], float] = time.time, exact: bool = False) -> dict[str, pl.DataFrame]:
    """Every metric (or ``metrics``) from one preparation: the suite the bench, console and report use.
    ``by`` maps metric name → grouping (default: each metric's own); ``exact`` as in ``compute``."""
    chosen = list(metrics) if metrics is not None else names()
    for n in chosen:
        get_metric(n)
    run, close = prepare(db, since, until, filters, settings, clock)
    try:
        return {n: run.compute(n, (by or {}).get(n), exact=exact) for n in chosen}
    finally:
        close()


def catalogue_table() -> pa.Table:
    cat = catalogue()
    rows = [cat[n] for n in names()]
    return pa.table({
        "metric": [m.name for m in rows],
        "definition": [m.one_line for m in rows],
        "by": [", ".join(m.by) for m in rows],
        "section": [m.section for m in rows],
    })
