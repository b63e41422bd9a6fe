"""One trace's span tree (agentobs.model.trace): the tree from hand-made spans, `agentobs trace ID` on the METRICS.md
worked example (tests/fixtures/otlp/agent_task_3turns.json), and the console's Trace page reached from a call."""

from __future__ import annotations

import json

import pytest
from cli_run import run_cli

from agentobs.model.trace import TraceNotFound, build

WORKED_TRACE = "7f3a9c1e5b2d48f6a0c4e8b1d3f59a27"
WORKED_SESSION = "sess-0199e1a2-6c40-7d2e-b7a1-3f9e5c2d8a10"
T0 = 1_800_000_000_000_000_000  # ns


def span(sid, parent, name, start_s, end_s, role="other", **kw):
    return {"span_id": sid, "parent_span_id": parent, "name": name, "start_ns": T0 + int(start_s * 1e9),
            "end_ns": None if end_s is None else T0 + int(end_s * 1e9), "role": role, "attributes": "{}", **kw}


def test_tree_order_offsets_and_engine_phases():
    spans = [
        span("e1", "c1", "llm_request", 0.5, 3.0, "engine", queue_s=0.25, prefill_s=0.75, decode_s=1.5,
             input_tokens=5000, cached_tokens=4000, output_tokens=100),
        span("t1", "a", "execute_tool run_tests", 3.2, 33.2, "tool", tool_name="run_tests"),
        span("c1", "a", "chat m", 0.4, 3.1, "gateway", model="m"),
        span("a", None, "invoke_agent x", 0.0, 40.0, "agent", session_id="s1"),
        span("o", "gone", "orphan", 35.0, None),  # its parent was never exported: a root of its own
    ]
    tr = build("t", spans)
    # depth first, children by start: a → c1 → e1, then t1; the orphan last (a root starting later)
    assert [n.span_id for n in tr.nodes] == ["a", "c1", "e1", "t1", "o"]
    assert [n.depth for n in tr.nodes] == [0, 1, 2, 1, 0]
    assert [n.prefix for n in tr.nodes] == ["", "├─ ", "│  └─ ", "└─ ", ""]
    e1 = tr.node("e1")
    assert e1.offset_s == pytest.approx(0.5) and e1.duration_s == pytest.approx(2.5)
    # queue from the span's start, then prefill, then decode: 0.5–0.75, 0.75–1.5, 1.5–3.0
    assert [(p, round(o, 6), round(d, 6)) for p, o, d in e1.phases()] == [
        ("queue", 0.5, 0.25), ("prefill", 0.75, 0.75), ("decode", 1.5, 1.5)]
    assert "P 5,000 C 4,000 O 100" in e1.detail() and "queue 250 ms · prefill 750 ms · decode 1.5 s" in e1.detail()
    assert tr.node("o").duration_s is None
    assert tr.duration_s == pytest.approx(40.0)  # first start to last end
    assert tr.session_ids() == ["s1"]
    d = tr.to_dict()
    assert [r["span_id"] for r in d["roots"]] == ["a", "o"]
    assert [c["span_id"] for c in d["roots"][0]["children"]] == ["c1", "t1"]


def test_no_spans_is_an_error():
    with pytest.raises(TraceNotFound):
        build("t", [])


@pytest.fixture(scope="module")
def worked_db(tmp_path_factory):
    from pathlib import Path

    db = tmp_path_factory.mktemp("trace") / "t.duckdb"
    fx = Path(__file__).parent / "fixtures" / "otlp" / "agent_task_3turns.json"
    r = run_cli("import", "otlp", fx, "--db", db)
    assert r.returncode == 0, r.stderr
    return db


def test_cli_trace_prints_the_worked_tree(worked_db):
    r = run_cli("trace", "--db", worked_db, "--format", "csv", WORKED_TRACE.upper())  # any case
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()[1:]
    names = [ln.split(",")[4].strip('"') for ln in lines]
    # the agent span, then its children by start: chat (0.012 s), read_file (4.318), chat (4.415), run_tests
    # (10.214), chat (51.950); all offsets from the agent span's start
    assert names == ["invoke_agent swe-fixer", "chat Qwen/Qwen3-32B", "execute_tool read_file", "chat Qwen/Qwen3-32B",
                     "execute_tool run_tests", "chat Qwen/Qwen3-32B"]
    offsets = [float(ln.split(",")[6]) for ln in lines]
    assert offsets == pytest.approx([0.0, 0.012, 4.318, 4.415, 10.214, 51.95])
    # a call id (the chat span's id) finds the same trace
    j = json.loads(run_cli("trace", "--db", worked_db, "--format", "json", "3e7a1c5d9f4b6083").stdout)
    assert j["trace_id"] == WORKED_TRACE and j["spans"] == 6
    assert j["duration_s"] == pytest.approx(56.031)
    chat2 = j["roots"][0]["children"][2]
    assert chat2["span_id"] == "3e7a1c5d9f4b6083" and chat2["attributes"]["session.id"] == WORKED_SESSION
    bad = run_cli("trace", "--db", worked_db, "ffff")
    assert bad.returncode != 0 and "no span with trace id or span id 'ffff'" in bad.stderr


def test_console_trace_page_from_a_call(worked_db, monkeypatch, tmp_path):
    from console_checks import df_of, goto
    from streamlit.testing.v1 import AppTest

    from agentobs.console import APP

    monkeypatch.setenv("AGENTOBS_DB", str(worked_db))
    monkeypatch.setenv("AGENTOBS_CONSOLE_QUERIES", str(tmp_path / "q.json"))
    monkeypatch.delenv("AGENTOBS_CONFIG", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    # the session timeline links every call to its trace
    goto(at, "session.py", session=WORKED_SESSION)
    links = df_of(at)["trace"].to_list()
    assert len(links) == 3 and all(ln.startswith("./trace?") and f"trace={WORKED_TRACE}" in ln for ln in links)
    # the Trace page opened with a call id: the waterfall, one row per span, and the chosen span's attributes
    goto(at, "trace.py", call="3e7a1c5d9f4b6083")
    assert {m.label: m.value for m in at.metric}["spans"] == "6"
    assert len(at.get("vega_lite_chart")) == 1
    rows = df_of(at)
    assert rows["kind"].to_list() == ["agent", "gateway", "tool", "gateway", "tool", "gateway"]
    at.selectbox(key="trace_span").set_value("3e7a1c5d9f4b6083").run()
    assert any(m.value.startswith("**chat Qwen/Qwen3-32B** — gateway") for m in at.markdown)
    assert any(WORKED_SESSION in str(j.value) for j in at.json)
