"""Roofline-style cost presets per GPU / model, declared as data.

One engine step (continuous batching: every running request decodes one token, plus up to the
chunked-prefill budget of prompt tokens) takes

    step_s = overhead_s + max(weights_s + kv_s_per_token × Σ context of decoding requests,
                              (decode tokens + prefill tokens) ÷ prefill_tps)

i.e. decode is memory-bound (read the weights once per step, plus every live token's KV), prefill
is compute-bound. Loading a host-tier (CPU/HiCache) hit back costs ``tokens ÷ host_load_tps``.

Figures are round numbers from public specs (HBM bandwidth, dense BF16 FLOPs at ~55% MFU, KV bytes
per token = 2 × layers × kv_heads × head_dim × 2 bytes), not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostPreset:
    name: str
    model: str
    gpus: int
    weights_s: float          # reading the weights once (per step, memory-bound floor)
    kv_s_per_token: float     # reading one context token's KV during a decode step
    prefill_tps: float        # compute-bound prompt tokens per second
    kv_capacity_tokens: int   # GPU KV pool
    kv_bytes_per_token: int
    host_load_tps: float      # host-tier → GPU tokens per second (PCIe)
    usd_per_hour: float
    decode_tps: float = 2500.0  # output tokens/s of a busy replica (cost model basis, METRICS.md §8)
    overhead_s: float = 0.002
    layers: int = 0


PRESETS: dict[str, CostPreset] = {
    p.name: p
    for p in (
        # Qwen3-32B: 64 layers, 8 KV heads, head_dim 128 → 262,144 B/token. TP=2 on H100 80GB.
        CostPreset("h100x2-qwen3-32b", "Qwen/Qwen3-32B", 2, 0.0096, 262144 / 6.7e12, 16000.0, 300_000, 262144,
                   100_000.0, 2 * 2.5, decode_tps=2500.0, layers=64),
        # Same model, one H200 141GB.
        CostPreset("h200-qwen3-32b", "Qwen/Qwen3-32B", 1, 0.0134, 262144 / 4.8e12, 9000.0, 240_000, 262144,
                   100_000.0, 3.5, decode_tps=2000.0, layers=64),
        # Llama-3.1-8B: 32 layers, 8 KV heads, head_dim 128 → 131,072 B/token. One H100 80GB.
        CostPreset("h100-llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 1, 0.0048, 131072 / 3.35e12, 40000.0,
                   427_051, 131072, 200_000.0, 2.5, decode_tps=6000.0, layers=32),
        # Llama-3.1-8B on an A100 40GB: a small KV pool, the one that runs out first.
        CostPreset("a100-llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 1, 0.008, 131072 / 2.0e12, 15000.0,
                   150_000, 131072, 150_000.0, 1.5, decode_tps=3500.0, layers=32),
        # Small pool for tests and what-if runs that must show pressure quickly.
        CostPreset("tiny-test", "sim/tiny", 1, 0.005, 1e-8, 20000.0, 40_000, 65536, 100_000.0, 1.0),
    )
}


def preset(name: str) -> CostPreset:
    from ..errors import ConfigError

    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown cost preset {name!r}; known: {', '.join(PRESETS)}") from None
