"""Ad-hoc SQL on ClickHouse: exactly one read-only query, capped and time-limited.

The text is parsed (sqlglot, ClickHouse dialect) and refused unless it is one SELECT (with WITH /
UNION); it runs with ``readonly = 1`` set on the query itself, so even a function with side effects
is refused by ClickHouse. For a server, use a ClickHouse user with read-only grants as well.
"""

from __future__ import annotations

import time

import pyarrow as pa
import sqlglot
from sqlglot import exp

from ...errors import QueryError
from .conn import ClickHouse


def check_select(query: str) -> str:
    try:
        stmts = [s for s in sqlglot.parse(query, read="clickhouse") if s is not None]
    except sqlglot.errors.ParseError as e:
        raise QueryError(f"SQL does not parse: {str(e).splitlines()[0]}") from None
    if len(stmts) != 1:
        raise QueryError(f"one statement only, got {len(stmts)}")
    if not isinstance(stmts[0], exp.Query):
        raise QueryError("only SELECT queries are allowed")
    return query.strip().rstrip(";")


def run_query(ch: ClickHouse, query: str, row_cap: int = 10_000, timeout_s: float = 30.0):
    """The query as an agentobs.sql.QueryResult (truncation noted, elapsed time), as `agentobs sql` shows it."""
    from ...sql import QueryResult

    t0 = time.perf_counter()
    q = check_select(query)
    if "settings" in q.lower().split()[-6:]:
        raise QueryError("a SETTINGS clause is not allowed")
    t = ch.arrow(f"SELECT * FROM ({q}) LIMIT {int(row_cap) + 1} "
                 f"SETTINGS readonly = 1, max_execution_time = {float(timeout_s)}")
    truncated = t.num_rows > row_cap
    return QueryResult(t.slice(0, row_cap) if truncated else t, truncated, row_cap, time.perf_counter() - t0)


def run_select(ch: ClickHouse, query: str, row_cap: int = 100_000, timeout_s: float = 30.0) -> pa.Table:
    return run_query(ch, query, row_cap, timeout_s).table
