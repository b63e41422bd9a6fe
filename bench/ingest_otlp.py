"""OTLP/HTTP ingest: sustained end-to-end spans/s until queryable, and in the same run the decode-only
rate of the same payloads, and their ratio.

    .venv/bin/python bench/ingest_otlp.py [--batches 960] [--clients 4] [--rounds 3] [--prefill N]
                                          [--decoder native|python] [--python-decode]
                                          [--span-store table|segments] [--compact-after N]

Payloads: batches of 512 realistic GenAI chat spans (bench/_spans.py: 20 attributes, 7 resource
attributes), protobuf. The receiver runs in this process as `agentobs collect` runs it: HTTP server →
spool (acknowledged once fsync'd) → loader (``--processes`` decoder processes, default one per core) →
the store in the layout ``--span-store`` names (``table``: the loader thread inserts into DuckDB;
``segments``: the decoders write Parquet segments, the loader thread commits their catalog rows and, every
``--compact-after`` segments, lists the oldest half as merged files (large ones as they are, small ones merged into
one Parquet file); default: the setting ``span_store``). The clients run in separate processes, each with a keep-alive connection, posting pre-built
payloads and waiting for each 200 before the next export (like an OTLP exporter); a round's clock starts once
every client has built its payloads.

End to end = from the first request until the loader has committed every acknowledged span to the
store (what `agentobs sql` then reads; the count is checked with a query). Decode-only = the loader's
own decode of the same bodies (``decode_records``: spool read → the ``--decoder`` (default native:
otlp_native.py) → Arrow table → IPC, in batches of ``loader_batch_mb`` as the loader's) in one process, alternated with the end-to-end rounds so both see
the same machine load; ``--python-decode`` also times otlp.py's decode of them (the reference). ``--prefill`` stores N spans first, in a process of its
own (copies of round 1 under new trace ids and earlier times, older than the rounds' spans; segments layout:
published as segments and merged into Parquet files of ``--prefill-merge`` rounds each, as the collector's
compaction stores them), to see the rate at a large stored count: the collector then opens the store as it would
after a restart.

CPU per span of the end-to-end rounds is split into this process (HTTP handlers, spool, loader thread, merge
thread and DuckDB's and Arrow's threads; the loader thread's own share in parentheses, and a line per kind of
thread; the bench's own memory sampler's CPU left out) and the decoder processes, taken before the bench's own
count check (whose CPU is printed beside each round). The store
connection gets ``collect_memory_limit`` as ``agentobs collect`` does.

Memory (from the first round on), per process of the collector — this process (receivers, spool, loader thread, DuckDB), the
forkserver the decoders are forked from, each decoder — as ``agentobs collect`` would hold it: the clients
build their own payloads and the decode-only rounds run in a separate process, so none of the bench's own
data is in these figures. Peak RSS (VmHWM) of each, and the peak of their summed PSS sampled every 0.25 s (RSS counts the
shared libraries' pages — numpy, pyarrow, DuckDB — once per process; PSS splits them between the processes
sharing them, so the summed PSS is the collector's real footprint).

The last line is machine-readable:
``e2e_spans_per_s=<N> decode_only_spans_per_s=<M> ratio=<N/M> stored=<rows> acked=<spans>``.
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
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import forkserver
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
from agentobs.store import segments  # noqa: E402
from agentobs.store.db import set_memory_limit  # noqa: E402


def _client(port, seeds, spans, ready, start, q):
    bodies = [payload(spans, seed) for seed in seeds]  # built here: the receiver process holds no payloads
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    ready.put(os.getpid())  # built: the round's clock starts once every client is (their build is not timed)
    start.wait()
    c0 = time.process_time()
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
    q.put((codes, time.process_time() - c0))


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


def _pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _kind(name: str) -> str:
    """What a thread of this process does, by its Python name (threads without one: DuckDB's and Arrow's pools)."""
    if name == "agentobs-loader":
        return "loader thread"
    if name == "agentobs-spool":
        return "spool writer"
    if name.startswith("agentobs-merge"):
        return "merge thread"
    if "process_request" in name:
        return "HTTP handlers"
    if name in ("MainThread", "bench-sampler"):
        return "bench"
    if name == "":
        return "native (DuckDB, Arrow)"
    return "other Python"


class PssSampler(threading.Thread):
    """The peak of the summed PSS of ``pids()`` (and each one's PSS then), sampled every 0.25 s; and the CPU of each
    thread of this process as last seen (``threads``: tid -> [kind, CPU s]; a thread that ended keeps its last)."""

    def __init__(self, pids):
        super().__init__(daemon=True, name="bench-sampler")
        self.pids, self.peak, self.at_peak = pids, 0.0, {}
        self.done = threading.Event()
        self.cpu = 0.0  # this thread's CPU seconds so far (reading smaps_rollup: ~0.9 ms a process): not the collector's
        self.threads: dict[int, list] = {}

    def sample_threads(self) -> dict[int, list]:
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid in os.listdir("/proc/self/task"):
            try:
                cpu = _thread_cpu(int(tid))
            except OSError:
                continue
            ent = self.threads.setdefault(int(tid), [_kind(names.get(int(tid), "")), 0.0])
            ent[1] = cpu
        return {k: list(v) for k, v in self.threads.items()}

    def run(self):
        while not self.done.wait(0.25):
            each = {pid: _pss_mb(pid) for pid in self.pids()}
            if sum(each.values()) > self.peak:
                self.peak, self.at_peak = sum(each.values()), each
            self.sample_threads()
            self.cpu = time.thread_time()


def _by_kind(before: dict[int, list], after: dict[int, list]) -> dict[str, float]:
    out: dict[str, float] = {}
    for tid, (kind, cpu) in after.items():
        out[kind] = out.get(kind, 0.0) + cpu - (before[tid][1] if tid in before else 0.0)
    return out


def _prefill_segment(con, db, table) -> None:
    """Publish ``table`` as the loader publishes a decoder's segment (file, rename, catalog row + view)."""
    seg = segments.write_segment(table, segments.segments_dir(db))
    seq = segments.next_seq(con)
    f = segments.publish_file(seg, seq)
    con.execute("BEGIN")
    segments.add(con, seq, f, seg, (0, 0))
    con.execute("COMMIT")


def _prefill(db: str, items, batches: int, n: int, merge_every: int, env: dict) -> None:
    """Store ``n`` spans in ``db`` first: copies of round 1 (decoded as the loader does) under new trace ids and
    earlier times (each copy 10,000 s before the last, so none overlaps the rounds' spans, 1 ms apart: the stored
    spans are older than the new ones, as a collector's are), in the layout the settings name (segments: published
    as segments and merged into Parquet files of ``merge_every`` copies each, as the collector's compaction stores
    them). Run in a separate process, so that the collector measured after it holds none of this work's memory."""
    import pyarrow as pa

    from agentobs.collect.loader import _read_ipc

    settings = load_settings(env=env)
    con = connect(db)
    one = pa.concat_tables(_read_ipc(decode_records(items[k:k + 8], settings).ipc) for k in range(0, batches, 8))
    con.register("_round", one)
    for k in range(-(-n // one.num_rows)):
        shifted = (f"SELECT * REPLACE (md5(trace_id || 'prefill{k}') AS trace_id, "
                   f"start_ns - {(k + 1) * 10**13} AS start_ns) FROM _round")
        if settings.span_store == "segments":
            _prefill_segment(con, db, con.sql(shifted).to_arrow_table())
            if (k + 1) % merge_every == 0:
                segments.compact(con)
        else:
            con.execute(f"INSERT INTO spans_part BY NAME {shifted}")
    con.unregister("_round")
    if settings.span_store == "segments":
        segments.compact(con)
        segments.sweep(con)
    con.execute("CHECKPOINT")
    con.close()


def _decode_only(items, decoder: str, total: int):
    """Decode-only of ``items`` in this (separate) process: spans/s and µs CPU/span."""
    s = load_settings(env={"AGENTOBS_LOADER_DECODER": decoder})
    decode_records(items[:1], s)  # warm-up (imports, first Arrow table)
    # batches of up to loader_batch_mb, as the loader reads them from a spool with requests waiting
    cap, batches, cur, size = int(s.loader_batch_mb * 1024 * 1024), [], [], 0
    for it in items:
        if cur and size + it[2] > cap:
            batches.append(cur)
            cur, size = [], 0
        cur.append(it)
        size += it[2]
    batches += [cur] if cur else []
    t0, c0 = time.perf_counter(), time.process_time()
    for batch in batches:
        b = decode_records(batch, s)
        assert b.rejected == 0
    return total / (time.perf_counter() - t0), (time.process_time() - c0) / total * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=960,
                    help="exports per round (960: rounds of ≈ 4 s; 60 mostly measures filling and draining the pipeline)")
    ap.add_argument("--spans", type=int, default=512)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--processes", type=int, default=0, help="loader decoder processes (0: one per core)")
    ap.add_argument("--prefill", type=int, default=0, help="spans stored before the first round")
    ap.add_argument("--decoder", choices=("native", "python"), default="native", help="the loader's decoder")
    ap.add_argument("--span-store", choices=("table", "segments"), default=None,
                    help="the store layout (span_store; default: the setting)")
    ap.add_argument("--compact-after", type=int, default=None,
                    help="segment_compact_after for the segments layout (default: the setting)")
    ap.add_argument("--prefill-merge", type=int, default=16,
                    help="segments layout: prefill rounds merged into one Parquet file (as compaction would)")
    ap.add_argument("--python-decode", action="store_true",
                    help="also time otlp.py's decode-only of the same bodies (the reference)")
    a = ap.parse_args()
    env = {**os.environ, "AGENTOBS_LOADER_DECODER": a.decoder}  # other AGENTOBS_* apply
    if a.span_store:
        env["AGENTOBS_SPAN_STORE"] = a.span_store
    if a.compact_after is not None:
        env["AGENTOBS_SEGMENT_COMPACT_AFTER"] = str(a.compact_after)
    settings = load_settings(env=env)
    procs_n = a.processes or default_processes()
    seeds = [[r * a.batches + i for i in range(a.batches)] for r in range(a.rounds)]
    total = a.batches * a.spans
    ctx = mp.get_context("fork")

    with tempfile.TemporaryDirectory() as d:
        # the decode-only measurement reads the bodies from a spool, as the loader's decoders do
        dspool = Spool(Path(d) / "decode-spool", fsync=False, max_unloaded_bytes=1 << 40)  # (never loaded)
        dec_items = []
        mb = 0.0
        for r, round_seeds in enumerate(seeds):
            for seed in round_seeds:
                b = payload(a.spans, seed)
                mb += len(b) / 1e6 / a.rounds
                dspool.append(b, "protobuf", "http")
            recs = dspool.read_from(0, 0, 10**9, 1 << 40)[r * a.batches:]
            dec_items.append([(str(dspool.path(x.seq)), x.offset, x.length, x.fmt, x.transport, x.seq) for x in recs])
        # decode-only runs in its own process (forked from the forkserver before this one holds DuckDB)
        dec_pool = ProcessPoolExecutor(1, mp_context=mp.get_context("forkserver"))

        def decode_only(items, decoder=a.decoder):
            return dec_pool.submit(_decode_only, items, decoder, total).result()

        db = Path(d) / "bench.duckdb"
        if a.prefill:  # in a process of its own: the collector below starts on the stored spans as a restart would
            with ProcessPoolExecutor(1, mp_context=mp.get_context("forkserver")) as once:
                once.submit(_prefill, str(db), dec_items[0], a.batches, a.prefill, a.prefill_merge, env).result()
        con = connect(db)
        if settings.collect_memory_limit:
            set_memory_limit(con, settings.collect_memory_limit)
        prefilled = con.execute("SELECT count(*) FROM spans").fetchone()[0]
        try:  # the peak RSS from here on: the collector running, not the prefill's own work
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        health = Health()
        spool = Spool(Path(d) / "spool")
        loader = Loader(spool, con, settings, health, processes=a.processes or None).start()
        ing = Ingest(spool, settings, health)
        srv = OtlpHttpServer(ing, "127.0.0.1", 0).start()
        fs_pid = getattr(forkserver._forkserver, "_forkserver_pid", None)  # the decoders' forkserver (CPython)
        collector = [os.getpid()] + ([fs_pid] if fs_pid else [])
        sampler = PssSampler(lambda: collector + ([p.pid for p in loader.pool._processes.values()] if loader.pool
                                                  else []))
        sampler.start()
        rows = []
        acked = 0
        for r, round_seeds in enumerate(seeds):
            dec_rate, dec_cpu = decode_only(dec_items[r])
            py_rate, py_cpu = decode_only(dec_items[r], "python") if a.python_decode else (0.0, 0.0)
            per = [round_seeds[i::a.clients] for i in range(a.clients)]
            start, ready, q = ctx.Event(), ctx.Queue(), ctx.Queue()
            clients = [ctx.Process(target=_client, args=(srv.port, b, a.spans, ready, start, q)) for b in per]
            for p in clients:
                p.start()
            for _ in clients:  # the clients build their payloads
                ready.get()
            time.sleep(0.2)
            kids = [p.pid for p in loader.pool._processes.values()] if loader.pool else []
            c_self0, c_kids0 = time.process_time() - sampler.cpu, sum(_cpu(k) for k in kids)
            c_loader0 = _thread_cpu(loader._thread.native_id)
            thr0 = sampler.sample_threads()
            t0 = time.perf_counter()
            start.set()
            got = [q.get() for _ in clients]
            codes = [g[0] for g in got]
            t_acked = time.perf_counter() - t0
            ok = sum(c.get(200, 0) for c in codes)
            assert loader.wait_idle(600)
            # the collector's CPU: taken before the bench's own check below (a count over the whole store, whose
            # cost grows with it: 10M stored spans made it ~17 µs per span of a round)
            c_self, c_kids = time.process_time() - sampler.cpu - c_self0, sum(_cpu(k) for k in kids) - c_kids0
            c_loader = _thread_cpu(loader._thread.native_id) - c_loader0
            kinds = _by_kind(thr0, sampler.sample_threads())
            # queryable: the count a reader's `agentobs sql` would see (segments: read through the spans view)
            c_q = time.process_time()
            assert con.execute("SELECT count(*) FROM spans").fetchone()[0] - prefilled == acked + ok * a.spans
            wall = time.perf_counter() - t0
            c_q = time.process_time() - c_q
            for p in clients:
                p.join()
            acked += ok * a.spans
            rows.append({"decode": dec_rate, "decode_cpu": dec_cpu, "e2e": total / wall, "ack": total / t_acked,
                         "self": c_self / total * 1e6, "kids": c_kids / total * 1e6, "ok": ok,
                         "loader": c_loader / total * 1e6, "py": py_rate, "py_cpu": py_cpu,
                         "r429": sum(c.get(429, 0) for c in codes), "load": os.getloadavg()[0],
                         "clients": sum(g[1] for g in got) / total * 1e6,
                         "query_ms": c_q * 1e3, "kinds": {k: v / total * 1e6 for k, v in kinds.items()}})
        rss_self = _hwm_mb(os.getpid())
        rss_kids = [_hwm_mb(p.pid) for p in loader.pool._processes.values()] if loader.pool else []
        rss_fs = _hwm_mb(fs_pid) if fs_pid else 0.0
        sampler.done.set()
        sampler.join()
        dec_pool.shutdown()
        srv.stop()
        spool.close()
        loader.stop()
        stored = con.execute("SELECT count(*) FROM spans").fetchone()[0] - prefilled
        segs = con.execute("SELECT count(*) FROM span_segments").fetchone()[0]
        n_merged, merged_rows = con.execute("SELECT count(*), coalesce(sum(rows), 0) FROM span_merged").fetchone()
        in_table = con.execute("SELECT count(*) FROM spans_part").fetchone()[0]
        con.close()
    print(f"span_store = {settings.span_store}"
          + (f" (segments merged {loader.compacted_segments}, left {segs}; segment_compact_after "
             f"{settings.segment_compact_after}; {n_merged} merged Parquet files, {merged_rows:,} rows)"
             if settings.span_store == "segments" else "") + f"; rows in the DuckDB table spans_part: {in_table:,}")
    print(f"payloads: {a.rounds} rounds x {a.batches} x {a.spans} spans, {mb:.1f} MB protobuf a round, "
          f"{a.clients} client processes, {procs_n} decoder processes, {prefilled:,} spans stored before, "
          f"{os.cpu_count()} CPUs")
    print("round  decode-only spans/s (µs CPU)   acked spans/s   end-to-end spans/s  ratio   µs CPU/span: "
          "receiver process (of it loader thread) + decoders   429s  load")
    for i, r in enumerate(rows):
        print(f"{i + 1:5d}  {r['decode']:10,.0f} ({r['decode_cpu']:5.1f})    {r['ack']:12,.0f}   {r['e2e']:12,.0f}"
              f"       {r['e2e'] / r['decode']:5.0%}   {r['self']:6.1f} ({r['loader']:5.1f}) + {r['kids']:5.1f}"
              f"{'':22s}{r['r429']:4d}  {r['load']:.1f}  (the count check: {r['query_ms']:,.0f} ms CPU)")
        if r["py"]:
            print(f"       otlp.py decode-only {r['py']:10,.0f} spans/s ({r['py_cpu']:.1f} µs CPU/span)")
    kinds = sorted({k for r in rows for k in r["kinds"] if k != "bench"})
    print("µs CPU/span of the receiver process by thread, per round: "
          + "; ".join(f"{k} {' / '.join(format(r['kinds'].get(k, 0.0), '.1f') for r in rows)}" for k in kinds))
    print("µs CPU/span of the load generator (the client processes, on the same cores), per round: "
          + " / ".join(format(r["clients"], ".1f") for r in rows))
    med = {k: statistics.median(r[k] for r in rows) for k in ("decode", "e2e", "decode_cpu", "self", "kids", "loader")}
    print(f"median decode only (one process):       {med['decode']:10,.0f} spans/s ({med['decode_cpu']:.1f} µs CPU/span)")
    print(f"median end to end (stored, queryable):  {med['e2e']:10,.0f} spans/s "
          f"({med['self']:.1f} + {med['kids']:.1f} µs CPU/span; loader thread {med['loader']:.1f})")
    print(f"peak RSS: receiver process {rss_self:,.0f} MB, forkserver {rss_fs:,.0f} MB, decoders "
          f"{', '.join(f'{x:,.0f}' for x in rss_kids)} MB (sum {rss_self + rss_fs + sum(rss_kids):,.0f} MB)")
    print(f"peak summed PSS: {sampler.peak:,.0f} MB (receiver process, forkserver, decoders: "
          f"{', '.join(f'{x:,.0f}' for x in sampler.at_peak.values())} MB)")
    print(f"exports ok {sum(r['ok'] for r in rows)}/{a.batches * a.rounds}, rows stored {stored:,}")
    if hasattr(loader, "commits"):  # (a release before grouped commits has no count)
        print(f"loader: {loader.stored_batches} batches stored in {loader.commits} commits")
    assert stored == acked, "every acknowledged span must be stored once"
    print(f"e2e_spans_per_s={med['e2e']:.0f} decode_only_spans_per_s={med['decode']:.0f} "
          f"ratio={med['e2e'] / med['decode']:.2f} stored={stored + prefilled} acked={acked}")


if __name__ == "__main__":
    main()
