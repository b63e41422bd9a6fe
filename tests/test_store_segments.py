"""The segments layout of spans (agentobs/store/segments.py): a table part, merged Parquet files and a tail of segments."""

from __future__ import annotations

import os

import pyarrow as pa
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


def merged(con):
    return con.sql("SELECT rows, min_start_ns, max_start_ns, min_seq, max_seq FROM span_merged ORDER BY min_seq"
                   ).fetchall()


def test_a_retried_export_in_two_segments_is_read_once_and_compaction_keeps_the_rows(con, tmp_path):
    insert_spans(con, span_rows([("t0", "s0", 5)], "part"))  # an imported span in the table part
    publish_segment(con, span_rows([("t1", "s1", 10), ("t1", "s2", 20)], "first"))
    # the same export again (re-batched with a new span), and a copy of the table part's span
    publish_segment(con, span_rows([("t1", "s2", 20), ("t1", "s3", 30), ("t0", "s0", 5)], "second"))
    want = [("t0", "s0", "part"), ("t1", "s1", "first"), ("t1", "s2", "first"), ("t1", "s3", "second")]
    assert rows(con) == want  # 6 rows stored, 4 spans: each once, the first copy
    assert con.sql("SELECT count(*) FROM span_segments").fetchall() == [(2,)]
    out = segments.compact(con)
    assert (out.segments, out.files, out.rows, out.left) == (2, 1, 3, 0)  # s1, s2, s3 merged; t0/s0 in the part
    assert rows(con) == want
    assert con.sql("SELECT count(*) FROM spans_part").fetchall() == [(1,)]  # the table part did not grow
    # one merged file: 3 spans, start_ns 10..30, from segments 1..2; rows in seq order, each with its segment
    assert merged(con) == [(3, 10, 30, 1, 2)]
    (mf,) = con.sql("SELECT file FROM span_merged").fetchall()[0]
    assert os.path.basename(mf) == "merged-0000000000000001-0000000000000002.parquet"
    assert con.sql(f"SELECT span_id, start_ns, name, _seg FROM read_parquet('{mf}')").fetchall() == [
        ("s1", 10, "first", 1), ("s2", 20, "first", 1), ("s3", 30, "second", 2)]
    assert con.sql("SELECT max_seq, segments, rowid_lo, rowid_hi, rows FROM span_compactions").fetchall() == [
        (2, 2, None, None, 3)]
    files = [r[0] for r in con.sql("SELECT file FROM span_segments_retired").fetchall()]
    assert len(files) == 2 and all(os.path.exists(f) for f in files)  # kept for read snapshots until swept
    assert segments.sweep(con, grace_s=0) == 2
    assert not any(os.path.exists(f) for f in files)
    # a span sent again after compaction is still read once, before and after the next compaction
    publish_segment(con, span_rows([("t1", "s3", 30), ("t2", "s4", 40)], "late"))
    assert rows(con) == want + [("t2", "s4", "late")]
    assert segments.compact(con).rows == 1  # s3 is in the first merged file: only s4 is written
    assert merged(con) == [(3, 10, 30, 1, 2), (1, 40, 40, 3, 3)]
    assert rows(con) == want + [("t2", "s4", "late")]
    assert segments.next_seq(con) == 4


def test_the_same_export_three_times_is_read_once_whenever_compaction_runs(con):
    """An export sent 3x (bodies that differ, e.g. re-batched: the spool's hash does not catch them): read once
    with all three in the tail, with the first merged and two in the tail, and with all merged one at a time
    (the second and third merges find every span stored and write no file)."""
    export = span_rows([("t1", f"s{i}", 100 + i) for i in range(5)], "x")
    for _ in range(3):
        publish_segment(con, export)
    want = [("t1", f"s{i}", "x") for i in range(5)]
    assert rows(con) == want
    assert segments.compact(con, group=1, keep=2).files == 1
    assert rows(con) == want
    out = segments.compact(con, group=1)
    assert (out.segments, out.files, out.rows, out.left) == (2, 0, 0, 0)
    assert rows(con) == want and merged(con) == [(5, 100, 104, 1, 1)]
    assert con.sql("SELECT count(*) FROM spans").fetchall() == [(5,)]


def test_compaction_stops_at_keep_and_orders_by_seq(con):
    for k in range(5):
        publish_segment(con, span_rows([(f"t{k}", "s", k)], f"n{k}"))
    out = segments.compact(con, group=2, keep=1)
    assert (out.segments, out.files, out.left) == (4, 2, 1)  # groups of 2, 2; the newest stays in the tail
    assert con.sql("SELECT seq FROM span_segments").fetchall() == [(5,)]
    assert con.sql("SELECT max_seq FROM span_compactions ORDER BY max_seq").fetchall() == [(2,), (4,)]
    assert merged(con) == [(2, 0, 1, 1, 2), (2, 2, 3, 3, 4)]
    assert len(rows(con)) == 5
    assert segments.next_seq(con) == 6


def test_rows_since_a_segment_come_from_the_tail_and_the_merged_files(con):
    """The session model's mark is a segment seq: rows of later segments are read whether merged or not."""
    for k in range(4):
        publish_segment(con, span_rows([(f"t{k}", "s", k)]))
    segments.compact(con, group=3, keep=1)  # segments 1..3 in one merged file, 4 in the tail
    got = con.sql(segments.since_sql(con, "trace_id", 1)).fetchall()
    assert sorted(got) == [("t1",), ("t2",), ("t3",)]  # segments 2, 3 (merged) and 4 (tail)
    assert sorted(con.sql(segments.since_sql(con, "trace_id", 3)).fetchall()) == [("t3",)]
    assert segments.since_sql(con, "trace_id", 4) is None


def test_large_segments_with_no_copy_are_listed_as_merged_files_as_they_are(con, monkeypatch):
    """A merge's rewrite is for the files' count: a segment of PROMOTE_MIN_ROWS rows or more (3 here) whose rows the
    plan keeps all, written with its _seg column, is listed in span_merged under its own name, nothing rewritten. A
    small segment, one holding a copy, or one of a release without _seg is merged into a new file as before."""
    monkeypatch.setattr(segments, "PROMOTE_MIN_ROWS", 3)
    a = publish_segment(con, span_rows([("t1", "a1", 10), ("t1", "a2", 11), ("t1", "a3", 12)], "A"), with_seq=True)
    publish_segment(con, span_rows([("t2", "b1", 20)], "B"), with_seq=True)  # small
    c = publish_segment(con, span_rows([("t3", "c1", 30), ("t3", "c2", 31), ("t3", "c3", 32)], "C"), with_seq=True)
    # a copy of A's a2 (a re-batched export): D's rows are not all kept
    publish_segment(con, span_rows([("t1", "a2", 11), ("t4", "d1", 40), ("t4", "d2", 41)], "D"), with_seq=True)
    publish_segment(con, span_rows([("t5", "e1", 50), ("t5", "e2", 51), ("t5", "e3", 52)], "E"))  # no _seg
    before = rows(con)
    assert len(before) == 12  # 13 rows, the copy of a2 read once, from A
    stat_a = os.stat(a)
    out = segments.compact(con, group=16)
    # plans: A promoted (B after it is not) | B merged alone (C after it is promotable) | C promoted | D + E merged
    assert (out.segments, out.promoted, out.files, out.rows, out.left) == (5, 2, 2, 6, 0)
    assert merged(con) == [(3, 10, 12, 1, 1), (1, 20, 20, 2, 2), (3, 30, 32, 3, 3), (5, 40, 52, 4, 5)]
    files = [r[0] for r in con.sql("SELECT file FROM span_merged ORDER BY min_seq").fetchall()]
    assert files[0] == a and files[2] == c  # listed as they are: same name, same bytes
    assert (os.stat(a).st_mtime_ns, os.stat(a).st_size) == (stat_a.st_mtime_ns, stat_a.st_size)
    assert os.path.basename(files[3]) == "merged-0000000000000004-0000000000000005.parquet"
    assert con.sql(f"SELECT DISTINCT _seg FROM read_parquet('{a}')").fetchall() == [(1,)]
    assert rows(con) == before
    # only the rewritten segments are retired: the promoted files stay where they are
    retired = {r[0] for r in con.sql("SELECT file FROM span_segments_retired").fetchall()}
    assert len(retired) == 3 and a not in retired and c not in retired
    assert segments.sweep(con) == 3 and os.path.exists(a) and os.path.exists(c)
    assert rows(con) == before
    # the model's marks: rows of segments after 2 are C's, D's two kept and E's
    assert len(con.sql(segments.since_sql(con, "span_id", 2)).fetchall()) == 8
    assert con.sql("SELECT max_seq, segments, rows FROM span_compactions ORDER BY max_seq").fetchall() == [
        (1, 1, 3), (2, 1, 1), (3, 1, 3), (5, 2, 5)]
    # merged again with the others later: the promoted files are merged files like any
    assert segments.plan_remerge(con, fanout=2) is not None


def test_a_kill_after_segments_are_listed_as_merged_files_loses_nothing(tmp_path):
    """The promotion is one transaction and moves no file: killed right after it, the next start finds every file
    listed once (recover() deletes none of them) and the rows the same."""
    import subprocess
    import sys

    db = tmp_path / "s.duckdb"
    c = connect(db)
    for k in range(3):
        publish_segment(c, span_rows([(f"t{k}", f"s{j}", 10 * k + j) for j in range(3)], f"x{k}"), with_seq=True)
    want = rows(c)
    c.close()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = _CRASH.replace("segments.compact(con, group=2)", "segments.PROMOTE_MIN_ROWS = 3\nsegments.compact(con)")
    r = subprocess.run([sys.executable, "-c", script, str(db), "committed"], cwd=root, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": root}, timeout=120)
    assert r.returncode == 9, r.stderr
    c = connect(db)
    try:
        d = segments.segments_dir(db)
        assert segments.recover(c, d) == 0
        assert merged(c) == [(3, 0, 2, 1, 1), (3, 10, 12, 2, 2), (3, 20, 22, 3, 3)]  # one commit: all three
        assert c.sql("SELECT count(*) FROM span_segments").fetchall() == [(0,)]
        assert len(os.listdir(d)) == 3 and rows(c) == want
    finally:
        c.close()


def test_a_segment_published_under_another_seq_than_its_rows_say_is_refused(con, tmp_path):
    seg = segments.write_segment(span_rows([("t1", "s1", 10)]), str(tmp_path / "segs"), 7)
    with pytest.raises(StoreError, match="written for seq 7, published as 8"):
        segments.publish_file(seg, 8)


def test_a_segment_from_an_older_schema_reads_and_merges_with_nulls(con):
    """A release added a span column between two segments (here: the older file lacks ``name``): the tail reads
    both by column name, the missing value is NULL, and the merged file has every column."""
    publish_segment(con, span_rows([("t1", "s1", 10)], "old").drop_columns(["name"]))
    publish_segment(con, span_rows([("t1", "s2", 20)], "new"))
    assert rows(con) == [("t1", "s1", None), ("t1", "s2", "new")]
    assert segments.compact(con).files == 1
    assert rows(con) == [("t1", "s1", None), ("t1", "s2", "new")]


def test_an_insert_into_the_table_part_skips_spans_stored_in_parquet(con):
    """An import (or span_store = table after segments) of spans the collector already stored in a merged file or
    a tail segment: insert_spans skips them, so readers still see each span once."""
    publish_segment(con, span_rows([("t1", "s1", 10), ("t1", "s2", 20)], "merged"))
    segments.compact(con)
    publish_segment(con, span_rows([("t1", "s3", 30)], "tail"))
    # s1 (merged), s3 (tail) again, and a new s4; the window 10..40 meets both files
    assert insert_spans(con, span_rows([("t1", "s1", 10), ("t1", "s3", 30), ("t1", "s4", 40)], "part")) == 1
    assert rows(con) == [("t1", "s1", "merged"), ("t1", "s2", "merged"), ("t1", "s3", "tail"), ("t1", "s4", "part")]


_CRASH = """
import os, sys
from agentobs.store import segments
from agentobs.store.db import connect
step = sys.argv[2]
def crash(s):
    if s == step:
        os._exit(9)  # as a SIGKILL: no rollback, no close
segments._crash_point = crash
con = connect(sys.argv[1])
segments.compact(con, group=2)
os._exit(0)
"""


@pytest.mark.parametrize("step", ["written", "renamed", "committed"])
def test_a_compaction_killed_between_its_steps_loses_nothing_and_doubles_nothing(tmp_path, step):
    import subprocess
    import sys

    db = tmp_path / "s.duckdb"
    c = connect(db)
    publish_segment(c, span_rows([("t1", "s1", 10), ("t1", "s2", 20)], "a"))
    publish_segment(c, span_rows([("t1", "s2", 20), ("t1", "s3", 30)], "b"))  # s2 again
    publish_segment(c, span_rows([("t2", "s4", 40)], "c"))
    c.close()
    want = [("t1", "s1", "a"), ("t1", "s2", "a"), ("t1", "s3", "b"), ("t2", "s4", "c")]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _CRASH, str(db), step], cwd=root, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": root}, timeout=120)
    assert r.returncode == 9, r.stderr
    c = connect(db)
    try:
        d = segments.segments_dir(db)
        segments.recover(c, d)  # what the next start does
        assert rows(c) == want
        # every file on disk is listed once: a merged file that never committed, or retired files, are gone
        listed = {r[0] for r in c.sql("SELECT file FROM span_segments UNION ALL SELECT file FROM span_merged"
                                      ).fetchall()}
        assert {os.path.join(d, f) for f in os.listdir(d)} == listed
        # the first group (segments 1, 2) is merged iff the kill came after the commit
        assert len(merged(c)) == (1 if step == "committed" else 0)
        segments.compact(c)
        assert rows(c) == want
        assert c.sql("SELECT count(*) FROM span_segments").fetchall() == [(0,)]
        assert sum(m[0] for m in merged(c)) == 4
    finally:
        c.close()


def _merge_each(con, n: int) -> None:
    """Each tail segment into a merged file of its own (what a quiet collector's loader leaves: a merge per few
    small batches), without compact()'s merging again."""
    for _ in range(n):
        plan = segments.plan_merge(con, 1)
        segments.commit_merge(con, plan, segments.write_merge(plan))


def test_merged_files_are_merged_again_by_size_class_keeping_rows_and_marks(con):
    """64 one-span segments, each merged alone: 64 merged files of 1 row (size class floor(log_8 1) = 0). Merged
    again 8 adjacent files of one class at a time: 8 files of 8 rows (class 1), then those 8 into one of 64 rows —
    72 files merged again. The spans, each row's segment (_seg) and the model's rows-since-a-mark are the same."""
    for k in range(64):
        publish_segment(con, span_rows([(f"t{k:02d}", "s", 1000 + k)], f"n{k}"))
    _merge_each(con, 64)
    before = rows(con)
    since = sorted(con.sql(segments.since_sql(con, "trace_id", 40)).fetchall())
    assert len(merged(con)) == 64 and len(before) == 64
    out = segments.compact(con)
    assert (out.segments, out.files, out.remerged, out.left) == (0, 0, 72, 0)
    assert merged(con) == [(64, 1000, 1063, 1, 64)]
    (mf,) = con.sql("SELECT file FROM span_merged").fetchall()[0]
    assert os.path.basename(mf) == "merged-0000000000000001-0000000000000064.parquet"
    assert rows(con) == before
    assert con.sql(f"SELECT _seg FROM read_parquet('{mf}')").fetchall() == [(k,) for k in range(1, 65)]
    assert sorted(con.sql(segments.since_sql(con, "trace_id", 40)).fetchall()) == since == [
        (f"t{k:02d}",) for k in range(40, 64)]  # segments 41..64 hold t40..t63
    # the 72 inputs are retired (a read snapshot may still list them), then deleted
    assert con.sql("SELECT count(*) FROM span_segments_retired").fetchall() == [(64 + 72,)]
    segments.sweep(con)
    assert sorted(os.listdir(os.path.dirname(mf))) == [os.path.basename(mf)]


def test_a_run_to_merge_again_is_adjacent_files_of_one_size_class(con):
    """Files of 9 rows (class 1) and 1 row (class 0), interleaved so no 8 adjacent files share a class: nothing
    is merged again; with 8 more 1-row files after them, the oldest 8 adjacent 1-row files are."""
    k = 0
    for size in [9, 1, 9, 1, 9, 1, 9, 1, 9, 1, 9, 1, 9, 1, 9, 1]:
        publish_segment(con, span_rows([(f"t{k}", f"s{j}", 10 * k + j) for j in range(size)]))
        k += 1
    _merge_each(con, 16)
    assert segments.plan_remerge(con) is None
    for _ in range(8):
        publish_segment(con, span_rows([(f"t{k}", "s0", 10 * k)]))
        k += 1
    _merge_each(con, 8)
    plan = segments.plan_remerge(con)
    # the oldest run: the last interleaved file (16, 1 row) and 7 of the new ones (17..23); 24 waits
    assert (plan.first, plan.last) == (16, 23)
    n = len(rows(con))
    segments.compact(con)
    # files 1..15, the 8-row file 16..23 (class 1 beside 15's 9 rows: a run of 2) and 24
    assert len(merged(con)) == 15 + 1 + 1 and len(rows(con)) == n == 8 * 9 + 8 + 8


def test_merged_files_of_two_schemas_are_merged_again_with_nulls(con):
    """The oldest merged file comes from a release without the ``name`` column: merged again with 7 newer ones, it
    reads NULL there and the others keep theirs."""
    publish_segment(con, span_rows([("t0", "s", 0)], "old").drop_columns(["name"]))
    for k in range(1, 8):
        publish_segment(con, span_rows([(f"t{k}", "s", k)], f"n{k}"))
    _merge_each(con, 8)
    assert segments.compact(con).remerged == 8
    assert rows(con) == [("t0", "s", None)] + [(f"t{k}", "s", f"n{k}") for k in range(1, 8)]


def test_a_merge_again_stopped_by_the_collector_leaves_the_files_listed(con):
    import threading

    for k in range(8):
        publish_segment(con, span_rows([(f"t{k}", "s", k)]))
    _merge_each(con, 8)
    stop = threading.Event()
    stop.set()
    out = segments.write_remerge(segments.plan_remerge(con), stop)
    assert out.tmp is None and len(merged(con)) == 8 and len(rows(con)) == 8
    d = os.path.dirname(con.sql("SELECT file FROM span_merged LIMIT 1").fetchall()[0][0])
    assert not [f for f in os.listdir(d) if f.startswith(segments.TMP_PREFIX)]


_CRASH_AGAIN = _CRASH.replace("segments.compact(con, group=2)", "segments.compact(con)")


@pytest.mark.parametrize("step", ["written", "renamed", "committed"])
def test_a_merge_again_killed_between_its_steps_loses_nothing_and_doubles_nothing(tmp_path, step):
    import subprocess
    import sys

    db = tmp_path / "s.duckdb"
    c = connect(db)
    for k in range(8):
        publish_segment(c, span_rows([(f"t{k}", "s", k), (f"t{k}", "r", k)]))
    _merge_each(c, 8)
    want = rows(c)
    c.close()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _CRASH_AGAIN, str(db), step], cwd=root, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": root}, timeout=120)
    assert r.returncode == 9, r.stderr
    c = connect(db)
    try:
        d = segments.segments_dir(db)
        segments.recover(c, d)
        assert rows(c) == want
        listed = {r[0] for r in c.sql("SELECT file FROM span_merged").fetchall()}
        assert {os.path.join(d, f) for f in os.listdir(d)} == listed
        # the 8 files are one iff the kill came after the commit
        assert len(listed) == (1 if step == "committed" else 8)
        segments.compact(c)
        assert rows(c) == want and len(merged(c)) == 1
    finally:
        c.close()


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
    with pytest.raises(StoreError, match="span_segments, span_merged.*missing.*0000000000000001.parquet"):
        segments.recover(con, d)


def test_the_sql_sandbox_reads_segment_rows_and_nothing_else(con, tmp_path):
    from agentobs.errors import QueryError
    from agentobs.sql import run_query

    publish_segment(con, span_rows([("t1", "s1", 10)], "seg"))
    con.close()
    db = str(tmp_path / "s.duckdb")
    res = run_query("SELECT span_id, name FROM spans", db=db)
    assert res.table.to_pylist() == [{"span_id": "s1", "name": "seg"}]
    c = connect(db)
    segments.compact(c)  # now in a merged file
    c.close()
    assert run_query("SELECT span_id, name FROM spans", db=db).table.to_pylist() == [{"span_id": "s1", "name": "seg"}]
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
    # 2 segments merged into one file; 3 distinct spans written; both small files deleted at once (no collector's
    # snapshots to wait for)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 merged into 1 file(s) (3 spans written" in r.stdout and "0 large segment(s) listed as they are), 0 left; 0 merged file(s) merged again; 2 files deleted" in r.stdout
    assert not os.path.exists(f1) and not os.path.exists(f2)
    c = connect(tmp_path / "s.duckdb")
    assert rows(c) == [("t1", "s1", "a"), ("t1", "s2", "a"), ("t1", "s3", "a")]
    assert c.sql("SELECT count(*) FROM span_segments").fetchall() == [(0,)]
    c.close()


def test_span_files_use_a_dictionary_for_repeating_strings_only_and_read_back_the_same(con):
    """Segments and merged files: dictionary pages for the string columns whose values repeat (``name`` here), plain
    pages for the per-span ones (ids, attributes JSON); the rows read back as written, in the merged file too."""
    import pyarrow.parquet as pq

    table = span_rows([("t1", "s1", 10), ("t1", "s2", 20), ("t2", "s3", 30)], "chat m")
    table = table.set_column(table.schema.get_field_index("attributes"), "attributes",
                             pa.array(['{"k":1}', '{"k":2}', '{"k":3}']))
    f = publish_segment(con, table)
    meta = pq.ParquetFile(f).metadata.row_group(0)
    enc = {meta.column(i).path_in_schema: meta.column(i).has_dictionary_page for i in range(meta.num_columns)}
    assert enc["name"] and enc["model"]
    assert not enc["trace_id"] and not enc["span_id"] and not enc["attributes"]
    assert pq.read_table(f).equals(table)
    segments.compact(con)
    merged_file = con.execute("SELECT file FROM span_merged").fetchone()[0]
    back = pq.read_table(merged_file)
    assert back.drop_columns(["_seg"]).equals(table) and back["_seg"].to_pylist() == [1, 1, 1]
    assert not pq.ParquetFile(merged_file).metadata.row_group(0).column(0).has_dictionary_page  # trace_id
