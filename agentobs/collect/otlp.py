"""OTLP trace decoding: protobuf and OTLP/JSON into rows of the ``spans`` table.

Used by the file importer and the live receiver alike. Decoding never raises on bad spans: each
bad span is rejected with a message naming where it was (``resourceSpans[0].scopeSpans[1].spans[3]``)
and the valid rest is kept. Only a payload that cannot be parsed at all raises ``InputError``.

"Bad" covers every value that cannot be stored as it is: ids, times beyond int64 (2^63 ns) or an end
before the start, a kind or status code beyond the int8 column, token counts that are negative, not
whole, NaN/infinite or beyond int64 (normalize.py), an attempt beyond int32, strings that are not
Unicode (a lone surrogate escape in JSON), attribute values nested deeper than ``MAX_ATTR_DEPTH``.
Payloads a parser cannot take whole are salvaged span by span: a protobuf request whose one span has
invalid UTF-8 or nests deeper than upb's limit (``parse_protobuf``), a JSON document nested deeper than
the parsers' recursion limit (``parse_json_bytes``). ``Decoded.table()`` re-checks every row it builds
(a row Arrow refuses is rejected, never the batch). docs/collectors.md, "Bad input", lists the cases.

OTLP/JSON follows the OTLP rules (hex trace/span ids, int64 as decimal strings, enums as ints);
base64 ids (the plain protobuf JSON mapping, which some exporters use) are accepted too.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pyarrow as pa
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from ..config import Settings
from ..errors import InputError
from .normalize import COLUMNS, alias_keys, bad, promote_row

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
MAX_ATTR_DEPTH = 32  # arrays/kvlists nested deeper than this in one attribute value reject the span
MAX_JSON_DEPTH = 128  # JSON nesting the parsers are given; a span nested deeper is rejected (parse_json_bytes)
INT64_MAX = 2**63 - 1
INT8_MAX = 127
_json_enc = msgspec.json.Encoder()
# what decode_json_obj finds in place of a span (or attribute value) that parse_json_bytes cut out
REJECT_KEY = "\u0000agentobs.rejected"


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
        self.reasons: dict[str, int] = {}  # rejected spans by reason (normalize.bad)

    @property
    def columns(self) -> dict[str, list]:
        if self._rows:
            for col, values in zip(self._columns.values(), zip(*self._rows, strict=True), strict=True):
                col.extend(values)
            self._rows = []
        return self._columns

    def table(self) -> pa.Table:
        """The accepted rows as an Arrow table. A row Arrow cannot take (the decoders check every value
        first, so this is a safety net) is dropped here and counted as rejected with the reason: read
        ``accepted``/``rejected``/``errors`` after calling this."""
        try:
            if self._rows and not self._columns["trace_id"]:
                cols = list(zip(*self._rows, strict=True))  # rows only: skip the column lists
                return pa.table([pa.array(c, type=f.type) for c, f in zip(cols, SPAN_SCHEMA, strict=True)],
                                schema=SPAN_SCHEMA)
            return pa.table(self.columns, schema=SPAN_SCHEMA)
        except (pa.ArrowException, OverflowError, ValueError, TypeError):
            return self._table_dropping_bad_rows()

    def _table_dropping_bad_rows(self) -> pa.Table:
        cols = self.columns
        n = len(cols["trace_id"])
        bad_rows: dict[int, str] = {}
        for f in SPAN_SCHEMA:
            values = cols[f.name]
            try:
                pa.array(values, type=f.type)
                continue
            except (pa.ArrowException, OverflowError, ValueError, TypeError):
                pass
            for i, v in enumerate(values):  # the failing column only: find its bad values
                if i in bad_rows:
                    continue
                try:
                    pa.array([v], type=f.type)
                except (pa.ArrowException, OverflowError, ValueError, TypeError) as e:
                    bad_rows[i] = f"{f.name} {_short(v)} cannot be stored as {f.type} ({type(e).__name__})"
        keep = [i for i in range(n) if i not in bad_rows]
        for i, why in sorted(bad_rows.items()):
            self.errors.append(f"span {cols['span_id'][i]}: {why}")
        self.accepted -= len(bad_rows)
        self.rejected += len(bad_rows)
        if bad_rows:
            self.reasons["unstorable"] = self.reasons.get("unstorable", 0) + len(bad_rows)
        for name in cols:
            col = cols[name]
            cols[name] = [col[i] for i in keep]
        return pa.table(cols, schema=SPAN_SCHEMA)

    def extend(self, other: Decoded) -> None:
        for k, v in other.columns.items():
            self.columns[k].extend(v)
        self.accepted += other.accepted
        self.rejected += other.rejected
        for k, n in other.reasons.items():
            self.reasons[k] = self.reasons.get(k, 0) + n
        self.errors.extend(other.errors)
        self.warnings.extend(other.warnings)


def _short(v: Any) -> str:
    r = ascii(v)  # ascii: a lone surrogate is shown escaped, never re-raised
    return r if len(r) <= 60 else r[:57] + "..."


def _text(v: Any, what: str) -> str:
    """A JSON string that Arrow and DuckDB can store: a lone surrogate (``"\\ud800"``) is not Unicode."""
    if not isinstance(v, str):
        raise ValueError(f"{what} must be a string, got {type(v).__name__}")
    if not v.isascii():
        try:
            v.encode()
        except UnicodeEncodeError as e:
            raise bad("invalid_text", f"{what} {_short(v)} is not valid Unicode (lone surrogate at character {e.start})") \
                from e
    return v


def _encode(obj: Any, what: str) -> str:
    """``obj`` as JSON text; a lone surrogate anywhere in it is a ValueError naming ``what``."""
    try:
        return _json_enc.encode(obj).decode()
    except UnicodeEncodeError as e:
        raise bad("invalid_text", f"{what} hold {_short(e.object[max(0, e.start - 10):e.end + 10])}: not valid Unicode "
                         "(lone surrogate)") from e


def _service(v: Any) -> str | None:
    """service.name as stored: text (a number or bool that an exporter sent is kept as its JSON text)."""
    return v if v is None or v.__class__ is str else _json_enc.encode(v).decode()


def check_span(kind: int, start_ns: int, end_ns: int, code: int) -> None:
    """The span-level values every decoder checks before a row is built (ValueError: the span is rejected)."""
    if end_ns and end_ns < start_ns:
        raise bad("invalid_time", f"endTimeUnixNano {end_ns} is before startTimeUnixNano {start_ns}")
    if start_ns <= 0:
        raise bad("invalid_time", "startTimeUnixNano missing or zero")
    if end_ns > INT64_MAX:  # start <= end here, or end is 0
        raise bad("invalid_time", f"endTimeUnixNano {end_ns} is beyond 2^63-1 ns (the int64 column)")
    if start_ns > INT64_MAX:
        raise bad("invalid_time", f"startTimeUnixNano {start_ns} is beyond 2^63-1 ns (the int64 column)")
    if not 0 <= kind <= INT8_MAX:
        raise bad("invalid_enum", f"kind {kind} is out of range (0-{INT8_MAX}; OTLP's span kinds are 0-5)")
    if not 0 <= code <= INT8_MAX:
        raise bad("invalid_enum", f"status.code {code} is out of range (0-{INT8_MAX}; OTLP's status codes are 0-2)")


# -- ids ---------------------------------------------------------------------------------------
def _id_from_json(v: Any, nbytes: int, what: str) -> str:
    if not isinstance(v, str):
        raise bad("invalid_id", f"{what} must be a hex string, got {type(v).__name__}")
    if len(v) == nbytes * 2:
        try:
            bytes.fromhex(v)
            h = v.lower()
        except ValueError:
            raise bad("invalid_id", f"{what} {v!r} is not hex") from None
    else:
        try:
            raw = base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != nbytes:
            raise bad("invalid_id", f"{what} {v!r} must be {nbytes * 2} hex characters")
        h = raw.hex()
    if h == "0" * (nbytes * 2):
        raise bad("invalid_id", f"{what} is all zeros (invalid)")
    return h


def _id_from_bytes(b: bytes, nbytes: int, what: str) -> str:
    if len(b) != nbytes:
        raise bad("invalid_id", f"{what} must be {nbytes} bytes, got {len(b)}")
    h = b.hex()
    if h == "0" * (nbytes * 2):
        raise bad("invalid_id", f"{what} is all zeros (invalid)")
    return h


# -- attribute values --------------------------------------------------------------------------
def _too_deep() -> ValueError:
    return bad("too_deep", f"attribute value nested deeper than {MAX_ATTR_DEPTH} levels")


def _json_any(v: Any, depth: int = 0) -> Any:
    if not isinstance(v, dict) or not v:
        return None
    if "stringValue" in v:
        s = v["stringValue"]
        return s[:MAX_ATTR_BYTES] if isinstance(s, str) and len(s) > MAX_ATTR_BYTES else s
    if "intValue" in v:
        iv = v["intValue"]
        try:
            n = int(iv)
        except (TypeError, ValueError, OverflowError):
            raise bad("invalid_value", f"intValue {_short(iv)} is not an integer") from None
        if not -INT64_MAX - 1 <= n <= INT64_MAX:
            raise bad("invalid_value", f"intValue {_short(iv)} is out of the int64 range")
        return n
    if "doubleValue" in v:
        dv = v["doubleValue"]
        if isinstance(dv, str):  # "NaN", "Infinity" per proto3 JSON
            return float(dv)
        return dv
    if "boolValue" in v:
        return bool(v["boolValue"])
    if depth >= MAX_ATTR_DEPTH:
        raise _too_deep()
    if "arrayValue" in v:
        return [_json_any(x, depth + 1) for x in (v["arrayValue"] or {}).get("values", []) or []]
    if "kvlistValue" in v:
        return {kv.get("key"): _json_any(kv.get("value"), depth + 1)
                for kv in (v["kvlistValue"] or {}).get("values", []) or []}
    if "bytesValue" in v:
        return v["bytesValue"]
    if REJECT_KEY in v:  # parse_json_bytes cut out a value nested too deep
        raise bad("too_deep", str(v[REJECT_KEY]))
    return None


def _json_attrs(lst: Any, where: str, cap: int | None = None) -> dict[str, Any]:
    """The attributes as a dict; past ``cap`` entries the rest are dropped (the caller warns)."""
    if lst is None:
        return {}
    if not isinstance(lst, list):
        if isinstance(lst, dict) and REJECT_KEY in lst:
            raise bad("too_deep", str(lst[REJECT_KEY]))
        raise ValueError(f"{where}.attributes must be a list")
    if cap is not None and len(lst) > cap:
        lst = lst[:cap]
    out = {}
    for kv in lst:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise ValueError(f"{where}.attributes has an entry without a string key: {_short(kv)}")
        out[kv["key"]] = _json_any(kv.get("value"))
    return out


def _pb_any(v, depth: int = 0) -> Any:
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
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    if depth >= MAX_ATTR_DEPTH:
        raise _too_deep()
    if which == "array_value":
        return [_pb_any(x, depth + 1) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_any(kv.value, depth + 1) for kv in v.kvlist_value.values}
    return None


def _pb_attrs(lst, cap: int | None = None) -> dict[str, Any]:
    # the scalar cases inline (the hot path of the receiver); nested values via _pb_any
    if cap is not None and len(lst) > cap:
        lst = lst[:cap]
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
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} {_short(v)} is not an integer") from None


# -- shared row assembly -----------------------------------------------------------------------
_SPAN_ERRORS = (ValueError, TypeError, AttributeError, OverflowError, RecursionError)  # a bad span, not a bad batch


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
    check_span(kind, start_ns, end_ns, status_code)
    promoted, warns = promote_row(name, kind, start_ns, scope, service, resource, attrs, events, keys)
    out._rows.append((
        trace_id, span_id, parent, name, kind, start_ns, end_ns or start_ns, status_code, status_message or None,
        service, scope,
        resource_json if resource_json is not None else _encode(resource, "resource attributes"),
        _encode(attrs, "span attributes"),
        _encode(events, "span events") if events else None,
        *promoted, source))
    out.accepted += 1
    for w in warns:
        out.warnings.append(f"{where} (span {span_id}): {w}")


@dataclass
class Salvaged:
    """What ``parse_protobuf`` could not parse in a request it took apart span by span: the reason for
    each span position (a placeholder span stands there in the request) and unparseable pieces whose
    spans cannot be counted (each counts as one rejected span)."""

    spans: dict[tuple[int, int, int], tuple[str, str]] = field(default_factory=dict)  # (reason, message)
    pieces: list[str] = field(default_factory=list)


def decode_protobuf(data: bytes, settings: Settings, source: str = "otlp", where: str = "payload") -> Decoded:
    req, salvaged = parse_protobuf(data, where)
    return decode_request(req, settings, source, where, salvaged)


def _reject(out: Decoded, message: str, n: int = 1, e: Exception | None = None) -> None:
    reason = getattr(e, "reason", "invalid_span")
    out.rejected += n
    out.reasons[reason] = out.reasons.get(reason, 0) + n
    out.errors.append(message)


def decode_request(req: ExportTraceServiceRequest, settings: Settings, source: str = "otlp",
                   where: str = "payload", salvaged: Salvaged | None = None) -> Decoded:
    """Rows of a parsed request; ``salvaged`` (from ``parse_protobuf``) names the spans it could not parse."""
    out = Decoded()
    keys = alias_keys(settings)
    cap = settings.max_span_attributes
    rows_append = out._rows.append
    enc = _json_enc.encode
    salvaged_bad = salvaged.spans if salvaged else None
    if salvaged:
        for piece in salvaged.pieces:
            _reject(out, f"{where}: {piece}", 1, bad("unparseable", piece))
    for ri, rs in enumerate(req.resource_spans):
        try:
            resource = _pb_attrs(rs.resource.attributes, cap)
            resource_json = enc(resource).decode()
            service = _service(resource.get("service.name"))
        except _SPAN_ERRORS as e:
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            _reject(out, f"{where}: resourceSpans[{ri}].resource: {e} ({n} spans rejected)", n, e)
            continue
        for si, ss in enumerate(rs.scope_spans):
            scope = ss.scope.name
            for pi, sp in enumerate(ss.spans):
                try:
                    if salvaged_bad and (ri, si, pi) in salvaged_bad:
                        raise bad(*salvaged_bad[ri, si, pi])
                    tid = _id_from_bytes(sp.trace_id, 16, "traceId")
                    sid = _id_from_bytes(sp.span_id, 8, "spanId")
                    psid = sp.parent_span_id
                    parent = _id_from_bytes(psid, 8, "parentSpanId") if psid else None
                    start_ns = sp.start_time_unix_nano
                    end_ns = sp.end_time_unix_nano
                    name = sp.name
                    kind = sp.kind
                    status = sp.status
                    code = status.code
                    check_span(kind, start_ns, end_ns, code)
                    events = [
                        {"name": e.name, "time_ns": e.time_unix_nano,
                         **({"attributes": _pb_attrs(e.attributes, cap)} if e.attributes else {})}
                        for e in sp.events
                    ] if sp.events else []
                    nattrs = len(sp.attributes)
                    attrs = _pb_attrs(sp.attributes, cap)
                    promoted, warns = promote_row(name, kind, start_ns, scope, service, resource, attrs, events, keys)
                    rows_append((
                        tid, sid, parent, name, kind, start_ns, end_ns or start_ns, code, status.message or None,
                        service, scope, resource_json, enc(attrs).decode(), enc(events).decode() if events else None,
                        *promoted, source))
                except _SPAN_ERRORS as e:
                    _reject(out, f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}]: {e}", 1, e)
                    continue
                out.accepted += 1
                if nattrs > cap:
                    warns.append(_capped(nattrs, cap))
                for w in warns:
                    out.warnings.append(f"{where}: resourceSpans[{ri}].scopeSpans[{si}].spans[{pi}] (span {sid}): {w}")
    return out


def _capped(n: int, cap: int) -> str:
    return f"{n - cap} of its {n} attributes dropped (max_span_attributes = {cap})"


def decode_json_obj(doc: Any, settings: Settings, source: str = "otlp", where: str = "payload") -> Decoded:
    """Decode one OTLP/JSON ExportTraceServiceRequest already parsed into Python objects."""
    if not isinstance(doc, dict):
        raise InputError(f"expected a JSON object with resourceSpans, got {type(doc).__name__}", where)
    if "resourceSpans" not in doc:
        found = ", ".join(k if k.isprintable() else _short(k) for k in list(doc)[:5]) or "nothing"
        raise InputError(f"not an OTLP trace export: no 'resourceSpans' key (found: {found})", where)
    rss = doc["resourceSpans"]
    if not isinstance(rss, list):
        raise InputError("'resourceSpans' must be a list", where)
    out = Decoded()
    keys = alias_keys(settings)
    cap = settings.max_span_attributes
    for ri, rs in enumerate(rss):
        rw = f"{where}: resourceSpans[{ri}]"
        try:
            if not isinstance(rs, dict):
                raise ValueError("must be an object")
            resource = _json_attrs((rs.get("resource") or {}).get("attributes"), "resource", cap)
            resource_json = _encode(resource, "resource attributes")
            service = _service(resource.get("service.name"))
            scope_spans = rs.get("scopeSpans", rs.get("instrumentationLibrarySpans", []))
            if not isinstance(scope_spans, list):
                raise ValueError("scopeSpans must be a list")
        except _SPAN_ERRORS as e:
            n = _count_spans(rs)
            _reject(out, f"{rw}: {e} ({n} spans rejected)", n, e)
            continue
        for si, ss in enumerate(scope_spans):
            sw = f"{rw}.scopeSpans[{si}]"
            if not isinstance(ss, dict) or not isinstance(ss.get("spans", []), list):
                _reject(out, f"{sw}: must be an object with a 'spans' list")
                continue
            try:
                scope = _text((ss.get("scope") or ss.get("instrumentationLibrary") or {}).get("name", "") or "",
                              "scope.name")
            except _SPAN_ERRORS as e:
                n = len(ss["spans"])
                _reject(out, f"{sw}: {e} ({n} spans rejected)", n, e)
                continue
            for pi, sp in enumerate(ss.get("spans", [])):
                w = f"{sw}.spans[{pi}]"
                try:
                    tid, sid, parent, name, kind, code, message = json_span_head(sp)
                    events = []
                    for ei, evd in enumerate(sp.get("events") or []):
                        if not isinstance(evd, dict):
                            raise ValueError(f"events[{ei}] must be an object")
                        ev = {"name": evd.get("name", ""), "time_ns": _to_int(evd.get("timeUnixNano", 0), f"events[{ei}].timeUnixNano")}
                        if evd.get("attributes"):
                            ev["attributes"] = _json_attrs(evd["attributes"], f"events[{ei}]", cap)
                        events.append(ev)
                    attr_list = sp.get("attributes")
                    _add(out, keys, source, w, tid, sid, parent, name, *json_span_numbers(sp, kind, code),
                         message, service, scope, resource,
                         _json_attrs(attr_list, "span", cap), events, resource_json)
                except _SPAN_ERRORS as e:
                    _reject(out, f"{w}: {e}", 1, e)
                    continue
                if isinstance(attr_list, list) and len(attr_list) > cap:
                    out.warnings.append(f"{w} (span {sid}): {_capped(len(attr_list), cap)}")
    return out


def json_span_head(sp: Any) -> tuple[str, str, str | None, str, Any, Any, str | None]:
    """An OTLP/JSON span's ids, name, kind, status code (enum names read; numbers not yet checked) and status
    message, checked as the decoder checks them: ValueError (with its ``reason``) for a bad span. Shared by
    ``decode_json_obj`` and the receivers' acknowledgement check (``receiver.scan_json_spans``)."""
    if not isinstance(sp, dict):
        raise ValueError("span must be an object")
    if REJECT_KEY in sp:  # parse_json_bytes cut it out
        raise bad("too_deep", str(sp[REJECT_KEY]))
    tid = _id_from_json(sp.get("traceId"), 16, "traceId")
    sid = _id_from_json(sp.get("spanId"), 8, "spanId")
    p = sp.get("parentSpanId")
    parent = _id_from_json(p, 8, "parentSpanId") if p else None
    name = _text(sp.get("name", ""), "name")
    kind = sp.get("kind", 0)
    if isinstance(kind, str):  # tolerate enum names
        kind = {"SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
                "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}.get(kind, 0)
    status = sp.get("status") or {}
    if not isinstance(status, dict):
        raise ValueError("status must be an object")
    code = status.get("code", 0)
    if isinstance(code, str):
        code = {"STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(code, 0)
    message = status.get("message")
    if message is not None:
        message = _text(message, "status.message")
    return tid, sid, parent, name, kind, code, message


def json_span_numbers(sp: dict, kind: Any, code: Any) -> tuple[int, int, int, int]:
    """(kind, start, end, status code) of an OTLP/JSON span as integers (ValueError: not integers)."""
    return (_to_int(kind, "kind"), _to_int(sp.get("startTimeUnixNano"), "startTimeUnixNano"),
            _to_int(sp.get("endTimeUnixNano", 0), "endTimeUnixNano"), _to_int(code, "status.code"))


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
    except RecursionError:
        return _parse_deep_json(data, where)
    try:  # the stdlib parser gives line and column (and takes lone surrogate escapes, rejected per span)
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", where) from e
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text at byte {e.start}", where) from e
    except RecursionError:
        return _parse_deep_json(data, where)


# a JSON string (skipped whole: brackets in it are text) or a bracket
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_SPAN_DEPTH = 7  # {resourceSpans: [ {scopeSpans: [ {spans: [ {span  <- the 7th bracket


def _parse_deep_json(data: bytes | str, where: str) -> Any:
    """A document nested deeper than the parsers' recursion limit, parsed with every element at span depth
    (a span, or a resource's attribute value) that holds the deep part replaced by a ``REJECT_KEY`` object:
    that span (or resource) is rejected with the reason, the rest decodes. Runs only on such documents."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    cuts: list[tuple[int, int]] = []
    depth, start, deep = 0, 0, False
    for m in _JSON_TOKEN.finditer(raw):
        c = raw[m.start()]
        if c == 0x22:  # a string
            continue
        if c in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth == _SPAN_DEPTH:
                start, deep = m.start(), False
            elif depth > MAX_JSON_DEPTH:
                deep = True
        else:
            if depth == _SPAN_DEPTH and deep:
                cuts.append((start, m.end()))
            depth -= 1
    if not cuts:
        raise InputError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels outside any span", where)
    marker = json.dumps({REJECT_KEY: f"JSON nested deeper than {MAX_JSON_DEPTH} levels"}).encode()
    parts, pos = [], 0
    for a, b in cuts:
        parts += [raw[pos:a], marker]
        pos = b
    parts.append(raw[pos:])
    try:
        return json.loads(b"".join(parts))
    except (ValueError, RecursionError) as e:
        raise InputError(f"invalid JSON nested deeper than {MAX_JSON_DEPTH} levels ({type(e).__name__})",
                         where) from e


# -- protobuf salvage ----------------------------------------------------------------------------
def parse_protobuf(data: bytes, where: str = "payload") -> tuple[ExportTraceServiceRequest, Salvaged | None]:
    """Parse an ExportTraceServiceRequest. When upb refuses it whole (one span with invalid UTF-8, or
    nested deeper than its limit), the request is taken apart along the wire format and every piece
    parsed alone: spans that parse are kept, the others stand as placeholders named in ``Salvaged``
    (``decode_request`` rejects them with the reason). Raises InputError only when the wire format
    itself is broken (truncated, not protobuf)."""
    try:
        return ExportTraceServiceRequest.FromString(data), None
    except DecodeError as e:
        first = e
    try:
        return _salvage(bytes(data))
    except ValueError:
        raise InputError(f"not an OTLP ExportTraceServiceRequest protobuf ({first})", where) from None


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _len_fields(buf: bytes) -> list[tuple[int, bytes]]:
    """The length-delimited fields of one message, in order (others skipped); ValueError on broken wire."""
    out, i, n = [], 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            _, i = _varint(buf, i)
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        elif wt == 2:
            ln, i = _varint(buf, i)
            if i + ln > n:
                raise ValueError("truncated field")
            out.append((num, buf[i:i + ln]))
            i += ln
        else:
            raise ValueError(f"wire type {wt}")
        if i > n or num == 0:
            raise ValueError("truncated or invalid field")
    return out


def _unparseable(message: str) -> tuple[str, str]:
    """(reason, message) of a piece upb refused: its reason from upb's words."""
    if "UTF-8" in message:
        return "invalid_text", message
    if "Depth" in message or "depth" in message:
        return "too_deep", message
    return "unparseable", message


def _why(e: DecodeError) -> str:
    return str(e).split(": ", 1)[-1] if ": " in str(e) else str(e)


def _salvage(data: bytes) -> tuple[ExportTraceServiceRequest, Salvaged]:
    req = ExportTraceServiceRequest()
    sal = Salvaged()
    ri = -1
    for num, rs_bytes in _len_fields(data):
        if num != 1:  # resource_spans is field 1; nothing else is defined
            continue
        ri += 1
        rs = req.resource_spans.add()
        try:
            rs.CopyFrom(ResourceSpans.FromString(rs_bytes))
            continue
        except DecodeError:
            pass
        res_err = None
        try:
            pieces = _len_fields(rs_bytes)
        except ValueError as e:
            sal.pieces.append(f"resourceSpans[{ri}]: not valid protobuf ({e})")
            continue
        ss_list = []
        for num2, b in pieces:
            if num2 == 1:
                try:
                    rs.resource.CopyFrom(Resource.FromString(b))
                except DecodeError as e:
                    res_err = f"resource: {_why(e)}"
            elif num2 == 2:
                ss_list.append(b)
        for si, ss_bytes in enumerate(ss_list):
            ss = rs.scope_spans.add()
            try:
                if res_err is None:
                    ss.CopyFrom(ScopeSpans.FromString(ss_bytes))
                    continue
            except DecodeError:
                pass
            scope_err = res_err
            try:
                pieces2 = _len_fields(ss_bytes)
            except ValueError as e:
                sal.pieces.append(f"resourceSpans[{ri}].scopeSpans[{si}]: not valid protobuf ({e})")
                continue
            pi = -1
            for num3, b in pieces2:
                if num3 == 1 and scope_err is None:
                    try:
                        ss.scope.CopyFrom(InstrumentationScope.FromString(b))
                    except DecodeError as e:
                        scope_err = f"scope: {_why(e)}"
                elif num3 == 2:
                    pi += 1
                    sp = ss.spans.add()
                    if scope_err is None:
                        try:
                            sp.CopyFrom(Span.FromString(b))
                            continue
                        except DecodeError as e:
                            sal.spans[ri, si, pi] = _unparseable(f"not a valid Span ({_why(e)})")
                            continue
                    sal.spans[ri, si, pi] = _unparseable(scope_err)
            if scope_err is not None:  # a scope after its spans on the wire: reject them all
                for k in range(pi + 1):
                    sal.spans[ri, si, k] = _unparseable(scope_err)
    return req, sal


def decode_json(data: bytes | str, settings: Settings, source: str = "otlp", where: str = "payload") -> Decoded:
    return decode_json_obj(parse_json_bytes(data, where), settings, source, where)
