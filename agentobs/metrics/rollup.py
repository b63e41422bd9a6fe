"""Metrics read from the maintained rollups (agentobs.model.rollups) where the grain allows.

A run over the maintained state (``MetricRun.calls_table == "state"``) computes a metric from its rollup instead
of ``m_calls`` when the metric has a rollup form here, the run's window is whole hours (or open) and its filters
are on the rollup's keys; otherwise (an arbitrary window, a filter on agent or engine) it reads the per-call state
as any metric does. Same columns, same values (tests/test_model_state.py compares them).
"""

from __future__ import annotations

from importlib import resources

from ..model import rollups

# metric -> (its rollup SQL file, filter name -> the rollup's column)
_TASK_FILTERS = {"instance": "instance", "model": "model", "task_type": "task_type", "tenant": "tenant",
                 "session": "session_id", "session_id": "session_id", "task": "task_id", "task_id": "task_id"}
FORMS = {"task_cost": ("rollup_task_cost.sql", _TASK_FILTERS),
         # per session over every call: no window, no filter, grouped by session
         "duty_cycle": ("rollup_duty_cycle.sql", {})}
_WHOLE_STORE_ONLY = {"duty_cycle": ("session",)}  # metric -> the groupings its rollup serves


def form(name: str, since: float | None, until: float | None, filters: dict[str, list[str]],
         by: str) -> tuple[str, dict] | None:
    """The SQL and parameters of metric ``name`` from its rollup for this window and these filters, or None when
    it has none or they need the per-call state."""
    if name not in FORMS or not rollups.hour_aligned(since, until):
        return None
    file, columns = FORMS[name]
    if any(k not in columns for k in filters):
        return None
    if name in _WHOLE_STORE_ONLY and (since is not None or until is not None or by not in _WHOLE_STORE_ONLY[name]):
        return None
    sql = resources.files(__package__).joinpath(file).read_text()
    params: dict[str, object] = {"by": by, "h0": None if since is None else int(since // 3600),
              "h1": None if until is None else int(until // 3600)}
    preds = []
    for i, (k, values) in enumerate(sorted(filters.items())):
        preds.append(f"list_contains($f{i}, r.{columns[k]})")
        params[f"f{i}"] = values
    sql = sql.replace("{filter}", " AND ".join(preds) or "true")
    return sql, {k: v for k, v in params.items() if f"${k}" in sql}  # the parameters this form reads
