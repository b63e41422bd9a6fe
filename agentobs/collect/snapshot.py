"""Read snapshots: how readers see a store that ``agentobs collect`` holds open.

DuckDB lets one process open a file read-write, and then no other process may open it, not even
read-only. ``agentobs collect`` therefore publishes a consistent copy every ``snapshot_every_s``:
every raw table copied in one transaction (a consistent point in time, while the writer keeps
committing) into ``<snapshot>.tmp``, the ``spans`` view made over the copied catalog of span segments (the
live store's Parquet files, which are not copied), then the model's upkeep runs on the copy (views, KV-event index: the
caller's ``upkeep``, agentobs.model.upkeep), then an atomic
``os.replace`` onto the snapshot path. Readers (``agentobs sql``, the console, reports) point
``--db`` at the snapshot; a reader that has the previous file open keeps reading it unharmed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

from ..store import segments
from ..store.db import connect, transaction

log = logging.getLogger(__name__)


def default_snapshot_path(db: str) -> str:
    p = Path(db)
    return str(p.with_name(p.stem + ".read.duckdb"))


class Cancelled(Exception):
    pass


def publish(con: duckdb.DuckDBPyConnection, path: str | os.PathLike,
            cur: duckdb.DuckDBPyConnection | None = None, cancel=None,
            upkeep: Callable[[duckdb.DuckDBPyConnection], object] | None = None) -> float:
    """Copy the open store to ``path`` atomically; returns the seconds it took. ``cur``: a cursor of ``con``
    to copy with, which the caller may ``interrupt()``; ``cancel``: a ``threading.Event`` checked between
    steps (a stopping collector sets it and interrupts ``cur``). A cancelled copy raises ``Cancelled``,
    its file is deleted and the previous snapshot stays. ``upkeep`` (agentobs.model.upkeep, given by the
    caller) makes the copy's model views and KV-event index, so readers' metric runs skip that step."""

    def check():
        if cancel is not None and cancel.is_set():
            raise Cancelled("snapshot cancelled")

    t0 = time.perf_counter()
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    for f in path.parent.glob(path.name + ".tmp*"):  # this one's, and any a killed collector left
        f.unlink(missing_ok=True)
    own = cur is None
    if cur is None:
        cur = con.cursor()
    try:
        src = cur.execute("SELECT current_database()").fetchall()[0][0]
        cur.execute("ATTACH ? AS agentobs_snapshot", [str(tmp)])
        try:
            tables = [r[0] for r in cur.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main'", [src]
            ).fetchall()]
            with transaction(cur):  # one read transaction: every table as of the same moment
                for table in tables:
                    check()
                    cur.execute(f'CREATE TABLE agentobs_snapshot.main."{table}" AS SELECT * FROM "{src}".main."{table}"')
        finally:
            cur.execute("DETACH agentobs_snapshot")
    except BaseException:
        for f in (tmp, Path(str(tmp) + ".wal")):
            f.unlink(missing_ok=True)
        raise
    finally:
        if own:
            cur.close()
    try:
        check()
    except Cancelled:
        for f in (tmp, Path(str(tmp) + ".wal")):
            f.unlink(missing_ok=True)
        raise
    snap = connect(tmp)
    try:
        # spans is a view (the table part + the span segments the copied catalog lists; the files are the
        # store's, kept while a snapshot may list them: agentobs/store/segments.py); views are not copied
        segments.ensure_view(snap)
        if upkeep is not None:
            upkeep(snap)  # views; a failed KV-event index is logged by it, and readers derive it inline
        snap.execute("CHECKPOINT")
    finally:
        snap.close()
    os.replace(tmp, path)
    return time.perf_counter() - t0
