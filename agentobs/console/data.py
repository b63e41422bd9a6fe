"""The console's reads: plain SQL over the normalized views and raw tables, on read-only connections.

No METRICS.md number is computed here — those come from ``agentobs.metrics`` (see ``metrics.py``).
What is here are listings (sessions, calls, tool calls), filter options and raw engine samples.

Every function takes a ``stamp`` (``db_stamp(path)``: path, size and mtimes of the file and its WAL)
as its first argument, so ``st.cache_data`` keys each result by database + modification time + the
filter values, and a store that grows invalidates the cache by itself. Values are always bound as
parameters, never spliced into SQL text.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import duckdb
import polars as pl

from ..store.db import connect
from .filters import Filters

Stamp = tuple[str, int, int, int]


def db_stamp(db: str | os.PathLike) -> Stamp:
    p = Path(db)
    st = p.stat()
    wal = Path(str(p) + ".wal")
    wal_m = wal.stat().st_mtime_ns if wal.exists() else 0
    return (str(p.resolve()), st.st_size, st.st_mtime_ns, wal_m)


def open_ro(stamp: Stamp) -> duckdb.DuckDBPyConnection:
    """A read-only connection, opened per query and closed at once so collectors can still write."""
    return connect(stamp[0], read_only=True)


def query(stamp: Stamp, sql: str, params: list | None = None) -> pl.DataFrame:
    con = open_ro(stamp)
    try:
        return con.sql(sql, params=params or []).pl()
    finally:
        con.close()


# -- filters -----------------------------------------------------------------------------------------
def bounds(stamp: Stamp) -> tuple[dt.datetime | None, dt.datetime | None]:
    """First start and last end of any model call (gateway or engine span)."""
    df = query(stamp, """SELECT make_timestamp(min(start_ns) // 1000) AS lo, make_timestamp(max(end_ns) // 1000) AS hi
                         FROM spans WHERE role IN ('gateway', 'engine')""")
    return df["lo"][0], df["hi"][0]


def options(stamp: Stamp) -> dict[str, list[str]]:
    """Values offered by the instance / model / task type filters (read from the raw tables: cheap)."""
    con = open_ro(stamp)
    try:
        def col(sql):
            return [r[0] for r in con.execute(sql).fetchall()]

        return {
            "instance": col("""SELECT instance FROM spans WHERE instance IS NOT NULL AND role IN ('gateway', 'engine')
                               UNION SELECT instance FROM metric_samples ORDER BY 1"""),
            "model": col("SELECT DISTINCT model FROM spans WHERE model IS NOT NULL AND role IN ('gateway', 'engine') ORDER BY 1"),
            "task_type": col("SELECT DISTINCT task_type FROM spans WHERE task_type IS NOT NULL ORDER BY 1"),
        }
    finally:
        con.close()


def call_where(f: Filters, since: dt.datetime | None, until: dt.datetime | None, alias: str = "c"
               ) -> tuple[str, list]:
    """WHERE clause over llm_calls for the global filters (fixed SQL text, values as parameters)."""
    parts, params = ["TRUE"], []
    if since is not None:
        parts.append(f"{alias}.start_ts >= ?")
        params.append(since)
    if until is not None:
        parts.append(f"{alias}.start_ts < ?")
        params.append(until)
    for key in ("instance", "model", "task_type"):
        vals = getattr(f, key)
        if vals:
            parts.append(f"list_contains(?::VARCHAR[], {alias}.{key})")
            params.append(list(vals))
    return " AND ".join(parts), params


# -- sessions ----------------------------------------------------------------------------------------
SORTS = {
    "newest": "first_start DESC",
    "most calls": "calls DESC, first_start DESC",
    "most prompt tokens": "prompt_tokens DESC NULLS LAST",
    "most errors": "errors DESC, first_start DESC",
    "longest": "span_s DESC NULLS LAST",
}


def sessions(stamp: Stamp, f: Filters, since, until, search: str = "", sort: str = "newest",
             limit: int = 500) -> pl.DataFrame:
    """Sessions with at least one call matching the filters, aggregated over those calls."""
    where, params = call_where(f, since, until)
    if search:
        where += " AND contains(lower(c.session_id), lower(?))"
        params.append(search)
    order = SORTS.get(sort, SORTS["newest"])
    sql = f"""
        SELECT c.session_id,
               arg_min(c.task_id, c.start_s) AS task_id,
               arg_min(c.task_type, c.start_s) FILTER (WHERE c.task_type IS NOT NULL) AS task_type,
               arg_min(c.tenant, c.start_s) FILTER (WHERE c.tenant IS NOT NULL) AS tenant,
               count(*) AS calls,
               count(*) FILTER (WHERE c.attempt > 1) AS retries,
               count(DISTINCT c.instance) AS instances,
               string_agg(DISTINCT c.model, ', ') AS models,
               min(c.start_ts) AS first_start,
               max(c.end_s) - min(c.start_s) AS span_s,
               sum(c.prompt_tokens) AS prompt_tokens,
               sum(c.cached_tokens) AS cached_tokens,
               sum(c.output_tokens) AS output_tokens,
               count(*) FILTER (WHERE c.status = 'error') AS errors
        FROM llm_calls c
        WHERE c.session_id IS NOT NULL AND {where}
        GROUP BY c.session_id
        ORDER BY {order}
        LIMIT ?"""
    return query(stamp, sql, [*params, limit])


def session_calls(stamp: Stamp, session_id: str) -> pl.DataFrame:
    return query(stamp, """
        SELECT c.call_id, c.start_ts, c.end_ts, c.start_s, c.end_s, c.attempt, c.branch, c.instance, c.model,
               c.ttft_s, c.e2e_s, g.gap_s AS gap_before_s, g.prev_instance,
               c.prompt_tokens, c.cached_tokens, c.output_tokens, c.status, c.finish_reason, c.error_type, c.source
        FROM llm_calls c
        LEFT JOIN turn_gaps g ON g.call_id = c.call_id
        WHERE c.session_id = ?
        ORDER BY c.start_s, c.call_id""", [session_id])


def session_tools(stamp: Stamp, session_id: str) -> pl.DataFrame:
    return query(stamp, """SELECT tool_name, start_ts, end_ts, start_s, end_s, duration_s, status
                           FROM tool_calls WHERE session_id = ? ORDER BY start_s""", [session_id])


def session_ids_like(stamp: Stamp, text: str, limit: int = 5) -> list[str]:
    df = query(stamp, """SELECT session_id FROM (SELECT DISTINCT session_id FROM spans WHERE session_id IS NOT NULL)
                         ORDER BY jaro_winkler_similarity(session_id, ?) DESC LIMIT ?""", [text, limit])
    return df["session_id"].to_list()


def task_calls(stamp: Stamp, task_id: str) -> pl.DataFrame:
    return query(stamp, """
        SELECT c.call_id, c.session_id, c.start_ts, c.attempt, c.branch, c.instance, c.model, c.ttft_s, c.e2e_s,
               c.prompt_tokens, c.cached_tokens, c.output_tokens, c.status, c.error_type
        FROM llm_calls c WHERE c.task_id = ? ORDER BY c.start_s""", [task_id])


# -- engines -----------------------------------------------------------------------------------------
# Raw engine gauges/counters worth a chart, in the colon form the store keeps (first present wins per engine).
ENGINE_SERIES = {
    "KV cache usage (fraction of KV capacity)": ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                                                 "sglang:token_usage"],
    "requests waiting (queue length)": ["vllm:num_requests_waiting", "sglang:num_queue_reqs"],
    "requests running": ["vllm:num_requests_running", "sglang:num_running_reqs"],
    "preemptions / retractions (counter, cumulative)": ["vllm:num_preemptions_total",
                                                        "sglang:num_retracted_requests_total"],
}


def engine_samples(stamp: Stamp, metrics: list[str], instances: tuple[str, ...], since, until) -> pl.DataFrame:
    """Samples of the given metrics, summed over label sets per (instance, metric, ts)."""
    parts, params = ["list_contains(?::VARCHAR[], metric)"], [metrics]
    if instances:
        parts.append("list_contains(?::VARCHAR[], instance)")
        params.append(list(instances))
    if since is not None:
        parts.append("ts >= ?")
        params.append(since)
    if until is not None:
        parts.append("ts < ?")
        params.append(until)
    return query(stamp, f"""SELECT ts, instance, metric, any_value(engine) AS engine, sum(value) AS value
                            FROM metric_samples WHERE {' AND '.join(parts)}
                            GROUP BY ts, instance, metric ORDER BY ts""", params)


def engine_overview(stamp: Stamp, instances: tuple[str, ...]) -> pl.DataFrame:
    """One row per instance: engine, config highlights, first/last sample, number of series."""
    params, where = [], "TRUE"
    if instances:
        where, params = "list_contains(?::VARCHAR[], m.instance)", [list(instances)]
    return query(stamp, f"""
        SELECT m.instance, any_value(m.engine) AS engine, min(m.ts) AS first_sample, max(m.ts) AS last_sample,
               count(DISTINCT m.ts) AS scrapes, count(DISTINCT m.metric) AS metrics,
               any_value(ic.model) AS model, any_value(ic.block_size) AS block_size,
               any_value(ic.kv_capacity_tokens) AS kv_capacity_tokens, any_value(ic.prefix_caching) AS prefix_caching,
               any_value(ic.hicache) AS hicache, any_value(ic.schedule_policy) AS schedule_policy
        FROM metric_samples m LEFT JOIN instance_config ic ON ic.instance = m.instance
        WHERE {where}
        GROUP BY m.instance ORDER BY m.instance""", params)


def metric_names(stamp: Stamp) -> list[str]:
    return query(stamp, "SELECT DISTINCT metric FROM metric_samples ORDER BY 1")["metric"].to_list()


# -- SQL page ----------------------------------------------------------------------------------------
def schema(stamp: Stamp) -> pl.DataFrame:
    """Tables and views users may query, with their columns (hidden helper views start with '_')."""
    return query(stamp, """
        SELECT t.table_name AS name, lower(t.table_type) AS kind, c.column_name AS column, c.data_type AS type,
               c.ordinal_position AS pos
        FROM information_schema.tables t
        JOIN information_schema.columns c USING (table_schema, table_name)
        WHERE t.table_schema = 'main' AND NOT starts_with(t.table_name, '_') AND t.table_name <> 'schema_migrations'
        ORDER BY kind, name, pos""")
