"""Opening the DuckDB store: migrations on read-write opens, sandboxed read-only opens.

The store holds tables only; the session model's views over them are the model's (agentobs.model.connect /
agentobs.model.ensure, called by the layers above the store).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from ..errors import ConfigError, StoreError
from .functions import ensure as ensure_functions
from .schema import MIGRATIONS


def resolve_db_path(db: str | os.PathLike | None = None) -> str:
    """``db``, else the setting ``db`` (``--db``, ``$AGENTOBS_DB``, the settings file; default ./agentobs.duckdb)."""
    if db is not None:
        return str(db)
    from ..config import load_settings

    return str(load_settings().db)


@contextmanager
def transaction(cur: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """``BEGIN`` on the connection or cursor ``cur``, ``COMMIT`` when the block ends, ``ROLLBACK`` when anything
    raises in it (an interrupt too) or the COMMIT fails; that exception is raised again, its type, cause and
    context as they were. A ROLLBACK that fails for another reason than DuckDB having ended the transaction already
    (as it does when a COMMIT fails) is named in a note on it."""
    cur.execute("BEGIN")
    try:
        yield cur
        cur.execute("COMMIT")
    except BaseException as e:
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error as rb:
            if "no transaction is active" not in str(rb):
                e.add_note(f"the ROLLBACK failed too: {str(rb).splitlines()[0]}")
        raise


def migrate(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Apply pending migrations in order, record each. Returns applied names."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP DEFAULT now())"
    )
    done = {r[0] for r in con.execute("SELECT name FROM schema_migrations").fetchall()}
    applied = []
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        with transaction(con):
            con.execute(sql)
            con.execute("INSERT INTO schema_migrations (name) VALUES (?)", [name])
        applied.append(name)
    return applied


def connect(db: str | os.PathLike | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open the store. Read-write opens migrate (tables; the model's views: agentobs.model.connect); read-only
    opens require an existing store."""
    path = resolve_db_path(db)
    if read_only:
        if path != ":memory:" and not Path(path).exists():
            raise StoreError(
                f"no agentobs database at {path!r}; create one with `agentobs import ...` or `agentobs demo`"
            )
        try:
            return ensure_functions(duckdb.connect(path, read_only=True))
        except duckdb.Error as e:
            raise StoreError(f"cannot open {path!r} read-only: {e}") from e
    try:
        con = duckdb.connect(path)
    except duckdb.Error as e:
        raise StoreError(f"cannot open {path!r}: {e}") from e
    migrate(con)
    return ensure_functions(con)


def set_memory_limit(con: duckdb.DuckDBPyConnection, limit: str) -> None:
    """``SET memory_limit`` (DuckDB's buffer manager: beyond it, operators spill to disk or fail)."""
    try:
        con.execute("SET memory_limit = ?", [limit])
    except duckdb.Error as e:
        raise ConfigError(f"memory limit {limit!r} is not a DuckDB size (e.g. 512MB, 2GB): {e}") from None


def sandboxed(db: str | os.PathLike | None = None, memory_limit: str | None = "2GB") -> duckdb.DuckDBPyConnection:
    """A read-only connection for user SQL: no file or network access (but the store's own span segments, which
    the ``spans`` view reads: agentobs.store.segments), configuration locked."""
    path = resolve_db_path(db)
    if path != ":memory:" and not Path(path).exists():
        raise StoreError(f"no agentobs database at {path!r}")
    config: dict[str, str | bool | int | float | list[str]] = {}
    if memory_limit:
        config["memory_limit"] = memory_limit
    try:
        con = duckdb.connect(path, read_only=path != ":memory:", config=config)
    except duckdb.Error as e:
        raise StoreError(f"cannot open {path!r} read-only: {e}") from e
    # the segment directories the catalog lists, allowed before file access is switched off (one SELECT at a
    # time is all agentobs.sql runs, so nothing can be written there)
    from .segments import directories  # here: segments uses this module's transaction

    allowed = directories(con)
    if allowed:
        con.execute("SET allowed_directories = ?", [allowed])
    con.execute("SET enable_external_access = false")
    ensure_functions(con)  # before the configuration is locked
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")
    return con
