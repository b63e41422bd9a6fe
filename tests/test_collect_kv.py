"""KV-event subscriber against a ZMQ publisher that speaks vLLM's wire format (PUB multipart
topic/seq/msgpack KVEventBatch, ROUTER replay), and the real vLLM capture layout."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import msgspec
import pytest
import zmq

from agentobs.collect import kvevents
from agentobs.collect.fleet import KVSource
from agentobs.collect.health import Health
from agentobs.collect.kvsub import KVSubscriber
from agentobs.model import connect
from agentobs.store.writer import Writer

FIX = Path(__file__).parent / "fixtures" / "vllm_real"


# vLLM's msgspec structs (vllm/distributed/kv_events.py): array_like, tagged events
class BlockStored(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


class Publisher:
    """PUB on a random port plus a ROUTER replay endpoint serving a ring of sent batches."""

    def __init__(self, ctx, topic=b"kv-events"):
        self.topic = topic
        self.pub = ctx.socket(zmq.PUB)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = ctx.socket(zmq.ROUTER)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.ring: dict[int, bytes] = {}
        self.enc = msgspec.msgpack.Encoder()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._serve_replay, daemon=True)
        self.t.start()

    def send(self, seq, batch, drop=False):
        payload = self.enc.encode(batch)
        self.ring[seq] = payload
        if not drop:  # a dropped message is in the replay ring but never published
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def _serve_replay(self):
        while not self.stop.is_set():
            if not self.router.poll(50):
                continue
            ident, _, start = self.router.recv_multipart()
            s = int.from_bytes(start, "big")
            for seq in sorted(k for k in self.ring if k >= s):
                self.router.send_multipart([ident, b"", seq.to_bytes(8, "big"), self.ring[seq]])
            self.router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self):
        self.stop.set()
        self.t.join()
        self.pub.close(0)
        self.router.close(0)


def _wait_joined(pub, sub_ready):
    """PUB/SUB slow joiner: publish probe batches (seq 0) until the subscriber has one."""
    for _ in range(200):
        pub.send(0, KVEventBatch(ts=1.0, events=[AllBlocksCleared()]))
        if sub_ready():
            return
        threading.Event().wait(0.02)
    raise AssertionError("subscriber never joined")


@pytest.mark.parametrize("replay", [False, True])
def test_subscriber_stores_events_counts_gaps_and_replays(tmp_path, replay):
    con = connect(tmp_path / "kv.duckdb")
    w = Writer(con, flush_s=0)
    ctx = zmq.Context()
    pub = Publisher(ctx)
    health = Health()
    src = KVSource(f"tcp://127.0.0.1:{pub.port}", "vllm-0:8000", "kv-events",
                   f"tcp://127.0.0.1:{pub.replay_port}" if replay else None)
    sub = KVSubscriber(src, w, health, ctx=ctx, flush_s=0.0)
    stop = threading.Event()
    t = threading.Thread(target=sub.run, args=(stop,))
    t.start()
    sub.ready.wait(5)
    _wait_joined(pub, lambda: sub.batches > 0)
    pub.send(1, KVEventBatch(ts=1791969700.5, events=[
        BlockStored([11, 12], None, list(range(32)), 16, None, "GPU"),
        BlockStored([2**64 - 5], 12, list(range(16)), 16, None, "GPU", "adapter-a"),
    ]))
    pub.send(2, KVEventBatch(ts=1791969701.0, events=[BlockRemoved([11], "GPU")]), drop=True)
    pub.send(3, KVEventBatch(ts=1791969701.0, events=[BlockRemoved([12], "GPU")]), drop=True)
    pub.send(4, KVEventBatch(ts=1791969702.0, events=[AllBlocksCleared()], data_parallel_rank=0))
    for _ in range(250):
        if sub.last_seq == 4:
            break
        threading.Event().wait(0.02)
    stop.set()
    t.join(5)
    w.close()
    pub.close()
    ctx.term()
    rows = con.execute("SELECT seq, event_idx, type, block_hashes, parent_block_hash, num_tokens, block_size, "
                       "medium, lora_name FROM kv_events WHERE seq > 0 ORDER BY seq, event_idx").fetchall()
    expected = [
        (1, 0, "BlockStored", ["11", "12"], None, 32, 16, "GPU", None),
        (1, 1, "BlockStored", [str(2**64 - 5)], "12", 16, 16, "GPU", "adapter-a"),
        (4, 0, "AllBlocksCleared", [], None, None, None, None, None),
    ]
    if replay:  # seq 2 and 3 were never published; the replay endpoint recovered them
        expected[2:2] = [(2, 0, "BlockRemoved", ["11"], None, None, None, "GPU", None),
                         (3, 0, "BlockRemoved", ["12"], None, None, None, "GPU", None)]
    assert rows == expected
    assert (sub.gaps, sub.replayed) == ((0, 2) if replay else (2, 0))
    assert health.value("agentobs_kv_event_gaps_total", {"instance": "vllm-0:8000"}) == (0 if replay else 2)
    assert con.execute("SELECT DISTINCT instance FROM kv_events").fetchall() == [("vllm-0:8000",)]
    con.close()


def test_malformed_messages_are_counted_not_fatal(tmp_path):
    con = connect(tmp_path / "kv.duckdb")
    w = Writer(con, flush_s=0)
    ctx = zmq.Context()
    pub = Publisher(ctx)
    health = Health()
    sub = KVSubscriber(KVSource(f"tcp://127.0.0.1:{pub.port}", "h:1", "kv-events"), w, health, ctx=ctx, flush_s=0)
    stop = threading.Event()
    t = threading.Thread(target=sub.run, args=(stop,))
    t.start()
    sub.ready.wait(5)
    _wait_joined(pub, lambda: sub.batches > 0)
    pub.pub.send_multipart([b"kv-events", b"\x00" * 8])  # two frames
    pub.pub.send_multipart([b"kv-events", (1).to_bytes(8, "big"), b"\xc1 not msgpack"])
    pub.pub.send_multipart([b"kv-events", (2).to_bytes(8, "big"), msgspec.msgpack.encode([1.0, [["Bogus", 1]]])])
    pub.send(3, KVEventBatch(ts=5.0, events=[BlockRemoved([7], None)]))
    for _ in range(250):
        if sub.last_seq == 3:
            break
        threading.Event().wait(0.02)
    stop.set()
    t.join(5)
    w.close()
    pub.close()
    ctx.term()
    assert health.value("agentobs_kv_events_rejected_total", {"instance": "h:1"}) == 3
    assert any("unknown KV event type 'Bogus'" in e for e in sub.errors)
    assert any("not msgpack" in e for e in sub.errors)
    assert con.execute("SELECT seq, type FROM kv_events WHERE seq > 0").fetchall() == [(3, "BlockRemoved")]
    con.close()


@pytest.mark.parametrize("capture", sorted(p.name for p in FIX.iterdir() if (p / "kv_events.jsonl").exists()))
def test_real_vllm_capture_decodes_with_session_ids(capture):
    """vLLM 0.32 (docs/real-vllm.md) sends events as msgpack *maps* with a session_id key; every
    BlockStored of the capture carries the session id of the request and its hashes."""
    out = kvevents.KVBatch()
    n_stored = 0
    for line in (FIX / capture / "kv_events.jsonl").read_text().splitlines():
        obj = json.loads(line)
        payload = bytes.fromhex(obj["payload_hex"])
        raw = msgspec.msgpack.decode(payload)
        n_stored += sum(1 for e in raw[1] if isinstance(e, dict) and e.get("type") == "BlockStored")
        kvevents.decode_payload(payload, "127.0.0.1:18000", obj["seq"], out)
    t = out.table().to_pylist()
    assert out.rejected == 0 and n_stored > 0
    stored = [r for r in t if r["type"] == "BlockStored"]
    assert len(stored) == n_stored
    assert all(r["session_id"] and r["session_id"].startswith("sess-") for r in stored)
    assert all(r["block_size"] == 128 and r["num_tokens"] == 128 * len(r["block_hashes"]) for r in stored)


def _run_sub(tmp_path, pub_topic, fleet_topic, send):
    """A subscriber with ``fleet_topic`` against a loopback publisher sending ``pub_topic``; ``send(pub)`` publishes
    after the subscriber has joined (it received a probe of any topic). Returns (stored rows, subscriber, health)."""
    con = connect(tmp_path / "kv.duckdb")
    w = Writer(con, flush_s=0)
    ctx = zmq.Context()
    pub = Publisher(ctx, topic=pub_topic)
    health = Health()
    sub = KVSubscriber(KVSource(f"tcp://127.0.0.1:{pub.port}", "vllm-0:8000", fleet_topic), w, health, ctx=ctx,
                       flush_s=0)
    stop = threading.Event()
    t = threading.Thread(target=sub.run, args=(stop,))
    t.start()
    sub.ready.wait(5)
    _wait_joined(pub, lambda: sub.messages > 0)
    before = sub.messages
    n = send(pub)
    for _ in range(250):
        if sub.messages >= before + n:
            break
        threading.Event().wait(0.02)
    stop.set()
    t.join(5)
    w.close()
    pub.close()
    ctx.term()
    rows = con.execute("SELECT seq, type FROM kv_events WHERE seq > 0 ORDER BY seq").fetchall()
    con.close()
    return rows, sub, health


def _three_batches(pub):
    for seq in (1, 2, 3):
        pub.send(seq, KVEventBatch(ts=1791969700.0 + seq, events=[BlockRemoved([seq], "GPU")]))
    return 3


def test_topic_mismatch_is_counted_and_warned_not_silent(tmp_path):
    # vLLM's default topic is "" (../shared/reference/vllm.md §4.1) while the fleet file says "kv-events": with a
    # subscription to "kv-events" alone nothing would ever arrive and nothing would say so
    rows, sub, health = _run_sub(tmp_path, b"", "kv-events", _three_batches)
    assert rows == []  # not the fleet file's topic: not stored
    # the probes of _wait_joined and the three batches all came with topic "": every one is counted
    assert sub.unexpected == {"": sub.messages} and sub.messages >= 4
    assert health.value("agentobs_kv_topic_mismatch_total", {"instance": "vllm-0:8000", "topic": ""}) == sub.messages
    assert sub.batches == 0 and sub.gaps == 0
    assert len(sub.warnings) == 1  # once per topic
    assert "sends topic ''" in sub.warnings[0] and "subscribes to 'kv-events'" in sub.warnings[0]


def test_matching_topics_are_stored_the_others_counted(tmp_path):
    def mixed(pub):
        _three_batches(pub)  # topic "kv-events-dp0": starts with the fleet file's "kv-events", ZMQ's prefix rule
        pub.pub.send_multipart([b"other", (9).to_bytes(8, "big"), b"\x90"])
        pub.pub.send_multipart([b"other"])  # malformed, but of a topic that is not ours: a mismatch, not a reject
        return 5

    rows, sub, health = _run_sub(tmp_path, b"kv-events-dp0", "kv-events", mixed)
    assert rows == [(1, "BlockRemoved"), (2, "BlockRemoved"), (3, "BlockRemoved")]
    assert sub.unexpected == {"other": 2} and sub.gaps == 0  # seq 9 of the other topic is no gap
    assert health.value("agentobs_kv_events_rejected_total", {"instance": "vllm-0:8000"}) == 0
    assert len(sub.warnings) == 1 and "'other'" in sub.warnings[0]


def test_empty_fleet_topic_takes_every_topic(tmp_path):
    rows, sub, _ = _run_sub(tmp_path, b"anything", "", _three_batches)
    assert rows == [(1, "BlockRemoved"), (2, "BlockRemoved"), (3, "BlockRemoved")]
    assert sub.unexpected == {} and sub.warnings == []
