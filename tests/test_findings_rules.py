"""Each findings rule fires on a crafted dataset with the hand-computed tax, and a healthy fleet
yields no findings at all.

Datasets go through the real import path: gateway spans as OTLP/JSON (``import_otlp``), SGLang
config as a ``/server_info`` document (``import_server_info``), vLLM config and queue gauges as
Prometheus text (``import_prom``).

Cost basis used by every test (``[cost]``): usd_per_hour 3.6 → $0.001 per instance-second,
prefill 1,000 tokens/s → a re-prefilled token costs $1e-6. The window is exactly one hour
(``since``/``until``), so a week is ×168.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from builders import otlp_request, resource_spans, span

from agentobs.collect.files import import_otlp, import_prom, import_server_info
from agentobs.config import Settings
from agentobs.findings import run
from agentobs.source import as_source

T0 = 1_790_000_000.0          # window start (epoch s)
WINDOW = (T0, T0 + 3600.0)    # one hour → ×168 to a week
WEEK = 168.0
COST = {"usd_per_hour": 3.6, "prefill_tokens_per_s": 1000.0, "decode_tokens_per_s": 1000.0}
USD_PER_TOKEN = 1e-6          # 0.001 $/s ÷ 1,000 tokens/s


def settings(**over) -> Settings:
    return Settings(values={"cost": COST, **over})


@dataclass
class Call:
    session: str | None
    instance: str
    start: float               # seconds after T0
    dur: float
    P: int
    C: int | None
    O: int = 100  # noqa: E741 - METRICS.md notation
    ttft: float | None = None
    itl: list[float] | None = None
    model: str = "Qwen/Qwen3-8B"


@dataclass
class Fleet:
    calls: list[Call] = field(default_factory=list)
    sglang: dict[str, dict] = field(default_factory=dict)     # instance -> server_info overrides
    vllm: dict[str, dict] = field(default_factory=dict)       # instance -> cache_config_info labels
    queue: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # instance -> [(t, waiting)]
    scraped: bool = True  # engines scraped through the hour (an empty queue gauge at 0 and 3,599 s)
    # instance -> [(t, preemptions so far)]: the engine's preemption counter (vllm:num_preemptions_total, SGLang's
    # sglang:num_retracted_requests_total) scraped at t — instance evidence of eviction when it rises between two
    # scrapes inside a session's idle gap (docs/metrics.md, "Instance evidence")
    preemptions: dict[str, list[tuple[float, int]]] = field(default_factory=dict)


def otlp_doc(calls: list[Call]) -> dict:
    spans = []
    for i, c in enumerate(calls):
        host, port = c.instance.split(":")
        a = {"gen_ai.operation.name": "chat", "gen_ai.request.model": c.model, "server.address": host,
             "server.port": int(port), "gen_ai.usage.input_tokens": c.P, "gen_ai.usage.output_tokens": c.O}
        if c.session is not None:
            a["gen_ai.conversation.id"] = c.session
        if c.C is not None:
            a["gen_ai.usage.cache_read.input_tokens"] = c.C
        if c.ttft is not None:
            a["gen_ai.response.time_to_first_chunk"] = c.ttft
        if c.itl is not None:
            a["agentobs.itl_ms"] = c.itl
        start_ns = int(round((T0 + c.start) * 1e9))
        spans.append(span(f"{i + 1:032x}", f"{i + 1:016x}", f"chat {c.model}", start_ns,
                          start_ns + int(round(c.dur * 1e9)), a))
    return otlp_request(resource_spans("gateway", "test.gateway", spans))


SGLANG_DEFAULTS = {"model_path": "Qwen/Qwen3-8B", "page_size": 16, "max_total_num_tokens": 40000,
                   "disable_radix_cache": False, "enable_hierarchical_cache": False, "hicache_ratio": 2.0,
                   "hicache_write_policy": "write_through", "schedule_policy": "fcfs", "enable_cache_report": True,
                   "chunked_prefill_size": 8192, "version": "0.5.18"}
VLLM_DEFAULTS = {"block_size": "16", "num_gpu_blocks": "2500", "num_cpu_blocks": "None", "enable_prefix_caching": "True",
                 "kv_offloading_size": "None", "kv_offloading_backend": "native", "cache_dtype": "auto"}


def build(store, tmp_path, fleet: Fleet) -> None:
    con, w = store
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(otlp_doc(fleet.calls)))
    res = import_otlp([path], w, Settings())
    assert res.rejected == 0, res.errors
    for inst, over in fleet.sglang.items():
        p = tmp_path / f"si_{inst.replace(':', '_')}.json"
        p.write_text(json.dumps({**SGLANG_DEFAULTS, **over}))
        import_server_info(p, inst, w, at=T0 - 60)
    for inst, over in fleet.vllm.items():
        labels = {**VLLM_DEFAULTS, **over, "engine": "0"}
        text = ("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                "# TYPE vllm:cache_config_info gauge\n"
                "vllm:cache_config_info{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "} 1.0\n")
        p = tmp_path / f"vllm_{inst.replace(':', '_')}.prom"
        p.write_text(text)
        import_prom([p], inst, w, at=T0 - 60)
    for inst, points in fleet.queue.items():
        for t, v in points:
            p = tmp_path / f"q_{inst.replace(':', '_')}_{t:g}.prom"
            p.write_text("# TYPE sglang:num_queue_reqs gauge\n"
                         f'sglang:num_queue_reqs{{engine_type="unified",model_name="Qwen/Qwen3-8B"}} {v}\n')
            import_prom([p], inst, w, at=T0 + t)
    for inst, points in fleet.preemptions.items():
        name = "sglang:num_retracted_requests" if inst in fleet.sglang else "vllm:num_preemptions"
        for t, v in points:
            p = tmp_path / f"pre_{inst.replace(':', '_')}_{t:g}.prom"
            p.write_text(f"# TYPE {name} counter\n{name}_total{{model_name=\"Qwen/Qwen3-8B\"}} {v}\n")
            import_prom([p], inst, w, at=T0 + t)
    # the engines were scraped through the whole hour (an empty queue at its first and last second), so the hour
    # is the observed window the ledger scales from (docs/findings.md: observed = asked ∩ what the store saw)
    for inst in {**fleet.sglang, **fleet.vllm} if fleet.scraped else ():
        gauge = "sglang:num_queue_reqs" if inst in fleet.sglang else "vllm:num_requests_waiting"
        for t in (3599.0,) if inst in fleet.queue else (0.0, 3599.0):
            p = tmp_path / f"scrape_{inst.replace(':', '_')}_{t:g}.prom"
            p.write_text(f"# TYPE {gauge} gauge\n{gauge}{{model_name=\"Qwen/Qwen3-8B\"}} 0\n")
            import_prom([p], inst, w, at=T0 + t)
    w.flush()


def two_turn_sessions(instance: str, n: int = 10, gap: float = 60.0, C2: int | None = 0, instance2: str | None = None,
                      P1: int = 10000, P2: int = 12000, start: float = 100.0, stagger: float = 1.0) -> list[Call]:
    """n sessions, each: a cold call (P1, nothing cached) then, ``gap`` s after it ends, a call of P2
    whose first P1 tokens are the previous prompt (append-only) — R_eff = P1 (a multiple of 16)."""
    out = []
    for i in range(n):
        t = start + i * stagger
        out.append(Call(f"s{instance}-{i}", instance, t, 2.0, P1, 0))
        out.append(Call(f"s{instance}-{i}", instance2 or instance, t + 2.0 + gap, 2.0, P2, C2))
    return out


def findings_by_rule(db, **kw):
    found = run(as_source(db), since=WINDOW[0], until=WINDOW[1], settings=kw.pop("settings", None) or settings(), **kw)
    return {f.rule: f for f in found}, found


SG = "10.0.0.2:30000"
VL = "10.0.0.1:8000"
VL2 = "10.0.0.3:8000"


# -- healthy ------------------------------------------------------------------------------------------
def healthy_fleet() -> Fleet:
    """Default configs everywhere (SGLang: no HiCache, FCFS; vLLM: no offloading) but every follow-up
    hits its whole prefix, gaps are short (5 s ≪ g* = 40 s), no queue, sessions and cached tokens
    reported, decode gaps 20 ms."""
    calls = two_turn_sessions(SG, gap=5.0, C2=10000) + two_turn_sessions(VL, gap=5.0, C2=10000)
    for c in calls:
        c.ttft, c.itl = 0.2, [20.0] * 50
    return Fleet(calls, sglang={SG: {}}, vllm={VL: {}}, queue={SG: [(0.0, 0.0), (1800.0, 0.0)]})


def test_healthy_fleet_yields_no_findings(store, tmp_path):
    build(store, tmp_path, healthy_fleet())
    by_rule, found = findings_by_rule(store[0])
    assert found == []


# -- 1. SGLang HiCache ----------------------------------------------------------------------------------
def test_hicache_off_fires_with_sizing(store, tmp_path):
    # 10 sessions staggered by 1 s; each call 2 is a full miss (C=0) after 60 s idle on the same instance
    build(store, tmp_path, Fleet(two_turn_sessions(SG), sglang={SG: {}}))
    by_rule, _ = findings_by_rule(store[0])
    f = by_rule["hicache_off"]
    assert f.id == f"hicache_off/instance={SG}"
    ev = dict(f.evidence.numbers)
    assert ev["reprefill_tokens"] == 100_000          # 10 × R_eff 10,000
    # SGLang's KV events carry no session; the instance evidence decides: during each 60 s gap the other sessions
    # allocated more than the 40,000-token pool (churn: 9 × 10,000 first calls and the 12,000-token misses before
    # it, churn_ratio 1.77–2.42), so under LRU each session's blocks were reused — an eviction (evicted_full, C = 0).
    # An eviction does not say how much of the shortfall it caused, so the band's lower end stays 0 (severity on it:
    # low)
    assert ev["unexplained_tokens"] == 0 and ev["evicted_full_tokens"] == 100_000 and ev["evicted_miss_calls"] == 10
    assert (f.tax.mode, f.tax.usd_low_week) == ("estimate", 0.0) and f.tax.usd_high_week == f.tax.usd_week
    assert f.severity == "low" and f.confidence == "low"
    # computed prefill: 10 × 10,000 (cold) + 10 × 12,000 (misses) = 220,000
    assert ev["share_of_computed_prefill"] == pytest.approx(100_000 / 220_000, abs=1e-6)
    # all ten idle windows [t+2, t+62] overlap during [111, 162]: 10 × K(10,000 + 100 output) = 101,000
    assert ev["peak_idle_kv_tokens"] == 101_000
    # host pool ratio: 101,000 / 40,000 = 2.525 → up to the next 0.5 → 3
    assert ev["suggested_hicache_ratio"] == 3.0
    assert f.tax.tokens_week == pytest.approx(100_000 * WEEK)
    assert f.tax.usd_week == pytest.approx(100_000 * USD_PER_TOKEN * WEEK)   # $16.80
    assert "scaled ×168.0 to a week" in f.tax.basis
    assert "--enable-hierarchical-cache --hicache-ratio 3 --hicache-write-policy write_through" in f.remediation
    assert f.severity == "low" and f.confidence == "low"    # $16.8 < 50; 10 calls < findings_min_calls 20
    # the same tax as the reprefill metric's evicted_full row (METRICS.md §3), scaled ×168
    from agentobs.metrics import compute

    m = compute("reprefill", db=as_source(store[0]), since=WINDOW[0], until=WINDOW[1], by="cause", settings=settings())
    row = m.filter(m["cause"] == "evicted_full").to_dicts()[0]  # (the churn evidence, see above)
    assert f.tax.usd_week == pytest.approx(row["reprefill_cost_usd"] * WEEK)


def test_hicache_silent_when_enabled(store, tmp_path):
    build(store, tmp_path, Fleet(two_turn_sessions(SG), sglang={SG: {"enable_hierarchical_cache": True}}))
    by_rule, _ = findings_by_rule(store[0])
    assert "hicache_off" not in by_rule


# -- 2. SGLang FCFS -> LPM ------------------------------------------------------------------------------
def test_sglang_fcfs_fires_when_queued_calls_lose_prefixes(store, tmp_path):
    # the queue gauge says 5 requests waited from t=150 s; the 10 follow-ups start at 162–171 s
    calls = two_turn_sessions(SG)
    q = [(0.0, 0.0), (150.0, 5.0), (300.0, 0.0)]
    build(store, tmp_path, Fleet(calls, sglang={SG: {}}, queue={SG: q}))
    by_rule, _ = findings_by_rule(store[0])
    f = by_rule["sglang_fcfs"]
    ev = dict(f.evidence.numbers)
    # queued: the 10 follow-ups (the cold calls at 100–109 s saw queue 0); all had a reusable prefix
    assert ev["queued_calls"] == 10 and ev["queued_with_prefix"] == 10
    assert ev["queued_reprefill_tokens"] == 100_000
    assert f.tax.usd_week == pytest.approx(16.8)
    assert ev["peak_queue"] == 5.0 and ev["queue_samples_over_128"] == 0
    assert "`--schedule-policy lpm`" in f.remediation and "128" in f.remediation


def test_sglang_fcfs_silent_without_queue_or_with_lpm(store, tmp_path):
    build(store, tmp_path, Fleet(two_turn_sessions(SG), sglang={SG: {}}, queue={SG: [(0.0, 0.0), (300.0, 0.0)]}))
    assert "sglang_fcfs" not in findings_by_rule(store[0])[0]


def test_sglang_lpm_configured_is_silent(store, tmp_path):
    build(store, tmp_path, Fleet(two_turn_sessions(SG), sglang={SG: {"schedule_policy": "lpm"}},
                                 queue={SG: [(0.0, 5.0)]}))
    assert "sglang_fcfs" not in findings_by_rule(store[0])[0]


# -- 3. prefix caching off --------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_prefix_cache_off(store, tmp_path, engine):
    inst = VL if engine == "vllm" else SG
    fleet = Fleet(two_turn_sessions(inst))
    if engine == "vllm":
        fleet.vllm[inst] = {"enable_prefix_caching": "False"}
    else:
        fleet.sglang[inst] = {"disable_radix_cache": True}
    build(store, tmp_path, fleet)
    by_rule, _ = findings_by_rule(store[0])
    f = by_rule["prefix_cache_off"]
    assert dict(f.evidence.numbers)["reprefill_tokens"] == 100_000   # every follow-up: cause cache_disabled
    assert f.tax.usd_week == pytest.approx(16.8)
    flag = "--no-enable-prefix-caching" if engine == "vllm" else "--disable-radix-cache"
    assert f"remove `{flag}`" in f.remediation
    # cache_disabled misses are not evictions: the HiCache / offload rules stay silent
    assert "hicache_off" not in by_rule and "vllm_no_offload" not in by_rule


# -- 4. vLLM offloading -----------------------------------------------------------------------------------
def test_vllm_offload_fires_with_gib(store, tmp_path):
    build(store, tmp_path, Fleet(two_turn_sessions(VL), vllm={VL: {}}))
    by_rule, _ = findings_by_rule(store[0])
    f = by_rule["vllm_no_offload"]
    ev = dict(f.evidence.numbers)
    # Qwen3-8B: 2 × 36 layers × 8 KV heads × 128 × 2 B = 147,456 B/token
    assert ev["kv_bytes_per_token"] == 147_456
    # peak idle KV 101,000 tokens × 147,456 B = 13.87 GiB → 14
    assert ev["suggested_offloading_gib"] == 14
    assert "`--kv-offloading-size 14 --kv-offloading-backend native`" in f.remediation
    assert f.tax.tokens_week == pytest.approx(100_000 * WEEK)


def test_vllm_offload_silent_when_offloading(store, tmp_path):
    build(store, tmp_path, Fleet(two_turn_sessions(VL), vllm={VL: {"kv_offloading_size": "16.0"}}))
    assert "vllm_no_offload" not in findings_by_rule(store[0])[0]


# -- 5. non-affine routing ----------------------------------------------------------------------------------
def test_routing_fires_on_routed_away(store, tmp_path):
    # follow-ups land on the other replica with nothing cached: cause routed_away
    calls = two_turn_sessions(VL, instance2=VL2)
    build(store, tmp_path, Fleet(calls, vllm={VL: {}, VL2: {}}))
    by_rule, _ = findings_by_rule(store[0])
    f = by_rule["non_affine_routing"]
    ev = dict(f.evidence.numbers)
    assert f.id == "non_affine_routing/model=Qwen/Qwen3-8B"
    assert ev["routed_away_tokens"] == 100_000 and ev["changed_replica_calls"] == 10
    assert ev["share_of_reusable_tokens"] == 1.0      # ΣX / ΣR_eff = 100,000 / 100,000
    assert f.tax.usd_week == pytest.approx(16.8)
    for mech in ("X-SMG-Routing-Key", "x-session-id", "--policy consistent_hash", "session-affinity-scorer"):
        assert mech in f.remediation
    assert "vllm_no_offload" not in by_rule       # routed away is not an eviction


def test_routing_silent_below_threshold(store, tmp_path):
    # 1 of 10 follow-ups routed away: 10,000 / 100,000 = 10% of ΣR_eff — the threshold set at 15% keeps it quiet
    calls = two_turn_sessions(VL, C2=10000)
    calls[1] = Call(calls[1].session, VL2, calls[1].start, 2.0, 12000, 0)
    build(store, tmp_path, Fleet(calls, vllm={VL: {}, VL2: {}}))
    assert "non_affine_routing" not in findings_by_rule(store[0], settings=settings(findings_routed_away_share=0.15))[0]
    assert "non_affine_routing" in findings_by_rule(store[0], settings=settings(findings_routed_away_share=0.10))[0]


# -- 6. observability gaps ----------------------------------------------------------------------------------
def test_cached_tokens_missing(store, tmp_path):
    calls = two_turn_sessions(VL, C2=None) + two_turn_sessions(SG, C2=None)
    for c in calls:
        c.C = None
    build(store, tmp_path, Fleet(calls, vllm={VL: {}}, sglang={SG: {"enable_cache_report": False}}))
    by_rule, found = findings_by_rule(store[0])
    gaps = {f.scope.instance: f for f in found if f.rule == "obs_cached_tokens"}
    assert set(gaps) == {VL, SG}
    assert "`--enable-prompt-tokens-details`" in gaps[VL].remediation
    assert "`--enable-cache-report`" in gaps[SG].remediation
    ev = dict(gaps[SG].evidence.numbers)
    assert ev["calls_cached_unknown"] == 20 and ev["share_unknown"] == 1.0 and ev["enable_cache_report"] is False
    assert gaps[SG].tax.usd_week is None and gaps[SG].tax.tokens_week is None   # cannot be measured


def test_session_id_missing(store, tmp_path):
    calls = two_turn_sessions(VL, C2=10000)
    for c in calls[:6]:
        c.session = None                   # 6 of 20 calls = 30% ≥ 20%
    build(store, tmp_path, Fleet(calls, vllm={VL: {}}))
    by_rule, _ = findings_by_rule(store[0])
    f = by_rule["obs_session_id"]
    assert f.id == "obs_session_id/fleet"
    assert dict(f.evidence.numbers)["share_without_session"] == pytest.approx(0.3)
    assert "`gen_ai.conversation.id`" in f.remediation


# -- 7. ITL interference ------------------------------------------------------------------------------------
def itl_fleet() -> Fleet:
    """Session a: a 16,000-token call at 10 s, then at 100 s a 20,000-token call that finds nothing cached
    (X = 16,000) and prefills for 2 s (TTFT), window [100, 102]. Three decodes (sessions b0–b2) have first
    tokens at 99 s and gaps 20 × 50 ms, 8 × 250 ms (across [100, 102]), 20 × 50 ms. A fourth decode at 200 s
    has 6 × 250 ms gaps that overlap no prefill. Tail (> 100 ms): 24 + 6 = 30 gaps, 24 by a long prefill."""
    calls = [Call("a", SG, 10.0, 17.0, 16000, 0, ttft=16.0, itl=[20.0] * 10),
             Call("a", SG, 100.0, 3.0, 20000, 0, ttft=2.0, itl=[20.0] * 10)]
    for i in range(3):
        calls.append(Call(f"b{i}", SG, 98.9, 4.2, 1000, 0, ttft=0.1, itl=[50.0] * 20 + [250.0] * 8 + [50.0] * 20))
    calls.append(Call("c", SG, 198.9, 2.0, 1000, 0, ttft=0.1, itl=[250.0] * 6))
    # the pool (40,000 tokens) never fills (16,000 + 3 × 1,000 allocated since start), so without more evidence the
    # instance evidence would call a's miss a prompt edit (no_churn, X = 0); the engine's retraction counter rising
    # inside a's gap [27, 100] (scrapes at 30 and 90 s) makes it an eviction: X = 16,000
    return Fleet(calls, sglang={SG: {"enable_hierarchical_cache": True}}, preemptions={SG: [(30.0, 0), (90.0, 2)]})


def test_itl_long_prefill_fires(store, tmp_path):
    build(store, tmp_path, itl_fleet())
    by_rule, _ = findings_by_rule(store[0])
    f = by_rule["itl_long_prefill"]
    ev = dict(f.evidence.numbers)
    assert ev["tail_gaps"] == 30 and ev["tail_gaps_long_prefill"] == 24
    assert ev["share_tail_long_prefill"] == pytest.approx(0.8)
    assert ev["tail_gaps_unattributed"] == 6
    assert ev["itl_p99_with_long_ms"] == pytest.approx(250.0)
    assert ev["offending_prefills"] == 1 and ev["offending_reprefill_tokens"] == 16000
    # a latency finding: no $ tax of its own (the 16,000 re-prefill tokens belong to their miss cause in the
    # ledger), so it is graded "info" by the one severity rule and listed after every priced finding
    assert f.kind == "latency" and f.tax.usd_week is None and f.tax.tokens_week is None
    assert f.severity == "info" and f.fix == "`--chunked-prefill-size 4096`"
    # chunked_prefill_size 8192 → half, a power of two: 4096
    assert "`--chunked-prefill-size 4096`" in f.remediation and "`--enable-priority-scheduling`" in f.remediation
    # the same numbers as the itl_tail metric (METRICS.md §6) the console and report show
    from agentobs.metrics import compute

    m = compute("itl_tail", db=as_source(store[0]), since=WINDOW[0], until=WINDOW[1], by="instance", settings=settings())
    row = m.filter(m["instance"] == SG).to_dicts()[0]
    assert row["tail_gaps"] == ev["tail_gaps"] and row["unattributed_tail_gaps"] == ev["tail_gaps_unattributed"]
    assert row["tail_long_prefill_share"] == pytest.approx(ev["share_tail_long_prefill"])
    assert row["p99_without_long_prefill_ms"] == pytest.approx(ev["itl_p99_without_long_ms"])


def test_itl_rule_reads_every_instance_in_one_query_with_the_per_instance_numbers(store, tmp_path):
    # the rule computes all instances in one query; the evidence shows that query for one instance
    # ($instances = [it]): the same numbers. Two instances: the fleet above on SG, and on VL the same decodes
    # with a shorter long prefill (12,000 computed tokens, still ≥ 8,192) and one more tail gap that
    # overlaps nothing
    from dataclasses import replace

    from agentobs.findings.context import Context
    from agentobs.findings.rules import itl_interference as rule
    from agentobs.metrics import prepare

    sg = itl_fleet().calls
    vl = [replace(c, session=f"v{c.session}", instance=VL) for c in sg]
    vl[1] = replace(vl[1], P=12000)
    vl.append(Call("vd", VL, 300.0, 1.0, 500, 0, ttft=0.1, itl=[300.0]))
    build(store, tmp_path, Fleet(sg + vl, vllm={VL: {}}, sglang={SG: {"enable_hierarchical_cache": True}}))
    s = settings()
    run_, close = prepare(as_source(store[0]), since=WINDOW[0], until=WINDOW[1], settings=s)
    try:
        from agentobs.model.itl import itl_gap_params

        ctx = Context(run_.cur, s, WINDOW[0], WINDOW[1], run=run_)
        base = {"long_tokens": 8192, **itl_gap_params(s)}
        # before itl_tail ran, the query carries the gaps inline (no table is made), and their parameters
        inline, p = ctx.with_itl_gaps(rule.SQL, {"long_tokens": 8192})
        assert "FROM itl_gap_inline" in inline and "FROM m_itl_gap" not in inline and p == base
        rows = {r["instance"]: r for r in ctx.rows(inline, {**base, "instances": [SG, VL]})}
        assert "m_itl_gap" not in run_.timings
        assert set(rows) == {SG, VL}
        for inst in (SG, VL):   # alone, each instance reads exactly as it does next to the other
            assert ctx.rows(inline, {**base, "instances": [inst]}) == [rows[inst]]
        assert rows[SG]["tail_gaps"] == 30 and rows[SG]["tail_gaps_long_prefill"] == 24   # as itl_fleet says
        assert rows[VL]["tail_gaps"] == 31 and rows[VL]["tail_gaps_long_prefill"] == 24   # + the 300 ms gap
        assert rows[VL]["offending_computed_tokens"] == 12000
        assert ctx.rows(inline, {**base, "instances": []}) == []
        # the finding and the itl_tail metric count the same gaps: the same tail gaps, the same share overlapping
        # a long prefill (24/30 and 24/31), the same p99. Once itl_tail made the run's m_itl_gap, the rule reads
        # that table, with the same numbers
        tail = {r["instance"]: r for r in run_.compute("itl_tail", "instance").to_dicts()}
        made = run_.timings["m_itl_gap"]
        assert ctx.with_itl_gaps(rule.SQL, {"long_tokens": 8192}) == (rule.SQL, {"long_tokens": 8192})
        assert {r["instance"]: r for r in ctx.rows(rule.SQL, {"long_tokens": 8192, "instances": [SG, VL]})} == rows
        assert run_.timings["m_itl_gap"] == made   # not made again
        for inst in (SG, VL):
            assert tail[inst]["tail_gaps"] == rows[inst]["tail_gaps"]
            assert tail[inst]["tail_long_prefill_share"] == pytest.approx(
                rows[inst]["tail_gaps_long_prefill"] / rows[inst]["tail_gaps"])
            assert tail[inst]["p99_ms"] == pytest.approx(rows[inst]["itl_p99_ms"])
    finally:
        close()


def test_itl_silent_when_share_below_threshold(store, tmp_path):
    build(store, tmp_path, itl_fleet())
    assert "itl_long_prefill" not in findings_by_rule(
        store[0], settings=settings(findings_itl_long_prefill_share=0.85))[0]
    # p99 mode: threshold = p99 of all gaps = 250 ms, and no gap is *above* it
    assert "itl_long_prefill" not in findings_by_rule(store[0], settings=settings(itl_tail_threshold="p99"))[0]


# -- 8. retention vs recompute --------------------------------------------------------------------------------
def test_retention_hold_too_long(store, tmp_path):
    # vLLM pool 2,500 × 16 = 40,000 tokens, prefill 1,000 tok/s → g* = 40 s; sessions kept (C = R_eff) over 120 s
    build(store, tmp_path, Fleet(two_turn_sessions(VL, gap=120.0, C2=10000), vllm={VL: {}}))
    by_rule, _ = findings_by_rule(store[0])
    f = by_rule["retention_vs_recompute"]
    ev = dict(f.evidence.numbers)
    assert ev["case"] == "hold" and ev["g_star_s"] == pytest.approx(40.0)
    assert ev["share_beyond_gstar"] == 1.0
    # idle KV: 10 × 10,100 × 120 s = 12.12M token-s > running: 10 × (10,100 + 12,100) × 2 s = 444,000
    assert ev["idle_kv_token_s"] == pytest.approx(12_120_000)
    assert ev["running_kv_token_s"] == pytest.approx(444_000)
    # excess over break-even: 10 × 10,100 × (120 − 40) s × $0.001/s ÷ 40,000 = $0.202 per hour → ×168
    assert f.tax.usd_week == pytest.approx(0.202 * WEEK)
    # recompute-equivalent tokens: 10 × 10,100 × 80 / 40 = 202,000 per hour
    assert f.tax.tokens_week == pytest.approx(202_000 * WEEK)
    assert "g* ≈ 40 s" in f.remediation


PREEMPTED_IN_THE_GAPS = {VL: [(115.0, 0), (155.0, 3)]}


def test_retention_drop_too_early(store, tmp_path):
    # pool 250,000 × 16 = 4M tokens → g* = 4,000 s; sessions evicted after 60 s gaps. The instance already has a
    # CPU tier (so vllm_no_offload, which claims evicted misses before retention in the ledger, does not fire)
    # A 4M pool that 220,000 allocated tokens never fill: without evidence of eviction the misses would be prompt
    # edits (no_churn). The preemption counter rising inside every gap ([102–111, 162–171]: scrapes at 115 and
    # 155 s) is that evidence
    build(store, tmp_path, Fleet(two_turn_sessions(VL, gap=60.0, C2=0), preemptions=PREEMPTED_IN_THE_GAPS,
                                 vllm={VL: {"num_gpu_blocks": "250000", "kv_offloading_size": "8"}}))
    by_rule, _ = findings_by_rule(store[0])
    assert "vllm_no_offload" not in by_rule
    f = by_rule["retention_vs_recompute"]
    ev = dict(f.evidence.numbers)
    assert ev["case"] == "drop" and ev["evicted_below_gstar"] == 10
    # per window: re-prefill 10,000 × $1e-6 = $0.01 minus holding 10,100 × 60 × 0.001 / 4e6 = $0.0001515
    assert f.tax.usd_week == pytest.approx(10 * (0.01 - 0.0001515) * WEEK)
    assert f.tax.tokens_week == pytest.approx(100_000 * WEEK)
    assert f.kind == "reprefill" and f.sessions == 10


def test_retention_drop_yields_to_the_second_tier_rule(store, tmp_path):
    # the same evictions without a CPU tier: vllm_no_offload fires and owns every evicted call first, so
    # retention owns nothing, is dropped, and the ledger counts the 100,000 tokens once
    from agentobs.findings import build as ledger

    build(store, tmp_path, Fleet(two_turn_sessions(VL, gap=60.0, C2=0), preemptions=PREEMPTED_IN_THE_GAPS,
                                 vllm={VL: {"num_gpu_blocks": "250000"}}))
    by_rule, _ = findings_by_rule(store[0])
    assert "retention_vs_recompute" not in by_rule
    f = by_rule["vllm_no_offload"]
    assert f.tax.tokens_week == pytest.approx(100_000 * WEEK) and f.sessions == 10
    L = ledger(as_source(store[0]), since=WINDOW[0], until=WINDOW[1], settings=settings())
    assert L.tokens_window == 100_000 and L.owned("reprefill")[0] == pytest.approx(100_000 * WEEK)


# -- API shape ----------------------------------------------------------------------------------------------
def test_findings_are_values_and_stable(store, tmp_path):
    build(store, tmp_path, Fleet(two_turn_sessions(SG), sglang={SG: {}}))
    a = run(as_source(store[0]), since=WINDOW[0], until=WINDOW[1], settings=settings())
    b = run(as_source(store[0]), since=WINDOW[0], until=WINDOW[1], settings=settings())
    assert a == b and len({f.id for f in a}) == len(a)
    d = a[0].to_dict()
    assert d["id"] == a[0].id and "SELECT" in d["evidence"]["sql"] and d["tax"]["basis"]
