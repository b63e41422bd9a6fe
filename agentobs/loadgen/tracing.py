"""The load generator traces itself with the real OpenTelemetry SDK: spans go over OTLP/HTTP to ``agentobs
collect`` (or any OTLP receiver), or straight into an agentobs store through the collector's own decoder
(the SDK's spans → the OTLP protobuf the receiver gets → agentobs.collect.otlp → the store writer), so a run
is an ordinary agentobs dataset either way."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from .. import __version__


class StoreExporter(SpanExporter):
    """Writes finished spans into a DuckDB store the way ``agentobs collect`` would."""

    def __init__(self, db: str, settings):
        from ..model import connect  # the store with the session model's views
        from ..store.writer import Writer

        self.settings = settings
        self.con = connect(db)
        self.writer = Writer(self.con, flush_s=0.5)
        self.accepted = 0
        self.rejected = 0
        self.errors: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from ..collect import otlp

        try:
            dec = otlp.decode_request(encode_spans(spans), self.settings, source="loadgen")
            if dec.accepted:
                self.writer.write("spans", dec.table())
            self.accepted += dec.accepted
            self.rejected += dec.rejected
            self.errors.extend(dec.errors[:5])
        except Exception as e:  # noqa: BLE001 - an exporter reports failure, never raises into the SDK
            self.errors.append(f"{type(e).__name__}: {e}")
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.writer.close()
        self.con.close()


class Tracing:
    """A TracerProvider with a batch processor and one exporter; ``close()`` flushes and shuts it down."""

    def __init__(self, otlp: str | None = None, store: str | None = None, settings=None,
                 service: str = "agentobs-loadgen", resource: dict | None = None):
        self.provider = TracerProvider(resource=Resource.create({"service.name": service,
                                                                 "service.version": __version__,
                                                                 **(resource or {})}))
        self.exporter: SpanExporter | None = None
        if otlp:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            url = otlp.rstrip("/")
            self.exporter = OTLPSpanExporter(endpoint=url if url.endswith("/v1/traces") else url + "/v1/traces")
        elif store:
            self.exporter = StoreExporter(store, settings)
        if self.exporter is not None:
            self.provider.add_span_processor(BatchSpanProcessor(
                self.exporter, max_queue_size=200_000, schedule_delay_millis=500, max_export_batch_size=2048))
        self.tracer = self.provider.get_tracer("agentobs.loadgen", __version__)
        self.target = otlp or store

    def close(self) -> None:
        self.provider.force_flush()
        self.provider.shutdown()
