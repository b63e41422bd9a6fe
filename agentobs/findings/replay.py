"""The observed sessions as a simulator workload: replay them through agentobs.sim as configured and
with a fix applied, and count the re-prefill each instance pays.

What is replayed (from the metric run's ``m_calls``, calls in the window with an instance and a
prompt size):

- **sessions**: the calls of one session id (a call without one is a session of its own), in start
  order, split into threads by ``branch``: consecutive ``main`` calls form a sequential segment, a run
  of other branches a parallel segment (one thread per branch, the main thread waits for them) — the
  simulator's session model. Each call keeps its observed prompt P and output O; the idle gap before
  it is its observed start minus the end of the previous call of its thread (closed loop, as an agent);
- **prefixes**: a call's prompt is a block chain whose first ``R ÷ B`` blocks are the previous call's
  (R = the observed reusable prefix, METRICS.md §1; a context reset starts a new chain), the rest new;
  a thread's first chain starts with the task type's shared system + tool-definition blocks, a
  branch's with its fork point's prefix;
- **fleet**: one simulated fleet per *pool* (instances linked by sessions that used both), each
  instance as configured (engine, KV pool, prefix caching, HiCache, CPU offload, scheduling, chunked
  prefill; block size of the pool, at least 16), engine timing from the simulator preset of the same
  model with the nearest KV pool; the router inferred from the observed follow-ups (≥ 20% changed
  replica → ``round_robin``, else ``session_affinity``).

Bounded cost: at most ``max_sessions`` sessions are replayed, a contiguous slice of the window in
session-start order chosen by ``seed`` (a slice, not a random subset, keeps the concurrency — and so
the KV pressure — of the observed traffic). Re-prefill is scaled to the window by prompt tokens:
``f = ΣP(all sessions of the pool) ÷ ΣP(replayed sessions of the pool)``.

Re-prefill in the simulation uses the same definition as the metrics (METRICS.md §1):
``X = max(0, min(R, ⌊(P−1)/B⌋·B) − C)`` for every call after a session's first, R counted from the
blocks the session's earlier calls computed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import AgentobsError

CALLS_SQL = """
SELECT coalesce(session_id, 'call:' || call_id) AS sid, call_id, coalesce(task_type, '') AS task_type,
       coalesce(branch, 'main') AS branch, instance, start_s, coalesce(end_s, start_s) AS end_s,
       prompt_tokens AS p, greatest(coalesce(output_tokens, 1), 1) AS o,
       coalesce(system_tokens, 0) + coalesce(tool_def_tokens, 0) AS head,
       reusable_tokens AS r, prev_call_id IS NOT NULL AS follow_up, cached_tokens AS c, reprefill_tokens AS x,
       ttft_s AS ttft,
       prev_call_id IS NOT NULL AND prev_instance IS DISTINCT FROM instance AS changed
FROM m_calls
WHERE in_win AND instance IS NOT NULL AND prompt_tokens > 0 AND start_s IS NOT NULL
ORDER BY sid, start_s, call_id
"""

OFFLOAD_SQL = """
SELECT key, value FROM engine_config_latest
WHERE instance = $instance AND key IN ('num_cpu_blocks', 'num_gpu_blocks', 'kv_offloading_size')
"""

AFFINE_BELOW = 0.2  # share of follow-ups that changed replica below which the router is taken as sticky


class ReplayError(AgentobsError):
    """The replay cannot be built (the reason says why); callers fall back to the analytical estimate."""


@dataclass(frozen=True)
class Fix:
    """A configuration change to replay: per-instance spec overrides and/or a router policy."""

    key: str
    label: str
    overrides: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    router: str | None = None
    router_instances: tuple[str, ...] = ()   # pools holding these instances get ``router``


@dataclass
class Pool:
    instances: list[str]
    specs: list = field(default_factory=list)      # agentobs.sim InstanceSpec, as configured
    router: str = "round_robin"
    block_size: int = 16
    sessions: list = field(default_factory=list)   # agentobs.sim Session
    ids: Any = None                                # the pool's agentobs.sim IdAlloc
    scale: float | None = None                     # ΣP all ÷ ΣP replayed
    calls: int = 0
    changed_share: float | None = None
    presets: dict[str, str] = field(default_factory=dict)
    skip: str | None = None                        # why this pool cannot be simulated
    observed: list = field(default_factory=list)   # the replayed sessions' observed calls (CALLS_SQL rows)

    @property
    def factor(self) -> float:
        """``scale`` of a pool whose sessions were picked (the replay sets it before anything is simulated)."""
        if self.scale is None:
            raise ReplayError(f"pool {', '.join(self.instances)}: no sessions picked, nothing to scale")
        return self.scale


@dataclass
class SimResult:
    """One simulation of a pool (as configured, or with a fix), per instance, over the replayed sessions (not
    scaled to the window): every surface that reports a replay reads these sums."""

    reprefill: dict[str, int]        # ΣX, METRICS.md §1 (calls 2…n)
    prompt: dict[str, int]           # ΣP
    cached: dict[str, int]           # ΣC
    output: dict[str, int]           # ΣO
    calls: dict[str, int]            # calls served (rejected calls are not)
    resume_ttft: dict[str, list]     # TTFT (s) of every call 2…n of a session thread: turn-resume TTFT
    rejected: int = 0

    def computed(self, inst: str) -> int:
        """Prefill the instance computed: Σ(P − C)."""
        return self.prompt[inst] - self.cached[inst]


@dataclass
class Replay:
    pools: list[Pool]
    sessions_total: int
    sessions_replayed: int
    calls_replayed: int
    slice_s: tuple[float, float]
    seed: int
    _memo: dict = field(default_factory=dict)

    def pool_of(self, instance: str) -> Pool | None:
        return next((p for p in self.pools if instance in p.instances), None)

    def result(self, pool: Pool, fix: Fix | None = None) -> SimResult:
        """The simulation of ``pool`` as configured, or with ``fix`` (memoised: findings and what-ifs of one replay
        share it; a fix that does not touch the pool is the pool as configured)."""
        key = (id(pool), fix.key if fix is not None and self._touches(pool, fix) else None)
        if key not in self._memo:
            self._memo[key] = _simulate(pool, fix if key[1] is not None else None, self.seed)
        return self._memo[key]

    def reprefill(self, pool: Pool, fix: Fix | None = None) -> dict[str, int]:
        """Simulated re-prefill tokens per instance of ``pool`` (as configured, or with ``fix``)."""
        return self.result(pool, fix).reprefill

    @staticmethod
    def _touches(pool: Pool, fix: Fix) -> bool:
        return any(i in pool.instances for i, _ in fix.overrides) or (
            fix.router is not None and any(i in pool.instances for i in fix.router_instances))


def _simulate(pool: Pool, fix: Fix | None, seed: int) -> SimResult:
    from ..sim.fleet import Fleet, FleetSpec
    from ..sim.run import CollectSink

    specs = list(pool.specs)
    router = pool.router
    if fix is not None:
        over = dict(fix.overrides)
        specs = [replace(s, **dict(over[s.name])) if s.name in over else s for s in specs]
        if fix.router is not None and any(i in pool.instances for i in fix.router_instances):
            router = fix.router
    sink = CollectSink()
    fleet = Fleet(FleetSpec(specs, router=router, snapshot_s=0.0, seed=seed), sink, pool.ids)
    fleet.run(pool.sessions)
    names = [s.name for s in specs]
    z = [{n: 0 for n in names} for _ in range(5)]
    res = SimResult(z[0], z[1], z[2], z[3], z[4], resume_ttft={n: [] for n in names})
    B = pool.block_size
    for c in sink.calls:
        if c.rejected:
            res.rejected += 1
            continue
        r = c.req
        i = r.inst.spec.name
        res.prompt[i] += r.P
        res.cached[i] += r.C
        res.output[i] += r.O
        res.calls[i] += 1
        if c.first:
            continue
        res.reprefill[i] += max(0, min(c.R, ((r.P - 1) // B) * B) - r.C)
        if c.prev is not None and getattr(r, "t_first", None) is not None:
            res.resume_ttft[i].append(r.t_first - c.t0)
    return res


# -- building ---------------------------------------------------------------------------------------------
def build(ctx, max_sessions: int, seed: int) -> Replay:
    """The replay of the window's sessions (at most ``max_sessions``); ``ReplayError`` says why not."""
    rows = ctx.rows(CALLS_SQL)
    if not rows:
        raise ReplayError("no calls with an instance and a prompt size in the window")
    by_sid: dict[str, list[dict]] = {}
    for r in rows:
        by_sid.setdefault(r["sid"], []).append(r)
    order = sorted(by_sid, key=lambda s: (by_sid[s][0]["start_s"], s))
    total = len(order)
    n = min(max_sessions, total)
    i0 = random.Random(seed).randrange(total - n + 1)
    chosen = order[i0:i0 + n]

    # pools: instances linked by a session that used both (union-find over every session in the window)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for calls in by_sid.values():
        first = find(calls[0]["instance"])
        for c in calls[1:]:
            parent[find(c["instance"])] = first
    groups: dict[str, list[str]] = {}
    for inst in sorted(parent):
        groups.setdefault(find(inst), []).append(inst)
    pools = [Pool(sorted(g)) for g in sorted(groups.values())]
    pool_of = {i: p for p in pools for i in p.instances}

    p_all: dict[int, float] = {}
    changed: dict[int, list[int]] = {}
    for calls in by_sid.values():
        p = pool_of[calls[0]["instance"]]
        p_all[id(p)] = p_all.get(id(p), 0.0) + sum(c["p"] for c in calls)
        ch = changed.setdefault(id(p), [0, 0])
        ch[0] += sum(1 for c in calls if c["follow_up"] and c["changed"])
        ch[1] += sum(1 for c in calls if c["follow_up"])
    picked: dict[int, list[str]] = {p_id: [] for p_id in map(id, pools)}
    for sid in chosen:
        picked[id(pool_of[by_sid[sid][0]["instance"]])].append(sid)
    t0 = by_sid[chosen[0]][0]["start_s"]
    t1 = max(c["end_s"] for s in chosen for c in by_sid[s])

    from ..sim.workload import IdAlloc

    for p in pools:
        _configure(ctx, p)
        n_changed, n_follow = changed.get(id(p), (0, 0))
        p.changed_share = n_changed / n_follow if n_follow else None
        p.router = "session_affinity" if len(p.instances) > 1 and p.changed_share is not None \
            and p.changed_share < AFFINE_BELOW else "round_robin"
        sids = picked[id(p)]
        if not sids:
            p.skip = p.skip or "no session of this pool in the replayed slice"
            continue
        p.ids = IdAlloc(1)
        heads: dict[str, list[int]] = {}
        p.sessions = [_session(sid, by_sid[sid], t0, p.block_size, p.ids, heads) for sid in sids]
        p.observed = [c for sid in sids for c in by_sid[sid]]
        p.calls = sum(s.n_calls for s in p.sessions)
        p.scale = p_all[id(p)] / sum(c["p"] for s in sids for c in by_sid[s])
    replayed = [p for p in pools if p.skip is None]
    if not replayed:
        raise ReplayError("; ".join(f"pool {' + '.join(p.instances)}: {p.skip}" for p in pools))
    return Replay(pools, total, sum(len(p.sessions) for p in replayed), sum(p.calls for p in replayed),
                  (t0, t1), seed)


def _configure(ctx, pool: Pool) -> None:
    from ..sim.engine import InstanceSpec

    sizes = [ctx.instances.get(i, {}).get("block_size") for i in pool.instances]
    known = [b for b in sizes if b]
    B = max(16, max(set(known), key=known.count)) if known else max(16, int(ctx.setting("default_block_size")))
    pool.block_size = B
    for inst in pool.instances:
        cfg = ctx.instances.get(inst)
        if cfg is None or cfg["engine"] not in ("vllm", "sglang"):
            pool.skip = f"instance {inst} has no known engine config (vllm or sglang) to simulate"
            return
        preset = _preset_for(cfg)
        pool.presets[inst] = preset
        cap = int(cfg["kv_capacity_tokens"]) if cfg["kv_capacity_tokens"] else None
        offload = 0.0
        if cfg["engine"] == "vllm" and cfg["kv_offloading"]:
            offload = _offload_ratio(ctx, inst, cfg)
        pool.specs.append(InstanceSpec(
            inst, cfg["engine"], preset=preset, block_size=B, prefix_caching=cfg["prefix_caching"] is not False,
            kv_capacity_tokens=cap, offload_ratio=offload, hicache=cfg["engine"] == "sglang" and bool(cfg["hicache"]),
            hicache_ratio=float(cfg["hicache_ratio"] or 2.0),
            hicache_write_policy=cfg["hicache_write_policy"] or "write_through",
            schedule_policy="lpm" if (cfg["schedule_policy"] or "").lower() == "lpm" else "fcfs",
            max_batched_tokens=int(cfg["chunked_prefill_size"] or 8192)))


def _preset_for(cfg: dict) -> str:
    """The simulator cost preset of the same model (else any) with the KV pool nearest the instance's."""
    from ..sim.presets import PRESETS

    model = (cfg.get("model") or "").lower()
    cands = [p for p in PRESETS.values() if p.model.lower() == model] or list(PRESETS.values())
    cap = cfg.get("kv_capacity_tokens")
    if not cap:
        return cands[0].name
    return min(cands, key=lambda p: abs(math.log(cap / p.kv_capacity_tokens))).name


def _offload_ratio(ctx, inst: str, cfg: dict) -> float:
    """vLLM CPU tier ÷ GPU pool: num_cpu_blocks ÷ num_gpu_blocks, else kv_offloading_size (GiB) in tokens
    ÷ capacity, else 1."""
    kv = {r["key"]: r["value"] for r in ctx.rows(OFFLOAD_SQL, {"instance": inst})}
    try:
        cpu, gpu = float(kv.get("num_cpu_blocks") or 0), float(kv.get("num_gpu_blocks") or 0)
        if cpu > 0 and gpu > 0:
            return cpu / gpu
        gib = float(kv.get("kv_offloading_size") or 0)
    except ValueError:
        return 1.0
    if gib > 0 and cfg["bytes_per_token"] and cfg["kv_capacity_tokens"]:
        return gib * 2**30 / cfg["bytes_per_token"] / cfg["kv_capacity_tokens"]
    return 1.0


def _session(sid: str, calls: list[dict], t0: float, B: int, ids, heads: dict):
    from ..sim.chain import Chain
    from ..sim.workload import CallSpec, Segment, Session

    def head(task_type: str, nblk: int) -> Chain:
        """The first ``nblk`` blocks of the task type's shared system + tool-definition prefix."""
        h = heads.setdefault(task_type, Chain())
        if len(h) < nblk:
            k = nblk - len(h)
            h.append_run(ids.take_run(k), k)
        return h.prefix(nblk)

    segments: list = []
    state: dict[str, dict] = {}      # branch -> {"chain" (agentobs.sim Chain, append-only), "nblk"} of its latest call
    main_end = calls[0]["start_s"]   # when the main thread is ready: its latest call's end, or the branches'
    main_chain: tuple = (None, 0)
    par: dict[str, list] | None = None   # the open parallel segment: branch -> calls
    par_ends: dict[str, float] = {}
    seq: list | None = None              # the open sequential segment of the main thread
    for c in calls:
        b = c["branch"]
        P, n = int(c["p"]), int(c["p"]) // B
        st = state.get(b)
        if b == "main":
            if par is not None:              # the main thread resumes once every branch is done
                segments.append(Segment("par", list(par.items())))
                main_end = max([main_end, *par_ends.values()])
                par = None
            if seq is None:
                seq = []
                segments.append(Segment("seq", [("main", seq)]))
            ready = main_end
        else:
            seq = None
            if par is None:
                par, par_ends = {}, {}
            ready = par_ends.get(b, main_end)    # a branch's first call starts from the fork point
        gap = max(0.0, c["start_s"] - ready)
        R = c["r"]
        if st is None or (b != "main" and par is not None and b not in par):
            if b != "main" and main_chain[1] and R:
                chain = main_chain[0].prefix(min(int(R) // B, main_chain[1], n))
            else:
                chain = head(c["task_type"], min(int(c["head"]) // B, n))
        elif R is None:                          # a context reset (compaction): a new chain
            chain = head(c["task_type"], min(int(c["head"]) // B, n))
        else:
            keep = min(int(R) // B, st["nblk"], n)
            chain = st["chain"] if keep == len(st["chain"]) else st["chain"].prefix(keep)
        if n > len(chain):
            k = n - len(chain)
            chain.append_run(ids.take_run(k), k)
        spec = CallSpec(chain, n, P, int(c["o"]), gap)
        state[b] = {"chain": chain, "nblk": n}
        if b == "main":
            assert seq is not None  # opened above when the main thread resumed
            seq.append(spec)
            main_end, main_chain = c["end_s"], (chain, n)
        else:
            assert par is not None  # opened above for the first branch call
            par.setdefault(b, []).append(spec)
            par_ends[b] = c["end_s"]
    if par is not None:
        segments.append(Segment("par", list(par.items())))
    return Session(sid, sid, calls[0]["task_type"] or "replay", "replay", "replay", calls[0]["start_s"] - t0,
                   segments, len(calls))
