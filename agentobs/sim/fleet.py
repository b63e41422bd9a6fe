"""The discrete-event loop: sessions issue calls, the router picks a replica, replicas serve them.

Deterministic for a given workload and seed: one heap ordered by (time, sequence number), no
wall clock, no hash-order dependence.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from .cache import KVCache
from .cache_ref import BlockKVCache
from .chain import Chain, RangeMap
from .engine import Instance, InstanceSpec, Req
from .presets import preset
from .router import Router
from .workload import CallSpec, IdAlloc, Session

ARRIVE, ENGINE, WAKE, SNAP, RETRY, RESTART = 0, 1, 2, 3, 4, 5


@dataclass
class FleetSpec:
    instances: list[InstanceSpec]
    router: str = "round_robin"
    cache_threshold: float = 0.5
    net_s: float = 0.002          # gateway ↔ engine, each way
    snapshot_s: float = 5.0       # Prometheus scrape interval (simulated seconds); 0 = none
    start_epoch: float = 1790845200.0  # 2026-10-01T09:00:00Z
    seed: int = 1
    traceparent: bool = True      # the gateway forwards W3C traceparent to the engines (LiteLLM: no)
    cache_impl: str = "ranges"    # ranges (cache.py) | blocks (cache_ref.py: per-block reference, slow)
    restarts: tuple[tuple[str, float], ...] = ()  # (instance name, simulated seconds): its engine restarts then


CACHE_IMPLS = {"ranges": KVCache, "blocks": BlockKVCache}


@dataclass
class Call:
    """One issued call (one gateway span): the engine request plus the agent-side context."""

    req: Req
    sess: Session
    spec: CallSpec
    branch: str
    attempt: int
    t0: float
    t2: float = 0.0
    first: bool = False
    R: int = 0
    prev: Call | None = None
    tool_start: float | None = None
    rejected: bool = False
    refused: str | None = None  # the engine's 400 message: a prompt longer than it accepts (not retried)
    span_id: str = ""
    last_of_session: bool = False


@dataclass
class _Thread:
    branch: str
    calls: list
    i: int = 0
    prev: Call | None = None


@dataclass
class _SessState:
    sess: Session
    seg: int = 0
    active: int = 0
    seen: RangeMap = field(default_factory=RangeMap)  # block ids computed by earlier calls
    issued: int = 0
    first_t: float | None = None
    last_t: float = 0.0
    last_call: Call | None = None
    calls: list = field(default_factory=list)


class NullSink:
    wants_kv_events = False

    def call_done(self, call: Call, fleet: Fleet) -> None: ...
    def session_done(self, st: _SessState, fleet: Fleet) -> None: ...
    def kv_flush(self, inst: Instance) -> None:
        inst.kv_events.clear()
    def snapshot(self, fleet: Fleet, t: float) -> None: ...
    def close(self, fleet: Fleet) -> None: ...


class Fleet:
    def __init__(self, spec: FleetSpec, sink=None, ids: IdAlloc | None = None):
        self.spec = spec
        self.sink = sink or NullSink()
        self.ids = ids or IdAlloc(1 << 40)
        cache_cls = CACHE_IMPLS[spec.cache_impl]
        self.instances = [Instance(s, preset(s.preset), i, self.sink, self.ids, cache_cls)
                          for i, s in enumerate(spec.instances)]
        for inst in self.instances:
            inst.epoch = spec.start_epoch
        by_name = {i.spec.name: i for i in self.instances}
        for name, _ in spec.restarts:
            if name not in by_name:
                from ..errors import ConfigError

                raise ConfigError(f"restart of unknown instance {name!r}; the fleet's: {', '.join(by_name)}")
        self.router = Router(spec.router, self.instances, spec.cache_threshold)
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        self.calls_done = 0
        self.sessions_done = 0
        self.n_calls = 0
        self.refused = 0  # calls answered 400: prompt longer than the replica accepts
        self._salt = hashlib.blake2b(str(spec.seed).encode(), digest_size=8).hexdigest()

    # ids ---------------------------------------------------------------------------------------------
    def span_id(self, n: int) -> str:
        return hashlib.blake2b(f"{self._salt}/{n}".encode(), digest_size=8).hexdigest()

    def span_id_for(self, s: str) -> str:
        return hashlib.blake2b(f"{self._salt}/root/{s}".encode(), digest_size=8).hexdigest()

    def trace_id(self, s: str) -> str:
        return hashlib.blake2b(f"{self._salt}/{s}".encode(), digest_size=16).hexdigest()

    def _push(self, t: float, kind: int, obj, extra=None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, extra))

    # sessions ---------------------------------------------------------------------------------------
    def run(self, sessions: list[Session], until: float | None = None,
            progress: Callable[[int], None] | None = None, pace=None) -> None:
        """Run to completion (or ``until`` simulated seconds). ``pace(t)``, when given, is called before
        each event (live mode: wait for the wall clock; False stops the run)."""
        for s in sessions:
            st = _SessState(s)
            self._push(s.start_s, ARRIVE, st, None)
        if self.spec.snapshot_s > 0:
            self._push(0.0, SNAP, None, None)
        by_name = {i.spec.name: i for i in self.instances}
        for name, at in self.spec.restarts:
            self._push(at, RESTART, by_name[name], None)
        self.open_sessions = len(sessions)
        heap = self.heap
        pop = heapq.heappop
        last_prog = 0
        while heap:
            t, _, kind, obj, extra = pop(heap)
            if until is not None and t > until:
                break
            if pace is not None and not pace(t):
                break
            self.now = t
            if kind == WAKE:
                inst = obj
                if extra != inst.version:
                    continue
                for r in inst.wake(t):
                    self._done(r.call, t)
                self._sched(inst)
            elif kind == ENGINE:
                call = obj
                inst = extra
                if call.refused is None and inst.arrive(call.req, t):
                    self._sched(inst)
                else:
                    self.refused += call.refused is not None
                    call.rejected = True
                    call.req.status = "error"
                    call.req.finish = "rejected"
                    call.req.inst = inst
                    call.req.t_arrive = t
                    self._done(call, t)
            elif kind == ARRIVE:
                if extra is None:
                    self._start_segment(obj, t)
                else:
                    self._issue(obj, extra, t)
            elif kind == RETRY:
                st, th, prevcall = obj, extra[0], extra[1]
                self._issue_call(st, th, prevcall.spec, t, attempt=prevcall.attempt + 1, retry_of=prevcall)
            elif kind == RESTART:
                for r in obj.restart(t):
                    if not r.prefilled:
                        # ground truth: its new blocks were never computed (the process died first), so a later
                        # call computing them is not recomputing them
                        st0: _SessState = r.call._state
                        for a, b in r.chain.runs(r.call.R // obj.spec.block_size, r.nblk):
                            st0.seen.pop_range(a, b)
                    self._done(r.call, t)
            elif kind == SNAP:
                self.sink.snapshot(self, t)
                if self.open_sessions > 0 or any(i.running or i.waiting for i in self.instances):
                    self._push(t + self.spec.snapshot_s, SNAP, None, None)
            if progress is not None and self.calls_done - last_prog >= 1000:
                progress(self.calls_done - last_prog)
                last_prog = self.calls_done
        if pace is not None:
            pace.done()
        if progress is not None:
            progress(self.calls_done - last_prog)
        for inst in self.instances:
            self.sink.kv_flush(inst)
        self.sink.close(self)

    def _sched(self, inst: Instance) -> None:
        nt = inst.next_time()
        if nt is not None:
            self._push(nt, WAKE, inst, inst.version)
        if len(inst.seg_V) > 4000:
            inst.trim_log()

    def _start_segment(self, st: _SessState, t: float) -> None:
        segs = st.sess.segments
        while st.seg < len(segs) and not any(c for _, c in segs[st.seg].threads):
            st.seg += 1
        if st.seg >= len(segs):
            self._session_end(st)
            return
        seg = segs[st.seg]
        prev_main = st.last_call
        st.active = 0
        for branch, calls in seg.threads:
            if not calls:
                continue
            th = _Thread(branch, calls)
            th.prev = prev_main  # a branch forks from the main thread's latest call
            st.active += 1
            first = calls[0]
            self._push(self._when(st, first, t), ARRIVE, st, th)

    def _when(self, st: _SessState, c: CallSpec, t_ready: float) -> float:
        if c.at_s is not None:
            return max(t_ready + (0.05 if st.issued else 0.0), st.sess.start_s + c.at_s)
        return t_ready + c.gap_s

    def _issue(self, st: _SessState, th: _Thread, t: float) -> None:
        spec = th.calls[th.i]
        self._issue_call(st, th, spec, t, attempt=1)

    def _issue_call(self, st: _SessState, th: _Thread, spec: CallSpec, t: float, attempt: int,
                    retry_of: Call | None = None) -> None:
        sess = st.sess
        r = Req()
        r.sess = sess.sid if sess.engine_session else None  # the session id the engine sees
        r.branch = th.branch
        r.attempt = attempt
        if not isinstance(spec.chain, Chain):
            spec.chain = Chain.from_ids(spec.chain)
        r.chain = spec.chain
        r.nblk = spec.nblk
        r.P = spec.P
        fail = spec.fail and attempt == 1
        r.O = max(1, spec.O // 3) if fail else spec.O
        if fail:
            r.status, r.finish = "error", "abort"
        self.n_calls += 1
        call = Call(r, sess, spec, th.branch, attempt, t)
        call.span_id = self.span_id(self.n_calls)
        r.call = call
        r.cid = call.span_id
        inst = self.router.pick(sess.sid, spec.chain, spec.nblk)
        # a prompt longer than the replica accepts is refused before it reaches the scheduler (HTTP 400)
        call.refused = inst.refuse_reason(spec.P)
        # ground truth: leading blocks already computed by earlier calls of this session (a refused call
        # computes nothing, and does not count as the session's first call)
        B = self.instances[0].spec.block_size
        n = spec.nblk
        if n:
            runs = spec.chain.runs(0, n)
            R = st.seen.covered_prefix(runs)
            if call.refused is None:
                for a, b in runs:
                    st.seen.assign(a, b, True)
        else:
            R = 0
        call.R = R * B
        call.first = st.issued == 0
        call.prev = th.prev
        if th.prev is not None and spec.tool and th.prev.t2 < t:
            call.tool_start = th.prev.t2
        if call.refused is None:
            st.issued += 1
        if st.first_t is None:
            st.first_t = t
        call._thread = th  # type: ignore[attr-defined]
        call._state = st  # type: ignore[attr-defined]
        self._push(t + self.spec.net_s, ENGINE, call, inst)

    def _done(self, call: Call, t: float) -> None:
        r = call.req
        call.t2 = t + self.spec.net_s
        st: _SessState = call._state  # type: ignore[attr-defined]
        th: _Thread = call._thread  # type: ignore[attr-defined]
        st.calls.append(call)
        st.last_t = max(st.last_t, call.t2)
        self.calls_done += 1
        if r.status == "error" and call.refused is None:
            th.prev = call
            self.sink.call_done(call, self)
            self._push(call.t2 + call.spec.backoff_s, RETRY, st, (th, call))
            return
        if call.refused is None:  # a refused call leaves the thread's previous served call in place
            th.prev = call
            if th.branch == "main":
                st.last_call = call
        self.sink.call_done(call, self)
        th.i += 1
        if th.i < len(th.calls):
            self._push(self._when(st, th.calls[th.i], call.t2), ARRIVE, st, th)
            return
        st.active -= 1
        if st.active == 0:
            if th.branch != "main" and st.last_call is not None:
                st.last_call = st.last_call  # the main thread resumes after its branches
            st.seg += 1
            self._push(call.t2, ARRIVE, st, None)

    def _session_end(self, st: _SessState) -> None:
        self.open_sessions -= 1
        self.sessions_done += 1
        if st.calls:
            st.calls[-1].last_of_session = True
        self.sink.session_done(st, self)
