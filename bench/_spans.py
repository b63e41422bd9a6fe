"""Realistic GenAI chat spans as OTLP protobuf payloads (shared by the benches)."""

from __future__ import annotations

import random

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

RESOURCE = {
    "service.name": "litellm-gateway",
    "service.version": "1.74.2",
    "service.instance.id": "gw-7f9c-2",
    "telemetry.sdk.language": "python",
    "telemetry.sdk.name": "opentelemetry",
    "telemetry.sdk.version": "1.45.2",
    "deployment.environment": "prod",
}


def _kv(k, v) -> KeyValue:
    if isinstance(v, bool):
        return KeyValue(key=k, value=AnyValue(bool_value=v))
    if isinstance(v, int):
        return KeyValue(key=k, value=AnyValue(int_value=v))
    if isinstance(v, float):
        return KeyValue(key=k, value=AnyValue(double_value=v))
    if isinstance(v, list):
        kv = KeyValue(key=k)
        kv.value.array_value.values.extend(AnyValue(string_value=x) for x in v)
        return kv
    return KeyValue(key=k, value=AnyValue(string_value=v))


def chat_attrs(rng: random.Random, i: int) -> dict:
    p = rng.randint(2_000, 60_000)
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "Qwen/Qwen3-32B",
        "gen_ai.response.model": "Qwen/Qwen3-32B",
        "gen_ai.response.id": f"chatcmpl-{rng.getrandbits(64):016x}",
        "gen_ai.conversation.id": f"sess-{i // 20:06d}",
        "app.task.id": f"task-{i // 60:06d}",
        "gen_ai.agent.name": "swe-agent",
        "server.address": f"10.42.7.{30 + i % 8}",
        "server.port": 8000,
        "gen_ai.request.max_tokens": 4096,
        "gen_ai.request.temperature": 0.6,
        "gen_ai.request.top_p": 0.95,
        "gen_ai.request.stream": True,
        "gen_ai.usage.input_tokens": p,
        "gen_ai.usage.cache_read.input_tokens": int(p * rng.uniform(0.5, 0.95)),
        "gen_ai.usage.output_tokens": rng.randint(20, 800),
        "gen_ai.response.finish_reasons": ["tool_calls"],
        "gen_ai.response.time_to_first_chunk": round(rng.uniform(0.05, 2.0), 4),
        "http.request.header.x-request-id": [f"{rng.getrandbits(64):016x}"],
    }


def payload(n: int, seed: int, start_ns: int = 1_791_969_600_000_000_000) -> bytes:
    """One ExportTraceServiceRequest of ``n`` chat spans (one resource, one scope)."""
    rng = random.Random(seed)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(_kv(k, v) for k, v in RESOURCE.items())
    ss = rs.scope_spans.add()
    ss.scope.name = "opentelemetry.instrumentation.litellm"
    for j in range(n):
        i = seed * n + j
        s = ss.spans.add()
        s.trace_id = rng.getrandbits(128).to_bytes(16, "big")
        s.span_id = rng.getrandbits(64).to_bytes(8, "big")
        s.parent_span_id = rng.getrandbits(64).to_bytes(8, "big")
        s.name = "chat Qwen/Qwen3-32B"
        s.kind = Span.SPAN_KIND_CLIENT
        s.start_time_unix_nano = start_ns + i * 1_000_000
        s.end_time_unix_nano = s.start_time_unix_nano + rng.randint(200_000_000, 30_000_000_000)
        s.attributes.extend(_kv(k, v) for k, v in chat_attrs(rng, i).items())
    return req.SerializeToString()
