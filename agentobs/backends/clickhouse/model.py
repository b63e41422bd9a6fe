"""The agentobs model on ClickHouse: raw relations over the exporter's tables, then the shared views.

- ``spans``: ``otel_traces`` with the promoted columns of agentobs/collect/normalize.py resolved in SQL
  at read time. The alias lists come from normalize.py and the settings (one source of truth); the
  SQL mirrors ``promote`` for the OTel GenAI / vLLM / SGLang attributes. Python-only paths (LiteLLM's
  stringified dicts, malformed-value warnings) are not repeated here; see docs/clickhouse.md.
- ``metric_samples``: ``otel_metrics_gauge`` / ``_sum`` / ``_histogram`` (Prometheus receiver data) in the
  shape the scraper writes (histograms back as cumulative ``_bucket`` / ``_count`` / ``_sum`` series).
- ``engine_config``: ``vllm:cache_config_info`` labels plus ``agentobs_engine_config``; ``kv_events``:
  ``agentobs_kv_events`` (the exporter has no place for either).
- then agentobs/model/views.sql, transpiled by agentobs.backends.clickhouse.dialect;
- ``call_reuse``: a view over the table ``agentobs_call_reuse``, which holds call_reuse.sql's rows computed step by
  step (agentobs.backends.clickhouse.steps) and is computed again when the data it reads changed
  (``refresh_call_reuse``: readers call it first; docs/clickhouse.md "call_reuse on ClickHouse").

Arrays cannot be NULL in ClickHouse: an empty ``itl_ms`` / ``block_hashes`` means unknown.
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources

from ... import conventions as C
from ...collect import normalize as N
from ...collect.prom import KEPT_CREATED
from ...config import Settings, load_settings
from ...model import split_statements, views_sql
from . import steps
from .conn import ClickHouse
from .dialect import to_clickhouse


def _q(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _arr(xs) -> str:
    return "[" + ", ".join(_q(x) for x in xs) + "]"


def _a(key: str) -> str:
    return f"SpanAttributes[{_q(key)}]"


def _has(key: str) -> str:
    return f"mapContains(SpanAttributes, {_q(key)})"


def _merged(key: str) -> str:
    """value of key in {**resource, **attrs} ('' when absent)."""
    return f"if({_has(key)}, {_a(key)}, ResourceAttributes[{_q(key)}])"


def _first_elem(v: str) -> str:
    # an array attribute arrives as JSON text (pcommon Value.AsString); _first_str takes its first element
    return f"if(startsWith({v}, '['), JSONExtractString({v}, 1), {v})"


def _first_str(keys, merged: bool = True) -> str:
    parts = []
    for k in keys:
        v = _first_elem(_merged(k) if merged else _a(k))
        parts.append(f"{v} != '', {v}")
    return f"multiIf({', '.join(parts)}, NULL)" if parts else "CAST(NULL AS Nullable(String))"


# -- the alias table: the settings' attribute lists (session, task, task type, tenant), read by the spans
#    view at ingest, so a changed list applies to spans ingested after it is written (sync_aliases) ---------------
ALIAS_FIELDS = {"session_id": "session_keys", "task_id": "task_keys", "task_type": "task_type_keys",
                "tenant": "tenant_keys"}
ALIASES_DDL = ("CREATE TABLE IF NOT EXISTS agentobs_aliases (field String, keys Array(String), written DateTime64(6)) "
               "ENGINE = ReplacingMergeTree(written) ORDER BY field")
# the latest list of each field (ReplacingMergeTree keeps the newest row; argMax reads it before a merge too)
STORED_ALIASES_SQL = "SELECT field, argMax(keys, written) AS keys FROM agentobs_aliases GROUP BY field ORDER BY field"


def alias_lists(settings: Settings) -> dict[str, list[str]]:
    """field → the settings' attribute keys, first match wins (the lists normalize.alias_keys reads on DuckDB)."""
    return {field: [str(k) for k in getattr(settings, name)] for field, name in ALIAS_FIELDS.items()}


def stored_aliases(ch: ClickHouse) -> dict[str, list[str]]:
    """The lists the spans view reads now ({} before the table exists)."""
    try:
        t = ch.arrow(STORED_ALIASES_SQL)
    except Exception:  # noqa: BLE001 - no table yet (a store from before the alias table, or none)
        return {}
    return dict(zip(t.column("field").to_pylist(), t.column("keys").to_pylist(), strict=True))


def alias_differences(ch: ClickHouse, settings: Settings) -> list[str]:
    """The fields whose stored alias list is not the settings' (in ALIAS_FIELDS order)."""
    want, have = alias_lists(settings), stored_aliases(ch)
    return [f for f in want if have.get(f) != want[f]]


def sync_aliases(ch: ClickHouse, settings: Settings) -> list[str]:
    """Write the settings' alias lists where they differ from the stored ones; returns the fields written."""
    ch.command(ALIASES_DDL)
    want = alias_lists(settings)
    changed = alias_differences(ch, settings)
    for f in changed:
        ch.command(f"INSERT INTO agentobs_aliases (field, keys, written) VALUES ({_q(f)}, {_arr(want[f])}, now64(6))")
    return changed


def sync_aliases_note(ch: ClickHouse, settings: Settings) -> str | None:
    """sync_aliases at connect, on a store that has the alias table: what to tell the user (the lists written; or,
    on a connection that may not write, the lists that differ and stay), None when there is nothing to say."""
    from ...errors import AgentobsError

    has_table = ch.arrow("SELECT count() AS n FROM system.tables WHERE database = currentDatabase() "
                         "AND name = 'agentobs_aliases'").column(0)[0].as_py()
    if not has_table:  # no agentobs model here (init writes the lists), or one from before the table (docs)
        return None
    try:
        changed = sync_aliases(ch, settings)
    except AgentobsError as e:
        differ = alias_differences(ch, settings)
        return (f"the stored alias lists of {', '.join(differ)} differ from the settings and could not be updated "
                f"({e}): spans ingested now resolve them with the stored lists") if differ else None
    return (f"alias lists of {', '.join(changed)} updated from the settings: spans ingested from now on resolve "
            "them so (those already stored keep their ids)") if changed else None


def _first_str_of(field: str) -> str:
    """``_first_str`` over the alias table's keys for ``field``: the first key whose value (span attribute, else
    resource attribute; an array's first element) is not empty."""
    keys = f"(SELECT argMax(keys, written) FROM agentobs_aliases WHERE field = {_q(field)})"
    v = "if(mapContains(SpanAttributes, k), SpanAttributes[k], ResourceAttributes[k])"
    return f"nullIf(arrayFirst(x -> x != '', arrayMap(k -> {_first_elem(v)}, {keys})), '')"


def _num(keys, as_int: bool) -> str:
    """The first key present; a value that is not a number is unknown (NULL), as normalize._num."""
    parts = []
    for k in keys:
        v = f"toFloat64OrNull({_a(k)})"
        parts.append(f"{_has(k)}, {f'toInt64({v})' if as_int else v}")
    typ = "Nullable(Int64)" if as_int else "Nullable(Float64)"
    return f"CAST(multiIf({', '.join(parts)}, NULL) AS {typ})"


def _first_present(keys, expr: str) -> str:
    """``expr`` of the first key present on the span (``normalize``'s first-match rule), else NULL."""
    parts = [f"{_has(k)}, {expr.format(_a(k))}" for k in keys]
    return f"multiIf({', '.join(parts)}, NULL)"


def spans_select_sql(settings: Settings) -> str:
    lit_keys = list(N.LITELLM_OPS)
    lit_vals = [N.LITELLM_OPS[k] for k in lit_keys]
    chunk = _q(N.CHUNK_EVENT)
    return f"""
WITH
    toUnixTimestamp64Nano(Timestamp) AS _start_ns,
    transform(CAST(SpanKind AS String), ['Unspecified', 'Internal', 'Server', 'Client', 'Producer', 'Consumer',
              'SPAN_KIND_UNSPECIFIED', 'SPAN_KIND_INTERNAL', 'SPAN_KIND_SERVER', 'SPAN_KIND_CLIENT',
              'SPAN_KIND_PRODUCER', 'SPAN_KIND_CONSUMER'], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5], 0) AS _kind,
    lower(ScopeName) AS _scope,
    if({_has('gen_ai.operation.name')}, {_a('gen_ai.operation.name')}, NULL) AS _op_attr,
    ({_has('gen_ai.latency.e2e')} OR {_has('gen_ai.latency.time_to_first_token')}
     OR {_has('gen_ai.usage.prompt_tokens')}) AS _per_request,
    (SpanName = 'llm_request' OR (_per_request AND (_kind = 2 OR startsWith(_scope, 'vllm') OR startsWith(_scope, 'sglang')))) AS _is_engine,
    if(_op_attr IN {_arr(lit_keys)} AND (SpanName = 'litellm_request' OR _scope = 'litellm'),
       transform(assumeNotNull(_op_attr), {_arr(lit_keys)}, {_arr(lit_vals)}, ''), _op_attr) AS _op1,
    if(_op1 IS NULL,
       multiIf(startsWith(SpanName, 'chat ') OR SpanName = 'litellm_request', 'chat',
               {_has('llm.request.type')}, {_a('llm.request.type')},
               startsWith(SpanName, 'execute_tool'), 'execute_tool',
               startsWith(SpanName, 'invoke_agent'), 'invoke_agent', NULL),
       _op1) AS _op2,
    multiIf(_is_engine, 'engine', _op2 IN {_arr(sorted(N.CALL_OPS))}, 'gateway',
            _op2 IN {_arr(sorted(N.AGENT_OPS))}, 'agent', _op2 = 'execute_tool', 'tool', 'other') AS _role,
    {_first_str(('gen_ai.provider.name', 'gen_ai.system'), merged=False)} AS _provider,
    {_first_str(('server.address', 'agentobs.instance'))} AS _addr,
    {_merged('server.port')} AS _port,
    {_num(C.INPUT_KEYS, True)} AS _p0,
    {_num(C.CACHED_KEYS, True)} AS _c,
    (lower(trimBoth({_merged(C.INPUT_EXCLUDES_CACHE)})) = 'true') AS _excl,
    {_first_present(C.STREAM_KEYS, "lower(trimBoth({}))")} = 'false' AS _not_streamed,
    {_first_present(C.HTTP_STATUS_KEYS, "toFloat64OrNull({})")} AS _http_status,
    arrayFirstIndex(n -> n IN {_arr(N.EXCEPTION_EVENTS)}, Events.Name) AS _exc_i,
    arraySort(arrayFilter((t, n) -> n = {chunk} AND toUnixTimestamp64Nano(t) != 0, Events.Timestamp, Events.Name)) AS _chunks,
    {_a('gen_ai.response.finish_reasons')} AS _fr,
    {_a('agentobs.itl_ms')} AS _itl,
    multiIf(_fr = '', NULL, startsWith(trimLeft(_fr), '['), nullIf(JSONExtractRaw(_fr, 1), ''), trimBoth(_fr)) AS _fr1
SELECT
    TraceId AS trace_id, SpanId AS span_id, nullIf(ParentSpanId, '') AS parent_span_id, SpanName AS name,
    toInt8(_kind) AS kind, _start_ns AS start_ns, toInt64(_start_ns + Duration) AS end_ns,
    toInt8(transform(CAST(StatusCode AS String), ['Unset', 'Ok', 'Error', 'STATUS_CODE_UNSET', 'STATUS_CODE_OK', 'STATUS_CODE_ERROR'],
                     [0, 1, 2, 0, 1, 2], 0)) AS status_code,
    nullIf(StatusMessage, '') AS status_message, nullIf(ServiceName, '') AS service_name, ScopeName AS scope_name,
    ResourceAttributes AS resource, SpanAttributes AS attributes,
    _role AS role,
    if(_is_engine, coalesce(_op_attr, 'engine'), _op2) AS op,
    {_first_str_of('session_id')} AS session_id,
    {_first_str_of('task_id')} AS task_id,
    {_first_str_of('task_type')} AS task_type,
    {_first_str_of('tenant')} AS tenant,
    {_first_str(('gen_ai.agent.name',), merged=False)} AS agent_name,
    CAST({_num(('agentobs.attempt', 'gen_ai.request.attempt'), True)} AS Nullable(Int32)) AS attempt,
    {_first_str(('agentobs.branch',), merged=False)} AS branch,
    {_first_str(('gen_ai.response.model', 'gen_ai.request.model', 'llm.request.model'), merged=False)} AS model,
    _provider AS provider,
    multiIf(position(concat(_scope, ' ', lower(ServiceName)), 'sglang') > 0, 'sglang',
            _role = 'engine' AND (position(concat(_scope, ' ', lower(ServiceName)), 'vllm') > 0 OR SpanName = 'llm_request'), 'vllm',
            _provider IN ('vllm', 'sglang'), _provider, NULL) AS engine,
    if(_addr IS NOT NULL AND _port != '' AND position(arrayElement(splitByChar(']', assumeNotNull(_addr)), -1), ':') = 0,
       concat(_addr, ':', _port), _addr) AS instance,
    {_first_str(('gen_ai.response.id',), merged=False)} AS response_id,
    {_first_str(('gen_ai.request.id',), merged=False)} AS request_id,
    if(_p0 IS NOT NULL AND _c IS NOT NULL AND (_excl OR _c > _p0),
       _p0 + _c + coalesce({_num(C.CACHE_WRITE_KEYS, True)}, 0), _p0) AS input_tokens,
    _c AS cached_tokens,
    {_num(C.OUTPUT_KEYS, True)} AS output_tokens,
    {_num(('agentobs.prompt.system_tokens',), True)} AS system_tokens,
    {_num(('agentobs.prompt.tool_tokens',), True)} AS tool_def_tokens,
    if(_role != 'engine' AND coalesce(_not_streamed, false), CAST(NULL AS Nullable(Float64)),
       coalesce({_num(C.TTFT_KEYS, False)},
                if(empty(_chunks), NULL, (toUnixTimestamp64Nano(_chunks[1]) - _start_ns) / 1e9))) AS ttft_s,
    {_num(('gen_ai.latency.time_in_queue',), False)} AS queue_s,
    {_num(('gen_ai.latency.time_in_model_prefill',), False)} AS prefill_s,
    {_num(('gen_ai.latency.time_in_model_decode',), False)} AS decode_s,
    if(startsWith(_fr1, '"'), JSONExtractString(concat('[', _fr1, ']'), 1), _fr1) AS finish_reason,
    multiIf({_first_str(('error.type',), merged=False)} IS NOT NULL, {_first_str(('error.type',), merged=False)},
            _http_status >= 400 AND _http_status < 1000, toString(toInt64(_http_status)),
            _exc_i > 0, if(Events.Attributes[_exc_i]['exception.type'] != '',
                           Events.Attributes[_exc_i]['exception.type'], 'exception'),
            NULL) AS error_type,
    {_first_str(('gen_ai.tool.name',), merged=False)} AS tool_name,
    multiIf(_itl != '', JSONExtract(_itl, 'Array(Float64)'),
            length(_chunks) >= 2,
            arrayMap((a, b) -> (toUnixTimestamp64Nano(b) - toUnixTimestamp64Nano(a)) / 1e6,
                     arrayPopBack(_chunks), arrayPopFront(_chunks)),
            CAST([] AS Array(Float64))) AS itl_ms,
    arrayMap(x -> if(startsWith(x, '"'), JSONExtractString(concat('[', x, ']'), 1), x),
             JSONExtractArrayRaw({_a('agentobs.prompt.block_hashes')})) AS block_hashes,
    'otel_traces' AS ingest_source
FROM otel_traces
"""


# the counters of prom.KEPT_CREATED as the exporter may name them (as exposed, or with _total stripped)
_CREATED_COUNTERS = sorted(n for c in KEPT_CREATED for n in (c[:-len("_created")], c[:-len("_created")] + "_total"))

# one SELECT per exporter metric table, each yielding (TimeUnix, ResourceAttributes, metric, attrs, value)
SAMPLE_SOURCES = {
    "otel_metrics_gauge": "SELECT TimeUnix, ResourceAttributes, MetricName AS metric, Attributes AS attrs, Value AS value "
                          "FROM otel_metrics_gauge",
    "otel_metrics_sum": "SELECT TimeUnix, ResourceAttributes, "
                        "if(IsMonotonic AND NOT endsWith(MetricName, '_total'), concat(MetricName, '_total'), MetricName) AS metric, "
                        "Attributes AS attrs, Value AS value FROM otel_metrics_sum",
    # the creation time of the counters whose *_created the scraper keeps (prom.KEPT_CREATED): the receiver puts
    # it in StartTimeUnix; a start no earlier than the point itself is no creation time (the receiver's own)
    "otel_metrics_sum_created": "SELECT TimeUnix, ResourceAttributes, "
                                "concat(if(endsWith(MetricName, '_total'), substring(MetricName, 1, "
                                "length(MetricName) - 6), MetricName), '_created') AS metric, "
                                "Attributes AS attrs, toUnixTimestamp64Nano(StartTimeUnix) / 1e9 AS value "
                                "FROM otel_metrics_sum "
                                f"WHERE MetricName IN {_arr(_CREATED_COUNTERS)} "
                                "AND StartTimeUnix < TimeUnix",
    # OTLP buckets are per bucket; Prometheus' _bucket series are cumulative up to le. Plus _count and _sum.
    "otel_metrics_histogram": """
    SELECT TimeUnix, ResourceAttributes, concat(MetricName, x.1) AS metric,
           if(x.1 = '_bucket', mapUpdate(Attributes, map('le', x.2)), Attributes) AS attrs, x.3 AS value
    FROM otel_metrics_histogram
    ARRAY JOIN arrayConcat(
        [('_count', '', toFloat64(Count)), ('_sum', '', Sum)],
        arrayMap(i -> ('_bucket', if(i > length(ExplicitBounds), '+Inf', toString(ExplicitBounds[i])),
                       toFloat64(arrayCumSum(BucketCounts)[i])), arrayEnumerate(BucketCounts))) AS x""",
}

SAMPLES_SELECT = """
SELECT toDateTime64(TimeUnix, 6) AS ts,
       coalesce(nullIf(ResourceAttributes['service.instance.id'], ''), ResourceAttributes['server.address']) AS instance,
       metric,
       attrs AS labels,
       arrayStringConcat(arrayMap(kv -> concat(kv.1, '=', kv.2), arraySort(CAST(attrs AS Array(Tuple(String, String))))), ',') AS labels_key,
       value,
       multiIf(startsWith(metric, 'vllm:'), 'vllm', startsWith(metric, 'sglang:'), 'sglang', NULL) AS engine
FROM ({source})
"""

ENGINE_CONFIG_SQL = """
CREATE OR REPLACE VIEW engine_config AS
SELECT instance, ts, CAST(engine AS Nullable(String)) AS engine, key, CAST(value AS Nullable(String)) AS value,
       CAST(source AS Nullable(String)) AS source
FROM agentobs_engine_config
UNION ALL
SELECT instance, ts, 'vllm', kv.1, kv.2, 'vllm:cache_config_info'
FROM (SELECT instance, ts, any(labels) AS labels FROM metric_samples
      WHERE metric = 'vllm:cache_config_info' GROUP BY instance, ts)
ARRAY JOIN CAST(labels AS Array(Tuple(String, String))) AS kv
UNION ALL
SELECT instance, ts, 'vllm', 'served_model_name', model, 'vllm:cache_config_info'
FROM (SELECT instance, ts, any(labels['model_name']) AS model FROM metric_samples
      WHERE metric = 'vllm:num_requests_running' AND labels['model_name'] <> ''
        AND (instance, ts) IN (SELECT instance, ts FROM metric_samples WHERE metric = 'vllm:cache_config_info'
                               AND NOT mapContains(labels, 'served_model_name'))
      GROUP BY instance, ts)
"""

KV_EVENTS_SQL = "CREATE OR REPLACE VIEW kv_events AS SELECT * FROM agentobs_kv_events"


def reuse_schema() -> dict[str, tuple[str, ...]]:
    from ...model.reuse import CALL_COLUMNS

    return {"calls_src": tuple(c.strip() for c in CALL_COLUMNS.split(","))}


def exporter_ddl() -> list[str]:
    return split_statements(resources.files(__package__).joinpath("exporter_ddl.sql").read_text())


def model_statements(settings: Settings | None = None) -> list[str]:
    """Every CREATE VIEW of the model on ClickHouse, in order (call_reuse: refresh_call_reuse)."""
    settings = settings if settings is not None else load_settings()
    out = [ENGINE_CONFIG_SQL, KV_EVENTS_SQL]
    out += [to_clickhouse(s) for s in split_statements(views_sql())]
    return out


# -- call_reuse: a table computed by steps, again when the data changed ---------------------------------------------
CALL_REUSE_TABLE = "agentobs_call_reuse"
# the tables the model reads: every insert makes a data part with a higher block number (ClickHouseSource.stamp)
DATA_TABLES = ("spans", "metric_samples", "agentobs_engine_config", "agentobs_kv_events")
DATA_PARTS_SQL = ("SELECT table, toInt64(sum(rows)) AS n, toInt64(max(max_block_number)) AS b FROM system.parts "
                  "WHERE database = currentDatabase() AND active AND has({tables:Array(String)}, table) "
                  "GROUP BY table ORDER BY table")


def data_parts(ch: ClickHouse) -> tuple:
    """Per table the model reads, (table, rows, highest block number) of its active data parts (``system.parts``:
    metadata, no data read). Merges keep both; an insert or a deletion changes them."""
    t = ch.arrow(DATA_PARTS_SQL, {"tables": list(DATA_TABLES)})
    return tuple(zip(*(c.to_pylist() for c in t.columns), strict=True))


def call_reuse_version(ch: ClickHouse) -> str:
    """What ``agentobs_call_reuse``'s rows are a function of: the data (data_parts) and the SQL (call_reuse.sql and
    the view stack under it, as transpiled)."""
    from ...model.reuse import reuse_sql

    h = hashlib.sha256(reuse_sql().encode())
    h.update(views_sql().encode())
    h.update(repr(data_parts(ch)).encode())
    return h.hexdigest()[:32]


def _stored_version(ch: ClickHouse) -> str | None:
    t = ch.arrow("SELECT comment FROM system.tables WHERE database = currentDatabase() AND name = {name:String}",
                 {"name": CALL_REUSE_TABLE})
    return t.column(0)[0].as_py() if t.num_rows else None


def refresh_call_reuse(ch: ClickHouse, force: bool = False) -> bool:
    """Compute ``agentobs_call_reuse`` (call_reuse.sql over llm_calls, the built-in defaults: the view's rows) by
    steps when its data version is not the stored one (or ``force``), and (re)create the view ``call_reuse`` over it.
    Returns whether it computed. The version is read before the computation, so data that arrives meanwhile makes
    the next call compute again."""
    from ...model.reuse import reuse_sql

    with ch.lock:
        version = call_reuse_version(ch)
        if not force and _stored_version(ch) == version:
            return False
        schema = reuse_schema()
        made: list[str] = []

        def create(table: str, select: str) -> list[str]:
            made.append(table)
            ch.command(f"DROP TABLE IF EXISTS `{table}`")
            ch.command(f"CREATE TABLE `{table}` ENGINE = Memory AS {to_clickhouse(select, schema)}")
            return ch.arrow(f"SELECT * FROM `{table}` LIMIT 0").column_names

        try:
            final, _ = steps.run(reuse_sql(), f"agentobs_run_cr_{os.getpid()}_", create)
            ch.command(f"CREATE OR REPLACE TABLE {CALL_REUSE_TABLE} ENGINE = MergeTree ORDER BY tuple() "
                       f"COMMENT '{version}' AS {to_clickhouse(final, schema)}")
        finally:
            for t in made:
                ch.command(f"DROP TABLE IF EXISTS `{t}`")
        ch.command(f"CREATE OR REPLACE VIEW call_reuse AS SELECT * FROM {CALL_REUSE_TABLE}")
        return True


def create_tables(ch: ClickHouse, settings: Settings | None = None, backfill: bool = True) -> None:
    """The exporter's tables (IF NOT EXISTS), agentobs' side tables, and the two resolved tables the
    model reads: ``spans`` and ``metric_samples``, each fed by materialized views on insert into the
    exporter's tables (normalization at ingest, as the DuckDB store does). ``backfill`` resolves rows
    that were already there. The alias lists are written to ``agentobs_aliases`` (sync_aliases), which the spans
    view reads at ingest: a changed list needs no new ``init`` (docs/clickhouse.md)."""
    settings = settings if settings is not None else load_settings()
    for stmt in exporter_ddl():
        ch.command(stmt)
    sync_aliases(ch, settings)
    spans_sql = spans_select_sql(settings)
    ch.command("CREATE TABLE IF NOT EXISTS spans ENGINE = MergeTree "
               "PARTITION BY toDate(fromUnixTimestamp64Nano(start_ns)) ORDER BY (trace_id, span_id) "
               f"EMPTY AS {spans_sql}")
    ch.command(f"CREATE MATERIALIZED VIEW IF NOT EXISTS spans_mv TO spans AS {spans_sql}")
    first = next(iter(SAMPLE_SOURCES.values()))
    ch.command("CREATE TABLE IF NOT EXISTS metric_samples ENGINE = MergeTree "
               "PARTITION BY toDate(ts) ORDER BY (instance, metric, labels_key, ts) "
               f"EMPTY AS {SAMPLES_SELECT.format(source=first)}")
    for table, src in SAMPLE_SOURCES.items():
        ch.command(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {table}_agentobs_mv TO metric_samples AS "
                   f"{SAMPLES_SELECT.format(source=src)}")
    if backfill and not ch.arrow("SELECT count() AS n FROM spans").column(0)[0].as_py():
        ch.command(f"INSERT INTO spans {spans_sql}")
    if backfill and not ch.arrow("SELECT count() AS n FROM metric_samples").column(0)[0].as_py():
        for src in SAMPLE_SOURCES.values():
            ch.command(f"INSERT INTO metric_samples {SAMPLES_SELECT.format(source=src)}")


def create_views(ch: ClickHouse, settings: Settings | None = None) -> None:
    for stmt in model_statements(settings):
        ch.command(stmt)
    # call_reuse's table when there is none (a store from before it: its inline call_reuse view is replaced); one there
    # is brought up to date by its readers (a `clickhouse load` runs this before it writes: computing now would be
    # for data about to change)
    if _stored_version(ch) is None:
        refresh_call_reuse(ch, force=True)
