"""The per-call reuse model ``call_reuse`` (METRICS.md §1 and §4), one SQL body used two ways:

- as the model view ``call_reuse`` (created with the other views on every read-write open), over
  ``llm_calls`` with the built-in default block size;
- in the metric run (``m_calls``, which every metric reads), over a materialized copy of ``llm_calls``
  and with the ``default_block_size`` setting; on DuckDB only its computed columns are stored (``narrow``).

The body reads relations named ``calls_src``, ``cfg_src``, ``kv_src``, ``act_src``, ``cnt_src`` and ``reuse_params``;
the callers bind them as CTEs (our own constant SQL text, no user input is spliced). ``act_src`` is every call of the
store (the instances' activity, for the instance evidence of docs/metrics.md): ``calls_src`` itself when that holds
every call, else the relation the caller names (``activity``); each of its rows has a weight ``n``, the number of
calls it stands for (1, or — the maintained model's refresh, agentobs.model.state — a row per instance summing the
calls before the time its derived calls can reach: ``activity_weighted``).
"""

from __future__ import annotations

import math
from importlib import resources

import duckdb

from ..config import Settings
from ..errors import ConfigError

CALL_COLUMNS = (
    "call_id, trace_id, session_id, task_id, task_type, tenant, agent_name, attempt, branch, instance, engine, "
    "model, start_s, end_s, ttft_s, queue_s, prefill_s, decode_s, prompt_tokens, cached_tokens, output_tokens, "
    "system_tokens, tool_def_tokens, status, itl_ms, block_hashes"
)
DEFAULT_BLOCK_SIZE = int(Settings().default_block_size)
DEFAULT_ABANDONED_AFTER_S = float(Settings().abandoned_after_s)
DEFAULT_HIT_TOLERANCE_BLOCKS = int(Settings().hit_tolerance_blocks)
# the columns of a call the instance evidence reads (act_src)
ACTIVITY_COLUMNS = "instance, start_s, end_s, prompt_tokens, cached_tokens, output_tokens, status"
# the engine counters it reads (cnt_src; colon form, agentobs/collect/prom.py): preemptions / retractions, the
# tokens each engine computed, cached and generated, and SGLang's evicted tokens
COUNTER_METRICS = (
    "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:prompt_tokens_by_source_total",
    "vllm:prefix_cache_hits_total", "vllm:generation_tokens_total",
    "sglang:num_retracted_requests_total", "sglang:prompt_tokens_total", "sglang:cached_tokens_total",
    "sglang:generation_tokens_total", "sglang:evicted_tokens_total",
)
# the samples that say when an engine restarted (cnt_src too): the process start time, where the engine exposes it
# (vLLM with one API server; ../shared/reference/vllm.md §1.1); a decrease of the counters above says it otherwise
RESTART_METRICS = ("process_start_time_seconds",)


def seconds_literal(value) -> str:
    """A validated, finite number of seconds as a SQL literal (settings only; never request input)."""
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"setting abandoned_after_s must be a finite number of seconds ≥ 0, got {value!r}")
    return repr(v)


def blocks_literal(value) -> str:
    """The hit tolerance (a setting, whole blocks ≥ 0) as a SQL literal."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"setting hit_tolerance_blocks must be a whole number of blocks ≥ 0, got {value!r}")
    return str(value)


_FINAL = "-- final:"


def body_sql(narrow: bool = False) -> str:
    """The call_reuse body. ``narrow``: without its last step (the call columns joined back onto the computed
    ones): ``rid``, the computed columns and the few call columns they derive from (CTE ``fin``)."""
    body = resources.files(__package__).joinpath("call_reuse.sql").read_text()
    if not narrow:
        return body
    return body[:body.index(_FINAL)] + "SELECT * FROM fin\n"


def reuse_sql(calls: str = "llm_calls", block_size: str | None = None, select: str = "*", tail: str = "",
              abandoned_after_s: float | None = None, has_rid: bool = False, rid: str = "rid", narrow: bool = False,
              kv_index: bool = False, hit_tolerance_blocks: int | None = None, activity: str | None = None,
              activity_weighted: bool = False) -> str:
    """The call_reuse SELECT over ``calls`` (a relation name of ours). ``block_size`` is a SQL
    expression for the default block size (a parameter such as ``$default_block_size``); ``select``
    and ``tail`` extend the outer query (the body is aliased ``r``). All arguments are our own SQL text;
    ``abandoned_after_s`` (the setting, a number) becomes a literal after validation. ``has_rid``: ``calls``
    already has a unique row number ``rid`` (the metric run's m_src); otherwise one is assigned once, in a
    materialized CTE (the body joins the wide rows back by rid, so it must not be recomputed). ``rid``: the
    expression of that row number in ``calls`` — ``rowid`` when ``calls`` is a DuckDB table (the metric run's
    m_src: no numbering pass at all; the CTE is then never materialized, each use scans the table). ``narrow``: the
    body without its final join back onto ``calls`` (see body_sql): the metric run stores that and puts the call
    columns beside it with a positional join. ``kv_index``: read the KV section's result from the stored KV-event
    index (agentobs.model.kvindex; the caller checked it is current) instead of computing it from kv_events.
    ``hit_tolerance_blocks``: the setting (a shortfall of at most this many blocks, without evidence of eviction, is a
    hit in estimate mode); validated, then a literal. ``activity``: a relation of ours with every call of the store
    (``ACTIVITY_COLUMNS``) when ``calls`` holds only some (one session, a pruned working set); None: ``calls`` holds
    every call. ``activity_weighted``: that relation has a column ``n``, the calls each row stands for (call_reuse.sql
    ``ie_act``); otherwise every row is one call."""
    body = body_sql(narrow)
    if kv_index:
        from . import kvindex

        if kvindex.section() not in body:  # the body and the section come from one file: cannot happen
            raise AssertionError("call_reuse.sql has no KV index section")
        body = body.replace(kvindex.section(), kvindex.INDEXED)
    bs = block_size if block_size is not None else str(DEFAULT_BLOCK_SIZE)
    ab = seconds_literal(abandoned_after_s if abandoned_after_s is not None else DEFAULT_ABANDONED_AFTER_S)
    tol = blocks_literal(hit_tolerance_blocks if hit_tolerance_blocks is not None else DEFAULT_HIT_TOLERANCE_BLOCKS)
    return (
        (f"WITH calls_src AS NOT MATERIALIZED (SELECT rowid AS rid, {CALL_COLUMNS} FROM {calls}),\n"
         if has_rid and rid == "rowid" else
         f"WITH calls_src AS (SELECT {rid} AS rid, {CALL_COLUMNS} FROM {calls}),\n" if has_rid else
         f"WITH calls_src AS MATERIALIZED (SELECT row_number() OVER () AS rid, {CALL_COLUMNS} FROM {calls}),\n") +
        "cfg_src AS (SELECT * FROM instance_config),\n"
        "kv_src AS (SELECT * FROM kv_events),\n"
        f"act_src AS (SELECT {ACTIVITY_COLUMNS}, {'n' if activity_weighted else 'CAST(1 AS BIGINT) AS n'} "
        f"FROM {activity if activity is not None else 'calls_src'}),\n"
        "cnt_src AS (SELECT instance, ts, metric, labels, value FROM metric_samples\n"
        f"    WHERE metric IN ({', '.join(repr(m) for m in COUNTER_METRICS + RESTART_METRICS)})),\n"
        f"reuse_params AS (SELECT CAST({bs} AS INTEGER) AS default_block_size, CAST({ab} AS DOUBLE) AS abandoned_after_s,\n"
        f"    CAST({tol} AS INTEGER) AS hit_tolerance_blocks,\n"
        "    (SELECT max(end_ns) FROM spans) / 1e9 AS data_end_s)\n"
        f"SELECT {select} FROM (\n{body}\n) r\n{tail}"
    )


def create_view(con: duckdb.DuckDBPyConnection) -> None:
    """``call_reuse`` as a model view (made by agentobs.model.ensure)."""
    con.execute("CREATE OR REPLACE VIEW call_reuse AS " + reuse_sql())


# the evidence each instance gives call_reuse's miss causes (docs/metrics.md, "Instance evidence"): KV events tagged
# with sessions (per-session removals), the engine counters (preemptions / retractions, token counters, SGLang's
# evicted tokens) with the pool size, the pool size alone (spans then bound the churn), or nothing but spans. One
# row per instance that served a call, sent KV events or was scraped; the console's Findings page shows it.
_PREEMPT = ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total")


def evidence_sql() -> str:
    """The per-instance evidence table (columns: instance, engine, kv_events_with_sessions, preemption_counter,
    token_counters, pool_tokens, evidence)."""
    tokens = [m for m in COUNTER_METRICS if m not in _PREEMPT]
    q = ", ".join(repr(m) for m in COUNTER_METRICS)
    return f"""
WITH i AS (
    SELECT instance FROM spans WHERE role IN ('gateway', 'engine') AND instance IS NOT NULL
    UNION SELECT instance FROM kv_events
    UNION SELECT instance FROM metric_samples WHERE metric IN ({q})
    UNION SELECT instance FROM instance_config
),
k AS (SELECT instance, count(*) AS n FROM kv_events WHERE session_id IS NOT NULL GROUP BY instance),
m AS (
    SELECT instance,
           count(*) FILTER (WHERE metric IN ({", ".join(repr(x) for x in _PREEMPT)})) AS preempt,
           count(*) FILTER (WHERE metric IN ({", ".join(repr(x) for x in tokens)})) AS tokens
    FROM metric_samples WHERE metric IN ({q}) GROUP BY instance
)
SELECT i.instance, ic.engine, coalesce(k.n, 0) > 0 AS kv_events_with_sessions,
       coalesce(m.preempt, 0) > 0 AS preemption_counter, coalesce(m.tokens, 0) > 0 AS token_counters,
       ic.kv_capacity_tokens AS pool_tokens,
       CASE WHEN coalesce(k.n, 0) > 0 THEN 'KV events with session ids'
            WHEN ic.kv_capacity_tokens > 0 AND coalesce(m.preempt, 0) + coalesce(m.tokens, 0) > 0
                THEN 'scrapes (preemptions, token counters) and the pool size'
            WHEN ic.kv_capacity_tokens > 0 THEN 'spans and the pool size'
            ELSE 'spans only' END AS evidence
FROM i
LEFT JOIN instance_config ic ON ic.instance = i.instance
LEFT JOIN k ON k.instance = i.instance
LEFT JOIN m ON m.instance = i.instance
ORDER BY i.instance
"""
