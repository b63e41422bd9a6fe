"""A stub OpenAI-compatible engine for the load generator's tests and overhead bench (not a model server).

It speaks the protocol for real (HTTP/1.1 keep-alive, JSON, Server-Sent Events with chunked transfer encoding)
and keeps a prefix cache the way vLLM reports it, so the numbers a run stores can be computed by hand:

- tokens: a word (split on whitespace) is one token, except words longer than 9 characters, which are two; a
  chat prompt is ``<bos> <user>`` + the messages' tokens + ``<gen>`` (``CHAT_OVERHEAD`` = 3 tokens);
- ``POST /tokenize`` (vLLM's form: ``prompt`` or ``messages``) → ``{"count", "tokens", "max_model_len"}``;
- ``GET /v1/models`` → the one model with its ``max_model_len``;
- ``POST /v1/traces`` → 200 and nothing kept (an OTLP/HTTP sink for the overhead bench);
- ``POST /v1/chat/completions``: cached tokens = the longest run of leading ``block_size``-token blocks stored
  before (block-floored, at most P − 1, as vLLM), then every full block of the prompt is stored; LRU with
  ``capacity_blocks`` (0 = unlimited; ``prefix_caching=False`` caches nothing); ``max_tokens`` output tokens,
  streamed one chunk per token when ``stream`` (usage in the last chunk with ``stream_options.include_usage``).

Every request is kept (``requests``: path, headers, body) when ``record`` is on.

    python -m agentobs.loadgen.stub --port 18080          # serve until Ctrl-C
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections import OrderedDict
from typing import Any

CHAT_OVERHEAD = 3


def tokens_of(text: str) -> list[str]:
    out: list[str] = []
    for w in text.split():
        if len(w) > 9:
            out += [w[:5], w[5:]]
        else:
            out.append(w)
    return out


class StubEngine:
    def __init__(self, model: str = "stub-model", block_size: int = 4, capacity_blocks: int = 0,
                 prefix_caching: bool = True, max_model_len: int = 1_000_000, record: bool = True,
                 tokenize: bool = True, delay_s: float = 0.0):
        self.model, self.block_size, self.capacity = model, block_size, capacity_blocks
        self.prefix_caching, self.max_model_len, self.record = prefix_caching, max_model_len, record
        self.tokenize, self.delay_s = tokenize, delay_s
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.requests: list[dict] = []
        self.n = 0
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- the engine ----------------------------------------------------------------------------------------
    def chat_tokens(self, messages: list[dict]) -> list[str]:
        toks = ["<bos>", "<user>"]
        for m in messages:
            toks += tokens_of(str(m.get("content") or ""))
        return toks + ["<gen>"]

    def _prefill(self, toks: list[str]) -> int:
        B = self.block_size
        n_full = len(toks) // B
        hashes, h = [], 0
        for i in range(n_full):
            h = hash((h, *toks[i * B:(i + 1) * B]))
            hashes.append(h)
        hit = 0
        if self.prefix_caching:
            for x in hashes:
                if x in self.cache:
                    self.cache.move_to_end(x)
                    hit += 1
                else:
                    break
            for x in hashes:
                self.cache[x] = None
                self.cache.move_to_end(x)
            while self.capacity and len(self.cache) > self.capacity:
                self.cache.popitem(last=False)
        return min(hit * B, ((len(toks) - 1) // B) * B)

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, object]:
        """(status, content type, payload): a dict (JSON), or a list of SSE events (streamed)."""
        doc: Any = None
        if method == "POST" and path == "/v1/traces":  # an OTLP/HTTP sink (the overhead bench exports here)
            self.spans_bytes = getattr(self, "spans_bytes", 0) + len(body)
            return 200, "application/x-protobuf", b""
        if body:
            try:
                doc = json.loads(body)
            except ValueError:
                return 400, "application/json", {"error": {"message": "body is not JSON"}}
        if self.record:
            self.requests.append({"method": method, "path": path, "headers": headers, "body": doc})
        if method == "POST" and not isinstance(doc, dict):
            return 400, "application/json", {"error": {"message": "body is not a JSON object"}}
        if method == "GET" and path == "/v1/models":
            return 200, "application/json", {"object": "list", "data": [
                {"id": self.model, "object": "model", "max_model_len": self.max_model_len}]}
        if method == "GET" and path == "/health":
            return 200, "application/json", {}
        if method == "POST" and path == "/tokenize" and self.tokenize:
            if "messages" in doc:
                toks = self.chat_tokens(doc["messages"])
            else:
                toks = tokens_of(doc.get("prompt", ""))
            return 200, "application/json", {"count": len(toks), "tokens": list(range(len(toks))),
                                              "max_model_len": self.max_model_len}
        if method == "POST" and path == "/v1/chat/completions":
            if doc.get("model") != self.model:
                return 404, "application/json", {"error": {"message": f"model {doc.get('model')!r} not found"}}
            toks = self.chat_tokens(doc.get("messages") or [])
            if len(toks) > self.max_model_len:
                return 400, "application/json", {"error": {"message": "prompt too long"}}
            cached = self._prefill(toks)
            self.n += 1
            rid = "chatcmpl-" + (headers.get("x-request-id") or f"stub-{self.n}")
            n_out = int(doc.get("max_tokens") or 16)
            usage: dict[str, object] = {"prompt_tokens": len(toks), "completion_tokens": n_out, "total_tokens": len(toks) + n_out,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            if doc.get("stream"):
                evs: list[dict[str, object]] = [{"id": rid, "object": "chat.completion.chunk", "model": self.model,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
                for i in range(n_out):
                    evs.append({"id": rid, "object": "chat.completion.chunk", "model": self.model,
                                "choices": [{"index": 0, "delta": {"content": f"t{i} "},
                                             "finish_reason": "length" if i == n_out - 1 else None}]})
                if (doc.get("stream_options") or {}).get("include_usage"):
                    evs.append({"id": rid, "object": "chat.completion.chunk", "model": self.model, "choices": [],
                                "usage": usage})
                return 200, "text/event-stream", evs
            return 200, "application/json", {
                "id": rid, "object": "chat.completion", "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": " ".join(
                    f"t{i}" for i in range(n_out))}, "finish_reason": "length"}], "usage": usage}
        return 404, "application/json", {"error": {"message": f"no route {method} {path}"}}

    # -- HTTP ------------------------------------------------------------------------------------------------
    async def _serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length") or 0)
                body = await reader.readexactly(n) if n else b""
                if self.delay_s and path.startswith("/v1/chat/"):  # a model's time; the rest answers at once
                    await asyncio.sleep(self.delay_s)
                status, ctype, payload = self.handle(method, path.split("?")[0], headers, body)
                reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
                if isinstance(payload, list):
                    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nTransfer-Encoding: chunked\r\n"
                            "Connection: keep-alive\r\n\r\n").encode()
                    parts = [head]
                    for ev in payload:
                        data = b"data: " + json.dumps(ev).encode() + b"\n\n"
                        parts.append(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    done = b"data: [DONE]\n\n"
                    parts.append(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
                    writer.write(b"".join(parts))
                else:
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    writer.write((f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: "
                                  f"{len(data)}\r\nConnection: keep-alive\r\n\r\n").encode() + data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            try:
                writer.close()
            except RuntimeError:  # the loop is closing
                pass

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve_conn, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    def start(self, host: str = "127.0.0.1", port: int = 0) -> StubEngine:
        """Serve from a background thread (tests); ``url`` is then set."""
        ready = threading.Event()

        def main():
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.serve(host, port))
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, name="stub-engine", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._loop is None:
            return
        loop = self._loop

        async def _close():
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(_close(), loop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        self._loop = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="stub OpenAI-compatible engine (tests, bench)")
    ap.add_argument("--port", type=int, default=18080)
    ap.add_argument("--model", default="stub-model")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--capacity-blocks", type=int, default=0)
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args(argv)
    eng = StubEngine(a.model, a.block_size, a.capacity_blocks, record=not a.no_record)

    async def run():
        await eng.serve("127.0.0.1", a.port)
        print(f"stub engine on {eng.url}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
