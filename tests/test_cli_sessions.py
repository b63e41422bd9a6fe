"""`agentobs calls` and `agentobs sessions` on a small hand-built store (issue 19): each call's hit class,
re-prefill tokens and miss cause; the session hit rate H = ΣC / ΣP over the calls whose C is known
(METRICS.md §2); one definition of retries; sub-agent branches beside the main branch.

Block size B = 16 (no engine config: the default_block_size setting). Session s1, times in seconds after T0:

    call branch  inst  t       P     C      R      R_eff  X      hit class  miss cause
    c1   main    A     0–2     1000  0      —      —      —      —          cold
    c2   main    A     10–12   2000  992    1000   992    0      hit        —        (992 ≥ 992 − 16)
    c3   main    B     20–22   3000  0      2000   2000   2000   miss       routed_away
    d1   b1      B     23–25   3500  2992   3000   2992   0      hit        —        (fork point: c3)
    c4   main    B     30–32   4000  1000   3000   2992   1992   partial    unexplained  (no KV events: no evidence)
    d2   b1      A     33–35   4500  0      3500   3488   3488   miss       routed_away  (attempt 2: a retry)
    c5   main    B     40–42   5000  NULL   4000   4000   NULL   NULL       unknown
    c6   main    B     50–51   6000  4992   5000   4992   0      hit        —        (status error)
    c7   main    B     52–54   6000  5984   6000   5984   0      hit        —        (same P after an error: retry)

R is the append-only estimate P(prev); R_eff = floor(min(R, P − 1) / 16) · 16 (3000 → 2992, 3500 → 3488,
6000 → min(6000, 5999) → 5984).

Session s2 (the retry definition at a fork), all on A: e1 (main, 100–102, P 1000, C 0) fails; e2 (branch b1,
105–107, P 1000, C 992) forks from it with the same P — not a retry, a retry is a re-send within its own branch;
e3 (main, 110–112, P 1000, C 992) re-sends it on main — a retry.

Hit rates, H = ΣC / ΣP over the calls whose C is known (c5 is left out of both sums):

    s1          ΣC = 0 + 992 + 0 + 1000 + 4992 + 5984 (main) + 2992 + 0 (b1) = 12968 + 2992 = 15960
                ΣP = 1000 + 2000 + 3000 + 4000 + 6000 + 6000 (main, not c5) + 3500 + 4500 (b1) = 22000 + 8000
                H = 15960 / 30000 = 0.532 (with c5's P in the denominator it would be 15960 / 35000 = 0.456)
                main: 7 calls, 12968 / 22000 = 0.58945…; branch b1: 2 calls, 2992 / 8000 = 0.374
    s2          H = (0 + 992 + 992) / 3000 = 0.66133…; main: 992 / 2000 = 0.496; b1: 992 / 1000 = 0.992
    all calls   17944 / 33000 = 0.543757… (the demo headline's formula; ΣC / ΣP of every call: 17944 / 38000)

Retries: s1 has 2 (d2: attempt 2; c7: c6 failed and c7 re-sends P 6000), s2 has 1 (e3).
"""

from __future__ import annotations

import json

import pytest
from builders import otlp_request, resource_spans, span
from cli_run import run_cli

from agentobs.collect.files import import_otlp
from agentobs.collect.otlp import decode_json
from agentobs.config import Settings, load_settings
from agentobs.model import connect
from agentobs.source import as_source
from agentobs.store.writer import Writer

T0 = 1_800_000_000.0
A, B = "10.0.0.1:8000", "10.0.0.2:8000"
# (call id, session, task, branch, attempt, instance, start, end, P, C, failed)
CALLS = [
    ("c1", "s1", "t1", None, None, A, 0, 2, 1000, 0, False),
    ("c2", "s1", "t1", None, None, A, 10, 12, 2000, 992, False),
    ("c3", "s1", "t1", None, None, B, 20, 22, 3000, 0, False),
    ("d1", "s1", "t1", "b1", None, B, 23, 25, 3500, 2992, False),
    ("c4", "s1", "t1", None, None, B, 30, 32, 4000, 1000, False),
    ("d2", "s1", "t1", "b1", 2, A, 33, 35, 4500, 0, False),
    ("c5", "s1", "t1", None, None, B, 40, 42, 5000, None, False),
    ("c6", "s1", "t1", None, None, B, 50, 51, 6000, 4992, True),
    ("c7", "s1", "t1", None, None, B, 52, 54, 6000, 5984, False),
    ("e1", "s2", "t2", None, None, A, 100, 102, 1000, 0, True),
    ("e2", "s2", "t2", "b1", None, A, 105, 107, 1000, 992, False),
    ("e3", "s2", "t2", None, None, A, 110, 112, 1000, 992, False),
]


def otlp_json() -> str:
    """The calls as gateway spans in OTLP/JSON (what `agentobs import otlp` and the ClickHouse exporter take)."""
    spans = []
    for i, (cid, sess, task, branch, attempt, inst, t0, t1, P, C, failed) in enumerate(CALLS):  # noqa: N806
        host, port = inst.split(":")
        a = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "Qwen/Qwen3-32B", "server.address": host,
             "server.port": int(port), "gen_ai.conversation.id": sess, "agentobs.task.id": task,
             "gen_ai.usage.input_tokens": P, "gen_ai.usage.output_tokens": 100}
        if C is not None:
            a["gen_ai.usage.cache_read.input_tokens"] = C
        if branch:
            a["agentobs.branch"] = branch
        if attempt:
            a["agentobs.attempt"] = attempt
        spans.append(span(f"{i + 1:032x}", f"{cid:0>16}", "chat Qwen/Qwen3-32B", int((T0 + t0) * 1e9),
                          int((T0 + t1) * 1e9), a, error="upstream timeout" if failed else None))
    return json.dumps(otlp_request(resource_spans("gateway", "test", spans)))


def cid(x: str) -> str:
    return f"{x:0>16}"  # the span id of call x


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("sessions")
    (d / "calls.json").write_text(otlp_json())
    path = str(d / "s.duckdb")
    con = connect(path)
    with Writer(con) as w:
        res = import_otlp([d / "calls.json"], w, load_settings(env={}))
    con.close()
    assert res.accepted == len(CALLS) and not res.errors
    return path


def agentobs(*args):
    # not a terminal, without $COLUMNS: tables 120 wide (a test run may have given COLUMNS=80)
    r = run_cli(*args, env={"COLUMNS": None, "LINES": None})
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_calls_show_hit_class_reprefill_and_miss_cause(db):
    rows = json.loads(agentobs("calls", "--session", "s1", "--db", db, "--format", "json"))
    rows = [{**r, "call_id": r["call_id"].lstrip("0")} for r in rows]
    got = {r["call_id"]: (r["hit_class"], r["reprefill_tokens"], r["miss_cause"]) for r in rows}
    assert [r["call_id"] for r in rows] == ["c1", "c2", "c3", "d1", "c4", "d2", "c5", "c6", "c7"]  # by start
    assert got == {
        "c1": (None, None, "cold"),                  # first call: nothing reusable yet
        "c2": ("hit", 0, None),                      # R_eff 992, C 992
        "c3": ("miss", 2000, "routed_away"),         # R_eff 2000 on A, served by B with nothing cached
        "d1": ("hit", 0, None),                      # the branch's first call reuses its fork point c3
        # 2992 − 1000, same instance as c3; the store has no KV events or block hashes, so nothing shows the blocks
        # were evicted: the shortfall (> 1 block of tolerance) is `unexplained` (X = 1992, X_low = 0; docs/metrics.md)
        "c4": ("partial", 1992, "unexplained"),
        "d2": ("miss", 3488, "routed_away"),         # prev = d1 (its branch) on B; d2 on A
        "c5": (None, None, "unknown"),               # C unknown: X unknown
        "c6": ("hit", 0, "error"),                   # failed (status ERROR) with no re-prefill: its own cause
        "c7": ("hit", 0, None),
    }
    gaps = {r["call_id"]: r["gap_before_s"] for r in rows}
    assert gaps["d1"] == 1.0 and gaps["c4"] == 8.0 and gaps["d2"] == 8.0  # 23 − 22 (fork), 30 − 22, 33 − 25
    assert [r["call_id"] for r in rows if r["is_retry"]] == ["d2", "c7"]
    # the table shows the same columns
    out = agentobs("calls", "--session", "s1", "--db", db)
    line = next(x for x in out.splitlines() if x.startswith(cid("c4")))
    assert "partial" in line and "1,992" in line and "unexplained" in line


def test_sessions_hit_rate_leaves_out_unknown_cached_tokens_and_shows_branches(db):
    rows = {r["session_id"]: r for r in json.loads(agentobs("sessions", "--db", db, "--format", "json"))}
    s1, s2 = rows["s1"], rows["s2"]
    assert (s1["calls"], s1["hit_rate"], s1["calls_cached_unknown"]) == (9, 0.532, 1)     # 15960 / 30000
    assert (s1["prompt_tokens"], s1["cached_tokens"]) == (35000, 15960)                  # ΣP of every call
    assert (s1["main_calls"], s1["main_hit_rate"]) == (7, 0.589)                         # 12968 / 22000
    assert (s1["branch_calls"], s1["branch_hit_rate"], s1["sub_branches"]) == (2, 0.374, 1)  # 2992 / 8000
    assert (s2["calls"], s2["hit_rate"], s2["main_hit_rate"], s2["branch_hit_rate"]) == (3, 0.661, 0.496, 0.992)
    assert (s1["retries"], s2["retries"]) == (2, 1)
    # the view itself, unrounded
    con = connect(db, read_only=True)
    try:
        v = con.sql("SELECT session_id, hit_rate, main_hit_rate, branch_hit_rate, retries FROM sessions "
                    "ORDER BY session_id").fetchall()
        t = con.sql("SELECT task_id, retries FROM tasks ORDER BY task_id").fetchall()
    finally:
        con.close()
    assert v[0][0] == "s1" and v[0][1:4] == pytest.approx((15960 / 30000, 12968 / 22000, 2992 / 8000))
    assert v[1][1:4] == pytest.approx((1984 / 3000, 992 / 2000, 992 / 1000))
    assert [x[4] for x in v] == [2, 1] and t == [("t1", 2), ("t2", 1)]


def test_one_definition_of_retries(db):
    """The sessions and tasks views count the calls call_reuse marks is_retry, and task_cost's retries."""
    from agentobs.metrics import compute, prepare

    run, close = prepare(as_source(db), settings=Settings())
    try:
        flagged = sorted(r[0].lstrip("0") for r in run.cur.sql("SELECT call_id FROM m_calls WHERE is_retry").fetchall())
        turns = dict(run.cur.sql("SELECT call_id, turn_no FROM m_calls WHERE session_id = 's2'").fetchall())
    finally:
        close()
    # d2 (attempt 2), c7 (re-sent after c6 failed), e3 (re-sent on main after e1 failed); not e2, the first call of
    # branch b1, although its fork point e1 failed with the same P
    assert flagged == ["c7", "d2", "e3"]
    # the turns of s2 per branch: main e1 (turn 1) and its retry e3 (still turn 1); b1 e2 (turn 1 of its branch)
    assert (turns[cid("e1")], turns[cid("e3")], turns[cid("e2")]) == (1, 1, 1)
    by_task = {r["task_id"]: r["retries"]
               for r in compute("task_cost", db=as_source(db), by="task", settings=Settings()).to_dicts()}
    assert by_task == {"t1": 2, "t2": 1}


def test_demo_headline_hit_rate(db):
    from agentobs.cli import HEADLINE_SQL

    con = connect(db, read_only=True)
    try:
        calls, sessions, instances, hit_rate = con.sql(HEADLINE_SQL).fetchall()[0][:4]
    finally:
        con.close()
    assert (calls, sessions, instances) == (12, 2, 2)
    assert hit_rate == 0.544  # 17944 / 33000 = 0.5438 (not 17944 / 38000 = 0.472: c5's P left out)


def test_reuse_metric_and_filter_branch(db):
    from agentobs.metrics import compute

    r = {x["session_id"]: x for x in compute("reuse", db=as_source(db), by="session", settings=Settings()).to_dicts()}
    assert r["s1"]["hit_rate"] == pytest.approx(15960 / 30000) and r["s2"]["hit_rate"] == pytest.approx(1984 / 3000)
    main = json.loads(agentobs("metrics", "reuse", "--filter", "branch=main", "--db", db, "--format", "json"))
    main = {x["session_id"]: x for x in main}
    assert (main["s1"]["calls"], main["s2"]["calls"]) == (7, 2)
    assert main["s1"]["hit_rate"] == pytest.approx(12968 / 22000) and main["s2"]["hit_rate"] == pytest.approx(0.496)
    b1 = {x["session_id"]: x for x in compute("reuse", db=as_source(db), by="session", filters={"branch": "b1"},
                                           settings=Settings()).to_dicts()}
    assert (b1["s1"]["calls"], b1["s2"]["calls"]) == (2, 1)
    assert b1["s1"]["hit_rate"] == pytest.approx(2992 / 8000) and b1["s2"]["hit_rate"] == pytest.approx(0.992)
    # the branch's re-prefill: only d2 recomputed (3488 tokens, routed away from d1's instance)
    assert b1["s1"]["reprefill_tokens"] == 3488


def test_clickhouse_sessions_and_branch_filter(db):
    """The same on the ClickHouse backend (chDB in-process): the sessions and tasks views and --filter branch."""
    pytest.importorskip("chdb", reason="chdb is not installed: pip install 'agentobs[clickhouse]'")
    from agentobs.backends.clickhouse import load, model
    from agentobs.backends.clickhouse.conn import ClickHouse
    from agentobs.metrics import compute
    from agentobs.source import ClickHouseSource

    settings = load_settings(env={})
    ch = ClickHouse("chdb:")
    try:
        model.create_tables(ch, settings)
        model.create_views(ch, settings)
        ch.insert_arrow("otel_traces", load.traces_rows(decode_json(otlp_json(), settings).table()))
        v = ch.arrow("SELECT session_id, calls, retries, calls_cached_unknown, hit_rate, main_calls, main_hit_rate, "
                     "branch_calls, branch_hit_rate FROM sessions ORDER BY session_id").to_pylist()
        assert [(x["session_id"], x["calls"], x["retries"], x["calls_cached_unknown"], x["main_calls"],
                 x["branch_calls"]) for x in v] == [("s1", 9, 2, 1, 7, 2), ("s2", 3, 1, 0, 2, 1)]
        assert [(x["hit_rate"], x["main_hit_rate"], x["branch_hit_rate"]) for x in v] == [
            pytest.approx((15960 / 30000, 12968 / 22000, 2992 / 8000)), pytest.approx((1984 / 3000, 0.496, 0.992))]
        assert ch.arrow("SELECT task_id, retries FROM tasks ORDER BY task_id").to_pylist() == [
            {"task_id": "t1", "retries": 2}, {"task_id": "t2", "retries": 1}]
        main = {x["session_id"]: x for x in compute("reuse", ClickHouseSource(ch=ch), by="session", filters={"branch": "main"},
                                                     settings=Settings()).to_dicts()}
        assert (main["s1"]["calls"], main["s2"]["calls"]) == (7, 2)
        assert main["s1"]["hit_rate"] == pytest.approx(12968 / 22000)
    finally:
        ch.close()
