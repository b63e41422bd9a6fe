"""Load a simulator output directory into a store through the normal importers.

``manifest.json`` (written by the simulator, emit.py) names the OTLP files, and per instance its
Prometheus snapshot directory, SGLang /server_info and KV-event capture. Every file goes through
agentobs/collect/files.py exactly as a user's own files would; the ground truth stays in the bundle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..collect.files import ImportResult, import_kv_events, import_otlp, import_prom, import_server_info
from ..config import Settings
from ..errors import InputError
from ..store.writer import Writer

FORMAT = "agentobs-sim-bundle/1"


def read_manifest(root: str | os.PathLike) -> dict:
    p = Path(root) / "manifest.json"
    try:
        m = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError("no manifest.json: not a simulator bundle (run `agentobs simulate --out DIR`)", str(root)) from None
    except ValueError as e:
        raise InputError(f"manifest.json is not JSON: {e}", str(p)) from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise InputError(f"manifest format is {m.get('format') if isinstance(m, dict) else m!r}, expected {FORMAT!r}", str(p))
    for i, inst in enumerate(m.get("instances") or []):
        if not isinstance(inst, dict) or not inst.get("instance"):
            raise InputError(f"instances[{i}] has no 'instance'", str(p))
    return m


def import_bundle(root: str | os.PathLike, writer: Writer, settings: Settings, progress=None) -> dict[str, ImportResult]:
    root = Path(root)
    m = read_manifest(root)
    out: dict[str, ImportResult] = {}
    spans = ImportResult("otlp")
    for rel in m.get("otlp") or []:
        spans.merge(import_otlp([root / rel], writer, settings, progress=progress))
    out["spans"] = spans
    prom = ImportResult("prometheus")
    cfg = ImportResult("server-info")
    kv = ImportResult("kv-events")
    for inst in m.get("instances") or []:
        name = inst["instance"]
        if inst.get("prom_dir"):
            prom.merge(import_prom([root / inst["prom_dir"]], name, writer, progress=progress))
        if inst.get("server_info"):
            cfg.merge(import_server_info(root / inst["server_info"], name, writer, at=m.get("server_info_at")))
        if inst.get("kv_events"):
            kv.merge(import_kv_events([root / inst["kv_events"]], writer, name, progress=progress))
    out["samples"] = prom
    out["config keys"] = cfg
    out["kv events"] = kv
    return out
