"""SGLang ``GET /server_info`` → ``engine_config`` rows, secrets redacted before storing.

Nested objects are flattened with dots (``memory_usage.token_capacity``); the first entry of
``internal_states`` fills keys the top level lacks (``max_total_num_tokens`` lives there in
current SGLang). Any key that looks like a secret (api_key, *token* that is not a token count,
password, ...) is stored as ``<redacted>`` when it has a value; the value never reaches the store.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa

from ..errors import InputError
from .prom import config_table, is_secret_key, to_utc


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k != "cuda_graph_config":
            out.update(_flatten(v, key + "."))
        elif k == "internal_states":
            continue
        else:
            out[key] = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return out


def server_info_rows(info: Any, instance: str, at: float | dt.datetime, where: str = "server_info",
                     source: str = "server_info") -> pa.Table:
    if not isinstance(info, dict):
        raise InputError(f"expected a JSON object (SGLang /server_info), got {type(info).__name__}", where)
    flat = _flatten(info)
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        for k, v in _flatten(states[0]).items():
            flat.setdefault(k, v)
    if not any(k in flat for k in ("page_size", "disable_radix_cache", "max_total_num_tokens", "model_path")):
        raise InputError("does not look like SGLang /server_info (no page_size, disable_radix_cache or model_path)", where)
    items = []
    for k, v in sorted(flat.items()):
        if is_secret_key(k.rsplit(".", 1)[-1]) and v not in ("null", "", "None"):
            v = "<redacted>"
        items.append((k, v))
    return config_table(instance, to_utc(at), "sglang", items, source)
