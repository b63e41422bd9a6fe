#!/usr/bin/env python3
"""Agent workload driver for the real-vLLM end-to-end check (scripts/vllm/e2e.py).

Several concurrent agent sessions talk to an OpenAI-compatible endpoint (vLLM directly, or a
gateway such as the LiteLLM proxy) and trace themselves with the REAL OpenTelemetry SDK, exported
over OTLP to ``agentobs collect``:

* one ``invoke_agent <agent>`` root span per task (INTERNAL; ``gen_ai.conversation.id`` = the
  session, ``app.task.id``, ``agentobs.task.type``, ``gen_ai.agent.name``);
* one ``chat <model>`` CLIENT span per model call (GenAI semconv): ``gen_ai.conversation.id``,
  ``app.task.id``, ``agentobs.attempt``, ``server.address``/``server.port`` of the engine replica,
  ``gen_ai.usage.input_tokens`` / ``gen_ai.usage.cache_read.input_tokens`` (from
  ``usage.prompt_tokens_details.cached_tokens``) / ``gen_ai.usage.output_tokens``,
  ``gen_ai.response.id``, and when streaming ``gen_ai.response.time_to_first_chunk`` and the
  per-chunk gaps as ``agentobs.itl_ms``;
* one ``execute_tool <tool>`` span (INTERNAL) for every tool gap between turns.

Every request carries the W3C ``traceparent`` of the current span (so vLLM's ``llm_request`` span
becomes the child of the ``chat`` span), ``X-Request-Id: <session>-t<turn>-a<attempt>`` and
``session_id`` in the body (vLLM tags its KV ``BlockStored`` events with it).

Workload shape: prompts grow every turn (assistant reply + a JSON-lines tool result + a user
nudge), tool gaps cycle through ``--gaps``, a few turns are retried (attempt 1 is rejected by the
agent as invalid output, attempt 2 resends the same messages), one session compacts its context
(the history is replaced by a summary: the prompt shrinks), streaming alternates by session+turn.

With ``--no-chat-spans`` (a gateway traces the calls instead) the driver emits only the agent and
tool spans and injects the ``invoke_agent`` context; ``--litellm`` adds LiteLLM's session fields
(``litellm_session_id`` in the body, ``x-litellm-session-id`` header).

Every call is also written to ``--out`` (JSON lines: ids, usage exactly as returned, times) so the
checks can compare DuckDB with what the engine answered. Only loopback targets are accepted.

Run with the repo venv: ``.venv/bin/python scripts/vllm/agent_driver.py --help``.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import random
import sys
import threading
import time
from urllib.parse import urlparse

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOOLS = ("read_file", "grep", "run_tests", "edit_file")
_WORDS = (
    "the agent calls a tool and reads the result then plans the next step with context "
    "from previous turns user assistant system function file search query cache block "
    "token request session trace span metric latency prefix evict memory model server "
    "error retry status ok json value list number name path line code test build run"
).split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _tool_result(rng: random.Random, n_words: int) -> str:
    rows: list[str] = []
    while sum(len(r.split()) for r in rows) < n_words:
        rows.append(json.dumps({"path": "/".join(rng.choice(_WORDS) for _ in range(3)),
                                "line": rng.randint(1, 999), "text": _text(rng, 8)}))
    return "\n".join(rows)


def _pairs(spec: str) -> set[tuple[int, int]]:
    """'1:2,3:4' -> {(1, 2), (3, 4)} (session:turn)."""
    out = set()
    for part in spec.split(","):
        if part.strip():
            s, t = part.split(":")
            out.add((int(s), int(t)))
    return out


def make_tracer(endpoint: str, protocol: str, service: str):
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    return provider, provider.get_tracer("agentobs.scripts.agent_driver")


class Chat:
    """One OpenAI chat completion over http.client (streamed or not); chunk arrival times kept."""

    def __init__(self, base_url: str, timeout: float = 300.0):
        u = urlparse(base_url)
        if u.hostname not in LOOPBACK:
            raise SystemExit(f"refusing non-loopback target {u.hostname}")
        self.host, self.port = u.hostname, u.port or 80
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout

    def __call__(self, body: dict, headers: dict) -> dict:
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        rec: dict = {"stream": bool(body.get("stream"))}
        t_send = time.time()
        t0 = time.perf_counter()
        try:
            c.request("POST", self.prefix + "/v1/chat/completions", body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json", **headers})
            r = c.getresponse()
            rec["status"] = r.status
            rec["response_headers"] = {k.lower(): v for k, v in r.getheaders()}
            chunks: list[float] = []
            content: list[str] = []
            usage = resp_id = finish = None
            if r.status != 200:
                rec["error_body"] = r.read().decode("utf-8", "replace")[:600]
            elif body.get("stream"):
                for line in iter(r.readline, b""):
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    now = time.perf_counter() - t0
                    if data == b"[DONE]":
                        break
                    ev = json.loads(data)
                    resp_id = resp_id or ev.get("id")
                    if ev.get("usage"):
                        usage = ev["usage"]
                    for ch in ev.get("choices") or []:
                        delta = ch.get("delta") or {}
                        if delta.get("content"):
                            content.append(delta["content"])
                            chunks.append(now)
                        finish = ch.get("finish_reason") or finish
            else:
                resp = json.loads(r.read())
                resp_id, usage = resp.get("id"), resp.get("usage")
                ch = (resp.get("choices") or [{}])[0]
                content.append((ch.get("message") or {}).get("content") or "")
                finish = ch.get("finish_reason")
        finally:
            c.close()
        rec.update(t_send=t_send, latency_s=time.perf_counter() - t0, response_id=resp_id, usage=usage,
                   finish_reason=finish, chunk_arrival_s=chunks, content="".join(content))
        return rec


def post_json(base_url: str, path: str, body: dict, timeout: float = 60.0) -> dict:
    """POST a JSON body to a loopback server and return its JSON answer (vLLM's /tokenize)."""
    u = urlparse(base_url)
    if u.hostname not in LOOPBACK:
        raise SystemExit(f"refusing non-loopback target {u.hostname}")
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"POST {path}: HTTP {r.status}: {data[:300]!r}")
        return json.loads(data)
    finally:
        c.close()


def word_token_ids(engine_url: str, model: str) -> list[int]:
    """The token ids of the driver's words as the model writes them after a space (" the", " agent", ...), each a
    single token of the tokenizer. A reply made of these re-renders, in the next prompt, to exactly the token ids
    the engine generated — as a trained model's text does, and a random model's arbitrary tokens mostly do not
    (the byte-level BPE merges them differently) — so the block that decoding filled is reusable by the next turn."""
    ids: set[int] = set()
    for w in sorted(set(_WORDS)):
        toks = post_json(engine_url, "/tokenize", {"model": model, "prompt": " " + w,
                                                   "add_special_tokens": False})["tokens"]
        if len(toks) == 1:
            ids.add(toks[0])
    if not ids:
        raise RuntimeError("no word of the driver's vocabulary is a single token of the model's tokenizer")
    return sorted(ids)


def prompt_block_hashes(engine_url: str, model: str, messages: list[dict], block_size: int) -> tuple[int, list[str]]:
    """What a gateway that reports ``agentobs.prompt.block_hashes`` sends: the prompt's token ids (the engine's own
    chat rendering, vLLM ``/tokenize``) cut into full blocks of ``block_size``, each hashed with its predecessor
    (a chain: equal hashes = equal prefixes). Our own hash function, not vLLM's: agentobs compares a session's
    prompts with each other, never with the engine's KV-event hashes. Returns (prompt tokens, hashes)."""
    toks = post_json(engine_url, "/tokenize", {"model": model, "messages": messages,
                                               "add_generation_prompt": True})["tokens"]
    out, parent = [], b""
    for i in range(len(toks) // block_size):
        blk = toks[i * block_size:(i + 1) * block_size]
        parent = hashlib.sha256(parent + json.dumps(blk).encode()).digest()
        out.append(parent[:8].hex())
    return len(toks), out


def run_session(k: int, a, tracer, chat: Chat, sink, lock: threading.Lock) -> None:
    rng = random.Random(a.seed * 1000 + k)
    sid = f"{a.session_prefix}{k}"
    task_id = f"task-{sid}"
    gaps = [float(x) for x in a.gaps.split(",")]
    retries, compactions = _pairs(a.retry_at), _pairs(a.compact_at)
    system = f"You are coding agent {k}. " + _text(rng, a.system_words)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Task: " + _text(rng, 40)}]
    host, _, port = a.engine_address.rpartition(":")
    root_attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "coder",
                  "gen_ai.conversation.id": sid, "app.task.id": task_id, "agentobs.task.type": "coding"}
    time.sleep(k * a.stagger_s)
    with tracer.start_as_current_span("invoke_agent coder", kind=SpanKind.INTERNAL, attributes=root_attrs):
        for turn in range(a.turns):
            compacted = (k, turn) in compactions
            if compacted:  # context compaction: history -> a summary, the prompt shrinks
                messages = [messages[0], {"role": "user", "content": "Summary of the work so far: " + _text(rng, 60)},
                            messages[-1]]
            attempts = 2 if (k, turn) in retries else 1
            stream = (k + turn) % 2 == 0
            for attempt in range(1, attempts + 1):
                rid = f"{sid}-t{turn}-a{attempt}"
                body = {"model": a.model, "messages": messages, "max_tokens": a.max_tokens,
                        "temperature": 0.8, "top_p": 0.95, "session_id": sid}
                if a.allowed_token_ids:
                    body["allowed_token_ids"] = a.allowed_token_ids
                hashes: list[str] | None = None
                if a.block_hashes:
                    n_tok, hashes = prompt_block_hashes(f"http://{a.engine_address}", a.model, messages, a.block_hashes)
                headers = {"X-Request-Id": rid}
                if a.litellm:
                    body["litellm_session_id"] = sid
                    headers["x-litellm-session-id"] = sid
                if stream:
                    body["stream"] = True
                    body["stream_options"] = {"include_usage": True}
                rejected = attempt < attempts  # the agent rejects attempt 1 of a retried turn
                if a.chat_spans:
                    span_cm = tracer.start_as_current_span(f"chat {a.model}", kind=SpanKind.CLIENT, attributes={
                        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
                        "gen_ai.request.model": a.model, "gen_ai.conversation.id": sid, "app.task.id": task_id,
                        "agentobs.attempt": attempt, "server.address": host, "server.port": int(port),
                        "gen_ai.request.max_tokens": a.max_tokens, "gen_ai.request.temperature": 0.8,
                        "gen_ai.request.top_p": 0.95, "gen_ai.request.stream": stream,
                        **({"gen_ai.conversation.compacted": True} if compacted else {}),
                        **({"agentobs.prompt.block_hashes": hashes} if hashes is not None else {}),
                    })
                else:
                    span_cm = _Null()
                with span_cm as span:
                    propagate.inject(headers)
                    rec = chat(body, headers)
                    u = rec.get("usage") or {}
                    details = u.get("prompt_tokens_details") or {}
                    ctx = trace.get_current_span().get_span_context()
                    if span is not None:
                        if rec["status"] == 200 and u:
                            span.set_attribute("gen_ai.usage.input_tokens", u["prompt_tokens"])
                            span.set_attribute("gen_ai.usage.output_tokens", u["completion_tokens"])
                            if "cached_tokens" in details and details["cached_tokens"] is not None:
                                span.set_attribute("gen_ai.usage.cache_read.input_tokens", details["cached_tokens"])
                        if rec.get("response_id"):
                            span.set_attribute("gen_ai.response.id", rec["response_id"])
                            span.set_attribute("gen_ai.response.model", a.model)
                        if rec.get("finish_reason"):
                            span.set_attribute("gen_ai.response.finish_reasons", [rec["finish_reason"]])
                        ch = rec["chunk_arrival_s"]
                        if stream and ch:
                            span.set_attribute("gen_ai.response.time_to_first_chunk", ch[0])
                            span.set_attribute("agentobs.itl_ms", [round((b - x) * 1000, 3) for x, b in zip(ch, ch[1:], strict=False)])
                        if rec["status"] != 200:
                            span.set_status(Status(StatusCode.ERROR, f"HTTP {rec['status']}"))
                            span.set_attribute("error.type", str(rec["status"]))
                        elif rejected:
                            span.set_status(Status(StatusCode.ERROR, "tool call did not parse"))
                            span.set_attribute("error.type", "invalid_output")
                rec.update(session_id=sid, task_id=task_id, turn=turn, attempt=attempt, request_id=rid,
                           rejected=rejected, compacted=compacted, trace_id=f"{ctx.trace_id:032x}",
                           span_id=f"{ctx.span_id:016x}" if a.chat_spans else None,
                           t_end=rec["t_send"] + rec["latency_s"], prompt_chars=sum(len(m["content"]) for m in messages))
                if hashes is not None:  # the tokenized prompt must be the one the engine served (= usage P)
                    rec.update(tokenized_prompt_tokens=n_tok, prompt_block_hashes=hashes)
                content = rec.pop("content")
                with lock:
                    sink.write(json.dumps(rec) + "\n")
                    sink.flush()
                cached = details.get("cached_tokens")
                print(f"[driver] {rid} stream={stream} status={rec['status']} prompt={u.get('prompt_tokens')} "
                      f"cached={cached} out={u.get('completion_tokens')} {rec['latency_s']:.2f}s", file=sys.stderr)
                if rec["status"] != 200:
                    return
            # the tool gap before the next turn
            tool = TOOLS[(k + turn) % len(TOOLS)]
            with tracer.start_as_current_span(f"execute_tool {tool}", kind=SpanKind.INTERNAL, attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                    "gen_ai.conversation.id": sid, "app.task.id": task_id}):
                time.sleep(gaps[(k + turn) % len(gaps)])
            messages.append({"role": "assistant", "content": content or "(empty)"})
            messages.append({"role": "tool", "content": _tool_result(rng, a.tool_words)})
            messages.append({"role": "user", "content": "Continue: " + _text(rng, 12)})


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="agent workload with real OpenTelemetry spans")
    ap.add_argument("--base-url", default="http://127.0.0.1:18000", help="OpenAI-compatible server (loopback)")
    ap.add_argument("--engine-address", default="127.0.0.1:18000",
                    help="server.address:server.port put on chat spans (the engine replica)")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--otlp", default="http://127.0.0.1:14318/v1/traces", help="OTLP endpoint of agentobs collect")
    ap.add_argument("--otlp-protocol", choices=("http", "grpc"), default="http")
    ap.add_argument("--service", default="agent-driver")
    ap.add_argument("--out", required=True, help="responses JSONL")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--session-prefix", default="sess-")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--system-words", type=int, default=400)
    ap.add_argument("--tool-words", type=int, default=100)
    ap.add_argument("--gaps", default="0.3,1.5,0.5,2.5,0.3,5.5", help="tool gap seconds, cycled by session+turn")
    ap.add_argument("--stagger-s", type=float, default=0.3)
    ap.add_argument("--retry-at", default="1:2,3:4", help="session:turn pairs retried (attempt 2)")
    ap.add_argument("--compact-at", default="2:4", help="session:turn pairs whose context is compacted first")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-chat-spans", dest="chat_spans", action="store_false",
                    help="a gateway traces the calls; emit only agent and tool spans")
    ap.add_argument("--litellm", action="store_true", help="send LiteLLM's session fields")
    ap.add_argument("--word-tokens", action="store_true",
                    help="replies only from the single-token words of the driver's vocabulary (allowed_token_ids, "
                         "ids from the engine's /tokenize): the next prompt re-renders them to the same token ids")
    ap.add_argument("--block-hashes", type=int, default=0, metavar="B",
                    help="put agentobs.prompt.block_hashes (blocks of B tokens of the prompt as the engine tokenizes "
                         "it, /tokenize) on chat spans: agentobs's exact mode; 0 = off")
    a = ap.parse_args(argv)
    if urlparse(a.otlp).hostname not in LOOPBACK:
        raise SystemExit("--otlp must be a loopback address")
    if urlparse(f"http://{a.engine_address}").hostname not in LOOPBACK:
        raise SystemExit("--engine-address must be a loopback address")
    a.allowed_token_ids = word_token_ids(f"http://{a.engine_address}", a.model) if a.word_tokens else None
    provider, tracer = make_tracer(a.otlp, a.otlp_protocol, a.service)
    chat = Chat(a.base_url)
    lock = threading.Lock()
    t0 = time.time()
    with open(a.out, "a", encoding="utf-8") as sink:
        threads = [threading.Thread(target=run_session, args=(k, a, tracer, chat, sink, lock), name=f"session-{k}")
                   for k in range(a.sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    provider.force_flush()
    provider.shutdown()
    print(f"[driver] done in {time.time() - t0:.1f}s; spans flushed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
