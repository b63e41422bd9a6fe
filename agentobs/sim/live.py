"""``agentobs demo --live``: simulated engines on real sockets, in scaled real time.

Each simulated replica serves ``GET /metrics`` (Prometheus text, prometheus_client's exposition)
and, for SGLang, ``GET /server_info`` on its own loopback HTTP server; the spans (gateway, agent,
engine) are POSTed as OTLP/JSON to an OTLP/HTTP endpoint (``agentobs collect``'s receiver,
``/v1/traces``). Simulated time runs ``speed`` times faster than the wall clock. A fleet file for
``agentobs collect --fleet`` is written so the scraper finds the replicas.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from . import promexp
from .emit import BundleSink
from .fleet import Fleet, FleetSpec
from .run import build_workload
from .scenarios import scenario
from .workload import IdAlloc


class _Handler(BaseHTTPRequestHandler):
    server_version = "agentobs-sim"

    def do_GET(self):  # noqa: N802 - http.server API
        live: LiveFleet = self.server.live
        inst = live.by_port.get(self.server.server_address[1])
        if inst is None:
            self.send_error(404)
            return
        if self.path.split("?")[0] == "/metrics":
            with live.lock:
                body = promexp.render(inst)
            ctype = "text/plain; version=0.0.4; charset=utf-8"
        elif self.path.split("?")[0] == "/server_info" and inst.spec.engine == "sglang":
            body = live.server_info.get(inst.spec.name, b"{}")
            ctype = "application/json"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet
        pass


class OTLPPoster(BundleSink):
    """A BundleSink whose span lines go to an OTLP/HTTP endpoint instead of a file."""

    def __init__(self, endpoint: str, out: Path):
        super().__init__(out, kv_events=False, spans_per_line=50)
        self.endpoint = endpoint.rstrip("/") + "/v1/traces"
        self.sent = self.failed = 0
        self._otlp.close()
        self._otlp = self  # write() below receives each OTLP/JSON document

    def write(self, line: bytes) -> None:
        req = urllib.request.Request(self.endpoint, data=line.rstrip(b"\n"), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                r.read()
            self.sent += 1
        except (urllib.error.URLError, OSError):
            self.failed += 1

    def close(self, fleet=None) -> None:
        if fleet is None:
            return
        for res in list(self._buf):
            self._flush_res(res)

    def snapshot(self, fleet, t):  # served live instead
        pass


class LiveFleet:
    def __init__(self, sc_name: str = "quick", seed: int = 1, speed: float = 10.0, endpoint: str = "http://127.0.0.1:4318",
                 workdir: str | Path = ".agentobs-live", host: str = "127.0.0.1"):
        self.lock = threading.Lock()
        self.speed = speed
        self.endpoint = endpoint
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        base = scenario(sc_name)
        self.servers = []
        specs = []
        for spec in base.instances:
            srv = ThreadingHTTPServer((host, 0), _Handler)
            srv.live = self  # type: ignore[attr-defined]
            self.servers.append(srv)
            specs.append(replace(spec, name=f"{host}:{srv.server_address[1]}"))
        self.scenario = replace(base, instances=tuple(specs), snapshot_s=0.0)
        self.sink = OTLPPoster(endpoint, self.workdir)
        self.ids = IdAlloc(1)
        self.sessions = build_workload(self.scenario, seed, self.ids)
        self.fleet = Fleet(FleetSpec(list(specs), router=self.scenario.router, snapshot_s=0.0, seed=seed,
                                     start_epoch=time.time()), self.sink, self.ids)
        self.by_port = {srv.server_address[1]: inst for srv, inst in zip(self.servers, self.fleet.instances, strict=True)}
        self.server_info = {}
        self.sink._write_server_info(self.fleet)
        for inst in self.fleet.instances:
            p = self.workdir / "server_info" / f"{inst.spec.name.replace(':', '_')}.json"
            if p.exists():
                self.server_info[inst.spec.name] = p.read_bytes()

    def fleet_yaml(self) -> str:
        """A fleet file for `agentobs collect`: its OTLP/HTTP receiver where the spans go, and the replicas."""
        from urllib.parse import urlparse

        u = urlparse(self.endpoint)
        lines = [f'receiver: {{http: "{u.hostname or "127.0.0.1"}:{u.port or 4318}"}}',
                 "scrape:", "  interval_s: 5", "  targets:"]
        for inst in self.fleet.instances:
            lines.append(f"    - url: http://{inst.spec.name}/metrics")
            lines.append(f"      engine: {inst.spec.engine}")
        return "\n".join(lines) + "\n"

    def start_servers(self) -> None:
        for srv in self.servers:
            threading.Thread(target=srv.serve_forever, daemon=True).start()

    def run(self, max_wall_s: float | None = None) -> None:
        """Run the event loop paced to the wall clock (sim seconds = wall seconds × speed)."""
        fl = self.fleet
        t_wall0 = time.monotonic()
        fl.spec.start_epoch = time.time()
        clock = _PacedLock(self, t_wall0, max_wall_s)
        fl.run(self.sessions, progress=None, pace=clock)

    def stop(self) -> None:
        for srv in self.servers:
            srv.shutdown()
            srv.server_close()


class _PacedLock:
    """Called by the event loop before each event: sleep until its simulated time is due; the fleet
    state is mutated under the lock the HTTP handlers render under."""

    def __init__(self, live: LiveFleet, t0: float, max_wall_s: float | None):
        self.live, self.t0, self.max = live, t0, max_wall_s
        self.held = False

    def __call__(self, t_sim: float) -> bool:
        if self.held:
            self.live.lock.release()
            self.held = False
        due = self.t0 + t_sim / self.live.speed
        now = time.monotonic()
        if self.max is not None and now - self.t0 > self.max:
            return False
        if due > now:
            time.sleep(due - now)
        self.live.lock.acquire()
        self.held = True
        return True

    def done(self) -> None:
        if self.held:
            self.live.lock.release()
            self.held = False


def run_live(otlp_endpoint: str, speed: float, seed: int, console, scenario_name: str = "quick",
             max_wall_s: float | None = None) -> LiveFleet:
    live = LiveFleet(scenario_name, seed, speed, otlp_endpoint)
    live.start_servers()
    fleet_file = live.workdir / "fleet.yaml"
    fleet_file.write_text(live.fleet_yaml())
    console.print(f"simulated replicas: {', '.join(i.spec.name for i in live.fleet.instances)}; spans → {otlp_endpoint}")
    console.print(f"scrape them with: agentobs collect --fleet {fleet_file}  (Ctrl-C stops the demo)")
    try:
        live.run(max_wall_s)
    except KeyboardInterrupt:
        pass
    finally:
        live.stop()
    console.print(f"sent {live.sink.sent} OTLP requests ({live.sink.failed} failed)"
                  + (": is `agentobs collect` running?" if live.sink.failed and not live.sink.sent else ""))
    return live


def _json(obj) -> bytes:
    return json.dumps(obj).encode()
