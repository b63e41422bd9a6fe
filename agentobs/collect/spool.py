"""The durable spool: raw OTLP request bodies, fsync'd before a receiver acknowledges them.

A receiver's acknowledgement means "this request will be stored": ``Spool.append`` returns once the
body is on disk. Decoding, normalising and storing happen later, off the acknowledgement path
(``agentobs/collect/loader.py``), which reads the spool back and records in the store, in the same
transaction as the spans, how far it has loaded; a restart resumes from there, so every acknowledged
request is loaded exactly once whatever moment the process died.

Layout: a directory of segment files ``<seq>.seg`` (seq a 16-digit counter); appends go to the newest
one, which is sealed (a new one opened) when it passes ``segment_bytes`` and on every open. A record is
``MAGIC | length u32 | crc32 u32 | blake2b-128 of the body | format u8 | transport u8 | body``; the
CRC covers everything after it, so a record torn by a crash (the only kind: records are fsync'd
whole before the next group is written) is found at open and cut off — it was never acknowledged.

Group commit: concurrent ``append`` calls queue their records; one committer thread writes every
queued record in one ``write`` and one ``fdatasync``, then wakes them all.

Retries: the body's hash is kept for the last ``dedupe_requests`` requests (rebuilt from the segments
still on disk at open). A body already spooled is acknowledged again without a second copy, which
is what an exporter retrying after a lost answer or a timeout sends.

Backpressure: ``append`` raises ``SpoolFull`` for a new body (the receiver answers 429 /
RESOURCE_EXHAUSTED with Retry-After) while the bytes spooled but not yet loaded exceed
``max_unloaded_bytes`` or the spool's file system has less than ``min_free_bytes`` free. The check and
the body's place in the queue are taken under one lock, so concurrent requests cannot all pass it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import StoreError
from ..store.segments import fsync_path

MAGIC = b"AOS1"
HEADER = struct.Struct("<4sII16sBB")  # magic, body length, crc32, hash, format, transport
FORMATS = {"protobuf": 0, "json": 1}
FORMAT_NAMES = {v: k for k, v in FORMATS.items()}
TRANSPORTS = {"grpc": 0, "http": 1, "other": 2}
TRANSPORT_NAMES = {v: k for k, v in TRANSPORTS.items()}
SUFFIX = ".seg"


def body_hash(body: bytes) -> bytes:
    """The first 16 bytes of the body's SHA-256 (cheaper than blake2b-128 with the CPU's SHA extensions: part G of
    docs/collectors.md). Spools written before hold blake2b-128: a retry of such a body is spooled again, and its
    spans are read once all the same (the store's span-level dedupe)."""
    return hashlib.sha256(body).digest()[:16]


@dataclass(frozen=True)
class Record:
    """Where one spooled request lies: segment ``seq``, ``offset`` of its body, its length."""

    seq: int
    offset: int  # of the body (after the header)
    length: int
    fmt: str
    transport: str

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass
class _Pending:
    data: bytes
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def seg_name(seq: int) -> str:
    return f"{seq:016d}{SUFFIX}"


def scan(path: Path, seq: int) -> tuple[list[Record], list[bytes], int]:
    """Every whole record of one segment file, their hashes, and the byte offset where whole records end."""
    data = path.read_bytes()
    recs, hashes, pos = [], [], 0
    while pos + HEADER.size <= len(data):
        magic, n, crc, h, fmt, tr = HEADER.unpack_from(data, pos)
        start = pos + HEADER.size
        if magic != MAGIC or start + n > len(data):
            break
        if zlib.crc32(memoryview(data)[pos + 12:start + n]) != crc:
            break
        recs.append(Record(seq, start, n, FORMAT_NAMES.get(fmt, "protobuf"), TRANSPORT_NAMES.get(tr, "other")))
        hashes.append(h)
        pos = start + n
    return recs, hashes, pos


class SpoolFull(Exception):
    """The spool refuses a new request for now (backpressure); the message says why."""


class Spool:
    def __init__(self, directory: str | os.PathLike, segment_bytes: int = 64 << 20,
                 max_unloaded_bytes: int = 1 << 30, min_free_bytes: int = 512 << 20,
                 dedupe_requests: int = 100_000, fsync: bool = True):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the spool directory {str(self.dir)!r}: {e}") from e
        self.segment_bytes = segment_bytes
        self.max_unloaded_bytes = max_unloaded_bytes
        self.min_free_bytes = min_free_bytes
        self.dedupe_requests = dedupe_requests
        self.fsync = fsync
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # committer: records queued; loaders: data durable
        self._queue: list[tuple[_Pending, int, str, str]] = []
        self._hashes: OrderedDict[bytes, _Pending | None] = OrderedDict()
        self._durable: dict[int, list[Record]] = {}  # seq -> durable records, in order
        self._sizes: dict[int, int] = {}  # seq -> durable bytes
        self._loaded: dict[int, int] = {}  # seq -> bytes of it loaded (records wholly before this offset)
        self._closed = False
        self.free_bytes = shutil.disk_usage(self.dir).free
        self._free_checked = 0
        for p in sorted(self.dir.glob("*" + SUFFIX)):
            try:
                seq = int(p.stem)
            except ValueError:
                continue
            recs, hashes, end = scan(p, seq)
            if end < p.stat().st_size:  # a torn last group: never acknowledged
                with open(p, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
            self._durable[seq] = recs
            self._sizes[seq] = end
            for h in hashes:
                self._remember(h, None)
        self._seq = max(self._durable, default=0) + 1  # appends always go to a new segment
        self._open_segment()
        self._thread = threading.Thread(target=self._commit_loop, name="agentobs-spool", daemon=True)
        self._thread.start()

    # -- appends ----------------------------------------------------------------------------
    def _open_segment(self) -> None:
        self._f = open(self.dir / seg_name(self._seq), "ab")
        self._durable[self._seq] = []
        self._sizes[self._seq] = 0
        fsync_path(self.dir)

    def _remember(self, h: bytes, p: _Pending | None) -> None:
        self._hashes[h] = p
        self._hashes.move_to_end(h)
        while len(self._hashes) > self.dedupe_requests:
            self._hashes.popitem(last=False)

    def unloaded_bytes(self) -> int:
        with self._lock:
            return self._unloaded()

    def _unloaded(self) -> int:
        return sum(size - self._loaded.get(seq, 0) for seq, size in self._sizes.items()) + sum(
            q[1] for q in self._queue)

    def _refusal(self) -> str | None:
        """Why a new request may not be spooled now (the 429 message), else None. Called with the lock held,
        so the check and the request's place in the queue are one step: concurrent requests cannot all pass
        a check made before any of them is queued."""
        unloaded = self._unloaded()
        if unloaded > self.max_unloaded_bytes:
            return f"spool holds {unloaded:,} bytes not yet loaded (limit {self.max_unloaded_bytes:,})"
        if self.free_bytes < self.min_free_bytes:
            return f"only {self.free_bytes:,} bytes free on the spool's disk (need {self.min_free_bytes:,})"
        return None

    def append(self, body: bytes, fmt: str = "protobuf", transport: str = "other",
               timeout: float | None = 30.0) -> bool:
        """Spool one request body; returns once it is fsync'd. False when the same body was spooled before
        (a retry: nothing is written again, even while the spool is full). Raises SpoolFull when the spool
        holds too many bytes not yet loaded or its disk is short, StoreError when the spool cannot write,
        TimeoutError when the write did not finish in ``timeout`` seconds."""
        h = body_hash(body)
        header_tail = struct.pack("<16sBB", h, FORMATS[fmt], TRANSPORTS.get(transport, 2))
        crc = zlib.crc32(body, zlib.crc32(header_tail))
        data = struct.pack("<4sII", MAGIC, len(body), crc) + header_tail + body
        with self._cond:
            if self._closed:
                raise StoreError("spool is closed")
            if h in self._hashes:
                prev = self._hashes[h]
                dup = True
            else:
                full = self._refusal()
                if full is not None:
                    raise SpoolFull(full)
                prev = _Pending(data)
                self._remember(h, prev)
                self._queue.append((prev, len(data), fmt, transport))
                self._cond.notify_all()
                dup = False
        if prev is not None:
            if not prev.done.wait(timeout):
                raise TimeoutError(f"spool write not durable within {timeout} s")
            if prev.error is not None:
                if dup:  # the first copy failed: this one must be written, not assumed
                    with self._cond:
                        self._hashes.pop(h, None)
                    return self.append(body, fmt, transport, timeout)
                raise StoreError(f"spool write failed: {prev.error}") from prev.error
        return not dup

    def _commit_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue and self._closed:
                    return
                batch, self._queue = self._queue, []
            err = None
            seq = self._seq
            start = self._sizes[seq]
            recs = []
            pos = start
            for _p, n, fmt, tr in batch:
                recs.append(Record(seq, pos + HEADER.size, n - HEADER.size, fmt, tr))
                pos += n
            try:
                self._f.write(b"".join(p.data for p, *_ in batch))
                self._f.flush()
                if self.fsync:
                    os.fdatasync(self._f.fileno())
            except OSError as e:
                err = e
                try:  # cut what may have been half written; the next group starts clean
                    self._f.truncate(start)
                except OSError:
                    pass
            with self._cond:
                if err is None:
                    self._durable[seq].extend(recs)
                    self._sizes[seq] = pos
                for p, *_ in batch:
                    p.error = err
                    p.data = b""  # the _Pending stays the hash's value: a duplicate waits on it, sees it done
                    p.done.set()
                self._cond.notify_all()
                rotate = err is None and pos >= self.segment_bytes
            if rotate:
                self._rotate()
            self._check_free()

    def _rotate(self) -> None:
        self._f.close()
        with self._cond:
            self._seq += 1
            self._open_segment()

    def _check_free(self) -> None:
        try:
            self.free_bytes = shutil.disk_usage(self.dir).free
        except OSError:
            pass

    # -- reading back (the loader) ------------------------------------------------------------
    def read_from(self, seq: int, offset: int, max_records: int, max_bytes: int,
                  wait_s: float = 0.0) -> list[Record]:
        """Durable records from (``seq``, body-end ``offset``) on, at most ``max_records`` / ``max_bytes``
        (at least one); waits up to ``wait_s`` for one when there is none."""
        with self._cond:
            out = self._collect(seq, offset, max_records, max_bytes)
            if not out and wait_s > 0 and not self._closed:
                self._cond.wait(wait_s)
                out = self._collect(seq, offset, max_records, max_bytes)
        return out

    def _collect(self, seq: int, offset: int, max_records: int, max_bytes: int) -> list[Record]:
        out: list[Record] = []
        size = 0
        for s in sorted(k for k in self._durable if k >= seq):
            for r in self._durable[s]:
                if s == seq and r.offset < offset:
                    continue
                if out and (len(out) >= max_records or size + r.length > max_bytes):
                    return out
                out.append(r)
                size += r.length
        return out

    def durable_end(self) -> tuple[int, int]:
        """(segment, body end offset) of the last durable record; (0, 0) for none."""
        with self._lock:
            for s in sorted(self._durable, reverse=True):
                if self._durable[s]:
                    return (s, self._durable[s][-1].end)
        return (0, 0)

    def path(self, seq: int) -> Path:
        return self.dir / seg_name(seq)

    def read(self, rec: Record) -> bytes:
        with open(self.path(rec.seq), "rb") as f:
            f.seek(rec.offset)
            return f.read(rec.length)

    def mark_loaded(self, seq: int, end: int) -> None:
        """Everything up to (``seq``, ``end``) is stored: delete the segments wholly loaded and sealed."""
        with self._cond:
            for s in sorted(self._sizes):
                if s < seq:
                    self._loaded[s] = self._sizes[s]
                elif s == seq:
                    self._loaded[s] = max(self._loaded.get(s, 0), end)
            done = [s for s in self._sizes if s != self._seq and self._loaded.get(s, 0) >= self._sizes[s]]
            for s in done:
                del self._sizes[s]
                del self._durable[s]
                self._loaded.pop(s, None)
        for s in done:
            self.path(s).unlink(missing_ok=True)

    def segments(self) -> list[int]:
        with self._lock:
            return sorted(self._sizes)

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._f.close()


