"""llm_calls (agentobs/model/views.sql): which spans are model calls, and what a call takes from each.

Hand-built spans rows, inserted as the store holds them; every expected value below is read off the rows."""

from __future__ import annotations

from agentobs.model import connect

COLS = ("trace_id", "span_id", "parent_span_id", "role", "start_ns", "end_ns", "session_id", "instance",
        "model", "input_tokens", "cached_tokens", "output_tokens", "response_id", "request_id", "queue_s")
S = 10**9


def _insert(con, rows):
    con.executemany(f"INSERT INTO spans_part ({', '.join(COLS)}) VALUES ({', '.join('?' * len(COLS))})",
                    [tuple(r.get(c) for c in COLS) for r in rows])


def test_a_call_traced_twice_is_one_call_the_outer_span_filled_from_the_inner(tmp_path):
    con = connect(tmp_path / "m.duckdb")
    _insert(con, [
        # t1: an agent SDK gateway span (outer) and the gateway's own span as its child (inner): one call, the
        # outer's id and times, its own tokens; what it lacks (cached tokens, instance) from the inner
        {"trace_id": "t1", "span_id": "agent", "role": "agent", "start_ns": 0, "end_ns": 10 * S, "session_id": "s1"},
        {"trace_id": "t1", "span_id": "outer", "parent_span_id": "agent", "role": "gateway", "start_ns": 1 * S,
         "end_ns": 5 * S, "model": "m", "input_tokens": 1000, "output_tokens": 50},
        {"trace_id": "t1", "span_id": "inner", "parent_span_id": "outer", "role": "gateway", "start_ns": 1 * S + 10,
         "end_ns": 5 * S - 10, "model": "m", "input_tokens": 999, "cached_tokens": 512, "output_tokens": 49,
         "instance": "10.0.0.1:8000", "response_id": "chatcmpl-r1"},
        # a second inner span of the same outer, later: only the first inner (by start) fills gaps
        {"trace_id": "t1", "span_id": "inner2", "parent_span_id": "outer", "role": "gateway", "start_ns": 2 * S,
         "end_ns": 3 * S, "cached_tokens": 7, "instance": "10.0.0.9:8000"},
        # the engine span of that call, matched by the inner span's response id = the engine's request id
        {"trace_id": "t9", "span_id": "eng", "role": "engine", "start_ns": 1 * S + 20, "end_ns": 5 * S - 20,
         "request_id": "chatcmpl-r1", "queue_s": 0.25, "input_tokens": 999, "instance": "10.0.0.1:8000"},
        # t2: a gateway span whose parent is not a gateway span (nor stored): a call of its own
        {"trace_id": "t2", "span_id": "solo", "parent_span_id": "missing", "role": "gateway", "start_ns": 20 * S,
         "end_ns": 22 * S, "session_id": "s2", "input_tokens": 300, "output_tokens": 10, "instance": "10.0.0.2:8000"},
        # t3: no parent at all
        {"trace_id": "t3", "span_id": "root", "role": "gateway", "start_ns": 30 * S, "end_ns": 31 * S,
         "input_tokens": 100, "output_tokens": 1},
    ])
    rows = {r[0]: r[1:] for r in con.sql(
        "SELECT call_id, session_id, instance, prompt_tokens, cached_tokens, output_tokens, start_s, end_s, queue_s, "
        "engine_span_id, source FROM llm_calls").fetchall()}
    con.close()
    assert set(rows) == {"outer", "solo", "root"}   # inner, inner2, agent and the matched engine span are not calls
    # outer: session from the trace's agent span, instance and cached tokens from the first inner span, its own
    # prompt/output tokens and times; the engine span (matched through the inner span's response id) gives queue_s
    assert rows["outer"] == ("s1", "10.0.0.1:8000", 1000, 512, 50, 1.0, 5.0, 0.25, "eng", "gateway+engine")
    assert rows["solo"] == ("s2", "10.0.0.2:8000", 300, None, 10, 20.0, 22.0, None, None, "gateway")
    assert rows["root"] == (None, None, 100, None, 1, 30.0, 31.0, None, None, "gateway")


def test_ttft_prefers_the_engine_and_says_whose(tmp_path):
    con = connect(tmp_path / "m.duckdb")
    cols = ("trace_id", "span_id", "parent_span_id", "role", "start_ns", "end_ns", "ttft_s", "queue_s", "prefill_s",
            "error_type", "status_code")
    rows = [
        # a: gateway 0.50 s, its engine child 0.30 s (the engine's own time to first token): the engine's 0.30; the
        # first token at the engine span's start (10.10 s) + 0.30 = 10.40 s
        ("t", "a", None, "gateway", 10 * S, 12 * S, 0.5, None, None, None, 0),
        ("t", "a-e", "a", "engine", 10 * S + S // 10, 12 * S, 0.3, 0.05, 0.2, None, 0),
        # b: the engine span has no TTFT attribute, only queue 0.05 + prefill 0.15 = 0.20 s; first token 20.30 s
        ("t", "b", None, "gateway", 20 * S, 22 * S, 0.5, None, None, None, 0),
        ("t", "b-e", "b", "engine", 20 * S + S // 10, 22 * S, None, 0.05, 0.15, None, 0),
        # c: no engine span: the gateway's 0.5 s from its own start, 30.5 s
        ("t", "c", None, "gateway", 30 * S, 32 * S, 0.5, None, None, None, 0),
        # d: nothing knows a TTFT (e.g. a call that was not streamed): unknown, no source
        ("t", "d", None, "gateway", 40 * S, 42 * S, None, None, None, None, 0),
        # e: an engine span no gateway call claims: its own 0.25 s, from its start 50 s; its HTTP error counts
        ("u", "e", None, "engine", 50 * S, 51 * S, 0.25, None, None, "500", 0),
        # f: the engine's error type shows on the joined call (the gateway span says nothing)
        ("t", "f", None, "gateway", 60 * S, 61 * S, None, None, None, None, 0),
        ("t", "f-e", "f", "engine", 60 * S, 61 * S, None, None, None, "503", 0),
    ]
    con.executemany(f"INSERT INTO spans_part ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", rows)
    got = {r[0]: r[1:] for r in con.sql(
        "SELECT call_id, round(ttft_s, 6), ttft_source, epoch_ms(first_token_ts) / 1000.0, status, error_type "
        "FROM llm_calls").fetchall()}
    con.close()
    assert got == {
        "a": (0.3, "engine", 10.4, "ok", None),
        "b": (0.2, "engine_queue_prefill", 20.3, "ok", None),
        "c": (0.5, "gateway", 30.5, "ok", None),
        "d": (None, None, None, "ok", None),
        "e": (0.25, "engine", 50.25, "error", "500"),
        "f": (None, None, None, "error", "503"),
    }


def test_views_are_made_once_per_store_and_again_when_not_current(tmp_path):
    """ensure stamps call_reuse (made last) with what the views are made from; a store carrying the current stamp
    is left as it is, one without it (an older release's, or views made in part) gets every view again."""
    from agentobs.model import views_stamp

    path = tmp_path / "v.duckdb"
    con = connect(path)

    def stamp():
        return con.execute("SELECT comment FROM duckdb_views() WHERE view_name = 'call_reuse'").fetchall()

    def views():
        return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}

    assert stamp() == [(views_stamp(),)]
    made = views()
    assert {"llm_calls", "sessions", "tasks", "call_reuse"} <= made
    con.execute("DROP VIEW tasks")  # with the stamp current, a reopen trusts it: nothing is made again
    con.close()
    con = connect(path)
    assert views() == made - {"tasks"}
    con.execute("COMMENT ON VIEW call_reuse IS NULL")  # no stamp: every view made again, the stamp put back
    con.close()
    con = connect(path)
    assert views() == made and stamp() == [(views_stamp(),)]
    con.close()
