"""Storage layout for the loader's batches, by measurement: CPU µs per span of each way to make a decoded
batch durable and queryable, on an empty store and on one that already holds ``--prefill`` spans.

    .venv/bin/python bench/store_layout.py [--batches 16] [--spans 512] [--per-batch 8] [--prefill 2000000]

Batches are the loader's: ``--per-batch`` bench payloads (bench/_spans.py, 512 spans each) decoded natively into
one Arrow table. Ways measured (each timed over the same batches, CPU time of this process, all threads):

* ``duckdb insert_spans``: today's — one transaction per batch: ``store.writer.insert_spans`` (append, skip
  spans already stored in the batch's start_ns window) + the ``spool_loaded`` row.
* ``duckdb append``: the same transaction with a plain ``INSERT`` (no dedupe).
* ``parquet segment``: the batch written as one Parquet file (zstd / snappy / uncompressed), fsync'd, renamed
  into place, and a catalog row committed in DuckDB.
* ``compaction``: Parquet segments moved into DuckDB with ``insert_spans`` (what a segments-then-DuckDB layout
  pays later, per span).

And the read side: ``count(*)`` and a GROUP BY over the stored spans as a DuckDB table vs a view over the
segments (``read_parquet`` of a glob).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from _spans import payload  # noqa: E402

from agentobs.collect import otlp_native  # noqa: E402
from agentobs.config import load_settings  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.store.writer import insert_spans  # noqa: E402


def _cpu() -> float:
    return time.process_time()


def _batches(n: int, per: int, spans: int, seed0: int) -> list[pa.Table]:
    s = load_settings(env={})
    out = []
    for b in range(n):
        bodies = [payload(spans, seed0 + b * per + i) for i in range(per)]
        out.append(otlp_native.decode_bodies(bodies, ["otlp-http"] * per, s).table)
    return out


def _prefill(con: duckdb.DuckDBPyConnection, one: pa.Table, n: int) -> None:
    con.register("_round", one)
    for k in range(-(-n // one.num_rows)):
        con.execute(f"INSERT INTO spans_part BY NAME SELECT * REPLACE (md5(trace_id || 'prefill{k}') AS trace_id, "
                    f"start_ns - {(k + 1) * 10**12} AS start_ns) FROM _round")
    con.unregister("_round")
    con.execute("CHECKPOINT")


def _tx(con, fn) -> None:
    con.execute("BEGIN")
    fn(con)
    con.execute("INSERT INTO spool_loaded VALUES (1, 1, 1, 1, 0, now())")
    con.execute("COMMIT")


def measure(d: Path, batches: list[pa.Table], prefill: int, prefill_table: pa.Table) -> dict[str, float]:
    n = sum(t.num_rows for t in batches)
    res = {}
    for way in ("duckdb insert_spans", "duckdb append"):
        db = d / f"{way.replace(' ', '_')}.duckdb"
        con = connect(db)
        con.execute("SET memory_limit = '512MB'")
        if prefill:
            _prefill(con, prefill_table, prefill)
        c0 = _cpu()
        for t in batches:
            if way == "duckdb insert_spans":
                _tx(con, lambda c, t=t: insert_spans(c, t))
            else:
                con.register("_b", t)
                _tx(con, lambda c: c.execute("INSERT INTO spans_part BY NAME SELECT * FROM _b"))
                con.unregister("_b")
        res[way] = (_cpu() - c0) / n * 1e6
        if way == "duckdb insert_spans":
            c0 = time.perf_counter()
            con.execute("SELECT count(*) FROM spans").fetchone()
            con.execute("SELECT session_id, sum(input_tokens), count(*) FROM spans GROUP BY 1").fetchall()
            res["read: count + group by, duckdb table (ms)"] = (time.perf_counter() - c0) * 1e3
        con.close()
    for comp in ("zstd", "snappy", "none"):
        seg = d / f"seg-{comp}"
        seg.mkdir()
        con = connect(d / f"cat-{comp}.duckdb")
        con.execute("CREATE TABLE IF NOT EXISTS span_segments (path VARCHAR, rows BIGINT)")
        c0 = _cpu()
        for k, t in enumerate(batches):
            tmp = seg / f"{k:08d}.parquet.tmp"
            pq.write_table(t, tmp, compression=comp, row_group_size=1 << 20)
            fd = os.open(tmp, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            os.replace(tmp, seg / f"{k:08d}.parquet")
            _tx(con, lambda c, k=k, t=t: c.execute("INSERT INTO span_segments VALUES (?, ?)", [f"{k:08d}", t.num_rows]))
        res[f"parquet segment ({comp})"] = (_cpu() - c0) / n * 1e6
        if comp == "zstd":
            c0 = time.perf_counter()
            glob = f"read_parquet('{seg}/*.parquet')"
            con.execute(f"SELECT count(*) FROM {glob}").fetchone()
            con.execute(f"SELECT session_id, sum(input_tokens), count(*) FROM {glob} GROUP BY 1").fetchall()
            res["read: count + group by, parquet segments (ms)"] = (time.perf_counter() - c0) * 1e3
            store = connect(d / "compacted.duckdb")
            store.execute("SET memory_limit = '512MB'")
            if prefill:
                _prefill(store, prefill_table, prefill)
            c0 = _cpu()
            files = sorted(seg.glob("*.parquet"))
            for i in range(0, len(files), 4):  # 4 segments per compaction transaction
                t = pa.concat_tables(pq.read_table(f) for f in files[i:i + 4])
                _tx(store, lambda c, t=t: insert_spans(c, t))
            res["compaction: segments → duckdb insert_spans"] = (_cpu() - c0) / n * 1e6
            store.close()
        con.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--spans", type=int, default=512)
    ap.add_argument("--per-batch", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=2_000_000)
    a = ap.parse_args()
    batches = _batches(a.batches, a.per_batch, a.spans, 0)
    n = sum(t.num_rows for t in batches)
    print(f"{a.batches} batches x {batches[0].num_rows} spans = {n:,} spans; load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as d:
        for prefill in sorted({0, a.prefill}):
            sub = Path(d) / f"p{prefill}"
            sub.mkdir()
            t0 = time.perf_counter()
            res = measure(sub, batches, prefill, batches[0])
            print(f"-- stored before: {prefill:,} spans ({time.perf_counter() - t0:.0f} s, load "
                  f"{os.getloadavg()[0]:.1f})")
            for k, v in res.items():
                print(f"   {k:48s} {v:8.2f}" + ("" if "(ms)" in k else " µs CPU/span"))


if __name__ == "__main__":
    main()
