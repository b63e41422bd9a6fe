"""ITL gap attribution (METRICS.md §6): the per-gap relation ``m_itl_gap`` (``itl_gaps.sql``) and its parameters."""

from __future__ import annotations

from ..config import Settings
from ..errors import QueryError


def itl_gap_params(s: Settings) -> dict:
    """The parameters of m_itl_gap (agentobs/model/itl_gaps.sql) from settings."""
    mode = str(s.itl_tail_threshold)
    if mode not in ("slo", "p99"):
        raise QueryError(f"setting itl_tail_threshold must be 'slo' or 'p99', got {mode!r}")
    return {"itl_tail_mode": mode, "itl_slo_ms": float(s.itl_slo_ms),
            "long_prefill_tokens": int(s.long_prefill_tokens)}


def itl_gaps_sql() -> str:
    """The SELECT of m_itl_gap (agentobs/model/itl_gaps.sql): MetricRun.itl_gaps stores it, Context.with_itl_gaps
    inlines it."""
    from importlib import resources

    return resources.files(__package__).joinpath("itl_gaps.sql").read_text()


# -- the maintained gap attribution (kept with the session model, agentobs.model.state) --------------------------
# ``model_itl_gap``: one row per inter-token gap of every streamed call in ``model_calls`` (trace_id, call_id, i),
# with the call's instance, model and start, the gap g_ms and its time span [ta, tb] (itl_gaps.sql's), the cells
# c0 = ⌊ta/5⌋, c1 = ⌊tb/5⌋ it spans, and the prefill of another call on the instance that overlaps it computing the
# most tokens P − C (off_call_id, off_computed; a tie: the greater call id; NULL: none overlaps) over every call of
# the store. What depends on the window or the settings — the tail threshold (a p99 of the window's gaps), the
# tail flag, long_overlap (off_computed ≥ long_prefill_tokens) — is applied when a metric run reads it
# (``state_read_sql``): for a run without attribute filters (its prefills are every call) the result equals
# itl_gaps.sql's, whose pairs are formed for the tail gaps only; here every gap carries its attribution, so no
# run forms pairs. A refresh re-derives the gaps of the calls it re-derives and re-attributes the stored gaps a
# changed call's prefill window (before or after) overlaps (``refresh_sql``).
TABLE = "model_itl_gap"
# one row: bounds on every stored call's time to first token and negative queue time (the reach of a prefill window
# from its call's start, for the candidate prefills of a refresh); raised by each refresh, never lowered (a bound
# above the true one only adds candidates the overlap test drops), made exact by a rebuild
BOUNDS = "model_itl_bounds"
TABLES = (TABLE, BOUNDS)
CELL_S = 5  # the overlap joins' cell, as in itl_gaps.sql
_BOUNDS_SQL = "SELECT coalesce(max(ttft_s), 0) AS max_ttft_s, coalesce(-least(min(queue_s), 0), 0) AS max_neg_queue_s FROM {calls}"

# the gaps of the streamed calls in relation {calls} (model_calls' columns); tb as itl_gaps.sql computes it
_GAPS_SQL = """
SELECT trace_id, call_id, i, instance, model, start_s, g_ms, tb - g_ms / 1000.0 AS ta, tb,
       CAST(floor((tb - g_ms / 1000.0) / {cell}) AS BIGINT) AS c0, CAST(floor(tb / {cell}) AS BIGINT) AS c1
FROM (
    SELECT trace_id, call_id, i, instance, model, start_s, g_ms, t1 + cs[i] / 1000.0 AS tb
    FROM (
        SELECT trace_id, call_id, instance, model, start_s, t1, cs,
               unnest(itl_ms) AS g_ms, generate_subscripts(itl_ms, 1) AS i
        FROM (SELECT *, agentobs_cumsum(itl_ms) AS cs FROM (
            SELECT trace_id, call_id, instance, model, start_s, start_s + ttft_s AS t1, itl_ms FROM {calls}
            WHERE {streamed}))
    )
)
"""
# the calls with gaps (a stored call has rows in model_itl_gap exactly when this holds of its row)
_STREAMED = "itl_ms IS NOT NULL AND ttft_s IS NOT NULL AND len(itl_ms) > 0"

# the prefill windows of relation {calls} (itl_gaps.sql's ``prefills``, every call)
_PREFILLS_SQL = """
SELECT call_id AS p_call_id, instance, start_s + coalesce(queue_s, 0) AS pa, start_s + ttft_s AS pb,
       prompt_tokens - coalesce(cached_tokens, 0) AS computed, start_s AS s
FROM {calls}
WHERE ttft_s IS NOT NULL AND prompt_tokens IS NOT NULL AND ttft_s > coalesce(queue_s, 0)
"""

# the columns _PREFILLS_SQL reads
_PREFILL_COLS = "call_id, instance, start_s, queue_s, ttft_s, prompt_tokens, cached_tokens"

# the attribution of the gaps in relation {gaps} (_GAPS_SQL's columns) to the prefills in relation {pre}
# (_PREFILLS_SQL's): itl_gaps.sql's tail_ov and per_gap, for every gap
_ATTR_SQL = """
WITH pcells AS (
    SELECT *, unnest(generate_series(CAST(floor(pa / {cell}) AS BIGINT), CAST(floor(pb / {cell}) AS BIGINT))) AS cell
    FROM {pre} WHERE instance IN (SELECT DISTINCT instance FROM {gaps})
),
gcells AS (
    SELECT trace_id, call_id, i, instance, ta, tb, unnest(generate_series(c0, c1)) AS cell FROM {gaps}
),
ov AS (
    SELECT g.trace_id, g.call_id, g.i, p.p_call_id, p.computed
    FROM gcells g JOIN pcells p ON p.instance = g.instance AND p.cell = g.cell
    WHERE p.pa < g.tb AND p.pb > g.ta AND p.p_call_id <> g.call_id
      AND g.cell = greatest(CAST(floor(g.ta / {cell}) AS BIGINT), CAST(floor(p.pa / {cell}) AS BIGINT))
),
att AS (
    SELECT trace_id, call_id, i, arg_max(p_call_id, (computed, p_call_id)) AS off_call_id,
           max(computed) AS off_computed
    FROM ov GROUP BY trace_id, call_id, i
)
SELECT g.*, a.off_call_id, a.off_computed
FROM {gaps} g LEFT JOIN att a ON a.trace_id IS NOT DISTINCT FROM g.trace_id AND a.call_id = g.call_id AND a.i = g.i
"""


def _fmt(sql: str, **rels: str) -> str:
    return sql.format(cell=CELL_S, streamed=_STREAMED, **rels)


def rebuild(cur, calls: str) -> None:
    """``model_itl_gap`` made whole from ``calls`` (model_calls), inside the caller's transaction (its connection
    has agentobs_cumsum: registered before the transaction, agentobs.store.functions)."""
    cur.execute(f"CREATE OR REPLACE TEMP TABLE itl_g AS {_fmt(_GAPS_SQL, calls=calls)}")
    cur.execute(f"CREATE OR REPLACE TEMP TABLE itl_p AS {_fmt(_PREFILLS_SQL, calls=calls)}")
    cur.execute(f"CREATE OR REPLACE TABLE {TABLE} AS {_fmt(_ATTR_SQL, gaps='itl_g', pre='itl_p')}")
    cur.execute("DROP TABLE itl_g")
    cur.execute("DROP TABLE itl_p")
    cur.execute(f"CREATE OR REPLACE TABLE {BOUNDS} AS {_BOUNDS_SQL.format(calls=calls)}")


def _overlapping(cells: str, cols: str = "") -> str:
    """The stored gaps a prefill window of temp table ``cells`` (instance, pa, pb, cell: one row per 5 s cell the
    window spans) overlaps: the gap's row id (and ``cols`` of the window). Joined on the gap's first or last cell;
    a gap over more than two cells, rare, by its cell range (such a gap is longer than a cell: g_ms > 5000, a filter
    of the scan before the join — 4000 leaves room for the rounding of ta)."""
    on = "w.pa < g.tb AND w.pb > g.ta"
    return f"""SELECT g.rowid AS r{cols} FROM {TABLE} g JOIN {cells} w ON w.instance = g.instance AND w.cell = g.c0
            WHERE {on}
        UNION ALL SELECT g.rowid{cols} FROM {TABLE} g JOIN {cells} w ON w.instance = g.instance AND w.cell = g.c1
            WHERE g.c1 <> g.c0 AND {on}
        UNION ALL SELECT g.rowid{cols} FROM {TABLE} g JOIN {cells} w ON w.instance = g.instance
            WHERE g.g_ms > {(CELL_S - 1) * 1000} AND g.c1 - g.c0 > 1 AND w.cell > g.c0 AND w.cell < g.c1 AND {on}"""


def _cells(rel: str) -> str:
    return f"""SELECT *, unnest(generate_series(CAST(floor(pa / {CELL_S}) AS BIGINT),
                                             CAST(floor(pb / {CELL_S}) AS BIGINT))) AS cell FROM {rel}"""


def _count(cur, table: str) -> int:
    return int(cur.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])


def apply_delta(cur, calls: str, removed: str, old: str, new: str) -> None:
    """Bring ``model_itl_gap`` up to date for a refresh that replaces the rows of ``old`` (row ids in temp table
    ``removed``, column ``r``) of ``calls`` by those of ``new``, inside the caller's transaction and before it
    changes ``calls`` (the reads of a table the transaction has not changed yet fetch rows by row id; after a
    change they scan it whole). The prefill windows that changed: those of ``new`` not among ``old``'s (added) and
    those of ``old`` not among ``new``'s (removed; a re-derived call whose window is the same is neither).
    Attributed again in full, against the prefills near them (``calls`` less ``removed``, and ``new``; in ``calls``
    a scan of the start for the prefills whose start can reach them: within the longest time to first token
    before a gap, or the longest negative queue time after it): the gaps of the calls in ``new`` (derived again)
    and the stored gaps a removed window overlaps (their offender may be gone). A stored gap only an added window
    overlaps keeps its attribution or takes the added prefill that computes more (the maximum over a larger set:
    the offender a full attribution picks); its row is replaced. Cost: the touched calls and their neighbours in
    time, plus narrow scans of both tables."""
    pre_old, pre_new = _fmt(_PREFILLS_SQL, calls=old), _fmt(_PREFILLS_SQL, calls=new)
    if _count(cur, old):
        cur.execute(f"CREATE OR REPLACE TEMP TABLE itl_ca AS {_cells(f'({pre_new} EXCEPT {pre_old})')}")
        cur.execute(f"CREATE OR REPLACE TEMP TABLE itl_cr AS {_cells(f'({pre_old} EXCEPT {pre_new})')}")
    else:  # nothing replaced (new calls of new sessions): every window is added
        cur.execute(f"CREATE OR REPLACE TEMP TABLE itl_ca AS {_cells(f'(SELECT DISTINCT * FROM ({pre_new}))')}")
        cur.execute("CREATE OR REPLACE TEMP TABLE itl_cr AS SELECT * FROM itl_ca WHERE false")
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE itl_k AS SELECT DISTINCT trace_id, call_id FROM (
        SELECT trace_id, call_id FROM {old} UNION ALL SELECT trace_id, call_id FROM {new})""")
    # the stored gaps to attribute again in full: those of the changed calls (the stored calls among them with
    # gaps: those of ``old`` streamed), and those a removed window overlaps — each scan only when there are such
    cur.execute(f"CREATE OR REPLACE TEMP TABLE itl_ko AS SELECT DISTINCT trace_id, call_id FROM {old} WHERE {_STREAMED}")
    parts = ["SELECT 0::BIGINT AS r WHERE false"]
    if _count(cur, "itl_ko"):
        parts.append(f"SELECT g.rowid AS r FROM {TABLE} g SEMI JOIN itl_ko k ON k.trace_id = g.trace_id "
                     "AND k.call_id = g.call_id")
    if _count(cur, "itl_cr"):
        parts.append(_overlapping("itl_cr"))
    cur.execute("CREATE OR REPLACE TEMP TABLE itl_r AS SELECT DISTINCT r FROM (" + " UNION ALL ".join(parts) + ")")
    # the stored gaps an added window overlaps (the others), with what the join reads of them (narrow columns: a
    # read of the whole rows there reads every column of every row it scans): the added prefill computing the most
    # (a tie: the greater call id, as _ATTR_SQL), where it computes more than their offender (a tie: the greater call
    # id); then those rows, by row id, with it as the offender
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE itl_u AS SELECT r, a_id, a_c FROM (
        SELECT r, arg_max(p_call_id, (computed, p_call_id)) AS a_id, max(computed) AS a_c,
               any_value(o_id) AS o_id, any_value(o_c) AS o_c
        FROM ({_overlapping('itl_ca', ', g.call_id AS g_call_id, g.off_call_id AS o_id, g.off_computed AS o_c, '
                                      'w.p_call_id, w.computed')})
        WHERE p_call_id <> g_call_id AND r NOT IN (SELECT r FROM itl_r)
        GROUP BY r)
        WHERE o_c IS NULL OR a_c > o_c OR (a_c = o_c AND a_id > o_id)""")
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE itl_ux AS
        SELECT g.* REPLACE (u.a_id AS off_call_id, u.a_c AS off_computed)
        FROM (SELECT rowid AS r, * FROM {TABLE} WHERE rowid IN (SELECT r FROM itl_u)) g JOIN itl_u u USING (r)""")
    # the gaps to attribute in full: the new calls' and the unchanged calls' among those
    cur.execute(f"CREATE OR REPLACE TEMP TABLE itl_g AS {_fmt(_GAPS_SQL, calls=new)}")
    cols = "trace_id, call_id, i, instance, model, start_s, g_ms, ta, tb, c0, c1"
    cur.execute(f"""INSERT INTO itl_g SELECT {cols} FROM {TABLE} g
        WHERE rowid IN (SELECT r FROM itl_r)
          AND NOT EXISTS (SELECT 1 FROM itl_k k WHERE k.trace_id = g.trace_id AND k.call_id = g.call_id)""")
    # the prefills that can overlap them: a prefill [pa, pb] of a call starting at s has pa >= s + min(queue, 0) and
    # pb <= s + max ttft, so s lies in (ta - max ttft, tb - min(queue, 0)) (the bounds: kept in BOUNDS, raised by
    # the new rows); candidates by (instance, whole second of s): a scan of the calls' start for the seconds (an
    # integer key), the instance checked on those rows, then the candidates' rows read by row id
    cur.execute(f"""UPDATE {BOUNDS} b SET max_ttft_s = greatest(b.max_ttft_s, n.max_ttft_s),
                                          max_neg_queue_s = greatest(b.max_neg_queue_s, n.max_neg_queue_s)
                    FROM ({_BOUNDS_SQL.format(calls=new)}) n""")
    lo, hi = cur.execute(f"SELECT max_ttft_s, max_neg_queue_s FROM {BOUNDS}").fetchall()[0]
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE itl_sc AS
        SELECT DISTINCT instance, unnest(generate_series(CAST(floor(ta - {float(lo)!r}) AS BIGINT),
                                                         CAST(floor(tb + {float(hi)!r}) AS BIGINT))) AS sec
        FROM itl_g""")
    s_lo, s_hi = cur.execute("SELECT min(sec), max(sec) FROM itl_sc").fetchall()[0]
    if s_lo is not None:
        # the seconds' range as constants too: a filter of the scan, so that the zone maps of start_s skip the row
        # groups outside it (a batch of recent calls reads the recent ones only)
        cur.execute(f"""CREATE OR REPLACE TEMP TABLE itl_pr AS SELECT r FROM (
                SELECT c.rowid AS r, c.instance, CAST(floor(c.start_s) AS BIGINT) AS sec FROM {calls} c
                WHERE c.start_s >= {int(s_lo)} AND c.start_s < {int(s_hi) + 1}
                  AND CAST(floor(c.start_s) AS BIGINT) IN (SELECT sec FROM itl_sc)) x
            SEMI JOIN itl_sc w ON w.instance = x.instance AND w.sec = x.sec
            WHERE r NOT IN (SELECT r FROM {removed})""")
        # their rows' prefill columns only (a read by row id reads every column it selects)
        near = (f"(SELECT {_PREFILL_COLS} FROM {calls} WHERE rowid IN (SELECT r FROM itl_pr) "
                f"UNION ALL SELECT {_PREFILL_COLS} FROM {new})")
    else:  # no gap with a time span (none to attribute, or none placed in time): no stored prefill is read
        near = f"(SELECT {_PREFILL_COLS} FROM {new})"
    cur.execute(f"CREATE OR REPLACE TEMP TABLE itl_p AS {_fmt(_PREFILLS_SQL, calls=near)}")
    # the rows replaced go, the new ones come
    cur.execute(f"DELETE FROM {TABLE} WHERE rowid IN (SELECT r FROM itl_r UNION ALL SELECT r FROM itl_ux)")
    cur.execute(f"INSERT INTO {TABLE} BY NAME SELECT * EXCLUDE (r) FROM itl_ux")
    cur.execute(f"INSERT INTO {TABLE} {_fmt(_ATTR_SQL, gaps='itl_g', pre='itl_p')}")
    for t in ("itl_ca", "itl_cr", "itl_k", "itl_ko", "itl_g", "itl_r", "itl_u", "itl_ux", "itl_sc", "itl_pr", "itl_p"):
        cur.execute(f"DROP TABLE IF EXISTS {t}")


def state_read_sql() -> str:
    """m_itl_gap (itl_gaps.sql's columns) read from ``model_itl_gap`` for a metric run over the maintained state
    without attribute filters: the gaps of the calls starting in the window (temp table ``m_win``), the threshold
    and the tail flag, and the attribution of the tail gaps. Parameters: itl_gap_params'."""
    return f"""
SELECT call_id, instance, model, g_ms, thr_ms, g_ms > thr_ms AS tail,
       coalesce(off_computed >= $long_prefill_tokens, false) AS long_overlap,
       CASE WHEN g_ms > thr_ms THEN off_call_id END AS off_call_id,
       CASE WHEN g_ms > thr_ms THEN off_computed END AS off_computed
FROM (
    SELECT g.*, CASE WHEN $itl_tail_mode = 'p99' THEN quantile_cont(g.g_ms, 0.99) OVER (PARTITION BY g.model)
                     ELSE $itl_slo_ms END AS thr_ms
    FROM {TABLE} g CROSS JOIN m_win w
    WHERE (w.since IS NULL OR g.start_s >= w.since) AND (w.until IS NULL OR g.start_s < w.until)
)
"""
