"""The metric suite on ClickHouse: agentobs.metrics' own MetricRun, unchanged, over a cursor that
speaks ClickHouse.

``MetricRun`` (agentobs/metrics/run.py) prepares its tables and runs every metric through a DuckDB
cursor's ``execute`` / ``register`` / ``sql(...).pl()``. ``ClickHouseCursor`` offers the same calls:
each statement is transpiled (agentobs.backends.clickhouse.dialect) and run on ClickHouse, temp tables
become Memory tables with a per-run prefix, registered Arrow tables are inserted. So the metric SQL,
the preparation and the cost model exist once, in agentobs/metrics.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable

import polars as pl
import pyarrow as pa
import sqlglot
from sqlglot import exp

from ...config import Settings, load_settings
from ...errors import QueryError
from ...metrics.cost import parse_cost
from ...metrics.run import MetricRun, _normalize_filters, get_metric, names, parse_time
from .conn import ClickHouse
from .dialect import to_clickhouse
from .model import reuse_schema

_RUN_TABLES = ("m_src", "m_cost", "m_calls", "m_samples", "m_cost_arrow")
_seq = itertools.count()


class _Result:
    def __init__(self, table: pa.Table):
        self._t = table

    def fetchall(self):
        cols = [c.to_pylist() for c in self._t.columns]
        return list(zip(*cols, strict=True)) if cols else []

    def pl(self) -> pl.DataFrame:
        df = pl.from_arrow(self._t)
        # DuckDB hands back naive UTC timestamps; ClickHouse's carry the server zone
        return df.with_columns([pl.col(c).dt.convert_time_zone("UTC").dt.replace_time_zone(None)
                                for c, t in df.schema.items() if isinstance(t, pl.Datetime) and t.time_zone])

    def to_arrow_table(self) -> pa.Table:
        return self._t


class ClickHouseCursor:
    """The subset of a DuckDB cursor MetricRun uses, on ClickHouse."""

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
        tree = sqlglot.parse_one(sql, read="duckdb")
        for t in tree.find_all(exp.Table):
            if t.name in _RUN_TABLES and not t.db:
                t.set("this", exp.to_identifier(self._name(t.name)))
        # CREATE [OR REPLACE] TEMP TABLE x AS ... → a Memory table (dropped on close)
        create = tree if isinstance(tree, exp.Create) else None
        if create is not None and create.kind == "TABLE":
            name = create.this.name if isinstance(create.this, exp.Table) else create.this.this.name
            self.created.add(name)
            self.ch.command(f"DROP TABLE IF EXISTS `{name}`")
            props = create.args.get("properties")
            if props is not None:
                props.set("expressions", [p for p in props.expressions if not isinstance(p, exp.TemporaryProperty)])
            create.set("replace", False)
            body = create.expression
            create.set("expression", None)
            head = create.sql(dialect="clickhouse")
            return f"{head} ENGINE = Memory AS {to_clickhouse(body.sql(dialect='duckdb'), reuse_schema())}"
        return to_clickhouse(tree.sql(dialect="duckdb"), reuse_schema())

    @staticmethod
    def _params(params) -> dict:
        out = {}
        for k, v in (params or {}).items():
            if k in ("instances", "metrics") or k.startswith("f_"):
                v = list(v or [])
            out[k] = v
        return out

    def execute(self, sql: str, params=None):
        s = sql.strip()
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
        if q.lstrip().upper().startswith("CREATE"):
            self.ch.command(q, p)
            self._last = None
        else:
            self._last = self.ch.arrow(q, p)
        return self

    def fetchall(self):
        return _Result(self._last).fetchall()

    def sql(self, sql: str, params=None) -> _Result:
        return _Result(self.ch.arrow(self._translate(sql), self._params(params)))

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


def prepare(ch: ClickHouse, since=None, until=None, filters: dict | None = None, settings: Settings | None = None,
            clock: Callable[[], float] = time.time) -> MetricRun:
    settings = settings if settings is not None else load_settings()
    return MetricRun(ClickHouseCursor(ch), parse_time(since, clock, "since"), parse_time(until, clock, "until"),
                     _normalize_filters(filters), settings, parse_cost(settings.section("cost")))


def compute_all(ch: ClickHouse, since=None, until=None, filters: dict | None = None, settings: Settings | None = None,
                metrics: Iterable[str] | None = None, by: dict[str, str] | None = None,
                clock: Callable[[], float] = time.time) -> dict[str, pl.DataFrame]:
    chosen = list(metrics) if metrics is not None else names()
    for n in chosen:
        get_metric(n)
    run = prepare(ch, since, until, filters, settings, clock)
    try:
        return {n: run.compute(n, (by or {}).get(n)) for n in chosen}
    finally:
        run.close()


def compute(name: str, ch: ClickHouse, since=None, until=None, by: str | None = None, filters: dict | None = None,
            settings: Settings | None = None, clock: Callable[[], float] = time.time) -> pl.DataFrame:
    return compute_all(ch, since, until, filters, settings, [name], {name: by} if by else None, clock)[name]
