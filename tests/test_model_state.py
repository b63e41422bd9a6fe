"""The maintained session model (agentobs.model.state): incremental refreshes equal a full rebuild, the rebuild
equals the call_reuse view, and a metric run over the state equals one that derives."""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl
import pytest
from builders import publish_segment

from agentobs.config import Settings
from agentobs.metrics import run as mr
from agentobs.model import connect, itl, rollups, state
from agentobs.source import as_source
from agentobs.store.writer import insert_spans


def _rows_differ(con, a: str, b: str, cols: list[str]) -> tuple[int, int]:
    sel = ", ".join(cols)
    one = con.execute(f"SELECT count(*) FROM (SELECT {sel} FROM {a} EXCEPT ALL SELECT {sel} FROM {b})").fetchall()
    two = con.execute(f"SELECT count(*) FROM (SELECT {sel} FROM {b} EXCEPT ALL SELECT {sel} FROM {a})").fetchall()
    return one[0][0], two[0][0]


# The two incremental tests load a third of the sample's sessions (a trace per session in sample_data/fleet; 2,354 of
# its 7,574 calls), not all of it: incremental = rebuild is a property of each arrival order, and their cost is four
# refreshes that each re-derive every touched session, plus the ITL gaps compared row by row (half a million rows here,
# 1.7 million for the whole sample). The third is chosen by a hash of the trace id, with all the KV events (the
# instance-wide removals are the eviction evidence). It keeps every shape these tests rely on — retries, sub-agent
# branches, abandoned sessions, calls routed to another instance, evictions seen in KV windows (after a resume, idle
# and queued), calls that arrive late (their agent span and KV events after them, by the arrival order below), the
# miss causes prior_hit, evicted_partial, prompt_edit, error and unexplained, ITL gaps attributed to other calls —
# and _has_every_shape checks so on the result, so a change of the sample or of DuckDB's hash cannot make them vacuous.
SUBSET = "hash(trace_id, 108) % 3 = 0"


def _directories_exact(con) -> None:
    """The state's directories hold each trace of the spans read and each unit key of model_calls once, and no
    other (a refresh asks them whether a key was seen before: one missing would skip its stored rows)."""
    for table, key, want in ((state.TRACES, "trace_id", "SELECT DISTINCT trace_id FROM spans"),
                             (state.KEYS, "skey", "SELECT DISTINCT skey FROM model_calls")):
        assert _rows_differ(con, f"(SELECT {key} FROM {table})", f"({want})", [key]) == (0, 0), table
        bad = con.execute(f"SELECT count(*) FROM {table} WHERE {key.replace('trace_id', 'th').replace('skey', 'kh')} "
                          f"<> hash({key})").fetchall()[0][0]
        assert bad == 0, table


def _has_every_shape(con) -> None:
    got = con.execute("""SELECT count(*) FILTER (WHERE is_retry), count(*) FILTER (WHERE branch <> 'main'),
                                count(*) FILTER (WHERE abandoned), count(*) FILTER (WHERE prev_instance <> instance),
                                count(*) FILTER (WHERE rent_mode = 'kv_events'), list(DISTINCT miss_cause),
                                list(DISTINCT evict_phase)
                         FROM model_calls""").fetchall()[0]
    assert all(n > 0 for n in got[:5]), got
    assert {"prior_hit", "evicted_partial", "prompt_edit", "error", "unexplained", "routed_away"} <= set(got[5]), got
    assert {"after_resume", "idle", "queued"} <= set(got[6]), got


@dataclass(frozen=True)
class Built:
    """The sample with its maintained model rebuilt once (default settings): the file, whether a state was current
    before the rebuild, and the rebuild's result."""
    path: Path
    current_before: bool
    rebuilt: state.Refreshed


@pytest.fixture(scope="module")
def built(sample_db, tmp_path_factory) -> Built:
    """One rebuild of the sample's maintained model for the module (a full rebuild is several CPU-seconds): the tests
    that only read the state open it read-only (``ro``); one that changes it works on a file copy (``state_copy``)."""
    path = tmp_path_factory.mktemp("state") / "state.duckdb"
    shutil.copyfile(sample_db, path)
    con = connect(path)
    s = Settings()
    before = state.current(con, s)
    r = state.rebuild(con, s)
    con.close()
    return Built(path, before, r)


def ro(path: Path):
    """A read-only connection to a store file (tests sharing one file never write it)."""
    return connect(path, read_only=True)


@pytest.fixture
def state_copy(built, tmp_path) -> Path:
    """A file copy of the rebuilt sample, for a test that refreshes or rebuilds it with other settings."""
    path = tmp_path / "state.duckdb"
    shutil.copyfile(built.path, path)
    return path


def test_rebuild_equals_call_reuse_view(built, state_copy):
    s = Settings()
    # the copy of the sample had no state; the rebuild derived every call
    assert not built.current_before
    con = ro(built.path)
    r = built.rebuilt
    assert r.mode == "rebuild" and r.calls == con.execute("SELECT count(*) FROM llm_calls").fetchall()[0][0]
    assert state.current(con, s)
    cols = [c[0] for c in con.execute("DESCRIBE call_reuse").fetchall()]
    assert _rows_differ(con, "model_calls", "call_reuse", cols) == (0, 0)
    con.close()
    con = connect(state_copy)
    assert state.refresh(con, s).mode == "current"
    # another setting: stale, and refresh rebuilds
    assert not state.current(con, Settings(values={"hit_tolerance_blocks": 2}))  # the tolerance is in it too
    s2 = Settings(values={"default_block_size": 32})
    assert not state.current(con, s2)
    assert state.refresh(con, s2).mode == "rebuild"
    con.close()


def test_incremental_equals_rebuild_shuffled_late_duplicate(sample_db, tmp_path):
    """Spans arrive in a shuffled order (agent spans carrying the session after their gateway calls, engine spans
    before or after their gateway span), in parts, one part again (duplicates), and the KV events late, in two
    parts: after every arrival a refresh; at the end the incremental rows equal a full rebuild's."""
    con = connect(tmp_path / "inc.duckdb")
    s = Settings()
    con.execute(f"ATTACH '{sample_db}' AS src (READ_ONLY)")
    con.execute("INSERT INTO engine_config SELECT * FROM src.main.engine_config")
    con.execute(f"CREATE TEMP TABLE sp AS SELECT *, hash(span_id, 7) % 4 AS part FROM src.main.spans WHERE {SUBSET}")
    n_calls = con.execute("SELECT count(*) FROM sp WHERE role = 'gateway'").fetchall()[0][0]  # a call per gateway span
    con.execute("CREATE TEMP TABLE kv AS SELECT *, hash(seq, instance) % 2 AS part FROM src.main.kv_events")
    assert state.refresh(con, s).mode == "rebuild"  # none yet: an empty one
    modes = []
    for part in range(4):
        con.execute("INSERT INTO spans_part SELECT * EXCLUDE (part) FROM sp WHERE part = ? ORDER BY hash(span_id)", [part])
        if part == 2:  # an earlier part again (an OTLP retry), as the writers store spans: the stored ones skipped
            again = con.sql("SELECT * EXCLUDE (part) FROM sp WHERE part = 0").to_arrow_table()
            assert insert_spans(con, again) == 0
        if part in (1, 3):  # KV events arrive late, in two parts
            con.execute("INSERT INTO kv_events SELECT * EXCLUDE (part) FROM kv WHERE part = ?", [part // 3])
        modes.append(state.refresh(con, s).mode)
    assert modes == ["incremental"] * 4
    assert state.current(con, s)
    _has_every_shape(con)
    _directories_exact(con)
    cols = [c[0] for c in con.execute("DESCRIBE model_calls").fetchall()]
    con.execute("CREATE TEMP TABLE inc AS SELECT * FROM model_calls")
    for t in (*rollups.TABLES, itl.TABLE):
        con.execute(f"CREATE TEMP TABLE inc_{t} AS SELECT * FROM {t}")
    assert state.rebuild(con, s).calls == con.execute("SELECT count(*) FROM inc").fetchall()[0][0] == n_calls > 2000
    # every column, the call's own and every computed one (block_hashes: a list, compared as text)
    cols = [c if c != "block_hashes" else "CAST(block_hashes AS VARCHAR) AS bh" for c in cols]
    assert _rows_differ(con, "inc", "model_calls", cols) == (0, 0)
    # the rollups and sketches kept by deltas equal those made whole
    for t in rollups.TABLES:
        rcols = [c[0] for c in con.execute(f"DESCRIBE {t}").fetchall()]
        assert _rows_differ(con, f"inc_{t}", t, rcols) == (0, 0), t
    # the ITL gaps and their attribution, kept per call, equal those made whole; the gaps' times to within a few
    # ulps (the running sum of the gaps is vectorized over the lists derived together: at 1.8e9 s one ulp is 2.4e-7 s)
    icols = [c[0] for c in con.execute(f"DESCRIBE {itl.TABLE}").fetchall() if c[0] not in ("ta", "tb")]
    assert _rows_differ(con, f"inc_{itl.TABLE}", itl.TABLE, icols) == (0, 0)
    far = con.execute(f"""SELECT count(*) FROM inc_{itl.TABLE} a JOIN {itl.TABLE} b USING (trace_id, call_id, i)
                          WHERE abs(a.ta - b.ta) > 1e-6 OR abs(a.tb - b.tb) > 1e-6""").fetchall()[0][0]
    assert far == 0
    n, att = con.execute(f"SELECT count(*), count(off_call_id) FROM {itl.TABLE}").fetchall()[0]
    assert n > 0 and 0 < att < n, (n, att)
    con.close()


def test_incremental_reads_segment_rows_and_skips_compacted_ones(sample_db, tmp_path):
    """The same arrivals as above, stored as Parquet segments (span_store = segments), a part twice (a retried
    export in two segments) and compactions into merged Parquet files in between: every refresh incremental, the
    result a rebuild's, a compaction of segments already read leaves the model current, and segments merged before
    they were read are read from the merged file."""
    from agentobs.store import segments

    path = tmp_path / "seg.duckdb"
    con = connect(path)
    s = Settings()
    con.execute(f"ATTACH '{sample_db}' AS src (READ_ONLY)")
    con.execute("INSERT INTO engine_config SELECT * FROM src.main.engine_config")
    con.execute("INSERT INTO kv_events SELECT * FROM src.main.kv_events")
    con.execute(f"CREATE TEMP TABLE sp AS SELECT *, hash(span_id, 7) % 4 AS part FROM src.main.spans WHERE {SUBSET}")
    n_calls = con.execute("SELECT count(*) FROM sp WHERE role = 'gateway'").fetchall()[0][0]  # a call per gateway span
    assert state.refresh(con, s).mode == "rebuild"
    for part in range(4):
        publish_segment(con, con.sql("SELECT * EXCLUDE (part) FROM sp WHERE part = ?",
                                            params=[part]).to_arrow_table())
        if part == 2:  # part 0 again, in a segment of its own; segments 3 and 4 (not read yet) merged before
            # the refresh: part 2's rows are read from the merged file (part 0's copies are not written to it)
            publish_segment(con, con.sql("SELECT * EXCLUDE (part) FROM sp WHERE part = 0").to_arrow_table())
            assert segments.compact(con).segments == 2
        assert state.refresh(con, s).mode == "incremental"
        if part == 1:  # segments 1 and 2 (both read) merged into a Parquet file: the marks hold, nothing to derive
            assert segments.compact(con).segments == 2
            r = state.refresh(con, s)
            assert (r.mode, r.derived) == ("current", 0)
    assert con.sql("SELECT count(*) FROM span_segments").fetchall() == [(1,)]  # part 3; the others merged
    n_spans = con.sql("SELECT count(*) FROM sp").fetchall()[0][0]
    assert con.sql("SELECT count(*) FROM spans").fetchall()[0][0] == n_spans  # the repeated part read once
    _has_every_shape(con)
    _directories_exact(con)
    con.execute("CREATE TEMP TABLE inc AS SELECT * FROM model_calls")
    cols = [c[0] if c[0] != "block_hashes" else "CAST(block_hashes AS VARCHAR) AS bh"
            for c in con.execute("DESCRIBE model_calls").fetchall()]
    assert state.rebuild(con, s).calls == con.execute("SELECT count(*) FROM inc").fetchall()[0][0] == n_calls > 2000
    assert _rows_differ(con, "inc", "model_calls", cols) == (0, 0)
    con.close()


def test_late_span_moves_a_call_and_data_end(tmp_path):
    """A gateway call first seen without a session joins one when its trace's agent span arrives; the end of the
    data moving on flips the previous session's last call to abandoned. Hand-made: two calls."""
    con = connect(tmp_path / "late.duckdb")
    s = Settings(values={"abandoned_after_s": 100.0})
    ins = ("INSERT INTO spans_part (trace_id, span_id, parent_span_id, start_ns, end_ns, role, session_id, instance, "
           "model, input_tokens, cached_tokens, output_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, 'i1', 'm', ?, ?, 10)")
    sec = 1_000_000_000
    con.execute(ins, ["t1", "g1", None, 0, 2 * sec, "gateway", "s1", 1000, 0])
    con.execute(ins, ["t2", "g2", "a2", 10 * sec, 12 * sec, "gateway", None, 1600, 992])
    assert state.refresh(con, s).mode == "rebuild"
    row = con.execute("SELECT session_id, abandoned FROM model_calls WHERE call_id = 'g2'").fetchall()
    assert row == [(None, False)]  # no session yet; data ends at 12 s, 10 s after g1: not abandoned
    # the agent span of trace t2 arrives late: g2 is in s1, after g1; and it ends at 200 s
    con.execute(ins, ["t2", "a2", None, 9 * sec, 200 * sec, "agent", "s1", None, None])
    r = state.refresh(con, s)
    assert r.mode == "incremental"
    got = con.execute("SELECT call_id, session_id, prev_call_id, reusable_tokens, reprefill_tokens, is_last, "
                      "abandoned FROM model_calls ORDER BY call_id").fetchall()
    # g2: prev g1 (P(g1) = 1000 ≤ 1600: append-only R = 1000, R_eff = floor(1000/16)·16 = 992 = C: X = 0);
    # g2 is s1's last call and ended 188 s before the data's end (200 s) ≥ 100 s: abandoned
    assert got == [("g1", "s1", None, None, None, False, False), ("g2", "s1", "g1", 1000, 0, True, True)]
    # g2's own unit ('call:t2/g2') is gone from the key directory, s1 is there once
    _directories_exact(con)
    # a new trace t3 (none of its spans seen before) continues the stored session s1: found by the key directory,
    # s1 is derived again with it — g3's previous call is g2 (P(g2) = 1600 ≤ 2000: R = 1600, R_eff = C = 1600)
    con.execute(ins, ["t3", "g3", None, 201 * sec, 203 * sec, "gateway", "s1", 2000, 1600])
    r = state.refresh(con, s)
    assert (r.mode, r.sessions, r.derived) == ("incremental", 1, 3)
    got = con.execute("SELECT call_id, prev_call_id, reusable_tokens, reprefill_tokens, is_last, abandoned "
                      "FROM model_calls ORDER BY call_id").fetchall()
    # g2 is no longer s1's last call (g3 is, 0 s before the data's end): neither abandoned
    assert got == [("g1", None, None, None, False, False), ("g2", "g1", 1000, 0, False, False),
                   ("g3", "g2", 1600, 0, True, False)]
    _directories_exact(con)
    con.execute("CREATE TEMP TABLE inc AS SELECT * FROM model_calls")
    state.rebuild(con, s)
    cols = [c[0] for c in con.execute("DESCRIBE model_calls").fetchall() if c[0] != "block_hashes"]
    assert _rows_differ(con, "inc", "model_calls", cols) == (0, 0)
    con.close()


def test_refresh_attributes_a_long_gap_to_a_prefill_inside_it(tmp_path):
    """A stored ITL gap over three 5 s cells takes, in a refresh, the prefill of a new call that lies inside its
    middle cell (the overlap join's third form: neither the gap's first nor its last cell); and the result equals a
    rebuild's. Hand-made: two calls on one instance."""
    con = connect(tmp_path / "gap.duckdb")
    s = Settings()
    ins = ("INSERT INTO spans_part (trace_id, span_id, start_ns, end_ns, role, session_id, instance, model, "
           "input_tokens, cached_tokens, output_tokens, ttft_s, itl_ms) "
           "VALUES (?, ?, ?, ?, 'gateway', ?, 'i1', 'm', ?, 0, 3, ?, ?)")
    sec = 1_000_000_000
    # a: first token at 1 s, then gaps of 0.1, 12 and 0.1 s: the second spans [1.1, 13.1] s, cells 0, 1 and 2
    con.execute(ins, ["ta", "a", 0, 14 * sec, "sa", 100, 1.0, [100.0, 12000.0, 100.0]])
    assert state.refresh(con, s).mode == "rebuild"
    assert con.execute("SELECT i, c0, c1, off_call_id FROM model_itl_gap ORDER BY i").fetchall() == [
        (1, 0, 0, None), (2, 0, 2, None), (3, 2, 2, None)]
    # b: starts at 5.5 s, first token at 6.5 s: its prefill [5.5, 6.5] s (P − C = 5000) lies in cell 1 only
    con.execute(ins, ["tb", "b", int(5.5 * sec), 7 * sec, "sb", 5000, 1.0, None])
    assert state.refresh(con, s).mode == "incremental"
    got = con.execute("SELECT call_id, i, off_call_id, off_computed FROM model_itl_gap ORDER BY i").fetchall()
    assert got == [("a", 1, None, None), ("a", 2, "b", 5000), ("a", 3, None, None)]
    con.execute(f"CREATE TEMP TABLE inc AS SELECT * EXCLUDE (ta, tb) FROM {itl.TABLE}")
    state.rebuild(con, s)
    cols = [c[0] for c in con.execute("DESCRIBE inc").fetchall()]
    assert _rows_differ(con, "inc", itl.TABLE, cols) == (0, 0)
    con.close()


def _same(a: pl.DataFrame, b: pl.DataFrame, name: str) -> None:
    assert a.schema == b.schema and a.height == b.height, name  # the same columns of the same types
    keys = [c for c, t in a.schema.items() if t in (pl.String, pl.Boolean)]
    if keys:
        a, b = a.sort(keys, nulls_last=True), b.sort(keys, nulls_last=True)
    for c in a.columns:
        for u, v in zip(a[c].to_list(), b[c].to_list(), strict=True):
            if isinstance(u, float) and isinstance(v, float):
                # sums of doubles in another order: equal to 1e-9 relative
                assert u == v or (math.isnan(u) and math.isnan(v)) or abs(u - v) <= 1e-9 * max(abs(u), abs(v)), \
                    (name, c, u, v)
            else:
                assert u == v, (name, c, u, v)


def test_metric_run_over_state_equals_derived(sample_db, built):
    s = Settings()
    # derived: from the sample itself (no maintained state), read-only
    sample = ro(sample_db)
    lo, hi, inst = sample.execute("SELECT min(start_s), max(start_s), min(instance) FROM llm_calls").fetchall()[0]
    cases = [{}, {"since": (lo + hi) / 2, "until": hi + 1, "filters": {"instance": [inst]}}]
    derived = [mr.compute_all(as_source(sample), settings=s, **c) for c in cases]
    sample.close()
    con = ro(built.path)
    for c, d in zip(cases, derived, strict=True):
        run, close = mr.prepare(as_source(con), settings=s, **c)
        try:
            assert run.calls_table == "state"
            got = {n: run.compute(n, exact=True) for n in d}  # exact: no sketch percentiles (compared below)
            # restrict_since / reset_window move the window of the state's view as they do a derived run's
            if "since" in c:
                assert run.restrict_since(c["since"] + 600) is True
                run.reset_window()
                _same(d["reuse"], run.compute("reuse"), "reuse after reset_window")
        finally:
            close()
        for n in d:
            _same(d[n], got[n], n)
    con.close()


def test_read_only_run_uses_current_state(built):
    con = duckdb.connect(str(built.path), read_only=True)
    run, close = mr.prepare(as_source(con), settings=Settings())
    try:
        assert run.calls_table == "state"
    finally:
        close()
        con.close()


def test_task_cost_from_rollup_equals_per_call(built):
    """task_cost from model_rollup_task equals task_cost from the per-call state, for every grouping, an hour-aligned
    window and a filter on a rollup key; an unaligned window reads the per-call state."""
    con = ro(built.path)
    s = Settings()
    lo, hi, inst = con.execute("SELECT min(start_s), max(start_s), min(instance) FROM llm_calls").fetchall()[0]
    h = (int(lo) // 3600 + 1) * 3600  # the first whole hour after the first call
    for kw in ({}, {"since": h, "until": h + 3600, "filters": {"instance": [inst]}}):
        run, close = mr.prepare(as_source(con), settings=s, **kw)
        try:
            for by in ("task", "task_type", "session", "model", "instance"):
                got = run.compute("task_cost", by)
                assert "task_cost" in run.from_rollup
                run.rollups = False
                want = run.compute("task_cost", by)
                run.rollups = True
                assert want.height > 0
                _same(want, got, f"task_cost by {by} {kw}")
        finally:
            close()
    run, close = mr.prepare(as_source(con), settings=s, since=h + 1, until=h + 3600)
    try:
        run.compute("task_cost")
        assert "task_cost" not in run.from_rollup  # not whole hours: the per-call state
    finally:
        close()
    con.close()


def test_duty_cycle_from_session_rollup_equals_per_call(built):
    con = ro(built.path)
    s = Settings()
    run, close = mr.prepare(as_source(con), settings=s)
    try:
        got = run.compute("duty_cycle")
        assert run.from_rollup == {"duty_cycle"}
        run.rollups = False
        want = run.compute("duty_cycle")
        assert want.height > 700  # one row per session with a life span (sample_data: 753 sessions)
        _same(want, got, "duty_cycle")
        run.rollups = True
        run.compute("duty_cycle", "task")  # another grouping: per call
        assert run.from_rollup == {"duty_cycle"} and run.timings
    finally:
        close()
    con.close()


def _quantile_cont(values: list[float], q: float) -> float:
    """DuckDB's quantile_cont of sorted ``values``: the values at ranks floor(h) and ceil(h), h = q·(n − 1),
    interpolated."""
    h = q * (len(values) - 1)
    lo, hi = values[math.floor(h)], values[math.ceil(h)]
    return lo + (h - math.floor(h)) * (hi - lo)


def test_sketch_quantiles_within_stated_error(built):
    """Quantiles from the hourly sketches, merged over hours and keys, are within the stated relative error of the
    exact ones (quantile_cont of the same population), for TTFT by hit class, e2e, ITL and the idle gaps."""
    con = ro(built.path)
    qs = (0.5, 0.9, 0.99)
    exact_sql = {
        "ttft": ("SELECT hit_class AS g, list_sort(list(ttft_s)) FROM model_calls WHERE prev_call_id IS NOT NULL "
                 "AND hit_class IS NOT NULL AND ttft_s IS NOT NULL GROUP BY ALL", "hit_class"),
        "e2e": ("SELECT NULL AS g, list_sort(list(end_s - start_s)) FROM model_calls", None),
        "itl": ("SELECT NULL AS g, list_sort(list(g)) FROM (SELECT unnest(itl_ms) AS g FROM model_calls "
                "WHERE itl_ms IS NOT NULL)", None),
        "gap": ("SELECT task_type AS g, list_sort(list(gap_before_s)) FROM model_calls WHERE session_id IS NOT NULL "
                "AND gap_before_s IS NOT NULL GROUP BY ALL", "task_type"),
    }
    for series, (sql, by) in exact_sql.items():
        exact = {g: v for g, v in con.execute(sql).fetchall()}
        got = {r["group"]: r for r in rollups.quantiles(con, series, qs, by=by)}
        assert set(got) == set(exact) and got
        for g, values in exact.items():
            r = got[g]
            assert r["n"] == len(values) and r["rel_err"] == rollups.ALPHA
            for q in qs:
                x = _quantile_cont(values, q)
                assert abs(r[f"p{q * 100:g}"] - x) <= rollups.ALPHA * x * (1 + 1e-9) + 1e-9, (series, g, q)
    with pytest.raises(ValueError, match="whole hours"):
        rollups.quantiles(con, "e2e", since=1.5)
    con.close()


def test_refresh_over_budget_rolls_back_and_the_next_catches_up(tmp_path):
    """A refresh given no time (``budget_s=0``: what `agentobs collect` does at stop, past its budget) changes nothing
    — no state at first, then the stored state with its old marks — and the next refresh catches up."""
    con = connect(tmp_path / "budget.duckdb")
    s = Settings()
    ins = ("INSERT INTO spans_part (trace_id, span_id, start_ns, end_ns, role, session_id, instance, model, input_tokens, "
           "cached_tokens, output_tokens) VALUES (?, ?, ?, ?, 'gateway', 's1', 'i1', 'm', ?, ?, 10)")
    sec = 1_000_000_000
    con.execute(ins, ["t1", "g1", 0, 2 * sec, 1000, 0])
    r = state.refresh(con, s, budget_s=0)
    assert (r.mode, r.derived) == ("deferred", 0) and "rolled back" in r.reason
    assert not state.current(con, s) and state.status(con, s).startswith("no maintained session model")
    assert state.refresh(con, s).mode == "rebuild"
    con.execute(ins, ["t2", "g2", 10 * sec, 12 * sec, 1600, 992])
    assert state.refresh(con, s, budget_s=0).mode == "deferred"
    assert con.execute("SELECT count(*) FROM model_calls").fetchall()[0][0] == 1  # as before: g1 only
    assert state.status(con, s).startswith("stale: 1 calls; new spans")
    r = state.refresh(con, s)
    assert (r.mode, r.calls) == ("incremental", 2) and state.current(con, s)
    con.close()


def test_budget_interrupts_a_running_statement():
    """Past the deadline the statement running on a watched connection is interrupted (the refresh's transaction then
    rolls back); one that has not started is not run."""
    con = duckdb.connect()
    budget = state._Budget(0.2)
    budget.watch(con)
    with pytest.raises(duckdb.InterruptException):
        # ~10^13 rows: hours of work, so only the interrupt ends it
        con.execute("SELECT sum(i) FROM range(10000000000000) t(i)").fetchall()
    with pytest.raises(state._OverBudget):
        budget.check()
    budget.stop()
    con.close()


def test_itl_gaps_from_state_equal_derived(sample_db, built, state_copy):
    """m_itl_gap read from model_itl_gap (a run over the state without filters) equals the one itl_gaps.sql derives:
    the whole store and a window, with the SLO threshold and the p99 one; a run with a filter derives it."""
    sample = ro(sample_db)  # no maintained state: derived
    lo, hi = sample.execute("SELECT min(start_s), max(start_s) FROM llm_calls").fetchall()[0]
    cases = [({}, {}), ({"itl_tail_threshold": "p99", "long_prefill_tokens": 2000}, {"since": (lo + hi) / 2})]
    cols = "call_id, instance, model, g_ms, thr_ms, tail, long_overlap, off_call_id, off_computed"
    derived = []
    for values, kw in cases:
        run, close = mr.prepare(as_source(sample), settings=Settings(values=values), **kw)
        try:
            assert run.calls_table != "state"
            derived.append(run.cur.sql(f"SELECT {cols} FROM {run.itl_gaps()}").pl())
        finally:
            close()
    sample.close()
    for (values, kw), want in zip(cases, derived, strict=True):
        s = Settings(values=values)
        if values:  # other settings: a state rebuilt with them, on a copy
            con = connect(state_copy)
            state.rebuild(con, s)
        else:  # the default settings: the module's state
            con = ro(built.path)
        run, close = mr.prepare(as_source(con), settings=s, **kw)
        try:
            assert run.calls_table == "state"
            got = run.cur.sql(f"SELECT {cols} FROM {run.itl_gaps()}").pl()
        finally:
            close()
            con.close()
        assert want.height > 0 and want["tail"].sum() > 0 and want["off_call_id"].drop_nulls().len() > 0
        order = want.columns
        assert want.sort(order, nulls_last=True).equals(got.sort(order, nulls_last=True)), (values, kw)


# the groupings each rollup form serves (agentobs/metrics/rollup.py)
_HOUR_FORMS = {"reuse": ("session", "task", "instance", "model", "task_type", "session_length"),
               "reprefill": ("cause", "instance", "model", "task_type"),
               "idle_kv_rent": ("instance", "model", "task_type"),
               "turn_resume_ttft": ("instance", "model", "task_type"),
               "capacity": ("instance",),
               "concurrency": ("instance", "model", "task_type")}


def _same_or_within(want: pl.DataFrame, got: pl.DataFrame, name: str) -> None:
    """``got`` (a rollup form) equals ``want`` (per call) column by column, except the percentiles it read from the
    sketches: each within the bound its ``<col minus _s>_rel_err`` column states (rel_err·x of the exact x)."""
    bounded = {c: f"{c.removesuffix('_s')}_rel_err" for c in want.columns
               if f"{c.removesuffix('_s')}_rel_err" in got.columns}
    assert [c for c in got.columns if c not in want.columns] == list(bounded.values()), name
    _same(want.drop(list(bounded)), got.select(want.columns).drop(list(bounded)), name)
    keys = [c for c, t in want.schema.items() if t in (pl.String, pl.Boolean)]
    w, g = want.sort(keys, nulls_last=True), got.sort(keys, nulls_last=True)
    for c, e in bounded.items():
        assert got.schema[c] == want.schema[c], (name, c)
        for x, p, err in zip(w[c].to_list(), g[c].to_list(), g[e].to_list(), strict=True):
            assert (x is None) == (p is None), (name, c)
            if x is not None:
                assert err == (rollups.GAMMA - 1 if c == "miss_penalty" else rollups.ALPHA)
                assert abs(p - x) <= err * x * (1 + 1e-9) + 1e-9, (name, c, x, p)


def test_rollup_metrics_equal_per_call(built):
    """reuse (model_rollup_task), reprefill, idle_kv_rent (model_rollup_hour), turn_resume_ttft (the sketches) and
    capacity (model_rollup_minute) equal the same metrics from the per-call state, rows in the same order — counts and sums exactly (doubles to
    1e-9 relative), each sketch percentile within its stated bound of the exact one — for every grouping the rollup serves, over the whole store, an hour-aligned
    window with an instance filter, and a task-type filter; exact=True gives the per-call percentiles; a grouping,
    window or filter off the rollup's grain reads the per-call state."""
    con = ro(built.path)
    s = Settings()
    lo, inst, tt = con.execute("SELECT min(start_s), min(instance), max(task_type) FROM llm_calls").fetchall()[0]
    h = (int(lo) // 3600 + 1) * 3600  # the first whole hour after the first call (sample_data: 2.3 hours of calls)
    cases = ({}, {"since": h, "until": h + 3600, "filters": {"instance": [inst]}}, {"filters": {"task_type": [tt]}})
    check_rollup_forms(con, s, cases)
    # capacity with 5-minute buckets: each sums five minutes of model_rollup_minute; open windows' bounds per call
    s5 = Settings(values={"metrics_bucket_s": 300.0})
    # concurrency too (the calls of a bucket: those starting in it and those running across its first instant)
    for name in ("capacity", "concurrency"):
        for kw in ({"since": h}, {"until": h, "filters": {"task_type": [tt]}}, {"since": h, "until": h + 3600}):
            run, close = mr.prepare(as_source(con), settings=s5, **kw)
            try:
                got = run.compute(name)
                assert run.from_rollup == {name}
                run.rollups = False
                want = run.compute(name)
                assert want.height > 0
                _same(want, got, f"{name} 300 s {kw}")
            finally:
                close()
    # 7-minute buckets: an hour-aligned window starts inside a bucket (its first instant is the window's start)
    s7 = Settings(values={"metrics_bucket_s": 420.0})
    for kw in ({"since": h}, {"since": h, "until": h + 3600, "filters": {"instance": [inst]}}):
        run, close = mr.prepare(as_source(con), settings=s7, **kw)
        try:
            got = run.compute("concurrency", "model")
            assert run.from_rollup == {"concurrency"}
            run.rollups = False
            want = run.compute("concurrency", "model")
            assert want.height > 0 and want["calls"].sum() > 0
            _same(want, got, f"concurrency 420 s {kw}")
        finally:
            close()
    # off the grain: a window not of whole hours, a filter on a column the rollup lacks, a grouping it lacks, a
    # bucket that is not whole minutes
    for kw, name, by, st in (({"since": h + 1}, "reprefill", "cause", s),
                             ({"filters": {"agent_name": ["x"]}}, "idle_kv_rent", "instance", s),
                             ({}, "reprefill", "session", s),
                             ({}, "capacity", "instance", Settings(values={"metrics_bucket_s": 90.0}))):
        run, close = mr.prepare(as_source(con), settings=st, **kw)
        try:
            run.compute(name, by)
            assert run.from_rollup == set(), (kw, name, by)
        finally:
            close()
    con.close()


def check_rollup_forms(con, s: Settings, cases, require_rows: bool = True) -> None:
    """Every rollup form of _HOUR_FORMS, every grouping it serves, for each run of ``cases`` (prepare's keywords):
    from the rollup, equal to (sketch percentiles: within the bound of) the per-call state's; exact=True equal."""
    for kw in cases:
        run, close = mr.prepare(as_source(con), settings=s, **kw)
        try:
            for name, bys in _HOUR_FORMS.items():
                for by in bys:
                    got = run.compute(name, by)
                    assert name in run.from_rollup
                    run.from_rollup.clear()
                    exact = run.compute(name, by, exact=True)
                    # no sketch there
                    assert (name in run.from_rollup) == (name in ("reuse", "reprefill", "capacity", "concurrency"))
                    run.rollups = False
                    want = run.compute(name, by)
                    run.rollups = True
                    assert want.height > 0 or not require_rows or kw.get("filters", {}).get("task_type"), \
                        (name, by, kw)
                    _same(want, exact, f"{name} by {by} {kw} exact")
                    _same_or_within(want, got, f"{name} by {by} {kw}")
                    assert got[got.columns[0]].to_list() == want[want.columns[0]].to_list(), (name, by)  # row order
        finally:
            close()
