"""Fleet scraping cost: N targets serving realistic vLLM/SGLang /metrics at an interval, handled by
the real Scraper + Writer into DuckDB; prints CPU seconds per wall second of the collector process.

    .venv/bin/python bench/scrape_fleet.py [--targets 1000] [--interval 5] [--rounds 4]

The targets are served by a separate process (its CPU is not counted): half vLLM, half SGLang
fixture pages, each request with fresh values (every sample line's value changes between scrapes).
The warm-up (until every target was scraped once: every series parsed by prometheus_client) is
reported separately from the steady state.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentobs.collect.fleet import Target  # noqa: E402
from agentobs.collect.health import Health  # noqa: E402
from agentobs.collect.scraper import Scraper  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.store.writer import Writer  # noqa: E402

PAGES = [(ROOT / "tests/fixtures/vllm/metrics_sample.txt").read_text(),
         (ROOT / "tests/fixtures/sglang/metrics_sample.txt").read_text()]


def _variants(text: str, n: int = 4) -> list[bytes]:
    """n copies of a page whose sample values differ (value + k)."""
    out = []
    for k in range(n):
        lines = []
        for ln in text.split("\n"):
            if ln and not ln.startswith("#"):
                series, _, v = ln.rpartition(" ")
                try:
                    ln = f"{series} {float(v) + k}"
                except ValueError:
                    pass
            lines.append(ln)
        out.append("\n".join(lines).encode())
    return out


def _serve(port_q, stop):
    variants = [_variants(p) for p in PAGES]
    counter = [0]

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            i = int(self.path.split("/")[2])
            counter[0] += 1
            body = variants[i % 2][counter[0] % 4]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    httpd.request_queue_size = 1024
    port_q.put(httpd.server_address[1])
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=4, help="steady-state rounds measured after the first")
    ap.add_argument("--concurrency", type=int, default=16)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    q, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(q, stop), daemon=True)
    server.start()
    port = q.get()
    targets = [Target(f"http://127.0.0.1:{port}/t/{i}/metrics", f"engine-{i}:8000",
                      "vllm" if i % 2 == 0 else "sglang", interval_s=a.interval, timeout_s=5, server_info=False)
               for i in range(a.targets)]
    with tempfile.TemporaryDirectory() as d:
        con = connect(Path(d) / "fleet.duckdb")
        health = Health()
        w = Writer(con, batch_rows=200_000, flush_s=0.05, on_commit=health.on_commit)
        sc = Scraper(targets, w, health, jitter=0.1, concurrency=a.concurrency)
        halt = threading.Event()
        t = threading.Thread(target=sc.run, args=(halt,))
        c0, w0 = time.process_time(), time.perf_counter()
        t.start()
        deadline = time.monotonic() + 300  # warm-up: until every target was scraped once (series learnt)
        while health.value("agentobs_scrapes_total", {"outcome": "ok"}) < a.targets and time.monotonic() < deadline:
            time.sleep(0.2)
        d0 = sum(health.value("agentobs_scrape_drops_total", {"reason": r}) for r in ("overrun", "behind"))
        c1, w1 = time.process_time(), time.perf_counter()
        ok1 = health.value("agentobs_scrapes_total", {"outcome": "ok"})
        time.sleep(a.interval * a.rounds)
        c2, w2 = time.process_time(), time.perf_counter()
        ok2 = health.value("agentobs_scrapes_total", {"outcome": "ok"})
        halt.set()
        t.join()
        w.close()
        (samples,) = con.execute("SELECT count(*) FROM metric_samples").fetchone()
        errs = health.value("agentobs_scrapes_total", {"outcome": "error"})
        drops = sum(health.value("agentobs_scrape_drops_total", {"reason": r}) for r in ("overrun", "behind")) - d0
        commits = health.value("agentobs_writer_commit_seconds_count")
        commit_s = health.value("agentobs_writer_commit_seconds_sum")
        con.close()
    stop.set()
    server.join(5)
    steady = (c2 - c1) / (w2 - w1)
    print(f"targets: {a.targets} (half vLLM 463 samples, half SGLang 527 samples), interval {a.interval:g} s, "
          f"concurrency {a.concurrency}")
    print(f"warm-up (every series parsed once by prometheus_client): {ok1:,.0f} scrapes in {w1 - w0:.1f} s, "
          f"{(c1 - c0) / (w1 - w0):.2f} CPU s per wall s")
    print(f"steady state: {ok2 - ok1:,.0f} scrapes in {w2 - w1:.1f} s = {(ok2 - ok1) / (w2 - w1):,.0f} scrapes/s "
          f"(target {a.targets / a.interval:,.0f}/s)")
    print(f"steady state CPU: {steady:.2f} CPU s per wall s  ({(c2 - c1) / max(1, ok2 - ok1) * 1000:.2f} ms "
          f"per scrape incl. fetch, parse, write)")
    print(f"errors {errs:,.0f}, steady-state drops {drops:,.0f}, samples stored {samples:,}, "
          f"commits {commits:,.0f} (mean {commit_s / max(1, commits) * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
