"""OTLP/HTTP receiver under abusive load: the server's peak RSS and thread count (read from /proc).

    .venv/bin/python bench/receiver_limits.py [--scenario all|unauth|big|stalled] [--max-body-mb 64]

Each scenario starts a fresh receiver process (OtlpHttpServer + Ingest on a temporary store: the spool and a
loader decoding in the same process, or, on a checkout before issue 21, the in-request Writer; the settings'
defaults but ``--max-body-mb``; a bearer token is set) and samples its VmRSS every 20 ms until the
requests are answered and 0.3 s more (``big`` and ``many``: until the loader has stored them, 3 s):

* ``unauth``: 12 concurrent POSTs of 60 MiB with a wrong bearer token (the issue's 233 -> 715 MB case);
* ``big``: one authorised protobuf batch of ~46 MiB (bench/_spans.py spans);
* ``many``: 8 concurrent authorised batches of ~12 MiB (15,000 spans each);
* ``stalled``: 350 connections that connect and never send; threads held 2 s later.

Run it with ``PYTHONPATH=<checkout>`` to measure another version of the receiver (the script uses only the
constructor arguments every version has). Prints one line per scenario:
``scenario=<name> rss_start_mb=<a> rss_peak_mb=<b> threads_peak=<t> answers=<status counts>``.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

TOKEN = "bench-token"


def serve(max_body_mb: int) -> None:
    import tempfile

    from agentobs.collect.otlp_http import OtlpHttpServer
    from agentobs.collect.receiver import Ingest
    from agentobs.config import load_settings
    from agentobs.model import connect

    tmp = tempfile.mkdtemp()
    con = connect(os.path.join(tmp, "b.duckdb"))
    settings = load_settings(env={})
    try:  # the spool + loader receiver (issue 21); the loader decodes in this process, so its memory counts
        from agentobs.collect.loader import Loader
        from agentobs.collect.spool import Spool

        spool = Spool(Path(tmp) / "spool")
        loader = Loader(spool, con, settings, processes=0).start()
        ing, close = Ingest(spool, settings), lambda: (spool.close(), loader.stop())
    except ImportError:  # the receiver before it: decode and commit in the request
        from agentobs.store.writer import Writer

        w = Writer(con, flush_s=0.05)
        ing, close = Ingest(w, settings), w.close
    hs = OtlpHttpServer(ing, "127.0.0.1", 0, token=TOKEN, max_body=max_body_mb * 1024 * 1024).start()
    print(hs.port, flush=True)
    sys.stdin.read()  # until the parent closes it
    hs.stop()
    close()


class Sampler:
    def __init__(self, pid: int):
        self.pid = pid
        self.peak_rss, self.peak_threads, self.start_rss = 0, 0, self._read()[0]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _read(self) -> tuple[int, int]:
        rss = threads = 0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        return rss, threads

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            rss, th = self._read()
            self.peak_rss, self.peak_threads = max(self.peak_rss, rss), max(self.peak_threads, th)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def _post(port: int, body: bytes, token: str, answers: collections.Counter) -> None:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf",
                                                             "Authorization": f"Bearer {token}"})
        r = c.getresponse()
        r.read()
        answers[r.status] += 1
        c.close()
    except OSError as e:  # the server closed the connection on a body it would not read
        answers[type(e).__name__] += 1


def scenario(name: str, max_body_mb: int) -> None:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--max-body-mb", str(max_body_mb)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    time.sleep(0.5)
    s = Sampler(proc.pid)
    answers: collections.Counter = collections.Counter()
    try:
        if name == "unauth":
            body = b"\0" * (60 * 1024 * 1024)
            ts = [threading.Thread(target=_post, args=(port, body, "wrong", answers)) for _ in range(12)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        elif name == "big":
            sys.path.insert(0, str(Path(__file__).parent))
            from _spans import payload

            body = payload(46_000, 1)  # ~1 kB a span
            print(f"# big batch: {len(body) / 2**20:.1f} MiB, 46,000 spans", flush=True)
            _post(port, body, TOKEN, answers)
        elif name == "many":
            sys.path.insert(0, str(Path(__file__).parent))
            from _spans import payload

            bodies = [payload(15_000, seed) for seed in range(8)]
            print(f"# many: 8 x {len(bodies[0]) / 2**20:.1f} MiB", flush=True)
            ts = [threading.Thread(target=_post, args=(port, b, TOKEN, answers)) for b in bodies]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        elif name == "stalled":
            socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(350)]
            time.sleep(2.0)
            answers["held_open"] = len(socks)
            for x in socks:
                x.close()
        time.sleep(3.0 if name in ("big", "many") else 0.3)
    finally:
        s.stop()
        proc.stdin.close()
        proc.wait(30)
    print(f"scenario={name} rss_start_mb={s.start_rss} rss_peak_mb={s.peak_rss} threads_peak={s.peak_threads} "
          f"answers={dict(answers)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="all", choices=["all", "unauth", "big", "many", "stalled"])
    ap.add_argument("--max-body-mb", type=int, default=64)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(a.max_body_mb)
    for name in (["unauth", "big", "many", "stalled"] if a.scenario == "all" else [a.scenario]):
        scenario(name, a.max_body_mb)


if __name__ == "__main__":
    main()
