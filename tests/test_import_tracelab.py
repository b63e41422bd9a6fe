"""`agentobs import tracelab`: TraceLab per-call rows (tests/fixtures/tracelab, six real rows of TraceLab's public
example) become ordinary sessions — calls with the token split, idle gaps, tool calls, one trace per session.

Hand-computed from the rows: a round starts at its last input event (user_message / tool_result) and ends at its
last output event (reasoning, text, tool_call, usage_report); P = input_tokens_total, C = prefix_tokens."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pytest
from cli_run import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "tracelab" / "round_trace.sample.jsonl"
CLAUDE = "claude:92ee5b8a-429c-e80b-5db6-5381512f4697"
CODEX = "codex:a611041f-625d-6fad-5e59-845850dc6543"


def rows(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    db = tmp_path_factory.mktemp("tracelab") / "t.duckdb"
    r = run_cli("import", "tracelab", FIXTURE, "--db", db)
    assert r.returncode == 0, r.stderr
    # 2 sessions → 2 invoke_agent roots, 6 rounds → 6 chat spans, 9 tool calls (2+1+1 Claude, 3+1+1 Codex)
    assert "17 accepted (17 new)" in r.stderr
    return db


def test_sessions_and_token_split(db):
    got = rows(db, "SELECT session_id, calls, prompt_tokens, cached_tokens, output_tokens, agent_name FROM sessions "
                   "ORDER BY session_id")
    assert got == [
        # ΣP 32272+35740+38592, ΣC (prefix_tokens = cache read) 27217+29380+35738, ΣO 931+1016+2475
        (CLAUDE, 3, 106_604, 92_335, 4_422, "claude-code"),
        # ΣP 9324+9917+10058, ΣC 6912+9600+9856, ΣO 444+94+59
        (CODEX, 3, 29_299, 26_368, 597, "codex"),
    ]


def test_call_times_and_idle_gaps(db):
    e2e = rows(db, f"SELECT round(e2e_s, 3), ttft_s, model FROM llm_calls WHERE session_id = '{CLAUDE}' "
                   "ORDER BY start_s")
    # round 0: user_message 05:40:20.151 → last tool_call 05:40:31.647; round 1: last tool_result 05:40:50.938 →
    # tool_call 05:41:04.862; round 2: tool_result 05:41:17.550 → tool_call 05:41:44.015. No TTFT (not recorded).
    assert e2e == [(11.496, None, "claude-opus-4-8"), (13.924, None, "claude-opus-4-8"),
                   (26.465, None, "claude-opus-4-8")]
    gaps = rows(db, f"SELECT round(gap_s, 3) FROM turn_gaps WHERE session_id = '{CLAUDE}' ORDER BY start_ts")
    # the idle gap before round 1 is the WebSearch that ran 05:40:31.647 → 05:40:50.938; before round 2 the
    # WebSearch 05:41:04.862 → 05:41:17.550
    assert gaps == [(19.291,), (12.688,)]
    codex = rows(db, f"SELECT round(gap_s, 3) FROM turn_gaps WHERE session_id = '{CODEX}' ORDER BY start_ts")
    # 10:06:06.704 − 10:06:05.542 (usage_report), 10:06:13.380 − 10:06:08.390
    assert codex == [(1.162,), (4.99,)]


def test_tool_calls(db):
    got = rows(db, f"SELECT tool_name, round(duration_s, 3), status FROM tool_calls WHERE session_id = '{CODEX}' "
                   "ORDER BY start_s")
    assert got == [("exec_command", 0.067, "ok"), ("exec_command", 0.079, "error"), ("exec_command", 1.176, "ok"),
                   ("write_stdin", 5.002, "ok"), ("write_stdin", 0.008, "ok")]


def test_reimport_adds_nothing_and_the_trace_is_one_tree(db):
    r = run_cli("import", "tracelab", FIXTURE, "--db", db)
    assert r.returncode == 0 and "0 new, 17 already present" in r.stderr
    tid = rows(db, f"SELECT DISTINCT trace_id FROM spans WHERE session_id = '{CLAUDE}'")
    assert len(tid) == 1  # one trace per session
    j = json.loads(run_cli("trace", "--db", db, "--format", "json", tid[0][0]).stdout)
    root = j["roots"]
    assert len(root) == 1 and root[0]["name"] == "invoke_agent claude-code"
    # children by start: chat, Bash, WebSearch, chat, WebSearch, chat, Write
    assert [c["name"] for c in root[0]["children"]] == [
        "chat claude-opus-4-8", "execute_tool Bash", "execute_tool WebSearch", "chat claude-opus-4-8",
        "execute_tool WebSearch", "chat claude-opus-4-8", "execute_tool Write"]


def test_bad_rows_are_named_and_the_rest_imports(tmp_path):
    good = FIXTURE.read_text().splitlines()[0]
    bad = tmp_path / "bad.jsonl.gz"
    row = json.loads(good)
    no_sid = {**row, "session_id": None}
    no_time = {**row, "round_index": 9, "timing_events": []}
    bad_ts = {**row, "round_index": 10, "timing_events": [{"event_type": "text", "timestamp": "yesterday"}]}
    with gzip.open(bad, "wt") as f:
        f.write("\n".join([good, "{not json", json.dumps(no_sid), json.dumps(no_time), json.dumps(bad_ts)]) + "\n")
    db = tmp_path / "b.duckdb"
    r = run_cli("import", "tracelab", bad, "--db", db)
    assert r.returncode == 0  # the good row imports
    assert "bad.jsonl.gz:2: not JSON" in r.stderr
    assert "bad.jsonl.gz:3: session_id is missing" in r.stderr
    assert "bad.jsonl.gz:4: no timing_events with a timestamp" in r.stderr
    assert "timestamp 'yesterday' is not ISO-8601" in r.stderr
    # 1 root + 1 chat + 2 tools of the good row
    assert rows(db, "SELECT count(*) FROM spans") == [(4,)]
    only_bad = tmp_path / "only_bad.jsonl"
    only_bad.write_text("{not json\n")
    r = run_cli("import", "tracelab", only_bad, "--db", tmp_path / "c.duckdb")
    assert r.returncode == 1
