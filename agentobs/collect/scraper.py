"""The fleet scraper: engine ``/metrics`` (and SGLang ``/server_info``) of many targets.

Each target is scraped every ``interval_s`` plus a random delay (``jitter`` × interval); targets
start spread over the first interval. At most ``concurrency`` scrapes run at once; a target whose
previous scrape is still running is skipped (counted as an ``overrun`` drop). Every attempt writes
one ``scrapes`` row (ok, error reason, duration, samples); a failing target never stops the loop.

Samples are stored raw (counters as exposed): a counter that decreases between two scrapes of the
same series means the engine restarted — downstream SQL takes ``value`` as the increase then
(docs/collectors.md, "Counter resets"). Engine config is stored only when it changes: the
``vllm:cache_config_info`` labels, and SGLang ``/server_info`` (re-read every ``server_info_every_s``;
volatile fields such as throughput are ignored for change detection; secrets redacted).

``fetch(url, timeout) -> Response`` is injected; the default is a keep-alive ``http.client`` GET.
"""

from __future__ import annotations

import hashlib
import heapq
import http.client
import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pyarrow as pa

from ..errors import InputError
from ..store.writer import Writer
from . import prom, serverinfo
from .fleet import Target
from .health import Health
from .promcache import ScrapeLimit, SeriesParser

ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"  # the classic text format, not OpenMetrics
MAX_BODY = 32 * 1024 * 1024
VOLATILE = ("last_gen_throughput", "memory_usage", "startup_time", "avg_spec_accept_length", "step_time_dict",
            "status")
SCRAPE_SCHEMA = pa.schema([("ts", pa.timestamp("us")), ("instance", pa.string()), ("url", pa.string()),
                          ("ok", pa.bool_()), ("error", pa.string()), ("duration_s", pa.float64()),
                          ("samples", pa.int32())])


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = ""


class FetchError(Exception):
    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(detail)


_local = threading.local()


def http_fetch(url: str, timeout: float) -> Response:
    """GET with a per-thread keep-alive connection per host, all of it (the body too) within ``timeout``;
    raises FetchError(reason, detail)."""
    deadline = time.monotonic() + timeout
    u = urlsplit(url)
    key = (u.scheme, u.netloc)
    if not u.hostname:
        raise FetchError("connection_error", f"{url!r} names no host")
    host = u.hostname
    conns: dict[tuple[str, str], http.client.HTTPConnection] | None = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    for attempt in (0, 1):
        conn = conns.get(key)
        fresh = conn is None
        if conn is None:
            cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
            conn = conns[key] = cls(host, u.port, timeout=timeout)
        else:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
        try:
            conn.request("GET", path, headers={"Accept": ACCEPT, "User-Agent": "agentobs-scraper"})
            r = conn.getresponse()
            body = _read_body(r, conn, deadline)
            if len(body) > MAX_BODY:
                conn.close()
                conns.pop(key, None)
                raise FetchError("too_large", f"body exceeds {MAX_BODY} bytes")
            if r.getheader("Connection", "").lower() == "close":
                conn.close()
                conns.pop(key, None)
            return Response(r.status, body, r.getheader("Content-Type", ""))
        except TimeoutError:
            conn.close()
            conns.pop(key, None)
            raise FetchError("timeout", f"no answer within {timeout:g} s") from None
        except ConnectionRefusedError:
            conns.pop(key, None)
            raise FetchError("connection_refused", "connection refused") from None
        except (http.client.HTTPException, OSError) as e:
            conn.close()
            conns.pop(key, None)
            if attempt == 0 and not fresh:  # a kept-alive connection the server closed meanwhile
                continue
            raise FetchError("connection_error", f"{type(e).__name__}: {e}") from e
    raise AssertionError("unreachable")


def _read_body(r: http.client.HTTPResponse, conn, deadline: float) -> bytes:
    """The body, at most MAX_BODY + 1 bytes, read in chunks each given only the time left (a server that
    trickles it would otherwise hold the scrape for timeout x chunks)."""
    chunks, n = [], 0
    while n <= MAX_BODY:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if conn.sock is not None:
            conn.sock.settimeout(left)
        chunk = r.read(min(1 << 20, MAX_BODY + 1 - n))
        if not chunk:
            break
        chunks.append(chunk)
        n += len(chunk)
    return b"".join(chunks)


@dataclass
class _State:
    target: Target
    parser: SeriesParser
    busy: bool = False
    config: frozenset | None = None
    info_hash: str | None = None
    info_at: float = -1e18
    engine: str | None = None


@dataclass
class ScrapeResult:
    instance: str
    ok: bool
    reason: str | None = None
    error: str | None = None
    samples: int = 0
    config_stored: bool = False
    info_stored: bool = False
    tickets: list = field(default_factory=list)


class Scraper:
    def __init__(self, targets: list[Target], writer: Writer, health: Health | None = None,
                 fetch: Callable[[str, float], Response] = http_fetch, clock: Callable[[], float] = time.time,
                 jitter: float = 0.1, concurrency: int = 16, server_info_every_s: float = 300.0,
                 rng: random.Random | None = None):
        self.writer = writer
        self.health = health or Health()
        self.fetch = fetch
        self.clock = clock
        self.jitter = jitter
        self.concurrency = concurrency
        self.server_info_every_s = server_info_every_s
        self.rng = rng or random.Random()
        self.states = [_State(t, SeriesParser(t.instance, t.labels, t.max_series),
                              engine=None if t.engine == "auto" else t.engine) for t in targets]

    # -- one attempt --------------------------------------------------------------------------
    def scrape(self, st: _State) -> ScrapeResult:
        t = st.target
        h = self.health
        at = self.clock()
        t0 = time.perf_counter()
        deadline = time.monotonic() + t.timeout_s
        res = ScrapeResult(t.instance, ok=False)
        try:
            resp = self.fetch(t.url, t.timeout_s)
            if resp.status != 200:
                raise FetchError(f"http_{resp.status}", f"HTTP {resp.status} from {t.url}")
            try:
                text = resp.body.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"not UTF-8 at byte {e.start}", t.url) from e
            parsed = st.parser.parse(text, at, where=t.url, deadline=deadline)
            if time.monotonic() > deadline:
                raise ScrapeLimit("timeout", f"fetch and parse took longer than {t.timeout_s:g} s; nothing stored")
            res.samples = parsed.samples.num_rows
            res.tickets.append(self.writer.submit("metric_samples", parsed.samples))
            if st.engine is None:
                st.engine = parsed.engine
            if parsed.config is not None:
                cfg = frozenset(parsed.config)
                if cfg != st.config:
                    st.config = cfg
                    rows = prom.config_table(t.instance, prom.to_utc(at), "vllm", sorted(parsed.config),
                                             "prometheus")
                    res.tickets.append(self.writer.submit("engine_config", rows))
                    h.config_changes.labels("prometheus").inc()
                    res.config_stored = True
            res.ok = True
        except (FetchError, ScrapeLimit) as e:
            res.reason, res.error = e.reason, str(e)
        except InputError as e:
            res.reason, res.error = "parse_error", str(e)
        except Exception as e:  # noqa: BLE001 - one bad target never stops the loop
            res.reason, res.error = "internal", f"{type(e).__name__}: {e}"
        dur = time.perf_counter() - t0
        if res.ok and st.engine == "sglang" and t.server_info and at - st.info_at >= self.server_info_every_s:
            st.info_at = at
            self._server_info(st, at, res)
        h.scrape_seconds.observe(dur)
        h.scrapes.labels("ok" if res.ok else "error").inc()
        if not res.ok:
            h.scrape_errors.labels(t.instance, res.reason).inc()
        row = pa.table({"ts": [prom.to_utc(at)], "instance": [t.instance], "url": [t.url], "ok": [res.ok],
                        "error": [f"{res.reason}: {res.error}" if res.reason else None], "duration_s": [dur],
                        "samples": [res.samples]}, schema=SCRAPE_SCHEMA)
        res.tickets.append(self.writer.submit("scrapes", row))
        return res

    def _server_info(self, st: _State, at: float, res: ScrapeResult) -> None:
        t = st.target
        url = t.server_info_url or _base(t.url) + "/server_info"
        try:
            resp = self.fetch(url, t.timeout_s)
            if resp.status != 200:
                raise FetchError(f"http_{resp.status}", f"HTTP {resp.status} from {url}")
            try:
                info = json.loads(resp.body)
            except ValueError as e:
                raise InputError(f"not JSON: {e}", url) from e
            rows = serverinfo.server_info_rows(info, t.instance, at, where=url)
        except FetchError as e:
            self.health.scrape_errors.labels(t.instance, f"server_info_{e.reason}").inc()
            return
        except InputError:
            self.health.scrape_errors.labels(t.instance, "server_info_parse_error").inc()
            return
        keys = rows.column("key").to_pylist()
        vals = rows.column("value").to_pylist()
        stable = sorted((k, v) for k, v in zip(keys, vals, strict=True) if not _volatile(k))
        digest = hashlib.sha256(json.dumps(stable).encode()).hexdigest()
        if digest != st.info_hash:
            st.info_hash = digest
            res.tickets.append(self.writer.submit("engine_config", rows))
            self.health.config_changes.labels("server_info").inc()
            res.info_stored = True

    def scrape_all(self) -> list[ScrapeResult]:
        """One round over every target, in parallel (tests and `--once`)."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self.scrape, self.states))

    # -- the loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        now = time.monotonic()
        heap = []
        for i, st in enumerate(self.states):
            base = now + self.rng.uniform(0, st.target.interval_s)
            heap.append((base, base, i))
        heapq.heapify(heap)
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="scrape")
        try:
            while heap and not stop.is_set():
                run_at, base, i = heap[0]
                now = time.monotonic()
                if run_at > now:
                    stop.wait(min(run_at - now, 0.5))
                    continue
                heapq.heappop(heap)
                st = self.states[i]
                if st.busy:
                    self.health.scrape_drops.labels("overrun").inc()
                else:
                    st.busy = True
                    pool.submit(self._run_one, st)
                iv = st.target.interval_s
                nxt = base + iv
                while nxt < now - iv:  # fell far behind (suspended process): skip missed rounds
                    nxt += iv
                    self.health.scrape_drops.labels("behind").inc()
                heapq.heappush(heap, (nxt + self.rng.uniform(0, self.jitter * iv), nxt, i))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _run_one(self, st: _State) -> None:
        try:
            self.scrape(st)
        finally:
            st.busy = False


def _base(url: str) -> str:
    u = urlsplit(url)
    return f"{u.scheme}://{u.netloc}"


def _volatile(key: str) -> bool:
    return any(part in VOLATILE for part in key.split("."))
