"""The sustained cost per span of the segments layout (``span_store = segments``), compaction included, on an
empty store and on stores already holding ``--stored`` spans in merged Parquet files: is it flat?

    .venv/bin/python bench/span_compaction.py [--stored 0,2000000] [--cycles 3] [--per-batch 8] [--compact-after 32]

Each cycle is what the collector does under sustained load between two compactions: ``--compact-after`` loader
batches (``--per-batch`` bench payloads of 512 spans, bench/_spans.py, decoded natively into one Arrow table),
each written as a Parquet segment (the decoder process's part: ``segments.write_segment``, fsync'd) and published
(the loader thread's part: rename, catalog row + ``spool_loaded`` row + the ``spans`` view in one commit); then
the loader's compaction step (``segments.compact`` down to half, one merged file) and the sweep of the merged
small files. CPU time of this process (all threads, DuckDB's included) per span stored, per part, median over
the cycles; the store connection gets ``collect_memory_limit`` as ``agentobs collect`` does.

Prefill: one decoded round under new trace ids and earlier times, published as segments and merged into files
of ``--prefill-merge`` rounds (as compaction stores them). Reads after the cycles: ``count(*)`` and a GROUP BY
over ``spans``, and the session model's read of the spans after a segment mark (``segments.since_sql``), ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
from _spans import payload  # noqa: E402

from agentobs.collect import otlp_native  # noqa: E402
from agentobs.config import load_settings  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.store import segments  # noqa: E402
from agentobs.store.db import set_memory_limit  # noqa: E402

BASE_NS = 1_791_969_600_000_000_000


def _batch(seed0: int, per: int, spans: int, settings) -> pa.Table:
    bodies = [payload(spans, seed0 + i) for i in range(per)]
    return otlp_native.decode_bodies(bodies, ["otlp-http"] * per, settings).table


def _publish(con, seg: segments.SegmentFile) -> None:
    seq = segments.next_seq(con)
    f = segments.publish_file(seg, seq)
    con.execute("BEGIN")
    segments.add(con, seq, f, seg, (seq, 0))
    con.execute("INSERT INTO spool_loaded VALUES (?, 0, 1, ?, 0, now())", [seq, seg.rows])
    con.execute("COMMIT")


def _prefill(con, db, one: pa.Table, n: int, merge_every: int) -> None:
    d = segments.segments_dir(db)
    con.register("_round", one)
    for k in range(-(-n // one.num_rows)):
        t = con.sql(f"SELECT * REPLACE (md5(trace_id || 'prefill{k}') AS trace_id, "
                    f"start_ns - {(k + 1) * 10**12} AS start_ns) FROM _round").to_arrow_table()
        _publish(con, segments.write_segment(t, d))
        if (k + 1) % merge_every == 0:
            segments.compact(con)
    con.unregister("_round")
    segments.compact(con)
    segments.sweep(con)
    con.execute("CHECKPOINT")


def measure(d: Path, stored: int, a, settings, one: pa.Table) -> dict:
    db = d / f"s{stored}.duckdb"
    con = connect(db)
    if settings.collect_memory_limit:
        set_memory_limit(con, settings.collect_memory_limit)
    t0 = time.perf_counter()
    if stored:
        _prefill(con, db, one, stored, a.prefill_merge)
    prefill_s = time.perf_counter() - t0
    have = con.execute("SELECT count(*) FROM spans").fetchone()[0]
    files = con.execute("SELECT count(*) FROM span_merged").fetchone()[0]
    seg_dir = segments.segments_dir(db)
    write, publish, compact, n_total = [], [], [], 0
    seed = 0
    mark = segments.next_seq(con) - 1
    for _c in range(a.cycles):
        batches = []
        for _b in range(a.compact_after):
            batches.append(_batch(seed, a.per_batch, a.spans, settings))
            seed += a.per_batch
        n = sum(t.num_rows for t in batches)
        c0 = time.process_time()
        segs = [segments.write_segment(t, seg_dir) for t in batches]
        c1 = time.process_time()
        for s in segs:
            _publish(con, s)
        c2 = time.process_time()
        segments.compact(con, group=a.compact_after, keep=a.compact_after // 2)
        segments.sweep(con)
        c3 = time.process_time()
        write.append((c1 - c0) / n * 1e6)
        publish.append((c2 - c1) / n * 1e6)
        compact.append((c3 - c2) / n * 1e6 * 2)  # half the cycle's segments merged: per span merged
        n_total += n
    t = time.perf_counter()
    count = con.execute("SELECT count(*) FROM spans").fetchone()[0]
    con.execute("SELECT session_id, sum(input_tokens), count(*) FROM spans GROUP BY 1").fetchall()
    read_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    con.execute(f"SELECT count(*) FROM ({segments.since_sql(con, 'trace_id', mark)})").fetchone()
    since_ms = (time.perf_counter() - t) * 1e3
    assert count == have + n_total, (count, have, n_total)  # each span once
    assert con.execute("SELECT count(*) FROM spans_part").fetchone()[0] == 0  # no DuckDB table part
    out = {"stored": have, "files": files, "prefill_s": prefill_s, "write": statistics.median(write),
           "publish": statistics.median(publish), "compact": statistics.median(compact), "read_ms": read_ms,
           "since_ms": since_ms, "after": count,
           "files_after": con.execute("SELECT count(*) FROM span_merged").fetchone()[0]}
    con.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stored", default="0,2000000", help="spans stored before, comma-separated")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--per-batch", type=int, default=8, help="payloads per loader batch (one segment)")
    ap.add_argument("--spans", type=int, default=512)
    ap.add_argument("--compact-after", type=int, default=32)
    ap.add_argument("--prefill-merge", type=int, default=8, help="prefill rounds (30,720 spans) per merged file")
    a = ap.parse_args()
    settings = load_settings(env={})
    otlp_native.warm_up(settings)
    one = pa.concat_tables(_batch(10**6 + k * a.per_batch, a.per_batch, a.spans, settings) for k in range(8))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for stored in [int(x) for x in a.stored.split(",")]:
            rows.append(measure(Path(d), stored, a, settings, one))
    print(f"cycles of {a.compact_after} segments x {a.per_batch * a.spans:,} spans, compaction to half each cycle, "
          f"median of {a.cycles}; collect_memory_limit {settings.collect_memory_limit}")
    print("stored before  merged files   µs CPU/span: write (decoder) + publish (loader) + merge (loader) = sum"
          "   reads after (ms): count + group by, since mark   prefill s")
    for r in rows:
        total = r["write"] + r["publish"] + r["compact"]
        print(f"{r['stored']:13,}  {r['files']:5d} → {r['files_after']:<5d}  {r['write']:8.1f} + {r['publish']:8.1f} + "
              f"{r['compact']:8.1f} = {total:5.1f}{'':21s}{r['read_ms']:8.0f}, {r['since_ms']:6.0f}{'':15s}"
              f"{r['prefill_s']:6.0f}")
    first, last = rows[0], rows[-1]
    print(f"sustained_us_per_span_empty={first['write'] + first['publish'] + first['compact']:.1f} "
          f"sustained_us_per_span_at_{last['stored']}={last['write'] + last['publish'] + last['compact']:.1f}")


if __name__ == "__main__":
    main()
