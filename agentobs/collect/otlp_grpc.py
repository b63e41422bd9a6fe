"""OTLP/gRPC trace receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

vLLM and SGLang export over gRPC by default. The method is registered with a pass-through request
deserializer so that bytes which are not an ExportTraceServiceRequest get INVALID_ARGUMENT with a
message (gRPC's own deserializer would answer INTERNAL). Answers: OK with ``partial_success`` when
some spans were rejected, RESOURCE_EXHAUSTED with a
``google.rpc.RetryInfo`` (the OpenTelemetry exporters retry only then) when the queue is full,
UNAVAILABLE when the store does not commit, UNAUTHENTICATED without the configured bearer token
(scheme case-insensitive).

Bounded: a message over ``max_message`` bytes (decompressed) is refused by gRPC before it is handed
over; at most ``max_concurrent_rpcs`` calls run or wait at once (gRPC answers RESOURCE_EXHAUSTED beyond);
a message must fit the byte budget shared with the HTTP receiver before it is decoded (else
RESOURCE_EXHAUSTED with RetryInfo); connections idle for ``idle_timeout_s`` are closed. gRPC hands a
unary call over only once its message is received, so the bearer token is checked after that (the
message is bounded by ``max_message`` and the call count), before it is parsed.
"""

from __future__ import annotations

from concurrent import futures

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from ..errors import InputError
from .limits import ByteBudget, bearer_ok
from .receiver import Ingest, scan_spans


def _retry_md(seconds: float):
    d = Duration(seconds=int(seconds), nanos=int((seconds - int(seconds)) * 1e9))
    return (("google.rpc.retryinfo-bin", RetryInfo(retry_delay=d).SerializeToString()),)


SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class _Servicer:
    def __init__(self, ingest: Ingest, token: str | None, budget: ByteBudget):
        self.ingest = ingest
        self.token = token
        self.budget = budget

    def Export(self, data: bytes, context):  # noqa: N802
        ing = self.ingest
        if self.token is not None:
            md = dict(context.invocation_metadata())
            if not bearer_ok(md.get("authorization"), self.token):
                ing.refuse("grpc", "unauthorized", 0, "unauthorized")
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        n = len(data)
        if not self.budget.take(n):
            ing.refuse("grpc", "overloaded", 0, "inflight_bytes")
            context.set_trailing_metadata(_retry_md(ing.retry_after_s))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.budget.used} bytes of requests in flight "
                          f"(limit {self.budget.limit}); retry later")
        try:
            return self._export(data, context)
        finally:
            self.budget.give(n)

    def _export(self, data: bytes, context):
        ing = self.ingest
        try:
            n_spans, rejected, first = scan_spans(data, "request")  # salvageable: spooled, the loader rejects bad spans
        except InputError as e:
            ing.refuse("grpc", "bad_request", 0, "malformed")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        out = ing.export(n_spans, data, "protobuf", "grpc", rejected, first)
        if out.status == "overloaded":
            context.set_trailing_metadata(_retry_md(out.retry_after_s))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, out.message)
        if out.status == "unavailable":
            context.set_trailing_metadata(_retry_md(out.retry_after_s))
            context.abort(grpc.StatusCode.UNAVAILABLE, out.message)
        resp = ExportTraceServiceResponse()
        if out.rejected or out.message:
            resp.partial_success.rejected_spans = out.rejected
            resp.partial_success.error_message = out.message
        return resp


class OtlpGrpcServer:
    """``OtlpGrpcServer(ingest, "127.0.0.1", 0).start()``; ``.port`` is the bound port. Limits default to the
    ingest's settings (``receiver_*``); ``budget`` may be shared with the HTTP server."""

    def __init__(self, ingest: Ingest, host: str = "127.0.0.1", port: int = 4317, token: str | None = None,
                 max_message: int | None = None, workers: int = 8, budget: ByteBudget | None = None,
                 max_concurrent_rpcs: int | None = None, idle_timeout_s: float | None = None):
        s = ingest.settings
        max_message = max_message if max_message is not None else s.receiver_max_body_mb * 1024 * 1024
        concurrent = max_concurrent_rpcs or s.receiver_max_concurrent_rpcs
        idle_ms = int((idle_timeout_s or s.receiver_idle_timeout_s) * 1000)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=min(workers, concurrent), thread_name_prefix="otlp-grpc"),
            options=[("grpc.max_receive_message_length", max_message), ("grpc.max_connection_idle_ms", idle_ms)],
            maximum_concurrent_rpcs=concurrent,
        )
        budget = budget or ByteBudget(s.receiver_max_inflight_mb * 1024 * 1024, ingest.health.inflight_bytes)
        servicer = _Servicer(ingest, token or None, budget)
        handler = grpc.unary_unary_rpc_method_handler(
            servicer.Export, request_deserializer=None,
            response_serializer=ExportTraceServiceResponse.SerializeToString)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        self.host = host
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")

    def start(self) -> OtlpGrpcServer:
        self.server.start()
        return self

    def stop(self, grace: float = 5.0) -> None:
        self.server.stop(grace).wait()
