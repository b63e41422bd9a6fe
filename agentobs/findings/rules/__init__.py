"""The rules, one per module, run in this order. Each module has ``ID`` and ``check(ctx)``."""

from __future__ import annotations

from . import (
    hicache_off,
    itl_interference,
    obs_cached_tokens,
    obs_session_id,
    prefix_cache_off,
    retention,
    routing,
    sglang_fcfs,
    vllm_offload,
)

# The order is also the ledger's claim order (agentobs.findings.ledger): a call's re-prefill belongs to the first
# finding that claims it — the cache that keeps nothing, then the router that sent the turn away, then the queue
# that let the prefix age out, then the missing second tier, then retention.
RULES = (
    prefix_cache_off,
    routing,
    sglang_fcfs,
    hicache_off,
    vllm_offload,
    retention,
    itl_interference,
    obs_cached_tokens,
    obs_session_id,
)
