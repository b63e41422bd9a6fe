"""Span storage layout: ``spans`` is a view over a compacted DuckDB table and a tail of Parquet segments.

- ``spans_part``: the compacted part, a DuckDB table. Importers, sim bundles and the ``table`` layout of the
  collector append to it (agentobs.store.writer.insert_spans: a span already stored there is skipped).
- ``span_segments``: the catalog of the tail, one row per Parquet file the collector's loader published
  (``span_store = segments``): seq, absolute file path, rows, min/max ``start_ns`` and the spool position
  loaded with it. A decoder process writes the file under a temporary name and fsyncs it
  (:func:`write_segment`); the loader renames it to ``<seq>.parquet`` and then commits, in one DuckDB
  transaction, the catalog row, the ``spool_loaded`` mark and the new ``spans`` view (:func:`add`). At start
  (:func:`recover`) a file without a catalog row (a batch whose commit never happened: its requests are
  still in the spool and load again) is deleted, and a catalog row whose file is missing is an error.
- ``spans`` (:func:`view_sql`): ``spans_part`` UNION ALL the segments (``read_parquet`` over the catalog's
  file list), the tail deduplicated span by span: a span repeated in two segments (a re-batched or retried
  export) is read from the first, and a tail span already in ``spans_part`` (in the tail's ``start_ns``
  range, so DuckDB reads only the row groups there) is not read again. The view is re-made in the
  transaction that changes the catalog, so a reader sees a catalog and its view together.
- :func:`compact` merges the oldest segments into ``spans_part`` (same dedupe) in one transaction per group,
  records the rowids the rows got in ``span_compactions`` (the session model's marks read it), and moves the
  files to ``span_segments_retired``; :func:`sweep` deletes retired files once no read snapshot can list
  them (the collector's snapshots copy the catalog and read the live files).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import ConfigError, StoreError
from .db import transaction

SUFFIX = ".parquet"
TMP_PREFIX = ".tmp-"
# snappy: 3.9-4.3 µs/span written + published against zstd's 4.8-5.2 (docs/collectors.md, storage layout)
COMPRESSION = "snappy"
LAYOUTS = ("table", "segments")


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ConfigError(f"setting span_store: {layout!r} is not one of {', '.join(LAYOUTS)}")
    return layout


def segments_dir(db: str | os.PathLike) -> str:
    """``<db>.segments`` beside the store file (absolute)."""
    if str(db) in ("", ":memory:"):
        raise ConfigError("span_store = segments needs a store file (--db), not an in-memory store")
    return os.path.abspath(str(db)) + ".segments"


@dataclass(frozen=True)
class SegmentFile:
    """A Parquet file a decoder wrote and fsync'd under a temporary name, not yet published."""

    tmp: str
    rows: int
    min_start_ns: int | None
    max_start_ns: int | None


def write_segment(table: pa.Table, directory: str) -> SegmentFile:
    """Write ``table`` to ``directory/.tmp-<pid>-<uuid>.parquet`` and fsync it (a decoder process does this)."""
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}")
    pq.write_table(table, tmp, compression=COMPRESSION)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    mm = pc.min_max(table["start_ns"])
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return SegmentFile(tmp, table.num_rows, lo, hi)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seg_name(seq: int) -> str:
    return f"{seq:016d}{SUFFIX}"


def publish_file(seg: SegmentFile, seq: int) -> str:
    """Rename the decoder's file to its final name ``<seq>.parquet`` (fsync'd directory); returns the path. The
    caller then commits :func:`add` in its transaction, and deletes the file if that fails."""
    final = os.path.join(os.path.dirname(seg.tmp), seg_name(seq))
    os.rename(seg.tmp, final)
    _fsync_dir(os.path.dirname(final))
    return final


def add(cur: duckdb.DuckDBPyConnection, seq: int, file: str, seg: SegmentFile, spool: tuple[int, int]) -> None:
    """Inside the caller's transaction: the catalog row of a published file, and the ``spans`` view with it."""
    cur.execute("INSERT INTO span_segments VALUES (?, ?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
                [seq, file, seg.rows, seg.min_start_ns, seg.max_start_ns, spool[0], spool[1]])
    ensure_view(cur)


def next_seq(cur: duckdb.DuckDBPyConnection) -> int:
    """The seq the next published segment gets (above every one published, merged ones included)."""
    return int(cur.execute("SELECT coalesce(greatest((SELECT max(seq) FROM span_segments), "
                           "(SELECT max(max_seq) FROM span_compactions)), 0) + 1").fetchall()[0][0])


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def read_sql(files: list[str]) -> str:
    """``read_parquet`` over segment files (a relation; column ``filename`` added)."""
    return f"read_parquet([{', '.join(_lit(f) for f in files)}], filename = true, union_by_name = true)"


def _window(rows: list[tuple]) -> str:
    """The ``start_ns`` range of catalog rows, as a condition on ``p`` (spans_part) for the anti-join."""
    los = [r[1] for r in rows if r[1] is not None]
    his = [r[2] for r in rows if r[2] is not None]
    if not los or any(r[1] is None for r in rows):
        return "TRUE"
    return f"p.start_ns BETWEEN {int(min(los))} AND {int(max(his))}"


def _dedupe_select(cur: duckdb.DuckDBPyConnection, rows: list[tuple]) -> str:
    """The tail's rows once each (first segment wins) and not already in spans_part, in spans_part's columns."""
    cols = cur.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = "
                       "current_database() AND schema_name = 'main' AND table_name = 'spans_part' "
                       "ORDER BY column_index").fetchall()
    src = read_sql([r[0] for r in rows])
    have = {r[0] for r in cur.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
    sel = ", ".join(f'CAST(t."{c}" AS {ty}) AS "{c}"' if c in have else f'CAST(NULL AS {ty}) AS "{c}"'
                    for c, ty in cols)
    return (f"SELECT {sel} FROM {src} t "
            f"WHERE NOT EXISTS (SELECT 1 FROM spans_part p WHERE {_window(rows)} "
            "AND p.trace_id = t.trace_id AND p.span_id = t.span_id) "
            "QUALIFY row_number() OVER (PARTITION BY t.trace_id, t.span_id ORDER BY t.filename) = 1")


def view_sql(cur: duckdb.DuckDBPyConnection) -> str:
    """The ``spans`` view for the catalog as ``cur`` sees it."""
    rows = cur.execute("SELECT file, min_start_ns, max_start_ns FROM span_segments ORDER BY seq").fetchall()
    if not rows:
        return "SELECT * FROM spans_part"
    return f"SELECT * FROM spans_part UNION ALL {_dedupe_select(cur, rows)}"


def ensure_view(cur: duckdb.DuckDBPyConnection) -> None:
    cur.execute(f"CREATE OR REPLACE VIEW spans AS {view_sql(cur)}")


def directories(cur: duckdb.DuckDBPyConnection) -> list[str]:
    """The directories the ``spans`` view reads files from (a sandbox allows exactly those)."""
    try:
        rows = cur.execute("SELECT DISTINCT file FROM span_segments").fetchall()
    except duckdb.CatalogException:  # not an agentobs store (or before migration 0004)
        return []
    return sorted({os.path.dirname(r[0]) + os.sep for r in rows})


def recover(cur: duckdb.DuckDBPyConnection, directory: str) -> int:
    """At start: delete the files under ``directory`` that no catalog row lists (unpublished batches and
    retired files); a catalog row whose file is missing is a StoreError. Returns the files deleted."""
    listed = {r[0] for r in cur.execute("SELECT file FROM span_segments").fetchall()}
    missing = sorted(f for f in listed if not os.path.exists(f))
    if missing:
        raise StoreError(f"span segment file(s) listed in the store's catalog (span_segments) are missing: "
                         f"{', '.join(missing[:3])}{' …' if len(missing) > 3 else ''} — restore them, or the "
                         "store was moved without its .segments directory")
    deleted = 0
    d = Path(directory)
    if d.is_dir():
        for p in d.iterdir():
            if p.is_file() and str(p.resolve()) not in listed and str(p) not in listed:
                p.unlink(missing_ok=True)
                deleted += 1
    cur.execute("DELETE FROM span_segments_retired")
    return deleted


@dataclass
class Compacted:
    segments: int = 0
    rows: int = 0  # rows inserted into spans_part (duplicates skipped)
    seconds: float = 0.0
    left: int = 0  # segments still in the tail


def compact(con: duckdb.DuckDBPyConnection, max_seconds: float | None = None, group: int = 16,
            keep: int = 0) -> Compacted:
    """Merge the oldest segments into ``spans_part``, ``group`` files per transaction, until ``keep`` are left
    or ``max_seconds`` have passed (checked between groups). Each group: the rows not yet in spans_part, once
    each, appended; the catalog rows deleted; ``span_compactions`` told the rowids; the ``spans`` view
    re-made; the files retired (:func:`sweep` deletes them)."""
    t0 = time.perf_counter()
    out = Compacted()
    cur = con.cursor()
    try:
        while True:
            n = cur.execute("SELECT count(*) FROM span_segments").fetchall()[0][0]
            if n <= keep or (max_seconds is not None and time.perf_counter() - t0 >= max_seconds):
                out.left = int(n)
                break
            rows = cur.execute("SELECT file, min_start_ns, max_start_ns, seq FROM span_segments ORDER BY seq "
                               "LIMIT ?", [min(group, n - keep)]).fetchall()
            with transaction(cur):
                before = cur.execute("SELECT coalesce(max(rowid), -1) FROM spans_part").fetchall()[0][0]
                res = cur.execute(f"INSERT INTO spans_part {_dedupe_select(cur, rows)}").fetchone()
                inserted = int(res[0]) if res else 0
                top = max(r[3] for r in rows)
                # spans_part is append-only with one writer: the rows get the rowids after the committed ones
                # (checked after the commit; inside the transaction they have transaction-local rowids)
                cur.execute("INSERT INTO span_compactions VALUES (?, ?, ?, ?, ?, now()::TIMESTAMP)",
                            [top, len(rows), before + 1 if inserted else None,
                             before + inserted if inserted else None, inserted])
                cur.execute("INSERT INTO span_segments_retired SELECT file, now()::TIMESTAMP FROM span_segments "
                            "WHERE seq <= ?", [top])
                cur.execute("DELETE FROM span_segments WHERE seq <= ?", [top])
                ensure_view(cur)
            if inserted and cur.execute("SELECT max(rowid) FROM spans_part").fetchall()[0][0] != before + inserted:
                # another writer appended meanwhile: the range is not known, so the model reads them as new
                cur.execute("UPDATE span_compactions SET rowid_lo = NULL, rowid_hi = NULL WHERE max_seq = ?", [top])
            out.segments += len(rows)
            out.rows += inserted
    finally:
        cur.close()
    out.seconds = time.perf_counter() - t0
    return out


def sweep(con: duckdb.DuckDBPyConnection, grace_s: float = 0.0) -> int:
    """Delete the retired files retired at least ``grace_s`` ago (and their rows); returns how many."""
    cur = con.cursor()
    try:
        rows = cur.execute("SELECT file FROM span_segments_retired WHERE retired_at <= now()::TIMESTAMP - "
                           "to_microseconds(CAST(? * 1e6 AS BIGINT))", [float(grace_s)]).fetchall()
        for (f,) in rows:
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass
        if rows:
            cur.execute("DELETE FROM span_segments_retired WHERE list_contains(?, file)", [[r[0] for r in rows]])
    finally:
        cur.close()
    return len(rows)
