"""agentobs_cumsum: the list running sum the ITL queries place gaps in time with (agentobs.store.functions)."""

from __future__ import annotations

import duckdb
import pytest

from agentobs.backends.clickhouse.dialect import to_clickhouse
from agentobs.model import connect
from agentobs.store.db import sandboxed
from agentobs.store.functions import ensure


def test_running_sum_per_list():
    con = ensure(duckdb.connect())
    rows = con.sql("""
        SELECT agentobs_cumsum(l) FROM (VALUES (1, [10.0, 20.0, 5.5]), (2, []::DOUBLE[]), (3, NULL::DOUBLE[]),
                                               (4, [1.0, NULL, 2.0]), (5, [7.0])) t(k, l)
        ORDER BY k""").fetchall()
    # each list restarts at 0; a NULL element adds nothing (as sum() skips it) but keeps its place
    assert [r[0] for r in rows] == [[10.0, 30.0, 35.5], [], None, [1.0, 1.0, 3.0], [7.0]]


def test_many_vectors_and_integer_lists():
    # 5,000 lists span several of DuckDB's 2,048-row vectors (each a sliced Arrow array); list k is [k, k, k]
    con = ensure(duckdb.connect())
    got = con.sql("""
        SELECT k, agentobs_cumsum([k, k, k]) AS c FROM range(5000) t(k) ORDER BY k""").fetchall()
    assert all(c == [float(k), 2.0 * k, 3.0 * k] for k, c in got)


def test_matches_the_window_it_replaces():
    # the ITL queries' old form: the running sum of the unnested gaps per call, ordered by position
    con = ensure(duckdb.connect())
    con.execute("""CREATE TABLE c AS SELECT k AS call,
                          list_transform(range(1 + k % 37), lambda j: (j * 7 + k) % 50 + 0.25)
                   AS itl FROM range(300) t(k)""")
    diff = con.sql("""
        WITH g AS (SELECT call, unnest(itl) AS g, generate_subscripts(itl, 1) AS i, agentobs_cumsum(itl) AS cs FROM c),
        w AS (SELECT cs[i] AS new, sum(g) OVER (PARTITION BY call ORDER BY i ROWS UNBOUNDED PRECEDING) AS old FROM g)
        SELECT count(*), count(*) FILTER (WHERE new <> old) FROM w""").fetchall()
    assert diff == [(sum(1 + k % 37 for k in range(300)), 0)]  # quarter-ms values: exact in binary, so equal


def test_registered_on_agentobs_connections(tmp_path):
    db = tmp_path / "s.duckdb"
    connect(db).close()
    for opener in (lambda: connect(db, read_only=True), lambda: sandboxed(db)):  # users rerun evidence SQL there
        con = opener()
        assert con.sql("SELECT agentobs_cumsum([1.0, 2.0])").fetchall() == [([1.0, 3.0],)]
        con.close()
    # two open connections to one file share a catalog: the second finds it registered, and keeps it when the
    # first closes
    first, second = connect(db, read_only=True), connect(db, read_only=True)
    first.close()
    assert second.sql("SELECT agentobs_cumsum([3.0, 1.0])").fetchall() == [([3.0, 4.0],)]
    second.close()
    con = duckdb.connect()
    ensure(con)
    ensure(con)  # idempotent: a connection that already has it is left alone
    assert con.sql("SELECT agentobs_cumsum([2.0, 2.0])").fetchall() == [([2.0, 4.0],)]


@pytest.mark.parametrize("sql", ["SELECT agentobs_cumsum(itl_ms) AS cs FROM t"])
def test_clickhouse_spelling(sql):
    assert "arrayCumSum(itl_ms)" in to_clickhouse(sql)
