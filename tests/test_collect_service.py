"""`agentobs collect` as a subprocess: acknowledged spans survive SIGKILL; SIGTERM flushes and
publishes a read snapshot that `agentobs sql` can open while the collector holds the store."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _spans import payload  # noqa: E402

AGENTOBS = [sys.executable, "-m", "agentobs.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, db, extra="", snapshot_every=0):
    http_port, grpc_port, health_port = _free_port(), _free_port(), _free_port()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"""
receiver: {{grpc: "127.0.0.1:{grpc_port}", http: "127.0.0.1:{http_port}"}}
health: "127.0.0.1:{health_port}"
snapshot: {{every_s: {snapshot_every}}}
{extra}
""")
    # cwd is tmp_path: PYTHONPATH makes `-m agentobs.cli` this checkout's, not the editable install's
    env = {**os.environ, "AGENTOBS_COLLECT_COMMIT_S": "0.01",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([*AGENTOBS, "collect", "--fleet", str(fleet), "--db", str(db)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", http_port), timeout=0.2).close()
            return proc, http_port, health_port
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read().decode()) from None
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("collector did not start")


def _post(conn, body):
    conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
    r = conn.getresponse()
    r.read()
    return r.status


@pytest.mark.slow  # end to end: a real `agentobs collect` process, killed
def test_acknowledged_spans_survive_sigkill(tmp_path):
    db = tmp_path / "d.duckdb"
    proc, port, _ = _start(tmp_path, db)
    acked: list[int] = []
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for seed in range(12):
            assert _post(conn, payload(64, seed)) == 200
            acked.append(seed)
        # one more export in flight while the process dies: it may or may not be stored, never acked
        conn.request("POST", "/v1/traces", body=payload(64, 99), headers={"Content-Type": "application/x-protobuf"})
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    con = duckdb.connect(str(db))  # restart: the WAL is replayed on open
    (n,) = con.execute("SELECT count(*) FROM spans WHERE start_ns < ?",
                       [1_791_969_600_000_000_000 + 12 * 64 * 1_000_000]).fetchone()
    con.close()
    assert n == 12 * 64  # every acknowledged span (12 exports x 64) is there


@pytest.mark.slow  # end to end: a real `agentobs collect` process, stopped
def test_sigterm_flushes_and_publishes_a_readable_snapshot(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_collect_scraper import VLLM, Site

    site = Site()
    site.pages["/metrics"] = (200, VLLM.encode())
    db = tmp_path / "d.duckdb"
    targets = f'scrape: {{interval_s: 0.5, targets: [{{url: "{site.url("/metrics")}", instance: "v:1", engine: vllm}}]}}'
    proc, port, health_port = _start(tmp_path, db, targets, snapshot_every=0.5)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        assert _post(conn, payload(100, 1)) == 200
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{health_port}/metrics", timeout=10).read().decode()
        assert 'agentobs_otlp_spans_received_total{transport="http"} 100.0' in metrics
        snap = tmp_path / "d.read.duckdb"
        deadline = time.monotonic() + 30
        out = ""
        while time.monotonic() < deadline:  # the snapshot catches up with the committed spans
            r = subprocess.run([*AGENTOBS, "sql", "SELECT count(*) AS n FROM llm_calls", "--db", str(snap),
                                "--format", "csv"], capture_output=True, text=True, cwd=tmp_path)
            out = r.stdout
            if r.returncode == 0 and out.replace('"', "").split() == ["n", "100"]:
                break
            time.sleep(0.3)
        assert out.replace('"', "").split() == ["n", "100"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        site.close()
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM spans").fetchone() == (100,)
    (ok,) = con.execute("SELECT count(*) FROM scrapes WHERE ok AND instance = 'v:1'").fetchone()
    assert ok >= 1
    # at shutdown the store's KV-event index was brought up to date (no KV events here: an empty, current one)
    from agentobs.model.kvindex import stamp

    assert con.execute("SELECT stamp FROM kv_index_meta").fetchall() == [(stamp(con),)]
    con.close()
    # the final snapshot (published at shutdown) has everything the store has
    snap = duckdb.connect(str(tmp_path / "d.read.duckdb"), read_only=True)
    assert snap.execute("SELECT count(*) FROM scrapes WHERE ok").fetchone() == (ok,)
    snap.close()


@pytest.mark.parametrize("flag", ["--fleet", "--config"])
def test_collect_takes_the_fleet_file_as_fleet_and_config_still_with_a_warning(tmp_path, monkeypatch, capsys, flag):
    """--fleet FLEET.yaml; --config FLEET.yaml is its deprecated alias for one release (a warning line)."""
    from agentobs.cli import main
    from agentobs.collect import service

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text('receiver: {grpc: "", http: "127.0.0.1:4999"}\nhealth: ""\n'
                     'scrape: {targets: [{url: "http://10.0.0.1:8000/metrics"}]}\n')
    ran = []

    class FakeService:
        snapshot_path = "x.read.duckdb"

        def __init__(self, fleet, settings, db, upkeep=None):
            ran.append((fleet, db))

        def status_line(self):
            return "ok"

    monkeypatch.setattr(service, "Service", FakeService)
    monkeypatch.setattr(service, "run_forever", lambda svc, status: None)
    main(["collect", flag, str(fleet), "--db", str(tmp_path / "f.duckdb")])
    err = " ".join(capsys.readouterr().err.split())
    (got, db), = ran
    assert [t.url for t in got.targets] == ["http://10.0.0.1:8000/metrics"] and got.http == "127.0.0.1:4999"
    assert db == str(tmp_path / "f.duckdb")
    warning = ("warning: `agentobs collect --config FLEET.yaml` is deprecated; use --fleet FLEET.yaml (--config will "
               "be the settings file, as on every other command)")
    assert (warning in err) == (flag == "--config")
    assert "1 scrape target(s)" in err


def test_collect_needs_the_fleet_file_once(tmp_path, capsys):
    from agentobs.cli import main

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("health: ''\n")
    with pytest.raises(SystemExit) as e:
        main(["collect", "--db", str(tmp_path / "f.duckdb")])
    assert e.value.code == 2 and "Missing option '--fleet'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["collect", "--fleet", str(fleet), "--config", str(fleet)])
    assert e.value.code == 2 and "give the fleet file once" in capsys.readouterr().err
