"""Settings, declared once as data.

Every setting has a name, a default, a type and a help line. The same table drives the TOML
loader, ``agentobs settings`` and docs/settings.md (a test fails when the docs miss one).

Precedence (last wins): defaults < settings file < environment (``AGENTOBS_<NAME>``) < CLI flags.
The settings file is ``--config PATH``, else ``$AGENTOBS_CONFIG``, else ``./agentobs.toml`` if present.

The file is validated when it is loaded: an unknown setting or table, a value of the wrong type and a bad
table (``[cost]``, checked by its owner, see ``SECTIONS``) are a ConfigError naming the file and the key.
Code reads every setting one way, as an attribute: ``settings.ttft_slo_s``, ``settings.cost`` (a table,
``{}`` when the file has none); ``getattr(settings, name)`` where the name is data.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .conventions import SESSION_KEYS, TASK_KEYS, TASK_TYPE_KEYS, TENANT_KEYS
from .errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    help: str
    type: type = str


SETTINGS: tuple[Setting, ...] = (
    Setting("db", "agentobs.duckdb", "Path of the DuckDB file (also --db and $AGENTOBS_DB)."),
    Setting("backend", "duckdb", "Engine that metrics, sql, findings, report and exporter read: duckdb (the store "
            "--db) or clickhouse (--clickhouse-url; docs/clickhouse.md). Also --backend."),
    Setting("clickhouse_url", "chdb:///agentobs.chdb", "ClickHouse for --backend clickhouse: chdb:///DIR (in-process "
            "chDB), chdb: (memory) or http(s)://user:password@host:8123/database. Also --clickhouse-url."),
    Setting("session_keys", SESSION_KEYS, "Span attributes holding the session id, first match wins.", list),
    Setting("task_keys", TASK_KEYS, "Span attributes holding the task id; else the root trace id.", list),
    Setting("task_type_keys", TASK_TYPE_KEYS, "Span attributes holding the task type.", list),
    Setting("tenant_keys", TENANT_KEYS, "Span attributes holding the tenant (team/user).", list),
    Setting("default_block_size", 16, "KV block size (tokens) when the engine config is unknown (vLLM's default).", int),
    # -- metrics (docs/metrics.md) --
    Setting("ttft_slo_s", 2.0, "TTFT SLO of a good turn (turn_goodput), in seconds.", float),
    Setting("itl_slo_ms", 100.0, "ITL SLO: a good turn's p99 inter-token gap, and the ITL tail threshold, in ms.", float),
    Setting("itl_tail_threshold", "slo", "ITL tail threshold: 'slo' (itl_slo_ms) or 'p99' (p99 of all gaps of the model).", str),
    Setting("long_prefill_tokens", 8192, "A prefill computing at least this many tokens (P - C) is 'long' (itl_tail).", int),
    Setting("abandoned_after_s", 600.0, "A session's last call counts as abandoned (idle_kv_rent) only when the data goes on at least this many seconds after it ended.", float),
    Setting("hit_tolerance_blocks", 1, "Estimate mode: a shortfall R_eff - C of at most this many KV blocks, without evidence of eviction, is a hit (agent harnesses re-render the tail of the context).", int),
    Setting("metrics_bucket_s", 60.0, "Time bucket of the time series metrics (concurrency, capacity), in seconds.", float),
    # -- findings (docs/findings.md) --
    Setting("findings_min_usd_week", 1.0, "A finding with a measurable tax fires only when it costs at least this many $ per week.", float),
    Setting("findings_min_share", 0.02, "A re-prefill finding fires only when its tokens are at least this share of the scope's computed prefill Σ(P − C).", float),
    Setting("findings_min_calls", 20, "Fewer calls than this behind a finding make its confidence 'low'.", int),
    Setting("findings_high_usd_week", 500.0, "Severity 'high' from this many $ per week at stake.", float),
    Setting("findings_medium_usd_week", 50.0, "Severity 'medium' from this many $ per week at stake (below: 'low').", float),
    Setting("findings_routed_away_share", 0.10, "Non-affine routing: routed_away re-prefill as a share of reusable prefix tokens ΣR_eff.", float),
    Setting("findings_queue_s", 0.1, "A call whose engine queue time is at least this (s) counts as queued (SGLang FCFS rule).", float),
    Setting("findings_unknown_cached_share", 0.5, "Observability gap: share of an instance's calls without a cached-token count.", float),
    Setting("findings_no_session_share", 0.2, "Observability gap: share of calls without a session id.", float),
    Setting("findings_itl_long_prefill_share", 0.3, "ITL interference: share of tail inter-token gaps overlapping a long prefill.", float),
    Setting("findings_itl_min_tail_gaps", 20, "ITL interference: fewest tail gaps on an instance to judge it.", int),
    Setting("findings_beyond_gstar_share", 0.5, "Retention rule: share of idle gaps beyond (or below) the break-even g*.", float),
    Setting("findings_default_window_s", 604800.0, "Findings window when --since is not given: this many seconds ending at --until, or at the newest call's start.", float),
    Setting("findings_min_window_s", 3600.0, "Findings on an observed window shorter than this (s) report the tax for the window itself, not scaled to a week.", float),
    Setting("findings_sim_sessions", 200, "Recoverable tax by simulation: most sessions replayed through the simulator (a contiguous slice of the window; bounds its cost); 0 = analytical estimate only.", int),
    Setting("findings_sim_seed", 1, "Seed of the findings replay (which slice of sessions is replayed).", int),
    Setting("sql_row_cap", 10000, "Maximum rows a user SQL query returns (agentobs sql, console).", int),
    Setting("sql_timeout_s", 30.0, "Time limit of a user SQL query, in seconds.", float),
    Setting("writer_batch_rows", 50000, "Rows buffered per table before the writer commits a batch.", int),
    Setting("writer_flush_s", 1.0, "Longest time a row waits in the writer before commit, in seconds.", float),
    # --- collectors (agentobs collect; a fleet file's sections override these) ---
    Setting("receiver_grpc", "127.0.0.1:4317", "OTLP/gRPC listen address host:port ('' disables).", str),
    Setting("receiver_http", "127.0.0.1:4318", "OTLP/HTTP listen address host:port ('' disables).", str),
    Setting("receiver_token", "", "Bearer token OTLP clients must send (empty: none). Prefer $AGENTOBS_RECEIVER_TOKEN.", str),
    Setting("receiver_max_body_mb", 16, "Largest OTLP request body, in MiB: the Content-Length and the gzip-decompressed size (HTTP), the gRPC message (decompressed); checked before the body is read or inflated.", int),
    Setting("receiver_max_inflight_mb", 32, "OTLP request bodies being read, checked or spooled at once, in MiB, both transports together: a request that does not fit gets 429/RESOURCE_EXHAUSTED with Retry-After (bounds the receivers' memory).", int),
    Setting("receiver_max_connections", 256, "Concurrent OTLP/HTTP connections (one thread each); at the cap an idle keep-alive connection is closed for the new one, else the new one waits in the listen backlog.", int),
    Setting("receiver_max_concurrent_rpcs", 16, "Concurrent OTLP/gRPC calls; more are answered RESOURCE_EXHAUSTED by gRPC.", int),
    Setting("receiver_backlog", 1024, "Listen backlog of the OTLP/HTTP socket (connections the kernel holds until accepted; capped by net.core.somaxconn).", int),
    Setting("receiver_read_timeout_s", 60.0, "OTLP/HTTP: longest time from a request's first byte until its body is read; a slower client is disconnected.", float),
    Setting("receiver_idle_timeout_s", 60.0, "OTLP/HTTP and gRPC: an idle (kept-alive) connection is closed after this many seconds.", float),
    Setting("max_span_attributes", 1024, "Attributes kept per span (and per resource and event), first ones first; the rest are dropped with a warning.", int),
    Setting("receiver_commit_timeout_s", 30.0, "How long an export waits for its spool write (fsync) before answering 503/UNAVAILABLE.", float),
    Setting("spool_dir", "", "Directory of the OTLP spool: request bodies fsync'd before they are acknowledged (default: <db>.spool).", str),
    Setting("spool_segment_mb", 64, "Size of a spool segment file before the next one is started, in MiB.", int),
    Setting("spool_max_unloaded_mb", 1024, "Spooled but not yet stored request bytes from which OTLP answers 429/RESOURCE_EXHAUSTED, in MiB.", int),
    Setting("spool_min_free_mb", 512, "Free disk under the spool below which OTLP answers 429/RESOURCE_EXHAUSTED, in MiB.", int),
    Setting("spool_dedupe_requests", 100000, "Recent request bodies remembered by hash: a retried export is acknowledged without a second copy.", int),
    Setting("loader_processes", 0, "Processes decoding spooled OTLP requests (0: one per core).", int),
    Setting("collect_memory_limit", "256MB", "DuckDB memory_limit of the store connection `agentobs collect` writes with (its buffer pool: with the receivers' and loader's bounds it keeps the collector's processes under 1 GiB RSS together, docs/collectors.md); '' leaves DuckDB's default (80% of RAM).", str),
    Setting("loader_decoder", "native", "How the loader decodes spooled OTLP/protobuf: native (protobuf to Arrow with ptars, vectorised normalisation; rare shapes by the Python decoder) or python (otlp.py only).", str),
    Setting("span_store", "segments", "Where `agentobs collect` stores OTLP spans: table (the loader inserts each batch into the DuckDB table spans_part) or segments (decoder processes write each batch as a Parquet file under <db>.segments, the loader commits its catalog row; merged into large Parquet files in the background; docs/collectors.md).", str),
    Setting("segment_compact_after", 8, "span_store = segments: Parquet segments left unmerged before the collector's loader merges the oldest half (readers deduplicate the unmerged tail on every read): a segment of 8,192 spans or more with no copy of a stored span is listed as a merged file as it is, smaller ones are merged into one new Parquet file.", int),
    Setting("loader_batch_mb", 16.0, "Spooled request bytes decoded and stored as one batch (one transaction, one Parquet segment), in MiB: the most a batch takes when requests wait in the spool (a quiet collector's batches are what has arrived).", float),
    Setting("receiver_retry_after_s", 1.0, "Retry-After / RetryInfo delay sent with 429/503, in seconds.", float),
    Setting("collect_commit_s", 0.05, "Longest time collected rows wait before the writer commits (group commit), in seconds.", float),
    Setting("collect_stop_refresh_s", 3.0, "Time budget of the session model's refresh when `agentobs collect` stops (SIGTERM/SIGINT), in seconds: past it the refresh is rolled back and the next refresh catches up; 0 skips it.", float),
    Setting("scrape_interval_s", 15.0, "Default scrape interval of fleet targets, in seconds.", float),
    Setting("scrape_timeout_s", 5.0, "Scrape timeout, in seconds: covers the fetch (the body read too), the parse and the hand-over to the writer; past it nothing of the scrape is stored.", float),
    Setting("scrape_jitter", 0.1, "Random delay added to each scrape, as a fraction of the interval.", float),
    Setting("scrape_concurrency", 16, "Scrapes running at the same time.", int),
    Setting("scrape_max_series", 50000, "Series one scrape of one target may store; a page with more stores none of them (a scrapes row with error too_many_series).", int),
    Setting("server_info_every_s", 300.0, "How often SGLang /server_info is re-read (stored only on change), in seconds.", float),
    Setting("health_listen", "127.0.0.1:9464", "Listen address of the collector's own /metrics ('' disables).", str),
    Setting("snapshot_path", "", "Read snapshot published by `agentobs collect` for readers (default: <db>.read.duckdb).", str),
    Setting("snapshot_every_s", 60.0, "How often `agentobs collect` publishes the read snapshot, in seconds (0 disables).", float),
    # --- report and exporter (docs/report.md) ---
    Setting("console_url", "http://127.0.0.1:8501", "Base URL of the console, for links in the weekly report.", str),
    Setting("exporter_listen", "127.0.0.1:9465", "Listen address host:port of `agentobs exporter` (derived metrics).", str),
    Setting("exporter_window_s", 3600.0, "Window of calls the exporter's derived metrics cover (ending now), in seconds.", float),
    Setting("exporter_refresh_s", 60.0, "How often the exporter recomputes its snapshot, in seconds.", float),
)

_BY_NAME = {s.name: s for s in SETTINGS}

# The tables a settings file may hold: name -> (the function that validates it, "module:function", imported when
# the file has the table; what it is). Any other table is an error.
SECTIONS: dict[str, tuple[str, str]] = {
    "cost": ("agentobs.metrics.cost:parse_cost", "the cost model (docs/metrics.md, \"Cost model\")"),
}


@dataclass
class Settings:
    """Values by name (what the settings file and the environment set; the rest are defaults), read as attributes:
    ``settings.db``, ``settings.cost``. An unknown name is an AttributeError, never a silent default."""

    values: dict[str, Any] = field(default_factory=dict)
    source: str = "defaults"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        values = self.__dict__.get("values", {})
        if name in _BY_NAME:
            return values.get(name, _BY_NAME[name].default)
        if name in SECTIONS:
            table = values.get(name, {})
            return table if isinstance(table, dict) else {}
        raise AttributeError(f"no setting {name!r}{did_you_mean(name, [*_BY_NAME, *SECTIONS])}")


def _coerce(setting: Setting, value: Any, where: str) -> Any:
    try:
        if setting.type is list:
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TypeError
            return list(value)
        if setting.type is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.strip().lower() in ("true", "1", "yes")
            raise TypeError
        if setting.type is int and not isinstance(value, bool):
            if isinstance(value, float) and not value.is_integer():
                raise TypeError
            return int(value)
        if setting.type is float and not isinstance(value, bool):
            return float(value)
        if setting.type is str and isinstance(value, str):
            return value
    except (TypeError, ValueError):
        pass
    raise ConfigError(
        f"{where}: setting {setting.name!r} must be {setting.type.__name__}, got {value!r}"
    )


def _check_section(name: str, table: Any, where: str) -> None:
    """Validate the table ``name`` with its owner's function (SECTIONS); its errors name the file too."""
    import importlib

    module, _, func = SECTIONS[name][0].partition(":")
    try:
        getattr(importlib.import_module(module), func)(table)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from e


def load_settings(path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    source = "defaults"
    candidate = path or env.get("AGENTOBS_CONFIG")
    if candidate is None and Path("agentobs.toml").exists():
        candidate = "agentobs.toml"
    if candidate is not None:
        p = Path(candidate)
        if not p.exists():
            raise ConfigError(f"settings file {str(p)!r} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: invalid TOML: {e}") from e
        for key, value in data.items():
            if key in _BY_NAME:
                values[key] = _coerce(_BY_NAME[key], value, str(p))
            elif key in SECTIONS:
                _check_section(key, value, str(p))
                values[key] = value
            elif isinstance(value, dict):
                raise ConfigError(f"{p}: unknown table [{key}]{did_you_mean(key, SECTIONS, 'known tables:')}")
            else:
                raise ConfigError(f"{p}: unknown setting {key!r}{did_you_mean(key, _BY_NAME)}")
        source = str(p)
    for s in SETTINGS:
        ev = env.get(f"AGENTOBS_{s.name.upper()}")
        if ev is not None:
            values[s.name] = _coerce(s, ev, f"$AGENTOBS_{s.name.upper()}")
    return Settings(values=values, source=source)


def settings_markdown() -> str:
    """The settings table for docs/settings.md."""
    lines = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = ", ".join(s.default) if isinstance(s.default, list) else s.default
        lines.append(f"| `{s.name}` | {s.type.__name__} | `{default}` | {s.help} |")
    return "\n".join(lines)
