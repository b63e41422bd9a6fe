"""The acknowledgement path's wire scan (``receiver.scan_protobuf``) against the full parse it replaced
(``otlp.parse_protobuf`` + ``count_spans``): the same verdict (a span count, or InputError → 400) and the
same count on every fixture and real capture, the bench payloads, the edge request, hand-built broken
bodies and seeded mutations of a small request. ``scan_spans`` (OTLP partial success) against the
decoder: the spans it rejects are the ones the decoder rejects for their ids, times, kind or status
code, with the decoder's first message."""

from __future__ import annotations

import random

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_collect_decode_speed import _bench_requests, _edge_request, _fixture_requests, _span

from agentobs.collect import otlp
from agentobs.collect.receiver import count_spans, scan_protobuf, scan_spans
from agentobs.config import load_settings
from agentobs.errors import InputError

SETTINGS = load_settings(env={})
KNOWABLE = ("invalid_id", "invalid_time", "invalid_enum")  # what scan_spans checks without decoding

TID = bytes(range(1, 17))


def full_parse(data: bytes) -> int | str:
    """What the receivers did before: parse every body in full (salvaging what upb refuses)."""
    try:
        req, _ = otlp.parse_protobuf(data, "body")
    except InputError:
        return "400"
    return count_spans(req)


def scan(data: bytes) -> int | str:
    try:
        return scan_protobuf(data, "body")
    except InputError as e:
        assert "not an OTLP ExportTraceServiceRequest protobuf" in str(e)
        return "400"


def _small() -> bytes:
    """2 resources; the first with 2 scopes of 2 + 1 spans, the second with one scope of 1 span: 4 spans."""
    req = ExportTraceServiceRequest()
    for r, scopes in enumerate(([2, 1], [1])):
        rs = req.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = f"svc{r}"
        for s, n in enumerate(scopes):
            ss = rs.scope_spans.add()
            ss.scope.name = f"scope{s}"
            for k in range(n):
                _span(ss.spans.add(), TID, bytes([r + 1, s + 1, k + 1]) + bytes(5), "chat m", {"k": k, "v": "x"})
    return req.SerializeToString()


def test_every_fixture_and_real_capture():
    reqs = _fixture_requests() + _bench_requests() + [("edge", _edge_request().SerializeToString())]
    assert len(reqs) >= 60
    for name, body in reqs:
        want = count_spans(ExportTraceServiceRequest.FromString(body))
        assert scan(body) == full_parse(body) == want, name
    assert scan(_bench_requests()[0][1]) == 512


def _ld(num: int, payload: bytes) -> bytes:
    """One length-delimited field (lengths < 128)."""
    assert len(payload) < 128
    return bytes([num << 3 | 2, len(payload)]) + payload


SPAN = _ld(1, TID) + _ld(2, b"\x01" * 8)  # a span with ids only: fields 1 and 2
GARBAGE_SPAN = b"\xff\xff\xff"  # a truncated varint: not a Span
BAD_UTF8_SPAN = SPAN + _ld(5, b"\xc3\x28")  # name with invalid UTF-8: upb refuses the request, salvage keeps it


@pytest.mark.parametrize("body, want", [
    (b"", 0),  # the empty request
    (_ld(1, _ld(2, _ld(2, SPAN) + _ld(2, SPAN))), 2),
    (_ld(1, _ld(2, _ld(2, SPAN))) + _ld(1, _ld(2, _ld(2, SPAN)) + _ld(2, _ld(2, SPAN))), 3),
    # a span whose content is not a Span: counted (spooled; the loader rejects it as unparseable)
    (_ld(1, _ld(2, _ld(2, GARBAGE_SPAN) + _ld(2, SPAN))), 2),
    (_ld(1, _ld(2, _ld(2, BAD_UTF8_SPAN))), 1),
    # a resource whose own framing is broken: salvage drops it (0 spans), the request is answered 200
    (_ld(1, b"abc"), 0),  # "a" = field 12, wire type 1: 8 bytes needed, 2 left
    (_ld(1, b"abc") + _ld(1, _ld(2, _ld(2, SPAN))), 1),
    (_ld(1, _ld(2, b"\x12\x05ab")), 0),  # a scope whose span claims 5 bytes with 2 left
    # unknown fields at every level are skipped: a top-level field 2, field 1 as a varint, a group
    (_ld(2, b"xyz") + b"\x08\x05" + b"\x1b\x08\x01\x1c" + _ld(1, _ld(2, _ld(2, SPAN))), 1),
    (_ld(1, _ld(1, b"\x0a\x00") + _ld(3, b"https://schema") + _ld(2, _ld(1, b"\x0a\x01s") + _ld(2, SPAN))), 1),
    # the request's own framing broken: 400
    (b"\xff\xff\xff\x0fgarbage", "400"),
    (b"\x0a\x10" + SPAN[:5], "400"),  # field 1 claims 16 bytes, 5 follow
    (b"\x0e", "400"),  # wire type 6 does not exist
    (b"\x00\x01", "400"),  # field number 0
    (b"\x1b\x08\x01\x24", "400"),  # a group ended by another field's end-group
    (b"\x1c", "400"),  # an end-group with no group
    (b"hello world", "400"),
    (b'{"resourceSpans": []}', "400"),  # JSON sent as protobuf
])
def test_hand_built_bodies(body, want):
    assert full_parse(body) == want
    assert scan(body) == want


def test_truncations_of_a_real_body():
    body = _small()
    for cut in range(len(body)):
        assert scan(body[:cut]) == full_parse(body[:cut]), cut


def test_seeded_mutations():
    # flipped, inserted and deleted bytes anywhere in a small request: broken framing at any level, invalid
    # UTF-8, wrong wire types, fields renumbered; the scan agrees with the full parse on every one
    rng = random.Random(21)
    body = _small()
    counts: dict[int | str, int] = {}
    for _ in range(3000):
        b = bytearray(body)
        for _m in range(rng.randint(1, 3)):
            i = rng.randrange(len(b))
            op = rng.random()
            if op < 0.5:
                b[i] = rng.randrange(256)
            elif op < 0.75:
                b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
            else:
                del b[i:i + rng.randint(1, 3)]
        got, want = scan(bytes(b)), full_parse(bytes(b))
        assert got == want, bytes(b).hex()
        counts[got] = counts.get(got, 0) + 1
    # the mutations reach both verdicts and several counts (not all 400s or all intact)
    assert counts.get("400", 0) > 100 and counts.get(4, 0) > 100 and len(counts) >= 4, counts


def decoder_rejections(data: bytes) -> tuple[int, str]:
    """(spans the decoder rejects for a reason scan_spans can know, the first such message)."""
    dec = otlp.decode_protobuf(data, SETTINGS, "otlp-http", "body")
    n = sum(dec.reasons.get(r, 0) for r in KNOWABLE)
    first = next((m for m in dec.errors if any(w in m for w in ("Id ", "Id:", "TimeUnixNano", "kind ", "status.code"))),
                 "")
    return n, first


def test_scan_spans_on_every_fixture_and_the_edge_request():
    reqs = _fixture_requests() + _bench_requests() + [("edge", _edge_request().SerializeToString())]
    for name, body in reqs:
        n, rejected, first = scan_spans(body, "body")
        assert n == scan_protobuf(body), name
        assert (rejected, first) == decoder_rejections(body), name
    # the edge request holds spans with bad ids and times (test_collect_decode_speed): found here too
    assert scan_spans(_edge_request().SerializeToString())[1] >= 2


def _req(*spans: dict) -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for k, f in enumerate(spans):
        sp = _span(ss.spans.add(), TID, (k + 1).to_bytes(8, "big"), "chat m", {"k": 1})
        code = f.pop("status_code", None)
        if code is not None:
            sp.status.code = code
        for key, v in f.items():
            setattr(sp, key, v)
    return req.SerializeToString()


START = 1_791_969_600_000_000_000


@pytest.mark.parametrize("bad, message", [
    ({"trace_id": b"\x01" * 15}, "traceId must be 16 bytes, got 15"),
    ({"trace_id": bytes(16)}, "traceId is all zeros (invalid)"),
    ({"span_id": b""}, "spanId must be 8 bytes, got 0"),
    ({"span_id": bytes(8)}, "spanId is all zeros (invalid)"),
    ({"parent_span_id": b"\x01" * 9}, "parentSpanId must be 8 bytes, got 9"),
    ({"parent_span_id": bytes(8)}, "parentSpanId is all zeros (invalid)"),
    ({"start_time_unix_nano": 0, "end_time_unix_nano": 0}, "startTimeUnixNano missing or zero"),
    ({"end_time_unix_nano": START - 1}, f"endTimeUnixNano {START - 1} is before startTimeUnixNano {START}"),
    ({"start_time_unix_nano": 2**63, "end_time_unix_nano": 0}, "startTimeUnixNano 9223372036854775808 is beyond"),
    ({"end_time_unix_nano": 2**64 - 1}, "endTimeUnixNano 18446744073709551615 is beyond"),
    ({"kind": 200}, "kind 200 is out of range (0-127"),
    ({"kind": -1}, "kind -1 is out of range (0-127"),
    ({"status_code": 128}, "status.code 128 is out of range (0-127"),
])
def test_scan_spans_finds_what_the_decoder_rejects(bad, message):
    # spans 0 and 2 good, span 1 bad, then span 3 bad the same way: 2 of 4 rejected, the first at spans[1]
    body = _req({}, dict(bad), {}, dict(bad))
    n, rejected, first = scan_spans(body, "body")
    assert (n, rejected) == (4, 2)
    assert first.startswith(f"body: resourceSpans[0].scopeSpans[0].spans[1]: {message}"), first
    assert decoder_rejections(body) == (2, first)


def test_scan_spans_leaves_what_needs_a_decode_to_the_loader():
    # a span whose content is not a Span, and one with invalid UTF-8: counted, not known bad here (the loader
    # rejects them as unparseable / invalid_text); a good request: nothing rejected, no message
    body = _ld(1, _ld(2, _ld(2, GARBAGE_SPAN) + _ld(2, BAD_UTF8_SPAN) + _ld(2, SPAN)))
    assert scan_spans(body, "body") == (3, 0, "")
    assert scan_spans(_small(), "body") == (4, 0, "")
    with pytest.raises(InputError):
        scan_spans(b"\xff\xff\xff\x0fgarbage", "body")


def test_ingest_reports_the_known_rejections_also_for_a_retry(tmp_path):
    from agentobs.collect.receiver import Ingest
    from agentobs.collect.spool import Spool

    body = _req({}, {"kind": 200}, {})
    n, rejected, first = scan_spans(body, "body")
    spool = Spool(tmp_path / "spool", fsync=False)
    try:
        ing = Ingest(spool, SETTINGS)
        for dup in (False, True):  # the export, then the exporter's retry of the same body (not spooled again)
            out = ing.export(n, body, "protobuf", "http", rejected, first)
            assert (out.status, out.accepted, out.rejected, out.duplicate) == ("ok", 2, 1, dup)
            assert out.message == ("1 of 3 spans rejected; the first: body: resourceSpans[0].scopeSpans[0].spans[1]: "
                                   "kind 200 is out of range (0-127; OTLP's span kinds are 0-5)")
        assert len(spool.read_from(0, 0, 100, 1 << 30)) == 1  # spooled once, whole: the loader rejects the span
    finally:
        spool.close()
