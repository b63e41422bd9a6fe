"""OTLP decode, made faster: its rows equal the implementation it replaced, on every fixture, the
bench payloads and a payload built to reach every branch (all value kinds, nested values, repeated
keys, bad ids, events, warnings, several resources and scopes).

``_ref_decode`` / ``_ref_promote`` below are the decoder as it was before the fast path (commit
f3d2eae): aliases looked up in a merged dict, each alias list read from the settings per span. They use the
alias constants and helpers of normalize.py, so alias edits there apply to both; only a change of
promote's control flow needs the copy updated.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from agentobs.collect import otlp
from agentobs.collect.normalize import (
    CACHE_WRITE_KEYS,
    CACHED_KEYS,
    CHUNK_EVENT,
    INPUT_EXCLUDES_CACHE,
    INPUT_KEYS,
    OUTPUT_KEYS,
    TTFT_KEYS,
    _engine_of,
    _exception_type,
    _finish_reason,
    _flag,
    _http_error,
    _litellm_ids,
    _litellm_instance,
    _litellm_usage,
    _streamed,
    classify,
)
from agentobs.config import Settings, load_settings

FIXTURES = Path(__file__).parent / "fixtures"
BENCH = Path(__file__).parent.parent / "bench"
SETTINGS = load_settings(env={})


# -- the reference: the decoder before the fast path ----------------------------------------------
def _ref_num(attrs: dict[str, Any], keys, warnings: list[str], as_int: bool):
    """normalize._num as it was (before counts were checked: it never sees a bad count here)."""
    for k in keys:
        if k not in attrs:
            continue
        v = attrs[k]
        if isinstance(v, bool) or v is None:
            warnings.append(f"attribute {k} must be a number, got {v!r}; stored as unknown")
            return None
        if isinstance(v, (int, float)):
            return int(v) if as_int else float(v)
        if isinstance(v, str):
            try:
                f = float(v)
            except ValueError:
                warnings.append(f"attribute {k} must be a number, got {v!r}; stored as unknown")
                return None
            return int(f) if as_int else f
        warnings.append(f"attribute {k} must be a number, got {type(v).__name__}; stored as unknown")
        return None
    return None


def _first_str(attrs: dict[str, Any], keys) -> str | None:
    for k in keys:
        v = attrs.get(k)
        if isinstance(v, list):
            v = v[0] if v else None
        if v is None or v == "":
            continue
        return str(v)
    return None


def _ref_promote(
    name: str,
    kind: int,
    start_ns: int,
    scope: str,
    service: str | None,
    resource: dict[str, Any],
    attrs: dict[str, Any],
    events: list[dict[str, Any]],
    settings: Settings,
) -> tuple[dict[str, Any], list[str]]:
    warnings: list[str] = []
    role, op = classify(name, kind, scope, attrs)
    out: dict[str, Any] = {"role": role, "op": op}
    merged = attrs if not resource else {**resource, **attrs}
    lite = _litellm_ids(attrs, settings.session_keys, settings.task_keys)
    out["session_id"] = _first_str(merged, settings.session_keys) or lite[0]
    out["task_id"] = _first_str(merged, settings.task_keys) or lite[1]
    out["task_type"] = _first_str(merged, settings.task_type_keys)
    out["tenant"] = _first_str(merged, settings.tenant_keys)
    out["agent_name"] = _first_str(attrs, ("gen_ai.agent.name",))
    attempt = _ref_num(attrs, ("agentobs.attempt", "gen_ai.request.attempt"), warnings, True)
    out["attempt"] = attempt
    out["branch"] = _first_str(attrs, ("agentobs.branch",))
    out["model"] = _first_str(attrs, ("gen_ai.response.model", "gen_ai.request.model", "llm.request.model"))
    provider = _first_str(attrs, ("gen_ai.provider.name", "gen_ai.system"))
    out["provider"] = provider
    out["engine"] = _engine_of(role, scope, name, provider, service)
    addr = _first_str(merged, ("server.address", "agentobs.instance"))
    port = merged.get("server.port")
    if addr is not None and port not in (None, "") and ":" not in addr.split("]")[-1]:
        addr = f"{addr}:{port}"
    out["instance"] = addr if addr is not None else (_litellm_instance(attrs) if role == "gateway" else None)
    out["response_id"] = _first_str(attrs, ("gen_ai.response.id",))
    out["request_id"] = _first_str(attrs, ("gen_ai.request.id",))

    usage = _litellm_usage(attrs)
    p = _ref_num(attrs, INPUT_KEYS, warnings, True)
    c = _ref_num(attrs, CACHED_KEYS, warnings, True)
    o = _ref_num(attrs, OUTPUT_KEYS, warnings, True)
    if usage:
        if p is None and isinstance(usage.get("prompt_tokens"), int):
            p = usage["prompt_tokens"]
        if o is None and isinstance(usage.get("completion_tokens"), int):
            o = usage["completion_tokens"]
        if c is None:
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                c = details["cached_tokens"]
            elif isinstance(usage.get("cache_read_input_tokens"), int):
                c = usage["cache_read_input_tokens"]
    if p is not None and c is not None:
        excludes = _flag(merged.get(INPUT_EXCLUDES_CACHE)) is True
        if excludes or c > p:
            if not excludes:
                warnings.append(f"cached tokens ({c}) exceed input tokens ({p}); treated as input that excludes "
                                "cache (P := P + cache reads + cache writes)")
            p = p + c + (_ref_num(attrs, CACHE_WRITE_KEYS, warnings, True) or 0)
    out["input_tokens"], out["cached_tokens"], out["output_tokens"] = p, c, o
    out["system_tokens"] = _ref_num(attrs, ("agentobs.prompt.system_tokens",), warnings, True)
    out["tool_def_tokens"] = _ref_num(attrs, ("agentobs.prompt.tool_tokens",), warnings, True)

    ttft = _ref_num(attrs, TTFT_KEYS, warnings, False)
    chunk_times = [e["time_ns"] for e in events if e.get("name") == CHUNK_EVENT and e.get("time_ns")]
    if ttft is None and chunk_times:
        ttft = (min(chunk_times) - start_ns) / 1e9
    out["ttft_s"] = None if role != "engine" and _streamed(attrs) is False else ttft
    out["queue_s"] = _ref_num(attrs, ("gen_ai.latency.time_in_queue",), warnings, False)
    out["prefill_s"] = _ref_num(attrs, ("gen_ai.latency.time_in_model_prefill",), warnings, False)
    out["decode_s"] = _ref_num(attrs, ("gen_ai.latency.time_in_model_decode",), warnings, False)
    out["finish_reason"] = _finish_reason(attrs.get("gen_ai.response.finish_reasons"))
    out["error_type"] = _first_str(attrs, ("error.type",)) or _http_error(attrs) or _exception_type(events)
    out["tool_name"] = _first_str(attrs, ("gen_ai.tool.name",))

    itl = attrs.get("agentobs.itl_ms")
    if isinstance(itl, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in itl):
        out["itl_ms"] = [float(x) for x in itl]
    elif itl is not None:
        warnings.append("attribute agentobs.itl_ms must be an array of numbers; ignored")
        out["itl_ms"] = None
    elif len(chunk_times) >= 2:
        ts = sorted(chunk_times)
        out["itl_ms"] = [(b - a) / 1e6 for a, b in zip(ts, ts[1:], strict=False)]
    else:
        out["itl_ms"] = None
    bh = attrs.get("agentobs.prompt.block_hashes")
    out["block_hashes"] = [str(x) for x in bh] if isinstance(bh, list) else None
    return out, warnings


def _ref_decode(req: ExportTraceServiceRequest, settings, source="otlp", where="payload"):
    """(rows, accepted, rejected, errors, warnings) as the pre-fast-path decode_request made them."""
    rows, errors, warnings = [], [], []
    for ri, rs in enumerate(req.resource_spans):
        resource = otlp._pb_attrs(rs.resource.attributes)
        resource_json = otlp._json_enc.encode(resource).decode()
        service = resource.get("service.name")
        for si, ss in enumerate(rs.scope_spans):
            scope = ss.scope.name
            for pi, sp in enumerate(ss.spans):
                w = f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]"
                try:
                    tid = otlp._id_from_bytes(sp.trace_id, 16, "traceId")
                    sid = otlp._id_from_bytes(sp.span_id, 8, "spanId")
                    parent = otlp._id_from_bytes(sp.parent_span_id, 8, "parentSpanId") if sp.parent_span_id else None
                    events = [{"name": e.name, "time_ns": e.time_unix_nano,
                               **({"attributes": otlp._pb_attrs(e.attributes)} if e.attributes else {})}
                              for e in sp.events] if sp.events else []
                    start_ns, end_ns = int(sp.start_time_unix_nano), int(sp.end_time_unix_nano)
                    if end_ns and end_ns < start_ns:
                        raise ValueError(f"endTimeUnixNano {end_ns} is before startTimeUnixNano {start_ns}")
                    if start_ns <= 0:
                        raise ValueError("startTimeUnixNano missing or zero")
                    attrs = otlp._pb_attrs(sp.attributes)
                    promoted, warns = _ref_promote(sp.name, int(sp.kind), start_ns, scope, service, resource,
                                                   attrs, events, settings)
                except ValueError as e:
                    errors.append(f"{w}: {e}")
                    continue
                row = {"trace_id": tid, "span_id": sid, "parent_span_id": parent, "name": sp.name,
                       "kind": int(sp.kind), "start_ns": start_ns, "end_ns": end_ns or start_ns,
                       "status_code": int(sp.status.code), "status_message": sp.status.message or None,
                       "service_name": service, "scope_name": scope, "resource": resource_json,
                       "attributes": otlp._json_enc.encode(attrs).decode(),
                       "events": otlp._json_enc.encode(events).decode() if events else None,
                       **promoted, "ingest_source": source}
                rows.append(row)
                warnings.extend(f"{w} (span {sid}): {x}" for x in warns)
    return rows, len(rows), len(errors), errors, warnings


# -- payloads ----------------------------------------------------------------------------------
def _kv(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=_any(value))


def _any(v: Any) -> AnyValue:
    if v is None:
        return AnyValue()
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, bytes):
        return AnyValue(bytes_value=v)
    if isinstance(v, list):
        a = AnyValue()
        a.array_value.values.extend(_any(x) for x in v)
        return a
    if isinstance(v, dict):
        a = AnyValue()
        a.kvlist_value.values.extend(_kv(k, x) for k, x in v.items())
        return a
    return AnyValue(string_value=v)


def _span(s, tid: bytes, sid: bytes, name: str, attrs: dict, start=1_791_969_600_000_000_000, dur=2_000_000_000,
          kind=Span.SPAN_KIND_CLIENT):
    s.trace_id, s.span_id, s.name, s.kind = tid, sid, name, kind
    s.start_time_unix_nano, s.end_time_unix_nano = start, start + dur
    s.attributes.extend(_kv(k, v) for k, v in attrs.items())
    return s


def _edge_request() -> ExportTraceServiceRequest:
    """Every branch of decode and promote: value kinds, nesting, repeated keys, events, bad spans."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([_kv("service.name", "vllm-engine"), _kv("gen_ai.conversation.id", "res-sess"),
                                   _kv("server.port", 8001), _kv("app.task.id", "")])
    ss = rs.scope_spans.add()
    ss.scope.name = "vllm.api"
    ss.scope.version = "0.9"
    tid = bytes(range(1, 17))
    big = "x" * 70_000  # truncated to MAX_ATTR_BYTES characters
    s = _span(ss.spans.add(), tid, b"\x01" * 8, "llm_request", {
        "gen_ai.latency.e2e": 1.5, "gen_ai.latency.time_to_first_token": 0.25, "gen_ai.usage.prompt_tokens": 9000,
        "gen_ai.usage.completion_tokens": 120, "gen_ai.request.id": "cmpl-1", "neg": -5, "big_neg": -(2**63),
        "big_pos": 2**63 - 1, "nan": math.nan, "inf": -math.inf, "t": True, "f": False, "empty": None,
        "blob": b"\x00\xffbytes", "arr": [1, "two", 3.5, [True, None], {"k": "v"}], "kv": {"a": {"b": [1, 2]}},
        "ünïcode.κλειδί": "värde ✓", "k" * 200: "long key", "long_value": "y" * 300, "huge": big,
        "dup": "first", "agentobs.itl_ms": [12.5, 13, 40.25],
        "agentobs.prompt.block_hashes": ["h1", "h2"], "gen_ai.response.finish_reasons": '["length"]',
    }, kind=Span.SPAN_KIND_SERVER)
    s.attributes.append(_kv("dup", "second"))  # a repeated key: the last value, at the first one's place
    s.attributes.append(KeyValue(key="no_value"))  # a KeyValue without a value
    s.attributes.append(KeyValue(key="strindex", value=AnyValue(string_value_strindex=3)))
    s.parent_span_id = b"\x02" * 8
    s.trace_state = "vendor=x"
    s.flags = 0x301
    s.dropped_attributes_count = 4
    s.dropped_events_count = 1
    s.dropped_links_count = 2
    s.status.code = Status.STATUS_CODE_ERROR
    s.status.message = "engine overloaded"
    link = s.links.add()
    link.trace_id, link.span_id = tid, b"\x03" * 8
    for k, dt in enumerate((250_000_000, 262_500_000, 275_500_000)):  # chunk events: TTFT and ITL from events
        e = s.events.add()
        e.name, e.time_unix_nano = "gen_ai.content.completion.chunk", s.start_time_unix_nano + dt
        if k == 0:
            e.attributes.extend([_kv("gen_ai.chunk", "hi"), _kv("n", 1)])
    # a gateway chat call whose cached tokens exceed its input (a warning) and an Anthropic one
    ss2 = rs.scope_spans.add()
    ss2.scope.name = "opentelemetry.instrumentation.litellm"
    _span(ss2.spans.add(), tid, b"\x04" * 8, "chat claude", {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic", "gen_ai.usage.input_tokens": 50,
        "gen_ai.usage.cache_read.input_tokens": 4000, "gen_ai.usage.cache_creation.input_tokens": 100,
        "gen_ai.usage.output_tokens": "77", "server.address": "10.1.1.1", "agentobs.attempt": "x",
        "http.request.header.x-session-id": ["hdr-sess"], "enduser.id": 42})
    _span(ss2.spans.add(), tid, b"\x05" * 8, "chat m", {
        "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.cache_read.input_tokens": 300, "agentobs.itl_ms": ["bad"]})
    # not streamed (TTFT dropped), an HTTP error, an exception event, LiteLLM's stringified ids, the cache flag
    _span(ss2.spans.add(), tid, b"\x0b" * 8, "litellm_request", {
        "gen_ai.operation.name": "acompletion", "llm.is_streaming": "False", "gen_ai.response.time_to_first_chunk": 1.5,
        "http.response.status_code": 503, "metadata.requester_metadata": "{'task_id': 't-9', 'headers': {}}",
        "metadata.usage_object": "{'prompt_tokens': 10, 'prompt_tokens_details': {'cached_tokens': 4}}",
        "agentobs.usage.input_excludes_cache": "true"})
    e = _span(ss2.spans.add(), tid, b"\x0c" * 8, "chat x", {
        "gen_ai.operation.name": "chat", "gen_ai.request.stream": True, "gen_ai.response.time_to_first_chunk": 0.5,
        "http.status_code": "200"}).events.add()
    e.name, e.time_unix_nano = "exception", 1_791_969_600_100_000_000
    e.attributes.extend([_kv("exception.type", "TimeoutError")])
    # rejected spans: short trace id, all-zero span id, end before start, no start, short parent
    _span(ss2.spans.add(), b"\x01" * 15, b"\x06" * 8, "bad", {})
    _span(ss2.spans.add(), tid, b"\x00" * 8, "bad", {})
    _span(ss2.spans.add(), tid, b"\x07" * 8, "bad", {}, dur=-5)
    _span(ss2.spans.add(), tid, b"\x08" * 8, "bad", {}, start=0, dur=0)
    _span(ss2.spans.add(), tid, b"\x09" * 8, "bad", {}).parent_span_id = b"\x01"
    # a second resource with no attributes, an empty scope, no spans at all in another scope
    rs2 = req.resource_spans.add()
    rs2.scope_spans.add()
    _span(rs2.scope_spans.add().spans.add(), tid, b"\x0a" * 8, "invoke_agent coder",
          {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "coder"}, kind=Span.SPAN_KIND_INTERNAL)
    req.resource_spans.add()
    return req


def _from_json_fixture(doc: dict) -> ExportTraceServiceRequest:
    """An OTLP/JSON document (hex ids) as the protobuf request an exporter would send."""
    def ids(o):
        if isinstance(o, dict):
            return {k: (base64.b64encode(bytes.fromhex(v)).decode()
                        if k in ("traceId", "spanId", "parentSpanId") and v else ids(v)) for k, v in o.items()}
        return [ids(x) for x in o] if isinstance(o, list) else o
    return json_format.ParseDict(ids(doc), ExportTraceServiceRequest(), ignore_unknown_fields=True)


def _fixture_requests() -> list[tuple[str, bytes]]:
    out = [(str(p.relative_to(FIXTURES)), p.read_bytes()) for p in sorted(FIXTURES.rglob("*.pb"))]
    docs = [(p, json.loads(p.read_text())) for p in sorted(FIXTURES.rglob("*.json"))
            if "resourceSpans" in p.read_text()[:2000]]
    docs += [(p, json.loads(line)) for p in sorted(FIXTURES.rglob("otlp_spans.jsonl"))
             for line in p.read_text().splitlines()[:20] if line.strip()]
    out += [(str(p.relative_to(FIXTURES)), _from_json_fixture(d).SerializeToString()) for p, d in docs]
    return out


def _bench_requests() -> list[tuple[str, bytes]]:
    sys.path.insert(0, str(BENCH))
    try:
        from _spans import payload
    finally:
        sys.path.remove(str(BENCH))
    return [(f"bench seed {seed}", payload(512, seed)) for seed in (0, 7)]


# -- comparison --------------------------------------------------------------------------------
def _same(dec: otlp.Decoded, req: ExportTraceServiceRequest, source="otlp", where="payload") -> None:
    rows, accepted, rejected, errors, warnings = _ref_decode(req, SETTINGS, source, where)
    want = otlp.pa.Table.from_pylist(rows, schema=otlp.SPAN_SCHEMA).to_pylist()
    got = dec.table().to_pylist()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g == w, {k: (g[k], w[k]) for k in g if g[k] != w[k]}
    assert (dec.accepted, dec.rejected, dec.errors, dec.warnings) == (accepted, rejected, errors, warnings)


def test_fixtures_decode_as_before():
    reqs = _fixture_requests()
    # the real vLLM/LiteLLM captures (.pb) and the JSON fixtures converted to protobuf
    assert sum(name.endswith(".pb") for name, _ in reqs) >= 40 and len(reqs) > 45
    spans = 0
    for name, data in reqs:
        req = ExportTraceServiceRequest.FromString(data)
        dec = otlp.decode_protobuf(data, SETTINGS, "file", name)
        _same(dec, req, "file", name)
        _same(otlp.decode_request(req, SETTINGS), req)
        spans += dec.accepted
    assert spans > 100


def test_bench_payloads_decode_as_before():
    for name, data in _bench_requests():
        req = ExportTraceServiceRequest.FromString(data)
        dec = otlp.decode_request(req, SETTINGS, "otlp-http", "body")
        assert dec.accepted == 512 and not dec.errors, name
        _same(dec, req, "otlp-http", "body")


def test_every_branch_decodes_as_before():
    req = _edge_request()
    dec = otlp.decode_protobuf(req.SerializeToString(), SETTINGS)
    _same(dec, req)
    assert (dec.accepted, dec.rejected) == (6, 5)
    rows = {r["span_id"]: r for r in dec.table().to_pylist()}
    engine = rows["01" * 8]
    attrs = json.loads(engine["attributes"])
    # spot checks against hand-written expectations (beyond equality with the reference):
    assert len(attrs["huge"]) == otlp.MAX_ATTR_BYTES and attrs["dup"] == "second"
    assert list(attrs)[list(attrs).index("dup") + 1] == "agentobs.itl_ms"  # first place kept
    assert attrs["big_neg"] == -(2**63) and attrs["nan"] is None and attrs["blob"] == "AP9ieXRlcw=="
    assert attrs["arr"] == [1, "two", 3.5, [True, None], {"k": "v"}] and attrs["no_value"] is None
    assert engine["status_code"] == 2 and engine["status_message"] == "engine overloaded"
    # TTFT from the attribute (0.25) wins over the first chunk; ITL from agentobs.itl_ms
    assert engine["ttft_s"] == 0.25 and engine["itl_ms"] == [12.5, 13.0, 40.25]
    # session from the resource, port 8001 from the resource; task '' in the resource is no task
    assert engine["session_id"] == "res-sess" and engine["task_id"] is None
    claude = rows["04" * 8]
    assert (claude["input_tokens"], claude["cached_tokens"]) == (50 + 4000 + 100, 4000)  # P := P + C + W
    # gen_ai.conversation.id (on the resource) comes before the x-session-id header in session_keys
    assert claude["instance"] == "10.1.1.1:8001" and claude["session_id"] == "res-sess" and claude["tenant"] == "42"
    assert any("cached tokens (300) exceed input tokens (100)" in w for w in dec.warnings)
    lite = rows["0b" * 8]
    # llm.is_streaming "False": the 1.5 s "first chunk" is the whole latency, not a TTFT; HTTP 503 is the error;
    # the task from the stringified requester metadata; input 10 declared to exclude the 4 cached: P = 14
    assert (lite["ttft_s"], lite["error_type"], lite["task_id"]) == (None, "503", "t-9")
    assert (lite["input_tokens"], lite["cached_tokens"]) == (14, 4)
    streamed = rows["0c" * 8]  # streamed: its TTFT stays; HTTP 200 is no error, the exception event is
    assert (streamed["ttft_s"], streamed["error_type"]) == (0.5, "TimeoutError")


def test_columns_and_table_agree():
    data = _bench_requests()[1][1]
    a = otlp.decode_protobuf(data, SETTINGS)
    b = otlp.decode_protobuf(data, SETTINGS)
    cols = a.columns  # rows moved into the column lists
    assert len(cols["span_id"]) == 512 and a.table().equals(b.table())
    both = otlp.Decoded()
    both.extend(a)
    both.extend(b)
    assert both.accepted == 1024 and both.table().num_rows == 1024
    assert both.table().slice(512).equals(b.table())


def test_settings_alias_lists_are_read_per_payload():
    # the alias sets are cached per alias lists: a payload decoded with other settings uses theirs
    req = ExportTraceServiceRequest()
    _span(req.resource_spans.add().scope_spans.add().spans.add(), b"\x01" * 16, b"\x02" * 8, "chat m",
          {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "conv", "my.session": "mine",
           "my.tenant": "team-a"})
    data = req.SerializeToString()
    custom = load_settings(env={"AGENTOBS_SESSION_KEYS": "my.session,gen_ai.conversation.id",
                                "AGENTOBS_TENANT_KEYS": "my.tenant"})
    for settings, session, tenant in ((SETTINGS, "conv", None), (custom, "mine", "team-a"), (SETTINGS, "conv", None)):
        dec = otlp.decode_protobuf(data, settings)
        rows, *_ = _ref_decode(req, settings)
        assert (rows[0]["session_id"], rows[0]["tenant"]) == (session, tenant)
        assert dec.table().to_pylist()[0]["session_id"] == session and dec.columns["tenant"] == [tenant]
