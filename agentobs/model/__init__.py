"""The normalized model: views over the raw tables (``llm_calls``, ``tool_calls``, ``sessions``,
``tasks``, ``turn_gaps``, ``instance_config``, ``call_reuse``). The SQL lives in ``views.sql`` and
``call_reuse.sql``; the KV-event index (``kvindex``) is derived data the model keeps in the store.

The store (agentobs.store) creates tables only. Whoever writes a store opens it through ``connect`` (the
store's connect, then ``ensure``: the views, idempotent) and, after writing KV events, calls ``upkeep``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from functools import cache
from importlib import resources

import duckdb

log = logging.getLogger(__name__)


def views_sql() -> str:
    return resources.files(__package__).joinpath("views.sql").read_text()


def split_statements(sql: str) -> list[str]:
    """Split a SQL script into statements (sqlglot-free: our files end statements with ';\\n')."""
    out: list[str] = []
    buf: list[str] = []
    for line in sql.splitlines():
        if line.strip().startswith("--") and not buf:
            continue
        buf.append(line)
        if line.rstrip().endswith(";"):
            stmt = "\n".join(buf).strip()
            if stmt.strip(";").strip():
                out.append(stmt)
            buf = []
    if "\n".join(buf).strip():
        out.append("\n".join(buf).strip())
    return out


@cache
def views_stamp() -> str:
    """What the model's views are made from: their SQL (views.sql, call_reuse's), the store's migrations (the
    tables they read) and the DuckDB release (which binds them)."""
    from ..store.schema import MIGRATIONS
    from .reuse import reuse_sql

    h = hashlib.sha256()
    for part in (views_sql(), reuse_sql(), *(name for name, _ in MIGRATIONS), duckdb.__version__):
        h.update(part.encode())
        h.update(b"\0")
    return "agentobs views " + h.hexdigest()[:16]


def ensure(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Create the model's views on a read-write connection of a migrated store, unless the store already has
    these (the stamp of views_stamp on ``call_reuse``, the last made: a store whose views are current is left
    as it is, as creating them costs a fifth of a CPU-second); returns ``con``."""
    stamp = views_stamp()
    have = con.execute("SELECT comment FROM duckdb_views() WHERE view_name = 'call_reuse' AND schema_name = 'main' "
                       "AND database_name = current_database()").fetchall()
    if have == [(stamp,)]:
        return con
    for stmt in split_statements(views_sql()):
        con.execute(stmt)
    # call_reuse: the per-call reuse model of METRICS.md §1/§4 (agentobs/model/call_reuse.sql)
    from .reuse import create_view as create_call_reuse

    create_call_reuse(con)
    con.execute(f"COMMENT ON VIEW call_reuse IS '{stamp}'")  # last: views made in part carry no stamp
    return con


def connect(db: str | os.PathLike | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """The store (agentobs.store.db.connect) with the model: read-write opens migrate and ensure the views."""
    from ..store.db import connect as store_connect

    con = store_connect(db, read_only=read_only)
    return con if read_only else ensure(con)


def upkeep(con: duckdb.DuckDBPyConnection) -> bool:
    """The model's upkeep after writes: the views, then the KV-event index (agentobs.model.kvindex) when it is not
    current. An index that cannot be built is logged and left (metric runs then compute that part inline):
    returns False then, True otherwise."""
    from . import kvindex

    ensure(con)
    try:
        kvindex.refresh(con)
    except Exception as e:  # noqa: BLE001 - readers derive it inline without
        log.warning("KV-event index not built (%s: %s)", type(e).__name__, e)
        return False
    return True
