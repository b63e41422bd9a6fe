"""OTLP trace ingestion core shared by the gRPC and HTTP receivers.

``Ingest.export(n_spans, body, fmt, transport)`` takes one ExportTraceServiceRequest body that the
transport has already checked parses (protobuf or JSON), appends it to the durable spool and answers
once it is fsync'd: an acknowledged request is on disk and will be stored exactly once by the loader
(``agentobs/collect/loader.py``), which decodes, normalises and stores off this path. The outcome says
what the transport should answer:

* ``ok`` — spooled (or, for an identical body spooled before — an exporter's retry — acknowledged
  again without a second copy). Spans whose ids, times, kind or status code are invalid (found by the
  transport's ``scan_spans`` without decoding) are reported in the answer (OTLP ``partial_success``:
  their count and the first reason); every invalid span, those included, is counted by the loader
  (``agentobs_otlp_spans_rejected_total{reason}``) when it decodes the request.
* ``overloaded`` — the spool holds more unloaded bytes than ``spool_max_unloaded_mb`` or its disk has
  less than ``spool_min_free_mb`` free: HTTP 429 / gRPC RESOURCE_EXHAUSTED with a retry delay.
  Nothing was spooled; the client retries.
* ``unavailable`` — the spool could not write in time, or the receiver is shutting down: HTTP 503 /
  gRPC UNAVAILABLE. Retrying is safe: the same body is recognised by its hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..config import Settings
from ..errors import StoreError
from . import otlp
from .health import Health
from .spool import Spool, SpoolFull


@dataclass
class Outcome:
    status: str  # ok | overloaded | unavailable
    accepted: int = 0
    rejected: int = 0
    message: str = ""
    retry_after_s: float = 0.0
    duplicate: bool = False


def count_spans(req: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


def _skeletons() -> tuple[type[Message], ...]:
    """Two message classes that read an ExportTraceServiceRequest only as deep as the acknowledgement needs.

    ``Request``: ``resource_spans`` (1) → ``scope_spans`` (2) → ``spans`` (2) kept as ``bytes``: every other
    field (resource, scope, schema URLs, all of a span) is an unknown field to it, which upb skips by its
    wire type and length without looking inside. ``CheckedRequest``: the same down to the spans, and of
    each span only what ``otlp.check_span`` and the id checks read (ids, kind, times, status code)."""
    t = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="agentobs_ack_skeleton.proto", package="agentobs.ack",
                                            syntax="proto3")
    messages = {
        "Request": [("resource_spans", 1, t.TYPE_MESSAGE, "ResourceSpans", True)],
        "ResourceSpans": [("scope_spans", 2, t.TYPE_MESSAGE, "ScopeSpans", True)],
        "ScopeSpans": [("spans", 2, t.TYPE_BYTES, "", True)],
        "CheckedRequest": [("resource_spans", 1, t.TYPE_MESSAGE, "CheckedResourceSpans", True)],
        "CheckedResourceSpans": [("scope_spans", 2, t.TYPE_MESSAGE, "CheckedScopeSpans", True)],
        "CheckedScopeSpans": [("spans", 2, t.TYPE_MESSAGE, "CheckedSpan", True)],
        "CheckedSpan": [("trace_id", 1, t.TYPE_BYTES, "", False), ("span_id", 2, t.TYPE_BYTES, "", False),
                        ("parent_span_id", 4, t.TYPE_BYTES, "", False), ("kind", 6, t.TYPE_INT32, "", False),
                        ("start_time_unix_nano", 7, t.TYPE_FIXED64, "", False),
                        ("end_time_unix_nano", 8, t.TYPE_FIXED64, "", False),
                        ("status", 15, t.TYPE_BYTES, "", False)],  # read by _STATUS when not empty
        "CheckedStatus": [("code", 3, t.TYPE_INT32, "", False)],
    }
    for name, fields in messages.items():
        m = fd.message_type.add(name=name)
        for field, num, typ, sub, repeated in fields:
            m.field.add(name=field, number=num, type=typ, label=t.LABEL_REPEATED if repeated else t.LABEL_OPTIONAL,
                        **({"type_name": f".agentobs.ack.{sub}"} if sub else {}))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"agentobs.ack.{name}"))
                 for name in ("Request", "CheckedRequest", "CheckedStatus"))


_SKELETON, _CHECKED, _STATUS = _skeletons()
_ZERO16, _ZERO8 = bytes(16), bytes(8)


def scan_protobuf(data: bytes, where: str = "body") -> int:
    """The number of spans in a protobuf ExportTraceServiceRequest ``data``, for the acknowledgement: the
    wire format is walked down to the spans (``_skeletons``; about 1/17 of a full parse's CPU,
    docs/collectors.md), a span's content is not looked at — the loader decodes and checks it. A body whose
    framing breaks above the spans goes to the full parse (``otlp.parse_protobuf``), which salvages what
    it can or raises InputError (the receivers answer 400): the same verdict and count as parsing every
    body in full (tests/test_collect_ack_scan.py)."""
    try:
        req = _SKELETON.FromString(data)
    except DecodeError:
        full, _ = otlp.parse_protobuf(data, where)
        return count_spans(full)
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


def scan_json_spans(doc: dict, where: str = "body") -> tuple[int, int, str]:
    """(spans, spans the loader will reject, the first one's reason) of an OTLP/JSON ExportTraceServiceRequest
    already parsed (``otlp.parse_json_bytes``), for OTLP partial success: the spans of the resourceSpans and
    scopeSpans that are objects with a ``spans`` list (``instrumentationLibrarySpans``, the pre-1.0 name, as the
    decoder reads it), each given the decoder's own span-level checks (``otlp.json_span_head`` and
    ``otlp.json_span_numbers`` + ``otlp.check_span``: ids, name and status message text, nesting cut out by
    the parser, kind, times, status code), in the decoder's order and with its messages. Attributes and
    events are left to the loader, as ``scan_spans`` leaves them for protobuf."""
    n = rejected = 0
    first = ""
    for ri, rs in enumerate(doc.get("resourceSpans") or []):
        if not isinstance(rs, dict):
            continue
        scope_spans = rs.get("scopeSpans", rs.get("instrumentationLibrarySpans"))
        for si, ss in enumerate(scope_spans if isinstance(scope_spans, list) else []):
            if not (isinstance(ss, dict) and isinstance(ss.get("spans"), list)):
                continue
            for pi, sp in enumerate(ss["spans"]):
                n += 1
                try:
                    _, _, _, _, kind, code, _ = otlp.json_span_head(sp)
                    otlp.check_span(*otlp.json_span_numbers(sp, kind, code))
                except (ValueError, TypeError, OverflowError) as e:
                    rejected += 1
                    if not first:
                        first = f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]: {e}"
    return n, rejected, first


class Ingest:
    def __init__(self, spool: Spool, settings: Settings, health: Health | None = None,
                 commit_timeout_s: float | None = None, retry_after_s: float | None = None):
        self.spool = spool
        self.settings = settings
        self.health = health or Health()
        self.commit_timeout_s = commit_timeout_s if commit_timeout_s is not None else settings.receiver_commit_timeout_s
        self.retry_after_s = retry_after_s if retry_after_s is not None else settings.receiver_retry_after_s
        self.closing = False

    def refuse(self, transport: str, outcome: str, spans: int, reason: str) -> None:
        """Count a request refused before spooling (malformed, unauthorized, too large)."""
        self.health.requests.labels(transport, outcome).inc()
        if spans:
            self.health.spans_rejected.labels(reason).inc(spans)

    def export(self, n_spans: int, body: bytes, fmt: str, transport: str, rejected: int = 0,
               first_rejection: str = "") -> Outcome:
        """Spool ``body`` (an ExportTraceServiceRequest, ``fmt`` protobuf or json) holding ``n_spans`` spans, of
        which ``rejected`` are known bad already (``scan_spans``; the first one's reason): an ``ok`` outcome
        reports them for OTLP partial success. The loader still rejects and counts them by reason."""
        h = self.health
        if self.closing:
            h.requests.labels(transport, "unavailable").inc()
            h.spans_rejected.labels("shutting_down").inc(n_spans)
            return Outcome("unavailable", message="receiver is shutting down", retry_after_s=self.retry_after_s)
        if n_spans == 0:  # nothing to store: acknowledged without touching the disk
            h.requests.labels(transport, "ok").inc()
            return Outcome("ok")
        try:
            new = self.spool.append(body, fmt, transport, timeout=self.commit_timeout_s)
        except SpoolFull as full:
            h.requests.labels(transport, "overloaded").inc()
            h.spans_rejected.labels("spool_full").inc(n_spans)
            return Outcome("overloaded", message=f"{full}; retry later", retry_after_s=self.retry_after_s)
        except (TimeoutError, StoreError) as e:
            h.requests.labels(transport, "unavailable").inc()
            h.spans_rejected.labels("spool").inc(n_spans)
            h.write_errors.labels("spool").inc()
            return Outcome("unavailable", message=f"request not made durable: {e}", retry_after_s=self.retry_after_s)
        h.requests.labels(transport, "ok" if new else "duplicate").inc()
        if new:
            h.spans_received.labels(transport).inc(n_spans)
        h.spool_bytes.set(self.spool.unloaded_bytes())
        message = f"{rejected} of {n_spans} spans rejected; the first: {first_rejection}" if rejected else ""
        return Outcome("ok", accepted=n_spans - rejected, rejected=rejected, message=message, duplicate=not new)


def scan_spans(data: bytes, where: str = "body") -> tuple[int, int, str]:
    """(spans, spans the loader will reject, the first one's reason) of a protobuf ExportTraceServiceRequest,
    for OTLP partial success: ``scan_protobuf`` plus, per span, the checks that need no decode — trace/span/
    parent ids (``invalid_id``), times (``invalid_time``), kind and status code (``invalid_enum``), as
    ``otlp.decode_request`` makes them (its messages). A body this cannot read span by span (a span's
    framing broken) is counted by ``scan_protobuf`` with no rejections known: the loader rejects and counts
    what it finds."""
    try:
        req = _CHECKED.FromString(data)
    except DecodeError:
        return scan_protobuf(data, where), 0, ""
    status_code = _status_code
    n = rejected = 0
    first = ""
    for ri, rs in enumerate(req.resource_spans):
        for si, ss in enumerate(rs.scope_spans):
            for pi, sp in enumerate(ss.spans):
                n += 1
                t, s, p = sp.trace_id, sp.span_id, sp.parent_span_id
                start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
                if (len(t) == 16 and t != _ZERO16 and len(s) == 8 and s != _ZERO8
                        and (not p or (len(p) == 8 and p != _ZERO8))
                        and 0 < start <= otlp.INT64_MAX and (not end or start <= end <= otlp.INT64_MAX)
                        and 0 <= sp.kind <= otlp.INT8_MAX and (not (st := sp.status) or 0 <= status_code(st) <= otlp.INT8_MAX)):
                    continue
                rejected += 1
                if not first:
                    first = f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]: {_why_rejected(sp)}"
    return n, rejected, first


def _status_code(status: bytes) -> int:
    try:
        return _STATUS.FromString(status).code
    except DecodeError:  # a broken Status: the loader's full parse refuses this span (unparseable), not us
        return 0


def _why_rejected(sp) -> str:
    """The reason ``otlp.decode_request`` gives for a span ``scan_spans`` found bad (its own checks, in its order)."""
    try:
        otlp._id_from_bytes(sp.trace_id, 16, "traceId")
        otlp._id_from_bytes(sp.span_id, 8, "spanId")
        if sp.parent_span_id:
            otlp._id_from_bytes(sp.parent_span_id, 8, "parentSpanId")
        otlp.check_span(sp.kind, sp.start_time_unix_nano, sp.end_time_unix_nano, _status_code(sp.status))
    except ValueError as e:
        return str(e)
    return "invalid span"  # not reached: scan_spans' condition is these checks
