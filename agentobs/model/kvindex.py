"""The KV-event index: the part of ``call_reuse`` that reads ``kv_events`` alone, stored in the store.

``call_reuse`` (agentobs/model/call_reuse.sql) turns KV-cache events into two small relations before it
meets any call: ``kv_sess`` (the sessions that stored blocks, each with an integer name ``sk``) and
``kv_rm_chain`` (every removal of a session's block, with the block's chain position and when it was stored
and superseded). Building them unnests every stored and removed block hash — most of what ``m_calls`` takes on a
store with KV events, in every metric run, console page and report (docs/metrics.md, "Round 8, continued") —
and their result is tiny (a few rows per session) and a function of ``kv_events`` only.

So the writers that add KV events store that result: ``refresh`` runs the same SQL section of
call_reuse.sql (between ``-- kv index begin`` and ``-- kv index end``) into ``kv_index_sessions`` and
``kv_index_removals`` and records, in ``kv_index_meta``, the stamp of the ``kv_events`` it read. A metric run
uses the stored rows only when the stamp of ``kv_events`` now is that stamp (``usable``); otherwise it computes
the section inline, as before. Same rows either way (tests/test_kv_index.py compares them).

The stamp: the version of the section's SQL text (a new agentobs release with another section rebuilds), and
the row count, the sum of the row hashes of the primary key (instance, ts, seq, event_idx) and the first and
last event time of ``kv_events``. Events are immutable rows keyed by that primary key, and any row added or
removed changes the count and (but for a 2⁻⁶⁴ collision) the hash sum. Reading it scans four key columns.

Who refreshes: ``agentobs import kv-events`` and ``import bundle`` (so ``agentobs demo``), the read snapshot
``agentobs collect`` publishes (agentobs/collect/snapshot.py), and ``agentobs kv-index``. A store written by
anything else keeps working; its runs compute the section inline until the next refresh.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from functools import cache

import duckdb

from ..store.db import transaction

BEGIN, END = "-- kv index begin", "-- kv index end"
TABLES = ("kv_index_sessions", "kv_index_removals", "kv_index_meta")
STAMP_SQL = """
SELECT count(*), coalesce(sum(hash(instance, ts, seq, event_idx)), 0), min(ts), max(ts) FROM kv_events
"""
# what the body reads instead of the section when the index is usable (the section's two outputs, same columns)
INDEXED = ("kv_sess AS (SELECT instance, session_id, sk FROM kv_index_sessions),\n"
           "kv_rm_chain AS (SELECT instance, session_id, ts_s, stored_s, superseded_s, depth\n"
           "                FROM kv_index_removals),\n")


@cache
def section() -> str:
    """The CTEs of call_reuse.sql that read kv_src alone (kv_sess … kv_rm_chain), each ending with a comma."""
    from .reuse import body_sql

    body = body_sql()
    start, end = body.index(BEGIN), body.index(END)
    return body[body.index("\n", start) + 1:end]


def version() -> str:
    return hashlib.sha256(section().encode()).hexdigest()[:16]


def stamp(con) -> str:
    n, h, lo, hi = con.execute(STAMP_SQL).fetchall()[0]
    return f"{version()}:{n}:{h}:{lo}:{hi}"


def usable(con) -> bool:
    """Whether the stored index is that of ``kv_events`` as it is now (and of this agentobs' SQL)."""
    try:
        rows = con.execute("SELECT stamp FROM kv_index_meta").fetchall()
    except duckdb.CatalogException:
        return False
    return len(rows) == 1 and rows[0][0] == stamp(con)


@dataclass
class Built:
    rebuilt: bool
    sessions: int
    removals: int
    seconds: float


def refresh(con: duckdb.DuckDBPyConnection, force: bool = False) -> Built:
    """Rebuild the index on a read-write connection unless it is current (``force``: rebuild anyway). One
    transaction: a reader sees the old index with its old stamp or the new one with the new stamp."""
    t0 = time.perf_counter()
    if not force and usable(con):
        n_s, n_r = (con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in TABLES[:2])
        return Built(False, n_s, n_r, time.perf_counter() - t0)
    head = "WITH kv_src AS (SELECT * FROM kv_events),\n" + section().rstrip().rstrip(",") + "\n"
    with transaction(con):
        st = stamp(con)
        con.execute("CREATE OR REPLACE TABLE kv_index_sessions AS " + head + "SELECT * FROM kv_sess ORDER BY sk")
        con.execute("CREATE OR REPLACE TABLE kv_index_removals AS " + head
                    + "SELECT * FROM kv_rm_chain ORDER BY instance, session_id, ts_s")
        n_s, n_r = (con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in TABLES[:2])
        con.execute("CREATE OR REPLACE TABLE kv_index_meta (stamp VARCHAR NOT NULL, sessions BIGINT, "
                    "removals BIGINT, built_at TIMESTAMP, build_s DOUBLE)")
        con.execute("INSERT INTO kv_index_meta VALUES (?, ?, ?, now()::TIMESTAMP, ?)",
                    [st, n_s, n_r, time.perf_counter() - t0])
    return Built(True, n_s, n_r, time.perf_counter() - t0)
