"""The console's reads: plain SQL over the normalized views and raw tables, on read-only connections.

No METRICS.md number is computed here — those come from ``agentobs.metrics`` (see ``metrics.py``).
What is here are listings (sessions, calls, tool calls), filter options and raw engine samples.

Two backends, one SQL text. Every function takes a ``stamp`` as its first argument, so ``st.cache_data``
keys each result by the data's state + the filter values:

- DuckDB (``db_stamp(path)``): ``("duckdb", path, size, mtime, WAL size, WAL mtime)``; a store that grows
  invalidates the cache by itself. Each read opens a read-only connection and closes it at once, so
  collectors can still write.
- ClickHouse (``ch_stamp(url)``): ``("clickhouse", url, parts)`` where ``parts`` is, per table the model
  reads (``spans``, ``metric_samples`` and the side tables), its row count and highest block number
  among the active data parts (``system.parts``: metadata, no data read). Every insert makes a new
  part with a higher block number; merges keep both, so only new data changes the stamp. Reads go
  through one process-wide connection per URL (agentobs.source.shared_clickhouse): chDB holds one database
  path per process, and Streamlit serves every browser session from one process.

Each stamp is taken of an agentobs.source Source and names it (``source(stamp)``); every read goes through it.

The SQL is written once in DuckDB's dialect with named parameters (``$since``, ``$f_model``, …); on
ClickHouse it is transpiled by agentobs.backends.clickhouse (the ``ClickHouseCursor`` the metric run
uses). Times are compared as epoch seconds (``start_s``), as the metrics API does. Values are always
bound as parameters, never spliced into SQL text.
"""

from __future__ import annotations

import datetime as dt
import os
import threading

import polars as pl

from ..redact import mask_url
from ..source import DuckDBSource, Source, close_shared, from_stamp, queries, shared_clickhouse
from ..source import query as _query
from .filters import Filters

Stamp = tuple


def db_stamp(db: str | os.PathLike) -> Stamp:
    """The stamp of a DuckDB store file (FileNotFoundError when there is none)."""
    stamp = DuckDBSource(db).stamp()
    if stamp is None:
        raise FileNotFoundError(str(db))
    return stamp


def clickhouse(url: str):
    """The process-wide ClickHouse connection for ``url`` (agentobs.source.shared_clickhouse)."""
    return shared_clickhouse(url).ch


def close_clickhouse(url: str | None = None) -> None:
    """Close the shared connection(s) (tests; a process that moves to another chDB path)."""
    close_shared(url)


def ch_stamp(url: str) -> Stamp:
    return shared_clickhouse(url).stamp()


# The console is the edge that makes its Sources: one per store file for the process (a DuckDBSource holds no
# connection), so a page's metrics and findings handed it share one preparation (agentobs.metrics.runcache keeps
# the shared runs on the Source). ClickHouse sources are the process-wide ones of agentobs.source already.
_DUCKDB_SOURCES: dict[str, Source] = {}
_DUCKDB_SOURCES_LOCK = threading.Lock()


def source(stamp: Stamp) -> Source:
    """The Source of a stamp (what agentobs.metrics.prepare / agentobs.findings.build read)."""
    if stamp[0] != DuckDBSource.dialect:
        return from_stamp(stamp)
    with _DUCKDB_SOURCES_LOCK:
        src = _DUCKDB_SOURCES.get(stamp[1])
        if src is None:
            src = _DUCKDB_SOURCES[stamp[1]] = from_stamp(stamp)
        return src


def label(stamp: Stamp) -> str:
    """The source as shown to users (a ClickHouse URL without its password), without opening it."""
    return mask_url(stamp[1])


def query(stamp: Stamp, sql: str, params: dict | None = None) -> pl.DataFrame:
    """One statement (DuckDB SQL, named ``$parameters``) on the stamp's source, as a DataFrame."""
    return _query(source(stamp), sql, params)


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
    frames = queries(source(stamp), OPTIONS_SQL)
    return {k: df[df.columns[0]].to_list() for k, df in frames.items()}


def call_where(f: Filters, since: dt.datetime | None, until: dt.datetime | None, alias: str = "c"
               ) -> tuple[str, dict]:
    """WHERE clause over llm_calls for the global filters (fixed SQL text, values as parameters)."""
    parts: list[str] = ["TRUE"]
    params: dict[str, object] = {}
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
    parts = ["list_contains($metrics, metric)"]
    params: dict[str, object] = {"metrics": list(metrics)}
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


def instance_evidence(stamp: Stamp) -> pl.DataFrame:
    """Per instance, the evidence call_reuse's miss causes can rest on (agentobs.model.reuse.evidence_sql)."""
    from agentobs.model.reuse import evidence_sql

    return query(stamp, evidence_sql())


def metric_names(stamp: Stamp) -> list[str]:
    return query(stamp, "SELECT DISTINCT metric FROM metric_samples ORDER BY 1")["metric"].to_list()


# -- SQL page ----------------------------------------------------------------------------------------
def schema(stamp: Stamp) -> pl.DataFrame:
    """Tables and views users may query, with their columns (hidden helper views start with '_')."""
    return source(stamp).schema()
