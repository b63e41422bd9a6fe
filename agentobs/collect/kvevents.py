"""KV-cache events (vLLM ``KVEventBatch`` over ZMQ, msgpack) → ``kv_events`` rows.

Wire format (vLLM ``vllm/distributed/kv_events.py``): a multipart message ``(topic, seq as 8-byte
big-endian, msgpack payload)``; the payload is ``[ts, events, data_parallel_rank?]`` and every
event is a tagged array whose first element is the class name::

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
     lora_name, extra_keys?, group_idx?, kv_cache_spec_kind?, kv_cache_spec_sliding_window?, ...]
    ["BlockRemoved", block_hashes, medium, group_idx?]
    ["AllBlocksCleared"]

Newer vLLM adds trailing BlockStored fields; ``session_id`` is taken from a trailing string field
(see docs/real-vllm.md for the layout observed on a real server) or from a map-encoded event.
Block hashes are ints (low 64 bits, the default) or 32-byte digests; both are stored as text
(decimal for ints, hex for bytes) so they compare across sources.

The capture file format (``agentobs import kv-events``) is JSON lines, one batch per line:
``{"instance": "host:port", "seq": 12, "payload_hex": "..."}`` (raw msgpack) or
``{"instance": ..., "seq": ..., "decoded": [ts, events, rank]}`` (the same structure as JSON).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pyarrow as pa

from ..errors import InputError

KV_SCHEMA = pa.schema(
    [
        ("instance", pa.string()),
        ("ts", pa.timestamp("us")),
        ("seq", pa.int64()),
        ("event_idx", pa.int32()),
        ("type", pa.string()),
        ("block_hashes", pa.list_(pa.string())),
        ("parent_block_hash", pa.string()),
        ("num_tokens", pa.int32()),
        ("block_size", pa.int32()),
        ("medium", pa.string()),
        ("session_id", pa.string()),
        ("lora_name", pa.string()),
    ]
)
_KNOWN_STORED_FIELDS = 11  # fields after the tag up to kv_cache_spec_sliding_window
_dec = msgspec.msgpack.Decoder()


def _hash(h: Any) -> str:
    if isinstance(h, (bytes, bytearray)):
        return bytes(h).hex()
    if isinstance(h, bool):
        raise ValueError(f"block hash {h!r} is not an int or bytes")
    if isinstance(h, int):
        return str(h & (2**64 - 1)) if h < 0 else str(h)
    if isinstance(h, str):
        return h
    raise ValueError(f"block hash {h!r} is not an int or bytes")


@dataclass
class KVBatch:
    columns: dict[str, list] = field(default_factory=lambda: {n: [] for n in KV_SCHEMA.names})
    events: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    def table(self) -> pa.Table:
        return pa.table(self.columns, schema=KV_SCHEMA)


def _row(out: KVBatch, instance: str, ts: dt.datetime, seq: int, idx: int, typ: str, hashes, parent,
         ntok, bsize, medium, session, lora) -> None:
    c = out.columns
    c["instance"].append(instance)
    c["ts"].append(ts)
    c["seq"].append(seq)
    c["event_idx"].append(idx)
    c["type"].append(typ)
    c["block_hashes"].append(hashes)
    c["parent_block_hash"].append(parent)
    c["num_tokens"].append(ntok)
    c["block_size"].append(bsize)
    c["medium"].append(medium)
    c["session_id"].append(session)
    c["lora_name"].append(lora)
    out.events += 1


def decode_event(ev: Any) -> tuple:
    """(type, hashes, parent, num_tokens, block_size, medium, session_id, lora_name) of one event."""
    if isinstance(ev, dict):  # map-encoded variant
        typ = ev.get("type") or ev.get("tag")
        hashes = [_hash(h) for h in ev.get("block_hashes") or []]
        parent = ev.get("parent_block_hash")
        toks = ev.get("token_ids")
        return (typ, hashes, _hash(parent) if parent is not None else None,
                len(toks) if isinstance(toks, list) else ev.get("num_tokens"), ev.get("block_size"),
                ev.get("medium"), ev.get("session_id"), ev.get("lora_name"))
    if not isinstance(ev, (list, tuple)) or not ev or not isinstance(ev[0], str):
        raise ValueError(f"event must be a tagged array, got {str(ev)[:60]}")
    typ = ev[0]
    if typ == "BlockStored":
        if len(ev) < 5:
            raise ValueError(f"BlockStored has {len(ev) - 1} fields, expected at least 4")
        hashes = [_hash(h) for h in ev[1] or []]
        parent = _hash(ev[2]) if ev[2] is not None else None
        toks = ev[3]
        bsize = ev[4]
        medium = ev[6] if len(ev) > 6 else None
        lora = ev[7] if len(ev) > 7 else None
        session = None
        for extra in ev[1 + _KNOWN_STORED_FIELDS:]:
            if isinstance(extra, str):
                session = extra
        return (typ, hashes, parent, len(toks) if isinstance(toks, list) else None, bsize, medium, session, lora)
    if typ == "BlockRemoved":
        if len(ev) < 2:
            raise ValueError("BlockRemoved without block_hashes")
        return (typ, [_hash(h) for h in ev[1] or []], None, None, None, ev[2] if len(ev) > 2 else None, None, None)
    if typ == "AllBlocksCleared":
        return (typ, [], None, None, None, None, None, None)
    raise ValueError(f"unknown KV event type {typ!r}")


def decode_batch(batch: Any, instance: str, seq: int, out: KVBatch, where: str) -> None:
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], list):
        out.rejected += 1
        out.errors.append(f"{where}: payload must be [ts, events, ...], got {str(batch)[:60]}")
        return
    try:
        ts = dt.datetime.fromtimestamp(float(batch[0]), dt.UTC).replace(tzinfo=None)
    except (TypeError, ValueError, OverflowError):
        out.rejected += 1
        out.errors.append(f"{where}: batch timestamp {batch[0]!r} is not a number")
        return
    for i, ev in enumerate(batch[1]):
        try:
            typ, hashes, parent, ntok, bsize, medium, session, lora = decode_event(ev)
        except (ValueError, TypeError) as e:
            out.rejected += 1
            out.errors.append(f"{where}: events[{i}]: {e}")
            continue
        _row(out, instance, ts, seq, i, typ, hashes, parent, ntok, bsize, medium, session, lora)


def decode_payload(payload: bytes, instance: str, seq: int, out: KVBatch, where: str = "kv-events") -> None:
    try:
        batch = _dec.decode(payload)
    except msgspec.DecodeError as e:
        out.rejected += 1
        out.errors.append(f"{where}: seq {seq}: not msgpack ({e})")
        return
    decode_batch(batch, instance, seq, out, f"{where}: seq {seq}")


def decode_capture_line(obj: Any, out: KVBatch, where: str, default_instance: str | None = None) -> None:
    if not isinstance(obj, dict):
        raise InputError("each line must be a JSON object", where)
    instance = obj.get("instance") or default_instance
    if not instance:
        raise InputError("no 'instance' in the line and no --instance given", where)
    seq = obj.get("seq", 0)
    if "payload_hex" in obj:
        try:
            payload = bytes.fromhex(obj["payload_hex"])
        except (ValueError, TypeError):
            raise InputError("payload_hex is not hex", where) from None
        decode_payload(payload, instance, int(seq), out, where)
    elif "decoded" in obj:
        decode_batch(obj["decoded"], instance, int(seq), out, f"{where}: seq {seq}")
    else:
        raise InputError("line has neither 'payload_hex' nor 'decoded'", where)
