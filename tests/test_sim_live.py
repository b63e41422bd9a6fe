"""Live mode: simulated replicas on real loopback sockets, spans POSTed as OTLP/JSON in scaled time."""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agentobs.collect.otlp import decode_json
from agentobs.collect.prom import parse_text
from agentobs.collect.serverinfo import server_info_rows
from agentobs.config import load_settings
from agentobs.sim.live import LiveFleet


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self):  # noqa: N802
        n = int(self.headers["Content-Length"])
        _Receiver.bodies.append(self.rfile.read(n))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a):
        pass


def test_live_serves_metrics_server_info_and_exports_spans(tmp_path):
    rx = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=rx.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()  # shutdown waits a poll
    live = LiveFleet("quick", seed=3, speed=400.0, endpoint=f"http://127.0.0.1:{rx.server_address[1]}",
                     workdir=tmp_path)
    live.start_servers()
    try:
        live.run(max_wall_s=1.5)   # 1.5 s of wall time = up to 600 simulated seconds
        vllm, sglang = live.fleet.instances
        text = urllib.request.urlopen(f"http://{vllm.spec.name}/metrics", timeout=5).read().decode()
        scrape = parse_text(text, vllm.spec.name, 0)
        assert scrape.engine == "vllm" and scrape.config.num_rows > 0  # vllm:cache_config_info
        info = json.loads(urllib.request.urlopen(f"http://{sglang.spec.name}/server_info", timeout=5).read())
        rows = server_info_rows(info, sglang.spec.name, 0)
        assert dict(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=False))["port"] == \
            sglang.spec.name.rsplit(":", 1)[1]
        assert "targets" in live.fleet_yaml() and vllm.spec.name in live.fleet_yaml()
    finally:
        live.stop()
        rx.shutdown()
    live.sink.close(live.fleet)
    assert live.sink.sent > 0 and live.sink.failed == 0
    names = set()
    for b in _Receiver.bodies:
        dec = decode_json(b, load_settings(None), "http", "test")
        assert dec.rejected == 0
        names.update(dec.columns["name"])
    assert any(n.startswith("chat ") for n in names) and "llm_request" in names
