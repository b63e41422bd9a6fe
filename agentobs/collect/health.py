"""The collector's own health metrics, served on a Prometheus endpoint by prometheus-client.

One ``Health`` object (its own ``CollectorRegistry``) is handed to every collector component; tests
read values back with ``health.value(name, labels)``. Names are prefixed ``agentobs_``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LAT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Health:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.spans_received = Counter("agentobs_otlp_spans_received", "Spans acknowledged (durable in the spool), by transport.",
                                      ["transport"], registry=r)
        self.spans_rejected = Counter("agentobs_otlp_spans_rejected", "Spans not stored, by reason.", ["reason"],
                                      registry=r)
        self.requests = Counter("agentobs_otlp_requests", "OTLP export requests by transport and outcome.",
                                ["transport", "outcome"], registry=r)
        self.spool_bytes = Gauge("agentobs_spool_unloaded_bytes", "OTLP request bytes spooled and not yet stored.",
                                 registry=r)
        self.inflight_bytes = Gauge("agentobs_otlp_inflight_bytes", "Request body bytes being read, checked or "
                                    "spooled (receiver_max_inflight_mb).", registry=r)
        self.connections = Gauge("agentobs_otlp_http_connections", "Open OTLP/HTTP connections (one thread each).",
                                 registry=r)
        self.connections_closed = Counter("agentobs_otlp_http_connections_closed", "OTLP/HTTP connections the "
                                          "receiver closed, by reason (idle_timeout, read_timeout, evicted: idle "
                                          "one closed for a new one at receiver_max_connections).", ["reason"],
                                          registry=r)
        self.scrapes = Counter("agentobs_scrapes", "Scrape attempts by outcome (ok/error).", ["outcome"], registry=r)
        self.scrape_errors = Counter("agentobs_scrape_errors", "Failed scrapes by target and reason.",
                                     ["target", "reason"], registry=r)
        self.scrape_drops = Counter("agentobs_scrape_drops", "Scrapes skipped, by reason (overrun: previous one "
                                    "still running).", ["reason"], registry=r)
        self.scrape_seconds = Histogram("agentobs_scrape_duration_seconds", "Scrape fetch+parse time.",
                                        buckets=_LAT, registry=r)
        self.config_changes = Counter("agentobs_engine_config_changes", "Engine config snapshots stored (on change).",
                                      ["source"], registry=r)
        self.kv_events = Counter("agentobs_kv_events", "KV events stored, by instance.", ["instance"], registry=r)
        self.kv_rejected = Counter("agentobs_kv_events_rejected", "KV events or batches not decodable.",
                                   ["instance"], registry=r)
        self.kv_gaps = Counter("agentobs_kv_event_gaps", "KV event batches missed (sequence gaps), by instance.",
                               ["instance"], registry=r)
        self.kv_replayed = Counter("agentobs_kv_event_replayed", "KV event batches recovered by replay.",
                                   ["instance"], registry=r)
        self.kv_topic_mismatch = Counter("agentobs_kv_topic_mismatch", "KV event messages not stored: their topic "
                                         "is not the fleet file's (kv_events topic), by instance and topic seen.",
                                         ["instance", "topic"], registry=r)
        self.commit_seconds = Histogram("agentobs_writer_commit_seconds", "Writer batch commit latency.",
                                        buckets=_LAT, registry=r)
        self.rows_committed = Counter("agentobs_writer_rows", "Rows inserted by the writer.", registry=r)
        self.write_errors = Counter("agentobs_write_errors", "Batches the store refused, by component.",
                                    ["component"], registry=r)
        self.span_files = Gauge("agentobs_span_files", "span_store = segments: Parquet span files listed, by kind "
                                "(segment: the unmerged tail, read deduplicated; merged).", ["kind"], registry=r)
        self.span_merges = Counter("agentobs_span_merges", "Merges of span files committed, by kind (segments: tail "
                                   "segments into a merged file; again: merged files merged again; promoted: large tail segments "
                                   "listed as merged files as they are, nothing rewritten).", ["kind"],
                                   registry=r)
        self.snapshot_seconds = Gauge("agentobs_snapshot_seconds", "Duration of the last read snapshot.", registry=r)
        self.snapshot_ts = Gauge("agentobs_snapshot_timestamp_seconds", "When the last read snapshot was published.",
                                 registry=r)

    def on_commit(self, seconds: float, rows: int) -> None:
        """Writer callback."""
        self.commit_seconds.observe(seconds)
        self.rows_committed.inc(rows)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        v = self.registry.get_sample_value(name, labels or {})
        return 0.0 if v is None else v

    def serve(self, host: str, port: int):
        """Start the /metrics endpoint; returns (server, thread)."""
        return start_http_server(port, addr=host, registry=self.registry)
