"""A small asyncio HTTP/1.1 client for OpenAI-compatible endpoints: keep-alive connections, JSON bodies,
``Content-Length`` and ``chunked`` responses, Server-Sent Events with per-chunk arrival times.

The standard library has no asyncio HTTP client and the load generator must drive thousands of calls per
second from one core (bench/loadgen_overhead.py), so this speaks the protocol directly: one request per
connection at a time, connections reused (``Connection: keep-alive``) up to ``pool`` per target.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import ConfigError


class HttpError(Exception):
    """The connection failed or the response was not HTTP."""


class _Closed(Exception):
    """The server closed the connection before answering (a stale keep-alive connection)."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    # streamed: the decoded ``data:`` events and their arrival times (seconds after the request was sent)
    events: list[dict] = field(default_factory=list)
    event_s: list[float] = field(default_factory=list)

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise HttpError(f"response is not JSON ({e}): {self.body[:200]!r}") from e


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    prefix: str  # path prefix before /v1/... (a gateway mounted under a path), no trailing slash
    url: str

    @classmethod
    def parse(cls, url: str) -> Target:
        u = urlsplit(url)
        if u.scheme != "http":
            raise ConfigError(f"--target {url!r}: only http:// targets are supported (put TLS in a local proxy)")
        if not u.hostname:
            raise ConfigError(f"--target {url!r} has no host")
        try:
            port = u.port or 80
        except ValueError:
            raise ConfigError(f"--target {url!r}: the port is not a number") from None
        prefix = u.path.rstrip("/")
        if prefix.endswith("/v1"):  # accept the OpenAI base URL form too (http://host:8000/v1)
            prefix = prefix[:-3]
        return cls(u.hostname, port, prefix, url)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a broken socket
            pass


class Client:
    """Requests to one target over a pool of keep-alive connections."""

    def __init__(self, target: Target, timeout_s: float = 600.0):
        self.target = target
        self.timeout_s = timeout_s
        self._idle: list[_Conn] = []
        self._host_header = f"{target.host}:{target.port}".encode()

    async def _open(self) -> _Conn:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(self.target.host, self.target.port, limit=1 << 22),
                                          timeout=min(30.0, self.timeout_s))
        except (TimeoutError, OSError) as e:
            raise HttpError(f"cannot connect to {self.target.address}: {e or type(e).__name__}") from e
        return _Conn(r, w)

    async def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()

    async def request(self, method: str, path: str, body: dict | bytes | None = None,
                      headers: dict[str, str] | None = None, stream: bool = False) -> Response:
        """One request; ``stream``: read the body as Server-Sent Events (``data:`` lines), timing each."""
        data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        head = [f"{method} {self.target.prefix}{path} HTTP/1.1".encode(), b"Host: " + self._host_header,
                b"Content-Type: application/json", b"Content-Length: " + str(len(data)).encode(),
                b"Connection: keep-alive"]
        if stream:
            head.append(b"Accept: text/event-stream")
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}".encode())
        raw = b"\r\n".join(head) + b"\r\n\r\n" + data
        # a pooled connection the server closed meanwhile fails before any status line: retry once on a fresh one
        pooled = bool(self._idle)
        while True:
            conn = self._idle.pop() if pooled else await self._open()
            t0 = time.perf_counter()
            try:
                conn.writer.write(raw)
                resp, keep = await asyncio.wait_for(self._read(conn, stream, t0), timeout=self.timeout_s)
            except TimeoutError:  # (an OSError: first)
                conn.close()
                raise HttpError(f"{self.target.address}: no complete response within {self.timeout_s:g} s") from None
            except (OSError, asyncio.IncompleteReadError, _Closed) as e:
                conn.close()
                if pooled:
                    pooled = False
                    continue
                raise HttpError(f"{self.target.address}: {type(e).__name__}: {e}") from e
            except BaseException:  # an HttpError, or cancelled mid-request: the connection state is unknown
                conn.close()
                raise
            if keep:
                self._idle.append(conn)
            else:
                conn.close()
            return resp

    async def _read(self, conn: _Conn, stream: bool, t0: float) -> tuple[Response, bool]:
        rd = conn.reader
        line = await rd.readline()
        if not line:
            raise _Closed("connection closed before the status line")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise HttpError(f"not an HTTP response: {line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            h = await rd.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        keep = headers.get("connection", "").lower() != "close" and not parts[0].startswith(b"HTTP/1.0")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        resp = Response(status, headers)
        sse = stream and status == 200 and "text/event-stream" in headers.get("content-type", "")
        if chunked:
            buf = b""
            while True:
                size_line = await rd.readline()
                if not size_line:
                    raise HttpError("connection closed inside a chunked body")
                n = int(size_line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while (await rd.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                chunk = await rd.readexactly(n)
                await rd.readexactly(2)
                if sse:
                    buf = self._sse(resp, buf + chunk, t0)
                else:
                    buf += chunk
            if not sse:
                resp.body = buf
        elif length is not None:
            data = await rd.readexactly(int(length))
            if sse:
                self._sse(resp, data, t0)
            else:
                resp.body = data
        else:  # body until close
            data = await rd.read()
            keep = False
            if sse:
                self._sse(resp, data, t0)
            else:
                resp.body = data
        return resp, keep

    @staticmethod
    def _sse(resp: Response, buf: bytes, t0: float) -> bytes:
        """Consume complete lines of ``buf``; ``data:`` JSON events are kept with their arrival time. Returns the
        incomplete rest."""
        now = time.perf_counter() - t0
        while True:
            i = buf.find(b"\n")
            if i < 0:
                return buf
            line, buf = buf[:i].strip(), buf[i + 1:]
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]" or not payload:
                continue
            try:
                resp.events.append(json.loads(payload))
            except ValueError:
                raise HttpError(f"stream event is not JSON: {payload[:120]!r}") from None
            resp.event_s.append(now)
