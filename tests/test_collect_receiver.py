"""OTLP receiver: the real OpenTelemetry SDK exporting over gRPC and HTTP, malformed payloads,
partial success, bearer token, backpressure without loss."""

from __future__ import annotations

import gzip
import http.client
import json
import threading

import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from agentobs.collect.health import Health
from agentobs.collect.otlp_grpc import OtlpGrpcServer
from agentobs.collect.otlp_http import OtlpHttpServer
from agentobs.collect.receiver import Ingest
from agentobs.config import load_settings
from agentobs.model import connect
from agentobs.store.writer import Writer

SETTINGS = load_settings(env={})


@pytest.fixture()
def store(tmp_path):
    con = connect(tmp_path / "r.duckdb")
    w = Writer(con, flush_s=0)
    yield con, w
    w.close()
    con.close()


def _servers(w, token=None, **kw):
    health = Health()
    ing = Ingest(w, SETTINGS, health, **kw)
    return ing, health, OtlpHttpServer(ing, "127.0.0.1", 0, token=token).start(), OtlpGrpcServer(
        ing, "127.0.0.1", 0, token=token).start()


def _emit(exporter, session: str) -> None:
    """Two spans like an agent harness sends: invoke_agent root with one chat child."""
    tp = TracerProvider(resource=Resource.create({"service.name": "swe-agent"}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tr = tp.get_tracer("test.harness")
    with tr.start_as_current_span("invoke_agent coder", attributes={"gen_ai.operation.name": "invoke_agent"}):
        with tr.start_as_current_span("chat Qwen/Qwen3-32B", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "Qwen/Qwen3-32B",
            "gen_ai.conversation.id": session, "server.address": "10.0.0.5", "server.port": 8000,
            "gen_ai.usage.input_tokens": 14873, "gen_ai.usage.cache_read.input_tokens": 13392,
            "gen_ai.usage.output_tokens": 187, "gen_ai.response.finish_reasons": ["stop"],
        }):
            pass
    tp.shutdown()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_export_lands_as_exact_rows(store, transport):
    con, w = store
    ing, health, hs, gs = _servers(w)
    try:
        if transport == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exp = OTLPSpanExporter(endpoint=f"127.0.0.1:{gs.port}", insecure=True)
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exp = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{hs.port}/v1/traces")
        _emit(exp, f"sess-{transport}")
    finally:
        hs.stop()
        gs.stop(0)
    rows = con.execute("SELECT name, role, session_id, instance, input_tokens, cached_tokens, output_tokens, "
                   "finish_reason, service_name, ingest_source, parent_span_id IS NULL AS root "
                   "FROM spans ORDER BY name").fetchall()
    src = f"otlp-{transport}"
    assert rows == [
        ("chat Qwen/Qwen3-32B", "gateway", f"sess-{transport}", "10.0.0.5:8000", 14873, 13392, 187, "stop",
         "swe-agent", src, False),
        ("invoke_agent coder", "agent", None, None, None, None, None, None, "swe-agent", src, True),
    ]
    # the chat span is the child of the agent span, in the same trace
    (same,) = con.execute("SELECT count(DISTINCT trace_id) FROM spans").fetchone()
    assert same == 1
    # acknowledged == committed: the two spans are counted once each (SimpleSpanProcessor: 2 exports)
    assert health.value("agentobs_otlp_spans_received_total", {"transport": transport}) == 2


def _post(port, body, ctype="application/x-protobuf", encoding=None, headers=None, path="/v1/traces"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    h = {"Content-Type": ctype, **(headers or {})}
    if encoding:
        h["Content-Encoding"] = encoding
    c.request("POST", path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


GOOD_JSON = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "t"}, "spans": [
    {"traceId": "7f3a9c1e5b2d48f6a0c4e8b1d3f59a27", "spanId": "2d6f0b4c8e3a5f72", "name": "chat m", "kind": 3,
     "startTimeUnixNano": "1791969669318000000", "endTimeUnixNano": "1791969669402000000",
     "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]},
]}]}]}


def _json_with(**span_overrides):
    doc = json.loads(json.dumps(GOOD_JSON))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0].update(span_overrides)
    return json.dumps(doc).encode()


HUGE = "x" * 200_000
MALFORMED = [
    # (id, body, content type, encoding, expected status, text in the answer, rows stored)
    ("protobuf garbage", b"\xff\xff\xff\x0fnot protobuf", "application/x-protobuf", None, 400,
     "not an OTLP ExportTraceServiceRequest protobuf", 0),
    ("bad JSON", b'{"resourceSpans": [', "application/json", None, 400, "invalid JSON at line 1", 0),
    ("JSON not a request", b'[1, 2]', "application/json", None, 400, "'resourceSpans' list", 0),
    ("gzip header, not gzip", b"\x1f\x8bnope", "application/x-protobuf", "gzip", 400, "not valid gzip", 0),
    ("unknown encoding", b"", "application/x-protobuf", "br", 415, "unsupported Content-Encoding 'br'", 0),
    ("text/plain", b"hello", "text/plain", None, 415, "unsupported Content-Type 'text/plain'", 0),
    ("empty protobuf batch", b"", "application/x-protobuf", None, 200, "", 0),
    ("empty JSON object", b"{}", "application/json", None, 200, "{}", 0),
    ("empty resourceSpans", b'{"resourceSpans": []}', "application/json", None, 200, "{}", 0),
    ("short trace id", _json_with(traceId="abcd"), "application/json", None, 200,
     "traceId 'abcd' must be 32 hex characters", 0),
    ("all-zero span id", _json_with(spanId="0000000000000000"), "application/json", None, 200,
     "spanId is all zeros (invalid)", 0),
    ("end before start", _json_with(endTimeUnixNano="1"), "application/json", None, 200,
     "endTimeUnixNano 1 is before startTimeUnixNano", 0),
    # a 200 kB attribute value is stored, truncated to 64 KiB (MAX_ATTR_BYTES)
    ("huge attribute", _json_with(attributes=[{"key": "gen_ai.input.messages", "value": {"stringValue": HUGE}}]),
     "application/json", None, 200, "{}", 1),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_http_payloads(store, case):
    _, body, ctype, enc, status, text, stored = case
    con, w = store
    ing, health, hs, gs = _servers(w)
    try:
        code, headers, data = _post(hs.port, body, ctype, enc)
    finally:
        hs.stop()
        gs.stop(0)
    assert code == status
    if ctype == "application/json" and status == 200:
        answer = json.loads(data)
        if text == "{}":
            assert answer == {}
        else:  # partial success: the one span rejected, named, with the reason
            assert answer["partialSuccess"]["rejectedSpans"] == "1"
            assert text in answer["partialSuccess"]["errorMessage"]
            assert "resourceSpans[0].scopeSpans[0].spans[0]" in answer["partialSuccess"]["errorMessage"]
    elif status == 200:
        assert ExportTraceServiceResponse.FromString(data) == ExportTraceServiceResponse()
    elif ctype == "application/json":
        assert text in json.loads(data)["message"]
    else:
        assert text in status_pb2.Status.FromString(data).message
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == stored
    if case[0] == "huge attribute":
        (n,) = con.execute("SELECT length(attributes->>'$.\"gen_ai.input.messages\"') FROM spans").fetchone()
        assert n == 64 * 1024


def test_gzip_and_partial_success_keeps_the_valid_spans(store):
    con, w = store
    doc = json.loads(json.dumps(GOOD_JSON))
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans.append({**spans[0], "spanId": "1111111111111111"})
    spans.append({**spans[0], "spanId": "zz"})  # rejected
    ing, health, hs, gs = _servers(w)
    try:
        code, _, data = _post(hs.port, gzip.compress(json.dumps(doc).encode()), "application/json", "gzip")
    finally:
        hs.stop()
        gs.stop(0)
    assert code == 200
    ps = json.loads(data)["partialSuccess"]
    assert ps["rejectedSpans"] == "1" and "spans[2]: spanId 'zz'" in ps["errorMessage"]
    assert sorted(r[0] for r in con.execute("SELECT span_id FROM spans").fetchall()) == ["1111111111111111",
                                                                                     "2d6f0b4c8e3a5f72"]
    assert health.value("agentobs_otlp_spans_rejected_total", {"reason": "invalid_span"}) == 1


def test_grpc_garbage_is_invalid_argument(store):
    con, w = store
    ing, health, hs, gs = _servers(w)
    try:
        ch = grpc.insecure_channel(f"127.0.0.1:{gs.port}")
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as ei:
            call(b"\xff\xff\xff\x0fgarbage", timeout=10)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not an OTLP ExportTraceServiceRequest protobuf" in ei.value.details()
        # an empty request is a valid empty batch
        assert ExportTraceServiceResponse.FromString(call(b"", timeout=10)) == ExportTraceServiceResponse()
        ch.close()
    finally:
        hs.stop()
        gs.stop(0)


def test_bearer_token(store):
    con, w = store
    ing, health, hs, gs = _servers(w, token="s3cret")
    body = ExportTraceServiceRequest().SerializeToString()
    try:
        assert _post(hs.port, body)[0] == 401
        assert _post(hs.port, body, headers={"Authorization": "Bearer wrong"})[0] == 401
        assert _post(hs.port, body, headers={"Authorization": "Bearer s3cret"})[0] == 200
        ch = grpc.insecure_channel(f"127.0.0.1:{gs.port}")
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as ei:
            call(body, timeout=10)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        call(body, timeout=10, metadata=(("authorization", "Bearer s3cret"),))
        ch.close()
    finally:
        hs.stop()
        gs.stop(0)
    assert health.value("agentobs_otlp_requests_total", {"transport": "http", "outcome": "unauthorized"}) == 2


def test_backpressure_answers_429_with_retry_after_and_loses_nothing(tmp_path):
    """A queue of 600 spans and a writer that commits at most every 0.5 s: of four concurrent
    exports of 512 spans only one fits at a time, the others get 429 + Retry-After and retry (as the
    SDK exporters do) until all 4 x 512 spans are stored exactly once."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "bench"))
    from _spans import payload

    con = connect(tmp_path / "bp.duckdb")
    w = Writer(con, flush_s=0.5, batch_rows=10**9)
    ing, health, hs, gs = _servers(w, queue_spans=600, retry_after_s=1.0)

    codes: list[int] = []
    first_429: list[dict] = []

    def send(seed):
        body = payload(512, seed)
        while True:
            code, headers, _ = _post(hs.port, body)
            codes.append(code)
            if code == 200:
                return
            if not first_429:
                first_429.append(headers)
            threading.Event().wait(float(headers["Retry-After"]) / 4)  # be quicker than told, to keep it short

    try:
        ts = [threading.Thread(target=send, args=(s,)) for s in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    finally:
        hs.stop()
        gs.stop(0)
        w.close()
    assert codes.count(200) == 4
    assert codes.count(429) >= 1
    assert first_429[0]["Retry-After"] == "1"
    assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (2048, 2048)
    assert health.value("agentobs_otlp_spans_rejected_total", {"reason": "queue_full"}) == 512 * codes.count(429)
    con.close()


def test_grpc_overload_is_resource_exhausted_with_retry_info(tmp_path):
    from google.rpc.error_details_pb2 import RetryInfo

    con = connect(tmp_path / "g.duckdb")
    w = Writer(con, flush_s=0)
    ing, health, hs, gs = _servers(w, queue_spans=10)
    ing._admit(5)  # five spans in flight from another export
    req = ExportTraceServiceRequest.FromString(_proto_of(GOOD_JSON, 6))
    try:
        ch = grpc.insecure_channel(f"127.0.0.1:{gs.port}")
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as ei:
            call(req.SerializeToString(), timeout=10)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        md = dict(ei.value.trailing_metadata())
        assert RetryInfo.FromString(md["google.rpc.retryinfo-bin"]).retry_delay.seconds == 1
        ing._release(5)
        call(req.SerializeToString(), timeout=10)
        ch.close()
    finally:
        hs.stop()
        gs.stop(0)
        w.close()
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 6
    con.close()


def _proto_of(doc: dict, n: int) -> bytes:
    """The JSON request as protobuf with n spans (span ids 1..n)."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    src = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    for i in range(1, n + 1):
        s = ss.spans.add()
        s.trace_id = bytes.fromhex(src["traceId"])
        s.span_id = i.to_bytes(8, "big")
        s.name = src["name"]
        s.kind = Span.SPAN_KIND_CLIENT
        s.start_time_unix_nano = int(src["startTimeUnixNano"])
        s.end_time_unix_nano = int(src["endTimeUnixNano"])
    return req.SerializeToString()
