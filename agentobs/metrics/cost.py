"""The cost model (METRICS.md §8): one explicit, configurable basis per instance.

Read from the settings file's ``[cost]`` section (see collectors/cost.example.toml)::

    [cost]
    usd_per_hour = 2.5              # default instance price (GPU price × GPUs)
    prefill_tokens_per_s = 10000    # used when engine spans do not show prefill throughput
    decode_tokens_per_s = 2500      # instance decode throughput
    kv_capacity_tokens = 500000     # used when the engine config does not report it
    [cost.instances."10.0.0.1:8000"]   # per-instance overrides (same keys + model, kv_dtype_bytes)
    usd_per_hour = 19.6
    [cost.list_price]               # optional API-style basis, $ per million tokens
    input = 0.4
    cached_input = 0.04
    output = 1.6
    [cost.kv_geometry."my-org/my-model"]  # bytes/token for models the built-in table lacks
    layers = 40
    kv_heads = 8
    head_dim = 128

Precedence per instance and field: the instance's override > what the data shows (KV capacity from
``instance_config``; prefill throughput = median over engine spans of ``(P − C) / prefill_s``) >
the ``[cost]`` default > the built-in default. Every value carries its source in ``basis``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from ..errors import ConfigError, did_you_mean
from . import geometry
from .usual import usual_cte

BUILTIN_DEFAULTS = {"usd_per_hour": 2.5, "prefill_tokens_per_s": 10000.0, "decode_tokens_per_s": 2500.0}
NUMERIC = ("usd_per_hour", "prefill_tokens_per_s", "decode_tokens_per_s", "kv_capacity_tokens", "kv_dtype_bytes")
TOP_KEYS = set(NUMERIC) | {"instances", "list_price", "kv_geometry"}
INSTANCE_KEYS = set(NUMERIC) | {"model"}
LIST_PRICE_KEYS = {"input", "cached_input", "output"}


@dataclass
class CostModel:
    defaults: dict[str, float] = field(default_factory=dict)
    instances: dict[str, dict] = field(default_factory=dict)
    list_price: dict[str, float] | None = None
    geometries: list = field(default_factory=list)


def _number(v, where: str, key: str, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{where}: {key} must be a number, got {v!r}")
    if positive and not v > 0:
        raise ConfigError(f"{where}: {key} must be > 0, got {v!r}")
    if not positive and v < 0:
        raise ConfigError(f"{where}: {key} must be ≥ 0, got {v!r}")
    return float(v)


def parse_cost(section: dict | None) -> CostModel:
    """Validate a ``[cost]`` table; raises ConfigError naming the key and the fix."""
    section = section or {}
    if not isinstance(section, dict):
        raise ConfigError("[cost] must be a table")
    m = CostModel()
    for k, v in section.items():
        if k not in TOP_KEYS:
            raise ConfigError(f"[cost]: unknown key {k!r}{did_you_mean(k, sorted(TOP_KEYS), 'known:')}")
        if k in NUMERIC:
            m.defaults[k] = _number(v, "[cost]", k)
    inst = section.get("instances", {})
    if not isinstance(inst, dict):
        raise ConfigError('[cost.instances] must be a table of "host:port" tables')
    for name, spec in inst.items():
        w = f'[cost.instances."{name}"]'
        if not isinstance(spec, dict):
            raise ConfigError(f"{w} must be a table (usd_per_hour = …)")
        out: dict[str, Any] = {}
        for k, v in spec.items():
            if k not in INSTANCE_KEYS:
                raise ConfigError(f"{w}: unknown key {k!r}{did_you_mean(k, sorted(INSTANCE_KEYS), 'known:')}")
            if k == "model":
                if not isinstance(v, str) or not v:
                    raise ConfigError(f"{w}: model must be a model name, got {v!r}")
                out[k] = v
            else:
                out[k] = _number(v, w, k)
        m.instances[str(name)] = out
    lp = section.get("list_price")
    if lp is not None:
        if not isinstance(lp, dict):
            raise ConfigError("[cost.list_price] must be a table (input, cached_input, output in $ per million tokens)")
        for k in lp:
            if k not in LIST_PRICE_KEYS:
                hint = did_you_mean(k, sorted(LIST_PRICE_KEYS), "known:")
                raise ConfigError(f"[cost.list_price]: unknown key {k!r}{hint}")
        if "input" not in lp or "output" not in lp:
            raise ConfigError("[cost.list_price]: needs input and output ($ per million tokens); cached_input is optional")
        m.list_price = {k: _number(v, "[cost.list_price]", k, positive=False) for k, v in lp.items()}
        m.list_price.setdefault("cached_input", m.list_price["input"])
    if "kv_geometry" in section:
        m.geometries = geometry.parse_user_geometry(section["kv_geometry"], "[cost.kv_geometry]")
    return m


COST_SCHEMA = pa.schema([
    ("instance", pa.string()),
    ("usd_per_s", pa.float64()),
    ("prefill_tps", pa.float64()),
    ("decode_tps", pa.float64()),
    ("kv_capacity_tokens", pa.float64()),
    ("usd_per_token_s", pa.float64()),
    ("bytes_per_token", pa.float64()),
    ("g_star_s", pa.float64()),
    ("list_input_per_tok", pa.float64()),
    ("list_cached_per_tok", pa.float64()),
    ("list_output_per_tok", pa.float64()),
    ("basis", pa.string()),
    ("rent_basis", pa.string()),
])

# per instance: the observed prefill throughput and the usual model of its calls (agentobs.metrics.usual: the model
# picks the KV geometry, so a tie must go the same way every run)
_OBSERVED_SQL = """
WITH o AS (
    SELECT coalesce(s.instance, '') AS instance,
           median((s.prompt_tokens - coalesce(s.cached_tokens, 0)) / s.prefill_s)
               FILTER (WHERE s.prefill_s > 0 AND s.prompt_tokens > coalesce(s.cached_tokens, 0)) AS prefill_tps,
           count(*) FILTER (WHERE s.prefill_s > 0 AND s.prompt_tokens > coalesce(s.cached_tokens, 0)) AS prefill_n
    FROM m_src s
    GROUP BY ALL
),
""" + usual_cte("m", "instance", "model", "(SELECT coalesce(instance, '') AS instance, model, 1 AS n FROM m_src)") + """
SELECT o.instance, o.prefill_tps, o.prefill_n, m.model FROM o LEFT JOIN m ON m.instance = o.instance
"""
_CONFIG_SQL = "SELECT instance, kv_capacity_tokens, model, cache_dtype FROM instance_config"


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:g}"


def cost_table(con: duckdb.DuckDBPyConnection, model: CostModel) -> pa.Table:
    """One row per instance seen in the calls or the engine config ('' = calls without an instance)."""
    observed = {r[0]: r[1:] for r in con.execute(_OBSERVED_SQL).fetchall()}
    config = {r[0]: r[1:] for r in con.execute(_CONFIG_SQL).fetchall()}
    names = sorted(set(observed) | set(config) | set(model.instances) | {""})
    rows: dict[str, list] = {n: [] for n in COST_SCHEMA.names}
    lp = model.list_price
    for inst in names:
        over = model.instances.get(inst, {})
        obs = observed.get(inst, (None, 0, None))
        cfg = config.get(inst, (None, None, None))
        basis: list[str] = []

        def pick(key, data_value=None, data_label="", over=over, basis=basis):
            if key in over:
                basis.append(f"{key}={_fmt(over[key])} ([cost.instances])")
                return over[key]
            if data_value is not None:
                basis.append(f"{key}={_fmt(data_value)} ({data_label})")
                return float(data_value)
            if key in model.defaults:
                basis.append(f"{key}={_fmt(model.defaults[key])} ([cost])")
                return model.defaults[key]
            if key in BUILTIN_DEFAULTS:
                basis.append(f"{key}={_fmt(BUILTIN_DEFAULTS[key])} (built-in default; set [cost] {key})")
                return BUILTIN_DEFAULTS[key]
            basis.append(f"{key} unknown (set [cost] {key})")
            return None

        usd_h = pick("usd_per_hour")
        prefill = pick("prefill_tokens_per_s", obs[0],
                       f"median (P−C)/prefill_s of {obs[1]} engine spans" if obs[0] else "")
        decode = pick("decode_tokens_per_s")
        cap = pick("kv_capacity_tokens", cfg[0], "engine config")
        model_name = over.get("model") or cfg[1] or obs[2]
        geo = geometry.lookup(model_name, model.geometries)
        dtype = over.get("kv_dtype_bytes") or model.defaults.get("kv_dtype_bytes") or geometry.dtype_bytes_of(cfg[2])
        bpt = geo.bytes_per_token(dtype) if geo else None
        usd_s = usd_h / 3600 if usd_h is not None else None
        per_tok_s = usd_s / cap if usd_s is not None and cap else None
        g_star = cap / prefill if cap and prefill else None
        rows["instance"].append(inst)
        rows["usd_per_s"].append(usd_s)
        rows["prefill_tps"].append(prefill)
        rows["decode_tps"].append(decode)
        rows["kv_capacity_tokens"].append(cap)
        rows["usd_per_token_s"].append(per_tok_s)
        rows["bytes_per_token"].append(bpt)
        rows["g_star_s"].append(g_star)
        rows["list_input_per_tok"].append(lp["input"] / 1e6 if lp else None)
        rows["list_cached_per_tok"].append(lp["cached_input"] / 1e6 if lp else None)
        rows["list_output_per_tok"].append(lp["output"] / 1e6 if lp else None)
        geo_txt = (f"; KV {bpt:,.0f} B/token = {geo.name} {geo.formula(dtype)}" if geo
                   else f"; KV bytes/token unknown for model {model_name!r} (add [cost.kv_geometry])")
        rows["basis"].append("GPU-time: " + "; ".join(basis[:3]) + geo_txt)
        rows["rent_basis"].append(
            f"KV slot opportunity cost = $/s ÷ KV capacity ({basis[0]}; {basis[3]})"
            + (f"; g* = capacity ÷ prefill = {g_star:,.1f} s" if g_star else "")
        )
    # built through polars: pyarrow's own list conversion imports pandas to check the values' types (a cost
    # paid once per process; docs/metrics.md, "Round 7")
    return pl.DataFrame(rows, schema={f.name: pl.String if f.type == pa.string() else pl.Float64
                                      for f in COST_SCHEMA}, strict=False).to_arrow().cast(COST_SCHEMA)
