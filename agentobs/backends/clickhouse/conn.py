"""A connection to ClickHouse: in-process (chDB) or a server (clickhouse-connect), one interface.

URLs: ``chdb:`` (in-memory), ``chdb:///path/to/dir`` (an on-disk chDB database), or
``http(s)://user:password@host:8123/database`` (a ClickHouse server, read by clickhouse-connect).
Values reach SQL only as ClickHouse query parameters (``{name:Type}``). Errors are re-raised ``from None``: a
client's exception may carry the URL with its password, and a chained traceback would print it unmasked.
"""

from __future__ import annotations

import threading
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from ...errors import ConfigError, QueryError, StoreError
from ...redact import mask_url

# Session settings that give ClickHouse the SQL-standard NULL behaviour the shared metric SQL assumes:
# outer joins yield NULL (not the type default), aggregates over nothing yield NULL (not 0), casts keep NULL.
SESSION_SETTINGS = {
    "join_use_nulls": 1,
    "prefer_column_name_to_alias": 1,
    "query_plan_max_optimizations_to_apply": 1000000,
    "enable_materialized_cte": 1,
    "aggregate_functions_null_for_empty": 1,
    "cast_keep_nullable": 1,
    "allow_experimental_correlated_subqueries": 1,
    "enable_named_columns_in_function_tuple": 1,
    "use_variant_as_common_type": 0,
    "allow_lossy_numeric_supertype": 1,
}


def _format_param(v) -> str:
    """A parameter value in ClickHouse's text form (what clickhouse-connect sends for us on a server)."""
    if v is None:
        return "\\N"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_quote(x) for x in v) + "]"
    return str(v)


def _quote(x) -> str:
    if isinstance(x, str):
        return "'" + x.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(x)


class ClickHouse:
    """``command(sql)``, ``arrow(sql, params) -> pyarrow.Table``, ``insert_arrow(table, data)``."""

    def __init__(self, url: str = "chdb:"):
        self.url = url
        # one statement at a time: the console shares one connection between Streamlit's script threads
        # (chDB holds one database path per process; a server session runs one query at a time)
        self._lock = threading.RLock()
        u = urlsplit(url)
        self.kind = u.scheme
        if u.scheme == "chdb":
            try:
                from chdb import session
            except ImportError:
                raise ConfigError("the chdb package is not installed: pip install 'agentobs[clickhouse]'") from None
            path = unquote(u.path) if u.path not in ("", "/") else ""
            try:
                self._s = session.Session(path) if path else session.Session()
            except Exception as e:  # chdb raises plain RuntimeError
                raise StoreError(mask_url(f"cannot open chDB at {url!r}: {e}")) from None
            for k, v in SESSION_SETTINGS.items():
                self._s.query(f"SET {k} = {v}")
        elif u.scheme in ("http", "https"):
            try:
                import clickhouse_connect
            except ImportError:
                raise ConfigError("clickhouse-connect is not installed: pip install 'agentobs[clickhouse]'") from None
            try:
                self._c = clickhouse_connect.get_client(
                    host=u.hostname or "localhost", port=u.port or (8443 if u.scheme == "https" else 8123),
                    username=unquote(u.username or "default"), password=unquote(u.password or ""),
                    database=(u.path or "/").strip("/") or "default", secure=u.scheme == "https",
                    settings=SESSION_SETTINGS)
            except Exception as e:
                where = f"{u.scheme}://{u.hostname}:{u.port}"
                raise StoreError(mask_url(f"cannot connect to ClickHouse at {where}: {e}")) from None
        else:
            raise ConfigError(f"--clickhouse-url {mask_url(url)!r}: use chdb:, chdb:///path or http(s)://host:8123/db")

    @property
    def lock(self) -> threading.RLock:
        """Held by one statement at a time; a caller holds it over several that must not interleave."""
        return self._lock

    def __str__(self) -> str:
        """The URL without its password (reports and logs name the source by it)."""
        return mask_url(self.url)

    def command(self, sql: str, params: dict | None = None) -> None:
        try:
            with self._lock:
                if self.kind == "chdb":
                    self._s.query(sql, "Null", params={k: _format_param(v) for k, v in (params or {}).items()})
                else:
                    self._c.command(sql, parameters=params)
        except Exception as e:
            raise QueryError(mask_url(f"ClickHouse: {str(e).splitlines()[0][:500]}")) from None

    def arrow(self, sql: str, params: dict | None = None) -> pa.Table:
        try:
            with self._lock:
                if self.kind == "chdb":
                    return self._s.query(sql, "ArrowTable",
                                         params={k: _format_param(v) for k, v in (params or {}).items()})
                return self._c.query_arrow(sql, parameters=params)
        except Exception as e:
            raise QueryError(mask_url(f"ClickHouse: {str(e).splitlines()[0][:500]}")) from None

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        if not table.replace("_", "").isalnum():
            raise QueryError(f"bad table name {table!r}")
        with self._lock:
            if self.kind == "chdb":
                cols = ", ".join(f"`{c}`" for c in data.column_names)
                arrow_data = data  # noqa: F841 - read by chDB's Python() table function by name
                self._s.query(f"INSERT INTO {table} ({cols}) SELECT * FROM Python(arrow_data)")
            else:
                self._c.insert_arrow(table, data)

    def close(self) -> None:
        with self._lock:
            if self.kind == "chdb":
                self._s.close()
            else:
                self._c.close()
