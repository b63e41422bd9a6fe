"""OTLP receiver: the real OpenTelemetry SDK exporting over gRPC and HTTP, malformed payloads,
invalid spans counted at load, bearer token, spool backpressure without loss, retries stored once."""

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
from agentobs.collect.loader import Loader
from agentobs.collect.otlp_grpc import OtlpGrpcServer
from agentobs.collect.otlp_http import OtlpHttpServer
from agentobs.collect.receiver import Ingest
from agentobs.collect.spool import Spool
from agentobs.config import load_settings
from agentobs.store.db import connect

SETTINGS = load_settings(env={})


class Pipeline:
    """Spool + loader (decoding in its own thread: processes=0) on one store, as `agentobs collect` runs them."""

    def __init__(self, tmp_path, **spool_kw):
        self.con = connect(tmp_path / "r.duckdb")
        self.health = Health()
        self.spool = Spool(tmp_path / "spool", **spool_kw)
        self.loader = Loader(self.spool, self.con, SETTINGS, self.health, processes=0)

    def start(self):
        self.loader.start()
        return self

    def settle(self):
        assert self.loader.wait_idle(30), "the loader did not store the spool in time"

    def close(self):
        self.spool.close()
        self.loader.stop()
        self.con.close()


@pytest.fixture()
def store(tmp_path):
    p = Pipeline(tmp_path).start()
    yield p.con, p
    p.close()


def _servers(p, token=None, **kw):
    ing = Ingest(p.spool, SETTINGS, p.health, **kw)
    return ing, p.health, OtlpHttpServer(ing, "127.0.0.1", 0, token=token).start(), OtlpGrpcServer(
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
    w.settle()
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
    # acknowledged (spooled) and stored: the two spans are counted once each (SimpleSpanProcessor: 2 exports)
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
    # invalid spans: the request is acknowledged once spooled; the loader rejects the span and counts it
    ("short trace id", _json_with(traceId="abcd"), "application/json", None, 200, "{}", 0),
    ("all-zero span id", _json_with(spanId="0000000000000000"), "application/json", None, 200, "{}", 0),
    ("end before start", _json_with(endTimeUnixNano="1"), "application/json", None, 200, "{}", 0),
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
    w.settle()
    assert code == status
    if ctype == "application/json" and status == 200:
        assert json.loads(data) == {}
    elif status == 200:
        assert ExportTraceServiceResponse.FromString(data) == ExportTraceServiceResponse()
    elif ctype == "application/json":
        assert text in json.loads(data)["message"]
    else:
        assert text in status_pb2.Status.FromString(data).message
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == stored
    invalid = case[0] in ("short trace id", "all-zero span id", "end before start")
    assert health.value("agentobs_otlp_spans_rejected_total", {"reason": "invalid_span"}) == (1 if invalid else 0)
    if case[0] == "huge attribute":
        (n,) = con.execute("SELECT length(attributes->>'$.\"gen_ai.input.messages\"') FROM spans").fetchone()
        assert n == 64 * 1024


def test_gzip_and_an_invalid_span_keeps_the_valid_spans(store):
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
    assert code == 200 and json.loads(data) == {}  # acknowledged when spooled, before decoding
    w.settle()
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


def _payload(n, seed):
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "bench"))
    from _spans import payload

    return payload(n, seed)


def test_backpressure_answers_429_with_retry_after_and_loses_nothing(tmp_path):
    """A spool that admits requests only while it holds under one export's bytes not yet loaded, and a
    loader that starts late: of four concurrent exports of 512 spans the first is spooled, the others get
    429 + Retry-After and retry (as the SDK exporters do) until all 4 x 512 spans are stored exactly once."""
    body_len = len(_payload(512, 0))
    p = Pipeline(tmp_path, max_unloaded_bytes=body_len // 2)
    ing, health, hs, gs = _servers(p, retry_after_s=1.0)
    codes: list[int] = []
    first_429: list[dict] = []
    got_429 = threading.Event()

    def send(seed):
        body = _payload(512, seed)
        while True:
            code, headers, _ = _post(hs.port, body)
            codes.append(code)
            if code == 200:
                return
            if not first_429:
                first_429.append(headers)
            got_429.set()
            threading.Event().wait(float(headers["Retry-After"]) / 4)  # be quicker than told, to keep it short

    try:
        ts = [threading.Thread(target=send, args=(s,)) for s in range(4)]
        for t in ts:
            t.start()
        assert got_429.wait(30)
        p.loader.start()  # now the spool drains, and the retries get in
        for t in ts:
            t.join(60)
        p.settle()
    finally:
        hs.stop()
        gs.stop(0)
    assert codes.count(200) == 4
    assert codes.count(429) >= 1
    assert first_429[0]["Retry-After"] == "1"
    assert p.con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (2048, 2048)
    assert health.value("agentobs_otlp_spans_rejected_total", {"reason": "spool_full"}) == 512 * codes.count(429)
    p.close()


def test_grpc_overload_is_resource_exhausted_with_retry_info(tmp_path):
    from google.rpc.error_details_pb2 import RetryInfo

    p = Pipeline(tmp_path, max_unloaded_bytes=10)
    ing, health, hs, gs = _servers(p)
    first = _proto_of(GOOD_JSON, 5)
    req = _proto_of(GOOD_JSON, 6)  # the same 5 spans and one more
    try:
        ch = grpc.insecure_channel(f"127.0.0.1:{gs.port}")
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        call(first, timeout=10)  # spooled: the spool now holds more than 10 bytes not loaded
        with pytest.raises(grpc.RpcError) as ei:
            call(req, timeout=10)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        md = dict(ei.value.trailing_metadata())
        assert RetryInfo.FromString(md["google.rpc.retryinfo-bin"]).retry_delay.seconds == 1
        assert "not yet loaded" in ei.value.details()
        p.loader.start()
        p.settle()
        call(req, timeout=10)
        p.settle()
        ch.close()
    finally:
        hs.stop()
        gs.stop(0)
    # 6 spans: the five of the first export are not stored a second time (span-level dedupe)
    assert p.con.execute("SELECT count(*) FROM spans").fetchone()[0] == 6
    p.close()


def test_the_same_export_three_times_is_stored_once(store):
    con, p = store
    ing, health, hs, gs = _servers(p)
    body = _payload(50, 7)
    try:
        for _ in range(3):
            assert _post(hs.port, body)[0] == 200
        ch = grpc.insecure_channel(f"127.0.0.1:{gs.port}")
        ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")(body, timeout=10)
        ch.close()
    finally:
        hs.stop()
        gs.stop(0)
    p.settle()
    assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (50, 50)
    # spooled once: the three retries were recognised by the body's hash and written nowhere
    assert health.value("agentobs_otlp_requests_total", {"transport": "http", "outcome": "duplicate"}) == 2
    assert health.value("agentobs_otlp_requests_total", {"transport": "grpc", "outcome": "duplicate"}) == 1
    assert health.value("agentobs_otlp_spans_received_total", {"transport": "http"}) == 50
    assert con.execute("SELECT sum(requests) FROM spool_loaded").fetchone()[0] == 1


def test_a_retry_after_a_client_timeout_is_stored_once(store):
    """The exporter gives up waiting (its timeout) after the request reached the receiver, then sends it
    again: the spool wrote it the first time, the retry is recognised, nothing is stored twice."""
    import socket

    con, p = store
    ing, health, hs, gs = _servers(p)
    body = _payload(20, 11)
    try:
        with socket.create_connection(("127.0.0.1", hs.port), timeout=10) as sk:
            sk.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            # the client times out: it closes without reading the answer
        deadline = __import__("time").monotonic() + 10
        while health.value("agentobs_otlp_spans_received_total", {"transport": "http"}) < 20:
            assert __import__("time").monotonic() < deadline
            threading.Event().wait(0.01)
        assert _post(hs.port, body)[0] == 200  # the retry
    finally:
        hs.stop()
        gs.stop(0)
    p.settle()
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (20, 20)
    assert health.value("agentobs_otlp_requests_total", {"transport": "http", "outcome": "duplicate"}) == 1


def test_the_same_spans_in_another_batch_are_stored_once(store):
    """An exporter that re-batches: the bodies differ (no hash match) but the spans are the same; the loader
    skips the spans already stored."""
    con, p = store
    ing, health, hs, gs = _servers(p)
    try:
        assert _post(hs.port, _proto_of(GOOD_JSON, 3))[0] == 200
        p.settle()
        assert _post(hs.port, _proto_of(GOOD_JSON, 5))[0] == 200  # spans 1-3 again, and 4, 5
    finally:
        hs.stop()
        gs.stop(0)
    p.settle()
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (5, 5)
    assert health.value("agentobs_writer_rows_total") == 5


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
