"""The console's reads: plain SQL over the normalized views and raw tables, on read-only connections.

No METRICS.md number is computed here — those come from ``agentobs.metrics`` (see ``metrics.py``).
What is here are listings (sessions, calls, tool calls), filter options and raw engine samples.

Two backends, one SQL text. Every function takes a ``stamp`` as its first argument, so ``st.cache_data``
keys each result by the data's state + the filter values:

- DuckDB (``db_stamp(path)``): ``("duckdb", path, size, mtime, WAL mtime)``; a store that grows
  invalidates the cache by itself. Each read opens a read-only connection and closes it at once, so
  collectors can still write.
- ClickHouse (``ch_stamp(url)``): ``("clickhouse", url, parts)`` where ``parts`` is, per table the model
  reads (``spans``, ``metric_samples`` and the side tables), its row count and highest block number
  among the active data parts (``system.parts``: metadata, no data read). Every insert makes a new
  part with a higher block number; merges keep both, so only new data changes the stamp. Reads go
  through one process-wide connection per URL (``clickhouse(url)``): chDB holds one database path
  per process, and Streamlit serves every browser session from one process.

The SQL is written once in DuckDB's dialect with named parameters (``$since``, ``$f_model``, …); on
ClickHouse it is transpiled by agentobs.backends.clickhouse (the ``ClickHouseCursor`` the metric run
uses). Times are compared as epoch seconds (``start_s``), as the metrics API does. Values are always
bound as parameters, never spliced into SQL text.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from pathlib import Path

import duckdb
import polars as pl

from ..redact import mask_url
from ..store.db import connect
from .filters import Filters

Stamp = tuple
CH_TABLES = ("spans", "metric_samples", "agentobs_engine_config", "agentobs_kv_events")


def db_stamp(db: str | os.PathLike) -> Stamp:
    p = Path(db)
    st = p.stat()
    wal = Path(str(p) + ".wal")
    wal_m = wal.stat().st_mtime_ns if wal.exists() else 0
    return ("duckdb", str(p.resolve()), st.st_size, st.st_mtime_ns, wal_m)


_CH: dict[str, object] = {}
_CH_LOCK = threading.Lock()


def clickhouse(url: str):
    """The process-wide ClickHouse connection for ``url`` (opened on first use, kept open)."""
    with _CH_LOCK:
        ch = _CH.get(url)
        if ch is None:
            from ..backends.clickhouse.conn import ClickHouse

            ch = _CH[url] = ClickHouse(url)
        return ch


def close_clickhouse(url: str | None = None) -> None:
    """Close the shared connection(s) (tests; a process that moves to another chDB path)."""
    with _CH_LOCK:
        for u in [url] if url is not None else list(_CH):
            ch = _CH.pop(u, None)
            if ch is not None:
                ch.close()


def ch_stamp(url: str) -> Stamp:
    t = clickhouse(url).arrow(
        "SELECT table, toInt64(sum(rows)) AS n, toInt64(max(max_block_number)) AS b FROM system.parts "
        "WHERE database = currentDatabase() AND active AND has({tables:Array(String)}, table) "
        "GROUP BY table ORDER BY table", {"tables": list(CH_TABLES)})
    return ("clickhouse", url, tuple(zip(*(c.to_pylist() for c in t.columns), strict=True)))


def is_clickhouse(stamp: Stamp) -> bool:
    return stamp[0] == "clickhouse"


def source(stamp: Stamp):
    """What agentobs.metrics.prepare / agentobs.findings.run take as ``db``: the store path, or the shared
    ClickHouse connection."""
    return clickhouse(stamp[1]) if is_clickhouse(stamp) else stamp[1]


def label(stamp: Stamp) -> str:
    """The source as shown to users (a ClickHouse URL without its password)."""
    return mask_url(stamp[1])


def open_ro(stamp: Stamp) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection, opened per query and closed at once so collectors can still write."""
    return connect(stamp[1], read_only=True)


def query(stamp: Stamp, sql: str, params: dict | None = None) -> pl.DataFrame:
    """One statement (DuckDB SQL, named ``$parameters``) on the stamp's backend, as a DataFrame."""
    if is_clickhouse(stamp):
        from ..backends.clickhouse.metrics import ClickHouseCursor

        return ClickHouseCursor(clickhouse(stamp[1])).sql(sql, params or {}).pl()
    con = open_ro(stamp)
    try:
        return con.sql(sql, params=params or {}).pl()
    finally:
        con.close()


def epoch(t: dt.datetime | None) -> float | None:
    """A naive-UTC datetime as epoch seconds (the form the views' ``start_s`` / the metrics API use)."""
    return None if t is None else t.replace(tzinfo=dt.UTC).timestamp()


# -- filters -----------------------------------------------------------------------------------------
def bounds(stamp: Stamp) -> tuple[dt.datetime | None, dt.datetime | None]:
    """First start and last end of any model call (gateway or engine span)."""
    df = query(stamp, """SELECT make_timestamp(min(start_ns) // 1000) AS lo, make_timestamp(max(end_ns) // 1000) AS hi
                         FROM spans WHERE role IN ('gateway', 'engine')""")
    return df["lo"][0], df["hi"][0]


OPTIONS_SQL = {
    "instance": """SELECT instance FROM (
                       SELECT instance FROM spans WHERE instance IS NOT NULL AND role IN ('gateway', 'engine')
                       UNION SELECT instance FROM metric_samples) ORDER BY 1""",
    "model": "SELECT DISTINCT model FROM spans WHERE model IS NOT NULL AND role IN ('gateway', 'engine') ORDER BY 1",
    "task_type": "SELECT DISTINCT task_type FROM spans WHERE task_type IS NOT NULL ORDER BY 1",
}


def options(stamp: Stamp) -> dict[str, list[str]]:
    """Values offered by the instance / model / task type filters (read from the raw tables: cheap). On DuckDB the
    three lists are read on one connection (an open is not free, and this runs on every page's first render)."""
    if is_clickhouse(stamp):
        frames = {k: query(stamp, sql) for k, sql in OPTIONS_SQL.items()}
    else:
        con = open_ro(stamp)
        try:
            frames = {k: con.sql(sql).pl() for k, sql in OPTIONS_SQL.items()}
        finally:
            con.close()
    return {k: df[df.columns[0]].to_list() for k, df in frames.items()}


def call_where(f: Filters, since: dt.datetime | None, until: dt.datetime | None, alias: str = "c"
               ) -> tuple[str, dict]:
    """WHERE clause over llm_calls for the global filters (fixed SQL text, values as parameters)."""
    parts, params = ["TRUE"], {}
    if since is not None:
        parts.append(f"{alias}.start_s >= $since")
        params["since"] = epoch(since)
    if until is not None:
        parts.append(f"{alias}.start_s < $until")
        params["until"] = epoch(until)
    for key in ("instance", "model", "task_type"):
        vals = getattr(f, key)
        if vals:
            parts.append(f"list_contains($f_{key}, {alias}.{key})")
            params[f"f_{key}"] = list(vals)
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
        where += " AND contains(lower(c.session_id), lower($search))"
        params["search"] = search
    order = SORTS.get(sort, SORTS["newest"])
    sql = f"""
        SELECT c.session_id,
               arg_min(c.task_id, c.start_s) AS task_id,
               arg_min(c.task_type, c.start_s) FILTER (WHERE c.task_type IS NOT NULL) AS task_type,
               arg_min(c.tenant, c.start_s) FILTER (WHERE c.tenant IS NOT NULL) AS tenant,
               count(*) AS calls,
               count(*) FILTER (WHERE c.attempt > 1) AS retries,
               count(DISTINCT c.instance) AS instances,
               string_agg(DISTINCT c.model, ', ' ORDER BY c.model) AS models,
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
        LIMIT $n_rows"""
    return query(stamp, sql, {**params, "n_rows": int(limit)})


def session_calls(stamp: Stamp, session_id: str) -> pl.DataFrame:
    return query(stamp, """
        SELECT c.call_id, c.trace_id, c.start_ts, c.end_ts, c.start_s, c.end_s, c.attempt, c.branch, c.instance,
               c.model, c.ttft_s, c.e2e_s, g.gap_s AS gap_before_s, g.prev_instance,
               c.prompt_tokens, c.cached_tokens, c.output_tokens, c.status, c.finish_reason, c.error_type, c.source
        FROM llm_calls c
        LEFT JOIN turn_gaps g ON g.call_id = c.call_id
        WHERE c.session_id = $sid
        ORDER BY c.start_s, c.call_id""", {"sid": session_id})


def session_tools(stamp: Stamp, session_id: str) -> pl.DataFrame:
    return query(stamp, """SELECT tool_name, start_ts, end_ts, start_s, end_s, duration_s, status
                           FROM tool_calls WHERE session_id = $sid ORDER BY start_s""", {"sid": session_id})


def session_ids_like(stamp: Stamp, text: str, limit: int = 5) -> list[str]:
    df = query(stamp, """SELECT session_id FROM (SELECT DISTINCT session_id FROM spans WHERE session_id IS NOT NULL)
                         ORDER BY jaro_winkler_similarity(session_id, $near) DESC, session_id LIMIT $n_rows""",
               {"near": text, "n_rows": int(limit)})
    return df["session_id"].to_list()


def task_calls(stamp: Stamp, task_id: str) -> pl.DataFrame:
    return query(stamp, """
        SELECT c.call_id, c.session_id, c.start_ts, c.attempt, c.branch, c.instance, c.model, c.ttft_s, c.e2e_s,
               c.prompt_tokens, c.cached_tokens, c.output_tokens, c.status, c.error_type
        FROM llm_calls c WHERE c.task_id = $tid ORDER BY c.start_s, c.call_id""", {"tid": task_id})


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
    parts, params = ["list_contains($metrics, metric)"], {"metrics": list(metrics)}
    if instances:
        parts.append("list_contains($instances, instance)")
        params["instances"] = list(instances)
    if since is not None:
        parts.append("ts >= make_timestamp(CAST($since * 1e6 AS BIGINT))")
        params["since"] = epoch(since)
    if until is not None:
        parts.append("ts < make_timestamp(CAST($until * 1e6 AS BIGINT))")
        params["until"] = epoch(until)
    return query(stamp, f"""SELECT ts, instance, metric, any_value(engine) AS engine, sum(value) AS value
                            FROM metric_samples WHERE {' AND '.join(parts)}
                            GROUP BY ts, instance, metric ORDER BY ts, instance, metric""", params)


def engine_overview(stamp: Stamp, instances: tuple[str, ...]) -> pl.DataFrame:
    """One row per instance: engine, config highlights, first/last sample, number of series."""
    params, where = {}, "TRUE"
    if instances:
        where, params = "list_contains($instances, m.instance)", {"instances": list(instances)}
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
    """Tables and views users may query, with their columns (hidden helper views start with '_').
    On ClickHouse: the model's views and tables of the connection's database (not the materialized views
    that feed them, nor a metric run's ``agentobs_run_*`` tables)."""
    if is_clickhouse(stamp):
        t = clickhouse(stamp[1]).arrow("""
            SELECT c.table AS name, if(t.engine = 'View', 'view', 'base table') AS kind, c.name AS column,
                   c.type AS type, toInt64(c.position) AS pos
            FROM system.columns c
            JOIN system.tables t ON t.database = c.database AND t.name = c.table
            WHERE c.database = currentDatabase() AND t.engine NOT IN ('MaterializedView')
              AND NOT startsWith(c.table, 'agentobs_run_') AND NOT startsWith(c.table, '.')
              AND NOT startsWith(c.table, '_')
            ORDER BY kind, name, pos""")
        return pl.from_arrow(t)
    return query(stamp, """
        SELECT t.table_name AS name, lower(t.table_type) AS kind, c.column_name AS column, c.data_type AS type,
               c.ordinal_position AS pos
        FROM information_schema.tables t
        JOIN information_schema.columns c USING (table_schema, table_name)
        WHERE t.table_schema = 'main' AND NOT starts_with(t.table_name, '_') AND t.table_name <> 'schema_migrations'
        ORDER BY kind, name, pos""")
