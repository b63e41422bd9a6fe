"""The Writer inserts with a plain INSERT first and falls back to INSERT OR IGNORE on a duplicate key;
spans have no key: insert_spans skips a span already stored.

Every case checks what is stored, what each ticket was told, and which path was taken
(``stats.conflict_retries`` counts the commits that were redone with INSERT OR IGNORE).
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from builders import span_rows

from agentobs.errors import StoreError
from agentobs.model import connect
from agentobs.store.writer import IGNORE_AFTER_CONFLICT, Writer


def scrapes(first: int, n: int, instance: str = "i") -> pa.Table:
    """``n`` scrape rows keyed (instance, ts) with ts = first, first+1, ... seconds."""
    return pa.table({"ts": pa.array([(first + i) * 1_000_000 for i in range(n)], pa.timestamp("us")),
                     "instance": [instance] * n, "url": [None] * n, "ok": [True] * n, "error": [None] * n,
                     "duration_s": [0.1] * n, "samples": [first + i for i in range(n)]})


def config(keys: list[str]) -> pa.Table:
    n = len(keys)
    return pa.table({"instance": ["i"] * n, "ts": pa.array([0] * n, pa.timestamp("us")), "engine": ["vllm"] * n,
                     "key": keys, "value": ["v"] * n, "source": ["t"] * n})


@pytest.fixture
def con(db_path):
    c = connect(db_path)
    yield c
    c.close()


def count(con, table: str) -> int:
    return con.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0]


def test_new_rows_take_the_plain_insert(con):
    with Writer(con, flush_s=0) as w:
        assert w.write("scrapes", scrapes(0, 4)) == 4
        assert w.write("scrapes", scrapes(4, 4)) == 4
        assert w.stats.conflict_retries == 0
    assert count(con, "scrapes") == 8


def test_duplicate_of_a_stored_row_redoes_the_commit_with_or_ignore(con):
    with Writer(con, flush_s=0) as w:
        w.write("scrapes", scrapes(0, 3))
        # ts 1, 2 are stored; 3, 4 are new: the plain INSERT fails, the redo keeps only the new two
        assert w.write("scrapes", scrapes(1, 4)) == 2
        assert w.stats.conflict_retries == 1
        # the table now goes straight to INSERT OR IGNORE: duplicates cost no second attempt
        assert w.write("scrapes", scrapes(0, 6)) == 1  # only ts 5 is new
        assert w.stats.conflict_retries == 1
    assert count(con, "scrapes") == 6
    # the stored values are the first ones written (a duplicate never overwrites)
    assert con.sql("SELECT list(samples ORDER BY ts) FROM scrapes").fetchall()[0][0] == [0, 1, 2, 3, 4, 5]


def test_duplicate_inside_one_commit(con):
    with Writer(con, batch_rows=10_000, flush_s=10) as w:
        a = w.submit("scrapes", scrapes(0, 4))  # ts 0..3
        b = w.submit("scrapes", scrapes(2, 4))  # ts 2..5: 2 and 3 repeat ticket a's rows
        w.flush()  # both in one commit
        # 6 distinct keys; new rows are credited to the earliest ticket first
        assert (a.wait(), b.wait()) == (4, 2)
        assert w.stats.conflict_retries == 1
    assert count(con, "scrapes") == 6


def test_duplicates_in_two_tables_of_one_commit(con):
    with Writer(con, batch_rows=10_000, flush_s=10) as w:
        w.submit("scrapes", scrapes(0, 2))
        w.submit("engine_config", config(["a", "b"]))
        w.flush()  # stored, in one commit of new rows
        s = w.submit("scrapes", scrapes(1, 3))  # ts 1 stored, 2 and 3 new
        c = w.submit("engine_config", config(["b", "c"]))  # b stored, c new
        w.flush()
        assert (s.wait(), c.wait()) == (2, 1)
        # the first attempt fails on one table, the second on the other, the third commits
        assert w.stats.conflict_retries == 2
    assert (count(con, "scrapes"), count(con, "engine_config")) == (4, 3)


def test_plain_insert_is_tried_again_after_the_ignore_window(con):
    with Writer(con, flush_s=0) as w:
        w.write("scrapes", scrapes(0, 1))
        w.write("scrapes", scrapes(0, 2))  # duplicate: retry 1, then OR IGNORE for a while
        for i in range(IGNORE_AFTER_CONFLICT):
            w.write("scrapes", scrapes(10 + i, 1))
        assert w.stats.conflict_retries == 1
        w.write("scrapes", scrapes(0, 1))  # plain INSERT again: the duplicate costs a retry
        assert w.stats.conflict_retries == 2
    assert count(con, "scrapes") == 2 + IGNORE_AFTER_CONFLICT


def test_other_constraint_errors_fail_the_commit_and_keep_the_writer_working(con):
    bad = scrapes(0, 2).set_column(1, "instance", pa.array([None, "i"], pa.string()))  # NOT NULL key column
    with Writer(con, batch_rows=10_000, flush_s=10) as w:
        good = w.submit("scrapes", scrapes(5, 1))
        broken = w.submit("scrapes", bad)
        with pytest.raises(StoreError, match="NOT NULL"):
            w.flush()  # the flush shares the failed commit
        # one transaction: the good rows of the same commit are not stored either (nothing half-done)
        for t in (good, broken):
            with pytest.raises(StoreError, match="NOT NULL"):
                t.wait()
        again = w.submit("scrapes", scrapes(5, 1))
        w.flush()
        assert again.wait() == 1  # the writer goes on
    assert count(con, "scrapes") == 1


def test_spans_have_no_key_and_a_span_already_stored_is_skipped(con):
    # spans is append-only (no primary key: appends stay flat as the store grows) ...
    assert con.sql("SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'spans_part' "
                   "AND constraint_type = 'PRIMARY KEY'").fetchall() == [(0,)]
    with Writer(con, flush_s=0) as w:
        assert w.write("spans", span_rows([("t1", "s1", 10), ("t1", "s2", 20)])) == 2
        # ... yet a span sent again (s2) is skipped, as is one repeated inside the batch (s3 twice)
        assert w.write("spans", span_rows([("t1", "s2", 20), ("t1", "s3", 30), ("t1", "s3", 30)], "b")) == 1
        assert w.stats.conflict_retries == 0
    assert con.sql("SELECT span_id, name FROM spans ORDER BY span_id").fetchall() == [
        ("s1", "a"), ("s2", "a"), ("s3", "b")]  # the first copy stays


def test_spans_migrate_from_a_keyed_store(tmp_path):
    """A store made before 0003 (spans with a primary key, views on it) keeps its rows and loses the key."""
    import duckdb

    from agentobs.store.schema import MIGRATIONS

    path = tmp_path / "old.duckdb"
    old = duckdb.connect(str(path))
    old.execute(MIGRATIONS[0][1])
    old.execute("CREATE TABLE schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP DEFAULT now())")
    old.execute("INSERT INTO schema_migrations (name) VALUES ('0001_raw_tables'), ('0002_findings_acks')")
    old.execute("INSERT INTO spans (trace_id, span_id, start_ns, name) VALUES ('t', 's', 5, 'old')")
    old.execute("CREATE VIEW v_old AS SELECT * FROM spans")
    old.close()
    c = connect(path)
    assert c.sql("SELECT trace_id, span_id, start_ns, name FROM spans").fetchall() == [("t", "s", 5, "old")]
    c.execute("INSERT INTO spans_part (trace_id, span_id, start_ns) VALUES ('t', 's', 5)")  # no key refuses it now
    assert c.sql("SELECT count(*) FROM llm_calls").fetchall() is not None
    c.close()


def test_transaction_commits_the_block_and_rolls_back_on_any_exception(tmp_path):
    """agentobs.store.db.transaction: the block's writes committed together; an exception (an interrupt too) rolls
    all of them back and is raised again unchanged; a failing COMMIT (a constraint checked at commit) the same."""
    from agentobs.store.db import transaction

    con = duckdb.connect(str(tmp_path / "t.duckdb"))
    con.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    with transaction(con):
        con.execute("INSERT INTO t VALUES (1)")
        con.execute("INSERT INTO t VALUES (2)")
    assert con.sql("SELECT k FROM t ORDER BY k").fetchall() == [(1,), (2,)]
    for exc in (ValueError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)) as got:
            with transaction(con):
                con.execute("INSERT INTO t VALUES (3)")
                raise exc
        assert got.value is exc and not getattr(exc, "__notes__", None)  # as raised, nothing added
        assert con.sql("SELECT count(*) FROM t").fetchall() == [(2,)]  # 3 rolled back
    # a statement failing inside: the transaction is aborted, rolled back, the error raised as DuckDB's
    with pytest.raises(duckdb.ConstraintException):
        with transaction(con):
            con.execute("INSERT INTO t VALUES (4)")
            con.execute("INSERT INTO t VALUES (1)")  # duplicate key
    assert con.sql("SELECT k FROM t ORDER BY k").fetchall() == [(1,), (2,)]
    # the connection is usable afterwards: no transaction left open
    with transaction(con):
        con.execute("INSERT INTO t VALUES (5)")
    assert con.sql("SELECT count(*) FROM t").fetchall() == [(3,)]
    con.close()


def _returns(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``'s value, called on a thread that must be done long before the writers' hour-long
    flush_s below would let a held batch go (a hang guard, not a timing check)."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args, **kwargs)), daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} waited for the writer's flush_s"
    return out[0]


HOUR = 3600.0  # a flush_s nothing may wait out


def test_write_commits_at_once(con):
    # write() waits for its own rows: it commits them now instead of holding them flush_s for more
    with Writer(con, flush_s=HOUR) as w:
        assert _returns(w.write, "scrapes", scrapes(0, 3)) == 3
        assert w.stats.batches == 1
    assert count(con, "scrapes") == 3


def test_a_waited_ticket_commits_what_the_writer_holds_and_unwaited_rows_share_commits(con):
    # three submits nobody waits on stay held (flush_s is an hour); waiting on the last one commits all three in
    # ONE transaction (the writer drains its queue first); a scrape-like submit after it is held again
    with Writer(con, flush_s=HOUR) as w:
        tickets = [w.submit("scrapes", scrapes(3 * k, 3)) for k in range(3)]
        assert _returns(tickets[-1].wait) == 3
        assert [t.wait(0) for t in tickets] == [3, 3, 3] and w.stats.batches == 1
        held = w.submit("scrapes", scrapes(9, 3))
        assert not held._done.wait(0.3)  # nobody waits on it: held for more rows (Ticket.wait would urge it)
    assert count(con, "scrapes") == 12  # close() committed the held rows


def test_importers_commit_at_once(con):
    # each importer waits for its rows' tickets; under a writer that would hold a small batch for an hour, each
    # one still returns with its rows stored (waiting on a ticket commits what the writer holds)
    from pathlib import Path

    from agentobs.collect.files import import_kv_events, import_otlp, import_prom, import_server_info
    from agentobs.collect.tracelab import import_tracelab
    from agentobs.config import Settings

    sample, fx = Path(__file__).parent.parent / "sample_data" / "fixtures", Path(__file__).parent / "fixtures"
    with Writer(con, flush_s=HOUR) as w:
        res = {
            "otlp": _returns(import_otlp, [sample / "otlp"], w, Settings()),
            "prom": _returns(import_prom, [sample / "vllm_metrics.prom"], "v:8000", w, at=1_700_000_000.0),
            "server_info": _returns(import_server_info, sample / "sglang_server_info.json", "s:30000", w,
                                    at=1_700_000_000.0),
            "kv": _returns(import_kv_events, [fx / "litellm_real_kv" / "kv_events.jsonl"], w, "v:8000"),
            "tracelab": _returns(import_tracelab, [fx / "tracelab" / "round_trace.sample.jsonl"], w, Settings()),
        }
        for name, r in res.items():
            assert r.inserted > 0 and not r.errors, (name, r.errors)
    stored = {t: count(con, t) for t in ("spans", "metric_samples", "engine_config", "kv_events")}
    assert stored["spans"] == res["otlp"].inserted + res["tracelab"].inserted
    assert stored["metric_samples"] == res["prom"].inserted
    assert stored["kv_events"] == res["kv"].inserted
    # the server info's keys, and any config the metrics snapshot carried
    assert stored["engine_config"] >= res["server_info"].inserted
