"""Read-only user SQL (``agentobs sql`` and the console's SQL page).

Three layers, the first one being the real boundary:
1. a read-only DuckDB connection with ``enable_external_access = false`` and the configuration
   locked — no writes, no files, no network, no extensions;
2. the statement is classified by DuckDB's own parser (``extract_statements``): exactly one
   SELECT (or EXPLAIN) is allowed, anything else is refused with a message saying why;
3. a row cap (the result says when it truncated) and a time limit (the query is interrupted).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from .errors import QueryError
from .store.db import sandboxed

ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


@dataclass
class QueryResult:
    table: pa.Table
    truncated: bool
    row_cap: int
    elapsed_s: float

    def notice(self) -> str | None:
        if self.truncated:
            return f"truncated: showing the first {self.row_cap} rows (row cap; raise it with --max-rows)"
        return None


def check_statement(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    if not sql or not sql.strip():
        raise QueryError("empty query")
    try:
        stmts = con.extract_statements(sql)
    except duckdb.ParserException as e:
        raise QueryError(f"SQL syntax error: {str(e).splitlines()[0]}") from e
    if len(stmts) != 1:
        raise QueryError(f"one statement at a time, got {len(stmts)}")
    st = stmts[0].type
    if st not in ALLOWED:
        kind = str(st).split(".")[-1]
        raise QueryError(
            f"refused: {kind} statements are not allowed — agentobs SQL is read-only (SELECT only, "
            "no writes, no ATTACH/COPY/INSTALL/LOAD/SET)"
        )


def run_query(sql: str, db=None, row_cap: int = 10_000, timeout_s: float = 30.0,
              con: duckdb.DuckDBPyConnection | None = None) -> QueryResult:
    own = con is None
    con = con or sandboxed(db)
    try:
        check_statement(con, sql)
        timer = threading.Timer(timeout_s, con.interrupt)
        timer.start()
        t0 = time.perf_counter()
        try:
            reader = con.sql(sql).to_arrow_reader(min(row_cap + 1, 100_000) or 1)
            batches, n = [], 0
            for b in reader:
                batches.append(b)
                n += b.num_rows
                if n > row_cap:
                    break
            table = pa.Table.from_batches(batches, schema=reader.schema)
        except duckdb.InterruptException:
            raise QueryError(f"query interrupted: it ran past the {timeout_s:g} s time limit") from None
        except duckdb.PermissionException as e:
            raise QueryError(
                f"refused: file and network access is disabled in agentobs SQL ({str(e).splitlines()[0]})"
            ) from e
        except duckdb.Error as e:
            msg = str(e).splitlines()[0]
            if "disabled" in msg.lower() or "read-only" in msg.lower() or "read only" in msg.lower():
                raise QueryError(f"refused: {msg}") from e
            raise QueryError(msg) from e
        finally:
            timer.cancel()
        truncated = table.num_rows > row_cap
        if truncated:
            table = table.slice(0, row_cap)
        return QueryResult(table, truncated, row_cap, time.perf_counter() - t0)
    finally:
        if own:
            con.close()
