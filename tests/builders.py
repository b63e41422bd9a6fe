"""Row builders shared by the tests: OTLP/JSON spans as senders write them (the importer's input) and span rows
written straight into a store (the metrics' input). One encoder each, so a change of convention is made once."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from stores import new_store

from agentobs.store import segments
from agentobs.store.db import transaction
from agentobs.store.writer import Writer

# -- OTLP/JSON (docs/span-conventions.md): what `agentobs import otlp` and the receivers take -----------------


def attr(k: str, v: Any) -> dict:
    """One OTLP/JSON attribute: bool, int (as a string, as protobuf's JSON mapping writes int64), float, a list of
    numbers (an array of doubles) or text."""
    if isinstance(v, bool):
        val = {"boolValue": v}
    elif isinstance(v, int):
        val = {"intValue": str(v)}
    elif isinstance(v, float):
        val = {"doubleValue": v}
    elif isinstance(v, list):
        val = {"arrayValue": {"values": [{"doubleValue": float(x)} for x in v]}}
    else:
        val = {"stringValue": str(v)}
    return {"key": k, "value": val}


def attrs(d: dict[str, Any]) -> list[dict]:
    return [attr(k, v) for k, v in d.items()]


def ns(t_s: float) -> int:
    """Epoch seconds as nanoseconds, rounded."""
    return int(round(t_s * 1e9))


def span(trace: str, span_id: str, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any], *,
         parent: str | None = None, kind: int = 3, error: str | None = None, events: list[dict] | None = None) -> dict:
    """One OTLP/JSON span (times in epoch nanoseconds, written as OTLP's decimal strings); ``error`` is a status
    message (status code 2, ERROR); ``events`` are ``{"name", "time_ns", "attributes"}``."""
    s = {"traceId": trace, "spanId": span_id, "name": name, "kind": kind,
         "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(end_ns),
         "attributes": attrs(attributes), "status": {"code": 2, "message": error} if error else {}}
    if parent:
        s["parentSpanId"] = parent
    if events:
        s["events"] = [{"name": e["name"], "timeUnixNano": str(e["time_ns"]), "attributes": attrs(e["attributes"])}
                       for e in events]
    return s


def resource_spans(service: str, scope: str, spans: list[dict], **resource_attrs: Any) -> dict:
    """One resource (``service.name`` and any other resource attributes) with one scope of spans."""
    return {"resource": {"attributes": attrs({"service.name": service, **resource_attrs})},
            "scopeSpans": [{"scope": {"name": scope}, "spans": spans}]}


def otlp_request(*resources: dict) -> dict:
    """An ExportTraceServiceRequest in OTLP/JSON."""
    return {"resourceSpans": list(resources)}


# -- span rows written straight into a store (the golden metric tests' inputs) -------------------------------

T0 = 1_800_000_000.0  # epoch seconds; the times of ``call`` are relative to it


def ts(s: float) -> dt.datetime:
    """T0 + s as the store's naive-UTC timestamp."""
    return dt.datetime.fromtimestamp(T0 + s, dt.UTC).replace(tzinfo=None)


def call(cid, sess, start, end, P, C, O=100,  # noqa: E741 - METRICS.md notation
         inst="A:8000", attempt=None, branch=None, ttft=0.5, status=0,
         itl=None, hashes=None, task="t1", model="Qwen/Qwen3-32B", sys_tokens=None, tool_tokens=None):
    """A gateway chat span row: call ``cid`` of session ``sess`` from T0 + start to T0 + end, prompt P, cached C,
    output O; status 2 is a failed call (error type "timeout")."""
    return {
        "trace_id": f"tr-{task}", "span_id": cid, "parent_span_id": None, "name": "chat m", "kind": 3,
        "start_ns": int((T0 + start) * 1e9), "end_ns": int((T0 + end) * 1e9), "status_code": status,
        "role": "gateway", "op": "chat", "session_id": sess, "task_id": task, "attempt": attempt, "branch": branch,
        "instance": inst, "model": model, "input_tokens": P, "cached_tokens": C, "output_tokens": O,
        "ttft_s": ttft, "itl_ms": itl, "block_hashes": hashes, "system_tokens": sys_tokens,
        "tool_def_tokens": tool_tokens, "error_type": "timeout" if status == 2 else None,
    }


SPAN_TYPES = {
    "trace_id": pa.string(), "span_id": pa.string(), "parent_span_id": pa.string(), "name": pa.string(),
    "kind": pa.int8(), "start_ns": pa.int64(), "end_ns": pa.int64(), "status_code": pa.int8(), "role": pa.string(),
    "op": pa.string(), "session_id": pa.string(), "task_id": pa.string(), "attempt": pa.int32(),
    "branch": pa.string(), "instance": pa.string(), "model": pa.string(), "input_tokens": pa.int64(),
    "cached_tokens": pa.int64(), "output_tokens": pa.int64(), "ttft_s": pa.float64(),
    "itl_ms": pa.list_(pa.float64()), "block_hashes": pa.list_(pa.string()), "system_tokens": pa.int64(),
    "tool_def_tokens": pa.int64(), "error_type": pa.string(),
}


def make_db(tmp_path, calls, config=(), kv=(), samples=()) -> str:
    """A store at tmp_path/m.duckdb holding ``calls`` (rows of ``call``), engine config rows (instance, engine, key,
    value), KV events (instance, t, type, hashes, session[, parent block hash]) and metric samples (instance, t,
    metric, labels, value); times relative to T0."""
    path = str(tmp_path / "m.duckdb")
    con = new_store(path)
    with Writer(con, flush_s=0.01) as w:
        if calls:
            w.write("spans", pa.table({k: pa.array([c[k] for c in calls], t) for k, t in SPAN_TYPES.items()}))
        if config:
            w.write("engine_config", pa.table({
                "instance": [c[0] for c in config], "ts": [ts(0)] * len(config), "engine": [c[1] for c in config],
                "key": [c[2] for c in config], "value": [c[3] for c in config], "source": ["test"] * len(config)}))
        if kv:
            w.write("kv_events", pa.table({
                "instance": [e[0] for e in kv], "ts": [ts(e[1]) for e in kv], "seq": list(range(len(kv))),
                "event_idx": [0] * len(kv), "type": [e[2] for e in kv],
                "block_hashes": pa.array([e[3] for e in kv], pa.list_(pa.string())),
                "session_id": pa.array([e[4] for e in kv], pa.string()),
                "parent_block_hash": pa.array([e[5] if len(e) > 5 else None for e in kv], pa.string())}))
        if samples:
            w.write("metric_samples", pa.table({
                "ts": [ts(s[1]) for s in samples], "instance": [s[0] for s in samples],
                "metric": [s[2] for s in samples],
                "labels": pa.array([list(s[3].items()) for s in samples], pa.map_(pa.string(), pa.string())),
                "labels_key": [",".join(f"{k}={v}" for k, v in sorted(s[3].items())) for s in samples],
                "value": [float(s[4]) for s in samples], "engine": [s[2].split(":")[0] for s in samples]}))
    con.close()
    return path


# -- span rows in the store's own layout (agentobs/store/segments.py: the table part and Parquet segments) -------


def span_rows(ids: list[tuple[str, str, int]], name: str = "a") -> pa.Table:
    """Span rows in the collector's schema (agentobs.collect.otlp.SPAN_SCHEMA): (trace_id, span_id, start_ns) each,
    every row named ``name``, the other columns empty."""
    from agentobs.collect.otlp import SPAN_SCHEMA

    cols = {f.name: pa.nulls(len(ids), f.type) for f in SPAN_SCHEMA}
    cols["trace_id"] = pa.array([i[0] for i in ids])
    cols["span_id"] = pa.array([i[1] for i in ids])
    cols["start_ns"] = pa.array([i[2] for i in ids], pa.int64())
    cols["name"] = pa.array([name] * len(ids))
    return pa.table(cols, schema=SPAN_SCHEMA)


def publish_segment(con, table: pa.Table, spool: tuple[int, int] = (1, 0), with_seq: bool = False) -> str:
    """What the collector's loader does with a decoder's segment (span_store = segments): the Parquet file written
    beside the store ``con`` has open and renamed to its sequence number, then its catalog row and the spans view
    in one transaction. ``with_seq``: written with its column ``_seg``, as the loader writes it (a release before
    wrote none). Returns the file's path."""
    db = con.sql("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()[0][0]
    seq = segments.next_seq(con)
    seg = segments.write_segment(table, segments.segments_dir(db), seq if with_seq else None)
    f = segments.publish_file(seg, seq)
    with transaction(con):
        segments.add(con, seq, f, seg, spool)
    return f
