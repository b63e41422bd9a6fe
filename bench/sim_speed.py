"""Simulator speed: simulated calls per minute of wall time, measured in one run.

    .venv/bin/python bench/sim_speed.py [--minutes-of-traffic 60] [--baseline]

1. synthetic mix (coding/support/research/batch-eval), 8 vLLM replicas, block size 16, no output
   (the simulation itself: caches, batching, routing);
2. the same with the full bundle written (OTLP, Prometheus every 5 s, KV events, ground truth);
3. the Claude Code replay (9 sessions shipped, block size 64, 2 replicas).
Prints calls, wall seconds, calls/min, and the ratio of each figure to the target (100k calls/min).
``--baseline`` also runs 1. with the per-block reference cache (cache_ref.py, the first
implementation) in the same process and prints the speed-up of the range cache over it.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import replace

from agentobs.sim.run import simulate
from agentobs.sim.scenarios import scenario

TARGET = 100_000


def one(label: str, sc, out=None, cache_impl: str = "ranges") -> float:
    t = time.perf_counter()
    fl = simulate(sc, seed=1, out=out, cache_impl=cache_impl)
    wall = time.perf_counter() - t
    rate = fl.calls_done / wall * 60
    print(f"{label:<48} {fl.calls_done:>8,} calls {wall:>8.1f} s {rate:>10,.0f} calls/min  ({rate / TARGET:.2f}× target)",
          flush=True)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes-of-traffic", type=float, default=60.0)
    ap.add_argument("--baseline", action="store_true", help="also time the per-block reference cache")
    a = ap.parse_args()
    sc = replace(scenario("bench"), duration_s=a.minutes_of_traffic * 60, snapshot_s=0.0)
    fast = one("synthetic mix, block 16, simulation only", sc)
    if a.baseline:
        slow = one("same, per-block reference cache (baseline)", sc, cache_impl="blocks")
        print(f"{'range cache / per-block cache':<48} {fast / slow:>37.1f}×")
    tmp = tempfile.mkdtemp()
    try:
        one("synthetic mix, block 16, + bundle written", replace(sc, snapshot_s=5.0), out=f"{tmp}/b")
    finally:
        shutil.rmtree(tmp)
    one("Claude Code replay (9 sessions), block 64", replace(scenario("claude-code"), snapshot_s=0.0))


if __name__ == "__main__":
    main()
