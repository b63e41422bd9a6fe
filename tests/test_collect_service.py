"""`agentobs collect` as a subprocess: acknowledged spans survive SIGKILL (three times, under load, stored
exactly once); SIGTERM stops it; the read snapshot is readable by `agentobs sql` while the collector holds
the store, and points at the store itself once it has stopped."""

from __future__ import annotations

import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest
from cli_run import run_cli

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _spans import payload  # noqa: E402

AGENTOBS = [sys.executable, "-m", "agentobs.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, db, extra="", snapshot_every=0, env_extra=None):
    http_port, grpc_port, health_port = _free_port(), _free_port(), _free_port()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"""
receiver: {{grpc: "127.0.0.1:{grpc_port}", http: "127.0.0.1:{http_port}"}}
health: "127.0.0.1:{health_port}"
snapshot: {{every_s: {snapshot_every}}}
{extra}
""")
    # cwd is tmp_path: PYTHONPATH makes `-m agentobs.cli` this checkout's, not the editable install's
    env = {**os.environ, "AGENTOBS_COLLECT_COMMIT_S": "0.01", "AGENTOBS_LOADER_PROCESSES": "2",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           **(env_extra or {})}
    # its own process group: the collector's forkserver, resource tracker and decoder processes are in it, and
    # _stop_group ends them with it (a SIGKILLed collector leaves them running, orphaned)
    proc = subprocess.Popen([*AGENTOBS, "collect", "--fleet", str(fleet), "--db", str(db)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", http_port), timeout=0.2).close()
            return proc, http_port, health_port
        except OSError:
            if proc.poll() is not None:
                _stop_group(proc)
                raise AssertionError(proc.stdout.read().decode()) from None
            time.sleep(0.1)
    _stop_group(proc)
    raise AssertionError("collector did not start")


def _group_alive(proc) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc) -> None:
    """SIGKILL what is left of the collector's process group (the collector itself included if it still runs) and
    reap the collector: no forkserver or decoder process outlives the test."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is gone already
        pass
    proc.wait(10)
    proc.stdout.close()


def _post(conn, body):
    conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
    r = conn.getresponse()
    r.read()
    return r.status


BASE_NS = 1_791_969_600_000_000_000
PER = 64  # spans per export; export `seed` holds the spans starting at BASE_NS + (seed * PER + j) ms


# span_store = segments with a compaction every 4 segments, so that kills land in publishing and merging too
STORES = {"table": {"AGENTOBS_SPAN_STORE": "table"},
          "segments": {"AGENTOBS_SPAN_STORE": "segments", "AGENTOBS_SEGMENT_COMPACT_AFTER": "4"}}


@pytest.mark.slow  # end to end: a real `agentobs collect` process, killed three times under load
@pytest.mark.parametrize("store", list(STORES))
def test_acknowledged_spans_survive_sigkill_under_load_exactly_once(tmp_path, store):
    """Three clients export without pause; the collector is SIGKILLed at a random moment, three times, and
    restarted. A ledger keeps every export answered 200. Then the spool left behind is loaded: every
    acknowledged export is stored with all its spans, and no export is stored twice (exports in flight
    at a kill, unacknowledged, may be stored or not — never twice)."""
    db = tmp_path / "d.duckdb"
    acked: set[int] = set()
    sent: set[int] = set()
    rng = random.Random(5)
    next_seed = iter(range(10**6))
    lock = threading.Lock()

    def client(port, stop):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            while not stop.is_set():
                with lock:
                    seed = next(next_seed)
                    sent.add(seed)
                if _post(conn, payload(PER, seed)) == 200:
                    with lock:
                        acked.add(seed)
        except (OSError, http.client.HTTPException):
            return  # the collector died under us

    for _ in range(3):
        proc, port, _ = _start(tmp_path, db, env_extra=STORES[store])
        stop = threading.Event()
        ts = [threading.Thread(target=client, args=(port, stop)) for _ in range(3)]
        for t in ts:
            t.start()
        time.sleep(rng.uniform(0.5, 2.0))
        try:
            proc.send_signal(signal.SIGKILL)  # the collector alone dies, as in a crash ...
            proc.wait(10)
            stop.set()
            for t in ts:
                t.join(30)
        finally:
            _stop_group(proc)  # ... then its orphaned helpers go too, before the next start
    assert len(acked) >= 3
    # the next start loads what the spool holds (here in-process, to wait for it)
    from agentobs.collect.loader import Loader
    from agentobs.collect.spool import Spool
    from agentobs.config import load_settings
    from agentobs.model import connect

    con = connect(db)
    spool = Spool(tmp_path / "d.duckdb.spool")
    loader = Loader(spool, con, load_settings(env=STORES[store]), processes=0).start()
    assert loader.wait_idle(60)
    spool.close()
    loader.stop()
    per_seed = dict(con.execute(f"SELECT (start_ns - {BASE_NS}) // 1000000 // {PER} AS seed, count(*) FROM spans "
                                "GROUP BY seed").fetchall())
    con.close()
    missing = sorted(s for s in acked if per_seed.get(s) != PER)
    assert not missing, f"acknowledged exports not stored whole: {missing[:10]}"
    assert max(per_seed.values()) == PER  # nothing stored twice
    assert set(per_seed) <= sent


@pytest.mark.slow  # end to end: a real `agentobs collect` process, stopped
@pytest.mark.parametrize("store", list(STORES))
def test_sigterm_stops_and_the_snapshot_is_readable(tmp_path, store):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_collect_scraper import VLLM, Site

    site = Site()
    site.pages["/metrics"] = (200, VLLM.encode())
    db = tmp_path / "d.duckdb"
    targets = f'scrape: {{interval_s: 0.5, targets: [{{url: "{site.url("/metrics")}", instance: "v:1", engine: vllm}}]}}'
    proc, port, health_port = _start(tmp_path, db, targets, snapshot_every=0.5, env_extra=STORES[store])
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        assert _post(conn, payload(100, 1)) == 200
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{health_port}/metrics", timeout=10).read().decode()
        assert 'agentobs_otlp_spans_received_total{transport="http"} 100.0' in metrics
        snap = tmp_path / "d.read.duckdb"
        deadline = time.monotonic() + 30
        out = ""
        while time.monotonic() < deadline:  # the snapshot catches up with the committed spans
            r = run_cli("sql", "SELECT count(*) AS n FROM llm_calls", "--db", snap, "--format", "csv")
            out = r.stdout
            if r.returncode == 0 and out.replace('"', "").split() == ["n", "100"]:
                break
            time.sleep(0.3)
        assert out.replace('"', "").split() == ["n", "100"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 10  # and its helpers (forkserver, decoders) end with it
        while _group_alive(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _group_alive(proc), "the collector stopped but left processes of its group running"
    finally:
        _stop_group(proc)
        site.close()
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM spans").fetchone() == (100,)
    (ok,) = con.execute("SELECT count(*) FROM scrapes WHERE ok AND instance = 'v:1'").fetchone()
    assert ok >= 1
    con.close()
    # at shutdown the snapshot path was pointed at the store itself (no copy): readers see everything
    snap_path = tmp_path / "d.read.duckdb"
    assert snap_path.is_symlink() and snap_path.resolve() == db.resolve()
    r = run_cli("sql", "SELECT count(*) AS n FROM scrapes WHERE ok", "--db", snap_path, "--format", "csv")
    assert r.stdout.replace('"', "").split() == ["n", str(ok)]


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

        def __init__(self, fleet, settings, db, views=None, upkeep=None, derive=None):
            assert callable(derive)  # the CLI wires the session model's refresh (agentobs.model.state)
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


@pytest.mark.parametrize("budget", [3.0, 0.0])
def test_stop_refreshes_the_session_model_within_its_budget(tmp_path, budget):
    """At stop the collector refreshes the session model on the store with collect_stop_refresh_s as its budget (the
    CLI's derive: agentobs.model.state.refresh); 0 skips it. In process: no receivers, no scrapes, two calls written
    to the store directly while it runs."""
    from agentobs.collect.fleet import Fleet
    from agentobs.collect.service import Service
    from agentobs.config import Settings
    from agentobs.model import connect, ensure, state

    db = tmp_path / "s.duckdb"
    connect(db).close()  # a migrated store with the model's views
    settings = Settings(values={"collect_stop_refresh_s": budget, "loader_processes": 1})
    calls = []

    def derive(con, budget_s=None):
        calls.append(budget_s)
        return state.refresh(con, settings, budget_s=budget_s)

    svc = Service(Fleet(snapshot_every_s=0), settings, str(db), views=ensure, derive=derive).start()
    sec = 1_000_000_000
    for i in range(2):
        svc.con.execute("INSERT INTO spans_part (trace_id, span_id, start_ns, end_ns, role, session_id, instance, model, "
                        "input_tokens, cached_tokens, output_tokens) VALUES (?, ?, ?, ?, 'gateway', 's1', 'i1', 'm', "
                        "1000, 0, 10)", [f"t{i}", f"g{i}", 10 * i * sec, (10 * i + 2) * sec])
    svc.stop()
    assert calls == ([budget] if budget else [])
    con = duckdb.connect(str(db), read_only=True)
    if budget:
        assert con.execute("SELECT count(*) FROM model_calls").fetchall()[0][0] == 2
        assert state.current(con, settings)
    else:  # skipped: no state yet (readers derive it; the next refresh builds it)
        assert not state.current(con, settings)
    con.close()
