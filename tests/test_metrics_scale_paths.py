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
from agentobs.store.db import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from metrics_scale import GENERATE  # noqa: E402

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
    run1, close1 = prepare(store, since=T0, until=T0 + 43_200, settings=s)
    run2, close2 = prepare(store, since=T0, until=T0 + 43_200, settings=s)      # e.g. findings inside the report
    run3, close3 = prepare(store, since=T0, until=T0 + 43_201, settings=s)      # another window: its own run
    run4, close4 = prepare(store, since=T0, until=T0 + 43_200, settings=Settings(values={"ttft_slo_s": 1.0}))
    try:
        assert run2 is run1 and run3 is not run1 and run4 is not run1
        close1()                                   # the first caller is done; the second still reads
        assert run2.compute("reuse", "task_type").height == 3
    finally:
        close2()
        close3()
        close4()
    import duckdb

    with pytest.raises(duckdb.Error):              # the last release closed the shared cursor
        run1.cur.sql("SELECT 1").fetchall()
    run5, close5 = prepare(store, since=T0, until=T0 + 43_200, settings=s)
    try:
        assert run5 is not run1                    # nothing is kept after the last user closed
    finally:
        close5()
