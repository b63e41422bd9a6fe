"""agentobs loadgen against a real local HTTP server that behaves like an OpenAI-compatible engine
(agentobs.loadgen.stub: keep-alive HTTP/1.1, SSE over chunked encoding, /tokenize, a block prefix cache reported
as usage.prompt_tokens_details.cached_tokens), and loadgen --compare on small hand-built stores."""

from __future__ import annotations

import json

import pytest
from cli_run import run_cli

from agentobs.config import Settings
from agentobs.errors import ConfigError
from agentobs.loadgen.client import Client, Target
from agentobs.loadgen.compare import compare, display_table
from agentobs.loadgen.prompts import CANDIDATES, PromptBuilder, RemoteTokenizer, Tokenizer, vocabulary
from agentobs.loadgen.runner import Options, preflight, run, size_check
from agentobs.loadgen.stub import CHAT_OVERHEAD, StubEngine
from agentobs.loadgen.tracing import Tracing
from agentobs.loadgen.workloads import BLOCK, load_plan
from agentobs.metrics import compute
from agentobs.model import connect
from agentobs.sim.chain import Chain
from agentobs.sim.workload import CallSpec, Segment, Session
from agentobs.source import as_source


@pytest.fixture
def engine():
    eng = StubEngine().start()
    yield eng
    eng.stop()


def _session(sid: str, calls: list[CallSpec], branches: list[tuple[str, list[CallSpec]]] | None = None) -> Session:
    segs = [Segment("seq", [("main", calls)])]
    if branches:
        segs.append(Segment("par", branches))
    return Session(sid, "task-" + sid, "coding", "team-a", "coder", 0.0, segs,
                   len(calls) + sum(len(b) for _, b in branches or []))


def _call(ids, P, O=48, gap=0.0, fail=False):  # noqa: E741, N803 - O = 48 is 3 output tokens at token_scale 1/16
    return CallSpec(Chain.from_ids(ids), len(ids), P, O, gap, None, "grep" if gap else None, fail, 0.0)


def _words(content: str) -> list[str]:
    return content.split()


def _run(engine, plan, db, **kw):
    # gaps × 0.001: a 2 s trace gap is a 2 ms tool span
    opts = Options(target=engine.url, time_scale=0.001, progress_s=0.05, **kw)
    pf = preflight(opts, plan)
    tr = Tracing(store=str(db), settings=Settings())
    r = run(opts, plan, pf, tr, install_signals=False)
    tr.close()
    return r, pf


# -- prompts -----------------------------------------------------------------------------------------------------
def test_vocabulary_keeps_one_token_words_and_measures_chat_overhead(engine):
    tok = RemoteTokenizer.probe(engine.url, "stub-model", {})
    assert tok is not None
    v = vocabulary(tok)
    # the stub makes words longer than 9 characters two tokens: exactly those candidates are dropped
    assert [w.strip() for w in v.words] == [w for w in CANDIDATES if len(w) <= 9]
    assert v.chat_overhead == CHAT_OVERHEAD == 3
    assert v.checked


def test_no_tokenize_endpoint_falls_back_unchecked():
    eng = StubEngine(tokenize=False).start()
    try:
        assert RemoteTokenizer.probe(eng.url, "stub-model", {}) is None
    finally:
        eng.stop()
    v = vocabulary(Tokenizer())
    assert not v.checked and v.chat_overhead == 0


def test_prefix_shared_exactly_when_block_ids_are():
    from agentobs.loadgen.prompts import Vocabulary

    b = PromptBuilder(Vocabulary(tuple(" " + w for w in CANDIDATES), 0, "t", True), 4)
    a = _words(b.content([1, 2, 3, 4], 16, tail_seed=1))
    same_head = _words(b.content([1, 2, 9, 10], 16, tail_seed=2))
    longer = _words(b.content([1, 2, 3, 4, 5], 22, tail_seed=3))
    assert len(a) == len(same_head) == 16 and len(longer) == 22
    assert a[:8] == same_head[:8] and a[8:12] != same_head[8:12]  # blocks 1, 2 shared; block 3 differs
    assert longer[:16] == a  # the next turn extends the whole prompt
    # a tail beyond the full blocks is the call's own: 22 = 5 blocks of 4 + 2 tail words
    assert _words(b.content([1, 2, 3, 4, 5], 22, tail_seed=4))[:20] == longer[:20]
    assert _words(b.content([1, 2, 3, 4, 5], 22, tail_seed=4))[20:] != longer[20:]
    # fewer tokens than the blocks hold: a prefix of the same words
    assert _words(b.content([1, 2, 3, 4], 10, tail_seed=5)) == a[:10]


# -- a run against the stub engine ------------------------------------------------------------------------------
def test_run_shares_prefixes_sends_session_headers_and_stores_spans(engine, tmp_path):
    # session s1: 3 turns growing over blocks [1,2] → [1,2,3] → [1,2,3,4]; s2 shares block 1 only.
    # token_scale 1/16: 4 tokens per 64-token block; P' = P/16.
    s1 = _session("s1", [_call([1, 2], 160), _call([1, 2, 3], 224, gap=2.0), _call([1, 2, 3, 4], 288, gap=1.0)])
    s2 = _session("s2", [_call([1, 7], 128)])
    from agentobs.loadgen.workloads import Plan

    db = tmp_path / "run.duckdb"
    r, pf = _run(engine, Plan([s1, s2], "test"), db, token_scale=1 / 16, concurrency=1)
    assert pf.tokens_per_block == 4 and pf.vocab.chat_overhead == 3
    assert pf.first_prompt_target == pf.first_prompt_tokens == 10  # 160 / 16
    assert r.stats.calls == 4 and r.stats.errors == 0 and r.stats.sessions_done == 2
    chats = [q for q in engine.requests if q["path"] == "/v1/chat/completions"]
    assert len(chats) == 4
    texts = [_words(q["body"]["messages"][0]["content"]) for q in chats]
    # sizes: P' − 3 (the template's <bos> <user> … <gen>) words of content
    assert [len(t) for t in texts] == [7, 11, 15, 5]
    assert texts[1][:7] == texts[0] and texts[2][:11] == texts[1]  # each turn extends the previous prompt
    assert texts[3][:4] == texts[0][:4] and texts[3][4:] != texts[0][4:5]  # s2: block 1 shared, then different
    # session id three ways, a traceparent of the call's own span
    for q in chats:
        sid = q["body"]["session_id"]
        assert q["headers"]["x-session-id"] == sid and sid.startswith("lg-") and sid.endswith(("-s1", "-s2"))
        assert q["headers"]["traceparent"].startswith("00-")
        assert q["body"]["stream"] is True and q["body"]["stream_options"] == {"include_usage": True}
    # the engine's usage: prompt sizes as asked, and cached tokens of the stub's 4-token blocks: turn 2 (14 tokens:
    # <bos> <user> + 11 words + <gen>) reuses the 2 full blocks of turn 1's 10 tokens (8); turn 3 the 3 full blocks
    # of turn 2 (12); s2 only the first block ("<bos> <user>" + 2 words of block 1, 4) of the s1 prompts
    sizes = [(x.target_prompt_tokens, x.prompt_tokens, x.cached_tokens) for x in r.records]
    assert sizes == [(10, 10, 0), (14, 14, 8), (18, 18, 12), (8, 8, 4)]
    sc = size_check(r.records)
    assert sc.calls == 4 and sc.exact == 4 and sc.max_abs_rel == 0
    # the spans are an ordinary dataset: calls with sessions, usage, TTFT; tool gaps; one agent root per session
    con = connect(db, read_only=True)
    try:
        roles = dict(con.sql("SELECT role, count(*) FROM spans GROUP BY 1").fetchall())
        assert roles == {"agent": 2, "gateway": 4, "tool": 2}
        rows = con.sql("SELECT session_id, prompt_tokens, cached_tokens, output_tokens, ttft_s IS NOT NULL, "
                       "instance, trace_id FROM llm_calls ORDER BY start_s").fetchall()
        assert [(x[1], x[2], x[3], x[4]) for x in rows] == [(10, 0, 3, True), (14, 8, 3, True), (18, 12, 3, True),
                                                            (8, 4, 3, True)]
        assert {x[5] for x in rows} == {f"127.0.0.1:{engine.port}"}
        # each request's traceparent carries the trace of its session's stored spans
        tp = {q["headers"]["traceparent"].split("-")[1] for q in chats}
        assert tp == {x[6] for x in rows}
        hit = compute("reuse", db=as_source(con), by="session")
        s1row = hit.filter(hit["session_id"].str.ends_with("-s1")).row(0, named=True)
        assert s1row["hit_rate"] == pytest.approx((0 + 8 + 12) / (10 + 14 + 18))
    finally:
        con.close()


def test_retries_and_subagents_replayed(engine, tmp_path):
    from agentobs.loadgen.workloads import Plan

    s = _session("s", [_call([1], 128), _call([1, 2], 192, fail=True)],
                 branches=[("b1", [_call([1, 2, 5], 256)]), ("b2", [_call([1, 2, 6], 256)])])
    db = tmp_path / "r.duckdb"
    r, _ = _run(engine, Plan([s], "t"), db, token_scale=1 / 16, stream=False)
    assert [(x.branch, x.turn, x.attempt, x.rejected) for x in r.records[:3]] == [
        ("main", 0, 1, False), ("main", 1, 1, True), ("main", 1, 2, False)]
    assert sorted(x.branch for x in r.records[3:]) == ["b1", "b2"]
    # request ids (vLLM's request and response ids) unique per call and attempt, across branches
    assert [x.request_id.rsplit("-", 2)[1:] for x in r.records[:3]] == [["c0", "a1"], ["c1", "a1"], ["c1", "a2"]]
    assert len({x.request_id for x in r.records}) == 5
    chats = [q for q in engine.requests if q["path"] == "/v1/chat/completions"]
    assert chats[1]["body"]["messages"] == chats[2]["body"]["messages"]  # the retry re-sends the same prompt
    con = connect(db, read_only=True)
    try:
        got = con.sql("SELECT branch, attempt, status FROM llm_calls ORDER BY start_s").fetchall()
        assert got[:3] == [("main", 1, "ok"), ("main", 1, "error"), ("main", 2, "ok")]
        assert sorted(got[3:]) == [("b1", 1, "ok"), ("b2", 1, "ok")]
        assert con.sql("SELECT count(*) FROM llm_calls WHERE ttft_s IS NOT NULL").fetchall() == [(0,)]  # not streamed
    finally:
        con.close()


def test_bad_target_and_model_fail_before_the_run(engine):
    plan = load_plan("synthetic", sessions=1, seed=0)
    with pytest.raises(ConfigError, match="cannot reach GET /v1/models"):
        preflight(Options(target="http://127.0.0.1:9"), plan)
    with pytest.raises(ConfigError, match="'stub-modle' is not served.*did you mean 'stub-model'"):
        preflight(Options(target=engine.url, model="stub-modle"), plan)
    with pytest.raises(ConfigError, match="only http://"):
        preflight(Options(target="https://example.invalid"), plan)
    assert not [q for q in engine.requests if q["path"] == "/v1/chat/completions"]


def test_prompt_larger_than_max_model_len_refused_with_the_scale_to_use():
    eng = StubEngine(max_model_len=1000).start()
    try:
        plan = load_plan("claude-code", sessions=1, seed=0)
        with pytest.raises(ConfigError, match="max_model_len.*--token-scale 0.0"):
            preflight(Options(target=eng.url), plan)
    finally:
        eng.stop()


def test_stop_keeps_what_ran(tmp_path):
    eng = StubEngine(delay_s=0.02).start()
    try:
        plan = load_plan("synthetic", sessions=50, seed=3)
        opts = Options(target=eng.url, time_scale=0.0, token_scale=1 / 16, concurrency=2)
        pf = preflight(opts, plan)
        tr = Tracing(store=str(tmp_path / "s.duckdb"), settings=Settings())
        box = {}

        def on_record(rec):  # what Ctrl-C does (the signal handler calls runner.stop), after the 5th call
            if box["r"].stats.calls >= 5:
                box["r"].stop("interrupted")

        r = run(opts, plan, pf, tr, install_signals=False, on_record=on_record, started=lambda x: box.update(r=x))
        tr.close()
        assert r.stats.stopped == "interrupted"
        assert 5 <= r.stats.calls < sum(s.n_calls for s in plan.sessions)
        con = connect(tmp_path / "s.duckdb", read_only=True)
        stored = con.sql("SELECT count(*) FROM llm_calls").fetchall()[0][0]
        errors = con.sql("SELECT count(*) FROM llm_calls WHERE status = 'error'").fetchall()[0][0]
        con.close()
        # every finished call is stored; a call cut off by the stop is stored too, as an error (cancelled)
        cancelled = sum(1 for x in r.records if x.error == "cancelled")
        assert stored == r.stats.calls + cancelled and errors == cancelled
    finally:
        eng.stop()


def test_rate_and_duration(tmp_path):
    eng = StubEngine(delay_s=0.01).start()
    try:
        plan = load_plan("synthetic", sessions=200, seed=3, mix="coding=1")
        # 4 session arrivals per second for 1.5 s: the launch stops at the deadline, what runs is cancelled
        opts = Options(target=eng.url, time_scale=0.0, token_scale=1 / 16, concurrency=50, rate=4.0, duration_s=1.5,
                       seed=5)
        pf = preflight(opts, plan)
        tr = Tracing(store=str(tmp_path / "d.duckdb"), settings=Settings())
        r = run(opts, plan, pf, tr, install_signals=False)
        tr.close()
        import random

        rng = random.Random(5)  # the same arrival draws: how many fall before 1.5 s
        t, due = 0.0, 0
        while True:
            t += rng.expovariate(4.0)
            if t >= 1.5:
                break
            due += 1
        assert r.stats.stopped == "duration reached"
        assert r.stats.sessions_started in (due, due - 1)  # the last one may straddle the deadline
    finally:
        eng.stop()


def test_workloads_load():
    cc = load_plan("claude-code", sessions=12, seed=0)
    assert len(cc.sessions) == 12 and len({s.sid for s in cc.sessions}) == 12  # 9 bundled, then repeated
    mc = load_plan("mooncake", sessions=5, seed=0)
    assert len(mc.sessions) == 5 and all(c.at_s is not None for c in mc.sessions[0].segments[0].threads[0][1])
    syn = load_plan("synthetic", sessions=4, seed=1, mix="coding=1")
    assert [s.task_type for s in syn.sessions] == ["coding"] * 4
    with pytest.raises(ConfigError, match="unknown task type 'codin'"):
        load_plan("synthetic", sessions=1, seed=0, mix="codin=1")


def test_from_store_replays_observed_sizes_gaps_and_retries(engine, tmp_path):
    from agentobs.loadgen.workloads import Plan

    # a first run makes the "observed" store; its sessions are replayed into a second store
    src = tmp_path / "observed.duckdb"
    s = _session("s", [_call([1, 2], 160), _call([1, 2, 3], 224, gap=2.0, fail=True), _call([1, 2, 3, 4], 288)])
    _run(engine, Plan([s], "t"), src, token_scale=1 / 16)
    plan = load_plan("store", sessions=None, seed=0, store_db=str(src))
    (obs,) = plan.sessions
    calls = obs.segments[0].threads[0][1]
    # observed prompt tokens (10, 14, 18) — the retried turn is one CallSpec with a failing first attempt
    assert [(c.P, c.fail) for c in calls] == [(10, False), (14, True), (18, False)]
    assert [c.nblk for c in calls] == [0, 0, 0]  # under 64 tokens: no full block of the replay's 64-token grid
    # prompts that grow extend one chain (same prefix ids)
    r, _ = _run(engine, plan, tmp_path / "replay.duckdb", max_output=2)
    assert [x.prompt_tokens for x in r.records] == [10, 14, 14, 18]


# -- CLI ----------------------------------------------------------------------------------------------------------
def test_cli_run_and_bad_model(engine, tmp_path):
    db = tmp_path / "cli.duckdb"
    out = tmp_path / "calls.jsonl"
    res = run_cli("loadgen", "--target", engine.url, "--workload", "synthetic", "--mix", "coding=1", "--sessions", "3",
                  "--max-turns", "2",
                  "--time-scale", "0", "--token-scale", "0.0625", "--db", db, "--responses", out)
    assert res.returncode == 0, res.stderr
    err = " ".join(res.stderr.split())  # rich wraps long lines
    assert "3/3 done" in err and "prompt sizes (engine usage vs asked): 6/6 exact" in err
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 6 and all(r["prompt_tokens"] == r["target_prompt_tokens"] for r in recs)
    con = connect(db, read_only=True)
    assert con.sql("SELECT count(*) FROM llm_calls").fetchall() == [(6,)]
    con.close()
    bad = run_cli("loadgen", "--target", engine.url, "--model", "nope", "--db", tmp_path / "x.duckdb")
    assert bad.returncode == 2 and "--model 'nope' is not served" in " ".join(bad.stderr.split())
    assert not (tmp_path / "x.duckdb").exists()
    miss = run_cli("loadgen", "--db", db)
    assert miss.returncode == 2 and "--target URL is required" in " ".join(miss.stderr.split())


# -- compare ------------------------------------------------------------------------------------------------------
T0 = 1_780_000_000  # an epoch base for the hand-built spans


def _store(path, calls):
    """A store of gateway spans: calls = (session, start_s, prompt, cached, ttft_s, output)."""
    from agentobs.collect import otlp
    from agentobs.store.writer import Writer

    spans = []
    for i, (sid, t, p, c, ttft, o) in enumerate(calls):
        attrs = [("gen_ai.operation.name", "chat"), ("gen_ai.conversation.id", sid), ("server.address", "10.0.0.1"),
                 ("server.port", 8000), ("gen_ai.request.model", "m"), ("gen_ai.usage.input_tokens", p),
                 ("gen_ai.usage.cache_read.input_tokens", c), ("gen_ai.usage.output_tokens", o),
                 ("gen_ai.response.time_to_first_chunk", ttft)]
        spans.append({"traceId": f"{hash(sid) & (2**64 - 1):032x}", "spanId": f"{i + 1:016x}", "name": "chat m",
                      "kind": 3, "startTimeUnixNano": str(int((T0 + t) * 1e9)),
                      "endTimeUnixNano": str(int((T0 + t + 1) * 1e9)),
                      "attributes": [{"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else
                                      {"doubleValue": v} if isinstance(v, float) else {"stringValue": v}}
                                     for k, v in attrs]})
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}
    dec = otlp.decode_json_obj(doc, Settings())
    con = connect(path)
    with Writer(con) as w:
        w.write("spans", dec.table())
    con.close()


def test_compare_hand_computed(tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    # A: 2 sessions × 2 calls; second calls 3 s after the first ended (gap bucket [1,5)) and hit the cache
    _store(a, [("lg-aa-s1", 0, 1000, 0, 0.5, 10), ("lg-aa-s1", 4, 1200, 992, 0.1, 10),
               ("lg-aa-s2", 0, 2000, 0, 0.9, 10), ("lg-aa-s2", 4, 2400, 1984, 0.3, 10)])
    # B: the same workload sessions with no cache: second calls recompute everything
    _store(b, [("lg-bb-s1", 0, 1000, 0, 0.5, 10), ("lg-bb-s1", 4, 1200, 0, 0.4, 10),
               ("lg-bb-s2", 0, 2000, 0, 0.9, 10), ("lg-bb-s2", 4, 2400, 0, 0.8, 10)])
    c = compare(a, b, reps=50, seed=1)
    assert c.paired and c.sessions_a == c.sessions_b == 2
    got = {r.quantity: r for r in c.rows}
    # turn-resume TTFT over the two second calls: A (0.1, 0.3) → p50 0.2; B (0.4, 0.8) → p50 0.6
    r = got["turn-resume TTFT p50, gap [1,5) s"]
    assert (r.a, r.b, r.n_a) == (pytest.approx(0.2), pytest.approx(0.6), 2)
    assert r.diff == pytest.approx(0.4)
    # p99 (linear interpolation): 0.1 + 0.99 × 0.2 = 0.298; 0.4 + 0.99 × 0.4 = 0.796
    assert got["turn-resume TTFT p99, gap [1,5) s"].a == pytest.approx(0.298)
    assert got["turn-resume TTFT p99, gap [1,5) s"].b == pytest.approx(0.796)
    # hit rate ΣC/ΣP: A (992 + 1984) / 6600; B 0
    h = got["session hit rate ΣC/ΣP"]
    assert h.a == pytest.approx(2976 / 6600) and h.b == 0 and h.diff == pytest.approx(-2976 / 6600)
    # computed prompt tokens per task Σ(P − C) / 2 tasks: A (1000 + 208 + 2000 + 416) / 2; B 6600 / 2
    t = got["computed prompt tokens per task"]
    assert t.a == pytest.approx(1812) and t.b == pytest.approx(3300)
    # the interval holds the difference of every resample: within [min, max] of the per-session differences
    # (paired: a resample of {s1, s2}; s1's hit-rate change −992/2200, s2's −1984/4400 — both −0.4509…)
    assert h.ci_lo == pytest.approx(-2976 / 6600, abs=1e-3) and h.ci_hi == pytest.approx(-2976 / 6600, abs=1e-3)
    # the point estimates are the metrics API's own figures on each store
    assert h.a == pytest.approx(compute("reuse", db=as_source(str(a)), by="model")["hit_rate"][0])
    tab = display_table(c)
    assert "quantity" in tab.column_names and "B − A" in tab.column_names
    res = run_cli("loadgen", "--compare", a, b, "--bootstrap", "20", "--format", "json")
    assert res.returncode == 0, res.stderr
    rows = {r["quantity"]: r for r in json.loads(res.stdout)}
    assert rows["session hit rate ΣC/ΣP"]["a"] == pytest.approx(2976 / 6600)


def test_compare_refuses_missing_store(tmp_path):
    with pytest.raises(ConfigError, match="no store at"):
        compare(tmp_path / "nope.duckdb", tmp_path / "nope2.duckdb")


def test_client_reuses_connections(engine):
    import asyncio

    async def go():
        c = Client(Target.parse(engine.url + "/v1"))
        for _ in range(5):
            r = await c.request("GET", "/v1/models")
            assert r.status == 200 and r.json()["data"][0]["id"] == "stub-model"
        n = len(c._idle)
        await c.close()
        return n

    assert asyncio.run(go()) == 1  # one keep-alive connection served all five


def test_block_is_64():
    assert BLOCK == 64


def test_console_compare_page_shows_the_cli_table(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from agentobs.console import APP

    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _store(a, [("lg-aa-s1", 0, 1000, 0, 0.5, 10), ("lg-aa-s1", 4, 1200, 992, 0.1, 10)])
    _store(b, [("lg-bb-s1", 0, 1000, 0, 0.5, 10), ("lg-bb-s1", 4, 1200, 0, 0.4, 10)])
    monkeypatch.setenv("AGENTOBS_DB", str(a))
    monkeypatch.delenv("AGENTOBS_CONFIG", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.switch_page("views/loadgen_compare.py")
    at.query_params["b"] = str(b)
    at.query_params["reps"] = "50"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Load-generator compare"
    shown = at.dataframe[0].value
    want = display_table(compare(a, b, reps=50, seed=0)).to_pandas()
    assert shown.to_dict("records") == want.to_dict("records")
    # A's turn-resume call hit (992 of 1200 cached: 82.7 %), B's did not
    row = shown[shown["quantity"] == "session hit rate ΣC/ΣP"].iloc[0]
    assert (row["A"], row["B"], row["B − A"]) == ("45.1 %", "0.0 %", "-45.1 pp")


def test_ctrl_c_stops_the_cli_cleanly_and_keeps_what_ran(engine, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    db = tmp_path / "int.duckdb"
    repo = Path(__file__).resolve().parent.parent
    p = subprocess.Popen([sys.executable, "-m", "agentobs.cli", "loadgen", "--target", engine.url, "--workload",
                          "synthetic", "--sessions", "500", "--concurrency", "4", "--time-scale", "0.001",
                          "--token-scale", "0.0625", "--db", str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "300"})
    try:
        t0 = time.monotonic()
        while sum(q["path"] == "/v1/chat/completions" for q in engine.requests) < 20:
            assert p.poll() is None and time.monotonic() - t0 < 60, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "stopped (interrupted)" in err
    sent = sum(q["path"] == "/v1/chat/completions" for q in engine.requests)
    con = connect(db, read_only=True)
    stored = con.sql("SELECT count(*) FROM llm_calls").fetchall()[0][0]
    con.close()
    # every request the engine got is a stored call (finished, or cancelled by the stop and stored as an error); a
    # call the stop cancelled while its request was still being sent is stored too (as an error) although the engine
    # never read it: at most one per worker (--concurrency 4) — seen once at load 9 (29 stored, 28 received)
    assert 20 <= sent <= stored <= sent + 4
