"""Import → normalized rows, checked against the fixtures by hand."""

from __future__ import annotations

import copy
import gzip
import json

import pytest
import span_cases

from agentobs.collect import files
from agentobs.collect.otlp import decode_json_obj

SESSION = "sess-0199e1a2-6c40-7d2e-b7a1-3f9e5c2d8a10"


def rows(con, sql, params=None):
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def test_worked_example_normalized_calls(store, fixtures, settings):
    con, w = store
    res = files.import_otlp([fixtures / "otlp" / "agent_task_3turns.json"], w, settings)
    # 6 spans: invoke_agent root, 2 execute_tool, 3 chat
    assert (res.accepted, res.rejected, res.inserted) == (6, 0, 6)
    calls = rows(con, """SELECT call_id, session_id, task_id, task_type, agent_name, attempt, branch, instance,
                                engine, model, ttft_s, round(e2e_s, 3) AS e2e_s, prompt_tokens, cached_tokens,
                                output_tokens, status, finish_reason, source
                         FROM llm_calls ORDER BY start_s""")
    # The invoke_agent root carries the task's aggregate usage (P=15661) and is NOT a call.
    assert len(calls) == 3
    common = dict(session_id=SESSION, task_id="task-0042-fix-parser-bug",
                  task_type="swe-fixer",  # inherited from the root invoke_agent (gen_ai.agent.name)
                  agent_name="swe-fixer", attempt=1, branch="main", instance="10.42.7.31:8000",
                  engine="vllm",  # gen_ai.provider.name = vllm on the gateway span
                  model="Qwen/Qwen3-32B", status="ok", source="gateway")
    expected = [
        dict(call_id="1c5e9a3b7d2f4e61", ttft_s=0.214, e2e_s=4.294, prompt_tokens=3412, cached_tokens=3072,
             output_tokens=186, finish_reason="tool_calls"),
        dict(call_id="3e7a1c5d9f4b6083", ttft_s=0.236, e2e_s=5.787, prompt_tokens=4892, cached_tokens=3408,
             output_tokens=242, finish_reason="tool_calls"),
        dict(call_id="5a9c3e7f1b6d82a5", ttft_s=0.612, e2e_s=4.072, prompt_tokens=7357, cached_tokens=3072,
             output_tokens=158, finish_reason="stop"),
    ]
    assert calls == [{**common, **e} for e in expected]

    gaps = rows(con, "SELECT prev_call_id, call_id, round(gap_s, 3) AS gap_s FROM turn_gaps ORDER BY start_ts")
    # gaps from METRICS.md's worked example: 0.109 s, then 41.748 s (the run_tests tool call)
    assert gaps == [
        {"prev_call_id": "1c5e9a3b7d2f4e61", "call_id": "3e7a1c5d9f4b6083", "gap_s": 0.109},
        {"prev_call_id": "3e7a1c5d9f4b6083", "call_id": "5a9c3e7f1b6d82a5", "gap_s": 41.748},
    ]
    tools = rows(con, "SELECT session_id, task_id, tool_name, round(duration_s, 3) AS d, status FROM tool_calls ORDER BY start_s")
    assert tools == [
        # tool spans carry no session attribute: inherited from the trace's root invoke_agent span
        {"session_id": SESSION, "task_id": "task-0042-fix-parser-bug", "tool_name": "read_file", "d": 0.084, "status": "ok"},
        {"session_id": SESSION, "task_id": "task-0042-fix-parser-bug", "tool_name": "run_tests", "d": 41.722, "status": "ok"},
    ]
    sess = rows(con, "SELECT calls, prompt_tokens, cached_tokens, output_tokens, instances FROM sessions")
    # ΣP = 3412+4892+7357 = 15661, ΣC = 3072+3408+3072 = 9552 (equal to the root's aggregate, not added to it)
    assert sess == [{"calls": 3, "prompt_tokens": 15661, "cached_tokens": 9552, "output_tokens": 586, "instances": 1}]
    task = rows(con, "SELECT task_id, sessions, calls, retries FROM tasks")
    assert task == [{"task_id": "task-0042-fix-parser-bug", "sessions": 1, "calls": 3, "retries": 0}]


def test_reimport_is_idempotent(store, fixtures, settings):
    con, w = store
    f = fixtures / "otlp" / "agent_task_3turns.json"
    files.import_otlp([f], w, settings)
    again = files.import_otlp([f], w, settings)
    assert (again.accepted, again.inserted, again.duplicates) == (6, 0, 6)
    assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 6
    prom = fixtures / "vllm" / "metrics_sample.txt"
    first = files.import_prom([prom], "10.42.7.31:8000", w, at=1791969725.0)
    second = files.import_prom([prom], "10.42.7.31:8000", w, at=1791969725.0)
    assert first.inserted == first.accepted > 400
    assert second.inserted == 0
    assert con.execute("SELECT count(*) FROM engine_config").fetchone()[0] == first_config_rows(con)


def first_config_rows(con):
    # one row per cache_config_info label, stored once (unchanged config is not stored again)
    return con.execute("SELECT count(DISTINCT key) FROM engine_config").fetchone()[0]


def test_vllm_engine_span_alone_and_joined(store, fixtures, settings):
    con, w = store
    files.import_otlp([fixtures / "vllm" / "otlp_request_span.json"], w, settings)
    call = rows(con, """SELECT source, prompt_tokens, cached_tokens, output_tokens, round(ttft_s, 4) AS ttft,
                               round(queue_s, 6) AS q, round(prefill_s, 4) AS pf, round(decode_s, 4) AS dc,
                               request_id, engine FROM llm_calls""")
    assert call == [{
        "source": "engine", "prompt_tokens": 14873,
        "cached_tokens": None,  # the vLLM span carries no cached-token attribute: unknown, not 0
        "output_tokens": 187, "ttft": 0.215, "q": 0.008312, "pf": 0.1929, "dc": 5.5305,
        "request_id": "chatcmpl-3f6d2b8a91c44e0f9b7a5c1e2d4f6a80", "engine": "vllm",
    }]


def _gateway_doc(trace_id, span_id, response_id, cached=1024):
    attr = lambda k, v: {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}  # noqa: E731
    return {"resourceSpans": [{"resource": {"attributes": [attr("service.name", "gw")]}, "scopeSpans": [{"scope": {"name": "gw"}, "spans": [{
        "traceId": trace_id, "spanId": span_id, "name": "chat m", "kind": 3,
        "startTimeUnixNano": "1786527341470000000", "endTimeUnixNano": "1786527347240000000",
        "attributes": [attr("gen_ai.operation.name", "chat"), attr("gen_ai.conversation.id", "s1"),
                       attr("gen_ai.response.id", response_id), attr("gen_ai.usage.input_tokens", 14873),
                       attr("gen_ai.usage.cache_read.input_tokens", cached), attr("gen_ai.usage.output_tokens", 187),
                       attr("server.address", "10.0.0.5"), attr("server.port", 8000)]}]}]}]}


@pytest.mark.parametrize("how", ["parent", "response_id"])
def test_gateway_engine_join(store, fixtures, settings, tmp_path, how):
    con, w = store
    engine = json.loads((fixtures / "vllm" / "otlp_request_span.json").read_text())
    span = engine["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    if how == "parent":  # W3C: the engine span is the gateway span's child in the same trace
        gw = _gateway_doc(span["traceId"], span["parentSpanId"], "chatcmpl-other")
    else:  # no traceparent: gateway response id = vLLM request id (chatcmpl-<X-Request-Id>)
        gw = _gateway_doc("0123456789abcdef0123456789abcdef", "1111222233334444", "chatcmpl-3f6d2b8a91c44e0f9b7a5c1e2d4f6a80")
    (tmp_path / "gw.json").write_text(json.dumps(gw))
    files.import_otlp([fixtures / "vllm" / "otlp_request_span.json", tmp_path / "gw.json"], w, settings)
    call = rows(con, "SELECT source, session_id, instance, prompt_tokens, cached_tokens, round(queue_s, 6) AS q, engine_span_id FROM llm_calls")
    assert call == [{"source": "gateway+engine", "session_id": "s1", "instance": "10.0.0.5:8000",
                     "prompt_tokens": 14873, "cached_tokens": 1024, "q": 0.008312, "engine_span_id": "c2e81f0a7b3d4596"}]


def test_jsonl_gzip_and_protobuf_files(store, fixtures, settings, tmp_path):
    import struct

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    con, w = store
    doc = json.loads((fixtures / "otlp" / "agent_task_3turns.json").read_text())
    # JSON lines as the Collector file exporter writes: one export request per line, gzip
    first, second = copy.deepcopy(doc), copy.deepcopy(doc)
    first["resourceSpans"] = doc["resourceSpans"][:1]
    second["resourceSpans"] = doc["resourceSpans"][1:]
    (tmp_path / "t.jsonl.gz").write_bytes(gzip.compress((json.dumps(first) + "\n" + json.dumps(second) + "\n").encode()))
    res = files.import_otlp([tmp_path / "t.jsonl.gz"], w, settings)
    assert (res.accepted, res.rejected) == (6, 0)
    # protobuf, length-prefixed stream (4-byte big-endian sizes): the same spans are duplicates
    def to_pb(d):
        d = copy.deepcopy(d)
        for rs in d["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for k in ("traceId", "spanId", "parentSpanId"):
                        if k in sp:  # protobuf JSON mapping wants base64 ids
                            import base64
                            sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
        return json_format.ParseDict(d, ExportTraceServiceRequest()).SerializeToString()
    blob = b"".join(struct.pack(">I", len(m)) + m for m in (to_pb(first), to_pb(second)))
    (tmp_path / "t.pb").write_bytes(blob)
    res = files.import_otlp([tmp_path / "t.pb"], w, settings)
    assert (res.accepted, res.inserted) == (6, 0)
    assert con.execute("SELECT count(*) FROM llm_calls").fetchone()[0] == 3


def _usage_span(attrs: dict, resource: dict | None = None) -> dict:
    def kv(d):
        return [{"key": k, "value": {"boolValue": v} if isinstance(v, bool)
                 else {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}} for k, v in d.items()]
    return {"resourceSpans": [{"resource": {"attributes": kv(resource or {})}, "scopeSpans": [{"spans": [{
        "traceId": "ab" * 16, "spanId": "cd" * 8, "name": "chat", "startTimeUnixNano": "1000",
        "endTimeUnixNano": "2000", "attributes": kv({"gen_ai.operation.name": "chat", **attrs})}]}]}]}


SEMCONV = {"gen_ai.usage.input_tokens": 5000, "gen_ai.usage.cache_read.input_tokens": 4000,
           "gen_ai.usage.cache_creation.input_tokens": 100}


@pytest.mark.parametrize("attrs", [
    # GenAI semconv (also for Anthropic: the spec's Anthropic refinement sums input + cache reads + writes into
    # gen_ai.usage.input_tokens); cache_write is the newer name of cache_creation
    {"gen_ai.provider.name": "anthropic", **SEMCONV},
    {"gen_ai.provider.name": "anthropic", "gen_ai.usage.input_tokens": 5000,
     "gen_ai.usage.cache_read.input_tokens": 4000, "gen_ai.usage.cache_write.input_tokens": 100},
    {"gen_ai.system": "aws.bedrock", **SEMCONV},
    # OpenLLMetry's Anthropic instrumentation (reference notes §3.7): input = prompt + cache_read + cache_creation
    {"gen_ai.system": "Anthropic", "gen_ai.usage.prompt_tokens": 5000, "gen_ai.usage.cache_read.input_tokens": 4000,
     "gen_ai.usage.cache_creation.input_tokens": 100},
    {"gen_ai.provider.name": "openai", "gen_ai.usage.input_tokens": 5000,
     "gen_ai.usage.prompt_tokens_details.cached_tokens": 4000},
])
def test_input_tokens_include_cache_whatever_the_provider(settings, attrs):
    """gen_ai.usage.input_tokens includes cached tokens: the provider name alone changes nothing (P stays 5000,
    not 5000 + 4000 + 100 as when every anthropic span was taken for Anthropic's own usage)."""
    d = decode_json_obj(_usage_span(attrs), settings)
    assert (d.columns["input_tokens"], d.columns["cached_tokens"]) == ([5000], [4000])
    assert d.warnings == []


@pytest.mark.parametrize("flag_on, resource", [
    (True, False), ("true", False), ("True", False),  # a bool, or text as OTEL_RESOURCE_ATTRIBUTES / LiteLLM send it
    ("true", True),                                   # on the resource: every span of a service
])
def test_declared_native_usage_adds_cache_reads_and_writes(settings, flag_on, resource):
    # Anthropic's own usage: input_tokens 900 are the uncached tokens; 600 read + 100 written: P = 900 + 600 + 100
    attrs = {"gen_ai.provider.name": "anthropic", "gen_ai.usage.input_tokens": 900,
             "gen_ai.usage.cache_read.input_tokens": 600, "gen_ai.usage.cache_creation.input_tokens": 100}
    flag = {"agentobs.usage.input_excludes_cache": flag_on}
    d = decode_json_obj(_usage_span(attrs, flag) if resource else _usage_span({**attrs, **flag}), settings)
    assert (d.columns["input_tokens"], d.columns["cached_tokens"]) == ([1600], [600])
    # the same numbers without the flag: 900 includes the 600 cached (nothing shows otherwise)
    d = decode_json_obj(_usage_span(attrs), settings)
    assert d.columns["input_tokens"] == [900] and d.warnings == []


def test_cached_above_input_is_taken_as_input_without_cache(settings):
    # 4000 cached > 50 input: the input cannot include them; P := 50 + 4000 + 100 written, with a warning
    d = decode_json_obj(_usage_span({"gen_ai.provider.name": "acme", "gen_ai.usage.input_tokens": 50,
                                     "gen_ai.usage.cache_read.input_tokens": 4000,
                                     "gen_ai.usage.cache_creation.input_tokens": 100}), settings)
    assert d.columns["input_tokens"] == [4150] and "exceed input tokens" in d.warnings[0]


def test_span_cases_promote_as_computed_by_hand(settings):
    """tests/span_cases.py: usage, streaming, HTTP errors and exceptions (the values are worked out there)."""
    d = decode_json_obj(span_cases.request(), settings)
    assert (d.accepted, d.rejected) == (11, 0)
    rows = {r["span_id"]: r for r in d.table().to_pylist()}
    for sid, exp in span_cases.expected().items():
        assert {k: rows[sid][k] for k in exp} == exp, sid
    # the one warning: case 3's cached tokens above its input
    assert len(d.warnings) == 1 and "cached tokens (4000) exceed input tokens (50)" in d.warnings[0]


def test_session_aliases_and_litellm_usage_object(settings):
    def span(attrs):
        a = [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]
        return {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "ab" * 16, "spanId": "cd" * 8,
                "name": "litellm_request", "startTimeUnixNano": "1000", "endTimeUnixNano": "2000", "attributes": a}]}]}]}
    d = decode_json_obj(span({"metadata.session_id": "lite-1",
                              "metadata.usage_object": "{'prompt_tokens': 900, 'completion_tokens': 7, "
                                                       "'prompt_tokens_details': {'cached_tokens': 768}}",
                              "metadata.user_api_key_team_id": "team-a"}), settings)
    c = d.columns
    assert (c["role"], c["op"], c["session_id"], c["tenant"]) == (["gateway"], ["chat"], ["lite-1"], ["team-a"])
    assert (c["input_tokens"], c["cached_tokens"], c["output_tokens"]) == ([900], [768], [7])
    # first match wins: gen_ai.conversation.id before langfuse.session.id
    d = decode_json_obj(span({"langfuse.session.id": "lf", "gen_ai.conversation.id": "conv", "gen_ai.operation.name": "chat"}), settings)
    assert d.columns["session_id"] == ["conv"]


def test_chunk_events_give_ttft_and_itl(settings):
    ev = [{"name": "gen_ai.content.completion.chunk", "timeUnixNano": str(t)} for t in (1_250_000_000, 1_270_000_000, 1_400_000_000)]
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "chat x",
           "startTimeUnixNano": "1000000000", "endTimeUnixNano": "1500000000", "events": ev,
           "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]}]}]}]}
    c = decode_json_obj(doc, settings).columns
    # TTFT = first chunk − start = 0.25 s; gaps 20 ms and 130 ms
    assert c["ttft_s"] == [0.25]
    assert [round(x, 6) for x in c["itl_ms"][0]] == [20.0, 130.0]


def test_real_vllm_capture(store, fixtures, settings):
    """Spans exported by a real vLLM 0.32 (CPU) server: request spans are calls; its start-up spans
    ("Load weights", "Allocate KV cache", … under vllm.* scopes) are not."""
    con, w = store
    f = fixtures / "vllm_real" / "ample" / "otlp_spans.jsonl"
    res = files.import_otlp([f], w, settings)
    assert res.rejected == 0
    n_requests = con.execute("SELECT count(*) FROM spans WHERE name = 'llm_request'").fetchone()[0]
    assert n_requests > 0
    assert con.execute("SELECT count(*) FROM llm_calls").fetchone()[0] == n_requests
    assert con.execute("SELECT count(*) FROM llm_calls WHERE prompt_tokens IS NULL").fetchone()[0] == 0
