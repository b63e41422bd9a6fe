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
# model_rollup_hour and model_sketch_hour: hour × instance × model × task type × tenant (and more)
_HOUR_FILTERS = {"instance": "instance", "model": "model", "task_type": "task_type", "tenant": "tenant"}
FORMS = {"task_cost": ("rollup_task_cost.sql", _TASK_FILTERS),
         # per session over every call: no window, no filter, grouped by session
         "duty_cycle": ("rollup_duty_cycle.sql", {}),
         "reuse": ("rollup_reuse.sql", _TASK_FILTERS),
         "reprefill": ("rollup_reprefill.sql", _HOUR_FILTERS),
         "idle_kv_rent": ("rollup_idle_kv_rent.sql", _HOUR_FILTERS),
         "turn_resume_ttft": ("rollup_turn_resume_ttft.sql", _HOUR_FILTERS),
         # model_rollup_minute: buckets of whole minutes (the setting metrics_bucket_s)
         "capacity": ("rollup_capacity.sql", _HOUR_FILTERS),
         "concurrency": ("rollup_concurrency.sql", _HOUR_FILTERS)}
_WHOLE_STORE_ONLY = {"duty_cycle": ("session",)}  # metric -> the groupings its rollup serves
# metric -> the groupings its rollup serves (where it is not every grouping of the metric)
_GROUPINGS = {"reprefill": ("cause", "instance", "model", "task_type"),
              "idle_kv_rent": ("instance", "model", "task_type")}
# the forms whose percentiles come from the sketches (stated error bound): not used when exact ones are asked for
SKETCHED = frozenset({"idle_kv_rent", "turn_resume_ttft"})
_Q3 = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
# generated SQL the forms name: the sketch quantiles (agentobs.model.rollups.quantiles_sql) and the bounds
_SNIPPETS = {
    "{gap_q}": rollups.quantiles_sql("gs", ("grp",), {"p50": 0.5, "p90": 0.9}),
    "{ttft_q}": rollups.quantiles_sql("s", ("grp", "gap_lo", "hit_class"), _Q3),
    "{ttft_all_q}": rollups.quantiles_sql("s_all", ("grp",), _Q3),
    "{alpha}": f"CAST({rollups.ALPHA!r} AS DOUBLE)",
    "{ratio_err}": f"CAST({rollups.GAMMA - 1!r} AS DOUBLE)",  # a ratio of two values each within α
}


def form(name: str, since: float | None, until: float | None, filters: dict[str, list[str]],
         by: str, exact: bool = False, bucket_s: float | None = None) -> tuple[str, dict] | None:
    """The SQL and parameters of metric ``name`` from its rollup for this window and these filters, or None when
    it has none or they need the per-call state (or ``exact`` percentiles are asked of a sketched form)."""
    if name not in FORMS or not rollups.hour_aligned(since, until) or (exact and name in SKETCHED):
        return None
    file, columns = FORMS[name]
    if any(k not in columns for k in filters):
        return None
    if name in _WHOLE_STORE_ONLY and (since is not None or until is not None or by not in _WHOLE_STORE_ONLY[name]):
        return None
    if name in _GROUPINGS and by not in _GROUPINGS[name]:
        return None
    if name in ("capacity", "concurrency") and not (bucket_s and bucket_s % 60 == 0):
        return None
    sql = resources.files(__package__).joinpath(file).read_text()
    params: dict[str, object] = {"by": by, "h0": None if since is None else int(since // 3600),
              "h1": None if until is None else int(until // 3600), "since": since, "until": until,
              "bucket_s": bucket_s}
    preds = []
    for i, (k, values) in enumerate(sorted(filters.items())):
        preds.append(f"list_contains($f{i}, r.{columns[k]})")
        params[f"f{i}"] = values
    # the window's length (idle_kv_rent): the window's own when closed, else as the metric takes it from the calls
    span = ("SELECT $until - $since AS window_s" if since is not None and until is not None else
            "SELECT coalesce($until, max(end_s)) - coalesce($since, min(start_s)) AS window_s FROM m_calls WHERE in_win")
    # capacity's window bounds: the window's own, else the first start / last end of the calls it reads (per call)
    bounds = (f"""SELECT coalesce($since, min(greatest(r.start_s, coalesce($since, r.start_s)))) AS w0,
                     coalesce($until, max(least(r.end_s, coalesce($until, r.end_s)))) AS w1
              FROM model_calls r
              WHERE r.end_s > r.start_s AND ($until IS NULL OR r.start_s < $until)
                AND ($since IS NULL OR r.end_s > $since) AND {' AND '.join(preds) or 'true'}"""
              if since is None or until is None else "SELECT CAST($since AS DOUBLE) AS w0, CAST($until AS DOUBLE) AS w1")
    for k, v in {**_SNIPPETS, "{span}": span, "{bounds}": bounds}.items():
        sql = sql.replace(k, v)
    sql = sql.replace("{filter}", " AND ".join(preds) or "true")
    return sql, {k: v for k, v in params.items() if f"${k}" in sql}  # the parameters this form reads
