"""OTLP trace decoding: protobuf and OTLP/JSON into rows of the ``spans`` table.

Used by the file importer and the live receiver alike. Decoding never raises on bad spans: each
bad span is rejected with a message naming where it was (``resourceSpans[0].scopeSpans[1].spans[3]``)
and the valid rest is kept. Only a payload that cannot be parsed at all raises ``InputError``.

OTLP/JSON follows the OTLP rules (hex trace/span ids, int64 as decimal strings, enums as ints);
base64 ids (the plain protobuf JSON mapping, which some exporters use) are accepted too.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import msgspec
import pyarrow as pa
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..config import Settings
from ..errors import InputError
from .normalize import COLUMNS, alias_keys, promote_row

SPAN_SCHEMA = pa.schema(
    [
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("parent_span_id", pa.string()),
        ("name", pa.string()),
        ("kind", pa.int8()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("status_code", pa.int8()),
        ("status_message", pa.string()),
        ("service_name", pa.string()),
        ("scope_name", pa.string()),
        ("resource", pa.string()),
        ("attributes", pa.string()),
        ("events", pa.string()),
        ("role", pa.string()),
        ("op", pa.string()),
        ("session_id", pa.string()),
        ("task_id", pa.string()),
        ("task_type", pa.string()),
        ("tenant", pa.string()),
        ("agent_name", pa.string()),
        ("attempt", pa.int32()),
        ("branch", pa.string()),
        ("model", pa.string()),
        ("provider", pa.string()),
        ("engine", pa.string()),
        ("instance", pa.string()),
        ("response_id", pa.string()),
        ("request_id", pa.string()),
        ("input_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("system_tokens", pa.int64()),
        ("tool_def_tokens", pa.int64()),
        ("ttft_s", pa.float64()),
        ("queue_s", pa.float64()),
        ("prefill_s", pa.float64()),
        ("decode_s", pa.float64()),
        ("finish_reason", pa.string()),
        ("error_type", pa.string()),
        ("tool_name", pa.string()),
        ("itl_ms", pa.list_(pa.float64())),
        ("block_hashes", pa.list_(pa.string())),
        ("ingest_source", pa.string()),
    ]
)
_BASE = ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status_code",
         "status_message", "service_name", "scope_name", "resource", "attributes", "events")
assert set(_BASE) | set(COLUMNS) | {"ingest_source"} == set(SPAN_SCHEMA.names)

MAX_ATTR_BYTES = 64 * 1024  # longer string values are truncated (message contents can be huge)
_json_enc = msgspec.json.Encoder()


class Decoded:
    """Spans decoded from one payload, with what was rejected and why.

    Rows are collected as tuples in ``SPAN_SCHEMA`` order (cheap to append) and turned into the
    per-column lists of ``columns`` only when asked for."""

    def __init__(self) -> None:
        self._columns: dict[str, list] = {n: [] for n in SPAN_SCHEMA.names}
        self._rows: list[tuple] = []
        self.accepted = 0
        self.rejected = 0
        self.errors: list[str] = []
        self.warnings: list[str] = []

    @property
    def columns(self) -> dict[str, list]:
        if self._rows:
            for col, values in zip(self._columns.values(), zip(*self._rows, strict=True), strict=True):
                col.extend(values)
            self._rows = []
        return self._columns

    def table(self) -> pa.Table:
        if self._rows and not self._columns["trace_id"]:
            cols = list(zip(*self._rows, strict=True))  # rows only: skip the column lists
            return pa.table([pa.array(c, type=f.type) for c, f in zip(cols, SPAN_SCHEMA, strict=True)],
                            schema=SPAN_SCHEMA)
        return pa.table(self.columns, schema=SPAN_SCHEMA)

    def extend(self, other: Decoded) -> None:
        for k, v in other.columns.items():
            self.columns[k].extend(v)
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.errors.extend(other.errors)
        self.warnings.extend(other.warnings)


# -- ids ---------------------------------------------------------------------------------------
def _id_from_json(v: Any, nbytes: int, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what} must be a hex string, got {type(v).__name__}")
    if len(v) == nbytes * 2:
        try:
            bytes.fromhex(v)
            h = v.lower()
        except ValueError:
            raise ValueError(f"{what} {v!r} is not hex") from None
    else:
        try:
            raw = base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != nbytes:
            raise ValueError(f"{what} {v!r} must be {nbytes * 2} hex characters")
        h = raw.hex()
    if h == "0" * (nbytes * 2):
        raise ValueError(f"{what} is all zeros (invalid)")
    return h


def _id_from_bytes(b: bytes, nbytes: int, what: str) -> str:
    if len(b) != nbytes:
        raise ValueError(f"{what} must be {nbytes} bytes, got {len(b)}")
    h = b.hex()
    if h == "0" * (nbytes * 2):
        raise ValueError(f"{what} is all zeros (invalid)")
    return h


# -- attribute values --------------------------------------------------------------------------
def _json_any(v: Any) -> Any:
    if not isinstance(v, dict) or not v:
        return None
    if "stringValue" in v:
        s = v["stringValue"]
        return s[:MAX_ATTR_BYTES] if isinstance(s, str) and len(s) > MAX_ATTR_BYTES else s
    if "intValue" in v:
        iv = v["intValue"]
        try:
            return int(iv)
        except (TypeError, ValueError):
            raise ValueError(f"intValue {iv!r} is not an integer") from None
    if "doubleValue" in v:
        dv = v["doubleValue"]
        if isinstance(dv, str):  # "NaN", "Infinity" per proto3 JSON
            return float(dv)
        return dv
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_json_any(x) for x in (v["arrayValue"] or {}).get("values", []) or []]
    if "kvlistValue" in v:
        return {kv.get("key"): _json_any(kv.get("value")) for kv in (v["kvlistValue"] or {}).get("values", []) or []}
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def _json_attrs(lst: Any, where: str) -> dict[str, Any]:
    if lst is None:
        return {}
    if not isinstance(lst, list):
        raise ValueError(f"{where}.attributes must be a list")
    out = {}
    for kv in lst:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise ValueError(f"{where}.attributes has an entry without a string key: {str(kv)[:80]}")
        out[kv["key"]] = _json_any(kv.get("value"))
    return out


def _pb_any(v) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "string_value":
        s = v.string_value
        return s[:MAX_ATTR_BYTES] if len(s) > MAX_ATTR_BYTES else s
    if which == "int_value":
        return v.int_value
    if which == "double_value":
        return v.double_value
    if which == "bool_value":
        return v.bool_value
    if which == "array_value":
        return [_pb_any(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_any(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return None


def _pb_attrs(lst) -> dict[str, Any]:
    # the scalar cases inline (the hot path of the receiver); nested values via _pb_any
    out: dict[str, Any] = {}
    for kv in lst:
        v = kv.value
        which = v.WhichOneof("value")
        if which == "string_value":
            s = v.string_value
            out[kv.key] = s[:MAX_ATTR_BYTES] if len(s) > MAX_ATTR_BYTES else s
        elif which == "int_value":
            out[kv.key] = v.int_value
        elif which == "double_value":
            out[kv.key] = v.double_value
        elif which == "bool_value":
            out[kv.key] = v.bool_value
        else:
            out[kv.key] = _pb_any(v)
    return out


def _to_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or v is None:
        raise ValueError(f"{what} missing")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ValueError(f"{what} {v!r} is not an integer") from None


# -- shared row assembly -----------------------------------------------------------------------
def _add(
    out: Decoded,
    keys: tuple,
    source: str,
    where: str,
    trace_id: str,
    span_id: str,
    parent: str | None,
    name: str,
    kind: int,
    start_ns: int,
    end_ns: int,
    status_code: int,
    status_message: str | None,
    service: str | None,
    scope: str,
    resource: dict,
    attrs: dict,
    events: list[dict],
    resource_json: str | None = None,
) -> None:
    """One row; ``keys`` is ``normalize.alias_keys(settings)``. Raises ValueError for a bad span."""
    if end_ns and end_ns < start_ns:
        raise ValueError(f"endTimeUnixNano {end_ns} is before startTimeUnixNano {start_ns}")
    if start_ns <= 0:
        raise ValueError("startTimeUnixNano missing or zero")
    promoted, warns = promote_row(name, kind, start_ns, scope, service, resource, attrs, events, keys)
    out._rows.append((
        trace_id, span_id, parent, name, kind, start_ns, end_ns or start_ns, status_code, status_message or None,
        service, scope,
        resource_json if resource_json is not None else _json_enc.encode(resource).decode(),
        _json_enc.encode(attrs).decode(),
        _json_enc.encode(events).decode() if events else None,
        *promoted, source))
    out.accepted += 1
    for w in warns:
        out.warnings.append(f"{where} (span {span_id}): {w}")


def decode_protobuf(data: bytes, settings: Settings, source: str = "otlp", where: str = "payload") -> Decoded:
    try:
        req = ExportTraceServiceRequest.FromString(data)
    except DecodeError as e:
        raise InputError(f"not an OTLP ExportTraceServiceRequest protobuf ({e})", where) from e
    return decode_request(req, settings, source, where)


def decode_request(req: ExportTraceServiceRequest, settings: Settings, source: str = "otlp",
                   where: str = "payload") -> Decoded:
    out = Decoded()
    keys = alias_keys(settings)
    rows_append = out._rows.append
    enc = _json_enc.encode
    for ri, rs in enumerate(req.resource_spans):
        resource = _pb_attrs(rs.resource.attributes)
        resource_json = enc(resource).decode()
        service = resource.get("service.name")
        for si, ss in enumerate(rs.scope_spans):
            scope = ss.scope.name
            for pi, sp in enumerate(ss.spans):
                try:
                    tid = _id_from_bytes(sp.trace_id, 16, "traceId")
                    sid = _id_from_bytes(sp.span_id, 8, "spanId")
                    psid = sp.parent_span_id
                    parent = _id_from_bytes(psid, 8, "parentSpanId") if psid else None
                    start_ns = sp.start_time_unix_nano
                    end_ns = sp.end_time_unix_nano
                    if end_ns and end_ns < start_ns:
                        raise ValueError(f"endTimeUnixNano {end_ns} is before startTimeUnixNano {start_ns}")
                    if start_ns <= 0:
                        raise ValueError("startTimeUnixNano missing or zero")
                except ValueError as e:
                    out.rejected += 1
                    out.errors.append(f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]: {e}")
                    continue
                events = [
                    {"name": e.name, "time_ns": e.time_unix_nano, **({"attributes": _pb_attrs(e.attributes)} if e.attributes else {})}
                    for e in sp.events
                ] if sp.events else []
                attrs = _pb_attrs(sp.attributes)
                name = sp.name
                kind = sp.kind
                status = sp.status
                promoted, warns = promote_row(name, kind, start_ns, scope, service, resource, attrs, events, keys)
                rows_append((
                    tid, sid, parent, name, kind, start_ns, end_ns or start_ns, status.code, status.message or None,
                    service, scope, resource_json, enc(attrs).decode(), enc(events).decode() if events else None,
                    *promoted, source))
                out.accepted += 1
                for w in warns:
                    out.warnings.append(f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}] (span {sid}): {w}")
    return out


def decode_json_obj(doc: Any, settings: Settings, source: str = "otlp", where: str = "payload") -> Decoded:
    """Decode one OTLP/JSON ExportTraceServiceRequest already parsed into Python objects."""
    if not isinstance(doc, dict):
        raise InputError(f"expected a JSON object with resourceSpans, got {type(doc).__name__}", where)
    if "resourceSpans" not in doc:
        keys = ", ".join(list(doc)[:5]) or "nothing"
        raise InputError(f"not an OTLP trace export: no 'resourceSpans' key (found: {keys})", where)
    rss = doc["resourceSpans"]
    if not isinstance(rss, list):
        raise InputError("'resourceSpans' must be a list", where)
    out = Decoded()
    keys = alias_keys(settings)
    for ri, rs in enumerate(rss):
        rw = f"{where}: resourceSpans[{ri}]"
        try:
            if not isinstance(rs, dict):
                raise ValueError("must be an object")
            resource = _json_attrs((rs.get("resource") or {}).get("attributes"), "resource")
            scope_spans = rs.get("scopeSpans", rs.get("instrumentationLibrarySpans", []))
            if not isinstance(scope_spans, list):
                raise ValueError("scopeSpans must be a list")
        except (ValueError, AttributeError) as e:
            n = _count_spans(rs)
            out.rejected += n
            out.errors.append(f"{rw}: {e} ({n} spans rejected)")
            continue
        service = resource.get("service.name")
        for si, ss in enumerate(scope_spans):
            sw = f"{rw}.scopeSpans[{si}]"
            if not isinstance(ss, dict) or not isinstance(ss.get("spans", []), list):
                out.errors.append(f"{sw}: must be an object with a 'spans' list")
                out.rejected += 1
                continue
            scope = (ss.get("scope") or ss.get("instrumentationLibrary") or {}).get("name", "") or ""
            for pi, sp in enumerate(ss.get("spans", [])):
                w = f"{sw}.spans[{pi}]"
                try:
                    if not isinstance(sp, dict):
                        raise ValueError("span must be an object")
                    tid = _id_from_json(sp.get("traceId"), 16, "traceId")
                    sid = _id_from_json(sp.get("spanId"), 8, "spanId")
                    p = sp.get("parentSpanId")
                    parent = _id_from_json(p, 8, "parentSpanId") if p else None
                    name = sp.get("name", "")
                    if not isinstance(name, str):
                        raise ValueError("name must be a string")
                    kind = sp.get("kind", 0)
                    if isinstance(kind, str):  # tolerate enum names
                        kind = {"SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
                                "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}.get(kind, 0)
                    status = sp.get("status") or {}
                    code = status.get("code", 0)
                    if isinstance(code, str):
                        code = {"STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(code, 0)
                    events = []
                    for ei, e in enumerate(sp.get("events") or []):
                        if not isinstance(e, dict):
                            raise ValueError(f"events[{ei}] must be an object")
                        ev = {"name": e.get("name", ""), "time_ns": _to_int(e.get("timeUnixNano", 0), f"events[{ei}].timeUnixNano")}
                        if e.get("attributes"):
                            ev["attributes"] = _json_attrs(e["attributes"], f"events[{ei}]")
                        events.append(ev)
                    _add(out, keys, source, w, tid, sid, parent, name, int(kind),
                         _to_int(sp.get("startTimeUnixNano"), "startTimeUnixNano"),
                         _to_int(sp.get("endTimeUnixNano", 0), "endTimeUnixNano"), int(code),
                         status.get("message"), service, scope, resource,
                         _json_attrs(sp.get("attributes"), "span"), events)
                except (ValueError, TypeError, AttributeError) as e:
                    out.rejected += 1
                    out.errors.append(f"{w}: {e}")
    return out


def _count_spans(rs: Any) -> int:
    try:
        return sum(len(ss.get("spans", [])) for ss in rs.get("scopeSpans", []))
    except Exception:  # noqa: BLE001 - only used to report a count
        return 1


def parse_json_bytes(data: bytes | str, where: str) -> Any:
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        pass
    try:  # the stdlib parser gives line and column
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", where) from e
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text at byte {e.start}", where) from e


def decode_json(data: bytes | str, settings: Settings, source: str = "otlp", where: str = "payload") -> Decoded:
    return decode_json_obj(parse_json_bytes(data, where), settings, source, where)
