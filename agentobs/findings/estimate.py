"""What a fix would recover, by simulation where possible.

Each rule gives an analytical ``recoverable`` (docs/findings.md). Where the simulator models the fix,
:func:`refine` replaces it with a replay (agentobs.findings.replay): the observed sessions run through
agentobs.sim twice — as configured and with the fix — and the recoverable tax is the difference in
re-prefill on the finding's instances, scaled to the window by prompt tokens and priced with the same
GPU-time cost basis as the tax (``X ÷ prefill_tps × $/s`` of each instance), then to a week as the tax
is. ``method`` then reads ``simulation (N sessions replayed)`` and the basis names the slice, the fix
and both re-prefill figures. The difference can exceed the tax: a fix also recovers re-prefill that
the metrics attribute to another cause (e.g. prefix caching on also helps turns routed back to that
replica). It can be negative when the fix shifts load (then it says so).

Fixes the simulator models (``FIXES``, by rule): prefix caching / radix cache on; HiCache on with the
suggested ratio; a vLLM CPU tier of the suggested size; LPM scheduling; session-affine routing. Not
modelled — the analytical estimate stays, and says why: retention TTLs, ITL interference (its
recoverable is latency), observability gaps. When the replay cannot be built (no sessions, an engine
the simulator does not model) or simulation is off (``simulate=False``, ``agentobs findings
--no-simulate``, ``findings_sim_sessions = 0``) the analytical estimate stays and its basis says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .context import Context, fmt_tokens
from .finding import Finding
from .replay import Fix, Replay, ReplayError, build
from .whatif import Change, WhatIfError, resolve


def _prefix_cache(f: Finding, ctx: Context) -> tuple[list[Change], str]:
    i = f.scope.instance
    return [Change("prefix_cache", "on", i)], f"prefix caching on at {i}"


def _hicache(f: Finding, ctx: Context) -> tuple[list[Change], str]:
    i = f.scope.instance
    r = float(f.evidence.get("suggested_hicache_ratio") or 2.0)
    return ([Change("hicache", "on", i), Change("hicache_ratio", f"{r:g}", i)],
            f"HiCache on at {i} (ratio {r:g}, write_through)")


def _offload(f: Finding, ctx: Context) -> tuple[list[Change], str] | None:
    i = f.scope.instance
    cfg = (ctx.instances.get(i) if i is not None else None) or {}
    gib = f.evidence.get("suggested_offloading_gib")
    if not gib or not cfg.get("bytes_per_token") or not cfg.get("kv_capacity_tokens"):
        return None
    ratio = gib * 2**30 / cfg["bytes_per_token"] / cfg["kv_capacity_tokens"]
    return [Change("offload_gib", f"{gib:g}", i)], f"a {gib} GiB CPU KV tier at {i} ({ratio:.2f}× the GPU pool)"


def _lpm(f: Finding, ctx: Context) -> tuple[list[Change], str]:
    i = f.scope.instance
    return [Change("schedule_policy", "lpm", i)], f"--schedule-policy lpm at {i}"


def _affinity(f: Finding, ctx: Context) -> tuple[list[Change], str]:
    return ([Change("router", "session_affinity", i) for i in _scope_instances(f, ctx)],
            "session-affine routing (consistent hash of the session id)")


# a finding's fix is a what-if change (agentobs.findings.whatif): one replay path, resolved by whatif.resolve
FIXES: dict[str, Callable[[Finding, Context], tuple[list[Change], str] | None]] = {
    "prefix_cache_off": _prefix_cache,
    "hicache_off": _hicache,
    "vllm_no_offload": _offload,
    "sglang_fcfs": _lpm,
    "non_affine_routing": _affinity,
}
NOT_MODELLED = {
    "retention_vs_recompute": "the simulator has no per-session KV TTL",
}


def _scope_instances(f: Finding, ctx: Context) -> list[str]:
    if f.scope.instance:
        return [f.scope.instance]
    return [i for i, c in ctx.instances.items() if i and (f.scope.model is None or c["model"] == f.scope.model)]


def _with_note(f: Finding, note: str) -> Finding:
    rec = dataclasses.replace(f.recoverable, basis=f"{f.recoverable.basis}; {note}")
    return dataclasses.replace(f, recoverable=rec)


def refine(found: list[Finding], ctx: Context, simulate: bool = True) -> list[Finding]:
    """``found`` with ``recoverable`` by simulation where the fix is modelled (else the analytical
    estimate, with the reason simulation was not used)."""
    todo = [f for f in found if f.rule in FIXES and f.recoverable.usd_week is not None]
    if not todo:
        return found
    n = int(ctx.setting("findings_sim_sessions"))
    if not simulate or n <= 0:
        why = "simulation skipped (--no-simulate)" if not simulate else "simulation off (findings_sim_sessions = 0)"
        return [_with_note(f, why) if f in todo else f for f in found]
    try:
        replay = build(ctx, n, int(ctx.setting("findings_sim_seed")))
    except ReplayError as e:
        return [_with_note(f, f"simulation not used: {e}") if f in todo else f for f in found]
    out = []
    for f in found:
        if f not in todo:
            out.append(_with_note(f, f"not simulated: {NOT_MODELLED[f.rule]}") if f.rule in NOT_MODELLED else f)
            continue
        made = FIXES[f.rule](f, ctx)
        try:
            fix = resolve(made[0], replay, ctx, label=made[1])[0] if made is not None else None
            rec = _simulated(f, fix, replay, ctx) if fix is not None else None
        except (ReplayError, WhatIfError) as e:
            rec = None
            why = str(e)
        else:
            why = "the fix's size is unknown (KV bytes per token or pool size)"
        out.append(dataclasses.replace(f, recoverable=rec) if rec is not None
                   else _with_note(f, f"simulation not used: {why}"))
    return out


def _simulated(f: Finding, fix: Fix, replay: Replay, ctx: Context):
    tokens = usd = 0.0
    base_sum = fixed_sum = 0
    priced = True
    insts = _scope_instances(f, ctx)
    for inst in insts:
        pool = replay.pool_of(inst)
        if pool is None or pool.skip is not None:
            raise ReplayError(f"instance {inst} not replayed ({pool.skip if pool else 'no calls'})")
        base = replay.reprefill(pool)[inst]
        fixed = replay.reprefill(pool, fix)[inst]
        base_sum, fixed_sum = base_sum + base, fixed_sum + fixed
        d = (base - fixed) * pool.factor
        tokens += d
        cfg = ctx.instances.get(inst) or {}
        if cfg.get("usd_per_s") and cfg.get("prefill_tps"):
            usd += d / cfg["prefill_tps"] * cfg["usd_per_s"]
        else:
            priced = False
    pools = [p for p in replay.pools if any(i in p.instances for i in insts)]
    routers = ", ".join(sorted({p.router for p in pools}))
    scale = ", ".join(f"×{p.scale:.2f}" for p in pools)
    presets = ", ".join(f"{i}={p.presets[i]}" for p in pools for i in p.instances if i in insts)
    t0, t1 = replay.slice_s
    change = (f"−{(base_sum - fixed_sum) / base_sum:.0%}" if base_sum and fixed_sum <= base_sum
              else "no saving" if fixed_sum >= base_sum else "")
    basis = (f"simulation: {replay.sessions_replayed} of {replay.sessions_total} sessions "
             f"({replay.calls_replayed} calls, a {(t1 - t0) / 60:,.0f} min slice of the window, seed {replay.seed}) "
             f"replayed through agentobs.sim as configured (router {routers}) and with {fix.label}; simulated "
             f"re-prefill on {f.scope.key()}: {fmt_tokens(base_sum)} → {fmt_tokens(fixed_sum)} tokens ({change}), "
             f"scaled {scale} to the window by prompt tokens; priced with the tax's GPU-time cost basis; engine "
             f"timing from presets {presets}")
    return ctx.tax(tokens, usd if priced else None, basis, method=f"simulation ({replay.sessions_replayed} sessions replayed)")
