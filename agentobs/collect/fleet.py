"""The fleet file (YAML) of ``agentobs collect``: scrape targets, KV-event publishers, receiver and
health listeners, the read snapshot. Unknown keys are errors naming the file and the path.

    receiver: {grpc: "127.0.0.1:4317", http: "127.0.0.1:4318"}
    health: "127.0.0.1:9464"
    snapshot: {path: fleet.read.duckdb, every_s: 60}
    scrape:
      interval_s: 15
      targets:
        - url: http://10.42.7.31:8000/metrics      # instance defaults to host:port of the URL
          engine: vllm                             # vllm | sglang | auto (from the metric names)
          labels: {pool: prod-a}
        - url: http://10.42.7.40:30000/metrics
          engine: sglang                           # also reads http://10.42.7.40:30000/server_info
    kv_events:
      - endpoint: tcp://10.42.7.31:5557
        instance: 10.42.7.31:8000
        topic: kv-events                           # the publisher's topic ("" = all); others: counted, warned
        replay_endpoint: tcp://10.42.7.31:5558     # optional: recover missed batches

Values not given fall back to the settings (``scrape_interval_s``, ``receiver_http``, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from ..config import Settings
from ..errors import ConfigError, did_you_mean

ENGINES = ("auto", "vllm", "sglang")


@dataclass
class Target:
    url: str
    instance: str
    engine: str = "auto"
    labels: dict[str, str] = field(default_factory=dict)
    interval_s: float = 15.0
    timeout_s: float = 5.0
    max_series: int = 50_000
    server_info_url: str | None = None  # None: derived when the engine is (or is detected as) sglang
    server_info: bool = True


@dataclass
class KVSource:
    endpoint: str
    instance: str
    topic: str = ""
    replay_endpoint: str | None = None


@dataclass
class Fleet:
    targets: list[Target] = field(default_factory=list)
    kv: list[KVSource] = field(default_factory=list)
    grpc: str = ""
    http: str = ""
    health: str = ""
    snapshot_path: str = ""
    snapshot_every_s: float = 60.0
    jitter: float = 0.1
    concurrency: int = 16
    server_info_every_s: float = 300.0


def instance_of(url: str) -> str:
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL")
    port = u.port or (443 if u.scheme == "https" else 80)
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{host}:{port}"


def split_hostport(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{what}: {value!r} must be host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


def _check(obj: Any, allowed: set[str], where: str) -> dict:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: must be a mapping, got {type(obj).__name__}")
    extra = set(obj) - allowed
    if extra:
        k = sorted(extra)[0]
        raise ConfigError(f"{where}: unknown key {k!r}{did_you_mean(k, sorted(allowed), 'known:')}")
    return obj


def _num(v: Any, where: str, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (positive and v <= 0):
        raise ConfigError(f"{where}: must be a {'positive ' if positive else ''}number, got {v!r}")
    return float(v)


def parse_fleet(doc: Any, settings: Settings, where: str = "fleet") -> Fleet:
    top = _check(doc, {"receiver", "health", "snapshot", "scrape", "kv_events"}, where)
    rec = _check(top.get("receiver"), {"grpc", "http"}, f"{where}: receiver")
    scr = _check(top.get("scrape"), {"interval_s", "timeout_s", "max_series", "jitter", "concurrency", "server_info_every_s",
                                     "targets"}, f"{where}: scrape")
    snap = _check(top.get("snapshot"), {"path", "every_s"}, f"{where}: snapshot")
    fleet = Fleet(
        grpc=str(rec.get("grpc", settings.receiver_grpc) or ""),
        http=str(rec.get("http", settings.receiver_http) or ""),
        health=str(top.get("health", settings.health_listen) or ""),
        snapshot_path=str(snap.get("path", settings.snapshot_path) or ""),
        snapshot_every_s=_num(snap.get("every_s", settings.snapshot_every_s), f"{where}: snapshot.every_s", False),
        jitter=_num(scr.get("jitter", settings.scrape_jitter), f"{where}: scrape.jitter", False),
        concurrency=int(_num(scr.get("concurrency", settings.scrape_concurrency), f"{where}: scrape.concurrency")),
        server_info_every_s=_num(scr.get("server_info_every_s", settings.server_info_every_s),
                                 f"{where}: scrape.server_info_every_s"),
    )
    for addr, what in ((fleet.grpc, "receiver.grpc"), (fleet.http, "receiver.http"), (fleet.health, "health")):
        if addr:
            split_hostport(addr, f"{where}: {what}")
    interval = _num(scr.get("interval_s", settings.scrape_interval_s), f"{where}: scrape.interval_s")
    timeout = _num(scr.get("timeout_s", settings.scrape_timeout_s), f"{where}: scrape.timeout_s")
    max_series = _num(scr.get("max_series", settings.scrape_max_series), f"{where}: scrape.max_series")
    targets = scr.get("targets") or []
    if not isinstance(targets, list):
        raise ConfigError(f"{where}: scrape.targets must be a list")
    seen: set[str] = set()
    for i, t in enumerate(targets):
        tw = f"{where}: scrape.targets[{i}]"
        if isinstance(t, str):
            t = {"url": t}
        t = _check(t, {"url", "instance", "engine", "labels", "interval_s", "timeout_s", "max_series", "server_info"},
                   tw)
        if "url" not in t:
            raise ConfigError(f"{tw}: 'url' is required")
        try:
            inst = str(t.get("instance") or instance_of(str(t["url"])))
        except ValueError as e:
            raise ConfigError(f"{tw}: {e}") from e
        if inst in seen:
            raise ConfigError(f"{tw}: instance {inst!r} is listed twice")
        seen.add(inst)
        engine = str(t.get("engine", "auto"))
        if engine not in ENGINES:
            raise ConfigError(f"{tw}: engine {engine!r} must be one of {', '.join(ENGINES)}")
        labels = t.get("labels") or {}
        if not isinstance(labels, dict):
            raise ConfigError(f"{tw}: labels must be a mapping")
        si = t.get("server_info", True)
        fleet.targets.append(Target(
            url=str(t["url"]), instance=inst, engine=engine, labels={str(k): str(v) for k, v in labels.items()},
            interval_s=_num(t.get("interval_s", interval), f"{tw}.interval_s"),
            timeout_s=_num(t.get("timeout_s", timeout), f"{tw}.timeout_s"),
            max_series=int(_num(t.get("max_series", max_series), f"{tw}.max_series")),
            server_info_url=si if isinstance(si, str) else None, server_info=bool(si),
        ))
    kv = top.get("kv_events") or []
    if not isinstance(kv, list):
        raise ConfigError(f"{where}: kv_events must be a list")
    for i, k in enumerate(kv):
        kw = f"{where}: kv_events[{i}]"
        k = _check(k, {"endpoint", "instance", "topic", "replay_endpoint"}, kw)
        for req in ("endpoint", "instance"):
            if not k.get(req):
                raise ConfigError(f"{kw}: {req!r} is required")
        if "*" in str(k["endpoint"]):
            raise ConfigError(f"{kw}: endpoint {k['endpoint']!r} has a wildcard; use the engine host's address")
        fleet.kv.append(KVSource(endpoint=str(k["endpoint"]), instance=str(k["instance"]),
                                 topic=str(k.get("topic", "")), replay_endpoint=k.get("replay_endpoint")))
    return fleet


def load_fleet(path: str | os.PathLike, settings: Settings) -> Fleet:
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read fleet file {str(p)!r}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML: {e}") from e
    return parse_fleet(doc, settings, str(p))
