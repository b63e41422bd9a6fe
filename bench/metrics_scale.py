"""Scale benchmark of the metric suite.

Generates N model calls of realistic agent sessions (15 calls per session, context growing by ~1.5k
tokens a turn, 12–27 s tool gaps, 8 instances with 5% of turns routed away, 75% full / 15% partial /
10% missed prefix hits, 1% failed calls, 0.5% of calls with a 40-gap ITL array) directly in DuckDB
with SQL, then in the same run times:

0. the maintained session model built whole (``agentobs.model.state.rebuild``: what ``agentobs model rebuild``
   does once; afterwards imports and collect keep it current incrementally);
1. one window pass over ``llm_calls`` (previous call's prompt per session, summed) — the baseline;
2. the whole metric suite (``agentobs.metrics.compute_all``: one preparation + every metric) from the maintained
   state (``--derived``: also the suite deriving call_reuse as without the state, side by side);
3. the incremental refresh of the state after each of ``--batches`` batches of ``--batch`` new calls (new
   sessions, inside the data's time range) at the stored count, wall and CPU seconds, by step (``Refreshed.steps``:
   ``commit`` is the transaction's end, with DuckDB's automatic checkpoint when one falls due);

and prints them, the suite's ratio to the window pass, the process's peak memory (ru_maxrss: DuckDB runs
in-process) and the suite split into the shared preparation and the metrics' own queries. The last line is
machine-readable: ``ratio=<suite ÷ window pass> suite_s=<s> window_s=<s> calls=<N>``.

    .venv/bin/python bench/metrics_scale.py                 # 1M calls
    .venv/bin/python bench/metrics_scale.py --calls 10000000
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentobs.config import Settings  # noqa: E402
from agentobs.metrics import names, prepare  # noqa: E402
from agentobs.model import connect, state  # noqa: E402
from agentobs.source import as_source

GENERATE = """
INSERT INTO spans_part (trace_id, span_id, name, kind, start_ns, end_ns, status_code, role, op, session_id, task_id,
                   task_type, attempt, branch, instance, engine, model, input_tokens, cached_tokens, output_tokens,
                   ttft_s, itl_ms)
WITH c AS (
    SELECT i, i // 15 AS s, i % 15 AS k,
           (hash(i, 1) % 10000) / 10000.0 AS u1, (hash(i, 2) % 10000) / 10000.0 AS u2,
           (hash(i, 3) % 10000) / 10000.0 AS u3, (hash(i - 1, 1) % 10000) / 10000.0 AS u1_prev,
           (hash(i, 5) % 10000) / 10000.0 AS u5, (hash(i // 15, 4) % 10000) / 10000.0 AS us
    FROM range($n) t(i)
),
t AS (
    SELECT *,
           3000 + k * 1500 + CAST(u1 * 500 AS BIGINT) AS p,
           3000 + (k - 1) * 1500 + CAST(u1_prev * 500 AS BIGINT) AS p_prev,
           1.8e9 + us * 86400 + k * 30 + u2 * 5 AS t0,
           3 + u3 * 10 AS dur
    FROM c
)
SELECT printf('t%015x', s), printf('%016x', i), 'chat', 3,
       CAST(t0 * 1e9 AS BIGINT), CAST((t0 + dur) * 1e9 AS BIGINT),
       CASE WHEN u5 > 0.99 THEN 2 ELSE 0 END, 'gateway', 'chat',
       printf('sess-%d', s), printf('task-%d', s), CASE s % 3 WHEN 0 THEN 'swe' WHEN 1 THEN 'research' ELSE 'data' END,
       1, 'main',
       printf('10.0.0.%d:8000', CASE WHEN u2 > 0.95 THEN (s + 1) % 8 ELSE s % 8 END), 'vllm', 'Qwen/Qwen3-32B',
       p,
       CASE WHEN k = 0 THEN 2048 WHEN u5 < 0.75 THEN (p_prev // 16) * 16 WHEN u5 < 0.9 THEN 2048 ELSE 0 END,
       100 + CAST(u3 * 300 AS BIGINT),
       0.1 + u1 * 0.5,
       CASE WHEN u3 < 0.005 THEN list_transform(range(40), lambda x: 20.0 + (hash(i, x) % 100) * CASE WHEN x % 13 = 0 THEN 4 ELSE 1 END) END
FROM t
"""

# a batch of calls numbered [lo, n): the next sessions, inside the same day (the incremental refresh's input)
BATCH = GENERATE.replace("range($n)", "range($lo, $n)")

# the instances' engine config: vLLM, 16-token blocks, a pool of $blocks blocks (--pool-blocks)
POOL = """
INSERT INTO engine_config (instance, ts, engine, key, value, source)
SELECT printf('10.0.0.%d:8000', i), TIMESTAMP '2027-01-01', 'vllm', k, CASE k WHEN 'block_size' THEN '16' ELSE $blocks END,
       'bench'
FROM range(8) t(i), (VALUES ('block_size'), ('num_gpu_blocks')) v(k)
"""

BASELINE = """
SELECT sum(prev_p) FROM (
    SELECT lag(prompt_tokens) OVER (PARTITION BY session_id ORDER BY start_ts) AS prev_p FROM llm_calls
)
"""


def _progress(what: str) -> None:
    """A figure as soon as it is measured (stderr): a long run that is stopped still leaves what it measured."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--db", default=None, help="DuckDB file to create (default: a temp file)")
    ap.add_argument("--memory-limit", default="7GB", help="DuckDB memory_limit for the run (it spills beyond)")
    ap.add_argument("--derived", action="store_true", help="also time the suite deriving call_reuse (no state)")
    ap.add_argument("--batch", type=int, default=10_000, help="calls per incremental batch")
    ap.add_argument("--batches", type=int, default=3, help="incremental batches to time")
    ap.add_argument("--existing", action="store_true",
                    help="--db already holds this script's calls (an earlier run's store): generate none, rebuild the "
                         "state; the batches follow its calls")
    ap.add_argument("--pool-blocks", type=int, default=0,
                    help="give every instance a KV pool of this many 16-token blocks (engine config), so the instance "
                         "evidence runs (default: no pool size, no instance evidence)")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    if args.existing and not (args.db and Path(args.db).exists()):
        raise SystemExit(f"--existing: no store at --db {args.db!r}")
    path = args.db or str(Path(tmp.name) / "bench.duckdb")
    con = connect(path)
    con.execute("SET memory_limit = ?", [args.memory_limit])
    t = time.perf_counter()
    if args.existing:
        args.calls = con.execute("SELECT count(*) FROM spans_part").fetchall()[0][0]  # call i is span i: 0 .. N − 1
    else:
        con.execute(GENERATE, {"n": args.calls})
    if args.pool_blocks:
        con.execute(POOL, {"blocks": str(args.pool_blocks)})
    con.execute("CHECKPOINT")
    gen_s = time.perf_counter() - t
    _progress(f"{'found' if args.existing else 'generated'} {args.calls:,} calls in {gen_s:.1f} s")
    derived = None
    if args.derived:  # the suite without the state first (a run derives when there is no current state)
        con.close()
        con = connect(path, read_only=True)
        con.execute("SET memory_limit = ?", [args.memory_limit])
        t = time.perf_counter()
        run, close = prepare(as_source(con), settings=Settings())
        try:
            assert run.calls_table != "state"
            for n in names():
                run.compute(n)
        finally:
            close()
        derived = time.perf_counter() - t
        con.close()
        con = connect(path)
        con.execute("SET memory_limit = ?", [args.memory_limit])
    built = state.rebuild(con, Settings())
    _progress(f"rebuild {built.seconds:.1f} s")
    con.execute("CHECKPOINT")
    con.close()

    con = connect(path, read_only=True)
    con.execute("SET memory_limit = ?", [args.memory_limit])
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET temp_directory = ?", [str(Path(tmp.name) / "spill")])
    t = time.perf_counter()
    con.execute(BASELINE).fetchall()
    base_s = time.perf_counter() - t
    _progress(f"window pass {base_s:.2f} s")

    def suite_once(rollups: bool):
        t = time.perf_counter()
        run, close = prepare(as_source(con), settings=Settings())
        try:
            if run.calls_table != "state":
                raise SystemExit("the maintained state is not current: the suite would derive")
            run.rollups = rollups
            out = {n: run.compute(n) for n in names()}
        finally:
            close()
        return time.perf_counter() - t, run, out

    # the suite from the rollups (where the grain allows) and from the per-call state only (no rollup or sketch),
    # alternated twice in the same run (the first pass also warms the caches): each one's faster pass is reported
    passes = [suite_once(r) for r in (True, False, True, False)]
    suite_s, run, suite = min(passes[0::2], key=lambda p: p[0])
    per_call_s, per_call, _ = min(passes[1::2], key=lambda p: p[0])
    from_rollup = sorted(run.from_rollup)
    _progress(f"suite {suite_s:.2f} s (per-call state {per_call_s:.2f} s); steps "
              + ", ".join(f"{k}={v:.2f}s" for k, v in run.timings.items()))
    con.close()
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024

    con = connect(path)
    con.execute("SET memory_limit = ?", [args.memory_limit])
    incs, cpus = [], []
    for b in range(args.batches):
        lo = args.calls + b * args.batch
        con.execute(BATCH, {"lo": lo, "n": lo + args.batch})
        # the process's CPU time beside the wall time (DuckDB's threads are in-process): on a shared machine the wall
        # time grows with the load, the CPU time much less
        c = time.process_time()
        incs.append(state.refresh(con, Settings()))
        cpus.append(time.process_time() - c)
        _progress(f"refresh {incs[-1].seconds:.2f} s (cpu {cpus[-1]:.2f} s) at {incs[-1].calls:,}: "
                  + ", ".join(f"{k}={v:.2f}s" for k, v in incs[-1].steps.items()))
    con.close()

    reuse = suite["reprefill"].to_dicts()
    print(f"calls: {args.calls:,}  ({'an existing store' if args.existing else f'generated in {gen_s:.1f} s'})"
          + (f"; every instance's KV pool {args.pool_blocks:,} blocks of 16 tokens" if args.pool_blocks else ""))
    print(f"maintained state built whole (model rebuild): {built.seconds:.2f} s ({built.calls:,} calls)")
    print(f"window pass over llm_calls (lag per session, summed): {base_s:.2f} s")
    if derived is not None:
        print(f"metric suite deriving call_reuse (no state):         {derived:.2f} s ({derived / base_s:.2f}x)")
    print(f"metric suite from the maintained state ({len(suite)} metrics): {suite_s:.2f} s")
    print(f"ratio suite / window pass: {suite_s / base_s:.2f}x")
    print(f"metric suite from the per-call state only (no rollup or sketch): {per_call_s:.2f} s "
          f"({per_call_s / base_s:.2f}x); from rollups: {', '.join(from_rollup)}")
    print("rollup metrics, rollup vs per-call: " + ", ".join(
        f"{n} {run.timings[n]:.3f}/{per_call.timings[n]:.3f} s" for n in from_rollup))
    print(f"peak memory (ru_maxrss): {peak_gib:.2f} GiB (DuckDB memory_limit {args.memory_limit})")
    # the shared preparation (m_src, m_cost, call_reuse as m_calls, m_samples) against the metrics' own queries
    # (m_itl_gap with them: itl_tail makes it); the second part alone bounds what any cheaper preparation —
    # even one maintained at ingest — could reach
    own = sum(v for k, v in run.timings.items() if k in suite or k == "m_itl_gap")
    prep = sum(v for k, v in run.timings.items() if not (k in suite or k == "m_itl_gap"))
    print(f"of which preparation {prep:.2f} s ({prep / base_s:.2f}x the window pass), metric queries {own:.2f} s "
          f"({own / base_s:.2f}x)")
    print("steps: " + ", ".join(f"{k}={v:.2f}s" for k, v in run.timings.items()))
    print("rows per metric: " + ", ".join(f"{k}={v.height}" for k, v in suite.items()))
    print("re-prefill by cause: " + ", ".join(f"{r['cause']}={r['reprefill_tokens']}" for r in reuse))
    for r, cpu in zip(incs, cpus, strict=True):
        print(f"incremental refresh ({r.mode}) of {args.batch:,} new calls at {r.calls:,} stored: {r.seconds:.2f} s "
              f"(cpu {cpu:.2f} s) "
              f"({r.derived:,} calls of {r.sessions:,} sessions derived); steps "
              + ", ".join(f"{k}={v:.2f}s" for k, v in r.steps.items()))
    print(f"ratio={suite_s / base_s:.2f} suite_s={suite_s:.2f} window_s={base_s:.2f} calls={args.calls}")


if __name__ == "__main__":
    main()
