"""Unit tests of the simulator's parts: caches, engine timing, routers, workloads (hand-computed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentobs.errors import ConfigError, InputError
from agentobs.sim.cache import KVCache
from agentobs.sim.engine import InstanceSpec
from agentobs.sim.fleet import Fleet, FleetSpec
from agentobs.sim.router import POLICIES, Router
from agentobs.sim.run import CollectSink, simulate
from agentobs.sim.scenarios import scenario
from agentobs.sim.workload import CallSpec, IdAlloc, Segment, Session, claude_code, mooncake, synthetic


def test_block_cache_lru_frees_tail_first():
    ev = []
    c = KVCache(6, 16, on_event=lambda k, h, m, p: ev.append((k, list(h))))
    a = [1, 2, 3, 4]
    assert c.allocate(4, 0)
    c.store(a, 0, 4)
    c.release(a, 4, 0)             # all four cached, unused
    assert c.match(a, 4) == (4, 0)
    b = [9, 8, 7]
    assert c.allocate(3, 1)        # 6 blocks, 4 used: one must go — the tail of a (4), not its head
    assert ev[-1] == ("BlockRemoved", [4])
    assert c.match(a, 4) == (3, 0)
    c.store(b, 0, 3)
    assert not c.allocate(4, 2)    # b is pinned, a's 3 blocks are all that can go: 3 < 4
    assert c.used == 6


def test_pinned_blocks_are_never_evicted():
    c = KVCache(4, 16)
    a = [1, 2, 3]
    c.allocate(3, 0)
    c.store(a, 0, 3)               # still pinned by its running request
    assert not c.allocate(2, 0)    # only 1 free block, nothing evictable
    c.release(a, 3, 0)
    assert c.allocate(2, 0)


def test_prefix_caching_off_never_matches():
    c = KVCache(10, 16, enabled=False)
    c.allocate(3, 0)
    c.store([1, 2, 3], 0, 3)
    c.release([1, 2, 3], 0, 3)
    assert c.match([1, 2, 3], 3) == (0, 0) and c.used == 0


def test_host_tier_keeps_evicted_blocks():
    c = KVCache(3, 16, host_blocks=10, write_through=False)
    c.allocate(3, 0)
    c.store([1, 2, 3], 0, 3)
    c.release([1, 2, 3], 3, 0)
    c.allocate(3, 1)               # evicts 3, 2, 1 (tail first) into the host tier
    assert c.match([1, 2, 3], 3) == (0, 3)


def test_radix_evicts_leaves_before_parents():
    c = KVCache(4, 16, radix=True)
    c.allocate(3, 0)
    c.store([1, 2, 3], 0, 3)
    c.release([1, 2, 3], 3, 0)
    c.allocate(2, 1)  # 1 free + must evict 1: the leaf 3, never 1 or 2 while 3 is cached
    assert c.match([1, 2, 3], 3) == (2, 0)


def _one_call_session(P, O, chain, gap=0.0):  # noqa: E741
    return Session("s1", "t1", "coding", "x", "agent", 0.0,
                   [Segment("seq", [("main", [CallSpec(chain, P // 16, P, O, gap)])])], 1)


def test_engine_timing_single_request():
    # tiny-test preset: prefill 20,000 tok/s, weights 5 ms, overhead 2 ms, budget 8192 tokens/step.
    # P = 8192: one prefill step = 2 ms + 8192/20000 s = 411.6 ms; then 9 decode steps of 7 ms
    # (memory-bound: 5 ms + 1e-8 s × (8192 + 10//2) ≈ 5.08 ms, + 2 ms overhead).
    sink = CollectSink()
    fl = Fleet(FleetSpec([InstanceSpec("h:1", preset="tiny-test")], snapshot_s=0, net_s=0.0), sink)
    fl.run([_one_call_session(8192, 10, list(range(1, 513)))])
    (c,) = sink.calls
    r = c.req
    assert r.t_first == pytest.approx(0.002 + 8192 / 20000, rel=1e-6)
    step = 0.002 + 0.005 + 1e-8 * (8192 + 5)
    assert len(r.itl) == 1 and r.itl[0][1] == 9 and r.itl[0][0] == pytest.approx(step)
    assert r.t_end - r.t_first == pytest.approx(9 * step)
    assert r.C == 0


def _two_turns(ids: IdAlloc) -> Session:
    """Turn 1: 330 tokens = 20 full blocks (of 16) + 10; turn 2, 3 s after it: 600 tokens sharing turn 1's 20 full
    blocks."""
    chain = ids.take(40)
    calls = [CallSpec(chain, 20, 330, 5, 0.0), CallSpec(chain, 37, 600, 5, 3.0)]
    return Session("s", "t", "coding", "x", "a", 0.0, [Segment("seq", [("main", calls)])], 2)


def test_second_turn_hits_previous_prompt_blocks():
    ids = IdAlloc(1)
    s = _two_turns(ids)
    sink = CollectSink()
    fl = Fleet(FleetSpec([InstanceSpec("h:1", preset="tiny-test")], snapshot_s=0), sink, ids)
    fl.run([s])
    c1, c2 = sink.calls
    assert c1.req.C == 0 and c2.req.C == 20 * 16 and c2.R == 20 * 16
    assert c2.prev is c1 and c2.t0 == pytest.approx(c1.t2 + 3.0)


class _KVSink(CollectSink):
    """Collects the finished calls and the KV events the instances publish."""

    wants_kv_events = True

    def __init__(self):
        super().__init__()
        self.kv: list = []

    def kv_flush(self, inst) -> None:
        self.kv.extend(inst.kv_events)
        inst.kv_events.clear()


def test_restart_between_turns_empties_the_cache_silently():
    # turn 1 (330 tokens: 20 full blocks) ends at ≈ 0.05 s; the engine restarts at 2 s; turn 2 (600 tokens sharing
    # turn 1's 20 full blocks) comes 3 s after turn 1: nothing cached any more (C = 0), the truth's R still 320 (what
    # the session computed before) and its eviction at the restart; the dying process published no BlockRemoved
    from agentobs.sim import promexp

    ids = IdAlloc(1)
    s = _two_turns(ids)
    sink = _KVSink()
    fl = Fleet(FleetSpec([InstanceSpec("h:1", preset="tiny-test", process_metrics=True)], snapshot_s=0,
                         restarts=(("h:1", 2.0),)), sink, ids)
    fl.run([s])
    c1, c2 = sink.calls
    assert c1.t2 < 2.0 < c2.t0 and c2.prev is c1
    assert (c1.req.C, c2.req.C, c2.R) == (0, 0, 320)
    assert c1.req.evict_first == 2.0
    assert {k for _, k, *_ in sink.kv} == {"BlockStored"}
    # the new process's counters count turn 2 alone; its start time is the restart's (epoch + 2 s)
    from prometheus_client.parser import text_string_to_metric_families

    got = {(x.name, x.labels.get("source")): x.value
           for f in text_string_to_metric_families(promexp.render(fl.instances[0]).decode()) for x in f.samples}
    assert got[("vllm:prompt_tokens_total", None)] == 600.0
    assert got[("process_start_time_seconds", None)] == fl.spec.start_epoch + 2.0
    # without process metrics (SGLang, multi-process vLLM) the family is absent
    fl.instances[0].spec = InstanceSpec("h:1", preset="tiny-test")
    assert "process_start_time_seconds" not in promexp.render(fl.instances[0]).decode()


def test_restart_drops_the_call_in_flight_and_its_retry_recomputes():
    # one call of 8,192 tokens (prefill 411.6 ms on tiny-test); the engine restarts at 0.2 s, mid-prefill: the call
    # fails (finish "restart"), is retried after its 1 s backoff and served by the new process from scratch. Its
    # blocks were never computed before (the prefill did not finish): the truth's R of the retry is 0, not 8,192
    sink = CollectSink()
    fl = Fleet(FleetSpec([InstanceSpec("h:1", preset="tiny-test")], snapshot_s=0, net_s=0.0,
                         restarts=(("h:1", 0.2),)), sink)
    fl.run([_one_call_session(8192, 10, list(range(1, 513)))])
    dropped, retry = sink.calls
    assert (dropped.req.status, dropped.req.finish, dropped.t2, dropped.req.O) == ("error", "restart", 0.2, 0)
    assert (retry.attempt, retry.req.status, retry.req.C, retry.R) == (2, "ok", 0, 0)
    assert retry.t0 == pytest.approx(1.2)
    assert fl.instances[0].restarts == 1


def test_restart_of_an_unknown_instance():
    with pytest.raises(ConfigError, match="restart of unknown instance 'h:9'"):
        Fleet(FleetSpec([InstanceSpec("h:1", preset="tiny-test")], restarts=(("h:9", 1.0),)))


class _I:
    def __init__(self, name, idx, load, hits, model=None):
        self.spec = InstanceSpec(name, model=model)
        self.idx = idx
        self._load = load
        self.cache = type("C", (), {"gpu_match": staticmethod(lambda chain, n, h=hits: h)})()

    def load(self):
        return self._load


def test_routers():
    insts = [_I("a:1", 0, 3, 0), _I("b:1", 1, 1, 9), _I("c:1", 2, 2, 4)]
    rr = Router("round_robin", insts)
    assert [rr.pick("s", [], 10).spec.name for _ in range(4)] == ["a:1", "b:1", "c:1", "a:1"]
    assert Router("least_loaded", insts).pick("s", [], 10).spec.name == "b:1"
    aff = Router("session_affinity", insts)
    assert len({aff.pick("sess-42", [], 10).spec.name for _ in range(5)}) == 1
    ca = Router("cache_aware", insts)
    assert ca.pick("s", [], 10).spec.name == "b:1"     # 9/10 > 0.5: best match
    insts[1].cache.gpu_match = lambda chain, n: 4       # 4/10 ≤ 0.5 everywhere: least loaded
    insts[1]._load = 5
    assert Router("cache_aware", insts).pick("s", [], 10).spec.name == "c:1"
    with pytest.raises(ConfigError, match="unknown router policy 'random'"):
        Router("random", insts)


def test_router_keeps_each_session_on_its_model():
    # two models with two replicas each: every call of a session goes to a replica of the session's model, the
    # policy applies among those replicas; the models share the sessions by replica count
    insts = [_I("q1:1", 0, 0, 0, "Q"), _I("l1:1", 1, 0, 0, "L"), _I("q2:1", 2, 0, 0, "Q"), _I("l2:1", 3, 0, 0, "L")]
    for policy in POLICIES:
        r = Router(policy, insts)
        seen: dict[str, set] = {}
        for n in range(800):
            sid = f"sess-{n % 200}"
            seen.setdefault(sid, set()).add(r.pick(sid, [], 10).spec.model)
        assert all(len(m) == 1 for m in seen.values()), policy
        assert 0.4 < sum(m == {"Q"} for m in seen.values()) / len(seen) < 0.6, policy
    rr = Router("round_robin", insts)
    model = rr.pick("s", [], 10).spec.model
    names = [rr.pick("s", [], 10).spec.name for _ in range(4)]
    assert names == (["q2:1", "q1:1"] * 2 if model == "Q" else ["l2:1", "l1:1"] * 2)  # round robin in the pool


def test_sample_scenario_sessions_keep_one_model():
    # the sample fleet (2 vLLM replicas of Qwen3-32B, 2 SGLang replicas of Llama-3.1-8B): no session switches
    # model; each model's sessions use both of its replicas (round robin)
    from dataclasses import replace

    sink = CollectSink()
    simulate(replace(scenario("sample"), duration_s=300.0, snapshot_s=0.0), 1, sink=sink)
    models: dict[str, set] = {}
    replicas: dict[str, set] = {}
    for c in sink.calls:
        models.setdefault(c.sess.sid, set()).add(c.req.inst.model)
        replicas.setdefault(c.req.inst.model, set()).add(c.req.inst.spec.name)
    assert len(models) > 20 and all(len(m) == 1 for m in models.values())
    assert {m: len(r) for m, r in replicas.items()} == {"Qwen/Qwen3-32B": 2, "meta-llama/Llama-3.1-8B-Instruct": 2}


def test_synthetic_is_deterministic_and_typed():
    a = synthetic({"coding": 1, "support": 1, "research": 1, "batch-eval": 1}, 600, 10, 5, 16, IdAlloc(1))
    b = synthetic({"coding": 1, "support": 1, "research": 1, "batch-eval": 1}, 600, 10, 5, 16, IdAlloc(1))
    assert [(s.sid, s.n_calls) for s in a] == [(s.sid, s.n_calls) for s in b]
    assert {s.task_type for s in a} == {"coding", "support", "research", "batch-eval"}
    research = [s for s in a if s.task_type == "research"]
    assert any(seg.kind == "par" and len(seg.threads) >= 2 for s in research for seg in s.segments)
    with pytest.raises(ConfigError, match="unknown task type 'chess'"):
        synthetic({"chess": 1}, 60, 1, 1, 16, IdAlloc(1))


def test_trace_replays_load():
    cc = claude_code(None, 64, IdAlloc(1))
    assert len(cc) == 9
    t0091 = next(s for s in cc if s.sid == "cc-trace_0091")
    assert t0091.n_calls == 10                          # MANIFEST.csv: n_req 10, no sub-agents
    t0277 = next(s for s in cc if s.sid == "cc-trace_0277")
    assert t0277.n_calls == 9 + 44                      # 9 parent requests, 4 sub-agents with 44 requests
    mc = mooncake(None, 16, IdAlloc(1), limit=500)
    assert sum(s.n_calls for s in mc) == 500
    with pytest.raises(ConfigError, match="must divide 64"):
        claude_code(None, 48, IdAlloc(1))


def test_bad_trace_file(tmp_path: Path):
    p = tmp_path / "trace_x.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="trace_x.json: not JSON"):
        claude_code([p], 64, IdAlloc(1))
    p.write_text('{"id": 1}')
    with pytest.raises(InputError, match="not a kv-cache-tester trace"):
        claude_code([p], 64, IdAlloc(1))


def test_simulation_is_deterministic():
    from dataclasses import replace

    sc = replace(scenario("quick"), duration_s=60.0, snapshot_s=0.0)
    runs = []
    for _ in range(2):
        sink = CollectSink()
        simulate(sc, 7, sink=sink)
        runs.append([(c.span_id, c.req.C, round(c.t2, 9)) for c in sink.calls])
    assert runs[0] == runs[1] and len(runs[0]) > 20


def _calls(sc, impl):
    from dataclasses import replace as _r

    from agentobs.sim.run import build_workload, fleet_spec

    ids = IdAlloc(1)
    sessions = build_workload(sc, 3, ids)
    sink = CollectSink()
    fl = Fleet(_r(fleet_spec(sc, 3), cache_impl=impl), sink, ids)
    fl.run(sessions)
    calls = [(c.span_id, c.req.inst.idx, c.req.C, c.req.C_host, c.req.preempted, c.req.evict_first,
              c.req.evicted_blocks, round(c.t2, 9)) for c in sink.calls]
    return calls, [(i.cache.evicted_blocks, i.cache.stored_blocks, i.cache.used, i.cache.evictable(),
                    i.cache.host_loaded_blocks) for i in fl.instances]


def test_range_cache_equals_per_block_reference_on_whole_fleets():
    # The range cache (cache.py) must reproduce the per-block reference (cache_ref.py) call for call:
    # hits, host-tier hits, preemptions, first eviction of each call's blocks, timings. Tight pools,
    # both host-tier policies, lpm, vLLM and SGLang (whose reference evicts leaves only).
    from dataclasses import replace

    base = replace(scenario("sample"), snapshot_s=0.0, duration_s=420.0)
    fleets = [
        (InstanceSpec("a:1", offload_ratio=0.3, kv_capacity_tokens=150_000),
         InstanceSpec("b:1", "sglang", hicache=True, hicache_ratio=0.5, hicache_write_policy="write_back",
                      kv_capacity_tokens=150_000, preset="h100-llama3.1-8b")),
        (InstanceSpec("a:1", schedule_policy="lpm", kv_capacity_tokens=60_000, offload_ratio=1.0,
                      hicache_write_policy="write_back"),
         InstanceSpec("b:1", "sglang", hicache=True, hicache_ratio=0.2, kv_capacity_tokens=60_000,
                      preset="h100-llama3.1-8b"),
         InstanceSpec("c:1", "sglang", kv_capacity_tokens=60_000, preset="h100-llama3.1-8b")),
    ]
    for insts, router in zip(fleets, ("round_robin", "cache_aware"), strict=True):
        sc = replace(base, instances=insts, router=router)
        fast, slow = _calls(sc, "ranges"), _calls(sc, "blocks")
        assert len(fast[0]) > 200
        assert sum(c[3] for c in fast[0]) > 0 and sum(c[6] for c in fast[0]) > 0  # host hits and evictions happen
        assert fast == slow
