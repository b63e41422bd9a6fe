"""An attribute's usual value — a session's or task's model, task type, tenant or agent in the report's top lists,
an instance's engine and model in the findings and the cost model: the most frequent value, a tie going to the least
value. The same answer on every run and on every backend; DuckDB's ``mode()`` broke ties by the order it met the rows
(tests/test_mode_ties.py)."""

from __future__ import annotations


def usual_cte(name: str, key: str, col: str, counts: str) -> str:
    """The CTE ``name(key, col)``: per ``key``, the usual non-NULL ``col``. ``counts`` (a CTE or a parenthesized
    query) holds ``key``, ``col`` and ``n``, the number of rows each line stands for; lines of one value add up."""
    return (f"{name} AS (SELECT {key}, arg_min({col}, (-n, {col})) AS {col} FROM "
            f"(SELECT {key}, {col}, sum(n) AS n FROM {counts} WHERE {col} IS NOT NULL GROUP BY ALL) GROUP BY {key})")
