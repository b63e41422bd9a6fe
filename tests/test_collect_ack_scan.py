"""The acknowledgement path's wire scan (``receiver.scan_protobuf``) against the full parse it replaced
(``otlp.parse_protobuf`` + ``count_spans``): the same verdict (a span count, or InputError → 400) and the
same count on every fixture and real capture, the bench payloads, the edge request, hand-built broken
bodies and seeded mutations of a small request."""

from __future__ import annotations

import random

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_collect_decode_speed import _bench_requests, _edge_request, _fixture_requests, _span

from agentobs.collect import otlp
from agentobs.collect.receiver import count_spans, scan_protobuf
from agentobs.errors import InputError

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
