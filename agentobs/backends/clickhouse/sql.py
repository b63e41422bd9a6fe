"""Ad-hoc SQL on ClickHouse: exactly one read-only query, capped and time-limited.

The text is parsed (sqlglot, ClickHouse dialect) and refused unless it is one SELECT (with WITH /
UNION) that calls no function reaching outside the database: files (``file()`` — also the *scalar*
``file(path)``, which ``readonly = 1`` does NOT stop: it returns the file's text), network and other
databases (``url()``, ``s3()``, ``remote()``, ``mysql()``, …), processes (``executable()``) and chDB's
``Python()`` (reads objects of the host process). A SETTINGS or FORMAT clause anywhere is refused. The
query then runs with ``readonly = 1`` set on the query itself, so writes are refused by ClickHouse too.
For a server, use a ClickHouse user with read-only grants as well.
"""

from __future__ import annotations

import re
import time

import pyarrow as pa
import sqlglot
from sqlglot import exp

from ...errors import QueryError
from .conn import ClickHouse

# Functions (table or scalar; matched case-insensitively) that read or write outside the database.
REFUSED_FUNCTIONS = frozenset({
    "file", "filecluster", "url", "urlcluster", "gcs", "oss", "cosn", "remote", "remotesecure", "cluster",
    "clusterallreplicas", "mysql", "postgresql", "mongodb", "redis", "sqlite", "jdbc", "odbc", "executable",
    "executablepool", "python", "input", "catboostevaluate", "arrowflight", "ytsaurus", "dictionary", "paimon",
})
REFUSED_PREFIXES = ("s3", "azureblob", "hdfs", "iceberg", "deltalake", "hudi")


def _refused_function(node: exp.Func) -> str | None:
    name = node.name if isinstance(node, exp.Anonymous) else ""
    if not name:
        return None
    low = name.lower()
    if low in REFUSED_FUNCTIONS or low.startswith(REFUSED_PREFIXES):
        return name
    return None


def check_select(query: str) -> str:
    if not query or not query.strip():
        raise QueryError("empty query")
    try:
        stmts = [s for s in sqlglot.parse(query, read="clickhouse") if s is not None]
    except sqlglot.errors.ParseError as e:
        raise QueryError(f"SQL does not parse: {str(e).splitlines()[0]}") from e
    if len(stmts) != 1:
        raise QueryError(f"one statement only, got {len(stmts)}")
    if not isinstance(stmts[0], exp.Query):
        raise QueryError("only SELECT queries are allowed")
    for node in stmts[0].find_all(exp.Func):
        name = _refused_function(node)
        if name is not None:
            raise QueryError(f"refused: {name}() reaches outside the database (files, network, other "
                             "databases, processes); agentobs SQL reads the database only")
    for q in stmts[0].find_all(exp.Query):
        for clause in ("settings", "format"):
            if q.args.get(clause):
                raise QueryError(f"a {clause.upper()} clause is not allowed")
    return query.strip().rstrip(";")


_CALL_REUSE = re.compile(r"\bcall_reuse\b", re.IGNORECASE)


def run_query(ch: ClickHouse, query: str, row_cap: int = 10_000, timeout_s: float = 30.0):
    """The query as an agentobs.sql.QueryResult (truncation noted, elapsed time), as `agentobs sql` shows it."""
    from ...sql import QueryResult
    from .model import refresh_call_reuse

    t0 = time.perf_counter()
    q = check_select(query)
    if "settings" in q.lower().split()[-6:]:
        raise QueryError("a SETTINGS clause is not allowed")
    if _CALL_REUSE.search(q):
        # call_reuse reads a table computed by steps: brought up to date with the data first (model.py)
        try:
            refresh_call_reuse(ch)
        except QueryError as e:
            raise QueryError(f"call_reuse could not be brought up to date with the data ({e}); a ClickHouse user "
                             "that may create tables runs `agentobs clickhouse init` to do it") from None
    t = ch.arrow(f"SELECT * FROM ({q}) LIMIT {int(row_cap) + 1} "
                 f"SETTINGS readonly = 1, max_execution_time = {float(timeout_s)}")
    truncated = t.num_rows > row_cap
    return QueryResult(t.slice(0, row_cap) if truncated else t, truncated, row_cap, time.perf_counter() - t0)


def run_select(ch: ClickHouse, query: str, row_cap: int = 100_000, timeout_s: float = 30.0) -> pa.Table:
    return run_query(ch, query, row_cap, timeout_s).table
