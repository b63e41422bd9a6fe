"""Attribute normalization: the aliases of DESIGN.md resolved into promoted span columns.

One function, ``promote``, turns a decoded span (name, kind, scope, resource and attribute dicts,
events) into the typed columns of the ``spans`` table. First match wins in every alias list.
Problems that do not make the span unusable (a token count that is not a number) are returned as
warnings and the value is stored as unknown (NULL), never as 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..config import Settings

CALL_OPS = {"chat", "text_completion", "generate_content", "completion", "responses"}
AGENT_OPS = {"invoke_agent", "create_agent", "invoke_workflow"}
CHUNK_EVENT = "gen_ai.content.completion.chunk"

INPUT_KEYS = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "llm.usage.prompt_tokens",
    "llm.token_count.prompt",
)
CACHED_KEYS = (
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
    "gen_ai.usage.prompt_tokens_details.cached_tokens",
    "llm.token_count.prompt_details.cache_read",
    "gen_ai.usage.text.cache_read.input_tokens",
)
CACHE_WRITE_KEYS = (
    "gen_ai.usage.cache_write.input_tokens",
    "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.usage.cache_creation_input_tokens",
)
OUTPUT_KEYS = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.usage.completion_tokens",
    "llm.token_count.completion",
)
TTFT_KEYS = (
    "gen_ai.response.time_to_first_chunk",
    "gen_ai.latency.time_to_first_token",
    "gen_ai.server.time_to_first_token",
)
ANTHROPIC_STYLE_PROVIDERS = {"anthropic", "aws.bedrock.anthropic"}
# LiteLLM (seen on 1.108.7) writes its call type as gen_ai.operation.name on the litellm_request span
LITELLM_OPS = {"acompletion": "chat", "completion": "chat", "atext_completion": "text_completion",
               "text_completion": "text_completion", "aresponses": "responses", "responses": "responses"}

COLUMNS = (
    "role", "op", "session_id", "task_id", "task_type", "tenant", "agent_name", "attempt", "branch",
    "model", "provider", "engine", "instance", "response_id", "request_id", "input_tokens",
    "cached_tokens", "output_tokens", "system_tokens", "tool_def_tokens", "ttft_s", "queue_s",
    "prefill_s", "decode_s", "finish_reason", "error_type", "tool_name", "itl_ms", "block_hashes",
)


def _first_str(attrs: dict[str, Any], keys: Sequence[str]) -> str | None:
    for k in keys:
        v = attrs.get(k)
        if isinstance(v, list):  # http.request.header.* values are string arrays
            v = v[0] if v else None
        if v is None or v == "":
            continue
        return str(v)
    return None


def _num(attrs: dict[str, Any], keys: Sequence[str], warnings: list[str], as_int: bool):
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


def _litellm_usage(attrs: dict[str, Any]) -> dict[str, Any]:
    """LiteLLM's legacy callback stringifies usage into ``metadata.usage_object``."""
    return _litellm_dict(attrs, "metadata.usage_object")


def _litellm_session(attrs: dict[str, Any]) -> str | None:
    """LiteLLM's proxy keeps the caller's session (``x-litellm-session-id`` / ``litellm_session_id`` /
    ``metadata.session_id``) only inside the stringified ``metadata.requester_metadata`` dict."""
    v = _litellm_dict(attrs, "metadata.requester_metadata").get("session_id")
    return str(v) if v not in (None, "") else None


def _litellm_instance(attrs: dict[str, Any]) -> str | None:
    """host:port of the upstream LiteLLM called: ``hidden_params`` (a JSON string) ``api_base``."""
    api_base = _litellm_dict(attrs, "hidden_params").get("api_base")
    if not isinstance(api_base, str):
        return None
    from urllib.parse import urlsplit

    try:
        u = urlsplit(api_base)
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return None
    if not u.hostname:
        return None
    return f"[{u.hostname}]:{port}" if ":" in u.hostname else f"{u.hostname}:{port}"


def _litellm_dict(attrs: dict[str, Any], key: str) -> dict[str, Any]:
    """A dict LiteLLM stringified into one attribute (JSON or a Python repr); {} when it is not one."""
    raw = attrs.get(key)
    if not isinstance(raw, str):
        return {}
    try:
        obj = json.loads(raw)
    except ValueError:
        try:  # python repr of a dict
            import ast

            obj = ast.literal_eval(raw)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return {}
    return obj if isinstance(obj, dict) else {}


def _finish_reason(v: Any) -> str | None:
    if isinstance(v, list):
        return str(v[0]) if v else None
    if isinstance(v, str):
        s = v.strip()
        if s.startswith("["):  # LiteLLM sends a JSON string
            try:
                arr = json.loads(s)
                return str(arr[0]) if arr else None
            except ValueError:
                return s
        return s or None
    return None


def classify(name: str, kind: int, scope: str, attrs: dict[str, Any]) -> tuple[str, str | None]:
    """(role, op) of a span."""
    op = attrs.get("gen_ai.operation.name")
    op = str(op) if op is not None else None
    scope_l = (scope or "").lower()
    # vLLM also traces its start-up ("Load weights", "Allocate KV cache", ...) under vllm.* scopes:
    # only spans that carry per-request engine attributes are requests.
    per_request = "gen_ai.latency.e2e" in attrs or "gen_ai.latency.time_to_first_token" in attrs \
        or "gen_ai.usage.prompt_tokens" in attrs
    if name == "llm_request" or (per_request and (kind == 2 or scope_l.startswith(("vllm", "sglang")))):
        return "engine", op or "engine"
    if op in LITELLM_OPS and (name == "litellm_request" or scope_l == "litellm"):
        # LiteLLM's otel callback puts its call type (acompletion, ...) in gen_ai.operation.name
        op = LITELLM_OPS[op]
    if op is None:
        if name.startswith("chat ") or name == "litellm_request":
            op = "chat"
        elif "llm.request.type" in attrs:
            op = str(attrs["llm.request.type"])
        elif name.startswith("execute_tool"):
            op = "execute_tool"
        elif name.startswith("invoke_agent"):
            op = "invoke_agent"
    if op in CALL_OPS:
        return "gateway", op
    if op in AGENT_OPS:
        return "agent", op
    if op == "execute_tool":
        return "tool", op
    return "other", op


def _engine_of(role: str, scope: str, name: str, provider: str | None, service: str | None) -> str | None:
    s = (scope or "").lower() + " " + (service or "").lower()
    if "sglang" in s:
        return "sglang"
    if role == "engine" and ("vllm" in s or name == "llm_request"):
        return "vllm"
    if provider in ("vllm", "sglang"):
        return provider
    return None


def alias_keys(settings: Settings) -> tuple[tuple[str, ...], ...]:
    """The settings' alias lists (session, task, task type, tenant) as tuples, read once per payload."""
    return (tuple(settings.session_keys), tuple(settings.task_keys), tuple(settings.task_type_keys),
            tuple(settings.tenant_keys))


_MISSING = object()


def _first_str_merged(attrs: dict[str, Any], resource: dict[str, Any], keys: Sequence[str]) -> str | None:
    """``_first_str({**resource, **attrs}, keys)`` without building the merged dict."""
    for k in keys:
        v = attrs.get(k, _MISSING)
        if v is _MISSING:
            v = resource.get(k)
        if isinstance(v, list):
            v = v[0] if v else None
        if v is None or v == "":
            continue
        return str(v)
    return None


def promote(
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
    row, warnings = promote_row(name, kind, start_ns, scope, service, resource, attrs, events, alias_keys(settings))
    return dict(zip(COLUMNS, row, strict=True)), warnings


def promote_row(
    name: str,
    kind: int,
    start_ns: int,
    scope: str,
    service: str | None,
    resource: dict[str, Any],
    attrs: dict[str, Any],
    events: list[dict[str, Any]],
    keys: tuple[tuple[str, ...], ...],
) -> tuple[tuple, list[str]]:
    """``promote`` as a tuple in ``COLUMNS`` order; ``keys`` is ``alias_keys(settings)``.

    The hot path of ingest: attributes of the resource are looked up behind the span's (no merged
    dict), the alias lists come in as tuples, absent LiteLLM attributes are not parsed."""
    warnings: list[str] = []
    role, op = classify(name, kind, scope, attrs)
    session_keys, task_keys, task_type_keys, tenant_keys = keys
    res = resource or {}
    session_id = _first_str_merged(attrs, res, session_keys) or _litellm_session(attrs)
    task_id = _first_str_merged(attrs, res, task_keys)
    task_type = _first_str_merged(attrs, res, task_type_keys)
    tenant = _first_str_merged(attrs, res, tenant_keys)
    agent_name = _first_str(attrs, ("gen_ai.agent.name",))
    attempt = _num(attrs, ("agentobs.attempt", "gen_ai.request.attempt"), warnings, True)
    branch = _first_str(attrs, ("agentobs.branch",))
    model = _first_str(attrs, ("gen_ai.response.model", "gen_ai.request.model", "llm.request.model"))
    provider = _first_str(attrs, ("gen_ai.provider.name", "gen_ai.system"))
    engine = _engine_of(role, scope, name, provider, service)
    addr = _first_str_merged(attrs, res, ("server.address", "agentobs.instance"))
    port = attrs.get("server.port", _MISSING)
    if port is _MISSING:
        port = res.get("server.port")
    if addr is not None and port not in (None, "") and ":" not in addr.split("]")[-1]:
        addr = f"{addr}:{port}"
    instance = addr if addr is not None else (_litellm_instance(attrs) if role == "gateway" else None)
    response_id = _first_str(attrs, ("gen_ai.response.id",))
    request_id = _first_str(attrs, ("gen_ai.request.id",))

    usage = _litellm_usage(attrs) if "metadata.usage_object" in attrs else None
    p = _num(attrs, INPUT_KEYS, warnings, True)
    c = _num(attrs, CACHED_KEYS, warnings, True)
    o = _num(attrs, OUTPUT_KEYS, warnings, True)
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
        excludes = provider in ANTHROPIC_STYLE_PROVIDERS or attrs.get("agentobs.usage.input_excludes_cache") is True
        if excludes:
            # Anthropic reports input_tokens without cache reads/writes: P must include C.
            w = _num(attrs, CACHE_WRITE_KEYS, warnings, True) or 0
            p = p + c + w
        elif c > p:
            warnings.append(
                f"cached tokens ({c}) exceed input tokens ({p}); treated as input that excludes cache (P := P + C)"
            )
            p = p + c
    system_tokens = _num(attrs, ("agentobs.prompt.system_tokens",), warnings, True)
    tool_def_tokens = _num(attrs, ("agentobs.prompt.tool_tokens",), warnings, True)

    ttft = _num(attrs, TTFT_KEYS, warnings, False)
    chunk_times = [e["time_ns"] for e in events if e.get("name") == CHUNK_EVENT and e.get("time_ns")] if events else ()
    if ttft is None and chunk_times:
        ttft = (min(chunk_times) - start_ns) / 1e9
    queue_s = _num(attrs, ("gen_ai.latency.time_in_queue",), warnings, False)
    prefill_s = _num(attrs, ("gen_ai.latency.time_in_model_prefill",), warnings, False)
    decode_s = _num(attrs, ("gen_ai.latency.time_in_model_decode",), warnings, False)
    finish_reason = _finish_reason(attrs.get("gen_ai.response.finish_reasons"))
    error_type = _first_str(attrs, ("error.type",))
    tool_name = _first_str(attrs, ("gen_ai.tool.name",))

    itl = attrs.get("agentobs.itl_ms")
    if isinstance(itl, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in itl):
        itl_ms = [float(x) for x in itl]
    elif itl is not None:
        warnings.append("attribute agentobs.itl_ms must be an array of numbers; ignored")
        itl_ms = None
    elif len(chunk_times) >= 2:
        ts = sorted(chunk_times)
        itl_ms = [(b - a) / 1e6 for a, b in zip(ts, ts[1:], strict=False)]
    else:
        itl_ms = None
    bh = attrs.get("agentobs.prompt.block_hashes")
    block_hashes = [str(x) for x in bh] if isinstance(bh, list) else None
    return (role, op, session_id, task_id, task_type, tenant, agent_name, attempt, branch, model, provider,
            engine, instance, response_id, request_id, p, c, o, system_tokens, tool_def_tokens, ttft, queue_s,
            prefill_s, decode_s, finish_reason, error_type, tool_name, itl_ms, block_hashes), warnings
