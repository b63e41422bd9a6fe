"""Prometheus text exposition → ``metric_samples`` rows, plus engine config from
``vllm:cache_config_info``. Parsing is prometheus_client's own text parser.

Metric names are stored in the engines' colon form: SGLang behind Prometheus 3 exposes
``sglang_foo`` for ``sglang:foo`` (and vLLM likewise ``vllm_foo``); both map to the colon name so one
query works on either. ``*_created`` samples are dropped, but for the counters of ``KEPT_CREATED`` (the fleet
hit rate's): their creation time lets a first scrape's value count from when the counter started, and shows
a restart that a decrease would miss (docs/collectors.md, "Counter resets").
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from ..errors import InputError

SAMPLE_SCHEMA = pa.schema(
    [
        ("ts", pa.timestamp("us")),
        ("instance", pa.string()),
        ("metric", pa.string()),
        ("labels", pa.map_(pa.string(), pa.string())),
        ("labels_key", pa.string()),
        ("value", pa.float64()),
        ("engine", pa.string()),
    ]
)
CONFIG_SCHEMA = pa.schema(
    [
        ("instance", pa.string()),
        ("ts", pa.timestamp("us")),
        ("engine", pa.string()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("source", pa.string()),
    ]
)
_ESCAPED = re.compile(r"^(vllm|sglang)_(?=[a-z])")
# the *_created samples stored (prometheus_client's creation time of a counter series, unix seconds; vLLM with one
# API server exposes them, SGLang and multi-process vLLM do not: ../shared/reference/vllm.md §1.1-1.2)
KEPT_CREATED = frozenset({
    "vllm:prefix_cache_hits_created", "vllm:prefix_cache_queries_created",
    "vllm:gpu_prefix_cache_hits_created", "vllm:gpu_prefix_cache_queries_created",
})
SECRET_RE = re.compile(r"(api_key|apikey|token|secret|password|passwd|credential|auth)", re.I)
# keys that contain "token" but are not secrets
NOT_SECRET = re.compile(r"(tokens|tokenizer|token_usage|_token_|token_ids|tokens_buckets)", re.I)


def canonical_name(name: str) -> str:
    return _ESCAPED.sub(lambda m: m.group(1) + ":", name, count=1)


def dropped(name: str) -> bool:
    """A sample not stored: ``*_created`` but for ``KEPT_CREATED`` (``name`` in colon form)."""
    return name.endswith("_created") and name not in KEPT_CREATED


def engine_of_metric(name: str) -> str | None:
    if name.startswith("vllm:"):
        return "vllm"
    if name.startswith("sglang:"):
        return "sglang"
    return None


def is_secret_key(key: str) -> bool:
    return bool(SECRET_RE.search(key)) and not NOT_SECRET.search(key)


@dataclass
class Scrape:
    samples: pa.Table
    config: pa.Table
    engine: str | None
    errors: list[str] = field(default_factory=list)


def to_utc(ts: float | dt.datetime) -> dt.datetime:
    if isinstance(ts, dt.datetime):
        return ts.astimezone(dt.UTC).replace(tzinfo=None) if ts.tzinfo else ts
    return dt.datetime.fromtimestamp(ts, dt.UTC).replace(tzinfo=None)


def parse_text(text: str, instance: str, at: float | dt.datetime, where: str = "scrape",
               source: str = "prometheus") -> Scrape:
    """Parse one exposition. Raises InputError naming the line when the text cannot be parsed."""
    ts = to_utc(at)
    cols: dict[str, list] = {n: [] for n in SAMPLE_SCHEMA.names}
    engines: dict[str, int] = {}
    cfg_rows: list[tuple[str, str]] = []
    served: str | None = None  # the model_name label of the vLLM series (served_model_config below)
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as e:
        raise InputError(f"invalid Prometheus text: {e}{_locate(text, e)}", where) from e
    for fam in families:
        for s in fam.samples:
            name = canonical_name(s.name)
            if dropped(name):
                continue
            eng = engine_of_metric(name)
            if eng:
                engines[eng] = engines.get(eng, 0) + 1
            labels = dict(s.labels)
            if name == "vllm:cache_config_info":
                cfg_rows.extend((k, v) for k, v in labels.items())
            elif served is None and eng == "vllm" and labels.get("model_name"):
                served = labels["model_name"]
            key = ",".join(f"{k}={labels[k]}" for k in sorted(labels))
            cols["ts"].append(ts)
            cols["instance"].append(instance)
            cols["metric"].append(name)
            cols["labels"].append(list(labels.items()))
            cols["labels_key"].append(key)
            cols["value"].append(float(s.value))
            cols["engine"].append(eng)
    engine = max(engines, key=engines.__getitem__) if engines else None
    samples = pa.table(cols, schema=SAMPLE_SCHEMA)
    cfg_rows = served_model_config(cfg_rows, served)
    config = config_table(instance, ts, engine or "vllm", cfg_rows, source) if cfg_rows else empty_config()
    return Scrape(samples=samples, config=config, engine=engine)


def served_model_config(config: list[tuple[str, str]], model_name: str | None) -> list[tuple[str, str]]:
    """``vllm:cache_config_info`` names no model, but vLLM labels its other series with ``model_name`` (the
    served model name): it is kept with the config as ``served_model_name`` (``instance_config.model``), unless
    the config names one already. Only a scrape that carries the cache config gets it."""
    if not config or not model_name or any(k == "served_model_name" for k, _ in config):
        return config
    return [*config, ("served_model_name", model_name)]


def _locate(text: str, err: Exception) -> str:
    """prometheus_client's messages do not say where: find the first sample line that fails alone."""
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except (ValueError, TypeError, IndexError):
            return f" at line {i}: {line[:120]!r}"
    return ""


def empty_config() -> pa.Table:
    return pa.table({n: [] for n in CONFIG_SCHEMA.names}, schema=CONFIG_SCHEMA)


def config_table(instance: str, ts: dt.datetime, engine: str, items: list[tuple[str, str]], source: str) -> pa.Table:
    rows = [(k, "<redacted>" if is_secret_key(k) and v not in ("None", "null", "") else v) for k, v in items]
    return pa.table(
        {
            "instance": [instance] * len(rows),
            "ts": [ts] * len(rows),
            "engine": [engine] * len(rows),
            "key": [k for k, _ in rows],
            "value": [v for _, v in rows],
            "source": [source] * len(rows),
        },
        schema=CONFIG_SCHEMA,
    )
