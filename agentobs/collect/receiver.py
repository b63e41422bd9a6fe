"""OTLP trace ingestion core shared by the gRPC and HTTP receivers.

``Ingest.export(request, transport)`` decodes one ExportTraceServiceRequest (already parsed from
protobuf or JSON), admits it against a bounded queue, hands the rows to the one ``Writer`` and waits
for the commit: a span is acknowledged only once it is in DuckDB. The outcome says what the
transport should answer:

* ``ok`` — committed; ``rejected``/``message`` fill ``ExportTracePartialSuccess`` when some spans
  were invalid (bad ids, end before start, ...), the valid rest is stored.
* ``overloaded`` — admitting the batch would exceed ``queue_spans`` spans in flight: HTTP 429 /
  gRPC RESOURCE_EXHAUSTED with a retry delay. Nothing was stored; the client retries.
* ``unavailable`` — the store did not commit in time or refused the batch, or the receiver is
  shutting down: HTTP 503 / gRPC UNAVAILABLE. Retrying is safe: rows are keyed by (trace_id,
  span_id), a retried batch inserts nothing twice.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..config import Settings
from ..errors import StoreError
from ..store.writer import Writer
from . import otlp
from .health import Health

MAX_MESSAGE = 5  # errors quoted in a partial-success message


@dataclass
class Outcome:
    status: str  # ok | overloaded | unavailable
    accepted: int = 0
    rejected: int = 0
    message: str = ""
    retry_after_s: float = 0.0


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
    def __init__(self, writer: Writer, settings: Settings, health: Health | None = None,
                 queue_spans: int | None = None, commit_timeout_s: float | None = None,
                 retry_after_s: float | None = None):
        self.writer = writer
        self.settings = settings
        self.health = health or Health()
        self.queue_spans = queue_spans if queue_spans is not None else settings.receiver_queue_spans
        self.commit_timeout_s = commit_timeout_s if commit_timeout_s is not None else settings.receiver_commit_timeout_s
        self.retry_after_s = retry_after_s if retry_after_s is not None else settings.receiver_retry_after_s
        self._lock = threading.Lock()
        self._inflight = 0
        self.closing = False

    @property
    def inflight(self) -> int:
        return self._inflight

    def _admit(self, n: int) -> bool:
        with self._lock:
            # one batch larger than the whole queue is still admitted when the queue is empty
            if self._inflight and self._inflight + n > self.queue_spans:
                return False
            self._inflight += n
            self.health.queue_spans.set(self._inflight)
            return True

    def _release(self, n: int) -> None:
        with self._lock:
            self._inflight -= n
            self.health.queue_spans.set(self._inflight)

    def refuse(self, transport: str, outcome: str, spans: int, reason: str) -> None:
        """Count a request refused before decoding (malformed, unauthorized, too large)."""
        self.health.requests.labels(transport, outcome).inc()
        if spans:
            self.health.spans_rejected.labels(reason).inc(spans)

    def export(self, n_spans: int, decode, transport: str) -> Outcome:
        """``decode()`` returns an ``otlp.Decoded``; it runs only once the batch is admitted."""
        h = self.health
        if self.closing:
            h.requests.labels(transport, "unavailable").inc()
            h.spans_rejected.labels("shutting_down").inc(n_spans)
            return Outcome("unavailable", message="receiver is shutting down", retry_after_s=self.retry_after_s)
        if not self._admit(n_spans):
            h.requests.labels(transport, "overloaded").inc()
            h.spans_rejected.labels("queue_full").inc(n_spans)
            return Outcome("overloaded", message=f"queue full ({self._inflight} spans in flight, limit "
                           f"{self.queue_spans}); retry later", retry_after_s=self.retry_after_s)
        try:
            dec: otlp.Decoded = decode()
            table = dec.table() if dec.accepted else None  # first: it may reject a row Arrow cannot store
            for reason, n in dec.reasons.items():
                h.spans_rejected.labels(reason).inc(n)
            if dec.accepted:
                ticket = self.writer.submit("spans", table)
                try:
                    ticket.wait(self.commit_timeout_s)
                except (TimeoutError, StoreError) as e:
                    h.requests.labels(transport, "unavailable").inc()
                    h.spans_rejected.labels("store").inc(dec.accepted)
                    h.write_errors.labels("receiver").inc()
                    return Outcome("unavailable", message=f"store did not commit: {e}",
                                   retry_after_s=self.retry_after_s)
                h.spans_received.labels(transport).inc(dec.accepted)
            h.requests.labels(transport, "partial" if dec.rejected else "ok").inc()
            notes = dec.errors[:MAX_MESSAGE] or dec.warnings[:MAX_MESSAGE]
            extra = len(dec.errors or dec.warnings) - len(notes)
            msg = "; ".join(notes) + (f"; and {extra} more" if extra > 0 else "")
            return Outcome("ok", accepted=dec.accepted, rejected=dec.rejected, message=msg)
        finally:
            self._release(n_spans)
