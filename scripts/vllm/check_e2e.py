#!/usr/bin/env python3
"""Checks of one end-to-end run (scripts/vllm/e2e.py) against what the engine itself said.

    .venv/bin/python scripts/vllm/check_e2e.py --db OUT/ample/agentobs.duckdb --responses OUT/ample/responses.jsonl
    .venv/bin/python scripts/vllm/check_e2e.py --compare OUT/ample/agentobs.duckdb OUT/starved/agentobs.duckdb

Per run (prints the numbers, exit 1 when a check fails):

1. usage: every call the driver made is in ``llm_calls`` once, with the prompt, cached and output
   tokens vLLM returned in ``usage`` (``prompt_tokens_details.cached_tokens``), matched by the
   response id.
2. join: gateway and engine spans joined (``source = 'gateway+engine'``) for ≥ 99 % of the calls,
   and no engine span left unclaimed.
3. fleet hit rate: ``fleet_hit_rate`` (Δvllm:prefix_cache_hits_total ÷ Δprefix_cache_queries_total
   over the scrapes) equals ΣC ÷ ΣP of the calls, and Δhits = ΣC, Δqueries = ΣP exactly.
4. re-prefill vs KV events: for every call with a previous turn, the engine's own view of the
   re-prefill is X_kv = B × (blocks that the call's prefill stored again although the same session
   had stored them before the call started) — vLLM republishes ``BlockStored`` with the same hash
   when it recomputes an evicted block. ``call_reuse.reprefill_tokens`` must be within one block
   (B tokens) of X_kv for every call where agentobs computes it, and a call with an
   ``evicted_*`` miss cause must have a ``BlockRemoved`` of one of its session's blocks (hash →
   session from ``BlockStored.session_id``) between the previous call's end and its own end.

``--compare AMPLE STARVED`` prints the two runs side by side (hit rate, re-prefill shares, miss
causes, evictions, turn-resume TTFT by idle gap and hit class, findings) and fails unless the
starved run shows more re-prefill, more evictions and a lower hit rate.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from agentobs.metrics.run import prepare
from agentobs.model import connect
from agentobs.model.reuse import reuse_sql

JOIN_MIN = 0.99


def _print(title: str, rows: list[dict]) -> None:
    print(f"\n## {title}")
    if not rows:
        print("(none)")
        return
    cols = list(rows[0])
    w = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in cols}
    print("  ".join(c.ljust(w[c]) for c in cols))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w[c]) for c in cols))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    return "" if v is None else str(v)


def load_responses(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def check_usage(con, responses: list[dict]) -> dict:
    calls = con.sql("SELECT call_id, response_id, request_id, session_id, attempt, prompt_tokens, cached_tokens, "
                    "output_tokens, source FROM llm_calls").to_arrow_table().to_pylist()
    by_id: dict[str, list[dict]] = {}
    for c in calls:
        for k in {c["response_id"], c["request_id"]} - {None}:
            by_id.setdefault(k, []).append(c)
    missing, dup, bad = [], [], []
    for r in responses:
        if r["status"] != 200:
            continue
        got = by_id.get(r["response_id"], [])
        got = list({c["call_id"]: c for c in got}.values())
        if not got:
            missing.append(r["request_id"])
            continue
        if len(got) > 1:
            dup.append(r["request_id"])
        c = got[0]
        u = r["usage"]
        want = (u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens"), u["completion_tokens"])
        have = (c["prompt_tokens"], c["cached_tokens"], c["output_tokens"])
        # the attempt is the agent's: known only when the driver traced its own chat spans (not behind LiteLLM)
        attempt_bad = r.get("span_id") is not None and c["attempt"] != r["attempt"]
        # the block hashes the driver sent were cut from the engine's tokenization of the same messages
        tok_bad = r.get("tokenized_prompt_tokens") is not None and r["tokenized_prompt_tokens"] != u["prompt_tokens"]
        if want != have or c["session_id"] != r["session_id"] or attempt_bad or tok_bad:
            bad.append({"request": r["request_id"], "vllm (P,C,O)": want, "duckdb (P,C,O)": have,
                        "session": c["session_id"], "attempt": c["attempt"],
                        "tokenized P": r.get("tokenized_prompt_tokens")})
    ok200 = sum(1 for r in responses if r["status"] == 200)
    res = {"calls_sent": len(responses), "calls_ok": ok200, "calls_in_duckdb": len(calls), "missing": missing,
           "duplicated": dup, "mismatched": bad}
    res["pass"] = not missing and not dup and not bad and len(calls) == ok200
    return res


def check_join(con) -> dict:
    rows = dict(con.sql("SELECT source, count(*) FROM llm_calls GROUP BY source").fetchall())
    total = sum(rows.values())
    joined = rows.get("gateway+engine", 0)
    res = {"by_source": rows, "joined": joined, "total": total, "joined_share": joined / total if total else None}
    res["pass"] = total > 0 and joined / total >= JOIN_MIN and rows.get("engine", 0) == 0
    return res


def check_fleet_hit_rate(db: str) -> dict:
    run, close = prepare(db)
    try:
        fr = run.compute("fleet_hit_rate").to_dicts()
        calls = run.table("m_calls")
    finally:
        close()
    sum_c = int(calls["cached_tokens"].sum())
    sum_p = int(calls["prompt_tokens"].sum())
    res = {"fleet_hit_rate": fr, "sum_cached": sum_c, "sum_prompt": sum_p,
           "span_hit_rate": sum_c / sum_p if sum_p else None}
    if len(fr) != 1:
        res["pass"] = False
        return res
    f = fr[0]
    res["pass"] = (f["hit_tokens"] == sum_c and f["query_tokens"] == sum_p and f["restarts"] == 0
                   and abs(f["hit_rate"] - sum_c / sum_p) < 1e-12)
    return res


KV_SQL = """
WITH cr AS (
    SELECT call_id, session_id, instance, start_s, end_s, prev_call_id, block_size, block_size_source,
           reusable_tokens_eff, prompt_tokens, cached_tokens, shortfall_tokens, reprefill_tokens,
           reprefill_low_tokens, reprefill_high_tokens, mode, cause_evidence, miss_cause, hit_class, context_reset,
           attempt
    FROM ({reuse}) r
),
prev AS (SELECT call_id, end_s AS prev_end_s FROM cr),
stored AS (   -- every block hash a session stored, with when
    SELECT instance, session_id, epoch_us(ts) / 1e6 AS ts_s, unnest(block_hashes) AS h
    FROM kv_events WHERE type = 'BlockStored' AND session_id IS NOT NULL
),
owner AS (SELECT instance, h, arg_min(session_id, ts_s) AS session_id FROM stored GROUP BY ALL),
removed AS (
    SELECT o.session_id, r.instance, r.ts_s, r.h
    FROM (SELECT instance, epoch_us(ts) / 1e6 AS ts_s, unnest(block_hashes) AS h
          FROM kv_events WHERE type = 'BlockRemoved') r
    JOIN owner o USING (instance, h)
),
-- blocks stored during the call (its prefill and decode) ...
during AS (
    SELECT cr.call_id, s.h, min(s.ts_s) AS ts_s
    FROM cr JOIN stored s
      ON s.session_id = cr.session_id AND s.instance = cr.instance
     AND s.ts_s >= cr.start_s AND s.ts_s <= cr.end_s + 0.05
    GROUP BY ALL
),
-- ... that the session had already stored before the call started: recomputed blocks
again AS (
    SELECT d.call_id, count(*) AS blocks_again
    FROM during d JOIN cr USING (call_id)
    WHERE EXISTS (SELECT 1 FROM stored s WHERE s.session_id = cr.session_id AND s.instance = cr.instance
                                         AND s.h = d.h AND s.ts_s < cr.start_s)
    GROUP BY d.call_id
),
rm AS (
    SELECT cr.call_id, count(*) AS removed_before
    FROM cr JOIN prev p ON p.call_id = cr.prev_call_id
    JOIN removed r ON r.session_id = cr.session_id AND r.instance = cr.instance
                  AND r.ts_s >= p.prev_end_s AND r.ts_s <= cr.end_s
    GROUP BY cr.call_id
)
SELECT cr.*, coalesce(a.blocks_again, 0) AS blocks_again,
       coalesce(a.blocks_again, 0) * cr.block_size AS reprefill_kv,
       coalesce(rm.removed_before, 0) AS removed_before,
       (SELECT count(*) FROM during d WHERE d.call_id = cr.call_id) AS blocks_stored
FROM cr LEFT JOIN again a USING (call_id) LEFT JOIN rm USING (call_id)
ORDER BY session_id, start_s
"""


# the calls as collected (exact mode where the spans carry agentobs.prompt.block_hashes), and the same calls without
# their block hashes: what estimate mode makes of them (same spans, counters and KV events)
CALLS_AS_COLLECTED = "llm_calls"
CALLS_WITHOUT_HASHES = "(SELECT * REPLACE (CAST(NULL AS VARCHAR[]) AS block_hashes) FROM llm_calls)"


def kv_rows(con, calls: str) -> list[dict]:
    """call_reuse of the current agentobs (not the view stored in the file) beside the engine's KV-event view."""
    return con.sql(KV_SQL.replace("{reuse}", reuse_sql(calls=calls))).to_arrow_table().to_pylist()


def check_kv(con) -> dict:
    """Re-prefill per call against the engine's KV events (X_kv), in exact mode (block hashes on the spans, when
    the driver sent them) and in estimate mode (the same calls without hashes). Exact: X = X_kv for every call with
    a previous turn. Estimate: X_kv inside [X_low, X_high] for every call where agentobs computes X, and X = X_kv
    where the evidence is certain (X_low = X_high). Both count the block vLLM's decode filled: after an eviction the
    engine recomputes one block more than the previous prompt (``beyond_prev`` below)."""
    est = kv_rows(con, CALLS_WITHOUT_HASHES)
    has_hashes = con.sql("SELECT count(*) FROM llm_calls WHERE block_hashes IS NOT NULL").fetchall()[0][0]
    exact = {r["call_id"]: r for r in kv_rows(con, CALLS_AS_COLLECTED)} if has_hashes else {}
    rows = est
    n_events = dict(con.sql("SELECT type, count(*) FROM kv_events GROUP BY type").fetchall())
    unattributed = con.sql("""
        WITH s AS (SELECT session_id, instance, epoch_us(ts) / 1e6 AS ts_s FROM kv_events
                   WHERE type = 'BlockStored' AND session_id IS NOT NULL)
        SELECT count(*) FROM s WHERE NOT EXISTS (
            SELECT 1 FROM llm_calls c WHERE c.session_id = s.session_id AND c.instance = s.instance
              AND s.ts_s BETWEEN c.start_s AND c.end_s + 0.05)""").fetchall()[0][0]
    prev_p = {r["call_id"]: r["prompt_tokens"] for r in rows}
    compared, off, cause_bad, not_computed, outside_band, certain, certain_off = 0, [], [], [], [], 0, []
    exact_compared, exact_off = 0, []
    beyond_prev, hit_beyond_prev = [], []
    for r in rows:
        if r["prev_call_id"] is None:
            continue
        b = r["block_size"]
        pp = prev_p.get(r["prev_call_id"])
        full_prev = (pp // b) * b if pp is not None else None
        # the engine recomputed more than the previous prompt's full blocks less what it hit: the decode-filled block
        if full_prev is not None and r["reprefill_kv"] > max(full_prev - (r["cached_tokens"] or 0), 0):
            beyond_prev.append(r["call_id"])
        if full_prev is not None and (r["cached_tokens"] or 0) > full_prev:
            hit_beyond_prev.append(r["call_id"])
        e = exact.get(r["call_id"])
        if e is not None and e["mode"] == "exact":
            exact_compared += 1
            if e["reprefill_tokens"] != r["reprefill_kv"]:
                exact_off.append({"call_id": r["call_id"], "session_id": r["session_id"], "X_exact": e["reprefill_tokens"],
                                  "X_kv": r["reprefill_kv"], "cause": e["miss_cause"]})
        if r["reprefill_tokens"] is None:
            not_computed.append({"call": r["call_id"], "session": r["session_id"], "context_reset": r["context_reset"],
                                 "reprefill_kv": r["reprefill_kv"]})
            continue
        compared += 1
        if abs(r["reprefill_tokens"] - r["reprefill_kv"]) > b:
            off.append(r)
        if not r["reprefill_low_tokens"] <= r["reprefill_kv"] <= r["reprefill_high_tokens"]:
            outside_band.append(r)
        if r["reprefill_low_tokens"] == r["reprefill_high_tokens"]:
            certain += 1
            if r["reprefill_tokens"] != r["reprefill_kv"]:
                certain_off.append(r)
        cause = r["miss_cause"]
        if cause in ("evicted_full", "evicted_partial") and r["removed_before"] == 0:
            cause_bad.append({**r, "why": "evicted cause without a BlockRemoved of the session in the window"})
        if r["reprefill_kv"] > 0 and cause not in ("evicted_full", "evicted_partial"):
            cause_bad.append({**r, "why": "blocks recomputed but no eviction cause"})

    def band(x: dict | None) -> str | None:
        if x is None or x["reprefill_tokens"] is None:
            return None
        lo, hi = x["reprefill_low_tokens"], x["reprefill_high_tokens"]
        return str(lo) if lo == hi else f"[{lo}, {hi}]"

    per_call = []
    for r in rows:
        e = exact.get(r["call_id"])
        per_call.append({
            "session": r["session_id"], "attempt": r["attempt"], "start_s": round(r["start_s"] % 1000, 2),
            "P": r["prompt_tokens"], "C": r["cached_tokens"], "P_prev": prev_p.get(r["prev_call_id"]),
            "X_kv": r["reprefill_kv"], "X_exact": e["reprefill_tokens"] if e and e["mode"] == "exact" else None,
            "cause_exact": e["miss_cause"] if e and e["mode"] == "exact" else None,
            "R_eff_est": r["reusable_tokens_eff"], "X_est": r["reprefill_tokens"], "band_est": band(r),
            "cause_est": r["miss_cause"], "evidence_est": r["cause_evidence"],
            "removed_in_window": r["removed_before"], "stored": r["blocks_stored"]})
    sum_x = sum(r["reprefill_tokens"] or 0 for r in rows)
    sum_kv = sum(r["reprefill_kv"] for r in rows if r["reprefill_tokens"] is not None)
    sum_kv_all = sum(r["reprefill_kv"] for r in rows if r["prev_call_id"] is not None)
    sum_exact = sum(e["reprefill_tokens"] or 0 for e in exact.values() if e["mode"] == "exact")
    keep = ("call_id", "session_id", "reprefill_tokens", "reprefill_low_tokens", "reprefill_high_tokens",
            "reprefill_kv", "miss_cause", "cause_evidence")
    res = {"kv_events": n_events, "block_size": rows[0]["block_size"] if rows else None,
           "block_size_source": rows[0]["block_size_source"] if rows else None,
           "calls_compared": compared, "calls_off_by_more_than_one_block": len(off),
           "calls_outside_band": len(outside_band), "calls_certain": certain, "certain_not_equal": len(certain_off),
           "cause_disagreements": len(cause_bad), "not_computed_by_agentobs": not_computed,
           "stored_events_not_in_any_call": unattributed, "sum_reprefill_agentobs": sum_x, "sum_reprefill_kv": sum_kv,
           "sum_reprefill_low": sum(r["reprefill_low_tokens"] or 0 for r in rows),
           "sum_reprefill_high": sum(r["reprefill_high_tokens"] or 0 for r in rows),
           "calls_with_block_hashes": has_hashes, "exact_calls_compared": exact_compared,
           "exact_not_equal": len(exact_off), "sum_reprefill_exact": sum_exact, "sum_reprefill_kv_all": sum_kv_all,
           "calls_recomputing_beyond_prev_prompt": len(beyond_prev), "calls_hitting_beyond_prev_prompt": len(hit_beyond_prev),
           "per_call": per_call,
           "off": [{k: r[k] for k in keep} for r in off],
           "outside_band": [{k: r[k] for k in keep} for r in outside_band],
           "certain_off": [{k: r[k] for k in keep} for r in certain_off],
           "exact_off": exact_off,
           "cause_bad": [{k: r.get(k) for k in ("call_id", "session_id", "miss_cause", "reprefill_kv",
                                                 "removed_before", "why")} for r in cause_bad]}
    res["pass"] = (compared > 0 and not off and not outside_band and not certain_off and not cause_bad
                   and unattributed == 0 and not exact_off and rows[0]["block_size_source"] == "engine_config")
    return res


def run_checks(db: str, responses: Path, config: str) -> dict:
    con = connect(db, read_only=True)
    try:
        out = {"config": config, "db": db,
               "usage": check_usage(con, load_responses(responses)),
               "join": check_join(con)}
        out["kv"] = check_kv(con)
    finally:
        con.close()
    out["fleet"] = check_fleet_hit_rate(db)
    out["pass"] = all(out[k]["pass"] for k in ("usage", "join", "fleet", "kv"))
    return out


def report(out: dict) -> None:
    u, j, f, k = out["usage"], out["join"], out["fleet"], out["kv"]
    print(f"# end-to-end checks: {out['config']} ({out['db']})")
    print(f"1 usage        {'PASS' if u['pass'] else 'FAIL'}: {u['calls_ok']} calls answered 200, "
          f"{u['calls_in_duckdb']} in llm_calls; missing {len(u['missing'])}, duplicated {len(u['duplicated'])}, "
          f"(P,C,O) different from vLLM's usage {len(u['mismatched'])}")
    for m in u["mismatched"][:10]:
        print(f"    {m}")
    print(f"2 join         {'PASS' if j['pass'] else 'FAIL'}: {j['joined']}/{j['total']} calls gateway+engine "
          f"({(j['joined_share'] or 0) * 100:.1f} %, need ≥ {JOIN_MIN * 100:.0f} %); by source {j['by_source']}")
    fr = f["fleet_hit_rate"][0] if f["fleet_hit_rate"] else {}
    print(f"3 fleet hit    {'PASS' if f['pass'] else 'FAIL'}: counters Δhits {fr.get('hit_tokens')} / Δqueries "
          f"{fr.get('query_tokens')} = {fr.get('hit_rate')} over {fr.get('scrapes')} scrapes; calls ΣC {f['sum_cached']} / "
          f"ΣP {f['sum_prompt']} = {f['span_hit_rate']}")
    print(f"4 KV events    {'PASS' if k['pass'] else 'FAIL'}: events {k['kv_events']}, B = {k['block_size']} "
          f"({k['block_size_source']}); estimate: {k['calls_compared']} calls compared, "
          f"{k['calls_off_by_more_than_one_block']} off by > 1 block, {k['calls_outside_band']} with X_kv outside "
          f"[X_low, X_high], {k['certain_not_equal']} of {k['calls_certain']} certain (X_low = X_high) with X ≠ X_kv, "
          f"{k['cause_disagreements']} cause disagreements; ΣX {k['sum_reprefill_agentobs']} "
          f"[{k['sum_reprefill_low']}, {k['sum_reprefill_high']}] vs ΣX_kv {k['sum_reprefill_kv']}; "
          f"exact (block hashes on {k['calls_with_block_hashes']} calls): {k['exact_calls_compared']} calls compared, "
          f"{k['exact_not_equal']} with X ≠ X_kv, ΣX {k['sum_reprefill_exact']} vs ΣX_kv {k['sum_reprefill_kv_all']}; "
          f"decode-filled block: {k['calls_recomputing_beyond_prev_prompt']} calls recomputed more than the previous "
          f"prompt's blocks, {k['calls_hitting_beyond_prev_prompt']} hit more; "
          f"{k['stored_events_not_in_any_call']} BlockStored outside every call; "
          f"{len(k['not_computed_by_agentobs'])} calls with R unknown in estimate mode (context reset): "
          + ", ".join(f"{x['session']} X_kv={x['reprefill_kv']}" for x in k["not_computed_by_agentobs"]))
    for x in k["off"] + k["outside_band"] + k["certain_off"] + k["exact_off"] + k["cause_bad"]:
        print(f"    {x}")
    _print("per call (re-prefill tokens: KV events X_kv, exact mode, estimate mode X and [X_low, X_high])",
           k["per_call"])
    print(f"\nRESULT {out['config']}: {'PASS' if out['pass'] else 'FAIL'}")


# ----------------------------------------------------------------------------------------------
def summarize(db: str) -> dict:
    run, close = prepare(db)
    try:
        rp = run.compute("reprefill").to_dicts()
        ttft = run.compute("turn_resume_ttft").to_dicts()
        fleet = run.compute("fleet_hit_rate").to_dicts()
        calls = run.table("m_calls")
    finally:
        close()
    con = connect(db, read_only=True)
    try:
        ev = dict(con.sql("SELECT type, count(*) FROM kv_events GROUP BY type").fetchall())
        preempt = con.sql("""SELECT max(value) - min(value) FROM metric_samples
                             WHERE metric = 'vllm:num_preemptions_total'""").fetchall()[0][0]
        evict_calls = con.sql("SELECT count(*) FROM call_reuse WHERE window_outcome = 'evicted'").fetchall()[0][0]
    finally:
        con.close()
    sum_x = sum(r["reprefill_tokens"] or 0 for r in rp)
    sum_c = int(calls["cached_tokens"].sum())
    sum_p = int(calls["prompt_tokens"].sum())
    computed = sum_p - sum_c
    findings = None
    f = subprocess.run([str(Path(sys.executable).parent / "agentobs"), "findings", "--db", db, "--format", "json"],
                       capture_output=True, text=True)
    if f.returncode == 0:
        try:
            findings = json.loads(f.stdout)
        except ValueError:
            findings = {"raw": f.stdout[:2000]}
    else:
        findings = {"error": (f.stderr or f.stdout).strip().splitlines()[-1:] or ["exit " + str(f.returncode)]}
    return {"db": db, "calls": calls.height, "sum_prompt": sum_p, "sum_cached": sum_c,
            "hit_rate": sum_c / sum_p if sum_p else None,
            "fleet_hit_rate": fleet[0]["hit_rate"] if fleet else None,
            "reprefill_tokens": sum_x, "reprefill_share_of_cache_tokens": sum_x / (sum_x + sum_c) if sum_x + sum_c else None,
            "reprefill_share_of_computed_prefill": sum_x / computed if computed else None,
            "miss_causes": {r["cause"]: r["calls"] for r in rp},
            "block_removed": ev.get("BlockRemoved", 0), "block_stored": ev.get("BlockStored", 0),
            "evicted_windows": evict_calls, "preemptions": preempt,
            "turn_resume_ttft": ttft, "findings": findings}


def compare(a_db: str, b_db: str) -> dict:
    a, b = summarize(a_db), summarize(b_db)
    keys = ("calls", "sum_prompt", "sum_cached", "hit_rate", "fleet_hit_rate", "reprefill_tokens",
            "reprefill_share_of_cache_tokens", "reprefill_share_of_computed_prefill", "block_removed", "block_stored",
            "evicted_windows", "preemptions", "miss_causes")
    _print("ample vs starved", [{"quantity": k, "ample": json.dumps(a[k]) if isinstance(a[k], dict) else a[k],
                                 "starved": json.dumps(b[k]) if isinstance(b[k], dict) else b[k]} for k in keys])
    rows = []
    for name, s in (("ample", a), ("starved", b)):
        for r in s["turn_resume_ttft"]:
            rows.append({"config": name, "gap": r["gap_bucket"], "hit_class": r["hit_class"], "calls": r["calls"],
                         "ttft_p50_s": r["ttft_p50_s"], "ttft_p90_s": r["ttft_p90_s"],
                         "miss_penalty": r.get("miss_penalty")})
    _print("turn-resume TTFT by idle gap and hit class (agentobs metrics turn_resume_ttft)", rows)
    for name, s in (("ample", a), ("starved", b)):
        fs = s["findings"]
        print(f"\n## findings ({name})")
        if isinstance(fs, list):
            if not fs:
                print("(none)")
            for x in fs:
                print(f"- {x.get('id')} [{x.get('severity')}] {x.get('title') or x.get('summary') or ''}")
        else:
            print(json.dumps(fs)[:1000])
    ok = (b["reprefill_tokens"] > a["reprefill_tokens"] and b["block_removed"] > a["block_removed"]
          and b["hit_rate"] < a["hit_rate"])
    print(f"\nRESULT compare: {'PASS' if ok else 'FAIL'} (starved: more re-prefill, more evictions, lower hit rate)")
    return {"ample": a, "starved": b, "pass": ok}


def main() -> int:
    ap = argparse.ArgumentParser(description="end-to-end checks of a real-vLLM run")
    ap.add_argument("--db")
    ap.add_argument("--responses", type=Path)
    ap.add_argument("--config", default="run")
    ap.add_argument("--compare", nargs=2, metavar=("AMPLE_DB", "STARVED_DB"))
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()
    if a.compare:
        out = compare(*a.compare)
    else:
        if not a.db or not a.responses:
            ap.error("--db and --responses are required (or --compare)")
        out = run_checks(a.db, a.responses, a.config)
        report(out)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 0 if out["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
