"""Named scenarios (fleet + workload), declared as data, and the what-if comparison set."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConfigError
from .engine import InstanceSpec
from .presets import preset


@dataclass(frozen=True)
class Scenario:
    name: str
    help: str
    instances: tuple[InstanceSpec, ...]
    router: str = "round_robin"
    workload: str = "synthetic"            # synthetic | claude-code | mooncake | trace
    traces: tuple[str, ...] = ()           # workload "trace": kv-cache-tester JSON files, one session each
    mix: dict = field(default_factory=dict)
    duration_s: float = 3600.0
    sessions_per_min: float = 6.0
    n_sessions: int | None = None
    block_size: int = 16
    snapshot_s: float = 5.0
    session_id_share: float = 1.0          # share of sessions whose requests carry session_id to the engine
    traceparent: bool = True               # gateway forwards W3C traceparent (False: LiteLLM-like, join by id)


def _v(name, **kw) -> InstanceSpec:
    return _served(InstanceSpec(name, "vllm", **kw))


def _s(name, **kw) -> InstanceSpec:
    return _served(InstanceSpec(name, "sglang", **kw))


def _served(i: InstanceSpec) -> InstanceSpec:
    """A scenario's replica serves its preset's model: sessions stay on one model, routed among its replicas."""
    return i if i.model else replace(i, model=preset(i.preset).model)


SAMPLE_MIX = {"coding": 3.0, "support": 4.0, "research": 1.0, "batch-eval": 0.3}
EDITS_MIX = {"coding-edit": 2.0, "research-fork": 1.0, "support": 1.0}

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "sample", "2 h of a 4-replica fleet behind a round-robin gateway: 2 vLLM (Qwen3-32B, TP2), "
            "2 SGLang (Llama-3.1-8B); a session uses one model, round robin over its 2 replicas; planted "
            "problems: round-robin routing, an SGLang replica on a small A100 pool with HiCache off, a vLLM "
            "replica with prefix caching off.",
            (_v("10.42.7.31:8000"), _v("10.42.7.32:8000", prefix_caching=False),
             _s("10.42.7.40:30000", preset="h100-llama3.1-8b", hicache=True),
             _s("10.42.7.41:30000", preset="a100-llama3.1-8b", hicache=False)),
            router="round_robin", mix=SAMPLE_MIX, duration_s=7200.0, sessions_per_min=5.0, session_id_share=0.8),
        Scenario("quick", "10 minutes, 2 replicas of Llama-3.1-8B (vLLM + SGLang): tests and first look.",
                 (_v("10.0.0.1:8000", preset="h100-llama3.1-8b"), _s("10.0.0.2:30000", preset="h100-llama3.1-8b")),
                 router="round_robin", mix=SAMPLE_MIX, duration_s=600.0, sessions_per_min=6.0),
        Scenario("bench", "synthetic mix on 8 vLLM replicas (block 16), for bench/sim_speed.py.",
                 tuple(_v(f"10.1.0.{i}:8000") for i in range(8)), router="cache_aware", mix=SAMPLE_MIX,
                 duration_s=4 * 3600.0, sessions_per_min=20.0),
        Scenario("claude-code", "Replay of the 24 Claude Code sessions on 2 vLLM replicas (block 64), session-affine.",
                 (_v("10.2.0.1:8000", block_size=64), _v("10.2.0.2:8000", block_size=64)),
                 router="session_affinity", workload="claude-code", block_size=64, duration_s=10 * 86400.0),
        Scenario("edits", "30 min of agents whose harness rewrites the context (issue 20): the last turn re-rendered, "
                 "history edited or compacted mid-session, sub-agents forked; 2 vLLM replicas (block 16, a 300k-token "
                 "pool each), session-affine; ground truth labels every call's prompt kind and cause.",
                 (_v("10.5.0.1:8000", kv_capacity_tokens=300_000), _v("10.5.0.2:8000", kv_capacity_tokens=300_000)),
                 router="session_affinity", mix=EDITS_MIX, duration_s=1800.0, sessions_per_min=3.0),
        Scenario("edits-unbounded", "The edits workload on 2 vLLM replicas whose KV pool never fills (nothing is "
                 "evicted: every shortfall is a prompt edit or a re-rendered tail).",
                 (_v("10.5.1.1:8000", kv_capacity_tokens=50_000_000),
                  _v("10.5.1.2:8000", kv_capacity_tokens=50_000_000)),
                 router="session_affinity", mix=EDITS_MIX, duration_s=1800.0, sessions_per_min=3.0),
        Scenario("mooncake", "Replay of the Mooncake conversation trace (first 3,000 requests) on 4 vLLM replicas.",
                 tuple(_v(f"10.3.0.{i}:8000") for i in range(4)), router="cache_aware", workload="mooncake",
                 duration_s=86400.0),
    )
}


def trace_scenario(paths, replicas: int = 2, engine: str = "vllm", kv_capacity_tokens: int | None = None,
                   block_size: int = 16, router: str = "session_affinity", max_model_len: int | None = None,
                   preset_name: str = "h100x2-qwen3-32b") -> Scenario:
    """A replay of kv-cache-tester traces (``agentobs simulate --trace``): ``replicas`` identical replicas of one
    engine serving the preset's model."""
    if engine not in ("vllm", "sglang"):
        raise ConfigError(f"unknown engine {engine!r}; known: vllm, sglang")
    port = 8000 if engine == "vllm" else 30000
    insts = tuple(_served(InstanceSpec(f"10.4.0.{i + 1}:{port}", engine, preset=preset_name, block_size=block_size,
                                       kv_capacity_tokens=kv_capacity_tokens, max_model_len=max_model_len))
                  for i in range(replicas))
    return Scenario("trace", f"replay of {len(paths)} kv-cache-tester trace(s) on {replicas} {engine} replica(s)",
                    insts, router=router, workload="trace", traces=tuple(str(p) for p in paths),
                    block_size=block_size, duration_s=10 * 86400.0)


def scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ConfigError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None


# -- what-if: the open measurement --------------------------------------------------------------------
# The same 20-turn tool-calling trace (gaps uniform 5–30 s), 3 replicas, each config changing one thing.
WHATIF_BASE = dict(mix={"toolcall20": 1.0}, duration_s=1800.0, sessions_per_min=3.0, block_size=16, snapshot_s=0.0)


def _fleet(engine: str, n: int = 3, **kw) -> tuple[InstanceSpec, ...]:
    port = 8000 if engine == "vllm" else 30000
    preset = "h100x2-qwen3-32b"
    return tuple(InstanceSpec(f"10.9.0.{i + 1}:{port}", engine, preset=preset, kv_capacity_tokens=kw.pop("cap", None),
                              **kw) for i in range(n))


def whatif_configs() -> list[tuple[str, Scenario]]:
    cap = 120_000  # a tight pool per replica so that idle sessions compete for KV
    out = []

    def sc(label, engine, router, **kw):
        out.append((label, Scenario(label, label, _fleet(engine, cap=cap, **kw), router=router, **WHATIF_BASE)))

    sc("vllm prefix cache off, RR", "vllm", "round_robin", prefix_caching=False)
    sc("vllm prefix cache on, RR", "vllm", "round_robin")
    sc("vllm prefix cache on, affine", "vllm", "session_affinity")
    sc("sglang radix off, affine", "sglang", "session_affinity", prefix_caching=False)
    sc("sglang radix on, HiCache off, affine", "sglang", "session_affinity")
    sc("sglang radix on, HiCache on, affine", "sglang", "session_affinity", hicache=True)
    sc("sglang radix on, HiCache on, RR", "sglang", "round_robin", hicache=True)
    return out
