"""Instance-level eviction evidence (issue 20; docs/metrics.md, "Instance evidence"): without session-tagged KV events,
a shortfall beyond the tolerance is an eviction when the instance preempted during the gap or its churn in the gap
reached its pool size, not one when the instance never allocated its pool since it started, else unexplained.

Tiny stores, hand-computed. Every case: block B = 16, pool = 100 blocks = 1,600 tokens (vLLM num_gpu_blocks). Session
s1 on A:8000: c1 [0, 2] P 400 C 0 O 100, then c2 [100, 102] P 1,000 C 0: R = P(c1) = 400, R_eff = 400 (a multiple of
16, below P(c2) − 1), S = 400 > the tolerance (16), and no KV events or block hashes: estimate mode.
"""

from __future__ import annotations

import duckdb
import pytest
from builders import T0, call, make_db, ts

A = "A:8000"
VLLM_POOL = [(A, "vllm", "block_size", "16"), (A, "vllm", "num_gpu_blocks", "100")]
SGLANG_POOL = [(A, "sglang", "page_size", "16"), (A, "sglang", "max_total_num_tokens", "1600")]
S1 = [call("c1", "s1", 0, 2, 400, 0, 100), call("c2", "s1", 100, 102, 1000, 0, 100)]


def _c2(tmp_path, calls=(), config=VLLM_POOL, samples=()):
    tmp_path.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(make_db(tmp_path, S1 + list(calls), config=config, samples=samples), read_only=True)
    row = con.sql("SELECT cause_evidence, miss_cause, shortfall_tokens, reprefill_tokens, reprefill_low_tokens, "
                  "reprefill_high_tokens, window_outcome, churn_ratio FROM call_reuse WHERE call_id = 'c2'").fetchall()
    con.close()
    return row[0]


def _vllm(t, preempt=0, prompt=0, hits=0, gen=0):
    """One vLLM scrape of A at T0 + t: the counters as cumulative values since the engine started."""
    lab = {"engine": "0", "model_name": "m"}
    return [(A, t, "vllm:num_preemptions_total", lab, preempt), (A, t, "vllm:prompt_tokens_total", lab, prompt),
            (A, t, "vllm:prefix_cache_hits_total", lab, hits), (A, t, "vllm:generation_tokens_total", lab, gen)]


def test_preemption_in_the_gap_is_an_eviction(tmp_path):
    # the preemption counter rises between scrapes at 10 and 20, both inside the gap [2, 100]: every free cached block
    # had been evicted by then, c1's among them. X = X_high = S = 400 (P(c1) fills its blocks: no decode block); X_low
    # = 0: the eviction is certain, not that c2 still shared all of R with c1 (an edit would show only in KV events)
    samples = _vllm(0) + _vllm(10, prompt=400, gen=100) + _vllm(20, preempt=1, prompt=900, gen=150)
    assert _c2(tmp_path, samples=samples)[:7] == ("preemption", "evicted_full", 400, 400, 0, 400, "evicted")


def test_preemption_before_the_gap_is_not_evidence(tmp_path):
    # the preemption is in the interval (0, 10] that holds c1's end (2): it may have come before the gap. Counters
    # at the first scrape at or after c2's start (100.5): 1,000 computed + 100 generated + 16 per call seen (c1, c2)
    # = 1,132 < 1,600 − 16: nothing was ever evicted — a prompt edit
    samples = _vllm(0) + _vllm(10, preempt=1, prompt=400, gen=100) + _vllm(100.5, preempt=1, prompt=1000, gen=100)
    assert _c2(tmp_path, samples=samples)[:7] == ("no_churn", "prompt_edit", 400, 0, 0, 400, "retained")


def test_churn_from_spans_reaching_the_pool_is_an_eviction(tmp_path):
    # s2's calls wholly inside the gap allocate (1,000 − 0 + 100) + (600 − 100 + 0) = 1,600 tokens = the pool: under
    # LRU every block free at the gap's start was reused. d0 started before the gap (at 1): not counted (lower bound)
    others = [call("d0", "s2", 1, 10, 5000, 0, 0), call("d1", "s2", 10, 20, 1000, 0, 100),
              call("d2", "s2", 30, 40, 600, 100, 0)]
    ev, cause, s, x, lo, hi, window, ratio = _c2(tmp_path, others)
    assert (ev, cause, s, x, lo, hi, window) == ("churn", "evicted_full", 400, 400, 0, 400, "evicted")
    assert ratio == 1.0   # 1,600 / 1,600


def test_churn_from_counters_when_they_exceed_the_spans(tmp_path):
    # no other call is seen, but the engine's counters rise by (2,000 − 200) computed + 100 generated = 1,900 tokens
    # between scrapes at 10 and 50 (inside the gap): traffic the spans do not show; 1,900 ≥ 1,600
    samples = _vllm(10, prompt=400, gen=100) + _vllm(50, prompt=2400, hits=200, gen=200)
    ev, cause, *_, ratio = _c2(tmp_path, samples=samples)
    assert (ev, cause) == ("churn", "evicted_full") and ratio == pytest.approx(1900 / 1600)


def test_young_instance_from_spans_is_a_prompt_edit(tmp_path):
    # no counters: the instance's first call seen (c1) hit nothing, and everything allocated before c2 — c1's 400 + 100
    # tokens, plus a block per call (c1, c2) for rounding = 532 — is below the pool less one block (1,584)
    ev, cause, s, x, lo, hi, window, ratio = _c2(tmp_path)
    assert (ev, cause, s, x, lo, hi, window) == ("no_churn", "prompt_edit", 400, 0, 0, 400, "retained")
    assert ratio == 0.0   # nothing ran in the gap


def test_between_the_bounds_stays_unexplained_with_its_churn_ratio(tmp_path):
    # s2's call in the gap allocates 1,100 tokens (< 1,600: not certain); since the start 500 + 1,100 + 16 × 3 = 1,648
    # ≥ 1,584 (not impossible): unexplained, X = S = 400, X_low = 0, the churn ratio 1,100 / 1,600 recorded
    ev, cause, s, x, lo, hi, window, ratio = _c2(tmp_path, [call("d1", "s2", 10, 20, 1000, 0, 100)])
    assert (ev, cause, s, x, lo, hi, window) == ("none", "unexplained", 400, 400, 0, 400, "unknown")
    assert ratio == pytest.approx(0.6875)


def test_warm_engine_is_not_young(tmp_path):
    # the instance's first call seen hit 256 cached tokens: the engine served traffic before the store saw it, so the
    # spans cannot bound what it allocated since it started
    first = [call("w0", "s0", -50, -49, 300, 256, 10)]
    assert _c2(tmp_path, first)[:2] == ("none", "unexplained")


def test_restarted_counter_is_no_bound(tmp_path):
    # the first scrape after c2's start shows the counters lower than before: the engine restarted in between, so its
    # values do not count what came before c2 — no bound; nothing ran in the gap either: unexplained
    samples = _vllm(10, prompt=400, gen=100) + _vllm(100.5, prompt=50, gen=5)
    assert _c2(tmp_path, samples=samples)[:2] == ("none", "unexplained")


def test_without_the_pool_size_there_is_no_instance_evidence(tmp_path):
    samples = _vllm(10) + _vllm(20, preempt=3)
    assert _c2(tmp_path, config=[(A, "vllm", "block_size", "16")], samples=samples)[:2] == ("none", "unexplained")
    assert _c2(tmp_path / "x", config=[], samples=samples)[7] is None   # no churn ratio without a pool


def _sglang(t, retracted=0, prompt=0, cached=0, gen=0, evicted=0):
    return [(A, t, "sglang:num_retracted_requests_total", {}, retracted),
            (A, t, "sglang:prompt_tokens_total", {"is_streaming": "true"}, prompt),
            (A, t, "sglang:cached_tokens_total", {}, cached),
            (A, t, "sglang:generation_tokens_total", {"is_streaming": "true"}, gen),
            (A, t, "sglang:evicted_tokens_total", {}, evicted)]


def test_sglang_retraction_and_evicted_tokens(tmp_path):
    # SGLang: a retraction in the gap is the preemption; the pool is max_total_num_tokens (1,600)
    samples = _sglang(10, prompt=400, gen=100) + _sglang(20, retracted=1, prompt=900, gen=150)
    assert _c2(tmp_path / "r", config=SGLANG_POOL, samples=samples)[:2] == ("preemption", "evicted_full")
    # the radix cache evicted 1,700 tokens in the gap (LRU leaves: c1's, freed at 2, before any newer): an eviction
    samples = _sglang(10, prompt=400, gen=100) + _sglang(20, prompt=900, gen=150, evicted=1700)
    assert _c2(tmp_path / "e", config=SGLANG_POOL, samples=samples)[:2] == ("churn", "evicted_full")
    # nothing ever evicted (evicted_tokens_total 0 at the first scrape after c2's start), whatever was allocated
    samples = _sglang(10, prompt=400, gen=100) + _sglang(100.5, prompt=9000, gen=900)
    assert _c2(tmp_path / "n", config=SGLANG_POOL, samples=samples)[:2] == ("no_churn", "prompt_edit")


def _equals_rebuild(con, s) -> bool:
    """The maintained state (after its refreshes) equals a rebuild from scratch, every column but the hashes."""
    from agentobs.model import state

    cols = [c[0] for c in con.execute("DESCRIBE model_calls").fetchall() if c[0] != "block_hashes"]
    con.execute("CREATE OR REPLACE TEMP TABLE inc AS SELECT * FROM model_calls")
    state.rebuild(con, s)
    sel = ", ".join(cols)
    return con.execute(f"SELECT count(*) FROM (SELECT {sel} FROM inc EXCEPT SELECT {sel} FROM model_calls)"
                       ).fetchall()[0][0] == 0


def test_maintained_state_follows_other_sessions_and_counters(tmp_path):
    """The maintained session model (agentobs.model.state): another session's call in the gap, and engine counters
    arriving later, change c2's evidence although nothing of s1 changed; each incremental refresh equals a rebuild."""
    import pyarrow as pa
    from builders import SPAN_TYPES

    from agentobs.config import Settings
    from agentobs.model import connect, state
    from agentobs.store.writer import Writer

    con = connect(make_db(tmp_path, S1, config=VLLM_POOL))
    s = Settings()
    assert state.refresh(con, s).mode == "rebuild"

    def c2():
        return con.sql("SELECT cause_evidence, reprefill_tokens, churn_ratio FROM model_calls WHERE call_id = 'c2'"
                       ).fetchall()[0]

    assert c2() == ("no_churn", 0, 0.0)   # the young instance (test_young_instance_from_spans_is_a_prompt_edit)
    d = [call("d1", "s2", 10, 20, 1000, 0, 100, task="t2"), call("d2", "s2", 30, 40, 600, 100, 0, task="t2")]
    with Writer(con, flush_s=0.01) as w:
        w.write("spans", pa.table({k: pa.array([c[k] for c in d], t) for k, t in SPAN_TYPES.items()}))
    r = state.refresh(con, s)
    assert r.mode == "incremental" and r.sessions == 2   # s2's new calls, and s1 for its gap on A
    assert c2() == ("churn", 400, 1.0)                   # 1,600 tokens allocated in the gap
    assert _equals_rebuild(con, s)
    # counters arrive: a preemption inside the gap; only the counters changed (status says so)
    con.execute("DELETE FROM spans_part WHERE span_id IN ('d1', 'd2')")
    assert state.refresh(con, s).mode == "rebuild"        # spans already read changed: rebuilt
    assert c2()[0] == "no_churn"
    with Writer(con, flush_s=0.01) as w:
        rows = _vllm(10, prompt=400, gen=100) + _vllm(20, preempt=1, prompt=900, gen=150)
        w.write("metric_samples", pa.table({
            "ts": [ts(x[1]) for x in rows], "instance": [x[0] for x in rows],
            "metric": [x[2] for x in rows],
            "labels": pa.array([list(x[3].items()) for x in rows], pa.map_(pa.string(), pa.string())),
            "labels_key": [",".join(f"{k}={v}" for k, v in sorted(x[3].items())) for x in rows],
            "value": [float(x[4]) for x in rows], "engine": ["vllm"] * len(rows)}))
    assert "engine counters" in state.status(con, s)
    r = state.refresh(con, s)
    assert r.mode == "incremental" and r.sessions == 1 and c2()[:2] == ("preemption", 400)
    assert _equals_rebuild(con, s)
    con.close()


def test_a_kv_removal_on_the_instance_rules_out_never_evicted(tmp_path):
    # the instance's KV events (blocks of another session, s9) show a removal at 50, before c2: evictions happen on A,
    # so the young-pool bound does not hold — unexplained (s1 has no KV events of its own)
    path = make_db(tmp_path, S1, config=VLLM_POOL, kv=[(A, 5, "BlockStored", ["h9"], "s9"),
                                                       (A, 50, "BlockRemoved", ["h9"], None)])
    con = duckdb.connect(path, read_only=True)
    assert con.sql("SELECT cause_evidence FROM call_reuse WHERE call_id = 'c2'").fetchall() == [("none",)]
    con.close()


# s3 on A, arriving after the store's first refresh: e1 [200, 202] P 400 C 0 O 100 (allocates 500), e2 [300, 302]
# P 1,000 C 0: R = 400, S = 400 beyond the tolerance, nothing in the gap (churn 0). The refresh derives s3 alone (its
# calls start after every stored call): its activity is bounded to [200, 300], the earlier calls one row per instance
S3 = [call("e1", "s3", 200, 202, 400, 0, 100, task="t3"), call("e2", "s3", 300, 302, 1000, 0, 100, task="t3")]


@pytest.mark.parametrize("before, expected", [
    # s1 allocated 500 + 1,100 before s3: up to e2, 2,100 + 16 × (3 calls + 1) = 2,164 ≥ 1,600 − 16: the pool may have
    # wrapped — unexplained (from e1 alone, 500 + 16 × 2 = 532: it would read "never evicted")
    (S1, "none"),
    # z1, the instance's first call, hit 32 cached tokens: a warm engine, no bound from spans — unexplained (78 + 500
    # + 16 × 3 = 626 is below the pool, and e1's C = 0 would make it young)
    ([call("z1", "s0", 0, 1, 100, 32, 10, task="t0")], "none"),
    # z1 hit nothing: young, 78 + 500 + 48 = 626 < 1,584 — never evicted
    ([call("z1", "s0", 0, 1, 100, 0, 10, task="t0")], "no_churn"),
])
def test_refresh_reads_the_calls_before_its_window_as_one_row(tmp_path, before, expected):
    """The maintained model's refresh reads the activity of a derived call's instance only in the time its derived calls
    span, the calls before it summed (agentobs.model.state._activity_sql): the allocation since the engine started
    and the instance's first call still count, and the refresh equals a rebuild."""
    import pyarrow as pa
    from builders import SPAN_TYPES

    from agentobs.config import Settings
    from agentobs.model import connect, state
    from agentobs.store.writer import Writer

    con = connect(make_db(tmp_path, before, config=VLLM_POOL))
    s = Settings()
    assert state.refresh(con, s).mode == "rebuild"
    with Writer(con, flush_s=0.01) as w:
        w.write("spans", pa.table({k: pa.array([c[k] for c in S3], t) for k, t in SPAN_TYPES.items()}))
    r = state.refresh(con, s)
    assert r.mode == "incremental" and r.sessions == 1 and r.derived == 2
    cols = [c[0] for c in con.execute("DESCRIBE model_calls").fetchall() if c[0] != "block_hashes"]
    sel = ", ".join(cols)
    con.execute(f"CREATE TEMP TABLE inc AS SELECT {sel} FROM model_calls")
    assert con.sql("SELECT cause_evidence, churn_ratio FROM inc WHERE call_id = 'e2'").fetchall() == [(expected, 0.0)]
    state.rebuild(con, s)
    assert con.execute(f"SELECT count(*) FROM (SELECT * FROM inc EXCEPT SELECT {sel} FROM model_calls)").fetchall() \
        == [(0,)]
    assert con.execute(f"SELECT count(*) FROM (SELECT {sel} FROM model_calls EXCEPT SELECT * FROM inc)").fetchall() \
        == [(0,)]
    con.close()


def test_maintained_state_follows_a_restart_seen_later(tmp_path):
    """Scrapes that show A's engine restarted in c2's gap arrive after c2 was derived: the refresh re-derives s1
    (though A's pool size is unknown here, so c2 had no instance evidence) and equals a rebuild — first a counter
    reset (no restart time), then the process start time (the restart's time: the wasted rent from it)."""
    import pyarrow as pa

    from agentobs.config import Settings
    from agentobs.model import connect, state
    from agentobs.store.writer import Writer

    con = connect(make_db(tmp_path, S1, config=[(A, "vllm", "block_size", "16")]))
    s = Settings()
    assert state.refresh(con, s).mode == "rebuild"

    def c2():
        return con.sql("SELECT cause_evidence, miss_cause, reprefill_tokens, window_outcome, evict_ts_s, "
                       "rent_wasted_token_s FROM model_calls WHERE call_id = 'c2'").fetchall()[0]

    def write(rows):
        with Writer(con, flush_s=0.01) as w:
            w.write("metric_samples", pa.table({
                "ts": [ts(x[1]) for x in rows], "instance": [x[0] for x in rows], "metric": [x[2] for x in rows],
                "labels": pa.array([list(x[3].items()) for x in rows], pa.map_(pa.string(), pa.string())),
                "labels_key": [",".join(f"{k}={v}" for k, v in sorted(x[3].items())) for x in rows],
                "value": [float(x[4]) for x in rows], "engine": [None] * len(rows)}))

    assert c2() == ("none", "unexplained", 400, "unknown", None, None)
    # a reset between the scrapes at 10 and 20, both inside the gap (2, 100]: a restart there, its time unknown
    write(_vllm(10, prompt=400, gen=100) + _vllm(20))
    r = state.refresh(con, s)
    assert r.mode == "incremental" and r.sessions == 1
    assert c2() == ("restart", "evicted_full", 400, "evicted", None, None)
    assert _equals_rebuild(con, s)
    # later scrapes with A's process start time: T0 + 15; the window's wasted rent runs from c1's end (2) to it:
    # K = 400 + 100 tokens × 13 s = 6,500 token-s
    write([(A, t, "process_start_time_seconds", {}, T0 + 15) for t in (30, 40)])
    r = state.refresh(con, s)
    assert r.mode == "incremental" and r.sessions == 1
    assert c2() == ("restart", "evicted_full", 400, "evicted", T0 + 15, 6500.0)
    assert _equals_rebuild(con, s)
    con.close()
