"""Metrics read from the maintained rollups (agentobs.model.rollups) where the grain allows.

A run over the maintained state (``MetricRun.calls_table == "state"``) computes a metric from its rollup instead
of ``m_calls`` when the metric has a rollup form here, the run's window is whole hours (or open) and its filters
are on the rollup's keys; otherwise (an arbitrary window, a filter on agent or engine) it reads the per-call state
as any metric does. Same columns, same values (tests/test_model_state.py compares them).

One definition: a rollup form is only the source part (its rollup file: the relations of partial sums the metric's
final part reads, from the rollups and sketches) put before the final part of the metric's own definition
(defs/<name>.sql, from its ``-- final:`` line on). The sketch forms state each percentile's bound in a column beside
it (``_BOUNDS``).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from ..model import rollups
from .catalog import get_metric

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
# the line that starts a definition's final part (the part its rollup form shares)
FINAL = "\n-- final:"
# per sketched form: each column of the final SELECT it reads from a sketch (a line of its own there) -> its bound,
# stated beside it as <column less _s>_rel_err
_BOUNDS = {"idle_kv_rent": {"a.gap_p50_s": "{alpha}", "a.gap_p90_s": "{alpha}"},
           "turn_resume_ttft": {"ttft_p50_s": "{alpha}", "ttft_p90_s": "{alpha}", "ttft_p99_s": "{alpha}",
                                "miss_penalty": "{ratio_err}"}}
_Q3 = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
# generated SQL the forms name: the sketch quantiles (agentobs.model.rollups.quantiles_sql) and the bounds
_SNIPPETS = {
    "{gap_q}": rollups.quantiles_sql("gs", ("grp",), {"p50": 0.5, "p90": 0.9}),
    "{ttft_q}": rollups.quantiles_sql("s", ("grp", "gap_lo", "hit_class"), _Q3),
    "{ttft_all_q}": rollups.quantiles_sql("s_all", ("grp",), _Q3),
    "{alpha}": f"CAST({rollups.ALPHA!r} AS DOUBLE)",
    "{ratio_err}": f"CAST({rollups.GAMMA - 1!r} AS DOUBLE)",  # a ratio of two values each within α
}


@cache
def form_text(name: str) -> str:
    """The SQL text of metric ``name``'s rollup form before its parameters and snippets are put in: the rollup file
    (the source part), then the final part of the metric's definition (with the sketch bounds)."""
    text = resources.files(__package__).joinpath(FORMS[name][0]).read_text()
    _, sep, final = get_metric(name).sql.partition(FINAL)
    if not sep:
        raise RuntimeError(f"defs/{name}.sql has no {FINAL.strip()!r} line: its rollup form has no final part")
    sql = text.rstrip() + sep + final
    for col, bound in _BOUNDS.get(name, {}).items():
        err = col.rpartition(".")[2].removesuffix("_s") + "_rel_err"
        beside = f"{col}, CASE WHEN {col} IS NOT NULL THEN {bound} END AS {err}"
        sql, n = re.subn(rf"(?m)^(\s+){re.escape(col)}(,?)$", rf"\g<1>{beside}\g<2>", sql)
        if n != 1:
            raise RuntimeError(f"defs/{name}.sql: the final SELECT has {n} lines of {col!r} (one wanted)")
    return sql


def form(name: str, since: float | None, until: float | None, filters: dict[str, list[str]],
         by: str, exact: bool = False, bucket_s: float | None = None) -> tuple[str, dict] | None:
    """The SQL and parameters of metric ``name`` from its rollup for this window and these filters, or None when
    it has none or they need the per-call state (or ``exact`` percentiles are asked of a sketched form)."""
    if name not in FORMS or not rollups.hour_aligned(since, until) or (exact and name in SKETCHED):
        return None
    columns = FORMS[name][1]
    if any(k not in columns for k in filters):
        return None
    if name in _WHOLE_STORE_ONLY and (since is not None or until is not None or by not in _WHOLE_STORE_ONLY[name]):
        return None
    if name in _GROUPINGS and by not in _GROUPINGS[name]:
        return None
    if name in ("capacity", "concurrency") and not (bucket_s and bucket_s % 60 == 0):
        return None
    sql = form_text(name)
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
