"""Span storage layout: ``spans`` is a view over a DuckDB table part, merged Parquet files and a tail of Parquet segments.

- ``spans_part``: a DuckDB table. Importers, sim bundles and the ``table`` layout of the collector append to it
  (agentobs.store.writer.insert_spans: a span already stored there is skipped). With ``span_store = segments``
  OTLP spans never go there (a store may keep rows merged there by older releases: they stay readable).
- ``span_segments``: the catalog of the tail, one row per Parquet file the collector's loader published
  (``span_store = segments``): seq, absolute file path, rows, min/max ``start_ns`` and the spool position
  loaded with it. A decoder process writes the file under a temporary name and fsyncs it
  (:func:`write_segment`); the loader renames it to ``<seq>.parquet`` and then commits, in one DuckDB
  transaction, the catalog row, the ``spool_loaded`` mark and the new ``spans`` view (:func:`add`). At start
  (:func:`recover`) a file without a catalog row (a batch whose commit never happened: its requests are
  still in the spool and load again; a merged file whose compaction never committed) is deleted, and a catalog
  row whose file is missing is an error.
- ``span_merged``: the catalog of the merged files (:func:`compact`): each holds the spans of a run of tail
  segments (``min_seq``..``max_seq``) that no other part holds, once each, with column ``_seg`` (the segment
  each row came from: the session model's marks, :func:`since_sql`).
- ``spans`` (:func:`view_sql`): ``spans_part`` UNION ALL the merged files UNION ALL the tail deduplicated span
  by span: a span repeated in two segments (a re-batched or retried export) is read from the first, and a tail
  span already in ``spans_part`` or a merged file (looked up in the tail's ``start_ns`` range, so DuckDB reads
  only the row groups there) is not read again. The view is re-made in the transaction that changes a catalog,
  so a reader sees a catalog and its view together.
- :func:`compact` merges the oldest tail segments into one merged file per group (same dedupe), lists it and
  unlists the segments in one transaction, and moves their files to ``span_segments_retired``; :func:`sweep`
  deletes retired files once no read snapshot can list them (the collector's snapshots copy the catalogs and
  read the live files).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
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
# Parquet dictionary encoding for the string columns whose values repeat from span to span (model, service, role,
# session, ...), not for those unique to a span: pyarrow tries a dictionary on every column by default and falls
# back to plain pages once it outgrows its page, which makes the write and the merge's read dearer and the file
# larger (figures: docs/collectors.md, part G)
NO_DICTIONARY = frozenset({"trace_id", "span_id", "parent_span_id", "attributes", "response_id", "request_id",
                           "block_hashes"})


def write_options(schema: pa.Schema) -> dict:
    """pyarrow Parquet writer options of span files (segments and merged files)."""
    dictionary = [f.name for f in schema
                  if (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)) and f.name not in NO_DICTIONARY]
    return {"compression": COMPRESSION, "use_dictionary": dictionary or False}


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
    seq: int | None = None  # the seq it must be published as (its column ``_seg``); None: no such column


class SegmentWriter:
    """A segment written a table at a time, each a row group (a decoder writes a batch as it decodes it, so it never
    holds the whole batch's columns): ``write`` the tables, then ``close`` (fsync'd; the :class:`SegmentFile`, None
    when no row was written) or ``abort`` (the file deleted). With ``seq`` (the seq the loader will publish it as)
    every row gets column ``_seg`` = ``seq``, last, as a merged file has it, so the file can later be listed as a
    merged file as it is (:func:`promotable`)."""

    def __init__(self, directory: str, seq: int | None = None):
        os.makedirs(directory, exist_ok=True)
        self.tmp = os.path.join(directory, f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}")
        self.seq = seq
        self.rows = 0
        self.lo: int | None = None
        self.hi: int | None = None
        self._w: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self.seq is not None:
            table = table.append_column("_seg", _int64s(np.full(table.num_rows, self.seq, np.int64)))
        if self._w is None:
            self._w = pq.ParquetWriter(self.tmp, table.schema, **write_options(table.schema))
        self._w.write_table(_conform(table, self._w.schema))
        self.rows += table.num_rows
        mm = pc.min_max(table["start_ns"])
        for v in (mm["min"].as_py(), mm["max"].as_py()):
            if v is not None:
                self.lo, self.hi = (v if self.lo is None else min(self.lo, v)), (v if self.hi is None else max(self.hi, v))

    def close(self) -> SegmentFile | None:
        if self._w is None:
            return None
        self._w.close()
        fsync_path(self.tmp)
        return SegmentFile(self.tmp, self.rows, self.lo, self.hi, self.seq)

    def abort(self) -> None:
        if self._w is not None:
            self._w.close()
        Path(self.tmp).unlink(missing_ok=True)


def write_segment(table: pa.Table, directory: str, seq: int | None = None) -> SegmentFile:
    """Write ``table`` as one segment file (:class:`SegmentWriter`) and fsync it (a decoder process does this)."""
    if not table.num_rows:
        raise ValueError("a span segment needs at least one row")
    w = SegmentWriter(directory, seq)
    try:
        w.write(table)
        out = w.close()
    except BaseException:
        w.abort()
        raise
    assert out is not None
    return out


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a directory (a directory: so a rename or a new name in it survives a crash) by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seg_name(seq: int) -> str:
    return f"{seq:016d}{SUFFIX}"


def publish_file(seg: SegmentFile, seq: int) -> str:
    """Rename the decoder's file to its final name ``<seq>.parquet`` (fsync'd directory); returns the path. The
    caller then commits :func:`add` in its transaction, and deletes the file if that fails."""
    if seg.seq is not None and seg.seq != seq:  # its rows say _seg = seg.seq
        raise StoreError(f"span segment {seg.tmp} was written for seq {seg.seq}, published as {seq}")
    final = os.path.join(os.path.dirname(seg.tmp), seg_name(seq))
    os.rename(seg.tmp, final)
    fsync_path(os.path.dirname(final))
    return final


def add(cur: duckdb.DuckDBPyConnection, seq: int, file: str, seg: SegmentFile, spool: tuple[int, int],
        view: bool = True) -> None:
    """Inside the caller's transaction: the catalog row of a published file, and the ``spans`` view with it
    (``view=False``: the caller adds more rows and calls :func:`ensure_view` once, before its commit)."""
    cur.execute("INSERT INTO span_segments VALUES (?, ?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
                [seq, file, seg.rows, seg.min_start_ns, seg.max_start_ns, spool[0], spool[1]])
    if view:
        ensure_view(cur)


def next_seq(cur: duckdb.DuckDBPyConnection) -> int:
    """The seq the next published segment gets (above every one published, merged ones included)."""
    return int(cur.execute("SELECT coalesce(greatest((SELECT max(seq) FROM span_segments), "
                           "(SELECT max(max_seq) FROM span_compactions), (SELECT max(max_seq) FROM span_merged)), 0) "
                           "+ 1").fetchall()[0][0])


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def read_sql(files: list[str]) -> str:
    """``read_parquet`` over segment files (a relation; column ``filename`` added)."""
    return f"read_parquet([{', '.join(_lit(f) for f in files)}], filename = true, union_by_name = true)"


def _bounds(rows: list[tuple]) -> tuple[int, int] | None:
    """The ``start_ns`` range of catalog rows (``(file, min_start_ns, max_start_ns, ...)``); None: unbounded (a
    file without start times)."""
    if not rows or any(r[1] is None or r[2] is None for r in rows):
        return None
    return int(min(r[1] for r in rows)), int(max(r[2] for r in rows))


def _in(alias: str, bounds: tuple[int, int] | None) -> str:
    return "TRUE" if bounds is None else f"{alias}.start_ns BETWEEN {bounds[0]} AND {bounds[1]}"


def _overlapping(merged: list[tuple], bounds: tuple[int, int] | None) -> list[str]:
    """The merged files whose ``start_ns`` range meets ``bounds`` (those a tail span could repeat)."""
    return [m[0] for m in merged
            if bounds is None or m[1] is None or m[2] is None or (m[1] <= bounds[1] and m[2] >= bounds[0])]


def _columns(cur: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """spans_part's columns and types (what every part of the ``spans`` view gives). (``PRAGMA table_info``: half
    the CPU of a ``duckdb_columns()`` query, which the loader paid on every commit.)"""
    return [(str(r[1]), str(r[2])) for r in cur.execute("PRAGMA table_info('main.spans_part')").fetchall()]


def _merged_rows(cur: duckdb.DuckDBPyConnection) -> list[tuple]:
    return cur.execute("SELECT file, min_start_ns, max_start_ns, min_seq, max_seq FROM span_merged "
                       "ORDER BY min_seq").fetchall()


# a tail row's place: its segment's seq (the file name, seg_name) in the high bits, its row in the file below
_ORD = "(CAST(parse_filename(t.filename, true) AS BIGINT) * 4294967296 + t.file_row_number)"


# a file's columns by (path, size, mtime): a published file is never rewritten (a new one gets a new name), and the
# loader reads the oldest and newest tail files' schemas on every commit (0.9 ms each by DuckDB)
_SCHEMAS: dict[tuple[str, int, int], list[tuple[str, str]]] = {}
_SCHEMAS_MAX = 4096


def _schema(cur: duckdb.DuckDBPyConnection, file: str) -> list[tuple[str, str]]:
    st = os.stat(file)
    key = (file, st.st_size, st.st_mtime_ns)
    got = _SCHEMAS.get(key)
    if got is None:
        got = [(str(r[0]), str(r[1])) for r in
               cur.execute(f"DESCRIBE SELECT * FROM read_parquet({_lit(file)})").fetchall()]
        if len(_SCHEMAS) >= _SCHEMAS_MAX:
            _SCHEMAS.clear()
        _SCHEMAS[key] = got
    return got


def _columns_of(cur: duckdb.DuckDBPyConnection, files: list[str]) -> tuple[set[str], bool]:
    """The columns ``files`` have, and whether their schemas differ (a release that changed the span columns
    between the oldest and the newest file; they are in publication order). Reads two footers: reading the files
    by name (``union_by_name``) binds every footer, ~10 ms for the tail's 32 on every commit, so it is used only
    when the schemas differ."""
    first = _schema(cur, files[0])
    last = _schema(cur, files[-1]) if len(files) > 1 else first
    return {c for c, _ty in first} | {c for c, _ty in last}, first != last


def _src(files: list[str], by_name: bool) -> str:
    return (f"read_parquet([{', '.join(_lit(f) for f in files)}], filename = true, file_row_number = true"
            f"{', union_by_name = true' if by_name else ''})")


def _keep_sql(rows: list[tuple], merged: list[tuple], by_name: bool) -> str:
    """The tail segments ``rows`` (catalog rows): each span's first copy (lowest seq, then row: column ``o``,
    as ``_ORD``) that is not stored already (in spans_part or a merged file, looked up in the tail's ``start_ns``
    range only, so DuckDB reads only the row groups there). Reads the key columns only."""
    b = _bounds(rows)
    cond = (f"NOT EXISTS (SELECT 1 FROM spans_part p WHERE {_in('p', b)} "
            "AND p.trace_id = t.trace_id AND p.span_id = t.span_id)")
    over = _overlapping(merged, b)
    if over:
        cond += (f" AND NOT EXISTS (SELECT 1 FROM read_parquet([{', '.join(_lit(f) for f in over)}]) m "
                 f"WHERE {_in('m', b)} AND m.trace_id = t.trace_id AND m.span_id = t.span_id)")
    return (f"SELECT t.trace_id, t.span_id, min({_ORD}) AS o FROM {_src([r[0] for r in rows], by_name)} t "
            f"WHERE {cond} GROUP BY t.trace_id, t.span_id")


def _tail_select(cur: duckdb.DuckDBPyConnection, rows: list[tuple], merged: list[tuple]) -> str:
    """The tail's rows, each span once (:func:`_keep_sql`), in spans_part's columns: the key columns pick the
    rows, the wide ones stream through a join (no window over whole rows: memory stays that of the keys)."""
    have, by_name = _columns_of(cur, [r[0] for r in rows])
    sel = ", ".join(f'CAST(t."{c}" AS {ty}) AS "{c}"' if c in have else f'CAST(NULL AS {ty}) AS "{c}"'
                    for c, ty in _columns(cur))
    return (f"SELECT {sel} FROM {_src([r[0] for r in rows], by_name)} t "
            f"JOIN ({_keep_sql(rows, merged, by_name)}) k "
            f"ON t.trace_id = k.trace_id AND t.span_id = k.span_id AND {_ORD} = k.o")


def _merged_select(cur: duckdb.DuckDBPyConnection, files: list[str]) -> str:
    """The merged files' rows (each span once by construction) in spans_part's columns."""
    have, by_name = _columns_of(cur, files)
    src = f"read_parquet([{', '.join(_lit(f) for f in files)}]{', union_by_name = true' if by_name else ''})"
    sel = ", ".join(f'CAST("{c}" AS {ty}) AS "{c}"' if c in have else f'CAST(NULL AS {ty}) AS "{c}"'
                    for c, ty in _columns(cur))
    return f"SELECT {sel} FROM {src}"


def tail_sql(cur: duckdb.DuckDBPyConnection) -> str | None:
    """The rows the ``spans`` view adds to ``spans_part`` — the merged files' and the tail's, each span once —
    in spans_part's columns, or None: no Parquet files."""
    rows = cur.execute("SELECT file, min_start_ns, max_start_ns FROM span_segments ORDER BY seq").fetchall()
    merged = _merged_rows(cur)
    parts = []
    if merged:
        parts.append(_merged_select(cur, [m[0] for m in merged]))
    if rows:
        parts.append(_tail_select(cur, rows, merged))
    return " UNION ALL ".join(parts) if parts else None


def view_sql(cur: duckdb.DuckDBPyConnection) -> str:
    """The ``spans`` view for the catalogs as ``cur`` sees them: spans_part, the merged files, the deduplicated
    tail."""
    tail = tail_sql(cur)
    return "SELECT * FROM spans_part" if tail is None else f"SELECT * FROM spans_part UNION ALL {tail}"


def ensure_view(cur: duckdb.DuckDBPyConnection) -> None:
    cur.execute(f"CREATE OR REPLACE VIEW spans AS {view_sql(cur)}")


def since_sql(cur: duckdb.DuckDBPyConnection, cols: str, seq: int) -> str | None:
    """The rows (``cols``) of the segments published after segment ``seq`` (the session model's mark): the tail's
    segments above it and the merged files' rows that came from them (column ``_seg``); None: none. A span can
    come twice (a retried export in two tail segments)."""
    parts = []
    files = [r[0] for r in cur.execute("SELECT file FROM span_segments WHERE seq > ? ORDER BY seq",
                                       [int(seq)]).fetchall()]
    if files:
        parts.append(f"SELECT {cols} FROM {read_sql(files)}")
    merged = [r[0] for r in cur.execute("SELECT file FROM span_merged WHERE max_seq > ? ORDER BY min_seq",
                                        [int(seq)]).fetchall()]
    if merged:
        parts.append(f"SELECT {cols} FROM read_parquet([{', '.join(_lit(f) for f in merged)}]) "
                     f"WHERE _seg > {int(seq)}")
    return " UNION ALL ".join(parts) if parts else None


def not_in_files_sql(cur: duckdb.DuckDBPyConnection, alias: str, lo: int | None, hi: int | None) -> str:
    """A condition (`` AND NOT EXISTS …``, or ``""``) that the span ``alias``.(trace_id, span_id) is in no merged
    file or tail segment whose ``start_ns`` range meets ``lo``..``hi`` (None: all): what an insert into
    ``spans_part`` adds so that a span already stored in Parquet is not stored twice."""
    # (a query of a missing table would abort the caller's transaction: looked up first)
    if cur.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name "
                   "= 'main' AND table_name IN ('span_merged', 'span_segments')").fetchall()[0][0] < 2:
        return ""  # not a store migrated to 0005
    rows = _merged_rows(cur) + cur.execute("SELECT file, min_start_ns, max_start_ns FROM span_segments").fetchall()
    b = None if lo is None or hi is None else (int(lo), int(hi))
    files = _overlapping(rows, b)
    if not files:
        return ""
    return (f" AND NOT EXISTS (SELECT 1 FROM read_parquet([{', '.join(_lit(f) for f in files)}], union_by_name = true)"
            f" f WHERE {_in('f', b)} AND f.trace_id = {alias}.trace_id AND f.span_id = {alias}.span_id)")


def directories(cur: duckdb.DuckDBPyConnection) -> list[str]:
    """The directories the ``spans`` view reads files from (a sandbox allows exactly those)."""
    try:
        rows = cur.execute("SELECT DISTINCT file FROM span_segments").fetchall()
    except duckdb.CatalogException:  # not an agentobs store (or before migration 0004)
        return []
    try:
        rows += cur.execute("SELECT DISTINCT file FROM span_merged").fetchall()
    except duckdb.CatalogException:  # before migration 0005
        pass
    return sorted({os.path.dirname(r[0]) + os.sep for r in rows})


def recover(cur: duckdb.DuckDBPyConnection, directory: str) -> int:
    """At start: delete the files under ``directory`` that no catalog row lists (unpublished batches, merged files
    whose compaction never committed, retired files); a catalog row whose file is missing is a StoreError.
    Returns the files deleted."""
    listed = {r[0] for r in cur.execute("SELECT file FROM span_segments UNION ALL SELECT file FROM span_merged"
                                        ).fetchall()}
    missing = sorted(f for f in listed if not os.path.exists(f))
    if missing:
        raise StoreError(f"span segment file(s) listed in the store's catalog (span_segments, span_merged) are "
                         f"missing: {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''} — restore them, or "
                         "the store was moved without its .segments directory")
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
    rows: int = 0  # rows written to merged files (copies of stored spans skipped)
    seconds: float = 0.0
    left: int = 0  # segments still in the tail
    files: int = 0  # merged files written
    remerged: int = 0  # merged files merged again (plan_remerge)
    promoted: int = 0  # segments listed as merged files as they are (commit_promote; in ``segments`` too)


def _crash_point(step: str) -> None:
    """Between the steps of a compaction (the crash-safety test stops the process here)."""


def _int64s(a: np.ndarray) -> pa.Array:
    """An Arrow int64 array over ``a``'s memory: ``pa.array(ndarray)`` first asks whether ``a`` is a pandas object,
    which imports pandas (+46 MB RSS in the collector's process, whose merge is the only caller)."""
    a = np.ascontiguousarray(a, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(a), [None, pa.py_buffer(a)])


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t`` in a merge's ``schema`` (the union of its inputs': a release may have added columns between them):
    columns cast, the missing ones null."""
    if t.schema == schema:
        return t
    return pa.table([t[f.name].cast(f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type)
                     for f in schema], schema=schema)


def _without_seg(schema: pa.Schema) -> pa.Schema:
    i = schema.get_field_index("_seg")
    return schema if i < 0 else schema.remove(i)


def merged_name(lo: int, hi: int) -> str:
    return f"merged-{lo:016d}-{hi:016d}{SUFFIX}"


@dataclass
class MergePlan:
    """A group of tail segments to merge (:func:`plan_merge`) and the rows of it to keep."""

    rows: list[tuple]  # catalog rows (file, min_start_ns, max_start_ns, seq, rows), in seq order
    keep: np.ndarray  # the rows kept, as ``_ORD`` (seq << 32 | row in its file), ascending
    directory: str

    @property
    def first(self) -> int:
        return int(self.rows[0][3])

    def head(self, n: int) -> MergePlan:
        """The plan of its first ``n`` segments (the rows it keeps of them are the same)."""
        if n >= len(self.rows):
            return self
        return MergePlan(self.rows[:n], self.keep[(self.keep >> 32) <= int(self.rows[n - 1][3])], self.directory)

    @property
    def last(self) -> int:
        return int(self.rows[-1][3])


@dataclass
class MergeFile:
    """What :func:`write_merge` wrote: a temporary file (None: every span of the group was stored already)."""

    tmp: str | None
    rows: int
    min_start_ns: int | None
    max_start_ns: int | None


def plan_merge(cur: duckdb.DuckDBPyConnection, group: int, keep: int = 0) -> MergePlan | None:
    """The oldest tail segments, at most ``group`` and leaving ``keep``, and the rows to keep of them (:func:`_keep_sql`:
    each span once, none already stored; DuckDB reads the key columns only); None: ``keep`` or fewer segments."""
    n = int(cur.execute("SELECT count(*) FROM span_segments").fetchall()[0][0])
    if n <= keep:
        return None
    rows = cur.execute("SELECT file, min_start_ns, max_start_ns, seq, rows FROM span_segments ORDER BY seq LIMIT ?",
                       [min(max(1, group), n - keep)]).fetchall()
    files = [r[0] for r in rows]
    res = cur.execute(f"SELECT o FROM ({_keep_sql(rows, _merged_rows(cur), _columns_of(cur, files)[1])}) "
                      "ORDER BY o").fetchnumpy()
    o = np.asarray(res["o"], dtype=np.int64)
    return MergePlan(rows, o, os.path.dirname(rows[0][0]))


def write_merge(plan: MergePlan) -> MergeFile:
    """Write the plan's rows to a temporary file in its directory, fsync'd, with column ``_seg`` (each row's
    segment). pyarrow only, no DuckDB: the collector's loader runs it in a thread of its own while it goes on
    storing batches. pyarrow copies the rows segment by segment (one row group each: the rows arrive in time
    order, so a row group's ``start_ns`` range is narrow and the lookups of later merges read few), so memory is
    one segment's."""
    o = plan.keep
    if not len(o):
        return MergeFile(None, 0, None, None)
    rows, files = plan.rows, [r[0] for r in plan.rows]
    seqs, rownums = o >> 32, o & 0xFFFFFFFF
    tmp = os.path.join(plan.directory, f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}")
    # the group's columns (a release may have added some between its segments): the union, missing ones null
    # (a segment the loader wrote has column _seg already: its seq, the value it gets here)
    schema = pa.unify_schemas([_without_seg(pq.read_schema(f)) for f in files]).append(pa.field("_seg", pa.int64()))
    writer: pq.ParquetWriter | None = None
    lo = hi = None
    try:
        for file, _lo, _hi, seq, _n in rows:
            take = rownums[seqs == seq]
            if not len(take):
                continue
            # (not pq.read_table: its dataset layer costs more; without threads: Arrow's pool costs more CPU than
            # this thread reading one segment — docs/collectors.md, part G)
            t = pq.ParquetFile(file).read(use_threads=False)
            if "_seg" in t.column_names:
                t = t.drop_columns(["_seg"])
            if len(take) < t.num_rows:  # copies dropped (the usual segment has none: no copy of its rows)
                t = t.take(_int64s(take))
            t = t.append_column("_seg", _int64s(np.full(t.num_rows, seq, np.int64)))
            if writer is None:
                writer = pq.ParquetWriter(tmp, schema, **write_options(schema))
            writer.write_table(_conform(t, schema))
            mm = pc.min_max(t["start_ns"])
            for v in (mm["min"].as_py(), mm["max"].as_py()):
                if v is not None:
                    lo, hi = (v if lo is None else min(lo, v)), (v if hi is None else max(hi, v))
    except BaseException:
        if writer is not None:
            writer.close()
        Path(tmp).unlink(missing_ok=True)
        raise
    assert writer is not None
    writer.close()
    fsync_path(tmp)
    return MergeFile(tmp, len(o), lo, hi)


def commit_merge(cur: duckdb.DuckDBPyConnection, plan: MergePlan, out: MergeFile) -> str | None:
    """Rename the merged file to ``merged-<first seq>-<last seq>.parquet`` (fsync'd directory), then one
    transaction: its ``span_merged`` row, the group's catalog rows deleted and their files retired, a
    ``span_compactions`` row, the ``spans`` view re-made. Returns the file (None: nothing was written). The catalog
    must still list the plan's segments as the oldest of the tail (one merge at a time)."""
    final = None
    if out.tmp is not None:
        final = os.path.join(plan.directory, merged_name(plan.first, plan.last))
        os.rename(out.tmp, final)
        fsync_path(plan.directory)
        _crash_point("renamed")
    try:
        with transaction(cur):
            if final is not None:
                cur.execute("INSERT INTO span_merged VALUES (?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
                            [final, out.rows, out.min_start_ns, out.max_start_ns, plan.first, plan.last])
            cur.execute("INSERT INTO span_compactions VALUES (?, ?, NULL, NULL, ?, now()::TIMESTAMP)",
                        [plan.last, len(plan.rows), out.rows])
            cur.execute("INSERT INTO span_segments_retired SELECT file, now()::TIMESTAMP FROM span_segments "
                        "WHERE seq <= ?", [plan.last])
            cur.execute("DELETE FROM span_segments WHERE seq <= ?", [plan.last])
            ensure_view(cur)
    except BaseException:
        if final is not None:  # rolled back: the file no catalog row lists goes now (recover() would)
            Path(final).unlink(missing_ok=True)
        raise
    _crash_point("committed")
    return final


# -- segments listed as merged files as they are -------------------------------------------------------------
# A merge has two jobs: each span once (the dedupe) and few files. The dedupe needs only the key columns
# (plan_merge reads them); the rewrite is for the files' count. A segment of PROMOTE_MIN_ROWS rows or more is a
# file worth keeping as it is: when the plan keeps every one of its rows and the loader wrote it with its _seg
# column, it is listed in span_merged under its own name (min_seq = max_seq = its seq) instead of being copied
# into a new file; small ones are merged again later with the others (plan_remerge). Figures: docs/collectors.md
# part J.
PROMOTE_MIN_ROWS = 8192


def promotable(cur: duckdb.DuckDBPyConnection, plan: MergePlan) -> int:
    """How the plan starts: ``n > 0``, its first ``n`` segments can be listed as merged files as they are
    (:func:`commit_promote`); ``n < 0``, its first ``-n`` cannot, and are the ones to merge into a new file (the
    promotable ones after them are left for the next plan). A segment can when it has ``PROMOTE_MIN_ROWS`` rows
    or more, the plan keeps every one of them (no copy of a stored span, no span repeated from an earlier
    segment), and it has column ``_seg`` last (:func:`write_segment` with its seq)."""
    seqs, counts = np.unique(plan.keep >> 32, return_counts=True)
    kept = dict(zip(seqs.tolist(), counts.tolist(), strict=True))
    run = 0
    for file, _lo, _hi, seq, rows in plan.rows:
        ok = (rows >= PROMOTE_MIN_ROWS and kept.get(int(seq), 0) == rows
              and _schema(cur, file)[-1] == ("_seg", "BIGINT"))
        if run and ok != (run > 0):
            break
        run += 1 if ok else -1
    return run


def commit_promote(cur: duckdb.DuckDBPyConnection, plan: MergePlan, n: int) -> None:
    """One transaction: the plan's first ``n`` segments (:func:`promotable`) listed in ``span_merged`` under their own
    names and out of the tail, a ``span_compactions`` row, the ``spans`` view re-made. No file is written, renamed
    or retired: a crash leaves them in one catalog or the other."""
    rows = plan.rows[:n]
    with transaction(cur):
        cur.executemany("INSERT INTO span_merged VALUES (?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
                        [[f, int(k), lo, hi, int(q), int(q)] for f, lo, hi, q, k in rows])
        cur.execute("INSERT INTO span_compactions VALUES (?, ?, NULL, NULL, ?, now()::TIMESTAMP)",
                    [int(rows[-1][3]), n, sum(int(r[4]) for r in rows)])
        cur.execute("DELETE FROM span_segments WHERE seq <= ?", [int(rows[-1][3])])
        ensure_view(cur)
    _crash_point("committed")


def promote_or_head(cur: duckdb.DuckDBPyConnection, plan: MergePlan) -> tuple[int, MergePlan | None]:
    """What a merge does with ``plan`` first (the collector's loader and :func:`compact` alike): its leading
    promotable segments listed as they are (:func:`commit_promote`) → (how many, None); else (0, the plan of its
    leading segments that are not, to write with :func:`write_merge` and :func:`commit_merge`)."""
    k = promotable(cur, plan)
    if k > 0:
        commit_promote(cur, plan, k)
        return k, None
    return 0, plan.head(-k)


# -- merged files merged again -------------------------------------------------------------------------------
# A merged file holds the spans of one tail merge: ~compact_after/2 segments, so its size follows the traffic (a
# quiet collector's batches are a request or two: files of a few hundred spans). Left alone they pile up — every
# commit re-makes the view over all of them and every query opens each — so runs of REMERGE_FANOUT adjacent
# merged files of the same size class (level: floor(log_8 rows)) are merged again into one, up to REMERGE_MAX_ROWS
# a file: a file only ever joins files of its own size, so each span is rewritten at most once per level (at most
# log_8 of 2M ÷ its first file's rows times; a run of mixed sizes would rewrite the big file for every few small
# ones). Measured in docs/collectors.md, part I.
REMERGE_FANOUT = 8
REMERGE_MAX_ROWS = 1 << 21
REMERGE_ROW_GROUP = 65_536  # row groups of a file merged again: the inputs' (one per segment) coalesced up to this


def _level(rows: int) -> int:
    level, cap = 0, REMERGE_FANOUT
    while rows >= cap:
        level, cap = level + 1, cap * REMERGE_FANOUT
    return level


@dataclass
class RemergePlan:
    """A run of adjacent merged files (in seq order) to write as one (:func:`plan_remerge`)."""

    rows: list[tuple]  # span_merged rows (file, rows, min_start_ns, max_start_ns, min_seq, max_seq), in seq order
    directory: str

    @property
    def first(self) -> int:
        return int(self.rows[0][4])

    @property
    def last(self) -> int:
        return int(self.rows[-1][5])


def merged_count(cur: duckdb.DuckDBPyConnection) -> int:
    return int(cur.execute("SELECT count(*) FROM span_merged").fetchall()[0][0])


def plan_remerge(cur: duckdb.DuckDBPyConnection, fanout: int = REMERGE_FANOUT) -> RemergePlan | None:
    """The oldest run of ``fanout`` adjacent merged files of one level whose rows together stay within
    ``REMERGE_MAX_ROWS`` (adjacent: the seq ranges follow each other, so the new file's range holds no other
    file's); None: no such run."""
    rows = cur.execute("SELECT file, rows, min_start_ns, max_start_ns, min_seq, max_seq FROM span_merged "
                       "ORDER BY min_seq").fetchall()
    run: list[tuple] = []
    for r in rows:
        if run and (_level(int(r[1])) != _level(int(run[0][1])) or sum(int(x[1]) for x in run) + int(r[1])
                    > REMERGE_MAX_ROWS):
            run = []
        if int(r[1]) < REMERGE_MAX_ROWS:
            run.append(r)
        if len(run) == fanout:
            return RemergePlan(run, os.path.dirname(run[0][0]))
    return None


def write_remerge(plan: RemergePlan, stop: threading.Event | None = None) -> MergeFile:
    """Write the plan's files, in seq order, into one temporary file in their directory (fsync'd), row groups
    coalesced up to ``REMERGE_ROW_GROUP`` rows (each input's row groups follow the segments' time order, so the
    ranges stay narrow). pyarrow only, as :func:`write_merge`: memory is one row group's. ``stop`` set (the
    collector stopping): given up between row groups, the file deleted (``tmp`` None)."""
    pfs = [pq.ParquetFile(r[0]) for r in plan.rows]  # (each footer read once: small files cost mostly that)
    schema = pa.unify_schemas([pf.schema_arrow for pf in pfs])
    tmp = os.path.join(plan.directory, f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}")
    writer = pq.ParquetWriter(tmp, schema, **write_options(schema))
    pending: list[pa.Table] = []
    n = 0

    def flush() -> None:
        if pending:
            t = pa.concat_tables(pending)
            writer.write_table(t, row_group_size=t.num_rows)
            pending.clear()

    try:
        for pf in pfs:
            for i in range(pf.num_row_groups):
                if stop is not None and stop.is_set():
                    writer.close()
                    Path(tmp).unlink(missing_ok=True)
                    return MergeFile(None, 0, None, None)
                t = _conform(pf.read_row_group(i, use_threads=False), schema)
                pending.append(t)
                n += t.num_rows
                if sum(x.num_rows for x in pending) >= REMERGE_ROW_GROUP:
                    flush()
        flush()
    except BaseException:
        writer.close()
        Path(tmp).unlink(missing_ok=True)
        raise
    writer.close()
    fsync_path(tmp)
    los = [r[2] for r in plan.rows if r[2] is not None]
    his = [r[3] for r in plan.rows if r[3] is not None]
    return MergeFile(tmp, n, min(los) if los else None, max(his) if his else None)


def commit_remerge(cur: duckdb.DuckDBPyConnection, plan: RemergePlan, out: MergeFile) -> str:
    """Rename the file to ``merged-<first seq>-<last seq>.parquet`` (fsync'd directory), then one transaction:
    its ``span_merged`` row in, the plan's rows out and their files retired (:func:`sweep`), the ``spans`` view
    re-made. A crash before the commit leaves a file no catalog row lists (:func:`recover` deletes it)."""
    assert out.tmp is not None
    final = os.path.join(plan.directory, merged_name(plan.first, plan.last))
    os.rename(out.tmp, final)
    fsync_path(plan.directory)
    _crash_point("renamed")
    files = [r[0] for r in plan.rows]
    try:
        with transaction(cur):
            cur.execute("INSERT INTO span_segments_retired SELECT file, now()::TIMESTAMP FROM span_merged "
                        "WHERE list_contains(?, file)", [files])
            gone = cur.execute("DELETE FROM span_merged WHERE list_contains(?, file)", [files]).fetchall()[0][0]
            if gone != len(files):
                raise StoreError(f"merged files changed while being merged again ({gone} of {len(files)} listed)")
            cur.execute("INSERT INTO span_merged VALUES (?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
                        [final, out.rows, out.min_start_ns, out.max_start_ns, plan.first, plan.last])
            ensure_view(cur)
    except BaseException:
        Path(final).unlink(missing_ok=True)
        raise
    _crash_point("committed")
    return final


def compact(con: duckdb.DuckDBPyConnection, max_seconds: float | None = None, group: int = 16,
            keep: int = 0) -> Compacted:
    """Merge the oldest tail segments, ``group`` at a time, into merged Parquet files until ``keep`` are left or
    ``max_seconds`` have passed (checked between groups). Each group (:func:`plan_merge`, :func:`write_merge`,
    :func:`commit_merge`): its spans not stored already (in spans_part or an earlier merged file), once each (the
    first segment's copy), written in seq order (a row group per segment) with column ``_seg`` (each row's segment:
    the session model's marks) under a temporary name, fsync'd, renamed to
    ``merged-<first seq>-<last seq>.parquet``; then one transaction: the ``span_merged`` row, the tail's catalog
    rows deleted and their files retired (:func:`sweep` deletes them), a ``span_compactions`` row, the ``spans``
    view re-made. A crash before the commit leaves files no catalog row lists (:func:`recover` deletes them; the
    tail segments are still listed), after it retired files (deleted too): nothing lost, nothing read twice."""
    t0 = time.perf_counter()
    out = Compacted()
    cur = con.cursor()
    try:
        while True:
            plan = None
            in_time = max_seconds is None or time.perf_counter() - t0 < max_seconds
            if in_time:
                plan = plan_merge(cur, group, keep)
            if plan is None:
                again = plan_remerge(cur) if in_time else None
                if again is not None:
                    done = write_remerge(again)
                    _crash_point("written")
                    commit_remerge(cur, again, done)
                    out.remerged += len(again.rows)
                    continue
                out.left = int(cur.execute("SELECT count(*) FROM span_segments").fetchall()[0][0])
                break
            k, rest = promote_or_head(cur, plan)
            if rest is None:
                out.segments += k
                out.promoted += k
                continue
            plan = rest
            written = write_merge(plan)
            _crash_point("written")
            final = commit_merge(cur, plan, written)
            out.segments += len(plan.rows)
            out.rows += written.rows
            out.files += final is not None
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
