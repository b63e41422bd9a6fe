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
import struct
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
    attrs_json: str | None = None,
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
        attrs_json if attrs_json is not None else _json_enc.encode(attrs).decode(),
        _json_enc.encode(events).decode() if events else None,
        *promoted, source))
    out.accepted += 1
    for w in warns:
        out.warnings.append(f"{where} (span {span_id}): {w}")


def decode_protobuf(data: bytes, settings: Settings, source: str = "otlp", where: str = "payload") -> Decoded:
    try:
        req = ExportTraceServiceRequest.FromString(data)
    except DecodeError as e:
        raise InputError(f"not an OTLP ExportTraceServiceRequest protobuf ({e})", where) from None
    # the protobuf runtime has validated the payload (UTF-8, structure); decode its bytes directly
    return _decode_wire_or_message(bytes(data), req, settings, source, where)


def decode_request(req: ExportTraceServiceRequest, settings: Settings, source: str = "otlp",
                   where: str = "payload") -> Decoded:
    """Rows of a parsed request. Re-serializing it (C, ~2 µs/span) and reading the wire format
    directly is several times faster than walking the message objects."""
    return _decode_wire_or_message(req.SerializeToString(), req, settings, source, where)


def _decode_wire_or_message(data: bytes, req: ExportTraceServiceRequest, settings: Settings, source: str,
                            where: str) -> Decoded:
    try:
        return decode_wire(data, settings, source, where)
    except _Fallback:
        return decode_message(req, settings, source, where)


def decode_message(req: ExportTraceServiceRequest, settings: Settings, source: str = "otlp",
                   where: str = "payload") -> Decoded:
    """Rows of a parsed request read through the message objects: the reference that ``decode_wire``
    must equal, and its fallback for encodings it does not handle (merged duplicate sub-messages)."""
    out = Decoded()
    keys = alias_keys(settings)
    for ri, rs in enumerate(req.resource_spans):
        resource = _pb_attrs(rs.resource.attributes)
        resource_json = _json_enc.encode(resource).decode()
        service = resource.get("service.name")
        for si, ss in enumerate(rs.scope_spans):
            scope = ss.scope.name
            for pi, sp in enumerate(ss.spans):
                w = f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]"
                try:
                    tid = _id_from_bytes(sp.trace_id, 16, "traceId")
                    sid = _id_from_bytes(sp.span_id, 8, "spanId")
                    parent = _id_from_bytes(sp.parent_span_id, 8, "parentSpanId") if sp.parent_span_id else None
                    events = [
                        {"name": e.name, "time_ns": e.time_unix_nano, **({"attributes": _pb_attrs(e.attributes)} if e.attributes else {})}
                        for e in sp.events
                    ] if sp.events else []
                    _add(out, keys, source, w, tid, sid, parent, sp.name, int(sp.kind),
                         int(sp.start_time_unix_nano), int(sp.end_time_unix_nano), int(sp.status.code),
                         sp.status.message, service, scope, resource, _pb_attrs(sp.attributes), events,
                         resource_json)
                except ValueError as e:
                    out.rejected += 1
                    out.errors.append(f"{w}: {e}")
    return out


# -- the wire format, read directly ------------------------------------------------------------
# ExportTraceServiceRequest as encoded on the wire (opentelemetry/proto/*.proto field numbers):
# a tag is (field << 3 | wire type); wire type 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
# Attributes repeat across spans (operation, model, service, agent, ...): a decoded KeyValue is
# cached by its encoded bytes, so a repeated one costs one dict lookup.
# Anything unusual (a sub-message repeated where the runtime would merge the copies, a known field
# with an unexpected wire type, truncation) raises _Fallback and the payload is read through the
# message objects instead (decode_message): results never depend on which path ran.

class _Fallback(Exception):
    pass


_unpack_u64 = struct.Struct("<Q").unpack_from
_unpack_f64 = struct.Struct("<d").unpack_from
_KV_CACHE: dict[bytes, tuple[str, Any]] = {}  # encoded KeyValue -> (key, value)
_KV_CACHE_MAX = 50_000  # entries; cleared when full (unique values, e.g. response ids, churn through)
_KV_CACHE_ENTRY_MAX = 256  # bytes of one encoded KeyValue worth caching


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """The varint starting at ``buf[i]`` and the index after it."""
    result = 0
    shift = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift >= 70:
            raise _Fallback


def _skip(buf: bytes, i: int, wt: int, end: int) -> int:
    """Index after an unread field's value of wire type ``wt``."""
    if wt == 0:
        return _varint(buf, i)[1]
    if wt == 2:
        ln, i = _varint(buf, i)
        i += ln
    elif wt == 1:
        i += 8
    elif wt == 5:
        i += 4
    else:  # groups (3, 4) are not in OTLP
        raise _Fallback
    if i > end:
        raise _Fallback
    return i


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 0x100000000 if v >= 0x80000000 else v


def _w_any(buf: bytes, i: int, end: int) -> Any:
    """An AnyValue, as _pb_any reads it."""
    val = None
    msg_seen = False
    while i < end:
        t = buf[i]
        if t >= 0x80:
            raise _Fallback  # no AnyValue field number needs a two-byte tag
        i += 1
        wt = t & 7
        if wt == 2:
            ln = buf[i]
            i += 1
            if ln >= 0x80:
                ln, i = _varint(buf, i - 1)
            j = i + ln
            if j > end:
                raise _Fallback
            if t == 0x0A:  # string_value
                s = buf[i:j].decode()
                val = s[:MAX_ATTR_BYTES] if len(s) > MAX_ATTR_BYTES else s
            elif t == 0x2A or t == 0x32:  # array_value, kvlist_value
                if msg_seen:
                    raise _Fallback  # the runtime merges repeated sub-messages
                msg_seen = True
                val = [] if t == 0x2A else {}
                k = i
                while k < j:
                    if buf[k] != 0x0A:  # values = 1
                        raise _Fallback
                    ln2, k = _varint(buf, k + 1)
                    k2 = k + ln2
                    if k2 > j:
                        raise _Fallback
                    if t == 0x2A:
                        val.append(_w_any(buf, k, k2))
                    else:
                        key, v = _w_kv(buf, k, k2)
                        val[key] = v
                    k = k2
            elif t == 0x3A:  # bytes_value
                val = base64.b64encode(buf[i:j]).decode()
            elif (t >> 3) in (2, 3, 4, 8):
                raise _Fallback
            i = j
        elif wt == 0:
            v, i = _varint(buf, i)
            if t == 0x10:  # bool_value
                val = v != 0
            elif t == 0x18:  # int_value (int64)
                v &= 0xFFFFFFFFFFFFFFFF
                val = v - 0x10000000000000000 if v >= 0x8000000000000000 else v
            elif t == 0x40:  # string_value_strindex: not resolved (as _pb_any)
                val = None
            elif (t >> 3) in (1, 4, 5, 6, 7):
                raise _Fallback
        elif t == 0x21:  # double_value
            if i + 8 > end:
                raise _Fallback
            val = _unpack_f64(buf, i)[0]
            i += 8
        else:
            if (t >> 3) in (1, 2, 3, 4, 5, 6, 7, 8):
                raise _Fallback
            i = _skip(buf, i, wt, end)
    if i != end:
        raise _Fallback
    return val


def _w_kv(buf: bytes, i: int, end: int) -> tuple[str, Any]:
    """A KeyValue: (key, value)."""
    key = ""
    val = None
    seen = False
    while i < end:
        t = buf[i]
        if t >= 0x80:
            raise _Fallback
        i += 1
        wt = t & 7
        if wt == 2:
            ln = buf[i]
            i += 1
            if ln >= 0x80:
                ln, i = _varint(buf, i - 1)
            j = i + ln
            if j > end:
                raise _Fallback
            if t == 0x0A:
                key = buf[i:j].decode()
            elif t == 0x12:
                if seen:
                    raise _Fallback
                seen = True
                val = _w_any(buf, i, j)
            elif (t >> 3) == 3:
                raise _Fallback
            i = j
        else:
            if (t >> 3) in (1, 2) or (t >> 3 == 3 and wt != 0):
                raise _Fallback
            i = _skip(buf, i, wt, end)
    if i != end:
        raise _Fallback
    return key, val


_KEYS: dict[bytes, str] = {}  # attribute names, decoded once (and hashed once)


def _kv_entry(buf: bytes, i: int, j: int, kb: bytes) -> tuple[str, Any]:
    """(key, value) of the KeyValue at buf[i:j] (encoded: ``kb``), cached."""
    e = None
    # the common shape, read inline: key (field 1) then value (field 2) holding one scalar, short
    kl = buf[i + 1]
    if buf[i] == 0x0A and kl < 0x80:
        k1 = i + 2 + kl
        if k1 + 2 <= j and buf[k1] == 0x12 and buf[k1 + 1] < 0x80 and k1 + 2 + buf[k1 + 1] == j:
            kbytes = buf[i + 2:k1]
            key = _KEYS.get(kbytes)
            if key is None:
                key = kbytes.decode()
                if len(_KEYS) < _KV_CACHE_MAX:
                    _KEYS[kbytes] = key
            v0 = k1 + 2
            if v0 == j:  # empty AnyValue
                e = (key, None)
            else:
                t = buf[v0]
                if t == 0x0A:  # string_value (< 128 bytes: never truncated)
                    if buf[v0 + 1] + v0 + 2 == j:
                        e = (key, buf[v0 + 2:j].decode())
                elif t == 0x18:  # int_value
                    v, k = _varint(buf, v0 + 1)
                    if k == j:
                        v &= 0xFFFFFFFFFFFFFFFF
                        e = (key, v - 0x10000000000000000 if v >= 0x8000000000000000 else v)
                elif t == 0x21:  # double_value
                    if v0 + 9 == j:
                        e = (key, _unpack_f64(buf, v0 + 1)[0])
                elif t == 0x10 and v0 + 2 == j and buf[v0 + 1] < 0x80:  # bool_value
                    e = (key, buf[v0 + 1] != 0)
    if e is None:
        e = _w_kv(buf, i, j)
    if j - i <= _KV_CACHE_ENTRY_MAX:
        if len(_KV_CACHE) >= _KV_CACHE_MAX:
            _KV_CACHE.clear()
        _KV_CACHE[kb] = e
    return e


def _w_attr_list(buf: bytes, ranges: list[tuple[int, int]]) -> list[tuple[str, Any]]:
    get = _KV_CACHE.get
    out = []
    for i, j in ranges:
        kb = buf[i:j]
        out.append(get(kb) or _kv_entry(buf, i, j, kb))
    return out


def _w_fields(buf: bytes, i: int, end: int, want: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(ranges of field 1, ranges of field ``want``) of a message; other fields skipped. Used for
    ExportTraceServiceRequest, ResourceSpans, ScopeSpans, Resource, InstrumentationScope."""
    ones: list[tuple[int, int]] = []
    wanted: list[tuple[int, int]] = []
    while i < end:
        t = buf[i]
        if t >= 0x80:
            t, i = _varint(buf, i)
        else:
            i += 1
        wt = t & 7
        fn = t >> 3
        if wt == 2 and (fn == 1 or fn == want):
            ln, i = _varint(buf, i)
            j = i + ln
            if j > end:
                raise _Fallback
            (ones if fn == 1 else wanted).append((i, j))
            i = j
        else:
            i = _skip(buf, i, wt, end)
    if i != end:
        raise _Fallback
    return ones, wanted


def _w_event(buf: bytes, i: int, end: int) -> dict:
    time_ns = 0
    name = ""
    kvs: list[tuple[int, int]] = []
    while i < end:
        t = buf[i]
        if t >= 0x80:
            raise _Fallback
        i += 1
        wt = t & 7
        if t == 0x09:
            if i + 8 > end:
                raise _Fallback
            time_ns = _unpack_u64(buf, i)[0]
            i += 8
        elif wt == 2 and (t == 0x12 or t == 0x1A):
            ln, i = _varint(buf, i)
            j = i + ln
            if j > end:
                raise _Fallback
            if t == 0x12:
                name = buf[i:j].decode()
            else:
                kvs.append((i, j))
            i = j
        else:
            if (t >> 3) in (1, 2, 3) or (t >> 3 == 4 and wt != 0):
                raise _Fallback
            i = _skip(buf, i, wt, end)
    if i != end:
        raise _Fallback
    ev = {"name": name, "time_ns": time_ns}
    if kvs:
        ev["attributes"] = dict(_w_attr_list(buf, kvs))
    return ev


_SPAN_LEN_FIELDS = (1, 2, 3, 4, 5, 9, 11, 13, 15)


def decode_wire(data: bytes, settings: Settings, source: str = "otlp", where: str = "payload") -> Decoded:
    """Rows of an encoded ExportTraceServiceRequest the protobuf runtime has accepted, read from its
    bytes. Equal to ``decode_message`` of the parsed request; raises _Fallback where it cannot tell."""
    try:
        return _decode_wire(data, settings, source, where)
    except (IndexError, struct.error, UnicodeDecodeError):
        raise _Fallback from None


def _decode_wire(buf: bytes, settings: Settings, source: str, where: str) -> Decoded:
    out = Decoded()
    rows_append = out._rows.append
    keys = alias_keys(settings)
    enc = _json_enc.encode
    cache_get = _KV_CACHE.get
    resource_spans, _ = _w_fields(buf, 0, len(buf), 0)
    for ri, (ri0, ri1) in enumerate(resource_spans):
        res_msgs, scope_spans = _w_fields(buf, ri0, ri1, 2)
        if len(res_msgs) > 1:
            raise _Fallback
        resource: dict[str, Any] = {}
        if res_msgs:
            attr_ranges, _ = _w_fields(buf, res_msgs[0][0], res_msgs[0][1], 0)
            resource = dict(_w_attr_list(buf, attr_ranges))
        resource_json = enc(resource).decode()
        service = resource.get("service.name")
        for si, (si0, si1) in enumerate(scope_spans):
            scope_msgs, spans = _w_fields(buf, si0, si1, 2)
            if len(scope_msgs) > 1:
                raise _Fallback
            scope = ""
            if scope_msgs:
                names, _ = _w_fields(buf, scope_msgs[0][0], scope_msgs[0][1], 0)
                if names:
                    scope = buf[names[-1][0]:names[-1][1]].decode()
            for pi, (i, end) in enumerate(spans):
                # -- the span's fields --
                tid = sid = psid = b""
                name = ""
                kind = start = stop = code = 0
                message = ""
                status_seen = False
                ents: list = []
                ents_append = ents.append
                ev_ranges = None
                while i < end:
                    t = buf[i]
                    i += 1
                    if t == 0x4A:  # attributes, the most frequent field: first, and cached
                        ln = buf[i]
                        i += 1
                        if ln >= 0x80:
                            ln, i = _varint(buf, i - 1)
                        j = i + ln
                        kb = buf[i:j]
                        e = cache_get(kb)
                        if e is None:
                            if j > end:
                                raise _Fallback
                            e = _kv_entry(buf, i, j, kb)
                        ents_append(e)
                        i = j  # (past the span's end only in a corrupt payload: checked after the loop)
                        continue
                    if t >= 0x80:
                        t, i = _varint(buf, i - 1)
                    wt = t & 7
                    if wt == 2:
                        ln = buf[i]
                        i += 1
                        if ln >= 0x80:
                            ln, i = _varint(buf, i - 1)
                        j = i + ln
                        if j > end:
                            raise _Fallback
                        if t == 0x0A:
                            tid = buf[i:j]
                        elif t == 0x12:
                            sid = buf[i:j]
                        elif t == 0x22:
                            psid = buf[i:j]
                        elif t == 0x2A:
                            name = buf[i:j].decode()
                        elif t == 0x5A:  # events
                            if ev_ranges is None:
                                ev_ranges = []
                            ev_ranges.append((i, j))
                        elif t == 0x7A:  # status
                            if status_seen:
                                raise _Fallback
                            status_seen = True
                            k = i
                            while k < j:
                                st = buf[k]
                                if st == 0x12:
                                    ln2, k = _varint(buf, k + 1)
                                    if k + ln2 > j:
                                        raise _Fallback
                                    message = buf[k:k + ln2].decode()
                                    k += ln2
                                elif st == 0x18:
                                    v, k = _varint(buf, k + 1)
                                    code = _int32(v)
                                elif st >= 0x80 or (st >> 3) in (2, 3):
                                    raise _Fallback
                                else:
                                    k = _skip(buf, k + 1, st & 7, j)
                            if k != j:
                                raise _Fallback
                        elif (t >> 3) not in _SPAN_LEN_FIELDS:
                            if (t >> 3) <= 16:
                                raise _Fallback  # a known scalar field sent length-delimited
                        i = j
                    elif t == 0x39:  # start_time_unix_nano
                        start = _unpack_u64(buf, i)[0]
                        i += 8
                    elif t == 0x41:  # end_time_unix_nano
                        stop = _unpack_u64(buf, i)[0]
                        i += 8
                    elif t == 0x30:  # kind
                        v, i = _varint(buf, i)
                        kind = _int32(v)
                    elif wt == 0 and (t >> 3) in (10, 12, 14):  # dropped_*_count
                        i = _varint(buf, i)[1]
                    elif t == 133:  # flags (16, fixed32): not stored
                        i += 4
                    else:
                        if (t >> 3) <= 16:
                            raise _Fallback  # a known field with an unexpected wire type
                        i = _skip(buf, i, wt, end)
                if i != end:
                    raise _Fallback
                # -- the row --
                try:
                    if len(tid) != 16:
                        raise ValueError(f"traceId must be 16 bytes, got {len(tid)}")
                    trace_id = tid.hex()
                    if trace_id == "00000000000000000000000000000000":
                        raise ValueError("traceId is all zeros (invalid)")
                    if len(sid) != 8:
                        raise ValueError(f"spanId must be 8 bytes, got {len(sid)}")
                    span_id = sid.hex()
                    if span_id == "0000000000000000":
                        raise ValueError("spanId is all zeros (invalid)")
                    parent = _id_from_bytes(psid, 8, "parentSpanId") if psid else None
                    if stop and stop < start:
                        raise ValueError(f"endTimeUnixNano {stop} is before startTimeUnixNano {start}")
                    if start <= 0:
                        raise ValueError("startTimeUnixNano missing or zero")
                except ValueError as e:
                    out.rejected += 1
                    out.errors.append(f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]: {e}")
                    continue
                attrs = dict(ents)
                events = [_w_event(buf, a, b) for a, b in ev_ranges] if ev_ranges else []
                promoted, warns = promote_row(name, kind, start, scope, service, resource, attrs, events, keys)
                rows_append((
                    trace_id, span_id, parent, name, kind, start, stop or start, code, message or None,
                    service, scope, resource_json, enc(attrs).decode(),
                    enc(events).decode() if events else None, *promoted, source))
                out.accepted += 1
                if warns:
                    for w in warns:
                        out.warnings.append(f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}] "
                                            f"(span {span_id}): {w}")
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
        raise InputError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", where) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text at byte {e.start}", where) from None


def decode_json(data: bytes | str, settings: Settings, source: str = "otlp", where: str = "payload") -> Decoded:
    return decode_json_obj(parse_json_bytes(data, where), settings, source, where)
