"""The LiteLLM proxy in front of a real vLLM, recorded with the engine's KV events and /metrics (issue 20: "Real
LiteLLM capture: one task, zero re-prefill").

tests/fixtures/litellm_real_kv/ is one ``scripts/vllm/e2e.py --configs litellm --record`` run (README there): the
OTLP/HTTP exports of the agent driver, LiteLLM 1.108.7 (``callbacks: ["otel"]``) and vLLM 0.32.0, the KV-event
batches vLLM published and its /metrics at the end (block size 128). The pool is ample (128 blocks): nothing is
evicted, so the engine recomputes nothing it had cached — and agentobs, from LiteLLM's gateway spans, must say so:
no re-prefill in any call or task, in estimate mode (LiteLLM's spans carry no block hashes), with a band of [0, 0].
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from agentobs.collect.files import import_kv_events, import_otlp, import_prom
from agentobs.model.reuse import reuse_sql

FIX = Path(__file__).parent / "fixtures" / "litellm_real_kv"


@pytest.fixture
def con(store, settings):
    con, w = store
    meta = json.loads((FIX / "capture.json").read_text())
    for res in (import_otlp([FIX / "otlp"], w, settings), import_kv_events([FIX / "kv_events.jsonl"], w),
                import_prom([FIX / "metrics_after.txt"], meta["instance"], w, at=meta["metrics_at"])):
        assert res.rejected == 0 and res.errors == []
    w.flush()
    return con


def _kv_counts() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (FIX / "kv_events.jsonl").read_text().splitlines():
        _ts, events, _rank = msgspec.msgpack.decode(bytes.fromhex(json.loads(line)["payload_hex"]))
        for ev in events:
            out[ev["type"]] = out.get(ev["type"], 0) + 1
    return out


def test_litellm_calls_have_no_reprefill_in_any_task(con):
    # the engine evicted nothing: KV events hold stores only
    assert set(_kv_counts()) == {"BlockStored"}
    rows = con.sql(reuse_sql()).to_arrow_table().to_pylist()
    # 4 sessions x 6 turns + 2 retried turns, all from LiteLLM's litellm_request spans joined to vLLM's llm_request
    assert len(rows) == 26 and {r["block_size"] for r in rows} == {128}
    assert all(r["mode"] == "estimate" for r in rows if r["prev_call_id"] is not None)
    follow = [r for r in rows if r["reprefill_tokens"] is not None]
    # 26 - 4 first calls - the compacted call (a context reset: no R without block hashes) = 21
    assert len(follow) == 21
    assert all(r["reprefill_tokens"] == r["reprefill_low_tokens"] == r["reprefill_high_tokens"] == 0 for r in follow)
    assert {r["miss_cause"] for r in follow} <= {None, "error"}
    tasks: dict[str, int] = {}
    for r in rows:
        tasks[r["task_id"]] = tasks.get(r["task_id"], 0) + (r["reprefill_high_tokens"] or 0)
    assert tasks == {f"task-sess-{k}": 0 for k in range(4)}
