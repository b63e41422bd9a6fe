"""``agentobs collect``: the OTLP receivers with their spool and loader, the scraper, KV-event
subscribers, the health endpoint and the read-snapshot publisher in one process.

OTLP requests are acknowledged once durable in the spool (``spool.py``); the loader (``loader.py``)
decodes them in ``loader_processes`` processes and stores them. Scrapes and KV events go through the
one ``Writer``.

SIGTERM/SIGINT stop it in bounded time, whatever the store's size: the receivers stop accepting
(in-flight exports finish their spool write), the loader stores the batches it is decoding and
leaves the rest of the spool for the next start, the scraper and subscribers stop, the writer
flushes, the derived tables (the session model) are refreshed within collect_stop_refresh_s (else
rolled back, for the next refresh to catch up), the store is closed, and the read-snapshot path is pointed at the store itself (a symbolic
link, replaced atomically): with the collector gone, readers open the store, never a stale copy.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from ..config import Settings
from ..store.db import connect, set_memory_limit
from ..store.writer import Writer
from . import snapshot
from .fleet import Fleet, split_hostport
from .health import Health
from .kvsub import KVSubscriber
from .limits import ByteBudget
from .loader import Loader
from .otlp_grpc import OtlpGrpcServer
from .otlp_http import OtlpHttpServer
from .receiver import Ingest
from .scraper import Scraper
from .spool import Spool

log = logging.getLogger(__name__)


@dataclass
class Service:
    fleet: Fleet
    settings: Settings
    db: str
    # the session model, given by the caller (collect writes the store and knows nothing of the model above it):
    # ``views`` makes its views on the store at start (agentobs.model.ensure), ``upkeep`` its views and KV-event
    # index on each read snapshot (agentobs.model.upkeep)
    views: Callable[[duckdb.DuckDBPyConnection], object] | None = None
    upkeep: Callable[[duckdb.DuckDBPyConnection], object] | None = None
    # ``derive`` brings the live store's derived tables up to date before each read snapshot (the CLI passes the
    # session model's refresh, agentobs.model.state), so the copy carries them and its upkeep has only what
    # arrived in between to do; and once more at stop, with ``budget_s`` = collect_stop_refresh_s (past it the
    # refresh rolls back: the stop stays bounded, and the next refresh catches up)
    derive: Callable[..., object] | None = None
    health: Health = field(default_factory=Health)
    stop_event: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Service:
        s = self.settings
        self.grpc = self.http = self.health_srv = None
        self.threads: list[threading.Thread] = []
        self.con = connect(self.db)
        if s.collect_memory_limit:
            set_memory_limit(self.con, s.collect_memory_limit)
        if self.views is not None:
            self.views(self.con)  # before any reader opens the store (or its link, after stop)
        self.writer = Writer(self.con, batch_rows=s.writer_batch_rows, flush_s=s.collect_commit_s,
                             on_commit=self.health.on_commit)
        mb = 1024 * 1024
        self.spool = Spool(s.spool_dir or default_spool_dir(self.db), segment_bytes=s.spool_segment_mb * mb,
                           max_unloaded_bytes=s.spool_max_unloaded_mb * mb, min_free_bytes=s.spool_min_free_mb * mb,
                           dedupe_requests=s.spool_dedupe_requests)
        # merged span segments are deleted once no read snapshot can list them (two snapshots later, and a minute)
        grace = 2 * self.fleet.snapshot_every_s + 60 if self.fleet.snapshot_every_s > 0 else 0.0
        self.loader = Loader(self.spool, self.con, s, self.health, retire_grace_s=grace).start()
        self.ingest = Ingest(self.spool, s, self.health)
        token = s.receiver_token or None
        # one budget of request bytes in flight for both transports (receiver_max_inflight_mb)
        budget = ByteBudget(s.receiver_max_inflight_mb * 1024 * 1024, self.health.inflight_bytes)
        if self.fleet.grpc:
            host, port = split_hostport(self.fleet.grpc, "receiver.grpc")
            self.grpc = OtlpGrpcServer(self.ingest, host, port, token, budget=budget).start()
        if self.fleet.http:
            host, port = split_hostport(self.fleet.http, "receiver.http")
            self.http = OtlpHttpServer(self.ingest, host, port, token, budget=budget).start()
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
        self._snap_cur = self.con.cursor()
        while not stop.wait(self.fleet.snapshot_every_s):
            self.publish_snapshot()

    def publish_snapshot(self) -> None:
        if self.derive is not None and not self.stop_event.is_set():
            try:
                self.derive(self.con)
            except Exception:  # noqa: BLE001 - readers derive without it; collection goes on
                self.health.write_errors.labels("derive").inc()
        try:
            dt = snapshot.publish(self.con, self.snapshot_path, cur=getattr(self, "_snap_cur", None),
                                  cancel=self.stop_event, upkeep=self.upkeep)
        except snapshot.Cancelled:
            return
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
        return (f"spans {spans:,.0f} ok / {rej:,.0f} rejected · stored {self.loader.loaded_spans:,} · "
                f"spool {self.spool.unloaded_bytes() / 1e6:,.1f} MB to load · "
                f"scrapes {ok:,.0f} ok / {err:,.0f} failed · kv events {kv:,.0f} (gaps {gaps:,.0f}{topic}) · "
                f"last commit {st.last_commit_s * 1000:.0f} ms · rows {st.rows_inserted:,}")

    def stop(self) -> None:
        t0 = time.perf_counter()

        def step(what: str) -> None:
            log.info("stop: %s done at %.2f s", what, time.perf_counter() - t0)

        self.ingest.closing = True
        self.stop_event.set()
        if self.http:
            self.http.stop()
        if self.grpc:
            self.grpc.stop(grace=2.0)
        self.spool.close()  # everything acknowledged is on disk
        step("receivers, spool")
        self.loader.stop()  # stores the batches being decoded; the rest loads at the next start
        step("loader")
        deadline = time.monotonic() + 5
        for t in self.threads:
            while t.is_alive() and time.monotonic() < deadline:
                snap_cur = getattr(self, "_snap_cur", None)
                if t.name == "snapshot" and snap_cur is not None:
                    try:  # a snapshot copy in progress (its cost grows with the store) is abandoned
                        snap_cur.interrupt()
                    except Exception:  # noqa: BLE001 - nothing running to interrupt
                        pass
                t.join(timeout=0.1)
        step("threads")
        self.writer.close()
        step("writer")
        if self.health_srv:
            self.health_srv.shutdown()
        self.stuck = [t.name for t in self.threads if t.is_alive()]
        if self.stuck:
            # a DuckDB statement that ignores interrupts (e.g. a snapshot's DETACH writing the copy) is still
            # running: closing the store under it would abort the process. Everything is committed (spans,
            # scrapes, KV events are in the store's WAL, replayed at the next open); run_forever ends the
            # process at once.
            log.warning("stop: %s still running; exiting without closing the store", ", ".join(self.stuck))
            return
        budget = float(self.settings.collect_stop_refresh_s)
        if self.derive is not None and budget > 0:
            try:
                self.derive(self.con, budget_s=budget)
            except Exception:  # noqa: BLE001 - readers derive what is stale; the next start refreshes
                self.health.write_errors.labels("derive").inc()
            step("derived tables")
        self.con.close()
        step("store closed")
        if self.fleet.snapshot_every_s > 0:
            self._point_snapshot_at_store()

    def _point_snapshot_at_store(self) -> None:
        """Replace the read snapshot by a link to the closed store: readers see everything, at no copy."""
        snap, db = Path(self.snapshot_path), Path(self.db).resolve()
        if snap.resolve() == db:
            return
        tmp = snap.with_name(snap.name + f".link{os.getpid()}")
        try:
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(db)
            os.replace(tmp, snap)
        except OSError:
            self.health.write_errors.labels("snapshot").inc()


def default_spool_dir(db: str) -> str:
    p = Path(db)
    return str(p.with_name(p.name + ".spool"))


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
            if getattr(svc, "stuck", None):
                logging.shutdown()
                os._exit(0)
