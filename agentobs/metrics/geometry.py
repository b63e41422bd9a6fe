"""KV-cache geometry: bytes of KV cache per token of context (METRICS.md §8).

- MHA/GQA: ``2 × layers × kv_heads × head_dim × dtype_bytes`` (K and V per layer)
- MLA (DeepSeek-V3/R1): ``layers × (kv_lora_rank + qk_rope_head_dim) × dtype_bytes`` (one latent)

The built-in table holds the layer/head numbers from the models' published ``config.json``
(``num_hidden_layers``, ``num_key_value_heads``, ``head_dim`` — or hidden_size/num_attention_heads
where the config has no head_dim — and for MLA ``kv_lora_rank``, ``qk_rope_head_dim``). Users add
or override entries in TOML under ``[cost.kv_geometry."<model>"]``. Lookup matches the model name
with every non-alphanumeric character removed, case-insensitively, against each entry's aliases;
the longest matching alias wins (so ``Qwen3-30B-A3B`` does not match ``Qwen3-3``...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Geometry:
    name: str
    layers: int
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    note: str = ""

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    def bytes_per_token(self, dtype_bytes: float = 2) -> float:
        if self.kv_lora_rank is not None:  # MLA: the latent plus the rope part, once per layer
            return self.layers * (self.kv_lora_rank + _need(self.qk_rope_head_dim, self.name, "qk_rope_head_dim")) \
                * dtype_bytes
        kv_heads, head_dim = _need(self.kv_heads, self.name, "kv_heads"), _need(self.head_dim, self.name, "head_dim")
        return 2 * self.layers * kv_heads * head_dim * dtype_bytes

    def formula(self, dtype_bytes: float = 2) -> str:
        if self.mla:
            return f"{self.layers}×({self.kv_lora_rank}+{self.qk_rope_head_dim})×{dtype_bytes:g} B (MLA)"
        return f"2×{self.layers}×{self.kv_heads}×{self.head_dim}×{dtype_bytes:g} B"


# name, aliases (normalized), geometry numbers from config.json
BUILTIN: tuple[tuple[tuple[str, ...], Geometry], ...] = (
    (("llama318b", "llama38b", "metallama38b"), Geometry("Llama-3.1-8B", 32, 8, 128)),
    (("llama3170b", "llama370b", "llama3370b", "metallama370b"), Geometry("Llama-3.x-70B", 80, 8, 128)),
    (("llama31405b",), Geometry("Llama-3.1-405B", 126, 8, 128)),
    (("llama321b",), Geometry("Llama-3.2-1B", 16, 8, 64)),
    (("llama323b",), Geometry("Llama-3.2-3B", 28, 8, 128)),
    (("qwen306b",), Geometry("Qwen3-0.6B", 28, 8, 128)),
    (("qwen317b",), Geometry("Qwen3-1.7B", 28, 8, 128)),
    (("qwen34b",), Geometry("Qwen3-4B", 36, 8, 128)),
    (("qwen38b",), Geometry("Qwen3-8B", 36, 8, 128)),
    (("qwen314b",), Geometry("Qwen3-14B", 40, 8, 128)),
    (("qwen332b",), Geometry("Qwen3-32B", 64, 8, 128)),
    (("qwen330ba3b", "qwen3coder30ba3b"), Geometry("Qwen3-30B-A3B (MoE)", 48, 4, 128)),
    (("qwen3235ba22b",), Geometry("Qwen3-235B-A22B (MoE)", 94, 4, 128)),
    (("qwen3coder480ba35b",), Geometry("Qwen3-Coder-480B-A35B (MoE)", 62, 8, 128)),
    (("deepseekv3", "deepseekr1"), Geometry("DeepSeek-V3/R1 (MLA)", 61, kv_lora_rank=512, qk_rope_head_dim=64)),
    (("glm45air",), Geometry("GLM-4.5-Air", 46, 8, 128)),
    (("glm45", "glm46", "glm47"), Geometry("GLM-4.5/4.6/4.7", 92, 8, 128)),
    (("glm49b", "glm4v9b", "glm40414", "glm49b0414"), Geometry("GLM-4-9B", 40, 2, 128)),
    (("mistral7b",), Geometry("Mistral-7B", 32, 8, 128)),
    (("mistralsmall24b", "mistralsmall3124b", "mistralsmall32"), Geometry("Mistral-Small-24B", 40, 8, 128)),
    (("mistrallarge", "mistrallarge2"), Geometry("Mistral-Large-2 (123B)", 88, 8, 128)),
    (("mixtral8x7b",), Geometry("Mixtral-8x7B", 32, 8, 128)),
    (("mixtral8x22b",), Geometry("Mixtral-8x22B", 56, 8, 128)),
    (("gptoss120b",), Geometry("gpt-oss-120b", 36, 8, 64,
                                note="half the layers use a 128-token sliding window: long contexts hold about half")),
    (("gptoss20b",), Geometry("gpt-oss-20b", 24, 8, 64,
                               note="half the layers use a 128-token sliding window: long contexts hold about half")),
)

_FIELDS = {"layers", "kv_heads", "head_dim", "kv_lora_rank", "qk_rope_head_dim", "dtype_bytes", "aliases"}


def normalize(model: str) -> str:
    return re.sub(r"[^0-9a-z]", "", model.lower())


def parse_user_geometry(table: dict, where: str = "[cost.kv_geometry]") -> list[tuple[tuple[str, ...], Geometry]]:
    """``{model: {layers, kv_heads, head_dim} | {layers, kv_lora_rank, qk_rope_head_dim}}`` from TOML."""
    out = []
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table of models")
    for model, spec in table.items():
        w = f'{where[:-1]}."{model}"]'
        if not isinstance(spec, dict):
            raise ConfigError(f"{w} must be a table with layers, kv_heads, head_dim (or kv_lora_rank, qk_rope_head_dim)")
        unknown = set(spec) - _FIELDS
        if unknown:
            raise ConfigError(f"{w}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_FIELDS))})")

        def pos_int(k, spec=spec, w=w):
            v = spec.get(k)
            if v is None:
                return None
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{w}: {k} must be a positive integer, got {v!r}")
            return v

        layers = pos_int("layers")
        if layers is None:
            raise ConfigError(f"{w}: layers is required")
        mla = spec.get("kv_lora_rank") is not None
        if mla:
            g = Geometry(str(model), layers, kv_lora_rank=pos_int("kv_lora_rank"),
                         qk_rope_head_dim=pos_int("qk_rope_head_dim") or 0)
        else:
            kvh, hd = pos_int("kv_heads"), pos_int("head_dim")
            if kvh is None or hd is None:
                raise ConfigError(f"{w}: needs kv_heads and head_dim (MHA/GQA) or kv_lora_rank (MLA)")
            g = Geometry(str(model), layers, kvh, hd)
        aliases = spec.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise ConfigError(f"{w}: aliases must be a list of strings")
        out.append(((normalize(str(model)), *map(normalize, aliases)), g))
    return out


def lookup(model: str | None, extra: list[tuple[tuple[str, ...], Geometry]] | None = None) -> Geometry | None:
    """The geometry whose longest alias occurs in the normalized model name; user entries first."""
    if not model:
        return None
    key = normalize(model)
    best: tuple[int, int, Geometry] | None = None
    for prio, entries in ((1, extra or []), (0, BUILTIN)):
        for aliases, g in entries:
            for a in aliases:
                if a and a in key:
                    cand = (prio, len(a), g)
                    if best is None or cand[:2] > best[:2]:
                        best = cand
    return best[2] if best else None


def dtype_bytes_of(cache_dtype: str | None) -> float:
    """KV dtype bytes from the engine's cache dtype (``auto`` = the model dtype, bf16/fp16 = 2)."""
    if not cache_dtype:
        return 2
    d = cache_dtype.lower()
    if "fp8" in d or "int8" in d or "e4m3" in d or "e5m2" in d:
        return 1
    if "fp4" in d or "int4" in d:
        return 0.5
    if "32" in d:
        return 4
    return 2


def _need(v: int | None, name: str, key: str) -> int:
    if v is None:
        raise ConfigError(f"model geometry {name!r}: {key} is missing")
    return v
