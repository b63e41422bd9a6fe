"""The maintained session model: ``call_reuse``'s rows stored in the store and kept current as data arrives.

``model_calls`` holds one row per model call: the call's columns (``llm_calls``, with ``block_hashes``) and every
column ``call_reuse`` computes (agentobs/model/call_reuse.sql, read as a black box: whatever its narrow result
``fin`` selects is stored), plus ``skey``, the unit of re-derivation: the session (a call without one is its own
unit), and the hashes ``kh`` of ``skey`` and ``th`` of ``trace_id`` (integers a refresh finds a key's rows by). Metric runs read it instead of deriving ``call_reuse`` again (agentobs.metrics.prepare: ``MetricRun`` uses it
when ``current``; otherwise it derives as before).

``refresh`` brings it up to date incrementally; ``rebuild`` derives it whole (a changed setting or a new release:
the fingerprint of the settings and SQL it was built with is kept in ``model_state_meta``, and ``refresh`` rebuilds
when it differs). What an incremental refresh re-derives — every call of the touched sessions, so a late or
out-of-order call re-derives its session's tail with the rest of it:

- **New spans.** Spans are append-only rows keyed by (trace, span) in two parts (agentobs/store/segments.py): the
  table ``spans_part`` and the Parquet segments of the catalogs ``span_segments`` and ``span_merged``. ``model_state_meta`` records the
  highest ``rowid`` of ``spans_part`` read and its row count then (a store whose older rows changed — count below
  the mark differs — is rebuilt), and the highest segment ``seq`` read. New spans: the part's rows above the rowid
  mark (less those a compaction moved there from segments already read: ``span_compactions``) and the rows of the
  segments above the seq mark (a merged file's column ``_seg`` says each row's segment). The new spans' traces, widened by the request/response ids that pair gateway and engine
  spans across traces (agentobs/model/views.sql ``_engine_match``), are the traces whose calls can change; their
  calls are derived from those traces' spans alone (the views' SQL over a copy of those spans). Sessions touched:
  the sessions those calls are in now and were in before (a late agent span can move a call to a session). Two
  directories (``model_state_traces``, ``model_state_keys``: a row per trace read, per unit key stored) say which
  of them were seen before; only those are looked up in ``spans_part`` and ``model_calls`` (a new trace's spans are
  the part's rows above the mark).
- **What crosses sessions** (checked every refresh, each by a digest kept beside the state):
  the instances' activity (the instance evidence of docs/metrics.md reads every call and the engine counters of
  the call's instance): a new or changed call on an instance re-derives the sessions with a call there that started
  at or after it and whose instance evidence was computed (``churn_ratio`` not NULL); new counter samples (or process
  start times: a restart) of an instance, those with an estimate-mode shortfall on it after their previous call there
  that started after its previous last sample (any, when older samples changed);
  the KV-event index (agentobs.model.kvindex, per instance and session: a session whose removals or stored blocks
  changed is re-derived, and a changed last event time of an instance re-derives the sessions with abandoned calls
  on it); the engine config per instance (block size, prefix caching: the sessions with calls there); the end of
  the data (``data_end_s``: the sessions whose last call's ``abandoned`` flag it flips).

A refresh is one transaction: readers see the old state with its old marks or the new one with the new marks.
``current`` is what a reader checks (no writes): the marks equal the store's now.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

import duckdb

from ..config import Settings
from ..store import segments
from ..store.db import transaction
from ..store.functions import ensure as functions
from . import itl, kvindex, rollups, split_statements
from .reuse import (
    ACTIVITY_COLUMNS,
    CALL_COLUMNS,
    COUNTER_METRICS,
    RESTART_METRICS,
    reuse_sql,
    seconds_literal,
)

TABLE = "model_calls"
META = "model_state_meta"
KV_DIGEST = "model_state_kv"
KV_END = "model_state_kv_end"
CFG = "model_state_cfg"
CNT = "model_state_cnt"
# the directories (one row per key: its hash and the key): every trace whose spans the state has read, and every
# unit key (skey) model_calls holds. A refresh asks them first whether a key was seen before — a scan of one row per
# trace or session instead of one per span or call — and reads the spans or stored calls of the keys seen only
TRACES = "model_state_traces"
KEYS = "model_state_keys"
TABLES = (TABLE, META, KV_DIGEST, KV_END, CFG, CNT, TRACES, KEYS, *rollups.TABLES, *itl.TABLES)
# views.sql's views a call is made from, in dependency order (each becomes a CTE over the chosen spans)
_CALL_VIEWS = ("trace_context", "_gateway_spans", "_gateway_calls", "_engine_match", "_calls_joined", "llm_calls")
_CALL_COLS = [c.strip() for c in CALL_COLUMNS.split(",")]
# the key of re-derivation: the session; a call without one is its own unit (call_reuse derives it alone)


def skey(t: str = "") -> str:
    """The SQL of a call's unit key over alias ``t`` ('' for none)."""
    p = f"{t}." if t else ""
    return f"coalesce({p}session_id, 'call:' || {p}trace_id || '/' || {p}call_id)"


SKEY = skey()
# model_calls' own columns besides call_reuse's (a change of them is a new release of the state: it rebuilds)
_LAYOUT = "skey, kh = hash(skey), th = hash(trace_id); model_state_traces (th, trace_id), model_state_keys (kh, skey)"
# the call's row number inside call_reuse (its tie-breaks order by it): the same order whatever set is derived
_RID = "row_number() OVER (ORDER BY start_s, call_id, trace_id)"

_KV_DIGEST_SQL = """
SELECT instance, session_id, count(*) AS n, sum(h) AS h FROM (
    SELECT instance, session_id, hash(ts_s, stored_s, superseded_s, depth) AS h FROM kv_index_removals
    UNION ALL
    SELECT instance, session_id, hash('stored') FROM kv_index_sessions
) GROUP BY ALL
"""
_KV_END_SQL = "SELECT instance, epoch_us(max(ts)) / 1e6 AS last_s FROM kv_events GROUP BY instance"
_CFG_SQL = "SELECT instance, block_size, prefix_caching, kv_capacity_tokens FROM instance_config"
# the engine counters call_reuse reads (its cnt_src), per instance: how many samples and the last one's time
_CNT_METRICS = COUNTER_METRICS + RESTART_METRICS
_CNT_SQL = ("SELECT instance, count(*) AS n, max(ts) AS last_ts FROM metric_samples WHERE metric IN ("
            + ", ".join(repr(m) for m in _CNT_METRICS) + ") GROUP BY instance")


@cache
def _call_views_sql() -> str:
    """The CTEs of views.sql's call views, reading a relation ``inc_spans`` instead of ``spans``."""
    from . import views_sql

    ctes = {}
    for stmt in split_statements(views_sql()):
        m = re.search(r"^CREATE OR REPLACE VIEW (\w+) AS\s", stmt, re.M)
        if m and m.group(1) in _CALL_VIEWS:
            body = stmt[m.end():].rstrip().rstrip(";")
            ctes[m.group(1)] = re.sub(r"\bspans\b", "inc_spans", body)
    missing = [v for v in _CALL_VIEWS if v not in ctes]
    if missing:  # views.sql and this module ship together: cannot happen
        raise AssertionError(f"views.sql lacks {missing}")
    return "WITH " + ",\n".join(f"{v} AS (\n{ctes[v]}\n)" for v in _CALL_VIEWS) + "\n"


@cache
def version() -> str:
    """The SQL the state is derived with (a release that changes it rebuilds)."""
    h = hashlib.sha256()
    h.update(_LAYOUT.encode())
    for name in ("call_reuse.sql", "views.sql"):
        h.update(resources.files(__package__).joinpath(name).read_bytes())
    for name in ("rollups.py", "itl.py"):
        h.update(resources.files(__package__).joinpath(name).read_bytes())
    return h.hexdigest()[:16]


def fingerprint(settings: Settings) -> str:
    """What the stored rows depend on besides the data: the SQL and the settings call_reuse reads."""
    return json.dumps({"version": version(), "default_block_size": int(settings.default_block_size),
                       "abandoned_after_s": float(seconds_literal(settings.abandoned_after_s)),
                       "hit_tolerance_blocks": int(settings.hit_tolerance_blocks)}, sort_keys=True)


@dataclass
class Marks:
    span_rowid: int  # highest rowid of spans_part read (-1: none)
    span_count: int  # rows of spans_part then
    segment_seq: int  # highest span segment seq read (0: none)
    data_end_ns: int | None
    kv_stamp: str
    cfg: str  # digest of instance_config's block size, prefix caching and pool size
    cnt: str  # digest of the engine counters' samples per instance (_CNT_SQL)


def _marks(con) -> Marks:
    rowid, count = con.execute("SELECT coalesce(max(rowid), -1), count(*) FROM spans_part").fetchall()[0]
    end = con.execute("SELECT max(end_ns) FROM spans").fetchall()[0][0]
    cfg = con.execute(f"SELECT coalesce(sum(hash(instance, block_size, prefix_caching, kv_capacity_tokens)), 0) "
                      f"FROM ({_CFG_SQL})").fetchall()[0][0]
    cnt = con.execute(f"SELECT coalesce(sum(hash(instance, n, last_ts)), 0) FROM ({_CNT_SQL})").fetchall()[0][0]
    return Marks(int(rowid), int(count), segments.next_seq(con) - 1, end, kvindex.stamp(con), str(cfg), str(cnt))


def _stored_marks(con) -> tuple[str, Marks] | None:
    try:
        rows = con.execute(f"SELECT fingerprint, span_rowid, span_count, segment_seq, data_end_ns, kv_stamp, cfg, cnt "
                           f"FROM {META}").fetchall()
    except (duckdb.CatalogException, duckdb.BinderException):  # none, or one written before a mark was added
        return None
    if len(rows) != 1:
        return None
    fp, *m = rows[0]
    return fp, Marks(*m)


def current(con, settings: Settings) -> bool:
    """Whether ``model_calls`` is that of the store as it is now, derived with these settings (reads only)."""
    stored = _stored_marks(con)
    return stored is not None and stored[0] == fingerprint(settings) and stored[1] == _marks(con)


def status(con, settings: Settings) -> str:
    """One line: whether the state is current, and if not why (reads only)."""
    stored = _stored_marks(con)
    if stored is None:
        return "no maintained session model: metric runs derive it (agentobs model refresh builds it)"
    fp, old = stored
    n = con.execute(f"SELECT count(*) FROM {TABLE}").fetchall()[0][0]
    if fp != fingerprint(settings):
        return f"stale: {n:,} calls derived with other settings or SQL (agentobs model rebuild)"
    now = _marks(con)
    if now != old:
        what = [w for w, a, b in (("spans", (old.span_rowid, old.span_count, old.segment_seq),
                                           (now.span_rowid, now.span_count, now.segment_seq)),
                                  ("kv events", old.kv_stamp, now.kv_stamp), ("engine config", old.cfg, now.cfg),
                                  ("engine counters", old.cnt, now.cnt))
                if a != b]
        return f"stale: {n:,} calls; new {', '.join(what)} since (agentobs model refresh)"
    return f"current: {n:,} calls ({old.span_count:,} spans read)"


@dataclass
class Refreshed:
    mode: str  # 'rebuild' | 'incremental' | 'current' | 'deferred' (over its budget: rolled back)
    calls: int  # rows in model_calls after
    derived: int  # rows derived by this refresh
    sessions: int  # units (sessions) re-derived
    seconds: float
    reason: str = ""
    steps: dict = field(default_factory=dict)  # seconds per step (an incremental refresh's)


_DATA_END = "(SELECT max(end_ns) FROM spans)"


def _derive_sql(src: str, kv_index: bool, settings: Settings, fin_cols: list[str], data_end_ns: int | None = None,
                activity: str | None = None) -> str:
    """call_reuse over the calls in temp table ``src`` (columns CALL_COLUMNS), as model_calls' rows. ``data_end_ns``:
    the end of the data already read (the marks), so that a few calls do not scan every span for it. ``activity``:
    every call of the store when ``src`` holds only some (reuse_sql)."""
    call = ", ".join(f"cs.{c}" for c in _CALL_COLS)
    own = ", ".join(f"r.{c}" for c in fin_cols)
    sql = _reuse(src, settings, call, own, kv_index, activity)
    if data_end_ns is not None:
        sql = sql.replace(_DATA_END, f"CAST({int(data_end_ns)} AS BIGINT)")
    return sql


def _reuse(src: str, settings: Settings, call: str, own: str, kv_index: bool, activity: str | None = None) -> str:
    return reuse_sql(src, str(int(settings.default_block_size)),
                     f"{skey('cs')} AS skey, hash({skey('cs')}) AS kh, hash(cs.trace_id) AS th, {call}, {own}",
                     "JOIN calls_src cs ON cs.rid = r.rid",
                     abandoned_after_s=settings.abandoned_after_s, has_rid=True, rid="rid", narrow=True,
                     kv_index=kv_index, hit_tolerance_blocks=int(settings.hit_tolerance_blocks), activity=activity,
                     activity_weighted=activity is not None)


_FIN: dict[tuple, list[str]] = {}


def _fin_columns(cur, kv_index: bool, settings: Settings) -> list[str]:
    """The columns call_reuse computes (its narrow result less rid and the call columns it repeats); a function of
    the SQL and the settings, so asked of DuckDB once per process."""
    key = (version(), kv_index, fingerprint(settings))
    if key not in _FIN:
        _FIN[key] = _ask_fin_columns(cur, kv_index, settings)
    return _FIN[key]


def _ask_fin_columns(cur, kv_index: bool, settings: Settings) -> list[str]:
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_empty AS SELECT 0::BIGINT AS rid, {CALL_COLUMNS} FROM llm_calls "
                "LIMIT 0")
    cols = [r[0] for r in cur.execute("DESCRIBE " + reuse_sql(
        "inc_empty", str(int(settings.default_block_size)), abandoned_after_s=settings.abandoned_after_s,
        has_rid=True, rid="rid", narrow=True, kv_index=kv_index,
        hit_tolerance_blocks=int(settings.hit_tolerance_blocks))).fetchall()]
    cur.execute("DROP TABLE inc_empty")
    return [c for c in cols if c != "rid" and c not in _CALL_COLS]


def _write_marks(cur, settings: Settings, marks: Marks, mode: str, seconds: float) -> None:
    cur.execute(f"CREATE OR REPLACE TABLE {META} (fingerprint VARCHAR, span_rowid BIGINT, span_count BIGINT, "
                "segment_seq BIGINT, data_end_ns BIGINT, kv_stamp VARCHAR, cfg VARCHAR, cnt VARCHAR, mode VARCHAR, "
                "refreshed_at TIMESTAMP, seconds DOUBLE)")
    cur.execute(f"INSERT INTO {META} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now()::TIMESTAMP, ?)",
                [fingerprint(settings), marks.span_rowid, marks.span_count, marks.segment_seq, marks.data_end_ns,
                 marks.kv_stamp, marks.cfg, marks.cnt, mode, seconds])
    cur.execute(f"CREATE OR REPLACE TABLE {KV_DIGEST} AS {_KV_DIGEST_SQL}")
    cur.execute(f"CREATE OR REPLACE TABLE {KV_END} AS {_KV_END_SQL}")
    cur.execute(f"CREATE OR REPLACE TABLE {CFG} AS {_CFG_SQL}")
    cur.execute(f"CREATE OR REPLACE TABLE {CNT} AS {_CNT_SQL}")


class _OverBudget(Exception):
    """A refresh ran past its time budget (it was rolled back)."""


class _Budget:
    """A refresh's time budget (``refresh(budget_s=)``): past the deadline the statement running on a registered
    connection is interrupted and the next one is not started (``check``); the transaction rolls back."""

    def __init__(self, budget_s: float | None):
        self.deadline = None if budget_s is None else time.monotonic() + max(float(budget_s), 0.0)
        self.curs: list = []
        self.hit = False
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        if self.deadline is not None:
            self.timer = threading.Timer(max(self.deadline - time.monotonic(), 0.0), self._fire)
            self.timer.daemon = True
            self.timer.start()

    def watch(self, cur) -> None:
        with self.lock:
            self.curs.append(cur)
            hit = self.hit
        if hit:
            cur.interrupt()

    def _fire(self) -> None:
        with self.lock:
            self.hit = True
            curs = list(self.curs)
        for c in curs:
            try:
                c.interrupt()
            except Exception:  # noqa: BLE001 - nothing running on it, or it is closed
                pass

    def check(self) -> None:
        if self.deadline is not None and (self.hit or time.monotonic() >= self.deadline):
            raise _OverBudget

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


_NO_BUDGET = _Budget(None)


def _transaction(con, fn, budget: _Budget = _NO_BUDGET):
    functions(con)  # agentobs_cumsum (the ITL gaps): a registration inside the transaction would abort it
    cur = con.cursor()
    budget.watch(cur)
    try:
        with transaction(cur):
            out = fn(cur)
            budget.check()
    finally:
        cur.close()
    return out


def rebuild(con: duckdb.DuckDBPyConnection, settings: Settings | None = None, reason: str = "asked",
            budget_s: float | None = None) -> Refreshed:
    """Derive ``model_calls`` whole (and the marks and digests) on a read-write connection. ``budget_s``: as
    ``refresh``'s."""
    budget = _Budget(budget_s)
    try:
        return _rebuild(con, settings if settings is not None else Settings(), reason, budget)
    except (_OverBudget, duckdb.InterruptException):
        return _deferred(con, budget_s)
    finally:
        budget.stop()


def _deferred(con, budget_s) -> Refreshed:
    try:
        n = con.execute(f"SELECT count(*) FROM {TABLE}").fetchall()[0][0]
    except duckdb.Error:
        n = 0
    return Refreshed("deferred", n, 0, 0, float(budget_s or 0.0),
                     f"stopped at its budget of {budget_s} s and rolled back: the next refresh catches up")


def _rebuild(con, settings: Settings, reason: str, budget: _Budget) -> Refreshed:
    t0 = time.perf_counter()
    budget.watch(con)
    kvindex.refresh(con)
    budget.check()

    def work(cur):
        cur = _Timed(cur, {}, budget)
        marks = _marks(cur)
        kv = kvindex.usable(cur)
        fin = _fin_columns(cur, kv, settings)
        cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_src AS SELECT {_RID} AS rid, {CALL_COLUMNS} FROM llm_calls")
        cur.execute(f"CREATE OR REPLACE TABLE {TABLE} AS {_derive_sql('inc_src', kv, settings, fin)}")
        rollups.rebuild(cur, TABLE)
        itl.rebuild(cur, TABLE)
        cur.execute(f"CREATE OR REPLACE TABLE {TRACES} AS SELECT hash(trace_id) AS th, trace_id FROM "
                    "(SELECT DISTINCT trace_id FROM spans WHERE trace_id IS NOT NULL)")
        cur.execute(f"CREATE OR REPLACE TABLE {KEYS} AS SELECT hash(skey) AS kh, skey FROM (SELECT DISTINCT skey FROM {TABLE})")
        n = cur.execute(f"SELECT count(*) FROM {TABLE}").fetchall()[0][0]
        units = cur.execute(f"SELECT count(DISTINCT skey) FROM {TABLE}").fetchall()[0][0]
        cur.execute("DROP TABLE inc_src")
        _write_marks(cur, settings, marks, "rebuild", time.perf_counter() - t0)
        return n, units

    n, units = _transaction(con, work, budget)
    return Refreshed("rebuild", n, n, units, time.perf_counter() - t0, reason)


def refresh(con: duckdb.DuckDBPyConnection, settings: Settings | None = None, budget_s: float | None = None
            ) -> Refreshed:
    """Bring ``model_calls`` up to date: nothing when current, a rebuild when there is none or it was derived with
    other settings or SQL (or older spans changed), else an incremental update of the touched sessions.
    ``budget_s``: the most seconds it may take (``agentobs collect`` at stop); past it the statement running is
    interrupted and the transaction rolled back — the state stays as it was, with its marks, and the next refresh
    catches up — and the result's mode is ``deferred``."""
    budget = _Budget(budget_s)
    try:
        return _refresh(con, settings if settings is not None else Settings(), budget)
    except (_OverBudget, duckdb.InterruptException):
        return _deferred(con, budget_s)
    finally:
        budget.stop()


def _refresh(con, settings: Settings, budget: _Budget) -> Refreshed:
    t0 = time.perf_counter()
    budget.watch(con)
    stored = _stored_marks(con)
    if stored is None:
        return _rebuild(con, settings, "no maintained state yet", budget)
    if stored[0] != fingerprint(settings):
        return _rebuild(con, settings, "settings or SQL changed since it was built", budget)
    old = stored[1]
    below = con.execute("SELECT count(*) FROM spans_part WHERE rowid <= ?", [old.span_rowid]).fetchall()[0][0]
    if below != old.span_count:
        return _rebuild(con, settings, "spans already read changed", budget)
    steps: dict[str, float] = {"check": time.perf_counter() - t0}
    t = time.perf_counter()
    kvindex.refresh(con)
    steps["kv_index"] = time.perf_counter() - t
    t = time.perf_counter()
    now = _marks(con)
    steps["marks_read"] = time.perf_counter() - t
    if now == old:
        n = con.execute(f"SELECT count(*) FROM {TABLE}").fetchall()[0][0]
        return Refreshed("current", n, 0, 0, time.perf_counter() - t0)

    done = []

    def work(cur):
        out = _incremental(cur, settings, old, now, t0, steps, budget)
        done.append(time.perf_counter())
        return out

    budget.check()
    n, derived, units = _transaction(con, work, budget)
    # the commit: the write-ahead log of the changes, and an automatic checkpoint when the log has grown past
    # DuckDB's checkpoint_threshold (every few batches: then every changed row group is written to the file)
    steps["commit"] = time.perf_counter() - done[0]
    return Refreshed("incremental", n, derived, units, time.perf_counter() - t0, steps=steps)


class _Timed:
    """A cursor that records the seconds of each statement under a label (Refreshed.steps)."""

    def __init__(self, cur, steps: dict[str, float], budget: _Budget = _NO_BUDGET):
        self.cur, self.steps, self.label, self.budget = cur, steps, "other", budget

    def execute(self, sql, params=None):
        self.budget.check()
        t = time.perf_counter()
        out = self.cur.execute(sql, params) if params is not None else self.cur.execute(sql)
        self.steps[self.label] = self.steps.get(self.label, 0.0) + time.perf_counter() - t
        return out

    def step(self, label: str) -> None:
        self.label = label


def _incremental(cur, settings: Settings, old: Marks, now: Marks, t0: float, steps: dict, budget: _Budget
                 ) -> tuple[int, int, int]:
    cur = _Timed(cur, steps, budget)
    cur.step("new_spans")
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_new AS {_new_spans_sql(cur, old)}")
    # traces whose calls can change: the new spans' traces and those paired with them by request/response id
    # (T1); their calls are derived from the spans of T1 and of the traces paired with T1 (T2), which is every
    # span _engine_match reads for a call of T1
    cur.execute("CREATE OR REPLACE TEMP TABLE inc_t1 AS SELECT DISTINCT trace_id FROM inc_new")
    _widen(cur, "inc_new", "inc_t1")
    # the traces of T1 seen before (in the directory: a span of theirs was read) and the new ones whose new spans
    # are all in spans_part (none from a Parquet segment, where a span can come twice): every span of such a trace
    # is a row of spans_part above the mark, so its spans need no scan of the whole table
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_t1o AS {_by_hash('th', 'trace_id', 'inc_t1', TRACES, 'trace_id')}")
    cur.execute("""CREATE OR REPLACE TEMP TABLE inc_tn AS SELECT trace_id FROM inc_new WHERE part
        EXCEPT SELECT trace_id FROM inc_new WHERE NOT part EXCEPT SELECT trace_id FROM inc_t1o""")
    cur.execute("CREATE OR REPLACE TEMP TABLE inc_ts AS SELECT trace_id FROM inc_t1 EXCEPT SELECT trace_id FROM inc_tn")
    cur.step("calls")
    # the spans of T1: those of the traces seen before (and of new traces with segment rows) by a scan of the
    # trace id, those of the other new traces from spans_part's rows above the mark; the traces paired with them
    # (T2 less T1) are read from them, and their spans added (a second scan only when there are such traces).
    # ``spans`` is a view (table part + segments): no rowid
    if _count(cur, "inc_ts"):
        _spans_of(cur, "inc_spans", "inc_ts", create=True)
    else:
        cur.execute("CREATE OR REPLACE TEMP TABLE inc_spans AS SELECT * FROM spans_part LIMIT 0")
    if _count(cur, "inc_tn"):
        cur.execute(f"INSERT INTO inc_spans SELECT * FROM spans_part WHERE {_above_mark(cur, old)} "
                    "AND trace_id IN (SELECT trace_id FROM inc_tn)")
    cur.execute("CREATE OR REPLACE TEMP TABLE inc_t2 AS SELECT trace_id FROM inc_t1")
    if _widen(cur, "inc_spans", "inc_t2"):
        cur.execute("DELETE FROM inc_t2 WHERE trace_id IN (SELECT trace_id FROM inc_t1)")
        _spans_of(cur, "inc_spans", "inc_t2", create=False)
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_calls AS {_call_views_sql()}"
                f"SELECT {CALL_COLUMNS} FROM llm_calls WHERE trace_id IN (SELECT trace_id FROM inc_t1)")
    # the sessions to re-derive
    cur.step("sessions")
    ab = float(seconds_literal(settings.abandoned_after_s))
    # the stored calls of T1 (of its traces seen before: a stored call's trace is that of a span read): their row
    # ids by a scan of the trace's hash alone (th: an integer), then their sessions by row id
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_old AS {_by_hash('th', 'trace_id', 'inc_t1o')}"
                if _count(cur, "inc_t1o") else "CREATE OR REPLACE TEMP TABLE inc_old AS SELECT 0::BIGINT AS r LIMIT 0")
    parts = [f"SELECT {SKEY} AS skey FROM inc_calls",
             f"SELECT skey FROM {TABLE} WHERE rowid IN (SELECT r FROM inc_old)"]
    # KV: sessions whose removals or stored blocks changed
    parts.append(f"""SELECT coalesce(a.session_id, b.session_id) FROM ({_KV_DIGEST_SQL}) a
        FULL JOIN {KV_DIGEST} b ON a.instance = b.instance AND a.session_id = b.session_id
        WHERE a.n IS DISTINCT FROM b.n OR a.h IS DISTINCT FROM b.h""")
    # KV: an instance's last event moved: its abandoned calls' rent runs to it
    moved = [r[0] for r in cur.execute(
        f"""SELECT coalesce(a.instance, b.instance) FROM ({_KV_END_SQL}) a FULL JOIN {KV_END} b USING (instance)
            WHERE a.last_s IS DISTINCT FROM b.last_s""").fetchall()]
    if moved:
        cur.execute("CREATE OR REPLACE TEMP TABLE inc_inst AS SELECT unnest(?::VARCHAR[]) AS instance", [moved])
        parts.append(f"SELECT skey FROM {TABLE} WHERE abandoned AND instance IN (SELECT instance FROM inc_inst)")
        # and its instance evidence: a removal on the instance rules out "never evicted" (no_churn)
        parts.append(f"SELECT skey FROM {TABLE} WHERE churn_ratio IS NOT NULL AND instance IN (SELECT instance FROM inc_inst)")
    # engine config: block size or prefix caching of an instance changed
    changed = [r[0] for r in cur.execute(
        f"""SELECT coalesce(a.instance, b.instance) FROM ({_CFG_SQL}) a FULL JOIN {CFG} b USING (instance)
            WHERE a.block_size IS DISTINCT FROM b.block_size OR a.prefix_caching IS DISTINCT FROM b.prefix_caching
               OR a.kv_capacity_tokens IS DISTINCT FROM b.kv_capacity_tokens"""
    ).fetchall()]
    if changed:
        cur.execute("CREATE OR REPLACE TEMP TABLE inc_cfg AS SELECT unnest(?::VARCHAR[]) AS instance", [changed])
        parts.append(f"SELECT skey FROM {TABLE} WHERE instance IN (SELECT instance FROM inc_cfg)")
    # the instances' activity (instance evidence): a new or changed call on an instance, from its start on. Only
    # calls on an instance with a pool size have evidence (churn_ratio; call_reuse.sql ie_c), and an instance whose
    # pool size changed has every session re-derived above: without any such instance nothing is scanned
    if changed or cur.execute("SELECT count(*) FROM instance_config WHERE kv_capacity_tokens > 0").fetchall()[0][0]:
        parts.append(f"""SELECT m.skey FROM {TABLE} m JOIN (
            SELECT instance, min(start_s) AS t FROM (
                SELECT instance, start_s FROM inc_calls
                UNION ALL SELECT instance, start_s FROM {TABLE} WHERE rowid IN (SELECT r FROM inc_old))
            GROUP BY instance) n ON n.instance = m.instance
        WHERE m.churn_ratio IS NOT NULL AND m.start_s >= n.t""")
    # new engine counter samples of an instance: the calls that started after its previous last sample (all of its
    # calls when samples older than that changed)
    if now.cnt != old.cnt:
        insts, since = [], []
        for inst, old_n, old_last in cur.execute(
                f"""SELECT coalesce(a.instance, b.instance), b.n, epoch_us(b.last_ts) / 1e6 FROM ({_CNT_SQL}) a
                    FULL JOIN {CNT} b USING (instance)
                    WHERE a.n IS DISTINCT FROM b.n OR a.last_ts IS DISTINCT FROM b.last_ts""").fetchall():
            kept = old_n is not None and cur.execute(
                "SELECT count(*) FROM metric_samples WHERE instance = ? AND epoch_us(ts) / 1e6 <= ? "
                "AND list_contains(?, metric)", [inst, old_last, list(_CNT_METRICS)]).fetchall()[0][0] == old_n
            insts.append(inst)
            since.append(old_last if kept else None)
        cur.execute("CREATE OR REPLACE TEMP TABLE inc_cnt AS SELECT unnest(?::VARCHAR[]) AS instance, "
                    "unnest(?::DOUBLE[]) AS t", [insts, since])
        # (the calls whose evidence the samples can change: the estimate-mode shortfalls on their previous call's
        # instance — a restart is evidence for them, pool size known or not; the instance evidence, churn_ratio not
        # NULL, is for some of them)
        parts.append(f"""SELECT m.skey FROM {TABLE} m JOIN inc_cnt n ON n.instance = m.instance
            WHERE m.mode = 'estimate' AND m.prev_instance = m.instance AND m.shortfall_tokens > 0
              AND (n.t IS NULL OR m.start_s > n.t)""")
    if now.data_end_ns != old.data_end_ns and now.data_end_ns is not None:
        # the end of the data moved: the last calls whose abandoned flag it flips. Every stored flag is that of the
        # old end (each refresh re-derives the flips of its own), and the end only grows (older spans changed: a
        # rebuild), so they end in (old end − abandoned_after_s, new end − abandoned_after_s]: a range on end_s
        # (a filter of the scan, widened by a second against rounding) before the exact test
        rng = f"end_s <= {now.data_end_ns / 1e9 - ab + 1.0!r}"
        if old.data_end_ns is not None:
            rng += f" AND end_s > {old.data_end_ns / 1e9 - ab - 1.0!r}"
        parts.append(f"SELECT skey FROM {TABLE} WHERE {rng} AND is_last AND session_id IS NOT NULL "
                     f"AND abandoned <> ({now.data_end_ns} / 1e9 - end_s >= {ab!r})")
    cur.execute("CREATE OR REPLACE TEMP TABLE inc_keys AS SELECT DISTINCT skey FROM (" + "\nUNION ALL\n".join(parts)
                + ") WHERE skey IS NOT NULL")
    cur.step("inputs")
    # the stored rows of those sessions: the keys model_calls holds (the directory), then their rows' ids by a scan
    # of the key's hash (one narrow column) — none when no key was stored before
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_kf AS SELECT r, skey FROM "
                f"({_by_hash('kh', 'skey', 'inc_keys', KEYS, 'rowid AS r, skey')})")
    found = _count(cur, "inc_kf")
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_rows AS {_by_hash('kh', 'skey', 'inc_kf')}"
                if found else "CREATE OR REPLACE TEMP TABLE inc_rows AS SELECT 0::BIGINT AS r LIMIT 0")
    # their calls: the fresh ones of T1, the stored call columns of the others (their traces did not change)
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE inc_src AS SELECT {_RID} AS rid, * FROM (
        SELECT {CALL_COLUMNS} FROM inc_calls WHERE {SKEY} IN (SELECT skey FROM inc_keys)
        UNION ALL
        SELECT {CALL_COLUMNS} FROM {TABLE}
        WHERE rowid IN (SELECT r FROM inc_rows) AND trace_id NOT IN (SELECT trace_id FROM inc_t1))""")
    kv = kvindex.usable(cur)
    fin = _fin_columns(cur, kv, settings)
    # every read of model_calls and model_itl_gap by row id comes before the transaction changes them (after a
    # change, such a read scans the table whole)
    cur.step("delete")
    cur.execute("CREATE OR REPLACE TEMP TABLE inc_del AS SELECT r FROM inc_rows UNION SELECT r FROM inc_old")
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_gone AS SELECT * FROM {TABLE} WHERE rowid IN (SELECT r FROM inc_del)")
    cur.step("derive")
    # the instances' activity their instance evidence reads (the stored rows left — less those being replaced: the
    # DELETE comes after — and the calls being derived), bounded in time: _activity_sql
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_act AS {_activity_sql()}")
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_out AS "
                f"{_derive_sql('inc_src', kv, settings, fin, now.data_end_ns, activity='inc_act')}")
    cur.step("itl_gaps")
    itl.apply_delta(cur, TABLE, "inc_del", "inc_gone", "inc_out")
    cur.step("delete")
    cur.execute(f"DELETE FROM {TABLE} WHERE rowid IN (SELECT r FROM inc_del)")
    cur.step("derive")
    cur.execute(f"INSERT INTO {TABLE} SELECT * FROM inc_out")
    cur.step("rollups")
    rollups.apply_delta(cur, "inc_gone", "inc_out")
    cur.step("directories")
    # the keys of the re-derived units are those of their new rows (a unit whose calls all moved has none); the
    # traces of the new spans are seen now
    if found:
        cur.execute(f"DELETE FROM {KEYS} WHERE rowid IN (SELECT r FROM inc_kf)")
    cur.execute(f"INSERT INTO {KEYS} SELECT hash(skey), skey FROM (SELECT DISTINCT skey FROM inc_out)")
    cur.execute(f"""INSERT INTO {TRACES} SELECT hash(trace_id), trace_id FROM (
        SELECT trace_id FROM inc_new WHERE trace_id IS NOT NULL EXCEPT SELECT trace_id FROM inc_t1o)""")
    cur.step("other")
    derived = cur.execute("SELECT count(*) FROM inc_src").fetchall()[0][0]
    units = cur.execute("SELECT count(*) FROM inc_keys").fetchall()[0][0]
    n = cur.execute(f"SELECT count(*) FROM {TABLE}").fetchall()[0][0]
    for t in ("inc_new", "inc_t1", "inc_t1o", "inc_tn", "inc_ts", "inc_kf", "inc_t2", "inc_spans", "inc_calls", "inc_keys", "inc_src", "inc_old",
              "inc_rows", "inc_del", "inc_inst", "inc_cfg", "inc_cnt", "inc_act", "inc_gone", "inc_out"):
        cur.execute(f"DROP TABLE IF EXISTS {t}")
    cur.step("marks")
    _write_marks(cur, settings, now, "incremental", time.perf_counter() - t0)
    return n, derived, units


def _activity_sql() -> str:
    """The activity (``ACTIVITY_COLUMNS`` and the weight ``n``, reuse_sql ``activity_weighted``) the instance evidence
    of the calls in ``inc_src`` reads, per instance they are on, without a row per call it cannot reach. A derived
    call ``c`` with evidence has its previous call on the same instance, in the same session, so in ``inc_src``: the
    gap ``[t0(prev) end, t0(c))`` lies inside ``[lo, hi]``, the first and last start of ``inc_src``'s calls on the
    instance. The gap's churn (call_reuse.sql ``ie_span``) reads the calls that start in it: those starting in
    ``[lo, hi]``, one row each. The allocation since the engine started (``ie_before``: the calls that started before
    ``c``, their count and the first one's cached tokens) also needs those before ``lo``: one row per instance stands
    for them, ``n`` calls, their allocation (computed prompt + output tokens, as ``ie_act`` sums it) in
    ``output_tokens`` with ``prompt_tokens`` 0, the instance's first call's cached tokens, their latest start (before
    every other row's) and no end (no gap holds it). The stored rows are those of ``model_calls`` less ``inc_del``; only
    instances with a known pool size have evidence (``ie_c``), so the other instances' stored calls are not read."""
    cols = ACTIVITY_COLUMNS
    stored = f"(SELECT {cols} FROM {TABLE} WHERE instance IN (SELECT instance FROM b) AND rowid NOT IN (SELECT r FROM inc_del))"
    return f"""WITH b AS (SELECT instance, min(start_s) AS lo, max(start_s) AS hi FROM inc_src
            WHERE instance IN (SELECT instance FROM instance_config WHERE kv_capacity_tokens > 0) GROUP BY instance),
        s AS NOT MATERIALIZED (SELECT s.*, b.lo, b.hi FROM {stored} s JOIN b USING (instance))
        SELECT {cols}, CAST(1 AS BIGINT) AS n FROM s WHERE start_s BETWEEN lo AND hi
        UNION ALL SELECT {cols}, CAST(1 AS BIGINT) AS n FROM inc_src
        UNION ALL SELECT instance, max(start_s), CAST(NULL AS DOUBLE), CAST(0 AS BIGINT), arg_min(coalesce(cached_tokens, 0), start_s),
                         CAST(sum(greatest(coalesce(prompt_tokens, 0) - coalesce(cached_tokens, 0), 0)
                                  + coalesce(output_tokens, 0)) AS BIGINT),
                         CAST(NULL AS VARCHAR), count(*)
        FROM s WHERE start_s < lo GROUP BY instance"""


def _by_hash(h: str, key: str, keys: str, table: str = TABLE, cols: str = "rowid AS r") -> str:
    """The rows (``cols``; default their row ids ``r``) of ``table`` (model_calls, or a directory) whose ``key`` is in
    temp table ``keys``: found by a scan of the key's hash ``h`` (an integer column: a string key's scan hashes every
    string), the key compared on those rows."""
    return (f"SELECT * EXCLUDE (_k) FROM (SELECT {cols}, {key} AS _k FROM {table} "
            f"WHERE {h} IN (SELECT hash({key}) FROM {keys})) WHERE _k IN (SELECT {key} FROM {keys})")


def _count(cur, table: str) -> int:
    return int(cur.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])


def _new_spans_sql(cur, old: Marks) -> str:
    """The spans stored since ``old`` (trace_id, role, request_id, response_id): spans_part's rows above the rowid
    mark, less the rowid ranges of compactions of segments all read already, and the rows of the segments above
    the seq mark. A span can come twice (a retried export): its trace is derived once all the same."""
    cols = "trace_id, role, request_id, response_id"
    sql = f"SELECT {cols}, true AS part FROM spans_part WHERE {_above_mark(cur, old)}"
    seg = segments.since_sql(cur, f"{cols}, false AS part", old.segment_seq)  # tail segments and merged files' rows above the mark
    if seg:
        sql += f" UNION ALL {seg}"
    return sql


def _above_mark(cur, old: Marks) -> str:
    """The condition on spans_part's rows stored since ``old``: above the rowid mark, less the rowid ranges of
    compactions of segments all read already."""
    skip = cur.execute("SELECT rowid_lo, rowid_hi FROM span_compactions WHERE max_seq <= ? AND rowid_lo > ?",
                       [old.segment_seq, old.span_rowid]).fetchall()
    return f"rowid > {int(old.span_rowid)}" + "".join(f" AND rowid NOT BETWEEN {int(lo)} AND {int(hi)}" for lo, hi in skip)


def _spans_of(cur, out: str, traces: str, create: bool) -> None:
    """Into temp table ``out`` (made, or added to), every span of the traces in temp table ``traces``: those of
    ``spans_part`` found by a scan of its ``trace_id`` alone and then read by row id (a semi join on the whole row
    would read every column of every row), and those of the Parquet files (merged and tail: segments.tail_sql) by
    trace id."""
    cur.execute(f"CREATE OR REPLACE TEMP TABLE inc_sr AS SELECT rowid AS r FROM spans_part "
                f"WHERE trace_id IN (SELECT trace_id FROM {traces})")
    sql = "SELECT * FROM spans_part WHERE rowid IN (SELECT r FROM inc_sr)"
    tail = segments.tail_sql(cur)
    if tail is not None:
        sql += f" UNION ALL SELECT * FROM ({tail}) WHERE trace_id IN (SELECT trace_id FROM {traces})"
    cur.execute(f"CREATE OR REPLACE TEMP TABLE {out} AS {sql}" if create else f"INSERT INTO {out} {sql}")
    cur.execute("DROP TABLE inc_sr")


def _widen(cur, spans_rel: str, traces: str) -> int:
    """Add to temp table ``traces`` the traces of spans paired, by request/response id, with spans of ``spans_rel``
    (an engine span's request id = a gateway span's response id, whatever their traces: views.sql _engine_match).
    Returns the number of traces added."""
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE inc_ids AS SELECT DISTINCT id FROM (
        SELECT request_id AS id FROM {spans_rel} WHERE role = 'engine' UNION ALL
        SELECT response_id FROM {spans_rel} WHERE role = 'gateway') WHERE id IS NOT NULL""")
    added = 0
    if cur.execute("SELECT count(*) FROM inc_ids").fetchall()[0][0]:
        added = cur.execute(f"""INSERT INTO {traces} SELECT DISTINCT trace_id FROM spans
            WHERE ((role = 'engine' AND request_id IN (SELECT id FROM inc_ids))
                OR (role = 'gateway' AND response_id IN (SELECT id FROM inc_ids)))
              AND trace_id NOT IN (SELECT trace_id FROM {traces})""").fetchall()[0][0]
    cur.execute("DROP TABLE inc_ids")
    return int(added)
