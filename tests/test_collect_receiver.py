"""OTLP receiver: the real OpenTelemetry SDK exporting over gRPC and HTTP, malformed payloads,
invalid spans counted at load, bearer token, spool backpressure without loss, retries stored once."""

from __future__ import annotations

import gzip
import http.client
import json
import math
import os
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
from stores import new_store

from agentobs.collect.health import Health
from agentobs.collect.loader import Loader
from agentobs.collect.otlp_grpc import OtlpGrpcServer
from agentobs.collect.otlp_http import OtlpHttpServer
from agentobs.collect.receiver import Ingest
from agentobs.collect.spool import Spool
from agentobs.config import load_settings

SETTINGS = load_settings(env={})


class Pipeline:
    """Spool + loader (decoding in its own thread: processes=0) on one store, as `agentobs collect` runs them."""

    def __init__(self, tmp_path, **spool_kw):
        self.con = new_store(tmp_path / "r.duckdb")
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
    # invalid spans: the request is acknowledged once spooled, the answer says which span the loader will reject
    # (OTLP partialSuccess; receiver.scan_json_spans); the loader rejects the span and counts it
    ("short trace id", _json_with(traceId="abcd"), "application/json", None, 200,
     "1 of 1 spans rejected; the first: body: resourceSpans[0].scopeSpans[0].spans[0]: traceId 'abcd' must be 32 hex "
     "characters", 0),
    ("all-zero span id", _json_with(spanId="0000000000000000"), "application/json", None, 200,
     "1 of 1 spans rejected; the first: body: resourceSpans[0].scopeSpans[0].spans[0]: spanId is all zeros (invalid)",
     0),
    ("end before start", _json_with(endTimeUnixNano="1"), "application/json", None, 200,
     "1 of 1 spans rejected; the first: body: resourceSpans[0].scopeSpans[0].spans[0]: endTimeUnixNano 1 is before "
     "startTimeUnixNano 1791969669318000000", 0),
    # the pre-1.0 name of scopeSpans, which the decoder reads: it was counted as 0 spans and acknowledged unstored
    ("instrumentationLibrarySpans", json.dumps({"resourceSpans": [{
        "resource": {"attributes": []},
        "instrumentationLibrarySpans": [{"instrumentationLibrary": {"name": "t"},
                                         "spans": GOOD_JSON["resourceSpans"][0]["scopeSpans"][0]["spans"]}]}]}).encode(),
     "application/json", None, 200, "{}", 1),
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
        if text == "{}":
            assert json.loads(data) == {}
        else:
            assert json.loads(data) == {"partialSuccess": {"rejectedSpans": "1", "errorMessage": text}}
    elif status == 200:
        assert ExportTraceServiceResponse.FromString(data) == ExportTraceServiceResponse()
    elif ctype == "application/json":
        assert text in json.loads(data)["message"]
    else:
        assert text in status_pb2.Status.FromString(data).message
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == stored
    reason = {"short trace id": "invalid_id", "all-zero span id": "invalid_id", "end before start": "invalid_time"}
    for r in ("invalid_id", "invalid_time"):  # the loader counts the rejected span by its reason
        assert health.value("agentobs_otlp_spans_rejected_total", {"reason": r}) == (reason.get(case[0]) == r)
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
    # acknowledged when spooled, before decoding; the answer names the span the loader will reject
    assert code == 200 and json.loads(data) == {"partialSuccess": {
        "rejectedSpans": "1", "errorMessage": "1 of 3 spans rejected; the first: body: "
        "resourceSpans[0].scopeSpans[0].spans[2]: spanId 'zz' must be 16 hex characters"}}
    w.settle()
    assert sorted(r[0] for r in con.execute("SELECT span_id FROM spans").fetchall()) == ["1111111111111111",
                                                                                     "2d6f0b4c8e3a5f72"]
    assert health.value("agentobs_otlp_spans_rejected_total", {"reason": "invalid_id"}) == 1


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
    # the rows counter: spans stored once (table), or spans written to segments (segments: the copies of 1-3 sit
    # in the second segment until compaction drops them; readers never see them)
    assert health.value("agentobs_writer_rows_total") == (5 if SETTINGS.span_store == "table" else 3 + 5)


def test_the_same_spans_sent_three_times_with_compaction_between_are_read_once(tmp_path):
    """span_store = segments with a compaction after every segment: the same spans sent 3x in bodies that differ
    (the spool's hash cannot catch them), each stored as a segment and merged into a Parquet file before the next
    arrives; and a timed-out export retried after its compaction. Readers see every span once, and the merged
    files hold each span once (the copies are dropped in the merge, not only hidden by the view)."""
    settings = load_settings(env={"AGENTOBS_SPAN_STORE": "segments", "AGENTOBS_SEGMENT_COMPACT_AFTER": "1"})
    p = Pipeline(tmp_path)
    p.loader = Loader(p.spool, p.con, settings, p.health, processes=0)
    p.start()
    ing, health, hs, gs = _servers(p)
    try:
        for n in (3, 4, 5):  # spans 1-3, then 1-4, then 1-5: three bodies, each a copy of the one before
            assert _post(hs.port, _proto_of(GOOD_JSON, n))[0] == 200
            p.settle()
        body = _payload(20, 11)
        assert _post(hs.port, body)[0] == 200
        p.settle()  # stored and merged
        assert _post(hs.port, body)[0] == 200  # sent again (an exporter's retry after its timeout): hash caught
        p.settle()
    finally:
        hs.stop()
        gs.stop(0)
    con = p.con
    assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (25, 25)
    assert con.execute("SELECT count(*) FROM spans_part").fetchone()[0] == 0  # nothing in the DuckDB table
    # every segment but (at most) the newest is merged; the merged files and the tail hold each span once
    files = [r[0] for r in con.execute("SELECT file FROM span_merged UNION ALL SELECT file FROM span_segments"
                                       ).fetchall()]
    assert con.execute("SELECT sum(rows) FROM span_merged").fetchone()[0] >= 5
    n, distinct = con.execute(f"SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM read_parquet({files!r})"
                              ).fetchone()
    assert (n, distinct) == (25, 25)
    assert health.value("agentobs_otlp_requests_total", {"transport": "http", "outcome": "duplicate"}) == 1
    p.close()


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


# -- one bad span among good ones: rejected alone, over every transport -------------------------------------
def _field(num: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2)."""
    n, out = len(payload), bytearray()
    key = num << 3 | 2
    for v in (key, n):
        while True:
            b = v & 0x7F
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                break
    return bytes(out) + payload


def _deep_pb(levels: int) -> bytes:
    """An AnyValue nested ``levels`` arrays deep, as wire bytes (upb will not build one past its limit)."""
    v = b"\x18\x01"  # AnyValue{int_value: 1}
    for _ in range(levels):
        v = _field(5, _field(1, v))  # AnyValue{array_value: ArrayValue{values: [v]}}
    return v


def _deep_json(levels: int) -> str:
    return '{"arrayValue": {"values": [' * levels + '{"intValue": "1"}' + "]}}" * levels


TOKENS = {"gen_ai.usage.input_tokens": 1200, "gen_ai.usage.output_tokens": 80}


def _a(key, value):
    """An OTLP/JSON attribute and the protobuf KeyValue of the same value."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    if isinstance(value, float):
        j = {"doubleValue": value if math.isfinite(value) else {math.inf: "Infinity", -math.inf: "-Infinity"}.get(
            value, "NaN")}
        return {"key": key, "value": j}, KeyValue(key=key, value=AnyValue(double_value=value))
    return ({"key": key, "value": {"intValue": str(value)}}, KeyValue(key=key, value=AnyValue(int_value=value)))


def _attrs(**over):
    return [_a(k, v) for k, v in {**TOKENS, **over}.items()]


# (id, span fields for OTLP/JSON (or raw JSON text of the attributes), the same for protobuf (a function of the Span
# message returning its bytes; None: JSON only), text of the rejection, health reason)
BAD_SPANS = [
    # promote's int() ran outside the per-span try on the protobuf path: one NaN dropped the batch
    ("NaN token count", {"attrs": _attrs(**{"gen_ai.usage.input_tokens": math.nan})},
     "attribute gen_ai.usage.input_tokens nan is not a whole number", "invalid_count"),
    ("infinite token count", {"attrs": _attrs(**{"gen_ai.usage.output_tokens": math.inf})},
     "attribute gen_ai.usage.output_tokens inf is not a whole number", "invalid_count"),
    # 1e19 >= 2^63: Arrow's int64 overflow was raised in Decoded.table(), for the whole batch
    ("token count 2^63", {"attrs": _attrs(**{"gen_ai.usage.output_tokens": 1e19})},
     "attribute gen_ai.usage.output_tokens 1e+19 is above 9223372036854775807", "invalid_count"),
    # input -5 with 9,200 read and 103 written: "cached > input" made it -5 + 9200 + 103 = 9,298, stored silently
    ("negative token count", {"attrs": _attrs(**{"gen_ai.usage.input_tokens": -5,
                                                 "gen_ai.usage.cache_read.input_tokens": 9200,
                                                 "gen_ai.usage.cache_creation.input_tokens": 103})},
     "attribute gen_ai.usage.input_tokens -5 is negative", "invalid_count"),
    ("non-integral token count", {"attrs": _attrs(**{"gen_ai.usage.output_tokens": 12.5})},
     "attribute gen_ai.usage.output_tokens 12.5 is not a whole number", "invalid_count"),
    ("kind 200", {"kind": 200}, "kind 200 is out of range (0-127", "invalid_enum"),
    ("status code 200", {"status": 200}, "status.code 200 is out of range (0-127", "invalid_enum"),
    ("attempt 2^31", {"attrs": _attrs(**{"agentobs.attempt": 2**31})},
     "attribute agentobs.attempt 2147483648 is above 2147483647", "invalid_count"),
    ("start time 2^63", {"start": 2**63, "end": 0},
     "startTimeUnixNano 9223372036854775808 is beyond 2^63-1 ns", "invalid_time"),
    # 40 arrays deep: both parsers take it, the attribute is deeper than MAX_ATTR_DEPTH (32)
    ("attribute nested 40 deep", {"deep": 40}, "attribute value nested deeper than 32 levels", "too_deep"),
]
# cases only one encoding can carry: (id, transport kinds, span fields, text, reason)
BAD_JSON_ONLY = [
    ("lone surrogate in the name", {"name": "chat \ud800"}, "name 'chat \\ud800' is not valid Unicode", "invalid_text"),
    # 5,000 arrays deep (10,000 JSON levels): past both parsers' recursion limits
    ("JSON nested 5,000 deep", {"deep": 5000}, "JSON nested deeper than 128 levels", "too_deep"),
    ("intValue beyond int64", {"raw_attr": '{"key": "n", "value": {"intValue": "9223372036854775808"}}'},
     "intValue '9223372036854775808' is out of the int64 range", "invalid_value"),
]
BAD_PB_ONLY = [
    # invalid UTF-8 in a string field: upb refuses the whole request; the request is taken apart span by span
    ("invalid UTF-8 in the name", {"name": "BADNAME!"}, "not a valid Span (String field had bad UTF-8)",
     "invalid_text"),
    ("protobuf nested 5,000 deep", {"deep": 5000}, "not a valid Span (", "too_deep"),
]
START = 1_791_969_669_318_000_000
TRACE = "7f3a9c1e5b2d48f6a0c4e8b1d3f59a27"


def _json_span(i: int, f: dict | None) -> str:
    f = f or {}
    span = {"traceId": TRACE, "spanId": f"{i:016x}", "name": f.get("name", "chat m"), "kind": f.get("kind", 3),
            "startTimeUnixNano": str(f.get("start", START)), "endTimeUnixNano": str(f.get("end", START + 10**9)),
            "status": {"code": f.get("status", 0)}, "attributes": [a for a, _ in f.get("attrs", _attrs())]}
    text = json.dumps(span)
    extra = []
    if "deep" in f:
        extra.append('{"key": "deep", "value": ' + _deep_json(f["deep"]) + "}")
    if "raw_attr" in f:
        extra.append(f["raw_attr"])
    if extra:
        head, _, tail = text.rpartition("]")  # "attributes" is the last key
        text = head + ", " + ", ".join(extra) + "]" + tail
    return text


def _pb_span(i: int, f: dict | None) -> bytes:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    f = f or {}
    s = Span(trace_id=bytes.fromhex(TRACE), span_id=i.to_bytes(8, "big"), name=f.get("name", "chat m"),
             kind=f.get("kind", 3), start_time_unix_nano=f.get("start", START), end_time_unix_nano=f.get("end", START + 10**9))
    s.status.code = f.get("status", 0)
    s.attributes.extend(kv for _, kv in f.get("attrs", _attrs()))
    raw = s.SerializeToString()
    if f.get("name") == "BADNAME!":
        raw = raw.replace(b"BADNAME!", b"\xff\xfeBADNA")  # same length: the field lengths stay right
    if "deep" in f:
        raw += _field(9, _field(1, b"deep") + _field(2, _deep_pb(f["deep"])))  # one more attribute (field 9)
    return raw


def _three(bad: dict, encoding: str) -> bytes:
    """spans[0] and spans[2] good, spans[1] the bad one: the request body in ``encoding``."""
    if encoding == "json":
        spans = ", ".join(_json_span(i, bad if i == 2 else None) for i in (1, 2, 3))
        return ('{"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": '
                '"agent"}}]}, "scopeSpans": [{"scope": {"name": "t"}, "spans": [' + spans + "]}]}]}").encode()
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    res = Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value="agent"))])
    ss = _field(1, _field(1, b"t")) + b"".join(_field(2, _pb_span(i, bad if i == 2 else None)) for i in (1, 2, 3))
    return _field(1, _field(1, res.SerializeToString()) + _field(2, ss))


_CASES = [(c[0], t, c[1], c[2], c[3]) for c in BAD_SPANS for t in ("json", "protobuf", "grpc")] \
    + [(c[0], "json", *c[1:]) for c in BAD_JSON_ONLY] \
    + [(c[0], t, *c[1:]) for c in BAD_PB_ONLY for t in ("protobuf", "grpc")]


@pytest.mark.parametrize("name,transport,bad,text,reason", _CASES, ids=[f"{c[0]}-{c[1]}" for c in _CASES])
def test_one_bad_span_is_rejected_alone(store, caplog, name, transport, bad, text, reason):
    """Acknowledged when spooled (200 / OK: the answer comes before decoding); the loader then stores the two good
    neighbours, rejects the bad span with its reason (logged, with its position) and counts it by reason. A bad
    span the protobuf receivers' scan can tell without decoding (its time, kind or status code here) is also
    reported in the answer: OTLP partial_success, 1 span rejected, with the decoder's message."""
    import logging

    caplog.set_level(logging.INFO, logger="agentobs.collect.loader")
    con, w = store
    ing, health, hs, gs = _servers(w)
    body = _three(bad, "json" if transport == "json" else "protobuf")
    want = ExportTraceServiceResponse()
    # what the acknowledgement's check can tell without decoding attributes: ids, times, kind, status code; in
    # OTLP/JSON also the name's text and a span the parser cut out for nesting (receiver.scan_json_spans)
    if reason in ("invalid_id", "invalid_time", "invalid_enum") or name in ("lone surrogate in the name",
                                                                            "JSON nested 5,000 deep"):
        want.partial_success.rejected_spans = 1
        want.partial_success.error_message = f"1 of 3 spans rejected; the first: {'request' if transport == 'grpc' else 'body'}" \
            f": resourceSpans[0].scopeSpans[0].spans[1]: {text}"
    try:
        if transport == "grpc":
            ch = grpc.insecure_channel(f"127.0.0.1:{gs.port}")
            call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            got = ExportTraceServiceResponse.FromString(call(body, timeout=30))
            ch.close()
        else:
            code, _, data = _post(hs.port, body, "application/json" if transport == "json" else "application/x-protobuf")
            assert code == 200
            if transport == "protobuf":
                got = ExportTraceServiceResponse.FromString(data)
            else:  # OTLP/JSON's answer: partialSuccess when a span is rejected, int64 as a string (proto3 JSON)
                doc = json.loads(data)
                ps = doc.get("partialSuccess", {})
                assert set(doc) <= {"partialSuccess"}, doc
                got = ExportTraceServiceResponse()
                got.partial_success.rejected_spans = int(ps.get("rejectedSpans", 0))
                got.partial_success.error_message = ps.get("errorMessage", "")
        # the message holds the decoder's text, which ``text`` begins
        assert got.partial_success.rejected_spans == want.partial_success.rejected_spans
        assert got.partial_success.error_message.startswith(want.partial_success.error_message), got
    finally:
        hs.stop()
        gs.stop(0)
    w.settle()
    # the good neighbours are stored, exactly as sent
    assert con.execute("SELECT span_id, input_tokens, output_tokens, service_name FROM spans ORDER BY span_id"
                       ).fetchall() == [("0000000000000001", 1200, 80, "agent"), ("0000000000000003", 1200, 80, "agent")]
    assert health.value("agentobs_otlp_spans_rejected_total", {"reason": reason}) == 1
    assert con.execute("SELECT sum(spans), sum(rejected) FROM spool_loaded").fetchone() == (2, 1)
    assert any(f": resourceSpans[0].scopeSpans[0].spans[1]: {text}" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


# -- bounds: what is checked before the body is read, budgets, connections, deadlines --------------------------
def _bounded(p, **values):
    from agentobs.config import Settings

    ing = Ingest(p.spool, Settings(values=values), p.health)
    return ing, p.health, OtlpHttpServer(ing, "127.0.0.1", 0, token=values.get("receiver_token")).start()


def _head_only(port, length, headers=None, sent=b""):
    """A POST that announces ``length`` bytes and sends only ``sent``: the answer the server gives without the body."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.putrequest("POST", "/v1/traces")
    for k, v in {"Content-Type": "application/x-protobuf", "Content-Length": str(length), **(headers or {})}.items():
        c.putheader(k, v)
    c.endheaders()
    if sent:
        c.send(sent)
    r = c.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
    c.close()
    return out


def test_bearer_is_checked_before_the_body_and_the_scheme_is_case_insensitive(store):
    con, w = store
    ing, health, hs = _bounded(w, receiver_token="s3cret")
    body = _three({}, "protobuf")
    try:
        # 60 MiB announced, 1 KiB sent: 401 at once, the connection closed, the body never read
        code, headers, _ = _head_only(hs.port, 60 * 1024 * 1024, sent=b"\0" * 1024)
        assert (code, headers["Connection"]) == (401, "close")
        # RFC 9110: the scheme is case-insensitive
        for scheme in ("bearer", "BEARER", "Bearer"):
            assert _post(hs.port, body, headers={"Authorization": f"{scheme} s3cret"})[0] == 200
        assert _post(hs.port, body, headers={"Authorization": "Basic s3cret"})[0] == 401
    finally:
        hs.stop()
    w.settle()
    assert health.value("agentobs_otlp_requests_total", {"transport": "http", "outcome": "unauthorized"}) == 2
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 3  # 3 exports of the same body: stored once


def test_grpc_bearer_scheme_is_case_insensitive(store):
    con, w = store
    ing, health, hs, gs = _servers(w, token="s3cret")
    try:
        ch = grpc.insecure_channel(f"127.0.0.1:{gs.port}")
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        call(b"", timeout=10, metadata=(("authorization", "bearer s3cret"),))
        with pytest.raises(grpc.RpcError) as ei:
            call(b"", timeout=10, metadata=(("authorization", "bearer wrong"),))
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ch.close()
    finally:
        hs.stop()
        gs.stop(0)


def test_body_and_inflated_size_are_bounded(store):
    con, w = store
    ing, health, hs = _bounded(w, receiver_max_body_mb=1)
    try:
        code, headers, data = _head_only(hs.port, 1024 * 1024 + 1)  # announced over 1 MiB: 413 before reading
        assert (code, headers["Connection"]) == (413, "close")
        assert "exceeds the limit of 1048576" in status_pb2.Status.FromString(data).message
        # 2 MiB of zeros gzip to ~2 kB: refused while inflating, at the limit
        code, _, data = _post(hs.port, gzip.compress(b"\0" * (2 * 1024 * 1024)), encoding="gzip")
        assert code == 413 and "decompressed body exceeds 1048576 bytes" in status_pb2.Status.FromString(data).message
    finally:
        hs.stop()
    assert health.value("agentobs_otlp_requests_total", {"transport": "http", "outcome": "too_large"}) == 2


def test_bytes_in_flight_are_bounded_on_both_transports(store):
    """A budget of 1 MiB with 1 MiB already held by another request: the next one gets 429 / RESOURCE_EXHAUSTED
    with a retry delay, and is served once the budget is free."""
    from google.rpc.error_details_pb2 import RetryInfo

    from agentobs.collect.limits import ByteBudget

    con, w = store
    ing, health, _, _ = _servers(w)
    budget = ByteBudget(1024 * 1024, health.inflight_bytes)
    hs = OtlpHttpServer(ing, "127.0.0.1", 0, budget=budget).start()
    gs = OtlpGrpcServer(ing, "127.0.0.1", 0, budget=budget).start()
    body = _three({}, "protobuf")
    try:
        assert budget.take(1024 * 1024)
        code, headers, _ = _post(hs.port, body)
        assert (code, headers["Retry-After"]) == (429, "1")
        ch = grpc.insecure_channel(f"127.0.0.1:{gs.port}")
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as ei:
            call(body, timeout=10)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        md = dict(ei.value.trailing_metadata())
        assert RetryInfo.FromString(md["google.rpc.retryinfo-bin"]).retry_delay.seconds == 1
        budget.give(1024 * 1024)
        assert _post(hs.port, body)[0] == 200
        call(body, timeout=10)
        ch.close()
    finally:
        hs.stop()
        gs.stop(0)
    assert budget.used == 0 and health.value("agentobs_otlp_inflight_bytes") == 0
    assert health.value("agentobs_otlp_requests_total", {"transport": "http", "outcome": "overloaded"}) == 1
    assert health.value("agentobs_otlp_requests_total", {"transport": "grpc", "outcome": "overloaded"}) == 1


def _closed_by_server(sock, within: float = 10.0) -> bool:
    """True when the server closes the socket (recv returns EOF or a reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_and_stalled_connections_are_closed(store):
    import socket

    con, w = store
    ing, health, hs = _bounded(w, receiver_idle_timeout_s=0.3, receiver_read_timeout_s=0.6)
    try:
        idle = socket.create_connection(("127.0.0.1", hs.port))  # connects, never sends
        stalled = socket.create_connection(("127.0.0.1", hs.port))  # sends half a request, then nothing
        stalled.sendall(b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100\r\n"
                        b"\r\n" + b"\0" * 10)
        assert _closed_by_server(idle) and _closed_by_server(stalled)
        idle.close()
        stalled.close()
        # the server still serves
        assert _post(hs.port, _three({}, "protobuf"))[0] == 200
    finally:
        hs.stop()
    assert health.value("agentobs_otlp_http_connections_closed_total", {"reason": "idle_timeout"}) >= 1
    assert health.value("agentobs_otlp_http_connections_closed_total", {"reason": "read_timeout"}) == 1


def test_connection_cap_closes_an_idle_connection_for_a_new_one(store):
    """Two connections allowed, both held open idle by clients: a third client is served (the longest-idle one is
    closed for it), and no more than two handler threads ever run."""
    import socket

    con, w = store
    ing, health, hs = _bounded(w, receiver_max_connections=2, receiver_idle_timeout_s=60.0)
    try:
        a = socket.create_connection(("127.0.0.1", hs.port))
        b = socket.create_connection(("127.0.0.1", hs.port))
        deadline = __import__("time").monotonic() + 10
        while health.value("agentobs_otlp_http_connections") < 2 and __import__("time").monotonic() < deadline:
            threading.Event().wait(0.02)
        assert health.value("agentobs_otlp_http_connections") == 2
        assert _post(hs.port, _three({}, "protobuf"))[0] == 200
        assert _closed_by_server(a)  # the first, longest idle, made room
        b.close()
        a.close()
    finally:
        hs.stop()
    assert health.value("agentobs_otlp_http_connections_closed_total", {"reason": "evicted"}) == 1
    assert hs.httpd.request_queue_size == SETTINGS.receiver_backlog == 1024


def test_attributes_per_span_are_capped(store):
    from agentobs.collect import otlp
    from agentobs.config import Settings

    doc = json.loads(json.dumps(GOOD_JSON))
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["attributes"] = [{"key": f"k{i}", "value": {"intValue": str(i)}} for i in range(5)]
    dec = otlp.decode_json_obj(doc, Settings(values={"max_span_attributes": 3}))
    assert (dec.accepted, dec.rejected) == (1, 0)
    assert json.loads(dec.table().column("attributes")[0].as_py()) == {"k0": 0, "k1": 1, "k2": 2}
    assert dec.warnings == ["payload: resourceSpans[0].scopeSpans[0].spans[0] (span 2d6f0b4c8e3a5f72): 2 of its 5 "
                            "attributes dropped (max_span_attributes = 3)"]
    pb = otlp.decode_protobuf(_proto_of(GOOD_JSON, 1), Settings(values={"max_span_attributes": 0}))
    assert pb.accepted == 1 and pb.warnings == []  # _proto_of spans have no attributes: nothing dropped


def test_table_drops_a_row_arrow_cannot_store():
    """The safety net behind the decoders' checks: a row with a value no column takes is rejected, not the batch."""
    from agentobs.collect import otlp

    dec = otlp.decode_json_obj(json.loads(_three({}, "json")), SETTINGS)
    assert dec.accepted == 3
    row = list(dec._rows[1])
    row[otlp.SPAN_SCHEMA.get_field_index("kind")] = 300  # past the int8 column, as no decoder lets through
    dec._rows[1] = tuple(row)
    t = dec.table()
    assert t.column("span_id").to_pylist() == ["0000000000000001", "0000000000000003"]
    assert (dec.accepted, dec.rejected, dec.reasons) == (2, 1, {"unstorable": 1})
    assert dec.errors == ["span 0000000000000002: kind 300 cannot be stored as int8 (ArrowInvalid)"]


@pytest.mark.parametrize("layout", ["segments", "table"])
def test_batches_decoded_while_one_is_stored_share_its_commit(tmp_path, layout):
    """A backlog in the spool: the batches already decoded when the loader stores one go into the same
    transaction (one catalog commit, one ``spans`` view for all), each still its own segment with its own spool
    position; the rows are those of one commit per batch, and a restart loads nothing again."""
    settings = load_settings(env={"AGENTOBS_SPAN_STORE": layout, "AGENTOBS_SEGMENT_COMPACT_AFTER": "100"})
    p = Pipeline(tmp_path)
    for seed in range(6):
        assert p.spool.append(_payload(20, seed), "protobuf", "http")
    # the 7th repeats request 0's spans in another body (the spool's hash cannot catch it): read once
    assert p.spool.append(_payload(20, 0), "protobuf", "http") is False  # the same body again: a retry, not spooled
    assert p.spool.append(_proto_of(GOOD_JSON, 3), "protobuf", "http")
    assert p.spool.append(_proto_of(GOOD_JSON, 4), "protobuf", "http")  # spans 1-3 again, and 4
    # one request a batch (batch_bytes=1); processes=0 decodes at submission, so with two batches in flight the
    # second is decoded when the first is stored: 8 batches, 4 commits of 2
    p.loader = Loader(p.spool, p.con, settings, p.health, processes=0, batch_bytes=1)
    p.start()
    p.settle()
    con = p.con
    assert (p.loader.stored_batches, p.loader.commits) == (8, 4)
    assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (124, 124)
    assert con.execute("SELECT count(*), sum(requests), sum(spans) FROM spool_loaded").fetchone() == (4, 8, 127)
    if layout == "segments":
        cat = con.execute("SELECT seq, rows, spool_segment, spool_end FROM span_segments ORDER BY seq").fetchall()
        assert [r[0] for r in cat] == list(range(1, 9)) and [r[1] for r in cat] == [20] * 6 + [3, 4]
        assert len({(r[2], r[3]) for r in cat}) == 8  # each segment with its own spool position
    p.loader.stop()
    p.loader = Loader(p.spool, p.con, settings, p.health, processes=0).start()  # a restart: nothing again
    p.settle()
    assert p.loader.stored_batches == 0
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 124
    p.close()


def test_the_loader_stores_batches_while_a_merge_is_written(tmp_path, monkeypatch):
    """span_store = segments: the merged file is written by a thread of its own; the loader goes on storing batches
    (readable at once) and commits the merge once its file is written. Each span is read once before, during and
    after."""
    import time

    from agentobs.store import segments

    settings = load_settings(env={"AGENTOBS_SPAN_STORE": "segments", "AGENTOBS_SEGMENT_COMPACT_AFTER": "2"})
    started, gate = threading.Event(), threading.Event()
    real = segments.write_merge

    def held(plan):
        started.set()
        assert gate.wait(30)
        return real(plan)

    monkeypatch.setattr(segments, "write_merge", held)
    p = Pipeline(tmp_path)
    p.loader = Loader(p.spool, p.con, settings, p.health, processes=0, batch_bytes=1)
    p.start()
    try:
        for seed in (0, 1):  # two segments: the merge of the older one (down to 2 // 2 = 1) starts
            assert p.spool.append(_payload(20, seed), "protobuf", "http")
        assert started.wait(30)
        for seed in (2, 3, 4):
            assert p.spool.append(_payload(20, seed), "protobuf", "http")
        deadline = time.monotonic() + 30
        while p.loader.position < p.spool.durable_end() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p.loader.position == p.spool.durable_end()  # stored while the merged file is not written yet
        con = p.con
        assert con.execute("SELECT count(*) FROM span_merged").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM span_segments").fetchone()[0] == 5
        assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (100, 100)
        gate.set()
        p.settle()  # the merge committed, and the ones due after it
        assert p.loader.compacted_segments >= 1 and p.loader.tail < 2
        assert con.execute("SELECT min(min_seq), max(max_seq), sum(rows) FROM span_merged").fetchone() == (
            1, 5 - p.loader.tail, 20 * (5 - p.loader.tail))
        assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (100, 100)
    finally:
        gate.set()
        p.close()


def test_the_loader_lists_large_segments_as_merged_files_without_rewriting_them(tmp_path, monkeypatch):
    """span_store = segments: each segment the loader publishes says its seq in column _seg, so a large one with no
    copy (PROMOTE_MIN_ROWS: 20 here, one 20-span request a batch) is listed as a merged file as it is when the tail
    is merged: no merged file is written and no segment retired. A request repeating stored spans makes its
    segment one to rewrite (its copies dropped)."""
    from agentobs.store import segments

    monkeypatch.setattr(segments, "PROMOTE_MIN_ROWS", 20)
    written = []
    real = segments.write_merge

    def counted(plan):
        written.append([r[3] for r in plan.rows])
        return real(plan)

    monkeypatch.setattr(segments, "write_merge", counted)
    settings = load_settings(env={"AGENTOBS_SPAN_STORE": "segments", "AGENTOBS_SEGMENT_COMPACT_AFTER": "2"})
    p = Pipeline(tmp_path)
    p.loader = Loader(p.spool, p.con, settings, p.health, processes=0, batch_bytes=1)
    for seed in range(5):
        assert p.spool.append(_payload(20, seed), "protobuf", "http")
    assert p.spool.append(_payload(21, 0), "protobuf", "http")  # request 0's 20 spans again, and one more
    assert p.spool.append(_payload(20, 9), "protobuf", "http")
    p.start()
    p.settle()
    con = p.con
    try:
        cat = con.execute("SELECT file, min_seq, max_seq FROM span_merged ORDER BY min_seq").fetchall()
        cat += con.execute("SELECT file, seq, seq FROM span_segments ORDER BY seq").fetchall()
        for file, lo, hi in cat:  # every file's rows say the segment(s) they came from
            got = con.execute(f"SELECT min(_seg), max(_seg) FROM read_parquet('{file}')").fetchone()
            assert got == (lo, hi), file
        # segments 1-5 promoted under their own names; 6 (20 copies + 1) rewritten; the tail keeps 2 // 2 = 1
        assert [(lo, hi) for _f, lo, hi in cat] == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (7, 7)]
        assert [os.path.basename(f) for f, _lo, _hi in cat[:5]] == [segments.seg_name(k) for k in range(1, 6)]
        assert written == [[6]] and p.loader.promoted_segments == 5
        assert con.execute("SELECT rows FROM span_merged WHERE min_seq = 6").fetchone() == (1,)
        assert p.health.value("agentobs_span_merges_total", {"kind": "promoted"}) >= 1
        assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (121, 121)
    finally:
        p.close()


def test_an_idle_loader_merges_its_small_merged_files_again(tmp_path, monkeypatch):
    """A quiet collector: one 3-span request per batch and a merge every 2 segments leave merged files of a few
    spans each. Once the loader is idle (no batch read for REMERGE_IDLE_S: 0.2 s here) it merges them again
    (adjacent files of one size class, 8 at a time: segments.plan_remerge) until no run is left; every span is
    still read once, and the loader's count of merged files is the catalog's."""
    import time

    from agentobs.collect import loader as loader_mod
    from agentobs.store import segments

    monkeypatch.setattr(loader_mod, "REMERGE_IDLE_S", 0.2)

    settings = load_settings(env={"AGENTOBS_SPAN_STORE": "segments", "AGENTOBS_SEGMENT_COMPACT_AFTER": "2"})
    p = Pipeline(tmp_path)
    p.loader = Loader(p.spool, p.con, settings, p.health, processes=0, batch_bytes=1)
    p.start()
    con = p.con
    try:
        for seed in range(40):
            assert p.spool.append(_payload(3, seed), "protobuf", "http")
        p.settle()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (p.loader.merging() or segments.plan_remerge(con.cursor()) is not None):
            time.sleep(0.05)
        assert segments.plan_remerge(con.cursor()) is None and not p.loader.merging()
        n_merged = con.execute("SELECT count(*) FROM span_merged").fetchone()[0]
        assert p.loader.remerged_files >= 8 and p.loader.merged_files == n_merged
        # the health endpoint's gauges and counters say the same
        assert p.health.value("agentobs_span_files", {"kind": "merged"}) == n_merged
        assert p.health.value("agentobs_span_files", {"kind": "segment"}) == p.loader.tail
        assert p.health.value("agentobs_span_merges_total", {"kind": "again"}) >= 1
        assert p.health.value("agentobs_span_merges_total", {"kind": "segments"}) >= 1
        # 40 requests, 38+ of them merged (the tail keeps at most 1): without merging again, one file per merge
        assert n_merged < p.loader.compacted_segments // 2
        assert con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone() == (120, 120)
        assert con.execute(f"SELECT count(*) FROM ({segments.since_sql(con.cursor(), 'span_id', 0)})").fetchone() == (
            120,)
    finally:
        p.close()
