"""The optimized preparation of a metric run gives the same per-call table ``m_calls`` as the previous
implementation, row for row and column for column. The previous ``call_reuse`` body (before the row number
moved into ``m_src`` and the wide copy of the calls was dropped) is kept next to this file
(test_metrics_v1_call_reuse.sql) with its composition (``_v1_sql``). The data: the first 45 minutes of the
simulator's sample fleet (sample_data/fleet: KV events with chain depths and removals, routed-away and evicted turns,
retries, context resets, abandoned sessions) and the scale bench's generator (15-call sessions, failures, ITL arrays)."""

from __future__ import annotations

import sys
from pathlib import Path

from agentobs.config import Settings
from agentobs.metrics import MetricRun
from agentobs.metrics.cost import parse_cost
from agentobs.model import connect, reuse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from metrics_scale import GENERATE  # noqa: E402

V1_BODY = Path(__file__).with_name("test_metrics_v1_call_reuse.sql")


def _v1_sql(calls: str, select: str, tail: str, settings: Settings) -> str:
    """reuse.reuse_sql as it was: the body numbered the calls itself (row_number in a materialized wide copy)."""
    ab = reuse.seconds_literal(settings.abandoned_after_s)
    return (
        f"WITH calls_src AS (SELECT {reuse.CALL_COLUMNS} FROM {calls}),\n"
        "cfg_src AS (SELECT * FROM instance_config),\n"
        "kv_src AS (SELECT * FROM kv_events),\n"
        f"reuse_params AS (SELECT CAST($default_block_size AS INTEGER) AS default_block_size, CAST({ab} AS DOUBLE) "
        "AS abandoned_after_s,\n    (SELECT max(end_ns) FROM spans) / 1e9 AS data_end_s)\n"
        f"SELECT {select} FROM (\n{V1_BODY.read_text()}\n) r\n{tail}"
    )


CHANGED = {"reprefill_tokens", "miss_cause", "window_outcome", "evict_ts_s", "evict_phase", "rent_paid_token_s",
           "rent_wasted_token_s"}


def _diff(con, since=None, until=None, filters=None) -> tuple[int, int, int, dict]:
    """(rows of m_calls, rows only in the new table, rows only in the v1 table, counts of the covered cases)."""
    s = Settings()
    run = MetricRun(con, since, until, filters or {}, s, parse_cost({}))
    try:
        cur = run.cur
        # the v1 call_reuse over the same calls; compared on its columns (m_calls adds the cost and filter columns)
        cur.execute(f"CREATE TEMP TABLE v1_src AS SELECT {reuse.CALL_COLUMNS} FROM llm_calls")
        cur.execute("CREATE TEMP TABLE v1_calls AS\n" + _v1_sql("v1_src", "r.*", "", s), {"default_block_size": 16})
        # issue 20 changed what X, the miss cause and the window outcome mean in estimate mode (causes from evidence,
        # a hit tolerance, the band): those columns are compared apart below — the v1 X is the new shortfall S, the
        # same subtraction; the rest must be equal
        cols = ", ".join(c for (c,) in cur.sql(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'v1_calls' ORDER BY column_index").fetchall()
            if c not in CHANGED)
        # and a sub-agent's first call shorter than its fork point is no longer a context reset when the spans give
        # the control-plane prefix (system + tool-definition tokens): R is that prefix. Those rows (and only those)
        # differ in R, R_eff, the reset flag and the hit class; they are checked against that rule and left out
        cur.execute("""CREATE TEMP TABLE forked AS SELECT n.call_id FROM m_calls n JOIN v1_calls o USING (call_id)
                       WHERE o.context_reset AND NOT n.context_reset""")
        bad_fork = cur.sql("""SELECT count(*) FROM m_calls n JOIN forked USING (call_id)
                              WHERE n.branch = 'main' OR n.reusable_tokens IS DISTINCT FROM
                                    least(coalesce(n.system_tokens, 0) + coalesce(n.tool_def_tokens, 0), n.prompt_tokens)
                           """).fetchall()[0][0]
        assert bad_fork == 0
        moved = cur.sql("SELECT count(*) FROM m_calls n JOIN v1_calls o USING (call_id) "
                        "WHERE n.call_id NOT IN (SELECT call_id FROM forked) AND "
                        "(n.shortfall_tokens IS DISTINCT FROM o.reprefill_tokens "
                        "OR n.reprefill_high_tokens < n.shortfall_tokens OR n.reprefill_low_tokens > n.reprefill_tokens)"
                        ).fetchall()[0][0]
        assert moved == 0
        n = cur.sql("SELECT count(*) FROM m_calls").fetchall()[0][0]
        keep = "WHERE call_id NOT IN (SELECT call_id FROM forked)"
        only_new = cur.sql(f"SELECT count(*) FROM (SELECT {cols} FROM m_calls {keep} EXCEPT ALL "
                           f"SELECT {cols} FROM v1_calls {keep})").fetchall()[0][0]
        only_v1 = cur.sql(f"SELECT count(*) FROM (SELECT {cols} FROM v1_calls {keep} EXCEPT ALL "
                          f"SELECT {cols} FROM m_calls {keep})").fetchall()[0][0]
        cases = cur.sql("""
            SELECT count(*) FILTER (WHERE rent_mode = 'kv_events') AS kv_windows,
                   count(*) FILTER (WHERE evict_ts_s IS NOT NULL) AS evictions,
                   count(*) FILTER (WHERE is_retry) AS retries,
                   -- (resets in v1's sense: on the sample they are sub-agents' first calls, now compared apart)
                   (SELECT count(*) FROM v1_calls WHERE context_reset) AS resets,
                   count(*) FILTER (WHERE miss_cause = 'routed_away') AS routed_away,
                   count(*) FILTER (WHERE abandoned) AS abandoned
            FROM m_calls""").pl().to_dicts()[0]
        return n, only_new, only_v1, cases
    finally:
        run.close()


# The sample's sessions that start in its first 45 minutes (2,930 of its 7,574 calls), whole, and the KV events (every
# instance's, the removals without a session id included) up to the end of their last span: later events cannot touch
# these calls. The whole sample's KV events (364k, nearly all removals on one instance) made two thirds of the
# comparison's cost whatever the calls; the slice keeps every case the comparison counts (windows with KV events,
# evictions, retries, resets, routing, abandonment: asserted non-zero below) at about half the CPU.
SLICE_S = 2700


def _sample_slice(sample_db: Path, path: Path) -> None:
    con = connect(path)
    con.execute(f"ATTACH '{sample_db}' AS src (READ_ONLY)")
    con.execute("INSERT INTO engine_config SELECT * FROM src.main.engine_config")
    con.execute(f"""INSERT INTO spans_part SELECT * FROM src.main.spans WHERE trace_id IN (
                        SELECT trace_id FROM src.main.spans WHERE role = 'agent'
                        AND start_ns < (SELECT min(start_ns) FROM src.main.spans) + {SLICE_S * 1_000_000_000})""")
    con.execute("INSERT INTO kv_events SELECT * FROM src.main.kv_events "
                "WHERE ts <= (SELECT make_timestamp(max(end_ns) // 1000) FROM spans)")
    con.execute("DETACH src")
    con.close()


def test_sample_fleet_m_calls_equal_v1(sample_db, tmp_path):
    # a slice of the session's shared import of sample_data/fleet (without the stored KV-event index)
    path = tmp_path / "slice.duckdb"
    _sample_slice(sample_db, path)
    con = connect(path, read_only=True)
    try:
        kv = con.sql("SELECT count(*) FILTER (WHERE type = 'BlockRemoved'), count(DISTINCT session_id) FROM kv_events"
                     ).fetchall()[0]
        assert kv[0] > 0 and kv[1] > 0   # the exact eviction path (KV events with sessions) is exercised
        n, only_new, only_v1, cases = _diff(con)
        assert n > 1000 and (only_new, only_v1) == (0, 0)
        # the compared rows cover windows with KV events and evictions, retries, resets, routing, abandonment
        assert all(v > 0 for v in cases.values()), cases
    finally:
        con.close()
    # and with the KV section read from the stored KV-event index (what `agentobs demo` builds), on the slice: the
    # same rows
    from agentobs.model import kvindex

    con = connect(path)
    assert kvindex.refresh(con).removals > 0
    con.close()
    con = connect(path, read_only=True)
    try:
        assert kvindex.usable(con)
        assert _diff(con) == (n, 0, 0, cases)
    finally:
        con.close()


def test_bench_generator_m_calls_equal_v1(tmp_path):
    path = str(tmp_path / "g.duckdb")
    con = connect(path)
    con.execute(GENERATE, {"n": 3000})   # 200 sessions × 15 calls: failures (retries), routed-away, ITL arrays
    con.close()
    con = connect(path, read_only=True)
    try:
        n, only_new, only_v1, cases = _diff(con)
        assert (n, only_new, only_v1) == (3000, 0, 0)
        assert cases["routed_away"] > 0   # 5% of turns routed away (its failed calls are not re-sent: no retries)
    finally:
        con.close()
