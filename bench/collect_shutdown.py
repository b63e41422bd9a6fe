"""How long `agentobs collect` takes to stop on SIGTERM, on a large store, while it is busy.

    .venv/bin/python bench/collect_shutdown.py [--rows 1000000] [--dir /tmp/x]

Builds a store of ``--rows`` synthetic spans (about 1 KB of attributes each, so 1M rows make a store
of about 1 GB; built once, kept in ``--dir`` for the next run), starts `agentobs collect` on it with a
read snapshot every second (so a full-copy snapshot is running when the signal comes), posts exports
from 4 client connections while it runs, sends SIGTERM and prints the seconds until the process exited.
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _spans import payload  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(db: Path, rows: int) -> None:
    sys.path.insert(0, str(ROOT))
    from agentobs.model import connect

    con = connect(db)
    have = con.execute("SELECT count(*) FROM spans").fetchone()[0]
    if have < rows:
        con.execute(f"""
        INSERT INTO spans_part (trace_id, span_id, name, kind, start_ns, end_ns, status_code, service_name, resource,
                           attributes, role, op, session_id, model, instance, input_tokens, output_tokens)
        SELECT md5(i::VARCHAR), substr(md5('s' || i), 1, 16), 'chat m', 3, 1791969600000000000 + i * 1000000,
               1791969600000000000 + i * 1000000 + 500000000, 0, 'gw', '{{}}',
               '{{"m":"' || repeat(md5(i::VARCHAR) || md5((i + 1)::VARCHAR), 15) || '"}}', 'gateway', 'chat',
               'sess-' || (i // 20), 'm', '10.0.0.1:8000', 1000 + i % 5000, 100
        FROM range({have}, {rows}) t(i)""")
        con.execute("CHECKPOINT")
    con.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    d = Path(a.dir or tempfile.mkdtemp(prefix="agentobs-shutdown-"))
    d.mkdir(parents=True, exist_ok=True)
    db = d / "big.duckdb"
    t0 = time.perf_counter()
    build(db, a.rows)
    print(f"store {db}: {a.rows:,} spans, {db.stat().st_size / 2**30:.2f} GiB (built in {time.perf_counter() - t0:.0f} s)")
    http_port, grpc_port, health_port = _free_port(), _free_port(), _free_port()
    fleet = d / "fleet.yaml"
    fleet.write_text(f'receiver: {{grpc: "127.0.0.1:{grpc_port}", http: "127.0.0.1:{http_port}"}}\n'
                     f'health: "127.0.0.1:{health_port}"\nsnapshot: {{every_s: 1}}\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = open(d / "collect.log", "w")
    boot = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); "
            "from agentobs.cli import main; main(sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-c", boot, "collect", "--fleet", str(fleet), "--db", str(db)],
                            cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=log)
    while True:
        try:
            socket.create_connection(("127.0.0.1", http_port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None, "collect exited"
            time.sleep(0.1)
    stop = threading.Event()
    acked = [0]

    def client(k):
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
        seed = k
        try:
            while not stop.is_set():
                conn.request("POST", "/v1/traces", body=payload(512, 10**6 + seed),
                             headers={"Content-Type": "application/x-protobuf"})
                r = conn.getresponse()
                r.read()
                acked[0] += r.status == 200
                seed += 4
        except (OSError, http.client.HTTPException):
            pass

    ts = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    time.sleep(4)  # the first snapshot (a full copy of the store) has started
    snaps = list(d.glob("big.read.duckdb.tmp*"))
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(120)
    dt = time.perf_counter() - t0
    stop.set()
    for t in ts:
        t.join()
    log.close()
    for line in (d / "collect.log").read_text().splitlines():
        if line.startswith("stop: "):
            print("  " + line)
    print(f"SIGTERM → exit {rc} in {dt:.2f} s (snapshot copy in progress at the signal: {bool(snaps)}; "
          f"{acked[0]} exports of 512 spans acknowledged meanwhile); load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
