"""``agentobs exporter``: the derived agent metrics as a Prometheus /metrics endpoint.

A background thread recomputes a snapshot every ``exporter_refresh_s`` from a fresh read-only connection
(point ``--db`` at the read snapshot ``agentobs collect`` publishes) over the calls that started in the last
``exporter_window_s``; a custom collector serves the cached snapshot, so a scrape never waits for DuckDB.

Every derived series has the labels ``dimension`` (instance | model | task_type) and ``group`` (the value).
The engine's address is a label *value* (``group``), not the ``instance`` label, which Prometheus sets to
the exporter's own target. The values are the metrics API's (``agentobs.metrics``) for the same window.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from .config import Settings, load_settings
from .source import Source, as_source, require

log = logging.getLogger(__name__)

DIMENSIONS = ("instance", "model", "task_type")


@dataclass(frozen=True)
class Derived:
    """One exported family: ``metric``'s column ``column`` (÷ window hours when ``per_hour``)."""

    name: str
    help: str
    metric: str
    column: str
    per_hour: bool = False
    extra: tuple[tuple[str, str], ...] = ()


DERIVED = (
    Derived("agentobs_session_reuse_hit_rate", "Reuse hit rate U = ΣC/ΣR_eff of session calls 2…n (METRICS.md §2), "
            "ratio 0-1, calls starting in the window", "reuse", "reuse_hit_rate"),
    Derived("agentobs_session_hit_rate", "Session hit rate H = ΣC/ΣP (METRICS.md §2), ratio 0-1", "reuse", "hit_rate"),
    Derived("agentobs_reprefill_token_share", "Re-prefill token share ΣX/(ΣX+ΣC) of cache-related tokens "
            "(METRICS.md §3), ratio 0-1", "reprefill", "share_of_cache_tokens"),
    Derived("agentobs_reprefill_computed_share", "Re-prefill share of computed prefill ΣX/Σ(P-C) (METRICS.md §3), "
            "ratio 0-1", "reprefill", "share_of_computed_prefill"),
    Derived("agentobs_reprefill_cost_share", "Recompute tax share of GPU-time spend cost(X)/cost (METRICS.md §3, §8)",
            "reprefill", "cost_share"),
    Derived("agentobs_recompute_tax_usd_per_hour", "Re-prefill cost X/prefill_tps x $/s over the window, USD per hour "
            "(GPU-time basis, METRICS.md §8)", "reprefill", "reprefill_cost_usd", per_hour=True),
    Derived("agentobs_spend_usd_per_hour", "GPU-time cost ((P-C)/prefill_tps + O/decode_tps) x $/s over the window, "
            "USD per hour (METRICS.md §8)", "reprefill", "cost_usd", per_hour=True),
    Derived("agentobs_idle_kv_rent_usd_per_hour", "Idle KV rent over the window, USD per hour: kind=paid (retained "
            "windows K*g) or wasted (evicted windows, KV events only); basis $/s / KV capacity (METRICS.md §4)",
            "idle_kv_rent", "rent_paid_usd", per_hour=True, extra=(("kind", "paid"),)),
    Derived("agentobs_idle_kv_rent_usd_per_hour", "", "idle_kv_rent", "rent_wasted_usd", per_hour=True,
            extra=(("kind", "wasted"),)),
    Derived("agentobs_calls", "Model calls that started in the window", "reprefill", "calls"),
    Derived("agentobs_reprefill_tokens", "Re-prefill tokens ΣX of calls that started in the window (METRICS.md §1)",
            "reprefill", "reprefill_tokens"),
)


# the recompute-tax ledger (agentobs.findings.build) of the same window: the numbers `agentobs findings --since
# START --until END` prints, the console and the report show
LEDGER_FAMILIES = (
    ("agentobs_recompute_tax_usd_per_week", "The fleet's recompute tax: every re-prefill token of the window at its "
     "GPU-time cost, scaled to a week (agentobs findings; docs/findings.md)", ()),
    ("agentobs_recompute_tax_by_cause_usd_per_week", "Recompute tax per week by miss cause (METRICS.md §1)",
     ("cause",)),
    ("agentobs_finding_tax_usd_per_week", "A finding's tax per week: the re-prefill (or rent) of the calls it owns; "
     "each call owned by at most one finding", ("finding", "rule", "severity")),
    ("agentobs_finding_recoverable_usd_per_week", "What a finding's fix recovers of its tax, per week (≤ the tax)",
     ("finding", "rule", "severity")),
    ("agentobs_finding_sessions", "Sessions with a call the finding owns", ("finding", "rule", "severity")),
)


@dataclass
class Snapshot:
    computed_at: float  # clock time the window ends at
    window_s: float
    duration_s: float
    # family name -> [(labels, value)]
    series: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)


def compute_snapshot(db: Source, settings: Settings, clock: Callable[[], float] = time.time,
                     window_s: float | None = None) -> Snapshot:
    """The derived metrics of the calls that started in ``[now − window_s, now)``."""
    from .metrics import names, prepare

    db = require(db, "agentobs.exporter.compute_snapshot")
    window_s = float(window_s if window_s is not None else settings.exporter_window_s)
    t0 = time.perf_counter()
    now = clock()
    hours = window_s / 3600.0
    available = set(names())
    run, close = prepare(db, since=now - window_s, until=now, settings=settings, clock=lambda: now)
    series: dict[str, list[tuple[dict[str, str], float]]] = {d.name: [] for d in DERIVED}
    try:
        frames = {}
        for metric in sorted({d.metric for d in DERIVED} & available):
            for dim in DIMENSIONS:
                frames[(metric, dim)] = run.compute(metric, dim)
        ledger = _ledger(db, now - window_s, now, settings)  # shares the run prepared above (same window)
    finally:
        close()
    series.update(ledger_series(ledger))
    for d in DERIVED:
        for dim in DIMENSIONS:
            df = frames.get((d.metric, dim))
            if df is None or d.column not in df.columns:
                continue
            for group, v in zip(df[dim].to_list(), df[d.column].to_list(), strict=True):
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    continue  # unknown is absent, never 0
                labels = {"dimension": dim, "group": "(none)" if group is None else str(group), **dict(d.extra)}
                series[d.name].append((labels, float(v) / hours if d.per_hour else float(v)))
    return Snapshot(now, window_s, time.perf_counter() - t0, series)


def _ledger(db, since: float, until: float, settings: Settings):
    from .findings import build

    try:
        return build(db, since=since, until=until, settings=settings, clock=lambda: until)
    except Exception as e:  # noqa: BLE001 - the derived metrics still serve without the ledger
        log.warning("exporter: recompute-tax ledger failed: %s", e)
        return None


def ledger_series(ledger) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The ledger's figures as exporter series (LEDGER_FAMILIES); empty families when there is no ledger."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name, _h, _l in LEDGER_FAMILIES}
    if ledger is None:
        return out
    out["agentobs_recompute_tax_usd_per_week"].append(({}, ledger.usd_week))
    for c in ledger.by_cause:
        out["agentobs_recompute_tax_by_cause_usd_per_week"].append(({"cause": c.cause}, c.usd_week))
    for f in ledger.findings:
        labels = {"finding": f.id, "rule": f.rule, "severity": f.severity}
        if f.tax.usd_week is not None:
            out["agentobs_finding_tax_usd_per_week"].append((labels, f.tax.usd_week))
        if f.recoverable.usd_week is not None:
            out["agentobs_finding_recoverable_usd_per_week"].append((labels, f.recoverable.usd_week))
        if f.sessions is not None:
            out["agentobs_finding_sessions"].append((labels, float(f.sessions)))
    return out


class DerivedCollector:
    """A prometheus_client collector serving the latest snapshot; ``start()`` refreshes it in a thread."""

    def __init__(self, db: Source, settings: Settings | None = None, clock: Callable[[], float] = time.time,
                 refresh_s: float | None = None, window_s: float | None = None):
        self.db = require(db, "agentobs.exporter.DerivedCollector")
        self.settings = settings if settings is not None else load_settings()
        self.clock = clock
        self.refresh_s = float(refresh_s if refresh_s is not None else self.settings.exporter_refresh_s)
        self.window_s = float(window_s if window_s is not None else self.settings.exporter_window_s)
        self.snapshot: Snapshot | None = None
        self.errors = 0
        self.last_error = ""
        self.refreshes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshed = threading.Condition(self._lock)

    def refresh(self) -> bool:
        """Recompute now; on failure keep serving the previous snapshot and count the error."""
        try:
            snap = compute_snapshot(self.db, self.settings, self.clock, self.window_s)
        except Exception as e:  # noqa: BLE001 - a bad refresh must not kill the exporter
            log.warning("exporter refresh failed: %s", e)
            with self._lock:
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
                self.refreshes += 1
                self.refreshed.notify_all()
            return False
        with self._lock:
            self.snapshot = snap
            self.refreshes += 1
            self.refreshed.notify_all()
        return True

    def wait_refreshes(self, n: int, timeout: float = 30.0) -> bool:
        """Block until ``n`` refreshes (successful or not) have happened."""
        with self._lock:
            return self.refreshed.wait_for(lambda: self.refreshes >= n, timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_s)

    def start(self) -> DerivedCollector:
        self._thread = threading.Thread(target=self._loop, name="agentobs-exporter-refresh", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snap, errors = self.snapshot, self.errors
        yield CounterMetricFamily("agentobs_exporter_refresh_errors", "Snapshot refreshes that failed "
                                  "(the previous snapshot keeps being served)", value=errors)
        up = GaugeMetricFamily("agentobs_exporter_snapshot_timestamp_seconds",
                               "End of the window of the snapshot being served (Unix time); absent before the first")
        if snap is None:
            yield up
            return
        up.add_metric([], snap.computed_at)
        yield up
        yield GaugeMetricFamily("agentobs_exporter_window_seconds", "Length of the window the derived metrics cover",
                                value=snap.window_s)
        yield GaugeMetricFamily("agentobs_exporter_snapshot_duration_seconds", "Time the last snapshot took",
                                value=snap.duration_s)
        done = set()
        for d in DERIVED:
            if d.name in done:
                continue
            done.add(d.name)
            label_names = ["dimension", "group", *[k for k, _ in d.extra]]
            fam = GaugeMetricFamily(d.name, d.help, labels=label_names)
            for labels, v in snap.series.get(d.name, []):
                fam.add_metric([labels[k] for k in label_names], v)
            yield fam
        for name, help_text, ledger_labels in LEDGER_FAMILIES:
            fam = GaugeMetricFamily(name, help_text, labels=list(ledger_labels))
            for labels, v in snap.series.get(name, []):
                fam.add_metric([labels[k] for k in ledger_labels], v)
            yield fam


def serve(db, host: str = "127.0.0.1", port: int = 0, settings: Settings | None = None,
          clock: Callable[[], float] = time.time, refresh_s: float | None = None, window_s: float | None = None):
    """Start the refresh thread and the HTTP server; returns (server, collector). ``server.server_port``
    is the bound port (``port=0`` picks a free one). Stop with ``server.shutdown(); collector.stop()``."""
    from prometheus_client.exposition import start_http_server

    collector = DerivedCollector(as_source(db), settings, clock, refresh_s, window_s)  # the edge
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    collector.start()
    return server, collector
