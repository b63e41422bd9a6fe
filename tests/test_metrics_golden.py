"""Golden tests of the agent metrics (METRICS.md) that need code: the worked example through the real OTLP import,
several windows or settings on one store, repeated runs (ties), real captures, the API's properties. Small
hand-built inputs, expected outputs computed by hand in the comments. The cases that are only inputs and expected
rows are data files (tests/golden/*.yaml, run on DuckDB and chDB by test_metrics_golden_cases.py)."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pytest
from builders import T0, call, make_db

from agentobs.config import Settings, load_settings
from agentobs.metrics import compute, compute_all, prepare
from agentobs.model import connect
from agentobs.source import as_source
from agentobs.store.writer import Writer

FIX = Path(__file__).parent / "fixtures"


def rows(df, key):
    return {r[key]: r for r in df.to_dicts()}


def reuse_rows(path, settings=None):
    run, close = prepare(as_source(path), settings=settings or Settings())
    try:
        return rows(run.table("m_calls"), "call_id")
    finally:
        close()


# -- the worked example (METRICS.md), through the real OTLP import ------------------------------------
def test_worked_example_via_otlp_import(tmp_path):
    from agentobs.collect.files import import_otlp

    path = str(tmp_path / "ex.duckdb")
    con = connect(path)
    with Writer(con) as w:
        res = import_otlp([FIX / "otlp" / "agent_task_3turns.json"], w, load_settings(env={}))
    assert res.accepted == 6 and not res.errors
    con.close()
    r = compute("reuse", db=as_source(path), settings=Settings()).to_dicts()
    assert len(r) == 1  # the invoke_agent root span is not a call: one session of 3 calls
    s = r[0]
    assert (s["calls"], s["prompt_tokens"], s["cached_tokens"]) == (3, 15661, 9552)
    assert round(s["hit_rate"], 3) == 0.610          # 9552 / 15661
    assert round(s["reuse_hit_rate"], 3) == 0.782    # (3408 + 3072) / (3408 + 4880)
    assert s["reusable_tokens_eff"] == 3408 + 4880 and s["reprefill_tokens"] == 1808
    c = reuse_rows(path)
    c3 = c["5a9c3e7f1b6d82a5"]
    assert (c3["reusable_tokens"], c3["reusable_tokens_eff"], c3["reprefill_tokens"]) == (4892, 4880, 1808)
    # no KV events and no other evidence of an eviction (issue 20): the shortfall is "unexplained", still counted in X
    # (the band: X_low = 0 with no evidence, X_high = the whole shortfall)
    assert c3["miss_cause"] == "unexplained" and c3["hit_class"] == "partial"
    assert (c3["reprefill_low_tokens"], c3["reprefill_high_tokens"], c3["cause_evidence"]) == (0, 1808, "none")
    assert round(c3["gap_before_s"], 3) == 41.748
    # call 3 computes P − C = 7357 − 3072 = 4285 = 1808 recomputed + 2465 new + 12 trailing partial block
    assert c3["prompt_tokens"] - c3["cached_tokens"] == 4285 == 1808 + (7357 - 4892) + (4892 - 4880)
    # the session's first call hit blocks the session never stored (C = 3072: a prefix another session or run left
    # behind): prior_hit, not an uncached cold start (issue 20; before: cold)
    c1 = c["1c5e9a3b7d2f4e61"]
    assert (c1["miss_cause"], c1["cached_tokens"], c1["reprefill_tokens"]) == ("prior_hit", 3072, None)
    by_cause = rows(compute("reprefill", db=as_source(path), settings=Settings()), "cause")
    assert by_cause["unexplained"]["calls"] == 1 and by_cause["unexplained"]["reprefill_tokens"] == 1808
    assert (by_cause["unexplained"]["reprefill_low_tokens"], by_cause["unexplained"]["reprefill_high_tokens"]) \
        == (0, 1808)
    # the model view gives the same per-call numbers
    ro = duckdb.connect(path, read_only=True)
    assert ro.execute("SELECT reprefill_tokens, miss_cause FROM call_reuse WHERE call_id = '5a9c3e7f1b6d82a5'").fetchone() \
        == (1808, "unexplained")
    ro.close()


# -- §1: block floor, causes, context shrink, unknown C ----------------------------------------------
# block floor, miss causes, failed calls, context resets, retries, parallel branches, block-hash prefixes; §2's
# counter reset, §6's ITL percentiles and tail attribution, §7's capacity: tests/golden/*.yaml, run on DuckDB and
# chDB by test_metrics_golden_cases.py


# -- §4: rent, exact (KV events) vs estimate; abandoned sessions -------------------------------------
def test_rent_exact_with_kv_events_vs_estimate(tmp_path):
    path = make_db(tmp_path, [
        # s1 on A with KV events: evicted at t=15 during the 10..30 s idle window
        call("k1", "s1", 0, 10, 1000, 0, O=200), call("k2", "s1", 30, 31, 1500, 0, O=100),
        # s2 on A without KV events: evicted too, rent unknown
        call("e1", "s2", 0, 10, 1000, 0, O=200), call("e2", "s2", 30, 31, 1500, 0, O=100),
        # s3 retained: rent paid K × g = (1000 + 200) × 20
        call("r1", "s3", 0, 10, 1000, 0, O=200), call("r2", "s3", 30, 31, 1500, 992, O=100),
    ], kv=[
        ("A:8000", 1, "BlockStored", ["h1", "h2"], "s1"),
        ("A:8000", 15, "BlockRemoved", ["h2"], None),
        ("A:8000", 40, "BlockRemoved", ["zz"], None),      # the last event: end of observation on A
    ], config=[("A:8000", "vllm", "num_gpu_blocks", "1000"), ("A:8000", "vllm", "block_size", "16")])
    c = reuse_rows(path)
    assert c["k2"]["rent_mode"] == "kv_events" and c["k2"]["evict_phase"] == "idle"
    assert c["k2"]["rent_wasted_token_s"] == pytest.approx(1200 * 5)     # K × (t_evict 15 − t2 10)
    assert c["e2"]["rent_mode"] == "estimate" and c["e2"]["rent_wasted_token_s"] is None
    assert c["r2"]["window_outcome"] == "retained" and c["r2"]["rent_paid_token_s"] == pytest.approx(1200 * 20)
    # the data ends at t=31, so with the default abandoned_after_s = 600 the last calls are open, not abandoned
    assert [c[k]["abandoned"] for k in ("k2", "e2", "r2")] == [False] * 3
    assert c["k2"]["abandon_kv_tokens"] is None and c["k2"]["abandon_rent_token_s"] is None
    r = compute("idle_kv_rent", db=as_source(path), settings=Settings()).to_dicts()[0]
    assert (r["abandoned"], r["open_sessions"], r["abandoned_kv_tokens"]) == (0, 3, None)
    # abandoned_after_s = 0: every last call is abandoned.
    # k2 is s1's last call; no removal after t=31 -> censored at the last KV event (t=40): (1500 + 100) × (40 − 31)
    c = reuse_rows(path, Settings(values={"abandoned_after_s": 0.0}))
    assert c["k2"]["abandon_censored"] and c["k2"]["abandon_rent_token_s"] == pytest.approx(1600 * 9)
    assert c["e2"]["abandon_rent_token_s"] is None and c["e2"]["abandon_kv_tokens"] == 1600
    # $1/s; KV capacity 1000 × 16 = 16000 tokens
    cfg = Settings(values={"cost": {"usd_per_hour": 3600.0}, "abandoned_after_s": 0.0})
    r = compute("idle_kv_rent", db=as_source(path), settings=cfg).to_dicts()[0]
    # e2's window: no KV events of s2 and no other evidence -> unknown, not evicted (issue 20; before: evicted with
    # rent unknown)
    assert (r["windows"], r["retained"], r["evicted"], r["unknown"], r["evicted_rent_unknown"], r["abandoned"]) \
        == (3, 1, 1, 1, 0, 3)
    assert r["open_sessions"] == 0
    assert r["rent_paid_usd"] == pytest.approx(24000 / 16000)   # token-s × $/s ÷ capacity
    assert r["rent_wasted_usd"] == pytest.approx(6000 / 16000)
    assert r["abandoned_kv_tokens"] == 3 * 1600 and r["rent_mode"] == "mixed"
    assert r["abandoned_kv_bytes"] == pytest.approx(3 * 1600 * 262144)  # Qwen3-32B: 2×64×8×128×2 B/token
    # g* = 16000 tokens ÷ 10000 tok/s (built-in default prefill) = 1.6 s; all three 20 s gaps exceed it
    assert r["g_star_s"] == pytest.approx(1.6) and r["windows_over_g_star"] == 3
    assert "$/s ÷ KV capacity" in r["rent_basis"]


def test_eviction_is_of_the_chain_the_next_call_reuses_not_of_dead_end_output_blocks(tmp_path):
    # The sample fleet's call 3674c4053d1edf64 in small (B = 16): each call stores its prompt blocks as a chain
    # and then its output blocks as a dead end (the next prompt re-renders the output, so its blocks differ).
    #   a1 0–10 s, P = 64 (4 blocks p0..p3), O = 32 -> output blocks o1, o2 (depth 4, 5, parent p3)
    #   a2 20–30 s, P = 128: prompt blocks p4..p7 continue the chain after p3; output blocks q1, q2 (depth 8, 9)
    #   a3 starts at 100 s, P = 160, C = 0: the idle window is 30..100 s after a2.
    # LRU evicts the dead ends first: o1/o2 at 35 s (depth 4–5 < 8, but p4/p5 took that depth at 20 s: not on
    # the live chain), q1 at 40 s (depth 8: beyond a2's reusable prefix, R_eff(a3) = P(a2) = 128 = 8 blocks),
    # then the chain itself: p6 at 70 s. t_evict = 70 (before: 35, the first removal of any block).
    path = make_db(tmp_path, [
        call("a1", "s1", 0, 10, 64, 0, O=32), call("a2", "s1", 20, 30, 128, 64, O=32),
        call("a3", "s1", 100, 101, 160, 0, O=10),
    ], kv=[
        ("A:8000", 1, "BlockStored", ["p0", "p1", "p2", "p3"], "s1", None),
        ("A:8000", 9, "BlockStored", ["o1", "o2"], "s1", "p3"),
        ("A:8000", 21, "BlockStored", ["p4", "p5", "p6", "p7"], "s1", "p3"),
        ("A:8000", 29, "BlockStored", ["q1", "q2"], "s1", "p7"),
        ("A:8000", 35, "BlockRemoved", ["o1", "o2"], None),
        ("A:8000", 40, "BlockRemoved", ["q1"], None),
        ("A:8000", 70, "BlockRemoved", ["p6", "p7"], None),
    ], config=[("A:8000", "vllm", "block_size", "16")])
    c = reuse_rows(path)
    a3 = c["a3"]
    assert a3["window_outcome"] == "evicted" and a3["rent_mode"] == "kv_events"
    assert a3["evict_ts_s"] == pytest.approx(T0 + 70) and a3["evict_phase"] == "idle"
    # K = P(a2) + O(a2) = 160 tokens held from t2(a2) = 30 until the eviction at 70
    assert a3["rent_wasted_token_s"] == pytest.approx(160 * (70 - 30))
    # a2's window (10..20 s after a1): nothing removed then; its eviction is the first removal of a1's live
    # chain p0..p3 after t2(a1) = 10 -> none (o1/o2 are dead ends, p6 is beyond a1's 4-block prefix); a2 hit C =
    # 64 = R_eff -> retained anyway
    assert c["a2"]["window_outcome"] == "retained" and c["a2"]["evict_ts_s"] is None


# -- §5 ---------------------------------------------------------------------------------------------
def test_turn_resume_ttft_buckets_and_miss_penalty(tmp_path):
    path = make_db(tmp_path, [
        call("a1", "s1", 0, 1, 1000, 0), call("a2", "s1", 11, 12, 1200, 992, ttft=0.2),   # gap 10 s, hit
        call("b1", "s2", 0, 1, 1000, 0), call("b2", "s2", 11, 12, 1200, 0, ttft=1.0),     # gap 10 s, miss
        call("c1", "s3", 0, 1, 1000, 0), call("c2", "s3", 1.5, 3, 1200, 992, ttft=0.1),   # gap 0.5 s, hit
    ])
    df = compute("turn_resume_ttft", db=as_source(path), settings=Settings())
    r = {(x["gap_bucket"], x["hit_class"]): x for x in df.to_dicts()}
    assert set(r) == {("all", "all"), ("[0,1)", "hit"), ("[5,30)", "hit"), ("[5,30)", "miss")}
    assert r[("[5,30)", "miss")]["miss_penalty"] == pytest.approx(5.0)   # 1.0 / 0.2
    assert r[("[0,1)", "hit")]["miss_penalty"] is None
    # the overall row (first): percentiles over the three calls 2…n themselves, not over the bucket rows
    assert df.row(0, named=True)["gap_bucket"] == "all"
    allr = r[("all", "all")]
    assert allr["calls"] == 3 and allr["miss_penalty"] is None
    assert allr["ttft_p50_s"] == pytest.approx(0.2)                     # median of 0.1, 0.2, 1.0
    assert allr["ttft_p99_s"] == pytest.approx(0.2 + 0.98 * (1.0 - 0.2))  # linear interpolation


# -- §6 ---------------------------------------------------------------------------------------------
def test_itl_tail_attribution_tie_goes_to_the_greater_call_id(tmp_path):
    # two prefills on A compute the same 5000 tokens and both overlap the one tail gap (300 ms, [10.05, 10.35]):
    # the attribution is the same every run — the greater call id, "p2" (session s2), not whichever the
    # aggregation meets first (p2 is stored first here: a plain arg_max on the tokens picked p1)
    v = call("v", "sv", 9.5, 11, 100, 0, O=3, ttft=0.5, itl=[50, 300], task="tv")
    p1 = call("p1", "s1", 10.1, 12, 5000, 0, ttft=0.2, task="t1")
    p2 = call("p2", "s2", 10.1, 12, 5000, 0, ttft=0.2, task="t2")
    path = make_db(tmp_path, [v, p2, p1])
    for _ in range(3):
        r = rows(compute("itl_tail", db=as_source(path), settings=Settings()), "instance")["A:8000"]
        assert r["tail_gaps"] == 1 and r["top_offender_session"] == "s2" and r["top_offender_task"] == "t2"


def test_itl_tail_top_offender_tie_goes_to_the_least_id(tmp_path):
    # two tail gaps on A (300 ms [10.05, 10.35] and 300 ms [10.40, 10.70]), each attributed to its own prefill:
    # p1 (session s2, task tB, prefill [10.1, 10.3]) overlaps the first, p2 (session s1, task tA, prefill
    # [10.45, 10.55]) the second: one tail gap each. The
    # top offender is a tie of one gap each: the least id, s1 and tA, every run (mode() took whichever it met
    # first; p1 is stored first here)
    v = call("v", "sv", 9.5, 12, 100, 0, O=4, ttft=0.5, itl=[50, 300, 50, 300], task="tv")
    p1 = call("p1", "s2", 10.1, 13, 5000, 0, ttft=0.2, task="tB")
    p2 = call("p2", "s1", 10.45, 13, 5000, 0, ttft=0.1, task="tA")
    path = make_db(tmp_path, [v, p1, p2])
    for _ in range(3):
        r = rows(compute("itl_tail", db=as_source(path), settings=Settings()), "instance")["A:8000"]
        assert r["tail_gaps"] == 2 and r["unattributed_tail_gaps"] == 0
        assert r["top_offender_session"] == "s1" and r["top_offender_task"] == "tA"


def test_itl_coarse_histogram_fallback(tmp_path):
    L = "vllm:inter_token_latency_seconds"
    samples = []
    # three scrapes, two intervals: interval 1 has 100 obs (10 above 0.1 s) and 1000 computed tokens;
    # interval 2 has 100 obs (40 above) and 9000 computed tokens
    for t, n, below, comp in ((0, 0, 0, 0), (10, 100, 90, 1000), (20, 200, 150, 10000)):
        samples += [("A:8000", t, f"{L}_count", {}, n), ("A:8000", t, f"{L}_bucket", {"le": "0.1"}, below),
                    ("A:8000", t, f"{L}_bucket", {"le": "0.05"}, below / 2),
                    ("A:8000", t, "vllm:prompt_tokens_by_source_total", {"source": "local_compute"}, comp)]
    path = make_db(tmp_path, [call("x", "s", 0, 1, 10, 0)], samples=samples)
    r = rows(compute("itl_tail", db=as_source(path), settings=Settings()), "instance")["A:8000"]
    assert r["method"] == "coarse_histogram" and r["intervals"] == 2 and "coarse" in r["note"]
    assert r["tail_share"] == pytest.approx(50 / 200) and r["threshold_ms"] == pytest.approx(100)
    assert r["tail_share_high_prefill"] == pytest.approx(0.4) and r["tail_share_low_prefill"] == pytest.approx(0.1)
    assert r["corr_tail_vs_computed_prefill"] == pytest.approx(1.0)  # two points: perfectly correlated


# -- §2 fleet cross-check with a restart ---------------------------------------------------------------
def test_fleet_hit_rate_counts_from_the_counters_creation(tmp_path):
    """Calls served before an instance's first scrape: vLLM's *_created sample (the counter's creation time) says the
    first scraped value is all increase since then."""
    q, h = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
    qc, hc = "vllm:prefix_cache_queries_created", "vllm:prefix_cache_hits_created"
    lab = {"engine": "0", "model_name": "m"}
    samples = []
    # A: created at 5 s; first scrape at 100 s (calls came before it): queries 1000, hits 600; at 115 s 1200, 700
    # B: the same values with no *_created (SGLang, or vLLM with several API servers): the first value stays unknown
    # C: created at 5 s; at 100 s 1000 / 600; restarted at 105 s (created 105) and by 115 s already at 1500 / 900,
    #    above the old values: only the creation time shows the restart
    for t, qv, hv, c_c in ((100, 1000, 600, 5), (115, 1200, 700, 5)):
        samples += [("A:8000", t, q, lab, qv), ("A:8000", t, h, lab, hv),
                    ("A:8000", t, qc, lab, T0 + c_c), ("A:8000", t, hc, lab, T0 + c_c),
                    ("B:8000", t, q, lab, qv), ("B:8000", t, h, lab, hv)]
    for t, qv, hv, c_c in ((100, 1000, 600, 5), (115, 1500, 900, 105)):
        samples += [("C:8000", t, q, lab, qv), ("C:8000", t, h, lab, hv),
                    ("C:8000", t, qc, lab, T0 + c_c), ("C:8000", t, hc, lab, T0 + c_c)]
    path = make_db(tmp_path, [call("x", "s", 0, 1, 1000, 250)], samples=samples)
    r = rows(compute("fleet_hit_rate", db=as_source(path), settings=Settings()), "instance")
    # A: 1000 + 200 queries, 600 + 100 hits (was 200 / 100: the calls before the first scrape were lost)
    assert (r["A:8000"]["query_tokens"], r["A:8000"]["hit_tokens"], r["A:8000"]["restarts"]) == (1200, 700, 0)
    assert r["A:8000"]["hit_rate"] == pytest.approx(700 / 1200)
    assert (r["B:8000"]["query_tokens"], r["B:8000"]["hit_tokens"]) == (200, 100)
    # C: 1000 + 1500 (the restart: the increase is the new value), 600 + 900; one restart
    assert (r["C:8000"]["query_tokens"], r["C:8000"]["hit_tokens"], r["C:8000"]["restarts"]) == (2500, 1500, 1)
    # a window that starts after the creation (50 s): what came before the first scrape may be before the window,
    # so A's first value is not counted (200 / 100 as before); C's restart at 105 s is inside it
    r = rows(compute("fleet_hit_rate", db=as_source(path), since=T0 + 50, settings=Settings()), "instance")
    assert (r["A:8000"]["query_tokens"], r["A:8000"]["hit_tokens"]) == (200, 100)
    assert (r["C:8000"]["query_tokens"], r["C:8000"]["hit_tokens"]) == (1500, 900)


def test_fleet_hit_rate_real_vllm_scraped_only_after_its_calls(tmp_path):
    """Real vLLM 0.32 (tests/fixtures/vllm_real/ample): its /metrics read once, after all 20 calls. The counters were
    created when the engine started, before the first call, so the one scrape counts them all: 13824 hits of 21639
    queried tokens (metrics_after.txt), where it used to count nothing."""
    from agentobs.collect import prom
    from agentobs.collect.files import import_otlp

    fix = FIX / "vllm_real" / "ample"
    path = str(tmp_path / "real.duckdb")
    con = connect(path)
    with Writer(con) as w:
        import_otlp([fix / "otlp_spans.jsonl"], w, load_settings(env={}))
        scrape = prom.parse_text((fix / "metrics_after.txt").read_text(), "127.0.0.1:18000", T0 + 10**8)
        w.write("metric_samples", scrape.samples)
    con.close()
    r = compute("fleet_hit_rate", db=as_source(path), settings=Settings()).to_dicts()[0]
    assert (r["query_tokens"], r["hit_tokens"], r["scrapes"]) == (21639, 13824, 1)
    assert r["hit_rate"] == pytest.approx(13824 / 21639)


# -- §7 -----------------------------------------------------------------------------------------------
def test_concurrency_window_boundary_cuts_a_call_in_two(tmp_path):
    path = make_db(tmp_path, [call("a", "s", 50, 70, 10, 0), call("b", "s2", 0, 120, 10, 0)])
    s = Settings(values={"metrics_bucket_s": 60.0})
    df = compute("concurrency", db=as_source(path), since=T0, until=T0 + 120, settings=s).to_dicts()
    # bucket [0,60): a overlaps 10 s, b 60 s -> 70/60; bucket [60,120): a 10 s, b 60 s -> 70/60
    assert [round(r["concurrency"], 6) for r in df] == [round(70 / 60, 6)] * 2
    assert [r["request_s"] for r in df] == [pytest.approx(70.0)] * 2
    # a window that starts mid-call clips it: [60, 90) sees a for 10 s and b for 30 s over 30 s
    df = compute("concurrency", db=as_source(path), since=T0 + 60, until=T0 + 90, settings=s).to_dicts()
    assert len(df) == 1 and df[0]["concurrency"] == pytest.approx(40 / 30)


def test_duty_cycle_throughput_and_cost(tmp_path):
    path = make_db(tmp_path, [
        call("d1", "s", 0, 10, 1000, 0, O=100), call("d2", "s", 5, 12, 2000, 992, O=100),
        call("d3", "s", 30, 40, 3000, 1984, O=200, sys_tokens=300, tool_tokens=300),
    ])
    d = compute("duty_cycle", db=as_source(path), settings=Settings()).to_dicts()[0]
    # union [0, 12] + [30, 40] = 22 s over a 40 s life
    assert d["duty_cycle_p50"] == pytest.approx(22 / 40) and d["busy_s"] == pytest.approx(22)
    th = compute("throughput", db=as_source(path), settings=Settings()).to_dicts()[0]
    # processed = 6000 + 400; computed = (1000 + 1008 + 1016) + 400 = 3424; window 0..40 s
    assert th["processed_tokens"] == pytest.approx(6400) and th["computed_tokens"] == pytest.approx(3424)
    assert th["computed_tokens_per_s"] == pytest.approx(3424 / 40)
    cfg = Settings(values={"cost": {"usd_per_hour": 3600.0, "prefill_tokens_per_s": 1000.0, "decode_tokens_per_s": 100.0,
                                    "list_price": {"input": 1.0, "cached_input": 0.1, "output": 2.0}}})
    t = compute("task_cost", db=as_source(path), settings=cfg).to_dicts()[0]
    # GPU-time at $1/s: (3024 / 1000 + 400 / 100) s = 7.024 $
    assert t["cost_usd"] == pytest.approx(7.024) and t["gpu_s"] == pytest.approx(7.024)
    # d2 started before d1 ended, so it has no prev (cold); d3's prev is d2: R_eff = floor(2000 / 16) * 16 = 2000,
    # C = 1984: a 16-token shortfall, one block, within the hit tolerance and no evidence of an eviction -> X = 0
    # (issue 20; before: 16 tokens, $0.016); the band's upper end keeps it: 16 / 1000 tok/s × $1/s
    assert t["reprefill_tokens"] == 0 and t["reprefill_cost_usd"] == pytest.approx(0.0)
    c = reuse_rows(path)
    assert (c["d3"]["reprefill_low_tokens"], c["d3"]["reprefill_high_tokens"]) == (0, 16)
    # list price: computed 3024 × $1/M + cached 2976 × $0.1/M + output 400 × $2/M
    assert t["list_price_usd"] == pytest.approx((3024 * 1 + 2976 * 0.1 + 400 * 2) / 1e6)
    assert t["control_plane_share"] == pytest.approx(600 / 3000)
    assert "usd_per_hour=3,600 ([cost])" in t["cost_basis"]


# -- API properties -----------------------------------------------------------------------------------
def test_read_only_and_sandboxed_connections_and_compute_all(tmp_path):
    from agentobs.store.db import sandboxed

    path = make_db(tmp_path, [call("a", "s", 0, 1, 1000, 0), call("b", "s", 2, 3, 1200, 992)])
    ro = duckdb.connect(path, read_only=True)
    try:
        assert compute("reuse", db=as_source(ro), settings=Settings()).to_dicts()[0]["reuse_hit_rate"] == 1.0
        # the caller's connection is left open and its catalog untouched by our temp tables
        assert ro.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchone()[0] == 0
        # the preparation turns preserve_insertion_order off while it runs, and puts the caller's setting back
        setting = "SELECT current_setting('preserve_insertion_order')"
        assert ro.execute(setting).fetchone()[0] is True
        ro.execute("SET preserve_insertion_order = false")
        assert compute("reuse", db=as_source(ro), settings=Settings()).to_dicts()[0]["reuse_hit_rate"] == 1.0
        assert ro.execute(setting).fetchone()[0] is False
    finally:
        ro.close()
    sb = sandboxed(path)
    try:
        suite = compute_all(db=as_source(sb), settings=Settings())
    finally:
        sb.close()
    assert set(suite) >= {"reuse", "reprefill", "idle_kv_rent", "itl_tail", "capacity", "fleet_hit_rate"}


def test_filters_are_parameters_and_windows_use_start_time(tmp_path):
    path = make_db(tmp_path, [call("a", "s", 0, 1, 1000, 0, inst="A:8000"), call("b", "s", 2, 3, 1200, 0, inst="B:8000")])
    s = Settings()
    # routed_away is judged on all calls, the filter only picks which calls are reported
    r = compute("reprefill", db=as_source(path), filters={"instance": "B:8000"}, settings=s).to_dicts()
    assert [(x["cause"], x["calls"]) for x in r] == [("routed_away", 1)]
    assert compute("reprefill", db=as_source(path), filters={"instance": "x' OR '1'='1"}, settings=s).is_empty()
    assert compute("reprefill", db=as_source(path), since=T0 + 1, settings=s).to_dicts()[0]["cause"] == "routed_away"
    from agentobs.errors import QueryError

    with pytest.raises(QueryError, match=r"cannot filter on 'instanse' \(did you mean 'instance'\?\)"):
        compute("reuse", db=as_source(path), filters={"instanse": "A"}, settings=s)
    with pytest.raises(QueryError, match="cannot be grouped by 'cause'"):
        compute("reuse", db=as_source(path), by="cause", settings=s)
    with pytest.raises(QueryError, match="until .* must be after since"):
        compute("reuse", db=as_source(path), since=T0 + 10, until=T0, settings=s)
    # T0 is 2027-01-15T08:00:00Z: from T0 + 1.5 s only call b (start T0 + 2) is in the window
    assert compute("reuse", db=as_source(path), since="2027-01-15T08:00:01.5Z", settings=s).to_dicts()[0]["calls"] == 1
    # relative windows use the injected clock: 10 s before T0 + 2.5 s covers both calls
    assert compute("reuse", db=as_source(path), since="10s", clock=lambda: T0 + 2.5, settings=s).to_dicts()[0]["calls"] == 2
    assert math.isclose(compute("reuse", db=as_source(path), since="1s", clock=lambda: T0 + 60, settings=s).height, 0)
