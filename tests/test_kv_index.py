"""The stored KV-event index (agentobs.model.kvindex): same call_reuse rows as the inline KV section, used only
while it is the index of kv_events as they are, rebuilt by the writers that add KV events."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from builders import T0, call, make_db
from builders import ts as _ts
from cli_run import run_cli

from agentobs.collect.snapshot import publish
from agentobs.config import Settings
from agentobs.metrics import prepare
from agentobs.model import connect, kvindex, upkeep
from agentobs.source import as_source
from agentobs.store.writer import Writer

# the eviction golden test's fleet (tests/test_metrics_golden.py): a3's idle window 30..100 s ends when a2's
# live chain loses p6 at 70 s; dead-end output blocks removed at 35 and 40 s do not end it
CALLS = [call("a1", "s1", 0, 10, 64, 0, O=32), call("a2", "s1", 20, 30, 128, 64, O=32),
         call("a3", "s1", 100, 101, 160, 0, O=10)]
KV = [("A:8000", 1, "BlockStored", ["p0", "p1", "p2", "p3"], "s1", None),
      ("A:8000", 9, "BlockStored", ["o1", "o2"], "s1", "p3"),
      ("A:8000", 21, "BlockStored", ["p4", "p5", "p6", "p7"], "s1", "p3"),
      ("A:8000", 29, "BlockStored", ["q1", "q2"], "s1", "p7"),
      ("A:8000", 35, "BlockRemoved", ["o1", "o2"], None),
      ("A:8000", 40, "BlockRemoved", ["q1"], None),
      ("A:8000", 70, "BlockRemoved", ["p6", "p7"], None)]
CONFIG = [("A:8000", "vllm", "block_size", "16")]


def m_calls(path, settings=None):
    run, close = prepare(as_source(path), settings=settings or Settings())
    try:
        return run.kv_index, run.cur.sql("SELECT * FROM m_calls ORDER BY call_id").pl()
    finally:
        close()


def add_removal(path, t, hashes):
    con = connect(path)
    with Writer(con, flush_s=0.01) as w:
        w.write("kv_events", pa.table({
            "instance": ["A:8000"], "ts": [_ts(t)], "seq": [100 + int(t)], "event_idx": [0], "type": ["BlockRemoved"],
            "block_hashes": pa.array([hashes], pa.list_(pa.string())), "session_id": pa.array([None], pa.string()),
            "parent_block_hash": pa.array([None], pa.string())}))
    con.close()


def test_runs_read_the_index_only_while_it_is_current(tmp_path):
    path = make_db(tmp_path, CALLS, kv=KV, config=CONFIG)
    used, inline = m_calls(path)
    assert not used  # no index stored yet: the section is computed from kv_events
    con = connect(path)
    built = kvindex.refresh(con)
    # one session stored blocks; its removals: o1+o2 at 35 (same stored/superseded times: one row), q1 at 40,
    # p6+p7 at 70 (p7 was superseded by nothing, p6 neither: one row) -> 3 rows
    assert (built.rebuilt, built.sessions, built.removals) == (True, 1, 3)
    assert not kvindex.refresh(con).rebuilt  # current: nothing to do
    con.close()
    used, indexed = m_calls(path)
    assert used and indexed.equals(inline)
    a3 = indexed.filter(indexed["call_id"] == "a3").row(0, named=True)
    assert a3["evict_ts_s"] == pytest.approx(T0 + 70) and a3["rent_wasted_token_s"] == pytest.approx(160 * 40)

    # a KV event arrives: the stored index no longer describes kv_events, runs compute the section again
    add_removal(path, 50, ["p5"])  # p5 (depth 5, on a2's live chain, < 8 blocks) removed at 50 s: t_evict = 50
    used, fresh = m_calls(path)
    assert not used
    a3 = fresh.filter(fresh["call_id"] == "a3").row(0, named=True)
    assert a3["evict_ts_s"] == pytest.approx(T0 + 50) and a3["rent_wasted_token_s"] == pytest.approx(160 * 20)
    con = connect(path)
    assert kvindex.refresh(con).rebuilt
    con.close()
    used, again = m_calls(path)
    assert used and again.equals(fresh)


def test_an_index_of_other_sql_is_not_used(tmp_path, monkeypatch):
    path = make_db(tmp_path, CALLS, kv=KV, config=CONFIG)
    con = connect(path)
    kvindex.refresh(con)
    assert kvindex.usable(con)
    monkeypatch.setattr(kvindex, "version", lambda: "another-release")  # the section's SQL changed
    assert not kvindex.usable(con) and kvindex.refresh(con).rebuilt and kvindex.usable(con)
    con.close()


def test_store_without_kv_events_gets_an_empty_index(tmp_path):
    path = make_db(tmp_path, CALLS, config=CONFIG)
    con = connect(path)
    assert (kvindex.refresh(con).sessions, kvindex.usable(con)) == (0, True)
    con.close()
    used, df = m_calls(path)
    assert used and df["rent_mode"].drop_nulls().unique().to_list() == ["estimate"]


def test_import_kv_events_refreshes_the_index_and_the_command_reports_it(tmp_path):
    path = make_db(tmp_path, CALLS, config=CONFIG)
    # decoded vLLM KVEventBatch lines (docs/cli.md): [ts, [events], data_parallel_rank]; BlockStored carries the
    # hashes, parent, token ids, block size, lora id and medium
    lines = [json.dumps({"instance": "A:8000", "seq": 1, "decoded": [
                 T0 + 1, [["BlockStored", [11, 12], None, list(range(32)), 16, None, "GPU"]], 0]}),
             json.dumps({"instance": "A:8000", "seq": 2, "decoded": [T0 + 5, [["BlockRemoved", [12], "GPU"]], 0]})]
    f = tmp_path / "kv.jsonl"
    f.write_text("\n".join(lines) + "\n")
    out = run_cli("import", "kv-events", f, "--instance", "A:8000", "--db", path)
    assert out.returncode == 0, out.stderr
    assert "kv index: 0 sessions" in out.stderr  # the events name no session: nothing to attribute
    con = connect(path, read_only=True)
    assert kvindex.usable(con)
    con.close()
    out = run_cli("kv-index", "--db", path)
    assert out.returncode == 0 and out.stdout.startswith("kv index already current: 0 sessions"), out
    # a store that is not there is reported, not created
    missing = tmp_path / "nothing.duckdb"
    out = run_cli("kv-index", "--db", missing)
    assert out.returncode != 0 and "no agentobs database at" in out.stderr and not missing.exists(), out


def test_the_read_snapshot_carries_a_current_index(tmp_path):
    path = make_db(tmp_path, CALLS, kv=KV, config=CONFIG)
    con = connect(path)  # the collector's store: no index built there
    snap = tmp_path / "read.duckdb"
    publish(con, snap, upkeep=upkeep)
    con.close()
    r = connect(snap, read_only=True)
    assert kvindex.usable(r) and r.sql("SELECT count(*) FROM kv_index_removals").fetchall() == [(3,)]
    r.close()


def test_a_failed_index_build_loses_neither_the_import_nor_the_snapshot(tmp_path, monkeypatch, capsys):
    # the index is derived data: when building it fails, the imported events stay, the command succeeds with a
    # warning, the snapshot is still published, and runs derive the section inline
    from agentobs.cli import main

    def broken(con, force=False):
        raise RuntimeError("disk full")

    path = make_db(tmp_path, CALLS, config=CONFIG)
    f = tmp_path / "kv.jsonl"
    f.write_text(json.dumps({"instance": "A:8000", "seq": 1, "decoded": [
        T0 + 1, [["BlockStored", [11, 12], None, list(range(32)), 16, None, "GPU"]], 0]}) + "\n")
    monkeypatch.setattr(kvindex, "refresh", broken)
    main(["import", "kv-events", str(f), "--db", path])
    assert "kv index not refreshed (RuntimeError: disk full)" in capsys.readouterr().err
    con = connect(path, read_only=True)
    assert con.sql("SELECT count(*) FROM kv_events").fetchall() == [(1,)] and not kvindex.usable(con)
    con.close()
    con = connect(path)
    snap = tmp_path / "read.duckdb"
    publish(con, snap, upkeep=upkeep)
    con.close()
    r = connect(snap, read_only=True)
    assert r.sql("SELECT count(*) FROM kv_events").fetchall() == [(1,)] and not kvindex.usable(r)
    r.close()
    used, _ = m_calls(str(snap))
    assert not used
