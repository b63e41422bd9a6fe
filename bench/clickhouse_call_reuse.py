"""CPU-seconds of call_reuse on chDB (in-process ClickHouse): on an empty store and on a small simulated one.

    .venv/bin/python bench/clickhouse_call_reuse.py [--duration-s 120] [--max-memory-gb 4] [--skip-view]

Prints, per store, the CPU-seconds (user + system of this process: chDB runs in it) of

- ``init``: ``model.create_tables`` + ``create_views``;
- ``view``: ``SELECT * FROM call_reuse`` as `agentobs sql` and the console's SQL page run it (the table brought up
  to date with the data first, when it is not); ``view again``: the same with nothing new;
- ``m_calls``: the metric run's preparation over ClickHouse (``agentobs.metrics.runcache.prepare``: m_src, m_calls
  by steps, m_samples).

The small store is the simulator's ``sample`` fleet (KV events on one instance) for ``--duration-s`` seconds,
imported into DuckDB and copied into chDB as tests/test_clickhouse_parity.py does. chDB's memory is capped per
query (``max_memory_usage``): a runaway fails instead of taking the machine. Figures: docs/clickhouse.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(label: str, fn):
    from agentobs.errors import QueryError

    c0, t0 = cpu_s(), time.perf_counter()
    try:
        out = fn()
    except QueryError as e:  # a runaway stopped by the memory cap: say so, go on
        print(f"  {label:<10} {cpu_s() - c0:7.1f} CPU-s  {time.perf_counter() - t0:7.1f} s  FAILED: {e}", flush=True)
        return None
    print(f"  {label:<10} {cpu_s() - c0:7.1f} CPU-s  {time.perf_counter() - t0:7.1f} s", flush=True)
    return out


def measure(name: str, ch, settings, fill=None, view: bool = True) -> None:
    from agentobs.backends.clickhouse import model
    from agentobs.backends.clickhouse.sql import run_query
    from agentobs.metrics.runcache import prepare
    from agentobs.source import ClickHouseSource

    print(f"{name}:", flush=True)
    timed("init", lambda: (model.create_tables(ch, settings), model.create_views(ch, settings)))
    if fill is not None:
        timed("load", fill)
    if view:
        t = timed("view", lambda: run_query(ch, "SELECT * FROM call_reuse", row_cap=10**7, timeout_s=3600))
        if t is not None:
            print(f"  call_reuse rows: {t.table.num_rows}")
        timed("view again", lambda: run_query(ch, "SELECT * FROM call_reuse", row_cap=10**7, timeout_s=3600))

    def run():
        r, done = prepare(ClickHouseSource(ch=ch), settings=settings)
        n = r.cur.sql("SELECT count(*) FROM m_calls").fetchall()[0][0]
        done()
        return n

    n = timed("m_calls", run)
    print(f"  m_calls rows: {n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=120.0, help="simulated seconds of the small store")
    ap.add_argument("--max-memory-gb", type=float, default=4.0, help="chDB's per-query memory cap")
    ap.add_argument("--skip-view", action="store_true", help="do not read the call_reuse view")
    a = ap.parse_args()

    from agentobs.backends.clickhouse import load
    from agentobs.backends.clickhouse.conn import ClickHouse
    from agentobs.collect.bundle import import_bundle
    from agentobs.config import load_settings
    from agentobs.model import connect
    from agentobs.sim.run import simulate
    from agentobs.sim.scenarios import scenario
    from agentobs.store.writer import Writer

    settings = load_settings(env={})
    cap = f"SET max_memory_usage = {int(a.max_memory_gb * 1e9)}"

    ch = ClickHouse("chdb:")
    ch.command(cap)
    measure("empty store", ch, settings, view=not a.skip_view)
    ch.close()

    with tempfile.TemporaryDirectory() as tmp:
        simulate(dataclasses.replace(scenario("sample"), duration_s=a.duration_s), seed=1, out=Path(tmp) / "b",
                 prom_every=12)
        con = connect(Path(tmp) / "d.duckdb")
        with Writer(con, batch_rows=50_000, flush_s=0.05) as w:
            import_bundle(Path(tmp) / "b", w, settings)
        n_calls = con.sql("SELECT count(*) FROM llm_calls").fetchall()[0][0]
        n_kv = con.sql("SELECT count(*) FROM kv_events").fetchall()[0][0]
        ch = ClickHouse("chdb:")
        ch.command(cap)
        measure(f"small store ({a.duration_s:.0f} s of the sample fleet: {n_calls} calls, {n_kv} KV events)", ch,
                settings, fill=lambda: load.from_duckdb(con, ch), view=not a.skip_view)
        ch.close()
        con.close()


if __name__ == "__main__":
    main()
