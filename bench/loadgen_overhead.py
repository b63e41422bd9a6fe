"""Load-generator overhead: calls per second one core drives against a stub endpoint.

    .venv/bin/python bench/loadgen_overhead.py [--calls 20000] [--concurrency 64]

The stub engine (agentobs.loadgen.stub, its own process, requests not kept) answers at once; the load generator
runs in this process on one event loop with the synthetic coding mix scaled to small prompts (token scale 0.01,
~50-token prompts, 1 output token), no gaps. For each mode it prints calls, wall seconds, calls/s of wall time
and calls per CPU-second of this process (its event loop plus the span exporter's thread: what one core
drives; on a shared 2-core machine the wall rate also waits for the stub's process). Modes: non-streamed and
streamed, each with the spans exported over OTLP/HTTP (to the stub, which acknowledges and drops them), and
streamed with tracing off (the HTTP client and prompt synthesis alone). Target: ≥ 2,000 calls per CPU-second.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request

from agentobs.loadgen.runner import Options, preflight, run
from agentobs.loadgen.tracing import Tracing
from agentobs.loadgen.workloads import load_plan

TARGET = 2000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(label: str, url: str, calls: int, concurrency: int, stream: bool, otlp: str | None) -> float:
    # coding sessions are 10-30 calls: enough sessions for the calls asked
    plan = load_plan("synthetic", sessions=max(1, calls // 20), seed=1, mix="coding=1")
    opts = Options(target=url, time_scale=0.0, token_scale=0.01, max_output=1, concurrency=concurrency,
                   stream=stream, progress_s=3600)
    pf = preflight(opts, plan)
    tracing = Tracing(otlp=otlp)
    c0, t0 = time.process_time(), time.perf_counter()
    r = run(opts, plan, pf, tracing, install_signals=False)
    tracing.close()  # the last spans exported: part of the cost
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = r.stats.calls
    per_cpu = n / cpu
    print(f"{label:<40} {n:>7,} calls {r.stats.errors:>3} errors {wall:>7.1f} s wall {n / wall:>8,.0f} calls/s  "
          f"{cpu:>6.1f} s CPU {per_cpu:>8,.0f} calls/CPU-s ({per_cpu / TARGET:.2f}× target)", flush=True)
    return per_cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    a = ap.parse_args()
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-m", "agentobs.loadgen.stub", "--port", str(port), "--no-record"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        print(f"stub engine pid {stub.pid} on {url}; {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
        one("non-streamed, spans → OTLP/HTTP", url, a.calls, a.concurrency, False, url)
        one("streamed, spans → OTLP/HTTP", url, a.calls, a.concurrency, True, url)
        one("streamed, tracing off", url, a.calls, a.concurrency, True, None)
    finally:
        stub.terminate()
        stub.wait(10)


if __name__ == "__main__":
    main()
