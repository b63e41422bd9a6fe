"""OTLP/gRPC trace receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

vLLM and SGLang export over gRPC by default. The method is registered with a pass-through request
deserializer so that bytes which are not an ExportTraceServiceRequest get INVALID_ARGUMENT with a
message (gRPC's own deserializer would answer INTERNAL). Answers: OK once the request is durable in
the spool (receiver.py), RESOURCE_EXHAUSTED with a ``google.rpc.RetryInfo`` (the OpenTelemetry
exporters retry only then) when the spool is full, UNAVAILABLE when the spool cannot write,
UNAUTHENTICATED without the configured bearer token.
"""

from __future__ import annotations

import hmac
from concurrent import futures

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .receiver import Ingest, count_spans


def _retry_md(seconds: float):
    d = Duration(seconds=int(seconds), nanos=int((seconds - int(seconds)) * 1e9))
    return (("google.rpc.retryinfo-bin", RetryInfo(retry_delay=d).SerializeToString()),)


SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class _Servicer:
    def __init__(self, ingest: Ingest, token: str | None):
        self.ingest = ingest
        self.token = token

    def Export(self, data: bytes, context):  # noqa: N802
        ing = self.ingest
        if self.token is not None:
            md = dict(context.invocation_metadata())
            auth = md.get("authorization", "")
            if not hmac.compare_digest(auth.encode(), f"Bearer {self.token}".encode()):
                ing.refuse("grpc", "unauthorized", 0, "unauthorized")
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            request = ExportTraceServiceRequest.FromString(data)
        except DecodeError as e:
            ing.refuse("grpc", "bad_request", 0, "malformed")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"request: not an OTLP ExportTraceServiceRequest protobuf ({e})")
        out = ing.export(count_spans(request), data, "protobuf", "grpc")
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
    """``OtlpGrpcServer(ingest, "127.0.0.1", 0).start()``; ``.port`` is the bound port."""

    def __init__(self, ingest: Ingest, host: str = "127.0.0.1", port: int = 4317, token: str | None = None,
                 max_message: int = 64 * 1024 * 1024, workers: int = 8):
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
            options=[("grpc.max_receive_message_length", max_message)],
        )
        servicer = _Servicer(ingest, token or None)
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
