"""Scale benchmark of the weekly report: a week of N model calls, reported end to end.

Generates the calls with the metrics bench's generator (bench/metrics_scale.py: 15-call agent sessions,
8 instances, growing context, routed-away and evicted turns — all inside ISO week 2027-W02), then in the
same run times:

1. one window pass over ``llm_calls`` (previous call's prompt per session, summed) — the baseline;
2. ``agentobs.report.build`` for 2027-W02 (one metric preparation, every section, findings included);
3. ``agentobs.report.write`` (HTML, Markdown, CSV + Parquet of every table, atomic rename);

and prints them, the ratio to the baseline, the slowest steps and the peak memory (ru_maxrss).

    .venv/bin/python bench/report_week.py                    # 1M calls
    .venv/bin/python bench/report_week.py --calls 10000000   # the target: < 60 s on 2 cores
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from metrics_scale import BASELINE, GENERATE  # noqa: E402

from agentobs.config import Settings  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.report import build, iso_week, write  # noqa: E402
from agentobs.source import as_source

WEEK = "2027-W02"  # the generator's calls start at 1.8e9 s (2027-01-15) and span a day


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--db", default=None, help="DuckDB file to create (default: a temp file)")
    ap.add_argument("--no-findings", action="store_true", help="leave agentobs.findings out")
    ap.add_argument("--no-state", action="store_true",
                    help="no maintained session model: the report derives call_reuse (as before issue 22)")
    ap.add_argument("--existing", action="store_true",
                    help="--db already holds the generator's calls (e.g. a bench/metrics_scale.py --db store): "
                         "generate none; the maintained state is refreshed (current: nothing to do), not rebuilt")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    if args.existing and not (args.db and Path(args.db).exists()):
        raise SystemExit(f"--existing: no store at --db {args.db!r}")
    path = args.db or str(Path(tmp.name) / "bench.duckdb")
    con = connect(path)
    t = time.perf_counter()
    if args.existing:
        args.calls = con.execute("SELECT count(*) FROM spans_part").fetchall()[0][0]
    else:
        con.execute(GENERATE, {"n": args.calls})
        con.execute("CHECKPOINT")
    gen_s = time.perf_counter() - t
    if not args.no_state:  # what imports and collect keep current (agentobs.model.state)
        from agentobs.model import state

        built = (state.refresh if args.existing else state.rebuild)(con, Settings())
        con.execute("CHECKPOINT")
        print(f"maintained session model ({built.mode}): {built.seconds:.2f} s")
    con.close()

    con = connect(path, read_only=True)
    t = time.perf_counter()
    con.execute(BASELINE).fetchall()
    base_s = time.perf_counter() - t
    con.close()

    period = iso_week(WEEK)
    t = time.perf_counter()
    rep = build(as_source(path), period, Settings(), findings=None if args.no_findings else True)
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    out = write(rep, Path(tmp.name) / "report")
    write_s = time.perf_counter() - t
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
    size_mb = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6

    total = build_s + write_s
    print(f"calls: {args.calls:,} in {WEEK}  (generated in {gen_s:.1f} s); report has {rep.calls:,} calls")
    print(f"window pass over llm_calls (baseline):      {base_s:.2f} s")
    print(f"report build (prepare + sections{'' if args.no_findings else ' + findings'}): {build_s:.2f} s")
    print(f"report write ({len(rep.tables())} tables, {size_mb:.1f} MB):       {write_s:.2f} s")
    print(f"report total: {total:.2f} s  ({'under' if total < 60 else 'OVER'} the 60 s target); "
          f"ratio to the window pass: {total / base_s:.1f}x")
    print(f"peak memory (ru_maxrss): {peak_gib:.2f} GiB")
    steps = {k: v for k, v in rep.timings.items() if not k.startswith("prepare ")}
    print(f"timed steps sum to {sum(steps.values()):.2f} s of the build's {build_s:.2f} s")
    slow = sorted(rep.timings.items(), key=lambda kv: -kv[1])[:8]
    print("slowest steps: " + ", ".join(f"{k} {v:.2f} s" for k, v in slow))
    print(f"spend ${rep.figure('cost_usd').value:,.2f}; recompute tax ${rep.figure('reprefill_cost_usd').value:,.2f}")


if __name__ == "__main__":
    main()
