"""agentobs.backends.clickhouse.steps: a CTE chain run one step at a time (no ClickHouse needed: the tables are
recorded by a fake ``create``, which returns the columns a real table would have)."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from agentobs.backends.clickhouse import steps

SQL = """WITH src AS (SELECT x FROM t),
a AS MATERIALIZED (SELECT x, x + 1 AS y FROM src),
b AS (SELECT y FROM a WHERE y > 1),
unused AS (SELECT * FROM a),
--@step: read by d and e
-- (a second comment line between the mark and the CTE)
c AS (SELECT a.x, b.y FROM a JOIN b ON a.y = b.y),
d AS (SELECT x FROM c),
e AS (SELECT y FROM c)
SELECT d.x, e.y FROM d, e"""


def _ctes(sql: str) -> list[str]:
    return [c.alias for c in sqlglot.parse_one(sql, read="duckdb").find_all(exp.CTE)]


def _tables(sql: str) -> set[str]:
    return {t.name for t in sqlglot.parse_one(sql, read="duckdb").find_all(exp.Table)}


def test_steps_once_each_in_order_reading_the_earlier_tables():
    made: list[tuple[str, str]] = []
    cols = {"step_a": ["x", "y"], "step_c": ["x", "y"]}

    def create(table, select):
        made.append((table, select))
        return cols[table]

    assert steps.marked(SQL) == ["c"]
    final, tables = steps.run(SQL, "step_", create)
    # a (AS MATERIALIZED) then c (marked), each once
    assert [t for t, _ in made] == tables == ["step_a", "step_c"]
    # a's step: what a reads (src), a itself; nothing after it
    assert _ctes(made[0][1]) == ["src", "a"] and _tables(made[0][1]) == {"t", "src", "a"}
    assert "MATERIALIZED" not in made[0][1].upper()
    # c's step reads a's table, not a's body again (src is no longer needed)
    assert _ctes(made[1][1]) == ["a", "b", "c"] and "step_a" in _tables(made[1][1]) and "t" not in _tables(made[1][1])
    # the statement: c from its table; what only the steps read (src, a, b) and what nothing reads (unused) gone
    assert _ctes(final) == ["c", "d", "e"]
    assert _tables(final) == {"step_c", "c", "d", "e"}
    # the plan is kept: the same statement again runs the same steps, without parsing it
    made.clear()
    assert steps.run(SQL, "step_", create) == (final, tables) and [t for t, _ in made] == tables


def test_a_statement_without_marks_is_left_alone():
    plain = "WITH a AS (SELECT 1 AS x) SELECT x FROM a"
    assert not steps.has_steps(plain)
    assert steps.run(plain, "p_", lambda t, s: []) == (plain, [])


def test_call_reuse_marks_its_multiply_read_ctes():
    from agentobs.model.reuse import reuse_sql

    sql = reuse_sql()
    assert steps.has_steps(sql)
    # u (read by lab and fin), the instance evidence's ie_c / ie_act / ie_kd, the restarts' rs_c / rs_cr / rs_st, w
    # (read by ie_c, rs_c and v), pb, bh
    assert set(steps.marked(sql)) == {"pb", "bh", "w", "ie_c", "ie_act", "ie_kd", "rs_c", "rs_cr", "rs_st", "u"}
