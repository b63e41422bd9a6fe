"""Preparing a metric run: one preparation per (source, window, filters, settings), then any number of metric queries.

``MetricRun`` opens a private cursor on the connection (so its temp tables are its own) and
materializes, once:

- ``m_src``   the model calls (``llm_calls``) — the view over spans is evaluated once per run;
- ``m_cost``  the cost basis per instance (agentobs.metrics.cost);
- ``m_calls`` ``call_reuse`` over ``m_src`` with the cost columns, flagged ``in_filter`` (the attribute
              filters) and ``in_win`` (in_filter and start inside [since, until)). On DuckDB a view: ``m_src``
              beside ``m_x`` (only the computed columns, in ``m_src``'s row order) by positional join; on
              ClickHouse (no row ids) a table;
- ``m_samples`` the engine counters/gauges the metrics read, with reset-aware deltas.

Every metric file then reads these tables. Values (window, filters, thresholds, the grouping)
reach SQL only as named parameters; filter columns come from a whitelist.
Temp tables work on read-only connections.

The run cache (sharing one preparation between callers) is agentobs.metrics.runcache; running metrics by name
(``compute``, ``compute_all``) is agentobs.metrics.run.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl

from .. import times
from ..collect.prom import KEPT_CREATED
from ..config import Settings
from ..errors import QueryError, did_you_mean
from ..model import kvindex, reuse, state
from ..model.itl import itl_gap_params, itl_gaps_sql
from ..model.itl import state_read_sql as itl_state_sql
from ..source import Cursor, counts_changes, has_insertion_order, keeps_model_state, register_functions, rowid
from .catalog import BY_COLUMNS, Metric, get_metric
from .cost import CostModel, cost_table

# filter name -> column of m_calls (values are parameters; the names only come from here)
FILTER_COLUMNS = {
    "instance": "instance", "model": "model", "engine": "engine", "task_type": "task_type",
    "tenant": "tenant", "agent_name": "agent_name", "session": "session_id", "session_id": "session_id",
    "task": "task_id", "task_id": "task_id",
    "branch": "branch",  # 'main' or a sub-agent branch (agentobs.branch; calls without one are on 'main')
}
# engine series the metrics read from metric_samples (colon form, see collect/prom.py)
SAMPLE_METRICS = (
    "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total",
    "sglang:cached_tokens_total", "sglang:prompt_tokens_total",
    "vllm:prompt_tokens_by_source_total", "vllm:prompt_tokens_total",
    "vllm:inter_token_latency_seconds_bucket", "vllm:inter_token_latency_seconds_count",
    "sglang:inter_token_latency_seconds_bucket", "sglang:inter_token_latency_seconds_count",
    "vllm:num_requests_waiting", "sglang:num_queue_reqs",
    "vllm:admission_rejections_total",
)

# m_calls view on DuckDB: rows per positional range (see MetricRun._prepare), a multiple of DuckDB's row group
_ROW_GROUP = 122_880
_RANGE_ROWS = 4 * _ROW_GROUP


def parse_time(value, clock: Callable[[], float] = time.time, name: str = "time") -> float | None:
    """Epoch seconds from a datetime, a number (epoch seconds), an ISO-8601 string (UTC unless it
    says otherwise) or a relative span before now (``90m``, ``24h``, ``7d``): agentobs.times.parse_time."""
    if value == "":
        return None
    try:
        return times.parse_time(value, clock, spans=-1)
    except TypeError:
        raise QueryError(f"{name} {value!r} is not a time") from None
    except ValueError:
        raise QueryError(
            f"{name} {value!r} is not a time: use ISO-8601 (2026-10-14T09:00), epoch seconds, or a span before now "
            "(24h, 7d)"
        ) from None


# -- the compact m_x (DuckDB) ------------------------------------------------------------------------------------
# call_reuse's label columns and every value they take (agentobs/model/call_reuse.sql): stored as ENUMs in m_x,
# VARCHAR again in m_calls. A value missing here fails the preparation loudly (the CAST), never silently.
_ENUM_COLUMNS = {
    "block_size_source": ("engine_config", "default"),
    "mode": ("no_session", "exact", "estimate"),
    "miss_cause": ("error", "cold", "prior_hit", "routed_away", "cache_disabled", "evicted_full", "evicted_partial",
                   "prompt_edit", "unexplained", "unknown"),
    "cause_evidence": ("block_hashes", "cache_off", "other_instance", "kv_removal", "restart", "kv_no_removal",
                       "tolerance", "preemption", "churn", "no_churn", "none"),
    "hit_class": ("hit", "partial", "miss"),
    "window_outcome": ("retained", "evicted", "routed_away", "unknown"),
    "rent_mode": ("kv_events", "estimate"),
    "evict_phase": ("idle", "queued", "after_resume"),
}
# m_cost's per-instance numbers the cost columns of m_calls read
_COST_CONSTANTS = ("usd_per_s", "prefill_tps", "decode_tps", "usd_per_token_s", "bytes_per_token", "g_star_s",
                   "list_input_per_tok", "list_cached_per_tok", "list_output_per_tok")


def _sql_str(v: str) -> str:
    return "'" + str(v).replace("'", "''") + "'"


def _sql_double(v) -> str:
    if v is None:
        return "NULL"
    f = float(v)
    return repr(f) if math.isfinite(f) else f"CAST('{f}' AS DOUBLE)"


def _cost_columns(k: Callable[[str], str], t: str) -> list[str]:
    """The per-call cost columns of m_calls (METRICS.md §8), one definition for both ways they are made: ``k(name)``
    is the SQL of the call's instance's m_cost number ``name`` (a joined m_cost row, or the compact view's lookup),
    ``t`` the alias of the call's columns (tokens, ``reprefill_tokens``)."""
    computed = f"({t}.prompt_tokens - coalesce({t}.cached_tokens, 0))"
    gpu = f"{computed} / {k('prefill_tps')} + coalesce({t}.output_tokens, 0) / {k('decode_tps')}"
    return [*(f"{k(c)} AS {c}" for c in ("usd_per_s", "prefill_tps", "decode_tps", "usd_per_token_s",
                                         "bytes_per_token", "g_star_s")),
            f"{gpu} AS gpu_s",
            f"({gpu}) * {k('usd_per_s')} AS cost_usd",
            f"{t}.reprefill_tokens / {k('prefill_tps')} * {k('usd_per_s')} AS reprefill_cost_usd",
            f"{t}.reprefill_low_tokens / {k('prefill_tps')} * {k('usd_per_s')} AS reprefill_cost_low_usd",
            f"{t}.reprefill_high_tokens / {k('prefill_tps')} * {k('usd_per_s')} AS reprefill_cost_high_usd",
            f"{computed} * {k('list_input_per_tok')} + coalesce({t}.cached_tokens, 0) * {k('list_cached_per_tok')}"
            f" + coalesce({t}.output_tokens, 0) * {k('list_output_per_tok')} AS list_cost_usd"]


def _view_columns(x_cols: list[str], insts: list[tuple]) -> str:
    """The select list of the m_calls view over (m_src's call columns, m_x's columns): m_x's ENUMs as VARCHAR,
    the previous call's instance by its index, and at ``inst_no`` the cost columns (_cost_columns, as the
    ClickHouse run stores them), reading the instance's m_cost numbers from list literals (``insts``: (instance,
    *_COST_CONSTANTS) in inst_no order, so list position = inst_no): same operands, same order, same doubles."""
    names = "CAST([" + ", ".join(_sql_str(r[0]) for r in insts) + "] AS VARCHAR[])"
    k = {c: "CAST([" + ", ".join(_sql_double(r[i + 1]) for r in insts) + "] AS DOUBLE[])[u.inst_no]"
         for i, c in enumerate(_COST_CONSTANTS)}
    out = [c.strip() for c in reuse.CALL_COLUMNS.split(",") if c.strip() != "block_hashes"]
    out = [f"u.{c}" for c in out]
    for c in x_cols:
        if c in _ENUM_COLUMNS:
            out.append(f"CAST(u.{c} AS VARCHAR) AS {c}")
        elif c == "prev_instance":
            out.append(f"{names}[u.prev_instance] AS prev_instance")
        elif c == "inst_no":
            out += _cost_columns(k.__getitem__, "u")
        else:
            out.append(f"u.{c}")
    return ",\n".join(out)


@dataclass
class MetricRun:
    """Prepared temp tables on a private cursor; ``compute(name, by)`` runs one metric."""

    con: Cursor  # a cursor of a Source (agentobs.source): DuckDB's, or one that speaks it on ClickHouse
    since: float | None = None
    until: float | None = None
    filters: dict[str, list[str]] = field(default_factory=dict)
    settings: Settings = field(default_factory=Settings)
    cost: CostModel = field(default_factory=CostModel)
    timings: dict[str, float] = field(default_factory=dict)
    prune: bool = True  # window pruning of the working set (False: every call, as a check of the pruning)
    rollups: bool = True  # over the maintained state: metrics with a rollup form read it where the grain allows
    from_rollup: set = field(default_factory=set, init=False)  # the metrics that did
    _narrowed: bool = field(default=False, repr=False)  # restrict_since changed in_win or m_samples
    kv_index: bool = field(default=False, init=False)  # the KV section came from the stored index (_prepare)
    # the parameters m_itl_gap was made with (itl_gaps), None when it is absent or stale (the window moved)
    _itl_gap_key: tuple | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise QueryError(f"empty window: until ({self.until}) must be after since ({self.since})")
        register_functions(self.con)  # agentobs_cumsum (the ITL queries) on a connection the caller opened
        self.cur = self.con.cursor()
        # the windows this run's working set can serve (set_window): every call when not pruned, else
        # [since − (until − since), until) — see the pruning in _prepare
        pruned = self.prune and (self.since is not None or self.until is not None)
        self._covers = (
            (None if self.since is None else self.since if self.until is None else 2 * self.since - self.until),
            self.until) if pruned else (None, None)
        if has_insertion_order(self.cur):
            self._unordered(self._prepare)
        else:
            self._prepare()

    def _unordered(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` with DuckDB's ``preserve_insertion_order`` off, then put the setting back. The preparation's
        tables need no row order but the one ``m_x`` gets from its ORDER BY (which the setting keeps, and which is
        checked after), and without the ordered sinks the preparation is faster (docs/metrics.md, "Round 9"). The
        setting is the database's, so it is only off while the preparation runs; a connection whose
        configuration is locked (the SQL console's sandbox) prepares with it as it is."""
        before = self.cur.sql("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
        if not before:
            fn()
            return
        try:
            self.cur.execute("SET preserve_insertion_order = false")
        except duckdb.Error:  # a sandboxed connection (agentobs.sql: lock_configuration): prepare as it is
            fn()
            return
        try:
            fn()
        finally:
            self.cur.execute("SET preserve_insertion_order = true")

    # -- preparation ---------------------------------------------------------------------------
    def _timed(self, label: str, sql: str, params=None) -> None:
        t0 = time.perf_counter()
        self.cur.execute(sql, params or {})
        self.timings[label] = time.perf_counter() - t0

    def _prepare(self) -> None:
        if keeps_model_state(self.cur):
            t0 = time.perf_counter()
            use = state.current(self.cur, self.settings)
            self.timings["state_check"] = time.perf_counter() - t0
            if use:
                self._prepare_state()
                return
        cols = reuse.CALL_COLUMNS
        src = "m_src"
        # the row number rid that call_reuse keys its narrow steps by: on DuckDB the temp table's own rowid (no
        # numbering pass: row_number() OVER () makes the copy single-threaded); on a translated backend
        # (ClickHouse, which has no rowid) a numbered column
        has_rowid = rowid(self.cur)
        number = "" if has_rowid else "row_number() OVER () AS rid, "
        activity = None  # m_src holds every call: the instances' activity too (call_reuse's act_src)
        if (self.since is None and self.until is None) or not self.prune or self._nothing_to_prune():
            self._timed("m_src", f"CREATE OR REPLACE TEMP TABLE m_src AS SELECT {number}{cols} FROM llm_calls")
        else:
            # window pruning: only sessions with a call overlapping [lo, until) enter the working set, with all
            # their calls (prev(c), exact R, turns, is_last and abandonment read the whole session), where
            # lo = since − (until − since): the period before, which the report compares against. Every call stays
            # in m_act: the instance evidence reads the instances' whole activity (docs/metrics.md)
            self._timed("m_act", f"CREATE OR REPLACE TEMP TABLE m_act AS SELECT {cols} FROM llm_calls")
            activity = "m_act"
            self._timed("m_src", f"""
                CREATE OR REPLACE TEMP TABLE m_src AS
                WITH a AS (SELECT * FROM m_act)
                SELECT {number}a.* FROM a
                WHERE coalesce(a.session_id, 'call:' || a.call_id) IN (
                    SELECT coalesce(session_id, 'call:' || call_id) FROM a
                    WHERE ($until IS NULL OR start_s < $until)
                      AND ($since IS NULL OR end_s > CASE WHEN $until IS NULL THEN $since ELSE 2 * $since - $until END))
            """, {"since": self.since, "until": self.until})
        t0 = time.perf_counter()
        self.cur.register("m_cost_arrow", cost_table(self.cur, self.cost))
        self.cur.execute("CREATE OR REPLACE TEMP TABLE m_cost AS SELECT * FROM m_cost_arrow")
        self.cur.unregister("m_cost_arrow")
        self.timings["m_cost"] = time.perf_counter() - t0
        preds: list[str] = []
        params: dict[str, Any] = {}
        for key, values in self.filters.items():
            col = FILTER_COLUMNS[key]
            preds.append(f"list_contains($f_{key}, {{t}}.{col})")
            params[f"f_{key}"] = values
        params.update({"since": self.since, "until": self.until,
                       "default_block_size": int(self.settings.default_block_size)})
        cost_cols = ",\n".join(_cost_columns(lambda c: f"k.{c}", "r")) + ",\n"
        window = "($since IS NULL OR r.start_s >= $since) AND ($until IS NULL OR r.start_s < $until)"
        cost_join = "LEFT JOIN m_cost k ON k.instance = coalesce(r.instance, '')"
        abandoned_after_s = self.settings.abandoned_after_s
        if has_rowid:
            # DuckDB: store only the computed columns (m_x: the narrow body, one row per m_src row, in m_src's row
            # order), and present m_calls as a view that puts m_src's call columns beside them (POSITIONAL JOIN:
            # no join, no second copy of the wide rows: writing them dominated m_calls' time and peak memory; see
            # docs/metrics.md). The attribute filters read the wide columns: a semi-join by rowid.
            # m_x is compact: the labels are ENUMs (1 byte, not a 16-byte string), the instance of the previous
            # call an index into the instance list, and the cost columns — functions of the instance and the
            # call's tokens — are not stored: the view computes them from the instance's index (_view_columns).
            in_filter = ("r.rid IN (SELECT rowid FROM m_src s WHERE " + " AND ".join(p.format(t="s") for p in preds)
                         + ")") if preds else "true"
            self.cur.execute("CREATE OR REPLACE TEMP TABLE m_inst AS SELECT instance, "
                             "CAST(row_number() OVER (ORDER BY instance) AS UINTEGER) AS inst_no FROM m_cost")
            # the view's lookup lists, position = inst_no (read back in that order, not numbered twice)
            insts = self.cur.sql(f"SELECT k.instance, {', '.join('k.' + c for c in _COST_CONSTANTS)} "
                                 "FROM m_inst i JOIN m_cost k USING (instance) ORDER BY i.inst_no").fetchall()
            replace = ", ".join(f"CAST(r.{c} AS ENUM({', '.join(_sql_str(v) for v in vals)})) AS {c}"
                                for c, vals in _ENUM_COLUMNS.items())
            select = ("r.* EXCLUDE (instance, start_s, prompt_tokens, cached_tokens, output_tokens)"
                      f" REPLACE ({replace}, pk.inst_no AS prev_instance),\n"
                      f"ki.inst_no,\n({in_filter}) AS in_filter,\n({in_filter}) AND {window} AS in_win")
            joins = ("LEFT JOIN m_inst ki ON ki.instance = coalesce(r.instance, '')\n"
                     "LEFT JOIN m_inst pk ON pk.instance = r.prev_instance")
            # the KV section from the stored KV-event index when it is that of kv_events now (agentobs.model.kvindex)
            t0 = time.perf_counter()
            self.kv_index = kvindex.usable(self.cur)
            self.timings["kv_index_check"] = time.perf_counter() - t0
            sql = "CREATE OR REPLACE TEMP TABLE m_x AS\n" + reuse.reuse_sql(
                src, "$default_block_size", select, joins + "\nORDER BY r.rid",
                abandoned_after_s=abandoned_after_s, has_rid=True, rid="rowid", narrow=True, kv_index=self.kv_index,
                hit_tolerance_blocks=int(self.settings.hit_tolerance_blocks), activity=activity)
            self._timed("m_calls", sql, params)
            if activity:
                self.cur.execute("DROP TABLE m_act")
            t0 = time.perf_counter()
            # m_x must hold exactly one row per m_src row, in rowid order (ORDER BY keeps it so, whatever
            # preserve_insertion_order says); checked, never assumed
            n_src, n_x, misplaced = self.cur.sql(
                "SELECT (SELECT count(*) FROM m_src), count(*), count(*) FILTER (WHERE rid <> rowid) FROM m_x"
            ).fetchall()[0]
            call_cols = ", ".join(f"s.{c.strip()}" for c in reuse.CALL_COLUMNS.split(",") if c.strip() != "block_hashes")
            x_cols = [r[0] for r in self.cur.sql("DESCRIBE m_x").fetchall() if r[0] != "rid"]
            outer = _view_columns(x_cols, insts)
            if n_src == n_x and misplaced == 0:
                # a positional scan runs on one thread; a UNION ALL of row ranges (row-group aligned) runs one
                # pipeline per range, so scans of m_calls use every core as a table scan would
                parts = max(1, min(32, -(-n_x // _RANGE_ROWS)))
                step = -(-n_x // parts) if n_x else 1
                step = -(-step // _ROW_GROUP) * _ROW_GROUP
                ranges = [(lo, lo + step) for lo in range(0, max(n_x, 1), step)]
                self.cur.execute(f"CREATE OR REPLACE TEMP VIEW m_calls AS SELECT {outer} FROM (" + "\nUNION ALL\n".join(
                    f"SELECT {call_cols}, x.* EXCLUDE (rid) FROM "
                    f"(SELECT * FROM m_src WHERE rowid >= {lo} AND rowid < {hi}) s POSITIONAL JOIN "
                    f"(SELECT * FROM m_x WHERE rowid >= {lo} AND rowid < {hi}) x" for lo, hi in ranges) + ") u")
            else:  # not expected; a correct (slower) table rather than a misaligned view
                self.cur.execute(f"CREATE OR REPLACE TEMP TABLE m_calls AS SELECT {outer} FROM (SELECT {call_cols}, "
                                 "x.* EXCLUDE (rid) FROM m_src s JOIN m_x x ON x.rid = s.rowid) u")
            self.calls_table = "m_x"
            self.timings["m_calls_view"] = time.perf_counter() - t0
        else:
            in_filter = " AND ".join(p.format(t="r") for p in preds) or "true"
            select = ("r.*, " + cost_cols + f"({in_filter}) AS in_filter,\n({in_filter}) AND {window} AS in_win")
            sql = "CREATE OR REPLACE TEMP TABLE m_calls AS\n" + reuse.reuse_sql(
                src, "$default_block_size", select, cost_join,
                abandoned_after_s=abandoned_after_s, has_rid=True, rid="rid",
                hit_tolerance_blocks=int(self.settings.hit_tolerance_blocks), activity=activity)
            self._timed("m_calls", sql, params)
            self.cur.execute("DROP TABLE m_src")
            if activity:
                self.cur.execute("DROP TABLE m_act")
            self.calls_table = "m_calls"
        self._samples(self.since, self.until)

    def _prepare_state(self) -> None:
        """The run over the maintained state (agentobs.model.state: ``model_calls``, current for this store and
        these settings): nothing is derived. ``m_calls`` is a view over it with the cost columns and the
        ``in_filter``/``in_win`` flags, which read the filter values and the window from two small temp tables
        (``m_filter``, ``m_win``: values stay parameters, and moving the window is an UPDATE of one row).
        ``m_src``, read by the cost basis, is the working set a derived run would have (the same window pruning),
        so the observed prefill throughput is the same."""
        self.calls_table = "state"
        self._state_win = (self.since, self.until)  # the window m_win holds (the rollup forms read the same)
        t0 = time.perf_counter()
        pruned = self._covers != (None, None)
        where = ""
        if pruned:
            where = (f" WHERE skey IN (SELECT skey FROM {state.TABLE} WHERE ($until IS NULL OR start_s < $until) "
                     "AND ($lo IS NULL OR end_s > $lo))")
        self.cur.execute(f"CREATE OR REPLACE TEMP TABLE m_src AS SELECT instance, model, prompt_tokens, cached_tokens,"
                         f" prefill_s FROM {state.TABLE}{where}",
                         {"until": self.until, "lo": self._covers[0]} if pruned else {})
        self.timings["m_src"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.cur.register("m_cost_arrow", cost_table(self.cur, self.cost))
        self.cur.execute("CREATE OR REPLACE TEMP TABLE m_cost AS SELECT * FROM m_cost_arrow")
        self.cur.unregister("m_cost_arrow")
        self.timings["m_cost"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.cur.execute("CREATE OR REPLACE TEMP TABLE m_filter (key VARCHAR, value VARCHAR)")
        for key, values in self.filters.items():
            self.cur.executemany("INSERT INTO m_filter VALUES (?, ?)", [[key, v] for v in values])
        self.cur.execute("CREATE OR REPLACE TEMP TABLE m_win (since DOUBLE, until DOUBLE)")
        self.cur.execute("INSERT INTO m_win VALUES (?, ?)", [self.since, self.until])
        # the filter keys come from FILTER_COLUMNS (a whitelist), the values from m_filter
        in_filter = " AND ".join(
            f"list_contains((SELECT list(value) FROM m_filter WHERE key = {_sql_str(k)}), r.{FILTER_COLUMNS[k]})"
            for k in self.filters) or "true"
        cost_cols = ",\n".join(_cost_columns(lambda c: f"k.{c}", "r"))
        self.cur.execute(f"""
            CREATE OR REPLACE TEMP VIEW m_calls AS
            SELECT r.* EXCLUDE (skey, kh, th, block_hashes), {cost_cols},
                   ({in_filter}) AS in_filter,
                   ({in_filter}) AND (w.since IS NULL OR r.start_s >= w.since)
                       AND (w.until IS NULL OR r.start_s < w.until) AS in_win
            FROM {state.TABLE} r CROSS JOIN m_win w
            LEFT JOIN m_cost k ON k.instance = coalesce(r.instance, '')""")
        self.timings["m_calls_view"] = time.perf_counter() - t0
        self._samples(self.since, self.until)

    def _nothing_to_prune(self) -> bool:
        """True when every model call overlaps [lo, until) (see the pruning in _prepare), so pruning would keep
        every session: the plain copy of llm_calls then, not the materialize-and-filter (twice the work). From
        the raw spans the calls' times come from (gateway and engine spans): two aggregates, no view."""
        lo = self._covers[0]
        t0 = time.perf_counter()
        row = self.cur.sql("""
            SELECT ($until IS NULL OR coalesce(max(start_ns) / 1e9 < $until, true))
               AND ($lo IS NULL OR coalesce(min(end_ns) / 1e9 > $lo, true))
            FROM spans WHERE role IN ('gateway', 'engine')
        """, params={"lo": lo, "until": self.until}).fetchall()
        self.timings["prune_check"] = time.perf_counter() - t0
        return bool(row and row[0][0])

    def _samples(self, since: float | None, until: float | None) -> None:
        # per series, the increase since the previous sample (a decrease: the engine restarted, the increase is the
        # new value). A series' first sample has no previous one: its value is the increase since the counter was
        # created, counted when the scrape shows that time (the *_created sample of prom.KEPT_CREATED, vLLM) and it
        # is in the window (≥ since): calls served before an instance's first scrape are not lost. A creation time
        # later than the previous sample's is a restart too (one the value had already made up for).
        created = ", ".join(f"'{m}'" for m in sorted(KEPT_CREATED))
        self._timed("m_samples", f"""
            CREATE OR REPLACE TEMP TABLE m_samples AS
            SELECT * FROM (
                SELECT s.ts, epoch_us(s.ts) / 1e6 AS ts_s, s.instance, s.engine, s.metric, s.labels, s.labels_key,
                       s.value, lag(s.value) OVER w AS prev_value, cr.created_s,
                       CASE WHEN lag(s.value) OVER w IS NULL
                                THEN CASE WHEN cr.created_s IS NOT NULL AND ($since IS NULL OR cr.created_s >= $since)
                                          THEN s.value END
                            WHEN s.value < lag(s.value) OVER w OR cr.created_s > lag(cr.created_s) OVER w THEN s.value
                            ELSE s.value - lag(s.value) OVER w END AS delta,
                       coalesce(s.value < lag(s.value) OVER w OR cr.created_s > lag(cr.created_s) OVER w, false)
                           AS reset
                FROM metric_samples s
                LEFT JOIN (SELECT instance, ts, labels_key, replace(metric, '_created', '_total') AS metric,
                                  value AS created_s
                           FROM metric_samples
                           WHERE metric IN ({created})
                             AND ($instances IS NULL OR list_contains($instances, instance))
                             AND ($until IS NULL OR ts <= make_timestamp(CAST($until * 1e6 AS BIGINT)))) cr
                  ON cr.instance = s.instance AND cr.metric = s.metric AND cr.labels_key = s.labels_key
                 AND cr.ts = s.ts
                WHERE list_contains($metrics, s.metric)
                  AND ($instances IS NULL OR list_contains($instances, s.instance))
                  AND ($until IS NULL OR s.ts <= make_timestamp(CAST($until * 1e6 AS BIGINT)))
                WINDOW w AS (PARTITION BY s.instance, s.metric, s.labels_key ORDER BY s.ts)
            )
            WHERE $since IS NULL OR ts >= make_timestamp(CAST($since * 1e6 AS BIGINT))
        """, {"metrics": list(SAMPLE_METRICS), "instances": self.filters.get("instance"), "since": since,
              "until": until})

    def restrict_since(self, since: float) -> bool:
        """Narrow the run's window start to ``since`` after preparation (findings' default window): calls that
        start before it leave ``in_win``, engine samples before it are dropped. True when that changed anything
        (``reset_window`` undoes it)."""
        if self.calls_table == "state":
            lo = since if self.since is None else max(since, self.since)
            n = self.cur.execute("SELECT count(*) FROM m_calls WHERE in_win AND start_s < $since",
                                 {"since": since}).fetchall()[0][0]
            if n:
                self.cur.execute("UPDATE m_win SET since = $lo", {"lo": lo})
                self._state_win = (lo, self._state_win[1])
        elif self.calls_table == "m_x":
            n = self._changes("UPDATE m_x SET in_win = false WHERE in_win AND rid IN (SELECT rowid FROM m_src "
                              "WHERE start_s < $since)", {"since": since})
        else:
            n = self._changes("UPDATE m_calls SET in_win = false WHERE in_win AND start_s < $since", {"since": since})
        d = self._changes("DELETE FROM m_samples WHERE ts_s < $since", {"since": since})
        changed = bool(n or d)
        if n:
            self._itl_gap_key = None  # in_win changed: m_itl_gap is made again when next read
        self._narrowed = self._narrowed or changed
        return changed

    def _changes(self, sql: str, params: dict) -> int:
        """Run an UPDATE/DELETE; the rows it changed (DuckDB returns the count; a backend that does not: 1,
        i.e. assume something changed)."""
        self.cur.execute(sql, params)
        if not counts_changes(self.cur):
            return 1
        rows = self.cur.fetchall()
        return int(rows[0][0]) if rows and rows[0] and rows[0][0] is not None else 0

    def set_window(self, since: float | None, until: float | None) -> None:
        """Move the run to another window inside its working set: ``in_win``, the engine samples and the window
        the metrics read (``$since``/``$until``). The working set was pruned to sessions with a call overlapping
        [since − (until − since), until) at preparation, so a window inside that range — the view's own, or
        the period just before it (the console's "change vs previous") — gives the numbers a preparation of
        that window would (every metric reads calls of sessions overlapping its window, whole sessions kept).
        Windows outside it are refused."""
        if since is not None and until is not None and until <= since:
            raise QueryError(f"empty window: until ({until}) must be after since ({since})")
        if (since, until) == (self.since, self.until) and not self._narrowed:
            return
        lo, hi = self._covers
        if (lo is not None and (since is None or since < lo)) or (hi is not None and (until is None or until > hi)):
            raise QueryError("set_window: the window is outside this run's working set; prepare that window")
        win = "($since IS NULL OR start_s >= $since) AND ($until IS NULL OR start_s < $until)"
        p = {"since": since, "until": until}
        self._narrowed = True  # until the move completes, in_win may match neither window (a retry redoes it)
        self._itl_gap_key = None
        if self.calls_table == "state":
            self.cur.execute("UPDATE m_win SET since = $since, until = $until", p)
            self._state_win = (since, until)
        elif self.calls_table == "m_x":
            self.cur.execute(f"UPDATE m_x SET in_win = false WHERE in_win AND rid IN "
                             f"(SELECT rowid FROM m_src WHERE NOT ({win}))", p)
            self.cur.execute(f"UPDATE m_x SET in_win = true WHERE NOT in_win AND in_filter AND rid IN "
                             f"(SELECT rowid FROM m_src WHERE {win})", p)
        else:
            self.cur.execute(f"UPDATE m_calls SET in_win = in_filter AND {win} "
                             f"WHERE in_win <> (in_filter AND {win})", p)
        self._samples(since, until)
        self.since, self.until, self._narrowed = since, until, False

    def reset_window(self) -> None:
        """Undo ``restrict_since``: the run's own window again (nothing to do when the narrowing changed nothing)."""
        if self._narrowed:
            self.set_window(self.since, self.until)

    # -- the shared ITL gaps ----------------------------------------------------------------------
    def has_itl_gaps(self, settings: Settings | None = None) -> bool:
        """Whether ``m_itl_gap`` is already made for the current window and these settings' ITL parameters."""
        params = itl_gap_params(settings if settings is not None else self.settings)
        return self._itl_gap_key == tuple(sorted(params.items()))

    def itl_gaps(self, settings: Settings | None = None) -> str:
        """Make sure the temp table ``m_itl_gap`` (agentobs/model/itl_gaps.sql: every streamed gap in the
        window with its tail flag and attributed prefill) holds the run's current window for these settings'
        ITL parameters; made at most once per window and parameters. The ``itl_tail`` metric makes it; the
        long-prefill ITL finding reads it when it is there (agentobs.findings.context.Context.with_itl_gaps).
        Returns the table name."""
        params = itl_gap_params(settings if settings is not None else self.settings)
        key = tuple(sorted(params.items()))
        if self._itl_gap_key != key:
            self._itl_gap_key = None
            # over the maintained state without attribute filters, the maintained gaps (agentobs.model.itl: the
            # attribution kept per call); else derived here
            sql = itl_state_sql() if self.calls_table == "state" and not self.filters else itl_gaps_sql()
            self._timed("m_itl_gap", "CREATE OR REPLACE TEMP TABLE m_itl_gap AS\n" + sql, params)
            self._itl_gap_key = key
        return "m_itl_gap"

    # -- queries ---------------------------------------------------------------------------------
    def params_for(self, metric: Metric, by: str) -> dict:
        s = self.settings
        allp = {
            "since": self.since, "until": self.until, "by": by,
            "instances": self.filters.get("instance"),
            "bucket_s": float(s.metrics_bucket_s),
            **itl_gap_params(s),  # itl_tail_mode (checked), itl_slo_ms, long_prefill_tokens
            "ttft_slo_s": float(s.ttft_slo_s),
        }
        return {k: v for k, v in allp.items() if k in metric.params}

    def compute(self, name: str, by: str | None = None, calls: str | None = None, exact: bool = False) -> pl.DataFrame:
        """One metric. ``calls``: a temp table of this run's cursor with m_calls' columns to read instead of m_calls
        (a resample of the calls: agentobs.loadgen.compare's bootstrap); the metric's SQL is the same. ``exact``:
        exact percentiles (the per-call state) where the rollup form would read them from the hourly sketches
        (whose forms state the error bound beside each percentile: agentobs.metrics.rollup)."""
        metric = get_metric(name)
        by = by or metric.default_by
        if by not in metric.by:
            raise QueryError(f"metric {name!r} cannot be grouped by {by!r}; it supports {', '.join(metric.by)}")
        sql = metric.sql
        if calls is not None:
            if not re.fullmatch(r"m_[a-z_]+", calls) or "m_itl_gap" in sql:
                raise QueryError(f"metric {name!r} cannot read calls from {calls!r}")
            sql = re.sub(r"\bm_calls\b", calls, sql)
        if "m_itl_gap" in sql:
            self.itl_gaps()
        params = None
        if calls is None and self.calls_table == "state" and self.rollups:  # the maintained rollup where it can
            from .rollup import form

            got = form(name, *self._state_win, self.filters, by, exact=exact,
                       bucket_s=float(self.settings.metrics_bucket_s))
            if got is not None:
                sql, params = got
                self.from_rollup.add(name)
        t0 = time.perf_counter()
        try:
            df = self.cur.sql(sql, params=params if params is not None else self.params_for(metric, by)).pl()
        except duckdb.Error as e:
            raise QueryError(f"metric {name!r} failed: {str(e).splitlines()[0]}") from e
        self.timings[name] = time.perf_counter() - t0
        if "grp" in df.columns:
            df = df.rename({"grp": BY_COLUMNS[by]})
        return df

    def table(self, name: str) -> pl.DataFrame:
        """A prepared table (``m_calls``, ``m_cost``, ``m_samples``) as a DataFrame."""
        if name not in ("m_calls", "m_cost", "m_samples"):  # m_calls: a view on DuckDB (see _prepare)
            raise QueryError(f"no prepared table {name!r}")
        return self.cur.sql(f"SELECT * FROM {name}").pl()

    def close(self) -> None:
        try:
            self.cur.close()
        except duckdb.Error:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _normalize_filters(filters: dict | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in (filters or {}).items():
        if k not in FILTER_COLUMNS:
            raise QueryError(f"cannot filter on {k!r}{did_you_mean(k, FILTER_COLUMNS, 'choose one of')}")
        vals = [v] if isinstance(v, str) else list(v)
        if not vals or not all(isinstance(x, str) for x in vals):
            raise QueryError(f"filter {k!r} needs a string or a list of strings, got {v!r}")
        out[k] = vals
    return out
