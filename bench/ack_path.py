"""The acknowledgement path's CPU per span: the full protobuf parse the receivers did before against the
wire scan they do now (``receiver.scan_protobuf``), measured in one run, alternated.

    .venv/bin/python bench/ack_path.py [--batches 60] [--spans 512] [--clients 4] [--rounds 3]

1. The check alone, in this process: ``otlp.parse_protobuf`` + ``count_spans`` (before) against
   ``scan_protobuf`` (the wire scan), and ``scan_spans`` (now: the scan that also checks each span's ids,
   times, kind and status code for OTLP partial success) — µs of CPU per span over the same bodies.
2. The whole acknowledgement path: the OTLP/HTTP receiver in this process with a fsync'd spool (no loader:
   nothing is decoded), ``--clients`` client processes posting the bodies over keep-alive connections;
   the receiver process's CPU per acknowledged span with the handler's check swapped for the round: the
   full parse (before), the scan alone, the scan + per-span checks (now: what the receivers run), rounds
   alternated so all see the same machine load.

Payloads: bench/_spans.py (512 GenAI chat spans a request, 20 attributes, 7 resource attributes). The
last line is machine-readable: ``check_before_us=<> check_scan_us=<> check_now_us=<> ack_before_us=<>
ack_scan_us=<> ack_now_us=<> ack_ratio=<before/now>``.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _spans import payload  # noqa: E402

from agentobs.collect import otlp, otlp_http  # noqa: E402
from agentobs.collect.health import Health  # noqa: E402
from agentobs.collect.otlp_http import OtlpHttpServer  # noqa: E402
from agentobs.collect.receiver import Ingest, count_spans, scan_protobuf, scan_spans  # noqa: E402
from agentobs.collect.spool import Spool  # noqa: E402
from agentobs.config import load_settings  # noqa: E402


def full_parse(data: bytes, where: str = "body") -> int:
    """The check before: every body parsed in full (upb message objects) to count its spans."""
    req, _ = otlp.parse_protobuf(data, where)
    return count_spans(req)


WAYS = {  # the HTTP handler's check, as (spans, rejected, first reason)
    "before": lambda data, where="body": (full_parse(data, where), 0, ""),
    "scan": lambda data, where="body": (scan_protobuf(data, where), 0, ""),
    "now": scan_spans,
}


def _cpu_per_span(fn, bodies: list[bytes], spans: int, seconds: float = 1.5) -> float:
    t0 = time.process_time()
    n = 0
    while time.process_time() - t0 < seconds:
        for b in bodies:
            fn(b)
        n += spans * len(bodies)
    return (time.process_time() - t0) / n * 1e6


def _client(port, bodies, start, q):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start.wait()
    codes: dict[int, int] = {}
    for b in bodies:
        conn.request("POST", "/v1/traces", body=b, headers={"Content-Type": "application/x-protobuf"})
        r = conn.getresponse()
        r.read()
        codes[r.status] = codes.get(r.status, 0) + 1
    q.put(codes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=60, help="exports per round")
    ap.add_argument("--spans", type=int, default=512)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each way, alternated")
    a = ap.parse_args()
    bodies = [payload(a.spans, i) for i in range(a.batches)]
    assert all(scan_protobuf(b) == full_parse(b) == a.spans for b in bodies)
    assert all(scan_spans(b) == (a.spans, 0, "") for b in bodies)

    check: dict[str, list[float]] = {"before": [], "scan": [], "now": []}
    for _ in range(a.rounds):
        check["before"].append(_cpu_per_span(full_parse, bodies[:8], a.spans))
        check["scan"].append(_cpu_per_span(scan_protobuf, bodies[:8], a.spans))
        check["now"].append(_cpu_per_span(scan_spans, bodies[:8], a.spans))

    settings = load_settings(env={})
    ctx = mp.get_context("fork")
    ack: dict[str, list[float]] = {w: [] for w in WAYS}
    rates: dict[str, list[float]] = {w: [] for w in WAYS}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for way in WAYS:
                spool = Spool(Path(d) / f"spool-{way}-{r}", max_unloaded_bytes=1 << 40)
                ing = Ingest(spool, settings, Health())
                otlp_http.scan_spans = WAYS[way]
                srv = OtlpHttpServer(ing, "127.0.0.1", 0).start()
                start, q = ctx.Event(), ctx.Queue()
                clients = [ctx.Process(target=_client, args=(srv.port, bodies[i::a.clients], start, q))
                           for i in range(a.clients)]
                for p in clients:
                    p.start()
                time.sleep(0.3)
                c0, t0 = time.process_time(), time.perf_counter()
                start.set()
                codes = [q.get() for _ in clients]
                wall = time.perf_counter() - t0
                cpu = time.process_time() - c0
                for p in clients:
                    p.join()
                srv.stop()
                spool.close()
                assert sum(c.get(200, 0) for c in codes) == a.batches, codes
                ack[way].append(cpu / (a.batches * a.spans) * 1e6)
                rates[way].append(a.batches * a.spans / wall)
        otlp_http.scan_spans = scan_spans

    med = {k: statistics.median(v) for k, v in check.items()}
    amed = {k: statistics.median(v) for k, v in ack.items()}
    print(f"payloads: {a.batches} x {a.spans} spans ({sum(map(len, bodies)) / a.batches / 1e3:.0f} kB a request), "
          f"{a.clients} client processes, {a.rounds} rounds of each, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    print("the check alone, µs CPU/span (rounds):")
    print(f"  full parse + count (before)     {med['before']:6.2f}  ({', '.join(f'{x:.2f}' for x in check['before'])})")
    print(f"  wire scan (scan_protobuf)       {med['scan']:6.2f}  ({', '.join(f'{x:.2f}' for x in check['scan'])})")
    print(f"  scan + per-span checks (now)    {med['now']:6.2f}  ({', '.join(f'{x:.2f}' for x in check['now'])})")
    print("the acknowledgement path (HTTP + check + hash + spool fsync), receiver process µs CPU/span (rounds; "
          "acked spans/s):")
    names = {"before": "full parse (before)", "scan": "wire scan", "now": "scan + per-span checks (now)"}
    for way in WAYS:
        print(f"  {names[way]:29s}  {amed[way]:6.2f}  ({', '.join(f'{x:.2f}' for x in ack[way])}; "
              f"{', '.join(f'{x:,.0f}' for x in rates[way])} spans/s)")
    print(f"check_before_us={med['before']:.2f} check_scan_us={med['scan']:.2f} check_now_us={med['now']:.2f} "
          f"ack_before_us={amed['before']:.2f} "
          f"ack_scan_us={amed['scan']:.2f} ack_now_us={amed['now']:.2f} ack_ratio={amed['before'] / amed['now']:.2f}")


if __name__ == "__main__":
    main()
