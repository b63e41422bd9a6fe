"""Estimate mode (and exact mode) against the simulator's ground truth: the per-cause table of docs/metrics.md,
"Miss causes from evidence".

Each replay is simulated twice with the same seed — once as most deployments see it (KV events with session ids,
no block hashes: estimate mode), once with ``agentobs.prompt.block_hashes`` on the spans (exact mode) — imported,
and ``call_reuse`` compared with ``truth/calls.parquet`` (agentobs.sim.validate). The "no KV events" replay is what
SGLang (no session ids in its KV events) and deployments without a KV-event capture get: scrapes every 5 s and the
spans, so only the instance evidence (docs/metrics.md) decides a shortfall. The "restarts" replays restart each
replica's engine twice (docs/metrics.md, "Restarts"): with KV events and vLLM's process start time on /metrics
(one API server), and without KV events nor the start time (a counter reset between two scrapes says it).

    python bench/causes_vs_truth.py                 # every replay below
    python bench/causes_vs_truth.py --only edits    # one
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from agentobs.collect.bundle import import_bundle
from agentobs.config import load_settings
from agentobs.model import connect
from agentobs.sim.run import simulate
from agentobs.sim.scenarios import scenario, trace_scenario
from agentobs.sim.validate import compare
from agentobs.sim.workload import dataset_dir
from agentobs.store.writer import Writer


def replays() -> dict:
    traces = sorted((dataset_dir() / "claude_code").glob("trace_*.json*"))
    return {
        "edits": scenario("edits"),
        "edits-unbounded": scenario("edits-unbounded"),
        "traces (200k-token pools)": replace(trace_scenario(traces, replicas=2, kv_capacity_tokens=200_000),
                                             snapshot_s=0.0),
        "traces (unbounded)": replace(trace_scenario(traces, replicas=2, kv_capacity_tokens=50_000_000),
                                      snapshot_s=0.0),
        "edits, no KV events (scrapes every 5 s)": replace(scenario("edits"), snapshot_s=5.0),
        "edits, restarts (KV events, process start time)": replace(scenario("edits"), snapshot_s=5.0),
        "edits, restarts, no KV events (counter resets, scrapes every 5 s)": replace(scenario("edits"), snapshot_s=5.0),
    }


NO_KV = "no KV events"
# each replica of the edits scenario restarts twice, while it serves (simulated seconds)
RESTARTS = (("10.5.0.1:8000", 600.0), ("10.5.0.2:8000", 900.0), ("10.5.0.1:8000", 1200.0),
            ("10.5.0.2:8000", 1500.0))


def run(sc, tmp: Path, block_hashes: bool, seed: int, kv_events: bool = True, restarts=(),
        process_metrics: bool = False):
    out = tmp / ("exact" if block_hashes else "estimate")
    simulate(sc, seed=seed, out=out, block_hashes=block_hashes, kv_events=kv_events, restarts=restarts,
             process_metrics=process_metrics)
    con = connect(tmp / f"{out.name}.duckdb")
    with Writer(con) as w:
        import_bundle(out, w, load_settings(None))
    c = compare(con, out / "truth" / "calls.parquet")
    con.close()
    return c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    for name, sc in replays().items():
        if a.only and a.only not in name:
            continue
        t0 = time.perf_counter()
        kw = {"kv_events": NO_KV not in name, "restarts": RESTARTS if "restarts" in name else (),
              "process_metrics": "process start" in name}
        with tempfile.TemporaryDirectory() as d:
            est = run(sc, Path(d), False, a.seed, **kw)
            ex = run(sc, Path(d), True, a.seed, **kw)
        print(f"\n## {name}: {est.calls:,} calls, {est.sessions} sessions ({time.perf_counter() - t0:.0f} s)")
        print("| cause | truth | estimate | exact |")
        print("|---|---:|---:|---:|")
        keys = sorted(set(est.truth_by_cause) | set(est.model_by_cause) | set(ex.model_by_cause))
        for k in keys:
            print(f"| {k} | {est.truth_by_cause.get(k, 0):,} | {est.model_by_cause.get(k, 0):,} | "
                  f"{ex.model_by_cause.get(k, 0):,} |")
        print(f"| band [X_low, X_high] (estimate) | {sum(est.truth_by_cause.values()):,} | "
              f"[{est.band_low:,}, {est.band_high:,}] | [{ex.band_low:,}, {ex.band_high:,}] |")
        print(f"| true hits flagged as evictions | 0 | {est.hits_flagged_evicted} ({est.hits_flagged_share:.2%}) | "
              f"{ex.hits_flagged_evicted} |")
        print(f"| calls called evicted | | {est.evicted_calls_model} | {ex.evicted_calls_model} |")
        print(f"| sessions whose truth is outside the band | | {len(est.outside_band)} of {est.sessions} | "
              f"{len(ex.outside_band)} |")
        print(f"| idle rent wasted (M token-s) | {est.rent_wasted_truth / 1e6:,.2f} | "
              f"{est.rent_wasted_model / 1e6:,.2f} | {ex.rent_wasted_model / 1e6:,.2f} |")
        print(f"| idle rent paid (M token-s) | {est.rent_paid_truth / 1e6:,.2f} | {est.rent_paid_model / 1e6:,.2f} | "
              f"{ex.rent_paid_model / 1e6:,.2f} |")


if __name__ == "__main__":
    main()
