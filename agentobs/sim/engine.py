"""One simulated engine instance: admission, continuous batching with chunked prefill, KV cache.

The instance is a fluid discrete-event model. Between two events (an arrival, a prefill finishing,
a request finishing) the batch is constant, so every step takes the same time ``step_s`` (see
presets.py) and the instance only advances a step counter ``V``. A decoding request finishes when
``V`` reaches its target; its inter-token gaps are the step times of the epochs it lived through
(kept as a short log), so a long prefill co-scheduled with a decode shows up in that decode's ITL.

Admission: FCFS (or ``lpm``: longest cached prefix first), at most ``max_num_seqs`` running, the
prompt's blocks must fit after evicting unused cached blocks; a waiting queue longer than
``max_waiting`` rejects (HTTP 503). When a request moving to decode cannot get blocks for its
output, the most recently admitted other request is preempted (its blocks freed, recomputed later),
as vLLM does under KV pressure.

Restart (``restart``): the engine process dies and a new one starts at once — the cache empty, the Prometheus
counters back to 0, a new process start time; the requests in flight fail (their clients see the connection drop),
and the dying process publishes no KV events for the blocks it held.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from .cache import KVCache
from .chain import RangeMap
from .presets import CostPreset


@dataclass
class InstanceSpec:
    name: str                      # host:port
    engine: str = "vllm"           # vllm | sglang
    preset: str = "h100x2-qwen3-32b"
    block_size: int = 16
    prefix_caching: bool = True    # vLLM --enable-prefix-caching / SGLang radix cache on
    kv_capacity_tokens: int | None = None  # default: the preset's
    offload_ratio: float = 0.0     # vLLM CPU offload tier, × GPU pool (0 = off)
    hicache: bool = False          # SGLang --enable-hierarchical-cache
    hicache_ratio: float = 2.0
    hicache_write_policy: str = "write_through"
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192  # chunked-prefill token budget per step
    max_waiting: int = 1024
    schedule_policy: str = "fcfs"  # fcfs | lpm
    cache_report: bool = True      # cached tokens reported to clients (SGLang --enable-cache-report)
    max_model_len: int | None = None  # vLLM --max-model-len / SGLang --context-length (None: only the KV pool limits)
    model: str | None = None       # the model served; a session's calls go to replicas of one model (router.py).
                                   # None: undeclared (one pool of all undeclared replicas); names the preset's
                                   # model in the telemetry
    process_metrics: bool = False  # /metrics has process_start_time_seconds (vLLM with one API server; not SGLang,
                                   # not multi-process vLLM: ../shared/reference/vllm.md §1.1)


class Req:
    """One model call as the engine sees it (plus what the emitters and ground truth need)."""

    __slots__ = (
        "cid", "sess", "branch", "attempt", "chain", "nblk", "P", "O", "fail", "t0", "inst", "C", "C_host",
        "t_arrive", "t_admit", "t_first", "t_end", "rem", "v_first", "v_end", "n_alloc", "n_cached",
        "preempted", "itl", "prefill_s", "queue_s", "status", "finish", "R", "prev", "evict_first",
        "evicted_blocks", "call", "seq", "out_ids", "order", "ctx", "evict_log", "prefilled",
    )
    # the slots' types (set by the fleet when the call is made, then by the engine as it runs)
    cid: str
    sess: str | None
    branch: Any
    attempt: int
    chain: Any
    nblk: int
    P: int
    O: int  # noqa: E741 -- the output-token count, named like P
    fail: Any
    t0: float
    inst: Any
    C: int
    C_host: int
    t_arrive: float
    t_admit: Any
    t_first: float
    t_end: float
    rem: float
    v_first: float
    v_end: float
    n_alloc: int
    n_cached: int
    preempted: int
    itl: Any
    prefill_s: float
    queue_s: float
    status: str
    finish: str
    R: Any
    prev: Any
    evict_first: Any
    evicted_blocks: int
    call: Any
    seq: Any
    out_ids: Any
    order: int
    ctx: float
    evict_log: Any
    prefilled: bool  # its prompt's blocks were computed and cached (a restart before that loses them uncomputed)

    def __init__(self):
        self.C = 0
        self.C_host = 0
        self.preempted = 0
        self.evict_first = None
        self.evict_log = None  # (time, first id, end id) of each evicted run of this request's blocks, in time order
        self.evicted_blocks = 0
        self.itl = None
        self.status = "ok"
        self.finish = "stop"
        self.out_ids = None
        self.prev = None
        self.t_admit = None
        self.prefilled = False


class Hist:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds):
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += n
        self.sum += v * n
        self.count += n


class Instance:
    def __init__(self, spec: InstanceSpec, cost: CostPreset, idx: int, sink, ids, cache_cls=KVCache):
        self.spec = spec
        self.cost = cost
        self.model = spec.model or cost.model  # the served model's name, as the telemetry reports it
        self.idx = idx
        self.sink = sink
        self.ids = ids  # allocator of unique block ids (output blocks)
        B = spec.block_size
        cap_tokens = spec.kv_capacity_tokens or cost.kv_capacity_tokens
        self.capacity_blocks = cap_tokens // B
        host = 0
        if spec.engine == "vllm" and spec.offload_ratio > 0:
            host = int(self.capacity_blocks * spec.offload_ratio)
        if spec.engine == "sglang" and spec.hicache:
            host = int(self.capacity_blocks * spec.hicache_ratio)
        self.kv_events: list = []
        self.owner = RangeMap()  # block id ranges -> the request that last held them
        self._new_cache = lambda: cache_cls(
            self.capacity_blocks, B, enabled=spec.prefix_caching, radix=spec.engine == "sglang", host_blocks=host,
            write_through=spec.hicache_write_policy == "write_through",
            on_event=self._kv_event if sink.wants_kv_events else None, on_evict=self._on_evict)
        self.cache = self._new_cache()
        self.epoch = 0.0          # unix seconds at simulated time 0 (the fleet sets it)
        self.started_s = -60.0    # when the engine process started (simulated seconds): before the run, then restarts
        self.restarts = 0
        self.waiting: deque[Req] = deque()
        self.prefill: deque[Req] = deque()
        self.decoding: list = []  # heap (v_end, seq, req)
        self.running: dict[int, Req] = {}  # admitted (prefill or decode), by admission order key
        self.V = 0.0
        self.t = 0.0
        self.step_s = 0.0
        self.chunk = 0.0
        self.ctx_dec = 0.0
        self.version = 0
        self.admit_seq = 0
        self.now = 0.0
        # ITL log: epochs as (V at start, step seconds)
        self.seg_V: list[float] = [0.0]
        self.seg_s: list[float] = [0.0]
        self.blocked = False
        self.cur_sess: str | None = None
        self.s = Stats(spec.engine)

    # -- KV events / eviction bookkeeping ----------------------------------------------------
    def _kv_event(self, kind, hashes, medium, parent):
        self.kv_events.append((self.now, kind, hashes, medium, parent, self.cur_sess))

    def _on_evict(self, ranges: list[tuple[int, int]]) -> None:
        owners: dict[Req, int] = {}
        pop = self.owner.pop_range
        now = self.now
        for lo, hi in ranges:
            for a, b, r in pop(lo, hi):
                owners[r] = owners.get(r, 0) + (b - a)
                log = r.evict_log
                if log is None:
                    r.evict_log = log = []
                log.append((now, a, b))
        for r, n in owners.items():
            if r.evict_first is None:
                r.evict_first = now
            r.evicted_blocks += n

    def restart(self, t: float) -> list[Req]:
        """The engine process dies at ``t`` and a new one starts: returns the requests it dropped (failed)."""
        self.advance(t)
        self.sink.kv_flush(self)  # what the old process published before it died
        dropped = list(self.running.values()) + list(self.waiting)  # admitted (by admission order), then queued
        for r in dropped:
            r.status, r.finish = "error", "restart"
            r.t_end = t
            r.O = 0  # what it generated is lost with the stream
            # its blocks (hit or computed) went with the process: the next call of the thread finds none
            log = r.evict_log
            if log is None:
                r.evict_log = log = []
            for a, b in r.chain.runs(0, r.nblk):
                log.append((t, a, b))
            if r.evict_first is None:
                r.evict_first = t
        # every cached block is gone (ground truth: the eviction of each request's blocks), with no KV event
        if self.owner.ks:
            self._on_evict([(self.owner.ks[0], max(e[0] for e in self.owner.iv.values()))])
        self.kv_events.clear()
        self.cache = self._new_cache()
        self.waiting.clear()
        self.prefill.clear()
        self.decoding = []
        self.running = {}
        self.blocked = False
        self.ctx_dec = 0.0
        self.cur_sess = None
        self.s = Stats(self.spec.engine)
        self.started_s = t
        self.restarts += 1
        self._restep()
        return dropped

    # -- load for routers ----------------------------------------------------------------------
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    # -- time advance ----------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        dt = t - self.t
        self.t = t
        self.now = t
        if dt <= 0 or self.step_s <= 0:
            return
        steps = dt / self.step_s
        self.V += steps
        self.s.busy_s += dt
        if self.prefill:
            head = self.prefill[0]
            head.rem -= steps * self.chunk
        n_tok = len(self.decoding) + (self.chunk if self.prefill else 0)
        self.s.iter_tokens.observe(n_tok, max(1, int(steps)))

    def next_time(self) -> float | None:
        if self.step_s <= 0:
            return None
        cands = []
        if self.prefill:
            cands.append(self.t + max(0.0, self.prefill[0].rem) / self.chunk * self.step_s)
        if self.decoding:
            cands.append(self.t + max(0.0, self.decoding[0][0] - self.V) * self.step_s)
        return min(cands) if cands else None

    def _restep(self) -> None:
        c = self.cost
        n_dec = len(self.decoding)
        if not self.prefill and not n_dec:
            self.step_s = 0.0
            self.chunk = 0.0
        else:
            chunk = 0.0
            if self.prefill:
                chunk = float(max(self.spec.max_batched_tokens - n_dec, self.spec.max_batched_tokens // 4))
            mem = c.weights_s + c.kv_s_per_token * self.ctx_dec
            comp = (n_dec + chunk) / c.prefill_tps
            self.step_s = c.overhead_s + max(mem, comp)
            self.chunk = chunk
        if self.step_s != self.seg_s[-1]:
            self.seg_V.append(self.V)
            self.seg_s.append(self.step_s)
        self.version += 1

    def prompt_limit(self) -> tuple[int, str]:
        """The longest prompt this replica accepts, and what sets it: ``max_model_len`` or the KV pool (a prompt
        that cannot fit in the pool can never be scheduled; vLLM refuses to start when one could, SGLang caps its
        ``max_req_input_len`` at the pool size)."""
        pool = self.capacity_blocks * self.spec.block_size
        mml = self.spec.max_model_len
        if mml is not None and mml <= pool:
            return mml, "max_model_len"
        return pool, "kv_pool"

    def refuse_reason(self, P: int) -> str | None:
        """The engine's 400 message for a prompt of ``P`` tokens it will not serve, else None."""
        limit, what = self.prompt_limit()
        if P <= limit:
            return None
        if self.spec.engine == "sglang":
            return (f"Input length ({P} tokens) exceeds the maximum allowed length ({limit} tokens). "
                    "Use a shorter input or enable --allow-auto-truncate.")
        if what == "max_model_len":
            return (f"This model's maximum context length is {limit} tokens. However, your request has {P} input "
                    "tokens. Please reduce the length of the input messages.")
        return f"The prompt ({P} tokens) is longer than the KV cache pool ({limit} tokens) can hold."

    # -- events ------------------------------------------------------------------------------------
    def arrive(self, r: Req, t: float) -> bool:
        """A request reaches the engine; False if the waiting queue is full (503)."""
        self.advance(t)
        if len(self.waiting) >= self.spec.max_waiting:
            self.s.rejected += 1
            return False
        r.t_arrive = t
        r.inst = self
        self.waiting.append(r)
        self._admit(t)
        self._restep()
        return True

    def wake(self, t: float) -> list[Req]:
        """Process what is due at ``t``; returns finished requests."""
        self.advance(t)
        done: list[Req] = []
        changed = True
        while changed:
            changed = False
            if self.prefill and (self.prefill[0].rem <= 1e-6 or self.prefill[0].rem / self.chunk * self.step_s < 1e-9):
                self._prefill_done(self.prefill.popleft(), t)
                changed = True
            while self.decoding and (self.decoding[0][0] - self.V) * self.step_s < 1e-9:
                _, _, r = heapq.heappop(self.decoding)
                self._finish(r, t)
                done.append(r)
                changed = True
        self._admit(t)
        self._restep()
        return done

    # -- admission ---------------------------------------------------------------------------------
    def _admit(self, t: float) -> None:
        spec = self.spec
        cache = self.cache
        B = spec.block_size
        if spec.schedule_policy == "lpm" and len(self.waiting) > 1:
            w = sorted(self.waiting, key=lambda r: -cache.gpu_match(r.chain, r.nblk))
            self.waiting = deque(w)
        while self.waiting and len(self.running) < spec.max_num_seqs and not self.blocked:
            r = self.waiting[0]
            nfull = r.nblk
            max_hit = (r.P - 1) // B  # at least the last prompt token is always recomputed
            g, h = cache.match(r.chain, min(nfull, max_hit))
            total = -(-r.P // B)
            need = total - g
            cache.acquire(r.chain, g)  # pin the hit first: making room must not evict it
            if not cache.allocate(need, t):
                if not self.running:  # alone and still does not fit: serve it anyway (overcommit)
                    cache.used += need
                else:
                    cache.release(r.chain, g, 0)
                    break
            self.waiting.popleft()
            self.cur_sess = r.sess
            if h:
                cache.load_from_host(r.chain, g, g + h)
            r.C = (g + h) * B
            r.C_host = h * B
            r.n_alloc = total
            r.n_cached = g + h
            r.t_admit = t
            r.queue_s = t - r.t_arrive
            computed = r.P - r.C
            load_equiv = h * B * self.cost.prefill_tps / self.cost.host_load_tps
            r.rem = computed + load_equiv
            self.admit_seq += 1
            r.order = self.admit_seq
            self.running[r.order] = r
            self.prefill.append(r)
            s = self.s
            s.prompt_tokens += r.P
            s.cached_gpu += g * B
            s.cached_host += h * B
            s.computed_tokens += computed
            s.queue.observe(r.queue_s)

    def _prefill_done(self, r: Req, t: float) -> None:
        cache = self.cache
        B = self.spec.block_size
        # newly full prompt blocks are hashed and cached (KV event BlockStored)
        self.cur_sess = r.sess
        if self.spec.prefix_caching:
            cache.store(r.chain, r.n_cached, r.nblk)
            r.n_cached = r.nblk
        r.t_first = t
        r.prefilled = True
        r.prefill_s = t - r.t_admit
        # output blocks
        total = -(-(r.P + r.O) // B)
        extra = total - r.n_alloc
        if extra > 0:
            while not cache.allocate(extra, t):
                # vLLM: preempt the lowest-priority (latest admitted) running request, possibly
                # this one; the oldest request always progresses, so this cannot livelock.
                victim = self.running[next(reversed(self.running))]
                if victim is r:
                    if len(self.running) == 1:
                        cache.used += extra  # alone and still too big: overcommit rather than stall
                        break
                    del self.running[r.order]
                    ncached = r.n_cached if self.spec.prefix_caching else 0
                    cache.release(r.chain, ncached, r.n_alloc - ncached)
                    r.preempted += 1
                    self.s.preemptions += 1
                    self.waiting.appendleft(r)
                    self.blocked = True
                    return
                self._preempt(victim, t)
            r.n_alloc = total
        r.v_first = self.V
        r.ctx = r.P + r.O // 2
        self.ctx_dec += r.ctx
        r.v_end = self.V + max(0, r.O - 1)
        heapq.heappush(self.decoding, (r.v_end, r.order, r))

    def _preempt(self, v: Req, t: float) -> None:
        """vLLM recompute preemption: free the victim's blocks, put it back at the head of the queue."""
        if v in self.prefill:
            self.prefill.remove(v)
        else:
            self.decoding = [e for e in self.decoding if e[2] is not v]
            heapq.heapify(self.decoding)
            self.ctx_dec -= v.ctx
        del self.running[v.order]
        ncached = v.n_cached if self.spec.prefix_caching else 0
        self.cache.release(v.chain, ncached, v.n_alloc - ncached)
        v.preempted += 1
        self.s.preemptions += 1
        self.waiting.appendleft(v)
        self.blocked = True  # no admission until a running request finishes and frees blocks

    def _finish(self, r: Req, t: float) -> None:
        spec = self.spec
        B = spec.block_size
        self.ctx_dec -= r.ctx
        del self.running[r.order]
        self.blocked = False
        r.t_end = t
        self.cur_sess = r.sess
        cache = self.cache
        n_full_seq = (r.P + r.O) // B
        n_out_full = n_full_seq - r.nblk
        if spec.prefix_caching and n_out_full > 0:
            # decode blocks are hashed and cached too (never reused by the next turn: the chat
            # template re-renders the output), so they only take room.
            o = self.ids.take_run(n_out_full)
            r.out_ids = range(o, o + n_out_full)
            full_chain = r.chain.prefix(r.nblk)
            full_chain.append_run(o, n_out_full)
            cache.store(full_chain, r.nblk, n_full_seq)
            seq_chain = full_chain
            ncached = n_full_seq
        else:
            seq_chain = r.chain
            ncached = r.n_cached if spec.prefix_caching else 0
        assign = self.owner.assign
        for a, b in seq_chain.runs(0, ncached):
            assign(a, b, r)
        cache.release(seq_chain, ncached, r.n_alloc - ncached)
        r.itl = self._itl(r.v_first, r.v_end)
        st = self.s
        st.generation_tokens += r.O
        st.requests[r.finish] = st.requests.get(r.finish, 0) + 1
        st.ttft.observe(r.t_first - r.t_arrive)
        st.e2e.observe(t - r.t_arrive)
        st.prefill_h.observe(r.prefill_s)
        st.decode_h.observe(t - r.t_first)
        st.inference.observe(t - r.t_admit)
        st.prompt_h.observe(r.P)
        st.gen_h.observe(r.O)
        st.uncached_h.observe(r.P - r.C)
        if r.itl is not None:
            for gap, n in r.itl:
                st.itl.observe(gap, n)
        self.sink.kv_flush(self)

    def _itl(self, va: float, vb: float):
        """Inter-token gaps of tokens 2..O as runs [(step_s, count)], from the epoch log."""
        if vb <= va:
            return []
        segV, segS = self.seg_V, self.seg_s
        i = bisect.bisect_right(segV, va) - 1
        runs = []
        # token k (k=1..n) is emitted at V = va + k; its gap is the step time of the epoch it ends in
        k_lo = 1
        n = int(round(vb - va))
        while k_lo <= n:
            v_next = segV[i + 1] if i + 1 < len(segV) else math.inf
            k_hi = min(n, math.floor(v_next - va + 1e-9)) if v_next != math.inf else n
            if k_hi >= k_lo:
                runs.append((segS[i], k_hi - k_lo + 1))
                k_lo = k_hi + 1
            i += 1
            if i >= len(segV):
                break
        if k_lo <= n and runs:
            runs[-1] = (runs[-1][0], runs[-1][1] + n - k_lo + 1)
        return runs

    def trim_log(self) -> None:
        """Drop ITL epochs no running request can need any more."""
        lo = min((r.v_first for _, _, r in self.decoding), default=self.V)
        i = bisect.bisect_right(self.seg_V, lo) - 1
        if i > 1000:
            del self.seg_V[:i]
            del self.seg_s[:i]


class Stats:
    """Counters and histograms the Prometheus emitter renders (engine-specific names there)."""

    TTFT_B = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
              40.0, 80.0, 160.0, 640.0, 2560.0)
    ITL_B = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
    LAT_B = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
             960.0, 1920.0, 7680.0)
    TOK_B = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
    ITER_B = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    # SGLang bucket boundaries (observability/metrics_collector.py)
    SG_TTFT_B = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
    SG_ITL_B = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
                0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
    SG_E2E_B = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
                600.0, 1200.0, 1800.0, 2400.0)
    SG_QUEUE_B = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                  50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0,
                  1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0)

    def __init__(self, engine: str):
        sg = engine == "sglang"
        self.prompt_tokens = 0
        self.cached_gpu = 0
        self.cached_host = 0
        self.computed_tokens = 0
        self.generation_tokens = 0
        self.requests: dict[str, int] = {}
        self.preemptions = 0
        self.rejected = 0
        self.busy_s = 0.0
        self.ttft = Hist(self.SG_TTFT_B if sg else self.TTFT_B)
        self.itl = Hist(self.SG_ITL_B if sg else self.ITL_B)
        self.e2e = Hist(self.SG_E2E_B if sg else self.LAT_B)
        self.queue = Hist(self.SG_QUEUE_B if sg else self.LAT_B)
        self.prefill_h = Hist(self.LAT_B)
        self.decode_h = Hist(self.LAT_B)
        self.inference = Hist(self.LAT_B)
        self.prompt_h = Hist(self.TOK_B)
        self.gen_h = Hist(self.TOK_B)
        self.uncached_h = Hist(self.TOK_B)
        self.iter_tokens = Hist(self.ITER_B)
