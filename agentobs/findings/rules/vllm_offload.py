"""vLLM without KV offloading while sessions lose their prefix to eviction.

Trigger: a vLLM instance whose config shows no KV offloading (``kv_offloading_size`` None and no
CPU blocks in ``vllm:cache_config_info``) and whose re-prefill from evicted misses
(``evicted_full`` + ``evicted_partial``) clears the floors (``findings_min_usd_week``,
``findings_min_share``).

Evidence: evicted-miss calls and tokens, share of computed prefill, GPU-time cost; the KV held by
idle sessions (peak, mean) against the GPU pool; KV bytes per token of the model (METRICS.md §8).

Fix: ``--kv-offloading-size <GiB> --kv-offloading-backend native`` (or ``lmcache``; reference/vllm.md
§5.3). The size (GiB, total across TP ranks) holds the observed peak of idle-session KV.
Recoverable: the evicted-miss re-prefill (analytical upper bound: every evicted prefix found on the
CPU tier, transfer time not charged).
"""

from __future__ import annotations

import math

from ..context import Context, fmt_tokens, fmt_usd
from ..finding import Finding, Scope
from ..sizing import EVICTED_CAUSES, cause_claim, evicted_misses, gib

ID = "vllm_no_offload"


def check(ctx: Context) -> list[Finding]:
    out = []
    for inst, cfg in ctx.instances.items():
        if cfg["engine"] != "vllm" or cfg["kv_offloading"] is not False:
            continue
        ev = evicted_misses(ctx, inst)
        if ev is None:
            continue
        x, usd, share, n = ev.tokens, ev.usd, ev.share, ev.calls
        peak = ev.idle["peak_idle_kv_tokens"]
        size = gib(peak, cfg["bytes_per_token"])
        if size is not None:
            size_gib = max(1, math.ceil(size))
            how = (f"`--kv-offloading-size {size_gib} --kv-offloading-backend native` (or `--kv-offloading-backend "
                   f"lmcache` for an LMCache CPU tier): {size_gib} GiB of host memory, total across TP ranks, holds the "
                   f"observed peak of {fmt_tokens(peak)} idle-session KV tokens at {cfg['bytes_per_token']:,.0f} B/token")
        else:
            size_gib = None
            how = (f"`--kv-offloading-size <GiB> --kv-offloading-backend native` (or `lmcache`) with room for the "
                   f"observed peak of {fmt_tokens(peak)} idle-session KV tokens × the model's KV bytes per token "
                   f"(unknown for model {cfg['model']!r}: add it under [cost.kv_geometry])")
        tax = ctx.tax(x, usd, f"GPU-time re-prefill cost ({ev.cost_basis})")
        rec = ctx.tax(x, usd, "analytical upper bound: every evicted prefix found on the CPU tier, transfer time not "
                      "charged", method="analytical")
        out.append(Finding(
            rule=ID,
            title="vLLM without KV offloading: idle sessions' KV is evicted and recomputed",
            severity=ctx.severity(tax),
            scope=Scope(instance=inst, model=cfg["model"]),
            evidence=ctx.evidence({
                **ev.evidence(),
                "kv_capacity_tokens": cfg["kv_capacity_tokens"],
                "kv_bytes_per_token": cfg["bytes_per_token"],
                "suggested_offloading_gib": size_gib,
            }, *ev.sql_and_params(inst)),
            tax=tax,
            recoverable=rec,
            confidence=ctx.confidence(n, exact=ev.exact),
            claim=cause_claim(*EVICTED_CAUSES, instance=inst),
            fix=(f"`--kv-offloading-size {size_gib} --kv-offloading-backend native`" if size_gib else
                 "`--kv-offloading-size <GiB> --kv-offloading-backend native`"),
            remediation=f"Give vLLM a CPU KV tier: {how}. Evicted prefixes are then loaded back instead of recomputed.",
            summary=(f"{n} calls recomputed {fmt_tokens(x)} evicted prefix tokens "
                     f"({share:.0%} of computed prefill), {fmt_usd(tax.usd_week)}{tax.per}"),
        ))
    return out
