"""OTLP/HTTP ingest: sustained end-to-end spans/s until queryable, and in the same run the decode-only
rate of the same payloads, and their ratio.

    .venv/bin/python bench/ingest_otlp.py [--batches 60] [--clients 4] [--rounds 3] [--prefill N]
                                          [--decoder native|python] [--python-decode]
                                          [--span-store table|segments|both] [--compact-after N]

Payloads: batches of 512 realistic GenAI chat spans (bench/_spans.py: 20 attributes, 7 resource
attributes), protobuf. The receiver runs in this process as `agentobs collect` runs it: HTTP server →
spool (acknowledged once fsync'd) → loader (``--processes`` decoder processes, default one per core) →
the store, in the layout ``--span-store`` names (``table``: the loader thread inserts into DuckDB;
``segments``: the decoders write Parquet segments, the loader thread commits their catalog rows and merges
them into the table part every ``segment_compact_after`` segments; both, on fresh stores, by default). The clients run in separate processes, each with a keep-alive connection, posting pre-built
payloads and waiting for each 200 before the next export (like an OTLP exporter).

End to end = from the first request until the loader has committed every acknowledged span to the
store (what `agentobs sql` then reads; the count is checked with a query). Decode-only = the loader's
own decode of the same bodies (``decode_records``: spool read → the ``--decoder`` (default native:
otlp_native.py) → Arrow table → IPC) in one process, alternated with the end-to-end rounds so both see
the same machine load; ``--python-decode`` also times otlp.py's decode of them (the reference). ``--prefill`` stores N spans first (copies of
round 1 under new trace ids and earlier times), to see the rate at a large stored count.

CPU per span of the end-to-end rounds is split into this process (HTTP handlers, spool, loader thread
and DuckDB's insert; the loader thread's own share in parentheses) and the decoder processes. The store
connection gets ``collect_memory_limit`` as ``agentobs collect`` does. RSS: the peak of this process and of each decoder.

The last line is machine-readable:
``e2e_spans_per_s=<N> decode_only_spans_per_s=<M> ratio=<N/M> stored=<rows> acked=<spans>``.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _spans import payload  # noqa: E402

from agentobs.collect.health import Health  # noqa: E402
from agentobs.collect.loader import Loader, decode_records, default_processes  # noqa: E402
from agentobs.collect.otlp_http import OtlpHttpServer  # noqa: E402
from agentobs.collect.receiver import Ingest  # noqa: E402
from agentobs.collect.spool import Spool  # noqa: E402
from agentobs.config import load_settings  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.store.db import set_memory_limit  # noqa: E402


def _client(port, bodies, start, q):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start.wait()
    codes = {}
    for b in bodies:
        while True:
            conn.request("POST", "/v1/traces", body=b, headers={"Content-Type": "application/x-protobuf"})
            r = conn.getresponse()
            r.read()
            codes[r.status] = codes.get(r.status, 0) + 1
            if r.status != 429:
                break
            time.sleep(0.05)
    q.put(codes)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu(tid: int) -> float:
    """CPU seconds of one thread of this process (the loader thread: IPC read + DuckDB insert + commit)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=60, help="exports per round")
    ap.add_argument("--spans", type=int, default=512)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--processes", type=int, default=0, help="loader decoder processes (0: one per core)")
    ap.add_argument("--prefill", type=int, default=0, help="spans stored before the first round")
    ap.add_argument("--decoder", choices=("native", "python"), default="native", help="the loader's decoder")
    ap.add_argument("--span-store", choices=("table", "segments", "both"), default="both",
                    help="store layout(s) of the end-to-end rounds (span_store); both: table, then segments, on "
                         "fresh stores in the same run (the last line is the last layout's)")
    ap.add_argument("--compact-after", type=int, default=None,
                    help="segment_compact_after for the segments layout (default: the setting's default)")
    ap.add_argument("--python-decode", action="store_true",
                    help="also time otlp.py's decode-only of the same bodies (the reference)")
    a = ap.parse_args()
    layouts = ["table", "segments"] if a.span_store == "both" else [a.span_store]
    settings = load_settings(env={"AGENTOBS_LOADER_DECODER": a.decoder})
    procs_n = a.processes or default_processes()
    rounds = [[payload(a.spans, r * a.batches + i) for i in range(a.batches)] for r in range(a.rounds)]
    total = a.batches * a.spans
    mb = sum(map(len, rounds[0])) / 1e6
    ctx = mp.get_context("fork")

    with tempfile.TemporaryDirectory() as d:
        # the decode-only measurement reads the bodies from a spool, as the loader's decoders do
        dspool = Spool(Path(d) / "decode-spool", fsync=False)
        dec_items = []
        for r, bodies in enumerate(rounds):
            for b in bodies:
                dspool.append(b, "protobuf", "http")
            recs = dspool.read_from(0, 0, 10**9, 1 << 40)[r * a.batches:]
            dec_items.append([(str(dspool.path(x.seq)), x.offset, x.length, x.fmt, x.transport, x.seq) for x in recs])
        py_settings = load_settings(env={"AGENTOBS_LOADER_DECODER": "python"})
        decode_records(dec_items[0][:1], settings)  # warm-up (imports, first Arrow table)
        decode_records(dec_items[0][:1], py_settings)

        def decode_only(items, s=settings):
            t0, c0 = time.perf_counter(), time.process_time()
            for k in range(0, len(items), 8):  # the loader's batches hold several requests
                b = decode_records(items[k:k + 8], s)
                assert b.rejected == 0
            return total / (time.perf_counter() - t0), (time.process_time() - c0) / total * 1e6

        res: dict[str, dict] = {}
        for layout in layouts:
            env = {"AGENTOBS_LOADER_DECODER": a.decoder, "AGENTOBS_SPAN_STORE": layout}
            if a.compact_after is not None:
                env["AGENTOBS_SEGMENT_COMPACT_AFTER"] = str(a.compact_after)
            s_l = load_settings(env=env)
            res[layout] = _run_layout(a, Path(d), layout, s_l, rounds, dec_items, decode_only, py_settings, ctx,
                                      total)
    final = None
    for layout, out in res.items():
        rows = out["rows"]
        print(f"span_store = {layout}: {a.rounds} rounds x {a.batches} x {a.spans} spans, {mb:.1f} MB protobuf a "
              f"round, {a.clients} client processes, {procs_n} decoder processes, {out['prefilled']:,} spans stored "
              f"before, {os.cpu_count()} CPUs")
        print("round  decode-only spans/s (µs CPU)   acked spans/s   end-to-end spans/s  ratio   µs CPU/span: "
              "receiver process (of it loader thread) + decoders   429s  load")
        for i, r in enumerate(rows):
            print(f"{i + 1:5d}  {r['decode']:10,.0f} ({r['decode_cpu']:5.1f})    {r['ack']:12,.0f}   {r['e2e']:12,.0f}"
                  f"       {r['e2e'] / r['decode']:5.0%}   {r['self']:6.1f} ({r['loader']:5.1f}) + {r['kids']:5.1f}"
                  f"{'':22s}{r['r429']:4d}  {r['load']:.1f}")
            if r["py"]:
                print(f"       otlp.py decode-only {r['py']:10,.0f} spans/s ({r['py_cpu']:.1f} µs CPU/span)")
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("decode", "e2e", "decode_cpu", "self", "kids", "loader")}
        print(f"median decode only (one process):       {med['decode']:10,.0f} spans/s "
              f"({med['decode_cpu']:.1f} µs CPU/span)")
        print(f"median end to end (stored, queryable):  {med['e2e']:10,.0f} spans/s "
              f"({med['self']:.1f} + {med['kids']:.1f} µs CPU/span; loader thread {med['loader']:.1f})")
        print(f"peak RSS: receiver process {out['rss_self']:,.0f} MB, decoders "
              f"{', '.join(f'{x:,.0f}' for x in out['rss_kids'])} MB (sum {out['rss_self'] + sum(out['rss_kids']):,.0f} MB)")
        print(f"exports ok {sum(r['ok'] for r in rows)}/{a.batches * a.rounds}, rows stored {out['stored']:,}"
              + (f"; segments merged {out['compacted']}, left {out['segments']}" if layout == "segments" else ""))
        assert out["stored"] == out["acked"], "every acknowledged span must be stored once"
        final = (med, out)
    assert final is not None
    med, out = final
    print(f"e2e_spans_per_s={med['e2e']:.0f} decode_only_spans_per_s={med['decode']:.0f} "
          f"ratio={med['e2e'] / med['decode']:.2f} stored={out['stored'] + out['prefilled']} acked={out['acked']}")


def _run_layout(a, d: Path, layout: str, settings, rounds, dec_items, decode_only, py_settings, ctx,
                total: int) -> dict:
    """The end-to-end rounds on a fresh store with ``span_store = layout``, alternated with decode-only."""
    con = connect(d / f"bench-{layout}.duckdb")
    if settings.collect_memory_limit:
        set_memory_limit(con, settings.collect_memory_limit)
    if a.prefill:
        import pyarrow as pa

        from agentobs.collect.loader import _read_ipc

        one = pa.concat_tables(_read_ipc(decode_records(dec_items[0][k:k + 8], settings).ipc)
                               for k in range(0, a.batches, 8))
        con.register("_round", one)
        for k in range(-(-a.prefill // one.num_rows)):
            con.execute(f"INSERT INTO spans_part BY NAME SELECT * REPLACE (md5(trace_id || 'prefill{k}') AS trace_id, "
                        f"start_ns - {(k + 1) * 10**12} AS start_ns) FROM _round")
        con.unregister("_round")
        con.execute("CHECKPOINT")
    prefilled = con.execute("SELECT count(*) FROM spans").fetchone()[0]
    health = Health()
    spool = Spool(d / f"spool-{layout}")
    loader = Loader(spool, con, settings, health, processes=a.processes or None).start()
    ing = Ingest(spool, settings, health)
    srv = OtlpHttpServer(ing, "127.0.0.1", 0).start()
    rows = []
    acked = 0
    for r, bodies in enumerate(rounds):
        dec_rate, dec_cpu = decode_only(dec_items[r])
        py_rate, py_cpu = decode_only(dec_items[r], py_settings) if a.python_decode else (0.0, 0.0)
        per = [bodies[i::a.clients] for i in range(a.clients)]
        start, q = ctx.Event(), ctx.Queue()
        clients = [ctx.Process(target=_client, args=(srv.port, b, start, q)) for b in per]
        for p in clients:
            p.start()
        time.sleep(0.5)
        kids = [p.pid for p in loader.pool._processes.values()] if loader.pool else []
        c_self0, c_kids0 = time.process_time(), sum(_cpu(k) for k in kids)
        c_loader0 = _thread_cpu(loader._thread.native_id)
        t0 = time.perf_counter()
        start.set()
        codes = [q.get() for _ in clients]
        t_acked = time.perf_counter() - t0
        ok = sum(c.get(200, 0) for c in codes)
        assert loader.wait_idle(600)
        # queryable: the count a reader's `agentobs sql` would see (segments: read through the spans view)
        assert con.execute("SELECT count(*) FROM spans").fetchone()[0] - prefilled == acked + ok * a.spans
        wall = time.perf_counter() - t0
        c_self, c_kids = time.process_time() - c_self0, sum(_cpu(k) for k in kids) - c_kids0
        c_loader = _thread_cpu(loader._thread.native_id) - c_loader0
        for p in clients:
            p.join()
        acked += ok * a.spans
        rows.append({"decode": dec_rate, "decode_cpu": dec_cpu, "e2e": total / wall, "ack": total / t_acked,
                     "self": c_self / total * 1e6, "kids": c_kids / total * 1e6, "ok": ok,
                     "loader": c_loader / total * 1e6, "py": py_rate, "py_cpu": py_cpu,
                     "r429": sum(c.get(429, 0) for c in codes), "load": os.getloadavg()[0]})
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_kids = [_hwm_mb(p.pid) for p in loader.pool._processes.values()] if loader.pool else []
    srv.stop()
    spool.close()
    loader.stop()
    stored = con.execute("SELECT count(*) FROM spans").fetchone()[0] - prefilled
    segs = con.execute("SELECT count(*) FROM span_segments").fetchone()[0]
    con.close()
    return {"rows": rows, "rss_self": rss_self, "rss_kids": rss_kids, "stored": stored, "acked": acked,
            "prefilled": prefilled, "segments": segs, "compacted": loader.compacted_segments}

if __name__ == "__main__":
    main()
