"""The re-based bundle import (`agentobs import bundle --rebase-to`): every timestamp moves by one whole-second
offset so that the newest record lands at the clock used; relative timing is unchanged."""

from __future__ import annotations

from dataclasses import replace

import duckdb
import pytest
from click.testing import CliRunner

from agentobs.cli import cli
from agentobs.config import Settings
from agentobs.sim.bundle import import_bundle
from agentobs.sim.run import simulate
from agentobs.sim.scenarios import scenario
from agentobs.store.db import connect
from agentobs.store.kvindex import refresh
from agentobs.store.writer import Writer

T = 1_800_000_000.25  # the clock of the explicit re-base below (2027-01-15)
NS = 1_000_000_000


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A small simulated bundle imported as is and re-based to T (two stores)."""
    tmp = tmp_path_factory.mktemp("rebase")
    simulate(replace(scenario("quick"), duration_s=120.0, snapshot_s=15.0), seed=3, out=tmp / "bundle")
    res = {}
    for name, rebase in (("plain", None), ("rebased", T)):
        con = connect(tmp / f"{name}.duckdb")
        with Writer(con) as w:
            res[name] = import_bundle(tmp / "bundle", w, Settings(), rebase_to=rebase)
        refresh(con)
        con.close()
    return tmp, res


def _both(tmp):
    con = duckdb.connect()
    con.execute(f"ATTACH '{tmp / 'plain.duckdb'}' AS a (READ_ONLY)")
    con.execute(f"ATTACH '{tmp / 'rebased.duckdb'}' AS b (READ_ONLY)")
    return con


def test_every_timestamp_moves_by_one_whole_second_offset(stores):
    tmp, res = stores
    off = res["rebased"].offset_s
    assert res["plain"].offset_s == 0 and isinstance(off, int) and off > 0
    con = _both(tmp)
    newest = con.execute("SELECT greatest((SELECT max(end_ns) / 1e9 FROM b.spans), "
                     "(SELECT max(epoch_us(ts)) / 1e6 FROM b.metric_samples), "
                     "(SELECT max(epoch_us(ts)) / 1e6 FROM b.kv_events))").fetchone()[0]
    assert T - 1 < newest <= T and newest == pytest.approx(res["rebased"].newest, abs=1e-6)
    # row for row: the re-based store is the plain one with every time + off (ns and µs exact)
    same = {
        "spans": ("trace_id, span_id, name, start_ns, end_ns, attributes, events, session_id, instance",
                  f"trace_id, span_id, name, start_ns - {off * NS}, end_ns - {off * NS}, attributes, events, "
                  "session_id, instance"),
        "metric_samples": ("ts, instance, metric, labels_key, value",
                           f"ts - INTERVAL {off} SECOND, instance, metric, labels_key, value"),
        "engine_config": ("ts, instance, key, value", f"ts - INTERVAL {off} SECOND, instance, key, value"),
        "kv_events": ("ts, instance, seq, event_idx, type, block_hashes, session_id",
                      f"ts - INTERVAL {off} SECOND, instance, seq, event_idx, type, block_hashes, session_id"),
        # derived from the shifted KV events: the stored index moves with them
        "kv_index_removals": ("instance, session_id, ts_s, stored_s, superseded_s, depth",
                              f"instance, session_id, ts_s - {off}, stored_s - {off}, superseded_s - {off}, depth"),
        "kv_index_sessions": ("instance, session_id, sk", "instance, session_id, sk"),
    }
    for table, (a, b) in same.items():
        na, nb = (con.execute(f"SELECT count(*) FROM {s}.{table}").fetchone()[0] for s in ("a", "b"))
        assert na == nb and (na > 0 or table == "kv_index_removals"), table
        diff = f"SELECT count(*) FROM (SELECT {a} FROM a.{table} EXCEPT ALL SELECT {b} FROM b.{table})"
        assert con.execute(diff).fetchone()[0] == 0, table
    # the model's views see the same gaps
    gaps = con.execute("""
        WITH a AS (SELECT call_id, start_s - min(start_s) OVER () AS t, end_s - start_s AS d FROM a.llm_calls),
             b AS (SELECT call_id, start_s - min(start_s) OVER () AS t, end_s - start_s AS d FROM b.llm_calls)
        SELECT count(*), max(abs(a.t - b.t)), max(abs(a.d - b.d)) FROM a JOIN b USING (call_id)""").fetchone()
    assert gaps[0] == con.execute("SELECT count(*) FROM a.llm_calls").fetchone()[0] > 0
    assert gaps[1] < 1e-6 and gaps[2] < 1e-6
    # results count the target's inserts; the import log keeps the import's own time
    for what in ("spans", "samples", "kv events"):
        assert res["rebased"][what].inserted == res["plain"][what].inserted > 0, what
    assert con.execute("SELECT min(ts) > now() - INTERVAL 1 HOUR FROM b.ingest_log").fetchone()[0]


def test_rebase_cli_option_and_bad_value(stores, tmp_path):
    tmp, res = stores
    db = tmp_path / "x.duckdb"
    r = CliRunner().invoke(cli, ["import", "bundle", str(tmp / "bundle"), "--db", str(db), "--rebase-to",
                                 "2027-01-15T08:00:00"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "re-based by +" in out and ("record is at 2027-01-15 08:00:00 UTC" in out
                                       or "record is at 2027-01-15 07:59:59 UTC" in out), out
    r = CliRunner().invoke(cli, ["import", "bundle", str(tmp / "bundle"), "--db", str(db), "--rebase-to", "soon"])
    assert r.exit_code == 2 and "'soon' is neither now, epoch seconds nor an ISO-8601 time" in r.output
