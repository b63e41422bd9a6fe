"""The C extension of the native decoder (agentobs/collect/_native_json.c: each span's and resource's attribute
JSON, the attributes grouped by key with the repeated-key check, the ids' hex) gives the bytes of the Arrow/NumPy
path it replaces (``otlp_native.use_c_ext(False)``), on every fixture and real capture, the bench payloads and
adversarial strings; it is built wherever a C compiler is; and bad buffers raise a ValueError instead of being
read (or written) past their end."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from test_collect_decode_speed import _bench_requests, _edge_request, _fixture_requests, _kv, _span

from agentobs.collect import otlp, otlp_native
from agentobs.config import load_settings

SETTINGS = load_settings(env={})
TID = bytes(range(1, 17))
ROOT = Path(__file__).resolve().parent.parent


def _compiler() -> bool:
    """A C compiler and the Python headers: what setup.py needs to build the extension."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None and (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()


@pytest.fixture
def cx():
    """The C extension, in use for this test (the previous choice restored after it)."""
    if otlp_native.C_EXT is None:
        pytest.skip("the C extension is not built (see test_extension_is_built)")
    was = otlp_native.use_c_ext(True)
    yield otlp_native.C_EXT
    otlp_native.use_c_ext(was)


def _both(cx, bodies: list[bytes]) -> otlp_native.NativeResult:
    """decode_bodies by the C extension (``cx``) and by the Arrow path: the same tables, byte for byte."""
    sources = ["otlp-http"] * len(bodies)
    otlp_native.use_c_ext(False)
    try:
        want = otlp_native.decode_bodies(bodies, sources, SETTINGS)
    finally:
        otlp_native.use_c_ext(True)
    assert otlp_native._c is cx
    got = otlp_native.decode_bodies(bodies, sources, SETTINGS)
    assert (got.accepted, got.fallback_requests) == (want.accepted, want.fallback_requests)
    assert (got.table is None) == (want.table is None)
    if got.table is not None:
        for col in ("attributes", "resource"):  # the two columns the C extension builds, compared first for a clear diff
            g, w = got.table[col].to_pylist(), want.table[col].to_pylist()
            bad = [(i, a, b) for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b]
            assert not bad, (col, bad[:3])
        assert got.table.equals(want.table)
    return got


def _one(attrs: dict, resource: dict | None = None) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(_kv(k, v) for k, v in (resource or {}).items())
    ss = rs.scope_spans.add()
    ss.scope.name = "s"
    _span(ss.spans.add(), TID, b"\x02" * 8, "chat m", attrs)
    return req.SerializeToString()


def test_extension_is_built():
    # a machine with a C compiler builds it (`pip install -e .`, or `python setup.py build_ext --inplace` in a
    # checkout): without this check a CI machine could test the Arrow path only and never notice
    if not _compiler():
        pytest.skip("no C compiler or Python headers: the Arrow path is the one in use")
    assert otlp_native.C_EXT is not None, \
        "agentobs/collect/_native_json.c is not built: run `python setup.py build_ext --inplace` (or pip install -e .)"
    assert otlp_native.C_EXT.API_VERSION == otlp_native.C_API_VERSION


def test_fixtures_and_real_captures_the_same(cx):
    reqs = _fixture_requests()
    for name, body in reqs:
        try:
            _both(cx, [body])
        except AssertionError as e:
            raise AssertionError(name) from e
    # all of them in one batch too (one JSON build over every request's spans), with the bench payloads and the
    # edge request (every value kind; handed back to the Python path whole, its JSON built all the same)
    res = _both(cx, [b for _, b in reqs] + [b for _, b in _bench_requests()] + [_edge_request().SerializeToString()])
    assert sum(res.accepted) >= 1024 + 60  # the 2 × 512 bench spans and the ≥ 60 fixtures decoded natively (≥ 1 span each)


def test_bench_payloads_the_same(cx):
    res = _both(cx, [b for _, b in _bench_requests()])
    assert res.accepted == [512, 512]


ADVERSARIAL = [
    # every control character, the two JSON must escape, DEL (msgspec writes it as it is) and U+2028
    {"ctl": "".join(map(chr, range(32))), "q": '"', "bs": "\\", "both": '\\"\\"', "del": "\x7f", "ls": "a\u2028b"},
    # non-ASCII of 2, 3 and 4 bytes, and in keys; keys that need escapes
    {"é": "ü", "中文": "字", "𝄞": "😀 x", 'k"q': 1, "k\\b": 2, "k\nl": 3, "k\x00": 4, "\x1f": "\x1f"},
    # empty key, empty value, empty arrays, an array of escapes
    {"": "", "e": [], "a": ["", '"', "\n", "é"], "n": None},
    # ints at the ends of int64, doubles msgspec writes in its own way (NaN/inf: null), bools
    {"min": -(2**63), "max": 2**63 - 1, "neg": -1, "zero": 0, "d": 1e16, "t": 1e-5, "nan": math.nan, "inf": -math.inf,
     "b": True, "f": False, "mix": [1, -(2**63), 2.5, True, None]},
    # long values: over MAX_ATTR_BYTES characters (truncated), just under, a long run of escapes
    {"long": "x" * 70_000, "under": "é" * 65_535, "esc": "\n\"" * 20_000, "k" * 300: "v"},
    # many keys
    {f"key.{i}.\t": (i if i % 3 else f"v{i}\x01") for i in range(400)},
]


@pytest.mark.parametrize("attrs", ADVERSARIAL, ids=["control", "non-ascii-keys", "empty", "numbers", "long", "many"])
def test_adversarial_values_the_same(cx, attrs):
    body = _one(attrs, resource={"service.name": "s\"vc\n", "r\x01": ["é", 1]})
    res = _both(cx, [body])
    assert res.fallback_requests == [] and res.accepted == [1]
    # and the text is what the Python path (otlp.py: msgspec over the span's attributes) writes
    want = otlp.decode_protobuf(body, SETTINGS, "otlp-http", "x").table()
    assert res.table["attributes"].to_pylist() == want["attributes"].to_pylist()
    assert res.table["resource"].to_pylist() == want["resource"].to_pylist()


def test_exact_text(cx):
    # hand-written: '"' and '\\' escaped with a backslash, \n short, \x01 as \u0001, é as its UTF-8 bytes
    body = _one({'a"b': "x\ny\x01", "n": -5, "arr": ["é", 2, False], "d": 0.5, "z": None})
    res = _both(cx, [body])
    assert res.table["attributes"].to_pylist() == ['{"a\\"b":"x\\ny\\u0001","n":-5,"arr":["é",2,false],"d":0.5,"z":null}']
    assert json.loads(res.table["attributes"][0].as_py()) == {'a"b': "x\ny\x01", "n": -5, "arr": ["é", 2, False],
                                                                "d": 0.5, "z": None}
    assert res.table["resource"].to_pylist() == ["{}"]


def test_random_values_the_same(cx):
    # random keys and values over the whole byte range of UTF-8 text: many spans in one batch
    rng = random.Random(21)
    alphabet = [chr(c) for c in range(0, 0x80)] + ["é", "ø", "中", "😀", "\u2028"]
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i in range(300):
        attrs = {}
        for _ in range(rng.randint(0, 12)):
            k = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
            r = rng.random()
            v = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) if r < 0.5 else \
                rng.randint(-(2**63), 2**63 - 1) if r < 0.7 else rng.uniform(-1e9, 1e9) if r < 0.8 else \
                [rng.choice(["a", "\"", "\\x", "é"]) for _ in range(rng.randint(0, 3))] if r < 0.9 else rng.random() < 0.5
            attrs[k] = v
        _span(ss.spans.add(), TID, (i + 1).to_bytes(8, "big"), "chat m", attrs)
    res = _both(cx, [req.SerializeToString()])
    assert res.accepted == [300]


def test_repeated_key_many_attributes_and_strindex_handed_back_the_same(cx):
    req = ExportTraceServiceRequest.FromString(_one({"a": 1, "b": "x\n"}))
    sp = req.resource_spans[0].scope_spans[0].spans[0]
    sp.attributes.append(_kv("a", 2))  # a key twice
    sp.attributes.append(KeyValue(key="s", value=AnyValue(string_value_strindex=2)))
    over = _one({f"k{i}": i for i in range(SETTINGS.max_span_attributes + 5)})
    res = _both(cx, [req.SerializeToString(), over, _one({"ok": "y"})])
    assert res.fallback_requests == [0, 1] and res.accepted == [0, 0, 1]


def test_no_c_ext_environment_variable():
    # $AGENTOBS_NO_C_EXT=1: the Arrow path in that process (the bench's "before")
    code = "from agentobs.collect import otlp_native as o; print(o._c is None, o.C_EXT is None)"
    env = {**os.environ, "AGENTOBS_NO_C_EXT": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", str(otlp_native.C_EXT is None)]


# -- the C function itself on bad buffers ------------------------------------------------------
def _args(**over):
    """json_join's arguments for two parents: {"k":"s"} and {"k":5,"k":<text 0>} (a valid call)."""
    a = dict(child_off=np.array([0, 1, 3], np.int64), codes=np.array([0, 0, 0], np.int64),
             lab_off=np.array([0, 4], np.int32), lab_data=b'"k":', kind=np.array([1, 2, 3], np.int8),
             ref=np.array([0, 0, 0], np.int64), s_off=np.array([0, 1], np.int32), s_data=b"s",
             ints=np.array([5], np.int64), t_off=np.array([0, 3], np.int32), t_data=b"1.5", open=b"{", close=b"}")
    a.update(over)
    return list(a.values())


def test_json_join_valid_call(cx):
    off, data = cx.json_join(*_args())
    assert np.frombuffer(off, np.int32).tolist() == [0, 9, 24]  # 1+4+3+1 = 9; 1+4+1+1+4+3+1 = 15 more
    assert data == b'{"k":"s"}{"k":5,"k":1.5}'
    # no labels (arrays), no parents, a parent without children
    off, data = cx.json_join(*_args(codes=np.zeros(0, np.int64), open=b"[", close=b"]"))
    assert data == b'["s"][5,1.5]'
    assert cx.json_join(*_args(child_off=np.array([0], np.int64))) == (b"\0\0\0\0", b"")
    assert cx.json_join(*_args(child_off=np.array([0, 0], np.int64)))[1] == b"{}"


@pytest.mark.parametrize("over,message", [
    ({"child_off": np.array([0, 2, 1], np.int64)}, "child_off out of order"),
    ({"child_off": np.array([0, 1, 4], np.int64)}, "child_off out of order or beyond the children at parent 1"),
    ({"child_off": np.array([-1, 1, 3], np.int64)}, "child_off"),
    ({"child_off": np.zeros(0, np.int64)}, "child_off is empty"),
    ({"child_off": np.array([0, 1, 3], np.int32)}, "child_off"),  # 12 bytes: not int64s
    ({"codes": np.array([0, 1, 0], np.int64)}, "label code out of range at child 1"),
    ({"codes": np.array([0, -1, 0], np.int64)}, "label code out of range"),
    ({"codes": np.array([0, 0], np.int64)}, "codes has 2 entries"),
    ({"kind": np.array([1, 2, 9], np.int8)}, "unknown value kind at child 2"),
    ({"ref": np.array([1, 0, 0], np.int64)}, "value index out of range at child 0"),
    ({"ref": np.array([0, 1, 0], np.int64)}, "value index out of range at child 1"),
    ({"ref": np.array([0, 0, -3], np.int64)}, "value index out of range at child 2"),
    ({"ref": np.array([0, 0], np.int64)}, "ref has 2 entries"),
    ({"s_off": np.array([0, 5], np.int32)}, "value index out of range at child 0"),  # beyond the data
    ({"s_off": np.array([1, 0], np.int32)}, "value index out of range"),  # decreasing
    ({"lab_off": np.array([0, 40], np.int32)}, "label code out of range"),
    ({"t_off": np.zeros(0, np.int32)}, "text offsets is empty"),
    ({"ints": b"123"}, "ints"),
])
def test_json_join_refuses_bad_buffers(cx, over, message):
    with pytest.raises(ValueError, match=message):
        cx.json_join(*_args(**over))


def test_json_join_misaligned_buffer(cx):
    raw = np.zeros(4 * 8 + 1, np.uint8)[1:].view(np.uint8)  # 32 bytes starting at an odd address
    with pytest.raises(ValueError, match="not an aligned array"):
        cx.json_join(*_args(child_off=raw[:24]))


def test_json_join_over_2_gib_is_refused_before_allocating(cx):
    # 2,100 children pointing at one 1 MiB text: 2.2 GB of output, more than int32 offsets hold; measured (no
    # allocation) and refused
    m = 2100
    big = b"x" * (1 << 20)
    with pytest.raises(OverflowError, match="over 2 GiB"):
        cx.json_join(*_args(child_off=np.array([0, m], np.int64), codes=np.zeros(0, np.int64),
                                           kind=np.full(m, 3, np.int8), ref=np.zeros(m, np.int64),
                                           t_off=np.array([0, len(big)], np.int32), t_data=big))


def test_json_join_random_buffers_never_crash(cx):
    # random indices and offsets: each call either raises ValueError or returns offsets consistent with its data
    rng = np.random.default_rng(7)
    ok = 0
    for _ in range(2000):
        n, m = int(rng.integers(0, 5)), int(rng.integers(0, 8))
        args = _args(child_off=np.sort(rng.integers(-1, m + 2, n + 1)).astype(np.int64),
                     codes=rng.integers(-1, 3, m if rng.random() < 0.7 else 0).astype(np.int64),
                     lab_off=np.array([0, 2, 3], np.int32), lab_data=b"ab\"",
                     kind=rng.integers(-1, 7, m).astype(np.int8), ref=rng.integers(-1, 3, m).astype(np.int64),
                     s_off=rng.integers(-2, 8, 3).astype(np.int32), s_data=b'a"\n\x01\\\xc3\xa9z',
                     ints=np.array([-(2**63), 7], np.int64), t_off=rng.integers(-1, 5, 3).astype(np.int32),
                     t_data=b"1.5,")
        try:
            off, data = cx.json_join(*args)
        except ValueError:
            continue
        o = np.frombuffer(off, np.int32)
        assert len(o) == n + 1 and o[0] == 0 and o[-1] == len(data) and (np.diff(o) >= 0).all()
        ok += 1
    assert ok > 50  # some calls were valid


@pytest.mark.parametrize("nbytes,optional", [(16, False), (8, False), (8, True)])
def test_hex_ids_the_same(cx, nbytes, optional):
    # good ids, all zeros, too short, too long, empty (null when optional), and an array with an offset and nulls
    ids = [bytes(range(1, nbytes + 1)), b"\x00" * nbytes, b"\xff" * (nbytes - 1), b"\xab" * (nbytes + 1), b"",
           bytes([0] * (nbytes - 1) + [1]), None, b"\xfe\x01" * (nbytes // 2)]
    arr = pa.array([b"x"] + ids, pa.binary()).slice(1)
    got = otlp_native._hex_ids(arr, nbytes, optional)
    otlp_native.use_c_ext(False)
    want = otlp_native._hex_ids(arr, nbytes, optional)
    otlp_native.use_c_ext(True)
    assert got[0].equals(want[0]) and got[1].tolist() == want[1].tolist()
    # by hand: bad = the zero id, the short and the long one, and the empty one (and the null: empty) unless optional
    assert got[1].tolist() == [False, True, True, True, not optional, False, not optional, False]
    assert got[0][0].as_py() == bytes(range(1, nbytes + 1)).hex() and got[0][7].as_py() == "fe01" * (nbytes // 2)


def test_group_codes(cx):
    # parents: [a b a] [b] [] [c c]: grouped by code in child order; parents 0 and 3 repeat a key
    order, start, dup = cx.group_codes(np.array([0, 3, 4, 4, 6], np.int64), np.array([0, 1, 0, 1, 2, 2], np.int64), 3)
    assert np.frombuffer(order, np.int64).tolist() == [0, 2, 1, 3, 4, 5]
    assert np.frombuffer(start, np.int64).tolist() == [0, 2, 4, 6]
    assert list(dup) == [1, 0, 0, 1]
    for off, codes, nd, message in [
        ([0, 2, 1], [0, 0], 1, "out of order"), ([0, 1], [0, 0], 1, "not covering the 2 children"),
        ([0, 2], [0, 3], 2, "code out of range .0..1. at child 1"), ([0, 2], [-1, 0], 2, "code out of range"),
        ([], [], 1, "child_off is empty"), ([0, 0], [], -1, "nd negative"), ([0, 1], [0], 2**62, "more than the"),
    ]:
        with pytest.raises(ValueError, match=message):
            cx.group_codes(np.array(off, np.int64), np.array(codes, np.int64), nd)


def test_hex_ids_bad_buffers(cx):
    with pytest.raises(ValueError, match="beyond the data at id 1"):
        cx.hex_ids(np.array([0, 8, 20], np.int32), b"\x01" * 16, 8)
    with pytest.raises(ValueError, match="out of order"):
        cx.hex_ids(np.array([8, 0], np.int32), b"\x01" * 16, 8)
    with pytest.raises(ValueError, match="nbytes 0"):
        cx.hex_ids(np.array([0], np.int32), b"", 0)
    with pytest.raises(ValueError, match="offsets is empty"):
        cx.hex_ids(np.zeros(0, np.int32), b"", 8)


def test_group_codes_and_hex_ids_random_buffers_never_crash(cx):
    rng = np.random.default_rng(8)
    good = 0
    for _ in range(2000):
        n, m = int(rng.integers(0, 5)), int(rng.integers(0, 8))
        off = np.sort(rng.integers(-1, m + 2, n + 1)).astype(np.int64)
        codes = rng.integers(-1, 4, m).astype(np.int64)
        try:
            order, start, dup = cx.group_codes(off, codes, int(rng.integers(0, 4)))
            # every child once, grouped by code
            assert sorted(np.frombuffer(order, np.int64).tolist()) == list(range(m)) and len(dup) == n
            good += 1
        except ValueError:
            pass
        hoff = rng.integers(-1, 12, int(rng.integers(1, 5))).astype(np.int32)
        try:
            text, bad = cx.hex_ids(hoff, b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09", int(rng.integers(1, 4)))
            assert len(bad) == len(hoff) - 1
            good += 1
        except ValueError:
            pass
    assert good > 100
