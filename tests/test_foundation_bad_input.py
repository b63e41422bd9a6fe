"""Malformed inputs: each gets the exact error, naming the file and position; the valid rest is kept."""

from __future__ import annotations

import gzip
import json

import pytest

from agentobs.collect import files
from agentobs.collect.prom import parse_text
from agentobs.errors import InputError

GOOD_SPAN = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "chat m", "kind": 3,
             "startTimeUnixNano": "1000000000", "endTimeUnixNano": "2000000000",
             "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]}


def doc(*spans):
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "s"}, "spans": list(spans)}]}]}


def span(**kw):
    s = dict(GOOD_SPAN)
    s.update(kw)
    return s


# (file content, expected file-level error (None = file readable), expected per-span errors)
WHERE = "resourceSpans[0].scopeSpans[0].spans[1]"
CASES = [
    ("truncated JSON", b'{"resourceSpans": [', "invalid JSON at line 1 column 20: Expecting value", []),
    ("not OTLP", b'{"foo": 1}', "not an OTLP trace export: no 'resourceSpans' key (found: foo)", []),
    ("JSON scalar list", b"[1, 2]", "[0]: expected a JSON object with resourceSpans, got int", []),
    ("binary garbage", b"\x00\x01\x02\xffgarbage", "neither OTLP/JSON nor OTLP protobuf (ExportTraceServiceRequest, single or length-prefixed)", []),
    ("empty file", b"  \n", "empty file", []),
    ("short trace id", json.dumps(doc(GOOD_SPAN, span(traceId="abc"))).encode(), None,
     [f"{WHERE}: traceId 'abc' must be 32 hex characters"]),
    ("zero span id", json.dumps(doc(GOOD_SPAN, span(spanId="0" * 16))).encode(), None,
     [f"{WHERE}: spanId is all zeros (invalid)"]),
    ("non-hex id", json.dumps(doc(GOOD_SPAN, span(spanId="zz" * 8))).encode(), None,
     [f"{WHERE}: spanId 'zzzzzzzzzzzzzzzz' is not hex"]),
    ("bad intValue", json.dumps(doc(GOOD_SPAN, span(attributes=[{"key": "gen_ai.usage.input_tokens", "value": {"intValue": "lots"}}]))).encode(),
     None, [f"{WHERE}: intValue 'lots' is not an integer"]),
    ("end before start", json.dumps(doc(GOOD_SPAN, span(endTimeUnixNano="500"))).encode(), None,
     [f"{WHERE}: endTimeUnixNano 500 is before startTimeUnixNano 1000000000"]),
    ("no start time", json.dumps(doc(GOOD_SPAN, {k: v for k, v in GOOD_SPAN.items() if k != "startTimeUnixNano"} | {"spanId": "ef" * 8})).encode(),
     None, [f"{WHERE}: startTimeUnixNano missing"]),
    ("attributes not a list", json.dumps(doc(GOOD_SPAN, span(spanId="ef" * 8, attributes={"a": 1}))).encode(), None,
     [f"{WHERE}: span.attributes must be a list"]),
    ("span not an object", json.dumps(doc(GOOD_SPAN, "oops")).encode(), None, [f"{WHERE}: span must be an object"]),
    # values no column can hold, each rejecting its span only (tests/test_collect_receiver.py: the same over the wire)
    ("NaN token count", json.dumps(doc(GOOD_SPAN, span(spanId="ef" * 8, attributes=[
        {"key": "gen_ai.usage.input_tokens", "value": {"doubleValue": "NaN"}}]))).encode(), None,
     [f"{WHERE}: attribute gen_ai.usage.input_tokens nan is not a whole number"]),
    # -5 + 9,200 read + 103 written was stored as 9,298 input tokens through the "cached > input" rule
    ("negative token count", json.dumps(doc(GOOD_SPAN, span(spanId="ef" * 8, attributes=[
        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "-5"}},
        {"key": "gen_ai.usage.cache_read.input_tokens", "value": {"intValue": "9200"}},
        {"key": "gen_ai.usage.cache_creation.input_tokens", "value": {"intValue": "103"}}]))).encode(), None,
     [f"{WHERE}: attribute gen_ai.usage.input_tokens -5 is negative"]),
    ("kind 200", json.dumps(doc(GOOD_SPAN, span(spanId="ef" * 8, kind=200))).encode(), None,
     [f"{WHERE}: kind 200 is out of range (0-127; OTLP's span kinds are 0-5)"]),
    ("start time 2^63", json.dumps(doc(GOOD_SPAN, span(spanId="ef" * 8, startTimeUnixNano=str(2**63),
                                                       endTimeUnixNano="0"))).encode(), None,
     [f"{WHERE}: startTimeUnixNano 9223372036854775808 is beyond 2^63-1 ns (the int64 column)"]),
    ("lone surrogate", json.dumps(doc(GOOD_SPAN, span(spanId="ef" * 8, name="x\ud800"))).encode(), None,
     [f"{WHERE}: name 'x\\ud800' is not valid Unicode (lone surrogate at character 1)"]),
    ("nested 5,000 deep", json.dumps(doc(GOOD_SPAN, span(spanId="ef" * 8, attributes=[]))).replace(
        '"attributes": []}]', '"attributes": [{"key": "d", "value": ' + "[" * 5000 + "]" * 5000 + "}]}]").encode(), None,
     [f"{WHERE}: JSON nested deeper than 128 levels"]),
]


@pytest.mark.parametrize("name,content,file_error,span_errors", CASES, ids=[c[0] for c in CASES])
def test_malformed_otlp(store, settings, tmp_path, name, content, file_error, span_errors):
    con, w = store
    p = tmp_path / "in.json"
    p.write_bytes(content)
    res = files.import_otlp([p], w, settings)
    if file_error is not None:
        assert res.errors == [f"{p}: {file_error}"]
        assert res.accepted == 0
    else:
        # the good first span is kept, the bad second one is rejected with its position
        assert res.errors == [f"{p}: {e}" for e in span_errors]
        assert (res.accepted, res.rejected) == (1, 1)
        assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 1


def test_wrong_attribute_type_is_a_warning_not_a_rejection(store, settings, tmp_path):
    con, w = store
    bad = span(attributes=GOOD_SPAN["attributes"] + [{"key": "gen_ai.usage.input_tokens", "value": {"stringValue": "many"}}])
    p = tmp_path / "in.json"
    p.write_text(json.dumps(doc(bad)))
    res = files.import_otlp([p], w, settings)
    assert (res.accepted, res.rejected) == (1, 0)
    assert res.warnings == [f"{p}: resourceSpans[0].scopeSpans[0].spans[0] (span cdcdcdcdcdcdcdcd): "
                            "attribute gen_ai.usage.input_tokens must be a number, got 'many'; stored as unknown"]
    assert con.execute("SELECT input_tokens FROM spans").fetchone()[0] is None


def test_jsonl_bad_line_keeps_the_rest(store, settings, tmp_path):
    con, w = store
    p = tmp_path / "in.jsonl.gz"
    good2 = span(spanId="ef" * 8)
    p.write_bytes(gzip.compress((json.dumps(doc(GOOD_SPAN)) + "\n{not json\n" + json.dumps(doc(good2)) + "\n").encode()))
    res = files.import_otlp([p], w, settings)
    assert res.accepted == 2
    assert res.errors == [f"{p}:2: invalid JSON at line 1 column 2: Expecting property name enclosed in double quotes"]


def test_truncated_gzip(store, settings, tmp_path):
    con, w = store
    p = tmp_path / "in.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc(GOOD_SPAN)).encode())[:20])
    res = files.import_otlp([p], w, settings)
    assert res.accepted == 0 and res.errors[0].startswith(f"{p}: truncated or corrupt gzip")


PROM_CASES = [
    ('vllm:x{a="b" 1\n', "f.prom: invalid Prometheus text: could not convert string to float: '{a=\"b\"' at line 1: 'vllm:x{a=\"b\" 1'"),
    ('# TYPE x counter\nx 1\nx abc\n', "f.prom: invalid Prometheus text: could not convert string to float: 'abc' at line 3: 'x abc'"),
]


@pytest.mark.parametrize("text,message", PROM_CASES)
def test_malformed_prometheus(text, message):
    with pytest.raises(InputError) as e:
        parse_text(text, "i:1", 1.0, "f.prom")
    assert str(e.value) == message


def test_prom_snapshot_needs_a_time(store, tmp_path):
    con, w = store
    p = tmp_path / "metrics.txt"
    p.write_text("x 1\n")
    res = files.import_prom([p], "i:1", w)
    assert res.errors == [f"{p}: cannot tell when this snapshot was taken: name it <epoch-seconds>.prom or pass --at"]


KV_CASES = [
    ('{"instance": "i:1", "seq": 0, "decoded": [1.5, [["BlockStored", [1, 2], null, [], 16, null, "GPU"]]]}', 1, []),
    ('{"instance": "i:1", "seq": 1, "decoded": [1.5, [["Bogus"]]]}', 0, ["in.jsonl:1: seq 1: events[0]: unknown KV event type 'Bogus'"]),
    ('{"seq": 1, "decoded": [1.5, []]}', 0, ["in.jsonl:1: no 'instance' in the line and no --instance given"]),
    ('{"instance": "i:1", "seq": 2, "payload_hex": "c1"}', 0, ["in.jsonl:1: seq 2: not msgpack (MessagePack data is malformed: invalid opcode '\\xc1' (byte 0))"]),
    ('{"instance": "i:1", "seq": 3, "decoded": ["x", []]}', 0, ["in.jsonl:1: seq 3: batch timestamp 'x' is not a number"]),
]


@pytest.mark.parametrize("line,events,errors", KV_CASES)
def test_kv_event_lines(store, tmp_path, monkeypatch, line, events, errors):
    con, w = store
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text(line + "\n")
    res = files.import_kv_events(["in.jsonl"], w)
    assert res.accepted == events
    assert res.errors == errors
