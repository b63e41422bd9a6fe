"""The metric suite on ClickHouse: agentobs.metrics' own MetricRun, unchanged, over a cursor that
speaks ClickHouse (``agentobs.source.ClickHouseSource.cursor()`` hands it out).

``MetricRun`` (agentobs/metrics/prepare.py) prepares its tables and runs every metric through a DuckDB
cursor's ``execute`` / ``register`` / ``sql(...).pl()``. ``ClickHouseCursor`` offers the same calls:
each statement is transpiled (agentobs.backends.clickhouse.dialect) and run on ClickHouse, temp tables
become Memory tables with a per-run prefix, registered Arrow tables are inserted. So the metric SQL,
the preparation and the cost model exist once, in agentobs/metrics.
"""

from __future__ import annotations

import itertools
import os
import re
from functools import lru_cache

import polars as pl
import pyarrow as pa
import sqlglot
from sqlglot import exp

from ...errors import QueryError
from . import steps
from .conn import ClickHouse
from .dialect import LIST_PARAMS, to_clickhouse
from .model import reuse_schema

_RUN_TABLES = ("m_src", "m_act", "m_cost", "m_calls", "m_samples", "m_cost_arrow", "m_itl_gap")
_seq = itertools.count()


class _Result:
    def __init__(self, table: pa.Table):
        # ClickHouse counts are UInt64; DuckDB's (and so every consumer's) BIGINT
        fields = [pa.field(f.name, pa.int64()) if pa.types.is_unsigned_integer(f.type) else f for f in table.schema]
        self._t = table.cast(pa.schema(fields)) if fields != list(table.schema) else table

    @property
    def columns(self) -> list[str]:
        return list(self._t.column_names)

    def fetchall(self):
        cols = [c.to_pylist() for c in self._t.columns]
        return list(zip(*cols, strict=True)) if cols else []

    def pl(self) -> pl.DataFrame:
        df = pl.from_arrow(self._t)
        assert isinstance(df, pl.DataFrame)  # a Table gives a DataFrame (a Series only from an Array)
        # DuckDB hands back naive UTC timestamps; ClickHouse's carry the server zone
        return df.with_columns([pl.col(c).dt.convert_time_zone("UTC").dt.replace_time_zone(None)
                                for c, t in df.schema.items() if isinstance(t, pl.Datetime) and t.time_zone])

    def to_arrow_table(self) -> pa.Table:
        return self._t


class ClickHouseCursor:
    """The subset of a DuckDB cursor MetricRun uses, on ClickHouse (agentobs.source.Cursor)."""

    dialect = "clickhouse"

    def __init__(self, ch: ClickHouse):
        self.ch = ch
        self.prefix = f"agentobs_run_{os.getpid()}_{next(_seq)}_"
        self.registered: dict[str, pa.Table] = {}
        self.created: set[str] = set()

    def cursor(self):
        return self

    def _name(self, n: str) -> str:
        return self.prefix + n

    def _translate(self, sql: str) -> str:
        q, created = _translated(sql)
        if created is not None:  # CREATE [OR REPLACE] TEMP TABLE x AS ... → a Memory table (dropped on close)
            name = created.replace(_PREFIX, self.prefix)
            self.created.add(name)
            self.ch.command(f"DROP TABLE IF EXISTS `{name}`")
        return q.replace(_PREFIX, self.prefix)

    @staticmethod
    def _params(params) -> dict:
        out = {}
        for k, v in (params or {}).items():
            if k in LIST_PARAMS or k.startswith("f_"):
                v = list(v or [])
            out[k] = v
        return out

    def _steps(self, sql: str, params: dict) -> tuple[str, list[str]]:
        """A statement that marks steps (call_reuse's body, agentobs.backends.clickhouse.steps): each step into a
        Memory table of this cursor, once; returns the statement reading them and the tables, to drop after it."""
        if not steps.has_steps(sql):
            return sql, []

        made: list[str] = []

        def create(table: str, select: str) -> list[str]:
            real = table.replace(_PREFIX, self.prefix)
            made.append(real)
            self.ch.command(self._translate(f"CREATE TABLE {table} AS {select}"), params)
            return self.ch.arrow(f"SELECT * FROM `{real}` LIMIT 0").column_names

        try:
            # the step tables named with the placeholder prefix: the same SQL text every run, so the plan and the
            # translations are cached (_translated, steps.run), and the cursor's prefix is put in afterwards
            return steps.run(sql, f"{_PREFIX}step_", create)[0], made
        except BaseException:
            self._drop(made)
            raise

    def _drop(self, tables: list[str]) -> None:
        for t in tables:
            self.ch.command(f"DROP TABLE IF EXISTS `{t}`")
            self.created.discard(t)

    def execute(self, sql: str, params=None):
        s, made = self._steps(sql.strip(), self._params(params))
        try:
            return self._execute(s, params)
        finally:
            self._drop(made)

    def _execute(self, s: str, params=None):
        if s.upper().startswith("DROP TABLE"):
            name = s.split()[-1]
            self.ch.command(f"DROP TABLE IF EXISTS `{self._name(name)}`")
            return self
        if "m_cost_arrow" in s:  # CREATE TEMP TABLE m_cost AS SELECT * FROM m_cost_arrow
            data = self.registered["m_cost_arrow"]
            name = self._name("m_cost")
            self.ch.command(f"DROP TABLE IF EXISTS `{name}`")
            cols = ", ".join(f"`{f.name}` {_ch_type(f.type)}" for f in data.schema)
            self.ch.command(f"CREATE TABLE `{name}` ({cols}) ENGINE = Memory")
            self.created.add(name)
            if data.num_rows:
                self.ch.insert_arrow(name, data)
            return self
        q = self._translate(s)
        p = self._params(params)
        # UPDATE / DELETE on a run's table (findings narrow the window: agentobs/findings/context.py) → a
        # mutation of the Memory table, synchronous there
        m = re.match(r"(?is)^\s*(UPDATE\s+(\S+)\s+SET\b|DELETE\s+FROM\s+(\S+)\s+WHERE\b)", q)
        if m:
            if m.group(2):
                q = f"ALTER TABLE {m.group(2)} UPDATE " + q[m.end():]
            else:
                q = f"ALTER TABLE {m.group(3)} DELETE WHERE " + q[m.end():]
            self.ch.command(q, p)
            self._last = None
            return self
        if q.lstrip().upper().startswith("CREATE"):
            self.ch.command(q, p)
            self._last = None
        else:
            self._last = self.ch.arrow(q, p)
        return self

    def fetchall(self):
        return _Result(self._last).fetchall()

    def sql(self, sql: str, params=None) -> _Result:
        p = self._params(params)
        s, made = self._steps(sql, p)
        try:
            return _Result(self.ch.arrow(self._translate(s), p))
        finally:
            self._drop(made)

    def register(self, name: str, table: pa.Table) -> None:
        self.registered[name] = table

    def unregister(self, name: str) -> None:
        self.registered.pop(name, None)

    def close(self) -> None:
        for name in self.created:
            try:
                self.ch.command(f"DROP TABLE IF EXISTS `{name}`")
            except QueryError:
                pass
        self.created.clear()


# run tables in translated SQL carry this prefix, which each cursor replaces with its own (so translations are cached
# by statement text across runs)
_PREFIX = "agentobs_run_xprefixx_"


@lru_cache(maxsize=256)
def _translated(sql: str) -> tuple[str, str | None]:
    """A statement of the run (DuckDB SQL) as ClickHouse SQL, the run tables named ``_PREFIX + name``; and, for a
    ``CREATE [TEMP] TABLE x AS …``, the table it makes (a Memory table), else None."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    for t in tree.find_all(exp.Table):
        if t.name in _RUN_TABLES and not t.db:
            if not t.alias and isinstance(t.parent, (exp.From, exp.Join)):  # `m_calls.col` keeps resolving
                t.set("alias", exp.TableAlias(this=exp.to_identifier(t.name)))
            t.set("this", exp.to_identifier(_PREFIX + t.name))
    create = tree if isinstance(tree, exp.Create) else None
    if create is not None and create.kind == "TABLE":
        name = create.this.name if isinstance(create.this, exp.Table) else create.this.this.name
        props = create.args.get("properties")
        if props is not None:
            props.set("expressions", [p for p in props.expressions if not isinstance(p, exp.TemporaryProperty)])
        create.set("replace", False)
        body = create.expression
        create.set("expression", None)
        head = create.sql(dialect="clickhouse")
        return f"{head} ENGINE = Memory AS {to_clickhouse(body.sql(dialect='duckdb'), reuse_schema())}", name
    return to_clickhouse(tree.sql(dialect="duckdb"), reuse_schema()), None


def _ch_type(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "Nullable(String)"
    if pa.types.is_integer(t):
        return "Nullable(Int64)"
    if pa.types.is_floating(t):
        return "Nullable(Float64)"
    if pa.types.is_boolean(t):
        return "Nullable(Bool)"
    raise QueryError(f"no ClickHouse type for {t}")
