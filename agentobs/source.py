"""The data source: the DuckDB store (a file, its read snapshot, or an open connection) or ClickHouse, behind one seam.

A :class:`Source` is made once at the edge — the CLI (``open_source``), the console, the exporter and the report
are handed one — and passed down: the metrics, the findings and the report read through it and never look at a
path, a connection or the backend behind it.

- ``cursor()``: a private cursor (its temp tables are its own) that speaks DuckDB's SQL dialect with named
  ``$parameters``: ``execute``, ``sql(...).pl()`` / ``.fetchall()``, ``register``. On ClickHouse every statement
  is transpiled (agentobs/backends/clickhouse/dialect.py), so the metric SQL exists once. Close it when done: on
  a DuckDB file that closes the read-only connection it opened, so collectors can write again.
- ``dialect``: ``"duckdb"`` or ``"clickhouse"``; code branches on what a dialect can do through this module
  (``rowid``, ``counts_changes``, ...), never on the type of a connection.
- ``label()``: the source as shown to users (a ClickHouse URL without its password); ``where()`` the same with
  what it is ("store …", "ClickHouse …"); ``check()`` fails in one line when there is nothing to read.
- ``stamp()``: the state of the data (file size and times; ClickHouse data parts), what caches key on; ``None``
  when it cannot be known (an in-memory store). ``run_stamp()``: what a shared metric run is keyed by;
  ``run_cache``: the runs shared on this source (agentobs.metrics.runcache).
- ``schema()``, ``user_sql()``: the tables users may query, and one read-only user SELECT (sandboxed).

The store path is one setting (``db``: ``--db``, ``$AGENTOBS_DB``, the settings file, default ./agentobs.duckdb);
agentobs.store.db.resolve_db_path reads it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import duckdb
import polars as pl

from .config import Settings
from .errors import ConfigError, QueryError, StoreError
from .redact import mask_url
from .store.db import connect, resolve_db_path

if TYPE_CHECKING:
    import pyarrow as pa

    from .backends.clickhouse.conn import ClickHouse
    from .sql import QueryResult

log = logging.getLogger(__name__)

BACKENDS = ("duckdb", "clickhouse")


class Result(Protocol):
    """What ``Cursor.sql`` returns (a DuckDB relation, or the ClickHouse cursor's result)."""

    def fetchall(self) -> list[Any]: ...

    def pl(self) -> pl.DataFrame: ...

    def to_arrow_table(self) -> pa.Table: ...


class Cursor(Protocol):
    """The part of a DuckDB cursor agentobs reads through (what ``Source.cursor()`` returns). DuckDB's own cursor
    is one; agentobs.backends.clickhouse.metrics.ClickHouseCursor is the other."""

    def cursor(self) -> Cursor: ...

    def execute(self, query: str, parameters: Any = None, /) -> Any: ...

    def sql(self, query: str, /, *, params: Any = None) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def register(self, name: str, table: Any, /) -> Any: ...

    def unregister(self, name: str, /) -> Any: ...

    def close(self) -> None: ...


class RunCache:
    """The metric runs shared on one Source (agentobs.metrics.runcache keeps them): entries by key, under the
    cache's own lock. Every Source makes its own in its constructor, so runs are shared between the callers
    handed the same Source, and nothing is shared across Sources or kept process-wide."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Any] = {}
        self.lock = threading.Lock()


@runtime_checkable
class Source(Protocol):
    """A DuckDB store or a ClickHouse database, read one way (see the module docstring)."""

    dialect: str
    kind: str
    sql_rules: str
    run_cache: RunCache  # the metric runs shared on this source (agentobs.metrics.runcache)

    def cursor(self) -> Cursor: ...

    def label(self) -> str: ...

    def where(self) -> str: ...

    def check(self) -> None: ...

    def stamp(self, max_age_s: float = 0) -> tuple | None: ...

    def run_stamp(self) -> tuple | None: ...

    def schema(self) -> pl.DataFrame: ...

    def user_sql(self, query: str, row_cap: int, timeout_s: float) -> QueryResult: ...

    def close(self) -> None: ...


# -- DuckDB -----------------------------------------------------------------------------------------------
class DuckDBSource:
    """The DuckDB store: a file (each cursor opens it read-only and closes it with the cursor) or an open
    connection (cursors are cursors of it; the caller owns it)."""

    dialect = "duckdb"
    kind = "store"  # what it is, to users
    # what user_sql allows, as the console's SQL page says it
    sql_rules = ("Read-only: one SELECT at a time; writes, ATTACH/COPY/INSTALL/LOAD and any file or network "
                 "access are refused.")

    def __init__(self, db: str | os.PathLike | None = None, con: duckdb.DuckDBPyConnection | None = None):
        self.con = con
        self.path = None if con is not None else resolve_db_path(db)
        self.run_cache = RunCache()

    def __repr__(self) -> str:
        return f"DuckDBSource({self.label()!r})"

    def cursor(self) -> Cursor:
        if self.con is not None:
            from .store.functions import ensure

            return ensure(self.con).cursor()
        return connect(self.path, read_only=True)

    def label(self) -> str:
        return str(self.path) if self.path is not None else (self._file() or ":memory:")

    def where(self) -> str:
        return f"{self.kind} {self.label()} (read-only)"

    def check(self) -> None:
        """Fail now, in one line (StoreError), when the store is missing or unreadable."""
        if self.path is not None:
            connect(self.path, read_only=True).close()

    def _file(self) -> str | None:
        if self.path is not None:
            return None if str(self.path) in ("", ":memory:") else os.path.realpath(self.path)
        if self.con is None:
            return None
        try:
            rows = self.con.cursor().sql(
                "SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
        except duckdb.Error:
            return None
        return os.path.realpath(rows[0][0]) if rows and rows[0][0] else None

    def stamp(self, max_age_s: float = 0) -> tuple | None:
        """``("duckdb", realpath, size, mtime, WAL size, WAL mtime)``: a store that grows changes it. Always fresh
        (a stat), whatever ``max_age_s`` allows."""
        path = self._file()
        if path is None:
            return None
        out: list = ["duckdb", path]
        for p in (path, path + ".wal"):
            try:
                st = os.stat(p)
                out += [st.st_size, st.st_mtime_ns]
            except OSError:
                out += [None, None]
        return tuple(out) if out[2] is not None else None

    def run_stamp(self) -> tuple | None:
        """What a shared metric run is keyed by (agentobs.metrics.runcache.prepare): the file's state."""
        return self.stamp()

    def schema(self) -> pl.DataFrame:
        return query(self, """
            SELECT t.table_name AS name, lower(t.table_type) AS kind, c.column_name AS column, c.data_type AS type,
                   c.ordinal_position AS pos
            FROM information_schema.tables t
            JOIN information_schema.columns c USING (table_schema, table_name)
            WHERE t.table_schema = 'main' AND NOT starts_with(t.table_name, '_')
              AND t.table_name <> 'schema_migrations'
            ORDER BY kind, name, pos""")

    def user_sql(self, query: str, row_cap: int, timeout_s: float) -> QueryResult:
        """One read-only SELECT in a sandbox (agentobs.sql): a fresh read-only connection of the file."""
        from .sql import run_query

        if self.path is None:
            raise QueryError("user SQL runs on a store file (a sandboxed read-only connection), not an open one")
        return run_query(query, self.path, row_cap=row_cap, timeout_s=timeout_s)

    def close(self) -> None:
        """Nothing to close: cursors close what they open; a given connection is its owner's."""


# -- ClickHouse --------------------------------------------------------------------------------------------
class ClickHouseSource:
    """A ClickHouse database (chDB in-process, or a server) holding the model (`agentobs clickhouse init`)."""

    dialect = "clickhouse"
    kind = "ClickHouse"
    sql_rules = ("ClickHouse SQL over the same views (llm_calls, sessions, turn_gaps, …). Read-only: one SELECT at a "
                 "time (run with readonly = 1); writes, DDL, SETTINGS and functions that reach files, the network, "
                 "other databases or processes (file, url, s3, remote, mysql, executable, …) are refused.")

    def __init__(self, url: str | None = None, ch: ClickHouse | None = None):
        if ch is None:
            from .backends.clickhouse.conn import ClickHouse

            ch, self._own = ClickHouse(url or "chdb:"), True
        else:
            self._own = False
        self.ch = ch
        self._stamp: tuple[float, tuple] | None = None  # (when, the last stamp read)
        self.run_cache = RunCache()

    def __repr__(self) -> str:
        return f"ClickHouseSource({self.label()!r})"

    def cursor(self) -> Cursor:
        from .backends.clickhouse.metrics import ClickHouseCursor

        return ClickHouseCursor(self.ch)  # its close() drops its run tables, not the connection

    def label(self) -> str:
        return mask_url(self.ch.url)

    def where(self) -> str:
        return f"{self.kind} {self.label()}"

    def check(self) -> None:
        """Fail now, in one line (StoreError), when ClickHouse has no agentobs model (`agentobs clickhouse init`)."""
        n = self.ch.arrow("SELECT count() AS n FROM system.tables WHERE database = currentDatabase() "
                          "AND name = 'llm_calls'").column(0)[0].as_py()
        if not n:
            raise StoreError(f"no agentobs model at {self.label()} (view llm_calls missing): "
                             "run `agentobs clickhouse init --clickhouse-url …` first")

    def stamp(self, max_age_s: float = 0) -> tuple:
        """``("clickhouse", url, parts)``: per table the model reads, its row count and highest block number among
        the active data parts (``system.parts``: metadata, no data read); merges keep both, so only new data
        changes it. ``max_age_s``: the last one read, when it is no older than that."""
        now = time.monotonic()
        if self._stamp is not None and now - self._stamp[0] <= max_age_s:
            return self._stamp[1]
        from .backends.clickhouse.model import data_parts

        stamp = ("clickhouse", self.ch.url, data_parts(self.ch))
        self._stamp = (now, stamp)
        return stamp

    def run_stamp(self) -> tuple:
        """What a shared metric run is keyed by: the connection its run tables live on (while it is open)."""
        return ("clickhouse", id(self.ch))

    def schema(self) -> pl.DataFrame:
        """The model's views and tables of the connection's database (not the materialized views that feed them,
        nor a metric run's ``agentobs_run_*`` tables)."""
        t = self.ch.arrow("""
            SELECT c.table AS name, if(t.engine = 'View', 'view', 'base table') AS kind, c.name AS column,
                   c.type AS type, toInt64(c.position) AS pos
            FROM system.columns c
            JOIN system.tables t ON t.database = c.database AND t.name = c.table
            WHERE c.database = currentDatabase() AND t.engine NOT IN ('MaterializedView')
              AND NOT startsWith(c.table, 'agentobs_run_') AND NOT startsWith(c.table, '.')
              AND NOT startsWith(c.table, '_')
            ORDER BY kind, name, pos""")
        out = pl.from_arrow(t)
        assert isinstance(out, pl.DataFrame)
        return out

    def user_sql(self, query: str, row_cap: int, timeout_s: float) -> QueryResult:
        """One read-only SELECT (ClickHouse SQL, ``readonly = 1``; agentobs.backends.clickhouse.sql)."""
        from .backends.clickhouse.sql import run_query

        return run_query(self.ch, query, row_cap=row_cap, timeout_s=timeout_s)

    def close(self) -> None:
        if self._own:
            self.ch.close()


# One ClickHouse connection per URL per process, for a long-lived reader (the console): chDB holds one database
# path per process, and Streamlit serves every browser session from one process.
_SHARED_CH: dict[str, ClickHouseSource] = {}
_SHARED_CH_LOCK = threading.Lock()


def shared_clickhouse(url: str) -> ClickHouseSource:
    """The process-wide ClickHouse source for ``url`` (opened on first use, kept open; its close() keeps it)."""
    with _SHARED_CH_LOCK:
        src = _SHARED_CH.get(url)
        if src is None:
            from .backends.clickhouse.conn import ClickHouse

            src = _SHARED_CH[url] = ClickHouseSource(ch=ClickHouse(url))
        return src


def close_shared(url: str | None = None) -> None:
    """Close the shared ClickHouse connection(s) (tests; a process that moves to another chDB path)."""
    with _SHARED_CH_LOCK:
        for u in [url] if url is not None else list(_SHARED_CH):
            src = _SHARED_CH.pop(u, None)
            if src is not None:
                src.ch.close()


def from_stamp(stamp: tuple) -> Source:
    """The source a ``stamp()`` was taken of (ClickHouse: the shared connection): caches key on stamps."""
    if stamp[0] == ClickHouseSource.dialect:
        return shared_clickhouse(stamp[1])
    return DuckDBSource(stamp[1])


# -- what a dialect can do (the one place that knows) --------------------------------------------------------
def rowid(src_or_cur: Source | Cursor) -> bool:
    """Whether tables have DuckDB's implicit ``rowid`` (ClickHouse's do not: a numbered column instead)."""
    return dialect_of(src_or_cur) == "duckdb"


def keeps_model_state(cur: Cursor) -> bool:
    """Whether the store can hold the maintained session model (agentobs/model/state.py: DuckDB stores; ClickHouse
    computes from its views)."""
    return dialect_of(cur) == "duckdb"


def counts_changes(cur: Cursor) -> bool:
    """Whether UPDATE/DELETE return the number of rows they changed (DuckDB; a ClickHouse mutation does not)."""
    return dialect_of(cur) == "duckdb"


def register_functions(cur: Cursor) -> None:
    """agentobs' SQL functions (agentobs/store/functions.py) on a DuckDB connection a caller opened; ClickHouse has
    them built in (its dialect maps them)."""
    if dialect_of(cur) == "duckdb":
        from .store.functions import ensure

        ensure(cur)  # type: ignore[arg-type]


def has_insertion_order(cur: Cursor) -> bool:
    """Whether the database has DuckDB's ``preserve_insertion_order`` setting (a bulk preparation turns it off)."""
    return dialect_of(cur) == "duckdb"


def dialect_of(x: Source | Cursor) -> str:
    """The dialect of a source or of a cursor one gave (``"duckdb"`` or ``"clickhouse"``)."""
    d = getattr(x, "dialect", None)
    if d is not None:
        return str(d)
    if isinstance(x, duckdb.DuckDBPyConnection):
        return "duckdb"
    raise QueryError(f"not a source or a cursor of one: {type(x).__name__}")


# -- reads ------------------------------------------------------------------------------------------------
def query(src: Source, sql: str, params: dict | None = None) -> pl.DataFrame:
    """One statement (DuckDB SQL, named ``$parameters``) on a cursor of its own, as a DataFrame."""
    cur = src.cursor()
    try:
        return cur.sql(sql, params=params or {}).pl()
    finally:
        cur.close()


def queries(src: Source, sqls: dict[str, str]) -> dict[str, pl.DataFrame]:
    """Several parameterless statements on one cursor (one open of a DuckDB file)."""
    cur = src.cursor()
    try:
        return {k: cur.sql(s).pl() for k, s in sqls.items()}
    finally:
        cur.close()


def table_exists(cur: Cursor, name: str) -> bool:
    """Whether the cursor's database has a table or view ``name`` (a store older than a migration lacks some)."""
    if dialect_of(cur) == "duckdb":
        sql = "SELECT count(*) FROM information_schema.tables WHERE table_name = $name"  # tables and views
        return bool(cur.sql(sql, params={"name": name}).fetchall()[0][0])
    t = cur.ch.arrow("SELECT count() AS n FROM system.tables WHERE database = currentDatabase() "  # type: ignore[attr-defined]
                     "AND name = {name:String}", {"name": name})
    return bool(t.column(0)[0].as_py())


def kv_index_usable(cur: Cursor) -> bool:
    """Whether the stored KV-event index is current on this cursor's store (agentobs.model.kvindex; DuckDB only:
    ClickHouse keeps none, its runs compute the section inline)."""
    if dialect_of(cur) != "duckdb":
        return False
    from .model import kvindex

    return kvindex.usable(cur)


# -- at the edge ------------------------------------------------------------------------------------------
def as_source(db: Source | str | os.PathLike | duckdb.DuckDBPyConnection | None = None) -> Source:
    """``db`` as a Source: a Source itself, else a DuckDB store path (None: the setting ``db``) or an open DuckDB
    connection, or an open ClickHouse connection (the library's callers, tests and notebooks, are an edge too).
    Anything else is refused."""
    if isinstance(db, (DuckDBSource, ClickHouseSource)):
        return db
    if db is None or isinstance(db, (str, os.PathLike, Path)):
        return DuckDBSource(db)
    if isinstance(db, duckdb.DuckDBPyConnection):
        return DuckDBSource(con=db)
    from .backends.clickhouse.conn import ClickHouse  # imports no ClickHouse client: cheap

    if isinstance(db, ClickHouse):
        return ClickHouseSource(ch=db)
    if isinstance(db, Source):
        return db
    raise QueryError(f"db must be a Source, a store path or a DuckDB connection, got {type(db).__name__}")


def require(db: object, who: str) -> Source:
    """``db`` when it is a Source; the library's entry points (metrics, findings, report, exporter) take nothing
    else: a store path or a raw connection becomes a Source at the edge (as_source, make_source, open_source)."""
    if isinstance(db, Source):
        return db
    raise QueryError(f"{who} takes a Source, got {type(db).__name__} (make one at the edge: "
                     "agentobs.source.as_source(path or connection))")


def resolve(settings: Settings, backend: str | None = None, url: str | None = None) -> tuple[str, str]:
    """(backend, ClickHouse URL): the flag when given, else the setting (``backend``, ``clickhouse_url``;
    environment ``AGENTOBS_BACKEND`` / ``AGENTOBS_CLICKHOUSE_URL``, or the settings file)."""
    name = (backend or settings.backend or "duckdb").strip().lower()
    if name not in BACKENDS:
        raise ConfigError(f"backend {name!r}: choose duckdb or clickhouse (--backend, setting backend, $AGENTOBS_BACKEND)")
    return name, url or str(settings.clickhouse_url)


def make_source(settings: Settings, backend: str | None = None, url: str | None = None,
                db: str | os.PathLike | None = None, shared: bool = False) -> Source:
    """The Source a command reads: the DuckDB store ``db`` (default: the setting) or ClickHouse at ``url``
    (``shared``: the process-wide connection, see shared_clickhouse). On ClickHouse the settings' alias lists are
    written to ``agentobs_aliases`` when they differ (the spans view reads them at ingest; a log line says so)."""
    name, ch_url = resolve(settings, backend, url)
    if name == "duckdb":
        return DuckDBSource(db if db is not None else settings.db)
    src = shared_clickhouse(ch_url) if shared else ClickHouseSource(ch_url)
    # the alias lists the spans view reads at ingest, from these settings
    from .backends.clickhouse import model

    note = model.sync_aliases_note(src.ch, settings)
    if note:
        log.warning("%s", note)
    return src


@contextmanager
def open_source(settings: Settings, backend: str | None = None, url: str | None = None,
                db: str | os.PathLike | None = None) -> Iterator[Source]:
    """``make_source`` as a context: the source is closed on exit (a ClickHouse connection it opened)."""
    src = make_source(settings, backend, url, db)
    try:
        yield src
    finally:
        src.close()
