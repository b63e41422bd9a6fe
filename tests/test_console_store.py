"""A small, deterministic store for the console tests (AppTest and browser): the METRICS.md worked example
plus generated agent sessions written as OTLP JSON and imported through the real importer, and engine
/metrics snapshots at three times. Every value is fixed, so tests can state expected numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

from builders import ns, otlp_request, resource_spans, span

from agentobs.collect import files
from agentobs.config import load_settings
from agentobs.model import connect
from agentobs.store.writer import Writer

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLE = Path(__file__).parent.parent / "sample_data" / "fixtures"
T0 = 1791969665  # the worked example's first call (2026-10-14 09:21:05 UTC)
WORKED_SESSION = "sess-0199e1a2-6c40-7d2e-b7a1-3f9e5c2d8a10"
A, B = "10.42.7.31:8000", "10.42.7.32:8000"
QWEN, LLAMA = "Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct"

# session id, task type, tenant, model, calls: (instance, P, C, O, start offset s, duration s, ttft s, attempt, error)
SESSIONS = [
    ("sess-gen-01", "swe-fixer", "team-a", QWEN, [
        (A, 2000, 1024, 100, 0, 3.0, 0.20, 1, False),
        (A, 3000, 1984, 120, 10, 3.0, 0.25, 1, False),   # hit: R_eff = floor(1999/16)*16 = 1984
        (A, 4500, 0, 150, 80, 4.0, 0.90, 1, False),      # evicted_full after a 67 s gap
    ]),
    ("sess-gen-02", "researcher", "team-b", LLAMA, [
        (A, 1500, 512, 80, 30, 2.0, 0.15, 1, False),
        (B, 2600, 0, 90, 40, 2.5, 0.60, 1, False),       # routed away to B
        (B, 3900, 2592, 60, 50, 2.0, 0.22, 1, False),
    ]),
    ("sess-gen-03", "swe-fixer", "team-a", QWEN, [
        (B, 5000, 0, 50, 100, 1.0, 0.50, 1, True),       # fails
        (B, 5000, 4992, 200, 105, 5.0, 0.18, 2, False),  # retry of the failed call
        (B, 6200, 4992, 210, 130, 5.0, 0.35, 1, False),
    ]),
    ("sess-gen-04", "researcher", "team-b", LLAMA, [
        (B, 1200, 0, 40, 200, 1.0, 0.30, 1, False),
        (B, 1900, 1184, 40, 202, 1.0, 0.12, 1, False),
    ]),
]
TOOLS = {"sess-gen-01": [("read_file", 3.2, 9.5), ("run_tests", 13.5, 79.0)],
         "sess-gen-02": [("web_search", 32.2, 39.8)]}


def otlp_document() -> dict:
    agent_spans, gw_spans = [], []
    for i, (session, task_type, tenant, model, calls) in enumerate(SESSIONS):
        trace = f"{i + 1:032x}"
        root = f"{i + 1:08x}00000000"
        base = T0 + 600 + 300 * i
        first, last = calls[0], calls[-1]
        agent_spans.append(span(trace, root, f"invoke_agent {task_type}", ns(base + first[4] - 0.01),
                                ns(base + last[4] + last[5] + 0.01),
                                {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": task_type,
                                 "gen_ai.conversation.id": session, "app.task.id": f"task-{session}",
                                 "agentobs.tenant": tenant}, kind=1))
        for j, (name, t_a, t_b) in enumerate(TOOLS.get(session, [])):
            agent_spans.append(span(trace, f"{i + 1:08x}{j + 1:04x}7777", f"execute_tool {name}", ns(base + t_a),
                                    ns(base + t_b), {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name},
                                    parent=root, kind=1))
        for j, (inst, p, c, o, off, dur, ttft, attempt, error) in enumerate(calls):
            host, port = inst.split(":")
            attrs = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm", "gen_ai.request.model": model,
                     "gen_ai.conversation.id": session, "app.task.id": f"task-{session}",
                     "gen_ai.usage.input_tokens": p, "gen_ai.usage.cache_read.input_tokens": c,
                     "gen_ai.usage.output_tokens": o, "gen_ai.response.time_to_first_chunk": ttft,
                     "server.address": host, "server.port": int(port), "agentobs.attempt": attempt,
                     "agentobs.itl_ms": [20.0 + (k % 5) * 3 for k in range(max(o // 10, 2))]}
            if error:
                attrs["error.type"] = "503"
            gw_spans.append(span(trace, f"{i + 1:08x}{j + 1:04x}cafe", f"chat {model}", ns(base + off),
                                 ns(base + off + dur), attrs, parent=root, error="upstream 503" if error else None))
    return otlp_request(resource_spans("agent-harness", "agent", agent_spans),
                        resource_spans("ai-gateway", "ai-gateway/tracing/otelgenai", gw_spans))


def _prom_at(text: str, k: int) -> str:
    """The vLLM sample scrape with its cache counters and gauges advanced k steps (3 snapshots → real Δs)."""
    hits, queries = 5_637_408 + 9_000 * k, 6_475_530 + 12_000 * k  # each step: 9,000 hits of 12,000 queries
    text = re.sub(r"^(vllm:prefix_cache_hits_total\{[^}]*\}) \S+", rf"\1 {hits}.0", text, flags=re.M)
    text = re.sub(r"^(vllm:prefix_cache_queries_total\{[^}]*\}) \S+", rf"\1 {queries}.0", text, flags=re.M)
    text = re.sub(r"^(vllm:kv_cache_usage_perc\{[^}]*\}) \S+", rf"\1 {0.2 + 0.1 * k}", text, flags=re.M)
    text = re.sub(r"^(vllm:num_requests_waiting\{[^}]*\}) \S+", rf"\1 {float(k)}", text, flags=re.M)
    return text


def build_store(db: Path, tmp: Path) -> Path:
    settings = load_settings(env={})
    doc = tmp / "generated_sessions.json"
    doc.write_text(json.dumps(otlp_document()))
    vllm_text = (SAMPLE / "vllm_metrics.prom").read_text()
    con = connect(db)
    with Writer(con, batch_rows=10_000, flush_s=0.05) as w:
        res = files.import_otlp([FIXTURES / "otlp" / "agent_task_3turns.json", doc], w, settings)
        assert res.rejected == 0, res.errors
        for k in range(3):
            snap = tmp / f"vllm_{k}.prom"
            snap.write_text(_prom_at(vllm_text, k))
            for inst in (A, B):
                files.import_prom([snap], inst, w, at=float(T0 + 600 + 300 * k))
        files.import_prom([SAMPLE / "sglang_metrics.prom"], "10.42.7.40:30000", w, at=float(T0 + 900))
        files.import_server_info(SAMPLE / "sglang_server_info.json", "10.42.7.40:30000", w, at=float(T0 + 900))
    con.close()
    return db


def test_store_has_the_generated_calls(tmp_path):
    import duckdb

    db = build_store(tmp_path / "c.duckdb", tmp_path)
    con = duckdb.connect(str(db), read_only=True)
    # 3 worked-example calls + 3 + 3 + 3 + 2 generated calls
    assert con.execute("SELECT count(*) FROM llm_calls").fetchone()[0] == 14
    assert con.execute("SELECT count(*) FROM sessions").fetchone()[0] == 5
    # sess-gen-02 moved from A to B on its 2nd call: one turn gap with a different previous instance
    assert con.execute("SELECT count(*) FROM turn_gaps WHERE prev_instance <> instance").fetchone()[0] == 1
    # 3 snapshots x 2 vLLM instances + 1 SGLang snapshot
    assert con.execute("SELECT count(DISTINCT (instance, ts)) FROM metric_samples").fetchone()[0] == 7
    con.close()
