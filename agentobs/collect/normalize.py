"""Attribute normalization: the aliases of DESIGN.md resolved into promoted span columns.

One function, ``promote``, turns a decoded span (name, kind, scope, resource and attribute dicts,
events) into the typed columns of the ``spans`` table (``promote_row``: the same as a tuple, the
form the decoders use; docs/collectors.md, Performance, says why it is written the way it is). First match wins in every alias list.
Problems that do not make the span unusable (a token count that is not a number, a latency that is
NaN or infinite) are returned as warnings and the value is stored as unknown (NULL), never as 0. A value
that is a number but a wrong one rejects the span (ValueError, with the reason): a token count that is
negative, not whole (12.5, NaN, infinite) or beyond int64, an attempt outside 0..2^31-1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..config import Settings
from ..conventions import (
    ADDR_KEYS,
    ATTEMPT_KEYS,
    CACHE_WRITE_KEYS,
    CACHED_KEYS,
    HTTP_STATUS_KEYS,
    INPUT_EXCLUDES_CACHE,
    INPUT_KEYS,
    MODEL_KEYS,
    OUTPUT_KEYS,
    PROVIDER_KEYS,
    STREAM_KEYS,
    TTFT_KEYS,
)

CALL_OPS = {"chat", "text_completion", "generate_content", "completion", "responses"}
AGENT_OPS = {"invoke_agent", "create_agent", "invoke_workflow"}
CHUNK_EVENT = "gen_ai.content.completion.chunk"

# span events that record an exception (OTel's record_exception; the GenAI client exception event)
EXCEPTION_EVENTS = ("exception", "gen_ai.client.operation.exception")
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


INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


def bad(reason: str, message: str) -> ValueError:
    """The ValueError that rejects a span, with the ``reason`` its health counter is labelled with
    (``agentobs_otlp_spans_rejected_total{reason=...}``; docs/collectors.md lists them)."""
    e = ValueError(message)
    e.reason = reason  # type: ignore[attr-defined]
    return e


def _num(attrs: dict[str, Any], keys: Sequence[str], warnings: list[str]) -> float | None:
    """The first of ``keys`` present as a float; not a number, NaN or infinite: a warning and None."""
    for k in keys:
        if k not in attrs:
            continue
        v = attrs[k]
        if isinstance(v, bool) or v is None:
            warnings.append(f"attribute {k} must be a number, got {v!r}; stored as unknown")
            return None
        if isinstance(v, (int, float, str)):
            try:
                f = float(v)
            except (ValueError, OverflowError):
                warnings.append(f"attribute {k} must be a number, got {v!r}; stored as unknown")
                return None
            if not math.isfinite(f):
                warnings.append(f"attribute {k} must be a finite number, got {v!r}; stored as unknown")
                return None
            return f
        warnings.append(f"attribute {k} must be a number, got {type(v).__name__}; stored as unknown")
        return None
    return None


def whole(v: Any, what: str, hi: int = INT64_MAX) -> int:
    """``v`` (an int, or a float or text holding one) as an int in 0..hi; ValueError naming ``what`` when it
    is negative, not whole (12.5, NaN, infinite) or above ``hi``."""
    if v.__class__ is int:
        n = v
    elif isinstance(v, float):
        if not v.is_integer():  # NaN and ±inf too
            raise bad("invalid_count", f"{what} {v!r} is not a whole number")
        n = int(v)
    else:
        try:
            n = int(v)
        except ValueError:
            f = float(v)  # ValueError: the caller's "not a number" case
            if not f.is_integer():
                raise bad("invalid_count", f"{what} {v!r} is not a whole number") from None
            n = int(f)
    if n < 0:
        raise bad("invalid_count", f"{what} {v!r} is negative")
    if n > hi:
        raise bad("invalid_count", f"{what} {v!r} is above {hi}")
    return n


def _count(attrs: dict[str, Any], keys: Sequence[str], warnings: list[str], hi: int = INT64_MAX) -> int | None:
    """The first of ``keys`` present as a count (tokens, attempts): not a number is a warning and None (unknown);
    a number that is no count (negative, not whole, above ``hi``) is a ValueError: the span is rejected."""
    for k in keys:
        if k not in attrs:
            continue
        v = attrs[k]
        if v.__class__ is int and 0 <= v <= hi:
            return v
        if isinstance(v, bool) or v is None or not isinstance(v, (int, float, str)):
            got = repr(v) if isinstance(v, bool) or v is None else type(v).__name__
            warnings.append(f"attribute {k} must be a number, got {got}; stored as unknown")
            return None
        if isinstance(v, str):
            try:
                float(v)
            except ValueError:
                warnings.append(f"attribute {k} must be a number, got {v!r}; stored as unknown")
                return None
        return whole(v, f"attribute {k}", hi)
    return None


def _litellm_usage(attrs: dict[str, Any]) -> dict[str, Any]:
    """LiteLLM's legacy callback stringifies usage into ``metadata.usage_object``."""
    return _litellm_dict(attrs, "metadata.usage_object")


def _dict_value(d: dict[str, Any], key: str) -> str | None:
    """``key`` of a dict LiteLLM stringified: the key itself, a ``metadata.<k>`` alias as ``<k>`` (the dict is the
    request's metadata), an ``http.request.header.<h>`` alias as ``headers[<h>]``; a non-empty scalar only."""
    v = d.get(key)
    if v is None and key.startswith("metadata."):
        v = d.get(key[9:])
    if v is None and key.startswith("http.request.header."):
        h = d.get("headers")
        v = h.get(key[20:]) if isinstance(h, dict) else None
    if isinstance(v, list):
        v = v[0] if v else None
    if v is None or v == "" or isinstance(v, (dict, list, tuple, set, bool)):
        return None
    return str(v)


def _litellm_ids(attrs: dict[str, Any], session_keys: Sequence[str], task_keys: Sequence[str],
                 usage: dict[str, Any] | None = None) -> tuple[str | None, str | None]:
    """(session, task) from LiteLLM's stringified ``metadata.requester_metadata`` and ``metadata.usage_object``
    dicts (in that order): the first of the settings' keys present, then the plain ``session_id`` / ``task_id``.
    LiteLLM's proxy keeps the caller's session (``x-litellm-session-id`` / ``litellm_session_id`` /
    ``metadata.session_id``) and metadata only there."""
    dicts = [_litellm_dict(attrs, "metadata.requester_metadata")]
    dicts.append(usage if usage is not None else _litellm_dict(attrs, "metadata.usage_object"))
    out: list[str | None] = []
    for keys, plain in ((session_keys, "session_id"), (task_keys, "task_id")):
        found = None
        for d in dicts:
            if not d:
                continue
            for k in (*keys, plain):
                found = _dict_value(d, k)
                if found is not None:
                    break
            if found is not None:
                break
        out.append(found)
    return out[0], out[1]


def _flag(v: Any) -> bool | None:
    """A boolean attribute as instrumentations send it: a bool, or the strings true/false (LiteLLM: "True")."""
    if isinstance(v, list):
        v = v[0] if v else None
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("true", "false"):
            return s == "true"
    return None


def _streamed(attrs: dict[str, Any]) -> bool | None:
    """Whether the call was streamed, from the first stream attribute present; None when none says."""
    for k in STREAM_KEYS:
        if k in attrs:
            return _flag(attrs[k])
    return None


def _http_error(attrs: dict[str, Any]) -> str | None:
    """The HTTP status code of the first status attribute present, when it is an error (>= 400)."""
    for k in HTTP_STATUS_KEYS:
        if k not in attrs:
            continue
        v = attrs[k]
        if isinstance(v, list):
            v = v[0] if v else None
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            return None
        try:
            code = float(v)
        except ValueError:
            return None
        return str(int(code)) if 400 <= code < 1000 else None
    return None


def _exception_type(events: list[dict[str, Any]]) -> str | None:
    """``exception.type`` of the first exception event ('exception' when it names none)."""
    for e in events:
        if e.get("name") in EXCEPTION_EVENTS:
            a = e.get("attributes")
            t = a.get("exception.type") if isinstance(a, dict) else None
            return str(t) if t not in (None, "") and not isinstance(t, (dict, list)) else "exception"
    return None


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


_PLANS: dict[tuple, tuple] = {}


def _plan(keys: tuple[tuple[str, ...], ...]) -> tuple[frozenset[str], ...]:
    """The alias lists of several keys as sets, and all of them in one set, built once per ``keys``."""
    plan = _PLANS.get(keys)
    if plan is None:
        groups = [frozenset(g) for g in (*keys, ATTEMPT_KEYS, MODEL_KEYS, PROVIDER_KEYS, ADDR_KEYS, INPUT_KEYS,
                                         CACHED_KEYS, OUTPUT_KEYS, TTFT_KEYS)]
        plan = _PLANS[keys] = (frozenset().union(*groups), *groups)
    return plan


def _str1(v: Any) -> str | None:
    """``_first_str`` of one looked-up value."""
    if isinstance(v, list):
        v = v[0] if v else None
    if v is None or v == "":
        return None
    return str(v)


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

    The hot path of ingest, so: one set intersection finds which alias lists have a key present at
    all (the others are skipped), the resource's attributes are looked up behind the span's (no
    merged dict), single keys are read inline, absent LiteLLM attributes are not parsed."""
    warnings: list[str] = []
    role, op = classify(name, kind, scope, attrs)
    (want, g_session, g_task, g_task_type, g_tenant, g_attempt, g_model, g_provider, g_addr, g_input, g_cached,
     g_output, g_ttft) = _plan(keys)
    session_keys, task_keys, task_type_keys, tenant_keys = keys
    res = resource or {}
    present = want.intersection(attrs)
    if res:
        present_r = want.intersection(res)
        present_any = present | present_r
    else:
        present_any = present
    get = attrs.get

    session_id = _first_str_merged(attrs, res, session_keys) if not g_session.isdisjoint(present_any) else None
    task_id = _first_str_merged(attrs, res, task_keys) if not g_task.isdisjoint(present_any) else None
    usage = _litellm_usage(attrs) if "metadata.usage_object" in attrs else None
    if (session_id is None or task_id is None) and ("metadata.requester_metadata" in attrs or usage):
        s2, t2 = _litellm_ids(attrs, session_keys, task_keys, usage or {})
        session_id = session_id if session_id is not None else s2
        task_id = task_id if task_id is not None else t2
    task_type = _first_str_merged(attrs, res, task_type_keys) if not g_task_type.isdisjoint(present_any) else None
    tenant = _first_str_merged(attrs, res, tenant_keys) if not g_tenant.isdisjoint(present_any) else None
    v = get("gen_ai.agent.name")
    agent_name = v if v.__class__ is str and v else (None if v is None else _str1(v))
    attempt = _count(attrs, ATTEMPT_KEYS, warnings, INT32_MAX) if not g_attempt.isdisjoint(present) else None
    v = get("agentobs.branch")
    branch = v if v.__class__ is str and v else (None if v is None else _str1(v))
    model = _first_str(attrs, MODEL_KEYS) if not g_model.isdisjoint(present) else None
    provider = _first_str(attrs, PROVIDER_KEYS) if not g_provider.isdisjoint(present) else None
    engine = _engine_of(role, scope, name, provider, service)
    addr = _first_str_merged(attrs, res, ADDR_KEYS) if not g_addr.isdisjoint(present_any) else None
    port = get("server.port", _MISSING)
    if port is _MISSING:
        port = res.get("server.port")
    if addr is not None and port not in (None, "") and ":" not in addr.split("]")[-1]:
        addr = f"{addr}:{port}"
    instance = addr if addr is not None else (_litellm_instance(attrs) if role == "gateway" else None)
    v = get("gen_ai.response.id")
    response_id = v if v.__class__ is str and v else (None if v is None else _str1(v))
    v = get("gen_ai.request.id")
    request_id = v if v.__class__ is str and v else (None if v is None else _str1(v))

    p = _count(attrs, INPUT_KEYS, warnings) if not g_input.isdisjoint(present) else None
    c = _count(attrs, CACHED_KEYS, warnings) if not g_cached.isdisjoint(present) else None
    o = _count(attrs, OUTPUT_KEYS, warnings) if not g_output.isdisjoint(present) else None
    if usage:
        if p is None and isinstance(usage.get("prompt_tokens"), int):
            p = whole(usage["prompt_tokens"], "metadata.usage_object prompt_tokens")
        if o is None and isinstance(usage.get("completion_tokens"), int):
            o = whole(usage["completion_tokens"], "metadata.usage_object completion_tokens")
        if c is None:
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                c = whole(details["cached_tokens"], "metadata.usage_object cached_tokens")
            elif isinstance(usage.get("cache_read_input_tokens"), int):
                c = whole(usage["cache_read_input_tokens"], "metadata.usage_object cache_read_input_tokens")
    if p is not None and c is not None:
        excl = attrs.get(INPUT_EXCLUDES_CACHE, res.get(INPUT_EXCLUDES_CACHE) if res else None)
        if _flag(excl) is True or c > p:
            # input_tokens without cache reads/writes (Anthropic's own usage, declared by the flag; or evident: C > P):
            # P must include C and the cache writes
            if _flag(excl) is not True:
                warnings.append(f"cached tokens ({c}) exceed input tokens ({p}); treated as input that excludes "
                                "cache (P := P + cache reads + cache writes)")
            p = p + c + (_count(attrs, CACHE_WRITE_KEYS, warnings) or 0)
            if p > INT64_MAX:
                raise bad("invalid_count", f"input tokens with cache reads and writes ({p}) are above {INT64_MAX}")
    system_tokens = _count(attrs, ("agentobs.prompt.system_tokens",), warnings) \
        if "agentobs.prompt.system_tokens" in attrs else None
    tool_def_tokens = _count(attrs, ("agentobs.prompt.tool_tokens",), warnings) \
        if "agentobs.prompt.tool_tokens" in attrs else None

    ttft = _num(attrs, TTFT_KEYS, warnings) if not g_ttft.isdisjoint(present) else None
    chunk_times = [e["time_ns"] for e in events if e.get("name") == CHUNK_EVENT and e.get("time_ns")] if events else ()
    if ttft is None and chunk_times:
        ttft = (min(chunk_times) - start_ns) / 1e9
    if ttft is not None and role != "engine" and _streamed(attrs) is False:
        ttft = None  # not streamed: the first (only) chunk came at the end, so this is the whole latency, not TTFT
    queue_s = prefill_s = decode_s = None
    if "gen_ai.latency.time_in_queue" in attrs:
        queue_s = _num(attrs, ("gen_ai.latency.time_in_queue",), warnings)
    if "gen_ai.latency.time_in_model_prefill" in attrs:
        prefill_s = _num(attrs, ("gen_ai.latency.time_in_model_prefill",), warnings)
    if "gen_ai.latency.time_in_model_decode" in attrs:
        decode_s = _num(attrs, ("gen_ai.latency.time_in_model_decode",), warnings)
    v = get("gen_ai.response.finish_reasons")
    finish_reason = None if v is None else _finish_reason(v)
    v = get("error.type")
    error_type = v if v.__class__ is str and v else (None if v is None else _str1(v))
    if error_type is None:
        error_type = _http_error(attrs) if "http.response.status_code" in attrs or "http.status_code" in attrs \
            else None
        if error_type is None and events:
            error_type = _exception_type(events)
    v = get("gen_ai.tool.name")
    tool_name = v if v.__class__ is str and v else (None if v is None else _str1(v))

    itl = get("agentobs.itl_ms")
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
    bh = get("agentobs.prompt.block_hashes")
    block_hashes = [str(x) for x in bh] if isinstance(bh, list) else None
    return (role, op, session_id, task_id, task_type, tenant, agent_name, attempt, branch, model, provider,
            engine, instance, response_id, request_id, p, c, o, system_tokens, tool_def_tokens, ttft, queue_s,
            prefill_s, decode_s, finish_reason, error_type, tool_name, itl_ms, block_hashes), warnings
