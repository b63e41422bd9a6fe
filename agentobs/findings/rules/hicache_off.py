"""SGLang without HiCache while sessions lose their prefix to eviction.

Trigger: an SGLang instance whose config says ``enable_hierarchical_cache=false`` (the default)
and whose re-prefill from evicted misses (``evicted_full`` + ``evicted_partial``, METRICS.md §1)
clears the floors (``findings_min_usd_week``, ``findings_min_share`` of computed prefill).

Evidence: evicted-miss calls and tokens, their share of computed prefill, GPU-time cost; the KV
held by idle sessions (peak and time-weighted mean) against the GPU pool.

Fix: ``--enable-hierarchical-cache --hicache-ratio R --hicache-write-policy write_through``
(reference/sglang.md §2). The host pool is ``R ×`` the device pool; R is sized so the host tier
holds the observed peak of idle-session KV (never below SGLang's default 2.0), in steps of 0.5.
Recoverable: the evicted-miss re-prefill (analytical upper bound: every evicted prefix is found in
the host tier; the PCIe load-back time is not charged).
"""

from __future__ import annotations

from ..context import Context, ceil_to, fmt_tokens, fmt_usd
from ..finding import Finding, Scope
from ..sizing import EVICTED_CAUSES, cause_claim, evicted_misses, gib

ID = "hicache_off"


def check(ctx: Context) -> list[Finding]:
    out = []
    for inst, cfg in ctx.instances.items():
        if cfg["engine"] != "sglang" or cfg["hicache"] is not False:
            continue
        ev = evicted_misses(ctx, inst)
        if ev is None:
            continue
        x, usd, share, n = ev.tokens, ev.usd, ev.share, ev.calls
        cap = cfg["kv_capacity_tokens"]
        peak = ev.idle["peak_idle_kv_tokens"]
        ratio = max(2.0, ceil_to(peak / cap, 0.5)) if cap else 2.0
        host_gib = gib(ratio * cap, cfg["bytes_per_token"]) if cap else None
        tax = ctx.tax(x, usd, f"GPU-time re-prefill cost ({ev.cost_basis})")
        rec = ctx.tax(x, usd, "analytical upper bound: every evicted prefix found in the host tier, load-back not "
                      "charged", method="analytical")
        host_txt = f" (host pool ≈ {host_gib:,.0f} GiB of pinned host memory at {cfg['bytes_per_token']:,.0f} B/token)" \
            if host_gib else ""
        out.append(Finding(
            rule=ID,
            title="SGLang without HiCache: idle sessions' KV is evicted and recomputed",
            severity=ctx.severity(tax),
            scope=Scope(instance=inst, model=cfg["model"]),
            evidence=ctx.evidence({
                **ev.evidence(),
                "kv_capacity_tokens": cap,
                "enable_hierarchical_cache": False,
                "suggested_hicache_ratio": ratio,
            }, *ev.sql_and_params(inst)),
            tax=tax,
            recoverable=rec,
            confidence=ctx.confidence(n, exact=ev.exact),
            claim=cause_claim(*EVICTED_CAUSES, instance=inst),
            fix=f"`--enable-hierarchical-cache --hicache-ratio {ratio:g} --hicache-write-policy write_through`",
            remediation=(
                f"Launch SGLang with `--enable-hierarchical-cache --hicache-ratio {ratio:g} "
                f"--hicache-write-policy write_through`: evicted prefixes move to a host-memory tier "
                f"{ratio:g}× the GPU pool{host_txt} instead of being dropped. Sized from the observed peak of "
                f"{fmt_tokens(peak)} KV tokens held by idle sessions against a GPU pool of {fmt_tokens(cap)} tokens."
            ),
            summary=(f"{n} calls recomputed {fmt_tokens(x)} evicted prefix tokens "
                     f"({share:.0%} of computed prefill), {fmt_usd(tax.usd_week)}{tax.per}"),
        ))
    return out
