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

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..config import Settings
from ..errors import StoreError
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
