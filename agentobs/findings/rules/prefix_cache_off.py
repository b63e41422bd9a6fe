"""Prefix caching (vLLM) / the radix cache (SGLang) switched off.

Trigger: an instance whose config says prefix caching is off — vLLM ``enable_prefix_caching=False``
(``vllm:cache_config_info``), SGLang ``disable_radix_cache=true`` (``/server_info``) — and whose
``cache_disabled`` re-prefill (METRICS.md §1: prefixes the session had computed, recomputed because
the engine keeps nothing) clears ``findings_min_usd_week``.

Evidence: follow-up calls, reusable prefix tokens R_eff, ``cache_disabled`` re-prefill tokens and
GPU-time cost.

Fix: vLLM — drop ``--no-enable-prefix-caching`` (prefix caching is on by default for generative
models, reference/vllm.md §5.1); SGLang — drop ``--disable-radix-cache`` (reference/sglang.md §2).
Recoverable: the ``cache_disabled`` re-prefill (analytical upper bound: no eviction once on).
"""

from __future__ import annotations

from ..context import Context, fmt_tokens, fmt_usd
from ..finding import Finding, Scope
from ..sizing import MISSES_SQL, cause_claim, misses

ID = "prefix_cache_off"


def check(ctx: Context) -> list[Finding]:
    out = []
    for inst, cfg in ctx.instances.items():
        if cfg["prefix_caching"] is not False or cfg["engine"] not in ("vllm", "sglang"):
            continue
        m = misses(ctx, inst, "cache_disabled")
        x, usd = m["cause_tokens"], m["cause_usd"]
        if not ctx.at_stake(usd, x):
            continue
        if cfg["engine"] == "vllm":
            fix = ("Turn vLLM prefix caching back on: remove `--no-enable-prefix-caching` from the launch command "
                   "(on by default for generative models; `vllm:cache_config_info` then shows "
                   "enable_prefix_caching=\"True\").")
            setting = "enable_prefix_caching=False"
            short = "remove `--no-enable-prefix-caching`"
        else:
            fix = ("Turn SGLang's radix cache back on: remove `--disable-radix-cache` from the launch command "
                   "(`/server_info` then shows disable_radix_cache=false). Cache-aware scheduling "
                   "(`--schedule-policy lpm`) also needs it.")
            setting = "disable_radix_cache=true"
            short = "remove `--disable-radix-cache`"
        tax = ctx.tax(x, usd, f"GPU-time re-prefill cost ({m['cost_basis']})")
        rec = ctx.tax(x, usd, "analytical upper bound: every reusable prefix hits once caching is on (no eviction)",
                      method="analytical")
        share = x / m["computed_prefill"] if m["computed_prefill"] else None
        out.append(Finding(
            rule=ID,
            title=f"Prefix caching is off on a {cfg['engine']} instance: every turn recomputes the whole context",
            severity=ctx.severity(tax),
            scope=Scope(instance=inst, model=cfg["model"]),
            evidence=ctx.evidence({
                "config": setting,
                "follow_up_calls": m["follow_ups"],
                "cache_disabled_calls": m["cause_calls"],
                "reprefill_tokens": x,
                "share_of_computed_prefill": share,
                "reprefill_usd": usd,
            }, MISSES_SQL, {"instance": inst, "cause": "cache_disabled", "cause2": "", "cause3": ""}),
            tax=tax,
            recoverable=rec,
            confidence=ctx.confidence(m["cause_calls"], exact=m["cause_exact"] == m["cause_calls"]),
            remediation=fix,
            fix=short,
            claim=cause_claim("cache_disabled", instance=inst),
            summary=f"{m['cause_calls']} calls recomputed {fmt_tokens(x)} reusable tokens, {fmt_usd(tax.usd_week)}{tax.per}",
        ))
    return out
