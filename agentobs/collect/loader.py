"""The spool loader: decode, normalise and store spooled OTLP requests, off the acknowledgement path.

One thread reads durable records from the spool (``agentobs/collect/spool.py``) in batches of up to
``loader_batch_mb``, hands each batch to a pool of ``loader_processes`` decoder processes (each reads
its records from the segment file, decodes and normalises them into one Arrow table, and sends it
back), and stores the batches in spool order. Each batch is one DuckDB transaction: the spans and a row
of ``spool_loaded`` saying how far the spool has been loaded. At start the loader resumes after the last
``spool_loaded`` row, so a request is stored once however the previous process ended; the segments
wholly loaded are deleted.

Where the spans go is the setting ``span_store`` (agentobs/store/segments.py):

- ``table``: the decoder sends the batch back as Arrow IPC and the loader thread inserts it into
  ``spans_part`` (``store.writer.insert_spans``: append-only, a span already stored is skipped).
- ``segments``: the decoder writes the batch as a Parquet file under ``<db>.segments`` (temporary name,
  fsync'd) and sends back only its name; the loader thread renames it to ``<seq>.parquet`` and commits the
  catalog row with the ``spool_loaded`` row. A file whose commit never happened is deleted at the next start
  (its requests load again from the spool). When ``segment_compact_after`` segments are unmerged, the oldest are
  merged into one large Parquet file (DuckDB holds no table part for them): the loader thread picks the rows
  (``segments.plan_merge``, on the key columns), a thread of its own writes the file (``segments.write_merge``,
  pyarrow) while the loader goes on storing batches, and the loader thread commits it (``segments.commit_merge``)
  once written; the small files are deleted once no read snapshot can list them.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from ..config import Settings, load_settings
from ..errors import ConfigError, InputError
from ..store import segments
from ..store.db import transaction
from ..store.writer import insert_spans
from . import otlp, otlp_native
from .health import Health
from .spool import Record, Spool

# merged span files listed beyond which they are merged again even while batches keep coming (else only when the
# loader is idle: docs/collectors.md, part I)
REMERGE_FORCE_FILES = 512
# idle, for merging merged files again: no batch read from the spool for this long (a moment between two batches
# under load is not: the merge would then compete with ingest for the cores, part J)
REMERGE_IDLE_S = 5.0
log = logging.getLogger(__name__)
MAX_NOTES = 5
# segments layout: a batch is decoded and written this many body bytes at a time, a row group each, into its one
# file: a decoder then peaks as with 4 MiB batches, not with the whole batch's columns (docs/collectors.md part J)
DECODE_CHUNK_BYTES = 4 << 20

_settings: Settings | None = None


def _init_worker(settings: Settings) -> None:
    global _settings
    _settings = settings
    if settings.loader_decoder == "native":
        otlp_native.warm_up(settings)  # imports and ptars' descriptors now, not in the first batch


@dataclass
class Batch:
    ipc: bytes | None  # Arrow IPC stream of the spans (SPAN_SCHEMA); None when no span was valid
    requests: int
    accepted: int
    rejected: int
    malformed: int  # requests that did not decode at all
    notes: list[str]
    reasons: dict[str, int] = field(default_factory=dict)  # rejected spans by reason (otlp.Decoded.reasons)
    segment: segments.SegmentFile | None = None  # span_store = segments: the Parquet file written instead of ipc


def decode_records(items: list[tuple[str, int, int, str, str, int]], settings: Settings | None = None,
                   segment_dir: str | None = None, seq: int | None = None) -> Batch:
    """Decode spooled requests: ``items`` are (segment path, offset, length, format, transport, seq). With
    ``segment_dir`` the spans are written there as a Parquet segment (``Batch.segment``; with ``seq``, the seq the
    loader will publish it as, in its column ``_seg``), else returned as IPC.

    Protobuf bodies go through the native decoder (``otlp_native``: one Arrow pass over each ``DECODE_CHUNK_BYTES``)
    when ``loader_decoder`` is ``native``; the requests it leaves (rare shapes) and JSON bodies through
    ``otlp.py``. A batch ptars cannot parse is decoded by ``otlp.py`` request by request."""
    settings = settings or _settings or load_settings()
    tables: list[pa.Table] = []
    acc = rej = bad = 0
    notes: list[str] = []
    reasons: dict[str, int] = {}
    # segments: each DECODE_CHUNK_BYTES of the batch is one row group of its file, written once decoded (a span
    # repeated in two of them is in the file twice, as in two segments: readers and the merge keep the first)
    writer = segments.SegmentWriter(segment_dir, seq) if segment_dir is not None else None
    try:
        for lo, hi in _chunks(items, DECODE_CHUNK_BYTES if writer is not None else 1 << 62):
            t, a, r, m, n, why = _decode_part(items[lo:hi], settings)
            acc, rej, bad = acc + a, rej + r, bad + m
            notes.extend(n[:MAX_NOTES - len(notes)])
            for k, v in why.items():
                reasons[k] = reasons.get(k, 0) + v
            if writer is not None and t:
                writer.write(first_of_each_span(pa.concat_tables(t).combine_chunks() if len(t) > 1 else t[0]))
            else:
                tables += t
        seg = writer.close() if writer is not None else None
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    ipc = None
    if tables:
        table = first_of_each_span(pa.concat_tables(tables).combine_chunks() if len(tables) > 1 else tables[0])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        ipc = sink.getvalue().to_pybytes()
    return Batch(ipc, len(items), acc, rej, bad, notes, reasons, seg)


def _chunks(items: list[tuple[str, int, int, str, str, int]], size: int) -> list[tuple[int, int]]:
    """``items`` cut into runs of at most ``size`` body bytes (a request larger than that alone): (start, end)."""
    out, lo, acc = [], 0, 0
    for k, it in enumerate(items):
        if k > lo and acc + it[2] > size:
            out.append((lo, k))
            lo, acc = k, 0
        acc += it[2]
    if lo < len(items):
        out.append((lo, len(items)))
    return out


def _decode_part(items: list[tuple[str, int, int, str, str, int]], settings: Settings
                 ) -> tuple[list[pa.Table], int, int, int, list[str], dict[str, int]]:
    """Decode ``items`` (:func:`decode_records`): tables, accepted, rejected, malformed, notes, rejected by reason."""
    tables, acc, rej, bad = [], 0, 0, 0
    notes: list[str] = []
    reasons: dict[str, int] = {}
    bodies = _read_bodies(items)
    python_idx = list(range(len(items)))
    if settings.loader_decoder == "native":
        pb = [k for k, it in enumerate(items) if it[3] != "json"]
        fallback: set[int] = set()
        groups = [pb]
        while groups:
            grp = groups.pop()
            try:
                res = otlp_native.decode_bodies([bodies[k] for k in grp], [f"otlp-{items[k][4]}" for k in grp],
                                                settings)
            except Exception as e:  # noqa: BLE001 - ptars refused a body: the others natively, that one by otlp.py
                if len(grp) > 1:
                    groups += [grp[:len(grp) // 2], grp[len(grp) // 2:]]
                else:
                    fallback.add(grp[0])
                    log.debug("native decode refused %s (%s: %s)", items[grp[0]][:2], type(e).__name__, e)
                continue
            if res.table is not None:
                tables.append(res.table)
            acc += sum(res.accepted)
            fallback.update(grp[k] for k in res.fallback_requests)
        pb_set = set(pb)
        python_idx = [k for k in python_idx if k not in pb_set or k in fallback]
    for k in python_idx:
        _path, off, _n, fmt, transport, seq = items[k]
        body = bodies[k]
        where = f"spool segment {seq} offset {off}"
        try:
            if fmt == "json":
                doc = otlp.parse_json_bytes(body, where)
                if doc == {}:
                    continue
                dec = otlp.decode_json_obj(doc, settings, f"otlp-{transport}", where)
            else:
                dec = otlp.decode_protobuf(body, settings, f"otlp-{transport}", where)
            t = dec.table() if dec.accepted else None
        except (InputError, ValueError, TypeError, OverflowError, pa.ArrowException) as e:
            bad += 1
            if len(notes) < MAX_NOTES:
                notes.append(f"{where}: {e}")
            continue
        if t is not None:
            tables.append(t)
        acc += dec.accepted
        rej += dec.rejected
        for r, v in dec.reasons.items():
            reasons[r] = reasons.get(r, 0) + v
        notes.extend(dec.errors[:MAX_NOTES - len(notes)])
    return tables, acc, rej, bad, notes, reasons


def first_of_each_span(table: pa.Table) -> pa.Table:
    """``table`` without a span (trace_id, span_id) repeated in it, first occurrence kept, order kept (a segment's
    row group; the ``table`` layout's batch, which the loader stores with ``insert_spans(unique=True)``, whose
    in-batch check in SQL costs about as much as the rest of the insert: docs/collectors.md)."""
    n = table.num_rows
    if n < 2:
        return table
    keys = []
    for col in ("trace_id", "span_id"):
        a = table[col].combine_chunks()
        if a.null_count:  # the decoders never keep a span without ids; should one come, by Python
            return _first_by_set(table)
        off = np.frombuffer(a.buffers()[1], np.int32, n + 1, a.offset * 4)
        w = int(off[1] - off[0])
        if not (np.diff(off) == w).all():  # ids of other lengths (not from the decoders): by Python
            return _first_by_set(table)
        keys.append(np.frombuffer(a.buffers()[2], np.uint8, n * w, off[0]).reshape(n, w))
    key = np.ascontiguousarray(np.hstack(keys)).view(np.dtype((np.void, keys[0].shape[1] + keys[1].shape[1])))
    _, first = np.unique(key.ravel(), return_index=True)
    if len(first) == n:
        return table
    return table.take(pa.array(np.sort(first)))


def _first_by_set(table: pa.Table) -> pa.Table:
    seen: set = set()
    keep = []
    for i, k in enumerate(zip(table["trace_id"].to_pylist(), table["span_id"].to_pylist(), strict=True)):
        if k not in seen:
            seen.add(k)
            keep.append(i)
    return table if len(keep) == table.num_rows else table.take(pa.array(keep))


def _read_bodies(items: list[tuple[str, int, int, str, str, int]]) -> list[bytes]:
    out = []
    f = None
    cur_path = None
    try:
        for path, off, n, *_ in items:
            if f is None or path != cur_path:
                if f:
                    f.close()
                f = open(path, "rb")
                cur_path = path
            f.seek(off)
            out.append(f.read(n))
    finally:
        if f:
            f.close()
    return out


def _drop(b: Batch, published: str | None = None) -> None:
    """Delete a batch's segment file that will not be committed (its records load again from the spool)."""
    for f in (published, b.segment.tmp if b.segment is not None else None):
        if f:
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass


def _read_ipc(ipc: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(ipc)).read_all()


def stored_position(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """(segment, body end offset) loaded so far, from ``spool_loaded``; (0, 0) for none."""
    row = con.execute("SELECT segment, end_offset FROM spool_loaded ORDER BY segment DESC, end_offset DESC "
                      "LIMIT 1").fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def default_processes() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Loader:
    """``Loader(spool, con, settings, health).start()``; ``stop()`` stores the batches already being decoded
    and leaves the rest in the spool for the next start. ``processes=0`` decodes in the loader thread."""

    def __init__(self, spool: Spool, con: duckdb.DuckDBPyConnection, settings: Settings,
                 health: Health | None = None, processes: int | None = None, batch_bytes: int | None = None,
                 retire_grace_s: float = 0.0):
        if settings.loader_decoder not in ("native", "python"):
            raise ConfigError(f"setting loader_decoder: {settings.loader_decoder!r} is not one of native, python")
        self.layout = segments.check_layout(settings.span_store)
        self.spool = spool
        self.cur = con.cursor()
        self.segment_dir: str | None = None
        if self.layout == "segments":
            path = self.cur.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
                                    ).fetchall()[0][0]
            self.segment_dir = segments.segments_dir(path or ":memory:")
        self.compact_after = max(1, int(settings.segment_compact_after))
        self.retire_grace_s = retire_grace_s  # merged small files are deleted this long after (snapshots list them)
        self.compacted_segments = 0
        self.merged_files = 0  # listed in span_merged (segments layout; read at start and after each merge commit)
        self.remerged_files = 0  # merged files merged again
        self.promoted_segments = 0  # segments listed as merged files as they are (segments.promotable)
        self._merged_gen = 0  # merged files added by this loader: a run to merge again is looked for when it moves
        self._remerge_looked = -1  # the _merged_gen at which plan_remerge last found no run
        self.seq = self.tail = 0  # (segments layout: the next segment's seq and the unmerged segments, at start)
        self._merger: ThreadPoolExecutor | None = None  # writes merged files (segments layout)
        # the merge being written: tail segments into a merged file, or merged files merged again
        self._merge: tuple[segments.MergePlan | segments.RemergePlan, Future] | None = None
        self._merge_after = 0.0  # a failed merge: the next not before this (time.monotonic)
        self.settings = settings
        self.health = health or Health()
        if processes is None:  # the setting: 0 = one decoder process per core
            processes = settings.loader_processes or default_processes()
        self.processes = processes
        self.batch_bytes = batch_bytes or int(settings.loader_batch_mb * 1024 * 1024)
        self.depth = max(2, 2 * self.processes)  # batches being decoded at once
        self.max_group = self.depth  # batches stored in one commit at most (those decoded while one was stored)
        self.pool: ProcessPoolExecutor | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self.loaded_requests = 0
        self.loaded_spans = 0  # spans stored (duplicates of stored spans not counted)
        self.rejected_spans = 0
        self.errors = 0
        self.commits = 0  # transactions that stored batches (several batches decoded meanwhile share one)
        self.stored_batches = 0

    def start(self) -> Loader:
        self.position = stored_position(self.cur)
        self.spool.mark_loaded(*self.position)
        if self.segment_dir is not None:
            os.makedirs(self.segment_dir, exist_ok=True)
            dropped = segments.recover(self.cur, self.segment_dir)
            if dropped:
                log.info("span segments: %d file(s) of batches never committed deleted", dropped)
            self.seq = segments.next_seq(self.cur)
            self.tail = int(self.cur.execute("SELECT count(*) FROM span_segments").fetchall()[0][0])
            self.merged_files = segments.merged_count(self.cur)
            self._gauge_files()
            self._merger = ThreadPoolExecutor(1, thread_name_prefix="agentobs-merge")
        if self.processes > 0:
            self.pool = ProcessPoolExecutor(self.processes, mp_context=mp.get_context("forkserver"),
                                            initializer=_init_worker, initargs=(self.settings,))
            for f in [self.pool.submit(os.getpid) for _ in range(self.processes)]:
                f.result()  # the processes start now (a second or so of imports), not on the first export
        self._thread = threading.Thread(target=self._run, name="agentobs-loader", daemon=True)
        self._thread.start()
        return self

    def _submit(self, recs: list[Record], seq: int) -> Future:
        items = [(str(self.spool.path(r.seq)), r.offset, r.length, r.fmt, r.transport, r.seq) for r in recs]
        if self.pool is not None:
            return self.pool.submit(decode_records, items, None, self.segment_dir, seq)
        fut: Future = Future()
        try:
            fut.set_result(decode_records(items, self.settings, self.segment_dir, seq))
        except BaseException as e:  # noqa: BLE001 - re-raised by fut.result()
            fut.set_exception(e)
        return fut

    def _run(self) -> None:
        inflight: deque[tuple[list[Record], Future]] = deque()
        read_pos = self.position
        # the seq of the next batch submitted (segments layout: its file is published as that seq and its rows say
        # so in column _seg; a batch without spans leaves its seq unused)
        next_seq = self.seq
        last_read = 0.0  # (time.monotonic() of the last batch read: a loader just started is idle)
        while True:
            stopping = self._stop.is_set()
            if self.segment_dir is not None:
                self._merge_step(stopping, idle=not inflight and time.monotonic() - last_read > REMERGE_IDLE_S)
            # a batch is read once a decoder is free for it, not queued behind busy ones: under load the requests
            # arriving meanwhile join it (batches up to loader_batch_mb, large segments: part J); idle, at once
            while (not stopping and len(inflight) < self.depth
                   and sum(1 for _r, f in inflight if not f.done()) < max(1, self.processes)):
                recs = self.spool.read_from(*read_pos, max_records=100_000, max_bytes=self.batch_bytes,
                                            wait_s=0 if inflight else 0.05)
                if not recs:
                    break
                inflight.append((recs, self._submit(recs, next_seq)))
                next_seq += 1
                last_read = time.monotonic()
                read_pos = (recs[-1].seq, recs[-1].end)
            if stopping and inflight:
                # batches not yet picked up by a decoder stay in the spool; the ones being decoded are stored
                for _r, f in inflight:
                    f.cancel()
                keep = next((i for i, (_r, f) in enumerate(inflight) if f.cancelled()), len(inflight))
                while len(inflight) > keep:
                    inflight.pop()
            if not inflight:
                with self._idle:
                    self._idle.notify_all()
                if stopping:
                    self._merge_step(stopping, wait=True)  # a merged file being written: committed
                    return
                continue
            recs, fut = inflight.popleft()
            try:
                group = [(recs, fut.result())]
                # a backlog: the batches decoded meanwhile are stored in the same commit (one catalog commit and
                # one view re-bind for all: the fixed cost per commit, docs/collectors.md part G)
                while (inflight and len(group) < self.max_group and inflight[0][1].done()
                       and not inflight[0][1].cancelled() and inflight[0][1].exception() is None):
                    r2, f2 = inflight.popleft()
                    group.append((r2, f2.result()))
                self._store(group)
            except Exception as e:  # noqa: BLE001 - the batch stays in the spool; retried after a pause
                self.errors += 1
                self.health.write_errors.labels("loader").inc()
                log.warning("loading spool segment %s failed (%s: %s); retrying", recs[0].seq, type(e).__name__, e)
                for _r, f in inflight:
                    f.cancel()
                for _r, f in inflight:  # decoded batches that will be decoded again: their files go
                    if f.done() and not f.cancelled() and f.exception() is None:
                        _drop(f.result())
                inflight.clear()
                read_pos = self.position
                next_seq = self.seq
                if self._stop.wait(1.0):
                    return

    def _store(self, group: list[tuple[list[Record], Batch]]) -> None:
        """Store decoded batches (in spool order) in one transaction: their segment files (renamed first: a crash
        before the commit leaves files recover() deletes) and catalog rows, or their rows in spans_part; the
        ``spans`` view once; one ``spool_loaded`` row up to the last batch's end."""
        end = (group[-1][0][-1].seq, group[-1][0][-1].end)
        t0 = time.perf_counter()
        cur = self.cur
        published: list[str | None] = []
        seqs: list[int] = []
        inserted = 0
        try:
            for _recs, b in group:
                if b.segment is not None:
                    assert b.segment.seq is not None  # (given at submission: _run)
                    seqs.append(b.segment.seq)
                    published.append(segments.publish_file(b.segment, b.segment.seq))
                else:
                    published.append(None)
            with transaction(cur):
                for (recs, b), file in zip(group, published, strict=True):
                    if file is not None and b.segment is not None and b.segment.seq is not None:
                        segments.add(cur, b.segment.seq, file, b.segment, (recs[-1].seq, recs[-1].end), view=False)
                        inserted += b.segment.rows  # spans in the file (a copy of a stored span: readers drop it)
                    elif b.ipc is not None:
                        inserted += insert_spans(cur, _read_ipc(b.ipc), unique=True)
                if any(f is not None for f in published):
                    segments.ensure_view(cur)
                cur.execute("INSERT INTO spool_loaded VALUES (?, ?, ?, ?, ?, now())",
                            [end[0], end[1], sum(b.requests for _r, b in group),
                             sum(b.accepted for _r, b in group), sum(b.rejected for _r, b in group)])
        except BaseException:
            for k, (_recs, b) in enumerate(group):
                _drop(b, published[k] if k < len(published) else None)
            raise
        n_files = len(seqs)
        if seqs:
            self.seq = max(self.seq, seqs[-1] + 1)
        self.tail += n_files
        if n_files:
            self.health.span_files.labels("segment").set(self.tail)
        self.position = end
        self.spool.mark_loaded(*end)
        h = self.health
        h.on_commit(time.perf_counter() - t0, inserted)
        for _recs, b in group:
            for reason, n in b.reasons.items():  # invalid_id, invalid_count, too_deep, ...: docs/collectors.md
                h.spans_rejected.labels(reason).inc(n)
            if b.malformed:
                h.requests.labels("loader", "malformed").inc(b.malformed)
            for note in b.notes:
                log.info("spool: %s", note)
            self.loaded_requests += b.requests
            self.rejected_spans += b.rejected
        self.loaded_spans += inserted
        self.commits += 1
        self.stored_batches += len(group)

    def _merge_step(self, stopping: bool, wait: bool = False, idle: bool = False) -> None:
        """Commit the merge whose file is written (``wait``: wait for it), then start the next one when
        ``segment_compact_after`` segments are unmerged: its rows picked here, its file written by the merge thread
        (the oldest segments down to half the threshold; large ones listed as they are, ``segments.promotable``).
        Else, when the loader is ``idle`` (no batch being decoded, none read for ``REMERGE_IDLE_S``) or more than
        ``REMERGE_FORCE_FILES`` merged files are listed, merged files are merged again (``segments.plan_remerge``),
        written by the same thread. A failure is logged and retried a second later (the segments stay in the tail,
        the merged files listed: nothing is lost)."""
        try:
            if self._merge is not None:
                plan, fut = self._merge
                if not (wait or fut.done()):
                    return
                try:  # (_merge cleared once committed: merging() is true until then)
                    out = fut.result()
                    if isinstance(plan, segments.RemergePlan):
                        if out.tmp is None:  # given up at a stop
                            return
                        segments.commit_remerge(self.cur, plan, out)  # (its file is deleted if the commit fails)
                        self.remerged_files += len(plan.rows)
                        self._merged_gen += 1  # (a new file of the next level: maybe a run of its own)
                        self.health.span_merges.labels("again").inc()
                        log.debug("merged span files %d..%d merged again (%d rows)", plan.first, plan.last, out.rows)
                    else:
                        segments.commit_merge(self.cur, plan, out)  # (its file is deleted if the commit fails)
                        self.tail -= len(plan.rows)
                        self.compacted_segments += len(plan.rows)
                        if out.tmp is not None:
                            self._merged_gen += 1
                        self.health.span_merges.labels("segments").inc()
                        log.debug("span segments %d..%d merged (%d rows), %d left", plan.first, plan.last, out.rows,
                                  self.tail)
                    segments.sweep(self.cur, self.retire_grace_s)
                    self._recount_files()
                finally:
                    self._merge = None
            if stopping or time.monotonic() < self._merge_after:
                return
            if self.tail < self.compact_after:
                if ((idle or self.merged_files > REMERGE_FORCE_FILES) and self.merged_files >= segments.REMERGE_FANOUT
                        and self._merged_gen != self._remerge_looked):
                    again = segments.plan_remerge(self.cur)
                    if again is None:  # no run to merge: not looked for again until a merged file is added
                        self._remerge_looked = self._merged_gen
                        return
                    assert self._merger is not None
                    self._merge = (again, self._merger.submit(segments.write_remerge, again, self._stop))
                return
            keep = self.compact_after // 2
            # at most 2 x segment_compact_after segments a merge (a bounded write): a stop waits for it
            nxt = segments.plan_merge(self.cur, group=max(1, min(self.tail - keep, 2 * self.compact_after)), keep=keep)
            if nxt is None:
                self.tail = int(self.cur.execute("SELECT count(*) FROM span_segments").fetchall()[0][0])
                return
            # large segments with no copy to drop are listed as merged files as they are (nothing rewritten); else
            # the ones before the next such segment are written into a new file by the merge thread
            k, rest = segments.promote_or_head(self.cur, nxt)
            if rest is None:
                self.tail -= k
                self.compacted_segments += k
                self.promoted_segments += k
                self._merged_gen += 1
                self.health.span_merges.labels("promoted").inc()
                self._recount_files()
                return
            assert self._merger is not None
            self._merge = (rest, self._merger.submit(segments.write_merge, rest))
        except Exception as e:  # noqa: BLE001 - the segments stay in the tail; merged again later
            self.errors += 1
            self.health.write_errors.labels("loader").inc()
            self._merge_after = time.monotonic() + 1.0
            log.warning("merging span segments failed (%s: %s); retrying", type(e).__name__, e)

    def _recount_files(self) -> None:
        """After a commit that changed span_merged: its count from the catalog (read once per commit), the gauges."""
        self.merged_files = segments.merged_count(self.cur)
        self._gauge_files()

    def _gauge_files(self) -> None:
        self.health.span_files.labels("segment").set(self.tail)
        self.health.span_files.labels("merged").set(self.merged_files)

    def merging(self) -> bool:
        """A merge is being written, or is due (segments layout)."""
        return self._merge is not None or (self.segment_dir is not None and self.tail >= self.compact_after)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until everything durable in the spool now is stored, and no merge is being written or due (tests,
        bench)."""
        deadline = time.monotonic() + timeout
        target = self.spool.durable_end()
        while time.monotonic() < deadline:
            if target <= self.position and not self.merging():
                return True
            with self._idle:
                self._idle.wait(0.02)
        return False

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self._merger is not None:
            self._merger.shutdown(wait=True)
        self.cur.close()
