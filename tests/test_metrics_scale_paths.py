"""The fast paths of a metric run give the same numbers as the plain ones: window pruning of the working set
(only sessions active in the window and the period before it) and the reuse of one preparation by a second
prepare() of the same store state, window, filters and settings. The data is the scale bench's generator
(bench/metrics_scale.py: 15-call sessions over a day, 8 instances, routed-away and evicted turns, failures,
ITL arrays), small."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from agentobs.config import Settings
from agentobs.metrics import MetricRun, names, prepare
from agentobs.metrics.cost import parse_cost
from agentobs.model import connect
from agentobs.source import DuckDBSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from metrics_scale import GENERATE  # noqa: E402

from agentobs.source import as_source

T0 = 1.8e9  # the generator's first session starts here; sessions start uniformly over the next 86,400 s


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("scale") / "s.duckdb")
    con = connect(path)
    con.execute(GENERATE, {"n": 6000})   # 400 sessions × 15 calls
    con.close()
    return path


def _suite(run: MetricRun) -> dict[str, pl.DataFrame]:
    return {n: run.compute(n) for n in names()}


def test_pruned_window_equals_the_full_working_set(store):
    # a 6-hour window in the middle of the day: sessions that started before it and run into it, sessions
    # that go on after it, and the 6 hours before it (the report's previous period) must all come out the same
    since, until = T0 + 30_000, T0 + 51_600
    con = connect(store, read_only=True)
    try:
        s = Settings()
        full = MetricRun(con, since, until, {}, s, parse_cost({}), prune=False)
        pruned = MetricRun(con, since, until, {}, s, parse_cost({}), prune=True)
        n_full = full.cur.sql("SELECT count(*) FROM m_calls").fetchall()[0][0]
        n_pruned = pruned.cur.sql("SELECT count(*) FROM m_calls").fetchall()[0][0]
        assert n_full == 6000 and 0 < n_pruned < n_full   # pruning dropped the sessions far from the window
        a, b = _suite(full), _suite(pruned)
        for name in names():
            assert a[name].height > 0 or name == "fleet_hit_rate", name   # no engine scrapes in this store
            assert_frame_equal(a[name], b[name], check_exact=False, rel_tol=1e-9)
        # the period before [since, until) (the report's week-over-week comparison) is intact too
        cols = ("call_id, prev_call_id, reusable_tokens_eff, reprefill_tokens, miss_cause, window_outcome, "
                "rent_paid_token_s, turn_no, is_last, abandoned, cost_usd")
        q = f"SELECT {cols} FROM m_calls WHERE start_s >= $lo AND start_s < $hi ORDER BY call_id"
        p = {"lo": since - (until - since), "hi": until}
        assert_frame_equal(full.cur.sql(q, params=p).pl(), pruned.cur.sql(q, params=p).pl())
        full.close()
        pruned.close()
    finally:
        con.close()


def test_a_second_prepare_of_the_same_window_reuses_the_first(store):
    s = Settings()
    src = DuckDBSource(store)  # runs are shared on one Source (agentobs.metrics.runcache: its run_cache)
    run1, close1 = prepare(as_source(src), since=T0, until=T0 + 43_200, settings=s)
    run2, close2 = prepare(as_source(src), since=T0, until=T0 + 43_200, settings=s)      # e.g. findings inside the report
    run3, close3 = prepare(as_source(src), since=T0, until=T0 + 43_201, settings=s)      # another window: its own run
    run4, close4 = prepare(as_source(src), since=T0, until=T0 + 43_200, settings=Settings(values={"ttft_slo_s": 1.0}))
    try:
        assert run2 is run1 and run3 is not run1 and run4 is not run1
        other, close_other = prepare(DuckDBSource(store), since=T0, until=T0 + 43_200, settings=s)
        close_other()
        assert other is not run1                   # another Source (same file) has its own cache
        assert len(src.run_cache.entries) == 3     # run1 (2 users), run3, run4
        close1()                                   # the first caller is done; the second still reads
        assert run2.compute("reuse", "task_type").height == 3
    finally:
        close2()
        close3()
        close4()
    import duckdb

    with pytest.raises(duckdb.Error):              # the last release closed the shared cursor
        run1.cur.sql("SELECT 1").fetchall()
    run5, close5 = prepare(as_source(src), since=T0, until=T0 + 43_200, settings=s)
    try:
        assert run5 is not run1                    # nothing is kept after the last user closed
    finally:
        close5()
    assert src.run_cache.entries == {}


def test_a_run_moved_to_the_previous_period_equals_a_preparation_of_it(store):
    # the console's Overview computes "change vs the previous period" from the run of the view: the working set
    # of [since, until) holds every session active in [since − (until − since), until), so moving the run to
    # the period just before gives exactly what preparing that period gives, metric by metric
    since, until = T0 + 30_000, T0 + 51_600
    prev = (since - (until - since), since)
    s = Settings()
    con = connect(store, read_only=True)
    try:
        moved = MetricRun(con, since, until, {}, s, parse_cost({}))
        fresh = MetricRun(con, *prev, {}, s, parse_cost({}))
        moved.set_window(*prev)
        assert (moved.since, moved.until) == prev
        a, b = _suite(moved), _suite(fresh)
        for name in names():
            assert_frame_equal(a[name], b[name], check_exact=False, rel_tol=1e-9)
        # and back: the view's own numbers again
        own = MetricRun(con, since, until, {}, s, parse_cost({}))
        moved.set_window(since, until)
        a, b = _suite(moved), _suite(own)
        for name in names():
            assert_frame_equal(a[name], b[name], check_exact=False, rel_tol=1e-9)
        # a window the working set does not cover is refused, not answered wrongly
        from agentobs.errors import QueryError

        with pytest.raises(QueryError, match="outside this run's working set"):
            moved.set_window(prev[0] - 1, since)
        with pytest.raises(QueryError, match="outside this run's working set"):
            moved.set_window(since, until + 1)
        for r in (moved, fresh, own):
            r.close()
    finally:
        con.close()


def test_findings_give_a_shared_run_back_with_its_own_window(store):
    # findings without a since narrow the run to their default window (findings_default_window_s before the
    # newest call); a run shared with another user (the Overview's metrics, the report) must read as before
    from agentobs.findings import run as findings

    s = Settings(values={"findings_default_window_s": 21_600.0})   # 6 h: narrower than the day of data
    src = DuckDBSource(store)  # runs are shared on one Source (its run_cache), as the report hands findings its own
    run, close = prepare(as_source(src), settings=s)
    try:
        before = _suite(run)
        in_win = run.cur.sql("SELECT count(*) FILTER (WHERE in_win) FROM m_calls").fetchall()[0][0]
        assert in_win == 6000
        findings(as_source(src), settings=s, simulate=False)          # shares `run` (same Source, window, settings)
        assert run.cur.sql("SELECT count(*) FILTER (WHERE in_win) FROM m_calls").fetchall()[0][0] == 6000
        after = _suite(run)
        for name in names():
            assert_frame_equal(before[name], after[name])
        # the narrowing itself happened (and is what reset_window undid): restrict_since reports a change
        assert run.restrict_since(T0 + 60_000) is True
        assert run.cur.sql("SELECT count(*) FILTER (WHERE in_win) FROM m_calls").fetchall()[0][0] < 6000
        run.reset_window()
        assert run.cur.sql("SELECT count(*) FILTER (WHERE in_win) FROM m_calls").fetchall()[0][0] == 6000
    finally:
        close()


def test_a_window_around_all_the_data_skips_the_pruning_pass(store):
    # every call of the store (a day from T0) overlaps [since − (until − since), until): pruning would keep
    # every session, so m_src is the plain copy (the check reads two aggregates of the raw spans), and the
    # numbers are those of the pruned path
    since, until = T0 - 3_600, T0 + 90_000
    s = Settings()
    con = connect(store, read_only=True)
    try:
        plain = MetricRun(con, since, until, {}, s, parse_cost({}))
        assert "prune_check" in plain.timings
        assert plain._nothing_to_prune() is True
        assert plain.cur.sql("SELECT count(*) FROM m_src").fetchall()[0][0] == 6000
        tight = MetricRun(con, T0 + 30_000, T0 + 51_600, {}, s, parse_cost({}))
        assert tight._nothing_to_prune() is False   # the day's early and late sessions lie outside
        full = MetricRun(con, since, until, {}, s, parse_cost({}), prune=False)
        a, b = _suite(plain), _suite(full)
        for name in names():
            assert_frame_equal(a[name], b[name], check_exact=False, rel_tol=1e-9)
        for r in (plain, tight, full):
            r.close()
    finally:
        con.close()


def test_a_move_that_fails_halfway_is_redone_by_the_next_one(store):
    # set_window re-flags in_win in two UPDATEs; if the second fails, the run is marked unsettled, so moving it
    # back to its own window (what the console does after a failure) recomputes in_win instead of returning early
    import duckdb

    since, until = T0 + 30_000, T0 + 51_600
    con = connect(store, read_only=True)
    try:
        run = MetricRun(con, since, until, {}, Settings(), parse_cost({}))
        count = "SELECT count(*) FILTER (WHERE in_win) FROM m_calls"
        n0 = run.cur.sql(count).fetchall()[0][0]
        real = run.cur

        class FailSecondUpdate:
            updates = 0

            def __getattr__(self, name):
                return getattr(real, name)

            def execute(self, sql, params=None):
                if sql.lstrip().startswith("UPDATE"):
                    FailSecondUpdate.updates += 1
                    if FailSecondUpdate.updates == 2:
                        raise duckdb.IOException("disk full (simulated)")
                return real.execute(sql, params or {})

        run.cur = FailSecondUpdate()
        with pytest.raises(duckdb.IOException):
            run.set_window(since - (until - since), since)
        run.cur = real
        assert (run.since, run.until) == (since, until)           # the move did not complete
        assert run.cur.sql(count).fetchall()[0][0] != n0           # …but the first UPDATE did change in_win
        run.set_window(since, until)                               # the same window: redone, not skipped
        assert run.cur.sql(count).fetchall()[0][0] == n0
        run.close()
    finally:
        con.close()
