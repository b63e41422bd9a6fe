"""Merged span files merged again (``segments.plan_remerge``): what a quiet collector's many small merged files cost
its readers and its loader, and what merging them again costs and saves, measured in one run.

    .venv/bin/python bench/remerge.py [--files 1024] [--rows 64] [--repeat 5]

A quiet collector stores a request or two per loader batch, so each tail merge (``segment_compact_after`` / 2
segments) writes a merged file of a few dozen spans. The store is built as that collector leaves it: ``--files``
merged files of ``--rows`` spans each (bench/_spans.py spans decoded natively, each as a segment merged alone, as
the loader's merges would write them). Then, before and after ``segments.compact`` merges them again (the
collector's loader does it whenever it is idle):

- the ``spans`` view re-made (what every loader commit and merge does: ``segments.ensure_view``), ms;
- ``count(*)``, a GROUP BY session over ``spans``, a point lookup by (trace_id, span_id), and the session model's
  read after a segment mark (``segments.since_sql``), ms, medians of ``--repeat``;
- the merge again itself: wall s, and CPU µs per stored span (all levels: a span is rewritten once per size
  class it crosses).

The last line is machine-readable: ``files_before=<n> files_after=<m> view_ms_before=… view_ms_after=…
query_ms_before=… query_ms_after=… remerge_cpu_us_per_span=…``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _spans import payload  # noqa: E402

from agentobs.collect import otlp_native  # noqa: E402
from agentobs.config import load_settings  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.store import segments  # noqa: E402
from agentobs.store.db import transaction  # noqa: E402


def _ms(fn, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def reads(con, repeat: int) -> dict:
    cur = con.cursor()
    tid, sid = cur.execute("SELECT trace_id, span_id FROM spans LIMIT 1 OFFSET 7").fetchone()

    def view():
        with transaction(cur):
            segments.ensure_view(cur)

    mark = int(cur.execute("SELECT max(max_seq) FROM span_merged").fetchone()[0]) // 2
    q = {
        "view": view,
        "count": lambda: cur.execute("SELECT count(*) FROM spans").fetchall(),
        "group": lambda: cur.execute("SELECT session_id, sum(input_tokens), count(*) FROM spans GROUP BY 1").fetchall(),
        "point": lambda: cur.execute("SELECT name FROM spans WHERE trace_id = ? AND span_id = ?", [tid, sid]).fetchall(),
        "since": lambda: cur.execute(f"SELECT count(*) FROM ({segments.since_sql(cur, 'trace_id', mark)})").fetchall(),
    }
    return {k: _ms(f, repeat) for k, f in q.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=64, help="spans per small merged file")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    settings = load_settings(env={})
    one = otlp_native.decode_bodies([payload(512, s) for s in range(4)], ["otlp-http"] * 4, settings).table
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "q.duckdb"
        con = connect(db)
        d = segments.segments_dir(db)
        con.register("_one", one)
        t0 = time.perf_counter()
        for k in range(a.files):
            lo = (k * a.rows) % (one.num_rows - a.rows)
            t = con.sql(f"SELECT * REPLACE (md5(trace_id || '{k}') AS trace_id, start_ns + {k * 10**9} AS start_ns) "
                        f"FROM _one LIMIT {a.rows} OFFSET {lo}").to_arrow_table()
            seg = segments.write_segment(t, d)
            seq = segments.next_seq(con)
            f = segments.publish_file(seg, seq)
            with transaction(con):
                segments.add(con, seq, f, seg, (seq, 0))
            plan = segments.plan_merge(con, 1)
            segments.commit_merge(con, plan, segments.write_merge(plan))
        segments.sweep(con)
        build_s = time.perf_counter() - t0
        n = con.execute("SELECT count(*) FROM spans").fetchone()[0]
        files0 = segments.merged_count(con)
        before = reads(con, a.repeat)
        c0, w0 = time.process_time(), time.perf_counter()
        out = segments.compact(con)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        segments.sweep(con)
        files1 = segments.merged_count(con)
        after = reads(con, a.repeat)
        assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == n
        sizes = [r[0] for r in con.execute("SELECT rows FROM span_merged ORDER BY min_seq").fetchall()]
        con.close()
    print(f"store: {n:,} spans in {files0:,} merged files of {a.rows} spans (built in {build_s:.1f} s)")
    print(f"merged again: {out.remerged:,} files merged again -> {files1:,} files ({sizes[:6]}{' …' if len(sizes) > 6 else ''}"
          f" spans each), {wall:.2f} s wall, {cpu:.2f} s CPU")
    per_span = cpu * 1e6 / n  # all levels: a span is rewritten once per size class it crosses
    print(f"{'read (ms, median of ' + str(a.repeat) + ')':<32} {'before':>10} {'after':>10} {'ratio':>8}")
    for k in before:
        print(f"{k:<32} {before[k]:>10.2f} {after[k]:>10.2f} {before[k] / max(after[k], 1e-9):>7.1f}x")
    qb = sum(v for k, v in before.items() if k != "view")
    qa = sum(v for k, v in after.items() if k != "view")
    print(f"files_before={files0} files_after={files1} view_ms_before={before['view']:.2f} "
          f"view_ms_after={after['view']:.2f} query_ms_before={qb:.1f} query_ms_after={qa:.1f} "
          f"remerge_cpu_us_per_span={per_span:.2f}")


if __name__ == "__main__":
    main()
