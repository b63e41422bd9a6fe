#!/usr/bin/env python3
"""End-to-end check of agentobs on a real vLLM (CPU build), from scratch, torn down at the end.

    .venv/bin/python scripts/vllm/e2e.py --out /tmp/agentobs-e2e            # ample + starved + litellm
    .venv/bin/python scripts/vllm/e2e.py --out DIR --configs ample           # one config

For every configuration: setup.sh (venv + tiny model, idempotent), ``agentobs collect`` (OTLP
gRPC+HTTP receivers, a 1 s scrape of vLLM ``/metrics``, the KV-event subscriber) on free loopback
ports, vLLM (serve.sh) exporting its spans to the collector over gRPC and publishing KV events on
an ``ipc://`` socket the collector connects to, optionally the LiteLLM proxy in front of vLLM, the
agent driver (agent_driver.py) exporting over OTLP/HTTP; then it waits until every span has been
committed, stops everything it started (process groups) and runs check_e2e.py on the DuckDB file.
At the end check_e2e.py ``--compare`` prints starved vs ample. Exit status 0 only when every check
passed. Files per configuration under OUT/<config>/: agentobs.duckdb, responses.jsonl,
check.json, fleet.yaml, *.log, server_cmd.txt.

Configurations: ``ample`` (128 blocks of 128 tokens), ``starved`` (24 blocks: evictions between
turns), ``litellm`` (ample vLLM behind the LiteLLM proxy with ``callbacks: ["otel"]``; needs
``$LITELLM_VENV``, default /opt/litellm-venv, see setup_litellm.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PY = sys.executable
AGENTOBS = str(Path(PY).parent / "agentobs")
BLOCK_SIZE = int(os.environ.get("VLLM_BLOCK_SIZE", "128"))  # serve.sh's --block-size
# vLLM directly: replies from single-token words (they re-render to the token ids vLLM generated, so the block decoding
# filled is reusable, as with a trained model's text), 64 of them (the last partial prompt block fills in about half
# of the calls), and agentobs.prompt.block_hashes on the chat spans (exact mode; the checks also strip them: estimate)
DIRECT = ["--word-tokens", "--max-tokens", "64", "--block-hashes", str(BLOCK_SIZE)]
CONFIGS = {
    "ample": {"num_blocks": 128, "litellm": False, "driver": DIRECT},
    "starved": {"num_blocks": 24, "litellm": False, "driver": DIRECT},
    "litellm": {"num_blocks": 128, "litellm": True, "driver": []},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None, every: float = 0.5) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return time.time() - t0
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode} while waiting")
        time.sleep(every)
    raise RuntimeError(f"{what}: not ready after {timeout:.0f} s")


def health_value(health_url: str, name: str) -> float:
    """Sum of all samples of one metric on the collector's own /metrics."""
    with urllib.request.urlopen(health_url, timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Procs:
    """Processes started here, each in its own session (process group); stopped in reverse order."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen, object]] = []

    def start(self, name: str, cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
        fh = open(log_path, "w")
        p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                             cwd=REPO, start_new_session=True)
        self.procs.append((name, p, fh))
        log(f"started {name} (pgid {p.pid})")
        return p

    def stop(self, name: str, timeout: float = 40.0) -> None:
        for i, (n, p, fh) in enumerate(self.procs):
            if n != name:
                continue
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    log(f"{name} ignored SIGTERM for {timeout:.0f} s: SIGKILL")
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)
            # children left in the group (vLLM's engine core) go too
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            fh.close()
            log(f"stopped {name} (exit {p.returncode})")
            del self.procs[i]
            return

    def stop_all(self) -> None:
        for name, _, _ in list(reversed(self.procs)):
            self.stop(name)


class Recorder:
    """OTLP/HTTP pass-through: saves every request body (as sent) under ``dir`` and forwards it to
    the collector's HTTP receiver, answering with the collector's answer. Used by the ``litellm``
    configuration so the real LiteLLM / driver / vLLM exports can be kept as a test fixture."""

    def __init__(self, target: str, out_dir: Path):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        out_dir.mkdir(parents=True, exist_ok=True)
        lock, counter = threading.Lock(), [0]
        index = open(out_dir / "index.jsonl", "a")

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hdrs = {k: v for k, v in self.headers.items()
                        if k.lower() in ("content-type", "content-encoding", "user-agent")}
                with lock:
                    counter[0] += 1
                    n = counter[0]
                name = f"{n:06d}{'.json' if 'json' in hdrs.get('Content-Type', '') else '.pb'}"
                if self.path.startswith("/v1/traces"):
                    (out_dir / name).write_bytes(body)
                req = urllib.request.Request(target + self.path, data=body, method="POST",
                                             headers={k: v for k, v in hdrs.items() if k.lower() != "user-agent"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        status, data, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
                except urllib.error.HTTPError as e:
                    status, data, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
                except OSError as e:
                    status, data, ctype = 502, str(e).encode(), "text/plain"
                with lock:
                    index.write(json.dumps({"n": n, "path": self.path, "file": name if self.path.startswith(
                        "/v1/traces") else None, "headers": hdrs, "bytes": len(body), "status": status}) + "\n")
                    index.flush()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        self.index = index
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        self.index.close()


class KVTap:
    """A second ZMQ subscriber on vLLM's KV-event socket (a PUB serves every subscriber): writes each batch as
    received, in capture.py's format (``agentobs import kv-events`` reads it), so a run can be kept as a fixture."""

    def __init__(self, endpoint: str, topic: str, instance: str, path: Path):
        import threading

        import zmq

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sock.setsockopt(zmq.RCVTIMEO, 200)
        self.sock.connect(endpoint)
        self.instance, self.fh, self.stop_flag = instance, open(path, "w"), threading.Event()
        self.batches = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import zmq

        while not self.stop_flag.is_set():
            try:
                frames = self.sock.recv_multipart()
            except zmq.Again:
                continue
            if len(frames) != 3:
                continue
            topic, seq, payload = frames
            self.fh.write(json.dumps({"instance": self.instance, "topic": topic.decode(),
                                      "seq": int.from_bytes(seq, "big"), "ts_received": time.time(),
                                      "payload_hex": payload.hex()}) + "\n")
            self.fh.flush()
            self.batches += 1

    def close(self) -> None:
        self.stop_flag.set()
        self.thread.join(5)
        self.sock.close(0)
        self.ctx.term()
        self.fh.close()


def write_fleet(path: Path, grpc: int, http: int, health: int, vllm_port: int, kv_ep: str) -> None:
    path.write_text(f"""# written by scripts/vllm/e2e.py
receiver: {{grpc: "127.0.0.1:{grpc}", http: "127.0.0.1:{http}"}}
health: "127.0.0.1:{health}"
snapshot: {{every_s: 0}}
scrape:
  interval_s: 1
  timeout_s: 5
  jitter: 0
  targets:
    - url: http://127.0.0.1:{vllm_port}/metrics
      engine: vllm
kv_events:
  - endpoint: {kv_ep}
    instance: 127.0.0.1:{vllm_port}
    topic: kv-events
""")


def write_litellm_config(path: Path, vllm_port: int) -> None:
    # hosted_vllm/ is LiteLLM's OpenAI-compatible vLLM provider
    path.write_text(f"""model_list:
  - model_name: tiny-llama
    litellm_params:
      model: hosted_vllm/tiny-llama
      api_base: http://127.0.0.1:{vllm_port}/v1
      api_key: none
litellm_settings:
  callbacks: ["otel"]
""")


def run_config(name: str, out: Path, args) -> dict:
    cfg = CONFIGS[name]
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    db = d / "agentobs.duckdb"
    grpc, http, health, vllm_port = free_port(), free_port(), free_port(), free_port()
    kv_ep = f"ipc:///tmp/agentobs-e2e-{os.getpid()}-{name}.kv"
    write_fleet(d / "fleet.yaml", grpc, http, health, vllm_port, kv_ep)
    health_url = f"http://127.0.0.1:{health}/metrics"
    procs = Procs()
    rec = tap = None
    otlp_http = f"http://127.0.0.1:{http}"
    if cfg["litellm"] or args.record:  # everything exported over OTLP/HTTP through the recorder (kept as a fixture)
        rec = Recorder(otlp_http, d / "otlp_recorded")
        otlp_http = f"http://127.0.0.1:{rec.port}"
    if args.record:  # the KV events as vLLM published them, and its /metrics at the end
        tap = KVTap(kv_ep, "kv-events", f"127.0.0.1:{vllm_port}", d / "kv_events.jsonl")
    timings: dict[str, float] = {}
    t_all = time.time()
    try:
        col = procs.start("collect", [AGENTOBS, "collect", "--fleet", str(d / "fleet.yaml"), "--db", str(db)],
                          d / "collect.log")
        wait_for(lambda: http_ok(health_url), 60, "agentobs collect health", col)
        env = {
            "VLLM_PORT": str(vllm_port), "VLLM_NUM_BLOCKS": str(cfg["num_blocks"]),
            "VLLM_OTLP_ENDPOINT": f"http://127.0.0.1:{grpc}", "VLLM_OTLP_PROTOCOL": "grpc",
            **({"VLLM_OTLP_ENDPOINT": f"{otlp_http}/v1/traces", "VLLM_OTLP_PROTOCOL": "http/protobuf"} if rec else {}),
            "VLLM_KV_EVENTS_ENDPOINT": kv_ep, "VLLM_CMD_OUT": str(d / "server_cmd.txt"),
        }
        t0 = time.time()
        vllm = procs.start("vllm", ["bash", str(HERE / "serve.sh")], d / "vllm.log", env)
        wait_for(lambda: http_ok(f"http://127.0.0.1:{vllm_port}/health"), args.vllm_timeout, "vLLM /health", vllm, 1)
        timings["vllm_start_s"] = round(time.time() - t0, 1)
        log(f"vLLM healthy after {timings['vllm_start_s']} s")
        # a scrape of the idle server before the workload (the counters' window start)
        scrapes0 = health_value(health_url, "agentobs_scrapes_total")
        wait_for(lambda: health_value(health_url, "agentobs_scrapes_total") >= scrapes0 + 2, 30, "first scrapes")
        base_url = f"http://127.0.0.1:{vllm_port}"
        driver_extra: list[str] = []
        if cfg["litellm"]:
            lport = free_port()
            write_litellm_config(d / "litellm.yaml", vllm_port)
            lvenv = Path(args.litellm_venv)
            lenv = {
                "OTEL_EXPORTER": "otlp_http", "OTEL_ENDPOINT": f"{otlp_http}/v1/traces",
                "OTEL_SERVICE_NAME": "litellm-proxy",
                "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
                "LITELLM_LOG": "INFO", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "DISABLE_SCHEMA_UPDATE": "true",
                "NO_DOCS": "True", "LITELLM_TELEMETRY": "False",
            }
            t1 = time.time()
            lp = procs.start("litellm", [str(lvenv / "bin" / "litellm"), "--config", str(d / "litellm.yaml"),
                                         "--host", "127.0.0.1", "--port", str(lport), "--num_workers", "1"],
                             d / "litellm.log", lenv)
            wait_for(lambda: http_ok(f"http://127.0.0.1:{lport}/health/liveliness"), 180, "LiteLLM proxy", lp, 1)
            timings["litellm_start_s"] = round(time.time() - t1, 1)
            base_url = f"http://127.0.0.1:{lport}"
            driver_extra = ["--no-chat-spans", "--litellm"]
        t2 = time.time()
        drv = subprocess.run([PY, str(HERE / "agent_driver.py"), "--base-url", base_url,
                              "--engine-address", f"127.0.0.1:{vllm_port}",
                              "--otlp", f"{otlp_http}/v1/traces", "--out", str(d / "responses.jsonl"),
                              "--service", f"agent-driver-{name}", *cfg["driver"], *driver_extra, *args.driver_args],
                             stdout=open(d / "driver.log", "w"), stderr=subprocess.STDOUT, cwd=REPO, timeout=600)
        timings["workload_s"] = round(time.time() - t2, 1)
        if drv.returncode != 0:
            raise RuntimeError(f"driver exited with {drv.returncode} (see {d / 'driver.log'})")
        calls = [json.loads(x) for x in (d / "responses.jsonl").read_text().splitlines()]
        log(f"workload: {len(calls)} calls in {timings['workload_s']} s")
        # every span committed: the engine exports in batches every 5 s; wait until the receiver's
        # count has covered one engine span per call plus the driver's spans and stopped moving
        n_sessions = len({c["session_id"] for c in calls})
        n_turns = len({(c["session_id"], c["turn"]) for c in calls})
        expect = len(calls) + n_sessions + n_turns + (0 if cfg["litellm"] else len(calls))
        last, stable_since = -1.0, time.time()

        def settled() -> bool:
            nonlocal last, stable_since
            v = health_value(health_url, "agentobs_otlp_spans_received_total")
            if v != last:
                last, stable_since = v, time.time()
            return v >= expect and time.time() - stable_since >= 6  # engine spans: BatchSpanProcessor, 5 s

        timings["span_wait_s"] = round(wait_for(settled, 60, f"{expect} spans committed", every=0.5), 1)
        log(f"spans received: {last:.0f} (≥ {expect} expected)")
        scrapes1 = health_value(health_url, "agentobs_scrapes_total")
        wait_for(lambda: health_value(health_url, "agentobs_scrapes_total") >= scrapes1 + 2, 30, "final scrapes")
        if args.record:
            with urllib.request.urlopen(f"http://127.0.0.1:{vllm_port}/metrics", timeout=10) as r:
                (d / "metrics_after.txt").write_bytes(r.read())
            (d / "metrics_after.at").write_text(f"{time.time():.3f}\n")
    finally:
        procs.stop_all()
        if rec:
            rec.close()
        if tap:
            tap.close()
            log(f"KV tap: {tap.batches} batches")
        for p in Path("/tmp").glob(f"agentobs-e2e-{os.getpid()}-{name}.kv"):
            p.unlink(missing_ok=True)
    timings["config_total_s"] = round(time.time() - t_all, 1)
    (d / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    chk = subprocess.run([PY, str(HERE / "check_e2e.py"), "--db", str(db), "--responses", str(d / "responses.jsonl"),
                          "--config", name, "--json", str(d / "check.json")], cwd=REPO)
    return {"config": name, "ok": chk.returncode == 0, **timings}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (one subdirectory per configuration)")
    ap.add_argument("--configs", default="ample,starved,litellm")
    ap.add_argument("--skip-setup", action="store_true")
    ap.add_argument("--vllm-timeout", type=float, default=600)
    ap.add_argument("--litellm-venv", default=os.environ.get("LITELLM_VENV", "/opt/litellm-venv"))
    ap.add_argument("--record", action="store_true",
                    help="keep the raw inputs of each configuration (OTLP exports through a recorder — vLLM over "
                         "OTLP/HTTP then —, the KV-event batches, vLLM's /metrics at the end) for a test fixture")
    ap.add_argument("driver_args", nargs="*", help="extra agent_driver.py arguments (after --)")
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
        if "litellm" in names:
            subprocess.run(["bash", str(HERE / "setup_litellm.sh")], check=True,
                           env={**os.environ, "LITELLM_VENV": args.litellm_venv})
    setup_s = round(time.time() - t0, 1)
    results = []
    for n in names:
        log(f"=== {n} ===")
        try:
            results.append(run_config(n, out, args))
        except Exception as e:  # noqa: BLE001 - report and go on with the next configuration
            log(f"{n} FAILED: {e}")
            results.append({"config": n, "ok": False, "error": str(e)})
    ok = all(r["ok"] for r in results)
    if "ample" in names and "starved" in names:
        cmp = subprocess.run([PY, str(HERE / "check_e2e.py"), "--compare", str(out / "ample" / "agentobs.duckdb"),
                              str(out / "starved" / "agentobs.duckdb"), "--json", str(out / "compare.json")], cwd=REPO)
        ok = ok and cmp.returncode == 0
    summary = {"ok": ok, "setup_s": setup_s, "total_s": round(time.time() - t0, 1), "configs": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
