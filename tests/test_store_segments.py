"""The segments layout of spans (agentobs/store/segments.py): a compacted table part plus Parquet segments."""

from __future__ import annotations

import os

import pytest
from builders import publish_segment, span_rows

from agentobs.errors import StoreError
from agentobs.store import segments
from agentobs.store.db import connect
from agentobs.store.writer import insert_spans


@pytest.fixture
def con(tmp_path):
    c = connect(tmp_path / "s.duckdb")
    yield c
    c.close()


def rows(con):
    return con.sql("SELECT trace_id, span_id, name FROM spans ORDER BY trace_id, span_id").fetchall()


def test_a_retried_export_in_two_segments_is_read_once_and_compaction_keeps_the_rows(con, tmp_path):
    insert_spans(con, span_rows([("t0", "s0", 5)], "part"))  # an imported span in the table part
    publish_segment(con, span_rows([("t1", "s1", 10), ("t1", "s2", 20)], "first"))
    # the same export again (re-batched with a new span), and a copy of the table part's span
    publish_segment(con, span_rows([("t1", "s2", 20), ("t1", "s3", 30), ("t0", "s0", 5)], "second"))
    want = [("t0", "s0", "part"), ("t1", "s1", "first"), ("t1", "s2", "first"), ("t1", "s3", "second")]
    assert rows(con) == want  # 6 rows stored, 4 spans: each once, the first copy
    assert con.sql("SELECT count(*) FROM span_segments").fetchall() == [(2,)]
    out = segments.compact(con)
    assert (out.segments, out.rows, out.left) == (2, 3, 0)  # s1, s2, s3 moved; t0/s0 was in the part
    assert rows(con) == want
    assert con.sql("SELECT count(*) FROM spans_part").fetchall() == [(4,)]
    # the rowids the merged rows got: part had rowid 0; the 3 merged rows are 1..3, up to segment seq 2
    assert con.sql("SELECT max_seq, segments, rowid_lo, rowid_hi, rows FROM span_compactions").fetchall() == [
        (2, 2, 1, 3, 3)]
    files = [r[0] for r in con.sql("SELECT file FROM span_segments_retired").fetchall()]
    assert len(files) == 2 and all(os.path.exists(f) for f in files)  # kept for read snapshots until swept
    assert segments.sweep(con, grace_s=0) == 2
    assert not any(os.path.exists(f) for f in files)
    # a span sent again after compaction is still read once
    publish_segment(con, span_rows([("t1", "s3", 30), ("t2", "s4", 40)], "late"))
    assert rows(con) == want + [("t2", "s4", "late")]


def test_compaction_stops_at_keep_and_orders_by_seq(con):
    for k in range(5):
        publish_segment(con, span_rows([(f"t{k}", "s", k)], f"n{k}"))
    out = segments.compact(con, group=2, keep=1)
    assert (out.segments, out.left) == (4, 1)  # groups of 2, 2; the newest stays in the tail
    assert con.sql("SELECT seq FROM span_segments").fetchall() == [(5,)]
    assert con.sql("SELECT max_seq FROM span_compactions ORDER BY max_seq").fetchall() == [(2,), (4,)]
    assert len(rows(con)) == 5
    assert segments.next_seq(con) == 6


def test_restart_deletes_an_unpublished_file_and_a_missing_file_is_an_error(con, tmp_path):
    kept = publish_segment(con, span_rows([("t1", "s1", 10)]))
    d = segments.segments_dir(tmp_path / "s.duckdb")
    # a decoder's file whose batch was never committed (killed before), and one renamed but not committed
    tmp = segments.write_segment(span_rows([("t1", "s9", 10)]), d).tmp
    renamed = segments.publish_file(segments.write_segment(span_rows([("t1", "s8", 10)]), d), 2)
    assert segments.recover(con, d) == 2
    assert not os.path.exists(tmp) and not os.path.exists(renamed) and os.path.exists(kept)
    assert rows(con) == [("t1", "s1", "a")]
    os.unlink(kept)
    with pytest.raises(StoreError, match="span_segments.*missing.*0000000000000001.parquet"):
        segments.recover(con, d)


def test_the_sql_sandbox_reads_segment_rows_and_nothing_else(con, tmp_path):
    from agentobs.errors import QueryError
    from agentobs.sql import run_query

    publish_segment(con, span_rows([("t1", "s1", 10)], "seg"))
    con.close()
    db = str(tmp_path / "s.duckdb")
    res = run_query("SELECT span_id, name FROM spans", db=db)
    assert res.table.to_pylist() == [{"span_id": "s1", "name": "seg"}]
    other = tmp_path / "other.parquet"
    import pyarrow.parquet as pq
    pq.write_table(span_rows([("x", "y", 1)]), other)
    with pytest.raises(QueryError, match="refused"):
        run_query(f"SELECT * FROM read_parquet('{other}')", db=db)


def test_model_compact_command_merges_and_deletes(con, tmp_path):
    from cli_run import run_cli

    f1 = publish_segment(con, span_rows([("t1", "s1", 10), ("t1", "s2", 20)]))
    f2 = publish_segment(con, span_rows([("t1", "s2", 20), ("t1", "s3", 30)]))  # s2 again: a retried export
    con.close()
    r = run_cli("model", "compact", "--db", str(tmp_path / "s.duckdb"))
    # 2 segments merged; 3 distinct spans added; both files deleted at once (no collector's snapshots to wait for)
    assert r.returncode == 0 and "2 merged (3 spans added" in r.stdout and "0 left, 2 files deleted" in r.stdout
    assert not os.path.exists(f1) and not os.path.exists(f2)
    c = connect(tmp_path / "s.duckdb")
    assert rows(c) == [("t1", "s1", "a"), ("t1", "s2", "a"), ("t1", "s3", "a")]
    assert c.sql("SELECT count(*) FROM span_segments").fetchall() == [(0,)]
    c.close()
