"""OTLP/HTTP ingest: sustained end-to-end spans/s (acknowledged = committed in DuckDB) and, in the
same run, the decode-only rate of the same payloads, and their ratio.

    .venv/bin/python bench/ingest_otlp.py [--batches 60] [--clients 4]

Payloads: batches of 512 realistic GenAI chat spans (bench/_spans.py: 20 attributes, 7 resource
attributes), protobuf. The receiver runs in this process (HTTP server + the one Writer, group
commit); the clients run in a separate process, each with a keep-alive connection, posting
pre-built payloads and waiting for each 200 before the next export (like an OTLP exporter).
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _spans import payload  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from agentobs.collect import otlp  # noqa: E402
from agentobs.collect.otlp_http import OtlpHttpServer  # noqa: E402
from agentobs.collect.receiver import Ingest  # noqa: E402
from agentobs.config import load_settings  # noqa: E402
from agentobs.store.db import connect  # noqa: E402
from agentobs.store.writer import Writer  # noqa: E402


def _client(port, bodies, start, q):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start.wait()
    codes = {}
    for b in bodies:
        conn.request("POST", "/v1/traces", body=b, headers={"Content-Type": "application/x-protobuf"})
        r = conn.getresponse()
        r.read()
        codes[r.status] = codes.get(r.status, 0) + 1
    q.put(codes)


def _clients(port, per_client, n_requests_hint=None):
    ctx = mp.get_context("fork")
    start = ctx.Event()
    q = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(port, bodies, start, q)) for bodies in per_client]
    for p in procs:
        p.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    start.set()
    codes = [q.get() for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    return wall, codes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--spans", type=int, default=512)
    ap.add_argument("--clients", type=int, default=4)
    a = ap.parse_args()
    settings = load_settings(env={})
    bodies = [payload(a.spans, seed) for seed in range(a.batches)]
    total = a.batches * a.spans
    mb = sum(map(len, bodies)) / 1e6

    # decode-only: protobuf parse + rows + Arrow table, the same work the receiver does per request;
    # after one warm-up payload (the first Arrow table of a process costs ~0.3 s of imports)
    otlp.decode_request(ExportTraceServiceRequest.FromString(bodies[0]), settings).table()

    def decode_all(decode):
        t0, c0 = time.perf_counter(), time.process_time()
        for b in bodies:
            decode(ExportTraceServiceRequest.FromString(b), settings).table()
        return total / (time.perf_counter() - t0), (time.process_time() - c0) / total * 1e6

    decode_rate, decode_cpu = decode_all(otlp.decode_request)

    with tempfile.TemporaryDirectory() as d:
        con = connect(Path(d) / "bench.duckdb")
        w = Writer(con, batch_rows=50_000, flush_s=0)
        ing = Ingest(w, settings, queue_spans=10**7)
        srv = OtlpHttpServer(ing, "127.0.0.1", 0).start()
        # HTTP server alone: empty exports (no spans), requests/s
        empty = ExportTraceServiceRequest().SerializeToString()
        wall0, _ = _clients(srv.port, [[empty] * 500 for _ in range(a.clients)])
        http_rps = 500 * a.clients / wall0
        per = [bodies[i::a.clients] for i in range(a.clients)]
        c0 = time.process_time()
        wall, codes = _clients(srv.port, per)
        w.flush()
        receiver_cpu = (time.process_time() - c0) / total * 1e6  # this process: HTTP + decode + DuckDB
        srv.stop()
        w.close()
        (stored,) = con.execute("SELECT count(*) FROM spans").fetchone()
        con.close()
    ok = sum(c.get(200, 0) for c in codes)
    e2e = total / wall
    print(f"payloads: {a.batches} x {a.spans} spans, {mb:.1f} MB protobuf, {a.clients} client connections")
    print(f"HTTP server alone (empty exports):   {http_rps:10,.0f} requests/s")
    print(f"decode only (parse+normalize+Arrow): {decode_rate:10,.0f} spans/s  ({decode_cpu:.1f} µs CPU/span)")
    print(f"end-to-end (acked = committed):      {e2e:10,.0f} spans/s  ({ok}/{a.batches} exports ok, "
          f"{stored:,} rows stored; receiver {receiver_cpu:.1f} µs CPU/span, all its threads)")
    print(f"ratio end-to-end / decode-only:      {e2e / decode_rate:10.0%}")
    assert stored == total, "every acknowledged span must be stored"


if __name__ == "__main__":
    main()
