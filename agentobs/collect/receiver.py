"""OTLP trace ingestion core shared by the gRPC and HTTP receivers.

``Ingest.export(n_spans, body, fmt, transport)`` takes one ExportTraceServiceRequest body that the
transport has already checked parses (protobuf or JSON), appends it to the durable spool and answers
once it is fsync'd: an acknowledged request is on disk and will be stored exactly once by the loader
(``agentobs/collect/loader.py``), which decodes, normalises and stores off this path. The outcome says
what the transport should answer:

* ``ok`` — spooled (or, for an identical body spooled before — an exporter's retry — acknowledged
  again without a second copy). Spans that turn out invalid are counted by the loader
  (``agentobs_otlp_spans_rejected_total``), not in this answer.
* ``overloaded`` — the spool holds more unloaded bytes than ``spool_max_unloaded_mb`` or its disk has
  less than ``spool_min_free_mb`` free: HTTP 429 / gRPC RESOURCE_EXHAUSTED with a retry delay.
  Nothing was spooled; the client retries.
* ``unavailable`` — the spool could not write in time, or the receiver is shutting down: HTTP 503 /
  gRPC UNAVAILABLE. Retrying is safe: the same body is recognised by its hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..config import Settings
from ..errors import StoreError
from . import otlp
from .health import Health
from .spool import Spool


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


def _skeleton_request() -> type:
    """A message class that reads an ExportTraceServiceRequest down to its spans and no further:
    ``resource_spans`` (1) → ``scope_spans`` (2) → ``spans`` (2) kept as ``bytes``. Every other field
    (resource, scope, schema URLs, everything inside a span) is an unknown field to it, which upb skips by
    its wire type and length without looking inside."""
    fd = descriptor_pb2.FileDescriptorProto(name="agentobs_ack_skeleton.proto", package="agentobs.ack",
                                            syntax="proto3")
    rep, msg = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED, descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    for name, field, num, typ, sub in (("Request", "resource_spans", 1, msg, "ResourceSpans"),
                                       ("ResourceSpans", "scope_spans", 2, msg, "ScopeSpans"),
                                       ("ScopeSpans", "spans", 2, descriptor_pb2.FieldDescriptorProto.TYPE_BYTES, "")):
        f = fd.message_type.add(name=name).field.add(name=field, number=num, label=rep, type=typ)
        if sub:
            f.type_name = f".agentobs.ack.{sub}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("agentobs.ack.Request"))


_SKELETON = _skeleton_request()


def scan_protobuf(data: bytes, where: str = "body") -> int:
    """The number of spans in a protobuf ExportTraceServiceRequest ``data``, for the acknowledgement: the
    wire format is walked down to the spans (``_SKELETON``; about 1/17 of a full parse's CPU,
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


def count_json_spans(doc: dict) -> int:
    n = 0
    for rs in doc.get("resourceSpans") or []:
        if isinstance(rs, dict):
            for ss in rs.get("scopeSpans") or []:
                if isinstance(ss, dict) and isinstance(ss.get("spans"), list):
                    n += len(ss["spans"])
    return n


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

    def export(self, n_spans: int, body: bytes, fmt: str, transport: str) -> Outcome:
        """Spool ``body`` (an ExportTraceServiceRequest, ``fmt`` protobuf or json) holding ``n_spans`` spans."""
        h = self.health
        if self.closing:
            h.requests.labels(transport, "unavailable").inc()
            h.spans_rejected.labels("shutting_down").inc(n_spans)
            return Outcome("unavailable", message="receiver is shutting down", retry_after_s=self.retry_after_s)
        if n_spans == 0:  # nothing to store: acknowledged without touching the disk
            h.requests.labels(transport, "ok").inc()
            return Outcome("ok")
        full = self.spool.admit()
        if full is not None:
            h.requests.labels(transport, "overloaded").inc()
            h.spans_rejected.labels("spool_full").inc(n_spans)
            return Outcome("overloaded", message=f"{full}; retry later", retry_after_s=self.retry_after_s)
        try:
            new = self.spool.append(body, fmt, transport, timeout=self.commit_timeout_s)
        except (TimeoutError, StoreError) as e:
            h.requests.labels(transport, "unavailable").inc()
            h.spans_rejected.labels("spool").inc(n_spans)
            h.write_errors.labels("spool").inc()
            return Outcome("unavailable", message=f"request not made durable: {e}", retry_after_s=self.retry_after_s)
        h.requests.labels(transport, "ok" if new else "duplicate").inc()
        if new:
            h.spans_received.labels(transport).inc(n_spans)
        h.spool_bytes.set(self.spool.unloaded_bytes())
        return Outcome("ok", accepted=n_spans, duplicate=not new)
