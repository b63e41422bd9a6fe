"""``agentobs collect``: the OTLP receivers, the scraper, KV-event subscribers, the health endpoint
and the read-snapshot publisher in one process, all writing through one ``Writer``.

SIGTERM/SIGINT stop it cleanly: the receivers stop accepting (in-flight exports finish and are
committed before they are acknowledged), the scraper and subscribers stop, the writer flushes,
a last snapshot is published and the store is closed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import duckdb

from ..config import Settings
from ..store.db import connect
from ..store.writer import Writer
from . import snapshot
from .fleet import Fleet, split_hostport
from .health import Health
from .kvsub import KVSubscriber
from .otlp_grpc import OtlpGrpcServer
from .otlp_http import OtlpHttpServer
from .receiver import Ingest
from .scraper import Scraper


@dataclass
class Service:
    fleet: Fleet
    settings: Settings
    db: str
    # the session model's upkeep after writes (agentobs.model.upkeep: views, KV-event index; False when the index
    # failed), given by the caller: collect writes the store and knows nothing of the model above it
    upkeep: Callable[[duckdb.DuckDBPyConnection], bool] | None = None
    health: Health = field(default_factory=Health)
    stop_event: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Service:
        s = self.settings
        self.grpc = self.http = self.health_srv = None
        self.threads: list[threading.Thread] = []
        self.con = connect(self.db)
        if self.upkeep is not None:
            self.upkeep(self.con)  # the model's views before any reader opens the store
        self.writer = Writer(self.con, batch_rows=s.writer_batch_rows, flush_s=s.collect_commit_s,
                             on_commit=self.health.on_commit)
        self.ingest = Ingest(self.writer, s, self.health)
        token = s.receiver_token or None
        max_body = s.receiver_max_body_mb * 1024 * 1024
        if self.fleet.grpc:
            host, port = split_hostport(self.fleet.grpc, "receiver.grpc")
            self.grpc = OtlpGrpcServer(self.ingest, host, port, token, max_body).start()
        if self.fleet.http:
            host, port = split_hostport(self.fleet.http, "receiver.http")
            self.http = OtlpHttpServer(self.ingest, host, port, token, max_body).start()
        if self.fleet.health:
            host, port = split_hostport(self.fleet.health, "health")
            self.health_srv, _ = self.health.serve(host, port)
        self.scraper = Scraper(self.fleet.targets, self.writer, self.health, jitter=self.fleet.jitter,
                               concurrency=self.fleet.concurrency,
                               server_info_every_s=self.fleet.server_info_every_s)
        if self.fleet.targets:
            self._thread(self.scraper.run, "scraper")
        self.subs = [KVSubscriber(k, self.writer, self.health) for k in self.fleet.kv]
        for sub in self.subs:
            self._thread(sub.run, f"kv-{sub.src.instance}")
        self.snapshot_path = self.fleet.snapshot_path or snapshot.default_snapshot_path(self.db)
        if self.fleet.snapshot_every_s > 0:
            self._thread(self._snapshots, "snapshot")
        return self

    def _thread(self, fn, name: str) -> None:
        t = threading.Thread(target=fn, args=(self.stop_event,), name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def _snapshots(self, stop: threading.Event) -> None:
        while not stop.wait(self.fleet.snapshot_every_s):
            self.publish_snapshot()

    def publish_snapshot(self) -> None:
        try:
            dt = snapshot.publish(self.con, self.snapshot_path, self.upkeep)
        except Exception:  # noqa: BLE001 - a failed snapshot must not stop collection
            self.health.write_errors.labels("snapshot").inc()
            return
        self.health.snapshot_seconds.set(dt)
        self.health.snapshot_ts.set(time.time())

    def status_line(self) -> str:
        h = self.health
        spans = sum(h.value("agentobs_otlp_spans_received_total", {"transport": t}) for t in ("grpc", "http"))
        rej = sum(m.value for fam in h.spans_rejected.collect() for m in fam.samples if m.name.endswith("_total"))
        ok = h.value("agentobs_scrapes_total", {"outcome": "ok"})
        err = h.value("agentobs_scrapes_total", {"outcome": "error"})
        kv = sum(m.value for fam in h.kv_events.collect() for m in fam.samples if m.name.endswith("_total"))
        gaps = sum(m.value for fam in h.kv_gaps.collect() for m in fam.samples if m.name.endswith("_total"))
        wrong = sum(m.value for fam in h.kv_topic_mismatch.collect() for m in fam.samples
                    if m.name.endswith("_total"))
        st = self.writer.stats
        topic = f", wrong topic {wrong:,.0f}: see the kv_events topic" if wrong else ""
        return (f"spans {spans:,.0f} ok / {rej:,.0f} rejected · queue {self.ingest.inflight:,} · "
                f"scrapes {ok:,.0f} ok / {err:,.0f} failed · kv events {kv:,.0f} (gaps {gaps:,.0f}{topic}) · "
                f"last commit {st.last_commit_s * 1000:.0f} ms · rows {st.rows_inserted:,}")

    def stop(self) -> None:
        self.ingest.closing = True
        if self.http:
            self.http.stop()
        if self.grpc:
            self.grpc.stop(grace=5.0)
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=30)
        self.writer.close()
        # the store's own KV-event index, for readers of the store once collect has stopped
        if self.upkeep is not None and not self.upkeep(self.con):
            self.health.write_errors.labels("kv_index").inc()
        if self.fleet.snapshot_every_s > 0:
            self.publish_snapshot()
        if self.health_srv:
            self.health_srv.shutdown()
        self.con.close()


def run_forever(svc: Service, status=None, refresh_s: float = 1.0) -> None:
    """Start, install SIGTERM/SIGINT handlers, refresh ``status(line)`` until stopped, then stop."""
    done = threading.Event()

    def _on_signal(signum, frame):
        done.set()

    old = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        svc.start()
        while not done.wait(refresh_s):
            if status:
                status(svc.status_line())
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        if hasattr(svc, "writer"):
            svc.stop()
