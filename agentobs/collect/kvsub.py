"""KV-cache event subscriber: ZMQ SUB to vLLM / SGLang publishers → ``kv_events``.

Each message is multipart ``(topic, seq as 8-byte big-endian, msgpack KVEventBatch)``; the payload
is decoded by ``kvevents.decode_payload`` (array- and map-encoded events, vLLM's ``session_id``).
Sequence numbers are tracked per source: a jump ``seq > last + 1`` is a gap of ``seq - last - 1``
batches (PUB/SUB drops under load or while disconnected), counted in
``agentobs_kv_event_gaps_total``. With a ``replay_endpoint`` the subscriber asks the publisher's
ROUTER socket for the missing range (send the 8-byte start seq, receive ``(seq, payload)`` frames
until seq −1) and counts what it recovered. A sequence that goes *down* is a publisher restart,
not a gap. Decoded rows go to the writer in small batches (every ``flush_s`` or 2,000 events).

Topics: the socket subscribes to every topic, so a fleet file whose ``topic`` differs from what the publisher
sends (vLLM's and SGLang's default is ``""``, the fleet example says ``kv-events``) is seen rather than silently
receiving nothing. A message whose topic does not start with the configured one (ZMQ's own prefix rule, so what
a subscription to that topic would have received is unchanged) is not stored: it is counted in
``agentobs_kv_topic_mismatch_total{instance, topic}`` and warned about once per topic (``warnings``).
"""

from __future__ import annotations

import threading
import time

import zmq

from ..store.writer import Writer
from . import kvevents
from .fleet import KVSource
from .health import Health

END = (-1).to_bytes(8, "big", signed=True)
MAX_TOPIC_LABELS = 8  # distinct unexpected topics labelled per subscriber; more are counted as "<other>"


class KVSubscriber:
    def __init__(self, source: KVSource, writer: Writer, health: Health | None = None,
                 ctx: zmq.Context | None = None, flush_s: float = 0.2, replay_timeout_ms: int = 2000):
        self.src = source
        self.writer = writer
        self.health = health or Health()
        self.ctx = ctx or zmq.Context.instance()
        self.flush_s = flush_s
        self.replay_timeout_ms = replay_timeout_ms
        self.last_seq: int | None = None
        self.gaps = 0
        self.replayed = 0
        self.restarts = 0
        self.batches = 0
        self.messages = 0  # every message received, whatever its topic or shape
        self.unexpected: dict[str, int] = {}  # messages of a topic the fleet file does not subscribe to, by topic
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.ready = threading.Event()
        self._topic = self.src.topic.encode()

    def _unexpected_topic(self, topic: bytes) -> None:
        """A message whose topic the fleet file's ``topic`` does not match: counted, warned about once per topic."""
        name = topic[:64].decode("utf-8", "replace")
        first = name not in self.unexpected
        if first and len(self.unexpected) >= MAX_TOPIC_LABELS:
            name, first = "<other>", "<other>" not in self.unexpected
        self.unexpected[name] = self.unexpected.get(name, 0) + 1
        self.health.kv_topic_mismatch.labels(self.src.instance, name).inc()
        if first:
            self.warnings.append(
                f"{self.src.endpoint} ({self.src.instance}): the publisher sends topic {name!r} but the fleet file "
                f"subscribes to {self.src.topic!r}; these batches are not stored — set kv_events topic: {name!r} "
                "(vLLM/SGLang --kv-events-config \"topic\", default \"\")")
            del self.warnings[:-100]

    def _handle(self, seq: int, payload: bytes, out: kvevents.KVBatch) -> None:
        before_rej = out.rejected
        kvevents.decode_payload(payload, self.src.instance, seq, out, where=self.src.endpoint)
        self.batches += 1
        if out.rejected > before_rej:
            self.health.kv_rejected.labels(self.src.instance).inc(out.rejected - before_rej)
            self.errors.extend(out.errors[-(out.rejected - before_rej):])
            del self.errors[:-100]

    def _replay(self, start: int, end: int, out: kvevents.KVBatch) -> int:
        """Ask the ROUTER replay endpoint for batches start..end-1; returns how many arrived."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        got = 0
        try:
            sock.connect(self.src.replay_endpoint)
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            while sock.poll(self.replay_timeout_ms):
                frames = [f for f in sock.recv_multipart()]
                while frames and frames[0] == b"":
                    frames.pop(0)
                if len(frames) < 2 or frames[0] == END or not frames[1]:
                    break
                seq = int.from_bytes(frames[0], "big", signed=True)
                if start <= seq < end:
                    self._handle(seq, frames[1], out)
                    got += 1
        finally:
            sock.close()
        return got

    def run(self, stop: threading.Event) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: a mismatch with the fleet file's is seen, not silent
        sub.connect(self.src.endpoint)
        self.ready.set()
        inst = self.src.instance
        out = kvevents.KVBatch()
        last_flush = time.monotonic()
        try:
            while not stop.is_set():
                if sub.poll(100):
                    while True:
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self.messages += 1
                        if not frames[0].startswith(self._topic):
                            self._unexpected_topic(frames[0])
                            continue
                        if len(frames) != 3 or len(frames[1]) != 8:
                            self.health.kv_rejected.labels(inst).inc()
                            self.errors.append(f"{self.src.endpoint}: message with {len(frames)} frames, "
                                               "expected (topic, seq, payload)")
                            continue
                        seq = int.from_bytes(frames[1], "big")
                        if self.last_seq is not None:
                            if seq > self.last_seq + 1:
                                missing = seq - self.last_seq - 1
                                recovered = self._replay(self.last_seq + 1, seq, out) if self.src.replay_endpoint else 0
                                self.replayed += recovered
                                self.gaps += missing - recovered
                                if recovered:
                                    self.health.kv_replayed.labels(inst).inc(recovered)
                                if missing - recovered:
                                    self.health.kv_gaps.labels(inst).inc(missing - recovered)
                            elif seq <= self.last_seq:
                                self.restarts += 1
                        self.last_seq = seq
                        self._handle(seq, frames[2], out)
                        if out.events >= 2000:
                            break
                now = time.monotonic()
                if out.events and (now - last_flush >= self.flush_s or out.events >= 2000):
                    self._flush(out)
                    out = kvevents.KVBatch()
                    last_flush = now
        finally:
            if out.events:
                self._flush(out)
            sub.close()

    def _flush(self, out: kvevents.KVBatch) -> None:
        self.writer.submit("kv_events", out.table())
        self.health.kv_events.labels(self.src.instance).inc(out.events)
