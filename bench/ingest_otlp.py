"""OTLP/HTTP ingest: sustained end-to-end spans/s (acknowledged = committed in DuckDB) and, in the
same run, the decode-only rate of the same payloads, and their ratio.

    .venv/bin/python bench/ingest_otlp.py [--batches 60] [--clients 4] [--rounds 3]

Payloads: batches of 512 realistic GenAI chat spans (bench/_spans.py: 20 attributes, 7 resource
attributes), protobuf. The receiver runs in this process (HTTP server + the one Writer, group
commit); the clients run in separate processes, each with a keep-alive connection, posting
pre-built payloads and waiting for each 200 before the next export (like an OTLP exporter).

Each round decodes its payloads alone, then sends them end to end into the same database (new
spans every round, so the store grows as it would); decode-only and end-to-end alternate so both
see the same machine load. The receiver's CPU per span is split by thread: HTTP handler threads
(read + protobuf parse + decode + Arrow), the writer thread (its side of INSERT/COMMIT) and
DuckDB's own worker threads.

After the rounds it times the Writer alone on round 1's rows (already decoded, in commits of up to 50k
spans: the round's spans in one commit by default, into a fresh store) and prints the ceiling that
follows: end-to-end cannot beat the slower of decode-only and store-only, whatever the transport does.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
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


def _thread_cpu() -> dict[int, float]:
    """CPU seconds of each live thread of this process (Linux /proc)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=60, help="exports per round")
    ap.add_argument("--spans", type=int, default=512)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", type=int, default=0,
                    help="spans stored before the first round (copies of round 1 under new trace ids)")
    ap.add_argument("--commit-s", type=float, default=0.0,
                    help="writer linger before a commit (the service uses collect_commit_s = 0.05)")
    a = ap.parse_args()
    settings = load_settings(env={})
    rounds = [[payload(a.spans, r * a.batches + i) for i in range(a.batches)] for r in range(a.rounds)]
    total = a.batches * a.spans
    mb = sum(map(len, rounds[0])) / 1e6

    def table(body):
        """protobuf parse + rows + Arrow table: the same work the receiver does per request"""
        return otlp.decode_request(ExportTraceServiceRequest.FromString(body), settings).table()

    # decode-only, after one warm-up payload (the first Arrow table of a process costs ~0.3 s of imports)
    table(rounds[0][0])

    def decode_all(bodies):
        t0, c0 = time.perf_counter(), time.process_time()
        for b in bodies:
            table(b)
        return total / (time.perf_counter() - t0), (time.process_time() - c0) / total * 1e6

    def store_only(bodies, path):
        """The Writer alone: the same rows, already decoded, in commits of up to 50k spans (the cheapest a
        commit gets: bigger commits cost less per span) into a fresh store — the least DuckDB work any
        receiver must do per span, whatever decodes it."""
        tables = [table(b) for b in bodies]
        con = connect(path)
        w = Writer(con, batch_rows=50_000, flush_s=60.0)
        t0, c0 = time.perf_counter(), time.process_time()
        tickets = [w.submit("spans", t) for t in tables]
        w.flush()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert sum(t.wait() for t in tickets) == total
        w.close()
        con.close()
        return total / wall, cpu / total * 1e6

    rows = []
    with tempfile.TemporaryDirectory() as d:
        con = connect(Path(d) / "bench.duckdb")
        if a.prefill:
            import pyarrow as pa

            one = pa.concat_tables(table(b) for b in rounds[0])
            con.register("_round", one)
            for k in range(-(-a.prefill // one.num_rows)):
                con.sql(f"INSERT INTO spans BY NAME SELECT * REPLACE (md5(trace_id || 'prefill{k}') AS trace_id) "
                        "FROM _round")
            con.unregister("_round")
            con.sql("CHECKPOINT")
        prefilled = con.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        w = Writer(con, batch_rows=50_000, flush_s=a.commit_s)
        ing = Ingest(w, settings, queue_spans=10**7)
        srv = OtlpHttpServer(ing, "127.0.0.1", 0).start()
        # HTTP server alone: empty exports (no spans), requests/s
        empty = ExportTraceServiceRequest().SerializeToString()
        wall0, _ = _clients(srv.port, [[empty] * 500 for _ in range(a.clients)])
        http_rps = 500 * a.clients / wall0
        steady = {threading.main_thread().native_id, w._thread.native_id, srv._thread.native_id}
        for bodies in rounds:
            decode_rate, decode_cpu = decode_all(bodies)
            per = [bodies[i::a.clients] for i in range(a.clients)]
            commits0, retries0 = w.stats.batches, w.stats.conflict_retries
            t0, c0 = _thread_cpu(), time.process_time()
            wall, codes = _clients(srv.port, per)
            w.flush()
            t1, c1 = _thread_cpu(), time.process_time()
            us = 1e6 / total
            writer = (t1[w._thread.native_id] - t0[w._thread.native_id]) * us
            # DuckDB's worker threads live on; HTTP handler threads end with their connection
            duck = sum(t1[k] - t0[k] for k in t1.keys() & t0.keys() if k not in steady) * us
            proc = (c1 - c0) * us
            rows.append({"decode": decode_rate, "decode_cpu": decode_cpu, "e2e": total / wall, "proc": proc,
                         "writer": writer, "duck": duck, "handlers": proc - writer - duck,
                         "commits": w.stats.batches - commits0, "retries": w.stats.conflict_retries - retries0,
                         "ok": sum(c.get(200, 0) for c in codes), "load": os.getloadavg()[0]})
        srv.stop()
        w.close()
        stored = con.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        con.close()
        store_rate, store_cpu = store_only(rounds[0], Path(d) / "store_only.duckdb")
    print(f"payloads: {a.rounds} rounds x {a.batches} x {a.spans} spans, {mb:.1f} MB protobuf a round, "
          f"{a.clients} client connections, writer linger {a.commit_s} s, {prefilled:,} spans stored before")
    print(f"HTTP server alone (empty exports): {http_rps:,.0f} requests/s")
    print("round  decode-only spans/s (µs CPU)  end-to-end spans/s  ratio  receiver µs CPU/span = handlers + "
          "writer + DuckDB threads   commits (spans each)  load")
    for i, r in enumerate(rows):
        print(f"{i + 1:5d}  {r['decode']:10,.0f} ({r['decode_cpu']:5.1f})        {r['e2e']:10,.0f}      "
              f"{r['e2e'] / r['decode']:5.0%}  {r['proc']:6.1f} = {r['handlers']:5.1f} + {r['writer']:5.1f} + "
              f"{r['duck']:5.1f}{'':22s}{r['commits']:4d} ({total / r['commits']:5.0f})    {r['load']:.1f}")
    med = {k: statistics.median(r[k] for r in rows) for k in ("decode", "e2e", "proc", "decode_cpu")}
    print(f"median decode only (parse+normalize+Arrow): {med['decode']:10,.0f} spans/s  "
          f"({med['decode_cpu']:.1f} µs CPU/span)")
    print(f"median end-to-end (acked = committed):      {med['e2e']:10,.0f} spans/s  "
          f"(receiver {med['proc']:.1f} µs CPU/span, all its threads)")
    print(f"ratio of the medians end-to-end / decode:   {med['e2e'] / med['decode']:10.0%}")
    # the decoder is Python (one core at a time under the GIL) and DuckDB's insert runs beside it at best, so
    # no receiver built from these two parts can acknowledge faster than the slower of them
    print(f"store only (Writer, same rows decoded, commits of ≤ 50k spans, fresh store):{store_rate:10,.0f} spans/s  "
          f"({store_cpu:.1f} µs CPU/span)")
    print(f"ceiling for end-to-end = min(decode only, store only):              "
          f"{min(med['decode'], store_rate):10,.0f} spans/s")
    print(f"exports ok {sum(r['ok'] for r in rows)}/{a.batches * a.rounds}, rows stored {stored - prefilled:,}, "
          f"commits redone with INSERT OR IGNORE {sum(r['retries'] for r in rows)}")
    assert stored == prefilled + total * a.rounds, "every acknowledged span must be stored"


if __name__ == "__main__":
    main()
