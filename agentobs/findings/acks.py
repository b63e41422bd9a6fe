"""Acknowledgements: an operator marks a finding as known until a date.

Stored in the ``findings_acks`` table (migration ``0002_findings_acks``). Only the CLI writes it
(``agentobs findings ack``); the console and the weekly report open the store read-only and only
read it. An acknowledgement applies to a finding id (rule + scope) until its ``until`` time.
"""

from __future__ import annotations

import datetime as dt
import getpass
import time
from collections.abc import Callable

import duckdb

from .. import times
from ..errors import InputError
from ..source import table_exists

ACKS_SQL = "SELECT finding_id, reason, until, created_at, created_by FROM findings_acks"


def _table_exists(con) -> bool:
    """Only the DuckDB store has the table (ClickHouse: no acknowledgements, docs/clickhouse.md)."""
    return table_exists(con, "findings_acks")


def active(con: duckdb.DuckDBPyConnection, clock: Callable[[], float] = time.time) -> dict[str, dict]:
    """Acknowledgements in force now, by finding id (a store older than the migration has none)."""
    if not _table_exists(con):
        return {}
    now = dt.datetime.fromtimestamp(clock(), dt.UTC).replace(tzinfo=None)
    rel = con.sql(ACKS_SQL + " WHERE until > $now", params={"now": now})
    cols = rel.columns
    return {r[0]: dict(zip(cols, r, strict=True)) for r in rel.fetchall()}


def all_acks(con: duckdb.DuckDBPyConnection) -> list[dict]:
    if not _table_exists(con):
        return []
    rel = con.sql(ACKS_SQL + " ORDER BY until DESC, finding_id")
    cols = rel.columns
    return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]


def parse_until(value: str, clock: Callable[[], float] = time.time) -> dt.datetime:
    """A date (``2026-11-30``, end of that day UTC), an ISO-8601 time, or a span from now (``14d``)."""
    s = (value or "").strip()
    try:
        if len(s) == 10 and times.span_s(s) is None:
            d = dt.date.fromisoformat(s)
            return dt.datetime(d.year, d.month, d.day) + dt.timedelta(days=1)
        return times.parse_utc(s, clock, spans=1, epoch=False)
    except ValueError:
        raise InputError(f"--until {value!r} is not a date: use 2026-11-30, 2026-11-30T12:00 or a span such as "
                         "14d") from None


def add(con: duckdb.DuckDBPyConnection, finding_id: str, reason: str, until: dt.datetime,
        clock: Callable[[], float] = time.time, who: str | None = None) -> dict:
    """Record (or replace) the acknowledgement of ``finding_id``. ``con`` must be read-write."""
    if "/" not in finding_id:
        raise InputError(f"{finding_id!r} is not a finding id: ids look like rule/scope, e.g. "
                         "hicache_off/instance=10.0.0.1:30000 (see `agentobs findings`)")
    if not reason or not reason.strip():
        raise InputError("an acknowledgement needs a --reason")
    now = dt.datetime.fromtimestamp(clock(), dt.UTC).replace(tzinfo=None)
    if until <= now:
        raise InputError(f"--until {until.isoformat(sep=' ')} is in the past")
    try:
        who = who or getpass.getuser()
    except (KeyError, OSError):
        who = None
    con.execute("INSERT OR REPLACE INTO findings_acks (finding_id, reason, until, created_at, created_by) "
                "VALUES ($id, $reason, $until, $now, $who)",
                {"id": finding_id, "reason": reason.strip(), "until": until, "now": now, "who": who})
    return {"finding_id": finding_id, "reason": reason.strip(), "until": until, "created_at": now, "created_by": who}


def remove(con: duckdb.DuckDBPyConnection, finding_id: str) -> bool:
    n = con.execute("DELETE FROM findings_acks WHERE finding_id = $id RETURNING finding_id", {"id": finding_id}).fetchall()
    return bool(n)
