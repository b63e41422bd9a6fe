"""Spans as users send them (docs/span-conventions.md): usage with and without cache in the input, streamed and
not streamed calls, HTTP errors and exception events. One OTLP/JSON request with the columns each span must
promote to, by hand; tests/test_foundation_import.py checks them on DuckDB's decoder,
tests/test_clickhouse_backend.py that ClickHouse's SQL promotion gives the same rows.

Not here: LiteLLM's stringified dicts (Python-only, docs/clickhouse.md; tests/test_vllm_e2e.py).
"""

from __future__ import annotations

from builders import otlp_request, resource_spans, span

T0 = 1_791_969_600_000_000_000  # ns
TRACE = "5e" * 16


# (span id suffix, attributes, events, expected columns): expected values are worked out in the comments
CASES: list[tuple[int, dict, list, dict]] = [
    # GenAI semconv, provider anthropic: input 5000 already includes the 4000 read and 100 written (the spec's
    # Anthropic refinement sums them): P stays 5000
    (1, {"gen_ai.provider.name": "anthropic", "gen_ai.usage.input_tokens": 5000,
         "gen_ai.usage.cache_read.input_tokens": 4000, "gen_ai.usage.cache_creation.input_tokens": 100},
     [], {"input_tokens": 5000, "cached_tokens": 4000, "error_type": None}),
    # declared native usage (Anthropic's own input_tokens = uncached only): P = 900 + 600 read + 100 written
    (2, {"gen_ai.usage.input_tokens": 900, "gen_ai.usage.cache_read.input_tokens": 600,
         "gen_ai.usage.cache_write.input_tokens": 100, "agentobs.usage.input_excludes_cache": True},
     [], {"input_tokens": 1600, "cached_tokens": 600}),
    # cached 4000 > input 50: evidently without cache, P = 50 + 4000 + 100 (a warning at import)
    (3, {"gen_ai.usage.input_tokens": 50, "gen_ai.usage.cache_read.input_tokens": 4000,
         "gen_ai.usage.cache_creation.input_tokens": 100}, [], {"input_tokens": 4150, "cached_tokens": 4000}),
    # not streamed (semconv's gen_ai.request.stream false): the 1.2 s "time to first chunk" is the whole call,
    # no TTFT; HTTP 429 on the span is the call's error
    (4, {"gen_ai.request.stream": False, "gen_ai.response.time_to_first_chunk": 1.2,
         "http.response.status_code": 429}, [], {"ttft_s": None, "error_type": "429"}),
    # LiteLLM's legacy callback: llm.is_streaming as text; the old semconv status name as text, 5xx
    (5, {"llm.is_streaming": "False", "gen_ai.response.time_to_first_chunk": 0.9, "http.status_code": "502"},
     [], {"ttft_s": None, "error_type": "502"}),
    # streamed: TTFT kept; HTTP 200 is not an error
    (6, {"llm.is_streaming": "True", "gen_ai.response.time_to_first_chunk": 0.3, "http.response.status_code": 200},
     [], {"ttft_s": 0.3, "error_type": None}),
    # an exception event: its exception.type; error.type wins over a status code and an exception
    (7, {}, [{"name": "exception", "attributes": {"exception.type": "httpx.ReadTimeout"}}],
     {"error_type": "httpx.ReadTimeout"}),
    (8, {}, [{"name": "exception", "attributes": {"exception.message": "boom"}}], {"error_type": "exception"}),
    (9, {"error.type": "timeout", "http.response.status_code": 503},
     [{"name": "exception", "attributes": {"exception.type": "X"}}], {"error_type": "timeout"}),
    # a status code that is not a number is no error (and no failure to import)
    (10, {"http.response.status_code": "n/a"}, [], {"error_type": None}),
]
# the flag on the resource (OTEL_RESOURCE_ATTRIBUTES=agentobs.usage.input_excludes_cache=true: text)
RESOURCE_CASE = (11, {"gen_ai.usage.input_tokens": 900, "gen_ai.usage.cache_read.input_tokens": 600},
                 [], {"input_tokens": 1500, "cached_tokens": 600})


def span_id(n: int) -> str:
    return f"{n:016x}"


def _span(n: int, attrs: dict, events: list) -> dict:
    start = T0 + n * 10**9  # each case 2 s long, its events 0.1 s in
    return span(TRACE, span_id(n), "chat m", start, start + 2 * 10**9, {"gen_ai.operation.name": "chat", **attrs},
                events=[{**e, "time_ns": start + 10**8} for e in events])


def request() -> dict:
    n, attrs, events, _ = RESOURCE_CASE
    return otlp_request(resource_spans("agent", "cases", [_span(*c[:3]) for c in CASES]),
                        resource_spans("native", "cases", [_span(n, attrs, events)],
                                       **{"agentobs.usage.input_excludes_cache": "true"}))


def expected() -> dict[str, dict]:
    return {span_id(n): exp for n, _, _, exp in [*CASES, RESOURCE_CASE]}
