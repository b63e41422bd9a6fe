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

RULES = (
    prefix_cache_off,
    hicache_off,
    vllm_offload,
    sglang_fcfs,
    routing,
    retention,
    itl_interference,
    obs_cached_tokens,
    obs_session_id,
)
