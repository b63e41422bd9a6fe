#!/usr/bin/env python3
"""``agentobs loadgen`` on a real vLLM (CPU build): a bundled coding-agent trace, prefix caching on vs off and an
ample vs a starved KV pool, each run an ordinary agentobs dataset, then ``agentobs loadgen --compare``.

    .venv/bin/python scripts/vllm/loadgen_e2e.py --out /tmp/agentobs-loadgen           # on, off, starved
    .venv/bin/python scripts/vllm/loadgen_e2e.py --out DIR --configs on,off --skip-setup

Per configuration: setup.sh (idempotent), ``agentobs collect`` (OTLP receivers, a 1 s scrape of vLLM's /metrics,
the KV-event subscriber) on free loopback ports, vLLM (serve.sh) exporting its spans to the collector, then
``agentobs loadgen --target vLLM --otlp collector`` with the kv-cache-tester traces scaled down to what a tiny CPU
model serves in a minute (``--token-scale``, ``--time-scale``, ``--max-gap``, ``--max-turns``); it waits until every
span is committed and stops everything (process groups). Checks (exit 1 when one fails):

1. per call, the cached tokens in the store (``llm_calls.cached_tokens``, by response id) = vLLM's
   ``usage.prompt_tokens_details.cached_tokens`` as the load generator received it (``--responses``), and the
   prompt tokens likewise;
2. the achieved prompt sizes (vLLM's ``usage.prompt_tokens``) within 1 % of the scaled trace's, every call;
3. the comparison shows the expected direction: prefix caching on vs off — higher hit rate, fewer computed
   prompt tokens per task; ample vs starved pool — higher hit rate, less re-prefill.

Files: OUT/<config>/{agentobs.duckdb, responses.jsonl, fleet.yaml, *.log, server_cmd.txt, loadgen.log},
OUT/compare_<a>_vs_<b>.{txt,json}, OUT/summary.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from e2e import AGENTOBS, REPO, Procs, free_port, health_value, http_ok, log, wait_for, write_fleet  # noqa: E402

# the agentobs of this checkout, for the commands started here too (the venv's may be another checkout's)
os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
sys.path.insert(0, str(REPO))

BLOCK_SIZE = 128
MAX_MODEL_LEN = 4096
CONFIGS = {
    # blocks of 128 tokens; ample: every session's context fits at once; starved: about one session's
    "on": {"num_blocks": 256, "extra": ""},
    "off": {"num_blocks": 256, "extra": "--no-enable-prefix-caching"},
    "starved": {"num_blocks": 40, "extra": ""},
}
COMPARE = (("off", "on"), ("starved", "on"))
LOADGEN_ARGS = ["--workload", "claude-code", "--sessions", "4", "--concurrency", "4", "--max-turns", "8",
                "--token-scale", "0.03", "--time-scale", "0.05", "--max-gap", "8s", "--max-output", "8", "--seed", "7"]


def run_config(name: str, out: Path, args) -> dict:
    cfg = CONFIGS[name]
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    db = d / "agentobs.duckdb"
    grpc, http, health, vllm_port = free_port(), free_port(), free_port(), free_port()
    kv_ep = f"ipc:///tmp/agentobs-lg-{int(time.time())}-{name}.kv"
    write_fleet(d / "fleet.yaml", grpc, http, health, vllm_port, kv_ep)
    health_url = f"http://127.0.0.1:{health}/metrics"
    procs = Procs()
    timings: dict[str, float] = {}
    try:
        col = procs.start("collect", [AGENTOBS, "collect", "--fleet", str(d / "fleet.yaml"), "--db", str(db)],
                          d / "collect.log")
        wait_for(lambda: http_ok(health_url), 60, "agentobs collect health", col)
        env = {"VLLM_PORT": str(vllm_port), "VLLM_NUM_BLOCKS": str(cfg["num_blocks"]),
               "VLLM_BLOCK_SIZE": str(BLOCK_SIZE), "VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
               "VLLM_OTLP_ENDPOINT": f"http://127.0.0.1:{grpc}", "VLLM_OTLP_PROTOCOL": "grpc",
               "VLLM_KV_EVENTS_ENDPOINT": kv_ep, "VLLM_CMD_OUT": str(d / "server_cmd.txt"),
               "VLLM_EXTRA_ARGS": cfg["extra"]}
        t0 = time.time()
        vllm = procs.start("vllm", ["bash", str(HERE / "serve.sh")], d / "vllm.log", env)
        wait_for(lambda: http_ok(f"http://127.0.0.1:{vllm_port}/health"), args.vllm_timeout, "vLLM /health", vllm, 1)
        timings["vllm_start_s"] = round(time.time() - t0, 1)
        log(f"vLLM healthy after {timings['vllm_start_s']} s")
        scrapes0 = health_value(health_url, "agentobs_scrapes_total")
        wait_for(lambda: health_value(health_url, "agentobs_scrapes_total") >= scrapes0 + 2, 30, "first scrapes")
        t1 = time.time()
        lg = subprocess.run([AGENTOBS, "loadgen", "--target", f"http://127.0.0.1:{vllm_port}", "--otlp",
                             f"http://127.0.0.1:{http}", "--responses", str(d / "responses.jsonl"), *LOADGEN_ARGS,
                             *args.loadgen_args],
                            stdout=open(d / "loadgen.log", "w"), stderr=subprocess.STDOUT, cwd=REPO, timeout=900)
        timings["loadgen_s"] = round(time.time() - t1, 1)
        if lg.returncode != 0:
            raise RuntimeError(f"loadgen exited with {lg.returncode} (see {d / 'loadgen.log'})")
        calls = [json.loads(x) for x in (d / "responses.jsonl").read_text().splitlines() if x.strip()]
        log(f"loadgen: {len(calls)} calls in {timings['loadgen_s']} s")
        n_sessions = len({c["session_id"] for c in calls})
        n_tools = sum(1 for _ in calls) - n_sessions  # at most one tool span before each later call
        expect = 2 * len(calls) + n_sessions  # chat + engine span per call, one agent span per session
        last, stable_since = -1.0, time.time()

        def settled() -> bool:
            nonlocal last, stable_since
            v = health_value(health_url, "agentobs_otlp_spans_received_total")
            if v != last:
                last, stable_since = v, time.time()
            return v >= expect and time.time() - stable_since >= 6  # engine spans: BatchSpanProcessor, 5 s

        timings["span_wait_s"] = round(wait_for(settled, 90, f"{expect}+ spans committed", every=0.5), 1)
        log(f"spans received: {last:.0f} (≥ {expect} expected, + up to {n_tools} tool spans)")
        scrapes1 = health_value(health_url, "agentobs_scrapes_total")
        wait_for(lambda: health_value(health_url, "agentobs_scrapes_total") >= scrapes1 + 2, 30, "final scrapes")
    finally:
        procs.stop_all()
        for p in Path("/tmp").glob(f"agentobs-lg-*-{name}.kv"):
            p.unlink(missing_ok=True)
    (d / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    return {"config": name, **timings, **check_run(db, d / "responses.jsonl")}


def check_run(db: Path, responses: Path) -> dict:
    """Checks 1 and 2 of one run."""
    from agentobs.model import connect

    recs = [json.loads(x) for x in responses.read_text().splitlines() if x.strip()]
    ok_recs = [r for r in recs if r["error"] is None]
    con = connect(db, read_only=True)
    try:
        rows = con.sql("SELECT response_id, prompt_tokens, cached_tokens, source FROM llm_calls").fetchall()
    finally:
        con.close()
    by_id: dict[str, list[tuple]] = {}
    for r in rows:
        by_id.setdefault(r[0], []).append(r)
    mismatched, missing = [], []
    for r in ok_recs:
        got = by_id.get(r["response_id"])
        if not got:
            missing.append(r["request_id"])
            continue
        if len(got) != 1 or (got[0][1], got[0][2]) != (r["prompt_tokens"], r["cached_tokens"]):
            mismatched.append({"request_id": r["request_id"], "usage": [r["prompt_tokens"], r["cached_tokens"]],
                               "store": [[g[1], g[2]] for g in got]})
    rel = [abs(r["prompt_tokens"] - r["target_prompt_tokens"]) / r["target_prompt_tokens"] for r in ok_recs]
    joined = sum(1 for r in rows if r[3] == "gateway+engine")
    res = {"calls": len(recs), "ok_calls": len(ok_recs), "store_calls": len(rows), "joined_with_engine": joined,
           "usage_missing": missing, "usage_mismatched": mismatched,
           "cached_tokens_sum_usage": sum(r["cached_tokens"] or 0 for r in ok_recs),
           "size_exact": sum(1 for x in rel if x == 0), "size_within_1pct": sum(1 for x in rel if x <= 0.01),
           "size_max_rel_error": max(rel) if rel else None}
    res["ok"] = (not missing and not mismatched and len(ok_recs) == len(recs) > 0
                 and res["size_within_1pct"] == len(ok_recs))
    log(f"check: {json.dumps(res)}")
    return res


def compare_runs(out: Path, a: str, b: str) -> dict:
    from agentobs.loadgen.compare import compare, display_table
    from agentobs.output import render

    c = compare(out / a / "agentobs.duckdb", out / b / "agentobs.duckdb", reps=200, seed=0)
    import io

    from rich.console import Console

    buf = io.StringIO()
    render(display_table(c), "table", title=f"A = {a}, B = {b} ({'paired' if c.paired else 'independent'})",
           console=Console(file=buf, width=140))
    (out / f"compare_{a}_vs_{b}.txt").write_text(buf.getvalue())
    rows = {r.quantity: r.as_dict() for r in c.rows}
    (out / f"compare_{a}_vs_{b}.json").write_text(json.dumps(rows, indent=2) + "\n")
    hit = rows["session hit rate ΣC/ΣP"]
    comp = rows["computed prompt tokens per task"]
    rep = rows["re-prefill share of computed prefill"]
    if (a, b) == ("off", "on"):
        ok = hit["b"] > hit["a"] and comp["b"] < comp["a"]
        what = "prefix caching on: higher hit rate, fewer computed prompt tokens per task"
    else:
        ok = hit["b"] > hit["a"] and (rep["b"] or 0) < (rep["a"] or 0)
        what = "ample pool: higher hit rate, lower re-prefill share"
    log(f"compare {a} → {b}: {'PASS' if ok else 'FAIL'} ({what})")
    return {"a": a, "b": b, "ok": ok, "paired": c.paired, "expected": what}


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="on,off,starved")
    ap.add_argument("--skip-setup", action="store_true")
    ap.add_argument("--vllm-timeout", type=float, default=900)
    ap.add_argument("loadgen_args", nargs="*", help="extra agentobs loadgen arguments (after --)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    for n in names:
        if n not in CONFIGS:
            raise SystemExit(f"unknown config {n!r} (known: {', '.join(CONFIGS)})")
    t0 = time.time()
    if not args.skip_setup:
        subprocess.run(["bash", str(HERE / "setup.sh")], check=True)
    results = []
    for n in names:
        log(f"=== {n} ===")
        try:
            results.append(run_config(n, out, args))
        except Exception as e:  # noqa: BLE001 - report and go on with the next configuration
            log(f"{n} FAILED: {e}")
            results.append({"config": n, "ok": False, "error": str(e)})
    compares = [compare_runs(out, a, b) for a, b in COMPARE if a in names and b in names
                and all(r["ok"] for r in results if r["config"] in (a, b))]
    ok = all(r["ok"] for r in results) and all(c["ok"] for c in compares)
    summary = {"ok": ok, "total_s": round(time.time() - t0, 1), "loadgen_args": LOADGEN_ARGS + args.loadgen_args,
               "configs": results, "compare": compares}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    for a, b in COMPARE:
        f = out / f"compare_{a}_vs_{b}.txt"
        if f.exists():
            print(f.read_text())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
