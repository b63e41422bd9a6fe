"""Writing OTLP spans and Prometheus expositions into the exporter's tables, row for row as the
OpenTelemetry Collector would (ClickHouse exporter; Prometheus receiver without name normalization).

For tests, the bench and `agentobs clickhouse load` (a fleet that has no collector yet). The mapping:
- attributes → Map(String, String) with pcommon ``Value.AsString()``: ints in decimal, doubles in the
  shortest positional form, bools ``true``/``false``, arrays and maps as JSON;
- ``SpanKind`` ``Server``/``Client``/…, ``StatusCode`` ``Unset``/``Ok``/``Error``, ``Duration`` in ns;
- counters → otel_metrics_sum (cumulative, monotonic, named as exposed: ``…_total``), gauges →
  otel_metrics_gauge, histograms → otel_metrics_histogram (per-bucket counts, explicit bounds);
  ``instance`` → resource attribute ``service.instance.id``.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import numpy as np
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from ...collect.prom import canonical_name

KINDS = ["Unspecified", "Internal", "Server", "Client", "Producer", "Consumer"]
STATUS = ["Unset", "Ok", "Error"]
MAP = pa.map_(pa.string(), pa.string())


def as_string(v) -> str:
    """pcommon.Value.AsString() of a decoded attribute value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "+Inf" if v > 0 else "-Inf"
        return np.format_float_positional(v, trim="-")
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"))
    return "" if v is None else str(v)


def _map(d: dict | None) -> list[tuple[str, str]]:
    return [(k, as_string(v)) for k, v in (d or {}).items()]


def traces_rows(spans: pa.Table) -> pa.Table:
    """otel_traces rows from a decoded spans table (agentobs.collect.otlp.decode_json/decode_protobuf)."""
    d = spans.to_pydict()
    n = spans.num_rows
    ev_ts, ev_name, ev_attrs = [], [], []
    for e in d["events"]:
        evs = json.loads(e) if e else []
        ev_ts.append([dt.datetime.fromtimestamp(x.get("time_ns", 0) / 1e9, dt.UTC) for x in evs])
        ev_name.append([x.get("name", "") for x in evs])
        ev_attrs.append([_map(x.get("attributes")) for x in evs])
    res = [json.loads(r) if r else {} for r in d["resource"]]
    ts_type = pa.timestamp("ns", tz="UTC")
    return pa.table({
        "Timestamp": pa.array(d["start_ns"], pa.int64()).cast(ts_type),
        "TraceId": d["trace_id"], "SpanId": d["span_id"],
        "ParentSpanId": [p or "" for p in d["parent_span_id"]],
        "TraceState": [""] * n, "SpanName": [x or "" for x in d["name"]],
        "SpanKind": [KINDS[k] if k is not None and 0 <= k < 6 else "Unspecified" for k in d["kind"]],
        "ServiceName": [r.get("service.name", "") if isinstance(r.get("service.name"), str) else "" for r in res],
        "ResourceAttributes": pa.array([_map(r) for r in res], MAP),
        "ScopeName": [x or "" for x in d["scope_name"]], "ScopeVersion": [""] * n,
        "SpanAttributes": pa.array([_map(json.loads(a) if a else {}) for a in d["attributes"]], MAP),
        "Duration": pa.array([max(0, (e or 0) - (s or 0)) for s, e in zip(d["start_ns"], d["end_ns"], strict=True)],
                             pa.uint64()),
        "StatusCode": [STATUS[c] if c in (0, 1, 2) else "Unset" for c in d["status_code"]],
        "StatusMessage": [x or "" for x in d["status_message"]],
        "Events.Timestamp": pa.array(ev_ts, pa.list_(ts_type)),
        "Events.Name": pa.array(ev_name, pa.list_(pa.string())),
        "Events.Attributes": pa.array(ev_attrs, pa.list_(MAP)),
    })


def _metric_common(name: str, fam, instance: str, labels: dict, t: dt.datetime) -> dict:
    return {
        "ResourceAttributes": [("service.instance.id", instance), ("service.name", "agentobs")],
        "ServiceName": "agentobs", "MetricName": name, "MetricDescription": fam.documentation or "",
        "MetricUnit": "", "Attributes": list(labels.items()), "StartTimeUnix": t, "TimeUnix": t,
    }


def metrics_rows(text: str, instance: str, at: float) -> dict[str, pa.Table]:
    """{table: rows} for one Prometheus exposition scraped at ``at`` (epoch seconds). A counter's ``*_created``
    sample becomes its ``StartTimeUnix`` (as the Collector's Prometheus receiver does; else the scrape time)."""
    t = dt.datetime.fromtimestamp(at, dt.UTC)
    families = list(text_string_to_metric_families(text))
    created = {(canonical_name(s.name)[:-len("_created")], tuple(sorted(s.labels.items()))): s.value
               for fam in families for s in fam.samples if canonical_name(s.name).endswith("_created")}
    gauge, total, hist = [], [], []
    for fam in families:
        if fam.type == "histogram":
            series: dict[tuple, dict] = {}
            for s in fam.samples:
                labels = {k: v for k, v in s.labels.items() if k != "le"}
                key = tuple(sorted(labels.items()))
                h = series.setdefault(key, {"labels": labels, "buckets": [], "count": 0, "sum": 0.0})
                if s.name.endswith("_bucket"):
                    h["buckets"].append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    h["count"] = s.value
                elif s.name.endswith("_sum"):
                    h["sum"] = s.value
            for h in series.values():
                b = sorted(h["buckets"])
                cum = [v for _, v in b]
                per = [int(c - (cum[i - 1] if i else 0)) for i, c in enumerate(cum)]
                row = _metric_common(canonical_name(fam.name), fam, instance, h["labels"], t)
                row.update(Count=int(h["count"]), Sum=float(h["sum"]), BucketCounts=per,
                           ExplicitBounds=[le for le, _ in b if not math.isinf(le)], AggregationTemporality=2)
                hist.append(row)
            continue
        for s in fam.samples:
            name = canonical_name(s.name)
            if name.endswith("_created"):
                continue
            row = _metric_common(name, fam, instance, dict(s.labels), t)
            row["Value"] = float(s.value)
            if fam.type == "counter":
                row.update(AggregationTemporality=2, IsMonotonic=True)
                c = created.get((name.removesuffix("_total"), tuple(sorted(s.labels.items()))))
                if c is not None:  # nanoseconds, so the time reads back as the float the engine printed
                    row["StartTimeUnix"] = int(round(c * 1e9))
                total.append(row)
            else:
                gauge.append(row)
    out = {}
    for table, rows in (("otel_metrics_gauge", gauge), ("otel_metrics_sum", total), ("otel_metrics_histogram", hist)):
        if rows:
            cols = {k: [r[k] for r in rows] for k in rows[0]}
            for k in ("ResourceAttributes", "Attributes"):
                cols[k] = pa.array(cols[k], MAP)
            for k in ("StartTimeUnix", "TimeUnix"):
                ns = [v if isinstance(v, int) else int(v.timestamp()) * 10**9 + v.microsecond * 1000 for v in cols[k]]
                cols[k] = pa.array(ns, pa.int64()).cast(pa.timestamp("ns", tz="UTC"))
            out[table] = pa.table(cols)
    return out


def from_duckdb(con, ch, batch_rows: int = 200_000) -> dict[str, int]:
    """Copy a DuckDB store (agentobs.store) into ClickHouse, {table: rows}: spans → ``otel_traces`` as the
    exporter would write them (the materialized view resolves them again), metric samples straight into
    ``metric_samples`` (the shape the exporter's metric views produce), ``engine_config`` and ``kv_events``
    into the side tables. ``vllm:cache_config_info`` samples are left out: their labels are in
    ``engine_config`` already, and the ClickHouse ``engine_config`` view would derive them a second time.
    For moving a store to ClickHouse and for tests that compare the two engines on the same data."""
    copies = (
        ("otel_traces", "SELECT * FROM spans ORDER BY trace_id, span_id", traces_rows),
        ("metric_samples", "SELECT ts, instance, metric, labels, labels_key, value, engine FROM metric_samples "
                           "WHERE metric <> 'vllm:cache_config_info'", None),
        ("agentobs_engine_config", "SELECT instance, ts, engine, key, value, source FROM engine_config", None),
        ("agentobs_kv_events", "SELECT instance, ts, seq, event_idx, type, block_hashes, parent_block_hash, "
                               "num_tokens, block_size, medium, session_id, lora_name FROM kv_events", None),
    )
    out = {}
    for table, sql, convert in copies:
        n = 0
        reader = con.cursor().sql(sql).to_arrow_reader(batch_rows)
        for batch in reader:
            t = pa.Table.from_batches([batch])
            if not t.num_rows:
                continue
            ch.insert_arrow(table, convert(t) if convert else t)
            n += t.num_rows
        out[table] = n
    return out
