"""OTLP/HTTP trace receiver: ``POST /v1/traces`` (protobuf or JSON, optional gzip).

A threaded stdlib HTTP/1.1 server with keep-alive: each export is one request, so at 512 spans per
batch 100k spans/s is ~200 requests/s. A request is answered once its (decompressed) body is durable
in the spool (receiver.py); decoding and storing happen later, in the loader.

Answers follow the OTLP/HTTP spec: 200 with ``ExportTraceServiceResponse`` once spooled (with
``partial_success`` for spans whose ids, times, kind or status code are invalid: ``receiver.scan_spans``), 400 with a ``google.rpc.Status`` for an undecodable payload, 429/503 with
``Retry-After`` when overloaded/unavailable, 401 without the configured bearer token, 413 over the
size limit, 415 for another content type or encoding. The body of every answer uses the request's
content type (protobuf or JSON).

Bounded (docs/collectors.md, "Limits"): the Content-Length, the bearer token, the path and the content
type are checked before the body is read; a body that is not read is discarded when small, else the
connection is closed. The body then needs room in the shared ``ByteBudget`` (else 429). gzip inflates
to at most the body limit. At most ``max_connections`` connections (threads): at the cap the longest-idle
keep-alive connection is closed for the new one, else the new one waits in the listen backlog
(``backlog``). A reaper closes connections idle for ``idle_timeout_s`` and requests whose head and body
take longer than ``read_timeout_s`` to arrive.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from ..errors import InputError
from . import otlp
from .limits import ByteBudget, bearer_ok
from .receiver import Ingest, scan_json_spans, scan_spans

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_GRPC_CODE = {400: 3, 401: 16, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 429: 8, 503: 14}
DRAIN_MAX = 64 * 1024  # a refused body up to this size is read and dropped (the connection stays open)


def gunzip(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise InputError(f"body is not valid gzip ({e})", "Content-Encoding: gzip") from None
    if len(out) > limit or d.unconsumed_tail:
        raise OverflowError(f"decompressed body exceeds {limit} bytes")
    if not d.eof:
        raise InputError("gzip body is truncated", "Content-Encoding: gzip")
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "agentobs-otlp"
    server: _Server
    ingest: Ingest
    token: str | None
    max_body: int

    def log_message(self, format, *args):  # noqa: A002 - silence per-request logging
        pass

    def setup(self):
        super().setup()
        self.server.track(self)

    def finish(self):
        self.server.untrack(self)
        try:
            super().finish()
        except OSError:  # the reaper shut the socket down
            pass

    def handle_one_request(self):
        # wait for the next request's first byte under the idle deadline, then its head and body under the read one
        self.server.phase(self, "idle")
        try:
            first = self.rfile.peek(1)[:1]
        except (OSError, ValueError):
            first = b""
        if not first:
            self.close_connection = True
            return
        self.server.phase(self, "reading")
        super().handle_one_request()

    def _reply(self, code: int, body: bytes, ctype: str, retry_after: float | None = None, close: bool = False):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", str(max(1, math.ceil(retry_after))))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str, ctype: str, retry_after: float | None = None, close: bool = False):
        if ctype == JSON:
            body = json.dumps({"code": _GRPC_CODE.get(code, 2), "message": message}).encode()
        else:
            ctype = PROTOBUF
            body = status_pb2.Status(code=_GRPC_CODE.get(code, 2), message=message).SerializeToString()
        self._reply(code, body, ctype, retry_after, close)

    def _refuse(self, n: int, code: int, message: str, ctype: str, retry_after: float | None = None,
                drain: int = DRAIN_MAX):
        """Answer without keeping the body: up to ``drain`` bytes are read and dropped in 64 KiB pieces (the
        client sees the answer, the connection stays open), a larger body is left unread and the
        connection closed."""
        if n <= drain:
            left = n
            while left:
                got = self.rfile.read(min(left, DRAIN_MAX))
                if not got:
                    break
                left -= len(got)
            self._error(code, message, ctype, retry_after, close=left > 0)
        else:
            self._error(code, message, ctype, retry_after, close=True)

    def do_GET(self):  # noqa: N802
        self._refuse(_length(self.headers.get("Content-Length")) or 0,
                     405 if self.path.split("?")[0] == "/v1/traces" else 404, "use POST /v1/traces", PROTOBUF)

    def do_POST(self):  # noqa: N802
        ing = self.ingest
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        reply_type = JSON if ctype == JSON else PROTOBUF
        n = _length(self.headers.get("Content-Length"))
        if self.token is not None and not bearer_ok(self.headers.get("Authorization"), self.token):
            ing.refuse("http", "unauthorized", 0, "unauthorized")  # first: nothing else is said to a stranger
            return self._refuse(n if n is not None else DRAIN_MAX + 1, 401, "missing or wrong bearer token",
                                reply_type)
        if n is None:
            ing.refuse("http", "bad_request", 0, "malformed")
            return self._error(411, "Content-Length required", reply_type, close=True)
        if n > self.max_body:
            ing.refuse("http", "too_large", 0, "too_large")
            return self._error(413, f"body of {n} bytes exceeds the limit of {self.max_body}", reply_type, close=True)
        if self.path.split("?")[0] != "/v1/traces":
            return self._refuse(n, 404, f"no such path {self.path!r}; OTLP traces go to /v1/traces", reply_type)
        if ctype not in (PROTOBUF, JSON):
            ing.refuse("http", "bad_request", 0, "malformed")
            return self._refuse(n, 415, f"unsupported Content-Type {ctype!r}; use {PROTOBUF} or {JSON}", reply_type)
        enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if enc not in ("identity", "", "gzip"):
            ing.refuse("http", "bad_request", 0, "malformed")
            return self._refuse(n, 415, f"unsupported Content-Encoding {enc!r}; use gzip or none", reply_type)
        budget = self.server.budget
        if not budget.take(n):
            ing.refuse("http", "overloaded", 0, "inflight_bytes")
            # an authorised client within the body limit: its body is read and dropped (memory stays flat) so that
            # it sees the 429 and its Retry-After rather than a closed connection
            return self._refuse(n, 429, f"{budget.used} bytes of requests in flight (limit {budget.limit}); retry "
                                "later", reply_type, retry_after=ing.retry_after_s, drain=self.max_body)
        held = n
        try:
            data = self.rfile.read(n)
            if len(data) < n:  # the client went away, or the reaper closed a body that took too long
                self.close_connection = True
                return None
            self.server.phase(self, "busy")
            if enc == "gzip":
                data = gunzip(data, self.max_body)
                if not budget.take(len(data)):
                    ing.refuse("http", "overloaded", 0, "inflight_bytes")
                    return self._error(429, f"inflated body of {len(data)} bytes does not fit the {budget.limit} "
                                       "bytes of requests in flight; retry later", reply_type,
                                       retry_after=ing.retry_after_s)
                held += len(data)
            return self._export(data, ctype, reply_type)
        except OverflowError as e:
            ing.refuse("http", "too_large", 0, "too_large")
            return self._error(413, str(e), reply_type, close=True)
        except InputError as e:
            ing.refuse("http", "bad_request", 0, "malformed")
            return self._error(400, str(e), reply_type)
        finally:
            budget.give(held)

    def _export(self, data: bytes, ctype: str, reply_type: str):
        ing = self.ingest
        if ctype == PROTOBUF:
            n_spans, rejected, first = scan_spans(data, "body")  # InputError: 400
            out = ing.export(n_spans, data, "protobuf", "http", rejected, first)
        else:
            doc = otlp.parse_json_bytes(data, "body")
            if doc == {}:
                doc = {"resourceSpans": []}  # the JSON form of an empty request
            if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
                raise InputError("expected an OTLP/JSON ExportTraceServiceRequest object with a "
                                 "'resourceSpans' list", "body")
            n_spans, rejected, first = scan_json_spans(doc, "body")
            out = ing.export(n_spans, data, "json", "http", rejected, first)
        if out.status == "overloaded":
            return self._error(429, out.message, reply_type, retry_after=out.retry_after_s)
        if out.status == "unavailable":
            return self._error(503, out.message, reply_type, retry_after=out.retry_after_s)
        resp = ExportTraceServiceResponse()
        if out.rejected or out.message:
            resp.partial_success.rejected_spans = out.rejected
            resp.partial_success.error_message = out.message
        if reply_type == JSON:
            body = {}
            if out.rejected or out.message:
                body["partialSuccess"] = {"rejectedSpans": str(out.rejected), "errorMessage": out.message}
            return self._reply(200, json.dumps(body).encode(), JSON)
        return self._reply(200, resp.SerializeToString(), PROTOBUF)


def _length(v: str | None) -> int | None:
    v = (v or "").strip()
    return int(v) if v.isdigit() and v.isascii() else None


class _Server(ThreadingHTTPServer):
    """A threading server with a cap on connections, deadlines enforced by a reaper, a sized backlog."""

    daemon_threads = True

    def __init__(self, addr, handler, *, budget: ByteBudget, max_connections: int, backlog: int,
                 idle_timeout_s: float, read_timeout_s: float, health):
        self.request_queue_size = backlog  # read by server_activate() in the base __init__
        self.budget = budget
        self.idle_timeout_s = idle_timeout_s
        self.read_timeout_s = read_timeout_s
        self.health = health
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._conns: dict[_Handler, tuple[str, float]] = {}  # handler -> (phase, deadline or since)
        self.closing = threading.Event()
        super().__init__(addr, handler)

    # -- connections ---------------------------------------------------------------------------------
    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self._evict_idle()
            while not self._slots.acquire(timeout=0.2):
                if self.closing.is_set():
                    self.shutdown_request(request)
                    return
                self._evict_idle()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):  # a client that vanished or was timed out: not an error
        pass

    def track(self, h: _Handler) -> None:
        with self._lock:
            self._conns[h] = ("idle", time.monotonic() + self.idle_timeout_s)
            self.health.connections.set(len(self._conns))

    def untrack(self, h: _Handler) -> None:
        with self._lock:
            self._conns.pop(h, None)
            self.health.connections.set(len(self._conns))

    def phase(self, h: _Handler, phase: str) -> None:
        """idle: waiting for a request (idle deadline); reading: its head and body (read deadline); busy: ours."""
        now = time.monotonic()
        deadline = now + (self.idle_timeout_s if phase == "idle" else self.read_timeout_s if phase == "reading"
                          else float("inf"))
        with self._lock:
            if h in self._conns:
                self._conns[h] = (phase, deadline)

    def _close(self, h: _Handler, reason: str) -> None:
        self._conns[h] = ("closed", float("inf"))
        self.health.connections_closed.labels(reason).inc()
        try:
            h.connection.shutdown(socket.SHUT_RDWR)  # the handler's blocked read returns; its thread ends
        except OSError:
            pass

    def _evict_idle(self) -> None:
        """At the connection cap: close the keep-alive connection idle the longest, for the new one."""
        with self._lock:
            idle = [(d, id(h), h) for h, (ph, d) in self._conns.items() if ph == "idle"]
            if idle:
                self._close(min(idle)[2], "evicted")

    def reap(self) -> None:
        now = time.monotonic()
        with self._lock:
            for h, (ph, deadline) in list(self._conns.items()):
                if ph in ("idle", "reading") and now > deadline:
                    self._close(h, "idle_timeout" if ph == "idle" else "read_timeout")


class OtlpHttpServer:
    """``OtlpHttpServer(ingest, "127.0.0.1", 0).start()``; ``.port`` is the bound port. Limits default to the
    ingest's settings (``receiver_*``); ``budget`` may be shared with the gRPC server."""

    def __init__(self, ingest: Ingest, host: str = "127.0.0.1", port: int = 4318, token: str | None = None,
                 max_body: int | None = None, budget: ByteBudget | None = None, max_connections: int | None = None,
                 backlog: int | None = None, idle_timeout_s: float | None = None,
                 read_timeout_s: float | None = None):
        s = ingest.settings
        max_body = max_body if max_body is not None else s.receiver_max_body_mb * 1024 * 1024
        handler = type("Handler", (_Handler,), {"ingest": ingest, "token": token or None, "max_body": max_body})
        self.httpd = _Server(
            (host, port), handler,
            budget=budget or ByteBudget(s.receiver_max_inflight_mb * 1024 * 1024, ingest.health.inflight_bytes),
            max_connections=max_connections or s.receiver_max_connections,
            backlog=backlog or s.receiver_backlog,
            idle_timeout_s=idle_timeout_s or s.receiver_idle_timeout_s,
            read_timeout_s=read_timeout_s or s.receiver_read_timeout_s, health=ingest.health)
        self.host, self.port = self.httpd.server_address[:2]
        self._thread: threading.Thread | None = None
        self._reaper: threading.Thread | None = None

    def start(self) -> OtlpHttpServer:
        # stop() (shutdown) waits for serve_forever's next poll
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="otlp-http", daemon=True)
        self._thread.start()
        self._reaper = threading.Thread(target=self._reap, name="otlp-http-reaper", daemon=True)
        self._reaper.start()
        return self

    def _reap(self) -> None:
        tick = max(0.05, min(1.0, self.httpd.idle_timeout_s / 4, self.httpd.read_timeout_s / 4))
        while not self.httpd.closing.wait(tick):
            self.httpd.reap()

    def stop(self) -> None:
        self.httpd.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread:
            self._thread.join()
        if self._reaper:
            self._reaper.join()
