"""File import: OTLP (JSON, JSON lines, protobuf), Prometheus text snapshots, SGLang server-info,
KV-event captures. Everything goes through the one batching writer.

Each importer returns an ``ImportResult``: accepted/rejected counts, rows actually inserted
(re-importing the same data inserts nothing: primary keys), and the errors with file and
position. A bad file or line never stops the others.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .. import times
from ..config import Settings
from ..errors import InputError
from ..store.writer import Writer
from . import kvevents, otlp, prom, serverinfo
from .promcache import ScrapeLimit, SeriesParser

OTLP_SUFFIXES = (".json", ".jsonl", ".ndjson", ".pb", ".binpb", ".protobuf", ".otlp")
Progress = Callable[[int], None]  # advance by n bytes


@dataclass
class ImportResult:
    kind: str
    files: int = 0
    accepted: int = 0
    rejected: int = 0
    inserted: int = 0
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def merge(self, other: ImportResult) -> None:
        self.files += other.files
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.inserted += other.inserted
        self.errors.extend(other.errors)
        self.warnings.extend(other.warnings)

    @property
    def duplicates(self) -> int:
        return max(0, self.accepted - self.inserted)


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", str(path)) from e
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise InputError(f"truncated or corrupt gzip ({e})", str(path)) from e
    return data


def expand(paths: Iterable[str | os.PathLike], suffixes: tuple[str, ...] | None = None) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                name = f.name[:-3] if f.name.endswith(".gz") else f.name
                if f.is_file() and (suffixes is None or name.endswith(suffixes)):
                    out.append(f)
        else:
            out.append(p)
    return out


def _log(writer: Writer, res: ImportResult, source: str) -> None:
    writer.submit(
        "ingest_log",
        pa.table({
            "ts": [dt.datetime.now(dt.UTC).replace(tzinfo=None)],
            "source": [source],
            "kind": [res.kind],
            "accepted": [res.accepted],
            "rejected": [res.rejected],
            "detail": ["; ".join(res.errors[:5]) or None],
        }),
    )


# -- OTLP ----------------------------------------------------------------------------------------
def _protobuf_messages(data: bytes, where: str) -> Iterator[tuple[bytes, str]]:
    """A single ExportTraceServiceRequest, or the collector file exporter's length-prefixed stream
    (4-byte big-endian size before each message)."""
    try:
        ExportTraceServiceRequest.FromString(data)
        yield data, where
        return
    except DecodeError:
        pass
    off, i = 0, 0
    while off < len(data):
        if off + 4 > len(data):
            raise InputError(f"truncated length prefix at byte {off}", where)
        (n,) = struct.unpack(">I", data[off : off + 4])
        if off + 4 + n > len(data):
            raise InputError(f"message {i} at byte {off} claims {n} bytes but only {len(data) - off - 4} remain (truncated file?)", where)
        yield data[off + 4 : off + 4 + n], f"{where}: message {i} (byte {off})"
        off += 4 + n
        i += 1


def decode_otlp_file(path: Path, settings: Settings, progress: Progress | None = None) -> tuple[otlp.Decoded, list[str]]:
    """Decode one file; returns the spans and file-level errors (unparseable lines/messages)."""
    where = str(path)
    data = _read(path)
    dec = otlp.Decoded()
    errors: list[str] = []
    stripped = data.lstrip()
    if not stripped:
        raise InputError("empty file", where)
    if stripped[:1] in (b"{", b"["):
        lines = [ln for ln in data.splitlines()]
        nonempty = [ln for ln in lines if ln.strip()]
        one_doc = None
        if len(nonempty) > 1:
            try:
                first = json.loads(nonempty[0])
                one_doc = not isinstance(first, dict)
            except ValueError:
                one_doc = True
        else:
            one_doc = True
        if one_doc:
            doc = otlp.parse_json_bytes(data, where)
            docs = doc if isinstance(doc, list) else [doc]
            for i, d in enumerate(docs):
                w = where if len(docs) == 1 else f"{where}: [{i}]"
                dec.extend(otlp.decode_json_obj(d, settings, f"file:{path.name}", w))
        else:
            for lineno, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                w = f"{where}:{lineno}"
                try:
                    dec.extend(otlp.decode_json(line, settings, f"file:{path.name}", w))
                except InputError as e:
                    errors.append(str(e))
                if progress:
                    progress(len(line) + 1)
            return dec, errors
    else:
        try:
            for msg, w in _protobuf_messages(data, where):
                dec.extend(otlp.decode_protobuf(msg, settings, f"file:{path.name}", w))
        except InputError as e:
            if dec.accepted == 0:
                raise InputError(
                    "neither OTLP/JSON nor OTLP protobuf (ExportTraceServiceRequest, single or length-prefixed)", where
                ) from e
            errors.append(str(e))
    if progress:
        progress(len(data))
    return dec, errors


def import_otlp(paths: Iterable[str | os.PathLike], writer: Writer, settings: Settings,
                progress: Progress | None = None) -> ImportResult:
    res = ImportResult("otlp")
    tickets = []
    for path in expand(paths, OTLP_SUFFIXES):
        res.files += 1
        try:
            dec, errors = decode_otlp_file(path, settings, progress)
        except InputError as e:
            res.errors.append(str(e))
            res.rejected += 1
            continue
        table = dec.table() if dec.accepted else None  # first: it may reject a row Arrow cannot store
        res.errors.extend(errors)
        res.errors.extend(dec.errors)
        res.warnings.extend(dec.warnings)
        res.accepted += dec.accepted
        res.rejected += dec.rejected + len(errors)
        if dec.accepted:
            tickets.append(writer.submit("spans", table))
    for t in tickets:
        res.inserted += t.wait()
    _log(writer, res, ",".join(map(str, paths)))
    writer.flush()
    return res


# -- Prometheus text -----------------------------------------------------------------------------
_TS_IN_NAME = re.compile(r"(\d{9,}(?:\.\d+)?)")


def snapshot_time(path: Path, at: float | None) -> float:
    if at is not None:
        return at
    m = _TS_IN_NAME.search(path.stem)
    if m:
        return float(m.group(1))
    raise InputError(
        "cannot tell when this snapshot was taken: name it <epoch-seconds>.prom or pass --at", str(path)
    )


def parse_at(value: str | None) -> float | None:
    """--at: epoch seconds or an ISO-8601 time (UTC if no zone): agentobs.times.parse_time without spans."""
    try:
        return times.parse_time(value)
    except ValueError:
        raise InputError(f"--at {value!r} is neither epoch seconds nor an ISO-8601 time") from None


IMPORT_MAX_SERIES = 1_000_000  # series per snapshot file (the live scraper's cap is scrape_max_series)


def import_prom(paths: Iterable[str | os.PathLike], instance: str, writer: Writer, at: float | None = None,
                progress: Progress | None = None) -> ImportResult:
    res = ImportResult("prometheus")
    tickets = []
    files = expand(paths, (".prom", ".txt", ".metrics"))
    if at is not None and len(files) > 1:
        raise InputError("--at applies to one snapshot; a directory's snapshots are timed by their file names")
    last_cfg: dict[str, str] = {}
    # one target's snapshots repeat the same series: parsed once each, as the live scraper does (promcache)
    parser = SeriesParser(instance, max_series=IMPORT_MAX_SERIES)
    for path in files:
        res.files += 1
        try:
            ts = snapshot_time(path, at)
            text = _read(path).decode("utf-8", errors="strict")
            scrape = parser.parse(text, ts, str(path))
        except UnicodeDecodeError as e:
            res.errors.append(f"{path}: not UTF-8 text at byte {e.start}")
            res.rejected += 1
            continue
        except ScrapeLimit as e:
            res.errors.append(f"{path}: {e}")
            res.rejected += 1
            continue
        except InputError as e:
            res.errors.append(str(e))
            res.rejected += 1
            continue
        res.accepted += scrape.samples.num_rows
        tickets.append(writer.submit("metric_samples", scrape.samples))
        # engine config only when it changed
        cfg = dict(scrape.config or [])
        if cfg and cfg != last_cfg:
            writer.submit("engine_config", prom.config_table(instance, prom.to_utc(ts), scrape.engine or "vllm",
                                                             scrape.config or [], f"file:{path.name}"))
            last_cfg = cfg
        if progress:
            progress(path.stat().st_size)
    for t in tickets:
        res.inserted += t.wait()
    _log(writer, res, ",".join(map(str, paths)))
    writer.flush()
    return res


def import_server_info(path: str | os.PathLike, instance: str, writer: Writer, at: float | None = None) -> ImportResult:
    res = ImportResult("server-info", files=1)
    p = Path(path)
    data = _read(p)
    info = otlp.parse_json_bytes(data, str(p))
    ts = at if at is not None else p.stat().st_mtime
    table = serverinfo.server_info_rows(info, instance, ts, str(p), source=f"file:{p.name}")
    res.accepted = table.num_rows
    res.inserted = writer.write("engine_config", table)
    _log(writer, res, str(p))
    writer.flush()
    return res


def import_kv_events(paths: Iterable[str | os.PathLike], writer: Writer, instance: str | None = None,
                     progress: Progress | None = None) -> ImportResult:
    res = ImportResult("kv-events")
    tickets = []
    for path in expand(paths, (".jsonl", ".json", ".ndjson")):
        res.files += 1
        batch = kvevents.KVBatch()
        try:
            data = _read(path)
        except InputError as e:
            res.errors.append(str(e))
            res.rejected += 1
            continue
        for lineno, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            w = f"{path}:{lineno}"
            try:
                obj = otlp.parse_json_bytes(line, w)
                kvevents.decode_capture_line(obj, batch, w, instance)
            except InputError as e:
                res.errors.append(str(e))
                res.rejected += 1
        res.accepted += batch.events
        res.rejected += batch.rejected
        res.errors.extend(batch.errors)
        if batch.events:
            tickets.append(writer.submit("kv_events", batch.table()))
        if progress:
            progress(len(data))
    for t in tickets:
        res.inserted += t.wait()
    _log(writer, res, ",".join(map(str, paths)))
    writer.flush()
    return res

