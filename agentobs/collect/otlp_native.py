"""Native OTLP decode: protobuf wire → Arrow (``ptars``, Rust) → the ``spans`` rows, vectorised.

``decode_bodies(bodies, sources, settings)`` turns a batch of OTLP/protobuf ``ExportTraceServiceRequest``
bodies into the same rows ``otlp.decode_protobuf`` + ``normalize.promote_row`` produce, without one
Python object per span or attribute: ``ptars`` parses every body of the batch into one Arrow record
batch, the nested lists are flattened with their parent indices, ids become hex, each span's attribute
JSON is written from the flattened columns (doubles by msgspec — the encoder the Python path uses — over
the whole column at once), and the promoted columns (role, op, session, tokens, TTFT, …) are resolved from
a pivot of the keys ``normalize.py`` reads, with the same first-match-wins rules.

The JSON, the pivot's grouping by key and the ids' hex are done by the C extension ``_native_json``
(``_native_json.c``, built by setup.py where a C compiler is) when it is built, else — or with
``$AGENTOBS_NO_C_EXT=1`` / ``use_c_ext(False)`` — by Arrow kernels and NumPy: the same bytes
(tests/test_collect_native_c.py).

What the vectorised path does not reproduce exactly is decoded by the Python path instead, one whole
request at a time, so the rows and the rejection/warning behaviour of such a request are exactly
``otlp.decode_protobuf``'s: a span the Python decoder rejects or warns about (bad or zero ids, bad
times, kind/status outside 0..127, token counts that are not non-negative integers, an attempt beyond
int32, cached > input tokens, NaN/infinite latencies), span events, kvlist/bytes values or nested
arrays, a key repeated within one span, more than ``max_span_attributes`` attributes, LiteLLM's stringified
dicts, and every alias value whose text the Python path would build with ``str()`` of something other
than a string, an int or a bool. ``fallback_requests`` of the result lists them.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field

import msgspec
import numpy as np
import ptars
import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ..config import Settings
from . import normalize as nz
from .otlp import MAX_ATTR_BYTES, SPAN_SCHEMA

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

# which member of AnyValue's oneof is set
W_ABSENT, W_NONE, W_STR, W_BOOL, W_INT, W_DOUBLE, W_ARRAY, W_OTHER = -1, 0, 1, 2, 3, 4, 5, 6
# how a value's JSON is written (_native_json.c's kinds): null, a string quoted and escaped, an int in decimal,
# a ready text (a double as msgspec writes it, an array's JSON), true, false
K_NULL, K_STR, K_INT, K_TEXT, K_TRUE, K_FALSE = 0, 1, 2, 3, 4, 5
_KIND_OF = np.array([K_NULL, K_STR, K_TRUE, K_INT, K_TEXT, K_TEXT, K_NULL], np.int8)  # by W_* (K_FALSE: by value)
C_API_VERSION = 2


def _load_c():
    """The C extension (agentobs/collect/_native_json.c) when it is built and of this version, else None."""
    try:
        mod = importlib.import_module(f"{__package__}._native_json")
    except ImportError:
        return None
    return mod if getattr(mod, "API_VERSION", None) == C_API_VERSION else None


C_EXT = _load_c()  # built? (setup.py: optional; a machine without a C compiler installs without it)
_c = None if os.environ.get("AGENTOBS_NO_C_EXT") == "1" else C_EXT  # $AGENTOBS_NO_C_EXT=1: the Arrow path


def use_c_ext(on: bool) -> bool:
    """Build the attribute JSON with the C extension (``on``, when it is built) or with Arrow kernels;
    returns whether the C extension was in use before (the bench and the tests compare the two)."""
    global _c
    was = _c is not None
    _c = C_EXT if on else None
    return was

_pool: ptars.HandlerPool | None = None
_handlers: tuple | None = None
_enc = msgspec.json.Encoder()
_HEX = np.array([f"{i:02x}".encode() for i in range(256)], dtype="S2").view(np.uint16)


def _get_handlers():
    global _pool, _handlers
    if _handlers is None:
        _pool = ptars.HandlerPool([ExportTraceServiceRequest.DESCRIPTOR.file])
        _handlers = (_pool.get_for_message(ExportTraceServiceRequest.DESCRIPTOR),
                     _pool.get_for_message(AnyValue.DESCRIPTOR))
    return _handlers


def warm_up(settings: Settings) -> None:
    """Build the ptars handlers and run the whole path once on a tiny request (a decoder process's first
    batch otherwise pays ~0.3 s of lazy imports and kernel lookups)."""
    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.name, sp.start_time_unix_nano = b"\x01" * 16, b"\x01" * 8, "x", 1
    kv = sp.attributes.add()
    kv.key = "k"
    kv.value.array_value.values.add().string_value = "v"
    decode_bodies([req.SerializeToString()], ["warm-up"], settings)


@dataclass
class NativeResult:
    table: pa.Table | None  # the rows of the requests decoded natively (SPAN_SCHEMA)
    accepted: list[int]  # spans per request (0 for a fallback request)
    fallback_requests: list[int] = field(default_factory=list)  # indices: decode these with otlp.py


# -- small helpers ------------------------------------------------------------------------------
def _np_int(a: pa.Array, fill: int = 0) -> np.ndarray:
    if a.null_count:
        a = pc.fill_null(a, fill)
    return a.to_numpy(zero_copy_only=False)


def _valid(a: pa.Array) -> np.ndarray:
    nulls = a.null_count
    if not nulls:
        return np.ones(len(a), bool)
    if nulls == len(a):  # e.g. the AnyValue members no value of the column has
        return np.zeros(len(a), bool)
    return pc.is_valid(a).to_numpy(zero_copy_only=False)


def _sf(a: pa.Array, name: str) -> pa.Array:
    """A struct field with the struct's own nulls applied."""
    return pc.struct_field(a, [name])


def _offsets(parent: np.ndarray, n: int) -> np.ndarray:
    off = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(parent, minlength=n), out=off[1:])
    return off


def _take(a: pa.Array, idx: np.ndarray) -> pa.Array:
    """``a[idx]`` with null where ``idx`` is -1."""
    neg = idx < 0
    if neg.any():
        return a.take(pa.array(idx, mask=neg))
    return a.take(pa.array(idx))


def _hex_ids(a: pa.Array, nbytes: int, optional: bool) -> tuple[pa.Array, np.ndarray]:
    """Binary ids as lower-case hex; the mask of rows the Python path rejects (wrong length, all zeros).
    ``optional``: an empty id is null (parent_span_id)."""
    n = len(a)
    if a.offset or a.null_count:
        a = pc.fill_null(a, b"").combine_chunks() if isinstance(a, pa.ChunkedArray) else pc.fill_null(a, b"")
        a = pa.concat_arrays([a])  # offset 0
    bufs = a.buffers()
    off = np.frombuffer(bufs[1], np.int32, n + 1)
    lens = np.diff(off)
    empty = lens == 0
    w = 2 * nbytes
    if _c is not None:
        text, flags = _c.hex_ids(off, bufs[2] if bufs[2] is not None else b"", nbytes)
        fl = np.frombuffer(flags, np.uint8)
        bad = ((fl == 1) & ~(empty if optional else np.zeros(n, bool))) | (fl == 2)
        arr = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(0, w * n + 1, w, dtype=np.int32)),
                                                       pa.py_buffer(text)])
        if optional and empty.any():
            arr = pc.if_else(pa.array(empty), pa.scalar(None, pa.string()), arr)
        return arr, bad
    ok = lens == nbytes
    bad = ~ok & ~(empty if optional else np.zeros(n, bool))
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    if len(data) == 0:
        data = np.zeros(1, np.uint8)
    starts = np.where(ok, off[:-1], 0)
    idx = np.minimum(starts[:, None] + np.arange(nbytes), len(data) - 1)
    raw = data[idx]
    raw[~ok] = 0
    bad |= ok & ~raw.any(axis=1)
    hexed = _HEX[raw]  # (n, nbytes) uint16 = two ASCII hex digits each
    arr = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(0, w * n + 1, w, dtype=np.int32)),
                                                   pa.py_buffer(hexed.tobytes())])
    if optional and empty.any():
        arr = pc.if_else(pa.array(empty), pa.scalar(None, pa.string()), arr)
    return arr, bad


_NEEDS_ESCAPE = np.zeros(256, bool)
_NEEDS_ESCAPE[:0x20] = True
_NEEDS_ESCAPE[[0x22, 0x5C]] = True  # '"' and '\\': what msgspec's JSON encoder escapes (the rest is written as is)


def _str_bufs(a: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets n+1, data bytes) of a string array without copying."""
    bufs = a.buffers()
    off = np.frombuffer(bufs[1], np.int32, len(a) + 1, a.offset * 4) if bufs[1] is not None else np.zeros(1, np.int32)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and bufs[2].size else np.zeros(0, np.uint8)
    return off, data


def _lens(s: pa.Array) -> np.ndarray:
    """Byte length of each string (a null's: what its offsets say, 0 as ptars writes them; callers read valid rows)."""
    off, _ = _str_bufs(s)
    return np.diff(off) if len(off) == len(s) + 1 else np.zeros(len(s), np.int32)


def _max_len(s: pa.Array) -> int:
    """An upper bound of the longest string's byte length (exact unless a null has a non-empty range)."""
    off, _ = _str_bufs(s)
    if len(off) != len(s) + 1 or int(off[-1] - off[0]) == 0:
        return 0
    return int(np.diff(off).max())


def _escaped_rows(s: pa.Array) -> np.ndarray:
    """Rows of a string array holding a character JSON must escape."""
    off, data = _str_bufs(s)
    if not len(data) or off[-1] == off[0]:
        return np.zeros(0, np.int64)
    pos = np.flatnonzero(_NEEDS_ESCAPE[data[off[0]:off[-1]]]) + off[0]
    if not len(pos):
        return np.zeros(0, np.int64)
    return np.unique(np.searchsorted(off, pos, side="right") - 1)


def _doubles_json(d: pa.Array, valid: np.ndarray) -> pa.Array:
    """JSON text of the valid values of a double array, as msgspec writes each (NaN/inf: null)."""
    vals = np.frombuffer(d.buffers()[1], np.float64, len(d), d.offset)[valid].tolist()
    if not vals:
        return pa.array([], pa.string())
    return pa.array(_enc.encode(vals)[1:-1].split(b","), pa.binary()).cast(pa.string())


class Src:
    """Strings gathered from several arrays by one index: JSON texts are assembled as lists of pieces
    (``"{"``, a key's ``"key":``, ``'"'``, a string value, …) joined by one ``binary_join``."""

    CONST = ("", '"', "{", "}", "null", "true", "false", "[", "]", ",")

    def __init__(self):
        self.parts: list[pa.Array] = [pa.array(self.CONST, pa.string())]
        self.size = len(self.CONST)

    def c(self, text: str) -> int:
        return self.CONST.index(text)

    def add(self, arr: pa.Array) -> int:
        base = self.size
        self.parts.append(arr)
        self.size += len(arr)
        return base

    def join(self, idx: np.ndarray, off: np.ndarray) -> pa.Array:
        src = pa.concat_arrays(self.parts) if len(self.parts) > 1 else self.parts[0]
        pieces = src.take(pa.array(idx))
        return pc.binary_join(pa.ListArray.from_arrays(pa.array(off, pa.int32()), pieces), "")


def _assemble(src: Src, parent: np.ndarray, n: int, codes: np.ndarray | None, labels: list[str], val: np.ndarray,
              quoted: np.ndarray, open_: str, close: str) -> pa.Array:
    """Per parent ``open_`` child, child, … ``close`` as JSON: each child is a value piece of ``src`` (``val``;
    ``quoted``: a string written between quotes) behind ``labels[codes]`` (a key's ``"key":``, or nothing).
    Two pieces a child: the value, and before it one prefix holding the previous value's closing quote,
    ``open_`` or the comma, the label and this value's opening quote (a table of 8 variants per label)."""
    m = len(parent)
    nl = len(labels)
    pre = []
    for lab in labels:
        for pq in ('', '"'):
            for lead in (",", open_):
                for openq in ("", '"'):
                    pre.append(pq + lead + lab + openq)
    pb = src.add(pa.array(pre + [open_ + close, close, '"' + close], pa.string()))
    cnt = np.bincount(parent, minlength=n) * 2 + 1
    off = np.zeros(n + 1, np.int64)
    np.cumsum(cnt, out=off[1:])
    idx = np.empty(off[-1], np.int64)
    ends = off[1:] - 1
    idx[ends] = pb + 8 * nl  # an empty object/array
    if m:
        child_off = _offsets(parent, n)
        rank = np.arange(m) - child_off[parent]  # position among its siblings
        first = rank == 0
        prevq = np.zeros(m, bool)
        prevq[1:] = quoted[:-1] & ~first[1:]
        code = codes if codes is not None else np.zeros(m, np.int64)
        base = off[:-1][parent] + 2 * rank
        idx[base] = pb + code * 8 + prevq * 4 + first * 2 + quoted
        idx[base + 1] = val
        last = np.ones(m, bool)
        last[:-1] = parent[1:] != parent[:-1]
        idx[ends[parent[last]]] = pb + 8 * nl + 1 + quoted[last]
    return src.join(idx, off)


def _i64(a: pa.Array) -> np.ndarray:
    """The value buffer of an int64 array, without copying (a null's slot holds anything)."""
    buf = a.buffers()[1]
    return np.frombuffer(buf, np.int64, len(a), a.offset) if buf is not None else np.zeros(0, np.int64)


def _json(parent: np.ndarray, n: int, codes: np.ndarray | None, labels: list[str], v: Values, open_: str,
          close: str) -> pa.Array:
    """Per parent (``parent``: each child's, non-decreasing) ``open_`` child, child, … ``close``: each child
    the value ``v`` holds at its row behind ``labels[codes]`` (a key's ``"key":``; ``codes`` None: no label).
    By the C extension when it is in use (``use_c_ext``), else by Arrow kernels (``Src``, ``_assemble``): the
    same bytes."""
    if _c is not None:
        lab_off, lab_data = _str_bufs(pa.array(labels, pa.string()))
        s_off, s_data = _str_bufs(v.s)
        t_off, t_data = _str_bufs(v.t)
        ints = _i64(v.i) if (v.kind == K_INT).any() else np.zeros(0, np.int64)
        off, data = _c.json_join(_offsets(parent, n).astype(np.int64),
                                 codes if codes is not None else np.zeros(0, np.int64), lab_off, lab_data, v.kind,
                                 v.ref, s_off, s_data, ints, t_off, t_data, open_.encode(), close.encode())
        return pa.StringArray.from_buffers(n, pa.py_buffer(off), pa.py_buffer(data))
    src = Src()
    k, ref = v.kind, v.ref
    val = np.full(len(k), src.c("null"), np.int64)  # the value's JSON: a piece of src
    quoted = np.zeros(len(k), bool)  # a string written between quotes (the quotes are in the prefixes)
    m = k == K_STR
    if m.any():
        val[m] = src.add(v.s) + ref[m]
        quoted[m] = True
        esc = _escaped_rows(v.s)
        if len(esc):
            eb = src.add(pa.array([_enc.encode(x).decode() for x in v.s.take(pa.array(esc)).to_pylist()], pa.string()))
            val[esc] = eb + np.arange(len(esc))
            quoted[esc] = False
    m = k == K_INT
    if m.any():
        val[m] = src.add(pc.cast(v.i, pa.string())) + ref[m]
    m = k == K_TEXT
    if m.any():
        val[m] = src.add(v.t) + ref[m]
    val[k == K_TRUE] = src.c("true")
    val[k == K_FALSE] = src.c("false")
    return _assemble(src, parent, n, codes, labels, val, quoted, open_, close)


# -- AnyValue columns ---------------------------------------------------------------------------
class Values:
    """One AnyValue per row (a struct array as ptars produces it): which member is set, the members,
    how each value's JSON is written (``kind``, ``ref``, ``t``: for ``_json``), and the rows this path does
    not handle."""

    def __init__(self, v: pa.Array, depth: int = 0):
        n = self.n = len(v)
        s = _sf(v, "string_value")
        b = _sf(v, "bool_value")
        i = _sf(v, "int_value")
        d = _sf(v, "double_value")
        arr = _sf(v, "array_value")
        vs, vb, vi, vd, va = _valid(s), _valid(b), _valid(i), _valid(d), _valid(arr)
        other = _valid(_sf(v, "kvlist_value")) | _valid(_sf(v, "bytes_value")) \
            | _valid(_sf(v, "string_value_strindex"))
        which = np.full(n, W_NONE, np.int8)
        for m, w in ((vs, W_STR), (vb, W_BOOL), (vi, W_INT), (vd, W_DOUBLE), (va, W_ARRAY), (other, W_OTHER)):
            if m.any():
                which[m] = w
        self.which = which
        self.bad = other.copy()
        # strings longer than MAX_ATTR_BYTES characters are truncated (otlp._pb_attrs)
        if vs.any() and _max_len(s) > MAX_ATTR_BYTES:
            long_ = pc.greater(pc.utf8_length(s), MAX_ATTR_BYTES)
            s = pc.if_else(long_, pc.utf8_slice_codeunits(s, 0, MAX_ATTR_BYTES), s)
        self.s, self.b, self.i, self.d = s, b, i, d
        self._text: bool | None = None  # prep_text done
        kind = _KIND_OF[which]  # how each value's JSON is written (K_*), and from which row:
        ref = np.arange(n, dtype=np.int64)  # of s (K_STR), of i (K_INT), of self.t (K_TEXT)
        texts: list[pa.Array] = []  # self.t: the doubles' JSON, then the arrays'
        nt = 0
        if vd.any():
            nt = int(vd.sum())
            texts.append(_doubles_json(d, vd))
            ref[vd] = np.arange(nt)
        if vb.any():
            kind[(which == W_BOOL) & ~_np_int(b, False).astype(bool)] = K_FALSE
        self.elems: Values | None = None
        self.first_idx = np.full(n, -1, np.int64)
        if va.any():
            if depth:
                self.bad |= va  # arrays in arrays: the Python path
                kind[va] = K_NULL
            else:
                lists = _sf(arr, "values")
                parent = _np_int(pc.list_parent_indices(lists)).astype(np.int64)
                items = pc.list_flatten(lists)
                _, h_any = _get_handlers()
                arows = np.flatnonzero(va)  # the array values, numbered 0.. (their JSON is built for them only)
                compact = np.full(n, -1, np.int64)
                compact[arows] = np.arange(len(arows))
                cparent = compact[parent]
                na = len(arows)
                if len(items):
                    ev = self.elems = Values(h_any.array_to_record_batch(items).to_struct_array(), 1)
                    self.bad[arows] |= np.bincount(cparent, weights=ev.bad, minlength=na) > 0
                    coff = _offsets(cparent, na)
                    has = np.diff(coff) > 0
                    self.first_idx[arows[has]] = coff[:-1][has]
                    ejson = _json(cparent, na, None, [""], ev, "[", "]")
                else:
                    ejson = pa.array(["[]"] * na, pa.string())
                texts.append(ejson)
                ref[arows] = nt + np.arange(na)
        self.kind, self.ref = kind, ref
        self.t = (pa.concat_arrays(texts) if len(texts) > 1 else texts[0]) if texts else pa.array([], pa.string())

    def prep_text(self) -> None:
        """``text_bad`` and ``nonempty`` per row, for the text ``normalize`` makes of a value (``_str1``): a
        string itself, an int in decimal, a bool as True/False, an array's first element when it is a string
        (``pick`` builds it for the rows asked); ``text_bad``: what it would make with ``str()`` of anything
        else (a double, a dict, bytes, an array's non-string first element)."""
        if self._text is not None:
            return
        w = self.which
        fw = _which(self.elems, self.first_idx) if self.elems is not None else np.full(self.n, W_ABSENT, np.int8)
        self.text_bad = (w == W_DOUBLE) | (w == W_OTHER) | self.bad | ((w == W_ARRAY) & (fw != W_ABSENT) & (fw != W_STR))
        nonempty = (w == W_INT) | (w == W_BOOL)
        if (w == W_STR).any():
            nonempty |= (w == W_STR) & (_lens(self.s) > 0)
        if self.elems is not None:
            eln = _lens(self.elems.s)
            nonempty |= (fw == W_STR) & (eln[np.maximum(self.first_idx, 0)] > 0)
        self.nonempty = nonempty
        self._text = True

    def pick(self, rows: np.ndarray) -> pa.Array:
        """The text (``prep_text``) of the values at ``rows`` (-1: null)."""
        w = _which(self, rows)
        parts = []
        if (w == W_STR).any():
            parts.append(_take(self.s, np.where(w == W_STR, rows, -1)))
        if (w == W_INT).any():
            parts.append(pc.cast(_take(self.i, np.where(w == W_INT, rows, -1)), pa.string()))
        if (w == W_BOOL).any():
            parts.append(pc.if_else(_take(self.b, np.where(w == W_BOOL, rows, -1)), "True", "False"))
        if (w == W_ARRAY).any() and self.elems is not None:
            fi = np.where(w == W_ARRAY, self.first_idx[np.maximum(rows, 0)], -1)
            parts.append(_take(self.elems.s, np.where(_which(self.elems, fi) == W_STR, fi, -1)))
        if not parts:
            return pa.nulls(len(rows), pa.string())
        return pc.coalesce(*parts) if len(parts) > 1 else parts[0]

    def text(self, rows: np.ndarray, empty_is_null: bool = True) -> tuple[pa.Array, np.ndarray]:
        """``pick`` at ``rows`` (-1: null) and the rows that are ``bad``; ``""`` → null when ``empty_is_null``."""
        if not self.n:
            return pa.nulls(len(rows), pa.string()), np.zeros(len(rows), bool)
        self.prep_text()
        ok = rows >= 0
        r = np.maximum(rows, 0)
        bad = ok & self.text_bad[r]
        if empty_is_null:
            rows = np.where(ok & self.nonempty[r], rows, -1)
        return self.pick(rows), bad


class KVs:
    """A list<KeyValue> column (attributes of spans or resources) flattened: the JSON object text per
    parent, lookups of single keys, and the parents this path does not handle."""

    def __init__(self, lists: pa.Array, n: int, cap: int):
        self.n = n
        parent = _np_int(pc.list_parent_indices(lists)).astype(np.int64)
        kv = pc.list_flatten(lists)
        self.parent = parent
        key = _sf(kv, "key")
        self.values = Values(_sf(kv, "value"))
        cnt = np.bincount(parent, minlength=n)
        bad = cnt > cap  # max_span_attributes: otlp.py drops the rest and warns
        bad_kv = self.values.bad | (_np_int(_sf(kv, "key_strindex")) != 0)
        if bad_kv.any():
            bad[parent[bad_kv]] = True
        enc = pc.dictionary_encode(key)
        codes = _np_int(enc.indices).astype(np.int64)
        self.codes = codes
        keys = enc.dictionary.to_pylist()
        self.key_code = {k: j for j, k in enumerate(keys)}
        nd = max(len(keys), 1)
        self._by_code: tuple[np.ndarray, np.ndarray] | None = None  # rows grouped by key (rows())
        if _c is not None:  # grouped and repeated keys found in one pass
            order, start, dup = _c.group_codes(_offsets(parent, n).astype(np.int64), codes, len(keys))
            self._by_code = (np.frombuffer(order, np.int64), np.frombuffer(start, np.int64))
            bad |= np.frombuffer(dup, np.bool_)
        elif len(codes):  # a key twice in one span: dict semantics (the Python path)
            if n * nd <= 4_000_000:  # a counts table of at most 32 MB, else sort
                dup = np.bincount(parent * nd + codes, minlength=n * nd).reshape(n, nd).max(axis=1) > 1
            else:
                pairs = np.unique(parent * nd + codes, return_counts=True)
                dup = np.zeros(n, bool)
                dup[pairs[0][pairs[1] > 1] // nd] = True
            bad |= dup
        self.bad = bad
        self.json = _json(parent, n, codes, [_enc.encode(k).decode() + ":" for k in keys], self.values, "{", "}")
        self._rows: dict[str, np.ndarray] = {}

    def rows(self, key: str) -> np.ndarray:
        """Per parent, the row of ``key`` in the flattened key/values (-1: absent)."""
        r = self._rows.get(key)
        if r is None:
            r = np.full(self.n, -1, np.int64)
            j = self.key_code.get(key)
            if j is not None:
                if self._by_code is None:  # rows grouped by key, once: each lookup is then a slice
                    order = np.argsort(self.codes, kind="stable")
                    start = np.zeros(len(self.key_code) + 1, np.int64)
                    np.cumsum(np.bincount(self.codes, minlength=len(self.key_code)), out=start[1:])
                    self._by_code = (order, start)
                order, start = self._by_code
                pos = order[start[j]:start[j + 1]]
                r[self.parent[pos]] = pos
            self._rows[key] = r
        return r


class Attrs:
    """The span's attributes with its resource's behind them (``normalize._first_str_merged``)."""

    def __init__(self, span: KVs, res: KVs, span_res: np.ndarray):
        self.sp, self.res, self.span_res = span, res, span_res
        self.n = span.n
        self.bad = span.bad | res.bad[span_res]

    def present(self, key: str) -> np.ndarray:
        return self.sp.rows(key) >= 0

    def text(self, keys, merged: bool = False) -> pa.Array:
        """The first of ``keys`` whose text is not null or empty (the span's, else the resource's when
        ``merged``): ``_first_str`` / ``_first_str_merged``."""
        n = self.n
        sv, rv = self.sp.values, self.res.values
        if sv.n:
            sv.prep_text()
        if rv.n:
            rv.prep_text()
        src = np.full(n, -1, np.int8)
        row = np.full(n, -1, np.int64)
        for k in keys:
            todo = src < 0
            r = self.sp.rows(k)
            here = todo & (r >= 0)
            if here.any():
                rr = np.maximum(r, 0)
                self.bad |= here & sv.text_bad[rr]
                hit = here & sv.nonempty[rr]
                src[hit], row[hit] = 0, r[hit]
            if merged and rv.n:
                r2 = self.res.rows(k)[self.span_res]
                here2 = todo & (r < 0) & (r2 >= 0)
                if here2.any():
                    rr = np.maximum(r2, 0)
                    self.bad |= here2 & rv.text_bad[rr]
                    hit = here2 & rv.nonempty[rr]
                    src[hit], row[hit] = 1, r2[hit]
        if not (src >= 0).any():
            return pa.nulls(n, pa.string())
        out = sv.pick(np.where(src == 0, row, -1)) if (src == 0).any() else None
        if (src == 1).any():
            o2 = rv.pick(np.where(src == 1, row, -1))
            out = o2 if out is None else pc.coalesce(out, o2)
        return out

    def first_present(self, keys, merged: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(which KVs, row) of the first of ``keys`` present: 0 span, 1 resource, -1 none."""
        src = np.full(self.n, -1, np.int8)
        row = np.full(self.n, -1, np.int64)
        for k in keys:
            r = self.sp.rows(k)
            m = (src < 0) & (r >= 0)
            src[m], row[m] = 0, r[m]
            if merged:
                rr = self.res.rows(k)[self.span_res]
                m = (src < 0) & (rr >= 0)
                src[m], row[m] = 1, rr[m]
        return src, row

    def count(self, keys, hi: int = INT64_MAX) -> pa.Array:
        """``normalize._num(..., as_int=True)`` where the first key present holds an int in 0..hi; any other
        value (a warning or a rejection in the Python path) is ``bad``."""
        _, r = self.first_present(keys)
        if not (r >= 0).any():
            return pa.nulls(self.n, pa.int64())
        w = _which(self.sp.values, r)
        v = _take(self.sp.values.i, np.where(w == W_INT, r, -1))
        vn = _np_int(v)
        self.bad |= ((r >= 0) & (w != W_INT)) | (vn < 0) | (vn > hi)
        return v

    def number(self, keys) -> pa.Array:
        """``normalize._num(..., as_int=False)``: an int or a finite double of the first key present."""
        _, r = self.first_present(keys)
        if not (r >= 0).any():
            return pa.nulls(self.n, pa.float64())
        vals = self.sp.values
        w = _which(vals, r)
        fd = _take(vals.d, np.where(w == W_DOUBLE, r, -1))
        out = fd
        if (w == W_INT).any():
            out = pc.coalesce(fd, pc.cast(_take(vals.i, np.where(w == W_INT, r, -1)), pa.float64()))
        fin = _np_int(pc.is_finite(out), True).astype(bool)
        self.bad |= ((r >= 0) & (w != W_INT) & (w != W_DOUBLE)) | ~fin
        return out


def _flag(attrs: Attrs, keys) -> np.ndarray:
    """``normalize._streamed``: 1 true, 0 false, -1 unknown, from the first key present."""
    _, r = attrs.first_present(keys)
    vals = attrs.sp.values
    w = _which(vals, r)
    out = np.full(attrs.n, -1, np.int8)
    bv = _take(vals.b, np.where(w == W_BOOL, r, -1))
    bn = _np_int(pc.cast(bv, pa.int8()), -1)
    out = np.where(w == W_BOOL, bn, out)
    sv = pc.utf8_lower(pc.utf8_trim_whitespace(_take(vals.s, np.where(w == W_STR, r, -1))))
    out = np.where(_np_int(pc.equal(sv, "true"), False).astype(bool), 1, out)
    out = np.where(_np_int(pc.equal(sv, "false"), False).astype(bool), 0, out)
    attrs.bad |= w == W_ARRAY
    return out


def _which(vals: Values, rows: np.ndarray) -> np.ndarray:
    """Which AnyValue member is set at ``rows`` (W_ABSENT where -1)."""
    if not len(vals.which):
        return np.full(len(rows), W_ABSENT, np.int8)
    return np.where(rows >= 0, vals.which[np.maximum(rows, 0)], W_ABSENT)


def _isin(a: pa.Array, values) -> np.ndarray:
    return _np_int(pc.is_in(a, pa.array(list(values), pa.string())), False).astype(bool)


def _starts(a: pa.Array, prefix: str) -> np.ndarray:
    return _np_int(pc.starts_with(a, prefix), False).astype(bool)


def _where_str(mask: np.ndarray, value, other: pa.Array) -> pa.Array:
    return pc.if_else(pa.array(mask), pa.scalar(value, pa.string()), other)


# -- the decoder --------------------------------------------------------------------------------
def decode_bodies(bodies: list[bytes], sources: list[str], settings: Settings) -> NativeResult:
    """Rows of the protobuf ``bodies`` (``sources``: each request's ``ingest_source``). Raises what
    ptars raises for a body it cannot parse (the caller decodes the batch with otlp.py instead)."""
    h_req, h_any = _get_handlers()
    nreq = len(bodies)
    rb = h_req.list_to_record_batch(bodies)  # raises ValueError for a body that is not protobuf or not UTF-8
    rs_list = rb.column(0)
    rs_req = _np_int(pc.list_parent_indices(rs_list)).astype(np.int64)
    rs = pc.list_flatten(rs_list)
    nrs = len(rs)
    resource = _sf(rs, "resource")
    ss_list = _sf(rs, "scope_spans")
    ss_rs = _np_int(pc.list_parent_indices(ss_list)).astype(np.int64)
    ss = pc.list_flatten(ss_list)
    scope_name = pc.fill_null(_sf(_sf(ss, "scope"), "name"), "")
    sp_list = _sf(ss, "spans")
    sp_ss = _np_int(pc.list_parent_indices(sp_list)).astype(np.int64)
    sp = pc.list_flatten(sp_list)
    n = len(sp)
    span_rs = ss_rs[sp_ss]
    span_req = rs_req[span_rs]
    if n == 0:
        return NativeResult(None, [0] * nreq)

    bad = np.zeros(n, bool)
    tid, b1 = _hex_ids(_sf(sp, "trace_id"), 16, False)
    sid, b2 = _hex_ids(_sf(sp, "span_id"), 8, False)
    pid, b3 = _hex_ids(_sf(sp, "parent_span_id"), 8, True)
    bad |= b1 | b2 | b3
    start = _np_int(_sf(sp, "start_time_unix_nano")).astype(np.uint64)
    end = _np_int(_sf(sp, "end_time_unix_nano")).astype(np.uint64)
    bad |= (start == 0) | ((end != 0) & (end < start)) | (start > INT64_MAX) | (end > INT64_MAX)
    kind = _np_int(_sf(sp, "kind"))
    status = _sf(sp, "status")
    code = _np_int(_sf(status, "code"))
    bad |= (kind < 0) | (kind > 127) | (code < 0) | (code > 127)
    smsg = pc.fill_null(_sf(status, "message"), "")
    smsg = pc.if_else(pc.equal(smsg, ""), pa.scalar(None, pa.string()), smsg)
    nev = _np_int(pc.list_value_length(_sf(sp, "events")))
    bad |= nev > 0  # span events: the Python path
    name = _sf(sp, "name")

    res_attrs = pc.fill_null(_sf(resource, "attributes"), pa.scalar([], _sf(resource, "attributes").type)) \
        if resource.null_count else _sf(resource, "attributes")
    res_kv = KVs(res_attrs, nrs, settings.max_span_attributes)
    span_kv = KVs(_sf(sp, "attributes"), n, settings.max_span_attributes)
    a = Attrs(span_kv, res_kv, span_rs)
    # service.name: a string (anything else is stored as the Python path decides)
    svc_rows = res_kv.rows("service.name")
    svc_w = _which(res_kv.values, svc_rows)
    rs_bad_svc = (svc_w != W_ABSENT) & (svc_w != W_STR) & (svc_w != W_NONE)
    service_rs = _take(res_kv.values.s, np.where(svc_w == W_STR, svc_rows, -1))
    bad |= rs_bad_svc[span_rs]
    service = service_rs.take(pa.array(span_rs))
    scope = scope_name.take(pa.array(sp_ss))

    # LiteLLM's stringified dicts, itl/block hashes, the excludes-cache flag, HTTP status: the Python path
    for k in ("metadata.usage_object", "metadata.requester_metadata", "hidden_params", "agentobs.itl_ms",
              "agentobs.prompt.block_hashes", nz.INPUT_EXCLUDES_CACHE, *nz.HTTP_STATUS_KEYS):
        bad |= a.present(k)
    bad |= (res_kv.rows(nz.INPUT_EXCLUDES_CACHE) >= 0)[span_rs]

    # classify
    op_rows = span_kv.rows("gen_ai.operation.name")
    op, bad_op = span_kv.values.text(op_rows, empty_is_null=False)
    bad |= bad_op
    # what depends on the scope and the service only: per scope (one row per instrumentation scope of a
    # resource, a few per request), then taken per span
    scope_l = pc.utf8_lower(scope_name)
    engine_scope = (_starts(scope_l, "vllm") | _starts(scope_l, "sglang"))[sp_ss]
    litellm_scope = _isin(scope_l, ["litellm"])[sp_ss]
    s_l = pc.binary_join_element_wise(scope_l, pc.utf8_lower(pc.fill_null(service_rs, "")).take(pa.array(ss_rs)), " ")
    has_sg = _np_int(pc.match_substring(s_l, "sglang"), False).astype(bool)[sp_ss]
    has_vl = _np_int(pc.match_substring(s_l, "vllm"), False).astype(bool)[sp_ss]
    per_request = a.present("gen_ai.latency.e2e") | a.present("gen_ai.latency.time_to_first_token") \
        | a.present("gen_ai.usage.prompt_tokens")
    is_engine = _isin(name, ["llm_request"]) | (per_request & ((kind == 2) | engine_scope))
    op_val = _np_int(pc.is_valid(op), False).astype(bool)
    lite = _isin(op, nz.LITELLM_OPS) & (_isin(name, ["litellm_request"]) | litellm_scope) & ~is_engine
    if lite.any():
        mapped = pc.take(pa.array(list(nz.LITELLM_OPS.values())),
                         pc.index_in(op, pa.array(list(nz.LITELLM_OPS))))
        op = pc.if_else(pa.array(lite), mapped, op)
    none = ~op_val & ~is_engine
    chat = none & (_starts(name, "chat ") | _isin(name, ["litellm_request"]))
    rtype_rows = span_kv.rows("llm.request.type")
    rtype, bad_rt = span_kv.values.text(rtype_rows, empty_is_null=False)
    rt_here = none & ~chat & (rtype_rows >= 0)
    bad |= rt_here & (bad_rt | (_which(span_kv.values, rtype_rows) == W_NONE))
    tool = none & ~chat & ~rt_here & _starts(name, "execute_tool")
    agent = none & ~chat & ~rt_here & ~tool & _starts(name, "invoke_agent")
    op = pc.if_else(pa.array(rt_here), rtype, op)
    op = _where_str(chat, "chat", op)
    op = _where_str(tool, "execute_tool", op)
    op = _where_str(agent, "invoke_agent", op)
    eng_op = pc.if_else(pc.fill_null(pc.not_equal(op, ""), False), op, pa.scalar("engine"))
    op = pc.if_else(pa.array(is_engine), eng_op, op)
    role = np.where(is_engine, "engine",
                    np.where(_isin(op, nz.CALL_OPS), "gateway",
                             np.where(_isin(op, nz.AGENT_OPS), "agent",
                                      np.where(_isin(op, ["execute_tool"]), "tool", "other"))))
    role_a = pa.array(role, pa.string())

    session_keys, task_keys, task_type_keys, tenant_keys = nz.alias_keys(settings)
    session_id = a.text(session_keys, merged=True)
    task_id = a.text(task_keys, merged=True)
    task_type = a.text(task_type_keys, merged=True)
    tenant = a.text(tenant_keys, merged=True)
    agent_name = a.text(("gen_ai.agent.name",))
    attempt = a.count(nz.ATTEMPT_KEYS, INT32_MAX)
    branch = a.text(("agentobs.branch",))
    model = a.text(nz.MODEL_KEYS)
    provider = a.text(nz.PROVIDER_KEYS)

    # engine (normalize._engine_of)
    eng = np.where(has_sg, "sglang", np.where(is_engine & (has_vl | _isin(name, ["llm_request"])), "vllm", ""))
    engine = pa.array(eng, pa.string())
    prov_eng = _isin(provider, ["vllm", "sglang"]) & (eng == "")
    engine = pc.if_else(pa.array(prov_eng), provider, pc.if_else(pa.array(eng == ""),
                                                                 pa.scalar(None, pa.string()), engine))

    # instance: address, ':port' unless the address has one
    addr = a.text(nz.ADDR_KEYS, merged=True)
    src, prow = a.first_present(("server.port",), merged=True)
    pt_s, bad_s = span_kv.values.text(np.where(src == 0, prow, -1), empty_is_null=True)
    pt_r, bad_r = res_kv.values.text(np.where(src == 1, prow, -1), empty_is_null=True)
    port = pc.coalesce(pt_s, pt_r)
    pw = np.where(src == 0, _which(span_kv.values, np.where(src == 0, prow, -1)),
                  _which(res_kv.values, np.where(src == 1, prow, -1)))
    addr_ok = _np_int(pc.is_valid(addr), False).astype(bool)
    bad |= addr_ok & (bad_s | bad_r | (pw == W_ARRAY))
    has_colon = _np_int(pc.match_substring_regex(addr, r":[^\]]*$"), False).astype(bool)
    add_port = addr_ok & _np_int(pc.is_valid(port), False).astype(bool) & ~has_colon
    instance = pc.if_else(pa.array(add_port), pc.binary_join_element_wise(addr, port, ":"), addr)

    response_id = a.text(("gen_ai.response.id",))
    request_id = a.text(("gen_ai.request.id",))
    p = a.count(nz.INPUT_KEYS)
    c = a.count(nz.CACHED_KEYS)
    o = a.count(nz.OUTPUT_KEYS)
    both = _np_int(pc.and_(pc.is_valid(p), pc.is_valid(c)), False).astype(bool)
    bad |= both & (_np_int(c) > _np_int(p))  # the cache rule with its warning: the Python path
    system_tokens = a.count(("agentobs.prompt.system_tokens",))
    tool_def_tokens = a.count(("agentobs.prompt.tool_tokens",))
    ttft = a.number(nz.TTFT_KEYS)
    streamed = _flag(a, nz.STREAM_KEYS)
    ttft = pc.if_else(pa.array((role != "engine") & (streamed == 0)), pa.scalar(None, pa.float64()), ttft)
    queue_s = a.number(("gen_ai.latency.time_in_queue",))
    prefill_s = a.number(("gen_ai.latency.time_in_model_prefill",))
    decode_s = a.number(("gen_ai.latency.time_in_model_decode",))

    # finish reason: an array's first element, or a string stripped (a JSON array in text: the Python path)
    fr_rows = span_kv.rows("gen_ai.response.finish_reasons")
    fw = _which(span_kv.values, fr_rows)
    fr_arr, bad_fr = span_kv.values.text(np.where(fw == W_ARRAY, fr_rows, -1), empty_is_null=False)
    bad |= bad_fr
    fr_s = pc.utf8_trim_whitespace(_take(span_kv.values.s, np.where(fw == W_STR, fr_rows, -1)))
    bad |= _starts(fr_s, "[")
    fr_s = pc.if_else(pc.equal(fr_s, ""), pa.scalar(None, pa.string()), fr_s)
    finish_reason = pc.coalesce(fr_arr, fr_s)
    error_type = a.text(("error.type",))
    tool_name = a.text(("gen_ai.tool.name",))
    bad |= a.bad

    # requests with any span this path does not reproduce go to the Python path whole
    bad_req = np.zeros(nreq, bool)
    bad_req[span_req[bad]] = True
    keep = ~bad_req[span_req]
    accepted = np.bincount(span_req[keep], minlength=nreq).tolist()
    src_arr = pa.array(sources, pa.string()).take(pa.array(span_req))
    none_s = pa.nulls(n, pa.string())
    cols = {
        "trace_id": tid, "span_id": sid, "parent_span_id": pid, "name": name,
        "kind": pa.array(np.clip(kind, 0, 127).astype(np.int8)),  # rows out of range are dropped below
        "start_ns": pa.array(start.astype(np.int64)),
        "end_ns": pa.array(np.where(end == 0, start, end).astype(np.int64)),
        "status_code": pa.array(np.clip(code, 0, 127).astype(np.int8)),
        "status_message": smsg, "service_name": service, "scope_name": scope,
        "resource": res_kv.json.take(pa.array(span_rs)), "attributes": span_kv.json, "events": none_s,
        "role": role_a, "op": op, "session_id": session_id, "task_id": task_id, "task_type": task_type,
        "tenant": tenant, "agent_name": agent_name,
        "attempt": pc.cast(pc.if_else(pa.array(bad), pa.scalar(None, pa.int64()), attempt), pa.int32()),
        "branch": branch, "model": model, "provider": provider, "engine": engine, "instance": instance,
        "response_id": response_id, "request_id": request_id, "input_tokens": p, "cached_tokens": c,
        "output_tokens": o, "system_tokens": system_tokens, "tool_def_tokens": tool_def_tokens, "ttft_s": ttft,
        "queue_s": queue_s, "prefill_s": prefill_s, "decode_s": decode_s, "finish_reason": finish_reason,
        "error_type": error_type, "tool_name": tool_name,
        "itl_ms": pa.nulls(n, SPAN_SCHEMA.field("itl_ms").type),
        "block_hashes": pa.nulls(n, SPAN_SCHEMA.field("block_hashes").type), "ingest_source": src_arr,
    }
    table = pa.table([cols[f.name].cast(f.type) for f in SPAN_SCHEMA], schema=SPAN_SCHEMA)
    if not keep.all():
        table = table.filter(pa.array(keep))
    fb = np.flatnonzero(bad_req).tolist()
    for r in fb:
        accepted[r] = 0
    return NativeResult(table if table.num_rows else None, accepted, fb)
