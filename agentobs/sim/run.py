"""Run a scenario: build its workload, run the fleet, write the bundle; and the what-if comparison."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from .emit import BundleSink
from .fleet import Call, Fleet, FleetSpec, NullSink
from .presets import preset
from .scenarios import Scenario, whatif_configs
from .workload import IdAlloc, Session, claude_code, mooncake, synthetic

GAP_BUCKETS = ((0, 1), (1, 5), (5, 30), (30, 120), (120, 600), (600, float("inf")))


def build_workload(sc: Scenario, seed: int, ids: IdAlloc) -> list[Session]:
    if sc.workload == "synthetic":
        out = synthetic(sc.mix, sc.duration_s, sc.sessions_per_min, seed, sc.block_size, ids, n_sessions=sc.n_sessions)
    elif sc.workload == "claude-code":
        out = claude_code(None, sc.block_size, ids)
    elif sc.workload == "trace":
        out = claude_code([Path(p) for p in sc.traces], sc.block_size, ids)
    elif sc.workload == "mooncake":
        out = mooncake(None, sc.block_size, ids, limit=3000)
    else:
        from ..errors import ConfigError

        raise ConfigError(f"unknown workload {sc.workload!r}; known: synthetic, claude-code, mooncake, trace")
    if sc.session_id_share < 1.0:
        for s in out:
            s.engine_session = _unit(f"{seed}/{s.sid}") < sc.session_id_share
    return out


def _unit(key: str) -> float:
    """A deterministic draw in [0, 1) from a key (does not touch the workload's random stream)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64


def fleet_spec(sc: Scenario, seed: int, cache_impl: str = "ranges", restarts=(), process_metrics: bool = False
               ) -> FleetSpec:
    """``restarts``: (instance name, simulated seconds) pairs, each an engine restart; ``process_metrics``: the vLLM
    replicas expose ``process_start_time_seconds`` (one API server; SGLang never does)."""
    insts = [i if i.block_size == sc.block_size else replace(i, block_size=sc.block_size) for i in sc.instances]
    if process_metrics:
        insts = [replace(i, process_metrics=True) if i.engine == "vllm" else i for i in insts]
    return FleetSpec(insts, router=sc.router, snapshot_s=sc.snapshot_s, seed=seed, cache_impl=cache_impl,
                     traceparent=sc.traceparent, restarts=tuple(restarts))


def parse_restart(text: str) -> tuple[str, float]:
    """``INSTANCE@SECONDS`` (the CLI's --restart) → (instance, simulated seconds)."""
    from ..errors import ConfigError

    name, sep, at = text.rpartition("@")
    try:
        t = float(at)
    except ValueError:
        t = -1.0
    if not sep or not name or not (t >= 0 and t != float("inf")):
        raise ConfigError(f"--restart {text!r}: expected INSTANCE@SECONDS, e.g. 10.5.0.1:8000@600")
    return name, t


def simulate(sc: Scenario, seed: int = 1, out: str | Path | None = None, progress=None, prom_every: int = 1,
             gzip_prom: bool = False, kv_events: bool = True, block_hashes: bool = False, sink=None,
             cache_impl: str = "ranges", restarts=(), process_metrics: bool = False) -> Fleet:
    ids = IdAlloc(1)
    sessions = build_workload(sc, seed, ids)
    if sink is None:
        sink = BundleSink(out, kv_events=kv_events, prom_every=prom_every, gzip_prom=gzip_prom,
                          block_hashes=block_hashes, workload=sc.name, seed=seed) if out else NullSink()
    fleet = Fleet(fleet_spec(sc, seed, cache_impl, restarts, process_metrics), sink, ids)
    fleet.run(sessions, progress=progress)
    return fleet


class CollectSink(NullSink):
    """Keeps the finished calls in memory (what-if summaries, tests)."""

    def __init__(self):
        self.calls: list[Call] = []

    def call_done(self, call: Call, fleet: Fleet) -> None:
        self.calls.append(call)


@dataclass
class Summary:
    label: str
    calls: int
    ttft: dict = field(default_factory=dict)   # bucket -> (p50, p99, n)
    reuse_hit_rate: float = 0.0                # U = ΣC / ΣR_eff over calls 2..n
    session_hit_rate: float = 0.0              # H = ΣC / ΣP
    reprefill_share: float = 0.0               # ΣX / (ΣX + ΣC)
    computed_per_task: float = 0.0             # Σ(P − C + O) per task
    usd_per_task: float = 0.0                  # METRICS.md §8 GPU-time basis


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def summarize(label: str, calls: list[Call]) -> Summary:
    """The what-if figures, straight from the simulated calls, with METRICS.md's definitions."""
    s = Summary(label, len(calls))
    by_bucket: dict[tuple, list[float]] = {b: [] for b in GAP_BUCKETS}
    sumC = sumReff = sumP = sumX = 0
    cost = 0.0
    tasks = set()
    computed = 0
    for c in calls:
        if c.rejected:
            continue
        r = c.req
        inst = r.inst
        B = inst.spec.block_size
        tasks.add(c.sess.task_id)
        sumP += r.P
        sumC += r.C
        computed += r.P - r.C + r.O
        p = preset(inst.spec.preset)
        cost += ((r.P - r.C) / p.prefill_tps + r.O / p.decode_tps) * p.usd_per_hour / 3600.0
        if c.first:
            continue
        reff = min(c.R, ((r.P - 1) // B) * B)
        sumReff += reff
        sumX += max(0, reff - r.C)
        if c.prev is not None:
            gap = c.t0 - c.prev.t2
            for b in GAP_BUCKETS:
                if b[0] <= gap < b[1]:
                    by_bucket[b].append(r.t_first - c.t0)
                    break
    s.ttft = {b: (_pct(v, 0.5), _pct(v, 0.99), len(v)) for b, v in by_bucket.items() if v}
    s.reuse_hit_rate = min(sumC, sumReff) / sumReff if sumReff else float("nan")
    s.session_hit_rate = sumC / sumP if sumP else float("nan")
    s.reprefill_share = sumX / (sumX + sumC) if sumX + sumC else 0.0
    s.computed_per_task = computed / max(1, len(tasks))
    s.usd_per_task = cost / max(1, len(tasks))
    return s


def compare(seed: int = 1, configs: list[tuple[str, Scenario]] | None = None, progress=None) -> list[Summary]:
    out = []
    for label, sc in configs or whatif_configs():
        sink = CollectSink()
        simulate(sc, seed, sink=sink, progress=progress)
        out.append(summarize(label, sink.calls))
    return out


def compare_table(summaries: list[Summary]):
    import pyarrow as pa

    rows: dict[str, list] = {k: [] for k in ("config", "calls", "reuse_hit_rate", "reprefill_share",
                                             "ttft_p50_5_30s", "ttft_p99_5_30s", "ttft_p50_30_120s",
                                             "computed_tokens_per_task", "usd_per_task")}
    for s in summaries:
        b1 = s.ttft.get((5, 30), (float("nan"),) * 3)
        b2 = s.ttft.get((30, 120), (float("nan"),) * 3)
        rows["config"].append(s.label)
        rows["calls"].append(s.calls)
        rows["reuse_hit_rate"].append(round(s.reuse_hit_rate, 3))
        rows["reprefill_share"].append(round(s.reprefill_share, 3))
        rows["ttft_p50_5_30s"].append(round(b1[0], 3))
        rows["ttft_p99_5_30s"].append(round(b1[1], 3))
        rows["ttft_p50_30_120s"].append(round(b2[0], 3))
        rows["computed_tokens_per_task"].append(int(s.computed_per_task))
        rows["usd_per_task"].append(round(s.usd_per_task, 4))
    return pa.table(rows)
