"""OTLP/HTTP trace receiver: ``POST /v1/traces`` (protobuf or JSON, optional gzip).

A threaded stdlib HTTP/1.1 server with keep-alive: each export is one request, so at 512 spans per
batch 100k spans/s is ~200 requests/s — the request rate the server must sustain is small, the cost
is in decoding and committing (bench/ingest_otlp.py measures the server alone too).

Answers follow the OTLP/HTTP spec: 200 with ``ExportTraceServiceResponse`` (``partial_success`` when
some spans were rejected), 400 with a ``google.rpc.Status`` for an undecodable payload, 429/503 with
``Retry-After`` when overloaded/unavailable, 401 without the configured bearer token, 413 over the
size limit, 415 for another content type or encoding. The body of every answer uses the request's
content type (protobuf or JSON).
"""

from __future__ import annotations

import hmac
import json
import math
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ..errors import InputError
from . import otlp
from .receiver import Ingest, count_json_spans, count_spans

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_GRPC_CODE = {400: 3, 401: 16, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 429: 8, 503: 14}


def gunzip(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise InputError(f"body is not valid gzip ({e})", "Content-Encoding: gzip") from e
    if len(out) > limit or d.unconsumed_tail:
        raise OverflowError(f"decompressed body exceeds {limit} bytes")
    if not d.eof:
        raise InputError("gzip body is truncated", "Content-Encoding: gzip")
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "agentobs-otlp"
    ingest: Ingest
    token: str | None
    max_body: int

    def log_message(self, format, *args):  # noqa: A002 - silence per-request logging
        pass

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

    def do_GET(self):  # noqa: N802
        self._error(405 if self.path.split("?")[0] == "/v1/traces" else 404, "use POST /v1/traces", PROTOBUF)

    def do_POST(self):  # noqa: N802
        ing = self.ingest
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        reply_type = JSON if ctype == JSON else PROTOBUF
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            ing.refuse("http", "bad_request", 0, "malformed")
            return self._error(411, "Content-Length required", reply_type, close=True)
        n = int(length)
        if n > self.max_body:
            ing.refuse("http", "too_large", 0, "too_large")
            return self._error(413, f"body of {n} bytes exceeds the limit of {self.max_body}", reply_type, close=True)
        data = self.rfile.read(n)
        if self.path.split("?")[0] != "/v1/traces":
            return self._error(404, f"no such path {self.path!r}; OTLP traces go to /v1/traces", reply_type)
        if self.token is not None:
            auth = self.headers.get("Authorization") or ""
            if not hmac.compare_digest(auth.encode(), f"Bearer {self.token}".encode()):
                ing.refuse("http", "unauthorized", 0, "unauthorized")
                return self._error(401, "missing or wrong bearer token", reply_type)
        if ctype not in (PROTOBUF, JSON):
            ing.refuse("http", "bad_request", 0, "malformed")
            return self._error(415, f"unsupported Content-Type {ctype!r}; use {PROTOBUF} or {JSON}", reply_type)
        enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        try:
            if enc == "gzip":
                data = gunzip(data, self.max_body)
            elif enc not in ("identity", ""):
                ing.refuse("http", "bad_request", 0, "malformed")
                return self._error(415, f"unsupported Content-Encoding {enc!r}; use gzip or none", reply_type)
            if ctype == PROTOBUF:
                try:
                    req = ExportTraceServiceRequest.FromString(data)
                except DecodeError as e:
                    raise InputError(f"not an OTLP ExportTraceServiceRequest protobuf ({e})", "body") from e
                spans = count_spans(req)
                out = ing.export(spans, lambda: otlp.decode_request(req, ing.settings, "otlp-http", "body"), "http")
            else:
                doc = otlp.parse_json_bytes(data, "body")
                if doc == {}:
                    doc = {"resourceSpans": []}  # the JSON form of an empty request
                if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
                    raise InputError("expected an OTLP/JSON ExportTraceServiceRequest object with a "
                                     "'resourceSpans' list", "body")
                spans = count_json_spans(doc)
                out = ing.export(spans, lambda: otlp.decode_json_obj(doc, ing.settings, "otlp-http", "body"), "http")
        except OverflowError as e:
            ing.refuse("http", "too_large", 0, "too_large")
            return self._error(413, str(e), reply_type, close=True)
        except InputError as e:
            ing.refuse("http", "bad_request", 0, "malformed")
            return self._error(400, str(e), reply_type)
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


class OtlpHttpServer:
    """``OtlpHttpServer(ingest, "127.0.0.1", 0).start()``; ``.port`` is the bound port."""

    def __init__(self, ingest: Ingest, host: str = "127.0.0.1", port: int = 4318, token: str | None = None,
                 max_body: int = 64 * 1024 * 1024):
        handler = type("Handler", (_Handler,), {"ingest": ingest, "token": token or None, "max_body": max_body})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self._thread: threading.Thread | None = None

    def start(self) -> OtlpHttpServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="otlp-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread:
            self._thread.join()
