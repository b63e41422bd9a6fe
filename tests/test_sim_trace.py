"""`agentobs simulate --trace FILE`: kv-cache-tester traces from anywhere, replayed into a bundle with ground truth."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from cli_run import run_cli

from agentobs.collect.bundle import import_bundle
from agentobs.config import load_settings
from agentobs.errors import InputError
from agentobs.model import connect
from agentobs.sim.workload import IdAlloc, claude_code
from agentobs.store.writer import Writer


def _req(t: float, n: int, out: int, hashes: list[int], stop: str = "tool_use", think: float = 5.0) -> dict:
    return {"type": "s", "t": t, "model": "claude-test", "in": n, "out": out, "hash_ids": hashes,
            "input_types": ["tool_result"], "output_types": ["text", "tool_use"], "stop": stop,
            "api_time": 2.0, "think_time": think}


def _trace(tid: str, sizes: list[int], first_id: int = 1, edit_at: int | None = None) -> dict:
    """One session whose prompts grow as ``sizes``; ids are prefix-chained (one per full 64-token block). From
    request ``edit_at`` on, the history's tail is rewritten (new ids from the middle on), as a compaction does."""
    reqs, ids = [], []
    nxt = first_id
    for j, n in enumerate(sizes):
        if edit_at is not None and j == edit_at:
            ids = ids[: len(ids) // 2]
        while len(ids) < n // 64:
            ids.append(nxt)
            nxt += 1
        reqs.append(_req(10.0 * j, n, 150 + 10 * j, ids[: n // 64], think=0.0 if j == 0 else 4.0 + j))
    return {"id": tid, "models": ["claude-test"], "block_size": 64, "hash_id_scope": "local", "tool_tokens": 500,
            "system_tokens": 300, "requests": reqs}


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("traces")
    a = d / "agent_a.json"
    b = d / "agent_b.json"
    a.write_text(json.dumps(_trace("trace_a", [1000, 1700, 2500, 3300, 4100])))
    b.write_text(json.dumps(_trace("trace_b", [800, 1500, 2400, 2900])))
    return [a, b]


TRUTH_SQL = """
SELECT sum(t.reprefill_tokens) FILTER (WHERE NOT t.first_call) AS true_x,
       sum(r.reprefill_tokens) FILTER (WHERE NOT t.first_call) AS metric_x,
       count(*) AS calls, count(*) FILTER (WHERE t.reprefill_tokens > 0) AS misses
FROM read_parquet('{truth}') t JOIN call_reuse r USING (call_id)
"""


def _import(bundle: Path, db: Path):
    con = connect(db)
    with Writer(con) as w:
        res = import_bundle(bundle, w, load_settings(None))
    for what, r in res.items():
        assert r.rejected == 0 and not r.errors, (what, r.errors[:3])
    return con


def test_trace_replay_reprefill_equals_ground_truth(traces, tmp_path):
    out = tmp_path / "bundle"
    r = run_cli("simulate", "--trace", traces[0], "--trace", traces[1], "--replicas", "2", "--engine", "vllm",
                "--block-size", "16", "--router", "round_robin", "--seed", "3", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "simulated 9 calls of 2 sessions" in r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["workload"] == "trace" and len(m["instances"]) == 2
    con = _import(out, tmp_path / "t.duckdb")
    true_x, metric_x, calls, misses = con.sql(TRUTH_SQL.format(truth=out / "truth/calls.parquet")).fetchall()[0]
    assert calls == 9
    assert misses > 0 and true_x > 0  # round robin over 2 replicas sends follow-ups away
    assert metric_x == true_x
    sessions = {s for (s,) in con.sql("SELECT DISTINCT session_id FROM llm_calls").fetchall()}
    assert sessions == {"cc-agent_a", "cc-agent_b"}


def test_truth_of_an_edited_prompt_is_the_shared_prefix(tmp_path):
    """A harness that rewrites history: the last prompt shares only half of the previous one's blocks. The
    truth counts what is really reusable (estimate mode charging the rest to eviction is issue 20's open part)."""
    p = tmp_path / "edit.json"
    p.write_text(json.dumps(_trace("trace_e", [800, 1500, 2400, 2900], edit_at=3)))
    out = tmp_path / "bundle"
    r = run_cli("simulate", "--trace", p, "--replicas", "1", "--no-kv-events", "--out", out)
    assert r.returncode == 0, r.stderr
    truth = duckdb.sql(f"SELECT prompt_tokens, reusable_tokens, cached_tokens, reprefill_tokens "
                       f"FROM read_parquet('{out}/truth/calls.parquet') ORDER BY start_s").fetchall()
    # one replica, a large pool: everything that is reusable is a hit; the edit keeps 18 of 37 64-token blocks
    assert truth[1:] == [(1500, 800, 800, 0), (2400, 1488, 1488, 0), (2900, 18 * 64, 18 * 64, 0)]


def test_prompt_bigger_than_kv_pool_is_an_error_call(traces, tmp_path):
    out = tmp_path / "bundle"
    r = run_cli("simulate", "--trace", traces[0], "--engine", "sglang", "--replicas", "1",
                "--kv-capacity-tokens", "3008", "--out", out, env={"COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    assert "2 calls refused (HTTP 400)" in r.stderr
    truth = duckdb.sql(f"SELECT prompt_tokens, rejected, status, cause FROM read_parquet('{out}/truth/calls.parquet') "
                       "ORDER BY start_s").fetchall()
    assert [t[0] for t in truth] == [1000, 1700, 2500, 3300, 4100]
    assert [(t[1], t[2], t[3]) for t in truth[3:]] == [(True, "error", "rejected")] * 2
    assert not any(t[1] for t in truth[:3])  # refused, not retried: the session goes on with the next call
    con = _import(out, tmp_path / "k.duckdb")
    rows = con.sql("SELECT status, count(*) FROM llm_calls GROUP BY 1 ORDER BY 1").fetchall()
    assert rows == [("error", 2), ("ok", 3)]
    # the gateway span of a refused call: HTTP 400 with the engine's message, and no engine span
    spans = con.sql("SELECT role, status_code, status_message FROM spans WHERE role IN ('gateway', 'engine') "
                    "AND status_code = 2").fetchall()
    assert len(spans) == 2 and all(s[0] == "gateway" for s in spans)
    assert "exceeds the maximum allowed length (3008 tokens)" in spans[0][2]
    assert con.sql("SELECT count(*) FROM spans WHERE role = 'engine'").fetchall()[0][0] == 3


def test_max_model_len_refuses_on_vllm(traces, tmp_path):
    out = tmp_path / "bundle"
    r = run_cli("simulate", "--trace", traces[1], "--max-model-len", "2000", "--no-kv-events", "--out", out)
    assert r.returncode == 0, r.stderr
    truth = duckdb.sql(f"SELECT prompt_tokens, rejected FROM read_parquet('{out}/truth/calls.parquet') "
                       "ORDER BY start_s").fetchall()
    assert truth == [(800, False), (1500, False), (2400, True), (2900, True)]
    msgs = [json.dumps(s) for s in _gateway_errors(out)]
    assert len(msgs) == 2 and all("maximum context length is 2000 tokens" in m and '"400"' in m for m in msgs)


def _gateway_errors(bundle: Path) -> list[dict]:
    import gzip

    out = []
    for f in sorted((bundle / "otlp").glob("*.jsonl*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            for line in fh:
                for rs in json.loads(line)["resourceSpans"]:
                    for ss in rs["scopeSpans"]:
                        out.extend(s for s in ss["spans"] if s.get("status", {}).get("code") == 2)
    return out


def test_bad_trace_files_name_the_file(tmp_path):
    cases = {
        "notjson.json": ("{nope", "not JSON"),
        "list.json": ("[1, 2]", "not a kv-cache-tester trace"),
        "noin.json": (json.dumps({"requests": [{"out": 3}]}), "requests[0].in is None"),
        "hashes.json": (json.dumps({"requests": [{"in": 128, "hash_ids": ["a"]}]}), "hash_ids must be a list"),
        "toomany.json": (json.dumps({"requests": [{"in": 100, "hash_ids": [1, 2]}]}), "2 hash_ids for 100 tokens"),
        "sub.json": (json.dumps({"requests": [{"type": "subagent", "requests": [{"in": -1}]}]}),
                     r"requests[0].requests[0].in is -1"),
        "block.json": (json.dumps({"block_size": 16, "requests": []}), "block_size is 16"),
    }
    for name, (text, msg) in cases.items():
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(InputError, match=None) as e:
            claude_code([p], 16, IdAlloc(1))
        assert str(p) in str(e.value) and msg in str(e.value), (name, str(e.value))
        r = run_cli("simulate", "--trace", p, env={"COLUMNS": "400"})
        assert r.returncode != 0 and str(p) in r.stderr and msg in r.stderr, (name, r.stderr)
    r = run_cli("simulate", "--trace", tmp_path / "missing.json", env={"COLUMNS": "400"})
    assert r.returncode == 2 and "missing.json" in r.stderr and "does not exist" in r.stderr


@pytest.mark.parametrize(("args", "msg"), [
    (["--replicas", "2"], "--replicas only apply with --trace FILE"),
    (["--engine", "sglang", "--kv-capacity-tokens", "5"], "--engine, --kv-capacity-tokens only apply with --trace"),
    (["--trace", "T", "--scenario", "quick"], "does not combine with --scenario"),
    (["--trace", "T", "--compare"], "does not combine with --compare"),
    (["--trace", "T", "--duration", "60"], "does not combine with --duration"),
    (["--trace", "T", "--replicas", "0"], "--replicas"),
    (["--trace", "T", "--engine", "trt"], "--engine"),
    (["--trace", "T", "--block-size", "48"], "--block-size"),
    (["--trace", "T", "--block-size", "64", "--kv-capacity-tokens", "32"], "less than one block (64 tokens)"),
    (["--trace", "T", "--router", "random"], "--router"),
    (["--trace", "T", "--restart", "nope"], "--restart 'nope': expected INSTANCE@SECONDS"),
    (["--trace", "T", "--restart", "1.2.3.4:80@-5"], "expected INSTANCE@SECONDS"),
    (["--trace", "T", "--restart", "1.2.3.4:80@5"], "restart of unknown instance '1.2.3.4:80'"),
    (["--compare", "--restart", "10.0.0.1:8000@5"], "does not combine with --restart"),
])
def test_option_validation(traces, args, msg):
    args = [str(traces[0]) if a == "T" else a for a in args]
    r = run_cli("simulate", *args)
    assert r.returncode == 2, (args, r.stderr)
    assert msg in r.stderr, (args, r.stderr)
